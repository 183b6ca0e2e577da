"""tinyserve cases: mixed batches, block tables and per-slot state (batching)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.tinyserve_history import (
    ARJUN,
    CLAIRE,
    FATIMA,
    GREEDY,
    HYEJIN,
    IGOR,
    JONAS,
    LUCIA,
    MEI,
    NADIA,
    OPS_ATTN,
    OWEN,
    RAFAEL,
    RUNNER,
    SUBJECT,
    SVEN,
    d_attn_write_check,
    d_bm_usage_v2,
    d_config_max_num_seqs,
    d_engine_abort_v2,
    d_fwd_doc,
    d_llm_doc_v2,
    d_loader_message,
    d_params_penalty_range,
    d_readme_native,
    d_runner_doc_v2,
    d_sched_counts,
    d_seq_repr_v2,
    d_test_block_manager_v2,
    d_test_sampling_params,
    d_tokenizer_vocab_v2,
    good_ref_before,
    history_hourly,
    prompt,
)


def case_mixed_step_prefill_offset() -> CaseSpec:
    bug = [
        (
            OPS_ATTN,
            "    for s in (q_lens > 1).nonzero().flatten().tolist():\n"
            "        a, b = int(query_start_loc[s]), int(query_start_loc[s + 1])\n"
            "        out[a:b] = paged_attention_prefill(query[a:b], key_cache, value_cache, block_tables[s],\n"
            "                                           int(seq_lens[s]), scale, sliding_window, softcap)\n"
            "    return out\n",
            "    a = 0\n"
            "    for s, n in enumerate(q_lens.tolist()):   # one host sync for the batch, not two per sequence\n"
            "        if n == 1:\n"
            "            continue                          # decode rows: done above\n"
            "        out[a:a + n] = paged_attention_prefill(query[a:a + n], key_cache, value_cache, block_tables[s],\n"
            "                                               int(seq_lens[s]), scale, sliding_window, softcap)\n"
            "        a += n\n"
            "    return out\n",
        )
    ]
    entries = [
        (SVEN, "docs: how to rule out the optimized kernels", d_readme_native()),
        (MEI, "sequence: readable repr", d_seq_repr_v2()),
        (ARJUN, "ops/attention: check slot_mapping length when writing the KV cache", d_attn_write_check()),
        (
            RAFAEL,
            "perf(attention): walk prefill sequences without per-sequence tensor indexing\n\n"
            "The prefill dispatch did two .item() conversions of query_start_loc per sequence.\n"
            "Convert q_lens once and keep the running row offset on the host instead.",
            bug,
        ),
        (CLAIRE, "engine: add abort_request()", d_engine_abort_v2()),
        (IGOR, "tests: block manager allocate/free", d_test_block_manager_v2()),
        (NADIA, "model_loader: clearer message when no safetensors are found", d_loader_message()),
    ]
    steps, bug_index = history_hourly("2025-02-03", 1201, entries), 4
    a, b = prompt(1201, 12), prompt(2201, 22)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-mixed-step-prefill-offset",
        issue_number=1201,
        category="batching",
        modeled_on=["flashinfer-ai/flashinfer#4382", "NVIDIA/TensorRT-LLM#8813"],
        title="With chunked prefill on, a request that arrives while another is decoding gets garbage output",
        issue=issue_text("ts-mixed-step-prefill-offset"),
        repro=repro_toml(
            {"arch": "llama", "seed": 1},
            {
                "engine": "tinyserve",
                "dtype": "float32",
                "options": {"enable_chunked_prefill": True, "max_num_batched_tokens": 64, "block_size": 16},
            },
            [
                {"prompt_ids": a, "max_tokens": 12, "sampling": GREEDY, "arrival_step": 0},
                {"prompt_ids": b, "max_tokens": 8, "sampling": GREEDY, "arrival_step": 3},
            ],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=OPS_ATTN,
        truth_function="paged_attention",
        component="paged_attention",
        mechanism="prefill row offset only advances over prefill sequences, so when decode rows precede a prefill "
        "chunk in the packed batch the chunk reads and writes the wrong query/output rows",
        steps=steps,
        bug_index=bug_index,
    )


def case_stale_block_table_row() -> CaseSpec:
    bug = [
        (
            RUNNER,
            "    @staticmethod\n"
            "    def block_tables(seqs: list[Sequence]) -> torch.Tensor:\n"
            "        width = max(len(s.block_table) for s in seqs)\n"
            "        return torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], dtype=torch.long)\n",
            "    def block_tables(self, seqs: list[Sequence]) -> torch.Tensor:\n"
            '        """[B, max_blocks] block ids padded with 0, from a buffer kept across steps: a row is\n'
            '        rewritten only when its block count changed (most decode steps add no block)."""\n'
            "        width = max(len(s.block_table) for s in seqs)\n"
            '        buf = getattr(self, "_block_table_buf", None)\n'
            "        if buf is None or buf.shape[0] < len(seqs) or buf.shape[1] < width:\n"
            "            buf = torch.zeros(max(len(seqs), 8), max(width, 16), dtype=torch.long)\n"
            "            self._block_table_buf, self._block_table_lens = buf, [-1] * buf.shape[0]\n"
            "        for i, s in enumerate(seqs):\n"
            "            n = len(s.block_table)\n"
            "            if self._block_table_lens[i] != n:\n"
            "                buf[i, :n] = torch.tensor(s.block_table, dtype=torch.long)\n"
            "                buf[i, n:] = 0\n"
            "                self._block_table_lens[i] = n\n"
            "        return buf[:len(seqs), :width].clone()\n",
        )
    ]
    entries = [
        (
            FATIMA,
            "perf(model_runner): keep the block-table tensor across steps\n\n"
            "Building the [B, max_blocks] tensor from python lists every step showed up in decode\n"
            "profiles with many running sequences. Keep a buffer and only rewrite rows whose\n"
            "block count changed.",
            bug,
        ),
        (OWEN, "block_manager: add usage property", d_bm_usage_v2()),
        (MEI, "sampling_params: validate presence/frequency penalty range", d_params_penalty_range()),
        (JONAS, "tests: sampling params validation", d_test_sampling_params()),
        (LUCIA, "llm: document per-prompt sampling params", d_llm_doc_v2()),
        (ARJUN, "forward_context: note that it is only valid inside a forward", d_fwd_doc()),
    ]
    steps = history_hourly("2025-03-17", 1202, entries)
    a, b = prompt(1202, 20), prompt(2202, 22)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-stale-block-table-row",
        issue_number=1202,
        category="batching",
        modeled_on=["tenstorrent/vllm-tt-plugin#104", "NVIDIA/TensorRT-LLM#8813"],
        title="Long request's output turns to garbage right after a shorter request in the same batch finishes",
        issue=issue_text("ts-stale-block-table-row"),
        repro=repro_toml(
            {"arch": "llama", "seed": 2},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [
                {"prompt_ids": a, "max_tokens": 4, "sampling": GREEDY},
                {"prompt_ids": b, "max_tokens": 10, "sampling": GREEDY},
            ],
        ),
        truth_file=RUNNER,
        truth_function="ModelRunner.block_tables",
        component="model_runner",
        mechanism="block-table rows cached by batch position and refreshed only when the block count changes, so "
        "a sequence that moves into a finished request's row with the same count reads its KV blocks",
        steps=steps,
        bug_index=1,
    )


def case_penalty_counts_slot() -> CaseSpec:
    bug = [
        (
            RUNNER,
            "    def prepare_sampling(self, seqs: list[Sequence]) -> SamplingTensors:\n"
            "        return SamplingTensors.build([s.params for s in seqs], [s.prompt_token_ids for s in seqs],\n"
            "                                     [s.output_token_ids for s in seqs], [s.generator for s in seqs],\n"
            "                                     self.config.model_config.vocab_size)\n",
            "    def prepare_sampling(self, seqs: list[Sequence]) -> SamplingTensors:\n"
            '        """Output-token counts live in a [slots, V] buffer updated with each step\'s new tokens\n'
            '        instead of being recounted from every sequence\'s whole output."""\n'
            "        vocab = self.config.model_config.vocab_size\n"
            '        counts = getattr(self, "_output_counts", None)\n'
            "        if counts is None or counts.shape[0] < len(seqs):\n"
            "            counts = self._output_counts = torch.zeros(max(len(seqs), 8), vocab, dtype=torch.int64)\n"
            "            self._num_counted = [0] * counts.shape[0]\n"
            "        for i, s in enumerate(seqs):\n"
            "            out = s.output_token_ids\n"
            "            if len(out) < self._num_counted[i]:     # a new request took this slot\n"
            "                counts[i].zero_()\n"
            "                self._num_counted[i] = 0\n"
            "            for t in out[self._num_counted[i]:]:\n"
            "                counts[i, t] += 1\n"
            "            self._num_counted[i] = len(out)\n"
            "        st = SamplingTensors.build([s.params for s in seqs], [s.prompt_token_ids for s in seqs],\n"
            "                                   [[] for _ in seqs], [s.generator for s in seqs], vocab)\n"
            "        st.output_counts = counts[:len(seqs)].clone()\n"
            "        return st\n",
        )
    ]
    entries = [
        (NADIA, "scheduler: expose num_waiting / num_running for metrics", d_sched_counts()),
        (SVEN, "config: validate max_num_seqs", d_config_max_num_seqs()),
        (RAFAEL, "model_runner: describe the packed layout", d_runner_doc_v2()),
        (HYEJIN, "block_manager: add usage property", d_bm_usage_v2()),
        (
            IGOR,
            "perf(sampler): count output tokens incrementally\n\n"
            "SamplingTensors.build re-counted every sequence's whole output on every step, which\n"
            "grows with the generation length. Keep per-slot counts and add only the new tokens.",
            bug,
        ),
        (CLAIRE, "tokenizer: vocab_size property", d_tokenizer_vocab_v2()),
        (OWEN, "tests: block manager allocate/free", d_test_block_manager_v2()),
    ]
    steps, bug_index = history_hourly("2025-04-22", 1203, entries), 5
    a, b = prompt(1203, 18), prompt(2203, 16)
    pen = {"temperature": 0.8, "frequency_penalty": 0.7, "presence_penalty": 0.3, "ignore_eos": True}
    return CaseSpec(
        subject=SUBJECT,
        id="ts-penalty-counts-slot",
        issue_number=1203,
        category="batching",
        modeled_on=["huggingface/text-generation-inference#1765", "huggingface/transformers#39457"],
        title="frequency_penalty acts on tokens the request never generated once another request in the batch finishes",
        issue=issue_text("ts-penalty-counts-slot"),
        repro=repro_toml(
            {"arch": "llama", "seed": 3},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [
                {"prompt_ids": a, "max_tokens": 3, "sampling": dict(pen, seed=31)},
                {"prompt_ids": b, "max_tokens": 12, "sampling": dict(pen, seed=32)},
            ],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=RUNNER,
        truth_function="ModelRunner.prepare_sampling",
        component="model_runner",
        mechanism="output-token counts kept per batch slot and reset only when a slot's output shrinks, so a "
        "sequence shifted into a finished request's slot inherits its counts (wrong penalties)",
        steps=steps,
        bug_index=bug_index,
    )


CASES = [
    case_mixed_step_prefill_offset(),
    case_stale_block_table_row(),
    case_penalty_counts_slot(),
]
