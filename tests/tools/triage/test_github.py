"""tools/triage/github.py against a real local HTTP server shaped like the GitHub API."""

import pytest

from tests.tools.fake_github import FakeGitHub
from tools.triage.github import GitHub, GitHubError, RateLimited, next_link, retry_delay

ISSUES = [
    {"number": 1, "title": "a", "body": "x", "updated_at": "2024-01-01T00:00:00Z"},
    {"number": 2, "title": "b", "body": "y", "updated_at": "2024-01-01T00:00:00Z"},
    {"number": 3, "title": "a PR", "body": "", "updated_at": "2024-01-01T00:00:00Z", "pull_request": {}},
]


def client(fake, **kw):
    sleeps = []
    return GitHub(base_url=fake.url, token="ghp_SECRET123", sleep=sleeps.append, **kw), sleeps


def test_list_issues_follows_pages_and_drops_pull_requests():
    with FakeGitHub(ISSUES, page_size=1) as fake:
        gh, _ = client(fake)
        assert [i["number"] for i in gh.list_issues("acme/engine")] == [1, 2]
        assert len(fake.posted("GET")) == 3


def test_comment_and_labels_are_posted_with_the_token_header():
    with FakeGitHub(ISSUES) as fake:
        gh, _ = client(fake)
        gh.create_comment("acme/engine", 1, "hello")
        gh.add_labels("acme/engine", 1, ["crash"])
        assert fake.comments[1][0]["body"] == "hello" and fake.labels[1] == ["crash"]
        assert all(h.get("Authorization") == "Bearer ghp_SECRET123" for _, _, h in fake.requests)


def test_429_with_retry_after_zero_is_retried():
    with FakeGitHub(ISSUES) as fake:
        gh, sleeps = client(fake)
        fake.rate_limit_next = 2
        assert gh.get_issue("acme/engine", 1)["title"] == "a"
        assert sleeps == [0.0, 0.0] and len(fake.requests) == 3


def test_retries_are_bounded():
    with FakeGitHub(ISSUES) as fake:
        gh, sleeps = client(fake, max_retries=2)
        fake.rate_limit_next = 10
        with pytest.raises(GitHubError) as e:
            gh.get_issue("acme/engine", 1)
        assert e.value.status == 429 and len(fake.requests) == 3 and len(sleeps) == 2


def test_long_rate_limit_wait_is_raised_not_slept():
    with FakeGitHub(ISSUES) as fake:
        gh, sleeps = client(fake, max_wait_s=10)
        fake.rate_limit_next = 1
        fake.rate_limit_headers = {"Retry-After": "3600"}
        with pytest.raises(RateLimited):
            gh.get_issue("acme/engine", 1)
        assert sleeps == []


def test_token_never_appears_in_errors_or_repr():
    with FakeGitHub(ISSUES) as fake:
        gh, _ = client(fake)
        with pytest.raises(GitHubError) as e:
            gh.get_issue("acme/engine", 99)
        assert e.value.status == 404
        assert "ghp_SECRET123" not in str(e.value) and "ghp_SECRET123" not in repr(gh)


def test_retry_delay_reads_github_headers():
    assert retry_delay(429, {"Retry-After": "5"}, 0, now=0) == 5.0
    assert retry_delay(403, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "130"}, 0, now=100) == 30.0
    assert retry_delay(403, {}, 0, now=0) is None  # a plain permission error is final
    assert retry_delay(502, {}, 2, now=0) == 4.0
    assert retry_delay(404, {}, 0, now=0) is None


def test_next_link():
    assert (
        next_link({"Link": '<https://x/issues?page=2>; rel="next", <https://x/issues?page=5>; rel="last"'})
        == "https://x/issues?page=2"
    )
    assert next_link({}) is None
