"""The transformers-subject cases are authored by benchmark/authoring/transformers_cases.py and
use the independent refmodel as their reference (issue 12): the committed repro.toml of every
case is what the script writes (the patches are checked by benchmark.validate)."""

from pathlib import Path

import pytest

from benchmark.authoring.transformers_cases import CASES_DIR, all_cases
from tools.scenario import load

SPECS = {spec.id: spec for spec in all_cases()}


@pytest.mark.parametrize("case_id", sorted(SPECS))
def test_committed_repro_is_what_the_authoring_writes(case_id):
    assert (CASES_DIR / case_id / "repro.toml").read_text() == SPECS[case_id].repro


@pytest.mark.parametrize("case_id", sorted(SPECS))
def test_reference_is_the_refmodel_not_the_subject(case_id):
    scenario = load(Path(CASES_DIR) / case_id / "repro.toml")
    assert scenario.target.engine == "transformers"
    assert scenario.reference.engine == "refmodel"
