"""A tiny fake subject (`minisub`) and a factory for real case folders built on it.

The subject registry is pointed at the fake subject through $DIFFDX_SUBJECTS and the
cache through $DIFFDX_CACHE; nothing under test is patched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from benchmark.authoring.patches import Step, write_patches

# The bundled subject on sys.path before any test module here imports `tinyserve` (module-level
# imports in the tests would be reordered past a side-effect import by the formatter).
from benchmark.subjects import check_tinyserve  # noqa: F401

MINISUB_OPS = '''"""Tiny arithmetic "engine" for benchmark framework tests."""


def scale(x):
    return x * 2


def shift(x, by=1):
    return x + by


class Mixer:
    def __init__(self, weight):
        self.weight = weight

    def mix(self, a, b):
        w = self.weight
        return w * a + (1 - w) * b
'''

STEPS = {
    "docs": Step(
        "ops: document shift\n\nExplain the default offset.",
        "Ana Ruiz <ana@example.com>",
        "2025-03-01T10:00:00+00:00",
        [("minisub/ops.py", "def shift(x, by=1):\n", 'def shift(x, by=1):\n    """x + by."""\n')],
        slug="document-shift",
    ),
    "bug": Step(
        "ops: fold the scale factor into a constant",
        "Bo Li <bo@example.com>",
        "2025-03-03T12:30:00+02:00",
        [("minisub/ops.py", "    return x * 2\n", "    return x * 2 + 1\n")],
        slug="fold-scale",
    ),
    "mixer": Step(
        "mixer: name the complement weight",
        "Cy Park <cy@example.com>",
        "2025-03-05T08:00:00-05:00",
        [
            (
                "minisub/ops.py",
                "        return w * a + (1 - w) * b\n",
                "        v = 1 - w\n        return w * a + v * b\n",
            )
        ],
        slug="mixer-complement",
    ),
    "readme": Step(
        "docs: describe minisub",
        "Ana Ruiz <ana@example.com>",
        "2025-03-06T09:00:00+00:00",
        [("README.md", "# minisub\n", "# minisub\n\nA tiny subject.\n")],
        slug="readme",
    ),
}
BUG_TRUTH = {
    "file": "minisub/ops.py",
    "function": "scale",
    "commit": "02-fold-scale",
    "component": "ops",
    "mechanism": "scale() adds a stray constant to every output",
}
REPRO = {
    "model": {"arch": "llama", "seed": 0},
    "target": {"engine": "minisub", "dtype": "float32"},
    "workload": {"requests": [{"prompt_ids": [1, 2, 3], "max_tokens": 4}]},
}


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """One $DIFFDX_CACHE for the session: pristine repos are keyed by content, so sharing is safe."""
    return tmp_path_factory.mktemp("diffdx-cache")


@pytest.fixture
def subject_root(tmp_path, monkeypatch, shared_cache) -> Path:
    root = tmp_path / "minisub-src"
    (root / "minisub" / "__pycache__").mkdir(parents=True)
    (root / "minisub" / "__init__.py").write_text('__version__ = "0.3"\n')
    (root / "minisub" / "ops.py").write_text(MINISUB_OPS)
    (root / "minisub" / "__pycache__" / "ops.cpython-311.pyc").write_bytes(b"stale bytecode")
    (root / "README.md").write_text("# minisub\n")
    monkeypatch.setenv("DIFFDX_SUBJECTS", f"minisub@0.3={root}")
    monkeypatch.setenv("DIFFDX_CACHE", str(shared_cache))
    return root


@pytest.fixture
def cases_dir(tmp_path, subject_root) -> Path:
    path = tmp_path / "cases"
    path.mkdir()
    return path


@pytest.fixture
def make_case(cases_dir):
    """(id, issue_number, step names, truth, **meta) -> a case folder written through the authoring helper."""

    def make(
        case_id: str,
        issue_number: int,
        steps: list[str],
        truth: dict | None = None,
        category: str = "numerics",
        good_ref: str | None = None,
    ) -> Path:
        folder = cases_dir / case_id
        folder.mkdir()
        meta = {
            "id": case_id,
            "issue_number": issue_number,
            "subject": "minisub",
            "category": category,
            "modeled_on": ["vllm-project/vllm#5639"],
            "title": f"wrong outputs ({case_id})",
        }
        (folder / "case.toml").write_text(tomli_w.dumps(meta))
        (folder / "issue.md").write_text("Outputs are off by one since the last upgrade.\n")
        repro = dict(REPRO, good_ref=good_ref) if good_ref else REPRO
        (folder / "repro.toml").write_text(tomli_w.dumps(repro))
        (folder / "truth.toml").write_text(tomli_w.dumps(truth or BUG_TRUTH))
        write_patches("minisub", [STEPS[s] for s in steps], folder)
        return folder

    return make


@pytest.fixture
def three_cases(make_case, cases_dir):
    make_case("bug-not-newest", 501, ["docs", "bug", "mixer"], category="numerics")
    make_case("bug-newest", 502, ["docs", "bug"], category="kv-cache")
    make_case(
        "docs-only", 503, ["readme"], category="kv-cache", truth={k: v for k, v in BUG_TRUTH.items() if k != "commit"}
    )
    return cases_dir
