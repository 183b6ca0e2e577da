"""Benchmark cases 1201-1212 on the tinyserve subject: batching, sampling, kernel, model-config.

    python -m benchmark.authoring.tinyserve_b [--cases-dir DIR] [CASE_ID ...]

Re-runnable: every case's history is data (distractor and bug edits are unique text
replacements against the current subject source), replayed by `benchmark.author.write_patches`;
the case folder's case.toml / issue.md / repro.toml / truth.toml are rewritten each run.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.patches import Step

SUBJECT = "tinyserve"

# subject files
README = "README.md"
CONFIG = "tinyserve/config.py"
RUNNER = "tinyserve/engine/model_runner.py"
SCHED = "tinyserve/engine/scheduler.py"
BM = "tinyserve/engine/block_manager.py"
ENGINE = "tinyserve/engine/llm_engine.py"
SEQ = "tinyserve/engine/sequence.py"
SAMPLER = "tinyserve/layers/sampler.py"
PARAMS = "tinyserve/sampling_params.py"
OPS_ATTN = "tinyserve/ops/attention.py"
OPS_NORM = "tinyserve/ops/norm.py"
OPS_ACT = "tinyserve/ops/activation.py"
ROPE = "tinyserve/layers/rotary_embedding.py"
EMBED = "tinyserve/layers/embedding.py"
LINEAR = "tinyserve/layers/linear.py"
LOADER = "tinyserve/model_loader.py"
TOKENIZER = "tinyserve/tokenizer.py"
FWD = "tinyserve/forward_context.py"
LLM_PY = "tinyserve/llm.py"
LLAMA = "tinyserve/models/llama.py"
GEMMA2 = "tinyserve/models/gemma2.py"

# authors (fictional)
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


# ============================================================================= helpers


def prompt(seed: int, n: int) -> list[int]:
    """n deterministic token ids, clear of the special ids 0..2."""
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


def dates(start: str, n: int, seed: int) -> list[str]:
    """n increasing ISO dates from `start` (YYYY-MM-DD), a few hours to a few days apart."""
    rng = random.Random(seed)
    t = datetime.fromisoformat(start).replace(hour=9, tzinfo=UTC)
    out = []
    for _ in range(n):
        t += timedelta(hours=rng.randrange(3, 80), minutes=rng.randrange(60))
        out.append(t.isoformat())
    return out


def history(start: str, seed: int, entries: list[tuple[str, str, list]]) -> list[Step]:
    ds = dates(start, len(entries), seed)
    return [Step(message=msg, author=author, date=d, edits=edits) for d, (author, msg, edits) in zip(ds, entries)]


def good_ref_before(n_steps: int, bug_index: int, extra: int = 0) -> str:
    """A relative ref to a commit before the bug: HEAD~k with k >= n - bug + 1."""
    return f"HEAD~{n_steps - bug_index + 1 + extra}"


GREEDY = {"temperature": 0.0, "ignore_eos": True}


# ============================================================================= distractors
# Behaviour-neutral changes (docs, tests, validation of values no scenario uses, new methods).


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


def d_seq_repr() -> list:
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


def d_engine_abort() -> list:
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


def d_bm_usage() -> list:
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


def d_sched_counts() -> list:
    return [
        (
            SCHED,
            "    def has_unfinished(self) -> bool:\n        return bool(self.waiting or self.running)\n",
            "    def has_unfinished(self) -> bool:\n        return bool(self.waiting or self.running)\n\n"
            "    @property\n    def num_waiting(self) -> int:\n        return len(self.waiting)\n\n"
            "    @property\n    def num_running(self) -> int:\n        return len(self.running)\n",
        )
    ]


def d_tokenizer_vocab() -> list:
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


def d_llm_doc() -> list:
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


def d_norm_doc() -> list:
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


def d_runner_doc() -> list:
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


def d_test_block_manager() -> list:
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


# ============================================================================= batching


def case_mixed_step_prefill_offset() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "    for s in (q_lens > 1).nonzero().flatten().tolist():\n"
            "        a, b = int(query_start_loc[s]), int(query_start_loc[s + 1])\n"
            "        out[a:b] = paged_attention_prefill(query[a:b], key_cache, value_cache, block_tables[s],\n"
            "                                           int(seq_lens[s]), scale, sliding_window, softcap)\n"
            "    return out\n",
            "    a = 0\n"
            "    for s, n in enumerate(q_lens.tolist()):   # one host sync for the batch, not two per sequence\n"
            "        if n == 1:\n"
            "            continue                          # decode rows: done above\n"
            "        out[a:a + n] = paged_attention_prefill(query[a:a + n], key_cache, value_cache, block_tables[s],\n"
            "                                               int(seq_lens[s]), scale, sliding_window, softcap)\n"
            "        a += n\n"
            "    return out\n",
        )
    ]
    entries = [
        (SVEN, "docs: how to rule out the optimized kernels", d_readme_native()),
        (MEI, "sequence: readable repr", d_seq_repr()),
        (ARJUN, "ops/attention: check slot_mapping length when writing the KV cache", d_attn_write_check()),
        (
            RAFAEL,
            "perf(attention): walk prefill sequences without per-sequence tensor indexing\n\n"
            "The prefill dispatch did two .item() conversions of query_start_loc per sequence.\n"
            "Convert q_lens once and keep the running row offset on the host instead.",
            bug,
        ),
        (CLAIRE, "engine: add abort_request()", d_engine_abort()),
        (IGOR, "tests: block manager allocate/free", d_test_block_manager()),
        (NADIA, "model_loader: clearer message when no safetensors are found", d_loader_message()),
    ]
    steps, bug_index = history("2025-02-03", 1201, entries), 4
    a, b = prompt(1201, 12), prompt(2201, 22)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-mixed-step-prefill-offset",
        issue_number=1201,
        category="batching",
        modeled_on=["flashinfer-ai/flashinfer#4382", "NVIDIA/TensorRT-LLM#8813"],
        title="With chunked prefill on, a request that arrives while another is decoding gets garbage output",
        issue=issue_text("ts-mixed-step-prefill-offset"),
        repro=repro_toml(
            {"arch": "llama", "seed": 1},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 64, "block_size": 16},
            },
            [
                {"prompt_ids": a, "max_tokens": 12, "sampling": GREEDY, "arrival_step": 0},
                {"prompt_ids": b, "max_tokens": 8, "sampling": GREEDY, "arrival_step": 3},
            ],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=OPS_ATTN,
        truth_function="paged_attention",
        component="paged_attention",
        mechanism="prefill row offset only advances over prefill sequences, so when decode rows precede a prefill "
        "chunk in the packed batch the chunk reads and writes the wrong query/output rows",
        steps=steps,
        bug_index=bug_index,
    )


def case_stale_block_table_row() -> CaseSpec:
    bug = [
        (
            RUNNER,
            "    @staticmethod\n"
            "    def block_tables(seqs: list[Sequence]) -> torch.Tensor:\n"
            "        width = max(len(s.block_table) for s in seqs)\n"
            "        return torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], dtype=torch.long)\n",
            "    def block_tables(self, seqs: list[Sequence]) -> torch.Tensor:\n"
            '        """[B, max_blocks] block ids padded with 0, from a buffer kept across steps: a row is\n'
            '        rewritten only when its block count changed (most decode steps add no block)."""\n'
            "        width = max(len(s.block_table) for s in seqs)\n"
            '        buf = getattr(self, "_block_table_buf", None)\n'
            "        if buf is None or buf.shape[0] < len(seqs) or buf.shape[1] < width:\n"
            "            buf = torch.zeros(max(len(seqs), 8), max(width, 16), dtype=torch.long)\n"
            "            self._block_table_buf, self._block_table_lens = buf, [-1] * buf.shape[0]\n"
            "        for i, s in enumerate(seqs):\n"
            "            n = len(s.block_table)\n"
            "            if self._block_table_lens[i] != n:\n"
            "                buf[i, :n] = torch.tensor(s.block_table, dtype=torch.long)\n"
            "                buf[i, n:] = 0\n"
            "                self._block_table_lens[i] = n\n"
            "        return buf[:len(seqs), :width].clone()\n",
        )
    ]
    entries = [
        (
            FATIMA,
            "perf(model_runner): keep the block-table tensor across steps\n\n"
            "Building the [B, max_blocks] tensor from python lists every step showed up in decode\n"
            "profiles with many running sequences. Keep a buffer and only rewrite rows whose\n"
            "block count changed.",
            bug,
        ),
        (OWEN, "block_manager: add usage property", d_bm_usage()),
        (MEI, "sampling_params: validate presence/frequency penalty range", d_params_penalty_range()),
        (JONAS, "tests: sampling params validation", d_test_sampling_params()),
        (LUCIA, "llm: document per-prompt sampling params", d_llm_doc()),
        (ARJUN, "forward_context: note that it is only valid inside a forward", d_fwd_doc()),
    ]
    steps = history("2025-03-17", 1202, entries)
    a, b = prompt(1202, 20), prompt(2202, 22)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-stale-block-table-row",
        issue_number=1202,
        category="batching",
        modeled_on=["tenstorrent/vllm-tt-plugin#104", "NVIDIA/TensorRT-LLM#8813"],
        title="Long request's output turns to garbage right after a shorter request in the same batch finishes",
        issue=issue_text("ts-stale-block-table-row"),
        repro=repro_toml(
            {"arch": "llama", "seed": 2},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [
                {"prompt_ids": a, "max_tokens": 4, "sampling": GREEDY},
                {"prompt_ids": b, "max_tokens": 10, "sampling": GREEDY},
            ],
        ),
        truth_file=RUNNER,
        truth_function="ModelRunner.block_tables",
        component="model_runner",
        mechanism="block-table rows cached by batch position and refreshed only when the block count changes, so "
        "a sequence that moves into a finished request's row with the same count reads its KV blocks",
        steps=steps,
        bug_index=1,
    )


def case_penalty_counts_slot() -> CaseSpec:
    bug = [
        (
            RUNNER,
            "    def prepare_sampling(self, seqs: list[Sequence]) -> SamplingTensors:\n"
            "        return SamplingTensors.build([s.params for s in seqs], [s.prompt_token_ids for s in seqs],\n"
            "                                     [s.output_token_ids for s in seqs], [s.generator for s in seqs],\n"
            "                                     self.config.model_config.vocab_size)\n",
            "    def prepare_sampling(self, seqs: list[Sequence]) -> SamplingTensors:\n"
            '        """Output-token counts live in a [slots, V] buffer updated with each step\'s new tokens\n'
            '        instead of being recounted from every sequence\'s whole output."""\n'
            "        vocab = self.config.model_config.vocab_size\n"
            '        counts = getattr(self, "_output_counts", None)\n'
            "        if counts is None or counts.shape[0] < len(seqs):\n"
            "            counts = self._output_counts = torch.zeros(max(len(seqs), 8), vocab, dtype=torch.int64)\n"
            "            self._num_counted = [0] * counts.shape[0]\n"
            "        for i, s in enumerate(seqs):\n"
            "            out = s.output_token_ids\n"
            "            if len(out) < self._num_counted[i]:     # a new request took this slot\n"
            "                counts[i].zero_()\n"
            "                self._num_counted[i] = 0\n"
            "            for t in out[self._num_counted[i]:]:\n"
            "                counts[i, t] += 1\n"
            "            self._num_counted[i] = len(out)\n"
            "        st = SamplingTensors.build([s.params for s in seqs], [s.prompt_token_ids for s in seqs],\n"
            "                                   [[] for _ in seqs], [s.generator for s in seqs], vocab)\n"
            "        st.output_counts = counts[:len(seqs)].clone()\n"
            "        return st\n",
        )
    ]
    entries = [
        (NADIA, "scheduler: expose num_waiting / num_running for metrics", d_sched_counts()),
        (SVEN, "config: validate max_num_seqs", d_config_max_num_seqs()),
        (RAFAEL, "model_runner: describe the packed layout", d_runner_doc()),
        (HYEJIN, "block_manager: add usage property", d_bm_usage()),
        (
            IGOR,
            "perf(sampler): count output tokens incrementally\n\n"
            "SamplingTensors.build re-counted every sequence's whole output on every step, which\n"
            "grows with the generation length. Keep per-slot counts and add only the new tokens.",
            bug,
        ),
        (CLAIRE, "tokenizer: vocab_size property", d_tokenizer_vocab()),
        (OWEN, "tests: block manager allocate/free", d_test_block_manager()),
    ]
    steps, bug_index = history("2025-04-22", 1203, entries), 5
    a, b = prompt(1203, 18), prompt(2203, 16)
    pen = {"temperature": 0.8, "frequency_penalty": 0.7, "presence_penalty": 0.3, "ignore_eos": True}
    return CaseSpec(
        subject=SUBJECT,
        id="ts-penalty-counts-slot",
        issue_number=1203,
        category="batching",
        modeled_on=["huggingface/text-generation-inference#1765", "huggingface/transformers#39457"],
        title="frequency_penalty acts on tokens the request never generated once another request in the batch finishes",
        issue=issue_text("ts-penalty-counts-slot"),
        repro=repro_toml(
            {"arch": "llama", "seed": 3},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [
                {"prompt_ids": a, "max_tokens": 3, "sampling": dict(pen, seed=31)},
                {"prompt_ids": b, "max_tokens": 12, "sampling": dict(pen, seed=32)},
            ],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=RUNNER,
        truth_function="ModelRunner.prepare_sampling",
        component="model_runner",
        mechanism="output-token counts kept per batch slot and reset only when a slot's output shrinks, so a "
        "sequence shifted into a finished request's slot inherits its counts (wrong penalties)",
        steps=steps,
        bug_index=bug_index,
    )


# ============================================================================= sampling


def case_rep_penalty_batch_union() -> CaseSpec:
    bug = [
        (
            SAMPLER,
            "        for i, (prompt, out) in enumerate(zip(prompts, outputs)):\n"
            "            prompt_mask[i, torch.tensor(prompt, dtype=torch.long)] = True\n"
            "            if out:\n",
            "        # mark every prompt token with one fill instead of one indexing op per row\n"
            "        prompt_mask.index_fill_(1, torch.tensor([t for p in prompts for t in p], dtype=torch.long), True)\n"
            "        for i, out in enumerate(outputs):\n"
            "            if out:\n",
        )
    ]
    entries = [
        (JONAS, "model_loader: clearer message when no safetensors are found", d_loader_message()),
        (
            MEI,
            "perf(sampler): build the prompt mask without a per-row loop\n\n"
            "With many short requests in a decode batch the per-row indexing in\n"
            "SamplingTensors.build was a noticeable part of the sampler time.",
            bug,
        ),
        (ARJUN, "sampler: document which distribution logprobs come from", d_sampler_doc()),
        (FATIMA, "sampling_params: validate presence/frequency penalty range", d_params_penalty_range()),
        (LUCIA, "tests: sampling params validation", d_test_sampling_params()),
        (SVEN, "engine: add abort_request()", d_engine_abort()),
    ]
    steps, bug_index = history("2025-05-26", 1204, entries), 2
    a, b = prompt(1204, 16), prompt(2204, 24)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-rep-penalty-batch-union",
        issue_number=1204,
        category="sampling",
        modeled_on=["huggingface/text-generation-inference#1765", "huggingface/transformers#39457"],
        title="repetition_penalty output depends on what else is in the batch",
        issue=issue_text("ts-rep-penalty-batch-union"),
        repro=repro_toml(
            {"arch": "llama", "seed": 4},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [
                {
                    "prompt_ids": a,
                    "max_tokens": 10,
                    "sampling": {"temperature": 0.8, "repetition_penalty": 1.3, "seed": 5, "ignore_eos": True},
                },
                {"prompt_ids": b, "max_tokens": 10, "sampling": GREEDY},
            ],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=SAMPLER,
        truth_function="SamplingTensors.build",
        component="sampler",
        mechanism="index_fill_ along the vocab dim marks every request's prompt tokens in every row, so "
        "repetition_penalty also hits tokens from other requests' prompts",
        steps=steps,
        bug_index=bug_index,
    )


def case_min_p_logit_space() -> CaseSpec:
    bug = [
        (
            SAMPLER,
            "        probs = logits.softmax(dim=-1)\n"
            "        threshold = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)\n"
            '        return logits.masked_fill(probs < threshold, float("-inf"))\n',
            "        # the threshold scales with the top candidate, so compare logits directly and skip a\n"
            "        # softmax over the vocab\n"
            "        threshold = min_p.to(logits.dtype).unsqueeze(1) * logits.amax(dim=-1, keepdim=True)\n"
            '        return logits.masked_fill(logits < threshold, float("-inf"))\n',
        )
    ]
    entries = [
        (OWEN, "perf(sampler): min-p without a second softmax", bug),
        (HYEJIN, "sequence: readable repr", d_seq_repr()),
        (CLAIRE, "ops/activation: describe the optimized paths", d_act_doc()),
        (RAFAEL, "llm: document per-prompt sampling params", d_llm_doc()),
        (NADIA, "docs: sampling parameters", d_readme_sampling()),
        (IGOR, "tests: sampling params validation", d_test_sampling_params()),
    ]
    steps = history("2025-06-30", 1205, entries)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-min-p-logit-space",
        issue_number=1205,
        category="sampling",
        modeled_on=["state-spaces/mamba#1010", "state-spaces/mamba#927", "vllm-project/vllm-metal#728"],
        title="min_p filters far more (or far fewer) tokens than the same min_p in transformers",
        issue=issue_text("ts-min-p-logit-space"),
        repro=repro_toml(
            {"arch": "llama", "seed": 5},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [
                {
                    "prompt_ids": prompt(1205, 14),
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.9, "min_p": 0.2, "seed": 11, "ignore_eos": True},
                },
                {
                    "prompt_ids": prompt(2205, 9),
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.9, "min_p": 0.2, "seed": 12, "ignore_eos": True},
                },
            ],
        ),
        truth_file=SAMPLER,
        truth_function="Sampler.apply_min_p",
        component="sampler",
        mechanism="min-p threshold taken as min_p * max logit and compared against logits, instead of "
        "min_p * max probability against probabilities",
        steps=steps,
        bug_index=1,
    )


def case_temperature_before_penalties() -> CaseSpec:
    bug = [
        (
            SAMPLER,
            "        return self.apply_temperature(self.apply_penalties(logits, st), st)\n",
            "        # temperature first: the penalties then act in the units the sampler draws in\n"
            "        return self.apply_penalties(self.apply_temperature(logits, st), st)\n",
        )
    ]
    entries = [
        (LUCIA, "config: validate max_num_seqs", d_config_max_num_seqs()),
        (JONAS, "tokenizer: vocab_size property", d_tokenizer_vocab()),
        (FATIMA, "sampling_params: validate presence/frequency penalty range", d_params_penalty_range()),
        (MEI, "rope: name the rope parameters in the unsupported-type error", d_rope_error()),
        (ARJUN, "forward_context: note that it is only valid inside a forward", d_fwd_doc()),
        (
            SVEN,
            "sampler: scale by temperature before applying penalties\n\n"
            "Keeps the penalty strength comparable across temperatures.",
            bug,
        ),
        (HYEJIN, "sampler: comment on top-k rows that have it off", d_sampler_topk_comment()),
        (OWEN, "tests: block manager allocate/free", d_test_block_manager()),
    ]
    steps, bug_index = history("2025-08-11", 1206, entries), 6
    pen = {"temperature": 0.6, "frequency_penalty": 0.8, "presence_penalty": 0.5, "seed": 21, "ignore_eos": True}
    return CaseSpec(
        subject=SUBJECT,
        id="ts-temperature-before-penalties",
        issue_number=1206,
        category="sampling",
        modeled_on=["vllm-project/vllm-metal#728", "mlc-ai/mlc-llm#1693"],
        title="presence/frequency penalties much stronger than expected at low temperature",
        issue=issue_text("ts-temperature-before-penalties"),
        repro=repro_toml(
            {"arch": "llama", "seed": 6},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1206, 20), "max_tokens": 12, "sampling": pen}],
            good_ref="base",
        ),
        truth_file=SAMPLER,
        truth_function="LogitsAdjuster.forward",
        component="sampler",
        mechanism="temperature applied before the additive presence/frequency penalties, so the penalties "
        "are effectively multiplied by the temperature",
        steps=steps,
        bug_index=bug_index,
    )


# ============================================================================= kernel


def case_splitkv_lse_base() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition\n",
            "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition\nLOG2E = 1.4426950408889634\n",
        ),
        (
            OPS_ATTN,
            "    p = torch.exp(s - m_safe)\n"
            "    l = p.sum(-1, keepdim=True)\n"
            '    out = torch.einsum("bkgp,bpkd->bkgd", p, v) / l.clamp_min(torch.finfo(l.dtype).tiny)\n'
            "    return out, (m_safe + torch.log(l)).squeeze(-1)\n",
            "    p = torch.exp2((s - m_safe) * LOG2E)        # exp(x) == 2 ** (x * log2 e); exp2 is cheaper\n"
            "    l = p.sum(-1, keepdim=True)\n"
            '    out = torch.einsum("bkgp,bpkd->bkgd", p, v) / l.clamp_min(torch.finfo(l.dtype).tiny)\n'
            "    return out, (m_safe + torch.log2(l)).squeeze(-1)\n",
        ),
    ]
    entries = [
        (RAFAEL, "block_manager: add usage property", d_bm_usage()),
        (CLAIRE, "ops/norm: note the in-place contract of fused_add_rms_norm", d_norm_doc()),
        (
            IGOR,
            "perf(attention): base-2 exponentials in split-KV decode\n\n"
            "exp2 maps to a single instruction on most backends; fold log2(e) into the scores.",
            bug,
        ),
        (NADIA, "ops/activation: describe the optimized paths", d_act_doc()),
        (LUCIA, "engine: add abort_request()", d_engine_abort()),
        (JONAS, "embedding: note on padded vocab rows", d_embed_doc()),
    ]
    steps, bug_index = history("2025-09-15", 1207, entries), 3
    return CaseSpec(
        subject=SUBJECT,
        id="ts-splitkv-lse-base",
        issue_number=1207,
        category="kernel",
        modeled_on=["flashinfer-ai/flashinfer#58", "local-inference-lab/vllm#17"],
        title="Generation quality drops once the context is longer than ~64 tokens",
        issue=issue_text("ts-splitkv-lse-base"),
        repro=repro_toml(
            {"arch": "llama", "seed": 7},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1207, 80), "max_tokens": 8, "sampling": GREEDY}],
            good_ref=good_ref_before(len(entries), bug_index, extra=1),
        ),
        truth_file=OPS_ATTN,
        truth_function="_decode_partition",
        component="paged_attention",
        mechanism="split-KV partition LSE mixes a natural-log max with log2 of the sum, so merging two or "
        "more partitions weights them wrongly (a single partition is unaffected)",
        steps=steps,
        bug_index=bug_index,
    )


def case_prefill_softmax_rescale() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "        m_new = torch.maximum(m, s.amax(-1, keepdim=True))\n"
            "        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)\n"
            "        p = torch.exp(s - m_safe)\n"
            "        correction = torch.exp(m - m_safe)\n"
            "        l = l * correction + p.sum(-1, keepdim=True)\n"
            '        acc = acc * correction + torch.einsum("kgln,knd->kgld", p, v)\n'
            "        m = m_new\n",
            "        m = torch.maximum(m, s.amax(-1, keepdim=True))      # running max, updated in place\n"
            "        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n"
            "        p = torch.exp(s - m_safe)\n"
            "        correction = torch.exp(m - m_safe)\n"
            "        l = l * correction + p.sum(-1, keepdim=True)\n"
            '        acc = acc * correction + torch.einsum("kgln,knd->kgld", p, v)\n',
        )
    ]
    entries = [
        (HYEJIN, "docs: how to rule out the optimized kernels", d_readme_native()),
        (ARJUN, "sequence: readable repr", d_seq_repr()),
        (MEI, "linear: document the row-parallel layout", d_linear_doc()),
        (OWEN, "ops/attention: comment on tile sizes", d_attn_consts_doc()),
        (FATIMA, "model_loader: clearer message when no safetensors are found", d_loader_message()),
        (SVEN, "refactor(attention): drop the m_new temporary in tiled prefill", bug),
        (CLAIRE, "tests: kernel twins agree on small inputs", d_test_kernels()),
    ]
    steps, bug_index = history("2025-10-20", 1208, entries), 6
    return CaseSpec(
        subject=SUBJECT,
        id="ts-prefill-softmax-rescale",
        issue_number=1208,
        category="kernel",
        modeled_on=["Dao-AILab/flash-attention#2717", "flashinfer-ai/flashinfer#61"],
        title="Outputs wrong for prompts longer than 32 tokens (short prompts OK)",
        issue=issue_text("ts-prefill-softmax-rescale"),
        repro=repro_toml(
            {"arch": "llama", "seed": 8},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1208, 48), "max_tokens": 6, "sampling": GREEDY}],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=OPS_ATTN,
        truth_function="paged_attention_prefill",
        component="paged_attention",
        mechanism="running max is overwritten before the rescale factor is computed, so the accumulator and "
        "normaliser are never rescaled when a later KV tile raises the max",
        steps=steps,
        bug_index=bug_index,
    )


def case_swa_tile_skip() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "    lo = 0 if sliding_window is None else max(0, q_start - sliding_window + 1)\n"
            "    lo = lo // KV_TILE_TOKENS * KV_TILE_TOKENS\n"
            "    return range(lo, seq_len, KV_TILE_TOKENS)\n",
            "    if sliding_window is None or q_start < sliding_window:\n"
            "        return range(0, seq_len, KV_TILE_TOKENS)\n"
            "    # the first visible key, q_start - sliding_window + 1, lies in the tile after the one\n"
            "    # holding q_start - sliding_window\n"
            "    first_tile = (q_start - sliding_window) // KV_TILE_TOKENS + 1\n"
            "    return range(first_tile * KV_TILE_TOKENS, seq_len, KV_TILE_TOKENS)\n",
        )
    ]
    entries = [
        (JONAS, "refactor(attention): simpler tile range for sliding-window prefill", bug),
        (RAFAEL, "engine: add abort_request()", d_engine_abort()),
        (NADIA, "ops/attention: check slot_mapping length when writing the KV cache", d_attn_write_check()),
        (LUCIA, "config: validate max_num_seqs", d_config_max_num_seqs()),
        (MEI, "models/llama: document per-arch differences", d_llama_doc()),
        (IGOR, "tokenizer: vocab_size property", d_tokenizer_vocab()),
    ]
    steps = history("2025-11-24", 1209, entries)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-swa-tile-skip",
        issue_number=1209,
        category="kernel",
        modeled_on=["sgl-project/sglang#4823", "Dao-AILab/flash-attention#2550"],
        title="Mistral (sliding window) + chunked prefill: long prompts give different output",
        issue=issue_text("ts-swa-tile-skip"),
        repro=repro_toml(
            {"arch": "mistral", "seed": 9},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 24, "block_size": 16},
            },
            [{"prompt_ids": prompt(1209, 80), "max_tokens": 6, "sampling": GREEDY}],
        ),
        truth_file=OPS_ATTN,
        truth_function="_prefill_tile_range",
        component="paged_attention",
        mechanism="sliding-window prefill starts one KV tile too late when the window's first key is not "
        "tile-aligned, dropping in-window keys for chunks that start past the window",
        steps=steps,
        bug_index=1,
    )


# ============================================================================= model-config


def case_mistral_window_dropped() -> CaseSpec:
    bug = [
        (
            CONFIG,
            "    if types is None:\n        return [window] * n\n",
            "    if types is None:\n"
            "        # qwen2-style configs carry a sliding_window they only honour with use_sliding_window\n"
            '        return [window if hf.get("use_sliding_window") else None] * n\n',
        )
    ]
    entries = [
        (OWEN, "sampling_params: validate presence/frequency penalty range", d_params_penalty_range()),
        (CLAIRE, "config: accept dtype aliases (bf16, fp32, half)", d_config_dtype_alias()),
        (
            ARJUN,
            "config: respect use_sliding_window\n\n"
            "Qwen2 checkpoints ship sliding_window (e.g. 32768 or 131072) together with\n"
            "use_sliding_window=false; only apply the window when the config asks for it.",
            bug,
        ),
        (HYEJIN, "llm: document per-prompt sampling params", d_llm_doc()),
        (SVEN, "tests: config parsing", d_test_config()),
        (FATIMA, "block_manager: add usage property", d_bm_usage()),
        (RAFAEL, "forward_context: note that it is only valid inside a forward", d_fwd_doc()),
    ]
    steps, bug_index = history("2026-01-12", 1210, entries), 3
    return CaseSpec(
        subject=SUBJECT,
        id="ts-mistral-window-dropped",
        issue_number=1210,
        category="model-config",
        modeled_on=["vllm-project/vllm#5908", "sgl-project/sglang#4823"],
        title="Mistral-style model: outputs diverge from HF once prompt + output exceed the sliding window",
        issue=issue_text("ts-mistral-window-dropped"),
        repro=repro_toml(
            {"arch": "mistral", "seed": 10},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1210, 50), "max_tokens": 8, "sampling": GREEDY}],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=CONFIG,
        truth_function="sliding_windows",
        component="config",
        mechanism="configs without layer_types get a sliding window only when use_sliding_window is set, which "
        "mistral configs never carry, so mistral runs full attention",
        steps=steps,
        bug_index=bug_index,
    )


def case_gemma2_query_scale() -> CaseSpec:
    bug = [
        (
            GEMMA2,
            "        scale = cfg.query_pre_attn_scalar ** -0.5\n"
            "        self.self_attn = LlamaAttention(cfg, layer_idx, kernels, max_model_len, scale=scale)\n",
            "        # Gemma 2 scales queries by head_dim ** -0.5 like Llama: use LlamaAttention's default\n"
            "        self.self_attn = LlamaAttention(cfg, layer_idx, kernels, max_model_len)\n",
        )
    ]
    entries = [
        (MEI, "gemma2: use the default attention scale", bug),
        (LUCIA, "models/llama: document per-arch differences", d_llama_doc()),
        (OWEN, "rope: name the rope parameters in the unsupported-type error", d_rope_error()),
        (JONAS, "scheduler: expose num_waiting / num_running for metrics", d_sched_counts()),
        (NADIA, "docs: how to rule out the optimized kernels", d_readme_native()),
        (IGOR, "tests: kernel twins agree on small inputs", d_test_kernels()),
    ]
    steps = history("2026-02-09", 1211, entries)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-gemma2-query-scale",
        issue_number=1211,
        category="model-config",
        modeled_on=["ggml-org/llama.cpp#8197", "ggml-org/llama.cpp#8240"],
        title="Gemma 2 variant with query_pre_attn_scalar != head_dim produces different logits than transformers",
        issue=issue_text("ts-gemma2-query-scale"),
        repro=repro_toml(
            {"arch": "gemma2", "seed": 11, "query_pre_attn_scalar": 32},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1211, 24), "max_tokens": 8, "sampling": GREEDY}],
        ),
        truth_file=GEMMA2,
        truth_function="Gemma2DecoderLayer.__init__",
        component="gemma2",
        mechanism="gemma2 attention uses head_dim ** -0.5 instead of query_pre_attn_scalar ** -0.5",
        steps=steps,
        bug_index=1,
    )


def case_rope_theta_legacy() -> CaseSpec:
    bug = [
        (
            CONFIG,
            '    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))\n',
            "    # legacy exports keep rope_theta at the top level next to rope_scaling: that one wins\n"
            '    params["rope_theta"] = hf.get("rope_theta", 10000.0)\n',
        )
    ]
    entries = [
        (HYEJIN, "tokenizer: vocab_size property", d_tokenizer_vocab()),
        (ARJUN, "embedding: note on padded vocab rows", d_embed_doc()),
        (SVEN, "engine: add abort_request()", d_engine_abort()),
        (
            RAFAEL,
            "config: top-level rope_theta takes precedence\n\n"
            "Some converted checkpoints carry both a top-level rope_theta and a stale value in\n"
            "rope_scaling; transformers 4.x read the top-level one.",
            bug,
        ),
        (CLAIRE, "config: validate max_num_seqs", d_config_max_num_seqs()),
        (MEI, "sequence: readable repr", d_seq_repr()),
    ]
    steps, bug_index = history("2026-03-16", 1212, entries), 4
    return CaseSpec(
        subject=SUBJECT,
        id="ts-rope-theta-legacy",
        issue_number=1212,
        category="model-config",
        modeled_on=["unslothai/unsloth#6197", "ggml-org/llama.cpp#24823"],
        title="Qwen2 checkpoint (rope_theta 1e6) diverges from transformers; rope_theta 10000 models are fine",
        issue=issue_text("ts-rope-theta-legacy"),
        repro=repro_toml(
            {"arch": "qwen2", "seed": 12, "rope_theta": 1000000.0},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1212, 30), "max_tokens": 8, "sampling": GREEDY}],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=CONFIG,
        truth_function="rope_parameters",
        component="config",
        mechanism="rope_theta taken from the top-level config key (default 10000) over rope_parameters, so a "
        "transformers-5 config's rope_theta is ignored",
        steps=steps,
        bug_index=bug_index,
    )


CASES = [
    case_mixed_step_prefill_offset(),
    case_stale_block_table_row(),
    case_penalty_counts_slot(),
    case_rep_penalty_batch_union(),
    case_min_p_logit_space(),
    case_temperature_before_penalties(),
    case_splitkv_lse_base(),
    case_prefill_softmax_rescale(),
    case_swa_tile_skip(),
    case_mistral_window_dropped(),
    case_gemma2_query_scale(),
    case_rope_theta_legacy(),
]
