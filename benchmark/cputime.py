"""CPU seconds a diagnosis consumed: its own process and every process it started.

Wall time on a shared machine measures the load; CPU seconds (user + system) are close to what a
quiet core would take, so a whole benchmark's quiet wall can be projected from them (docs/benchmark.md
"Cost"). A diagnosis's work is spread over processes that do not all end with it: engine workers
forked by a zygote that lives on in the benchmark worker for the next case (tools/engines/forkserver.py),
native builds, git. So a reading is

    this process (RUSAGE_SELF)
    + the children it has reaped (RUSAGE_CHILDREN: each with what it had reaped itself)
    + its live children, each with what it has reaped (/proc/<pid>/stat utime+stime+cutime+cstime)

and a case's CPU is the difference of two readings around it. A zygote's forked run is reaped by the
zygote, so it counts as soon as it ends, though the zygote lives on. Not counted: a grandchild still
running at a reading (none after a case: runs end with it), a process that left the tree (a daemon that
double-forked), and work done for the case in other processes (a Ray raylet, the benchmark's parent).
Without /proc (not Linux) the live children are not counted.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

PROC = Path("/proc")


def tree_cpu_s(proc: Path = PROC) -> float:
    """CPU seconds used so far by this process, its reaped children and its live children (with theirs)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    return total + sum(live_children_cpu_s(os.getpid(), proc).values())


def live_children_cpu_s(parent: int, proc: Path = PROC) -> dict[int, float]:
    """pid -> CPU seconds (its own and its reaped children's) of each live child of `parent` ({} without /proc)."""
    if not proc.is_dir():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone between the listing and the read
            continue
        parsed = parse_stat(stat)
        if parsed is not None and parsed[0] == parent:
            found[int(entry.name)] = parsed[1] / tick
        # a zombie child still shows its times here; once reaped they are in RUSAGE_CHILDREN instead
    return found


def parse_stat(text: str) -> tuple[int, int] | None:
    """A /proc/<pid>/stat line -> (ppid, utime + stime + cutime + cstime in clock ticks); None if malformed.
    The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'. Pure."""
    _, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 15:
        return None
    try:  # after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
        return int(fields[1]), sum(int(f) for f in fields[11:15])
    except ValueError:
        return None
