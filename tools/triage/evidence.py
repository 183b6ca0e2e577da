"""The shape of an issue, as features for the triage model. Pure functions, no label names in them.

The rules (`tools.triage.rules`) look for what a reporter says; these features record how the report
is built, which generalises across trackers and wordings better than more keyword cues:
  - what it shows: code blocks, a traceback or a named exception, a shown output or prompt,
    "expected ... but got" evidence, a comparison with something else;
  - how it is framed: a title that asks (ends in "?" or opens with an interrogative), questions in the
    prose, the issue template's title tag (`[Bug]`, `[Usage]`, ...), and nothing but a tag;
  - its size and script: no body, body length, mostly CJK text.
So a wrong output asked as a question ("X supported?" over two differing outputs) and a bare `[Bug]`
title over a traceback are told apart by what the body carries, not by new phrasings.
"""

from __future__ import annotations

import math
import re

from tools.triage import rules as triage_rules


def _rx(p: str) -> re.Pattern:
    return re.compile(p, re.I | re.M)


_ASKING_TITLE = _rx(r"\?\s*$|？\s*$|吗\s*$")
_INTERROGATIVE = _rx(
    r"^\s*(how|is|are|can|could|does|do|did|what|why|which|when|where|should|would|will|has|have|any)\b"
)
_EXPECTED = _rx(
    r"\bexpected (output|result|behaviou?r|answer|response)|\bexpect(ed|ing)? (it |the (model|output) )?to\b"
    r"|\bshould (be|return|output|give|produce|print|say)\b|\bcorrect (answer|output|result|response) (is|would be|should be)"
)
_ACTUAL = _rx(
    r"\bactual (output|result|behaviou?r|answer|response)|\binstead of\b|\bbut got\b"
    r"|\b(but|instead) (it |the model |we )?(got|gets|returns?|outputs?|gives?|produces?|generates?|prints?|says)\b"
)
_OUTPUT_SHOWN = _rx(
    r"^\s*(\*\*)?(output|response|answer|result|generated( text)?|completion|model output|generation)s?(\*\*)?\s*[:：]"
)
_PROMPT_SHOWN = _rx(r"^\s*(\*\*)?(prompt|input|question|query|messages?)(\*\*)?\s*[:：]|\bprompt\s*=|messages\s*=")
_COMPARES = _rx(r"\b(compared? (to|with)|vs\.?|versus|while|whereas)\b")
# Families of a wrong result, by what is named rather than one report's words. A thing the engine returned
# (or a score of it) next to a word that judges it bad: "the result looks wrong", "scores are very low".
_RESULT = (
    r"(results?|outputs?|answers?|responses?|generat\w*|completions?|translations?|text|tokens?|logprobs?|logits"
    r"|embeddings?|scores?|accuracy|perplexity|ppl|characters?|结果|输出|回答|精度|准确率|分数)"
)
_BAD = (
    r"(wrong|incorrect|weird|strange|abnormal|unexpected\w*|odd|broken|bad|low|lower|worse|poor\w*|garbled|corrupt\w*"
    r"|nonsense|gibberish|random|different|inconsistent|mismatch\w*|not (right|correct|as expected)|差|错误?|异常|不对|不一致)"
)
# A result judged by what it did to the answer rather than an adjective: it changed, it lost accuracy against
# something, it cannot answer in a language.
_CHANGED_RESULT = _rx(
    r"\bchang\w* (the )?(inference |model |generat\w* )?(results?|outputs?|answers?|predictions?)\b"
    r"|\b(accuracy|precision|quality) (loss|drop|degradation|gap)\b|(loss|drop) (of|in) (accuracy|quality)"
    r"|\b(can'?t|cannot|can not|unable to|fails? to) (answer|respond|reply|speak|write)( in)? "
    r"(chinese|english|japanese|korean|french|german|spanish|russian|arabic|vietnamese|thai|other languages)\b"
)
# The engine returned nothing: an empty string / output / response, asked about or seen at some share of requests.
_EMPTY_RESULT = _rx(
    r"\bempty (string|output|response|result|text|answer|content|completion|generation)s?\b"
    r"|\b(returns?|returned|outputs?|generates?|generated|gives?|got|get) (an? )?(empty|blank|nothing)\b"
    r"|(content|text|output|response)\W{0,4}(is|are|was|were)?\W{0,4}(empty|blank|none|null|\"\"|'')\W"
    r"|输出为空|返回为?空|空(字符串|输出|回答|结果)"
)
# A quantized / converted model measured against its original, either way ("higher than the bf16 model, why?").
_VS_ORIGINAL = _rx(
    r"\b(higher|better|lower|worse|different)\W+(\w+\W+){0,4}?(than|from|vs\.?|compared (to|with)) (the |its )?"
    r"(original|float|fp16|bf16|fp32|unquantized|non-quantized|full[- ]precision|base|hf|huggingface)\b"
    r"|比(浮点|原始|原|未量化|fp16|bf16|fp32).{0,16}(更?高|更?低|更?差|更好|不同)"
)
_BAD_RESULT = _rx(
    rf"{_RESULT}\W+(\w+\W+){{0,7}}?{_BAD}\b|\b{_BAD}\W+(\w+\W+){{0,3}}?{_RESULT}|{_RESULT}.{{0,12}}{_BAD}"
)
# Text encoding: multi-byte characters, emoji, replacement characters, mojibake.
_ENCODING = _rx(
    r"unicode|utf-?8|\bemojis?\b|multi-?byte|\bencod(ing|ed)\b|\bdecod(ing|ed)\b (of )?(characters?|bytes|text)"
    r"|<\?>|\?{3,}|\ufffd|�|\\u[0-9a-f]{4}|\\x[0-9a-f]{2}|mojibake|乱码|编码"
)
# A request or sampling parameter, and a word that says it changed nothing or the wrong thing.
_PARAMETER = _rx(
    r"(?<![a-z_])(system (message|prompt)s?|instructions?|temperature|top_?k|top_?p|min_?p|typical_?p|do_sample|seed|repetition_penalty|presence_penalty"
    r"|frequency_penalty|logit_bias|(top_)?logprobs|max_(new_)?tokens|stop|n_predict|best_of|beam(s| size|_width)?)(?![a-z_])"
)
_NO_EFFECT = _rx(
    r"(no|any) (effect|impact|difference)|(does|do|did)(n'?t| not) (seem to )?(affect|change|matter|work|apply|take effect)"
    r"|not (take|taking|in) effect|(is|are|seems?|gets?) ignored|not (respected|honou?red|applied|used|followed|obeyed)|same (output|result)s?"
    r"|unexpected|没有?生效|不生效|无效|不起作用"
)
# Install vs crash (LABELING.md "Environment failures at start"): the package does not build, import or start in
# its environment, against a running engine that dies on a request. What is named, not one report's words: the
# environment (an OS, a container, an architecture, a driver or toolchain), a program that does not start at all,
# an incompatibility between versions, drivers, libraries or hardware, and a failure tied to a request.
_ENVIRONMENT = _rx(
    r"\b(windows|win ?1[01]|wsl2?|mac ?os|macbook|apple silicon|docker|container|podman|kubernetes|k8s|aarch64|arm64"
    r"|jetson|raspberry|android|ios|ubuntu|debian|fedora|centos|rhel|glibc|drivers?|cuda (version|toolkit|runtime)"
    r"|rocm|nvidia-smi|gh200|grace hopper|ppc64\w*)\b|\.exe\b|驱动|镜像"
)
_NOT_STARTING = _rx(
    r"\b(not|never|won'?t|doesn'?t|does not|didn'?t|can'?t|cannot|can not|unable to|fails? to|failed to|failing to)\s+"
    r"(even )?(start|launch|run|open|execute|boot)(s|ing|ed)?\b|\bnot (starting|launching)\b|cannot execute"
    r"|exec format error|closes? (immediately|without)|\b(on|at|during) (start ?up|launch|boot)\b"
    r"|启动(失败|不了|报错)|无法(启动|运行)"
)
_INCOMPATIBLE = _rx(
    r"\bversions? (mismatch\w*|conflict\w*|incompatib\w*)|\bmismatch\w* (the |with (the )?)?(cuda |torch |pytorch "
    r"|driver )?version|compiled (with|against|for) (a different|cuda|torch|pytorch)|driver (is )?too old"
    r"|version is insufficient|forward compatibility|not supported (on )?(hw|hardware|gpu|platform|architecture|cpu)"
    r"|unsupported (gpu|hardware|platform|architecture|os|cpu)|\bno kernel image\b|\billegal instruction\b"
    r"|dll load failed|symbol not found|function '?\w+'? not found|cannot open shared object|\bglibc_?\d"
    r"|not (recogni[sz]\w*|detect\w*|find\w*|found|using|use) (my |the |any |an? )?(apple |nvidia |amd |intel )?"
    r"(gpu|cuda|metal|rocm|vulkan)"
)
_ON_REQUEST = _rx(
    r"\b(when|while|after|during|on|for) (i |we )?(send(ing)?|mak(e|ing)|call(ing)?|process(ing)?|serv(e|ing)"
    r"|handl(e|ing)|generat(e|ing)|decod(e|ing)|running inference|the (first|second|next)|every|each|some|a few"
    r"|several|many|multiple|long|\d+)\b\W+(\w+\W+){0,3}?(requests?|prompts?|queries|calls?|tokens|inference"
    r"|generation|completions?|messages?|inputs?)\b|\bconcurrent (requests?|users?|calls?)|\bunder (heavy )?load\b"
    r"|\bmid-?(generation|stream|request)|\bduring (inference|generation|decoding|serving|prefill|the request)\b"
    r"|推理(时|过程中)|请求(时|后)|并发"
)
_SUPPORT_ASKED = _rx(
    r"\b(is|are|does|do|can|will)\b[^.?\n]{0,60}\bsupport(ed|s)?\b[^.?\n]{0,40}[?？]|\bsupport(ed)?\s*[?？]\s*$"
    r"|是否.{0,20}支持|支持.{0,30}(吗|么)"
)
_SUPPORT_WANTED = _rx(
    r"\b(any|is there a|are there)\W+(\w+\W+){0,2}?plans?\b|\bplans? (to|for) (\w+ )?support|\bwhen\b[^.?\n]{0,30}\bsupport"
    r"|\b(please|could you|can you|would you|kindly)\W+(\w+\W+){0,2}?(add|support|implement|consider)\b|\bwould (be|love)"
    r"|有计划|计划支持|能否支持|可否支持|何时支持|什么时候支持|希望.{0,10}支持|请.{0,4}(增加|添加|支持)"
)
_CI_TITLE = _rx(r"\bci\b|post-?commit|nightly|\bunit ?tests?\b|\btest runs?\b|\bpytest\b|\btest_\w+|\bflak(y|e)\b")
_METRIC, _SPEED = triage_rules.QUALITY_METRIC, triage_rules.SPEED_MEASURE  # the same words the rules weigh
_QUANT = _rx(
    r"quanti[sz]\w*|\b(int[48]|w[48]a(8|16)|fp8|nf4|awq|gptq|smooth ?quant|q[2-8]_[0-9k]\w*|exl2|bnb|bitsandbytes)\b|量化"
)
# The template tags of triage_rules.TITLE_TAGS, aliases folded; one indicator each.
TAGS = (
    "bug",
    "build",
    "ci",
    "doc",
    "feature",
    "installation",
    "misc",
    "new model",
    "performance",
    "question",
    "rfc",
    "usage",
)
_TAG_ALIAS = {"feature request": "feature", "docs": "doc"}
# The wrong-result family: shapes of a report that names a wrong result (columns of NAMES, in this order).
WRONG_RESULT_NAMES = (
    "bad result",
    "a bad result asked as a question",
    "encoding",
    "parameter without effect",
    "quality metric, no speed",
    "quantization and a bad result or metric",
    "empty result",
)
NAMES = (
    "has code",
    "traceback",
    "exception named",
    "title asks",
    "title opens with an interrogative",
    "questions in prose",
    "no body",
    "body length",
    "tag only",
    "mostly CJK",
    "expected shown",
    "actual shown",
    "expected and actual",
    "output shown",
    "prompt shown",
    "comparison",
    *(f"tag {t}" for t in TAGS),
    *WRONG_RESULT_NAMES,
)
# Install vs crash (`environment`): last in NAMES, so weights fitted before them still read the earlier columns.
ENVIRONMENT_NAMES = (
    "environment named",
    "does not start",
    "does not start in a named environment, no request",
    "incompatible versions, drivers, libraries or hardware",
    "failure on a request",
)
# Framing (LABELING.md "Feature requests in question form", "CI failures"): support asked about as it is now ("is X
# supported?", "does it support", 是否支持: `question`) against support asked for later ("any plan to support", "when
# support", 能否支持: `feature`); a CI job or a test run named in the title (`other` unless a result is judged bad).
FRAMING_NAMES = (
    "support asked about",
    "support asked for",
    "CI or a test run in the title",
)
NAMES = NAMES + ENVIRONMENT_NAMES + FRAMING_NAMES


def title_tag(title: str) -> str:
    """The issue template's tag of the title, lower case ('' when none)."""
    m = triage_rules._TITLE_TAG.match(title)
    name = (m.group(1) or m.group(2)).strip().lower() if m else ""
    return _TAG_ALIAS.get(name, name)


def shape(title: str, body: str) -> list[float]:
    """NAMES-ordered features of an issue, each in [0, ~1.5]. Pure."""
    t = triage_rules.split_issue(title, body)
    text = f"{t.title}\n{t.prose}"
    shown = f"{t.prose}\n{t.code}"
    exceptions = [n for n in triage_rules._EXCEPTION.findall(shown) if n.lower() not in ("error", "exception")]
    bare = triage_rules._TITLE_TAG.sub("", t.title).strip()
    cjk = sum("\u4e00" <= ch <= "\u9fff" for ch in text) / max(1, len(text))
    expected, actual = bool(_EXPECTED.search(text)), bool(_ACTUAL.search(text))
    tag = title_tag(t.title)
    flags = [
        bool(t.code.strip()),
        bool(triage_rules._TRACEBACK.search(t.code)),
        bool(exceptions),
        bool(_ASKING_TITLE.search(t.title)),
        bool(_INTERROGATIVE.search(bare)),
    ]
    return [
        *map(float, flags),
        min(t.prose.count("?") + t.prose.count("？"), 5) / 5,
        float(not (body or "").strip()),
        min(math.log1p(len(body or "")) / 8, 1.5),  # ~0.7 for 250 characters, 1.0 for 3000
        float(len(bare) < 4),
        float(cjk > 0.05),
        float(expected),
        float(actual),
        float(expected and actual),
        float(bool(_OUTPUT_SHOWN.search(shown))),
        float(bool(_PROMPT_SHOWN.search(shown))),
        float(bool(_COMPARES.search(text))),
        *(float(tag == name) for name in TAGS),
        *families(text, asks=flags[3] or flags[4] or tag in ("question", "usage")),
        *environment(text, f"{text}\n{t.code}"),
        float(bool(_SUPPORT_ASKED.search(text))),
        float(bool(_SUPPORT_WANTED.search(text))),
        float(bool(_CI_TITLE.search(t.title))),
    ]


def families(text: str, asks: bool) -> list[float]:
    """The wrong-result families (title + prose): a bad result, the same asked as a question, garbled encoding,
    a parameter without effect (an instruction or system message not followed too), a quality metric with no
    speed measure, quantization with a bad result, an empty result (also a bad result). Pure."""
    empty = bool(_EMPTY_RESULT.search(text))
    bad = any(rx.search(text) for rx in (_BAD_RESULT, _CHANGED_RESULT, _VS_ORIGINAL)) or empty
    metric = bool(_METRIC.search(text)) and not _SPEED.search(text)
    encoding = bool(_ENCODING.search(text))
    no_effect = any(_NO_EFFECT.search(text[max(0, m.start() - 80) : m.end() + 120]) for m in _PARAMETER.finditer(text))
    return [
        float(bad),
        float(asks and (bad or metric or encoding or no_effect)),
        float(encoding),
        float(no_effect),
        float(metric),
        float(bool(_QUANT.search(text)) and (bad or metric)),
        float(empty),
    ]


def environment(text: str, everything: str) -> list[float]:
    """Install vs crash (title + prose; `everything` adds the code): an environment named, a program that does not start,
    the two together with no request in sight (a launch failure: `install`), an incompatibility between versions,
    drivers, libraries or hardware, and a failure tied to a request (a running engine: `crash`). Pure."""
    env, starting = bool(_ENVIRONMENT.search(everything)), bool(_NOT_STARTING.search(text))
    on_request = bool(_ON_REQUEST.search(text))
    return [
        float(env),
        float(starting),
        float(env and starting and not on_request),
        float(bool(_INCOMPATIBLE.search(everything))),
        float(on_request),
    ]
