"""A fifth held-out set of hard-track tinyserve cases, each modelled on an upstream silent bug (issues 2601-2612).

    python -m benchmark.author ts-hard-prefill-capped-mask ...

Same shape as tinyserve_hard_heldout4: the shared commit stream (benchmark/authoring/tinyserve_stream.py,
release tags v0.2.0 / v0.3.0 / v0.4.0) with the case's own commits inserted on both sides of the culprit,
and `good_ref` the v0.2.0 tag, 25+ commits back. Every case carries a behaviour change on another path
and a numerically equivalent change on the failing path. Issue prose lives in
benchmark/authoring/issues/<id>.md.

Fault location mix (fixed before the cases were written):

    A in place: an existing function edited next to harmless edits of others        2601 2602
    B in a new helper the culprit creates (the caller now calls it)                  2603 2604
    C in the caller of a helper the culprit moves faithfully to another file          2605 2606
    D a default value / config reader / a second file                                2607 2608
    E functions of one file changed together: one wrong, the others correct          2609 2610
    F culprit touches 2 files; the bug is in the file the issue text does not hint at 2611 2612

Categories: attention (2601 2612), numerics (2602), kv-cache (2603), sampling (2604 2611),
spec-decode (2605), parallelism (2606), model-config (2607), positional-encoding (2608 2610),
kernel (2609). 2604 runs in bfloat16; 2604 and 2611 sample with a seed.
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, greedy, prompt
from benchmark.authoring.tinyserve_hard_upstream import case, target
from benchmark.authoring.tinyserve_stream import ATTN, BM, CONFIG, PARAMS, ROPE, ROT, RUNNER, SAMPLER, Commit

LAYERNORM = "tinyserve/layers/layernorm.py"
LLAMA = "tinyserve/models/llama.py"
GEMMA = "tinyserve/models/gemma2.py"
SPEC = "tinyserve/spec_decode/engine.py"
PROPOSERS = "tinyserve/spec_decode/proposers.py"
TP_LOADER = "tinyserve/distributed/loader.py"
TP_LAYERS = "tinyserve/distributed/layers.py"
TP_SHARDING = "tinyserve/distributed/sharding.py"
TOKENIZER = "tinyserve/tokenizer.py"

ROSA = "Rosa Delgado <rosa.delgado@tinyserve.dev>"
KOFI = "Kofi Mensah <kofi.mensah.ml@gmail.com>"
INGA = "Inga Halvorsen <inga.halvorsen@posteo.de>"
TARO = "Taro Fujita <taro.fujita@proton.me>"
ELIF = "Elif Kaya <elif.kaya@tinyserve.dev>"


def sampled(n: int, prompt_seed: int, max_tokens: int, **sampling) -> dict:
    """A sampled request: a random prompt of n ids, the given sampling options (seed among them)."""
    return {"prompt_ids": prompt(n, prompt_seed), "max_tokens": max_tokens, "sampling": sampling | {"ignore_eos": True}}


# ----------------------------------------------------------------------------- shared distractors
# Behaviour changes on paths the failing scenarios do not take (the second half of each pair is
# where the cases put them); the numerically equivalent rewrites on the failing paths are per case.


def max_num_seqs_256(author: str) -> Commit:
    """config (after stream commit 10): a larger default batch; no scenario here comes near it."""
    return Commit(
        "config: max_num_seqs defaults to 256\n\nThe KV cache, not the sequence cap, should bound a batch.",
        author,
        [(CONFIG, "    max_num_seqs: int = 128\n", "    max_num_seqs: int = 256\n")],
    )


def stop_dedupe(author: str) -> Commit:
    return Commit(
        "sampling_params: drop repeated stop strings and stop ids",
        author,
        [
            (
                PARAMS,
                "        self.stop, self.stop_token_ids = list(self.stop), list(self.stop_token_ids)\n",
                "        # clients merging presets send the same stop twice; each is matched once\n"
                "        self.stop, self.stop_token_ids = list(dict.fromkeys(self.stop)), list(dict.fromkeys("
                "self.stop_token_ids))\n",
            )
        ],
    )


def ngram_min_two(author: str) -> Commit:
    return Commit(
        "config: prompt lookup needs a 2-token match by default\n\nSingle-token matches proposed drafts that "
        "were rejected nine times out of ten.",
        author,
        [(CONFIG, "    ngram_min: int = 1                       #", "    ngram_min: int = 2                       #")],
    )


def logprobs_cap(author: str) -> Commit:
    return Commit(
        "sampling_params: at most 20 top logprobs per token, as the OpenAI API",
        author,
        [
            (
                PARAMS,
                "        if self.logprobs is not None and self.logprobs < 0:\n"
                '            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")\n',
                "        if self.logprobs is not None and not 0 <= self.logprobs <= 20:\n"
                '            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")\n',
            )
        ],
    )


def quant_group_64(author: str) -> Commit:
    return Commit(
        "config: int4 groups of 64 input columns by default\n\nHalves the scale / zero-point memory; 32 is still "
        "one option away.",
        author,
        [
            (
                CONFIG,
                "    quant_group_size: int = 32               # int4",
                "    quant_group_size: int = 64               # int4",
            )
        ],
    )


def draft_budget_4096(author: str) -> Commit:
    return Commit(
        "spec_decode: a 4096-token step budget for the draft model",
        author,
        [
            (
                PROPOSERS,
                "        budget = max(2048, config.max_model_len)\n",
                "        budget = max(4096, config.max_model_len)\n",
            )
        ],
    )


def max_len_8192(author: str) -> Commit:
    return Commit(
        "config: max_model_len defaults to at most 8192\n\nLong-context checkpoints sized their rotary tables and "
        "token budget for the full\nwindow; who needs more sets max_model_len.",
        author,
        [
            (
                CONFIG,
                "        self.max_model_len = self.max_model_len or self.model_config.max_position_embeddings\n",
                "        self.max_model_len = self.max_model_len or min(self.model_config.max_position_embeddings, 8192)\n",
            )
        ],
    )


def text_prompt_bos(author: str) -> Commit:
    return Commit(
        "tokenizer: text prompts start with the checkpoint's BOS",
        author,
        [
            (
                TOKENIZER,
                "        return self._tok.encode(text, add_special_tokens=False).ids\n",
                "        return self._tok.encode(text, add_special_tokens=True).ids\n",
            )
        ],
    )


def layernorm_fused_first(author: str) -> Commit:
    return Commit(
        "layernorm: the fused branch first, it is the one every layer but the first takes",
        author,
        [
            (
                LAYERNORM,
                "        if residual is None:\n"
                "            return self._rms_norm(x, self.weight, self.eps, self.weight_offset)\n"
                "        return self._fused_add_rms_norm(x, residual, self.weight, self.eps, self.weight_offset)\n",
                "        if residual is not None:\n"
                "            return self._fused_add_rms_norm(x, residual, self.weight, self.eps, self.weight_offset)\n"
                "        return self._rms_norm(x, self.weight, self.eps, self.weight_offset)\n",
            )
        ],
    )


def temperature_index(author: str) -> Commit:
    return Commit(
        "sampler: broadcast the temperature with [:, None]",
        author,
        [
            (
                SAMPLER,
                "        return logits / st.temperature.to(logits.dtype).unsqueeze(1)\n",
                "        return logits / st.temperature.to(logits.dtype)[:, None]\n",
            )
        ],
    )


# ============================================================================= 2601 attention: the mask goes in before the cap


def prefill_capped_mask() -> HardCase:
    bug = Commit(
        "ops/attention: one visibility mask per prefill tile\n\nThe tile's mask is built once and applied to the raw "
        "scores, so -inf enters in\none place; the decode kernel and the native twin spell their query positions "
        "the\nsame way.",
        TARO,
        [
            (
                ATTN,
                '        s = _softcap(torch.einsum("kgld,knd->kgln", qg, k), softcap)   # q carries the scale\n'
                '        s = s.masked_fill(~_visible(q_pos, torch.arange(t0, t1).view(1, -1), sliding_window), float("-inf"))\n',
                "        visible = _visible(q_pos, torch.arange(t0, t1).view(1, -1), sliding_window)       # [L, n]\n"
                '        s = torch.einsum("kgld,knd->kgln", qg, k).masked_fill(~visible, float("-inf"))   # q carries the scale\n'
                "        s = _softcap(s, softcap)\n",
            ),
            (
                ATTN,
                "    q_pos = (seq_lens - 1).view(-1, 1)\n",
                "    q_pos = seq_lens.view(-1, 1) - 1                      # [B, 1]\n",
            ),
            (
                ATTN,
                "        q_pos = torch.arange(n - (b - a), n).view(-1, 1)\n",
                "        q_pos = torch.arange(n - (b - a), n).unsqueeze(1)\n",
            ),
        ],
    )
    cap_mul = Commit(
        "ops/attention: soft-cap reads cap * tanh(s / cap)",
        KOFI,
        [
            (
                ATTN,
                "    return scores if not softcap else torch.tanh(scores / softcap) * softcap\n",
                "    return scores if not softcap else softcap * torch.tanh(scores / softcap)\n",
            )
        ],
    )
    model = {"arch": "gemma2", "seed": 2601, "initializer_range": 0.2, "attn_logit_softcapping": 5.0}
    return case(
        "ts-hard-prefill-capped-mask",
        2601,
        "attention",
        ["Dao-AILab/flash-attention#1025", "sgl-project/sgl-kernel-xpu#491", "onnx/onnx#7865"],
        "Gemma 2 with a small attention soft-cap: already the first generated token disagrees with transformers",
        repro_toml(model, target(), [greedy(22, 2601, 8)], good_ref="v0.2.0"),
        (
            ATTN,
            "paged_attention_prefill",
            "attention",
            "the prefill kernel now masks the scores before soft-capping them, so a masked (future) key's -inf "
            "is capped to -cap and keeps a weight of exp(-cap - max): with a small cap every prompt row attends "
            "to the tokens after it",
        ),
        [(12, max_num_seqs_256(ELIF)), (24, bug), (30, cap_mul)],
        bug,
    )


# ============================================================================= 2602 numerics: a sandwich norm without its offset


def gemma_post_ff_norm() -> HardCase:
    bug = Commit(
        "gemma2: norms from the shared layer classes\n\nThe decoder layer builds its four sandwich norms from the "
        "layernorm module's\nclasses like the llama layer does; the forward pass and the causal LM's\nbuilder "
        "document which norm is which.",
        INGA,
        [
            (
                GEMMA,
                "from tinyserve.layers.layernorm import GemmaRMSNorm\n",
                "from tinyserve.layers.layernorm import GemmaRMSNorm, RMSNorm\n",
            ),
            (
                GEMMA,
                "        self.post_feedforward_layernorm = GemmaRMSNorm(hs, eps, kernels)\n",
                "        self.post_feedforward_layernorm = RMSNorm(hs, eps, kernels)\n",
            ),
            (
                GEMMA,
                "        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))\n",
                "        # sandwich: normalise the attention output before it joins the residual stream\n"
                "        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))\n",
            ),
            (
                GEMMA,
                "    def build_model(self, cfg, kernels, max_model_len):\n",
                "    def build_model(self, cfg, kernels, max_model_len):\n"
                '        """Gemma scales the embedded tokens by sqrt(hidden_size)."""\n',
            ),
        ],
    )
    model = {"arch": "gemma2", "seed": 2602}
    return case(
        "ts-hard-gemma-post-ff-norm",
        2602,
        "numerics",
        ["vllm-project/vllm#53273", "sgl-project/sglang#6856", "ndif-team/nnterp#53"],
        "Gemma 2 output no longer matches transformers after updating (llama checkpoints are fine)",
        repro_toml(model, target(), [greedy(16, 2602, 8), greedy(9, 2702, 8)], good_ref="v0.2.0"),
        (
            GEMMA,
            "Gemma2DecoderLayer.__init__",
            "gemma2",
            "the post-feedforward norm is built as a plain RMSNorm, which scales by the stored w instead of "
            "Gemma's (1 + w): with Gemma's near-zero stored weights every layer's MLP contribution to the "
            "residual stream nearly vanishes",
        ),
        [(13, stop_dedupe(KOFI)), (25, bug), (31, layernorm_fused_first(ROSA))],
        bug,
    )


# ============================================================================= 2603 kv-cache: every layer gets the same cache


def kv_pool_shared_layers() -> HardCase:
    bug = Commit(
        "model_runner: carve the per-layer KV caches out of one allocation\n\nOne zeroed tensor backs the keys and "
        "values, so the cache is one block of\nmemory the allocator sees once; the layers get views of it.",
        ROSA,
        [
            (
                RUNNER,
                "class ModelRunner:\n",
                "def kv_cache_pairs(num_layers: int, shape: tuple, dtype: torch.dtype) -> list[tuple[torch.Tensor, "
                "torch.Tensor]]:\n"
                '    """(key, value) caches for `num_layers` attention layers, each [num_blocks, block_size, KVH, D],\n'
                '    views into one zeroed allocation."""\n'
                "    pool = torch.zeros((2, *shape), dtype=dtype)              # [2, num_blocks, block_size, KVH, D]\n"
                "    return [(pool[0], pool[1]) for _ in range(num_layers)]\n\n\n"
                "class ModelRunner:\n",
            ),
            (
                RUNNER,
                "        caches = []\n"
                "        for module in self.model.modules():\n"
                "            if isinstance(module, Attention):\n"
                "                module.k_cache = torch.zeros(shape, dtype=self.config.cache_dtype)\n"
                "                module.v_cache = torch.zeros(shape, dtype=self.config.cache_dtype)\n"
                "                caches.append((module.k_cache, module.v_cache))\n"
                "        return caches\n",
                "        layers = [m for m in self.model.modules() if isinstance(m, Attention)]\n"
                "        caches = kv_cache_pairs(len(layers), shape, self.config.cache_dtype)\n"
                "        for module, (k, v) in zip(layers, caches):\n"
                "            module.k_cache, module.v_cache = k, v\n"
                "        return caches\n",
            ),
            (
                RUNNER,
                "    def prepare_sampling(self, seqs: list[Sequence]) -> SamplingTensors:\n",
                "    def prepare_sampling(self, seqs: list[Sequence]) -> SamplingTensors:\n"
                '        """Per-row sampling parameters and token history of the sequences that sample."""\n',
            ),
        ],
    )
    positions_extend = Commit(
        "model_runner: extend the packed positions in place",
        KOFI,
        [
            (
                RUNNER,
                "            positions += range(first, first + n)\n",
                "            positions.extend(range(first, first + n))\n",
            )
        ],
    )
    return case(
        "ts-hard-kv-pool-shared-layers",
        2603,
        "kv-cache",
        ["vllm-project/vllm-ascend#11021", "vllm-project/vllm-ascend#15814", "ovg-project/kvcached#472"],
        "Only the first generated token is right; everything after it is garbage (any model, float32)",
        repro_toml(
            {"arch": "llama", "seed": 2603}, target(), [greedy(12, 2603, 8), greedy(7, 2703, 8)], good_ref="v0.2.0"
        ),
        (
            RUNNER,
            "kv_cache_pairs",
            "model_runner",
            "the pooled allocation holds a single key/value pair and every layer gets views of the same two "
            "tensors, so each layer overwrites the previous layers' cached keys and values and every decode step "
            "attends over the last layer's cache",
        ),
        [(14, ngram_min_two(TARO)), (26, bug), (31, positions_extend)],
        bug,
    )


# ============================================================================= 2604 sampling: the nucleus summed in bfloat16


def nucleus_half_cumsum() -> HardCase:
    bug = Commit(
        "sampler: sort the top-p nucleus in the model's dtype\n\nThe nucleus only needs the order of the logits: "
        "sorting the bf16 values\nmoves half the bytes of the fp32 copy, which is most of the sampler's time\non "
        "a large vocabulary. fp32 models are unchanged.",
        KOFI,
        [
            (
                SAMPLER,
                "class LogitsAdjuster(nn.Module):\n",
                "def nucleus_mask(logits: torch.Tensor, top_p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:\n"
                '    """[S, V], [S] -> bool [S, V]: True outside the top_p nucleus (the low tail whose mass is\n'
                "    <= 1 - top_p; the top token always survives). Sorted in `dtype`, the model's dtype: only\n"
                '    the order matters."""\n'
                "    sorted_logits, order = logits.to(dtype).sort(dim=-1, descending=False)\n"
                "    cum = torch.cumsum(sorted_logits.softmax(dim=-1), dim=-1)\n"
                "    remove_sorted = cum <= (1 - top_p).to(cum.dtype).unsqueeze(1)\n"
                "    remove_sorted[:, -1] = False\n"
                "    return remove_sorted.scatter(1, order, remove_sorted)\n\n\n"
                "class LogitsAdjuster(nn.Module):\n",
            ),
            (
                SAMPLER,
                "    def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:\n"
                "        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives\n"
                "        sorted_logits, order = logits.sort(dim=-1, descending=False)\n"
                "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
                "        cum = torch.cumsum(sorted_probs, dim=-1)\n"
                "        remove_sorted = cum <= (1 - top_p).unsqueeze(1)\n"
                "        remove_sorted[:, -1] = False\n"
                "        remove = remove_sorted.scatter(1, order, remove_sorted)\n"
                '        return logits.masked_fill(remove, float("-inf"))\n',
                "    def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor, dtype: torch.dtype = torch.float32"
                ") -> torch.Tensor:\n"
                '        return logits.masked_fill(nucleus_mask(logits, top_p, dtype), float("-inf"))\n',
            ),
            (
                SAMPLER,
                "    def forward(self, logits: torch.Tensor, st: SamplingTensors) -> SamplerOutput:\n"
                "        logits = self.adjuster(logits, st)\n",
                "    def forward(self, logits: torch.Tensor, st: SamplingTensors) -> SamplerOutput:\n"
                "        model_dtype = logits.dtype\n"
                "        logits = self.adjuster(logits, st)\n",
            ),
            (
                SAMPLER,
                "            truncated = self.apply_top_p(truncated, st.top_p)\n",
                "            truncated = self.apply_top_p(truncated, st.top_p, model_dtype)\n",
            ),
        ],
    )
    reqs = [sampled(14, 2604, 10, temperature=1.0, top_p=0.4, seed=17)]
    return case(
        "ts-hard-nucleus-half-cumsum",
        2604,
        "sampling",
        ["vllm-project/vllm#2510", "guoqingbao/attention.rs#9", "tenstorrent/tt-metal#41371"],
        "bfloat16: top_p sampling is nearly greedy now, float32 is fine",
        repro_toml({"arch": "llama", "seed": 2604}, target("bfloat16"), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "nucleus_mask",
            "sampler",
            "the nucleus is computed from a bfloat16 copy of the logits: the softmax and its cumulative sum run "
            "in bfloat16, whose running sum stops growing once it passes 0.5, so the tail cut by top_p is far "
            "too long and the nucleus shrinks to a handful of tokens",
        ),
        [(11, logprobs_cap(ROSA)), (23, bug), (32, temperature_index(ELIF))],
        bug,
    )


# ============================================================================= 2605 spec-decode: rollback keeps too few blocks

FREE_TAIL_METHOD = '''    def free_tail(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (they held rejected drafts only)."""
        keep = -(-num_tokens // self.block_size)
        for block_id in reversed(seq.block_table[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
        del seq.block_table[keep:]

    def cache_full_blocks(self, seq: Sequence) -> None:
'''


def spec_rollback_computed() -> HardCase:
    bug = Commit(
        "block_manager: free_tail, moved from spec_decode\n\nReleasing the blocks of rejected drafts is block "
        "bookkeeping; it lives next to\nfree() now, unchanged, and the rollback asks the block manager for it.",
        TARO,
        [
            (BM, "    def cache_full_blocks(self, seq: Sequence) -> None:\n", FREE_TAIL_METHOD),
            (
                SPEC,
                "            self.rejected_rows.append((self.step_count, seq.request_id, seq.num_tokens))\n"
                "            free_tail_blocks(self.block_manager, seq, seq.num_tokens + 1)\n",
                "            self.rejected_rows.append((self.step_count, seq.request_id, seq.num_tokens))\n"
                "            # blocks past the tokens whose K/V the cache keeps held rejected drafts only\n"
                "            self.block_manager.free_tail(seq, seq.num_computed_tokens)\n",
            ),
            (
                SPEC,
                "\n\ndef free_tail_blocks(block_manager, seq: Sequence, num_tokens: int) -> None:\n"
                '    """Give back the blocks past the first `num_tokens` tokens (they held rejected drafts only)."""\n'
                "    keep = -(-num_tokens // block_manager.block_size)\n"
                "    for block_id in reversed(seq.block_table[keep:]):\n"
                "        block = block_manager.blocks[block_id]\n"
                "        block.ref_count -= 1\n"
                "        if block.ref_count == 0:\n"
                "            block_manager.free_queue[block_id] = None\n"
                "    del seq.block_table[keep:]\n",
                "\n",
            ),
        ],
    )
    keep_rows = Commit(
        "spec_decode: trim a sequence's verification rows in place",
        INGA,
        [(SPEC, "            rs = rs[:keep + 1]\n", "            del rs[keep + 1:]\n")],
    )
    motif = prompt(5, 2605)
    reqs = [
        {"prompt_ids": motif * 5 + motif[:3], "max_tokens": 24, "sampling": {"temperature": 0.0, "ignore_eos": True}}
    ]
    tgt = target(speculative="ngram", num_speculative_tokens=3, block_size=4)
    return case(
        "ts-hard-spec-rollback-computed",
        2605,
        "spec-decode",
        ["openvinotoolkit/openvino.genai#4190", "Blaizzy/mlx-vlm#1155", "paiml/aprender#2014"],
        "ngram speculation with a small block_size: greedy output differs from running without speculation",
        repro_toml({"arch": "llama", "seed": 2605}, tgt, reqs, good_ref="v0.2.0"),
        (
            SPEC,
            "SpecDecodeEngine.roll_back",
            "spec_decode",
            "after a rejection the rollback keeps only the blocks covering the tokens computed before this step "
            "(num_computed_tokens, not yet advanced) instead of the accepted tokens plus the next one, so blocks "
            "holding this step's accepted keys and values go back to the pool and are replaced by fresh ones",
        ),
        [(15, draft_budget_4096(ELIF)), (27, bug), (33, keep_rows)],
        bug,
    )


# ============================================================================= 2606 parallelism: the row-parallel bias on every rank

SHARDING_MODULE = '''"""Which checkpoint tensors are split across tensor-parallel ranks, and how.

    q_proj, k_proj, v_proj, gate_proj, up_proj   rows (output features): heads / channels of rank r
    o_proj, down_proj                            columns (input features); bias on rank 0 only
    embed_tokens, lm_head                        rows (vocabulary ids)
    norms                                        whole
"""
from __future__ import annotations

import torch

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB_PARALLEL = ("embed_tokens", "lm_head")


def shard_tensor(name: str, tensor: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """A checkpoint tensor -> this rank's part of it (see the module docstring)."""
    module = name.split(".")[-2]
    if module in COLUMN_PARALLEL or module in VOCAB_PARALLEL:
        return tensor.chunk(tp, dim=0)[rank]
    if module in ROW_PARALLEL:
        if name.endswith(".bias"):
            return tensor if rank == 0 else torch.zeros_like(tensor)
        return tensor.chunk(tp, dim=1)[rank]
    return tensor
'''


def tp_bias_every_rank() -> HardCase:
    bug = Commit(
        "distributed: the sharding rules in their own module\n\nshard_tensor and the parallel-style tables move "
        "unchanged to\ndistributed/sharding.py so the checkpoint converter can use them without\nimporting the "
        "model code. The loader hands biases of unfused layers over without\nthe split call.",
        ELIF,
        [
            (TP_SHARDING, None, SHARDING_MODULE),
            (
                TP_LOADER,
                "from tinyserve.distributed.parallel_state import get_tp_rank, get_tp_size\n",
                "from tinyserve.distributed.parallel_state import get_tp_rank, get_tp_size\n"
                "from tinyserve.distributed.sharding import shard_tensor\n",
            ),
            (
                TP_LOADER,
                'COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")\n'
                'ROW_PARALLEL = ("o_proj", "down_proj")\n'
                'VOCAB_PARALLEL = ("embed_tokens", "lm_head")\n\n\n',
                "",
            ),
            (
                TP_LOADER,
                "def shard_tensor(name: str, tensor: torch.Tensor, rank: int, tp: int) -> torch.Tensor:\n"
                '    """A checkpoint tensor -> this rank\'s part of it (see the module docstring)."""\n'
                '    module = name.split(".")[-2]\n'
                "    if module in COLUMN_PARALLEL or module in VOCAB_PARALLEL:\n"
                "        return tensor.chunk(tp, dim=0)[rank]\n"
                "    if module in ROW_PARALLEL:\n"
                '        if name.endswith(".bias"):\n'
                "            return tensor if rank == 0 else torch.zeros_like(tensor)\n"
                "        return tensor.chunk(tp, dim=1)[rank]\n"
                "    return tensor\n\n\n",
                "",
            ),
            (
                TP_LOADER,
                "        part = shard_tensor(name, tensor, rank, tp)\n",
                "        # a bias is added after the matmul: only a fused (column) layer splits its output\n"
                '        part = tensor if name.endswith(".bias") and shard_id is None else shard_tensor(name, tensor, rank, tp)\n',
            ),
        ],
    )
    row_apply = Commit(
        "distributed: name the partial product before the all-reduce",
        TARO,
        [
            (
                TP_LAYERS,
                "        return all_reduce(self.apply(x))\n",
                "        partial = self.apply(x)          # this rank's input features only\n        return all_reduce(partial)\n",
            )
        ],
    )
    model = {"arch": "llama", "seed": 2606, "attention_bias": True, "mlp_bias": True, "perturb_init": True}
    return case(
        "ts-hard-tp-bias-every-rank",
        2606,
        "parallelism",
        ["huggingface/text-generation-inference#1036", "GeeeekExplorer/nano-vllm#99", "Wenyueh/MinivLLM#80"],
        "tensor_parallel_size=2 gives different tokens than a single process on a model with attention biases",
        repro_toml(model, target(tensor_parallel_size=2), [greedy(12, 2606, 6)], good_ref="v0.2.0"),
        (
            TP_LOADER,
            "load_sharded_weights",
            "distributed",
            "the loader hands the bias of every unfused layer to every rank whole, bypassing the sharding "
            "rule that gives a row-parallel bias (o_proj, down_proj) to rank 0 only, so after the all-reduce each "
            "such bias is added tensor_parallel_size times",
        ),
        [(16, quant_group_64(ROSA)), (26, bug), (32, row_apply)],
        bug,
    )


# ============================================================================= 2607 model-config: the final norm's default epsilon


def final_norm_default_eps() -> HardCase:
    bug = Commit(
        "layers: RMSNorm takes eps as a keyword, 1e-6 by default\n\nLike torch.nn.RMSNorm and the other layers: "
        "the kernels come first and eps\nis passed by name at every call site.",
        INGA,
        [
            (
                LAYERNORM,
                "    def __init__(self, hidden_size: int, eps: float, kernels):\n"
                "        super().__init__()\n"
                "        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)\n",
                "    def __init__(self, hidden_size: int, kernels, eps: float = 1e-6):\n"
                "        super().__init__()\n"
                "        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)\n",
            ),
            (
                LAYERNORM,
                "    def __init__(self, hidden_size: int, eps: float, kernels):\n"
                "        super().__init__(hidden_size, eps, kernels)\n",
                "    def __init__(self, hidden_size: int, kernels, eps: float = 1e-6):\n"
                "        super().__init__(hidden_size, kernels, eps=eps)\n",
            ),
            (
                LLAMA,
                "        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)\n"
                "        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)\n",
                "        self.input_layernorm = RMSNorm(cfg.hidden_size, kernels, eps=cfg.rms_norm_eps)\n"
                "        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, kernels, eps=cfg.rms_norm_eps)\n",
            ),
            (
                LLAMA,
                "        self.norm = self.norm_cls(cfg.hidden_size, cfg.rms_norm_eps, kernels)\n",
                "        self.norm = self.norm_cls(cfg.hidden_size, kernels)\n",
            ),
            (
                GEMMA,
                "        self.input_layernorm = GemmaRMSNorm(hs, eps, kernels)\n"
                "        self.post_attention_layernorm = GemmaRMSNorm(hs, eps, kernels)\n"
                "        self.pre_feedforward_layernorm = GemmaRMSNorm(hs, eps, kernels)\n"
                "        self.post_feedforward_layernorm = GemmaRMSNorm(hs, eps, kernels)\n",
                "        self.input_layernorm = GemmaRMSNorm(hs, kernels, eps=eps)\n"
                "        self.post_attention_layernorm = GemmaRMSNorm(hs, kernels, eps=eps)\n"
                "        self.pre_feedforward_layernorm = GemmaRMSNorm(hs, kernels, eps=eps)\n"
                "        self.post_feedforward_layernorm = GemmaRMSNorm(hs, kernels, eps=eps)\n",
            ),
        ],
    )
    model = {"arch": "llama", "seed": 2607, "rms_norm_eps": 1e-5, "initializer_range": 0.005}
    return case(
        "ts-hard-final-norm-default-eps",
        2607,
        "model-config",
        ["huggingface/transformers#38025", "meta-pytorch/torchtune#29", "PaddlePaddle/FastDeploy#2804"],
        "Llama-2-style checkpoint (rms_norm_eps 1e-5): logprobs drift from transformers after the upgrade",
        repro_toml(model, target(), [greedy(14, 2607, 8)], good_ref="v0.2.0"),
        (
            LLAMA,
            "LlamaModel.__init__",
            "llama",
            "when RMSNorm's eps became a keyword with a 1e-6 default, the model's final norm lost its "
            "argument: every other norm uses the checkpoint's rms_norm_eps, the last one before the LM head "
            "uses 1e-6",
        ),
        [(10, max_len_8192(KOFI)), (28, bug), (30, layernorm_fused_first(TARO))],
        bug,
    )


# ============================================================================= 2608 positional-encoding: YaRN's magnitude defaulted away


def yarn_attention_factor_default() -> HardCase:
    bug = Commit(
        "config: YaRN defaults filled in where config.json is read\n\nbeta_fast, beta_slow and attention_factor get "
        "their defaults once in\nrope_parameters; the rotary code reads the keys instead of repeating the\n"
        "fallbacks.",
        ROSA,
        [
            (
                CONFIG,
                '                          hf.get("original_max_position_embeddings", hf.get("max_position_embeddings", '
                "2048)))\n    return params\n",
                '                          hf.get("original_max_position_embeddings", hf.get("max_position_embeddings", '
                "2048)))\n"
                '    if params["rope_type"] == "yarn":\n'
                '        params.setdefault("beta_fast", 32.0)\n'
                '        params.setdefault("beta_slow", 1.0)\n'
                '        params.setdefault("attention_factor", 1.0)\n'
                "    return params\n",
            ),
            (
                ROPE,
                '    low, high = dim_for(rope.get("beta_fast") or 32), dim_for(rope.get("beta_slow") or 1)\n',
                '    low, high = dim_for(rope["beta_fast"]), dim_for(rope["beta_slow"])\n',
            ),
        ],
    )
    rot_list = Commit(
        "ops/rotary: rotated halves joined from a list",
        KOFI,
        [
            (
                ROT,
                "    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(t, -1)\n",
                "    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).view(t, -1)\n",
            )
        ],
    )
    model = {
        "arch": "llama",
        "seed": 2608,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 256,
        },
    }
    return case(
        "ts-hard-yarn-magnitude-default",
        2608,
        "positional-encoding",
        ["vllm-project/vllm#46280", "turboderp-org/exllamav3#259", "ml-explore/mlx-lm#1507"],
        "YaRN checkpoint (factor 4) stopped matching transformers from the very first token",
        repro_toml(model, target(), [greedy(18, 2608, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "rope_parameters",
            "config",
            "the config reader now fills attention_factor = 1.0 into every YaRN rope dict, so the rotary code "
            "never derives YaRN's magnitude 0.1 * ln(factor) + 1 and the cos/sin tables are unscaled",
        ),
        [(13, logprobs_cap(TARO)), (22, bug), (28, rot_list)],
        bug,
    )


# ============================================================================= 2609 kernel: split-KV merge against the max


def splitkv_merge_max() -> HardCase:
    bug = Commit(
        "ops/attention: fewer temporaries on the decode path\n\nThe cache scatter loops over (key, value), gather_kv "
        "indexes the blocks\ndirectly, and the partition merge weights each partition against the largest\n"
        "log-sum-exp instead of materialising their logsumexp.",
        ELIF,
        [
            (
                ATTN,
                "    kvh, d = key.shape[1], key.shape[2]\n"
                "    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)\n"
                "    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)\n",
                "    for cache, new in ((key_cache, key), (value_cache, value)):\n"
                "        cache.view(-1, *new.shape[1:]).index_copy_(0, slot_mapping, new)\n",
            ),
            (
                ATTN,
                "    blocks = cache.index_select(0, block_table[first:last])\n",
                "    blocks = cache[block_table[first:last]]                     # [nb, block_size, KVH, D]\n",
            ),
            (
                ATTN,
                "    lse = torch.logsumexp(lses, dim=0)\n    weights = torch.exp(lses - lse).nan_to_num(0.0)\n",
                "    # each partition's output is normalised already: weight it by its softmax mass,\n"
                "    # measured against the largest partition\n"
                "    top = lses.amax(dim=0)\n"
                "    weights = torch.exp(lses - top).nan_to_num(0.0)\n",
            ),
        ],
    )
    m_safe = Commit(
        "ops/attention: the partition's safe max with nan_to_num",
        INGA,
        [
            (
                ATTN,
                "    m = s.amax(-1, keepdim=True)\n    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n",
                "    m = s.amax(-1, keepdim=True)\n    m_safe = m.nan_to_num(neginf=0.0)                # a fully masked row\n",
            )
        ],
    )
    return case(
        "ts-hard-splitkv-merge-max",
        2609,
        "kernel",
        ["flashinfer-ai/flashinfer#58", "vectorch-ai/ScaleLLM#419", "vllm-project/vllm-xpu-kernels#204"],
        "Long prompts: the first generated token matches transformers, later ones drift (short prompts are fine)",
        repro_toml({"arch": "llama", "seed": 2609}, target(), [greedy(76, 2609, 10)], good_ref="v0.2.0"),
        (
            ATTN,
            "merge_attn_partitions",
            "attention",
            "the split-KV merge weights each partition by exp(lse_p - max lse) instead of exp(lse_p - "
            "logsumexp(lse)), so with two or more partitions (contexts over 64 tokens) the weights no longer sum "
            "to one and every decode output is scaled up",
        ),
        [(16, quant_group_64(KOFI)), (25, bug), (31, m_safe)],
        bug,
    )


# ============================================================================= 2610 positional-encoding: linear scaling through the base


def linear_rope_base() -> HardCase:
    bug = Commit(
        "rotary: every scaling variant derives its frequencies from _base_inv_freq\n\nDefault and linear scaling now "
        "both pass a base to _base_inv_freq (linear\nfolds its factor into it), and the cos/sin table applies the "
        "attention\nscaling once to the concatenated table.",
        TARO,
        [
            (
                ROPE,
                "def default_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):\n"
                '    return _base_inv_freq(rope["rope_theta"], dim), 1.0\n',
                "def default_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):\n"
                '    base = rope["rope_theta"]\n'
                "    return _base_inv_freq(base, dim), 1.0\n",
            ),
            (
                ROPE,
                "    # scaling positions by 1/factor == scaling frequencies by 1/factor\n"
                '    return _base_inv_freq(rope["rope_theta"], dim) / rope["factor"], 1.0\n',
                "    # interpolation stretches every wavelength by `factor`: fold it into the base\n"
                '    base = rope["rope_theta"] * rope["factor"]\n'
                "    return _base_inv_freq(base, dim), 1.0\n",
            ),
            (
                ROPE,
                "    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)\n",
                "    return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_scaling\n",
            ),
        ],
    )
    model = {
        "arch": "llama",
        "seed": 2610,
        "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    }
    return case(
        "ts-hard-linear-rope-base",
        2610,
        "positional-encoding",
        ["FranxYao/Long-Context-Data-Engineering#6", "allenai/OLMo-core#330", "WENGSYX/LMTuner#2"],
        "Position-interpolated (linear RoPE, factor 4) fine-tune produces different tokens than transformers",
        repro_toml(model, target(), [greedy(30, 2610, 8)], good_ref="v0.2.0"),
        (
            ROPE,
            "linear_inv_freq",
            "rotary_embedding",
            "linear scaling multiplies the RoPE base by the factor instead of dividing the frequencies by it, so "
            "frequency i is scaled by factor^(-2i/dim) (NTK-style) rather than 1/factor: the fastest dimensions "
            "are not interpolated at all",
        ),
        [(11, max_len_8192(INGA)), (21, bug), (27, layernorm_fused_first(KOFI))],
        bug,
    )


# ============================================================================= 2611 sampling: top_k = -1 keeps one token


def top_k_minus_one() -> HardCase:
    bug = Commit(
        "sampling_params: top_k=None means off\n\nOpenAI-style clients send null for an unset top_k; it is stored as "
        "0, and the\nsampler's per-row top_k column reads 0 as 'whole vocabulary'.",
        INGA,
        [
            (
                PARAMS,
                "        if self.top_k < -1:\n",
                "        self.top_k = 0 if self.top_k is None else self.top_k\n        if self.top_k < -1:\n",
            ),
            (
                PARAMS,
                "    top_k: int = 0                    # 0 or -1 = off\n",
                "    top_k: int | None = 0             # 0, -1 or None = off\n",
            ),
            (
                SAMPLER,
                "            top_k=col([p.top_k if p.top_k > 0 else vocab_size for p in params], torch.long).clamp(max=vocab_size),\n",
                "            # top_k 0 = the whole vocabulary (SamplingParams stores an unset top_k as 0)\n"
                "            top_k=col([p.top_k or vocab_size for p in params], torch.long).clamp(max=vocab_size),\n",
            ),
        ],
    )
    reqs = [sampled(14, 2611, 10, temperature=0.8, top_k=-1, seed=23)]
    return case(
        "ts-hard-top-k-minus-one",
        2611,
        "sampling",
        ["vllm-project/tpu-inference#1386", "intel/ipex-llm#10560", "abetlen/llama-cpp-python#220"],
        "top_k=-1 (the vLLM way to disable top-k) now makes sampling behave like greedy decoding",
        repro_toml({"arch": "llama", "seed": 2611}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "SamplingTensors.build",
            "sampler",
            "the per-row top_k column maps only 0 to the vocabulary size, so top_k = -1 passes through as -1; "
            "the top-k filter then reads the largest logit as the k-th and keeps only the top token, turning "
            "every top_k = -1 request into greedy decoding",
        ),
        [(12, logprobs_cap(KOFI)), (24, bug), (30, temperature_index(ROSA))],
        bug,
    )


# ============================================================================= 2612 attention: sliding window counted two ways


def window_left_keys() -> HardCase:
    bug = Commit(
        "ops/attention: a sliding window is the number of keys before the query\n\nAs flash-attn's window_size_left: "
        "the kernels take W - 1 (keys strictly before\nthe query that stay visible), and the config normalises "
        "sliding_window to it\nonce per layer.",
        KOFI,
        [
            (
                ATTN,
                "    mask = kv_pos <= q_pos\n"
                "    if sliding_window is not None:\n"
                "        mask &= kv_pos > q_pos - sliding_window\n",
                "    mask = kv_pos <= q_pos\n"
                "    if sliding_window is not None:\n"
                "        mask &= kv_pos >= q_pos - sliding_window     # the query and sliding_window keys before it\n",
            ),
            (
                ATTN,
                "    lo = 0 if sliding_window is None else max(0, q_start - sliding_window + 1)\n",
                "    lo = 0 if sliding_window is None else max(0, q_start - sliding_window)\n",
            ),
            (
                CONFIG,
                '    """Per-layer sliding window (None = full attention)."""\n',
                '    """Per-layer sliding window (None = full attention), as the kernels take it: the number of\n'
                '    keys before the query that stay visible (config.json\'s sliding_window - 1)."""\n',
            ),
            (
                CONFIG,
                "    if types is None:\n"
                "        return [window] * n\n"
                '    return [window if t == "sliding_attention" else None for t in types]\n',
                "    left = None if window is None else window - 1\n"
                "    if types is None:\n"
                "        return [window] * n\n"
                '    return [left if t == "sliding_attention" else None for t in types]\n',
            ),
        ],
    )
    tile = Commit(
        "ops/attention: 64-token prefill tiles\n\nHalves the online-softmax rescales on long prompts; equal up to "
        "float\nreassociation.",
        ROSA,
        [
            (
                ATTN,
                "KV_TILE_TOKENS = 32        # prefill: keys/values visited per online-softmax tile\n",
                "KV_TILE_TOKENS = 64        # prefill: keys/values visited per online-softmax tile\n",
            )
        ],
    )
    return case(
        "ts-hard-window-left-keys",
        2612,
        "attention",
        ["vllm-project/vllm#9679", "huggingface/transformers#39408", "zml/zml#763"],
        "Mistral: outputs differ from transformers once the prompt is longer than the sliding window",
        repro_toml({"arch": "mistral", "seed": 2612}, target(), [greedy(48, 2612, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "sliding_windows",
            "config",
            "the window now reaches the kernels as keys-before-the-query (W - 1), but only the layer_types branch "
            "subtracts one: a config without layer_types (Mistral) passes W through, so every query sees one key "
            "more than transformers' window",
        ),
        [(14, stop_dedupe(TARO)), (26, bug), (32, tile)],
        bug,
    )


CASES = [
    prefill_capped_mask(),
    gemma_post_ff_norm(),
    kv_pool_shared_layers(),
    nucleus_half_cumsum(),
    spec_rollback_computed(),
    tp_bias_every_rank(),
    final_norm_default_eps(),
    yarn_attention_factor_default(),
    splitkv_merge_max(),
    linear_rope_base(),
    top_k_minus_one(),
    window_left_keys(),
]
