"""Tree zygotes (issue 14): the runs of a tree that holds its own heavy package are forked from a
zygote that imported that package from the tree once; a tree that changed, fails to import or
hangs in its import gets none, and its runs behave as before (a crash is a crash, a hang a timeout)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

import tools.engines as engines
from tests.tools.engines.test_runner import run_folders, tiny_job
from tools.engines import runner
from tools.engines.runner import EngineRunError, run_engine

PACKAGE = """
import os, time

def register(name):
    return name

KIND = register("fake")
open(os.environ["FAKEENG_LOG"], "a").write(f"{os.getpid()}\\n")
"""


@pytest.fixture
def fake_tree(tmp_path, monkeypatch):
    """A tree holding its own `fakeeng`, preloaded for tinyserve runs (which never import it
    themselves: what a run gets of it shows only in its coverage and in the import log)."""
    monkeypatch.setenv("DIFFDX_FORKSERVER", "1")
    monkeypatch.setenv("FAKEENG_LOG", str(tmp_path / "imports.txt"))
    monkeypatch.setattr(engines, "TREE_PRELOAD", {"fakeeng": ("tinyserve", ("fakeeng",))})
    monkeypatch.setattr(runner, "_TREE_SERVERS", {})
    tree = tmp_path / "tree"
    (tree / "fakeeng").mkdir(parents=True)
    (tree / "fakeeng" / "__init__.py").write_text(PACKAGE)
    yield tree
    for server, *_ in runner._TREE_SERVERS.values():
        server.stop()


def imports(tmp_path) -> list[int]:
    log = tmp_path / "imports.txt"
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def covered_job(tree):
    job = tiny_job()
    job.coverage_root = str(tree)
    return job


IMPORT_TIME = {"fakeeng/__init__.py:<module>", "fakeeng/__init__.py:register"}


def test_runs_of_a_tree_fork_from_its_zygote_and_record_its_import(tmp_path, fake_tree):
    runner.prestart([fake_tree])
    for _ in range(2):
        trace = run_engine(covered_job(fake_tree), fake_tree, workdir=tmp_path)
        # a fresh import inside the run would have recorded these: the zygote's record is handed on
        assert IMPORT_TIME <= set(trace.meta["coverage"])
    ((server, *_),) = runner._TREE_SERVERS.values()
    assert imports(tmp_path) == [server.proc.pid]  # imported once, by the zygote
    assert run_folders(tmp_path) == []


def test_a_finished_diagnosis_stops_the_zygotes_of_its_trees_only(tmp_path, fake_tree):
    other = tmp_path / "case" / "tree"
    shutil.copytree(fake_tree, other)
    runner.prestart([fake_tree, other])
    servers = {
        Path(entry[0].tree).name + Path(entry[0].tree).parent.name: entry[0] for entry in runner._TREE_SERVERS.values()
    }
    assert len(servers) == 2
    mine, kept = servers["treecase"], servers[f"tree{tmp_path.name}"]
    assert runner.stop_tree_zygotes(tmp_path / "case") == 1
    assert mine.proc is None and kept.proc is not None and kept.proc.poll() is None
    assert [entry[0] for entry in runner._TREE_SERVERS.values()] == [kept]


def test_a_tree_changed_after_its_zygote_started_is_imported_by_the_run(tmp_path, fake_tree):
    runner.prestart([fake_tree])
    (fake_tree / "fakeeng" / "__init__.py").write_text(PACKAGE + "CHANGED = True\n")
    trace = run_engine(covered_job(fake_tree), fake_tree, workdir=tmp_path)
    assert not IMPORT_TIME & set(trace.meta["coverage"])  # not forked from the tree zygote
    assert runner._TREE_SERVERS == {}


def test_a_tree_with_a_site_hook_gets_no_zygote(tmp_path, fake_tree):
    """A fresh run runs the tree's sitecustomize before anything imports the tree: no zygote may
    import the tree first."""
    (fake_tree / "sitecustomize.py").write_text("")
    runner.prestart([fake_tree])
    assert runner._TREE_SERVERS == {}


def test_a_tree_whose_import_fails_gets_no_zygote(tmp_path, fake_tree):
    (fake_tree / "fakeeng" / "__init__.py").write_text(PACKAGE + "raise RuntimeError('broken tree')\n")
    runner.prestart([fake_tree])
    trace = run_engine(covered_job(fake_tree), fake_tree, workdir=tmp_path)
    assert not IMPORT_TIME & set(trace.meta["coverage"]) and runner._TREE_SERVERS == {}


def test_a_tree_whose_import_hangs_times_out_as_a_run_would(tmp_path, fake_tree):
    (fake_tree / "fakeeng" / "__init__.py").write_text(PACKAGE + "time.sleep(600)\n")
    runner.prestart([fake_tree])
    started = time.monotonic()
    with pytest.raises(EngineRunError) as err:
        run_engine(tiny_job(), fake_tree, timeout=6, workdir=tmp_path)
    assert err.value.kind == "timeout" and time.monotonic() - started < 30
    assert runner._TREE_SERVERS == {} and run_folders(tmp_path) == []


def test_no_tree_zygote_when_zygotes_are_off(tmp_path, fake_tree, monkeypatch):
    monkeypatch.setenv("DIFFDX_FORKSERVER", "0")
    runner.prestart([fake_tree])
    assert runner._TREE_SERVERS == {} and os.environ["DIFFDX_FORKSERVER"] == "0"
