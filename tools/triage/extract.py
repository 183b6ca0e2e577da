"""Read a Scenario (docs/design.md §1) out of an issue's text with rules. Pure functions.

`extract_scenario(title, body) -> (partial, missing)`: `partial` is shaped like a scenario dict
(`model`, `target`, `workload`, `good_ref`) plus `meta` (engine name and version, model name as
written) that `tools.scenario.from_dict` ignores; `missing` names what the text did not say.
`to_scenario(partial)` gives a Scenario when the text had enough (a model and a prompt).
"""

from __future__ import annotations

import re

from tools.engines import BUILTIN, DEFAULT_ENGINE, MENTIONS
from tools.errors import BadInput
from tools.scenario import Scenario, ScenarioError, from_dict

MAX_PROMPTS = 8
MAX_PROMPT_CHARS = 4000
REQUIRED = ("model", "prompts")  # without these nothing can be run
USEFUL = ("engine", "engine_version", "dtype", "max_tokens", "temperature", "good_ref")

# Engine name -> how reporters write it (names, flags, APIs): engines reporters use, then the
# registered ones (tools.engines: their name, or how the registry says reporters write them). The
# default engine is usually the reference a reporter compares against, so it is the engine under
# test only when no other is named.
ENGINES = {
    "vllm": r"\bvllm\b|SamplingParams|--max-num-seqs|--enable-(prefix-caching|chunked-prefill)|enable_prefix_caching|--kv-cache-dtype|tensor_parallel_size",
    "sglang": r"\bsglang\b|radix.cache",
    "tensorrt-llm": r"tensorrt-llm|trt-llm|trtllm",
    **{name: rf"\b{re.escape(name)}\b" + (f"|{MENTIONS[name]}" if name in MENTIONS else "") for name in BUILTIN},
}
# Model family in a model name -> HF `model_type`; more specific names first.
ARCHS = (
    ("qwen2", r"distill-qwen"),
    ("llama", r"distill-llama"),
    ("mixtral", r"mixtral"),
    ("mistral", r"mistral"),
    ("gemma3", r"gemma-?3"),
    ("gemma2", r"gemma-?2"),
    ("gemma", r"gemma"),
    ("qwen3", r"qwen-?3"),
    ("qwen2", r"qwen-?2|qwen2\.5"),
    ("phi3", r"phi-?3|phi-?4"),
    ("olmo", r"olmo"),
    ("deepseek_v3", r"deepseek-(v3|r1)"),
    ("cohere", r"command-r"),
    ("llama", r"llama"),
)
DTYPE_NAMES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}

_VER = r"v?(\d+\.\d+(?:\.\d+)?(?:\.post\d+|rc\d+)?|b\d{4,5})"
_STR = r"(\"(?:[^\"\\\n]|\\.){1,%d}\"|'(?:[^'\\\n]|\\.){1,%d}')" % (MAX_PROMPT_CHARS, MAX_PROMPT_CHARS)
# A numbered or bulleted list item that is a quoted string: `1. "The capital of France is"`,
# `- 'Once upon a time'`, `* “Translate to German:”` (trailing words after the quote are allowed).
_LIST_PROMPT = re.compile(
    r"^[ \t>]*(?:\d{1,3}[.)]|[-*+•])[ \t]+(?:prompt[ \t]*\d*[ \t]*:[ \t]*)?"
    r"(?:\"([^\"\n]{1,%d})\"|“([^”\n]{1,%d})”|'([^'\n]{1,%d})')"
    % (MAX_PROMPT_CHARS, MAX_PROMPT_CHARS, MAX_PROMPT_CHARS),
    re.M | re.I,
)
# What each required field means to a reporter, for the error that names what is missing.
FIELD_HELP = {
    "model": "model (a checkpoint path or a model name whose family diffdx knows, e.g. llama, qwen2, mistral, gemma2)",
    "prompts": 'prompts (quoted strings: prompt="…", a numbered or bulleted list of "…", or a ```text block)',
}


def _first(patterns: list[str], text: str, flags=re.I) -> str | None:
    """The first group that matched, trying patterns in order."""
    for p in patterns:
        m = re.search(p, text, flags)
        if m:
            return next(g for g in m.groups() if g is not None)
    return None


def _largest(patterns: list[str], text: str) -> int | None:
    values = [int(v) for p in patterns for v in re.findall(p, text, re.I)]
    return max(values) if values else None


def find_engine(text: str) -> str | None:
    hits = [(name == DEFAULT_ENGINE, m.start(), name) for name, p in ENGINES.items() if (m := re.search(p, text, re.I))]
    return min(hits)[2] if hits else None


def find_engine_version(text: str, engine: str | None) -> str | None:
    name = re.escape(engine or "vllm").replace(r"\.", r"[.]?")
    return _first(
        [
            rf"{name}\s*(?:==|version:?|v)\s*{_VER}",
            rf"{_VER}\s+(?:is|was)\s+broken",
            rf"(?:upgrad\w*|updat\w*|going)\s+(?:\w+\s+)?from\s+(?:\w+\s+)?v?\d+\.\d+[\w.]*\s+to\s+{_VER}",
            rf"{name}\s+{_VER}\b",
            r"\bversion:?\s*" + _VER,
            r"\bbuild\s+" + _VER,
            r"\b(b\d{4,5})\b",
        ],
        text,
    )


def find_model(text: str) -> str | None:
    name = _first(
        [
            r"(?:\bmodel|model_path|model_name|pretrained_model_name_or_path)\s*=\s*[\"']([^\"']+)[\"']",
            r"--model(?:-path)?[ =]([^\s\"'`]+)",
            r"\bserve\s+([\w.-]+/[\w.-]+)",
            r"(?:^|\s)-m\s+([^\s\"'`]+)",
            r"\b([\w.-]+\.gguf)\b",
            r"\b((?:[\w-]+)/[\w.-]*(?:llama|mistral|mixtral|qwen|gemma|phi|olmo|deepseek|command|bge|internlm)[\w.-]*)",
        ],
        text,
    )
    return name.rstrip(".,;:)") if name else None


def find_arch(model: str | None, text: str) -> str | None:
    for source in (model or "", text):
        for arch, pattern in ARCHS:
            if re.search(pattern, source, re.I):
                return arch
    return None


def find_good_ref(text: str) -> str | None:
    """'worked in v0.4.2', 'b4800 was fine', 'downgrading to 0.5.5 fixes it', 'from 0.4.1 to 0.4.2'."""
    ref = _first(
        [
            rf"\b(?:worked|works|working|was (?:fine|correct|ok|good)|fine|correct)\s+(?:fine\s+|correctly\s+|well\s+)?(?:in|on|with|using)\s+(?:\w+\s+)?(?:version\s+)?{_VER}",
            rf"{_VER}\s+(?:was|is|works?)\s+(?:fine|ok|good|correct)",
            rf"(?:downgrad\w*|revert\w*|going back|roll\w* back)\s+to\s+(?:\w+\s+)?{_VER}",
            rf"(?:upgrad\w*|updat\w*|going|regression)\s+from\s+(?:\w+\s+)?{_VER}\s+to\b",
            rf"\b{_VER}\s*(?:->|→|to)\s*v?\d+\.\d+[\w.]*\s*(?:regress|broke|drop)",
            rf"after\s+\d+\.\d+[\w.]*\s*(?:->|→)\s*{_VER}",
        ],
        text,
    )
    if ref and ref[0].isdigit():
        return "v" + ref
    return ref


_WORKS = r".{0,60}\b(correct|fine|works?|matches|goes? away|fix\w*|ok)\b"


def _flag(text: str, py: str, cli: str, words: str) -> bool | None:
    """True when the text turns the option on, or says that turning it off makes it right."""
    if re.search(rf"{py}\s*=\s*True", text) or re.search(rf"{py}\s*=\s*False`?{_WORKS}", text, re.I):
        return True
    if re.search(rf"{py}\s*=\s*False", text):
        return False
    if re.search(rf"--(enable-)?{cli}\b", text) or re.search(
        rf"(enabl\w*|with|turn\w* on|using)\s+(the\s+)?{words}", text, re.I
    ):
        return True
    return None


def find_options(text: str) -> dict:
    """Engine options the text sets: prefix caching, chunked prefill, TP size, block/batch size."""
    opts = {
        "prefix_caching": _flag(text, "enable_prefix_caching", "prefix-caching", r"prefix.caching|radix"),
        "chunked_prefill": _flag(text, "enable_chunked_prefill", "chunked-prefill", r"chunked.prefill"),
        # a trigger shows at the larger size: "fine with TP=1, garbage with tensor_parallel_size=2"
        "tp_size": _largest(
            [
                r"tensor_parallel_size\s*=\s*(\d+)",
                r"(?:-tp|--tp|--tp-size|--tensor-parallel-size)[ =](\d+)",
                r"\bTP\s*=\s*(\d+)",
                r"\bTP\s*(\d+)\b",
                r"\btp (\d+)\b",
            ],
            text,
        ),
        "block_size": _first([r"block_size\s*=\s*(\d+)", r"--block-size[ =](\d+)", r"block.size (?:of )?(\d+)"], text),
        "batch_size": _largest(
            [
                r"batch_size\s*=\s*(\d+)",
                r"batch size (?:of |above ~?)?(\d+)",
                r"batch of (\d+)",
                r"-np (\d+)",
                r"(\d+) concurrent",
            ],
            text,
        ),
        "kv_cache_dtype": _first([r"kv_cache_dtype\s*=\s*[\"']?(\w+)", r"--kv-cache-dtype[ =](\w+)"], text),
        "max_model_len": _first([r"max_model_len\s*=\s*(\d+)", r"--max-model-len[ =](\d+)", r"(?:^|\s)-c (\d+)"], text),
    }
    return {k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in opts.items() if v is not None}


def find_dtype(text: str) -> str | None:
    word = _first(
        [
            r"\bdtype\s*=\s*[\"']?(\w+)",
            r"--dtype[ =](\w+)",
            r"torch_dtype\s*=\s*torch\.(\w+)",
            r"\b(bf16|bfloat16|fp16|float16|fp32|float32)\b",
        ],
        text,
    )
    return DTYPE_NAMES.get((word or "").lower())


def _unquote(s: str) -> str:
    return s[1:-1].encode().decode("unicode_escape", errors="replace") if "\\" in s else s[1:-1]


def find_prompts(text: str) -> list[str]:
    """Literal prompts: prompt="…", prompts=["…", …], "prompt"/"content": "…", -p "…", ```text blocks."""
    found = [m.group(1) for m in re.finditer(rf"\bprompt\s*[=:]\s*{_STR}", text)]
    for m in re.finditer(r"\bprompts\s*=\s*\[([^\]]*)\]", text):
        found += re.findall(_STR, m.group(1))
    found += [m.group(1) for m in re.finditer(rf"\"(?:prompt|content)\"\s*:\s*{_STR}", text)]
    found += [m.group(1) for m in re.finditer(rf"(?:\s-p|--prompt)\s+{_STR}", text)]
    prompts = [_unquote(s) for s in found]
    prompts += [b.strip() for b in re.findall(r"```(?:text|prompt)\n(.*?)```", text, re.S)]
    prompts += [next(g for g in m.groups() if g is not None) for m in _LIST_PROMPT.finditer(text)]
    unique = list(dict.fromkeys(p for p in prompts if p.strip()))
    return [p[:MAX_PROMPT_CHARS] for p in unique[:MAX_PROMPTS]]


def find_max_tokens(text: str) -> int | None:
    n = _first(
        [
            r"\bmax_(?:new_)?tokens\s*[=:]\s*(\d+)",
            r"\"max_tokens\"\s*:\s*(\d+)",
            r"(?:\s-n|--n-predict)\s+(\d+)",
            r"\bmax[_ ]tokens (?:of )?(\d+)",
        ],
        text,
    )
    return int(n) if n else None


def find_sampling(text: str) -> dict:
    s = {}
    temp = _first(
        [
            r"\btemperature\s*[=:]\s*([\d.]+)",
            r"\"temperature\"\s*:\s*([\d.]+)",
            r"--temp\s+([\d.]+)",
            r"\btemperature (?:of )?([\d.]+)",
        ],
        text,
    )
    if temp is not None:
        s["temperature"] = float(temp.rstrip("."))
    elif re.search(r"\bgreedy\b|do_sample\s*=\s*False", text, re.I):
        s["temperature"] = 0.0
    for key, cast in (("top_p", float), ("top_k", int), ("seed", int)):
        v = _first([rf"\b{key}\s*[=:]\s*(-?[\d.]+)"], text)
        if v is not None:
            s[key] = cast(v.rstrip("."))
    return s


_TOML_BLOCK = re.compile(r"```toml[^\n]*\n(.*?)```", re.S)


def attached_scenario(body: str) -> dict | None:
    """A ```toml block holding a complete diffdx scenario (DESIGN §1), as data. Issue text is
    untrusted: a local checkpoint path from it is never used, only seeded architectures."""
    from tools.scenario import loads

    for block in _TOML_BLOCK.findall(body or ""):
        try:
            scenario = loads(block)
        except ScenarioError:
            continue
        if "path" in scenario.model:
            continue
        return scenario.to_dict()
    return None


def extract_scenario(title: str, body: str) -> tuple[dict, list[str]]:
    """Issue text -> (partial scenario dict, names of what the text did not give)."""
    attached = attached_scenario(body)
    if attached is not None:
        return attached, []
    text = f"{title or ''}\n{body or ''}"
    engine, model_name = find_engine(text), find_model(text)
    arch, dtype, good_ref = find_arch(model_name, text), find_dtype(text), find_good_ref(text)
    prompts, max_tokens, sampling = find_prompts(text), find_max_tokens(text), find_sampling(text)
    model = {k: v for k, v in (("path", model_name), ("arch", arch)) if v}
    target = {"engine": engine, "dtype": dtype, "options": find_options(text)}
    request = {k: v for k, v in (("max_tokens", max_tokens), ("sampling", sampling)) if v}
    meta = {"engine": engine, "engine_version": find_engine_version(text, engine), "model": model_name}
    partial = {
        "model": model,
        "target": {k: v for k, v in target.items() if v is not None},
        "workload": {"requests": [{"prompt": p, **request} for p in prompts]},
        "meta": meta,
    }
    if good_ref:
        partial["good_ref"] = good_ref
    found = {
        "model": bool(model),
        "prompts": bool(prompts),
        "engine": bool(engine),
        "engine_version": bool(meta["engine_version"]),
        "dtype": bool(dtype),
        "max_tokens": max_tokens is not None,
        "temperature": "temperature" in sampling,
        "good_ref": bool(good_ref),
    }
    return partial, [k for k in REQUIRED + USEFUL if not found[k]]


def to_scenario(partial: dict) -> Scenario | None:
    """A runnable Scenario from an extraction, or None when it lacks a model or a prompt."""
    try:
        return require_scenario(partial)
    except BadInput:
        return None


def require_scenario(partial: dict) -> Scenario:
    """A runnable Scenario from an extraction, or a BadInput naming each missing field."""
    missing = [
        FIELD_HELP[k]
        for k, ok in (("model", partial.get("model")), ("prompts", (partial.get("workload") or {}).get("requests")))
        if not ok
    ]
    if missing:
        raise BadInput(
            "the issue does not say enough to reproduce it; missing: "
            + "; ".join(missing)
            + ". Add them to the issue or give a repro.toml (--repro)"
        )
    data = {k: v for k, v in partial.items() if k != "meta"}
    data["target"] = {"engine": DEFAULT_ENGINE, **partial.get("target", {})}
    try:
        return from_dict(data)
    except ScenarioError as e:
        raise BadInput(f"the scenario read from the issue is not runnable: {e}") from None
