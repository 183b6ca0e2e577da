"""tinyserve cases: attention masks, windows and GQA layouts (attention)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.tinyserve_history import (
    AMARA,
    DANIEL,
    HANNAH,
    KENJI,
    LENA,
    MARCO,
    OLGA,
    OPS_ATTN,
    PRIYA,
    SOFIA,
    SUBJECT,
    TOMAS,
    WEI,
    YUKI,
    d_attn_gather_doc,
    d_attn_layer_repr,
    d_attn_merge_doc,
    d_config_doc,
    d_config_msg,
    d_layernorm_repr,
    d_llama_embeddings,
    d_llm_doc,
    d_readme_chunked,
    d_rotary_kernel_doc,
    d_runner_doc,
    d_runner_num_sampled,
    d_sampling_clone,
    d_sched_counts,
    d_sched_doc,
    d_test_rotary,
    d_tokenizer_vocab,
    history,
    prompt,
)


def case_swa_window_edge() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "        mask &= kv_pos > q_pos - sliding_window\n",
            "        mask &= kv_pos >= q_pos - sliding_window   # the window counts past tokens\n",
        )
    ]
    steps = history(
        "2025-06-02",
        1104,
        [
            (OLGA, "config: document how per-layer windows are chosen", d_config_doc()),
            (MARCO, "attention layer: extra_repr", d_attn_layer_repr()),
            (YUKI, "ops/rotary: comment _rotate_half", d_rotary_kernel_doc()),
            (
                SOFIA,
                "attention: count the sliding window in past tokens\n\n"
                "Mistral describes the window as the number of previous tokens a query may attend to;\n"
                "make the mask say that explicitly.",
                bug,
            ),
            (KENJI, "model_runner: document block_tables padding", d_runner_doc()),
            (DANIEL, "scheduler: document _chunk", d_sched_doc()),
            (LENA, "llm: document per-prompt sampling params", d_llm_doc()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-swa-window-edge",
        issue_number=1104,
        category="attention",
        modeled_on=["vllm-project/vllm#3385", "huggingface/transformers#29623", "sgl-project/sglang#4823"],
        title="Mistral outputs drift from transformers once the prompt is longer than the sliding window",
        issue=issue_text("ts-swa-window-edge"),
        repro=repro_toml(
            {"arch": "mistral", "seed": 0},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(41, 48), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
            good_ref="base",
        ),
        truth_file=OPS_ATTN,
        truth_function="_visible",
        component="attention",
        mechanism="sliding-window mask uses >= instead of >, letting each query see sliding_window + 1 keys "
        "once the context is longer than the window",
        steps=steps,
        bug_index=4,
    )


def case_chunk_causal_offset() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "    q_pos = torch.arange(seq_len - L, seq_len).view(L, 1)\n",
            "    ctx_len = seq_len - L                          # tokens cached before this chunk\n"
            "    q_pos = torch.arange(L).view(L, 1)             # query rows, relative to the chunk\n",
        ),
        (
            OPS_ATTN,
            "    for t0 in _prefill_tile_range(seq_len - L, seq_len, sliding_window):\n",
            "    for t0 in _prefill_tile_range(ctx_len, seq_len, sliding_window):\n",
        ),
    ]
    steps = history(
        "2025-07-07",
        1105,
        [
            (AMARA, "docs: explain the chunked-prefill token budget", d_readme_chunked()),
            (HANNAH, "ops/attention: note on padded block tables", d_attn_gather_doc()),
            (TOMAS, "sampling_params: add clone()", d_sampling_clone()),
            (PRIYA, "scheduler: expose num_waiting / num_running", d_sched_counts()),
            (WEI, "ops/attention: note on empty partitions in the LSE merge", d_attn_merge_doc()),
            (
                MARCO,
                "attention(prefill): name the cached context length\n\n"
                "No functional change intended: hoist seq_len - L into ctx_len and express the query\n"
                "rows relative to the chunk being computed.",
                bug,
            ),
            (OLGA, "model_runner: StepResult.num_sampled", d_runner_num_sampled()),
            (YUKI, "tests: rotary kernel parity", d_test_rotary()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-chunk-causal-offset",
        issue_number=1105,
        category="attention",
        modeled_on=["vllm-project/vllm#36580", "tenstorrent/vllm#415"],
        title="Nonsense output for long prompts when chunked prefill is enabled",
        issue=issue_text("ts-chunk-causal-offset"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 32, "block_size": 16},
            },
            [
                {"prompt_ids": prompt(51, 70), "max_tokens": 6, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": prompt(52, 12), "max_tokens": 6, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
            good_ref="HEAD~4",
        ),
        truth_file=OPS_ATTN,
        truth_function="paged_attention_prefill",
        component="attention",
        mechanism="prefill query positions made chunk-relative while key positions stay absolute, so every chunk "
        "after the first masks out almost all of the cached context",
        steps=steps,
        bug_index=6,
    )


def case_gqa_decode_layout() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "    qg = q.to(_acc(q.dtype)).view(B, kvh, H // kvh, D)\n",
            "    qg = q.to(_acc(q.dtype)).view(B, H // kvh, kvh, D).transpose(1, 2)   # [B, KVH, G, D], no copy\n",
        )
    ]
    steps = history(
        "2025-03-24",
        1106,
        [
            (
                KENJI,
                "attention(decode): group query heads per KV head with a strided view\n\n"
                "Build the [B, KVH, G, D] query layout the split-KV partitions consume as a view\n"
                "instead of materialising a reshaped copy of q.",
                bug,
            ),
            (LENA, "attention layer: extra_repr", d_attn_layer_repr()),
            (SOFIA, "config: clearer block_size error", d_config_msg()),
            (MARCO, "llama: get_input_embeddings()", d_llama_embeddings()),
            (DANIEL, "layernorm: extra_repr", d_layernorm_repr()),
            (YUKI, "tokenizer: vocab_size property", d_tokenizer_vocab()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-gqa-decode-layout",
        issue_number=1106,
        category="attention",
        modeled_on=["flashinfer-ai/flashinfer#1148", "flashinfer-ai/flashinfer#1614"],
        title="Only the first generated token matches transformers; every later token differs",
        issue=issue_text("ts-gqa-decode-layout"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [
                {"prompt_ids": prompt(61, 20), "max_tokens": 10, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": prompt(62, 14), "max_tokens": 10, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
        ),
        truth_file=OPS_ATTN,
        truth_function="paged_attention_decode",
        component="attention",
        mechanism="decode query heads grouped as h % num_kv_heads instead of h // group_size, so with "
        "1 < num_kv_heads < num_heads query heads attend with the wrong KV head",
        steps=steps,
        bug_index=1,
    )


CASES = [
    case_swa_window_edge(),
    case_chunk_causal_offset(),
    case_gqa_decode_layout(),
]
