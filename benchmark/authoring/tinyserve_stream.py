"""A realistic commit stream for the tinyserve subject, shared by every hard case (docs/design.md §6b).

A real engine's log is mostly small unrelated changes: docstrings, logging, type hints, a CLI
flag, a config option, a test, a refactor, a changed default on some other path, a new model
option, and now and then a fusion or reordering on a hot path that is numerically equivalent
within tolerance. `STREAM` is such a log, written once; a hard case inserts its own commits
(the culprit, sometimes a companion) at chosen positions with `history(...)`, which also dates
the commits and names the release tags (`v0.2.0`, `v0.3.0`, `v0.4.0`) the case's `[tags]`
table points at.

Every edit is a (file, old_text, new_text) replacement against the tree as it stands at that
point of the history (benchmark.author checks each one matches exactly once), so a case's own
edits must be written against the tree at their insertion point.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from benchmark.author import Replacement, Step

README = "README.md"
CONFIG = "tinyserve/config.py"
SCHED = "tinyserve/engine/scheduler.py"
SEQ = "tinyserve/engine/sequence.py"
BM = "tinyserve/engine/block_manager.py"
ENGINE = "tinyserve/engine/llm_engine.py"
RUNNER = "tinyserve/engine/model_runner.py"
NORM = "tinyserve/ops/norm.py"
ACT = "tinyserve/ops/activation.py"
ROT = "tinyserve/ops/rotary.py"
ATTN = "tinyserve/ops/attention.py"
ROPE = "tinyserve/layers/rotary_embedding.py"
EMB = "tinyserve/layers/embedding.py"
SAMPLER = "tinyserve/layers/sampler.py"
PARAMS = "tinyserve/sampling_params.py"
LOADER = "tinyserve/model_loader.py"
TOKENIZER = "tinyserve/tokenizer.py"
DETOK = "tinyserve/detokenizer.py"
LLM = "tinyserve/llm.py"
INIT = "tinyserve/__init__.py"
MAIN = "tinyserve/__main__.py"

# ----------------------------------------------------------------------------- people

ALICE = "Alice Moreau <alice.moreau@tinyserve.dev>"
BEN = "Ben Okonkwo <ben.okonkwo@gmail.com>"
CHEN = "Chen Jie <chenjie.ml@outlook.com>"
DARIA = "Daria Kowalska <daria.kowalska@posteo.de>"
EMIL = "Emil Johansson <emil@johansson.se>"
FATIMA = "Fatima Zahra <fzahra@tinyserve.dev>"
GIL = "Gil Avraham <gil.avraham@proton.me>"
HIRO = "Hiro Tanaka <hiro.tanaka.dev@gmail.com>"
RELEASE = "tinyserve release bot <release@tinyserve.dev>"


@dataclass(frozen=True)
class Commit:
    """One commit of a history, not yet dated."""

    message: str
    author: str
    edits: list[Replacement]
    slug: str | None = None


def release(version: str, previous: str) -> Commit:
    return Commit(
        f"Release v{version}",
        RELEASE,
        [(INIT, f'__version__ = "{previous}"', f'__version__ = "{version}"')],
        slug=f"release-v{version.replace('.', '-')}",
    )


CLI = '''"""Command line: generate from one prompt.

    python -m tinyserve --model DIR --prompt "Hello" [--max-tokens N] [--temperature T]
"""
from __future__ import annotations

import argparse

from tinyserve.llm import LLM
from tinyserve.sampling_params import SamplingParams


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tinyserve")
    ap.add_argument("--model", required=True, help="checkpoint dir (config.json + *.safetensors)")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    llm = LLM(args.model, dtype=args.dtype)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    print(llm.generate(args.prompt, params)[0].text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

TEST_PARAMS = """from __future__ import annotations

import pytest

from tinyserve.sampling_params import SamplingParams


def test_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_p": 0.0}, {"min_p": 1.5}, {"max_tokens": 0}])
def test_rejects_out_of_range(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_greedy_at_zero_temperature():
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=0.7).greedy
"""

TEST_BM = """from __future__ import annotations

import torch

from tinyserve.engine.block_manager import BlockManager
from tinyserve.engine.sequence import Sequence
from tinyserve.sampling_params import SamplingParams


def _seq(i, tokens):
    return Sequence(i, str(i), tokens, SamplingParams(), torch.Generator())


def test_free_returns_blocks_to_the_queue():
    bm = BlockManager(8, 4)
    seq = _seq(0, list(range(10)))
    assert bm.allocate(seq, [], 10)
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    bm.free(seq)
    assert bm.num_free_blocks == 8


def test_prefix_hit_reuses_full_blocks():
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a = _seq(0, list(range(9)))
    bm.allocate(a, [], 9)
    a.num_computed_tokens = 9
    bm.cache_full_blocks(a)
    b = _seq(1, list(range(9)))
    assert [blk.block_id for blk in bm.get_computed_blocks(b)] == a.block_table[:2]
"""


def stream() -> list[Commit]:
    """The shared log, oldest first. Indices are stable: cases insert after a given index."""
    return [
        # 0
        Commit(
            "docs: note how native_kernels helps when a kernel is suspect",
            ALICE,
            [
                (
                    README,
                    "Engine option `native_kernels=[...]` runs the named kernels' native twins.",
                    "Engine option `native_kernels=[...]` runs the named kernels' native twins (plain torch,\n"
                    "slower): when output looks wrong, swapping one kernel at a time is the quickest check.",
                )
            ],
        ),
        # 1
        Commit(
            "sequence: type hints and a docstring for block_token_ids",
            HIRO,
            [
                (
                    SEQ,
                    "    def block_token_ids(self, block_index: int, block_size: int) -> list[int]:\n",
                    "    def block_token_ids(self, block_index: int, block_size: int) -> list[int]:\n"
                    '        """Token ids held by logical block `block_index` (the last block may be partial)."""\n',
                )
            ],
        ),
        # 2
        Commit(
            "scheduler: log preemptions at debug level",
            DARIA,
            [
                (
                    SCHED,
                    "from collections import deque\n",
                    "import logging\nfrom collections import deque\n",
                ),
                (
                    SCHED,
                    "from tinyserve.engine.sequence import Sequence, SequenceStatus\n",
                    "from tinyserve.engine.sequence import Sequence, SequenceStatus\n\n"
                    "logger = logging.getLogger(__name__)\n",
                ),
                (
                    SCHED,
                    "    def preempt(self, seq: Sequence) -> None:\n        self.num_preemptions += 1\n",
                    "    def preempt(self, seq: Sequence) -> None:\n        self.num_preemptions += 1\n"
                    '        logger.debug("preempting %s (%d tokens computed)", seq.request_id, seq.num_computed_tokens)\n',
                ),
            ],
        ),
        # 3
        Commit(
            "ops/norm: name the variance in rms_norm\n\nSame math, reads like the native twin.",
            CHEN,
            [
                (
                    NORM,
                    "    inv_rms = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)\n",
                    "    variance = xf.pow(2).mean(dim=-1, keepdim=True)\n    inv_rms = torch.rsqrt(variance + eps)\n",
                )
            ],
        ),
        # 4
        Commit(
            "config: kv_cache_dtype option\n\n'auto' keeps the cache in the model dtype (as before); 'float32' keeps "
            "it in fp32 for\nhalf-precision models, at twice the memory.",
            FATIMA,
            [
                (
                    CONFIG,
                    "    native_kernels: tuple = ()\n",
                    "    native_kernels: tuple = ()\n"
                    '    kv_cache_dtype: str = "auto"             # "auto" = the model dtype, or a DTYPES name\n',
                ),
                (
                    CONFIG,
                    "        if self.block_size < 1:\n",
                    '        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in DTYPES:\n'
                    '            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not auto or one of '
                    "{', '.join(DTYPES)}\")\n"
                    "        if self.block_size < 1:\n",
                ),
                (
                    CONFIG,
                    "    @property\n    def torch_dtype(self) -> torch.dtype:\n        return DTYPES[self.dtype]\n",
                    "    @property\n    def torch_dtype(self) -> torch.dtype:\n        return DTYPES[self.dtype]\n\n"
                    "    @property\n    def cache_dtype(self) -> torch.dtype:\n"
                    '        return self.torch_dtype if self.kv_cache_dtype == "auto" else DTYPES[self.kv_cache_dtype]\n',
                ),
                (
                    RUNNER,
                    "                module.k_cache = torch.zeros(shape, dtype=self.config.torch_dtype)\n"
                    "                module.v_cache = torch.zeros(shape, dtype=self.config.torch_dtype)\n",
                    "                module.k_cache = torch.zeros(shape, dtype=self.config.cache_dtype)\n"
                    "                module.v_cache = torch.zeros(shape, dtype=self.config.cache_dtype)\n",
                ),
            ],
        ),
        # 5
        Commit("tests: SamplingParams validation", HIRO, [("tests/test_sampling_params.py", None, TEST_PARAMS)]),
        # 6
        Commit(
            "sampler: spell out the top-p cumulative sum",
            GIL,
            [
                (
                    SAMPLER,
                    "        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)\n",
                    "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
                    "        cum = torch.cumsum(sorted_probs, dim=-1)\n",
                )
            ],
        ),
        # 7
        Commit("cli: python -m tinyserve for quick checks", EMIL, [(MAIN, None, CLI)]),
        # 8
        release("0.2.0", "0.1.0"),
        # 9
        Commit(
            "rotary: build the cos/sin table with torch.outer",
            CHEN,
            [
                (
                    ROPE,
                    "    freqs = positions.float()[:, None] * inv_freq.float()[None, :]\n",
                    "    freqs = torch.outer(positions.float(), inv_freq.float())\n",
                )
            ],
        ),
        # 10
        Commit(
            "config: raise the default max_num_seqs to 128\n\nServing benchmarks were capped by it long before "
            "the KV cache filled.",
            FATIMA,
            [(CONFIG, "    max_num_seqs: int = 64\n", "    max_num_seqs: int = 128\n")],
        ),
        # 11
        Commit(
            "config: hf_overrides to patch config.json keys at load time\n\nLike vLLM's --hf-overrides: "
            "try a model variant (another rope_theta, a longer\ncontext) without editing the checkpoint.",
            ALICE,
            [
                (
                    CONFIG,
                    "    tensor_parallel_size: int = 1            # ranks (processes, gloo) the model is sharded over\n",
                    "    tensor_parallel_size: int = 1            # ranks (processes, gloo) the model is sharded over\n"
                    "    hf_overrides: dict | None = None         # config.json keys replaced before the model is built\n",
                ),
                (
                    CONFIG,
                    "        self.model_config = self.model_config or ModelConfig.from_dir(self.model)\n",
                    "        self.model_config = self.model_config or ModelConfig.from_dir(self.model, self.hf_overrides)\n",
                ),
                (
                    CONFIG,
                    '    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":\n'
                    '        return cls.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))\n',
                    '    def from_dir(cls, model_dir: str | Path, overrides: dict | None = None) -> "ModelConfig":\n'
                    '        hf = json.loads((Path(model_dir) / "config.json").read_text())\n'
                    "        return cls.from_dict({**hf, **(overrides or {})})\n",
                ),
            ],
        ),
        # 12
        Commit(
            "cli: --top-p",
            EMIL,
            [
                (
                    MAIN,
                    '    ap.add_argument("--temperature", type=float, default=0.0)\n',
                    '    ap.add_argument("--temperature", type=float, default=0.0)\n'
                    '    ap.add_argument("--top-p", type=float, default=1.0)\n',
                ),
                (
                    MAIN,
                    "SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)",
                    "SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)",
                ),
            ],
        ),
        # 13
        Commit(
            "block_manager: usage property for the metrics endpoint",
            DARIA,
            [
                (
                    BM,
                    "    @property\n    def num_free_blocks(self) -> int:\n        return len(self.free_queue)\n",
                    "    @property\n    def num_free_blocks(self) -> int:\n        return len(self.free_queue)\n\n"
                    "    @property\n    def usage(self) -> float:\n"
                    '        """Fraction of KV blocks held by sequences (cached-but-free blocks count as free)."""\n'
                    "        return 1.0 - self.num_free_blocks / len(self.blocks)\n",
                )
            ],
        ),
        # 14
        Commit(
            "sampling_params: treat a temperature below 1e-5 as greedy\n\nDividing by such a temperature "
            "overflows to inf in half precision; vLLM does the same.",
            GIL,
            [
                (
                    PARAMS,
                    "    def greedy(self) -> bool:\n        return self.temperature == 0.0\n",
                    "    def greedy(self) -> bool:\n        return self.temperature < 1e-5\n",
                )
            ],
        ),
        # 15
        Commit(
            "logits: slice the LM head to the vocabulary before the matmul\n\nPadded LM heads no longer "
            "compute logits that are thrown away.",
            CHEN,
            [
                (
                    EMB,
                    "        logits = F.linear(hidden, lm_head.weight)\n"
                    "        if self.soft_cap:\n"
                    "            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap\n"
                    "        return logits[:, :self.vocab_size]\n",
                    "        logits = F.linear(hidden, lm_head.weight[:self.vocab_size])\n"
                    "        if self.soft_cap:\n"
                    "            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap\n"
                    "        return logits\n",
                )
            ],
        ),
        # 16
        Commit(
            "ops/activation: silu_and_mul without the in-place multiply\n\ntorch.compile could not fuse "
            "through mul_ on a slice.",
            HIRO,
            [
                (
                    ACT,
                    "    # [T, 2I] -> [T, I]; writes silu(gate) into a fresh buffer then multiplies in place\n"
                    "    d = x.shape[-1] // 2\n"
                    "    out = F.silu(x[..., :d])\n"
                    "    return out.mul_(x[..., d:])\n",
                    "    # [T, 2I] -> [T, I]\n"
                    "    gate, up = x.split(x.shape[-1] // 2, dim=-1)\n"
                    "    return F.silu(gate) * up\n",
                )
            ],
        ),
        # 17
        Commit(
            "detokenizer: clarify when the remainder is flushed",
            ALICE,
            [
                (
                    DETOK,
                    "At the end the remainder is emitted as is, so the streamed pieces always add up\nto decode(all ids).",
                    "At the end the remainder is emitted as is (unless a stop string cut the text), so\n"
                    "the streamed pieces always add up to decode(all ids).",
                )
            ],
        ),
        # 18
        Commit(
            "engine: abort_request",
            DARIA,
            [
                (
                    ENGINE,
                    "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n",
                    "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n\n"
                    "    def abort_request(self, request_id: str) -> bool:\n"
                    '        """Drop a request wherever it is; its blocks go back to the pool. -> whether it was found."""\n'
                    "        for seq in list(self.scheduler.waiting):\n"
                    "            if seq.request_id == request_id:\n"
                    "                self.scheduler.waiting.remove(seq)\n"
                    "                return True\n"
                    "        for seq in list(self.scheduler.running):\n"
                    "            if seq.request_id == request_id:\n"
                    '                self.scheduler.finish(seq, "abort")\n'
                    "                return True\n"
                    "        return False\n",
                )
            ],
        ),
        # 19
        release("0.3.0", "0.2.0"),
        # 20
        Commit(
            "ops/attention: fold the softmax scale into q once per prefill chunk\n\nOne multiply per query "
            "row instead of one per score; equal up to rounding.",
            CHEN,
            [
                (
                    ATTN,
                    "    qg = q.to(_acc(q.dtype)).view(L, kvh, H // kvh, D).permute(1, 2, 0, 3)   # [KVH, G, L, D]\n",
                    "    qg = (q.to(_acc(q.dtype)) * scale).view(L, kvh, H // kvh, D).permute(1, 2, 0, 3)   # [KVH, G, L, D]\n",
                ),
                (
                    ATTN,
                    '        s = _softcap(torch.einsum("kgld,knd->kgln", qg, k) * scale, softcap)\n',
                    '        s = _softcap(torch.einsum("kgld,knd->kgln", qg, k), softcap)   # q carries the scale\n',
                ),
            ],
        ),
        # 21
        Commit(
            "model_runner: slot of a position in one helper",
            GIL,
            [
                (
                    RUNNER,
                    "            slots += [seq.block_table[p // self.block_size] * self.block_size + p % self.block_size\n"
                    "                      for p in range(first, first + n)]\n",
                    "            slots += [self.slot(seq, p) for p in range(first, first + n)]\n",
                ),
                (
                    RUNNER,
                    "    @staticmethod\n    def block_tables(seqs: list[Sequence]) -> torch.Tensor:\n",
                    "    def slot(self, seq: Sequence, position: int) -> int:\n"
                    '        """Cache slot (block * block_size + offset) holding `seq`\'s token at `position`."""\n'
                    "        block, offset = divmod(position, self.block_size)\n"
                    "        return seq.block_table[block] * self.block_size + offset\n\n"
                    "    @staticmethod\n    def block_tables(seqs: list[Sequence]) -> torch.Tensor:\n",
                ),
            ],
        ),
        # 22
        Commit(
            "spec_decode: look up 4-grams by default\n\nLonger matches propose fewer but better drafts on code.",
            EMIL,
            [
                (
                    CONFIG,
                    "    ngram_max: int = 3\n",
                    "    ngram_max: int = 4\n",
                )
            ],
        ),
        # 23
        Commit(
            "llm: type hints for generate",
            HIRO,
            [
                (
                    LLM,
                    "    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None\n",
                    "    def generate(self, prompts: str | list[int] | list[str | list[int]],\n"
                    "                 sampling_params: SamplingParams | list[SamplingParams] | None = None\n",
                )
            ],
        ),
        # 24
        Commit(
            "model_loader: log how many tensors were loaded",
            DARIA,
            [
                (LOADER, "from pathlib import Path\n", "import logging\nfrom pathlib import Path\n"),
                (
                    LOADER,
                    "# checkpoint tensors with no parameter here (recomputed, not loaded)\n",
                    "logger = logging.getLogger(__name__)\n\n"
                    "# checkpoint tensors with no parameter here (recomputed, not loaded)\n",
                ),
                (
                    LOADER,
                    "    missing = {n for n in params if not any(t == n for t, _ in loaded)}\n",
                    '    logger.info("loaded %d checkpoint tensors into %d parameters", len(loaded), len(params))\n'
                    "    missing = {n for n in params if not any(t == n for t, _ in loaded)}\n",
                ),
            ],
        ),
        # 25
        Commit(
            "tokenizer: vocab_size",
            ALICE,
            [
                (
                    TOKENIZER,
                    "    def encode(self, text: str) -> list[int]:\n",
                    "    @property\n    def vocab_size(self) -> int:\n"
                    "        return self._tok.get_vocab_size(with_added_tokens=True)\n\n"
                    "    def encode(self, text: str) -> list[int]:\n",
                )
            ],
        ),
        # 26
        Commit(
            "config: check max_num_seqs",
            FATIMA,
            [
                (
                    CONFIG,
                    "        if self.block_size < 1:\n",
                    "        if self.max_num_seqs < 1:\n"
                    '            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")\n'
                    "        if self.block_size < 1:\n",
                )
            ],
        ),
        # 27
        Commit(
            "ops/rotary: build the rotated halves with one cat",
            CHEN,
            [
                (
                    ROT,
                    "    out = torch.empty_like(x)\n"
                    "    out[..., :half] = x1 * cos - x2 * sin\n"
                    "    out[..., half:] = x2 * cos + x1 * sin\n"
                    "    return out.view(t, -1)\n",
                    "    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(t, -1)\n",
                )
            ],
        ),
        # 28
        Commit(
            "docs: kv_cache_dtype and hf_overrides",
            ALICE,
            [
                (
                    README,
                    "Step-driven use (staggered arrivals, teacher forcing): `LLMEngine(Config(...))`,",
                    '`kv_cache_dtype="float32"` keeps the KV cache in fp32 for half-precision models;\n'
                    "`hf_overrides={...}` replaces config.json keys at load time.\n\n"
                    "Step-driven use (staggered arrivals, teacher forcing): `LLMEngine(Config(...))`,",
                )
            ],
        ),
        # 29
        release("0.4.0", "0.3.0"),
        # 30
        Commit(
            "scheduler: docstring for _chunk",
            DARIA,
            [
                (
                    SCHED,
                    "    def _chunk(self, seq: Sequence, budget: int) -> int:\n",
                    "    def _chunk(self, seq: Sequence, budget: int) -> int:\n"
                    '        """Tokens of `seq` to compute this step: all that are left, or (chunked) what the budget '
                    'allows."""\n',
                )
            ],
        ),
        # 31
        Commit("tests: block manager basics", HIRO, [("tests/test_block_manager.py", None, TEST_BM)]),
        # 32
        Commit(
            "ops/norm: fused_add_rms_norm adds the residual with torch.add(out=)",
            GIL,
            [
                (
                    NORM,
                    "    residual.add_(x)\n    x.copy_(rms_norm(residual, weight, eps, weight_offset))\n",
                    "    torch.add(residual, x, out=residual)\n    x.copy_(rms_norm(residual, weight, eps, weight_offset))\n",
                )
            ],
        ),
        # 33
        Commit(
            "cli: --dtype choices",
            EMIL,
            [
                (
                    MAIN,
                    '    ap.add_argument("--dtype", default="float32")\n',
                    '    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])\n',
                )
            ],
        ),
    ]


RELEASE_INDEX = {"v0.2.0": 8, "v0.3.0": 19, "v0.4.0": 29}


def dates(start: str, n: int, seed: int) -> list[str]:
    """n increasing ISO dates from `start`, 1-4 days apart, office-ish hours."""
    rng = random.Random(seed)
    day = datetime.fromisoformat(start).replace(tzinfo=UTC)
    out = []
    for _ in range(n):
        day += timedelta(days=rng.randint(1, 4))
        stamp = day.replace(hour=rng.randint(8, 19), minute=rng.randint(0, 59), second=rng.randint(0, 59))
        out.append(stamp.isoformat())
    return out


@dataclass(frozen=True)
class History:
    steps: list[Step]
    bug_index: int | None  # 1-based position of the culprit in `steps`; None when the bug is at base
    tags: dict[str, int]  # tag -> 1-based position of the tagged step


def weave(
    stream_commits: list[Commit],
    releases: dict[str, int],
    inserts: dict[int, list[Commit]],
    culprit: Commit | None,
    start: str,
    seed: int,
) -> History:
    """A subject's commit stream with `inserts[i]` placed right after stream commit i (-1: before the
    first), dated from `start` (seeded). `releases` tags stream commits by index; `culprit` must be one
    of the inserted commits, or None for a bug at base."""
    commits: list[Commit] = list(inserts.get(-1, []))
    release_pos = {}
    for i, commit in enumerate(stream_commits):
        commits.append(commit)
        for tag, idx in releases.items():
            if idx == i:
                release_pos[tag] = len(commits)
        commits.extend(inserts.get(i, []))
    stamps = dates(start, len(commits), seed)
    steps = [Step(c.message, c.author, d, c.edits, slug=c.slug) for c, d in zip(commits, stamps, strict=True)]
    return History(steps=steps, bug_index=commits.index(culprit) + 1 if culprit else None, tags=release_pos)


def history(inserts: dict[int, list[Commit]], culprit: Commit, seed: int) -> History:
    """tinyserve's stream with `inserts` woven in (weave); tags point at the release commits."""
    return weave(stream(), RELEASE_INDEX, inserts, culprit, "2025-02-10", seed)
