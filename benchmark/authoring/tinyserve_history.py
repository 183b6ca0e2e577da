"""What the tinyserve cases' histories are made of: subject file paths, contributors, commit dates,
prompts, and distractor edits (each a list of (file, old_text, new_text) replacements).

`_v2` marks a second, differently worded version of the same distractor; `dates` spaces commits
days apart, `dates_hourly` hours apart.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

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
SAMPLER = "tinyserve/layers/sampler.py"
PARAMS = "tinyserve/sampling_params.py"
OPS_ACT = "tinyserve/ops/activation.py"
EMBED = "tinyserve/layers/embedding.py"
LINEAR = "tinyserve/layers/linear.py"
FWD = "tinyserve/forward_context.py"
GEMMA2 = "tinyserve/models/gemma2.py"
QMM = "tinyserve/ops/quant_matmul.py"
QUANT = "tinyserve/quantization.py"
SPEC = "tinyserve/spec_decode/engine.py"
PROPOSERS = "tinyserve/spec_decode/proposers.py"
REJECTION = "tinyserve/spec_decode/rejection.py"
TP_LOADER = "tinyserve/distributed/loader.py"
TP_RUNNER = "tinyserve/distributed/runner.py"
TP_STATE = "tinyserve/distributed/parallel_state.py"
DETOK = "tinyserve/detokenizer.py"

# contributors (the authors of the commits)
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
NADIA = "Nadia Okonkwo <nadia.okonkwo@fastmail.com>"
RAFAEL = "Rafael Duarte <rduarte@inferlab.dev>"
MEI = "Mei Tanaka <mei.tanaka@proton.me>"
SVEN = "Sven Lindqvist <sven@lindqvist.se>"
ARJUN = "Arjun Mehta <arjun.mehta@gmail.com>"
CLAIRE = "Claire Dubois <claire.dubois@posteo.net>"
IGOR = "Igor Petrenko <ipetrenko@users.noreply.github.com>"
FATIMA = "Fatima Zahra <fzahra@inferlab.dev>"
JONAS = "Jonas Becker <jonas.becker@web.de>"
LUCIA = "Lucía Romero <lucia.romero@gmail.com>"
OWEN = "Owen Gallagher <owen.g@outlook.com>"
HYEJIN = "Hyejin Park <hyejin.park@kaist.ac.kr>"
NADIA_RAHMAN = "Nadia Rahman <nadia.rahman@fastmail.com>"
JONAS_BERG = "Jonas Berg <jonas.berg@posteo.de>"
MEI_LIN = "Mei Lin <mei.lin.dev@gmail.com>"
RAFAEL_COSTA = "Rafael Costa <rcosta@tinyserve.dev>"
ANYA = "Anya Volkova <a.volkova@tinyserve.dev>"
TARIQ = "Tariq Haddad <tariq.haddad@outlook.com>"


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


def dates_hourly(start: str, n: int, seed: int) -> list[str]:
    """n increasing ISO dates from `start` (YYYY-MM-DD), a few hours to a few days apart."""
    rng = random.Random(seed)
    t = datetime.fromisoformat(start).replace(hour=9, tzinfo=UTC)
    out = []
    for _ in range(n):
        t += timedelta(hours=rng.randrange(3, 80), minutes=rng.randrange(60))
        out.append(t.isoformat())
    return out


def history_hourly(start: str, seed: int, entries: list[tuple[str, str, list]]) -> list[Step]:
    ds = dates_hourly(start, len(entries), seed)
    return [Step(message=msg, author=author, date=d, edits=edits) for d, (author, msg, edits) in zip(ds, entries)]


def good_ref_before(n_steps: int, bug_index: int, extra: int = 0) -> str:
    """A relative ref to a commit before the bug: HEAD~k with k >= n - bug + 1."""
    return f"HEAD~{n_steps - bug_index + 1 + extra}"


GREEDY = {"temperature": 0.0, "ignore_eos": True}


def d_readme_native() -> list:
    return [
        (
            README,
            "Engine option `native_kernels=[...]` runs the named kernels' native twins.\n",
            "Engine option `native_kernels=[...]` runs the named kernels' native twins, e.g.\n"
            '`LLM(ckpt, native_kernels=["paged_attention"])` to rule out the tiled attention path\n'
            "when an output looks off.\n",
        )
    ]


def d_readme_sampling() -> list:
    return [
        (
            README,
            "Step-driven use (staggered arrivals, teacher forcing):",
            "Sampling follows vLLM's parameter names: `temperature`, `top_k`, `top_p`, `min_p`,\n"
            "`repetition_penalty` (HF semantics, prompt + output), `presence_penalty` /\n"
            "`frequency_penalty` (OpenAI semantics, output only), `seed`, `logprobs`.\n\n"
            "Step-driven use (staggered arrivals, teacher forcing):",
        )
    ]


def d_params_penalty_range() -> list:
    return [
        (
            PARAMS,
            "        if self.max_tokens < 1:\n",
            '        for name in ("presence_penalty", "frequency_penalty"):\n'
            "            if not -2.0 <= getattr(self, name) <= 2.0:\n"
            '                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")\n'
            "        if self.max_tokens < 1:\n",
        )
    ]


def d_params_clone() -> list:
    return [
        (
            PARAMS,
            "    @property\n    def greedy(self) -> bool:\n        return self.temperature == 0.0\n",
            "    @property\n    def greedy(self) -> bool:\n        return self.temperature == 0.0\n\n"
            '    def clone(self, **changes) -> "SamplingParams":\n'
            '        """A copy with `changes` applied (lists copied, so the copies do not share them)."""\n'
            "        from dataclasses import replace\n"
            "        return replace(self, stop=list(self.stop), stop_token_ids=list(self.stop_token_ids), **changes)\n",
        )
    ]


def d_seq_repr_v2() -> list:
    return [
        (
            SEQ,
            "        self.num_preemptions = 0\n\n    @property\n    def num_tokens(self) -> int:",
            "        self.num_preemptions = 0\n\n"
            "    def __repr__(self) -> str:\n"
            '        return (f"Sequence({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "\n'
            '                f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})")\n\n'
            "    @property\n    def num_tokens(self) -> int:",
        )
    ]


def d_engine_abort_v2() -> list:
    return [
        (
            ENGINE,
            "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n",
            "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n\n"
            "    def abort_request(self, request_id: str) -> bool:\n"
            '        """Drop a waiting or running request; its KV blocks go back to the pool.\n'
            '        -> whether the request was found."""\n'
            "        for seq in list(self.scheduler.running):\n"
            "            if seq.request_id == request_id:\n"
            '                self.scheduler.finish(seq, "abort")\n'
            "                return True\n"
            "        for seq in list(self.scheduler.waiting):\n"
            "            if seq.request_id == request_id:\n"
            "                self.scheduler.waiting.remove(seq)\n"
            "                return True\n"
            "        return False\n",
        )
    ]


def d_bm_usage_v2() -> list:
    return [
        (
            BM,
            "    @property\n    def num_free_blocks(self) -> int:\n        return len(self.free_queue)\n",
            "    @property\n    def num_free_blocks(self) -> int:\n        return len(self.free_queue)\n\n"
            "    @property\n    def usage(self) -> float:\n"
            '        """Share of KV blocks held by running sequences (cached-but-free blocks count as free)."""\n'
            "        return 1.0 - self.num_free_blocks / len(self.blocks)\n",
        )
    ]


def d_tokenizer_vocab_v2() -> list:
    return [
        (
            TOKENIZER,
            "    def decode(self, token_ids: list[int]) -> str:\n",
            "    @property\n    def vocab_size(self) -> int:\n        return self._tok.get_vocab_size(with_added_tokens=True)\n\n"
            "    def decode(self, token_ids: list[int]) -> str:\n",
        )
    ]


def d_loader_message() -> list:
    return [
        (
            LOADER,
            '        raise FileNotFoundError(f"no *.safetensors in {model_dir}")\n',
            '        raise FileNotFoundError(f"no *.safetensors in {model_dir}; tinyserve loads HF-format "\n'
            '                                "checkpoints saved with safe_serialization=True")\n',
        )
    ]


def d_fwd_doc() -> list:
    return [
        (
            FWD,
            "read which sequence and position each packed row belongs to.\n",
            "read which sequence and position each packed row belongs to.\n\n"
            "Only valid while a forward runs: outside one, get_forward_context() raises.\n",
        )
    ]


def d_config_max_num_seqs() -> list:
    return [
        (
            CONFIG,
            "        if self.block_size < 1:\n",
            "        if self.max_num_seqs < 1:\n"
            '            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")\n'
            "        if self.block_size < 1:\n",
        )
    ]


def d_config_dtype_alias() -> list:
    return [
        (
            CONFIG,
            'DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,\n'
            '          "float64": torch.float64}\n',
            'DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,\n'
            '          "float64": torch.float64}\n'
            'DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}\n',
        ),
        (
            CONFIG,
            "        if self.dtype not in DTYPES:\n",
            "        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)\n        if self.dtype not in DTYPES:\n",
        ),
    ]


def d_llm_doc_v2() -> list:
    return [
        (
            LLM_PY,
            '        """prompts: a text, a token-id list, or a list of either. -> outputs in prompt order."""\n',
            '        """prompts: a text, a token-id list, or a list of either. -> outputs in prompt order.\n\n'
            "        sampling_params: one SamplingParams for every prompt, or a list with one per prompt.\n"
            '        """\n',
        )
    ]


def d_embed_doc() -> list:
    return [
        (
            EMBED,
            '    """hidden [S, H] -> logits [S, V] in the model dtype, with Gemma\'s final soft-capping."""\n',
            '    """hidden [S, H] -> logits [S, V] in the model dtype, with Gemma\'s final soft-capping.\n\n'
            "    The LM head may hold padded vocab rows (TP-friendly sizes); they are cut off here.\n"
            '    """\n',
        )
    ]


def d_linear_doc() -> list:
    return [
        (
            LINEAR,
            'class RowLinear(ReplicatedLinear):\n    """Input-sharded under tensor parallelism (o_proj, down_proj); whole for now."""\n',
            "class RowLinear(ReplicatedLinear):\n"
            '    """Input-sharded under tensor parallelism (o_proj, down_proj); whole for now.\n\n'
            "    With TP each rank would hold input columns [rank * n / tp, (rank + 1) * n / tp) and the\n"
            "    partial outputs would be all-reduced; the bias is added once, after the reduction.\n"
            '    """\n',
        )
    ]


def d_rope_error() -> list:
    return [
        (
            ROPE,
            "            raise ValueError(f\"unsupported rope_type {rope_type!r}; supported: {', '.join(ROPE_SCALING)}\")\n",
            '            raise ValueError(f"unsupported rope_type {rope_type!r} (rope parameters: {sorted(rope)}); "\n'
            "                             f\"supported: {', '.join(ROPE_SCALING)}\")\n",
        )
    ]


def d_act_doc() -> list:
    return [
        (
            OPS_ACT,
            '"""Gated MLP activations: act(gate) * up over a fused [gate | up] projection."""\n',
            '"""Gated MLP activations: act(gate) * up over a fused [gate | up] projection.\n\n'
            "The optimized paths call torch's fused activations and multiply in place into a fresh\n"
            "buffer; the native twins spell the formulas out in fp32.\n"
            '"""\n',
        )
    ]


def d_norm_doc_v2() -> list:
    return [
        (
            OPS_NORM,
            "as 1+w) multiplies in fp32 and casts at the end.\n",
            "as 1+w) multiplies in fp32 and casts at the end.\n\n"
            "fused_add_rms_norm works in place on both of its inputs; callers must not reuse `x`\n"
            "afterwards (it holds the normalised output).\n",
        )
    ]


def d_attn_consts_doc() -> list:
    return [
        (
            OPS_ATTN,
            "KV_TILE_TOKENS = 32        # prefill: keys/values visited per online-softmax tile\n"
            "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition\n",
            "# Tile sizes trade the number of python-level iterations against the size of the score\n"
            "# tensors; they do not change results beyond fp rounding.\n"
            "KV_TILE_TOKENS = 32        # prefill: keys/values visited per online-softmax tile\n"
            "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition (rounded up to whole blocks)\n",
        )
    ]


def d_attn_write_check() -> list:
    return [
        (
            OPS_ATTN,
            "    kvh, d = key.shape[1], key.shape[2]\n    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)\n",
            "    kvh, d = key.shape[1], key.shape[2]\n"
            "    if slot_mapping.shape[0] != key.shape[0]:\n"
            '        raise ValueError(f"{key.shape[0]} new keys but {slot_mapping.shape[0]} slots")\n'
            "    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)\n",
        )
    ]


def d_sampler_doc() -> list:
    return [
        (
            SAMPLER,
            "from the request's own generator, so a seeded request is reproducible whatever\nit is batched with.\n",
            "from the request's own generator, so a seeded request is reproducible whatever\nit is batched with.\n\n"
            "Logprobs are reported under the raw model distribution (compute_logprobs), as vLLM does\n"
            "by default, not under the penalised / truncated one.\n",
        )
    ]


def d_sampler_topk_comment() -> list:
    return [
        (
            SAMPLER,
            "        # keep every logit >= the k-th largest (ties at the boundary survive, as in HF)\n",
            "        # keep every logit >= the k-th largest (ties at the boundary survive, as in HF);\n"
            "        # rows with top-k off carry k = vocab size, whose k-th largest is the minimum\n",
        )
    ]


def d_runner_doc_v2() -> list:
    return [
        (
            RUNNER,
            '"""Model runner: owns the model, the KV cache and the sampler; turns a scheduled\n'
            'batch into packed tensors, runs one forward and samples."""\n',
            '"""Model runner: owns the model, the KV cache and the sampler; turns a scheduled\n'
            "batch into packed tensors, runs one forward and samples.\n\n"
            "Packing: the new tokens of every scheduled sequence are laid out back to back (decodes\n"
            "first, then prefill chunks, in scheduler order); a sequence whose context is complete\n"
            "after this step contributes its last row to the logits.\n"
            '"""\n',
        )
    ]


def d_runner_kv_bytes() -> list:
    return [
        (
            RUNNER,
            "    def prepare_inputs(self, batch: SchedulerOutput, step: int)",
            "    @property\n    def kv_cache_bytes(self) -> int:\n"
            "        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv_caches)\n\n"
            "    def prepare_inputs(self, batch: SchedulerOutput, step: int)",
        )
    ]


def d_llama_doc() -> list:
    return [
        (
            LLAMA,
            "Residual stream convention (as vLLM): each layer returns (hidden, residual) and\n"
            "the next norm adds them, fused; the final norm adds the last layer's pair.\n",
            "Residual stream convention (as vLLM): each layer returns (hidden, residual) and\n"
            "the next norm adds them, fused; the final norm adds the last layer's pair.\n\n"
            "Architecture differences handled here as data: qwen2's q/k/v bias, mistral's sliding\n"
            "window, llama's optional attention / MLP biases.\n",
        )
    ]


def d_gemma2_doc() -> list:
    return [
        (
            GEMMA2,
            'query_pre_attn_scalar, sliding window on alternate layers, gelu-tanh, tied head."""\n',
            "query_pre_attn_scalar, sliding window on alternate layers, gelu-tanh, tied head.\n\n"
            "Layer norms: input -> attn -> post_attention, pre_feedforward -> mlp -> post_feedforward.\n"
            '"""\n',
        )
    ]


def d_test_sampling_params() -> list:
    return [
        (
            "tests/test_sampling_params.py",
            None,
            "import pytest\n\nfrom tinyserve.sampling_params import SamplingParams\n\n\n"
            "def test_defaults_are_valid():\n    p = SamplingParams()\n    assert p.temperature == 1.0 and not p.greedy\n\n\n"
            '@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_p": 0.0}, {"min_p": 1.5},\n'
            '                                {"repetition_penalty": 0}, {"max_tokens": 0}, {"logprobs": -1}])\n'
            "def test_rejects_bad_values(kw):\n    with pytest.raises(ValueError):\n        SamplingParams(**kw)\n\n\n"
            'def test_stop_string_becomes_list():\n    assert SamplingParams(stop="\\n").stop == ["\\n"]\n',
        )
    ]


def d_test_block_manager_v2() -> list:
    return [
        (
            "tests/test_block_manager.py",
            None,
            "from tinyserve.engine.block_manager import BlockManager\n"
            "from tinyserve.engine.sequence import Sequence\n"
            "from tinyserve.sampling_params import SamplingParams\n\n\n"
            "def _seq(i, n):\n    return Sequence(i, str(i), list(range(3, 3 + n)), SamplingParams(), generator=None)\n\n\n"
            "def test_allocate_and_free_round_trip():\n"
            "    bm = BlockManager(8, 4)\n    s = _seq(0, 10)\n"
            "    assert bm.allocate(s, [], 10)\n    assert len(s.block_table) == 3 and bm.num_free_blocks == 5\n"
            "    bm.free(s)\n    assert bm.num_free_blocks == 8 and s.block_table == []\n\n\n"
            "def test_allocate_is_all_or_nothing():\n"
            "    bm = BlockManager(2, 4)\n    s = _seq(0, 12)\n"
            "    assert not bm.allocate(s, [], 12)\n    assert bm.num_free_blocks == 2\n",
        )
    ]


def d_test_kernels() -> list:
    return [
        (
            "tests/test_kernel_twins.py",
            None,
            "import torch\n\nfrom tinyserve.ops import KERNEL_IMPLS\n\n\n"
            "def test_rms_norm_twins_agree():\n"
            '    fast, native = KERNEL_IMPLS["rms_norm"]\n'
            "    x, w = torch.randn(5, 64), torch.randn(64)\n"
            "    torch.testing.assert_close(fast(x, w, 1e-6), native(x, w, 1e-6))\n\n\n"
            "def test_silu_and_mul_twins_agree():\n"
            '    fast, native = KERNEL_IMPLS["silu_and_mul"]\n'
            "    x = torch.randn(7, 32)\n"
            "    torch.testing.assert_close(fast(x.clone()), native(x.clone()))\n",
        )
    ]


def d_test_config() -> list:
    return [
        (
            "tests/test_config.py",
            None,
            "from tinyserve.config import ModelConfig, rope_parameters, sliding_windows\n\n\n"
            "def test_rope_defaults():\n"
            '    assert rope_parameters({}) == {"rope_type": "default", "rope_theta": 10000.0}\n\n\n'
            "def test_gemma2_alternates_windows_without_layer_types():\n"
            '    assert sliding_windows({"model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 8}) == \\\n'
            "        [8, None, 8, None]\n\n\n"
            "def test_unknown_arch_is_rejected():\n"
            "    import pytest\n"
            "    with pytest.raises(ValueError):\n"
            '        ModelConfig.from_dict({"model_type": "gpt2"})\n',
        )
    ]


def dated_steps(dated: list[tuple[str, str, str, list]]) -> list[Step]:
    """[(date, author, message, edits)] -> Steps."""
    return [Step(message=m, author=a, date=d, edits=e) for d, a, m, e in dated]


def tinyserve_repro(arch: str, dtype: str, options: dict, requests: list[dict], good_ref: str | None = None) -> dict:
    data = {
        "model": {"arch": arch, "seed": 0},
        "target": {"engine": "tinyserve", "dtype": dtype, "options": options},
        "workload": {"requests": requests},
    }
    return {"good_ref": good_ref, **data} if good_ref else data
