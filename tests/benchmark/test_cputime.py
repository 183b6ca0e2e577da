"""CPU accounting of a diagnosis: its process, reaped children, and live children with what they reaped."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmark.cputime import live_children_cpu_s, parse_stat, tree_cpu_s

# A child that lives on, like the engine zygote: on "go" it forks a worker that burns CPU, reaps it,
# says so, and waits for "stop" before it exits.
SERVER = r"""
import os, sys, time
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    start = time.process_time()
    while time.process_time() - start < 0.3:
        pass
    os._exit(0)
os.waitpid(pid, 0)
print("reaped", flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="live children are read from /proc")
def test_a_grandchild_reaped_by_a_live_child_counts_once():
    """The zygote case: the run's CPU counts while the zygote lives on, and not twice once it is reaped."""
    before = tree_cpu_s()
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "reaped"
    assert proc.pid in live_children_cpu_s(os.getpid())
    during = tree_cpu_s() - before
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    proc.wait(timeout=30)
    after = tree_cpu_s() - before
    assert during >= 0.3, "the grandchild's burn, reaped by a child still alive"
    assert during <= after < during + 0.3, "once the child is reaped its CPU moves to RUSAGE_CHILDREN, not twice"


def test_stat_fields_are_counted_after_the_last_parenthesis():
    name = "python3 (x) y)"  # a command name may hold spaces and parentheses
    line = f"4242 ({name}) S 17 4242 4242 0 -1 4194304 10 0 0 0 150 30 7 3 20 0 1 0 99 1000 50\n"
    assert parse_stat(line) == (17, 150 + 30 + 7 + 3)
    assert parse_stat("4242 (short) S 17") is None
    assert parse_stat("no parenthesis at all") is None


def test_only_the_parent_s_own_children_are_read(tmp_path):
    def proc(pid: int, ppid: int, ticks: int) -> None:
        (tmp_path / str(pid)).mkdir()
        fields = f"S {ppid} 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0"
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (w) {fields}\n")

    proc(10, 1, 100)
    proc(11, 10, 250)
    proc(12, 11, 999)  # a grandchild: counted by its parent once reaped, not here
    (tmp_path / "self").mkdir()
    tick = os.sysconf("SC_CLK_TCK")
    assert live_children_cpu_s(10, tmp_path) == {11: 250 / tick}
    assert live_children_cpu_s(10, tmp_path / "missing") == {}
