"""llama.cpp graph node names -> canonical taps (tools/probe/taps.py, DESIGN §2).

llama.cpp names graph tensors through its graph callback: `<name>-<layer>` inside a layer, plain
`<name>` outside (src/llama-graph.cpp, src/models/<arch>.cpp). A name can sit on several nodes:
`Qcur-0` is the projection (MUL_MAT, then ADD with a bias), its reshaped view, and the RoPE'd
tensor. A tap takes the *last* node of its name whose op fits (NODE_TAPS: None = any op but a view):

    embd            GET_ROWS (+scale) embed                  (first node of every graph evaluation)
    attn_norm-i     MUL (norm*weight) layers.i.attn_norm
    Qcur-i / Kcur-i not ROPE          layers.i.attn.q / .k   (bias added where the arch has one)
    Qcur-i / Kcur-i ROPE              layers.i.attn.q_rot / .k_rot
    Vcur-i          not ROPE          layers.i.attn.v
    kqv_out-i       CONT | RESHAPE    layers.i.attn.out      (heads merged, before wo; RESHAPE with flash attention)
    attn_out-i                        layers.i.attn.o_proj   (qwen2 leaves it unnamed: the MUL_MAT
                                                             by blk.i.attn_output.weight, WEIGHT_TAPS)
    ffn_inp-i                         layers.i.resid_mid
    ffn_norm-i                        layers.i.mlp_norm
    ffn_gate-i / ffn_up-i             layers.i.mlp.gate / .up
    ffn_swiglu-i | ffn_gate_par-i     layers.i.mlp.act       (fused silu(gate)*up, or its unfused mul)
    ffn_out-i       MUL_MAT           layers.i.mlp.down
    l_out-i                           layers.i.out
    result_norm                       final_norm
    result_output                     logits

Layout: ggml's ne[0] is the fastest dim, so a node's numpy shape is (tokens, ..., features) and a
row is one token of the ubatch; (tokens, heads, head_dim) is flattened to (tokens, heads*head_dim),
GQA K/V keep their n_kv_head heads. On archs whose q/k rows the converter permuted for llama.cpp's
pair-wise RoPE (gguf_convert.PERMUTED_ROPE), q, k, q_rot and k_rot are put back into HF's per-head
half layout (unpermute_heads).
"""

from __future__ import annotations

import re

import numpy as np

from tools.engines.llamacpp.ggml import GraphNode

EMBED_NODE = "embd"  # the token embeddings (llm_graph_context::build_inp_embd)
VIEW_OPS = ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE")
# ggml base name -> [(canonical tap, ops it must have (None: any computed op), ops it must not have)]
NODE_TAPS: dict[str, list[tuple[str, tuple[str, ...] | None, tuple[str, ...]]]] = {
    EMBED_NODE: [("embed", None, ())],
    "attn_norm": [("attn_norm", None, ())],
    "Qcur": [("attn.q", None, ("ROPE",)), ("attn.q_rot", ("ROPE",), ())],
    "Kcur": [("attn.k", None, ("ROPE",)), ("attn.k_rot", ("ROPE",), ())],
    "Vcur": [("attn.v", None, ("ROPE",))],
    "kqv_out": [("attn.out", ("CONT", "RESHAPE"), ())],  # RESHAPE: of the flash-attention output
    "attn_out": [("attn.o_proj", None, ())],
    "ffn_inp": [("resid_mid", None, ())],
    "ffn_norm": [("mlp_norm", None, ())],
    "ffn_gate": [("mlp.gate", None, ())],
    "ffn_up": [("mlp.up", None, ())],
    "ffn_swiglu": [("mlp.act", None, ())],
    "ffn_gate_par": [("mlp.act", None, ())],
    "ffn_out": [("mlp.down", ("MUL_MAT",), ())],
    "l_out": [("out", None, ())],
    "result_norm": [("final_norm", None, ())],
    "result_output": [("logits", None, ())],
}
HEAD_SPLIT_TAPS = ("attn.q", "attn.k", "attn.q_rot", "attn.k_rot")  # un-permuted on PERMUTED_ROPE archs
GLOBAL_TAPS = ("embed", "final_norm", "logits")
TAPS = ("embed", "layers.*", "final_norm", "logits")  # what the adapter reports (Capabilities.taps)
_LAYER_NAME = re.compile(r"^(.+)-(\d+)$")
# GGUF weight -> the tap of the matmul by it, for matmuls the model's graph leaves unnamed
WEIGHT_TAPS = {"attn_output": "attn.o_proj"}
UNNAMED = "node_"  # ggml's name for a graph node nobody named
_WEIGHT = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def base_name(name: str) -> tuple[str, int | None]:
    """'Qcur-0' -> ('Qcur', 0); 'result_output' -> ('result_output', None)."""
    m = _LAYER_NAME.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


def wanted_node(name: str) -> bool:
    """The eval callback's question: could this node feed a tap? (unnamed nodes may: WEIGHT_TAPS)"""
    return base_name(name)[0] in NODE_TAPS or name.startswith(UNNAMED)


def weight_tap(node: GraphNode) -> str | None:
    """A matmul no callback named (qwen2's o_proj) -> its tap, by the weight it multiplies."""
    m = _WEIGHT.match(node.srcs[0]) if node.op == "MUL_MAT" and node.srcs else None
    return f"layers.{m.group(1)}.{WEIGHT_TAPS[m.group(2)]}" if m and m.group(2) in WEIGHT_TAPS else None


def node_tap(node: GraphNode) -> str | None:
    """A computed node -> the canonical tap it gives (None: none, or a view of one)."""
    if node.name.startswith(UNNAMED):
        return weight_tap(node)
    base, layer = base_name(node.name)
    for tap, ops, not_ops in NODE_TAPS.get(base, ()):
        if (node.op in ops if ops is not None else node.op not in VIEW_OPS) and node.op not in not_ops:
            if tap in GLOBAL_TAPS:
                return tap if layer is None else None
            return None if layer is None else f"layers.{layer}.{tap}"
    return None


def unpermute_heads(x: np.ndarray, head_dim: int) -> np.ndarray:
    # [T, H*D] llama.cpp's pair layout (h, i, s) -> [T, H*D] HF's half layout (h, s, i), s in {0, 1}
    t, f = x.shape
    return x.reshape(t, f // head_dim, head_dim // 2, 2).swapaxes(2, 3).reshape(t, f)


def tap_rows(node: GraphNode, n_tokens: int) -> np.ndarray:
    # node data [tokens, F] or [tokens, heads, head_dim] (ne reversed) -> [tokens, features]
    assert node.data is not None, f"{node.name}: read without data"
    if n_tokens not in (node.ne[1], node.ne[2]) or node.data.size % n_tokens:  # tokens: ne[1] (2-D), ne[2] (heads)
        raise ValueError(f"{node.name} ({node.op}) has ne {node.ne} for a ubatch of {n_tokens} tokens")
    return node.data.reshape(n_tokens, -1)


def graph_taps(nodes: list[GraphNode], n_tokens: int, head_dim: int, permuted: bool) -> dict[str, np.ndarray]:
    """The nodes one ubatch's graph computed, in order -> {canonical tap: [tokens, features]}.
    A later node of the same tap replaces an earlier one (Qcur's ADD after its MUL_MAT)."""
    out: dict[str, np.ndarray] = {}
    for node in nodes:
        tap = node_tap(node)
        if tap is None:
            continue
        rows = tap_rows(node, n_tokens)
        if permuted and tap.rsplit(".", 1)[-1] in ("q", "k", "q_rot", "k_rot"):
            rows = unpermute_heads(rows, head_dim)
        out[tap] = rows
    return out
