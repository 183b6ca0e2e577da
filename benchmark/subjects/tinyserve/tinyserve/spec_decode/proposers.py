"""Draft-token proposers. Proposals are deterministic (a point mass), which the
rejection sampler relies on: accept draft x with probability p(x)."""
from __future__ import annotations

import torch

from tinyserve.config import Config
from tinyserve.engine.block_manager import BlockManager
from tinyserve.engine.scheduler import SchedulerOutput
from tinyserve.engine.sequence import Sequence
from tinyserve.sampling_params import SamplingParams


def propose_ngram(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens
    (longest n first) and propose the up-to-k tokens that followed it."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


class NgramProposer:
    def __init__(self, config: Config):
        self.n_min, self.n_max = config.ngram_min, config.ngram_max

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [propose_ngram(s.token_ids, k, self.n_min, self.n_max) if k else [] for s, k in zip(seqs, ks)]


class DraftProposer:
    """A small model with its own paged KV cache proposes k tokens greedily.

    It keeps a shadow sequence per target sequence; before each proposal the shadow
    takes the target's tokens and keeps only the cache of their common prefix, so the
    draft's rejected tokens are recomputed, never reused.
    """

    def __init__(self, config: Config):
        from tinyserve.engine.model_runner import ModelRunner

        budget = max(2048, config.max_model_len)
        self.config = Config(model=config.draft_model, dtype=config.dtype, block_size=config.block_size,
                             num_kv_blocks=config.num_kv_blocks, max_model_len=config.max_model_len,
                             max_num_batched_tokens=budget, native_kernels=config.native_kernels)
        if self.config.model_config.vocab_size != config.model_config.vocab_size:
            raise ValueError("draft_model must share the target's vocabulary "
                             f"({self.config.model_config.vocab_size} != {config.model_config.vocab_size})")
        self.runner = ModelRunner(self.config)
        self.block_manager = BlockManager(self.config.num_kv_blocks, self.config.block_size)
        self.shadows: dict[int, tuple[Sequence, Sequence]] = {}   # target seq_id -> (target, shadow)
        self._greedy = SamplingParams(temperature=0.0)

    def _shadow(self, seq: Sequence) -> Sequence:
        if seq.seq_id not in self.shadows:
            shadow = Sequence(seq.seq_id, seq.request_id, seq.prompt_token_ids, self._greedy, torch.Generator())
            self.shadows[seq.seq_id] = (seq, shadow)
        shadow = self.shadows[seq.seq_id][1]
        common = 0
        for a, b in zip(shadow.token_ids, seq.token_ids):
            if a != b:
                break
            common += 1
        shadow.token_ids = list(seq.token_ids)
        # the last token is always run again: its logits give the first draft
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, common, seq.num_tokens - 1)
        return shadow

    def _release_finished(self) -> None:
        for seq_id, (seq, shadow) in list(self.shadows.items()):
            if seq.is_finished:
                self.block_manager.free(shadow)
                del self.shadows[seq_id]

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        self._release_finished()
        shadows = [self._shadow(s) for s in seqs]
        drafts: list[list[int]] = [[] for _ in seqs]
        for _ in range(max(ks, default=0)):
            batch = SchedulerOutput()
            for i, sh in enumerate(shadows):
                n = sh.num_uncomputed_tokens
                if len(drafts[i]) < ks[i] and self.block_manager.allocate_slots(sh, n):
                    batch.add(sh, n)
            if batch.is_empty:
                break
            result = self.runner.run(batch, step=-1)
            for sh, n in zip(batch.seqs, batch.num_new_tokens):
                sh.num_computed_tokens += n
            for sh, token in zip(result.seqs, result.token_ids):
                sh.token_ids.append(token)
                drafts[shadows.index(sh)].append(token)
        return drafts


def make_proposer(config: Config):
    return DraftProposer(config) if config.speculative == "draft" else NgramProposer(config)
