"""Credit between a restored caller and the helpers its commit created, on real tinyserve trees.

Each test commits a change to a copy of the bundled subject (a real git repo) that moves code out of
a function into new helpers; every probe is a real engine run on a tiny seeded model. Restoring the
caller drops the calls, so it removes a fault in either: these tests pin down who gets the credit.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.faults_tinyserve import tree_at_base
from tools.hypotheses.evidence import Hypothesis, Reproduction
from tools.hypotheses.moved import backward_slice, function_node, inline_version, same_def
from tools.hypotheses.verify import passthrough_version, verify
from tools.probe.prober import Prober
from tools.scenario import from_dict

ACT = "tinyserve/ops/activation.py"
slow = pytest.mark.slow

CALLER = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]; writes silu(gate) into a fresh buffer then multiplies in place
    d = x.shape[-1] // 2
    out = F.silu(x[..., :d])
    return out.mul_(x[..., d:])
"""

# The commit moves the gate's activation into a helper; the caller binds its result to `out`, the
# name its old version assigned, from `x`, the only local that old code read.
MOVED_CALLER = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    d = x.shape[-1] // 2
    out = _activated_gate(x)
    return out.mul_({up})
"""
HELPER = '''

def _activated_gate(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> [T, I]: the activation of the gate half."""
    return {body}
'''


def scenario():
    reqs = [{"prompt_ids": list(range(3, 15)), "max_tokens": 3, "sampling": {"ignore_eos": True}}]
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "tinyserve", "dtype": "float32"},
            "workload": {"requests": reqs},
        }
    )


def commit(repo: Path, file: str, old: str, new: str, appended: str = "") -> str:
    path = repo / file
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new) + appended)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "refactor"], cwd=repo, check=True
    )
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def suspect(function: str, sha: str, score: float) -> Hypothesis:
    return Hypothesis(ACT, function, sha, "numerics", 0.3, "", ["changed by the culprit commit"], score=score)


def diagnose(repo: Path, cands: list[Hypothesis]) -> list[Hypothesis]:
    prober, sc = Prober(), scenario()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged
    return verify(repo, cands, repro, prober, None)


def test_a_new_helper_whose_own_code_carries_the_change_takes_the_credit_from_its_restored_caller(tmp_path):
    """Regression (the caller was credited): a commit moves a computation out of a function into a
    new value-returning helper and gets it wrong there. Restoring the caller removes the divergence,
    the helper has no earlier version and no template repairs it; with the caller kept as it is and the
    helper's body made the caller's old inline code, the divergence vanishes: the helper is at fault."""
    repo = tree_at_base(tmp_path / "repo", None)
    sha = commit(
        repo,
        ACT,
        CALLER,
        MOVED_CALLER.format(up="x[..., d:]"),
        HELPER.format(body="F.gelu(x[..., : x.shape[-1] // 2])"),
    )
    caller, helper = suspect("silu_and_mul", sha, 2.0), suspect("_activated_gate", sha, 1.0)
    ranked = diagnose(repo, [caller, helper])
    assert ranked[0] is helper and helper.verified and helper.verified_by == "restore"
    assert "computed it with before" in helper.evidence[0] and "silu_and_mul kept as it is now" in helper.evidence[0]
    assert "+    out = F.silu(x[..., :d])" in helper.verifying_diff
    assert not caller.verified and "credited to the callee" in caller.evidence[0]


@slow
def test_a_caller_whose_own_change_carries_the_fault_keeps_the_credit_from_its_correct_new_helper(tmp_path):
    """The other side of the rule: the helper computes what the caller's old code did (written
    differently), and the caller's own change multiplies by the wrong half. The helper given the old
    inline code leaves the divergence, so the restored caller keeps the credit."""
    repo = tree_at_base(tmp_path / "repo", None)
    sha = commit(
        repo,
        ACT,
        CALLER,
        MOVED_CALLER.format(up="x[..., :d]"),
        HELPER.format(body="F.silu(x[..., : x.shape[-1] // 2])"),
    )
    caller, helper = suspect("silu_and_mul", sha, 2.0), suspect("_activated_gate", sha, 1.0)
    ranked = diagnose(repo, [caller, helper])
    assert ranked[0] is caller and caller.verified and caller.verified_by == "restore"
    assert not helper.verified
    assert any("leaves the divergence: the caller's own change carries it" in e for e in helper.evidence)


# A commit pads the rows to a multiple of 8 (a new count helper and a new pass-through padder) and
# slices the padding off after; the padder puts the rows in front, so the slice keeps the wrong ones.
PADDED_CALLER = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]; writes silu(gate) into a fresh buffer then multiplies in place
    t = x.shape[0]
    x = _pad_rows(x, _rows_to_pad(x))
    d = x.shape[-1] // 2
    out = F.silu(x[..., :d])
    return out.mul_(x[..., d:])[:t]
"""
PADDING = '''

def _rows_to_pad(x: torch.Tensor) -> int:
    """Rows that bring x to a multiple of 8."""
    return (-x.shape[0]) % 8


def _pad_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [T, F] with n rows of zeros added."""
    if n == 0:
        return x
    return torch.cat([x.new_zeros((n, *x.shape[1:])), x])
'''


@slow
def test_a_template_edit_that_masks_the_fault_by_skipping_it_does_not_outrank_a_restore_like_counterfactual(
    tmp_path,
):
    """Regression (a count helper was credited by a template edit that makes it zero, which skips the
    faulty padder it sizes): the restored caller's new callees are each first given their restore-like
    counterfactual (the padder's own do-nothing path, as before it existed), and templates only after."""
    repo = tree_at_base(tmp_path / "repo", None)
    sha = commit(repo, ACT, CALLER, PADDED_CALLER, PADDING)
    caller = suspect("silu_and_mul", sha, 3.0)
    count, padder = suspect("_rows_to_pad", sha, 2.0), suspect("_pad_rows", sha, 1.0)
    ranked = diagnose(repo, [caller, count, padder])
    assert ranked[0] is padder and padder.verified and padder.verified_by == "restore"
    assert "a pass-through of its inputs (as before that commit)" in padder.evidence[0]
    assert "+    return x" in padder.verifying_diff
    assert not count.verified and not caller.verified


def test_inline_version_rebuilds_a_helper_from_its_caller_s_old_code_only_where_it_corresponds():
    old = "def f(x, eps):\n    xf = x.float()\n    y = xf * 2\n    inv = (y + eps).rsqrt()\n    return xf * inv\n"
    now = "def f(x, eps):\n    inv = _inv(x, eps)\n    return x.float() * inv\n"
    helper = 'def _inv(a, e):\n    """Doc."""\n    return (a * 2 + e).rsqrt()\n'
    rebuilt = inline_version(helper, now, old, "_inv")
    assert rebuilt == (
        'def _inv(a, e):\n    """Doc."""\n    eps, x = e, a\n    xf = x.float()\n    y = xf * 2\n'
        "    inv = (y + eps).rsqrt()\n    return inv\n"
    )
    assert not same_def(rebuilt, helper) and same_def(rebuilt, rebuilt.replace('"""Doc."""', '"""Other."""'))
    # the helper is not handed `eps`, a local the old code read: no correspondence
    assert inline_version(helper, now.replace("_inv(x, eps)", "_inv(x, 1e-6)"), old, "_inv") is None
    # the result is not bound to a name, or the name was assigned twice before: none either
    assert inline_version(helper, "def f(x, eps):\n    return x.float() * _inv(x, eps)\n", old, "_inv") is None
    assert inline_version(helper, now, old.replace("    return", "    inv = inv * 1\n    return"), "_inv") is None


def test_backward_slice_keeps_only_the_plain_assignments_a_value_depends_on():
    fn = function_node("def f(a, b):\n    u = a + 1\n    v = b * 2\n    w = u * 3\n    return w + v\n")
    assert fn is not None
    assert [s.lineno for s in backward_slice(fn.body, "w") or []] == [2, 4]
    looped = function_node("def f(a):\n    u = 0\n    for i in a:\n        u = u + i\n    w = u\n    return w\n")
    assert looped is not None and backward_slice(looped.body, "w") is None  # u comes out of a loop


def test_passthrough_version_takes_a_function_s_own_do_nothing_path():
    src = '    def pad(self, q, k, n):\n        """Doc."""\n        if n == 0:\n            return q, k\n        return f(q), f(k)\n'
    assert passthrough_version(src) == '    def pad(self, q, k, n):\n        """Doc."""\n        return (q, k)\n'
    assert passthrough_version("def g(x):\n    return x * 2\n") is None  # no path hands its input back
    assert passthrough_version("def g(x):\n    return x\n") is None  # nothing else to take away
    nested = "def g(x):\n    def h(y):\n        return y\n    return h(x) + 1\n"
    assert passthrough_version(nested) is None  # a nested function's return is not g's
