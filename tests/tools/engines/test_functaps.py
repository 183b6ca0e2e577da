"""Function taps (tools/engines/functaps.py): real functions in a real module under a tmp root."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from tools.engines.functaps import DROPPED, function_taps

SOURCE = """
import torch


def scale_(x, factor):
    x.mul_(factor)          # in place, like a fused kernel
    return x


def outer_norm(x, weight, eps):
    return scale_(x, 2.0) * weight


def untouched(y):
    return y + 1


def identity(y):
    return y
"""


def load(tmp_path: Path):
    path = tmp_path / "pkg" / "ops.py"
    path.parent.mkdir()
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("functaps_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop("functaps_ops", None)
    return module


def test_inputs_are_copied_before_an_in_place_write(tmp_path: Path):
    ops = load(tmp_path)
    x = torch.ones(2, 3)
    with function_taps(str(tmp_path), lambda name, params: "scale" in name) as calls:
        ops.scale_(x, 3.0)
    (call,) = calls
    assert call.function == "pkg/ops.py:scale_" and call.params == ("x", "factor")
    assert torch.equal(call.inputs["x"], torch.ones(2, 3)) and call.inputs["factor"] == 3.0
    assert torch.equal(call.output, torch.full((2, 3), 3.0))


def test_parents_callees_and_the_call_limit(tmp_path: Path):
    ops = load(tmp_path)
    wanted = lambda name, params: name in ("outer_norm", "scale_")  # noqa: E731
    with function_taps(str(tmp_path), wanted, max_calls=2) as calls:
        for _ in range(3):
            ops.outer_norm(torch.ones(4), torch.ones(4), 1e-6)
        ops.untouched(torch.ones(1))
    names = [c.function.split(":")[1] for c in calls]
    assert names == ["outer_norm", "scale_", "outer_norm", "scale_"]  # two calls each, in execution order
    assert calls[1].parent == "pkg/ops.py:outer_norm" and calls[0].parent is None
    assert calls[0].callees == {"pkg/ops.py:scale_"}
    assert [c.order for c in calls] == [0, 1, 2, 3]


def test_objects_that_are_not_plain_data_are_dropped_and_nothing_outside_root_is_seen(tmp_path: Path):
    ops = load(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    with function_taps(str(other), lambda name, params: True) as calls:
        ops.untouched(torch.ones(1))
    assert calls == []
    with function_taps(str(tmp_path), lambda name, params: True) as calls:
        ops.identity(object())
    assert calls[0].inputs["y"] == DROPPED and calls[0].output == DROPPED


def test_a_small_dataclass_argument_is_kept_as_its_fields_and_a_large_one_is_dropped():
    """A batch's sampling state (a dataclass of per-row settings and [S, V] tables) reaches the penalty
    contract as its fields; one holding more tensor data than a state does (a cache) is not copied."""
    import dataclasses

    import torch

    from tools.engines.functaps import DROPPED, MAX_STATE_ELEMENTS, snapshot_param

    @dataclasses.dataclass
    class State:
        penalty: torch.Tensor
        seen: torch.Tensor
        generators: list

    small = State(torch.ones(2), torch.zeros(2, 8, dtype=torch.bool), [object()])
    kept = snapshot_param("st", small)
    assert set(kept) == {"penalty", "seen", "generators"} and torch.equal(kept["seen"], small.seen)
    small.seen[0, 0] = True  # a copy: later writes do not reach it
    assert not bool(kept["seen"].any())
    assert snapshot_param("cache", State(torch.ones(MAX_STATE_ELEMENTS + 1), torch.zeros(1), [])) == DROPPED
