"""Engine knowledge lives only in the engine's adapter (issue 15): adding an engine is one adapter
file and one registry line, so nothing else may name one.

An *engine identifier* is (a) a string constant, outside docstrings, that is exactly the name of a
built-in engine ("tinyserve", "transformers", "refmodel") — a scenario's `engine = …`, a branch on
`spec.engine == …`, a table keyed by engine — or (b) an import of an adapter's modules
(`tools.engines.<stem>` and `tools.engines.<stem>_*`, <stem> from the registry). Prose (docstrings,
comments) may name engines; `import transformers` as a library (the HF checkpoint format of
tools/probe/checkpoints.py, DESIGN §1) is not an engine identifier.

Allowed to name engines: the adapter's own modules, the registry (tools/engines/__init__.py), the
subjects (benchmark/subjects/), the bundled cases and their authoring scripts (benchmark/cases/,
benchmark/authoring/: a case names the engine it is about), and tests/.
"""

import ast
from pathlib import Path

from tools.engines import BUILTIN

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("agent", "tools", "benchmark")
ALLOWED = ("tools/engines/__init__.py", "benchmark/subjects/", "benchmark/cases/", "benchmark/authoring/")
STEM = {name: path.split(":")[0].rsplit(".", 1)[1] for name, path in BUILTIN.items()}  # engine -> adapter module
ADAPTER_STEMS = set(STEM.values())


def owner(module: str) -> str | None:
    """'tools.engines.hf_compat' -> 'hf' (the adapter that owns it); None when no adapter does."""
    if not module.startswith("tools.engines."):
        return None
    name = module.split(".")[2]
    return next((s for s in ADAPTER_STEMS if name == s or name.startswith(s + "_")), None)


def docstrings(tree: ast.AST) -> set[int]:
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return {
        id(n.body[0].value)
        for n in nodes
        if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }


def engine_identifiers(source: str, module: str) -> list[str]:
    """Where a module names an engine: 'line N: ...' for each string or import that does."""
    tree = ast.parse(source)
    skip, mine, found = docstrings(tree), owner(module), []
    others = {name for name, stem in STEM.items() if stem != mine}  # an adapter names its own engine only
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value.strip() in others:
                found.append(f"line {node.lineno}: string {node.value!r}")
        imported = []
        if isinstance(node, ast.Import):
            imported = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported = [node.module] if owner(node.module) else [f"{node.module}.{a.name}" for a in node.names]
        for name in imported:
            if owner(name) is not None and owner(name) != mine:
                found.append(f"line {node.lineno}: imports {name}")
    return sorted(found, key=lambda f: int(f.split()[1].rstrip(":")))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_no_module_outside_an_adapter_names_an_engine():
    offences = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            found = engine_identifiers(path.read_text(), module_name(path))
            if found:
                offences[rel] = found
    assert not offences, f"engine knowledge outside its adapter: {offences}"


def test_the_check_sees_what_it_forbids():
    """The scan is not vacuous: each kind of identifier is caught, prose and library imports are not."""
    caught = engine_identifiers(
        'if spec.engine == "tinyserve":\n    pass\nfrom tools.engines.hf_compat import major\n', "tools.reproduce"
    )
    assert [c.split(":")[0] for c in caught] == ["line 1", "line 3"]
    assert not engine_identifiers('"""Runs tinyserve."""\nfrom transformers import AutoConfig\n', "tools.x")
    assert not engine_identifiers('NAME = "transformers"\nfrom tools.engines import hf_compat\n', "tools.engines.hf")
    assert engine_identifiers('OTHER = "transformers"\n', "tools.engines.tinyserve")  # another engine's name
    assert engine_identifiers("from tools.engines import hf\n", "tools.drilldown")
