"""Hypothesis ranking and the function-level counterfactual."""

from pathlib import Path

from tools.hypotheses.evidence import DrillDown, Hypothesis
from tools.hypotheses.gather import trigger_words
from tools.hypotheses.rank import rank
from tools.hypotheses.verify import restore_function

SOURCE = """class BlockManager:
    def allocate(self, n):
        return n + 1

    def free(self, n):
        return n


def hash_block(prev, tokens):
    return hash((tokens,))
"""


def hyp(name, score, verified=False):
    return Hypothesis("f.py", name, None, "kv-cache", 0.0, "", verified=verified, score=score)


def test_verified_outranks_any_score():
    ranked = rank([hyp("a", 50.0), hyp("b", 1.0, verified=True), hyp("c", 3.0)])
    assert [h.function for h in ranked] == ["b", "a", "c"]
    assert ranked[0].confidence == 0.95 and ranked[1].confidence > ranked[2].confidence


def test_rank_keeps_five():
    assert len(rank([hyp(str(i), float(i)) for i in range(9)])) == 5


def test_restore_function_touches_only_that_function(tmp_path: Path):
    (tmp_path / "m.py").write_text(SOURCE)
    old = "def hash_block(prev, tokens):\n    return hash((prev, tuple(tokens)))\n"
    assert restore_function(tmp_path, "m.py", "hash_block", old)
    text = (tmp_path / "m.py").read_text()
    assert "hash((prev, tuple(tokens)))" in text and "return n + 1" in text and text.count("def ") == 3
    method_old = "    def allocate(self, n):\n        return n\n"
    assert restore_function(tmp_path, "m.py", "BlockManager.allocate", method_old)
    assert "return n + 1" not in (tmp_path / "m.py").read_text()
    assert not restore_function(tmp_path, "m.py", "missing", "x")


def test_trigger_words_follow_the_trigger_and_pattern():
    drill = DrillDown("layers.0.attn.out", 0, "attention", pattern={"decode_only": True})
    words = trigger_words("prefix caching on, later requests share a prefix", drill)
    assert "hash" in words and "decode" in words


def test_without_history_functions_that_read_the_scenarios_settings_are_suspects(tmp_path: Path):
    """Sizing keys say nothing; a window or a rope scaling the reporter chose does: the code that
    ran and reads it is where the setting is honoured or dropped."""
    from types import SimpleNamespace

    from tools.hypotheses.gather import _add_setting_evidence, scenario_settings
    from tools.source.index import open_index

    model = {"arch": "qwen2", "hidden_size": 64, "sliding_window": 32, "rope_scaling": {"rope_type": "yarn"}}
    assert scenario_settings(model) == ["sliding_window", "rope_scaling", "yarn"]
    (tmp_path / "m.py").write_text(
        "def make_mask(cfg):\n    return cfg.sliding_window\n\n\n"
        "def compute_yarn(cfg):\n    return 1\n\n\n"
        "def embed(x):\n    return x\n\n\n"
        "def unused_window(cfg):\n    return cfg.sliding_window\n"
    )
    index = open_index(tmp_path, include_tests=False)
    cands: dict = {}
    ran = {"m.py:make_mask", "m.py:compute_yarn", "m.py:embed"}
    _add_setting_evidence(cands, index, SimpleNamespace(scenario=SimpleNamespace(model=model)), ran)
    found = {name: c.evidence[0] for (_, name), c in cands.items()}
    assert found == {
        "make_mask": "reads the scenario's setting sliding_window",
        "compute_yarn": "reads the scenario's setting yarn",
    }, "embed reads no setting; unused_window did not run"
