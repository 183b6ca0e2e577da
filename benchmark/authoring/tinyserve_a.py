"""Benchmark cases for the tinyserve subject, batch A (issues 1101-1112).

    python -m benchmark.authoring.tinyserve_a [CASE ...] [--cases-dir DIR]

Writes, per case, `benchmark/cases/<id>/{case.toml,issue.md,repro.toml,truth.toml}` and
regenerates `commits/NN-slug.patch` with `benchmark.author.write_patches`. Every edit is a
(file, old_text, new_text) replacement against the subject's current source, so the script
can be re-run whenever the subject's base changes.

Categories covered: kv-cache (3), attention (3), positional-encoding (3), numerics (3).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.patches import Step

SUBJECT = "tinyserve"

BM = "tinyserve/engine/block_manager.py"
SCHED = "tinyserve/engine/scheduler.py"
ENGINE = "tinyserve/engine/llm_engine.py"
RUNNER = "tinyserve/engine/model_runner.py"
SEQ = "tinyserve/engine/sequence.py"
CONFIG = "tinyserve/config.py"
OPS_ATTN = "tinyserve/ops/attention.py"
OPS_NORM = "tinyserve/ops/norm.py"
OPS_ROT = "tinyserve/ops/rotary.py"
ROPE = "tinyserve/layers/rotary_embedding.py"
ATTN_LAYER = "tinyserve/layers/attention.py"
LLAMA = "tinyserve/models/llama.py"
GEMMA = "tinyserve/models/gemma2.py"
LOADER = "tinyserve/model_loader.py"
SAMPLING = "tinyserve/sampling_params.py"
TOKENIZER = "tinyserve/tokenizer.py"
LLM_PY = "tinyserve/llm.py"
README = "README.md"

# ----------------------------------------------------------------------------- people

PRIYA = "Priya Natarajan <priya.natarajan@fastmail.com>"
TOMAS = "Tomás Ferreira <tferreira@proton.me>"
LENA = "Lena Vogel <lena.vogel@posteo.de>"
KENJI = "Kenji Watanabe <kenji.watanabe.dev@gmail.com>"
AMARA = "Amara Okafor <amara.okafor@outlook.com>"
DANIEL = "Daniel Brooks <dbrooks@tinyserve.dev>"
YUKI = "Yuki Sato <ysato@tinyserve.dev>"
MARCO = "Marco Bianchi <marco.bianchi.mb@gmail.com>"
SOFIA = "Sofia Lindqvist <sofia@lindqvist.se>"
WEI = "Wei Zhang <zhangwei.infer@gmail.com>"
OLGA = "Olga Petrova <o.petrova@tinyserve.dev>"
HANNAH = "Hannah Kim <hkim@tinyserve.dev>"


def dates(start: str, n: int, seed: int) -> list[str]:
    """n increasing ISO dates from `start` (YYYY-MM-DD), 1-9 days apart, office-ish hours."""
    rng = random.Random(seed)
    day = datetime.fromisoformat(start).replace(tzinfo=UTC)
    out = []
    for _ in range(n):
        day += timedelta(days=rng.randint(1, 9))
        stamp = day.replace(hour=rng.randint(8, 19), minute=rng.randint(0, 59), second=rng.randint(0, 59))
        out.append(stamp.isoformat())
    return out


# ----------------------------------------------------------------------------- distractor edits
# Behaviour-preserving changes (docs, small features, tests, messages). Each returns a list of
# replacements; a case uses any one of them at most once.


def d_readme_prefix_stats():
    return [
        (
            README,
            "Engine option `native_kernels=[...]` runs the named kernels' native twins.",
            "Engine option `native_kernels=[...]` runs the named kernels' native twins.\n\n"
            "Prefix caching keeps statistics on the block manager: `prefix_hit_tokens` counts the\n"
            "prompt tokens served from cached blocks since the engine started.",
        )
    ]


def d_readme_chunked():
    return [
        (
            README,
            "Step-driven use (staggered arrivals, teacher forcing): `LLMEngine(Config(...))`,",
            "With `enable_chunked_prefill=True` a long prompt is split over several steps, each at most\n"
            "`max_num_batched_tokens` tokens (decodes of running requests go first).\n\n"
            "Step-driven use (staggered arrivals, teacher forcing): `LLMEngine(Config(...))`,",
        )
    ]


def d_readme_rope():
    return [
        (
            README,
            "Engine option `native_kernels=[...]` runs the named kernels' native twins.",
            "Engine option `native_kernels=[...]` runs the named kernels' native twins.\n\n"
            "RoPE scaling is read from config.json (`rope_parameters`, or the legacy `rope_scaling`\n"
            "+ `rope_theta`): `linear`, `dynamic`, `llama3` and `yarn` are supported.",
        )
    ]


def d_sched_counts():
    return [
        (
            SCHED,
            "    def has_unfinished(self) -> bool:\n        return bool(self.waiting or self.running)\n",
            "    def has_unfinished(self) -> bool:\n        return bool(self.waiting or self.running)\n\n"
            "    @property\n    def num_waiting(self) -> int:\n        return len(self.waiting)\n\n"
            "    @property\n    def num_running(self) -> int:\n        return len(self.running)\n",
        )
    ]


def d_sched_doc():
    return [
        (
            SCHED,
            "    def _chunk(self, seq: Sequence, budget: int) -> int:\n",
            "    def _chunk(self, seq: Sequence, budget: int) -> int:\n"
            '        """Tokens of `seq` to compute this step: all that are left, or (chunked) what the budget allows."""\n',
        )
    ]


def d_engine_abort():
    return [
        (
            ENGINE,
            "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n",
            "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n\n"
            "    def abort_request(self, request_id: str) -> bool:\n"
            '        """Drop a request wherever it is; its blocks go back to the pool. -> whether it was found."""\n'
            "        for seq in list(self.scheduler.waiting):\n"
            "            if seq.request_id == request_id:\n"
            "                self.scheduler.waiting.remove(seq)\n"
            "                return True\n"
            "        for seq in list(self.scheduler.running):\n"
            "            if seq.request_id == request_id:\n"
            '                self.scheduler.finish(seq, "abort")\n'
            "                return True\n"
            "        return False\n",
        )
    ]


def d_engine_stats():
    return [
        (
            ENGINE,
            "        self.step_count = 0\n",
            "        self.step_count = 0\n        self.num_generated_tokens = 0     # statistics: tokens emitted so far\n",
        ),
        (
            ENGINE,
            "            seq.append_token(token, logprob, top)\n",
            "            seq.append_token(token, logprob, top)\n            self.num_generated_tokens += 1\n",
        ),
    ]


def d_bm_usage():
    return [
        (
            BM,
            "    @property\n    def num_free_blocks(self) -> int:\n        return len(self.free_queue)\n",
            "    @property\n    def num_free_blocks(self) -> int:\n        return len(self.free_queue)\n\n"
            "    @property\n    def usage(self) -> float:\n"
            '        """Fraction of KV blocks held by sequences (cached-but-free blocks count as free)."""\n'
            "        return 1.0 - self.num_free_blocks / len(self.blocks)\n",
        )
    ]


def d_bm_doc():
    return [
        (
            BM,
            'freed first, when a fresh block is needed.\n"""',
            "freed first, when a fresh block is needed.\n\n"
            "Invariant: a block is in the free queue exactly when no sequence holds it\n"
            '(ref_count == 0); its hash stays valid until it is handed out again.\n"""',
        )
    ]


def d_bm_repr():
    return [
        (
            BM,
            "        self.hash: int | None = None\n",
            "        self.hash: int | None = None\n\n"
            "    def __repr__(self) -> str:\n"
            '        return f"Block({self.block_id}, ref={self.ref_count}, cached={self.hash is not None})"\n',
        )
    ]


def d_seq_repr():
    return [
        (
            SEQ,
            "    @property\n    def is_finished(self) -> bool:\n        return self.status == SequenceStatus.FINISHED\n",
            "    @property\n    def is_finished(self) -> bool:\n        return self.status == SequenceStatus.FINISHED\n\n"
            "    def __repr__(self) -> str:\n"
            '        return (f"Sequence({self.request_id!r}, tokens={self.num_tokens}, "\n'
            '                f"computed={self.num_computed_tokens}, blocks={len(self.block_table)}, {self.status.name})")\n',
        )
    ]


def d_config_msg():
    return [
        (
            CONFIG,
            '            raise ValueError(f"block_size must be >= 1, got {self.block_size}")',
            '            raise ValueError(f"block_size must be a positive number of tokens, got {self.block_size}")',
        )
    ]


def d_config_doc():
    return [
        (
            CONFIG,
            '    """Per-layer sliding window (None = full attention)."""',
            '    """Per-layer sliding window (None = full attention).\n\n'
            "    `layer_types` (transformers 5) wins; without it gemma2 alternates and every other\n"
            "    arch uses `sliding_window` (or None) on all layers.\n"
            '    """',
        )
    ]


def d_runner_num_sampled():
    return [
        (
            RUNNER,
            "    top_logprobs: list[dict | None]\n",
            "    top_logprobs: list[dict | None]\n\n"
            "    @property\n    def num_sampled(self) -> int:\n        return len(self.token_ids)\n",
        )
    ]


def d_runner_doc():
    return [
        (
            RUNNER,
            "    @staticmethod\n    def block_tables(seqs: list[Sequence]) -> torch.Tensor:\n",
            "    @staticmethod\n    def block_tables(seqs: list[Sequence]) -> torch.Tensor:\n"
            '        """[B, max_blocks] physical block ids, right-padded with block 0 (never read: masked)."""\n',
        )
    ]


def d_attn_gather_doc():
    return [
        (
            OPS_ATTN,
            '    """Tokens [start, end) of one sequence from the paged cache -> [end - start, KVH, D]."""',
            '    """Tokens [start, end) of one sequence from the paged cache -> [end - start, KVH, D].\n\n'
            "    Only the blocks covering [start, end) are read; `block_table` may be padded past them.\n"
            '    """',
        )
    ]


def d_attn_merge_doc():
    return [
        (
            OPS_ATTN,
            '    """Combine per-partition outputs by their log-sum-exp. [P, ...,D], [P, ...] -> [..., D]."""',
            '    """Combine per-partition outputs by their log-sum-exp. [P, ...,D], [P, ...] -> [..., D].\n\n'
            "    Partitions with no visible key have lse = -inf and get weight 0.\n"
            '    """',
        )
    ]


def d_attn_layer_repr():
    return [
        (
            ATTN_LAYER,
            "        self._kernel = kernels.paged_attention\n",
            "        self._kernel = kernels.paged_attention\n\n"
            "    def extra_repr(self) -> str:\n"
            '        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "\n'
            '                f"window={self.sliding_window}, softcap={self.softcap}")\n',
        )
    ]


def d_norm_doc():
    return [
        (
            OPS_NORM,
            "def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:\n    # [T, H] -> [T, H]\n",
            "def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:\n    # [T, H] -> [T, H]; written out step by step, no fused ops\n",
        )
    ]


def d_layernorm_repr():
    return [
        (
            ("tinyserve/layers/layernorm.py"),
            "    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):\n",
            "    def extra_repr(self) -> str:\n"
            '        return f"{self.weight.shape[0]}, eps={self.eps}, offset={self.weight_offset}"\n\n'
            "    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):\n",
        )
    ]


def d_rope_mscale_doc():
    return [
        (
            ROPE,
            "def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:\n",
            "def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:\n"
            '    """YaRN attention temperature: 0.1 * mscale * ln(scale) + 1 (1 when not extending)."""\n',
        )
    ]


def d_rope_repr():
    return [
        (
            ROPE,
            "    def forward(self, positions, query, key):\n",
            "    def extra_repr(self) -> str:\n"
            "        return f\"head_dim={self.head_dim}, rope_type={self.rope['rope_type']}, theta={self.rope['rope_theta']}\"\n\n"
            "    def forward(self, positions, query, key):\n",
        )
    ]


def d_rotary_kernel_doc():
    return [
        (
            OPS_ROT,
            "def _rotate_half(x: torch.Tensor) -> torch.Tensor:\n",
            "def _rotate_half(x: torch.Tensor) -> torch.Tensor:\n    # [..., D] -> [-x2, x1]\n",
        )
    ]


def d_llama_embeddings():
    return [
        (
            LLAMA,
            "    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:\n        return self.logits_processor(self.lm_head, hidden)\n",
            "    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:\n        return self.logits_processor(self.lm_head, hidden)\n\n"
            "    def get_input_embeddings(self) -> nn.Module:\n        return self.model.embed_tokens\n",
        )
    ]


def d_gemma_doc():
    return [
        (
            GEMMA,
            'query_pre_attn_scalar, sliding window on alternate layers, gelu-tanh, tied head."""',
            "query_pre_attn_scalar, sliding window on alternate layers, gelu-tanh, tied head.\n\n"
            "Norm placement per layer: input -> attn -> post_attention -> (+residual) pre_feedforward\n"
            '-> mlp -> post_feedforward; the residual add is fused into the next norm."""',
        )
    ]


def d_loader_msg():
    return [
        (
            LOADER,
            '        raise FileNotFoundError(f"no *.safetensors in {model_dir}")',
            '        raise FileNotFoundError(f"no *.safetensors in {model_dir} (is it an HF-format checkpoint dir?)")',
        )
    ]


def d_sampling_clone():
    return [
        (SAMPLING, "from dataclasses import dataclass, field\n", "from dataclasses import dataclass, field, replace\n"),
        (
            SAMPLING,
            "    @property\n    def greedy(self) -> bool:\n        return self.temperature == 0.0\n",
            "    @property\n    def greedy(self) -> bool:\n        return self.temperature == 0.0\n\n"
            '    def clone(self, **changes) -> "SamplingParams":\n        return replace(self, **changes)\n',
        ),
    ]


def d_tokenizer_vocab():
    return [
        (
            TOKENIZER,
            "    def encode(self, text: str) -> list[int]:\n",
            "    @property\n    def vocab_size(self) -> int:\n        return self._tok.get_vocab_size()\n\n"
            "    def encode(self, text: str) -> list[int]:\n",
        )
    ]


def d_llm_doc():
    return [
        (
            LLM_PY,
            '        """prompts: a text, a token-id list, or a list of either. -> outputs in prompt order."""',
            '        """prompts: a text, a token-id list, or a list of either. -> outputs in prompt order.\n\n'
            "        One SamplingParams applies to every prompt; a list gives one per prompt.\n"
            '        """',
        )
    ]


TEST_BLOCK_MANAGER = '''"""Block manager bookkeeping (no model needed)."""
from tinyserve.engine.block_manager import BlockManager
from tinyserve.engine.sequence import Sequence
from tinyserve.sampling_params import SamplingParams


def make_seq(i, tokens):
    return Sequence(i, str(i), tokens, SamplingParams(), None)


def test_allocate_and_free_return_every_block():
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq(0, list(range(10)))
    assert bm.allocate(seq, [], 10)
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 1
    bm.free(seq)
    assert bm.num_free_blocks == 4 and seq.block_table == []


def test_allocate_is_all_or_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq(0, list(range(12)))
    assert not bm.allocate(seq, [], 12)
    assert bm.num_free_blocks == 2
'''

TEST_ROTARY = '''"""Rotary kernels: the optimized path matches its native twin."""
import torch

from tinyserve.layers.rotary_embedding import compute_cos_sin_cache, default_inv_freq
from tinyserve.ops.rotary import rotary_embedding, rotary_embedding_native


def test_rotary_matches_native():
    torch.manual_seed(0)
    inv_freq, scale = default_inv_freq({"rope_theta": 10000.0}, 16, 64)
    cache = compute_cos_sin_cache(inv_freq, torch.arange(64), scale)
    positions = torch.arange(5, 12)
    q, k = torch.randn(7, 4 * 16), torch.randn(7, 2 * 16)
    for a, b in zip(rotary_embedding(positions, q, k, cache, 16), rotary_embedding_native(positions, q, k, cache, 16)):
        torch.testing.assert_close(a, b)
'''

TEST_NORM = '''"""RMSNorm kernels: optimized and native agree, with and without Gemma's offset."""
import torch

from tinyserve.ops.norm import fused_add_rms_norm, fused_add_rms_norm_native


def test_fused_add_rms_norm_matches_native():
    torch.manual_seed(0)
    x, res, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    want, want_res = fused_add_rms_norm_native(x.clone(), res.clone(), w, 1e-6)
    got, got_res = fused_add_rms_norm(x.clone(), res.clone(), w, 1e-6)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_res, want_res)
'''


def d_test_block_manager():
    return [("tests/test_block_manager.py", None, TEST_BLOCK_MANAGER)]


def d_test_rotary():
    return [("tests/test_rotary.py", None, TEST_ROTARY)]


def d_test_norm():
    return [("tests/test_norm.py", None, TEST_NORM)]


def prompt(seed: int, n: int) -> list[int]:
    """n deterministic token ids, avoiding the special ids 0-2."""
    rng = random.Random(seed)
    return [rng.randint(3, 511) for _ in range(n)]


def history(start: str, seed: int, entries: list[tuple[str, str, list]]) -> list[Step]:
    """[(author, message, edits)] -> Steps with increasing dates."""
    ds = dates(start, len(entries), seed)
    return [Step(message=msg, author=author, date=d, edits=edits) for d, (author, msg, edits) in zip(ds, entries)]


# ============================================================================= the cases


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


def case_swa_window_edge() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "        mask &= kv_pos > q_pos - sliding_window\n",
            "        mask &= kv_pos >= q_pos - sliding_window   # the window counts past tokens\n",
        )
    ]
    steps = history(
        "2025-06-02",
        1104,
        [
            (OLGA, "config: document how per-layer windows are chosen", d_config_doc()),
            (MARCO, "attention layer: extra_repr", d_attn_layer_repr()),
            (YUKI, "ops/rotary: comment _rotate_half", d_rotary_kernel_doc()),
            (
                SOFIA,
                "attention: count the sliding window in past tokens\n\n"
                "Mistral describes the window as the number of previous tokens a query may attend to;\n"
                "make the mask say that explicitly.",
                bug,
            ),
            (KENJI, "model_runner: document block_tables padding", d_runner_doc()),
            (DANIEL, "scheduler: document _chunk", d_sched_doc()),
            (LENA, "llm: document per-prompt sampling params", d_llm_doc()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-swa-window-edge",
        issue_number=1104,
        category="attention",
        modeled_on=["vllm-project/vllm#3385", "huggingface/transformers#29623", "sgl-project/sglang#4823"],
        title="Mistral outputs drift from transformers once the prompt is longer than the sliding window",
        issue=issue_text("ts-swa-window-edge"),
        repro=repro_toml(
            {"arch": "mistral", "seed": 0},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(41, 48), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
            good_ref="base",
        ),
        truth_file=OPS_ATTN,
        truth_function="_visible",
        component="attention",
        mechanism="sliding-window mask uses >= instead of >, letting each query see sliding_window + 1 keys "
        "once the context is longer than the window",
        steps=steps,
        bug_index=4,
    )


def case_chunk_causal_offset() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "    q_pos = torch.arange(seq_len - L, seq_len).view(L, 1)\n",
            "    ctx_len = seq_len - L                          # tokens cached before this chunk\n"
            "    q_pos = torch.arange(L).view(L, 1)             # query rows, relative to the chunk\n",
        ),
        (
            OPS_ATTN,
            "    for t0 in _prefill_tile_range(seq_len - L, seq_len, sliding_window):\n",
            "    for t0 in _prefill_tile_range(ctx_len, seq_len, sliding_window):\n",
        ),
    ]
    steps = history(
        "2025-07-07",
        1105,
        [
            (AMARA, "docs: explain the chunked-prefill token budget", d_readme_chunked()),
            (HANNAH, "ops/attention: note on padded block tables", d_attn_gather_doc()),
            (TOMAS, "sampling_params: add clone()", d_sampling_clone()),
            (PRIYA, "scheduler: expose num_waiting / num_running", d_sched_counts()),
            (WEI, "ops/attention: note on empty partitions in the LSE merge", d_attn_merge_doc()),
            (
                MARCO,
                "attention(prefill): name the cached context length\n\n"
                "No functional change intended: hoist seq_len - L into ctx_len and express the query\n"
                "rows relative to the chunk being computed.",
                bug,
            ),
            (OLGA, "model_runner: StepResult.num_sampled", d_runner_num_sampled()),
            (YUKI, "tests: rotary kernel parity", d_test_rotary()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-chunk-causal-offset",
        issue_number=1105,
        category="attention",
        modeled_on=["vllm-project/vllm#36580", "tenstorrent/vllm#415"],
        title="Nonsense output for long prompts when chunked prefill is enabled",
        issue=issue_text("ts-chunk-causal-offset"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 32, "block_size": 16},
            },
            [
                {"prompt_ids": prompt(51, 70), "max_tokens": 6, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": prompt(52, 12), "max_tokens": 6, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
            good_ref="HEAD~4",
        ),
        truth_file=OPS_ATTN,
        truth_function="paged_attention_prefill",
        component="attention",
        mechanism="prefill query positions made chunk-relative while key positions stay absolute, so every chunk "
        "after the first masks out almost all of the cached context",
        steps=steps,
        bug_index=6,
    )


def case_gqa_decode_layout() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "    qg = q.to(_acc(q.dtype)).view(B, kvh, H // kvh, D)\n",
            "    qg = q.to(_acc(q.dtype)).view(B, H // kvh, kvh, D).transpose(1, 2)   # [B, KVH, G, D], no copy\n",
        )
    ]
    steps = history(
        "2025-03-24",
        1106,
        [
            (
                KENJI,
                "attention(decode): group query heads per KV head with a strided view\n\n"
                "Build the [B, KVH, G, D] query layout the split-KV partitions consume as a view\n"
                "instead of materialising a reshaped copy of q.",
                bug,
            ),
            (LENA, "attention layer: extra_repr", d_attn_layer_repr()),
            (SOFIA, "config: clearer block_size error", d_config_msg()),
            (MARCO, "llama: get_input_embeddings()", d_llama_embeddings()),
            (DANIEL, "layernorm: extra_repr", d_layernorm_repr()),
            (YUKI, "tokenizer: vocab_size property", d_tokenizer_vocab()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-gqa-decode-layout",
        issue_number=1106,
        category="attention",
        modeled_on=["flashinfer-ai/flashinfer#1148", "flashinfer-ai/flashinfer#1614"],
        title="Only the first generated token matches transformers; every later token differs",
        issue=issue_text("ts-gqa-decode-layout"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [
                {"prompt_ids": prompt(61, 20), "max_tokens": 10, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": prompt(62, 14), "max_tokens": 10, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
        ),
        truth_file=OPS_ATTN,
        truth_function="paged_attention_decode",
        component="attention",
        mechanism="decode query heads grouped as h % num_kv_heads instead of h // group_size, so with "
        "1 < num_kv_heads < num_heads query heads attend with the wrong KV head",
        steps=steps,
        bug_index=1,
    )


def case_llama3_rope_context() -> CaseSpec:
    bug = [
        (
            ROPE,
            '    old_len = rope["original_max_position_embeddings"]\n    wavelen = 2 * math.pi / inv_freq\n',
            "    old_len = max_pos\n    wavelen = 2 * math.pi / inv_freq\n",
        )
    ]
    steps = history(
        "2025-08-04",
        1107,
        [
            (TOMAS, "docs: list supported RoPE scaling types", d_readme_rope()),
            (
                OLGA,
                "rope(llama3): take the wavelength bands from max_position_embeddings\n\n"
                "Use the model's configured context (the max_pos every other rotary path gets) instead\n"
                "of a second length kept in the rope dict.",
                bug,
            ),
            (WEI, "rope: document the YaRN attention temperature", d_rope_mscale_doc()),
            (PRIYA, "rope: extra_repr", d_rope_repr()),
            (AMARA, "engine: add abort_request()", d_engine_abort()),
            (HANNAH, "tests: rotary kernel parity", d_test_rotary()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-llama3-rope-context",
        issue_number=1107,
        category="positional-encoding",
        modeled_on=["ggml-org/llama.cpp#24823", "unslothai/unsloth#6197"],
        title="Llama-3.1-style rope_scaling: logits differ from transformers beyond the first few positions",
        issue=issue_text("ts-llama3-rope-context"),
        repro=repro_toml(
            {
                "arch": "llama",
                "seed": 0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                },
            },
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [{"prompt_ids": prompt(71, 64), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
            good_ref="base",
        ),
        truth_file=ROPE,
        truth_function="llama3_inv_freq",
        component="rotary_embedding",
        mechanism="llama3 frequency bands computed from max_position_embeddings instead of "
        "original_max_position_embeddings, so mid frequencies are scaled wrongly",
        steps=steps,
        bug_index=2,
    )


def case_rope_packed_positions() -> CaseSpec:
    bug = [
        (
            OPS_ROT,
            "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)\n"
            "    return _rotate(query, cos, sin, head_dim), _rotate(key, cos, sin, head_dim)\n",
            "    # the rows of a forward cover consecutive positions: slice the table, no gather\n"
            "    start = int(positions[0]) if positions.numel() else 0\n"
            "    cos, sin = cos_sin_cache[start:start + positions.numel()].to(query.dtype).chunk(2, dim=-1)\n"
            "    return _rotate(query, cos, sin, head_dim), _rotate(key, cos, sin, head_dim)\n",
        )
    ]
    steps = history(
        "2025-09-15",
        1108,
        [
            (SOFIA, "ops/rotary: comment _rotate_half", d_rotary_kernel_doc()),
            (YUKI, "model_loader: hint at HF-format dirs in the missing-weights error", d_loader_msg()),
            (DANIEL, "engine: count generated tokens", d_engine_stats()),
            (LENA, "rope: extra_repr", d_rope_repr()),
            (
                KENJI,
                "perf(rotary): slice the cos/sin table instead of gathering it\n\n"
                "index_select over the whole [max_model_len, rot_dim] table shows up in CPU profiles\n"
                "of small models. A forward's rows are consecutive positions, so a slice is enough.",
                bug,
            ),
            (MARCO, "layernorm: extra_repr", d_layernorm_repr()),
            (OLGA, "tests: fused_add_rms_norm parity", d_test_norm()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-rope-packed-positions",
        issue_number=1108,
        category="positional-encoding",
        modeled_on=["flashinfer-ai/flashinfer#619", "vllm-project/vllm#3869"],
        title="Output depends on what else is in the batch: concurrent requests get wrong tokens",
        issue=issue_text("ts-rope-packed-positions"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0},
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [
                {"prompt_ids": prompt(81, 20), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": prompt(82, 29), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
            good_ref="HEAD~3",
        ),
        truth_file=OPS_ROT,
        truth_function="rotary_embedding",
        component="rotary_embedding",
        mechanism="rotary kernel slices cos/sin from positions[0] assuming one contiguous run, so in a packed "
        "batch of several sequences every sequence but the first is rotated at wrong positions",
        steps=steps,
        bug_index=5,
    )


def case_linear_rope_twice() -> CaseSpec:
    bug = [
        (
            ROPE,
            "        n = max(max_position, max_model_len)\n"
            "        # a plain attribute, not a buffer: it must stay fp32 when the model is cast\n"
            "        self.cos_sin_cache = compute_cos_sin_cache(inv_freq, torch.arange(n), self.attention_scaling)\n",
            "        n = max(max_position, max_model_len)\n"
            "        positions = torch.arange(n, dtype=torch.float32)\n"
            '        if rope_type == "linear":\n'
            '            positions = positions / rope["factor"]      # position interpolation\n'
            "        # a plain attribute, not a buffer: it must stay fp32 when the model is cast\n"
            "        self.cos_sin_cache = compute_cos_sin_cache(inv_freq, positions, self.attention_scaling)\n",
        )
    ]
    steps = history(
        "2025-04-20",
        1109,
        [
            (
                PRIYA,
                "rope: position interpolation for linear scaling\n\n"
                "Linear scaling (Chen et al., 2023) interpolates positions by 1/factor; build the cos/sin\n"
                "table over the interpolated positions.",
                bug,
            ),
            (AMARA, "ops/rotary: comment _rotate_half", d_rotary_kernel_doc()),
            (TOMAS, "scheduler: document _chunk", d_sched_doc()),
            (WEI, "config: document how per-layer windows are chosen", d_config_doc()),
            (HANNAH, "tests: rotary kernel parity", d_test_rotary()),
            (LENA, "docs: list supported RoPE scaling types", d_readme_rope()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-linear-rope-twice",
        issue_number=1109,
        category="positional-encoding",
        modeled_on=["unslothai/unsloth#6197", "huggingface/transformers#25681"],
        title="Linear RoPE scaling (factor 4) model generates degraded text compared to transformers",
        issue=issue_text("ts-linear-rope-twice"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [{"prompt_ids": prompt(91, 40), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
        ),
        truth_file=ROPE,
        truth_function="RotaryEmbedding.__init__",
        component="rotary_embedding",
        mechanism="linear scaling divides the positions by factor on top of inv_freq already divided by factor, "
        "so the factor is applied twice",
        steps=steps,
        bug_index=1,
    )


def case_gemma_fused_norm_offset() -> CaseSpec:
    bug = [
        (
            OPS_NORM,
            "    residual.add_(x)\n    x.copy_(rms_norm(residual, weight, eps, weight_offset))\n    return x, residual\n",
            "    residual.add_(x)\n"
            "    rf = residual.to(_acc(residual.dtype))\n"
            "    inv_rms = torch.rsqrt(rf.square().mean(-1, keepdim=True) + eps)\n"
            "    x.copy_(weight * (rf * inv_rms).to(x.dtype))\n"
            "    return x, residual\n",
        )
    ]
    steps = history(
        "2025-10-06",
        1110,
        [
            (MARCO, "gemma2: document norm placement", d_gemma_doc()),
            (YUKI, "ops/norm: comment the native RMSNorm", d_norm_doc()),
            (
                SOFIA,
                "perf(norm): inline the normalisation in fused_add_rms_norm\n\n"
                "Saves a temporary per call on the residual path (the fused op runs twice per layer).",
                bug,
            ),
            (KENJI, "layernorm: extra_repr", d_layernorm_repr()),
            (DANIEL, "sequence: readable repr", d_seq_repr()),
            (OLGA, "tokenizer: vocab_size property", d_tokenizer_vocab()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-gemma-fused-norm-offset",
        issue_number=1110,
        category="numerics",
        modeled_on=["vllm-project/vllm#5908", "ggml-org/llama.cpp#8197", "vllm-project/vllm#40290"],
        title="Gemma 2 answers with the same token over and over; Llama fine",
        issue=issue_text("ts-gemma-fused-norm-offset"),
        repro=repro_toml(
            {"arch": "gemma2", "seed": 0},
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [{"prompt_ids": prompt(101, 24), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
            good_ref="HEAD~4",
        ),
        truth_file=OPS_NORM,
        truth_function="fused_add_rms_norm",
        component="layernorm",
        mechanism="fused add+RMSNorm ignores weight_offset, so Gemma's (1 + w) norms scale by w (zero-initialised) "
        "on every fused norm",
        steps=steps,
        bug_index=3,
    )


def case_config_eps_defaults() -> CaseSpec:
    bug = [
        (
            CONFIG,
            'SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "gemma2")\n',
            'SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "gemma2")\n'
            "# keys some exported config.json files leave out, per architecture\n"
            "ARCH_DEFAULTS = {\n"
            '    "llama": {"rms_norm_eps": 1e-6, "hidden_act": "silu"},\n'
            '    "mistral": {"rms_norm_eps": 1e-6, "hidden_act": "silu"},\n'
            '    "qwen2": {"rms_norm_eps": 1e-6, "hidden_act": "silu"},\n'
            '    "gemma2": {"rms_norm_eps": 1e-6},\n'
            "}\n",
        ),
        (
            CONFIG,
            '        heads = hf["num_attention_heads"]\n',
            '        hf = {**hf, **ARCH_DEFAULTS.get(arch, {})}\n        heads = hf["num_attention_heads"]\n',
        ),
    ]
    steps = history(
        "2025-03-03",
        1111,
        [
            (
                HANNAH,
                "config: per-arch defaults for keys older config.json files omit\n\n"
                "Some exported configs drop rms_norm_eps / hidden_act; fill them from the\n"
                "architecture's defaults instead of one global fallback.",
                bug,
            ),
            (DANIEL, "model_loader: hint at HF-format dirs in the missing-weights error", d_loader_msg()),
            (KENJI, "llama: get_input_embeddings()", d_llama_embeddings()),
            (PRIYA, "ops/norm: comment the native RMSNorm", d_norm_doc()),
            (SOFIA, "docs: describe prefix-caching statistics", d_readme_prefix_stats()),
            (TOMAS, "block_manager: Block repr", d_bm_repr()),
            (AMARA, "tests: fused_add_rms_norm parity", d_test_norm()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-config-eps-defaults",
        issue_number=1111,
        category="numerics",
        modeled_on=["ggml-org/llama.cpp#21390", "ROCm/aiter#2586"],
        title="Small but systematic logprob mismatch vs transformers on one Llama checkpoint",
        issue=issue_text("ts-config-eps-defaults"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0, "rms_norm_eps": 1e-5},
            {"engine": "tinyserve", "dtype": "float32", "options": {}},
            [
                {"prompt_ids": prompt(111, 30), "max_tokens": 10, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": prompt(112, 18), "max_tokens": 10, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
        ),
        truth_file=CONFIG,
        truth_function="ModelConfig.from_dict",
        component="config",
        mechanism="per-arch defaults are merged over the checkpoint's config instead of under it, so a "
        "non-default rms_norm_eps is replaced by 1e-6",
        steps=steps,
        bug_index=1,
    )


def case_rope_invfreq_bf16() -> CaseSpec:
    lazy = [
        (
            ROPE,
            "def compute_cos_sin_cache(inv_freq: torch.Tensor, positions: torch.Tensor, attention_scaling: float) -> torch.Tensor:\n"
            "    # positions [P] -> [P, dim] fp32: cos | sin\n"
            "    freqs = positions.float()[:, None] * inv_freq.float()[None, :]\n"
            "    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)\n",
            "def compute_cos_sin_cache(inv_freq: torch.Tensor, positions: torch.Tensor, attention_scaling: float) -> torch.Tensor:\n"
            "    # positions [P] -> [P, dim] fp32: cos | sin (angles in inv_freq's dtype)\n"
            "    freqs = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]\n"
            "    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1).float()\n",
        ),
        (
            ROPE,
            "        n = max(max_position, max_model_len)\n"
            "        # a plain attribute, not a buffer: it must stay fp32 when the model is cast\n"
            "        self.cos_sin_cache = compute_cos_sin_cache(inv_freq, torch.arange(n), self.attention_scaling)\n"
            "        self._kernel = kernels.rotary_embedding\n",
            "        self.table_len = max(max_position, max_model_len)\n"
            "        # plain attributes, not buffers: they must stay fp32 when the model is cast\n"
            "        self.inv_freq = inv_freq\n"
            "        self._cos_sin_cache = None        # built on first use: a long max_model_len makes it large\n"
            "        self._kernel = kernels.rotary_embedding\n\n"
            "    @property\n"
            "    def cos_sin_cache(self) -> torch.Tensor:\n"
            "        if self._cos_sin_cache is None:\n"
            "            self._cos_sin_cache = compute_cos_sin_cache(self.inv_freq, torch.arange(self.table_len),\n"
            "                                                        self.attention_scaling)\n"
            "        return self._cos_sin_cache\n",
        ),
    ]
    bug = [
        (
            ROPE,
            "        # plain attributes, not buffers: they must stay fp32 when the model is cast\n"
            "        self.inv_freq = inv_freq\n",
            "        # inv_freq is a non-persistent buffer so it follows the module's .to(device)\n"
            '        self.register_buffer("inv_freq", inv_freq, persistent=False)\n',
        )
    ]
    steps = history(
        "2025-11-03",
        1112,
        [
            (LENA, "model_loader: hint at HF-format dirs in the missing-weights error", d_loader_msg()),
            (
                WEI,
                "rotary: build the cos/sin table on first use\n\n"
                "With max_model_len in the 100k range the table is built for every layer at start-up;\n"
                "build it lazily in the first forward instead.",
                lazy,
            ),
            (MARCO, "engine: add abort_request()", d_engine_abort()),
            (
                OLGA,
                "rotary: register inv_freq as a buffer\n\n"
                "Lets inv_freq follow the module when it is moved with .to(device), like the other\n"
                "tensors of the model (needed for the upcoming accelerator backend).",
                bug,
            ),
            (YUKI, "rope: document the YaRN attention temperature", d_rope_mscale_doc()),
            (PRIYA, "tests: rotary kernel parity", d_test_rotary()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="ts-rope-invfreq-bf16",
        issue_number=1112,
        category="numerics",
        modeled_on=["huggingface/transformers#29285", "huggingface/transformers#25681", "EleutherAI/gpt-neox#1003"],
        title="bfloat16 generations degrade with prompt length; float32 is fine",
        issue=issue_text("ts-rope-invfreq-bf16"),
        repro=repro_toml(
            {"arch": "llama", "seed": 0, "initializer_range": 0.2, "rope_theta": 1000.0},
            {"engine": "tinyserve", "dtype": "bfloat16", "options": {}},
            [{"prompt_ids": prompt(121, 90), "max_tokens": 12, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
            good_ref="HEAD~3",
        ),
        truth_file=ROPE,
        truth_function="RotaryEmbedding.__init__",
        component="rotary_embedding",
        mechanism="inv_freq registered as a buffer is cast to bf16 with the model, so the lazily built rotary "
        "table is computed from bf16 frequencies (bf16 angles); float32 runs are unaffected",
        steps=steps,
        bug_index=4,
    )


CASES = [
    case_prefix_hash_chain(),
    case_chunked_slot_mapping(),
    case_shared_block_refcount(),
    case_swa_window_edge(),
    case_chunk_causal_offset(),
    case_gqa_decode_layout(),
    case_llama3_rope_context(),
    case_rope_packed_positions(),
    case_linear_rope_twice(),
    case_gemma_fused_norm_offset(),
    case_config_eps_defaults(),
    case_rope_invfreq_bf16(),
]
