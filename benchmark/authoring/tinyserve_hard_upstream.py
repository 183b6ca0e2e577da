"""Hard-track cases on tinyserve modelled one by one on upstream silent bugs (issue 12, issues 2026-2033).

    python -m benchmark.author ts-hard-fp16-norm-overflow ...

Each case is the shared commit stream (benchmark/authoring/tinyserve_stream.py, release tags
v0.2.0 / v0.3.0 / v0.4.0) with the case's own commits inserted: a culprit that touches three or
more functions or two files, a numerically equivalent refactor on the failing path, and a change
of behaviour on another path (a new default, an option, another architecture's config). `good_ref`
is the v0.2.0 tag, 25+ commits back. Issue prose lives in benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, greedy, prompt, stream_case
from benchmark.authoring.tinyserve_stream import ATTN, CONFIG, NORM, PARAMS, README, RUNNER, SAMPLER, Commit

LAYERNORM = "tinyserve/layers/layernorm.py"
ATTN_LAYER = "tinyserve/layers/attention.py"
FWD_CTX = "tinyserve/forward_context.py"
QMM = "tinyserve/ops/quant_matmul.py"
BM = "tinyserve/engine/block_manager.py"
SCHED = "tinyserve/engine/scheduler.py"
SEQ = "tinyserve/engine/sequence.py"

TOMAS = "Tomás Ibarra <tomas.ibarra@tinyserve.dev>"
WEN = "Wen Li <wen.li.infer@gmail.com>"
PRIYA = "Priya Raman <priya.raman@posteo.de>"
JONAS = "Jonas Weber <jonas.weber@proton.me>"
AMARA = "Amara Obi <amara.obi@tinyserve.dev>"


def case(
    id: str,
    number: int,
    category: str,
    modeled_on: list[str],
    title: str,
    repro: str,
    truth: tuple[str, str, str, str],
    placed: list[tuple[int, Commit]],
    culprit: Commit,
) -> HardCase:
    """A hard case: `placed` commits (the culprit among them) go right after the given stream commit."""
    inserts: dict[int, list[Commit]] = {}
    for at, commit in placed:
        inserts.setdefault(at, []).append(commit)
    return stream_case(id, number, category, modeled_on, title, repro, truth, inserts, culprit)


def target(dtype: str = "float32", **options) -> dict:
    return {"engine": "tinyserve", "dtype": dtype} | ({"options": options} if options else {})


# ============================================================================= 2026 numerics: fp16 norm overflow

NORM_TEST = """from __future__ import annotations

import torch

from tinyserve.ops.norm import rms_norm, rms_norm_native


def test_rms_norm_matches_native_twin():
    x, w = torch.randn(5, 64), torch.rand(64)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_native(x, w, 1e-6))
"""


def fp16_norm_overflow() -> HardCase:
    eps_default = Commit(
        "config: rms_norm_eps defaults to 1e-5 when config.json has none\n\nThe value transformers' "
        "LlamaConfig uses; 1e-6 was Gemma's.",
        PRIYA,
        [(CONFIG, 'rms_norm_eps=hf.get("rms_norm_eps", 1e-6),', 'rms_norm_eps=hf.get("rms_norm_eps", 1e-5),')],
    )
    norm_args = Commit(
        "layernorm: pass the norm's parameters once",
        WEN,
        [
            (
                LAYERNORM,
                "        if residual is None:\n"
                "            return self._rms_norm(x, self.weight, self.eps, self.weight_offset)\n"
                "        return self._fused_add_rms_norm(x, residual, self.weight, self.eps, self.weight_offset)\n",
                "        args = (self.weight, self.eps, self.weight_offset)\n"
                "        if residual is None:\n"
                "            return self._rms_norm(x, *args)\n"
                "        return self._fused_add_rms_norm(x, residual, *args)\n",
            )
        ],
    )
    bug = Commit(
        "ops/norm: rms from one vector_norm reduction\n\nvector_norm accumulates in fp32 internally, so rms_norm no "
        "longer makes an\nfp32 copy of its input just to square it; the normalised rows are still\n"
        "formed in fp32. Same values in fp32 (test added).",
        TOMAS,
        [
            (
                NORM,
                "def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) "
                "-> torch.Tensor:\n"
                "    # [T, H] -> [T, H]\n"
                "    xf = x.to(_acc(x.dtype))\n"
                "    variance = xf.pow(2).mean(dim=-1, keepdim=True)\n"
                "    inv_rms = torch.rsqrt(variance + eps)\n"
                "    return _scale_by_weight(xf * inv_rms, weight, weight_offset, x.dtype)\n",
                "def _inv_rms(x: torch.Tensor, eps: float) -> torch.Tensor:\n"
                "    # [T, H] -> [T, 1] in x's dtype: 1 / sqrt(mean(x^2) + eps), the sum of squares taken by\n"
                "    # vector_norm (fp32 accumulation inside the reduction, no fp32 copy of x)\n"
                "    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)\n"
                "    return torch.rsqrt(norm.square() / x.shape[-1] + eps)\n\n\n"
                "def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) "
                "-> torch.Tensor:\n"
                "    # [T, H] -> [T, H]\n"
                "    inv_rms = _inv_rms(x, eps)\n"
                "    return _scale_by_weight(x.to(_acc(x.dtype)) * inv_rms, weight, weight_offset, x.dtype)\n",
            ),
            ("tests/test_norm.py", None, NORM_TEST),
        ],
    )
    model = {"arch": "llama", "seed": 26, "initializer_range": 0.5}
    reqs = [greedy(14, 2026, 8), greedy(9, 2126, 8)]
    return case(
        "ts-hard-fp16-norm-overflow",
        2026,
        "numerics",
        ["microsoft/onnxruntime#29034", "xlite-dev/LeetCUDA#335", "nntrainer/nntrainer#3935"],
        "float16 output collapses to one repeated token on a checkpoint with large activations",
        repro_toml(model, target("float16"), reqs, good_ref="v0.2.0"),
        (
            NORM,
            "_inv_rms",
            "rms_norm",
            "the sum of squares comes back from vector_norm as a norm in the input dtype and is squared there: in "
            "float16 any row whose RMS exceeds ~32 overflows to inf, so the row is normalised to zeros",
        ),
        [(10, eps_default), (14, bug), (23, norm_args)],
        bug,
    )


# ============================================================================= 2027 numerics: softcap max offset


def fp16_softcap_offset() -> HardCase:
    scalar_default = Commit(
        "config: gemma2 query_pre_attn_scalar falls back to head_dim\n\nSome converted Gemma 2 configs omit it; "
        "transformers' default is the head size.",
        PRIYA,
        [
            (
                CONFIG,
                'query_pre_attn_scalar=hf.get("query_pre_attn_scalar") if gemma else None,',
                'query_pre_attn_scalar=(hf.get("query_pre_attn_scalar") or hf.get("head_dim") or '
                'hf["hidden_size"] // heads) if gemma else None,',
            )
        ],
    )
    merge_softmax = Commit(
        "ops/attention: merge decode partitions with one softmax over their lse\n\nexp(lse_p - logsumexp(lse)) is a "
        "softmax over the partition axis; say so.",
        WEN,
        [
            (
                ATTN,
                "    lse = torch.logsumexp(lses, dim=0)\n    weights = torch.exp(lses - lse).nan_to_num(0.0)\n",
                "    weights = torch.softmax(lses, dim=0).nan_to_num(0.0)   # exp(lse_p - logsumexp(lse))\n",
            )
        ],
    )
    bug = Commit(
        "decode: offset soft-capped scores by the cap, P·V in the cache dtype\n\nSoft-capped scores never exceed the "
        "cap, so exp(s - cap) <= 1 without the\nper-partition amax pass; the log-sum-exp stays exact. V is no longer "
        "copied\nto fp32 per partition: P·V runs in the cache dtype, the sums stay fp32.",
        JONAS,
        [
            (
                ATTN,
                "    v = value_cache[blocks].flatten(1, 2).to(q.dtype)\n",
                "    v = value_cache[blocks].flatten(1, 2)                                             # cache dtype\n",
            ),
            (
                ATTN,
                '    s = s.masked_fill(~visible[:, None, None, :], float("-inf"))\n'
                "    m = s.amax(-1, keepdim=True)\n"
                "    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n"
                "    p = torch.exp(s - m_safe)\n"
                "    l = p.sum(-1, keepdim=True)\n"
                '    out = torch.einsum("bkgp,bpkd->bkgd", p, v) / l.clamp_min(torch.finfo(l.dtype).tiny)\n',
                '    s = s.masked_fill(~visible[:, None, None, :], float("-inf"))\n'
                "    m_safe = _score_offset(s, softcap)\n"
                "    p = torch.exp(s - m_safe)\n"
                "    l = p.sum(-1, keepdim=True)\n"
                '    pv = torch.einsum("bkgp,bpkd->bkgd", p.to(v.dtype), v).to(q.dtype)\n'
                "    out = pv / l.clamp_min(torch.finfo(l.dtype).tiny)\n",
            ),
            (
                ATTN,
                "def merge_attn_partitions(",
                "def _score_offset(s: torch.Tensor, softcap: float | None) -> torch.Tensor:\n"
                '    """What exp() is offset by: the cap when scores are soft-capped (they never exceed it, so no\n'
                '    amax pass is needed), else each row\'s max (0 for a fully masked row). [..., P] -> [..., 1]"""\n'
                "    if softcap:\n"
                "        return torch.full_like(s[..., :1], softcap)\n"
                "    m = s.amax(-1, keepdim=True)\n"
                "    return torch.where(torch.isinf(m), torch.zeros_like(m), m)\n\n\n"
                "def merge_attn_partitions(",
            ),
            (
                ATTN_LAYER,
                "        self.scale, self.sliding_window, self.softcap = scale, sliding_window, softcap\n",
                "        self.scale, self.sliding_window = scale, sliding_window\n"
                "        self.softcap = float(softcap) if softcap else None   # the decode kernel offsets scores by it\n",
            ),
        ],
    )
    model = {"arch": "gemma2", "seed": 27}
    reqs = [greedy(12, 2027, 8), greedy(20, 2127, 8)]
    return case(
        "ts-hard-fp16-softcap-offset",
        2027,
        "numerics",
        ["Dao-AILab/flash-attention#2694", "ikawrakow/ik_llama.cpp#1196", "Dao-AILab/flash-attention#2717"],
        "Gemma 2 in float16: the first token is right, everything after it is garbage",
        repro_toml(model, target("float16"), reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "_decode_partition",
            "paged_attention",
            "with soft-capping the decode partition offsets exp() by the cap instead of the row max, so p = "
            "exp(s - cap) is ~1e-20; cast to float16 for the P·V product it underflows to zero and the attention "
            "output vanishes (bfloat16 and float32 keep the range)",
        ),
        [(20, merge_softmax), (23, bug), (27, scalar_default)],
        bug,
    )


# ============================================================================= 2028 attention: GQA group fold

PREFILL_BODY = (
    "    L, H, D = q.shape\n"
    "    kvh = key_cache.shape[2]\n"
    "    qg = (q.to(_acc(q.dtype)) * scale).view(L, kvh, H // kvh, D).permute(1, 2, 0, 3)   # [KVH, G, L, D]\n"
    "    q_pos = torch.arange(seq_len - L, seq_len).view(L, 1)\n"
    '    m = torch.full((kvh, H // kvh, L, 1), float("-inf"), dtype=qg.dtype)\n'
    "    l = torch.zeros_like(m)\n"
    "    acc = torch.zeros_like(qg)\n"
)
PREFILL_FOLDED = (
    "    L, H, D = q.shape\n"
    "    kvh = key_cache.shape[2]\n"
    "    group = H // kvh\n"
    "    qg = _fold_group(q.to(_acc(q.dtype)) * scale, kvh)                                  # [KVH, L*G, D]\n"
    "    q_pos = (seq_len - L + _folded_token(L, group)).view(-1, 1)                          # [L*G, 1]\n"
    '    m = torch.full((kvh, L * group, 1), float("-inf"), dtype=qg.dtype)\n'
    "    l = torch.zeros_like(m)\n"
    "    acc = torch.zeros_like(qg)\n"
)
FOLD_HELPERS = (
    "def _fold_group(q: torch.Tensor, kvh: int) -> torch.Tensor:\n"
    '    """[L, H, D] -> [KVH, L*G, D]: the G query heads sharing a KV head become G consecutive rows per\n'
    '    token (row r = l * G + g), so each tile is one matmul per KV head."""\n'
    "    L, H, D = q.shape\n"
    "    return q.view(L, kvh, H // kvh, D).permute(1, 0, 2, 3).reshape(kvh, -1, D)\n\n\n"
    "def _folded_token(L: int, group: int) -> torch.Tensor:\n"
    '    """Query token (0..L-1) of each folded row, r // G; a shift, the group being a power of two."""\n'
    "    return torch.arange(L * group) >> (group.bit_length() - 1)\n\n\n"
    "def _unfold_group(x: torch.Tensor, L: int) -> torch.Tensor:\n"
    '    """[KVH, L*G, D] -> [L, H, D]."""\n'
    "    kvh, _, D = x.shape\n"
    "    return x.view(kvh, L, -1, D).permute(1, 0, 2, 3).reshape(L, -1, D)\n\n\n"
)


def gqa_fold_causal() -> HardCase:
    unused_window = Commit(
        "config: use_sliding_window=false turns the window off\n\nQwen2 configs without layer_types carry a "
        "sliding_window they do not use.",
        PRIYA,
        [
            (
                CONFIG,
                '    n, window = hf["num_hidden_layers"], hf.get("sliding_window")\n',
                '    n, window = hf["num_hidden_layers"], hf.get("sliding_window")\n'
                '    if hf.get("use_sliding_window") is False:\n'
                "        window = None\n",
            )
        ],
    )
    wider_tiles = Commit(
        "ops/attention: prefill visits 64 keys per tile\n\nHalf the online-softmax rescales for long prompts; the "
        "result changes only\nby summation order.",
        WEN,
        [(ATTN, "KV_TILE_TOKENS = 32        #", "KV_TILE_TOKENS = 64        #")],
    )
    bug = Commit(
        "prefill: fold the GQA group into the query rows\n\nThe G query heads of a KV head become G rows per token, so "
        "each KV tile is one\n[KVH, L*G, D] x [KVH, n, D] matmul instead of a batched one over G.",
        JONAS,
        [
            (ATTN, PREFILL_BODY, PREFILL_FOLDED),
            (
                ATTN,
                '        s = _softcap(torch.einsum("kgld,knd->kgln", qg, k), softcap)   # q carries the scale\n',
                '        s = _softcap(torch.einsum("krd,knd->krn", qg, k), softcap)   # q carries the scale\n',
            ),
            (
                ATTN,
                '        acc = acc * correction + torch.einsum("kgln,knd->kgld", p, v)\n'
                "        m = m_new\n"
                "    out = acc / l\n"
                "    return out.permute(2, 0, 1, 3).reshape(L, H, D).to(q.dtype)\n",
                '        acc = acc * correction + torch.einsum("krn,knd->krd", p, v)\n'
                "        m = m_new\n"
                "    return _unfold_group(acc / l, L).to(q.dtype)\n",
            ),
            (ATTN, "def paged_attention_prefill(", FOLD_HELPERS + "def paged_attention_prefill("),
        ],
    )
    model = {"arch": "llama", "seed": 28, "hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2}
    reqs = [greedy(15, 2028, 8), greedy(7, 2128, 8)]
    return case(
        "ts-hard-gqa-fold-causal",
        2028,
        "attention",
        ["flashinfer-ai/flashinfer#1148", "facebookresearch/xformers#1239"],
        "wrong output for a model with 6 query heads and 2 KV heads; 4/2 and 8/2 models are fine",
        repro_toml(model, target(), reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "_folded_token",
            "paged_attention",
            "folded query rows are mapped back to their token with a shift by log2(G), which is r // G only for "
            "power-of-two groups; with 3 query heads per KV head rows get later positions and the causal mask lets "
            "prompt tokens see the future",
        ),
        [(12, unused_window), (21, bug), (26, wider_tiles)],
        bug,
    )


# ============================================================================= 2029 batching: decode padding slot


def decode_pad_slot() -> HardCase:
    default_max_tokens = Commit(
        "sampling_params: max_tokens defaults to 64\n\n16 cut most chat answers short.",
        AMARA,
        [(PARAMS, "    max_tokens: int = 16\n", "    max_tokens: int = 64\n")],
    )
    table_fill = Commit(
        "model_runner: fill block tables in place\n\nNo list of padded Python lists per step.",
        WEN,
        [
            (
                RUNNER,
                "        return torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], "
                "dtype=torch.long)\n",
                "        table = torch.zeros(len(seqs), width, dtype=torch.long)   # padded with block 0: masked by seq_lens\n"
                "        for i, s in enumerate(seqs):\n"
                "            table[i, :len(s.block_table)] = torch.tensor(s.block_table, dtype=torch.long)\n"
                "        return table\n",
            )
        ],
    )
    bug = Commit(
        "attention: pad decode batches to a power of two\n\nThe decode kernel now sees a handful of batch shapes "
        "instead of one per\nbatch size (what a graph-captured or compiled kernel needs). Dummy rows\nattend to one "
        "token and are sliced off; their K/V go to the padding slot.",
        AMARA,
        [
            (
                ATTN_LAYER,
                "from tinyserve.forward_context import get_forward_context\n",
                "from tinyserve.forward_context import AttentionMetadata, get_forward_context\n",
            ),
            (
                ATTN_LAYER,
                "from tinyserve.ops.attention import write_to_kv_cache\n",
                "from tinyserve.ops.attention import write_to_kv_cache\n\n"
                "PAD_SLOT = 0   # cache slot the K/V of padding rows are written to\n\n\n"
                "def decode_padding(meta: AttentionMetadata) -> int:\n"
                '    """Dummy rows that bring an all-decode batch to a power-of-two size (a step with a prefill chunk\n'
                '    is not padded)."""\n'
                "    b = meta.seq_lens.shape[0]\n"
                "    if int(meta.query_start_loc[-1]) != b:\n"
                "        return 0\n"
                "    return (1 << (b - 1).bit_length()) - b\n\n\n"
                "def pad_decode_batch(q, k, v, meta: AttentionMetadata, n: int):\n"
                '    """q [B, H, D], k/v [B, KVH, D] and their metadata with `n` dummy decode rows appended: one token\n'
                '    each, seq_len 1, a block-table row of zeros, K/V written to PAD_SLOT."""\n'
                "    if n == 0:\n"
                "        return q, k, v, meta\n\n"
                "    def pad(x: torch.Tensor) -> torch.Tensor:\n"
                "        return torch.cat([x, x.new_zeros((n, *x.shape[1:]))])\n\n"
                "    starts = meta.query_start_loc\n"
                "    padded = AttentionMetadata(\n"
                "        query_start_loc=torch.cat([starts, starts[-1] + torch.arange(1, n + 1, dtype=starts.dtype)]),\n"
                "        seq_lens=torch.cat([meta.seq_lens, torch.ones(n, dtype=meta.seq_lens.dtype)]),\n"
                "        block_tables=pad(meta.block_tables),\n"
                "        slot_mapping=torch.cat([meta.slot_mapping, meta.slot_mapping.new_full((n,), PAD_SLOT)]))\n"
                "    return pad(q), pad(k), pad(v), padded\n",
            ),
            (
                ATTN_LAYER,
                "        v = v.view(t, self.num_kv_heads, self.head_dim)\n"
                "        write_to_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)\n",
                "        v = v.view(t, self.num_kv_heads, self.head_dim)\n"
                "        q, k, v, meta = pad_decode_batch(q, k, v, meta, decode_padding(meta))\n"
                "        write_to_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)\n",
            ),
            (
                ATTN_LAYER,
                "        return out.reshape(t, self.num_heads * self.head_dim)\n",
                "        return out[:t].reshape(t, self.num_heads * self.head_dim)\n",
            ),
            (
                FWD_CTX,
                "    slot_mapping: torch.Tensor      # [T] cache slot (block * block_size + offset) of each new token\n",
                "    slot_mapping: torch.Tensor      # [T] cache slot (block * block_size + offset) of each new token\n"
                "                                    # (attention pads all-decode batches: layers.attention.PAD_SLOT)\n",
            ),
        ],
    )
    reqs = [greedy(18, 2029, 8), greedy(11, 2129, 8), greedy(23, 2229, 8)]
    return case(
        "ts-hard-decode-pad-slot",
        2029,
        "batching",
        ["vllm-project/vllm#43810", "sgl-project/sglang#36207", "vllm-project/vllm#13418"],
        "three concurrent requests: the first one's output goes wrong after its first token",
        repro_toml({"arch": "llama", "seed": 29}, target(block_size=16), reqs, good_ref="v0.2.0"),
        (
            ATTN_LAYER,
            "pad_decode_batch",
            "attention",
            "dummy rows added to an all-decode batch of non-power-of-two size write their zero K/V into slot 0, "
            "which is not reserved: it holds position 0 of whichever sequence owns block 0",
        ),
        [(11, table_fill), (16, bug), (24, default_max_tokens)],
        bug,
    )


# ============================================================================= 2030 sampling: penalties over the prompt


def penalty_prompt_counts() -> HardCase:
    greedy_min_p = Commit(
        "sampler: greedy rows skip min-p\n\nArgmax is never below min_p * max; do not pay a softmax for rows that "
        "only\nneed the argmax.",
        TOMAS,
        [
            (
                SAMPLER,
                "        if bool((st.min_p > 0.0).any()):\n",
                "        if bool(((st.min_p > 0.0) & ~st.greedy).any()):\n",
            )
        ],
    )
    seen_once = Commit(
        "sampler: name the repetition-penalty factor",
        WEN,
        [
            (
                SAMPLER,
                "        penalized = torch.where(logits > 0, logits / rep, logits * rep)\n",
                "        factor = torch.where(logits > 0, 1.0 / rep, rep)\n        penalized = logits * factor\n",
            )
        ],
    )
    bug = Commit(
        "sampler: one bincount per request for the penalty tensors\n\nThe prompt mask and the output counts were "
        "built with two scatter passes\nper request; one bincount over the request's tokens gives both the set of\n"
        "seen tokens and the counts. Batches where no request sets a penalty skip\nthe penalty pass.",
        PRIYA,
        [
            (
                SAMPLER,
                "    prompt_mask: torch.Tensor         # [S, V] bool: token occurs in the prompt\n"
                "    output_counts: torch.Tensor       # [S, V] int: occurrences in the output so far\n",
                "    token_counts: torch.Tensor        # [S, V] int: occurrences in prompt + output so far\n",
            ),
            (
                SAMPLER,
                "    generators: list                  # [S] torch.Generator\n",
                "    generators: list                  # [S] torch.Generator\n"
                "    has_penalties: bool = True        # some row sets a penalty (else the penalty pass is skipped)\n",
            ),
            (
                SAMPLER,
                "        prompt_mask = torch.zeros(s, vocab_size, dtype=torch.bool)\n"
                "        output_counts = torch.zeros(s, vocab_size, dtype=torch.int64)\n"
                "        for i, (prompt, out) in enumerate(zip(prompts, outputs)):\n"
                "            prompt_mask[i, torch.tensor(prompt, dtype=torch.long)] = True\n"
                "            if out:\n"
                "                ids = torch.tensor(out, dtype=torch.long)\n"
                "                output_counts[i].index_add_(0, ids, torch.ones_like(ids))\n",
                "        token_counts = torch.stack([torch.bincount(torch.tensor(list(p) + list(o), dtype=torch.long),\n"
                "                                                   minlength=vocab_size)[:vocab_size]\n"
                "                                    for p, o in zip(prompts, outputs)]) if s else \\\n"
                "            torch.zeros(0, vocab_size, dtype=torch.int64)\n",
            ),
            (
                SAMPLER,
                "            prompt_mask=prompt_mask, output_counts=output_counts, generators=list(generators))\n",
                "            token_counts=token_counts, generators=list(generators),\n"
                "            has_penalties=any(p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty\n"
                "                              for p in params))\n",
            ),
            (
                SAMPLER,
                "        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))\n"
                "        return self.apply_temperature(self.apply_penalties(logits, st), st)\n",
                "        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))\n"
                "        if st.has_penalties:\n"
                "            logits = self.apply_penalties(logits, st)\n"
                "        return self.apply_temperature(logits, st)\n",
            ),
            (
                SAMPLER,
                "        seen = st.prompt_mask | (st.output_counts > 0)\n",
                "        counts = st.token_counts.to(logits.dtype)\n        seen = counts > 0\n",
            ),
            (
                SAMPLER,
                "        counts = st.output_counts.to(logits.dtype)\n"
                "        logits = logits - st.frequency_penalty.to(logits.dtype).unsqueeze(1) * counts\n"
                "        return logits - st.presence_penalty.to(logits.dtype).unsqueeze(1) * (counts > 0)"
                ".to(logits.dtype)\n",
                "        logits = logits - st.frequency_penalty.to(logits.dtype).unsqueeze(1) * counts\n"
                "        return logits - st.presence_penalty.to(logits.dtype).unsqueeze(1) * seen.to(logits.dtype)\n",
            ),
        ],
    )
    plain = {"temperature": 0.8, "repetition_penalty": 1.2, "seed": 41, "ignore_eos": True}
    penalised = {"temperature": 0.8, "frequency_penalty": 0.6, "presence_penalty": 0.4, "seed": 42, "ignore_eos": True}
    reqs = [
        {"prompt_ids": prompt(16, 2030), "max_tokens": 8, "sampling": plain},
        {"prompt_ids": prompt(20, 2130), "max_tokens": 8, "sampling": penalised},
    ]
    return case(
        "ts-hard-penalty-prompt-counts",
        2030,
        "sampling",
        ["osaurus-ai/vmlx-swift#295", "NVIDIA/TensorRT-LLM#5623"],
        "presence_penalty / frequency_penalty push the model away from words of the prompt",
        repro_toml({"arch": "llama", "seed": 30}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "SamplingTensors.build",
            "sampler",
            "one bincount over prompt + output feeds every penalty, so presence and frequency penalties (defined over "
            "generated tokens only) also count the prompt's tokens",
        ),
        [(9, greedy_min_p), (17, bug), (25, seen_once)],
        bug,
    )


# ============================================================================= 2031 quantization: int4 K tail

INT4_BODY = (
    "    # sum_k x_k (q_k - z) s = s * (x . q - z * sum_k x_k), per group\n"
    "    xg = x.unflatten(-1, (-1, group_size))                                    # [T, G, g]\n"
    "    qg = unpack_int4(qweight).to(x.dtype).unflatten(-1, (-1, group_size))     # [O, G, g]\n"
    '    partial = torch.einsum("tgk,ogk->tog", xg, qg)                            # [T, O, G]\n'
    "    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]\n"
    "    return ((partial - shift) * scale.to(x.dtype)[None]).sum(-1)\n"
)
INT4_TILED = (
    "    # sum_k x_k (q_k - z) s = s * (x . q - z * sum_k x_k), per group, accumulated tile by tile\n"
    "    q = unpack_int4(qweight)                                                  # [O, I]\n"
    "    tile = max(INT4_K_TILE // group_size, 1) * group_size                     # whole groups per tile\n"
    "    out = x.new_zeros(x.shape[0], q.shape[0])\n"
    "    for k0 in range(0, x.shape[-1] // tile * tile, tile):\n"
    "        g0, g1 = k0 // group_size, (k0 + tile) // group_size\n"
    "        out += _int4_tile(x[:, k0:k0 + tile], q[:, k0:k0 + tile], scale[:, g0:g1], zero[:, g0:g1], group_size)\n"
    "    return out\n"
)
INT4_TILE_FN = (
    "INT4_K_TILE = 64   # input columns per int4 tile: bounds the [T, O, G] temporaries of long rows\n\n\n"
    "def _int4_tile(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,\n"
    "               group_size: int) -> torch.Tensor:\n"
    "    # x [T, k], unpacked q [O, k], scale / zero [O, k/g] -> partial product [T, O]\n"
    "    xg = x.unflatten(-1, (-1, group_size))                                    # [T, G, g]\n"
    "    qg = q.to(x.dtype).unflatten(-1, (-1, group_size))                        # [O, G, g]\n"
    '    partial = torch.einsum("tgk,ogk->tog", xg, qg)                            # [T, O, G]\n'
    "    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]\n"
    "    return ((partial - shift) * scale.to(x.dtype)[None]).sum(-1)\n\n\n"
)


def int4_k_tail() -> HardCase:
    group_default = Commit(
        "config: quant_group_size defaults to 64\n\nCloser to what AWQ/GPTQ checkpoints use (128) while still "
        "dividing the small\nmodels' hidden sizes.",
        AMARA,
        [
            (
                CONFIG,
                "    quant_group_size: int = 32               #",
                "    quant_group_size: int = 64               #",
            )
        ],
    )
    unpack_shift = Commit(
        "quant_matmul: unpack both nibbles with one shift",
        WEN,
        [
            (
                QMM,
                "    return torch.stack([qweight & 0x0F, qweight >> 4], dim=-1).flatten(-2)\n",
                "    shifts = torch.tensor([0, 4], dtype=torch.uint8)\n"
                "    return ((qweight.unsqueeze(-1) >> shifts) & 0x0F).flatten(-2)\n",
            )
        ],
    )
    bug = Commit(
        "quant_matmul: int4 in tiles of 64 input columns\n\nThe [T, O, G] partial products of a whole row were the "
        "largest temporaries\nof a quantized forward; a tile of whole groups at a time keeps them small.",
        TOMAS,
        [
            (QMM, INT4_BODY, INT4_TILED),
            (QMM, "def _int4_matmul(", INT4_TILE_FN + "def _int4_matmul("),
            (
                README,
                "Engine option `native_kernels=[...]`",
                "int4 matmuls run in tiles of whole groups, about 64 input columns each.\n\n"
                "Engine option `native_kernels=[...]`",
            ),
        ],
    )
    model = {"arch": "llama", "seed": 31, "intermediate_size": 96}
    tgt = target(quantization="int4", quant_group_size=32)
    return case(
        "ts-hard-int4-k-tail",
        2031,
        "quantization",
        ["tile-ai/tilelang#2381", "ml-explore/mlx#3912", "NVIDIA/cutlass#3536"],
        "int4 output wrong on a checkpoint with intermediate_size 96; 128 and int8 are fine",
        repro_toml(model, tgt, [greedy(16, 2031, 8)], good_ref="v0.2.0"),
        (
            QMM,
            "_int4_matmul",
            "quant_matmul",
            "the tiled int4 product loops over whole 64-column tiles only, so a layer whose input width is not a "
            "multiple of 64 (down_proj with 96 inputs) drops its last partial tile",
        ),
        [(11, group_default), (18, bug), (27, unpack_shift)],
        bug,
    )


# ============================================================================= 2032 kv-cache: sliding-window block release

RELEASE_FN = (
    "    def free_out_of_window(self, seq: Sequence, window: int) -> None:\n"
    '        """Sliding-window models: return the leading blocks no later query of `seq` can attend to. Their\n'
    '        table entries stay, so positions keep their block index (the kernel masks them)."""\n'
    "        keep = window // self.block_size                                # blocks one window spans\n"
    "        last = seq.num_computed_tokens // self.block_size               # block of the next query\n"
    "        for i in range(seq.num_window_freed, last - keep + 1):\n"
    "            self._release(self.blocks[seq.block_table[i]])\n"
    "        seq.num_window_freed = max(seq.num_window_freed, last - keep + 1)\n\n"
    "    def _release(self, block: Block) -> None:\n"
    "        block.ref_count -= 1\n"
    "        if block.ref_count == 0:\n"
    "            self.free_queue[block.block_id] = None\n\n"
)


def swa_block_release() -> HardCase:
    evict_uncached = Commit(
        "block_manager: hand out never-cached blocks before cached ones\n\nWith prefix caching, a freed block that "
        "still carries a hash can serve a later\nhit; fresh allocations now prefer blocks without one.",
        JONAS,
        [
            (
                BM,
                "        block_id, _ = self.free_queue.popitem(last=False)\n",
                "        block_id = next((b for b in self.free_queue if self.blocks[b].hash is None), None)\n"
                "        if block_id is None:\n"
                "            block_id, _ = self.free_queue.popitem(last=False)\n"
                "        else:\n"
                "            del self.free_queue[block_id]\n",
            )
        ],
    )
    needed_divmod = Commit(
        "block_manager: blocks_needed in whole blocks",
        WEN,
        [
            (
                BM,
                "        return max(0, -(-total // self.block_size) - len(seq.block_table))\n",
                "        blocks, rest = divmod(total, self.block_size)\n"
                "        return max(0, blocks + bool(rest) - len(seq.block_table))\n",
            )
        ],
    )
    bug = Commit(
        "kv cache: give sliding-window blocks back to the pool\n\nFor models whose every layer slides (Mistral), "
        "blocks that fell out of the\nwindow were held until the request finished; they now return to the free\n"
        "queue after each step, so long generations no longer crowd others out.",
        AMARA,
        [
            (
                BM,
                "    def free(self, seq: Sequence) -> None:\n"
                "        # tail blocks first, so the shared head of a prefix is evicted last\n"
                "        for block_id in reversed(seq.block_table):\n"
                "            block = self.blocks[block_id]\n"
                "            block.ref_count -= 1\n"
                "            if block.ref_count == 0:\n"
                "                self.free_queue[block_id] = None\n"
                "        seq.block_table = []\n",
                "    def free(self, seq: Sequence) -> None:\n"
                "        # tail blocks first, so the shared head of a prefix is evicted last; blocks a sliding\n"
                "        # window already gave back are not released twice\n"
                "        for block_id in reversed(seq.block_table[seq.num_window_freed:]):\n"
                "            self._release(self.blocks[block_id])\n"
                "        seq.block_table = []\n"
                "        seq.num_window_freed = 0\n\n" + RELEASE_FN.rstrip("\n") + "\n",
            ),
            (
                SEQ,
                "        self.block_table: list[int] = []\n",
                "        self.block_table: list[int] = []\n"
                "        self.num_window_freed = 0             # leading blocks already back in the pool (sliding window)\n",
            ),
            (
                SCHED,
                "        self.num_preemptions = 0\n\n    def add(",
                "        self.num_preemptions = 0\n"
                "        windows = set(config.model_config.sliding_windows)\n"
                "        # blocks can be given back early only when every layer slides over the same window\n"
                "        self.window = windows.pop() if len(windows) == 1 else None\n\n    def add(",
            ),
            (
                SCHED,
                "            self.block_manager.cache_full_blocks(seq)\n",
                "            self.block_manager.cache_full_blocks(seq)\n"
                "            if self.window:\n"
                "                self.block_manager.free_out_of_window(seq, self.window)\n",
            ),
        ],
    )
    model = {"arch": "mistral", "seed": 32}
    tgt = target(block_size=16, num_kv_blocks=5)
    reqs = [greedy(48, 2032, 32), greedy(64, 2132, 8)]
    return case(
        "ts-hard-swa-block-release",
        2032,
        "kv-cache",
        ["vllm-project/vllm#4380", "vllm-project/vllm#3504", "vllm-project/vllm#4545"],
        "Mistral with a small KV cache: a long request goes off the rails when a second one starts",
        repro_toml(model, tgt, reqs, good_ref="v0.2.0"),
        (
            BM,
            "BlockManager.free_out_of_window",
            "block_manager",
            "keeps window // block_size blocks before the next query's block, one too few when the window does not "
            "start on a block boundary, so a block still inside the window goes back to the pool and is overwritten",
        ),
        [(12, evict_uncached), (22, bug), (28, needed_divmod)],
        bug,
    )


# ============================================================================= 2033 model-config: activation key

OPS_INIT = "tinyserve/ops/__init__.py"
OPS_ACT = "tinyserve/ops/activation.py"
ACT_LAYER = "tinyserve/layers/activation.py"
GELU_EXACT = (
    "\n\ndef gelu_and_mul(x: torch.Tensor) -> torch.Tensor:\n"
    "    # [T, 2I] -> [T, I]; exact (erf) GELU\n"
    "    d = x.shape[-1] // 2\n"
    "    out = F.gelu(x[..., :d])\n"
    "    return out.mul_(x[..., d:])\n\n\n"
    "def gelu_and_mul_native(x: torch.Tensor) -> torch.Tensor:\n"
    "    # [T, 2I] -> [T, I]; 0.5 x (1 + erf(x / sqrt(2)))\n"
    "    gate, up = x.chunk(2, dim=-1)\n"
    "    g = gate.to(torch.promote_types(x.dtype, torch.float32))\n"
    "    return (0.5 * g * (1.0 + torch.erf(g / math.sqrt(2.0)))).to(x.dtype) * up\n"
)


def gemma_activation_key() -> HardCase:
    gelu_new = Commit(
        "activation: accept gelu_new (the tanh approximation)\n\nGPT-2 style configs spell the tanh GELU that way.",
        PRIYA,
        [
            (
                ACT_LAYER,
                '"gelu_tanh": "gelu_tanh_and_mul"}',
                '"gelu_tanh": "gelu_tanh_and_mul", "gelu_new": "gelu_tanh_and_mul"}',
            )
        ],
    )
    gelu_split = Commit(
        "ops/activation: gelu_tanh_and_mul without the in-place multiply\n\nSame change as silu_and_mul got; "
        "torch.compile fuses it.",
        WEN,
        [
            (
                OPS_ACT,
                "    d = x.shape[-1] // 2\n"
                '    out = F.gelu(x[..., :d], approximate="tanh")\n'
                "    return out.mul_(x[..., d:])\n",
                '    gate, up = x.split(x.shape[-1] // 2, dim=-1)\n    return F.gelu(gate, approximate="tanh") * up\n',
            )
        ],
    )
    bug = Commit(
        "activation: exact GELU for hidden_act='gelu'; read hidden_act first\n\nConfigs asking for the exact GELU "
        "were rejected. hidden_act is the key every\narchitecture has; hidden_activation is only read when it is "
        "missing.",
        JONAS,
        [
            (
                OPS_ACT,
                "    return (0.5 * g * (1.0 + torch.tanh(inner))).to(x.dtype) * up\n",
                "    return (0.5 * g * (1.0 + torch.tanh(inner))).to(x.dtype) * up\n" + GELU_EXACT,
            ),
            (
                OPS_INIT,
                "from tinyserve.ops.activation import gelu_tanh_and_mul, gelu_tanh_and_mul_native, silu_and_mul, "
                "silu_and_mul_native\n",
                "from tinyserve.ops.activation import (gelu_and_mul, gelu_and_mul_native, gelu_tanh_and_mul,\n"
                "                                      gelu_tanh_and_mul_native, silu_and_mul, silu_and_mul_native)\n",
            ),
            (
                OPS_INIT,
                '    "gelu_tanh_and_mul": (gelu_tanh_and_mul, gelu_tanh_and_mul_native),\n',
                '    "gelu_tanh_and_mul": (gelu_tanh_and_mul, gelu_tanh_and_mul_native),\n'
                '    "gelu_and_mul": (gelu_and_mul, gelu_and_mul_native),\n',
            ),
            (
                OPS_INIT,
                "    gelu_tanh_and_mul: Callable\n",
                "    gelu_tanh_and_mul: Callable\n    gelu_and_mul: Callable\n",
            ),
            (ACT_LAYER, '{"silu": "silu_and_mul", ', '{"silu": "silu_and_mul", "gelu": "gelu_and_mul", '),
            (
                CONFIG,
                'hidden_act=hf.get("hidden_activation") or hf.get("hidden_act", "silu"),',
                'hidden_act=hf.get("hidden_act") or hf.get("hidden_activation", "silu"),',
            ),
        ],
    )
    model = {"arch": "gemma2", "seed": 33, "hidden_act": "gelu", "initializer_range": 0.2}
    return case(
        "ts-hard-gemma-act-key",
        2033,
        "model-config",
        ["vllm-project/vllm#3411", "huggingface/transformers#29402"],
        "Gemma 2 checkpoint converted from an older export drifts from transformers after upgrading",
        repro_toml(model, target(), [greedy(13, 2033, 8), greedy(17, 2133, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "ModelConfig.from_dict",
            "config",
            "hidden_act is now read before hidden_activation, so a Gemma 2 config that still carries the legacy "
            "hidden_act='gelu' next to hidden_activation='gelu_pytorch_tanh' runs the exact GELU instead of the tanh "
            "approximation the model was trained with",
        ),
        [(9, gelu_new), (19, bug), (27, gelu_split)],
        bug,
    )


CASES = [
    fp16_norm_overflow(),
    fp16_softcap_offset(),
    gqa_fold_causal(),
    decode_pad_slot(),
    penalty_prompt_counts(),
    int4_k_tail(),
    swa_block_release(),
    gemma_activation_key(),
]
