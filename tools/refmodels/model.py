"""The decoder, one sequence at a time, as small pure functions over a weight dict.

    x = embed(ids)                                   (gemma: * sqrt(hidden))
    per layer:  h = attn_norm(x); a = o_proj(attention(rope(q(h)), rope(k(h)), v(h)))
                [gemma: a = post_norm(a)];  x = x + a                       (resid_mid)
                h = mlp_norm(x); m = down(act(gate(h)) * up(h))
                [gemma: m = post_norm(m)];  x = x + m                       (out)
    logits = lm_head(final_norm(x))                  (gemma2: cap * tanh(logits / cap))

Every intermediate goes to `emit(tap, x)` under its canonical name (tools.probe.taps) as
[tokens, features]. Norms and the softmax run in `island` precision: float32 by the
checkpoints' convention (see rope.py), float64 for an exact run. Linear layers take a
bias when the checkpoint has one (qwen2's q/k/v, llama's attention_bias / mlp_bias).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tools.refmodels import rope
from tools.refmodels.config import RefConfig, load_config

Emit = Callable[[str, torch.Tensor], None]


@dataclass
class RefModel:
    config: RefConfig
    weights: dict[str, torch.Tensor]  # checkpoint names, run dtype
    dtype: torch.dtype
    island: torch.dtype  # precision of norms, softmax and the rope table

    def w(self, name: str) -> torch.Tensor | None:
        return self.weights.get(name)


def load(checkpoint: str | Path, dtype: torch.dtype, exact: bool = False, device: str = "cpu") -> RefModel:
    """HF-format checkpoint dir (safetensors, one file or sharded) -> RefModel in `dtype`."""
    from safetensors.torch import load_file

    path = Path(checkpoint)
    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    weights = {}
    for f in files:
        weights.update({k: v.to(device=device, dtype=dtype) for k, v in load_file(str(path / f)).items()})
    config = load_config(path)
    if config.tie_word_embeddings or "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    island = torch.float64 if exact and dtype == torch.float64 else torch.float32
    return RefModel(config, weights, dtype, island)


# ---- the pieces ------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, island) -> torch.Tensor:
    """[S, F] -> [S, F]: x / rms(x) * (offset + w), normalised in `island` precision.
    llama-style scales after casting back; gemma scales before (its reference does so)."""
    xi = x.to(island)
    normed = xi * torch.rsqrt(xi.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (normed * (offset + weight.to(island))).to(x.dtype)
    return weight * normed.to(x.dtype)


def linear(m: RefModel, x: torch.Tensor, name: str) -> torch.Tensor:  # [S, in] -> [S, out]
    return F.linear(x, m.weights[f"{name}.weight"], m.w(f"{name}.bias"))


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "silu":
        return F.silu(x)
    return F.gelu(x, approximate="tanh" if name == "gelu_tanh" else "none")


def visible(n: int, window: int | None, device) -> torch.Tensor:
    """[S, S] bool: query i sees key j iff j <= i (and i - j < window when sliding)."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    keep = j <= i
    return keep & (i - j < window) if window is not None else keep


def attend(q, k, v, scale: float, cap: float | None, window: int | None, island) -> torch.Tensor:
    """q [H, S, D], k/v [Hkv, S, D] -> [H, S, D]. Query head h reads KV head h // (H / Hkv)."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    scores = softcap(q @ k.transpose(1, 2) * scale, cap)
    scores = scores.masked_fill(~visible(q.shape[1], window, q.device), float("-inf"))
    probs = scores.to(island).softmax(dim=-1).to(q.dtype)
    return probs @ v


def heads(x: torch.Tensor, n: int) -> torch.Tensor:  # [S, n*D] -> [n, S, D]
    return x.view(x.shape[0], n, -1).transpose(0, 1)


def merge(x: torch.Tensor) -> torch.Tensor:  # [n, S, D] -> [S, n*D]
    return x.transpose(0, 1).reshape(x.shape[1], -1)


# ---- blocks ----------------------------------------------------------------------------------


def attention_block(m: RefModel, i: int, h: torch.Tensor, cos, sin, emit: Emit) -> torch.Tensor:
    """Normed input [S, hidden] -> o_proj output [S, hidden]."""
    c, pre = m.config, f"model.layers.{i}.self_attn"
    q, k, v = (linear(m, h, f"{pre}.{p}_proj") for p in "qkv")
    for name, x in (("attn.q", q), ("attn.k", k), ("attn.v", v)):
        emit(f"layers.{i}.{name}", x)
    q_rot, k_rot = rope.rotate(heads(q, c.num_heads), cos, sin), rope.rotate(heads(k, c.num_kv_heads), cos, sin)
    emit(f"layers.{i}.attn.q_rot", merge(q_rot))
    emit(f"layers.{i}.attn.k_rot", merge(k_rot))
    out = merge(attend(q_rot, k_rot, heads(v, c.num_kv_heads), c.score_scale, c.attn_softcap, c.windows[i], m.island))
    emit(f"layers.{i}.attn.out", out)
    o = linear(m, out, f"{pre}.o_proj")
    emit(f"layers.{i}.attn.o_proj", o)
    return o


def mlp_block(m: RefModel, i: int, h: torch.Tensor, emit: Emit) -> torch.Tensor:
    """Normed input [S, hidden] -> down_proj output [S, hidden]."""
    pre = f"model.layers.{i}.mlp"
    gate, up = linear(m, h, f"{pre}.gate_proj"), linear(m, h, f"{pre}.up_proj")
    act = activation(m.config.activation, gate) * up
    down = linear(m, act, f"{pre}.down_proj")
    for name, x in (("mlp.gate", gate), ("mlp.up", up), ("mlp.act", act), ("mlp.down", down)):
        emit(f"layers.{i}.{name}", x)
    return down


def norm(m: RefModel, x: torch.Tensor, weight_name: str) -> torch.Tensor:
    c = m.config
    return rms_norm(x, m.weights[f"{weight_name}.weight"], c.rms_norm_eps, c.rules.norm_offset, m.island)


def decoder_layer(m: RefModel, i: int, x: torch.Tensor, cos, sin, emit: Emit) -> torch.Tensor:
    """Residual stream [S, hidden] -> [S, hidden]; norms named per arch (config.ARCHS)."""
    norms = {tap: f"model.layers.{i}.{name}" for tap, name in m.config.rules.norms.items()}

    def normed(tap, y):
        y = norm(m, y, norms[tap])
        emit(f"layers.{i}.{tap}", y)
        return y

    a = attention_block(m, i, normed("attn_norm", x), cos, sin, emit)
    x = x + (normed("attn.post_norm", a) if "attn.post_norm" in norms else a)
    emit(f"layers.{i}.resid_mid", x)
    f = mlp_block(m, i, normed("mlp_norm", x), emit)
    x = x + (normed("mlp.post_norm", f) if "mlp.post_norm" in norms else f)
    emit(f"layers.{i}.out", x)
    return x


def embed(m: RefModel, ids: torch.Tensor) -> torch.Tensor:  # [S] -> [S, hidden]
    x = m.weights["model.embed_tokens.weight"][ids]
    if m.config.rules.embed_scale:
        x = x * torch.tensor(m.config.hidden_size**0.5, dtype=m.dtype)
    return x


def forward(m: RefModel, ids: list[int], emit: Emit = lambda _tap, _x: None) -> torch.Tensor:
    """Token ids of one sequence (positions 0..S-1) -> logits [S, vocab]."""
    c = m.config
    device = m.weights["model.embed_tokens.weight"].device
    tokens = torch.tensor(ids, device=device)
    freqs, scale = rope.frequencies(c.rope, c.head_dim, len(ids), c.max_position_embeddings, m.island)
    cos, sin = rope.cos_sin(freqs.to(device), scale, torch.arange(len(ids), device=device), m.dtype)
    x = embed(m, tokens)
    emit("embed", x)
    for i in range(c.num_layers):
        x = decoder_layer(m, i, x, cos, sin, emit)
    x = norm(m, x, "model.norm")
    emit("final_norm", x)
    logits = softcap(linear(m, x, "lm_head"), c.final_softcap)
    emit("logits", logits)
    return logits
