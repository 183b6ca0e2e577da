"""Benchmark cases for the transformers subject (issues 1301-1307).

    python -m benchmark.authoring.transformers_cases [CASE ...] [--cases-dir DIR]

Writes, per case, `benchmark/cases/<id>/{case.toml,issue.md,repro.toml,truth.toml}` and
regenerates `commits/NN-slug.patch` with `benchmark.author.write_patches`. Every edit is a
(file, old_text, new_text) replacement against the pinned transformers==5.24.0 snapshot, so
the script can be re-run whenever the subject's base is rebuilt.

Categories: positional-encoding, numerics, batching, attention, kv-cache, sampling, model-config.

Note for sampling scenarios: the transformers target fills an unset `top_k` with generate()'s
default of 50, so every sampled request here sets `top_k` explicitly.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.patches import Step

SUBJECT = "transformers"

PKG = "transformers"
MASKING = f"{PKG}/masking_utils.py"
CACHE = f"{PKG}/cache_utils.py"
ROPE = f"{PKG}/modeling_rope_utils.py"
LOGITS = f"{PKG}/generation/logits_process.py"
SDPA = f"{PKG}/integrations/sdpa_attention.py"
LLAMA = f"{PKG}/models/llama/modeling_llama.py"
MISTRAL = f"{PKG}/models/mistral/modeling_mistral.py"
QWEN2 = f"{PKG}/models/qwen2/modeling_qwen2.py"
GEMMA2 = f"{PKG}/models/gemma2/modeling_gemma2.py"

# ----------------------------------------------------------------------------- people

NADIA = "Nadia Haddad <nadia.haddad@posteo.net>"
FELIX = "Felix Brandt <felix.brandt@mailbox.org>"
ROHAN = "Rohan Mehta <rohan.mehta.ml@gmail.com>"
CHLOE = "Chloé Martin <chloe.martin@protonmail.com>"
IGOR = "Igor Kuznetsov <ikuznetsov@fastmail.com>"
AISHA = "Aisha Bello <aisha.bello@outlook.com>"
JONAS = "Jonas Berg <jonas.berg@hey.com>"
MEI = "Mei Lin <mei.lin.dev@gmail.com>"
PABLO = "Pablo Ortega <portega@inferlab.io>"
SARAH = "Sarah O'Neill <sarah.oneill@inferlab.io>"
TARO = "Taro Yamamoto <t.yamamoto@inferlab.io>"
ELIF = "Elif Demir <elif.demir@gmx.net>"


def dates(start: str, n: int, seed: int) -> list[str]:
    """n increasing ISO dates after `start` (YYYY-MM-DD), 1-8 days apart, working hours."""
    rng = random.Random(seed)
    day = datetime.fromisoformat(start).replace(tzinfo=UTC)
    out = []
    for _ in range(n):
        day += timedelta(days=rng.randint(1, 8))
        stamp = day.replace(hour=rng.randint(8, 19), minute=rng.randint(0, 59), second=rng.randint(0, 59))
        out.append(stamp.isoformat())
    return out


def history(start: str, seed: int, entries: list[tuple[str, str, list]]) -> list[Step]:
    """[(author, message, edits)] -> Steps with increasing dates."""
    return [
        Step(message=msg, author=author, date=d, edits=edits)
        for d, (author, msg, edits) in zip(dates(start, len(entries), seed), entries)
    ]


# The reference is the independent refmodel (tools/refmodels), which imports nothing from
# transformers: a bug in transformers itself, at base too, shows against it.
REFERENCE = {"engine": "refmodel"}


def refmodel_repro(model: dict, target: dict, requests: list[dict], **kwargs) -> str:
    return repro_toml(model, target, requests, reference=REFERENCE, **kwargs)


def prompt(seed: int, n: int, first: int = 1) -> list[int]:
    """A reproducible prompt: `first` (bos) then n-1 ids from the tiny vocab, avoiding pad/bos/eos."""
    rng = random.Random(seed)
    return [first] + [rng.randrange(3, 512) for _ in range(n - 1)]


# ============================================================================= distractors
# Behaviour-preserving changes (docs, comments, messages, tests). Each returns replacements;
# a case uses any one of them at most once.


def d_mask_causal_doc():
    return [
        (
            MASKING,
            "    This creates a basic lower-diagonal causal mask.\n",
            "    This creates a basic lower-diagonal causal mask: a query at position `q_idx` sees every key at or\n"
            "    before its own position.\n",
        )
    ]


def d_mask_fast_all_doc():
    return [
        (
            MASKING,
            '    """Similar to `tensor.all()`, but uses an implementation with `tensor.sum()`, which is actually much faster."""\n',
            '    """\n'
            "    Similar to `tensor.all()`, but uses an implementation with `tensor.sum()`, which is actually much faster.\n"
            "    Only meant for boolean tensors: the sum counts the `True` entries.\n"
            '    """\n',
        )
    ]


def d_mask_padding_doc():
    return [
        (
            MASKING,
            "    This return the mask_function function corresponding to a 2D padding mask.\n",
            "    Returns the mask_function corresponding to a 2D padding mask (`True` for real tokens, `False` for padding).\n",
        )
    ]


def d_mask_sliding_doc():
    return [
        (
            MASKING,
            "    This return the mask_function function to create a sliding window mask.\n",
            "    Returns the mask_function for a causal sliding window mask (the intersection of the sliding window\n"
            "    overlay and the causal mask).\n",
        )
    ]


def d_cache_dynamic_maxlen_doc():
    return [
        (
            CACHE,
            '        """Returns the maximum sequence length of the cache object. DynamicLayer does not have a maximum length."""\n',
            '        """\n'
            "        Returns the maximum sequence length of the cache object. DynamicLayer does not have a maximum length,\n"
            "        so this is always -1.\n"
            '        """\n',
        )
    ]


def d_cache_static_sliding_comment():
    return [
        (
            CACHE,
            "        # We only cache the last `sliding_window` tokens\n",
            "        # We only cache the last `sliding_window` tokens (the full states are still returned below, so the\n"
            "        # current forward sees every token it needs)\n",
        )
    ]


def d_cache_sliding_class_doc():
    return [
        (
            CACHE,
            "    A cache layer that grows dynamically as more tokens are generated, up until the sliding window size.\n",
            "    A cache layer that grows dynamically as more tokens are generated, up until the sliding window size.\n"
            "    Only the last `sliding_window - 1` states are kept between forwards: together with the new token(s) they\n"
            "    make up a full window.\n",
        )
    ]


def d_rope_linear_doc():
    return [
        (
            ROPE,
            "    Computes the inverse frequencies with linear scaling. Credits to the Reddit user /u/kaiokendev\n",
            "    Computes the inverse frequencies with linear scaling (a.k.a. position interpolation). Credits to the Reddit\n"
            "    user /u/kaiokendev\n\n",
        )
    ]


def d_rope_llama3_comment():
    return [
        (
            ROPE,
            "    # otherwise: interpolate between the two, using a smooth factor\n",
            "    # otherwise: interpolate between the two, using a smooth factor (0 at low_freq_wavelen, 1 at\n"
            "    # high_freq_wavelen)\n",
        )
    ]


def d_llama_rotate_doc():
    return [
        (
            LLAMA,
            'def rotate_half(x):\n    """Rotates half the hidden dims of the input."""\n',
            'def rotate_half(x):\n    """Rotates half the hidden dims of the input: `(x1, x2) -> (-x2, x1)`."""\n',
        )
    ]


def d_llama_mlp_comment():
    return [
        (
            LLAMA,
            "    def forward(self, x):\n        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))\n",
            "    def forward(self, x):\n        # SwiGLU-style gated MLP: act(gate(x)) * up(x), projected back to hidden_size\n"
            "        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))\n",
        )
    ]


def d_mistral_norm_doc():
    return [
        (
            MISTRAL,
            "        MistralRMSNorm is equivalent to T5LayerNorm\n",
            "        MistralRMSNorm is equivalent to T5LayerNorm (no mean subtraction, no bias); the variance is\n"
            "        computed in float32.\n",
        )
    ]


def d_mistral_sliding_comment():
    return [
        (
            MISTRAL,
            '            sliding_window=getattr(self.config, "sliding_window", None),  # main diff with Llama\n',
            "            # main diff with Llama: backends that build their own mask (flash, flex) need the window size\n"
            '            sliding_window=getattr(self.config, "sliding_window", None),\n',
        )
    ]


def d_qwen2_norm_doc():
    return [
        (
            QWEN2,
            "        Qwen2RMSNorm is equivalent to T5LayerNorm\n",
            "        Qwen2RMSNorm is equivalent to T5LayerNorm: it rescales by the root mean square of the last dimension,\n"
            "        without centering and without bias.\n",
        )
    ]


def d_qwen2_repeat_kv_doc():
    return [
        (
            QWEN2,
            'def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:\n    """\n',
            'def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:\n    """\n'
            "    Expands grouped key/value heads so that every query head has its own copy (GQA -> MHA layout).\n\n",
        )
    ]


def d_gemma2_embed_doc():
    return [
        (
            GEMMA2,
            "    This module overrides nn.Embeddings' forward by multiplying with embeddings scale.\n",
            "    This module overrides nn.Embedding's forward by multiplying the looked-up embeddings with `embed_scale`\n"
            "    (sqrt(hidden_size) for Gemma 2, cast to the weights' dtype as in the original implementation).\n",
        )
    ]


def d_gemma2_softcap_comment():
    return [
        (
            GEMMA2,
            "    if softcap is not None:\n        attn_weights = attn_weights / softcap\n",
            "    # Gemma 2 bounds the attention logits to (-softcap, softcap) before masking\n"
            "    if softcap is not None:\n        attn_weights = attn_weights / softcap\n",
        )
    ]


def d_logits_topk_comment():
    return [
        (
            LOGITS,
            "        top_k = min(self.top_k, scores.size(-1))  # Safety check\n        # Remove all tokens",
            "        top_k = min(self.top_k, scores.size(-1))  # never ask topk for more entries than the vocab has\n"
            "        # Remove all tokens",
        )
    ]


def d_logits_temperature_msg():
    return [
        (
            LOGITS,
            '                except_msg += " If you\'re looking for greedy decoding strategies, set `do_sample=False`."\n',
            "                except_msg += (\n"
            '                    " If you\'re looking for greedy decoding strategies, set `do_sample=False` (temperature is"\n'
            '                    " then ignored)."\n'
            "                )\n",
        )
    ]


def d_logits_minp_msg():
    return [
        (
            LOGITS,
            '            raise ValueError(f"`min_p` has to be a float in the [0, 1] interval, but is {min_p}")\n',
            "            raise ValueError(\n"
            '                f"`min_p` has to be a float in the [0, 1] interval, but is {min_p}. Typical values are 0.01-0.2."\n'
            "            )\n",
        )
    ]


def d_sdpa_comment():
    return [
        (
            SDPA,
            "    # XPU and MPS support masked GQA under more recent torch versions\n",
            "    # XPU and MPS support masked GQA under more recent torch versions (a mask no longer forces the\n"
            "    # repeat_kv fallback there)\n",
        )
    ]


def d_test(path: str, body: str):
    return [(path, None, body.lstrip("\n"))]


TEST_LINEAR_ROPE = """
import torch

from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def test_linear_scaling_divides_default_frequencies():
    base = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16)
    scaled = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                         rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    dim = 16
    default = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["linear"](scaled)
    assert attention_factor == 1.0
    torch.testing.assert_close(inv_freq, default / 4.0)
    assert base.rope_parameters["rope_type"] == "default"
"""

TEST_QWEN2_ROTARY = """
import torch

from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding


def test_rotary_tables_follow_activation_dtype():
    config = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    rope = Qwen2RotaryEmbedding(config)
    x = torch.zeros(1, 8, 64, dtype=torch.bfloat16)
    cos, sin = rope(x, torch.arange(8)[None])
    assert cos.dtype == sin.dtype == torch.bfloat16
    assert cos.shape == (1, 8, 16)
"""

TEST_PADDING_MASK = """
import torch

from transformers.masking_utils import causal_mask_function, sdpa_mask


def test_sdpa_mask_without_padding_can_be_skipped():
    mask = sdpa_mask(batch_size=2, q_length=5, kv_length=5, mask_function=causal_mask_function,
                     attention_mask=torch.ones(2, 5, dtype=torch.bool))
    assert mask is None


def test_sdpa_mask_keeps_causal_pattern_when_not_skipped():
    mask = sdpa_mask(batch_size=1, q_length=4, kv_length=4, allow_is_causal_skip=False)
    assert torch.equal(mask[0, 0], torch.tril(torch.ones(4, 4, dtype=torch.bool)))
"""

TEST_SLIDING_SHAPES = """
import torch

from transformers.cache_utils import DynamicSlidingWindowLayer


def test_sliding_layer_keeps_window_minus_one_states():
    layer = DynamicSlidingWindowLayer(sliding_window=8)
    k = torch.randn(1, 2, 12, 4)
    keys, _ = layer.update(k, k.clone())
    assert keys.shape[-2] == 12          # the forward that fills the cache sees everything
    assert layer.keys.shape[-2] == 7     # only sliding_window - 1 states survive
    assert layer.get_seq_length() == 12
"""

TEST_MISTRAL_CONFIG = """
from transformers import MistralConfig


def test_mistral_config_keeps_sliding_window():
    config = MistralConfig(sliding_window=4096)
    assert config.sliding_window == 4096
    assert MistralConfig(sliding_window=None).sliding_window is None
"""

TEST_TOPK = """
import torch

from transformers.generation.logits_process import TopKLogitsWarper


def test_top_k_larger_than_vocab_keeps_everything():
    scores = torch.randn(2, 7)
    out = TopKLogitsWarper(top_k=50)(None, scores)
    assert torch.equal(out, scores)


def test_top_k_filters_per_row():
    scores = torch.tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    out = TopKLogitsWarper(top_k=1)(None, scores)
    assert torch.isinf(out).sum() == 4
    assert out[0, 2] == 2.0 and out[1, 0] == 2.0
"""

TEST_GEMMA2_CONFIG = """
from transformers import Gemma2Config


def test_gemma2_layer_types_alternate():
    config = Gemma2Config(num_hidden_layers=4)
    assert config.layer_types == ["sliding_attention", "full_attention"] * 2


def test_gemma2_softcaps_are_read_from_config():
    config = Gemma2Config(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
"""


# ============================================================================= the cases


def case_yarn_original_ctx() -> CaseSpec:
    bug = [
        (
            ROPE,
            '    truncate = config.rope_parameters.get("truncate", True)\n'
            "    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)\n",
            '    truncate = config.rope_parameters.get("truncate", True)\n'
            "    # The correction range is measured against the context the model is actually run with\n"
            "    context_len = config.max_position_embeddings\n"
            "    low, high = find_correction_range(beta_fast, beta_slow, dim, base, context_len, truncate)\n",
        )
    ]
    steps = history(
        "2025-07-02",
        1301,
        [
            (NADIA, "masking_utils: clarify causal_mask_function docstring", d_mask_causal_doc()),
            (FELIX, "rope: mention position interpolation in the linear scaling docstring", d_rope_linear_doc()),
            (
                ROHAN,
                "rope(yarn): bound the correction range by the serving context length\n\n"
                "The ramp between interpolated and extrapolated dims should cover the positions the\n"
                "model will actually see; read the context length once and name it.",
                bug,
            ),
            (CHLOE, "llama: document rotate_half", d_llama_rotate_doc()),
            (
                IGOR,
                "tests: linear rope scaling parameters",
                d_test("tests/rope/test_linear_scaling.py", TEST_LINEAR_ROPE),
            ),
            (AISHA, "generation: comment the top-k safety clamp", d_logits_topk_comment()),
            (FELIX, "rope: comment the llama3 smoothing band", d_rope_llama3_comment()),
        ],
    )
    a, b = prompt(1301, 40), prompt(13011, 36)
    return CaseSpec(
        subject=SUBJECT,
        id="tf-yarn-original-ctx",
        issue_number=1301,
        category="positional-encoding",
        modeled_on=["NVIDIA/Megatron-LM#1418", "unslothai/unsloth#6197", "ggml-org/llama.cpp#24823"],
        title="YaRN-extended Llama checkpoint no longer reproduces its reference outputs",
        issue=issue_text("tf-yarn-original-ctx"),
        repro=refmodel_repro(
            {
                "arch": "llama",
                "seed": 6,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
            },
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [
                {"prompt_ids": a, "max_tokens": 12, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {"prompt_ids": b, "max_tokens": 12, "sampling": {"temperature": 0.0, "ignore_eos": True}},
            ],
            good_ref="v5.24.0",
        ),
        truth_file=ROPE,
        truth_function="_compute_yarn_parameters",
        component="rope_utils",
        mechanism="YaRN correction range computed from max_position_embeddings instead of "
        "original_max_position_embeddings, so the interpolation/extrapolation ramp covers the wrong dims",
        steps=steps,
        bug_index=3,
    )


def case_qwen2_rope_bf16() -> CaseSpec:
    bug = [
        (
            QWEN2,
            "        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)\n"
            "        emb = torch.cat((freqs, freqs), dim=-1)\n"
            "        cos = emb.cos() * self.attention_scaling\n"
            "        sin = emb.sin() * self.attention_scaling\n\n"
            "        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)\n",
            "        # Build the tables directly in the activation dtype: saves a float32 [batch, seq, head_dim]\n"
            "        # pair and two casts per forward\n"
            "        inv_freq = self.inv_freq.to(device=x.device, dtype=x.dtype)\n"
            "        freqs = position_ids[..., None].to(inv_freq.dtype) * inv_freq\n"
            "        emb = torch.cat((freqs, freqs), dim=-1)\n"
            "        cos = emb.cos() * self.attention_scaling\n"
            "        sin = emb.sin() * self.attention_scaling\n\n"
            "        return cos, sin\n",
        )
    ]
    steps = history(
        "2025-08-04",
        1302,
        [
            (MEI, "qwen2: expand the RMSNorm docstring", d_qwen2_norm_doc()),
            (PABLO, "cache_utils: document DynamicLayer.get_max_length", d_cache_dynamic_maxlen_doc()),
            (SARAH, "sdpa: note why masks are fine for GQA on XPU/MPS", d_sdpa_comment()),
            (
                MEI,
                "perf(qwen2): compute rotary cos/sin in the activation dtype\n\n"
                "Avoids materialising float32 tables and casting them back on every forward; for\n"
                "float32 models nothing changes.",
                bug,
            ),
            (
                TARO,
                "tests: qwen2 rotary tables dtype and shape",
                d_test("tests/models/qwen2/test_rotary_tables.py", TEST_QWEN2_ROTARY),
            ),
            (PABLO, "qwen2: document repeat_kv", d_qwen2_repeat_kv_doc()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-qwen2-rope-bf16",
        issue_number=1302,
        category="numerics",
        modeled_on=["huggingface/transformers#29285", "huggingface/transformers#25681"],
        title="Qwen2 in bfloat16 drifts from the bf16 reference on long prompts; float32 is exact",
        issue=issue_text("tf-qwen2-rope-bf16"),
        repro=refmodel_repro(
            {"arch": "qwen2", "seed": 5, "initializer_range": 0.2},
            {"engine": "transformers", "dtype": "bfloat16", "options": {"attn_implementation": "eager"}},
            [{"prompt_ids": prompt(1302, 100), "max_tokens": 16, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
            good_ref="HEAD~3",
        ),
        truth_file=QWEN2,
        truth_function="Qwen2RotaryEmbedding.forward",
        component="rotary_embedding",
        mechanism="rotary angles (position * inv_freq) and their cos/sin computed in the activation dtype, so in "
        "bfloat16 the angles are rounded and RoPE is wrong at larger positions; float32 is unaffected",
        steps=steps,
        bug_index=4,
    )


def case_sdpa_left_pad_skip() -> CaseSpec:
    bug = [
        (
            MASKING,
            "    if q_offset == 0 and (\n"
            "        padding_mask is None or (fast_all(padding_mask[:, :q_length]) and fast_all(~padding_mask[:, q_length:]))\n"
            "    ):\n",
            "    # (the last prompt column is real for every row exactly when there is no trailing padding)\n"
            "    if q_offset == 0 and (padding_mask is None or fast_all(padding_mask[:, q_length - 1])):\n",
        )
    ]
    steps = history(
        "2025-09-01",
        1303,
        [
            (JONAS, "masking_utils: document fast_all", d_mask_fast_all_doc()),
            (
                ELIF,
                "perf(masking): cheaper prefill check before falling back to is_causal\n\n"
                "`_ignore_causal_mask_sdpa` reduced the padding mask twice on every prefill just to\n"
                "detect static-cache padding after the prompt. A single column is enough to see whether\n"
                "the prompt is followed by padding, which saves two full reductions on long prompts.",
                bug,
            ),
            (CHLOE, "llama: comment the gated MLP", d_llama_mlp_comment()),
            (ROHAN, "generation: clearer min_p range error", d_logits_minp_msg()),
            (JONAS, "masking_utils: fix padding_mask_function docstring", d_mask_padding_doc()),
            (
                AISHA,
                "tests: sdpa mask skip conditions",
                d_test("tests/masking/test_sdpa_mask_skip.py", TEST_PADDING_MASK),
            ),
            (PABLO, "cache_utils: comment the static sliding window copy", d_cache_static_sliding_comment()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-sdpa-left-pad-skip",
        issue_number=1303,
        category="batching",
        modeled_on=["huggingface/transformers#29029", "unslothai/unsloth#4100", "Blaizzy/mlx-vlm#1946"],
        title="Batched generate with sdpa: shorter prompts in the batch produce different text",
        issue=issue_text("tf-sdpa-left-pad-skip"),
        repro=refmodel_repro(
            {"arch": "llama", "seed": 1},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "sdpa"}},
            [
                {
                    "prompt_ids": prompt(1303, 18),
                    "max_tokens": 12,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
                {
                    "prompt_ids": prompt(13031, 7),
                    "max_tokens": 12,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
            ],
            good_ref="HEAD~6",
        ),
        truth_file=MASKING,
        truth_function="_ignore_causal_mask_sdpa",
        component="masking_utils",
        mechanism="prefill skip check only looks at the last prompt column, so left-padded batches drop the mask and "
        "SDPA runs with is_causal=True: padded rows attend to their pad tokens",
        steps=steps,
        bug_index=2,
    )


def case_swa_mask_edge() -> CaseSpec:
    bug = [
        (
            MASKING,
            "    def inner_mask(batch_idx: int, head_idx: int, q_idx: int, kv_idx: int) -> bool:\n"
            "        return kv_idx > q_idx - sliding_window\n",
            "    def inner_mask(batch_idx: int, head_idx: int, q_idx: int, kv_idx: int) -> bool:\n"
            "        # keys within `sliding_window` positions of the query\n"
            "        return kv_idx >= q_idx - sliding_window\n",
        )
    ]
    steps = history(
        "2025-10-06",
        1304,
        [
            (
                TARO,
                "masking_utils: sliding window overlay as a distance check\n\n"
                "First version of the overlay used by the sliding-window causal mask: a key is\n"
                "visible when it lies within `sliding_window` positions of the query.",
                bug,
            ),
            (SARAH, "mistral: expand the RMSNorm docstring", d_mistral_norm_doc()),
            (NADIA, "masking_utils: docstring for sliding_window_causal_mask_function", d_mask_sliding_doc()),
            (IGOR, "cache_utils: describe what DynamicSlidingWindowLayer keeps", d_cache_sliding_class_doc()),
            (
                MEI,
                "tests: mistral config keeps sliding_window",
                d_test("tests/models/mistral/test_config_window.py", TEST_MISTRAL_CONFIG),
            ),
            (FELIX, "generation: temperature error mentions greedy", d_logits_temperature_msg()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-swa-mask-edge",
        issue_number=1304,
        category="attention",
        modeled_on=["huggingface/transformers#29623", "vllm-project/vllm#3385", "ml-explore/mlx-lm#390"],
        title="Mistral-style model: prompt logits differ from reference once the prompt is longer than the window",
        issue=issue_text("tf-swa-mask-edge"),
        repro=refmodel_repro(
            {"arch": "mistral", "seed": 3},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [
                {"prompt_ids": prompt(1304, 42), "max_tokens": 8, "sampling": {"temperature": 0.0, "ignore_eos": True}},
                {
                    "prompt_ids": prompt(13041, 20),
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
            ],
        ),
        truth_file=MASKING,
        truth_function="sliding_window_overlay.inner_mask",
        component="masking_utils",
        mechanism="sliding-window overlay uses >= instead of >, so each query sees sliding_window + 1 keys once the "
        "prompt is longer than the window",
        steps=steps,
        bug_index=1,
    )


def case_swa_cache_offset() -> CaseSpec:
    bug = [
        (
            CACHE,
            "        is_full = self.cumulative_length >= self.sliding_window\n\n"
            "        kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)\n",
            "        is_full = self.cumulative_length >= self.sliding_window\n\n"
            "        # the first key still in the window\n"
            "        kv_offset = max(self.cumulative_length - self.sliding_window, 0)\n",
        )
    ]
    steps = history(
        "2025-11-03",
        1305,
        [
            (IGOR, "cache_utils: comment the static sliding window copy", d_cache_static_sliding_comment()),
            (SARAH, "mistral: explain why attention still receives sliding_window", d_mistral_sliding_comment()),
            (
                PABLO,
                "cache: simplify DynamicSlidingWindowLayer mask offsets\n\n"
                "Spell out what kv_offset is (the position of the oldest key in the window) so the\n"
                "mask and the cached states line up the same way as in the static layer.",
                bug,
            ),
            (IGOR, "cache_utils: document DynamicLayer.get_max_length", d_cache_dynamic_maxlen_doc()),
            (
                AISHA,
                "tests: dynamic sliding layer keeps window-1 states",
                d_test("tests/cache/test_dynamic_sliding_layer.py", TEST_SLIDING_SHAPES),
            ),
            (NADIA, "masking_utils: document fast_all", d_mask_fast_all_doc()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-swa-cache-offset",
        issue_number=1305,
        category="kv-cache",
        modeled_on=[
            "huggingface/transformers#37574",
            "huggingface/transformers#38046",
            "huggingface/transformers#47708",
        ],
        title="Mistral: generation degrades once prompt + generated tokens pass the sliding window",
        issue=issue_text("tf-swa-cache-offset"),
        repro=refmodel_repro(
            {"arch": "mistral", "seed": 0},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [
                {
                    "prompt_ids": prompt(1305, 26),
                    "max_tokens": 16,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
                {
                    "prompt_ids": prompt(13051, 22),
                    "max_tokens": 16,
                    "sampling": {"temperature": 0.0, "ignore_eos": True},
                },
            ],
            good_ref="HEAD~4",
        ),
        truth_file=CACHE,
        truth_function="DynamicSlidingWindowLayer.get_mask_sizes",
        component="cache_utils",
        mechanism="kv_offset of a full dynamic sliding-window layer is one position too small, so during decode past "
        "the window the oldest cached key is labelled out of the window and masked",
        steps=steps,
        bug_index=3,
    )


def case_min_p_batch_max() -> CaseSpec:
    bug = [
        (
            LOGITS,
            "        # Get the probability of the top token for each sequence in the batch\n"
            "        top_probs = probs.amax(dim=-1, keepdim=True)\n"
            "        # Calculate the actual min_p threshold by scaling min_p with the top token's probability\n"
            "        scaled_min_p = self.min_p * top_probs\n",
            "        # Calculate the actual min_p threshold by scaling min_p with the top token's probability\n"
            "        scaled_min_p = self.min_p * probs.amax()\n",
        )
    ]
    sampling = {"temperature": 0.4, "min_p": 0.7, "top_k": 40, "seed": 1234, "ignore_eos": True}
    steps = history(
        "2025-12-01",
        1306,
        [
            (ROHAN, "generation: comment the top-k safety clamp", d_logits_topk_comment()),
            (CHLOE, "llama: document rotate_half", d_llama_rotate_doc()),
            (JONAS, "masking_utils: clarify causal_mask_function docstring", d_mask_causal_doc()),
            (ELIF, "tests: top-k warper edge cases", d_test("tests/generation/test_top_k_warper.py", TEST_TOPK)),
            (
                ROHAN,
                "generation: simplify the min-p threshold\n\n"
                "Fold the top-probability tensor into the threshold expression; one temporary less\n"
                "per decoding step.",
                bug,
            ),
            (AISHA, "generation: clearer min_p range error", d_logits_minp_msg()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-min-p-batch-max",
        issue_number=1306,
        category="sampling",
        modeled_on=[
            "huggingface/text-generation-inference#1765",
            "sgl-project/sglang#3139",
            "huggingface/transformers#39457",
        ],
        title="min_p sampling behaves differently when requests are batched",
        issue=issue_text("tf-min-p-batch-max"),
        repro=refmodel_repro(
            {"arch": "llama", "seed": 8},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [
                {"prompt_ids": prompt(1306, 14), "max_tokens": 12, "sampling": sampling},
                {"prompt_ids": prompt(13061, 14), "max_tokens": 12, "sampling": sampling},
            ],
            good_ref="HEAD~2",
        ),
        truth_file=LOGITS,
        truth_function="MinPLogitsWarper.__call__",
        component="logits_process",
        mechanism="min-p threshold scaled by the maximum probability over the whole batch instead of per row, so in a "
        "batch a request's cutoff depends on the other requests",
        steps=steps,
        bug_index=5,
    )


def case_gemma2_query_scalar() -> CaseSpec:
    bug = [
        (
            GEMMA2,
            "        self.scaling = config.query_pre_attn_scalar**-0.5\n",
            "        self.scaling = self.head_dim**-0.5\n",
        )
    ]
    steps = history(
        "2026-01-12",
        1307,
        [
            (
                SARAH,
                "gemma2: attention scaling from head_dim\n\n"
                "Use the same 1/sqrt(head_dim) attention scale as the other decoder models.",
                bug,
            ),
            (TARO, "gemma2: fix embedding docstring", d_gemma2_embed_doc()),
            (NADIA, "masking_utils: fix padding_mask_function docstring", d_mask_padding_doc()),
            (FELIX, "rope: comment the llama3 smoothing band", d_rope_llama3_comment()),
            (
                MEI,
                "tests: gemma2 config layer types and softcaps",
                d_test("tests/models/gemma2/test_config.py", TEST_GEMMA2_CONFIG),
            ),
            (SARAH, "gemma2: comment the attention softcap", d_gemma2_softcap_comment()),
        ],
    )
    return CaseSpec(
        subject=SUBJECT,
        id="tf-gemma2-query-scalar",
        issue_number=1307,
        category="model-config",
        modeled_on=["ggml-org/llama.cpp#8197", "ggml-org/llama.cpp#8240", "vllm-project/vllm#5908"],
        title="Gemma 2 with query_pre_attn_scalar != head_dim: logits off from the first token",
        issue=issue_text("tf-gemma2-query-scalar"),
        repro=refmodel_repro(
            {"arch": "gemma2", "seed": 4, "query_pre_attn_scalar": 32},
            {"engine": "transformers", "dtype": "float32", "options": {"attn_implementation": "eager"}},
            [{"prompt_ids": prompt(1307, 18), "max_tokens": 10, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
        ),
        truth_file=GEMMA2,
        truth_function="Gemma2Attention.__init__",
        component="gemma2_attention",
        mechanism="attention scale taken as head_dim ** -0.5 instead of query_pre_attn_scalar ** -0.5; identical "
        "only when query_pre_attn_scalar == head_dim",
        steps=steps,
        bug_index=1,
    )


CASES = [
    case_yarn_original_ctx(),
    case_qwen2_rope_bf16(),
    case_sdpa_left_pad_skip(),
    case_swa_mask_edge(),
    case_swa_cache_offset(),
    case_min_p_batch_max(),
    case_gemma2_query_scalar(),
]
