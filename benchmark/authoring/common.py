"""What every case-authoring module shares: `CaseSpec` (a case as data) and its files on disk.

A case module in this folder exposes `CASES`, a list of `CaseSpec` (or of objects with the same
`.id` and `.write(cases_dir) -> Path`); `python -m benchmark.author` finds it and writes or checks
every case. Issue prose lives in `issues/<case-id>.md` next to the modules (`issue_text`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmark.authoring.patches import Step, write_patches
from benchmark.authoring.toml_writer import toml_document, toml_table, toml_value
from benchmark.cases import TRACKS

__all__ = ["CaseSpec", "Step", "issue_text", "repro_toml", "toml_document", "toml_table", "toml_value"]

ISSUES_DIR = Path(__file__).resolve().parent / "issues"


def issue_text(case_id: str) -> str:
    """The issue prose of a case: `issues/<case-id>.md` next to the authoring modules."""
    path = ISSUES_DIR / f"{case_id}.md"
    if not path.is_file():
        raise FileNotFoundError(f"case {case_id}: no issue prose at {path}")
    return path.read_text()


def repro_data(
    model: dict,
    target: dict,
    requests: list[dict],
    good_ref: str | None = None,
    reference: dict | None = None,
) -> dict:
    """The Scenario of repro.toml as plain data (docs/scenario.md), keys in the order they are written."""
    data: dict[str, Any] = {"good_ref": good_ref} if good_ref else {}
    data |= {"model": model, "target": target}
    if reference:
        data["reference"] = reference
    return data | {"workload": {"requests": requests}}


def repro_toml(
    model: dict,
    target: dict,
    requests: list[dict],
    good_ref: str | None = None,
    comment: str | None = None,
    reference: dict | None = None,
) -> str:
    """repro.toml text; `comment` (one line or several) goes at the top."""
    return toml_document(repro_data(model, target, requests, good_ref, reference), comment)


@dataclass
class CaseSpec:
    """A case as data. `bug_index` is the 1-based step that introduces the bug; None (or 0) when the bug
    is in `base_steps`, so the truth names no commit (a bug at base, docs/design.md §6b)."""

    subject: str
    id: str
    issue_number: int
    category: str
    modeled_on: list[str]
    title: str
    issue: str  # the report's prose (usually `issue_text(id)`)
    repro: str | Mapping[str, Any]  # repro.toml text, or its data (written with the case writer)
    truth_file: str
    truth_function: str
    component: str
    mechanism: str
    steps: list[Step]
    bug_index: int | None  # 1-based position of the bug step in `steps`; None: the bug is at base
    track: str = "easy"  # "easy" | "hard" | "at-base" | "real": scored on its own row
    base_steps: Sequence[Step] = ()  # folded into `base` by the builder: commits/00-base-NN-slug.patch
    good_ref: str | None = None  # overrides (or adds) repro.toml's good_ref, e.g. a release tag in the history
    tags: Mapping[str, int] = field(default_factory=dict)  # tag -> 1-based step it names; case.toml [tags]

    def __post_init__(self):
        where = f"case {self.id}"
        if self.track not in TRACKS:
            raise ValueError(f"{where}: track {self.track!r} is not one of {', '.join(TRACKS)}")
        if self.bug_index and not 1 <= self.bug_index <= len(self.steps):
            raise ValueError(f"{where}: bug_index {self.bug_index} is not a step (1..{len(self.steps)})")
        if not self.bug_index and not self.base_steps:
            raise ValueError(f"{where}: no bug_index and no base_steps: which commit holds the bug?")
        for tag, index in (self.tags or {}).items():  # a subclass may default tags to None
            if not 1 <= index <= len(self.steps):
                raise ValueError(f"{where}: tag {tag!r} names step {index}, not one of 1..{len(self.steps)}")

    def write(self, cases_dir: Path) -> Path:
        """Write `<cases_dir>/<id>/`: case.toml, issue.md, repro.toml, truth.toml and commits/*.patch."""
        folder = Path(cases_dir) / self.id
        folder.mkdir(parents=True, exist_ok=True)
        patches = write_patches(self.subject, self.steps, folder, self.base_steps)
        stems = [p.stem for p in patches[len(self.base_steps) :]]
        (folder / "case.toml").write_text(toml_document(self.case_data(stems)))
        (folder / "issue.md").write_text(self.issue.strip() + "\n")
        (folder / "repro.toml").write_text(self.repro_text())
        (folder / "truth.toml").write_text(toml_document(self.truth_data(stems)))
        return folder

    def case_data(self, stems: list[str]) -> dict[str, Any]:
        data = {
            "id": self.id,
            "issue_number": self.issue_number,
            "subject": self.subject,
            "category": self.category,
            "track": self.track,
            "modeled_on": self.modeled_on,
            "title": self.title,
        }
        return data | ({"tags": {tag: stems[i - 1] for tag, i in self.tags.items()}} if self.tags else {})

    def truth_data(self, stems: list[str]) -> dict[str, Any]:
        commit = {"commit": stems[self.bug_index - 1]} if self.bug_index else {}
        where = {"file": self.truth_file, "function": self.truth_function}
        return where | commit | {"component": self.component, "mechanism": self.mechanism}

    def repro_text(self) -> str:
        if isinstance(self.repro, Mapping):
            data = dict(self.repro)
            if self.good_ref:
                data = {"good_ref": self.good_ref} | {k: v for k, v in data.items() if k != "good_ref"}
            return toml_document(data)
        return with_good_ref(self.repro, self.good_ref) if self.good_ref else self.repro


def with_good_ref(repro: str, good_ref: str) -> str:
    """repro.toml text with its `good_ref` line replaced, or added after the top comment."""
    line = f"good_ref = {toml_value(good_ref)}"
    if "good_ref" in tomllib.loads(repro):
        return re.sub(r"(?m)^good_ref\s*=.*$", line, repro, count=1)
    comment = re.match(r"(?:#.*\n)*", repro).group(0)
    return comment + line + "\n\n" + repro[len(comment) :]
