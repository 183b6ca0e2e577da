"""tinyserve speculative decoding (n-gram prompt lookup, draft model): greedy output equals
plain decoding, sampling keeps the target distribution, rejected drafts give their KV back."""

import math

import pytest
import torch
from tinyserve import LLMEngine, SamplingParams
from tinyserve.layers.sampler import SamplingTensors
from tinyserve.spec_decode.engine import SpecDecodeEngine
from tinyserve.spec_decode.proposers import propose_ngram
from tinyserve.spec_decode.rejection import RejectionSampler

from benchmark.subjects import check_tinyserve  # noqa: F401  (puts the subject on sys.path)
from tools.probe.checkpoints import ensure_checkpoint

torch.set_num_threads(1)
ARCHS = ("llama", "qwen2", "mistral", "gemma2")
CHI2_999 = {5: 20.52, 15: 37.70}  # chi-square critical values at p = 0.001, by degrees of freedom


def ckpt(arch, **keys):
    return str(ensure_checkpoint({"arch": arch, "seed": 0, **keys}))


def draft_ckpt(arch):
    return ckpt(arch, seed=1, num_hidden_layers=1)


def prompts():
    g = torch.Generator().manual_seed(0)
    loop = torch.randint(3, 512, (7,), generator=g).tolist()
    return [loop * 5 + [9], torch.randint(3, 512, (41,), generator=g).tolist(), loop * 2, [11, 12, 11, 12, 11]]


def generate(model, options, params, check=None):
    engine = LLMEngine.from_options(model, **options)
    for i, p in enumerate(prompts()):
        engine.add_request(str(i), p, params)
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
        if check:
            check(engine)
    return engine, [outs[str(i)] for i in range(len(prompts()))]


def test_ngram_lookup_takes_the_latest_longest_match():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2, 1, 3) == [7, 1]
    assert propose_ngram([5, 6, 5, 6, 8], 3, 1, 2) == []
    assert propose_ngram([4, 8, 4], 3, 1, 3) == [8, 4]


SPECS = [
    {"speculative": "ngram", "num_speculative_tokens": 3},
    {"speculative": "draft", "num_speculative_tokens": 4, "draft": "small"},
    {"speculative": "draft", "num_speculative_tokens": 5, "draft": "same"},
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", SPECS, ids=["ngram", "draft-small", "draft-same"])
def test_greedy_with_speculation_equals_greedy_without(arch, spec):
    base = dict(block_size=4, enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=32)
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    _, plain = generate(ckpt(arch), base, params)
    spec = dict(spec)
    draft = spec.pop("draft", None)
    if draft:
        spec["draft_model"] = draft_ckpt(arch) if draft == "small" else ckpt(arch)
    engine, fast = generate(ckpt(arch), {**base, **spec}, params)
    assert isinstance(engine, SpecDecodeEngine) and engine.num_draft_tokens > 0
    assert [o.token_ids for o in fast] == [o.token_ids for o in plain]
    for a, b in zip(fast, plain):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    if draft == "same":  # a perfect draft: everything accepted, fewer steps
        assert engine.num_accepted_tokens == engine.num_draft_tokens and engine.step_count < 14
    assert engine.block_manager.num_free_blocks == engine.config.num_kv_blocks


def test_rejected_drafts_give_back_their_blocks():
    """Regression guard for KV rollback: after every step a sequence holds only the blocks its
    tokens need, and rejections really happened."""

    def check(engine):
        bs = engine.config.block_size
        for seq in engine.scheduler.running:
            assert len(seq.block_table) <= -(-seq.num_tokens // bs)
            assert seq.num_computed_tokens <= seq.num_tokens

    engine, _ = generate(
        ckpt("llama"),
        dict(block_size=2, speculative="draft", draft_model=draft_ckpt("llama"), num_speculative_tokens=4),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        check,
    )
    assert engine.rejected_rows and engine.num_accepted_tokens < engine.num_draft_tokens


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("draft", [0, 3])
def test_rejection_sampler_keeps_the_target_distribution(draft):
    """4000 draws over a 6-token slice, fixed seed: chi-square against p is far below the 0.1% cut."""
    logits = torch.tensor([[1.2, 0.3, -0.5, 2.0, 0.0, -1.0]])
    probs = logits.softmax(-1)[0]
    g = torch.Generator().manual_seed(1234)
    params = SamplingParams(temperature=1.0)
    st = SamplingTensors.build([params], [[0]], [[]], [g], 6)
    st.prompt_mask[:] = False
    sampler = RejectionSampler()
    counts = torch.zeros(6)
    for _ in range(4000):
        counts[int(sampler(logits, st, torch.tensor([draft])).sampled_token_ids[0])] += 1
    assert chi_square(counts, probs) < CHI2_999[5]


def joint_counts(options, n=1500, top_k=4):
    """(first, second) generated token of n seeded requests (max_tokens 3 leaves room for one draft) -> counts over the top-k x top-k cells."""
    engine = LLMEngine.from_options(ckpt("llama"), max_num_seqs=512, **options)
    for i in range(n):
        engine.add_request(
            str(i),
            [11, 12, 11, 12, 11],
            SamplingParams(temperature=1.0, top_k=top_k, seed=i, max_tokens=3, ignore_eos=True),
        )
    pairs = []
    while engine.has_unfinished_requests():
        pairs += [tuple(o.token_ids[:2]) for o in engine.step()]
    assert not options or engine.num_draft_tokens == n  # every second token went through verification
    return pairs


def test_sampled_tokens_keep_their_distribution_under_speculation():
    """Two-sample chi-square over the second token (the first one verified), fixed seeds."""
    plain = joint_counts({})
    spec = joint_counts({"speculative": "draft", "draft_model": ckpt("llama"), "num_speculative_tokens": 1})
    cells = sorted(set(plain) | set(spec))
    a = torch.tensor([plain.count(c) for c in cells], dtype=torch.float64)
    b = torch.tensor([spec.count(c) for c in cells], dtype=torch.float64)
    keep = (a + b) >= 10  # pool sparse cells
    a, b = torch.cat([a[keep], a[~keep].sum(0, keepdim=True)]), torch.cat([b[keep], b[~keep].sum(0, keepdim=True)])
    total = a + b
    stat = float((((a - total / 2) ** 2 + (b - total / 2) ** 2) / (total / 2)).nansum())
    dof = int((total > 0).sum()) - 1
    assert dof >= 4
    # Wilson-Hilferty approximation of the chi-square 0.1% critical value for this dof
    crit = dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3
    assert stat < crit, (stat, crit, dof)


def test_draft_shadow_never_schedules_an_empty_forward():
    """Regression (commit a760a8f): when the target's tokens were all already computed by the draft (a step that
    proposed nothing), the shadow was scheduled with 0 new tokens and the draft forward crashed.
    Staggered arrivals under a 24-token chunk budget reach that state."""
    row = check_tinyserve.check_case(
        "llama",
        "float32",
        "staggered4",
        check_tinyserve.engine_options(True, True, 4, **check_tinyserve.PART2["spec-draft"]),
    )
    assert row["ok"] and row["text_ok"], row
