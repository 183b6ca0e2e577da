"""Engine conformance: every registered engine passes the same checks, in real worker processes.

The gate for adding an engine (CONTRIBUTING.md): canonical taps in execution order, teacher
forcing that really forces, a crash that is an EngineRunError (never a crash of the caller), and
capabilities resolved in the worker, against the tree it imports. The built-ins run through it,
and so does a toy third engine kept in one file outside the package (tests/tools/toy_engine.py),
registered the way a user registers theirs: `module:Class` on $PYTHONPATH, or an entry point.
"""

import shutil
import sys
from pathlib import Path

import pytest
import torch

from tools.engines import UnknownEngineError, engine_capabilities, get_engine, registry
from tools.engines.protocol import Capabilities, RunJob
from tools.engines.runner import EngineRunError, run_engine
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.taps import HEAD_TAPS, LAYER_TAPS, matches, order_key, split
from tools.scenario import from_dict

TOY_DIR = Path(__file__).resolve().parents[1]  # holds toy_engine.py; not importable by default
TOY = "toy_engine:ToyEngine"
# The built-ins' own test files cover them in the fast subset; here they run with `-m slow`.
ENGINES = [pytest.param(name, marks=pytest.mark.slow) for name in sorted(registry())] + [TOY]


@pytest.fixture(autouse=True)
def toy_on_worker_path(monkeypatch):
    """The toy adapter is importable in workers (via $PYTHONPATH), like a user's own adapter."""
    monkeypatch.setenv("PYTHONPATH", str(TOY_DIR))


def scenario(engine: str):
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": engine, "dtype": "float32"},
            "workload": {
                "requests": [
                    {"prompt_ids": [5, 17, 42, 99, 260, 301, 7], "max_tokens": 3, "sampling": {"ignore_eos": True}},
                    {"prompt_ids": [9, 8, 7, 6], "max_tokens": 3, "sampling": {"ignore_eos": True}},
                ]
            },
        }
    )


def job(engine: str, **kw) -> RunJob:
    sc = scenario(engine)
    return RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)), **kw)


@pytest.fixture(scope="module")
def generated():
    """One generate run per engine, shared by the checks."""
    return {}


def trace_of(engine: str, generated: dict):
    if engine not in generated:
        generated[engine] = run_engine(job(engine), timeout=300)
    return generated[engine]


@pytest.mark.parametrize("engine", ENGINES)
def test_taps_are_canonical_and_in_execution_order(engine, generated):
    trace = trace_of(engine, generated)
    assert [len(o.output_ids) for o in trace.outputs] == [3, 3]
    names = trace.taps()
    assert "embed" in names and "logits" in names and "layers.0.out" in names
    for name in names:
        layer, tap = split(name)
        assert tap in (LAYER_TAPS if layer is not None else ("embed",) + HEAD_TAPS), f"{engine}: {name}"
    keys = [(r.step, order_key(r.name), r.request) for r in trace.records]
    assert keys == sorted(keys), f"{engine}: records are not in (step, execution order, request) order"
    for r in trace.records:
        assert r.tensor.dtype in (torch.float32, torch.float64) and r.tensor.ndim == 2
        assert r.tensor.shape[0] == len(r.positions) and r.request in (0, 1)
    prompt_rows = {p for r in trace.records if r.name == "embed" and r.request == 0 for p in r.positions}
    assert set(range(7)) <= prompt_rows


@pytest.mark.parametrize("engine", ENGINES)
def test_teacher_forcing_reruns_the_given_tokens(engine, generated):
    sequences = trace_of(engine, generated).sequences()
    # change a generated token so that the engine's own choice cannot pass for the teacher's
    teacher = [seq[:-2] + [(seq[-2] + 1) % 512, seq[-1]] for seq in sequences]
    forced = run_engine(job(engine, teacher=teacher), timeout=300)
    assert forced.sequences() == teacher
    for r, seq in enumerate(teacher):
        fed = {p for rec in forced.records if rec.name == "embed" and rec.request == r for p in rec.positions}
        assert set(range(len(seq) - 1)) <= fed, f"{engine}: request {r} did not run every teacher position"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_crash_is_an_engine_run_error(engine, tmp_path):
    (tmp_path / "config.json").write_text("{ this is not json")
    sc = scenario(engine)
    with pytest.raises(EngineRunError) as e:
        run_engine(RunJob(sc, sc.target, str(tmp_path)), timeout=300)
    assert e.value.kind == "crash" and e.value.log


@pytest.mark.parametrize("engine", ENGINES)
def test_capabilities_are_resolved_in_the_worker(engine, generated):
    caps = engine_capabilities(engine)
    assert isinstance(caps, Capabilities) and "float32" in caps.dtypes and 1 in caps.tp_sizes
    assert all(isinstance(k, str) for k in caps.kernels)
    assert engine_capabilities(engine) is caps  # one worker call per (engine, tree) in a run
    uncovered = [t for t in trace_of(engine, generated).taps() if not matches(t, caps.taps)]
    assert not uncovered, f"{engine} reports taps its capabilities do not declare: {uncovered}"


@pytest.mark.parametrize("engine", ENGINES)
def test_trigger_axes_make_runnable_variants(engine):
    """Each trigger axis the adapter declares names a known workload, words an issue can use, and
    options the engine takes; the trigger search turns it into a valid scenario."""
    from tools.engines.protocol import check_spec
    from tools.reproduce import WORKLOADS, variants

    caps, sc = engine_capabilities(engine), scenario(engine)
    for axis in caps.trigger_axes:
        assert axis.workload in WORKLOADS and axis.words and axis.label and axis.options, axis
        assert set(caps.canonical_options(axis.options)) == set(axis.options), "axes use the engine's own names"
    by_name = {v.name: v for v in variants(sc)}
    for axis in caps.trigger_axes:
        variant = by_name[axis.name].apply(sc, 512)
        assert from_dict(variant.to_dict()) == variant
        assert axis.options.items() <= variant.target.options.items()
        check_spec(variant.target)
        assert not by_name[axis.name].features[0].exercised(sc) and by_name[axis.name].features[0].exercised(variant)


def test_the_toy_adapter_is_found_only_where_the_worker_looks():
    """Registration by `module:Class` resolves in the worker: this process cannot import it."""
    assert str(TOY_DIR) not in sys.path and "toy_engine" not in sys.modules
    with pytest.raises(UnknownEngineError, match="no module 'toy_engine'"):
        get_engine(TOY)
    assert engine_capabilities(scenario(TOY).target).taps == ("embed", "layers.*", "final_norm", "logits")


def test_unknown_engine_names_list_the_known_ones():
    with pytest.raises(UnknownEngineError, match="known engines: llama.cpp, refmodel, tinyserve, transformers"):
        get_engine("vllm")
    with pytest.raises(EngineRunError, match="unknown engine 'vllm'"):
        run_engine(job("vllm"), timeout=120)


def test_an_entry_point_registers_an_engine_by_name(tmp_path, monkeypatch):
    """An installed package registers `[project.entry-points."diffdx.engines"] toy = …`; its
    dist-info is all the registry reads."""
    shutil.copy(TOY_DIR / "toy_engine.py", tmp_path / "toy_engine.py")
    info = tmp_path / "diffdx_toy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: diffdx-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[diffdx.engines]\ntoy = toy_engine:ToyEngine\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert registry()["toy"] == TOY
    trace = run_engine(job("toy"), timeout=300)
    assert trace.engine == "toy" and trace.meta["teacher_forced"] is False


def test_capabilities_come_from_the_tree_under_test(tmp_path):
    """Regression (issue 15): the kernel list was read from the bundled tinyserve imported in the
    orchestrating process, not from the fork being diagnosed."""
    from tools.engines.runner import DIFFDX_ROOT

    fork = tmp_path / "fork"
    shutil.copytree(DIFFDX_ROOT / "benchmark" / "subjects" / "tinyserve", fork)
    with open(fork / "tinyserve" / "ops" / "__init__.py", "a") as f:
        f.write("\nKERNELS = KERNELS + ['fork_only_kernel']\n")
    assert "fork_only_kernel" in engine_capabilities("tinyserve", fork).kernels
    assert "fork_only_kernel" not in engine_capabilities("tinyserve").kernels


def test_an_adapter_in_the_tree_under_test_answers_for_it(tmp_path):
    """A fork that carries its own adapter (the toy engine, declaring a kernel) is asked, not the
    copy on the caller's path: the tree comes first on the worker's path."""
    fork = tmp_path / "fork"
    fork.mkdir()
    source = (TOY_DIR / "toy_engine.py").read_text()
    (fork / "toy_engine.py").write_text(source.replace("kernels=()", "kernels=('fork_only_kernel',)"))
    assert engine_capabilities(TOY, fork).kernels == ("fork_only_kernel",)
    assert engine_capabilities(TOY).kernels == ()
