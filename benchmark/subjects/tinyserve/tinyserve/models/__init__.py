"""Model classes by config.json `model_type`."""
from __future__ import annotations

from tinyserve.models.gemma2 import Gemma2ForCausalLM
from tinyserve.models.llama import LlamaForCausalLM

MODEL_REGISTRY = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "gemma2": Gemma2ForCausalLM,
}


def get_model_class(model_type: str):
    if model_type not in MODEL_REGISTRY:
        raise KeyError(f"no model for model_type {model_type!r}; supported: {', '.join(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[model_type]
