"""A sixth held-out set of hard-track tinyserve cases (part A), each modelled on an upstream silent bug
(issues 2801-2810).

    python -m benchmark.author ts-hard-decode-batch-bound ...

Same shape as tinyserve_hard_heldout5 / 5b: the shared commit stream (benchmark/authoring/tinyserve_stream.py,
release tags v0.2.0 / v0.3.0 / v0.4.0) with the case's own commits inserted on both sides of the culprit,
and `good_ref` the v0.2.0 tag, 25+ commits back. Every case carries a behaviour change on another path
(the shared distractors of the fifth set, imported) and a numerically equivalent change on the failing
path. Issue prose lives in benchmark/authoring/issues/<id>.md. Written blind: the diagnosis was never run
on them.

Fault location mix (fixed before the cases were written):

    A in place: an existing function edited next to harmless edits of others        2801 2802
    B in a new helper the culprit creates (the caller now calls it)                  2803 2804
    C in the caller of a helper the culprit moves faithfully to another file          2805 2806
    D a default value / config reader / a second file                                2807 2808
    E functions of one file changed together: one wrong, the others correct          2809
    F culprit touches 2 files; the bug is in the file the issue text does not hint at 2810

Categories: kernel (2801, a batch of three lengths), numerics (2802, bfloat16), positional-encoding
(2803, seeded sampling), attention (2804, bfloat16), spec-decode (2805 2810), sampling (2806 2809,
seeded), model-config (2807), kv-cache (2808).
"""

from __future__ import annotations

import textwrap

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, greedy, prompt
from benchmark.authoring.tinyserve_hard_heldout5 import (
    draft_budget_4096,
    layernorm_fused_first,
    logprobs_cap,
    max_len_8192,
    max_num_seqs_256,
    quant_group_64,
    sampled,
    stop_dedupe,
    temperature_index,
)
from benchmark.authoring.tinyserve_hard_heldout5b import (
    gelu_new_alias,
    max_pos_default,
    seed_check,
    unseeded_per_request,
)
from benchmark.authoring.tinyserve_hard_upstream import case, target
from benchmark.authoring.tinyserve_stream import ATTN, CONFIG, ROPE, RUNNER, SAMPLER, Commit

GEMMA = "tinyserve/models/gemma2.py"
SPEC = "tinyserve/spec_decode/engine.py"
REJECTION = "tinyserve/spec_decode/rejection.py"
LOGPROBS = "tinyserve/layers/logprobs.py"
TOPK_TOPP = "tinyserve/layers/topk_topp.py"

MARTA = "Marta Nowak <marta.nowak@tinyserve.dev>"
OSEI = "Kwame Osei <kwame.osei.dev@gmail.com>"
LENA = "Lena Fischer <lena.fischer@posteo.de>"
ARJUN = "Arjun Mehta <arjun.mehta@proton.me>"
YUKI = "Yuki Sato <yuki.sato@tinyserve.dev>"


# ============================================================================= 2801 kernel: one causal bound for the batch


def decode_batch_bound() -> HardCase:
    bug = Commit(
        "ops/attention: decode partitions build their mask as one broadcast row\n\nThe split-KV partition mask was "
        "a [B, P] comparison per step; it is now one\n[1, P] row broadcast over the batch. The merge takes the "
        "partition weights\nwith a softmax over the LSEs (the same exp(lse_p - logsumexp) in one op), and a\n"
        "decode step always runs at least one partition.",
        OSEI,
        [
            (
                ATTN,
                "    kv_pos = torch.arange(p0, p0 + k.shape[1]).view(1, -1)\n"
                "    q_pos = (seq_lens - 1).view(-1, 1)\n"
                "    visible = _visible(q_pos, kv_pos, sliding_window)                                 # [B, P]\n",
                "    kv_pos = torch.arange(p0, p0 + k.shape[1]).view(1, -1)\n"
                "    # the newest cached token bounds the partition: one mask row, broadcast over the batch\n"
                "    q_pos = (seq_lens.max() - 1).view(1, 1)\n"
                "    visible = _visible(q_pos, kv_pos, sliding_window)                                 # [1, P]\n",
            ),
            (
                ATTN,
                "    lse = torch.logsumexp(lses, dim=0)\n    weights = torch.exp(lses - lse).nan_to_num(0.0)\n",
                "    weights = torch.softmax(lses, dim=0).nan_to_num(0.0)\n",
            ),
            (
                ATTN,
                "    n_parts = -(-int(seq_lens.max()) // part)\n",
                "    n_parts = max(1, -(-int(seq_lens.max()) // part))\n",
            ),
        ],
    )
    rows = Commit(
        "ops/attention: decode rows indexed from the sequence starts",
        YUKI,
        [(ATTN, "        rows = query_start_loc[decode]\n", "        rows = query_start_loc[:-1][decode]\n")],
    )
    reqs = [greedy(41, 2801, 10), greedy(13, 2901, 10), greedy(27, 3001, 10)]
    return case(
        "ts-hard-decode-batch-bound",
        2801,
        "kernel",
        ["EricLBuehler/mistral.rs#1746", "ROCm/vllm#26", "dphnAI/sonar#1262"],
        "Requests batched together go wrong after their first token unless they are the longest in the batch",
        repro_toml({"arch": "llama", "seed": 2801}, target(), reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "_decode_partition",
            "attention",
            "the split-KV decode mask is built once per partition from the longest sequence of the batch "
            "(seq_lens.max() - 1) and broadcast over every row, so each shorter decoding sequence also attends "
            "to the key slots past its own end: unwritten slots of its last block and the padding of its "
            "block table (block 0, another sequence's keys)",
        ),
        [(11, seed_check(MARTA)), (22, bug), (27, rows)],
        bug,
    )


# ============================================================================= 2802 numerics: post-attention norm fused into the add


def gemma_post_attn_fused() -> HardCase:
    bug = Commit(
        "gemma2: the sandwich norms in one loop; an explicit residual add\n\nThe four norms of a Gemma 2 layer are "
        "built in one loop, and the attention\nsublayer's residual add is written out instead of being hidden in "
        "the fused\npre-feedforward norm, so the layer reads top-down (and has one fused kernel\nless to special-"
        "case under torch.compile).",
        LENA,
        [
            (
                GEMMA,
                "        hs, eps = cfg.hidden_size, cfg.rms_norm_eps\n"
                "        self.input_layernorm = GemmaRMSNorm(hs, eps, kernels)\n"
                "        self.post_attention_layernorm = GemmaRMSNorm(hs, eps, kernels)\n"
                "        self.pre_feedforward_layernorm = GemmaRMSNorm(hs, eps, kernels)\n"
                "        self.post_feedforward_layernorm = GemmaRMSNorm(hs, eps, kernels)\n",
                "        hs, eps = cfg.hidden_size, cfg.rms_norm_eps\n"
                '        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",\n'
                '                     "post_feedforward_layernorm"):\n'
                "            setattr(self, name, GemmaRMSNorm(hs, eps, kernels))\n",
            ),
            (
                GEMMA,
                "        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))\n"
                "        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)\n",
                "        attn_out = self.self_attn(positions, hidden)\n"
                "        residual = residual + attn_out     # the attention sublayer joins the stream, then its norms\n"
                "        hidden = self.pre_feedforward_layernorm(self.post_attention_layernorm(residual))\n",
            ),
            (
                GEMMA,
                "    def build_model(self, cfg, kernels, max_model_len):\n"
                "        return self.model_cls(cfg, kernels, max_model_len, embed_scale=cfg.hidden_size ** 0.5)\n",
                "    def build_model(self, cfg, kernels, max_model_len):\n"
                "        normalizer = cfg.hidden_size ** 0.5     # Gemma scales the embeddings by sqrt(hidden)\n"
                "        return self.model_cls(cfg, kernels, max_model_len, embed_scale=normalizer)\n",
            ),
        ],
    )
    return case(
        "ts-hard-gemma-post-attn-fused",
        2802,
        "numerics",
        ["vllm-project/vllm#53273", "ndif-team/nnterp#53", "HabanaAI/vllm-fork#1721"],
        "Gemma 2 in bfloat16 gives different text than transformers since the update; Llama is unaffected",
        repro_toml(
            {"arch": "gemma2", "seed": 2802},
            target("bfloat16"),
            [greedy(20, 2802, 8), greedy(12, 2902, 8)],
            good_ref="v0.2.0",
        ),
        (
            GEMMA,
            "Gemma2DecoderLayer.forward",
            "gemma2",
            "the attention output is added to the residual stream before the post-attention norm instead of "
            "after it: the stream gets the raw attention output, and the MLP input is the pre-feedforward norm "
            "of the post-attention norm of that sum (two norms in a row) instead of the norm of the residual",
        ),
        [(12, gelu_new_alias(ARJUN)), (17, bug), (30, layernorm_fused_first(YUKI))],
        bug,
    )


# ============================================================================= 2803 positional-encoding: decode row at the length


def decode_row_position() -> HardCase:
    bug = Commit(
        "model_runner: row positions from one helper\n\nprepare_inputs asks row_positions for the positions of a "
        "sequence's new tokens;\na decode step (one new token, the last one appended) skips building a range.\n"
        "The speculative and tensor-parallel runners will use the same helper.",
        ARJUN,
        [
            (
                RUNNER,
                "            positions += range(first, first + n)\n",
                "            positions += self.row_positions(seq, n)\n",
            ),
            (
                RUNNER,
                "    def slot(self, seq: Sequence, position: int) -> int:\n",
                "    @staticmethod\n"
                "    def row_positions(seq: Sequence, n: int) -> list[int]:\n"
                '        """Positions of the n tokens of `seq` computed this step: the ones after its computed prefix."""\n'
                "        if n == 1:\n"
                "            return [seq.num_tokens]          # decode: the token appended last step\n"
                "        first = seq.num_computed_tokens\n"
                "        return list(range(first, first + n))\n\n"
                "    def slot(self, seq: Sequence, position: int) -> int:\n",
            ),
            (
                RUNNER,
                "        width = max(len(s.block_table) for s in seqs)\n",
                "        width = max(map(len, (s.block_table for s in seqs)))\n",
            ),
        ],
    )
    rows = Commit(
        "model_runner: extend the row index list in place",
        YUKI,
        [(RUNNER, "            row_seq += [i] * n\n", "            row_seq.extend([i] * n)\n")],
    )
    reqs = [
        sampled(22, 2803, 12, temperature=0.8, seed=11),
        sampled(9, 2903, 12, temperature=1.0, top_k=40, seed=2024),
    ]
    return case(
        "ts-hard-decode-row-position",
        2803,
        "positional-encoding",
        ["Blaizzy/mlx-vlm#1983", "Physical-Intelligence/openpi#705", "RobertCsordas/moeut#6"],
        "Seeded sampling output became incoherent after the first token since 0.4; the first token looks fine",
        repro_toml({"arch": "llama", "seed": 2803}, target(), reqs, good_ref="v0.2.0"),
        (
            RUNNER,
            "ModelRunner.row_positions",
            "model_runner",
            "the decode shortcut of the new positions helper returns the sequence length instead of the index of "
            "its last token, so every decode row is rotated one position too far (its key is also cached with "
            "that rotation) while prompt rows keep their right positions",
        ),
        [(12, unseeded_per_request(LENA)), (23, bug), (28, rows)],
        bug,
    )


# ============================================================================= 2804 attention: tile-local key positions


def prefill_tile_local_keys() -> HardCase:
    bug = Commit(
        "ops/attention: one helper for a prefill tile's mask\n\nThe prefill loop built its key positions and the "
        "causal / window mask inline;\n_tile_mask does it for a tile [t0, t1). gather_kv rounds its last block up\nwith a plain ceil-div.",
        MARTA,
        [
            (
                ATTN,
                "def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, start: int, end: int) -> torch.Tensor:\n",
                "def _tile_mask(q_pos: torch.Tensor, t0: int, t1: int, sliding_window: int | None) -> torch.Tensor:\n"
                '    """Query positions [L, 1], a KV tile [t0, t1) -> bool [L, t1 - t0]: the tile\'s keys each query sees."""\n'
                "    keys = torch.arange(t1 - t0).view(1, -1)          # the tile's keys, in gather order\n"
                "    return _visible(q_pos, keys, sliding_window)\n\n\n"
                "def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, start: int, end: int) -> torch.Tensor:\n",
            ),
            (
                ATTN,
                '        s = s.masked_fill(~_visible(q_pos, torch.arange(t0, t1).view(1, -1), sliding_window), float("-inf"))\n',
                '        s = s.masked_fill(~_tile_mask(q_pos, t0, t1, sliding_window), float("-inf"))\n',
            ),
            (
                ATTN,
                "    first, last = start // bs, -(-end // bs)\n",
                "    first, last = start // bs, (end + bs - 1) // bs\n",
            ),
        ],
    )
    tiles = Commit(
        "ops/attention: round the first prefill tile down with a modulo",
        OSEI,
        [(ATTN, "    lo = lo // KV_TILE_TOKENS * KV_TILE_TOKENS\n", "    lo -= lo % KV_TILE_TOKENS\n")],
    )
    return case(
        "ts-hard-prefill-tile-local-keys",
        2804,
        "attention",
        ["gittensor-ai-lab/sparkinfer#3", "onnx/onnx#8054", "HKUSTDial/flash-sparse-attention#213"],
        "bfloat16 Llama: prompts longer than ~32 tokens give wrong answers after upgrading, short prompts are fine",
        repro_toml(
            {"arch": "llama", "seed": 2804},
            target("bfloat16"),
            [greedy(45, 2804, 8), greedy(18, 2904, 8)],
            good_ref="v0.2.0",
        ),
        (
            ATTN,
            "_tile_mask",
            "attention",
            "the tile mask compares absolute query positions with the tile's key indices counted from 0, so from "
            "the second KV tile on (prompts past 32 tokens) keys appear to sit at positions 0..31: early queries "
            "attend to later tokens of the prompt and causal masking is lost",
        ),
        [(11, max_len_8192(ARJUN)), (24, bug), (28, tiles)],
        bug,
    )


# ============================================================================= 2805 spec-decode: accepted drafts counted, not their prefix

COMPUTE_LOGPROBS = '''def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, top_n: int = 0):
    """Log-probabilities under the raw model distribution (before penalties/temperature).

    -> (chosen [S], top ids [S, n], top logprobs [S, n])
    """
    logprobs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    top = logprobs.topk(top_n, dim=-1) if top_n else None
    return chosen, (top.indices if top else None), (top.values if top else None)
'''

LOGPROBS_MODULE = (
    '"""Log-probabilities of emitted tokens (the plain runner and the speculative verifier)."""\n'
    "from __future__ import annotations\n\nimport torch\n\n\n" + COMPUTE_LOGPROBS
)


def spec_accept_count() -> HardCase:
    bug = Commit(
        "spec_decode: logprobs in their own module; drafts accepted in one tensor op\n\ncompute_logprobs moves "
        "from layers/sampler.py to layers/logprobs.py (the sampler\ndoes not use it). The verifier compares every "
        "draft of a sequence with its\nrow's token at once instead of walking the rows in Python.",
        YUKI,
        [
            (LOGPROBS, None, LOGPROBS_MODULE),
            ("tinyserve/layers/sampler.py", "\n\n" + COMPUTE_LOGPROBS, ""),
            (
                RUNNER,
                "from tinyserve.layers.sampler import Sampler, SamplingTensors, compute_logprobs\n",
                "from tinyserve.layers.logprobs import compute_logprobs\n"
                "from tinyserve.layers.sampler import Sampler, SamplingTensors\n",
            ),
            (
                SPEC,
                "from tinyserve.layers.sampler import SamplingTensors, compute_logprobs\n",
                "from tinyserve.layers.logprobs import compute_logprobs\nfrom tinyserve.layers.sampler import SamplingTensors\n",
            ),
            (
                SPEC,
                "            keep = next((n for n, r in enumerate(rs) if row_draft[r] < 0 or int(emitted[r]) != row_draft[r]), "
                "len(rs) - 1)\n",
                "            drafted = torch.tensor([row_draft[r] for r in rs[:-1]], dtype=torch.long)\n"
                "            keep = int((emitted[rs[:-1]] == drafted).sum())    # drafts the target agreed with\n",
            ),
        ],
    )
    rows = Commit(
        "spec_decode: verification row offsets counted from the end",
        LENA,
        [
            (
                SPEC,
                "            rows.append(starts[i + 1] - 1 - len(d) + r)\n",
                "            rows.append(starts[i + 1] - (len(d) + 1) + r)\n",
            )
        ],
    )
    motif = prompt(6, 2805)
    reqs = [
        {
            "prompt_ids": motif * 5 + prompt(4, 2905),
            "max_tokens": 32,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
        greedy(30, 3005, 32),
        {"prompt_ids": prompt(8, 3105) * 3, "max_tokens": 32, "sampling": {"temperature": 0.0, "ignore_eos": True}},
    ]
    tgt = target(speculative="ngram", num_speculative_tokens=4)
    return case(
        "ts-hard-spec-accept-count",
        2805,
        "spec-decode",
        ["vllm-project/vllm#2658", "openvinotoolkit/openvino.genai#4190", "vllm-project/vllm#29274"],
        "Greedy output with ngram speculation no longer matches the same run without speculation",
        repro_toml({"arch": "llama", "seed": 2805}, tgt, reqs, good_ref="v0.2.0"),
        (
            SPEC,
            "SpecDecodeEngine.accepted",
            "spec_decode",
            "the verifier counts how many drafts matched their row's token instead of the length of the matching "
            "prefix, so after a rejected draft a later draft that happens to match is accepted too, and tokens "
            "computed on top of the rejected draft are emitted",
        ),
        [(13, draft_budget_4096(MARTA)), (25, bug), (30, rows)],
        bug,
    )


# ============================================================================= 2806 sampling: the top-p guard reads the largest top_p

TOPK_TOPP_HEADER = (
    '"""Truncation filters: top-k, top-p (nucleus), min-p. logits [S, V] -> the same logits with the\n'
    'dropped tokens at -inf; one parameter per row."""\n'
    "from __future__ import annotations\n\nimport torch\n\n\n"
)
TOPK_TOPP_FUNCTIONS = """def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    # keep every logit >= the k-th largest (ties at the boundary survive, as in HF)
    sorted_desc = logits.sort(dim=-1, descending=True).values
    kth = sorted_desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # drop the low tail whose total mass is <= 1 - top_p; the top token always survives
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    sorted_probs = sorted_logits.softmax(dim=-1)
    cum = torch.cumsum(sorted_probs, dim=-1)
    remove_sorted = cum <= (1 - top_p).unsqueeze(1)
    remove_sorted[:, -1] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    threshold = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))
"""
TOPK_TOPP_MODULE = TOPK_TOPP_HEADER + TOPK_TOPP_FUNCTIONS
# the same functions as static methods of Sampler, where they live before the move
SAMPLER_FILTER_METHODS = "".join(
    "    @staticmethod\n" + textwrap.indent(f, "    ") + "\n\n"
    for f in TOPK_TOPP_FUNCTIONS.rstrip("\n").split("\n\n\n")
)


def top_p_guard_max() -> HardCase:
    bug = Commit(
        "sampler: the truncation filters move to layers/topk_topp.py\n\napply_top_k / apply_top_p / apply_min_p "
        "become module functions the\nspeculative verifier can call without a Sampler. The sampler decides "
        "whether a\nbatch needs a filter with one reduction over its column instead of a\ncomparison per row.",
        OSEI,
        [
            (TOPK_TOPP, None, TOPK_TOPP_MODULE),
            (SAMPLER, SAMPLER_FILTER_METHODS, ""),
            (
                SAMPLER,
                "from torch import nn\n",
                "from torch import nn\n\nfrom tinyserve.layers.topk_topp import apply_min_p, apply_top_k, apply_top_p\n",
            ),
            (
                SAMPLER,
                "        if bool((st.top_k < logits.shape[-1]).any()):\n"
                "            truncated = self.apply_top_k(truncated, st.top_k)\n"
                "        if bool((st.top_p < 1.0).any()):\n"
                "            truncated = self.apply_top_p(truncated, st.top_p)\n"
                "        if bool((st.min_p > 0.0).any()):\n"
                "            truncated = self.apply_min_p(truncated, st.min_p)\n",
                "        if int(st.top_k.min()) < logits.shape[-1]:\n"
                "            truncated = apply_top_k(truncated, st.top_k)\n"
                "        if float(st.top_p.max()) < 1.0:\n"
                "            truncated = apply_top_p(truncated, st.top_p)\n"
                "        if float(st.min_p.max()) > 0.0:\n"
                "            truncated = apply_min_p(truncated, st.min_p)\n",
            ),
        ],
    )
    reqs = [
        sampled(16, 2806, 12, temperature=0.9, top_p=0.6, seed=31),
        sampled(11, 2906, 12, temperature=0.7, seed=77),
    ]
    return case(
        "ts-hard-top-p-guard-max",
        2806,
        "sampling",
        ["paiml/aprender#2080", "vllm-project/vllm#14301", "tenstorrent/vllm#42"],
        "top_p has no effect on a request when another request without top_p runs at the same time",
        repro_toml({"arch": "llama", "seed": 2806}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "Sampler.forward",
            "sampler",
            "the sampler now skips the top-p filter unless the batch's largest top_p is below 1 (max instead of "
            "min): as soon as one request in the batch leaves top_p at 1.0, no request gets a nucleus cut",
        ),
        [(12, logprobs_cap(ARJUN)), (16, bug), (26, temperature_index(LENA))],
        bug,
    )


# ============================================================================= 2807 model-config: Qwen2's rope_theta fallback


ROPE_CONFIG_TEST = """from __future__ import annotations

from tinyserve.config import rope_parameters


def test_qwen2_without_rope_theta_gets_its_trained_base():
    assert rope_parameters({"model_type": "qwen2"})["rope_theta"] == 1_000_000.0


def test_other_architectures_keep_10000():
    assert rope_parameters({"model_type": "llama"})["rope_theta"] == 10000.0


def test_an_explicit_rope_theta_wins():
    assert rope_parameters({"model_type": "qwen2", "rope_theta": 5e5})["rope_theta"] == 5e5
"""


def qwen2_theta_fallback() -> HardCase:
    bug = Commit(
        "config: per-architecture rope_theta when config.json has none\n\nQwen2 and Qwen2.5 were trained with "
        "rope_theta = 1e6; a converted Qwen2\ncheckpoint whose config.json lost the key ran with Llama's 10000. "
        "The reader\nnow falls back to the architecture's value.",
        LENA,
        [
            (
                CONFIG,
                "def rope_parameters(hf: dict) -> dict:\n",
                "# rope_theta of checkpoints whose config.json leaves it out, by architecture (else 10000)\n"
                'ROPE_THETA_DEFAULTS = {"qwen2": 1_000_000.0}\n\n\n'
                "def rope_parameters(hf: dict) -> dict:\n",
            ),
            (
                CONFIG,
                '    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))\n',
                '    default_theta = ROPE_THETA_DEFAULTS.get(hf.get("model_type"), 10000.0)\n'
                '    params.setdefault("rope_theta", hf.get("rope_theta", default_theta))\n',
            ),
            ("tests/test_rope_config.py", None, ROPE_CONFIG_TEST),
        ],
    )
    exponents = Commit(
        "rotary: name the frequency exponents",
        OSEI,
        [
            (
                ROPE,
                "    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))\n",
                "    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim\n"
                "    return 1.0 / (base ** exponents)\n",
            )
        ],
    )
    model = {"arch": "qwen2", "seed": 2807, "omit_keys": ["rope_parameters", "rope_theta"]}
    return case(
        "ts-hard-qwen2-theta-fallback",
        2807,
        "model-config",
        ["vllm-project/vllm#30369", "lyogavin/airllm#369", "sgl-project/sglang#22739"],
        "Converted Qwen2 checkpoint (no rope keys in config.json) drifts from transformers after the upgrade",
        repro_toml(model, target(), [greedy(40, 2807, 10), greedy(16, 2907, 10)], good_ref="v0.2.0"),
        (
            CONFIG,
            "rope_parameters",
            "config",
            "a config.json without rope_theta now gets an architecture default (1e6 for qwen2) where "
            "transformers falls back to 10000, so such a Qwen2 checkpoint is rotated with the wrong base",
        ),
        [(10, max_pos_default(ARJUN)), (14, bug), (27, exponents)],
        bug,
    )


# ============================================================================= 2808 model-config: Gemma 2's head always tied


GEMMA_CONFIG_TEST = """from __future__ import annotations

from tinyserve.config import ModelConfig

GEMMA2 = {"model_type": "gemma2", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
          "query_pre_attn_scalar": 4}


def test_gemma2_ties_its_head_by_default():
    assert ModelConfig.from_dict(GEMMA2).tie_word_embeddings


def test_gemma2_export_claiming_an_untied_head_still_loads_tied():
    assert ModelConfig.from_dict({**GEMMA2, "tie_word_embeddings": False}).tie_word_embeddings
"""


def gemma_head_forced_tie() -> HardCase:
    bug = Commit(
        "config: Gemma 2 always ties its LM head\n\nSome Gemma 2 exports write tie_word_embeddings = false next to "
        "a checkpoint\nwithout lm_head.weight, which then failed to load. The architecture ties the\nhead to the "
        "embeddings, so the config reader does too.",
        MARTA,
        [
            (
                CONFIG,
                '            tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),\n',
                "            # gemma2's head is the embedding table, whatever an export wrote\n"
                '            tie_word_embeddings=gemma or bool(hf.get("tie_word_embeddings", False)),\n',
            ),
            ("tests/test_gemma2_config.py", None, GEMMA_CONFIG_TEST),
        ],
    )
    lookup = Commit(
        "embedding: index the table directly",
        YUKI,
        [
            (
                "tinyserve/layers/embedding.py",
                "        x = F.embedding(input_ids, self.weight)\n",
                "        x = self.weight[input_ids]\n",
            )
        ],
    )
    model = {"arch": "gemma2", "seed": 2808, "tie_word_embeddings": False}
    return case(
        "ts-hard-gemma-head-forced-tie",
        2808,
        "model-config",
        ["pegainfer-project/pegainfer#544", "huggingface/transformers#43429", "nntrainer/nntrainer#4183"],
        "Our Gemma 2 fine-tune with its own (untied) output head gives unrelated tokens since upgrading",
        repro_toml(model, target(), [greedy(14, 2808, 10), greedy(25, 2908, 10)], good_ref="v0.2.0"),
        (
            CONFIG,
            "ModelConfig.from_dict",
            "config",
            "the reader forces tie_word_embeddings on for every gemma2 config, so a checkpoint that ships its own "
            "lm_head.weight (tie_word_embeddings = false) has that tensor skipped by the loader and computes its "
            "logits with the embedding table",
        ),
        [(12, quant_group_64(LENA)), (15, bug), (24, lookup)],
        bug,
    )


# ============================================================================= 2809 sampling: repetition penalty twice


def repetition_twice() -> HardCase:
    bug = Commit(
        "sampler: penalties per token set; output counts with bincount\n\nSamplingTensors.build counts a row's "
        "output tokens with one bincount; the\nrepetition penalty runs once over the prompt tokens and once over "
        "the generated\nones (the two masks no longer need to be OR-ed into a third [S, V] tensor);\n"
        "apply_temperature divides with Tensor.div.",
        ARJUN,
        [
            (
                SAMPLER,
                "            if out:\n"
                "                ids = torch.tensor(out, dtype=torch.long)\n"
                "                output_counts[i].index_add_(0, ids, torch.ones_like(ids))\n",
                "            if out:\n"
                "                output_counts[i] = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=vocab_size)\n",
            ),
            (
                SAMPLER,
                "        seen = st.prompt_mask | (st.output_counts > 0)\n"
                "        rep = st.repetition_penalty.to(logits.dtype).unsqueeze(1)\n"
                "        # HF: positive logits are divided by the penalty, negative ones multiplied\n"
                "        penalized = torch.where(logits > 0, logits / rep, logits * rep)\n"
                "        logits = torch.where(seen, penalized, logits)\n"
                "        counts = st.output_counts.to(logits.dtype)\n",
                "        rep = st.repetition_penalty.to(logits.dtype).unsqueeze(1)\n"
                "        counts = st.output_counts.to(logits.dtype)\n"
                "        # HF: positive logits are divided by the penalty, negative ones multiplied (prompt and output)\n"
                "        for seen in (st.prompt_mask, counts > 0):\n"
                "            logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)\n",
            ),
            (
                SAMPLER,
                "        return logits / st.temperature.to(logits.dtype).unsqueeze(1)\n",
                "        return logits.div(st.temperature.to(logits.dtype).unsqueeze(1))\n",
            ),
        ],
    )
    argmax = Commit(
        "sampler: torch.argmax for the greedy rows",
        LENA,
        [(SAMPLER, "        tokens = logits.argmax(dim=-1)\n", "        tokens = torch.argmax(logits, dim=-1)\n")],
    )
    reqs = [
        sampled(60, 2809, 16, temperature=0.9, repetition_penalty=1.5, seed=5),
        greedy(48, 2909, 16) | {"sampling": {"temperature": 0.0, "repetition_penalty": 1.3, "ignore_eos": True}},
    ]
    return case(
        "ts-hard-repetition-twice",
        2809,
        "sampling",
        ["sgl-project/sglang-omni#1360", "huggingface/transformers#36642", "PaddlePaddle/FastDeploy#2954"],
        "repetition_penalty pushes harder than in transformers on tokens that were in the prompt",
        repro_toml({"arch": "llama", "seed": 2809}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "LogitsAdjuster.apply_penalties",
            "sampler",
            "the repetition penalty is applied once for the prompt mask and once for the output mask, so a token "
            "that is in the prompt and was also generated is penalised twice (logit / p^2 or * p^2)",
        ),
        [(13, stop_dedupe(OSEI)), (20, bug), (28, argmax)],
        bug,
    )


# ============================================================================= 2810 spec-decode: the verifier scores untruncated probs


def spec_untruncated_probs() -> HardCase:
    bug = Commit(
        "sampler: report the full distribution; rejection sampling documents what it reads\n\nSamplerOutput.probs "
        "is the distribution after penalties and temperature,\nbefore the top-k / top-p / min-p cuts, so callers "
        "scoring a token they did\nnot sample (logprobs, the speculative verifier) see its probability; the draw\n"
        "itself still uses the truncated distribution. accept_or_resample states that\nit takes the row's target "
        "distribution.",
        OSEI,
        [
            (
                SAMPLER,
                "    probs: torch.Tensor               # [S, V] distribution the tokens were drawn from\n",
                "    probs: torch.Tensor               # [S, V] after penalties and temperature, before the cuts\n",
            ),
            (
                SAMPLER,
                "        probs = truncated.softmax(dim=-1)\n"
                "        return SamplerOutput(sampled_token_ids=self.draw(probs, logits, st), probs=probs)\n",
                "        # draw from the truncated distribution; report the untruncated one\n"
                "        probs = logits.softmax(dim=-1)\n"
                "        return SamplerOutput(sampled_token_ids=self.draw(truncated.softmax(dim=-1), logits, st), "
                "probs=probs)\n",
            ),
            (
                REJECTION,
                '    """One random row: -> draft if accepted, else a draw from the residual distribution."""\n',
                '    """One random row, `probs` its target distribution (the sampler\'s output): -> the draft if\n'
                '    accepted, else a draw from the residual distribution."""\n',
            ),
        ],
    )
    nonzero = Commit(
        "spec_decode: torch.nonzero for the verified rows",
        ARJUN,
        [
            (
                REJECTION,
                "        for r in (drafts >= 0).nonzero().flatten().tolist():\n",
                "        for r in torch.nonzero(drafts >= 0).flatten().tolist():\n",
            )
        ],
    )
    motif = prompt(5, 2810)
    reqs = [
        {
            "prompt_ids": motif * 6 + prompt(3, 2910),
            "max_tokens": 24,
            "sampling": {"temperature": 1.0, "top_k": 5, "seed": 9, "ignore_eos": True},
        },
        sampled(20, 3010, 24, temperature=0.8, top_k=8, seed=41),
    ]
    tgt = target(speculative="ngram", num_speculative_tokens=3)
    return case(
        "ts-hard-spec-untruncated-probs",
        2810,
        "spec-decode",
        ["vllm-project/vllm#10198", "vllm-project/vllm#15063", "vllm-project/tpu-inference#634"],
        "ngram speculation with top_k sampling emits tokens that top_k should have excluded",
        repro_toml({"arch": "llama", "seed": 2810}, tgt, reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "Sampler.forward",
            "sampler",
            "SamplerOutput.probs became the untruncated distribution: the sampler's own draw still uses the "
            "top-k / top-p / min-p cut, but the rejection sampler accepts drafts and resamples after a rejection "
            "from probs, so speculated rows emit tokens outside the kept set",
        ),
        [(10, max_num_seqs_256(YUKI)), (26, bug), (30, nonzero)],
        bug,
    )


CASES = [
    decode_batch_bound(),
    gemma_post_attn_fused(),
    decode_row_position(),
    prefill_tile_local_keys(),
    spec_accept_count(),
    top_p_guard_max(),
    qwen2_theta_fallback(),
    gemma_head_forced_tie(),
    repetition_twice(),
    spec_untruncated_probs(),
]
