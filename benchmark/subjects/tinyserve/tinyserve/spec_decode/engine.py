"""The speculative step loop.

    schedule -> propose drafts for decoding sequences -> one forward over each
    sequence's last token + drafts -> rejection sampling -> roll back the KV of
    rejected drafts (computed count, block table) -> emit the accepted tokens

Drafts are appended to the sequence only after scheduling, with slots allocated
for them, so the scheduler, preemption and prefix caching never see a draft; a
full block becomes cacheable only once every token in it was accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tinyserve.engine.llm_engine import LLMEngine, RequestOutput
from tinyserve.engine.model_runner import StepResult
from tinyserve.engine.scheduler import SchedulerOutput
from tinyserve.engine.sequence import Sequence
from tinyserve.forward_context import set_forward_context
from tinyserve.layers.sampler import SamplingTensors, compute_logprobs
from tinyserve.spec_decode.proposers import make_proposer
from tinyserve.spec_decode.rejection import RejectionSampler


@dataclass
class VerifyResult:
    """Per scheduled sequence that samples: the tokens it emits this step (accepted drafts + one more)."""
    seqs: list[Sequence] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    tops: list[list[dict | None]] = field(default_factory=list)


class SpecDecodeEngine(LLMEngine):
    def __init__(self, config):
        super().__init__(config)
        self.proposer = make_proposer(config)
        self.model_runner.sampler = RejectionSampler()
        self.rejected_rows: list[tuple[int, str, int]] = []   # (step, request id, first invalid position)
        self.num_draft_tokens = self.num_accepted_tokens = 0  # statistics

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        drafts = self.speculate(batch) if not batch.is_empty else {}
        result = self.verify(batch, drafts) if not batch.is_empty else VerifyResult()
        self.roll_back(batch, drafts, result)
        self.scheduler.update_computed(batch)
        self.step_count += 1
        return self.emit(result, drafts)

    def draft_budget(self, seq: Sequence) -> int:
        """Drafts this decoding sequence may take: k, capped so every emitted token fits max_tokens
        and every drafted position fits max_model_len."""
        if seq.forced_token_ids is not None or seq.num_uncomputed_tokens != 1:
            return 0
        left = seq.params.max_tokens - len(seq.output_token_ids) - 1
        return max(0, min(self.config.num_speculative_tokens, left, self.config.max_model_len - seq.num_tokens))

    def speculate(self, batch: SchedulerOutput) -> dict[int, list[int]]:
        """Propose, append drafts to their sequences, widen their share of the batch; -> {batch index: drafts}."""
        budget = self.config.max_num_batched_tokens - batch.num_batched_tokens
        wanted = [(i, s, self.draft_budget(s)) for i, s in enumerate(batch.seqs)]
        wanted = [(i, s, k) for i, s, k in wanted if k > 0]
        proposals = self.proposer.propose([s for _, s, _ in wanted], [k for _, _, k in wanted])
        drafts = {}
        for (i, seq, _), proposal in zip(wanted, proposals):
            proposal = proposal[:max(0, budget)]
            if not proposal or not self.block_manager.allocate_slots(seq, 1 + len(proposal)):
                continue
            seq.token_ids += proposal
            batch.num_new_tokens[i] += len(proposal)
            budget -= len(proposal)
            drafts[i] = proposal
        return drafts

    @torch.inference_mode()
    def verify(self, batch: SchedulerOutput, drafts: dict[int, list[int]]) -> VerifyResult:
        runner = self.model_runner
        input_ids, ctx = runner.prepare_inputs(batch, self.step_count)
        rows, row_seq, row_draft = verification_rows(ctx, drafts)
        ctx.logits_indices = torch.tensor(rows, dtype=torch.long)
        ctx.sample_seq_index = torch.tensor(row_seq, dtype=torch.long)
        with set_forward_context(ctx):
            hidden = runner.model(input_ids, ctx.positions)
            if not rows:
                return VerifyResult()
            logits = runner.model.compute_logits(hidden[ctx.logits_indices])
            st = self.row_sampling_tensors(batch, row_seq, drafts)
            tokens = runner.sampler(logits, st, torch.tensor(row_draft)).sampled_token_ids
        return self.accepted(batch, drafts, row_seq, row_draft, logits, tokens)

    def row_sampling_tensors(self, batch: SchedulerOutput, row_seq: list[int], drafts) -> SamplingTensors:
        """Row r of a speculated sequence sees drafts d_1..d_r as output (penalties count them)."""
        params, prompts, outputs, gens, seen = [], [], [], [], {}
        for i in row_seq:
            seq, d = batch.seqs[i], drafts.get(i, [])
            r = seen[i] = seen.get(i, -1) + 1
            base = seq.token_ids[seq.num_prompt_tokens:seq.num_tokens - len(d)]
            params.append(seq.params)
            prompts.append(seq.prompt_token_ids)
            outputs.append(base + d[:r])
            gens.append(seq.generator)
        return SamplingTensors.build(params, prompts, outputs, gens, self.config.model_config.vocab_size)

    def accepted(self, batch, drafts, row_seq, row_draft, logits, tokens) -> VerifyResult:
        """Walk each sequence's rows: accepted drafts, then the first differing token (or the bonus)."""
        result = VerifyResult()
        top_n = max((s.params.logprobs or 0) for s in batch.seqs)
        emitted = tokens.clone()
        for r, i in enumerate(row_seq):          # teacher forcing overrides what a plain row sampled
            forced = batch.seqs[i].forced_next_token() if i not in drafts else None
            if forced is not None:
                emitted[r] = forced
        chosen, top_ids, top_vals = compute_logprobs(logits, emitted, top_n)
        for i in dict.fromkeys(row_seq):
            seq, rs = batch.seqs[i], [r for r, j in enumerate(row_seq) if j == i]
            keep = next((n for n, r in enumerate(rs) if row_draft[r] < 0 or int(emitted[r]) != row_draft[r]), len(rs) - 1)
            rs = rs[:keep + 1]
            n = seq.params.logprobs
            result.seqs.append(seq)
            result.tokens.append([int(emitted[r]) for r in rs])
            result.logprobs.append([float(chosen[r]) for r in rs])
            result.tops.append([None if n is None else dict(zip(top_ids[r, :n].tolist(), top_vals[r, :n].tolist()))
                                for r in rs])
        return result

    def roll_back(self, batch: SchedulerOutput, drafts: dict[int, list[int]], result: VerifyResult) -> None:
        """Forget rejected drafts: their tokens, their share of the computed count, their blocks."""
        emitted = {id(s): t for s, t in zip(result.seqs, result.tokens)}
        for i, d in drafts.items():
            seq = batch.seqs[i]
            accepted = len(emitted.get(id(seq), [None])) - 1
            self.num_draft_tokens += len(d)
            self.num_accepted_tokens += accepted
            rejected = len(d) - accepted
            if rejected == 0:
                continue
            del seq.token_ids[seq.num_tokens - rejected:]
            batch.num_new_tokens[i] -= rejected
            self.rejected_rows.append((self.step_count, seq.request_id, seq.num_tokens))
            free_tail_blocks(self.block_manager, seq, seq.num_tokens + 1)

    def emit(self, result: VerifyResult, drafts: dict[int, list[int]]) -> list[RequestOutput]:
        """Accepted drafts are still in token_ids: take them out and emit every token through the
        ordinary path (stop checks, detokenization), stopping at the first that finishes the request."""
        finished = []
        for seq, tokens, lps, tops in zip(result.seqs, result.tokens, result.logprobs, result.tops):
            del seq.token_ids[seq.num_tokens - (len(tokens) - 1):]
            for token, lp, top in zip(tokens, lps, tops):
                finished += self.process_outputs(StepResult([seq], [token], [lp], [top]))
                if seq.is_finished:
                    break
        return finished


def verification_rows(ctx, drafts: dict[int, list[int]]) -> tuple[list[int], list[int], list[int]]:
    """Packed rows whose logits are needed: the last 1 + len(drafts) rows of every sampling
    sequence. -> (rows, scheduled-sequence index per row, draft verified per row or -1)."""
    starts = ctx.attn_metadata.query_start_loc.tolist()
    rows, row_seq, row_draft = [], [], []
    for i in ctx.sample_seq_index.tolist():
        d = drafts.get(i, [])
        for r in range(len(d) + 1):
            rows.append(starts[i + 1] - 1 - len(d) + r)
            row_seq.append(i)
            row_draft.append(d[r] if r < len(d) else -1)
    return rows, row_seq, row_draft


def free_tail_blocks(block_manager, seq: Sequence, num_tokens: int) -> None:
    """Give back the blocks past the first `num_tokens` tokens (they held rejected drafts only)."""
    keep = -(-num_tokens // block_manager.block_size)
    for block_id in reversed(seq.block_table[keep:]):
        block = block_manager.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            block_manager.free_queue[block_id] = None
    del seq.block_table[keep:]
