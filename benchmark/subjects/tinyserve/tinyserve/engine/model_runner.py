"""Model runner: owns the model, the KV cache and the sampler; turns a scheduled
batch into packed tensors, runs one forward and samples."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tinyserve.config import Config
from tinyserve.engine.scheduler import SchedulerOutput
from tinyserve.engine.sequence import Sequence
from tinyserve.forward_context import AttentionMetadata, ForwardContext, set_forward_context
from tinyserve.layers.attention import Attention
from tinyserve.layers.sampler import Sampler, SamplingTensors, compute_logprobs
from tinyserve.model_loader import load_model


@dataclass
class StepResult:
    seqs: list[Sequence]             # sequences that produced a token this step
    token_ids: list[int]
    logprobs: list[float]            # of the emitted token, raw model distribution
    top_logprobs: list[dict | None]


class ModelRunner:
    def __new__(cls, config: Config, *args, **kwargs):
        # tensor parallelism needs a runner that drives the other ranks; choosing it here keeps
        # `ModelRunner(config)` the one way to build a runner
        if cls is ModelRunner and config.tensor_parallel_size > 1:
            from tinyserve.distributed.runner import TPModelRunner
            return super().__new__(TPModelRunner)
        return super().__new__(cls)

    def __init__(self, config: Config):
        self.config = config
        self.block_size = config.block_size
        self.model = load_model(config)
        self.sampler = Sampler()
        self.kv_caches = self.allocate_kv_cache()

    def allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One [num_blocks, block_size, KVH, D] key and value tensor per attention layer."""
        cfg = self.config.model_config
        shape = (self.config.num_kv_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        caches = []
        for module in self.model.modules():
            if isinstance(module, Attention):
                module.k_cache = torch.zeros(shape, dtype=self.config.torch_dtype)
                module.v_cache = torch.zeros(shape, dtype=self.config.torch_dtype)
                caches.append((module.k_cache, module.v_cache))
        return caches

    def prepare_inputs(self, batch: SchedulerOutput, step: int) -> tuple[torch.Tensor, ForwardContext]:
        """Pack each sequence's new tokens back to back -> (input_ids [T], context)."""
        ids, positions, slots, row_seq, starts, seq_lens = [], [], [], [], [0], []
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            first = seq.num_computed_tokens
            ids += seq.token_ids[first:first + n]
            positions += range(first, first + n)
            slots += [seq.block_table[p // self.block_size] * self.block_size + p % self.block_size
                      for p in range(first, first + n)]
            row_seq += [i] * n
            starts.append(starts[-1] + n)
            seq_lens.append(first + n)
        samples = [i for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens))
                   if seq.num_computed_tokens + n == seq.num_tokens]
        meta = AttentionMetadata(query_start_loc=torch.tensor(starts), seq_lens=torch.tensor(seq_lens),
                                 block_tables=self.block_tables(batch.seqs), slot_mapping=torch.tensor(slots))
        ctx = ForwardContext(step=step, attn_metadata=meta, request_ids=[s.request_id for s in batch.seqs],
                             row_seq_index=torch.tensor(row_seq), positions=torch.tensor(positions),
                             logits_indices=torch.tensor([starts[i + 1] - 1 for i in samples], dtype=torch.long),
                             sample_seq_index=torch.tensor(samples, dtype=torch.long))
        return torch.tensor(ids), ctx

    @staticmethod
    def block_tables(seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(s.block_table) for s in seqs)
        return torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], dtype=torch.long)

    def prepare_sampling(self, seqs: list[Sequence]) -> SamplingTensors:
        return SamplingTensors.build([s.params for s in seqs], [s.prompt_token_ids for s in seqs],
                                     [s.output_token_ids for s in seqs], [s.generator for s in seqs],
                                     self.config.model_config.vocab_size)

    @torch.inference_mode()
    def run(self, batch: SchedulerOutput, step: int) -> StepResult:
        input_ids, ctx = self.prepare_inputs(batch, step)
        seqs = [batch.seqs[i] for i in ctx.sample_seq_index.tolist()]
        with set_forward_context(ctx):
            hidden = self.model(input_ids, ctx.positions)
            if not seqs:
                return StepResult([], [], [], [])
            logits = self.model.compute_logits(hidden[ctx.logits_indices])
            sampled = self.sampler(logits, self.prepare_sampling(seqs)).sampled_token_ids
        return self.postprocess(seqs, logits, sampled)

    @staticmethod
    def postprocess(seqs: list[Sequence], logits: torch.Tensor, sampled: torch.Tensor) -> StepResult:
        """Teacher forcing overrides the sampled token; logprobs are of the emitted token."""
        forced = [s.forced_next_token() for s in seqs]
        tokens = torch.tensor([f if f is not None else int(t) for f, t in zip(forced, sampled.tolist())])
        top_n = max((s.params.logprobs or 0) for s in seqs)
        chosen, top_ids, top_vals = compute_logprobs(logits, tokens, top_n)
        tops = []
        for i, s in enumerate(seqs):
            n = s.params.logprobs
            tops.append(None if n is None else dict(zip(top_ids[i, :n].tolist(), top_vals[i, :n].tolist())))
        return StepResult(seqs, tokens.tolist(), chosen.tolist(), tops)
