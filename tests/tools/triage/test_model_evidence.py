"""The shape features of an issue and the silent-vs-rest decision of the triage model (written texts only)."""

import numpy as np

from tools.triage import model as triage_model
from tools.triage.evidence import ENVIRONMENT_NAMES, NAMES, TAGS, shape, title_tag
from tools.triage.rules import LABELS

TRACEBACK = '```\nTraceback (most recent call last)\n  File "serve.py", line 3, in <module>\nValueError: bad shape\n```'


def named(title: str, body: str) -> dict[str, float]:
    values = shape(title, body)
    assert len(values) == len(NAMES)
    return dict(zip(NAMES, values))


def test_a_bare_bug_tag_over_a_traceback_is_read_as_shown_failure_not_shown_output():
    f = named("[Bug]", TRACEBACK)
    assert f["tag only"] == f["tag bug"] == f["traceback"] == f["exception named"] == f["has code"] == 1.0
    assert f["output shown"] == f["expected shown"] == f["title asks"] == 0.0


def test_wrong_output_asked_as_a_question_keeps_its_evidence():
    body = "Prompt: 2+2=\nOutput: 5\nExpected output: 4, but got 5 with the new backend, compared to the CPU one."
    f = named("Is the new backend supported?", body)
    assert f["title asks"] == f["title opens with an interrogative"] == 1.0
    assert f["expected shown"] == f["actual shown"] == f["expected and actual"] == 1.0
    assert f["output shown"] == f["prompt shown"] == f["comparison"] == 1.0
    assert f["traceback"] == 0.0 and f["tag only"] == 0.0


def test_size_script_and_tags():
    empty = named("Feature Request: longer context", "")
    assert empty["no body"] == 1.0 and empty["body length"] == 0.0 and empty["tag feature"] == 1.0
    assert named("模型输出有问题", "输出和参考实现不一致")["mostly CJK"] == 1.0
    assert title_tag("[Feature Request]: x") == "feature" and title_tag("[Docs] x") == "doc" and title_tag("x") == ""
    assert set(TAGS) >= {"bug", "usage", "feature", "question", "performance"}
    assert all(0.0 <= v <= 1.5 for v in shape("t", "x" * 100_000))


def test_silent_is_decided_against_the_rest_by_its_threshold():
    s = LABELS.index("silent")
    p = np.zeros(len(LABELS))
    p[s], p[LABELS.index("crash")], p[LABELS.index("question")] = 0.4, 0.45, 0.15
    assert triage_model.decide(p, 0.35) == s  # above the threshold: silent even when not the most probable
    assert triage_model.decide(p, 0.5) == LABELS.index("crash")
    assert triage_model.decide(p, None) == LABELS.index("crash")  # no threshold: the most probable
    p[s], p[LABELS.index("crash")] = 0.55, 0.3
    assert triage_model.decide(p, 0.6) == LABELS.index("crash")  # below it: the best other label


def test_with_the_gate_a_silent_answer_below_the_sure_threshold_needs_a_wrong_result_named():
    s, crash = LABELS.index("silent"), LABELS.index("crash")
    p = np.zeros(len(LABELS))
    p[s], p[crash], p[LABELS.index("question")] = 0.45, 0.4, 0.15
    assert triage_model.decide(p, (0.4, 0.6), wrong=True) == s  # a wrong result named: the lower threshold
    assert triage_model.decide(p, (0.4, 0.6), wrong=False) == crash  # none: the model alone must be sure
    p[s], p[crash] = 0.7, 0.15
    assert triage_model.decide(p, (0.4, 0.6), wrong=False) == s
    assert triage_model.decide(p, (0.4, 1.01), wrong=False) == crash  # 1.01: never silent without evidence
    assert triage_model.decide(p, 0.4, wrong=False) == s  # a plain threshold (weights without the gate) ignores it
    # what counts as a wrong result named: the rules see silent, or a wrong-result shape of the report
    assert triage_model.wrong_result("Output is garbage after upgrading", "The answer is wrong, expected 4 but got 5.")
    assert not triage_model.wrong_result("Server exits on start", TRACEBACK)
    assert triage_model.threshold_of({"silent_min": 0.4}) == 0.4
    assert triage_model.threshold_of({"silent_min": 0.35, "silent_sure": 0.5}) == (0.35, 0.5)
    assert triage_model.threshold_of({}) is None


def test_the_gate_is_chosen_with_the_threshold_and_rows_without_the_flag_count_as_evidenced():
    s, crash = LABELS.index("silent"), LABELS.index("crash")

    def row(p_silent: float, gold: int, wrong: bool) -> tuple[np.ndarray, int, bool]:
        p = np.full(len(LABELS), 1e-3)
        p[s], p[crash] = p_silent, 1.0 - p_silent
        return np.log(p), gold, wrong

    # silent issues name a wrong result; the confusable crashes at middling p(silent) do not
    rows = [row(q, s, True) for q in (0.35, 0.45, 0.6, 0.8, 0.9)] + [row(q, crash, False) for q in (0.4, 0.5, 0.1)]
    t, m = triage_model.choose_decision(rows)
    assert isinstance(m, tuple) and m[1] > 0.5 >= m[0]  # the crashes need a surer model; the silent ones do not
    f = triage_model.oof_figures(rows, t, m)
    assert f["silent_precision"] == f["silent_recall"] == 1.0
    plain = [(z, y) for z, y, _ in rows]  # no flag: every row counts as evidenced, the pair acts as its lower half
    assert triage_model.oof_figures(plain, t, m) == triage_model.oof_figures(plain, t, m[0])


def test_weights_without_the_shape_block_still_classify():
    issues = [
        {"title": f"[Bug] output is garbage {k}", "body": "Output: !!!!", "label": "silent"} for k in range(4)
    ] + [{"title": f"crash on start {k}", "body": TRACEBACK, "label": "crash"} for k in range(4)]
    w = triage_model.fit(issues, 4.0)
    n_text = len(w["word"]["idf"]) + len(w["char"]["idf"])
    assert len(w["coef"][0]) == n_text + len(LABELS) + len(NAMES)
    old = {k: v for k, v in w.items() if k != "evidence_scale"}
    old["coef"] = [row[: n_text + len(LABELS)] for row in w["coef"]]
    for weights in (w, old):
        c = triage_model.classify("[Bug] output is garbage", "Output: !!!!", triage_model._ready(weights))
        assert c.label == "silent" and 0.0 < c.confidence <= 1.0


def test_leave_one_split_out_scores_each_split_with_a_fit_on_the_others():
    kinds = [  # three labels: a two-label fit has one coefficient row (sklearn), the shipped model seven
        ("silent", "[Bug] output is garbage {k}", "Output: !!!!"),
        ("crash", "crash on start {k}", TRACEBACK),
        ("install", "pip install fails {k}", "building wheel failed: nvcc not found"),
    ]
    pool = [
        {"title": t.format(k=k), "body": b, "label": lab, "split": s}
        for s in ("a", "b", "c")
        for k in range(3)
        for lab, t, b in kinds
    ]
    rows = triage_model.leave_one_split_out(pool, 4.0)
    assert [r[1] for r in rows] == [LABELS.index(i["label"]) for i in pool]
    assert [r[2] for r in rows] == [triage_model.wrong_result(i["title"], i["body"]) for i in pool]
    without_b = triage_model._ready(triage_model.fit([i for i in pool if i["split"] != "b"], 4.0))
    k = next(n for n, i in enumerate(pool) if i["split"] == "b")
    assert np.allclose(rows[k][0], triage_model.logits_of(without_b, pool[k]))
    assert triage_model.oof_figures(rows, 1.0, 0.5)["accuracy"] == 1.0  # told apart out of split


def test_the_silent_threshold_has_the_best_min_of_precision_and_recall():
    # rows: (logits, gold). Silent issues with p(silent) spread low to high, rest issues a few of them confusable.
    s, crash = LABELS.index("silent"), LABELS.index("crash")

    def row(p_silent: float, gold: int) -> tuple[np.ndarray, int]:
        p = np.full(len(LABELS), 1e-3)
        p[s], p[crash] = p_silent, 1.0 - p_silent
        return np.log(p), gold

    rows = [row(q, s) for q in (0.22, 0.27, 0.33, 0.42, 0.52, 0.7, 0.9, 0.95)]
    rows += [row(q, crash) for q in (0.05, 0.1, 0.15, 0.21, 0.26, 0.3, 0.02)]
    t, m = triage_model.choose_decision(rows)
    chosen = triage_model.oof_figures(rows, t, m)
    for other in triage_model.SILENT_MIN_GRID:  # no threshold has a better min(P, R)
        assert triage_model.balanced(triage_model.oof_figures(rows, t, other)) <= triage_model.balanced(chosen)
    # recall alone would go lower (every silent issue found) at a precision the targets do not accept
    low = triage_model.oof_figures(rows, t, min(triage_model.SILENT_MIN_GRID))
    assert low["silent_recall"] > chosen["silent_recall"] and low["silent_precision"] < chosen["silent_precision"]


def _three_kind_pool(splits: tuple[str, ...]) -> list[dict]:
    kinds = [
        ("silent", "[Bug] output is garbage {k}", "Output: !!!!"),
        ("crash", "crash on start {k}", TRACEBACK),
        ("install", "pip install fails {k}", "building wheel failed: nvcc not found"),
    ]
    return [
        {"title": t.format(k=k), "body": b, "label": lab, "split": s}
        for s in splits
        for k in range(3)
        for lab, t, b in kinds
    ]


def test_the_setting_grid_scores_each_split_as_a_separate_fit_would():
    pool = _three_kind_pool(("a", "b", "c"))
    grid = [(4.0, 0.05, 1.0), (4.0, 0.05, 2.0)]
    rows = triage_model.leave_one_split_out_grid(pool, grid)
    plain = triage_model.leave_one_split_out(pool, 4.0, 0.05)
    # the grid's fits stop at a looser tolerance and keep unrounded weights: the same logits to a few 1e-3
    assert all(np.allclose(a, b, atol=5e-3) for (a, *_), (b, *_) in zip(rows[grid[0]], plain))
    s = LABELS.index("silent")
    p1 = [triage_model.softmax(z)[s] for z, y, _ in rows[grid[0]] if y == s]
    p2 = [triage_model.softmax(z)[s] for z, y, _ in rows[grid[1]] if y == s]
    assert all(b > a for a, b in zip(p1, p2))  # weighing `silent` twice raises p(silent) on silent issues


def test_settings_are_ordered_by_the_min_of_precision_and_recall():
    def f(p: float, r: float, acc: float = 0.9) -> dict:
        return {"silent_precision": p, "silent_recall": r, "accuracy": acc}

    lopsided, even, better = f(0.99, 0.90), f(0.93, 0.93), f(0.94, 0.95)
    order = sorted(
        [(better, (16.0, 0.05, 1.5)), (lopsided, (8.0, 0.05, 2.0)), (even, (4.0, 0.05, 1.0))],
        key=lambda fs: triage_model.setting_key(*fs),
    )
    assert [fs[1] for fs in order] == [(8.0, 0.05, 2.0), (4.0, 0.05, 1.0), (16.0, 0.05, 1.5)]
    # equal figures: the smaller silent weight, then the lower C wins
    assert triage_model.setting_key(even, (4.0, 0.05, 1.0)) > triage_model.setting_key(even, (4.0, 0.05, 1.5))
    assert triage_model.setting_key(even, (4.0, 0.05, 1.0)) > triage_model.setting_key(even, (8.0, 0.05, 1.0))


def test_install_and_crash_shapes_tell_a_launch_failure_from_a_request_failure():
    # written for this test: a program that never starts in a named environment, an engine that dies on requests
    launch = named(
        "The server does not start on Windows 11",
        "Double-clicking the binary opens a window that closes without a message.",
    )
    assert launch["environment named"] == launch["does not start"] == 1.0
    assert launch["does not start in a named environment, no request"] == 1.0 and launch["failure on a request"] == 0.0
    served = named("Server segfaults under load", "It started fine in docker; after a few requests the process dies.")
    assert served["failure on a request"] == served["environment named"] == 1.0
    assert served["does not start in a named environment, no request"] == 0.0
    mismatch = "The detected CUDA version (12.1) mismatches the version that was used to compile PyTorch (11.8)."
    incompatible = "incompatible versions, drivers, libraries or hardware"
    assert named("Build fails from source", mismatch)[incompatible] == 1.0
    assert named("Runtime refuses to load", "ImportError: DLL load failed while importing the extension")[incompatible]
    quiet = named("Output is garbage after 4k tokens", "No error, the answer is just wrong.")
    assert not any(quiet[n] for n in ENVIRONMENT_NAMES)


def test_support_asked_about_is_told_from_support_asked_for():
    # written for this test: whether it works now (a question) against a request for later (a feature)
    now = named("Is the int4 KV cache supported on the NPU backend?", "I could not find it in the docs.")
    assert now["support asked about"] == 1.0 and now["support asked for"] == 0.0
    assert named("请问是否支持多卡推理", "")["support asked about"] == 1.0
    later = named("When will you support the Mamba architecture", "Any plans for it? It would be great.")
    assert later["support asked for"] == 1.0
    assert named("能否支持一下新的模型", "")["support asked for"] == 1.0
    plain = named("Server crashes on start", "Segfault after loading.")
    assert plain["support asked about"] == plain["support asked for"] == 0.0


def test_a_ci_job_or_test_run_in_the_title_is_its_own_shape():
    assert named("Nightly CI job times out on the 4-GPU runner", "")["CI or a test run in the title"] == 1.0
    assert named("test_sampler_logprobs fails after the refactor", "")["CI or a test run in the title"] == 1.0
    assert named("Output is garbage", "we run the tests in CI")["CI or a test run in the title"] == 0.0
