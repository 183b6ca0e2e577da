"""The hard cases modelled on upstream bugs (benchmark/authoring/tinyserve_hard_upstream.py): their culprit
commits are wide, their inserted commits sit on both sides of it, and their issue prose names no fault."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from benchmark.authoring.tinyserve_hard_heldout import CASES as HELDOUT_CASES
from benchmark.authoring.tinyserve_hard_heldout3 import CASES as HELDOUT3_CASES
from benchmark.authoring.tinyserve_hard_heldout4 import CASES as HELDOUT4_CASES
from benchmark.authoring.tinyserve_hard_heldout5 import CASES as HELDOUT5_CASES
from benchmark.authoring.tinyserve_hard_heldout5b import CASES as HELDOUT5B_CASES
from benchmark.authoring.tinyserve_hard_heldout6 import CASES as HELDOUT6_CASES
from benchmark.authoring.tinyserve_hard_heldout6b import CASES as HELDOUT6B_CASES
from benchmark.authoring.tinyserve_hard_upstream import CASES as UPSTREAM_CASES
from benchmark.authoring.tinyserve_stream import stream
from benchmark.build import build_case_repo, git, read_commit_map
from benchmark.cases import BUNDLED_CASES_DIR, load_case, load_truth

# the upstream set (2026-2033) and the held-out sets (2034-2043, 2201-2212, 2401-2412, 2601-2612, 2621-2626,
# 2801-2810, 2821-2830) share these checks
CASES = (
    UPSTREAM_CASES
    + HELDOUT_CASES
    + HELDOUT3_CASES
    + HELDOUT4_CASES
    + HELDOUT5_CASES
    + HELDOUT5B_CASES
    + HELDOUT6_CASES
    + HELDOUT6B_CASES
)
IDS = [spec.id for spec in CASES]


def enclosing(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function in a module's source."""
    spans = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    spans.append((child.lineno, child.end_lineno or child.lineno, name))
                walk(child, f"{name}.")

    walk(ast.parse(source), "")
    return spans


def changed_functions(repo: Path, sha: str) -> tuple[set[str], set[str]]:
    """A commit -> (files it changes, `file:function` of every function with a changed line, either side)."""
    files = set(git(repo, "diff", "--name-only", f"{sha}^", sha).split())
    functions = set()
    for file in files:
        hunks = re.findall(
            r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", git(repo, "diff", "-U0", f"{sha}^", sha, "--", file), re.M
        )
        for rev, (start, count) in ((f"{sha}^", (0, 1)), (sha, (2, 3))):
            if not file.endswith(".py") or not git(repo, "ls-tree", rev, "--", file):
                continue
            spans = enclosing(git(repo, "show", f"{rev}:{file}"))
            for hunk in hunks:
                first, n = int(hunk[start]), int(hunk[count] or 1)
                lines = range(first, first + n)
                functions |= {f"{file}:{name}" for a, b, name in spans if any(a <= line <= b for line in lines)}
    return files, functions


@pytest.mark.slow
@pytest.mark.parametrize("case_id", IDS)
def test_culprit_touches_several_functions_or_files(case_id, tmp_path):
    case = load_case(BUNDLED_CASES_DIR / case_id)
    repo = build_case_repo(case, tmp_path / "repo")
    sha = read_commit_map(repo)["patches"][load_truth(case).commit]["sha"]
    files, functions = changed_functions(repo, sha)
    assert len(files) >= 2 or len(functions) >= 3, (case_id, files, functions)


@pytest.mark.parametrize("spec", CASES, ids=IDS)
def test_case_commits_sit_on_both_sides_of_the_culprit(spec):
    shared = {c.message for c in stream()}
    own = [i for i, step in enumerate(spec.steps) if step.message not in shared]
    assert len(spec.steps) - len(stream()) == len(own) >= 3, spec.id
    assert min(own) < spec.bug_index - 1 < max(own), spec.id


@pytest.mark.parametrize("case_id", IDS)
def test_issue_names_neither_the_faulty_function_nor_its_file(case_id):
    case = load_case(BUNDLED_CASES_DIR / case_id)
    truth = load_truth(case)
    assert truth.function.split(".")[-1] not in case.issue
    assert Path(truth.file).name not in case.issue
