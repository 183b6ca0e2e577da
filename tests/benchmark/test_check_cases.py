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
