"""Prove that benchmark cases are what they claim (docs/design.md §6).

    python -m benchmark.validate [--cases-dir DIR] [CASE ...] [--oracle module:function]

For each case: the folder is well-formed; the patches apply; the truth function exists
in the truth file at HEAD; HEAD diverges under the stated scenario; `good_ref` (default
`base`) agrees with the reference; the truth commit is the first bad one (its parent
agrees, it diverges). A bug present since base (truth without a commit) must diverge at
`base` already and name no good_ref.

"Agrees / diverges" is the oracle's call: by default `tools.probe.prober.probe(scenario,
target_source, reference_source=None)` returning an object with `.diverged` and `.summary`;
any callable with that signature can stand in (`--oracle module:function`).

Exit status (tools/errors.py): 0 every case ok, 1 some case failed a check, 2 bad input
(unknown case, oracle that cannot be imported).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.build import BuildError, build_case_repo, git, read_commit_map
from benchmark.cases import (
    BUNDLED_CASES_DIR,
    Case,
    CaseError,
    Truth,
    case_folders,
    check_issue_numbers,
    load_case,
    load_truth,
)
from tools import progress
from tools.errors import EPILOG, BadInput, run_cli
from tools.history.gitrepo import GitError
from tools.scenario import Scenario

Oracle = Callable[[Scenario, Path | None, Path | None], Any]  # -> .diverged: bool, .summary: str
DEFAULT_ORACLE = "tools.probe.prober:probe"


class ValidationError(Exception):
    """A case that fails a check; the message says which and why."""


@dataclass(frozen=True)
class Check:
    label: str  # how the failure message names the revision
    rev: str  # a git revision in the built repo
    diverges: bool  # what the oracle must say there


@dataclass(frozen=True)
class Verdict:
    case: str
    ok: bool
    reason: str = ""
    probes: int = 0

    def line(self) -> str:
        return f"ok   {self.case} ({self.probes} probes)" if self.ok else f"FAIL {self.case}: {self.reason}"


def load_oracle(spec: str = DEFAULT_ORACLE) -> Oracle:
    module, _, func = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ValidationError(
            f"oracle {spec!r} is not available ({e}); pass another with --oracle module:function"
        ) from None


def validate_case(case: Case | str | Path, oracle: Oracle) -> Verdict:
    """One case -> ok, or the first thing wrong with it."""
    name = case.id if isinstance(case, Case) else Path(case).name
    try:
        case = case if isinstance(case, Case) else load_case(case)
        truth = load_truth(case)
        with tempfile.TemporaryDirectory(prefix=f"diffdx-validate-{case.id}-") as tmp:
            repo = build_case_repo(case, Path(tmp) / "repo")
            check_truth_function(repo, truth)
            checks = plan_checks(case, truth, repo)
            probes = run_checks(case, repo, checks, oracle, Path(tmp))
    except (CaseError, BuildError, ValidationError) as e:
        return Verdict(name, False, str(e).removeprefix(f"case {name}: "))
    return Verdict(case.id, True, probes=probes)


def plan_checks(case: Case, truth: Truth, repo: Path) -> list[Check]:
    """What must diverge and what must agree, cheapest-to-fail first."""
    checks = [Check("HEAD", "HEAD", True)]
    good_ref = case.scenario.good_ref
    if truth.commit is None:
        if good_ref:
            raise ValidationError(
                f"truth.toml names no commit (bug present since base) but repro.toml has good_ref {good_ref!r}"
            )
        return checks + [Check("base (bug present since base)", "base", True)]
    sha = read_commit_map(repo)["patches"][truth.commit]["sha"]
    checks += [
        Check(f"truth commit {truth.commit}", sha, True),
        Check(f"the commit before truth commit {truth.commit} (truth is not the first bad commit)", f"{sha}^", False),
        Check(f"good_ref {good_ref or 'base'!r}", good_ref or "base", False),
    ]
    return checks


def run_checks(case: Case, repo: Path, checks: list[Check], oracle: Oracle, tmp: Path) -> int:
    """Probe each distinct revision once; raise on the first verdict that contradicts a check."""
    seen: dict[str, Any] = {}
    head = resolve(repo, "HEAD", "HEAD")
    for check in checks:
        sha = resolve(repo, check.rev, check.label)
        if sha not in seen:
            source = repo if sha == head else worktree(repo, sha, tmp)
            try:
                seen[sha] = oracle(case.scenario, source, None)
            except Exception as e:
                raise ValidationError(f"probe failed at {check.label} ({sha[:10]}): {type(e).__name__}: {e}") from None
        result = seen[sha]
        if bool(result.diverged) != check.diverges:
            want = "diverge" if check.diverges else "agree with the reference"
            raise ValidationError(f"{check.label} ({sha[:10]}) does not {want}: {result.summary}")
    return len(seen)


def resolve(repo: Path, rev: str, label: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}")
    except GitError:
        raise ValidationError(f"{label}: revision {rev!r} does not resolve in the built repo") from None


def worktree(repo: Path, sha: str, tmp: Path) -> Path:
    path = tmp / f"wt-{sha[:12]}"
    git(repo, "worktree", "add", "-q", "--detach", str(path), sha)
    return path


def check_truth_function(repo: Path, truth: Truth) -> None:
    """The truth function is defined in the truth file at HEAD."""
    path = repo / truth.file
    if not path.is_file():
        raise ValidationError(f"truth file {truth.file} does not exist at HEAD")
    if truth.function not in defined_names(path, truth.file):
        raise ValidationError(f"truth function {truth.function} is not defined in {truth.file} at HEAD")


def defined_names(path: Path, rel: str) -> set[str]:
    """Qualified names defined in a file: `ast` for Python, the tree-sitter index for C++/CUDA."""
    if path.suffix == ".py":
        try:
            return qualified_names(ast.parse(path.read_text(errors="replace")))
        except SyntaxError as e:
            raise ValidationError(f"truth file {rel} does not parse at HEAD: {e}") from None
    from tools.source import index as source

    language = source.LANGUAGES.get(path.suffix)
    if language is None:
        raise ValidationError(f"truth file {rel}: no parser for {path.suffix!r} files")
    symbols, _calls = source.parse_file(rel, path.read_bytes(), language)
    return {s.qualname for s in symbols}


def qualified_names(tree: ast.AST, prefix: str = "") -> set[str]:
    """Every class/function in a module as Class.method / outer.inner."""
    names = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            names |= {name} | qualified_names(node, f"{name}.")
        else:
            names |= qualified_names(node, prefix)  # defs under if/try/with blocks
    return names


def duplicate_issue_numbers(folders: list[Path], verdicts: list[Verdict], cases_dir: Path) -> list[Verdict]:
    """Cases that are fine alone but share an issue number with another case."""
    loaded = [load_case(f) for f, v in zip(folders, verdicts) if v.ok]
    try:
        check_issue_numbers(loaded, cases_dir)
    except CaseError as e:
        bad = str(e).split(":")[0].removeprefix("case ")
        return [Verdict(bad, False, str(e).removeprefix(f"case {bad}: "))]
    return []


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmark.validate", description="Prove benchmark cases.", epilog=EPILOG
    )
    ap.add_argument("cases", nargs="*", help="case ids or folders (default: every case in --cases-dir)")
    ap.add_argument("--cases-dir", type=Path, help="folder of cases (default: the bundled ones)")
    ap.add_argument("--oracle", default=DEFAULT_ORACLE, help=f"module:function (default {DEFAULT_ORACLE})")
    ap.add_argument("--quiet", action="store_true", help="no live status line on stderr")
    args = ap.parse_args(argv)
    cases_dir = (args.cases_dir or BUNDLED_CASES_DIR).resolve()
    try:
        oracle = load_oracle(args.oracle)
        folders = [_folder(cases_dir, c) for c in args.cases] or case_folders(cases_dir)
    except (ValidationError, CaseError) as e:
        raise BadInput(str(e)) from None
    verdicts = []
    with progress.live(quiet=args.quiet):
        for folder in progress.each(folders, "validating cases", lambda f: f.name):
            verdicts.append(validate_case(folder, oracle))
            print(verdicts[-1].line(), flush=True)
    for v in duplicate_issue_numbers(folders, verdicts, cases_dir):
        print(v.line(), flush=True)
        verdicts = [v if old.case == v.case else old for old in verdicts]
    failed = sum(not v.ok for v in verdicts)
    print(f"{len(verdicts) - failed}/{len(verdicts)} cases ok")
    return 1 if failed else 0


def _folder(cases_dir: Path, case: str) -> Path:
    for candidate in (cases_dir / case, Path(case)):
        if candidate.is_dir():
            return candidate.resolve()
    raise CaseError(f"unknown case {case!r}: no folder {cases_dir / case}")


if __name__ == "__main__":
    sys.exit(main())
