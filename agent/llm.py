"""The LLM (docs/design.md §7): any OpenAI-compatible endpoint, with a read-only tool loop.

`LLM.ask(system, user, tools)` returns the model's final answer as a JSON object. On the
way the model may call the `ToolBox`'s tools (search/read source, callers, callees, a
commit's diff, probe a trigger variant): with native tool calling where the endpoint has
it, else through a JSON protocol (`{"tool": …, "arguments": …}` answers) in JSON mode,
else plain text from which the first JSON object is read.

Every failure is typed so the policy can retry once and then fall back: `LLMTimeout`,
`LLMRateLimited` (after bounded retries honouring Retry-After), `LLMMalformed` (non-JSON
answer, non-JSON or unknown tool call), `LLMBudgetSpent` (calls or tokens used up).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.config import DEFAULT_MODEL
from prompts import render as render  # re-exported: the policies and triage render through agent.llm

MODES = ("tools", "json", "plain")  # tried in this order; an endpoint that refuses one drops to the next
MAX_TOOL_OUTPUT = 6000  # characters of one tool result shown to the model
MAX_RETRY_WAIT_S = 30.0


class LLMError(RuntimeError):
    kind = "error"


class LLMTimeout(LLMError):
    kind = "timeout"


class LLMRateLimited(LLMError):
    kind = "rate_limit"


class LLMMalformed(LLMError):
    kind = "malformed"


class LLMBudgetSpent(LLMError):
    kind = "budget"


@dataclass
class Usage:
    calls: int = 0  # requests sent (failed ones too: they cost a round trip)
    tokens_in: int = 0  # sum of usage.prompt_tokens
    tokens_out: int = 0  # sum of usage.completion_tokens


class ToolBox(Protocol):
    def specs(self) -> list[dict]:
        """OpenAI `tools` entries ({"type": "function", "function": {...}})."""

    def call(self, name: str, arguments: dict) -> str:
        """Run one tool; raises LLMMalformed for an unknown tool or bad arguments."""


class LLM(Protocol):
    usage: Usage

    def ask(self, system: str, user: str, tools: ToolBox | None = None) -> dict:
        """The final answer as a JSON object, after any tool calls."""


def parse_json_object(text: str | None) -> dict | None:
    """The JSON object in a model's answer (code fences and chatter around it tolerated). Pure."""
    m = re.search(r"\{.*\}", text or "", re.S)
    try:
        obj = json.loads(m.group(0)) if m else None
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def tool_arguments(raw: str | None) -> dict:
    """A tool call's `arguments` string -> dict; LLMMalformed when it is not a JSON object."""
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        raise LLMMalformed(f"tool call arguments are not JSON: {str(raw)[:120]!r}") from None
    if not isinstance(args, dict):
        raise LLMMalformed(f"tool call arguments are not an object: {str(raw)[:120]!r}")
    return args


def retry_after(headers, attempt: int, base_s: float) -> float:
    """Seconds to wait before retrying a 429: the server's Retry-After, else exponential. Pure."""
    value = (headers or {}).get("retry-after", "")
    try:
        return min(MAX_RETRY_WAIT_S, max(0.0, float(value)))
    except (TypeError, ValueError):
        return min(MAX_RETRY_WAIT_S, base_s * 2**attempt)


@dataclass
class OpenAIChat:
    """`LLM` over the `openai` client; base_url and api_key come from the run's config (None: the
    client's own defaults)."""

    model: str = DEFAULT_MODEL
    base_url: str | None = None
    api_key: str | None = None
    timeout_s: float = 60.0
    retries: int = 2  # per request, on 429 / connection errors / 5xx
    retry_wait_s: float = 1.0
    max_calls: int = 40
    max_tokens: int = 400_000
    max_tool_rounds: int = 6
    answer_tokens: int | None = None  # max_tokens of each request (None: the endpoint's own limit)
    mode: str = "tools"  # dropped to "json", then "plain", when the endpoint refuses
    usage: Usage = field(default_factory=Usage)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def __post_init__(self):
        from openai import OpenAI  # only when an LLM is asked for

        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        key = self.api_key or "none"  # a local endpoint may take no key; the client refuses None
        self.client = OpenAI(base_url=self.base_url, api_key=key, timeout=self.timeout_s, max_retries=0)

    def ask(self, system: str, user: str, tools: ToolBox | None = None) -> dict:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        for round_ in range(self.max_tool_rounds + 1):
            offer = tools if round_ < self.max_tool_rounds else None  # last round: answer now
            message = self._complete(messages, offer)
            if message.tool_calls:
                self._run_native_calls(message, messages, tools)
                continue
            answer = parse_json_object(message.content)
            if answer is None:
                raise LLMMalformed(f"answer is not a JSON object: {(message.content or '')[:200]!r}")
            if offer is not None and "tool" in answer and self.mode != "tools":
                self._run_json_call(answer, message.content, messages, offer)
                continue
            return answer
        raise LLMMalformed(f"no final answer after {self.max_tool_rounds} tool rounds")

    # --- one request ------------------------------------------------------------------------
    def _complete(self, messages: list[dict], tools: ToolBox | None):
        import openai

        while True:
            try:
                return self._send(self._request(messages, tools))
            except openai.BadRequestError as e:
                if self.mode == MODES[-1]:
                    raise LLMError(f"endpoint refused the request: {e}") from None
                self.mode = MODES[MODES.index(self.mode) + 1]  # e.g. no tool calling: try JSON mode

    def _request(self, messages: list[dict], tools: ToolBox | None) -> dict:
        kwargs = {"model": self.model, "messages": messages, "temperature": 0.0}
        if self.answer_tokens is not None:  # a weak local model may ramble until its context is full
            kwargs["max_tokens"] = self.answer_tokens
        if tools is not None and self.mode == "tools":
            kwargs.update(tools=tools.specs(), tool_choice="auto")
            return kwargs
        if tools is not None:  # the JSON tool protocol, explained in the system message
            extra = render("json_tools.j2", tools=[t["function"] for t in tools.specs()])
            kwargs["messages"] = [{**messages[0], "content": messages[0]["content"] + "\n\n" + extra}, *messages[1:]]
        if self.mode == "json":
            kwargs["response_format"] = {"type": "json_object"}
        return kwargs

    def _send(self, kwargs: dict):
        import openai

        error: LLMError
        for attempt in range(self.retries + 1):
            self._check_budget()
            self.usage.calls += 1
            try:
                response = self.client.chat.completions.create(**kwargs)
            except openai.APITimeoutError:
                raise LLMTimeout(f"no answer within {self.timeout_s:g}s") from None
            except openai.RateLimitError as e:
                error, wait = (
                    LLMRateLimited(f"rate limited (HTTP 429): {e}"),
                    retry_after(e.response.headers, attempt, self.retry_wait_s),
                )
            except (openai.APIConnectionError, openai.InternalServerError) as e:
                error, wait = LLMError(f"{type(e).__name__}: {e}"), self.retry_wait_s * 2**attempt
            except openai.BadRequestError:
                raise
            except openai.OpenAIError as e:  # auth, 404, unparseable response bodies, …
                raise LLMError(f"{type(e).__name__}: {e}") from None
            else:
                return self._account(response)
            if attempt < self.retries:
                self.sleep(wait)
        raise error

    def _account(self, response):
        usage = getattr(response, "usage", None)
        if usage is not None:
            self.usage.tokens_in += int(usage.prompt_tokens or 0)
            self.usage.tokens_out += int(usage.completion_tokens or 0)
        if not getattr(response, "choices", None):
            raise LLMMalformed("response has no choices")
        return response.choices[0].message

    def _check_budget(self) -> None:
        if self.usage.calls >= self.max_calls:
            raise LLMBudgetSpent(f"LLM call budget spent ({self.max_calls} calls)")
        if self.usage.tokens_in + self.usage.tokens_out >= self.max_tokens:
            raise LLMBudgetSpent(f"LLM token budget spent ({self.max_tokens} tokens)")

    # --- tool calls ---------------------------------------------------------------------------
    def _run_native_calls(self, message, messages: list[dict], tools: ToolBox | None) -> None:
        if tools is None:
            raise LLMMalformed("the model called a tool where none was offered")
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
        messages.append({"role": "assistant", "content": message.content or "", "tool_calls": calls})
        for c in message.tool_calls:
            result = tools.call(c.function.name, tool_arguments(c.function.arguments))
            messages.append({"role": "tool", "tool_call_id": c.id, "content": result[:MAX_TOOL_OUTPUT]})

    def _run_json_call(self, answer: dict, raw: str, messages: list[dict], tools: ToolBox) -> None:
        args = answer.get("arguments", {})
        if not isinstance(answer["tool"], str) or not isinstance(args, dict):
            raise LLMMalformed(f"malformed JSON tool call: {raw[:200]!r}")
        result = tools.call(answer["tool"], args)
        messages.append({"role": "assistant", "content": raw})
        messages.append(
            {
                "role": "user",
                "content": render("json_tool_result.j2", tool=answer["tool"], result=result[:MAX_TOOL_OUTPUT]),
            }
        )


# --- the tools the model may call: read-only, or probes of the target in its own processes -----

SAFE_REF = re.compile(r"[0-9A-Za-z][0-9A-Za-z._/~^-]{0,100}")  # no leading '-': never a git option


class SourceTools:
    """`ToolBox` over the target's source (tools.source.index), history (tools.history.gitrepo) and trigger
    variants (tools.reproduce, through `run_variant`). Nothing here writes: the index reads
    files or git objects, diffs are read from git, and a variant probe runs the engine in its
    own process on the source tree as it is. `log` records every call that ran."""

    NAMES = ("search_symbols", "read_function", "callers", "callees", "commit_diff", "run_variant")

    def __init__(
        self, repo: Path | None, run_variant: Callable[[str], str] | None = None, variants: list[str] | None = None
    ):
        self.repo = Path(repo) if repo else None
        self.variant_runner = run_variant
        self.variants = list(variants or [])
        self.log: list[tuple[str, dict]] = []

    def specs(self) -> list[dict]:
        specs = json.loads(render("tools.json.j2", variants=self.variants))
        offered = self._offered()
        return [s for s in specs if s["function"]["name"] in offered]

    def call(self, name: str, arguments: dict) -> str:
        if name not in self._offered():
            raise LLMMalformed(f"unknown tool {name!r}; tools: {', '.join(self._offered())}")
        try:
            result = getattr(self, "_" + name)(**arguments)
        except TypeError as e:
            raise LLMMalformed(f"bad arguments for {name}: {e}") from None
        self.log.append((name, dict(arguments)))
        return result

    def _offered(self) -> tuple[str, ...]:
        names = self.NAMES if self.repo is not None else ("run_variant",)
        return tuple(n for n in names if n != "run_variant" or self.variant_runner is not None)

    def _index(self):
        from tools.source.index import open_index

        return open_index(self.repo, include_tests=False)

    def _search_symbols(self, query: str, limit: int = 10) -> str:
        hits = self._index().search(str(query), limit=max(1, min(int(limit), 25)))
        return (
            "\n".join(f"{s.qualname} ({s.kind}) {s.file}:{s.start_line}-{s.end_line}  {s.doc}" for s in hits)
            or "no match"
        )

    def _read_function(self, name: str, file: str = "") -> str:
        hits = [s for s in self._index().find(str(name)) if not file or s.file == file]
        if not hits:
            return f"error: no symbol named {name!r}" + (f" in {file}" if file else "")
        s = hits[0]
        return f"# {s.file}:{s.start_line}-{s.end_line} {s.qualname}\n" + self._index().read(s)

    def _callers(self, name: str) -> str:
        return (
            "\n".join(f"{s.qualname} {s.file}:{s.start_line}" for s in self._index().callers(str(name)))
            or "no callers found"
        )

    def _callees(self, name: str) -> str:
        hits = self._index().find(str(name))
        return ", ".join(self._index().callees(hits[0])) if hits else f"error: no symbol named {name!r}"

    def _commit_diff(self, commit: str) -> str:
        from tools.history.gitrepo import GitError, commit_diff, commit_info

        if self.repo is None:
            return "error: no repository"
        if not SAFE_REF.fullmatch(str(commit)):
            return f"error: {commit!r} is not a commit reference"
        try:
            info = commit_info(self.repo, commit)
            return f"commit {info.sha}\n{info.message}\n\n" + commit_diff(self.repo, info.sha)
        except GitError as e:
            return f"error: {e}"

    def _run_variant(self, name: str) -> str:
        if name not in self.variants:
            return f"error: unknown variant {name!r}; variants: {', '.join(self.variants)}"
        if self.variant_runner is None:
            return "error: no engine to run variants on"
        return self.variant_runner(name)
