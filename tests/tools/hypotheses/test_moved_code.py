"""Code a commit moved unchanged is not new code (verify.is_new), on real git repos and tinyserve trees.

A function a commit created whose body is a function the old tree had (parameters renamed, a module
function made a method on its first parameter) ran before the commit: it has no absence to restore,
gets no template edit in place of its caller's restore and takes no credit from its restored caller.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.helpers import git
from tests.faults_tinyserve import short_greedy_scenario as scenario
from tests.faults_tinyserve import tree_at_base
from tools.hypotheses.evidence import Hypothesis, Reproduction
from tools.hypotheses.moved import same_def_renamed
from tools.hypotheses.verify import is_new, moved_from, restore_version, verify
from tools.probe.prober import Prober
from tools.source.index import open_index

ACT = "tinyserve/layers/activation.py"

FREE = '''

def _scaled(act, x, gain: float):
    """act's kernel on x, times gain."""
    y = act._kernel(x)
    return y * gain
'''
METHOD = '''
    def scaled(self, x, gain: float):
        """This kernel on x, times gain."""
        y = self._kernel(x)
        return y * gain
'''
OLD_FORWARD = "    def forward(self, x):\n        return self._kernel(x)\n"


def commit_edit(repo: Path, edits: list[tuple[str, str]], appended: str = "") -> str:
    path = repo / ACT
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) == 1
        text = text.replace(old, new)
    path.write_text(text + appended)
    git(repo, "commit", "-qam", "change")
    return git(repo, "rev-parse", "HEAD")


def moved_into_the_class(repo: Path, gain: str) -> str:
    """A first commit: forward calls the module function `_scaled`; a second moves it, unchanged, into
    the class as `scaled` (the module function deleted) and changes forward's call to pass `gain`."""
    commit_edit(repo, [(OLD_FORWARD, "    def forward(self, x):\n        return _scaled(self, x, 1.0)\n")], FREE)
    return commit_edit(
        repo,
        [
            (
                "    def forward(self, x):\n        return _scaled(self, x, 1.0)\n",
                OLD_FORWARD.replace("self._kernel(x)", f"self.scaled(x, {gain})") + METHOD,
            ),
            (FREE, ""),
        ],
    )


def suspect(function: str, sha: str, score: float) -> Hypothesis:
    return Hypothesis(ACT, function, sha, "numerics", 0.3, "", ["changed by the culprit commit"], score=score)


def test_same_def_renamed_takes_a_module_function_made_a_method_on_its_first_parameter():
    method = "    def scaled(self, x, gain: float):\n        y = self._kernel(x)\n        return y * gain\n"
    assert same_def_renamed(FREE.strip() + "\n", method) and same_def_renamed(method, FREE.strip() + "\n")
    other = "    def scaled(self, x, gain: float):\n        y = self._kernel(x)\n        return y / gain\n"
    assert not same_def_renamed(FREE.strip() + "\n", other)


def test_a_function_moved_unchanged_from_one_the_commit_deleted_is_not_new_code(tmp_path):
    repo = tree_at_base(tmp_path / "repo", None)
    sha = moved_into_the_class(repo, "0.5")
    moved, forward = suspect("GatedActivation.scaled", sha, 2), suspect("GatedActivation.forward", sha, 1)
    assert moved_from(repo, moved) == "_scaled" and not is_new(repo, moved)
    assert moved_from(repo, forward) is None and not is_new(repo, forward)  # it existed: its change is its own
    # a method added with a body the old tree never had is new code
    new_sha = commit_edit(repo, [(METHOD, METHOD.replace("return y * gain", "return y * gain * gain"))])
    changed = suspect("GatedActivation.scaled", new_sha, 2)
    assert moved_from(repo, changed) is None  # it existed before this commit: its change is its own
    squared = METHOD.replace("return y * gain", "return y * gain * gain")
    added = commit_edit(
        repo, [(squared, squared + METHOD.replace("def scaled", "def squared").replace("* gain", "* y"))]
    )
    assert is_new(repo, suspect("GatedActivation.squared", added, 1))


def test_a_restored_method_gets_back_the_module_function_it_called_at_module_level(tmp_path):
    repo = tree_at_base(tmp_path / "repo", None)
    sha = moved_into_the_class(repo, "0.5")
    old = open_index(repo, commit=f"{sha}^", include_tests=False, paths=(ACT,))
    before = next(s for s in old.find("GatedActivation.forward") if s.file == ACT)
    assert restore_version(repo, ACT, "GatedActivation.forward", old.read(before), old)
    text = (repo / ACT).read_text()
    compile(text, ACT, "exec")
    assert "\ndef _scaled(act, x, gain: float):" in text and "return _scaled(self, x, 1.0)" in text
    symbols = {s.qualname for s in open_index(repo, include_tests=False).symbols if s.file == ACT}
    assert "_scaled" in symbols and "GatedActivation._scaled" not in symbols


@pytest.mark.slow
def test_the_caller_of_a_function_moved_from_one_the_commit_deleted_keeps_the_credit(tmp_path):
    """Regression (fifth held-out set, rank 2): the commit moves a module function into a class as a
    method, unchanged, deletes the old one, and changes the argument its caller passes. The method was
    taken for new code: made a no-op or edited by a template, it 'verified' in place of its caller.
    Its code ran before the commit: the caller, restored with the module function it called, keeps it."""
    repo = tree_at_base(tmp_path / "repo", None)
    sha = moved_into_the_class(repo, "0.5")
    moved, forward = suspect("GatedActivation.scaled", sha, 2), suspect("GatedActivation.forward", sha, 1)
    prober, sc = Prober(), scenario()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged
    ranked = verify(repo, [moved, forward], repro, prober, None)
    assert ranked[0] is forward and forward.verified and forward.verified_by == "restore"
    assert not moved.verified
    assert any("_scaled's, which its caller GatedActivation.forward called before" in e for e in moved.evidence)
