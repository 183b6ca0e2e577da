"""Run an engine in its own process (DESIGN.md §4).

The worker's PYTHONPATH starts with the tree under test (a git worktree), then
diffdx's own root, so the target imports the code being diagnosed while the
adapter code comes from diffdx. A crash or a hang is an EngineRunError, never
a crash of the caller: during bisection it is just a `skip`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import trace as trace_io
from tools.engines.protocol import RunJob

DIFFDX_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 600.0


class EngineRunError(RuntimeError):
    """The engine process failed; `kind` is 'crash' or 'timeout', `log` its output tail."""

    def __init__(self, message: str, kind: str = "crash", log: str = ""):
        super().__init__(message)
        self.kind = kind
        self.log = log


def worker_env(source_root: str | Path | None, threads: int | None = None) -> dict:
    env = dict(os.environ)
    paths = [str(Path(source_root).resolve())] if source_root else []   # the worker runs in another cwd
    paths += _release_dependency_paths(source_root)   # an old transformers release's own dependencies
    paths.append(str(DIFFDX_ROOT))
    paths += [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # adapters (docs/engines.md)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _release_dependency_paths(source_root) -> list[str]:
    from tools.engines.hf_compat import ReleaseDependencyError, dependency_paths

    try:
        return dependency_paths(source_root)
    except ReleaseDependencyError as e:
        raise EngineRunError(str(e), "crash") from None


def run_engine(job: RunJob, source_root: str | Path | None = None,
               timeout: float = DEFAULT_TIMEOUT_S, workdir: str | Path | None = None) -> trace_io.Trace:
    """RunJob -> Trace, computed in a fresh interpreter with `source_root` first on the path."""
    tmp = Path(tempfile.mkdtemp(prefix="diffdx-run-", dir=workdir))
    (tmp / "job.json").write_text(json.dumps(job.to_json()))
    cmd = [sys.executable, "-m", "tools.engines.worker", str(tmp / "job.json"), str(tmp / "trace")]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=worker_env(source_root), cwd=str(tmp), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        log = proc.communicate()[0] or ""
        raise EngineRunError(f"{job.spec.engine} run timed out after {timeout:.0f}s", "timeout", log[-4000:])
    if proc.returncode != 0:
        raise EngineRunError(f"{job.spec.engine} run failed (exit {proc.returncode}): {_last_line(log)}",
                             "crash", log[-4000:])
    out = trace_io.load(tmp / "trace")
    out.meta["wall_s"] = time.monotonic() - started
    out.meta["run_dir"] = str(tmp)
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _last_line(log: str) -> str:
    lines = [line for line in log.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
