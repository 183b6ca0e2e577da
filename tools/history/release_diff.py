"""Localizing inside a release diff (docs/design.md §6b): the culprit is a whole release.

Bisection over a release history names the first bad release, whose diff changes hundreds of
functions across dozens of files. Reverting them one by one is not a plan; narrowing is:

  1. suspects = functions the release changed AND the failing scenario ran (function coverage
     of the bad release, measured by the gather stage), ordered by the gather score (component
     of the first divergent tap, trigger) plus the scenario's architecture named in the path;
  2. counterfactual restores, at most MAX_RESTORES: the previous release's version of one
     suspect put into the bad tree and re-probed, best suspect first; a restore that cannot run
     (the function calls helpers that moved or were renamed in the same release) is retried as a
     restore of the file's section: every changed suspect of that file together (or the whole
     file, when even those need helpers that moved). A file whose section removes the divergence is
     split in halves until one function is left; one that only the whole file fixes is searched by
     neighbourhoods: each suspect with the changed suspects it calls or that call it.

The divergence vanishing verifies a function. How many restores ran is written into the
evidence of the top hypothesis (`release diff: …`).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tools.engines.runner import EngineRunError
from tools.history.bindings import insert_bindings, missing_bindings
from tools.history.gitrepo import GitError, PatchConflict, temporary_worktree
from tools.hypotheses.coverage import RAN, UNRECORDED  # the gather stage's coverage evidence lines
from tools.hypotheses.evidence import Culprit, Hypothesis, Reproduction
from tools.hypotheses.rank import WEIGHTS, rank
from tools.hypotheses.verify import restore_function
from tools.source.index import open_index, same_code

RELEASE_SIZED = 40  # a culprit commit that changes more functions than this is a release
MAX_RESTORES = 12
SINGLE_FIRST = 4  # single-function restores tried before restoring whole file sections
ARCH_WEIGHT = 1.5  # the suspect's path names the scenario's architecture
SECTION_WEIGHT = 4.0  # restoring its file's section removed the divergence


@dataclass
class Narrowing:
    """What the release-diff localization looked at and spent."""

    changed: int  # functions the release changed
    ran: int  # of them, run by the failing scenario
    code_changed: int = 0  # of those, with their code changed (not only moved or re-documented)
    restores: int = 0  # counterfactual restores probed
    log: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"release diff: {self.changed} functions changed, {self.ran} ran in the failing scenario, "
            f"{self.code_changed} of them with changed code, {self.restores} of at most {MAX_RESTORES} counterfactual restores run"
        )


def is_release(cands: list[Hypothesis], culprit: Culprit | None) -> bool:
    """The culprit commit changed more functions than a single change does: a release."""
    return culprit is not None and len(changed_by(cands, culprit)) > RELEASE_SIZED


def changed_by(cands: list[Hypothesis], culprit: Culprit) -> list[Hypothesis]:
    shas = set(culprit.ambiguous or [culprit.sha])
    return [h for h in cands if h.commit in shas]


def suspects(cands: list[Hypothesis], culprit: Culprit, arch: str | None, repo: Path | None = None) -> list[Hypothesis]:
    """Changed functions that ran in the failing scenario, best first (all changed ones if coverage
    is unknown, and those in a language it does not record, C/C++ next to Python); functions the release only moved or re-documented (same code) are left out."""
    changed = changed_by(cands, culprit)
    ran = [h for h in changed if RAN in h.evidence or UNRECORDED in h.evidence] or changed
    if repo is not None:
        ran = [h for h in ran if not only_moved(repo, h)] or ran
    for h in ran:
        if arch and arch.lower() in h.file.lower():
            h.score += ARCH_WEIGHT
            h.evidence.append(f"in the {arch} model's own code")
    return sorted(ran, key=lambda h: (-h.score, h.file, h.function))


def localize(
    repo: Path,
    cands: list[Hypothesis],
    repro: Reproduction,
    prober,
    culprit: Culprit,
    budget: int = MAX_RESTORES,
) -> tuple[list[Hypothesis], Narrowing]:
    """Rank and verify inside the release diff; returns all candidates ranked and what was spent."""
    model = repro.scenario.model
    arch = model.get("arch") if isinstance(model, dict) else getattr(model, "arch", None)
    ran = len(suspects(cands, culprit, None))
    ordered = suspects(cands, culprit, arch, repo)
    narrowing = Narrowing(changed=len(changed_by(cands, culprit)), ran=ran, code_changed=len(ordered))
    restorer = Restorer(repo, culprit.sha, repro, prober, narrowing, budget)
    found = restorer.singles(ordered[:SINGLE_FIRST])
    if found is None:
        found = restorer.sections(ordered)
    ranked = rank(cands, top=len(cands))
    if ranked:
        ranked[0].evidence.append(narrowing.line())
    return ranked, narrowing


class Restorer:
    """Counterfactual restores of the previous release's code into the bad tree, within a budget."""

    def __init__(self, repo: Path, sha: str, repro: Reproduction, prober, narrowing: Narrowing, budget: int):
        self.repo, self.sha, self.repro, self.prober = repo, sha, repro, prober
        self.narrowing, self.budget = narrowing, budget
        self.tried: set[frozenset[str]] = set()  # suspect sets already restored together

    def left(self) -> int:
        return self.budget - self.narrowing.restores

    def singles(self, hyps: list[Hypothesis]) -> Hypothesis | None:
        """Restore each alone; the first whose restore removes the divergence is verified."""
        for h in hyps:
            if self.left() <= 0:
                return None
            outcome = self.probe_restored([h])
            if outcome is True:
                return mark_verified(h, "restoring its previous release's version removes the divergence")
            if outcome is False:
                h.score += WEIGHTS["refuted"]
                h.evidence.append("restoring its previous release's version leaves the divergence")
        return None

    def sections(self, ordered: list[Hypothesis]) -> Hypothesis | None:
        """Per file (best suspect first): restore every suspect of the file at once, or, when those
        cannot run without the helpers they moved with, the whole file; on success split the file's
        suspects in halves down to one function."""
        for file in dict.fromkeys(h.file for h in ordered):
            pool = [h for h in ordered if h.file == file]
            group = [h for h in pool if not refuted(h)]
            if not group or self.left() <= 0:
                continue
            outcome = self.probe_restored(group)
            if outcome is None and self.left() > 0:
                outcome = self.probe_file(file)
                if outcome is True:
                    credit(group, f"restoring the previous release's {file} removes the divergence")
                    return self.neighbourhoods(group, pool)
            if outcome is True:
                credit(group, f"restoring the previous release's {file} section removes the divergence")
                return self.split(group, pool)
        return None

    def neighbourhoods(self, group: list[Hypothesis], pool: list[Hypothesis] | None = None) -> Hypothesis | None:
        """The file's suspects cannot be restored alone or all together (their helpers moved with the
        file): restore each suspect with the changed suspects of the file (`pool`, refuted ones
        included: a caller that restores alone without effect may still be needed with its callee)
        it calls or that call it, best first."""
        pool = pool or group
        calls = call_edges(self.repo, pool)
        for h in group:
            section = [g for g in pool if g is h or linked(h, g, calls)]
            if len(section) == len(pool) or frozenset(g.function for g in section) in self.tried:
                continue
            if self.probe_restored(section) is True:
                if len(section) == 1:
                    return mark_verified(h, "restoring its previous release's version removes the divergence")
                culprit = self.attribute(section) or h
                culprit.score += SECTION_WEIGHT
                culprit.evidence.append(
                    "restoring it with the changed functions it calls or is called by ("
                    + ", ".join(g.function for g in section if g is not culprit)
                    + ") removes the divergence"
                )
                return culprit
        return None

    def attribute(self, section: list[Hypothesis]) -> Hypothesis | None:
        """Group testing inside a section whose joint restore removes the divergence: leave one member
        at its bad-release code and restore the rest. If the divergence comes back, that member is
        needed; if not, it is not. Returns the one needed member, when exactly one is."""
        needed = []
        for m in section:
            rest = [g for g in section if g is not m]
            if len(rest) == 1 and refuted(rest[0]):
                outcome: bool | None = False  # the rest alone was already restored: still diverged
            elif frozenset(g.function for g in rest) in self.tried:
                continue
            else:
                outcome = self.probe_restored(rest)
            if outcome is False:
                needed.append(m)
        if len(needed) != 1:
            return None
        needed[0].score += SECTION_WEIGHT
        needed[0].evidence.append(
            "group test: restoring the rest of its section without it leaves the divergence, with it removes it"
        )
        return needed[0]

    def split(self, group: list[Hypothesis], pool: list[Hypothesis]) -> Hypothesis | None:
        """Halve a group whose joint restore removes the divergence, keeping the half that does; when
        the halves cannot run apart (they changed together), search by call neighbourhoods."""
        while len(group) > 1 and self.left() > 0:
            half = group[: len(group) // 2]
            outcome = self.probe_restored(half)
            if outcome is None:
                return self.neighbourhoods(group, pool)
            group = half if outcome else group[len(group) // 2 :]
        if len(group) == 1 and self.left() >= 0:
            return mark_verified(group[0], "the narrowed section restore removes the divergence")
        return None

    def probe_restored(self, hyps: list[Hypothesis]) -> bool | None:
        """True: no divergence once these functions are their previous release's versions; False:
        still diverges; None: cannot be tested (all new functions, engine crash)."""
        self.tried.add(frozenset(h.function for h in hyps))
        return self._probe(lambda tree: restore_functions(self.repo, tree, hyps))

    def probe_file(self, file: str) -> bool | None:
        """The same for the previous release's whole file."""
        return self._probe(lambda tree: [file] if restore_file(self.repo, tree, file, self.sha) else [])

    def _probe(self, apply) -> bool | None:
        if self.left() <= 0:
            return None
        try:
            with temporary_worktree(self.repo, "HEAD") as tree:
                names = apply(tree)
                if not names:
                    return None
                self.narrowing.restores += 1
                diverged = self.prober.probe(self.repro.scenario, tree).diverged
        except (GitError, PatchConflict, EngineRunError):
            return None
        shown = ", ".join(names[:3]) + ("…" if len(names) > 3 else "")
        self.narrowing.log.append(f"restore {shown}: {'diverges' if diverged else 'agrees'}")
        return not diverged


def previous_text(repo: Path, h: Hypothesis) -> str | None:
    """h's definition text in the release before the one that changed it."""
    old = open_index(repo, commit=f"{h.commit}^", include_tests=False)
    before = next((s for s in old.find(h.function) if s.file == h.file and s.qualname == h.function), None)
    return old.read(before) if before is not None else None


def only_moved(repo: Path, h: Hypothesis) -> bool:
    """The release moved or re-documented h without changing its code (compared as code tokens,
    comments, layout and docstrings left out, so a refactor that moved a function is not mistaken
    for one that changed it)."""
    try:
        before = previous_text(repo, h)
        new = open_index(repo, commit=h.commit, include_tests=False)
    except GitError:
        return False
    after = next((s for s in new.find(h.function) if s.file == h.file and s.qualname == h.function), None)
    return before is not None and after is not None and same_code(h.file, before, new.read(after))


def restore_functions(repo: Path, tree: Path, hyps: list[Hypothesis]) -> list[str]:
    """Splice each function's previous-release text over its definition in the tree, then give each
    touched module back the module-level names (imports, helpers) those texts read and the new
    module no longer binds. Returns the restored functions' names."""
    restored: dict[str, list[str]] = {}
    names = []
    for h in hyps:
        text = previous_text(repo, h)
        if text is not None and restore_function(tree, h.file, h.function, text):
            restored.setdefault(h.file, []).append(text)
            names.append(h.function)
    for file, texts in restored.items():
        old = git_show(repo, f"{hyps[0].commit}^", file)
        path = tree / file
        imports, defs = missing_bindings(old, path.read_text(), texts) if old is not None else ([], [])
        if imports or defs:
            path.write_text(insert_bindings(path.read_text(), imports, defs))
    return names


def git_show(repo: Path, rev: str, file: str) -> str | None:
    proc = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{file}"], capture_output=True)
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None


def restore_file(repo: Path, tree: Path, file: str, sha: str) -> bool:
    """Put the file as it was in the release before `sha` into the tree; False if it did not exist."""
    proc = subprocess.run(["git", "-C", str(repo), "show", f"{sha}^:{file}"], capture_output=True)
    if proc.returncode != 0:
        return False
    (tree / file).write_bytes(proc.stdout)
    return True


def call_edges(repo: Path, group: list[Hypothesis]) -> dict[str, set[str]]:
    """Qualname -> short names it calls, in the bad tree (call edges are by name)."""
    index = open_index(repo, include_tests=False)
    out = {}
    for h in group:
        sym = next((s for s in index.find(h.function) if s.file == h.file and s.qualname == h.function), None)
        out[h.function] = set(index.callees(sym)) if sym is not None else set()
    return out


def linked(a: Hypothesis, b: Hypothesis, calls: dict[str, set[str]]) -> bool:
    short = lambda h: h.function.rsplit(".", 1)[-1]  # noqa: E731
    return short(b) in calls.get(a.function, ()) or short(a) in calls.get(b.function, ())


def credit(group: list[Hypothesis], why: str) -> None:
    for h in group:
        h.score += SECTION_WEIGHT
        h.evidence.append(why)


def refuted(h: Hypothesis) -> bool:
    return any(line.startswith("restoring its previous release's version leaves") for line in h.evidence)


def mark_verified(h: Hypothesis, why: str) -> Hypothesis:
    h.verified, h.score = True, h.score + WEIGHTS["verified"]
    h.evidence.insert(0, f"verified: {why}")
    return h
