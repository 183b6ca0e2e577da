"""A third held-out set of hard-track tinyserve cases, each modelled on an upstream silent bug (issues 2201-2212).

    python -m benchmark.author ts-hard-top-p-crossing ...

Same shape as tinyserve_hard_upstream and tinyserve_hard_heldout: the shared commit stream
(benchmark/authoring/tinyserve_stream.py, release tags v0.2.0 / v0.3.0 / v0.4.0) with the case's own
commits inserted on both sides of the culprit, and `good_ref` the v0.2.0 tag. The fault sits in
varied places: four in an existing function the culprit edits in place next to harmless edits of
other functions, three in a helper the culprit extracts, three in the caller of a faithfully
extracted helper, two in a dataclass default or a second file the failing path reads.
Issue prose lives in benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, greedy, prompt
from benchmark.authoring.tinyserve_hard_upstream import case, target
from benchmark.authoring.tinyserve_stream import (
    ACT,
    ATTN,
    BM,
    CONFIG,
    LOADER,
    MAIN,
    PARAMS,
    ROPE,
    RUNNER,
    SAMPLER,
    SEQ,
    Commit,
)

QUANT = "tinyserve/quantization.py"
QMM = "tinyserve/ops/quant_matmul.py"
ACT_LAYER = "tinyserve/layers/activation.py"
OPS_INIT = "tinyserve/ops/__init__.py"
EMB = "tinyserve/layers/embedding.py"

INES = "Inès Laurent <ines.laurent@tinyserve.dev>"
KOFI = "Kofi Mensah <kofi.mensah@gmail.com>"
LENA = "Lena Fischer <lena.fischer@posteo.de>"
ARJUN = "Arjun Mehta <arjun.mehta.ml@proton.me>"
SOFIA = "Sofia Andersson <sofia.andersson@tinyserve.dev>"

GREEDY = {"temperature": 0.0, "ignore_eos": True}


# ============================================================================= 2201 sampling: top-p drops the crossing token

TOP_P_TEST = """from __future__ import annotations

import torch

from tinyserve.layers.sampler import Sampler


def test_top_p_one_keeps_everything():
    logits = torch.randn(3, 40)
    out = Sampler.apply_top_p(logits, torch.ones(3))
    assert torch.isfinite(out).all()


def test_top_p_keeps_the_top_token():
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0]])
    out = Sampler.apply_top_p(logits, torch.tensor([0.1]))
    assert torch.isfinite(out[0, 0]) and torch.isinf(out[0, 1:]).all()
"""


def top_p_crossing() -> HardCase:
    max_tokens_default = Commit(
        "sampling_params: max_tokens defaults to 256\n\n16 cut most chat answers short; the OpenAI server passes its own "
        "value anyway.",
        KOFI,
        [(PARAMS, "    max_tokens: int = 16\n", "    max_tokens: int = 256\n")],
    )
    bug = Commit(
        "sampler: top-p over a descending sort, like top-k\n\nBoth filters now read the vocabulary from the most likely "
        "token down, so the\nnucleus is the head of the sorted row: its cumulative mass is compared to top_p\ndirectly "
        "instead of the tail's to 1 - top_p. top-k and min-p keep their math;\nlocal names follow the same convention. "
        "Tests added.",
        INES,
        [
            (
                SAMPLER,
                "        sorted_desc = logits.sort(dim=-1, descending=True).values\n"
                "        kth = sorted_desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))\n",
                "        desc = logits.sort(dim=-1, descending=True).values\n"
                "        kth = desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))\n",
            ),
            (
                SAMPLER,
                "        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives\n"
                "        sorted_logits, order = logits.sort(dim=-1, descending=False)\n"
                "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
                "        cum = torch.cumsum(sorted_probs, dim=-1)\n"
                "        remove_sorted = cum <= (1 - top_p).unsqueeze(1)\n"
                "        remove_sorted[:, -1] = False\n",
                "        # keep the head of the distribution up to top_p mass; the top token always survives\n"
                "        desc, order = logits.sort(dim=-1, descending=True)\n"
                "        cum = torch.cumsum(desc.softmax(dim=-1), dim=-1)\n"
                "        remove_sorted = cum > top_p.unsqueeze(1)\n"
                "        remove_sorted[:, 0] = False\n",
            ),
            (
                SAMPLER,
                "        threshold = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)\n"
                '        return logits.masked_fill(probs < threshold, float("-inf"))\n',
                "        floor = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)\n"
                '        return logits.masked_fill(probs < floor, float("-inf"))\n',
            ),
            ("tests/test_sampler_top_p.py", None, TOP_P_TEST),
        ],
    )
    softmax_fn = Commit(
        "sampler: torch.softmax for the final distribution",
        ARJUN,
        [
            (
                SAMPLER,
                "        probs = truncated.softmax(dim=-1)\n",
                "        probs = torch.softmax(truncated, dim=-1)\n",
            )
        ],
    )
    sampling = {"temperature": 0.9, "top_p": 0.6, "seed": 11, "ignore_eos": True}
    reqs = [{"prompt_ids": prompt(12, 2201), "max_tokens": 8, "sampling": sampling}]
    return case(
        "ts-hard-top-p-crossing",
        2201,
        "sampling",
        ["fishaudio/fish-speech#1171", "Biohub/esm#360", "thu-nics/C2C#21"],
        "top_p sampling is noticeably more conservative than transformers at the same settings",
        repro_toml({"arch": "llama", "seed": 201}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "Sampler.apply_top_p",
            "sampler",
            "the descending-sort nucleus removes every token whose cumulative mass (itself included) exceeds top_p, "
            "so the token that crosses the threshold is dropped and the kept mass is always below top_p",
        ),
        [(10, max_tokens_default), (16, bug), (25, softmax_fn)],
        bug,
    )


# ============================================================================= 2202 positional-encoding: YaRN truncate default

YARN_TEST = """from __future__ import annotations

from tinyserve.layers.rotary_embedding import yarn_inv_freq


def test_yarn_keeps_high_frequencies():
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 256}
    inv_freq, scale = yarn_inv_freq(rope, 16, 1024)
    assert abs(float(inv_freq[0]) - 1.0) < 1e-6 and scale > 1.0
"""


def yarn_truncate_default() -> HardCase:
    num_blocks_default = Commit(
        "config: size the default KV cache for 16k tokens\n\n8k tokens was too small for the long-context models people "
        "now serve.",
        SOFIA,
        [(CONFIG, "-(-8192 // self.block_size)", "-(-16384 // self.block_size)")],
    )
    bug = Commit(
        "rotary: YaRN takes its options from the rope dict in one place\n\nbeta_fast / beta_slow / truncate are read "
        "where the ramp is built, the mscale\nhelper gets an early return, and the interpolation blend is written as "
        "one\nexpression. truncate follows the gpt-oss convention: the correction range is\nrounded to whole "
        "dimensions only when the config asks for it.",
        ARJUN,
        [
            (
                ROPE,
                "def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:\n"
                "    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0\n",
                "def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:\n"
                "    if scale <= 1:\n"
                "        return 1.0\n"
                "    return 0.1 * mscale * math.log(scale) + 1.0\n",
            ),
            (
                ROPE,
                '    low, high = dim_for(rope.get("beta_fast") or 32), dim_for(rope.get("beta_slow") or 1)\n'
                '    if rope.get("truncate", True):\n',
                '    beta_fast, beta_slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1\n'
                "    low, high = dim_for(beta_fast), dim_for(beta_slow)\n"
                '    if rope.get("truncate", False):   # gpt-oss style configs ask for whole-dimension bounds\n',
            ),
            (
                ROPE,
                "    extrapolation_weight = 1 - ramp\n"
                "    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * "
                "extrapolation_weight\n",
                "    # ramp 0: extrapolate (keep the frequency), ramp 1: interpolate (divide it by factor)\n"
                "    inv_freq = (1.0 / pos_freqs) * (1 - ramp) + (1.0 / (factor * pos_freqs)) * ramp\n",
            ),
            ("tests/test_rope_yarn.py", None, YARN_TEST),
        ],
    )
    outer_freqs = Commit(
        "rotary: cos/sin from one angle table",
        LENA,
        [
            (
                ROPE,
                "    freqs = torch.outer(positions.float(), inv_freq.float())\n"
                "    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)\n",
                "    angles = torch.outer(positions.float(), inv_freq.float())\n"
                "    return torch.cat((angles.cos(), angles.sin()), dim=-1) * attention_scaling\n",
            )
        ],
    )
    model = {
        "arch": "llama",
        "seed": 202,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 256,
        },
    }
    return case(
        "ts-hard-yarn-truncate-default",
        2202,
        "positional-encoding",
        ["vllm-project/vllm#28244", "apache/tvm#18576", "pytorch/torchtitan#4215"],
        "YaRN-scaled llama: greedy output drifts from transformers a few dozen tokens into the prompt",
        repro_toml(model, target(), [greedy(48, 2202, 8)], good_ref="v0.2.0"),
        (
            ROPE,
            "_yarn_correction_range",
            "rotary_embedding",
            "the YaRN correction range is rounded to whole dimensions only when the config sets truncate, but "
            "transformers rounds unless it is set to false: with the usual configs the ramp runs between fractional "
            "bounds and the blended frequencies of the ramp dimensions differ",
        ),
        [(12, num_blocks_default), (17, bug), (26, outer_freqs)],
        bug,
    )


# ============================================================================= 2203 attention: gather_kv assumes block-aligned tiles

GATHER_TEST = """from __future__ import annotations

import torch

from tinyserve.ops.attention import gather_kv


def test_gather_kv_reads_a_sequence_in_order():
    cache = torch.arange(4 * 16 * 2 * 3, dtype=torch.float32).view(4, 16, 2, 3)
    table = torch.tensor([2, 0, 3])
    got = gather_kv(cache, table, 16, 40)
    want = torch.cat([cache[0], cache[3]])[:24]
    torch.testing.assert_close(got, want)
"""


def gather_block_offset() -> HardCase:
    max_len_default = Commit(
        "config: max_model_len defaults to 4096 at most\n\nA checkpoint advertising 128k positions made the engine size "
        "its rotary\ntables and token budget for 128k; cap the default, users can still raise it.",
        KOFI,
        [
            (
                CONFIG,
                "        self.max_model_len = self.max_model_len or self.model_config.max_position_embeddings\n",
                "        self.max_model_len = self.max_model_len or min(self.model_config.max_position_embeddings, 4096)\n",
            )
        ],
    )
    bug = Commit(
        "attention: gather_kv slices whole blocks once\n\nThe gathered blocks are flattened to a token axis and cut to "
        "the requested\nlength in one step; prefill tiles start on a tile boundary. The native twin\nand the prefill "
        "kernel name the gathered K/V the same way. Test added.",
        LENA,
        [
            (
                ATTN,
                "    bs = cache.shape[1]\n"
                "    first, last = start // bs, -(-end // bs)\n"
                "    blocks = cache.index_select(0, block_table[first:last])\n"
                "    return blocks.flatten(0, 1)[start - first * bs:end - first * bs]\n",
                "    bs = cache.shape[1]\n"
                "    first, last = start // bs, -(-end // bs)\n"
                "    tokens = cache.index_select(0, block_table[first:last]).flatten(0, 1)   # [(last - first) * bs, KVH, D]\n"
                "    return tokens[:end - start]   # tiles start on a tile boundary\n",
            ),
            (
                ATTN,
                "        k = gather_kv(key_cache, block_table, t0, t1).to(qg.dtype).permute(1, 0, 2)   # [KVH, n, D]\n"
                "        v = gather_kv(value_cache, block_table, t0, t1).to(qg.dtype).permute(1, 0, 2)\n",
                "        k_tile = gather_kv(key_cache, block_table, t0, t1).to(qg.dtype).permute(1, 0, 2)   # [KVH, n, D]\n"
                "        v_tile = gather_kv(value_cache, block_table, t0, t1).to(qg.dtype).permute(1, 0, 2)\n",
            ),
            (
                ATTN,
                '        s = _softcap(torch.einsum("kgld,knd->kgln", qg, k), softcap)   # q carries the scale\n',
                '        s = _softcap(torch.einsum("kgld,knd->kgln", qg, k_tile), softcap)   # q carries the scale\n',
            ),
            (
                ATTN,
                '        acc = acc * correction + torch.einsum("kgln,knd->kgld", p, v)\n',
                '        acc = acc * correction + torch.einsum("kgln,knd->kgld", p, v_tile)\n',
            ),
            (
                ATTN,
                "        k = gather_kv(key_cache, block_tables[s], 0, n)\n"
                "        v = gather_kv(value_cache, block_tables[s], 0, n)\n"
                "        rep = H // k.shape[1]\n"
                "        k = k.repeat_interleave(rep, dim=1).to(_acc(query.dtype))     # [n, H, D]\n"
                "        v = v.repeat_interleave(rep, dim=1).to(_acc(query.dtype))\n",
                "        k_seq = gather_kv(key_cache, block_tables[s], 0, n)\n"
                "        v_seq = gather_kv(value_cache, block_tables[s], 0, n)\n"
                "        rep = H // k_seq.shape[1]\n"
                "        k = k_seq.repeat_interleave(rep, dim=1).to(_acc(query.dtype))     # [n, H, D]\n"
                "        v = v_seq.repeat_interleave(rep, dim=1).to(_acc(query.dtype))\n",
            ),
            ("tests/test_gather_kv.py", None, GATHER_TEST),
        ],
    )
    merge_softmax = Commit(
        "ops/attention: decode partitions merged by a softmax over their lse",
        ARJUN,
        [
            (
                ATTN,
                "    lse = torch.logsumexp(lses, dim=0)\n    weights = torch.exp(lses - lse).nan_to_num(0.0)\n",
                "    weights = torch.softmax(lses, dim=0).nan_to_num(0.0)   # exp(lse_p - logsumexp(lse))\n",
            )
        ],
    )
    tgt = target(block_size=24)
    return case(
        "ts-hard-gather-block-offset",
        2203,
        "attention",
        ["vllm-project/vllm#7753", "tanishqkumar/ssd#23", "tenstorrent/tt-metal#21513"],
        "block_size=24 gives different greedy output than the default block size on prompts over ~32 tokens",
        repro_toml({"arch": "llama", "seed": 203}, tgt, [greedy(56, 2203, 8)], good_ref="v0.2.0"),
        (
            ATTN,
            "gather_kv",
            "attention",
            "gathered blocks are cut from the first block's start instead of the requested token's offset in it, so "
            "when the block size does not divide the 32-token prefill tile every tile after the first reads the keys "
            "and values of earlier positions",
        ),
        [(11, max_len_default), (23, bug), (27, merge_softmax)],
        bug,
    )


# ============================================================================= 2204 kv-cache: a fully cached prompt computes nothing


def full_prompt_hit() -> HardCase:
    ngram_default = Commit(
        "config: ngram lookup starts at bigrams\n\nSingle-token matches proposed drafts that were almost never accepted.",
        SOFIA,
        [(CONFIG, "    ngram_min: int = 1  ", "    ngram_min: int = 2  ")],
    )
    bug = Commit(
        "block_manager: prefix lookup walks whole blocks\n\nget_computed_blocks hashes every full block of the prompt, "
        "the same walk\ncache_full_blocks does, so a prompt that is entirely cached is served from the\ncache. allocate "
        "counts revived blocks with a generator and free walks the\ntable with a reversed slice.",
        KOFI,
        [
            (
                BM,
                '        """Longest run of cached blocks matching the start of `seq`.\n\n'
                "        At most num_tokens - 1 tokens count as hits: the last token is always\n"
                "        recomputed so the step has logits to sample from.\n"
                '        """\n'
                "        if not self.enable_prefix_caching:\n"
                "            return []\n"
                "        hits, prev = [], None\n"
                "        for i in range((seq.num_tokens - 1) // self.block_size):\n",
                '        """Longest run of cached full blocks matching the start of `seq`."""\n'
                "        if not self.enable_prefix_caching:\n"
                "            return []\n"
                "        hits, prev = [], None\n"
                "        for i in range(seq.num_tokens // self.block_size):\n",
            ),
            (
                BM,
                "        revived = sum(1 for b in cached if b.ref_count == 0)   # cached but sitting in the free queue\n",
                "        revived = sum(b.ref_count == 0 for b in cached)   # cached but sitting in the free queue\n",
            ),
            (
                BM,
                "        for block_id in reversed(seq.block_table):\n"
                "            block = self.blocks[block_id]\n"
                "            block.ref_count -= 1\n",
                "        for block_id in seq.block_table[::-1]:\n"
                "            block = self.blocks[block_id]\n"
                "            block.ref_count -= 1\n",
            ),
        ],
    )
    needed_expr = Commit(
        "block_manager: blocks_needed in block units",
        LENA,
        [
            (
                BM,
                "        total = seq.num_computed_tokens + num_new_tokens\n"
                "        return max(0, -(-total // self.block_size) - len(seq.block_table))\n",
                "        blocks = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)\n"
                "        return max(0, blocks - len(seq.block_table))\n",
            )
        ],
    )
    shared = prompt(12, 2204)
    reqs = [
        {"prompt_ids": shared, "max_tokens": 10, "sampling": GREEDY},
        {"prompt_ids": shared, "max_tokens": 6, "sampling": GREEDY, "arrival_step": 3},
    ]
    tgt = target(enable_prefix_caching=True, enable_chunked_prefill=True, block_size=4)
    return case(
        "ts-hard-full-prompt-hit",
        2204,
        "kv-cache",
        ["vllm-project/vllm#7753", "Wenyueh/MinivLLM#98", "ovg-project/kvcached#446"],
        "prefix caching + chunked prefill: a repeated prompt sometimes continues the other request's text",
        repro_toml({"arch": "llama", "seed": 204}, tgt, reqs, good_ref="v0.2.0"),
        (
            BM,
            "BlockManager.get_computed_blocks",
            "block_manager",
            "the prefix lookup counts every full block as a hit, so a prompt whose length is a multiple of the block "
            "size and that is entirely cached gets no token to compute: it is scheduled with zero rows and samples "
            "from the logits row of whichever sequence precedes it in the packed batch",
        ),
        [(12, ngram_default), (14, bug), (24, needed_expr)],
        bug,
    )


# ============================================================================= 2205 kv-cache: block key drops the block's last token

BLOCK_KEY_TEST = """from __future__ import annotations

import torch

from tinyserve.engine.block_manager import BlockManager
from tinyserve.engine.sequence import Sequence
from tinyserve.sampling_params import SamplingParams


def test_same_prompt_hits_its_cached_blocks():
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a = Sequence(0, "a", list(range(10)), SamplingParams(), torch.Generator())
    bm.allocate(a, [], 10)
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a)
    b = Sequence(1, "b", list(range(10)), SamplingParams(), torch.Generator())
    assert len(bm.get_computed_blocks(b)) == 2
"""


def block_key_last_token() -> HardCase:
    temp_floor = Commit(
        "sampling_params: reject temperatures above 100\n\nLarger values are always a units mistake (a percentage) and "
        "flatten the\ndistribution to uniform.",
        INES,
        [
            (
                PARAMS,
                "        if self.temperature < 0:\n"
                '            raise ValueError(f"temperature must be >= 0, got {self.temperature}")\n',
                "        if not 0 <= self.temperature <= 100:\n"
                '            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")\n',
            )
        ],
    )
    bug = Commit(
        "prefix caching: hash blocks by a tuple key from the sequence\n\nThe block manager hashed a fresh list slice per "
        "block on every lookup;\nSequence.block_key hands out the full block's token ids as a tuple, which the\nhash "
        "takes as is. Lookup and registration both use it. Test added.",
        ARJUN,
        [
            (
                SEQ,
                "    def append_token(self, token_id: int, logprob: float, top: dict[int, float] | None = None) -> None:\n",
                "    def block_key(self, block_index: int, block_size: int) -> tuple[int, ...]:\n"
                '        """Hashable key of full block `block_index` for prefix caching: its token ids, as a tuple."""\n'
                "        first, last = block_index * block_size, (block_index + 1) * block_size - 1\n"
                "        return tuple(self.token_ids[first:last])\n\n"
                "    def append_token(self, token_id: int, logprob: float, top: dict[int, float] | None = None) -> None:\n",
            ),
            (
                BM,
                "            prev = hash_block_tokens(prev, seq.block_token_ids(i, self.block_size))\n"
                "            block_id = self.hash_to_block.get(prev)\n",
                "            prev = hash_block_tokens(prev, seq.block_key(i, self.block_size))\n"
                "            block_id = self.hash_to_block.get(prev)\n",
            ),
            (
                BM,
                "            block = self.blocks[seq.block_table[i]]\n"
                "            prev = hash_block_tokens(prev, seq.block_token_ids(i, self.block_size))\n",
                "            block = self.blocks[seq.block_table[i]]\n"
                "            prev = hash_block_tokens(prev, seq.block_key(i, self.block_size))\n",
            ),
            (
                BM,
                "def hash_block_tokens(prev_hash: int | None, token_ids) -> int:\n"
                "    return hash((prev_hash, tuple(token_ids)))\n",
                "def hash_block_tokens(prev_hash: int | None, token_ids) -> int:\n"
                "    # token_ids: a tuple (Sequence.block_key) or any sequence of ids\n"
                "    return hash((prev_hash, tuple(token_ids)))\n",
            ),
            ("tests/test_block_key.py", None, BLOCK_KEY_TEST),
        ],
    )
    free_count = Commit(
        "block_manager: count free blocks once per admission",
        SOFIA,
        [
            (
                BM,
                "        if needed + revived > self.num_free_blocks:\n            return False\n        for block in cached:\n",
                "        free = self.num_free_blocks\n"
                "        if needed + revived > free:\n            return False\n        for block in cached:\n",
            )
        ],
    )
    first = prompt(12, 2205)
    second = first[:7] + [(first[7] + 101) % 509 + 3] + first[8:] + prompt(3, 2305)
    reqs = [
        {"prompt_ids": first, "max_tokens": 2, "sampling": GREEDY},
        {"prompt_ids": second, "max_tokens": 8, "sampling": GREEDY, "arrival_step": 4},
    ]
    tgt = target(enable_prefix_caching=True, block_size=4)
    return case(
        "ts-hard-block-key-last-token",
        2205,
        "kv-cache",
        ["openvinotoolkit/openvino.genai#3722", "inference-sim/inference-sim#196", "Wenyueh/MinivLLM#98"],
        "with prefix caching on, a prompt that differs from an earlier one by a single token gets the earlier "
        "prompt's answer",
        repro_toml({"arch": "llama", "seed": 205}, tgt, reqs, good_ref="v0.2.0"),
        (
            SEQ,
            "Sequence.block_key",
            "sequence",
            "the block key slices token ids up to (block + 1) * size - 1 exclusive, dropping each block's last token, "
            "so two prompts that differ only in a block's last token share the cached block and the second reads the "
            "first one's K/V",
        ),
        [(13, temp_floor), (15, bug), (28, free_count)],
        bug,
    )


# ============================================================================= 2206 model-config: tied-head default for every arch


def tied_head_default() -> HardCase:
    budget_default = Commit(
        "config: chunked prefill budget defaults to 8192 tokens\n\nLong prompts were split into four steps for no reason "
        "on CPU-sized batches.",
        SOFIA,
        [
            (
                CONFIG,
                "        budget = self.max_num_batched_tokens or (2048 if self.enable_chunked_prefill\n",
                "        budget = self.max_num_batched_tokens or (8192 if self.enable_chunked_prefill\n",
            )
        ],
    )
    bug = Commit(
        "config: architecture defaults in small helpers\n\nfrom_dict grew one conditional per architecture quirk. The "
        "bias layout and the\ntied LM head now come from named helpers that say which transformers default\nthey "
        "follow, so the next architecture adds a line there instead.",
        LENA,
        [
            (
                CONFIG,
                "            # qwen2 puts a bias on q/k/v only; llama's attention_bias covers o_proj too\n"
                '            qkv_bias=arch == "qwen2" or bool(hf.get("attention_bias", False)),\n'
                '            o_proj_bias=arch != "qwen2" and bool(hf.get("attention_bias", False)),\n'
                '            mlp_bias=bool(hf.get("mlp_bias", False)),\n'
                '            tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),\n',
                "            qkv_bias=bias_flags(hf)[0], o_proj_bias=bias_flags(hf)[1],\n"
                '            mlp_bias=bool(hf.get("mlp_bias", False)),\n'
                "            tie_word_embeddings=tied_embeddings(hf),\n",
            ),
            (
                CONFIG,
                "def rope_parameters(hf: dict) -> dict:\n",
                "def bias_flags(hf: dict) -> tuple[bool, bool]:\n"
                '    """(q/k/v bias, o_proj bias): qwen2 puts a bias on q/k/v only; llama\'s attention_bias covers '
                'o_proj too."""\n'
                '    attention_bias = bool(hf.get("attention_bias", False))\n'
                '    if hf.get("model_type") == "qwen2":\n'
                "        return True, False\n"
                "    return attention_bias, attention_bias\n\n\n"
                "def tied_embeddings(hf: dict) -> bool:\n"
                '    """Whether the LM head reuses the embedding table. transformers\' PretrainedConfig defaults to\n'
                '    tied; checkpoints with a separate lm_head say tie_word_embeddings = false."""\n'
                '    return bool(hf.get("tie_word_embeddings", True))\n\n\n'
                "def rope_parameters(hf: dict) -> dict:\n",
            ),
        ],
    )
    loader_loop = Commit(
        "model_loader: one lookup per checkpoint tensor",
        KOFI,
        [
            (
                LOADER,
                "        param = params[target]\n"
                '        loader = getattr(param, "weight_loader", None)\n'
                "        if loader is not None:\n"
                "            loader(param, tensor, shard_id)\n"
                "        else:\n"
                "            param.data.copy_(tensor)\n",
                "        param = params[target]\n"
                '        load = getattr(param, "weight_loader", None)\n'
                "        if load is None:\n"
                "            param.data.copy_(tensor)\n"
                "        else:\n"
                "            load(param, tensor, shard_id)\n",
            )
        ],
    )
    model = {"arch": "llama", "seed": 206, "omit_keys": ["tie_word_embeddings"]}
    return case(
        "ts-hard-tied-head-default",
        2206,
        "model-config",
        ["stepfun-ai/Step-Audio-EditX#38", "huggingface/transformers#43429", "vllm-project/vllm#51063"],
        "a Llama fine-tune whose config.json has no tie_word_embeddings key produces garbage from the first token",
        repro_toml(model, target(), [greedy(10, 2206, 8), greedy(17, 2306, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "tied_embeddings",
            "config",
            "a config without tie_word_embeddings is read as tied for every architecture (PretrainedConfig's "
            "default) although llama, mistral and qwen2 default to an untied head, so the checkpoint's lm_head is "
            "skipped and logits come from the embedding table",
        ),
        [(10, budget_default), (18, bug), (27, loader_loop)],
        bug,
    )


# ============================================================================= 2207 batching: row positions from the sequence's tail


ROW_POSITIONS_TEST = """from __future__ import annotations

import torch

from tinyserve.engine.model_runner import ModelRunner
from tinyserve.engine.sequence import Sequence
from tinyserve.sampling_params import SamplingParams


def test_a_decode_row_sits_at_the_last_position():
    seq = Sequence(0, "a", [5, 6, 7], SamplingParams(), torch.Generator())
    seq.num_computed_tokens = 2
    assert list(ModelRunner.row_positions(seq, 1)) == [2]
"""


def chunk_row_positions() -> HardCase:
    spec_default = Commit(
        "config: propose 4 draft tokens by default\n\nAcceptance on the ngram proposer is high enough that k=4 wins on "
        "every\nbenchmark we run.",
        INES,
        [(CONFIG, "    num_speculative_tokens: int = 3 ", "    num_speculative_tokens: int = 4 ")],
    )
    bug = Commit(
        "model_runner: positions of a step's rows in one helper\n\nThe speculative engine and the tensor-parallel "
        "runner need the positions of a\nsequence's new rows too; row_positions gives them in one place (a step "
        "computes\nthe tail of each sequence, as the attention kernels assume). Slots keep using\nslot().",
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
                "    def row_positions(seq: Sequence, n: int) -> range:\n"
                '        """Token positions of `seq`\'s n new rows this step: its last n tokens."""\n'
                "        return range(seq.num_tokens - n, seq.num_tokens)\n\n"
                "    def slot(self, seq: Sequence, position: int) -> int:\n",
            ),
            (
                RUNNER,
                '        """Pack each sequence\'s new tokens back to back -> (input_ids [T], context)."""\n',
                '        """Pack each sequence\'s new tokens back to back -> (input_ids [T], context); row positions\n'
                '        come from row_positions, cache slots from slot."""\n',
            ),
            ("tests/test_row_positions.py", None, ROW_POSITIONS_TEST),
        ],
    )
    seq_lens_expr = Commit(
        "model_runner: sampling rows from the packed offsets",
        KOFI,
        [
            (
                RUNNER,
                "        samples = [i for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens))\n"
                "                   if seq.num_computed_tokens + n == seq.num_tokens]\n",
                "        samples = [i for i, seq in enumerate(batch.seqs) if seq_lens[i] == seq.num_tokens]\n",
            )
        ],
    )
    tgt = target(enable_chunked_prefill=True, max_num_batched_tokens=16)
    return case(
        "ts-hard-chunk-row-positions",
        2207,
        "batching",
        ["huggingface/transformers#43082", "vllm-project/vllm#10388", "tenstorrent/tt-metal#21513"],
        "enabling chunked prefill changes greedy output for prompts longer than the token budget",
        repro_toml({"arch": "llama", "seed": 207}, tgt, [greedy(40, 2207, 8)], good_ref="v0.2.0"),
        (
            RUNNER,
            "ModelRunner.row_positions",
            "model_runner",
            "row positions are taken as the sequence's last n tokens, which is right only for the final chunk: "
            "every earlier prefill chunk is rotated as if it sat at the end of the prompt, so its cached keys carry "
            "the wrong positions",
        ),
        [(9, spec_default), (22, bug), (25, seq_lens_expr)],
        bug,
    )


# ============================================================================= 2208 positional-encoding: dynamic NTK length from the row count

NTK_TEST = """from __future__ import annotations

import torch

from tinyserve.layers.rotary_embedding import dynamic_ntk_cos_sin_cache, dynamic_ntk_inv_freq


def test_dynamic_table_at_max_position_is_the_plain_one():
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    table = dynamic_ntk_cos_sin_cache(rope, 16, 64, 64)
    inv_freq, _ = dynamic_ntk_inv_freq(rope, 16, 64)
    assert table.shape == (64, 16)
    torch.testing.assert_close(table[5, :8], torch.cos(5 * inv_freq))
"""


def ntk_row_count() -> HardCase:
    skipped = Commit(
        "model_loader: skip cached rotary tables in old checkpoints\n\nSome GPT-NeoX-era conversions carry "
        "rotary_emb.cos_cached / sin_cached;\nthey are recomputed here, like inv_freq.",
        KOFI,
        [
            (
                LOADER,
                'SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)\n',
                'SKIPPED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")\n',
            )
        ],
    )
    bug = Commit(
        "rotary: dynamic NTK table in a function of its own\n\nThe table for a sequence of seq_len tokens is a pure "
        "function of the rope\ndict; tests and the compile path can build it without a layer. cache_for now\nonly "
        "decides when the precomputed table is not enough: when this forward\nruns more tokens than "
        "max_position_embeddings.",
        SOFIA,
        [
            (
                ROPE,
                "def compute_cos_sin_cache(",
                "def dynamic_ntk_cos_sin_cache(rope: dict, head_dim: int, max_position: int, seq_len: int) -> torch.Tensor:\n"
                '    """cos/sin for positions [0, seq_len) with the NTK base grown for a seq_len-token sequence."""\n'
                "    inv_freq, scaling = dynamic_ntk_inv_freq(rope, head_dim, max_position, torch.tensor(seq_len))\n"
                "    return compute_cos_sin_cache(inv_freq, torch.arange(seq_len), scaling)\n\n\n"
                "def compute_cos_sin_cache(",
            ),
            (
                ROPE,
                "        seq_len = int(positions.max()) + 1 if positions.numel() else 0\n"
                "        if not self.is_dynamic or seq_len <= self.max_position:\n"
                "            return self.cos_sin_cache\n"
                "        inv_freq, scaling = dynamic_ntk_inv_freq(self.rope, self.head_dim, self.max_position,\n"
                "                                                 torch.tensor(seq_len))\n"
                "        return compute_cos_sin_cache(inv_freq, torch.arange(seq_len), scaling)\n",
                "        seq_len = positions.shape[0]\n"
                "        if not self.is_dynamic or seq_len <= self.max_position:\n"
                "            return self.cos_sin_cache\n"
                "        return dynamic_ntk_cos_sin_cache(self.rope, self.head_dim, self.max_position, seq_len)\n",
            ),
            ("tests/test_rope_dynamic.py", None, NTK_TEST),
        ],
    )
    base_freq = Commit(
        "rotary: inverse frequencies from arange in float directly",
        LENA,
        [
            (
                ROPE,
                "    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))\n",
                "    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim\n"
                "    return 1.0 / (base ** exponents)\n",
            )
        ],
    )
    model = {
        "arch": "llama",
        "seed": 208,
        "max_position_embeddings": 64,
        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
    }
    return case(
        "ts-hard-ntk-row-count",
        2208,
        "positional-encoding",
        ["vllm-project/vllm#3488", "vllm-project/vllm#41277", "vllm-project/vllm#55910"],
        "dynamic NTK rope: two prompts submitted together get different greedy output than each one alone",
        repro_toml(model, target(), [greedy(40, 2208, 8), greedy(36, 2308, 8)], good_ref="v0.2.0"),
        (
            ROPE,
            "RotaryEmbedding.cache_for",
            "rotary_embedding",
            "the dynamic NTK table is chosen by the number of rows in the forward instead of the largest position, so "
            "a packed batch whose rows together exceed max_position_embeddings is rotated with a grown base although "
            "every sequence in it is shorter than max_position_embeddings",
        ),
        [(14, skipped), (20, bug), (24, base_freq)],
        bug,
    )


# ============================================================================= 2209 quantization: group size not passed on

QUANT_LAYER_TEST = """from __future__ import annotations

import torch

from tinyserve.layers.linear import ReplicatedLinear
from tinyserve.ops.quant_matmul import dequant_matmul
from tinyserve.quantization import quantize_layer


def test_quantize_layer_replaces_the_weight():
    layer = ReplicatedLinear(64, 8)
    layer.weight.data.normal_()
    quantize_layer(layer, "int4", dequant_matmul)
    assert not hasattr(layer, "weight") and layer.quant.group_size == 32
"""


def quant_group_default() -> HardCase:
    top_p_cli = Commit(
        "cli: --top-k and --seed",
        SOFIA,
        [
            (
                MAIN,
                '    ap.add_argument("--top-p", type=float, default=1.0)\n',
                '    ap.add_argument("--top-p", type=float, default=1.0)\n'
                '    ap.add_argument("--top-k", type=int, default=0)\n'
                '    ap.add_argument("--seed", type=int, default=None)\n',
            ),
            (
                MAIN,
                "SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)",
                "SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,\n"
                "                            seed=args.seed, max_tokens=args.max_tokens)",
            ),
        ],
    )
    bug = Commit(
        "quantization: quantize_layer for one linear\n\nThe LoRA loader needs to quantize a single projection after "
        "load; the loop\nbody of quantize_linears becomes quantize_layer (group_size keeps the engine's\ndefault) "
        "and the loop calls it.",
        INES,
        [
            (
                QUANT,
                "def quantize_linears(model: nn.Module, scheme: str, group_size: int, kernel) -> int:\n",
                "def quantize_layer(layer: LinearBase, scheme: str, kernel, group_size: int = 32) -> None:\n"
                '    """Replace `layer`\'s float weight by its packed form; the packed weight is the only copy left."""\n'
                "    layer.quant = quantize_weight(layer.weight.data, scheme, group_size, kernel)\n"
                "    del layer.weight\n\n\n"
                "def quantize_linears(model: nn.Module, scheme: str, group_size: int, kernel) -> int:\n",
            ),
            (
                QUANT,
                "            module.quant = quantize_weight(module.weight.data, scheme, group_size, kernel)\n"
                "            del module.weight      # the packed weight is the only copy left\n",
                "            quantize_layer(module, scheme, kernel)\n",
            ),
            ("tests/test_quantize_layer.py", None, QUANT_LAYER_TEST),
        ],
    )
    shift_einsum = Commit(
        "quant_matmul: int4 zero-point shift as one einsum",
        LENA,
        [
            (
                QMM,
                "    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]\n",
                '    shift = torch.einsum("og,tg->tog", zero.to(x.dtype), xg.sum(-1))         # [T, O, G]\n',
            )
        ],
    )
    tgt = target(quantization="int4", quant_group_size=16)
    return case(
        "ts-hard-quant-group-default",
        2209,
        "quantization",
        ["pytorch/ao#3572", "ml-explore/mlx-lm#935", "1bit-MONSTER/1bit-MONSTER#625"],
        "int4 with quant_group_size=16 is further from the dequantized reference than int4 with the default group size",
        repro_toml({"arch": "llama", "seed": 209}, tgt, [greedy(15, 2209, 8), greedy(9, 2309, 8)], good_ref="v0.2.0"),
        (
            QUANT,
            "quantize_linears",
            "quantization",
            "the loop calls quantize_layer without the configured group size, so every layer is quantized with the "
            "default 32-column groups whatever quant_group_size says",
        ),
        [(12, top_p_cli), (16, bug), (23, shift_einsum)],
        bug,
    )


# ============================================================================= 2210 attention: prefill helper given the query lengths

PREFILL_TEST = """from __future__ import annotations

import torch

from tinyserve.ops.attention import paged_attention, paged_attention_native


def test_one_prefill_matches_the_native_twin():
    torch.manual_seed(0)
    q = torch.randn(6, 4, 8)
    kc, vc = torch.randn(4, 4, 2, 8), torch.randn(4, 4, 2, 8)
    args = (q, kc, vc, torch.tensor([0, 6]), torch.tensor([6]), torch.tensor([[1, 3]]), 8 ** -0.5)
    torch.testing.assert_close(paged_attention(*args), paged_attention_native(*args))
"""


def prefill_query_lengths() -> HardCase:
    seqs_default = Commit(
        "config: max_num_seqs 256\n\nThe KV cache, not the sequence cap, should bound the batch.",
        KOFI,
        [(CONFIG, "    max_num_seqs: int = 128\n", "    max_num_seqs: int = 256\n")],
    )
    bug = Commit(
        "attention: prefill chunks in a helper beside the decode call\n\npaged_attention reads as two calls now: the "
        "batched decode kernel over the\nsingle-token rows, then _prefill_into over the sequences with a chunk. Same "
        "kernels, same rows. Test added.",
        INES,
        [
            (
                ATTN,
                "    for s in (q_lens > 1).nonzero().flatten().tolist():\n"
                "        a, b = int(query_start_loc[s]), int(query_start_loc[s + 1])\n"
                "        out[a:b] = paged_attention_prefill(query[a:b], key_cache, value_cache, block_tables[s],\n"
                "                                           int(seq_lens[s]), scale, sliding_window, softcap)\n"
                "    return out\n",
                "    prefill = (q_lens > 1).nonzero().flatten().tolist()\n"
                "    _prefill_into(out, query, key_cache, value_cache, query_start_loc, q_lens, block_tables, prefill,\n"
                "                  scale, sliding_window, softcap)\n"
                "    return out\n\n\n"
                "def _prefill_into(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,\n"
                "                  query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,\n"
                "                  seqs: list[int], scale: float, sliding_window: int | None, softcap: float | None) -> None:\n"
                '    """Prefill chunks of the batch sequences `seqs`, written into their rows of `out` [T, H, D]."""\n'
                "    for s in seqs:\n"
                "        a, b = int(query_start_loc[s]), int(query_start_loc[s + 1])\n"
                "        out[a:b] = paged_attention_prefill(query[a:b], key_cache, value_cache, block_tables[s],\n"
                "                                           int(seq_lens[s]), scale, sliding_window, softcap)\n",
            ),
            ("tests/test_paged_attention_prefill.py", None, PREFILL_TEST),
        ],
    )
    tile_lo = Commit(
        "ops/attention: first prefill tile in one expression",
        ARJUN,
        [
            (
                ATTN,
                "    lo = 0 if sliding_window is None else max(0, q_start - sliding_window + 1)\n"
                "    lo = lo // KV_TILE_TOKENS * KV_TILE_TOKENS\n",
                "    lo = 0 if sliding_window is None else max(0, q_start - sliding_window + 1) // KV_TILE_TOKENS * "
                "KV_TILE_TOKENS\n",
            )
        ],
    )
    shared = prompt(12, 2210)
    reqs = [
        {"prompt_ids": shared, "max_tokens": 2, "sampling": GREEDY},
        {"prompt_ids": shared + prompt(5, 2310), "max_tokens": 8, "sampling": GREEDY, "arrival_step": 4},
    ]
    tgt = target(enable_prefix_caching=True, block_size=4)
    return case(
        "ts-hard-prefill-query-lengths",
        2210,
        "attention",
        ["tanishqkumar/ssd#23", "RedHeartSecretMan/vllm-oxide#39", "sgl-project/sglang#34093"],
        "prefix caching: a request that extends an earlier prompt answers as if it only saw its last few tokens",
        repro_toml({"arch": "llama", "seed": 210}, tgt, reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "paged_attention",
            "attention",
            "the prefill helper is handed the per-sequence query lengths where it expects the context lengths, so a "
            "chunk that follows cached tokens (a prefix hit or a later chunk) attends to the first q_len cached "
            "positions as if they were its own",
        ),
        [(10, seqs_default), (21, bug), (26, tile_lo)],
        bug,
    )


# ============================================================================= 2211 sampling: top_k defaults to 50

DEFAULTS_TEST = """from __future__ import annotations

from tinyserve.sampling_params import SamplingParams


def test_defaults_follow_generation_config():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.min_p, p.repetition_penalty) == (1.0, 1.0, 0.0, 1.0)
"""


def top_k_default() -> HardCase:
    penalty_range = Commit(
        "sampling_params: presence and frequency penalties within [-2, 2]\n\nThe OpenAI API's range; larger values "
        "were always a client bug.",
        LENA,
        [
            (
                PARAMS,
                "        if self.repetition_penalty <= 0:\n",
                '        for name in ("presence_penalty", "frequency_penalty"):\n'
                "            if not -2.0 <= getattr(self, name) <= 2.0:\n"
                '                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")\n'
                "        if self.repetition_penalty <= 0:\n",
            )
        ],
    )
    bug = Commit(
        "sampling_params: defaults follow transformers' GenerationConfig\n\nResults drifted from `model.generate` "
        "whenever a request left a knob unset.\nEach field now names the GenerationConfig default it mirrors; tests "
        "pin them.",
        ARJUN,
        [
            (
                PARAMS,
                "    temperature: float = 1.0          # 0 = greedy\n"
                "    top_k: int = 0                    # 0 or -1 = off\n"
                "    top_p: float = 1.0\n"
                "    min_p: float = 0.0\n",
                "    temperature: float = 1.0          # 0 = greedy (GenerationConfig: 1.0)\n"
                "    top_k: int = 50                   # GenerationConfig: 50; 0 or -1 = off\n"
                "    top_p: float = 1.0                # GenerationConfig: 1.0\n"
                "    min_p: float = 0.0                # GenerationConfig: None (off)\n",
            ),
            ("tests/test_sampling_defaults.py", None, DEFAULTS_TEST),
        ],
    )
    adjuster_div = Commit(
        "sampler: temperature as a true division",
        INES,
        [
            (
                SAMPLER,
                "        return logits / st.temperature.to(logits.dtype).unsqueeze(1)\n",
                "        return torch.div(logits, st.temperature.to(logits.dtype).unsqueeze(1))\n",
            )
        ],
    )
    sampling = {"temperature": 0.8, "seed": 21, "ignore_eos": True}
    reqs = [{"prompt_ids": prompt(10, 2211), "max_tokens": 8, "sampling": sampling}]
    return case(
        "ts-hard-top-k-default",
        2211,
        "sampling",
        ["huggingface/transformers#38549", "microsoft/onnxruntime-genai#1642", "vllm-project/tpu-inference#1386"],
        "plain temperature sampling draws from a narrower distribution than transformers' sampler with the same "
        "settings",
        repro_toml({"arch": "llama", "seed": 211}, target(), reqs, good_ref="v0.2.0"),
        (
            PARAMS,
            "SamplingParams",
            "sampling_params",
            "the dataclass default for top_k became 50 (GenerationConfig's), so every request that leaves top_k unset "
            "is silently truncated to its 50 most likely tokens instead of sampling from the full distribution",
        ),
        [(11, penalty_range), (15, bug), (24, adjuster_div)],
        bug,
    )


# ============================================================================= 2212 kernel: GELU family lookup in the activation layer

GELU_TEST = """from __future__ import annotations

import torch
import torch.nn.functional as F

from tinyserve.ops.activation import gelu_and_mul, gelu_and_mul_native


def test_gelu_and_mul_is_exact_gelu():
    x = torch.randn(4, 32)
    want = F.gelu(x[:, :16]) * x[:, 16:]
    torch.testing.assert_close(gelu_and_mul(x), want)
    torch.testing.assert_close(gelu_and_mul_native(x), want)
"""


def gelu_family_lookup() -> HardCase:
    draft_budget = Commit(
        "spec_decode: the draft model gets a 4096-token budget\n\nDraft prefill of long prompts no longer runs in "
        "max_model_len-sized steps.",
        KOFI,
        [
            (
                "tinyserve/spec_decode/proposers.py",
                "        budget = max(2048, config.max_model_len)\n",
                "        budget = max(4096, config.max_model_len)\n",
            )
        ],
    )
    bug = Commit(
        'ops: exact-GELU gated kernel for hidden_act = "gelu"\n\nSome converted checkpoints (GPT-J style MLPs '
        "retrofitted to gated ones) use\nthe erf GELU. gelu_and_mul and its native twin are registered like the other\n"
        "kernels; the activation layer resolves transformers' GELU spellings (gelu_new,\ngelu_fast, ...) by family "
        "name. Test added.",
        SOFIA,
        [
            (
                ACT,
                "def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:\n",
                "def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:\n"
                "    # [T, 2I] -> [T, I]; erf GELU\n"
                "    d = x.shape[-1] // 2\n"
                "    return F.gelu(x[..., :d]) * x[..., d:]\n\n\n"
                "def gelu_and_mul_native(x: torch.Tensor) -> torch.Tensor:\n"
                "    # [T, 2I] -> [T, I]; 0.5 x (1 + erf(x / sqrt(2)))\n"
                "    gate, up = x.chunk(2, dim=-1)\n"
                "    g = gate.to(torch.promote_types(x.dtype, torch.float32))\n"
                "    return (0.5 * g * (1.0 + torch.erf(g / math.sqrt(2.0)))).to(x.dtype) * up\n\n\n"
                "def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:\n",
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
            (
                ACT_LAYER,
                'ACTIVATION_KERNELS = {"silu": "silu_and_mul", "gelu_pytorch_tanh": "gelu_tanh_and_mul",\n'
                '                      "gelu_tanh": "gelu_tanh_and_mul"}\n',
                'ACTIVATION_KERNELS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "gelu_pytorch_tanh": '
                '"gelu_tanh_and_mul",\n'
                '                      "gelu_tanh": "gelu_tanh_and_mul"}\n',
            ),
            (
                ACT_LAYER,
                "        if hidden_act not in ACTIVATION_KERNELS:\n"
                '            raise ValueError(f"unsupported activation {hidden_act!r}; supported: '
                "{', '.join(ACTIVATION_KERNELS)}\")\n"
                "        self.kernel_name = ACTIVATION_KERNELS[hidden_act]\n",
                "        # transformers spells GELU variants several ways (gelu_new, gelu_fast, gelu_pytorch_tanh...):\n"
                "        # the family name before the first underscore picks the kernel\n"
                '        family = hidden_act.split("_")[0]\n'
                "        key = family if family in ACTIVATION_KERNELS else hidden_act\n"
                "        if key not in ACTIVATION_KERNELS:\n"
                '            raise ValueError(f"unsupported activation {hidden_act!r}; supported: '
                "{', '.join(ACTIVATION_KERNELS)}\")\n"
                "        self.kernel_name = ACTIVATION_KERNELS[key]\n",
            ),
            ("tests/test_gelu_and_mul.py", None, GELU_TEST),
        ],
    )
    fused_add = Commit(
        "ops/norm: residual add with add_ again",
        ARJUN,
        [
            (
                "tinyserve/ops/norm.py",
                "    torch.add(residual, x, out=residual)\n",
                "    residual.add_(x)\n",
            )
        ],
    )
    model = {"arch": "gemma2", "seed": 212, "initializer_range": 0.5, "num_hidden_layers": 6}
    return case(
        "ts-hard-gelu-family-lookup",
        2212,
        "kernel",
        ["vllm-project/vllm#5908", "EricLBuehler/mistral.rs#486", "togethercomputer/stripedhyena#9"],
        "Gemma 2 hidden states drift from transformers in every layer, even in float32 on short prompts",
        repro_toml(model, target(), [greedy(20, 2212, 8)], good_ref="v0.2.0"),
        (
            ACT_LAYER,
            "GatedActivation.__init__",
            "activation",
            "the activation layer looks kernels up by the family name before the first underscore, so Gemma's "
            "gelu_pytorch_tanh resolves to the new exact-GELU kernel instead of the tanh approximation",
        ),
        [(13, draft_budget), (19, bug), (33, fused_add)],
        bug,
    )


CASES = [
    top_p_crossing(),
    yarn_truncate_default(),
    gather_block_offset(),
    full_prompt_hit(),
    block_key_last_token(),
    tied_head_default(),
    chunk_row_positions(),
    ntk_row_count(),
    quant_group_default(),
    prefill_query_lengths(),
    top_k_default(),
    gelu_family_lookup(),
]
