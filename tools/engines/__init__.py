"""Engine adapters by name, imported lazily (docs/design.md, "Engines"; docs/engines.md).

An engine name in a scenario (`[target] engine = …`) or on the command line is one of:

- a built-in name (BUILTIN below);
- a name an installed package registers under the `diffdx.engines` entry-point group, e.g. in
  its pyproject.toml: `[project.entry-points."diffdx.engines"] myengine = "my_pkg.adapter:MyEngine"`;
- `module:Class` itself: an adapter class importable from the worker's PYTHONPATH (the
  `--target-source` tree, diffdx's root, then the caller's $PYTHONPATH).

Names resolve where the engine runs (the worker process), so an adapter that lives only in the
tree under test is found there. `engine_capabilities` asks a worker what an engine can do.
"""

from __future__ import annotations

import importlib
import json
import re
from importlib.metadata import entry_points
from pathlib import Path

from tools.errors import BadInput

ENTRY_POINT_GROUP = "diffdx.engines"
BUILTIN = {
    "transformers": "tools.engines.hf:HFEngine",
    "tinyserve": "tools.engines.tinyserve:TinyServeEngine",
    "refmodel": "tools.engines.refmodel:RefModelEngine",
}
ENGINES = BUILTIN  # the built-ins, under the name older callers import
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
CAPABILITIES_TIMEOUT_S = 300.0


class UnknownEngineError(BadInput, KeyError):
    """An engine name that does not resolve; the message lists the names that do. Bad input
    (exit 2); a KeyError too, as registry lookups raise."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def registry() -> dict[str, str]:
    """Engine name -> 'module:Class': installed entry points, then the built-ins (which win)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**found, **BUILTIN}


def engine_path(name: str) -> str:
    """A registered name or a `module:Class` -> 'module:Class'. Imports nothing."""
    known = registry()
    if name in known:
        return known[name]
    if _IMPORT_PATH.match(name or ""):
        return name
    raise UnknownEngineError(
        f"unknown engine {name!r}; known engines: {', '.join(sorted(known))}, "
        "or module:Class (an adapter importable from the worker's PYTHONPATH)"
    )


def get_engine(name: str):
    """Engine name -> an adapter instance. Imports only the adapter asked for."""
    path = engine_path(name)
    module_name, cls_name = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):  # the adapter's module itself, not one it imports
            raise UnknownEngineError(
                f"engine {name!r}: no module {module_name!r} on the worker's PYTHONPATH "
                "(put its folder on $PYTHONPATH, or install the package)"
            ) from None
        raise
    adapter = getattr(module, cls_name, None)
    if adapter is None:
        raise UnknownEngineError(f"engine {name!r}: module {module_name!r} has no {cls_name!r}")
    return adapter()


_capabilities_cache: dict[str, object] = {}


def engine_capabilities(spec, source_root: str | Path | None = None, timeout: float = CAPABILITIES_TIMEOUT_S):
    """EngineSpec -> Capabilities, asked of a worker process that imports the tree under test
    (`source_root` first on its path), as engine runs do. Cached per spec and tree."""
    import subprocess
    import sys
    from dataclasses import asdict

    from tools.engines.protocol import Capabilities
    from tools.engines.runner import EngineRunError, worker_env

    key = json.dumps([asdict(spec), str(source_root)], sort_keys=True, default=str)
    if key not in _capabilities_cache:
        cmd = [sys.executable, "-m", "tools.engines.worker", "--capabilities", json.dumps(asdict(spec))]
        try:
            proc = subprocess.run(cmd, env=worker_env(source_root), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise EngineRunError(f"{spec.engine} capabilities timed out after {timeout:.0f}s", "timeout") from None
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines() or ["no output"]
            raise EngineRunError(
                f"{spec.engine} capabilities failed: {tail[-1][:300]}", "crash", (proc.stdout + proc.stderr)[-4000:]
            )
        fields = json.loads(proc.stdout.strip().splitlines()[-1])
        _capabilities_cache[key] = Capabilities(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        )
    return _capabilities_cache[key]
