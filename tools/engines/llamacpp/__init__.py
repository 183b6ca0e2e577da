"""The llama.cpp engine (issue 17). The adapter class lives here (owner: the engine adapter)."""

from __future__ import annotations

from pathlib import Path


def worker_env(tree: str | Path | None) -> dict[str, str]:
    """The runner's hook (tools.engines.worker_vars): the worker loads the tree under test's own
    build (tools/engines/llamacpp/build.py; imported here lazily, so `python -m` of it stays clean)."""
    from tools.engines.llamacpp.build import worker_env as build_worker_env

    return build_worker_env(tree)
