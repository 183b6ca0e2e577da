"""benchmark.run --ray on a real local Ray cluster: the same scores as the local workers, and a Ray
worker that dies in the middle of a case is that case's error, not a diagnosis, and the run goes on.

One Ray start for the whole module (about 20-30 s on the shared 2-core machine), so the cases run
in one `--ray` command: two that score like the local run, one whose worker exits mid-case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.run import main, ray_init_args
from tests.benchmark.test_run import DYING_ISSUE

ray = pytest.importorskip("ray")  # in the test extra; skipped only where someone installed without it

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ray_cases(make_case, cases_dir):
    make_case("bug-not-newest", 501, ["docs", "bug", "mixer"], category="numerics")
    make_case("bug-newest", 502, ["docs", "bug"], category="kv-cache")
    make_case("worker-dies", DYING_ISSUE, ["docs", "bug"], category="numerics")
    return cases_dir


def _scores(out: Path) -> dict:
    cases = json.loads((out / "results.json").read_text())["cases"]
    keys = ("rank", "pass_at_1", "pass_at_5", "component", "commit", "errors")
    return {c["case"]: {k: c[k] for k in keys} for c in cases}


def test_ray_run_scores_like_local_workers_and_a_dying_worker_is_an_error(ray_cases, tmp_path):
    agent = "tests.benchmark.test_run:dies_on_one_case"
    local = tmp_path / "local"
    assert (
        main(["bug-newest", "bug-not-newest", "--cases-dir", str(ray_cases), "--agent", agent, "--out", str(local)])
        == 0
    )
    on_ray = tmp_path / "ray"
    cmd = [sys.executable, "-m", "benchmark.run", "--cases-dir", str(ray_cases), "--agent", agent]
    cmd += ["--ray", "--workers", "2", "--quiet", "--out", str(on_ray)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)  # a local cluster, started and stopped by the command
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    scores = _scores(on_ray)
    assert {k: scores[k] for k in ("bug-newest", "bug-not-newest")} == _scores(local)
    assert scores["bug-newest"]["rank"] == 1 and scores["bug-not-newest"]["rank"] == 2
    assert scores["worker-dies"] == {
        "rank": None, "pass_at_1": 0.0, "pass_at_5": 0.0, "component": 0.0, "commit": None, "errors": 1,
    }  # fmt: skip
    dead = json.loads((on_ray / "worker-dies" / "report.json").read_text())
    assert dead["hypotheses"] == [] and dead["error"].startswith("worker died: WorkerCrashedError")
    assert (on_ray / "worker-dies" / "started").is_file()  # it died mid-case, not before starting
    assert json.loads((on_ray / "args.json").read_text())["ray"] is True


def test_ray_init_args_start_a_small_local_cluster_or_join_one():
    local = ray_init_args(2, None, {"PYTHONPATH": "/elsewhere"})
    assert (local["num_cpus"], local["include_dashboard"], local["object_store_memory"]) == (2, False, 100 * 2**20)
    assert local["runtime_env"]["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert local["runtime_env"]["env_vars"]["PYTHONPATH"].endswith(os.pathsep + "/elsewhere")
    joined = ray_init_args(2, None, {"RAY_ADDRESS": "10.0.0.7:6379"})
    assert joined["address"] == "10.0.0.7:6379" and "num_cpus" not in joined
    assert ray_init_args(2, "auto", {"RAY_ADDRESS": "10.0.0.7:6379"})["address"] == "auto"  # the flag wins
