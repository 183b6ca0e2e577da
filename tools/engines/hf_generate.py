"""How a scenario request maps onto transformers' `generate` (pure helpers)."""
from __future__ import annotations

import torch

from tools.scenario import Request

LOAD_ONLY = {"attn_implementation"}


def left_pad(prompts: list[list[int]], pad_id: int):
    """Prompts -> (ids [B, W], attention mask [B, W], left pad per row)."""
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    ids = torch.tensor([[pad_id] * n + p for n, p in zip(pads, prompts)])
    mask = torch.tensor([[0] * n + [1] * len(p) for n, p in zip(pads, prompts)])
    return ids, mask, pads


def generate_kwargs(req: Request, options: dict, model) -> dict:
    """Request sampling -> generate() kwargs, with HF's own defaults (top_k=50…) switched off."""
    from transformers import GenerationConfig

    s = req.sampling
    temperature = float(s.get("temperature", 0.0))
    if "seed" in s:
        torch.manual_seed(int(s["seed"]))
    cfg = GenerationConfig(
        max_new_tokens=req.max_tokens, do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=int(s.get("top_k", 0)), top_p=float(s.get("top_p", 1.0)),   # 0, not None: None means 50
        min_p=s.get("min_p"), repetition_penalty=float(s.get("repetition_penalty", 1.0)),
        pad_token_id=model.config.pad_token_id or 0,
        # ignore_eos: generation simply does not stop at EOS (as in vLLM); EOS stays sampleable
        eos_token_id=None if s.get("ignore_eos") else model.config.eos_token_id,
    )
    extra = {k: v for k, v in options.items() if k not in LOAD_ONLY}
    from tools.engines.hf_compat import generate_options

    return generate_options(dict(generation_config=cfg, output_logits=True, output_scores=True,
                                 return_dict_in_generate=True, **extra), model)
