"""Fix templates: candidate one-edit repairs of a function, for the silent-bug patterns of real
engines (index off by one, mask comparison, missing fp32 up-cast, sign, swapped arguments,
wrong default, dropped term).

Each template is a pure function `Fn -> list[Edit]` over the function's tree-sitter syntax tree;
`fixes(source, …)` turns them into `(description, new_source)` pairs, one edit each, in order of
plausibility for the divergent component. A template only proposes: an edit counts only if a
re-probe of the failing scenario shows the divergence gone (tools/hypotheses/verify.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import tree_sitter as ts

# Parsed inside a dummy class so a method's indented text parses as it stands.
_HEADER = b"class _Fix:\n"


@dataclass(frozen=True)
class Edit:
    template: str
    description: str
    start: int  # byte offsets in the function's source
    end: int
    text: str
    line: int = 0  # 1-based line within the function, for ordering and the description


@dataclass(frozen=True)
class Fn:
    """A function's source and its syntax tree (offsets relative to `data`)."""

    data: bytes
    root: ts.Node  # the function_definition node
    shift: int  # bytes of header before `data` in the parsed text

    def text(self, node: ts.Node) -> str:
        return self.data[node.start_byte - self.shift : node.end_byte - self.shift].decode()

    def edit(self, template: str, node: ts.Node, text: str, description: str) -> Edit:
        start, end = node.start_byte - self.shift, node.end_byte - self.shift
        line = self.data[:start].count(b"\n") + 1
        return Edit(template, f"{description} (line {line})", start, end, text, line)

    def walk(self, *types: str) -> Iterator[ts.Node]:
        """Nodes of `types` in source order, nested function definitions included."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.type in types:
                yield node
            stack.extend(reversed(node.children))


def field(node: ts.Node, name: str) -> ts.Node:
    """A field the grammar always gives this node type (a call's `function`, an operator's `left`);
    tree-sitter's types leave every field optional."""
    found = node.child_by_field_name(name)
    if found is None:
        raise LookupError(f"a {node.type} node without `{name}`")
    return found


@functools.cache
def _parser() -> ts.Parser:
    import tree_sitter_python

    return ts.Parser(ts.Language(tree_sitter_python.language()))


def parse_function(source: str) -> Fn | None:
    """The function definition in `source` (a def, possibly indented and decorated), or None."""
    data = source.encode()
    indented = data[:1].isspace()
    text = (_HEADER + data) if indented else data
    tree = _parser().parse(text)
    if tree.root_node.has_error:
        return None
    shift = len(_HEADER) if indented else 0
    found = next((n for n in Fn(data, tree.root_node, shift).walk("function_definition")), None)
    return Fn(data, found, shift) if found is not None else None


def apply_edit(source: str, edit: Edit) -> str:
    data = source.encode()
    return (data[: edit.start] + edit.text.encode() + data[edit.end :]).decode()


# ---- templates ----------------------------------------------------------------------------------


def off_by_one(fn: Fn) -> list[Edit]:
    """Slice bounds, indices and range() ends moved by one; an explicit `± 1` dropped."""
    edits = []
    for node in fn.walk("slice", "subscript", "call"):
        for bound in _bounds(fn, node):
            text = fn.text(bound)
            if _plus_minus_one(fn, bound):
                continue  # dropping the ±1 is the edit below
            if bound.type == "integer":
                value = int(text, 0)
                alternatives = [str(value + 1), str(value - 1)]
            else:
                alternatives = [f"{_paren(bound, text)} + 1", f"{_paren(bound, text)} - 1"]
            edits += [fn.edit("off-by-one", bound, alt, f"`{text}` -> `{alt}`") for alt in alternatives]
    for node in fn.walk("binary_operator"):
        if _plus_minus_one(fn, node):
            left = fn.text(field(node, "left"))
            edits.append(fn.edit("off-by-one", node, left, f"`{fn.text(node)}` -> `{left}`"))
    return edits


def _plus_minus_one(fn: Fn, node: ts.Node) -> bool:
    if node.type != "binary_operator":
        return False
    op, right = field(node, "operator"), field(node, "right")
    return op.type in ("+", "-") and right.type == "integer" and fn.text(right) == "1"


def _bounds(fn: Fn, node: ts.Node) -> list[ts.Node]:
    """The index-like expressions of a slice, a plain subscript or a range(...) call."""
    if node.type == "slice":
        return [c for c in node.named_children if c.type != "comment"]
    if node.type == "subscript":
        subs = node.children_by_field_name("subscript")
        return [s for s in subs if s.type in ("integer", "identifier", "binary_operator", "unary_operator")]
    if node.type == "call" and fn.text(field(node, "function")) == "range":
        args = [a for a in field(node, "arguments").named_children if a.type != "keyword_argument"]
        return args[:2] if len(args) >= 2 else args
    return []


COMPARISON_SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}


def mask_comparison(fn: Fn) -> list[Edit]:
    """`<` <-> `<=`, `>` <-> `>=`: the causal / window / padding boundary one position off."""
    edits = []
    for node in fn.walk("comparison_operator"):
        for op in node.children:
            if op.type in COMPARISON_SWAPS:
                new = COMPARISON_SWAPS[op.type]
                desc = f"`{fn.text(node)}`: `{op.type}` -> `{new}`"
                edits.append(fn.edit("mask-comparison", op, new, desc))
    return edits


UPCAST_OPS = ("exp", "pow", "softmax", "log_softmax", "rsqrt", "sqrt", "norm", "mean", "var", "logsumexp", "cumsum")


def upcast(fn: Fn) -> list[Edit]:
    """The tensor an exp/pow/norm/softmax reads up-cast to fp32, the statement's result cast back."""
    edits = []
    for node in fn.walk("call"):
        func = field(node, "function")
        if func.type != "attribute" or fn.text(field(func, "attribute")) not in UPCAST_OPS:
            continue
        receiver = field(func, "object")
        operand = receiver if fn.text(receiver) not in ("torch", "F", "torch.nn.functional") else _first_arg(node)
        if operand is None or fn.text(operand).endswith(".float()"):
            continue
        statement = _statement_value(node)
        if statement is None:
            continue
        before = fn.text(operand)
        inner = _replace_within(fn, statement, operand, f"{_paren(operand, before)}.float()")
        cast = f"({inner}).to({_paren(operand, before)}.dtype)"
        desc = f"up-cast `{before}` to fp32 before `{fn.text(field(func, 'attribute'))}`, cast back"
        edits.append(fn.edit("upcast", statement, cast, desc))
    return edits


def _first_arg(call: ts.Node) -> ts.Node | None:
    args = [a for a in field(call, "arguments").named_children if a.type != "keyword_argument"]
    return args[0] if args else None


def _statement_value(node: ts.Node) -> ts.Node | None:
    """The right-hand side of the assignment or return that holds `node` (a single value)."""
    while node.parent is not None:
        parent = node.parent
        if parent.type == "assignment" and parent.child_by_field_name("right") == node:
            return node if node.type != "expression_list" else None
        if parent.type == "return_statement":
            return node if node.type != "expression_list" else None
        if parent.type in ("block", "module", "function_definition", "lambda"):
            return None
        node = parent
    return None


def _replace_within(fn: Fn, outer: ts.Node, inner: ts.Node, text: str) -> str:
    whole = fn.text(outer)
    at = inner.start_byte - outer.start_byte
    return (whole.encode()[:at] + text.encode() + whole.encode()[at + inner.end_byte - inner.start_byte :]).decode()


def sign(fn: Fn) -> list[Edit]:
    """A negated term un-negated, `a - b` <-> `a + b`, `a * b` <-> `a / b` for a scalar-looking b."""
    edits = []
    for node in fn.walk("unary_operator"):
        if field(node, "operator").type == "-":
            arg = fn.text(field(node, "argument"))
            if field(node, "argument").type not in ("integer", "float"):
                edits.append(fn.edit("sign", node, arg, f"`{fn.text(node)}` -> `{arg}`"))
    for node in fn.walk("binary_operator", "augmented_assignment"):
        op = field(node, "operator")
        swap = {"-": "+", "+": "-", "-=": "+=", "+=": "-=", "*": "/", "/": "*", "*=": "/=", "/=": "*="}.get(op.type)
        if swap is None or (op.type.startswith("+") and _is_string_concat(fn, node)):
            continue
        edits.append(fn.edit("sign", op, swap, f"`{fn.text(node)[:60]}`: `{op.type}` -> `{swap}`"))
    return edits


POW2_OPS = {">>": "//", "<<": "*", "&": "%"}


def power_of_two(fn: Fn) -> list[Edit]:
    """A bit trick that holds only for a power of two, spelled out: `a >> (n.bit_length() - 1)` ->
    `a // n`, `a << (…)` -> `a * n`, `a & (n - 1)` -> `a % n` (a group, block or head count that
    need not be a power of two)."""
    edits = []
    for node in fn.walk("binary_operator"):
        op, right = field(node, "operator").type, _unparen(field(node, "right"))
        if op not in POW2_OPS:
            continue
        n = _log2_of(fn, right) if op != "&" else _minus_one_of(fn, right)
        if n is None:
            continue
        left = field(node, "left")
        new = f"{_paren(left, fn.text(left))} {POW2_OPS[op]} {n}"
        if node.parent is not None and node.parent.type in ("binary_operator", "unary_operator"):
            new = f"({new})"
        edits.append(fn.edit("power-of-two", node, new, f"`{fn.text(node)}` -> `{new}`"))
    return edits


def _unparen(node: ts.Node) -> ts.Node:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return node


def _log2_of(fn: Fn, node: ts.Node) -> str | None:
    """`n` of `n.bit_length() - 1` or `int(math.log2(n))` (parenthesized as it stands), else None."""
    if node.type == "binary_operator" and _plus_minus_one(fn, node) and field(node, "operator").type == "-":
        call = _unparen(field(node, "left"))
        if call.type == "call" and fn.text(field(call, "function")).endswith(".bit_length"):
            obj = field(field(call, "function"), "object")
            return _paren(obj, fn.text(obj))
    if node.type == "call" and fn.text(field(node, "function")) == "int":
        inner = _first_arg(node)
        if inner is not None and inner.type == "call" and fn.text(field(inner, "function")).endswith("log2"):
            arg = _first_arg(inner)
            return _paren(arg, fn.text(arg)) if arg is not None else None
    return None


def _minus_one_of(fn: Fn, node: ts.Node) -> str | None:
    """`n` of `n - 1` (a mask), else None."""
    if node.type == "binary_operator" and _plus_minus_one(fn, node) and field(node, "operator").type == "-":
        left = field(node, "left")
        return _paren(left, fn.text(left)) if left.type != "integer" else None
    return None


def _is_string_concat(fn: Fn, node: ts.Node) -> bool:
    return any(c.type in ("string", "concatenated_string") for c in node.named_children)


def swapped_arguments(fn: Fn) -> list[Edit]:
    """Two neighbouring positional arguments of a call exchanged."""
    edits = []
    for node in fn.walk("call"):
        args = field(node, "arguments")
        if args.type != "argument_list":
            continue
        positional = [a for a in args.named_children if a.type not in ("keyword_argument", "comment")]
        positional = [a for a in positional if a.type not in ("list_splat", "dictionary_splat")]
        for a, b in zip(positional, positional[1:]):
            if fn.text(a) == fn.text(b):
                continue
            span = fn.data[a.start_byte - fn.shift : b.end_byte - fn.shift].decode()
            swapped = fn.text(b) + span[len(fn.text(a)) : len(span) - len(fn.text(b))] + fn.text(a)
            call = fn.text(field(node, "function"))
            edit = Edit(
                "swapped-arguments",
                f"`{call}(…)`: `{fn.text(a)}` <-> `{fn.text(b)}`",
                a.start_byte - fn.shift,
                b.end_byte - fn.shift,
                swapped,
            )
            line = fn.data[: edit.start].count(b"\n") + 1
            edits.append(Edit(edit.template, f"{edit.description} (line {line})", edit.start, edit.end, swapped, line))
    return edits


def literal_alternatives(text: str, in_default: bool) -> list[str]:
    """Common slips for a numeric literal: eps 1e-5 <-> 1e-6, a base of 10000, 0 <-> 1 (defaults only)."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        return []
    if 0 < value < 0.01:
        return [f"{value * 10:g}", f"{value / 10:g}"]
    if value >= 1000:
        return [
            f"{alt:g}" if "." in text or "e" in text else str(int(alt))
            for alt in (10000.0, 1000000.0, 500000.0)
            if alt != value
        ]
    if in_default and value in (0.0, 1.0):
        other = 1 - value
        return [str(int(other)) if text.isdigit() else f"{other:.1f}"]
    if in_default and "." in text and value not in (0.0, 1.0):
        return ["1.0", "0.0"]
    return []


def wrong_default(fn: Fn) -> list[Edit]:
    """A numeric literal in a default or in the body replaced by a common alternative."""
    edits = []
    for node in fn.walk("integer", "float"):
        in_default = node.parent is not None and node.parent.type in ("default_parameter", "typed_default_parameter")
        text = fn.text(node)
        for alt in literal_alternatives(text, in_default):
            where = "default" if in_default else "constant"
            edits.append(fn.edit("wrong-default", node, alt, f"{where} `{text}` -> `{alt}`"))
    for node in fn.walk("true", "false"):
        if node.parent is not None and node.parent.type in ("default_parameter", "typed_default_parameter"):
            alt = "False" if node.type == "true" else "True"
            edits.append(fn.edit("wrong-default", node, alt, f"default `{fn.text(node)}` -> `{alt}`"))
    return edits


def dropped_term(fn: Fn) -> list[Edit]:
    """A parameter the body never reads (a residual, bias, offset) added back to the returned value."""
    params = _parameter_names(fn)
    body = field(fn.root, "body")
    used = {fn.text(n) for n in Fn(fn.data, body, fn.shift).walk("identifier")}
    unused = [p for p in params if p not in used and p not in ("self", "cls")]
    edits = []
    for ret in fn.walk("return_statement"):
        value = next(iter(ret.named_children), None)
        if value is None or value.type == "expression_list":
            continue
        for p in unused:
            new = f"{_paren(value, fn.text(value))} + {p}"
            edits.append(fn.edit("dropped-term", value, new, f"`return {fn.text(value)[:40]}` -> `… + {p}`"))
    return edits


def stale_value(fn: Fn) -> list[Edit]:
    """`x = f(v)` moved after the next statement that rebinds `v` (`v = g(v)`): a value taken from
    its input before the update it should see (probabilities before temperature, a length before
    the append). Only where nothing in between reads or rebinds `x`."""
    edits = []
    for block in fn.walk("block"):
        stmts = [c for c in block.named_children if c.type != "comment"]
        for i, stmt in enumerate(stmts):
            target, reads = _simple_assignment(fn, stmt)
            if target is None:
                continue
            for j in range(i + 1, len(stmts)):
                if target in _identifiers(fn, stmts[j]):
                    break  # `x` is used (or rebound) before any update: moving it would change that
                rebound, _ = _simple_assignment(fn, stmts[j])
                if rebound is not None and rebound in reads:
                    edits.append(_move_after(fn, stmt, stmts[j], target, rebound))
                    break
    return edits


def _simple_assignment(fn: Fn, stmt: ts.Node) -> tuple[str | None, set[str]]:
    """(name, names its value reads) for `name = value` or `name op= value`; (None, set()) else."""
    node = stmt.named_children[0] if stmt.type == "expression_statement" and stmt.named_children else None
    if node is None or node.type not in ("assignment", "augmented_assignment"):
        return None, set()
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if left is None or right is None or left.type != "identifier":
        return None, set()
    reads = _identifiers(fn, right) | ({fn.text(left)} if node.type == "augmented_assignment" else set())
    return fn.text(left), reads


def _identifiers(fn: Fn, node: ts.Node) -> set[str]:
    """Plain names a node reads or binds (`a.b` counts `a`, not `b`)."""
    return {fn.text(n) for n in Fn(fn.data, node, fn.shift).walk("identifier") if not _is_attribute_name(n)}


def _is_attribute_name(node: ts.Node) -> bool:
    parent = node.parent
    return (
        parent is not None
        and parent.type in ("attribute", "keyword_argument")
        and parent.child_by_field_name("attribute" if parent.type == "attribute" else "name") == node
    )


def _move_after(fn: Fn, stmt: ts.Node, update: ts.Node, target: str, rebound: str) -> Edit:
    """One edit over stmt..update: the statements after `stmt` first, then `stmt` at its indent."""
    start, end = stmt.start_byte - fn.shift, update.end_byte - fn.shift
    rest = fn.data[stmt.next_sibling.start_byte - fn.shift if stmt.next_sibling else end : end]
    line_start = fn.data.rfind(b"\n", 0, start) + 1
    indent = fn.data[line_start:start].decode()
    text = rest.decode().lstrip() + "\n" + indent + fn.text(stmt)
    line = fn.data[:start].count(b"\n") + 1
    desc = f"`{target} = …` after `{rebound}` is updated (line {line})"
    return Edit("stale-value", desc, start, end, text, line)


def memo_guard(fn: Fn) -> list[Edit]:
    """`if <compares with self.a>: … self.a = …`: a memo that skips work when a remembered value
    is unchanged, run every time (a cache keyed on too little serves stale results)."""
    edits = []
    for node in fn.walk("if_statement"):
        cond, body = node.child_by_field_name("condition"), node.child_by_field_name("consequence")
        if cond is None or body is None or node.child_by_field_name("alternative") is not None:
            continue
        remembered = {fn.text(a) for a in Fn(fn.data, cond, fn.shift).walk("attribute")}
        assigned = {
            fn.text(left)
            for a in Fn(fn.data, body, fn.shift).walk("assignment")
            if (left := a.child_by_field_name("left")) is not None and left.type == "attribute"
        }
        if remembered & assigned:
            key = sorted(remembered & assigned)[0]
            edits.append(fn.edit("memo-guard", cond, "True", f"`if {fn.text(cond)[:50]}` always (memo on {key})"))
    return edits


def prefix_rows(fn: Fn) -> list[Edit]:
    """`x[:n]` where n is the count of an index parameter `rows` (`len(rows)`, `rows.numel()`,
    `rows.shape[0]`, `rows.size(0)`, inline or bound to a name) -> `x[rows]`: the first n rows taken
    for the n rows the parameter names (a subset of a batch read as its prefix)."""
    params = [p for p in _parameter_names(fn) if p not in ("self", "cls")]
    counts = {
        f"{form}".format(p=p): p for p in params for form in ("len({p})", "{p}.numel()", "{p}.shape[0]", "{p}.size(0)")
    }
    for node in fn.walk("assignment"):
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is not None and right is not None and left.type == "identifier":
            if (p := counts.get(fn.text(right).replace(" ", ""))) is not None:
                counts[fn.text(left)] = p
    by_param: dict[str, list[ts.Node]] = {}
    for node in fn.walk("slice"):
        text = fn.text(node).replace(" ", "")
        if text.startswith(":") and (p := counts.get(text[1:])) is not None:
            by_param.setdefault(p, []).append(node)
    edits = []
    for p, slices in by_param.items():  # every prefix of the same count at once: one slip, made throughout
        start, end = slices[0].start_byte - fn.shift, slices[-1].end_byte - fn.shift
        text, at = "", start
        for node in slices:
            text += fn.data[at : node.start_byte - fn.shift].decode() + p
            at = node.end_byte - fn.shift
        line = fn.data[:start].count(b"\n") + 1
        desc = f"`[{fn.text(slices[0])}]` -> `[{p}]`, {len(slices)} time(s) (line {line})"
        edits.append(Edit("prefix-rows", desc, start, end, text, line))
    return edits


def aliased_output(fn: Fn) -> list[Edit]:
    """`out = x` (x a parameter) where the body then assigns into `out[...]` -> `out = x.clone()`:
    an output written into its own input, so a later read of the input sees the values already
    written (the second half of a rotation computed from the overwritten first half)."""
    params = set(_parameter_names(fn)) - {"self", "cls"}
    stored = {
        fn.text(field(left, "value"))
        for a in fn.walk("assignment", "augmented_assignment")
        if (left := a.child_by_field_name("left")) is not None and left.type == "subscript"
    }
    edits = []
    for node in fn.walk("assignment"):
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None or left.type != "identifier" or right.type != "identifier":
            continue
        name, source = fn.text(left), fn.text(right)
        if source in params and name in stored:
            edits.append(fn.edit("aliased-output", right, f"{source}.clone()", f"`{name} = {source}` -> a copy"))
    return edits


def _parameter_names(fn: Fn) -> list[str]:
    params = field(fn.root, "parameters")
    names = []
    for p in params.named_children:
        ident = p if p.type == "identifier" else next((c for c in p.named_children if c.type == "identifier"), None)
        if ident is not None and p.type in (
            "identifier",
            "default_parameter",
            "typed_parameter",
            "typed_default_parameter",
        ):
            names.append(fn.text(ident))
    return names


def _paren(node: ts.Node, text: str) -> str:
    simple = ("identifier", "attribute", "integer", "float", "call", "subscript", "parenthesized_expression")
    return text if node.type in simple else f"({text})"


TEMPLATES: dict[str, Callable[[Fn], list[Edit]]] = {
    "off-by-one": off_by_one,
    "mask-comparison": mask_comparison,
    "upcast": upcast,
    "sign": sign,
    "swapped-arguments": swapped_arguments,
    "wrong-default": wrong_default,
    "dropped-term": dropped_term,
    "stale-value": stale_value,
    "memo-guard": memo_guard,
    "power-of-two": power_of_two,
    "prefix-rows": prefix_rows,
    "aliased-output": aliased_output,
}

# Which patterns a divergent component most often hides, most likely first (silent-bugs.md).
COMPONENT_TEMPLATES = {
    "attention": (
        "mask-comparison",
        "off-by-one",
        "upcast",
        "wrong-default",
        "swapped-arguments",
        "sign",
        "power-of-two",
    ),
    "rotary": ("wrong-default", "off-by-one", "upcast", "sign", "swapped-arguments"),
    "norm": ("upcast", "wrong-default", "dropped-term", "sign", "off-by-one"),
    "residual": ("dropped-term", "sign", "upcast", "swapped-arguments"),
    "activation": ("upcast", "sign", "swapped-arguments", "wrong-default"),
    "sampler": ("off-by-one", "mask-comparison", "sign", "wrong-default", "upcast", "swapped-arguments"),
    "lm_head": ("wrong-default", "upcast", "sign", "off-by-one"),
}
DEFAULT_ORDER = tuple(TEMPLATES)


def proposals(template: Callable[[Fn], list[Edit]], fn: Fn) -> list[Edit]:
    """A template's edits; none where the tree lacks a field the grammar promises (a parse of odd code)."""
    try:
        return template(fn)
    except LookupError:
        return []


def fixes(source: str, component: str | None = None, templates: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """`source` (one function) -> [(description, new source)], one edit each, most plausible first.

    Templates take turns (the first edit of each, then the second, …) in the component's order,
    so a capped budget still tries every pattern; an edit that does not parse is dropped."""
    fn = parse_function(source)
    if fn is None:
        return []
    names = templates or COMPONENT_TEMPLATES.get(component or "", DEFAULT_ORDER)
    names = tuple(names) + tuple(t for t in DEFAULT_ORDER if t not in names and templates is None)
    queues = [proposals(TEMPLATES[name], fn) for name in names]
    out, seen = [], {source}
    for turn in range(max((len(q) for q in queues), default=0)):
        for queue in queues:
            if turn < len(queue):
                new = apply_edit(source, queue[turn])
                if new not in seen and parse_function(new) is not None:
                    seen.add(new)
                    out.append((f"{queue[turn].template}: {queue[turn].description}", new))
    return out
