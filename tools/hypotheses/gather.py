"""Candidates -> ranked, evidenced hypotheses -> counterfactual verification.

Evidence, strongest first:
  * verified: reverting the function's last change (or swapping its kernel to the native twin)
    removes the divergence;
  * the function was changed by the culprit commit that bisection found;
  * it implements the kernel whose native twin removes the divergence;
  * it ran only in the failing run, not in a nearby passing one (spectrum evidence);
  * its name or file belongs to the component of the first divergent tap, or to the
    feature the trigger switched on (prefix caching, chunked prefill, penalties, …);
  * it changed recently (a non-root commit touched it), when no culprit is known;
  * it breaks its own contract (tools.hypotheses.contracts) on the inputs it was given in the
    failing run, recorded in the target by function taps. Without a culprit every function is judged;
    a function that keeps its contract is pushed down a little, and one that breaks it only because
    a callee does is not the candidate. With a culprit only the functions it changed are, and only
    when one of them plays a role that has a contract: a commit can leave a function wrong whose
    divergence shows only where others read what it produced (a cache writer and its readers).
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
from tools.hypotheses.contracts import contract_for
from tools.hypotheses.coverage import RAN, UNRECORDED, Coverage
from tools.hypotheses.coverage import ran as ran_status
from tools.hypotheses.evidence import Culprit, DrillDown, Hypothesis, Reproduction
from tools.hypotheses.moved import class_statements, function_node
from tools.hypotheses.rank import WEIGHTS, Candidate, to_hypothesis
from tools.probe.prober import Prober
from tools.source.index import Symbol, commit_changes, diff_paths, open_index

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


def coverage_sets(
    repro: Reproduction, prober: Prober, repo: Path, checks: dict | None = None
) -> tuple[Coverage | None, set[str]]:
    """Functions ('file:qualname') run by the failing scenario, and by a passing one if known; None
    when unknown (the engine failed, or the tree is native code the recorder cannot see). On a mixed
    tree the record covers its Python only: the rest is unknown function by function. With `checks`,
    the failing run also judges the functions' contracts (function_verdicts' run, saved: the coverage
    recorder and the function taps see the same calls, neither runs the tree's code) and
    checks["verdicts"] holds them once the run answered."""
    try:
        meta = prober.run_target(repro.scenario, repo, taps=[], coverage=True, function_checks=checks is not None).meta
        if checks is not None:
            checks["verdicts"] = meta.get("function_checks", [])
        failing = Coverage.from_meta(meta)
        if failing is None:
            return None, set()
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
    checks: dict = {}  # without a culprit, the contracts are judged on the coverage run (one run, not two)
    failing, passing = (
        coverage_sets(repro, prober, repo, checks if culprit is None else None) if prober else (None, set())
    )
    touched = culprit_functions(repo, index, culprit)
    for sym, commit, modified in touched:
        _get(cands, sym).add("culprit", f"changed by culprit commit {commit[:10]}", None)
        if modified:
            _get(cands, sym).add("modified", "existed before the culprit commit and was edited by it")
        _get(cands, sym).commit = commit
    _add_code_evidence(cands, index, drill, repro, failing, passing, culprit)
    if culprit is None:
        if prober is not None:
            _add_contract_evidence(cands, index, repro, drill, prober, repo, failing, verdicts=checks.get("verdicts"))
        _add_recent_changes(cands, repo, index, failing)
    elif prober is not None:
        changed = {(sym.file, sym.qualname) for sym, _, _ in touched}
        if any(has_contract_role(repo, sym) for sym, _, _ in touched):
            _add_contract_evidence(cands, index, repro, drill, prober, repo, failing, among=changed)
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
            old = open_index(repo, commit=f"{sha}^", include_tests=False, paths=diff_paths(diff))
        except GitError:
            old = None
        for change in commit_changes(repo, sha, diff, index):
            sym = change.symbol
            if sym is None or not _is_source(change.file) or (sym.kind == "class" and not _own_change(old, index, sym)):
                continue
            existed = old is not None and any(s.file == sym.file for s in old.find(sym.qualname))
            out.append((sym, sha, existed))
    return out


def _own_change(old, index, cls: Symbol) -> bool:
    """The commit changed the class's own statements (a field default, a class attribute), not only
    its methods: the class is then a candidate, restorable apart from them."""
    before = next((s for s in old.find(cls.qualname) if s.file == cls.file), None) if old is not None else None
    if before is None:
        return False
    return class_statements(index.read(cls)) != class_statements(old.read(before))


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
        ran = ran_status(failing, sym.file, sym.qualname) is True
        if drill.op is not None:
            _add_op_evidence(cands, sym, drill.op)
        elif drill.kernel and words_match(sym, [drill.kernel]) and sym.file.count("ops"):
            _get(cands, sym).add("kernel", f"implements kernel {drill.kernel}, whose native twin fixes it")
            if "native" in sym.qualname.lower():
                _get(cands, sym).add("native_twin", "", None)
        if passing and ran and key not in passing:
            _get(cands, sym).add("spectrum", "runs only in the failing variant, not in the passing one")
        if (sym.file, sym.qualname) in cands or (
            ran and (words_match(sym, comp_words) or words_match(sym, trig_words))
        ):
            _score_relevance(_get(cands, sym), sym, comp_words, trig_words, drill, failing)


def _add_op_evidence(cands, sym: Symbol, op: dict) -> None:
    """The function the adapter named for the first op that computes wrong from its own inputs."""
    what = f"op {op['op']} (node {op.get('name') or '?'}), the first op whose output is wrong on its own inputs"
    if (sym.file, sym.qualname) == (op.get("file"), op.get("function")):
        _get(cands, sym).add("kernel", f"computes {what}: {op['ratio']:.3g}x the noise floor of its fp64 recompute")
    elif sym.file == op.get("file") and sym.qualname in op.get("helpers", []):
        _get(cands, sym).add("kernel_helper", f"called by {op['function']}, which computes {what}")


def _score_relevance(c: Candidate, sym: Symbol, comp_words, trig_words, drill, failing: Coverage | None) -> None:
    if words_match(sym, comp_words):
        c.add("component", f"belongs to the divergent component ({drill.component} at {drill.tap})")
    if trig_words and words_match(sym, trig_words):
        c.add("trigger", "belongs to the feature that triggers the divergence")
    _add_run_evidence(c, failing)


def _add_run_evidence(c: Candidate, failing: Coverage | None) -> None:
    """Ran: a little for it; not run: it cannot have caused it; unknown (C/C++ next to recorded
    Python): said, and nothing either way. Without any record, nothing is said."""
    if failing is None:
        return
    ran = ran_status(failing, c.symbol.file, c.symbol.qualname)
    if ran is None:
        c.add("coverage_unknown", UNRECORDED)
    else:
        c.add("ran" if ran else "not_run", RAN if ran else "")


def index_functions(index) -> list[Symbol]:
    return [s for s in getattr(index, "symbols", []) if s.kind in ("function", "method") and _is_source(s.file)]


def _add_recent_changes(cands, repo: Path, index, failing, depth: int = 12) -> None:
    """Without a culprit: functions changed by recent non-root commits, if they ran, are suspects."""
    for sha in recent_commits(repo, depth):
        for change in commit_changes(repo, sha, _diff(repo, sha), index):
            sym = change.symbol
            if sym is None or sym.kind == "class" or not _is_source(change.file):
                continue
            key = (change.file, sym.qualname)
            ran = ran_status(failing, change.file, sym.qualname)
            if key in cands or ran is not False:
                c = _get(cands, sym)
                c.add("recent", f"changed recently by {sha[:10]}")
                _add_run_evidence(c, failing)
                c.commit = c.commit or sha


def recent_commits(repo: Path, depth: int) -> list[str]:
    """Newest first, without merges and without the root (an import of the whole tree says nothing)."""
    try:
        commits = open_repo(repo).iter_commits("HEAD", max_count=depth, no_merges=True)
        return [c.hexsha for c in commits if c.parents]
    except (GitError, ValueError):
        return []


def function_verdicts(repro: Reproduction, prober: Prober, repo: Path) -> list[dict]:
    """Contract verdicts of the tree's functions that ran in the failing scenario (one target run)."""
    try:
        return prober.run_target(repro.scenario, repo, taps=[], function_checks=True).meta.get("function_checks", [])
    except EngineRunError:
        return []


def has_contract_role(repo: Path, sym: Symbol) -> bool:
    """A Python function whose name and parameters match a contract (read from its source), so the
    function taps would judge it."""
    if sym.language != "python":
        return False
    try:
        lines = (repo / sym.file).read_text().splitlines()[sym.start_line - 1 : sym.end_line]
    except (OSError, UnicodeDecodeError):
        return False
    fn = function_node("\n".join(lines))
    if fn is None:
        return False
    args = fn.args
    params = tuple(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls"))
    return contract_for(fn.name, params) is not None


def _add_contract_evidence(
    cands,
    index,
    repro: Reproduction,
    drill: DrillDown,
    prober: Prober,
    repo: Path,
    failing: Coverage | None = None,
    among: set[tuple[str, str]] | None = None,
    verdicts: list[dict] | None = None,
) -> None:
    """The function that computes the wrong thing from its own inputs is the candidate; the earliest
    such one in the divergent component first, its callers behind it. With `among` (the functions a
    culprit changed) only those are judged, and one that keeps its contract is left as it is: a
    contract sees one role, and a commit may break a function in ways no contract covers."""
    if verdicts is None:  # not judged on the coverage run already
        verdicts = function_verdicts(repro, prober, repo)
    if among is not None:
        verdicts = [v for v in verdicts if tuple(v["function"].split(":", 1)) in among]
    else:
        _add_setting_evidence(cands, index, verdicts, drill, failing)
    broken = [v for v in verdicts if v["violations"]]
    broken_names = {v["function"] for v in broken}
    rank = 0
    for v in sorted(broken, key=lambda v: (v["component"] != drill.component, v["first_violation"])):
        sym = _symbol(index, v["function"])
        if sym is None:
            continue
        line = contract_line(v)
        callees = sorted(set(v["callees"]) & broken_names - {v["function"]})
        if callees:
            _get(cands, sym).add("contract_caller", f"{line}, but its callee {callees[0].split(':')[-1]} does too")
            continue
        _get(cands, sym).add("contract", line, WEIGHTS["contract"] - 2.0 * min(rank, 2))
        rank += 1
    _add_feeder_evidence(cands, index, verdicts, failing, among)
    for v in verdicts if among is None else []:
        sym = _symbol(index, v["function"])
        if not v["violations"] and sym is not None and (sym.file, sym.qualname) in cands:
            cands[(sym.file, sym.qualname)].add(
                "contract_ok", f"keeps its contract ({v['rule']}) on {v['calls']} calls"
            )


# Largest |softmax(logits) - probs| a correct caller leaves between the two it hands a function (fp32 softmax).
INCONSISTENT_PROBS = 1e-3


def _add_feeder_evidence(cands, index, verdicts: list[dict], failing, among) -> None:
    """A function handed probabilities that are not the softmax of the logits it is handed computes
    its role from a wrong input: the caller that computed and handed them over is the candidate
    (one that ran and, with a culprit, that the culprit changed)."""
    for v in verdicts:
        if v.get("inconsistent_inputs", 0.0) <= INCONSISTENT_PROBS:
            continue
        file, _, qualname = v["function"].partition(":")
        short = qualname.rsplit(".", 1)[-1]
        for sym in index.callers(short):
            changed = among is None or (sym.file, sym.qualname) in among
            if sym.file != file or not changed or ran_status(failing, sym.file, sym.qualname) is False:
                continue
            _get(cands, sym).add(
                "feeds",
                f"hands {short} probabilities that are not the softmax of the logits it hands it "
                f"(|difference| up to {v['inconsistent_inputs']:.3g}), and {short} computes its role from them",
            )


def _add_setting_evidence(cands, index, verdicts: list[dict], drill: DrillDown, failing: Coverage | None) -> None:
    """The component diverges, yet every function of it that was judged computes its role right on
    the inputs it was given: then what it was given is wrong. A function named after one of its
    settings (a per-layer window, a scale, a cap) is where such a value comes from."""
    here = [v for v in verdicts if v["component"] == drill.component]
    if not here or any(v["violations"] for v in here):
        return
    given = {s: v for v in here for s in v.get("settings", [])}
    judged = {v["function"] for v in verdicts}
    for sym in index_functions(index):
        key = f"{sym.file}:{sym.qualname}"
        if key in judged or ran_status(failing, sym.file, sym.qualname) is False:
            continue
        name = sym.qualname.rsplit(".", 1)[-1].lower()
        setting = next((s for s in sorted(given) if s.lower() in name), None)
        if setting is not None:
            v = given[setting]
            _get(cands, sym).add(
                "setting",
                f"named after `{setting}`, given to {v['function'].split(':')[-1]}, which keeps its contract "
                f"({v['contract']}) while {drill.component} diverges: the value it is given may be wrong",
            )


def contract_line(v: dict) -> str:
    return (
        f"contract: {v['function'].split(':')[-1]} violates {v['contract']} ({v['rule']}) on its own inputs: "
        f"{v['max_violation']:.3g} against a tolerance of {v['tolerance']:.3g}, in {v['violations']}/{v['calls']} calls"
    )


def _symbol(index, function: str) -> Symbol | None:
    file, _, qualname = function.partition(":")
    return next((s for s in index.find(qualname) if s.file == file and s.kind != "class"), None)
