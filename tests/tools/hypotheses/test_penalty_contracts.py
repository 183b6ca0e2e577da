"""The sampler's penalty contracts (tools/hypotheses/contracts.py): a penalty step is judged against
the reference semantics (repetition over prompt + output, presence / frequency over output counts)
from the state it was given, the builder of that state against its own prompt and output tokens, and
a cut handed probabilities that are not the softmax of its logits says so. The reference agrees with
transformers' processor; real tinyserve runs with a deliberately wrong penalty or state are flagged by
the contract of the function that is wrong, and the bug-free engine keeps both."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from tools.hypotheses import contracts as c
from tools.probe import sampling_ref
from tools.probe.prober import Prober
from tools.scenario import from_dict

TINYSERVE = Path(__file__).resolve().parents[3] / "benchmark" / "subjects" / "tinyserve"
SAMPLER = "tinyserve/layers/sampler.py"
V = 40
PROMPTS = [[1, 2, 3, 3, 30], [4, 5, 6]]
OUTPUTS = [[7, 7, 2], [9]]


def state(rep=(1.3, 1.0), pres=(0.4, 0.0), freq=(0.6, 0.0)) -> dict:
    """A sampling state as the function taps keep a dataclass argument: its fields as a dict."""
    prompt_mask = torch.stack([sampling_ref.token_counts(p, V) > 0 for p in PROMPTS])
    return {
        "repetition_penalty": torch.tensor(rep),
        "presence_penalty": torch.tensor(pres),
        "frequency_penalty": torch.tensor(freq),
        "prompt_mask": prompt_mask,
        "output_counts": torch.stack([sampling_ref.token_counts(o, V) for o in OUTPUTS]),
    }


def judge(name: str, inputs: dict, output) -> tuple[str, float | None, float]:
    contract = c.contract_for(name, tuple(inputs))
    assert contract is not None, name
    out = output
    return contract.name, c.contract_check(contract, name)(inputs, out, {}), contract.tolerance(out)


def test_the_reference_repetition_penalty_is_transformers_processor():
    """transformers' RepetitionPenaltyLogitsProcessor over prompt + output ids is what the contract
    expects of a repetition-only state, and the contract keeps its output."""
    torch.manual_seed(0)
    x = torch.randn(2, V) * 3
    ids = [p + o for p, o in zip(PROMPTS, OUTPUTS)]
    width = max(map(len, ids))
    padded = torch.tensor([s + [s[-1]] * (width - len(s)) for s in ids])  # repeating a token changes nothing
    hf = RepetitionPenaltyLogitsProcessor(1.3)(padded, x.clone())
    st = state(rep=(1.3, 1.3), pres=(0.0, 0.0), freq=(0.0, 0.0))
    seen = st["prompt_mask"] | (st["output_counts"] > 0)
    ref = sampling_ref.penalize(x, seen, st["output_counts"], torch.tensor([1.3, 1.3]), torch.zeros(2), torch.zeros(2))
    assert torch.allclose(ref, hf.double(), atol=1e-6)
    name, size, tol = judge("apply_penalties", {"logits": x, "st": st}, hf)
    assert name == "penalty" and size < tol


def test_penalty_step_judged_from_the_state_it_was_given():
    torch.manual_seed(1)
    x, st = torch.randn(2, V) * 3, state()
    seen = st["prompt_mask"] | (st["output_counts"] > 0)
    counts = st["output_counts"].float()
    settings = (st["repetition_penalty"], st["presence_penalty"], st["frequency_penalty"])
    right = sampling_ref.penalize(x, seen, counts, *settings).float()
    assert judge("apply_penalties", {"logits": x, "st": st}, right)[1] < 1e-5
    out_only = sampling_ref.penalize(x, counts > 0, counts, *settings).float()  # prompt tokens never penalised
    _, size, tol = judge("apply_penalties", {"logits": x, "st": st}, out_only)
    assert size > 100 * tol
    prompt_counted = sampling_ref.penalize(x, seen, counts + st["prompt_mask"], *settings).float()
    assert judge("apply_penalties", {"logits": x, "st": st}, prompt_counted)[1] > 100 * tol


def test_a_vllm_style_penalty_call_with_padded_token_tensors():
    """Plural per-row names and padded [S, L] token-id tensors (padding = vocab size) are read too."""
    torch.manual_seed(2)
    x = torch.randn(2, V) * 3
    pad = lambda rows: torch.tensor([r + [V] * (5 - len(r)) for r in rows])  # noqa: E731
    inputs = {
        "logits": x,
        "prompt_tokens_tensor": pad(PROMPTS),
        "output_tokens_tensor": pad(OUTPUTS),
        "presence_penalties": torch.tensor([0.4, 0.0]),
        "frequency_penalties": torch.tensor([0.6, 0.0]),
        "repetition_penalties": torch.tensor([1.3, 1.0]),
    }
    st = state()
    seen = st["prompt_mask"] | (st["output_counts"] > 0)
    right = sampling_ref.penalize(
        x,
        seen,
        st["output_counts"],
        inputs["repetition_penalties"],
        inputs["presence_penalties"],
        inputs["frequency_penalties"],
    ).float()
    name, size, tol = judge("apply_penalties", inputs, right)
    assert name == "penalty" and size < tol
    assert judge("apply_penalties", inputs, x)[1] > 100 * tol  # penalties dropped


def test_penalty_state_built_from_its_own_prompts_and_outputs():
    inputs = {"params": "<object>", "prompts": PROMPTS, "outputs": OUTPUTS, "vocab_size": V}
    name, size, tol = judge("build", inputs, state())
    assert name == "penalty-state" and size == tol == 0.0
    st = state()
    merged = {k: v for k, v in st.items() if k not in ("prompt_mask", "output_counts")}
    merged["token_counts"] = st["output_counts"] + torch.stack([sampling_ref.token_counts(p, V) for p in PROMPTS])
    assert judge("build", inputs, merged)[1] > 0  # one count over prompt + output feeds every penalty
    union = dict(st, prompt_mask=st["prompt_mask"].any(0, keepdim=True).expand(2, V))  # the batch's prompts for all
    assert judge("build", inputs, union)[1] > 0


def test_a_cut_handed_untempered_probabilities_keeps_its_rule_and_says_its_inputs_disagree():
    torch.manual_seed(3)
    raw = torch.randn(2, V) * 2
    tempered, probs = raw / 0.5, raw.softmax(-1)  # the softmax taken before the temperature
    order = probs.sort(-1).values.cumsum(-1)
    cut = probs.sort(-1).values.gather(1, (order <= 0.3).sum(-1, keepdim=True).clamp(max=V - 1))
    out = tempered.masked_fill(probs < cut, float("-inf"))
    inputs = {"logits": tempered, "top_p": torch.tensor([0.7, 0.7]), "probs": probs}
    name, size, tol = judge("apply_top_p", inputs, out)
    assert name == "top-p" and size <= tol
    assert c.inconsistent_inputs(inputs) > 0.01
    assert c.inconsistent_inputs(dict(inputs, probs=tempered.softmax(-1))) < 1e-6


# ---------------------------------------------------------------- real tinyserve runs

PENALISED = {"temperature": 0.8, "repetition_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.6}


def scenario():
    prompt = [(11 * i + 5) % 400 + 3 for i in range(16)]
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 3},
            "target": {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            "workload": {
                "requests": [
                    {"prompt_ids": prompt, "max_tokens": 4, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                    {
                        "prompt_ids": prompt[::-1],
                        "max_tokens": 4,
                        "sampling": {**PENALISED, "seed": 1, "ignore_eos": True},
                    },
                ]
            },
        }
    )


def broken_tree(tmp_path: Path, old: str, new: str) -> Path:
    tree = tmp_path / "tinyserve"
    shutil.copytree(TINYSERVE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    path = tree / SAMPLER
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return tree


def verdicts(tree: Path) -> dict[str, dict]:
    found = Prober().run_target(scenario(), tree, taps=[], function_checks=True).meta["function_checks"]
    return {v["function"].split(":")[-1]: v for v in found if v["contract"] in ("penalty", "penalty-state")}


def test_bug_free_tinyserve_keeps_the_penalty_contracts():
    found = verdicts(TINYSERVE)
    assert {v["contract"] for v in found.values()} == {"penalty", "penalty-state"}
    assert not [f for f, v in found.items() if v["violations"]], found


def test_a_repetition_penalty_that_skips_the_prompt_is_flagged_on_tinyserve(tmp_path):
    tree = broken_tree(tmp_path, "seen = st.prompt_mask | (st.output_counts > 0)", "seen = st.output_counts > 0")
    found = verdicts(tree)
    assert found["LogitsAdjuster.apply_penalties"]["violations"] > 0
    assert found["SamplingTensors.build"]["violations"] == 0  # the state it was given is right


@pytest.mark.slow
def test_a_state_that_counts_the_prompt_for_every_penalty_is_flagged_on_tinyserve(tmp_path):
    """The builder's fault: the step computes right from what it is given, the state is what is wrong."""
    old = "output_counts[i].index_add_(0, ids, torch.ones_like(ids))"
    new = (
        "output_counts[i].index_add_(0, ids, torch.ones_like(ids))\n"
        + " " * 16
        + ("output_counts[i].index_add_(0, torch.tensor(prompt), torch.ones(len(prompt), dtype=torch.long))")
    )
    found = verdicts(broken_tree(tmp_path, old, new))
    assert found["SamplingTensors.build"]["violations"] > 0
    assert found["LogitsAdjuster.apply_penalties"]["violations"] == 0


def test_temperature_step_divides_each_row_by_its_own_temperature():
    torch.manual_seed(4)
    x = torch.randn(3, V) * 3
    st = {"temperature": torch.tensor([0.5, 1.0, 0.0]), "greedy": torch.tensor([False, False, True])}
    right = x.clone()
    right[:2] = x[:2] / st["temperature"][:2].view(-1, 1)
    name, size, tol = judge("apply_temperature", {"logits": x, "st": st}, right)
    assert name == "temperature" and size < tol  # the greedy row (T = 0) is not judged
    assert judge("apply_temperature", {"logits": x, "st": st}, x * 0.5)[1] > 100 * tol  # multiplied, not divided
    assert judge("apply_temperature", {"logits": x, "st": st}, right.flip(0))[1] > 100 * tol  # another row's T
