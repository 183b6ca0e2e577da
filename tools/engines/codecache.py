"""Compiled code of the trees under test, shared between their copies (used by tools/engines/worker.py).

Every engine run imports the tree under test fresh, from a worktree that is new for each bisection
step and counterfactual, where no .pyc exists (or none may be written: PYTHONDONTWRITEBYTECODE).
Compiling what a large package imports (transformers: about 170 modules) is then seconds of every
run. Compiled code depends only on the source bytes, the interpreter's bytecode version and the
optimization level, so it is cached under a hash of those (DIFFDX_CACHE/bytecode/) and shared by
every copy of the same file. The file name inside a cached code object is set to the importing
copy's path, as importlib does when it loads a .pyc, so tracebacks, coverage and source reading
see the tree under test. A .pyc next to the source, when valid, is still read first.
"""

from __future__ import annotations

import _imp
import hashlib
import importlib.machinery as machinery
import importlib.util
import marshal
import os
import sys
import tempfile
from pathlib import Path


def code_key(source: bytes, optimize: int) -> str:
    """Cache entry name of the code compiled from `source` by this interpreter. Pure."""
    level = sys.flags.optimize if optimize == -1 else optimize
    return hashlib.sha256(importlib.util.MAGIC_NUMBER + bytes([level]) + source).hexdigest()


class CachedSourceLoader(machinery.SourceFileLoader):
    """importlib's source loader, except that compiling looks in the cache first."""

    cache: Path = Path()

    def source_to_code(self, data, path, *, _optimize=-1):
        entry = self.cache / code_key(bytes(data), _optimize)
        try:
            code = marshal.loads(entry.read_bytes())
        except (OSError, EOFError, ValueError, TypeError):  # absent, or a torn or foreign entry
            code = super().source_to_code(data, path, _optimize=_optimize)
            store(entry, marshal.dumps(code))
            return code
        _imp._fix_co_filename(code, os.fspath(path))
        return code


def store(entry: Path, data: bytes) -> None:
    """Write a cache entry atomically (concurrent workers may write the same one); a cache that
    cannot be written only costs the speed-up."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, entry)
    except OSError:
        pass


def install(cache: Path) -> None:
    """From now on, this process compiles Python source through the cache at `cache`."""
    CachedSourceLoader.cache = cache
    hook = machinery.FileFinder.path_hook(
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (CachedSourceLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
    )
    names = [getattr(h, "__name__", "") for h in sys.path_hooks]
    if "path_hook_for_FileFinder" in names:
        sys.path_hooks[names.index("path_hook_for_FileFinder")] = hook
    else:
        sys.path_hooks.append(hook)
    sys.path_importer_cache.clear()  # finders made before this would still compile without the cache
