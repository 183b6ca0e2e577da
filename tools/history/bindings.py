"""Module bindings for restoring a function from an earlier release, and body-level diffing.

A release refactor moves and renames module-level names together with the functions that use
them: the previous release's version of a function, spliced into the bad tree, then fails on a
name the new module no longer binds (an import dropped with the feature, a helper renamed). The
restore has to bring those bindings back too, or it cannot say anything. (Whether a function only
moved is `tools.source.index.same_code`, the one "same code" predicate.)

Pure functions over source text (Python's own `ast`: the modules under test are Python).
"""

from __future__ import annotations

import ast
import textwrap


def used_names(text: str) -> set[str]:
    """Free-looking names a function's text reads (every Name; attribute bases included)."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def top_bindings(module_text: str) -> dict[str, tuple[str, ast.stmt]]:
    """Module-level name -> (kind, statement): 'import' for imports, 'def' for functions, classes
    and plain assignments."""
    try:
        tree = ast.parse(module_text)
    except SyntaxError:
        return {}
    out: dict[str, tuple[str, ast.stmt]] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                out[(alias.asname or alias.name).split(".")[0]] = ("import", stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[stmt.name] = ("def", stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            out.update({t.id: ("def", stmt) for t in targets if isinstance(t, ast.Name)})
    return out


def import_line(name: str, stmt: ast.Import | ast.ImportFrom) -> str:
    """One import statement binding just `name`, as the old module imported it."""
    alias = next(a for a in stmt.names if (a.asname or a.name).split(".")[0] == name)
    spelled = alias.name + (f" as {alias.asname}" if alias.asname else "")
    if isinstance(stmt, ast.ImportFrom):
        return f"from {'.' * stmt.level}{stmt.module or ''} import {spelled}\n"
    return f"import {spelled}\n"


def missing_bindings(old_module: str, new_module: str, restored: list[str]) -> tuple[list[str], list[str]]:
    """What the restored (previous-release) function texts read from their old module that the new
    module no longer binds: (import lines, old module-level definitions), one level deep."""
    old, new = top_bindings(old_module), top_bindings(new_module)
    imports: list[str] = []
    defs: list[str] = []
    wanted = set().union(*(used_names(t) for t in restored)) if restored else set()
    seen: set[str] = set()
    while wanted - seen:
        name = sorted(wanted - seen)[0]
        seen.add(name)
        if name in new or name not in old:
            continue
        _, stmt = old[name]
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            imports.append(import_line(name, stmt))
            continue
        text = ast.get_source_segment(old_module, stmt, padded=False) or ""
        if text and text not in defs:
            defs.append(text)
            wanted |= used_names(text)
    return imports, defs


def insert_bindings(module_text: str, imports: list[str], defs: list[str]) -> str:
    """The module with `imports` after its last top-level import and `defs` at its end (looked up
    at call time, so the end of the module is early enough)."""
    lines = module_text.splitlines(keepends=True)
    try:
        tree = ast.parse(module_text)
    except SyntaxError:
        return module_text
    last = max((s.end_lineno or 0 for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))), default=0)
    lines[last:last] = imports
    tail = "".join(lines)
    if defs:
        tail = tail.rstrip("\n") + "\n\n\n" + "\n\n\n".join(defs) + "\n"
    return tail
