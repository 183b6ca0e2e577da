"""The sweep's newer axes each catch a fault they exist for, and the bundled tinyserve passes the
same cell: real `agent.check` runs on one-cell matrices, the fault a one-line patch in a copy of
the subject in a real git repo (tests/faults_tinyserve.py)."""

from __future__ import annotations

import json

import pytest

from tests.agent.test_check import check, matrix
from tests.faults_tinyserve import Fault, faulty_tree

# gemma2's activation read from the legacy key first: "gelu" where the export means tanh gelu
# (legacy_keys writes hidden_act "gelu" beside hidden_activation, at trained-scale weights).
LEGACY_ACT_FIRST = Fault(
    "tinyserve/config.py",
    'hidden_act=hf.get("hidden_activation") or hf.get("hidden_act", "silu"),',
    'hidden_act=hf.get("hidden_act") or hf.get("hidden_activation", "silu"),',
)
# rope angles computed in bfloat16 (positions times frequencies): off in proportion to the position,
# visible once attention is peaked (trained_scale) and the prompt long.
ROPE_ANGLES_BF16 = Fault(
    "tinyserve/layers/rotary_embedding.py",
    "freqs = positions.float()[:, None] * inv_freq.float()[None, :]",
    "freqs = (positions.bfloat16()[:, None] * inv_freq.bfloat16()[None, :]).float()",
)
# dynamic NTK frequencies derived once for the whole max_model_len instead of the sequence's
# length: wrong below the pretraining length as soon as max_model_len exceeds it (rope_dynamic
# serves the checkpoint at twice its max_position_embeddings).
NTK_AT_MAX_LEN = Fault(
    "tinyserve/layers/rotary_embedding.py",
    "inv_freq, self.attention_scaling = ROPE_SCALING[rope_type](rope, head_dim, max_position)",
    "inv_freq, self.attention_scaling = ROPE_SCALING[rope_type](rope, head_dim, max_position, max_model_len)",
)
# special tokens left in the returned text (the staggered text request's draw holds one).
SPECIALS_IN_TEXT = Fault(
    "tinyserve/tokenizer.py",
    "return self._tok.decode(token_ids, skip_special_tokens=True)",
    "return self._tok.decode(token_ids, skip_special_tokens=False)",
)

CASES = [
    pytest.param(LEGACY_ACT_FIRST, dict(arch=["gemma2"], workload=["long"], config=["legacy_keys"]), id="legacy-act"),
    pytest.param(
        ROPE_ANGLES_BF16,
        dict(arch=["llama"], dtype=["bfloat16"], workload=["long"], config=["trained_scale"]),
        id="trained-scale",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        NTK_AT_MAX_LEN,
        dict(arch=["llama"], workload=["sampled"], config=["rope_dynamic"]),
        id="rope-dynamic-max-len",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        SPECIALS_IN_TEXT, dict(arch=["qwen2"], workload=["staggered"]), id="text-specials", marks=pytest.mark.slow
    ),
]


@pytest.mark.parametrize("fault, axes", CASES)
def test_new_axis_fails_on_its_fault_and_passes_on_the_bundled_engine(tmp_path, fault, axes):
    m = matrix(tmp_path, **{"dtype": ["float32"], "features": ["none"], **axes, "strength": 5})
    clean = check("--engine", "tinyserve", "--matrix", str(m), "--out", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "1 cells: 1 agree" in clean.stdout
    tree = faulty_tree(tmp_path / "tree", [(fault, 0)])
    out = tmp_path / "faulty"
    p = check(
        "--engine", "tinyserve", "--matrix", str(m), "--target-source", str(tree), "--out", str(out),
        "--no-diagnose", "--minimize-probes", "0",
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    (cell,) = json.loads((out / "results.json").read_text())["cells"]
    # a failing cell: a divergence, or (the bundled engine has no exact-gelu kernel) a refusal of the
    # activation the legacy key names, which the sweep reports as an errored cell
    assert cell["status"] == "diverge" and cell["first_tap"] or cell["status"] == "error", cell
