"""Which functions of the tree under test ran: spectrum evidence for the hypotheses.

Default recorder: a `sys.settrace` hook that looks only at `call` events (a Python frame
starting: functions, class bodies, comprehensions, modules, generator resumptions) and returns
None, so no frame is ever traced line by line, and C calls (every torch op) raise no event at
all; `threading.settrace` extends it to threads the engine starts. Names are
`relpath:qualname`, nested functions as `outer.inner` (`co_qualname` without `<locals>`), as
tools/source/index.py indexes them.

DIFFDX_COVERAGE selects the recorder; all three give the same set, except that the profile
hook misses functions run in threads other than the main one:
  calls     the default, above;
  profile   the former `sys.setprofile` hook (every C call is an event too);
  coverage  the `coverage` package's C tracer (pip install coverage), restricted to the tree,
            in arc mode: an arc from `-n` is the entry into the code object whose first line
            is n. It traces every line of the tree, which here cost more than either hook
            (engine time of a coverage run, 2026-12-01, loaded machine: tinyserve 1.5-1.8 s
            against 0.6-0.9 s; transformers 44 s against 33-37 s for calls, 40-46 s profile).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType

RECORDED_LANGUAGES = ("python",)  # what the recorders here see; a C/C++ function's run is unknown to them


def has_python_source(root: str) -> bool:
    """Whether any Python file lies under `root` (stops at the first): the recorders here see
    Python frames only, so on a native tree (C, C++) their empty set would be no evidence."""
    for _dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__")]
        if any(name.endswith(".py") for name in filenames):
            return True
    return False


@contextmanager
def function_coverage(root: str | None) -> Iterator[set[tuple[str, str]]]:
    """Yields a set that holds (relpath, qualname) of every function under `root` that ran, once the
    block is left. Nothing is recorded without a root."""
    seen: set[tuple[str, str]] = set()
    if not root:
        yield seen
        return
    prefix = str(Path(root).resolve()) + os.sep
    recorder = {"profile": _profiled, "coverage": _traced}.get(os.environ.get("DIFFDX_COVERAGE", ""), _calls)
    with recorder(prefix, seen):
        yield seen


@contextmanager
def _traced(prefix: str, seen: set) -> Iterator[None]:
    import coverage

    cov = coverage.Coverage(data_file=None, include=[prefix + "*"], config_file=False, branch=True)
    cov.set_option("run:disable_warnings", ["no-data-collected", "module-not-measured", "module-not-imported"])
    cov.start()
    try:
        yield
    finally:
        cov.stop()
        data = cov.get_data()
        for path in data.measured_files():
            if path.startswith(prefix):
                entered = {-a for a, _ in data.arcs(path) or () if a < 0}
                seen.update((path[len(prefix) :], q) for q in functions_run(path, entered))


@contextmanager
def _profiled(prefix: str, seen: set) -> Iterator[None]:
    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(prefix):
                seen.add((code.co_filename[len(prefix) :], qualname(code)))

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


@contextmanager
def _calls(prefix: str, seen: set) -> Iterator[None]:
    def trace(frame: FrameType, event: str, _arg: object) -> None:
        code = frame.f_code
        if code.co_filename.startswith(prefix):
            seen.add((code.co_filename[len(prefix) :], qualname(code)))

    threading.settrace(trace)
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(None)
        threading.settrace(None)


def functions_run(path: str, entered: set[int]) -> set[str]:
    """Qualnames of the code objects in the file at `path` whose first line is in `entered`."""
    try:
        module = compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        return set()
    return {qualname(c) for c in code_objects(module) if c.co_firstlineno in entered}


def code_objects(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from code_objects(const)


def qualname(code: CodeType) -> str:
    return code.co_qualname.replace("<locals>.", "")
