"""How a scenario request maps onto transformers' `generate` (pure helpers and option tables).

Every engine option the transformers adapter is given is either accepted (and tapped with
the same rows a single-pass prefill gives) or refused up front with a one-line reason:
an option that changes how `generate` calls the forward, or which scores it reports,
would otherwise give taps that do not line up with the reference, or a crash.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tools.errors import BadInput
from tools.scenario import Request

LOAD_ONLY = {"attn_implementation"}  # options that go to from_pretrained

# Options that go to generate() and are tapped correctly (rows follow each forward's positions).
ACCEPTED = {
    "prefill_chunk_size": "prefill in chunks of this many tokens (one forward per chunk)",
    "cache_implementation": "KV cache kind: "
    + ", ".join(("dynamic", "offloaded", "static", "offloaded_static", "sliding_window", "hybrid")),
    "max_cache_len": "length of a static cache",
    "use_cache": "false: every step re-runs the whole sequence",
    "prompt_lookup_num_tokens": "assisted decoding with n-gram drafts from the prompt (one request per batch)",
    "max_matching_ngram_size": "prompt lookup: longest n-gram matched",
    "assistant_model": '"self" or a checkpoint dir: assisted decoding with that draft model',
    "num_assistant_tokens": "assisted decoding: drafts per step",
    "num_assistant_tokens_schedule": "assisted decoding: constant | heuristic | heuristic_transient",
    "assistant_confidence_threshold": "assisted decoding: draft stopping threshold",
    "disable_compile": "true only: taps are read from the eager forward",
}
CACHE_IMPLEMENTATIONS = ("dynamic", "offloaded", "static", "offloaded_static", "sliding_window", "hybrid")
ASSISTED = ("prompt_lookup_num_tokens", "assistant_model")  # either one: batches of one request

_BEAMS = "beam search keeps several hypotheses per request; taps assume one sequence per request"
_SAMPLING = "set it per request under [[workload.requests]] sampling, where the reference sees it too"
_PROCESSOR = "a logits processor the reference sampler (tools/probe/sampling_ref.py) does not model"
_ADAPTER = "the adapter sets it itself"
REFUSED = {
    **dict.fromkeys(
        (
            "num_beams",
            "num_beam_groups",
            "diversity_penalty",
            "length_penalty",
            "early_stopping",
            "constraints",
            "force_words_ids",
        ),
        _BEAMS,
    ),
    "num_return_sequences": "several sequences per request; taps assume one",
    "penalty_alpha": "contrastive search re-runs the forward on candidate tokens",
    "low_memory": "contrastive search",
    "dola_layers": "DoLa contrasts early-exit layers: its scores are not the model's logits",
    "guidance_scale": "classifier-free guidance doubles the batch with unconditional rows",
    "assistant_early_exit": "self-speculation runs the model's own early layers as a draft, mixing their taps in",
    "use_mtp": "multi-token-prediction drafts are not modelled",
    "speculation_type": "not modelled",
    **dict.fromkeys(
        ("assistant_lookbehind", "target_lookbehind", "assistant_ensemble_weight"),
        "assisted decoding with a different tokenizer or mixed distributions is not modelled",
    ),
    **dict.fromkeys(
        ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens", "stop_strings"),
        _SAMPLING,
    ),
    **dict.fromkeys(
        (
            "typical_p",
            "epsilon_cutoff",
            "eta_cutoff",
            "top_h",
            "no_repeat_ngram_size",
            "encoder_no_repeat_ngram_size",
            "bad_words_ids",
            "suppress_tokens",
            "begin_suppress_tokens",
            "forced_bos_token_id",
            "forced_eos_token_id",
            "sequence_bias",
            "exponential_decay_length_penalty",
            "encoder_repetition_penalty",
            "renormalize_logits",
            "remove_invalid_values",
            "watermarking_config",
            "min_length",
            "min_new_tokens",
            "token_healing",
        ),
        _PROCESSOR,
    ),
    **dict.fromkeys(
        (
            "max_length",
            "eos_token_id",
            "pad_token_id",
            "bos_token_id",
            "decoder_start_token_id",
            "output_attentions",
            "output_hidden_states",
            "output_scores",
            "output_logits",
            "return_dict_in_generate",
            "is_assistant",
        ),
        _ADAPTER,
    ),
    "max_time": "stops at a wall-clock limit, so outputs are not reproducible",
    "compile_config": "taps are read by hooks on the eager forward; a compiled forward hides them",
    "cache_config": "quantized KV caches are lossy by design (no noise floor covers them)",
    "continuous_batching_config": "continuous batching packs requests into one row; not tapped",
    "logits_to_keep": _ADAPTER,
}


class UnsupportedOption(BadInput):
    """An engine option the adapter cannot tap correctly; the message is one line."""


def check_options(options: dict) -> None:
    """Raise UnsupportedOption for the first option that is not accepted (order of the scenario)."""
    for key, value in options.items():
        why = option_problem(key, value)
        if why:
            raise UnsupportedOption(f"transformers option {key} = {value!r} is not supported: {why}")


def option_problem(key: str, value) -> str | None:
    """One option -> why it is refused, or None when it is tapped correctly."""
    if key in REFUSED:
        return REFUSED[key]
    if key in LOAD_ONLY:
        return None if isinstance(value, str) else "expected a string"
    if key not in ACCEPTED:
        return f"unknown option; accepted: {', '.join(sorted(LOAD_ONLY | set(ACCEPTED)))}"
    if key == "cache_implementation" and value not in CACHE_IMPLEMENTATIONS:
        return f"cache kind not tapped (lossy or unknown); accepted: {', '.join(CACHE_IMPLEMENTATIONS)}"
    if key == "disable_compile" and value is not True:
        return ACCEPTED[key]
    if key in (
        "prefill_chunk_size",
        "max_cache_len",
        "prompt_lookup_num_tokens",
        "max_matching_ngram_size",
        "num_assistant_tokens",
    ) and not (isinstance(value, int) and value > 0):
        return "expected a positive integer"
    if key == "assistant_model" and value != "self" and not Path(str(value)).is_dir():
        return ACCEPTED[key] + " (no such directory)"
    return None


def device_problem(options: dict, device: str) -> str | None:
    """Options transformers itself can only run on a GPU -> a one-line refusal on other devices."""
    cache = options.get("cache_implementation", "")
    if cache.startswith("offloaded") and not device.startswith("cuda"):
        return (
            f"transformers option cache_implementation = {cache!r} needs a CUDA device "
            f"(it moves cache layers between CPU and GPU); this run is on {device!r}"
        )
    return None


def assisted(options: dict) -> bool:
    return any(k in options for k in ASSISTED)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Prompts -> (ids [B, W], attention mask [B, W], left pad per row)."""
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    ids = torch.tensor([[pad_id] * n + p for n, p in zip(pads, prompts)])
    mask = torch.tensor([[0] * n + [1] * len(p) for n, p in zip(pads, prompts)])
    return ids, mask, pads


def forward_columns(kwargs: dict, pads: list[int]) -> list[int]:
    """A forward's kwargs -> the padded-batch column of each of its input positions.

    Works for any way generate() calls the forward (whole prompt, prefill chunks, decode steps,
    draft verification, no cache): a row without left padding has position id == column, and
    transformers 4.x also passes the columns as `cache_position`.
    """
    pos = kwargs.get("position_ids")
    ids = kwargs.get("input_ids")
    seq = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
    if pos is not None and pos.dim() == 2:
        unpadded = pads.index(0) if pos.shape[0] == len(pads) else 0
        return pos[unpadded, -seq:].tolist()
    if kwargs.get("cache_position") is not None:
        return kwargs["cache_position"].tolist()
    raise RuntimeError("cannot tell which positions this forward computes (no position_ids or cache_position)")


def request_positions(columns: list[int], pads: list[int]) -> list[list[int]]:
    """Columns of one forward -> per batch row, the request's own position of each (-1 = padding)."""
    return [[c - pad if c >= pad else -1 for c in columns] for pad in pads]


# Request sampling keys generate_kwargs passes on (or the adapter applies itself: logprobs are always
# recorded). generate() has no presence / frequency penalty, and stop strings or ids are not passed:
# those keys are refused up front (Capabilities.sampling_keys) instead of silently dropped.
HONOURED_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "logprobs", "ignore_eos")


def generate_kwargs(req: Request, options: dict, model, assistant=None) -> dict:
    """Request sampling -> generate() kwargs, with HF's own defaults (top_k=50…) switched off."""
    from transformers import GenerationConfig

    s = req.sampling
    temperature = float(s.get("temperature", 0.0))
    if "seed" in s:
        torch.manual_seed(int(s["seed"]))
    # disable_compile: hooks read the eager forward (transformers compiles static caches on a GPU)
    extra = {
        "disable_compile": True,
        **{k: v for k, v in options.items() if k not in LOAD_ONLY and k != "assistant_model"},
    }
    cfg = GenerationConfig(
        max_new_tokens=req.max_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=max(0, int(s.get("top_k", 0))),  # -1, as OpenAI / vLLM clients write it, is off as 0 is
        top_p=float(s.get("top_p", 1.0)),  # 0, not None: None means 50
        min_p=s.get("min_p"),
        repetition_penalty=float(s.get("repetition_penalty", 1.0)),
        pad_token_id=model.config.pad_token_id or 0,
        # ignore_eos: generation simply does not stop at EOS (as in vLLM); EOS stays sampleable
        eos_token_id=None if s.get("ignore_eos") else model.config.eos_token_id,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
        **extra,
    )
    from tools.engines.hf_compat import generate_options  # what the release under test understands

    return generate_options(
        dict(generation_config=cfg, **({"assistant_model": assistant} if assistant is not None else {})), model
    )
