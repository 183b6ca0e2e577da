"""The second half of a fifth held-out set of hard-track tinyserve cases, each modelled on an upstream silent bug
(issues 2621-2626).

    python -m benchmark.author ts-hard-swiglu-interleaved ...

Same shape as tinyserve_hard_heldout4: the shared commit stream (benchmark/authoring/tinyserve_stream.py,
release tags v0.2.0 / v0.3.0 / v0.4.0) with the case's own commits inserted on both sides of the culprit,
and `good_ref` the v0.2.0 tag, 25+ commits back. Every case carries a behaviour change on another path
and a numerically equivalent change on the failing path. Issue prose lives in
benchmark/authoring/issues/<id>.md. Written without running the diagnosis on them.

Fault location mix (fixed before the cases were written), one case each:

    A  in place: an existing function edited next to harmless edits of others          2621
    B  in a new helper the culprit creates (the caller now calls it)                   2622
    C  in the caller of a helper the culprit moves faithfully to another file          2623
    D  a default value / config reader / a second file                                 2624
    E  functions of one file changed together: one wrong, the others correct           2625
    F  the culprit touches two files; the fault is in the one the issue does not hint  2626

Categories: kernel (2621, bfloat16), sampling (2622, seeded), attention (2623), model-config (2624),
kv-cache (2625), quantization (2626).
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, greedy, prompt
from benchmark.authoring.tinyserve_hard_upstream import case, target
from benchmark.authoring.tinyserve_stream import BM, CONFIG, EMB, ENGINE, PARAMS, SAMPLER, Commit

ACT = "tinyserve/ops/activation.py"
ACT_LAYER = "tinyserve/layers/activation.py"
LLAMA = "tinyserve/models/llama.py"
GEMMA = "tinyserve/models/gemma2.py"
ATTN = "tinyserve/ops/attention.py"
ATTN_LAYER = "tinyserve/layers/attention.py"
KV_OPS = "tinyserve/ops/kv_cache.py"
LINEAR = "tinyserve/layers/linear.py"
QUANT = "tinyserve/quantization.py"

OLGA = "Olga Sørensen <olga.sorensen@tinyserve.dev>"
KOFI = "Kofi Mensah <kofi.mensah.dev@gmail.com>"
INES = "Inês Carvalho <ines.carvalho@posteo.pt>"
RAJ = "Raj Malhotra <raj.malhotra@proton.me>"
TAKESHI = "Takeshi Mori <takeshi.mori@tinyserve.dev>"


def sampled(n: int, prompt_seed: int, max_tokens: int, **sampling) -> dict:
    """A sampled request: a random prompt of n ids, the given sampling options (seed among them)."""
    return {"prompt_ids": prompt(n, prompt_seed), "max_tokens": max_tokens, "sampling": sampling | {"ignore_eos": True}}


# ----------------------------------------------------------------------------- shared distractors
# Behaviour changes on paths the failing scenarios do not take.


def gelu_new_alias(author: str) -> Commit:
    return Commit(
        "activation: accept hidden_act = gelu_new\n\nGPT-2-era configs spell the tanh approximation `gelu_new`; it "
        "maps to the\nsame fused kernel as gelu_pytorch_tanh.",
        author,
        [
            (
                ACT_LAYER,
                '                      "gelu_tanh": "gelu_tanh_and_mul"}\n',
                '                      "gelu_tanh": "gelu_tanh_and_mul", "gelu_new": "gelu_tanh_and_mul"}\n',
            )
        ],
    )


def unseeded_per_request(author: str) -> Commit:
    return Commit(
        "engine: unseeded requests get a generator of their own\n\nRequests without a seed used to share one "
        "engine-wide generator, so their\ndraws depended on what else was running; each now gets one seeded from "
        "the\nengine seed and its sequence number.",
        author,
        [
            (
                ENGINE,
                "        generator = (torch.Generator().manual_seed(params.seed) if params.seed is not None\n"
                "                     else self._default_generator)\n"
                "        seq = Sequence(next(self._seq_ids), request_id, prompt_ids, params, generator, forced_token_ids)\n",
                "        seq_id = next(self._seq_ids)\n"
                "        seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + seq_id\n"
                "        generator = torch.Generator().manual_seed(seed)\n"
                "        seq = Sequence(seq_id, request_id, prompt_ids, params, generator, forced_token_ids)\n",
            )
        ],
    )


def qwen2_window_flag(author: str) -> Commit:
    return Commit(
        "config: honour use_sliding_window = false\n\nQwen2 checkpoints carry a sliding_window they do not use unless "
        "use_sliding_window\nis set; transformers ignores the window then, and so do we now.",
        author,
        [
            (
                CONFIG,
                '    n, window = hf["num_hidden_layers"], hf.get("sliding_window")\n',
                '    n, window = hf["num_hidden_layers"], hf.get("sliding_window")\n'
                '    if hf.get("use_sliding_window") is False:\n'
                "        window = None       # qwen2: the window is only a hint unless enabled\n",
            )
        ],
    )


def max_pos_default(author: str) -> Commit:
    return Commit(
        "config: max_position_embeddings defaults to 4096\n\nConfigs without the key are all recent; 2048 made the "
        "engine reject long\nprompts they handle fine.",
        author,
        [
            (
                CONFIG,
                '            max_position_embeddings=hf.get("max_position_embeddings", 2048),\n',
                '            max_position_embeddings=hf.get("max_position_embeddings", 4096),\n',
            )
        ],
    )


def seed_check(author: str) -> Commit:
    return Commit(
        "sampling_params: a seed must be a non-negative int",
        author,
        [
            (
                PARAMS,
                "        if self.max_tokens < 1:\n",
                "        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):\n"
                '            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")\n'
                "        if self.max_tokens < 1:\n",
            )
        ],
    )


def int4_group_default(author: str) -> Commit:
    return Commit(
        "config: int4 groups of 64 columns by default\n\nHalves the scale / zero-point storage; 32 was tuned for "
        "fp16 activations\nonly. quant_group_size still overrides it.",
        author,
        [
            (
                CONFIG,
                "    quant_group_size: int = 32               # int4: input columns sharing one scale / zero point\n",
                "    quant_group_size: int = 64               # int4: input columns sharing one scale / zero point\n",
            )
        ],
    )


# ============================================================================= 2621 kernel: SwiGLU halves read interleaved

SILU_OLD = (
    "def silu_and_mul(x: torch.Tensor) -> torch.Tensor:\n"
    "    # [T, 2I] -> [T, I]\n"
    "    gate, up = x.split(x.shape[-1] // 2, dim=-1)\n"
    "    return F.silu(gate) * up\n"
)
SILU_NEW = (
    "def silu_and_mul(x: torch.Tensor) -> torch.Tensor:\n"
    "    # [T, 2I] -> [T, I]; gate and up as strided views of the fused output: no split copies\n"
    "    pairs = x.unflatten(-1, (-1, 2))                                 # [T, I, 2]\n"
    "    gate, up = pairs[..., 0], pairs[..., 1]\n"
    "    return F.silu(gate) * up\n"
)


def swiglu_interleaved() -> HardCase:
    bug = Commit(
        "ops/activation: read gate and up as views of the fused projection\n\nThe gated activations index the "
        "fused [gate | up] output in place instead of\nsplitting it into copies; the native twins share one upcast "
        "helper. Memory\ntraffic per MLP drops by one activation-sized buffer.",
        OLGA,
        [
            (ACT, SILU_OLD, SILU_NEW),
            (
                ACT,
                "    gate, up = x.chunk(2, dim=-1)\n"
                "    g = gate.to(torch.promote_types(x.dtype, torch.float32))\n"
                "    return (g / (1.0 + torch.exp(-g))).to(x.dtype) * up\n",
                "    gate, up = x.chunk(2, dim=-1)\n    g = _upcast(gate)\n    return (g / (1.0 + torch.exp(-g))).to(x.dtype) * up\n",
            ),
            (
                ACT,
                "    d = x.shape[-1] // 2\n"
                '    out = F.gelu(x[..., :d], approximate="tanh")\n'
                "    return out.mul_(x[..., d:])\n",
                "    d = x.shape[-1] // 2\n"
                "    gate, up = x[..., :d], x[..., d:]\n"
                '    return F.gelu(gate, approximate="tanh").mul_(up)\n',
            ),
            (
                ACT,
                "    gate, up = x.chunk(2, dim=-1)\n"
                "    g = gate.to(torch.promote_types(x.dtype, torch.float32))\n"
                "    inner = ",
                "    gate, up = x.chunk(2, dim=-1)\n    g = _upcast(gate)\n    inner = ",
            ),
            (
                ACT,
                "import torch.nn.functional as F\n",
                "import torch.nn.functional as F\n\n\n"
                "def _upcast(t: torch.Tensor) -> torch.Tensor:\n"
                "    # the native twins compute the activation in fp32 (or wider), like transformers\n"
                "    return t.to(torch.promote_types(t.dtype, torch.float32))\n",
            ),
        ],
    )
    mlp = Commit(
        "llama: name the fused gate/up output in GatedMLP",
        KOFI,
        [
            (
                LLAMA,
                "        return self.down_proj(self.act_fn(self.gate_up_proj(x)))\n",
                "        gate_up = self.gate_up_proj(x)          # [T, 2I]: gate | up\n"
                "        return self.down_proj(self.act_fn(gate_up))\n",
            )
        ],
    )
    return case(
        "ts-hard-swiglu-interleaved",
        2621,
        "kernel",
        ["vllm-project/vllm#29273", "ROCm/ATOM#885", "microsoft/onnxruntime#28738"],
        "bf16 Llama output is gibberish after upgrading; Gemma 2 on the same install looks fine",
        repro_toml(
            {"arch": "llama", "seed": 2621},
            target("bfloat16"),
            [greedy(18, 2621, 10), greedy(7, 2721, 10)],
            good_ref="v0.2.0",
        ),
        (
            ACT,
            "silu_and_mul",
            "activation",
            "the fused SiLU-and-multiply reads gate and up as interleaved columns (even / odd) of the fused "
            "projection, which is laid out [gate | up]: half of each operand comes from the other projection",
        ),
        [(13, gelu_new_alias(INES)), (24, bug), (31, mlp)],
        bug,
    )


# ============================================================================= 2622 sampling: the temperature applied twice

PROBS_HELPER = (
    "def sampling_probs(truncated: torch.Tensor, st: SamplingTensors) -> torch.Tensor:\n"
    '    """Truncated logits [S, V] -> the distribution random rows draw from [S, V] (fp32 or wider).\n\n'
    "    The temperature is applied here, right before the softmax, so every filter upstream sees\n"
    '    the same logits whatever the temperature; greedy rows hold temperature 1."""\n'
    "    scaled = truncated / st.temperature.to(truncated.dtype).unsqueeze(1)\n"
    "    return scaled.softmax(dim=-1)\n"
)


def temperature_twice() -> HardCase:
    bug = Commit(
        "sampler: form the drawn distribution in one helper\n\nThe softmax over the truncated logits moves into "
        "sampling_probs, which scales\nby the temperature right before it (where transformers' warpers leave it "
        "for\nthe draw); the spec-decode resampler gets the same distribution through\nSampler.forward. draw's "
        "comment says which rows race.",
        RAJ,
        [
            (SAMPLER, "@dataclass\nclass SamplerOutput:\n", PROBS_HELPER + "\n\n@dataclass\nclass SamplerOutput:\n"),
            (
                SAMPLER,
                "        probs = truncated.softmax(dim=-1)\n",
                "        probs = sampling_probs(truncated, st)\n",
            ),
            (
                SAMPLER,
                "        tokens = logits.argmax(dim=-1)\n",
                "        tokens = logits.argmax(dim=-1)          # greedy rows; random rows race below\n",
            ),
        ],
    )
    temp = Commit(
        "sampler: temperature as a column view",
        TAKESHI,
        [
            (
                SAMPLER,
                "        return logits / st.temperature.to(logits.dtype).unsqueeze(1)\n",
                "        return logits / st.temperature.to(logits.dtype).view(-1, 1)\n",
            )
        ],
    )
    reqs = [
        sampled(14, 2622, 12, temperature=0.7, seed=7),
        sampled(9, 2722, 12, temperature=0.5, top_k=40, seed=1234),
    ]
    return case(
        "ts-hard-temperature-twice",
        2622,
        "sampling",
        ["RL-Align/RL-Kernel#81", "RL-Align/RL-Kernel#86", "Adibvafa/CodonTransformer#20"],
        "Sampling at temperature below 1 is much less diverse than before the upgrade",
        repro_toml({"arch": "llama", "seed": 262}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "sampling_probs",
            "sampler",
            "the new softmax helper divides the truncated logits by the temperature although the logits adjuster "
            "already did: random rows draw from softmax(logits / T^2), too sharp below T = 1 and too flat above",
        ),
        [(12, unseeded_per_request(KOFI)), (26, bug), (30, temp)],
        bug,
    )


# ============================================================================= 2623 attention: window and cap swapped


KV_CACHE_MODULE = '''"""Paged KV-cache writes (the attention kernels read what these write).

Layout: key/value cache [num_blocks, block_size, KVH, D]; slot = block * block_size + offset.
"""
from __future__ import annotations

import torch


def write_to_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's keys/values [T, KVH, D] into their cache slots (block * block_size + offset)."""
    kvh, d = key.shape[1], key.shape[2]
    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)
'''


def window_cap_swapped() -> HardCase:
    bug = Commit(
        "ops: cache writes in their own module\n\nwrite_to_kv_cache moves from ops/attention.py to ops/kv_cache.py, "
        "where the\nquantized-cache work will add its variants; the attention layer imports it\nfrom there and "
        "hands the kernel its fixed per-layer settings as one tuple.",
        TAKESHI,
        [
            (KV_OPS, None, KV_CACHE_MODULE),
            (
                ATTN,
                "def write_to_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,\n"
                "                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:\n"
                '    """Scatter this step\'s keys/values [T, KVH, D] into their cache slots (block * block_size + offset)."""\n'
                "    kvh, d = key.shape[1], key.shape[2]\n"
                "    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)\n"
                "    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)\n\n\n",
                "",
            ),
            (
                ATTN_LAYER,
                "from tinyserve.ops.attention import write_to_kv_cache\n",
                "from tinyserve.ops.kv_cache import write_to_kv_cache\n",
            ),
            (
                ATTN_LAYER,
                "        out = self._kernel(q, self.k_cache, self.v_cache, meta.query_start_loc, meta.seq_lens,\n"
                "                           meta.block_tables, self.scale, self.sliding_window, self.softcap)\n",
                "        layer_args = (self.scale, self.softcap, self.sliding_window)     # fixed for the layer\n"
                "        out = self._kernel(q, self.k_cache, self.v_cache, meta.query_start_loc, meta.seq_lens,\n"
                "                           meta.block_tables, *layer_args)\n",
            ),
        ],
    )
    sandwich = Commit(
        "gemma2: name the attention output before its post-norm",
        INES,
        [
            (
                GEMMA,
                "        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))\n",
                "        attn_out = self.self_attn(positions, hidden)\n"
                "        hidden = self.post_attention_layernorm(attn_out)\n",
            )
        ],
    )
    return case(
        "ts-hard-window-cap-swapped",
        2623,
        "attention",
        ["sgl-project/sglang#34093", "vllm-project/vllm#5908", "ggml-org/llama.cpp#8197"],
        "Gemma 2 answers degrade on longer prompts since updating; short prompts look the same",
        repro_toml(
            {"arch": "gemma2", "seed": 263}, target(), [greedy(72, 2623, 8), greedy(20, 2723, 8)], good_ref="v0.2.0"
        ),
        (
            ATTN_LAYER,
            "Attention.forward",
            "attention",
            "the layer passes its settings to the paged-attention kernel as (scale, softcap, sliding_window) "
            "where the kernel takes (scale, sliding_window, softcap): Gemma 2 layers attend through a window "
            "of 50 tokens (the cap) and cap scores at the window size",
        ),
        [(14, qwen2_window_flag(OLGA)), (23, bug), (30, sandwich)],
        bug,
    )


# ============================================================================= 2624 model-config: the final cap fixed at 30


def final_cap_constant() -> HardCase:
    bug = Commit(
        "gemma2: the model class owns its soft-capping values\n\nGemma 2 caps attention scores at 50 and final "
        "logits at 30. Some converted\nconfig.json files leave the keys out, which silently turned capping off; "
        "the\nconfig reader now falls back to 50 for the attention cap and the model class\nsets the final cap.",
        KOFI,
        [
            (
                CONFIG,
                '            attn_logit_softcapping=hf.get("attn_logit_softcapping") if gemma else None,\n',
                '            attn_logit_softcapping=hf.get("attn_logit_softcapping", 50.0) if gemma else None,\n',
            ),
            (
                GEMMA,
                "from tinyserve.config import ModelConfig\n",
                "from tinyserve.config import ModelConfig\nfrom tinyserve.layers.embedding import LogitsProcessor\n",
            ),
            (
                GEMMA,
                "class Gemma2ForCausalLM(LlamaForCausalLM):\n    model_cls = Gemma2Model\n",
                "class Gemma2ForCausalLM(LlamaForCausalLM):\n"
                "    model_cls = Gemma2Model\n"
                "    final_logit_softcap = 30.0     # Gemma 2's published value\n\n"
                "    def __init__(self, cfg: ModelConfig, kernels, max_model_len: int):\n"
                "        super().__init__(cfg, kernels, max_model_len)\n"
                "        self.logits_processor = LogitsProcessor(cfg.vocab_size, self.final_logit_softcap)\n",
            ),
        ],
    )
    cap_order = Commit(
        "logits: write the final soft-cap as cap * tanh(x / cap)",
        RAJ,
        [
            (
                EMB,
                "            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap\n",
                "            logits = self.soft_cap * torch.tanh(logits / self.soft_cap)\n",
            )
        ],
    )
    model = {"arch": "gemma2", "seed": 264, "config_json": {"final_logit_softcapping": 8.0}}
    return case(
        "ts-hard-final-cap-constant",
        2624,
        "model-config",
        ["ggml-org/llama.cpp#21388", "ggml-org/llama.cpp#21390", "ggml-org/llama.cpp#8240"],
        "Our Gemma 2 fine-tune (different final_logit_softcapping) no longer matches transformers",
        repro_toml(model, target(), [greedy(16, 2624, 10), greedy(30, 2724, 6)], good_ref="v0.2.0"),
        (
            GEMMA,
            "Gemma2ForCausalLM.__init__",
            "gemma2",
            "the Gemma 2 model class replaces the logits processor with one capped at a hard-coded 30, so a "
            "checkpoint whose config.json sets another final_logit_softcapping is capped at the wrong value",
        ),
        [(11, max_pos_default(TAKESHI)), (27, bug), (31, cap_order)],
        bug,
    )


# ============================================================================= 2625 kv-cache: a shared block claimed once


def shared_block_claimed_once() -> HardCase:
    bug = Commit(
        "block_manager: claiming, freeing and evicting read more directly\n\n_take pops a cached block from the "
        "free queue whatever its state (a pop with\na default instead of a membership test) and marks it in use; "
        "free names\nthe released block; _evict reads the block's hash once.",
        INES,
        [
            (
                BM,
                "    def _take(self, block: Block) -> None:\n"
                "        if block.ref_count == 0:\n"
                "            del self.free_queue[block.block_id]\n"
                "        block.ref_count += 1\n",
                "    def _take(self, block: Block) -> None:\n"
                "        # a cached block may still sit in the free queue: claim it from there\n"
                "        self.free_queue.pop(block.block_id, None)\n"
                "        block.ref_count = 1\n",
            ),
            (
                BM,
                "            block = self.blocks[block_id]\n"
                "            block.ref_count -= 1\n"
                "            if block.ref_count == 0:\n"
                "                self.free_queue[block_id] = None\n",
                "            released = self.blocks[block_id]\n"
                "            released.ref_count -= 1\n"
                "            if released.ref_count == 0:\n"
                "                self.free_queue[block_id] = None\n",
            ),
            (
                BM,
                "        if block.hash is not None and self.hash_to_block.get(block.hash) == block.block_id:\n"
                "            del self.hash_to_block[block.hash]\n",
                "        h = block.hash\n"
                "        if h is not None and self.hash_to_block.get(h) == block.block_id:\n"
                "            del self.hash_to_block[h]\n",
            ),
        ],
    )
    ceil = Commit(
        "block_manager: blocks_needed with a plain ceil-div",
        RAJ,
        [
            (
                BM,
                "        return max(0, -(-total // self.block_size) - len(seq.block_table))\n",
                "        return max(0, (total + self.block_size - 1) // self.block_size - len(seq.block_table))\n",
            )
        ],
    )
    shared = prompt(32, 2625)
    reqs = [
        {"prompt_ids": shared + [7], "max_tokens": 3, "sampling": {"temperature": 0.0, "ignore_eos": True}},
        {
            "prompt_ids": shared + prompt(9, 2725),
            "max_tokens": 24,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
        greedy(40, 2825, 24),
    ]
    tgt = target(
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        max_num_batched_tokens=33,
        block_size=8,
        num_kv_blocks=14,
    )
    return case(
        "ts-hard-shared-block-claimed-once",
        2625,
        "kv-cache",
        ["Avarok-Cybersecurity/atlas#373", "Wenyueh/MinivLLM#87", "xLLM-AI/xllm#1264"],
        "With prefix caching on, a long request that shares a system prompt with a short one goes off the rails",
        repro_toml({"arch": "llama", "seed": 265}, tgt, reqs, good_ref="v0.2.0"),
        (
            BM,
            "BlockManager._take",
            "block_manager",
            "claiming a cached block sets its reference count to 1 instead of incrementing it, so a prefix block "
            "shared by two running sequences is returned to the free queue when the first finishes and is handed "
            "out again (and overwritten) while the second still attends over it",
        ),
        [(11, seed_check(OLGA)), (25, bug), (32, ceil)],
        bug,
    )


# ============================================================================= 2626 quantization: the bias added twice


def quantized_bias_twice() -> HardCase:
    bug = Commit(
        "quantization: the layer adds the bias, not the kernel\n\nLinearBase.apply adds the bias in the activation "
        "dtype after a quantized\nmatmul, so every dequant kernel can assume a bias-free product; QuantizedWeight\n"
        "documents the contract and takes the bias as an optional keyword.",
        TAKESHI,
        [
            (
                LINEAR,
                "    def apply(self, x: torch.Tensor) -> torch.Tensor:\n"
                "        if self.quant is not None:\n"
                "            return self.quant(x, self.bias)\n"
                "        return F.linear(x, self.weight, self.bias)\n",
                "    def apply(self, x: torch.Tensor) -> torch.Tensor:\n"
                "        if self.quant is None:\n"
                "            return F.linear(x, self.weight, self.bias)\n"
                "        out = self.quant(x, self.bias)\n"
                "        # the bias is added here, in the activation dtype, whatever the quantized kernel\n"
                "        return out if self.bias is None else out + self.bias.to(out.dtype)\n",
            ),
            (
                QUANT,
                '    """A layer\'s packed weight and the kernel that multiplies by it (plain tensors: `model.to(dtype)`\n'
                '    must not round the scales)."""\n',
                '    """A layer\'s packed weight and the kernel that multiplies by it (plain tensors: `model.to(dtype)`\n'
                '    must not round the scales). The owning layer adds its bias after the product."""\n',
            ),
            (
                QUANT,
                "    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:\n",
                "    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:\n",
            ),
        ],
    )
    loader = Commit(
        "linear: shard slice taken before the shape check",
        OLGA,
        [
            (
                LINEAR,
                "        start, size = self.shard_offset(shard_id)\n        target = param.data.narrow(0, start, size)\n",
                "        target = param.data.narrow(0, *self.shard_offset(shard_id))\n",
            )
        ],
    )
    tgt = target(quantization="int8")
    return case(
        "ts-hard-quantized-bias-twice",
        2626,
        "quantization",
        ["vllm-project/vllm#18363", "casper-hansen/AutoAWQ#369", "IST-DASLab/FP-Quant#16"],
        "int8 weight-only quantization: Qwen2 output drifts badly since the update, Llama int8 is still fine",
        repro_toml(
            {"arch": "qwen2", "seed": 266, "perturb_init": True},
            tgt,
            [greedy(15, 2626, 10), greedy(8, 2726, 10)],
            good_ref="v0.2.0",
        ),
        (
            LINEAR,
            "LinearBase.apply",
            "linear",
            "after the bias moved into the layer, apply still hands the bias to the quantized kernel (which adds "
            "it) and then adds it again: every quantized projection with a bias (Qwen2's q/k/v) gets it twice",
        ),
        [(13, int4_group_default(RAJ)), (28, bug), (31, loader)],
        bug,
    )


CASES = [
    swiglu_interleaved(),
    temperature_twice(),
    window_cap_swapped(),
    final_cap_constant(),
    shared_block_claimed_once(),
    quantized_bias_twice(),
]
