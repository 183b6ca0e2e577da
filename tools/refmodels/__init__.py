"""Independent reference models: llama, qwen2, mistral, gemma2 in plain PyTorch.

Written from the architectures' definitions (papers, reference code, config semantics),
not from transformers, and importing nothing from it, so that a bug in transformers is
visible against them. They load the same HF-format checkpoints (config.json +
safetensors) and report canonical taps (tools.probe.taps). Run through the `refmodel` engine
adapter (tools/engines/refmodel.py).

    config.py  what each arch reads from config.json and how the archs differ (ARCHS)
    rope.py    rotary embedding: default, linear, dynamic NTK, llama3, YaRN
    model.py   the decoder as small pure functions over a weight dict; `forward`
"""

from tools.refmodels.config import ARCHS, RefConfig, load_config
from tools.refmodels.model import RefModel, forward, load

__all__ = ["ARCHS", "RefConfig", "RefModel", "forward", "load", "load_config"]
