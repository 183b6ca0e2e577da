"""Policy invariants: measurement outranks opinion; LLM failures fall back per step and are recorded."""

from dataclasses import replace

import pytest

from agent.llm import OpenAIChat
from agent.policies import (
    DeterministicPolicy,
    LLMPolicy,
    constrain_ranking,
    measurement_first,
    valid_order,
    variant_name,
)
from tests.agent.helpers import REPRO, candidates, make_repo, scenario
from tests.agent.scripted_llm import ScriptedLLM, answer, garbage, slow, status, task_of
from tools.scenario import ScenarioError
from tools.source.index import open_index

NAMES = [("batch", "a batch of 4"), ("prefix_caching", "prefix caching on"), ("sampling", "temperature 0.8")]


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def index(tmp_path):
    return open_index(make_repo(tmp_path), include_tests=False)


def policy(server, **kw) -> LLMPolicy:
    llm = OpenAIChat(
        model="scripted",
        base_url=server.url,
        api_key="k",
        timeout_s=kw.pop("timeout_s", 5.0),
        retry_wait_s=0.01,
        retries=kw.pop("retries", 1),
    )
    return LLMPolicy(llm, issue_text=kw.pop("issue", "greedy output changes with batch size"))


def test_verified_is_never_outranked_whatever_the_llm_says(index):
    cands = candidates()
    cands[0] = replace(cands[0], verified=True)  # rotate: verified, lowest score
    for order in ([1, 0], [1], [2, 1, 0], [0, 2, 1]):
        ranked = constrain_ranking(cands, {"order": order}, index)
        assert ranked[0].function == "rotate"
        seen_unverified = False
        for h in ranked:
            assert not (h.verified and seen_unverified)
            seen_unverified |= not h.verified


def test_llm_cannot_promote_unevidenced_or_invented_candidates(index):
    cands = candidates()  # [2] Attention.forward has no evidence
    ranked = constrain_ranking(
        cands,
        {
            "order": [2, 0, 1],
            "new_candidate": {"file": "eng/attn.py", "function": "Attention", "explanation": "class, not a function"},
        },
        index,
    )
    assert [h.function for h in ranked] == ["rotate", "softmax", "Attention.forward"]
    invented = constrain_ranking(
        cands,
        {"order": [1], "new_candidate": {"file": "eng/nothere.py", "function": "made_up", "explanation": "trust me"}},
        index,
    )
    assert "made_up" not in [h.function for h in invented]


def test_new_candidate_must_exist_and_ranks_below_every_evidenced_one(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "eng" / "norm.py").write_text("def rms_norm(x):\n    return x\n")
    index = open_index(repo, include_tests=False)
    ranked = constrain_ranking(
        candidates(),
        {
            "order": [1, 0],
            "new_candidate": {"function": "rms_norm", "category": "numerics", "explanation": "eps missing"},
        },
        index,
    )
    assert [h.function for h in ranked] == ["softmax", "rotate", "rms_norm", "Attention.forward"]
    new = ranked[2]
    assert new.file == "eng/norm.py" and not new.verified and "not measured" in new.evidence[0]
    assert new.confidence < min(h.confidence for h in ranked[:2])


def test_llm_explanations_are_kept_measured_evidence_untouched(index):
    cands = candidates()
    ranked = constrain_ranking(
        cands,
        {"order": [1, 0], "explanations": {"1": "softmax over the batch axis"}, "fixes": {"1": "use dim=-1"}},
        index,
    )
    assert ranked[0].explanation == "softmax over the batch axis" and ranked[0].suggested_fix == "use dim=-1"
    assert ranked[0].evidence == cands[1].evidence


@pytest.mark.parametrize("bad", [{}, {"order": "1,0"}, {"order": [7, 9]}, {"order": ["softmax"]}])
def test_unusable_rankings_are_rejected(index, bad):
    with pytest.raises(ValueError):
        constrain_ranking(candidates(), bad, index)


def test_deterministic_policy():
    p = DeterministicPolicy()
    assert p.read_issue("anything", REPRO) == scenario()
    with pytest.raises(ScenarioError):
        p.read_issue("anything", "[model]\narch = 'llama'\n")
    assert p.read_issue("it is broken", None) is None
    assert p.order_triggers(scenario(), {}, NAMES) == []
    cands = candidates()
    cands[2] = replace(cands[2], verified=True)
    assert [h.function for h in p.rank(cands, {})] == ["Attention.forward", "rotate", "softmax"]
    assert p.fallbacks == []


def test_small_pure_helpers():
    assert variant_name(("batch", "a batch")) == ("batch", "a batch")
    assert variant_name("batch: a batch") == ("batch", "a batch")
    assert valid_order({"order": ["nope", "sampling", "batch", "sampling"]}, ["batch", "sampling"]) == [
        "sampling",
        "batch",
    ]
    assert [
        h.verified for h in measurement_first([replace(h, verified=i == 2) for i, h in enumerate(candidates())])
    ] == [True, False, False]


def test_llm_policy_orders_triggers_and_ranks():
    def script(req):
        return {
            "order_triggers": answer({"order": ["prefix_caching", "zzz"], "reason": "cache"}),
            "rank": answer({"order": [1, 0, 2], "explanations": {"1": "axis"}}),
        }[task_of(req)]

    with ScriptedLLM(script) as server:
        p = policy(server)
        assert p.order_triggers(scenario(), {}, NAMES) == ["prefix_caching"]
        assert [h.function for h in p.rank(candidates(), {})] == ["softmax", "rotate", "Attention.forward"]
    assert p.fallbacks == []
    prompt = server.requests[0]["messages"][1]["content"]
    assert "prefix_caching: prefix caching on" in prompt and "greedy output changes" in prompt


def test_repro_is_authoritative_the_llm_is_not_asked():
    with ScriptedLLM([answer({"model": {"arch": "gemma2"}})]) as server:
        assert policy(server).read_issue("model: gemma2 please", REPRO) == scenario()
    assert server.requests == []


def test_llm_fills_gaps_of_the_rules_reading():
    issue = "Using transformers with model meta-llama/Llama-3-8B, the greeting Hello there gives garbage."
    with ScriptedLLM(
        [
            answer(
                {
                    "target": {"dtype": "bfloat16"},
                    "model": {"arch": "qwen2"},
                    "workload": {"requests": [{"prompt": "Hello there", "max_tokens": 8}]},
                }
            )
        ]
    ) as server:
        sc = policy(server).read_issue(issue, None)
    assert sc.target.dtype == "bfloat16"
    assert sc.model["arch"] == "llama"  # the rules' value stays
    assert sc.requests[0].prompt == "Hello there"
    assert '"Using transformers' in server.requests[0]["messages"][1]["content"]  # quoted as a JSON string


@pytest.mark.parametrize(
    "reply,reason",
    [
        (slow(2.0), "timeout"),
        (garbage(), "malformed"),
        (status(429, retry_after=0), "rate_limit"),
        (answer({"order": ["not-a-variant"]}), "invalid_answer"),
    ],
)
def test_failures_retry_once_then_fall_back_and_are_recorded(reply, reason):
    with ScriptedLLM([reply]) as server:
        p = policy(server, timeout_s=0.3, retries=0)
        assert p.order_triggers(scenario(), {}, NAMES) == []  # the deterministic answer
        assert [h.function for h in p.rank(candidates(), {})] == ["rotate", "softmax", "Attention.forward"]
    assert [(f["step"], f["reason"], f["attempts"]) for f in p.fallbacks] == [
        ("order_triggers", reason, 2),
        ("rank", reason, 2),
    ]
    assert len(server.requests) == 4


def test_recovers_when_the_retry_succeeds():
    with ScriptedLLM([garbage(), answer({"order": ["sampling"]})]) as server:
        p = policy(server)
        assert p.order_triggers(scenario(), {}, NAMES) == ["sampling"]
    assert p.fallbacks == []
