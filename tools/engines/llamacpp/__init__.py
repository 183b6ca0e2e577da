"""diffdx adapter for llama.cpp (through llama-cpp-python's ctypes bindings, `import llama_cpp`).

Runs in the worker process. The libllama it drives is the one llama_cpp loads: the installed
package's, or the build of a tree under test when LLAMA_CPP_LIB_PATH names its folder (set by
tools/engines/llamacpp/build.py's worker hook). The scenario's checkpoint is converted to GGUF
(gguf_convert.py: the dtype's float type, or the `weights` quant type); taps come from the graph
eval callback (ggml.py reads the nodes, taps.py names them).

Requests are separate sequences (seq_id = request index, positions from 0) in one unified KV
cache, as a llama.cpp server batches them: that is each request run alone, the reference's
semantics (its left padding is undone by its adapter). A step is one llama_decode: step 0
prefills the requests arriving at 0; each later step feeds every running request its last token,
plus the whole prompt of a request arriving then. Every token asks for logits, so every row of
every tap is reported. Greedy only (argmax of the float32 logits, lowest id on ties), stopping at
an end-of-generation token unless `ignore_eos`. Teacher forcing decodes each given sequence whole,
in one step.

Options (OPTIONS): `weights` (q8_0, q4_0, q4_1, q5_0, q5_1: 2-D weights stored quantized; the
reference then loads the dequantized twin), `cache_type` (K/V cache type, default the dtype's:
f32 or f16), `flash_attn` (default false), `n_ubatch` (tokens per graph evaluation; default: the
whole batch), `n_threads` (default 1).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tools.engines.protocol import Capabilities, RunJob, TriggerAxis
from tools.probe.taps import matches, order_key
from tools.probe.trace import TapRecord, Trace
from tools.scenario import EngineSpec, unhonoured_sampling

DTYPES = ("float32", "float16")
CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7}  # ggml_type
OPTIONS = ("weights", "cache_type", "flash_attn", "n_ubatch", "n_threads")
# greedy only: temperature and the cuts pass at their neutral / moot values (tools.scenario.unhonoured_sampling)
HONOURED_SAMPLING = ("ignore_eos", "seed", "logprobs")
FLASH_ATTN = {False: 0, True: 1}  # LLAMA_FLASH_ATTN_TYPE_DISABLED / _ENABLED
LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR: quieter levels are dropped from the worker's log


# Checkpoint config variants (the sweep's config axis): an FFN width that is no multiple of a SIMD register's
# lanes (100: not of 8, 16 or 32 floats), so every vectorized loop over it (the FFN activation, the down
# projection's dot products) ends in its scalar tail; the presets' widths are powers of two and never reach
# one. Rows of 100 do not split into quant blocks, so the down projection stays F32 under q4_0 / q8_0.
CONFIG_AXES = (
    TriggerAxis(
        "odd_widths",
        {},
        "an FFN width of 100 (intermediate_size): no multiple of a SIMD register's lanes, vector loops run their tails",
        "odd tensor widths",
        ("intermediate size", "intermediate_size", "odd shape", "odd size", "not a multiple", "tail"),
        model={"intermediate_size": 100},
    ),
)

# Features that hide bugs until they are on, cheapest first (tools/reproduce.py switches them on).
TRIGGER_AXES = (
    TriggerAxis(
        "small_ubatch",
        {"n_ubatch": 8},
        "ubatches of 8 tokens, long prompt: one decode spans several graph evaluations",
        "ubatch splitting",
        ("ubatch", "n ubatch", "batch size", "batch split", "split"),
        "long_prompt",
    ),
    TriggerAxis(
        "flash_attn",
        {"flash_attn": True},
        "flash attention on",
        "flash attention",
        ("flash attn", "flash attention", "fattn", "fa on"),
    ),
    TriggerAxis(
        "q8_0",
        {"weights": "q8_0"},
        "weights stored as q8_0",
        "q8_0 weights",
        ("q8 0", "q8", "8 bit", "int8"),
        alone=True,
    ),
    TriggerAxis(
        "q4_0",
        {"weights": "q4_0"},
        "weights stored as q4_0",
        "q4_0 weights",
        ("q4 0", "q4", "4 bit", "int4"),
        alone=True,
    ),
)


def check_spec_options(spec: EngineSpec) -> None:
    """One-line ValueError for what this adapter cannot run and tap."""
    from tools.engines.llamacpp.gguf_convert import QUANT_TYPES

    if spec.dtype not in DTYPES:
        raise ValueError(f"llama.cpp runs GGUF float types {', '.join(DTYPES)}; got dtype {spec.dtype!r}")
    unknown = sorted(set(spec.options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"llama.cpp adapter: unknown options {unknown}; known: {', '.join(OPTIONS)}")
    weights = spec.options.get("weights")
    if weights is not None and weights not in QUANT_TYPES:
        raise ValueError(f"llama.cpp weights {weights!r}: known {', '.join(QUANT_TYPES)} (gguf cannot write K-quants)")
    cache = spec.options.get("cache_type")
    if cache is not None and cache not in CACHE_TYPES:
        raise ValueError(f"llama.cpp cache_type {cache!r}: known {', '.join(CACHE_TYPES)}")


def check_sampling(sampling: dict) -> None:
    """The run's own guard, for a job that did not pass through preflight (which refuses the same keys)."""
    ignored = unhonoured_sampling(sampling, HONOURED_SAMPLING)
    if ignored:
        raise ValueError(f"llama.cpp adapter decodes greedily: sampling {ignored} is not supported")


@dataclass
class Plan:
    """One request's tokens: what is fed, what was produced, and whether it is done."""

    prompt: list[int]
    max_tokens: int
    arrival: int
    ignore_eos: bool
    forced: list[int] | None = None  # teacher forcing: the rest of the sequence
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


class LlamaCppEngine:
    name = "llama.cpp"
    package = ""  # the tree under test is a C++ source tree, built by build.py, not an importable package

    def capabilities(self) -> Capabilities:
        from tools.engines.llamacpp.gguf_convert import ARCHS, NO_SLIDING_WINDOW
        from tools.engines.llamacpp.taps import TAPS

        return Capabilities(
            taps=TAPS,
            teacher_forcing=True,
            dtypes=DTYPES,
            trigger_axes=TRIGGER_AXES,
            config_axes=CONFIG_AXES,
            package=self.package,
            accepted_options=OPTIONS,
            op_checks=True,  # no native twins: the kernel drill-down judges each ggml op (opcheck.py)
            sampling_keys=HONOURED_SAMPLING,
            archs=tuple(ARCHS),
            unwindowed_archs=NO_SLIDING_WINDOW,
        )

    def check_options(self, spec: EngineSpec, device: str = "cpu") -> None:
        check_spec_options(spec)
        if device != "cpu":
            raise ValueError(f"llama.cpp adapter runs on cpu only; got device {device!r}")

    def run(self, job: RunJob) -> Trace:
        from tools.engines.llamacpp.session import Session

        check_spec_options(job.spec)
        for r in job.scenario.requests:
            check_sampling(r.sampling)
        with Session(job) as session:
            plans = session.plans()
            session.drive(plans)
            kept = [r for r in session.records if matches(r.name, job.taps)]
            records = sorted(kept, key=lambda r: (r.step, order_key(r.name), r.request))  # a Trace's order
            outputs = [session.request_output(p) for p in plans]
            meta = session.meta()
        return Trace(engine=self.name, dtype=job.spec.dtype, outputs=outputs, records=records, meta=meta)


def tap_record(tap: str, step: int, request: int, positions: list[int], rows: np.ndarray) -> TapRecord:
    return TapRecord(tap, step, request, list(positions), torch.from_numpy(np.array(rows, dtype=np.float32)))


def c_int_array(values: list[int]):
    return (ctypes.c_int32 * len(values))(*values)


def library_file() -> str:
    """The libllama this process mapped (the build under test), for the run's record."""
    from tools.engines.llamacpp.ggml import lib_dir, mapped_library

    return str(mapped_library("libllama") or Path(lib_dir()) / "libllama.so")


def worker_env(tree: str | Path | None) -> dict[str, str]:
    """The runner's hook (tools.engines.worker_vars): a worker running a tree under test loads that
    tree's own build (tools/engines/llamacpp/build.py, imported lazily: `python -m` of it stays clean)."""
    from tools.engines.llamacpp.build import worker_env as build_worker_env

    return build_worker_env(tree)
