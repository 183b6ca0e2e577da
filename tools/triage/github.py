"""A small GitHub REST client over urllib: issues, comments, labels.

Rate limits (403/429 with `Retry-After` or `X-RateLimit-Reset`), 5xx and network errors are
retried with bounded exponential backoff; a wait longer than `max_wait_s` is not slept through
but raised as `RateLimited`. The token (the caller's: agent.config reads $GITHUB_TOKEN) goes in
the Authorization header only; it is never part of a message, an exception or the client's repr.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from tools.errors import HostUnreachable

DEFAULT_API = "https://api.github.com"
USER_AGENT = "diffdx-triage"


class GitHubError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, message: str = ""):
        super().__init__(f"GitHub {method} {path} -> {status} {message}".strip())
        self.status = status


class RateLimited(GitHubError):
    """The API asks us to wait longer than we are willing to."""


class GitHubUnreachable(GitHubError, HostUnreachable):
    """No HTTP answer at all (DNS, refused connection, timeout): the host could not be reached."""

    def __init__(self, host: str, reason: str):
        RuntimeError.__init__(
            self,
            f"could not reach the GitHub API at {host} ({reason}); check the network or --api-url / $GITHUB_API_URL",
        )
        self.status = 0


CONNECT_RETRIES = 2  # a host that does not answer is retried briefly, not max_retries times


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: object


def retry_delay(status: int, headers: dict[str, str], attempt: int, now: float, base_s: float = 1.0) -> float | None:
    """Seconds to wait before retrying, or None when the response is final. Pure."""
    h = {k.lower(): v for k, v in headers.items()}
    limited = status == 429 or (status == 403 and ("retry-after" in h or h.get("x-ratelimit-remaining") == "0"))
    if limited:
        if "retry-after" in h and h["retry-after"].strip().isdigit():
            return float(h["retry-after"])
        if h.get("x-ratelimit-reset", "").strip().isdigit():
            return max(0.0, float(h["x-ratelimit-reset"]) - now)
        return base_s * 60  # secondary rate limit without a hint: GitHub asks for about a minute
    if status >= 500 or status == 0:  # 0: the connection failed
        return base_s * 2**attempt
    return None


def next_link(headers: dict[str, str]) -> str | None:
    """The rel="next" URL of a paginated response."""
    link = {k.lower(): v for k, v in headers.items()}.get("link", "")
    m = re.search(r'<([^>]+)>;\s*rel="next"', link)
    return m.group(1) if m else None


@dataclass
class GitHub:
    base_url: str = DEFAULT_API
    token: str | None = field(default=None, repr=False)
    max_retries: int = 4
    max_wait_s: float = 120.0
    timeout_s: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    # --- endpoints -------------------------------------------------------------------------
    def list_issues(self, repo: str, since: str | None = None, state: str = "open") -> list[dict]:
        """Issues (not pull requests) of a repo, all pages; `since` is an ISO 8601 timestamp."""
        query = {"state": state, "per_page": "100", **({"since": since} if since else {})}
        items = self._paginate(f"/repos/{repo}/issues?{urllib.parse.urlencode(query)}")
        return [i for i in items if "pull_request" not in i]

    def get_issue(self, repo: str, number: int) -> dict:
        body = self.request("GET", f"/repos/{repo}/issues/{number}").body
        if not isinstance(body, dict) or "number" not in body:  # e.g. an HTML page from a proxy
            raise GitHubError(200, "GET", f"/repos/{repo}/issues/{number}", "the answer is not an issue")
        return body

    def list_comments(self, repo: str, number: int) -> list[dict]:
        return self._paginate(f"/repos/{repo}/issues/{number}/comments?per_page=100")

    def create_comment(self, repo: str, number: int, body: str) -> dict:
        return self.request("POST", f"/repos/{repo}/issues/{number}/comments", {"body": body}).body  # type: ignore[return-value]

    def add_labels(self, repo: str, number: int, labels: list[str]) -> list[dict]:
        return self.request("POST", f"/repos/{repo}/issues/{number}/labels", {"labels": labels}).body  # type: ignore[return-value]

    # --- transport -------------------------------------------------------------------------
    def _paginate(self, path: str, max_pages: int = 50) -> list[dict]:
        items: list[dict] = []
        url: str | None = path
        for _ in range(max_pages):
            if not url:
                break
            resp = self.request("GET", url)
            items += resp.body if isinstance(resp.body, list) else []
            url = next_link(resp.headers)
        return items

    def request(self, method: str, path: str, payload: dict | None = None) -> Response:
        """One API call with retries. `path` is relative to base_url or an absolute API URL."""
        for attempt in range(self.max_retries + 1):
            resp = self._send(method, path, payload)
            if 0 < resp.status < 400:  # 0: no answer at all, never a success
                return resp
            delay = retry_delay(resp.status, resp.headers, attempt, time.time())
            if delay is None or attempt == self.max_retries or (resp.status == 0 and attempt >= CONNECT_RETRIES):
                break
            if delay > self.max_wait_s:
                raise RateLimited(resp.status, method, _path_only(path), f"(retry in {delay:.0f}s)")
            self.sleep(delay)
        if resp.status == 0:
            raise GitHubUnreachable(self._host(path), _message(resp.body))
        raise GitHubError(resp.status, method, _path_only(path), _message(resp.body))

    def _host(self, path: str) -> str:
        url = path if path.startswith("http") else self.base_url
        return urllib.parse.urlsplit(url).hostname or url

    def _send(self, method: str, path: str, payload: dict | None) -> Response:
        url = path if path.startswith("http") else self.base_url.rstrip("/") + path
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return Response(r.status, dict(r.headers), _json(r.read()))
        except urllib.error.HTTPError as e:
            return Response(e.code, dict(e.headers or {}), _json(e.read()))
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            return Response(0, {}, {"message": f"{type(e).__name__}: {reason}"})
        except ValueError as e:  # a malformed --api-url: no scheme, bad port
            return Response(0, {}, {"message": f"bad URL: {e}"})

    def _headers(self) -> dict[str, str]:
        h = {
            "Accept": "application/vnd.github+json",
            "User-Agent": USER_AGENT,
            "X-GitHub-Api-Version": "2022-11-28",
            "Content-Type": "application/json",
        }
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h


def _json(raw: bytes):
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"message": raw[:200].decode("utf-8", "replace")}


def _message(body) -> str:
    return str(body.get("message", ""))[:200] if isinstance(body, dict) else ""


def _path_only(path: str) -> str:
    """Drop scheme, host and query: error messages never carry URLs with credentials or tokens."""
    return urllib.parse.urlsplit(path).path or path
