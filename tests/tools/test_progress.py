"""The live status line: drawn on a terminal's stderr only, never on stdout, gone with --quiet."""

import io
import json
import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from tools import progress
from tools.progress import Task, status_line

ROOT = Path(__file__).resolve().parents[2]


def test_status_line_joins_open_tasks_outermost_first():
    outer = Task("validating cases", total=35, count=3, detail="ts-prefix", started=0.0)
    inner = Task("engine run 2: transformers float64 (reference)", started=10.0)
    assert (
        status_line([outer, inner], now=14.2)
        == "validating cases 3/35 ts-prefix › engine run 2: transformers float64 (reference) 4s"
    )
    assert status_line([], now=1.0) == ""


def test_each_counts_items_and_closes_its_task_on_break():
    seen = []
    for v in progress.each(["batch", "long_prompt", "staggered"], "trigger variants"):
        seen.append(progress.current_line())
        if v == "long_prompt":
            break
    assert seen[0].startswith("trigger variants 1/3 batch") and seen[1].startswith("trigger variants 2/3 long_prompt")
    assert progress.current_line() == ""


def test_live_draws_on_a_terminal_and_not_when_quiet_or_piped():
    def drawn(**kw) -> str:
        out = io.StringIO()
        console = Console(file=out, force_terminal=kw.pop("terminal", True), width=120)
        with progress.live(console=console, **kw), progress.task("bisect step 1: commit 3/7 abc"):
            time.sleep(0.6)
        return out.getvalue()

    assert "bisect step 1: commit 3/7 abc" in drawn()
    assert drawn(quiet=True) == "" and drawn(terminal=False) == ""


def run_with_terminal_stderr(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run argv with stderr on a pseudo-terminal and stdout on a pipe -> (rc, stdout, terminal text)."""
    master, slave = pty.openpty()
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'tools'}", "TERM": "xterm"}
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=slave, text=True, timeout=timeout)
    os.close(slave)
    reader.join(5)
    os.close(master)
    return proc.returncode, proc.stdout, b"".join(chunks).decode(errors="replace")


def test_stdout_stays_clean_while_the_line_is_drawn():
    code = (
        "import json, time; from tools import progress\n"
        "with progress.live(), progress.task('engine run 1: toy float32 (target)'):\n"
        "    time.sleep(0.8); print(json.dumps({'diverged': False}))\n"
    )
    rc, out, terminal = run_with_terminal_stderr([sys.executable, "-c", code], timeout=60)
    assert rc == 0 and json.loads(out) == {"diverged": False}
    assert "engine run 1: toy float32 (target)" in terminal


@pytest.mark.slow
def test_probe_shows_engine_runs_on_a_terminal_and_prints_only_json_on_stdout(tmp_path):
    scenario = tmp_path / "toy.toml"
    scenario.write_text(
        '[model]\narch = "llama"\nseed = 0\n[target]\nengine = "toy_engine:ToyEngine"\n'
        '[reference]\nengine = "toy_engine:ToyEngine"\n'
        "[[workload.requests]]\nprompt_ids = [5, 17, 42]\nmax_tokens = 2\n"
    )
    argv = [sys.executable, "-m", "tools.probe.prober", "--scenario", str(scenario), "--json"]
    rc, out, terminal = run_with_terminal_stderr(argv, timeout=300)
    assert rc == 0 and json.loads(out)["engine_runs"] == 3
    assert "engine run 1: toy_engine:ToyEngine float32 (target)" in terminal
    rc, out, terminal = run_with_terminal_stderr(argv + ["--quiet"], timeout=300)
    assert rc == 0 and "engine run" not in terminal


def test_worker_log_has_no_third_party_progress_bars(tmp_path):
    """Regression (issue 16): transformers' "Loading weights" bar and advisory warnings filled the
    worker log that a failed probe prints."""
    from tools.engines.protocol import RunJob
    from tools.engines.runner import worker_env
    from tools.probe.checkpoints import ensure_checkpoint
    from tools.scenario import from_dict

    sc = from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "transformers"},
            "workload": {"requests": [{"prompt_ids": [5, 17, 42], "max_tokens": 2}]},
        }
    )
    job = tmp_path / "job.json"
    job.write_text(json.dumps(RunJob(sc, sc.target, str(ensure_checkpoint(sc.model))).to_json()))
    proc = subprocess.run(
        [sys.executable, "-m", "tools.engines.worker", str(job), str(tmp_path / "trace")],
        env=worker_env(None),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and (tmp_path / "trace" / "trace.json").is_file()
    assert "Loading weights" not in proc.stderr and "it/s" not in proc.stderr and proc.stdout == ""
