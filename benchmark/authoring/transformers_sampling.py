"""transformers cases: logits processors (sampling)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.transformers_history import (
    AISHA,
    CHLOE,
    ELIF,
    JONAS,
    LOGITS,
    ROHAN,
    SUBJECT,
    TEST_TOPK,
    d_llama_rotate_doc,
    d_logits_minp_msg,
    d_logits_topk_comment,
    d_mask_causal_doc,
    d_test,
    history,
    prompt,
    refmodel_repro,
)


def case_min_p_batch_max() -> CaseSpec:
    bug = [
        (
            LOGITS,
            "        # Get the probability of the top token for each sequence in the batch\n"
            "        top_probs = probs.amax(dim=-1, keepdim=True)\n"
            "        # Calculate the actual min_p threshold by scaling min_p with the top token's probability\n"
            "        scaled_min_p = self.min_p * top_probs\n",
            "        # Calculate the actual min_p threshold by scaling min_p with the top token's probability\n"
            "        scaled_min_p = self.min_p * probs.amax()\n",
        )
    ]
    sampling = {"temperature": 0.4, "min_p": 0.7, "top_k": 40, "seed": 1234, "ignore_eos": True}
    steps = history(
        "2025-12-01",
        1306,
        [
            (ROHAN, "generation: comment the top-k safety clamp", d_logits_topk_comment()),
            (CHLOE, "llama: document rotate_half", d_llama_rotate_doc()),
            (JONAS, "masking_utils: clarify causal_mask_function docstring", d_mask_causal_doc()),
            (ELIF, "tests: top-k warper edge cases", d_test("tests/generation/test_top_k_warper.py", TEST_TOPK)),
            (
                ROHAN,
                "generation: simplify the min-p threshold\n\n"
                "Fold the top-probability tensor into the threshold expression; one temporary less\n"
                "per decoding step.",
                bug,
            ),
            (AISHA, "generation: clearer min_p range error", d_logits_minp_msg()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-min-p-batch-max",
        issue_number=1306,
        category="sampling",
        modeled_on=[
            "huggingface/text-generation-inference#1765",
            "sgl-project/sglang#3139",
            "huggingface/transformers#39457",
        ],
        title="min_p sampling behaves differently when requests are batched",
        issue=issue_text("tf-min-p-batch-max"),
        repro=refmodel_repro(
            {"arch": "llama", "seed": 8},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [
                {"prompt_ids": prompt(1306, 14), "max_tokens": 12, "sampling": sampling},
                {"prompt_ids": prompt(13061, 14), "max_tokens": 12, "sampling": sampling},
            ],
            good_ref="HEAD~2",
        ),
        truth_file=LOGITS,
        truth_function="MinPLogitsWarper.__call__",
        component="logits_process",
        mechanism="min-p threshold scaled by the maximum probability over the whole batch instead of per row, so in a "
        "batch a request's cutoff depends on the other requests",
        steps=steps,
        bug_index=5,
    )


CASES = [
    case_min_p_batch_max(),
]
