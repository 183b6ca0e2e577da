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


def test_a_function_named_after_a_setting_of_kernels_that_keep_their_contract_is_a_suspect(tmp_path: Path):
    """The component diverges but its kernel computes right on its inputs: the function that supplies
    one of its settings (a per-layer window) is suspected; not when a kernel breaks its contract."""
    from tools.hypotheses.coverage import Coverage
    from tools.hypotheses.gather import _add_setting_evidence
    from tools.source.index import open_index

    (tmp_path / "config.py").write_text(
        "def sliding_windows(hf):\n    return [hf['w']] * 2\n\ndef other(x):\n    return x\n"
    )
    (tmp_path / "ops.py").write_text(
        "def attend(q, key_cache, value_cache, block_table, sliding_window):\n    return q\n"
    )
    index = open_index(tmp_path, include_tests=False)
    kept = {"function": "ops.py:attend", "contract": "paged-attention", "component": "attention", "violations": 0,
            "settings": ["sliding_window"]}  # fmt: skip
    drill = DrillDown("layers.0.attn.out", 0, "attention")
    cands: dict = {}
    ran = Coverage(frozenset({"config.py:sliding_windows", "config.py:other"}))
    _add_setting_evidence(cands, index, [kept], drill, ran)
    assert list(cands) == [("config.py", "sliding_windows")]
    assert "`sliding_window`" in cands[("config.py", "sliding_windows")].evidence[0]
    cands = {}
    _add_setting_evidence(cands, index, [{**kept, "violations": 1}], drill, None)
    assert cands == {}


def test_the_caller_that_hands_a_cut_probabilities_of_other_logits_is_the_suspect(tmp_path: Path):
    """A cut judged right on the probabilities it was handed, which are not the softmax of the logits it
    was handed: the caller in its file that computed them is suspected (one that ran; with a culprit,
    one the culprit changed), not the cut and not an unrelated caller elsewhere."""
    from tools.hypotheses.coverage import Coverage
    from tools.hypotheses.gather import _add_feeder_evidence
    from tools.source.index import open_index

    (tmp_path / "sampler.py").write_text(
        "class Sampler:\n"
        "    def apply_top_p(self, logits, top_p, probs):\n        return logits\n\n"
        "    def forward(self, logits):\n        probs = logits.softmax(-1)\n"
        "        return self.apply_top_p(logits / 2, 0.9, probs)\n"
    )
    (tmp_path / "other.py").write_text("def elsewhere(s, x):\n    return s.apply_top_p(x, 0.9, x)\n")
    index = open_index(tmp_path, include_tests=False)
    verdict = {"function": "sampler.py:Sampler.apply_top_p", "contract": "top-p", "violations": 0,
               "inconsistent_inputs": 0.4}  # fmt: skip
    ran = Coverage(frozenset({"sampler.py:Sampler.forward", "sampler.py:Sampler.apply_top_p", "other.py:elsewhere"}))
    cands: dict = {}
    _add_feeder_evidence(cands, index, [verdict], ran, None)
    assert list(cands) == [("sampler.py", "Sampler.forward")]
    assert "not the softmax" in cands[("sampler.py", "Sampler.forward")].evidence[0]
    cands = {}
    _add_feeder_evidence(cands, index, [verdict], ran, {("sampler.py", "Sampler.apply_top_p")})  # forward unchanged
    assert cands == {}
    _add_feeder_evidence(cands, index, [{**verdict, "inconsistent_inputs": 1e-7}], ran, None)  # consistent inputs
    assert cands == {}
