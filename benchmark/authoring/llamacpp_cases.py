"""llama.cpp cases (issue 17 part 3): silent bugs in the vendored llama.cpp, each modelled on a real
ggml-org/llama.cpp issue or fix PR.

    python -m benchmark.author [CASE ...] [--cases-dir DIR]   # writes these (and every other module's) cases

Every case is the shared llama.cpp commit stream (benchmark/authoring/llamacpp_stream.py) with the
case's culprit inserted: the easy ones use the stream's first commits, the hard ones all of it with
`good_ref` a build tag many commits back, and the at-base one folds its bug into `base`
(`commits/00-base-01-*.patch`) so the whole stream comes after it and no commit introduces the bug.
The scenarios run a tiny seeded llama or qwen2 checkpoint converted to GGUF, greedy. Issue prose
lives in benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmark.authoring.common import CaseSpec, Step, issue_text, repro_data
from benchmark.authoring.llamacpp_stream import CPU, KV, MODEL, VEC, X86Q, Commit, history
from benchmark.authoring.tinyserve_hard import greedy

SUBJECT = "llama.cpp"
CASES_DIR = Path(__file__).resolve().parents[1] / "cases"

MARTA = "Marta Kowalczyk <marta.kowalczyk@proton.me>"
OLU = "Olumide Adeyemi <olu.adeyemi@gmail.com>"
REZA = "Reza Tavakoli <reza.tavakoli.dev@gmail.com>"
LENA = "Lena Fischer <lena.fischer@posteo.de>"
TOMAS = "Tomás Herrera <therrera@fastmail.com>"
BASE_AUTHOR = "ggml-org <ggml@ggml.ai>"


@dataclass
class LlamaCppCase(CaseSpec):
    """A CaseSpec on the llama.cpp subject; `track` is set per case (easy, hard, at-base)."""


def scenario(model: dict, requests: list[dict], dtype: str = "float32", options: dict | None = None) -> dict:
    target = {"engine": "llama.cpp", "dtype": dtype} | ({"options": options} if options else {})
    return repro_data(model, target, requests)


def case(
    id: str,
    number: int,
    category: str,
    track: str,
    modeled_on: list[str],
    title: str,
    repro: dict,
    truth: tuple[str, str, str, str],
    culprit: Commit | None,
    at: int = -1,
    upto: int | None = None,
    good_ref: str | None = None,
    base_bug: Step | None = None,
) -> LlamaCppCase:
    """`culprit` inserted after stream commit `at` of the first `upto` stream commits; or, with
    `base_bug`, the bug folded into base and the stream after it."""
    h = history({at: [culprit]} if culprit else {}, culprit, seed=number, upto=upto)
    file, function, component, mechanism = truth
    return LlamaCppCase(
        subject=SUBJECT,
        id=id,
        issue_number=number,
        category=category,
        modeled_on=modeled_on,
        title=title,
        issue=issue_text(id),
        repro=repro,
        truth_file=file,
        truth_function=function,
        component=component,
        mechanism=mechanism,
        steps=h.steps,
        bug_index=h.bug_index,
        track=track,
        base_steps=(base_bug,) if base_bug else (),
        good_ref=good_ref,
        tags=h.tags,
    )


# ============================================================================= 2101 positional-encoding (hard)

ROPE_GROUP = Commit(
    "llama : dream rotates consecutive pairs (#16571)\n\n"
    "Dream checkpoints are converted with the LLaMA q/k permutation, so their rope has to pair\n"
    "adjacent head values, like HY_V4 below.",
    MARTA,
    [
        (
            MODEL,
            "        case LLM_ARCH_QWEN2:\n        case LLM_ARCH_DREAM:\n        case LLM_ARCH_QWEN2MOE:\n",
            "        case LLM_ARCH_QWEN2:\n"
            "        // Dream is converted with the LLaMA q/k permutation: it rotates consecutive pairs\n"
            "        case LLM_ARCH_DREAM:\n"
            "            return LLAMA_ROPE_TYPE_NORM;\n"
            "        case LLM_ARCH_QWEN2MOE:\n",
        )
    ],
)


def rope_group() -> LlamaCppCase:
    return case(
        "lc-hard-qwen2-rope-group",
        2101,
        "positional-encoding",
        "hard",
        ["ggml-org/llama.cpp#13260", "ggml-org/llama.cpp#13261", "ikawrakow/ik_llama.cpp#2290"],
        "Qwen2 GGUF output wrong since a recent build; LLaMA GGUF of the same size is fine",
        scenario({"arch": "qwen2", "seed": 7}, [greedy(20, 2101, 8)]),
        (
            MODEL,
            "llama_model_rope_type",
            "rope type per architecture",
            "a `return LLAMA_ROPE_TYPE_NORM` inserted after DREAM inside the NEOX fall-through group gives every "
            "architecture listed above it (qwen2 among them) the normal (pairwise) rope instead of NeoX",
        ),
        ROPE_GROUP,
        at=14,
        good_ref="b7010",
    )


# ============================================================================= 2102 kv-cache (hard)

NKV_FLOOR = Commit(
    "kv-cache : compute the padded n_kv once per stream\n\n"
    "GGML_PAD evaluates its argument twice; used_max_p1() walks the cells, so take it once.",
    OLU,
    [
        (
            KV,
            "        result = std::max(std::min(cells.size(), std::max(n_pad_cur, "
            "GGML_PAD(cells.used_max_p1(), n_pad_cur))), result);\n",
            "        const uint32_t used = cells.used_max_p1();\n"
            "        const uint32_t used_pad = (used/n_pad_cur)*n_pad_cur;\n\n"
            "        result = std::max(std::min(cells.size(), std::max(n_pad_cur, used_pad)), result);\n",
        )
    ],
)


def nkv_floor() -> LlamaCppCase:
    return case(
        "lc-hard-kv-nkv-floor",
        2102,
        "kv-cache",
        "hard",
        ["ggml-org/llama.cpp#14847", "ggml-org/llama.cpp#12253"],
        "Generation turns to nonsense once the sequence passes 256 tokens",
        scenario({"arch": "llama", "seed": 11}, [greedy(250, 2102, 24)]),
        (
            KV,
            "llama_kv_cache.get_n_kv",
            "kv cache view size",
            "the number of KV cells the attention reads is rounded down (not up) to the 256-cell padding, so once a "
            "sequence passes 256 tokens the newest tokens no longer see themselves or each other",
        ),
        NKV_FLOOR,
        at=8,
        good_ref="b7010",
    )


# ============================================================================= 2103 quantization (easy)

Q8_ABSMAX = Commit(
    "ggml-cpu : fewer andnot ops in the AVX quantize_row_q8_0 max reduction\n\n"
    "Reduce the four vectors with max first and clear the sign bit once.",
    REZA,
    [
        (
            X86Q,
            "        __m256 maxAbs = _mm256_andnot_ps( signBit, v0 );\n"
            "        maxAbs = _mm256_max_ps( maxAbs, _mm256_andnot_ps( signBit, v1 ) );\n"
            "        maxAbs = _mm256_max_ps( maxAbs, _mm256_andnot_ps( signBit, v2 ) );\n"
            "        maxAbs = _mm256_max_ps( maxAbs, _mm256_andnot_ps( signBit, v3 ) );\n"
            "\n"
            "        __m128 max4 = _mm_max_ps( _mm256_extractf128_ps( maxAbs, 1 ), _mm256_castps256_ps128( maxAbs ) );\n"
            "        max4 = _mm_max_ps( max4, _mm_movehl_ps( max4, max4 ) );\n"
            "        max4 = _mm_max_ss( max4, _mm_movehdup_ps( max4 ) );\n"
            "        const float maxScalar = _mm_cvtss_f32( max4 );\n",
            "        __m256 maxAbs = _mm256_max_ps( _mm256_max_ps( v0, v1 ), _mm256_max_ps( v2, v3 ) );\n"
            "        maxAbs = _mm256_andnot_ps( signBit, maxAbs );\n"
            "\n"
            "        __m128 max4 = _mm_max_ps( _mm256_extractf128_ps( maxAbs, 1 ), _mm256_castps256_ps128( maxAbs ) );\n"
            "        max4 = _mm_max_ps( max4, _mm_movehl_ps( max4, max4 ) );\n"
            "        max4 = _mm_max_ss( max4, _mm_movehdup_ps( max4 ) );\n"
            "        const float maxScalar = _mm_cvtss_f32( max4 );\n",
        )
    ],
)


def q8_absmax() -> LlamaCppCase:
    return case(
        "lc-q8-absmax-sign",
        2103,
        "quantization",
        "easy",
        ["ggml-org/llama.cpp#876", "ggml-org/llama.cpp#14827"],
        "Q8_0 GGUF answers differ from the F32 GGUF of the same model on x86",
        scenario({"arch": "llama", "seed": 5}, [greedy(24, 2103, 8)], options={"weights": "q8_0"}),
        (
            X86Q,
            "quantize_row_q8_0",
            "q8_0 activation quantizer",
            "the AVX block scale is taken from |max(x)| instead of max(|x|), so blocks whose largest magnitude is "
            "negative get too small a scale and their int8 values saturate at -128",
        ),
        Q8_ABSMAX,
        at=4,
        upto=8,
    )


# ============================================================================= 2104 kernel (easy)

SWIGLU_TAIL = Commit(
    "ggml-cpu : swiglu leftover loop uses the scalar silu helper\n\n"
    "Same helper as the silu kernel's tail; keeps the SIMD and scalar paths in one place.",
    LENA,
    [
        (
            VEC,
            "        y[i] = ggml_silu_f32(x[i]) * g[i];\n    }\n}\n\nggml_float ggml_vec_cvar_f32",
            "        y[i] = ggml_silu_f32(g[i]) * x[i];\n    }\n}\n\nggml_float ggml_vec_cvar_f32",
        )
    ],
)


def swiglu_tail() -> LlamaCppCase:
    return case(
        "lc-swiglu-tail-swap",
        2104,
        "kernel",
        "easy",
        ["ggml-org/llama.cpp#7154", "ggml-org/llama.cpp#17449"],
        "Model with an FFN width of 100 drifts from transformers; width 128 matches",
        scenario({"arch": "llama", "seed": 9, "intermediate_size": 100}, [greedy(20, 2104, 8)]),
        (
            VEC,
            "ggml_vec_swiglu_f32",
            "swiglu kernel",
            "the scalar tail of the SwiGLU kernel (the last n % 8 columns on AVX2) applies silu to the up projection "
            "and multiplies by the gate, swapping the operands",
        ),
        SWIGLU_TAIL,
        at=2,
        upto=9,
    )


# ============================================================================= 2105 kernel (easy)

SOFTMAX_HADD = Commit(
    "ggml-cpu : horizontal add with hadd in the AVX2 soft_max\n\n"
    "hadd is one instruction where movehl + movehdup + add_ss was three.",
    TOMAS,
    [
        (
            VEC,
            "                                               _mm256_set1_ps(max)));\n"
            "        _mm256_storeu_ps(y + i, val);\n"
            "        __m128 val2 = _mm_add_ps(_mm256_extractf128_ps(val, 1),\n"
            "                                 _mm256_castps256_ps128(val));\n"
            "        val2 = _mm_add_ps(val2, _mm_movehl_ps(val2, val2));\n"
            "        val2 = _mm_add_ss(val2, _mm_movehdup_ps(val2));\n",
            "                                               _mm256_set1_ps(max)));\n"
            "        _mm256_storeu_ps(y + i, val);\n"
            "        __m128 val2 = _mm_add_ps(_mm256_extractf128_ps(val, 1),\n"
            "                                 _mm256_castps256_ps128(val));\n"
            "        val2 = _mm_hadd_ps(val2, val2);\n",
        )
    ],
)


def softmax_hadd() -> LlamaCppCase:
    return case(
        "lc-softmax-hadd-sum",
        2105,
        "kernel",
        "easy",
        ["ggml-org/llama.cpp#7154", "ggml-org/llama.cpp#12441"],
        "Attention outputs too large on x86 CPU builds; greedy text differs from transformers",
        scenario({"arch": "llama", "seed": 13}, [greedy(16, 2105, 8)]),
        (
            VEC,
            "ggml_vec_soft_max_f32",
            "softmax kernel",
            "a single _mm_hadd_ps leaves the AVX2 partial sum at lanes 0+1 of each 4-lane half, so the softmax "
            "denominator misses half of the exponentials and the attention weights sum to about 2",
        ),
        SOFTMAX_HADD,
        at=5,
        upto=7,
    )


# ============================================================================= 2106 attention (at base)

GQA_BROADCAST = Step(
    "ggml-cpu : mul_mat through llamafile sgemm with broadcast over dims 2 and 3",
    BASE_AUTHOR,
    "2025-11-01T09:00:00+00:00",
    [
        (
            CPU,
            "                                     (const char *)src0->data + i12/r2*nb02 + i13/r3*nb03,\n"
            "                                     nb01/ggml_type_size(src0->type),\n"
            "                                     (const char *)wdata",
            "                                     (const char *)src0->data + (i12%ne02)*nb02 + (i13%ne03)*nb03,\n"
            "                                     nb01/ggml_type_size(src0->type),\n"
            "                                     (const char *)wdata",
        )
    ],
    slug="mul-mat-sgemm-broadcast",
)


def gqa_broadcast() -> LlamaCppCase:
    return case(
        "lc-base-gqa-broadcast",
        2106,
        "attention",
        "at-base",
        ["ggml-org/llama.cpp#3402", "ggml-org/llama.cpp#11380"],
        "Grouped-query models never match transformers on CPU; the same model with one KV head per query head does",
        scenario({"arch": "llama", "seed": 17}, [greedy(20, 2106, 8)], dtype="float16"),
        (
            CPU,
            "ggml_compute_forward_mul_mat",
            "matmul broadcast",
            "the sgemm path for converted activations picks the K/V head of query head i as i % n_kv_heads (tiling) "
            "instead of i / (n_heads / n_kv_heads), so grouped-query attention pairs queries with the wrong keys",
        ),
        None,
        base_bug=GQA_BROADCAST,
    )


CASES = [rope_group(), nkv_floor(), q8_absmax(), swiglu_tail(), softmax_hadd(), gqa_broadcast()]
