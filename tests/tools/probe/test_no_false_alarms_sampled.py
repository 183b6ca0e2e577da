"""Bug-free engines with sampled requests show zero divergent taps (issue 16, DESIGN §3).

Sampled requests put the sampler's cuts (top-k, top-p, min-p) on the path: a logit within a
dtype's noise of a cut moves a token in or out of the kept set, which a per-element error ratio
called a divergence (bf16 tinyserve: `sampler.probs` at ratio 27). The matrix: every arch, every
dtype, both target engines (tinyserve; transformers with sdpa) against the transformers fp32 /
fp64 reference, each scenario a batch of differently sampled requests (temperature, top-k, top-p,
min-p, penalties, seeds) next to a greedy one.
"""

from __future__ import annotations

import pytest

from tools.probe.prober import Prober
from tools.scenario import from_dict

ARCHS = ("llama", "qwen2", "mistral", "gemma2")
DTYPES = ("float32", "bfloat16", "float16")
CUTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.02, "seed": 11}
# transformers' generate has no presence / frequency penalty: those rows run on tinyserve only
SAMPLINGS = {
    "tinyserve": [
        CUTS,
        {"temperature": 1.3, "top_p": 0.5, "repetition_penalty": 1.2, "seed": 3},
        {
            "temperature": 0.7,
            "top_k": 8,
            "presence_penalty": 0.4,
            "frequency_penalty": 0.3,
            "repetition_penalty": 1.1,
            "seed": 5,
        },
        {"temperature": 0.0, "repetition_penalty": 1.3},
    ],
    "transformers": [
        CUTS,
        {"temperature": 1.3, "top_p": 0.5, "repetition_penalty": 1.2, "seed": 3},
        {"temperature": 0.5, "min_p": 0.1, "top_k": 8, "seed": 5},
        {"temperature": 0.0, "repetition_penalty": 1.3},
    ],
}
OPTIONS = {
    "tinyserve": {
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 16,
        "block_size": 4,
    },
    "transformers": {"attn_implementation": "sdpa"},
}  # gemma2 has no sdpa path: eager
PROMPTS = [
    {"prompt": "Once upon a time there was a small language model that answered questions about the weather"},
    {"prompt": "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun"},
    {"prompt_ids": list(range(40, 58))},
    {"prompt_ids": [5, 17, 42, 99, 260, 301, 7, 8, 9, 10, 11]},
]


def scenario(engine: str, arch: str, dtype: str) -> dict:
    reqs = [
        {**prompt, "max_tokens": 12, "sampling": {**sampling, "ignore_eos": True}}
        for prompt, sampling in zip(PROMPTS, SAMPLINGS[engine])
    ]
    options = {"attn_implementation": "eager"} if (engine, arch) == ("transformers", "gemma2") else OPTIONS[engine]
    return {
        "model": {"arch": arch, "seed": 0},
        "target": {"engine": engine, "dtype": dtype, "options": options},
        "workload": {"requests": reqs},
    }


def check(engine: str, arch: str, dtype: str) -> None:
    result = Prober().probe(from_dict(scenario(engine, arch, dtype)))
    assert result.divergent_taps == [], f"{engine} {arch} {dtype}: {result.summary}"
    assert not result.diverged, result.summary
    sampler = {s.tap for s in result.stats if s.tap.startswith("sampler.")}
    assert {"sampler.logits", "sampler.probs", "sampler.token"} <= sampler, "the sampler was not judged"


FAST = [("tinyserve", "llama", "bfloat16"), ("transformers", "gemma2", "float16")]
FULL = [(e, a, d) for e in ("tinyserve", "transformers") for a in ARCHS for d in DTYPES if (e, a, d) not in FAST]


@pytest.mark.parametrize("engine,arch,dtype", FAST)
def test_sampled_requests_raise_no_false_alarm(engine, arch, dtype):
    check(engine, arch, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("engine,arch,dtype", FULL)
def test_sampled_requests_full_matrix(engine, arch, dtype):
    check(engine, arch, dtype)
