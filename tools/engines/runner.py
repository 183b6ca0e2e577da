"""Run an engine in its own process (docs/design.md §4).

The worker's PYTHONPATH starts with the tree under test (a git worktree), then
diffdx's own root, so the target imports the code being diagnosed while the
adapter code comes from diffdx. A crash or a hang is an EngineRunError, never
a crash of the caller: during bisection it is just a `skip`.

Workers are forked from a zygote that has imported torch once (tools/engines/forkserver.py);
each still imports the tree under test fresh. Switches (environment, inherited by workers):
DIFFDX_FORKSERVER=0 runs every worker as a plain `python -m` subprocess; DIFFDX_KEEP_TEMP=1
keeps each run's folder (/tmp/diffdx-run-*) instead of removing it; DIFFDX_RUN_LOG=FILE appends
each run's timing to FILE.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tools.engines.forkserver import ForkServer, ZygoteUnavailable
from tools.engines.treepreload import tree_fingerprint
from tools.procgroup import kill_group, run_in_group

if TYPE_CHECKING:  # imported where used: this module imports no torch, so a zygote can start before it does
    from tools.engines.protocol import RunJob
    from tools.probe.trace import Trace

DIFFDX_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 600.0
WORKER_MODULE = "tools.engines.worker"


class EngineRunError(RuntimeError):
    """The engine process failed; `kind` is 'crash' or 'timeout', `log` its output tail."""

    def __init__(self, message: str, kind: str = "crash", log: str = ""):
        super().__init__(message)
        self.kind = kind
        self.log = log


def worker_env(source_root: str | Path | None, threads: int | None = None, engine: str | None = None) -> dict:
    from tools.engines import worker_paths, worker_vars

    env = dict(os.environ)
    paths = [str(Path(source_root).resolve())] if source_root else []  # the worker runs in another cwd
    paths += worker_paths(engine, source_root) if engine else []  # e.g. an old release's own dependencies
    paths.append(str(DIFFDX_ROOT))
    paths += [
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]  # adapters (docs/engines.md)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(worker_vars(engine, source_root) if engine else {})  # e.g. where the tree's native build lies
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def spare_core() -> bool:
    """Whether an engine worker leaves a core of this machine idle: its intra-op threads (OMP_NUM_THREADS, as the
    worker sets torch's; unset, torch takes one a core) fewer than the cores this process may run on. Work
    overlapped with an engine run (a target's save beside its reference's forward) pays only then: where the
    forward's threads hold every core, a competing process stalls them at each parallel region (measured on
    SmolLM2, 2 cores, two threads a worker: the probe 12.4 -> 14.9 s with the overlap; one thread a worker:
    15.8 -> 15.1 s)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return threads.isdigit() and 0 < int(threads) < cores


def run_engine(
    job: RunJob,
    source_root: str | Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    workdir: str | Path | None = None,
) -> Trace:
    """RunJob -> Trace, computed in a fresh interpreter with `source_root` first on the path. The
    trace is read lazily, one tap at a time by whoever compares it, so the run's folder lives as long
    as the trace does and is removed after it (at once on failure), unless DIFFDX_KEEP_TEMP is set."""
    return EngineRun(job, source_root, timeout, workdir).result()


class EngineRun:
    """One engine run, started: `outputs()` is what it generated as soon as its worker has it (before the
    worker writes its rows), `result()` the whole run as run_engine returns it, `cancel()` gives it up.
    The worker is waited on by a thread of this process; a caller that is interrupted, or gives up, kills its group.

    A caller that needs only a run's outputs (a reference teacher-forced on the target's tokens) starts on
    them while the worker writes its trace, then joins it with `result()`, which raises as run_engine does
    whatever the worker did after its outputs were out (a crash or a hang during its save)."""

    POLL_S = 0.02  # how often `outputs()` looks for the outputs file while the worker runs

    def __init__(
        self,
        job: RunJob,
        source_root: str | Path | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        workdir: str | Path | None = None,
    ):
        from tools.probe import trace as trace_io

        self.job, self.timeout = job, timeout
        self.dir = Path(tempfile.mkdtemp(prefix="diffdx-run-", dir=workdir))
        self._release = (lambda: None) if keep_temp() else trace_io.remove_folder(self.dir)
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._cancelled = False
        self._done = threading.Event()
        self._ended: tuple[int | None, str] | BaseException | None = None  # (exit code, log), or what execute raised
        self._trace: Trace | None = None
        self._ended_at = self._outputs_at = 0.0  # when its worker ended; when `outputs()` had them before that
        try:
            (self.dir / "job.json").write_text(json.dumps(job.to_json()))
            self.started = time.monotonic()
            env = worker_env(source_root, engine=job.spec.engine)
        except BaseException:
            self._release()
            raise
        args = [str(self.dir / "job.json"), str(self.dir / "trace")]
        self._thread = threading.Thread(target=self._execute, args=(args, env), daemon=True, name="engine-run")
        self._thread.start()

    def _execute(self, args: list[str], env: dict) -> None:
        try:
            self._ended = execute(args, env, self.dir, self.timeout, self.job.spec.engine, on_start=self._on_start)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread by result()
            self._ended = e
        finally:
            self._ended_at = time.monotonic()
            self._done.set()

    def _on_start(self, pid: int) -> None:
        with self._lock:
            self._pid = pid
            if self._cancelled:  # given up while the worker was being started
                _kill_worker(pid)

    def outputs(self) -> Trace:
        """The run's outputs and meta (no rows) once its worker has written them; the whole trace if it
        ended first; EngineRunError if it failed before they were out (as `result()`)."""
        from tools.probe import trace as trace_io

        try:
            while not self._done.wait(self.POLL_S):
                early = trace_io.load_outputs(self.dir / "trace")
                if early is not None:
                    self._outputs_at = time.monotonic()
                    return early
        except BaseException:
            self.cancel()
            raise
        return self.result()

    def result(self) -> Trace:
        """The run's trace, its worker joined (exit code, log, timing); EngineRunError when it crashed or
        timed out, its folder then removed. Idempotent."""
        from tools.probe import trace as trace_io

        if self._trace is not None:
            return self._trace
        engine = self.job.spec.engine
        try:
            self._done.wait()
            joined = time.monotonic()
            if isinstance(self._ended, BaseException):
                raise self._ended
            assert self._ended is not None  # set before _done
            code, log = self._ended
            if code is None:
                raise EngineRunError(f"{engine} run timed out after {self.timeout:.0f}s", "timeout", log[-4000:])
            if code != 0:
                raise EngineRunError(f"{engine} run failed (exit {code}): {_last_line(log)}", "crash", log[-4000:])
            worker_timing = self.dir / "trace" / "timing.json"
            timing = json.loads(worker_timing.read_text()) if worker_timing.exists() else {}
            loading = time.monotonic()
            # may remove the folder: read it before
            out = trace_io.load(self.dir / "trace", lazy=True, release=self._release)
        except BaseException:
            self.cancel()
            raise
        # the worker's wall time and this process's reading, not the time the caller spent elsewhere before joining
        out.meta["wall_s"] = self._ended_at - self.started + time.monotonic() - joined
        if self._outputs_at:  # how long the worker went on after its outputs were out (its save), beside the caller
            out.meta["after_outputs_s"] = max(0.0, self._ended_at - self._outputs_at)
        out.meta["timing"] = run_timing(timing, out.meta["wall_s"], time.monotonic() - loading)
        if keep_temp():
            out.meta["run_dir"] = str(self.dir)
        log_run(self.job, out.meta["timing"], out.meta["wall_s"])
        self._trace = out
        return out

    @property
    def ended(self) -> bool:
        """Its worker has ended (well or not: `result()` says which) or could not start."""
        return self._done.is_set()

    @property
    def joined(self) -> bool:
        """`result()` returned the run's trace."""
        return self._trace is not None

    def cancel(self) -> None:
        """Give the run up: its worker's group killed if it still runs, the thread joined, the folder
        removed (unless kept). Nothing once `result()` returned a trace: the folder is that trace's."""
        if self._trace is not None:
            return
        with self._lock:
            self._cancelled = True
            pid = self._pid
            if pid is not None and not self._done.is_set():
                _kill_worker(pid)
        # a worker not yet started (its zygote still importing) is killed by _on_start when it is, or never runs
        self._thread.join(None if pid is not None else 5.0)
        self._release()


def _kill_worker(pid: int) -> None:
    """The worker's group, and the worker itself in case it has not yet made its own group (forked)."""
    kill_group(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def execute(
    args: list[str],
    env: dict,
    cwd: Path,
    timeout: float,
    engine: str | None = None,
    on_start: Callable[[int], None] | None = None,
) -> tuple[int | None, str]:
    """Run the worker module -> (exit code, or None on timeout; its output). Forked from the zygote
    when that is on and possible, else a plain subprocess; either way in its own process group,
    killed as a whole at the timeout or when the caller is interrupted. A tree zygote (tree_server)
    comes first; the time spent waiting for it to be ready counts against the run's `timeout`.
    `on_start`: called with the worker's pid (its group) once it runs (EngineRun kills it from another thread)."""
    started = time.monotonic()
    for find in (lambda: tree_server(env, engine, timeout), lambda: fork_server(env)):  # the shared one only if needed
        server = find()
        left = timeout - (time.monotonic() - started)
        if left <= 0:  # the tree's import in its zygote did not finish within the run's time
            return None, "the tree under test's import did not finish within the run's time (its zygote)"
        if server is not None:
            try:
                return _execute_forked(server, args, env, cwd, left, on_start)
            except ZygoteUnavailable:
                pass
    return _execute_plain(args, env, cwd, timeout - (time.monotonic() - started), on_start)


def _execute_forked(
    server: ForkServer, args, env, cwd: Path, timeout: float, on_start: Callable[[int], None] | None = None
) -> tuple[int | None, str]:
    log = cwd / "worker.log"
    run = server.spawn(WORKER_MODULE, args, env, str(cwd), str(log))
    try:
        if on_start is not None:
            on_start(run.pid)
        code = run.wait(timeout)
        if code is None:
            run.kill()
    except BaseException:
        run.kill()  # interrupted: leave no worker behind
        raise
    finally:
        run.close()
    return code, log.read_text(errors="replace") if log.exists() else ""


def _execute_plain(
    args, env, cwd: Path, timeout: float, on_start: Callable[[int], None] | None = None
) -> tuple[int | None, str]:
    return run_in_group([sys.executable, "-m", WORKER_MODULE, *args], cwd, env, timeout, on_start)


def fork_server(env: dict) -> ForkServer | None:
    """This process's zygote for runs with `env` (started lazily; one per set of modules it may
    import ahead, tools.engines.zygote_preload), or None when off, unavailable or `env` needs other flags."""
    server = zygote_for(env)
    if server is None or not server.compatible(env):
        return None
    try:
        server.start()
    except (ZygoteUnavailable, OSError):
        return None
    return server


def prestart(source_roots: list[str | Path | None]) -> None:
    """Launch, without waiting, the zygotes that runs of these trees (None: the installed engines)
    will fork from, so that their start-up (torch and the reference imported, seconds) overlaps the
    caller's own imports before its first engine run. The path is guessed without the adapters'
    hooks (tools.engines.worker_paths): a wrong guess costs an idle zygote, stopped at exit."""
    for root in dict.fromkeys(source_roots):
        env = worker_env(root)
        server = zygote_for(env)
        if server is not None and server.compatible(env):
            try:
                server.launch()
            except OSError:
                pass  # the run that needs it will try again, and fall back to a plain subprocess
        if root is not None:
            launch_tree_zygote(root)


def launch_tree_zygote(root: str | Path) -> None:
    """Launch, without waiting, a zygote that has imported the tree's own heavy package
    (tools.engines.tree_preload; tools/engines/treepreload.py), for the runs of that tree: a tree run
    many times (the user's). Nothing for a tree without one, or when zygotes are off."""
    from tools.engines import tree_preload

    found = tree_preload(worker_env(root))
    if found is None or os.environ.get("DIFFDX_FORKSERVER", "1") == "0" or not hasattr(os, "fork"):
        return
    tree, engine, packages, modules = found
    try:
        env = worker_env(root, engine=engine)  # exactly as its runs will have it
    except Exception:  # noqa: BLE001 - the adapter's hook failed: its runs will say why
        return
    if site_hooks(env.get("PYTHONPATH", "")):  # they run before the tree's import in a fresh run: keep that order
        return
    key = _env_key(env)
    if key in _TREE_SERVERS and _TREE_SERVERS[key][0].owner == os.getpid():
        return
    fingerprint = tree_fingerprint(tree, packages)
    server = ForkServer(env, preload=modules, tree=tree)
    _TREE_SERVERS[key] = (server, fingerprint, packages, engine)
    try:
        server.launch()
    except OSError:
        _TREE_SERVERS.pop(key, None)


def tree_server(env: dict, engine: str | None, timeout: float) -> ForkServer | None:
    """The tree zygote launched for `engine`'s runs with exactly `env`, ready (waiting at most `timeout` s),
    while the tree's files are still the ones it imported; None otherwise. One that cannot start
    (the import fails or hangs) or whose tree changed is stopped and not tried again."""
    key = _env_key(env)
    entry = _TREE_SERVERS.get(key)
    if entry is None or entry[0].owner != os.getpid() or entry[3] != engine:
        return None  # another engine's run would get a package (and its coverage) it does not import
    server, fingerprint, packages, _ = entry
    try:
        if tree_fingerprint(str(server.tree), packages) != fingerprint:
            raise ZygoteUnavailable("the tree changed since its zygote imported it")
        server.start(timeout=min(timeout, server.start_timeout))
    except (ZygoteUnavailable, OSError):
        _TREE_SERVERS.pop(key, None)
        server.stop()
        return None
    return server


def stop_tree_zygotes(under: str | Path) -> int:
    """Stop this process's tree zygotes whose tree lies under `under` (a diagnosis's temp folder that is
    about to go: they could never serve again, and each holds its tree's package in memory) -> how many."""
    root = Path(under).resolve()
    stopped = 0
    for key, (server, *_) in list(_TREE_SERVERS.items()):
        if server.owner == os.getpid() and server.tree and Path(server.tree).resolve().is_relative_to(root):
            _TREE_SERVERS.pop(key, None)
            server.stop()
            stopped += 1
    return stopped


def site_hooks(pythonpath: str) -> list[str]:
    """The sitecustomize/usercustomize modules that folders on `pythonpath` hold. Pure but for looking."""
    entries = [p for p in pythonpath.split(os.pathsep) if p]
    return [
        str(Path(p) / f"{name}.py")
        for p in entries
        for name in ("sitecustomize", "usercustomize")
        if (Path(p) / f"{name}.py").is_file() or (Path(p) / name / "__init__.py").is_file()
    ]


# Variables that change in the orchestrator during a diagnosis and that no import of a tree reads:
# diffdx's own switches for its runs (not the coverage recorder, nor the cache), one torch sets when
# imported, and pytest's. A tree zygote is for runs whose environment is its own but for these.
RUN_ONLY_ENV = ("DIFFDX_KEEP_TEMP", "DIFFDX_RUN_LOG", "TORCHINDUCTOR_CACHE_DIR", "PYTEST_CURRENT_TEST")


def _env_key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in RUN_ONLY_ENV))


def zygote_for(env: dict) -> ForkServer | None:
    """The ForkServer (maybe not started) for runs with `env`; None when zygotes are off."""
    from tools.engines import zygote_preload

    if os.environ.get("DIFFDX_FORKSERVER", "1") == "0" or not hasattr(os, "fork"):
        return None
    preload = zygote_preload(env)
    server = _SERVERS.get(preload)
    if server is None or server.owner != os.getpid():
        server = _SERVERS[preload] = ForkServer(worker_env(None), preload=preload)
    return server


_SERVERS: dict[tuple[str, ...], ForkServer] = {}
# env -> (server, fingerprint, packages, engine)
_TREE_SERVERS: dict[tuple, tuple[ForkServer, str, tuple[str, ...], str]] = {}


def run_timing(worker_timing: dict, wall_s: float, load_s: float) -> dict:
    """Seconds per part of one run: start-up (process, imports), engine (forward and capture,
    coverage included), save, load (lazy: the trace's index; its tensors are read by the compare).
    Start-up is what the worker (`worker_timing`) did not account for; its `*_cpu_s` (CPU seconds
    of a part) are kept beside the wall seconds and not counted in it."""
    t = dict(worker_timing)
    t["load_s"] = load_s
    t["startup_s"] = max(0.0, wall_s - sum(v for k, v in t.items() if not k.endswith("_cpu_s")))
    return t


def end_cleanly(keep_temp_folders: bool = False) -> None:
    """For a CLI's main thread: make SIGTERM end the run as Ctrl-C does, by an exception, so that
    every worker group is killed, the zygote stopped and temporary folders removed on the way out;
    `keep_temp_folders` (--keep-temp) keeps the run folders, in this process and its children."""
    if keep_temp_folders:
        os.environ["DIFFDX_KEEP_TEMP"] = "1"
    signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum, _frame):
    import multiprocessing

    for child in multiprocessing.active_children():  # benchmark.run's case workers clean up the same way
        child.terminate()
    raise SystemExit(128 + signum)


def log_run(job: RunJob, timing: dict, wall_s: float) -> None:
    """One JSON line per engine run to $DIFFDX_RUN_LOG, when set (benchmark.perf reads it)."""
    path = os.environ.get("DIFFDX_RUN_LOG")
    if not path:
        return
    entry = {
        "end": time.time(),
        "wall_s": wall_s,
        **timing,
        "engine": job.spec.engine,
        "capture": job.taps != [],
        "coverage": bool(job.coverage_root),
        "forkserver": os.environ.get("DIFFDX_FORKSERVER", "1") != "0",
    }
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def keep_temp() -> bool:
    return os.environ.get("DIFFDX_KEEP_TEMP", "") not in ("", "0")


def _last_line(log: str) -> str:
    lines = [line for line in log.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
