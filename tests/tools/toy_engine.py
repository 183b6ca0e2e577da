"""A third engine in one file: a pure-PyTorch llama (greedy, no KV cache) behind the Engine protocol.

It is not part of diffdx: the conformance test registers it as `toy_engine:ToyEngine` from a
folder on $PYTHONPATH, exactly as a user registers their own adapter (docs/engines.md), and runs
it through the same checks as the built-in engines. It reads the HF-format checkpoint diffdx
writes (safetensors + config.json + tokenizer.json) and reports canonical taps.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tools.engines.protocol import Capabilities, RunJob
from tools.probe.taps import matches, order_key
from tools.probe.trace import RequestOutput, TapRecord, Trace

TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class ToyEngine:
    name = "toy"

    def capabilities(self) -> Capabilities:
        return Capabilities(taps=("embed", "layers.*", "final_norm", "logits"), kernels=(), teacher_forcing=True)

    def run(self, job: RunJob) -> Trace:
        model = ToyLlama(job.checkpoint, TORCH_DTYPES[job.spec.dtype])
        taps: list[TapRecord] = []
        outputs = []
        for r, req in enumerate(job.scenario.requests):
            if not req.greedy:
                raise ValueError("the toy engine samples greedily only (temperature 0)")
            prompt = list(req.prompt_ids) if req.prompt_ids is not None else model.encode(req.prompt)
            if job.teacher is not None:
                seq = list(job.teacher[r])
                model.forward(seq, Tapper(taps, job.taps, r, 0, 0))
            else:
                seq = generate(model, prompt, req, Tapper(taps, job.taps, r, 0, 0))
            outputs.append(
                RequestOutput(prompt_ids=prompt, output_ids=seq[len(prompt) :], text=model.decode(seq[len(prompt) :]))
            )
        taps.sort(key=lambda t: (t.step, order_key(t.name), t.request))
        return Trace(
            engine=self.name,
            dtype=job.spec.dtype,
            outputs=outputs,
            records=taps,
            meta={"teacher_forced": job.teacher is not None},
        )


def generate(model: ToyLlama, prompt: list[int], req, tapper: Tapper) -> list[int]:
    """Greedy decoding; each step re-runs the whole sequence and reports only its new rows."""
    seq = list(prompt)
    for step in range(req.max_tokens):
        tapper.step, tapper.first_row = step, 0 if step == 0 else len(seq) - 1
        logits = model.forward(seq, tapper)
        seq.append(int(logits[-1].argmax()))
        if seq[-1] == model.eos and not req.sampling.get("ignore_eos"):
            break
    return seq


class Tapper:
    """Collects the rows from `first_row` on of each tap, as records of one request and step."""

    def __init__(self, out: list[TapRecord], patterns, request: int, step: int, first_row: int):
        self.out, self.patterns, self.request, self.step, self.first_row = out, patterns, request, step, first_row

    def __call__(self, name: str, x: torch.Tensor) -> None:  # x: [T, F]
        if matches(name, self.patterns):
            rows = x[self.first_row :].detach().to(torch.float64 if x.dtype == torch.float64 else torch.float32)
            positions = list(range(self.first_row, x.shape[0]))
            self.out.append(TapRecord(name, self.step, self.request, positions, rows.clone()))


class ToyLlama:
    def __init__(self, checkpoint: str, dtype: torch.dtype):
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.cfg = json.loads((Path(checkpoint) / "config.json").read_text())
        if self.cfg["model_type"] != "llama":
            raise ValueError(f"the toy engine runs llama only, not {self.cfg['model_type']!r}")
        self.w = {k: v.to(dtype) for k, v in load_file(str(Path(checkpoint) / "model.safetensors")).items()}
        self.w.setdefault("lm_head.weight", self.w["model.embed_tokens.weight"])  # tied embeddings
        self.tok = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))
        self.eos = self.cfg.get("eos_token_id")

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    @torch.no_grad()
    def forward(self, ids: list[int], tap) -> torch.Tensor:  # -> [T, vocab]
        c, w = self.cfg, self.w
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        tap("embed", x)
        cos, sin = rope(
            len(ids),
            c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
            c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta", 10000.0)),
        )
        for i in range(c["num_hidden_layers"]):
            x = self.layer(x, i, cos, sin, lambda name, t, i=i: tap(f"layers.{i}.{name}", t))
        x = rms_norm(x, w["model.norm.weight"], c["rms_norm_eps"])
        tap("final_norm", x)
        logits = x @ w["lm_head.weight"].T
        tap("logits", logits)
        return logits

    def layer(self, x, i, cos, sin, tap):  # [T, F] -> [T, F]
        c, p = self.cfg, lambda name: self.w[f"model.layers.{i}.{name}.weight"]
        h = rms_norm(x, p("input_layernorm"), c["rms_norm_eps"])
        tap("attn_norm", h)
        q, k, v = h @ p("self_attn.q_proj").T, h @ p("self_attn.k_proj").T, h @ p("self_attn.v_proj").T
        for name, t in (("attn.q", q), ("attn.k", k), ("attn.v", v)):
            tap(name, t)
        n_heads, n_kv = c["num_attention_heads"], c["num_key_value_heads"]
        q, k = apply_rope(q, n_heads, cos, sin), apply_rope(k, n_kv, cos, sin)
        tap("attn.q_rot", q)
        tap("attn.k_rot", k)
        a = causal_attention(q, k, v, n_heads, n_kv)
        tap("attn.out", a)
        o = a @ p("self_attn.o_proj").T
        tap("attn.o_proj", o)
        x = x + o
        tap("resid_mid", x)
        h = rms_norm(x, p("post_attention_layernorm"), c["rms_norm_eps"])
        tap("mlp_norm", h)
        gate, up = h @ p("mlp.gate_proj").T, h @ p("mlp.up_proj").T
        act = torch.nn.functional.silu(gate) * up
        down = act @ p("mlp.down_proj").T
        for name, t in (("mlp.gate", gate), ("mlp.up", up), ("mlp.act", act), ("mlp.down", down)):
            tap(name, t)
        x = x + down
        tap("out", x)
        return x


def rms_norm(x, weight, eps):  # [T, F] -> [T, F], statistics in fp32 or wider
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(n: int, head_dim: int, theta: float):  # -> cos, sin: [T, head_dim] in fp32
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, n_heads, cos, sin):  # [T, H*D] -> [T, H*D]
    t = x.view(x.shape[0], n_heads, -1)
    half = t.shape[-1] // 2
    rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
    return (t * cos[:, None].to(t.dtype) + rotated * sin[:, None].to(t.dtype)).flatten(1)


def causal_attention(q, k, v, n_heads, n_kv):  # [T, H*D], [T, KV*D] x2 -> [T, H*D]
    T = q.shape[0]
    q, k, v = (t.view(T, n, -1).transpose(0, 1) for t, n in ((q, n_heads), (k, n_kv), (v, n_kv)))
    k, v = k.repeat_interleave(n_heads // n_kv, 0), v.repeat_interleave(n_heads // n_kv, 0)
    scores = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(q.dtype)
    return (probs @ v).transpose(0, 1).flatten(1)
