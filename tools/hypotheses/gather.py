"""Candidates -> ranked, evidenced hypotheses -> counterfactual verification.

Evidence, strongest first:
  * verified: reverting the function's last change (or swapping its kernel to the native twin)
    removes the divergence;
  * the function was changed by the culprit commit that bisection found;
  * it implements the kernel whose native twin removes the divergence;
  * it ran only in the failing run, not in a nearby passing one (spectrum evidence);
  * its name or file belongs to the component of the first divergent tap, or to the
    feature the trigger switched on (prefix caching, chunked prefill, penalties, …);
  * it changed recently (a non-root commit touched it), when no culprit is known.
A function that never ran in the failing run is pushed down: it cannot have caused it.
"""

from __future__ import annotations

import re
from pathlib import Path

from tools.engines.runner import EngineRunError
from tools.history.gitrepo import (
    GitError,
    commit_diff,
    open_repo,
)
from tools.hypotheses.evidence import Culprit, DrillDown, Hypothesis, Reproduction
from tools.hypotheses.rank import Candidate, to_hypothesis
from tools.probe.prober import Prober
from tools.source.index import Symbol, open_index

# Divergent component -> words that name its code.
COMPONENT_WORDS = {
    "embedding": ["embed", "vocab"],
    "norm": ["norm", "rms"],
    "linear": ["linear", "proj", "qkv", "gate_up", "weight", "load", "shard", "pack"],
    "rotary": ["rotary", "rope", "cos_sin", "inv_freq", "scaling", "yarn", "llama3", "ntk", "position"],
    "attention": ["attention", "attn", "softmax", "mask", "window", "paged", "kv", "slot", "causal"],
    "residual": ["residual", "add", "norm", "layer", "decoder"],
    "activation": ["act", "silu", "gelu", "mlp"],
    "lm_head": ["logits", "lm_head", "softcap", "head", "tie", "final"],
    "sampler": ["sampl", "penalt", "top_k", "top_p", "min_p", "temperature", "logprob", "logits_process"],
}
# Trigger words (from the variant that reproduced) -> code words.
TRIGGER_WORDS = {
    "prefix": ["prefix", "hash", "cache", "block", "evict", "ref"],
    "chunk": ["chunk", "prefill", "schedul"],
    "block": ["block", "slot", "table"],
    "batch": ["batch", "schedul", "pad", "seq", "pack"],
    "staggered": ["schedul", "step", "batch", "seq"],
    "penalt": ["penalt", "repetition", "presence", "frequency"],
    "temperature": ["sampl", "temperature", "top", "min_p", "seed", "generator"],
    "long": ["window", "position", "rope", "scaling", "partition", "split", "tile"],
    "float32": [],
    "decode": ["decode", "split", "partition", "merge"],
}


def words_match(symbol: Symbol, words: list[str]) -> bool:
    text = f"{symbol.file} {symbol.qualname}".lower()
    return any(w in text for w in words)


def trigger_words(trigger: str | None, drill: DrillDown, options: dict | None = None) -> list[str]:
    """Code words for the feature that triggers it: the variant that reproduced, the engine options
    the scenario switches on, and a decode-only pattern."""
    switched_on = " ".join(k for k, v in (options or {}).items() if v)
    text = f"{trigger or ''} {switched_on}".lower() + (" decode" if drill.pattern.get("decode_only") else "")
    return sorted({w for key, ws in TRIGGER_WORDS.items() if key in text for w in ws})


def coverage_sets(repro: Reproduction, prober: Prober, repo: Path) -> tuple[set[str] | None, set[str]]:
    """Functions ('file:qualname') run by the failing scenario, and by a passing one if known."""
    try:
        failing = set(prober.run_target(repro.scenario, repo, taps=[], coverage=True).meta.get("coverage", []))
        passing = set()
        if repro.baseline is not None:
            passing = set(prober.run_target(repro.baseline, repo, taps=[], coverage=True).meta.get("coverage", []))
    except EngineRunError:
        return None, set()
    return failing, passing


def gather(
    repo: Path, index, repro: Reproduction, drill: DrillDown, culprit: Culprit | None, prober: Prober | None = None
) -> list[Hypothesis]:
    """All candidates with their evidence and a deterministic score (unranked)."""
    cands: dict[tuple[str, str], Candidate] = {}
    index = index or open_index(repo, include_tests=False)
    failing, passing = coverage_sets(repro, prober, repo) if prober else (None, set())
    for sym, commit, modified in culprit_functions(repo, index, culprit):
        _get(cands, sym).add("culprit", f"changed by culprit commit {commit[:10]}", None)
        if modified:
            _get(cands, sym).add("modified", "existed before the culprit commit and was edited by it")
        _get(cands, sym).commit = commit
    _add_code_evidence(cands, index, drill, repro, failing, passing, culprit)
    if culprit is None:
        _add_recent_changes(cands, repo, index, failing)
    return [to_hypothesis(c, drill, repro) for c in cands.values() if c.score > 0]


def _get(cands: dict, sym: Symbol) -> Candidate:
    return cands.setdefault((sym.file, sym.qualname), Candidate(sym))


def culprit_functions(repo: Path, index, culprit: Culprit | None) -> list[tuple[Symbol, str, bool]]:
    """(function, commit, existed before) for every function the culprit commit(s) changed."""
    if culprit is None:
        return []
    out = []
    for sha in culprit.ambiguous or [culprit.sha]:
        diff = culprit.diff if sha == culprit.sha and culprit.diff else _diff(repo, sha)
        try:
            old = open_index(repo, commit=f"{sha}^", include_tests=False)
        except GitError:
            old = None
        for change in index.symbols_for_hunks(diff):
            sym = change.symbol
            if sym is not None and sym.kind != "class" and _is_source(change.file):
                existed = old is not None and any(s.file == sym.file for s in old.find(sym.qualname))
                out.append((sym, sha, existed))
    return out


def _diff(repo: Path, sha: str) -> str:
    try:
        return commit_diff(repo, sha)
    except GitError:
        return ""


def _is_source(file: str) -> bool:
    return not re.search(r"(^|/)(tests?|docs?)/|(^|/)test_[^/]*$|\.md$", file)


def _add_code_evidence(cands, index, drill: DrillDown, repro: Reproduction, failing, passing, culprit):
    comp_words = COMPONENT_WORDS.get(drill.component, [])
    trig_words = trigger_words(repro.trigger, drill, repro.scenario.target.options)
    for sym in index_functions(index):
        key = f"{sym.file}:{sym.qualname}"
        ran = failing is not None and key in failing
        if drill.kernel and words_match(sym, [drill.kernel]) and sym.file.count("ops"):
            _get(cands, sym).add("kernel", f"implements kernel {drill.kernel}, whose native twin fixes it")
            if "native" in sym.qualname.lower():
                _get(cands, sym).add("native_twin", "", None)
        if failing is not None and passing and ran and key not in passing:
            _get(cands, sym).add("spectrum", "runs only in the failing variant, not in the passing one")
        if (sym.file, sym.qualname) in cands or (
            ran and (words_match(sym, comp_words) or words_match(sym, trig_words))
        ):
            _score_relevance(_get(cands, sym), sym, comp_words, trig_words, drill, failing, ran)


def _score_relevance(c: Candidate, sym: Symbol, comp_words, trig_words, drill, failing, ran) -> None:
    if words_match(sym, comp_words):
        c.add("component", f"belongs to the divergent component ({drill.component} at {drill.tap})")
    if trig_words and words_match(sym, trig_words):
        c.add("trigger", "belongs to the feature that triggers the divergence")
    if failing is not None:
        c.add("ran" if ran else "not_run", "runs in the failing scenario" if ran else "")


def index_functions(index) -> list[Symbol]:
    return [s for s in getattr(index, "symbols", []) if s.kind in ("function", "method") and _is_source(s.file)]


def _add_recent_changes(cands, repo: Path, index, failing, depth: int = 12) -> None:
    """Without a culprit: functions changed by recent non-root commits, if they ran, are suspects."""
    for sha in recent_commits(repo, depth):
        for change in index.symbols_for_hunks(_diff(repo, sha)):
            sym = change.symbol
            if sym is None or sym.kind == "class" or not _is_source(change.file):
                continue
            key = (change.file, sym.qualname)
            ran = failing is not None and f"{change.file}:{sym.qualname}" in failing
            if key in cands or ran or failing is None:
                c = _get(cands, sym)
                c.add("recent", f"changed recently by {sha[:10]}")
                if failing is not None:
                    c.add("ran", "runs in the failing scenario")
                c.commit = c.commit or sha


def recent_commits(repo: Path, depth: int) -> list[str]:
    """Newest first, without merges and without the root (an import of the whole tree says nothing)."""
    try:
        commits = open_repo(repo).iter_commits("HEAD", max_count=depth, no_merges=True)
        return [c.hexsha for c in commits if c.parents]
    except (GitError, ValueError):
        return []
