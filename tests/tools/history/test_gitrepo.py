"""gitrepo on real repos in tmp dirs: ranges, diffs, worktrees, reverse patches, and the
guarantee that the user's checkout is byte-for-byte untouched."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.history import gitrepo
from tools.history.bisect import bisect_commits, command_oracle
from tools.source.index import open_index

GIT_ENV = {"GIT_AUTHOR_DATE": "2024-01-01T00:00:00", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00"}


def git(repo: Path, *args: str) -> str:
    cmd = [
        "git",
        "-c",
        "user.name=Tester",
        "-c",
        "user.email=t@example.com",
        "-c",
        "init.defaultBranch=main",
        "-c",
        "commit.gpgsign=false",
        "-C",
        str(repo),
        *args,
    ]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}).stdout


def commit_files(repo: Path, message: str, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def linear_repo(tmp_path: Path, n: int = 6) -> tuple[Path, list[str]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    shas = [commit_files(repo, f"step {i}\n\nbody of step {i}", {"app.py": f"VALUE = {i}\n"}) for i in range(n)]
    git(repo, "tag", "v0", shas[0])
    return repo, shas


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root (files hashed, dirs listed), .git included."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            full = os.path.join(dirpath, f)
            out[os.path.relpath(full, root)] = hashlib.sha256(Path(full).read_bytes()).hexdigest()
    return out


def test_resolve_tags_relative_refs_and_short_shas(tmp_path):
    repo, shas = linear_repo(tmp_path)
    assert gitrepo.resolve(repo, "v0") == shas[0]
    assert gitrepo.resolve(repo, "HEAD~3") == shas[2]
    assert gitrepo.resolve(repo, shas[4][:8]) == shas[4]
    with pytest.raises(gitrepo.GitError, match="cannot resolve"):
        gitrepo.resolve(repo, "no-such-ref")


def test_first_parent_range_is_oldest_first_and_skips_merged_side_commits(tmp_path):
    repo, shas = linear_repo(tmp_path, 3)
    git(repo, "checkout", "-q", "-b", "side", shas[1])
    side = commit_files(repo, "side work", {"side.py": "X = 1\n"})
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    merge = git(repo, "rev-parse", "HEAD").strip()
    listed = [c.sha for c in gitrepo.first_parent_range(repo, "v0", "HEAD")]
    assert listed == [shas[1], shas[2], merge]
    assert side not in listed
    with pytest.raises(gitrepo.GitError, match="not an ancestor"):
        gitrepo.first_parent_range(repo, "HEAD", "v0")


def test_commit_info_and_diff(tmp_path):
    repo, shas = linear_repo(tmp_path)
    info = gitrepo.commit_info(repo, "HEAD~1")
    assert (info.sha, info.subject) == (shas[4], "step 4")
    assert info.message == "step 4\n\nbody of step 4"
    assert info.author == "Tester <t@example.com>" and info.date.startswith("2024-01-01")
    diff = gitrepo.commit_diff(repo, shas[4])
    assert "-VALUE = 3" in diff and "+VALUE = 4" in diff
    root_diff = gitrepo.commit_diff(repo, shas[0])  # root commit: diff against the empty tree
    assert "+VALUE = 0" in root_diff


def test_tree_files_reads_every_blob_of_a_commit_in_gitpython_traversal_order(tmp_path):
    """One ls-tree and one batched cat-file give what walking the commit's tree object by object
    gives (same paths, bytes and order, nested directories and a suffix filter included), also for
    a second commit whose shared blobs come from memory."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    files = {"z.py": "Z = 1\n", "a/b/c.py": "C = 2\n", "a/x.cpp": "int x;\n", "a/b.py": "", "README": "r\n"}
    first = commit_files(repo, "base", files)
    second = commit_files(repo, "change", {"a/b/c.py": "C = 3\n", "a/b/d/e.py": "E = 'é'\n"})

    def walked(ref: str, suffixes: tuple[str, ...]) -> list[tuple[str, bytes]]:
        with gitrepo.open_repo(repo) as r:
            return [
                (item.path, item.data_stream.read())
                for item in r.commit(ref).tree.traverse()
                if item.type == "blob" and (not suffixes or item.path.endswith(suffixes))
            ]

    for ref in (first, second):
        for suffixes in ((), (".py",), (".py", ".cpp")):
            assert list(gitrepo.tree_files(repo, ref, suffixes)) == walked(ref, suffixes)
    assert ("a/b/d/e.py", "E = 'é'\n".encode()) in list(gitrepo.tree_files(repo, second, (".py",)))
    some = frozenset({"a/b/c.py", "a/x.cpp", "nowhere.py"})
    assert list(gitrepo.tree_files(repo, second, (".py",), some)) == [
        (p, d) for p, d in walked(second, (".py",)) if p in some
    ]


def test_temporary_worktree_is_detached_and_removed_on_every_exit(tmp_path):
    repo, shas = linear_repo(tmp_path)
    with gitrepo.temporary_worktree(repo, "HEAD~2") as tree:
        assert (tree / "app.py").read_text() == "VALUE = 3\n"
        (tree / "scratch.txt").write_text("oracle output")  # untracked files do not block removal
        kept = tree
    assert not kept.exists()
    for exc in (RuntimeError("oracle blew up"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with gitrepo.temporary_worktree(repo, "v0") as tree:
                kept = tree
                raise exc
        assert not kept.exists()
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (repo / ".git" / "worktrees").exists()


def test_pooled_scratch_worktree_is_reused_clean_at_each_ref_and_removed_at_the_end(tmp_path):
    """Bisection steps and counterfactuals reuse one checkout (issue 14): each use sees exactly its
    ref's files (earlier edits, untracked and ignored files gone), at a path of its own; the user's
    checkout is untouched and nothing is left once the pool closes."""
    repo, shas = linear_repo(tmp_path)
    (repo / ".gitignore").write_text("__pycache__/\n")  # untracked in the user's checkout, not committed
    before = snapshot(repo)
    with gitrepo.worktree_pool():
        with gitrepo.scratch_worktree(repo, "HEAD~2") as first:
            assert (first / "app.py").read_text() == "VALUE = 3\n"
            (first / "app.py").write_text("VALUE = 99\n")  # a counterfactual edit, same size
            (first / "scratch.txt").write_text("oracle output")
            (first / "__pycache__").mkdir()
            (first / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"stale")
        with gitrepo.scratch_worktree(repo, "v0") as second:
            assert second != first and not first.exists() and second.parent == first.parent  # moved, reused
            assert sorted(p.name for p in second.iterdir()) == [".git", "app.py"]
            assert (second / "app.py").read_text() == "VALUE = 0\n"
            assert gitrepo.resolve(second, "HEAD") == shas[0]
        with pytest.raises(RuntimeError):
            with gitrepo.scratch_worktree(repo, "HEAD") as third:
                raise RuntimeError("oracle blew up")
        assert not third.exists()  # a block that raised removes its worktree, as temporary_worktree does
        with gitrepo.scratch_worktree(repo, "HEAD") as fourth:
            assert (fourth / "app.py").read_text() == "VALUE = 5\n"
            gitrepo.retire_worktree(fourth)
        assert not fourth.exists()  # retired (an abandoned oracle's): never handed out again
        with gitrepo.scratch_worktree(repo, "HEAD~1") as fifth:
            pass
    assert not fifth.exists() and not fifth.parent.exists()
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (repo / ".git" / "worktrees").exists()
    assert snapshot(repo) == before


def test_users_own_stale_worktree_entry_is_not_pruned(tmp_path):
    repo, _ = linear_repo(tmp_path)
    git(repo, "worktree", "add", "--detach", "-q", str(tmp_path / "users-tree"), "v0")
    subprocess.run(["rm", "-rf", str(tmp_path / "users-tree")], check=True)  # stale, not pruned
    before = sorted(p.name for p in (repo / ".git" / "worktrees").iterdir())
    with gitrepo.temporary_worktree(repo, "HEAD"):
        pass
    assert sorted(p.name for p in (repo / ".git" / "worktrees").iterdir()) == before == ["users-tree"]


def test_parse_unified_diff_positions_of_additions_and_removals():
    text = (
        "diff --git a/m.py b/m.py\nindex 1..2 100644\n--- a/m.py\n+++ b/m.py\n"
        "@@ -1,4 +1,4 @@\n a\n-b\n+B\n c\n d\n@@ -10,2 +9,0 @@\n-x\n-y\n"
        "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n"
        "@@ -0,0 +1,2 @@\n+n1\n+n2\n"
    )
    m, new = gitrepo.parse_unified_diff(text)
    assert (m.old_path, m.new_path, new.old_path, new.new_path) == ("m.py", "m.py", None, "new.py")
    first, second = m.hunks
    assert first.added_lines() == [2] and first.removed_lines() == [2]
    assert second.removed_lines() == [10, 11]
    assert [anchor for _old, anchor, _t in second.removals()] == [10, 10]  # both removed after new line 9
    assert new.hunks[0].added_lines() == [1, 2]


TWO_FUNCS_V1 = "def scale(x):\n    return x * 2\n\n\ndef shift(x):\n    return x + 1\n"
TWO_FUNCS_V2 = "def scale(x):\n    return x * 3\n\n\ndef shift(x):\n    return x + 5\n"


def test_revert_function_hunks_reverts_only_that_function(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    filler = "".join(f"# line {i}\n" for i in range(10))  # keeps the two hunks apart
    commit_files(repo, "v1", {"ops.py": TWO_FUNCS_V1.replace("\n\n\ndef shift", "\n\n" + filler + "\ndef shift")})
    culprit = commit_files(
        repo, "tweak", {"ops.py": TWO_FUNCS_V2.replace("\n\n\ndef shift", "\n\n" + filler + "\ndef shift")}
    )
    commit_files(repo, "later", {"other.py": "Y = 1\n", "ops.py": "# header\n" + (repo / "ops.py").read_text()})
    with gitrepo.temporary_worktree(repo, "HEAD") as tree:  # later than the culprit: offsets
        reverted = gitrepo.revert_function_hunks(tree, culprit, "ops.py", 1, 2, repo_path=repo)
        text = (tree / "ops.py").read_text()
        untouched = gitrepo.revert_function_hunks(tree, culprit, "ops.py", 100, 120, repo_path=repo)
    assert len(reverted) == 1 and untouched == []
    assert "return x * 2" in text and "return x + 5" in text and text.startswith("# header")


def test_checkout_is_byte_for_byte_unchanged_after_worktrees_reverts_and_bisection(tmp_path):
    repo, shas = linear_repo(tmp_path, 8)
    (repo / "app.py").write_text("VALUE = 'stashed'\n")
    git(repo, "stash", "-q")
    (repo / "app.py").write_text("VALUE = 'dirty'\n")  # unstaged change
    (repo / "staged.py").write_text("S = 1\n")
    git(repo, "add", "staged.py")  # staged change
    (repo / "notes.txt").write_text("untracked\n")  # untracked file
    before = snapshot(repo)
    stash_before = git(repo, "stash", "list")

    with gitrepo.temporary_worktree(repo, "v0") as tree:
        gitrepo.revert_function_hunks(tree, shas[0], "app.py", 1, 1, repo_path=repo)
    open_index(repo, commit="HEAD~2")
    check = [sys.executable, "-c", "import app, sys; sys.exit(0 if app.VALUE < 5 else 1)"]
    result = bisect_commits(repo, "v0", "HEAD", command_oracle(check), timeout_s=30, votes=3)

    assert result.first_bad.sha == shas[5]
    assert snapshot(repo) == before
    assert git(repo, "stash", "list") == stash_before
