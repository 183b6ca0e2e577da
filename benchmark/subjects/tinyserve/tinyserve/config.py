"""Engine and model configuration.

`Config` is the one object a run is built from (engine options, checked on
creation); `ModelConfig` is the part of the checkpoint's config.json the model
code reads, normalised across architectures (legacy and transformers-5 names).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "gemma2")


@dataclass(slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    hidden_act: str
    rope_parameters: dict
    sliding_windows: list           # per layer: window size or None (full attention)
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None
    eos_token_ids: tuple = ()
    bos_token_id: int | None = None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))

    @classmethod
    def from_dict(cls, hf: dict) -> "ModelConfig":
        arch = hf.get("model_type")
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported model_type {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        gemma = arch == "gemma2"
        return cls(
            model_type=arch, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            hidden_act=hf.get("hidden_activation") or hf.get("hidden_act", "silu"),
            rope_parameters=rope_parameters(hf), sliding_windows=sliding_windows(hf),
            # qwen2 puts a bias on q/k/v only; llama's attention_bias covers o_proj too
            qkv_bias=arch == "qwen2" or bool(hf.get("attention_bias", False)),
            o_proj_bias=arch != "qwen2" and bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
            attn_logit_softcapping=hf.get("attn_logit_softcapping") if gemma else None,
            final_logit_softcapping=hf.get("final_logit_softcapping") if gemma else None,
            query_pre_attn_scalar=hf.get("query_pre_attn_scalar") if gemma else None,
            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
            bos_token_id=hf.get("bos_token_id"),
        )


def rope_parameters(hf: dict) -> dict:
    """config.json -> one flat rope dict with rope_type and rope_theta always set.

    Reads transformers-5 `rope_parameters` or the legacy `rope_scaling` + `rope_theta`.
    """
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    if params["rope_type"] in ("llama3", "yarn"):
        # like transformers: the pretraining length defaults to max_position_embeddings
        params.setdefault("original_max_position_embeddings",
                          hf.get("original_max_position_embeddings", hf.get("max_position_embeddings", 2048)))
    return params


def sliding_windows(hf: dict) -> list:
    """Per-layer sliding window (None = full attention)."""
    n, window = hf["num_hidden_layers"], hf.get("sliding_window")
    types = hf.get("layer_types")
    if types is None and hf.get("model_type") == "gemma2":
        # older gemma2 configs: even layers slide, odd layers attend globally
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if types is None:
        return [window] * n
    return [window if t == "sliding_attention" else None for t in types]


@dataclass(slots=True)
class Config:
    model: str
    dtype: str = "float32"
    block_size: int = 16
    num_kv_blocks: int | None = None
    num_gpu_blocks: int | None = None        # vLLM's name for num_kv_blocks
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 64
    max_model_len: int | None = None
    native_kernels: tuple = ()
    seed: int = 0
    quantization: str | None = None          # "int8" | "int4": weight-only, quantized at load time
    quant_group_size: int = 32               # int4: input columns sharing one scale / zero point
    speculative: str | None = None           # "ngram" (prompt lookup) | "draft" (a small draft model)
    num_speculative_tokens: int = 3          # k: tokens proposed per step and verified in one forward
    draft_model: str | None = None           # "draft": checkpoint dir of the draft model
    ngram_min: int = 1                       # "ngram": shortest / longest suffix looked up in the context
    ngram_max: int = 3
    tensor_parallel_size: int = 1            # ranks (processes, gloo) the model is sharded over
    model_config: ModelConfig | None = field(default=None, repr=False)

    def __post_init__(self):
        if not (Path(self.model) / "config.json").exists():
            raise ValueError(f"model dir {self.model} has no config.json")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        self.model_config = self.model_config or ModelConfig.from_dir(self.model)
        self.max_model_len = self.max_model_len or self.model_config.max_position_embeddings
        self.num_kv_blocks = self._resolve_num_blocks()
        self.max_num_batched_tokens = self._resolve_token_budget()
        self.native_kernels = tuple(self.native_kernels)
        from tinyserve.ops import KERNELS  # late: ops imports torch-heavy modules
        unknown = set(self.native_kernels) - set(KERNELS)
        if unknown:
            raise ValueError(f"unknown kernels {sorted(unknown)}; known: {', '.join(KERNELS)}")
        self._check_features()

    def _check_features(self) -> None:
        """Quantization, speculative decoding and tensor parallelism options."""
        if self.quantization not in (None, "int8", "int4"):
            raise ValueError(f"quantization {self.quantization!r} is not one of int8, int4")
        if self.quantization == "int4" and (self.quant_group_size < 2 or self.quant_group_size % 2):
            raise ValueError(f"quant_group_size must be an even number >= 2, got {self.quant_group_size}")
        if self.speculative not in (None, "ngram", "draft"):
            raise ValueError(f"speculative {self.speculative!r} is not one of ngram, draft")
        if self.speculative and self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if self.speculative == "draft" and not (self.draft_model and (Path(self.draft_model) / "config.json").exists()):
            raise ValueError(f"speculative='draft' needs draft_model, a checkpoint dir; got {self.draft_model!r}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        self._check_tensor_parallel()

    def _check_tensor_parallel(self) -> None:
        tp, cfg = self.tensor_parallel_size, self.model_config
        if tp < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tp}")
        if tp == 1:
            return
        if self.quantization:
            raise ValueError("quantization with tensor_parallel_size > 1 is not supported")
        for what, n in (("num_attention_heads", cfg.num_attention_heads), ("num_key_value_heads",
                        cfg.num_key_value_heads), ("intermediate_size", cfg.intermediate_size),
                        ("vocab_size", cfg.vocab_size)):
            if n % tp:
                raise ValueError(f"tensor_parallel_size {tp} does not divide {what} ({n})")

    def _resolve_num_blocks(self) -> int:
        if self.num_kv_blocks and self.num_gpu_blocks and self.num_kv_blocks != self.num_gpu_blocks:
            raise ValueError("num_kv_blocks and num_gpu_blocks disagree; set one")
        blocks = self.num_kv_blocks or self.num_gpu_blocks or -(-8192 // self.block_size)
        if blocks < 2:
            raise ValueError(f"need at least 2 KV blocks, got {blocks}")
        return blocks

    def _resolve_token_budget(self) -> int:
        budget = self.max_num_batched_tokens or (2048 if self.enable_chunked_prefill
                                                 else max(2048, self.max_model_len))
        if not self.enable_chunked_prefill and budget < self.max_model_len:
            # without chunking a whole prompt must fit one step
            raise ValueError(f"max_num_batched_tokens ({budget}) < max_model_len ({self.max_model_len}) "
                             "needs enable_chunked_prefill")
        if budget < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        return budget

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
