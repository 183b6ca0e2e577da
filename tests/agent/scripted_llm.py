"""A scripted model behind a real HTTP server speaking the OpenAI chat-completions protocol.

    with ScriptedLLM([tool_call("search_symbols", query="rope"), answer({"order": [0]})]) as llm:
        OpenAIChat(base_url=llm.url, ...)

The script is a list of replies (served in order; the last one repeats once the list is
used up) or a function `request dict -> reply`. Replies: `answer(obj_or_text)`,
`tool_call(tool, **args)` (or raw argument text), `garbage()`, `slow(seconds)`,
`status(429, retry_after=0)`, `refuse_tools()` (400 when the request offers tools, else
the wrapped reply). Every request body is recorded in `requests`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments text)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    raw: bytes | None = None  # a body that is not OpenAI JSON
    unless_tools: Reply | None = None  # refuse_tools: used when no tools offered
    usage: tuple[int, int] = (11, 7)


def answer(obj) -> Reply:
    return Reply(content=obj if isinstance(obj, str) else json.dumps(obj))


def tool_call(tool: str, raw_arguments: str | None = None, /, **kwargs) -> Reply:
    """A reply calling `tool` with `kwargs` as arguments (or with `raw_arguments` text as is)."""
    return Reply(tool_calls=[(tool, raw_arguments if raw_arguments is not None else json.dumps(kwargs))])


def garbage(text: str = "Sure! The bug is probably somewhere in attention, I think.") -> Reply:
    return Reply(content=text)


def slow(seconds: float, then: Reply | None = None) -> Reply:
    then = then or answer({})
    return Reply(content=then.content, tool_calls=then.tool_calls, delay_s=seconds)


def status(code: int, retry_after: float | None = 0, message: str = "rate limited") -> Reply:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Reply(status=code, headers=headers, raw=json.dumps({"error": {"message": message, "type": "x"}}).encode())


def refuse_tools(otherwise: Reply) -> Reply:
    return Reply(
        status=400,
        raw=json.dumps(
            {"error": {"message": "tools are not supported by this model", "type": "invalid_request_error"}}
        ).encode(),
        unless_tools=otherwise,
    )


def completion(req: dict, reply: Reply, n: int) -> dict:
    message: dict = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{n}_{i}", "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(reply.tool_calls)
        ]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": req.get("model", "scripted"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
        "usage": {
            "prompt_tokens": reply.usage[0],
            "completion_tokens": reply.usage[1],
            "total_tokens": sum(reply.usage),
        },
    }


class ScriptedLLM:
    def __init__(self, script: list[Reply] | Callable[[dict], Reply]):
        self.script = script
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.block_on_close = False
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def next_reply(self, req: dict) -> tuple[Reply, int]:
        with self._lock:
            self.requests.append(req)
            n = len(self.requests)
            if callable(self.script):
                return self.script(req), n
            return self.script[min(n - 1, len(self.script) - 1)], n

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(404, {}, b'{"error": {"message": "not found"}}')
                reply, n = fake.next_reply(body)
                if reply.unless_tools is not None and "tools" not in body:
                    reply = reply.unless_tools
                time.sleep(reply.delay_s)
                data = reply.raw if reply.raw is not None else json.dumps(completion(body, reply, n)).encode()
                self._send(reply.status, reply.headers, data)

            def _send(self, code: int, headers: dict, data: bytes):
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args):
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ScriptedLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def task_of(req: dict) -> str:
    """Which prompt a request carries: read_issue | order_triggers | rank | propose_patch | other."""
    user = next((m.get("content") or "" for m in req.get("messages", []) if m.get("role") == "user"), "")
    for key, marker in (
        ("read_issue", "fill in what a reproduction"),
        ("order_triggers", "order in which to try"),
        ("rank", "rank candidate root causes"),
        ("propose_patch", "propose a fix for one suspected function"),
    ):
        if marker in user:
            return key
    return "other"
