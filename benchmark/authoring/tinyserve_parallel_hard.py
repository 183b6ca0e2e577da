"""Hard-track tensor-parallel cases on tinyserve (issue 12: every category has >= 3 cases).

    python -m benchmark.author ts-tp-vocab-shard-edge ts-tp-logits-gather-rows

Each case is the shared commit stream (benchmark/authoring/tinyserve_stream.py, release tags
v0.2.0 / v0.3.0 / v0.4.0) with tensor-parallel commits inserted: distractors on the same files
(a numerically equivalent reordering on the failing path, a start-up check on another path, docs)
and the case's culprit, which touches two files. `good_ref` is the v0.2.0 tag, 25+ commits back.
Issue prose lives in benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.tinyserve_hard import HardCase, prompt, stream_case
from benchmark.authoring.tinyserve_stream import CONFIG, Commit

SUBJECT = "tinyserve"
TP_LAYERS = "tinyserve/distributed/layers.py"
TP_LOADER = "tinyserve/distributed/loader.py"
TP_STATE = "tinyserve/distributed/parallel_state.py"

OLU = "Olu Adeyemi <olu.adeyemi@tinyserve.dev>"
SANNA = "Sanna Virtanen <sanna.virtanen@posteo.de>"
MARCO = "Marco Bianchi <marco.bianchi.ml@gmail.com>"

EMBED_TAIL = (
    "        x = all_reduce(x)\n"
    "        if self.scale is not None:\n"
    "            x = x * torch.tensor(self.scale, dtype=x.dtype)\n"
    "        return x\n"
)

# ----------------------------------------------------------------------------- distractors

COLLECTIVES_DOC = Commit(
    "parallel_state: say which collectives the layers use",
    SANNA,
    [
        (
            TP_STATE,
            '"""This process\'s place in the tensor-parallel group, and the collectives layers use."""',
            '"""This process\'s place in the tensor-parallel group, and the collectives layers use:\n'
            "all_reduce after row-parallel layers and the vocabulary-parallel embedding, all_gather_last_dim\n"
            'for the vocabulary-parallel logits."""',
        )
    ],
)
# on the failing path, numerically the same: only the owning rank's row is non-zero before the sum
SCALE_BEFORE_SUM = Commit(
    "tp embedding: scale before the all-reduce\n\nOne multiply on the local rows instead of one on the summed "
    "rows; only the\nrank that owns an id holds a non-zero row, so the sum is the same.",
    OLU,
    [
        (
            TP_LAYERS,
            EMBED_TAIL,
            "        if self.scale is not None:  # only the owning rank's row is non-zero, so scaling first is exact\n"
            "            x = x * torch.tensor(self.scale, dtype=x.dtype)\n"
            "        return all_reduce(x)\n",
        )
    ],
)
# on the failing path, numerically the same: tanh capping is elementwise
CAP_AFTER_GATHER = Commit(
    "tp logits: soft-cap the gathered logits\n\nSame order as the single-rank LogitsProcessor, so the two read alike.",
    MARCO,
    [
        (
            TP_LAYERS,
            "        logits = F.linear(hidden, lm_head.weight)\n"
            "        if self.soft_cap:\n"
            "            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap\n"
            "        return all_gather_last_dim(logits)[:, :self.vocab_size]\n",
            "        logits = all_gather_last_dim(F.linear(hidden, lm_head.weight))\n"
            "        if self.soft_cap:\n"
            "            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap\n"
            "        return logits[:, :self.vocab_size]\n",
        )
    ],
)
# on the failing path, equivalent in fp32 (the upcast was a no-op there)
REDUCE_IN_PLACE = Commit(
    "parallel_state: no upcast copy for fp32 all-reduce\n\nfp32 and fp64 inputs are summed as they are; "
    "half-precision ones still\naccumulate in fp32 and are rounded once.",
    SANNA,
    [
        (
            TP_STATE,
            "    acc = x.to(torch.promote_types(x.dtype, torch.float32)).contiguous()\n",
            "    wide = torch.promote_types(x.dtype, torch.float32)\n"
            "    acc = x.contiguous() if x.dtype == wide else x.to(wide).contiguous()\n",
        )
    ],
)
# another path: a start-up check
NO_SPEC_TP = Commit(
    "config: refuse speculative decoding with tensor parallelism\n\nThe proposer and verifier only ever ran on "
    "rank 0's model; say so at start-up\ninstead of hanging in the first all-reduce.",
    MARCO,
    [
        (
            CONFIG,
            "        if self.quantization:\n"
            '            raise ValueError("quantization with tensor_parallel_size > 1 is not supported")\n',
            "        if self.quantization:\n"
            '            raise ValueError("quantization with tensor_parallel_size > 1 is not supported")\n'
            "        if self.speculative:\n"
            '            raise ValueError("speculative decoding with tensor_parallel_size > 1 is not supported")\n',
        )
    ],
)
LOADER_DOC = Commit(
    "tp loader: docstring for shard_config",
    OLU,
    [
        (
            TP_LOADER,
            "def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:\n",
            "def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:\n"
            '    """The config one rank\'s model is built from: its share of heads and MLP channels."""\n',
        )
    ],
)


def tp_inserts(culprit_at: int, culprit: Commit) -> dict[int, list[Commit]]:
    """Tensor-parallel distractors around the culprit, keyed by stream position (v0.2.0 is stream commit 8)."""
    inserts: dict[int, list[Commit]] = {}
    placed = ((3, COLLECTIVES_DOC), (11, SCALE_BEFORE_SUM), (16, NO_SPEC_TP), (24, REDUCE_IN_PLACE), (28, LOADER_DOC))
    for at, commit in placed:
        inserts.setdefault(at, []).append(commit)
    inserts.setdefault(culprit_at, []).append(culprit)
    return inserts


# ----------------------------------------------------------------------------- culprits

CLAMP_EMBEDDING = Commit(
    "tp embedding: one clamp instead of where + masked_fill\n\n"
    "Each rank keeps its first vocabulary id and row count; ids owned by other ranks\n"
    "are clamped into range for the gather and zeroed by one multiply with the mask.",
    OLU,
    [
        (
            TP_LAYERS,
            '    """Rows [vocab_start, vocab_end) of the table on this rank; ids outside give zeros, then sum."""\n'
            "    vocab_start = vocab_end = 0\n",
            '    """Rows [vocab_start, vocab_start + num_local) of the table on this rank; ids outside give zeros,\n'
            '    then sum."""\n'
            "    vocab_start = num_local = 0\n",
        ),
        (
            TP_LAYERS,
            "        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)\n"
            "        local = torch.where(outside, torch.zeros_like(input_ids), input_ids - self.vocab_start)\n"
            "        x = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)\n",
            "        local = input_ids - self.vocab_start\n"
            "        owned = (local >= 0) & (local <= self.num_local)\n"
            "        x = F.embedding(local.clamp(0, self.num_local - 1), self.weight) * owned.unsqueeze(-1)\n",
        ),
        (
            TP_LOADER,
            "                module.vocab_start, module.vocab_end = rank * vocab // tp, (rank + 1) * vocab // tp\n",
            "                module.vocab_start, module.num_local = rank * (vocab // tp), vocab // tp\n",
        ),
    ],
)

GATHER_ONE_BUFFER = Commit(
    "tp: gather logits into one buffer\n\n"
    "all_gather_last_dim allocated one tensor per rank and concatenated them; gather\n"
    "straight into the slices of one [tp, ...] buffer and reshape it instead (no cat copy).",
    MARCO,
    [
        (
            TP_STATE,
            "    parts = [torch.empty_like(x) for _ in range(_world)]\n"
            "    dist.all_gather(parts, x.contiguous())\n"
            "    return torch.cat(parts, dim=-1)\n",
            "    out = torch.empty((_world, *x.shape), dtype=x.dtype)\n"
            "    dist.all_gather(list(out.unbind(0)), x.contiguous())\n"
            "    return out.reshape(*x.shape[:-1], -1)\n",
        ),
        (
            TP_LAYERS,
            '    """Each rank scores its vocabulary slice; the slices are gathered in rank order."""\n',
            '    """Each rank scores its vocabulary slice [S, V/tp]; the slices are gathered in rank order\n'
            '    into [S, V] (parallel_state.all_gather_last_dim)."""\n',
        ),
    ],
)


# ----------------------------------------------------------------------------- cases

TP2 = {"tensor_parallel_size": 2}


def tp_case(
    id: str,
    number: int,
    modeled_on: list[str],
    title: str,
    repro: str,
    truth: tuple[str, str, str],
    at: int,
    culprit: Commit,
) -> HardCase:
    file, function, mechanism = truth
    return stream_case(
        id, number, "parallelism", modeled_on, title, repro, (file, function, "parallelism", mechanism),
        tp_inserts(at, culprit), culprit,
    )  # fmt: skip


def greedy_ids(ids: list[int], max_tokens: int) -> dict:
    return {"prompt_ids": ids, "max_tokens": max_tokens, "sampling": {"temperature": 0.0, "ignore_eos": True}}


def vocab_shard_edge() -> HardCase:
    # request 0 holds id 256, the first id of rank 1's half of the 512-entry vocabulary; request 1 does not
    edge = prompt(9, 2024) + [256] + prompt(6, 2124)
    plain = [t for t in prompt(18, 2224) if t != 256]
    target = {"engine": "tinyserve", "dtype": "float32", "options": TP2}
    return tp_case(
        "ts-tp-vocab-shard-edge",
        2024,
        ["lightseekorg/tokenspeed#309", "deepseek-ai/DeepSeek-V3#298", "NVIDIA/Megatron-LM#926"],
        "tensor_parallel_size=2: one prompt of a batch gets different tokens than TP=1",
        repro_toml(
            {"arch": "llama", "seed": 6}, target, [greedy_ids(edge, 8), greedy_ids(plain, 8)], good_ref="v0.2.0"
        ),
        (
            TP_LAYERS,
            "VocabParallelEmbedding.forward",
            "the ownership mask tests local <= num_local, so the first id of the next rank's shard is also looked up "
            "(clamped to this rank's last row) and its embedding gets that row added",
        ),
        20,
        CLAMP_EMBEDDING,
    )


def logits_gather_rows() -> HardCase:
    target = {"engine": "tinyserve", "dtype": "float32", "options": TP2}
    reqs = [greedy_ids(prompt(14, 2025), 8), greedy_ids(prompt(11, 2125), 8)]
    return tp_case(
        "ts-tp-logits-gather-rows",
        2025,
        ["THUDM/slime#1871", "NVIDIA/TensorRT-LLM#7128"],
        "TP=2 gives wrong tokens when two requests run together; each alone is fine",
        repro_toml({"arch": "llama", "seed": 7}, target, reqs, good_ref="v0.2.0"),
        (
            TP_STATE,
            "all_gather_last_dim",
            "the gathered [tp, S, V/tp] buffer is reshaped to [S, V] without moving the rank axis next to the "
            "vocabulary axis, so with more than one row each row holds rank 0's slices of two rows",
        ),
        22,
        GATHER_ONE_BUFFER,
    )


CASES = [vocab_shard_edge(), logits_gather_rows()]
