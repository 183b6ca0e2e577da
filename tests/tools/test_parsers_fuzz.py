"""Property-based fuzzing of the two parsers that read user text: the scenario parser
(tools.scenario) and the issue extractor (tools.triage.extract). Whatever they are given, they
parse or raise the project's own bad-input error (tools.errors.BadInput), never anything else."""

from __future__ import annotations

import tomllib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.errors import BadInput
from tools.scenario import Scenario, ScenarioError, from_dict, loads
from tools.triage.extract import extract_scenario, require_scenario, to_scenario

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = [
    "model",
    "target",
    "reference",
    "workload",
    "requests",
    "engine",
    "dtype",
    "options",
    "arch",
    "seed",
    "path",
    "prompt",
    "prompt_ids",
    "max_tokens",
    "sampling",
    "arrival_step",
    "temperature",
    "top_k",
    "good_ref",
    "stop",
    "x",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["llama", "tinyserve", "transformers", "float32", "bfloat16", "float64", "fp7", ""]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=20,
)


def near_valid() -> st.SearchStrategy[dict]:
    """Scenario dicts close to valid ones, so the fuzz reaches the deep checks, not only the first."""
    request = st.fixed_dictionaries(
        {},
        optional={
            "prompt_ids": st.one_of(st.lists(st.integers(-3, 600), max_size=5), values),
            "prompt": st.one_of(st.text(max_size=20), values),
            "max_tokens": st.one_of(st.integers(-5, 10**9), values),
            "sampling": st.one_of(
                st.dictionaries(
                    st.sampled_from(["temperature", "top_k", "seed", "stop", "bogus"]), scalars, max_size=3
                ),
                values,
            ),
            "arrival_step": st.one_of(st.integers(-2, 10**6), values),
        },
    )
    engine = st.fixed_dictionaries(
        {},
        optional={
            "engine": st.one_of(st.sampled_from(["tinyserve", "transformers"]), values),
            "dtype": st.one_of(st.sampled_from(["float32", "bfloat16", "f"]), values),
            "options": st.one_of(st.dictionaries(st.text(max_size=5), scalars), values),
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "model": st.one_of(
                st.fixed_dictionaries(
                    {"arch": st.sampled_from(["llama", "qwen2", ""])}, optional={"seed": values, "path": values}
                ),
                values,
            ),
            "target": st.one_of(engine, values),
            "reference": st.one_of(engine, values),
            "workload": st.one_of(
                st.fixed_dictionaries({"requests": st.lists(st.one_of(request, values), max_size=3)}), values
            ),
            "good_ref": values,
            "extra": values,
        },
    )


@FUZZ
@given(st.one_of(near_valid(), values))
def test_scenario_dicts_parse_or_raise_bad_input(data):
    try:
        scenario = from_dict(data)
    except ScenarioError as e:
        assert isinstance(e, BadInput) and str(e)
        return
    assert isinstance(scenario, Scenario)
    assert from_dict(scenario.to_dict()) == scenario  # what parses also round-trips


@FUZZ
@given(
    st.lists(
        st.sampled_from(
            list("[]=\"'{}.,\n #abc01_-") + ["model", "target", "workload.requests", "prompt", "engine", "dtype"]
        ),
        max_size=80,
    ).map("".join)
)
def test_toml_ish_text_parses_or_raises_bad_input(text):
    try:
        loads(text)
    except ScenarioError as e:
        assert isinstance(e, BadInput)


@FUZZ
@given(near_valid())
def test_rendered_toml_of_near_valid_scenarios(data):
    """Any dict written as TOML and read back goes through the same checks (tomllib's own view)."""
    try:
        text = _toml(data)
        tomllib.loads(text)
    except (TypeError, ValueError):
        return  # not representable as TOML: nothing to test
    try:
        loads(text)
    except ScenarioError:
        pass


ISSUE_WORDS = [
    "llama",
    "Qwen2.5-7B",
    "vllm==0.5.1",
    "prompt=",
    "prompts = [",
    '"hello"',
    "'x'",
    "1. ",
    "- ",
    "```text\n",
    "```toml\n",
    "```",
    "[model]\n",
    'arch = "llama"\n',
    "max_tokens=",
    "temperature=",
    "bf16",
    "--model ",
    "worked in v0.4.2",
    "\\",
    "\\x",
    "\\u12",
    "\n",
    " ",
    "“",
    "”",
    "TP=2",
    "top_k=-1",
]


@FUZZ
@given(st.text(max_size=40), st.lists(st.one_of(st.sampled_from(ISSUE_WORDS), st.text(max_size=8)), max_size=30))
def test_issue_text_extracts_or_raises_bad_input(title, words):
    body = "".join(words)
    partial, missing = extract_scenario(title, body)
    assert isinstance(partial, dict) and isinstance(missing, list)
    try:
        scenario = require_scenario(partial)
    except BadInput as e:
        assert "missing" in str(e) or "not runnable" in str(e)
        assert to_scenario(partial) is None
        return
    assert isinstance(scenario, Scenario) and to_scenario(partial) == scenario


def _toml(data: dict) -> str:
    """A tiny TOML writer for fuzz input (inline tables only); TypeError for what TOML cannot hold."""
    return "\n".join(f"{_key(k)} = {_value(v)}" for k, v in data.items()) + "\n"


def _key(k) -> str:
    if not isinstance(k, str):
        raise TypeError(k)
    return '"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)) and not (isinstance(v, float) and v != v):
        return repr(v) if isinstance(v, int) else repr(float(v)).replace("inf", "inf")
    if isinstance(v, str):
        return _key(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)
