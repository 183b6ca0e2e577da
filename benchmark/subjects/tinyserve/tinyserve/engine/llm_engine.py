"""The engine loop: requests in, one scheduled forward per `step()`, outputs out."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from tinyserve.config import Config
from tinyserve.detokenizer import Detokenizer
from tinyserve.engine.block_manager import BlockManager
from tinyserve.engine.model_runner import ModelRunner, StepResult
from tinyserve.engine.scheduler import Scheduler
from tinyserve.engine.sequence import Sequence
from tinyserve.sampling_params import SamplingParams
from tinyserve.tokenizer import Tokenizer


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float]                  # of each emitted token
    top_logprobs: list[dict] | None
    finish_reason: str | None
    finished: bool
    delta: str = ""                        # stream_step(): text added since this request's last output


class LLMEngine:
    def __new__(cls, config: Config):
        # speculative decoding runs a different step loop; choosing it here keeps `LLMEngine(config)`
        # the one way to build an engine
        if cls is LLMEngine and config.speculative:
            from tinyserve.spec_decode.engine import SpecDecodeEngine
            return super().__new__(SpecDecodeEngine)
        return super().__new__(cls)

    def __init__(self, config: Config):
        self.config = config
        self.tokenizer = Tokenizer.maybe_load(config.model)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.model_runner = ModelRunner(config)
        self.block_manager = BlockManager(config.num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.step_count = 0
        self._seq_ids = itertools.count()
        self._default_generator = torch.Generator().manual_seed(config.seed)
        self.eos_token_ids = set(config.model_config.eos_token_ids)

    @classmethod
    def from_options(cls, model: str, **options) -> "LLMEngine":
        return cls(Config(model=model, **options))

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    forced_token_ids: list[int] | None = None) -> Sequence:
        """Queue a request. `forced_token_ids`: teacher forcing, emit these instead of sampling."""
        params = params or SamplingParams()
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise ValueError(f"request {request_id}: empty prompt")
        self._check_fits(request_id, len(prompt_ids) + params.max_tokens)
        generator = (torch.Generator().manual_seed(params.seed) if params.seed is not None
                     else self._default_generator)
        seq = Sequence(next(self._seq_ids), request_id, prompt_ids, params, generator, forced_token_ids)
        self.scheduler.add(seq)
        return seq

    def _check_fits(self, request_id: str, max_len: int) -> None:
        if max_len > self.config.max_model_len:
            raise ValueError(f"request {request_id}: {max_len} tokens exceed max_model_len {self.config.max_model_len}")
        if -(-max_len // self.config.block_size) > self.config.num_kv_blocks:
            raise ValueError(f"request {request_id}: {max_len} tokens need more than the "
                             f"{self.config.num_kv_blocks} KV blocks")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """schedule -> run -> postprocess; -> outputs of requests that finished this step."""
        batch = self.scheduler.schedule()
        result = self.model_runner.run(batch, self.step_count) if not batch.is_empty else StepResult([], [], [], [])
        self.scheduler.update_computed(batch)
        self.step_count += 1
        return self.process_outputs(result)

    def process_outputs(self, result: StepResult) -> list[RequestOutput]:
        finished = []
        for seq, token, logprob, top in zip(result.seqs, result.token_ids, result.logprobs, result.top_logprobs):
            if top is not None:
                top = {**top, token: logprob}
            seq.append_token(token, logprob, top)
            self.detokenizer.update(seq)
            reason = self.check_stop(seq)
            if reason:
                self.scheduler.finish(seq, reason)
                finished.append(self.make_output(seq))
        return finished

    def check_stop(self, seq: Sequence) -> str | None:
        """-> finish reason ('stop' / 'length') or None to keep going."""
        p, token = seq.params, seq.token_ids[-1]
        if seq.forced_token_ids is not None:
            return "length" if len(seq.output_token_ids) >= len(seq.forced_token_ids) else None
        if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
            seq.stop_reason = token
            return "stop"
        if p.stop and self.tokenizer is not None:
            for stop in p.stop:
                cut = seq.text.find(stop)
                if cut >= 0:
                    seq.text, seq.stop_reason = seq.text[:cut], stop
                    return "stop"
        if len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def make_output(self, seq: Sequence) -> RequestOutput:
        self.detokenizer.finish(seq, flush=not isinstance(seq.stop_reason, str))   # a stop string cut the text
        return RequestOutput(seq.request_id, seq.prompt_token_ids, seq.output_token_ids, seq.text,
                             list(seq.output_logprobs), seq.top_logprobs if seq.params.logprobs is not None else None,
                             seq.finish_reason, seq.is_finished)

    def stream_step(self) -> list[RequestOutput]:
        """step(), reporting every request whose text grew this step (finished or not) with the new
        text in `delta`; the pieces of one request add up to its final text."""
        self.detokenizer.streaming = True
        self.step()
        holdback = lambda seq: max((len(s) for s in seq.params.stop), default=1) - 1
        outputs = []
        for seq in self.detokenizer.take_touched():
            delta = self.detokenizer.take_delta(seq, holdback(seq))
            if delta or seq.is_finished:
                out = self.make_output(seq) if seq.is_finished else self._partial_output(seq)
                out.delta = delta
                outputs.append(out)
        return outputs

    def _partial_output(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(seq.request_id, seq.prompt_token_ids, seq.output_token_ids, seq.text,
                             list(seq.output_logprobs), None, None, False)
