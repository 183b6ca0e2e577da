"""Process-tree helpers for the clean-run tests, read from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name ([0] is the state), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def parent_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields else None


def group_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[2]) if fields else None


def descendants(root: int) -> set[int]:
    """Live processes below `root` in the tree."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            parent = parent_of(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def group_members(pgids: set[int]) -> set[int]:
    """Live processes in any of these process groups."""
    return {int(e) for e in os.listdir("/proc") if e.isdigit() and alive(int(e)) and group_of(int(e)) in pgids}
