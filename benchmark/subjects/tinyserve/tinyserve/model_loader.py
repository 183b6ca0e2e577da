"""Build a model from an HF checkpoint dir (config.json + *.safetensors)."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from tinyserve.config import Config
from tinyserve.models import get_model_class
from tinyserve.ops import select_kernels

# checkpoint tensors with no parameter here (recomputed, not loaded)
SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)


def iterate_checkpoint(model_dir: str | Path):
    """-> (name, fp32-or-stored-dtype tensor) for every tensor in every safetensors file."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def packed_target(name: str, mapping: dict) -> tuple[str, int | None]:
    """'...self_attn.k_proj.weight' -> ('...self_attn.qkv_proj.weight', 1)."""
    for fused, parts in mapping.items():
        for shard_id, part in enumerate(parts):
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{fused}."), shard_id
    return name, None


def load_weights(model: nn.Module, model_dir: str | Path) -> None:
    params = dict(model.named_parameters())
    loaded = set()
    tied = model.config.tie_word_embeddings
    for name, tensor in iterate_checkpoint(model_dir):
        if name.endswith(SKIPPED_SUFFIXES) or (tied and name.startswith("lm_head.")):
            continue
        target, shard_id = packed_target(name, model.packed_modules_mapping)
        if target not in params:
            raise KeyError(f"checkpoint tensor {name} has no parameter {target} in {type(model).__name__}")
        param = params[target]
        loader = getattr(param, "weight_loader", None)
        if loader is not None:
            loader(param, tensor, shard_id)
        else:
            param.data.copy_(tensor)
        loaded.add((target, shard_id))
    missing = {n for n in params if not any(t == n for t, _ in loaded)}
    if missing:
        raise KeyError(f"parameters not in the checkpoint: {sorted(missing)}")


def load_model(config: Config) -> nn.Module:
    if config.tensor_parallel_size > 1:
        from tinyserve.distributed.loader import load_sharded_model
        return load_sharded_model(config)
    if config.quantization:
        from tinyserve.quantization import load_quantized_model
        return load_quantized_model(config)
    cfg = config.model_config
    model = get_model_class(cfg.model_type)(cfg, select_kernels(config.native_kernels), config.max_model_len)
    model.to(config.torch_dtype)
    load_weights(model, config.model)
    return model.eval()
