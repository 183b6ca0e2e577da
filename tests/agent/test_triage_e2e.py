"""Triage end to end with the real diagnosis: a silent-error issue that attaches a reproducible
scenario for a bundled case's engine tree gets exactly one diagnosis comment; a crash and a
feature request are labelled; a second run posts nothing new."""

from __future__ import annotations

import pytest

from agent.triage import AgentDiagnoser, main
from benchmark.build import build_case_repo
from benchmark.cases import BUNDLED_CASES_DIR, load_case, load_truth
from tests.tools.fake_github import FakeGitHub

CASE = "ts-prefix-hash-chain"


@pytest.fixture(scope="module")
def case_repo(tmp_path_factory):
    folder = BUNDLED_CASES_DIR / CASE
    if not folder.exists():
        pytest.skip("case not bundled")
    case = load_case(folder)
    return case, build_case_repo(case, tmp_path_factory.mktemp("triage-e2e") / "repo")


def issues_for(case) -> list[dict]:
    repro = (case.dir / "repro.toml").read_text()
    silent = {
        "number": 21,
        "updated_at": "2026-11-01T10:00:00Z",
        "title": f"[Bug]: {case.title}",
        "body": f"{case.issue}\n\nRepro (diffdx scenario):\n\n```toml\n{repro}```\n",
    }
    crash = {
        "number": 22,
        "updated_at": "2026-11-01T10:00:00Z",
        "title": "Server dies on startup",
        "body": '```\nTraceback (most recent call last):\n  File "serve.py", line 9, in <module>\n'
        "RuntimeError: CUDA error: out of memory\n```",
    }
    feature = {
        "number": 23,
        "updated_at": "2026-11-01T10:00:00Z",
        "title": "[Feature]: support Phi-4",
        "body": "It would be nice to support the Phi-4 architecture.",
    }
    return [silent, crash, feature]


def test_triage_posts_one_real_diagnosis(case_repo, tmp_path, monkeypatch):
    case, repo = case_repo
    monkeypatch.setenv("DIFFDX_TARGET_SOURCE", str(repo))
    with FakeGitHub(issues_for(case)) as fake:
        argv = ["--repo", fake.repo, "--api-url", fake.url, "--db", str(tmp_path / "s.sqlite"), "--post", "--label"]
        assert main(argv, diagnoser=AgentDiagnoser()) == 0
        assert list(fake.comments) == [21] and len(fake.comments[21]) == 1
        assert fake.labels[22] == ["crash"] and fake.labels[23] == ["feature request"]
        comment = fake.comments[21][0]["body"]
        assert load_truth(case).function in comment
        posted = len(fake.posted())
        assert main(argv, diagnoser=AgentDiagnoser()) == 0
        assert len(fake.posted()) == posted
