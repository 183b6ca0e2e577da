"""The triage pipeline end to end against a local GitHub-shaped server (real HTTP)."""

import pytest

from agent.triage import AgentDiagnoser, main
from tests.tools.fake_github import FakeGitHub

SILENT = {
    "number": 11,
    "updated_at": "2024-05-01T10:00:00Z",
    "title": "[Bug]: greedy output changes with prefix caching enabled",
    "body": "With `enable_prefix_caching=True` the second request returns a wrong answer, no error.\n\n"
    '```python\nllm = LLM(model="Qwen/Qwen2-0.5B-Instruct", enable_prefix_caching=True, block_size=16)\n'
    'out = llm.generate(prompt="The capital of France is", max_tokens=16, temperature=0)\n```\n'
    "vllm 0.5.4, worked in v0.5.3.",
}
CRASH = {
    "number": 12,
    "updated_at": "2024-05-01T10:00:00Z",
    "title": "Engine dies with CUDA error",
    "body": '```\nTraceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
    "RuntimeError: CUDA error: an illegal memory access was encountered\n```",
}
FEATURE = {
    "number": 13,
    "updated_at": "2024-05-01T10:00:00Z",
    "title": "[Feature]: support for Jamba",
    "body": "It would be nice to support the Jamba architecture.",
}
REPORT = {
    "issue": "11",
    "reproduced": True,
    "first_divergence": {"tap": "layers.0.attn.out", "step": 1, "requests": [1], "positions": [16, 17], "ratio": 412.0},
    "kernel": "paged_attention",
    "commit": {"sha": "0123456789abcdef", "subject": "Reuse cached blocks"},
    "hypotheses": [
        {
            "rank": 1,
            "file": "tinyserve/kv_cache.py",
            "function": "BlockManager.allocate",
            "commit": "0123456789abcdef",
            "category": "kv-cache",
            "confidence": 0.9,
            "verified": True,
            "explanation": "cached block table offset by one block",
            "evidence": ["ratio 412 from position 16 on"],
        }
    ],
    "cost": {"engine_runs": 3, "llm_calls": 0, "tokens_in": 0, "tokens_out": 0, "wall_s": 1.0},
}


class FixedDiagnoser:
    """Stands in for the agent until the lead wires the real one; records its calls."""

    def __init__(self, report=REPORT):
        self.report, self.calls = report, []

    def diagnose(self, issue, scenario):
        self.calls.append((issue["number"], scenario))
        return self.report


def run(fake, tmp_path, *flags, diagnoser=None):
    argv = ["--repo", fake.repo, "--api-url", fake.url, "--db", str(tmp_path / "state.sqlite"), *flags]
    return main(argv, diagnoser=diagnoser or FixedDiagnoser())


@pytest.fixture
def fake():
    with FakeGitHub([SILENT, CRASH, FEATURE]) as f:
        yield f


def test_post_and_label_once_per_revision(fake, tmp_path):
    diagnoser = FixedDiagnoser()
    assert run(fake, tmp_path, "--post", "--label", diagnoser=diagnoser) == 0
    assert list(fake.comments) == [11] and len(fake.comments[11]) == 1
    assert fake.labels == {11: ["silent-error"], 12: ["crash"], 13: ["feature request"]}
    number, scenario = diagnoser.calls[0]
    assert number == 11 and scenario.target.options["prefix_caching"] is True and scenario.good_ref == "v0.5.3"
    comment = fake.comments[11][0]["body"]
    assert "layers.0.attn.out" in comment and "BlockManager.allocate" in comment and "silent-error" in comment

    posts = len(fake.posted())
    assert run(fake, tmp_path, "--post", "--label", diagnoser=diagnoser) == 0
    assert len(fake.posted()) == posts and len(diagnoser.calls) == 1  # nothing new, no re-diagnosis


def test_edited_issue_gets_a_new_comment(fake, tmp_path):
    run(fake, tmp_path, "--post", "--label")
    fake.edit(11, body=SILENT["body"] + "\nAlso with block_size=32.", updated_at="2024-05-02T09:00:00Z")
    run(fake, tmp_path, "--post", "--label")
    assert len(fake.comments[11]) == 2 and fake.labels[11] == ["silent-error", "silent-error"]
    assert len(fake.comments.get(12, [])) == 0


def test_marker_on_github_prevents_a_duplicate_when_state_is_lost(fake, tmp_path):
    run(fake, tmp_path, "--post")
    (tmp_path / "state.sqlite").unlink()
    run(fake, tmp_path, "--post")
    assert len(fake.comments[11]) == 1


def test_dry_run_posts_nothing_and_prints_the_comment(fake, tmp_path, capsys):
    run(fake, tmp_path)
    assert fake.posted() == []
    out = capsys.readouterr().out
    assert "would comment on acme/engine#11" in out and "would label acme/engine#12: crash" in out


def test_rate_limited_post_is_retried(fake, tmp_path):
    fake.rate_limit_next = 1  # the first request (list issues) gets 429 Retry-After: 0
    assert run(fake, tmp_path, "--post", "--label") == 0
    assert len(fake.comments[11]) == 1


def test_missing_diagnoser_comments_without_a_diagnosis(fake, tmp_path):
    run(fake, tmp_path, "--post", "--issues", "11", diagnoser=AgentDiagnoser("agent.no_such_module:diagnose"))
    body = fake.comments[11][0]["body"]
    assert "No automatic diagnosis yet" in body and "First divergence" not in body


def test_unusable_scenario_lists_what_is_missing(tmp_path):
    vague = {"number": 5, "updated_at": "x", "title": "outputs are gibberish", "body": "no error, just garbage output"}
    with FakeGitHub([vague]) as fake:
        diagnoser = FixedDiagnoser()
        run(fake, tmp_path, "--post", diagnoser=diagnoser)
        assert diagnoser.calls == []
        body = fake.comments[5][0]["body"]
        assert "diffdx still needs:" in body and "the model: its Hugging Face id" in body
        assert "the exact prompt text" in body


def test_huge_body_is_truncated_and_said_so(tmp_path):
    huge = {
        "number": 7,
        "updated_at": "x",
        "title": "gibberish output, no error",
        "body": "the output is garbage. " + "x" * 50_000,
    }
    with FakeGitHub([huge]) as fake:
        run(fake, tmp_path, "--post")
        assert "read only the first 20000" in fake.comments[7][0]["body"]


def test_token_is_never_printed(fake, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_TOPSECRET")
    run(fake, tmp_path, "--post", "--label")
    out = capsys.readouterr()
    assert "ghp_TOPSECRET" not in out.out + out.err
    assert all(h.get("Authorization") == "Bearer ghp_TOPSECRET" for _, _, h in fake.requests)


def test_help_lists_the_commands_and_the_old_form_still_parses(capsys):
    from agent.triage import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    usage = capsys.readouterr().out
    assert "{classify,repo,serve}" in usage and "exit status: 0" in usage
    assert parse_args(["--repo", "a/b", "--issues", "1"]).command == "repo"  # no command: `repo`, as before
    assert parse_args(["repo", "--repo", "a/b", "--since", "2024-01-01"]).since == "2024-01-01"
    args = parse_args(["classify", "issues.jsonl", "--llm-model", "m"])
    assert (args.command, args.file, args.llm_model) == ("classify", "issues.jsonl", "m")


def test_a_silent_answer_is_posted_at_the_models_own_threshold_and_no_other():
    from agent.triage import MIN_CONFIDENCE, Reader, confident, plan_issue
    from tools.triage.model import classify as model_classify
    from tools.triage.model import silent_threshold

    class FixedAnswer(Reader):  # the posting rule is under test here, not the classifier
        def __init__(self, confidence: float):
            super().__init__()
            self.answer = {"label": "silent", "confidence": confidence, "cues": []}

        def classify(self, title, body):
            return dict(self.answer)

    m = silent_threshold()
    c = model_classify(SILENT["title"], SILENT["body"])
    assert c.label == "silent" and c.confidence >= m  # a silent answer of classify is always one posted on
    at, below = (plan_issue(SILENT, FixedAnswer(q), FixedDiagnoser()) for q in (m, round(m - 0.01, 3)))
    assert at.comment is not None and at.labels == ["silent-error"]
    assert below.comment is None and below.labels == []
    assert confident({"label": "crash", "confidence": MIN_CONFIDENCE})  # other labels: their own floor
    assert not confident({"label": "crash", "confidence": MIN_CONFIDENCE - 0.01})
