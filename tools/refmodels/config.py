"""What the reference models read from a checkpoint's config.json, and how the archs differ.

The four supported architectures share one decoder (pre-norm residual blocks, RMSNorm,
rotary attention with grouped KV heads, gated MLP); `ARCHS` lists what each changes,
as plain data. Keys follow the HF config.json names, legacy and transformers-5 alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Arch:
    norms: dict  # canonical tap of each norm -> its weight name in the layer
    norm_offset: float = 0.0  # RMSNorm scales by (offset + w): gemma stores the scale as w - 1
    embed_scale: bool = False  # gemma: embeddings times sqrt(hidden_size)
    sliding: str = "none"  # which layers slide: "none", "all", or per `layer_types`
    softcapping: bool = False  # gemma2: cap * tanh(x / cap) on attention scores and final logits
    query_scalar: bool = False  # gemma2: scores scaled by query_pre_attn_scalar^-1/2, not head_dim^-1/2
    tied_default: bool = False  # tie_word_embeddings when config.json does not say


PLAIN_NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
# gemma2 normalises each block's input and output ("sandwich"): four norms per layer
SANDWICH_NORMS = {
    "attn_norm": "input_layernorm",
    "attn.post_norm": "post_attention_layernorm",
    "mlp_norm": "pre_feedforward_layernorm",
    "mlp.post_norm": "post_feedforward_layernorm",
}

ARCHS = {
    "llama": Arch(PLAIN_NORMS),
    "mistral": Arch(PLAIN_NORMS, sliding="all"),
    "qwen2": Arch(PLAIN_NORMS, sliding="layer_types"),
    "gemma2": Arch(
        SANDWICH_NORMS,
        norm_offset=1.0,
        embed_scale=True,
        sliding="layer_types",
        softcapping=True,
        query_scalar=True,
        tied_default=True,
    ),
}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


@dataclass(frozen=True)
class RefConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    activation: str  # key of ACTIVATIONS' values
    rope: dict  # rope_type, rope_theta and the type's own keys
    max_position_embeddings: int
    windows: tuple  # per layer: sliding window (keys i-W < j <= i) or None
    tie_word_embeddings: bool
    attn_softcap: float | None
    final_softcap: float | None
    score_scale: float  # multiplies q.k
    eos_token_ids: tuple

    @property
    def rules(self) -> Arch:
        return ARCHS[self.arch]


def load_config(checkpoint: str | Path) -> RefConfig:
    return parse_config(json.loads((Path(checkpoint) / "config.json").read_text()))


def parse_config(hf: dict) -> RefConfig:
    arch = hf.get("model_type")
    if arch not in ARCHS:
        raise ValueError(f"refmodel does not implement model_type {arch!r}; known: {', '.join(sorted(ARCHS))}")
    rules = ARCHS[arch]
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if act not in ACTIVATIONS:
        raise ValueError(f"refmodel does not implement activation {act!r}; known: {', '.join(ACTIVATIONS)}")
    scalar = hf.get("query_pre_attn_scalar") if rules.query_scalar else None
    eos = hf.get("eos_token_id")
    return RefConfig(
        arch=arch,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        activation=ACTIVATIONS[act],
        rope=rope_config(hf),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        windows=tuple(layer_windows(hf, rules.sliding, arch)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", rules.tied_default)),
        attn_softcap=hf.get("attn_logit_softcapping") if rules.softcapping else None,
        final_softcap=hf.get("final_logit_softcapping") if rules.softcapping else None,
        score_scale=(scalar or head_dim) ** -0.5,
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
    )


def rope_config(hf: dict) -> dict:
    """transformers-5 `rope_parameters`, or legacy `rope_scaling` + `rope_theta` -> one flat dict."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    rope.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    if rope["rope_type"] in ("llama3", "yarn"):
        # the pretraining context these types extend; absent, it is the model's own length
        rope.setdefault(
            "original_max_position_embeddings",
            hf.get("original_max_position_embeddings") or hf.get("max_position_embeddings", 2048),
        )
    return rope


def layer_windows(hf: dict, sliding: str, arch: str) -> list:
    """Per-layer sliding window or None (full attention)."""
    n, window = hf["num_hidden_layers"], hf.get("sliding_window")
    if sliding == "none" or window is None:
        return [None] * n
    if sliding == "all":
        return [window] * n
    types = hf.get("layer_types") or legacy_layer_types(hf, arch)
    return [window if t == "sliding_attention" else None for t in types]


def legacy_layer_types(hf: dict, arch: str) -> list:
    """Configs from before `layer_types`: gemma2 alternates (sliding first); qwen2 slides
    only with use_sliding_window, and only from layer max_window_layers on."""
    n = hf["num_hidden_layers"]
    if arch == "gemma2":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    first = hf.get("max_window_layers", 0) if hf.get("use_sliding_window") else n
    return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
