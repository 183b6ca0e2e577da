"""Scenario: everything a reproduction needs (DESIGN.md §1).

A Scenario is plain data, checked on creation. It is read from `repro.toml`
(benchmark cases, users) or built by triage, and passed to every engine run.
"""
from __future__ import annotations

import copy
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

DTYPES = ("float64", "float32", "bfloat16", "float16")
SAMPLING_KEYS = {
    "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "seed", "logprobs", "stop", "stop_token_ids", "ignore_eos",
}


class ScenarioError(ValueError):
    """A scenario that cannot be run; the message says which key and why."""


@dataclass(frozen=True)
class EngineSpec:
    engine: str = "transformers"
    dtype: str = "float32"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ScenarioError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not isinstance(self.options, dict):
            raise ScenarioError(f"options must be a table, got {type(self.options).__name__}")


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
        if self.max_tokens < 1:
            raise ScenarioError(f"max_tokens must be >= 1, got {self.max_tokens}")
        unknown = set(self.sampling) - SAMPLING_KEYS
        if unknown:
            raise ScenarioError(f"unknown sampling keys {sorted(unknown)}; known: {sorted(SAMPLING_KEYS)}")

    @property
    def greedy(self) -> bool:
        return float(self.sampling.get("temperature", 0.0)) == 0.0


@dataclass(frozen=True)
class Scenario:
    model: dict[str, Any]
    target: EngineSpec
    reference: EngineSpec = field(default_factory=EngineSpec)
    requests: tuple[Request, ...] = ()
    good_ref: str | None = None

    def __post_init__(self):
        if "path" not in self.model and "arch" not in self.model:
            raise ScenarioError("[model] needs either `path` (a checkpoint dir) or `arch` (seeded random weights)")
        if not self.requests:
            raise ScenarioError("[[workload.requests]] is empty: nothing to run")

    def with_target(self, **changes) -> "Scenario":
        return replace(self, target=replace(self.target, **changes))

    def with_reference(self, **changes) -> "Scenario":
        return replace(self, reference=replace(self.reference, **changes))

    def with_requests(self, requests) -> "Scenario":
        return replace(self, requests=tuple(requests))

    def to_dict(self) -> dict:
        data = {"model": dict(self.model), "target": asdict(self.target), "reference": asdict(self.reference),
                "workload": {"requests": [_request_dict(r) for r in self.requests]}}
        if self.good_ref:
            data["good_ref"] = self.good_ref
        return data


def _request_dict(r: Request) -> dict:
    d = {k: v for k, v in asdict(r).items() if v is not None}
    if "prompt_ids" in d:
        d["prompt_ids"] = list(d["prompt_ids"])
    return d


def from_dict(data: dict) -> Scenario:
    data = copy.deepcopy(data)
    try:
        model = data["model"]
        target = _engine_spec(data["target"], "target")
        reference = _engine_spec(data.get("reference", {}), "reference")
        raw = data.get("workload", {}).get("requests", [])
    except KeyError as e:
        raise ScenarioError(f"scenario is missing the [{e.args[0]}] table") from None
    if not isinstance(model, dict):
        raise ScenarioError("[model] must be a table")
    requests = tuple(_request(r, i) for i, r in enumerate(raw))
    return Scenario(model=model, target=target, reference=reference, requests=requests,
                    good_ref=data.get("good_ref"))


def _engine_spec(d: dict, where: str) -> EngineSpec:
    if not isinstance(d, dict):
        raise ScenarioError(f"[{where}] must be a table")
    unknown = set(d) - {"engine", "dtype", "options"}
    if unknown:
        raise ScenarioError(f"[{where}] has unknown keys {sorted(unknown)}")
    return EngineSpec(**d)


def _request(d: dict, i: int) -> Request:
    if not isinstance(d, dict):
        raise ScenarioError(f"request {i} must be a table")
    unknown = set(d) - {"prompt_ids", "prompt", "max_tokens", "sampling", "arrival_step"}
    if unknown:
        raise ScenarioError(f"request {i} has unknown keys {sorted(unknown)}")
    if "prompt_ids" in d:
        ids = d["prompt_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
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
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path} is not valid TOML: {e}") from None
    return from_dict(data)


def loads(text: str) -> Scenario:
    try:
        return from_dict(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"scenario is not valid TOML: {e}") from None
