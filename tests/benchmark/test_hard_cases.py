"""Hard-track cases: release tags inside a patch history ([tags]), history shape, re-runnable authoring."""

from __future__ import annotations

import filecmp
import tomllib
from pathlib import Path

import pytest
import tomli_w

from benchmark.build import build_case_repo, git, read_commit_map
from benchmark.cases import BUNDLED_CASES_DIR, CaseError, load_case, load_truth

HARD = sorted(
    p.parent for p in BUNDLED_CASES_DIR.glob("*/case.toml") if tomllib.loads(p.read_text()).get("track") == "hard"
)


def _add_tags(folder: Path, tags: dict) -> None:
    meta = tomllib.loads((folder / "case.toml").read_text())
    (folder / "case.toml").write_text(tomli_w.dumps({**meta, "tags": tags}))


def test_hard_case_repo_has_release_tags_and_a_long_history(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFDX_CACHE", str(tmp_path / "cache"))
    case = load_case(BUNDLED_CASES_DIR / "ts-hard-topk-batch-max")
    repo = build_case_repo(case, tmp_path / "repo")
    assert int(git(repo, "rev-list", "--count", "base..HEAD")) >= 30
    for tag, stem in case.tags:
        assert git(repo, "rev-parse", f"{tag}^{{commit}}") == read_commit_map(repo)["patches"][stem]["sha"]
        assert git(repo, "log", "-1", "--format=%s", tag) == f"Release {tag}"
    good = case.scenario.good_ref
    assert good in dict(case.tags)
    assert int(git(repo, "rev-list", "--count", f"{good}..HEAD")) >= 20
    culprit = read_commit_map(repo)["patches"][load_truth(case).commit]["sha"]
    git(repo, "merge-base", "--is-ancestor", good, culprit)  # raises unless the release predates the culprit


def test_tags_are_built_on_the_named_patch(make_case, tmp_path):
    folder = make_case("tagged", 901, ["docs", "bug", "mixer"])
    _add_tags(folder, {"v0.4": "01-document-shift"})
    repo = build_case_repo(folder, tmp_path / "repo")
    assert git(repo, "rev-parse", "v0.4^{commit}") == read_commit_map(repo)["patches"]["01-document-shift"]["sha"]
    assert git(repo, "rev-parse", "base") != git(repo, "rev-parse", "v0.4^{commit}")


@pytest.mark.parametrize(
    "tags, message",
    [
        ({"v0.4": "07-no-such-patch"}, "names no patch"),
        ({"base": "01-document-shift"}, "cannot be a tag name"),
        ({"bad..name": "01-document-shift"}, "cannot be a tag name"),
    ],
)
def test_bad_tags_are_case_errors(make_case, tags, message):
    folder = make_case("badtag", 902, ["docs", "bug"])
    _add_tags(folder, tags)
    with pytest.raises(CaseError, match=message):
        load_case(folder)


# the release tags each subject's shared commit stream carries
RELEASE_TAGS = {"tinyserve": {"v0.2.0", "v0.3.0", "v0.4.0"}, "llama.cpp": {"b7010", "b7024", "b7041"}}


def test_hard_track_shape():
    """Every hard case: 30+ commits, release tags, a good_ref (when given) that is a tag 20+ commits back."""
    assert len(HARD) >= 15
    categories = set()
    for folder in HARD:
        case = load_case(folder)
        stems = case.patch_stems()
        categories.add(case.category)
        assert len(stems) >= 30, case.id
        assert {t for t, _ in case.tags} >= RELEASE_TAGS.get(case.subject, set()) and case.tags, case.id
        truth = load_truth(case)
        assert truth.commit in stems, case.id
        if case.scenario.good_ref:
            tagged = dict(case.tags)[case.scenario.good_ref]
            assert len(stems) - stems.index(tagged) - 1 >= 20, case.id
            assert stems.index(tagged) < stems.index(truth.commit), case.id
    assert len(categories) >= 6


@pytest.mark.slow
def test_authoring_regenerates_the_hard_cases_byte_for_byte(tmp_path):
    from benchmark.authoring.tinyserve_hard import CASES

    for spec in CASES:
        out = spec.write(tmp_path)
        bundled = BUNDLED_CASES_DIR / spec.id
        names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        assert names == sorted(p.relative_to(bundled).as_posix() for p in bundled.rglob("*") if p.is_file())
        _, mismatch, errors = filecmp.cmpfiles(out, bundled, names, shallow=False)
        assert not mismatch and not errors, (spec.id, mismatch, errors)
