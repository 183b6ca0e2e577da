"""Case authoring: write a case's history as data, get `commits/NN-slug.patch` files.

Case authors never hand-craft patches. They list steps (message, author, date, edits);
this module replays them on the subject's pristine snapshot in a temp repo, exactly as
the builder will (same committer, committer date = author date), and writes
`git format-patch` files into `<case_dir>/commits/`:

    from benchmark.authoring.patches import Step, write_patches

    write_patches("tinyserve", [
        Step("Refactor block table lookup", "Ana Ruiz <ana@example.com>", "2025-03-01T10:00:00+00:00",
             [("tinyserve/kv_cache.py", "def lookup(self, i):", "def lookup(self, i: int):")]),
        Step("kv_cache: reuse freed blocks first\n\nCuts allocation time.", "Bo Li <bo@example.com>",
             "2025-03-04T16:20:00+00:00", edit_function),      # edit_function(root: Path) -> None
    ], case_dir=Path("benchmark/cases/kv-reuse"))

A replacement (file, old_text, new_text) fails loudly unless `old_text` occurs exactly
once in `file`; `old_text=None` creates a new file, `new_text=None` deletes the file
(then `old_text` must be None too).

`base_steps` are replayed first and written as `00-base-NN-slug.patch`: the builder folds them
into the `base` commit, so a bug among them has no introducing commit (docs/design.md §6b).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmark.build import BASE_PATCH_PREFIX, clone_pristine, git, split_identity
from benchmark.subjects import get_subject

Replacement = tuple[str, str | None, str | None]  # (file, old_text, new_text)
Edit = Callable[[Path], None] | Sequence[Replacement]


class AuthoringError(ValueError):
    """A step that cannot be applied; the message names the step and the file."""


@dataclass(frozen=True)
class Step:
    message: str  # commit message: subject line, optionally a blank line and a body
    author: str  # "Name <email>"
    date: str  # ISO 8601 with offset, e.g. "2025-03-04T16:20:00+00:00"
    edits: Edit  # replacements, or a callable editing the tree in place: fn(root)
    slug: str | None = None  # patch file slug; default: from the subject line

    def __post_init__(self):
        split_identity(self.author)
        if not self.message.strip():
            raise AuthoringError("a step needs a commit message")
        if self.slug is not None and not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", self.slug):
            raise AuthoringError(f"slug {self.slug!r}: use lowercase letters, digits, '.', '_' and '-'")


def write_patches(
    subject: str, steps: Sequence[Step], case_dir: str | Path, base_steps: Sequence[Step] = ()
) -> list[Path]:
    """Replay `base_steps` + `steps` on the subject's snapshot; replace `<case_dir>/commits/*.patch` with the result.

    -> the patch files in apply order: `00-base-NN-slug.patch` for the base steps, then `NN-slug.patch`.
    """
    out = Path(case_dir) / "commits"
    with _work_repo(subject) as repo:
        _replay(repo, subject, steps, base_steps)
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.patch"):
            old.unlink()
        return _format_patches(repo, patch_names(steps, base_steps), out)


_SHARED_CLONES: Path | None = None  # the folder of one clone per subject, inside `shared_clones()` only


@contextmanager
def shared_clones() -> Iterator[None]:
    """Within the block, `write_patches` replays every case of a subject in one clone, reset to
    `base` between cases, instead of cloning the subject per case (a transformers checkout takes
    seconds): the same parent, trees, identities and dates, so the same patches."""
    global _SHARED_CLONES
    with tempfile.TemporaryDirectory(prefix="diffdx-author-clones-") as tmp:
        _SHARED_CLONES = Path(tmp)
        try:
            yield
        finally:
            _SHARED_CLONES = None


@contextmanager
def _work_repo(subject: str) -> Iterator[Path]:
    """A repo on the subject's pristine snapshot: a fresh clone, or the shared one reset to `base`."""
    if _SHARED_CLONES is None:
        with tempfile.TemporaryDirectory(prefix="diffdx-author-") as tmp:
            yield clone_pristine(get_subject(subject), Path(tmp) / "repo")
        return
    repo = _SHARED_CLONES / subject
    if not repo.exists():
        clone_pristine(get_subject(subject), repo)
    git(repo, "reset", "-q", "--hard", "base")
    git(repo, "clean", "-q", "-f", "-d", "-x")
    yield repo


def patch_names(steps: Sequence[Step], base_steps: Sequence[Step] = ()) -> list[str]:
    """The file names the steps' patches get, in apply order."""
    base = [f"{BASE_PATCH_PREFIX}-{i:02d}-{_slug(s)}.patch" for i, s in enumerate(base_steps, 1)]
    return base + [f"{i:02d}-{_slug(s)}.patch" for i, s in enumerate(steps, 1)]


def author_history(subject: str, steps: Sequence[Step], dest: Path, base_steps: Sequence[Step] = ()) -> Path:
    """Replay `base_steps` + `steps` as commits on the pristine snapshot in a new repo at `dest` (kept)."""
    repo = clone_pristine(get_subject(subject), dest)
    _replay(repo, subject, steps, base_steps)
    return repo


def _replay(repo: Path, subject: str, steps: Sequence[Step], base_steps: Sequence[Step] = ()) -> None:
    if not steps and not base_steps:
        raise AuthoringError("no steps: a case needs at least one commit")
    maintainer = get_subject(subject).maintainer
    for i, step in enumerate([*base_steps, *steps], 1):
        where = f"step {i} ({step.message.splitlines()[0]!r})"
        if callable(step.edits):
            step.edits(repo)
        else:
            for file, old, new in step.edits:
                apply_replacement(repo, file, old, new, where)
        git(repo, "add", "-A")
        if not git(repo, "status", "--porcelain"):
            raise AuthoringError(f"{where}: the edits change nothing")
        _commit(repo, step, maintainer)


def _commit(repo: Path, step: Step, maintainer: str) -> None:
    name, email = split_identity(step.author)
    git(
        repo,
        "commit",
        "-q",
        "--cleanup=whitespace",
        "-F",
        "-",
        f"--author={name} <{email}>",
        identity=maintainer,
        date=step.date,
        input=step.message.encode(),
    )


def apply_replacement(root: Path, file: str, old: str | None, new: str | None, where: str = "") -> None:
    """Replace the single occurrence of `old` in `file`; None old = create, None new = delete."""
    path = root / file
    if old is None:
        if new is None:
            if not path.is_file():
                raise AuthoringError(f"{where}: cannot delete {file}: no such file")
            path.unlink()
            return
        if path.exists():
            raise AuthoringError(f"{where}: cannot create {file}: it already exists")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new)
        return
    if new is None:
        raise AuthoringError(f"{where}: {file}: to delete a file give old_text=None and new_text=None")
    if not path.is_file():
        raise AuthoringError(f"{where}: {file} does not exist")
    text = path.read_text()
    count = text.count(old)
    if count != 1:
        raise AuthoringError(f"{where}: {file}: old_text must occur exactly once, found {count} times: {old[:80]!r}")
    path.write_text(text.replace(old, new, 1))


def _format_patches(repo: Path, names: Sequence[str], out: Path) -> list[Path]:
    raw = Path(git(repo, "rev-parse", "--git-dir"))
    tmp = (repo / raw if not raw.is_absolute() else raw) / "patches"
    shutil.rmtree(tmp, ignore_errors=True)  # a shared clone's previous case
    git(repo, "format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered", "-o", str(tmp), "base..HEAD")
    written = []
    for made, name in zip(sorted(tmp.glob("*.patch")), names, strict=True):
        dest = out / name
        dest.write_bytes(made.read_bytes())
        written.append(dest)
    return written


def _slug(step: Step) -> str:
    return step.slug or slugify(step.message.splitlines()[0])


def slugify(subject_line: str, limit: int = 48) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", subject_line.lower()).strip("-")
    return slug[:limit].rstrip("-") or "commit"
