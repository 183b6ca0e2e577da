"""The validator proves cases with a real (cheap) oracle and rejects broken ones clearly."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmark.validate import defined_names, main, qualified_names, validate_case
from tests.benchmark.conftest import BUG_TRUTH


@dataclass(frozen=True)
class ValueProbe:
    diverged: bool
    summary: str


def value_oracle(scenario, target_source: Path | None, reference_source: Path | None = None) -> ValueProbe:
    """Import minisub from the tree under test in a fresh interpreter; the reference says scale(3) == 6."""
    env = {**os.environ, "PYTHONPATH": str(target_source)}
    out = subprocess.run(
        [sys.executable, "-S", "-c", "import minisub.ops as m; print(m.scale(3))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return ValueProbe(diverged=out != "6", summary=f"scale(3) = {out}, reference 6")


def test_good_case_passes(make_case):
    verdict = validate_case(make_case("good", 401, ["docs", "bug", "mixer"]), value_oracle)
    assert verdict.ok, verdict.reason
    assert verdict.line() == "ok   good (4 probes)"  # HEAD, truth commit, its parent, base


def test_good_ref_is_probed(make_case):
    assert validate_case(make_case("ref", 402, ["docs", "bug", "mixer"], good_ref="HEAD~2"), value_oracle).ok
    verdict = validate_case(make_case("late-ref", 403, ["docs", "bug", "mixer"], good_ref="HEAD~1"), value_oracle)
    assert not verdict.ok
    assert "good_ref 'HEAD~1'" in verdict.reason and "does not agree with the reference: scale(3) = 7" in verdict.reason


def test_patch_that_does_not_apply_is_rejected(make_case):
    folder = make_case("stale", 404, ["docs", "bug"])
    patch = folder / "commits" / "02-fold-scale.patch"
    patch.write_text(patch.read_text().replace(" def scale(x):", " def scale(y):"))
    verdict = validate_case(folder, value_oracle)
    assert not verdict.ok and verdict.reason.startswith("commits/02-fold-scale.patch does not apply")


def test_missing_truth_function_is_rejected(make_case):
    verdict = validate_case(
        make_case("ghost", 405, ["docs", "bug"], truth={**BUG_TRUTH, "function": "Mixer.scale"}), value_oracle
    )
    assert verdict.line() == "FAIL ghost: truth function Mixer.scale is not defined in minisub/ops.py at HEAD"


def test_head_that_does_not_diverge_is_rejected(make_case):
    truth = {**BUG_TRUTH, "function": "Mixer.mix", "commit": "02-mixer-complement"}
    verdict = validate_case(make_case("benign", 406, ["docs", "mixer"], truth=truth), value_oracle)
    assert re.fullmatch(r"HEAD \([0-9a-f]{10}\) does not diverge: scale\(3\) = 6, reference 6", verdict.reason)


def test_truth_commit_that_is_not_the_first_bad_one_is_rejected(make_case):
    truth = {**BUG_TRUTH, "commit": "03-mixer-complement"}
    verdict = validate_case(make_case("late", 407, ["docs", "bug", "mixer"], truth=truth), value_oracle)
    assert not verdict.ok
    assert verdict.reason.startswith(
        "the commit before truth commit 03-mixer-complement (truth is not the first bad commit)"
    )
    truth = {**BUG_TRUTH, "commit": "01-document-shift"}
    verdict = validate_case(make_case("early", 408, ["docs", "bug", "mixer"], truth=truth), value_oracle)
    assert verdict.reason.startswith("truth commit 01-document-shift (") and "does not diverge" in verdict.reason


def test_bug_since_base_needs_a_diverging_base(make_case):
    truth = {k: v for k, v in BUG_TRUTH.items() if k != "commit"}
    verdict = validate_case(make_case("since-base", 409, ["docs", "bug"], truth=truth), value_oracle)
    assert not verdict.ok and verdict.reason.startswith("base (bug present since base) (")


def test_cli_prints_a_line_per_case_and_fails_on_any(make_case, cases_dir, capsys):
    make_case("fine", 410, ["docs", "bug"])
    make_case("broken", 411, ["docs", "bug"], truth={**BUG_TRUTH, "file": "minisub/missing.py"})
    oracle = "tests.benchmark.test_validate:value_oracle"
    assert main(["--cases-dir", str(cases_dir), "--oracle", oracle]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "FAIL broken: truth file minisub/missing.py does not exist at HEAD",
        "ok   fine (3 probes)",
        "1/2 cases ok",
    ]
    assert main(["fine", "--cases-dir", str(cases_dir), "--oracle", oracle]) == 0
    assert main(["--cases-dir", str(cases_dir), "--oracle", "tools.nope:probe"]) == 2
    assert "oracle 'tools.nope:probe' is not available" in capsys.readouterr().err


def test_malformed_folder_is_a_failed_case_not_a_crash(make_case, cases_dir, capsys):
    folder = make_case("torn", 412, ["docs"])
    (folder / "repro.toml").write_text("[model]\narch = 'llama'\n")
    verdict = validate_case(folder, value_oracle)
    assert verdict.line() == "FAIL torn: repro.toml: scenario is missing the [target] table"


def test_qualified_names_cover_methods_and_nested_functions():
    tree = ast.parse(
        "class A:\n    def f(self):\n        def g():\n            pass\nif True:\n    def h():\n        pass\n"
    )
    assert qualified_names(tree) == {"A", "A.f", "A.f.g", "h"}


def test_truth_in_a_cuda_kernel_is_found_by_the_source_index(tmp_path):
    kernel = tmp_path / "scale.cu"
    kernel.write_text(
        "__global__ void scale_kernel(float* x, int n) {\n  int i = threadIdx.x;\n  if (i < n) x[i] *= 2.f;\n}\n"
    )
    assert "scale_kernel" in defined_names(kernel, "csrc/scale.cu")
