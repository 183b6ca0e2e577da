"""The compiled-code cache: two copies of a tree at different paths compile each file once, and each
copy's code names its own path (tracebacks, coverage and source reading depend on it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

IMPORTER = textwrap.dedent(
    """
    import json, sys, traceback
    from pathlib import Path
    from tools.engines import codecache

    codecache.install(Path(sys.argv[1]))
    sys.path.insert(0, sys.argv[2])
    import subject.ops as ops
    try:
        ops.fail()
    except ZeroDivisionError as e:
        where = traceback.extract_tb(e.__traceback__)[-1].filename
    print(json.dumps({"file": ops.fail.__code__.co_filename, "raised_in": where, "value": ops.VALUE}))
    """
)


def make_tree(root: Path, value: int) -> Path:
    (root / "subject").mkdir(parents=True)
    (root / "subject" / "__init__.py").write_text("")
    (root / "subject" / "ops.py").write_text(f"VALUE = {value}\n\n\ndef fail():\n    return 1 / 0\n")
    return root


def import_from(tree: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTER, str(cache), str(tree)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


def entries(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if not p.name.startswith(".tmp-")}


def test_copies_share_compiled_code_but_keep_their_own_paths(tmp_path):
    cache = tmp_path / "cache"
    first = import_from(make_tree(tmp_path / "a", 1), cache)
    cached = entries(cache)
    assert len(cached) == 2  # __init__.py and ops.py, compiled once
    second = import_from(make_tree(tmp_path / "b", 1), cache)
    assert entries(cache) == cached  # the second copy compiled nothing
    assert first["file"] == str(tmp_path / "a" / "subject" / "ops.py") == first["raised_in"]
    assert second["file"] == str(tmp_path / "b" / "subject" / "ops.py") == second["raised_in"]
    assert not list((tmp_path / "b").rglob("*.pyc"))  # nothing written next to the tree under test


def test_a_changed_file_compiles_anew_and_a_torn_entry_is_replaced(tmp_path):
    cache = tmp_path / "cache"
    assert import_from(make_tree(tmp_path / "a", 1), cache)["value"] == 1
    before = entries(cache)
    assert import_from(make_tree(tmp_path / "b", 2), cache)["value"] == 2  # ops.py changed, __init__ did not
    assert len(entries(cache) - before) == 1
    for entry in cache.iterdir():
        entry.write_bytes(b"torn")
    assert import_from(make_tree(tmp_path / "c", 2), cache)["value"] == 2
    torn = [entry for entry in cache.iterdir() if entry.read_bytes() == b"torn"]
    assert len(torn) == 1  # tree c's two files were compiled again; only a's ops.py, unused, is left torn
