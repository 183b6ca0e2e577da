"""tinyserve's block manager, scheduler and config, on their own."""

import pytest
import torch
from tinyserve import Config, LLMEngine, SamplingParams
from tinyserve.engine.block_manager import BlockManager
from tinyserve.engine.sequence import Sequence

from benchmark.subjects import check_tinyserve  # noqa: F401  (puts the subject on sys.path)
from tools.probe.checkpoints import ensure_checkpoint

torch.set_num_threads(1)


def seq(i, tokens):
    return Sequence(i, str(i), tokens, SamplingParams(), torch.Generator())


def admit(bm, s):
    cached = bm.get_computed_blocks(s)
    assert bm.allocate(s, cached, s.num_tokens - len(cached) * bm.block_size)
    s.num_computed_tokens = s.num_tokens
    bm.cache_full_blocks(s)
    return len(cached)


def test_prefix_blocks_are_shared_ref_counted_and_evicted_lru():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a = seq(0, list(range(10)))  # blocks: [0-3] [4-7] [8,9]
    assert admit(bm, a) == 0 and len(a.block_table) == 3
    b = seq(1, list(range(8)) + [99, 98, 97])  # same two full blocks, different tail
    assert admit(bm, b) == 2
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8
    c = seq(2, list(range(9)))  # still cached after free
    assert admit(bm, c) == 2
    bm.free(c)
    hog = seq(3, list(range(200, 232)))  # needs all 8 blocks: evicts every cached one
    assert admit(bm, hog) == 0
    assert bm.get_computed_blocks(seq(4, list(range(9)))) == []
    assert all(bm.blocks[i].ref_count == 1 for i in hog.block_table)


def test_a_fully_cached_prompt_still_computes_its_last_token():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    admit(bm, seq(0, list(range(8))))
    assert len(bm.get_computed_blocks(seq(1, list(range(8))))) == 1  # 7 tokens at most -> one block


def test_allocation_is_all_or_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    s = seq(0, list(range(10)))
    assert bm.allocate(s, [], 10) and bm.num_free_blocks == 0
    t = seq(1, [1, 2])
    assert not bm.allocate(t, [], 2) and t.block_table == []


@pytest.fixture(scope="module")
def ckpt():
    return str(ensure_checkpoint({"arch": "llama", "seed": 0}))


def test_chunked_prefill_respects_the_token_budget(ckpt):
    engine = LLMEngine(Config(model=ckpt, enable_chunked_prefill=True, max_num_batched_tokens=10, block_size=4))
    for i in range(3):
        engine.add_request(str(i), list(range(3, 30)), SamplingParams(temperature=0, max_tokens=3))
    sizes = []
    while engine.has_unfinished_requests():
        batch = engine.scheduler.schedule()
        sizes.append(batch.num_batched_tokens)
        result = engine.model_runner.run(batch, engine.step_count)
        engine.scheduler.update_computed(batch)
        engine.step_count += 1
        engine.process_outputs(result)
    assert max(sizes) <= 10 and sizes[0] == 10


def test_max_num_seqs_caps_the_batch(ckpt):
    engine = LLMEngine(Config(model=ckpt, max_num_seqs=2))
    for i in range(4):
        engine.add_request(str(i), [5, 6, 7], SamplingParams(temperature=0, max_tokens=4))
    engine.step()
    assert len(engine.scheduler.running) == 2


def test_config_is_checked(ckpt):
    with pytest.raises(ValueError, match="dtype"):
        Config(model=ckpt, dtype="int8")
    with pytest.raises(ValueError, match="chunked"):
        Config(model=ckpt, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="kernels"):
        Config(model=ckpt, native_kernels=["nope"])
    with pytest.raises(ValueError, match="KV blocks"):
        LLMEngine(Config(model=ckpt, num_kv_blocks=2, block_size=4)).add_request("0", list(range(20)))
