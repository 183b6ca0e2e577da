"""Trigger search on a real bug that hides in a single-request scenario."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmark.build import build_case_repo
from benchmark.cases import BUNDLED_CASES_DIR, load_case
from tools.probe.prober import Prober
from tools.reproduce import reproduce, variant_names, variants
from tools.scenario import from_dict

BASE = {
    "model": {"arch": "llama", "seed": 0},
    "target": {"engine": "tinyserve", "dtype": "float32"},
    "workload": {"requests": [{"prompt_ids": [5, 6, 7, 8], "max_tokens": 4}]},
}


def test_every_variant_is_a_valid_scenario():
    sc = from_dict(BASE)
    names = [n for n, _ in variant_names(sc)]
    assert {"batch", "prefix_caching", "chunked_prefill", "penalties"} <= set(names)
    for v in variants(sc):
        out = v.apply(sc, 512)
        assert from_dict(out.to_dict()) == out, v.name
        assert all(t < 512 for r in out.requests for t in (r.prompt_ids or ())), v.name
    everything = next(v for v in variants(sc) if v.name == "everything").apply(sc, 512).target.options
    # axes switched on only alone (one quantization scheme; tinyserve refuses it with tensor parallelism)
    assert "quantization" not in everything and "tensor_parallel_size" not in everything
    assert everything["enable_prefix_caching"] and everything["speculative"] == "ngram"


def test_transformers_target_gets_no_engine_option_variants():
    sc = from_dict({**BASE, "target": {"engine": "transformers", "dtype": "float32"}})
    assert "prefix_caching" not in [n for n, _ in variant_names(sc)]


@pytest.fixture(scope="module")
def penalty_bug(tmp_path_factory):
    """A bundled case whose sampler bug needs a repetition penalty in a mixed batch."""
    folder = BUNDLED_CASES_DIR / "ts-rep-penalty-batch-union"
    if not folder.exists():
        pytest.skip("case not bundled")
    case = load_case(folder)
    repo = build_case_repo(case, tmp_path_factory.mktemp("penalty") / "repo")
    return case, repo


def test_search_finds_the_hidden_trigger(penalty_bug):
    case, repo = penalty_bug
    alone = case.scenario.with_requests([replace(case.scenario.requests[1])])  # greedy, no penalty
    prober = Prober()
    repro = reproduce(alone, prober, repo, order=["penalties"])
    assert repro.reproduced and "penalties" in repro.trigger
    assert not repro.trials[0].diverged  # as given: the engines agree
    assert repro.baseline == alone and repro.precision == "logic"
    assert repro.probe.first.tap.startswith("sampler.")


def test_budget_ends_the_search(penalty_bug):
    case, repo = penalty_bug
    alone = case.scenario.with_requests([replace(case.scenario.requests[1])])
    repro = reproduce(alone, Prober(), repo, budget_runs=3, order=["long_generation"])
    assert not repro.reproduced and len(repro.trials) <= 2


# --- does a variant's divergence match the issue? (issue 16) -------------------------------------


def _diverged_at(tap: str):
    from tools.probe.compare import Divergence
    from tools.probe.prober import ProbeResult

    return ProbeResult("float32", Divergence(tap, 0, [0], [4], [0], 50.0), {}, [], [tap], 3)


def _variant(name: str):
    return next(v for v in variants(from_dict(BASE)) if v.name == name)


PREFIX_ISSUE = "Greedy output changes when prefix caching is on and a second request shares the prompt."


def test_a_feature_the_issue_never_mentions_is_a_side_finding():
    from tools.reproduce import off_issue

    greedy = from_dict(BASE)
    why = off_issue(_variant("sampling"), greedy, PREFIX_ISSUE, _diverged_at("sampler.probs"))
    assert why and "sampled requests" in why
    assert off_issue(_variant("penalties"), greedy, PREFIX_ISSUE, _diverged_at("sampler.logits"))
    assert off_issue(_variant("prefix_caching"), greedy, PREFIX_ISSUE, _diverged_at("layers.0.attn.out")) is None


def test_a_feature_the_issue_names_or_its_scenario_uses_is_the_issue():
    from tools.reproduce import off_issue

    greedy = from_dict(BASE)
    assert (
        off_issue(_variant("sampling"), greedy, "With min-p set the output is odd", _diverged_at("sampler.probs"))
        is None
    )
    assert off_issue(_variant("sampling"), greedy, "TOP_P=0.9 breaks it", _diverged_at("sampler.probs")) is None
    sampled = from_dict({**BASE, "workload": {"requests": [{"prompt_ids": [5, 6], "sampling": {"temperature": 0.7}}]}})
    assert off_issue(_variant("sampling"), sampled, PREFIX_ISSUE, _diverged_at("sampler.probs")) is None
    assert off_issue(_variant("everything"), greedy, PREFIX_ISSUE, _diverged_at("layers.1.out")) is None


def test_a_sampler_divergence_on_an_issue_without_sampling_is_a_side_finding():
    from tools.reproduce import off_issue

    greedy = from_dict(BASE)
    assert off_issue(_variant("batch"), greedy, PREFIX_ISSUE, _diverged_at("layers.0.mlp.down")) is None
    why = off_issue(_variant("batch"), greedy, PREFIX_ISSUE, _diverged_at("sampler.token"))
    assert why and "sampler" in why
