"""What the transformers cases' histories are made of: file paths in the pinned snapshot,
contributors, commit dates, prompts, distractor edits and the test files some commits add.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from benchmark.authoring.common import repro_toml
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

# contributors (the authors of the commits)
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


REFERENCE = {"engine": "refmodel"}


def refmodel_repro(model: dict, target: dict, requests: list[dict], **kwargs) -> str:
    return repro_toml(model, target, requests, reference=REFERENCE, **kwargs)


def prompt(seed: int, n: int, first: int = 1) -> list[int]:
    """A reproducible prompt: `first` (bos) then n-1 ids from the tiny vocab, avoiding pad/bos/eos."""
    rng = random.Random(seed)
    return [first] + [rng.randrange(3, 512) for _ in range(n - 1)]


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
