"""Two benchmark runs side by side: did a change move any diagnosis?

    python -m benchmark.compare OLD_DIR NEW_DIR [--md FILE]

Each DIR is a `benchmark.run --out` folder (results.json plus one report.json per case). For every
case in both runs it compares the truth's rank, the component and commit scores, and the top-5
hypotheses as (file, function) pairs in order. Exit status: 0 when every shared case has the same
rank and the same top 5, 1 when any differs (each difference is listed), 2 on bad input.
Refactors are judged with it ("same ranks on every case"); so is any change meant to be neutral.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

TOP = 5


@dataclass(frozen=True)
class CaseResult:
    """One case of one run: the truth's rank (None = not in the top 5) and the ranked suspects."""

    rank: int | None
    component: float | None
    commit: float | None
    top: tuple[tuple[str, str], ...]
    errored: bool


def load_run(out_dir: Path) -> dict[str, CaseResult]:
    """A benchmark.run output folder -> {case id: CaseResult}. Raises ValueError when it is not one."""
    results = out_dir / "results.json"
    if not results.is_file():
        raise ValueError(f"{out_dir}: no results.json (is it a `benchmark.run --out` folder of a finished run?)")
    try:
        rows = json.loads(results.read_text())["cases"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{results}: not a benchmark.run results file ({err})") from err
    return {row["case"]: _case_result(row, out_dir / row["case"] / "report.json") for row in rows}


def _case_result(row: dict, report_path: Path) -> CaseResult:
    top: tuple[tuple[str, str], ...] = ()
    if report_path.is_file():
        hypotheses = json.loads(report_path.read_text()).get("hypotheses") or []
        top = tuple((h.get("file") or "", h.get("function") or "") for h in hypotheses[:TOP])
    return CaseResult(
        rank=row.get("rank"),
        component=row.get("component"),
        commit=row.get("commit"),
        top=top,
        errored=bool(row.get("errors")),
    )


def differences(old: CaseResult, new: CaseResult) -> list[str]:
    """What moved between two results of one case, in words (empty = the same diagnosis)."""
    moved = []
    if old.errored != new.errored:
        moved.append(f"errored {old.errored} -> {new.errored}")
    if old.rank != new.rank:
        moved.append(f"truth rank {_rank(old.rank)} -> {_rank(new.rank)}")
    if old.component != new.component:
        moved.append(f"component {old.component} -> {new.component}")
    if old.commit != new.commit:
        moved.append(f"commit {old.commit} -> {new.commit}")
    if old.top != new.top:
        moved.append(f"top {TOP} {_names(old.top)} -> {_names(new.top)}")
    return moved


def compare(old: dict[str, CaseResult], new: dict[str, CaseResult]) -> tuple[list[str], dict[str, list[str]]]:
    """-> (shared case ids in order, {case id: differences} for the cases that moved)."""
    shared = [case for case in old if case in new]
    moved = {case: d for case in shared if (d := differences(old[case], new[case]))}
    return shared, moved


def markdown(old_dir: Path, new_dir: Path, old: dict, new: dict) -> str:
    shared, moved = compare(old, new)
    lines = [
        f"# {old_dir} -> {new_dir}",
        "",
        f"{len(shared)} cases in both runs; {len(shared) - len(moved)} with the same rank and top {TOP}, "
        f"{len(moved)} moved.",
        "",
        "| case | rank old | rank new | same top 5 | what moved |",
        "|---|---|---|---|---|",
    ]
    for case in shared:
        o, n = old[case], new[case]
        what = "; ".join(moved.get(case, [])) or "–"
        lines.append(f"| {case} | {_rank(o.rank)} | {_rank(n.rank)} | {'yes' if o.top == n.top else 'no'} | {what} |")
    for label, only in (
        ("only in old", [c for c in old if c not in new]),
        ("only in new", [c for c in new if c not in old]),
    ):
        if only:
            lines += ["", f"{label}: {', '.join(only)}"]
    return "\n".join(lines) + "\n"


def _rank(rank: int | None) -> str:
    return "–" if rank is None else str(rank)


def _names(top: tuple[tuple[str, str], ...]) -> str:
    return "[" + ", ".join(function or file for file, function in top) + "]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmark.compare", description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path, help="benchmark.run --out folder of the run before the change")
    parser.add_argument("new", type=Path, help="benchmark.run --out folder of the run after it")
    parser.add_argument("--md", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    try:
        old, new = load_run(args.old), load_run(args.new)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = markdown(args.old, args.new, old, new)
    print(text, end="")
    if args.md:
        args.md.write_text(text)
    return 1 if compare(old, new)[1] else 0


if __name__ == "__main__":
    sys.exit(main())
