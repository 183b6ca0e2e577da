"""Continuous batching under a token budget.

With chunked prefill, one step mixes decodes and prefill chunks: running
sequences go first (decode, or the next chunk of an unfinished prefill), then
waiting sequences are admitted while budget, `max_num_seqs` and KV blocks
allow. Without it, a step is either all prefills (whole prompts) or all decodes,
prefills first. When blocks run out, the most recently admitted running
sequence is preempted: its blocks are freed and it is recomputed later.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tinyserve.config import Config
from tinyserve.engine.block_manager import BlockManager
from tinyserve.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)   # tokens computed this step, per sequence
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(n)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(self, config: Config, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        if self.config.enable_chunked_prefill:
            budget = self._schedule_running(out, budget)
            self._schedule_waiting(out, budget)
        elif not self._schedule_waiting(out, budget):
            self._schedule_running(out, budget)
        if out.is_empty and self.waiting and not self.running:
            raise RuntimeError(f"request {self.waiting[0].request_id} cannot be scheduled: "
                               "not enough KV blocks or token budget")
        return out

    def _chunk(self, seq: Sequence, budget: int) -> int:
        if self.config.enable_chunked_prefill:
            return min(seq.num_uncomputed_tokens, budget)
        return seq.num_uncomputed_tokens

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Running sequences in admission order; preempt from the back when blocks run out."""
        for seq in list(self.running):
            if seq.status != SequenceStatus.RUNNING or budget <= 0:
                continue
            n = self._chunk(seq, budget)
            if n > budget:
                continue
            while not self.block_manager.allocate_slots(seq, n):
                victim = self.running[-1]
                self.preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.add(seq, n)
                budget -= n
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting sequences in arrival order (FCFS: stop at the first that does not fit)."""
        admitted = 0
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached = self.block_manager.get_computed_blocks(seq)
            remaining = seq.num_tokens - len(cached) * self.block_manager.block_size
            n = min(remaining, budget)
            if n < remaining and not self.config.enable_chunked_prefill:
                break
            if not self.block_manager.allocate(seq, cached, n):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.add(seq, n)
            budget -= n
            admitted += 1
        return admitted

    def preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self.block_manager.free(seq)

    def update_computed(self, out: SchedulerOutput) -> list[Sequence]:
        """After the forward: advance each sequence's computed count, register full
        blocks for prefix caching; -> sequences whose whole context is now computed
        (they sampled a token this step)."""
        done = []
        for seq, n in zip(out.seqs, out.num_new_tokens):
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)
            if seq.num_computed_tokens == seq.num_tokens:
                done.append(seq)
        return done
