"""Hard-track speculative-decoding cases on tinyserve (issue 12: every category gets 3+ cases; issues 2003-2004).

    python -m benchmark.author ts-hard-spec-penalty-own-draft ts-hard-spec-verify-causal

Each history is the shared stream (benchmark/authoring/tinyserve_stream.py, 34 commits with
release tags, among them a changed n-gram default on the speculative path) with the case's own
commits inserted: a culprit over several functions or files, and commits on the failing path
that leave its numbers unchanged. `good_ref` is the v0.2.0 tag. Issue prose lives in
benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

from pathlib import Path

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, stream_case
from benchmark.authoring.tinyserve_stream import ATTN, SAMPLER, Commit

SUBJECT = "tinyserve"
ISSUES_DIR = Path(__file__).resolve().parent / "issues"
SPEC = "tinyserve/spec_decode/engine.py"
REJECTION = "tinyserve/spec_decode/rejection.py"

PAULO = "Paulo Mendes <paulo.mendes@tinyserve.dev>"
INGRID = "Ingrid Halvorsen <ingrid.halvorsen@gmail.com>"
SAMIR = "Samir Qureshi <samir.qureshi@outlook.com>"


def case(id: str, number: int, *args) -> HardCase:
    """A spec-decode case on the shared stream (tinyserve_hard.stream_case)."""
    return stream_case(id, number, "spec-decode", *args)


def request(prompt_ids: list[int], max_tokens: int, **sampling) -> dict:
    return {
        "prompt_ids": prompt_ids,
        "max_tokens": max_tokens,
        "sampling": {"temperature": 0.0, **sampling, "ignore_eos": True},
    }


def scenario(seed: int, requests: list[dict]) -> str:
    target = {
        "engine": "tinyserve",
        "dtype": "float32",
        "options": {"speculative": "ngram", "num_speculative_tokens": 3},
    }
    return repro_toml({"arch": "llama", "seed": seed}, target, requests, good_ref="v0.2.0")


# ============================================================================= 2003 penalties count the draft under test

ROWS_ONCE = Commit(
    "spec_decode: sampling tensors once per sequence, repeated per row\n\nBuilding the prompt mask and output counts "
    "for every verification row cost\nk+1 vocabulary-sized scatters per sequence; build them once and repeat the\n"
    "rows, adding each row's drafts to its counts.",
    PAULO,
    [
        (SAMPLER, "from dataclasses import dataclass\n", "from dataclasses import dataclass, fields\n"),
        (
            SAMPLER,
            "            prompt_mask=prompt_mask, output_counts=output_counts, generators=list(generators))\n",
            "            prompt_mask=prompt_mask, output_counts=output_counts, generators=list(generators))\n\n"
            '    def repeat_rows(self, index: list[int], extra_outputs: list[list[int]]) -> "SamplingTensors":\n'
            '        """Row r of the result is row index[r], with the ids extra_outputs[r] counted as output too."""\n'
            "        idx = torch.tensor(index, dtype=torch.long)\n"
            "        counts = self.output_counts[idx].clone()\n"
            "        for r, ids in enumerate(extra_outputs):\n"
            "            if ids:\n"
            "                t = torch.tensor(ids, dtype=torch.long)\n"
            "                counts[r].index_add_(0, t, torch.ones_like(t))\n"
            "        rows = {f.name: getattr(self, f.name)[idx] for f in fields(self)\n"
            '                if f.name not in ("output_counts", "generators")}\n'
            "        return SamplingTensors(**rows, output_counts=counts, generators=[self.generators[i] for i in index])\n",
        ),
        (
            SPEC,
            '        """Row r of a speculated sequence sees drafts d_1..d_r as output (penalties count them)."""\n'
            "        params, prompts, outputs, gens, seen = [], [], [], [], {}\n"
            "        for i in row_seq:\n"
            "            seq, d = batch.seqs[i], drafts.get(i, [])\n"
            "            r = seen[i] = seen.get(i, -1) + 1\n"
            "            base = seq.token_ids[seq.num_prompt_tokens:seq.num_tokens - len(d)]\n"
            "            params.append(seq.params)\n"
            "            prompts.append(seq.prompt_token_ids)\n"
            "            outputs.append(base + d[:r])\n"
            "            gens.append(seq.generator)\n"
            "        return SamplingTensors.build(params, prompts, outputs, gens, self.config.model_config.vocab_size)\n",
            '        """Row r of a speculated sequence sees drafts d_1..d_r as output (penalties count them).\n'
            "        The prompt mask and the counts of accepted output are built once per sequence; rows repeat\n"
            '        them and add the drafts each row has seen."""\n'
            "        order = list(dict.fromkeys(row_seq))\n"
            "        seqs = [batch.seqs[i] for i in order]\n"
            "        outputs = [s.token_ids[s.num_prompt_tokens:s.num_tokens - len(drafts.get(i, []))]\n"
            "                   for i, s in zip(order, seqs)]\n"
            "        st = SamplingTensors.build([s.params for s in seqs], [s.prompt_token_ids for s in seqs], outputs,\n"
            "                                   [s.generator for s in seqs], self.config.model_config.vocab_size)\n"
            "        seen, rows = {}, []\n"
            "        for i in row_seq:\n"
            "            seen[i] = seen.get(i, 0) + 1          # drafts d_1..d_r\n"
            "            rows.append(drafts.get(i, [])[:seen[i]])\n"
            "        return st.repeat_rows([order.index(i) for i in row_seq], rows)\n",
        ),
    ],
)

REJECTION_DOC = Commit(
    "rejection: say why greedy rows skip the random test",
    INGRID,
    [
        (
            REJECTION,
            "            if not bool(st.greedy[r]):    # greedy rows already hold the argmax: accepted iff it equals the draft\n",
            "            # a greedy row already holds the argmax of its penalised logits: the draft is accepted iff it\n"
            "            # equals it (accepted() compares them), so only random rows draw u here\n"
            "            if not bool(st.greedy[r]):\n",
        )
    ],
)

ACCEPT_LOOP = Commit(
    "spec_decode: accepted() finds each sequence's rows in one pass",
    SAMIR,
    [
        (
            SPEC,
            "        for i in dict.fromkeys(row_seq):\n"
            "            seq, rs = batch.seqs[i], [r for r, j in enumerate(row_seq) if j == i]\n",
            "        rows_of: dict[int, list[int]] = {}\n"
            "        for r, j in enumerate(row_seq):\n"
            "            rows_of.setdefault(j, []).append(r)\n"
            "        for i, rs in rows_of.items():\n"
            "            seq = batch.seqs[i]\n",
        )
    ],
)


def spec_penalty_own_draft() -> HardCase:
    # llama seed 6: each prompt is a start and its own greedy continuation, which cycles, so the
    # n-gram lookup proposes drafts from the first decode step on
    pen = {"presence_penalty": 0.3, "frequency_penalty": 0.2}
    reqs = [
        request(
            [194, 166, 397, 14, 142, 253, 413, 104, 232, 282, 99, 141, 434, 315, 141, 434, 315, 141, 434]
            + [315, 141, 434, 315, 141, 434, 315, 454, 487, 339, 454, 487, 478, 146, 451, 454, 487, 478, 146],
            16,
            **pen,
        ),
        request(
            [414, 315, 354, 48, 435, 220, 174, 510, 182, 256, 126, 198, 400, 376, 29, 146, 451, 428, 32]
            + [303, 428, 32, 303, 428, 32, 303, 428, 32, 303, 428, 132, 454, 376, 78, 256, 126, 418, 402],
            16,
            **pen,
        ),
    ]
    return case(
        "ts-hard-spec-penalty-own-draft",
        2003,
        ["vllm-project/vllm#33251", "sgl-project/sglang#33643", "vllm-project/vllm#6718"],
        "Greedy output with presence/frequency penalties changes when n-gram speculation is on",
        scenario(6, reqs),
        (
            SPEC,
            "SpecDecodeEngine.row_sampling_tensors",
            "spec-decode",
            "verification row r counts drafts d_1..d_{r+1} as output, i.e. also the draft it is verifying, so "
            "presence/frequency penalties push that draft down and greedy acceptance picks another token",
        ),
        {13: [REJECTION_DOC], 21: [ROWS_ONCE], 27: [ACCEPT_LOOP]},
        ROWS_ONCE,
    )


# ============================================================================= 2004 verification rows see later drafts

DECODE_ROWS = Commit(
    "ops/attention: verification rows through the batched decode kernel\n\nA speculative step gives each sequence "
    "1 + k query rows; sending them to the\ntiled prefill kernel one sequence at a time was slower than the decode\n"
    "kernel over every row at once. Sequences with at most 4 new rows now take\nthe decode kernel, one row per query.",
    SAMIR,
    [
        (
            ATTN,
            "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition\n",
            "DECODE_PARTITION_TOKENS = 64  # decode: keys per split-KV partition\n"
            "MAX_DECODE_QUERY_ROWS = 4    # sequences with at most this many new rows (decode, draft verification)\n",
        ),
        (
            ATTN,
            '    """One new token per sequence, split-KV. q [B, H, D] -> [B, H, D]."""\n',
            '    """One query row per entry, split-KV: row b attends to the first seq_lens[b] cached tokens of\n'
            '    block_tables[b] (its own position is seq_lens[b] - 1). q [B, H, D] -> [B, H, D]."""\n',
        ),
        (
            ATTN,
            '    """Packed batch: single-token sequences go through the batched decode kernel, the rest\n'
            '    (prefill chunks) through the tiled prefill kernel. [T, H, D] -> [T, H, D]."""\n'
            "    out = torch.empty_like(query)\n"
            "    q_lens = query_start_loc[1:] - query_start_loc[:-1]\n"
            "    decode = (q_lens == 1).nonzero().flatten()\n"
            "    if decode.numel():\n"
            "        rows = query_start_loc[decode]\n"
            "        out[rows] = paged_attention_decode(query[rows], key_cache, value_cache, block_tables[decode],\n"
            "                                           seq_lens[decode], scale, sliding_window, softcap)\n"
            "    for s in (q_lens > 1).nonzero().flatten().tolist():\n",
            '    """Packed batch: sequences with few new rows (decode steps, speculative verification) go\n'
            "    through the batched decode kernel, one row per query; the rest (prefill chunks) through the\n"
            '    tiled prefill kernel. [T, H, D] -> [T, H, D]."""\n'
            "    out = torch.empty_like(query)\n"
            "    q_lens = query_start_loc[1:] - query_start_loc[:-1]\n"
            "    short = ((q_lens >= 1) & (q_lens <= MAX_DECODE_QUERY_ROWS)).nonzero().flatten()\n"
            "    if short.numel():\n"
            "        owner = short.repeat_interleave(q_lens[short])                 # [R] sequence of each row\n"
            "        rows = torch.cat([torch.arange(int(query_start_loc[s]), int(query_start_loc[s + 1]))\n"
            "                          for s in short.tolist()])\n"
            "        out[rows] = paged_attention_decode(query[rows], key_cache, value_cache, block_tables[owner],\n"
            "                                           seq_lens[owner], scale, sliding_window, softcap)\n"
            "    for s in (q_lens > MAX_DECODE_QUERY_ROWS).nonzero().flatten().tolist():\n",
        ),
    ],
)

VERIFY_ROWS_DOC = Commit(
    "spec_decode: verification_rows docstring names the packed layout",
    INGRID,
    [
        (
            SPEC,
            '    sequence. -> (rows, scheduled-sequence index per row, draft verified per row or -1)."""\n',
            "    sequence (a sequence's rows are its last 1 + len(drafts) packed rows: the last accepted token,\n"
            '    then its drafts). -> (rows, scheduled-sequence index per row, draft verified per row or -1)."""\n',
        )
    ],
)

MERGE_SAFE = Commit(
    "ops/attention: merge partitions with a max-shifted log-sum-exp",
    PAULO,
    [
        (
            ATTN,
            "    lse = torch.logsumexp(lses, dim=0)\n",
            "    top = lses.amax(dim=0).nan_to_num(0.0, neginf=0.0)\n"
            "    lse = top + torch.log(torch.exp(lses - top).sum(dim=0))\n",
        )
    ],
)


def spec_verify_causal() -> HardCase:
    # llama seed 13: each prompt is a start and its own greedy continuation, which cycles, so the
    # n-gram lookup proposes drafts from the first decode step on
    reqs = [
        request(
            [135, 151, 353, 468, 353, 413, 437, 458, 99, 150, 384, 284, 162, 384, 284, 162, 384, 284, 68]
            + [359, 27, 276, 40, 384, 40, 302, 259, 503, 271, 177, 360, 420, 360, 303, 420, 360, 303, 420],
            16,
        ),
        request(
            [511, 144, 430, 78, 46, 449, 409, 417, 172, 303, 12, 409, 478, 19, 503, 190, 176, 371, 339]
            + [339, 339, 339, 339, 339, 339, 339, 339, 331, 242, 286, 6, 238, 409, 175, 297, 4, 453, 226],
            16,
        ),
    ]
    return case(
        "ts-hard-spec-verify-causal",
        2004,
        ["flashinfer-ai/flashinfer#4382", "lightseekorg/tokenspeed#217"],
        "n-gram speculative decoding changes greedy output from the first accepted draft on",
        scenario(13, reqs),
        (
            ATTN,
            "paged_attention",
            "attention",
            "verification rows go through the decode kernel with their sequence's full seq_len, so every row "
            "(the last accepted token and each draft) also attends to the drafts after it",
        ),
        {9: [VERIFY_ROWS_DOC], 24: [DECODE_ROWS], 31: [MERGE_SAFE]},
        DECODE_ROWS,
    )


CASES = [
    spec_penalty_own_draft(),
    spec_verify_causal(),
]
