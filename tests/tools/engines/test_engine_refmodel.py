"""The refmodel reference against transformers 5.24.0: every tap within 1e-10 at fp64.

Random checkpoints come from the factory with every 1-D tensor (norm scales, biases)
perturbed: the factory initialises those to constants, which would leave the norm
scale conventions (w vs 1 + w) and qwen2's q/k/v bias untested.
"""

import shutil

import pytest
import torch

from tools.engines.hf import HFEngine
from tools.engines.protocol import RunJob
from tools.engines.refmodel import RefModelEngine
from tools.engines.runner import run_engine
from tools.probe.align import index
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.taps import HEAD_TAPS, LAYER_TAPS, layer_tap
from tools.scenario import EngineSpec, from_dict

TOLERANCE = 1e-10
SAMPLED = {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.2}

# (id, [model] keys): rope variants, sliding windows shorter than the prompt, soft-capping, GQA, tied heads
CONFIGS = {
    "llama-llama3-gqa1-tied": dict(
        arch="llama",
        num_key_value_heads=1,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen2-yarn-bias-window": dict(
        arch="qwen2",
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    ),
    "mistral-window8-linear": dict(
        arch="mistral", sliding_window=8, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
    "gemma2-softcap-window": dict(arch="gemma2", sliding_window=8),
}
SLOW_CONFIGS = {
    "llama-default": dict(arch="llama"),
    "llama-dynamic": dict(
        arch="llama", max_position_embeddings=32, rope_scaling={"rope_type": "dynamic", "factor": 2.0}
    ),
    "llama-biases-theta": dict(arch="llama", attention_bias=True, mlp_bias=True, rope_theta=500000.0),
    "qwen2-default": dict(arch="qwen2", num_key_value_heads=4),
    "qwen2-dynamic-tied": dict(
        arch="qwen2",
        tie_word_embeddings=True,
        max_position_embeddings=40,
        rope_scaling={"rope_type": "dynamic", "factor": 3.0},
    ),
    "mistral-default": dict(arch="mistral"),
    "mistral-yarn-betas": dict(
        arch="mistral",
        num_key_value_heads=1,
        rope_scaling={"rope_type": "yarn", "factor": 3.0, "beta_fast": 16, "beta_slow": 2},
    ),
    "gemma2-default": dict(arch="gemma2"),
    "gemma2-no-softcap-h48": dict(
        arch="gemma2",
        hidden_size=48,
        head_dim=12,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        num_key_value_heads=1,
    ),
    "gemma2-linear": dict(arch="gemma2", rope_scaling={"rope_type": "linear", "factor": 4.0}),
}


def perturbed_checkpoint(model: dict, out_dir) -> str:
    """Factory checkpoint with its 1-D tensors (norm scales, biases) set to random values."""
    from safetensors.torch import load_file, save_file

    src = ensure_checkpoint(model)
    dst = out_dir / src.name
    if not dst.exists():
        shutil.copytree(src, dst)
        tensors = load_file(str(src / "model.safetensors"))
        g = torch.Generator().manual_seed(1)
        for name, t in tensors.items():
            if t.dim() == 1:
                tensors[name] = t + 0.3 * torch.randn(t.shape, generator=g)
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def teacher_job(model: dict, checkpoint: str, dtype="float64") -> RunJob:
    """Two requests of different lengths (18 and 44 tokens, shorter first), the second sampled;
    teacher sequences include an EOS so that text decoding skips it."""
    g = torch.Generator().manual_seed(0)
    short, long = torch.randint(3, 500, (18,), generator=g).tolist(), torch.randint(3, 500, (44,), generator=g).tolist()
    short[15] = 2
    sc = from_dict(
        {
            "model": model,
            "target": {"engine": "transformers", "dtype": dtype},
            "workload": {
                "requests": [
                    {"prompt_ids": short[:14], "max_tokens": 4},
                    {"prompt_ids": long[:38], "max_tokens": 6, "sampling": SAMPLED},
                ]
            },
        }
    )
    return RunJob(sc, sc.target, checkpoint, teacher=[short, long])


def worst_relative_error(a, b) -> dict[str, float]:
    """Two traces of the same run -> tap -> worst per-row ||a - b|| / ||b|| (keys must match)."""
    ia, ib = index(a), index(b)
    assert set(ia) == set(ib), f"tap sets differ: {sorted(set(ia) ^ set(ib))}"
    worst = {}
    for key, rows in ib.items():
        assert ia[key].positions == rows.positions, key
        y = rows.tensor.double()
        diff = (ia[key].tensor.double() - y).nan_to_num(0.0)  # -inf == -inf in masked sampler rows
        rel = diff.norm(dim=-1) / y.nan_to_num(0.0, neginf=0.0).norm(dim=-1).clamp_min(1e-300)
        worst[key[0]] = max(worst.get(key[0], 0.0), float(rel.max()))
    return worst


def expected_taps(arch: str, layers: int) -> set[str]:
    per_layer = [t for t in LAYER_TAPS if arch == "gemma2" or not t.endswith("post_norm")]
    return {"embed", *HEAD_TAPS, *(layer_tap(i, t) for i in range(layers) for t in per_layer)}


def check_agreement(model: dict, tmp_path):
    job = teacher_job(model, perturbed_checkpoint(model, tmp_path))
    ref, hf = RefModelEngine().run(job), HFEngine().run(job)
    worst = worst_relative_error(ref, hf)
    bad = {k: v for k, v in worst.items() if v > TOLERANCE}
    assert not bad, f"taps beyond {TOLERANCE}: {bad}"
    assert set(worst) == expected_taps(model["arch"], layers=2)
    for o_ref, o_hf in zip(ref.outputs, hf.outputs):
        assert (o_ref.prompt_ids, o_ref.output_ids, o_ref.text) == (o_hf.prompt_ids, o_hf.output_ids, o_hf.text)
        assert o_ref.logprobs == pytest.approx(o_hf.logprobs, rel=1e-10)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_refmodel_matches_transformers_at_fp64(name, tmp_path):
    check_agreement(CONFIGS[name], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW_CONFIGS))
def test_refmodel_matches_transformers_at_fp64_full_matrix(name, tmp_path):
    check_agreement(SLOW_CONFIGS[name], tmp_path)


def test_exact_numerics_differ_from_the_float32_convention_only_by_float32_rounding(tmp_path):
    """`exact = true` lifts the float32 norms / softmax / rope table: far from bit-equal,
    but within float32 rounding of the default (which is what transformers computes)."""
    model = CONFIGS["gemma2-softcap-window"]
    job = teacher_job(model, perturbed_checkpoint(model, tmp_path))
    default = RefModelEngine().run(job)
    job.spec = EngineSpec("refmodel", "float64", {"exact": True})
    exact = RefModelEngine().run(job)
    worst = worst_relative_error(exact, default)
    assert worst["layers.0.attn.q_rot"] > TOLERANCE
    assert max(worst.values()) < 1e-5
    assert exact.meta["numerics"] == "exact"


def test_text_prompt_and_decoding_match_transformers_tokenizer():
    model = {"arch": "llama", "seed": 0}
    sc = from_dict(
        {
            "model": model,
            "target": {"engine": "refmodel", "dtype": "float32"},
            "workload": {"requests": [{"prompt": "The quick brown fox, naïve café.", "max_tokens": 3}]},
        }
    )
    checkpoint = str(ensure_checkpoint(model))
    ref = RefModelEngine().run(RunJob(sc, sc.target, checkpoint, taps=[]))
    hf = HFEngine().run(RunJob(sc, sc.with_target(engine="transformers").target, checkpoint, taps=[]))
    assert ref.outputs[0].prompt_ids == hf.outputs[0].prompt_ids
    assert ref.outputs[0].output_ids == hf.outputs[0].output_ids  # greedy, same tokens
    assert ref.outputs[0].text == hf.outputs[0].text


def test_generation_in_a_worker_reports_prompt_then_one_row_per_step():
    """Target mode: greedy and seeded sampled generation, step 0 = prompt rows, step k = one row."""
    sc = from_dict(
        {
            "model": {"arch": "qwen2", "seed": 0},
            "target": {"engine": "refmodel", "dtype": "bfloat16"},
            "workload": {
                "requests": [
                    {"prompt_ids": list(range(40, 52)), "max_tokens": 4, "sampling": {"ignore_eos": True}},
                    {
                        "prompt_ids": list(range(300, 305)),
                        "max_tokens": 3,
                        "sampling": {"temperature": 0.9, "top_p": 0.8, "seed": 5, "ignore_eos": True},
                    },
                ]
            },
        }
    )
    job = RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)), taps=["layers.1.out", "sampler.*", "logits"])
    first, again = run_engine(job), run_engine(job)
    assert [o.output_ids for o in first.outputs] == [o.output_ids for o in again.outputs]
    assert [len(o.output_ids) for o in first.outputs] == [4, 3]
    rows = {(r.name, r.request, r.step): r.positions for r in first.records}
    assert rows[("layers.1.out", 0, 0)] == list(range(12))
    assert [rows[("layers.1.out", 0, k)] for k in (1, 2, 3)] == [[12], [13], [14]]
    assert rows[("layers.1.out", 1, 4)] == list(range(5)) and rows[("sampler.token", 1, 6)] == [6]
    tokens = [r.tensor.item() for r in first.records if r.name == "sampler.token" and r.request == 1]
    assert tokens == [float(t) for t in first.outputs[1].output_ids]
    probs = [r.tensor for r in first.records if r.name == "sampler.probs"]
    # float64 probabilities, written in float32 for a bf16 compare (compare.stored_precision)
    assert all(abs(float(p.double().sum()) - 1.0) < 1e-6 for p in probs)
    assert first.meta["source"].endswith("tools/refmodels/__init__.py")
