"""A zygote that forks one engine worker per run, so torch is imported once per orchestrator.

Importing torch costs seconds per engine process; a diagnosis runs about ten of them. The
zygote is an interpreter started exactly like a worker (PYTHONPATH = diffdx's root only) that
has imported torch, numpy and safetensors — and the installed reference's modules when no run it
forks holds its own copy of that package (tools.engines.zygote_preload), never a tree under test —
and no tensor op has run, so no thread pool exists for fork to break. Each run is one connection on its Unix socket:

    parent -> zygote   {"module": M, "args": [...], "env": {...}, "cwd": DIR, "log": FILE}\\n
    zygote -> parent   {"pid": N}\\n          the child runs in its own session (pgid = N)
    parent -> zygote   kill\\n                 (timeout, interrupt) SIGKILL the child's group;
                                               closing the connection does the same
    zygote -> parent   {"exit": CODE}\\n       CODE as subprocess reports it (-SIG for a signal)

The child then behaves as `python -m M args` started with the run's environment would (DESIGN §4):
sys.path is rebuilt from the run's PYTHONPATH, a `sitecustomize` found there is imported, and
the module runs as `__main__`, so the tree under test is imported fresh in every run; at the end
it runs atexit handlers and joins its threads but skips the module teardown (seconds with torch). If the
orchestrator goes away (EOF on the zygote's stdin), the zygote kills every child's group,
removes their run folders (unless DIFFDX_KEEP_TEMP is set) and exits.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from typing import cast

from tools.procgroup import kill_group

PRELOAD = ("torch", "numpy", "safetensors.torch")  # third-party only: never a tree under test
# Parts of installed third-party packages that an engine imports on its first run, seconds each
# (transformers imports torch._dynamo and, through its losses, scipy.optimize); still never an engine's code.
PRELOAD_DEEP = ("torch._dynamo", "scipy.optimize")


# ---- inside the zygote ------------------------------------------------------------------------


class Zygote:
    """The zygote's loop: accept a run, fork it, report its pid and exit status."""

    def __init__(self, sock_path: str):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(sock_path)
        self.listener.listen(64)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd fires
        self.wake_w = wake_w
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "child")
        self.sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
        self.live: dict[int, tuple[socket.socket, dict]] = {}  # pid -> (connection, request)

    def serve(self) -> dict | None:
        """Loop until the parent leaves (None) or, in a forked child, return the child's request."""
        while True:
            for key, _ in self.sel.select():
                if key.data == "accept":
                    request = self.accept()
                    if request is not None:
                        return request  # we are the child
                elif key.data == "child":
                    os.read(self.wake_r, 4096)
                    self.reap()
                elif key.data == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):
                        self.shutdown()
                        return None
                else:
                    self.on_message(key.data, cast(socket.socket, key.fileobj))  # registered in accept()

    def accept(self) -> dict | None:
        conn, _ = self.listener.accept()
        request = json.loads(_read_line(conn))
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.become_child(conn, request)
            return request
        self.live[pid] = (conn, request)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        self.sel.register(conn, selectors.EVENT_READ, pid)
        return None

    def on_message(self, pid: int, conn: socket.socket) -> None:
        """'kill' or a closed connection: the parent gave up on this run."""
        data = conn.recv(64)
        if pid in self.live and (not data or b"kill" in data):
            _kill_run(pid)
        if not data:
            self.sel.unregister(conn)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn, _ = self.live.pop(pid, (None, None))
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass
                if conn in (k.fileobj for k in self.sel.get_map().values()):
                    self.sel.unregister(conn)
                conn.close()

    def shutdown(self) -> None:
        """The orchestrator is gone: leave no worker and no run folder behind."""
        for pid, (_, request) in list(self.live.items()):
            _kill_run(pid)
            if os.environ.get("DIFFDX_KEEP_TEMP", "") in ("", "0"):
                shutil.rmtree(request["cwd"], ignore_errors=True)
        for pid in list(self.live):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def become_child(self, conn: socket.socket, request: dict) -> None:
        """Drop everything of the zygote's; own session, stdin from /dev/null, output to the run's log."""
        signal.set_wakeup_fd(-1)
        for sig, handler in (
            (signal.SIGCHLD, signal.SIG_DFL),
            (signal.SIGTERM, signal.SIG_DFL),
            (signal.SIGINT, signal.default_int_handler),
        ):
            signal.signal(sig, handler)
        self.sel.close()
        for c, _ in self.live.values():
            c.close()
        conn.close()
        self.listener.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)


def _read_line(conn: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def _kill_run(pid: int) -> None:
    """A forked run's group, and the child itself in case it has not yet made its own group."""
    kill_group(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- in the orchestrator ----------------------------------------------------------------------


class ZygoteUnavailable(RuntimeError):
    """The zygote could not start or went away: run this engine as a plain subprocess instead."""


class ForkServer:
    """The orchestrator's handle on its zygote: started on first use, stopped at exit."""

    def __init__(self, env: dict, start_timeout: float = 300.0, preload: tuple[str, ...] = (), tree: str | None = None):
        self.env = env
        self.preload = preload  # installed modules imported ahead besides PRELOAD (tools.engines.zygote_preload)
        self.tree = tree  # a tree zygote: `preload` are this tree's modules (tools/engines/treepreload.py)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.dir: str | None = None
        self.ready = False  # it said "ready" (launch() does not wait for that; start() does)
        self.lock = threading.Lock()
        self.owner = os.getpid()  # a forked orchestrator must start its own

    def compatible(self, env: dict) -> bool:
        """A forked child keeps the zygote's interpreter flags and the packages it imported: any PYTHON*
        setting but the path must match, and no folder on the run's path may hold its own copy of one."""

        def flags(e):
            return {k: v for k, v in e.items() if k.startswith("PYTHON") and k != "PYTHONPATH"}

        return flags(env) == flags(self.env) and not shadowed(
            env.get("PYTHONPATH", ""), PRELOAD + PRELOAD_DEEP + self.preload
        )

    def launch(self) -> None:
        """Start the zygote's interpreter without waiting for it (start() waits): its imports then
        overlap whatever the caller does meanwhile. A no-op while one is alive."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.launch_locked()

    def start(self, timeout: float | None = None) -> None:
        """The zygote, started and ready to fork (waiting at most `timeout` s, else its start_timeout);
        ZygoteUnavailable when it cannot be."""
        with self.lock:
            if self.proc is not None and self.proc.poll() is None and self.ready:
                return
            if self.proc is None or self.proc.poll() is not None:
                self.launch_locked()
            self.wait_ready_locked(self.start_timeout if timeout is None else timeout)

    def launch_locked(self) -> None:
        self.stop_locked()
        self.dir = tempfile.mkdtemp(prefix="diffdx-zygote-")
        sock = os.path.join(self.dir, "sock")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tools.engines.forkserver",
                sock,
                *(("--tree", self.tree) if self.tree else ()),
                *self.preload,
            ],
            env=self.env,
            cwd=self.dir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.ready = False
        atexit.register(self.stop)

    def wait_ready_locked(self, timeout: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None  # launched, a PIPE
        try:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            self.ready = bool(ready) and self.proc.stdout.readline().strip() == b"ready"
        except BaseException:
            self.stop_locked()  # interrupted while it was starting
            raise
        if not self.ready:
            self.stop_locked()
            raise ZygoteUnavailable("the fork server did not start")

    def spawn(self, module: str, args: list[str], env: dict, cwd: str, log: str) -> ForkedRun:
        self.start()
        assert self.dir is not None  # start() made it
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(os.path.join(self.dir, "sock"))
            request = {"module": module, "args": args, "env": env, "cwd": cwd, "log": log}
            conn.sendall(json.dumps(request).encode() + b"\n")
            conn.settimeout(60)
            pid = json.loads(_read_line(conn))["pid"]
        except (OSError, ValueError, KeyError) as e:
            conn.close()
            raise ZygoteUnavailable(f"the fork server did not answer: {e}") from None
        except BaseException:
            conn.close()  # interrupted: the zygote kills a child whose connection closes
            raise
        return ForkedRun(conn, pid)

    def stop(self) -> None:
        with self.lock:
            self.stop_locked()

    def stop_locked(self) -> None:
        """EOF on its stdin tells the zygote to kill its children and leave; SIGKILL if it lingers."""
        if self.proc is not None:
            assert self.proc.stdin is not None and self.proc.stdout is not None  # PIPEs, see start()
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                kill_group(self.proc.pid)
                self.proc.wait()
            self.proc.stdout.close()
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class ForkedRun:
    """One forked worker: its pid (= its process group) and the zygote connection that reports its exit."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn = conn
        self.pid = pid

    def wait(self, timeout: float | None) -> int | None:
        """Exit code, or None if `timeout` seconds passed first."""
        self.conn.settimeout(timeout)
        try:
            line = _read_line(self.conn)
        except TimeoutError:
            return None
        if not line:  # the zygote died under us: make sure the worker goes too
            kill_group(self.pid)
            raise ZygoteUnavailable(f"the fork server went away during run {self.pid}")
        return json.loads(line)["exit"]

    def kill(self) -> int | None:
        """SIGKILL the worker's group (through the zygote, which alone knows if it was reaped)."""
        try:
            self.conn.sendall(b"kill\n")
            return self.wait(30)
        except (OSError, ZygoteUnavailable):
            kill_group(self.pid)
            return None

    def close(self) -> None:
        self.conn.close()


def shadowed(pythonpath: str, modules: tuple[str, ...]) -> list[str]:
    """The top-level packages of `modules` that a folder on `pythonpath` holds its own copy of. Pure
    but for looking at the folders."""
    packages = dict.fromkeys(m.split(".")[0] for m in modules)
    entries = [p for p in pythonpath.split(os.pathsep) if p]
    return [
        pkg
        for pkg in packages
        if any(os.path.isdir(os.path.join(p, pkg)) or os.path.isfile(os.path.join(p, pkg + ".py")) for p in entries)
    ]


# ---- inside a forked child: look like a fresh `python -m module` ------------------------------


def fresh_sys_path(base: list[str], cwd: str, pythonpath: str) -> list[str]:
    """sys.path of `python -m` run in `cwd` with PYTHONPATH=pythonpath, given the interpreter's own
    entries `base` (stdlib, site-packages). Pure."""
    entries = [os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p]
    return [cwd, *entries, *(p for p in base if p not in entries)]


def run_site_hooks(entries: list[str]) -> None:
    """A fresh interpreter imports the first sitecustomize/usercustomize on its path; the zygote
    imported its own already, so only one found on the run's new entries is left to import."""
    from importlib.machinery import PathFinder

    for name in ("sitecustomize", "usercustomize"):
        if PathFinder.find_spec(name, entries) is None:
            continue
        sys.modules.pop(name, None)
        try:
            importlib.import_module(name)
        except Exception as e:  # as site.py does: report and carry on
            print(f"Error in {name}; set PYTHONVERBOSE for traceback:\n{type(e).__name__}: {e}", file=sys.stderr)


def run_child(request: dict, base_path: list[str]) -> None:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    pythonpath = request["env"].get("PYTHONPATH", "")
    sys.path[:] = fresh_sys_path(base_path, request["cwd"], pythonpath)
    importlib.invalidate_caches()
    run_site_hooks([p for p in sys.path[1:] if p not in base_path])
    sys.argv = [request["module"], *request["args"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    finish(code)


def exit_code(value) -> int:
    """SystemExit's argument -> the process exit status, as the interpreter maps it."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


LEFT_TO_EXIT: list = []  # what a run keeps until its process ends (`leave_to_exit`)


def leave_to_exit(obj: object) -> None:
    """Keep `obj` until the process ends. A forked child ends in `finish`, which tears nothing down, so what
    it holds goes back to the system whole; freed one by one when the worker's `main` returned, the ~1e5 tap
    records of a capturing run took 0.13 s (SmolLM2-135M, 2 x 128 tokens) of a process about to end. A
    `python -m` worker (no zygote) frees them in its interpreter's teardown, as it did."""
    LEFT_TO_EXIT.append(obj)


def finish(code: int) -> None:
    """Exit as an interpreter does (atexit handlers, non-daemon threads joined, output flushed) but
    without tearing down every module: with torch loaded that teardown alone takes seconds."""
    atexit._run_exitfuncs()
    threading._shutdown()  # type: ignore[attr-defined]  # private (what the interpreter calls at exit): no stub
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:  # died of a signal (Ctrl-C): say so the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def main(sock_path: str, *preload: str) -> int:
    own = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in own]  # sys.path[0] is the zygote's cwd
    tree = preload[1] if preload[:1] == ("--tree",) else None
    preload = preload[2:] if tree else preload
    for name in PRELOAD:
        importlib.import_module(name)
    for name in PRELOAD_DEEP if tree else (*PRELOAD_DEEP, *preload):  # a speed-up only: a run imports what is missing
        try:
            importlib.import_module(name)
        except Exception as e:
            print(f"zygote: not preloaded {name}: {type(e).__name__}: {e}", file=sys.stderr)
    if tree:  # all of them or no zygote: a run must not see a partial import it would not have made
        from tools.engines.treepreload import preload_tree

        unfit = preload_tree(tree, preload)
        if unfit is not None:
            print(f"unfit: {unfit}", flush=True)
            return 0
    zygote = Zygote(sock_path)
    print("ready", flush=True)
    request = zygote.serve()
    if request is None:
        shutil.rmtree(os.path.dirname(sock_path), ignore_errors=True)  # the orchestrator may be gone
        return 0
    run_child(request, base_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
