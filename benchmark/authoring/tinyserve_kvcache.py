"""tinyserve cases: the paged KV cache and prefix caching (kv-cache)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.tinyserve_history import (
    AMARA,
    BM,
    DANIEL,
    HANNAH,
    KENJI,
    LENA,
    MARCO,
    OLGA,
    PRIYA,
    RUNNER,
    SOFIA,
    SUBJECT,
    TOMAS,
    WEI,
    YUKI,
    d_attn_gather_doc,
    d_bm_doc,
    d_bm_usage,
    d_config_msg,
    d_engine_abort,
    d_engine_stats,
    d_readme_chunked,
    d_readme_prefix_stats,
    d_sampling_clone,
    d_sched_counts,
    d_sched_doc,
    d_seq_repr,
    d_test_block_manager,
    history,
    prompt,
)


def case_prefix_hash_chain() -> CaseSpec:
    shared, head, tail_a, tail_b = prompt(12, 16), prompt(11, 16), prompt(13, 8), prompt(14, 10)
    bug = [
        (
            BM,
            "from collections import OrderedDict\n",
            "from collections import OrderedDict\nfrom functools import lru_cache\n",
        ),
        (
            BM,
            "def hash_block_tokens(prev_hash: int | None, token_ids) -> int:\n    return hash((prev_hash, tuple(token_ids)))\n",
            "@lru_cache(maxsize=1 << 16)\ndef _hash_token_tuple(token_ids: tuple) -> int:\n    return hash(token_ids)\n\n\n"
            "def hash_block_tokens(prev_hash: int | None, token_ids) -> int:\n    return _hash_token_tuple(tuple(token_ids))\n",
        ),
    ]
    steps = history(
        "2025-03-10",
        1101,
        [
            (LENA, "docs: describe prefix-caching statistics", d_readme_prefix_stats()),
            (DANIEL, "scheduler: expose num_waiting / num_running for metrics", d_sched_counts()),
            (
                WEI,
                "perf(block_manager): memoize per-block token hashes\n\n"
                "Profiling a long prompt with prefix caching on showed a visible share of scheduler time\n"
                "in hash_block_tokens: get_computed_blocks and cache_full_blocks re-hash the same token\n"
                "tuples every step. Keep the tuple hashes in an LRU cache.",
                bug,
            ),
            (PRIYA, "block_manager: add usage property", d_bm_usage()),
            (MARCO, "sampling_params: add clone()", d_sampling_clone()),
            (TOMAS, "engine: add abort_request()", d_engine_abort()),
            (HANNAH, "tests: block manager allocate/free", d_test_block_manager()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-prefix-hash-chain",
        issue_number=1101,
        category="kv-cache",
        modeled_on=["vllm-project/vllm#12621", "openvinotoolkit/openvino.genai#3722", "tenstorrent/vllm#415"],
        title="Prefix caching serves KV from an unrelated prompt when a chunk of text repeats",
        issue=issue_text("ts-prefix-hash-chain"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {"engine": "tinyserve", "dtype": "float32", "options": {"enable_prefix_caching": True, "block_size": 16}},
            [
                {
                    "prompt_ids": head + shared + tail_a,
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
                {
                    "prompt_ids": shared + tail_b,
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                    "arrival_step": 2,
                },
            ],
            good_ref="HEAD~5",
            comment="request 2 starts with tokens 16..31 of request 1 and arrives after request 1's prefill",
        ),
        truth_file=BM,
        truth_function="hash_block_tokens",
        component="block_manager",
        mechanism="block hash drops the parent hash, so a block whose tokens repeat at another offset "
        "matches a cached block computed under a different prefix",
        steps=steps,
        bug_index=3,
    )


def case_chunked_slot_mapping() -> CaseSpec:
    bug = [
        (
            RUNNER,
            "            slots += [seq.block_table[p // self.block_size] * self.block_size + p % self.block_size\n"
            "                      for p in range(first, first + n)]\n",
            "            base = first // self.block_size          # first block of this run\n"
            "            slots += [seq.block_table[base + j // self.block_size] * self.block_size\n"
            "                      + (first + j) % self.block_size for j in range(n)]\n",
        )
    ]
    steps = history(
        "2025-04-01",
        1102,
        [
            (
                KENJI,
                "model_runner: look up slots relative to the run's first block\n\n"
                "Index the block table from the first block of the scheduled run instead of dividing\n"
                "every absolute position; one division per sequence instead of one per token.",
                bug,
            ),
            (SOFIA, "config: clearer block_size error", d_config_msg()),
            (AMARA, "scheduler: document _chunk", d_sched_doc()),
            (KENJI, "engine: count generated tokens", d_engine_stats()),
            (LENA, "docs: explain the chunked-prefill token budget", d_readme_chunked()),
            (YUKI, "sequence: readable repr", d_seq_repr()),
            (OLGA, "ops/attention: note on padded block tables", d_attn_gather_doc()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-chunked-slot-mapping",
        issue_number=1102,
        category="kv-cache",
        modeled_on=["vllm-project/vllm#36580", "NVIDIA/TensorRT-LLM#8813"],
        title="Chunked prefill with a token budget that is not a multiple of block_size changes greedy output",
        issue=issue_text("ts-chunked-slot-mapping"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 24, "block_size": 16},
            },
            [{"prompt_ids": prompt(21, 60), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
        ),
        truth_file=RUNNER,
        truth_function="ModelRunner.prepare_inputs",
        component="model_runner",
        mechanism="slot mapping takes the block index as first//bs + j//bs, which is one block short when a "
        "chunk starts mid-block and crosses a block boundary, so K/V overwrite earlier slots",
        steps=steps,
        bug_index=1,
    )


def case_shared_block_refcount() -> CaseSpec:
    shared = prompt(31, 32)
    bug = [
        (
            BM,
            "        for block in cached:\n            self._take(block)\n",
            "        for block in cached:\n"
            "            if block.ref_count == 0:      # revived from the free queue; live blocks are already held\n"
            "                self._take(block)\n",
        )
    ]
    steps = history(
        "2025-05-12",
        1103,
        [
            (DANIEL, "block_manager: document the free-queue invariant", d_bm_doc()),
            (PRIYA, "engine: count generated tokens", d_engine_stats()),
            (TOMAS, "sequence: readable repr", d_seq_repr()),
            (AMARA, "scheduler: expose num_waiting / num_running", d_sched_counts()),
            (
                WEI,
                "block_manager: only take cached blocks that sit in the free queue\n\n"
                "Blocks shared with a running sequence are already accounted for; skip the free-queue\n"
                "bookkeeping for them when a new sequence reuses its prefix.",
                bug,
            ),
            (HANNAH, "tests: block manager allocate/free", d_test_block_manager()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-shared-block-refcount",
        issue_number=1103,
        category="kv-cache",
        modeled_on=["vllm-project/vllm#37076", "jjang-ai/vmlx#198"],
        title="Long request degrades after a prefix-sharing request finishes and a new one is admitted (small KV pool)",
        issue=issue_text("ts-shared-block-refcount"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"enable_prefix_caching": True, "block_size": 16, "num_kv_blocks": 4},
            },
            [
                {
                    "prompt_ids": shared + prompt(32, 1),
                    "max_tokens": 3,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
                {
                    "prompt_ids": shared + prompt(33, 8),
                    "max_tokens": 12,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                    "arrival_step": 1,
                },
                {
                    "prompt_ids": prompt(34, 20),
                    "max_tokens": 4,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                    "arrival_step": 5,
                },
            ],
            good_ref="HEAD~3",
        ),
        truth_file=BM,
        truth_function="BlockManager.allocate",
        component="block_manager",
        mechanism="prefix-cache hits on blocks still held by a running sequence do not take a reference, so when "
        "that sequence finishes the shared blocks go to the free queue and are handed to a new request",
        steps=steps,
        bug_index=5,
    )


CASES = [
    case_prefix_hash_chain(),
    case_chunked_slot_mapping(),
    case_shared_block_refcount(),
]
