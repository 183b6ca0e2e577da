"""The second held-out set of hard cases (benchmark/authoring/tinyserve_hard_heldout.py): wide culprits,
inserted commits on both sides of the culprit, issue prose that names no fault, a spread of categories."""

from __future__ import annotations

import pytest

from benchmark.authoring.tinyserve_hard_heldout import CASES
from benchmark.cases import BUNDLED_CASES_DIR, load_case

IDS = [spec.id for spec in CASES]


def test_set_is_ten_cases_over_seven_categories_with_fresh_numbers():
    assert len(CASES) == 10 and len({c.category for c in CASES}) >= 7
    assert sorted(c.issue_number for c in CASES) == list(range(2034, 2044))
    assert all(c.track == "hard" and c.modeled_on for c in CASES)


@pytest.mark.parametrize("case_id", IDS)
def test_good_ref_is_the_release_tag(case_id):
    # the wide-culprit, both-sides and no-leak checks run over this set too, in test_hard_upstream_cases.py
    assert load_case(BUNDLED_CASES_DIR / case_id).scenario.good_ref == "v0.2.0"
