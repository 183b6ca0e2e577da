"""`python -m benchmark.release_sweep`: a real PyPI release unpacked and swept against the installed
reference. 4.40.2's eager sliding-window mask keeps one key too many (huggingface/transformers#29623,
tests/tools/engines/test_hf_releases.py): its mistral long-prompt cell diverges, its llama cell agrees."""

from __future__ import annotations

import json

import pytest

from benchmark import release_sweep


@pytest.mark.slow
def test_a_release_with_a_known_bug_diverges_where_it_should(tmp_path, capsys):
    matrix = tmp_path / "m.toml"
    matrix.write_text('arch = ["llama", "mistral"]\ndtype = ["float32"]\nworkload = ["long"]\nstrength = 4\n')
    out = tmp_path / "out"
    argv = ["4.40.2", "--engine", "transformers:attn_implementation=eager", "--matrix", str(matrix)]
    assert release_sweep.main([*argv, "--minimize-probes", "0", "--out", str(out), "--quiet"]) == 0
    (row,) = json.loads((out / "release_sweep.json").read_text())
    assert (row["version"], row["agree"], row["diverge"], row["error"]) == ("4.40.2", 1, 1, 0)
    (group,) = row["groups"]
    assert group["cells"] == ["mistral-float32-none-long"] and group["tap"].startswith("layers.")
    assert "1 diverge" in capsys.readouterr().out
