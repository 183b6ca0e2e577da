"""Hard-track cases on tinyserve (issues 1501-1516 less 1504; docs/design.md §6b "Hard history").

    python -m benchmark.author [CASE ...] [--cases-dir DIR]   # writes these (and every other module's) cases

Each case is the shared commit stream (benchmark/authoring/tinyserve_stream.py: 34 commits of
docs, options, refactors, changed defaults, release bumps tagged v0.2.0 / v0.3.0 / v0.4.0)
with the case's culprit inserted at a chosen point, so every history is 35 commits long, holds
behaviour-changing distractors on other paths and numerically equivalent refactors on the failing
path on both sides of the culprit, and `good_ref` (where the reporter knows one) is a release
tag 20+ commits back. Issue prose lives in benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.tinyserve_stream import (
    ATTN,
    CONFIG,
    EMB,
    ROPE,
    RUNNER,
    SAMPLER,
    Commit,
    history,
)

SUBJECT = "tinyserve"
CASES_DIR = Path(__file__).resolve().parents[1] / "cases"
ISSUES_DIR = Path(__file__).resolve().parent / "issues"
BM = "tinyserve/engine/block_manager.py"
QUANT = "tinyserve/quantization.py"
QMM = "tinyserve/ops/quant_matmul.py"
LLAMA = "tinyserve/models/llama.py"
GEMMA = "tinyserve/models/gemma2.py"
ROT_OPS = "tinyserve/ops/rotary.py"
ACT_OPS = "tinyserve/ops/activation.py"

NORA = "Nora Lindgren <nora.lindgren@gmail.com>"
RAVI = "Ravi Shankar <ravi.shankar@tinyserve.dev>"
KEMAL = "Kemal Aydin <kemal.aydin@posteo.de>"
LUCIA = "Lucía Romero <lucia.romero.ml@gmail.com>"
IVAN = "Ivan Petrov <ivan.petrov@proton.me>"


@dataclass
class HardCase(CaseSpec):
    """A CaseSpec on the hard track; its history carries release tags (CaseSpec.tags)."""

    track: str = "hard"


def prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def greedy(n: int, seed: int, max_tokens: int, **extra) -> dict:
    return {
        "prompt_ids": prompt(n, seed),
        "max_tokens": max_tokens,
        "sampling": {"temperature": 0.0, "ignore_eos": True},
        **extra,
    }


def stream_case(
    id: str,
    issue_number: int,
    category: str,
    modeled_on: list[str],
    title: str,
    repro: str,
    truth: tuple[str, str, str, str],
    inserts: dict[int, list[Commit]],
    culprit: Commit,
    seed: int | None = None,
    base_steps: tuple = (),
) -> HardCase:
    """A hard case on the shared stream: the stream with `inserts` and the culprit, truth
    (file, function, component, mechanism), issue prose from issues/<id>.md. The history's dates
    are seeded by `seed` (default: the issue number)."""
    h = history(inserts, culprit, seed=issue_number if seed is None else seed)
    file, function, component, mechanism = truth
    return HardCase(
        subject=SUBJECT,
        id=id,
        issue_number=issue_number,
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
        tags=h.tags,
        base_steps=base_steps,
    )


def case(
    id: str,
    number: int,
    category: str,
    modeled_on: list[str],
    title: str,
    repro: str,
    truth: tuple[str, str, str, str],
    inserts: dict[int, list[Commit]],
    culprit: Commit,
) -> HardCase:
    # 16xx: the at-base cases hold 15xx (the number before the offset seeds the dates)
    return stream_case(id, number + 100, category, modeled_on, title, repro, truth, inserts, culprit, seed=number)


# ============================================================================= 1501 sampling: top-k batch max


def topk_batch_max() -> HardCase:
    bug = Commit(
        "sampler: one topk call for the whole batch\n\nSorting the full vocabulary per row was the slowest part "
        "of the sampler;\ntorch.topk with the largest k in the batch is enough to find each row's cut-off.",
        RAVI,
        [
            (
                SAMPLER,
                "        # keep every logit >= the k-th largest (ties at the boundary survive, as in HF)\n"
                "        sorted_desc = logits.sort(dim=-1, descending=True).values\n"
                "        kth = sorted_desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))\n",
                "        # keep every logit >= the k-th largest (ties at the boundary survive, as in HF);\n"
                "        # one topk with the batch's largest k instead of a full sort per row\n"
                "        k_max = int(top_k.max())\n"
                "        kth = logits.topk(k_max, dim=-1).values[:, -1:]\n",
            )
        ],
    )
    reqs = [
        {
            "prompt_ids": prompt(14, 11),
            "max_tokens": 8,
            "sampling": {"temperature": 1.0, "top_k": 4, "seed": 21, "ignore_eos": True},
        },
        {
            "prompt_ids": prompt(10, 12),
            "max_tokens": 8,
            "sampling": {"temperature": 1.0, "top_k": 200, "seed": 22, "ignore_eos": True},
        },
    ]
    return case(
        "ts-hard-topk-batch-max",
        1501,
        "sampling",
        ["vllm-project/vllm#14301", "flashinfer-ai/flashinfer#5324"],
        "top_k is ignored for some requests when requests with different top_k run together",
        repro_toml({"arch": "llama", "seed": 3}, {"engine": "tinyserve", "dtype": "float32"}, reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "Sampler.apply_top_k",
            "sampler",
            "top-k cut-off taken at the batch's largest k for every row, so a request with a smaller top_k batched "
            "with one with a larger top_k keeps too many tokens",
        ),
        {24: [bug]},
        bug,
    )


# ============================================================================= 1502 sampling: top-p before temperature


def top_p_untempered() -> HardCase:
    bug = Commit(
        "sampler: one softmax for top-p and min-p\n\nBoth filters computed their own softmax over the vocabulary; "
        "compute it once\nin forward and hand it to both.",
        LUCIA,
        [
            (
                SAMPLER,
                "    def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:\n"
                "        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives\n"
                "        sorted_logits, order = logits.sort(dim=-1, descending=False)\n"
                "        sorted_probs = sorted_logits.softmax(dim=-1)\n",
                "    def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:\n"
                "        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives\n"
                "        sorted_probs, order = probs.sort(dim=-1, descending=False)\n",
            ),
            (
                SAMPLER,
                "    def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:\n"
                "        probs = logits.softmax(dim=-1)\n",
                "    def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:\n",
            ),
            (
                SAMPLER,
                "    def forward(self, logits: torch.Tensor, st: SamplingTensors) -> SamplerOutput:\n"
                "        logits = self.adjuster(logits, st)\n"
                "        truncated = logits\n",
                "    def forward(self, logits: torch.Tensor, st: SamplingTensors) -> SamplerOutput:\n"
                "        probs = logits.float().softmax(dim=-1)     # shared by the probability filters below\n"
                "        logits = self.adjuster(logits, st)\n"
                "        truncated = logits\n",
            ),
            (
                SAMPLER,
                "            truncated = self.apply_top_p(truncated, st.top_p)\n",
                "            truncated = self.apply_top_p(truncated, st.top_p, probs)\n",
            ),
            (
                SAMPLER,
                "            truncated = self.apply_min_p(truncated, st.min_p)\n",
                "            truncated = self.apply_min_p(truncated, st.min_p, probs)\n",
            ),
        ],
    )
    reqs = [
        {
            "prompt_ids": prompt(12, 31),
            "max_tokens": 10,
            "sampling": {"temperature": 0.5, "top_p": 0.7, "seed": 5, "ignore_eos": True},
        },
    ]
    return case(
        "ts-hard-top-p-untempered",
        1502,
        "sampling",
        ["fishaudio/fish-speech#1150", "vllm-project/tpu-inference#1385", "huggingface/transformers#8686"],
        "top_p with a temperature other than 1 samples from the wrong set of tokens",
        repro_toml({"arch": "llama", "seed": 4}, {"engine": "tinyserve", "dtype": "float32"}, reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "Sampler.forward",
            "sampler",
            "the softmax shared by top-p and min-p is taken before penalties and temperature, so the nucleus is cut "
            "from the untempered distribution",
        ),
        {15: [bug]},
        bug,
    )


# ============================================================================= 1503 positional: YaRN betas


def yarn_betas() -> HardCase:
    bug = Commit(
        "rope: resolve YaRN defaults when the config is read\n\nbeta_fast / beta_slow / truncate were defaulted in "
        "three places; the rope\ndict now carries them, so the kernels read one value.",
        KEMAL,
        [
            (
                CONFIG,
                '    if params["rope_type"] in ("llama3", "yarn"):\n',
                '    if params["rope_type"] == "yarn":\n'
                '        params.setdefault("beta_fast", 1)\n'
                '        params.setdefault("beta_slow", 32)\n'
                '        params.setdefault("truncate", True)\n'
                '    if params["rope_type"] in ("llama3", "yarn"):\n',
            ),
            (
                ROPE,
                '    low, high = dim_for(rope.get("beta_fast") or 32), dim_for(rope.get("beta_slow") or 1)\n'
                '    if rope.get("truncate", True):\n',
                '    low, high = dim_for(rope["beta_fast"]), dim_for(rope["beta_slow"])\n    if rope["truncate"]:\n',
            ),
            (
                ROPE,
                "def yarn_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):\n",
                "def yarn_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):\n"
                '    """YaRN (NTK-by-parts): interpolate low frequencies, keep high ones; the rope dict\n'
                '    carries beta_fast / beta_slow / truncate (defaulted in config.rope_parameters)."""\n',
            ),
        ],
    )
    model = {
        "arch": "llama",
        "seed": 6,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 256,
        },
    }
    return case(
        "ts-hard-yarn-betas",
        1503,
        "positional-encoding",
        ["EricLBuehler/candle-vllm#285", "pytorch/torchtitan#3787"],
        "YaRN-scaled model: outputs differ from transformers from the first token",
        repro_toml(model, {"engine": "tinyserve", "dtype": "float32"}, [greedy(24, 41, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "rope_parameters",
            "rotary-embedding",
            "YaRN beta_fast / beta_slow defaults swapped (1 / 32 instead of 32 / 1) when the config omits them, so the "
            "interpolation ramp covers the wrong dimensions",
        ),
        {12: [bug]},
        bug,
    )


# ============================================================================= 1505 kv-cache: head-major layout


def kv_layout_heads() -> HardCase:
    bug = Commit(
        "kv cache: head-major blocks [num_blocks, KVH, block_size, D]\n\nA head's keys are now contiguous inside a "
        "block, which is what the decode\nkernel reads; gather and decode index the new layout.",
        NORA,
        [
            (
                RUNNER,
                '        """One [num_blocks, block_size, KVH, D] key and value tensor per attention layer."""\n'
                "        cfg = self.config.model_config\n"
                "        shape = (self.config.num_kv_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)\n",
                '        """One [num_blocks, KVH, block_size, D] key and value tensor per attention layer\n'
                '        (head-major: a head\'s keys are contiguous within a block)."""\n'
                "        cfg = self.config.model_config\n"
                "        shape = (self.config.num_kv_blocks, cfg.num_key_value_heads, self.block_size, cfg.head_dim)\n",
            ),
            (ATTN, "block_size, KVH, D]; block_tables", "KVH, block_size, D] (head-major); block_tables"),
            (
                ATTN,
                "    kvh, d = key.shape[1], key.shape[2]\n",
                "    _, kvh, d = key.shape\n",
            ),
            (
                ATTN,
                "    bs = cache.shape[1]\n    first, last = start // bs, -(-end // bs)\n"
                "    blocks = cache.index_select(0, block_table[first:last])\n",
                "    bs = cache.shape[2]\n    first, last = start // bs, -(-end // bs)\n"
                "    blocks = cache.index_select(0, block_table[first:last]).transpose(1, 2)   # [n, bs, KVH, D]\n",
            ),
            (ATTN, "    kvh = key_cache.shape[2]\n", "    kvh = key_cache.shape[1]\n"),
            (
                ATTN,
                "    bs = key_cache.shape[1]\n    blocks = block_tables[:, p0 // bs:(p0 + part) // bs]",
                "    bs = key_cache.shape[2]\n    blocks = block_tables[:, p0 // bs:(p0 + part) // bs]",
            ),
            (
                ATTN,
                "    k = key_cache[blocks].flatten(1, 2).to(q.dtype)                                   # [B, P, KVH, D]\n"
                "    v = value_cache[blocks].flatten(1, 2).to(q.dtype)\n",
                "    k = key_cache[blocks].transpose(2, 3).flatten(1, 2).to(q.dtype)                   # [B, P, KVH, D]\n"
                "    v = value_cache[blocks].transpose(2, 3).flatten(1, 2).to(q.dtype)\n",
            ),
            (
                ATTN,
                "    kvh, bs = key_cache.shape[2], key_cache.shape[1]\n",
                "    kvh, bs = key_cache.shape[1], key_cache.shape[2]\n",
            ),
        ],
    )
    return case(
        "ts-hard-kv-layout-heads",
        1505,
        "kv-cache",
        ["vllm-project/vllm#40956", "flashinfer-ai/flashinfer#3022"],
        "Garbage output on models with several KV heads; a single-KV-head model is fine",
        repro_toml(
            {"arch": "llama", "seed": 8},
            {"engine": "tinyserve", "dtype": "float32"},
            [greedy(20, 61, 8)],
            good_ref="v0.2.0",
        ),
        (
            ATTN,
            "write_to_kv_cache",
            "kv-cache",
            "after the cache became head-major [blocks, KVH, block_size, D], the scatter still views it token-major "
            "(slot, KVH, D), so with more than one KV head keys and values land in the wrong heads and slots",
        ),
        {21: [bug]},
        bug,
    )


# ============================================================================= 1506 kv-cache: stale prefix hash


def evict_stale_hash() -> HardCase:
    bug = Commit(
        "block_manager: evict lazily\n\nA reused block only needs its own hash cleared; the hash_to_block entry is\n"
        "overwritten when the block is cached again, which saves a dict lookup per\nfresh block.",
        RAVI,
        [
            (
                BM,
                "        block = self.blocks[block_id]\n        self._evict(block)\n        block.ref_count = 1\n",
                "        block = self.blocks[block_id]\n        block.hash = None      # its old prefix is gone; "
                "hash_to_block is updated on re-cache\n        block.ref_count = 1\n",
            ),
            (
                BM,
                "\n    def _evict(self, block: Block) -> None:\n"
                "        if block.hash is not None and self.hash_to_block.get(block.hash) == block.block_id:\n"
                "            del self.hash_to_block[block.hash]\n        block.hash = None\n",
                "",
            ),
            (
                BM,
                "                self.hash_to_block.setdefault(prev, block.block_id)\n",
                "                self.hash_to_block[prev] = block.block_id\n",
            ),
        ],
    )
    a = prompt(12, 71)
    reqs = [
        {"prompt_ids": a, "max_tokens": 2, "sampling": {"temperature": 0.0, "ignore_eos": True}},
        {
            "prompt_ids": prompt(24, 72),
            "max_tokens": 3,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
            "arrival_step": 3,
        },
        {
            "prompt_ids": a + prompt(3, 73),
            "max_tokens": 4,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
            "arrival_step": 7,
        },
    ]
    target = {
        "engine": "tinyserve",
        "dtype": "float32",
        "options": {"enable_prefix_caching": True, "block_size": 4, "num_kv_blocks": 8},
    }
    return case(
        "ts-hard-evict-stale-hash",
        1506,
        "kv-cache",
        ["ovg-project/kvcached#362", "kekzl/imp#1301"],
        "With prefix caching on a small cache, a repeated prompt sometimes gets a different answer",
        repro_toml({"arch": "llama", "seed": 9}, target, reqs),
        (
            BM,
            "BlockManager._allocate_fresh_block",
            "prefix-cache",
            "a block handed out again keeps its old hash_to_block entry, so a later prompt with the old prefix "
            "hits a block now holding another request's KV",
        ),
        {25: [bug]},
        bug,
    )


# ============================================================================= 1507 kernel: decode partitions floor


def decode_partition_floor() -> HardCase:
    bug = Commit(
        "ops/attention: size decode partitions from whole partitions\n\nThe partition loop now covers whole "
        "table columns, which drops the padding\ncolumn the last partition used to read.",
        KEMAL,
        [
            (
                ATTN,
                "    n_parts = -(-int(seq_lens.max()) // part)\n",
                "    n_parts = max(1, int(seq_lens.max()) // part)      # whole partitions of table columns\n",
            ),
            (
                ATTN,
                '    """One split-KV partition for every decoding sequence.\n',
                '    """One split-KV partition (whole blocks) for every decoding sequence.\n',
            ),
            (
                ATTN,
                '    """Combine per-partition outputs by their log-sum-exp. [P, ...,D], [P, ...] -> [..., D]."""\n',
                '    """Combine per-partition outputs by their log-sum-exp. [P, ..., D], [P, ...] -> [..., D].\n'
                '    A partition with no visible key has lse -inf and weight 0."""\n',
            ),
        ],
    )
    return case(
        "ts-hard-decode-partition-floor",
        1507,
        "kernel",
        ["ggml-org/llama.cpp#8311", "flashinfer-ai/flashinfer#58"],
        "Generation goes off the rails after the first token once the prompt is longer than ~64 tokens",
        repro_toml(
            {"arch": "llama", "seed": 10},
            {"engine": "tinyserve", "dtype": "float32"},
            [greedy(80, 81, 8)],
            good_ref="v0.2.0",
        ),
        (
            ATTN,
            "paged_attention_decode",
            "paged-attention",
            "number of split-KV partitions rounded down instead of up, so decode ignores every key past the last "
            "whole 64-token partition",
        ),
        {10: [bug]},
        bug,
    )


# ============================================================================= 1508 kernel: K/V scatter accumulates


def kv_scatter_accumulate() -> HardCase:
    bug = Commit(
        "ops/attention: scatter K/V with index_put_\n\nindex_copy_ on a view of the cache does not trace under "
        "torch.compile;\nindex_put_ on the flat view does, and accumulate=True keeps it deterministic\nwhen a "
        "speculative rollback writes the same slot twice in one step.",
        KEMAL,
        [
            (
                ATTN,
                "    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)\n"
                "    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)\n",
                "    key_cache.view(-1, kvh, d).index_put_((slot_mapping,), key, accumulate=True)\n"
                "    value_cache.view(-1, kvh, d).index_put_((slot_mapping,), value, accumulate=True)\n",
            ),
        ],
    )
    reqs = [greedy(20, 91, 4), {**greedy(22, 92, 8), "arrival_step": 6}]
    target = {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16, "num_kv_blocks": 3}}
    return case(
        "ts-hard-kv-scatter-accumulate",
        1508,
        "kernel",
        ["pytorch/pytorch#183575", "flashinfer-ai/flashinfer#3022"],
        "Second request on a small KV cache gives wrong output; the first one is fine",
        repro_toml({"arch": "llama", "seed": 11}, target, reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "write_to_kv_cache",
            "kv-cache",
            "K/V written with index_put_(accumulate=True), so a slot in a reused block holds the new value plus the "
            "previous request's stale one",
        ),
        {13: [bug]},
        bug,
    )


# ============================================================================= 1509 quantization: int4 nibble order


def int4_nibble_order() -> HardCase:
    bug = Commit(
        "quantization: pack int4 high nibble first (AWQ order)\n\nCheckpoints exported by AutoAWQ store the even "
        "column in the high nibble;\npack the same way so exported weights can be loaded as they are.",
        IVAN,
        [
            (
                QUANT,
                "    return pairs[..., 0] | (pairs[..., 1] << 4), scale, zero.to(torch.uint8)\n",
                "    return (pairs[..., 0] << 4) | pairs[..., 1], scale, zero.to(torch.uint8)\n",
            ),
            (
                QUANT,
                "    int4  per `quant_group_size` input columns, asymmetric: s = (max - min) / 15,\n"
                "          z = round(-min / s) in [0, 15],  q = round(w / s) + z in [0, 15], packed two per byte\n",
                "    int4  per `quant_group_size` input columns, asymmetric: s = (max - min) / 15,\n"
                "          z = round(-min / s) in [0, 15],  q = round(w / s) + z in [0, 15], packed two per byte\n"
                "          (even column in the high nibble, as AutoAWQ exports)\n",
            ),
            (
                QMM,
                "  int4: qweight uint8 [O, I/2] (even column in the low nibble), scale / zero [O, I/g] per group\n",
                "  int4: qweight uint8 [O, I/2] (two columns per byte), scale / zero [O, I/g] per group\n",
            ),
        ],
    )
    target = {"engine": "tinyserve", "dtype": "float32", "options": {"quantization": "int4", "quant_group_size": 32}}
    return case(
        "ts-hard-int4-nibble-order",
        1509,
        "quantization",
        ["ModelCloud/GPTQModel#2350", "flashinfer-ai/flashinfer#3497"],
        "int4 quantization output is nonsense, int8 is fine",
        repro_toml({"arch": "llama", "seed": 12}, target, [greedy(16, 101, 8)], good_ref="v0.2.0"),
        (
            QUANT,
            "quantize_group_int4",
            "quantization",
            "int4 values packed with the even column in the high nibble while unpacking still reads it from the low "
            "nibble, so every pair of input columns is swapped",
        ),
        {14: [bug]},
        bug,
    )


# ============================================================================= 1510 model-config: final soft-cap key


def gemma_final_softcap_key() -> HardCase:
    bug = Commit(
        "gemma2: soft-capping defaults in the model config\n\nThe 50 / 30 defaults lived in three places; "
        "ModelConfig now fills them for\ngemma2 checkpoints that omit the keys.",
        NORA,
        [
            (
                CONFIG,
                '            attn_logit_softcapping=hf.get("attn_logit_softcapping") if gemma else None,\n'
                '            final_logit_softcapping=hf.get("final_logit_softcapping") if gemma else None,\n',
                "            # gemma2 defaults (50 / 30) when the checkpoint leaves them out\n"
                '            attn_logit_softcapping=hf.get("attn_logit_softcapping", 50.0) if gemma else None,\n'
                '            final_logit_softcapping=hf.get("final_logit_softcap", 30.0) if gemma else None,\n',
            ),
            (
                EMB,
                '    """hidden [S, H] -> logits [S, V] in the model dtype, with Gemma\'s final soft-capping."""\n',
                '    """hidden [S, H] -> logits [S, V] in the model dtype, with Gemma\'s final soft-capping\n'
                '    (ModelConfig.final_logit_softcapping: 30.0 unless the checkpoint says otherwise)."""\n',
            ),
            (
                GEMMA,
                'query_pre_attn_scalar, sliding window on alternate layers, gelu-tanh, tied head."""\n',
                "query_pre_attn_scalar, sliding window on alternate layers, gelu-tanh, tied head.\n"
                'Soft-capping values (and their defaults) come from ModelConfig."""\n',
            ),
        ],
    )
    model = {"arch": "gemma2", "seed": 13, "final_logit_softcapping": 2.0, "initializer_range": 0.1}
    return case(
        "ts-hard-gemma-softcap-key",
        1510,
        "model-config",
        ["ggml-org/llama.cpp#21390", "vllm-project/vllm#5908"],
        "Fine-tuned Gemma 2 variant: logits differ from transformers (soft-capping setting seems ignored)",
        repro_toml(model, {"engine": "tinyserve", "dtype": "float32"}, [greedy(16, 111, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "ModelConfig.from_dict",
            "model-config",
            "final_logit_softcapping read under the wrong key with a 30.0 default, so a checkpoint's own value is "
            "ignored",
        ),
        {22: [bug]},
        bug,
    )


# ============================================================================= 1511 batching: decode rows sorted


def decode_rows_sorted() -> HardCase:
    bug = Commit(
        "ops/attention: decode rows longest context first\n\nThe split-KV kernel pads every row to the longest "
        "context; sorted rows let it\ntrim partitions for short ones in a follow-up.",
        RAVI,
        [
            (
                ATTN,
                "    if decode.numel():\n"
                "        rows = query_start_loc[decode]\n"
                "        out[rows] = paged_attention_decode(query[rows], key_cache, value_cache, block_tables[decode],\n"
                "                                           seq_lens[decode], scale, sliding_window, softcap)\n",
                "    if decode.numel():\n"
                "        lens = seq_lens[decode]\n"
                "        order = lens.argsort(descending=True, stable=True)      # longest context first\n"
                "        rows = query_start_loc[decode][order]\n"
                "        out[rows] = paged_attention_decode(query[rows], key_cache, value_cache, block_tables[decode],\n"
                "                                           lens[order], scale, sliding_window, softcap)\n",
            ),
            (
                ATTN,
                '    """One new token per sequence, split-KV. q [B, H, D] -> [B, H, D]."""\n',
                '    """One new token per sequence, split-KV (rows in any order). q [B, H, D] -> [B, H, D]."""\n',
            ),
        ],
    )
    reqs = [greedy(9, 121, 8), greedy(30, 122, 8)]
    return case(
        "ts-hard-decode-rows-sorted",
        1511,
        "batching",
        ["NVIDIA/TensorRT-LLM#8813", "flashinfer-ai/flashinfer#5324"],
        "Batched requests produce wrong continuations; each request alone is fine",
        repro_toml({"arch": "llama", "seed": 14}, {"engine": "tinyserve", "dtype": "float32"}, reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "paged_attention",
            "paged-attention",
            "decode rows reordered by context length while block tables stay in batch order, so in a batch of "
            "requests with different lengths each decode reads another request's KV blocks",
        ),
        {23: [bug]},
        bug,
    )


# ============================================================================= 1512 attention: SWA decode skip


def swa_decode_skip() -> HardCase:
    bug = Commit(
        "ops/attention: skip decode partitions left of the sliding window\n\nWith a 4k window and 32k contexts most "
        "partitions hold no visible key;\nstart the split-KV loop at the window.",
        KEMAL,
        [
            (
                ATTN,
                "    parts = [_decode_partition(qg, key_cache, value_cache, tables, seq_lens, p * part, part,\n"
                "                               scale, sliding_window, softcap) for p in range(n_parts)]\n",
                "    # partitions wholly left of the window hold no visible key\n"
                "    first = 0 if sliding_window is None else max(0, int(seq_lens.max()) - sliding_window) // part\n"
                "    parts = [_decode_partition(qg, key_cache, value_cache, tables, seq_lens, p * part, part,\n"
                "                               scale, sliding_window, softcap) for p in range(first, n_parts)]\n",
            ),
        ],
    )
    reqs = [greedy(150, 131, 6), greedy(90, 132, 6)]
    model = {"arch": "mistral", "seed": 15, "sliding_window": 16}
    return case(
        "ts-hard-swa-decode-skip",
        1512,
        "attention",
        ["sgl-project/sglang#4807", "vllm-project/vllm#5908"],
        "Mistral: shorter requests in a batch with a long one degrade after the first token",
        repro_toml(model, {"engine": "tinyserve", "dtype": "float32"}, reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "paged_attention_decode",
            "paged-attention",
            "the first sliding-window partition is computed from the batch's longest sequence, so shorter sequences "
            "in the batch skip the partitions holding their own window",
        ),
        {20: [bug]},
        bug,
    )


# ============================================================================= 1513 model-config: attention scale


def attn_scale_head_dim() -> HardCase:
    bug = Commit(
        "models: attention scale from the model config\n\nllama and gemma2 each derived the softmax scale; "
        "ModelConfig.attn_scale is\nnow the one place (query_pre_attn_scalar where set).",
        NORA,
        [
            (
                CONFIG,
                "    @classmethod\n    def from_dir(",
                "    @property\n    def attn_scale(self) -> float:\n"
                '        """Softmax scale: query_pre_attn_scalar ** -0.5 where set (gemma2), else 1/sqrt(head size)."""\n'
                "        return (self.query_pre_attn_scalar or self.hidden_size // self.num_attention_heads) ** -0.5\n\n"
                "    @classmethod\n    def from_dir(",
            ),
            (
                LLAMA,
                "        self.attn = Attention(h, kvh, d, scale if scale is not None else d ** -0.5, kernels,\n",
                "        self.attn = Attention(h, kvh, d, scale if scale is not None else cfg.attn_scale, kernels,\n",
            ),
            (
                GEMMA,
                "        scale = cfg.query_pre_attn_scalar ** -0.5\n",
                "        scale = cfg.attn_scale\n",
            ),
        ],
    )
    model = {"arch": "llama", "seed": 16, "head_dim": 32}
    return case(
        "ts-hard-attn-scale-head-dim",
        1513,
        "model-config",
        ["karpathy/ng-video-lecture#6", "Graylab/DL4Proteins-notebooks#12"],
        "Model with head_dim larger than hidden_size / num_heads gives different greedy output than transformers",
        repro_toml(model, {"engine": "tinyserve", "dtype": "float32"}, [greedy(16, 141, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "ModelConfig.attn_scale",
            "model-config",
            "softmax scale derived from hidden_size // num_attention_heads instead of head_dim, wrong whenever the "
            "config sets a different head_dim",
        ),
        {18: [bug]},
        bug,
    )


# ============================================================================= 1514 positional: rotary layout default


def rotary_neox_default() -> HardCase:
    bug = Commit(
        "ops/rotary: GPT-J (interleaved) layout in the rotary kernel\n\nis_neox selects rotate-half (neox) or "
        "interleaved pairs (GPT-J), so ported\nGPT-J-style checkpoints can share the kernel.",
        LUCIA,
        [
            (
                ROT_OPS,
                "def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:\n"
                "    # x [T, N*D]; cos/sin [T, D/2] -> [T, N*D]\n"
                "    t = x.shape[0]\n"
                "    x = x.view(t, -1, head_dim)\n"
                "    half = head_dim // 2\n"
                "    x1, x2 = x[..., :half], x[..., half:]\n",
                "def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, is_neox: bool) -> torch.Tensor:\n"
                "    # x [T, N*D]; cos/sin [T, D/2] -> [T, N*D]; neox: rotate halves, else interleaved pairs\n"
                "    t = x.shape[0]\n"
                "    x = x.view(t, -1, head_dim)\n"
                "    half = head_dim // 2\n"
                "    x1, x2 = (x[..., :half], x[..., half:]) if is_neox else (x[..., 0::2], x[..., 1::2])\n",
            ),
            (
                ROT_OPS,
                "                     cos_sin_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:\n"
                "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)\n"
                "    return _rotate(query, cos, sin, head_dim), _rotate(key, cos, sin, head_dim)\n",
                "                     cos_sin_cache: torch.Tensor, head_dim: int,\n"
                "                     is_neox: bool = False) -> tuple[torch.Tensor, torch.Tensor]:\n"
                "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)\n"
                "    return _rotate(query, cos, sin, head_dim, is_neox), _rotate(key, cos, sin, head_dim, is_neox)\n",
            ),
        ],
    )
    return case(
        "ts-hard-rotary-neox-default",
        1514,
        "positional-encoding",
        ["flashinfer-ai/flashinfer#619", "GaijinEntertainment/daScript#3479"],
        "qwen2 checkpoint: every output wrong after upgrading from 0.2.0",
        repro_toml(
            {"arch": "qwen2", "seed": 17},
            {"engine": "tinyserve", "dtype": "float32"},
            [greedy(16, 151, 8)],
            good_ref="v0.2.0",
        ),
        (
            ROT_OPS,
            "rotary_embedding",
            "rotary-embedding",
            "the rotary kernel gained an is_neox switch defaulting to the interleaved (GPT-J) layout, and callers do not "
            "pass it, so llama-family q/k are rotated in the wrong pairs",
        ),
        {27: [bug]},
        bug,
    )


# ============================================================================= 1515 positional: llama3 smoothing band


def llama3_smooth_band() -> HardCase:
    bug = Commit(
        "rope: llama3 scaling with the band edges named\n\nlow_freq_wavelen / high_freq_wavelen spelled out like the "
        "Meta reference code.",
        IVAN,
        [
            (
                ROPE,
                "    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)\n"
                "    smooth = (old_len / wavelen - low) / (high - low)\n",
                "    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high\n"
                "    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)\n"
                "    smooth = (old_len / wavelen - high) / (high - low)\n",
            ),
            (
                ROPE,
                "    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)\n",
                "    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)\n",
            ),
        ],
    )
    model = {
        "arch": "llama",
        "seed": 18,
        "rope_parameters": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
            "rope_theta": 10000.0,
        },
    }
    return case(
        "ts-hard-llama3-smooth-band",
        1515,
        "positional-encoding",
        ["ml-explore/mlx-examples#907", "ggml-org/llama.cpp#8676"],
        "Llama-3.1-style rope scaling: logits differ from transformers from the second token on",
        repro_toml(model, {"engine": "tinyserve", "dtype": "float32"}, [greedy(24, 161, 8)], good_ref="v0.2.0"),
        (
            ROPE,
            "llama3_inv_freq",
            "rotary-embedding",
            "llama3 smoothing factor offset by high_freq_factor instead of low_freq_factor, so the medium-frequency "
            "band blends the wrong amounts of scaled and unscaled frequencies",
        ),
        {16: [bug]},
        bug,
    )


# ============================================================================= 1516 kernel: fused [up | gate] layout


def up_gate_layout() -> HardCase:
    bug = Commit(
        "mlp: fuse up_proj before gate_proj\n\nThe fused projection is now [up | gate], the order most exported "
        "fused\ncheckpoints use; the activation kernels split it accordingly.",
        RAVI,
        [
            (
                LLAMA,
                '"gate_up_proj": ["gate_proj", "up_proj"]}',
                '"gate_up_proj": ["up_proj", "gate_proj"]}',
            ),
            (
                ACT_OPS,
                "    # [T, 2I] -> [T, I]\n    gate, up = x.split(x.shape[-1] // 2, dim=-1)\n",
                "    # [T, 2I] = [up | gate] -> [T, I]\n    up, gate = x.split(x.shape[-1] // 2, dim=-1)\n",
            ),
            (
                ACT_OPS,
                "    gate, up = x.chunk(2, dim=-1)\n    g = gate.to(torch.promote_types(x.dtype, torch.float32))\n"
                "    return (g / (1.0",
                "    up, gate = x.chunk(2, dim=-1)\n    g = gate.to(torch.promote_types(x.dtype, torch.float32))\n"
                "    return (g / (1.0",
            ),
            (
                ACT_OPS,
                "    # [T, 2I] -> [T, I]; 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))\n"
                "    gate, up = x.chunk(2, dim=-1)\n",
                "    # [T, 2I] = [up | gate] -> [T, I]; 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))\n"
                "    up, gate = x.chunk(2, dim=-1)\n",
            ),
            (
                ACT_OPS,
                '"""Gated MLP activations: act(gate) * up over a fused [gate | up] projection."""',
                '"""Gated MLP activations: act(gate) * up over a fused [up | gate] projection."""',
            ),
        ],
    )
    return case(
        "ts-hard-up-gate-layout",
        1516,
        "kernel",
        ["vllm-project/vllm#3775", "vllm-project/vllm#40956"],
        "Gemma 2 output wrong after upgrading; llama checkpoints still fine",
        repro_toml(
            {"arch": "gemma2", "seed": 19},
            {"engine": "tinyserve", "dtype": "float32"},
            [greedy(16, 171, 8)],
            good_ref="v0.2.0",
        ),
        (
            ACT_OPS,
            "gelu_tanh_and_mul",
            "activation",
            "the fused gate_up projection became [up | gate] and the silu kernels and native twins were updated, but the "
            "optimized gelu kernel still takes the first half as the gate, so gemma computes gelu(up) * gate",
        ),
        {17: [bug]},
        bug,
    )


CASES = [
    topk_batch_max(),
    top_p_untempered(),
    yarn_betas(),
    kv_layout_heads(),
    evict_stale_hash(),
    decode_partition_floor(),
    kv_scatter_accumulate(),
    int4_nibble_order(),
    gemma_final_softcap_key(),
    decode_rows_sorted(),
    swa_decode_skip(),
    attn_scale_head_dim(),
    rotary_neox_default(),
    llama3_smooth_band(),
    up_gate_layout(),
]
