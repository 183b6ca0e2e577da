"""transformers cases: attention masks, padding and sliding-window caches."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.transformers_history import (
    AISHA,
    CACHE,
    CHLOE,
    ELIF,
    FELIX,
    IGOR,
    JONAS,
    MASKING,
    MEI,
    NADIA,
    PABLO,
    ROHAN,
    SARAH,
    SUBJECT,
    TARO,
    TEST_MISTRAL_CONFIG,
    TEST_PADDING_MASK,
    TEST_SLIDING_SHAPES,
    d_cache_dynamic_maxlen_doc,
    d_cache_sliding_class_doc,
    d_cache_static_sliding_comment,
    d_llama_mlp_comment,
    d_logits_minp_msg,
    d_logits_temperature_msg,
    d_mask_fast_all_doc,
    d_mask_padding_doc,
    d_mask_sliding_doc,
    d_mistral_norm_doc,
    d_mistral_sliding_comment,
    d_test,
    history,
    prompt,
    refmodel_repro,
)


def case_sdpa_left_pad_skip() -> CaseSpec:
    bug = [
        (
            MASKING,
            "    if q_offset == 0 and (\n"
            "        padding_mask is None or (fast_all(padding_mask[:, :q_length]) and fast_all(~padding_mask[:, q_length:]))\n"
            "    ):\n",
            "    # (the last prompt column is real for every row exactly when there is no trailing padding)\n"
            "    if q_offset == 0 and (padding_mask is None or fast_all(padding_mask[:, q_length - 1])):\n",
        )
    ]
    steps = history(
        "2025-09-01",
        1303,
        [
            (JONAS, "masking_utils: document fast_all", d_mask_fast_all_doc()),
            (
                ELIF,
                "perf(masking): cheaper prefill check before falling back to is_causal\n\n"
                "`_ignore_causal_mask_sdpa` reduced the padding mask twice on every prefill just to\n"
                "detect static-cache padding after the prompt. A single column is enough to see whether\n"
                "the prompt is followed by padding, which saves two full reductions on long prompts.",
                bug,
            ),
            (CHLOE, "llama: comment the gated MLP", d_llama_mlp_comment()),
            (ROHAN, "generation: clearer min_p range error", d_logits_minp_msg()),
            (JONAS, "masking_utils: fix padding_mask_function docstring", d_mask_padding_doc()),
            (
                AISHA,
                "tests: sdpa mask skip conditions",
                d_test("tests/masking/test_sdpa_mask_skip.py", TEST_PADDING_MASK),
            ),
            (PABLO, "cache_utils: comment the static sliding window copy", d_cache_static_sliding_comment()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-sdpa-left-pad-skip",
        issue_number=1303,
        category="batching",
        modeled_on=["huggingface/transformers#29029", "unslothai/unsloth#4100", "Blaizzy/mlx-vlm#1946"],
        title="Batched generate with sdpa: shorter prompts in the batch produce different text",
        issue=issue_text("tf-sdpa-left-pad-skip"),
        repro=refmodel_repro(
            {"arch": "llama", "seed": 1},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "sdpa"}},
            [
                {
                    "prompt_ids": prompt(1303, 18),
                    "max_tokens": 12,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
                {
                    "prompt_ids": prompt(13031, 7),
                    "max_tokens": 12,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
            ],
            good_ref="HEAD~6",
        ),
        truth_file=MASKING,
        truth_function="_ignore_causal_mask_sdpa",
        component="masking_utils",
        mechanism="prefill skip check only looks at the last prompt column, so left-padded batches drop the mask and "
        "SDPA runs with is_causal=True: padded rows attend to their pad tokens",
        steps=steps,
        bug_index=2,
    )


def case_swa_mask_edge() -> CaseSpec:
    bug = [
        (
            MASKING,
            "    def inner_mask(batch_idx: int, head_idx: int, q_idx: int, kv_idx: int) -> bool:\n"
            "        return kv_idx > q_idx - sliding_window\n",
            "    def inner_mask(batch_idx: int, head_idx: int, q_idx: int, kv_idx: int) -> bool:\n"
            "        # keys within `sliding_window` positions of the query\n"
            "        return kv_idx >= q_idx - sliding_window\n",
        )
    ]
    steps = history(
        "2025-10-06",
        1304,
        [
            (
                TARO,
                "masking_utils: sliding window overlay as a distance check\n\n"
                "First version of the overlay used by the sliding-window causal mask: a key is\n"
                "visible when it lies within `sliding_window` positions of the query.",
                bug,
            ),
            (SARAH, "mistral: expand the RMSNorm docstring", d_mistral_norm_doc()),
            (NADIA, "masking_utils: docstring for sliding_window_causal_mask_function", d_mask_sliding_doc()),
            (IGOR, "cache_utils: describe what DynamicSlidingWindowLayer keeps", d_cache_sliding_class_doc()),
            (
                MEI,
                "tests: mistral config keeps sliding_window",
                d_test("tests/models/mistral/test_config_window.py", TEST_MISTRAL_CONFIG),
            ),
            (FELIX, "generation: temperature error mentions greedy", d_logits_temperature_msg()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-swa-mask-edge",
        issue_number=1304,
        category="attention",
        modeled_on=["huggingface/transformers#29623", "vllm-project/vllm#3385", "ml-explore/mlx-lm#390"],
        title="Mistral-style model: prompt logits differ from reference once the prompt is longer than the window",
        issue=issue_text("tf-swa-mask-edge"),
        repro=refmodel_repro(
            {"arch": "mistral", "seed": 3},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [
                {"prompt_ids": prompt(1304, 42), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {
                    "prompt_ids": prompt(13041, 20),
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
            ],
        ),
        truth_file=MASKING,
        truth_function="sliding_window_overlay.inner_mask",
        component="masking_utils",
        mechanism="sliding-window overlay uses >= instead of >, so each query sees sliding_window + 1 keys once the "
        "prompt is longer than the window",
        steps=steps,
        bug_index=1,
    )


def case_swa_cache_offset() -> CaseSpec:
    bug = [
        (
            CACHE,
            "        is_full = self.cumulative_length >= self.sliding_window\n\n"
            "        kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)\n",
            "        is_full = self.cumulative_length >= self.sliding_window\n\n"
            "        # the first key still in the window\n"
            "        kv_offset = max(self.cumulative_length - self.sliding_window, 0)\n",
        )
    ]
    steps = history(
        "2025-11-03",
        1305,
        [
            (IGOR, "cache_utils: comment the static sliding window copy", d_cache_static_sliding_comment()),
            (SARAH, "mistral: explain why attention still receives sliding_window", d_mistral_sliding_comment()),
            (
                PABLO,
                "cache: simplify DynamicSlidingWindowLayer mask offsets\n\n"
                "Spell out what kv_offset is (the position of the oldest key in the window) so the\n"
                "mask and the cached states line up the same way as in the static layer.",
                bug,
            ),
            (IGOR, "cache_utils: document DynamicLayer.get_max_length", d_cache_dynamic_maxlen_doc()),
            (
                AISHA,
                "tests: dynamic sliding layer keeps window-1 states",
                d_test("tests/cache/test_dynamic_sliding_layer.py", TEST_SLIDING_SHAPES),
            ),
            (NADIA, "masking_utils: document fast_all", d_mask_fast_all_doc()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-swa-cache-offset",
        issue_number=1305,
        category="kv-cache",
        modeled_on=[
            "huggingface/transformers#37574",
            "huggingface/transformers#38046",
            "huggingface/transformers#47708",
        ],
        title="Mistral: generation degrades once prompt + generated tokens pass the sliding window",
        issue=issue_text("tf-swa-cache-offset"),
        repro=refmodel_repro(
            {"arch": "mistral", "seed": 0},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [
                {
                    "prompt_ids": prompt(1305, 26),
                    "max_tokens": 16,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
                {
                    "prompt_ids": prompt(13051, 22),
                    "max_tokens": 16,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
            ],
            good_ref="HEAD~4",
        ),
        truth_file=CACHE,
        truth_function="DynamicSlidingWindowLayer.get_mask_sizes",
        component="cache_utils",
        mechanism="kv_offset of a full dynamic sliding-window layer is one position too small, so during decode past "
        "the window the oldest cached key is labelled out of the window and masked",
        steps=steps,
        bug_index=3,
    )


CASES = [
    case_sdpa_left_pad_skip(),
    case_swa_mask_edge(),
    case_swa_cache_offset(),
]
