"""The order benchmark.run starts cases in: costliest first, from what a diagnosis may see or an earlier run."""

from __future__ import annotations

import json

from benchmark.cases import load_cases
from benchmark.run import cpu_line, cpu_summary
from benchmark.schedule import cost_prior, costliest_first, previous_costs, prior_cpu_s


def test_bundled_cases_start_with_compiled_repros_and_end_with_tinyserve():
    cases = load_cases()
    order = [c.id for c in costliest_first(cases)]
    compiled = {c.id for c in cases if c.scenario.target.options.get("compile")}
    assert compiled and set(order[: len(compiled)]) == compiled
    first = {c.id: i for i, c in enumerate(costliest_first(cases))}
    real = [first[c.id] for c in cases if c.track == "real"]
    plain_tinyserve = [first[c.id] for c in cases if c.subject == "tinyserve" and c.id not in compiled]
    assert max(real) < min(plain_tinyserve), "a release-history case never waits behind a tinyserve one"
    assert sorted(order) == sorted(c.id for c in cases), "every case once"
    assert all(prior_cpu_s(c) == cost_prior()["compile"] for c in cases if c.id in compiled)


def test_an_earlier_run_s_figures_beat_the_prior_and_ties_keep_the_given_order(tmp_path):
    cases = [c for c in load_cases() if c.subject == "tinyserve" and c.track == "hard"][:4]
    earlier = {"cases": [{"case": cases[2].id, "cpu_s": 900.0, "wall_s": 10.0}, {"case": cases[3].id, "wall_s": 1.0}]}
    (tmp_path / "results.json").write_text(json.dumps(earlier))
    previous = previous_costs(tmp_path / "results.json")
    assert previous == {cases[2].id: 900.0, cases[3].id: 1.0}, "CPU when measured, else wall"
    assert [c.id for c in costliest_first(cases, previous)] == [cases[i].id for i in (2, 0, 1, 3)]


def test_cpu_summary_projects_the_quiet_wall_from_the_total_or_the_longest_case():
    spread = cpu_summary([100.0, 100.0, 100.0, 100.0], workers=2)
    assert (spread["total_s"], spread["per_case_s"], spread["projected_quiet_wall_s"]) == (400.0, 100.0, 200.0)
    one_long = cpu_summary([900.0, 10.0, 10.0], workers=2)
    assert one_long["projected_quiet_wall_s"] == 900.0, "the longest case bounds the wall from below"
    line = cpu_line(spread)
    assert line.startswith("CPU s total / per case: 400.0 / 100.0") and "3.3 min" in line
    assert cpu_summary([], workers=2)["total_s"] == 0.0 and cpu_line(None) == ""
