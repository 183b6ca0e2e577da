"""An argument a commit stopped passing: the caller's call site, not the callee, changed the behaviour.

When a commit drops an argument from a call (`norm(h, eps, k)` -> `norm(h, k)`), the callee's default
for that parameter applies from then on. The default may be old or new; either way the change that
selects it is the caller's. Restoring the caller as a whole is no test where the same commit also
changed the callee's signature (the old call no longer fits it), so the counterfactual here is the
caller as it is now with that one argument passed again, by keyword. Pure functions over Python
source; nothing runs here.
"""

from __future__ import annotations

import ast
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from tools.hypotheses.moved import function_node


@dataclass(frozen=True)
class Dropped:
    callee: str  # the called name (`f` of `f(...)` and of `obj.f(...)`)
    position: int | None  # its place among the old call's positional arguments; None: it was a keyword
    keyword: str | None  # the keyword it was passed by, if any
    value: str  # the argument's source, as the old call had it


def dropped_arguments(now_src: str, old_src: str) -> list[tuple[ast.Call, Dropped]]:
    """(call in `now_src`, what it no longer passes) for each call of the function now whose
    counterpart in its old version (the same called name, the same rank among the calls of that
    name) passed more arguments, one of which it no longer passes at all (by value, as source)."""
    now, old = function_node(now_src), function_node(old_src)
    if now is None or old is None:
        return []
    out = []
    now_calls, old_calls = _calls_by_name(now), _calls_by_name(old)
    for name, calls in now_calls.items():
        before = old_calls.get(name, [])
        if len(before) != len(calls):
            continue  # calls added or removed: no counterpart to read
        for call, was in zip(calls, before):
            if _count(call) >= _count(was):
                continue
            kept = Counter(_arguments(call).values())
            for place, value in _arguments(was).items():
                if kept[value]:
                    kept[value] -= 1
                    continue
                position, keyword = (place, None) if isinstance(place, int) else (None, place)
                out.append((call, Dropped(name, position, keyword, value)))
    return out


def with_keyword(source: str, call: ast.Call, keyword: str, value: str) -> str | None:
    """`source` (one def; `call` a node of function_node(source)) with `keyword=value` added as the
    call's last argument; None where the call already names that keyword or takes `**kwargs`."""
    if any(k.arg == keyword or k.arg is None for k in call.keywords):
        return None
    nodes: list[ast.expr | ast.keyword] = [*call.args, *call.keywords]
    ends = [(getattr(n, "end_lineno", None), getattr(n, "end_col_offset", None)) for n in nodes]
    end = max(((a, b) for a, b in ends if isinstance(a, int) and isinstance(b, int)), default=None)
    if end is None:
        return None  # no argument left to follow: the call is rare enough to leave
    line_no, at = end  # the column counts bytes, as ast does
    lines = textwrap.dedent(source).splitlines(keepends=True)
    raw = lines[line_no - 1].encode("utf-8")
    lines[line_no - 1] = (raw[:at] + f", {keyword}={value}".encode() + raw[at:]).decode("utf-8")
    version = textwrap.indent("".join(lines), _indent(source))
    return version if function_node(version) is not None else None


def restored_argument_versions(
    now_src: str, old_src: str, keywords: Callable[[Dropped], list[str]]
) -> list[tuple[str, str]]:
    """(description, version) for each argument the function's commit stopped passing at one of its
    calls: the function as it is now with that argument passed again, under each keyword
    `keywords(dropped)` proposes (an argument the old call passed by keyword keeps its keyword)."""
    out = []
    for call, d in dropped_arguments(now_src, old_src):
        for keyword in [d.keyword] if d.keyword else keywords(d):
            version = with_keyword(now_src, call, keyword, d.value)
            if version is not None:
                out.append((f"`{keyword}={d.value}` to {d.callee}", version))
    return out


def keywords_passing(source: str, value: str) -> set[str]:
    """Keywords under which some call in `source` (a module, a function) passes the expression `value`."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return set()
    return {
        k.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for k in node.keywords
        if k.arg and ast.unparse(k.value) == value
    }


def _calls_by_name(fn: ast.AST) -> dict[str, list[ast.Call]]:
    out: dict[str, list[ast.Call]] = {}
    calls = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda c: (c.lineno, c.col_offset))
    for call in calls:
        name = _called(call)
        if name:
            out.setdefault(name, []).append(call)
    return out


def _called(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _count(call: ast.Call) -> int:
    return len(call.args) + len(call.keywords)


def _arguments(call: ast.Call) -> dict[int | str, str]:
    """{position or keyword: the argument's source}; starred and `**` arguments left out."""
    out: dict[int | str, str] = {}
    for i, a in enumerate(call.args):
        if not isinstance(a, ast.Starred):
            out[i] = ast.unparse(a)
    for k in call.keywords:
        if k.arg:
            out[k.arg] = ast.unparse(k.value)
    return out


def _indent(source: str) -> str:
    first = next((line for line in source.splitlines() if line.strip()), "")
    return first[: len(first) - len(first.lstrip())]
