"""The LLM's patch for a suspect, end to end: a scripted model speaking the real OpenAI protocol
proposes a unified diff; diffdx applies it in a scratch worktree of a real tinyserve tree (a
mask bug at base) and re-probes. The patch counts only when the probe confirms it."""

from __future__ import annotations

import difflib

import pytest

from agent.llm import OpenAIChat
from agent.nodes import Session, patch_suspects
from agent.policies import LLMPolicy
from agent.run import RunConfig
from tests.agent.scripted_llm import ScriptedLLM, answer, task_of
from tests.faults_tinyserve import ATTENTION_OPS, CAUSAL_STRICT, checkout_digest, tree_at_base
from tools.hypotheses.evidence import Hypothesis, Reproduction
from tools.probe.prober import Prober
from tools.scenario import from_dict
from tools.source.index import open_index


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A tree with the causal mask made strict, and its reproduction (probed once for all tests)."""
    repo = tree_at_base(tmp_path_factory.mktemp("patch") / "repo", CAUSAL_STRICT)
    reqs = [{"prompt_ids": list(range(3, 15)), "max_tokens": 3, "sampling": {"ignore_eos": True}}]
    sc = from_dict(
        {"model": {"arch": "llama", "seed": 0}, "target": {"engine": "tinyserve"}, "workload": {"requests": reqs}}
    )
    prober = Prober()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged
    return repo, prober, repro, open_index(repo, include_tests=False)


def diff_of(repo, old: str, new: str) -> str:
    """A unified diff of ATTENTION_OPS with `old` replaced by `new` (what a model would send)."""
    text = (repo / ATTENTION_OPS).read_text()
    after = text.replace(old, new)
    a, b = f"a/{ATTENTION_OPS}", f"b/{ATTENTION_OPS}"
    return "".join(difflib.unified_diff(text.splitlines(True), after.splitlines(True), a, b))


def diagnose_with(case, reply) -> tuple[Hypothesis, ScriptedLLM, int]:
    repo, prober, repro, index = case
    suspect = Hypothesis(ATTENTION_OPS, "_visible", None, "attention", 0.4, "", ["names the divergent component"])
    before, runs = checkout_digest(repo), prober.engine_runs
    with ScriptedLLM([reply]) as server:
        chat = OpenAIChat(model="scripted", base_url=server.url, api_key="sk-test", timeout_s=10, retry_wait_s=0.01)
        session = Session(RunConfig(llm="openai"), LLMPolicy(chat), prober, repo, repo)
        patch_suspects({"reproduction": repro, "index": index, "drill": None}, session, [suspect])
    assert checkout_digest(repo) == before  # the patch never touches the user's checkout
    return suspect, server, prober.engine_runs - runs


@pytest.mark.slow
def test_a_patch_that_removes_the_divergence_verifies_the_function(case):
    patch = diff_of(case[0], *CAUSAL_STRICT[::-1])
    h, server, runs = diagnose_with(case, answer({"patch": patch, "why": "a query must see itself"}))
    assert h.verified and h.verified_by == "llm-patch" and h.verifying_diff == patch
    assert h.evidence[0] == "verified: the LLM's patch removes the divergence (confirmed by the probe)"
    assert runs >= 1
    prompt = next(m["content"] for m in server.requests[0]["messages"] if m["role"] == "user")
    assert task_of(server.requests[0]) == "propose_patch"
    assert "mask = kv_pos < q_pos" in prompt and "first divergence at layers.0.attn.out" in prompt


def test_a_patch_that_does_not_apply_is_reported_and_nothing_runs(case):
    stale = diff_of(case[0], *CAUSAL_STRICT[::-1]).replace("kv_pos < q_pos", "kv_pos << q_pos")
    h, _, runs = diagnose_with(case, answer({"patch": stale, "why": "…"}))
    assert not h.verified and h.verified_by is None and runs == 0
    assert any(e.startswith("the LLM's patch for _visible was not tried: does not apply") for e in h.evidence)


def test_a_patch_that_applies_but_does_not_fix_is_refuted(case):
    window = ("        mask &= kv_pos > q_pos - sliding_window\n", "        mask &= kv_pos >= q_pos - sliding_window\n")
    h, _, runs = diagnose_with(case, answer({"patch": diff_of(case[0], *window), "why": "window off by one"}))
    assert not h.verified and runs >= 1  # no sliding window in this model: the edit changes nothing that runs
    assert "the LLM's patch for _visible applies but leaves the divergence" in h.evidence
