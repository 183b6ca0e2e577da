"""Function taps: the inputs and outputs of chosen Python functions of the tree under test, recorded
in the worker while the engine runs (issue 13 item 2), so each can be judged on its own inputs.

A `sys.setprofile` hook sees every Python call and return; functions under `root` that `wanted`
accepts (by qualname and parameter names) have their arguments copied at the call (a fused kernel
may overwrite them in place) and their return value copied at the return. Tensors are cloned,
plain data kept, a `config` kept as its dict, a module as the names of its submodules with a float
weight matrix (at the call and again at the return), other objects (engine state) dropped. A tensor
argument the function writes in place (a cache it scatters into) is copied again at the return, so a
contract can see what it wrote: its version counter tells whether it was written, and only then is it
copied (an inference-mode tensor has no counter: it is compared with its copy from the call instead).
At most `max_calls` calls are kept per function; each call also names the nearest recorded function it ran inside (`parent`), so a
caller that is wrong only because its callee is can be told apart.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from tools.engines.funccov import qualname

DROPPED = "<object>"


@dataclass
class FunctionCall:
    function: str  # "relpath:qualname"
    params: tuple[str, ...]
    inputs: dict  # parameter name -> copied value (DROPPED when not plain data)
    output: object = None
    parent: str | None = None  # the nearest recorded function this call ran inside
    order: int = 0  # position among all recorded calls (execution order)
    callees: set = field(default_factory=set)  # wanted functions it called (recorded or over their limit)
    writes: dict = field(default_factory=dict)  # tensor parameter it wrote in place -> its copy at the return
    attributes: dict = field(default_factory=dict)  # an object it returned: its plain-data attributes


def snapshot(value: object, depth: int = 0) -> object:
    """A copy that later in-place writes cannot change: tensors cloned, plain data kept."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth < 2 and isinstance(value, (tuple, list)):
        return type(value)(snapshot(v, depth + 1) for v in value)
    if depth < 2 and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: snapshot(v, depth + 1) for k, v in value.items()}
    return DROPPED


@dataclass(frozen=True)
class ModuleWeights:
    """A module argument, kept as the names of its submodules (dotted, from it) that hold a
    floating-point matrix `weight`: what a function that converts a model's layers changed."""

    float_matrices: frozenset[str]


def module_weights(value: object) -> ModuleWeights | None:
    import torch

    if not isinstance(value, torch.nn.Module):
        return None
    names = set()
    for name, module in value.named_modules():
        w = module.__dict__.get("_parameters", {}).get("weight")
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.is_floating_point():
            names.add(name)
    return ModuleWeights(frozenset(names))


def snapshot_param(name: str, value: object) -> object:
    """A parameter's copy; a `config` object that can write itself out as a dict (an HF-format
    config, DESIGN §1) is kept as that dict, so a contract can read the settings it was given; a
    small dataclass of tensors (a batch's sampling state: per-row penalties, seen-token masks) is
    kept as the dict of its plain-data fields, so a contract can read the state a step was given."""
    to_dict = getattr(value, "to_dict", None)
    if name == "config" and callable(to_dict) and not isinstance(value, type):
        try:
            return snapshot(to_dict())
        except Exception:  # a config that cannot write itself out is an object like any other
            return DROPPED
    if small_dataclass(value):
        return attributes(value)
    weights = module_weights(value)
    return weights if weights is not None else snapshot(value)


MAX_STATE_ELEMENTS = 1 << 22  # a dataclass argument holding more tensor data (a cache) is not copied


def small_dataclass(value: object) -> bool:
    import dataclasses

    import torch

    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return False
    fields = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    return sum(t.numel() for t in fields if isinstance(t, torch.Tensor)) <= MAX_STATE_ELEMENTS


def attributes(value: object) -> dict:
    """The public plain-data attributes of a returned object (a config object a reader built from a
    dict), so a contract can compare them with what it was given; {} for plain data and tensors."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
    else:
        names = list(getattr(value, "__dict__", {}))
    kept = {n: snapshot(getattr(value, n, None), 1) for n in names if not n.startswith("_")}
    return {n: v for n, v in kept.items() if v is not DROPPED}


def version(t: Any) -> int | None:
    """A tensor's in-place write counter; None for an inference-mode tensor, which keeps none."""
    try:
        return t._version
    except RuntimeError:
        return None


def watched(inputs: dict, local: dict) -> list[tuple[str, Any, int | None]]:
    """(name, live tensor, its write counter) for each tensor argument: what `written` looks at."""
    import torch

    return [(p, local[p], version(local[p])) for p in inputs if isinstance(local.get(p), torch.Tensor)]


def written(call: FunctionCall, watch: list[tuple[str, Any, int | None]]) -> dict:
    """The tensor arguments the call wrote in place -> their copies now (at its return)."""
    import torch

    out = {}
    for name, t, before in watch:
        changed = version(t) != before if before is not None else not torch.equal(t, call.inputs[name])
        if changed:
            out[name] = t.detach().clone()
    return out


def parameters(code: CodeType) -> tuple[str, ...]:
    n = code.co_argcount + code.co_kwonlyargcount
    return tuple(p for p in code.co_varnames[:n] if p not in ("self", "cls"))


@contextmanager
def function_taps(
    root: str | None, wanted: Callable[[str, tuple[str, ...]], bool], max_calls: int = 4
) -> Iterator[list[FunctionCall]]:
    """Yields a list that holds a FunctionCall per recorded call once the block is left."""
    calls: list[FunctionCall] = []
    if not root:
        yield calls
        return
    prefix = str(Path(root).resolve()) + os.sep
    chosen: dict[CodeType, str | None] = {}  # code -> "relpath:qualname" if recorded, else None
    counts: dict[str, int] = {}
    open_calls: dict[int, tuple[FunctionCall, list]] = {}  # id(frame) -> its call and watched tensors
    stack: list[FunctionCall] = []

    def pick(code: CodeType) -> str | None:
        if code not in chosen:
            ok = code.co_filename.startswith(prefix) and wanted(qualname(code), parameters(code))
            chosen[code] = f"{code.co_filename[len(prefix) :]}:{qualname(code)}" if ok else None
        return chosen[code]

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            key = pick(frame.f_code)
            if key is None:
                return
            if stack:
                stack[-1].callees.add(key)
            if counts.get(key, 0) >= max_calls:
                return
            counts[key] = counts.get(key, 0) + 1
            params = parameters(frame.f_code)
            local = frame.f_locals
            call = FunctionCall(
                key,
                params,
                {p: snapshot_param(p, local.get(p)) for p in params},
                parent=stack[-1].function if stack else None,
                order=len(calls),
            )
            calls.append(call)
            open_calls[id(frame)] = (call, watched(call.inputs, local))
            stack.append(call)
        elif event == "return" and id(frame) in open_calls:
            call, watch = open_calls.pop(id(frame))
            call.output = snapshot(arg)
            call.attributes = attributes(arg) if call.output is DROPPED else {}
            call.writes = written(call, watch)
            for p, v in call.inputs.items():  # a module argument: its weights again, as the call left them
                if isinstance(v, ModuleWeights) and (now := module_weights(frame.f_locals.get(p))) is not None:
                    call.writes[p] = now
            stack.remove(call)

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)
