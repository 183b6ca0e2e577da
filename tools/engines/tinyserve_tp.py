"""A tensor-parallel tinyserve run fails fast and names the rank that failed.

Rank 0 is the worker's own process; ranks 1.. are processes the engine spawns
(tinyserve.distributed.runner.worker_main). Every rank meets the others at each collective, so one
rank that raises leaves the rest waiting there until the process group's timeout (minutes): rank 0
raising left the spawned ranks mid-forward and its exit-time `stop` broadcast met their all-reduce
(measured: 6 min 38 s before the run failed, with a gloo timeout as its message); a spawned rank
raising surfaced on rank 0 as "Connection reset by peer", the rank's own error nowhere in it.

`tp_guard` wraps the spawned ranks' entry so a rank's exception is written to a file before the rank
exits, and on the way out of a failed run kills the ranks still alive (nothing waits on a dead peer)
and re-raises with the failing rank's error. A watchdog covers the case where rank 0 never reaches a
collective that would fail (it waits in the group's rendezvous): once a rank has failed and rank 0
has not, within GRACE_S, it ends the worker process with that rank's error.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GRACE_S = 10.0  # for rank 0's own collective to fail first (it then raises with the rank's error)
POLL_S = 0.2
SETTLE_S = 3.0  # after rank 0 fails: for a failing rank's error file to appear


class RankFailed(RuntimeError):
    """A spawned tensor-parallel rank raised; the message is its error, one line."""


class RankEntry:
    """The spawned ranks' entry function, wrapped: its exception is written to `errdir/rank-R` first.
    Picklable: the spawned rank imports this class from diffdx and the entry by its module's name
    (there the module holds the original, not this wrapper)."""

    def __init__(self, module: str, errdir: str, rank_arg: int = 1):
        self.module, self.errdir, self.rank_arg = module, errdir, rank_arg

    def __call__(self, *args):
        try:
            return importlib.import_module(self.module).worker_main(*args)
        except BaseException as e:
            rank = args[self.rank_arg] if len(args) > self.rank_arg else os.getpid()
            line = f"{type(e).__name__}: {e}".splitlines()[0][:500]
            (Path(self.errdir) / f"rank-{rank}").write_text(line)
            raise


def rank_errors(errdir: Path) -> list[str]:
    """'rank R: Error: message' for each spawned rank that has failed, lowest rank first."""
    found = sorted(errdir.glob("rank-*"), key=lambda p: p.name)
    return [f"rank {p.name.removeprefix('rank-')}: {p.read_text()}" for p in found]


def kill_ranks() -> None:
    """Every spawned rank still alive: without rank 0 they would wait at a collective until the timeout."""
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)


def settle(errdir: Path, wait_s: float = SETTLE_S) -> list[str]:
    """rank_errors, once a failing rank has had time to write its error: a rank's own clean-up (its
    process group destroyed) can reach rank 0 as a broken connection before the rank's file does."""
    deadline = time.monotonic() + wait_s
    while not rank_errors(errdir) and multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return rank_errors(errdir)


def _watch(errdir: Path, done: threading.Event) -> None:
    """Runs beside rank 0: a rank failed and rank 0 is still blocked after GRACE_S -> end the worker."""
    while not done.wait(POLL_S):
        failed = rank_errors(errdir)
        if failed and not done.wait(GRACE_S):
            kill_ranks()
            print(f"error: tensor-parallel {failed[0]} (rank 0 was left waiting at a collective)", file=sys.stderr)
            sys.stderr.flush()
            shutil.rmtree(errdir, ignore_errors=True)  # os._exit runs no finally: nothing else would remove it
            os._exit(1)  # rank 0 is blocked inside a collective: nothing else would return in time


@contextmanager
def tp_guard(runner_module, forget) -> Iterator[None]:
    """Around a tensor-parallel engine's whole life. `runner_module.worker_main` (the spawned ranks'
    entry, when the tree has one) is wrapped while inside; `forget()` drops the engine's exit-time
    shutdown, which after a failure would only wait on dead ranks and bury the error under its own."""
    entry = getattr(runner_module, "worker_main", None)
    errdir = Path(tempfile.mkdtemp(prefix="diffdx-tp-"))
    done = threading.Event()
    if entry is not None:
        runner_module.worker_main = RankEntry(runner_module.__name__, str(errdir))
        threading.Thread(target=_watch, args=(errdir, done), daemon=True).start()
    try:
        yield
    except BaseException as e:
        done.set()
        failed = settle(errdir)
        kill_ranks()
        forget()
        if failed:
            raise RankFailed(f"tensor-parallel {failed[0]}") from e
        raise
    finally:
        done.set()
        if entry is not None:
            runner_module.worker_main = entry
        for f in errdir.glob("rank-*"):
            f.unlink()
        errdir.rmdir()
