"""A tree-sitter index of an engine's source: symbols, call edges, diff hunks -> functions.

Python, C (`.c`) and C++/CUDA (`.cpp .cc .cu .cuh .h .hpp`). Qualified names follow docs/design.md §5:
`Class.method`, `function`, nested `outer.inner`; C++ uses the same dots (`Foo::bar` is
`Foo.bar`, namespaces are left out as Python leaves out the module), and `find` accepts
either spelling. Lines are 1-based and inclusive; a decorated or templated definition
starts at its first decorator / `template` line, so a change there maps to it.

Parsing runs tree-sitter queries (through `QueryCursor`, in C) and one sorted sweep per
file in Python, so a 10k-line tree indexes in well under a second. CUDA qualifiers
(`__global__`, `__launch_bounds__(…)`) and launch configs (`<<<…>>>`) are blanked out before
parsing, byte for byte, so kernels parse as plain functions and launches as plain calls.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import os
import pickle
import re
import textwrap
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import tree_sitter as ts

from tools.history.gitrepo import GitError, parse_unified_diff, resolve, tree_files

LANGUAGES = {
    ".py": "python",
    ".c": "c",
    ".cpp": "cpp",
    ".cc": "cpp",
    ".cu": "cpp",
    ".cuh": "cpp",
    ".h": "cpp",
    ".hpp": "cpp",
}
SKIP_DIRS = {
    ".git",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    ".venv",
    "venv",
    "node_modules",
    ".eggs",
}
TEST_DIRS = {"tests", "test"}
MAX_FILE_BYTES = 2_000_000  # larger sources are generated tables, not logic

QUERIES = {
    "python": """
        (function_definition name: (identifier) @name) @function
        (class_definition name: (identifier) @name) @class
        (call function: [(identifier) @call (attribute attribute: (identifier) @call)])
    """,
    "cpp": """
        (function_definition declarator: (_) @name) @function
        (class_specifier name: (_) @name body: (_)) @class
        (struct_specifier name: (_) @name body: (_)) @class
        (call_expression function: (_) @call)
    """,
    "c": """
        (function_definition declarator: (_) @name) @function
        (struct_specifier name: (_) @name body: (_)) @class
        (call_expression function: (_) @call)
    """,
}
_CUDA_NOISE = re.compile(
    rb"\b__(?:global|device|host|forceinline|noinline|shared|constant|managed"
    rb"|restrict)__\b|\b__launch_bounds__\s*\([^)]*\)|<<<.*?>>>",
    re.S,
)
_IDENT = re.compile(r"[A-Za-z_~][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Symbol:
    name: str  # short name: `allocate`
    qualname: str  # `BlockManager.allocate`
    kind: str  # function | method | class
    file: str  # relative to the index root, posix separators
    start_line: int  # 1-based, inclusive, decorators / template header included
    end_line: int
    doc: str  # first line of the docstring / leading comment, "" if none
    hash: str  # sha1 of the definition's text (spots an edited body across commits)
    language: str  # python | cpp

    def contains(self, line: int) -> bool:
        return self.start_line <= line <= self.end_line


@dataclass(frozen=True)
class Change:
    """Changed lines of one diff, grouped by the innermost enclosing symbol."""

    file: str
    symbol: Symbol | None  # None: module level (imports, constants, top-level code)
    lines: tuple[int, ...]  # new-side line numbers for side "new", old-side for side "old"
    side: str  # new | old

    @property
    def module_level(self) -> bool:
        return self.symbol is None


class SourceIndex(Protocol):
    def find(self, name: str) -> list[Symbol]: ...

    def read(self, symbol: Symbol) -> str: ...

    def search(self, query: str, limit: int = 20) -> list[Symbol]: ...

    def callers(self, name: str) -> list[Symbol]: ...

    def callees(self, symbol: Symbol) -> list[str]: ...

    def symbols_for_hunks(self, diff_text: str) -> list[Change]: ...


# --- parsing one file (pure: bytes in, symbols out) ---------------------------------------------


def _query(language: str) -> tuple[ts.Parser, ts.Query]:
    """This thread's parser and query for `language` (a parser is not to be shared between threads:
    prefetch_index parses in one of its own)."""
    import tree_sitter_c
    import tree_sitter_cpp
    import tree_sitter_python

    made = _THREAD.__dict__.setdefault("queries", {})
    if language not in made:
        module = {"python": tree_sitter_python, "cpp": tree_sitter_cpp, "c": tree_sitter_c}[language]
        lang = ts.Language(module.language())
        made[language] = ts.Parser(lang), ts.Query(lang, QUERIES[language])
    return made[language]


_THREAD = threading.local()


def parse_file(path: str, data: bytes, language: str) -> tuple[list[Symbol], dict[str, list[str]]]:
    """One file's bytes -> (symbols, calls per qualname). Calls are short callee names."""
    parser, query = _query(language)
    clean = _CUDA_NOISE.sub(lambda m: re.sub(rb"[^\n]", b" ", m.group()), data) if language == "cpp" else data
    root = parser.parse(clean).root_node
    defs, calls = [], []
    for _pattern, caps in ts.QueryCursor(query).matches(root):
        if "call" in caps:
            calls.extend(caps["call"])
        elif "name" in caps:
            kind_node = (caps["function"] if "function" in caps else caps["class"])[0]
            defs.append((kind_node, caps["name"][0], "class" if "class" in caps else "function"))
    return _sweep(path, data, language, defs, calls)


PARSED_FILES_KEPT = 16384  # a transformers tree is ~3000 indexed files: a few trees' worth


def parsed(path: str, data: bytes, language: str) -> tuple[list[Symbol], dict[str, list[str]]]:
    """parse_file, remembered by (path, language, content hash) for every index this process builds:
    a diagnosis indexes the tree, then a commit and its parent, which share nearly all their files, and
    parsing is most of an index's cost (minutes for a transformers tree on a loaded machine). The
    result is parse_file's for those bytes, shared: Symbols are frozen, and no index changes its lists."""
    key = (path, language, hashlib.sha1(data).digest())
    hit = _PARSED.get(key)
    if hit is None:
        hit = _PARSED[key] = _parsed_on_disk(key, lambda: parse_file(path, data, language))
        if len(_PARSED) > PARSED_FILES_KEPT:
            _PARSED.popitem(last=False)
    else:
        _PARSED.move_to_end(key)
    return hit


def _parsed_on_disk(key: tuple[str, str, bytes], parse: Any) -> tuple[list[Symbol], dict[str, list[str]]]:
    """parse(), kept in DIFFDX_CACHE/parsed/ under `key` and this parser's version: one diagnosis
    after another indexes the same large tree (a user's, a release's), whose parse is most of an
    index's CPU (tens of seconds for a transformers tree). An entry that cannot be read or written
    costs only the parse."""
    from tools.engines.codecache import store
    from tools.probe.checkpoints import cache_root

    name = hashlib.sha256(_PARSER_VERSION + repr(key).encode()).hexdigest()
    entry = cache_root() / "parsed" / name[:2] / name
    try:
        return pickle.loads(entry.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, TypeError, ValueError):
        result = parse()
        store(entry, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        return result


def _parser_version() -> bytes:
    """This module's source and the tree-sitter packages' versions: a parse result depends on nothing else."""
    from importlib import metadata

    parts = [Path(__file__).read_bytes()]
    for dist in ("tree-sitter", "tree-sitter-python", "tree-sitter-c", "tree-sitter-cpp"):
        try:
            parts.append(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            parts.append(dist.encode())
    return hashlib.sha256(b"\0".join(parts)).digest()


_PARSER_VERSION = _parser_version()

_PARSED: OrderedDict[tuple[str, str, bytes], tuple[list[Symbol], dict[str, list[str]]]] = OrderedDict()


def language_of(path: str) -> str | None:
    """The language the index parses a file in, by its suffix; None for a file it does not read."""
    return LANGUAGES.get(os.path.splitext(path)[1])


def code_tokens(path: str, text: str) -> tuple[str, ...] | None:
    """A definition's code as its tokens: comments, layout and bare string statements (docstrings)
    left out, so two versions that differ only there compare equal. None for a file not read here."""
    language = language_of(path)
    if language is None:
        return None
    parser, _ = _query(language)
    source = textwrap.dedent(text) if language == "python" else text
    out, stack = [], [parser.parse(source.encode()).root_node]
    while stack:
        n = stack.pop()
        if n.type == "comment" or (n.type == "expression_statement" and [c.type for c in n.children] == ["string"]):
            continue
        if n.child_count == 0:
            out.append(_text(n))
        stack.extend(reversed(n.children))
    return tuple(out)


def same_code(path: str, before: str, after: str) -> bool:
    """Only re-commented, re-documented or re-laid-out: running either version does the same.
    The one "same code" predicate: Python compares syntax trees (so brackets and quote style that
    a formatter changes do not count either), other languages their code tokens."""
    key = python_code_key if language_of(path) == "python" else functools.partial(code_tokens, path)
    first = key(before)
    return first is not None and first == key(after)


def python_code_key(text: str) -> str | None:
    """A Python definition's syntax tree without positions, comments or docstrings; None when it
    does not parse."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and _docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def _docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def definition(path: str, data: bytes, qualname: str) -> Symbol | None:
    """The first definition of `qualname` in one file's bytes (C may define a function once per
    `#if` branch: the first is the one a restore and a read agree on), or None."""
    language = language_of(path)
    if language is None:
        return None
    return next((s for s in parse_file(path, data, language)[0] if s.qualname == qualname), None)


def _sweep(path, data, language, defs, calls) -> tuple[list[Symbol], dict[str, list[str]]]:
    """Nest definitions by span (a stack over start order) and hand each call to its innermost."""
    # Containment starts at the def node itself, so a decorator's call belongs to the enclosing
    # scope (it runs there, at definition time); the symbol's lines still include decorators.
    events: list[tuple[int, int, int, Any]] = [
        (n.start_byte, 0, -n.end_byte, (n, name, kind)) for n, name, kind in defs
    ]
    events += [(c.start_byte, 1, 0, c) for c in calls]
    events.sort(key=lambda e: e[:3])
    stack: list[tuple[int, Symbol]] = []
    symbols: list[Symbol] = []
    edges: dict[str, list[str]] = {}
    for start, is_call, _neg_end, item in events:
        while stack and stack[-1][0] <= start:
            stack.pop()
        parent = stack[-1][1] if stack else None
        if is_call:
            callee = _callee_name(item)
            if parent is not None and callee:
                edges.setdefault(parent.qualname, []).append(callee)
            continue
        node, name_node, kind = item
        symbol = _make_symbol(path, data, language, node, name_node, kind, parent)
        if symbol is not None:
            symbols.append(symbol)
            stack.append((item[0].end_byte, symbol))
    return symbols, edges


def _span(node: ts.Node) -> ts.Node:
    """The definition including its decorators (Python) or `template <…>` header (C++)."""
    parent = node.parent
    while parent is not None and parent.type in ("decorated_definition", "template_declaration"):
        node, parent = parent, parent.parent
    return node


def _make_symbol(path, data, language, node, name_node, kind, parent: Symbol | None) -> Symbol | None:
    scope, name = _definition_name(name_node, language)
    if not name:
        return None
    prefix = [parent.qualname] if parent is not None else []
    qualname = ".".join(prefix + scope + [name])
    if kind == "function" and ((parent is not None and parent.kind == "class") or scope):
        kind = "method"
    span = _span(node)
    doc = _python_doc(node) if language == "python" else _leading_comment(span)
    return Symbol(
        name=name,
        qualname=qualname,
        kind=kind,
        file=path,
        start_line=span.start_point.row + 1,
        end_line=span.end_point.row + 1,
        doc=doc,
        hash=hashlib.sha1(data[span.start_byte : span.end_byte]).hexdigest()[:16],
        language=language,
    )


def _definition_name(node: ts.Node, language: str) -> tuple[list[str], str]:
    """(scope parts, short name). C++ declarators are unwrapped down to the identifier."""
    if language == "python" or node.type in ("type_identifier", "identifier"):
        return [], _text(node)
    while node.type in (
        "function_declarator",
        "pointer_declarator",
        "reference_declarator",
        "parenthesized_declarator",
        "attributed_declarator",
    ):
        inner = node.child_by_field_name("declarator") or next(iter(node.named_children), None)
        if inner is None:
            return [], ""
        node = inner
    parts = [p for p in re.sub(r"<[^<>]*>", "", _text(node)).replace(" ", "").split("::") if p]
    if not parts or not (_IDENT.fullmatch(parts[-1]) or parts[-1].startswith("operator")):
        return [], ""
    return parts[:-1], parts[-1]


def _callee_name(node: ts.Node) -> str:
    """The short name a call goes to: `self.foo(…)` -> foo, `ns::f<T>(…)` -> f."""
    text = re.sub(r"<[^<>]*>", "", _text(node))
    last = re.split(r"::|\.|->", text)[-1].strip()
    return last if _IDENT.fullmatch(last) else ""


def _python_doc(node: ts.Node) -> str:
    body = node.child_by_field_name("body")
    first = body.named_children[0] if body is not None and body.named_children else None
    if first is None or first.type != "expression_statement" or not first.named_children:
        return ""
    string = first.named_children[0]
    if string.type != "string":
        return ""
    content = "".join(_text(c) for c in string.named_children if c.type == "string_content")
    return _first_line(content)


def _leading_comment(node: ts.Node) -> str:
    """The first line of the comment block right above a C++ definition."""
    block: list[ts.Node] = []
    prev, row = node.prev_sibling, node.start_point.row
    while prev is not None and prev.type == "comment" and prev.end_point.row >= row - 1:
        block.insert(0, prev)
        row, prev = prev.start_point.row, prev.prev_sibling
    if not block:
        return ""
    return _first_line(re.sub(r"^\s*(//+|/\*+|\*+/?)", "", _text(block[0]), flags=re.M))


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _text(node: ts.Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


# --- the index ---------------------------------------------------------------------------------


class TreeSitterIndex:
    """SourceIndex over one tree (a directory or a commit). Build it with `open_index`."""

    def __init__(self, root: str | Path, files: Iterable[tuple[str, bytes]]):
        self.root = Path(root)
        self.texts: dict[str, bytes] = {}
        self.symbols: list[Symbol] = []
        self._calls: dict[tuple[str, str], list[str]] = {}
        for path, data in files:
            language = LANGUAGES.get(os.path.splitext(path)[1])
            if language is None:
                continue
            self.texts[path] = data
            symbols, edges = parsed(path, data, language)
            self.symbols.extend(symbols)
            self._calls.update({(path, q): names for q, names in edges.items()})
        self._by_file: dict[str, list[Symbol]] = {}
        for s in self.symbols:
            self._by_file.setdefault(s.file, []).append(s)

    # lookup
    def find(self, name: str) -> list[Symbol]:
        """By short name (`allocate`), qualified name (`BlockManager.allocate`, `Foo::bar`) or suffix.
        Exact qualified names first; else every symbol named so or whose qualified name ends in
        `.name`, in the index's order. Looked up in tables, not by a scan: a release diff asks this
        once per changed function of a tree of tens of thousands."""
        name = name.replace("::", ".").strip(".")
        by_qualname, by_name, by_last = self._lookup_tables()
        exact = by_qualname.get(name)
        if exact:
            return [self.symbols[i] for i in exact]
        candidates = sorted(set(by_name.get(name, ())) | set(by_last.get(name.rsplit(".", 1)[-1], ())))
        found = (self.symbols[i] for i in candidates)
        return [s for s in found if s.name == name or s.qualname.endswith("." + name)]

    def _lookup_tables(self) -> tuple[dict[str, list[int]], dict[str, list[int]], dict[str, list[int]]]:
        """Positions in `symbols` by qualified name, by name, by the qualified name's last part (built once)."""
        tables = getattr(self, "_tables", None)
        if tables is None or tables[0] != len(self.symbols):
            by_qualname: dict[str, list[int]] = {}
            by_name: dict[str, list[int]] = {}
            by_last: dict[str, list[int]] = {}
            for i, s in enumerate(self.symbols):
                by_qualname.setdefault(s.qualname, []).append(i)
                by_name.setdefault(s.name, []).append(i)
                by_last.setdefault(s.qualname.rsplit(".", 1)[-1], []).append(i)
            tables = self._tables = (len(self.symbols), by_qualname, by_name, by_last)
        return tables[1], tables[2], tables[3]

    def read(self, symbol: Symbol) -> str:
        lines = self.texts[symbol.file].decode("utf-8", "replace").splitlines()
        return "\n".join(lines[symbol.start_line - 1 : symbol.end_line]) + "\n"

    def search(self, query: str, limit: int = 20) -> list[Symbol]:
        """Symbols matching every token of `query` (in name, qualname, file or doc), best first."""
        tokens = [t.lower() for t in query.replace("::", ".").split() if t]
        scored = [(score, s) for s in self.symbols if (score := _match_score(s, tokens)) > 0]
        scored.sort(key=lambda p: (-p[0], p[1].file, p[1].start_line))
        return [s for _, s in scored[:limit]]

    def symbol_at(self, file: str, line: int) -> Symbol | None:
        """The innermost symbol of `file` containing `line` (None: module level)."""
        inside = [s for s in self._by_file.get(file, ()) if s.contains(line)]
        return min(inside, key=lambda s: s.end_line - s.start_line) if inside else None

    # call edges (by name: no type inference, so `x.allocate()` links to every `allocate`)
    def callees(self, symbol: Symbol) -> list[str]:
        return sorted(set(self._calls.get((symbol.file, symbol.qualname), [])))

    def callers(self, name: str) -> list[Symbol]:
        short = name.replace("::", ".").rsplit(".", 1)[-1]
        return [s for s in self.symbols if short in self._calls.get((s.file, s.qualname), ())]

    # diffs
    def symbols_for_hunks(self, diff_text: str, old: TreeSitterIndex | None = None) -> list[Change]:
        """Map a unified diff's changed lines to the enclosing symbols of this (new-side) tree.

        Added lines map directly. Removed lines are placed on the new side too (a body that only
        lost lines still changed): with `old`, the index of the diff's old side, through the old
        symbol of the same name (and reported on side "old" as well, which is how a deleted
        function shows up); without it, by where the removal sits (see `_removal_owner`).
        """
        groups: dict[tuple[str, str | None, str], tuple[Symbol | None, list[int]]] = {}
        for fd in parse_unified_diff(diff_text):
            for hunk in fd.hunks:
                for file, symbol, line, side in self._hunk_lines(fd, hunk, old):
                    key = (file, symbol.qualname if symbol else None, side)
                    groups.setdefault(key, (symbol, []))[1].append(line)
        changes = [Change(f, sym, tuple(sorted(set(lines))), side) for (f, _q, side), (sym, lines) in groups.items()]
        return sorted(changes, key=lambda c: (c.file, c.side != "new", c.lines[0]))

    def _hunk_lines(self, fd, hunk, old: TreeSitterIndex | None):
        """Yield (file, symbol or None, line, side) for every changed line of one hunk."""
        if fd.new_path:
            for line in hunk.added_lines():
                yield fd.new_path, self.symbol_at(fd.new_path, line), line, "new"
        if old is not None and fd.old_path:
            for old_line, new_line, _text in hunk.removals():
                was = old.symbol_at(fd.old_path, old_line)
                yield fd.old_path, was, old_line, "old"
                now = self._counterpart(fd.new_path, was) if fd.new_path else None
                if fd.new_path and (was is None or now is not None):
                    yield fd.new_path, now, max(new_line, 1), "new"
        elif fd.new_path:
            for new_line, texts in _removal_runs(hunk):
                owner = self._removal_owner(fd.new_path, new_line, texts)
                yield fd.new_path, owner, max(new_line, 1), "new"

    def _counterpart(self, file: str, symbol: Symbol | None) -> Symbol | None:
        return next((s for s in self._by_file.get(file, ()) if symbol and s.qualname == symbol.qualname), None)

    def _removal_owner(self, file: str, new_line: int, texts: list[str]) -> Symbol | None:
        """Who lost a run of removed lines, seen only from the new side.

        The symbol enclosing both neighbours of the gap, if any; else the tail of a body: the
        innermost symbol above the gap whose header is indented less than the run's first line
        (so removing `return` after a nested def goes to the outer function); else module level.
        """
        above, below = new_line - 1, new_line
        both = [s for s in self._by_file.get(file, ()) if s.contains(above) and s.contains(below)]
        if both:
            return min(both, key=lambda s: s.end_line - s.start_line)
        first = next((t for t in texts if t.strip()), "")
        depth = len(first) - len(first.lstrip())
        enclosing = sorted(
            (s for s in self._by_file.get(file, ()) if s.contains(above)), key=lambda s: s.end_line - s.start_line
        )
        return next((s for s in enclosing if self._indent(s) < depth), None)

    def _indent(self, symbol: Symbol) -> int:
        header = self.read(symbol).splitlines()[0] if symbol.file in self.texts else ""
        return len(header) - len(header.lstrip())

    # runtime objects
    def symbol_for(self, obj: object) -> Symbol | None:
        """A class/function/method object, an instance, or "pkg.mod:Qual.name" -> its Symbol."""
        if isinstance(obj, str):
            return self._symbol_for_dotted(obj)
        obj = _definition_object(obj)
        qualname = getattr(obj, "__qualname__", "").replace("<locals>.", "")
        file = self._relative(_source_file(obj))
        if file is not None:
            line = _source_line(obj)
            named = [s for s in self._by_file.get(file, ()) if s.qualname == qualname]
            at_line = [s for s in named if line is None or s.contains(line)]
            if at_line or named:
                return (at_line or named)[0]
            return self.symbol_at(file, line) if line else None
        return self._symbol_for_dotted(f"{getattr(obj, '__module__', '')}:{qualname}")

    def _symbol_for_dotted(self, ref: str) -> Symbol | None:
        module, _, qualname = ref.partition(":") if ":" in ref else (ref, "", "")
        splits = (
            [(module, qualname)]
            if qualname
            else [
                (".".join(module.split(".")[:i]), ".".join(module.split(".")[i:]))
                for i in range(module.count("."), 0, -1)
            ]
        )
        for mod, qual in splits:
            for file in _module_files(mod, self.texts):
                hit = [s for s in self._by_file.get(file, ()) if s.qualname == qual]
                if hit:
                    return hit[0]
        return None

    def _relative(self, path: str | None) -> str | None:
        if not path:
            return None
        try:
            rel = Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return None
        return rel if rel in self.texts else None


def _removal_runs(hunk) -> list[tuple[int, list[str]]]:
    """Contiguous '-' runs of a hunk as (new-side line they sat in front of, their texts)."""
    runs: dict[int, list[str]] = {}
    for _old, new_line, text in hunk.removals():
        runs.setdefault(new_line, []).append(text)
    return list(runs.items())


def _match_score(symbol: Symbol, tokens: list[str]) -> int:
    score = 0
    for token in tokens:
        if token == symbol.name.lower() or token == symbol.qualname.lower():
            score += 8
        elif token in symbol.name.lower():
            score += 4
        elif token in symbol.qualname.lower():
            score += 3
        elif token in symbol.file.lower():
            score += 2
        elif token in symbol.doc.lower():
            score += 1
        else:
            return 0
    return score


def _definition_object(obj: object) -> object:
    """Bound method -> function, property -> getter, wrapped -> wrapped, instance -> its class."""
    obj = getattr(obj, "__func__", obj)
    obj = getattr(obj, "fget", obj)
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj)):
        obj = type(obj)
    return obj


def _source_file(obj: Any) -> str | None:
    try:
        return inspect.getsourcefile(obj)
    except (TypeError, OSError):
        return None


def _source_line(obj: Any) -> int | None:
    try:
        return inspect.getsourcelines(obj)[1]
    except (TypeError, OSError):
        return None


def _module_files(module: str, texts: dict[str, bytes]) -> list[str]:
    """Index files a module path may name: `a.b` -> a/b.py, a/b/__init__.py (or under a prefix)."""
    if module.endswith(".py"):
        wanted = [module]
    else:
        base = module.replace(".", "/")
        wanted = [f"{base}.py", f"{base}/__init__.py"]
    exact = [w for w in wanted if w in texts]
    return exact or [f for f in texts if any(f.endswith("/" + w) for w in wanted)]


# --- building and caching ----------------------------------------------------------------------


def source_files(root: str | Path, include_tests: bool = True) -> list[tuple[str, int, int]]:
    """(relative path, mtime_ns, size) of every indexable file under root, sorted."""
    root = str(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if d not in SKIP_DIRS and not d.endswith(".egg-info") and (include_tests or d not in TEST_DIRS)
        ]
        for name in filenames:
            if os.path.splitext(name)[1] not in LANGUAGES or (not include_tests and _is_test_file(name)):
                continue
            full = os.path.join(dirpath, name)
            st = os.stat(full)
            if st.st_size <= MAX_FILE_BYTES:
                found.append((os.path.relpath(full, root).replace(os.sep, "/"), st.st_mtime_ns, st.st_size))
    return sorted(found)


def _is_test_file(name: str) -> bool:
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def open_index(
    root: str | Path, *, commit: str | None = None, include_tests: bool = True, paths: Iterable[str] | None = None
) -> TreeSitterIndex:
    """The index of a directory (cached on its files' mtimes and sizes) or of a commit of the
    git repo at `root` (cached on the commit sha; read from git objects, no checkout).

    `paths` (a commit only): index just those files of it, for a caller that looks only at them
    (a diff's files): what it sees of them is the whole index's, and a commit of a ~3000-file tree
    is then read and indexed in a fraction of a second instead of seconds."""
    root = Path(root).resolve()
    with _BUILDING:  # a prefetch_index still at work: wait for it, then take its index from the cache
        if commit is not None:
            only = frozenset(paths) if paths is not None else None
            return _index_at_commit(root, resolve(root, commit), include_tests, only)
        return _index_of_tree(root, tuple(source_files(root, include_tests)))


def prefetch_index(root: str | Path, *, include_tests: bool = True) -> threading.Thread:
    """Build open_index(root) in a background thread, for a caller that will need it later and
    mostly waits on other processes meanwhile (a diagnosis: its engine runs). The index is the
    one open_index would build then, cached on the files' mtimes and sizes: a file changed since is
    indexed again. Best effort: an error here is open_index's to raise, in the caller."""

    def build():
        try:
            open_index(root, include_tests=include_tests)
        except Exception:
            pass

    thread = threading.Thread(target=build, name="diffdx-prefetch-index", daemon=True)
    thread.start()
    return thread


_BUILDING = threading.RLock()  # one index built at a time (they share the parse results, _PARSED)


def commit_changes(root: str | Path, sha: str, diff_text: str, head: TreeSitterIndex) -> list[Change]:
    """The changes of commit `sha` (its unified diff `diff_text`), with each symbol as `head` has it.

    A commit's diff numbers its lines on the commit's own tree, so it is mapped on that tree: on a
    later one, a function above that grew since would own the commit's lines (a helper appended
    after it becomes a change of it). A symbol `head` no longer has (same file and qualname) is
    left out; module-level changes stay."""
    try:
        at = open_index(root, commit=sha, include_tests=False, paths=diff_paths(diff_text))
    except GitError:
        return head.symbols_for_hunks(diff_text)
    out = []
    for change in at.symbols_for_hunks(diff_text):
        if change.symbol is None:
            out.append(change)
            continue
        now = next((s for s in head.find(change.symbol.qualname) if s.file == change.file), None)
        if now is not None and now.kind == change.symbol.kind:
            out.append(Change(change.file, now, change.lines, change.side))
    return out


@functools.lru_cache(maxsize=8)
def _index_of_tree(root: Path, fingerprint: tuple[tuple[str, int, int], ...]) -> TreeSitterIndex:
    return TreeSitterIndex(root, ((path, (root / path).read_bytes()) for path, _m, _s in fingerprint))


def diff_paths(diff_text: str) -> set[str]:
    """Every file a unified diff names, on either side. Pure."""
    return {p for fd in parse_unified_diff(diff_text) for p in (fd.old_path, fd.new_path) if p}


@functools.lru_cache(maxsize=32)
def _index_at_commit(root: Path, sha: str, include_tests: bool, paths: frozenset[str] | None) -> TreeSitterIndex:
    files = (
        (path, data)
        for path, data in tree_files(root, sha, tuple(LANGUAGES), paths)
        if len(data) <= MAX_FILE_BYTES and (include_tests or not _is_test_path(path))
    )
    return TreeSitterIndex(root, files)


def _is_test_path(path: str) -> bool:
    parts = path.split("/")
    return any(p in TEST_DIRS for p in parts[:-1]) or _is_test_file(parts[-1])
