"""The runner end to end: 3 cases, 2 worker processes, a small real agent, real scoring."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import RunConfig
from benchmark.cases import CaseInput
from benchmark.run import AgentLookupError, main, resolve_agent

ROOT = Path(__file__).resolve().parents[2]
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.M)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def _functions_at(source: str, lines: set[int]) -> list[str]:
    """Innermost def/class enclosing any changed line, as qualified names in source order."""
    found: list[str] = []

    def walk(node: ast.AST, prefix: str) -> bool:
        hit = False
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
                child.lineno <= n <= child.end_lineno for n in lines
            ):
                if not walk(child, f"{prefix}{child.name}."):
                    found.append(f"{prefix}{child.name}")
                hit = True
        return hit

    walk(ast.parse(source), "")
    return found


def newest_change_agent(case: CaseInput, out_dir: Path, config: RunConfig) -> dict:
    """Blame the history: functions changed by the newest commit first, then older ones."""
    hypotheses = []
    for sha in _git(case.repo, "log", "--format=%H", "base..HEAD").split():
        for path in _git(case.repo, "show", "--format=", "--name-only", sha).split():
            if not path.endswith(".py"):
                continue
            lines = {
                int(m[0]) + i
                for m in HUNK.findall(_git(case.repo, "show", "-U0", "--format=", sha, "--", path))
                for i in range(int(m[1] or 1) or 1)
            }
            for function in _functions_at(_git(case.repo, "show", f"{sha}:{path}"), lines):
                hypotheses.append({"rank": len(hypotheses) + 1, "file": path, "function": function, "commit": sha})
    if not hypotheses:
        raise RuntimeError("no Python function changed since base")
    (out_dir / "report.md").write_text(f"# Issue {case.issue_number}\n\nTop: {hypotheses[0]['function']}\n")
    newest = hypotheses[0]["commit"]
    return {
        "issue": str(case.issue_number),
        "reproduced": True,
        "hypotheses": hypotheses[:5],
        "commit": {"sha": newest, "subject": _git(case.repo, "log", "-1", "--format=%s", newest).strip()},
        "cost": {"engine_runs": 2, "llm_calls": 0, "tokens_in": 0, "tokens_out": 0},
        "budget_seen": config.max_engine_runs,  # the config benchmark.run passed down
    }


DYING_ISSUE = 504


def dies_on_one_case(case: CaseInput, out_dir: Path, config: RunConfig) -> dict:
    """newest_change_agent, except that on issue 504 the worker process exits half-way through, as
    one killed by the OOM killer or a segfaulting extension would: no exception, no report."""
    if case.issue_number == DYING_ISSUE:
        (out_dir / "started").write_text("the worker got this far\n")
        os._exit(17)
    return newest_change_agent(case, out_dir, config)


def test_a_dying_local_worker_is_its_case_s_error_and_the_others_are_scored(make_case, cases_dir, tmp_path):
    """A worker process that exits mid-case breaks the local pool: the cases it took down with it
    are run again, and only the dying one is reported, as an error (not every case still pending)."""
    make_case("bug-not-newest", 501, ["docs", "bug", "mixer"], category="numerics")
    make_case("bug-newest", 502, ["docs", "bug"], category="kv-cache")
    make_case("worker-dies", DYING_ISSUE, ["docs", "bug"], category="numerics")
    out = tmp_path / "local"
    agent = "tests.benchmark.test_run:dies_on_one_case"
    assert main(["--cases-dir", str(cases_dir), "--agent", agent, "--workers", "2", "--quiet", "--out", str(out)]) == 0
    by_case = {c["case"]: c for c in json.loads((out / "results.json").read_text())["cases"]}
    assert {k: (v["rank"], v["errors"]) for k, v in by_case.items()} == {
        "bug-newest": (1, 0), "bug-not-newest": (2, 0), "worker-dies": (None, 1),
    }  # fmt: skip
    dead = json.loads((out / "worker-dies" / "report.json").read_text())
    assert dead["hypotheses"] == [] and dead["error"].startswith("worker died: BrokenProcessPool")


def test_runner_end_to_end_with_two_workers(three_cases, tmp_path):
    out = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "benchmark.run",
        "--cases-dir",
        str(three_cases),
        "--workers",
        "2",
        "--agent",
        "tests.benchmark.test_run:newest_change_agent",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    by_case = {c["case"]: c for c in results["cases"]}
    assert {k: v["rank"] for k, v in by_case.items()} == {"bug-not-newest": 2, "bug-newest": 1, "docs-only": None}
    assert by_case["bug-newest"]["commit"] == 1.0 and by_case["bug-not-newest"]["commit"] == 0.0
    assert by_case["docs-only"]["commit"] is None and by_case["docs-only"]["errors"] == 1
    overall = results["overall"]
    assert (overall["pass_at_1"], overall["pass_at_5"], overall["commit_acc"]) == (
        pytest.approx(1 / 3),
        pytest.approx(2 / 3),
        0.5,
    )
    assert overall["component_acc"] == pytest.approx(2 / 3) and overall["engine_runs"] == pytest.approx(4 / 3)
    assert results["by_category"]["kv-cache"]["pass_at_1"] == 0.5
    assert list(results["by_track"]) == ["easy"] and results["by_track"]["easy"]["cases"] == 3
    crashed = json.loads((out / "docs-only" / "report.json").read_text())
    assert crashed["hypotheses"] == [] and "no Python function changed" in crashed["error"]
    assert (out / "bug-newest" / "report.md").is_file()
    report = json.loads((out / "bug-newest" / "report.json").read_text())
    assert report["issue"] == "502" and report["cost"]["wall_s"] > 0
    assert report["cost"]["cpu_s"] > 0, "the diagnosis's CPU: at least its git calls"
    assert results["cpu"]["total_s"] == pytest.approx(sum(c["cpu_s"] for c in results["cases"]), abs=0.2)
    table = (out / "results.md").read_text()
    assert "CPU s total / per case: " in table and "| wall s | CPU s |" in table
    assert "| **overall** | 3 | 0.33 | 0.33 | 0.67 | 0.67 | 0.50 |" in table and "| kv-cache | 2 |" in table
    assert "| track | cases |" in table and "| easy | 3 | 0.33 | 0.33 | 0.67 |" in table
    assert (out / "results_by_category.png").read_bytes()[:4] == b"\x89PNG"
    args = json.loads((out / "args.json").read_text())
    assert args["workers"] == 2 and args["case_ids"] == ["bug-newest", "bug-not-newest", "docs-only"]


def test_samples_write_one_report_per_sample(three_cases, tmp_path, monkeypatch):
    """Also the diagnosis's config: budgets on the command line reach each diagnosis and args.json.

    Guards: benchmark.run diagnosed with fixed default budgets whatever its command line said, and
    the OpenAI key must never reach args.json."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-recorded")
    out = tmp_path / "sampled"
    assert (
        main(
            [
                "bug-newest",
                "--cases-dir",
                str(three_cases),
                "--samples",
                "2",
                "--workers",
                "2",
                "--agent",
                "tests.benchmark.test_run:newest_change_agent",
                "--max-engine-runs",
                "30",
                "--verify-top",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert sorted(p.parent.name for p in (out / "bug-newest" / "samples").glob("*/report.json")) == ["0", "1"]
    assert json.loads((out / "bug-newest" / "samples" / "1" / "report.json").read_text())["budget_seen"] == 30
    args = (out / "args.json").read_text()
    diagnosis = json.loads(args)["diagnosis"]
    assert (diagnosis["max_engine_runs"], diagnosis["verify_top"], diagnosis["llm"]) == (30, 2, "none")
    assert "sk-never-recorded" not in args
    results = json.loads((out / "results.json").read_text())
    assert results["cases"][0]["samples"] == 2 and results["cases"][0]["runs_pass_at"] == {"1": 1.0}
    assert (out / "bug-newest" / "report.json").is_file()


def test_agent_registry_is_lazy_and_lists_known_agents():
    assert resolve_agent("tests.benchmark.test_run:newest_change_agent") is newest_change_agent
    with pytest.raises(AgentLookupError, match=r"unknown agent 'magic'; known: full, output-only, bisect-only"):
        resolve_agent("magic")
    with pytest.raises(AgentLookupError, match=r"agent 'tests.benchmark.nope:agent' .* is not available: No module"):
        resolve_agent("tests.benchmark.nope:agent")


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed here")
def test_ray_without_ray_fails_with_an_install_hint(three_cases, tmp_path, capsys):
    assert main(["--cases-dir", str(three_cases), "--ray", "--out", str(tmp_path / "r")]) == 2
    assert "pip install ray" in capsys.readouterr().err
    assert not (tmp_path / "r").exists(), "nothing runs before the check"
