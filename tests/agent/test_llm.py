"""OpenAIChat against a scripted model over real HTTP: tool loop, JSON fallback, accounting, failures."""

import json

import pytest

from agent.llm import (
    LLMBudgetSpent,
    LLMMalformed,
    LLMRateLimited,
    LLMTimeout,
    OpenAIChat,
    SourceTools,
    parse_json_object,
    retry_after,
)
from tests.agent.helpers import make_repo
from tests.agent.scripted_llm import ScriptedLLM, answer, garbage, refuse_tools, slow, status, tool_call


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path)


def chat(server, **kw) -> OpenAIChat:
    kw = {
        "model": "scripted",
        "base_url": server.url,
        "api_key": "sk-test",
        "timeout_s": 5.0,
        "retry_wait_s": 0.01,
        **kw,
    }
    return OpenAIChat(**kw)


def test_plain_answer_and_usage_accounting():
    with ScriptedLLM([answer({"order": ["batch"]})]) as server:
        llm = chat(server)
        assert llm.ask("sys", "user") == {"order": ["batch"]}
        assert llm.ask("sys", "again") == {"order": ["batch"]}
    assert (llm.usage.calls, llm.usage.tokens_in, llm.usage.tokens_out) == (2, 22, 14)
    assert server.requests[0]["messages"][0] == {"role": "system", "content": "sys"}
    assert "tools" not in server.requests[0]
    assert "max_tokens" not in server.requests[0]  # no cap unless the config sets one


def test_answer_tokens_cap_every_request(repo):
    """llm_answer_tokens (a weak local model may ramble until its context is full) reaches each
    request, tool rounds included."""
    from agent.config import RunConfig, Settings, UsageError

    with ScriptedLLM([tool_call("search_symbols", query="rope"), answer({"order": [0]})]) as server:
        llm = chat(server, answer_tokens=32)
        assert llm.ask("sys", "user", SourceTools(repo)) == {"order": [0]}
    assert [r["max_tokens"] for r in server.requests] == [32, 32]
    settings = Settings.from_env({"DIFFDX_LLM_ANSWER_TOKENS": "64"})
    assert RunConfig.from_file(None, settings).llm_answer_tokens == 64
    with pytest.raises(UsageError):
        Settings.from_env({"DIFFDX_LLM_ANSWER_TOKENS": "-3"})
    with pytest.raises(UsageError):
        RunConfig(llm_answer_tokens=0)


def test_tool_loop_runs_read_only_tools_then_answers(repo):
    script = [
        tool_call("search_symbols", query="softmax"),
        tool_call("read_function", name="softmax"),
        tool_call("commit_diff", commit="HEAD"),
        answer({"order": [1, 0]}),
    ]
    tools = SourceTools(repo)
    with ScriptedLLM(script) as server:
        llm = chat(server)
        assert llm.ask("sys", "rank", tools) == {"order": [1, 0]}
    assert [name for name, _ in tools.log] == ["search_symbols", "read_function", "commit_diff"]
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} == {
        "search_symbols",
        "read_function",
        "callers",
        "callees",
        "commit_diff",
    }
    tool_msgs = [m for m in server.requests[-1]["messages"] if m["role"] == "tool"]
    assert "eng/attn.py" in tool_msgs[0]["content"]
    assert "def softmax" in tool_msgs[1]["content"]
    assert "softmax(0)" in tool_msgs[2]["content"] and "Normalize softmax" in tool_msgs[2]["content"]
    assert llm.usage.calls == 4 and llm.usage.tokens_in == 44


def test_json_mode_fallback_when_endpoint_refuses_tools(repo):
    """An endpoint without tool calling answers 400 to `tools`: the client drops to JSON mode
    and the model calls tools through the JSON protocol instead."""

    def script(req):
        if "tools" in req:
            return refuse_tools(answer({}))
        calls = sum(1 for m in req["messages"] if m["role"] == "assistant")
        return answer({"tool": "callers", "arguments": {"name": "softmax"}}) if calls == 0 else answer({"order": [0]})

    tools = SourceTools(repo)
    with ScriptedLLM(script) as server:
        llm = chat(server)
        assert llm.ask("sys", "rank", tools) == {"order": [0]}
    assert llm.mode == "json"
    assert [r.get("response_format") for r in server.requests[1:]] == [{"type": "json_object"}] * 2
    assert tools.log == [("callers", {"name": "softmax"})]
    assert "Attention.forward" in server.requests[-1]["messages"][-1]["content"]
    assert '"tool"' in server.requests[1]["messages"][0]["content"]  # protocol explained


def test_timeout_raises_llm_timeout():
    with ScriptedLLM([slow(3.0)]) as server:
        llm = chat(server, timeout_s=0.4)
        with pytest.raises(LLMTimeout):
            llm.ask("sys", "user")
    assert llm.usage.calls == 1


def test_429_is_retried_then_succeeds():
    with ScriptedLLM([status(429, retry_after=0), status(429, retry_after=0), answer({"ok": 1})]) as server:
        llm = chat(server, retries=2)
        assert llm.ask("sys", "user") == {"ok": 1}
    assert len(server.requests) == 3


def test_429_past_the_retries_raises_rate_limited():
    with ScriptedLLM([status(429, retry_after=0)]) as server:
        llm = chat(server, retries=1)
        with pytest.raises(LLMRateLimited):
            llm.ask("sys", "user")
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    "reply",
    [
        garbage(),
        tool_call("search_symbols", "{not json"),
        tool_call("shell", cmd="rm -rf /"),
        tool_call("read_function", nme="x"),
    ],
)
def test_garbage_and_malformed_tool_calls_raise_malformed(repo, reply):
    tools = SourceTools(repo)
    with ScriptedLLM([reply]) as server:
        with pytest.raises(LLMMalformed):
            chat(server).ask("sys", "user", tools)
    assert tools.log == []


def test_call_and_token_budgets():
    with ScriptedLLM([answer({"a": 1})]) as server:
        llm = chat(server, max_calls=1)
        llm.ask("s", "u")
        with pytest.raises(LLMBudgetSpent):
            llm.ask("s", "u")
        small = chat(server, max_tokens=10)
        small.ask("s", "u")  # 18 tokens: over budget afterwards
        with pytest.raises(LLMBudgetSpent):
            small.ask("s", "u")


def test_tool_rounds_are_bounded(repo):
    with ScriptedLLM([tool_call("callers", name="softmax")]) as server:
        llm = chat(server, max_tool_rounds=2)
        with pytest.raises(LLMMalformed):  # the last round offers no tools, the model calls one anyway
            llm.ask("s", "u", SourceTools(repo))
    assert "tools" not in server.requests[-1]


def test_commit_diff_refuses_option_injection(repo):
    tools = SourceTools(repo)
    assert tools.call("commit_diff", {"commit": "--output=/tmp/pwned"}).startswith("error")
    assert tools.call("commit_diff", {"commit": "nosuchref"}).startswith("error")
    assert tools.call("callees", {"name": "Attention.forward"}) == "softmax"


def test_run_variant_only_known_names_and_only_when_given(repo):
    ran = []
    tools = SourceTools(repo, run_variant=lambda name: ran.append(name) or "diverges", variants=["batch"])
    assert "run_variant" in {t["function"]["name"] for t in tools.specs()}
    assert tools.call("run_variant", {"name": "rm -rf"}).startswith("error")
    assert tools.call("run_variant", {"name": "batch"}) == "diverges" and ran == ["batch"]
    spec = next(t for t in tools.specs() if t["function"]["name"] == "run_variant")
    assert spec["function"]["parameters"]["properties"]["name"]["enum"] == ["batch"]
    with pytest.raises(LLMMalformed):
        SourceTools(repo).call("run_variant", {"name": "batch"})


def test_pure_helpers():
    assert parse_json_object('```json\n{"a": [1]}\n```') == {"a": [1]}
    assert parse_json_object("no json here") is None and parse_json_object("[1, 2]") is None
    assert retry_after({"retry-after": "2"}, 0, 1.0) == 2.0
    assert retry_after({}, 2, 0.5) == 2.0
    assert json.loads(json.dumps(SourceTools(None).specs())) == []
