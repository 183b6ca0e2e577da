"""Blocks built at capture (issue 14, probe cost): a recorder's rows go straight into one block per tap and
request, numbered once the run is over, and written by the worker's threads side by side. The blocks, the
file and every TapStat are those of the record-per-forward path they replace (records grouped at save)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tools.engines.recorder import HookRecorder, RowMap
from tools.probe import trace as trace_io
from tools.probe.prober import Prober, compare_traces
from tools.probe.taps import order_key
from tools.probe.trace import RequestOutput, TapRecord, Trace, group_records
from tools.scenario import from_dict

# in execution order within a forward, as a model's hooks see them
TAPS = ("embed", "layers.0.attn.q_rot", "layers.0.out", "layers.1.out")


def recorded(forwards: list[tuple[int, RowMap, dict[str, torch.Tensor]]], loose: list[TapRecord]):
    """The same forwards through a recorder (new path) and as the records the old `record` made, one per
    forward, tap and request (the rows at its real columns), with the adapter's own records (`loose`)."""
    rec = HookRecorder(None)
    old: list[TapRecord] = []
    for step, rows, tensors in forwards:
        rec.step, rec.rows = step, rows
        for tap, x in tensors.items():
            rec.record(tap, x)
            for b, (req, pos) in enumerate(zip(rows.requests, rows.positions, strict=True)):
                keep = [s for s, p in enumerate(pos) if p >= 0]
                if keep:
                    row = x[b].reshape(x.shape[1], -1)[keep].clone()
                    old.append(TapRecord(tap, step, req, [pos[s] for s in keep], row))
    rec.records.extend(loose)
    old += loose
    return rec, sorted(old, key=lambda r: (r.step, order_key(r.name), r.request))


def forwards() -> list[tuple[int, RowMap, dict[str, torch.Tensor]]]:
    """A left-padded prefill of two requests, decode steps, a [B, S, H, D] tap seen through a transposed view,
    and a tap whose feature width changes at one step (a block of its own)."""
    out = []
    prefill = RowMap([0, 1], [[0, 1, 2, 3], [-1, -1, 0, 1]])
    decode = [RowMap([0, 1], [[4 + k], [2 + k]]) for k in range(3)]
    for step, rows in enumerate([prefill, *decode]):
        seq = len(rows.positions[0])
        heads = torch.randn(2, 3, seq, 4, dtype=torch.bfloat16).transpose(1, 2)  # [B, S, H, D], not contiguous
        out.append(
            (
                step,
                rows,
                {
                    "embed": torch.randn(2, seq, 6),
                    "layers.0.attn.q_rot": heads,
                    "layers.0.out": torch.randn(2, seq, 6, dtype=torch.float64),
                    "layers.1.out": torch.randn(2, seq, 5 if step == 2 else 6),
                },
            )
        )
    return out


def head_records() -> list[TapRecord]:
    return [
        TapRecord("logits", k, r, [3 + k if r == 0 else 1 + k], torch.randn(1, 9)) for k in range(4) for r in (0, 1)
    ]


def same_blocks(got: list, expected: list) -> None:
    assert [(b.name, b.request, b.rank) for b in got] == [(b.name, b.request, b.rank) for b in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.tensor.dtype == b.tensor.dtype and torch.equal(a.tensor, b.tensor), a.name
        assert torch.equal(a.positions, b.positions) and torch.equal(a.table, b.table), a.name
        assert a.layouts() == b.layouts()


def test_blocks_built_at_capture_are_the_grouped_records():
    rec, old = recorded(forwards(), head_records())
    blocks = rec.blocks()
    same_blocks(blocks, group_records(old))
    # a block per tap and request (the logits too); the width changed for one step and back: two more each
    assert len(blocks) == 2 * len(TAPS) + 2 + 2 * 2
    # read back as records: the old records, in the trace's order
    back = Trace("e", "float32", [], blocks=blocks).records
    assert [(r.name, r.step, r.request, r.positions) for r in back] == [
        (r.name, r.step, r.request, r.positions) for r in old
    ]
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(back, old, strict=True))
    assert [(r.name, r.step, r.request) for r in rec.ordered()] == [(r.name, r.step, r.request) for r in old]


def test_blocks_whose_steps_go_back_are_grouped_from_the_records():
    """Records of one tap and request recorded out of step order: numbered by sorting, as before."""
    steps = forwards()
    rec, old = recorded([steps[2], steps[0], steps[1]], [])
    same_blocks(rec.blocks(), group_records(old))


def test_the_file_is_the_one_the_records_gave_whatever_the_threads(tmp_path, monkeypatch):
    """Written by several threads, each its share of the blocks at its offsets: the bytes of one thread's
    file, and of the file the records gave."""
    rec, old = recorded(forwards(), head_records())
    trace_io.save(Trace("e", "float32", [RequestOutput([1], [2])], old), tmp_path / "records")
    threads = torch.get_num_threads()
    monkeypatch.setattr(trace_io, "WRITE_SHARE_BYTES", 64)
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            blocks = rec.blocks()
            firsts = [1000 * i for i in range(len(blocks))]  # where each block's bytes start
            assert len(trace_io.write_shares(blocks, firsts, 1000 * len(blocks))) == count
            trace_io.save(Trace("e", "float32", [RequestOutput([1], [2])], blocks=blocks), tmp_path / str(count))
    finally:
        torch.set_num_threads(threads)
    files = [(tmp_path / name / "taps.safetensors").read_bytes() for name in ("records", "1", "3")]
    assert files[0] == files[1] == files[2]
    same_blocks(trace_io.load(tmp_path / "3").blocks(), group_records(old))


def kept_run_dir(trace: Trace) -> Path:
    return Path(trace.meta["run_dir"]) / "trace"


@pytest.mark.slow
def test_a_probe_s_traces_and_stats_are_those_of_the_records(tmp_path, monkeypatch):
    """Real transformers workers (a batch, a sampled request, teacher-forced references): each trace file as
    the records grouped at save wrote it, and every TapStat of the probe equal to the old path's."""
    monkeypatch.setenv("DIFFDX_KEEP_TEMP", "1")  # the workers' own files, read here
    requests = [
        {"prompt_ids": list(range(3, 20)), "max_tokens": 6, "sampling": {"ignore_eos": True}},
        {"prompt_ids": [7, 8, 9, 10, 11], "max_tokens": 6, "sampling": {"ignore_eos": True}},
        {"prompt_ids": [5, 6, 7], "max_tokens": 4, "sampling": {"ignore_eos": True, "temperature": 0.8, "seed": 3}},
    ]
    sc = from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "transformers", "dtype": "bfloat16", "options": {"attn_implementation": "sdpa"}},
            "workload": {"requests": requests},
        }
    )
    traces = Prober().run_engines(sc)
    try:
        old = []
        for i, trace in enumerate(traces):
            folder = tmp_path / str(i)
            records = trace.records  # from the worker's blocks, in their numbers' order
            keys = [(r.step, order_key(r.name), r.request) for r in records]
            assert keys == sorted(keys)
            trace_io.save(Trace(trace.engine, trace.dtype, trace.outputs, records, trace.meta), folder)
            assert (folder / "taps.safetensors").read_bytes() == (kept_run_dir(trace) / "taps.safetensors").read_bytes()
            old.append(trace_io.load(folder, lazy=True))
        new, before = compare_traces(sc, *traces), compare_traces(sc, *old)
        assert new.to_dict() == before.to_dict()
        assert [tuple(getattr(s, f) for f in s.__slots__) for s in new.stats] == [
            tuple(getattr(s, f) for f in s.__slots__) for s in before.stats
        ]
    finally:
        for trace in {id(t): t for t in traces}.values():
            shutil.rmtree(trace.meta["run_dir"], ignore_errors=True)
