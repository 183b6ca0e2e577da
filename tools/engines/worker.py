"""Worker process entry: `python -m tools.engines.worker JOB.json OUT_DIR`, or
`python -m tools.engines.worker --capabilities ENGINE OUT.json` (writes the engine's Capabilities as JSON), or
`python -m tools.engines.worker --encode ENGINE CHECKPOINT TEXTS.json OUT.json` (each text prompt's token count), or
`python -m tools.engines.worker --config-keys ENGINE CHECKPOINT OUT.json` (the config.json keys it reads)."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

from tools.engines.forkserver import leave_to_exit
from tools.engines.funccov import RECORDED_LANGUAGES, function_coverage, has_python_source
from tools.engines.functaps import function_taps
from tools.engines.treepreload import QUIET_THIRD_PARTY, preloaded_coverage
from tools.hypotheses.contracts import contract_for, judge, sampling_context


def wanted(qualname: str, params: tuple[str, ...]) -> bool:
    return contract_for(qualname, params) is not None


def contract_context(engine, job) -> dict:
    """What the contracts need beyond a call's own inputs: the scenario's sampling settings, and what
    the adapter reads from the model (Engine.contract_context, optional: e.g. each layer's window)."""
    extra = getattr(engine, "contract_context", None)
    return {**sampling_context(job.scenario), **(extra(job) if extra is not None else {})}


def quiet_third_party() -> None:
    """No download/loading progress bars or advisory warnings in the run's log: it is shown on failure."""
    for key, value in QUIET_THIRD_PARTY.items():
        os.environ.setdefault(key, value)


def capabilities(engine: str, out_path: str) -> int:
    from tools.engines import UnknownEngineError, get_engine, registry

    adapter = get_engine(engine)
    try:
        declared = adapter.capabilities().to_json()
    except Exception as e:
        if engine in registry():  # a registered adapter raises for the tree it reads: that tree's run says why
            raise
        # a `module:Class` adapter's own fault: one line (exit 2), not a crash the probe would skip past
        raise UnknownEngineError(
            f"engine {engine!r}: its adapter's capabilities() raised {type(e).__name__}: {e}"[:400]
        ) from None
    Path(out_path).write_text(json.dumps(declared))
    return 0


def encode_prompts(engine: str, checkpoint: str, texts_path: str, out_path: str) -> int:
    """The adapter's token count of each text prompt (null when it declares no `encode_prompts`)."""
    from tools.engines import get_engine

    encode = getattr(get_engine(engine), "encode_prompts", None)
    texts = json.loads(Path(texts_path).read_text())
    counts = None if encode is None else [len(ids) for ids in encode(checkpoint, texts)]
    Path(out_path).write_text(json.dumps(counts))
    return 0


def config_keys_read(engine: str, checkpoint: str, out_path: str) -> int:
    """The checkpoint's config.json keys the engine reads (null when its adapter declares no `config_keys_read`)."""
    from tools.engines import get_engine

    read = getattr(get_engine(engine), "config_keys_read", None)
    Path(out_path).write_text(json.dumps(None if read is None else sorted(read(checkpoint))))
    return 0


def native_trees(job) -> dict[str, str]:
    """Python-only evidence the job asks for on a tree that holds no Python source -> why it is
    skipped (an empty record would read as "no function ran"; a skipped one is unknown)."""
    asked = {"coverage": job.coverage_root, "function_checks": job.function_checks}
    return {
        key: f"records Python functions only, and {root} holds no Python source"
        for key, root in asked.items()
        if root and not has_python_source(root)
    }


def pause_collector(job) -> None:
    """Turn Python's cyclic collector off for a run that captures taps, for the rest of its process. Such a run
    holds its records until they are saved, tens of thousands of tensors (117k records for SmolLM2-135M
    generating 2 x 128 tokens), and every full collection traverses all of them: with the collector on,
    a hook's record cost 27-52 us instead of 11, and most of the target run's capture overhead was the
    collector's. The worker is one run's process: measured on that run, the same 12.4k objects of cyclic
    garbage at its end with and without capture (the imports'), and the same peak memory. Plain runs keep it.
    It stays off after the save, the process's last work: turned back on, its first full collection traversed
    every record once more (0.15-0.27 s on that run) for a process about to end."""
    if job.taps != []:
        gc.disable()


def main(job_path: str, out_dir: str) -> int:
    import torch

    from tools.engines import codecache, get_engine
    from tools.engines.protocol import RunJob
    from tools.probe import trace as trace_io
    from tools.probe.checkpoints import cache_root
    from tools.probe.compare import stored_precision

    codecache.install(cache_root() / "bytecode")  # before the tree under test is imported
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    job = RunJob.from_json(json.loads(Path(job_path).read_text()))
    started, started_cpu = time.monotonic(), time.process_time()
    skipped = native_trees(job)  # the recorders see Python frames only: no evidence from a C/C++ tree
    coverage_root = None if "coverage" in skipped else job.coverage_root
    checks_root = None if "function_checks" in skipped else job.function_checks
    engine = get_engine(job.spec.engine)
    pause_collector(job)
    with function_coverage(coverage_root) as covered, function_taps(checks_root, wanted) as calls:
        trace = engine.run(job)
    trace.meta.update({f"{key}_skipped": why for key, why in skipped.items()})
    if coverage_root:
        covered |= preloaded_coverage(coverage_root)  # what ran when a tree zygote imported the tree for us
        trace.meta["coverage"] = sorted(f"{f}:{q}" for f, q in covered)
        trace.meta["coverage_languages"] = list(RECORDED_LANGUAGES)  # other languages: unknown, not unrun
    if checks_root:
        trace.meta["function_checks"] = judge(calls, contract_context(engine, job))
    saving, saving_cpu = time.monotonic(), time.process_time()
    # the outputs first: a caller that needs only them (a reference teacher-forced on the tokens) starts
    # while the rows are written (tools.engines.runner.EngineRun.outputs); it still joins this process
    trace_io.save_outputs(trace, out_dir)
    trace_io.save(trace, out_dir, widest=stored_precision(job.scenario.target.dtype))
    # where the worker's time went, for benchmark.perf (the runner adds start-up and loading), and
    # this process's CPU seconds in each part (on a shared machine, what a change saves shows there)
    timing = {"engine_s": saving - started, "save_s": time.monotonic() - saving}
    timing |= {"engine_cpu_s": saving_cpu - started_cpu, "save_cpu_s": time.process_time() - saving_cpu}
    (Path(out_dir) / "timing.json").write_text(json.dumps(timing))
    leave_to_exit(trace)  # freed with the process, not record by record on the way out
    return 0


if __name__ == "__main__":
    from tools.engines import UnknownEngineError

    quiet_third_party()
    try:
        if sys.argv[1] == "--capabilities":
            sys.exit(capabilities(*sys.argv[2:4]))
        if sys.argv[1] == "--encode":
            sys.exit(encode_prompts(*sys.argv[2:6]))
        if sys.argv[1] == "--config-keys":
            sys.exit(config_keys_read(*sys.argv[2:5]))
        sys.exit(main(*sys.argv[1:3]))
    except UnknownEngineError as e:  # a one-line error, not a traceback, in the caller's message
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
