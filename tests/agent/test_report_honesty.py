"""The report says what it found and what ran, and nothing more (issue 16).

The story of the issue, on real runs: an issue about prefix caching with a greedy repro, an
engine whose sampler is wrong (top-k keeps k + 1 tokens), and a trigger search that switches on
sampling. That divergence is real, but it is not the user's: the report must not say
"Reproduced." of it, must list it as a side finding, and must say exactly what ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.scripted_llm import ScriptedLLM, answer, task_of
from tests.faults import TOP_K_OFF_BY_ONE, buggy_tinyserve
from tools.probe.prober import Prober
from tools.report import build_report, check_report, render_markdown, what_ran
from tools.reproduce import reproduce, variants
from tools.scenario import loads

ROOT = Path(__file__).resolve().parents[2]
PREFIX_ISSUE = (
    "Greedy output changes when prefix caching is on: the second request that shares the "
    "prompt gets different tokens than when it runs alone."
)
TOP_K_ISSUE = "With top_k = 40 and temperature 0.8 the sampled tokens look wrong."
GREEDY = """
[model]
arch = "llama"
seed = 0

[target]
engine = "tinyserve"
dtype = "float32"

[[workload.requests]]
prompt_ids = [5, 17, 42, 99, 260, 301, 7, 8, 9, 10, 11]
max_tokens = 6
sampling = { ignore_eos = true }
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def top_k_tree(tmp_path_factory) -> Path:
    """A git repo holding tinyserve whose top-k keeps one token too many (a real sampler bug)."""
    tree = buggy_tinyserve(tmp_path_factory.mktemp("topk") / "repo", *TOP_K_OFF_BY_ONE)
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tinyserve")
    return tree


def _sampling_variant(scenario):
    """The trigger variant that switches on sampled requests (top-k among them)."""
    return next(v for v in variants(scenario) if "sampling" in [f.name for f in v.features])


@pytest.fixture(scope="module")
def searched(top_k_tree):
    """Trigger search as the agent runs it: the issue's text judges each divergence."""
    scenario, prober = loads(GREEDY), Prober()
    side = reproduce(
        scenario, prober, top_k_tree, budget_runs=6, order=[_sampling_variant(scenario).name], issue_text=PREFIX_ISSUE
    )
    return scenario, prober, side


def test_a_divergence_the_issue_does_not_describe_is_a_side_finding(searched):
    scenario, _, repro = searched
    assert repro.reproduced and not repro.on_issue  # diagnosable, but not the user's issue
    assert not repro.trials[0].diverged  # as given: the engines agree
    finding = repro.side_findings[0]
    assert finding.trigger == _sampling_variant(scenario).description
    assert "sampled requests" in finding.why and finding.first_divergence["tap"].startswith("sampler.")
    assert repro.trials[1].diverged and repro.trials[1].off_issue == finding.why


def test_the_report_does_not_call_a_side_finding_reproduced(searched):
    _, prober, repro = searched
    report = build_report(
        "16",
        repro,
        None,
        None,
        [],
        {"engine_runs": prober.engine_runs},
        {"ran": what_ran(prober.runs, prober.engine_runs, None)},
    )
    assert check_report(report) == []
    assert report["reproduced"] is False and report["diagnosis_of"] == "side finding"
    assert report["trigger"] is None and report["side_findings"][0]["why"] == repro.side_findings[0].why
    md = render_markdown(report)
    assert "**Reproduced.**" not in md and "**Not reproduced as reported.**" in md
    assert "## Other divergences found while searching" in md and "not as the issue describes" in md


def test_the_same_divergence_is_a_reproduction_when_the_issue_describes_it(searched, top_k_tree):
    scenario, prober, _ = searched
    repro = reproduce(
        scenario, prober, top_k_tree, budget_runs=6, order=[_sampling_variant(scenario).name], issue_text=TOP_K_ISSUE
    )
    assert repro.reproduced and repro.on_issue and repro.side_findings == []
    assert repro.trigger == _sampling_variant(scenario).description
    report = build_report("16", repro, None, None, [], {"engine_runs": prober.engine_runs})
    assert report["reproduced"] and report["diagnosis_of"] == "reported issue"
    assert "**Reproduced.**" in render_markdown(report)


def test_the_report_says_what_ran(searched, top_k_tree):
    _, prober, _ = searched
    ran = what_ran(prober.runs, prober.engine_runs, top_k_tree)
    assert ran["engine_runs"] == prober.engine_runs == ran["answered"] > 0 and ran["failed"] == 0
    assert ran["target"]["engines"] == ["tinyserve"] and ran["target"]["dtypes"] == ["float32"]
    assert ran["reference"]["engines"] == ["transformers"] and ran["reference"]["dtypes"] == ["float32", "float64"]
    assert ran["target"]["imported"] == [str(top_k_tree / "tinyserve" / "__init__.py")]
    assert ran["target_source"] == {
        "path": str(top_k_tree),
        "commit": git(top_k_tree, "rev-parse", "HEAD"),
        "dirty": False,
    }
    report = build_report("16", None, None, None, [], {"engine_runs": prober.engine_runs}, {"ran": ran})
    md = render_markdown(report)
    assert f"at commit `{ran['target_source']['commit'][:12]}`" in md and "imported from" in md


def test_no_agreement_is_claimed_from_zero_engine_runs(tmp_path):
    """Regression (issue 16): an issue diffdx could not read into a scenario ran nothing, and
    report.md said the engines "agree on every scenario tried"."""
    from agent.run import Inputs, RunConfig, diagnose

    report = diagnose(
        Inputs("0runs", "The output is wrong sometimes.", None, None, None), RunConfig(), tmp_path / "out"
    )
    assert report["cost"]["engine_runs"] == 0 and report["ran"]["answered"] == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "agree on" not in md and "**Not reproduced: nothing ran.**" in md


def test_failed_engine_runs_are_not_agreement(tmp_path):
    """Every run crashes (a tree whose tinyserve does not import): nothing is known about agreement."""
    broken = tmp_path / "broken"
    (broken / "tinyserve").mkdir(parents=True)
    (broken / "tinyserve" / "__init__.py").write_text("raise RuntimeError('half-installed build')\n")
    scenario, prober = loads(GREEDY), Prober()
    repro = reproduce(scenario, prober, broken, budget_runs=1, issue_text=PREFIX_ISSUE)
    assert not repro.reproduced and prober.engine_runs >= 1 and prober.runs == []
    report = build_report(
        "x",
        repro,
        None,
        None,
        [],
        {"engine_runs": prober.engine_runs},
        {"ran": what_ran(prober.runs, prober.engine_runs, broken)},
    )
    md = render_markdown(report)
    assert "agree on" not in md and "**Not reproduced: no engine run finished.**" in md
    assert report["ran"]["failed"] == prober.engine_runs and report["ran"]["target_source"]["commit"] is None


def sampling_first(req: dict):
    """A scripted model that puts the sampling variant first, as the issue's run did."""
    if task_of(req) == "order_triggers":
        return answer({"order": ["sampling", "batch"]})
    return answer({"order": [0, 1, 2, 3, 4]})


@pytest.mark.slow
def test_agent_run_exits_4_on_a_side_finding(top_k_tree, tmp_path):
    """End to end through the CLI: a side finding is diagnosed as such, never as the user's bug."""
    (tmp_path / "issue.md").write_text(PREFIX_ISSUE + "\n")
    (tmp_path / "repro.toml").write_text(GREEDY)
    (tmp_path / "run.toml").write_text("trigger_runs = 9\nverify_top = 1\nllm_retries = 0\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NO_PROXY": "127.0.0.1,localhost"}
    with ScriptedLLM(sampling_first) as server:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent.run",
                "--issue-file",
                str(tmp_path / "issue.md"),
                "--repro",
                str(tmp_path / "repro.toml"),
                "--target-source",
                str(top_k_tree),
                "--llm",
                "openai",
                "--model",
                "scripted",
                "--config",
                str(tmp_path / "run.toml"),
                "--out",
                str(tmp_path / "out"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=3000,
            env={**env, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-test"},
        )
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "not reproduced as reported" in proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["reproduced"] is False and report["diagnosis_of"] == "side finding"
    assert report["ran"]["engine_runs"] == report["cost"]["engine_runs"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "**Reproduced.**" not in md and "**Not reproduced as reported.**" in md
