"""The at-base cases (benchmark/authoring/tinyserve_atbase.py, DESIGN §6b "Bug at base"): the bug is
folded into base, nothing points at it from history, and the authoring regenerates the committed
files byte for byte."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from benchmark.authoring.tinyserve_atbase import CASES, CASES_DIR
from benchmark.authoring.tinyserve_atbase_heldout import CASES as HELDOUT_CASES
from benchmark.authoring.tinyserve_atbase_heldout4 import CASES as HELDOUT4_CASES
from benchmark.authoring.tinyserve_atbase_heldout5 import CASES as HELDOUT5_CASES
from benchmark.authoring.tinyserve_atbase_heldout5b import CASES as HELDOUT5B_CASES
from benchmark.cases import load_case, load_truth

# the held-out at-base cases (2301-2304, 2501-2504, 2701-2706, 2721-2726) share the per-case checks
ALL_CASES = CASES + HELDOUT_CASES + HELDOUT4_CASES + HELDOUT5_CASES + HELDOUT5B_CASES
IDS = [c.id for c in ALL_CASES]


@pytest.mark.parametrize("case_id", IDS)
def test_an_at_base_case_has_its_bug_in_base_and_a_history_on_the_same_files(case_id: str):
    folder = CASES_DIR / case_id
    case = load_case(folder)
    truth = tomllib.loads((folder / "truth.toml").read_text())
    patches = sorted((folder / "commits").glob("*.patch"))
    assert case.track == "at-base" and "commit" not in truth and case.scenario.good_ref is None
    assert patches[0].name.startswith("00-base-") and not any(p.name.startswith("00-base") for p in patches[1:])
    component_files = {f for f, _, _ in next(c for c in ALL_CASES if c.id == case_id).bug}
    later = [p.read_text() for p in patches[1:]]
    assert len(later) >= 10
    assert sum(any(f"diff --git a/{f}" in text for f in component_files) for text in later) >= 7


def test_the_at_base_track_spans_six_categories():
    assert len(CASES) >= 10 and len({c.category for c in CASES}) >= 6
    assert len({c.issue_number for c in ALL_CASES}) == len(ALL_CASES)


@pytest.mark.parametrize("case_id", [c.id for c in HELDOUT_CASES + HELDOUT4_CASES + HELDOUT5_CASES + HELDOUT5B_CASES])
def test_a_held_out_issue_names_neither_the_faulty_function_nor_its_file(case_id: str):
    case = load_case(CASES_DIR / case_id)
    truth = load_truth(case)
    assert truth.function.split(".")[-1] not in case.issue
    assert Path(truth.file).name not in case.issue


def regenerated_equals_committed(case_id: str, tmp_path: Path) -> None:
    spec = next(c for c in ALL_CASES if c.id == case_id)
    fresh = spec.write(tmp_path)
    committed = CASES_DIR / case_id
    names = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    for name in names:
        assert (fresh / name).read_bytes() == (committed / name).read_bytes(), name


def test_the_authoring_regenerates_a_case_byte_for_byte(tmp_path: Path):
    regenerated_equals_committed("ts-base-attn-softcap", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case_id", IDS)
def test_the_authoring_regenerates_every_case_byte_for_byte(case_id: str, tmp_path: Path):
    regenerated_equals_committed(case_id, tmp_path)
