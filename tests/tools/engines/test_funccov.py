"""Function coverage: every recorder gives the set the former profile hook gave."""

from __future__ import annotations

import importlib
import sys
import threading

import pytest

from tools.engines.funccov import function_coverage

TREE = """
import threading

def called(x): return x + 1

def never(): return 0

def outer():
    def inner():
        return [i for i in range(3)]
    return inner()

class Box:
    def method(self):
        return called(1)

    def unused(self):
        return 2

def in_thread(box):
    t = threading.Thread(target=box.method)
    t.start()
    t.join()
"""


def run_tree(tmp_path, mode, monkeypatch):
    name = f"pkg_{mode}_{tmp_path.name}".replace("-", "_")  # a fresh import in every test
    pkg = tmp_path / "tree" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(TREE)
    monkeypatch.syspath_prepend(str(tmp_path / "tree"))
    monkeypatch.setenv("DIFFDX_COVERAGE", mode)
    with function_coverage(str(tmp_path / "tree")) as seen:
        mod = importlib.import_module(f"{name}.mod")
        mod.outer()
        mod.Box().method()
    return {q for f, q in seen if f.endswith("mod.py")}


@pytest.mark.parametrize("mode", ["calls", "coverage"])
def test_recorders_agree_with_the_profile_hook(tmp_path, monkeypatch, mode):
    if mode == "coverage":
        pytest.importorskip("coverage")
    expected = run_tree(tmp_path, "profile", monkeypatch)
    assert expected == {"<module>", "called", "outer", "outer.inner", "outer.inner.<listcomp>", "Box", "Box.method"}
    assert run_tree(tmp_path, mode, monkeypatch) == expected


def test_functions_run_in_threads_are_seen(tmp_path, monkeypatch):
    """The profile hook saw the main thread only; the call hook follows threads the engine starts."""
    pkg = tmp_path / "t" / "pkg_threads"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(TREE)
    monkeypatch.syspath_prepend(str(tmp_path / "t"))
    monkeypatch.delenv("DIFFDX_COVERAGE", raising=False)
    mod = importlib.import_module("pkg_threads.mod")
    with function_coverage(str(tmp_path / "t")) as seen:
        mod.in_thread(mod.Box())
    assert {q for _, q in seen} == {"in_thread", "Box.method", "called"}
    assert sys.gettrace() is None and threading.gettrace() is None


def test_no_root_records_nothing():
    with function_coverage(None) as seen:
        len([1])
    assert seen == set()
