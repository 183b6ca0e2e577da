"""The wrong-result families of the triage classifier, on short texts written for these tests (no real issue's
words): a question whose substance is a wrong result, garbled encoding, a parameter without effect, a benchmark
score drop worded as "degradation", quantization with a bad result, an empty result, a result that changed or lost
accuracy against something, a converted model scoring differently from its original, an instruction not followed. Each family is read by the report's shape
(`tools.triage.evidence.families`), by an explainable rule, and the shipped model answers `silent`."""

import pytest

from tools.triage import model as triage_model
from tools.triage import rules as triage_rules
from tools.triage.evidence import ENVIRONMENT_NAMES, NAMES, shape

# the seven families sit between the template tags and the install-vs-crash (and, since the ninth round, framing) shapes
FAMILY = NAMES[NAMES.index("bad result") : NAMES.index(ENVIRONMENT_NAMES[0])]

# (family feature, title, body): silent reports of each family, in the ways reporters word them.
SILENT = [
    (
        "a bad result asked as a question",
        "Why is the translation so strange with the converted checkpoint?",
        "After converting, the result is strange: half the sentences come back in the wrong language.",
    ),
    (
        "a bad result asked as a question",
        "[Question] answers look incorrect after switching to the new attention backend",
        "Same prompt, same seed. With the old backend the answers are fine; now they look incorrect.",
    ),
    (
        "encoding",
        "Streaming endpoint breaks emoji into question marks",
        "When I stream a reply that contains an emoji, the client receives <?> <?> instead of the emoji. "
        "Without streaming the text is fine.",
    ),
    (
        "encoding",
        "Japanese characters come out as mojibake from the server",
        "The completion endpoint returns UTF-8 Japanese text as mojibake, while the CLI prints it correctly.",
    ),
    (
        "parameter without effect",
        "Does min_p in the request do anything?",
        "Setting min_p to 0.05 or 0.9 gives the same output every time, it seems ignored by the server.",
    ),
    (
        "parameter without effect",
        "presence_penalty 似乎没有生效",
        "无论设置多少，生成的内容都一样。",
    ),
    (
        "quality metric, no speed",
        "[Bug] Performance degradation on GSM8K after upgrading",
        "GSM8K went from 78.1 to 61.4 with the same model and the same eval script after the upgrade.",
    ),
    (
        "quantization and a bad result or metric",
        "Is it normal that the AWQ model scores much lower on MMLU?",
        "The fp16 model gets 68 on MMLU, the AWQ int4 one 41. Is this expected for quantization?",
    ),
]
# The sixth round's families (also silent): each read as a bad result, the first also as an empty one.
SIXTH = [
    (
        "empty result",
        "[Usage] the 4-bit checkpoint gives an empty string for some prompts",
        "About one request in twenty comes back with an empty response; the rest look fine.",
    ),
    (
        "bad result",
        "Converted checkpoint scores better than the bf16 one, why?",
        "On our reading benchmark the converted model gets 71 and the bf16 model 64.",
    ),
    (
        "bad result",
        "Accuracy loss compared with the other server on our internal set",
        "Same weights, same prompts; we see 4 points lower on our internal set than with the other server.",
    ),
    (
        "bad result",
        "Switching the attention kernel changes the inference result",
        "With the flash kernel the completion differs from the default kernel for the same greedy request.",
    ),
    (
        "bad result",
        "The chat model can't answer in Korean",
        "Asked in Korean, it replies with unrelated English sentences.",
    ),
    (
        "parameter without effect",
        "System prompt not followed by the chat endpoint",
        "The system message asks for replies in French; the replies come back in English, it is not respected.",
    ),
]
SILENT += SIXTH
# Near misses the families must leave alone: a speed drop called degradation, a usage question about a
# parameter, a request to support an encoding.
NOT_SILENT = [
    ("performance", "Performance degradation in throughput after upgrading", "Tokens/s fell from 2400 to 1700."),
    ("question", "How do I set top_p per request?", "Where in the request body does top_p go?"),
]


def families_of(title: str, body: str) -> dict[str, float]:
    return {name: v for name, v in zip(NAMES, shape(title, body)) if name in FAMILY}


@pytest.mark.parametrize(("family", "title", "body"), SILENT)
def test_each_family_is_read_from_the_shape_of_the_report(family, title, body):
    assert families_of(title, body)[family] == 1.0


def test_a_speed_drop_and_a_usage_question_are_not_wrong_results():
    speed = families_of(*NOT_SILENT[0][1:])
    assert speed["quality metric, no speed"] == 0.0 and speed["a bad result asked as a question"] == 0.0
    usage = families_of(*NOT_SILENT[1][1:])
    assert not any(usage.values()), usage


def test_performance_degradation_of_a_score_is_weighed_as_a_wrong_result_by_the_rules():
    # the labelling guide: the measured quantity decides, not the word "performance"
    score = triage_rules.classify(*SILENT[6][1:])
    speed = triage_rules.classify(*NOT_SILENT[0][1:])
    assert score.scores["silent"] > score.scores["performance"]
    assert speed.label == "performance" and speed.scores["silent"] == 0.0


def test_the_rules_explain_a_parameter_without_effect_and_garbled_multibyte_text():
    for _, title, body in (SILENT[2], SILENT[4], SILENT[5]):
        c = triage_rules.classify(title, body)
        assert c.scores["silent"] > 0 and any(cue.startswith("silent:") for cue in c.cues), (title, c.cues)


@pytest.mark.parametrize(("family", "title", "body"), SILENT)
def test_the_shipped_model_answers_silent_for_each_family(family, title, body):
    c = triage_model.classify(title, body)
    assert c.label == "silent", (family, c.label, c.confidence, c.cues)


@pytest.mark.parametrize(("label", "title", "body"), NOT_SILENT)
def test_the_shipped_model_keeps_the_near_misses_apart(label, title, body):
    assert triage_model.classify(title, body).label == label


@pytest.mark.parametrize(("family", "title", "body"), SIXTH)
def test_the_sixth_round_families_are_bad_results(family, title, body):
    got = families_of(title, body)
    assert got[family] == 1.0 and (got["bad result"] == 1.0 or family == "parameter without effect"), got


def test_an_empty_field_in_a_config_is_not_an_empty_result():
    got = families_of("How do I leave the stop list empty?", "I want no stop strings at all. Is stop=[] allowed?")
    assert got["empty result"] == 0.0 and got["bad result"] == 0.0


def test_garbled_output_in_a_title_that_says_error_outranks_the_word_error():
    # no traceback: "报错" / "error" next to 乱码 describes the output; with a traceback the exception still counts
    garbled = triage_rules.classify("推理报错，输出乱码", "对话时模型输出一堆乱码，换回原来的版本就正常。")
    assert garbled.label == "silent" and garbled.scores["crash"] < garbled.scores["silent"], garbled.scores
    traced = triage_rules.classify(
        "推理报错，输出乱码",
        '对话时报错。\n```\nTraceback (most recent call last)\n  File "a.py", line 1\nRuntimeError: CUDA\n```',
    )
    assert traced.scores["crash"] > garbled.scores["crash"]


def test_an_accuracy_loss_against_another_engine_is_never_a_crash():
    c = triage_rules.classify(*SIXTH[2][1:])
    assert c.label == "silent" and c.scores["silent"] > c.scores["crash"], c.scores
    assert triage_model.classify(*SIXTH[2][1:]).label == "silent"
