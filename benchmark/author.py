"""Write the benchmark cases from their authoring modules, or check the committed ones against them.

    python -m benchmark.author                 # (re)write every case under benchmark/cases/
    python -m benchmark.author ID [ID ...]     # just these
    python -m benchmark.author --check [ID]    # regenerate into a temp dir; fail on any byte difference
    python -m benchmark.author --list          # case ids and the module that writes each

A case module is any module in `benchmark/authoring/` exposing `CASES`: a list of
`benchmark.authoring.common.CaseSpec` (or of objects with the same `.id` and
`.write(cases_dir) -> Path`). The library that turns steps into patches is
`benchmark.authoring.patches`; `Step`, `Replacement` and `write_patches` are re-exported here for older imports.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib
import pkgutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Protocol

import benchmark.authoring
from benchmark.authoring.patches import AuthoringError, Replacement, Step, author_history, shared_clones, write_patches
from benchmark.cases import BUNDLED_CASES_DIR

__all__ = ["AuthoringError", "Replacement", "Step", "author_history", "write_patches", "discover", "check_cases"]


class WritesCase(Protocol):
    id: str

    def write(self, cases_dir: Path) -> Path: ...


def discover(package: Any = benchmark.authoring) -> dict[str, tuple[str, WritesCase]]:
    """Every `CASES` entry of every module in the authoring package -> {case id: (module name, spec)}."""
    found: dict[str, tuple[str, WritesCase]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for spec in getattr(module, "CASES", ()):
            if spec.id in found:
                raise AuthoringError(f"case {spec.id} is written by both {found[spec.id][0]} and {module.__name__}")
            found[spec.id] = (module.__name__, spec)
    return found


def select(specs: dict[str, tuple[str, WritesCase]], ids: list[str]) -> list[WritesCase]:
    unknown = [i for i in ids if i not in specs]
    if unknown:
        raise AuthoringError(f"unknown case ids: {', '.join(unknown)}; known: {', '.join(sorted(specs))}")
    return [specs[i][1] for i in (ids or sorted(specs))]


def check_cases(specs: list[WritesCase], cases_dir: Path) -> list[str]:
    """Regenerate `specs` into a temp dir; -> 'case/file: why' for every file that differs from `cases_dir`."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="diffdx-author-check-") as tmp, shared_clones():
        for spec in specs:
            fresh = spec.write(Path(tmp))
            problems += folder_differences(fresh, Path(cases_dir) / spec.id, spec.id)
    return problems


def folder_differences(fresh: Path, committed: Path, case_id: str) -> list[str]:
    """Byte comparison of two case folders -> 'case/relative-path: why' lines (empty when identical)."""
    if not committed.is_dir():
        return [f"{case_id}: not committed (no folder {committed})"]
    ours = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    theirs = {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()}
    out = [f"{case_id}/{p}: only in the regenerated case" for p in sorted(ours - theirs)]
    out += [f"{case_id}/{p}: committed but not written by the authoring" for p in sorted(theirs - ours)]
    changed = [p for p in sorted(ours & theirs) if not filecmp.cmp(fresh / p, committed / p, shallow=False)]
    return out + [f"{case_id}/{p}: differs from what the authoring writes" for p in changed]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmark.author", description=__doc__.split("\n")[0])
    ap.add_argument("ids", nargs="*", help="case ids (default: every case the authoring modules define)")
    ap.add_argument("--check", action="store_true", help="fail if a committed case differs from its regeneration")
    ap.add_argument("--list", action="store_true", help="list case ids and their modules, write nothing")
    ap.add_argument("--cases-dir", type=Path, default=BUNDLED_CASES_DIR)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        found = discover()
        specs = select(found, args.ids)
        if args.list:
            print("\n".join(f"{s.id}  {found[s.id][0]}" for s in specs))
            return 0
        if args.check:
            problems = check_cases(specs, args.cases_dir)
            if problems:
                stale = sorted({p.split("/", 1)[0].split(":", 1)[0] for p in problems})
                print("\n".join(problems) + f"\nrewrite with: python -m benchmark.author {' '.join(stale)}")
                return 1
            print(f"ok: {len(specs)} cases match their authoring")
            return 0
        for spec in specs:
            print(f"wrote {spec.write(args.cases_dir)}")
    except AuthoringError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
