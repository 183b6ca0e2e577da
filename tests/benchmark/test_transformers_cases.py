"""The transformers-subject cases use the independent refmodel as their reference (issue 12); that the committed
files are what their authoring writes is checked by `python -m benchmark.author --check` (tests/benchmark/test_authoring.py)."""

from pathlib import Path

import pytest

from benchmark.author import discover
from benchmark.cases import BUNDLED_CASES_DIR
from tools.scenario import load

TRANSFORMERS_CASES = sorted(i for i, (_, spec) in discover().items() if spec.subject == "transformers")


def test_the_transformers_cases_are_found():
    assert len(TRANSFORMERS_CASES) >= 7


@pytest.mark.parametrize("case_id", TRANSFORMERS_CASES)
def test_reference_is_the_refmodel_not_the_subject(case_id):
    scenario = load(Path(BUNDLED_CASES_DIR) / case_id / "repro.toml")
    assert scenario.target.engine == "transformers"
    assert scenario.reference.engine == "refmodel"
