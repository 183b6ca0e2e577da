"""`python -m benchmark.check_cases`: case selection by id and pattern, and a real sweep of a
bundled case's bug alone (its repo built, the culprit cherry-picked, real engine workers)."""

from __future__ import annotations

import json

import pytest

from benchmark import check_cases
from tools.errors import BadInput


def test_cases_are_chosen_by_id_pattern_and_subject():
    everything = check_cases.select(None, [], None)
    ids = [c.id for c in check_cases.select(None, ["ts-prefix-hash-chain", "tf-*"], None)]
    assert set(ids) == {"ts-prefix-hash-chain"} | {c.id for c in everything if c.id.startswith("tf-")}
    assert len(ids) > 2
    tinyserve = check_cases.select(None, [], ["tinyserve"])
    assert 0 < len(tinyserve) < len(everything) and {c.subject for c in tinyserve} == {"tinyserve"}


def test_a_pattern_matching_no_case_is_bad_input():
    with pytest.raises(BadInput, match="no case matches ts-no-such-case"):
        check_cases.select(None, ["ts-no-such-case"], None)


@pytest.mark.slow
def test_a_bug_alone_fails_a_cell_and_a_matrix_without_its_trigger_misses_it(tmp_path, capsys):
    """The prefix-cache bug: caught by the staggered workload with prefix caching on; a matrix
    without prefix caching runs its cell and misses it (the same in-process Prober for both)."""
    caught = tmp_path / "caught.toml"
    caught.write_text(
        'arch = ["llama"]\ndtype = ["float32"]\nfeatures = ["prefix_caching"]\nworkload = ["staggered"]\n'
    )
    missed = tmp_path / "missed.toml"
    missed.write_text('arch = ["llama"]\ndtype = ["float32"]\nfeatures = ["none"]\nworkload = ["long"]\n')
    for matrix, out in ((caught, tmp_path / "a"), (missed, tmp_path / "b")):
        assert check_cases.main(["ts-prefix-hash-chain", "--matrix", str(matrix), "--out", str(out)]) == 0
    (a,) = json.loads((tmp_path / "a" / "check_cases.json").read_text())
    (b,) = json.loads((tmp_path / "b" / "check_cases.json").read_text())
    assert a["caught_by"] == "llama-float32-prefix_caching-staggered" and a["cells_run"] == 1
    assert a["tree"] == "culprit commit (good history before it)" and a["first_tap"]
    assert b["caught_by"] is None and b["cells_run"] == 1
    printed = capsys.readouterr().out
    assert "caught 1/1" in printed and "caught 0/1" in printed and "MISSED" in printed
    junit = (tmp_path / "a" / "ts-prefix-hash-chain" / "junit.xml").read_text()
    assert "<failure" in junit


def test_cases_not_swept_here_get_an_na_row_with_the_reason(tmp_path, capsys):
    """Never silently dropped: a release history (without --releases) and a skipped subject are
    rows with a reason, outside the caught share."""
    everything = check_cases.select(None, [], None)
    release = next(c for c in everything if c.releases is not None)
    native = next(c for c in everything if c.subject not in ("tinyserve", "transformers"))
    out = tmp_path / "out"
    assert check_cases.main([release.id, native.id, "--skip-subject", native.subject, "--out", str(out)]) == 0
    rows = {r["case"]: r for r in json.loads((out / "check_cases.json").read_text())}
    assert rows[release.id]["verdict"] == "n/a" and "release" in rows[release.id]["reason"]
    assert rows[native.id]["verdict"] == "n/a" and "--skip-subject" in rows[native.id]["reason"]
    printed = capsys.readouterr().out
    assert "caught 0/0" in printed and "2 n/a" in printed


@pytest.mark.slow
def test_an_errored_cell_is_a_catch_only_where_the_tree_before_the_bug_runs_it(tmp_path):
    """A commit that makes the engine fail at start: its error is the bug's (the tree before it runs
    the same cell and agrees). An option every tree refuses errors on both: not a catch, and the row
    says why; with no tree before the bug an error cannot be told from the engine's own failure."""
    from benchmark.build import git
    from tests.faults_tinyserve import Fault, faulty_tree
    from tools.probe.prober import Prober
    from tools.scenario import from_dict
    from tools.sweep.group import CellResult
    from tools.sweep.matrix import Cell

    crash = Fault(
        "tinyserve/engine/llm_engine.py",
        "        self.detokenizer = Detokenizer(self.tokenizer)\n",
        "        self.detokenizer = Detokenizer(self.tokenizer)\n        raise RuntimeError('blocks miscounted')\n",
    )
    tree = faulty_tree(tmp_path / "tree", [(crash, 0)])
    git(tree, "worktree", "add", "-q", "--detach", str(tmp_path / "before"), "HEAD^")
    spec = {
        "model": {"arch": "llama", "seed": 0},
        "workload": {"requests": [{"prompt_ids": [1, 5, 9], "max_tokens": 3}]},
    }
    plain = from_dict({**spec, "target": {"engine": "tinyserve", "dtype": "float32"}})
    refused = from_dict({**spec, "target": {"engine": "tinyserve", "dtype": "float32", "options": {"no_such": 1}}})
    errored = CellResult(Cell("llama", "float32", "none", "staggered"), "error", 1.0, "engine failed")
    prober = Prober()
    row: dict = {}
    stops = check_cases.error_rule(prober, lambda: tmp_path / "before", row)
    assert stops(errored, plain) is True and "errors_not_counted" not in row
    assert stops(errored, refused) is False
    (note,) = row["errors_not_counted"]
    assert note["cell"] == errored.cell.id
    assert note["why"].startswith("the tree before the bug fails there too (") and "no_such" in note["why"]
    no_history: dict = {}
    assert check_cases.error_rule(prober, lambda: None, no_history)(errored, plain) is False
    assert "no tree before the bug" in no_history["errors_not_counted"][0]["why"]
    diverged = CellResult(errored.cell, "diverge", 1.0, "at logits")
    assert check_cases.error_rule(prober, lambda: None, {})(diverged, plain) is True
