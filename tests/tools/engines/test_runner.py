"""The engine runner: workers forked from the zygote or plain subprocesses behave alike on
success, crash, hang and timeout, leave no process and no run folder behind, and still import
the tree under test fresh (its sitecustomize included)."""

from __future__ import annotations

import atexit
import dataclasses
import gc
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.tools.procs import alive, group_members
from tools.engines.protocol import RunJob
from tools.engines.runner import DIFFDX_ROOT, EngineRun, EngineRunError, run_engine
from tools.probe.checkpoints import ensure_checkpoint
from tools.scenario import from_dict

MODES = ["fork", "plain"]


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    monkeypatch.setenv("DIFFDX_FORKSERVER", "1" if request.param == "fork" else "0")
    monkeypatch.delenv("DIFFDX_KEEP_TEMP", raising=False)
    return request.param


def tiny_job() -> RunJob:
    sc = from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "tinyserve", "dtype": "float32"},
            "workload": {"requests": [{"prompt_ids": [1, 5, 9], "max_tokens": 2}]},
        }
    )
    return RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)), taps=[])


def tree_with(tmp_path, code: str):
    """A source tree whose sitecustomize runs `code` at the worker's start-up (as tests/faults.py does)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "sitecustomize.py").write_text(code)
    return tree


def run_folders(workdir) -> list:
    return sorted(p.name for p in workdir.iterdir() if p.name.startswith("diffdx-run-"))


def test_a_run_returns_its_trace_and_removes_its_folder(tmp_path, mode):
    tree = tree_with(tmp_path, "import os\nos.environ['DIFFDX_SEEN_TREE'] = 'yes'\n")
    trace = run_engine(tiny_job(), tree, workdir=tmp_path)
    assert len(trace.outputs[0].output_ids) == 2
    assert trace.meta["timing"]["engine_s"] > 0 and trace.meta["timing"]["startup_s"] >= 0
    assert run_folders(tmp_path) == []


def test_a_traced_run_s_folder_lives_as_long_as_its_trace(tmp_path, mode):
    """The trace is read lazily from the run's folder (issue 14): the folder goes when the trace does."""
    job = dataclasses.replace(tiny_job(), taps=["logits"])
    trace = run_engine(job, None, workdir=tmp_path)
    assert len(run_folders(tmp_path)) == 1
    logits = [b.tensor for b in trace.blocks()]
    assert [x.shape[0] for x in logits] == [2]  # a row per generated token, read from the folder
    del trace
    gc.collect()
    assert run_folders(tmp_path) == []


def test_keep_temp_keeps_the_run_folder(tmp_path, mode, monkeypatch):
    monkeypatch.setenv("DIFFDX_KEEP_TEMP", "1")
    trace = run_engine(tiny_job(), None, workdir=tmp_path)
    assert run_folders(tmp_path) == [os.path.basename(trace.meta["run_dir"])]


def test_a_crash_reports_its_exit_and_output(tmp_path, mode):
    tree = tree_with(
        tmp_path, "print('about to fail', flush=True)\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    with pytest.raises(EngineRunError) as err:
        run_engine(tiny_job(), tree, workdir=tmp_path)
    assert err.value.kind == "crash" and "exit -11" in str(err.value) and "about to fail" in err.value.log
    assert run_folders(tmp_path) == []


def test_an_exception_in_the_tree_is_a_crash_with_its_traceback(tmp_path, mode):
    tree = tree_with(tmp_path, "")
    (tree / "tinyserve").mkdir()
    (tree / "tinyserve" / "__init__.py").write_text("raise RuntimeError('broken tree')\n")
    with pytest.raises(EngineRunError) as err:
        run_engine(tiny_job(), tree, workdir=tmp_path)
    assert err.value.kind == "crash" and "exit 1" in str(err.value) and "RuntimeError: broken tree" in err.value.log


def test_a_hang_is_killed_at_the_timeout_with_its_whole_group(tmp_path, mode):
    """The hung worker starts a grandchild too: the whole process group must go."""
    tree = tree_with(
        tmp_path,
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "open(os.environ['PIDS_FILE'], 'w').write(f'{os.getpid()} {child.pid}')\n"
        "time.sleep(300)\n",
    )
    os.environ["PIDS_FILE"] = str(tmp_path / "pids")
    try:
        started = time.monotonic()
        with pytest.raises(EngineRunError) as err:
            run_engine(tiny_job(), tree, timeout=4, workdir=tmp_path)
    finally:
        del os.environ["PIDS_FILE"]
    assert err.value.kind == "timeout" and time.monotonic() - started < 30
    worker, grandchild = map(int, (tmp_path / "pids").read_text().split())
    time.sleep(0.5)
    assert not alive(worker) and not alive(grandchild) and group_members({worker}) == set()
    assert run_folders(tmp_path) == []


def preloaded(tmp_path, tree) -> set[str]:
    """The top-level engine packages a worker for `tree` has in sys.modules before the tree's code runs."""
    seen = tmp_path / "preloaded.txt"
    (tree / "sitecustomize.py").write_text(
        "import sys\n"
        f"open({str(seen)!r}, 'w').write(' '.join(sorted(m for m in sys.modules if "
        "m.split('.')[0] in ('tinyserve', 'transformers'))))\n"
    )
    run_engine(tiny_job(), tree, workdir=tmp_path)
    return {m.split(".")[0] for m in seen.read_text().split()}


def test_worker_imports_nothing_of_the_engine_before_the_tree(tmp_path, mode):
    """Isolation: the forked worker has torch already, and at most the installed reference
    (tools.engines.ZYGOTE_PRELOAD), but nothing of the tree under test before the tree's own."""
    tree = tree_with(tmp_path, "")
    assert preloaded(tmp_path, tree) <= ({"transformers"} if mode == "fork" else set())


def test_a_tree_holding_the_reference_package_gets_no_preloaded_copy(tmp_path, mode):
    """A tree (or a release) with its own copy of a preloaded package: its worker comes from a
    zygote that never imported that package, so the tree's copy is the one imported."""
    tree = tree_with(tmp_path, "")
    (tree / "transformers").mkdir()
    (tree / "transformers" / "__init__.py").write_text("")
    assert preloaded(tmp_path, tree) == set()


ORCHESTRATOR = """
import sys
from pathlib import Path
from tests.tools.engines.test_runner import tiny_job
from tools.engines.runner import run_engine
run_engine(tiny_job(), Path(sys.argv[1]))
"""


def test_a_killed_orchestrator_leaves_no_worker_and_no_folder(tmp_path):
    """Even SIGKILL, which no handler sees: the zygote notices its parent is gone and cleans up."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    pid_file = tmp_path / "worker.pid"
    tree = tree_with(
        tmp_path, f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(DIFFDX_ROOT), "DIFFDX_FORKSERVER": "1"}
    env.pop("DIFFDX_KEEP_TEMP", None)
    proc = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR, str(tree)], env=env, start_new_session=True)
    deadline = time.monotonic() + 300
    while not pid_file.exists() and time.monotonic() < deadline:
        assert proc.poll() is None
        time.sleep(0.2)
    worker = int(pid_file.read_text())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while (alive(worker) or list(tmp.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(worker) and sorted(p.name for p in tmp.iterdir()) == []


def test_a_tree_with_its_own_copy_of_a_preloaded_package_gets_that_copy(tmp_path, mode):
    """The zygote imported scipy ahead (transformers needs it); a run whose path holds its own scipy
    must import that one, so it is not forked from the zygote but started plain."""
    seen = tmp_path / "scipy.txt"
    tree = tree_with(tmp_path, f"import scipy\nopen({str(seen)!r}, 'w').write(scipy.__file__)\n")
    (tree / "scipy").mkdir()
    (tree / "scipy" / "__init__.py").write_text("")
    run_engine(tiny_job(), tree, workdir=tmp_path)
    assert seen.read_text() == str(tree / "scipy" / "__init__.py")


def test_prestart_launches_the_zygotes_runs_then_fork_from(tmp_path, monkeypatch):
    """prestart does not wait for a zygote to be ready; the run that follows forks from the one it
    launched. A tree holding its own transformers needs a zygote of its own, launched alongside."""
    from tools.engines import runner

    monkeypatch.setenv("DIFFDX_FORKSERVER", "1")
    monkeypatch.setattr(runner, "_SERVERS", {})
    plain, own = tree_with(tmp_path, ""), tmp_path / "own"
    (own / "transformers").mkdir(parents=True)
    (own / "transformers" / "__init__.py").write_text("")
    runner.prestart([plain, None, own])
    servers = {id(s): s for s in runner._SERVERS.values()}
    assert len(servers) == 2 and all(s.proc is not None and not s.ready for s in servers.values())
    launched = runner.zygote_for(runner.worker_env(plain))
    assert launched is not None and launched.proc is not None
    pid = launched.proc.pid
    trace = run_engine(tiny_job(), plain, workdir=tmp_path)
    assert len(trace.outputs[0].output_ids) == 2
    assert launched.ready and launched.proc.pid == pid and run_folders(tmp_path) == []
    for server in servers.values():
        server.stop()


def test_a_transformers_tree_s_run_environment_is_had_without_importing_torch(tmp_path):
    """prestart launches a transformers tree's zygote with the environment its runs get, adapter
    hooks included; asking the hooks must not import the adapter's torch first (seconds before the
    zygote could start). Checked in a fresh interpreter, where nothing has imported torch yet."""
    own = tmp_path / "own"
    (own / "transformers").mkdir(parents=True)
    (own / "transformers" / "__init__.py").write_text("__version__ = '5.0.0'\n")
    code = (
        "import sys; from tools.engines.runner import worker_env; "
        f"env = worker_env({str(own)!r}, engine='transformers'); "
        "print(env['PYTHONPATH'].split(':')[0], 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=DIFFDX_ROOT)
    assert out.stdout.split() == [str(own.resolve()), "False"]


def test_prestart_starts_nothing_when_zygotes_are_off(tmp_path, monkeypatch):
    from tools.engines import runner

    monkeypatch.setenv("DIFFDX_FORKSERVER", "0")
    monkeypatch.setattr(runner, "_SERVERS", {})
    runner.prestart([tree_with(tmp_path, ""), None])
    assert runner._SERVERS == {}


class Noted:
    """Writes `path` when freed."""

    def __init__(self, path):
        self.path = path

    def __del__(self):
        self.path.write_text("freed")


def exit_of_child(path, leave: bool) -> int:
    """A forked child holding a Noted(path), left to its exit (`leave`) or dropped, then ending as a forked
    worker does (forkserver.finish) -> its exit code."""
    from tools.engines.forkserver import finish, leave_to_exit

    pid = os.fork()
    if pid == 0:
        try:
            # this child is a fork of the test process, not of a zygote: the test process's exit handlers (the
            # runner's zygotes shut down) are not its to run — run by `finish`, they stopped every later run's zygote
            atexit._clear()
            held = Noted(path)
            if leave:
                leave_to_exit(held)
            del held
            finish(0)
        finally:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_what_a_worker_leaves_to_its_exit_is_not_freed_object_by_object(tmp_path):
    """A capturing worker leaves its trace to the end of its process (forkserver.leave_to_exit), which a forked
    worker reaches without freeing it: freed record by record, ~1e5 records were time spent by a process about
    to end. Dropped instead, the same object is freed (the control)."""
    left, dropped = tmp_path / "left", tmp_path / "dropped"
    assert exit_of_child(left, leave=True) == 0 and not left.exists()
    assert exit_of_child(dropped, leave=False) == 0 and dropped.read_text() == "freed"


# A tree whose worker's save waits for a file to appear (GO_FILE) before writing the trace: its outputs are out.
SAVE_WAITS = (
    "import os, time\n"
    "import tools.probe.trace as trace_io\n"
    "open(os.environ['PIDS_FILE'], 'w').write(str(os.getpid()))\n"
    "_save = trace_io.save\n"
    "def save(*args, **kwargs):\n"
    "    deadline = time.monotonic() + 120\n"
    "    while not os.path.exists(os.environ['GO_FILE']) and time.monotonic() < deadline:\n"
    "        time.sleep(0.02)\n"
    "    return _save(*args, **kwargs)\n"
    "trace_io.save = save\n"
)


@pytest.fixture
def save_waits(tmp_path, monkeypatch):
    monkeypatch.setenv("PIDS_FILE", str(tmp_path / "pid"))
    monkeypatch.setenv("GO_FILE", str(tmp_path / "go"))
    return tree_with(tmp_path, SAVE_WAITS)


def test_a_run_s_outputs_come_before_its_save_and_its_trace_after(tmp_path, mode, save_waits):
    """EngineRun.outputs: what a reference needs of the target (its tokens, its meta) while the worker still
    writes its trace; result() then joins the worker and gives the whole trace, with the same outputs."""
    started = time.monotonic()
    run = EngineRun(dataclasses.replace(tiny_job(), taps=["logits"]), save_waits, workdir=tmp_path)
    early = run.outputs()
    worker = int((tmp_path / "pid").read_text())
    assert alive(worker) and not (run.dir / "trace" / "trace.json").exists()  # still in its save
    assert len(early.outputs[0].output_ids) == 2 and early.blocks() == []
    time.sleep(0.3)
    (tmp_path / "go").write_text("")
    while not run.ended:
        time.sleep(0.02)
    time.sleep(1.0)  # the caller busy elsewhere (a reference) before it joins: not the run's time
    trace = run.result()
    assert trace.meta["after_outputs_s"] >= 0.3 and trace.meta["wall_s"] < time.monotonic() - started - 0.9
    assert (
        trace.sequences() == early.sequences() and early.meta and {k: trace.meta[k] for k in early.meta} == early.meta
    )
    assert [b.tensor.shape[0] for b in trace.blocks()] == [2] and trace.meta["timing"]["save_s"] > 0
    del trace, run
    gc.collect()
    assert run_folders(tmp_path) == []


def test_a_run_given_up_during_its_save_leaves_no_worker_and_no_folder(tmp_path, mode, save_waits):
    run = EngineRun(tiny_job(), save_waits, workdir=tmp_path)
    run.outputs()
    worker = int((tmp_path / "pid").read_text())
    run.cancel()
    time.sleep(0.5)
    assert not alive(worker) and group_members({worker}) == set()
    assert run_folders(tmp_path) == []
