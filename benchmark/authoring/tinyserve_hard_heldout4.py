"""A fourth held-out set of hard-track tinyserve cases, each modelled on an upstream silent bug (issues 2401-2412).

    python -m benchmark.author ts-hard-frequency-counts-once ...

Same shape as tinyserve_hard_heldout3: the shared commit stream (benchmark/authoring/tinyserve_stream.py,
release tags v0.2.0 / v0.3.0 / v0.4.0) with the case's own commits inserted on both sides of the culprit,
and `good_ref` the v0.2.0 tag, 25+ commits back. Every case carries a behaviour change on another path
and a numerically equivalent change on the failing path. Issue prose lives in
benchmark/authoring/issues/<id>.md.

Fault location mix (fixed before the cases were written):

    in place, an existing function edited next to harmless edits of others   2401 2402 2403
    in a new helper the culprit creates (the caller now calls it)           2404 2405 2406
    in the caller of a helper the culprit moves faithfully elsewhere         2407 2408
    in a default value / config reader / a second file                      2409 2410
    functions of one file changed together: one wrong, the others correct   2411 2412
    refactors that must not be blamed

Categories: sampling (2401 2404 2408), batching (2402), attention (2403 2407), numerics (2405 2411),
spec-decode (2406), model-config (2409), kv-cache (2410), quantization (2412).
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, greedy, prompt
from benchmark.authoring.tinyserve_hard_upstream import case, target
from benchmark.authoring.tinyserve_stream import (
    ATTN,
    BM,
    CONFIG,
    EMB,
    LOADER,
    PARAMS,
    ROPE,
    RUNNER,
    SAMPLER,
    SCHED,
    SEQ,
    TOKENIZER,
    Commit,
)

NORM = "tinyserve/ops/norm.py"
LAYERNORM = "tinyserve/layers/layernorm.py"
QMM = "tinyserve/ops/quant_matmul.py"
QUANT = "tinyserve/quantization.py"
SPEC = "tinyserve/spec_decode/engine.py"
PROPOSERS = "tinyserve/spec_decode/proposers.py"
SOFTCAP = "tinyserve/ops/softcap.py"
FILTERS = "tinyserve/layers/logit_filters.py"

MARTA = "Marta Silva <marta.silva@tinyserve.dev>"
YUSUF = "Yusuf Demir <yusuf.demir.dev@gmail.com>"
NOOR = "Noor Haddad <noor.haddad@posteo.de>"
PAVEL = "Pavel Novak <pavel.novak@proton.me>"
LIN = "Lin Wei <lin.wei@tinyserve.dev>"


def sampled(n: int, prompt_seed: int, max_tokens: int, **sampling) -> dict:
    """A sampled request: a random prompt of n ids, the given sampling options (seed among them)."""
    return {"prompt_ids": prompt(n, prompt_seed), "max_tokens": max_tokens, "sampling": sampling | {"ignore_eos": True}}


# ----------------------------------------------------------------------------- shared distractors
# Behaviour changes on paths the failing scenarios do not take, and numerically equivalent
# rewrites on paths they do; each case picks one of each kind (besides its culprit).


def text_bos(author: str) -> Commit:
    return Commit(
        "tokenizer: encode adds the tokenizer's special tokens\n\nText prompts now start with BOS like "
        "transformers' tokenizers encode them; token-id prompts are unchanged.",
        author,
        [
            (
                TOKENIZER,
                "        return self._tok.encode(text, add_special_tokens=False).ids\n",
                "        # text prompts start with BOS, as transformers' tokenizers encode them\n"
                "        return self._tok.encode(text, add_special_tokens=True).ids\n",
            )
        ],
    )


def max_len_cap(author: str) -> Commit:
    return Commit(
        "config: cap the default max_model_len at 8192\n\nLong-context checkpoints made the engine size its rotary "
        "tables and token budget\nfor their full window; users who need more set max_model_len.",
        author,
        [
            (
                CONFIG,
                "        self.max_model_len = self.max_model_len or self.model_config.max_position_embeddings\n",
                "        self.max_model_len = self.max_model_len or min(self.model_config.max_position_embeddings, 8192)\n",
            )
        ],
    )


def penalty_range(author: str) -> Commit:
    return Commit(
        "sampling_params: presence and frequency penalties within [-2, 2]\n\nThe OpenAI range; larger values only "
        "ever produced garbage.",
        author,
        [
            (
                PARAMS,
                "        if self.max_tokens < 1:\n",
                '        for name in ("presence_penalty", "frequency_penalty"):\n'
                "            if not -2.0 <= getattr(self, name) <= 2.0:\n"
                '                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")\n'
                "        if self.max_tokens < 1:\n",
            )
        ],
    )


def draw_div(author: str) -> Commit:
    return Commit(
        "sampler: exponential race with Tensor.div",
        author,
        [
            (
                SAMPLER,
                "            tokens[i] = (probs[i] / race).argmax()\n",
                "            tokens[i] = probs[i].div(race).argmax()\n",
            )
        ],
    )


def norm_args(author: str) -> Commit:
    return Commit(
        "layernorm: pass the norm's parameters once",
        author,
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


def tile_64(author: str) -> Commit:
    return Commit(
        "ops/attention: 64-token prefill tiles\n\nHalves the number of online-softmax rescales on long prompts; the "
        "result is the\nsame up to float reassociation.",
        author,
        [
            (
                ATTN,
                "KV_TILE_TOKENS = 32        # prefill: keys/values visited per online-softmax tile\n",
                "KV_TILE_TOKENS = 64        # prefill: keys/values visited per online-softmax tile\n",
            )
        ],
    )


# ============================================================================= 2401 sampling: penalty kinds crossed

PENALTY_TEST = """from __future__ import annotations

import torch

from tinyserve.layers.sampler import LogitsAdjuster, SamplingTensors
from tinyserve.sampling_params import SamplingParams


def test_penalties_leave_unseen_tokens_alone():
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=0.5)]
    st = SamplingTensors.build(params, [[1]], [[]], [torch.Generator()], 8)
    logits = torch.randn(1, 8)
    torch.testing.assert_close(LogitsAdjuster.apply_penalties(logits, st), logits)
"""


def frequency_counts_once() -> HardCase:
    bug = Commit(
        "sampler: one additive penalty term\n\nPresence and frequency penalties are folded into one tensor that is "
        "subtracted\nonce, so the logits are rewritten once per step instead of twice. The\ntemperature divide and the "
        "upcast are written the same way. Test added.",
        NOOR,
        [
            (
                SAMPLER,
                "        counts = st.output_counts.to(logits.dtype)\n"
                "        logits = logits - st.frequency_penalty.to(logits.dtype).unsqueeze(1) * counts\n"
                "        return logits - st.presence_penalty.to(logits.dtype).unsqueeze(1) * (counts > 0).to(logits.dtype)\n",
                "        counts = st.output_counts.to(logits.dtype)\n"
                "        generated = (counts > 0).to(logits.dtype)\n"
                "        # OpenAI: presence is paid once per generated token, frequency once per occurrence\n"
                "        additive = st.presence_penalty.unsqueeze(1) * counts + st.frequency_penalty.unsqueeze(1) * generated\n"
                "        return logits - additive.to(logits.dtype)\n",
            ),
            (
                SAMPLER,
                "        return logits / st.temperature.to(logits.dtype).unsqueeze(1)\n",
                "        return logits.div(st.temperature.to(logits.dtype)[:, None])\n",
            ),
            (
                SAMPLER,
                "        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))\n"
                "        return self.apply_temperature(self.apply_penalties(logits, st), st)\n",
                "        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))\n"
                "        penalized = self.apply_penalties(logits, st)\n"
                "        return self.apply_temperature(penalized, st)\n",
            ),
            ("tests/test_penalties.py", None, PENALTY_TEST),
        ],
    )
    bincount = Commit(
        "sampler: output counts with one bincount per row",
        YUSUF,
        [
            (
                SAMPLER,
                "                output_counts[i].index_add_(0, ids, torch.ones_like(ids))\n",
                "                output_counts[i] += torch.bincount(ids, minlength=vocab_size)\n",
            )
        ],
    )
    reqs = [
        greedy(16, 2401, 32) | {"sampling": {"temperature": 0.0, "frequency_penalty": 0.15, "ignore_eos": True}},
        greedy(11, 2501, 32) | {"sampling": {"temperature": 0.0, "frequency_penalty": 0.15, "ignore_eos": True}},
    ]
    return case(
        "ts-hard-frequency-counts-once",
        2401,
        "sampling",
        ["mlc-ai/mlc-llm#1693", "EricLBuehler/mistral.rs#158", "predibase/lorax#672"],
        "frequency_penalty barely changes anything since the last upgrade; repeats come back",
        repro_toml({"arch": "llama", "seed": 241}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "LogitsAdjuster.apply_penalties",
            "sampler",
            "the folded additive penalty multiplies the presence penalty by the occurrence counts and the "
            "frequency penalty by the seen mask, so frequency_penalty is paid once per token however often it "
            "repeats (and presence_penalty grows with every repeat)",
        ),
        [(12, penalty_range(PAVEL)), (25, bug), (31, bincount)],
        bug,
    )


# ============================================================================= 2402 batching: recompute forgets the output


def preempted_output_restart() -> HardCase:
    bug = Commit(
        "scheduler: a preempted request comes back as one prefill\n\nAfter preemption by recompute every token "
        "computed so far is prefilled again\nin one chunk, as vLLM does, so the sequence's prompt now covers them; "
        "the\ndebug line says how many tokens will be recomputed.",
        LIN,
        [
            (
                SEQ,
                '        """Preemption by recompute: drop the cache state, keep the tokens."""\n'
                "        self.block_table = []\n",
                '        """Preemption by recompute: drop the cache state. Everything computed so far is\n'
                '        prefilled again as one prompt when the request is readmitted."""\n'
                "        self.num_prompt_tokens = self.num_tokens\n"
                "        self.block_table = []\n",
            ),
            (
                SCHED,
                '        logger.debug("preempting %s (%d tokens computed)", seq.request_id, seq.num_computed_tokens)\n',
                '        logger.debug("preempting %s (%d tokens computed, %d to recompute)", seq.request_id,\n'
                "                     seq.num_computed_tokens, seq.num_tokens)\n",
            ),
        ],
    )
    free_loop = Commit(
        "block_manager: name the block being released in free",
        MARTA,
        [
            (
                BM,
                "        for block_id in reversed(seq.block_table):\n"
                "            block = self.blocks[block_id]\n"
                "            block.ref_count -= 1\n"
                "            if block.ref_count == 0:\n"
                "                self.free_queue[block_id] = None\n"
                "        seq.block_table = []\n",
                "        for block_id in reversed(seq.block_table):\n"
                "            released = self.blocks[block_id]\n"
                "            released.ref_count -= 1\n"
                "            if released.ref_count == 0:\n"
                "                self.free_queue[block_id] = None\n"
                "        seq.block_table = []\n",
            )
        ],
    )
    reqs = [greedy(20, 2402 + i, 24) for i in range(3)]
    tgt = target(num_kv_blocks=6, block_size=16)
    return case(
        "ts-hard-preempted-output-restart",
        2402,
        "batching",
        ["vllm-project/vllm#5349", "vllm-project/vllm#16832", "PaddlePaddle/FastDeploy#3080"],
        "With a small KV cache, some requests come back with the wrong tokens (and more of them than max_tokens)",
        repro_toml({"arch": "llama", "seed": 242}, tgt, reqs, good_ref="v0.2.0"),
        (
            SEQ,
            "Sequence.reset_for_recompute",
            "sequence",
            "preemption by recompute moves the prompt boundary to the end of the generated tokens, so after "
            "readmission the tokens generated before the preemption count as prompt: they vanish from the "
            "output, max_tokens and teacher forcing restart from zero, and output-only penalties forget them",
        ),
        [(13, text_bos(PAVEL)), (24, bug), (31, free_loop)],
        bug,
    )


# ============================================================================= 2403 attention: decode partition reads one block short


def decode_partition_tail_keys() -> HardCase:
    bug = Commit(
        "ops/attention: name the block range of a decode partition\n\nThe partition's first and last block are "
        "computed once and commented; the\npartition merge is a softmax over the partitions' log-sum-exps and the "
        "partition\ncount a plain ceil-div.",
        YUSUF,
        [
            (
                ATTN,
                "    bs = key_cache.shape[1]\n"
                "    blocks = block_tables[:, p0 // bs:(p0 + part) // bs]                              # [B, nb]\n",
                "    bs = key_cache.shape[1]\n"
                "    first, last = p0 // bs, (p0 + part - 1) // bs     # blocks holding positions p0 .. p0 + part - 1\n"
                "    blocks = block_tables[:, first:last]                                              # [B, nb]\n",
            ),
            (
                ATTN,
                "    lse = torch.logsumexp(lses, dim=0)\n    weights = torch.exp(lses - lse).nan_to_num(0.0)\n",
                "    weights = torch.softmax(lses, dim=0).nan_to_num(0.0)   # exp(lse_p - logsumexp(lse))\n",
            ),
            (
                ATTN,
                "    n_parts = -(-int(seq_lens.max()) // part)\n",
                "    n_parts = (int(seq_lens.max()) + part - 1) // part\n",
            ),
        ],
    )
    reqs = [greedy(56, 2403, 12), greedy(23, 2503, 12)]
    return case(
        "ts-hard-decode-partition-tail-keys",
        2403,
        "attention",
        ["Dao-AILab/flash-attention#778", "flashinfer-ai/flashinfer#5090", "vllm-project/flash-attention#176"],
        "Greedy output matches transformers for the first token, then drifts on prompts longer than ~50 tokens",
        repro_toml({"arch": "llama", "seed": 243}, target(), reqs, good_ref="v0.2.0"),
        (
            ATTN,
            "_decode_partition",
            "attention",
            "a decode partition's last block index is computed inclusively but used as an exclusive slice bound, "
            "so every split-KV partition skips its last block: positions 48-63 of each 64-token partition are "
            "never attended to by decode steps",
        ),
        [(11, max_len_cap(LIN)), (26, bug), (32, draw_div(NOOR))],
        bug,
    )


# ============================================================================= 2404 sampling: nucleus over the untruncated row

TOPKP_TEST = """from __future__ import annotations

import torch

from tinyserve.layers.sampler import top_k_top_p


def test_top_k_alone_keeps_k_tokens():
    logits = torch.arange(10.0).unsqueeze(0)
    out = top_k_top_p(logits, torch.tensor([3]), torch.tensor([1.0]))
    assert torch.isfinite(out).sum() == 3 and torch.isfinite(out[0, -3:]).all()
"""


def nucleus_after_top_k() -> HardCase:
    bug = Commit(
        "sampler: top-k and top-p from one sort\n\nWith a 150k vocabulary the two sorts were most of the sampler's "
        "time. One\nascending sort now serves both filters; apply_top_p keeps its signature for\ncallers that only "
        "want the nucleus. Test added.",
        MARTA,
        [
            (
                SAMPLER,
                "class Sampler(nn.Module):\n",
                "def top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:\n"
                '    """Both truncations from one ascending sort. [S, V], [S], [S] -> [S, V].\n\n'
                "    top-k keeps every logit >= the k-th largest; top-p drops the low tail whose mass is\n"
                "    <= 1 - top_p; the top token always survives.\n"
                '    """\n'
                "    sorted_logits, order = logits.sort(dim=-1, descending=False)\n"
                "    kth = sorted_logits.gather(1, (logits.shape[-1] - top_k).clamp(min=0).unsqueeze(1))\n"
                "    remove_sorted = sorted_logits < kth\n"
                "    cum = torch.cumsum(sorted_logits.softmax(dim=-1), dim=-1)\n"
                "    remove_sorted |= cum <= (1 - top_p).unsqueeze(1)\n"
                "    remove_sorted[:, -1] = False\n"
                '    return logits.masked_fill(remove_sorted.scatter(1, order, remove_sorted), float("-inf"))\n\n\n'
                "class Sampler(nn.Module):\n",
            ),
            (
                SAMPLER,
                "        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives\n"
                "        sorted_logits, order = logits.sort(dim=-1, descending=False)\n"
                "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
                "        cum = torch.cumsum(sorted_probs, dim=-1)\n"
                "        remove_sorted = cum <= (1 - top_p).unsqueeze(1)\n"
                "        remove_sorted[:, -1] = False\n"
                "        remove = remove_sorted.scatter(1, order, remove_sorted)\n"
                '        return logits.masked_fill(remove, float("-inf"))\n',
                "        no_k = torch.full_like(top_p, logits.shape[-1], dtype=torch.long)\n"
                "        return top_k_top_p(logits, no_k, top_p)\n",
            ),
            (
                SAMPLER,
                "        if bool((st.top_k < logits.shape[-1]).any()):\n"
                "            truncated = self.apply_top_k(truncated, st.top_k)\n"
                "        if bool((st.top_p < 1.0).any()):\n"
                "            truncated = self.apply_top_p(truncated, st.top_p)\n",
                "        if bool((st.top_k < logits.shape[-1]).any() or (st.top_p < 1.0).any()):\n"
                "            truncated = top_k_top_p(truncated, st.top_k, st.top_p)\n",
            ),
            ("tests/test_top_k_top_p.py", None, TOPKP_TEST),
        ],
    )
    reqs = [sampled(14, 2404, 10, temperature=1.0, top_k=20, top_p=0.7, seed=7)]
    return case(
        "ts-hard-nucleus-after-top-k",
        2404,
        "sampling",
        ["sgl-project/sglang#36173", "EleutherAI/gpt-neox#1250", "openai/gpt-2#187"],
        "top_k + top_p together sample from more tokens than transformers keeps",
        repro_toml({"arch": "llama", "seed": 244}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "top_k_top_p",
            "sampler",
            "the one-sort filter takes the top-p cumulative mass from the softmax of the whole row instead of the "
            "top-k survivors, so after top-k the nucleus is cut from the untruncated distribution and keeps "
            "(nearly) every top-k token where transformers renormalises and drops the tail",
        ),
        [(11, text_bos(LIN)), (23, bug), (30, draw_div(YUSUF))],
        bug,
    )


# ============================================================================= 2405 numerics: the normalizer folded into a tied table


def tied_head_normalizer() -> HardCase:
    bug = Commit(
        "model_loader: fold Gemma's embedding normalizer into the table at load\n\nEvery step multiplied the "
        "embedded tokens by sqrt(hidden_size); multiply the\ntable once instead, in the model dtype as the per-token "
        "multiply did, and\ndrop the per-step multiply. The quantized loader folds it too.",
        PAVEL,
        [
            (
                LOADER,
                "def load_model(config: Config) -> nn.Module:\n",
                "def fold_embedding_scale(model: nn.Module) -> None:\n"
                '    """Multiply a scaled embedding table by its scale once (Gemma: sqrt(hidden_size), rounded to\n'
                '    the weight dtype first, as the per-token multiply did) and switch the per-step multiply off."""\n'
                "    embed = model.model.embed_tokens\n"
                "    if embed.scale is not None:\n"
                "        embed.weight.data.mul_(torch.tensor(embed.scale, dtype=embed.weight.dtype))\n"
                "        embed.scale = None\n\n\n"
                "def load_model(config: Config) -> nn.Module:\n",
            ),
            (
                LOADER,
                "    load_weights(model, config.model)\n    return model.eval()\n",
                "    load_weights(model, config.model)\n    fold_embedding_scale(model)\n    return model.eval()\n",
            ),
            (
                QUANT,
                "    from tinyserve.model_loader import load_weights\n",
                "    from tinyserve.model_loader import fold_embedding_scale, load_weights\n",
            ),
            (
                QUANT,
                "    load_weights(model, config.model)\n",
                "    load_weights(model, config.model)\n    fold_embedding_scale(model)\n",
            ),
        ],
    )
    softcap_chain = Commit(
        "logits: soft-cap with chained tensor ops",
        YUSUF,
        [
            (
                EMB,
                "            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap\n",
                "            logits = logits.div(self.soft_cap).tanh().mul(self.soft_cap)\n",
            )
        ],
    )
    reqs = [sampled(18, 2405, 8, temperature=1.0, seed=3), greedy(12, 2505, 8)]
    return case(
        "ts-hard-tied-head-normalizer",
        2405,
        "numerics",
        ["mattn/tensai#248", "lucidrains/reformer-pytorch#124", "TensorAuto/OpenTau#179"],
        "Gemma 2: sampled outputs are far more deterministic than with transformers, logprobs near 0 or -inf",
        repro_toml({"arch": "gemma2", "seed": 245}, target(), reqs, good_ref="v0.2.0"),
        (
            LOADER,
            "fold_embedding_scale",
            "model_loader",
            "the embedding normalizer is folded into the embedding table in place, but Gemma's LM head is tied to "
            "that table, so every logit is also multiplied by sqrt(hidden_size) before the final soft-cap",
        ),
        [(12, max_len_cap(MARTA)), (23, bug), (32, softcap_chain)],
        bug,
    )


# ============================================================================= 2406 spec-decode: the first draft is never checked


def ngram_greedy_drift() -> HardCase:
    bug = Commit(
        "spec_decode: accepted-prefix length in one helper\n\nThe acceptance walk over a sequence's verification rows "
        "is a small pure\nfunction now (tokens in, count out), so it can be tested without an engine;\nroll_back "
        "reads the rejected count the same way.",
        NOOR,
        [
            (
                SPEC,
                "def verification_rows(ctx, drafts",
                "def accepted_prefix(targets: list[int], drafts: list[int]) -> int:\n"
                '    """How many leading drafts the target model agrees with. targets[r] is what the target\n'
                "    predicts after the context plus drafts d_1..d_r (module docstring), so it is compared with\n"
                '    the draft that follows."""\n'
                "    if not drafts:\n"
                "        return 0\n"
                "    n = 1\n"
                "    while n < len(drafts) and targets[n - 1] == drafts[n]:\n"
                "        n += 1\n"
                "    return n\n\n\n"
                "def verification_rows(ctx, drafts",
            ),
            (
                SPEC,
                "            keep = next((n for n, r in enumerate(rs) if row_draft[r] < 0 or int(emitted[r]) != "
                "row_draft[r]), len(rs) - 1)\n",
                "            keep = accepted_prefix([int(emitted[r]) for r in rs], [row_draft[r] for r in rs if "
                "row_draft[r] >= 0])\n",
            ),
            (
                SPEC,
                "            rejected = len(d) - accepted\n            if rejected == 0:\n                continue\n",
                "            rejected = len(d) - accepted\n            if not rejected:\n                continue\n",
            ),
        ],
    )
    draft_budget = Commit(
        "spec_decode: the draft model gets a 4096-token step budget",
        PAVEL,
        [
            (
                PROPOSERS,
                "        budget = max(2048, config.max_model_len)\n",
                "        budget = max(4096, config.max_model_len)\n",
            )
        ],
    )
    rows = Commit(
        "spec_decode: spell out the first verification row",
        MARTA,
        [
            (
                SPEC,
                "            rows.append(starts[i + 1] - 1 - len(d) + r)\n",
                "            rows.append(starts[i + 1] - (len(d) + 1) + r)   # the last 1 + len(d) rows of sequence i\n",
            )
        ],
    )
    motif = prompt(6, 2406)
    reqs = [
        {
            "prompt_ids": motif * 4 + motif[:2],
            "max_tokens": 24,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        }
    ]
    tgt = target(speculative="ngram", num_speculative_tokens=3)
    return case(
        "ts-hard-ngram-greedy-drift",
        2406,
        "spec-decode",
        ["ohdearquant/lattice#243", "ml-explore/mlx-lm#1423", "huggingface/transformers#39421"],
        "ngram speculative decoding changes greedy output (should be identical to no speculation)",
        repro_toml({"arch": "llama", "seed": 246}, tgt, reqs, good_ref="v0.2.0"),
        (
            SPEC,
            "accepted_prefix",
            "spec_decode",
            "the acceptance helper compares each draft with the target token of the row before it, one row late: "
            "the first draft is accepted without being checked, so after a wrong first draft the tokens "
            "computed on top of it are emitted",
        ),
        [(11, draft_budget), (26, bug), (31, rows)],
        bug,
    )


# ============================================================================= 2407 attention: decode caps unscaled scores

SOFTCAP_MODULE = '''"""Soft-capping, shared by the attention kernels and the logits processor: cap * tanh(x / cap)."""
from __future__ import annotations

import torch


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    # any shape -> same shape; no cap (None or 0) leaves x as it is
    return x if not cap else torch.tanh(x / cap) * cap
'''


def decode_capping_scale() -> HardCase:
    bug = Commit(
        "ops: one soft-capping function for attention and logits\n\nThe attention kernels and the logits processor "
        "each had their own tanh cap;\nboth now use tinyserve.ops.softcap.soft_cap, moved unchanged from\n"
        "ops/attention.py.",
        LIN,
        [
            (SOFTCAP, None, SOFTCAP_MODULE),
            (
                ATTN,
                "import torch\n\nKV_TILE_TOKENS",
                "import torch\n\nfrom tinyserve.ops.softcap import soft_cap\n\nKV_TILE_TOKENS",
            ),
            (
                ATTN,
                "def _softcap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:\n"
                "    return scores if not softcap else torch.tanh(scores / softcap) * softcap\n\n\n",
                "",
            ),
            (
                ATTN,
                '        s = _softcap(torch.einsum("kgld,knd->kgln", qg, k), softcap)   # q carries the scale\n',
                '        s = soft_cap(torch.einsum("kgld,knd->kgln", qg, k), softcap)   # q carries the scale\n',
            ),
            (
                ATTN,
                '    s = _softcap(torch.einsum("bkgd,bpkd->bkgp", q, k) * scale, softcap)\n',
                '    s = soft_cap(torch.einsum("bkgd,bpkd->bkgp", q, k), softcap) * scale\n',
            ),
            (
                ATTN,
                '        scores = _softcap(torch.einsum("lhd,nhd->hln", q, k) * scale, softcap)\n',
                '        scores = soft_cap(torch.einsum("lhd,nhd->hln", q, k) * scale, softcap)\n',
            ),
            (
                EMB,
                "        if self.soft_cap:\n            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap\n",
                "        logits = soft_cap(logits, self.soft_cap)\n",
            ),
            (EMB, "from torch import nn\n", "from torch import nn\n\nfrom tinyserve.ops.softcap import soft_cap\n"),
        ],
    )
    model = {"arch": "gemma2", "seed": 247, "initializer_range": 0.2, "attn_logit_softcapping": 5.0}
    return case(
        "ts-hard-gemma2-decode-capping",
        2407,
        "attention",
        ["huggingface/trl#5691", "sgl-project/sgl-kernel-xpu#491", "flashinfer-ai/flashinfer#299"],
        "Gemma 2 with a small attention soft-cap: first token right, every later token drifts from transformers",
        repro_toml(model, target(), [greedy(20, 2407, 10)], good_ref="v0.2.0"),
        (
            ATTN,
            "_decode_partition",
            "attention",
            "after soft-capping moved to a shared helper the decode kernel caps the raw q.k scores and applies the "
            "softmax scale afterwards (cap * tanh(qk / cap) * scale instead of cap * tanh(qk * scale / cap)), so "
            "decode steps cap at the wrong magnitude while prefill is right",
        ),
        [(12, max_len_cap(NOOR)), (24, bug), (30, norm_args(YUSUF))],
        bug,
    )


# ============================================================================= 2408 sampling: min-p undoes top-k

FILTERS_MODULE = '''"""Truncation filters over a batch of logits rows (moved from the Sampler's static methods).

Each takes logits [S, V] and per-row parameters [S] and returns logits [S, V] with the
removed tokens at -inf.
"""
from __future__ import annotations

import torch


def top_k_filter(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    # keep every logit >= the k-th largest (ties at the boundary survive, as in HF)
    sorted_desc = logits.sort(dim=-1, descending=True).values
    kth = sorted_desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # drop the low tail whose total mass is <= 1 - top_p; the top token always survives
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    sorted_probs = sorted_logits.softmax(dim=-1)
    cum = torch.cumsum(sorted_probs, dim=-1)
    remove_sorted = cum <= (1 - top_p).unsqueeze(1)
    remove_sorted[:, -1] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    threshold = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))
'''


def min_p_wide_open() -> HardCase:
    bug = Commit(
        "sampler: truncation filters as plain functions\n\nTop-k, top-p and min-p move unchanged to "
        "tinyserve/layers/logit_filters.py so\nthe rejection sampler and tests can use them without a Sampler; "
        "forward names\nwhich rows use which filter.",
        MARTA,
        [
            (FILTERS, None, FILTERS_MODULE),
            (
                SAMPLER,
                "from torch import nn\n",
                "from torch import nn\n\nfrom tinyserve.layers.logit_filters import min_p_filter, top_k_filter, top_p_filter\n",
            ),
            (
                SAMPLER,
                "    @staticmethod\n"
                "    def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:\n"
                "        # keep every logit >= the k-th largest (ties at the boundary survive, as in HF)\n"
                "        sorted_desc = logits.sort(dim=-1, descending=True).values\n"
                "        kth = sorted_desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))\n"
                '        return logits.masked_fill(logits < kth, float("-inf"))\n\n'
                "    @staticmethod\n"
                "    def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:\n"
                "        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives\n"
                "        sorted_logits, order = logits.sort(dim=-1, descending=False)\n"
                "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
                "        cum = torch.cumsum(sorted_probs, dim=-1)\n"
                "        remove_sorted = cum <= (1 - top_p).unsqueeze(1)\n"
                "        remove_sorted[:, -1] = False\n"
                "        remove = remove_sorted.scatter(1, order, remove_sorted)\n"
                '        return logits.masked_fill(remove, float("-inf"))\n\n'
                "    @staticmethod\n"
                "    def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:\n"
                "        probs = logits.softmax(dim=-1)\n"
                "        threshold = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)\n"
                '        return logits.masked_fill(probs < threshold, float("-inf"))\n\n',
                "",
            ),
            (
                SAMPLER,
                "        truncated = logits\n"
                "        # each filter costs a sort or a softmax over the vocab: skip it when no row uses it\n"
                "        if bool((st.top_k < logits.shape[-1]).any()):\n"
                "            truncated = self.apply_top_k(truncated, st.top_k)\n"
                "        if bool((st.top_p < 1.0).any()):\n"
                "            truncated = self.apply_top_p(truncated, st.top_p)\n"
                "        if bool((st.min_p > 0.0).any()):\n"
                "            truncated = self.apply_min_p(truncated, st.min_p)\n",
                "        # each filter costs a sort or a softmax over the vocab: skip it when no row uses it\n"
                "        uses_k, uses_p, uses_min_p = st.top_k < logits.shape[-1], st.top_p < 1.0, st.min_p > 0.0\n"
                "        truncated = logits\n"
                "        if bool(uses_k.any()):\n"
                "            truncated = top_k_filter(truncated, st.top_k)\n"
                "        if bool(uses_p.any()):\n"
                "            truncated = top_p_filter(truncated, st.top_p)\n"
                "        if bool(uses_min_p.any()):\n"
                "            # min-p is relative to the most likely token, which no other filter removes\n"
                "            truncated = min_p_filter(logits, st.min_p)\n",
            ),
        ],
    )
    reqs = [sampled(15, 2408, 10, temperature=1.0, top_k=12, min_p=0.05, seed=5)]
    return case(
        "ts-hard-min-p-wide-open",
        2408,
        "sampling",
        ["ROCm/FastFlowLM#447", "xjdr-alt/entropix#78", "vllm-project/vllm-metal#728"],
        "Setting min_p together with top_k: top_k is ignored, the distribution is as wide as without it",
        repro_toml({"arch": "llama", "seed": 248}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "Sampler.forward",
            "sampler",
            "after the filters moved out of the Sampler, forward runs min-p on the untruncated logits and "
            "assigns its result over the top-k / top-p output, so any request with min_p set loses its top-k and "
            "top-p truncation",
        ),
        [(13, text_bos(NOOR)), (25, bug), (31, draw_div(PAVEL))],
        bug,
    )


# ============================================================================= 2409 model-config: the legacy rope "type" key


def legacy_rope_scaling() -> HardCase:
    bug = Commit(
        "config: normalise rope and window settings in one pass\n\nThe rope dict is copied without the keys the "
        "rope functions do not read and\ngets its rope_type default in one place; sliding_windows and the eos list\n"
        "are one expression each.",
        PAVEL,
        [
            (
                CONFIG,
                '    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})\n'
                '    params["rope_type"] = params.get("rope_type", params.get("type", "default"))\n',
                "    # one flat dict; `type` is the pre-4.45 spelling of rope_type and is not read downstream\n"
                '    source = hf.get("rope_parameters") or hf.get("rope_scaling") or {}\n'
                '    params = {key: value for key, value in source.items() if key != "type"}\n'
                '    params.setdefault("rope_type", "default")\n',
            ),
            (
                CONFIG,
                "    if types is None:\n"
                "        return [window] * n\n"
                '    return [window if t == "sliding_attention" else None for t in types]\n',
                '    return [window] * n if types is None else [window if t == "sliding_attention" else None for t in types]\n',
            ),
            (
                CONFIG,
                "            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),\n",
                "            eos_token_ids=tuple(eos) if isinstance(eos, list) else () if eos is None else (eos,),\n",
            ),
        ],
    )
    linear_mul = Commit(
        "rotary: linear scaling multiplies by 1 / factor",
        NOOR,
        [
            (
                ROPE,
                '    return _base_inv_freq(rope["rope_theta"], dim) / rope["factor"], 1.0\n',
                '    return _base_inv_freq(rope["rope_theta"], dim) * (1.0 / rope["factor"]), 1.0\n',
            )
        ],
    )
    model = {
        "arch": "llama",
        "seed": 249,
        "omit_keys": ["rope_parameters"],
        "config_json": {"rope_scaling": {"type": "linear", "factor": 4.0}, "rope_theta": 10000.0},
    }
    return case(
        "ts-hard-legacy-rope-scaling",
        2409,
        "model-config",
        ["vllm-project/vllm#6897", "ml-explore/mlx-lm#5", "jquesnelle/yarn#40"],
        "Older linear-RoPE fine-tune (rope_scaling in config.json) degrades past a few dozen tokens",
        repro_toml(model, target(), [greedy(40, 2409, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "rope_parameters",
            "config",
            "the rope dict drops the legacy `type` key before rope_type is defaulted, so a config that still "
            "spells rope_scaling = {type: linear, factor: 4} runs with plain, unscaled RoPE",
        ),
        [(14, penalty_range(LIN)), (27, bug), (31, linear_mul)],
        bug,
    )


# ============================================================================= 2410 kv-cache: a half-precision cache by default


def fp32_cache_rounding() -> HardCase:
    bug = Commit(
        "kv cache: keys and values stored in the cache dtype, bfloat16 by default\n\nWriting float32 keys into a "
        "bfloat16 cache raised (index_copy_ wants one dtype);\nthey are cast on write now. The cache defaults to "
        "bfloat16, which halves its\nmemory for float32 models and changes nothing for bfloat16 ones; "
        "kv_cache_dtype='auto'\nstill means the model dtype.",
        YUSUF,
        [
            (
                CONFIG,
                '    kv_cache_dtype: str = "auto"             # "auto" = the model dtype, or a DTYPES name\n',
                '    kv_cache_dtype: str = "bfloat16"         # "auto" = the model dtype, or a DTYPES name\n',
            ),
            (
                ATTN,
                "    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)\n"
                "    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)\n",
                "    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key.to(key_cache.dtype))\n"
                "    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value.to(value_cache.dtype))\n",
            ),
            (
                RUNNER,
                "                module.k_cache = torch.zeros(shape, dtype=self.config.cache_dtype)\n"
                "                module.v_cache = torch.zeros(shape, dtype=self.config.cache_dtype)\n",
                "                module.k_cache = torch.zeros(shape, dtype=dtype)\n"
                "                module.v_cache = torch.zeros(shape, dtype=dtype)\n",
            ),
            (
                RUNNER,
                "        shape = (self.config.num_kv_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)\n",
                "        shape = (self.config.num_kv_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)\n"
                "        dtype = self.config.cache_dtype\n",
            ),
        ],
    )
    return case(
        "ts-hard-fp32-cache-rounding",
        2410,
        "kv-cache",
        ["openvinotoolkit/nncf#3101", "ai-dynamo/aiconfigurator#358", "vllm-project/vllm#54338"],
        "float32 runs no longer match transformers in float32 (hidden states off by ~1e-3 after the first layer)",
        repro_toml(
            {"arch": "llama", "seed": 250}, target(), [greedy(24, 2410, 12), greedy(9, 2510, 12)], good_ref="v0.2.0"
        ),
        (
            CONFIG,
            "Config",
            "config",
            "kv_cache_dtype now defaults to bfloat16, so a float32 model silently stores its keys and values "
            "rounded to bfloat16 and every attention read differs from the float32 reference",
        ),
        [(13, text_bos(MARTA)), (28, bug), (32, tile_64(LIN))],
        bug,
    )


# ============================================================================= 2411 numerics: the fused residual aliases its output


def fused_residual_overwritten() -> HardCase:
    bug = Commit(
        "ops/norm: one buffer less in the fused residual add\n\nThe fused add writes into the activation's buffer "
        "instead of the residual's,\nsaving the copy; the mean square is one expression and the native twin adds\n"
        "in the same order.",
        LIN,
        [
            (
                NORM,
                "    xf = x.to(_acc(x.dtype))\n"
                "    variance = xf.pow(2).mean(dim=-1, keepdim=True)\n"
                "    inv_rms = torch.rsqrt(variance + eps)\n",
                "    xf = x.to(_acc(x.dtype))\n    inv_rms = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)\n",
            ),
            (
                NORM,
                "    torch.add(residual, x, out=residual)\n"
                "    x.copy_(rms_norm(residual, weight, eps, weight_offset))\n",
                "    residual = x.add_(residual)          # the sum lands in x's buffer: no temporary\n"
                "    x.copy_(rms_norm(residual, weight, eps, weight_offset))\n",
            ),
            (NORM, "    new_residual = x + residual\n", "    new_residual = residual + x\n"),
        ],
    )
    return case(
        "ts-hard-residual-overwritten",
        2411,
        "numerics",
        ["sgl-project/sglang#28005", "ggml-org/llama.cpp#24305", "ggml-org/ggml#1519"],
        "Every llama-family model produces garbage after the last update, in float32 too; gemma 2 as well",
        repro_toml({"arch": "llama", "seed": 251}, target(), [greedy(12, 2411, 8)], good_ref="v0.2.0"),
        (
            NORM,
            "fused_add_rms_norm",
            "rms_norm",
            "the fused add writes the sum into the activation buffer and returns that buffer as the residual, "
            "then overwrites it with the normalised output: the residual stream carried to the next layer is the "
            "norm's output instead of the sum",
        ),
        [(14, max_len_cap(PAVEL)), (32, bug), (33, norm_args(NOOR))],
        bug,
    )


# ============================================================================= 2412 quantization: the zero point left unscaled


def int4_zero_unscaled() -> HardCase:
    bug = Commit(
        "ops/quant_matmul: scale the group sums before the zero-point shift\n\nThe int4 product applies the group "
        "scale to the integer sums as soon as they\nare formed (smaller intermediate values in half precision); the "
        "native\ntwin's dequantize writes q * s - z * s the same way, and the bias is cast to the\noutput's dtype.",
        NOOR,
        [
            (
                QMM,
                "    return ((q - zero.float()[..., None]) * scale[..., None]).flatten(-2)\n",
                "    return (q * scale[..., None] - (zero.float() * scale)[..., None]).flatten(-2)\n",
            ),
            (
                QMM,
                "    # sum_k x_k (q_k - z) s = s * (x . q - z * sum_k x_k), per group\n"
                "    xg = x.unflatten(-1, (-1, group_size))                                    # [T, G, g]\n"
                "    qg = unpack_int4(qweight).to(x.dtype).unflatten(-1, (-1, group_size))     # [O, G, g]\n"
                '    partial = torch.einsum("tgk,ogk->tog", xg, qg)                            # [T, O, G]\n'
                "    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]\n"
                "    return ((partial - shift) * scale.to(x.dtype)[None]).sum(-1)\n",
                "    # sum_k x_k (q_k - z) s = s * (x . q) - s * z * sum_k x_k, per group\n"
                "    xg = x.unflatten(-1, (-1, group_size))                                    # [T, G, g]\n"
                "    qg = unpack_int4(qweight).to(x.dtype).unflatten(-1, (-1, group_size))     # [O, G, g]\n"
                "    s = scale.to(x.dtype)[None]                                               # [1, O, G]\n"
                '    partial = torch.einsum("tgk,ogk->tog", xg, qg) * s                        # [T, O, G]\n'
                "    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]\n"
                "    return (partial - shift).sum(-1)\n",
            ),
            (QMM, "        out = out + bias.to(xa.dtype)\n", "        out = out + bias.to(out.dtype)\n"),
        ],
    )
    unpack = Commit(
        "ops/quant_matmul: unpack nibbles with a tuple stack",
        PAVEL,
        [
            (
                QMM,
                "    return torch.stack([qweight & 0x0F, qweight >> 4], dim=-1).flatten(-2)\n",
                "    low, high = qweight & 0x0F, qweight >> 4\n    return torch.stack((low, high), dim=-1).flatten(-2)\n",
            )
        ],
    )
    tgt = target(quantization="int4", quant_group_size=32)
    return case(
        "ts-hard-int4-offset-groups",
        2412,
        "quantization",
        ["fpgaminer/GPTQ-triton#18", "uxlfoundation/oneDNN#1024", "google/gemmlowp#144"],
        "int4 weight-only quantization gives garbage on the last release; int8 is fine",
        repro_toml({"arch": "llama", "seed": 252}, tgt, [greedy(14, 2412, 8)], good_ref="v0.2.0"),
        (
            QMM,
            "_int4_matmul",
            "quant_matmul",
            "the int4 product scales the integer sums by the group scale but subtracts the zero-point term "
            "unscaled (s * x.q - z * sum x instead of s * (x.q - z * sum x)), so every group's output is "
            "offset by (s - 1) * z * sum x",
        ),
        [(12, max_len_cap(MARTA)), (24, bug), (31, unpack)],
        bug,
    )


CASES = [
    frequency_counts_once(),
    preempted_output_restart(),
    decode_partition_tail_keys(),
    nucleus_after_top_k(),
    tied_head_normalizer(),
    ngram_greedy_drift(),
    decode_capping_scale(),
    min_p_wide_open(),
    legacy_rope_scaling(),
    fp32_cache_rounding(),
    fused_residual_overwritten(),
    int4_zero_unscaled(),
]
