"""A tensor-parallel tinyserve run (2 ranks, gloo, real processes) in which one rank raises fails within
seconds and names that rank's error (tools/engines/tinyserve_tp.py), instead of leaving the other rank
at a collective until the process group's timeout."""

from __future__ import annotations

import shutil
import time

import pytest

from tools.engines.protocol import RunJob
from tools.engines.runner import EngineRunError, run_engine
from tools.engines.tinyserve import SUBJECT_ROOT
from tools.probe.checkpoints import ensure_checkpoint
from tools.scenario import from_dict

PROMPT_BOUND_S = 240  # failing fast: 15-25 s on a loaded 2-core machine, a cold start up to ~2 min; waiting: > 300 s
MLP = ("tinyserve/models/llama.py", "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n")
JOIN = ("tinyserve/distributed/parallel_state.py", "    global _rank, _world\n")


def tp_job() -> RunJob:
    sc = from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "tinyserve", "dtype": "float32", "options": {"tensor_parallel_size": 2}},
            "workload": {"requests": [{"prompt_ids": [1, 5, 9, 13], "max_tokens": 3}]},
        }
    )
    return RunJob(sc, sc.target, str(ensure_checkpoint(sc.model)), taps=[])


def failing_tree(tmp_path, where: tuple[str, str], rank: int, message: str):
    """The bundled subject with one line added where `where` says: rank `rank` raises `message`."""
    tree = tmp_path / "tree"
    shutil.copytree(SUBJECT_ROOT / "tinyserve", tree / "tinyserve")
    path, anchor = tree / where[0], where[1]
    raise_line = (
        "        from tinyserve.distributed import parallel_state as _ps\n"
        f"        if _ps.get_tp_rank() == {rank}:\n            raise RuntimeError({message!r})\n"
    )
    if where is JOIN:  # before the group exists: the rank is the argument
        raise_line = f"    if rank == {rank}:\n        raise RuntimeError({message!r})\n"
    text = path.read_text()
    assert anchor in text
    path.write_text(text.replace(anchor, anchor + raise_line, 1))
    return tree


def failed_run(tree) -> tuple[EngineRunError, float]:
    started = time.monotonic()
    with pytest.raises(EngineRunError) as err:
        run_engine(tp_job(), tree, timeout=600)
    return err.value, time.monotonic() - started


def test_a_spawned_rank_that_raises_ends_the_run_with_its_error(tmp_path):
    """Regression: rank 1 raising in its forward reached rank 0 as gloo's "Connection reset by peer",
    the rank's own error nowhere in the message."""
    err, wall = failed_run(failing_tree(tmp_path, MLP, 1, "rank 1 mlp blew up"))
    assert err.kind == "crash" and wall < PROMPT_BOUND_S
    assert "tensor-parallel rank 1: RuntimeError: rank 1 mlp blew up" in str(err)


@pytest.mark.slow
def test_rank_0_raising_does_not_leave_rank_1_waiting(tmp_path):
    """Regression: rank 0 raising left rank 1 mid-forward; rank 0's exit-time `stop` broadcast met its
    all-reduce and both waited out the 300 s gloo timeout (measured 6 min 38 s for the probe)."""
    err, wall = failed_run(failing_tree(tmp_path, MLP, 0, "rank 0 mlp blew up"))
    assert wall < PROMPT_BOUND_S, wall
    assert str(err).endswith("RuntimeError: rank 0 mlp blew up")


@pytest.mark.slow
def test_a_rank_failing_before_the_group_forms_does_not_leave_rank_0_in_the_rendezvous(tmp_path):
    """Rank 0 waits in the group's rendezvous, where no collective fails: the watchdog ends the run."""
    err, wall = failed_run(failing_tree(tmp_path, JOIN, 1, "rank 1 could not join"))
    assert wall < PROMPT_BOUND_S, wall
    assert "tensor-parallel rank 1: RuntimeError: rank 1 could not join" in str(err)
