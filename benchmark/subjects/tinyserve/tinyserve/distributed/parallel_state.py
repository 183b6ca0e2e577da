"""This process's place in the tensor-parallel group, and the collectives layers use."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=300)
_rank, _world = 0, 1


def init(rank: int, world_size: int, init_method: str) -> None:
    global _rank, _world
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=TIMEOUT)
    _rank, _world = rank, world_size


def destroy() -> None:
    global _rank, _world
    if dist.is_initialized():
        dist.destroy_process_group()
    _rank, _world = 0, 1


def get_tp_rank() -> int:
    return _rank


def get_tp_size() -> int:
    return _world


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, accumulated in fp32 (or wider) and rounded once to x's dtype."""
    if _world == 1:
        return x
    acc = x.to(torch.promote_types(x.dtype, torch.float32)).contiguous()
    dist.all_reduce(acc)
    return acc.to(x.dtype)


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """[..., F] per rank -> [..., tp * F], rank order."""
    if _world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)
