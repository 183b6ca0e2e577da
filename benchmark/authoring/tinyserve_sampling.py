"""tinyserve cases: the sampler's penalties, min-p and temperature (sampling)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.tinyserve_history import (
    ARJUN,
    CLAIRE,
    FATIMA,
    GREEDY,
    HYEJIN,
    IGOR,
    JONAS,
    LUCIA,
    MEI,
    NADIA,
    OWEN,
    RAFAEL,
    SAMPLER,
    SUBJECT,
    SVEN,
    d_act_doc,
    d_config_max_num_seqs,
    d_engine_abort_v2,
    d_fwd_doc,
    d_llm_doc_v2,
    d_loader_message,
    d_params_penalty_range,
    d_readme_sampling,
    d_rope_error,
    d_sampler_doc,
    d_sampler_topk_comment,
    d_seq_repr_v2,
    d_test_block_manager_v2,
    d_test_sampling_params,
    d_tokenizer_vocab_v2,
    good_ref_before,
    history_hourly,
    prompt,
)


def case_rep_penalty_batch_union() -> CaseSpec:
    bug = [
        (
            SAMPLER,
            "        for i, (prompt, out) in enumerate(zip(prompts, outputs)):\n"
            "            prompt_mask[i, torch.tensor(prompt, dtype=torch.long)] = True\n"
            "            if out:\n",
            "        # mark every prompt token with one fill instead of one indexing op per row\n"
            "        prompt_mask.index_fill_(1, torch.tensor([t for p in prompts for t in p], dtype=torch.long), True)\n"
            "        for i, out in enumerate(outputs):\n"
            "            if out:\n",
        )
    ]
    entries = [
        (JONAS, "model_loader: clearer message when no safetensors are found", d_loader_message()),
        (
            MEI,
            "perf(sampler): build the prompt mask without a per-row loop\n\n"
            "With many short requests in a decode batch the per-row indexing in\n"
            "SamplingTensors.build was a noticeable part of the sampler time.",
            bug,
        ),
        (ARJUN, "sampler: document which distribution logprobs come from", d_sampler_doc()),
        (FATIMA, "sampling_params: validate presence/frequency penalty range", d_params_penalty_range()),
        (LUCIA, "tests: sampling params validation", d_test_sampling_params()),
        (SVEN, "engine: add abort_request()", d_engine_abort_v2()),
    ]
    steps, bug_index = history_hourly("2025-05-26", 1204, entries), 2
    a, b = prompt(1204, 16), prompt(2204, 24)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-rep-penalty-batch-union",
        issue_number=1204,
        category="sampling",
        modeled_on=["huggingface/text-generation-inference#1765", "huggingface/transformers#39457"],
        title="repetition_penalty output depends on what else is in the batch",
        issue=issue_text("ts-rep-penalty-batch-union"),
        repro=repro_toml(
            {"arch": "llama", "seed": 4},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [
                {
                    "prompt_ids": a,
                    "max_tokens": 10,
                    "sampling": {"temperature": 0.8, "repetition_penalty": 1.3, "seed": 5, "ignore_eos": True},
                },
                {"prompt_ids": b, "max_tokens": 10, "sampling": GREEDY},
            ],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=SAMPLER,
        truth_function="SamplingTensors.build",
        component="sampler",
        mechanism="index_fill_ along the vocab dim marks every request's prompt tokens in every row, so "
        "repetition_penalty also hits tokens from other requests' prompts",
        steps=steps,
        bug_index=bug_index,
    )


def case_min_p_logit_space() -> CaseSpec:
    bug = [
        (
            SAMPLER,
            "        probs = logits.softmax(dim=-1)\n"
            "        threshold = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)\n"
            '        return logits.masked_fill(probs < threshold, float("-inf"))\n',
            "        # the threshold scales with the top candidate, so compare logits directly and skip a\n"
            "        # softmax over the vocab\n"
            "        threshold = min_p.to(logits.dtype).unsqueeze(1) * logits.amax(dim=-1, keepdim=True)\n"
            '        return logits.masked_fill(logits < threshold, float("-inf"))\n',
        )
    ]
    entries = [
        (OWEN, "perf(sampler): min-p without a second softmax", bug),
        (HYEJIN, "sequence: readable repr", d_seq_repr_v2()),
        (CLAIRE, "ops/activation: describe the optimized paths", d_act_doc()),
        (RAFAEL, "llm: document per-prompt sampling params", d_llm_doc_v2()),
        (NADIA, "docs: sampling parameters", d_readme_sampling()),
        (IGOR, "tests: sampling params validation", d_test_sampling_params()),
    ]
    steps = history_hourly("2025-06-30", 1205, entries)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-min-p-logit-space",
        issue_number=1205,
        category="sampling",
        modeled_on=["state-spaces/mamba#1010", "state-spaces/mamba#927", "vllm-project/vllm-metal#728"],
        title="min_p filters far more (or far fewer) tokens than the same min_p in transformers",
        issue=issue_text("ts-min-p-logit-space"),
        repro=repro_toml(
            {"arch": "llama", "seed": 5},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [
                {
                    "prompt_ids": prompt(1205, 14),
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.9, "min_p": 0.2, "seed": 11, "ignore_eos": True},
                },
                {
                    "prompt_ids": prompt(2205, 9),
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.9, "min_p": 0.2, "seed": 12, "ignore_eos": True},
                },
            ],
        ),
        truth_file=SAMPLER,
        truth_function="Sampler.apply_min_p",
        component="sampler",
        mechanism="min-p threshold taken as min_p * max logit and compared against logits, instead of "
        "min_p * max probability against probabilities",
        steps=steps,
        bug_index=1,
    )


def case_temperature_before_penalties() -> CaseSpec:
    bug = [
        (
            SAMPLER,
            "        return self.apply_temperature(self.apply_penalties(logits, st), st)\n",
            "        # temperature first: the penalties then act in the units the sampler draws in\n"
            "        return self.apply_penalties(self.apply_temperature(logits, st), st)\n",
        )
    ]
    entries = [
        (LUCIA, "config: validate max_num_seqs", d_config_max_num_seqs()),
        (JONAS, "tokenizer: vocab_size property", d_tokenizer_vocab_v2()),
        (FATIMA, "sampling_params: validate presence/frequency penalty range", d_params_penalty_range()),
        (MEI, "rope: name the rope parameters in the unsupported-type error", d_rope_error()),
        (ARJUN, "forward_context: note that it is only valid inside a forward", d_fwd_doc()),
        (
            SVEN,
            "sampler: scale by temperature before applying penalties\n\n"
            "Keeps the penalty strength comparable across temperatures.",
            bug,
        ),
        (HYEJIN, "sampler: comment on top-k rows that have it off", d_sampler_topk_comment()),
        (OWEN, "tests: block manager allocate/free", d_test_block_manager_v2()),
    ]
    steps, bug_index = history_hourly("2025-08-11", 1206, entries), 6
    pen = {"temperature": 0.6, "frequency_penalty": 0.8, "presence_penalty": 0.5, "seed": 21, "ignore_eos": True}
    return CaseSpec(
        subject=SUBJECT,
        id="ts-temperature-before-penalties",
        issue_number=1206,
        category="sampling",
        modeled_on=["vllm-project/vllm-metal#728", "mlc-ai/mlc-llm#1693"],
        title="presence/frequency penalties much stronger than expected at low temperature",
        issue=issue_text("ts-temperature-before-penalties"),
        repro=repro_toml(
            {"arch": "llama", "seed": 6},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1206, 20), "max_tokens": 12, "sampling": pen}],
            good_ref="base",
        ),
        truth_file=SAMPLER,
        truth_function="LogitsAdjuster.forward",
        component="sampler",
        mechanism="temperature applied before the additive presence/frequency penalties, so the penalties "
        "are effectively multiplied by the temperature",
        steps=steps,
        bug_index=bug_index,
    )


CASES = [
    case_rep_penalty_batch_union(),
    case_min_p_logit_space(),
    case_temperature_before_penalties(),
]
