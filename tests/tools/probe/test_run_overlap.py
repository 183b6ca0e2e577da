"""The probe starts its references on the target's outputs while the target's worker writes its trace
(Prober.run_engines): a target that crashes or hangs *during its save*, a reference already running, is
reported as an engine failure exactly as when the references waited for it, never as a divergence, and
leaves no worker, no reference result and no run folder behind. Real subprocesses, a tiny model."""

from __future__ import annotations

import gc
import tempfile
import time

import pytest

from tests.tools.procs import alive, group_members
from tools.engines import runner
from tools.engines.runner import EngineRunError, spare_core
from tools.probe import prober as prober_module
from tools.probe.prober import Prober
from tools.scenario import from_dict

# The tree's sitecustomize (its worker's start-up) replaces the trace's save: it waits until another run's
# folder holds its job (a reference has started on this run's outputs), notes that, then fails as MODE says.
SAVE_FAILS = (
    "import glob, os, signal, time\n"
    "import tools.probe.trace as trace_io\n"
    "open(os.environ['PIDS_FILE'], 'w').write(str(os.getpid()))\n"
    "def save(trace, out_dir, widest=None):\n"
    "    own = os.path.dirname(os.path.abspath(out_dir))\n"
    "    deadline = time.monotonic() + float(os.environ.get('WAIT_S', '120'))\n"
    "    while time.monotonic() < deadline:\n"
    "        others = [d for d in glob.glob(os.path.dirname(own) + '/diffdx-run-*') if d != own]\n"
    "        if any(os.path.exists(d + '/job.json') for d in others):\n"
    "            open(os.environ['SEEN_FILE'], 'w').write('a reference started')\n"
    "            break\n"
    "        time.sleep(0.02)\n"
    "    print('failing in the save', flush=True)\n"
    "    MODE\n"
    "trace_io.save = save\n"
)


def scenario(engine: str = "tinyserve"):
    """A float32 target: two references (float64 and float32), the first started during the target's save."""
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": engine, "dtype": "float32"},
            "workload": {"requests": [{"prompt_ids": [1, 5, 9, 4], "max_tokens": 3, "sampling": {"ignore_eos": True}}]},
        }
    )


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """Run folders under tmp_path/runs, to be counted; the tree's notes beside them."""
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(runs))
    monkeypatch.setenv("PIDS_FILE", str(tmp_path / "pid"))
    monkeypatch.setenv("SEEN_FILE", str(tmp_path / "seen"))
    monkeypatch.delenv("DIFFDX_KEEP_TEMP", raising=False)
    monkeypatch.setattr(prober_module, "spare_core", lambda: True)  # the overlapped schedule, on any machine
    return runs


def failing_tree(tmp_path, mode: str):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "sitecustomize.py").write_text(SAVE_FAILS.replace("MODE", mode))
    return tree


def left_behind(tmp_path, runs) -> tuple[bool, set[int], list[str]]:
    """(the target's worker alive, its group's members, the run folders left)."""
    gc.collect()
    time.sleep(0.5)
    worker = int((tmp_path / "pid").read_text())
    return alive(worker), group_members({worker}), sorted(p.name for p in runs.glob("diffdx-run-*"))


def test_a_target_crashing_in_its_save_with_a_reference_running_is_a_crash(tmp_path, runs_dir):
    prober = Prober(timeout=300)
    tree = failing_tree(tmp_path, "os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(EngineRunError) as err:
        prober.probe(scenario(), target_source=tree)
    assert (tmp_path / "seen").exists()  # the reference had started on the target's outputs
    assert err.value.kind == "crash" and str(err.value).startswith("tinyserve run failed (exit -11): ")
    assert "failing in the save" in err.value.log
    assert prober._reference_cache == {}  # the references run on a failed target's outputs are dropped
    # a reference still running when the target's failure is seen is given up (killed), one that answered is logged
    assert all(r["role"] == "reference" for r in prober.runs)  # the target never answered
    del err
    assert left_behind(tmp_path, runs_dir) == (False, set(), [])


@pytest.mark.slow
def test_a_target_hanging_in_its_save_with_a_reference_running_is_a_timeout(tmp_path, runs_dir):
    prober = Prober(timeout=40)
    tree = failing_tree(tmp_path, "time.sleep(600)")
    started = time.monotonic()
    with pytest.raises(EngineRunError) as err:
        prober.probe(scenario(), target_source=tree)
    assert (tmp_path / "seen").exists()
    assert err.value.kind == "timeout" and str(err.value) == "tinyserve run timed out after 40s"
    assert "failing in the save" in err.value.log and time.monotonic() - started < 120
    assert prober._reference_cache == {}
    del err
    assert left_behind(tmp_path, runs_dir) == (False, set(), [])


def test_the_overlapped_probe_finds_what_the_joined_runs_find(tmp_path, monkeypatch):
    """The same verdict and every TapStat whether the references start on the target's outputs
    (Prober.probe) or after its worker was joined (its trace in hand), on a target with a real fault."""
    from tests.faults import MLP_DOWN_OFFSET, write_fault
    from tools.probe.prober import compare_traces

    monkeypatch.delenv("DIFFDX_KEEP_TEMP", raising=False)
    monkeypatch.setattr(prober_module, "spare_core", lambda: True)
    sc = scenario("transformers")
    src = write_fault(tmp_path / "tree", MLP_DOWN_OFFSET, "llama", layer=1, delta=0.01)
    overlapped = Prober().probe(sc, target_source=src)
    prober = Prober()
    target = prober.run_target(sc, src)
    teacher, weights = target.sequences(), target.meta.get("weights")
    high = prober.run_reference(sc, sc.reference.dtype, teacher, None, weights=weights)
    low = prober.run_reference(sc, sc.target.dtype, teacher, None, weights=weights)
    joined = compare_traces(sc, target, low, high)
    assert overlapped.first is not None and overlapped.first.tap == "layers.1.mlp.down"
    assert overlapped.summary == joined.summary and overlapped.stats == joined.stats
    assert overlapped.tokens == joined.tokens and overlapped.engine_runs == 3


def test_without_a_spare_core_the_references_wait_for_the_target(tmp_path, runs_dir, monkeypatch):
    """Where the engines' threads hold every core, nothing runs beside the target's save: a target failing in
    its save fails before any reference starts."""
    monkeypatch.setattr(prober_module, "spare_core", lambda: False)
    monkeypatch.setenv("WAIT_S", "1")  # the save waits this long for a reference that must not come
    prober = Prober(timeout=300)
    with pytest.raises(EngineRunError) as err:
        prober.probe(scenario(), target_source=failing_tree(tmp_path, "os.kill(os.getpid(), signal.SIGSEGV)"))
    assert err.value.kind == "crash" and "failing in the save" in err.value.log
    assert not (tmp_path / "seen").exists() and prober.runs == [] and prober._reference_cache == {}
    del err
    assert left_behind(tmp_path, runs_dir) == (False, set(), [])


def test_a_spare_core_is_one_the_engine_threads_leave_idle(monkeypatch):
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert spare_core()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert not spare_core()
    monkeypatch.delenv("OMP_NUM_THREADS")  # torch's default: a thread a core
    assert not spare_core()
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert spare_core()
