"""Baselines' source-only ranking (pure parts)."""

from pathlib import Path

from benchmark.baselines import rank_by_text, words
from tools.source.index import open_index


def test_words_split_identifiers_and_drop_noise():
    assert words("BlockManager.allocate_slots is the prefix_cache") == [
        "block",
        "manager",
        "allocate",
        "slots",
        "prefix",
        "cache",
    ]


def test_rank_by_text_prefers_functions_named_like_the_issue(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "sampler.py").write_text(
        "def apply_repetition_penalty(x):\n    return x\n\n\ndef unrelated_helper(y):\n    return y\n"
    )
    (tmp_path / "pkg" / "cache.py").write_text("def evict_block(b):\n    return b\n")
    index = open_index(tmp_path, include_tests=False)
    ranked = rank_by_text(index, "Output repeats itself when I set a repetition penalty in the sampler")
    assert ranked[0][1].qualname == "apply_repetition_penalty"
    assert all(sym.qualname != "evict_block" for _, sym in ranked)  # shares no word with the issue
