"""The sixth held-out set, part B (benchmark/authoring/tinyserve_hard_heldout6b.py): ten cases over seven or more
categories, the scenario mix the set was written to (bfloat16, seeded sampling, a batch of different lengths)."""

from __future__ import annotations

import pytest

from benchmark.authoring.tinyserve_hard_heldout6b import CASES
from benchmark.cases import BUNDLED_CASES_DIR, load_case

IDS = [spec.id for spec in CASES]


def test_set_is_ten_cases_over_seven_categories_with_fresh_numbers():
    assert len(CASES) == 10 and len({c.category for c in CASES}) >= 7
    assert sorted(c.issue_number for c in CASES) == list(range(2821, 2831))
    assert all(c.track == "hard" and len(c.modeled_on) >= 2 for c in CASES)


def test_scenario_mix():
    scenarios = [load_case(BUNDLED_CASES_DIR / case_id).scenario for case_id in IDS]
    assert sum(s.target.dtype == "bfloat16" for s in scenarios) >= 2
    seeded = [s for s in scenarios if any(r.sampling.get("seed") is not None for r in s.requests)]
    assert len(seeded) >= 2
    assert any(len({len(r.prompt_ids) for r in s.requests}) >= 3 for s in scenarios)


@pytest.mark.parametrize("case_id", IDS)
def test_good_ref_is_the_release_tag(case_id):
    # the wide-culprit, both-sides and no-leak checks run over this set too, in test_hard_upstream_cases.py
    assert load_case(BUNDLED_CASES_DIR / case_id).scenario.good_ref == "v0.2.0"
