"""tinyserve: a compact CPU serving engine in the shape of vLLM.

    from tinyserve import LLM, SamplingParams
    LLM("ckpt_dir", block_size=16).generate(["Hello"], SamplingParams(temperature=0))
"""
from tinyserve.config import Config
from tinyserve.engine.llm_engine import LLMEngine, RequestOutput
from tinyserve.llm import LLM
from tinyserve.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "LLMEngine", "Config", "SamplingParams", "RequestOutput"]
