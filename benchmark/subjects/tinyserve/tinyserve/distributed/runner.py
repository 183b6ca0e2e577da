"""Tensor-parallel model runner.

Rank 0 is the engine's own process: it schedules, samples and owns the outputs.
Ranks 1.. are spawned processes that only run their shard of the model. Every
forward of rank 0's model is mirrored: a pre-hook broadcasts (input ids,
positions, forward context) and the other ranks run the same forward, meeting
rank 0 in each all-reduce / all-gather; when the context asks for logits they
join the vocabulary gather too. `call_all_ranks(fn, ...)` runs a picklable
function on every rank (observers use it to read a rank's activations).
"""
from __future__ import annotations

import atexit
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tinyserve.config import Config
from tinyserve.distributed import parallel_state
from tinyserve.engine.model_runner import ModelRunner
from tinyserve.forward_context import get_forward_context, set_forward_context
from tinyserve.layers.attention import Attention

_active: list["TPModelRunner"] = []      # the driver of this process's group (one at a time)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broadcast(obj=None):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class TPModelRunner(ModelRunner):
    def __init__(self, config: Config, rank: int = 0):
        self.rank, self.workers = rank, []
        if rank == 0:
            self._start_workers(config)
        super().__init__(config)
        if rank == 0:
            self.model.register_forward_pre_hook(self._mirror_forward)

    def _start_workers(self, config: Config) -> None:
        for old in list(_active):
            old.shutdown()
        tp, init_method = config.tensor_parallel_size, f"tcp://127.0.0.1:{_free_port()}"
        ctx = mp.get_context("spawn")
        for rank in range(1, tp):
            proc = ctx.Process(target=worker_main, args=(config, rank, init_method), daemon=True)
            proc.start()
            self.workers.append(proc)
        parallel_state.init(0, tp, init_method)
        _active.append(self)
        atexit.register(self.shutdown)

    def allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's KV heads only."""
        shape = (self.config.num_kv_blocks, self.block_size, None, self.config.model_config.head_dim)
        caches = []
        for module in self.model.modules():
            if isinstance(module, Attention):
                s = shape[:2] + (module.num_kv_heads,) + shape[3:]
                module.k_cache = torch.zeros(s, dtype=self.config.torch_dtype)
                module.v_cache = torch.zeros(s, dtype=self.config.torch_dtype)
                caches.append((module.k_cache, module.v_cache))
        return caches

    def _mirror_forward(self, _module, args):
        input_ids, positions = args
        _broadcast(("forward", input_ids, positions, get_forward_context()))

    def call_all_ranks(self, fn, *args) -> list:
        """fn(runner, *args) on every rank (fn must be importable by name) -> results in rank order."""
        _broadcast(("call", fn, args))
        results = [None] * self.config.tensor_parallel_size
        dist.gather_object(fn(self, *args), results, dst=0)
        return results

    def shutdown(self) -> None:
        if self not in _active:
            return
        _active.remove(self)
        try:
            _broadcast(("stop",))
        finally:
            for proc in self.workers:
                proc.join(timeout=30)
            parallel_state.destroy()

    # ---- ranks > 0

    def serve(self) -> None:
        """Follow rank 0 until it says stop."""
        while True:
            message = _broadcast()
            if message[0] == "stop":
                return
            if message[0] == "call":
                _, fn, args = message
                dist.gather_object(fn(self, *args), None, dst=0)
                continue
            _, input_ids, positions, ctx = message
            with torch.inference_mode(), set_forward_context(ctx):
                hidden = self.model(input_ids, positions)
                if ctx.logits_indices.numel():
                    self.model.compute_logits(hidden[ctx.logits_indices])


def worker_main(config: Config, rank: int, init_method: str) -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    parallel_state.init(rank, config.tensor_parallel_size, init_method)
    try:
        TPModelRunner(config, rank=rank).serve()
    finally:
        parallel_state.destroy()
