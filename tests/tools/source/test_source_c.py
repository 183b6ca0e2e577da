"""C sources (ggml's `.c` files, tree-sitter-c) in the index, and function restores on C and C++:
a hunk in a C function maps to it, and a restore splices only that function's text."""

from __future__ import annotations

from pathlib import Path

from tests.tools.source.test_source import git, write_tree
from tools.hypotheses.verify import function_text, restore_function
from tools.source.index import language_of, open_index

# Written the way ggml writes C: static inline helpers, pointer-returning functions, restrict macros.
GGML_C = """#include "ggml.h"

// SiLU of one value
static inline float ggml_silu_f32(float x) {
    return x/(1.0f + expf(-x));
}

void ggml_vec_silu_f32(const int n, float * GGML_RESTRICT y, const float * GGML_RESTRICT x) {
    for (int i = 0; i < n; ++i) {
        y[i] = ggml_silu_f32(x[i]);
    }
}

struct ggml_tensor * ggml_scale(struct ggml_context * ctx, struct ggml_tensor * a, float s) {
    return ggml_scale_impl(ctx, a, s, false);
}
"""
LLAMA_CPP = """#include "llama-graph.h"

float llm_graph_context::kq_scale(int n_embd_head) const {
    return 1.0f/sqrtf(float(n_embd_head));
}

int llama_n_ctx(const llama_context * ctx) {
    return ctx->n_ctx();
}
"""


def test_c_files_index_their_functions_with_the_c_grammar(tmp_path):
    index = open_index(write_tree(tmp_path, {"ggml/src/ggml.c": GGML_C}))
    assert language_of("ggml/src/ggml.c") == "c" and language_of("src/llama.cpp") == "cpp"
    names = {s.qualname: s for s in index.symbols}
    assert set(names) == {"ggml_silu_f32", "ggml_vec_silu_f32", "ggml_scale"}
    assert (names["ggml_scale"].start_line, names["ggml_scale"].end_line) == (14, 16)
    assert names["ggml_silu_f32"].doc == "SiLU of one value" and names["ggml_silu_f32"].language == "c"
    assert [s.qualname for s in index.callers("ggml_silu_f32")] == ["ggml_vec_silu_f32"]


def test_a_hunk_in_a_c_function_maps_to_it(tmp_path):
    repo = write_tree(tmp_path / "repo", {"ggml/src/ggml.c": GGML_C, "src/llama-graph.cpp": LLAMA_CPP})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    write_tree(repo, {"ggml/src/ggml.c": GGML_C.replace("1.0f + expf(-x)", "1.0f + expf(x)")})
    write_tree(repo, {"src/llama-graph.cpp": LLAMA_CPP.replace("1.0f/sqrtf", "0.5f/sqrtf")})
    git(repo, "commit", "-q", "-am", "change")
    changes = open_index(repo).symbols_for_hunks(git(repo, "diff", "HEAD~1", "HEAD"))
    assert {(c.file, c.symbol.qualname if c.symbol else None) for c in changes} == {
        ("ggml/src/ggml.c", "ggml_silu_f32"),
        ("src/llama-graph.cpp", "llm_graph_context.kq_scale"),
    }


def test_restores_splice_one_c_or_cpp_function(tmp_path: Path):
    write_tree(tmp_path, {"ggml.c": GGML_C.replace("1.0f + expf(-x)", "1.0f + expf(x)"), "graph.cpp": LLAMA_CPP})
    old = "static inline float ggml_silu_f32(float x) {\n    return x/(1.0f + expf(-x));\n}\n"
    assert restore_function(tmp_path, "ggml.c", "ggml_silu_f32", old)
    assert (tmp_path / "ggml.c").read_text() == GGML_C  # the rest, comment above included, untouched
    method = "float llm_graph_context::kq_scale(int n_embd_head) const {\n    return 0.0f;\n}\n"
    assert restore_function(tmp_path, "graph.cpp", "llm_graph_context.kq_scale", method)
    assert function_text(tmp_path, "graph.cpp", "llm_graph_context.kq_scale") == method
    assert "ctx->n_ctx()" in (tmp_path / "graph.cpp").read_text()
    assert not restore_function(tmp_path, "ggml.c", "missing", "x")
    assert not restore_function(tmp_path, "a.txt", "f", "x")


def test_same_code_ignores_comments_layout_and_docstrings_only():
    from tools.source.index import same_code

    c = "int f(int x) {\n    return x + 1;\n}\n"
    assert same_code("a.c", c, "int f(int x) { /* one more */ return x+1; }  // tail\n")
    assert not same_code("a.c", c, c.replace("+ 1", "+ 2"))
    py = '    def f(self, x):\n        """Doc."""\n        return x  # why\n'
    assert same_code("m.py", py, "    def f(self, x):\n        return x\n")
    assert not same_code("m.py", py, py.replace("return x", "return -x"))
    assert not same_code("notes.txt", "a", "a")  # a file the index does not read: unknown, not the same
    # what a formatter changes in Python (brackets, quotes, a wrapped call) is the same code too
    assert same_code("m.py", "def g(a):\n    return (a + 'x')\n", 'def g(a):\n    return a + "x"\n')
    assert same_code(
        "m.py", "def g(a):\n    return h(a, 1)\n", "def g(a):\n    return h(\n        a,\n        1,\n    )\n"
    )
    assert not same_code("m.py", "def g(a):\n    return (a + 1) * 2\n", "def g(a):\n    return a + 1 * 2\n")
    assert not same_code("m.py", "def g(a:\n", "def g(a:\n")  # does not parse: not known to be the same
