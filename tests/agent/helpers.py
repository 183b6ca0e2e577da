"""Small real things the agent tests share: a git repo of a toy engine, and scripted stages.

`ScriptedStages` satisfies agent.nodes.Stages with canned stage outputs (the measuring
stages have their own tests under tests/tools); it counts engine runs on a real Prober
and records the calls it gets, so the graph's path and budget handling can be checked.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tools.hypotheses.evidence import Culprit, DrillDown, Hypothesis, Reproduction, Trial
from tools.scenario import loads

REPRO = """
good_ref = "HEAD~1"
[model]
arch = "llama"
seed = 0
hidden_size = 32
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 2
intermediate_size = 64
vocab_size = 128
[target]
engine = "transformers"
dtype = "float32"
[[workload.requests]]
prompt_ids = [1, 2, 3]
max_tokens = 4
"""

ENGINE_V1 = '''class Attention:
    """Paged attention over the KV cache."""

    def forward(self, q, k, v):
        return softmax(q @ k) @ v


def softmax(x):
    return x.softmax(-1)


def rotate(x, pos):
    """Rotary embedding."""
    return x
'''

ENGINE_V2 = ENGINE_V1.replace("x.softmax(-1)", "x.softmax(0)")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def make_repo(root: Path) -> Path:
    """A two-commit git repo: v1 of a toy engine, then a commit that breaks softmax."""
    repo = root / "engine-repo"
    (repo / "eng").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "eng" / "attn.py").write_text(ENGINE_V1)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "attention")
    (repo / "eng" / "attn.py").write_text(ENGINE_V2)
    git(repo, "commit", "-qam", "Normalize softmax over the other axis")
    return repo


def candidates() -> list[Hypothesis]:
    return [
        Hypothesis("eng/attn.py", "rotate", None, "positional-encoding", 0.5, "rotary", ["tap q_rot ok"], score=0.5),
        Hypothesis(
            "eng/attn.py",
            "softmax",
            "abc",
            "attention",
            0.8,
            "softmax axis",
            ["changed by the first bad commit", "attn.out diverges"],
            score=0.8,
        ),
        Hypothesis("eng/attn.py", "Attention.forward", None, "attention", 0.3, "caller", [], score=0.3),
    ]


class ScriptedStages:
    """Canned stage outputs; `reproduced`/`culprit` choose the branch the graph takes."""

    def __init__(
        self,
        reproduced: bool = True,
        culprit: bool = True,
        runs_per_stage: int = 3,
        verified: tuple[str, ...] = ("softmax",),
    ):
        self.reproduced, self.with_culprit, self.runs = reproduced, culprit, runs_per_stage
        self.verified = verified
        self.calls: list[str] = []
        self.orders: list[list[str] | None] = []

    def _spend(self, prober, name: str) -> None:
        self.calls.append(name)
        prober.engine_runs += self.runs

    def variant_names(self, scenario, target_source=None):
        return [("batch", "a batch of 4 requests"), ("prefix_caching", "prefix caching on")]

    def reproduce(self, scenario, prober, target_source, *, budget_runs, order, issue_text=None):
        self._spend(prober, "reproduce")
        self.orders.append(order)
        trials = [Trial("as given", False, "agree", 3)] + (
            [Trial("a batch of 4 requests", True, "diverges", 3)] if self.reproduced else []
        )
        return Reproduction(
            self.reproduced,
            scenario,
            None,
            trials,
            "a batch of 4 requests" if self.reproduced else None,
            "logic" if self.reproduced else None,
        )

    def drill_down(self, repro, prober, target_source):
        self._spend(prober, "drill_down")
        return DrillDown(
            "layers.0.attn.out", 0, "attention", "attention", {"requests": [1]}, ["only request 1 diverges"]
        )

    def find_culprit(self, repo, good_ref, repro, prober):
        self._spend(prober, "find_culprit")
        if not self.with_culprit:
            return None
        sha = git(repo, "rev-parse", "HEAD")
        return Culprit(sha, "Normalize softmax over the other axis", "found", "diff", [(sha, "bad")])

    def hypothesize(self, repo, index, repro, drill, culprit, prober):
        self.calls.append("hypothesize")
        return candidates()

    def verify(self, repo, cands, repro, prober, culprit, top):
        self._spend(prober, "verify")
        from dataclasses import replace

        return [replace(h, verified=h.function in self.verified) for h in cands]


def scenario():
    return loads(REPRO)
