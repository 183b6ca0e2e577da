"""Checks that run before any engine starts: nothing a user gives is silently ignored.

A source tree that does not hold the engine's package would quietly probe the installed
engine instead; a tap pattern that matches nothing would print an empty table and "agree";
max_tokens past the model's positions would run until the engine's timeout. Each of these is
a `BadInput` here, with one line saying what to change. Reads only small files (config.json);
never loads weights. What an engine takes (its package, its options) is what the tree under test
declares, asked of a worker (tools.engines.engine_capabilities, cached for the run), so an adapter
that only the tree holds is checked too.

Checks run cheapest first, so that the refusals a typo earns (an unknown key, a bad value, an
unknown engine, a checkpoint path with no config.json, a prompt past the positions) come in
seconds: what needs neither transformers nor a worker, then what needs transformers (a config's
values), then what only a worker can say (the engine's options and sampling keys, and how many
tokens its tokenizer makes of a text prompt).
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tools.errors import BadInput
from tools.probe import taps as tapnames
from tools.scenario import EngineSpec, Scenario, ScenarioError, unhonoured_sampling

if TYPE_CHECKING:  # the engine modules import torch: loaded only when a check needs them
    from tools.engines.protocol import Capabilities


def model_config(model: dict) -> dict:
    """[model] table -> the config keys the checkpoint has (or will have), without building it."""
    if "path" in model:
        config = Path(model["path"]).expanduser() / "config.json"
        try:
            keys = json.loads(config.read_text())
        except FileNotFoundError:
            raise BadInput(f"model.path {model['path']} has no config.json (an HF-format checkpoint folder)") from None
        except (OSError, ValueError) as e:
            raise BadInput(f"model.path {model['path']}: config.json is unreadable ({e})") from None
        check_path_keys(model)
        return keys
    from tools.probe.checkpoints import model_config_keys

    try:
        keys = model_config_keys(model)
    except ValueError as e:
        raise BadInput(f"[model] {e}") from None
    check_key_spelling(model)
    return keys


def check_config_values(model: dict) -> None:
    """The factory's AutoConfig takes the keys (it validates some values: initializer_range = 1e30 is
    refused there); without this the refusal came as a traceback from the checkpoint's build. Imports
    transformers: run after the checks that need nothing heavy. Nothing to build beside a `path`."""
    if "path" in model:
        return
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    from tools.probe.checkpoints import hf_config_keys

    try:
        AutoConfig.for_model(model["arch"], **hf_config_keys(model))
    except (ValueError, TypeError, StrictDataclassError) as e:
        raise BadInput(
            f"[model] the {model['arch']} config refuses these keys: {' '.join(str(e).split())[:300]}"
        ) from None


LEGACY_KEYS = ("rope_scaling", "rope_theta")  # older spellings the config still takes (into rope_parameters)


def config_fields(arch: str) -> set[str]:
    """What the arch's HF config declares (declared_fields), read from a file cached per Python environment
    and checked against the config library's installed file (a new version is read afresh): importing
    transformers takes seconds, and a misspelt key should be refused before that. Written for every seeded
    arch at once, so that a key of another arch can be named."""
    import hashlib
    import sys

    from tools.probe.checkpoints import TINY_PRESETS, cache_root

    path = cache_root() / "config-fields" / f"{hashlib.sha256(sys.prefix.encode()).hexdigest()[:16]}.json"
    try:
        table = json.loads(path.read_text())
        library = Path(table["library"]).stat()
        fresh = [library.st_mtime_ns, library.st_size] == table["stat"] and isinstance(table["fields"].get(arch), list)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        fresh = False
    if not fresh:
        fields = {a: sorted(declared_fields(a)) for a in {*TINY_PRESETS, arch}}
        library_file = _config_library_file()
        stat = Path(library_file).stat()
        table = {"library": library_file, "stat": [stat.st_mtime_ns, stat.st_size], "fields": fields}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, indent=1))
            tmp.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
        except OSError:
            pass  # a read-only cache: read the library each time
    return set(table["fields"][arch])


def _config_library_file() -> str:
    """The installed file of the library whose config classes declared_fields reads (its version's mark)."""
    import sys

    from transformers import CONFIG_MAPPING

    return str(sys.modules[CONFIG_MAPPING.__module__.split(".")[0]].__file__)


def declared_fields(arch: str) -> set[str]:
    """What the arch's HF config declares: its defaults, its (and its bases') __init__ parameters, aliases."""
    import inspect

    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[arch]
    fields = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {})) | set(LEGACY_KEYS)
    for base in cls.__mro__:
        if "__init__" in vars(base):
            fields |= set(inspect.signature(base.__init__).parameters)
    return fields


def check_key_spelling(model: dict) -> None:
    """A [model] key one typo from a config field (num_hidden_layer) would become an unused attribute:
    the model silently keeps the field's default. Keys near no field pass through (an engine may read
    them; a field of another arch's config is checked by check_keys_read)."""
    from tools.probe.checkpoints import FILE_KEYS, WEIGHT_KEYS

    arch = model["arch"]
    fields = config_fields(arch)
    for key in sorted(set(model) - fields - {"arch", "seed", *FILE_KEYS, *WEIGHT_KEYS}):
        near = difflib.get_close_matches(key, sorted(fields), n=1, cutoff=0.85)
        if near:
            raise BadInput(f"[model] {key} is not a {arch} config field; did you mean {near[0]}?")


PATH_KEYS = ("path", "arch")  # beside an existing checkpoint: where it is, and (a label) what it is


def check_path_keys(model: dict) -> None:
    """An existing checkpoint is run as its files say: any other [model] key would be silently ignored.

    Factory keys (seed, perturb_init, mlp_input_outliers, omit_keys, config_json) only shape a seeded checkpoint; HF config
    keys (rope_parameters, sliding_window, num_hidden_layers, torch_dtype, ...) would reach neither engine,
    which both read the folder's config.json."""
    from tools.probe.checkpoints import FILE_KEYS, WEIGHT_KEYS

    ignored = sorted(k for k in model if k not in PATH_KEYS)
    if not ignored:
        return
    factory = [k for k in ignored if k in ("seed", *FILE_KEYS, *WEIGHT_KEYS)]
    config = [k for k in ignored if k not in factory]
    how = []
    if config:
        how.append(
            f"{', '.join(config)} would not reach either engine (both read {model['path']}/config.json): "
            "set them in a copy of that folder's config.json and point path at the copy"
        )
    if factory:
        how.append(f"{', '.join(factory)} only shape(s) a seeded checkpoint: drop them, or drop path and give arch")
    raise BadInput(f"[model] path names an existing checkpoint, used as it is; {'; '.join(how)}")


def check_limits(scenario: Scenario, config: dict, count_text=None, least: bool = False) -> None:
    """Every request fits the model: prompt + max_tokens within its positions, ids within its vocab.
    `count_text(text) -> tokens` sizes a text prompt (None: counted as one token, the least it can be;
    `least`: the count is a lower bound, the engine's own comes later)."""
    positions, vocab = config.get("max_position_embeddings"), config.get("vocab_size")
    for i, req in enumerate(scenario.requests):
        if req.prompt_ids is not None:
            prompt_len = len(req.prompt_ids)
        else:
            prompt_len = count_text(req.prompt) if count_text is not None else 1
        if isinstance(positions, int) and prompt_len + req.max_tokens > positions:
            tokens = f"at least {prompt_len} tokens" if least and req.prompt_ids is None else f"{prompt_len} tokens"
            what = (
                f"prompt ({tokens}) + max_tokens ({req.max_tokens:,})"
                if req.prompt_ids or count_text is not None
                else f"max_tokens ({req.max_tokens:,}) + the prompt"
            )
            raise BadInput(
                f"request {i}: {what} exceeds the model's {positions} positions "
                f"(max_position_embeddings); {'shorten the prompt' if prompt_len >= positions else 'lower max_tokens'}"
                f"{_dynamic_rope_note(config)}"
            )
        if isinstance(vocab, int) and req.prompt_ids and max(req.prompt_ids) >= vocab:
            raise BadInput(
                f"request {i}: prompt id {max(req.prompt_ids)} is outside the model's vocabulary (vocab_size {vocab})"
            )


def least_counter(model: dict, config: dict):
    """text -> the fewest tokens an engine can feed the model for it: the checkpoint's tokenizer.json
    without special tokens or template (which an engine may add, never take away), through the light
    `tokenizers` library; None when there is no tokenizer.json to read (a seeded checkpoint's is rebuilt)."""
    try:
        from tokenizers import Tokenizer

        if "path" in model:
            tokenizer = Tokenizer.from_file(str(Path(model["path"]).expanduser() / "tokenizer.json"))
        else:
            from tools.probe.checkpoints import build_bpe

            tokenizer = build_bpe(config["vocab_size"])
    except Exception:  # noqa: BLE001 - no usable tokenizer.json: the engine's count comes later
        return None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def text_counter(model: dict, config: dict):
    """text -> its token count under the checkpoint's tokenizer (the factory's for a seeded one), or None
    when there is none to read: a text prompt past the model's positions is then the engine's to refuse."""
    try:
        if "path" in model:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(Path(model["path"]).expanduser()))
        else:
            from tools.probe.checkpoints import build_tokenizer

            tokenizer = build_tokenizer(config["vocab_size"])
    except Exception:  # noqa: BLE001 - no usable tokenizer files: the engines will say so themselves
        return None
    return lambda text: len(tokenizer(text)["input_ids"])


def _dynamic_rope_note(config: dict) -> str:
    """Why running past the limit is refused even where the model is meant to: dynamic NTK RoPE."""
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) != "dynamic":
        return ""
    return (
        " (dynamic NTK RoPE past it is not comparable yet: the trusted reference re-runs each sequence in"
        " one forward, which rescales every position, while an engine with a KV cache, transformers'"
        " generate included, keeps the keys it cached before the limit as they were)"
    )


def check_engine(engine: str, where: str = "", source: Path | None = None) -> None:
    """A name that resolves nowhere is bad input listing the known ones; so is a `module:Class` whose
    top-level module is on none of the worker's paths (`source`, diffdx, $PYTHONPATH, site-packages).
    Imports no adapter (whether the class is there is the worker's to say)."""
    import sys
    from importlib.machinery import PathFinder

    from tools.engines import UnknownEngineError, engine_path, registry

    try:
        path = engine_path(engine)
        top = path.split(":")[0].split(".")[0]
        search = [str(source)] * bool(source) + [p or "." for p in sys.path]
        if engine not in registry() and top not in sys.builtin_module_names and not PathFinder.find_spec(top, search):
            raise UnknownEngineError(
                f"engine {engine!r}: no module {top!r} in --target-source, diffdx or $PYTHONPATH "
                "(put its folder on $PYTHONPATH, or install the package)"
            )
    except UnknownEngineError as e:
        if not where:
            raise
        raise BadInput(f"[{where}] {e}") from None


def check_source_folder(source: Path | None) -> None:
    """--target-source must be an existing folder (what it must hold is asked of the engine later)."""
    if source is None:
        return
    source = Path(source)
    if not source.exists():
        raise BadInput(f"--target-source {source} does not exist")
    if not source.is_dir():
        raise BadInput(f"--target-source {source} is a file; give the folder that holds the engine's package")


def capabilities(engine: str, source: Path | None) -> Capabilities | None:
    """What the engine declares in the tree under test; an unknown name is bad input listing the
    known ones. None when the tree does not import: the probe then reports that run's failure."""
    from tools.engines import engine_capabilities
    from tools.engines.runner import EngineRunError

    check_engine(engine, source=source)  # before any worker starts
    try:
        return engine_capabilities(engine, source)
    except EngineRunError:
        return None


def check_target_source(engine: str, source: Path | None) -> Path | None:
    """--target-source must be a folder holding the engine's importable package (the repo root)."""
    if source is None:
        return None
    check_source_folder(source)
    source = Path(source)
    caps = capabilities(engine, source)
    package = caps.package if caps is not None else ""
    if package and not (source / package).is_dir():
        hint = f"; did you mean its parent {source.parent}?" if source.name == package else ""
        raise BadInput(
            f"--target-source {source} holds no `{package}/` package, so {engine} would be imported "
            f"from the installed copy instead{hint}"
        )
    return source.resolve()


def canonical_taps(config: dict) -> list[str]:
    """Every canonical tap name a model with this config can report (DESIGN §2)."""
    layers = int(config.get("num_hidden_layers") or 0)
    return (
        ["embed"]
        + [tapnames.layer_tap(i, t) for i in range(layers) for t in tapnames.LAYER_TAPS]
        + list(tapnames.HEAD_TAPS)
    )


def check_taps(patterns: list[str] | None, config: dict) -> None:
    """Each tap pattern must match at least one tap of this model."""
    if patterns is None:
        return
    names = canonical_taps(config)
    for p in patterns:
        if not any(tapnames.matches(n, [p]) for n in names):
            raise BadInput(
                f"--taps pattern {p!r} matches no tap of this model (e.g. embed, layers.0.attn.q, "
                f"layers.*.mlp.*, logits; {config.get('num_hidden_layers')} layers)"
            )


def check_options(spec: EngineSpec, source: Path | None, where: str) -> None:
    """Engine options against what the engine accepts, when its adapter can say (its own
    `check_options` first: it knows why an option is refused, not only that it is)."""
    from tools.engines.protocol import check_spec

    try:
        check_spec(spec)
    except ValueError as e:
        raise BadInput(f"[{where}] {e}") from None
    caps = capabilities(spec.engine, source)
    known = caps.accepted_options if caps is not None else None
    if known is None:
        return
    unknown = sorted(set(spec.options) - set(known))
    if unknown:
        close = [m for u in unknown for m in difflib.get_close_matches(u, known, n=1)]
        hint = (
            f"did you mean {', '.join(close)}?"
            if close
            else f"it accepts: {', '.join(sorted(known))}"
            if len(known) <= 30
            else f"it accepts {len(known)} others"
        )
        raise BadInput(f"[{where}] options {unknown} are not accepted by {spec.engine}; {hint}")


def preflight(
    scenario: Scenario,
    target_source: Path | None = None,
    taps: list[str] | None = None,
    reference_source: Path | None = None,
) -> Path | None:
    """All checks for one probe or diagnosis, cheapest first; returns the resolved target source."""
    if not isinstance(scenario, Scenario):
        raise ScenarioError("no scenario")
    # no heavy import: the refusals a typo earns come in seconds
    for spec, where, tree in (
        (scenario.target, "target", target_source),
        (scenario.reference, "reference", reference_source),
    ):
        check_engine(spec.engine, where, tree)
    check_source_folder(target_source)
    check_reference_precision(scenario)
    config = model_config(scenario.model)  # config field names: a file cached per transformers version
    texts = any(req.prompt_ids is None for req in scenario.requests)
    check_limits(scenario, config, least_counter(scenario.model, config) if texts else None, least=True)
    check_taps(taps, config)
    # transformers (the config's values), then what only a worker can say
    check_config_values(scenario.model)
    source = check_target_source(scenario.target.engine, target_source)
    check_keys_read(scenario, source)
    check_options(scenario.target, source, "target")
    check_options(scenario.reference, reference_source, "reference")
    check_sampling(scenario, source)
    count = prompt_counter(scenario, source, config) if texts else None
    if texts:
        check_limits(scenario, config, count)
    check_served(scenario, source, config, count)
    return source


def check_served(scenario: Scenario, source: Path | None, config: dict, count_text=None) -> None:
    """The model is one the target engine serves as the reference runs it, as its adapter declares: an arch it
    has no graph for, or a sequence past a sliding window it does not implement, is bad input up front (the
    run would fail, or differ from the reference for that reason alone), not an engine failure minutes later.
    `count_text(text) -> tokens` sizes a text prompt (None: one token, the least it can be)."""
    caps = capabilities(scenario.target.engine, source)
    arch = config.get("model_type", scenario.model.get("arch"))  # a seeded model's keys leave its arch out
    if caps is None or not isinstance(arch, str):
        return
    engine = scenario.target.engine
    refusal = caps.arch_refusal(engine, arch)
    if refusal:
        raise BadInput(f"[model] {refusal} (the tree under test)")
    window = config.get("sliding_window")
    for i, req in enumerate(scenario.requests):
        prompt = len(req.prompt_ids) if req.prompt_ids is not None else (count_text(req.prompt) if count_text else 1)
        refusal = caps.window_refusal(
            engine, arch, window if isinstance(window, int) else None, prompt + req.max_tokens
        )
        if refusal:
            raise BadInput(
                f"request {i} (prompt + max_tokens): {refusal} (it attends to the whole context), so its output "
                f"would differ from the reference for that reason alone; keep each request within {window} tokens"
            )


def other_arch_keys(model: dict) -> list[str]:
    """[model] keys that only another seeded arch's config declares (gemma2's attn_logit_softcapping on a
    llama): written into config.json, but the reference's model of this arch ignores them."""
    from tools.probe.checkpoints import FILE_KEYS, TINY_PRESETS, WEIGHT_KEYS

    if "path" in model:
        return []
    arch = model["arch"]
    own = config_fields(arch) | {"arch", "seed", *FILE_KEYS, *WEIGHT_KEYS}
    others = {a: config_fields(a) for a in TINY_PRESETS if a != arch}
    return sorted(k for k in model if k not in own and any(k in f for f in others.values()))


def check_keys_read(scenario: Scenario, source: Path | None) -> None:
    """A key of another arch's config is refused when the run would ignore it: the reference does, and the
    target engine's adapter says its engine does not read it either (Engine.config_keys_read, asked in a
    worker on the tree under test). An engine that reads it passes: a tree reading a key its arch does not
    use is what the probe is for. An adapter that does not say passes too."""
    from tools.engines import config_keys_read
    from tools.engines.runner import EngineRunError
    from tools.probe.checkpoints import TINY_PRESETS, ensure_checkpoint

    model = scenario.model
    suspects = other_arch_keys(model)
    if not suspects:
        return
    try:
        read = config_keys_read(scenario.target.engine, source, ensure_checkpoint(model))
    except EngineRunError:
        return  # the tree does not import: its run says so
    ignored = [k for k in suspects if read is not None and k not in read]
    if ignored:
        key, arch = ignored[0], model["arch"]
        owners = sorted(a for a in TINY_PRESETS if a != arch and key in config_fields(a))
        them = "them" if len(ignored) > 1 else "it"
        raise BadInput(
            f"[model] {', '.join(ignored)} belong(s) to the {' and '.join(owners)} config, not {arch}'s: both the "
            f"reference's {arch} model and {scenario.target.engine} would ignore {them}; drop {them}, "
            f"or set arch = {owners[0]!r}"
        )


def check_reference_precision(scenario: Scenario) -> None:
    """The trusted run (Y) must be at least as precise as the target: judged against a float32 Y, a float64
    target's error is Y's own rounding, and every ratio measures the reference, not the engine."""
    from tools.scenario import DTYPES

    target, reference = scenario.target.dtype, scenario.reference.dtype
    if DTYPES.index(reference) > DTYPES.index(target):
        raise BadInput(
            f"[reference] dtype = {reference!r} is less precise than the target's {target!r}: the trusted run "
            f"must be at least as precise as the run it judges; use [reference] dtype = {target!r}"
        )


def prompt_counter(scenario: Scenario, source: Path | None, config: dict):
    """text -> how many tokens the target engine feeds the model for it, asked of its adapter in a worker
    (Engine.encode_prompts: its own tokenizer, special tokens and template as its runs use them); an adapter
    that does not say is counted with the checkpoint's tokenizer as transformers reads it (text_counter)."""
    from tools.engines import encode_prompts
    from tools.engines.runner import EngineRunError
    from tools.probe.checkpoints import ensure_checkpoint

    texts = sorted({req.prompt for req in scenario.requests if req.prompt is not None})
    try:
        checkpoint = ensure_checkpoint(scenario.model)
        counts = encode_prompts(scenario.target.engine, source, checkpoint, texts)
    except EngineRunError:
        counts = None  # the tree does not import, or has no tokenizer: its run will say so
    if counts is None:
        return text_counter(scenario.model, config)
    return dict(zip(texts, counts, strict=True)).__getitem__


def check_sampling(scenario: Scenario, source: Path | None) -> None:
    """Each request's sampling against the keys the target engine honours: one it would ignore is bad input,
    not a divergence to report (the reference sampler applies every key)."""
    caps = capabilities(scenario.target.engine, source)
    honoured = caps.sampling_keys if caps is not None else None
    for i, req in enumerate(scenario.requests):
        ignored = unhonoured_sampling(req.sampling, honoured)
        if ignored:
            raise BadInput(
                f"request {i}: sampling {ignored} is not honoured by {scenario.target.engine} (it honours "
                f"{', '.join(honoured or ())}); leave those keys out or at their neutral value"
            )
