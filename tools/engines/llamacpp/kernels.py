"""Which CPU function computes a ggml op, read from the tree under test (not a hand list that goes stale).

ggml-cpu.c's `ggml_compute_forward` switches on the op (`case GGML_OP_RMS_NORM:` ->
`ggml_compute_forward_rms_norm`), and that dispatcher usually switches again on the source type,
the unary or the glu op (`case GGML_TYPE_F32:` -> `ggml_compute_forward_rms_norm_f32`). Following the
case labels that match one op call down to the last function defined in ggml-cpu names the kernel.
Definitions come from the source index's parser (tools/source/index.py), so the names are the ones
the index, the hypotheses and the restores use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import tree_sitter as ts

from tools.source.index import Symbol, parse_file

ENTRY = "ggml_compute_forward"  # ggml-cpu.c: the op switch every graph node goes through
SOURCE_SUFFIXES = (".c", ".cpp")


@dataclass(frozen=True)
class Kernel:
    file: str  # relative to the tree's root
    function: str  # the function that computes the op (the deepest dispatch target)
    chain: tuple[str, ...]  # the dispatchers from ENTRY down to it
    helpers: tuple[str, ...] = ()  # the op's own functions it calls, two calls deep (rotate_pairs, ...)


def find_cpu_dir(root: Path) -> Path | None:
    """The ggml-cpu source folder under a llama.cpp tree (vendored or not), skipping build outputs."""
    for hit in sorted(root.rglob("ggml-cpu/ggml-cpu.c"), key=lambda p: len(p.parts)):
        if not any(part.startswith(("build", ".")) for part in hit.relative_to(root).parts):
            return hit.parent
    return None


@functools.cache
def _parser() -> ts.Parser:
    import tree_sitter_cpp

    return ts.Parser(ts.Language(tree_sitter_cpp.language()))


@dataclass
class CpuSource:
    """The ggml-cpu functions of one tree: definitions and their case -> callee dispatch tables."""

    root: Path
    functions: dict[str, Symbol]
    texts: dict[str, bytes]
    calls: dict[str, list[str]]  # function -> short names it calls (the index's edges)

    def dispatch(self, name: str) -> dict[str, str]:
        """`case LABEL:` -> the first `ggml_compute_forward*` function defined here that the case calls
        (helpers such as `rotate_pairs` are the kernel's parts, not another dispatch level)."""
        sym = self.functions[name]
        text = b"\n".join(self.texts[sym.file].splitlines()[sym.start_line - 1 : sym.end_line])
        table: dict[str, str] = {}
        pending: list[str] = []
        for case in _nodes(_parser().parse(text).root_node, "case_statement"):
            value = case.child_by_field_name("value")
            if value is not None:
                pending.append(_text(value))
            callee = next((c for c in _calls(case) if c in self.functions and c.startswith(ENTRY) and c != name), None)
            if callee is not None:
                table.update({label: callee for label in pending})
                pending = []
        return table

    def kernel(self, op: str, keys: tuple[str, ...]) -> Kernel | None:
        """The function computing GGML_OP_<op>, following the cases among `keys` (GGML_TYPE_F32, ...)
        and any switch that has a single target."""
        if ENTRY not in self.functions:
            return None
        chain = [ENTRY]
        current = self.dispatch(ENTRY).get(f"GGML_OP_{op}")
        while current is not None and current not in chain:
            chain.append(current)
            table = self.dispatch(current)
            only = set(table.values())  # a switch whose every case goes one way (a precision switch)
            current = next((table[k] for k in keys if k in table), only.pop() if len(only) == 1 else None)
        if len(chain) == 1:
            return None
        return Kernel(
            self.functions[chain[-1]].file, chain[-1], tuple(chain[1:-1]), self.helpers(chain[-1], tuple(chain[:-1]))
        )

    def helpers(self, name: str, chain: tuple[str, ...] = (), depth: int = 2, max_callers: int = 3) -> tuple[str, ...]:
        """What the kernel computes the op with: functions defined here that it calls, `depth` calls
        deep, that are the op's own. A callee is the op's own when it is handed the op's tensor (a
        chunk worker, the routine a thin forward delegates to; few others call it) or when only the
        op's functions call it (rotate_pairs for rope). A routine that other ops call too on rows or
        pointers (a fp16 -> fp32 converter, a thread barrier) is plumbing: naming it as a suspect of
        every op that uses it is noise that outranks the op's own parts."""
        callers = self.callers()
        family = {name, ENTRY, *chain}
        found: list[str] = []
        frontier = [name]
        for _ in range(depth):
            level = []
            for f in frontier:
                handed = self.handed_tensor(f)
                for c in dict.fromkeys(self.calls.get(f, [])):
                    if c not in self.functions or c in family or c in level:
                        continue
                    own = callers.get(c, set()) <= family
                    if own or (c in handed and len(callers.get(c, ())) <= max_callers):
                        level.append(c)
            family.update(level)
            found += level
            frontier = level
        return tuple(found)

    def callers(self) -> dict[str, set[str]]:
        """Function -> the functions here that call it."""
        out: dict[str, set[str]] = {}
        for caller, names in self.calls.items():
            for c in names:
                out.setdefault(c, set()).add(caller)
        return out

    def handed_tensor(self, name: str) -> set[str]:
        """Callees of `name` given one of its `ggml_tensor *` parameters as an argument (the op's own
        input or output), as opposed to row pointers or counts."""
        sym = self.functions[name]
        text = b"\n".join(self.texts[sym.file].splitlines()[sym.start_line - 1 : sym.end_line])
        root = _parser().parse(text).root_node
        tensors = {_text(d) for d in _tensor_parameters(root)}
        out = set()
        for call in _nodes(root, "call_expression"):
            fn, args = call.child_by_field_name("function"), call.child_by_field_name("arguments")
            if fn is not None and args is not None and any(_text(a) in tensors for a in args.named_children):
                if fn.type == "template_function":
                    fn = fn.child_by_field_name("name") or fn
                out.add(_text(fn))
        return out


def _tensor_parameters(root: ts.Node):
    """The identifiers of the first function's `ggml_tensor` pointer parameters."""
    declarator = next(_nodes(root, "function_declarator"), None)
    params = declarator.child_by_field_name("parameters") if declarator is not None else None
    for p in params.named_children if params is not None else ():
        if p.type == "parameter_declaration" and "ggml_tensor" in _text(p.child_by_field_name("type") or p):
            ident = next(_nodes(p.child_by_field_name("declarator") or p, "identifier"), None)
            if ident is not None:
                yield ident


def _nodes(node: ts.Node, kind: str):
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == kind:
            yield n
        stack.extend(reversed(n.children))


def _calls(node: ts.Node) -> list[str]:
    """Short names called inside a case, in source order (`f<T>(…)` -> f)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            if fn is not None:
                if fn.type == "template_function":
                    fn = fn.child_by_field_name("name") or fn
                out.append(_text(fn))
        stack.extend(reversed([c for c in n.children if n.type != "case_statement" or c.type != "case_statement"]))
    return out


def _text(node: ts.Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


@functools.lru_cache(maxsize=4)
def cpu_source(root: Path) -> CpuSource | None:
    cpu = find_cpu_dir(root)
    if cpu is None:
        return None
    functions: dict[str, Symbol] = {}
    texts: dict[str, bytes] = {}
    calls: dict[str, list[str]] = {}
    for path in sorted(p for p in cpu.iterdir() if p.suffix in SOURCE_SUFFIXES):
        rel = path.relative_to(root).as_posix()
        texts[rel] = path.read_bytes()
        symbols, edges = parse_file(rel, texts[rel], "cpp")
        for sym in symbols:
            if sym.kind == "function":
                functions.setdefault(sym.qualname, sym)
        for qualname, names in edges.items():
            calls.setdefault(qualname, names)
    return CpuSource(root, functions, texts, calls)


def dispatch_keys(src0_type: str, sub: str) -> tuple[str, ...]:
    """The case labels one op call takes: its first source's type, its unary / glu op."""
    keys = [f"GGML_TYPE_{src0_type.upper()}"] if src0_type else []
    if sub:
        keys += [f"GGML_UNARY_OP_{sub}", f"GGML_GLU_OP_{sub}"]
    return tuple(keys)


@functools.lru_cache(maxsize=256)
def cpu_kernel(root: Path, op: str, src0_type: str = "f32", sub: str = "") -> Kernel | None:
    """(file, function) that computes a ggml op on the CPU in the tree at `root`; None if not found."""
    source = cpu_source(root.resolve())
    return None if source is None else source.kernel(op, dispatch_keys(src0_type, sub))
