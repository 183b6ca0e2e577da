"""Distractor commits for the at-base cases: per file of the subject, small real changes (comments
that a reviewer asked for, equivalent refactors, options on other paths), each a
(message, [(file, old, new)]) that applies on its own on top of any of the at-base bugs."""

from __future__ import annotations

NORM = "tinyserve/ops/norm.py"
LAYERNORM = "tinyserve/layers/layernorm.py"
ACT = "tinyserve/ops/activation.py"
ACT_LAYER = "tinyserve/layers/activation.py"
ROPE = "tinyserve/layers/rotary_embedding.py"
ROT_OP = "tinyserve/ops/rotary.py"
ATTN = "tinyserve/ops/attention.py"
ATTN_LAYER = "tinyserve/layers/attention.py"
SAMPLER = "tinyserve/layers/sampler.py"
CONFIG = "tinyserve/config.py"
QUANT = "tinyserve/quantization.py"
QMM = "tinyserve/ops/quant_matmul.py"

POOL: dict[str, list[tuple[str, list]]] = {
    NORM: [
        (
            "layers/layernorm: the fused form returns the new residual",
            [
                (
                    LAYERNORM,
                    '    """forward(x) -> normed; forward(x, residual) -> (normed, residual + x), fused."""\n',
                    '    """forward(x) -> normed; forward(x, residual) -> (normed, residual + x), fused: the second\n'
                    '    value is the residual stream the next layer adds to."""\n',
                )
            ],
        ),
        (
            "ops/norm: one rsqrt per row",
            [
                (
                    NORM,
                    "    # [T, H] -> [T, H]\n    xf = x.to(_acc(x.dtype))\n    inv_rms",
                    "    # [T, H] -> [T, H]; one rsqrt per row, no division\n    xf = x.to(_acc(x.dtype))\n    inv_rms",
                )
            ],
        ),
        (
            "ops/norm: say why the accumulation dtype promotes",
            [
                (
                    NORM,
                    "    # fp32 accumulation, or wider when the model itself runs wider\n",
                    "    # fp32 accumulation, or wider when the model itself runs wider (an fp64 run stays fp64)\n",
                )
            ],
        ),
        (
            "ops/norm: shapes in _scale_by_weight",
            [
                (
                    NORM,
                    "    if weight_offset:\n        return (normed * (weight_offset + weight.to(normed.dtype))).to(dtype)\n",
                    "    # normed [T, H] in the accumulation dtype, weight [H] in the model dtype\n"
                    "    if weight_offset:\n        return (normed * (weight_offset + weight.to(normed.dtype))).to(dtype)\n",
                )
            ],
        ),
        (
            "ops/norm: native RMSNorm squares with pow(2), as the reference code it mirrors",
            [
                (
                    NORM,
                    "    variance = (xf * xf).sum(-1, keepdim=True) / x.shape[-1]\n",
                    "    variance = xf.pow(2).sum(-1, keepdim=True) / x.shape[-1]\n",
                )
            ],
        ),
        (
            "ops/norm: document that the fused kernel allocates nothing",
            [
                (
                    NORM,
                    "residual += x; x = rms_norm(residual). In place on both buffers, like the CUDA kernel.\n",
                    "residual += x; x = rms_norm(residual). In place on both buffers, like the CUDA kernel:\n"
                    "    the caller's x and residual are the outputs, no new memory is allocated.\n",
                )
            ],
        ),
        (
            "ops/norm: note that the native fused twin never aliases",
            [
                (
                    NORM,
                    "    new_residual = x + residual\n",
                    "    # out of place: the native twin never writes into its inputs\n    new_residual = x + residual\n",
                )
            ],
        ),
        (
            "ops/norm: module docstring names the twin tests",
            [
                (
                    NORM,
                    "as 1+w) multiplies in fp32 and casts at the end.\n",
                    "as 1+w) multiplies in fp32 and casts at the end. Each optimized kernel is\n"
                    "tested against its native twin.\n",
                )
            ],
        ),
        (
            "layers/layernorm: say which kernel each call reaches",
            [
                (
                    LAYERNORM,
                    "        if residual is None:\n",
                    "        # no residual: plain RMSNorm; with one: the fused add + norm kernel\n        if residual is None:\n",
                )
            ],
        ),
        (
            "layers/layernorm: GemmaRMSNorm zero-initialises its weight on purpose",
            [
                (
                    LAYERNORM,
                    "        self.weight.data.zero_()\n",
                    "        self.weight.data.zero_()   # (1 + 0) = identity until the checkpoint is loaded\n",
                )
            ],
        ),
    ],
    ACT: [
        (
            "ops/activation: silu_and_mul never writes its input",
            [
                (
                    ACT,
                    "    out = F.silu(x[..., :d])\n",
                    "    out = F.silu(x[..., :d])   # a new tensor: x itself is never written\n",
                )
            ],
        ),
        (
            "ops/activation: native GELU cubes by multiplication",
            [
                (
                    ACT,
                    "    inner = math.sqrt(2.0 / math.pi) * (g + 0.044715 * g.pow(3))\n",
                    "    inner = math.sqrt(2.0 / math.pi) * (g + 0.044715 * g * g * g)\n",
                )
            ],
        ),
        (
            "layers/activation: docstring names the kernel table",
            [
                (
                    ACT_LAYER,
                    '    """[T, 2I] -> [T, I]: act(gate) * up."""\n',
                    '    """[T, 2I] -> [T, I]: act(gate) * up, through the kernel ACTIVATION_KERNELS names."""\n',
                )
            ],
        ),
        (
            "ops/activation: explain the buffer reuse",
            [
                (
                    ACT,
                    '"""Gated MLP activations: act(gate) * up over a fused [gate | up] projection."""\n',
                    '"""Gated MLP activations: act(gate) * up over a fused [gate | up] projection.\n\n'
                    "The optimized paths write the product into the activation's own output buffer.\n"
                    '"""\n',
                )
            ],
        ),
        (
            "ops/activation: reword silu_and_mul's comment",
            [
                (
                    ACT,
                    "    # [T, 2I] -> [T, I]; writes silu(gate) into a fresh buffer then multiplies in place\n",
                    "    # [T, 2I] -> [T, I]; silu(gate) lands in a fresh buffer, multiplied by up in place\n",
                )
            ],
        ),
        (
            "ops/activation: native silu via sigmoid",
            [
                (
                    ACT,
                    "    return (g / (1.0 + torch.exp(-g))).to(x.dtype) * up\n",
                    "    return (g * torch.sigmoid(g)).to(x.dtype) * up\n",
                )
            ],
        ),
        (
            "ops/activation: name the tanh form in the native GELU",
            [
                (
                    ACT,
                    "    # [T, 2I] -> [T, I]; 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))\n",
                    "    # [T, 2I] -> [T, I]; 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh form\n",
                )
            ],
        ),
        (
            "ops/activation: export list",
            [
                (
                    ACT,
                    "import torch.nn.functional as F\n",
                    "import torch.nn.functional as F\n\n"
                    '__all__ = ["silu_and_mul", "silu_and_mul_native", "gelu_tanh_and_mul", "gelu_tanh_and_mul_native"]\n',
                )
            ],
        ),
        (
            "layers/activation: accept gelu_new as an alias of the tanh GELU",
            [
                (
                    ACT_LAYER,
                    '                      "gelu_tanh": "gelu_tanh_and_mul"}\n',
                    '                      "gelu_tanh": "gelu_tanh_and_mul", "gelu_new": "gelu_tanh_and_mul"}\n',
                )
            ],
        ),
        (
            "layers/activation: keep the kernel's name for debugging",
            [
                (
                    ACT_LAYER,
                    "    def forward(self, x):\n        return self._kernel(x)\n",
                    '    def extra_repr(self) -> str:\n        return f"kernel={self.kernel_name}"\n\n'
                    "    def forward(self, x):\n        return self._kernel(x)\n",
                )
            ],
        ),
    ],
    ROPE: [
        (
            "rotary_embedding: default_inv_freq docstring",
            [
                (
                    ROPE,
                    "def default_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):\n",
                    "def default_inv_freq(rope: dict, dim: int, max_pos: int, seq_len=None):\n"
                    '    """Plain RoPE: theta^(-2i/dim), no attention scaling."""\n',
                )
            ],
        ),
        (
            "rotary_embedding: name the table width",
            [
                (
                    ROPE,
                    "    # positions [P] -> [P, dim] fp32: cos | sin\n",
                    "    # positions [P] -> [P, dim] fp32: cos | sin, dim = 2 * len(inv_freq)\n",
                )
            ],
        ),
        (
            "rotary_embedding: point at the transformers functions the math follows",
            [
                (
                    ROPE,
                    "only when applied.\n",
                    "only when applied. Keep both in step with\n`transformers.modeling_rope_utils` when a rope type changes there.\n",
                )
            ],
        ),
        (
            "rotary_embedding: docstring for the YaRN magnitude",
            [
                (
                    ROPE,
                    "def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:\n",
                    "def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:\n"
                    '    """YaRN attention magnitude for a context scaled by `scale` (1 when not extended)."""\n',
                )
            ],
        ),
        (
            "rotary_embedding: describe the ROPE_SCALING table",
            [
                (
                    ROPE,
                    'ROPE_SCALING = {"default": default_inv_freq,',
                    "# rope_type -> fn(rope, dim, max_pos, seq_len) -> (inv_freq [dim/2], attention scaling)\n"
                    'ROPE_SCALING = {"default": default_inv_freq,',
                )
            ],
        ),
        (
            "rotary_embedding: clearer error for an unknown rope_type",
            [
                (
                    ROPE,
                    'raise ValueError(f"unsupported rope_type {rope_type!r}; supported:',
                    'raise ValueError(f"rope_type {rope_type!r} is not supported; supported:',
                )
            ],
        ),
        (
            "rotary_embedding: cache_for says when it recomputes",
            [
                (
                    ROPE,
                    '        (as transformers does per forward); every other type uses the precomputed cache."""\n',
                    "        (as transformers does per forward); every other type uses the precomputed cache.\n"
                    '        The recomputed table is not kept: a long request is rare and its length varies."""\n',
                )
            ],
        ),
        (
            "rotary_embedding: llama3 docstring names the context it compares against",
            [
                (
                    ROPE,
                    '    """Llama 3.1: keep high frequencies, divide low ones by factor, blend in between."""\n',
                    '    """Llama 3.1: keep high frequencies, divide low ones by factor, blend in between\n'
                    '    (wavelengths are compared against the pretraining context)."""\n',
                )
            ],
        ),
        (
            "rotary_embedding: accept the legacy 'su' name as longrope is not supported",
            [
                (
                    ROPE,
                    '        rope_type = rope["rope_type"]\n',
                    '        rope_type = rope["rope_type"]\n'
                    '        if rope_type in ("su", "longrope"):\n'
                    '            raise ValueError("longrope (su) scaling is not supported yet")\n',
                )
            ],
        ),
        (
            "ops/rotary: shapes in the kernel signature",
            [
                (
                    ROT_OP,
                    "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)\n",
                    "    # positions [T] index rows of the fp32 table; each row is cos | sin\n"
                    "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)\n",
                )
            ],
        ),
    ],
    ATTN: [
        (
            "ops/attention: the mask follows transformers' sliding window",
            [
                (
                    ATTN,
                    "    # [..., Q, 1] vs [..., 1, K] -> bool mask of keys each query may attend to\n",
                    "    # [..., Q, 1] vs [..., 1, K] -> bool mask of keys each query may attend to\n"
                    "    # (a window W lets a query see itself and the W - 1 keys before it)\n",
                )
            ],
        ),
        (
            "ops/attention: the native twin is the readable one",
            [
                (
                    ATTN,
                    '    """Per sequence: gather its whole context, full masked softmax. [T, H, D] -> [T, H, D]."""\n',
                    '    """Per sequence: gather its whole context, full masked softmax. [T, H, D] -> [T, H, D].\n'
                    '    Slow; the reference the optimized kernels are tested against."""\n',
                )
            ],
        ),
        (
            "ops/attention: say why decode partitions are 64 tokens",
            [
                (
                    ATTN,
                    "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition\n",
                    "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition (short contexts: one partition)\n",
                )
            ],
        ),
        (
            "ops/attention: fully masked rows give zeros",
            [
                (
                    ATTN,
                    "the output is cast back to the query dtype.\n",
                    "the output is cast back to the query dtype. A row that sees no key at all\n"
                    "(only possible for padding) comes out as zeros, not NaN.\n",
                )
            ],
        ),
        (
            "ops/attention: say why the prefill tile is 32 tokens",
            [
                (
                    ATTN,
                    "KV_TILE_TOKENS = 32        # prefill: keys/values visited per online-softmax tile\n",
                    "KV_TILE_TOKENS = 32        # prefill: keys/values visited per online-softmax tile (2 blocks of 16)\n",
                )
            ],
        ),
        (
            "ops/attention: write_to_kv_cache overwrites, never accumulates",
            [
                (
                    ATTN,
                    '    """Scatter this step\'s keys/values [T, KVH, D] into their cache slots (block * block_size + offset)."""\n',
                    '    """Scatter this step\'s keys/values [T, KVH, D] into their cache slots (block * block_size + offset).\n'
                    '    A slot written twice (a recomputed token) keeps the last write."""\n',
                )
            ],
        ),
        (
            "ops/attention: gather_kv reads whole blocks",
            [
                (
                    ATTN,
                    '    """Tokens [start, end) of one sequence from the paged cache -> [end - start, KVH, D]."""\n',
                    '    """Tokens [start, end) of one sequence from the paged cache -> [end - start, KVH, D].\n'
                    '    Whole blocks are read, then trimmed to the range."""\n',
                )
            ],
        ),
        (
            "ops/attention: why the partition weights take nan_to_num",
            [
                (
                    ATTN,
                    "    weights = torch.exp(lses - lse).nan_to_num(0.0)\n",
                    "    # a partition that sees no key has lse -inf: exp gives nan there, weight it 0\n"
                    "    weights = torch.exp(lses - lse).nan_to_num(0.0)\n",
                )
            ],
        ),
        (
            "ops/attention: comment the decode / prefill split",
            [
                (
                    ATTN,
                    "    q_lens = query_start_loc[1:] - query_start_loc[:-1]\n",
                    "    # [B] query rows per sequence: 1 for decode, the chunk length for prefill\n"
                    "    q_lens = query_start_loc[1:] - query_start_loc[:-1]\n",
                )
            ],
        ),
        (
            "ops/attention: _prefill_tile_range docstring names the alignment",
            [
                (
                    ATTN,
                    '    """KV tile starts this chunk needs: tiles wholly left of every query\'s window are skipped."""\n',
                    '    """KV tile starts this chunk needs: tiles wholly left of every query\'s window are skipped.\n'
                    '    Starts stay multiples of KV_TILE_TOKENS so tiles never straddle two cache blocks."""\n',
                )
            ],
        ),
        (
            "layers/attention: shapes of the bound cache",
            [
                (
                    ATTN_LAYER,
                    "        self.k_cache = self.v_cache = torch.empty(0)\n",
                    "        self.k_cache = self.v_cache = torch.empty(0)   # bound by the model runner once blocks exist\n",
                )
            ],
        ),
    ],
    SAMPLER: [
        (
            "sampler: SamplerOutput comment",
            [
                (
                    SAMPLER,
                    "    probs: torch.Tensor               # [S, V] distribution the tokens were drawn from\n",
                    "    probs: torch.Tensor               # [S, V] distribution the tokens were drawn from (after filters)\n",
                )
            ],
        ),
        (
            "sampler: LogitsAdjuster docstring names the tap",
            [
                (
                    SAMPLER,
                    '    """logits [S, V] -> penalised, temperature-scaled logits [S, V] (fp32 or wider)."""\n',
                    '    """logits [S, V] -> penalised, temperature-scaled logits [S, V] (fp32 or wider): the state\n'
                    '    that truncation and drawing start from."""\n',
                )
            ],
        ),
        (
            "sampler: module docstring says where logprobs come from",
            [
                (
                    SAMPLER,
                    "it is batched with.\n",
                    "it is batched with. Logprobs are taken from the raw logits, before any of this.\n",
                )
            ],
        ),
        (
            "sampler: SamplingTensors.build comment",
            [
                (
                    SAMPLER,
                    "        s = len(params)\n",
                    "        # one row per scheduled sequence, in batch order\n        s = len(params)\n",
                )
            ],
        ),
        (
            "sampler: temperature is a no-op on greedy rows",
            [
                (
                    SAMPLER,
                    "        return logits / st.temperature.to(logits.dtype).unsqueeze(1)\n",
                    "        # greedy rows hold 1.0, so dividing leaves them unchanged\n"
                    "        return logits / st.temperature.to(logits.dtype).unsqueeze(1)\n",
                )
            ],
        ),
        (
            "sampler: top-p comment names HF's warper",
            [
                (
                    SAMPLER,
                    "        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives\n",
                    "        # drop the low tail whose total mass is <= 1 - top_p; the top token always survives\n"
                    "        # (as HF's TopPLogitsWarper)\n",
                )
            ],
        ),
        (
            "sampler: min-p comment",
            [
                (
                    SAMPLER,
                    "        probs = logits.softmax(dim=-1)\n        threshold",
                    "        # the cutoff scales with the row's top probability\n"
                    "        probs = logits.softmax(dim=-1)\n        threshold",
                )
            ],
        ),
        (
            "sampler: greedy rows keep the argmax of the adjusted logits",
            [
                (
                    SAMPLER,
                    "        tokens = logits.argmax(dim=-1)\n",
                    "        tokens = logits.argmax(dim=-1)   # greedy rows: argmax of the adjusted logits\n",
                )
            ],
        ),
        (
            "sampler: compute_logprobs casts once",
            [
                (
                    SAMPLER,
                    "    -> (chosen [S], top ids [S, n], top logprobs [S, n])\n",
                    "    -> (chosen [S], top ids [S, n], top logprobs [S, n]); fp32 or wider whatever the model dtype\n",
                )
            ],
        ),
        (
            "sampler: the filter skip is per batch, not per row",
            [
                (
                    SAMPLER,
                    "        # each filter costs a sort or a softmax over the vocab: skip it when no row uses it\n",
                    "        # each filter costs a sort or a softmax over the vocab: skip it when no row uses it\n"
                    "        # (rows that do not use it pass through unchanged: k = V, p = 1, min_p = 0)\n",
                )
            ],
        ),
    ],
    CONFIG: [
        (
            "config: from_dir docstring",
            [
                (
                    CONFIG,
                    '    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":\n',
                    '    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":\n        """Read <model_dir>/config.json."""\n',
                )
            ],
        ),
        (
            "config: DTYPES comment",
            [
                (
                    CONFIG,
                    'DTYPES = {"float32": torch.float32,',
                    '# float64 is for probes and tests, not serving\nDTYPES = {"float32": torch.float32,',
                )
            ],
        ),
        (
            "config: rope_parameters docstring names the flat keys",
            [
                (
                    CONFIG,
                    "    Reads transformers-5 `rope_parameters` or the legacy `rope_scaling` + `rope_theta`.\n",
                    "    Reads transformers-5 `rope_parameters` or the legacy `rope_scaling` + `rope_theta`;\n"
                    "    the result always has rope_type and rope_theta, plus the type's own keys.\n",
                )
            ],
        ),
        (
            "config: sliding_windows field comment",
            [
                (
                    CONFIG,
                    "    sliding_windows: list           # per layer: window size or None (full attention)\n",
                    "    sliding_windows: list           # per layer: window size in tokens, or None (full attention)\n",
                )
            ],
        ),
        (
            "config: qkv bias comment",
            [
                (
                    CONFIG,
                    "            # qwen2 puts a bias on q/k/v only; llama's attention_bias covers o_proj too\n",
                    "            # qwen2 puts a bias on q/k/v only; llama's (and mistral's) attention_bias covers o_proj too\n",
                )
            ],
        ),
        (
            "config: block_size error message",
            [
                (
                    CONFIG,
                    '            raise ValueError(f"block_size must be >= 1, got {self.block_size}")\n',
                    '            raise ValueError(f"block_size must be a positive number of tokens, got {self.block_size}")\n',
                )
            ],
        ),
        (
            "config: default KV block count comment",
            [
                (
                    CONFIG,
                    "        blocks = self.num_kv_blocks or self.num_gpu_blocks or -(-8192 // self.block_size)\n",
                    "        # default: room for 8192 tokens\n"
                    "        blocks = self.num_kv_blocks or self.num_gpu_blocks or -(-8192 // self.block_size)\n",
                )
            ],
        ),
        (
            "config: max_num_seqs comment",
            [
                (
                    CONFIG,
                    "    max_num_seqs: int = 64\n",
                    "    max_num_seqs: int = 64                   # sequences scheduled per step\n",
                )
            ],
        ),
        (
            "config: SUPPORTED_ARCHS comment",
            [
                (
                    CONFIG,
                    'SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "gemma2")\n',
                    '# model_type values from config.json this engine can build\nSUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "gemma2")\n',
                )
            ],
        ),
        (
            "config: torch_dtype docstring",
            [
                (
                    CONFIG,
                    "    def torch_dtype(self) -> torch.dtype:\n",
                    '    def torch_dtype(self) -> torch.dtype:\n        """The dtype weights and activations run in."""\n',
                )
            ],
        ),
    ],
    QUANT: [
        (
            "quantization: int4 group shapes",
            [
                (
                    QUANT,
                    "    lo, hi = torch.aminmax(groups, dim=-1)\n",
                    "    lo, hi = torch.aminmax(groups, dim=-1)                                 # [O, G] each\n",
                )
            ],
        ),
        (
            "quant_matmul: nibble order",
            [
                (
                    QMM,
                    "    # [O, I/2] uint8 -> [O, I] uint8 in 0..15, columns back in order\n",
                    "    # [O, I/2] uint8 -> [O, I] uint8 in 0..15, columns back in order (low nibble first)\n",
                )
            ],
        ),
        (
            "quantization: module docstring says the LM head stays float",
            [
                (
                    QUANT,
                    "norms and the LM head stay in the model dtype.\n",
                    "norms and the LM head stay in the model dtype (quantizing the head costs the most accuracy).\n",
                )
            ],
        ),
        (
            "quantization: MIN_SCALE comment",
            [
                (
                    QUANT,
                    "# scales are floored here so an all-zero row or group still dequantizes to zeros\n",
                    "# scales are floored here so an all-zero row or group still dequantizes to zeros (no 0/0)\n",
                )
            ],
        ),
        (
            "quantization: int4 shape error names the option",
            [
                (
                    QUANT,
                    'raise ValueError(f"int4: quant_group_size {group_size} must be even and divide {cols} input features")',
                    'raise ValueError(f"int4: quant_group_size {group_size} must be even and divide the {cols} input features")',
                )
            ],
        ),
        (
            "quantization: quantize_weight docstring",
            [
                (
                    QUANT,
                    "def quantize_weight(w: torch.Tensor, scheme: str, group_size: int, kernel) -> QuantizedWeight:\n",
                    "def quantize_weight(w: torch.Tensor, scheme: str, group_size: int, kernel) -> QuantizedWeight:\n"
                    '    """float [O, I] -> the packed weight of `scheme` and the kernel that multiplies by it."""\n',
                )
            ],
        ),
        (
            "quantization: why the float weight is deleted",
            [
                (
                    QUANT,
                    "            del module.weight      # the packed weight is the only copy left\n",
                    "            del module.weight      # the packed weight is the only copy left (halves memory)\n",
                )
            ],
        ),
        (
            "quantization: load order comment",
            [
                (
                    QUANT,
                    '    """Build and load in float32, quantize, then cast what is left to the model dtype."""\n',
                    '    """Build and load in float32, quantize, then cast what is left to the model dtype\n'
                    '    (scales are computed from the float32 checkpoint values, never from bf16 copies)."""\n',
                )
            ],
        ),
        (
            "quant_matmul: int8 path comment",
            [
                (
                    QMM,
                    "    if zero is None:\n        out = F.linear(xa, qweight.to(xa.dtype)) * scale.to(xa.dtype)\n",
                    "    if zero is None:   # int8: per-channel scale applied after the matmul\n"
                    "        out = F.linear(xa, qweight.to(xa.dtype)) * scale.to(xa.dtype)\n",
                )
            ],
        ),
        (
            "quant_matmul: dequantize_weight docstring",
            [
                (
                    QMM,
                    '    """-> float32 weight [O, I]."""\n',
                    '    """-> float32 weight [O, I]; int8 when zero is None, else int4 with zero points."""\n',
                )
            ],
        ),
    ],
    # held-out set 5 (tinyserve_atbase_heldout5): the rotary kernel and the quantized matmul on their own
    ROT_OP: [
        (
            "ops/rotary: say why cos/sin are cast first",
            [
                (
                    ROT_OP,
                    "use, as transformers does.\n",
                    "use, as transformers does (so half-precision runs round the way it does).\n",
                )
            ],
        ),
        (
            "ops/rotary: shapes in _rotate",
            [
                (
                    ROT_OP,
                    "    # x [T, N*D]; cos/sin [T, D/2] -> [T, N*D]\n",
                    "    # x [T, N*D] (N heads of D); cos/sin [T, D/2] -> [T, N*D]\n",
                )
            ],
        ),
        (
            "ops/rotary: name the layout where the halves are split",
            [
                (
                    ROT_OP,
                    "    half = head_dim // 2\n",
                    "    half = head_dim // 2              # neox layout: first half, second half\n",
                )
            ],
        ),
        (
            "ops/rotary: cos/sin broadcast over the heads",
            [
                (
                    ROT_OP,
                    "    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)\n",
                    "    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)       # [T, 1, D/2]: the same angle for every head\n",
                )
            ],
        ),
        (
            "ops/rotary: _rotate_half docstring",
            [
                (
                    ROT_OP,
                    "def _rotate_half(x: torch.Tensor) -> torch.Tensor:\n",
                    "def _rotate_half(x: torch.Tensor) -> torch.Tensor:\n"
                    '    """[..., D] -> [..., D]: (-second half, first half), as HF\'s rotate_half."""\n',
                )
            ],
        ),
        (
            "ops/rotary: the native twin works on [T, N, D] views",
            [
                (
                    ROT_OP,
                    "    q = query.view(query.shape[0], -1, head_dim)\n",
                    "    # [T, N, D] views of the packed rows; reshaped back at the end\n"
                    "    q = query.view(query.shape[0], -1, head_dim)\n",
                )
            ],
        ),
        (
            "ops/rotary: query and key rotated one after the other",
            [
                (
                    ROT_OP,
                    "    return _rotate(query, cos, sin, head_dim), _rotate(key, cos, sin, head_dim)\n",
                    "    q_rot = _rotate(query, cos, sin, head_dim)\n    return q_rot, _rotate(key, cos, sin, head_dim)\n",
                )
            ],
        ),
    ],
    QMM: [
        (
            "quant_matmul: the formats table names its source",
            [
                (
                    QMM,
                    "Weight formats (see tinyserve.quantization):\n",
                    "Weight formats (written by tinyserve.quantization at load time):\n",
                )
            ],
        ),
        (
            "quant_matmul: why _acc promotes",
            [
                (
                    QMM,
                    "def _acc(dtype: torch.dtype) -> torch.dtype:\n    return torch.promote_types(dtype, torch.float32)\n",
                    "def _acc(dtype: torch.dtype) -> torch.dtype:\n"
                    "    # fp32 sums for half-precision inputs; a float64 run stays float64\n"
                    "    return torch.promote_types(dtype, torch.float32)\n",
                )
            ],
        ),
        (
            "quant_matmul: unpack_int4 comment",
            [
                (
                    QMM,
                    "    # [O, I/2] uint8 -> [O, I] uint8 in 0..15, columns back in order\n",
                    "    # [O, I/2] uint8 -> [O, I] uint8 in 0..15, columns back in order (even column = low nibble)\n",
                )
            ],
        ),
        (
            "quant_matmul: dequantize_weight says which format it reads",
            [
                (
                    QMM,
                    '    """-> float32 weight [O, I]."""\n',
                    '    """-> float32 weight [O, I] (int8 when zero is None, int4 otherwise)."""\n',
                )
            ],
        ),
        (
            "quant_matmul: the int4 identity in one line",
            [
                (
                    QMM,
                    "    # sum_k x_k (q_k - z) s = s * (x . q - z * sum_k x_k), per group\n",
                    "    # sum_k x_k (q_k - z) s = s * (x . q - z * sum_k x_k), per group: one einsum, one shift\n",
                )
            ],
        ),
        (
            "quant_matmul: name the integer partial sums",
            [
                (
                    QMM,
                    '    partial = torch.einsum("tgk,ogk->tog", xg, qg)                            # [T, O, G]\n',
                    '    partial = torch.einsum("tgk,ogk->tog", xg, qg)                            # [T, O, G] x . q\n',
                )
            ],
        ),
        (
            "quant_matmul: dequant_matmul comment",
            [
                (
                    QMM,
                    "    # [T, I] -> [T, O]; accumulates in fp32 (or wider), casts back to x's dtype\n",
                    "    # [T, I] -> [T, O]; accumulates in fp32 (or wider), casts back to x's dtype once at the end\n",
                )
            ],
        ),
        (
            "quant_matmul: the native twin is the reference",
            [
                (
                    QMM,
                    "    # [T, I] -> [T, O]; the float weight in x's dtype, then an ordinary linear\n",
                    "    # [T, I] -> [T, O]; the float weight in x's dtype, then an ordinary linear (the reference)\n",
                )
            ],
        ),
        (
            "quant_matmul: module docstring on partial sums",
            [
                (
                    QMM,
                    "The optimized path never materialises the float weight: it multiplies by the raw\n",
                    "The optimized path never materialises the float weight (it would double the memory):\n"
                    "it multiplies by the raw\n",
                )
            ],
        ),
        (
            "quant_matmul: export list",
            [
                (
                    QMM,
                    "import torch.nn.functional as F\n",
                    "import torch.nn.functional as F\n\n"
                    '__all__ = ["unpack_int4", "dequantize_weight", "dequant_matmul", "dequant_matmul_native"]\n',
                )
            ],
        ),
    ],
}
