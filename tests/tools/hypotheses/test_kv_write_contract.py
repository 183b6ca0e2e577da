"""The KV-cache write contract: a cache writer is judged by what it wrote, read back at its own slots.

Writers are real functions in a real module under a tmp root, recorded by the function taps (which
copy a tensor argument written in place at the return); the end-to-end tests diagnose real tinyserve
trees in tmp git repos with a writer fault committed among other changes.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.faults_tinyserve import faulty_tree
from tools.engines.functaps import function_taps
from tools.hypotheses.contracts import contract_for, judge

WRITERS = """
import torch


def write_token_major(key, value, key_cache, value_cache, slot_mapping):
    # cache [NB, BS, KVH, D]: the layout vLLM uses
    kvh, d = key.shape[1], key.shape[2]
    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)


def write_head_major(key, value, key_cache, value_cache, slot_mapping):
    # cache [NB, KVH, BS, D]
    bs = key_cache.shape[2]
    blocks, offsets = slot_mapping // bs, slot_mapping % bs
    key_cache[blocks, :, offsets] = key
    value_cache[blocks, :, offsets] = value


def write_heads_swapped(key, value, key_cache, value_cache, slot_mapping):
    kvh, d = key.shape[1], key.shape[2]
    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key.flip(1))
    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)


def write_slot_offset(key, value, key_cache, value_cache, slot_mapping):
    kvh, d = key.shape[1], key.shape[2]
    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping + 1, key)
    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping + 1, value)


def write_key_only(key, value, key_cache, value_cache, slot_mapping):
    kvh, d = key.shape[1], key.shape[2]
    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)


def write_padding_skipped(key, value, key_cache, value_cache, slot_mapping):
    # a negative slot is a padding row: nothing is written for it
    keep = slot_mapping >= 0
    kvh, d = key.shape[1], key.shape[2]
    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping[keep], key[keep])
    value_cache.view(-1, kvh, d).index_copy_(0, slot_mapping[keep], value[keep])
"""


def load(tmp_path: Path):
    path = tmp_path / "pkg" / "writers.py"
    path.parent.mkdir()
    path.write_text(WRITERS)
    spec = importlib.util.spec_from_file_location("kv_writers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop("kv_writers", None)
    return module


def judged(tmp_path: Path, writer: str, head_major=False, dtype=torch.float32, kvh=2, bs=4, slots=None) -> dict:
    """One call of `writer` on a cache already holding other tokens -> its verdict."""
    torch.manual_seed(0)
    shape = (6, kvh, bs, 8) if head_major else (6, bs, kvh, 8)
    key_cache, value_cache = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    slots = torch.tensor([5, 6, 7, 12, 13]) if slots is None else slots
    key, value = torch.randn(slots.numel(), kvh, 8).to(dtype), torch.randn(slots.numel(), kvh, 8).to(dtype)
    fn = getattr(load(tmp_path), writer)
    with function_taps(str(tmp_path), contract_for) as calls:
        fn(key, value, key_cache, value_cache, slots)
    (verdict,) = judge(calls, {})
    assert verdict["contract"] == "kv-cache-write" and verdict["calls"] == 1
    return verdict


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("writer, head_major", [("write_token_major", False), ("write_head_major", True)])
def test_a_correct_writer_keeps_the_contract_in_either_layout(tmp_path, writer, head_major, dtype):
    verdict = judged(tmp_path, writer, head_major, dtype)
    assert verdict["violations"] == 0 and verdict["max_violation"] == 0.0


def test_padding_slots_are_not_read_back(tmp_path):
    verdict = judged(tmp_path, "write_padding_skipped", slots=torch.tensor([5, -1, 7, -1, 13]))
    assert verdict["violations"] == 0


@pytest.mark.parametrize("writer", ["write_heads_swapped", "write_slot_offset", "write_key_only"])
def test_a_writer_that_puts_rows_in_the_wrong_place_breaks_it(tmp_path, writer):
    verdict = judged(tmp_path, writer)
    assert verdict["violations"] == 1 and verdict["max_violation"] > 0.5


def test_a_token_major_scatter_into_a_head_major_cache_breaks_it(tmp_path):
    """The shape says head-major (axis 1 holds the KV heads), so the rows must read back from there."""
    verdict = judged(tmp_path, "write_token_major", head_major=True)
    assert verdict["violations"] == 1


def test_where_the_shape_allows_both_layouts_either_reading_keeps_it(tmp_path):
    """block_size == KVH: a token-major write into a cache whose readers may be head-major is not
    judged wrong (a miss, never a false alarm)."""
    assert judged(tmp_path, "write_token_major", head_major=True, kvh=4, bs=4)["violations"] == 0


def test_the_taps_copy_a_written_argument_at_the_return_and_leave_the_rest(tmp_path):
    fn = load(tmp_path).write_token_major
    cache = torch.zeros(2, 4, 2, 8)
    with torch.inference_mode():  # inference tensors keep no version counter: compared with the call's copy
        other, key = torch.zeros(2, 4, 2, 8), torch.ones(1, 2, 8)
        with function_taps(str(tmp_path), contract_for) as calls:
            fn(key, key, cache, other, torch.tensor([3]))
        (call,) = calls
        assert set(call.writes) == {"key_cache", "value_cache"}
        assert torch.equal(call.writes["key_cache"], cache) and call.inputs["key_cache"].abs().sum() == 0
        with function_taps(str(tmp_path), contract_for) as calls:
            fn(key, key, cache, other, torch.tensor([3]))  # the same rows again
    # the version counter says the cache was written, though to equal values; the compared one was not changed
    assert "key_cache" in calls[0].writes and "value_cache" not in calls[0].writes


# ---------------------------------------------------------------- a culprit commit that breaks the writer

ATTENTION_OPS = "tinyserve/ops/attention.py"
WRITE = "    key_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)\n"
FAULTS = {
    "heads-transposed": (WRITE, WRITE.replace("key)", "key.flip(1))")),
    "slot-offset": (
        WRITE + WRITE.replace("key", "value"),
        (WRITE + WRITE.replace("key", "value")).replace("slot_mapping,", "slot_mapping + 1,"),
    ),
}
# The same commit also edits a reader (its docstring), so the culprit touches several functions and the
# divergence shows where the cache is read.
READER_DOC = '    """Tokens [start, end) of one sequence from the paged cache -> [end - start, KVH, D]."""\n'


def scenario():
    from tools.scenario import from_dict

    reqs = [
        {"prompt_ids": [(5 * i + 7) % 400 + 3 for i in range(20)], "max_tokens": 4, "sampling": {"ignore_eos": True}}
    ]
    return from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "tinyserve", "dtype": "float32"},
            "workload": {"requests": reqs},
        }
    )


def commit_fault(repo: Path, fault: str) -> str:
    path = repo / ATTENTION_OPS
    old, new = FAULTS[fault]
    text = path.read_text()
    assert text.count(old) == 1 and text.count(READER_DOC) == 1
    path.write_text(text.replace(old, new).replace(READER_DOC, READER_DOC.replace("Tokens", "The tokens")))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-qam", "attention: tidy the cache scatter"], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def ranked_with_culprit(repo: Path, sha: str):
    from tools.hypotheses.evidence import Culprit, DrillDown, Reproduction
    from tools.hypotheses.gather import gather
    from tools.probe.prober import Prober
    from tools.probe.taps import component

    prober, sc = Prober(), scenario()
    probe = prober.probe(sc, repo)
    assert probe.diverged and probe.first is not None
    first = probe.first.tap
    drill = DrillDown(first, None, component(first))
    culprit = Culprit(sha, "attention: tidy the cache scatter", "", "")
    found = gather(repo, None, Reproduction(True, sc, probe), drill, culprit, prober)
    return sorted(found, key=lambda h: -h.score)


@pytest.mark.parametrize("fault", ["heads-transposed", "slot-offset"])
def test_the_writer_of_a_real_tree_with_a_write_fault_breaks_the_contract_and_no_reader_does(tmp_path, fault):
    from tools.probe.prober import Prober

    repo = faulty_tree(tmp_path / "tree", [])
    commit_fault(repo, fault)
    found = Prober().run_target(scenario(), repo, taps=[], function_checks=True).meta["function_checks"]
    broken = {v["function"].split(":")[1]: v for v in found if v["violations"]}
    assert set(broken) == {"write_to_kv_cache"}, broken
    assert broken["write_to_kv_cache"]["violations"] == broken["write_to_kv_cache"]["calls"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["heads-transposed", "slot-offset"])
def test_a_culprit_that_breaks_the_cache_writer_ranks_the_writer_first(tmp_path, fault):
    repo = faulty_tree(tmp_path / "tree", [])
    sha = commit_fault(repo, fault)
    ranked = ranked_with_culprit(repo, sha)
    top = ranked[0]
    assert (top.file, top.function) == (ATTENTION_OPS, "write_to_kv_cache")
    assert any(e.startswith("contract: write_to_kv_cache violates kv-cache-write") for e in top.evidence)
    reader = next(h for h in ranked if h.function == "gather_kv")
    assert not any(e.startswith("contract: ") for e in reader.evidence)  # the reader is not blamed by a contract
