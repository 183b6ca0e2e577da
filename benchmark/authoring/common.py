"""What the case-authoring scripts share: TOML rendering of plain data, and a case written to disk."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from benchmark.author import Step, write_patches


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"no TOML for {type(v).__name__}")


def toml_table(d: dict) -> str:
    return "".join(f"{k} = {toml_value(v)}\n" for k, v in d.items())


def repro_toml(
    model: dict,
    target: dict,
    requests: list[dict],
    good_ref: str | None = None,
    comment: str | None = None,
    reference: dict | None = None,
) -> str:
    out = [f"# {line}\n" for line in (comment or "").splitlines()]
    if good_ref:
        out.append(f"good_ref = {toml_value(good_ref)}\n\n")
    out.append("[model]\n" + toml_table(model) + "\n[target]\n" + toml_table(target))
    if reference:
        out.append("\n[reference]\n" + toml_table(reference))
    for r in requests:
        out.append("\n[[workload.requests]]\n" + toml_table(r))
    return "".join(out)


@dataclass
class CaseSpec:
    subject: str
    id: str
    issue_number: int
    category: str
    modeled_on: list[str]
    title: str
    issue: str
    repro: str
    truth_file: str
    truth_function: str
    component: str
    mechanism: str
    steps: list[Step]
    bug_index: int  # 1-based position of the bug step in `steps`

    def write(self, cases_dir: Path) -> Path:
        folder = cases_dir / self.id
        folder.mkdir(parents=True, exist_ok=True)
        patches = write_patches(self.subject, self.steps, folder)
        (folder / "case.toml").write_text(
            toml_table(
                {
                    "id": self.id,
                    "issue_number": self.issue_number,
                    "subject": self.subject,
                    "category": self.category,
                    "modeled_on": self.modeled_on,
                    "title": self.title,
                }
            )
        )
        (folder / "issue.md").write_text(self.issue.strip() + "\n")
        (folder / "repro.toml").write_text(self.repro)
        (folder / "truth.toml").write_text(
            toml_table(
                {
                    "file": self.truth_file,
                    "function": self.truth_function,
                    "commit": patches[self.bug_index - 1].stem,
                    "component": self.component,
                    "mechanism": self.mechanism,
                }
            )
        )
        return folder
