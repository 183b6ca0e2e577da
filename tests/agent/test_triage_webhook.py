"""Webhook server: signed `issues` events are accepted and triaged; forged ones are refused."""

import json
import threading
import urllib.error
import urllib.request

import pytest

from agent.triage import Context, Reader, triage_issue
from agent.triage_state import TriageState
from agent.triage_webhook import WebhookServer, sign
from tests.tools.fake_github import FakeGitHub
from tools.triage.github import GitHub

SECRET = "s3cret-webhook"
ISSUE = {
    "number": 21,
    "updated_at": "2024-06-01T00:00:00Z",
    "title": "llama-server segfaults on start",
    "body": "```\nSegmentation fault (core dumped)\n```",
}


def deliver(url, payload, event="issues", signature="valid"):
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": event}
    if signature == "valid":
        headers["X-Hub-Signature-256"] = sign(SECRET, body)
    elif signature:
        headers["X-Hub-Signature-256"] = signature
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def setup(tmp_path):
    with FakeGitHub([ISSUE]) as fake:
        state = TriageState(tmp_path / "state.sqlite")
        base = Context(
            repo="", reader=Reader(), diagnoser=None, state=state, gh=GitHub(base_url=fake.url), post=True, label=True
        )
        handled = []

        def handle(repo, issue):
            triage_issue(issue, Context(**{**base.__dict__, "repo": repo}))
            handled.append(issue["number"])

        server = WebhookServer(("127.0.0.1", 0), SECRET, handle)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}/", fake, server, handled
        server.shutdown()
        server.server_close()


def payload(action="opened"):
    return {"action": action, "issue": ISSUE, "repository": {"full_name": "acme/engine"}}


def test_signed_event_is_accepted_and_processed(setup):
    url, fake, server, handled = setup
    assert deliver(url, payload()) == 202
    server.jobs.join()
    assert handled == [21] and fake.labels == {21: ["crash"]}


def test_forged_or_missing_signature_is_refused(setup):
    url, fake, server, handled = setup
    assert deliver(url, payload(), signature="sha256=" + "0" * 64) == 401
    assert deliver(url, payload(), signature=None) == 401
    server.jobs.join()
    assert handled == [] and fake.requests == []


def test_other_events_and_actions_are_ignored(setup):
    url, fake, server, handled = setup
    assert deliver(url, payload(), event="push") == 200
    assert deliver(url, payload(action="closed")) == 200
    server.jobs.join()
    assert handled == []
