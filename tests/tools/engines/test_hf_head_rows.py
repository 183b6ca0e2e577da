"""The transformers adapter's head rows: a greedy request whose scores are its logits records no sampler rows
(they would repeat `logits`); a processor that changes the scores, or sampling, keeps them."""

from __future__ import annotations

import torch

from tools.engines.hf import HFEngine
from tools.engines.protocol import RunJob
from tools.probe.align import index
from tools.probe.checkpoints import ensure_checkpoint
from tools.probe.prober import Prober
from tools.scenario import from_dict

PROMPT = [5, 6, 7, 8, 9, 5, 6, 7]
SAMPLINGS = (
    {"ignore_eos": True},  # greedy, nothing changes the scores
    {"ignore_eos": True, "repetition_penalty": 1.3},  # greedy, a processor changes them
    {"ignore_eos": True, "temperature": 0.8, "seed": 3},  # sampled
)


def scenario():
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "transformers", "dtype": "float32"},
            "workload": {"requests": [{"prompt_ids": PROMPT, "max_tokens": 5, "sampling": s} for s in SAMPLINGS]},
        }
    )


def test_greedy_rows_left_alone_record_no_sampler_rows():
    sc = scenario()
    rows = index(HFEngine().run(RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)))))
    generated = list(range(len(PROMPT) - 1, len(PROMPT) + 4))
    for r in range(3):
        assert rows[("logits", r)].positions == generated
        assert rows[("sampler.token", r)].positions == generated
    assert ("sampler.logits", 0) not in rows and ("sampler.probs", 0) not in rows
    penalized, logits = rows[("sampler.logits", 1)].tensor, rows[("logits", 1)].tensor
    assert not torch.equal(penalized, logits)  # the penalty changed them: recorded
    assert rows[("sampler.probs", 1)].positions == generated
    probs = rows[("sampler.probs", 2)].tensor
    assert torch.allclose(probs.sum(-1).double(), torch.ones(5, dtype=torch.float64))


def test_greedy_without_sampler_rows_compares_clean_and_is_judged_by_its_logits():
    """No false alarm, and the greedy request's head is still compared (its `logits`), its tokens judged."""
    result = Prober().probe(scenario())
    assert not result.diverged, result.summary
    judged = {(s.tap, s.request) for s in result.stats}
    assert ("logits", 0) in judged and ("sampler.logits", 0) not in judged
    assert {("sampler.logits", 1), ("sampler.probs", 1), ("sampler.probs", 2), ("sampler.token", 2)} <= judged
