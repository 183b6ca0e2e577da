"""`--llm openai` against a real model: SmolLM2-135M-Instruct behind llama.cpp's OpenAI-compatible
server (tests/agent/llama_server.py), end to end through agent.run and agent.triage (issue #17).

The model is weak and most of its answers are unusable. What is checked is what diffdx does with
them: the run completes; the model was really asked (the server's access log agrees with the
report's cost); an unusable answer becomes a recorded fallback, never a crash; and measurements
outrank the model: the top hypothesis is the no-LLM run's.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.llama_server import LlamaServer, why_unavailable
from tools.report import check_report

ROOT = Path(__file__).resolve().parents[2]
QUICK_CASE = 1212  # a bundled case that diagnoses in few engine runs; its answer is not used here
ANSWER_TOKENS = 48  # enough for a short JSON answer; keeps a rambling 135M model cheap
FALLBACK_REASONS = {"malformed", "invalid_answer", "timeout", "budget", "error"}

pytestmark = pytest.mark.skipif(why_unavailable() is not None, reason=str(why_unavailable()))


def cli(module: str, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)


def diagnose(case: int, out: Path, llm: str, config: Path | None = None, env: dict | None = None) -> dict:
    args = ["--issue", str(case), "--llm", llm, "--quiet", "--out", str(out)]
    proc = cli("agent.run", args + (["--config", str(config)] if config else []), env)
    assert proc.returncode == 1, proc.stderr[-3000:]  # 1: diagnosed
    report = json.loads((out / "report.json").read_text())
    assert check_report(report) == [] and report["reproduced"] and report["hypotheses"]
    return report


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    """The GGUF's own chat template (SmolLM2's ChatML, tools ignored): answers are plain text."""
    with LlamaServer(log=tmp_path_factory.mktemp("smollm") / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def smollm_tools(tmp_path_factory):
    """ChatML with llama-cpp-python's grammar-constrained tool calls: the native tool path."""
    log = tmp_path_factory.mktemp("smollm-tools") / "server.log"
    with LlamaServer(chat_format="chatml-function-calling", log=log) as server:
        yield server


def assert_llm_was_used(report: dict, server: LlamaServer, before: int) -> None:
    """The report's cost is what the server saw: every request answered, tokens counted."""
    served = server.chat_requests()[before:]
    cost = report["cost"]
    assert cost["llm_calls"] == len(served) > 0 and set(served) == {200}, (cost, served, server.log_tail())
    assert cost["tokens_in"] > 0 and cost["tokens_out"] > 0
    assert report["llm"] == "openai" and report["model"] == server.client_env()["DIFFDX_LLM_MODEL"]


def assert_fallbacks_recorded(report: dict) -> None:
    for f in report["llm_fallbacks"]:
        assert f["step"] in ("read_issue", "order_triggers", "rank", "propose_patch"), f
        assert f["reason"] in FALLBACK_REASONS and f["detail"] and f["attempts"] >= 1, f


def test_agent_run_with_a_real_weak_llm_keeps_the_measured_diagnosis(smollm, tmp_path):
    baseline = diagnose(QUICK_CASE, tmp_path / "none", "none")
    (tmp_path / "run.toml").write_text(f"llm_answer_tokens = {ANSWER_TOKENS}\nllm_retries = 0\n")
    before = len(smollm.chat_requests())
    report = diagnose(QUICK_CASE, tmp_path / "llm", "openai", tmp_path / "run.toml", smollm.client_env())
    assert_llm_was_used(report, smollm, before)
    # 48 tokens cannot hold a ranking with explanations: the weak model's answers are cut or chatter,
    # and each one the policy could not use is recorded, the rules' answer taken instead
    assert report["llm_fallbacks"], "SmolLM2 answered every step usably in 48 tokens: check the prompts reached it"
    assert_fallbacks_recorded(report)
    top, base_top = report["hypotheses"][0], baseline["hypotheses"][0]
    assert (top["file"], top["function"], top["verified"]) == (base_top["file"], base_top["function"], True)
    assert [h["function"] for h in report["hypotheses"] if h["verified"]] == [
        h["function"] for h in baseline["hypotheses"] if h["verified"]
    ]
    args = json.loads((tmp_path / "llm" / "args.json").read_text())
    assert args["config"]["llm_answer_tokens"] == ANSWER_TOKENS  # the run's record says how it was asked
    assert args["config"]["endpoint"] == {"base_url": smollm.url}


@pytest.mark.slow
def test_agent_run_survives_a_tool_calling_server(smollm_tools, tmp_path):
    """The same run against chatml-function-calling: tool rounds, then answers that still fall back."""
    baseline = diagnose(QUICK_CASE, tmp_path / "none", "none")
    (tmp_path / "run.toml").write_text(f"llm_answer_tokens = {ANSWER_TOKENS}\nllm_retries = 0\nmax_llm_calls = 12\n")
    before = len(smollm_tools.chat_requests())
    report = diagnose(QUICK_CASE, tmp_path / "llm", "openai", tmp_path / "run.toml", smollm_tools.client_env())
    assert_llm_was_used(report, smollm_tools, before)
    assert_fallbacks_recorded(report)
    assert report["hypotheses"][0]["function"] == baseline["hypotheses"][0]["function"]


@pytest.mark.slow
def test_native_tool_calls_from_a_real_model_go_through_the_toolbox(smollm_tools, tmp_path, monkeypatch):
    """chatml-function-calling constrains the model's first tokens to a tool name or "message:",
    so the model really calls the read-only tools; the verified candidate stays first whatever
    it answers."""
    from dataclasses import replace

    from agent.llm import OpenAIChat, SourceTools
    from agent.policies import LLMPolicy
    from tests.agent.helpers import candidates, make_repo

    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    tools = SourceTools(make_repo(tmp_path))
    model = smollm_tools.client_env()["DIFFDX_LLM_MODEL"]
    llm = OpenAIChat(
        model=model, base_url=smollm_tools.url, timeout_s=600, answer_tokens=ANSWER_TOKENS, max_tool_rounds=2
    )
    policy = LLMPolicy(llm, lambda: tools, "Attention output differs from the reference after an upgrade.")
    cands = candidates()
    cands[1] = replace(cands[1], verified=True)
    before = len(smollm_tools.chat_requests())
    ranked = policy.rank(cands, {})
    assert tools.log, smollm_tools.log_tail()  # native tool calls ran SourceTools
    assert all(name in SourceTools.NAMES for name, _ in tools.log)
    assert llm.usage.calls == len(smollm_tools.chat_requests()) - before > 0
    assert (ranked[0].function, ranked[0].verified) == ("softmax", True)
    assert_fallbacks_recorded({"llm_fallbacks": policy.fallbacks})


def real_issues(n: int) -> list[dict]:
    """The n shortest issues of the real set's dev split (short: cheap prompts for a CPU model)."""
    from benchmark.triage_eval import REAL, load_issues

    dev = [i for i in load_issues(REAL) if i["split"] == "dev"]
    return sorted(dev, key=lambda i: len(i["title"]) + len(i["body"]))[:n]


@pytest.mark.slow
def test_triage_classify_with_a_real_weak_llm(smollm, tmp_path):
    from agent.triage_llm import FLIP_BELOW, LLM_MIN

    issues = real_issues(3)
    lines = "".join(json.dumps({"title": i["title"], "body": i["body"]}) + "\n" for i in issues)
    (tmp_path / "issues.jsonl").write_text(lines)
    rules = cli("agent.triage", ["classify", str(tmp_path / "issues.jsonl")])
    before = len(smollm.chat_requests())
    env = {**smollm.client_env(), "DIFFDX_LLM_ANSWER_TOKENS": str(ANSWER_TOKENS)}
    helped = cli("agent.triage", ["classify", str(tmp_path / "issues.jsonl"), "--llm", "openai"], env)
    assert rules.returncode == helped.returncode == 0, helped.stderr[-2000:]
    assert smollm.chat_requests()[before:] == [200] * len(issues)  # one vote asked per issue
    for base, out in zip(map(json.loads, rules.stdout.splitlines()), map(json.loads, helped.stdout.splitlines())):
        if "llm" not in out:  # an unusable vote: the rules' answer stands, unchanged
            assert out == base
        elif out["label"] != base["label"]:  # the vote may flip only an unsure label, and only when sure
            assert base["confidence"] < FLIP_BELOW and out["llm"]["confidence"] >= LLM_MIN
