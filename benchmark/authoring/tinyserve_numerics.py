"""tinyserve cases: norms, config defaults and precision (numerics)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.tinyserve_history import (
    AMARA,
    CONFIG,
    DANIEL,
    HANNAH,
    KENJI,
    LENA,
    MARCO,
    OLGA,
    OPS_NORM,
    PRIYA,
    ROPE,
    SOFIA,
    SUBJECT,
    TOMAS,
    WEI,
    YUKI,
    d_bm_repr,
    d_engine_abort,
    d_gemma_doc,
    d_layernorm_repr,
    d_llama_embeddings,
    d_loader_msg,
    d_norm_doc,
    d_readme_prefix_stats,
    d_rope_mscale_doc,
    d_seq_repr,
    d_test_norm,
    d_test_rotary,
    d_tokenizer_vocab,
    history,
    prompt,
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
    case_gemma_fused_norm_offset(),
    case_config_eps_defaults(),
    case_rope_invfreq_bf16(),
]
