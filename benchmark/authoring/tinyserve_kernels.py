"""tinyserve cases: attention kernels, split-KV merges and tiling (kernel)."""

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
    OPS_ATTN,
    OWEN,
    RAFAEL,
    SUBJECT,
    SVEN,
    d_act_doc,
    d_attn_consts_doc,
    d_attn_write_check,
    d_bm_usage_v2,
    d_config_max_num_seqs,
    d_embed_doc,
    d_engine_abort_v2,
    d_linear_doc,
    d_llama_doc,
    d_loader_message,
    d_norm_doc_v2,
    d_readme_native,
    d_seq_repr_v2,
    d_test_kernels,
    d_tokenizer_vocab_v2,
    good_ref_before,
    history_hourly,
    prompt,
)


def case_splitkv_lse_base() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition\n",
            "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition\nLOG2E = 1.4426950408889634\n",
        ),
        (
            OPS_ATTN,
            "    p = torch.exp(s - m_safe)\n"
            "    l = p.sum(-1, keepdim=True)\n"
            '    out = torch.einsum("bkgp,bpkd->bkgd", p, v) / l.clamp_min(torch.finfo(l.dtype).tiny)\n'
            "    return out, (m_safe + torch.log(l)).squeeze(-1)\n",
            "    p = torch.exp2((s - m_safe) * LOG2E)        # exp(x) == 2 ** (x * log2 e); exp2 is cheaper\n"
            "    l = p.sum(-1, keepdim=True)\n"
            '    out = torch.einsum("bkgp,bpkd->bkgd", p, v) / l.clamp_min(torch.finfo(l.dtype).tiny)\n'
            "    return out, (m_safe + torch.log2(l)).squeeze(-1)\n",
        ),
    ]
    entries = [
        (RAFAEL, "block_manager: add usage property", d_bm_usage_v2()),
        (CLAIRE, "ops/norm: note the in-place contract of fused_add_rms_norm", d_norm_doc_v2()),
        (
            IGOR,
            "perf(attention): base-2 exponentials in split-KV decode\n\n"
            "exp2 maps to a single instruction on most backends; fold log2(e) into the scores.",
            bug,
        ),
        (NADIA, "ops/activation: describe the optimized paths", d_act_doc()),
        (LUCIA, "engine: add abort_request()", d_engine_abort_v2()),
        (JONAS, "embedding: note on padded vocab rows", d_embed_doc()),
    ]
    steps, bug_index = history_hourly("2025-09-15", 1207, entries), 3
    return CaseSpec(
        subject=SUBJECT,
        id="ts-splitkv-lse-base",
        issue_number=1207,
        category="kernel",
        modeled_on=["flashinfer-ai/flashinfer#58", "local-inference-lab/vllm#17"],
        title="Generation quality drops once the context is longer than ~64 tokens",
        issue=issue_text("ts-splitkv-lse-base"),
        repro=repro_toml(
            {"arch": "llama", "seed": 7},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1207, 80), "max_tokens": 8, "sampling": GREEDY}],
            good_ref=good_ref_before(len(entries), bug_index, extra=1),
        ),
        truth_file=OPS_ATTN,
        truth_function="_decode_partition",
        component="paged_attention",
        mechanism="split-KV partition LSE mixes a natural-log max with log2 of the sum, so merging two or "
        "more partitions weights them wrongly (a single partition is unaffected)",
        steps=steps,
        bug_index=bug_index,
    )


def case_prefill_softmax_rescale() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "        m_new = torch.maximum(m, s.amax(-1, keepdim=True))\n"
            "        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)\n"
            "        p = torch.exp(s - m_safe)\n"
            "        correction = torch.exp(m - m_safe)\n"
            "        l = l * correction + p.sum(-1, keepdim=True)\n"
            '        acc = acc * correction + torch.einsum("kgln,knd->kgld", p, v)\n'
            "        m = m_new\n",
            "        m = torch.maximum(m, s.amax(-1, keepdim=True))      # running max, updated in place\n"
            "        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n"
            "        p = torch.exp(s - m_safe)\n"
            "        correction = torch.exp(m - m_safe)\n"
            "        l = l * correction + p.sum(-1, keepdim=True)\n"
            '        acc = acc * correction + torch.einsum("kgln,knd->kgld", p, v)\n',
        )
    ]
    entries = [
        (HYEJIN, "docs: how to rule out the optimized kernels", d_readme_native()),
        (ARJUN, "sequence: readable repr", d_seq_repr_v2()),
        (MEI, "linear: document the row-parallel layout", d_linear_doc()),
        (OWEN, "ops/attention: comment on tile sizes", d_attn_consts_doc()),
        (FATIMA, "model_loader: clearer message when no safetensors are found", d_loader_message()),
        (SVEN, "refactor(attention): drop the m_new temporary in tiled prefill", bug),
        (CLAIRE, "tests: kernel twins agree on small inputs", d_test_kernels()),
    ]
    steps, bug_index = history_hourly("2025-10-20", 1208, entries), 6
    return CaseSpec(
        subject=SUBJECT,
        id="ts-prefill-softmax-rescale",
        issue_number=1208,
        category="kernel",
        modeled_on=["Dao-AILab/flash-attention#2717", "flashinfer-ai/flashinfer#61"],
        title="Outputs wrong for prompts longer than 32 tokens (short prompts OK)",
        issue=issue_text("ts-prefill-softmax-rescale"),
        repro=repro_toml(
            {"arch": "llama", "seed": 8},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1208, 48), "max_tokens": 6, "sampling": GREEDY}],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=OPS_ATTN,
        truth_function="paged_attention_prefill",
        component="paged_attention",
        mechanism="running max is overwritten before the rescale factor is computed, so the accumulator and "
        "normaliser are never rescaled when a later KV tile raises the max",
        steps=steps,
        bug_index=bug_index,
    )


def case_swa_tile_skip() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "    lo = 0 if sliding_window is None else max(0, q_start - sliding_window + 1)\n"
            "    lo = lo // KV_TILE_TOKENS * KV_TILE_TOKENS\n"
            "    return range(lo, seq_len, KV_TILE_TOKENS)\n",
            "    if sliding_window is None or q_start < sliding_window:\n"
            "        return range(0, seq_len, KV_TILE_TOKENS)\n"
            "    # the first visible key, q_start - sliding_window + 1, lies in the tile after the one\n"
            "    # holding q_start - sliding_window\n"
            "    first_tile = (q_start - sliding_window) // KV_TILE_TOKENS + 1\n"
            "    return range(first_tile * KV_TILE_TOKENS, seq_len, KV_TILE_TOKENS)\n",
        )
    ]
    entries = [
        (JONAS, "refactor(attention): simpler tile range for sliding-window prefill", bug),
        (RAFAEL, "engine: add abort_request()", d_engine_abort_v2()),
        (NADIA, "ops/attention: check slot_mapping length when writing the KV cache", d_attn_write_check()),
        (LUCIA, "config: validate max_num_seqs", d_config_max_num_seqs()),
        (MEI, "models/llama: document per-arch differences", d_llama_doc()),
        (IGOR, "tokenizer: vocab_size property", d_tokenizer_vocab_v2()),
    ]
    steps = history_hourly("2025-11-24", 1209, entries)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-swa-tile-skip",
        issue_number=1209,
        category="kernel",
        modeled_on=["sgl-project/sglang#4823", "Dao-AILab/flash-attention#2550"],
        title="Mistral (sliding window) + chunked prefill: long prompts give different output",
        issue=issue_text("ts-swa-tile-skip"),
        repro=repro_toml(
            {"arch": "mistral", "seed": 9},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 24, "block_size": 16},
            },
            [{"prompt_ids": prompt(1209, 80), "max_tokens": 6, "sampling": GREEDY}],
        ),
        truth_file=OPS_ATTN,
        truth_function="_prefill_tile_range",
        component="paged_attention",
        mechanism="sliding-window prefill starts one KV tile too late when the window's first key is not "
        "tile-aligned, dropping in-window keys for chunks that start past the window",
        steps=steps,
        bug_index=1,
    )


CASES = [
    case_splitkv_lse_base(),
    case_prefill_softmax_rescale(),
    case_swa_tile_skip(),
]
