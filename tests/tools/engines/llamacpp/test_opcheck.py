"""Op-level attribution on real llama.cpp builds: every ggml op of the bug-free build is within
its tolerance (no false op alarm), and a one-line bug injected into a CPU kernel of a built copy of
the subject is attributed to its op and to the C function that computes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.drilldown import find_wrong_op
from tools.hypotheses.evidence import Reproduction
from tools.probe.prober import Prober
from tools.scenario import from_dict

pytest.importorskip("llama_cpp")


def scenario(arch: str, dtype: str, **options):
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0},
            "target": {"engine": "llama.cpp", "dtype": dtype, "options": options},
            "workload": {
                "requests": [
                    {"prompt_ids": list(range(40, 52)), "max_tokens": 4, "sampling": {"ignore_eos": True}},
                    {
                        "prompt_ids": [7, 9, 11, 300],
                        "max_tokens": 4,
                        "arrival_step": 1,
                        "sampling": {"ignore_eos": True},
                    },
                ]
            },
        }
    )


EXPECTED_OPS = {"MUL_MAT", "RMS_NORM", "ROPE", "GLU(SWIGLU)", "GET_ROWS", "ADD", "MUL"}


def op_checks(arch: str, dtype: str, source: Path | None = None, **options) -> dict:
    trace = Prober().run_target(scenario(arch, dtype, **options), source, taps=[], op_checks=True)
    return trace.meta["op_checks"]


def _no_false_alarm(arch: str, dtype: str, **options) -> None:
    checks = op_checks(arch, dtype, **options)
    assert checks["wrong"] == [] and checks["errors"] == [], checks["wrong"][:3] or checks["errors"][:3]
    assert checks["judged"] > 200 and EXPECTED_OPS <= set(checks["ops"])
    assert max(s["max_ratio"] for s in checks["ops"].values()) < 1.0  # a wide margin under the bar of 4


def test_bug_free_build_has_no_wrong_op():
    _no_false_alarm("llama", "float32")


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,dtype,options",
    [
        ("llama", "float16", {}),
        ("qwen2", "float32", {}),
        ("qwen2", "float16", {}),
        ("llama", "float16", {"flash_attn": True}),
        ("qwen2", "float32", {"weights": "q8_0"}),
        ("llama", "float32", {"weights": "q4_0"}),
    ],
)
def test_bug_free_build_has_no_wrong_op_matrix(arch, dtype, options):
    _no_false_alarm(arch, dtype, **options)


# One changed line in a CPU kernel, as a patch would make it: (file, function, old, new).
BUGS = {
    "rms_norm": (
        "ggml/src/ggml-cpu/ops.cpp",
        "ggml_compute_forward_rms_norm_f32",
        "const float mean  = sum/ne00;",
        "const float mean  = sum/(ne00 - 1);",
    ),
    "rope": (
        "ggml/src/ggml-cpu/ops.cpp",
        "rotate_pairs",
        "dst[n_offset] = type_conversion_table<T>::from_f32(x0*sin_theta + x1*cos_theta);",
        "dst[n_offset] = type_conversion_table<T>::from_f32(x0*sin_theta - x1*cos_theta);",
    ),
}
ATTRIBUTED = {
    "rms_norm": ("RMS_NORM", "ggml_compute_forward_rms_norm_f32"),
    "rope": ("ROPE", "ggml_compute_forward_rope_flt"),  # rotate_pairs is its helper, not a dispatch level
}


def patched_subject(tmp_path: Path, bug: str) -> Path:
    """A copy of the llama.cpp subject with one line of one function changed."""
    from benchmark.subjects.llamacpp import pruned_source
    from tools.source.index import parse_file

    tree = tmp_path / "llama.cpp"
    shutil.copytree(pruned_source(), tree)
    file, function, old, new = BUGS[bug]
    path = tree / file
    text = path.read_bytes()
    symbols, _ = parse_file(file, text, "cpp")
    sym = next(s for s in symbols if s.qualname == function)
    lines = text.decode().splitlines(keepends=True)
    body = "".join(lines[sym.start_line - 1 : sym.end_line])
    assert body.count(old) == 1, f"{old!r} not once in {function}"
    lines[sym.start_line - 1 : sym.end_line] = [body.replace(old, new)]
    path.write_text("".join(lines))
    return tree


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_an_injected_kernel_bug_is_attributed_to_its_op_and_function(tmp_path: Path, bug: str):
    tree = patched_subject(tmp_path, bug)  # the worker builds it (build.py, cached by content, ccache)
    evidence: list[str] = []
    wrong = find_wrong_op(Reproduction(True, scenario("llama", "float32"), None), Prober(), tree, evidence)
    op, function = ATTRIBUTED[bug]
    assert wrong is not None, evidence
    assert (wrong["op"], wrong["function"], wrong["file"]) == (op, function, "ggml/src/ggml-cpu/ops.cpp")
    assert wrong["ratio"] > 100 and f"{op} (node" in evidence[-1] and function in evidence[-1]


REPRO = """
[model]
arch = "llama"
seed = 0

[target]
engine = "llama.cpp"
dtype = "float32"

[[workload.requests]]
prompt_ids = [40, 41, 42, 43, 44, 45, 46, 47]
max_tokens = 4
sampling = { ignore_eos = true }
"""


@pytest.mark.slow
def test_the_report_names_the_op_and_ranks_its_function_first(tmp_path: Path):
    """agent.run on a git repo of the subject with the rms_norm bug: report.json's kernel is the op,
    the drill-down carries the op and its C function, and that function is hypothesis 1."""
    import json
    import os
    import subprocess
    import sys

    tree = patched_subject(tmp_path, "rms_norm")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tree)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "llama.cpp"]):
        subprocess.run([*git, *args], check=True)
    (tmp_path / "repro.toml").write_text(REPRO)
    (tmp_path / "issue.md").write_text("llama.cpp logits differ from transformers on a small llama (F32 GGUF).\n")
    cmd = [sys.executable, "-m", "agent.run", "--issue-file", str(tmp_path / "issue.md"), "--repro"]
    cmd += [str(tmp_path / "repro.toml"), "--target-source", str(tree), "--out", str(tmp_path / "out"), "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), timeout=3600)
    assert done.returncode == 1, done.stderr[-2000:]  # diverged and diagnosed
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["kernel"] == "RMS_NORM" and report["drill_down"]["op"]["name"] == "norm-0"
    top = report["hypotheses"][0]
    assert (top["file"], top["function"]) == ("ggml/src/ggml-cpu/ops.cpp", "ggml_compute_forward_rms_norm_f32")
    assert any("first op whose output is wrong" in line for line in top["evidence"])
