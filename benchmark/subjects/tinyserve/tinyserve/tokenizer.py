"""Checkpoint tokenizer (tokenizer.json through the `tokenizers` library)."""
from __future__ import annotations

from pathlib import Path


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        self._tok = HFTokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))

    @classmethod
    def maybe_load(cls, model_dir: str | Path) -> "Tokenizer | None":
        return cls(model_dir) if (Path(model_dir) / "tokenizer.json").exists() else None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=True)
