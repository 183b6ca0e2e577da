"""Child processes in a process group of their own, ended as a whole.

An engine worker, a bisection oracle command and a forked worker can each start processes of
their own (tensor-parallel ranks, a shell's children); at a timeout or an interrupt the whole
group is killed, so nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid`; one that is gone (or was never ours) is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_in_group(
    cmd: list[str], cwd: str | Path, env: dict, timeout: float | None, on_start: Callable[[int], None] | None = None
) -> tuple[int | None, str]:
    """Run `cmd` in a new session -> (exit code, or None when it ran past `timeout`; its output,
    stderr merged). The group is killed at the timeout and when the caller is interrupted.
    `on_start`: called with the process's pid (its group's) once it is started."""
    proc = subprocess.Popen(
        cmd, cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    if on_start is not None:
        on_start(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        return None, proc.communicate()[0] or ""
    except BaseException:
        kill_group(proc.pid)  # interrupted: leave no orphan behind
        proc.communicate()
        raise
    return proc.returncode, out or ""
