"""Benchmark cases: load and check a case folder (DESIGN.md §6).

Three views of a case, kept apart on purpose:
  Case      - the benchmark side's view (folder, patches, metadata); never handed to an agent.
  CaseInput - what the diagnosing side gets: issue text, scenario, the built repo. No folder path.
  Truth     - truth.toml; only `load_truth` returns it, for the scorer and the validator.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from benchmark.releases import Releases, check_order
from tools import scenario as scenario_io
from tools.hypotheses.categories import CATEGORIES
from tools.scenario import Scenario, ScenarioError

TRACKS = ("easy", "hard", "at-base", "real")  # case shapes scored on their own rows (docs/design.md §6b)
DEFAULT_TRACK = "easy"  # a case.toml without `track`: the plain synthetic shape
BUNDLED_CASES_DIR = Path(__file__).resolve().parent / "cases"
CASE_KEYS = {
    "id": str,
    "issue_number": int,
    "subject": str,
    "category": str,
    "modeled_on": list,
    "title": str,
    "releases": dict,
    "track": str,
    "tags": dict,
}
CASE_OPTIONAL = {"releases", "track", "tags"}
RELEASES_KEYS = {"package": str, "versions": list}
TRUTH_KEYS = {"file": str, "function": str, "commit": str, "component": str, "mechanism": str}
TRUTH_OPTIONAL = {"commit"}
PATCH_NAME = re.compile(r"^(\d{2,4})-([A-Za-z0-9][A-Za-z0-9._-]*)\.patch$")
QUALNAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
TAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RESERVED_TAGS = {"base", "HEAD"}  # the builder's own tag, and git's name for the tip


class CaseError(ValueError):
    """A malformed case; the message names the case and the offending file/key."""


@dataclass(frozen=True)
class Case:
    id: str
    issue_number: int
    subject: str
    category: str
    modeled_on: tuple[str, ...]
    title: str
    issue: str  # issue.md text
    scenario: Scenario  # repro.toml
    patches: tuple[Path, ...]  # commits/NN-slug.patch, in apply order
    dir: Path
    releases: Releases | None = None  # [releases]: the history is these PyPI releases (DESIGN.md §6b)
    track: str = DEFAULT_TRACK  # one of TRACKS: scored on its own row
    tags: tuple[tuple[str, str], ...] = ()  # [tags]: (tag name, patch stem) - release points inside the history

    def patch_stems(self) -> list[str]:
        return [p.stem for p in self.patches]

    def commit_names(self) -> list[str]:
        """What a truth `commit` may name: a release tag after the first (`v4.49.0`) or a patch stem."""
        return (self.releases.tags()[1:] if self.releases else []) + self.patch_stems()


@dataclass(frozen=True)
class CaseInput:
    """Everything the diagnosing agent may see about a case."""

    id: str
    issue_number: int
    subject: str
    title: str
    issue: str
    scenario: Scenario
    repo: Path  # the built git repo (target source root)


@dataclass(frozen=True)
class Truth:
    file: str  # relative to the repo root
    function: str  # qualified name: Class.method, function, outer.inner
    commit: str | None  # patch stem that introduced the bug; None = present since base
    component: str
    mechanism: str


def case_input(case: Case, repo: Path) -> CaseInput:
    return CaseInput(
        id=case.id,
        issue_number=case.issue_number,
        subject=case.subject,
        title=case.title,
        issue=case.issue,
        scenario=case.scenario,
        repo=Path(repo),
    )


def load_case(case_dir: str | Path) -> Case:
    """Case folder -> Case, checked; CaseError names the case and the key for anything malformed."""
    case_dir = Path(case_dir).resolve()
    name = case_dir.name
    meta = _read_toml(case_dir / "case.toml", name)
    _check_keys(meta, CASE_KEYS, CASE_OPTIONAL, f"case {name}: case.toml")
    _check_case_meta(meta, name)
    releases = _releases(meta["releases"], name) if "releases" in meta else None
    issue, scenario = _read_issue(case_dir, name), _read_scenario(case_dir, name)
    patches = _patches(case_dir, name, required=releases is None)
    return Case(
        id=meta["id"],
        issue_number=meta["issue_number"],
        subject=meta["subject"],
        category=meta["category"],
        modeled_on=tuple(meta["modeled_on"]),
        title=meta["title"],
        issue=issue,
        scenario=scenario,
        patches=patches,
        dir=case_dir,
        releases=releases,
        track=meta.get("track", DEFAULT_TRACK),
        tags=_tags(meta.get("tags", {}), patches, releases, name),
    )


def _releases(table: dict, name: str) -> Releases:
    """[releases] -> Releases; the versions must be valid and oldest first."""
    where = f"case {name}: case.toml [releases]"
    _check_keys(table, RELEASES_KEYS, set(), where)
    package, versions = table["package"].strip(), table["versions"]
    if not package:
        raise CaseError(f"{where}: package is empty")
    if not versions or not all(isinstance(v, str) and v.strip() for v in versions):
        raise CaseError(f"{where}: versions must be a non-empty list of version strings, oldest first")
    wrong = check_order(package, versions)
    if wrong:
        raise CaseError(f"{where}: {wrong}")
    return Releases(package=package, versions=tuple(v.strip() for v in versions))


def _tags(table: dict, patches: tuple[Path, ...], releases: Releases | None, name: str) -> tuple[tuple[str, str], ...]:
    """[tags] (tag name -> patch stem) -> pairs in history order; every stem must be one of the case's patches."""
    where = f"case {name}: case.toml [tags]"
    stems = [p.stem for p in patches]
    taken = set(RESERVED_TAGS) | set(releases.tags() if releases else [])
    for tag, stem in table.items():
        if not TAG_NAME.match(tag) or tag in taken or tag.endswith((".lock", ".")) or ".." in tag:
            raise CaseError(f"{where}: {tag!r} cannot be a tag name here (reserved, taken or not a valid git tag)")
        if not isinstance(stem, str) or stem not in stems:
            raise CaseError(f"{where}: {tag} = {stem!r} names no patch; known stems: {', '.join(stems) or 'none'}")
        if stem.startswith("00-base"):
            raise CaseError(
                f"{where}: {tag} = {stem!r}: a 00-base patch is folded into base and has no commit of its own"
            )
    return tuple(sorted(table.items(), key=lambda kv: stems.index(kv[1])))


def _check_case_meta(meta: dict, name: str) -> None:
    where = f"case {name}: case.toml"
    if meta["id"] != name:
        raise CaseError(f"{where}: id {meta['id']!r} differs from the folder name {name!r}")
    if meta["issue_number"] <= 0:
        raise CaseError(f"{where}: issue_number must be a positive int, got {meta['issue_number']}")
    if meta["category"] not in CATEGORIES:
        raise CaseError(f"{where}: category {meta['category']!r} is not one of {', '.join(CATEGORIES)}")
    if not all(isinstance(m, str) and m for m in meta["modeled_on"]):
        raise CaseError(f'{where}: modeled_on must be a list of strings such as "vllm-project/vllm#5639"')
    if not meta["title"].strip():
        raise CaseError(f"{where}: title is empty")
    if meta.get("track", DEFAULT_TRACK) not in TRACKS:
        raise CaseError(f"{where}: track {meta['track']!r} is not one of {', '.join(TRACKS)}")
    from benchmark.subjects import known_subjects

    if meta["subject"] not in known_subjects():
        raise CaseError(f"{where}: subject {meta['subject']!r} is unknown; known: {', '.join(known_subjects())}")


def load_truth(case: Case | str | Path) -> Truth:
    """truth.toml -> Truth. For the scorer and the validator only."""
    case = case if isinstance(case, Case) else load_case(case)
    where = f"case {case.id}: truth.toml"
    data = _read_toml(case.dir / "truth.toml", case.id)
    _check_keys(data, TRUTH_KEYS, TRUTH_OPTIONAL, where)
    file = normalize_repo_path(data["file"])
    if not file or ".." in PurePosixPath(file).parts:
        raise CaseError(f"{where}: file {data['file']!r} must be a path inside the repo")
    if not QUALNAME.match(data["function"]):
        raise CaseError(f"{where}: function {data['function']!r} is not a qualified name (Class.method, outer.inner)")
    commit = data.get("commit")
    if commit is not None and commit not in case.commit_names():
        raise CaseError(
            f"{where}: commit {commit!r} is not a patch stem or a later release tag; "
            f"known: {', '.join(case.commit_names()) or 'none'}"
        )
    return Truth(
        file=file, function=data["function"], commit=commit, component=data["component"], mechanism=data["mechanism"]
    )


def normalize_repo_path(path: str) -> str:
    """'./a/b.py', '/a/b.py' -> 'a/b.py' (only these two forms are forgiven)."""
    path = path.strip().replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path.lstrip("/")


def load_cases(cases_dir: str | Path | None = None, ids: list[str] | None = None) -> list[Case]:
    """Cases under `cases_dir` (default: the bundled ones), or just `ids`; issue numbers unique.

    An id may also be the path of a case folder anywhere on disk.
    """
    cases_dir = Path(cases_dir).resolve() if cases_dir else BUNDLED_CASES_DIR
    if not cases_dir.is_dir():
        raise CaseError(f"cases dir {cases_dir} does not exist")
    folders = case_folders(cases_dir) if not ids else [_resolve_id(cases_dir, i) for i in ids]
    twice = sorted({str(f) for f in folders if folders.count(f) > 1})
    if twice:  # each would be run and scored twice, weighing the scores
        raise CaseError(f"case(s) given more than once: {', '.join(Path(t).name for t in twice)}")
    cases = [load_case(f) for f in folders]
    check_issue_numbers(cases, cases_dir)
    return cases


def case_folders(cases_dir: Path) -> list[Path]:
    """Every sub-folder of `cases_dir` except hidden/underscore ones; each must be a case."""
    out = sorted(p for p in cases_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    for p in out:
        if not (p / "case.toml").is_file():
            raise CaseError(f"case {p.name}: case.toml is missing ({p})")
    return out


def _resolve_id(cases_dir: Path, case_id: str) -> Path:
    for candidate in (cases_dir / case_id, Path(case_id)):
        if (candidate / "case.toml").is_file():
            return candidate.resolve()
    known = [p.name for p in cases_dir.iterdir() if (p / "case.toml").is_file()]
    raise CaseError(f"unknown case {case_id!r} in {cases_dir}; known: {', '.join(sorted(known)) or 'none'}")


def check_issue_numbers(cases: list[Case], cases_dir: Path) -> None:
    """Issue numbers are unique within the loaded set and against every case.toml in the folder."""
    seen: dict[int, str] = {}
    for case in cases:
        seen.setdefault(case.issue_number, case.id)
        if seen[case.issue_number] != case.id:
            raise CaseError(
                f"case {case.id}: issue_number {case.issue_number} is also used by case {seen[case.issue_number]}"
            )
    for path in sorted(cases_dir.glob("*/case.toml")):
        try:
            other = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError):
            continue  # that case's own load reports it
        owner = seen.get(other.get("issue_number"))
        if owner and owner != path.parent.name and path.parent.resolve() not in {c.dir for c in cases}:
            raise CaseError(
                f"case {owner}: issue_number {other['issue_number']} is also used by case {path.parent.name}"
            )


def _read_toml(path: Path, name: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CaseError(f"case {name}: {path.name} is missing ({path})") from None
    except tomllib.TOMLDecodeError as e:
        raise CaseError(f"case {name}: {path.name} is not valid TOML: {e}") from None


def _check_keys(data: dict, keys: dict[str, type], optional: set[str], where: str) -> None:
    unknown = set(data) - set(keys)
    if unknown:
        raise CaseError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(keys)}")
    for key, typ in keys.items():
        if key not in data:
            if key in optional:
                continue
            raise CaseError(f"{where}: key {key!r} is missing")
        value = data[key]
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise CaseError(f"{where}: key {key!r} must be {typ.__name__}, got {type(value).__name__} {value!r}")


def _read_issue(case_dir: Path, name: str) -> str:
    path = case_dir / "issue.md"
    if not path.is_file():
        raise CaseError(f"case {name}: issue.md is missing ({path})")
    text = path.read_text()
    if not text.strip():
        raise CaseError(f"case {name}: issue.md is empty")
    return text


def _read_scenario(case_dir: Path, name: str) -> Scenario:
    try:
        return scenario_io.load(case_dir / "repro.toml")
    except ScenarioError as e:
        raise CaseError(f"case {name}: repro.toml: {e}") from None


def _patches(case_dir: Path, name: str, required: bool = True) -> tuple[Path, ...]:
    folder = case_dir / "commits"
    if not folder.is_dir() and not required:
        return ()
    if not folder.is_dir():
        raise CaseError(f"case {name}: commits/ is missing; a case needs at least one NN-slug.patch")
    patches = sorted(folder.glob("*.patch"))
    numbered = {}
    for p in patches:
        m = PATCH_NAME.match(p.name)
        if not m:
            raise CaseError(f"case {name}: commits/{p.name} is not named NN-slug.patch")
        # several 00-base-* patches may share number 0: they fold into base in name order
        n = (int(m.group(1)), p.name if p.stem.startswith("00-base") else "")
        if n in numbered:
            raise CaseError(f"case {name}: commits/{p.name} and commits/{numbered[n].name} share number {n[0]}")
        numbered[n] = p
    if not numbered and required:
        raise CaseError(f"case {name}: commits/ holds no NN-slug.patch file")
    return tuple(numbered[n] for n in sorted(numbered))
