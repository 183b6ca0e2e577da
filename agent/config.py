"""One configuration per run (STYLE §3), and the one place in agent/ and benchmark/ that reads
environment variables.

`RunConfig` is one diagnosis's configuration: the LLM and its budgets, the engine-run and time
budgets, timeouts. It is checked on creation and passed down explicitly: `agent.run` builds it
from its flags (and `--config run.toml`), `benchmark.run` builds one from its command line and
hands it to every diagnosis, and both record it in args.json (`RunConfig.record`, no secrets).

`Settings` is what the environment says (`Settings.from_env`), read once by each command line:

    DIFFDX_LLM_MODEL        the LLM model name (default DEFAULT_MODEL; --model wins)
    DIFFDX_LLM_ANSWER_TOKENS  most tokens of one LLM answer (request max_tokens; the config file wins)
    OPENAI_BASE_URL         an OpenAI-compatible endpoint (docs/design.md §7)
    OPENAI_API_KEY          its key (never recorded)
    GITHUB_API_URL          GitHub's API (default api.github.com; --api-url wins)
    GITHUB_TOKEN            GitHub token (never recorded)
    DIFFDX_WEBHOOK_SECRET   `agent.triage serve`'s secret (--secret wins)
    DIFFDX_TARGET_SOURCE    the tree `agent.triage` diagnoses (default: the installed engine)
    DIFFDX_TRIAGE_LLM       set (with OPENAI_BASE_URL): triage's diagnoses use the LLM too

The boundary: tools/ never imports agent/, so it never sees this module; values reach it as
arguments. The exception is the process boundary, where a parent sets the environment of the
processes it starts and every descendant must see it: the engine processes read their switches
(tools/engines/: DIFFDX_FORKSERVER, DIFFDX_KEEP_TEMP, DIFFDX_RUN_LOG, DIFFDX_COVERAGE, PYTHONPATH,
OMP_NUM_THREADS) and the shared cache folder (tools/probe/checkpoints.py: DIFFDX_CACHE).
tests/test_layering.py holds that list; a new reader elsewhere fails it.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tools.errors import BadInput

DEFAULT_MODEL = "gpt-4o-mini"
LLMS = ("none", "openai")


class UsageError(BadInput):
    """Bad input on the command line; the message says what and how to fix it."""


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint. None: the `openai` client's own defaults."""

    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)

    @property
    def configured(self) -> bool:
        return bool(self.base_url or self.api_key)


@dataclass(frozen=True)
class Settings:
    """What the environment says; read once per command line (`from_env`)."""

    llm_model: str | None = None
    llm_answer_tokens: int | None = None
    endpoint: Endpoint = field(default_factory=Endpoint)
    github_api_url: str | None = None
    github_token: str | None = field(default=None, repr=False)
    webhook_secret: str | None = field(default=None, repr=False)
    target_source: Path | None = None
    triage_llm: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        source = env.get("DIFFDX_TARGET_SOURCE")
        return cls(
            llm_model=env.get("DIFFDX_LLM_MODEL") or None,
            llm_answer_tokens=positive_int("DIFFDX_LLM_ANSWER_TOKENS", env.get("DIFFDX_LLM_ANSWER_TOKENS")),
            endpoint=Endpoint(env.get("OPENAI_BASE_URL") or None, env.get("OPENAI_API_KEY") or None),
            github_api_url=env.get("GITHUB_API_URL") or None,
            github_token=env.get("GITHUB_TOKEN") or None,
            webhook_secret=env.get("DIFFDX_WEBHOOK_SECRET") or None,
            target_source=Path(source) if source else None,
            triage_llm=bool(env.get("DIFFDX_TRIAGE_LLM")),
        )

    def model(self, flag: str | None = None) -> str:
        """The model name: the flag, else $DIFFDX_LLM_MODEL, else DEFAULT_MODEL."""
        return flag or self.llm_model or DEFAULT_MODEL


def positive_int(name: str, value: str | None) -> int | None:
    """An environment variable holding a count; unset or empty: None. Pure."""
    if not value:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise UsageError(f"${name} must be a positive integer, got {value!r}")
    return int(value)


def inherited(names: tuple[str, ...]) -> dict[str, str]:
    """The variables among `names` that are set here, for a worker started elsewhere (Ray)."""
    return {k: os.environ[k] for k in names if k in os.environ}


@dataclass(frozen=True)
class RunConfig:
    llm: str = "none"
    model: str = DEFAULT_MODEL
    max_llm_calls: int = 40
    max_llm_tokens: int = 400_000  # LLM tokens, in + out
    max_engine_runs: int = 200
    max_wall_s: float = 7200.0
    llm_timeout_s: float = 120.0
    llm_retries: int = 2  # per request, on 429 / connection errors
    llm_answer_tokens: int | None = None  # most tokens of one answer (max_tokens); None: the endpoint's limit
    trigger_runs: int = 24  # engine runs the trigger search may spend
    verify_top: int = 6  # suspected changes checked by counterfactual (stops at the first that fixes it)
    device: str = "cpu"
    engine_timeout_s: float = 600.0
    ablate: tuple[str, ...] = ()  # parts of the pipeline switched off (benchmark.run --ablate; benchmark/ablations.py)
    endpoint: Endpoint = field(default_factory=Endpoint, compare=False)  # the LLM's; not recorded

    def __post_init__(self):
        if self.llm not in LLMS:
            raise UsageError(f"--llm {self.llm!r} is not one of {', '.join(LLMS)}")
        for name in ("max_llm_calls", "max_llm_tokens", "max_engine_runs", "trigger_runs", "verify_top"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UsageError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("max_wall_s", "llm_timeout_s", "engine_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise UsageError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.llm_answer_tokens is not None and (
            not isinstance(self.llm_answer_tokens, int)
            or isinstance(self.llm_answer_tokens, bool)
            or self.llm_answer_tokens < 1
        ):
            raise UsageError(f"llm_answer_tokens must be a positive int, got {self.llm_answer_tokens!r}")
        if not isinstance(self.llm_retries, int) or self.llm_retries < 0:
            raise UsageError(f"llm_retries must be an int >= 0, got {self.llm_retries!r}")
        if self.trigger_runs > self.max_engine_runs:
            raise UsageError(
                f"trigger_runs ({self.trigger_runs}) must be <= max_engine_runs ({self.max_engine_runs}): "
                "lower trigger_runs in the --config file"
            )

    @classmethod
    def from_file(cls, path: Path | None, settings: Settings | None = None, **overrides) -> RunConfig:
        """A TOML file of RunConfig fields, then the flags that were given (None: not given); the
        model falls back to $DIFFDX_LLM_MODEL, the endpoint comes from the environment."""
        data = {}
        if path is not None:
            try:
                data = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise UsageError(f"config {path}: {e}") from None
        known = set(TOML_FIELDS)
        if set(data) - known:
            raise UsageError(f"config {path}: unknown keys {sorted(set(data) - known)}; known: {sorted(known)}")
        merged = {**data, **{k: v for k, v in overrides.items() if v is not None}}
        settings = settings or Settings()
        merged["model"] = settings.model(merged.get("model"))
        if merged.get("llm_answer_tokens") is None:
            merged["llm_answer_tokens"] = settings.llm_answer_tokens
        return cls(**merged, endpoint=settings.endpoint)

    def record(self) -> dict:
        """For args.json: every field but the endpoint's key."""
        out = asdict(self)
        out["endpoint"] = {"base_url": self.endpoint.base_url}
        return out


TOML_FIELDS = tuple(f.name for f in fields(RunConfig) if f.name != "endpoint")
