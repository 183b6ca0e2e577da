"""The second part of a sixth held-out set of hard-track tinyserve cases, each modelled on an upstream silent
bug (issues 2821-2830).

    python -m benchmark.author ts-hard-rep-penalty-both-passes ...

Same shape as tinyserve_hard_heldout5 / 5b: the shared commit stream (benchmark/authoring/tinyserve_stream.py,
release tags v0.2.0 / v0.3.0 / v0.4.0) with the case's own commits inserted on both sides of the culprit,
and `good_ref` the v0.2.0 tag, 25+ commits back. Every case carries a behaviour change on another path
and a numerically equivalent change on the failing path. Issue prose lives in
benchmark/authoring/issues/<id>.md. Written blind: without running the diagnosis on them.

Fault location mix (fixed before the cases were written):

    A  in place: an existing function edited next to harmless edits of others          2821
    B  in a new helper the culprit creates (the caller now calls it)                   2822 2823
    C  in the caller of a helper the culprit moves faithfully to another file          2824
    D  a default value / config reader / a second file                                 2825 2826
    E  functions of one file changed together: one wrong, the others correct           2827 2828
    F  the culprit touches two files; the fault is in the one the issue does not hint  2829 2830

Categories: sampling (2821 2830, both seeded), quantization (2822, bfloat16), spec-decode (2823),
attention (2824, a batch of different lengths), model-config (2825, bfloat16), numerics (2826, float16),
kernel (2827), positional-encoding (2828), parallelism (2829).
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, greedy, prompt
from benchmark.authoring.tinyserve_hard_heldout5 import (
    draft_budget_4096,
    layernorm_fused_first,
    logprobs_cap,
    max_len_8192,
    max_num_seqs_256,
    ngram_min_two,
    sampled,
    stop_dedupe,
    temperature_index,
    text_prompt_bos,
)
from benchmark.authoring.tinyserve_hard_heldout5b import max_pos_default, qwen2_window_flag, unseeded_per_request
from benchmark.authoring.tinyserve_hard_upstream import case, target
from benchmark.authoring.tinyserve_stream import ATTN, CONFIG, README, ROPE, ROT, RUNNER, SAMPLER, Commit

QMM = "tinyserve/ops/quant_matmul.py"
MASKING = "tinyserve/ops/masking.py"
SPEC = "tinyserve/spec_decode/engine.py"
GEMMA = "tinyserve/models/gemma2.py"
TP_LOADER = "tinyserve/distributed/loader.py"
TP_LAYERS = "tinyserve/distributed/layers.py"

MARTA = "Marta Nowak <marta.nowak@tinyserve.dev>"
OSEI = "Kwame Osei <kwame.osei.dev@gmail.com>"
LENA = "Lena Vogel <lena.vogel@posteo.de>"
DIEGO = "Diego Álvarez <diego.alvarez@proton.me>"
YUKI = "Yuki Sato <yuki.sato@tinyserve.dev>"


# ============================================================================= 2821 sampling: the repetition penalty twice


def rep_penalty_both_passes() -> HardCase:
    bug = Commit(
        "sampler: penalise prompt and output tokens in two passes\n\nThe repetition penalty walks the prompt mask "
        "and the output counts as two\nmasks instead of forming their union first (the union was an extra [S, V]\n"
        "bool buffer per step); presence and frequency reuse the output mask. The\nprompt mask is filled with one "
        "index_fill_ per row.",
        MARTA,
        [
            (
                SAMPLER,
                "        seen = st.prompt_mask | (st.output_counts > 0)\n"
                "        rep = st.repetition_penalty.to(logits.dtype).unsqueeze(1)\n"
                "        # HF: positive logits are divided by the penalty, negative ones multiplied\n"
                "        penalized = torch.where(logits > 0, logits / rep, logits * rep)\n"
                "        logits = torch.where(seen, penalized, logits)\n"
                "        counts = st.output_counts.to(logits.dtype)\n"
                "        logits = logits - st.frequency_penalty.to(logits.dtype).unsqueeze(1) * counts\n"
                "        return logits - st.presence_penalty.to(logits.dtype).unsqueeze(1) * (counts > 0).to("
                "logits.dtype)\n",
                "        generated = st.output_counts > 0\n"
                "        rep = st.repetition_penalty.to(logits.dtype).unsqueeze(1)\n"
                "        # HF: positive logits are divided by the penalty, negative ones multiplied; the prompt's\n"
                "        # tokens and the output's as two masks, no [S, V] union buffer\n"
                "        for seen in (st.prompt_mask, generated):\n"
                "            penalized = torch.where(logits > 0, logits / rep, logits * rep)\n"
                "            logits = torch.where(seen, penalized, logits)\n"
                "        counts = st.output_counts.to(logits.dtype)\n"
                "        logits = logits - st.frequency_penalty.to(logits.dtype).unsqueeze(1) * counts\n"
                "        return logits - st.presence_penalty.to(logits.dtype).unsqueeze(1) * generated.to("
                "logits.dtype)\n",
            ),
            (
                SAMPLER,
                "            prompt_mask[i, torch.tensor(prompt, dtype=torch.long)] = True\n",
                "            prompt_mask[i].index_fill_(0, torch.tensor(prompt, dtype=torch.long), True)\n",
            ),
            (
                SAMPLER,
                "        tokens = logits.argmax(dim=-1)\n        for i in",
                "        tokens = logits.argmax(dim=-1)          # every row; random rows are overwritten below\n"
                "        for i in",
            ),
        ],
    )
    reqs = [
        sampled(48, 2821, 16, temperature=0.8, repetition_penalty=1.3, seed=11),
        sampled(30, 2921, 16, temperature=1.0, top_k=50, repetition_penalty=1.6, seed=2024),
        sampled(56, 3021, 16, temperature=0.0, repetition_penalty=1.4),
    ]
    return case(
        "ts-hard-rep-penalty-both-passes",
        2821,
        "sampling",
        ["sgl-project/sglang#3139", "huggingface/transformers#36642", "PaddlePaddle/FastDeploy#2954"],
        "repetition_penalty is much harsher than in transformers once the model repeats a word from the prompt",
        repro_toml({"arch": "llama", "seed": 2821}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "LogitsAdjuster.apply_penalties",
            "sampler",
            "the repetition penalty is applied once over the prompt mask and once more over the output mask, so a "
            "token that occurs in both the prompt and the output is penalised twice (divided or multiplied by "
            "penalty squared) instead of once over their union",
        ),
        [(11, logprobs_cap(DIEGO)), (17, bug), (24, temperature_index(LENA))],
        bug,
    )


# ============================================================================= 2822 quantization: int4 group sums strided


def int4_group_sums_strided() -> HardCase:
    bug = Commit(
        "ops/quant_matmul: per-group activation sums in one helper\n\nThe int4 zero-point correction needs the sum of "
        "each group's activations;\n_group_sums computes it once per call on the flat [T, I] input instead of on\n"
        "the grouped view. dequant_matmul adds the bias in place.",
        OSEI,
        [
            (
                QMM,
                "def _int4_matmul(",
                "def _group_sums(x: torch.Tensor, group_size: int) -> torch.Tensor:\n"
                "    # [T, I] -> [T, G]: the sum of each quantization group's activations\n"
                "    return x.unflatten(-1, (group_size, -1)).sum(-2)\n\n\n"
                "def _int4_matmul(",
            ),
            (
                QMM,
                "    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]\n",
                "    shift = zero.to(x.dtype)[None] * _group_sums(x, group_size)[:, None, :]   # [T, O, G]\n",
            ),
            (
                QMM,
                "    if bias is not None:\n        out = out + bias.to(xa.dtype)\n    return out.to(x.dtype)\n",
                "    if bias is not None:\n        out += bias.to(xa.dtype)\n    return out.to(x.dtype)\n",
            ),
        ],
    )
    unpack = Commit(
        "ops/quant_matmul: unpack int4 nibbles with a reshape",
        YUKI,
        [
            (
                QMM,
                "    return torch.stack([qweight & 0x0F, qweight >> 4], dim=-1).flatten(-2)\n",
                "    return torch.stack((qweight & 0x0F, qweight >> 4), dim=-1).reshape(*qweight.shape[:-1], -1)\n",
            )
        ],
    )
    tgt = target("bfloat16", quantization="int4", quant_group_size=16)
    return case(
        "ts-hard-int4-group-sums-strided",
        2822,
        "quantization",
        ["intel/torch-xpu-ops#5001", "pytorch/executorch#2374", "amd/Quark#20"],
        "int4 in bfloat16 produces nonsense since the update; int8 on the same model is fine",
        repro_toml({"arch": "llama", "seed": 2822}, tgt, [greedy(20, 2822, 8), greedy(9, 2922, 8)], good_ref="v0.2.0"),
        (
            QMM,
            "_group_sums",
            "quant_matmul",
            "the per-group activation sums for the int4 zero-point correction split the input as (group_size, G) "
            "instead of (G, group_size), so each 'group' sums a strided set of columns and every output row is "
            "offset by zero * (wrong sum - right sum) * scale",
        ),
        [(13, max_num_seqs_256(MARTA)), (21, bug), (30, unpack)],
        bug,
    )


# ============================================================================= 2823 spec-decode: accepted drafts counted, not walked

ACCEPTED_COUNT = '''

def accepted_count(row_tokens: list[int], drafts: list[int]) -> int:
    """One sequence's verification: the tokens its rows emitted [k + 1] and the drafts they verified [k]
    -> how many drafts were accepted (0..k); the row after the last accepted one emits the next token."""
    return sum(int(token == draft) for token, draft in zip(row_tokens, drafts))


def free_tail_blocks(block_manager, seq: Sequence, num_tokens: int) -> None:
'''


def spec_accepted_count() -> HardCase:
    bug = Commit(
        "spec_decode: the acceptance count in one helper\n\nHow many drafts a sequence keeps is now accepted_count, "
        "a plain function of\nthe rows' tokens and the drafts (unit-testable without an engine); accepted()\n"
        "slices the rows with it.",
        DIEGO,
        [
            (
                SPEC,
                "\n\ndef free_tail_blocks(block_manager, seq: Sequence, num_tokens: int) -> None:\n",
                ACCEPTED_COUNT,
            ),
            (
                SPEC,
                "            keep = next((n for n, r in enumerate(rs) if row_draft[r] < 0 or int(emitted[r]) != "
                "row_draft[r]), len(rs) - 1)\n",
                "            keep = accepted_count([int(emitted[r]) for r in rs], [row_draft[r] for r in rs if "
                "row_draft[r] >= 0])\n",
            ),
            (
                SPEC,
                "            accepted = len(emitted.get(id(seq), [None])) - 1\n",
                "            accepted = len(emitted.get(id(seq), [None])) - 1     # accepted() kept accepted_count rows\n",
            ),
        ],
    )
    rows = Commit(
        "spec_decode: verification row index written from the next sequence's start",
        LENA,
        [
            (
                SPEC,
                "            rows.append(starts[i + 1] - 1 - len(d) + r)\n",
                "            rows.append(starts[i + 1] - (len(d) + 1) + r)\n",
            )
        ],
    )
    reqs = []
    for j, (motif_len, reps) in enumerate([(4, 6), (6, 4), (3, 8)]):
        motif = prompt(motif_len, 2823 + j)
        reqs.append(
            {
                "prompt_ids": motif * reps + prompt(5, 2923 + j),
                "max_tokens": 40,
                "sampling": {"temperature": 0.0, "ignore_eos": True},
            }
        )
    tgt = target(speculative="ngram", num_speculative_tokens=4)
    return case(
        "ts-hard-spec-accepted-count",
        2823,
        "spec-decode",
        ["vllm-project/vllm#2658", "vllm-project/vllm#2336", "tenstorrent/vllm-tt-plugin#128"],
        "n-gram speculative decoding changes greedy output on repetitive prompts; without speculation it matches",
        repro_toml({"arch": "llama", "seed": 2823}, tgt, reqs, good_ref="v0.2.0"),
        (
            SPEC,
            "accepted_count",
            "spec_decode",
            "the acceptance count adds up every row whose token equals its draft instead of stopping at the first "
            "mismatch, so after a rejected draft a later draft that happens to match is still counted and the "
            "sequence emits tokens that were verified against a context holding the rejected draft",
        ),
        [(12, stop_dedupe(OSEI)), (25, bug), (31, rows)],
        bug,
    )


# ============================================================================= 2824 attention: the decode row one position late

MASKING_MODULE = '''"""Score masks and soft-capping shared by the paged-attention kernels and their native twins."""
from __future__ import annotations

import torch


def softcap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    return scores if not cap else torch.tanh(scores / cap) * cap


def visible(q_pos: torch.Tensor, kv_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    # [..., Q, 1] vs [..., 1, K] -> bool mask of keys each query may attend to
    mask = kv_pos <= q_pos
    if sliding_window is not None:
        mask &= kv_pos > q_pos - sliding_window
    return mask
'''


def decode_query_position() -> HardCase:
    bug = Commit(
        "ops: masking helpers in their own module\n\n_softcap and _visible move to ops/masking.py unchanged, where "
        "the sliding-\nwindow work will extend them; the attention kernels import them from there.\nThe decode "
        "partition takes its query position straight from seq_lens.",
        YUKI,
        [
            (MASKING, None, MASKING_MODULE),
            (
                ATTN,
                "import torch\n\nKV_TILE_TOKENS",
                "import torch\n\nfrom tinyserve.ops.masking import softcap as _softcap\n"
                "from tinyserve.ops.masking import visible as _visible\n\nKV_TILE_TOKENS",
            ),
            (
                ATTN,
                "def _softcap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:\n"
                "    return scores if not softcap else torch.tanh(scores / softcap) * softcap\n\n\n"
                "def _visible(q_pos: torch.Tensor, kv_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:\n"
                "    # [..., Q, 1] vs [..., 1, K] -> bool mask of keys each query may attend to\n"
                "    mask = kv_pos <= q_pos\n"
                "    if sliding_window is not None:\n"
                "        mask &= kv_pos > q_pos - sliding_window\n"
                "    return mask\n\n\n",
                "",
            ),
            (
                ATTN,
                "    q_pos = (seq_lens - 1).view(-1, 1)\n",
                "    q_pos = seq_lens.view(-1, 1)                     # the decoded token (seq_lens counts it)\n",
            ),
        ],
    )
    group = Commit(
        "ops/attention: group decode queries with unflatten",
        MARTA,
        [
            (
                ATTN,
                "    qg = q.to(_acc(q.dtype)).view(B, kvh, H // kvh, D)\n",
                "    qg = q.to(_acc(q.dtype)).unflatten(1, (kvh, H // kvh))\n",
            )
        ],
    )
    reqs = [greedy(40, 2824, 10), greedy(13, 2924, 10), greedy(27, 3024, 10)]
    return case(
        "ts-hard-decode-query-position",
        2824,
        "attention",
        ["microsoft/onnxruntime-genai#2354", "vllm-project/vllm#47305", "alibaba/MNN#3403"],
        "Only the first generated token matches transformers; every later one drifts, whatever the prompt length",
        repro_toml({"arch": "llama", "seed": 2824}, target(), reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "_decode_partition",
            "attention",
            "the decode partition places each decoding token at position seq_len instead of seq_len - 1 (seq_lens "
            "already counts the new token), so the causal mask also admits the cache slot one past the sequence: "
            "an unwritten or stale key and value take part in every decode step's softmax",
        ),
        [(14, qwen2_window_flag(LENA)), (23, bug), (31, group)],
        bug,
    )


# ============================================================================= 2825 model-config: Gemma 2's window under another name


def gemma_window_size_key() -> HardCase:
    bug = Commit(
        "config: read Gemma 2's window under its export name\n\nCheckpoints converted with the original Gemma "
        "tooling carry\nsliding_window_size rather than sliding_window; every released Gemma 2 slides\nover 4096 "
        "tokens, which is what a config without the key gets.",
        OSEI,
        [
            (
                CONFIG,
                '    n, window = hf["num_hidden_layers"], hf.get("sliding_window")\n',
                '    n = hf["num_hidden_layers"]\n'
                '    if hf.get("model_type") == "gemma2":\n'
                '        window = hf.get("sliding_window_size", 4096)   # the name Gemma 2 exports use\n'
                "    else:\n"
                '        window = hf.get("sliding_window")\n',
            ),
            (
                GEMMA,
                "query_pre_attn_scalar, sliding window on alternate layers, gelu-tanh, tied head.",
                "query_pre_attn_scalar, sliding window (sliding_window_size) on alternate layers, gelu-tanh, tied head.",
            ),
        ],
    )
    scale = Commit(
        "gemma2: the embedding normaliser with math.sqrt",
        DIEGO,
        [
            (GEMMA, "from torch import nn\n", "import math\n\nfrom torch import nn\n"),
            (
                GEMMA,
                "embed_scale=cfg.hidden_size ** 0.5)\n",
                "embed_scale=math.sqrt(cfg.hidden_size))\n",
            ),
        ],
    )
    return case(
        "ts-hard-gemma-window-size-key",
        2825,
        "model-config",
        ["vllm-project/vllm#6220", "sgl-project/sglang#4823", "huggingface/transformers#35691"],
        "Gemma 2 (bfloat16) drifts from transformers on longer prompts after upgrading; short prompts still match",
        repro_toml(
            {"arch": "gemma2", "seed": 2825},
            target("bfloat16"),
            [greedy(72, 2825, 8), greedy(20, 2925, 8)],
            good_ref="v0.2.0",
        ),
        (
            CONFIG,
            "sliding_windows",
            "config",
            "the config reader takes Gemma 2's window from sliding_window_size with a 4096 default and ignores "
            "sliding_window, so a checkpoint whose config.json says sliding_window = 32 slides over 4096 tokens: "
            "its local layers attend to the whole prompt",
        ),
        [(12, max_pos_default(YUKI)), (18, bug), (28, scale)],
        bug,
    )


# ============================================================================= 2826 numerics: float16 runs as bfloat16


def half_as_bfloat16() -> HardCase:
    bug = Commit(
        "config: half precision runs as bfloat16 on CPU\n\ntinyserve's kernels run on the CPU, where float16 "
        "matmuls are emulated and\nseveral times slower than bfloat16, which takes the same memory. The model\n"
        "and its KV cache now use bfloat16 when float16 is asked for.",
        LENA,
        [
            (
                CONFIG,
                "    def torch_dtype(self) -> torch.dtype:\n        return DTYPES[self.dtype]\n",
                "    def torch_dtype(self) -> torch.dtype:\n"
                "        dtype = DTYPES[self.dtype]\n"
                "        # CPU float16 GEMMs are emulated; bfloat16 has the same footprint and native kernels\n"
                "        return torch.bfloat16 if dtype is torch.float16 else dtype\n",
            ),
            (
                README,
                "logprobs within 1e-4 in float32 (`python benchmark/subjects/check_tinyserve.py`).\n",
                "logprobs within 1e-4 in float32 (`python benchmark/subjects/check_tinyserve.py`).\n"
                '`dtype="float16"` runs in bfloat16: same footprint, native CPU kernels.\n',
            ),
        ],
    )
    model = {"arch": "llama", "seed": 2826, "perturb_init": True}
    return case(
        "ts-hard-half-as-bfloat16",
        2826,
        "numerics",
        ["vllm-project/vllm#12794", "dotnet/TorchSharp#160", "libxsmm/AI-bench#44"],
        "float16 outputs are much further from transformers' float16 than they used to be",
        repro_toml(model, target("float16"), [greedy(24, 2826, 12), greedy(10, 2926, 12)], good_ref="v0.2.0"),
        (
            CONFIG,
            "Config.torch_dtype",
            "config",
            "the engine's dtype property maps float16 to bfloat16, so a float16 run (model weights, activations and "
            "KV cache) computes with 8 mantissa bits instead of 11 and drifts far beyond float16 rounding",
        ),
        [(15, max_len_8192(MARTA)), (27, bug), (31, layernorm_fused_first(OSEI))],
        bug,
    )


# ============================================================================= 2827 kernel: split-KV merge over the wrong axis


def merge_softmax_axis() -> HardCase:
    bug = Commit(
        "ops/attention: split-KV merge as a softmax over the partitions\n\nThe partition weights are a softmax of "
        "their log-sum-exps and the merge one\neinsum; the decode kernel stacks the partitions' outputs and lses in "
        "one\npass and names the lse it returns.",
        MARTA,
        [
            (
                ATTN,
                "    return out, (m_safe + torch.log(l)).squeeze(-1)\n",
                "    lse = (m_safe + torch.log(l)).squeeze(-1)                                         # [B, KVH, G]\n"
                "    return out, lse\n",
            ),
            (
                ATTN,
                "    lse = torch.logsumexp(lses, dim=0)\n"
                "    weights = torch.exp(lses - lse).nan_to_num(0.0)\n"
                "    return (weights.unsqueeze(-1) * outs).sum(0)\n",
                "    weights = torch.softmax(lses, dim=-1).nan_to_num(0.0)     # each partition's share of the mass\n"
                '    return torch.einsum("p...,p...d->...d", weights, outs)\n',
            ),
            (
                ATTN,
                "    out = merge_attn_partitions(torch.stack([o for o, _ in parts]), torch.stack([s for _, s in "
                "parts]))\n",
                "    outs, lses = (torch.stack(t) for t in zip(*parts))\n    out = merge_attn_partitions(outs, lses)\n",
            ),
        ],
    )
    tables = Commit(
        "ops/attention: decode tables with new_zeros",
        YUKI,
        [
            (
                ATTN,
                "    tables = torch.zeros(B, cols, dtype=block_tables.dtype)   # pad: padded slots are masked anyway\n",
                "    tables = block_tables.new_zeros(B, cols)   # pad: padded slots are masked anyway\n",
            )
        ],
    )
    return case(
        "ts-hard-merge-softmax-axis",
        2827,
        "kernel",
        ["vllm-project/flash-attention#87", "vllm-project/vllm-xpu-kernels#556", "ROCm/rocm-libraries#12229"],
        "GQA checkpoint: the first generated token matches transformers, every later token is off",
        repro_toml(
            {"arch": "llama", "seed": 2827}, target(), [greedy(30, 2827, 10), greedy(90, 2927, 10)], good_ref="v0.2.0"
        ),
        (
            ATTN,
            "merge_attn_partitions",
            "attention",
            "the split-KV merge takes the softmax of the partitions' log-sum-exps over the last axis (the query "
            "heads of a KV group) instead of over the partitions, so every decode output is a mix of its partitions "
            "weighted by how the heads of its group compare, not by each partition's share of the softmax mass",
        ),
        [(14, ngram_min_two(LENA)), (24, bug), (30, tables)],
        bug,
    )


# ============================================================================= 2828 positional-encoding: halves taken across heads


def rotary_halves_across_heads() -> HardCase:
    bug = Commit(
        "ops/rotary: rotate without the per-head view\n\n_rotate splits the halves with one unflatten and stacks "
        "the rotated halves\nback; the optimized kernel indexes the cos/sin cache directly and the native\ntwin "
        "doubles cos/sin with repeat.",
        DIEGO,
        [
            (
                ROT,
                "    t = x.shape[0]\n"
                "    x = x.view(t, -1, head_dim)\n"
                "    half = head_dim // 2\n"
                "    x1, x2 = x[..., :half], x[..., half:]\n"
                "    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)\n"
                "    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(t, -1)\n",
                "    x1, x2 = x.unflatten(-1, (2, -1, head_dim // 2)).unbind(1)      # [T, N, D/2] each\n"
                "    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)\n"
                "    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=1).flatten(1)\n",
            ),
            (
                ROT,
                "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)\n",
                "    cos, sin = cos_sin_cache[positions].to(query.dtype).chunk(2, dim=-1)\n",
            ),
            (
                ROT,
                "    cos = torch.cat((cos, cos), dim=-1).to(query.dtype).unsqueeze(1)   # [T, 1, D]\n"
                "    sin = torch.cat((sin, sin), dim=-1).to(query.dtype).unsqueeze(1)\n",
                "    cos = cos.repeat(1, 2).to(query.dtype).unsqueeze(1)   # [T, 1, D]\n"
                "    sin = sin.repeat(1, 2).to(query.dtype).unsqueeze(1)\n",
            ),
        ],
    )
    cache = Commit(
        "rotary: sequence length of a forward from the last position",
        MARTA,
        [
            (
                ROPE,
                "        seq_len = int(positions.max()) + 1 if positions.numel() else 0\n",
                "        seq_len = int(positions.max().item()) + 1 if len(positions) else 0\n",
            )
        ],
    )
    return case(
        "ts-hard-rotary-halves-across-heads",
        2828,
        "positional-encoding",
        ["facebookresearch/xformers#841", "EleutherAI/gpt-neox#834", "facebookresearch/xformers#572"],
        "Every llama-family checkpoint diverges from transformers after upgrading, already inside the prompt",
        repro_toml(
            {"arch": "qwen2", "seed": 2828, "perturb_init": True},
            target(),
            [greedy(16, 2828, 8), greedy(33, 2928, 8)],
            good_ref="v0.2.0",
        ),
        (
            ROT,
            "_rotate",
            "rotary",
            "the rotary kernel unflattens the packed [T, N*D] rows as (2, N, D/2) instead of (N, 2, D/2), so the "
            "pairs it rotates are taken across heads (the first half of all heads against the second half) rather "
            "than within each head",
        ),
        [(16, cache), (28, bug), (31, text_prompt_bos(YUKI))],
        bug,
    )


# ============================================================================= 2829 parallelism: Gemma's normaliser from a shard's width


def gemma_normaliser_shard_width() -> HardCase:
    bug = Commit(
        "gemma2: take the embedding normaliser from the attention width\n\nSome Gemma 2 conversions pad hidden_size "
        "for their accelerator layout; the\nnormaliser of the reference code is sqrt of the model width the "
        "attention\nprojects to (heads * head_dim), which padding does not touch. shard_config\ndocuments which "
        "fields a rank divides.",
        YUKI,
        [
            (
                GEMMA,
                "        return self.model_cls(cfg, kernels, max_model_len, embed_scale=cfg.hidden_size ** 0.5)\n",
                "        width = cfg.num_attention_heads * cfg.head_dim     # the model width, padding excluded\n"
                "        return self.model_cls(cfg, kernels, max_model_len, embed_scale=width ** 0.5)\n",
            ),
            (
                TP_LOADER,
                "def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:\n",
                "def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:\n"
                '    """One rank\'s view of the model: query / KV heads and the MLP width divided by tp."""\n',
            ),
        ],
    )
    local_ids = Commit(
        "distributed: local vocabulary ids with masked_fill",
        OSEI,
        [
            (
                TP_LAYERS,
                "        local = torch.where(outside, torch.zeros_like(input_ids), input_ids - self.vocab_start)\n",
                "        local = (input_ids - self.vocab_start).masked_fill(outside, 0)\n",
            )
        ],
    )
    return case(
        "ts-hard-gemma-normaliser-shard-width",
        2829,
        "parallelism",
        ["huggingface/transformers#29402", "TensorAuto/OpenTau#179", "Blaizzy/mlx-vlm#893"],
        "tensor_parallel_size=2 on a Gemma 2 checkpoint gives different tokens than a single process",
        repro_toml(
            {"arch": "gemma2", "seed": 2829},
            target(tensor_parallel_size=2),
            [greedy(12, 2829, 6), greedy(7, 2929, 6)],
            good_ref="v0.2.0",
        ),
        (
            GEMMA,
            "Gemma2ForCausalLM.build_model",
            "gemma2",
            "the embedding normaliser is computed as sqrt(num_attention_heads * head_dim) from the config the "
            "model is built with; under tensor parallelism that config holds one rank's heads, so every rank scales "
            "the embeddings by sqrt(hidden / tp) instead of sqrt(hidden)",
        ),
        [(11, draft_budget_4096(DIEGO)), (20, bug), (32, local_ids)],
        bug,
    )


# ============================================================================= 2830 sampling: the temperature skipped for the batch


def temperature_skip_batch() -> HardCase:
    bug = Commit(
        "sampler: skip the temperature pass when it is a no-op\n\nDividing every row by 1.0 is a wasted pass over "
        "[S, V]; the adjuster skips it\nwhen no row needs it, like the filters already do. prepare_sampling builds "
        "the\nper-sequence lists in one loop.",
        OSEI,
        [
            (
                SAMPLER,
                "        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))\n"
                "        return self.apply_temperature(self.apply_penalties(logits, st), st)\n",
                "        logits = self.apply_penalties(logits.to(torch.promote_types(logits.dtype, torch.float32)), st)\n"
                "        # greedy rows hold temperature 1: a batch at 1.0 throughout needs no division\n"
                "        if float(st.temperature.max()) == 1.0:\n"
                "            return logits\n"
                "        return self.apply_temperature(logits, st)\n",
            ),
            (
                RUNNER,
                "        return SamplingTensors.build([s.params for s in seqs], [s.prompt_token_ids for s in seqs],\n"
                "                                     [s.output_token_ids for s in seqs], [s.generator for s in seqs],\n"
                "                                     self.config.model_config.vocab_size)\n",
                "        params, prompts, outputs, generators = [], [], [], []\n"
                "        for s in seqs:\n"
                "            params.append(s.params)\n"
                "            prompts.append(s.prompt_token_ids)\n"
                "            outputs.append(s.output_token_ids)\n"
                "            generators.append(s.generator)\n"
                "        return SamplingTensors.build(params, prompts, outputs, generators, "
                "self.config.model_config.vocab_size)\n",
            ),
        ],
    )
    reqs = [
        greedy(25, 2830, 12),
        sampled(11, 2930, 12, temperature=0.6, seed=42),
        sampled(18, 3030, 12, temperature=0.8, top_p=0.9, seed=7),
    ]
    return case(
        "ts-hard-temperature-skip-batch",
        2830,
        "sampling",
        ["vllm-project/vllm#14301", "FlashML-org/FreeToken#471", "vllm-project/vllm-ascend#5423"],
        "Seeded sampled requests come out differently when a greedy request runs alongside them",
        repro_toml({"arch": "llama", "seed": 2830}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "LogitsAdjuster.forward",
            "sampler",
            "the temperature pass is skipped whenever the largest temperature in the batch is 1.0; greedy rows "
            "hold 1.0, so a batch mixing a greedy request with sampled ones at T < 1 samples them untempered",
        ),
        [(14, temperature_index(MARTA)), (26, bug), (31, unseeded_per_request(DIEGO))],
        bug,
    )


CASES = [
    rep_penalty_both_passes(),
    int4_group_sums_strided(),
    spec_accepted_count(),
    decode_query_position(),
    gemma_window_size_key(),
    half_as_bfloat16(),
    merge_softmax_axis(),
    rotary_halves_across_heads(),
    gemma_normaliser_shard_width(),
    temperature_skip_batch(),
]
