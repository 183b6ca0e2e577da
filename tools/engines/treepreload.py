"""A zygote for one tree under test: the tree's own heavy package imported once, its runs forked
from it (issue 14; tools/engines/forkserver.py `--tree`, tools/engines/runner.py `tree_server`).

A transformers tree under test is imported afresh by every engine run: seconds of every run (about
170 modules). DESIGN §4 asks that each run import the tree under test fresh; a fork of a process
that imported exactly that tree (same files: `tree_fingerprint` is checked before every run), with
the run's own environment, and that ran no tensor op, is that fresh import, done once. What would
tell the two apart is recorded at the import and handed to each run:

- coverage: a fresh run imports the package inside its coverage window, so the functions that
  ran at import count as run. The zygote records them with the same recorder
  (tools/engines/funccov.py) and each forked run adds them (`preloaded_coverage`).
- function checks: a call of a checked function during the import would be missing from the
  run's record, so a tree whose import makes one gets no zygote (`preload_tree` says so) and its
  runs import it themselves, as do runs of a tree whose import fails or whose files changed.

Only modules that every run of the adapter imports are preloaded (TREE_PRELOAD), so a run never
sees a module, or an import-time call, that its own import would not have made.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path

# Set by the worker before anything else runs (tools/engines/worker.py), read by some packages at import.
QUIET_THIRD_PARTY = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}

PRELOADED: dict[str, set[tuple[str, str]]] = {}  # in a tree zygote: tree prefix -> (abs file, qualname) run at import


def tree_fingerprint(root: str | Path, packages: tuple[str, ...]) -> str:
    """Identity of the files of `packages` under `root`: path, size, mtime and inode of each (a
    checkout or a patch rewrites a file, so at least one of them changes). Pure but for stat."""
    h = hashlib.sha256()
    for package in packages:
        for dirpath, dirnames, filenames in os.walk(Path(root) / package):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                st = os.stat(path)
                h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return h.hexdigest()


def preload_tree(root: str, modules: tuple[str, ...]) -> str | None:
    """In a zygote whose path starts with the tree: import `modules` of the tree as a worker would
    (compiled code cache on, the worker's quiet settings), recording what ran. None when done, else
    why this tree gets no zygote."""
    from tools.engines import codecache
    from tools.engines.funccov import function_coverage
    from tools.engines.functaps import function_taps
    from tools.hypotheses.contracts import contract_for
    from tools.probe.checkpoints import cache_root

    for key, value in QUIET_THIRD_PARTY.items():
        os.environ.setdefault(key, value)
    codecache.install(cache_root() / "bytecode")
    prefix = str(Path(root).resolve()) + os.sep
    try:
        with (
            function_coverage(root) as covered,
            function_taps(root, lambda q, p: contract_for(q, p) is not None) as calls,
        ):
            for name in modules:
                importlib.import_module(name)
    except Exception as e:  # the run will import it itself and fail there, as it would have
        return f"{type(e).__name__}: {e}"
    if calls:
        return f"its import calls checked functions ({', '.join(sorted({c.function for c in calls})[:3])})"
    PRELOADED[prefix] = {(prefix + rel, q) for rel, q in covered}
    return None


def preloaded_coverage(root: str | None) -> set[tuple[str, str]]:
    """In a run forked from a tree zygote: (relpath under `root`, qualname) of the functions that ran
    when the zygote imported the tree, as the run's coverage would have recorded them. Else empty."""
    if not root:
        return set()
    prefix = str(Path(root).resolve()) + os.sep
    return {(f[len(prefix) :], q) for entries in PRELOADED.values() for f, q in entries if f.startswith(prefix)}
