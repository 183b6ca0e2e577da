"""The compilation cases carry tinyserve's torch.compile path in their own `base` (a folded
`00-base` patch), so the pristine subject stays as it is; in a built case repo at `base` the
options are checked and the compiled forward gives the eager engine's tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from benchmark.build import build_case_repo, git
from benchmark.cases import BUNDLED_CASES_DIR, load_case
from benchmark.subjects import get_subject
from tools.probe.checkpoints import ensure_checkpoint

COMPILE_CASES = sorted(
    p.parent.name
    for p in BUNDLED_CASES_DIR.glob("*/case.toml")
    if tomllib.loads(p.read_text()).get("category") == "compilation"
)

# run inside the case repo's interpreter (PYTHONPATH = the repo): prints one JSON line
ENGINE_SCRIPT = """
import json, sys
import torch
from tinyserve import Config, LLMEngine, SamplingParams

torch.set_num_threads(1)
ckpt, options = sys.argv[1], json.loads(sys.argv[2])
errors = []
for bad in ({"compile_backend": "tensorrt"}, {"compile_mode": "fastest"}):
    try:
        Config(model=ckpt, compile=True, **bad)
    except ValueError as e:
        errors.append(str(e))
engine = LLMEngine(Config(model=ckpt, **options))
params = SamplingParams(max_tokens=4, ignore_eos=True)
engine.add_request("0", list(range(40, 52)), params)
engine.add_request("1", [5, 17, 42], params)
tokens = {}
while engine.has_unfinished_requests():
    tokens.update({o.request_id: o.token_ids for o in engine.step()})
print(json.dumps({"errors": errors, "tokens": tokens, "native": list(engine.config.native_kernels)}))
"""


def run_engine(repo: Path, ckpt: Path, **options) -> dict:
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", ENGINE_SCRIPT, str(ckpt), json.dumps(options)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_compilation_case_folds_the_compile_path_into_base():
    assert len(COMPILE_CASES) >= 3
    pristine = get_subject("tinyserve").source
    assert not (pristine / "tinyserve" / "compilation.py").exists()  # the subject's snapshot is untouched
    for case_id in COMPILE_CASES:
        case = load_case(BUNDLED_CASES_DIR / case_id)
        base = [p for p in case.patches if p.stem.startswith("00-base")]
        assert [p.stem for p in base] == ["00-base-01-compile-path"], case_id
        assert "+++ b/tinyserve/compilation.py" in base[0].read_text()
        assert case.scenario.target.options.get("compile") is True


@pytest.mark.slow
def test_compiled_forward_at_base_gives_the_eager_tokens(tmp_path):
    """At `base` (compile path, none of the history) dynamo's graph over prefill and decode steps of a
    two-request batch gives the eager engine's tokens, and bad compile options are refused."""
    repo = build_case_repo(COMPILE_CASES[0], tmp_path / "repo")
    git(repo, "checkout", "-q", "base")
    ckpt = ensure_checkpoint({"arch": "llama", "seed": 0})
    compiled = run_engine(repo, ckpt, compile=True, compile_backend="aot_eager")
    assert compiled["tokens"] == run_engine(repo, ckpt)["tokens"]
    assert [e.split()[0] for e in compiled["errors"]] == ["compile_backend", "compile_mode"]
    assert "rms_norm" in compiled["native"] and "paged_attention" not in compiled["native"]
