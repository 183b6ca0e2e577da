"""The second held-out set of hard cases (benchmark/authoring/tinyserve_hard_heldout.py): wide culprits,
inserted commits on both sides of the culprit, issue prose that names no fault, a spread of categories."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmark.authoring.tinyserve_hard_heldout import CASES
from benchmark.authoring.tinyserve_stream import stream
from benchmark.build import build_case_repo, read_commit_map
from benchmark.cases import BUNDLED_CASES_DIR, load_case, load_truth
from tests.benchmark.test_hard_upstream_cases import changed_functions

IDS = [spec.id for spec in CASES]


def test_set_is_ten_cases_over_seven_categories_with_fresh_numbers():
    assert len(CASES) == 10 and len({c.category for c in CASES}) >= 7
    assert sorted(c.issue_number for c in CASES) == list(range(2034, 2044))
    assert all(c.track == "hard" and c.modeled_on for c in CASES)


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
    assert case.scenario.good_ref == "v0.2.0"
