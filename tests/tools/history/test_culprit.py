"""Commit bisection on a real tinyserve history with a crashing, a hanging and a flaky commit.

The probe is the oracle (real engine processes); the built repo plays the user's checkout,
which must be byte-for-byte unchanged afterwards.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import tomli_w

from benchmark.author import Step, write_patches
from benchmark.build import build_case_repo
from tools.history.culprit import find_culprit
from tools.hypotheses.evidence import Reproduction
from tools.probe.prober import Prober
from tools.scenario import from_dict

INIT = "tinyserve/__init__.py"
ROPE = "tinyserve/layers/rotary_embedding.py"
README = "README.md"
VERSION = '__version__ = "0.1.0"\n'
EXPONENT = "torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim"
FLAKY = '''
import os as _os


def _first_run_is_off() -> bool:
    """Test fixture: the first process that imports this tree computes slightly wrong frequencies."""
    path = _os.environ.get("DIFFDX_TEST_FLAKY_COUNTER")
    if not path:
        return False
    n = int(open(path).read() or 0) if _os.path.exists(path) else 0
    open(path, "w").write(str(n + 1))
    return n == 0


_OFF = 1.02 if _first_run_is_off() else 1.0
'''
SCENARIO = {
    "model": {"arch": "llama", "seed": 0},
    "target": {"engine": "tinyserve", "dtype": "float32"},
    "workload": {"requests": [{"prompt_ids": list(range(5, 25)), "max_tokens": 4, "sampling": {"ignore_eos": True}}]},
}


def step(n: int, message: str, edits) -> Step:
    return Step(message, "Ana Ruiz <ana@example.com>", f"2025-06-{n:02d}T10:00:00+00:00", edits)


def build(tmp_path: Path, steps: list[Step]) -> Path:
    case = tmp_path / "fault"
    case.mkdir()
    (case / "case.toml").write_text(
        tomli_w.dumps(
            {
                "id": "fault",
                "issue_number": 1,
                "subject": "tinyserve",
                "category": "positional-encoding",
                "modeled_on": [],
                "title": "t",
            }
        )
    )
    (case / "issue.md").write_text("outputs differ\n")
    (case / "repro.toml").write_text(tomli_w.dumps({**SCENARIO, "good_ref": "base"}))
    (case / "truth.toml").write_text(
        tomli_w.dumps(
            {"file": ROPE, "function": "_base_inv_freq", "commit": "04-bug", "component": "rotary", "mechanism": "m"}
        )
    )
    write_patches("tinyserve", steps, case)
    return build_case_repo(case, tmp_path / "repo")


def snapshot(repo: Path) -> str:
    """Hash of every file under the checkout, .git included, plus the stash list."""
    h = hashlib.sha256()
    for p in sorted(repo.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(repo)).encode() + p.read_bytes())
    h.update(subprocess.run(["git", "stash", "list"], cwd=repo, capture_output=True).stdout)
    return h.hexdigest()


def test_bisection_skips_crashing_and_hanging_commits(tmp_path):
    steps = [
        step(1, "docs: a note", [(README, "# tinyserve\n", "# tinyserve\n\nNote.\n")]),
        step(2, "init: check the environment", [(INIT, VERSION, VERSION + 'raise ImportError("half-done")\n')]),
        step(3, "init: finish the check", [(INIT, VERSION + 'raise ImportError("half-done")\n', VERSION)]),
        Step(
            "rotary: float exponents",
            "Bo Li <bo@example.com>",
            "2025-06-04T10:00:00+00:00",
            [(ROPE, EXPONENT, "torch.arange(0, dim, 2, dtype=torch.float) / (dim - 2)")],
            slug="bug",
        ),
        step(5, "init: warm caches", [(INIT, VERSION, VERSION + "import time\ntime.sleep(3600)\n")]),
        step(6, "init: warm caches lazily", [(INIT, VERSION + "import time\ntime.sleep(3600)\n", VERSION)]),
        step(7, "docs: another note", [(README, "Note.\n", "Notes.\n")]),
    ]
    repo = build(tmp_path, steps)
    (repo / "scratch.txt").write_text("uncommitted work\n")  # a dirty checkout stays dirty
    before = snapshot(repo)
    sc = from_dict(SCENARIO)
    prober = Prober()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    culprit = find_culprit(repo, "base", repro, prober, timeout_s=60)
    assert culprit is not None and culprit.subject == "rotary: float exponents"
    verdicts = dict(culprit.tested)
    assert "skip" in verdicts.values()
    assert snapshot(repo) == before


def test_flaky_engine_is_outvoted(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFDX_TEST_FLAKY_COUNTER", str(tmp_path / "counter"))
    rope_line = "def _base_inv_freq(base, dim: int) -> torch.Tensor:\n"
    steps = [
        step(1, "rotary: guard first-run state", [(ROPE, rope_line, FLAKY + "\n\n" + rope_line)]),
        step(2, "rotary: scale by the guard", [(ROPE, f"({EXPONENT}))", f"({EXPONENT})) * _OFF")]),
        step(3, "docs: a note", [(README, "# tinyserve\n", "# tinyserve\n\nNote.\n")]),
        Step(
            "rotary: float exponents",
            "Bo Li <bo@example.com>",
            "2025-06-04T10:00:00+00:00",
            [(ROPE, EXPONENT, "torch.arange(0, dim, 2, dtype=torch.float) / (dim - 2)")],
            slug="bug",
        ),
        step(5, "docs: another note", [(README, "Note.\n", "Notes.\n")]),
    ]
    repo = build(tmp_path, steps)
    sc = from_dict(SCENARIO)
    prober = Prober()
    (tmp_path / "counter").write_text("1")  # HEAD's probe is a clean run
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    (tmp_path / "counter").write_text("0")  # the next target run is off
    culprit = find_culprit(repo, "base", repro, prober, votes=3)
    assert culprit.subject == "rotary: float exponents"
