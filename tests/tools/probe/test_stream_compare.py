"""The streaming compare (issue 14): traces stored as blocks (one tensor per tap and request) and read
lazily, one tap at a time, give exactly the result of comparing the engines' records."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.faults import MIN_P_HALVED, buggy_tinyserve
from tools.probe import trace as trace_io
from tools.probe.align import align, index, iter_aligned
from tools.probe.prober import Prober, compare_traces
from tools.probe.trace import RequestOutput, TapRecord, Trace
from tools.scenario import from_dict

TENSORS = [
    torch.randn(3, 5, dtype=torch.float64),
    torch.randn(2, 4).to(torch.bfloat16),
    torch.randn(1, 7, dtype=torch.float16),
    torch.tensor([[4], [9]], dtype=torch.int64),
    torch.tensor([[True, False, True]]),
    torch.zeros(0, 6),
]


def mixed_records() -> list[TapRecord]:
    """Every dtype and shape, a tap over several steps with a recomputed position, a record with no rows,
    and records of one tap and request that cannot share a block (another rank, another dtype)."""
    records = [TapRecord(f"t{i}", i, 0, list(range(len(x))), x) for i, x in enumerate(TENSORS)]
    for step, positions in enumerate([[0, 1, 2], [3], [2, 4], [5]]):
        for request in (0, 1):
            records.append(TapRecord("layers.0.out", 10 + step, request, positions, torch.randn(len(positions), 3)))
    records.append(TapRecord("layers.0.out", 20, 0, [4], torch.randn(1, 3), rank=1))
    records.append(TapRecord("layers.0.out", 21, 0, [1], torch.randn(1, 3, dtype=torch.float64)))
    records.append(TapRecord("layers.0.out", 22, 0, [6], torch.randn(1, 3)))
    return records


def as_fields(records: list[TapRecord]) -> list[tuple]:
    return [(r.name, r.step, r.request, r.positions, r.rank, r.tensor.dtype, r.tensor.tolist()) for r in records]


@pytest.mark.parametrize("lazy", [False, True])
def test_records_come_back_from_blocks_exactly(tmp_path, lazy):
    records = mixed_records()
    trace_io.save(Trace("e", "bfloat16", [RequestOutput([1], [2])], records, {"k": 1}), tmp_path)
    back = trace_io.load(tmp_path, lazy=lazy)
    assert len(back.blocks()) == len(TENSORS) + 2 + 3  # a block per tap and request, and per rank or dtype change
    assert as_fields(back.records) == as_fields(records)
    assert back.taps() == list(dict.fromkeys(r.name for r in records)) and back.meta == {"k": 1}
    if lazy:  # read anew each time: nothing is kept
        assert back.blocks()[0].tensor is not back.blocks()[0].tensor


def test_a_read_tensor_is_the_reader_s_own(tmp_path):
    """Tensors are read over a private mapping of the file (a plain read where the bytes are not aligned
    for the dtype): writable, and what is written to them reaches neither the file nor the next read;
    a file shorter than its header says is refused, whichever way a tensor is read."""
    records = mixed_records()
    trace_io.save(Trace("e", "float32", [], records), tmp_path)
    blocks = trace_io.load(tmp_path, lazy=True).blocks()
    for block in blocks:
        x = block.tensor
        if x.numel() and x.dtype.is_floating_point:
            x.fill_(7.0)
            assert not torch.equal(block.tensor, x)
    assert as_fields(trace_io.load(tmp_path).records) == as_fields(records)
    path = tmp_path / "taps.safetensors"
    path.write_bytes(path.read_bytes()[:-8])
    cut = trace_io.load(tmp_path, lazy=True).blocks()
    with pytest.raises(ValueError, match="past the file"):
        [b.table for b in cut]


def row_by_row(records: list[TapRecord]) -> dict:
    """The regrouping the compare did per record before blocks (the reference the block version must equal)."""
    slots: dict[tuple, dict[int, tuple]] = {}
    for rec in records:
        for i, pos in enumerate(rec.positions):
            slots.setdefault((rec.name, rec.request), {})[pos] = (rec.step, rec.tensor[i])
    return {
        key: (sorted(slot), [slot[p][0] for p in sorted(slot)], torch.stack([slot[p][1] for p in sorted(slot)]))
        for key, slot in slots.items()
    }


def test_rows_per_tap_are_the_record_by_record_ones(tmp_path):
    records = [r for r in mixed_records() if r.positions]
    trace_io.save(Trace("e", "float32", [RequestOutput([1], [2])], records), tmp_path)
    expected = row_by_row(records)
    for trace in (Trace("e", "float32", [], records), trace_io.load(tmp_path), trace_io.load(tmp_path, lazy=True)):
        rows = index(trace)
        assert rows.keys() == expected.keys()
        for key, (positions, steps, tensor) in expected.items():
            assert (rows[key].positions, rows[key].steps) == (positions, steps), key
            assert rows[key].tensor.dtype == tensor.dtype and torch.equal(rows[key].tensor, tensor), key


def test_a_trace_file_is_plain_safetensors(tmp_path):
    records = mixed_records()
    trace_io.save(Trace("e", "float32", [], records), tmp_path)
    blocks = trace_io.load(tmp_path).blocks()
    with safe_open(str(tmp_path / "taps.safetensors"), "pt") as f:
        assert len(list(f.keys())) == 3 * len(blocks)
        for i, block in enumerate(blocks):
            assert torch.equal(f.get_tensor(f"b{i}"), block.tensor)
            assert torch.equal(f.get_tensor(f"b{i}.positions"), block.positions)
            assert torch.equal(f.get_tensor(f"b{i}.records"), block.table)


def save_format_1(trace: Trace, folder) -> None:
    """A trace as diffdx wrote it before blocks: a tensor per record, each record's fields in trace.json."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"r{i}": r.tensor.contiguous() for i, r in enumerate(trace.records)}, str(folder / "taps.safetensors"))
    doc = {
        "engine": trace.engine,
        "dtype": trace.dtype,
        "meta": trace.meta,
        "outputs": [vars(o) for o in trace.outputs],
        "records": [
            {"name": r.name, "step": r.step, "request": r.request, "positions": r.positions, "rank": r.rank}
            for r in trace.records
        ],
    }
    (folder / "trace.json").write_text(json.dumps(doc))


def test_format_1_traces_are_still_read(tmp_path):
    records = mixed_records()
    save_format_1(Trace("e", "float32", [RequestOutput([1], [2])], records), tmp_path)
    for lazy in (False, True):
        assert as_fields(trace_io.load(tmp_path, lazy=lazy).records) == as_fields(records)


def test_an_unknown_format_is_refused(tmp_path):
    trace_io.save(Trace("e", "float32", [], []), tmp_path)
    doc = json.loads((tmp_path / "trace.json").read_text())
    (tmp_path / "trace.json").write_text(json.dumps({**doc, "format": 99}))
    with pytest.raises(ValueError, match="format 99"):
        trace_io.load(tmp_path)


def scenario():
    """A batch on the bundled tinyserve (chunked prefill: rows of one tap over several steps), one
    greedy and two sampled requests, so layer, logit, sampler and token comparisons all run."""
    sampled = {"temperature": 0.8, "min_p": 0.6, "ignore_eos": True}
    prompts = [[5, 17, 42, 99, 260, 301, 7, 8, 9, 10, 11], list(range(40, 58)), list(range(100, 121))]
    samplings = [{**sampled, "seed": 11}, {**sampled, "seed": 12}, {"ignore_eos": True}]
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {
                "engine": "tinyserve",
                "dtype": "bfloat16",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 16},
            },
            "workload": {
                "requests": [
                    {"prompt_ids": p, "max_tokens": 8, "sampling": s} for p, s in zip(prompts, samplings, strict=True)
                ]
            },
        }
    )


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """One real probe of a sampler fault: the three traces as the engines returned them, and saved."""
    tree = buggy_tinyserve(tmp_path_factory.mktemp("minp"), *MIN_P_HALVED)
    sc, prober = scenario(), Prober()
    target = prober.run_target(sc, tree)
    teacher = target.sequences()
    high = prober.run_reference(sc, sc.reference.dtype, teacher, None)
    low = prober.run_reference(sc, sc.target.dtype, teacher, None)
    folder = tmp_path_factory.mktemp("traces")
    for name, trace in (("target", target), ("high", high), ("low", low)):
        trace_io.save(trace, folder / name)
    return sc, (target, low, high), folder


def test_streaming_compare_equals_the_eager_compare_exactly(probed, tmp_path):
    sc, (target, low, high), folder = probed
    # what the engines recorded, one record per tap, request and step, as the compare got it before blocks
    as_recorded = [Trace(t.engine, t.dtype, t.outputs, t.records, t.meta) for t in (target, low, high)]
    for trace in as_recorded:  # the rows each tap is compared on are the ones regrouped record by record
        rows, expected = index(trace), row_by_row(trace.records)
        assert rows.keys() == expected.keys()
        for key, (positions, steps, tensor) in expected.items():
            assert (rows[key].positions, rows[key].steps) == (positions, steps) and torch.equal(
                rows[key].tensor, tensor
            )
    eager = compare_traces(sc, *as_recorded)
    assert eager.first is not None and eager.first.tap == "sampler.probs", eager.summary  # a real divergence
    for name, trace in zip(("target", "low", "high"), as_recorded, strict=True):
        save_format_1(trace, tmp_path / name)
    others = [
        compare_traces(sc, target, low, high),  # the runner's traces, read lazily from its run folders
        compare_traces(sc, *(trace_io.load(folder / n) for n in ("target", "low", "high"))),
        compare_traces(sc, *(trace_io.load(folder / n, lazy=True) for n in ("target", "low", "high"))),
        compare_traces(sc, *(trace_io.load(tmp_path / n) for n in ("target", "low", "high"))),  # format 1
    ]
    for other in others:
        assert other.to_dict() == eager.to_dict()
        assert other.first == eager.first
        assert other.stats == eager.stats and len(eager.stats) > 0
    lazy = [trace_io.load(folder / n, lazy=True) for n in ("target", "low", "high")]
    rows, expected = list(iter_aligned(*lazy)), align(*as_recorded)  # and the rows compared, row by row
    assert [(a.tap, a.request, a.positions, a.steps) for a in rows] == [
        (a.tap, a.request, a.positions, a.steps) for a in expected
    ]
    for a, b in zip(rows, expected, strict=True):
        assert all(torch.equal(getattr(a, x), getattr(b, x)) for x in ("t", "r", "y")), (a.tap, a.request)


def test_streaming_compare_covers_every_layer_tap(probed):
    sc, (target, low, high), folder = probed
    lazy = compare_traces(sc, *(trace_io.load(folder / n, lazy=True) for n in ("target", "low", "high")))
    compared = {s.tap for s in lazy.stats}
    assert {t for t in target.taps() if t.startswith("layers.")} <= compared
    assert {"layers.0", "layers.1", "logits"} <= {k for k, _ in lazy.layers}


def test_a_trace_file_rewritten_by_safetensors_is_read(tmp_path):
    """Another writer orders the tensors its own way (safetensors sorts them: b10 before b2) and adds metadata."""
    records = mixed_records()
    trace_io.save(Trace("e", "float32", [RequestOutput([1], [2])], records), tmp_path)
    with safe_open(str(tmp_path / "taps.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(tmp_path / "taps.safetensors"), metadata={"by": "safetensors"})
    assert as_fields(trace_io.load(tmp_path, lazy=True).records) == as_fields(records)


@pytest.mark.parametrize("text", ['{"a": [1, {"b": 2}], "c": "}"}', ' \n{ "x" :1 ,"y":{ } } ', "{}", "{ }"])
def test_a_json_object_is_read_entry_by_entry_as_a_whole(text):
    assert dict(trace_io.json_object_items(text)) == json.loads(text)


def test_a_malformed_json_object_is_refused():
    for text in ('{"a": 1 "b": 2}', '["a"]', '{"a" 1}'):
        with pytest.raises(ValueError):
            dict(trace_io.json_object_items(text))
