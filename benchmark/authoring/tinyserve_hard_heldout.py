"""A second held-out set of hard-track tinyserve cases, each modelled on an upstream silent bug (issues 2034-2043).

    python -m benchmark.author ts-hard-prefix-touch-free ...

Same shape as tinyserve_hard_upstream: the shared commit stream (benchmark/authoring/tinyserve_stream.py,
release tags v0.2.0 / v0.3.0 / v0.4.0) with the case's own commits inserted on both sides of the culprit:
a culprit touching three or more functions or two files, a numerically equivalent change on the failing
path, and a behaviour change on another path. `good_ref` is the v0.2.0 tag. Most faults hide behind a
non-default path (prefix caching under pressure, chunked prefill, a mixed batch, speculation, tensor
parallelism, float16 / bfloat16, a long prompt, an architecture with biases or sliding layers).
Issue prose lives in benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, greedy, prompt
from benchmark.authoring.tinyserve_hard_upstream import case, target
from benchmark.authoring.tinyserve_stream import (
    BM,
    CONFIG,
    PARAMS,
    README,
    ROPE,
    ROT,
    RUNNER,
    SAMPLER,
    SCHED,
    Commit,
)

FWD_CTX = "tinyserve/forward_context.py"
SPEC = "tinyserve/spec_decode/engine.py"
QMM = "tinyserve/ops/quant_matmul.py"
QUANT = "tinyserve/quantization.py"
TP_LOADER = "tinyserve/distributed/loader.py"
TP_LAYERS = "tinyserve/distributed/layers.py"
LINEAR = "tinyserve/layers/linear.py"
LLAMA = "tinyserve/models/llama.py"
ATTN_OPS = "tinyserve/ops/attention.py"

MARTA = "Marta Szabo <marta.szabo@tinyserve.dev>"
OLU = "Olumide Bello <olumide.bello@gmail.com>"
SANNA = "Sanna Virtanen <sanna.virtanen@posteo.de>"
YUKI = "Yuki Mori <yuki.mori.dev@proton.me>"
DIEGO = "Diego Herrera <dherrera@tinyserve.dev>"


# ============================================================================= 2034 kv-cache: prefix hit left in the free queue

TOUCH_TEST = """from __future__ import annotations

import torch

from tinyserve.engine.block_manager import BlockManager
from tinyserve.engine.sequence import Sequence
from tinyserve.sampling_params import SamplingParams


def test_a_prefix_hit_takes_a_reference():
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a = Sequence(0, "a", list(range(9)), SamplingParams(), torch.Generator())
    bm.allocate(a, [], 9)
    a.num_computed_tokens = 9
    bm.cache_full_blocks(a)
    b = Sequence(1, "b", list(range(9)), SamplingParams(), torch.Generator())
    hits = bm.get_computed_blocks(b)
    bm.touch(hits)
    assert [blk.ref_count for blk in hits] == [2, 2]
"""


def prefix_touch_free() -> HardCase:
    logprobs_cap = Commit(
        "sampling_params: at most 20 logprobs per token\n\nThe OpenAI API caps top_logprobs at 20; larger values "
        "made every step sort the\nwhole vocabulary for nothing.",
        OLU,
        [
            (
                PARAMS,
                "        if self.logprobs is not None and self.logprobs < 0:\n"
                '            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")\n',
                "        if self.logprobs is not None and not 0 <= self.logprobs <= 20:\n"
                '            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")\n',
            )
        ],
    )
    chain_loop = Commit(
        "block_manager: cache_full_blocks walks the table once",
        SANNA,
        [
            (
                BM,
                "        prev = None\n"
                "        for i in range(seq.num_computed_tokens // self.block_size):\n"
                "            block = self.blocks[seq.block_table[i]]\n"
                "            prev = hash_block_tokens(prev, seq.block_token_ids(i, self.block_size))\n",
                "        prev, full = None, seq.num_computed_tokens // self.block_size\n"
                "        for i, block_id in enumerate(seq.block_table[:full]):\n"
                "            block = self.blocks[block_id]\n"
                "            prev = hash_block_tokens(prev, seq.block_token_ids(i, self.block_size))\n",
            )
        ],
    )
    bug = Commit(
        "block_manager: touch() for prefix hits, in LRU order\n\nA hit on a block that already sits in the free "
        "queue used to pull it out of\nthe middle of the queue one block at a time. touch() takes the hit blocks "
        "as a\ngroup, like vLLM's block pool: each gains a reference, and blocks revived\nfrom the free queue move "
        "to its back, so the most recently hit prefix is the\nlast one a fresh allocation evicts.",
        MARTA,
        [
            (
                BM,
                "        for block in cached:\n            self._take(block)\n",
                "        self.touch(cached)\n",
            ),
            (
                BM,
                "    def _take(self, block: Block) -> None:\n"
                "        if block.ref_count == 0:\n"
                "            del self.free_queue[block.block_id]\n"
                "        block.ref_count += 1\n",
                "    def touch(self, blocks: list[Block]) -> None:\n"
                '        """Prefix hits: each block gains a reference; a block revived from the free queue moves to\n'
                '        its back (most recently used), so it is the last one a fresh allocation evicts."""\n'
                "        for block in blocks:\n"
                "            if block.ref_count == 0:\n"
                "                self.free_queue.move_to_end(block.block_id)\n"
                "            block.ref_count += 1\n",
            ),
            ("tests/test_block_manager_touch.py", None, TOUCH_TEST),
        ],
    )
    shared = prompt(12, 2034)
    sampling = {"temperature": 0.0, "ignore_eos": True}
    reqs = [
        {"prompt_ids": shared, "max_tokens": 2, "sampling": sampling},
        {"prompt_ids": shared + prompt(3, 2134), "max_tokens": 8, "sampling": sampling, "arrival_step": 3},
        {"prompt_ids": prompt(14, 2234), "max_tokens": 4, "sampling": sampling, "arrival_step": 3},
    ]
    tgt = target(enable_prefix_caching=True, block_size=4, num_kv_blocks=8)
    return case(
        "ts-hard-prefix-touch-free",
        2034,
        "kv-cache",
        ["vllm-project/vllm#4761", "vllm-project/vllm#18957", "Wenyueh/MinivLLM#98"],
        "prefix caching with a small KV cache: a request that reuses a cached prompt derails mid-generation",
        repro_toml({"arch": "llama", "seed": 34}, tgt, reqs, good_ref="v0.2.0"),
        (
            BM,
            "BlockManager.touch",
            "block_manager",
            "a prefix hit on a block sitting in the free queue moves it to the back of the queue instead of taking "
            "it out, so a block in use stays free; a later fresh allocation hands it to another position and "
            "overwrites the shared prefix's K/V",
        ),
        [(12, logprobs_cap), (15, bug), (24, chain_loop)],
        bug,
    )


# ============================================================================= 2035 batching: packed order vs block tables


def prefill_first_tables() -> HardCase:
    budget_default = Commit(
        "config: chunked prefill defaults to a 4096-token budget\n\n2048 left the step half empty on long prompts.",
        DIEGO,
        [
            (
                CONFIG,
                "        budget = self.max_num_batched_tokens or (2048 if self.enable_chunked_prefill\n",
                "        budget = self.max_num_batched_tokens or (4096 if self.enable_chunked_prefill\n",
            )
        ],
    )
    chunk_expr = Commit(
        "scheduler: _chunk in one expression",
        YUKI,
        [
            (
                SCHED,
                "        if self.config.enable_chunked_prefill:\n"
                "            return min(seq.num_uncomputed_tokens, budget)\n"
                "        return seq.num_uncomputed_tokens\n",
                "        left = seq.num_uncomputed_tokens\n"
                "        return min(left, budget) if self.config.enable_chunked_prefill else left\n",
            )
        ],
    )
    bug = Commit(
        "model_runner: pack prefill chunks first, decodes last\n\nIn a mixed step the decode rows now form one "
        "contiguous tail of the packed\nbatch, which the batched decode kernel reads without a gather. Row "
        "bookkeeping\n(row -> sequence, logits rows) follows the packed order; the attention\nmetadata is built in "
        "one place.",
        OLU,
        [
            (
                RUNNER,
                '        """Pack each sequence\'s new tokens back to back -> (input_ids [T], context)."""\n'
                "        ids, positions, slots, row_seq, starts, seq_lens = [], [], [], [], [0], []\n"
                "        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):\n",
                '        """Pack each sequence\'s new tokens back to back, prefill chunks first (packing_order)\n'
                '        -> (input_ids [T], context)."""\n'
                "        ids, positions, slots, row_seq, starts, seq_lens = [], [], [], [], [0], []\n"
                "        order = packing_order(batch)\n"
                "        for i in order:\n"
                "            seq, n = batch.seqs[i], batch.num_new_tokens[i]\n",
            ),
            (
                RUNNER,
                "        samples = [i for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens))\n"
                "                   if seq.num_computed_tokens + n == seq.num_tokens]\n"
                "        meta = AttentionMetadata(query_start_loc=torch.tensor(starts), seq_lens=torch.tensor(seq_lens),\n"
                "                                 block_tables=self.block_tables(batch.seqs), slot_mapping=torch.tensor(slots))\n",
                "        end = {i: starts[k + 1] for k, i in enumerate(order)}     # one past each sequence's last row\n"
                "        samples = [i for i in order\n"
                "                   if batch.seqs[i].num_computed_tokens + batch.num_new_tokens[i] == batch.seqs[i].num_tokens]\n"
                "        meta = self.attention_metadata(batch, starts, seq_lens, slots)\n",
            ),
            (
                RUNNER,
                "                             logits_indices=torch.tensor([starts[i + 1] - 1 for i in samples], dtype=torch.long),\n",
                "                             logits_indices=torch.tensor([end[i] - 1 for i in samples], dtype=torch.long),\n",
            ),
            (
                RUNNER,
                "    @staticmethod\n    def block_tables(seqs: list[Sequence]) -> torch.Tensor:\n",
                "    def attention_metadata(self, batch: SchedulerOutput, starts: list[int], seq_lens: list[int],\n"
                "                           slots: list[int]) -> AttentionMetadata:\n"
                '        """Paged-attention metadata of a packed step: row offsets, context lengths and block tables of\n'
                '        the packed sequences, and the cache slot of every new token."""\n'
                "        return AttentionMetadata(query_start_loc=torch.tensor(starts), seq_lens=torch.tensor(seq_lens),\n"
                "                                 block_tables=self.block_tables(batch.seqs), slot_mapping=torch.tensor(slots))\n\n"
                "    @staticmethod\n    def block_tables(seqs: list[Sequence]) -> torch.Tensor:\n",
            ),
            (
                RUNNER,
                "@dataclass\nclass StepResult:\n",
                "def packing_order(batch: SchedulerOutput) -> list[int]:\n"
                '    """Batch indices in packing order: prefill chunks first, then single-token decodes (stable), so\n'
                '    the decode rows of a mixed step are one contiguous tail."""\n'
                "    return sorted(range(len(batch.seqs)), key=lambda i: batch.num_new_tokens[i] == 1)\n\n\n"
                "@dataclass\nclass StepResult:\n",
            ),
            (
                FWD_CTX,
                "    query_start_loc: torch.Tensor   # [B+1] packed-row offsets per scheduled sequence\n",
                "    query_start_loc: torch.Tensor   # [B+1] packed-row offsets per scheduled sequence (packing order:\n"
                "                                    # prefill chunks first, model_runner.packing_order)\n",
            ),
        ],
    )
    sampling = {"temperature": 0.0, "ignore_eos": True}
    reqs = [
        {"prompt_ids": prompt(10, 2035), "max_tokens": 10, "sampling": sampling},
        {"prompt_ids": prompt(40, 2135), "max_tokens": 6, "sampling": sampling, "arrival_step": 2},
    ]
    tgt = target(enable_chunked_prefill=True, max_num_batched_tokens=16)
    return case(
        "ts-hard-prefill-first-tables",
        2035,
        "batching",
        ["tenstorrent/tt-metal#52808", "HabanaAI/vllm-fork#1780", "vllm-project/vllm#4995"],
        "chunked prefill: a running request goes wrong the moment a long prompt is admitted next to it",
        repro_toml({"arch": "llama", "seed": 35}, tgt, reqs, good_ref="v0.2.0"),
        (
            RUNNER,
            "ModelRunner.attention_metadata",
            "model_runner",
            "query rows, context lengths and slots are packed prefill-first, but the block tables are still built "
            "in scheduling order, so in a mixed step each sequence attends over another sequence's KV blocks",
        ),
        [(10, budget_default), (17, bug), (30, chunk_expr)],
        bug,
    )


# ============================================================================= 2036 sampling: penalties on a row subset


def penalty_row_subset() -> HardCase:
    penalty_range = Commit(
        "sampling_params: presence and frequency penalties within [-2, 2]\n\nThe OpenAI API rejects values outside "
        "that range; we silently accepted them.",
        DIEGO,
        [
            (
                PARAMS,
                "        if self.max_tokens < 1:\n",
                '        for name in ("presence_penalty", "frequency_penalty"):\n'
                "            if not -2.0 <= getattr(self, name) <= 2.0:\n"
                '                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")\n'
                "        if self.max_tokens < 1:\n",
            )
        ],
    )
    temp_recip = Commit(
        "sampler: name the temperature column in apply_temperature",
        SANNA,
        [
            (
                SAMPLER,
                "        return logits / st.temperature.to(logits.dtype).unsqueeze(1)\n",
                "        temperature = st.temperature.to(logits.dtype).unsqueeze(1)   # [S, 1]; greedy rows hold 1.0\n"
                "        return logits / temperature\n",
            )
        ],
    )
    bug = Commit(
        "sampler: penalties only on the rows that ask for them\n\nThe penalty pass built [S, V] masks and two "
        "torch.where over the whole batch\neven when one request in fifty set a penalty. It now gathers the "
        "penalised\nrows, works on those, and writes them back.",
        YUKI,
        [
            (
                SAMPLER,
                "    @staticmethod\n"
                "    def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:\n"
                "        seen = st.prompt_mask | (st.output_counts > 0)\n"
                "        rep = st.repetition_penalty.to(logits.dtype).unsqueeze(1)\n"
                "        # HF: positive logits are divided by the penalty, negative ones multiplied\n"
                "        penalized = torch.where(logits > 0, logits / rep, logits * rep)\n"
                "        logits = torch.where(seen, penalized, logits)\n"
                "        counts = st.output_counts.to(logits.dtype)\n"
                "        logits = logits - st.frequency_penalty.to(logits.dtype).unsqueeze(1) * counts\n"
                "        return logits - st.presence_penalty.to(logits.dtype).unsqueeze(1) * (counts > 0).to(logits.dtype)\n",
                "    @staticmethod\n"
                "    def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:\n"
                "        rows = penalty_rows(st)\n"
                "        if rows.numel() == 0:\n"
                "            return logits\n"
                "        x = logits[rows]                                                   # [R, V]\n"
                "        seen, counts = token_history(st, rows)\n"
                "        rep = st.repetition_penalty[rows].to(x.dtype).unsqueeze(1)\n"
                "        # HF: positive logits are divided by the penalty, negative ones multiplied\n"
                "        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)\n"
                "        counts = counts.to(x.dtype)\n"
                "        x = x - st.frequency_penalty[rows].to(x.dtype).unsqueeze(1) * counts\n"
                "        x = x - st.presence_penalty[rows].to(x.dtype).unsqueeze(1) * (counts > 0).to(x.dtype)\n"
                "        return logits.index_copy(0, rows, x)\n",
            ),
            (
                SAMPLER,
                "@dataclass\nclass SamplerOutput:\n",
                "def penalty_rows(st: SamplingTensors) -> torch.Tensor:\n"
                '    """Rows that set a repetition, presence or frequency penalty. -> [R] row indices"""\n'
                "    on = (st.repetition_penalty != 1.0) | (st.presence_penalty != 0.0) | (st.frequency_penalty != 0.0)\n"
                "    return on.nonzero().flatten()\n\n\n"
                "def token_history(st: SamplingTensors, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n"
                '    """The penalised rows\' token history: (seen in prompt or output [R, V] bool, output counts [R, V])."""\n'
                "    n = rows.numel()\n"
                "    counts = st.output_counts[:n]\n"
                "    return st.prompt_mask[:n] | (counts > 0), counts\n\n\n"
                "@dataclass\nclass SamplerOutput:\n",
            ),
        ],
    )
    plain = {"temperature": 0.0, "ignore_eos": True}
    penalised = {"temperature": 0.0, "repetition_penalty": 1.5, "ignore_eos": True}
    reqs = [
        {"prompt_ids": prompt(14, 2036), "max_tokens": 8, "sampling": plain},
        {"prompt_ids": prompt(18, 2136), "max_tokens": 8, "sampling": penalised},
    ]
    return case(
        "ts-hard-penalty-row-subset",
        2036,
        "sampling",
        ["vllm-project/vllm#5639", "huggingface/text-generation-inference#1765"],
        "repetition_penalty behaves differently when another request without a penalty is in the batch",
        repro_toml({"arch": "llama", "seed": 36}, target(), reqs, good_ref="v0.2.0"),
        (
            SAMPLER,
            "token_history",
            "sampler",
            "the penalised rows' prompt mask and output counts are taken as the first R rows of the batch instead "
            "of the penalised rows themselves, so a penalty is applied against another request's tokens whenever a "
            "request without penalties precedes it",
        ),
        [(9, penalty_range), (18, bug), (26, temp_recip)],
        bug,
    )


# ============================================================================= 2037 spec-decode: verification row offsets


def spec_group_offsets() -> HardCase:
    ngram_min = Commit(
        "spec_decode: ngram_min defaults to 2\n\nSingle-token matches proposed mostly junk drafts on natural text.",
        DIEGO,
        [(CONFIG, "    ngram_min: int = 1                       #", "    ngram_min: int = 2                       #")],
    )
    budget_min = Commit(
        "spec_decode: draft_budget in one min()",
        SANNA,
        [
            (
                SPEC,
                "        left = seq.params.max_tokens - len(seq.output_token_ids) - 1\n"
                "        return max(0, min(self.config.num_speculative_tokens, left, self.config.max_model_len - seq.num_tokens))\n",
                "        left = seq.params.max_tokens - len(seq.output_token_ids) - 1\n"
                "        room = self.config.max_model_len - seq.num_tokens\n"
                "        return max(0, min(self.config.num_speculative_tokens, left, room))\n",
            )
        ],
    )
    bug = Commit(
        "spec_decode: verification rows with tensor ops\n\nThe Python double loop over sequences and drafts showed up "
        "in profiles at\nbatch 64; the rows are now one repeat_interleave of each sequence's first\nverification "
        "row plus its offset within the group.",
        OLU,
        [
            (
                SPEC,
                "    starts = ctx.attn_metadata.query_start_loc.tolist()\n"
                "    rows, row_seq, row_draft = [], [], []\n"
                "    for i in ctx.sample_seq_index.tolist():\n"
                "        d = drafts.get(i, [])\n"
                "        for r in range(len(d) + 1):\n"
                "            rows.append(starts[i + 1] - 1 - len(d) + r)\n"
                "            row_seq.append(i)\n"
                "            row_draft.append(d[r] if r < len(d) else -1)\n"
                "    return rows, row_seq, row_draft\n",
                "    samplers = ctx.sample_seq_index\n"
                "    sizes = torch.tensor([len(drafts.get(i, [])) + 1 for i in samplers.tolist()], dtype=torch.long)\n"
                "    first = ctx.attn_metadata.query_start_loc[1:][samplers] - sizes       # first verification row\n"
                "    rows = first.repeat_interleave(sizes) + _group_offsets(sizes)\n"
                "    row_draft = [t for i in samplers.tolist() for t in drafts.get(i, []) + [-1]]\n"
                "    return rows.tolist(), samplers.repeat_interleave(sizes).tolist(), row_draft\n\n\n"
                "def _group_offsets(sizes: torch.Tensor) -> torch.Tensor:\n"
                '    """0, 1, .., n-1 within each group of `sizes` consecutive rows. [G] -> [sum(sizes)]"""\n'
                "    width = max(int(sizes.max()), 1) if sizes.numel() else 1\n"
                "    return torch.arange(int(sizes.sum())) % width\n",
            ),
            (
                README,
                "with rejection\nsampling (greedy: accept while the argmax matches)",
                "with rejection\nsampling (greedy: accept while the argmax matches; the verification rows are gathered with\n"
                "tensor ops)",
            ),
        ],
    )
    loop = [141, 434, 315]
    sampling = {"temperature": 0.0, "ignore_eos": True}
    reqs = [
        {"prompt_ids": prompt(12, 2037) + loop * 5 + prompt(4, 2137), "max_tokens": 16, "sampling": sampling},
        {"prompt_ids": prompt(22, 2237), "max_tokens": 16, "sampling": sampling},
    ]
    tgt = target(speculative="ngram", num_speculative_tokens=3, ngram_min=1)
    return case(
        "ts-hard-spec-group-offsets",
        2037,
        "spec-decode",
        ["HabanaAI/vllm-fork#1780", "vllm-project/vllm#41758"],
        "ngram speculation changes greedy output, but only when several requests run together",
        repro_toml({"arch": "llama", "seed": 37}, tgt, reqs, good_ref="v0.2.0"),
        (
            SPEC,
            "_group_offsets",
            "spec_decode",
            "offsets within each sequence's verification rows are taken modulo the largest group, which is right "
            "only when every sequence carries the same number of drafts; in a batch with different draft counts "
            "drafts are verified against the logits of the wrong rows",
        ),
        [(11, ngram_min), (20, bug), (27, budget_min)],
        bug,
    )


# ============================================================================= 2038 parallelism: block tables sent once per batch

TP_RUNNER = "tinyserve/distributed/runner.py"


def tp_stale_tables() -> HardCase:
    no_tp_spec = Commit(
        "config: speculative decoding with tensor_parallel_size > 1 is refused\n\nThe draft runner is not sharded; "
        "it silently ran the draft model on rank 0 only.",
        DIEGO,
        [
            (
                CONFIG,
                "        if self.speculative and self.num_speculative_tokens < 1:\n",
                "        if self.speculative and self.tensor_parallel_size > 1:\n"
                '            raise ValueError("speculative decoding with tensor_parallel_size > 1 is not supported")\n'
                "        if self.speculative and self.num_speculative_tokens < 1:\n",
            )
        ],
    )
    embed_where = Commit(
        "distributed: VocabParallelEmbedding zeroes foreign ids with torch.where",
        SANNA,
        [
            (
                TP_LAYERS,
                "        x = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)\n",
                "        x = torch.where(outside.unsqueeze(-1), 0.0, F.embedding(local, self.weight))\n",
            )
        ],
    )
    bug = Commit(
        "tp: send block tables to the other ranks only when the batch changes\n\nThe pickled forward context was "
        "the largest message rank 0 broadcasts every\nstep, and most of it is the [B, max_blocks] block table. The "
        "table is now\nsent when the set of scheduled requests changes; the other ranks keep the\nlast one they "
        "received.",
        OLU,
        [
            (TP_RUNNER, "import atexit\nimport os\n", "import atexit\nimport dataclasses\nimport os\n"),
            (
                TP_RUNNER,
                "        self.rank, self.workers = rank, []\n",
                "        self.rank, self.workers = rank, []\n"
                "        self._sent_requests: list[str] | None = None   # rank 0: requests whose tables the ranks hold\n"
                "        self._tables: torch.Tensor | None = None         # ranks > 0: the last block tables received\n",
            ),
            (
                TP_RUNNER,
                "    def _mirror_forward(self, _module, args):\n"
                "        input_ids, positions = args\n"
                '        _broadcast(("forward", input_ids, positions, get_forward_context()))\n',
                "    def _mirror_forward(self, _module, args):\n"
                "        input_ids, positions = args\n"
                '        _broadcast(("forward", input_ids, positions, self._step_context(get_forward_context())))\n\n'
                "    def _step_context(self, ctx):\n"
                '        """The context the other ranks get. Block tables are most of it and belong to the batch, so\n'
                "        they travel only when the set of scheduled requests changes; otherwise the ranks keep the\n"
                '        last ones (_with_tables)."""\n'
                "        if ctx.request_ids == self._sent_requests:\n"
                "            meta = dataclasses.replace(ctx.attn_metadata, block_tables=None)\n"
                "            return dataclasses.replace(ctx, attn_metadata=meta)\n"
                "        self._sent_requests = list(ctx.request_ids)\n"
                "        return ctx\n\n"
                "    def _with_tables(self, ctx):\n"
                '        """Ranks > 0: a context without block tables reuses the last ones received."""\n'
                "        if ctx.attn_metadata.block_tables is None:\n"
                "            ctx.attn_metadata.block_tables = self._tables\n"
                "        self._tables = ctx.attn_metadata.block_tables\n"
                "        return ctx\n",
            ),
            (
                TP_RUNNER,
                "            with torch.inference_mode(), set_forward_context(ctx):\n",
                "            with torch.inference_mode(), set_forward_context(self._with_tables(ctx)):\n",
            ),
        ],
    )
    tgt = target(tensor_parallel_size=2, block_size=8)
    reqs = [greedy(13, 2038, 10)]
    return case(
        "ts-hard-tp-stale-tables",
        2038,
        "parallelism",
        ["vllm-project/vllm#42494", "vllm-project/vllm#5792", "sgl-project/sglang#17850"],
        "tensor_parallel_size=2: output goes wrong a few tokens into generation; TP=1 is fine",
        repro_toml({"arch": "llama", "seed": 38}, tgt, reqs, good_ref="v0.2.0"),
        (
            TP_RUNNER,
            "TPModelRunner._step_context",
            "distributed_runner",
            "block tables are broadcast to the other ranks only when the set of requests changes, but a request's "
            "table also grows whenever decoding crosses into a new block; the other ranks keep the stale table and "
            "attend over a padding block for the newest positions",
        ),
        [(13, no_tp_spec), (16, bug), (25, embed_where)],
        bug,
    )


# ============================================================================= 2039 quantization: int8 product in float16


def int8_fp16_overflow() -> HardCase:
    w8a16 = Commit(
        "config: accept quantization='w8a16' as a spelling of int8",
        DIEGO,
        [
            (
                CONFIG,
                '        if self.quantization not in (None, "int8", "int4"):\n',
                '        if self.quantization == "w8a16":\n'
                '            self.quantization = "int8"\n'
                '        if self.quantization not in (None, "int8", "int4"):\n',
            )
        ],
    )
    amax = Commit(
        "quantization: int8 scales from amax",
        SANNA,
        [
            (
                QUANT,
                "    scale = torch.clamp_min(w32.abs().max(dim=-1).values / 127.0, MIN_SCALE)\n",
                "    scale = torch.clamp_min(w32.abs().amax(dim=-1) / 127.0, MIN_SCALE)\n",
            )
        ],
    )
    bug = Commit(
        "quant_matmul: int8 matmul in the activation dtype\n\nThe int8 path copied every activation to fp32 "
        "before the matmul. The\nintegers -127..127 are exact in bf16 and fp16, so the product now runs in the\n"
        "activation dtype and the per-channel scale is applied to the result; fp32\nmodels are unchanged.",
        YUKI,
        [
            (
                QMM,
                "    xa = x.to(_acc(x.dtype))\n"
                "    if zero is None:\n"
                "        out = F.linear(xa, qweight.to(xa.dtype)) * scale.to(xa.dtype)\n"
                "    else:\n"
                "        out = _int4_matmul(xa, qweight, scale, zero, group_size)\n",
                "    if zero is None:\n"
                "        return _int8_matmul(x, qweight, scale, bias)\n"
                "    xa = x.to(_acc(x.dtype))\n"
                "    out = _int4_matmul(xa, qweight, scale, zero, group_size)\n",
            ),
            (
                QMM,
                "def dequant_matmul(x:",
                "def _int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,\n"
                "                 bias: torch.Tensor | None) -> torch.Tensor:\n"
                "    # [T, I] x int8 [O, I] -> [T, O] in x's dtype: the integers are exact in any float dtype, so no fp32\n"
                "    # copy of the activations; the per-output-channel scale multiplies the product\n"
                "    out = F.linear(x, qweight.to(x.dtype)) * scale.to(x.dtype)\n"
                "    return out if bias is None else out + bias.to(x.dtype)\n\n\n"
                "def dequant_matmul(x:",
            ),
            (
                QUANT,
                "    int8  per output channel, symmetric:  s = max|w_row| / 127,  q = round(w / s) in [-127, 127]\n",
                "    int8  per output channel, symmetric:  s = max|w_row| / 127,  q = round(w / s) in [-127, 127];\n"
                "          multiplied in the activation dtype (the integers are exact in it), then scaled\n",
            ),
        ],
    )
    model = {"arch": "llama", "seed": 39, "initializer_range": 1.0, "intermediate_size": 512}
    return case(
        "ts-hard-int8-fp16-overflow",
        2039,
        "quantization",
        ["huggingface/diffusion-fast#1", "vllm-project/vllm#37135", "vllm-project/vllm#33972"],
        "int8 weight-only quantization: float16 produces garbage, bfloat16 and float32 are fine",
        repro_toml(
            model, target("float16", quantization="int8"), [greedy(16, 2039, 8), greedy(11, 2139, 8)], good_ref="v0.2.0"
        ),
        (
            QMM,
            "_int8_matmul",
            "quant_matmul",
            "the int8 product runs in the activation dtype with the scale applied afterwards: the raw integer sums "
            "(up to 127 x activation x width) overflow float16 before the small per-channel scale brings them back, "
            "giving inf and NaN",
        ),
        [(10, w8a16), (21, bug), (28, amax)],
        bug,
    )


# ============================================================================= 2040 positional-encoding: angles in bf16


def rope_bf16_angles() -> HardCase:
    max_len_cap = Commit(
        "config: max_model_len defaults to at most 8192\n\nLong-context checkpoints sized their rotary tables and "
        "request checks for\n128k positions nobody asked for.",
        DIEGO,
        [
            (
                CONFIG,
                "        self.max_model_len = self.max_model_len or self.model_config.max_position_embeddings\n",
                "        self.max_model_len = self.max_model_len or min(self.model_config.max_position_embeddings, 8192)\n",
            )
        ],
    )
    split_table = Commit(
        "ops/rotary: split the gathered cos/sin rows with tensor_split",
        SANNA,
        [
            (
                ROT,
                "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).chunk(2, dim=-1)\n",
                "    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).tensor_split(2, dim=-1)\n",
            )
        ],
    )
    bug = Commit(
        "rotary: keep the cos/sin table in the dtype the model runs in\n\nThe fp32 table was indexed and then cast "
        "to the model dtype in every layer of\nevery step. The table is now built once, on first use, in that "
        "dtype (half\nthe memory for bf16), so the kernel's cast is a no-op.",
        MARTA,
        [
            (
                ROPE,
                "def compute_cos_sin_cache(inv_freq: torch.Tensor, positions: torch.Tensor, attention_scaling: float) "
                "-> torch.Tensor:\n"
                "    # positions [P] -> [P, dim] fp32: cos | sin\n"
                "    freqs = torch.outer(positions.float(), inv_freq.float())\n",
                "def rotary_angles(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:\n"
                "    # [P], [D/2] -> [P, D/2]: position * inverse frequency, in the table's dtype\n"
                "    return torch.outer(positions.to(dtype), inv_freq.to(dtype))\n\n\n"
                "def compute_cos_sin_cache(inv_freq: torch.Tensor, positions: torch.Tensor, attention_scaling: float,\n"
                "                          dtype: torch.dtype = torch.float32) -> torch.Tensor:\n"
                "    # positions [P] -> [P, dim] in `dtype`: cos | sin\n"
                "    freqs = rotary_angles(positions, inv_freq, dtype)\n",
            ),
            (
                ROPE,
                "        inv_freq, self.attention_scaling = ROPE_SCALING[rope_type](rope, head_dim, max_position)\n"
                "        n = max(max_position, max_model_len)\n"
                "        # a plain attribute, not a buffer: it must stay fp32 when the model is cast\n"
                "        self.cos_sin_cache = compute_cos_sin_cache(inv_freq, torch.arange(n), self.attention_scaling)\n",
                "        self.inv_freq, self.attention_scaling = ROPE_SCALING[rope_type](rope, head_dim, max_position)\n"
                "        self.num_positions = max(max_position, max_model_len)\n"
                "        # a plain attribute, not a buffer: built on first use in the dtype the model runs in\n"
                "        self.cos_sin_cache: torch.Tensor | None = None\n",
            ),
            (
                ROPE,
                "    def cache_for(self, positions: torch.Tensor) -> torch.Tensor:\n",
                "    def table(self, dtype: torch.dtype) -> torch.Tensor:\n"
                '        """The cos/sin table of every position in `dtype`, built once."""\n'
                "        if self.cos_sin_cache is None or self.cos_sin_cache.dtype != dtype:\n"
                "            positions = torch.arange(self.num_positions)\n"
                "            self.cos_sin_cache = compute_cos_sin_cache(self.inv_freq, positions, self.attention_scaling, dtype)\n"
                "        return self.cos_sin_cache\n\n"
                "    def cache_for(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:\n",
            ),
            (
                ROPE,
                "        if not self.is_dynamic or seq_len <= self.max_position:\n            return self.cos_sin_cache\n",
                "        if not self.is_dynamic or seq_len <= self.max_position:\n            return self.table(dtype)\n",
            ),
            (
                ROPE,
                "        return self._kernel(positions, query, key, self.cache_for(positions), self.head_dim)\n",
                "        return self._kernel(positions, query, key, self.cache_for(positions, query.dtype), self.head_dim)\n",
            ),
        ],
    )
    reqs = [greedy(500, 2040, 6)]
    return case(
        "ts-hard-rope-bf16-angles",
        2040,
        "positional-encoding",
        ["huggingface/transformers#29285", "EleutherAI/gpt-neox#1003", "huggingface/candle#3520"],
        "bfloat16: long prompts (~500 tokens) drift from transformers, short prompts look fine",
        repro_toml(
            {"arch": "llama", "seed": 40, "initializer_range": 0.2}, target("bfloat16"), reqs, good_ref="v0.2.0"
        ),
        (
            ROPE,
            "rotary_angles",
            "rotary_embedding",
            "rotary angles position * inv_freq are formed in the model dtype: in bfloat16 positions above 256 and "
            "the inverse frequencies are rounded to 8 bits, so the angles (and cos/sin) of long prompts are off by "
            "up to radians",
        ),
        [(12, max_len_cap), (17, bug), (28, split_table)],
        bug,
    )


# ============================================================================= 2041 model-config: qwen2 window layers


def qwen2_window_layers() -> HardCase:
    bos_default = Commit(
        "config: llama-family configs without bos_token_id use 1\n\nSome GGUF-to-HF conversions drop the key; "
        "every llama tokenizer has <s> at 1.",
        DIEGO,
        [
            (
                CONFIG,
                '            bos_token_id=hf.get("bos_token_id"),\n',
                '            bos_token_id=hf.get("bos_token_id", None if gemma else 1),\n',
            )
        ],
    )
    window_bound = Commit(
        "ops/attention: name the window's first visible position",
        SANNA,
        [
            (
                ATTN_OPS,
                "    if sliding_window is not None:\n        mask &= kv_pos > q_pos - sliding_window\n",
                "    if sliding_window is not None:\n"
                "        first = q_pos - sliding_window + 1           # oldest position still inside the window\n"
                "        mask &= kv_pos >= first\n",
            )
        ],
    )
    bug = Commit(
        "config: Qwen2 layer types from use_sliding_window and max_window_layers\n\nlayer_types in exported Qwen2 "
        "configs is derived data, and exporters that edit\nuse_sliding_window or max_window_layers leave a stale "
        "copy behind. Derive the\ntypes from the keys that define them, as Qwen2Config documents: the bottom\n"
        "max_window_layers layers slide, the rest attend globally.",
        MARTA,
        [
            (
                CONFIG,
                '    types = hf.get("layer_types")\n',
                '    types = qwen2_layer_types(hf) if hf.get("model_type") == "qwen2" else hf.get("layer_types")\n',
            ),
            (
                CONFIG,
                "@dataclass(slots=True)\nclass Config:\n",
                "def qwen2_layer_types(hf: dict) -> list:\n"
                '    """Qwen2: with use_sliding_window, the bottom max_window_layers layers use sliding-window attention\n'
                "    and the layers above attend globally (Qwen2Config's documentation); without it every layer is\n"
                '    global."""\n'
                '    n = hf["num_hidden_layers"]\n'
                '    if not hf.get("use_sliding_window"):\n'
                '        return ["full_attention"] * n\n'
                '    bottom = hf.get("max_window_layers", n)\n'
                '    return ["sliding_attention" if i < bottom else "full_attention" for i in range(n)]\n\n\n'
                "@dataclass(slots=True)\nclass Config:\n",
            ),
            (
                README,
                "`ModelConfig` (config.json, normalised: rope, sliding windows) |",
                "`ModelConfig` (config.json, normalised: rope, sliding windows (Qwen2: from use_sliding_window / "
                "max_window_layers)) |",
            ),
        ],
    )
    model = {"arch": "qwen2", "seed": 41, "use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1}
    return case(
        "ts-hard-qwen2-window-layers",
        2041,
        "model-config",
        ["huggingface/transformers#35896", "huggingface/transformers#36162", "vllm-project/vllm#17772"],
        "Qwen2 checkpoint with use_sliding_window enabled diverges from transformers on prompts past the window",
        repro_toml(model, target(), [greedy(48, 2041, 8), greedy(20, 2141, 8)], good_ref="v0.2.0"),
        (
            CONFIG,
            "qwen2_layer_types",
            "config",
            "derives Qwen2's sliding layers from the documented meaning of max_window_layers (the bottom layers "
            "slide) while transformers (and the checkpoint's own layer_types) slide the layers from "
            "max_window_layers up, so the window is applied to the wrong layers",
        ),
        [(9, bos_default), (20, bug), (26, window_bound)],
        bug,
    )


# ============================================================================= 2042 kernel: int4 decode matvec


def int4_matvec_repeat() -> HardCase:
    group_check = Commit(
        "config: reject an int4 group size that does not divide hidden_size\n\nIt failed much later, inside the "
        "first quantized layer.",
        DIEGO,
        [
            (
                CONFIG,
                '            raise ValueError(f"quant_group_size must be an even number >= 2, got {self.quant_group_size}")\n',
                '            raise ValueError(f"quant_group_size must be an even number >= 2, got {self.quant_group_size}")\n'
                '        if self.quantization == "int4" and self.model_config.hidden_size % self.quant_group_size:\n'
                '            raise ValueError(f"quant_group_size {self.quant_group_size} does not divide hidden_size "\n'
                '                             f"{self.model_config.hidden_size}")\n',
            )
        ],
    )
    shift_einsum = Commit(
        "quant_matmul: int4 zero-point term as one einsum",
        SANNA,
        [
            (
                QMM,
                "    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]\n",
                '    shift = torch.einsum("og,tg->tog", zero.to(x.dtype), xg.sum(-1))          # [T, O, G]\n',
            )
        ],
    )
    bug = Commit(
        "quant_matmul: matrix-vector path for single-row int4 inputs\n\nA lone decoding sequence multiplies one "
        "row; building [1, O, G] partial\nproducts for it cost more than dequantizing the weight and calling "
        "torch.mv.\nBatches of two or more rows keep the grouped path.",
        YUKI,
        [
            (
                QMM,
                "    else:\n        out = _int4_matmul(xa, qweight, scale, zero, group_size)\n",
                "    elif xa.shape[0] == 1:\n"
                "        out = _int4_matvec(xa, qweight, scale, zero, group_size)       # one row: decode\n"
                "    else:\n        out = _int4_matmul(xa, qweight, scale, zero, group_size)\n",
            ),
            (
                QMM,
                "def dequant_matmul(x:",
                "def _int4_matvec(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,\n"
                "                 group_size: int) -> torch.Tensor:\n"
                "    # x [1, I] -> [1, O]: dequantize the weight once (zero point and scale of each column's group), then\n"
                "    # one matrix-vector product\n"
                "    w = unpack_int4(qweight).to(x.dtype)                                     # [O, I]\n"
                "    w = (w - zero.to(x.dtype).repeat(1, group_size)) * scale.to(x.dtype).repeat(1, group_size)\n"
                "    return torch.mv(w, x[0]).unsqueeze(0)\n\n\n"
                "def dequant_matmul(x:",
            ),
            (
                README,
                "Quantized layers multiply through the `dequant_matmul` kernel (native twin: dequantize, then\nmatmul).",
                "Quantized layers multiply through the `dequant_matmul` kernel (native twin: dequantize, then\n"
                "matmul; single-row int4 inputs take a dequantize-and-matvec path).",
            ),
        ],
    )
    tgt = target(quantization="int4", quant_group_size=32)
    return case(
        "ts-hard-int4-matvec-repeat",
        2042,
        "kernel",
        ["ggml-org/llama.cpp#8102", "ggml-org/llama.cpp#8311", "ROCm/vllm#28"],
        "int4: a single request goes wrong after its first token; the same prompt in a batch of two is fine",
        repro_toml({"arch": "llama", "seed": 42}, tgt, [greedy(15, 2042, 8)], good_ref="v0.2.0"),
        (
            QMM,
            "_int4_matvec",
            "quant_matmul",
            "the single-row path expands each group's zero point and scale to columns with repeat() (tiling the "
            "groups) instead of repeat_interleave(), so every column after the first few is dequantized with another "
            "group's parameters; only decode steps with one sequence take it",
        ),
        [(11, group_check), (18, bug), (26, shift_einsum)],
        bug,
    )


# ============================================================================= 2043 attention: window skipped by the shortest context

ATTN_LAYER = "tinyserve/layers/attention.py"


def window_min_context() -> HardCase:
    max_len_cap = Commit(
        "config: max_model_len defaults to at most 8192\n\nLong-context checkpoints sized their rotary tables and "
        "request checks for\n128k positions nobody asked for.",
        DIEGO,
        [
            (
                CONFIG,
                "        self.max_model_len = self.max_model_len or self.model_config.max_position_embeddings\n",
                "        self.max_model_len = self.max_model_len or min(self.model_config.max_position_embeddings, 8192)\n",
            )
        ],
    )
    tile_lo = Commit(
        "ops/attention: name the first key a prefill chunk's window reaches",
        SANNA,
        [
            (
                ATTN_OPS,
                "    lo = 0 if sliding_window is None else max(0, q_start - sliding_window + 1)\n"
                "    lo = lo // KV_TILE_TOKENS * KV_TILE_TOKENS\n",
                "    first_key = 0 if sliding_window is None else max(0, q_start - sliding_window + 1)\n"
                "    lo = first_key // KV_TILE_TOKENS * KV_TILE_TOKENS     # the tile holding it\n",
            )
        ],
    )
    bug = Commit(
        "attention: no window bookkeeping while every context fits the window\n\nUntil a context outgrows the "
        "sliding window the mask keeps every key anyway;\nthe layer now passes no window then, so the kernels skip "
        "the window mask and\nthe tile-range arithmetic for short requests.",
        MARTA,
        [
            (
                ATTN_LAYER,
                "from tinyserve.ops.attention import write_to_kv_cache\n",
                "from tinyserve.ops.attention import write_to_kv_cache\n\n\n"
                "def effective_window(window: int | None, seq_lens: torch.Tensor) -> int | None:\n"
                '    """The sliding window a step has to apply: None while the contexts still fit inside it (the mask\n'
                '    would keep every key)."""\n'
                "    if window is None or int(seq_lens.min()) <= window:\n"
                "        return None\n"
                "    return window\n",
            ),
            (
                ATTN_LAYER,
                "                           meta.block_tables, self.scale, self.sliding_window, self.softcap)\n",
                "                           meta.block_tables, self.scale,\n"
                "                           effective_window(self.sliding_window, meta.seq_lens), self.softcap)\n",
            ),
            (
                ATTN_OPS,
                "with a sliding window W, p > position - W (as transformers' mask).\n",
                "with a sliding window W, p > position - W (as transformers' mask; the layer passes no window\n"
                "while every context fits inside it).\n",
            ),
        ],
    )
    reqs = [greedy(10, 2043, 8), greedy(50, 2143, 8)]
    return case(
        "ts-hard-window-min-context",
        2043,
        "attention",
        ["sgl-project/sglang#4823", "ggml-org/llama.cpp#7903", "vllm-project/vllm#5908"],
        "Mistral: a long prompt diverges from transformers when it shares a batch with a short one",
        repro_toml({"arch": "mistral", "seed": 43}, target(), reqs, good_ref="v0.2.0"),
        (
            ATTN_LAYER,
            "effective_window",
            "attention",
            "drops the sliding window when the shortest context in the step fits inside it, instead of the longest: "
            "a long sequence batched with a short one attends past its window",
        ),
        [(10, max_len_cap), (23, bug), (27, tile_lo)],
        bug,
    )


CASES = [
    prefix_touch_free(),
    prefill_first_tables(),
    penalty_row_subset(),
    spec_group_offsets(),
    tp_stale_tables(),
    int8_fp16_overflow(),
    rope_bf16_angles(),
    qwen2_window_layers(),
    int4_matvec_repeat(),
    window_min_context(),
]
