"""tinyserve's sampler and stop conditions behave as defined."""

import pytest
import torch
from tinyserve import LLM, SamplingParams
from tinyserve.layers.sampler import LogitsAdjuster, Sampler, SamplingTensors

from benchmark.subjects import check_tinyserve  # noqa: F401  (puts the subject on sys.path)
from tools.probe.checkpoints import ensure_checkpoint

torch.set_num_threads(1)
V = 12


@pytest.fixture(scope="module")
def llm():
    return LLM(str(ensure_checkpoint({"arch": "llama", "seed": 0})), block_size=4)


PROMPTS = [list(range(3, 43)), list(range(100, 131))]


def tensors(params, prompts=([1, 2],), outputs=([],)):
    gens = [torch.Generator().manual_seed(p.seed or 0) for p in params]
    return SamplingTensors.build(params, list(prompts), list(outputs), gens, V)


def test_top_k_1_equals_greedy(llm):
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    top1 = llm.generate(PROMPTS, SamplingParams(temperature=1.5, top_k=1, max_tokens=8, ignore_eos=True))
    assert [o.token_ids for o in greedy] == [o.token_ids for o in top1]


def test_seed_reproduces_whatever_the_batch(llm):
    p = SamplingParams(temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], p)[0].token_ids
    batched = llm.generate([PROMPTS[0], PROMPTS[1]], [p, SamplingParams(temperature=1.0, max_tokens=8)])[0].token_ids
    other = llm.generate([PROMPTS[0]], SamplingParams(temperature=1.0, seed=8, max_tokens=8, ignore_eos=True))[0]
    assert alone == batched
    assert other.token_ids != alone


def test_penalties_change_exactly_the_penalized_logits():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5] + [0.0] * (V - 5)])
    p = SamplingParams(temperature=0, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    st = tensors([p], prompts=([0, 1],), outputs=([2, 2, 3],))
    out = LogitsAdjuster.apply_penalties(logits.clone(), st)
    # prompt tokens: repetition only; output tokens: repetition + presence + count * frequency
    expected = logits.clone()
    expected[0, 0], expected[0, 1] = 1.0, -4.0
    expected[0, 2] = 1.0 / 2 - 0.5 - 2 * 0.25
    expected[0, 3] = -1.0 * 2 - 0.5 - 1 * 0.25
    torch.testing.assert_close(out, expected)
    untouched = torch.ones(V, dtype=torch.bool)
    untouched[:4] = False
    assert torch.equal(out[0, untouched], logits[0, untouched])


def test_temperature_divides_sampling_rows_only():
    logits = torch.randn(2, V)
    st = tensors([SamplingParams(temperature=0.5), SamplingParams(temperature=0)], prompts=([1], [1]), outputs=([], []))
    out = LogitsAdjuster.apply_temperature(logits, st)
    torch.testing.assert_close(out[0], logits[0] / 0.5)
    torch.testing.assert_close(out[1], logits[1])


def test_top_p_and_min_p_masks():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05] + [0.0] * (V - 4)]).clamp_min(1e-12)
    logits = probs.log()
    kept = Sampler.apply_top_p(logits, torch.tensor([0.75])).isfinite()[0, :4].tolist()
    assert kept == [True, True, False, False]  # 0.5 + 0.3 covers 0.75
    kept = Sampler.apply_top_p(logits, torch.tensor([0.85])).isfinite()[0, :4].tolist()
    assert kept == [True, True, True, False]
    kept = Sampler.apply_min_p(logits, torch.tensor([0.2])).isfinite()[0, :4].tolist()
    assert kept == [True, True, True, False]  # threshold 0.2 * 0.5 = 0.1
    kept = Sampler.apply_top_k(logits, torch.tensor([2])).isfinite()[0, :4].tolist()
    assert kept == [True, True, False, False]


def test_sampled_tokens_come_from_the_truncated_support():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0, top_k=3, seed=1)
    allowed = set(logits[0].topk(3).indices.tolist())
    for seed in range(20):
        p.seed = seed
        out = Sampler()(logits, tensors([p]))
        assert int(out.sampled_token_ids[0]) in allowed
        assert out.probs[0, list(set(range(V)) - allowed)].sum() == 0


def test_stop_conditions_and_logprobs(llm):
    base = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    third = base.token_ids[2]
    stopped = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[third]))[0]
    assert stopped.token_ids == base.token_ids[:3] and stopped.finish_reason == "stop"
    assert base.finish_reason == "length" and len(base.token_ids) == 6
    cut = base.text[2:5]
    if cut:
        by_text = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6, stop=[cut]))[0]
        assert by_text.finish_reason == "stop" and cut not in by_text.text
    top = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=3, logprobs=4))[0]
    for token, lp, d in zip(top.token_ids, top.logprobs, top.top_logprobs):
        assert d[token] == lp and len(d) >= 4 and lp == max(d.values())  # greedy: chosen is the top one


def test_text_prompt_uses_checkpoint_tokenizer(llm):
    out = llm.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=2))[0]
    assert out.prompt_token_ids == llm.engine.tokenizer.encode("The quick brown fox")
