"""Fault fixtures: a `sitecustomize.py` placed first on the worker's PYTHONPATH.

The probe runs the target in its own interpreter with the tree under test first
on PYTHONPATH; a sitecustomize there is imported at start-up and corrupts the
installed transformers in one specific place. Nothing of diffdx is patched.
"""

from __future__ import annotations

from pathlib import Path

_PRELUDE = """
import importlib
_mod = importlib.import_module("transformers.models.{arch}.modeling_{arch}")
_Layer = getattr(_mod, "{cls}DecoderLayer")
_init = _Layer.__init__
"""

MLP_DOWN_OFFSET = (
    _PRELUDE
    + """
def __init__(self, config, layer_idx, *a, **k):
    _init(self, config, layer_idx, *a, **k)
    if layer_idx == {layer}:
        down = self.mlp.down_proj
        plain = down.forward
        down.forward = lambda x: plain(x) + {delta} * plain(x).abs().mean()
_Layer.__init__ = __init__
"""
)

NORM_EPS = (
    _PRELUDE
    + """
def __init__(self, config, layer_idx, *a, **k):
    _init(self, config, layer_idx, *a, **k)
    if layer_idx == {layer}:
        norm = self.post_attention_layernorm
        setattr(norm, "variance_epsilon" if hasattr(norm, "variance_epsilon") else "eps", {eps})
_Layer.__init__ = __init__
"""
)

ROPE_BASE = """
import importlib
import torch
_mod = importlib.import_module("transformers.models.{arch}.modeling_{arch}")
_Rotary = getattr(_mod, "{cls}RotaryEmbedding")
_forward = _Rotary.forward
def forward(self, x, position_ids, *a, **k):
    # the classic slip: inv_freq from base 1000 instead of the configured 10000
    dim = self.inv_freq.shape[0] * 2
    exps = torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim
    self.inv_freq = 1.0 / (1000.0 ** exps)
    return _forward(self, x, position_ids, *a, **k)
_Rotary.forward = forward
"""

LATE_POSITION_OFFSET = (
    _PRELUDE
    + """
_forward = _Layer.forward
def forward(self, hidden_states, *a, **k):
    out = _forward(self, hidden_states, *a, **k)
    if self.self_attn.layer_idx == {layer}:
        pos = k.get("position_ids")
        if pos is not None:
            hit = (pos >= {start}).unsqueeze(-1).to(out.dtype)
            out = out + {delta} * hit * out.abs().mean()
    return out
_Layer.forward = forward
"""
)

CLASS_PREFIX = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "gemma2": "Gemma2"}


def write_fault(dest: Path, template: str, arch: str, **values) -> Path:
    """Write a sitecustomize.py for `arch` into dest; returns dest (use it as the target source)."""
    dest.mkdir(parents=True, exist_ok=True)
    code = template.format(arch=arch, cls=CLASS_PREFIX[arch], **values)
    (dest / "sitecustomize.py").write_text(code)
    return dest


def write_faults(dest: Path, faults: list[tuple[str, dict]], arch: str) -> Path:
    """Several faults in one sitecustomize.py, each run in its own namespace (their module-level
    names, e.g. `_init`, would otherwise chain into each other); returns dest."""
    dest.mkdir(parents=True, exist_ok=True)
    codes = [template.format(arch=arch, cls=CLASS_PREFIX[arch], **values) for template, values in faults]
    (dest / "sitecustomize.py").write_text("".join(f"exec({code!r}, {{}})\n" for code in codes))
    return dest


# --- tinyserve sampler faults: one edit in a copy of the pristine subject --------------------------

TINYSERVE_SAMPLER = Path("tinyserve/layers/sampler.py")
TOP_K_OFF_BY_ONE = (
    "kth = sorted_desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))",
    "kth = sorted_desc.gather(1, top_k.clamp(max=logits.shape[-1] - 1).unsqueeze(1))",
)
MIN_P_HALVED = (
    "threshold = min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)",
    "threshold = 0.5 * min_p.to(probs.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)",
)

# Draws that stay inside the kept set but do not follow its probabilities (tools.probe.draws): a sampler
# that ignores its random numbers, and an exponential race on sqrt(E), which draws in proportion to p^2.
GREEDY_DRAW = ("tokens[i] = (probs[i] / race).argmax()", "tokens[i] = probs[i].argmax()")
SQUARED_DRAW = ("tokens[i] = (probs[i] / race).argmax()", "tokens[i] = (probs[i] / race.sqrt()).argmax()")
# one noise vector for every row of a batch (each row's law right, the rows' draws not independent)
SHARED_NOISE_DRAW = (
    "for i in (~st.greedy).nonzero().flatten().tolist():\n"
    "            race = torch.empty_like(probs[i]).exponential_(generator=st.generators[i])",
    "first = int((~st.greedy).nonzero()[0]) if bool((~st.greedy).any()) else 0\n"
    "        shared = torch.empty_like(probs[0]).exponential_(generator=st.generators[first])\n"
    "        for i in (~st.greedy).nonzero().flatten().tolist():\n"
    "            race = shared",
)
# drawn from the distribution before temperature (p^T of the reported one) while reporting the one after
BEFORE_TEMPERATURE_DRAW = (
    "tokens[i] = (probs[i] / race).argmax()",
    "tokens[i] = (probs[i] ** st.temperature[i] / race).argmax()",
)


def buggy_tinyserve(dest: Path, old: str, new: str, file: Path = TINYSERVE_SAMPLER) -> Path:
    """A copy of the pristine tinyserve with one edit in `file` (its sampler by default); returns the tree's root."""
    import shutil

    from tools.engines.tinyserve import SUBJECT_ROOT

    shutil.copytree(SUBJECT_ROOT / "tinyserve", dest / "tinyserve")
    path = dest / file
    text = path.read_text()
    assert old in text, f"{file} changed: update the fault"
    path.write_text(text.replace(old, new))
    return dest
