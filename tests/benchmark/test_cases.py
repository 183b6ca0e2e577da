"""Case folders: loading, checks with clear messages, truth kept away from the diagnosing side."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
import tomli_w

from benchmark.build import build_case_repo, git
from benchmark.cases import BUNDLED_CASES_DIR, CaseError, CaseInput, case_input, load_case, load_cases, load_truth
from tests.benchmark.conftest import BUG_TRUTH


def test_loads_an_outside_case_folder(make_case, cases_dir):
    folder = make_case("outside", 301, ["docs", "bug"], category="kv-cache", good_ref="base")
    (case,) = load_cases(cases_dir)
    assert (case.id, case.issue_number, case.subject, case.category) == ("outside", 301, "minisub", "kv-cache")
    assert case.modeled_on == ("vllm-project/vllm#5639",)
    assert case.scenario.good_ref == "base" and case.scenario.target.engine == "minisub"
    assert case.patch_stems() == ["01-document-shift", "02-fold-scale"]
    assert load_cases(cases_dir, ["outside"]) == load_cases(cases_dir, [str(folder)]) == [case]
    truth = load_truth(case)
    assert (truth.file, truth.function, truth.commit, truth.component) == (
        "minisub/ops.py",
        "scale",
        "02-fold-scale",
        "ops",
    )


def test_bundled_cases_dir_is_the_default():
    assert BUNDLED_CASES_DIR.name == "cases" and BUNDLED_CASES_DIR.parent.name == "benchmark"


def test_truth_is_not_reachable_from_case_input(make_case, tmp_path):
    case = load_case(make_case("secret", 302, ["docs", "bug"]))
    repo = build_case_repo(case, tmp_path / "repo")
    given = case_input(case, repo)
    assert {f.name for f in dataclasses.fields(CaseInput)} == {
        "id",
        "issue_number",
        "subject",
        "title",
        "issue",
        "scenario",
        "repo",
    }
    assert str(case.dir) not in repr(given) and "mechanism" not in repr(given)
    history = git(repo, "log", "--all", "-p", "--format=%B")
    assert "stray constant" not in history and "truth" not in git(repo, "ls-files")
    assert not list(repo.rglob("*.patch"))


def _edit(folder, name, **changes):
    path = folder / name
    data = tomllib.loads(path.read_text())
    data.update(changes)
    path.write_text(tomli_w.dumps({k: v for k, v in data.items() if v is not None}))


@pytest.mark.parametrize(
    "file, changes, message",
    [
        ("case.toml", {"category": "vibes"}, r"case bad: case.toml: category 'vibes' is not one of numerics, "),
        ("case.toml", {"issue_number": "12"}, r"case bad: case.toml: key 'issue_number' must be int, got str"),
        ("case.toml", {"title": None}, r"case bad: case.toml: key 'title' is missing"),
        ("case.toml", {"id": "other"}, r"case bad: case.toml: id 'other' differs from the folder name 'bad'"),
        (
            "case.toml",
            {"subject": "vllm"},
            r"case bad: case.toml: subject 'vllm' is unknown; known: llama\.cpp, minisub, tinyserve",
        ),
        ("case.toml", {"extra": 1}, r"case bad: case.toml: unknown keys \['extra'\]"),
        ("repro.toml", {"target": {"engine": "minisub", "dtype": "float8"}}, r"case bad: repro.toml: dtype 'float8'"),
    ],
)
def test_malformed_case_toml_and_repro_name_the_key(make_case, file, changes, message):
    folder = make_case("bad", 303, ["docs"])
    _edit(folder, file, **changes)
    with pytest.raises(CaseError, match=message):
        load_case(folder)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"commit": "07-nope"},
            r"case bad: truth.toml: commit '07-nope' is not a patch stem or a later release tag; known: 01-document-shift",
        ),
        ({"function": "scale()"}, r"case bad: truth.toml: function 'scale\(\)' is not a qualified name"),
        ({"file": "../ops.py"}, r"case bad: truth.toml: file '../ops.py' must be a path inside the repo"),
        ({"mechanism": None}, r"case bad: truth.toml: key 'mechanism' is missing"),
    ],
)
def test_malformed_truth_names_the_key(make_case, changes, message):
    folder = make_case("bad", 304, ["docs"], truth={**BUG_TRUTH, "commit": "01-document-shift"})
    _edit(folder, "truth.toml", **changes)
    with pytest.raises(CaseError, match=message):
        load_truth(folder)


def test_missing_files_and_bad_patch_names(make_case):
    folder = make_case("bad", 305, ["docs"])
    (folder / "commits" / "01-document-shift.patch").rename(folder / "commits" / "first.patch")
    with pytest.raises(CaseError, match=r"case bad: commits/first.patch is not named NN-slug.patch"):
        load_case(folder)
    (folder / "commits" / "first.patch").unlink()
    with pytest.raises(CaseError, match=r"case bad: commits/ holds no NN-slug.patch file"):
        load_case(folder)
    (folder / "issue.md").unlink()
    with pytest.raises(CaseError, match=r"case bad: issue.md is missing"):
        load_case(folder)


def test_issue_numbers_are_unique_even_when_loading_one_case(make_case, cases_dir):
    make_case("first", 306, ["docs"])
    make_case("second", 306, ["bug"])
    with pytest.raises(CaseError, match=r"issue_number 306 is also used by case"):
        load_cases(cases_dir)
    with pytest.raises(CaseError, match=r"case first: issue_number 306 is also used by case second"):
        load_cases(cases_dir, ["first"])


def test_unknown_case_and_stray_folder(make_case, cases_dir):
    make_case("real", 307, ["docs"])
    with pytest.raises(CaseError, match=r"unknown case 'nope' in .*; known: real"):
        load_cases(cases_dir, ["nope"])
    (cases_dir / "notes").mkdir()
    with pytest.raises(CaseError, match=r"case notes: case.toml is missing"):
        load_cases(cases_dir)
