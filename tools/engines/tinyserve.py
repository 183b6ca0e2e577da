"""diffdx adapter for tinyserve, the benchmark's subject engine (docs/design.md §4, §6).

Runs in the worker process, whose PYTHONPATH starts with the tree under test, so
`import tinyserve` inside `run()` loads the (possibly buggy) worktree. Taps come
from forward hooks on tinyserve's modules (registered in a context manager,
always removed); tinyserve's forward context says which request and position
each packed row belongs to, so the paged/packed layout and the fused qkv /
gate_up projections are undone here.

Module -> tap map (per layer `layers.{i}.` prefix; `<prev>.out` is the previous
layer's `out`, produced by this layer's fused residual add):

    input_layernorm           attn_norm (normed), layers.{i-1}.out (residual)
    self_attn.qkv_proj        attn.q | attn.k | attn.v (fused output split)
    self_attn.rotary_emb      attn.q_rot, attn.k_rot
    self_attn.attn            attn.out
    self_attn.o_proj          attn.o_proj
    post_attention_layernorm  llama: mlp_norm, resid_mid  | gemma2: attn.post_norm
    pre_feedforward_layernorm gemma2: mlp_norm, resid_mid
    mlp.gate_up_proj          mlp.gate | mlp.up
    mlp.act_fn                mlp.act
    mlp.down_proj             mlp.down
    post_feedforward_layernorm gemma2: mlp.post_norm
    model.norm                final_norm, layers.{L-1}.out
    logits_processor          logits (rows of sampling sequences only)
    sampler.adjuster          sampler.logits;  sampler: sampler.probs, sampler.token

Tensor parallelism (option tensor_parallel_size): rank 0 is the engine's process and
records every tap; the other ranks record the column-parallel taps (COLUMN_PARALLEL_TAPS:
their heads / channels) through the runner's call_all_ranks, and each such tap is put
back together by concatenating the ranks' features in rank order (rank r holds heads
r*H/tp.., so that is the canonical layout). Row-parallel outputs (o_proj, down), the
embedding and the logits are read after their all-reduce / gather, on rank 0.

Tensor replacement (RunJob.replace, tools/probe/replace.py): the same hooks write reference rows
back into the module output the tap is read from (`write_output`, the inverse of
`read_output`); replacing a fused norm's residual recomputes its normed rows from it, so
`layers.{i}.out` and `resid_mid` can be injected although no module returns them alone.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from tools.engines.injection import Injection
from tools.engines.protocol import Capabilities, RunJob, TriggerAxis
from tools.engines.recorder import HookRecorder, hooks_held
from tools.probe.taps import HEAD_TAPS, matches, split
from tools.probe.trace import RequestOutput, TapRecord, Trace
from tools.scenario import EngineSpec

SUBJECT_ROOT = Path(__file__).resolve().parents[2] / "benchmark" / "subjects" / "tinyserve"
OPTION_ALIASES = {
    "prefix_caching": "enable_prefix_caching",
    "chunked_prefill": "enable_chunked_prefill",
    "num_gpu_blocks": "num_kv_blocks",
}
MAX_STEPS = 100_000
# Features that hide bugs until they are on, cheapest first (tools/reproduce.py switches them on).
TRIGGER_AXES = (
    TriggerAxis(
        "prefix_caching",
        {"enable_prefix_caching": True},
        "prefix caching on, later requests share a 36-token prefix",
        "prefix caching",
        ("prefix", "cache hit", "cached prompt", "shared prompt"),
        "shared_prefix",
    ),
    TriggerAxis(
        "chunked_prefill",
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 16},
        "chunked prefill with a 16-token budget, long prompt",
        "chunked prefill",
        ("chunk",),
        "long_prompt",
    ),
    TriggerAxis(
        "small_blocks",
        {"block_size": 4},
        "KV blocks of 4 tokens, long prompt",
        "small KV blocks",
        ("block", "paged", "page size"),
        "long_prompt",
    ),
    TriggerAxis(
        "speculative",
        {"speculative": "ngram", "num_speculative_tokens": 3},
        "n-gram speculative decoding, 3 tokens proposed per step",
        "speculative decoding",
        ("speculat", "draft model", "ngram", "n gram", "prompt lookup", "rollback"),
        "long_prompt",
    ),
    # weight-only quantization: one scheme at a time, and tensor parallelism refuses it
    TriggerAxis(
        "int8",
        {"quantization": "int8"},
        "int8 weight-only quantization",
        "int8 quantization",
        ("int8", "8 bit"),
        alone=True,
    ),
    # groups of 16, not the engine's default 32: checkpoints ship their own group size (GPTQ / AWQ: 128, not
    # a reader's default), and a group size that is dropped on the way to the kernel shows only off the default
    TriggerAxis(
        "int4",
        {"quantization": "int4", "quant_group_size": 16},
        "int4 weight-only quantization, groups of 16 columns (not the engine's default 32)",
        "int4 quantization",
        ("int4", "4 bit", "nibble", "group size"),
        alone=True,
    ),
    TriggerAxis(
        "tensor_parallel",
        {"tensor_parallel_size": 2},
        "tensor parallelism over 2 ranks",
        "tensor parallelism",
        ("tensor parallel", "tp=2", "tp 2", "tp size", "sharded", "all reduce"),
        alone=True,
    ),
    # A pool of 6 blocks of 24 tokens: each request of the sweep's workloads fits (the long prompt and
    # its decode take all 6), the staggered requests together do not, so requests wait, get preempted and
    # recomputed, and cached prefix blocks are evicted and reused. Blocks of 24, not a power of two (hybrid
    # models' pools size blocks to the state they page): a block edge that is no kernel tile's edge. Alone:
    # blocks of 4 would not fit.
    TriggerAxis(
        "kv_pool",
        {"num_kv_blocks": 6, "block_size": 24, "enable_prefix_caching": True},
        "a KV pool of 6 blocks of 24 with prefix caching: preemption, eviction and block reuse",
        "a small KV pool",
        ("preempt", "evict", "kv pool", "num kv blocks", "num gpu blocks", "out of blocks", "free blocks"),
        "shared_prefix",
        alone=True,
    ),
)
# torch.compile of the model forward, in trees whose Config has `compile` (capabilities() asks the
# tree under test): aot_eager traces and partitions the graph as inductor does, without a C compiler.
COMPILE_AXIS = TriggerAxis(
    "compile",
    {"compile": True, "compile_backend": "aot_eager"},
    "the model forward under torch.compile (aot_eager backend)",
    "torch.compile",
    ("compile", "compiled", "inductor", "dynamo", "cuda graph"),
    alone=True,
)

# Checkpoint config variants users ship that tinyserve reads (the sweep's model-config axis), as
# [model] keys for the checkpoint factory. Rope scaling as hub checkpoints write it (legacy
# `rope_scaling` + `rope_theta`), sized for the tiny models' 1024 positions: the scaled bands and
# the pretraining length fall inside the sweep's prompts, as 8k-32k do inside real ones.
_LEGACY_ROPE = ("rope_parameters",)  # transformers-4 configs: no rope_parameters, rope_theta top-level
CONFIG_AXES = (
    TriggerAxis(
        "rope_linear",
        {},
        "linear rope scaling, factor 2 (legacy rope_scaling with `type`)",
        "linear rope scaling",
        ("linear", "rope scaling", "position interpolation"),
        model={
            "omit_keys": _LEGACY_ROPE,
            "config_json": {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
        },
    ),
    # served as it is meant to be: max_model_len at twice max_position_embeddings (the context the
    # scaling exists for), prompts within the pretraining length, where it must be plain rope. A 128-token
    # pretraining length (as 2k-4k is to real prompts): a batch's rows together pass it while each request
    # stays within it, so a table sized by the forward's row count rather than its positions shows
    TriggerAxis(
        "rope_dynamic",
        {"max_model_len": 256},
        "dynamic NTK rope scaling, factor 2 over a 128-token pretraining length, max_model_len twice it,"
        " prompts within it (a batch's rows together past it)",
        "dynamic NTK rope scaling",
        ("dynamic", "ntk"),
        model={
            "max_position_embeddings": 128,
            "omit_keys": _LEGACY_ROPE,
            "config_json": {"rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
        },
        # the only rope computed at run time from the sequence (the others are fixed at load): what an engine
        # path caches or traces (a compiled graph, a fused kernel's table) can freeze it, so it meets every
        # feature set in every dtype, float32 included, where an angle wrong by the scaling shows below the noise
        crossed=("dtype", "features"),
    ),
    TriggerAxis(
        "rope_yarn",
        {},
        "YaRN rope scaling, factor 4 over a 256-token pretraining length (Qwen2.5 style)",
        "YaRN rope scaling",
        ("yarn",),
        model={
            "omit_keys": _LEGACY_ROPE,
            "config_json": {
                "rope_theta": 1000000.0,
                "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
            },
        },
    ),
    TriggerAxis(
        "rope_llama3",
        {},
        "llama3 rope scaling, factor 8 over a 128-token pretraining length (Llama 3.1 style)",
        "llama3 rope scaling",
        ("llama3", "llama 3.1", "rope scaling"),
        model={
            "omit_keys": _LEGACY_ROPE,
            "config_json": {
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 128,
                },
            },
        },
    ),
    TriggerAxis(
        "legacy_keys",
        {},
        "a transformers-4 config: rms_norm_eps 1e-5, top-level rope_theta 1e6, no layer_types; gemma2 with the"
        " legacy hidden_act 'gelu' beside hidden_activation",
        "legacy config keys",
        ("legacy", "older config", "rms_norm_eps", "eps"),
        model={
            "rms_norm_eps": 1e-5,
            "omit_keys": (*_LEGACY_ROPE, "layer_types"),
            # Qwen2's theta, not the reader's default: a reader that drops a top-level theta shows
            "config_json": {"rope_theta": 1000000.0},
            # Gemma exports carry the Gemma 1 `hidden_act` ("gelu", exact) next to `hidden_activation`
            # (tanh approximation), which transformers reads: a reader taking the old key shows once MLP
            # inputs are of order 1 (at the tiny models' init 0.02 both gelus agree to rounding)
            "by_arch": {"gemma2": {"initializer_range": 0.2, "config_json": {"hidden_act": "gelu"}}},
        },
    ),
    TriggerAxis(
        "keys_omitted",
        {},
        "optional config keys left out (eps, rope, biases, tying, layer types): their defaults",
        "config keys left to defaults",
        ("default", "missing key", "config key"),
        model={
            "omit_keys": (
                *_LEGACY_ROPE,
                "rms_norm_eps",
                "attention_bias",
                "mlp_bias",
                "tie_word_embeddings",
                "layer_types",
            )
        },
    ),
    TriggerAxis(
        "tied_embeddings",
        {},
        "lm_head tied to the embedding (Llama 3.2 1B, Qwen2.5 0.5B style)",
        "tied embeddings",
        ("tied", "tie word embeddings", "lm head"),
        model={"tie_word_embeddings": True},
        archs=("llama", "qwen2", "mistral"),
    ),
    TriggerAxis(
        "untied_head",
        {},
        "a separate lm_head on an arch whose exports usually tie it (Gemma 2 fine-tunes saved untied)",
        "an untied lm_head",
        ("untied", "tie word embeddings", "lm head", "lm_head"),
        model={"tie_word_embeddings": False},
        archs=("gemma2",),
    ),
    TriggerAxis(
        "softcap_engaged",
        {},
        "soft-capping that bites: caps at the tiny model's own score and logit scale (init range 0.2)",
        "logit soft-capping",
        ("softcap", "soft cap", "soft-capping", "capping"),
        model={"attn_logit_softcapping": 4.0, "final_logit_softcapping": 4.0, "initializer_range": 0.2},
        archs=("gemma2",),
    ),
    TriggerAxis(
        "gqa3_head_dim_32",
        {},
        "6 query heads per 2 KV heads, head_dim 32 while hidden/heads is 16, rope_theta 1e6 (not the default)",
        "grouped-query attention with a wide head_dim",
        ("head dim", "head_dim", "gqa", "grouped query", "kv heads", "num key value heads"),
        # the geometry of Gemma 7B / Qwen2 checkpoints, written as transformers 5 does (rope_parameters)
        model={
            "hidden_size": 96,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "rope_theta": 1000000.0,
        },
    ),
    # the tiny models' init 0.02 leaves attention nearly uniform and activations near 0, where errors
    # in rope angles, softmax or activation approximations barely move the output; trained weights do not
    TriggerAxis(
        "trained_scale",
        {},
        "weights at a trained model's scale (init range 0.2): peaked attention, activations of order 1",
        "trained-scale weights",
        ("precision", "longer prompts", "position", "activation"),
        model={"initializer_range": 0.2},
    ),
    # Exports of models trained with biases: on q/k/v and o_proj (attention_bias), on llama also on the MLP's
    # projections (mlp_bias). The row-parallel ones (o_proj, down_proj) follow a partial sum, so under tensor
    # parallelism one rank adds them; the presets have none (qwen2's bias is on q/k/v only), so a sharding
    # or fusing rule for them never runs
    TriggerAxis(
        "biases",
        {},
        "attention biases on q/k/v and o_proj (attention_bias); on llama MLP biases too (mlp_bias)",
        "attention and MLP biases",
        ("bias", "attention_bias", "mlp_bias"),
        model={"attention_bias": True, "by_arch": {"llama": {"mlp_bias": True}}},
        archs=("llama", "gemma2"),
    ),
    # Trained LLMs carry a few hidden channels tens to hundreds of times the rest into their MLPs (the
    # outlier features LLM.int8 handles apart); the tiny models' inputs are all of one scale. Here one
    # channel in 16 of every MLP input is 200 times the rest, attention inputs unchanged: integer and
    # half-precision sums in the MLP come near their range, where a bug-free float16 path still holds
    TriggerAxis(
        "activation_outliers",
        {},
        "outlier features: one hidden channel in 16 of every MLP input 200 times the rest, attention as is",
        "activation outliers",
        ("outlier", "overflow", "large activations"),
        model={"mlp_input_outliers": 200.0},
        crossed=("dtype", "features"),  # a sum's range: a precision and a code path (a quantized matmul, ...)
    ),
    # Qwen2 exports slide only with use_sliding_window, and then only the layers from max_window_layers up
    # (transformers' reading, which the export's layer_types records): here the top one of two
    TriggerAxis(
        "window_20",
        {},
        "a 20-token sliding window: its edge inside a 16-token KV block; qwen2 with use_sliding_window and"
        " max_window_layers 1",
        "sliding window size",
        ("window", "sliding"),
        model={
            "sliding_window": 20,
            "by_arch": {"qwen2": {"use_sliding_window": True, "max_window_layers": 1}},
        },
        archs=("mistral", "gemma2", "qwen2"),
    ),
)

_LLAMA_LAYER = (
    ("input_layernorm", (("attn_norm", "normed"), ("<prev>.out", "residual"))),
    ("self_attn.qkv_proj", (("attn.q", "shard0"), ("attn.k", "shard1"), ("attn.v", "shard2"))),
    ("self_attn.rotary_emb", (("attn.q_rot", "item0"), ("attn.k_rot", "item1"))),
    ("self_attn.attn", (("attn.out", "tensor"),)),
    ("self_attn.o_proj", (("attn.o_proj", "tensor"),)),
    ("post_attention_layernorm", (("mlp_norm", "normed"), ("resid_mid", "residual"))),
    ("mlp.gate_up_proj", (("mlp.gate", "shard0"), ("mlp.up", "shard1"))),
    ("mlp.act_fn", (("mlp.act", "tensor"),)),
    ("mlp.down_proj", (("mlp.down", "tensor"),)),
)
_GEMMA2_LAYER = tuple(h for h in _LLAMA_LAYER if h[0] != "post_attention_layernorm") + (
    ("post_attention_layernorm", (("attn.post_norm", "tensor"),)),
    ("pre_feedforward_layernorm", (("mlp_norm", "normed"), ("resid_mid", "residual"))),
    ("post_feedforward_layernorm", (("mlp.post_norm", "tensor"),)),
)
LAYER_HOOKS = {"llama": _LLAMA_LAYER, "mistral": _LLAMA_LAYER, "qwen2": _LLAMA_LAYER, "gemma2": _GEMMA2_LAYER}
# (module path from the model runner, rows, [(tap, reader)])
GLOBAL_HOOKS = (
    ("model.model.embed_tokens", "tokens", (("embed", "tensor"),)),
    ("model.model.norm", "tokens", (("final_norm", "normed"), ("<last>.out", "residual"))),
    ("model.logits_processor", "samples", (("logits", "tensor"),)),
    ("sampler.adjuster", "samples", (("sampler.logits", "tensor"),)),
    ("sampler", "samples", (("sampler.probs", "probs"), ("sampler.token", "token"))),
)


COLUMN_PARALLEL_TAPS = (
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.q_rot",
    "attn.k_rot",
    "attn.out",
    "mlp.gate",
    "mlp.up",
    "mlp.act",
)


class ReadRecorder(dict):
    """A config dict that notes which keys were looked up."""

    def __init__(self, data: dict):
        super().__init__(data)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def __iter__(self):
        self.read.update(super().keys())
        return super().__iter__()

    def keys(self):
        self.read.update(super().keys())
        return super().keys()

    def items(self):
        self.read.update(super().keys())
        return super().items()


def import_tinyserve():
    """The tree under test if it is on the path, else the pristine subject beside diffdx.

    Only a tree with no tinyserve at all falls back: a tree whose own import fails (a broken
    fork, a bad commit in bisection) must fail the run, never be replaced by the bundled copy
    (regression, issue 16: that probed the pristine subject and reported "agree")."""
    try:
        import tinyserve
    except ModuleNotFoundError as e:
        if e.name != "tinyserve":
            raise
        sys.path.insert(0, str(SUBJECT_ROOT))
        import tinyserve
    return tinyserve


# Taps where reference rows can be injected (RunJob.replace): every tap read from a module output.
# A fused norm's residual is replaced together with the normed rows recomputed from it.
REPLACEABLE = ("embed", "layers.*", "final_norm", "logits", "sampler.logits")


def read_output(output, reader: str, module) -> torch.Tensor | None:
    """One hook output -> the [rows, features] tensor a tap wants (None: not produced here)."""
    if reader == "tensor":
        return output
    if reader == "normed":
        return output[0] if isinstance(output, tuple) else output
    if reader == "residual":
        return output[1] if isinstance(output, tuple) else None
    if reader.startswith("item"):
        return output[int(reader[4:])]
    if reader.startswith("shard"):
        return output.split(module.output_sizes, dim=-1)[int(reader[5:])]
    if reader == "probs":
        return output.probs
    if reader == "token":
        return output.sampled_token_ids.unsqueeze(1)
    raise ValueError(f"unknown tap reader {reader!r}")


def write_output(output, reader: str, module, new: torch.Tensor):
    """The inverse of read_output: `output` with the tap's tensor replaced by `new` (same shape)."""
    if reader == "tensor" or (reader == "normed" and not isinstance(output, tuple)):
        return new
    if reader == "normed":
        return (new, *output[1:])
    if reader == "residual":
        # the fused norm's normed rows were computed from the old residual: recompute the changed ones
        changed = (new != output[1]).reshape(new.shape[0], -1).any(-1)
        normed = torch.where(changed.view(-1, *[1] * (new.dim() - 1)), module.forward(new), output[0])
        return (normed, new, *output[2:])
    if reader.startswith("item"):
        i = int(reader[4:])
        return (*output[:i], new, *output[i + 1 :])
    if reader.startswith("shard"):
        i = int(reader[5:])
        start = sum(module.output_sizes[:i])
        fused = output.clone()
        fused[..., start : start + module.output_sizes[i]] = new
        return fused
    raise ValueError(f"tap reader {reader!r} cannot be replaced")


class TapRecorder(HookRecorder):
    """Forward hooks that copy canonical taps out of a running tinyserve engine, and inject
    reference rows at the taps an Injection names (tensor replacement); tinyserve's forward
    context says which request and position each packed row is."""

    def __init__(
        self,
        runner,
        arch: str,
        num_layers: int,
        patterns: list[str] | None,
        out_dtype: torch.dtype,
        inject: Injection | None = None,
    ):
        super().__init__(patterns, inject, out_dtype)
        self.runner = runner
        self.hooks = self._hook_plan(arch, num_layers)
        self._forward_context = import_tinyserve().forward_context.get_forward_context

    def _hook_plan(self, arch: str, num_layers: int) -> list[tuple[str, str, list]]:
        plan: list[tuple[str, str, list]] = []
        for i in range(num_layers):
            for path, taps in LAYER_HOOKS[arch]:
                named = [(self._layer_tap(i, t, num_layers), r) for t, r in taps]
                plan.append((f"model.model.layers.{i}.{path}", "tokens", [(t, r) for t, r in named if t]))
        for path, rows, taps in GLOBAL_HOOKS:
            named = [(t.replace("<last>", f"layers.{num_layers - 1}"), r) for t, r in taps]
            plan.append((path, rows, named))
        return [
            (p, rows, [(t, r) for t, r in taps if self.touches(t)])
            for p, rows, taps in plan
            if any(self.touches(t) for t, _ in taps)
        ]

    @staticmethod
    def _layer_tap(i: int, tap: str, num_layers: int) -> str | None:
        if tap == "<prev>.out":
            return f"layers.{i - 1}.out" if i > 0 else None
        return f"layers.{i}.{tap}"

    def _hook(self, rows: str, taps: list) -> Callable[..., object]:
        def hook(module, inputs, output):
            ctx, given = self._forward_context(), output
            # injections first (a residual's renormed rows are read below), residuals before the
            # normed rows computed from them, so an injected normed tap is not recomputed over
            for tap, reader in sorted(taps, key=lambda t: t[1] != "residual"):
                if self.inject is not None and self.inject.wants(tap):
                    output = self._inject(ctx, tap, rows, reader, module, output)
            for tap, reader in taps:
                tensor = read_output(output, reader, module)
                if tensor is not None and self.wants(tap):
                    self._record(ctx, tap, rows, tensor)
            return None if output is given else output

        return hook

    def _inject(self, ctx, tap: str, rows: str, reader: str, module, output):
        tensor = read_output(output, reader, module)
        if tensor is None:
            return output
        seq_index, positions = self._rows(ctx, rows)
        requests = [int(ctx.request_ids[s]) for s in seq_index.tolist()]
        new = self.injected(tap, tensor, requests, positions.tolist())
        return output if new is tensor else write_output(output, reader, module, new)

    @staticmethod
    def _rows(ctx, rows: str):
        """-> (scheduled-sequence index, token position) of each row of a tap read with `rows`."""
        if rows == "tokens":
            return ctx.row_seq_index, ctx.positions
        return ctx.sample_seq_index, ctx.positions[ctx.logits_indices]

    def _record(self, ctx, tap: str, rows: str, tensor: torch.Tensor) -> None:
        seq_index, positions = self._rows(ctx, rows)
        for s in seq_index.unique(sorted=True).tolist():
            mask = seq_index == s
            self.add(tap, ctx.step, int(ctx.request_ids[s]), positions[mask].tolist(), tensor[mask])

    def _module(self, path: str):
        # "model.model.layers.0.mlp" -> runner.model.get_submodule("model.layers.0.mlp")
        owner, _, rest = path.partition(".")
        module = getattr(self.runner, owner)
        return module.get_submodule(rest) if rest else module

    @contextmanager
    def attached(self) -> Iterator[TapRecorder]:
        with hooks_held() as held:
            for path, rows, taps in self.hooks:
                held.append(self._module(path).register_forward_hook(self._hook(rows, taps)))
            yield self

    def discard_rejected(self, rejected: Iterable[tuple[int, int, int]]) -> None:
        """Speculative decoding: drop rows a verification forward computed from drafts that were
        then rejected. rejected: (step, request id, first position whose input was rejected)."""
        cut = {(step, int(request)): pos for step, request, pos in rejected}
        kept = []
        for rec in self.records:
            first_bad = cut.get((rec.step, rec.request))
            if first_bad is not None:
                keep = [i for i, p in enumerate(rec.positions) if p < first_bad]
                if not keep:
                    continue
                rec = TapRecord(
                    rec.name, rec.step, rec.request, [rec.positions[i] for i in keep], rec.tensor[keep], rec.rank
                )
            kept.append(rec)
        self.records = kept


def install_shard_recorder(runner, arch: str, num_layers: int, out_dtype: torch.dtype) -> None:
    """On each tensor-parallel rank > 0 (through call_all_ranks): record its column-parallel shards."""
    if runner.rank == 0:
        return None
    recorder = TapRecorder(runner, arch, num_layers, [f"layers.*.{t}" for t in COLUMN_PARALLEL_TAPS], out_dtype)
    attached = recorder.attached()
    attached.__enter__()
    runner.diffdx_shard_recorder = (recorder, attached)
    return None


def collect_shard_records(runner) -> list[TapRecord] | None:
    """On each rank > 0: remove the hooks, hand the records to rank 0."""
    if runner.rank == 0:
        return None
    recorder, attached = runner.diffdx_shard_recorder
    attached.__exit__(None, None, None)
    return recorder.records


def gather_shards(records: list[TapRecord], per_rank: list[list[TapRecord] | None]) -> list[TapRecord]:
    """Rank 0's records with every column-parallel tap widened to all ranks' features, in rank order."""
    others = [{(r.name, r.step, r.request, tuple(r.positions)): r for r in recs or ()} for recs in per_rank[1:]]
    out = []
    for rec in records:
        if split(rec.name)[1] in COLUMN_PARALLEL_TAPS:
            key = (rec.name, rec.step, rec.request, tuple(rec.positions))
            missing = [i + 1 for i, o in enumerate(others) if key not in o]
            if missing:
                raise RuntimeError(f"tap {rec.name} step {rec.step}: ranks {missing} reported no shard")
            rec = TapRecord(
                rec.name,
                rec.step,
                rec.request,
                rec.positions,
                torch.cat([rec.tensor] + [o[key].tensor for o in others], dim=1),
                0,
            )
        out.append(rec)
    return out


def engine_options(spec: EngineSpec, native_kernels: list[str]) -> dict:
    options = {OPTION_ALIASES.get(k, k): v for k, v in spec.options.items()}
    options["native_kernels"] = sorted(set(options.get("native_kernels", [])) | set(native_kernels))
    return {**options, "dtype": spec.dtype}


def reference_weights(options: dict) -> dict:
    """Trace meta `weights`: the weight-only quantization the reference must mirror (tools.probe.quant),
    as the user asked for it (options, else the documented default group size), never as the tree
    under test resolved it: a wrong default there is a bug to find, not to copy."""
    if not options.get("quantization"):
        return {}
    return {"weights": {"scheme": options["quantization"], "group_size": int(options.get("quant_group_size", 32))}}


def sampling_params(ts, request, max_tokens: int, teacher: bool):
    s = dict(request.sampling)
    s.setdefault("temperature", 0.0)  # scenario default: greedy
    if teacher:  # forced tokens decide the length; stop conditions would cut it short
        s.update(ignore_eos=True, stop=[], stop_token_ids=[])
    return ts.SamplingParams(max_tokens=max_tokens, **s)


def plan_requests(ts, engine, job: RunJob) -> list[dict]:
    """Scenario requests (+ teacher sequences) -> add_request arguments with arrival steps."""
    plans = []
    for i, req in enumerate(job.scenario.requests):
        prompt = list(req.prompt_ids) if req.prompt_ids is not None else engine.tokenizer.encode(req.prompt)
        forced, max_tokens = None, req.max_tokens
        if job.teacher is not None:
            full = list(job.teacher[i])
            n = min(len(prompt), len(full) - 1)  # at least one forced token, so the last row gets logits
            prompt, forced = full[:n], full[n:]
            max_tokens = len(forced)
        plans.append(
            dict(
                request_id=str(i),
                prompt=prompt,
                forced_token_ids=forced,
                params=sampling_params(ts, req, max_tokens, forced is not None),
                arrival=req.arrival_step,
            )
        )
    return sorted(plans, key=lambda p: p["arrival"])


def drive(engine, plans: list[dict]) -> dict:
    """Add each request at its arrival step, step until all finish -> {request_id: output}."""
    pending, outputs = list(plans), {}
    while pending or engine.has_unfinished_requests():
        while pending and pending[0]["arrival"] <= engine.step_count:
            p = pending.pop(0)
            engine.add_request(p["request_id"], p["prompt"], p["params"], forced_token_ids=p["forced_token_ids"])
        for out in engine.step():
            outputs[out.request_id] = out
        if engine.step_count > MAX_STEPS:
            raise RuntimeError(f"tinyserve did not finish within {MAX_STEPS} steps")
    return outputs


def config_fields(config_py: Path) -> set[str] | None:
    """Field names of `class Config` in tinyserve's config.py, read without importing it (no torch)."""
    import ast

    try:
        tree = ast.parse(config_py.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Config":
            return {a.target.id for a in node.body if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}
    return None


def _injection(job: RunJob, tp: int) -> Injection | None:
    inject = Injection.load(job.replace)
    if inject is not None and tp > 1:
        raise ValueError("tensor replacement needs tensor_parallel_size = 1 (other ranks hold the shards)")
    unsupported = [t for t in (inject.rows if inject else ()) if not matches(t, REPLACEABLE)]
    if unsupported:
        raise ValueError(f"tinyserve cannot inject at {unsupported}; replaceable taps: {', '.join(REPLACEABLE)}")
    return inject


class TinyServeEngine:
    name = "tinyserve"
    package = "tinyserve"  # what a --target-source root must hold

    def encode_prompts(self, checkpoint: str, texts: list[str]) -> list[list[int]]:
        """Each text prompt as a run feeds it (plan_requests): the tree's own tokenizer, loaded as its
        engine loads it, on the checkpoint."""
        import_tinyserve()
        from tinyserve.tokenizer import Tokenizer

        tok = Tokenizer.maybe_load(checkpoint)
        if tok is None:
            raise ValueError(f"a text prompt needs a tokenizer in {checkpoint}")
        return [list(tok.encode(text)) for text in texts]

    def config_keys_read(self, checkpoint: str) -> list[str]:
        """The checkpoint's config.json keys the tree's engine reads: its ModelConfig.from_dict (as its
        from_dir calls it) on a dict that records each lookup (iterating it counts as reading every key)."""
        import_tinyserve()
        from tinyserve.config import ModelConfig

        config = ReadRecorder(json.loads((Path(checkpoint) / "config.json").read_text()))
        ModelConfig.from_dict(config)
        return sorted(config.read)

    def capabilities(self) -> Capabilities:
        ts = import_tinyserve()
        fields = config_fields(Path(ts.__file__).parent / "config.py")  # the imported tree's Config
        accepted = None if fields is None else (fields - {"model", "dtype", "model_config"}) | set(OPTION_ALIASES)
        return Capabilities(
            taps=("embed", "layers.*", *HEAD_TAPS),
            kernels=tuple(ts.ops.KERNELS),
            teacher_forcing=True,
            dtypes=("float64", "float32", "bfloat16", "float16"),
            tp_sizes=(1, 2),
            replace=REPLACEABLE,
            trigger_axes=TRIGGER_AXES + ((COMPILE_AXIS,) if fields and "compile" in fields else ()),
            config_axes=CONFIG_AXES,
            option_aliases=OPTION_ALIASES,
            package=self.package,
            accepted_options=None if accepted is None else tuple(sorted(accepted)),
        )

    def check_options(self, spec: EngineSpec, device: str = "cpu") -> None:
        """Nothing to refuse here: tinyserve's own Config rejects unknown options when the engine
        starts, and the tree under test (a fork may add options) is only importable in the worker."""

    def run(self, job: RunJob) -> Trace:
        ts = import_tinyserve()
        options = engine_options(job.spec, job.native_kernels)
        if options.get("tensor_parallel_size", 1) == 1:
            return self._run(ts, options, job)
        from tools.engines.tinyserve_tp import tp_guard

        try:
            runner_module = importlib.import_module("tinyserve.distributed.runner")
        except ImportError:  # a tree from before tensor parallelism: its own Config refuses the option
            return self._run(ts, options, job)
        with tp_guard(runner_module, lambda: getattr(runner_module, "_active", []).clear()):
            return self._run(ts, options, job)

    def _run(self, ts, options: dict, job: RunJob) -> Trace:
        engine = ts.LLMEngine(ts.Config(model=job.checkpoint, **options))
        cfg = engine.config.model_config
        out_dtype = torch.float64 if job.spec.dtype == "float64" else torch.float32
        runner, tp = engine.model_runner, engine.config.tensor_parallel_size
        recorder = TapRecorder(
            runner, cfg.model_type, cfg.num_hidden_layers, job.taps, out_dtype, inject=_injection(job, tp)
        )
        if tp > 1:
            runner.call_all_ranks(install_shard_recorder, cfg.model_type, cfg.num_hidden_layers, out_dtype)
        with recorder.attached():
            outputs = drive(engine, plan_requests(ts, engine, job))
        if tp > 1:
            recorder.records = gather_shards(recorder.records, runner.call_all_ranks(collect_shard_records))
            runner.shutdown()
        recorder.discard_rejected(getattr(engine, "rejected_rows", ()))
        results = [outputs[str(i)] for i in range(len(job.scenario.requests))]
        return Trace(
            engine=self.name,
            dtype=job.spec.dtype,
            records=recorder.ordered(),
            outputs=[
                RequestOutput(
                    prompt_ids=list(o.prompt_token_ids),
                    output_ids=list(o.token_ids),
                    logprobs=list(o.logprobs),
                    text=o.text,
                    finish_reason=o.finish_reason,
                )
                for o in results
            ],
            meta=self._meta(ts, engine, options, job, recorder),
        )

    @staticmethod
    def _meta(ts, engine, options: dict, job: RunJob, recorder: TapRecorder) -> dict:
        native = set(engine.config.native_kernels)
        replaced = {"replaced_rows": dict(recorder.inject.replaced)} if recorder.inject is not None else {}
        return {
            **replaced,
            **reference_weights(options),
            "options": options,
            "tinyserve_file": ts.__file__,
            "steps": engine.step_count,
            "kernels": {k: "native" if k in native else "optimized" for k in ts.ops.KERNELS},
            "teacher_forced": job.teacher is not None,
            "num_kv_blocks": engine.config.num_kv_blocks,
            "preemptions": getattr(getattr(engine, "scheduler", None), "num_preemptions", None),
            "max_num_batched_tokens": engine.config.max_num_batched_tokens,
            "tp": {
                "size": engine.config.tensor_parallel_size,
                "ranks": list(range(engine.config.tensor_parallel_size)),
                "gathered_taps": list(COLUMN_PARALLEL_TAPS),
            },
        }
