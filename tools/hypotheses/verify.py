"""Counterfactual verification in a temporary worktree (the user's checkout is never touched):
restore a suspected function's previous version, or, where it has none (a bug at base, a function
that did not change), apply one candidate fix (a template of tools/hypotheses/fixes.py, or a patch
an LLM proposes) and re-probe. The divergence vanishing, with no new one, verifies the function.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tools.engines.runner import EngineRunError
from tools.history.gitrepo import (
    GitError,
    PatchConflict,
    apply_patch,
    scratch_worktree,
    tree_files,
)
from tools.hypotheses.arguments import Dropped, keywords_passing, restored_argument_versions
from tools.hypotheses.completion import completed_versions
from tools.hypotheses.evidence import Culprit, Hypothesis, Reproduction
from tools.hypotheses.fixes import fixes, parse_function
from tools.hypotheses.moved import (
    class_statements_restored,
    dropped_options,
    faithful_move,
    function_node,
    inline_version,
    kept_call_version,
    lost_text,
    moved_statements,
    narrowed_arguments,
    only_its_use,
    same_def,
    same_def_renamed,
    with_body,
)
from tools.hypotheses.rank import WEIGHTS, rank
from tools.probe import taps as tapnames
from tools.probe.prober import Prober
from tools.source.index import definition, language_of, open_index, parse_file, same_code

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
        outcome, before, after = revert_and_probe(repo, h, repro, prober)
        commit = (h.commit or "")[:10]
        if outcome is True:
            how = f"reverting {h.function}'s change in {commit} removes the divergence"
            mark_verified(h, "restore", how, function_diff(h.file, before, after))
            if completed_elsewhere(repo, h, ordered, repro, prober) is None:
                prefer_callee(repo, h, before, after, ordered, repro, prober, touched_only=True)
            return rank(ordered)
        if outcome is not True and restore_dropped_argument(repo, h, repro, prober):
            return rank(ordered)  # the call site changed the behaviour: no callee is more to blame
        if outcome is False:
            h.score += WEIGHTS["refuted"]
            h.evidence.append(f"reverting {h.function}'s change in {commit} leaves the divergence")
        elif is_new(repo, h) and restore_absence(repo, h, repro, prober):
            return rank(ordered)  # its absence is its restore: stronger evidence than any template edit
        else:
            if before and same_code(h.file, before, after):
                h.evidence.append(f"its change in {commit} is only comments or layout: reverting it tests nothing")
            elif not before and (moved := moved_from(repo, h)):
                h.evidence.append(f"its body is {moved}'s before {commit}, moved unchanged: it is not new code")
            untestable.append(h)
    # a function pushed below zero (it never ran in the failing scenario) cannot be fixed by an edit
    no_history = [h for h in ordered if (not h.commit or h in untestable) and h.score >= 0][:top]
    verify_by_fixes(repo, no_history, repro, prober, suspects=ordered)
    return rank(ordered)


DROPPED_ARGUMENTS_TRIED = 2  # versions of one function with an argument its commit dropped passed again


def restore_dropped_argument(repo: Path, h: Hypothesis, repro: Reproduction, prober: Prober) -> bool:
    """h's commit stopped passing an argument at one of h's calls (tools.hypotheses.arguments), so the
    callee's default applies there now: h as it is now, that one argument passed again by keyword (the
    keyword the old call used, the one the tree passes that same value under elsewhere, or the name of
    the callee's parameter at its old position), is re-probed. The divergence vanishing verifies h: the
    call site is where the behaviour changed, whether the callee's default is old or new. This is
    the restore of that call alone, a test where restoring all of h is none (the same commit changed
    the callee's signature, so the old call no longer fits it)."""
    old_text = old_source(repo, h) if h.commit and h.file.endswith(".py") else None
    now = function_source(repo, h) if old_text else None
    if not old_text or not now:
        return False
    versions = restored_argument_versions(now, old_text, lambda d: argument_keywords(repo, h, d))
    if not versions:
        return False
    outcome = try_edits(repo, h, repro, prober, lambda _text: versions, DROPPED_ARGUMENTS_TRIED)
    commit = (h.commit or "")[:10]
    if outcome.verified:
        how = (
            f"passing {outcome.description} again, an argument {commit} stopped passing at that call (the "
            "callee's default applied instead), removes the divergence"
        )
        mark_verified(h, "restore", how, outcome.diff)
    elif outcome.probes:
        h.evidence.append(f"the argument(s) {commit} stopped passing, passed again, leave the divergence")
    return outcome.verified


def argument_keywords(repo: Path, h: Hypothesis, d: Dropped) -> list[str]:
    """Keywords to pass a dropped argument under: those under which h's file passes the same value
    elsewhere, then the name of the parameter at its old position of a function (a class: its
    `__init__`) of that name before h's commit, where the tree now has a parameter of that name."""
    out: list[str] = []
    text = function_text_at(repo, "HEAD", h.file, h.function)
    blob = next((data for _, data in tree_files(repo, "HEAD", (), frozenset({h.file}))), None)
    if blob is not None:
        out += sorted(keywords_passing(blob.decode("utf-8", "replace"), d.value))
    if d.position is None or text is None:
        return out
    try:
        old = open_index(repo, commit=f"{h.commit}^", include_tests=False)
    except GitError:
        return out
    for s in old.symbols:
        if s.name != d.callee or s.language != "python":
            continue
        fn = function_node(old.read(s)) if s.kind != "class" else _init_of(old, s)
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)] if fn is not None else []
        params = params[1:] if params[:1] in (["self"], ["cls"]) else params
        if d.position < len(params) and params[d.position] not in out:
            out.append(params[d.position])
    return out


def _init_of(index, cls) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    init = next((s for s in index.find(f"{cls.qualname}.__init__") if s.file == cls.file), None)
    return function_node(index.read(init)) if init is not None else None


COMPLETED_FUNCTIONS_TRIED = 3  # other functions of a verified restore's commit given the commit's swap
COMPLETIONS_PER_FUNCTION = 2


def completed_elsewhere(
    repo: Path, h: Hypothesis, suspects: list[Hypothesis], repro: Reproduction, prober: Prober
) -> Hypothesis | None:
    """h's restore removes the divergence, but that may only undo the half of a change of meaning its
    commit did do (h consumes a value in its new meaning) where another function of the commit missed
    a use: that function swapped a name for another on some lines (`window` -> `left`) and still reads
    the old one on a line the commit left alone (tools.hypotheses.completion). With h as it is now and
    the swap made on that line too, does the divergence vanish? Then the commit, completed, agrees: h's
    change is right and the function that missed the use takes the credit. Returns it, or None."""
    tried = 0
    for g in suspects:
        if tried >= COMPLETED_FUNCTIONS_TRIED:
            break
        if g is h or g.verified or g.commit != h.commit or g.score < 0 or not g.file.endswith(".py"):
            continue
        old_text, now = old_source(repo, g), function_source(repo, g)
        versions = completed_versions(now, old_text) if old_text and now else []
        if not versions:
            continue
        tried += 1
        outcome = try_edits(repo, g, repro, prober, lambda _text, v=versions: v, COMPLETIONS_PER_FUNCTION)
        commit = (g.commit or "")[:10]
        if not outcome.verified:
            g.evidence.append(f"{commit}'s own swap made on its remaining use(s) leaves the divergence")
            continue
        how = (
            f"{commit} swapped a name for another on some of its lines but not on one it left alone; "
            f"made there too ({outcome.description}), with {h.function} kept as it is now, the divergence "
            "vanishes: the commit, completed, agrees"
        )
        mark_verified(g, "restore", how, outcome.diff)
        h.verified, h.verified_by, h.verifying_diff = False, None, ""
        h.score -= WEIGHTS["verified"]
        h.evidence = [e for e in h.evidence if not e.startswith("verified: ")]
        h.evidence.insert(
            0,
            f"its restore removes the divergence, but {g.function}, changed by the same commit, missed one use "
            "of the commit's own swap and completing it removes the divergence too, this function kept as it "
            f"is now: its restore only undoes the half of the change that was done (credited to {g.function})",
        )
        return g
    return None


def mark_verified(h: Hypothesis, by: str, how: str, diff: str = "") -> None:
    h.verified, h.verified_by, h.score = True, by, h.score + WEIGHTS["verified"]
    h.verifying_diff = diff
    h.evidence.insert(0, f"verified: {how}")


def revert_and_probe(repo: Path, h: Hypothesis, repro: Reproduction, prober: Prober) -> tuple[bool | None, str, str]:
    """(outcome, current text, restored text). Outcome True: divergence gone once the function is
    restored to its version before h.commit; False: still there; None: could not test (new function,
    no parent, engine crash, or a change of comments only: a bug at base stays whatever they say, and
    a native tree would be rebuilt for nothing)."""
    try:
        old = open_index(repo, commit=f"{h.commit}^", include_tests=False, paths=(h.file,))
        before = next((s for s in old.find(h.function) if s.file == h.file and s.qualname == h.function), None)
        if before is None:
            return None, "", ""
        # read from HEAD's blob, what the scratch tree would hold: no checkout for a change of comments only
        current, restored = function_text_at(repo, "HEAD", h.file, h.function) or "", old.read(before)
        if before.kind == "class":  # its own statements only: its methods are candidates of their own
            restored = class_statements_restored(current, restored) or current
        if same_code(h.file, current, restored):
            return None, current, restored
        with scratch_worktree(repo, "HEAD") as tree:
            if not restore_version(tree, h.file, h.function, restored, old):
                return None, current, restored
            return not prober.probe(repro.scenario, tree).diverged, current, restored
    except (GitError, PatchConflict, EngineRunError):
        return None, "", ""


def restore_version(tree: Path, file: str, qualname: str, old_text: str, old) -> bool:
    """Restore `qualname` to `old_text`, the version in the index `old`, with the siblings it calls
    that the tree no longer has (a helper deleted when the function stopped calling it), so that the
    old version runs as it did rather than failing on a missing name."""
    path = tree / file
    language = language_of(file)
    if not path.exists() or language is None:
        return False
    present = {s.qualname for s in parse_file(file, path.read_bytes(), language)[0]}
    parent = qualname.rpartition(".")[0]
    called = {name for name, _ in call_names(old_text)}
    missing = [
        s
        for s in old.symbols
        if s.file == file
        and s.kind != "class"
        and s.name in called
        and (s.qualname.rpartition(".")[0] == parent or "." not in s.qualname)
        and s.qualname not in present
    ]
    # a module-level function it called goes at the end of the file, out of any class
    siblings = [s for s in missing if s.qualname.rpartition(".")[0] == parent]
    module = [s for s in missing if parent and "." not in s.qualname]
    text = old_text if old_text.endswith("\n") else old_text + "\n"
    if not restore_function(tree, file, qualname, text + "".join("\n" + old.read(s) for s in siblings)):
        return False
    if module:
        with path.open("a") as f:
            f.write("".join("\n\n" + old.read(s).rstrip("\n") + "\n" for s in module))
    return True


def restore_function(tree: Path, file: str, qualname: str, old_text: str) -> bool:
    """Splice `old_text` over the current definition of `qualname` in tree/file. Only that function
    changes, unlike a hunk revert, which also undoes neighbours that share the hunk."""
    path = tree / file
    if not path.exists():
        return False
    data = path.read_bytes()
    current = definition(file, data, qualname)  # any language the index reads: the engine rebuilds a native tree
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
    before: str = ""  # the function as it stands, and as the verifying edit left it
    after: str = ""


def verify_by_fixes(
    repo: Path,
    cands: list[Hypothesis],
    repro: Reproduction,
    prober: Prober,
    budget: int = FIX_PROBES_PER_CASE,
    per_function: int = FIX_PROBES_PER_FUNCTION,
    suspects: list[Hypothesis] | None = None,
) -> int:
    """Template fixes for candidates with no previous version, best first, until one verifies or
    `budget` probes are spent. Returns the probes run. Nothing runs unless the failing scenario
    diverges: on a tree that already agrees there is nothing a fix could remove. With `suspects`,
    a verified function that calls one of them hands the credit to it if it verifies too."""
    if not diverges(repro) or repro.probe is None:
        return 0
    component = tapnames.component(repro.probe.first.tap) if repro.probe.first else None
    spent = 0
    for h in cands:
        if spent >= budget:
            break
        if templates_tried(h):  # the same edits on the same tree: their verdict stands
            continue
        outcome = try_edits(
            repo, h, repro, prober, lambda text: fixes(text, component), min(per_function, budget - spent)
        )
        spent += outcome.probes
        if outcome.verified:
            how = f"the fix `{outcome.description}` removes the divergence (edit {outcome.probes} tried on it)"
            mark_verified(h, "fix-template", how, outcome.diff)
            if suspects:
                prefer_callee(repo, h, outcome.before, outcome.after, suspects, repro, prober, touched_only=False)
            break
        if outcome.probes:
            h.evidence.append(f"{outcome.probes} {TEMPLATES_TRIED} {h.function} tried; none removes the divergence")
    return spent


TEMPLATES_TRIED = "fix template edit(s) of"


def templates_tried(h: Hypothesis) -> bool:
    return any(TEMPLATES_TRIED in e for e in h.evidence)


# ---- the function that holds the fault, not a caller that routes around it ----------------------

CALLEES_TRIED = 2  # callees of a verified function given their own verification


def prefer_callee(
    repo: Path,
    h: Hypothesis,
    before: str,
    after: str,
    suspects: list[Hypothesis],
    repro: Reproduction,
    prober: Prober,
    touched_only: bool,
) -> Hypothesis:
    """A verified caller may only route around its faulty callee: a restore that drops the call, an
    edit that changes its arguments or sends the work down another path. Suspects it calls (the
    calls its edit removed or changed first; with `touched_only`, only those; also their callees)
    are verified on their own, and the first that verifies takes the credit: the fault is where the
    smallest verifying edit is. Failing that, a callee that breaks its contract takes it, and so does
    one the suspected commit created when the caller's restore changes nothing but its use of it.
    Returns the hypothesis that keeps it."""
    touched = touched_calls(before, after)
    reach = set(touched) | passed_on(repo, h, touched, suspects) if touched_only else reachable_calls(repo, before)
    callees = sorted(
        (c for c in suspects if c is not h and not c.verified and c.score >= 0 and called_name(c, reach)),
        key=lambda c: (called_name(c, touched) is None, not breaks_contract(c)),
    )[:CALLEES_TRIED]
    dropped = handed_on_less(repo, before, after, callees, reach)
    for c in callees:
        note_moved(repo, h, c, after)
    verified = first_callee_verified(repo, h, callees, before, after, repro, prober, touched_only, reach, dropped)
    if verified is not None:
        withdraw(h, verified, "drops or changes its call to" if called_name(verified, touched) else "calls")
        return verified
    broken = next((c for c in callees if breaks_contract(c)), None)
    if broken is not None:  # the callee computes wrongly from its own inputs: the edit only avoids it
        # unless a helper the commit created under it, given its own caller's old inline code, removes
        # the divergence: the contract sees the callee's output, the fault may sit in what it calls
        deeper = isolated_helper(repo, h, suspects, repro, prober) if touched_only and not dropped else None
        withdraw(h, deeper or broken, "reaches")
        return deeper or broken
    use_only = [c for c in callees if use_only_changed(before, after, called_name(c, reach) or "")]
    # a helper the commit created first: a callee that existed before routes the same old code either way
    used = next((c for c in use_only if is_new(repo, c)), use_only[0] if use_only else None)
    if used is not None and dropped:  # the caller stopped reading an input: its own fault, not the helper's
        h.evidence.append(f"its change stops handing on {', '.join(dropped)}, so it keeps the credit")
    elif touched_only and used is not None and is_new(repo, used):  # the restore takes its code off the path
        if credit_new_helper(repo, h, used, before, after, called_name(used, reach) or ""):
            return used
    elif touched_only and not dropped and (deeper := isolated_helper(repo, h, suspects, repro, prober)):
        withdraw(h, deeper, "reaches")
        return deeper
    elif touched_only and not dropped and (kept := helper_kept(repo, h, callees, before, after, reach, repro, prober)):
        return kept
    elif (
        touched_only
        and not dropped
        and (new := rewritten_around(repo, h, callees, before, after, reach, repro, prober))
    ):
        return new
    for c in callees:
        if called_name(c, touched):
            h.evidence.append(f"its verifying edit changes its use of {c.function}, which does not verify on its own")
    return h


def first_callee_verified(
    repo: Path,
    h: Hypothesis,
    callees: list[Hypothesis],
    before: str,
    after: str,
    repro: Reproduction,
    prober: Prober,
    touched_only: bool,
    reach: set[str],
    dropped: list[str],
) -> Hypothesis | None:
    """The first of `callees` that verifies on its own. Every callee's restore-like counterfactual
    (its previous version; for a function the commit created, its absence; for a helper the restored
    caller computed inline, that inline code as its body) is tried before any template edit: a
    template edit can mask a fault elsewhere (a count made zero skips the faulty padding it sizes),
    so it is weaker evidence than putting back what the commit changed."""
    for c in callees:
        if verify_alone(repo, c, repro, prober, templates=False):
            return c
        if touched_only and verify_inlined(repo, h, c, before, after, repro, prober):
            return c
    for c in callees:
        # a function the commit created has no previous version: its template edits are its last
        # counterfactual, unless the caller's restore changes nothing but its use (credited later),
        # or its body is the code the caller lost, moved unchanged: that code ran right before the
        # commit, so an edit of it that removes the divergence only masks the caller's own change
        use_only = not dropped and use_only_changed(before, after, called_name(c, reach) or "")
        if touched_only and is_new(repo, c) and moved_unchanged(repo, h, c, before, after, reach):
            continue
        if not touched_only or (is_new(repo, c) and not use_only):
            verify_by_fixes(repo, [c], repro, prober, budget=FIX_PROBES_PER_FUNCTION)
            if c.verified:
                return c
    return None


def credit_new_helper(repo: Path, h: Hypothesis, used: Hypothesis, before: str, after: str, name: str) -> bool:
    """h's verifying restore changes nothing but its use of `used`, a function h's commit created:
    the restore takes `used`'s code off the path and puts back the code h lost. Unless `used`'s body
    is that lost code moved unchanged (then h's remaining change carries the divergence and h keeps
    the credit), the credit goes to `used`. Returns whether it did."""
    commit = (used.commit or "")[:10]
    if faithful_move(function_source(repo, used) or "", before, after, name):
        h.evidence.append(
            f"its verifying restore changes only its use of {used.function}, but {used.function}'s body is "
            "the code it lost, moved unchanged (a faithful move): its own remaining change carries the divergence"
        )
        used.evidence.append(f"its body is the code its caller {h.function} lost, moved unchanged: a faithful move")
        return False
    lost = lost_text(before, after)
    body = f"not the code {h.function} lost (`{lost}`)" if lost else f"code {h.function} did not have before"
    how = (
        f"restoring its caller {h.function}, whose change is only its use of {used.function}, removes the "
        f"divergence; {used.function} is new in {commit} and its body is {body}, so the behaviour the restore "
        f"takes off the path is {used.function}'s own code: it outranks its caller"
    )
    mark_verified(used, "restore", how, h.verifying_diff)
    withdraw(h, used, "only changes its use of")
    return True


def note_moved(repo: Path, h: Hypothesis, c: Hypothesis, after: str) -> bool:
    """c, a function h's commit created, is code the old tree had, moved unchanged (moved_from): said in
    c's evidence, naming whether h's old version `after` called it. Whether it is."""
    moved = moved_from(repo, c) if c.commit == h.commit else None
    if moved is None:
        return False
    called = short_name(moved) in {n for n, _ in call_names(after)}
    whose = f"which its caller {h.function} called before" if called else f"as it stood before {(c.commit or '')[:10]}"
    note = f"its body is {moved}'s, {whose}, moved unchanged: that code ran before the commit, it is not new code"
    if note not in c.evidence:
        c.evidence.append(note)
    return True


def moved_unchanged(repo: Path, h: Hypothesis, c: Hypothesis, before: str, after: str, reach: set[str]) -> bool:
    """c's body, under what h now passes it, is code h's verifying restore puts back (a faithful
    move); said in c's evidence once."""
    name = called_name(c, reach) or ""
    if not name or not faithful_move(function_source(repo, c) or "", before, after, name):
        return False
    note = f"its body is the code its caller {h.function} lost, moved unchanged: a faithful move"
    if not any(e.startswith(note) for e in c.evidence):
        c.evidence.append(note + " (no template edit tried on it: that code ran right before the commit)")
    return True


KEPT_CALLS_TRIED = 2  # new helpers whose caller is restored around its call to them


def helper_kept(
    repo: Path,
    h: Hypothesis,
    callees: list[Hypothesis],
    before: str,
    after: str,
    reach: set[str],
    repro: Reproduction,
    prober: Prober,
) -> Hypothesis | None:
    """h's verifying restore changes more than its use of a helper its commit created, so which of the
    two carries the divergence is open. h is restored but keeps its lines that use the helper (the
    helper's output feeds the value the old line computed: tools.hypotheses.moved.kept_call_version).
    If the divergence stays, the helper's own code carries it and it outranks h; if it goes, h's other
    changes carry it and h keeps the credit. A helper whose body is the code h lost, moved unchanged,
    is not tried (h keeps it)."""
    tried = 0
    for c in callees:
        name = called_name(c, reach) or ""
        if tried >= KEPT_CALLS_TRIED or c.commit != h.commit or not name or not is_new(repo, c):
            continue
        version = kept_call_version(before, after, name)
        if version is None or faithful_move(function_source(repo, c) or "", before, after, name):
            continue
        tried += 1
        outcome = probe_version(repo, h, version, repro, prober)
        if outcome is True:
            h.evidence.append(
                f"restored but for its use of {c.function} it still diverges: {c.function}'s own code carries it"
            )
            how = (
                f"its caller {h.function} restored to before {(c.commit or '')[:10]} but for its use of "
                f"{c.function} (new in that commit) still diverges, and restored in full it agrees: "
                f"{c.function}'s own code carries the divergence"
            )
            mark_verified(c, "restore", how, function_diff(h.file, before, version))
            withdraw(h, c, "still diverges restored all but its use of")
            return c
        if outcome is False:
            h.evidence.append(
                f"restored but for its use of {c.function} it agrees: its own other changes carry the divergence"
            )
    return None


REFUTED_HELPER = (
    "leaves the divergence: the caller's own change carries it",  # verify_inlined
    "a faithful move",
)


CALLER_EDITS_TRIED = 8  # template edits of a caller's own new lines, its call of a new helper kept


def rewritten_around(
    repo: Path,
    h: Hypothesis,
    callees: list[Hypothesis],
    before: str,
    after: str,
    reach: set[str],
    repro: Reproduction,
    prober: Prober,
) -> Hypothesis | None:
    """h's verifying restore takes off the path both h's rewrite and its call of a helper the same commit
    created, and no counterfactual tried so far separates the two (the helper has no earlier version,
    no template edit repairs it, h cannot be restored around its use of it). Where the helper is new
    code (none of its statements is code h lost, names aside) and no template edit of h's own new lines,
    the helper's call kept, removes the divergence either, the helper is the suspect: h's rewrite
    re-expresses code that ran right before the commit, the helper's code ran nowhere before. h keeps
    the credit where the helper is (mostly) code h lost, moved (h's change around it is what is new),
    where a counterfactual put the divergence on h's own change, or where its own edit removes it."""
    for c in callees:
        name = called_name(c, reach) or ""
        if c.commit != h.commit or not name or not is_new(repo, c) or name in {n for n, _ in call_names(after)}:
            continue
        said = [*c.evidence, *h.evidence]
        if any(r in e for r in REFUTED_HELPER for e in c.evidence) or any(
            f"restored but for its use of {c.function} it agrees" in e for e in said
        ):
            continue
        if moved_statements(function_source(repo, c) or "", before, after):
            c.evidence.append(f"part of its body is code its caller {h.function} lost, moved (names aside)")
            continue
        if own_edit_verifies(repo, h, before, after, repro, prober, name):
            return None
        lost = lost_text(before, after)
        how = (
            f"restoring its caller {h.function}, which {(c.commit or '')[:10]} rewrote around its call of "
            f"{c.function} (lost: `{lost}`), removes the divergence; {c.function} is new code in that commit "
            "(none of it is the lost code), and no edit of the caller's own new lines removes it: its new "
            "code is the suspect"
        )
        mark_verified(c, "restore", how, h.verifying_diff)
        withdraw(h, c, "is rewritten around its new callee")
        return c
    return None


def own_edit_verifies(
    repo: Path, h: Hypothesis, before: str, after: str, repro: Reproduction, prober: Prober, helper: str
) -> bool:
    """A template edit of one of the lines h's commit gave it (h as it is now, its calls kept) removes
    the divergence: h's own new code carries it. The lines that name what h hands `helper` go first (a
    value handed on wrong is the caller's commonest fault). Said in h's evidence either way."""
    component = tapnames.component(repro.probe.first.tap) if repro.probe and repro.probe.first else None
    added = {line.strip() for line in before.splitlines()} - {line.strip() for line in after.splitlines()}
    handed = handed_names(before, helper)

    def own_lines(text: str) -> list[tuple[str, str]]:
        edits = [(d, new, _edited_line(text, new)) for d, new in fixes(text, component)]
        mine = [(d, new, line) for d, new, line in edits if line in added]
        mine.sort(key=lambda e: not (set(re.findall(r"\w+", e[2])) & handed))  # stable: template order kept
        return [(d, new) for d, new, _ in mine]

    outcome = try_edits(repo, h, repro, prober, own_lines, CALLER_EDITS_TRIED)
    if outcome.verified:
        h.evidence.append(
            f"its own edit `{outcome.description}` (its calls kept) also removes the divergence: "
            "its own new code carries it, so it keeps the credit"
        )
    elif outcome.probes:
        h.evidence.append(f"{outcome.probes} template edit(s) of its own new lines leave the divergence")
    return outcome.verified


def handed_names(source: str, helper: str) -> set[str]:
    """Plain names `source` hands `helper` as whole arguments (`helper(x, rows)`: x, rows)."""
    fn = function_node(source)
    short = helper.rsplit(".", 1)[-1]
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)] if fn is not None else []
    named = [c for c in calls if getattr(c.func, "id", getattr(c.func, "attr", None)) == short]
    return {a.id for c in named for a in [*c.args, *(k.value for k in c.keywords)] if isinstance(a, ast.Name)}


def _edited_line(old: str, new: str) -> str:
    """The first line of `old` that the edit to `new` changed, stripped."""
    for a, b in zip(old.splitlines(), new.splitlines()):
        if a != b:
            return a.strip()
    return ""


def probe_version(repo: Path, h: Hypothesis, version: str, repro: Reproduction, prober: Prober) -> bool | None:
    """Does the failing scenario still diverge with h's function replaced by `version`? None: untested."""
    if not diverges(repro):
        return None
    try:
        with scratch_worktree(repo, "HEAD") as tree:
            path = tree / h.file
            if not restore_function(tree, h.file, h.function, version):
                return None
            forget_bytecode(path)
            return prober.probe(repro.scenario, tree).diverged
    except (GitError, EngineRunError):
        return None


DEEPER_HELPERS_TRIED = 2  # new helpers further down given their own caller's old inline code


def isolated_helper(
    repo: Path, h: Hypothesis, suspects: list[Hypothesis], repro: Reproduction, prober: Prober
) -> Hypothesis | None:
    """A helper h's commit created further down the path than h (h's restore only changes what it
    hands down: an argument the commit threads through to it): each such helper whose own caller, a
    function the commit changed too, computed its value inline before is given that old inline code as
    its body (verify_inlined, its caller kept as it is now). The first that verifies takes the credit."""
    index = open_index(repo, include_tests=False)
    tried = 0
    for c in [c for c in suspects if c is not h and not c.verified and c.score >= 0 and c.commit == h.commit]:
        if tried >= DEEPER_HELPERS_TRIED or not is_new(repo, c):
            continue
        for caller in (s for s in suspects if s is not h and s is not c and s.commit == h.commit and s.file == c.file):
            now, old = function_source(repo, caller, index), old_source(repo, caller)
            helper = function_source(repo, c, index) or ""
            if not now or not old or inline_version(helper, now, old, c.function) is None:
                continue  # it does not call c as `name = c(...)`, or c has no old inline code there
            tried += 1
            if verify_inlined(repo, caller, c, now, old, repro, prober):
                return c
            break
    return None


def old_source(repo: Path, h: Hypothesis) -> str | None:
    """h's function as it stood before h's commit."""
    try:
        old = open_index(repo, commit=f"{h.commit}^", include_tests=False, paths=(h.file,))
    except GitError:
        return None
    sym = next((s for s in old.find(h.function) if s.file == h.file and s.qualname == h.function), None)
    return old.read(sym) if sym is not None else None


def function_source(repo: Path, h: Hypothesis, index=None) -> str | None:
    """h's function as it stands at HEAD."""
    index = index or open_index(repo, include_tests=False)
    sym = next((s for s in index.find(h.function) if s.file == h.file and s.qualname == h.function), None)
    return index.read(sym) if sym is not None else None


def passed_on(repo: Path, h: Hypothesis, touched: set[str], suspects: list[Hypothesis]) -> set[str]:
    """Names called by the suspects whose calls h's restore changed and that h's commit changed too:
    what the caller hands them (a new argument) takes effect in what their change calls."""
    index = open_index(repo, include_tests=False)
    out: set[str] = set()
    for c in suspects:
        if c is not h and c.commit == h.commit and called_name(c, touched):
            sym = next((s for s in index.find(c.function) if s.file == c.file and s.qualname == c.function), None)
            out |= {name for name, _ in call_names(index.read(sym))} if sym is not None else set()
    return out


def called_name(c: Hypothesis, names: set[str]) -> str | None:
    """The name in `names` by which code reaches c's function: its own short name, or for a method
    its class's (`Cls(...)` runs `Cls.__init__`, and the object it makes runs the rest)."""
    parts = c.function.split(".")
    return next((n for n in (parts[-1], parts[-2] if len(parts) > 1 else "") if n and n in names), None)


def is_new(repo: Path, h: Hypothesis) -> bool:
    """h's function is new code in the commit suspected of it: it did not exist before that commit, and
    it is not a function the old code had, moved or renamed unchanged (moved_from). The one notion of
    new code: a new function has no earlier version, so its absence or a template edit is its
    counterfactual and it may take a restored caller's credit; moved code ran before the commit, so
    neither holds for it."""
    return absent_before(repo, h) and moved_from(repo, h) is None


def absent_before(repo: Path, h: Hypothesis) -> bool:
    """h's function (its file and qualname) did not exist before the commit suspected of it."""
    try:
        old = open_index(repo, commit=f"{h.commit}^", include_tests=False, paths=(h.file,))
    except GitError:
        return False
    return bool(h.commit) and not any(s.file == h.file and s.qualname == h.function for s in old.find(h.function))


def moved_from(repo: Path, h: Hypothesis) -> str | None:
    """The qualname of the function of the tree before h's commit whose body h's function has,
    docstrings, annotations and parameter names aside (a module function made a method on its first
    parameter too: tools.hypotheses.moved.same_def_renamed): h's function was moved, renamed or copied
    there unchanged, its code ran before the commit. None where h's function existed before (its
    change is then its own) or nothing matches."""
    if not h.commit or not absent_before(repo, h):
        return None
    src = function_source(repo, h)
    return _moved_from(str(repo), h.commit, src) if src else None


@functools.lru_cache(maxsize=256)
def _moved_from(repo: str, commit: str, src: str) -> str | None:
    try:
        old = open_index(repo, commit=f"{commit}^", include_tests=False)
    except GitError:
        return None
    return next(
        (
            s.qualname
            for s in old.symbols
            if s.kind != "class" and s.language == "python" and same_def_renamed(old.read(s), src)
        ),
        None,
    )


def handed_on_less(repo: Path, before: str, after: str, callees: list[Hypothesis], reach: set[str]) -> list[str]:
    """What the caller's change (after -> before) stops handing on, as evidence phrases: a parameter it no
    longer reads, an option (a keyword argument) its lost code set that no code of it or of its callees
    names now, a part of a value where its lost code handed on the whole (tools.hypotheses.moved)."""
    helpers = [function_source(repo, c) or "" for c in callees]
    out = [f"its parameter {p}" for p in dropped_inputs(before, after)]
    out += [f"the option `{k}=`" for k in dropped_options(before, after, helpers)]
    for c in callees:
        whole = narrowed_arguments(before, after, called_name(c, reach) or "")
        out += [f"all of `{a.partition('[')[0]}` (it hands {c.function} `{a}`)" for a in whole]
    return out


def dropped_inputs(before: str, after: str) -> list[str]:
    """Parameters of the function that the verifying version `after` reads and `before` (the code
    under suspicion) no longer does: an edit that stops using one of its inputs (a hash that drops
    its parent, a scale that ignores its head size) is at fault itself, whatever helper it now calls."""
    old, new = function_node(before), function_node(after)
    if old is None or new is None:  # unparsable or not a function: claim nothing
        return []
    read_before, read_after = _names_read(old), _names_read(new)
    a = new.args
    params = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
    return [p for p in params if p in read_after and p not in read_before]


def _names_read(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Every name in the function's body (its signature left out)."""
    return {n.id for stmt in fn.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}


def only_use_changed(before: str, after: str, name: str) -> bool:
    """Every line the edit before -> after takes out of `before` names `name`: the edit changes
    nothing but how the function uses it."""
    removed = [line[1:] for line in difflib.ndiff(before.splitlines(), after.splitlines()) if line.startswith("- ")]
    return bool(removed) and all(name in line for line in removed)


def use_only_changed(before: str, after: str, name: str) -> bool:
    """The edit before -> after changes nothing but the function's use of `name`: line by line
    (only_use_changed), or statement by statement with moved code and the code a call replaced not
    counted (tools.hypotheses.moved.only_its_use: a call as a return value, an argument, a new branch)."""
    return bool(name) and (only_use_changed(before, after, name) or only_its_use(before, after, name))


def breaks_contract(h: Hypothesis) -> bool:
    """Its recorded calls broke its role's contract on their own inputs (tools.hypotheses.gather)."""
    return any(e.startswith("contract: ") for e in h.evidence)


def verify_alone(repo: Path, c: Hypothesis, repro: Reproduction, prober: Prober, templates: bool) -> bool:
    """Restore c's previous version if it has one, else (with `templates`) its fix templates; no
    further callee search. A restored caller is weighed against restores only: the same footing."""
    if c.commit:
        outcome, before, after = revert_and_probe(repo, c, repro, prober)
        if outcome is True:
            how = f"reverting {c.function}'s change in {c.commit[:10]} removes the divergence"
            mark_verified(c, "restore", how, function_diff(c.file, before, after))
            return True
        if outcome is None and is_new(repo, c) and restore_absence(repo, c, repro, prober):
            return True
    if templates:
        verify_by_fixes(repo, [c], repro, prober, budget=FIX_PROBES_PER_FUNCTION)
    return c.verified


ABSENCE_TRIED = "made as it was before it existed ("


def restore_absence(repo: Path, c: Hypothesis, repro: Reproduction, prober: Prober) -> bool:
    """A procedure the suspected commit created did nothing before it, since it was not there: its
    body made a no-op is its restore. So is, for a function that hands back its own inputs on its
    do-nothing path, that path taken always. (Any other value-returning function has no neutral version.)"""

    def neutral(text: str) -> list[tuple[str, str]]:
        if (t := noop_version(text)) is not None:
            return [("a no-op", t)]
        return [("a pass-through of its inputs", t)] if (t := passthrough_version(text)) is not None else []

    if any(e.startswith(ABSENCE_TRIED) for e in c.evidence):
        return False
    outcome = try_edits(repo, c, repro, prober, neutral, 1)
    if outcome.probes and not outcome.verified:
        c.evidence.append(f"{ABSENCE_TRIED} {outcome.description or 'its neutral version'}) leaves the divergence")
    if outcome.verified:
        how = (
            f"making {c.function}, new in {(c.commit or '')[:10]}, {outcome.description} "
            "(as before that commit) removes the divergence"
        )
        mark_verified(c, "restore", how, outcome.diff)
    return outcome.verified


def noop_version(source: str) -> str | None:
    """`source` (one def) with its body replaced by `pass` (docstring kept), if it is a procedure:
    no `return <value>`, no `yield`; else None."""
    fn = function_node(source)
    if fn is None or not fn.body:
        return None
    inner = [n for stmt in fn.body for n in ast.walk(stmt)]
    if any(isinstance(n, (ast.Yield, ast.YieldFrom)) or (isinstance(n, ast.Return) and n.value) for n in inner):
        return None
    if fn.body[0].lineno == fn.lineno:  # `def f(): ...` on one line
        return None
    return with_body(source, fn, ["pass"])


def verify_inlined(
    repo: Path, caller: Hypothesis, c: Hypothesis, now: str, old: str, repro: Reproduction, prober: Prober
) -> bool:
    """The caller's restore took c's call off the path, and c (changed or created by the same commit)
    computes what the caller computed inline before it. With the caller as it is now and c's body
    made that old inline code, does the divergence vanish? Then c's own change carries it and c is
    verified; if not, the caller's own change does (the move was faithful) and the caller keeps it."""
    if c.file != caller.file or c.commit != caller.commit or not c.commit:
        return False
    faithful = []

    def moved_back(text: str) -> list[tuple[str, str]]:
        version = inline_version(text, now, old, c.function)
        if version is not None and same_def(version, text):
            faithful.append(version)
        return [("its caller's old inline code", version)] if version is not None and not faithful else []

    outcome = try_edits(repo, c, repro, prober, moved_back, 1)
    if outcome.verified:
        how = (
            f"its body replaced by the code {caller.function} computed it with before {c.commit[:10]} "
            f"({caller.function} kept as it is now) removes the divergence"
        )
        mark_verified(c, "restore", how, outcome.diff)
    elif faithful:
        c.evidence.append(
            f"its body is the code {caller.function} computed it with before {c.commit[:10]}: a faithful move"
        )
    elif outcome.probes:
        c.evidence.append(
            f"its body replaced by the code {caller.function} computed it with before {c.commit[:10]} "
            "leaves the divergence: the caller's own change carries it"
        )
    return outcome.verified


def passthrough_version(source: str) -> str | None:
    """`source` (one def) reduced to its do-nothing path: where every one of its own `return`s that
    gives back nothing but its parameters (`return q, k, meta`) returns the same ones, the body becomes
    that return (docstring kept); else None. The function itself says that handing its inputs back
    unchanged is a valid outcome, which is what its callers had before it existed."""
    fn = function_node(source)
    if fn is None or not fn.body or fn.body[0].lineno == fn.lineno:
        return None
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    identities = {
        ast.unparse(r.value) for r in _own_returns(fn) if r.value is not None and _only_names(r.value, params)
    }
    if len(identities) != 1:
        return None
    version = with_body(source, fn, [f"return {identities.pop()}"])
    return None if same_def(version, source) else version  # already nothing but that path


def _own_returns(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Return]:
    """The `return` statements of fn itself, not of functions or classes nested in it."""
    out: list[ast.Return] = []
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            out.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _only_names(value: ast.expr, names: set[str]) -> bool:
    items = value.elts if isinstance(value, ast.Tuple) else [value]
    return bool(items) and all(isinstance(x, ast.Name) and x.id in names for x in items)


def withdraw(caller: Hypothesis, callee: Hypothesis, relation: str) -> None:
    """The caller's verification is withdrawn in favour of the callee: verified on its own edit, or
    breaking its contract on its own inputs."""
    caller.verified, caller.verified_by, caller.verifying_diff = False, None, ""
    caller.score -= WEIGHTS["verified"]
    caller.evidence = [e for e in caller.evidence if not e.startswith("verified: ")]
    why = "which breaks its contract on its own inputs" if breaks_contract(callee) else "whose own edit removes it"
    if relation.startswith("only"):
        why = "so the restore takes the callee's code off the path"
    if relation.startswith("is rewritten"):
        why = "and the restore takes that callee's new code off the path with it"
    caller.evidence.insert(
        0,
        f"an edit of it removes the divergence, but it {relation} {callee.function}, {why}: "
        "credited to the callee, where the fault is",
    )
    callee.evidence.append(
        f"its caller {caller.function} verifies by an edit that avoids this function; the fault is credited here"
    )


def call_names(source: str) -> list[tuple[str, str]]:
    """(called name, call text) for every call in a function's source: `self.f(x)` is named `f`."""
    fn = parse_function(source) if source else None
    if fn is None:
        return []
    out = []
    for node in fn.walk("call"):
        func = node.child_by_field_name("function")
        if func is None:
            continue
        name = func.child_by_field_name("attribute") if func.type == "attribute" else func
        if name is not None and name.type == "identifier":
            out.append((fn.text(name), fn.text(node)))
    for node in fn.walk("attribute"):  # a property is used without a call: `cfg.attn_scale`
        name = node.child_by_field_name("attribute")
        if name is not None and node.parent is not None and node.parent.type != "call":
            out.append((fn.text(name), fn.text(node)))
    return out


def touched_calls(before: str, after: str) -> set[str]:
    """Names whose calls the edit before -> after removed or changed (a call text no longer there)."""
    remaining = Counter(text for _, text in call_names(after))
    touched = set()
    for name, text in call_names(before):
        if remaining[text]:
            remaining[text] -= 1
        else:
            touched.add(name)
    return touched


def reachable_calls(repo: Path, source: str, depth: int = 2) -> set[str]:
    """Names called by `source` and by the functions of the tree it calls, `depth` levels down."""
    index = open_index(repo, include_tests=False)
    names = {name for name, _ in call_names(source)}
    frontier = set(names)
    for _ in range(depth - 1):
        called = {c for n in frontier for sym in index.find(n) if sym.kind != "class" for c in index.callees(sym)}
        frontier = called - names
        names |= called
    return names


def short_name(qualname: str) -> str:
    return qualname.rsplit(".", 1)[-1]


def diverges(repro: Reproduction) -> bool:
    return bool(repro.reproduced and repro.probe is not None and repro.probe.diverged)


def try_edits(repo: Path, h: Hypothesis, repro: Reproduction, prober: Prober, propose, limit: int) -> FixOutcome:
    """Apply each proposed version of h's function (one at a time) in a worktree of HEAD and re-probe."""
    if not h.file.endswith(".py") or limit <= 0 or not diverges(repro):
        return FixOutcome(False, 0)
    try:
        with scratch_worktree(repo, "HEAD") as tree:
            current = function_text(tree, h.file, h.function)
            if current is None:
                return FixOutcome(False, 0, failed=f"{h.function} not found in {h.file}")
            probes = 0
            for description, new in propose(current)[:limit]:
                probes += 1
                if fixed_by(tree, h, new, repro, prober):
                    return FixOutcome(True, probes, description, function_diff(h.file, current, new), "", current, new)
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
    return _definition_text(file, path.read_bytes(), qualname) if path.exists() else None


def function_text_at(repo: Path, ref: str, file: str, qualname: str) -> str | None:
    """function_text of a checkout of `ref`, read from the commit's blob instead of a checkout."""
    blob = next((data for _, data in tree_files(repo, ref, (), frozenset({file}))), None)
    return _definition_text(file, blob, qualname) if blob is not None else None


def _definition_text(file: str, data: bytes, qualname: str) -> str | None:
    symbol = definition(file, data, qualname)
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
        with scratch_worktree(repo, "HEAD") as tree:
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
