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
import os
import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from tools.errors import BadInput

if TYPE_CHECKING:  # imported lazily at run time: this registry imports no adapter and no torch
    from tools.engines.protocol import Capabilities, Engine
    from tools.scenario import EngineSpec

ENTRY_POINT_GROUP = "diffdx.engines"
BUILTIN = {
    "transformers": "tools.engines.hf:HFEngine",
    "tinyserve": "tools.engines.tinyserve:TinyServeEngine",
    "refmodel": "tools.engines.refmodel:RefModelEngine",
    "llama.cpp": "tools.engines.llamacpp:LlamaCppEngine",
}
# Built-in adapters whose runner hooks (worker_paths, worker_env) live in a module lighter than the
# adapter's, which imports torch: asking them must not wait for that import, since a tree's zygote is
# launched with their answer when a diagnosis starts (tools.engines.runner.prestart).
HOOKS = {"transformers": "tools.engines.hf_compat"}
DEFAULT_ENGINE = "transformers"  # the reference, and the target of an issue that names no engine
# How reporters write a built-in engine besides its name (tools/triage/extract.py), as a regex.
MENTIONS = {"transformers": r"\bmodel\.generate\(", "llama.cpp": r"llama-(server|cli|bench)|\.gguf\b"}
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
CAPABILITIES_TIMEOUT_S = 300.0
# Installed third-party modules an engine worker's zygote imports ahead of its runs (package ->
# modules, tools/engines/forkserver.py): importing the installed reference takes seconds in every
# run otherwise, most of a sweep cell's time. Never for a run whose path holds its own copy.
ZYGOTE_PRELOAD = {
    "transformers": (
        "transformers.modeling_utils",
        "transformers.models.auto.modeling_auto",
        "transformers.models.llama.modeling_llama",
    )
}

# A tree under test that holds its own copy of one of these packages gets a zygote of its own that
# has imported it (tools/engines/treepreload.py): package -> (the engine that runs it, modules that
# every run of that engine imports; never one only some runs import, e.g. one architecture's).
TREE_PRELOAD = {
    "transformers": (
        "transformers",
        (
            "transformers.modeling_utils",
            "transformers.models.auto.modeling_auto",
            "transformers.models.auto.tokenization_auto",
            "transformers.generation.utils",
        ),
    )
}


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


def get_engine(name: str) -> Engine:
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


_capabilities_cache: dict[tuple[str, str], Capabilities] = {}


def engine_capabilities(
    engine: str | EngineSpec, source_root: str | Path | None = None, timeout: float = CAPABILITIES_TIMEOUT_S
) -> Capabilities:
    """Engine name (or an EngineSpec) -> Capabilities, asked of a worker process that imports the
    tree under test (`source_root` first on its path), as engine runs do. One worker call per
    (engine, tree) in this process; the answer is cached."""
    import tempfile

    from tools.engines.protocol import Capabilities
    from tools.engines.runner import EngineRunError, execute, worker_env

    name = engine if isinstance(engine, str) else engine.engine
    key = (name, str(Path(source_root).resolve()) if source_root else "")
    if key not in _capabilities_cache:
        with tempfile.TemporaryDirectory(prefix="diffdx-caps-") as tmp:
            out = Path(tmp) / "capabilities.json"
            env = worker_env(source_root, engine=name)
            code, log = execute(["--capabilities", name, str(out)], env, Path(tmp), timeout, name)
            if code is None:
                raise EngineRunError(f"{name} capabilities timed out after {timeout:.0f}s", "timeout", log[-4000:])
            tail = log.strip().splitlines() or ["no output"]
            if code == 2 and tail[-1].startswith("error: "):  # the worker's one line for a name it cannot resolve
                raise UnknownEngineError(tail[-1].removeprefix("error: "))
            if code != 0 or not out.exists():
                raise EngineRunError(f"{name} capabilities failed: {tail[-1][:300]}", "crash", log[-4000:])
            _capabilities_cache[key] = Capabilities.from_json(json.loads(out.read_text()))
    return _capabilities_cache[key]


def encode_prompts(
    engine: str,
    source_root: str | Path | None,
    checkpoint: str | Path,
    texts: list[str],
    timeout: float = CAPABILITIES_TIMEOUT_S,
) -> list[int] | None:
    """Text prompts -> how many tokens the engine feeds the model for each (its adapter's optional
    `encode_prompts(checkpoint, texts)`: the tokenizer, special tokens and template its runs use), asked
    of a worker that imports the tree under test. None: the adapter does not say."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="diffdx-encode-") as tmp:
        given = Path(tmp) / "texts.json"
        given.write_text(json.dumps(texts))
        counts = _ask_worker("--encode", engine, source_root, [str(checkpoint), str(given)], timeout)
    return None if counts is None else [int(n) for n in counts]


def config_keys_read(
    engine: str, source_root: str | Path | None, checkpoint: str | Path, timeout: float = CAPABILITIES_TIMEOUT_S
) -> set[str] | None:
    """The checkpoint's config.json keys the engine reads (its adapter's optional `config_keys_read`),
    asked of a worker that imports the tree under test. None: the adapter does not say."""
    keys = _ask_worker("--config-keys", engine, source_root, [str(checkpoint)], timeout)
    return None if keys is None else set(keys)


def _ask_worker(mode: str, engine: str, source_root, args: list[str], timeout: float):
    """One worker call in `mode` (tools.engines.worker), its JSON answer written to a file."""
    import tempfile

    from tools.engines.runner import EngineRunError, execute, worker_env

    with tempfile.TemporaryDirectory(prefix="diffdx-ask-") as tmp:
        out = Path(tmp) / "answer.json"
        env = worker_env(source_root, engine=engine)
        code, log = execute([mode, engine, *args, str(out)], env, Path(tmp), timeout, engine)
        if code is None:
            raise EngineRunError(f"{engine} {mode} timed out after {timeout:.0f}s", "timeout", log[-4000:])
        if code != 0 or not out.exists():
            tail = log.strip().splitlines() or ["no output"]
            raise EngineRunError(f"{engine} {mode} failed: {tail[-1][:300]}", "crash", log[-4000:])
        return json.loads(out.read_text())


def zygote_preload(env: dict) -> tuple[str, ...]:
    """Modules a zygote forking runs with `env` may import ahead (ZYGOTE_PRELOAD): those of every
    package that no folder on the run's PYTHONPATH holds a copy of (a tree under test, a release)."""
    entries = [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    out: list[str] = []
    for package, modules in ZYGOTE_PRELOAD.items():
        if not any((p / package).is_dir() or (p / f"{package}.py").is_file() for p in entries):
            out += modules
    return tuple(out)


def tree_preload(env: dict) -> tuple[str, str, tuple[str, ...], tuple[str, ...]] | None:
    """(tree, engine, packages, modules) for a tree zygote of runs with `env` (TREE_PRELOAD): the
    first folder on the run's PYTHONPATH that holds one of those packages, which its runs import from."""
    for entry in (Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p):
        for package, (engine, modules) in TREE_PRELOAD.items():
            if (entry / package / "__init__.py").is_file():
                return str(entry), engine, (package,), modules
    return None


def worker_paths(engine: str, tree: str | Path | None) -> list[str]:
    """Folders the engine's worker needs on its path besides `tree` (an old release's own
    dependencies): the adapter module's optional `worker_paths(tree)`, asked before the worker starts.
    An adapter importable only in the worker (`module:Class` on its path) has none."""
    if not tree:
        return []
    try:
        module = importlib.import_module(hooks_module(engine))
    except (ImportError, UnknownEngineError):
        return []
    hook = getattr(module, "worker_paths", None)
    return list(hook(tree)) if hook is not None else []


def worker_vars(engine: str, tree: str | Path | None) -> dict[str, str]:
    """Environment variables the engine's worker needs for `tree` (where a native build of the tree
    lies): the adapter module's optional `worker_env(tree)`, asked before the worker starts. The hook
    may take minutes (a build) and raises EngineRunError for a tree that cannot run."""
    if not tree:
        return {}
    try:
        module = importlib.import_module(hooks_module(engine))
    except (ImportError, UnknownEngineError):
        return {}
    hook = getattr(module, "worker_env", None)
    return dict(hook(tree)) if hook is not None else {}


def hooks_module(engine: str) -> str:
    """The module holding `engine`'s runner hooks: HOOKS's, else its adapter's. Imports nothing."""
    return HOOKS.get(engine) or engine_path(engine).split(":")[0]
