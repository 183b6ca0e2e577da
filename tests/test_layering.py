"""The layering (issue 15): imports flow one way, and configuration comes from one place.

Read from the source with `ast` (every import, those inside functions and TYPE_CHECKING
blocks included), so a violation fails here whatever the import-time side effects.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("agent", "tools", "benchmark")
SKIP = ("benchmark/subjects/tinyserve", "benchmark/cases")  # the subject itself and generated cases

# The engine adapter imports the tree under test inside the worker; no other module may.
SUBJECT_IMPORTERS = {"tools/engines/tinyserve.py"}

# Stages flow one way: the probe measures, later stages use it, never the other way round.
PROBE_MAY_NOT_IMPORT = (
    "tools.hypotheses",
    "tools.history",
    "tools.reproduce",
    "tools.drilldown",
    "tools.report",
    "tools.triage",
)

# Modules that may read an environment variable (agent/config.py says why): the run's
# configuration, and the process boundary, where a parent sets what every descendant reads.
ENV_READERS = {
    "agent/config.py": "the run configuration",
    "tools/engines/runner.py": "worker switches: DIFFDX_FORKSERVER, DIFFDX_KEEP_TEMP, DIFFDX_RUN_LOG, PYTHONPATH",
    "tools/engines/forkserver.py": "the zygote: DIFFDX_KEEP_TEMP, PYTHONPATH",
    "tools/engines/worker.py": "the engine worker: OMP_NUM_THREADS",
    "tools/engines/treepreload.py": "a tree zygote: the worker's quiet settings, set before the tree's import",
    "tools/engines/funccov.py": "the engine worker: DIFFDX_COVERAGE",
    "tools/probe/checkpoints.py": "DIFFDX_CACHE, the cache every process shares",
    "benchmark/subjects/__init__.py": "DIFFDX_SUBJECTS, the subject registry every case worker reads",
}


def sources() -> list[Path]:
    files = [p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))]
    return [p for p in files if not str(p.relative_to(ROOT)).startswith(SKIP)]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, absolute names (relative imports resolved). Pure."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(filter(None, [*parent, base]))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def imports_any(path: Path, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in imported_modules(path) if any(m == p or m.startswith(p + ".") for p in prefixes))


def env_reads(path: Path) -> list[int]:
    """Lines that read one environment variable: os.environ.get/[...]/in, os.getenv. Handing the
    whole environment to a child process (dict(os.environ), {**os.environ}) is not a read. Pure."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "getenv" or (node.func.attr in ("get", "setdefault") and _is_environ(node.func.value)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            lines.append(node.lineno)
    return lines


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


@pytest.mark.parametrize("path", [p for p in sources() if rel(p).startswith("tools/")], ids=rel)
def test_tools_never_import_the_agent_or_the_benchmark(path):
    assert imports_any(path, ("agent", "benchmark")) == []


@pytest.mark.parametrize("path", [p for p in sources() if rel(p).startswith(("tools/", "agent/"))], ids=rel)
def test_nothing_imports_the_subject(path):
    if rel(path) not in SUBJECT_IMPORTERS:
        assert imports_any(path, ("tinyserve", "benchmark.subjects")) == []


@pytest.mark.parametrize("path", [p for p in sources() if rel(p).startswith("tools/probe/")], ids=rel)
def test_the_probe_imports_no_later_stage(path):
    assert imports_any(path, PROBE_MAY_NOT_IMPORT) == []


def test_graph_nodes_and_the_cli_do_not_import_each_other():
    """Guards: agent/nodes.py imported RunConfig from agent/run.py, which imports agent/nodes.py."""
    assert imports_any(ROOT / "agent" / "nodes.py", ("agent.run",)) == []
    assert "agent.nodes" in imported_modules(ROOT / "agent" / "run.py")  # the one direction


@pytest.mark.parametrize("path", sources(), ids=rel)
def test_only_the_config_and_the_process_boundary_read_the_environment(path):
    if rel(path) not in ENV_READERS:
        assert env_reads(path) == [], f"{rel(path)} reads the environment: take the value from agent.config"


def test_one_definition_each_of_the_model_the_categories_and_the_jinja_environment():
    """Guards: the default model name and the categories were defined twice each, and prompts were
    rendered by two jinja environments built in agent/llm.py and tools/report.py."""
    defined: dict[str, list[str]] = {"DEFAULT_MODEL": [], "CATEGORIES": [], "Environment()": []}
    for path in [*sources(), ROOT / "prompts" / "__init__.py"]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for name in (t.id for t in targets if isinstance(t, ast.Name) and t.id in defined):
                defined[name].append(rel(path))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Environment":
                defined["Environment()"].append(rel(path))
    assert defined == {
        "DEFAULT_MODEL": ["agent/config.py"],
        "CATEGORIES": ["tools/hypotheses/categories.py"],
        "Environment()": ["prompts/__init__.py"],
    }


def test_the_checks_see_what_they_check():
    """The walkers find real imports and reads (a test that sees nothing would pass vacuously)."""
    assert "agent.nodes.Session" in imported_modules(ROOT / "agent" / "graph.py")
    assert "tools.engines.protocol" in imported_modules(ROOT / "tools" / "engines" / "runner.py")
    assert env_reads(ROOT / "agent" / "config.py") and env_reads(ROOT / "tools" / "engines" / "runner.py")
    assert all((ROOT / name).is_file() for name in ENV_READERS)
