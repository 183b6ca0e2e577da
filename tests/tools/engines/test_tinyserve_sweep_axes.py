"""The sweep axes tinyserve's adapter declares beyond its options and config variants: a small KV
pool (preemption, eviction), torch.compile where the tree has it, 3:1 GQA with a wide head_dim.
Real tiny runs of the bundled tinyserve against transformers: each axis changes what runs, and
the bug-free engine agrees."""

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.faults import buggy_tinyserve
from tools.engines import engine_capabilities
from tools.engines.tinyserve import CONFIG_AXES, SUBJECT_ROOT, TinyServeEngine
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.prober import Prober
from tools.scenario import EngineSpec
from tools.sweep.matrix import WORKLOADS, Cell, ConfigVariant, Feature, scenario_of

TARGET = EngineSpec("tinyserve", "float32", {})
REPLACEMENT = "\ufffd"  # what decoding a token that ends inside a character gives for its tail
VARIANTS = {a.name: ConfigVariant(dict(a.model), tuple(a.archs)) for a in CONFIG_AXES}


def declared(caps) -> dict[str, Feature]:
    return {a.name: Feature(dict(a.options), a.alone) for a in caps.trigger_axes}


def probe(cell: Cell, features: dict[str, Feature], source=None):
    sc = scenario_of(cell, TARGET, features, None, VARIANTS)
    return sc, Prober().probe(sc, source)


def test_a_small_kv_pool_preempts_and_evicts_yet_agrees():
    features = declared(TinyServeEngine().capabilities())
    assert features["kv_pool"].alone  # blocks of 4 from the other features would not fit a request
    _, result = probe(Cell("llama", "float32", "kv_pool", "staggered"), features)
    assert not result.diverged, result.summary
    assert result.target.meta["num_kv_blocks"] == features["kv_pool"].options["num_kv_blocks"]
    assert result.target.meta["preemptions"] > 0  # the pool bit: requests were preempted and recomputed


def test_the_text_request_splits_characters_across_tokens_and_its_text_agrees():
    sc, result = probe(Cell("llama", "float32", "none", "staggered"), {})
    assert not result.diverged, result.summary  # the text is compared with the reference's decoding too
    text = next(i for i, r in enumerate(sc.requests) if r.prompt is not None)
    tokenizer = AutoTokenizer.from_pretrained(ensure_checkpoint(sc.model))
    ids = result.target.outputs[text].output_ids
    pieces = sum(tokenizer.decode([i]).count(REPLACEMENT) for i in ids)
    assert pieces > tokenizer.decode(ids).count(REPLACEMENT)  # some token ends inside a character another ends
    assert any(i in tokenizer.all_special_ids for i in ids)  # the draw holds a special id, which the text leaves out
    assert result.target.outputs[text].text == tokenizer.decode(ids, skip_special_tokens=True)


def test_per_request_sampling_in_one_batch_agrees():
    _, result = probe(Cell("llama", "float32", "none", "sampled"), {})
    assert not result.diverged, result.summary
    rows = len(WORKLOADS["sampled"](None))
    assert len(result.target.outputs) == rows and all(len(o.output_ids) == 8 for o in result.target.outputs)


# A nucleus whose cumulative sum runs in bfloat16 (it stops growing near 0.5) and a top-k that takes only
# 0 for off (-1 then keeps one token): both keep a subset of the reference's kept set, so every drawn token
# is one the reference could draw; the `sampler.probs` judging sees the tokens dropped against it.
HALF_NUCLEUS = (
    "cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)",
    "cum = sorted_logits.to(torch.bfloat16).softmax(dim=-1).cumsum(dim=-1).float()",
)
TOP_K_ZERO_ONLY = ("p.top_k if p.top_k > 0 else vocab_size", "p.top_k if p.top_k != 0 else vocab_size")


@pytest.mark.parametrize("fault,dtype", [(HALF_NUCLEUS, "bfloat16"), (TOP_K_ZERO_ONLY, "float32")])
def test_the_sampled_workload_sees_a_cut_that_keeps_too_few_tokens(fault, dtype, tmp_path):
    tree = buggy_tinyserve(tmp_path / "tree", *fault)
    prober = Prober()
    sc = scenario_of(Cell("llama", dtype, "none", "sampled"), TARGET, {})
    clean = prober.probe(sc)
    assert not clean.diverged, clean.summary  # the tight nucleus's undecided tokens raise no alarm
    buggy = prober.probe(sc, tree)
    assert buggy.diverged and buggy.first.tap == "sampler.probs", buggy.summary


@pytest.mark.parametrize("feature", ["prefix_caching", "all"])
def test_a_whole_prompt_served_from_the_prefix_cache_and_a_block_missing_on_its_last_token_agree(feature):
    """The staggered workload's full-prompt hit and its block differing only in its last token, with
    16-token blocks (prefix caching) and 4-token blocks with chunked prefill and speculation (all)."""
    features = declared(TinyServeEngine().capabilities())
    _, result = probe(Cell("llama", "float32", feature, "staggered"), features)
    assert not result.diverged, result.summary


def test_int4_off_its_default_group_size_agrees():
    features = declared(TinyServeEngine().capabilities())
    assert features["int4"].options["quant_group_size"] != 32  # the engine's default would hide a dropped one
    _, result = probe(Cell("llama", "float32", "int4", "long"), features)
    assert not result.diverged, result.summary
    assert result.target.meta["weights"]["group_size"] == features["int4"].options["quant_group_size"]


# The row-parallel bias (o_proj, down_proj) handed whole to every rank: added once per rank after the
# all-reduce. Only a checkpoint with such biases runs the rule (the presets have none).
BIAS_EVERY_RANK = (
    "return tensor if rank == 0 else torch.zeros_like(tensor)",
    "return tensor",
)


@pytest.mark.slow
def test_tensor_parallelism_over_a_checkpoint_with_biases_agrees_and_sees_a_bias_on_every_rank(tmp_path):
    features = declared(TinyServeEngine().capabilities())
    cell = Cell("llama", "float32", "tensor_parallel", "sampled", "biases")
    sc = scenario_of(cell, TARGET, features, None, VARIANTS)
    config = json.loads((ensure_checkpoint(sc.model) / "config.json").read_text())
    assert config["attention_bias"] and config["mlp_bias"]
    prober = Prober()
    clean = prober.probe(sc)
    assert not clean.diverged, clean.summary
    tree = buggy_tinyserve(tmp_path / "tree", *BIAS_EVERY_RANK, file=Path("tinyserve/distributed/loader.py"))
    buggy = prober.probe(sc, tree)
    assert buggy.diverged and buggy.first.tap.startswith("layers.0."), buggy.summary


# Integer sums of a weight-only int8 matmul taken in the activation dtype, the scale applied after: past
# float16's range once the MLP inputs carry outlier channels (at the tiny models' scale they never are)
INT_SUMS_IN_ACTIVATION_DTYPE = ("xa = x.to(_acc(x.dtype))", "xa = x")


@pytest.mark.slow
def test_outlier_activations_agree_in_float16_and_show_int8_sums_that_overflow(tmp_path):
    features = declared(TinyServeEngine().capabilities())
    prober = Prober()
    tree = buggy_tinyserve(tmp_path / "tree", *INT_SUMS_IN_ACTIVATION_DTYPE, file=Path("tinyserve/ops/quant_matmul.py"))
    plain = scenario_of(Cell("llama", "float16", "int8", "long"), TARGET, features, None, VARIANTS)
    assert not prober.probe(plain, tree).diverged  # the preset's inputs: the sums stay in range
    sc = scenario_of(Cell("llama", "float16", "int8", "long", "activation_outliers"), TARGET, features, None, VARIANTS)
    clean = prober.probe(sc)
    assert not clean.diverged, clean.summary
    buggy = prober.probe(sc, tree)
    assert buggy.diverged and ".mlp." in buggy.first.tap, buggy.summary


@pytest.mark.slow
def test_gqa3_with_a_wide_head_dim_loads_in_both_and_agrees():
    sc, result = probe(Cell("qwen2", "float32", "none", "long", "gqa3_head_dim_32"), {})
    config = json.loads((ensure_checkpoint(sc.model) / "config.json").read_text())
    heads, kv, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    assert heads == 3 * kv and head_dim != config["hidden_size"] // heads
    assert not result.diverged, result.summary


@pytest.mark.slow
def test_the_compile_axis_is_declared_only_by_a_tree_whose_config_takes_compile(tmp_path):
    assert "compile" not in {a.name for a in engine_capabilities("tinyserve", SUBJECT_ROOT).trigger_axes}
    tree = tmp_path / "tree"
    shutil.copytree(SUBJECT_ROOT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    config = tree / "tinyserve" / "config.py"
    text = config.read_text()
    field = "    tensor_parallel_size: int = 1"
    assert field in text
    config.write_text(text.replace(field, f"{field}\n    compile: bool = False\n    compile_backend: str = 'inductor'"))
    caps = engine_capabilities("tinyserve", tree)
    axis = next(a for a in caps.trigger_axes if a.name == "compile")
    assert axis.alone and axis.options["compile"] is True
    assert set(axis.options) <= set(caps.accepted_options or ())  # options the tree's Config takes
