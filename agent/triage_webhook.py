"""GitHub webhook receiver for `issues` events (opened, edited, reopened).

Every request is checked against `X-Hub-Signature-256` (HMAC-SHA256 of the raw body with the
shared secret, compared in constant time) before its body is parsed: 401 when it is missing or
forged. Accepted events answer 202 at once and go to a queue; one worker thread runs the triage
pipeline on them in arrival order. Other events and actions answer 200 and are ignored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACTIONS = ("opened", "edited", "reopened")
MAX_PAYLOAD = 5 * 1024 * 1024


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    return header is not None and hmac.compare_digest(sign(secret, body), header)


def accepted_issue(event: str | None, payload: dict) -> tuple[str, dict] | None:
    """(repo, issue) when the event is one triage handles, else None. Pure."""
    if event != "issues" or payload.get("action") not in ACTIONS:
        return None
    issue, repo = payload.get("issue"), (payload.get("repository") or {}).get("full_name")
    if not isinstance(issue, dict) or not repo or "pull_request" in issue:
        return None
    return repo, issue


def content_length(header: str | None) -> int | None:
    """The Content-Length header as a byte count; None when absent, not a number or negative
    (reading a negative length would wait for the client to close the connection). Pure."""
    text = (header or "").strip()
    return int(text) if text.isdigit() else None


class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, secret: str, handle: Callable[[str, dict], object]):
        # the queue exists before binding: a failed bind calls server_close(), which uses it
        self.secret, self.handle = secret, handle
        self.jobs: queue.Queue = queue.Queue()
        super().__init__(addr, _Handler)
        self.worker = threading.Thread(target=self._work, daemon=True, name="triage-worker")
        self.worker.start()

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                self.handle(*job)
            except Exception as e:  # one bad issue must not stop the worker
                print(f"triage: webhook job failed: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                self.jobs.task_done()

    def server_close(self) -> None:
        self.jobs.put(None)
        super().server_close()


class _Handler(BaseHTTPRequestHandler):
    server: WebhookServer

    def do_POST(self) -> None:
        length = content_length(self.headers.get("Content-Length"))
        if length is None:
            return self._reply(400, {"error": "missing or malformed Content-Length"})
        if length > MAX_PAYLOAD:
            return self._reply(413, {"error": "payload too large"})
        body = self.rfile.read(length)
        if not signature_ok(self.server.secret, body, self.headers.get("X-Hub-Signature-256")):
            return self._reply(401, {"error": "bad or missing signature"})
        try:
            payload = json.loads(body)
        except ValueError:
            return self._reply(400, {"error": "body is not JSON"})
        if not isinstance(payload, dict):
            return self._reply(400, {"error": "body is not a JSON object"})
        job = accepted_issue(self.headers.get("X-GitHub-Event"), payload)
        if job is None:
            return self._reply(200, {"ignored": True})
        self.server.jobs.put(job)
        self._reply(202, {"accepted": f"{job[0]}#{job[1].get('number')}"})

    def _reply(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args) -> None:  # request lines only; headers (signatures) never
        print(f"webhook: {self.address_string()} {fmt % args}", file=sys.stderr)
