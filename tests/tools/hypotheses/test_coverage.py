"""Function coverage per language (tools/hypotheses/coverage.py): on a tree that mixes Python with
C/C++, the record covers the Python only, and a native function is neither run nor unrun."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tools.history.release_diff import suspects
from tools.hypotheses.coverage import RAN, UNRECORDED, Coverage
from tools.hypotheses.evidence import Culprit, Hypothesis
from tools.hypotheses.gather import _add_recent_changes
from tools.source.index import open_index

PY = "def loads(x):\n    return x\n\n\ndef unused(x):\n    return x\n"
C = "float silu(float x) {\n    return x / (1.0f + expf(-x));\n}\n"


def commit_all(repo: Path, message: str) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", message], cwd=repo, check=True)


def test_recent_changes_keep_native_functions_the_python_record_cannot_see(tmp_path: Path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "model.py").write_text(PY)
    (tmp_path / "ops.c").write_text(C)
    commit_all(tmp_path, "base")
    (tmp_path / "model.py").write_text(PY.replace("return x", "return x + 0"))
    (tmp_path / "ops.c").write_text(C.replace("1.0f +", "1.0f -"))
    commit_all(tmp_path, "change all three")
    cands: dict = {}
    failing = Coverage(frozenset({"model.py:loads"}))  # the worker's record: Python only
    _add_recent_changes(cands, tmp_path, open_index(tmp_path, include_tests=False), failing)
    assert set(cands) == {("model.py", "loads"), ("ops.c", "silu")}  # `unused` did not run: left out
    assert RAN in cands[("model.py", "loads")].evidence
    native = cands[("ops.c", "silu")]
    assert UNRECORDED in native.evidence and native.kinds == {"recent", "coverage_unknown"}
    assert native.score == cands[("model.py", "loads")].score - 1.0  # no "ran" credit, no "not run" penalty


def test_the_release_localizer_keeps_unrecorded_suspects():
    def changed(function: str, file: str, line: str) -> Hypothesis:
        return Hypothesis(file, function, "r1", "numerics", 0.2, "", ["changed by culprit", line], score=6.0)

    ran, native = changed("loads", "model.py", RAN), changed("silu", "ops.c", UNRECORDED)
    unrun = changed("unused", "model.py", "changed by culprit")
    kept = suspects([ran, native, unrun], Culprit("r1", "release", "", ""), None)
    assert {h.function for h in kept} == {"loads", "silu"}
