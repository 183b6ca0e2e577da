"""Credit between a restored caller and the helpers its commit created, on real tinyserve trees.

Each test commits a change to a copy of the bundled subject (a real git repo) that moves code out of
a function into new helpers; every probe is a real engine run on a tiny seeded model. Restoring the
caller drops the calls, so it removes a fault in either: these tests pin down who gets the credit.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from tests.faults_tinyserve import short_greedy_scenario as scenario
from tests.faults_tinyserve import tree_at_base
from tools.hypotheses.evidence import Hypothesis, Reproduction
from tools.hypotheses.moved import (
    backward_slice,
    changed_statements,
    dropped_options,
    faithful_move,
    function_node,
    inline_version,
    kept_call_version,
    moved_statements,
    narrowed_arguments,
    only_its_use,
    same_def,
    same_def_renamed,
)
from tools.hypotheses.verify import handed_names, passthrough_version, verify
from tools.probe.prober import Prober

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


@pytest.fixture
def refactored(tmp_path):
    """Commit `silu_and_mul` (or the code `before`, committed first) rewritten as `new_caller`, with
    `appended` (the new helpers) added to its file, to a fresh copy of the subject; diagnose with the caller and the named helpers as suspects,
    scored in that order. -> (ranked, caller, *helpers)."""

    def run(new_caller: str, appended: str, *helpers: str, before: str = CALLER) -> tuple[list[Hypothesis], ...]:
        repo = tree_at_base(tmp_path / "repo", None)
        if before != CALLER:  # an earlier commit puts `before` (the caller and its helpers) in its place
            commit(repo, ACT, CALLER, before)
        sha = commit(repo, ACT, before, new_caller, appended)
        cands = [suspect(f, sha, float(len(helpers) + 1 - i)) for i, f in enumerate(("silu_and_mul", *helpers))]
        return (diagnose(repo, list(cands)), *cands)

    return run


def test_a_new_helper_whose_own_code_carries_the_change_takes_the_credit_from_its_restored_caller(refactored):
    """Regression (the caller was credited): a commit moves a computation out of a function into a
    new value-returning helper and gets it wrong there. Restoring the caller removes the divergence,
    the helper has no earlier version and no template repairs it; with the caller kept as it is and the
    helper's body made the caller's old inline code, the divergence vanishes: the helper is at fault."""
    ranked, caller, helper = refactored(
        MOVED_CALLER.format(up="x[..., d:]"),
        HELPER.format(body="F.gelu(x[..., : x.shape[-1] // 2])"),
        "_activated_gate",
    )
    assert ranked[0] is helper and helper.verified and helper.verified_by == "restore"
    assert "computed it with before" in helper.evidence[0] and "silu_and_mul kept as it is now" in helper.evidence[0]
    assert "+    out = F.silu(x[..., :d])" in helper.verifying_diff
    assert not caller.verified and "credited to the callee" in caller.evidence[0]


@slow
def test_a_caller_whose_own_change_carries_the_fault_keeps_the_credit_from_its_correct_new_helper(refactored):
    """The other side of the rule: the helper computes what the caller's old code did (written
    differently), and the caller's own change multiplies by the wrong half. The helper given the old
    inline code leaves the divergence, so the restored caller keeps the credit."""
    ranked, caller, helper = refactored(
        MOVED_CALLER.format(up="x[..., :d]"),
        HELPER.format(body="F.silu(x[..., : x.shape[-1] // 2])"),
        "_activated_gate",
    )
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
    refactored,
):
    """Regression (a count helper was credited by a template edit that makes it zero, which skips the
    faulty padder it sizes): the restored caller's new callees are each first given their restore-like
    counterfactual (the padder's own do-nothing path, as before it existed), and templates only after."""
    ranked, caller, count, padder = refactored(PADDED_CALLER, PADDING, "_rows_to_pad", "_pad_rows")
    assert ranked[0] is padder and padder.verified and padder.verified_by == "restore"
    assert "a pass-through of its inputs (as before that commit)" in padder.evidence[0]
    assert "+    return x" in padder.verifying_diff
    assert not count.verified and not caller.verified


# The commit replaces the caller's inline code by a call of a new helper that the caller does not bind
# to the name its old code assigned from plain names, so the helper cannot be given that old code as its
# body; {use} is the call's place: a return value, an argument, a call with attribute arguments.
USED_CALLER = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    d = x.shape[-1] // 2
    {use}
"""
ACTIVATED = """

def _activated(gate: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # [T, I] -> [T, I]
    return {body}
"""
GATED = """

def _gated(x: torch.Tensor, d: int) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    return F.gelu(x[..., :d]) * x[..., d:]
"""
HELPER_AT_FAULT = {
    "a return value": (USED_CALLER.format(use="return _gated(x, d)"), GATED, "_gated"),
    "an argument": (
        USED_CALLER.format(use="return torch.mul(_activated(x[..., :d]), x[..., d:])"),
        ACTIVATED.format(body="F.gelu(gate)"),
        "_activated",
    ),
    "attribute arguments": (
        USED_CALLER.format(use="out = _activated(x[..., :d], x.dtype)\n    return out.mul_(x[..., d:])"),
        ACTIVATED.format(body="F.gelu(gate).to(dtype)"),
        "_activated",
    ),
}


@pytest.mark.parametrize(
    "place", [pytest.param(p, marks=[] if p == "a return value" else slow) for p in HELPER_AT_FAULT]
)
def test_a_new_helper_the_restored_caller_only_calls_outranks_it_wherever_the_call_stands(refactored, place):
    """Regression (held-out hard cases: the caller was credited): a commit replaces inline code by a
    call of a new helper and gets the helper wrong; the call is a return value, an argument of another
    call, or takes attribute arguments. Restoring the caller removes the divergence; its change is only
    its use of the helper, whose body is not the code the caller lost: the helper ranks first, and the
    evidence says why."""
    new_caller, helper_code, name = HELPER_AT_FAULT[place]
    ranked, caller, helper = refactored(new_caller, helper_code, name)
    assert ranked[0] is helper and helper.verified and helper.verified_by == "restore"
    assert f"whose change is only its use of {name}" in helper.evidence[0]
    assert "not the code silu_and_mul lost (`out = F.silu(x[..., :d])" in helper.evidence[0]
    assert "it outranks its caller" in helper.evidence[0]
    assert not caller.verified and "credited to the callee" in caller.evidence[0]
    assert "+    out = F.silu(x[..., :d])" in helper.verifying_diff  # the caller's restore, shown
    assert caller in ranked[:5]


@slow
def test_a_caller_that_moved_code_faithfully_into_a_new_helper_keeps_the_credit_for_its_own_change(refactored):
    """The other side: the helper's body is the code the caller lost, moved unchanged (its parameter
    renamed), and the caller's own remaining change multiplies by the wrong half. Restoring the caller
    removes the divergence and its change is only around its use of the helper, but the move is faithful:
    the caller keeps the credit."""
    new_caller = USED_CALLER.format(use="return _activated(x[..., :d]).mul_(x[..., :d])")
    ranked, caller, helper = refactored(new_caller, ACTIVATED.format(body="F.silu(gate)"), "_activated")
    assert ranked[0] is caller and caller.verified and caller.verified_by == "restore"
    assert any("a faithful move" in e and "remaining change carries" in e for e in caller.evidence)
    assert not helper.verified and any("moved unchanged" in e for e in helper.evidence)


# A chain that already existed: the commit threads a new flag from the kernel down through two
# functions to a new helper, which computes wrongly when the flag is set.
CHAIN = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    d = x.shape[-1] // 2
    return _times_up(x, d{flag})


def _times_up(x: torch.Tensor, d: int{param}) -> torch.Tensor:
    return _gate(x, d{passed}).mul_(x[..., d:])


def _gate(x: torch.Tensor, d: int{param}) -> torch.Tensor:
    out = {gate}
    return out
"""
FAST_GATE = """

def _activated(x: torch.Tensor, d: int, fast: bool) -> torch.Tensor:
    gate = x[..., :d]
    return gate * torch.sigmoid(1.5 * gate) if fast else F.silu(gate)
"""


@slow
def test_a_new_helper_a_threaded_argument_reaches_is_isolated_through_its_own_caller(refactored):
    """Regression (held-out: the kernel that passes a new argument down was credited, the new helper
    three calls down was not in the top 5): restoring the top function drops the argument; the
    functions in between cannot be restored (their old versions do not take it). The new helper's own
    caller, changed by the same commit, computed its value inline before: the helper given that code
    as its body, the divergence vanishes, so the helper takes the credit."""
    before = CHAIN.format(flag="", param="", passed="", gate="F.silu(x[..., :d])")
    now = CHAIN.format(flag=", fast=True", param=", fast: bool = False", passed=", fast", gate="_activated(x, d, fast)")
    ranked, top, times_up, gate, helper = refactored(now, FAST_GATE, "_times_up", "_gate", "_activated", before=before)
    assert ranked[0] is helper and helper.verified and helper.verified_by == "restore"
    assert "its body replaced by the code _gate computed it with before" in helper.evidence[0]
    assert not top.verified and "credited to the callee" in top.evidence[0]
    assert top in ranked[:5]


def test_only_its_use_discounts_moved_code_and_the_code_a_call_replaced():
    old = "def f(x, z):\n    xa = up(x)\n    if z is None:\n        out = lin(xa)\n    else:\n        out = g(xa, z)\n    return out\n"
    returned = (
        "def f(x, z):\n    if z is None:\n        return h(x)\n    xa = up(x)\n    out = g(xa, z)\n    return out\n"
    )
    assert only_its_use(returned, old, "h")  # `xa = up(x)` moved and `out = g(..)` left its branch: no change
    assert not only_its_use(returned.replace("g(xa, z)", "g(xa, z + 1)"), old, "h")
    assert not only_its_use(returned.replace("f(x, z)", "f(x, z, w)"), old, "h")  # a new parameter is a change
    guarded = old.replace("    else:\n", "    elif x.shape[0] == 1:\n        out = h(xa, z)\n    else:\n")
    assert only_its_use(guarded, old, "h")  # a new branch whose body only calls it
    assert not only_its_use(guarded.replace("out = h(xa, z)", "out = h(xa, z)\n        out = out * 2"), old, "h")
    assert changed_statements(returned, old) is not None
    gained, lost = changed_statements(returned, old) or ([], [])
    assert [ast.unparse(u) for u in gained] == ["return h(x)"] and [ast.unparse(u) for u in lost] == ["out = lin(xa)"]


def test_faithful_move_compares_the_helper_body_with_the_lost_code_under_its_parameters():
    old = "def f(self, b, s):\n    meta = M(a=b.seqs, n=s.k * 3, t=self.tables(b))\n    return g(meta)\n"
    now = "def f(self, b, s):\n    return g(self.meta(b, s.k, n=3))\n"
    helper = (
        'def meta(self, batch, k, n=1):\n    """Doc."""\n    return M(a=batch.seqs, n=k * n, t=self.tables(batch))\n'
    )
    assert faithful_move(helper, now, old, "meta")  # attribute argument, keyword, self: all renamed
    assert not faithful_move(helper.replace("k * n", "k + n"), now, old, "meta")
    assert not faithful_move(helper.replace("self.tables", "self.other"), now, old, "meta")
    two_step = "def meta(self, batch, k, n=1):\n    t = self.tables(batch)\n    return M(a=batch.seqs, n=k * n, t=t)\n"
    assert not faithful_move(two_step, now, old, "meta")  # `t = ...` was not a statement of the caller
    assert not faithful_move("def meta(self, batch, k, n=1):\n    return k\n", now, old, "meta")  # only a name


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


def test_backward_slice_refuses_a_value_changed_in_place_by_a_statement_it_leaves_out():
    # the old code built its result by appending in a loop: `caches = []` alone is not what it computed
    old = (
        "def alloc(self, n, shape):\n    caches = []\n    for m in self.layers:\n"
        "        m.k = torch.zeros(shape)\n        caches.append(m.k)\n    return caches\n"
    )
    fn = function_node(old)
    assert fn is not None and backward_slice(fn.body, "caches") is None
    now = "def alloc(self, n, shape):\n    caches = pairs(n, shape)\n    return caches\n"
    assert inline_version("def pairs(n, shape):\n    return [torch.zeros(shape)] * n\n", now, old, "pairs") is None
    # an item assigned is a change in place too; a method whose value is used is only a read
    stored = function_node("def f(a):\n    w = [0, 0]\n    w[0] = a\n    return w\n")
    read = function_node("def f(a):\n    w = a * 2\n    n = w.sum()\n    return w, n\n")
    assert stored is not None and backward_slice(stored.body, "w") is None
    assert read is not None and [s.lineno for s in backward_slice(read.body, "w") or []] == [2]


def test_passthrough_version_takes_a_function_s_own_do_nothing_path():
    src = '    def pad(self, q, k, n):\n        """Doc."""\n        if n == 0:\n            return q, k\n        return f(q), f(k)\n'
    assert passthrough_version(src) == '    def pad(self, q, k, n):\n        """Doc."""\n        return (q, k)\n'
    assert passthrough_version("def g(x):\n    return x * 2\n") is None  # no path hands its input back
    assert passthrough_version("def g(x):\n    return x\n") is None  # nothing else to take away
    nested = "def g(x):\n    def h(y):\n        return y\n    return h(x) + 1\n"
    assert passthrough_version(nested) is None  # a nested function's return is not g's


# The commit also rewrites how the caller splits its input (the same split for an even width), so its
# restore changes more than its use of the helper, and the helper's parameter is an expression of a
# caller's local: neither the only-its-use rule nor the helper-given-old-code probe applies.
RESPLIT_CALLER = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    d = x.shape[-1] - x.shape[-1] // 2
    out = _activated(x[..., :d])
    return out.mul_(x[..., {up}:])
"""


def test_a_new_helper_outranks_a_caller_whose_restore_but_for_its_use_of_it_still_diverges(refactored):
    """Regression (held-out B cases: the caller kept rank 1): the caller's restore also undoes a
    harmless rewrite, the helper is wrong. The caller restored but for its line that uses the helper
    still diverges: the helper's own code carries it and outranks the caller."""
    ranked, caller, helper = refactored(
        RESPLIT_CALLER.format(up="d"), ACTIVATED.format(body="F.gelu(gate)"), "_activated"
    )
    assert ranked[0] is helper and helper.verified and helper.verified_by == "restore"
    assert "restored in full it agrees" in helper.evidence[0]
    assert "+    d = x.shape[-1] // 2\n     out = _activated(x[..., :d])" in helper.verifying_diff  # the call kept
    assert not caller.verified and "credited to the callee" in caller.evidence[0]


@slow
def test_a_caller_restored_but_for_its_use_of_a_correct_new_helper_that_agrees_keeps_the_credit(refactored):
    """The other side (C-kind: the caller at fault, the helper right but written differently, so not
    a faithful move): the caller restored but for its use of the helper agrees, so it keeps the credit."""
    ranked, caller, helper = refactored(
        RESPLIT_CALLER.format(up=":d"), ACTIVATED.format(body="gate * torch.sigmoid(gate)"), "_activated"
    )
    assert ranked[0] is caller and caller.verified and caller.verified_by == "restore"
    assert any("restored but for its use of _activated it agrees" in e for e in caller.evidence)
    assert not helper.verified


def test_kept_call_version_restores_all_but_the_lines_that_use_the_helper():
    old = 'def f(s, b):\n    """Old."""\n    d = b // 2\n    p = range(s, s + d)\n    k = [i for i in p]\n    return p, k\n'
    now = 'def f(s, b):\n    """New,\n    two lines."""\n    d = b - b // 2\n    p = h(s, d)\n    k = list(p)\n    return p, k\n'
    kept = kept_call_version(now, old, "h")
    assert kept == old.replace("range(s, s + d)", "h(s, d)")
    assert kept_call_version(now, old, "g") is None  # no line uses it: nothing to keep
    other_target = now.replace("p = h(s, d)", "q = h(s, d)")
    assert kept_call_version(other_target, old, "h") is None  # it feeds another value


# The commit rewrites the caller's whole body around a new helper: nothing of the old body is left for
# the helper's call to stand in (no line to keep, no name bound to its result), so no counterfactual
# separates the rewrite from the helper.
REWRITTEN_CALLER = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]: one chunk, the activation in a helper
    gate, up = x.chunk(2, dim=-1)
    return _act(gate) * {up}
"""
ACT_HELPER = """

def _act(gate: torch.Tensor) -> torch.Tensor:
    # [T, I] -> [T, I]
    return {body}
"""


@slow
def test_a_new_helper_its_caller_was_rewritten_around_takes_the_credit_when_nothing_separates_them(refactored):
    """Regression (held-out B cases: the caller kept rank 1): the commit rewrites the caller's whole
    body around a new helper and gets the helper wrong. Restoring the caller removes the divergence;
    the helper has no earlier version, no template edit repairs it, and the caller cannot be restored
    around its use of it. The helper's code is all new and the rewrite re-expresses code that ran right
    before: the helper ranks first, the caller next, and the evidence says what was lost."""
    ranked, caller, helper = refactored(
        REWRITTEN_CALLER.format(up="up"), ACT_HELPER.format(body="F.gelu(gate)"), "_act"
    )
    assert ranked[0] is helper and helper.verified and helper.verified_by == "restore"
    assert (
        "rewrote around its call of _act" in helper.evidence[0] and "none of it is the lost code" in helper.evidence[0]
    )
    assert any("template edit(s) of its own new lines leave the divergence" in e for e in caller.evidence)
    assert "+    out = F.silu(x[..., :d])" in helper.verifying_diff  # the caller's restore, shown
    assert not caller.verified and "is rewritten around its new callee _act" in caller.evidence[0]
    assert ranked[1] is caller


@slow
def test_a_faithfully_moved_helper_gets_no_template_edit_that_could_mask_its_caller_s_own_change(refactored):
    """Regression (held-out C case: a swapped-arguments edit of the moved helper masked the caller's
    fault and took the credit): the helper's body is the code the caller lost, moved unchanged, and the
    caller's other change takes the wrong half as `up`. That code ran right before the commit, so the
    helper gets no template edits: the restored caller keeps the credit."""
    new_caller = USED_CALLER.format(use="up = x[..., :d]\n    return _activated(x[..., :d]).mul_(up)")
    ranked, caller, helper = refactored(new_caller, ACTIVATED.format(body="F.silu(gate)"), "_activated")
    assert ranked[0] is caller and caller.verified and caller.verified_by == "restore"
    assert any("moved unchanged" in e and "no template edit tried on it" in e for e in helper.evidence)
    assert not helper.verified and not any("fix template" in e for e in helper.evidence)


# The caller hands a helper made of its own old code (renamed) the right input but multiplies by the
# wrong half itself.
MOVED_RENAMED_CALLER = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]: the gate's activation in a helper
    h = x.shape[-1] // 2
    up = x[..., :h]
    return _act(x, h).mul_(up)
"""
RENAMED_HELPER = """

def _act(t: torch.Tensor, n: int) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    y = F.silu(t[..., :n])
    return y
"""


@slow
def test_a_caller_rewritten_around_its_own_code_moved_into_a_helper_keeps_the_credit(refactored):
    """The other side (a helper extracted from the caller, the caller at fault): the helper's statement
    is code the caller lost, names aside, so it is not new code; the caller's rewrite around it carries
    the divergence and the restored caller keeps the credit."""
    ranked, caller, helper = refactored(MOVED_RENAMED_CALLER, RENAMED_HELPER, "_act")
    assert ranked[0] is caller and caller.verified and caller.verified_by == "restore"
    assert any("part of its body is code its caller silu_and_mul lost" in e for e in helper.evidence)
    assert not helper.verified


def test_moved_statements_counts_the_helper_s_lost_code_up_to_renaming():
    old = "def f(x):\n    d = x.shape[-1] // 2\n    out = F.silu(x[..., :d])\n    return out.mul_(x[..., d:])\n"
    now = "def f(x):\n    h = x.shape[-1] // 2\n    return g(x, h).mul_(x[..., h:])\n"
    assert moved_statements("def g(t, n):\n    y = F.silu(t[..., :n])\n    return y\n", now, old) == 1
    assert moved_statements("def g(t, n):\n    return F.silu(t[..., :n])\n", now, old) == 1  # a lost value
    assert moved_statements("def g(t, n):\n    return F.gelu(t[..., :n])\n", now, old) == 0  # new code
    assert moved_statements("not python", now, old) == 0


def test_what_a_caller_stops_handing_on_an_option_or_all_of_a_value():
    old = "def decode(self, ids):\n    return self._tok.decode(ids, skip_special_tokens=True)\n"
    now = "def decode(self, ids):\n    return self._tok.join([self.piece(i) for i in ids])\n"
    assert dropped_options(now, old, ["def piece(self, i):\n    return self._tok.id_to_token(i)\n"]) == [
        "skip_special_tokens"
    ]
    assert dropped_options(now, old, ["def piece(self, i, skip_special_tokens=True):\n    pass\n"]) == []
    old_update = "def update(self, seq):\n    seq.text += step(self.decode, seq.ids, seq.offset)\n"
    new_update = (
        "def update(self, seq):\n    seq.pieces += self.pieces(seq.ids[-1:])\n    seq.text += join(seq.pieces)\n"
    )
    assert narrowed_arguments(new_update, old_update, "pieces") == ["seq.ids[-1:]"]
    assert narrowed_arguments(new_update.replace("seq.ids[-1:]", "seq.ids"), old_update, "pieces") == []
    assert narrowed_arguments(new_update, old_update, "join") == []


def test_handed_names_are_the_plain_names_a_caller_gives_the_helper():
    src = "def f(self, b):\n    rows = g(b)\n    return self.h([i for i in b], rows, k=b)\n"
    assert handed_names(src, "Cls.h") == {"rows", "b"}
    assert handed_names(src, "g") == {"b"} and handed_names(src, "other") == set()


# The caller called an existing helper; the commit adds a copy of it under a new name and parameter
# names (the old one stays for other callers) and switches the caller over, getting the call wrong.
WITH_GATE_ACT = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    d = x.shape[-1] // 2
    {use}


def _gate_act(x: torch.Tensor, d: int) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    return F.silu(x[..., :d])
"""
COPIED_HELPER = """

def _silu_half(t: torch.Tensor, n: int) -> torch.Tensor:
    \"\"\"The gate half's activation.\"\"\"
    # [T, 2I] -> [T, I]
    return F.silu(t[..., :n])
"""
CALLS_COPY = {
    "use only": "out = _silu_half(0.5 * x, d)\n    return out.mul_(x[..., d:])",
    "rewritten": "up = 0.5 * x[..., d:]\n    return _silu_half(x, d).mul_(up)",
}


@slow
@pytest.mark.parametrize("change", list(CALLS_COPY))
def test_a_new_helper_that_is_a_function_its_caller_called_before_moved_unchanged_leaves_the_caller_the_credit(
    refactored, change
):
    """Regression (fourth held-out set, callers of a moved helper at rank 2): the helper the commit
    created is, parameter names aside, a function the caller called before the commit, so its code is
    not new: it ran on the caller's path. What the restore takes off the path is the caller's new use
    of it; the caller keeps the credit whether its change is only that use or a rewrite around it."""
    before = WITH_GATE_ACT.format(use="out = _gate_act(x, d)\n    return out.mul_(x[..., d:])")
    new_caller = WITH_GATE_ACT.format(use=CALLS_COPY[change])
    ranked, caller, helper = refactored(new_caller, COPIED_HELPER, "_silu_half", before=before)
    assert ranked[0] is caller and caller.verified and caller.verified_by == "restore"
    assert any("_gate_act's, which its caller silu_and_mul called before" in e for e in helper.evidence)
    assert not helper.verified


def test_same_def_renamed_takes_a_function_moved_with_its_parameters_renamed():
    old = (
        "def _softcap(scores, softcap):\n    return scores if not softcap else torch.tanh(scores / softcap) * softcap\n"
    )
    renamed = "def soft_cap(x: T, cap) -> T:\n    # c\n    return x if not cap else torch.tanh(x / cap) * cap\n"
    swapped = "def soft_cap(x, cap):\n    return x if not cap else torch.tanh(cap / x) * cap\n"
    method = "    @staticmethod\n    def apply(self, logits, p):\n        return logits * p\n"
    assert same_def_renamed(old, renamed) and not same_def_renamed(old, swapped)
    assert same_def_renamed(method, "def f(l, q):\n    return l * q\n")
    assert not same_def_renamed(method, "def f(l, q, r):\n    return l * q\n")


# The caller's old version built its result in place (`out.copy_`, `out.mul_` as statements): the
# statement that binds `out` alone is not what it computed.
BUILT_IN_PLACE = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]: filled in place
    d = x.shape[-1] // 2
    out = torch.empty_like(x[..., :d])
    out.copy_(F.silu(x[..., :d]))
    out.mul_(x[..., d:])
    return out
"""
GATED_CALLER = """def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # [T, 2I] -> [T, I]: the gated product in a helper
    d = x.shape[-1] // 2
    out = _gated(x, d)
    return out
"""
GATED = """

def _gated(x: torch.Tensor, d: int) -> torch.Tensor:
    # [T, 2I] -> [T, I]
    return {body}
"""


@slow
def test_a_new_helper_is_not_given_its_caller_s_old_code_cut_short_of_its_in_place_updates(refactored):
    """Regression (fifth held-out set: the helper was given `caches = []` for the list its caller's old
    code filled by appending, that empty body left the divergence, and the caller kept the credit): the
    caller's old code builds `out` by in-place calls, so there is no old inline code to give the helper;
    the helper, all new code that gets the halves the wrong way round, takes the credit."""
    body = "F.silu(x[..., d:]) * x[..., :d]"
    ranked, caller, helper = refactored(GATED_CALLER, GATED.format(body=body), "_gated", before=BUILT_IN_PLACE)
    assert not any("the caller's own change carries it" in e for e in helper.evidence)
    assert ranked[0] is helper and helper.verified
