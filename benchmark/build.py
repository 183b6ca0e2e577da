"""Build a case's git repo: pristine subject snapshot (tag `base`) + the case's patches.

Histories are deterministic: the snapshot has a fixed author/date, every patch keeps
its author and date, the committer is the subject's maintainer and the committer date
equals the author date. Same case, same commit ids, on any machine.

The map patch-stem -> built commit is written OUTSIDE the repo, next to it
(`<repo>.benchmark-commits.json`), so that the diagnosing side cannot read it from the tree
or the history; only the scorer reads it.

    python -m benchmark.build CASE --out DIR [--cases-dir CASES]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmark.cases import Case, CaseError, load_case, load_cases
from benchmark.releases import ReleaseError, Releases, write_history
from benchmark.subjects import Subject, get_subject
from tools.history.gitrepo import GitError, run_git
from tools.probe.checkpoints import cache_root

BRANCH = "main"
MAIL_START = re.compile(rb"^From [0-9a-f]{40} ", re.M)
BASE_PATCH_PREFIX = "00-base"  # such patches are folded into the `base` commit (docs/design.md §6b)


class BuildError(RuntimeError):
    """A case repo that cannot be built; the message names the case and the patch."""


def git(
    repo: Path, *args: str, identity: str | None = None, date: str | None = None, input: bytes | None = None
) -> str:
    """Run git in `repo`, isolated from user/system config; identity 'Name <email>' sets author+committer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0", LC_ALL="C", TZ="UTC")
    if identity:
        name, email = split_identity(identity)
        env.update(GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email, GIT_COMMITTER_NAME=name, GIT_COMMITTER_EMAIL=email)
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return run_git(repo, *args, stdin=input, env=env).strip()


def split_identity(identity: str) -> tuple[str, str]:
    m = re.fullmatch(r"\s*(.+?)\s*<([^<>\s]+)>\s*", identity)
    if not m:
        raise ValueError(f"identity {identity!r} is not 'Name <email>'")
    return m.group(1), m.group(2)


def pristine_repo(subject: Subject) -> Path:
    """Subject -> a cached bare repo holding its snapshot, tagged `base` (and v<version>). Built once."""
    out = cache_root() / "subjects" / f"{subject.name}-{subject.fingerprint()}.git"
    return cached_bare_repo(out, lambda work: _write_pristine(subject, work))


def cached_bare_repo(out: Path, write: Callable[[Path], None]) -> Path:
    """A bare repo at `out`, built once: `write(work)` fills a fresh `git init`ed work tree in a
    temp folder, which is cloned bare and renamed into place (a failed build leaves nothing)."""
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent workers wait for one build instead of doing two
        if not out.is_dir():
            with tempfile.TemporaryDirectory(prefix=f".build-{out.stem}-", dir=out.parent) as tmp:
                work = Path(tmp) / "work"
                work.mkdir()
                git(work, "init", "-q", "-b", BRANCH)
                write(work)
                git(Path(tmp), "clone", "-q", "--bare", str(work), "bare.git")
                os.rename(Path(tmp) / "bare.git", out)
    return out


def _write_pristine(subject: Subject, work: Path) -> None:
    subject.copy_to(work)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", subject.message, identity=subject.maintainer, date=subject.date)
    for tag in base_tags(subject):
        git(work, "tag", tag)


def base_tags(subject: Subject) -> list[str]:
    return ["base"] + ([f"v{subject.version}"] if subject.version else [])


def clone_pristine(subject: Subject, dest: Path) -> Path:
    """A fresh working repo at `dest` on branch main at the snapshot (objects hard-linked, no remote)."""
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise BuildError(f"{dest} exists and is not empty")
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(dest.parent, "clone", "-q", "--local", "-b", BRANCH, str(pristine_repo(subject)), str(dest))
    git(dest, "remote", "remove", "origin")
    return dest


def build_case_repo(case: Case | str | Path, dest: str | Path) -> Path:
    """Case -> a new git repo at `dest`: snapshot or release history (tag `base`), then commits/*.patch,
    then the case's [tags] on the commits of the patches they name.

    The commit map lists each patch stem and, for a release history, each release tag (`v4.49.0`),
    under "patches", so a truth `commit` of either kind resolves to a sha the same way.
    """
    case = case if isinstance(case, Case) else load_case(case)
    if case.releases:
        repo, subject, commits = _clone_releases(case, Path(dest))
    else:
        subject = get_subject(case.subject)
        repo = clone_pristine(subject, Path(dest))
        fold_base_patches(repo, case, subject)
        commits = {"base": git(repo, "rev-parse", "HEAD"), "patches": {}}
    for patch in case.patches:
        if patch.stem.startswith(BASE_PATCH_PREFIX):
            continue
        sha = apply_patch(repo, patch, subject, case.id)
        commits["patches"][patch.stem] = {"sha": sha, "subject": git(repo, "log", "-1", "--format=%s")}
    for tag, stem in case.tags:  # release points inside the history ([tags] in case.toml)
        git(repo, "tag", tag, commits["patches"][stem]["sha"])
    commit_map_path(repo).write_text(json.dumps(commits, indent=2) + "\n")
    return repo


def fold_base_patches(repo: Path, case: Case, subject: Subject) -> None:
    """Apply `00-base-*` patches into the snapshot commit itself: the bug has no introducing commit."""
    folded = [p for p in case.patches if p.stem.startswith(BASE_PATCH_PREFIX)]
    for patch in folded:
        try:
            git(repo, "apply", "--index", "--whitespace=nowarn", str(patch))
        except GitError as e:
            raise BuildError(
                f"case {case.id}: commits/{patch.name} does not apply to base: {_tail(e.stderr)}"
            ) from None
    if not folded:
        return
    git(repo, "commit", "-q", "--amend", "--no-edit", identity=subject.maintainer, date=subject.date)
    for tag in base_tags(subject):
        git(repo, "tag", "-f", tag)


def _clone_releases(case: Case, dest: Path) -> tuple[Path, Subject, dict]:
    """A release-history case: clone its cached release repo; the commit map names every release."""
    if any(p.stem.startswith(BASE_PATCH_PREFIX) for p in case.patches):
        raise BuildError(
            f"case {case.id}: a release history cannot fold {BASE_PATCH_PREFIX}-* patches "
            "into base (the next release would replace them); a bug at base is the oldest release"
        )
    dest = dest.resolve()
    if dest.exists() and any(dest.iterdir()):
        raise BuildError(f"{dest} exists and is not empty")
    try:
        bare = release_repo(case.releases)
    except ReleaseError as e:
        raise BuildError(f"case {case.id}: {e}") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(dest.parent, "clone", "-q", "--local", "-b", BRANCH, str(bare), str(dest))
    git(dest, "remote", "remove", "origin")
    commits = {"base": git(dest, "rev-parse", "base"), "patches": {}}
    for tag in case.releases.tags():
        commits["patches"][tag] = {"sha": git(dest, "rev-parse", f"{tag}^{{commit}}"), "subject": f"Release: {tag}"}
    # patches on top are committed by whoever maintains the package; the subject gives only that identity
    subject = Subject(name=case.releases.package, source=dest, maintainer="Release <release@pypi.invalid>")
    return dest, subject, commits


def release_repo(releases: Releases) -> Path:
    """[releases] -> a cached bare repo of those releases (built once; wheels cached separately)."""
    out = cache_root() / "subjects" / f"releases-{releases.package}-{releases.fingerprint()}.git"
    return cached_bare_repo(out, lambda work: write_history(releases, work, git))


def apply_patch(repo: Path, patch: Path, subject: Subject, case_id: str) -> str:
    """`git am` one single-commit patch, keeping its author and date; returns the new sha."""
    mails = len(MAIL_START.findall(patch.read_bytes()))
    if mails != 1:
        raise BuildError(
            f"case {case_id}: commits/{patch.name} holds {mails} commits; write one commit per patch "
            "(git format-patch output)"
        )
    try:
        git(
            repo,
            "am",
            "-q",
            "--committer-date-is-author-date",
            "--whitespace=nowarn",
            str(patch),
            identity=subject.maintainer,
        )
    except GitError as e:
        _abort_am(repo)
        raise BuildError(f"case {case_id}: commits/{patch.name} does not apply: {_tail(e.stderr)}") from None
    return git(repo, "rev-parse", "HEAD")


def _abort_am(repo: Path) -> None:
    try:
        git(repo, "am", "--abort")
    except GitError:
        pass


def _tail(text: str, lines: int = 4) -> str:
    return " | ".join(line for line in str(text).strip().splitlines()[-lines:])


def commit_map_path(repo: str | Path) -> Path:
    repo = Path(repo).resolve()
    return repo.parent / f"{repo.name}.benchmark-commits.json"


def read_commit_map(repo: str | Path) -> dict:
    """{"base": sha, "patches": {stem: {"sha", "subject"}}} as written by build_case_repo."""
    return json.loads(commit_map_path(repo).read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.build", description="Build one case's git repo.")
    ap.add_argument("case", help="case id (or a case folder)")
    ap.add_argument("--out", required=True, type=Path, help="where the repo goes (must not exist or be empty)")
    ap.add_argument("--cases-dir", type=Path, help="folder of cases (default: the bundled ones)")
    args = ap.parse_args(argv)
    try:
        (case,) = load_cases(args.cases_dir, [args.case])
        repo = build_case_repo(case, args.out)
    except (CaseError, BuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    history = f"releases {', '.join(case.releases.versions)}" if case.releases else "base"
    print(f"built {case.id} at {repo} ({len(case.patches)} commits on {history}); commit map: {commit_map_path(repo)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
