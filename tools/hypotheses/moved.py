"""Code a commit moved out of a function into a helper: the helper rebuilt from the code its caller
computed the same value with before the commit.

A commit that moves a computation into a new helper changes two functions at once, and restoring the
caller (which drops the call) removes a fault in either. The helper's version built here keeps the
caller as it is now and puts the caller's old inline code in the helper's place, so a re-probe tells
whose own change carries the behaviour change. Pure functions over Python source; nothing runs here.
"""

from __future__ import annotations

import ast
import textwrap

Function = ast.FunctionDef | ast.AsyncFunctionDef


def inline_version(helper_src: str, caller_now: str, caller_old: str, helper: str) -> str | None:
    """`helper_src` (one def, named `helper`) with its body replaced by the statements of `caller_old`
    that computed the name `caller_now` now binds to the helper's result, or None where there is no
    such correspondence: the caller binds the result of one call to a plain name, its old version
    assigned that name once, and every local that old code reads is handed to the helper as a plain
    name argument (so the caller still gives the helper exactly what the old code read)."""
    now, old, fn = function_node(caller_now), function_node(caller_old), function_node(helper_src)
    if now is None or old is None or fn is None or not fn.body or fn.body[0].lineno == fn.lineno:
        return None
    site = result_binding(now, helper)
    if site is None:
        return None
    target, call = site
    statements = backward_slice(old.body, target)
    binding = argument_names(fn, call)
    if statements is None or binding is None:
        return None
    free = free_names(statements)
    if any(n in local_names(old) and n not in binding for n in free):
        return None  # the old code read a local of the caller the helper is not given
    renames = sorted((n, p) for n, p in binding.items() if n in free and n != p)
    prologue = [f"{', '.join(n for n, _ in renames)} = {', '.join(p for _, p in renames)}"] if renames else []
    lines = textwrap.dedent(caller_old).splitlines()
    code = [line for st in statements for line in _statement_lines(lines, st, old.body[0].col_offset)]
    return with_body(helper_src, fn, [*prologue, *code, f"return {target}"])


def same_def(a: str, b: str) -> bool:
    """The two defs have the same body, docstrings and annotations aside: a faithful move."""
    fa, fb = function_node(a), function_node(b)
    if fa is None or fb is None:
        return False
    return [ast.dump(st) for st in _code(fa)] == [ast.dump(st) for st in _code(fb)]


def result_binding(fn: Function, helper: str) -> tuple[str, ast.Call] | None:
    """(name, call) of the first `name = helper(...)` in fn (also `self.helper(...)`)."""
    short = helper.rsplit(".", 1)[-1]
    for node in ast.walk(fn):
        target, value = _single_target(node)
        if target is not None and isinstance(value, ast.Call) and _called(value) == short:
            return target, value
    return None


def backward_slice(body: list[ast.stmt], target: str) -> list[ast.stmt] | None:
    """The top-level statements of `body` that compute `target` (its one assignment and the earlier
    plain assignments it depends on), in order; None if `target` is assigned more than once or a
    value it depends on comes out of a loop, a branch or a call statement."""
    assigned = [st for st in body if target in _targets(st)]
    if len(assigned) != 1 or sum(target in _targets(n) for n in ast.walk(ast.Module(body, []))) != 1:
        return None
    at = body.index(assigned[0])
    needed, picked = _reads(body[at]), [body[at]]
    for st in reversed(body[:at]):
        if not {t for node in ast.walk(st) for t in _targets(node)} & needed:  # a loop's body included
            continue
        if not isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            return None
        picked.insert(0, st)
        needed = (needed - _targets(st)) | _reads(st)
    return picked


def free_names(statements: list[ast.stmt]) -> set[str]:
    """Names the statements read before (or without) assigning them."""
    free: set[str] = set()
    bound: set[str] = set()
    for st in statements:
        free |= _reads(st) - bound
        bound |= _targets(st)
    return free


def argument_names(fn: Function, call: ast.Call) -> dict[str, str] | None:
    """{caller's name: helper's parameter} for the call's arguments that are plain names; None where
    the call spreads `*args` / `**kwargs`."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
        params = params[1:]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    named = set(params) | {a.arg for a in fn.args.kwonlyargs}
    pairs = list(zip(call.args, params)) + [(k.value, k.arg or "") for k in call.keywords]
    return {arg.id: param for arg, param in pairs if isinstance(arg, ast.Name) and param in named}


def local_names(fn: Function) -> set[str]:
    """fn's parameters and every name it assigns."""
    a = fn.args
    params = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
    return params | {t for node in ast.walk(fn) for t in _targets(node)}


def function_node(source: str) -> Function | None:
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    return next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


def _single_target(node: ast.AST) -> tuple[str | None, ast.expr | None]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id, node.value
    return None, None


def _called(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _targets(node: ast.AST) -> set[str]:
    """Plain names a statement (or a node) assigns, tuples unpacked."""
    if isinstance(node, ast.Assign):
        exprs: list[ast.expr] = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        exprs = [node.target]
    elif isinstance(node, ast.NamedExpr):
        exprs = [node.target]
    else:
        return set()
    return {n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _reads(st: ast.stmt) -> set[str]:
    reads = {n.id for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return reads | (_targets(st) if isinstance(st, ast.AugAssign) else set())


def _statement_lines(lines: list[str], st: ast.stmt, indent: int) -> list[str]:
    """The statement's source lines, less the indentation of the body it sits in."""
    return [line[indent:] for line in lines[st.lineno - 1 : st.end_lineno or st.lineno]]


def _code(fn: Function) -> list[ast.stmt]:
    """fn's body less its docstring, annotations dropped from assignments."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return [
        ast.Assign([st.target], st.value, lineno=0) if isinstance(st, ast.AnnAssign) and st.value else st for st in body
    ]


def with_body(source: str, fn: Function, body: list[str]) -> str:
    """`source` (one def, fn its parsed node) with its body replaced by the lines `body`, its header
    and docstring kept, at the indentation of its first body line."""
    lines = source.splitlines(keepends=True)
    first = fn.body[0]
    docstring = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    body_line = lines[first.lineno - 1]
    indent = body_line[: len(body_line) - len(body_line.lstrip())]
    keep = (first.end_lineno or first.lineno) if docstring else first.lineno - 1
    return "".join(lines[:keep]) + "".join(f"{indent}{line}\n" if line.strip() else "\n" for line in body)
