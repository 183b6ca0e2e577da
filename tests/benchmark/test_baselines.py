"""Baselines' source-only ranking (pure parts)."""

from pathlib import Path

from benchmark.baselines import rank_by_text, words
from tools.source.index import open_index


def test_words_split_identifiers_and_drop_noise():
    assert words("BlockManager.allocate_slots is the prefix_cache") == [
        "block",
        "manager",
        "allocate",
        "slots",
        "prefix",
        "cache",
    ]


def test_rank_by_text_prefers_functions_named_like_the_issue(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "sampler.py").write_text(
        "def apply_repetition_penalty(x):\n    return x\n\n\ndef unrelated_helper(y):\n    return y\n"
    )
    (tmp_path / "pkg" / "cache.py").write_text("def evict_block(b):\n    return b\n")
    index = open_index(tmp_path, include_tests=False)
    ranked = rank_by_text(index, "Output repeats itself when I set a repetition penalty in the sampler")
    assert ranked[0][1].qualname == "apply_repetition_penalty"
    assert all(sym.qualname != "evict_block" for _, sym in ranked)  # shares no word with the issue


def test_revert_recent_sees_the_functions_each_recent_commit_changed(tmp_path: Path):
    """revert-recent's window: last N commits or all since `base`, newest first, each function
    credited to the newest commit that changed it."""
    import subprocess

    from benchmark.baselines import changed_functions, recent_commits

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    src = tmp_path / "ops.py"
    bodies = ["def scale(x):\n    return x * 2\n\n\ndef shift(x):\n    return x + 1\n"]
    bodies.append(bodies[0].replace("x * 2", "x * 3"))
    bodies.append(bodies[1].replace("x + 1", "x + 2"))
    bodies.append(bodies[2].replace("x * 3", "x * 4"))
    for i, body in enumerate(bodies):
        src.write_text(body)
        git("add", "-A")
        git("commit", "-qm", f"c{i}")
        if i == 0:
            git("tag", "base")
    assert [c.subject for c in recent_commits(tmp_path, 2)] == ["c3", "c2"]
    assert [c.subject for c in recent_commits(tmp_path, 12)] == ["c3", "c2", "c1"]  # the root snapshot is no change
    window = recent_commits(tmp_path, None)
    assert [c.subject for c in window] == ["c3", "c2", "c1"]
    changed = changed_functions(tmp_path, open_index(tmp_path, include_tests=False), window)
    assert {k: age for k, (age, _) in changed.items()} == {("ops.py", "scale"): 0, ("ops.py", "shift"): 1}


def _git_repo(root: Path, versions: list[dict[str, str]]) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    for i, files in enumerate(versions):
        for name, text in files.items():
            (root / name).write_text(text)
        subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
        subprocess.run(
            ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{i}"], check=True
        )


OPS_C = "float scale(float x) {\n    return x * 2.0f;\n}\n\nfloat shift(float x) {\n    return x + 1.0f;\n}\n"
MODEL_PY = "def load(x):\n    return x\n\n\ndef unused(x):\n    return x\n"


def test_revert_recent_restores_what_coverage_cannot_see(tmp_path: Path):
    """Regression (0.00 on every llama.cpp case: only functions with Python coverage were kept, and a
    C/C++ tree has none): functions in a language the record does not cover are restored too, and a
    restore that would change only comments is not run (no rebuild, no engine run)."""
    from benchmark.baselines import changed_functions, recent_commits, restore_and_probe, restore_plan
    from benchmark.cases import CaseInput
    from tools.hypotheses.coverage import Coverage
    from tools.probe.prober import Prober
    from tools.scenario import from_dict

    base = {"ops.c": OPS_C, "model.py": MODEL_PY}
    later = {"ops.c": OPS_C.replace("x * 2.0f;", "x * 2.0f;  // doubled").replace("+ 1.0f", "- 1.0f")}
    _git_repo(tmp_path, [base, later, {"model.py": MODEL_PY.replace("return x", "return -x")}])
    changed = changed_functions(tmp_path, open_index(tmp_path, include_tests=False), recent_commits(tmp_path, 12))
    assert [(key, state) for _, key, state in restore_plan(changed, None)] == [
        (("model.py", "load"), None), (("model.py", "unused"), None), (("ops.c", "scale"), None),
        (("ops.c", "shift"), None),
    ]  # fmt: skip
    mixed = restore_plan(changed, Coverage(frozenset({"model.py:load"})))  # Python recorded, C unknown
    assert [(key, state) for _, key, state in mixed] == [
        (("model.py", "load"), True), (("ops.c", "scale"), None), (("ops.c", "shift"), None),
    ]  # fmt: skip
    scenario = from_dict({"model": {"arch": "llama"}, "target": {"engine": "transformers"}, "workload": {"requests": [{"prompt_ids": [1, 2], "max_tokens": 2}]}})  # fmt: skip
    case = CaseInput("t", 1, "s", "t", "", scenario, tmp_path)
    prober = Prober()
    assert restore_and_probe(case, prober, "HEAD~2", changed[("ops.c", "scale")][1]) == "same code"
    assert prober.engine_runs == 0
