"""An in-process HTTP server shaped like the GitHub REST API, for tests (not a mock: the
client under test talks real HTTP to it). It serves a few issues, records every request and
what was posted, and can answer the next N requests with a rate-limit response."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class FakeGitHub:
    def __init__(self, issues: list[dict], repo: str = "acme/engine", page_size: int = 2):
        self.repo, self.page_size = repo, page_size
        self.issues = {i["number"]: dict(i) for i in issues}
        self.comments: dict[int, list[dict]] = {}
        self.labels: dict[int, list[str]] = {}
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers)
        self.rate_limit_next = 0  # answer this many requests with 429
        self.rate_limit_headers = {"Retry-After": "0"}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def posted(self, method: str = "POST") -> list[str]:
        return [path for m, path, _ in self.requests if m == method]

    def edit(self, number: int, **changes) -> None:
        self.issues[number].update(changes)

    # --- routing -------------------------------------------------------------------------
    def route(self, method: str, path: str, body: dict | None):
        base = f"/repos/{self.repo}/issues"
        url = urlsplit(path)
        if method == "GET" and url.path == base:
            return self._page(int(parse_qs(url.query).get("page", ["1"])[0]))
        m = re.fullmatch(rf"{base}/(\d+)(/comments|/labels)?", url.path)
        if not m or int(m.group(1)) not in self.issues:
            return 404, {"message": "Not Found"}, {}
        n, sub = int(m.group(1)), m.group(2)
        if method == "GET" and sub is None:
            return 200, self.issues[n], {}
        if sub == "/comments" and method == "GET":
            return 200, self.comments.get(n, []), {}
        if sub == "/comments" and method == "POST":
            comment = {"id": 1000 + sum(map(len, self.comments.values())), "body": body["body"]}
            self.comments.setdefault(n, []).append(comment)
            return 201, comment, {}
        if sub == "/labels" and method == "POST":
            self.labels.setdefault(n, []).extend(body["labels"])
            return 200, [{"name": x} for x in self.labels[n]], {}
        return 405, {"message": "Method Not Allowed"}, {}

    def _page(self, page: int):
        items = sorted(self.issues.values(), key=lambda i: i["number"])
        chunk = items[(page - 1) * self.page_size : page * self.page_size]
        headers = {}
        if page * self.page_size < len(items):
            headers["Link"] = f'<{self.url}/repos/{self.repo}/issues?page={page + 1}>; rel="next"'
        return 200, chunk, headers


def _handler(fake: FakeGitHub):
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with fake.lock:
                fake.requests.append((method, self.path, dict(self.headers)))
                if fake.rate_limit_next:
                    fake.rate_limit_next -= 1
                    status, obj, headers = 429, {"message": "rate limited"}, fake.rate_limit_headers
                else:
                    status, obj, headers = fake.route(method, self.path, json.loads(raw) if raw else None)
            data = json.dumps(obj).encode()
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

        def log_message(self, *args):
            pass

    return Handler
