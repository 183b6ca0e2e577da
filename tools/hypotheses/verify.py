"""Counterfactual verification: restore a suspected function's previous version in a temporary
worktree and re-probe; the divergence vanishing verifies it."""

from __future__ import annotations

from pathlib import Path

from tools.engines.runner import EngineRunError
from tools.history.gitrepo import (
    GitError,
    PatchConflict,
    temporary_worktree,
)
from tools.hypotheses.evidence import Culprit, Hypothesis, Reproduction
from tools.hypotheses.rank import WEIGHTS, rank
from tools.probe.prober import Prober
from tools.source.index import open_index


def verify(
    repo: Path, cands: list[Hypothesis], repro: Reproduction, prober: Prober, culprit: Culprit | None, top: int = 6
) -> list[Hypothesis]:
    """Counterfactual: revert the suspected change of the leading testable candidates; does the
    divergence vanish? Stops at the first verified one (later ones cannot outrank it)."""
    ordered = rank(cands, top=len(cands))
    for h in [h for h in ordered if h.commit][:top]:
        outcome = revert_and_probe(repo, h, repro, prober)
        if outcome is True:
            h.verified, h.score = True, h.score + WEIGHTS["verified"]
            h.evidence.insert(0, f"verified: reverting {h.function}'s change in {h.commit[:10]} removes the divergence")
            break
        if outcome is False:
            h.score += WEIGHTS["refuted"]
            h.evidence.append(f"reverting {h.function}'s change in {h.commit[:10]} leaves the divergence")
    return rank(ordered)


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
