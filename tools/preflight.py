"""Checks that run before any engine starts: nothing a user gives is silently ignored.

A source tree that does not hold the engine's package would quietly probe the installed
engine instead; a tap pattern that matches nothing would print an empty table and "agree";
max_tokens past the model's positions would run until the engine's timeout. Each of these is
a `BadInput` here, with one line saying what to change. Reads only small files (config.json);
never loads weights. What an engine takes (its package, its options) is what the tree under test
declares, asked of a worker (tools.engines.engine_capabilities, cached for the run), so an adapter
that only the tree holds is checked too.
"""

from __future__ import annotations

import difflib
import json
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
    check_config_values(model)
    return keys


def check_config_values(model: dict) -> None:
    """The factory's AutoConfig takes the keys (it validates some values: initializer_range = 1e30 is
    refused there); without this the refusal came as a traceback from the checkpoint's build."""
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
    the model silently keeps the field's default. Keys near no field pass through (an engine may read them)."""
    from tools.probe.checkpoints import FILE_KEYS, WEIGHT_KEYS

    fields = config_fields(model["arch"])
    for key in sorted(set(model) - fields - {"arch", "seed", *FILE_KEYS, *WEIGHT_KEYS}):
        near = difflib.get_close_matches(key, sorted(fields), n=1, cutoff=0.85)
        if near:
            raise BadInput(f"[model] {key} is not a {model['arch']} config field; did you mean {near[0]}?")


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


def check_limits(scenario: Scenario, config: dict, count_text=None) -> None:
    """Every request fits the model: prompt + max_tokens within its positions, ids within its vocab.
    `count_text(text) -> tokens` sizes a text prompt (None: counted as one token, the least it can be)."""
    positions, vocab = config.get("max_position_embeddings"), config.get("vocab_size")
    for i, req in enumerate(scenario.requests):
        if req.prompt_ids is not None:
            prompt_len = len(req.prompt_ids)
        else:
            prompt_len = count_text(req.prompt) if count_text is not None else 1
        if isinstance(positions, int) and prompt_len + req.max_tokens > positions:
            what = (
                f"prompt ({prompt_len} tokens) + max_tokens ({req.max_tokens:,})"
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


def check_engine(engine: str) -> None:
    """A name that resolves nowhere is bad input listing the known ones; imports no adapter."""
    from tools.engines import engine_path

    engine_path(engine)


def capabilities(engine: str, source: Path | None) -> Capabilities | None:
    """What the engine declares in the tree under test; an unknown name is bad input listing the
    known ones. None when the tree does not import: the probe then reports that run's failure."""
    from tools.engines import engine_capabilities
    from tools.engines.runner import EngineRunError

    check_engine(engine)  # before any worker starts
    try:
        return engine_capabilities(engine, source)
    except EngineRunError:
        return None


def check_target_source(engine: str, source: Path | None) -> Path | None:
    """--target-source must be a folder holding the engine's importable package (the repo root)."""
    if source is None:
        return None
    source = Path(source)
    if not source.exists():
        raise BadInput(f"--target-source {source} does not exist")
    if not source.is_dir():
        raise BadInput(f"--target-source {source} is a file; give the folder that holds the engine's package")
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
    """All checks for one probe or diagnosis; returns the resolved target source."""
    if not isinstance(scenario, Scenario):
        raise ScenarioError("no scenario")
    source = check_target_source(scenario.target.engine, target_source)
    config = model_config(scenario.model)
    texts = any(req.prompt_ids is None for req in scenario.requests)
    check_limits(scenario, config, text_counter(scenario.model, config) if texts else None)
    check_taps(taps, config)
    check_options(scenario.target, source, "target")
    check_options(scenario.reference, reference_source, "reference")
    check_sampling(scenario, source)
    return source


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
