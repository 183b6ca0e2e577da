"""Custom kernels, each with an optimized path and a `native` twin.

The native twin is plain, obviously-correct torch; the optimized path is what
the engine runs by default. `select_kernels(native=[...])` picks, per kernel
name, which of the two a model is built with, so a suspect kernel can be
swapped for its twin without touching anything else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tinyserve.ops.activation import gelu_tanh_and_mul, gelu_tanh_and_mul_native, silu_and_mul, silu_and_mul_native
from tinyserve.ops.attention import paged_attention, paged_attention_native
from tinyserve.ops.quant_matmul import dequant_matmul, dequant_matmul_native
from tinyserve.ops.norm import fused_add_rms_norm, fused_add_rms_norm_native, rms_norm, rms_norm_native
from tinyserve.ops.rotary import rotary_embedding, rotary_embedding_native

# name -> (optimized, native)
KERNEL_IMPLS: dict[str, tuple[Callable, Callable]] = {
    "rms_norm": (rms_norm, rms_norm_native),
    "fused_add_rms_norm": (fused_add_rms_norm, fused_add_rms_norm_native),
    "rotary_embedding": (rotary_embedding, rotary_embedding_native),
    "silu_and_mul": (silu_and_mul, silu_and_mul_native),
    "gelu_tanh_and_mul": (gelu_tanh_and_mul, gelu_tanh_and_mul_native),
    "paged_attention": (paged_attention, paged_attention_native),
    "dequant_matmul": (dequant_matmul, dequant_matmul_native),
}
KERNELS = list(KERNEL_IMPLS)


@dataclass(frozen=True)
class KernelSet:
    """The kernel implementations one model instance runs with."""
    rms_norm: Callable
    fused_add_rms_norm: Callable
    rotary_embedding: Callable
    silu_and_mul: Callable
    gelu_tanh_and_mul: Callable
    paged_attention: Callable
    dequant_matmul: Callable
    native: tuple = ()


def get_kernel(name: str, native: bool = False) -> Callable:
    if name not in KERNEL_IMPLS:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(KERNELS)}")
    return KERNEL_IMPLS[name][1 if native else 0]


def select_kernels(native=()) -> KernelSet:
    """Kernel names listed in `native` run their native twin; the rest the optimized path."""
    native = tuple(native)
    unknown = set(native) - set(KERNELS)
    if unknown:
        raise KeyError(f"unknown kernels {sorted(unknown)}; known: {', '.join(KERNELS)}")
    return KernelSet(**{name: get_kernel(name, name in native) for name in KERNELS}, native=native)
