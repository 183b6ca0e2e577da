"""Scenario: everything a reproduction needs (docs/design.md §1).

A Scenario is plain data, checked on creation. It is read from `repro.toml`
(benchmark cases, users) or built by triage, and passed to every engine run.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tools.engines import DEFAULT_ENGINE
from tools.errors import BadInput

DTYPES = ("float64", "float32", "bfloat16", "float16")
SAMPLING_KEYS = {
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "logprobs",
    "stop",
    "stop_token_ids",
    "ignore_eos",
}
# A sampling key at this value changes nothing, so an engine that does not honour the key still serves it.
SAMPLING_NEUTRAL = {
    "temperature": 0.0,  # greedy: what an engine that does not sample does anyway
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "stop": [],
    "stop_token_ids": [],
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
}


# Keys that change nothing in a greedy request (temperature 0): the cut and the draw are never made.
MOOT_WHEN_GREEDY = ("top_k", "top_p", "min_p", "seed")


def unhonoured_sampling(sampling: dict, honoured: tuple[str, ...] | None) -> list[str]:
    """A request's sampling and the keys an engine honours (None: all) -> the keys it sets that the engine
    would ignore (neutral values left out: a presence_penalty of 0 asks for nothing; so are the cut and the
    seed of a greedy request)."""
    if honoured is None:
        return []
    greedy = float(sampling.get("temperature", 0.0)) == 0.0
    return sorted(
        k
        for k, v in sampling.items()
        if k not in honoured
        and not (k in SAMPLING_NEUTRAL and v == SAMPLING_NEUTRAL[k])
        and not (greedy and k in MOOT_WHEN_GREEDY)
    )


# Type of each sampling value: a wrong type fails here, not deep inside an engine process.
_NUMBER, _INT = (int, float), (int,)
SAMPLING_TYPES = {
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "min_p": _NUMBER,
    "repetition_penalty": _NUMBER,
    "presence_penalty": _NUMBER,
    "frequency_penalty": _NUMBER,
    "top_k": _INT,
    "seed": _INT,
    "logprobs": _INT,
    "ignore_eos": (bool,),
    "stop": (str, list),
    "stop_token_ids": (list,),
}
SCENARIO_KEYS = {"model", "target", "reference", "workload", "good_ref"}
# Sizes past which a scenario is a typo, not a reproduction (max_tokens is also held to the
# model's positions by tools.preflight, which knows the checkpoint).
MAX_REQUESTS = 256
MAX_TOKENS = 1_000_000
MAX_PROMPT_CHARS = 1_000_000
MAX_ARRIVAL_STEP = 100_000


class ScenarioError(BadInput):
    """A scenario that cannot be run; the message says which key and why."""


REFERENCE_DTYPES = ("float64", "float32")  # the trusted run Y; the first is the default


@dataclass(frozen=True)
class EngineSpec:
    engine: str = DEFAULT_ENGINE
    dtype: str = "float32"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.engine, str) or not self.engine:
            raise ScenarioError(f"engine must be a name such as {DEFAULT_ENGINE!r}, got {self.engine!r}")
        if self.dtype not in DTYPES:
            raise ScenarioError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not isinstance(self.options, dict):
            raise ScenarioError(f"options must be a table, got {type(self.options).__name__}")
        if not all(isinstance(k, str) for k in self.options):
            raise ScenarioError("option names must be strings")


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...] | None = None
    prompt: str | None = None
    max_tokens: int = 16
    sampling: dict[str, Any] = field(default_factory=dict)
    arrival_step: int = 0

    def __post_init__(self):
        if (self.prompt_ids is None) == (self.prompt is None):
            raise ScenarioError("a request needs exactly one of prompt_ids or prompt")
        if self.prompt_ids is not None and not self.prompt_ids:
            raise ScenarioError("prompt_ids is empty")
        if self.prompt is not None:
            _check_prompt(self.prompt)
        _check_int("max_tokens", self.max_tokens, 1, MAX_TOKENS)
        _check_int("arrival_step", self.arrival_step, 0, MAX_ARRIVAL_STEP)
        _check_sampling(self.sampling)

    @property
    def greedy(self) -> bool:
        return float(self.sampling.get("temperature", 0.0)) == 0.0


def _check_int(name: str, value, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ScenarioError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ScenarioError(f"{name} must be between {low} and {high:,}, got {value:,}")


def _check_prompt(prompt) -> None:
    if not isinstance(prompt, str):
        raise ScenarioError(f"prompt must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ScenarioError("prompt is empty: give the text to send, or prompt_ids")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ScenarioError(f"prompt has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,}")


def _check_sampling(sampling) -> None:
    if not isinstance(sampling, dict):
        raise ScenarioError(f"sampling must be a table, got {type(sampling).__name__}")
    unknown = set(sampling) - SAMPLING_KEYS
    if unknown:
        raise ScenarioError(f"unknown sampling keys {sorted(map(str, unknown))}; known: {sorted(SAMPLING_KEYS)}")
    for key, value in sampling.items():
        types = SAMPLING_TYPES.get(key)
        if types and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise ScenarioError(
                f"sampling.{key} = {value!r} has the wrong type; expected {' or '.join(t.__name__ for t in types)}"
            )


@dataclass(frozen=True)
class Scenario:
    model: dict[str, Any]
    target: EngineSpec
    reference: EngineSpec = field(default_factory=lambda: EngineSpec(dtype=REFERENCE_DTYPES[0]))
    requests: tuple[Request, ...] = ()
    good_ref: str | None = None

    def __post_init__(self):
        if not isinstance(self.model, dict):
            raise ScenarioError("[model] must be a table")
        if "path" not in self.model and "arch" not in self.model:
            raise ScenarioError("[model] needs either `path` (a checkpoint dir) or `arch` (seeded random weights)")
        for key in ("path", "arch"):
            if key in self.model and not (isinstance(self.model[key], str) and self.model[key].strip()):
                raise ScenarioError(f"model.{key} must be a non-empty string, got {self.model[key]!r}")
        if "seed" in self.model:
            _check_int("model.seed", self.model["seed"], 0, 2**32 - 1)
        if not self.requests:
            raise ScenarioError("[[workload.requests]] is empty: nothing to run")
        if len(self.requests) > MAX_REQUESTS:
            raise ScenarioError(f"{len(self.requests)} requests; at most {MAX_REQUESTS} per scenario")
        if self.good_ref is not None and not (isinstance(self.good_ref, str) and self.good_ref.strip()):
            raise ScenarioError(f"good_ref must be a git ref (a non-empty string), got {self.good_ref!r}")

    def with_target(self, **changes) -> Scenario:
        return replace(self, target=replace(self.target, **changes))

    def with_reference(self, **changes) -> Scenario:
        return replace(self, reference=replace(self.reference, **changes))

    def with_requests(self, requests) -> Scenario:
        return replace(self, requests=tuple(requests))

    def to_dict(self) -> dict:
        reference = {
            "engine": self.reference.engine,
            "dtype": self.reference.dtype,
            "options": dict(self.reference.options),
        }
        data: dict[str, object] = {
            "model": dict(self.model),
            "target": asdict(self.target),
            "reference": reference,
            "workload": {"requests": [_request_dict(r) for r in self.requests]},
        }
        if self.good_ref:
            data["good_ref"] = self.good_ref
        return data


def _request_dict(r: Request) -> dict:
    d = {k: v for k, v in asdict(r).items() if v is not None}
    if "prompt_ids" in d:
        d["prompt_ids"] = list(d["prompt_ids"])
    return d


def from_dict(data: dict) -> Scenario:
    """Scenario dict (the repro.toml shape) -> Scenario; anything unusable is a ScenarioError."""
    if not isinstance(data, dict):
        raise ScenarioError(f"a scenario must be a table, got {type(data).__name__}")
    data = copy.deepcopy(data)
    unknown = set(data) - SCENARIO_KEYS
    if unknown:
        raise ScenarioError(f"unknown top-level keys {sorted(map(str, unknown))}; known: {sorted(SCENARIO_KEYS)}")
    for table in ("model", "target"):
        if table not in data:
            raise ScenarioError(f"scenario is missing the [{table}] table")
    if not isinstance(data["model"], dict):
        raise ScenarioError("[model] must be a table")
    target = _engine_spec(data["target"], "target")
    reference = _engine_spec(data.get("reference", {}), "reference")
    return Scenario(
        model=data["model"],
        target=target,
        reference=reference,
        requests=_requests(data.get("workload", {})),
        good_ref=data.get("good_ref"),
    )


def _requests(workload) -> tuple[Request, ...]:
    if not isinstance(workload, dict):
        raise ScenarioError("[workload] must be a table")
    if set(workload) - {"requests"}:
        raise ScenarioError(
            f"[workload] has unknown keys {sorted(map(str, set(workload) - {'requests'}))}; known: ['requests']"
        )
    raw = workload.get("requests", [])
    if not isinstance(raw, list):
        raise ScenarioError("workload.requests must be an array of tables ([[workload.requests]])")
    if len(raw) > MAX_REQUESTS:
        raise ScenarioError(f"{len(raw)} requests; at most {MAX_REQUESTS} per scenario")
    return tuple(_request(r, i) for i, r in enumerate(raw))


def _engine_spec(d: dict, where: str) -> EngineSpec:
    if not isinstance(d, dict):
        raise ScenarioError(f"[{where}] must be a table")
    unknown = set(d) - {"engine", "dtype", "options"}
    if unknown:
        raise ScenarioError(f"[{where}] has unknown keys {sorted(map(str, unknown))}; known: engine, dtype, options")
    if where == "reference":
        d = {**d, "dtype": d.get("dtype", REFERENCE_DTYPES[0])}
        check_reference_dtype(d["dtype"])
    return EngineSpec(**d)


def check_reference_dtype(dtype) -> None:
    """[reference] dtype is the precision of the trusted run Y (DESIGN §3): float64 (default) or
    float32. The reference also runs in the target's dtype (R) on its own, so a half-precision
    value here would mean nothing and is refused rather than ignored."""
    if dtype not in REFERENCE_DTYPES:
        raise ScenarioError(
            f"[reference] dtype = {dtype!r} cannot be the trusted high-precision run; use one of "
            f"{', '.join(REFERENCE_DTYPES)} (the reference also runs in the target's dtype by itself)"
        )


def _request(d: dict, i: int) -> Request:
    if not isinstance(d, dict):
        raise ScenarioError(f"request {i} must be a table")
    unknown = set(d) - {"prompt_ids", "prompt", "max_tokens", "sampling", "arrival_step"}
    if unknown:
        raise ScenarioError(
            f"request {i} has unknown keys {sorted(map(str, unknown))}; known: "
            "prompt, prompt_ids, max_tokens, sampling, arrival_step"
        )
    if "prompt_ids" in d:
        ids = d["prompt_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ScenarioError(f"request {i}: prompt_ids must be a list of non-negative ints")
        d["prompt_ids"] = tuple(ids)
    try:
        return Request(**d)
    except ScenarioError as e:
        raise ScenarioError(f"request {i}: {e}") from None


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {path}") from None
    except IsADirectoryError:
        raise ScenarioError(f"scenario {path} is a folder, not a TOML file") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"scenario {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path} is not valid TOML: {e}") from None
    return from_dict(data)


def loads(text: str) -> Scenario:
    try:
        return from_dict(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"scenario is not valid TOML: {e}") from None
