"""benchmark.perf's pure parts: splitting a diagnosis by stage, summarizing old vs new."""

from __future__ import annotations

import pytest

from benchmark.perf import stage_table, summarize, total_row


def run(end, wall, coverage=False):
    return {
        "end": end,
        "wall_s": wall,
        "startup_s": wall / 2,
        "engine_s": wall / 4,
        "save_s": 0.1,
        "load_s": 0.1,
        "coverage": coverage,
    }


def test_engine_runs_are_counted_in_the_stage_they_end_in():
    rows = stage_table(
        [("reproduce", 110.0), ("bisect", 130.0), ("hypothesize", 140.0)],
        [run(104, 4), run(109, 4), run(120, 8), run(139, 6, coverage=True)],
        started=100.0,
    )
    assert [(r["stage"], r["engine_runs"], r["coverage_runs"]) for r in rows] == [
        ("reproduce", 2, 0),
        ("bisect", 1, 0),
        ("hypothesize", 1, 1),
    ]
    assert rows[0]["wall_s"] == 10 and rows[0]["startup_s"] == 4 and rows[0]["in_process_s"] == 2
    total = total_row(rows)
    assert total["wall_s"] == 40 and total["engine_runs"] == 4 and total["runs_wall_s"] == 22


def test_summary_gives_medians_per_subject_and_checks_scores():
    rows = [
        {"case": c, "arm": a, "wall_s": w, "rank": 1, "error": False}
        for c, a, w in [
            ("ts-a", "old", 90),
            ("ts-a", "new", 30),
            ("ts-b", "old", 80),
            ("ts-b", "new", 20),
            ("tf-c", "old", 150),
            ("tf-c", "new", 60),
        ]
    ]
    s = summarize(rows)
    assert s["subjects"]["ts"] == {"old_median_s": 85.0, "new_median_s": 25.0, "ratio": pytest.approx(0.29)}
    assert s["subjects"]["tf"]["ratio"] == pytest.approx(0.4) and s["same_scores"]
    rows[1]["rank"] = 3
    assert not summarize(rows)["same_scores"]


def test_the_old_arm_runs_from_a_worktree_at_the_old_ref_removed_afterwards(tmp_path):
    from benchmark.perf import old_tree
    from tools.history.gitrepo import run_git

    repo = tmp_path / "repo"
    repo.mkdir()
    run_git(repo, "init", "-q")
    for text in ("old\n", "new\n"):
        (repo / "pipeline.py").write_text(text)
        run_git(repo, "add", "pipeline.py")
        run_git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", text.strip())
    with old_tree("HEAD~1", tmp_path / "out", repo) as tree:
        assert (tree / "pipeline.py").read_text() == "old\n" and (repo / "pipeline.py").read_text() == "new\n"
    assert not tree.exists() and str(tree) not in run_git(repo, "worktree", "list")
    with old_tree(None, tmp_path / "out", repo) as none:
        assert none is None
