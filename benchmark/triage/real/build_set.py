"""Build `issues.jsonl` from the raw transcriptions in `raw/*.txt`: `python -m benchmark.triage.real.build_set`.

Raw format (one record per issue, as copied from the stored issue excerpts):
    @@ <url> <label> <body_part>
    T: <title as filed>
    B: <body text as filed, possibly several lines>
`body_part` says which part of the filed body the stored excerpt gave: `start` (the body from its
beginning, cut), `middle` (a later part of the description), `none` (no description stored; title only).
The split is a pure function of the url (sha256), fixed before any tuning. Files `raw/b*.txt` are the first
collection (train / dev / test). Files `raw/n*.txt` are a second collection, labelled and committed before any
classifier ran on them: two thirds of it is `test2` (a fresh held-out split, scored once with the frozen classifier),
the rest extra `train` (dev and the first test split stay as they were). Every later collection (files
`raw/<prefix>*.txt`, `HELD_OUT_COLLECTIONS`: `t` the third, `u` the fourth, ..., `s` the fifteenth, `j` the
sixteenth) was labelled and committed before any classifier ran on it, and all of it is one held-out split (`test3` ...
`test16`), scored once at first sight and fitted on only in a later round (tools/triage/model.py FIT_SPLITS).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
RAW = HERE / "raw"
OUT = HERE / "issues.jsonl"
LABELS = ("silent", "crash", "install", "performance", "feature", "question", "other")
TEST_BELOW, DEV_BELOW = 38, 58  # hash bucket (0..99): < 38 test, < 58 dev, else train
TEST2_BELOW = 67  # second collection: hash bucket of "fresh:" + url < 67 -> test2, else train
SECOND_COLLECTION = "n"  # raw file prefix of the second collection
# Raw file prefix of each later collection -> its split (all of the collection), in the order they were gathered.
HELD_OUT_COLLECTIONS = {
    "t": "test3",
    "u": "test4",
    "v": "test5",
    "w": "test6",
    "x": "test7",
    "y": "test8",
    "z": "test9",
    "k": "test10",
    "m": "test11",
    "p": "test12",
    "q": "test13",
    "r": "test14",
    "s": "test15",
    "j": "test16",
}
_URL = re.compile(r"^https://github\.com/([^/]+/[^/]+)/(issues|pull)/(\d+)$")


def split_of(url: str) -> str:
    """Deterministic split from the url alone: test ~38 %, dev ~20 %, train ~42 %."""
    bucket = int(hashlib.sha256(url.encode()).hexdigest()[:8], 16) % 100
    return "test" if bucket < TEST_BELOW else "dev" if bucket < DEV_BELOW else "train"


def fresh_split_of(url: str) -> str:
    """Split of an issue from the second collection: test2 ~67 %, train ~33 % (a salted hash of the url alone)."""
    bucket = int(hashlib.sha256(f"fresh:{url}".encode()).hexdigest()[:8], 16) % 100
    return "test2" if bucket < TEST2_BELOW else "train"


def split_for(url: str, raw_name: str) -> str:
    """The split of an issue, from its url and the raw file it was transcribed into."""
    held_out = HELD_OUT_COLLECTIONS.get(raw_name[:1])
    if held_out is not None:
        return held_out
    return fresh_split_of(url) if raw_name.startswith(SECOND_COLLECTION) else split_of(url)


def parse_raw(text: str) -> list[dict]:
    records, cur, field = [], None, None
    for line in text.splitlines():
        if line.startswith("@@ "):
            url, label, part = line[3:].split()
            cur = {"url": url, "label": label, "body_part": part, "title": "", "body": []}
            records.append(cur)
        elif cur is not None and line.startswith("T: ") and field != "B":
            cur["title"], field = line[3:], "T"
        elif cur is not None and (line.startswith("B:") and field == "T"):
            cur["body"].append(line[3:])
            field = "B"
        elif cur is not None and field == "B":
            cur["body"].append(line)
        if line.startswith("@@ "):
            field = None
    return records


def finish(rec: dict, raw_name: str = "b") -> dict:
    m = _URL.match(rec["url"])
    if not m or rec["label"] not in LABELS or rec["body_part"] not in ("start", "middle", "none"):
        raise ValueError(f"bad record header: {rec['url']} {rec['label']} {rec['body_part']}")
    body = "\n".join(rec["body"]).strip()
    return {
        "title": rec["title"],
        "body": body,
        "url": rec["url"],
        "repo": m.group(1),
        "number": int(m.group(3)),
        "label": rec["label"],
        "body_part": rec["body_part"],
        "split": split_for(rec["url"], raw_name),
    }


def build() -> list[dict]:
    seen, out = set(), []
    for path in sorted(RAW.glob("*.txt")):
        for rec in parse_raw(path.read_text()):
            if rec["url"] in seen:
                raise ValueError(f"duplicate url {rec['url']} in {path.name}")
            seen.add(rec["url"])
            out.append(finish(rec, path.name))
    return out


# The real set's splits in order: the first collection's three by url, the second's test2, then one a collection.
SPLITS = ("train", "dev", "test", "test2", *HELD_OUT_COLLECTIONS.values())


def main() -> int:
    issues = build()
    OUT.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in issues))
    counts = {s: {lab: 0 for lab in LABELS} for s in SPLITS}
    for i in issues:
        counts[i["split"]][i["label"]] += 1
    print(f"{len(issues)} issues -> {OUT}")
    for s, c in counts.items():
        print(f"{s:<6}{sum(c.values()):>5}  " + "  ".join(f"{k}={v}" for k, v in c.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
