"""The CPU function computing each ggml op, read from the tree's dispatch switches (kernels.py)."""

from pathlib import Path

import pytest

from tools.engines.llamacpp.kernels import cpu_kernel, find_cpu_dir

GGML_CPU_C = """
static void ggml_compute_forward(struct ggml_compute_params * params, struct ggml_tensor * tensor) {
    switch (tensor->op) {
        case GGML_OP_ADD:
            {
                ggml_compute_forward_add(params, tensor);
            } break;
        case GGML_OP_MUL_MAT:
            {
                ggml_compute_forward_mul_mat(params, tensor);
            } break;
        case GGML_OP_RMS_NORM:
            {
                ggml_compute_forward_rms_norm(params, tensor);
            } break;
        case GGML_OP_UNARY:
            {
                ggml_compute_forward_unary(params, tensor);
            } break;
        default:
            break;
    }
}

static void ggml_compute_forward_mul_mat(struct ggml_compute_params * params, struct ggml_tensor * dst) {
    vec_dot(dst);
}
"""
OPS_CPP = """
static void ggml_compute_forward_rms_norm_f32(const ggml_compute_params * params, ggml_tensor * dst) {}

void ggml_compute_forward_rms_norm(const ggml_compute_params * params, ggml_tensor * dst) {
    switch (dst->src[0]->type) {
        case GGML_TYPE_F32:
            {
                ggml_compute_forward_rms_norm_f32(params, dst);
            } break;
        default:
            {
                GGML_ABORT("fatal error");
            }
    }
}

template <typename T>
static void ggml_compute_forward_silu_flt(const ggml_compute_params * params, ggml_tensor * dst) {}

static void ggml_compute_forward_silu(const ggml_compute_params * params, ggml_tensor * dst) {
    switch (dst->src[0]->type) {
        case GGML_TYPE_F16:
        case GGML_TYPE_F32:
            {
                ggml_compute_forward_silu_flt<float>(params, dst);
            } break;
        default:
            break;
    }
}

void ggml_compute_forward_unary(const ggml_compute_params * params, ggml_tensor * dst) {
    switch (ggml_get_unary_op(dst)) {
        case GGML_UNARY_OP_SILU:
            {
                ggml_compute_forward_silu(params, dst);
            } break;
        default:
            break;
    }
}
"""
BINARY_CPP = """
void ggml_compute_forward_add(const ggml_compute_params * params, ggml_tensor * dst) {
    binary_op<op_add>(params, dst);
}
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    cpu = tmp_path / "vendor" / "ggml" / "src" / "ggml-cpu"
    cpu.mkdir(parents=True)
    (cpu / "ggml-cpu.c").write_text(GGML_CPU_C)
    (cpu / "ops.cpp").write_text(OPS_CPP)
    (cpu / "binary-ops.cpp").write_text(BINARY_CPP)
    stale = tmp_path / "build" / "ggml" / "src" / "ggml-cpu"  # a build folder's copy is not the source
    stale.mkdir(parents=True)
    (stale / "ggml-cpu.c").write_text("")
    return tmp_path


def test_the_op_switch_then_the_type_switch_name_the_kernel(tree: Path):
    k = cpu_kernel(tree, "RMS_NORM", "f32")
    assert k is not None and k.function == "ggml_compute_forward_rms_norm_f32"
    assert k.file == "vendor/ggml/src/ggml-cpu/ops.cpp" and k.chain == ("ggml_compute_forward_rms_norm",)
    assert find_cpu_dir(tree) == tree / "vendor" / "ggml" / "src" / "ggml-cpu"


def test_helpers_are_the_functions_here_the_kernel_calls(tree: Path):
    k = cpu_kernel(tree, "MUL_MAT", "f32")
    assert k is not None and k.helpers == ()  # vec_dot is not defined in the tree


def test_unary_op_fallthrough_cases_and_templates(tree: Path):
    k = cpu_kernel(tree, "UNARY", "f16", "SILU")
    assert k is not None and k.function == "ggml_compute_forward_silu_flt"
    assert k.chain == ("ggml_compute_forward_unary", "ggml_compute_forward_silu")


def test_a_dispatcher_without_a_switch_is_the_kernel_and_unknown_ops_have_none(tree: Path):
    add = cpu_kernel(tree, "ADD", "f32")
    assert add is not None and (add.file, add.function) == (
        "vendor/ggml/src/ggml-cpu/binary-ops.cpp",
        "ggml_compute_forward_add",
    )
    mm = cpu_kernel(tree, "MUL_MAT", "q8_0")
    assert mm is not None and mm.file.endswith("ggml-cpu.c")
    assert cpu_kernel(tree, "ROPE", "f32") is None
    assert cpu_kernel(tree, "RMS_NORM", "q4_K") is not None  # no matching type case: the dispatcher itself


VENDORED = Path("/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp")


@pytest.mark.skipif(not VENDORED.is_dir(), reason="the unpacked llama-cpp-python sdist is not on this machine")
@pytest.mark.parametrize(
    "op,type_,sub,function",
    [
        ("RMS_NORM", "f32", "", "ggml_compute_forward_rms_norm_f32"),
        ("ROPE", "f32", "", "ggml_compute_forward_rope_flt"),
        ("SOFT_MAX", "f32", "", "ggml_compute_forward_soft_max_f32"),
        ("GLU", "f32", "SWIGLU", "ggml_compute_forward_swiglu_f32"),
        ("FLASH_ATTN_EXT", "f32", "", "ggml_compute_forward_flash_attn_ext_f16"),
        ("MUL_MAT", "f16", "", "ggml_compute_forward_mul_mat"),
    ],
)
def test_the_vendored_llama_cpp(op, type_, sub, function):
    k = cpu_kernel(VENDORED, op, type_, sub)
    assert k is not None and k.function == function and k.file.startswith("ggml/src/ggml-cpu/")


@pytest.mark.skipif(not VENDORED.is_dir(), reason="the unpacked llama-cpp-python sdist is not on this machine")
def test_the_kernels_own_helpers_not_the_plumbing():
    rope = cpu_kernel(VENDORED, "ROPE", "f32")
    assert rope is not None and {"rotate_pairs", "ggml_rope_cache_init", "rope_yarn"} <= set(rope.helpers)
    mul_mat = cpu_kernel(VENDORED, "MUL_MAT", "f32")
    assert mul_mat is not None and "ggml_compute_forward_mul_mat_one_chunk" in mul_mat.helpers
    assert "ggml_barrier" not in mul_mat.helpers  # called everywhere: plumbing
    assert not {"ggml_cpu_fp16_to_fp32", "ggml_cpu_bf16_to_fp32"} & set(mul_mat.helpers)  # get_rows uses them too


# A mul_mat the way ggml writes it: it converts rows with a routine other ops share, hands its own
# tensor to a chunk worker, and a thin cpy forwards its tensor to the routine that does the work.
SHARED_HELPERS_C = """
static void ggml_compute_forward(struct ggml_compute_params * params, struct ggml_tensor * tensor) {
    switch (tensor->op) {
        case GGML_OP_MUL_MAT: { ggml_compute_forward_mul_mat(params, tensor); } break;
        case GGML_OP_GET_ROWS: { ggml_compute_forward_get_rows(params, tensor); } break;
        case GGML_OP_CPY: { ggml_compute_forward_cpy(params, tensor); } break;
        case GGML_OP_CONT: { ggml_compute_forward_cont(params, tensor); } break;
        default: break;
    }
}
void ggml_cpu_fp16_to_fp32(const ggml_fp16_t * x, float * y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = x[i]; }
static void ggml_compute_forward_get_rows(struct ggml_compute_params * params, struct ggml_tensor * dst) {
    ggml_cpu_fp16_to_fp32(dst->src[0]->data, dst->data, dst->ne[0]);
}
static float dot_tail(const float * x, const float * y, int n) { return x[n - 1] * y[n - 1]; }
static void ggml_compute_forward_mul_mat_one_chunk(struct ggml_compute_params * params, struct ggml_tensor * dst, int64_t ir0) {
    dot_tail(dst->src[0]->data, dst->src[1]->data, ir0);
}
void ggml_compute_forward_mul_mat(struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src1 = dst->src[1];
    ggml_cpu_fp16_to_fp32(src1->data, params->wdata, src1->ne[0]);
    ggml_compute_forward_mul_mat_one_chunk(params, dst, 0);
}
static void ggml_compute_forward_dup_flt(struct ggml_compute_params * params, struct ggml_tensor * dst) {}
static void ggml_compute_forward_dup(struct ggml_compute_params * params, struct ggml_tensor * dst) {
    ggml_compute_forward_dup_flt(params, dst);
}
static void ggml_compute_forward_cpy(struct ggml_compute_params * params, struct ggml_tensor * dst) {
    ggml_compute_forward_dup(params, dst);
}
static void ggml_compute_forward_cont(struct ggml_compute_params * params, struct ggml_tensor * dst) {
    ggml_compute_forward_dup(params, dst);
}
"""


def test_helpers_are_the_ops_own_not_routines_other_ops_share(tmp_path: Path):
    """Regression: every function two calls deep with few callers was a helper, so a converter that
    get_rows also calls became kernel_helper evidence for mul_mat and outranked its own parts."""
    cpu = tmp_path / "ggml" / "src" / "ggml-cpu"
    cpu.mkdir(parents=True)
    (cpu / "ggml-cpu.c").write_text(SHARED_HELPERS_C)
    mul_mat = cpu_kernel(tmp_path, "MUL_MAT", "f16")
    assert mul_mat is not None and mul_mat.function == "ggml_compute_forward_mul_mat"
    assert mul_mat.helpers == ("ggml_compute_forward_mul_mat_one_chunk", "dot_tail")
    cpy = cpu_kernel(tmp_path, "CPY", "f32")  # cont calls dup too, but cpy hands it its own tensor
    assert cpy is not None and cpy.helpers == ("ggml_compute_forward_dup", "ggml_compute_forward_dup_flt")
