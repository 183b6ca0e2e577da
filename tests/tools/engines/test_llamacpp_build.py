"""Building a llama.cpp tree (tools/engines/llamacpp/build.py), on a tiny real CMake project laid out
as llama.cpp is (include/llama.h, a `llama` target linking a `ggml` one, libraries in bin/): the
same cmake + ninja + ccache calls, cache, slots, lock and error reporting, in seconds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.engines import worker_vars
from tools.engines.llamacpp.build import BuildError, build_tree, first_error, llama_root, tree_hash, worker_env
from tools.engines.runner import DIFFDX_ROOT, EngineRunError

pytestmark = pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("ninja")), reason="needs cmake and ninja")

CMAKE = """cmake_minimum_required(VERSION 3.14)
project(tiny C)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_library(ggml SHARED src/ggml.c)
add_library(llama SHARED src/llama.c)
target_include_directories(llama PUBLIC include)
target_link_libraries(llama PRIVATE ggml)
"""
GGML = "int ggml_add(int a, int b) { return a + b; }\n"
LLAMA = '#include "llama.h"\nint ggml_add(int a, int b);\nint llama_answer(void) { return ggml_add(40, 2); }\n'
ADAPTER = "llama.cpp"  # the engine whose adapter module holds the hook


def tiny_tree(path: Path, ggml: str = GGML, llama: str = LLAMA) -> Path:
    files = {"CMakeLists.txt": CMAKE, "include/llama.h": "int llama_answer(void);\n", "src/ggml.c": ggml}
    files["src/llama.c"] = llama
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DIFFDX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def answer(libs: Path) -> int:
    """llama_answer() of a build, loaded in a fresh process: the loader would reuse a libggml.so
    already loaded here (same soname) instead of the one next to this libllama.so."""
    code = f"import ctypes; print(ctypes.CDLL({str(libs / 'libllama.so')!r}).llama_answer())"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_a_tree_builds_once_into_libraries_that_load_where_they_lie(tmp_path, cache):
    libs = build_tree(tiny_tree(tmp_path / "a"))
    assert answer(libs) == 42  # libllama finds its libggml next to it ($ORIGIN), not in the slot
    assert json.loads((libs / "build.json").read_text())["tree"] == str(tmp_path / "a")
    same = build_tree(shutil.copytree(tmp_path / "a", tmp_path / "elsewhere"))  # same content, other path
    assert same == libs and json.loads((libs / "build.json").read_text())["tree"] == str(tmp_path / "a")


def test_a_one_file_change_recompiles_that_file_only(tmp_path, cache):
    build_tree(tiny_tree(tmp_path / "a"))
    objects = {p.name: p.stat().st_mtime_ns for p in (cache / "llamacpp/slots/0/build").rglob("*.o")}
    changed = build_tree(tiny_tree(tmp_path / "b", ggml=GGML.replace("a + b", "a + b + 1")))
    after = {p.name: p.stat().st_mtime_ns for p in (cache / "llamacpp/slots/0/build").rglob("*.o")}
    assert answer(changed) == 43
    assert after["llama.c.o"] == objects["llama.c.o"] and after["ggml.c.o"] != objects["ggml.c.o"]


def test_two_workers_asking_for_one_tree_build_it_once(tmp_path, cache):
    trees = [tiny_tree(tmp_path / "a"), shutil.copytree(tmp_path / "a", tmp_path / "b")]
    cmd = [sys.executable, "-m", "tools.engines.llamacpp.build"]
    env = {"PYTHONPATH": str(DIFFDX_ROOT), "DIFFDX_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([*cmd, str(t)], env=env, stdout=subprocess.PIPE, text=True) for t in trees]
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and outs[0] == outs[1]
    assert not (cache / "llamacpp/slots/1").exists()  # the second waited on the lock, took no slot


def test_a_compile_error_names_the_file_and_is_an_engine_crash(tmp_path, cache):
    tree = tiny_tree(tmp_path / "bad", llama=LLAMA.replace("ggml_add(40, 2)", "ggml_add(40, two)"))
    with pytest.raises(BuildError, match=r"src/llama\.c:3: .*two") as first:
        build_tree(tree)
    shutil.rmtree(cache / "llamacpp" / "slots")
    with pytest.raises(BuildError) as again:  # the same content fails the same way, without a build
        build_tree(tree)
    assert str(again.value) == str(first.value) and not (cache / "llamacpp" / "slots").exists()
    with pytest.raises(EngineRunError, match=r"src/llama\.c:3") as crash:
        worker_vars(ADAPTER, tree)  # the runner's hook, as the worker env asks it
    assert crash.value.kind == "crash" and "error" in crash.value.log


def test_the_hook_points_the_worker_at_the_trees_build(tmp_path, cache):
    tree = tiny_tree(tmp_path / "a")
    assert worker_env(tree) == {"LLAMA_CPP_LIB_PATH": str(build_tree(tree))}
    assert worker_env(tmp_path / "cache") == {} and worker_vars(ADAPTER, None) == {}  # no llama.cpp tree: none


def test_the_hash_follows_content_not_paths_or_build_folders(tmp_path, cache):
    a, b = tiny_tree(tmp_path / "a"), tiny_tree(tmp_path / "b")
    (b / "build").mkdir()
    (b / "build" / "junk.o").write_text("x")
    (b / ".git").write_text(f"gitdir: {tmp_path}/repo/.git/worktrees/b\n")  # as in a git worktree
    assert tree_hash(llama_root(a)) == tree_hash(llama_root(b))
    (b / "src" / "ggml.c").write_text(GGML + "\n")
    assert tree_hash(llama_root(a)) != tree_hash(llama_root(b))
    assert llama_root(tmp_path) is None


def test_first_error_reads_gcc_and_cmake_failures():
    log = (
        "[1/4] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o\n"
        "FAILED: ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o\n"
        "/c/slots/0/src/ggml/src/ggml.c: In function 'ggml_add':\n"
        "/c/slots/0/src/ggml/src/ggml.c:120:5: error: 'y' undeclared (first use in this function)\n"
        "/c/slots/0/src/ggml/src/ggml.c:130:5: error: second one\n"
    )
    assert (
        first_error(log, Path("/c/slots/0/src")) == "ggml/src/ggml.c:120: 'y' undeclared (first use in this function)"
    )
    cmake = "CMake Error at ggml/src/CMakeLists.txt:12 (add_library):\n  Cannot find source file:\n"
    assert first_error(cmake, Path("/x")) == "ggml/src/CMakeLists.txt:12: Cannot find source file:"
    assert first_error("ld: something broke\n", Path("/x")) == "ld: something broke"
