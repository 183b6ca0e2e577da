"""tinyserve cases: rotary embeddings and their scalings (positional-encoding)."""

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
    OPS_ROT,
    PRIYA,
    ROPE,
    SOFIA,
    SUBJECT,
    TOMAS,
    WEI,
    YUKI,
    d_config_doc,
    d_engine_abort,
    d_engine_stats,
    d_layernorm_repr,
    d_loader_msg,
    d_readme_rope,
    d_rope_mscale_doc,
    d_rope_repr,
    d_rotary_kernel_doc,
    d_sched_doc,
    d_test_norm,
    d_test_rotary,
    history,
    prompt,
)


def case_llama3_rope_context() -> CaseSpec:
    bug = [
        (
            ROPE,
            '    old_len = rope["original_max_position_embeddings"]\n    wavelen = 2 * math.pi / inv_freq\n',
            "    old_len = max_pos\n    wavelen = 2 * math.pi / inv_freq\n",
        )
    ]
    steps = history(
        "2025-08-04",
        1107,
        [
            (TOMAS, "docs: list supported RoPE scaling types", d_readme_rope()),
            (
                OLGA,
                "rope(llama3): take the wavelength bands from max_position_embeddings\n\n"
                "Use the model's configured context (the max_pos every other rotary path gets) instead\n"
                "of a second length kept in the rope dict.",
                bug,
            ),
            (WEI, "rope: document the YaRN attention temperature", d_rope_mscale_doc()),
            (PRIYA, "rope: extra_repr", d_rope_repr()),
            (AMARA, "engine: add abort_request()", d_engine_abort()),
            (HANNAH, "tests: rotary kernel parity", d_test_rotary()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-llama3-rope-context",
        issue_number=1107,
        category="positional-encoding",
        modeled_on=["ggml-org/llama.cpp#24823", "unslothai/unsloth#6197"],
        title="Llama-3.1-style rope_scaling: logits differ from transformers beyond the first few positions",
        issue=issue_text("ts-llama3-rope-context"),
        repro=repro_toml(
            {
                "arch": "llama",
                "seed": 0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                },
            },
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [{"prompt_ids": prompt(71, 64), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
            good_ref="base",
        ),
        truth_file=ROPE,
        truth_function="llama3_inv_freq",
        component="rotary_embedding",
        mechanism="llama3 frequency bands computed from max_position_embeddings instead of "
        "original_max_position_embeddings, so mid frequencies are scaled wrongly",
        steps=steps,
        bug_index=2,
    )


def case_rope_packed_positions() -> CaseSpec:
    bug = [
        (
            OPS_ROT,
            "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)\n"
            "    return _rotate(query, cos, sin, head_dim), _rotate(key, cos, sin, head_dim)\n",
            "    # the rows of a forward cover consecutive positions: slice the table, no gather\n"
            "    start = int(positions[0]) if positions.numel() else 0\n"
            "    cos, sin = cos_sin_cache[start:start + positions.numel()].to(query.dtype).chunk(2, dim=-1)\n"
            "    return _rotate(query, cos, sin, head_dim), _rotate(key, cos, sin, head_dim)\n",
        )
    ]
    steps = history(
        "2025-09-15",
        1108,
        [
            (SOFIA, "ops/rotary: comment _rotate_half", d_rotary_kernel_doc()),
            (YUKI, "model_loader: hint at HF-format dirs in the missing-weights error", d_loader_msg()),
            (DANIEL, "engine: count generated tokens", d_engine_stats()),
            (LENA, "rope: extra_repr", d_rope_repr()),
            (
                KENJI,
                "perf(rotary): slice the cos/sin table instead of gathering it\n\n"
                "index_select over the whole [max_model_len, rot_dim] table shows up in CPU profiles\n"
                "of small models. A forward's rows are consecutive positions, so a slice is enough.",
                bug,
            ),
            (MARCO, "layernorm: extra_repr", d_layernorm_repr()),
            (OLGA, "tests: fused_add_rms_norm parity", d_test_norm()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-rope-packed-positions",
        issue_number=1108,
        category="positional-encoding",
        modeled_on=["flashinfer-ai/flashinfer#619", "vllm-project/vllm#3869"],
        title="Output depends on what else is in the batch: concurrent requests get wrong tokens",
        issue=issue_text("ts-rope-packed-positions"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [
                {"prompt_ids": prompt(81, 20), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": prompt(82, 29), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
            good_ref="HEAD~3",
        ),
        truth_file=OPS_ROT,
        truth_function="rotary_embedding",
        component="rotary_embedding",
        mechanism="rotary kernel slices cos/sin from positions[0] assuming one contiguous run, so in a packed "
        "batch of several sequences every sequence but the first is rotated at wrong positions",
        steps=steps,
        bug_index=5,
    )


def case_linear_rope_twice() -> CaseSpec:
    bug = [
        (
            ROPE,
            "        n = max(max_position, max_model_len)\n"
            "        # a plain attribute, not a buffer: it must stay fp32 when the model is cast\n"
            "        self.cos_sin_cache = compute_cos_sin_cache(inv_freq, torch.arange(n), self.attention_scaling)\n",
            "        n = max(max_position, max_model_len)\n"
            "        positions = torch.arange(n, dtype=torch.float32)\n"
            '        if rope_type == "linear":\n'
            '            positions = positions / rope["factor"]      # position interpolation\n'
            "        # a plain attribute, not a buffer: it must stay fp32 when the model is cast\n"
            "        self.cos_sin_cache = compute_cos_sin_cache(inv_freq, positions, self.attention_scaling)\n",
        )
    ]
    steps = history(
        "2025-04-20",
        1109,
        [
            (
                PRIYA,
                "rope: position interpolation for linear scaling\n\n"
                "Linear scaling (Chen et al., 2023) interpolates positions by 1/factor; build the cos/sin\n"
                "table over the interpolated positions.",
                bug,
            ),
            (AMARA, "ops/rotary: comment _rotate_half", d_rotary_kernel_doc()),
            (TOMAS, "scheduler: document _chunk", d_sched_doc()),
            (WEI, "config: document how per-layer windows are chosen", d_config_doc()),
            (HANNAH, "tests: rotary kernel parity", d_test_rotary()),
            (LENA, "docs: list supported RoPE scaling types", d_readme_rope()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-linear-rope-twice",
        issue_number=1109,
        category="positional-encoding",
        modeled_on=["unslothai/unsloth#6197", "huggingface/transformers#25681"],
        title="Linear RoPE scaling (factor 4) model generates degraded text compared to transformers",
        issue=issue_text("ts-linear-rope-twice"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [{"prompt_ids": prompt(91, 40), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
        ),
        truth_file=ROPE,
        truth_function="RotaryEmbedding.__init__",
        component="rotary_embedding",
        mechanism="linear scaling divides the positions by factor on top of inv_freq already divided by factor, "
        "so the factor is applied twice",
        steps=steps,
        bug_index=1,
    )


CASES = [
    case_llama3_rope_context(),
    case_rope_packed_positions(),
    case_linear_rope_twice(),
]
