"""Two labellers' agreement on the real triage set: the measures on known pairs, and the bundled second
labelling of test9 read against the set's own labels."""

from __future__ import annotations

import math

import pytest

from benchmark.triage.real.agreement import agreement, load_pairs, main


def test_agreement_measures_on_pairs_worked_by_hand():
    pairs = [("silent", "silent"), ("silent", "crash"), ("crash", "crash"), ("question", "silent")]
    a = agreement(pairs)
    assert a.observed == 0.5
    # chance: first (silent 2, crash 1, question 1), second (silent 2, crash 2) -> (2*2 + 1*2) / 16
    assert math.isclose(a.kappa, (0.5 - 6 / 16) / (1 - 6 / 16))
    assert a.silent_precision == 0.5 and a.silent_recall == 0.5
    assert agreement([("other", "other")]).kappa == 1.0
    with pytest.raises(ValueError, match="no issue"):
        agreement([])


def test_the_bundled_second_labels_cover_their_split_and_print_both_views(capsys):
    rows = load_pairs("test9")
    assert len(rows) == 200 and len({r["url"] for r in rows}) == 200
    assert 0 < sum(r["blind"] for r in rows) < 200
    assert main(["test9"]) == 0
    printed = capsys.readouterr().out
    assert "test9 blind n=115" in printed and "test9 all   n=200" in printed
