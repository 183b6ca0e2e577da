"""Python-only evidence (function coverage, function contracts) on a native tree: skipped with a
note, never an empty record that reads as "no function ran"."""

from __future__ import annotations

from tests.tools.engines.test_runner import tiny_job
from tools.engines.funccov import has_python_source
from tools.engines.runner import run_engine

GGML_C = "float ggml_silu_f32(float x) { return x/(1.0f + expf(-x)); }\n"


def test_coverage_and_contracts_on_a_c_tree_are_skipped_with_a_note(tmp_path):
    native = tmp_path / "llama.cpp"
    (native / "ggml" / "src").mkdir(parents=True)
    (native / "ggml" / "src" / "ggml.c").write_text(GGML_C)
    assert not has_python_source(str(native))
    job = tiny_job()
    job.coverage_root = job.function_checks = str(native)
    meta = run_engine(job).meta
    assert "coverage" not in meta and "function_checks" not in meta
    assert "holds no Python source" in meta["coverage_skipped"] and meta["function_checks_skipped"]


def test_a_python_tree_still_gets_its_coverage_record(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    assert has_python_source(str(tmp_path))
    job = tiny_job()
    job.coverage_root = str(tmp_path)
    meta = run_engine(job).meta
    assert meta["coverage"] == [] and "coverage_skipped" not in meta  # ran nothing there: a real empty record


def test_a_mixed_tree_records_its_python_and_leaves_its_c_unknown(tmp_path):
    """Regression: coverage was skipped only on a tree with no Python at all, so on a mixed tree every
    C/C++ function was missing from the record and read as never run (pushed down, or dropped)."""
    from tools.hypotheses.coverage import Coverage, ran

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (tmp_path / "ggml.c").write_text(GGML_C)
    job = tiny_job()
    job.coverage_root = str(tmp_path)
    meta = run_engine(job).meta
    assert meta["coverage"] == [] and meta["coverage_languages"] == ["python"]
    coverage = Coverage.from_meta(meta)
    assert ran(coverage, "pkg/mod.py", "f") is False  # recorded language, not in the record: did not run
    assert ran(coverage, "ggml.c", "ggml_silu_f32") is None  # not recorded: unknown
    assert ran(None, "pkg/mod.py", "f") is None
