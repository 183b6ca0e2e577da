"""benchmark.compare on real benchmark.run output folders: the same agent twice, then an agent that ranks differently."""

from __future__ import annotations

from pathlib import Path

from benchmark.cases import CaseInput
from benchmark.compare import load_run, main
from benchmark.run import main as run_main
from tests.benchmark.test_run import newest_change_agent


def oldest_change_agent(case: CaseInput, out_dir: Path, config) -> dict:
    """The newest-change agent's suspects in reverse order: a change that moves ranks."""
    report = newest_change_agent(case, out_dir, config)
    report["hypotheses"] = [{**h, "rank": i + 1} for i, h in enumerate(reversed(report["hypotheses"]))]
    return report


def _run(cases: Path, out: Path, agent: str) -> Path:
    assert run_main(["--cases-dir", str(cases), "--agent", agent, "--quiet", "--out", str(out)]) == 0
    return out


def test_same_agent_moves_nothing_and_a_reordering_agent_is_reported(three_cases, tmp_path, capsys):
    newest = "tests.benchmark.test_run:newest_change_agent"
    old, again = _run(three_cases, tmp_path / "old", newest), _run(three_cases, tmp_path / "again", newest)
    moved = _run(three_cases, tmp_path / "moved", "tests.benchmark.test_compare:oldest_change_agent")
    capsys.readouterr()

    assert main([str(old), str(again), "--md", str(tmp_path / "cmp.md")]) == 0
    text = capsys.readouterr().out
    assert "3 cases in both runs; 3 with the same rank and top 5, 0 moved." in text
    assert (tmp_path / "cmp.md").read_text() == text

    assert main([str(old), str(moved)]) == 1
    text = capsys.readouterr().out
    ranks_new = {case: r.rank for case, r in load_run(moved).items()}
    assert load_run(old)["bug-newest"].rank == 1 and ranks_new["bug-newest"] != 1
    assert f"| bug-newest | 1 | {ranks_new['bug-newest'] or '–'} | no | truth rank 1 -> " in text
    # the errored case (no Python change to blame) errs in both runs: nothing moved there
    assert "| docs-only | – | – | yes | – |" in text


def test_a_folder_that_is_not_a_run_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "results.json").write_text("{not json")
    assert main([str(tmp_path / "missing"), str(tmp_path / "half")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no results.json" in err
