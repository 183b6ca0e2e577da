"""Build and load one rank's shard of the model.

Shard layout (rank r of tp; every split is into tp equal contiguous chunks):
    q_proj, k_proj, v_proj, gate_proj, up_proj   rows (output features): heads / channels of rank r
    o_proj, down_proj                            columns (input features); bias on rank 0 only
    embed_tokens, lm_head                        rows (vocabulary ids)
    norms                                        whole
With GQA each rank holds num_heads / tp query heads and the num_kv_heads / tp KV heads
they attend to, so a rank's fused qkv is [q_r | k_r | v_r].
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from tinyserve.config import Config, ModelConfig
from tinyserve.distributed.layers import RowParallelLinear, VocabParallelEmbedding, VocabParallelLogitsProcessor
from tinyserve.distributed.parallel_state import get_tp_rank, get_tp_size
from tinyserve.layers.embedding import LMHead, VocabEmbedding
from tinyserve.layers.linear import RowLinear
from tinyserve.model_loader import SKIPPED_SUFFIXES, iterate_checkpoint, packed_target
from tinyserve.models import get_model_class
from tinyserve.ops import select_kernels

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB_PARALLEL = ("embed_tokens", "lm_head")


def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=cfg.num_key_value_heads // tp,
                               intermediate_size=cfg.intermediate_size // tp)


def shard_tensor(name: str, tensor: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """A checkpoint tensor -> this rank's part of it (see the module docstring)."""
    module = name.split(".")[-2]
    if module in COLUMN_PARALLEL or module in VOCAB_PARALLEL:
        return tensor.chunk(tp, dim=0)[rank]
    if module in ROW_PARALLEL:
        if name.endswith(".bias"):
            return tensor if rank == 0 else torch.zeros_like(tensor)
        return tensor.chunk(tp, dim=1)[rank]
    return tensor


def parallelize(model: nn.Module, rank: int, tp: int) -> None:
    """Swap in the collective-aware layer classes; vocabulary tables shrink to this rank's rows."""
    for module in model.modules():
        if type(module) is RowLinear:
            module.__class__ = RowParallelLinear
        elif type(module) in (VocabEmbedding, LMHead):
            vocab, hidden = module.weight.shape
            module.weight = nn.Parameter(torch.empty(vocab // tp, hidden, dtype=module.weight.dtype),
                                         requires_grad=False)
            if isinstance(module, VocabEmbedding):
                module.__class__ = VocabParallelEmbedding
                module.vocab_start, module.vocab_end = rank * vocab // tp, (rank + 1) * vocab // tp
    model.logits_processor.__class__ = VocabParallelLogitsProcessor


def load_sharded_weights(model: nn.Module, model_dir, rank: int, tp: int) -> None:
    params = dict(model.named_parameters())
    loaded = set()
    tied = model.config.tie_word_embeddings
    for name, tensor in iterate_checkpoint(model_dir):
        if name.endswith(SKIPPED_SUFFIXES) or (tied and name.startswith("lm_head.")):
            continue
        target, shard_id = packed_target(name, model.packed_modules_mapping)
        param = params[target]
        part = shard_tensor(name, tensor, rank, tp)
        loader = getattr(param, "weight_loader", None)
        if loader is not None:
            loader(param, part, shard_id)
        else:
            param.data.copy_(part)
        loaded.add(target)
    missing = set(params) - loaded
    if missing:
        raise KeyError(f"parameters not in the checkpoint: {sorted(missing)}")


def load_sharded_model(config: Config) -> nn.Module:
    rank, tp = get_tp_rank(), get_tp_size()
    if tp != config.tensor_parallel_size:
        raise RuntimeError(f"tensor_parallel_size {config.tensor_parallel_size} but the process group has {tp} "
                           "ranks: build tensor-parallel models through TPModelRunner")
    cfg = shard_config(config.model_config, tp)
    model = get_model_class(cfg.model_type)(cfg, select_kernels(config.native_kernels), config.max_model_len)
    parallelize(model, rank, tp)
    model.to(config.torch_dtype)
    load_sharded_weights(model, config.model, rank, tp)
    return model.eval()
