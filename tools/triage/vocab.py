"""Tracker vocabulary masked before the triage model's n-grams. Pure functions.

A model fitted on issues from a few trackers learns their names as evidence: a project's own name, the model
families its users run, version strings and hardware ids say which tracker an issue came from, and the label mix
of that tracker, not what the reporter says happened. Replacing them by a placeholder word per kind keeps the
sentence ("differs from <project>", "after upgrading to <version>", "<model> outputs garbage") and drops the
tracker. The rules (`tools.triage.rules`) and the report shape (`tools.triage.evidence`) read the raw text.

Placeholders are plain lower-case words the n-gram tokenizers keep whole: `xproject`, `xmodel`, `xversion`,
`xdtype`, `xquant`, `xid` (any other word with digits in it), `xurl`, `xpath`.
"""

from __future__ import annotations

import re

# Inference engines, servers and desktop apps: the trackers themselves and the ones their users compare with.
# Kept: the reference implementations an issue compares against (transformers, PyTorch, Hugging Face), whose
# name is part of "differs from the reference" rather than of which tracker it came from.
_PROJECT = (
    r"v-?llm(-\w+)*|sg-?lang(-\w+)*|sgl-kernel|llama[.\-_ ]?cpp(-python)?|ik_llama|o-?llama(-python)?|lmdeploy"
    r"|turbomind|tensorrt[-_ ]?llm|trt[-_ ]?llm(-build)?|trtllm(-\w+)*|tensorrt|triton(-\w+)*|fastertransformer"
    r"|text-generation-inference|tgi(-\w+)?|local-?ai|gpt4all|kobold(cpp|ai)?|llamafile|lm ?studio|lms"
    r"|exllama(v\d)?|exl\d|tabby-?api|tabby|mlc[-_]?llm|mlc|web-?llm|ctranslate2?|ct2|opennmt(-\w+)?|xinference"
    r"|ipex[-_]?llm|ipex|ktransformers|mlx(-\w+)*|aphrodite|mistral\.rs|openvino(\.genai)?|onnxruntime(-genai)?"
    r"|ort-genai|mnn(-llm)?|deepspeed(-mii)?|fastchat|lightllm|mediapipe|executorch|candle|gpustack|lorax"
    r"|litert(-lm)?|powerinfer|autogptq|gptqmodel|autoawq|llamasharp|ggml|jan|cortex(\.cpp)?|oobabooga"
    r"|text-generation-webui|textgen|vllm_ascend|ascend-vllm"
)
# Model families (with what follows: sizes, versions, suffixes), as users name them in reports.
_MODEL = (
    r"(code)?llama|llava|qwen|qwq|mistral|mixtral|ministral|gemma|deepseek|phi|chatglm|glm|internlm|internvl"
    r"|baichuan|falcon|gpt-?oss|gpt-?j|gpt-?neox|gpt-?2|bloom|mpt|starcoder|vicuna|minicpm|kimi|olmo|granite"
    r"|nemotron|exaone|smollm|whisper|rwkv|mamba|jamba|dbrx|grok|stablelm|tinyllama|zephyr|hermes|wizardlm"
    r"|solar|cohere|command-r|yi|opt|t5|bert|seed-oss|hunyuan|ernie|step\d?|minimax|aquila|orion|xverse"
)
_RULES = [
    (re.compile(r"https?://\S+|www\.\S+", re.I), " xurl "),
    (re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-]+){2,}[\\/]?"), " xpath "),
    (re.compile(rf"(?<![A-Za-z0-9_\-])(?:{_PROJECT})(?![A-Za-z0-9_])", re.I), " xproject "),
    (re.compile(rf"(?<![A-Za-z0-9_\-])(?:{_MODEL})(?![a-z])(?:[\w.\-:]*[A-Za-z0-9])?", re.I), " xmodel "),
    (re.compile(r"(?<![\w.])v?\d+(?:\.\d+){1,3}(?:[\w\-+]*\w)?", re.I), " xversion "),
    (re.compile(r"(?<![\w.])(?:fp|bf|int|uint|nf|mxfp|nvfp|w\d+a)\d+\w*", re.I), " xdtype "),
    (re.compile(r"(?<![\w.])(?:i?q\d(?:_[a-z0-9]+)+|q\d|\d+[- ]?bits?)(?!\w)", re.I), " xquant "),
    (re.compile(r"(?<![\w.])(?=[\w\-]*\d)(?=[\w\-]*[A-Za-z])[\w\-]+", re.I), " xid "),
]


def mask(text: str) -> str:
    """`text` with project, model, version, dtype, quant and id words replaced by placeholder words. Pure."""
    for rx, placeholder in _RULES:
        text = rx.sub(placeholder, text)
    return text
