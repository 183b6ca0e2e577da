"""A class's own statements (dataclass field defaults) as a candidate, restored apart from its methods.

The commit changes a field default and, harmlessly, a method of the same class in a copy of the bundled
subject (a real git repo); the probes are real engine runs on a tiny seeded model.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.faults_tinyserve import tree_at_base
from tests.tools.hypotheses.test_helper_credit import diagnose
from tools.hypotheses.evidence import Culprit, Hypothesis
from tools.hypotheses.gather import culprit_functions
from tools.hypotheses.moved import class_statements, class_statements_restored
from tools.source.index import open_index

PARAMS = "tinyserve/sampling_params.py"
OLD = '''@dataclass
class P:
    """Doc."""
    a: int = 0                # off
    b: float = 1.0

    def f(self):
        return self.a
'''
NOW = OLD.replace("int = 0 ", "int = 50").replace("return self.a", "return self.a + 0")


def test_class_statements_restored_takes_the_old_fields_and_keeps_the_current_methods():
    restored = class_statements_restored(NOW, OLD)
    assert restored == OLD.replace("return self.a", "return self.a + 0")
    assert class_statements(NOW) != class_statements(OLD)
    assert class_statements(restored) == class_statements(OLD)

    def indented(text: str) -> str:  # a class inside a class
        return "".join(f"    {line}" if line.strip() else line for line in text.splitlines(keepends=True))

    assert class_statements_restored(indented(NOW), OLD) == indented(restored)
    assert class_statements_restored("def f():\n    pass\n", OLD) is None  # not a class


def commit(repo, old: str, new: str) -> str:
    path = repo / PARAMS
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "defaults"], cwd=repo, check=True
    )
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def committed(tmp_path):
    """A copy of the subject where one commit changes a field default, then two edit a method. -> (repo, shas)"""
    repo = tree_at_base(tmp_path / "repo", None)
    first = commit(repo, "repetition_penalty: float = 1.0 ", "repetition_penalty: float = 3.0 ")
    commit(repo, "self.stop = [self.stop]", "self.stop = [str(self.stop)]")
    return repo, first, commit(repo, "[str(self.stop)]", "[str(self.stop)] if self.stop else []")


def test_a_commit_that_changes_a_field_default_makes_its_class_a_candidate_and_one_that_edits_a_method_does_not(
    tmp_path,
):
    repo, first, last = committed(tmp_path)
    for sha, expected in ((first, {"SamplingParams"}), (last, {"SamplingParams.__post_init__"})):
        touched = culprit_functions(repo, open_index(repo), Culprit(sha, "", "", ""))
        assert {s.qualname for s, _, _ in touched} == expected


@pytest.mark.slow
def test_a_class_whose_field_default_changed_is_verified_by_restoring_its_fields_apart_from_its_methods(tmp_path):
    """Regression (held-out D case: nothing verified): a commit changes a dataclass field default, later
    ones a method of the same class. Restoring the class's fields, its methods as they are now, removes
    the divergence; restoring the method does not."""
    repo, first, last = committed(tmp_path)
    method = Hypothesis(PARAMS, "SamplingParams.__post_init__", last, "sampling", 0.3, "", [], score=2.0)
    cls = Hypothesis(PARAMS, "SamplingParams", first, "sampling", 0.3, "", [], score=1.0)
    ranked = diagnose(repo, [method, cls])
    assert ranked[0] is cls and cls.verified and cls.verified_by == "restore"
    assert "+    repetition_penalty: float = 1.0" in cls.verifying_diff
    assert "if self.stop else []" not in cls.verifying_diff  # its methods stay as they are now
    assert not method.verified
