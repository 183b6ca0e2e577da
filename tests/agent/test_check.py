"""`python -m agent.check` end to end: real worker processes on the bundled tinyserve and on a
faulty copy of it in a real git repo; JUnit read back by junitparser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import Failure, JUnitXml

from tests.faults_tinyserve import ATTN_SCALE, faulty_tree

ROOT = Path(__file__).resolve().parents[2]


def check(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "agent.check", "--quiet", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def matrix(tmp_path: Path, **axes) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in axes.items()))
    return path


def test_bug_free_tinyserve_passes_and_junit_reads_back(tmp_path):
    m = matrix(tmp_path, arch=["llama"], dtype=["bfloat16"], features=["all"], workload=["staggered"])
    out = tmp_path / "out"
    p = check("--engine", "tinyserve", "--matrix", str(m), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "1 cells: 1 agree" in p.stdout
    suite = next(iter(JUnitXml.fromfile(str(out / "junit.xml"))))
    assert (suite.tests, suite.failures, suite.errors) == (1, 0, 0)
    results = json.loads((out / "results.json").read_text())
    assert results["groups"] == []
    # one sampled request of 16 tokens: too few draws to test whether they follow the kept probabilities
    (cell,) = results["cells"]
    assert cell["draws"]["verdict"] == "undecided" and "undecided" in cell["summary"]


def test_faulty_tree_fails_its_cells_in_one_group_minimized(tmp_path):
    tree = faulty_tree(tmp_path / "tree", [(ATTN_SCALE, 1)])
    head = subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True).stdout
    m = matrix(tmp_path, arch=["llama"], dtype=["float32"], features=["none", "small_blocks"], workload=["staggered"])
    out = tmp_path / "out"
    p = check(
        "--engine", "tinyserve", "--matrix", str(m), "--target-source", str(tree), "--out", str(out),
        "--no-diagnose", "--minimize-probes", "3",
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    results = json.loads((out / "results.json").read_text())
    (group,) = results["groups"]  # the block-size cell folds into the no-feature group: not its trigger
    assert group["tap"] == "layers.*.attn.out" and group["features"] == "none" and len(group["cells"]) == 2
    assert group["probes"] <= 3 and group["steps"]  # a request or tokens could go
    minimal = (out / group["id"] / "scenario.toml").read_text()
    assert 'engine = "tinyserve"' in minimal
    assert (out / group["id"] / "divergence.png").stat().st_size > 0
    suite = next(iter(JUnitXml.fromfile(str(out / "junit.xml"))))
    assert all(isinstance(case.result[0], Failure) for case in suite)
    assert "layers.1.attn.out" in (out / "summary.md").read_text()
    after = subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True).stdout
    assert after == head  # the checkout is left as it was


@pytest.mark.parametrize(
    "args,words",
    [
        (["--engine", "nosuchengine"], "nosuchengine"),
        (["--engine", "tinyserve:bfloat16"], "the dtype is an axis of the matrix"),
        (["--engine", "tinyserve:enable_prefix_cachin=true"], "did you mean enable_prefix_caching"),
        (["--engine", "tinyserve", "--budget-min", "0"], "--budget-min must be > 0"),
        (["--engine", "tinyserve", "--matrix", "MATRIX"], "arch ['falcon'] unknown here"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, words):
    from agent.check import main
    from tools.errors import run_cli

    m = matrix(tmp_path, arch=["falcon"])
    rc = run_cli(main, [str(m) if a == "MATRIX" else a for a in args] + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert words in err and err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.slow
def test_divergent_group_is_diagnosed_from_its_history(tmp_path):
    tree = faulty_tree(tmp_path / "tree", [(ATTN_SCALE, 1)])
    m = matrix(tmp_path, arch=["llama"], dtype=["float32"], features=["none"], workload=["staggered"])
    out = tmp_path / "out"
    p = check(
        "--engine", "tinyserve", "--matrix", str(m), "--target-source", str(tree), "--good-ref", "HEAD~1",
        "--out", str(out),
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    (group,) = json.loads((out / "results.json").read_text())["groups"]
    assert group["top"]["file"] == ATTN_SCALE.file
    assert json.loads((out / group["report"]).read_text())["hypotheses"][0]["file"] == ATTN_SCALE.file


@pytest.mark.slow
def test_time_budget_skips_and_lists_cells(tmp_path):
    m = matrix(tmp_path, arch=["llama", "qwen2"], dtype=["float32", "bfloat16"], features=["none"], workload=["long"])
    out = tmp_path / "out"
    p = check("--engine", "tinyserve", "--matrix", str(m), "--budget-min", "0.05", "--out", str(out))
    assert p.returncode == 0, p.stderr
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert cells[0]["status"] == "agree" and any(c["status"] == "skipped" for c in cells)
    assert "## Not run" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_llama_cpp_sweep_leaves_out_what_the_engine_does_not_run_and_says_so(tmp_path):
    """The bundled llama.cpp (its clean base, built natively) under a matrix naming an arch it has no
    graph for, a dtype it has no GGUF type for, and a workload past mistral's window (it runs mistral
    without one): those cells are left out with their reasons, not failed; the rest agree."""
    from benchmark.build import build_case_repo, git
    from benchmark.cases import load_cases

    case = next(c for c in load_cases(None) if c.subject == "llama.cpp")
    repo = build_case_repo(case, tmp_path / "repo")
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "clean"), "base")
    m = matrix(
        tmp_path, arch=["llama", "mistral", "gemma2"], dtype=["float32", "bfloat16"], features=["none"],
        workload=["sampled", "long"], strength=5,
    )  # fmt: skip
    out = tmp_path / "out"
    p = check("--engine", "llama.cpp", "--target-source", str(tmp_path / "clean"), "--matrix", str(m), "--out", str(out),
              "--no-diagnose")  # fmt: skip
    assert p.returncode == 0, p.stderr
    results = json.loads((out / "results.json").read_text())
    assert sorted(c["cell"] for c in results["cells"]) == [
        "llama-float32-none-long",
        "llama-float32-none-sampled",
        "mistral-float32-none-sampled",
    ]
    assert {c["status"] for c in results["cells"]} == {"agree"}
    left = " | ".join(results["left_out"])
    assert "gemma2: llama.cpp runs llama, mistral, qwen2 models only" in left
    assert "bfloat16: llama.cpp runs float32, float16 only" in left
    assert "mistral x long: 122 tokens pass mistral's 32-token sliding window" in left
    assert "## Left out of the matrix" in (out / "summary.md").read_text()
