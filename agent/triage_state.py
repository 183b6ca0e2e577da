"""Triage state in SQLite: what was commented and labelled, per issue revision.

A revision is a hash of title, body and updated_at, so an edited issue is a new revision
and gets a new comment; re-running on an unchanged issue does nothing.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from pathlib import Path

DEFAULT_DB = Path("~/.cache/diffdx/triage.sqlite")

SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    repo TEXT NOT NULL, number INTEGER NOT NULL, revision TEXT NOT NULL,
    kind TEXT NOT NULL,            -- 'comment' | 'labels'
    detail TEXT, at REAL NOT NULL,
    PRIMARY KEY (repo, number, revision, kind)
)"""


def issue_revision(issue: dict) -> str:
    h = hashlib.sha256()
    for part in (issue.get("title") or "", issue.get("body") or "", issue.get("updated_at") or ""):
        h.update(part.encode("utf-8", "replace") + b"\0")
    return h.hexdigest()[:16]


class TriageState:
    def __init__(self, path: str | Path = DEFAULT_DB):
        path = Path(path).expanduser()
        if str(path) != ":memory:":
            path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # the webhook worker and the CLI may share one store
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        with self._lock, self._db:
            self._db.execute(SCHEMA)

    def done(self, repo: str, number: int, revision: str, kind: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM actions WHERE repo=? AND number=? AND revision=? AND kind=?",
                (repo, number, revision, kind),
            ).fetchone()
        return row is not None

    def record(self, repo: str, number: int, revision: str, kind: str, detail: str = "") -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO actions VALUES (?, ?, ?, ?, ?, ?)",
                (repo, number, revision, kind, detail, time.time()),
            )

    def close(self) -> None:
        self._db.close()
