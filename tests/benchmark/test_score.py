"""The scorer, checked against hand-computed values."""

from __future__ import annotations

import pytest

from benchmark.cases import Truth
from benchmark.score import (
    aggregate,
    commit_hit,
    component_hit,
    first_match_rank,
    score_case,
    summarize,
    unbiased_pass_at_k,
    worst_match_rank,
)

TRUTH = Truth(
    file="tinyserve/kv_cache.py",
    function="BlockManager.allocate",
    commit="02-reuse-blocks",
    component="kv-cache",
    mechanism="freed blocks handed out twice",
)
COMMITS = {
    "base": "b" * 40,
    "patches": {
        "01-docs": {"sha": "1" * 40, "subject": "docs"},
        "02-reuse-blocks": {"sha": "abcdef0123" + "4" * 30, "subject": "kv_cache: reuse freed blocks first"},
    },
}


def hyp(file="tinyserve/sampler.py", function="Sampler.forward", **extra):
    return {"file": file, "function": function, **extra}


def report(*hyps, commit=None, cost=None, **extra):
    return {"issue": "1", "hypotheses": list(hyps), "commit": commit, "cost": cost or {}, **extra}


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 2 / 5),
        (5, 2, 2, 1 - 3 / 10),
        (10, 3, 5, 1 - 21 / 252),
        (5, 2, 4, 1.0),
        (4, 0, 2, 0.0),
        (1, 1, 1, 1.0),
        (3, 3, 2, 1.0),
    ],
)
def test_unbiased_estimator_matches_hand_computed(n, c, k, expected):
    assert unbiased_pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize("n, c, k", [(3, 4, 1), (3, 1, 4), (3, 1, 0)])
def test_unbiased_estimator_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        unbiased_pass_at_k(n, c, k)


def test_match_forgives_only_leading_dot_slash_and_slash():
    assert first_match_rank(report(hyp(), hyp("./tinyserve/kv_cache.py", "BlockManager.allocate")), TRUTH) == 2
    assert first_match_rank(report(hyp("/tinyserve/kv_cache.py", "BlockManager.allocate")), TRUTH) == 1
    assert first_match_rank(report(hyp("kv_cache.py", "BlockManager.allocate")), TRUTH) is None
    assert first_match_rank(report(hyp("tinyserve/kv_cache.py", "allocate")), TRUTH) is None


def test_only_the_first_five_hypotheses_count():
    late = report(*[hyp()] * 5, hyp("tinyserve/kv_cache.py", "BlockManager.allocate"))
    assert first_match_rank(late, TRUTH) is None
    assert first_match_rank(report(error="boom"), TRUTH) is None


def test_component_hit_by_file_or_component_field_on_rank_one():
    assert component_hit(report(hyp("tinyserve/kv_cache.py", "BlockManager.free")), TRUTH)
    assert component_hit(report(hyp(component="KV-cache")), TRUTH)
    assert not component_hit(report(hyp(component="sampling"), hyp("tinyserve/kv_cache.py")), TRUTH)
    assert not component_hit(report(), TRUTH)


def test_commit_hit_by_sha_prefix_or_subject():
    assert commit_hit(report(commit={"sha": "abcdef01", "subject": "x"}), TRUTH, COMMITS)
    assert commit_hit(report(commit={"sha": "", "subject": "kv_cache: reuse freed blocks first"}), TRUTH, COMMITS)
    assert not commit_hit(report(commit={"sha": "abcde"}), TRUTH, COMMITS), "too short to name a commit"
    assert commit_hit(report(hyp(commit="abcdef0123")), TRUTH, COMMITS), "falls back to the rank-1 hypothesis"
    assert not commit_hit(report(commit={"sha": "1" * 40}), TRUTH, COMMITS)
    assert commit_hit(report(), Truth("a.py", "f", None, "c", "m"), COMMITS) is None
    assert commit_hit(report(), TRUTH, None) is None


def test_score_case_with_samples():
    right = hyp("tinyserve/kv_cache.py", "BlockManager.allocate")
    reports = [
        report(right, cost={"engine_runs": 4, "tokens_in": 100, "tokens_out": 20, "wall_s": 3.0}),
        report(hyp(), right, cost={"engine_runs": 6, "wall_s": 5.0}),
        report(hyp(), error="crashed"),
    ]
    s = score_case("c1", "kv-cache", "tinyserve", reports, TRUTH, COMMITS)
    assert (s.samples, s.rank, s.top1_hits, s.top5_hits, s.errors) == (3, 1, 1, 2, 1)
    assert s.pass_at_1 == pytest.approx(1 / 3) and s.pass_at_5 == pytest.approx(2 / 3)
    assert s.runs_pass_at == {1: pytest.approx(1 / 3)}
    assert s.component == pytest.approx(1 / 3) and s.commit == 0.0
    assert (s.engine_runs, s.tokens, s.wall_s) == (pytest.approx(10 / 3), pytest.approx(40.0), pytest.approx(8 / 3))


def test_a_tie_on_confidence_counts_at_its_worst_rank():
    right = hyp("tinyserve/kv_cache.py", "BlockManager.allocate", confidence=0.8, verified=True)
    tied = hyp(confidence=0.8, verified=True)
    unverified_same_score = hyp("tinyserve/a.py", "f", confidence=0.8, verified=False)
    lower = hyp("tinyserve/b.py", "g", confidence=0.5, verified=True)
    assert worst_match_rank(report(right, tied, lower), TRUTH) == 2
    assert worst_match_rank(report(right, unverified_same_score, lower), TRUTH) == 1  # verified breaks the tie
    assert worst_match_rank(report(tied, right, lower), TRUTH) == 2
    # a tie running past the top 5 is a miss at its worst
    assert (
        worst_match_rank(report(right, *[hyp("x.py", f"f{i}", confidence=0.8, verified=True) for i in range(5)]), TRUTH)
        is None
    )
    # no numeric confidence: nothing ties
    assert worst_match_rank(report(hyp("tinyserve/kv_cache.py", "BlockManager.allocate"), hyp()), TRUTH) == 1
    s = score_case("c", "kv-cache", "tinyserve", [report(right, tied), report(right, lower)], TRUTH)
    assert (s.rank, s.rank_worst, s.pass_at_1, s.pass_at_1_ties) == (1, 2, 1.0, 0.5)
    assert aggregate([s]).pass_at_1_ties == 0.5


def test_runs_pass_at_5_with_enough_samples():
    right = report(hyp("tinyserve/kv_cache.py", "BlockManager.allocate"))
    s = score_case("c", "kv-cache", "tinyserve", [right, right] + [report()] * 4, TRUTH)
    assert s.runs_pass_at[5] == pytest.approx(1 - 0 / 6)  # C(4,5) = 0: any 5 of 6 include a hit
    assert s.runs_pass_at[1] == pytest.approx(2 / 6) and s.commit is None


def test_aggregates_overall_per_category_and_subject():
    right = hyp("tinyserve/kv_cache.py", "BlockManager.allocate")
    scores = [
        score_case("a", "kv-cache", "tinyserve", [report(right, commit={"sha": "abcdef0"})], TRUTH, COMMITS),
        score_case("b", "kv-cache", "tinyserve", [report(hyp(), right)], TRUTH, COMMITS),
        score_case(
            "c",
            "sampling",
            "transformers",
            [report(hyp(), cost={"tokens_in": 7})],
            Truth("a.py", "f", None, "sampler", "m"),
        ),
    ]
    summary = summarize(scores)
    overall = summary["overall"]
    assert (overall.cases, overall.pass_at_1, overall.pass_at_5) == (3, pytest.approx(1 / 3), pytest.approx(2 / 3))
    assert overall.commit_acc == pytest.approx(1 / 2), "only cases whose truth names a commit"
    assert overall.component_acc == pytest.approx(1 / 3) and overall.tokens == pytest.approx(7 / 3)
    assert list(summary["by_category"]) == ["kv-cache", "sampling"]
    assert summary["by_category"]["kv-cache"].pass_at_5 == 1.0
    assert summary["by_subject"]["transformers"].commit_acc is None
    assert aggregate([]).cases == 0


def test_per_track_rows_follow_the_track_order_and_default_to_easy():
    right = hyp("tinyserve/kv_cache.py", "BlockManager.allocate")
    at_base = Truth("tinyserve/kv_cache.py", "BlockManager.allocate", None, "kv-cache", "m")
    scores = [
        score_case("r", "kv-cache", "transformers", [report(hyp())], TRUTH, COMMITS, track="real"),
        score_case(
            "h1",
            "kv-cache",
            "tinyserve",
            [report(right, cost={"engine_runs": 4, "wall_s": 2.0})],
            TRUTH,
            COMMITS,
            track="hard",
        ),
        score_case(
            "h2", "sampling", "tinyserve", [report(hyp(), right, cost={"engine_runs": 2})], TRUTH, COMMITS, track="hard"
        ),
        score_case("b", "kv-cache", "tinyserve", [report(right)], at_base, COMMITS, track="at-base"),
        score_case("e", "kv-cache", "tinyserve", [report(right, commit={"sha": "abcdef0"})], TRUTH, COMMITS),
    ]
    by_track = summarize(scores)["by_track"]
    assert list(by_track) == ["easy", "hard", "at-base", "real"]
    hard = by_track["hard"]
    assert (hard.cases, hard.pass_at_1, hard.pass_at_5) == (2, 0.5, 1.0)
    assert (hard.commit_acc, hard.engine_runs, hard.wall_s) == (0.0, 3.0, 1.0)
    assert by_track["at-base"].commit_acc is None, "a bug at base has no commit to name"
    assert by_track["easy"].commit_acc == 1.0 and by_track["real"].pass_at_5 == 0.0
    assert scores[-1].to_dict()["track"] == "easy"
