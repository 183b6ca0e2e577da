"""Localizing inside a release diff: a real git history of two "releases" of a small package in
which the second changes 60 functions, one of them wrongly, and moves a helper with another.

The oracle runs the package in a real subprocess from the tree under test (the way the prober
runs an engine with the tree first on PYTHONPATH) and says whether its output left the
reference; a crash is an EngineRunError, as for an engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools.engines.runner import EngineRunError
from tools.history.release_diff import MAX_RESTORES, RAN, is_release, localize
from tools.hypotheses.evidence import Culprit, Hypothesis, Reproduction

N_FUNCS = 60
REFERENCE = 2.0 * 3 + 1  # what the correct package prints


def release(version: str, bad: bool) -> dict[str, str]:
    """The package's files in one release; the second renames every function's constant (a refactor
    that changes nothing), breaks `scale` and moves `offset`'s helper under a new name."""
    const = "ONE" if not bad else "UNIT"
    funcs = "\n\n".join(f"def f{i}(x):\n    return x * {const} + {i} - {i}\n" for i in range(N_FUNCS))
    helper = "def _base():\n    return 1\n" if not bad else "def _base_value():\n    return 1\n"
    offset = "def offset():\n    return _base()\n" if not bad else "def offset():\n    return _base_value()\n"
    scale = "def scale(x):\n    return x * 3\n" if not bad else "def scale(x):\n    return x * 3.5\n"
    core = f"{const} = 1\n\n\n{helper}\n\n{offset}\n\n{scale}\n\n{funcs}"
    run = "from pkg.core import f7, offset, scale\n\n\ndef run():\n    return scale(f7(2.0)) + offset()\n"
    return {"pkg/__init__.py": f'__version__ = "{version}"\n', "pkg/core.py": core, "pkg/run.py": run}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "Release", "GIT_AUTHOR_EMAIL": "r@x", "GIT_COMMITTER_NAME": "Release"}
    env["GIT_COMMITTER_EMAIL"] = "r@x"
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def history(tmp_path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for version, bad in (("1.0", False), ("1.1", True)):
        for rel, text in release(version, bad).items():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"Release: v{version}")
    return repo


class PackageOracle:
    """prober-shaped: probe(scenario, tree) -> .diverged; counts runs like the prober."""

    def __init__(self):
        self.engine_runs = 0

    def probe(self, _scenario, tree: Path):
        self.engine_runs += 1
        code = "from pkg.run import run; print(run())"
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(tree)}
        )
        if proc.returncode != 0:
            raise EngineRunError(proc.stderr.strip().splitlines()[-1], "crash")
        return SimpleNamespace(diverged=float(proc.stdout) != REFERENCE)


def candidates(sha: str) -> list[Hypothesis]:
    """What the gather stage hands over for this release: every changed function with the release
    as its commit; those the failing run executed carry the coverage line, and component words give
    the helper-moving `offset` a higher score than the wrong `scale`."""
    ran = {"scale", "offset", "f7", "_base_value"}
    names = ["scale", "offset", "_base_value"] + [f"f{i}" for i in range(N_FUNCS)]
    out = []
    for name in names:
        evidence = [f"changed by culprit commit {sha[:10]}"] + ([RAN] if name in ran else [])
        score = 6.5 + (1.0 if name in ran else -4.0) + (2.0 if name == "offset" else 0.0)
        out.append(Hypothesis("pkg/core.py", name, sha, "numerics", 0.0, "", evidence, score=score))
    return out


def test_the_wrong_function_is_verified_within_the_restore_budget(history):
    sha = git(history, "rev-parse", "HEAD").strip()
    culprit = Culprit(sha, "Release: v1.1", "", "")
    cands = candidates(sha)
    assert is_release(cands, culprit)
    repro = Reproduction(True, scenario=SimpleNamespace(model=SimpleNamespace(arch="pkg")), probe=None)
    oracle = PackageOracle()
    ranked, narrowing = localize(history, cands, repro, oracle, culprit)
    assert (ranked[0].function, ranked[0].verified) == ("scale", True)
    assert narrowing.changed == N_FUNCS + 3 and narrowing.ran == 4
    assert 1 <= narrowing.restores <= MAX_RESTORES and oracle.engine_runs == narrowing.restores
    assert any(line.startswith("release diff: 63 functions changed, 4 ran") for line in ranked[0].evidence)
    offset = next(h for h in ranked if h.function == "offset")
    assert not offset.verified, "restoring offset alone cannot run (its helper moved): never verified"
    assert git(history, "status", "--porcelain") == "", "restores happen in temporary worktrees only"


def test_a_small_culprit_is_not_a_release(history):
    sha = git(history, "rev-parse", "HEAD").strip()
    assert not is_release(candidates(sha)[:10], Culprit(sha, "", "", ""))
    assert not is_release(candidates(sha), None)


def test_the_budget_caps_the_restores(history):
    sha = git(history, "rev-parse", "HEAD").strip()
    cands = [h for h in candidates(sha) if h.function not in ("scale",)]  # the cause is not among them
    repro = Reproduction(True, scenario=SimpleNamespace(model=SimpleNamespace(arch="pkg")), probe=None)
    oracle = PackageOracle()
    ranked, narrowing = localize(history, cands, repro, oracle, Culprit(sha, "", "", ""), budget=3)
    assert narrowing.restores <= 3 and not any(h.verified for h in ranked)


def two_releases(repo: Path, release) -> tuple[Path, str]:
    """A git repo whose two commits are releases 1.0 (good) and 1.1 (bad) of `release(bad)`'s files."""
    repo.mkdir()
    git(repo, "init", "-q")
    for version, bad in (("1.0", False), ("1.1", True)):
        for rel, text in release(bad).items():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"Release: v{version}")
    return repo, git(repo, "rev-parse", "HEAD").strip()


def changed_suspects(sha: str, ran: dict[str, float], component: str) -> list[Hypothesis]:
    """Every function of pkg/core.py as changed by the bad release; those in `ran` ran, with those scores."""
    names = [*ran] + [f"f{i}" for i in range(N_FUNCS) if i != 7]
    return [
        Hypothesis(
            "pkg/core.py",
            n,
            sha,
            component,
            0.0,
            "",
            [f"changed by {sha[:10]}"] + ([RAN] if n in ran else []),
            score=ran.get(n, 2.5),
        )
        for n in names
    ]


def coupled_release(bad: bool) -> dict[str, str]:
    """`scale` gains a parameter (and the bug) while its caller `apply` passes it; `offset` moves its
    helper: neither function restores alone, nor do all of them together, only the whole file or
    `scale` with its caller."""
    const, base = ("UNIT", "_base_value") if bad else ("ONE", "_base")
    scale = "def scale(x, k):\n    return x * k * 1.5\n" if bad else "def scale(x):\n    return x * 3\n"
    apply = "def apply(x):\n    return scale(x, 3)\n" if bad else "def apply(x):\n    return scale(x)\n"
    funcs = "\n\n".join(f"def f{i}(x):\n    return x * {const} + {i} - {i}\n" for i in range(N_FUNCS))
    core = f"{const} = 1\n\n\ndef {base}():\n    return 1\n\n\ndef offset():\n    return {base}()\n\n\n{scale}\n\n{apply}\n\n{funcs}"
    run = "from pkg.core import apply, f7, offset\n\n\ndef run():\n    return apply(f7(2.0)) + offset()\n"
    return {"pkg/__init__.py": "", "pkg/core.py": core, "pkg/run.py": run}


def test_functions_that_only_restore_together_are_found_by_their_call_neighbourhood(tmp_path):
    repo, sha = two_releases(tmp_path / "repo", coupled_release)
    ran = {"scale": 9.5, "apply": 7.5, "offset": 7.5, "f7": 7.5, "_base_value": 7.5}
    cands = changed_suspects(sha, ran, "numerics")
    repro = Reproduction(True, scenario=SimpleNamespace(model=SimpleNamespace(arch="pkg")), probe=None)
    oracle = PackageOracle()
    ranked, narrowing = localize(repo, cands, repro, oracle, Culprit(sha, "", "", ""))
    assert ranked[0].function == "scale"
    assert any("with the changed functions it calls or is called by (apply)" in e for e in ranked[0].evidence)
    assert narrowing.restores <= MAX_RESTORES


def refactor_release(bad: bool) -> dict[str, str]:
    """The shape of a real refactor release: `band` loses its `cfg` parameter (and, with it, the
    band) while its caller `prepare` stops passing it; the import only the old `band` used goes;
    `helper` moves below the others unchanged. Restoring `band` alone cannot run (the new caller
    does not pass `cfg`); restoring it with its caller needs the dropped import back; restoring
    the caller alone runs and still diverges."""
    const = "UNIT" if bad else "ONE"
    helper = "def helper(x):\n    return x + 0\n"
    if bad:
        imports = ""
        band = "def band(x, k, **kwargs):\n    return x * k\n"
        prepare = "def prepare(x):\n    return band(x, 3)\n"
    else:
        imports = "from operator import add\n\n\n"
        band = "def band(x, k, cfg):\n    return add(x * k, 1) if cfg else x * k\n"
        prepare = "def prepare(x):\n    return band(x, 3, cfg=True)\n"
    funcs = "\n\n".join(f"def f{i}(x):\n    return x * {const} + {i} - {i}\n" for i in range(N_FUNCS))
    defs = [band, prepare, funcs] + ([helper] if bad else [])
    core = f"{imports}{const} = 1\n\n\n" + ("" if bad else helper + "\n\n") + "\n\n".join(defs)
    run = "from pkg.core import f7, helper, prepare\n\n\ndef run():\n    return prepare(helper(f7(2.0)))\n"
    return {"pkg/__init__.py": "", "pkg/core.py": core, "pkg/run.py": run}


def test_a_refactored_signature_pair_is_attributed_by_group_testing(tmp_path):
    """Regression (rl-qwen2-swa-mask-dropped's shape): the file's restore isolated the bug, but no
    function restored alone and the pair with its caller could not run without the old module's
    import, so the culprit stayed at rank 3. Moved-only functions are no suspects either."""
    repo, sha = two_releases(tmp_path / "repo", refactor_release)
    ran = {"helper": 11.0, "prepare": 9.0, "band": 8.0, "f7": 7.5}
    cands = changed_suspects(sha, ran, "attention")
    repro = Reproduction(True, scenario=SimpleNamespace(model=SimpleNamespace(arch="pkg")), probe=None)
    oracle = PackageOracle()
    ranked, narrowing = localize(repo, cands, repro, oracle, Culprit(sha, "", "", ""))  # prints 7.0 when right
    assert narrowing.ran == 4 and narrowing.code_changed == 3, "helper only moved: not a suspect"
    assert ranked[0].function == "band"
    assert any(e.startswith("group test:") for e in ranked[0].evidence)
    assert narrowing.restores <= MAX_RESTORES
