"""Engine adapters, imported lazily by name (STYLE.md §7)."""
from __future__ import annotations

import importlib

ENGINES = {
    "transformers": "tools.engines.hf:HFEngine",
    "tinyserve": "tools.engines.tinyserve:TinyServeEngine",
    "refmodel": "tools.engines.refmodel:RefModelEngine",
}


def get_engine(name: str):
    """Engine name -> an adapter instance. Imports only the adapter asked for."""
    if name not in ENGINES:
        raise KeyError(f"unknown engine {name!r}; known engines: {', '.join(sorted(ENGINES))}")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)()
