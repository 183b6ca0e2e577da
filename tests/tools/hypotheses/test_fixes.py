"""Fix templates: each proposes the one edit that repairs its silent-bug pattern, and only edits."""

from __future__ import annotations

import pytest

from tools.hypotheses.fixes import TEMPLATES, apply_edit, fixes, literal_alternatives, parse_function


def proposals(source: str, template: str) -> dict[str, str]:
    """description -> new source, for one template."""
    return dict(fixes(source, templates=(template,)))


def has(out: dict[str, str], text: str) -> bool:
    return any(text in new for new in out.values())


def test_off_by_one_moves_slice_bounds_and_range_ends_and_drops_an_explicit_one():
    src = "def last(x, n):\n    for i in range(0, n - 1):\n        x[i] += 1\n    return x[: n]\n"
    out = proposals(src, "off-by-one")
    assert has(out, "range(0, n)")  # the `- 1` dropped
    assert has(out, "x[: n + 1]") and has(out, "x[: n - 1]")
    assert has(out, "x[i + 1]")
    assert not has(out, "(n - 1) + 1")  # moving a ±1 is the same as dropping it


def test_mask_comparison_swaps_strict_and_non_strict():
    src = "def visible(q, k, w):\n    mask = k < q\n    mask &= k > q - w\n    return mask\n"
    out = proposals(src, "mask-comparison")
    assert has(out, "mask = k <= q") and has(out, "k >= q - w")
    assert len(out) == 2


def test_upcast_computes_the_statement_in_fp32_and_casts_back():
    src = "def softmax(s):\n    p = torch.softmax(s * 2, dim=-1)\n    return p\n"
    out = proposals(src, "upcast")
    assert has(out, "p = (torch.softmax((s * 2).float(), dim=-1)).to((s * 2).dtype)")
    method = "    def norm(self, x):\n        return x * x.pow(2).mean(-1).rsqrt()\n"
    assert has(proposals(method, "upcast"), "return (x * x.float().pow(2).mean(-1).rsqrt()).to(x.dtype)")
    assert proposals("def f(x):\n    return x.float().exp()\n", "upcast") == {}  # already fp32


def test_sign_unnegates_and_swaps_plus_minus_and_times_divide():
    src = "def penalize(logits, p):\n    return -logits - p\n"
    out = proposals(src, "sign")
    assert has(out, "return logits - p") and has(out, "return -logits + p")
    assert not proposals("def f(a):\n    return a + 'x'\n", "sign")  # string concatenation is no term


def test_swapped_arguments_exchanges_neighbours_only():
    src = "def attend(q, k, v):\n    return attention(q, k, v, scale=1.0)\n"
    out = proposals(src, "swapped-arguments")
    assert has(out, "attention(k, q, v, scale=1.0)") and has(out, "attention(q, v, k, scale=1.0)")
    assert len(out) == 2


def test_wrong_default_proposes_common_alternatives():
    src = "def norm(x, eps=1e-5, base=10000, offset=0):\n    return x\n"
    out = proposals(src, "wrong-default")
    assert has(out, "eps=1e-06") and has(out, "eps=0.0001")
    assert has(out, "base=1000000") and has(out, "offset=1")
    assert literal_alternatives("1", in_default=False) == []  # structural literals in the body stay
    assert literal_alternatives("10000.0", in_default=False)[0] == "1e+06"


def test_dropped_term_adds_back_a_parameter_the_body_never_reads():
    src = "def add_norm(x, residual, w):\n    return x * w\n"
    out = proposals(src, "dropped-term")
    assert list(out.values()) == ["def add_norm(x, residual, w):\n    return (x * w) + residual\n"]


def test_stale_value_moves_a_value_after_the_update_of_what_it_reads():
    src = (
        "    def forward(self, logits, st):\n"
        "        probs = logits.softmax(-1)  # shared below\n"
        "        logits = self.adjust(logits, st)\n"
        "        kept = cut(logits, probs)\n"
        "        return kept\n"
    )
    out = proposals(src, "stale-value")
    assert list(out.values()) == [
        "    def forward(self, logits, st):\n"
        "        # shared below\n"
        "        logits = self.adjust(logits, st)\n"
        "        probs = logits.softmax(-1)\n"
        "        kept = cut(logits, probs)\n"
        "        return kept\n"
    ]  # its trailing comment stays where it was
    # used before the update, or rebound in between: the order is meant, nothing proposed
    assert (
        proposals(src.replace("logits = self.adjust(logits, st)", "logits = self.adjust(logits, probs)"), "stale-value")
        == {}
    )
    assert proposals("def f(x):\n    n = len(x)\n    x = x + [0]\n    return n\n", "stale-value") != {}
    assert proposals("def f(x):\n    n = len(x)\n    y = x + [0]\n    return n, y\n", "stale-value") == {}


def test_memo_guard_runs_a_remembered_value_s_guarded_work_every_time():
    src = (
        "    def __call__(self, ids, positions):\n"
        "        n = ids.shape[0]\n"
        "        if n != self.num_tokens:\n"
        "            self.positions[:n].copy_(positions)\n"
        "            self.num_tokens = n\n"
        "        return self.run(ids, self.positions[:n])\n"
    )
    out = proposals(src, "memo-guard")
    assert list(out.values()) == [src.replace("if n != self.num_tokens:", "if True:")]
    plain = "    def f(self, x):\n        if x > self.limit:\n            x = self.limit\n        return x\n"
    assert proposals(plain, "memo-guard") == {}  # the body remembers nothing: no memo


def test_prefix_rows_reads_the_rows_an_index_names_instead_of_as_many_first_rows():
    src = (
        "def history(st, rows):\n"
        "    n = rows.numel()\n"
        "    counts = st.counts[:n]\n"
        "    return st.mask[: n] | (counts > 0), counts\n"
    )
    out = proposals(src, "prefix-rows")
    assert list(out.values()) == [src.replace("[:n]", "[rows]").replace("[: n]", "[rows]")]  # both, as one slip
    inline = proposals("def f(x, idx, k):\n    return x[: idx.shape[0]] + x[:k]\n", "prefix-rows")
    assert list(out) and list(inline.values()) == ["def f(x, idx, k):\n    return x[idx] + x[:k]\n"]
    assert proposals("def f(x, n):\n    return x[:n]\n", "prefix-rows") == {}  # a count, not an index's count
    assert proposals("def f(x, rows):\n    return x[1 : len(rows)]\n", "prefix-rows") == {}  # not a prefix


def test_aliased_output_writes_into_a_copy_of_an_input_instead_of_the_input_itself():
    src = (
        "def rot(x, c, s):\n    x1, x2 = x[..., :2], x[..., 2:]\n    out = x\n"
        "    out[..., :2] = x1 * c - x2 * s\n    out[..., 2:] = x2 * c + x1 * s\n    return out\n"
    )
    out = proposals(src, "aliased-output")
    assert list(out.values()) == [src.replace("out = x\n", "out = x.clone()\n")]
    # a name bound to an input it never writes into, or to a local, is left alone
    assert proposals("def f(x):\n    out = x\n    return out + 1\n", "aliased-output") == {}
    assert proposals("def f(x):\n    y = x * 2\n    out = y\n    out[0] = 1\n    return out\n", "aliased-output") == {}


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_every_proposal_is_one_edit_that_parses(template):
    src = (
        "    def forward(self, x, rows, residual=None, eps: float = 1e-6):\n"
        "        mask = pos[:, None] <= pos[None, :]\n"
        "        h = self.h[: len(rows)]\n"
        "        s = torch.exp(x[: n - 1] - m)\n"
        "        total = x.sum()\n"
        "        rows = torch.arange(n) >> (self.g.bit_length() - 1)\n"
        "        x = x * 2\n"
        "        if n != self.n:\n"
        "            self.n = n\n"
        "        out = x\n"
        "        out[0] = s\n"
        "        return torch.where(mask, s, -s) * torch.rsqrt(x.pow(2).mean(-1) + eps) + total\n"
    )
    out = fixes(src, templates=(template,))
    assert out, template
    for description, new in out:
        assert description.startswith(template) and new != src
        assert parse_function(new) is not None
        changed = [i for i, (a, b) in enumerate(zip(src.splitlines(), new.splitlines())) if a != b]
        if template == "stale-value":  # one edit that moves a statement: the same lines, reordered
            assert sorted(new.splitlines()) == sorted(src.splitlines()), description
        else:
            assert len(changed) == 1, description  # one edit, on one line


def test_component_order_interleaves_templates_most_plausible_first():
    src = "def visible(q, k, w=4096):\n    return (k < q) & (k[1:] > q - w)\n"
    attention = [d.split(":")[0] for d, _ in fixes(src, "attention")]
    assert attention[0] == "mask-comparison" and attention[1] == "off-by-one"
    assert len(set(attention[:4])) == 4  # each pattern gets a turn before any gets a second


def test_unparsable_source_gives_nothing_and_edits_are_byte_exact():
    assert fixes("def broken(:\n") == []
    fn = parse_function("def f(x):\n    return x[1:]\n")
    edit = TEMPLATES["off-by-one"](fn)[0]
    assert apply_edit("def f(x):\n    return x[1:]\n", edit) == "def f(x):\n    return x[2:]\n"


def test_power_of_two_spells_out_a_bit_trick_that_holds_only_for_powers_of_two():
    src = "def token_of(rows, group):\n    return torch.arange(rows) >> (group.bit_length() - 1)\n"
    assert has(proposals(src, "power-of-two"), "return torch.arange(rows) // group")
    masked = proposals("def slot(i, n):\n    return 1 + (i + 1 & (n - 1))\n", "power-of-two")
    assert has(masked, "return 1 + ((i + 1) % n)")
    scaled = proposals("def off(b, cfg):\n    return b << int(math.log2(cfg.block))\n", "power-of-two")
    assert has(scaled, "return b * cfg.block")
    assert proposals("def low(x):\n    return x & 7\n", "power-of-two") == {}  # a constant mask: nothing to spell out
