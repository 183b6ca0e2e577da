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
the rest extra `train` (dev and the first test split stay as they were). Files `raw/t*.txt` are a third collection,
labelled and committed before any classifier ran on them; all of it is `test3`. Files `raw/u*.txt` are a fourth
collection, labelled and committed the same way before any classifier ran on them; all of it is `test4`. Files
`raw/v*.txt` are a fifth collection, labelled and committed before any classifier ran on them; all of it is `test5`.
Files `raw/w*.txt` are a sixth collection, labelled and committed the same way; all of it is `test6`. Files
`raw/x*.txt` are a seventh collection, labelled and committed before any classifier ran on them; all of it is `test7`.
Files `raw/y*.txt` are an eighth collection, labelled and committed the same way; all of it is `test8`.
Files `raw/z*.txt` are a ninth collection, labelled and committed before any classifier ran on them; all of it is `test9`.
Files `raw/k*.txt` are a tenth collection, labelled and committed the same way; all of it is `test10`.
Files `raw/m*.txt` are an eleventh collection, labelled and committed before any classifier ran on them; all of it is
`test11`. Files `raw/p*.txt` are a twelfth collection, labelled and committed the same way; all of it is `test12`.
Files `raw/q*.txt` are a thirteenth collection, labelled and committed before any classifier ran on them; all of it is
`test13`. Files `raw/r*.txt` are a fourteenth collection, labelled and committed the same way; all of it is `test14`.
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
THIRD_COLLECTION = "t"  # raw file prefix of the third collection: all of it is test3 (held out, scored once)
FOURTH_COLLECTION = "u"  # raw file prefix of the fourth collection: all of it is test4 (held out, first sight)
FIFTH_COLLECTION = "v"  # raw file prefix of the fifth collection: all of it is test5 (held out, first sight)
SIXTH_COLLECTION = "w"  # raw file prefix of the sixth collection: all of it is test6 (held out, first sight)
SEVENTH_COLLECTION = "x"  # raw file prefix of the seventh collection: all of it is test7 (held out, first sight)
EIGHTH_COLLECTION = "y"  # raw file prefix of the eighth collection: all of it is test8 (held out, first sight)
NINTH_COLLECTION = "z"  # raw file prefix of the ninth collection: all of it is test9 (held out, first sight)
TENTH_COLLECTION = "k"  # raw file prefix of the tenth collection: all of it is test10 (held out, first sight)
ELEVENTH_COLLECTION = "m"  # raw file prefix of the eleventh collection: all of it is test11 (held out, first sight)
TWELFTH_COLLECTION = "p"  # raw file prefix of the twelfth collection: all of it is test12 (held out, first sight)
THIRTEENTH_COLLECTION = "q"  # raw file prefix of the thirteenth collection: all of it is test13 (held out, first sight)
FOURTEENTH_COLLECTION = "r"  # raw file prefix of the fourteenth collection: all of it is test14 (held out, first sight)
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
    if raw_name.startswith(THIRD_COLLECTION):
        return "test3"
    if raw_name.startswith(FOURTH_COLLECTION):
        return "test4"
    if raw_name.startswith(FIFTH_COLLECTION):
        return "test5"
    if raw_name.startswith(SIXTH_COLLECTION):
        return "test6"
    if raw_name.startswith(SEVENTH_COLLECTION):
        return "test7"
    if raw_name.startswith(EIGHTH_COLLECTION):
        return "test8"
    if raw_name.startswith(NINTH_COLLECTION):
        return "test9"
    if raw_name.startswith(TENTH_COLLECTION):
        return "test10"
    if raw_name.startswith(ELEVENTH_COLLECTION):
        return "test11"
    if raw_name.startswith(TWELFTH_COLLECTION):
        return "test12"
    if raw_name.startswith(THIRTEENTH_COLLECTION):
        return "test13"
    if raw_name.startswith(FOURTEENTH_COLLECTION):
        return "test14"
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


# The real set's splits in order: the first collection's three by url, then one held-out split a collection.
SPLITS = (
    "train",
    "dev",
    "test",
    "test2",
    "test3",
    "test4",
    "test5",
    "test6",
    "test7",
    "test8",
    "test9",
    "test10",
    "test11",
    "test12",
    "test13",
    "test14",
)


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
