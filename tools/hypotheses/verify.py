"""Counterfactual verification in a temporary worktree (the user's checkout is never touched):
restore a suspected function's previous version, or, where it has none (a bug at base, a function
that did not change), apply one candidate fix (a template of tools/hypotheses/fixes.py, or a patch
an LLM proposes) and re-probe. The divergence vanishing, with no new one, verifies the function.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from tools.engines.runner import EngineRunError
from tools.history.gitrepo import (
    GitError,
    PatchConflict,
    apply_patch,
    temporary_worktree,
)
from tools.hypotheses.evidence import Culprit, Hypothesis, Reproduction
from tools.hypotheses.fixes import fixes
from tools.hypotheses.rank import WEIGHTS, rank
from tools.probe import taps as tapnames
from tools.probe.prober import Prober
from tools.source.index import open_index, parse_file

FIX_PROBES_PER_FUNCTION = 12  # template edits tried on one function
FIX_PROBES_PER_CASE = 24  # template edits tried in one diagnosis


def verify(
    repo: Path, cands: list[Hypothesis], repro: Reproduction, prober: Prober, culprit: Culprit | None, top: int = 6
) -> list[Hypothesis]:
    """Counterfactual: revert the suspected change of the leading testable candidates; does the
    divergence vanish? Stops at the first verified one (later ones cannot outrank it)."""
    ordered = rank(cands, top=len(cands))
    untestable = []
    for h in [h for h in ordered if h.commit][:top]:
        outcome = revert_and_probe(repo, h, repro, prober)
        if outcome is True:
            mark_verified(h, "restore", f"reverting {h.function}'s change in {h.commit[:10]} removes the divergence")
            return rank(ordered)
        if outcome is False:
            h.score += WEIGHTS["refuted"]
            h.evidence.append(f"reverting {h.function}'s change in {h.commit[:10]} leaves the divergence")
        else:
            untestable.append(h)
    # a function pushed below zero (it never ran in the failing scenario) cannot be fixed by an edit
    no_history = [h for h in ordered if (not h.commit or h in untestable) and h.score >= 0][:top]
    verify_by_fixes(repo, no_history, repro, prober)
    return rank(ordered)


def mark_verified(h: Hypothesis, by: str, how: str, diff: str = "") -> None:
    h.verified, h.verified_by, h.score = True, by, h.score + WEIGHTS["verified"]
    h.verifying_diff = diff
    h.evidence.insert(0, f"verified: {how}")


def revert_and_probe(repo: Path, h: Hypothesis, repro: Reproduction, prober: Prober) -> bool | None:
    """True: divergence gone once the function is restored to its version before h.commit;
    False: still there; None: could not test (new function, no parent, engine crash)."""
    try:
        old = open_index(repo, commit=f"{h.commit}^", include_tests=False)
        before = next((s for s in old.find(h.function) if s.file == h.file and s.qualname == h.function), None)
        if before is None:
            return None
        with temporary_worktree(repo, "HEAD") as tree:
            if not restore_function(tree, h.file, h.function, old.read(before)):
                return None
            return not prober.probe(repro.scenario, tree).diverged
    except (GitError, PatchConflict, EngineRunError):
        return None


def restore_function(tree: Path, file: str, qualname: str, old_text: str) -> bool:
    """Splice `old_text` over the current definition of `qualname` in tree/file. Only that function
    changes, unlike a hunk revert, which also undoes neighbours that share the hunk."""
    from tools.source.index import parse_file

    path = tree / file
    if not path.exists() or not file.endswith(".py"):
        return False
    data = path.read_bytes()
    current = next((s for s in parse_file(file, data, "python")[0] if s.qualname == qualname), None)
    if current is None:
        return False
    lines = data.decode("utf-8").splitlines(keepends=True)
    lines[current.start_line - 1 : current.end_line] = [old_text if old_text.endswith("\n") else old_text + "\n"]
    path.write_text("".join(lines))
    return True


# ---- verification by a candidate fix -----------------------------------------------------------


@dataclass
class FixOutcome:
    verified: bool
    probes: int  # engine probes run (each is one target run, plus a reference run if tokens moved)
    description: str = ""  # the edit that removed the divergence
    diff: str = ""
    failed: str = ""  # why the patch could not be tried at all


def verify_by_fixes(
    repo: Path,
    cands: list[Hypothesis],
    repro: Reproduction,
    prober: Prober,
    budget: int = FIX_PROBES_PER_CASE,
    per_function: int = FIX_PROBES_PER_FUNCTION,
) -> int:
    """Template fixes for candidates with no previous version, best first, until one verifies or
    `budget` probes are spent. Returns the probes run. Nothing runs unless the failing scenario
    diverges: on a tree that already agrees there is nothing a fix could remove."""
    if not diverges(repro):
        return 0
    component = tapnames.component(repro.probe.first.tap) if repro.probe.first else None
    spent = 0
    for h in cands:
        if spent >= budget:
            break
        outcome = try_edits(
            repo, h, repro, prober, lambda text: fixes(text, component), min(per_function, budget - spent)
        )
        spent += outcome.probes
        if outcome.verified:
            how = f"the fix `{outcome.description}` removes the divergence (edit {outcome.probes} tried on it)"
            mark_verified(h, "fix-template", how, outcome.diff)
            break
        if outcome.probes:
            h.evidence.append(
                f"{outcome.probes} fix template edit(s) of {h.function} tried; none removes the divergence"
            )
    return spent


def diverges(repro: Reproduction) -> bool:
    return bool(repro.reproduced and repro.probe is not None and repro.probe.diverged)


def try_edits(repo: Path, h: Hypothesis, repro: Reproduction, prober: Prober, propose, limit: int) -> FixOutcome:
    """Apply each proposed version of h's function (one at a time) in a worktree of HEAD and re-probe."""
    if not h.file.endswith(".py") or limit <= 0 or not diverges(repro):
        return FixOutcome(False, 0)
    try:
        with temporary_worktree(repo, "HEAD") as tree:
            current = function_text(tree, h.file, h.function)
            if current is None:
                return FixOutcome(False, 0, failed=f"{h.function} not found in {h.file}")
            probes = 0
            for description, new in propose(current)[:limit]:
                probes += 1
                if fixed_by(tree, h, new, repro, prober):
                    return FixOutcome(True, probes, description, function_diff(h.file, current, new))
            return FixOutcome(False, probes)
    except GitError as e:
        return FixOutcome(False, 0, failed=str(e))


def fixed_by(tree: Path, h: Hypothesis, new_text: str, repro: Reproduction, prober: Prober) -> bool:
    """Does h's function replaced by `new_text` make the failing scenario agree, and a nearby
    agreeing one (if known) still agree? The file is put back afterwards, whatever happens."""
    path = tree / h.file
    original = path.read_bytes()
    try:
        if not restore_function(tree, h.file, h.function, new_text):
            return False
        forget_bytecode(path)
        return agrees(tree, repro, prober)
    finally:
        path.write_bytes(original)
        forget_bytecode(path)


def forget_bytecode(path: Path) -> None:
    """Drop the file's cached bytecode: an edit of the same size within the same second would
    otherwise be shadowed by the previous edit's .pyc."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def function_text(tree: Path, file: str, qualname: str) -> str | None:
    path = tree / file
    if not path.exists():
        return None
    data = path.read_bytes()
    symbol = next((s for s in parse_file(file, data, "python")[0] if s.qualname == qualname), None)
    if symbol is None:
        return None
    lines = data.decode("utf-8").splitlines(keepends=True)
    return "".join(lines[symbol.start_line - 1 : symbol.end_line])


def function_diff(file: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{file}", f"b/{file}"))


def verify_patch(repo: Path, h: Hypothesis, repro: Reproduction, prober: Prober, patch: str) -> FixOutcome:
    """An LLM's patch for h, tried like a template edit; the verdict goes into h's evidence."""
    outcome = try_patch(repo, h, repro, prober, patch)
    if outcome.verified:
        mark_verified(h, "llm-patch", "the LLM's patch removes the divergence (confirmed by the probe)", outcome.diff)
    elif outcome.failed:
        h.evidence.append(f"the LLM's patch for {h.function} was not tried: {outcome.failed}")
    else:  # the patch is refuted, not the function: a wrong fix says little about where the bug is
        h.evidence.append(f"the LLM's patch for {h.function} applies but leaves the divergence")
    return outcome


def try_patch(repo: Path, h: Hypothesis, repro: Reproduction, prober: Prober, patch: str) -> FixOutcome:
    """A proposed patch (unified diff, e.g. an LLM's) applied in a worktree of HEAD and re-probed.
    It verifies only if the failing scenario then agrees (and a known agreeing one still does)."""
    if not diverges(repro):
        return FixOutcome(False, 0, failed="the failing scenario does not diverge: nothing to fix")
    try:
        with temporary_worktree(repo, "HEAD") as tree:
            try:
                changed = apply_patch(tree, patch)
            except GitError as e:
                return FixOutcome(False, 0, failed=f"does not apply: {first_line(str(e))}")
            if not changed:
                return FixOutcome(False, 0, failed="applies but changes nothing")
            for name in changed:
                forget_bytecode(tree / name)
            return FixOutcome(agrees(tree, repro, prober), 1, "the proposed patch", patch)
    except GitError as e:
        return FixOutcome(False, 0, failed=first_line(str(e)))


def agrees(tree: Path, repro: Reproduction, prober: Prober) -> bool:
    """The failing scenario, and a nearby agreeing one if known, agree on `tree`."""
    try:
        if prober.probe(repro.scenario, tree).diverged:
            return False
        return repro.baseline is None or not prober.probe(repro.baseline, tree).diverged
    except EngineRunError:
        return False  # the edit broke the engine: not a fix


def first_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "")[:200]
