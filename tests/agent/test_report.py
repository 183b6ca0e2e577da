"""report.json keeps docs/design.md §5; report.md and divergence.png are written from the same data."""

import json

import torch

from tests.agent.helpers import candidates, scenario
from tools.hypotheses.evidence import Culprit, DrillDown, Reproduction, Trial
from tools.probe.compare import THRESHOLD, Divergence, summarize
from tools.probe.prober import ProbeResult
from tools.report import (
    COST_KEYS,
    HYPOTHESIS_EXTRAS,
    HYPOTHESIS_KEYS,
    REPORT_KEYS,
    build_report,
    check_report,
    divergence_series,
    render_markdown,
    write_report,
)

COST = {"engine_runs": 14, "llm_calls": 2, "tokens_in": 30, "tokens_out": 9, "wall_s": 3.5}


def stat(tap, request, ratios):
    n = len(ratios)
    return summarize(tap, request, list(range(n)), [0] * n, torch.tensor(ratios, dtype=torch.float64))


def probe():
    stats = [
        stat("embed", 0, [1.0, 1.1]),
        stat("embed", 1, [1.0, 1.0]),
        stat("layers.0.attn.out", 0, [1.2, 1.0]),
        stat("layers.0.attn.out", 1, [1.0, 400.0]),
        stat("layers.0.out", 1, [1.0, 90.0]),
        stat("logits", 1, [1.0, 50.0]),
    ]
    first = Divergence("layers.0.attn.out", 0, [1], [1], [0], 400.0)
    return ProbeResult("float32", first, {1: 4}, [("layer 0", 400.0)], ["layers.0.attn.out"], 6, stats=stats)


def reproduction():
    return Reproduction(
        True,
        scenario(),
        probe(),
        [Trial("as given", False, "agree", 3), Trial("a batch of 4", True, "first divergence at …", 3)],
        "a batch of 4",
        "logic",
    )


def full_report(n_hyps=3):
    hyps = (candidates() * 3)[:n_hyps]
    drill = DrillDown("layers.0.attn.out", 0, "attention", "paged_attention", {"requests": [1]}, ["only request 1"])
    culprit = Culprit("a" * 40, "Speed up attention", "found", "diff", [("a" * 40, "bad")])
    return build_report(
        "1201",
        reproduction(),
        drill,
        culprit,
        hyps,
        COST,
        {"llm_fallbacks": [{"step": "rank", "reason": "timeout", "detail": "", "attempts": 2}]},
    )


def test_report_keeps_the_contract():
    r = full_report()
    assert check_report(r) == []
    assert list(r)[: len(REPORT_KEYS)] == list(REPORT_KEYS)
    assert r["first_divergence"] == {
        "tap": "layers.0.attn.out",
        "step": 0,
        "requests": [1],
        "positions": [1],
        "ratio": 400.0,
    }
    assert r["kernel"] == "paged_attention" and r["commit"] == {"sha": "a" * 40, "subject": "Speed up attention"}
    assert set(r["cost"]) == set(COST_KEYS)
    for i, h in enumerate(r["hypotheses"], 1):
        assert h["rank"] == i and set(HYPOTHESIS_KEYS) <= set(h) <= set(HYPOTHESIS_KEYS) | set(HYPOTHESIS_EXTRAS)
    assert r["trigger"] == "a batch of 4" and r["precision"] == "logic" and len(r["trials"]) == 2
    assert r["bisection"]["tested"] == [["a" * 40, "bad"]] and r["llm_fallbacks"][0]["reason"] == "timeout"
    assert json.loads(json.dumps(r)) == r


def test_at_most_five_hypotheses():
    assert len(full_report(n_hyps=9)["hypotheses"]) == 5


def test_not_reproduced_report():
    r = build_report(
        "9", Reproduction(False, scenario(), None, [Trial("as given", False, "agree", 3)]), None, None, [], COST
    )
    assert check_report(r) == [] and r["first_divergence"] is None and r["kernel"] is None
    assert "Not reproduced" in render_markdown(r)


def test_check_report_names_what_is_wrong():
    r = full_report()
    del r["cost"]
    assert check_report(r) == ["missing key 'cost'"]
    r = full_report()
    r["hypotheses"][1]["rank"] = 7
    assert any("hypothesis 2" in p for p in check_report(r))


def test_markdown_has_every_section():
    md = render_markdown(full_report())
    for text in (
        "# diffdx report: issue 1201",
        "## Trigger",
        "a batch of 4",
        "## First divergence",
        "layers.0.attn.out",
        "## Bisection",
        "Speed up attention",
        "## Hypotheses",
        "evidence: changed by the first bad commit",
        "## Cost",
        "14 engine runs",
        "rank (timeout)",
    ):
        assert text in md, text


def test_divergence_series_follows_execution_order():
    series = divergence_series(probe().stats)
    assert list(series) == [1]
    assert [t for t, _ in series[1]] == ["embed", "layers.0.attn.out", "layers.0.out", "logits"]
    assert series[1][1][1] == 400.0 and THRESHOLD < 400


def test_write_report_writes_three_files(tmp_path):
    paths = write_report(full_report(), tmp_path / "out", probe())
    assert set(paths) == {"json", "md", "png"}
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(paths["json"].read_text())["issue"] == "1201"
    assert not (tmp_path / "none").exists()
    assert set(write_report(full_report(), tmp_path / "none")) == {"json", "md"}


def test_what_ran_flags_an_engine_imported_from_outside_its_tree(tmp_path):
    """A target pointed at a tree but importing another copy did not test that tree: say so."""
    from tools.report import what_ran

    tree = tmp_path / "fork"
    (tree / "eng").mkdir(parents=True)
    runs = [
        {
            "role": "target",
            "engine": "eng",
            "dtype": "bfloat16",
            "source": str(tree),
            "imported": str(tree / "eng" / "__init__.py"),
        },
        {
            "role": "target",
            "engine": "eng",
            "dtype": "float32",
            "source": str(tree),
            "imported": "/usr/lib/site-packages/eng/__init__.py",
        },
        {"role": "reference", "engine": "transformers", "dtype": "float64", "source": None, "imported": None},
    ]
    ran = what_ran(runs, 4, tree)
    assert ran["failed"] == 1 and ran["target"]["dtypes"] == ["bfloat16", "float32"]
    assert ran["target"]["outside_source"] == ["/usr/lib/site-packages/eng/__init__.py"]
    assert ran["target_source"] == {"path": str(tree), "commit": None, "dirty": None}
    report = build_report("1", None, None, None, [], COST, {"ran": ran})
    assert "did not test that tree" in render_markdown(report)


def test_report_names_the_evidence_that_verified_and_shows_the_diff():
    hyps = candidates()
    diff = "--- a/ops.py\n+++ b/ops.py\n@@ -1 +1 @@\n-    mask = k < q\n+    mask = k <= q\n"
    hyps[0].verified, hyps[0].verified_by, hyps[0].verifying_diff = True, "fix-template", diff
    r = build_report("7", reproduction(), None, None, hyps, COST, {})
    assert r["hypotheses"][0]["verified_by"] == "fix-template" and r["hypotheses"][0]["verifying_diff"] == diff
    assert r["hypotheses"][1]["verified_by"] is None and check_report(r) == []
    md = render_markdown(json.loads(json.dumps(r)))
    assert f"`{hyps[0].function}` in `{hyps[0].file}` (verified by fix-template)" in md
    assert "```diff\n" + diff + "```" in md
    older = json.loads(json.dumps(r))  # a report written before these keys existed still renders
    for h in older["hypotheses"]:
        del h["verified_by"], h["verifying_diff"]
    assert "(verified by counterfactual)" in render_markdown(older)
