"""Code a commit moved out of a function into a helper: the helper rebuilt from the code its caller
computed the same value with before the commit.

A commit that moves a computation into a new helper changes two functions at once, and restoring the
caller (which drops the call) removes a fault in either. The helper's version built here keeps the
caller as it is now and puts the caller's old inline code in the helper's place, so a re-probe tells
whose own change carries the behaviour change. Where no such version can be built (the call is a
return value or an argument, takes expressions), the caller's change read statement by statement
tells the same without a probe: a caller whose change is nothing but its use of the new helper
credits the helper, unless the helper's body is the code the caller lost, moved unchanged.
Pure functions over Python source; nothing runs here.
"""

from __future__ import annotations

import ast
import copy
import difflib
import re
import textwrap
from collections import Counter

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
    return [_key(st) for st in _code(fa)] == [_key(st) for st in _code(fb)]


def same_def_renamed(a: str, b: str) -> bool:
    """same_def once a's parameters take b's names, position by position (`self` / `cls` aside): a
    function moved unchanged whose parameters were renamed on the way. A module function moved into a
    class as a method whose object is its first parameter (`def f(pool, n)` -> `def f(self, n)`, every
    `pool.` read now `self.`) counts too: all parameters are then paired, `self` included."""
    fa, fb = function_node(a), function_node(b)
    if fa is None or fb is None:
        return False
    pa, pb = _positional(fa), _positional(fb)
    whole_a, whole_b = _all_parameters(fa), _all_parameters(fb)
    if len(pa) != len(pb) and len(whole_a) == len(whole_b):  # `self` on one side only: pair it too
        pa, pb = whole_a, whole_b
    if len(pa) != len(pb):
        return False
    names: dict[str, ast.expr] = {x: ast.Name(y, ast.Load()) for x, y in zip(pa, pb) if x != y}
    return [_key(_substituted(st, names)) for st in _code(fa)] == [_key(st) for st in _code(fb)]


def _positional(fn: Function) -> list[str]:
    params = _all_parameters(fn)
    return params[1:] if params[:1] in (["self"], ["cls"]) else params


def _all_parameters(fn: Function) -> list[str]:
    return [x.arg for x in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]


# ---- a caller's change read statement by statement -------------------------------------------------
#
# A statement is compared without its place: a compound statement contributes its header (an `if`
# with its test, its branches emptied) and its inner statements one by one, so code that only moved
# into or out of a branch, or up or down, is not a change. What is left on each side is what the
# commit took out of the caller (`lost`) and what it put in (`gained`).


def changed_statements(now_src: str, old_src: str) -> tuple[list[ast.AST], list[ast.AST]] | None:
    """(gained, lost): statements of the caller now that its old version lacks, and the reverse,
    counted as multisets (docstrings aside); None where either does not parse as a def."""
    now, old = function_node(now_src), function_node(old_src)
    if now is None or old is None:
        return None
    return _missing(_units(now.body), _units(old.body)), _missing(_units(old.body), _units(now.body))


def only_its_use(now_src: str, old_src: str, name: str) -> bool:
    """The caller's change (its old version -> now) is nothing but its use of `name`: its signature is
    the same, and every statement it gained calls or reads `name`, or is a branch that guards only
    such statements. Moved or re-nested code and the code the call replaced do not count."""
    now, old = function_node(now_src), function_node(old_src)
    changed = changed_statements(now_src, old_src)
    if now is None or old is None or changed is None or _key(now.args) != _key(old.args):
        return False
    gained, _ = changed
    return bool(gained) and all(_uses(u, name) or _guards(u, name) for u in gained)


def faithful_move(helper_src: str, now_src: str, old_src: str, name: str) -> bool:
    """The helper's body, its parameters replaced by what the caller now passes them, is code the
    caller lost: its statements are lost statements and the value it returns is an expression of one
    (the commit moved that code, unchanged, into the helper; a behaviour change of the pair is then in
    what else the caller changed). A procedure's whole body must be lost statements."""
    fn, now = function_node(helper_src), function_node(now_src)
    changed = changed_statements(now_src, old_src)
    site = _use_site(now, name) if now is not None else None
    if fn is None or site is None or changed is None:
        return False
    own = _code(fn)
    returns = [n for st in own for n in ast.walk(st) if isinstance(n, ast.Return)]
    if returns and (len(returns) > 1 or own[-1] is not returns[0] or not _computes(returns[0].value)):
        return False  # several ways out, or it hands back a name or a constant: nothing moved to compare
    body = [_substituted(st, _parameters(fn, site[1])) for st in own]
    value = body[-1].value if returns else None  # type: ignore[attr-defined]
    lost = changed[1]
    statements = body[:-1] if returns else body
    if not body or Counter(_key(u) for u in _units(statements)) - Counter(_key(u) for u in lost):
        return False
    return value is None or any(_key(n) == _key(value) for u in lost for n in ast.walk(u) if isinstance(n, ast.expr))


def lost_text(now_src: str, old_src: str, limit: int = 2) -> str:
    """The first statements the caller lost, as source (for evidence)."""
    changed = changed_statements(now_src, old_src)
    lost = [ast.unparse(u).splitlines()[0] for u in (changed[1] if changed else [])]
    return "; ".join(lost[:limit]) + ("; …" if len(lost) > limit else "")


def _units(body: list[ast.stmt]) -> list[ast.AST]:
    """Every statement of `body`, nested ones included, compound ones as their header only."""
    out: list[ast.AST] = []
    for st in body:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
            continue  # a docstring or a bare string: no behaviour
        inner = [
            f for f in ("body", "orelse", "handlers", "finalbody", "cases") if isinstance(getattr(st, f, None), list)
        ]
        if not inner:
            out.append(st)
            continue
        header = copy.copy(st)
        for f in inner:
            setattr(header, f, [])
        header._branches = st  # type: ignore[attr-defined]  # the statement it heads, for _guards
        out.append(header)
        for f in inner:
            for x in getattr(st, f):
                out += _units(x.body) if isinstance(x, (ast.ExceptHandler, ast.match_case)) else _units([x])
    return out


def _missing(a: list[ast.AST], b: list[ast.AST]) -> list[ast.AST]:
    """The units of `a` left once each unit of `b` has cancelled one equal unit of `a`."""
    left = Counter(_key(u) for u in b)
    out = []
    for u in a:
        k = _key(u)
        if left[k]:
            left[k] -= 1
        else:
            out.append(u)
    return out


def _key(node: ast.AST) -> str:
    return ast.dump(node)


def _computes(value: ast.expr | None) -> bool:
    return value is not None and not isinstance(value, (ast.Name, ast.Constant))


def _uses(node: ast.AST, name: str) -> bool:
    """The statement (a compound one: its header) calls or reads `name`, also as `obj.name`."""
    return any(
        (isinstance(n, ast.Name) and n.id == name) or (isinstance(n, ast.Attribute) and n.attr == name)
        for n in ast.walk(node)
    )


def _guards(node: ast.AST, name: str) -> bool:
    """A branch (`if`/`elif`) whose own body is nothing but statements that use `name`."""
    st = getattr(node, "_branches", None)
    return isinstance(st, ast.If) and bool(st.body) and all(_uses(u, name) for u in _units(st.body))


def _use_site(fn: Function, name: str) -> tuple[ast.AST, ast.expr] | None:
    """(statement, expression) of fn's first call of `name` (`name(...)`, `obj.name(...)`), else of its
    first read `obj.name` (a property)."""
    units = _units(fn.body)
    for wanted in (ast.Call, ast.Attribute):
        for u in units:
            for n in ast.walk(u):
                if isinstance(n, wanted) and _named(n, name):
                    return u, n
    return None


def _named(n: ast.expr, name: str) -> bool:
    target = n.func if isinstance(n, ast.Call) else n
    return (isinstance(target, ast.Name) and target.id == name) or (
        isinstance(target, ast.Attribute) and target.attr == name
    )


def _parameters(fn: Function, use: ast.expr) -> dict[str, ast.expr]:
    """{helper's parameter: the expression the call hands it} (defaults for those it leaves out; the
    object for `self`); empty where the call spreads `*args` / `**kwargs`."""
    a = fn.args
    params = [x.arg for x in (*a.posonlyargs, *a.args)]
    bound: dict[str, ast.expr] = {}
    owner = use if isinstance(use, ast.Attribute) else use.func if isinstance(use, ast.Call) else None
    if isinstance(owner, ast.Attribute) and params and params[0] in ("self", "cls"):
        bound[params.pop(0)] = owner.value  # `obj.helper(...)`: obj is its self
    if not isinstance(use, ast.Call):
        return bound
    if any(isinstance(x, ast.Starred) for x in use.args) or any(k.arg is None for k in use.keywords):
        return {}
    defaults = dict(zip(params[len(params) - len(a.defaults) :], a.defaults))
    defaults |= {k.arg: d for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
    bound |= defaults | dict(zip(params, use.args)) | {k.arg: k.value for k in use.keywords if k.arg}
    return bound


def _substituted(st: ast.stmt, bound: dict[str, ast.expr]) -> ast.stmt:
    """A copy of `st` with every read of a parameter replaced by the expression bound to it."""

    class Bind(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            return copy.deepcopy(bound[node.id]) if node.id in bound and isinstance(node.ctx, ast.Load) else node

    return Bind().visit(copy.deepcopy(st))


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
    plain assignments it depends on), in order; None if `target` is assigned more than once, a
    value it depends on comes out of a loop, a branch or a call statement, or one of them is changed
    in place by a statement the slice leaves out."""
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
    bound = {t for st in picked for t in _targets(st)}
    if any(_mutated(st) & bound for st in body if st not in picked):
        return None  # a value the slice computes is changed in place elsewhere (`caches.append(...)`)
    return picked


def _mutated(st: ast.stmt) -> set[str]:
    """Names whose object the statement may change in place: a method called on it for its effect,
    its value dropped (`xs.append(y)`), an item or attribute of it assigned or deleted (`xs[i] = y`)."""
    names: set[str] = set()
    for node in ast.walk(st):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
        ):
            base = node.value.func.value
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            base = node.value
        else:
            continue
        if isinstance(base, ast.Name):
            names.add(base.id)
    return names


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


def kept_call_version(now_src: str, old_src: str, name: str) -> str | None:
    """The caller's old version with its lines that now use `name` kept as they are now: its whole
    restore except the helper's use, so the helper's output feeds the value the old line computed.
    Lines are compared hunk by hunk (difflib): in a changed hunk, an old one-line assignment is replaced
    by the current line that names `name` and assigns the same target (each target once on each side);
    an inserted hunk of lines that all name it is kept; everything else is restored. None where no
    line is kept or the result does not parse."""
    now, old = now_src.splitlines(keepends=True), old_src.splitlines(keepends=True)
    word = re.compile(rf"\b{re.escape(name.rsplit('.', 1)[-1])}\b")
    out: list[str] = []
    kept = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, now, autojunk=False).get_opcodes():
        mine, theirs = old[i1:i2], now[j1:j2]
        if op == "insert" and all(word.search(line) for line in theirs):
            out, kept = out + theirs, kept + 1
            continue
        uses, targets = Counter(_target(b) for b in theirs), Counter(_target(a) for a in mine)
        for line in mine:
            t = _target(line)
            same = [b for b in theirs if t is not None and _target(b) == t and word.search(b)]
            if op == "replace" and same and uses[t] == 1 and targets[t] == 1:
                out, kept = out + same, kept + 1
            else:
                out.append(line)
    text = "".join(out)
    return text if kept and function_node(text) is not None and word.search(text) else None


def _target(line: str) -> str | None:
    """The target and operator of a one-line assignment (`x =`, `x +=`), else None."""
    m = re.match(r"\s*([\w.\[\]]+(?:\s*,\s*[\w.\[\]]+)*)\s*([-+*/|&]?=)(?!=)", line)
    return f"{m.group(1)} {m.group(2)}" if m else None


# ---- a class's own statements (field defaults, class attributes), apart from its methods -----------


def class_statements(source: str) -> list[str] | None:
    """The statements of a class's body that are not defs (dataclass fields, class attributes), as
    dumps, docstring aside; None where `source` is not one class."""
    cls = _class_node(source)
    if cls is None:
        return None
    return [_key(st) for st in _own_statements(cls)]


def class_statements_restored(now_src: str, old_src: str) -> str | None:
    """The class as it is now with its own statements (not its methods) those of `old_src`: the old
    statements first, in their order, then the current methods. None where either is not a class or
    the result does not parse."""
    now, old = _class_node(now_src), _class_node(old_src)
    if now is None or old is None or not now.body:
        return None
    now_lines, old_lines = textwrap.dedent(now_src).splitlines(), textwrap.dedent(old_src).splitlines()
    indent = " " * now.body[0].col_offset

    def text(lines: list[str], st: ast.stmt) -> list[str]:
        first = min([st.lineno, *(d.lineno for d in getattr(st, "decorator_list", []))])
        return [line[st.col_offset :] for line in lines[first - 1 : st.end_lineno or st.lineno]]

    body = [line for st in _docstring(old) + _own_statements(old) for line in text(old_lines, st)]
    methods = [line for st in now.body if _is_def(st) for line in ["", *text(now_lines, st)]]
    header = now_lines[: now.body[0].lineno - 1]
    result = "\n".join([*header, *(f"{indent}{x}" if x.strip() else "" for x in body + methods)]) + "\n"
    if _class_node(result) is None:
        return None
    outer = now_src[: len(now_src) - len(now_src.lstrip())].rpartition("\n")[2]  # a nested class's indent
    return "".join(f"{outer}{line}" if line.strip() else line for line in result.splitlines(keepends=True))


def _class_node(source: str) -> ast.ClassDef | None:
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)


def _is_def(st: ast.stmt) -> bool:
    return isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def _docstring(cls: ast.ClassDef) -> list[ast.stmt]:
    first = cls.body[0] if cls.body else None
    is_doc = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    return [first] if is_doc and first is not None else []


def _own_statements(cls: ast.ClassDef) -> list[ast.stmt]:
    return [st for st in cls.body if not _is_def(st) and st not in _docstring(cls)]


# ---- what a caller stopped handing on: its own change, whatever helper it now calls -----------------


def dropped_options(now_src: str, old_src: str, helper_srcs: list[str]) -> list[str]:
    """Keyword arguments that the statements the caller lost pass (`decode(ids, skip_special=True)`)
    and that no code of the caller now, nor of the helpers it now calls, names any more: an option the
    old code set that the new code no longer sets anywhere. Its own change, not the helper's."""
    changed = changed_statements(now_src, old_src)
    if changed is None:
        return []
    keywords = {k.arg for u in changed[1] for n in ast.walk(u) if isinstance(n, ast.Call) for k in n.keywords if k.arg}
    named = {w for text in (now_src, *helper_srcs) for w in re.findall(r"\w+", text)}
    return sorted(keywords - named)


def narrowed_arguments(now_src: str, old_src: str, name: str) -> list[str]:
    """Arguments of the caller's calls of `name` that are a part (`ids[-1:]`, `rows[0]`) of a value the
    statements it lost handed whole to a call: the caller now gives on less than the old code did."""
    now, changed = function_node(now_src), changed_statements(now_src, old_src)
    if now is None or changed is None:
        return []
    whole = {_key(a) for u in changed[1] for n in ast.walk(u) if isinstance(n, ast.Call) for a in _arguments(n)}
    out = []
    for n in ast.walk(now):
        if isinstance(n, ast.Call) and _named(n, name):
            out += [ast.unparse(a) for a in _arguments(n) if isinstance(a, ast.Subscript) and _key(a.value) in whole]
    return out


def _arguments(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(k.value for k in call.keywords)]


def moved_statements(helper_src: str, now_src: str, old_src: str) -> int:
    """How many of the helper's statements are statements its caller lost, names aside (a parameter
    renamed, a local called otherwise): a return counts where its value is an expression of one. A
    helper with none is new code; one made of them is the caller's code moved, whatever it now gets."""
    fn, changed = function_node(helper_src), changed_statements(now_src, old_src)
    if fn is None or changed is None:
        return 0
    lost = Counter(_shape(u) for u in changed[1])
    lost_values = {_shape(n) for u in changed[1] for n in ast.walk(u) if isinstance(n, ast.expr)}
    count = 0
    for u in _units(_code(fn)):
        if lost[_shape(u)]:
            lost[_shape(u)] -= 1
            count += 1
        elif (
            isinstance(u, ast.Return) and u.value is not None and _computes(u.value) and _shape(u.value) in lost_values
        ):
            count += 1
    return count


def _shape(node: ast.AST) -> str:
    """The node's dump with every plain name made the same: code compared up to renaming."""
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            n.id = "_"
        elif isinstance(n, ast.arg):
            n.arg = "_"
    return ast.dump(node)
