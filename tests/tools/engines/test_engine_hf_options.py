"""Generate options in the transformers adapter: each accepted one is tapped with the rows a
single-pass prefill gives and no false alarm; every other one is refused up front, in one line."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch

from tools.engines.hf import HFEngine, latest_rows
from tools.engines.hf_generate import (
    ACCEPTED,
    REFUSED,
    UnsupportedOption,
    check_options,
    forward_columns,
    request_positions,
)
from tools.engines.protocol import RunJob
from tools.probe.align import index
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.prober import Prober
from tools.probe.trace import TapRecord
from tools.scenario import EngineSpec, from_dict

LONG = list(range(3, 48))  # 45 tokens: past the tiny presets' sliding window of 32
SHORT = [7, 8, 9, 10, 11]  # left-padded beside LONG
REPEATING = [5, 6, 7, 8, 9] * 2 + [5, 6, 7]  # n-grams for prompt lookup to draft from


def scenario(arch: str, options: dict, dtype: str = "float32"):
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0},
            "target": {"engine": "transformers", "dtype": dtype, "options": options},
            "workload": {
                "requests": [
                    {"prompt_ids": p, "max_tokens": 6, "sampling": {"ignore_eos": True}}
                    for p in (LONG, SHORT, REPEATING)
                ]
            },
        }
    )


@pytest.fixture(scope="module")
def prober():
    """One prober for the module: the reference runs depend only on the tokens, shared by all options."""
    return Prober()


@functools.cache
def single_pass_rows(arch: str, dtype: str = "float32") -> dict:
    """(tap, request) -> positions of a plain generate (one prefill forward), run in this process."""
    sc = scenario(arch, {}, dtype)
    return {
        k: v.positions
        for k, v in index(HFEngine().run(RunJob(sc, sc.target, str(ensure_checkpoint(sc.model))))).items()
    }


def check_no_false_alarm(prober: Prober, arch: str, options: dict, dtype: str = "float32"):
    result = prober.probe(scenario(arch, options, dtype))
    assert result.divergent_taps == [], f"{arch} {options}: {result.summary}"
    assert not result.diverged, result.summary
    rows = {k: v.positions for k, v in index(result.target).items()}
    assert rows == single_pass_rows(arch, dtype)
    return result


def test_chunked_prefill_is_tapped_like_a_single_pass_prefill(prober):
    """Regression (commit fb9809b): `prefill_chunk_size = 8` crashed the tap recorder with `IndexError: index 8 is out
    of bounds for dimension 0 with size 8` (it assumed one forward per prefill)."""
    result = check_no_false_alarm(prober, "llama", {"prefill_chunk_size": 8})
    prefill_steps = {
        r.step for r in result.target.records if r.name == "embed" and r.request == 0 and r.positions[0] < 45
    }
    assert len(prefill_steps) == 6  # 45 prompt columns in chunks of 8, each its own step


CACHES = ("static", "sliding_window", "hybrid", "dynamic")
SLOW_OPTIONS = [
    {"prefill_chunk_size": 8, "cache_implementation": "static", "max_cache_len": 80},
    *({"cache_implementation": c} for c in CACHES),
    {"use_cache": False},
    {"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 2},
    {
        "assistant_model": "self",
        "num_assistant_tokens": 3,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.2,
    },
    {"disable_compile": True, "prefill_chunk_size": 5},  # regression (commit 6e9047b): collided with the adapter's own
]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("options", SLOW_OPTIONS, ids=lambda o: ",".join(o))
def test_accepted_option_has_no_false_alarm(prober, arch, options):
    check_no_false_alarm(prober, arch, options)


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,dtype,options",
    [
        ("qwen2", "float32", {"prefill_chunk_size": 8}),
        ("mistral", "float32", {"prefill_chunk_size": 8}),
        ("mistral", "float32", {"cache_implementation": "sliding_window", "prefill_chunk_size": 16}),
        ("llama", "float32", {"attn_implementation": "sdpa", "prefill_chunk_size": 7}),
        ("llama", "bfloat16", {"prefill_chunk_size": 8, "cache_implementation": "static"}),
    ],
)
def test_chunked_prefill_on_every_arch_and_dtype(prober, arch, dtype, options):
    check_no_false_alarm(prober, arch, options, dtype)


@pytest.mark.slow
def test_drafts_are_verified_several_rows_per_forward(prober):
    """Assisted decoding with the model as its own draft accepts every draft: one forward computes
    several positions, and still no false alarm."""
    result = check_no_false_alarm(prober, "llama", {"assistant_model": "self", "num_assistant_tokens": 3})
    decode = [
        r for r in result.target.records if r.name == "layers.0.out" and r.positions[0] >= len(SHORT) and r.request == 1
    ]
    assert max(len(r.positions) for r in decode) > 1


# ---- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_refused_option_gets_a_one_line_reason(key):
    with pytest.raises(UnsupportedOption) as e:
        check_options({key: 2})
    assert key in str(e.value) and "\n" not in str(e.value) and REFUSED[key] in str(e.value)


@pytest.mark.parametrize(
    "options,why",
    [
        ({"prefil_chunk_size": 8}, "unknown option; accepted: assistant_confidence_threshold"),
        ({"cache_implementation": "quantized"}, "lossy or unknown"),
        ({"prefill_chunk_size": 0}, "positive integer"),
        ({"disable_compile": False}, "true only"),
        ({"assistant_model": "/no/such/draft"}, "no such directory"),
        ({"attn_implementation": 3}, "expected a string"),
    ],
)
def test_malformed_accepted_options_are_refused(options, why):
    with pytest.raises(UnsupportedOption, match=why):
        check_options(options)


def test_every_accepted_option_passes_the_check():
    check_options(
        {
            "attn_implementation": "sdpa",
            "prefill_chunk_size": 4,
            "cache_implementation": "static",
            "max_cache_len": 64,
            "use_cache": True,
            "prompt_lookup_num_tokens": 2,
            "max_matching_ngram_size": 2,
            "assistant_model": "self",
            "num_assistant_tokens": 2,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.4,
            "disable_compile": True,
        }
    )
    assert set(ACCEPTED) >= {"prefill_chunk_size", "cache_implementation", "prompt_lookup_num_tokens"}


def test_offloaded_cache_needs_a_gpu():
    spec = EngineSpec("transformers", "float32", {"cache_implementation": "offloaded"})
    with pytest.raises(UnsupportedOption, match="needs a CUDA device"):
        HFEngine().check_options(spec, "cpu")
    HFEngine().check_options(spec, "cuda:0")


def test_probe_refuses_before_any_engine_starts(tmp_path):
    prober = Prober()
    with pytest.raises(UnsupportedOption, match="num_beams"):
        prober.probe(scenario("llama", {"num_beams": 4}))
    assert prober.engine_runs == 0
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[model]\narch = "llama"\n[target]\nengine = "transformers"\n'
        "options = { num_return_sequences = 2 }\n[[workload.requests]]\nprompt_ids = [1, 5]\n"
    )
    cli = subprocess.run(
        [sys.executable, "-m", "tools.probe.prober", "--scenario", str(toml)], capture_output=True, text=True
    )
    assert cli.returncode == 2
    assert cli.stderr.strip().count("\n") == 0 and "num_return_sequences" in cli.stderr


# ---- rows of one forward (pure) ----------------------------------------------------------------


def test_rows_of_a_prefill_chunk_with_left_padding():
    pads = [0, 3]  # row 1 has 3 pad columns
    pos = torch.tensor([[4, 5, 6, 7], [1, 2, 3, 4]])  # chunk of columns 4..7 (row 1: its own positions 1..4)
    cols = forward_columns({"input_ids": torch.zeros(2, 4), "position_ids": pos}, pads)
    assert cols == [4, 5, 6, 7]
    assert request_positions(cols, pads) == [[4, 5, 6, 7], [1, 2, 3, 4]]
    first = forward_columns(
        {"input_ids": torch.zeros(2, 4), "position_ids": torch.tensor([[0, 1, 2, 3], [0, 0, 0, 0]])}, pads
    )
    assert request_positions(first, pads) == [[0, 1, 2, 3], [-1, -1, -1, 0]]


def test_rows_from_cache_position_when_there_are_no_position_ids():
    """transformers 4.x passes the padded columns as cache_position."""
    kwargs = {"input_ids": torch.zeros(1, 2), "position_ids": None, "cache_position": torch.tensor([9, 10])}
    assert forward_columns(kwargs, [0]) == [9, 10]


def test_rows_from_rejected_drafts_are_dropped():
    rec = lambda step, pos: TapRecord("layers.0.out", step, 0, pos, torch.full((len(pos), 2), float(step)))
    # step 1 verified drafts at 5..7, of which 6.. were rejected; step 2 recomputed 6; 7 is past the end
    kept = latest_rows([rec(0, [0, 1, 2, 3, 4]), rec(1, [5, 6, 7]), rec(2, [6])], [7])
    assert [(r.step, r.positions) for r in kept] == [(0, [0, 1, 2, 3, 4]), (1, [5]), (2, [6])]
    assert kept[1].tensor.tolist() == [[1.0, 1.0]]


def test_rows_computed_once_are_cut_at_the_lengths_alone():
    """Without recomputed positions (plain generate, teacher forcing) the shortcut keeps what the full
    dedup keeps: every record below its request's length, cut where it crosses it, dropped past it."""
    rec = lambda step, r, pos: TapRecord("layers.0.out", step, r, pos, torch.full((len(pos), 2), float(step)))
    records = [rec(0, 0, [0, 1, 2]), rec(0, 1, [0, 1]), rec(1, 0, [3]), rec(1, 1, [2, 3]), rec(2, 1, [4])]
    fast, full = latest_rows(records, [4, 3], recomputed=False), latest_rows(records, [4, 3])
    assert [(r.step, r.request, r.positions) for r in fast] == [(r.step, r.request, r.positions) for r in full]
    assert [(r.step, r.request, r.positions) for r in fast] == [
        (0, 0, [0, 1, 2]),
        (0, 1, [0, 1]),
        (1, 0, [3]),
        (1, 1, [2]),
    ]
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(fast, full, strict=True))


def test_top_k_minus_one_is_off_as_zero_is():
    """-1 is how OpenAI / vLLM clients switch top-k off (the sweep's sampled workload writes it); generate()
    refuses a negative top_k, so the adapter passes 0, its own off."""
    from transformers import AutoModelForCausalLM

    from tools.engines.hf_generate import generate_kwargs
    from tools.scenario import Request

    model = AutoModelForCausalLM.from_pretrained(ensure_checkpoint({"arch": "llama", "seed": 0}))
    off = Request(prompt_ids=(5, 6), max_tokens=2, sampling={"temperature": 0.7, "top_p": 0.3, "top_k": -1})
    kept = Request(prompt_ids=(5, 6), max_tokens=2, sampling={"temperature": 0.7, "top_k": 12})
    assert generate_kwargs(off, {}, model)["generation_config"].top_k == 0
    assert generate_kwargs(kept, {}, model)["generation_config"].top_k == 12
