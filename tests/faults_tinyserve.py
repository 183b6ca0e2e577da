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


ATTENTION_OPS = "tinyserve/ops/attention.py"
# A query no longer attends to itself: the causal comparison made strict (a bug at base).
CAUSAL_STRICT = ("    mask = kv_pos <= q_pos\n", "    mask = kv_pos < q_pos\n")


def tree_at_base(dest: Path, edit: tuple[str, str] | None, file: str = ATTENTION_OPS) -> Path:
    """The subject in a git repo whose only commit already holds `edit` (a bug at base: no history)."""
    repo = faulty_tree(dest, [])
    if edit:
        path = repo / file
        text = path.read_text()
        assert text.count(edit[0]) == 1, f"{file}: the line to patch is not there exactly once"
        path.write_text(text.replace(*edit))
        _git(repo, "commit", "-qa", "--amend", "-m", "base")
    return repo


def checkout_digest(repo: Path) -> str:
    """Every byte of the checkout outside .git, and git's own view of it (ignored files included)."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(p for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts):
        h.update(str(path.relative_to(repo)).encode() + path.read_bytes())
    status = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=repo, capture_output=True, text=True)
    return h.hexdigest() + status.stdout


def short_greedy_scenario():
    """One 12-token prompt, 3 greedy tokens, a float32 tinyserve llama: the cheapest run a verification re-probes."""
    from tools.scenario import from_dict

    reqs = [{"prompt_ids": list(range(3, 15)), "max_tokens": 3, "sampling": {"ignore_eos": True}}]
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "tinyserve", "dtype": "float32"},
            "workload": {"requests": reqs},
        }
    )
