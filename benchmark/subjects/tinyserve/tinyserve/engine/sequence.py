"""A request's state as the scheduler and block manager see it."""
from __future__ import annotations

from enum import Enum, auto

import torch

from tinyserve.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    def __init__(self, seq_id: int, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 generator: torch.Generator, forced_token_ids: list[int] | None = None):
        self.seq_id = seq_id
        self.request_id = request_id
        self.params = params
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0          # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.status = SequenceStatus.WAITING
        self.generator = generator
        self.forced_token_ids = list(forced_token_ids) if forced_token_ids is not None else None
        self.output_logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float]] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None    # the stop token id or stop string that ended it
        self.num_preemptions = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def forced_next_token(self) -> int | None:
        """Teacher forcing: the token this sequence must emit next, if one is given."""
        if self.forced_token_ids is None:
            return None
        n = len(self.output_token_ids)
        return self.forced_token_ids[n] if n < len(self.forced_token_ids) else None

    def block_token_ids(self, block_index: int, block_size: int) -> list[int]:
        return self.token_ids[block_index * block_size:(block_index + 1) * block_size]

    def append_token(self, token_id: int, logprob: float, top: dict[int, float] | None = None) -> None:
        self.token_ids.append(token_id)
        self.output_logprobs.append(logprob)
        if top is not None:
            self.top_logprobs.append(top)

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: drop the cache state, keep the tokens."""
        self.block_table = []
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1
