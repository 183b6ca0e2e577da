"""A live status line on stderr for the stages that take more than a few seconds.

Stages open tasks; a command-line entry point draws them, once, with `live()`:

    with progress.live(quiet=args.quiet):                          # in a CLI's main
        ...
    with progress.task("engine run 3: tinyserve bfloat16 (target)"):   # in a stage
        run_engine(...)
    for v in progress.each(variants, "trigger variants", lambda v: v.name):
        ...

The line joins the open tasks, outermost first, with their counts, current item and the
innermost task's elapsed time:

    ⠋ validating cases 3/35 ts-prefix-hash › engine run 2: transformers float64 (reference) 4s

It is drawn only inside `live()`, when stderr is a terminal and --quiet is off. Library calls,
tests, piped runs and benchmark worker processes draw nothing, and stdout (where the CLIs print
JSON) is never written. Tasks are kept in one place per process (this module), so stages need
no reporter handed down; a lock keeps the list whole when an oracle thread opens tasks.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

SEPARATOR = " › "
T = TypeVar("T")


@dataclass
class Task:
    label: str
    total: int | None = None
    count: int = 0  # items started (each) or finished (advance by a callback)
    detail: str = ""  # the current or last item
    started: float = field(default_factory=time.monotonic)

    def advance(self, detail: str = "", n: int = 1) -> None:
        self.count += n
        self.detail = detail or self.detail

    def text(self) -> str:
        counted = f" {self.count}/{self.total}" if self.total else (f" {self.count}" if self.count else "")
        return self.label + counted + (f" {self.detail}" if self.detail else "")


def status_line(tasks: list[Task], now: float) -> str:
    """Open tasks -> the one-line status, outermost first; elapsed time of the innermost. Pure."""
    if not tasks:
        return ""
    return SEPARATOR.join(t.text() for t in tasks) + f" {now - tasks[-1].started:.0f}s"


class Tasks:
    """The open tasks of this process, in opening order."""

    def __init__(self):
        self._open: list[Task] = []
        self._lock = threading.Lock()

    @contextmanager
    def task(self, label: str, total: int | None = None) -> Iterator[Task]:
        t = Task(label, total)
        with self._lock:
            self._open.append(t)
        try:
            yield t
        finally:
            with self._lock:
                self._open.remove(t)

    def line(self) -> str:
        with self._lock:
            return status_line(list(self._open), time.monotonic())


_TASKS = Tasks()
_drawing = threading.Event()


def task(label: str, total: int | None = None):
    """Context manager: a task shown on the status line while it is open."""
    return _TASKS.task(label, total)


def each(items: Iterable[T], label: str, detail: Callable[[T], str] = str) -> Iterator[T]:
    """`items`, one by one, counted on the status line as `label i/n detail(item)`."""
    items = list(items)
    with task(label, total=len(items)) as t:
        for item in items:
            t.advance(detail(item))
            yield item


def current_line() -> str:
    return _TASKS.line()


@contextmanager
def live(quiet: bool = False, console=None):
    """Draw the status line on `console` (default: stderr) until the block ends; nothing when
    quiet, when stderr is not a terminal, or when a line is already being drawn."""
    from rich.console import Console
    from rich.live import Live
    from rich.spinner import Spinner

    console = console or Console(stderr=True)
    if quiet or not console.is_terminal or _drawing.is_set():
        yield
        return
    spinner = Spinner("dots", style="cyan")

    def render():
        spinner.update(text=current_line())
        return spinner if current_line() else ""

    _drawing.set()
    try:
        # stdout is routed above the line only when it is the terminal too; piped, it is left
        # alone, so JSON printed there stays clean
        with Live(
            get_renderable=render,
            console=console,
            transient=True,
            refresh_per_second=4,
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=True,
        ):
            yield
    finally:
        _drawing.clear()
