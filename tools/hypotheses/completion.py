"""A substitution a commit made on some uses of a value and not on others: the commit completed.

A commit that changes what a value means often introduces the new form under a new name and swaps
it in use by use (`left = window - 1`; `[window if ...]` -> `[left if ...]`). A use it missed keeps
the old meaning on one path: the functions that consume the value in its new meaning are then right,
and restoring one of them (back to the old meaning) removes the divergence on that path only because
it undoes the half of the change that was done. The counterfactual here is the commit's own
substitution applied to one more use, the rest of the tree kept as it is now. Pure functions over
Python source; nothing runs here.
"""

from __future__ import annotations

import ast
import difflib
import io
import tokenize
from collections import Counter

from tools.hypotheses.moved import function_node


def substitutions(now_src: str, old_src: str) -> Counter[tuple[str, str]]:
    """(old name, new name) pairs the commit swapped on lines it otherwise left alone: each replaced
    line whose tokens differ from its old version only where one name became another."""
    out: Counter[tuple[str, str]] = Counter()
    old_lines, now_lines = old_src.splitlines(), now_src.splitlines()
    matcher = difflib.SequenceMatcher(a=old_lines, b=now_lines, autojunk=False)
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op != "replace":
            continue
        left = list(now_lines[b0:b1])  # a block of unequal sizes: each old line takes the first that fits
        for old in old_lines[a0:a1]:
            for new in left:
                swapped = _swapped_names(old, new)
                if swapped is not None:
                    out[swapped] += 1
                    left.remove(new)
                    break
    return out


def completed_versions(now_src: str, old_src: str) -> list[tuple[str, str]]:
    """(description, version) for each line of the function as it is now that the commit did not
    touch and that still reads a name the commit swapped for another elsewhere in it (the new name
    being assigned in the function): that line with the swap made too. One line per version."""
    fn = function_node(now_src)
    if fn is None:
        return []
    swaps = substitutions(now_src, old_src)
    assigned = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    untouched = _untouched_lines(now_src, old_src)
    lines = now_src.splitlines(keepends=True)
    out = []
    for (old_name, new_name), _ in swaps.most_common():
        if new_name not in assigned:
            continue
        reads = sorted(
            {
                n.lineno  # function_node dedents: the lines are those of now_src
                for n in ast.walk(fn)
                if isinstance(n, ast.Name) and n.id == old_name and isinstance(n.ctx, ast.Load)
            }
        )
        for line_no in reads:
            if line_no not in untouched or line_no > len(lines):
                continue
            new_line = _replace_name(lines[line_no - 1], old_name, new_name)
            if new_line is None:
                continue
            version = "".join([*lines[: line_no - 1], new_line, *lines[line_no:]])
            if function_node(version) is not None:
                out.append((f"`{lines[line_no - 1].strip()}` -> `{new_line.strip()}`", version))
    return out


def _swapped_names(old: str, new: str) -> tuple[str, str] | None:
    a, b = _tokens(old), _tokens(new)
    if a is None or b is None or len(a) != len(b):
        return None
    diffs = {(x, y) for x, y in zip(a, b) if x != y}
    if len(diffs) != 1:
        return None
    x, y = diffs.pop()
    return (x, y) if x.isidentifier() and y.isidentifier() else None


def _tokens(line: str) -> list[str] | None:
    """The line's tokens (comments and layout aside); None where it does not tokenize on its own."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    return [t.string for t in toks if t.type not in skip]


def _untouched_lines(now_src: str, old_src: str) -> set[int]:
    """1-based numbers of the lines of `now_src` that the commit left as they were."""
    matcher = difflib.SequenceMatcher(a=old_src.splitlines(), b=now_src.splitlines(), autojunk=False)
    return {b0 + i + 1 for op, _a0, _a1, b0, b1 in matcher.get_opcodes() if op == "equal" for i in range(b1 - b0)}


def _replace_name(line: str, old: str, new: str) -> str | None:
    """`line` with every token `old` that is a plain name (not an attribute, not a keyword argument's
    name) made `new`; None where there is none."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    cols = []
    for i, t in enumerate(toks):
        if t.type != tokenize.NAME or t.string != old:
            continue
        before = toks[i - 1].string if i else ""
        after = toks[i + 1].string if i + 1 < len(toks) else ""
        if before == "." or (after == "=" and before in ("(", ",")):
            continue
        cols.append(t.start[1])
    if not cols:
        return None
    out = line
    for col in reversed(cols):
        out = out[:col] + new + out[col + len(old) :]
    return out
