"""The authoring helper: edits as data -> patches -> the builder rebuilds the same history."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmark.authoring.patches import AuthoringError, Step, author_history, write_patches
from benchmark.build import build_case_repo, git
from tests.benchmark.conftest import STEPS


def test_round_trip_gives_the_same_tree_and_commits(make_case, tmp_path):
    authored = author_history("minisub", [STEPS[s] for s in ("docs", "bug", "mixer")], tmp_path / "authored")
    folder = make_case("round-trip", 201, ["docs", "bug", "mixer"])
    built = build_case_repo(folder, tmp_path / "built")
    assert git(built, "rev-parse", "HEAD^{tree}") == git(authored, "rev-parse", "HEAD^{tree}")
    assert git(built, "rev-parse", "HEAD") == git(authored, "rev-parse", "HEAD"), "same commits, dates and all"
    assert (
        git(built, "log", "-1", "--format=%B", "HEAD~2").strip() == "ops: document shift\n\nExplain the default offset."
    )


def test_patch_files_are_numbered_and_rewritten(make_case, cases_dir):
    folder = make_case("named", 202, ["docs", "bug", "mixer"])
    assert [p.name for p in sorted((folder / "commits").glob("*.patch"))] == [
        "01-document-shift.patch",
        "02-fold-scale.patch",
        "03-mixer-complement.patch",
    ]
    write_patches("minisub", [STEPS["bug"]], folder)  # stale patches must not survive a rewrite
    assert [p.name for p in (folder / "commits").glob("*.patch")] == ["01-fold-scale.patch"]


def test_callable_edits_create_and_delete_files(subject_root, tmp_path):
    def add_kernel(root: Path) -> None:
        (root / "minisub" / "kernels.py").write_text("def fused_scale(x):\n    return x + x\n")

    steps = [
        Step("kernels: add fused scale", "Di Wu <di@example.com>", "2025-04-01T00:00:00+00:00", add_kernel),
        Step(
            "Drop the README",
            "Di Wu <di@example.com>",
            "2025-04-02T00:00:00+00:00",
            [("README.md", None, None), ("NOTES.md", None, "notes\n")],
        ),
    ]
    repo = author_history("minisub", steps, tmp_path / "repo")
    assert git(repo, "show", "--name-status", "--format=", "HEAD").split() == ["A", "NOTES.md", "D", "README.md"]
    assert git(repo, "log", "-1", "--format=%s", "HEAD~1") == "kernels: add fused scale"
    assert write_patches("minisub", steps, tmp_path / "case")[0].name == "01-kernels-add-fused-scale.patch"


@pytest.mark.parametrize("old, found", [("    return x * 5\n", 0), ("    return x ", 2)])
def test_replacement_must_match_exactly_once(subject_root, tmp_path, old, found):
    step = Step("Edit", "Di Wu <di@example.com>", "2025-04-01T00:00:00+00:00", [("minisub/ops.py", old, "x")])
    with pytest.raises(
        AuthoringError,
        match=rf"step 1 \('Edit'\): minisub/ops.py: old_text must occur exactly once, found {found} times",
    ):
        author_history("minisub", [step], tmp_path / "repo")


def test_steps_that_change_nothing_or_bad_identities_fail(subject_root, tmp_path):
    noop = Step("Nothing", "Di Wu <di@example.com>", "2025-04-01T00:00:00+00:00", lambda root: None)
    with pytest.raises(AuthoringError, match="the edits change nothing"):
        author_history("minisub", [noop], tmp_path / "repo")
    with pytest.raises(ValueError, match="is not 'Name <email>'"):
        Step("x", "Di Wu", "2025-04-01T00:00:00+00:00", [])
    with pytest.raises(AuthoringError, match="does not exist"):
        author_history(
            "minisub",
            [Step("x", "Di Wu <d@e.com>", "2025-04-01T00:00:00+00:00", [("nope.py", "a", "b")])],
            tmp_path / "repo2",
        )


def test_shared_clones_write_the_same_patches(subject_root, tmp_path):
    """`benchmark.author --check` replays every case of a subject in one clone reset between cases
    (shared_clones): a case that adds a file, then cases after it, give byte-identical patches."""
    from benchmark.authoring.patches import shared_clones

    def add_kernel(root: Path) -> None:
        (root / "minisub" / "kernels.py").write_text("def fused_scale(x):\n    return x + x\n")

    kernel = Step("kernels: add fused scale", "Di Wu <di@example.com>", "2025-04-01T00:00:00+00:00", add_kernel)
    histories = {"kernel": [kernel, STEPS["bug"]], "docs": [STEPS["docs"], STEPS["mixer"]], "again": [kernel]}
    fresh = {name: write_patches("minisub", steps, tmp_path / "fresh" / name) for name, steps in histories.items()}
    with shared_clones():
        shared = {
            name: write_patches("minisub", steps, tmp_path / "shared" / name) for name, steps in histories.items()
        }
    for name, patches in fresh.items():
        assert [p.read_bytes() for p in patches] == [p.read_bytes() for p in shared[name]], name
