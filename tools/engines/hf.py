"""transformers adapter: reference (teacher-forced forward) and target (generate).

Runs inside the worker process, so `import transformers` gets whatever tree is
first on PYTHONPATH (the pristine package, or a git worktree under test).
Hooks are registered in a context manager (`TapRecorder`) and always removed.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from tools import taps as tapnames
from tools.engines.protocol import Capabilities, RunJob
from tools.scenario import EngineSpec, Request
from tools.trace import RequestOutput, TapRecord, Trace

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32,
                "bfloat16": torch.bfloat16, "float16": torch.float16}
LOAD_OPTIONS = ("attn_implementation",)   # options that go to from_pretrained; the rest go to generate

# HF module attribute -> canonical tap, per decoder layer. gemma2 names its norms differently.
LAYER_MODULE_TAPS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k", "self_attn.v_proj": "attn.v",
    "self_attn.o_proj": "attn.o_proj",
    "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.up", "mlp.down_proj": "mlp.down",
}
SANDWICH_NORM_TAPS = {  # gemma2
    "post_attention_layernorm": "attn.post_norm", "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "mlp.post_norm",
}
PLAIN_NORM_TAPS = {"post_attention_layernorm": "mlp_norm"}


@dataclass
class RowMap:
    """Which rows of a [batch, seq, F] forward belong to which request and position."""
    requests: list[int]                     # batch row -> request index
    positions: list[list[int]]              # batch row -> position of each seq column (-1 = padding)


@dataclass
class TapRecorder:
    """Collects canonical tap records from hooks; one forward call = one step."""
    patterns: list[str] | None
    records: list[TapRecord] = field(default_factory=list)
    step: int = 0
    rows: RowMap | None = None
    layer: int | None = None

    def wants(self, tap: str) -> bool:
        return tapnames.matches(tap, self.patterns)

    def record(self, tap: str, x: torch.Tensor) -> None:  # x: [B, S, F]
        x = x.detach().to(torch.float64 if x.dtype == torch.float64 else torch.float32).clone()
        for b, req in enumerate(self.rows.requests):
            pos = self.rows.positions[b]
            keep = [s for s, p in enumerate(pos) if p >= 0]
            if keep:
                self.records.append(TapRecord(tap, self.step, req, [pos[s] for s in keep], x[b, keep]))


class HFEngine:
    name = "transformers"
    package = "transformers"          # what a --target-source root must hold

    def accepted_options(self, source_root) -> set[str]:
        """from_pretrained's options and what generate() takes (GenerationConfig fields, its own
        arguments), as the installed transformers defines them."""
        import inspect

        from transformers import GenerationConfig
        from transformers.generation.utils import GenerationMixin
        own = set(inspect.signature(GenerationMixin.generate).parameters) - {"self", "kwargs", "inputs"}
        return set(LOAD_OPTIONS) | set(GenerationConfig().to_dict()) | own

    def capabilities(self, spec: EngineSpec) -> Capabilities:
        return Capabilities(taps=("embed", "layers.*", "final_norm", "logits", "sampler.*"))

    def run(self, job: RunJob) -> Trace:
        torch.manual_seed(0)
        model, tok = load_model(job.checkpoint, job.spec, job.device)
        prompts = [prompt_ids(r, tok) for r in job.scenario.requests]
        recorder = TapRecorder(job.taps)
        with hooks_installed(model, recorder):
            if job.teacher is not None:
                outputs = teacher_forced(model, job, prompts, recorder)
            else:
                outputs = generate_all(model, job, prompts, recorder)
        if tok is not None:
            for o in outputs:
                # special tokens are left out of text, as serving engines do by default
                o.text = tok.decode(o.output_ids, skip_special_tokens=True)
        records = sorted(recorder.records, key=lambda r: (r.step, tapnames.order_key(r.name), r.request))
        import transformers
        meta = {"options": job.spec.options, "source": transformers.__file__, "device": job.device}
        return Trace(engine=self.name, dtype=job.spec.dtype, outputs=outputs, records=records, meta=meta)


def load_model(checkpoint: str, spec: EngineSpec, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {k: v for k, v in spec.options.items() if k in LOAD_OPTIONS}
    kwargs.setdefault("attn_implementation", "eager")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=TORCH_DTYPES[spec.dtype], **kwargs)
    model.to(device).eval()
    try:
        tok = AutoTokenizer.from_pretrained(checkpoint)
    except (OSError, ValueError):
        tok = None
    return model, tok


def prompt_ids(req: Request, tok) -> list[int]:
    if req.prompt_ids is not None:
        return list(req.prompt_ids)
    if tok is None:
        raise ValueError("a text prompt needs a tokenizer in the checkpoint dir")
    return tok(req.prompt)["input_ids"]


# ---- hooks -----------------------------------------------------------------------------------

@contextmanager
def hooks_installed(model, rec: TapRecorder):
    handles, restore = [], []
    try:
        handles += _global_hooks(model, rec)
        for i, layer in enumerate(model.model.layers):
            handles += _layer_hooks(layer, i, rec)
        restore.append(_wrap_rotary(model, rec))
        yield rec
    finally:
        for h in handles:
            h.remove()
        for undo in restore:
            undo()


def _output_hook(rec: TapRecorder, tap: str):
    def hook(_mod, _args, out):
        rec.record(tap, out[0] if isinstance(out, tuple) else out)
    return hook


def _input_hook(rec: TapRecorder, tap: str):
    def hook(_mod, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        rec.record(tap, x)
    return hook


def _layer_hooks(layer, i: int, rec: TapRecorder) -> list:
    sandwich = hasattr(layer, "pre_feedforward_layernorm")
    mapping = {**LAYER_MODULE_TAPS, **(SANDWICH_NORM_TAPS if sandwich else PLAIN_NORM_TAPS)}
    handles = []
    for attr, name in mapping.items():
        tap = tapnames.layer_tap(i, name)
        if rec.wants(tap):
            handles.append(layer.get_submodule(attr).register_forward_hook(_output_hook(rec, tap)))
    inputs = {"self_attn.o_proj": "attn.out", "mlp.down_proj": "mlp.act",
              ("pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"): "resid_mid"}
    for attr, name in inputs.items():
        tap = tapnames.layer_tap(i, name)
        if rec.wants(tap):
            hook = _input_hook(rec, tap)
            handles.append(layer.get_submodule(attr).register_forward_pre_hook(hook, with_kwargs=True))
    if rec.wants(tapnames.layer_tap(i, "out")):
        handles.append(layer.register_forward_hook(_output_hook(rec, tapnames.layer_tap(i, "out"))))

    def enter_attn(_mod, _args, _kwargs):
        rec.layer = i
    handles.append(layer.self_attn.register_forward_pre_hook(enter_attn, with_kwargs=True))
    return handles


def _global_hooks(model, rec: TapRecorder) -> list:
    handles = []
    if rec.wants("embed"):
        handles.append(model.model.embed_tokens.register_forward_hook(_output_hook(rec, "embed")))
    if rec.wants("final_norm"):
        handles.append(model.model.norm.register_forward_hook(_output_hook(rec, "final_norm")))
    return handles


def _wrap_rotary(model, rec: TapRecorder):
    """Wrap the modeling module's apply_rotary_pos_emb to see q/k after RoPE."""
    module = sys.modules[type(model.model.layers[0].self_attn).__module__]
    original = getattr(module, "apply_rotary_pos_emb", None)
    if original is None:
        return lambda: None

    def wrapped(q, k, *args, **kwargs):
        q_rot, k_rot = original(q, k, *args, **kwargs)
        for tap, x in (("attn.q_rot", q_rot), ("attn.k_rot", k_rot)):
            name = tapnames.layer_tap(rec.layer, tap)
            if rec.layer is not None and rec.wants(name):
                rec.record(name, x.transpose(1, 2).flatten(2))   # [B, H, S, D] -> [B, S, H*D]
        return q_rot, k_rot

    module.apply_rotary_pos_emb = wrapped
    return lambda: setattr(module, "apply_rotary_pos_emb", original)


# ---- running ---------------------------------------------------------------------------------

def teacher_forced(model, job: RunJob, prompts: list[list[int]], rec: TapRecorder) -> list[RequestOutput]:
    """Re-run each request's full sequence in one forward pass (step 0)."""
    outputs = []
    for r, seq in enumerate(job.teacher):
        n_prompt = len(prompts[r])
        ids = torch.tensor([seq], device=job.device)
        rec.rows, rec.step = RowMap([r], [list(range(len(seq)))]), 0
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        _record_head(rec, r, logits, seq, n_prompt, job.scenario.requests[r])
        outputs.append(RequestOutput(prompt_ids=list(seq[:n_prompt]), output_ids=list(seq[n_prompt:]),
                                     logprobs=_chosen_logprobs(logits, seq, n_prompt)))
    return outputs


def _record_head(rec: TapRecorder, r: int, logits: torch.Tensor, seq: list[int], n_prompt: int, req: Request):
    from tools.sampling_ref import processed_logits

    positions = list(range(len(seq)))
    if rec.wants("logits"):
        rec.records.append(TapRecord("logits", 0, r, positions, logits.detach().double().clone()))
    sampled = list(range(n_prompt - 1, len(seq) - 1))
    if not sampled or not rec.wants("sampler.*"):
        return
    processed, truncated = processed_logits(logits[sampled].double(), seq, n_prompt, req.sampling)
    probs = torch.softmax(truncated, dim=-1)
    chosen = torch.tensor([[float(seq[p + 1])] for p in sampled], dtype=torch.float64)
    for name, x in (("sampler.logits", processed), ("sampler.probs", probs), ("sampler.token", chosen)):
        if rec.wants(name):
            rec.records.append(TapRecord(name, 0, r, sampled, x))


def _chosen_logprobs(logits: torch.Tensor, seq: list[int], n_prompt: int) -> list[float]:
    lp = torch.log_softmax(logits.double(), dim=-1)
    return [float(lp[p, seq[p + 1]]) for p in range(n_prompt - 1, len(seq) - 1)]


def generate_all(model, job: RunJob, prompts: list[list[int]], rec: TapRecorder) -> list[RequestOutput]:
    """Target mode: requests with equal sampling and length form one left-padded batch."""
    groups: dict[str, list[int]] = {}
    for r, req in enumerate(job.scenario.requests):
        groups.setdefault(repr((sorted(req.sampling.items()), req.max_tokens)), []).append(r)
    outputs: dict[int, RequestOutput] = {}
    step0 = 0
    for members in groups.values():
        step0 = generate_batch(model, job, prompts, members, rec, step0, outputs)
    return [outputs[r] for r in range(len(prompts))]


def generate_batch(model, job, prompts, members, rec, step0, outputs) -> int:
    from tools.engines.hf_generate import generate_kwargs, left_pad

    req = job.scenario.requests[members[0]]
    ids, mask, pads = left_pad([prompts[r] for r in members], model.config.pad_token_id or 0)
    width = ids.shape[1]
    calls = {"n": 0}

    def pre_forward(_mod, _args, _kwargs):
        k = calls["n"]
        rec.step = step0 + k
        if k == 0:
            rec.rows = RowMap(members, [[s - pads[b] for s in range(width)] for b in range(len(members))])
        else:
            rec.rows = RowMap(members, [[width - pads[b] + k - 1] for b in range(len(members))])
        calls["n"] += 1

    if req.sampling.get("ignore_eos"):
        model.generation_config.eos_token_id = None   # else generate() fills it back in from here
    handle = model.model.register_forward_pre_hook(pre_forward, with_kwargs=True)
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(job.device), attention_mask=mask.to(job.device),
                                 **generate_kwargs(req, job.spec.options, model))
    finally:
        handle.remove()
    _record_generate_head(rec, out, members, prompts, step0, width)
    eos = set(_as_list(model.generation_config.eos_token_id))
    for b, r in enumerate(members):
        new, reason = cut_at_eos(out.sequences[b, width:].tolist(), eos)
        lps = [float(torch.log_softmax(s[b].double(), -1)[t]) for s, t in zip(out.logits, new)]
        outputs[r] = RequestOutput(prompt_ids=prompts[r], output_ids=new, logprobs=lps, finish_reason=reason)
    return step0 + calls["n"]


def _as_list(x) -> list:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def cut_at_eos(tokens: list[int], eos: set[int]) -> tuple[list[int], str]:
    """Generated ids of a batch row -> ids up to and including the first EOS (the rest is padding)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1], "stop"
    return tokens, "length"


def _record_generate_head(rec, out, members, prompts, step0, width):
    for k, (raw, scores) in enumerate(zip(out.logits, out.scores)):
        for b, r in enumerate(members):
            pos = [len(prompts[r]) - 1 + k]
            tok = torch.tensor([[float(out.sequences[b, width + k])]])
            rows = {"logits": raw[b:b + 1], "sampler.logits": scores[b:b + 1],
                    "sampler.probs": torch.softmax(scores[b:b + 1].double(), -1), "sampler.token": tok}
            for name, x in rows.items():
                if rec.wants(name):
                    rec.records.append(TapRecord(name, step0 + k, r, pos, x.detach().double().clone()))
