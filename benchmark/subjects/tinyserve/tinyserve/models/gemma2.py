"""Gemma 2: sandwich norms, (1 + w) RMSNorm, scaled embedding, soft-capping,
query_pre_attn_scalar, sliding window on alternate layers, gelu-tanh, tied head."""
from __future__ import annotations

from torch import nn

from tinyserve.config import ModelConfig
from tinyserve.layers.layernorm import GemmaRMSNorm
from tinyserve.models.llama import GatedMLP, LlamaAttention, LlamaForCausalLM, LlamaModel


class Gemma2DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, kernels, max_model_len: int):
        super().__init__()
        scale = cfg.query_pre_attn_scalar ** -0.5
        self.self_attn = LlamaAttention(cfg, layer_idx, kernels, max_model_len, scale=scale)
        self.mlp = GatedMLP(cfg, kernels)
        hs, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hs, eps, kernels)
        self.post_attention_layernorm = GemmaRMSNorm(hs, eps, kernels)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hs, eps, kernels)
        self.post_feedforward_layernorm = GemmaRMSNorm(hs, eps, kernels)

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma2Model(LlamaModel):
    layer_cls = Gemma2DecoderLayer
    norm_cls = GemmaRMSNorm


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_cls = Gemma2Model

    def build_model(self, cfg, kernels, max_model_len):
        return self.model_cls(cfg, kernels, max_model_len, embed_scale=cfg.hidden_size ** 0.5)
