"""A realistic commit stream for the llama.cpp subject, shared by the lc-* cases (docs/design.md §6b).

llama.cpp's log is a flood of small C/C++ changes: log lines, comments, asserts, a rope type fixed
for one architecture, a kernel tidied, a refactor of a hot loop that computes the same numbers.
`stream()` is such a log against the vendored snapshot (src/ and ggml/src/ggml-cpu/ only, .c/.cpp
files only so a commit rebuilds one translation unit, never a header that recompiles half the tree);
a case inserts its own commits at chosen points with `history(...)`, which dates them and names the
build tags (`b7010`, `b7024`, `b7041`, llama.cpp's release naming) that the case's `[tags]` point at.

Every edit is a (file, old_text, new_text) replacement that must match exactly once in the tree at
that point of the history, and no stream edit touches the text a case's culprit rewrites.
"""

from __future__ import annotations

from benchmark.authoring.tinyserve_stream import Commit, History, weave

MODEL = "src/llama-model.cpp"
KV = "src/llama-kv-cache.cpp"
CTX = "src/llama-context.cpp"
OPS = "ggml/src/ggml-cpu/ops.cpp"
VEC = "ggml/src/ggml-cpu/vec.cpp"
CPU = "ggml/src/ggml-cpu/ggml-cpu.c"
X86Q = "ggml/src/ggml-cpu/arch/x86/quants.c"

GG = "Georgi Gerganov <ggerganov@gmail.com>"
CISC = "Sigbjørn Skjæret <sigbjorn.skjaeret@scala.com>"
JG = "Johannes Gäßler <johannesg@5d6.de>"
SLAREN = "Diego Devesa <slarengh@gmail.com>"
AM = "Aman Gupta <amangupta052@gmail.com>"
XS = "Xuan-Son Nguyen <son@huggingface.co>"
DB = "Daniel Bevenius <daniel.bevenius@gmail.com>"
CC = "compilade <git@compilade.net>"


def stream() -> list[Commit]:
    """The shared log, oldest first. Indices are stable: cases insert after a given index."""
    return [
        # 0
        Commit(
            "kv-cache : log the K-shift per stream at debug level",
            GG,
            [
                (
                    KV,
                    'LLAMA_LOG_DEBUG("%s: applying K-shift\\n", __func__);',
                    'LLAMA_LOG_DEBUG("%s: applying K-shift (%u streams)\\n", __func__, n_stream);',
                )
            ],
        ),
        # 1
        Commit(
            "ggml-cpu : comment on the rms_norm accumulator precision",
            AM,
            [
                (
                    OPS,
                    "                ggml_float sum = 0.0;\n                // worth switching to explicit SIMD?\n",
                    "                // accumulate in ggml_float (double): long rows lose digits in a float sum\n"
                    "                ggml_float sum = 0.0;\n                // worth switching to explicit SIMD?\n",
                )
            ],
        ),
        # 2
        Commit(
            "llama : print the context's rope frequency base with more digits",
            CISC,
            [
                (
                    CTX,
                    'LLAMA_LOG_INFO("%s: freq_base             = %.1f\\n", __func__, cparams.rope_freq_base);',
                    'LLAMA_LOG_INFO("%s: freq_base             = %.3f\\n", __func__, cparams.rope_freq_base);',
                )
            ],
        ),
        # 3  (tagged b7010)
        Commit(
            "llama : bailingmoe rope type is neox (#16422)",
            CISC,
            [
                (
                    MODEL,
                    "        case LLM_ARCH_CHAMELEON:\n        case LLM_ARCH_BAILINGMOE:\n        case LLM_ARCH_NEO_BERT:\n",
                    "        case LLM_ARCH_CHAMELEON:\n        case LLM_ARCH_NEO_BERT:\n",
                ),
                (
                    MODEL,
                    "        case LLM_ARCH_MINICPM3:\n        case LLM_ARCH_BAILINGMOE2:\n",
                    "        case LLM_ARCH_MINICPM3:\n        case LLM_ARCH_BAILINGMOE:\n        case LLM_ARCH_BAILINGMOE2:\n",
                ),
            ],
        ),
        # 4
        Commit(
            "ggml-cpu : name the softmax ALiBi slope computation",
            JG,
            [
                (
                    OPS,
                    "                // ALiBi\n                const uint32_t h = i02; // head\n",
                    "                // ALiBi: slope 1.0f (no bias) unless max_bias > 0\n                const uint32_t h = i02; // head\n",
                )
            ],
        ),
        # 5
        Commit(
            "kv-cache : purge log names the stream",
            DB,
            [
                (
                    KV,
                    '            LLAMA_LOG_DEBUG("%s: purging positions [%d, %d] of sequence %d from KV cache\\n",\n'
                    "                    __func__, cells.seq_pos_min(s), seq_pos_max_rm[s], s);\n",
                    '            LLAMA_LOG_DEBUG("%s: purging positions [%d, %d] of sequence %d from KV cache (stream %d)\\n",\n'
                    "                    __func__, cells.seq_pos_min(s), seq_pos_max_rm[s], s, seq_to_stream[s]);\n",
                )
            ],
        ),
        # 6
        Commit(
            "ggml-cpu : assert the swiglu row width",
            AM,
            [
                (
                    OPS,
                    "        ggml_vec_swiglu_f32(nc, (float *) ((char *) dst->data + i1*(dst->nb[1])), src0_p, src1_p);\n",
                    "        GGML_ASSERT(nc > 0);\n"
                    "        ggml_vec_swiglu_f32(nc, (float *) ((char *) dst->data + i1*(dst->nb[1])), src0_p, src1_p);\n",
                )
            ],
        ),
        # 7
        Commit(
            "llama : warn when n_ctx_seq exceeds the training context only once",
            XS,
            [
                (
                    CTX,
                    'LLAMA_LOG_INFO("%s: n_outputs_max_per_seq = %u\\n",   __func__, cparams.n_outputs_max_per_seq);',
                    'LLAMA_LOG_INFO("%s: n_outputs_max_per_seq = %u\\n",   __func__, cparams.n_outputs_max_per_seq);'
                    "\n    // note: the training-context warnings below are printed once per context",
                )
            ],
        ),
        # 8
        Commit(
            "kv-cache : comment on why n_kv is padded to 256",
            GG,
            [
                (
                    KV,
                    "    // pad the n_kv value so that the graph remains constant across batches and can be reused\n",
                    "    // pad the n_kv value so that the graph remains constant across batches and can be reused\n"
                    "    // (the KQ mask masks the padded cells, so a larger n_kv never changes the result)\n",
                )
            ],
        ),
        # 9
        Commit(
            "ggml-cpu : rms_norm scale computed with one division",
            AM,
            [
                (
                    OPS,
                    "                const float mean  = sum/ne00;\n                const float scale = 1.0f/sqrtf(mean + eps);\n\n"
                    "                // if you hit this, likely you got an inf somewhere earlier\n",
                    "                const float mean  = (float)(sum/ne00);\n                const float scale = 1.0f/sqrtf(mean + eps);\n\n"
                    "                // if you hit this, likely you got an inf somewhere earlier\n",
                )
            ],
        ),
        # 10
        Commit(
            "llama : olmo2 and olmoe listed next to gpt-neox in the rope table",
            CISC,
            [
                (
                    MODEL,
                    "        case LLM_ARCH_RND1:\n        case LLM_ARCH_OLMO2:\n        case LLM_ARCH_OLMOE:\n",
                    "        case LLM_ARCH_RND1:\n",
                ),
                (
                    MODEL,
                    "        case LLM_ARCH_GPTNEOX:\n        case LLM_ARCH_CODESHELL:\n",
                    "        case LLM_ARCH_GPTNEOX:\n        case LLM_ARCH_OLMO2:\n        case LLM_ARCH_OLMOE:\n        case LLM_ARCH_CODESHELL:\n",
                ),
            ],
        ),
        # 11
        Commit(
            "ggml-cpu : comment the Q8_0 block layout in the AVX quantizer",
            SLAREN,
            [
                (
                    X86Q,
                    "        // Quantize these floats\n        const float d = maxScalar / 127.f;\n",
                    "        // Quantize these floats: 32 int8 values and one fp16 scale per block\n"
                    "        const float d = maxScalar / 127.f;\n",
                )
            ],
        ),
        # 12  (tagged b7024)
        Commit(
            "ggml-cpu : drop an unused broadcast comment in mul_mat",
            SLAREN,
            [(CPU, '    // TODO: extract to "extra_op"\n#if GGML_USE_LLAMAFILE\n', "#if GGML_USE_LLAMAFILE\n")],
        ),
        # 13
        Commit(
            "ggml-cpu : soft_max reads the mask row once per row",
            JG,
            [
                (
                    OPS,
                    "                ggml_vec_cpy_f32  (ne00, wp, sp);\n                ggml_vec_scale_f32(ne00, wp, scale);\n",
                    "                // wp = scale*sp (+ slope*mask below)\n"
                    "                ggml_vec_cpy_f32  (ne00, wp, sp);\n                ggml_vec_scale_f32(ne00, wp, scale);\n",
                )
            ],
        ),
        # 14
        Commit(
            "kv-cache : debug log when layers share a KV buffer",
            DB,
            [
                (
                    KV,
                    'LLAMA_LOG_DEBUG("%s: reusing layers:\\n", __func__);',
                    'LLAMA_LOG_DEBUG("%s: reusing layers (%d total):\\n", __func__, (int) hparams.n_layer());',
                )
            ],
        ),
        # 15
        Commit(
            "llama : log the rope type by name",
            XS,
            [
                (
                    MODEL,
                    'LLAMA_LOG_INFO("%s: rope type             = %d\\n",     __func__, hparams.rope_type);',
                    'LLAMA_LOG_INFO("%s: rope type             = %d (%s)\\n", __func__, hparams.rope_type,\n'
                    '                hparams.rope_type == LLAMA_ROPE_TYPE_NEOX ? "neox" :\n'
                    '                hparams.rope_type == LLAMA_ROPE_TYPE_NORM ? "norm" : "other");',
                )
            ],
        ),
        # 16
        Commit(
            "ggml-cpu : swiglu leftover loop comment",
            AM,
            [
                (
                    VEC,
                    "#elif defined(__riscv_v_intrinsic)\n    for (int vl; i < n; i += vl) {\n"
                    "        vl = __riscv_vsetvl_e32m2(n - i);\n        vfloat32m2_t vx = __riscv_vle32_v_f32m2(&x[i], vl);\n"
                    "        vfloat32m2_t vg = __riscv_vle32_v_f32m2(&g[i], vl);\n",
                    "#elif defined(__riscv_v_intrinsic)\n    // RVV handles the tail with vl, the scalar loop below is a no-op\n"
                    "    for (int vl; i < n; i += vl) {\n"
                    "        vl = __riscv_vsetvl_e32m2(n - i);\n        vfloat32m2_t vx = __riscv_vle32_v_f32m2(&x[i], vl);\n"
                    "        vfloat32m2_t vg = __riscv_vle32_v_f32m2(&g[i], vl);\n",
                )
            ],
        ),
        # 17
        Commit(
            "kv-cache : n_pad_cur is a local constant",
            GG,
            [
                (
                    KV,
                    "    const uint32_t n_pad_cur = std::max(n_pad, 256u);\n\n    for (uint32_t s = 0; s < sinfo.n_stream(); ++s) {\n",
                    "    const uint32_t n_pad_cur = std::max<uint32_t>(n_pad, 256);\n\n"
                    "    for (uint32_t s = 0; s < sinfo.n_stream(); ++s) {\n",
                )
            ],
        ),
        # 18
        Commit(
            "ggml-cpu : rope comment on the per-thread sin/cos cache",
            JG,
            [
                (
                    OPS,
                    "                float * cache = (float *) params->wdata + (ne0 + CACHE_LINE_SIZE_F32)*ith;\n"
                    "                if (last_i2 != i2) {\n                    if (!mrope_used) {\n",
                    "                // one sin/cos cache per thread, rebuilt when the position (i2) changes\n"
                    "                float * cache = (float *) params->wdata + (ne0 + CACHE_LINE_SIZE_F32)*ith;\n"
                    "                if (last_i2 != i2) {\n                    if (!mrope_used) {\n",
                )
            ],
        ),
        # 19
        Commit(
            "llama : context logs whether the KQ mask is causal",
            XS,
            [
                (
                    CTX,
                    'LLAMA_LOG_INFO("%s: causal_attn           = %d\\n",   __func__, cparams.causal_attn);',
                    'LLAMA_LOG_INFO("%s: causal_attn           = %d (%s)\\n", __func__, cparams.causal_attn,\n'
                    '            cparams.causal_attn ? "causal" : "non-causal");',
                )
            ],
        ),
        # 20  (tagged b7041)
        Commit(
            "ggml-cpu : Q8_0 quantizer multiplier named after its role",
            CC,
            [
                (
                    X86Q,
                    "        const float id = ( maxScalar != 0.0f ) ? 127.f / maxScalar : 0.0f;\n"
                    "        const __m256 mul = _mm256_set1_ps( id );\n",
                    "        const float id = ( maxScalar != 0.0f ) ? 127.f / maxScalar : 0.0f; // inverse scale\n"
                    "        const __m256 mul = _mm256_set1_ps( id );\n",
                )
            ],
        ),
        # 21
        Commit(
            "kv-cache : warn text for overridden kv_size",
            DB,
            [
                (
                    KV,
                    "kv_size = %u overridden to %u to match the shared source cache\\n",
                    "kv_size = %u overridden to %u to match the size of the shared source cache\\n",
                )
            ],
        ),
        # 22
        Commit(
            "ggml-cpu : soft_max sum normalisation comment",
            GG,
            [
                (
                    OPS,
                    "                sum = 1.0/sum;\n                ggml_vec_scale_f32(ne00, dp, sum);\n",
                    "                sum = 1.0/sum; // normalise\n                ggml_vec_scale_f32(ne00, dp, sum);\n",
                )
            ],
        ),
        # 23
        Commit(
            "llama : comment on the DFlash drafter rope choice",
            CISC,
            [
                (
                    MODEL,
                    "        case LLM_ARCH_DFLASH:\n            // drafts for M-RoPE targets",
                    "        case LLM_ARCH_DFLASH:\n            // the drafter must rotate like its target model\n            // drafts for M-RoPE targets",
                )
            ],
        ),
        # 24
        Commit(
            "kv-cache : drop a commented-out debug print",
            DB,
            [
                (
                    KV,
                    '    //    LLAMA_LOG_WARN("%s: seq %d: min = %d, max = %d\\n", __func__, s, '
                    "v_cells[s].seq_pos_min(s), v_cells[s].seq_pos_max(s));\n",
                    "",
                )
            ],
        ),
        # 25
        Commit(
            "ggml-cpu : soft_max ALiBi comment points at the reference",
            JG,
            [
                (
                    OPS,
                    "    // TODO: is this supposed to be ceil instead of floor?\n"
                    "    //       https://huggingface.co/mosaicml/mpt-7b/blob/main/attention.py#L370\n"
                    "    const uint32_t n_head      = ne02;\n"
                    "    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(n_head));\n\n"
                    "    const float m0 = powf(2.0f, -(max_bias       ) / n_head_log2);\n"
                    "    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);\n\n"
                    "    float * wp = (float *) params->wdata + (ne00 + CACHE_LINE_SIZE_F32) * ith;\n",
                    "    // TODO: is this supposed to be ceil instead of floor?\n"
                    "    //       https://huggingface.co/mosaicml/mpt-7b/blob/main/attention.py#L370\n"
                    "    //       (the ALiBi paper uses the closest power of two below n_head)\n"
                    "    const uint32_t n_head      = ne02;\n"
                    "    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(n_head));\n\n"
                    "    const float m0 = powf(2.0f, -(max_bias       ) / n_head_log2);\n"
                    "    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);\n\n"
                    "    float * wp = (float *) params->wdata + (ne00 + CACHE_LINE_SIZE_F32) * ith;\n",
                )
            ],
        ),
        # 26
        Commit(
            "ggml-cpu : cvar TODO names the tail",
            AM,
            [
                (
                    VEC,
                    "// TODO: optimize to process the remaining elements in groups using the smaller vector sizes "
                    "from AVX2 and SSE\n"
                    "// ref: https://github.com/ggml-org/llama.cpp/pull/15953#pullrequestreview-3310928344\n"
                    "#if defined(__AVX512F__) && defined(__AVX512DQ__)\n"
                    "    for (; i + 15 < n; i += 16) {\n"
                    "        __m512 val = _mm512_sub_ps(_mm512_loadu_ps(x + i),\n"
                    "                                   _mm512_set1_ps(mean));\n",
                    "// TODO: optimize to process the remaining elements in groups using the smaller vector sizes "
                    "from AVX2 and SSE\n"
                    "//       (today the n % 16 tail on AVX512 runs in the scalar loop)\n"
                    "// ref: https://github.com/ggml-org/llama.cpp/pull/15953#pullrequestreview-3310928344\n"
                    "#if defined(__AVX512F__) && defined(__AVX512DQ__)\n"
                    "    for (; i + 15 < n; i += 16) {\n"
                    "        __m512 val = _mm512_sub_ps(_mm512_loadu_ps(x + i),\n"
                    "                                   _mm512_set1_ps(mean));\n",
                )
            ],
        ),
        # 27
        Commit(
            "llama : name the NeoX rope group",
            CISC,
            [
                (
                    MODEL,
                    "        // the pairs of head values are offset by n_rot/2\n",
                    "        // NeoX style: the pairs of head values are offset by n_rot/2\n",
                )
            ],
        ),
        # 28
        Commit(
            "ggml-cpu : mul_mat comment on the row-major src0",
            SLAREN,
            [
                (
                    CPU,
                    "    // nb01 >= nb00 - src0 is not transposed\n    //   compute by src0 rows\n\n",
                    "    // nb01 >= nb00 - src0 is not transposed\n    //   compute by src0 rows (dst rows are src1 rows)\n\n",
                )
            ],
        ),
        # 29
        Commit(
            "llama : context constructor comment",
            XS,
            [
                (
                    CTX,
                    '    LLAMA_LOG_INFO("%s: constructing llama_context\\n", __func__);\n',
                    "    // cparams are resolved below: model defaults first, then the user's overrides\n"
                    '    LLAMA_LOG_INFO("%s: constructing llama_context\\n", __func__);\n',
                )
            ],
        ),
    ]


RELEASE_INDEX = {"b7010": 3, "b7024": 12, "b7041": 20}


def history(inserts: dict[int, list[Commit]], culprit: Commit | None, seed: int, upto: int | None = None) -> History:
    """The stream (its first `upto` commits, default all) with `inserts` woven in (tinyserve_stream.weave);
    `culprit` None for a bug at base."""
    return weave(stream()[:upto], RELEASE_INDEX, inserts, culprit, "2025-11-03", seed)
