"""Tap recording shared by the adapters of PyTorch-module engines (tinyserve, transformers, refmodel).

An adapter finds the tensors (forward hooks, an emit callback) and says which request and token
position each row belongs to; `HookRecorder` decides what is wanted, injects reference rows
(tensor replacement, tools/engines/injection.py), copies what it keeps (hooks must clone:
fused in-place kernels overwrite buffers later) in the dtype they were computed in, and orders the records.
`hooks_held` removes every hook it was handed, whatever happens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from tools.engines.injection import Injection
from tools.probe.taps import matches, order_key
from tools.probe.trace import TapRecord, narrowed
from tools.scenario import Request

TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass
class RowMap:
    """Which rows of a [batch, seq, F] forward belong to which request and position."""

    requests: list[int]  # batch row -> request index
    positions: list[list[int]]  # batch row -> position of each seq column (-1 = padding)
    _kept: list | None = field(default=None, init=False, repr=False, compare=False)

    def kept(self) -> list[tuple[int, int, slice | list[int] | None, list[int]]]:
        """Per batch row with real columns: (row, request, those columns (None: all), their positions).
        Worked out once per forward, not once per tap: a decode step of a deep model records hundreds of taps."""
        if self._kept is None:
            self._kept = []
            for b, (req, pos) in enumerate(zip(self.requests, self.positions, strict=True)):
                keep = [s for s, p in enumerate(pos) if p >= 0]
                if len(keep) == len(pos):
                    self._kept.append((b, req, None, list(pos)))
                elif keep:
                    contiguous = keep[-1] - keep[0] + 1 == len(keep)  # padding on one side only: a slice
                    columns = slice(keep[0], keep[-1] + 1) if contiguous else keep
                    self._kept.append((b, req, columns, [pos[s] for s in keep]))
        return self._kept

    def flat(self, seq: int) -> tuple[list[int], list[int]]:
        """Rows of x.reshape(B * seq, ...) -> (request, position) lists."""
        return ([r for r in self.requests for _ in range(seq)], [p for pos in self.positions for p in pos[-seq:]])


def stored_dtype(computed: torch.dtype) -> torch.dtype:
    """The dtype a tap computed in `computed` is captured in: that one. Every value is kept exactly and
    the compare upcasts (tools.probe.compare.row_errors works in float64); a 16-bit run's taps upcast to
    float32 at capture were twice the bytes to copy, write and read back for no digit of information."""
    return computed


def derived_dtype(run: torch.dtype) -> torch.dtype:
    """The dtype of rows the recorder derives in float64 from a run computing in `run` (the reference
    sampler's logits and probabilities): float64 for a float64 run, else float32, far below any
    16-bit dtype's noise floor (a bf16 run's vocabulary rows in float64 were most of its trace's bytes)."""
    return torch.float64 if run == torch.float64 else torch.float32


def copy_rows(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    # [N, ...] -> [N, F]: a detached copy, in `dtype` (default: stored_dtype(x.dtype))
    wide = dtype or stored_dtype(x.dtype)
    return x.detach().reshape(x.shape[0], -1).to(wide, copy=True)  # one copy, whether or not the dtype changes


class HookRecorder:
    """Collects canonical tap records (and injects reference rows) for one engine run.

    `step` and `rows` describe the forward now running, for adapters whose tensors are
    [batch, seq, F] (`touch`, `record`); others pass requests and positions to `add` themselves."""

    def __init__(
        self,
        patterns: list[str] | None,
        inject: Injection | None = None,
        out_dtype: torch.dtype | None = None,
        widest: torch.dtype | None = None,
    ):
        """`out_dtype`: the dtype every record is kept in (default: `stored_dtype` of what it was computed
        in); `widest`: float rows wider than it are kept in it (the worker writes them so anyway,
        tools.probe.compare.stored_precision: narrowed at capture, a float64 reference's rows are copied
        once, at half the bytes, instead of copied wide and converted when saved; the same values)."""
        self.patterns, self.inject, self.out_dtype, self.widest = patterns, inject, out_dtype, widest
        self.records: list[TapRecord] = []
        self.step = 0
        self.rows: RowMap | None = None
        self._wanted: dict[str, bool] = {}  # per tap: a decode step asks for each of hundreds of taps
        self._kept_as: dict[torch.dtype, torch.dtype] = {}

    def wants(self, tap: str) -> bool:
        """The caller asked for this tap."""
        wanted = self._wanted.get(tap)
        if wanted is None:
            wanted = self._wanted[tap] = matches(tap, self.patterns)
        return wanted

    def kept_as(self, computed: torch.dtype) -> torch.dtype:
        """The dtype a row computed in `computed` is recorded in (`out_dtype`, `widest`)."""
        kept = self._kept_as.get(computed)
        if kept is None:
            kept = self._kept_as[computed] = narrowed(self.out_dtype or stored_dtype(computed), self.widest)
        return kept

    def touches(self, tap: str) -> bool:
        """A hook must see this tap: it is wanted, or reference rows are injected there."""
        return self.wants(tap) or (self.inject is not None and self.inject.wants(tap))

    def add(self, tap: str, step: int, request: int, positions: list[int], rows: torch.Tensor) -> None:
        """rows [N, ...] computed for `positions` of one request at one step -> a record (copied)."""
        self.records.append(TapRecord(tap, step, request, list(positions), copy_rows(rows, self.kept_as(rows.dtype))))

    def injected(self, tap: str, x: torch.Tensor, requests: list[int], positions: list[int]) -> torch.Tensor:
        """x [N, ...] -> x with the reference's rows at this tap put in (x itself when none apply)."""
        if self.inject is None or not self.inject.wants(tap):
            return x
        return self.inject.apply(tap, x, requests, positions)

    def touch(self, tap: str, x: torch.Tensor) -> torch.Tensor:  # x: [B, S, F] -> x, reference rows injected
        if self.inject is not None and self.inject.wants(tap):
            assert self.rows is not None, "touch() needs the rows of the forward now running"
            requests, positions = self.rows.flat(x.shape[1])
            x = self.injected(tap, x.reshape(-1, *x.shape[2:]), requests, positions).reshape(x.shape)
        if self.wants(tap):
            self.record(tap, x)
        return x

    def record(self, tap: str, x: torch.Tensor) -> None:  # x: [B, S, F], rows per `self.rows`
        assert self.rows is not None, "record() needs the rows of the forward now running"
        # one copy per forward and tap, each request's record a view of its rows: a decode step of a
        # deep model records thousands of times, and the copies per request were most of the capture
        # (each tensor op costs ~10 us of dispatch whatever its size: a decode step of 2 rows is all dispatch)
        if x.shape[0] * x.shape[1] == 0:
            return
        x = x.detach() if x.requires_grad else x
        kept = self.kept_as(x.dtype)
        if kept != x.dtype:
            wide = x.to(kept, memory_format=torch.contiguous_format)
        else:  # a plain clone is half the dispatch of `to(copy=True)`
            wide = x.clone() if x.is_contiguous() else x.contiguous()
        per_row = (wide if wide.dim() == 3 else wide.flatten(2)).unbind(0)  # B views [S, F], one op
        step, records = self.step, self.records
        for b, req, columns, positions in self.rows.kept():  # the records of a forward share its positions lists
            records.append(TapRecord(tap, step, req, positions, per_row[b] if columns is None else per_row[b][columns]))

    def ordered(self) -> list[TapRecord]:
        """Records in (step, execution order, request) order, as a Trace holds them."""
        return sorted(self.records, key=lambda r: (r.step, order_key(r.name), r.request))


def record_teacher_head(
    rec: HookRecorder, r: int, logits: torch.Tensor, seq: list[int], n_prompt: int, req: Request
) -> None:
    """Head taps of one teacher-forced sequence (step 0): its logits, and the reference sampler's
    logits, probabilities and chosen tokens at every sampled position (tools.probe.sampling_ref),
    computed in float64 and kept as `derived_dtype` of the run."""
    from tools.probe.sampling_ref import processed_logits

    positions, kept = list(range(len(seq))), narrowed(derived_dtype(logits.dtype), rec.widest)
    if rec.wants("logits"):
        rec.records.append(TapRecord("logits", 0, r, positions, copy_rows(logits, rec.kept_as(logits.dtype))))
    sampled = list(range(n_prompt - 1, len(seq) - 1))
    wanted = [name for name in ("sampler.logits", "sampler.probs", "sampler.token") if rec.wants(name)]
    if not sampled or not wanted:
        return
    # the sampled rows by a view (consecutive positions); the cut (top-k / top-p / min-p) only for the probabilities
    rows_at = logits[sampled[0] : sampled[-1] + 1].double()
    processed, truncated = processed_logits(rows_at, seq, n_prompt, req.sampling, "sampler.probs" in wanted)
    rows = {  # each computed only when wanted: a vocabulary-wide softmax in float64 is not free
        "sampler.logits": lambda: processed.to(kept, copy=True),  # the record's own rows, not a view of the logits
        "sampler.probs": lambda: torch.softmax(truncated, dim=-1).to(kept),
        "sampler.token": lambda: torch.tensor([[float(seq[p + 1])] for p in sampled], dtype=torch.float64),
    }
    for name in wanted:
        rec.records.append(TapRecord(name, 0, r, sampled, rows[name]()))


def chosen_logprobs(logits: torch.Tensor, seq: list[int], n_prompt: int) -> list[float]:
    lp = torch.log_softmax(logits.double(), dim=-1)
    return [float(lp[p, seq[p + 1]]) for p in range(n_prompt - 1, len(seq) - 1)]


class Undo:
    """A restore function that `hooks_held` treats as a hook handle."""

    def __init__(self, restore: Callable[[], object]):
        self.remove = restore


@contextmanager
def hooks_held() -> Iterator[list]:
    """Yields a list for hook handles (anything with `.remove()`); all are removed on exit, last first."""
    held: list = []
    try:
        yield held
    finally:
        for handle in reversed(held):
            handle.remove()
