"""transformers adapter: reference (teacher-forced forward) and target (generate).

Runs inside the worker process, so `import transformers` gets whatever tree is
first on PYTHONPATH (the pristine package, or a git worktree under test).
Hooks are registered in a context manager (`TapRecorder`) and always removed.

In generate mode each forward's rows are read from the forward itself (its position
ids), so prefill chunks, decode steps, draft verifications and cache-less re-runs all
give the rows a single-pass prefill gives; rows computed from rejected drafts are
dropped (`latest_rows`). Options that cannot be tapped so are refused up front
(hf_generate.REFUSED). With `RunJob.replace`, reference rows are injected at their
taps (tensor replacement, tools/probe/replace.py) by the same hooks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tools.engines import hf_compat
from tools.engines.hf_compat import worker_paths  # noqa: F401 - the runner's hook (tools.engines.HOOKS)
from tools.engines.hf_generate import (
    ACCEPTED,
    HONOURED_SAMPLING,
    LOAD_ONLY,
    UnsupportedOption,
    assisted,
    check_options,
    device_problem,
    forward_columns,
    generate_kwargs,
    left_pad,
    request_positions,
)
from tools.engines.injection import Injection
from tools.engines.protocol import Capabilities, RunJob, TriggerAxis
from tools.engines.recorder import (
    TORCH_DTYPES,
    HookRecorder,
    RowMap,
    Undo,
    chosen_logprobs,
    copy_rows,
    derived_dtype,
    hooks_held,
    record_teacher_head,
)
from tools.probe import taps as tapnames
from tools.probe.compare import stored_precision
from tools.probe.trace import RequestOutput, TapRecord, Trace
from tools.scenario import EngineSpec, Request

# Taps where reference rows can be injected: module outputs and inputs, and q/k after RoPE. Not
# resid_mid: it is read as the input of a norm, while the layer adds its own copy of the residual.
REPLACEABLE = ("embed", *(f"layers.*.{t}" for t in tapnames.LAYER_TAPS if t != "resid_mid"), "final_norm")

# HF module attribute -> canonical tap, per decoder layer. gemma2 names its norms differently.
LAYER_MODULE_TAPS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn.q",
    "self_attn.k_proj": "attn.k",
    "self_attn.v_proj": "attn.v",
    "self_attn.o_proj": "attn.o_proj",
    "mlp.gate_proj": "mlp.gate",
    "mlp.up_proj": "mlp.up",
    "mlp.down_proj": "mlp.down",
}
SANDWICH_NORM_TAPS = {  # gemma2
    "post_attention_layernorm": "attn.post_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "mlp.post_norm",
}
PLAIN_NORM_TAPS = {"post_attention_layernorm": "mlp_norm"}


# The feature axis (the sweep's, the trigger search's): attention through torch's SDPA, the kernel
# from_pretrained picks by default (this adapter loads eager unless told). Its mask handling is its own (a padded batch passes an explicit
# mask, an unpadded one may rely on the kernel's causal flag), unlike eager's, which runs otherwise.
TRIGGER_AXES = (
    TriggerAxis(
        "sdpa",
        {"attn_implementation": "sdpa"},
        "attention through torch's scaled_dot_product_attention, on a batch of prompts of different lengths",
        "SDPA attention",
        ("sdpa", "scaled dot product", "scaled_dot_product_attention"),
        workload="batch",
        archs=("llama", "qwen2", "mistral"),  # transformers 5 refuses sdpa for Gemma2ForCausalLM
    ),
)

# Checkpoint config variants transformers reads (the sweep's model-config axis), as [model] keys for the
# checkpoint factory. YaRN as Qwen2.5 ships it: a pretraining length (256) below max_position_embeddings
# (the presets' 1024), so code that reads the one for the other moves the ramp. Weights at a trained
# model's scale: the presets' init 0.02 leaves attention nearly uniform, where rounded rope angles or
# softmax errors barely move the output. Each arch has its own modeling code here, so this variant meets
# every arch x precision x prompt shape: a scale-dependent rounding shows in one arch's code, in one
# precision, at a long prompt's positions.
CONFIG_AXES = (
    TriggerAxis(
        "rope_yarn",
        {},
        "YaRN rope scaling, factor 4 over a 256-token pretraining length (Qwen2.5 style)",
        "YaRN rope scaling",
        ("yarn",),
        model={"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}},
    ),
    TriggerAxis(
        "trained_scale",
        {},
        "weights at a trained model's scale (init range 0.2): peaked attention, activations of order 1",
        "trained-scale weights",
        ("precision", "longer prompts", "position", "activation"),
        model={"initializer_range": 0.2},
        crossed=("arch", "dtype", "workload"),
    ),
    # The presets' windows are 32 (mistral, gemma2) and qwen2's is off, as most Qwen2 exports ship it; a
    # window of 20 puts its edge off every power-of-two boundary, and switches qwen2's on (use_sliding_window,
    # windowed from layer max_window_layers = 1 up), a path of its own in each release's mask code
    TriggerAxis(
        "window_20",
        {},
        "a 20-token sliding window; qwen2 with use_sliding_window and max_window_layers 1",
        "sliding window size",
        ("window", "sliding"),
        model={"sliding_window": 20, "by_arch": {"qwen2": {"use_sliding_window": True, "max_window_layers": 1}}},
        archs=("mistral", "gemma2", "qwen2"),
    ),
)


class TapRecorder(HookRecorder):
    """HookRecorder plus where the tapped forward is: one forward = one step."""

    def __init__(self, patterns: list[str] | None, inject: Injection | None = None, widest: torch.dtype | None = None):
        super().__init__(patterns, inject, widest=widest)
        self.layer: int | None = None
        self.active = False  # inside the tapped model's forward (not a draft model's)
        self.recomputed = False  # a forward computed a position an earlier one had (`latest_rows`)


class HFEngine:
    name = "transformers"
    package = "transformers"  # what a --target-source root must hold

    def config_keys_read(self, checkpoint: str) -> list[str]:
        """What the checkpoint's config class declares in this transformers (its defaults, its and its bases'
        __init__ parameters, aliases): a model reads its config's fields, and other keys stay unused attributes."""
        import inspect

        from transformers import AutoConfig

        cls = type(AutoConfig.from_pretrained(checkpoint))
        fields = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {}))
        for base in cls.__mro__:
            if "__init__" in vars(base):
                fields |= set(inspect.signature(vars(base)["__init__"]).parameters)
        return sorted(fields)

    def encode_prompts(self, checkpoint: str, texts: list[str]) -> list[list[int]]:
        """Each text prompt as a run feeds it (prompt_ids, the checkpoint's tokenizer as the release reads it)."""
        tok = hf_compat.load_tokenizer(checkpoint)
        return [prompt_ids(Request(prompt=text), tok) for text in texts]

    def capabilities(self) -> Capabilities:
        # accepted_options: the allow-list (tools/engines/hf_generate.py), options this adapter taps
        # correctly; everything else is refused up front with its reason
        return Capabilities(
            taps=("embed", "layers.*", "final_norm", "logits", "sampler.*"),
            replace=REPLACEABLE,
            package=self.package,
            accepted_options=tuple(sorted(set(LOAD_ONLY) | set(ACCEPTED))),
            sampling_keys=HONOURED_SAMPLING,
            trigger_axes=TRIGGER_AXES,
            config_axes=CONFIG_AXES,
            archs=hf_compat.release_archs(),  # an old release lacks the newer archs (4.38 has no gemma2)
        )

    def check_options(self, spec: EngineSpec, device: str = "cpu") -> None:
        check_options(spec.options)
        problem = device_problem(spec.options, device)
        if problem:
            raise UnsupportedOption(problem)

    def run(self, job: RunJob) -> Trace:
        check_options(job.spec.options)
        # a teacher-forced run is one plain forward per request: no cache, so no device needs
        problem = device_problem(job.spec.options, job.device) if job.teacher is None else None
        if problem:
            raise UnsupportedOption(problem)
        torch.manual_seed(0)
        model, tok = load_model(job.checkpoint, job.spec, job.device)
        prompts = [prompt_ids(r, tok) for r in job.scenario.requests]
        # rows are kept no wider than the worker writes them (compare.stored_precision)
        recorder = TapRecorder(job.taps, inject=_injection(job), widest=stored_precision(job.scenario.target.dtype))
        with hooks_installed(model, recorder):
            if job.teacher is not None:
                outputs = teacher_forced(model, job, prompts, recorder)
            else:
                outputs = generate_all(model, job, prompts, recorder)
        if tok is not None:
            for o in outputs:
                # special tokens are left out of text, as serving engines do by default
                o.text = tok.decode(o.output_ids, skip_special_tokens=True)
        # generate() never feeds the last token; a draft verification may have: keep single-pass rows
        fed = [len(o.prompt_ids) + len(o.output_ids) - (job.teacher is None) for o in outputs]
        records = latest_rows(recorder.records, fed, recorder.recomputed)
        import transformers

        meta = {"options": job.spec.options, "source": transformers.__file__, "device": job.device}
        if recorder.inject is not None:
            meta["replaced_rows"] = dict(recorder.inject.replaced)
        return Trace(engine=self.name, dtype=job.spec.dtype, outputs=outputs, records=records, meta=meta)

    def contract_context(self, job: RunJob) -> dict:
        """Each layer's attention window as the reference reads the checkpoint, and whether this
        release builds one mask per kind of layer (tools.hypotheses.contracts, mask builders)."""
        return hf_compat.attention_context(job.checkpoint, job.spec.options)


def _injection(job: RunJob) -> Injection | None:
    inject = Injection.load(job.replace)
    unsupported = [t for t in (inject.rows if inject else ()) if not tapnames.matches(t, REPLACEABLE)]
    if unsupported:
        raise ValueError(f"transformers cannot inject at {unsupported}; replaceable taps: {', '.join(REPLACEABLE)}")
    return inject


def latest_rows(records: list[TapRecord], lengths: list[int], recomputed: bool = True) -> list[TapRecord]:
    """Records in (step, tap, request) order, keeping each (tap, request, position) only from the last
    step that computed it, and only below lengths[request]: a forward that verified draft tokens
    (assisted decoding) computed rows from drafts that were then rejected, and recomputed them.
    `recomputed` False: no forward computed a position another had (then only the lengths cut)."""
    ordered = sorted(records, key=lambda r: (r.step, tapnames.order_key(r.name), r.request))
    if not recomputed:  # the same records as below, without a dict entry per row
        out = []
        for rec in ordered:
            if max(rec.positions, default=-1) < lengths[rec.request]:
                out.append(rec)
            elif (cut := _below(rec, lengths)).positions:
                out.append(cut)
        return out
    last = {}
    for rec in ordered:
        for p in rec.positions:
            last[(rec.name, rec.request, p)] = rec.step
    out = []
    for rec in ordered:
        keep = [
            i
            for i, p in enumerate(rec.positions)
            if last[(rec.name, rec.request, p)] == rec.step and p < lengths[rec.request]
        ]
        if len(keep) == len(rec.positions):
            out.append(rec)
        elif keep:
            out.append(TapRecord(rec.name, rec.step, rec.request, [rec.positions[i] for i in keep], rec.tensor[keep]))
    return out


def _below(rec: TapRecord, lengths: list[int]) -> TapRecord:
    """`rec` less its rows at positions from lengths[rec.request] on (no positions when none is left)."""
    keep = [i for i, p in enumerate(rec.positions) if p < lengths[rec.request]]
    return TapRecord(rec.name, rec.step, rec.request, [rec.positions[i] for i in keep], rec.tensor[keep])


def load_model(checkpoint: str, spec: EngineSpec, device: str):
    from transformers import AutoModelForCausalLM

    kwargs = {k: v for k, v in spec.options.items() if k in LOAD_ONLY}
    kwargs.setdefault("attn_implementation", "eager")
    hf_compat.check_arch(checkpoint)  # release differences live in hf_compat
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint,
        **hf_compat.dtype_kwarg(TORCH_DTYPES[spec.dtype]),
        **hf_compat.config_overrides(checkpoint),
        **kwargs,
    )
    model.to(device).eval()
    return model, hf_compat.load_tokenizer(checkpoint)


def prompt_ids(req: Request, tok) -> list[int]:
    if req.prompt_ids is not None:
        return list(req.prompt_ids)
    if tok is None:
        raise ValueError("a text prompt needs a tokenizer in the checkpoint dir")
    return tok(req.prompt)["input_ids"]


# ---- hooks -----------------------------------------------------------------------------------


@contextmanager
def hooks_installed(model, rec: TapRecorder) -> Iterator[TapRecorder]:
    with hooks_held() as held:
        held += _global_hooks(model, rec)
        for i, layer in enumerate(model.model.layers):
            held += _layer_hooks(layer, i, rec)
        held.append(Undo(_wrap_rotary(model, rec)))
        yield rec


def _output_hook(rec: TapRecorder, tap: str) -> Callable[..., object]:
    def hook(_mod, _args, out):
        x = out[0] if isinstance(out, tuple) else out
        new = rec.touch(tap, x)
        if new is not x:
            return (new, *out[1:]) if isinstance(out, tuple) else new

    return hook


def _input_hook(rec: TapRecorder, tap: str) -> Callable[..., object]:
    def hook(_mod, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        new = rec.touch(tap, x)
        if new is not x:
            return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})

    return hook


def _layer_hooks(layer, i: int, rec: TapRecorder) -> list:
    sandwich = hasattr(layer, "pre_feedforward_layernorm")
    mapping = {**LAYER_MODULE_TAPS, **(SANDWICH_NORM_TAPS if sandwich else PLAIN_NORM_TAPS)}
    handles = []
    for attr, name in mapping.items():
        tap = tapnames.layer_tap(i, name)
        if rec.touches(tap):
            handles.append(layer.get_submodule(attr).register_forward_hook(_output_hook(rec, tap)))
    inputs = {
        "self_attn.o_proj": "attn.out",
        "mlp.down_proj": "mlp.act",
        ("pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"): "resid_mid",
    }
    for attr, name in inputs.items():
        tap = tapnames.layer_tap(i, name)
        if rec.touches(tap):
            hook = _input_hook(rec, tap)
            handles.append(layer.get_submodule(attr).register_forward_pre_hook(hook, with_kwargs=True))
    if rec.touches(tapnames.layer_tap(i, "out")):
        handles.append(layer.register_forward_hook(_output_hook(rec, tapnames.layer_tap(i, "out"))))

    def enter_attn(_mod, _args, _kwargs):
        rec.layer = i

    handles.append(layer.self_attn.register_forward_pre_hook(enter_attn, with_kwargs=True))
    return handles


def _global_hooks(model, rec: TapRecorder) -> list:
    handles = []
    if rec.touches("embed"):  # the first layer's input: gemma2 before 5.x scales it after embed_tokens
        handles.append(model.model.layers[0].register_forward_pre_hook(_input_hook(rec, "embed"), with_kwargs=True))
    if rec.touches("final_norm"):
        handles.append(model.model.norm.register_forward_hook(_output_hook(rec, "final_norm")))

    def enter(_mod, _args, _kwargs):
        rec.active = True

    def leave(_mod, _args, _out):
        rec.active = False

    handles.append(model.model.register_forward_pre_hook(enter, with_kwargs=True))
    handles.append(model.model.register_forward_hook(leave))
    return handles


def _wrap_rotary(model, rec: TapRecorder) -> Callable[[], object]:
    """Wrap the modeling module's apply_rotary_pos_emb to see (and replace) q/k after RoPE.

    The function is shared by every model of the architecture, so only calls made inside the
    tapped model's forward count (an assistant model of the same family calls it too)."""
    module: Any = sys.modules[type(model.model.layers[0].self_attn).__module__]  # Any: one of its functions is swapped
    original = getattr(module, "apply_rotary_pos_emb", None)
    if original is None:
        return lambda: None

    def wrapped(q, k, *args, **kwargs):
        q_rot, k_rot = original(q, k, *args, **kwargs)
        if rec.active and rec.layer is not None:
            q_rot, k_rot = (
                _touch_heads(rec, tapnames.layer_tap(rec.layer, tap), x)
                for tap, x in (("attn.q_rot", q_rot), ("attn.k_rot", k_rot))
            )
        return q_rot, k_rot

    module.apply_rotary_pos_emb = wrapped
    return lambda: setattr(module, "apply_rotary_pos_emb", original)


def _touch_heads(rec: TapRecorder, tap: str, x: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> the same, seen (and replaced) as [B, S, H*D]."""
    if not rec.touches(tap):
        return x
    b, h, s, d = x.shape
    flat = x.transpose(1, 2).reshape(b, s, h * d)
    new = rec.touch(tap, flat)
    return x if new is flat else new.reshape(b, s, h, d).transpose(1, 2).contiguous()


# ---- running ---------------------------------------------------------------------------------


def teacher_forced(model, job: RunJob, prompts: list[list[int]], rec: TapRecorder) -> list[RequestOutput]:
    """Re-run each request's full sequence in one forward pass (step 0)."""
    outputs = []
    assert job.teacher is not None, "teacher forcing needs the token sequences to re-run"
    for r, seq in enumerate(job.teacher):
        n_prompt = len(prompts[r])
        ids = torch.tensor([seq], device=job.device)
        rec.rows, rec.step = RowMap([r], [list(range(len(seq)))]), 0
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        record_teacher_head(rec, r, logits, seq, n_prompt, job.scenario.requests[r])
        outputs.append(
            RequestOutput(
                prompt_ids=list(seq[:n_prompt]),
                output_ids=list(seq[n_prompt:]),
                logprobs=chosen_logprobs(logits, seq, n_prompt),
            )
        )
    return outputs


def generate_all(model, job: RunJob, prompts: list[list[int]], rec: TapRecorder) -> list[RequestOutput]:
    """Target mode: requests with equal sampling and length form one left-padded batch
    (assisted decoding runs one request per batch: transformers supports no more)."""
    groups: dict[str, list[int]] = {}
    one_each = assisted(job.spec.options)
    for r, req in enumerate(job.scenario.requests):
        groups.setdefault(repr((sorted(req.sampling.items()), req.max_tokens, r if one_each else None)), []).append(r)
    assistant = load_assistant(job)
    outputs: dict[int, RequestOutput] = {}
    step0 = 0
    for members in groups.values():
        step0 = generate_batch(model, job, prompts, members, rec, step0, outputs, assistant)
    return [outputs[r] for r in range(len(prompts))]


def load_assistant(job: RunJob):
    """The draft model of assisted decoding: 'self' = a second copy of the checkpoint under test."""
    name = job.spec.options.get("assistant_model")
    if name is None:
        return None
    return load_model(job.checkpoint if name == "self" else name, job.spec, job.device)[0]


def generate_batch(
    model,
    job: RunJob,
    prompts: list[list[int]],
    members: list[int],
    rec: TapRecorder,
    step0: int,
    outputs: dict[int, RequestOutput],
    assistant=None,
) -> int:
    req = job.scenario.requests[members[0]]
    ids, mask, pads = left_pad([prompts[r] for r in members], model.config.pad_token_id or 0)
    width = ids.shape[1]
    computed_at: dict[int, int] = {}  # padded column -> last step that computed it
    calls = [0]

    def pre_forward(_mod, _args, kwargs):
        # one forward per prefill chunk, decode step or draft verification: its rows are its columns
        rec.step, calls[0] = step0 + calls[0], calls[0] + 1
        columns = forward_columns(kwargs, pads)
        rec.rows = RowMap(members, request_positions(columns, pads))
        rec.recomputed = rec.recomputed or not computed_at.keys().isdisjoint(columns)
        computed_at.update(dict.fromkeys(columns, rec.step))

    if req.sampling.get("ignore_eos"):
        model.generation_config.eos_token_id = None  # else generate() fills it back in from here
    handle = model.model.register_forward_pre_hook(pre_forward, with_kwargs=True)
    try:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(job.device),
                attention_mask=mask.to(job.device),
                **generate_kwargs(req, job.spec.options, model, assistant),
            )
    finally:
        handle.remove()
    out = hf_compat.with_logits(out)
    steps = [computed_at.get(width - 1 + k, step0) for k in range(len(out.logits))]
    _record_generate_head(rec, out, members, prompts, steps, width, req.greedy)
    eos = set(_as_list(model.generation_config.eos_token_id))
    for b, r in enumerate(members):
        new, reason = cut_at_eos(out.sequences[b, width:].tolist(), eos)
        lps = [float(torch.log_softmax(s[b].double(), -1)[t]) for s, t in zip(out.logits, new)]
        outputs[r] = RequestOutput(prompt_ids=prompts[r], output_ids=new, logprobs=lps, finish_reason=reason)
    return step0 + calls[0]


def _as_list(x) -> list:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def cut_at_eos(tokens: list[int], eos: set[int]) -> tuple[list[int], str]:
    """Generated ids of a batch row -> ids up to and including the first EOS (the rest is padding)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], "stop"
    return tokens, "length"


def head_row(name: str, raw: torch.Tensor, scores: torch.Tensor, token: int, kept) -> torch.Tensor:
    """Head tap `name` of one generated token as a [1, F] row: its logits `raw` [V], the processed `scores` [V]
    (their softmax, in `kept`, as `sampler.probs`) or the `token` drawn."""
    if name == "logits":
        return copy_rows(raw[None])
    if name == "sampler.logits":
        return copy_rows(scores[None])
    if name == "sampler.probs":
        return torch.softmax(scores[None].double(), -1).to(kept)
    return torch.tensor([[float(token)]], dtype=torch.float64)


IDENTITY_SAMPLER_ROWS = ("sampler.logits", "sampler.probs")  # not recorded for a greedy row no processor changed


def _record_generate_head(
    rec: TapRecorder, out, members: list[int], prompts: list[list[int]], steps: list[int], width: int, greedy: bool
) -> None:
    """Logits and sampler rows of each generated token k, from generate's own outputs; steps[k] is
    the forward that computed the logits of token k. A greedy row whose scores are its logits (no
    processor changed them) records neither as sampler rows: `sampler.logits` would repeat `logits`
    (compared by the `logits` tap already) and `sampler.probs`, their softmax here, judges nothing the
    logits do not (tools.probe.sampler_taps judges a greedy row's kept set on this very input); for a
    real vocabulary they were two thirds of the head's rows, copied, written and read for nothing."""
    wanted = [name for name in ("logits", "sampler.logits", "sampler.probs", "sampler.token") if rec.wants(name)]
    kept = derived_dtype(out.scores[0].dtype) if out.scores else None  # float64 only for a float64 run's rows
    for k, (raw, scores) in enumerate(zip(out.logits, out.scores)):
        for b, r in enumerate(members):
            pos = [len(prompts[r]) - 1 + k]
            identity = greedy and torch.equal(scores[b], raw[b])
            token = int(out.sequences[b, width + k])
            for name in wanted:
                if not (identity and name in IDENTITY_SAMPLER_ROWS):
                    rec.records.append(
                        TapRecord(name, steps[k], r, pos, head_row(name, raw[b], scores[b], token, kept))
                    )
