"""transformers cases: per-architecture config values (model-config)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.transformers_history import (
    FELIX,
    GEMMA2,
    MEI,
    NADIA,
    SARAH,
    SUBJECT,
    TARO,
    TEST_GEMMA2_CONFIG,
    d_gemma2_embed_doc,
    d_gemma2_softcap_comment,
    d_mask_padding_doc,
    d_rope_llama3_comment,
    d_test,
    history,
    prompt,
    refmodel_repro,
)


def case_gemma2_query_scalar() -> CaseSpec:
    bug = [
        (
            GEMMA2,
            "        self.scaling = config.query_pre_attn_scalar**-0.5\n",
            "        self.scaling = self.head_dim**-0.5\n",
        )
    ]
    steps = history(
        "2026-01-12",
        1307,
        [
            (
                SARAH,
                "gemma2: attention scaling from head_dim\n\n"
                "Use the same 1/sqrt(head_dim) attention scale as the other decoder models.",
                bug,
            ),
            (TARO, "gemma2: fix embedding docstring", d_gemma2_embed_doc()),
            (NADIA, "masking_utils: fix padding_mask_function docstring", d_mask_padding_doc()),
            (FELIX, "rope: comment the llama3 smoothing band", d_rope_llama3_comment()),
            (
                MEI,
                "tests: gemma2 config layer types and softcaps",
                d_test("tests/models/gemma2/test_config.py", TEST_GEMMA2_CONFIG),
            ),
            (SARAH, "gemma2: comment the attention softcap", d_gemma2_softcap_comment()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-gemma2-query-scalar",
        issue_number=1307,
        category="model-config",
        modeled_on=["ggml-org/llama.cpp#8197", "ggml-org/llama.cpp#8240", "vllm-project/vllm#5908"],
        title="Gemma 2 with query_pre_attn_scalar != head_dim: logits off from the first token",
        issue=issue_text("tf-gemma2-query-scalar"),
        repro=refmodel_repro(
            {"arch": "gemma2", "seed": 4, "query_pre_attn_scalar": 32},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [{"prompt_ids": prompt(1307, 18), "max_tokens": 10, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
        ),
        truth_file=GEMMA2,
        truth_function="Gemma2Attention.__init__",
        component="gemma2_attention",
        mechanism="attention scale taken as head_dim ** -0.5 instead of query_pre_attn_scalar ** -0.5; identical "
        "only when query_pre_attn_scalar == head_dim",
        steps=steps,
        bug_index=1,
    )


CASES = [
    case_gemma2_query_scalar(),
]
