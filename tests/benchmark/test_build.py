"""The builder: pristine snapshot tagged base (+ v<version>), patches applied with git am."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from benchmark.build import BuildError, build_case_repo, commit_map_path, git, main, pristine_repo, read_commit_map
from benchmark.subjects import SubjectError, get_subject
from tests.benchmark.conftest import BUG_TRUTH


def test_builds_the_stated_history(make_case, tmp_path):
    case = make_case("three-commits", 101, ["docs", "bug", "mixer"])
    repo = build_case_repo(case, tmp_path / "build" / "repo")
    log = git(repo, "log", "--format=%an <%ae>|%aI|%cI|%s").splitlines()
    assert [line.split("|")[3] for line in log] == [
        "mixer: name the complement weight",
        "ops: fold the scale factor into a constant",
        "ops: document shift",
        "Import snapshot",
    ]
    assert [line.split("|")[0] for line in log[:3]] == [
        "Cy Park <cy@example.com>",
        "Bo Li <bo@example.com>",
        "Ana Ruiz <ana@example.com>",
    ]
    assert all(line.split("|")[1] == line.split("|")[2] for line in log), "committer date = author date"
    assert log[1].split("|")[1] == "2025-03-03T12:30:00+02:00"
    assert sorted(git(repo, "tag").split()) == ["base", "v0.3"]
    assert git(repo, "rev-parse", "base") == git(repo, "rev-parse", "HEAD~3") == git(repo, "rev-parse", "v0.3")
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git(repo, "remote") == "" and git(repo, "status", "--porcelain") == ""


def test_snapshot_skips_bytecode_and_keeps_other_files(make_case, tmp_path):
    repo = build_case_repo(make_case("files", 102, ["docs"]), tmp_path / "repo")
    assert git(repo, "ls-tree", "-r", "--name-only", "base").split() == [
        "README.md",
        "minisub/__init__.py",
        "minisub/ops.py",
    ]


def test_histories_are_deterministic(make_case, tmp_path, monkeypatch):
    case = make_case("same", 103, ["docs", "bug"])
    first = build_case_repo(case, tmp_path / "a" / "repo")
    monkeypatch.setenv("DIFFDX_CACHE", str(tmp_path / "other-cache"))  # a fresh pristine repo, too
    second = build_case_repo(case, tmp_path / "b" / "repo")
    assert git(first, "rev-parse", "HEAD") == git(second, "rev-parse", "HEAD")


def test_commit_map_lives_outside_the_repo(make_case, tmp_path):
    repo = build_case_repo(make_case("mapped", 104, ["docs", "bug"]), tmp_path / "repo")
    path = commit_map_path(repo)
    assert path.parent == repo.parent and path.is_file()
    commits = read_commit_map(repo)
    assert list(commits["patches"]) == ["01-document-shift", "02-fold-scale"]
    assert commits["patches"]["02-fold-scale"]["sha"] == git(repo, "rev-parse", "HEAD")
    assert commits["base"] == git(repo, "rev-parse", "base")
    assert "benchmark-commits" not in git(repo, "ls-files")


def test_patch_that_does_not_apply_names_case_and_patch(make_case, tmp_path):
    folder = make_case("stale", 105, ["docs", "bug"])
    patch = folder / "commits" / "02-fold-scale.patch"
    patch.write_text(patch.read_text().replace("-    return x * 2\n", "-    return x * 3\n"))
    with pytest.raises(BuildError, match=r"case stale: commits/02-fold-scale.patch does not apply"):
        build_case_repo(folder, tmp_path / "repo")


def test_patch_with_two_commits_is_rejected(make_case, tmp_path):
    folder = make_case("double", 106, ["docs", "bug"])
    first, second = sorted((folder / "commits").glob("*.patch"))
    first.write_text(first.read_text() + second.read_text())
    second.unlink()
    with pytest.raises(BuildError, match=r"01-document-shift.patch holds 2 commits"):
        build_case_repo(folder, tmp_path / "repo")


def test_pristine_repo_is_built_once(subject_root):
    subject = get_subject("minisub")
    first = pristine_repo(subject)
    stamp = first.stat().st_mtime_ns
    assert pristine_repo(subject) == first and first.stat().st_mtime_ns == stamp
    (subject_root / "minisub" / "ops.py").write_text("def scale(x):\n    return x\n")
    assert pristine_repo(get_subject("minisub")) != first, "a changed snapshot is a new pristine repo"


def test_unknown_subject_lists_known_ones(subject_root):
    with pytest.raises(SubjectError, match=r"unknown subject 'nope'.*minisub.*tinyserve.*transformers"):
        get_subject("nope")


def test_cli_builds_one_case(make_case, cases_dir, tmp_path, capsys):
    make_case("cli", 107, ["docs", "bug"])
    assert main(["cli", "--cases-dir", str(cases_dir), "--out", str(tmp_path / "inspect")]) == 0
    assert "built cli" in capsys.readouterr().out
    assert len(git(tmp_path / "inspect", "log", "--format=%H").split()) == 3
    assert main(["nope", "--cases-dir", str(cases_dir), "--out", str(tmp_path / "x")]) == 1
    assert "unknown case 'nope'" in capsys.readouterr().err


def test_transformers_subject_is_the_pinned_installed_package():
    subject = get_subject("transformers")
    assert (subject.version, subject.prefix, subject.source.name) == ("5.24.0", "transformers", "transformers")
    files = subject.files()
    assert Path("models/llama/modeling_llama.py") in files and len(files) > 2000
    assert not any("__pycache__" in f.parts or f.suffix == ".pyc" for f in files)


@pytest.mark.slow
def test_transformers_subject_builds_pinned_snapshot(tmp_path, monkeypatch):
    """Measured 3.5 s on idle cores but 11-14 s on the 2 shared ones (copy + first commit of
    ~2900 files): marked slow to keep the default suite under its 40 s budget."""
    monkeypatch.setenv("DIFFDX_CACHE", str(tmp_path / "cache"))
    started = time.monotonic()
    subject = get_subject("transformers")
    bare = pristine_repo(subject)
    repo = tmp_path / "hf"
    git(tmp_path, "clone", "-q", "--local", str(bare), str(repo))
    built_s = time.monotonic() - started
    assert sorted(git(repo, "tag").split()) == ["base", "v5.24.0"]
    files = git(repo, "ls-files").splitlines()
    assert "transformers/models/llama/modeling_llama.py" in files
    assert not any("__pycache__" in f for f in files)
    assert 'version__ = "5.24.0"' in (repo / "transformers" / "__init__.py").read_text()
    print(f"transformers pristine build + clone: {built_s:.1f}s, {len(files)} files")


def test_base_patch_is_folded_into_the_snapshot(make_case, tmp_path):
    folder = make_case("at-base", 106, ["bug", "docs"], truth={k: v for k, v in BUG_TRUTH.items() if k != "commit"})
    (folder / "commits" / "01-fold-scale.patch").rename(folder / "commits" / "00-base-fold-scale.patch")
    repo = build_case_repo(folder, tmp_path / "repo")
    assert git(repo, "log", "--format=%s|%an").splitlines() == [
        "ops: document shift|Ana Ruiz",
        "Import snapshot|diffdx maintainers",
    ]
    assert "return x * 2 + 1" in git(repo, "show", "base:minisub/ops.py")
    assert git(repo, "rev-parse", "base") == git(repo, "rev-parse", "v0.3") == git(repo, "rev-parse", "HEAD~1")
    assert list(read_commit_map(repo)["patches"]) == ["02-document-shift"]
