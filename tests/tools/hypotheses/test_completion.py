"""A commit's own name swap made on a use it missed (tools.hypotheses.completion): on source alone."""

from __future__ import annotations

from tools.hypotheses.completion import completed_versions, substitutions

OLD = '''def limits(cfg: dict) -> list:
    """Per-part limit."""
    n, cap = cfg["parts"], cfg.get("cap")
    kinds = cfg.get("kinds")
    if kinds is None:
        return [cap] * n
    return [cap if k == "capped" else None for k in kinds]
'''
NOW = '''def limits(cfg: dict) -> list:
    """Per-part limit, as the kernels take it (one less)."""
    n, cap = cfg["parts"], cfg.get("cap")
    kinds = cfg.get("kinds")
    below = None if cap is None else cap - 1
    if kinds is None:
        return [cap] * n
    return [below if k == "capped" else None for k in kinds]  # the new meaning
'''


def test_substitutions_are_names_swapped_on_lines_otherwise_unchanged():
    assert substitutions(NOW, OLD) == {("cap", "below"): 1}
    assert substitutions(OLD, OLD) == {}
    # a line changed in more than one name is a rewrite, not a swap
    rewritten = NOW.replace('[below if k == "capped"', '[below if q == "capped"')
    assert substitutions(rewritten, OLD) == {}


def test_completed_versions_make_the_swap_on_each_untouched_line_that_still_reads_the_old_name():
    [(description, version)] = completed_versions(NOW, OLD)
    assert description == "`return [cap] * n` -> `return [below] * n`"
    assert "        return [below] * n\n" in version
    assert 'n, cap = cfg["parts"], cfg.get("cap")' in version  # an assignment of the old name stays
    assert "below = None if cap is None else cap - 1" in version  # so does the commit's own new line


def test_no_completion_without_a_swap_or_where_the_new_name_is_not_the_function_s_own():
    assert completed_versions(OLD, OLD) == []
    not_its_own = NOW.replace("    below = None if cap is None else cap - 1\n", "")  # `below` comes from elsewhere
    assert completed_versions(not_its_own, OLD) == []


def test_attribute_and_keyword_names_are_not_swapped():
    old = "def f(x, w):\n    a = g(w, w=1)\n    return h(w, x.w)\n"
    now = "def f(x, w):\n    v = w + 1\n    a = g(v, w=1)\n    return h(w, x.w)\n"
    [(_, version)] = completed_versions(now, old)
    assert "    return h(v, x.w)\n" in version and "a = g(v, w=1)" in version
