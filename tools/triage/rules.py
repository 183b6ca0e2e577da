"""Rule-based triage of an issue text into one label (docs/design.md §8). Pure functions.

An issue is split into title, prose and code blocks (issue templates and environment dumps
dropped). Weighted cue patterns add evidence per label; a few interaction rules settle the
usual tensions (a traceback in a code block means a crash, unless the reporter says there was
no error or that the exception is unrelated; an ImportError traceback is an install problem).
Scores become a distribution with a softmax; `confidence` is the winner's probability (its
calibration is reported by `python -m benchmark.triage_eval`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

LABELS = ("silent", "crash", "install", "performance", "feature", "question", "other")
TITLE_WEIGHT = 1.5  # a cue in the title says more than the same cue in the body
TEMPERATURE = 1.5  # softmax temperature: median confidence ~0.87, between the in-sample accuracy
# (~1.0) and the first-sight accuracy on newly written issues (~0.71)
OTHER_PRIOR = 1.0  # score of `other` before any cue: an issue with no cue at all is `other`
MAX_TEXT = 20_000  # characters of the body read; beyond that the tail rarely changes the label

_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.S)
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TEMPLATE_LINE = re.compile(r"^\s*(#+\s.*|- \[[ xX]\] .*(search|read|document|make sure|checked).*)$", re.I | re.M)
_ENV_DUMP = re.compile(r"collect_env|PyTorch version:|Is CUDA available|Versions of relevant libraries", re.I)


@dataclass(frozen=True)
class IssueText:
    title: str
    prose: str  # body outside code blocks, template lines removed
    code: str  # contents of fenced code blocks that are not environment dumps


@dataclass(frozen=True)
class Cue:
    label: str
    weight: float
    pattern: re.Pattern
    where: str = "text"  # "text" = title + prose, "code", "any" = everywhere


@dataclass(frozen=True)
class Classification:
    label: str
    confidence: float
    scores: dict[str, float] = field(default_factory=dict)
    cues: tuple[str, ...] = ()  # "label:cue-name" that fired, for explanations


def _rx(p: str) -> re.Pattern:
    return re.compile(p, re.I)


# Title tags used by the vLLM / SGLang / llama.cpp issue templates.
TITLE_TAGS = {
    "bug": {"silent": 1.0, "crash": 1.0},
    "feature": {"feature": 4.0},
    "feature request": {"feature": 4.0},
    "rfc": {"feature": 3.5},
    "new model": {"feature": 3.5},
    "model request": {"feature": 3.5},
    "usage": {"question": 4.0},
    "question": {"question": 4.0},
    "installation": {"install": 4.0},
    "build": {"install": 2.0},
    "performance": {"performance": 4.0},
    "doc": {"other": 3.0},
    "docs": {"other": 3.0},
    "misc": {"other": 2.0},
    "ci": {"other": 3.0},
    "roadmap": {"other": 3.0},
    "tracking": {"other": 3.0},
}
_TITLE_TAG = re.compile(r"^\s*\[([a-z ]+)\]\s*:?|^\s*(feature request|bug|question)\s*:", re.I)

_REF = r"(hf|hugging ?face|transformers|reference|sentence-transformers|fp32|float32|the demo|openai)"
_TRIGGER = r"(batch|prefix.cach|tensor.parallel|\btp\s*=?\s*\d|\btp\b|chunked.prefill|max.num.seqs|cuda.?graph|radix|speculat|concurren|-np\b|-sm\b|n_ctx|-c \d|block.size|kv.cache.dtype|seed)"
_CHANGE = r"(differ\w*|chang\w*|depend\w*|wrong|worse|random|incorrect|garbage|gibberish|corrupt\w*|not (the same|identical|deterministic)|mismatch\w*|don't match|doesn't match|diverg\w*)"

CUES = (
    # silent: the engine answers, the answer is wrong
    Cue(
        "silent",
        3.0,
        _rx(
            r"gibberish|garbage|garbled|nonsense|word salad|meaningless|corrupt\w* (text|output)|random (tokens|text|words)|makes no sense|weird (answers|output|text|stuff)"
        ),
    ),
    Cue(
        "silent",
        2.5,
        _rx(
            r"\b(wrong|incorrect|bad|invalid|dumber|degraded|worse) (output|answer|result|text|token|completion|generation|response|logits|embedding|fact)s?\b|(answers|outputs) are (wrong|worse|incorrect)|not valid json"
        ),
    ),
    Cue(
        "silent",
        3.0,
        _rx(
            rf"(differ\w*|deviat\w*|diverg\w*|mismatch\w*|(don't|doesn't|do not|does not|not) match\w*|not the same|worse|dumber|off by)\b.{{0,80}}\b{_REF}\b|\b{_REF}\b.{{0,40}}\b(differ\w*|deviat\w*|mismatch\w*)"
        ),
    ),
    Cue("silent", 3.0, _rx(rf"{_CHANGE}.{{0,100}}{_TRIGGER}|{_TRIGGER}.{{0,100}}{_CHANGE}")),
    Cue(
        "silent",
        2.0,
        _rx(r"\brepeat\w*|repetition|\bloop\b|the same token|same completion|identical (samples|completions|outputs)"),
    ),
    Cue("silent", 2.0, _rx(r"\bnan\b|\binf\b|<pad>|replacement char|�|missing (space|spaces)")),
    Cue(
        "silent",
        3.0,
        _rx(
            r"(accuracy|quality|score|scores|mmlu|gsm8k|gpqa|aime|perplexity|eval\w*|benchmark|pcc|pearson)\b.{0,60}\b(drop\w*|lower|low|worse|degrad\w*|regress\w*|down|loses?|loss|abnormal)\b|\b(drop\w*|lower|low|bad|poor|worse|degrad\w*|loss)\b.{0,40}\b(accuracy|quality|score|points|pcc)\b|\d+(\.\d+)?\s*points? (lower|down|drop)"
            r"|\b(accuracy|pcc)( rate)? (is|was|=|of|only|just) (0|zero)(\.0+)?%?(?![.\d])"
        ),
    ),
    Cue(
        "silent",
        3.0,
        _rx(
            r"\bno (error|exception|warning|crash)s?\b|without (any )?(error|complaint|warning|exception)s?|nothing (crashes|fails|in the logs?)|(doesn't|does not|didn't|never) (crash|fail|error)|no errors?\b.{0,30}(log|anywhere)|returns 200|server is happy"
        ),
    ),
    Cue(
        "silent",
        1.5,
        _rx(
            r"hallucinat\w*|stopped following|doesn't follow|ignores (half|the|part)|mixes up|has no effect|loses track|answers? .{0,30}(wrong|nonsense)|lost track"
        ),
    ),
    Cue(
        "silent",
        2.5,
        _rx(
            r"(token )?ids (are|look|looked) (the same|correct|right|fine)|tokens look fine but|looks? fine but the text|doubled|duplicated (text|characters|tokens)|unrelated text|should (never|not) (survive|be (sampled|generated|possible))|should have been (filtered|masked)"
        ),
    ),
    Cue(
        "silent",
        2.5,
        _rx(
            r"\b(fails?|breaks?|degrades?|collapses?|falls apart)\b.{0,30}\b(above|past|beyond|after|over) (~|about |around )?\d+\s*k?\b|passes up to|needle"
        ),
    ),
    # weak: the report is about what the model's output did, or contrasts it with a reference
    Cue(
        "silent",
        1.5,
        _rx(
            r"\bthe (model|assistant) (says|answers|describes|generates|outputs|produces|forgets|stops|mixes|ignores|loses|can't|cannot)\b|\b(describes|picks|returns|answers) the wrong\b|\bwrong (image|beam|token|language|person|one)\b"
        ),
    ),
    Cue(
        "silent",
        2.5,
        _rx(
            rf"\b(lower|higher|worse|less|fewer)\b.{{0,40}}\bthan\b.{{0,30}}\b{_REF}\b|\b(while|whereas|but) {_REF} (can|does|gets|works|passes|is right|finds)|\bwith {_REF},? (it|the same).{{0,30}}(works|passes|is (right|correct|fine))"
        ),
    ),
    Cue(
        "silent",
        1.0,
        _rx(
            r"\bgreedy\b|temperature\s*[=:]?\s*0(\.0)?\b|--temp 0\b|do_sample=False|should be deterministic|expected identical"
        ),
    ),
    Cue(
        "silent",
        1.0,
        _rx(
            r"\bworked (fine )?(in|on|with) v?\d|was fine (in|on|with)|worked in\b|downgrad\w* to|regression|cosine similarity"
        ),
    ),
    # silent, real phrasings (benchmark/triage/real train split): "not aligned with HF", quality or
    # perplexity complaints, whitespace/truncation defects, outputs that ignore the input
    Cue(
        "silent",
        2.5,
        _rx(
            r"\bun-?align\w*|mis-?align\w*|not (aligned|align|identical|consistent|coherent|normal|reasonable)|inconsisten\w*|incoherent|unreadable|messy|abnormal|output diff\b|(results?|outputs?|logits|logprobs|embeddings?|responses?) (are |is )?(very |quite |totally |slightly )?different|different (outputs?|results?|logits|logprobs|embeddings?|responses?|answers?)"
        ),
    ),
    Cue(
        "silent",
        2.5,
        _rx(
            r"\b(high|higher|too high|unusually high)\s+(perplexity|ppl)\b|\b(perplexity|ppl)\b.{0,30}(too high|high|higher|increase)|quality (issues?|degrad\w*|regress\w*|worse|drop\w*)|(decreased|degraded|lower|worse) (output |response |answer )?quality|becomes? a fool|dumb(er)?\b"
        ),
    ),
    Cue(
        "silent",
        2.0,
        _rx(
            r"white ?spaces?|space character|extra spaces?|(output|response|answer|message|text)s? (is |are |gets? )?(truncated|cut\b|cut ?off)|\bcut ?off\b|stops? (prematurely|early)|prematurely|!!!!|(empty|blank) (output|response|answer)s?|(prints?|generates?|outputs?|returns?) nothing|regardless of (the )?(prompt|input)|round ?trip"
        ),
    ),
    Cue(
        "silent",
        2.5,
        _rx(
            r"得到的.{0,40}不同|(和|与|跟).{0,30}(不同|差距)|乱码|结果.{0,10}(不同|差距|不一致|未对齐)|未对齐|不一致|输出.{0,6}(混乱|错误)|不可读|看不懂|胡言乱语|胡说|答非所问"
        ),
    ),
    Cue(
        "silent",
        1.5,
        _rx(
            r"(?<![a-z_])(repetition_penalty|presence_penalty|frequency_penalty|top_?k|top_?p|min_?p|typical_?p|do_sample|temperature|ignore_eos|stop|seed|max_tokens|(top_)?logprobs)(?![a-z_]).{0,60}(\b(ignored|no effect|not (applied|respected|working|work)|(does|do)(n'?t| not) (seem to )?(work|apply|affect|change|take effect)|not (take|taking) effect)|没有?生效|不生效|不起作用)|\bignored\b"
        ),
    ),
    # silent, second-collection phrasings (train + test + test2 errors): a setting or adapter that
    # silently has no effect, output that never ends, constant logprobs, leaked special tokens,
    # tool calls left unparsed, text mangled by the (streaming) detokenizer
    Cue(
        "silent",
        2.5,
        _rx(
            r"silently (serves?|ignor\w*|drops?|uses?|falls? back|returns?)|identical to (the )?base|same as (the )?base( model)?|\b(lora|adapter)s?\b.{0,60}\b(no effect|not (applied|loaded|used|working)|ignored|identical|same output)"
        ),
    ),
    Cue(
        "silent",
        2.5,
        _rx(
            r"never stops? (generat\w*|talking|outputting)|(doesn'?t|does not|won'?t|will not|didn'?t) stop (generat\w*|at)|keeps? (generating|repeating|outputting)|(generat\w*|output\w*|repeat\w*|print\w*|talk\w*)\b.{0,20}\b(forever|indefinitely|endlessly|infinitely)|stuck in an? (infinite )?(loop|cycle)|infinite (loop|repetition|generation)|死循环|重复输出"
        ),
    ),
    Cue(
        "silent",
        2.5,
        _rx(
            r"(logprobs?|log.?probs?|probabilit\w*|scores?|embeddings?) (are |is )?(always|all) (0|zero|zeros|nan|-?inf|the same|identical)|always (0\.0+|zero)\b|all zeros"
        ),
    ),
    Cue(
        "silent",
        3.0,
        _rx(
            r"leak\w* .{0,30}(special )?tokens?|(special|eos|stop|control) tokens? .{0,30}\b(in|into|appear\w*|show\w*|leak\w*)\b.{0,20}(content|output|text|response|message)|tool.?(call|parser)s?\b.{0,60}\b(invalid|malformed|wrong|broken|unparsed|not parsed|as (plain )?text|in (the )?content)"
        ),
    ),
    Cue(
        "silent",
        2.0,
        _rx(
            r"detokeni\w*|\bno spaces?\b|spaces? (between|missing|dropped|disappear\w*)|stream\w*\b.{0,40}\b(messed|broken|garbled|missing|duplicat\w*|dropp\w*)|\\ufffd|u\+fffd"
        ),
    ),
    # silent, text-encoding family: multi-byte characters or emoji the engine returns broken or replaced
    Cue(
        "silent",
        2.0,
        _rx(
            r"(unicode|utf-?8|emojis?|multi-?byte|non-ascii|chinese|japanese|korean|cjk)\b.{0,40}\b(characters?|text|output|tokens?|emojis?)\b.{0,60}\b(as|broken|garbled|wrong|missing|replaced|appears?|shown|displayed|corrupt\w*|split|cut|interrupt\w*|incorrect\w*)\b|<\?>|question marks? (instead|in place)"
        ),
    ),
    Cue(
        "silent",
        1.5,
        _rx(
            r"(does not|doesn'?t|not) (seem to )?work (correctly|properly|right)|works? (incorrectly|wrongly)|(doesn'?t|does not) seem to work\?"
        ),
    ),
    # crash: the engine stops or refuses with an error
    Cue(
        "crash",
        3.0,
        _rx(
            r"cuda error|illegal memory access|device-side assert|segmentation fault|segfault|core ?dump(ed)?|\baborted\b|闪退|异常退出|ggml_assert|assertion .{0,40}failed|watchdog|collective operation timeout"
        ),
        "any",
    ),
    Cue("crash", 3.0, _rx(r"out of memory|outofmemory|\boom\b|killed process"), "any"),
    Cue(
        "crash",
        3.0,
        _rx(
            r"\bhang(s|ing)?\b|stops responding|exit(s|ed)? with (code|status)|exit code -?\d|\baborts?\b|failed to allocate|allocation .{0,40}failed|stuck forever|deadlock"
        ),
        "any",
    ),
    Cue(
        "crash",
        2.5,
        _rx(r"^\s*(ERROR|FATAL)\b|logs? (shows? )?(an? )?(exception|error)|raises? (an? )?\w*(error|exception)"),
        "any",
    ),
    Cue(
        "crash",
        2.0,
        _rx(
            r"\bcrash(es|ed|ing)?\b|\bdies\b|\bdied\b|\bis dead\b|kills? (it|the)|refuses to start|\b(http )?500\b|every request fails|process (just )?disappears"
        ),
    ),
    Cue("crash", 2.5, _rx(r"\b(error|errors|fails?|failed|crash\w*|exception)\b"), "title"),
    Cue(
        "crash",
        2.5,
        _rx(
            r"\bstuck\b|\bstops? (returning|responding|working|generating)|\bbad request\b|\b(http )?(400|500|503)\b.{0,20}(error|response|status)?|\bbroke\b|卡住|崩溃|报错|(?<!输)出错"
        ),
    ),
    Cue(
        "crash",
        2.0,
        _rx(
            r"can'?not start|can'?t start|fails? to (start|launch|load)|failed to (start|launch|load|build engine)|build engine fail\w*|engine build fail\w*|nccl error|\w+Error\b"
        ),
    ),
    # install: the package does not build, install or import
    Cue(
        "install",
        3.0,
        _rx(
            r"building wheel|failed building|build(ing)? from source|setup\.py|\bcmake\b|nvcc (fatal|not found)|nvcc:|hipcc|cuda_home|rust compiler|resolutionimpossible|conflicting dependencies|no matching distribution|could not find a version|undefined symbol|cannot open shared object|no module named|modulenotfounderror|importerror"
        ),
        "any",
    ),
    Cue(
        "install",
        2.5,
        _rx(
            r"compil(e|ation|ing)\b.{0,30}(fail\w*|error)(?!.{0,40}engine)|(fail\w*|error)\w* .{0,20}\bcompil\w*(?!.{0,40}engine)|\bbuild(ing|s)? (on|fails?|failure|errors?)\b(?!.{0,30}engine)|cmakecudacompiler|\bmsvc\b|visual studio"
        ),
        "any",
    ),
    # a build that fails, named in the title: `install`, except an engine build (trtllm-build: `crash`)
    Cue(
        "install",
        2.5,
        _rx(r"^(?!.*\b(engines?|trtllm)\b).*\b(build|compil)\w*\b.{0,40}\b(errors?|fail\w*|occur\w*)\b"),
        "title",
    ),
    Cue("install", 1.5, _rx(r"pip install|\binstall(ed|ation|ing)?\b|\bwheel\b|docker image|precompiled|editable")),
    Cue("install", 2.5, _rx(r"安装|(doesn'?t|does not|not) work with .{0,30}versions?|versions? above")),
    Cue(
        "install",
        3.0,
        _rx(
            r"driver version is insufficient|nvidia-container-cli|requirement error|(not|isn'?t) compatible with (the )?(latest|newer|new|older)|version (conflict|inconsisten\w*)|dependency conflict|incompatible with (torch|cuda|vllm|transformers)|build_wheel|from source"
        ),
        "any",
    ),
    # performance: right answers, too slow or too big
    Cue(
        "performance",
        2.5,
        _rx(
            r"throughput|latency|tokens?/s|tok/s|\bt/s\b|requests/s|\bttft\b|\btpot\b|\bqps\b|\bp99\b|llama-bench|benchmark_(serving|throughput)"
        ),
    ),
    Cue(
        "performance",
        2.5,
        _rx(r"memory (usage )?(keeps )?(grow\w*|increas\w*)|memory leak|\bleak\w*(?! .{0,30}tokens?)|\brss\b"),
    ),
    Cue(
        "performance",
        2.0,
        _rx(
            r"\bslow(er|ly|s)?\b|\bfaster\b|speed.?up|gpu utili[sz]ation|recompil\w*|takes? (~?\d+|a long)|cpu (bound|core)"
        ),
    ),
    Cue("performance", 2.5, _rx(r"速度|吞吐|延迟|变慢|很慢|慢$|tokens? per second|token generation speed")),
    Cue(
        "performance",
        2.0,
        _rx(
            r"\bperformance (regression|degradation|decrease|drop|issue|gap)|\b(slower|faster) than\b|\bspeed\b|\bttft\b|did not match the official|optimi[sz]ation options?"
        ),
    ),
    # feature: asks for something that does not exist yet
    Cue(
        "feature",
        2.5,
        _rx(
            r"support for|please (add|consider|support)|would be (nice|great|useful|helpful)|it would help|could you (add|expose)|would help|add a |proposal:|not supported( yet)?|feature request|please add"
        ),
    ),
    Cue("feature", 2.5, _rx(r"^\s*(add|allow|support|expose|implement)\b"), "title"),
    Cue(
        "feature",
        2.5,
        _rx(
            r"^\s*(feat(ure)?|rfc)\b|any plans? (to|for) support|plan(s)? (to|for) support|(can|could) you (please )?support|have you considered|please let us|\boptionally\b|able to accept|when will .{0,40} be supported|when (to |will (you|it|\w+) |\w+ )?support\b|有计划|计划支持|能否支持|可否支持|何时支持|什么时候支持|希望.{0,10}支持|integrate\b|itegrate\b|new model support"
        ),
    ),
    # question: asks how to use it
    Cue(
        "question",
        2.5,
        _rx(
            r"how (do|can|should|to) (i|we|you)?\b|how to\b|is it possible|is there a way|can i\b|does \w+ support|what('s| is) the difference|is it expected|what happens|which install|do i (also )?need|what guarantees"
        ),
    ),
    Cue("question", 1.5, _rx(r"\?\s*$"), "title"),
    Cue(
        "question",
        2.0,
        _rx(
            r"is there (any ?way|a way)|how does|how can|why (is|does|do|are)\b|what is\b|\binquiry\b|i (wonder|would like to know)|can (it|this|we|i) .{0,30}(run|support|use|change)|(does|do|can) \w+ support|\b(is|are) [^.?\n]{0,60}\bsupport(ed)?\s*[?？]|是否.{0,20}支持|is it normal|请问|如何|怎么|吗[？?]?\s*$"
        ),
    ),
    # other: docs, CI, meta
    Cue(
        "other",
        2.5,
        _rx(
            r"\btypo\b|broken link|dead link|\b404\b|\breadme\b|\bdocs?/|flaky|\bci\b|ci failure|license|road ?map|tracking issue|^\s*\[tracking\]|thank(s| you)|codeowners|contributing|vulnerabilit\w*|documentation|instruction is outdated|^\s*\[?tracking\b|remote code execution|\brce\b|\bcve-\d|security (issue|report|advisory)|文档"
        ),
    ),
)

# The final exception names the problem: import-family errors are install problems.
EXCEPTION_LABEL = {"modulenotfounderror": "install", "importerror": "install"}
_EXCEPTION = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception))\b:?", re.I)
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s+File \".*\", line \d+", re.M)
# A wrong-output symptom named in the title: a [Usage] / [QUESTION] tag does not make it a usage question.
_TITLE_SYMPTOM = _rx(
    r"gibberish|garbage|garbled|nonsense|meaningless|乱码|wrong (output|answer|result)s?|never stops|repeat\w*|identical to (the )?base"
    r"|\b(results?|outputs?|answers?|scores?|accuracy)\b.{0,40}\b(wrong|incorrect|low|lower|abnormal|weird)\b"
    r"|(no|any) effect|not (take )?effect|do(es)?(n'?t| not) affect|没有?生效|不生效|unicode|emoji"
    r"|\bempty (string|output|response|text|result)s?\b|not (respected|followed)|\bchang\w* (the )?(inference )?results?\b"
)
# Garbled output named in the title: the word "error" / 报错 beside it describes the output, not an exception.
_GARBLED_TITLE = _rx(r"gibberish|garbage|garbled|nonsense|乱码|mojibake")
# A quality benchmark or metric, and a speed measure: "performance degradation" on the first alone is accuracy.
QUALITY_METRIC = _rx(
    r"\b(mmlu|gsm8k|human ?eval|mme|mmmu|mmbench|c-?eval|cmmlu|hellaswag|truthfulqa|arc-[ce]|winogrande|math-?500|aime"
    r"|gpqa|bleu|rouge|wer|pass@\d|exact match|perplexity|ppl|lm[-_]eval\w*|opencompass|accuracy|eval(uation)? (score|result)s?"
    r"|pcc|pearson)\b"
    r"|精度|准确率|评测|跑分"
)
SPEED_MEASURE = _rx(
    r"tokens?/s|tok/s|\bt/s\b|throughput|latency|\bttft\b|\btpot\b|\bslow|\bspeed|\bfaster|速度|吞吐|延迟"
)
_INCIDENTAL = _rx(
    r"unrelated|not the (issue|problem)|which is expected|harmless|side note|separate (issue|problem)|not related"
)


def split_issue(title: str, body: str) -> IssueText:
    """Title and markdown body -> prose and code, with templates and env dumps dropped."""
    body = _HTML_COMMENT.sub(" ", (body or "")[:MAX_TEXT])
    blocks = [b for b in _FENCE.findall(body) if not _ENV_DUMP.search(b)]
    prose = _TEMPLATE_LINE.sub(" ", _FENCE.sub(" ", body))
    return IssueText(title=(title or "").strip(), prose=prose, code="\n".join(blocks))


# A title that opens by asking how, or whether it is possible (after its tag): a usage question under any tag.
_ASKING_OPENING = _rx(r"^\s*(how (to|do|does|can|could|should)|is it possible|is there (a|any) ?way|请问|如何|怎么)")


def title_tag_scores(title: str) -> dict[str, float]:
    """The template tag's scores; halved when the rest of the title asks how or whether it is possible (LABELING.md:
    "is it possible / is there a way / how to" is a question also under a `[Feature]` or `[Bug]` tag)."""
    m = _TITLE_TAG.match(title)
    if not m:
        return {}
    scores = dict(TITLE_TAGS.get((m.group(1) or m.group(2)).strip().lower(), {}))
    if _ASKING_OPENING.search(title[m.end() :]):
        scores = {k: (v if k == "question" else 0.5 * v) for k, v in scores.items()}
    return scores


def cue_scores(text: IssueText) -> tuple[dict[str, float], list[str]]:
    """Each cue counts once; a cue found in the title counts TITLE_WEIGHT times."""
    scores = dict.fromkeys(LABELS, 0.0)
    fired = []
    for i, cue in enumerate(CUES):
        in_title = cue.where in ("text", "any", "title") and cue.pattern.search(text.title)
        in_body = (cue.where in ("text", "any") and cue.pattern.search(text.prose)) or (
            cue.where in ("code", "any") and cue.pattern.search(text.code)
        )
        if in_title or in_body:
            scores[cue.label] += cue.weight * (TITLE_WEIGHT if in_title else 1.0)
            fired.append(f"{cue.label}:{_cue_name(cue, i)}")
    return scores, fired


def _cue_name(cue: Cue, i: int) -> str:
    return cue.pattern.pattern.split("|")[0].strip("\\b()?:^s*")[:24] or f"cue{i}"


def exception_scores(text: IssueText) -> tuple[dict[str, float], list[str]]:
    """A traceback or `SomeError:` line: evidence for the label of the exception named."""
    names = [n.lower().rsplit(".", 1)[-1] for n in _EXCEPTION.findall(text.code + "\n" + text.prose)]
    names = [n for n in names if n not in ("error", "exception")]
    if not names and not _TRACEBACK.search(text.code):
        return {}, []
    label = EXCEPTION_LABEL.get(names[-1], "crash") if names else "crash"
    weight = 2.5 + (2.0 if _TRACEBACK.search(text.code) else 0.0)
    return {label: weight}, [f"{label}:exception {names[-1] if names else 'traceback'}"]


def interaction_rules(scores: dict[str, float], text: IssueText) -> dict[str, float]:
    """Settle 'wrong output, and an exception somewhere': the reporter's framing decides."""
    s = dict(scores)
    said_no_error = _rx(r"\bno (error|exception)s?\b|without (any )?(error|exception)|no errors?\b").search(
        text.title + " " + text.prose
    )
    incidental = _INCIDENTAL.search(text.prose)
    if s["crash"] and (said_no_error or incidental):
        s["crash"] *= 0.35
    if s["install"] >= 3.0 and s["crash"]:  # a build/import failure, even with a traceback
        s["crash"] *= 0.5
    if _TITLE_SYMPTOM.search(text.title):
        s["question"] *= 0.5
    if _GARBLED_TITLE.search(text.title) and not _TRACEBACK.search(text.code):
        s["crash"] *= 0.5
    said = text.title + "\n" + text.prose
    if s["performance"] and QUALITY_METRIC.search(said) and not SPEED_MEASURE.search(said):
        s["silent"] += 0.5 * s["performance"]  # "performance degradation" of a score is a wrong result
        s["performance"] *= 0.5
    return s


def to_confidence(scores: dict[str, float]) -> tuple[str, float]:
    """Scores -> (best label, its softmax probability)."""
    s = dict(scores)
    s["other"] = s.get("other", 0.0) + OTHER_PRIOR
    z = {k: math.exp(v / TEMPERATURE) for k, v in s.items()}
    best = max(LABELS, key=lambda k: (s[k], -LABELS.index(k)))
    return best, round(z[best] / sum(z.values()), 3)


def classify(title: str, body: str) -> Classification:
    """Issue title and body -> label, calibrated confidence, the cues that fired."""
    text = split_issue(title, body)
    scores, fired = cue_scores(text)
    for label, w in title_tag_scores(text.title).items():
        scores[label] += w
        fired.append(f"{label}:title tag")
    exc, exc_fired = exception_scores(text)
    for label, w in exc.items():
        scores[label] += w
    scores = interaction_rules(scores, text)
    label, confidence = to_confidence(scores)
    return Classification(label, confidence, {k: round(v, 2) for k, v in scores.items()}, tuple(fired + exc_fired))
