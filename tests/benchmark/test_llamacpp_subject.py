"""The llama.cpp subject: the sdist's vendored llama.cpp, pruned to its CPU build; case repos on it
build per commit (a one-file change rebuilds fast), and a commit that does not compile is a clear
error naming the file. The end-to-end test builds llama.cpp for real (minutes): slow."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import tomli_w

from benchmark.authoring.patches import Step, write_patches
from benchmark.build import build_case_repo, git
from benchmark.subjects import SubjectError, get_subject
from benchmark.subjects.llamacpp import kept
from tools.engines.funccov import has_python_source
from tools.engines.llamacpp.build import BuildError, build_root, build_tree
from tools.engines.protocol import RunJob
from tools.engines.runner import run_engine
from tools.hypotheses.verify import function_text, restore_function
from tools.probe.checkpoints import ensure_checkpoint
from tools.scenario import from_dict
from tools.source.index import open_index

OPS = "ggml/src/ggml-cpu/ops.cpp"
RMS_NORM = "ggml_compute_forward_rms_norm_f32"
GOOD_LINE = "const float scale = 1.0f/sqrtf(mean + eps);"


def test_the_pruned_tree_keeps_the_cpu_build_and_drops_the_rest():
    for path in ("CMakeLists.txt", "src/llama.cpp", "ggml/src/ggml.c", "ggml/src/ggml-cpu/ops.cpp", OPS):
        assert kept(path), path
    assert kept("ggml/src/ggml-cpu/arch/x86/quants.c") and kept("vendor/hash/sha1/sha1.c")
    assert kept("ggml/include/ggml-cuda.h")  # headers the core includes behind #ifdefs
    for path in ("ggml/src/ggml-cuda/ggml-cuda.cu", "models/ggml-vocab-llama-bpe.gguf", "tools/server/server.cpp"):
        assert not kept(path), path
    assert not kept("examples/simple/simple.cpp") and not kept("vendor/cpp-httplib/httplib.cpp")


def test_an_unreachable_sdist_is_a_clear_subject_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DIFFDX_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline, and nothing cached: pip cannot have it
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(SubjectError, match="subject 'llama.cpp' is unavailable: cannot download"):
        get_subject("llama.cpp")


def engine_job() -> RunJob:
    sc = from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "llama.cpp", "dtype": "float32"},
            "workload": {"requests": [{"prompt_ids": [1, 5, 9], "max_tokens": 2}]},
        }
    )
    return RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)), taps=[])


def object_times() -> dict[str, int]:
    """Object file -> mtime in the build slot (where build_tree compiles)."""
    return {p.name: p.stat().st_mtime_ns for p in (build_root() / "slots" / "0" / "build").rglob("*.o")}


def write_case(cases: Path, case_id: str, new_line: str) -> Path:
    """A one-commit case on the subject: the rms_norm line of ggml's CPU backend replaced."""
    folder = cases / case_id
    folder.mkdir(parents=True)
    meta = {"id": case_id, "issue_number": 1, "subject": "llama.cpp", "category": "numerics", "title": case_id}
    meta["modeled_on"] = ["ggml-org/llama.cpp#1"]
    (folder / "case.toml").write_text(tomli_w.dumps(meta))
    (folder / "issue.md").write_text("RMSNorm outputs blow up on all-zero rows.\n")
    repro = {"model": {"arch": "llama", "seed": 0}, "target": {"engine": "llama.cpp", "dtype": "float32"}}
    repro["workload"] = {"requests": [{"prompt_ids": [1, 2, 3], "max_tokens": 2}]}
    (folder / "repro.toml").write_text(tomli_w.dumps(repro))
    truth = {"file": OPS, "function": RMS_NORM, "commit": "01-rms-norm", "component": "norm", "mechanism": "eps"}
    (folder / "truth.toml").write_text(tomli_w.dumps(truth))
    step = Step("ggml-cpu: simplify rms_norm", "A Dev <dev@example.com>", "2025-08-01T10:00:00+00:00",
                [(OPS, GOOD_LINE, new_line)], slug="rms-norm")  # fmt: skip
    write_patches("llama.cpp", [step], folder)
    return folder


@pytest.mark.slow
def test_case_repos_build_per_commit_and_a_broken_commit_names_its_file(tmp_path):
    repo = build_case_repo(write_case(tmp_path / "cases", "lc-rms", GOOD_LINE.replace(" + eps", "")), tmp_path / "r")
    assert not has_python_source(str(repo))  # Python-only evidence is skipped on it (worker.native_trees)
    base = tmp_path / "base"
    git(repo, "worktree", "add", "-q", "--detach", str(base), "base")
    started = time.monotonic()
    base_libs = build_tree(base)
    first, objects = time.monotonic() - started, object_times()
    started = time.monotonic()
    head_libs = build_tree(repo)  # another worktree, one file changed: the slot recompiles that file
    print(f"llama.cpp subject: first build {first:.0f}s, one-file-change rebuild {time.monotonic() - started:.0f}s")
    assert (head_libs / "libllama.so").exists() and head_libs != base_libs
    after = object_times()
    assert sorted(name for name, t in after.items() if objects.get(name) != t) == ["ops.cpp.o"]

    for tree, libs in ((base, base_libs), (repo, head_libs)):  # the runner's hook hands the worker its tree's build
        assert Path(run_engine(engine_job(), tree).meta["source"]).parent == libs

    changes = open_index(repo).symbols_for_hunks(git(repo, "diff", "base", "HEAD"))
    assert [(c.file, c.symbol.qualname) for c in changes if c.symbol] == [(OPS, RMS_NORM)]
    old = open_index(repo, commit="base").find(RMS_NORM)[0]
    assert restore_function(repo, OPS, RMS_NORM, open_index(repo, commit="base").read(old))
    assert GOOD_LINE in (function_text(repo, OPS, RMS_NORM) or "")
    assert build_tree(repo) == base_libs  # restored = base's content: its cached build, no compile

    broken = write_case(tmp_path / "cases", "lc-broken", GOOD_LINE.replace("eps", "epsilon"))
    with pytest.raises(BuildError, match=rf"{OPS}:\d+: .*epsilon"):
        build_tree(build_case_repo(broken, tmp_path / "broken"))
