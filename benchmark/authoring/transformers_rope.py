"""transformers cases: rotary embeddings, their scalings and precision."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.transformers_history import (
    AISHA,
    CHLOE,
    FELIX,
    IGOR,
    MEI,
    NADIA,
    PABLO,
    QWEN2,
    ROHAN,
    ROPE,
    SARAH,
    SUBJECT,
    TARO,
    TEST_LINEAR_ROPE,
    TEST_QWEN2_ROTARY,
    d_cache_dynamic_maxlen_doc,
    d_llama_rotate_doc,
    d_logits_topk_comment,
    d_mask_causal_doc,
    d_qwen2_norm_doc,
    d_qwen2_repeat_kv_doc,
    d_rope_linear_doc,
    d_rope_llama3_comment,
    d_sdpa_comment,
    d_test,
    history,
    prompt,
    refmodel_repro,
)


def case_yarn_original_ctx() -> CaseSpec:
    bug = [
        (
            ROPE,
            '    truncate = config.rope_parameters.get("truncate", True)\n'
            "    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)\n",
            '    truncate = config.rope_parameters.get("truncate", True)\n'
            "    # The correction range is measured against the context the model is actually run with\n"
            "    context_len = config.max_position_embeddings\n"
            "    low, high = find_correction_range(beta_fast, beta_slow, dim, base, context_len, truncate)\n",
        )
    ]
    steps = history(
        "2025-07-02",
        1301,
        [
            (NADIA, "masking_utils: clarify causal_mask_function docstring", d_mask_causal_doc()),
            (FELIX, "rope: mention position interpolation in the linear scaling docstring", d_rope_linear_doc()),
            (
                ROHAN,
                "rope(yarn): bound the correction range by the serving context length\n\n"
                "The ramp between interpolated and extrapolated dims should cover the positions the\n"
                "model will actually see; read the context length once and name it.",
                bug,
            ),
            (CHLOE, "llama: document rotate_half", d_llama_rotate_doc()),
            (
                IGOR,
                "tests: linear rope scaling parameters",
                d_test("tests/rope/test_linear_scaling.py", TEST_LINEAR_ROPE),
            ),
            (AISHA, "generation: comment the top-k safety clamp", d_logits_topk_comment()),
            (FELIX, "rope: comment the llama3 smoothing band", d_rope_llama3_comment()),
        ],
    )
    a, b = prompt(1301, 40), prompt(13011, 36)
    return CaseSpec(
        subject=SUBJECT,
        id="tf-yarn-original-ctx",
        issue_number=1301,
        category="positional-encoding",
        modeled_on=["NVIDIA/Megatron-LM#1418", "unslothai/unsloth#6197", "ggml-org/llama.cpp#24823"],
        title="YaRN-extended Llama checkpoint no longer reproduces its reference outputs",
        issue=issue_text("tf-yarn-original-ctx"),
        repro=refmodel_repro(
            {
                "arch": "llama",
                "seed": 6,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
            },
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [
                {"prompt_ids": a, "max_tokens": 12, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": b, "max_tokens": 12, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
            good_ref="v5.24.0",
        ),
        truth_file=ROPE,
        truth_function="_compute_yarn_parameters",
        component="rope_utils",
        mechanism="YaRN correction range computed from max_position_embeddings instead of "
        "original_max_position_embeddings, so the interpolation/extrapolation ramp covers the wrong dims",
        steps=steps,
        bug_index=3,
    )


def case_qwen2_rope_bf16() -> CaseSpec:
    bug = [
        (
            QWEN2,
            "        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)\n"
            "        emb = torch.cat((freqs, freqs), dim=-1)\n"
            "        cos = emb.cos() * self.attention_scaling\n"
            "        sin = emb.sin() * self.attention_scaling\n\n"
            "        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)\n",
            "        # Build the tables directly in the activation dtype: saves a float32 [batch, seq, head_dim]\n"
            "        # pair and two casts per forward\n"
            "        inv_freq = self.inv_freq.to(device=x.device, dtype=x.dtype)\n"
            "        freqs = position_ids[..., None].to(inv_freq.dtype) * inv_freq\n"
            "        emb = torch.cat((freqs, freqs), dim=-1)\n"
            "        cos = emb.cos() * self.attention_scaling\n"
            "        sin = emb.sin() * self.attention_scaling\n\n"
            "        return cos, sin\n",
        )
    ]
    steps = history(
        "2025-08-04",
        1302,
        [
            (MEI, "qwen2: expand the RMSNorm docstring", d_qwen2_norm_doc()),
            (PABLO, "cache_utils: document DynamicLayer.get_max_length", d_cache_dynamic_maxlen_doc()),
            (SARAH, "sdpa: note why masks are fine for GQA on XPU/MPS", d_sdpa_comment()),
            (
                MEI,
                "perf(qwen2): compute rotary cos/sin in the activation dtype\n\n"
                "Avoids materialising float32 tables and casting them back on every forward; for\n"
                "float32 models nothing changes.",
                bug,
            ),
            (
                TARO,
                "tests: qwen2 rotary tables dtype and shape",
                d_test("tests/models/qwen2/test_rotary_tables.py", TEST_QWEN2_ROTARY),
            ),
            (PABLO, "qwen2: document repeat_kv", d_qwen2_repeat_kv_doc()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-qwen2-rope-bf16",
        issue_number=1302,
        category="numerics",
        modeled_on=["huggingface/transformers#29285", "huggingface/transformers#25681"],
        title="Qwen2 in bfloat16 drifts from the bf16 reference on long prompts; float32 is exact",
        issue=issue_text("tf-qwen2-rope-bf16"),
        repro=refmodel_repro(
            {"arch": "qwen2", "seed": 5, "initializer_range": 0.2},
            {"engine": "transformers", "dtype": "bfloat16", "options": {"attn_implementation": "eager"}},
            [{"prompt_ids": prompt(1302, 100), "max_tokens": 16, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
            good_ref="HEAD~3",
        ),
        truth_file=QWEN2,
        truth_function="Qwen2RotaryEmbedding.forward",
        component="rotary_embedding",
        mechanism="rotary angles (position * inv_freq) and their cos/sin computed in the activation dtype, so in "
        "bfloat16 the angles are rounded and RoPE is wrong at larger positions; float32 is unaffected",
        steps=steps,
        bug_index=4,
    )


CASES = [
    case_yarn_original_ctx(),
    case_qwen2_rope_bf16(),
]
