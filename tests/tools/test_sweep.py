"""The sweep's pure parts: matrix files, covering order, cell scenarios, grouping, minimizing, JUnit."""

from __future__ import annotations

import itertools

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from tools.engines.protocol import Capabilities
from tools.scenario import EngineSpec, from_dict
from tools.sweep.group import CellResult, any_layer, group_cells, minimize, reductions
from tools.sweep.matrix import (
    AXES,
    PAIRED_AXES,
    TARGET_DTYPES,
    WORKLOADS,
    Cell,
    ConfigVariant,
    Feature,
    Matrix,
    MatrixError,
    Scope,
    covering,
    covering_order,
    default_matrix,
    load_matrix,
    longest_sequence,
    nearest_first,
    options_of,
    scenario_of,
)
from tools.sweep.output import junit_xml, markdown_summary

FEATURES = {
    "prefix": Feature({"enable_prefix_caching": True}),
    "blocks": Feature({"block_size": 4}),
    "int4": Feature({"quantization": "int4"}, alone=True),
}


def _combos(cells, t):
    return {tuple((a, c.axis(a)) for a in axes) for c in cells for axes in itertools.combinations(AXES, t)}


def test_default_matrix_covers_every_triple_of_values_in_a_third_of_the_product():
    m = default_matrix(FEATURES)
    assert m.features == ("none", "prefix", "blocks", "int4", "all")
    assert "float64" not in m.dtype
    full = Matrix(m.arch, m.dtype, m.features, m.workload, strength=len(AXES)).cells()
    assert len(full) == len(m.arch) * len(m.dtype) * 5 * len(m.workload)
    cells = m.cells()
    assert _combos(cells, 3) == _combos(full, 3)  # every 3 values of 3 axes meet in some cell
    assert len(set(cells)) == len(cells) <= len(full) // 2
    assert len(covering(full, 2)) < len(cells)  # pairs need fewer still


VARIANTS = {
    "rope_linear": ConfigVariant({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "caps_off": ConfigVariant({"attn_logit_softcapping": None}, archs=("gemma2",)),
    "keys_omitted": ConfigVariant({"omit_keys": ["rms_norm_eps"]}),
}


def test_config_axis_meets_every_value_in_pairs_without_growing_the_array():
    """The config variants ride on the four-axis covering array: its triples all stay, each variant
    meets every value of every other axis on an arch that ships it, and the cell count barely grows."""
    m = default_matrix(FEATURES, VARIANTS)
    assert m.config == ("preset", *VARIANTS)
    base = Matrix(m.arch, m.dtype, m.features, m.workload).cells()
    cells = m.cells(VARIANTS)
    others = [a for a in AXES if a not in PAIRED_AXES]
    assert {tuple((a, c.axis(a)) for a in others) for c in base} <= {
        tuple((a, c.axis(a)) for a in others) for c in cells
    }
    assert all(c.config == "preset" or VARIANTS[c.config].fits(c.arch) for c in cells)
    for config in m.config:
        for axis in others:
            values = {getattr(c, axis) for c in base if config == "preset" or VARIANTS[config].fits(c.arch)}
            assert values == {c.axis(axis) for c in cells if c.config == config}, (config, axis)
    assert {c.config for c in cells if c.arch != "gemma2"} == {"preset", "rope_linear", "keys_omitted"}
    assert len(base) <= len(cells) <= len(base) * 1.1
    assert len(set(cells)) == len(cells)


def test_cell_ids_name_the_config_variant_only_off_the_preset():
    assert Cell("llama", "float32", "none", "long").id == "llama-float32-none-long"
    assert Cell("llama", "float32", "none", "long", "rope_linear").id == "llama-float32-none-long-rope_linear"


def test_config_variant_goes_to_the_checkpoint_not_the_engine():
    target = EngineSpec("tinyserve", "float32", {})
    sc = scenario_of(Cell("gemma2", "float32", "none", "long", "caps_off"), target, FEATURES, None, VARIANTS)
    assert sc.model["attn_logit_softcapping"] is None and sc.model["query_pre_attn_scalar"] == 24
    assert sc.target.options == {}
    plain = scenario_of(Cell("llama", "float32", "none", "long"), target, FEATURES, None, VARIANTS)
    assert "rope_scaling" not in plain.model
    assert sc.model["perturb_init"] and plain.model["perturb_init"]  # biases and norm weights not 0 and 1


def _report(model: dict, dtype: str = "float32", options: dict | None = None, sampled: bool = False):
    sampling = {"temperature": 0.7} if sampled else {}
    return from_dict(
        {
            "model": {"seed": 4, **model},
            "target": {"engine": "tinyserve", "dtype": dtype, "options": options or {}},
            "workload": {"requests": [{"prompt_ids": list(range(3, 90)), "max_tokens": 4, "sampling": sampling}]},
        }
    )


def test_cells_nearest_a_reported_scenario_run_first_and_ties_keep_the_covering_order():
    m = default_matrix(FEATURES, VARIANTS)
    cells = covering_order(m.cells(VARIANTS))
    rope = nearest_first(
        cells, _report({"arch": "qwen2", "rope_scaling": {"type": "linear", "factor": 4.0}}), FEATURES, VARIANTS
    )
    assert sorted(c.id for c in rope) == sorted(c.id for c in cells)
    assert (rope[0].arch, rope[0].config) == ("qwen2", "rope_linear")  # the rope type counts most
    caps = nearest_first(
        cells, _report({"arch": "gemma2", "attn_logit_softcapping": 9.0}, "bfloat16"), FEATURES, VARIANTS
    )
    assert caps[0].config == "caps_off" and caps[0].arch == "gemma2"
    prefix = nearest_first(
        cells, _report({"arch": "llama"}, options={"enable_prefix_caching": True}), FEATURES, VARIANTS
    )
    assert options_of(prefix[0], FEATURES).get("enable_prefix_caching") and prefix[0].arch == "llama"
    sampled = nearest_first(cells, _report({"arch": "mistral"}, sampled=True), FEATURES, VARIANTS)
    assert sampled[0].workload in ("sampled", "long") and sampled[0].arch == "mistral"
    same = [c for c in rope if (c.arch, c.dtype, c.config, c.workload) == ("llama", "bfloat16", "preset", "long")]
    assert same == [c for c in cells if c in same]  # ties keep the covering order


def test_matrix_file_overrides_axes_and_keeps_defaults(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('arch = ["gemma2"]\nfeatures = ["prefix", "prefix"]\nstrength = 4\n')
    m = load_matrix(path, FEATURES)
    assert m.arch == ("gemma2",) and m.features == ("prefix",)
    assert m.dtype == default_matrix(FEATURES).dtype
    assert len(m.cells()) == len(m.dtype) * len(m.workload)  # strength 4: the full product


@pytest.mark.parametrize(
    "text,words",
    [
        ('archs = ["llama"]', "unknown axes ['archs']"),
        ('arch = ["falcon"]', "arch ['falcon'] unknown here"),
        ('features = ["speculative"]', "features ['speculative'] unknown here"),
        ('dtype = ["float64"]', "dtype ['float64'] unknown here"),
        ("workload = []", "must be a non-empty list"),
        ('arch = "llama"', "must be a non-empty list"),
        ("arch = [", "not valid TOML"),
        ("strength = 6", "strength must be an integer from 1 to 5"),
        ('config = ["rope_nope"]', "config ['rope_nope'] unknown here"),
        ('strength = "full"', "strength must be an integer"),
    ],
)
def test_bad_matrix_files_say_what_is_wrong(tmp_path, text, words):
    path = tmp_path / "m.toml"
    path.write_text(text)
    with pytest.raises(MatrixError, match=None) as e:
        load_matrix(path, FEATURES)
    assert words in str(e.value) and str(path) in str(e.value)


def test_missing_matrix_file_is_bad_input(tmp_path):
    with pytest.raises(MatrixError, match="cannot read it"):
        load_matrix(tmp_path / "nope.toml", FEATURES)


def test_covering_order_covers_every_value_first_then_pairs():
    m = default_matrix(FEATURES)
    cells = Matrix(m.arch, m.dtype, m.features, m.workload, strength=len(AXES)).cells()
    ordered = covering_order(cells)
    assert sorted(c.id for c in ordered) == sorted(c.id for c in cells)
    widest = max(len(set(c.axis(a) for c in cells)) for a in AXES)
    head = ordered[:widest]
    for axis in AXES:
        assert {c.axis(axis) for c in head} == {c.axis(axis) for c in cells}, axis
    pairs = {((a, c.axis(a)), (b, c.axis(b))) for c in cells for i, a in enumerate(AXES) for b in AXES[i + 1 :]}
    covered, needed = set(), None
    for count, c in enumerate(ordered, 1):
        covered |= {((a, c.axis(a)), (b, c.axis(b))) for i, a in enumerate(AXES) for b in AXES[i + 1 :]}
        if needed is None and covered == pairs:
            needed = count
    assert needed is not None and needed < len(cells) / 2  # all pairs long before the full product
    assert covering_order(cells, seed=0) == ordered  # deterministic


def test_cell_scenarios_switch_their_features_and_keep_user_options():
    target = EngineSpec("tinyserve", "float32", {"max_num_seqs": 4})
    sc = scenario_of(Cell("mistral", "bfloat16", "all", "long"), target, FEATURES)
    assert sc.target.dtype == "bfloat16"
    assert sc.target.options == {"max_num_seqs": 4, "enable_prefix_caching": True, "block_size": 4}  # not int4
    assert options_of(Cell("llama", "float32", "int4", "long"), FEATURES) == {"quantization": "int4"}
    assert len(sc.requests[0].prompt_ids) > 32  # past mistral's tiny sliding window
    gemma = scenario_of(Cell("gemma2", "float32", "none", "long"), target, FEATURES)
    assert gemma.model["query_pre_attn_scalar"] != 16  # not the preset's head_dim: a mix-up shows
    assert options_of(Cell("llama", "float32", "none", "staggered"), FEATURES) == {}
    sampled = scenario_of(Cell("llama", "float32", "none", "sampled"), target, FEATURES)
    assert all(r.sampling["ignore_eos"] for r in sampled.requests)


def test_workloads_vary_sampling_per_request_mix_lengths_and_carry_multi_byte_text():
    target = EngineSpec("tinyserve", "float32", {})
    sampled = scenario_of(Cell("llama", "float32", "none", "sampled"), target, FEATURES).requests
    assert [r.greedy for r in sampled].count(True) == 2  # plain greedy and greedy with penalties among sampled ones
    penalised = [any(r.sampling.get(k) for k in ("repetition_penalty", "presence_penalty")) for r in sampled]
    assert penalised[0] is False and penalised.count(True) >= 2  # the penalised rows: a subset after an unpenalised one
    for key in ("temperature", "top_k", "min_p", "presence_penalty", "repetition_penalty"):
        assert len({r.sampling.get(key) for r in sampled}) > 1, key  # one batch, settings differ per request
    assert any(r.sampling.get("top_k") for r in sampled) and any(r.sampling.get("min_p", 0) >= 0.1 for r in sampled)
    long = scenario_of(Cell("mistral", "float32", "none", "long"), target, FEATURES).requests
    lengths = sorted(len(r.prompt_ids) for r in long)
    assert lengths[0] < 16 < 32 < lengths[-1]  # a short request decoded beside one past the window
    staggered = scenario_of(Cell("llama", "float32", "none", "staggered"), target, FEATURES).requests
    text = [r.prompt for r in staggered if r.prompt is not None]
    widths = {len(ch.encode()) for ch in text[0]}
    assert {1, 2, 3, 4} <= widths  # ASCII, Latin/Greek, CJK and an emoji: UTF-8 pieces of every width


def test_sampled_workload_has_each_cut_alone_at_a_temperature_other_than_one():
    rows = [r["sampling"] for r in WORKLOADS["sampled"](None) if r["sampling"].get("temperature", 0) > 0]
    cuts = {"top_k": lambda s: s.get("top_k", 0) > 0, "top_p": lambda s: s.get("top_p", 1.0) < 1.0}
    cuts["min_p"] = lambda s: s.get("min_p", 0) > 0
    alone = {name for s in rows for name, on in cuts.items() if on(s) and sum(c(s) for c in cuts.values()) == 1}
    assert alone == set(cuts) and any(sum(c(s) for c in cuts.values()) == 3 for s in rows)  # alone and combined
    nucleus = [s for s in rows if cuts["top_p"](s) and not cuts["top_k"](s)]
    assert nucleus[0]["top_p"] < 0.5 and nucleus[0]["top_k"] == -1  # most mass cut; top-k off as clients write it
    assert all(s["temperature"] != 1.0 for s in rows)


def test_sampled_workload_holds_two_requests_with_the_same_min_p_that_bites():
    """An engine that batches requests by their settings samples these two together: a min-p cut that
    reads another row's top probability shows in one of them."""
    rows = WORKLOADS["sampled"](None)
    same: dict = {}
    for r in rows:
        same.setdefault(repr((sorted(r["sampling"].items()), r["max_tokens"])), []).append(r)
    twins = [g for g in same.values() if len(g) > 1]
    assert len(twins) == 1 and len(twins[0]) == 2
    a, b = twins[0]
    assert a["prompt_ids"] != b["prompt_ids"] and a["sampling"]["min_p"] >= 0.3 and a["sampling"]["temperature"] < 1


def test_sampled_workload_holds_uncut_cold_rows_with_their_own_seeds_and_prompts():
    """A draw from the distribution before temperature shows only where temperature sharpens a distribution
    the cuts leave whole (docs/sampling.md): three uncut rows at a low temperature, each with its own random
    numbers (a seed no other row has) and prompt, so the drawn tokens' test pools all three."""
    rows = WORKLOADS["sampled"](None)
    cut = ("top_k", "top_p", "min_p")
    cold = [r for r in rows if 0 < r["sampling"]["temperature"] <= 0.3 and not any(k in r["sampling"] for k in cut)]
    assert len(cold) == 3 and all(r["max_tokens"] >= 8 for r in cold)
    seeds = [r["sampling"].get("seed") for r in rows]
    assert all(seeds.count(r["sampling"]["seed"]) == 1 for r in cold)
    prompts = [r["prompt_ids"] for r in rows]
    assert all(prompts.count(r["prompt_ids"]) == 1 for r in cold)


def test_a_config_variant_crossed_with_three_axes_meets_every_such_triple():
    variants = {**VARIANTS, "scale": ConfigVariant({"initializer_range": 0.2}, crossed=("arch", "dtype", "workload"))}
    m = default_matrix(FEATURES, variants)
    cells = m.cells(variants)
    met = {(c.arch, c.dtype, c.workload) for c in cells if c.config == "scale"}
    assert met == set(itertools.product(m.arch, m.dtype, m.workload))
    assert {(c.dtype, c.workload) for c in cells if c.config == "rope_linear"} == set(
        itertools.product(TARGET_DTYPES, WORKLOADS)
    )


def test_a_feature_the_engine_runs_on_some_archs_only_gets_cells_of_those_archs():
    declared = {**FEATURES, "fast_attn": Feature({"attn": "fast"}, archs=("llama", "qwen2"))}
    m = default_matrix(declared)
    cells = m.cells(None, declared)
    assert {c.arch for c in cells if c.features == "fast_attn"} == {"llama", "qwen2"}
    assert not any(c.features == "all" and c.arch in ("mistral", "gemma2") for c in cells)  # all holds it too
    assert {(c.arch, c.dtype, c.workload) for c in cells} == set(itertools.product(m.arch, m.dtype, m.workload))


def test_cells_the_engine_does_not_run_are_left_out_before_the_covering_with_their_reasons():
    """An engine that runs three archs in two dtypes, one of them without its sliding window: no cell
    of another arch or dtype, none of the windowless arch past its window, and what is left still has
    every pair of its values in some cell (left out before the covering, not cut from it after)."""
    caps = Capabilities(
        taps=(), dtypes=("float32", "float16"), archs=("llama", "qwen2", "mistral"), unwindowed_archs=("mistral",)
    )
    scope = Scope("cengine", caps)
    m = default_matrix(FEATURES)
    cells = m.cells(None, FEATURES, scope)
    assert {c.arch for c in cells} == {"llama", "qwen2", "mistral"} and {c.dtype for c in cells} == {
        "float16",
        "float32",
    }
    window = 32  # the mistral preset's
    assert (
        longest_sequence(WORKLOADS["long"](window)) > window
        and longest_sequence(WORKLOADS["sampled"](window)) <= window
    )
    assert {c.workload for c in cells if c.arch == "mistral"} == {"sampled"}
    kept = [c for c in Matrix(m.arch, m.dtype, m.features, m.workload, strength=len(AXES)).cells(None, FEATURES, scope)]
    assert _combos(cells, 2) == _combos(kept, 2)
    assert all(scope.refuses(c) is None for c in cells)
    reasons = m.left_out(scope)
    assert "gemma2: cengine runs llama, qwen2, mistral models only, not gemma2" in reasons
    assert any(r.startswith("bfloat16: cengine runs float32, float16") for r in reasons)
    assert any(
        r.startswith("mistral x long: ")
        and r.endswith("pass mistral's 32-token sliding window, which cengine does not implement")
        for r in reasons
    )
    assert not any("sampled" in r for r in reasons)
    anything = Scope("any", Capabilities(taps=()))
    assert m.left_out(anything) == [] and len(m.cells(None, FEATURES, anything)) == len(m.cells(None, FEATURES))
    summary = markdown_summary([], [], {}, "cengine", 1.0, reasons)
    assert "## Left out of the matrix" in summary and f"- {reasons[0]}" in summary
    assert "Left out" not in markdown_summary([], [], {}, "cengine", 1.0)


def test_a_text_prompt_counts_its_bytes_toward_the_longest_sequence():
    assert longest_sequence([{"prompt": "ab€", "max_tokens": 4}, {"prompt_ids": [1, 2], "max_tokens": 3}]) == 9


def test_staggered_workload_holds_a_whole_cached_prompt_and_one_differing_at_a_blocks_last_token():
    requests = WORKLOADS["staggered"](None)
    first = requests[0]["prompt_ids"]
    later = [r for r in requests if r.get("arrival_step", 0) > 0 and "prompt_ids" in r]
    whole = [r["prompt_ids"] for r in later if first[: len(r["prompt_ids"])] == r["prompt_ids"]]
    assert any(all(len(p) % size == 0 for size in (4, 16, 32)) for p in whole)  # every block of it cached
    differing = [r["prompt_ids"] for r in later if r["prompt_ids"][:31] == first[:31]]
    assert any(p[31] != first[31] and len(p) > 32 for p in differing)  # 31: a block's last token at 4, 16, 32


def _r(arch, features, workload, tap, status="diverge"):
    return CellResult(Cell(arch, "float32", features, workload), status, 1.0, f"at {tap}", first_tap=tap)


def test_groups_fold_cells_whose_feature_is_not_the_trigger():
    results = [
        _r("llama", "none", "long", "layers.1.attn.out"),
        _r("qwen2", "prefix", "staggered", "layers.0.attn.out"),
        _r("llama", "all", "long", "layers.1.attn.out"),
        _r("llama", "blocks", "staggered", "layers.0.attn.k"),
        _r("llama", "all", "staggered", "layers.0.attn.k"),
        _r("llama", "none", "sampled", "sampler.probs"),
        _r("gemma2", "none", "long", "layers.1.attn.out", status="agree"),
    ]
    groups = group_cells(results)
    assert [(g.key, len(g.cells)) for g in groups] == [
        (("layers.*.attn.out", "none"), 3),
        (("layers.*.attn.k", "blocks"), 2),
        (("sampler.probs", "none"), 1),
    ]
    assert groups[0].workloads == ["long", "staggered"]
    assert any_layer("layers.12.mlp.down") == "layers.*.mlp.down"


def test_representative_prefers_full_precision():
    a = CellResult(Cell("qwen2", "bfloat16", "none", "long"), "diverge", first_tap="logits")
    b = CellResult(Cell("mistral", "float32", "none", "long"), "diverge", first_tap="logits")
    (g,) = group_cells([a, b])
    assert g.representative() is b


def _scenario():
    return from_dict(
        {
            "model": {"arch": "llama"},
            "target": {"engine": "tinyserve", "options": {"block_size": 4, "enable_prefix_caching": True}},
            "workload": {
                "requests": [{"prompt_ids": [5, 6, 7], "max_tokens": 8}, {"prompt_ids": [9, 10], "max_tokens": 8}]
            },
        }
    )


def test_minimize_keeps_only_what_the_divergence_needs():
    # the "bug" needs block_size and request 1; anything else can go
    def diverges(sc):
        return "block_size" in sc.target.options and any(r.prompt_ids == (9, 10) for r in sc.requests)

    small, steps, used = minimize(_scenario(), diverges, budget=20)
    assert small.target.options == {"block_size": 4}
    assert [r.prompt_ids for r in small.requests] == [(9, 10)]
    assert small.requests[0].max_tokens == 2
    assert steps[0] == "without option enable_prefix_caching" and used <= 20


def test_minimize_respects_budget_and_user_options():
    calls = []
    small, _, used = minimize(
        _scenario(),
        lambda sc: calls.append(sc) or True,
        budget=2,
        keep_options=frozenset({"block_size", "enable_prefix_caching"}),
    )
    assert used == 2 == len(calls)
    assert set(small.target.options) == {"block_size", "enable_prefix_caching"}
    assert all("option" not in d for d, _ in reductions(small, frozenset(small.target.options)))


def test_junit_is_read_by_a_real_consumer(tmp_path):
    results = [
        _r("llama", "none", "long", "layers.1.attn.out"),
        CellResult(Cell("qwen2", "float32", "none", "long"), "agree", 2.5, "agree"),
        CellResult(Cell("gemma2", "float16", "all", "sampled"), "error", 0.5, "engine crashed: boom"),
        CellResult(Cell("mistral", "float16", "all", "sampled"), "skipped", 0.0, "not run: budget"),
    ]
    path = tmp_path / "junit.xml"
    path.write_text(junit_xml(results, "diffdx check", "tinyserve"))
    xml = JUnitXml.fromfile(str(path))
    suite = next(iter(xml))
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (4, 1, 1, 1)
    kinds = {case.name: [type(r) for r in case.result] for case in suite}
    assert kinds == {
        "llama-float32-none-long": [Failure],
        "qwen2-float32-none-long": [],
        "gemma2-float16-all-sampled": [Error],
        "mistral-float16-all-sampled": [Skipped],
    }
    md = markdown_summary(results, group_cells(results), {}, "tinyserve", 10.0)
    assert "1 diverge, 1 errored, 1 not run" in md and "mistral-float16-all-sampled" in md


def test_config_variant_options_and_arch_keys_reach_the_scenario():
    variants = {
        "v": ConfigVariant(
            {"rms_norm_eps": 1e-5, "config_json": {"a": 1}, "by_arch": {"gemma2": {"config_json": {"b": 2}}}}
        ),
        "w": ConfigVariant({}, options={"max_model_len": 2048}),
    }
    spec = EngineSpec("tinyserve", "float32", {"block_size": 8})
    gemma = scenario_of(Cell("gemma2", "float32", "none", "long", "v"), spec, {}, None, variants)
    llama = scenario_of(Cell("llama", "float32", "none", "long", "v"), spec, {}, None, variants)
    assert gemma.model["config_json"] == {"a": 1, "b": 2} and llama.model["config_json"] == {"a": 1}
    assert "by_arch" not in gemma.model and gemma.model["rms_norm_eps"] == 1e-5
    served = scenario_of(Cell("llama", "float32", "none", "long", "w"), spec, {}, None, variants)
    assert served.target.options == {"max_model_len": 2048, "block_size": 8}
    assert "max_model_len" not in llama.target.options


def test_each_config_variant_meets_every_dtype_and_workload_together():
    cells = default_matrix(FEATURES, VARIANTS).cells(VARIANTS)
    for config in VARIANTS:
        met = {(c.dtype, c.workload) for c in cells if c.config == config}
        assert met == set(itertools.product(TARGET_DTYPES, WORKLOADS)), config


def test_a_config_variant_crossed_with_dtype_and_features_meets_every_such_pair():
    """A variant whose bugs need a precision and a code path (outlier activations: a float16 sum in a
    quantized matmul) meets every (dtype, feature set) pair; the others keep dtype x workload."""
    variants = {**VARIANTS, "outliers": ConfigVariant({"mlp_input_outliers": 200.0}, crossed=("dtype", "features"))}
    m = default_matrix(FEATURES, variants)
    cells = m.cells(variants)
    met = {(c.dtype, c.features) for c in cells if c.config == "outliers"}
    assert met == set(itertools.product(m.dtype, m.features))
    assert {(c.dtype, c.workload) for c in cells if c.config == "rope_linear"} == set(
        itertools.product(TARGET_DTYPES, WORKLOADS)
    )
    assert {c.workload for c in cells if c.config == "outliers"} == set(WORKLOADS)  # still every value alone


def test_long_workload_batches_two_windowed_rows_of_different_lengths_within_eight_blocks():
    for window in (None, 32, 20):
        lengths = [len(r["prompt_ids"]) for r in WORKLOADS["long"](window)]
        past = [n for n in lengths if n > (window or 36)]
        assert len(set(past)) == 2 and min(lengths) < 16
        assert max(lengths) + 10 <= 8 * 16  # the long request and its decode fit the small pool
        # ... and a 128-token pretraining length (rope_dynamic's) while the batch's rows together pass it
        assert max(lengths) + 10 <= 128 < sum(lengths)


def test_a_cell_leaves_out_the_sampling_keys_the_engine_does_not_honour():
    """The sweep's sampled workload sets presence / frequency penalties; an engine that does not honour them
    (its Capabilities.sampling_keys) is swept on the rest, never handed a key it would silently drop."""
    target = EngineSpec("transformers", "float32", {})
    honoured = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "logprobs", "ignore_eos")
    cell = Cell("llama", "float32", "none", "sampled")
    full = scenario_of(cell, target, FEATURES, None, VARIANTS)
    kept = scenario_of(cell, target, FEATURES, None, VARIANTS, honoured)
    assert any("presence_penalty" in r.sampling for r in full.requests)
    assert all(set(r.sampling) <= set(honoured) for r in kept.requests)
    assert [r.sampling.get("repetition_penalty") for r in kept.requests] == [
        r.sampling.get("repetition_penalty") for r in full.requests
    ]
