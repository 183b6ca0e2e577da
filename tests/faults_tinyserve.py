"""Fault fixtures for tinyserve: a copy of the bundled subject in a real git repo, with one-line patches.

The copy plays the user's checkout (`--target-source`): the worker imports it first, so the
probe runs the faulty tree while the bundled subject stays untouched.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUBJECT = Path(__file__).resolve().parents[1] / "benchmark" / "subjects" / "tinyserve"
LLAMA = "tinyserve/models/llama.py"
GEMMA2 = "tinyserve/models/gemma2.py"


@dataclass(frozen=True)
class Fault:
    file: str
    old: str
    new: str  # may hold {layer}


# Attention logits scaled wrongly in one layer (a query_pre_attn_scalar-style slip): first diverges at attn.out.
ATTN_SCALE = Fault(
    LLAMA,
    "scale if scale is not None else d ** -0.5, kernels,",
    "(scale if scale is not None else d ** -0.5) * (2.0 if layer_idx == {layer} else 1.0), kernels,",
)
# The MLP's input norm built with a wrong epsilon in one layer: first diverges at mlp_norm.
MLP_NORM_EPS = {
    "llama": Fault(
        LLAMA,
        "self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)",
        "self.post_attention_layernorm = RMSNorm(cfg.hidden_size, "
        "0.5 if layer_idx == {layer} else cfg.rms_norm_eps, kernels)",
    ),
    "gemma2": Fault(
        GEMMA2,
        "self.pre_feedforward_layernorm = GemmaRMSNorm(hs, eps, kernels)",
        "self.pre_feedforward_layernorm = GemmaRMSNorm(hs, 0.5 if layer_idx == {layer} else eps, kernels)",
    ),
}
MLP_NORM_EPS["qwen2"] = MLP_NORM_EPS["mistral"] = MLP_NORM_EPS["llama"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=diffdx-test", "-c", "user.email=test@diffdx.local", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def faulty_tree(dest: Path, faults: list[tuple[Fault, int]]) -> Path:
    """Copy tinyserve into a git repo at dest (commit `base`), apply each (fault, layer) as one commit."""
    shutil.copytree(SUBJECT / "tinyserve", dest / "tinyserve", ignore=shutil.ignore_patterns("__pycache__"))
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "base")
    for fault, layer in faults:
        path = dest / fault.file
        text = path.read_text()
        assert text.count(fault.old) == 1, f"{fault.file}: the line to patch is not there exactly once"
        path.write_text(text.replace(fault.old, fault.new.format(layer=layer)))
        _git(dest, "commit", "-q", "-am", f"{fault.file}: change layer {layer}")
    return dest
