"""Git work that never touches the user's checkout.

Everything here reads objects (rev-list, log, diff between commits, blobs) or works in a
detached `git worktree` under a temp dir. Nothing runs `status`, `checkout`, `stash` or any
command that writes the main worktree, its index, HEAD or refs: after any call the user's
checkout is byte-for-byte what it was (tests/tools/history/test_gitrepo.py hashes it to prove it).
Hooks are disabled for the worktree commands so a user's post-checkout hook never runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # `git hash-object -t tree /dev/null`
_NO_HOOKS = ("-c", "core.hooksPath=/dev/null")
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class GitError(RuntimeError):
    """A git command failed; the message carries git's own stderr (also `stderr`, `returncode`)."""

    def __init__(self, message: str, returncode: int | None = None, stderr: str = ""):
        super().__init__(message)
        self.returncode, self.stderr = returncode, stderr


class PatchConflict(GitError):
    """A reverse patch did not apply in the worktree."""


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    message: str  # full message, subject included
    author: str  # "Name <email>"
    date: str  # author date, ISO 8601


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[str, ...]  # body lines, each starting with ' ', '+', '-' or '\\'

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"

    def added_lines(self) -> list[int]:
        """New-side line numbers of '+' lines."""
        return [new for kind, _old, new, _text in _walk(self) if kind == "+"]

    def removed_lines(self) -> list[int]:
        """Old-side line numbers of '-' lines."""
        return [old for kind, old, _new, _text in _walk(self) if kind == "-"]

    def removals(self) -> list[tuple[int, int, str]]:
        """(old line, new-side line it was removed in front of, text) per '-' line."""
        return [(old, new, text) for kind, old, new, text in _walk(self) if kind == "-"]

    def changed_new_span(self) -> tuple[int, int]:
        """New-side lines touched by this hunk's changes (context excluded)."""
        lines = self.added_lines() + [max(new, 1) for _old, new, _text in self.removals()]
        return (min(lines), max(lines)) if lines else (self.new_start, self.new_start)


@dataclass(frozen=True)
class FileDiff:
    old_path: str | None  # None for an added file
    new_path: str | None  # None for a deleted file
    header: tuple[str, ...]  # the `diff --git` … `+++` lines
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def _walk(hunk: Hunk) -> Iterator[tuple[str, int, int, str]]:
    """Yield (kind, old_line, new_line, text) per body line; the numbers are where it sits."""
    # A zero-count side's start names the line *before* the change; step past it.
    old = hunk.old_start + (hunk.old_count == 0)
    new = hunk.new_start + (hunk.new_count == 0)
    for line in hunk.lines:
        kind = line[:1] or " "
        if kind == "\\":
            continue
        yield kind, old, new, line[1:]
        if kind in (" ", "-"):
            old += 1
        if kind in (" ", "+"):
            new += 1


# --- running git -------------------------------------------------------------------------------


def open_repo(path: str | Path) -> git.Repo:
    """A gitpython Repo for `path` (any directory inside a work tree or a bare repo)."""
    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise GitError(f"not a git repository: {path}") from exc


def run_git(
    cwd: str | Path,
    *args: str,
    stdin: str | bytes | None = None,
    env: dict | None = None,
    timeout: float | None = None,
) -> str:
    """The one way diffdx runs the git command line: `git ARGS` in `cwd` -> stdout (decoded);
    GitError (with git's stderr and exit code) when it fails, cannot start or times out."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    command = " ".join(_without_config(args)[:3])
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, env=env, input=data, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GitError(f"git {command} failed: {e}") from None
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).decode(errors="replace").strip()
        raise GitError(f"git {command} failed: {err}", proc.returncode, err)
    return proc.stdout.decode(errors="replace")


def _without_config(args: tuple[str, ...]) -> tuple[str, ...]:
    """The command and its arguments, without leading `-c key=value` pairs (for messages)."""
    while len(args) >= 2 and args[0] == "-c":
        args = args[2:]
    return args


def _git(repo_path: str | Path, *args: str, stdin: str | None = None) -> str:
    """Run one read-only (or worktree-local) git command, hooks off, return stdout; GitError on failure."""
    return run_git(repo_path, *_NO_HOOKS, *args, stdin=stdin)


def apply_patch(worktree: str | Path, patch: str) -> list[str]:
    """`git apply` a unified diff in `worktree` (a scratch one: never the user's); the files it changed."""
    _git(worktree, "apply", "--whitespace=nowarn", "-", stdin=patch if patch.endswith("\n") else patch + "\n")
    return _git(worktree, "diff", "--name-only").split()


def resolve(repo_path: str | Path, ref: str) -> str:
    """A ref (tag, branch, `HEAD~3`, short or full sha) -> the full commit sha."""
    try:
        return _git(repo_path, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except GitError:
        raise GitError(f"cannot resolve {ref!r} to a commit in {repo_path}") from None


_LOG_FORMAT = "%H%x1f%an <%ae>%x1f%aI%x1f%B%x1e"


def _parse_log(text: str) -> list[CommitInfo]:
    commits = []
    for record in text.split("\x1e"):
        if record.strip():
            sha, author, date, message = record.lstrip("\n").split("\x1f", 3)
            message = message.strip()
            commits.append(CommitInfo(sha, message.split("\n", 1)[0].strip(), message, author, date))
    return commits


def commit_info(repo_path: str | Path, ref: str) -> CommitInfo:
    sha = resolve(repo_path, ref)
    return _parse_log(_git(repo_path, "log", "-n", "1", f"--format={_LOG_FORMAT}", sha))[0]


def is_ancestor(repo_path: str | Path, ancestor: str, descendant: str) -> bool:
    try:
        _git(repo_path, "merge-base", "--is-ancestor", resolve(repo_path, ancestor), resolve(repo_path, descendant))
    except GitError:
        return False
    return True


def first_parent_range(repo_path: str | Path, good: str, bad: str) -> list[CommitInfo]:
    """Commits in (good, bad] along bad's first-parent chain, oldest first."""
    good_sha, bad_sha = resolve(repo_path, good), resolve(repo_path, bad)
    if not is_ancestor(repo_path, good_sha, bad_sha):
        raise GitError(f"good ref {good!r} is not an ancestor of bad ref {bad!r}")
    return _parse_log(
        _git(repo_path, "log", "--first-parent", "--reverse", f"--format={_LOG_FORMAT}", f"{good_sha}..{bad_sha}")
    )


def first_parent(repo_path: str | Path, ref: str) -> str:
    """The first parent's sha, or the empty tree for a root commit (so diffs still work)."""
    parents = _git(repo_path, "rev-list", "--parents", "-n", "1", resolve(repo_path, ref)).split()
    return parents[1] if len(parents) > 1 else EMPTY_TREE


def commit_diff(repo_path: str | Path, ref: str, paths: Sequence[str] = (), context: int = 3) -> str:
    """Unified diff of a commit against its first parent, optionally limited to `paths`."""
    sha = resolve(repo_path, ref)
    return _git(
        repo_path,
        "diff",
        f"--unified={context}",
        "--no-color",
        "--no-ext-diff",
        "-M",
        first_parent(repo_path, sha),
        sha,
        "--",
        *paths,
    )


def tree_files(
    repo_path: str | Path, ref: str, suffixes: Sequence[str] = (), paths: frozenset[str] | None = None
) -> Iterator[tuple[str, bytes]]:
    """(path, content) of every blob in the commit's tree whose name ends with one of `suffixes`
    (and, with `paths`, is one of them), breadth first, each directory's entries in git's order
    (gitpython's `tree.traverse()` order).

    One `ls-tree` and one `cat-file --batch` for the blobs this process has not read before:
    a diagnosis indexes several commits of the same large tree (transformers: ~2900 files), which
    share nearly every blob, and reading them one by one was seconds per commit."""
    entries = _tree_entries(repo_path, resolve(repo_path, ref))
    wanted = [
        (path, sha)
        for kind, sha, path in entries
        if kind == "blob" and (not suffixes or path.endswith(tuple(suffixes))) and (paths is None or path in paths)
    ]
    known = {sha: data for _, sha in wanted if (data := _BLOBS.get(sha)) is not None}
    known.update(_read_blobs(repo_path, sorted({sha for _, sha in wanted} - known.keys())))
    for path, sha in wanted:
        yield path, known[sha]


def _tree_entries(repo_path: str | Path, sha: str) -> list[tuple[str, str, str]]:
    """(type, object sha, path) of every entry under commit `sha`, in `tree.traverse()` order."""
    children: dict[str, list[tuple[str, str, str]]] = {}
    for record in _git(repo_path, "ls-tree", "-r", "-t", "-z", "--full-tree", sha).split("\0"):
        if record:
            meta, path = record.split("\t", 1)
            _mode, kind, obj = meta.split(" ")
            children.setdefault(path.rpartition("/")[0], []).append((kind, obj, path))
    out, stack = [], deque(children.get("", []))
    while stack:  # breadth first: a directory's children after all of its siblings
        entry = stack.popleft()
        out.append(entry)
        if entry[0] == "tree":
            stack.extend(children.get(entry[2], []))
    return out


def _read_blobs(repo_path: str | Path, shas: list[str]) -> dict[str, bytes]:
    """Blobs `shas` (sha -> content, also kept in _BLOBS) by one `git cat-file --batch`; GitError
    when git fails or lacks one."""
    if not shas:
        return {}
    try:
        proc = subprocess.run(
            ["git", "cat-file", "--batch"], cwd=repo_path, input="\n".join(shas).encode() + b"\n", capture_output=True
        )
    except OSError as e:
        raise GitError(f"git cat-file failed: {e}") from None
    if proc.returncode != 0:
        raise GitError(f"git cat-file failed: {proc.stderr.decode(errors='replace').strip()}", proc.returncode)
    out, at, read = proc.stdout, 0, {}
    for sha in shas:
        header_end = out.index(b"\n", at)
        header = out[at:header_end].split()
        if len(header) != 3:
            raise GitError(f"git cat-file: {out[at:header_end].decode(errors='replace')}")
        read[sha] = out[header_end + 1 : header_end + 1 + int(header[2])]
        at = header_end + 1 + int(header[2]) + 1
    _remember_blobs(read)
    return read


def _remember_blobs(read: dict[str, bytes]) -> None:
    with _BLOBS_LOCK:
        for sha, data in read.items():
            _BLOBS[sha] = data
            _BLOB_BYTES[0] += len(data)
        while _BLOB_BYTES[0] > BLOB_BYTES_KEPT and len(_BLOBS) > 1:
            _BLOB_BYTES[0] -= len(_BLOBS.pop(next(iter(_BLOBS))))


BLOB_BYTES_KEPT = 256 << 20  # a few trees' worth of transformers sources (~55 MiB of .py each)
_BLOBS: dict[str, bytes] = {}  # blob sha -> content; the oldest read first out
_BLOB_BYTES = [0]
_BLOBS_LOCK = threading.Lock()


# --- worktrees ---------------------------------------------------------------------------------


@contextmanager
def temporary_worktree(repo_path: str | Path, ref: str) -> Iterator[Path]:
    """A detached worktree of `ref` in a temp dir, removed on any exit (exception, interrupt).

    The add runs inside the try, so an interrupt during creation is cleaned up too. Cleanup
    removes only this worktree's own admin dir: a blanket `git worktree prune` would also
    drop the user's other stale worktree entries, which is theirs to decide.
    """
    sha = resolve(repo_path, ref)
    holder = Path(tempfile.mkdtemp(prefix="diffdx-wt-"))
    tree = holder / f"wt-{sha[:10]}"
    try:
        _git(repo_path, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        yield tree
    finally:
        _remove_worktree(repo_path, tree, holder)


@contextmanager
def worktree_pool() -> Iterator[None]:
    """Inside this block, `scratch_worktree` hands back a worktree it made earlier (moved to a new
    path and checked out at the new ref) instead of adding a new one: writing a whole checkout is
    seconds per bisection step or counterfactual on a large tree (transformers: ~2900 files, 4-10 s
    under load), a checkout between two commits only rewrites the files that differ. Every worktree
    made inside is removed when the block ends, however it ends."""
    global _POOL
    outer, _POOL = _POOL, _Pool()
    try:
        yield
    finally:
        pool, _POOL = _POOL, outer
        pool.close()


@contextmanager
def scratch_worktree(repo_path: str | Path, ref: str) -> Iterator[Path]:
    """A detached worktree of `ref` to change and run, as `temporary_worktree` gives, except that
    inside `worktree_pool()` it may be one that an earlier block used: moved to a path of its own
    (nothing keyed by a tree's path can mistake it for the earlier tree), checked out with
    `--force` and cleaned of every untracked and ignored file (`clean -ffdx`: edits, patches and
    bytecode of the earlier use are gone), so its files are exactly `ref`'s, as a new one's are. A
    block left by an exception removes it, as `temporary_worktree` does. The user's checkout is
    never touched: only the pool's own worktrees are checked out."""
    pool = _POOL if _POOL is not None and _POOL.owner == os.getpid() else None
    if pool is None:
        with temporary_worktree(repo_path, ref) as tree:
            yield tree
        return
    repo = str(Path(repo_path).resolve())
    holder, tree = pool.take(repo, resolve(repo, ref))
    try:
        yield tree
    except BaseException:
        _remove_worktree(repo, tree, holder)
        raise
    if tree in pool.retired:
        _remove_worktree(repo, tree, holder)
    else:
        pool.idle.setdefault(repo, []).append((holder, tree))


def retire_worktree(tree: Path) -> None:
    """Never hand `tree` out again (an abandoned oracle may still be using it): the block that
    holds it removes it on leaving. A no-op outside `worktree_pool()`."""
    if _POOL is not None:
        _POOL.retired.add(tree)


class _Pool:
    """Idle scratch worktrees per repository (worktree_pool)."""

    def __init__(self):
        self.owner = os.getpid()  # a forked process does not share them
        self.idle: dict[str, list[tuple[Path, Path]]] = {}  # repo -> [(holder, tree)]
        self.retired: set[Path] = set()
        self.uses = 0

    def take(self, repo: str, sha: str) -> tuple[Path, Path]:
        """An idle worktree of `repo` moved and checked out at `sha`, or a new one."""
        self.uses += 1
        if not self.idle.get(repo):
            holder = Path(tempfile.mkdtemp(prefix="diffdx-wt-"))
            tree = holder / f"wt-{sha[:10]}-{self.uses}"
            try:
                _git(repo, "worktree", "add", "--detach", "--quiet", str(tree), sha)
            except BaseException:
                _remove_worktree(repo, tree, holder)
                raise
            return holder, tree
        holder, old = self.idle[repo].pop()
        tree = holder / f"wt-{sha[:10]}-{self.uses}"
        try:
            _git(repo, "worktree", "move", str(old), str(tree))
            _git(tree, "checkout", "--detach", "--force", "--quiet", sha)
            _git(tree, "clean", "-ffdxq")
        except BaseException:
            _remove_worktree(repo, tree if tree.exists() else old, holder)
            raise
        return holder, tree

    def close(self) -> None:
        for repo, entries in self.idle.items():
            for holder, tree in entries:
                _remove_worktree(repo, tree, holder)
        self.idle.clear()


_POOL: _Pool | None = None


def _remove_worktree(repo_path: str | Path, tree: Path, holder: Path) -> None:
    """Remove the worktree, its temp dir and its admin entry; a second Ctrl-C waits for it."""
    interrupted = None
    for step in (
        lambda: _git(repo_path, "worktree", "remove", "--force", "--force", str(tree)),
        lambda: shutil.rmtree(holder, ignore_errors=True),
        lambda: _drop_admin_dirs(repo_path, tree),
    ):
        try:
            step()
        except (GitError, OSError):
            pass  # `remove` fails if `add` never finished; the next steps cover it
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def _drop_admin_dirs(repo_path: str | Path, tree: Path) -> None:
    """Delete `.git/worktrees/<id>` entries that point at `tree` (and the folder if left empty)."""
    common = Path(_git(repo_path, "rev-parse", "--git-common-dir").strip())
    admin_root = common if common.is_absolute() else Path(repo_path) / common
    admin_root = admin_root / "worktrees"
    if not admin_root.is_dir():
        return
    for entry in admin_root.iterdir():
        gitdir = entry / "gitdir"
        if gitdir.is_file() and Path(gitdir.read_text().strip()).resolve().parent == tree.resolve():
            shutil.rmtree(entry, ignore_errors=True)
    if not any(admin_root.iterdir()):
        admin_root.rmdir()


# --- unified diffs -----------------------------------------------------------------------------


def parse_unified_diff(text: str) -> list[FileDiff]:
    """A `git diff` / `diff -u` text -> one FileDiff per file, hunks in order."""
    lines, files, i = text.splitlines(), [], 0
    while i < len(lines):
        if _starts_file(lines, i):
            file_diff, i = _parse_file(lines, i)
            files.append(file_diff)
        else:
            i += 1  # preamble (e.g. a format-patch mail header)
    return [f for f in files if f.old_path or f.new_path]


def _starts_file(lines: list[str], i: int) -> bool:
    return lines[i].startswith("diff --git ") or (
        lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
    )


def _parse_file(lines: list[str], i: int) -> tuple[FileDiff, int]:
    header: list[str] = []
    old_path = new_path = None
    while i < len(lines) and not lines[i].startswith("@@"):
        line = lines[i]
        if header and (
            line.startswith("diff --git ") or (line.startswith("--- ") and any(h.startswith("+++ ") for h in header))
        ):
            break  # next file (this one had no hunks: binary, mode change)
        if line.startswith("diff --git "):
            old_path, new_path = _git_header_paths(line)
        elif line.startswith("--- "):
            old_path = _diff_path(line[4:])
        elif line.startswith("+++ "):
            new_path = _diff_path(line[4:])
        elif line.startswith("deleted file"):
            new_path = None
        header.append(line)
        i += 1
    if any(h.startswith("new file") for h in header):
        old_path = None
    hunks = []
    while i < len(lines) and lines[i].startswith("@@"):
        hunk, i = _parse_hunk(lines, i)
        hunks.append(hunk)
    return FileDiff(old_path, new_path, tuple(header), tuple(hunks)), i


def _git_header_paths(line: str) -> tuple[str | None, str | None]:
    m = re.match(r"diff --git a/(.*) b/(.*)$", line)
    return (m.group(1), m.group(2)) if m else (None, None)


def _diff_path(raw: str) -> str | None:
    raw = raw.split("\t", 1)[0].strip()
    if raw == "/dev/null":
        return None
    return raw[2:] if raw[:2] in ("a/", "b/") else raw


def _parse_hunk(block: list[str], i: int) -> tuple[Hunk, int]:
    m = _HUNK_HEADER.match(block[i])
    if not m:
        raise ValueError(f"malformed hunk header: {block[i]!r}")
    old_start, old_count = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
    new_start, new_count = int(m.group(3)), int(m.group(4) if m.group(4) is not None else 1)
    body, i, old_left, new_left = [], i + 1, old_count, new_count
    while i < len(block) and (old_left > 0 or new_left > 0 or block[i].startswith("\\")):
        line = block[i] or " "  # some tools strip the space of an empty context line
        kind = line[0]
        if kind not in " +-\\":
            break
        body.append(line)
        old_left -= kind in " -"
        new_left -= kind in " +"
        i += 1
    return Hunk(old_start, old_count, new_start, new_count, tuple(body)), i


def format_patch(file_diff: FileDiff, hunks: Sequence[Hunk]) -> str:
    """A patch text for `git apply` with only `hunks`. A file that exists on both sides gets a
    plain in-place header, so applying (or reverting) hunks never replays a rename or mode change."""
    path = file_diff.new_path
    if path and file_diff.old_path:
        lines = [f"diff --git a/{path} b/{path}", f"--- a/{path}", f"+++ b/{path}"]
    else:
        lines = list(file_diff.header)
    for h in hunks:
        lines.append(h.header)
        lines.extend(h.lines)
    return "\n".join(lines) + "\n"


# --- counterfactual reverts --------------------------------------------------------------------


def hunks_overlapping(file_diff: FileDiff, start: int, end: int) -> list[Hunk]:
    """Hunks whose changed lines (new side, context excluded) touch lines [start, end]."""
    return [h for h in file_diff.hunks if h.changed_new_span()[0] <= end and h.changed_new_span()[1] >= start]


def revert_function_hunks(
    worktree: str | Path, commit: str, file: str, start: int, end: int, repo_path: str | Path | None = None
) -> list[Hunk]:
    """Reverse-apply, in `worktree`, the hunks of `commit` that change `file` lines [start, end].

    `start`/`end` are 1-based inclusive lines of the function *as of `commit`* (the new side
    of its diff); the worktree may be at `commit` or later (git apply tolerates offsets).
    Returns the reverted hunks ([] when the commit does not touch that range). Only the
    worktree's files change; its index and the main checkout are left alone.
    """
    source = repo_path or worktree
    diffs = [d for d in parse_unified_diff(commit_diff(source, commit, [file])) if d.path == file]
    if not diffs:
        return []
    selected = hunks_overlapping(diffs[0], start, end)
    if not selected:
        return []
    _reverse_apply(
        worktree, format_patch(diffs[0], selected), f"reverting {len(selected)} hunk(s) of {commit[:10]} in {file}"
    )
    return selected


def _reverse_apply(worktree: str | Path, patch: str, what: str) -> None:
    """`git apply -R` in the worktree; on failure retry needing only 1 line of context, since
    git pins a hunk that starts at line 1 to the file's start unless context is relaxed."""
    error = None
    for strictness in ((), ("-C1",)):
        try:
            _git(worktree, "apply", "-R", "--whitespace=nowarn", *strictness, "-", stdin=patch)
            return
        except GitError as exc:
            error = exc
    raise PatchConflict(f"{what} failed: {error}")
