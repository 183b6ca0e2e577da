"""Paged KV-cache bookkeeping: blocks, block tables, prefix caching.

A block holds `block_size` consecutive tokens of one sequence. With prefix
caching, a block that is full and computed gets a hash chained with its
predecessor's (so equal hashes mean equal prefixes); later sequences whose
prompt starts with the same tokens reuse it (ref counted). Freed blocks keep
their hash while they sit in the free queue and are evicted least recently
freed first, when a fresh block is needed.
"""
from __future__ import annotations

from collections import OrderedDict

from tinyserve.engine.sequence import Sequence


class Block:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None


def hash_block_tokens(prev_hash: int | None, token_ids) -> int:
    return hash((prev_hash, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_hit_tokens = 0     # statistics: prompt tokens served from the cache

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table))

    def get_computed_blocks(self, seq: Sequence) -> list[Block]:
        """Longest run of cached blocks matching the start of `seq`.

        At most num_tokens - 1 tokens count as hits: the last token is always
        recomputed so the step has logits to sample from.
        """
        if not self.enable_prefix_caching:
            return []
        hits, prev = [], None
        for i in range((seq.num_tokens - 1) // self.block_size):
            prev = hash_block_tokens(prev, seq.block_token_ids(i, self.block_size))
            block_id = self.hash_to_block.get(prev)
            if block_id is None:
                break
            hits.append(self.blocks[block_id])
        return hits

    def allocate(self, seq: Sequence, cached: list[Block], num_new_tokens: int) -> bool:
        """Admit a waiting sequence: take its cached prefix blocks, then room for
        `num_new_tokens` more. All or nothing."""
        revived = sum(1 for b in cached if b.ref_count == 0)   # cached but sitting in the free queue
        needed = -(-(len(cached) * self.block_size + num_new_tokens) // self.block_size) - len(cached)
        if needed + revived > self.num_free_blocks:
            return False
        for block in cached:
            self._take(block)
        seq.block_table = [b.block_id for b in cached]
        seq.num_computed_tokens = len(cached) * self.block_size
        self.prefix_hit_tokens += seq.num_computed_tokens
        return self.allocate_slots(seq, num_new_tokens)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow `seq`'s block table to hold `num_new_tokens` more tokens. All or nothing."""
        needed = self.blocks_needed(seq, num_new_tokens)
        if needed > self.num_free_blocks:
            return False
        for _ in range(needed):
            seq.block_table.append(self._allocate_fresh_block().block_id)
        return True

    def free(self, seq: Sequence) -> None:
        # tail blocks first, so the shared head of a prefix is evicted last
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
        seq.block_table = []

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the hashes of blocks that became full and computed this step."""
        if not self.enable_prefix_caching:
            return
        prev = None
        for i in range(seq.num_computed_tokens // self.block_size):
            block = self.blocks[seq.block_table[i]]
            prev = hash_block_tokens(prev, seq.block_token_ids(i, self.block_size))
            if block.hash is None:
                block.hash = prev
                self.hash_to_block.setdefault(prev, block.block_id)

    def _take(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.free_queue[block.block_id]
        block.ref_count += 1

    def _allocate_fresh_block(self) -> Block:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        self._evict(block)
        block.ref_count = 1
        return block

    def _evict(self, block: Block) -> None:
        if block.hash is not None and self.hash_to_block.get(block.hash) == block.block_id:
            del self.hash_to_block[block.hash]
        block.hash = None
