"""The first wrong op (drill-down by op checks) as evidence for the function that computes it."""

from pathlib import Path

from tools.drilldown import op_line
from tools.hypotheses.evidence import DrillDown, Reproduction
from tools.hypotheses.gather import _add_code_evidence
from tools.hypotheses.rank import rank, to_hypothesis
from tools.scenario import from_dict
from tools.source.index import open_index

OPS_CPP = """
static void ggml_compute_forward_rms_norm_f32(const ggml_compute_params * params, ggml_tensor * dst) {}
static void ggml_compute_forward_rms_norm_back_f32(const ggml_compute_params * params, ggml_tensor * dst) {}
static void ggml_compute_forward_norm_f32(const ggml_compute_params * params, ggml_tensor * dst) {}
static float rms_scale(float sum, int n, float eps) { return 1.0f/sqrtf(sum/n + eps); }
"""
WRONG_OP = {
    "index": 7, "op": "RMS_NORM", "name": "attn_norm-0", "types": ["f32", "f32"], "ratio": 412.0, "error": 0.0082,
    "floor": 2e-05, "nonfinite": False, "file": "ggml/src/ggml-cpu/ops.cpp",
    "function": "ggml_compute_forward_rms_norm_f32", "callers": ["ggml_compute_forward_rms_norm"],
    "helpers": ["rms_scale"],
}  # fmt: skip


def test_the_function_computing_the_first_wrong_op_leads_the_ranking(tmp_path: Path):
    cpu = tmp_path / "ggml" / "src" / "ggml-cpu"
    cpu.mkdir(parents=True)
    (cpu / "ops.cpp").write_text(OPS_CPP)
    index = open_index(tmp_path, include_tests=False)
    drill = DrillDown("layers.0.attn_norm", 0, "norm", kernel="RMS_NORM", op=WRONG_OP)
    scenario = from_dict({"model": {"arch": "llama"}, "target": {"engine": "transformers"}, "workload": {"requests": [{"prompt_ids": [1, 2], "max_tokens": 2}]}})  # fmt: skip
    repro = Reproduction(True, scenario, None)
    cands: dict = {}
    _add_code_evidence(cands, index, drill, repro, None, set(), None)
    ranked = rank([to_hypothesis(c, drill, repro) for c in cands.values() if c.score > 0])
    top = ranked[0]
    assert (top.file, top.function) == ("ggml/src/ggml-cpu/ops.cpp", "ggml_compute_forward_rms_norm_f32")
    assert top.category == "kernel" and "first op whose output is wrong" in top.evidence[0]
    assert all(h.score < top.score for h in ranked[1:])  # rms_norm_back and norm share the words, not the evidence
    helper = next(h for h in ranked if h.function == "rms_scale")
    assert "called by ggml_compute_forward_rms_norm_f32" in helper.evidence[0]


def test_the_drill_down_line_names_op_node_and_function():
    line = op_line(WRONG_OP, 120)
    assert (
        "RMS_NORM (node attn_norm-0)" in line
        and "ggml_compute_forward_rms_norm_f32 in ggml/src/ggml-cpu/ops.cpp" in line
    )
    assert "120 ops judged" in line
