"""Canonical tap names and their execution order (docs/design.md §2).

Every engine adapter reports intermediate states under these names so that two
engines built differently line up. Per layer, in execution order:

    attn_norm            input norm of the attention block (gemma2: input_layernorm)
    attn.q / .k / .v     projections, before RoPE, [tokens, heads*head_dim]
    attn.q_rot / .k_rot  after rotary embedding
    attn.out             attention output, before o_proj
    attn.o_proj          after o_proj
    attn.post_norm       gemma2 only: post_attention_layernorm applied to o_proj's output
    resid_mid            residual stream after the attention block
    mlp_norm             norm in front of the MLP (llama: post_attention_layernorm;
                         gemma2: pre_feedforward_layernorm)
    mlp.gate / .up       projections
    mlp.act              act(gate) * up, the input of down
    mlp.down             after down_proj
    mlp.post_norm        gemma2 only: post_feedforward_layernorm
    out                  residual stream leaving the layer

Global taps: `embed` first (after any embedding scale), then the layers, then
`final_norm`, `logits` (after final soft-capping), `sampler.logits` (after
penalties / temperature), `sampler.probs`, `sampler.token` (the sampled id as a
one-column float row).

Row convention: the row at position p is computed from input token p; `logits`
row p scores token p+1; `sampler.*` rows exist only where a token was sampled.
"""

from __future__ import annotations

import fnmatch
import functools
import re

LAYER_TAPS = (
    "attn_norm",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.q_rot",
    "attn.k_rot",
    "attn.out",
    "attn.o_proj",
    "attn.post_norm",
    "resid_mid",
    "mlp_norm",
    "mlp.gate",
    "mlp.up",
    "mlp.act",
    "mlp.down",
    "mlp.post_norm",
    "out",
)
HEAD_TAPS = ("final_norm", "logits", "sampler.logits", "sampler.probs", "sampler.token")
# pseudo-tap: the drawn tokens judged together, by a uniformity test of their PIT values (tools.probe.draws);
# no engine reports it, and it is computed from `sampler.probs` and `sampler.token`
DRAWS_TAP = "sampler.draws"
OUTPUT_TAPS = ("logits", "sampler.logits", "sampler.probs", "sampler.token", DRAWS_TAP)

_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")

# Which component a tap belongs to: the bridge from "where" to "which code".
TAP_COMPONENT = {
    "embed": "embedding",
    "attn_norm": "norm",
    "mlp_norm": "norm",
    "final_norm": "norm",
    "attn.post_norm": "norm",
    "mlp.post_norm": "norm",
    "attn.q": "linear",
    "attn.k": "linear",
    "attn.v": "linear",
    "attn.o_proj": "linear",
    "mlp.gate": "linear",
    "mlp.up": "linear",
    "mlp.down": "linear",
    "attn.q_rot": "rotary",
    "attn.k_rot": "rotary",
    "attn.out": "attention",
    "resid_mid": "residual",
    "out": "residual",
    "mlp.act": "activation",
    "logits": "lm_head",
    "sampler.logits": "sampler",
    "sampler.probs": "sampler",
    "sampler.token": "sampler",
    DRAWS_TAP: "sampler",
    "detokenizer": "tokenizer",  # pseudo-tap: text vs. the decoding of the same tokens (tools.probe.prober)
}


def layer_tap(i: int, name: str) -> str:
    return f"layers.{i}.{name}"


@functools.cache  # a deep model's trace sorts ~100k records by tap: a few thousand distinct names
def split(tap: str) -> tuple[int | None, str]:
    """'layers.3.attn.q' -> (3, 'attn.q'); 'logits' -> (None, 'logits')."""
    m = _LAYER_RE.match(tap)
    return (int(m.group(1)), m.group(2)) if m else (None, tap)


@functools.cache
def order_key(tap: str) -> tuple[int, int, int]:
    """Execution order within one step: embed, layers in order, head taps."""
    layer, name = split(tap)
    if layer is not None:
        idx = LAYER_TAPS.index(name) if name in LAYER_TAPS else len(LAYER_TAPS)
        return (1, layer, idx)
    if name == "embed":
        return (0, 0, 0)
    idx = HEAD_TAPS.index(name) if name in HEAD_TAPS else len(HEAD_TAPS)
    return (2, 0, idx)


def component(tap: str) -> str:
    return TAP_COMPONENT.get(split(tap)[1], "unknown")


def matches(tap: str, patterns) -> bool:
    """Tap filter: None keeps everything; otherwise fnmatch against any pattern."""
    return patterns is None or any(fnmatch.fnmatchcase(tap, p) for p in patterns)
