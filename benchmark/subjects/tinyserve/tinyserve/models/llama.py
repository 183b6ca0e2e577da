"""Llama-family decoder (llama, mistral, qwen2): the differences are config data.

Residual stream convention (as vLLM): each layer returns (hidden, residual) and
the next norm adds them, fused; the final norm adds the last layer's pair.
"""
from __future__ import annotations

import torch
from torch import nn

from tinyserve.config import ModelConfig
from tinyserve.layers.activation import GatedActivation
from tinyserve.layers.attention import Attention
from tinyserve.layers.embedding import LMHead, LogitsProcessor, VocabEmbedding
from tinyserve.layers.layernorm import RMSNorm
from tinyserve.layers.linear import MergedColumnLinear, QKVLinear, RowLinear
from tinyserve.layers.rotary_embedding import RotaryEmbedding


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, kernels, max_model_len: int, scale: float | None = None):
        super().__init__()
        h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_size, self.kv_size = h * d, kvh * d
        self.qkv_proj = QKVLinear(cfg.hidden_size, d, h, kvh, bias=cfg.qkv_bias)
        self.o_proj = RowLinear(h * d, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.rotary_emb = RotaryEmbedding(d, cfg.max_position_embeddings, max_model_len, cfg.rope_parameters, kernels)
        self.attn = Attention(h, kvh, d, scale if scale is not None else d ** -0.5, kernels,
                              sliding_window=cfg.sliding_windows[layer_idx], softcap=cfg.attn_logit_softcapping)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels):
        super().__init__()
        i = cfg.intermediate_size
        self.gate_up_proj = MergedColumnLinear(cfg.hidden_size, [i, i], bias=cfg.mlp_bias)
        self.act_fn = GatedActivation(cfg.hidden_act, kernels)
        self.down_proj = RowLinear(i, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, kernels, max_model_len: int):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx, kernels, max_model_len)
        self.mlp = GatedMLP(cfg, kernels)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    layer_cls = LlamaDecoderLayer
    norm_cls = RMSNorm

    def __init__(self, cfg: ModelConfig, kernels, max_model_len: int, embed_scale: float | None = None):
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, scale=embed_scale)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i, kernels, max_model_len)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = self.norm_cls(cfg.hidden_size, cfg.rms_norm_eps, kernels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    model_cls = LlamaModel
    # fused parameter -> the checkpoint projections it holds, in shard order
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, cfg: ModelConfig, kernels, max_model_len: int):
        super().__init__()
        self.config = cfg
        self.model = self.build_model(cfg, kernels, max_model_len)
        self.lm_head = self.model.embed_tokens if cfg.tie_word_embeddings else LMHead(cfg.vocab_size, cfg.hidden_size)
        self.logits_processor = LogitsProcessor(cfg.vocab_size, cfg.final_logit_softcapping)

    def build_model(self, cfg, kernels, max_model_len):
        return self.model_cls(cfg, kernels, max_model_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden)
