"""Offline entry point: LLM(model_dir, **engine_options).generate(prompts, params)."""
from __future__ import annotations

from tinyserve.config import Config
from tinyserve.engine.llm_engine import LLMEngine, RequestOutput
from tinyserve.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **engine_options):
        self.engine = LLMEngine(Config(model=str(model), **engine_options))

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """prompts: a text, a token-id list, or a list of either. -> outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            self.engine.add_request(str(i), prompt, p)
        outputs = {}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                outputs[out.request_id] = out
        return [outputs[str(i)] for i in range(len(prompts))]
