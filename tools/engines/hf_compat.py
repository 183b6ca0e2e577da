"""What differs between transformers releases (4.36 … 5.24), kept out of the adapter (hf.py).

Two sides:
  - before the worker starts (runner): `dependency_paths(tree)` -> folders holding the
    dependencies of the release in `tree` where the installed ones do not fit it (old releases
    refuse to import with huggingface_hub 1.x / tokenizers 0.2x, 4.42–4.47 want numpy<2). Each
    set is installed once with `pip install --target` into the diffdx cache; the installed
    packages are never touched.
  - inside the worker (hf.py): the `from_pretrained` dtype keyword, generate() outputs that old
    releases lack, a clear error for an architecture the release does not have.

A release that cannot run the scenario raises; the runner turns that into an EngineRunError,
which the bisection takes as a skip.
"""

from __future__ import annotations

import ast
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

# Packages transformers checks at import (dependency_versions_check.py), named as in its table.
RUNTIME_CHECKED = (
    "tokenizers",
    "huggingface-hub",
    "numpy",
    "safetensors",
    "tqdm",
    "regex",
    "requests",
    "packaging",
    "filelock",
    "pyyaml",
    "accelerate",
)
# Releases that import a package their table does not require (4.51.0 fails to load without it).
EXTRA_NEEDS = {"4.51.0": ("accelerate",)}
VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)


class ReleaseDependencyError(RuntimeError):
    """The dependencies a release needs could not be installed."""


def tree_version(tree: Path) -> str | None:
    """The transformers version of the package folder in `tree`, or None if it holds none."""
    init = Path(tree) / "transformers" / "__init__.py"
    if not init.is_file():
        return None
    m = VERSION_LINE.search(init.read_text(errors="replace"))
    return m.group(1) if m else None


def dependency_table(tree: Path) -> dict[str, str]:
    """transformers/dependency_versions_table.py -> {"tokenizers": "tokenizers>=0.14,<0.19", …}."""
    path = Path(tree) / "transformers" / "dependency_versions_table.py"
    if not path.is_file():
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "deps":
            return ast.literal_eval(node.value)
    return {}


def missing_requirements(tree: Path) -> list[str]:
    """Requirements of the release in `tree` that the installed packages do not meet, sorted."""
    from packaging.requirements import Requirement

    version = tree_version(tree)
    if version is None:
        return []
    table = dependency_table(tree)
    wanted = [n for n in RUNTIME_CHECKED if n in table] + [n for n in EXTRA_NEEDS.get(version, ()) if n in table]
    out = set()
    for name in wanted:
        req = Requirement(table[name])
        installed = _installed_version(req.name)
        needed = name in EXTRA_NEEDS.get(version, ())
        if (installed is None and needed) or (installed is not None and installed not in req.specifier):
            out.add(str(req))
    return sorted(out)


def _installed_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def worker_paths(tree: str | Path | None) -> list[str]:
    """The runner's hook (tools.engines.worker_paths): the era dependencies an old transformers
    release in `tree` needs on the worker's path, installed once into diffdx's cache. Here, not in
    the adapter, which imports torch: a tree's zygote is launched with it before the orchestrator has."""
    from tools.engines.runner import EngineRunError

    try:
        return dependency_paths(tree)
    except ReleaseDependencyError as e:
        raise EngineRunError(str(e), "crash") from None


def dependency_paths(tree: str | Path | None) -> list[str]:
    """[folder] holding the era dependencies of the transformers release in `tree`, or [] if none needed."""
    if not tree:
        return []
    reqs = missing_requirements(Path(tree))
    if not reqs:
        return []
    from tools.probe.checkpoints import cache_root

    key = hashlib.sha256(repr((sys.version_info[:2], reqs)).encode()).hexdigest()[:16]
    out = cache_root() / "hf-deps" / key
    if not (out / ".complete").exists():
        _install(reqs, out)
    return [str(out)]


def _install(reqs: list[str], out: Path) -> None:
    """pip install --target a temp folder, then rename into place: no half-installed cache entry."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".install-", dir=out.parent))
    try:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--only-binary=:all:",
            "--no-input",
            "--disable-pip-version-check",
            "--target",
            str(tmp),
            *reqs,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
            raise ReleaseDependencyError(
                f"cannot install {' '.join(reqs)} for this transformers release: "
                f"{last[-1][:200] if last else 'pip failed'}"
            )
        (tmp / ".complete").write_text("\n".join(reqs) + "\n")
        try:
            tmp.rename(out)
        except OSError:  # another run installed the same set first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- inside the worker -------------------------------------------------------------------------


def major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def release_compat_keys(config: dict) -> dict:
    """Keys 4.x releases read where 5.x writes others, with the same meaning:
    `torch_dtype` next to `dtype`, `rope_theta` and `rope_scaling` next to `rope_parameters`
    (without them 4.x silently falls back to rope_theta 10000 and no scaling)."""
    extra = {}
    if "dtype" in config and "torch_dtype" not in config:
        extra["torch_dtype"] = config["dtype"]
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in config:
        extra["rope_theta"] = rope["rope_theta"]
    if isinstance(rope, dict) and rope.get("rope_type", "default") != "default" and not config.get("rope_scaling"):
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        extra["rope_scaling"] = {**scaling, "type": rope["rope_type"]}  # 4.36–4.41 read "type"
    return extra


def config_overrides(checkpoint: str) -> dict:
    """from_pretrained keyword overrides that let a 4.x release read a 5.x checkpoint as 5.x means
    it. Given at load time, never written into the checkpoint: a checkpoint stays what 5.x writes
    (an engine that reads a legacy top-level key from it must still see that key missing)."""
    import json

    if major() >= 5:
        return {}
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    extra = release_compat_keys(config)
    known = known_config_keys(config.get("model_type")) or set(extra)
    # dtype goes through dtype_kwarg; a key the release's config class lacks (Qwen2 before 4.45 has no
    # rope_scaling) would reach the model's __init__ and fail there, where a config.json holding it loads
    # and is ignored by the model: leave it out, as that release does
    return {k: v for k, v in extra.items() if k != "torch_dtype" and k in known}


def known_config_keys(model_type: str | None) -> set[str]:
    """Attributes of this release's default config for `model_type` (empty if it has none)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return set(vars(CONFIG_MAPPING[model_type]()))
    except (KeyError, TypeError, ValueError):
        return set()


def dtype_kwarg(dtype) -> dict:
    """4.x takes `torch_dtype=` (`dtype=` fails there); 5.x takes `dtype=`."""
    return {"dtype": dtype} if major() >= 5 else {"torch_dtype": dtype}


def load_tokenizer(checkpoint: str):
    """The checkpoint's tokenizer as this release reads it, or None when it has none. A 5.x checkpoint names
    its class `TokenizersBackend`, which 4.x releases do not have: they read its tokenizer.json as the fast
    tokenizer it is, with the special tokens tokenizer_config.json names."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        return AutoTokenizer.from_pretrained(checkpoint)
    except (OSError, ValueError):
        pass
    folder = Path(checkpoint)
    if major() >= 5 or not (folder / "tokenizer.json").is_file():
        return None
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    try:
        return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **special)
    except Exception:  # noqa: BLE001 - an era's `tokenizers` that cannot parse today's file (before 0.20): none
        return None


def release_archs() -> tuple[str, ...]:
    """The model types (HF `model_type`) this release has a class for."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return tuple(sorted(CONFIG_MAPPING_NAMES))


def check_arch(checkpoint: str) -> None:
    """Fail with one clear line when the release has no class for the checkpoint's model_type."""
    import json

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = json.loads((Path(checkpoint) / "config.json").read_text()).get("model_type")
    if model_type and model_type not in CONFIG_MAPPING_NAMES:
        raise RuntimeError(f"transformers {transformers.__version__} has no {model_type!r} architecture")


def generate_options(kwargs: dict, model) -> dict:
    """generate() kwargs -> what this release understands: no `output_logits` before 4.38; the
    model config's own cache (4.x gemma2: "hybrid") when the scenario names none, since a
    generation_config passed in replaces the one built from the model config."""
    from transformers import GenerationConfig

    if "output_logits" in kwargs and not hasattr(GenerationConfig(), "output_logits"):
        kwargs = {k: v for k, v in kwargs.items() if k != "output_logits"}
    cfg, default_cache = kwargs.get("generation_config"), getattr(model.config, "cache_implementation", None)
    if (
        cfg is not None
        and default_cache
        and not getattr(cfg, "cache_implementation", None)
        and "cache_implementation" not in kwargs
    ):
        cfg.cache_implementation = default_cache
    return kwargs


def with_logits(out):
    """generate() output -> one with `.logits`; before 4.38 the raw logits are not returned, and
    `scores` (the processed logits) equal them for greedy runs without processors."""
    if getattr(out, "logits", None) is not None:
        return out
    return SimpleNamespace(sequences=out.sequences, scores=out.scores, logits=out.scores)


# Architectures whose `sliding_window`, when set and without `layer_types`, windows every layer (as
# 5.x reads them); any other arch without `layer_types` has full attention in every layer.
WINDOW_EVERY_LAYER = ("mistral", "mixtral")


def layer_windows(config: dict, options: dict) -> list[int | None]:
    """One attention window per layer (None: full attention), from a 5.x config.json and the
    load-time overrides of the scenario."""
    config = {**config, **{k: v for k, v in options.items() if k in ("sliding_window", "use_sliding_window")}}
    n, window, kinds = config.get("num_hidden_layers"), config.get("sliding_window"), config.get("layer_types")
    if not isinstance(n, int):
        return []
    if config.get("use_sliding_window") is False or not isinstance(window, int) or isinstance(window, bool):
        return [None] * n
    if isinstance(kinds, list) and len(kinds) == n:
        return [window if "sliding" in str(k) else None for k in kinds]
    return [window] * n if config.get("model_type") in WINDOW_EVERY_LAYER else [None] * n


def attention_context(checkpoint: str, options: dict) -> dict:
    """Contract context (Engine.contract_context): the layers' windows, and whether the release
    builds a mask per kind of layer (its `masking_utils`, 4.53 on) rather than one for all layers."""
    import importlib.util
    import json

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    per_kind = importlib.util.find_spec("transformers.masking_utils") is not None
    return {"attention_windows": layer_windows(config, options), "masks_per_layer_kind": per_kind}
