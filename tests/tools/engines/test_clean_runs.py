"""Ctrl-C and SIGTERM mid-run leave no worker process and no temporary folder (issue: a probe
interrupted with Ctrl-C left its engine worker running and /tmp/diffdx-run-* piling up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tools.procs import alive, descendants, group_members, group_of, parent_of
from tools.engines.runner import DIFFDX_ROOT

SCENARIO = DIFFDX_ROOT / "benchmark" / "scenarios" / "tinyserve-batch.toml"


def _ctrl_c_as_a_terminal_delivers_it() -> None:
    # A job started in the background by a shell without job control inherits SIGINT ignored, and
    # Python then never turns it into KeyboardInterrupt; a user's Ctrl-C reaches a CLI that has it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(argv: list[str], tmp: Path, **env) -> subprocess.Popen:
    """A CLI in its own session, its temporary folders under `tmp` (TMPDIR) so they can be counted,
    with SIGINT at its default whatever this test process inherited."""
    full_env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(DIFFDX_ROOT), "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen(
        [sys.executable, "-m", *argv],
        env=full_env,
        cwd=str(tmp.parent),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_a_terminal_delivers_it,
    )


def wait_for_worker(proc: subprocess.Popen, tmp: Path, timeout: float = 300) -> set[int]:
    """Wait until an engine worker runs; returns every process below the CLI."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        below = descendants(proc.pid)
        if any(is_worker(p, proc.pid) for p in below):
            return below
        time.sleep(0.2)
    raise AssertionError("no engine run started")


def is_worker(pid: int, cli: int) -> bool:
    """A plain `python -m tools.engines.worker`, or a child forked by the CLI's zygote."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"tools.engines.worker" in cmdline or parent_of(pid) not in (None, cli)


def interrupt_and_check(proc: subprocess.Popen, tmp: Path, sig: int) -> None:
    below = wait_for_worker(proc, tmp)
    groups = {group_of(p) for p in below} - {None}
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    time.sleep(0.5)
    assert [p for p in below if alive(p)] == [], "a worker or the zygote outlived the CLI"
    assert group_members(groups - {proc.pid}) == set(), "a worker's process group outlived the CLI"
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("diffdx-")) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("forkserver", ["1", "0"])
def test_probe_interrupted_leaves_nothing_behind(tmp_path, sig, forkserver):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(["tools.probe.prober", "--scenario", str(SCENARIO)], tmp, DIFFDX_FORKSERVER=forkserver)
    interrupt_and_check(proc, tmp, sig)
    assert proc.returncode != 0


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])
def test_agent_run_interrupted_leaves_nothing_behind(tmp_path, sig):
    """agent.run also builds the case repo in a temp folder: that goes too."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(["agent.run", "--issue", "1101", "--out", str(tmp_path / "out")], tmp)
    interrupt_and_check(proc, tmp, sig)


def test_keep_temp_keeps_the_run_folders(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(["tools.probe.prober", "--scenario", str(SCENARIO), "--taps", "logits", "--keep-temp"], tmp)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    kept = sorted(tmp.glob("diffdx-run-*"))
    assert len(kept) == 3 and all((d / "trace" / "trace.json").exists() for d in kept)
    assert list(tmp.glob("diffdx-zygote-*")) == []
