"""Bugs at base on tinyserve (issue 12 item 2, DESIGN §6b "Bug at base").

    python -m benchmark.author [CASE ...] [--cases-dir DIR]   # writes these (and every other module's) cases

Each case folds its bug into the `base` commit (`commits/00-base-<slug>.patch`), so no commit
introduces it and there is no good ref; the history after base is 10+ commits that touch the
files of the faulty component (benchmark/authoring/atbase_data/distractors.py). The issue texts
live in benchmark/authoring/issues/<id>.md. Truth names no commit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from benchmark.author import Step, write_patches
from benchmark.authoring.atbase_data import distractors as d
from benchmark.authoring.common import repro_toml, toml_table

SUBJECT = "tinyserve"
CASES_DIR = Path(__file__).resolve().parents[1] / "cases"
ISSUES_DIR = Path(__file__).resolve().parent / "issues"
AUTHORS = [
    "Nadia Rahman <nadia.rahman@fastmail.com>",
    "Jonas Berg <jonas.berg@posteo.de>",
    "Mei Lin <mei.lin.dev@gmail.com>",
    "Rafael Costa <rcosta@tinyserve.dev>",
    "Anya Volkova <a.volkova@tinyserve.dev>",
    "Tariq Haddad <tariq.haddad@outlook.com>",
]
MIN_DISTRACTORS = 10


@dataclass
class AtBaseCase:
    """A case whose bug is in `base`: the same `.id` / `.write(cases_dir)` contract as CaseSpec."""

    id: str
    issue_number: int
    category: str
    modeled_on: list[str]
    title: str
    bug_message: str  # the message of the (folded) base patch: it reads as the code's original state
    bug: list  # [(file, old, new)] applied to the pristine snapshot
    files: list[str]  # keys of distractors.POOL: the files of the faulty component
    repro: str
    truth_file: str
    truth_function: str
    component: str
    mechanism: str
    track: str = "at-base"
    subject: str = "tinyserve"  # the contract's other attribute: which subject the case builds on

    def history(self) -> list[Step]:
        """The base bug, then every distractor of the component's files, dated after it."""
        pool = [c for f in self.files for c in d.POOL[f]]
        if len(pool) < MIN_DISTRACTORS:
            raise ValueError(f"{self.id}: {len(pool)} distractors, need {MIN_DISTRACTORS}")
        rng = random.Random(self.issue_number)
        rng.shuffle(pool)
        start = datetime.fromisoformat("2025-05-05T09:12:00+02:00")
        steps = [Step(self.bug_message, AUTHORS[0], start.isoformat(), self.bug, slug="base-" + self.id[8:])]
        for i, (message, edits) in enumerate(pool, 1):
            when = start + timedelta(days=2 * i, hours=rng.randrange(9), minutes=rng.randrange(60))
            steps.append(Step(message, rng.choice(AUTHORS), when.isoformat(), edits))
        return steps

    def write(self, cases_dir: Path) -> Path:
        folder = Path(cases_dir) / self.id
        folder.mkdir(parents=True, exist_ok=True)
        patches = write_patches(SUBJECT, self.history(), folder)
        for i, patch in enumerate(patches):  # 01-base-x, 02-y, … -> 00-base-x, 01-y, …
            patch.rename(patch.with_name(f"{i:02d}-{patch.name[3:]}"))
        meta = {
            "id": self.id,
            "issue_number": self.issue_number,
            "subject": SUBJECT,
            "category": self.category,
            "modeled_on": self.modeled_on,
            "title": self.title,
            "track": self.track,
        }
        (folder / "case.toml").write_text(toml_table(meta))
        (folder / "issue.md").write_text((ISSUES_DIR / f"{self.id}.md").read_text().strip() + "\n")
        (folder / "repro.toml").write_text(self.repro)
        truth = {"file": self.truth_file, "function": self.truth_function}
        truth |= {"component": self.component, "mechanism": self.mechanism}
        (folder / "truth.toml").write_text(toml_table(truth))
        return folder


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def greedy(seed: int, n: int, max_tokens: int = 8) -> dict:
    return {
        "prompt_ids": prompt(seed, n),
        "max_tokens": max_tokens,
        "sampling": {"temperature": 0.0, "ignore_eos": True},
    }


def scenario(model: dict, requests: list[dict], options: dict | None = None) -> str:
    target = {"engine": "tinyserve", "dtype": "float32", "options": options or {"block_size": 16}}
    return repro_toml(model, target, requests)


CASES = [
    AtBaseCase(
        id="ts-base-rmsnorm-centered",
        issue_number=1501,
        category="numerics",
        modeled_on=["keras-team/keras#22393", "allenai/OLMo#281"],
        title="Llama hidden states never match transformers, even in float32 on a short prompt",
        bug_message="ops: RMSNorm kernels",
        bug=[
            (
                d.NORM,
                "    inv_rms = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)\n",
                "    inv_rms = torch.rsqrt(xf.var(-1, keepdim=True, correction=0) + eps)\n",
            )
        ],
        files=[d.NORM],
        repro=scenario({"arch": "llama", "seed": 3}, [greedy(1501, 20)]),
        truth_file=d.NORM,
        truth_function="rms_norm",
        component="norm",
        mechanism="RMSNorm kernel normalises by the variance (mean-centred) instead of the mean of squares, "
        "so every norm output is scaled by a per-row factor that depends on the row's mean",
    ),
    AtBaseCase(
        id="ts-base-gelu-exact",
        issue_number=1502,
        category="kernel",
        modeled_on=["NVIDIA-NeMo/Megatron-Bridge#4661", "chelsea0x3b/dfdx#804"],
        title="Gemma 2 logits have never matched transformers (float32, from the first token)",
        bug_message="ops: gated activation kernels",
        bug=[(d.ACT, '    out = F.gelu(x[..., :d], approximate="tanh")\n', "    out = F.gelu(x[..., :d])\n")],
        files=[d.ACT],
        repro=scenario({"arch": "gemma2", "seed": 4, "initializer_range": 0.5}, [greedy(1502, 20)]),
        truth_file=d.ACT,
        truth_function="gelu_tanh_and_mul",
        component="activation",
        mechanism="the optimized gelu_tanh_and_mul kernel runs the exact (erf) GELU instead of the tanh "
        "approximation Gemma uses; its native twin is right",
    ),
    AtBaseCase(
        id="ts-base-yarn-magnitude",
        issue_number=1503,
        category="positional-encoding",
        modeled_on=["vllm-project/vllm#48351", "ml-explore/mlx-lm#1507"],
        title="YaRN-scaled Llama never matches transformers, even on short prompts",
        bug_message="layers: rotary embedding with rope scaling types",
        bug=[
            (
                d.ROPE,
                "    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)\n",
                "    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)\n",
            )
        ],
        files=[d.ROPE],
        repro=scenario(
            {
                "arch": "llama",
                "seed": 2,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
            },
            [greedy(1503, 24)],
        ),
        truth_file=d.ROPE,
        truth_function="compute_cos_sin_cache",
        component="rotary",
        mechanism="cos/sin cache ignores the attention scaling the rope type returns, so YaRN's magnitude "
        "factor (0.1 ln s + 1) is never applied",
    ),
    AtBaseCase(
        id="ts-base-dynamic-ntk-init",
        issue_number=1504,
        category="positional-encoding",
        modeled_on=["vllm-project/vllm#41236", "vllm-project/vllm#41301"],
        title="Dynamic NTK RoPE changes short prompts that should see plain RoPE",
        bug_message="layers: rotary embedding with rope scaling types",
        bug=[
            (
                d.ROPE,
                "    seq_len = max_pos if seq_len is None else torch.maximum(",
                "    seq_len = max_pos * factor if seq_len is None else torch.maximum(",
            )
        ],
        files=[d.ROPE],
        repro=scenario(
            {"arch": "llama", "seed": 1, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, [greedy(1504, 24)]
        ),
        truth_file=d.ROPE,
        truth_function="dynamic_ntk_inv_freq",
        component="rotary",
        mechanism="without a sequence length the dynamic NTK base is grown for factor * max_position_embeddings "
        "tokens, so the precomputed table used for short sequences is already scaled",
    ),
    AtBaseCase(
        id="ts-base-attn-softcap",
        issue_number=1505,
        category="attention",
        modeled_on=["unslothai/unsloth-zoo#593", "microsoft/onnxruntime#21683"],
        title="Gemma 2 attention far off from transformers in the first layer",
        bug_message="ops: paged attention kernels",
        bug=[
            (
                d.ATTN,
                "    return scores if not softcap else torch.tanh(scores / softcap) * softcap\n",
                "    return scores if not softcap else torch.tanh(scores) * softcap\n",
            )
        ],
        files=[d.ATTN],
        repro=scenario({"arch": "gemma2", "seed": 5}, [greedy(1505, 20)]),
        truth_file=d.ATTN,
        truth_function="_softcap",
        component="attention",
        mechanism="attention soft-capping computes tanh(s) * cap instead of tanh(s / cap) * cap",
    ),
    AtBaseCase(
        id="ts-base-decode-window",
        issue_number=1506,
        category="attention",
        modeled_on=["lightseekorg/tokenspeed#578", "mistralai/mistral-inference#60"],
        title="Mistral generation drifts once the context outgrows the sliding window",
        bug_message="ops: paged attention kernels",
        bug=[(d.ATTN, "    q_pos = (seq_lens - 1).view(-1, 1)\n", "    q_pos = seq_lens.view(-1, 1)\n")],
        files=[d.ATTN],
        repro=scenario({"arch": "mistral", "seed": 2}, [greedy(1506, 40, 10)]),
        truth_file=d.ATTN,
        truth_function="_decode_partition",
        component="attention",
        mechanism="split-KV decode takes the query position as seq_len instead of seq_len - 1, so with a "
        "sliding window the oldest in-window key is masked during decode",
    ),
    AtBaseCase(
        id="ts-base-top-k-extra",
        issue_number=1507,
        category="sampling",
        modeled_on=["kingoflolz/mesh-transformer-jax#164"],
        title="top_k keeps one token more than asked",
        bug_message="layers: batched sampler",
        bug=[
            (
                d.SAMPLER,
                "        kth = sorted_desc.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))\n",
                "        kth = sorted_desc.gather(1, top_k.clamp(max=logits.shape[-1] - 1).unsqueeze(1))\n",
            )
        ],
        files=[d.SAMPLER],
        repro=scenario(
            {"arch": "llama", "seed": 7},
            [
                {
                    "prompt_ids": prompt(1507, 16),
                    "max_tokens": 8,
                    "sampling": {"temperature": 0.8, "top_k": 5, "seed": 3, "ignore_eos": True},
                }
            ],
        ),
        truth_file=d.SAMPLER,
        truth_function="Sampler.apply_top_k",
        component="sampler",
        mechanism="top-k threshold read at sorted index k instead of k - 1, so k + 1 tokens survive",
    ),
    AtBaseCase(
        id="ts-base-rep-penalty-negative",
        issue_number=1508,
        category="sampling",
        modeled_on=["huggingface/transformers#2302", "NVIDIA-NeMo/Speech#8194"],
        title="repetition_penalty does not match transformers and sometimes encourages repeats",
        bug_message="layers: batched sampler",
        bug=[
            (
                d.SAMPLER,
                "        # HF: positive logits are divided by the penalty, negative ones multiplied\n"
                "        penalized = torch.where(logits > 0, logits / rep, logits * rep)\n",
                "        # CTRL: the logits of tokens seen so far are divided by the penalty\n"
                "        penalized = logits / rep\n",
            )
        ],
        files=[d.SAMPLER],
        repro=scenario(
            {"arch": "llama", "seed": 8},
            [
                {
                    "prompt_ids": prompt(1508, 9) * 2,
                    "max_tokens": 10,
                    "sampling": {"temperature": 0.8, "repetition_penalty": 1.3, "seed": 5, "ignore_eos": True},
                }
            ],
        ),
        truth_file=d.SAMPLER,
        truth_function="LogitsAdjuster.apply_penalties",
        component="sampler",
        mechanism="repetition penalty divides every seen token's logit, so negative logits move toward zero "
        "and those tokens become more likely",
    ),
    AtBaseCase(
        id="ts-base-gemma2-window-layers",
        issue_number=1509,
        category="model-config",
        modeled_on=["ggml-org/llama.cpp#8240", "vllm-project/vllm#6166"],
        title="Gemma 2 diverges on prompts longer than the sliding window",
        bug_message="config: engine and model configuration",
        bug=[
            (
                d.CONFIG,
                '    types = hf.get("layer_types")\n'
                '    if types is None and hf.get("model_type") == "gemma2":\n'
                "        # older gemma2 configs: even layers slide, odd layers attend globally\n"
                '        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]\n',
                '    types = hf.get("layer_types")\n'
                '    if hf.get("model_type") == "gemma2":\n'
                "        # gemma2 alternates: odd layers slide, even layers attend globally\n"
                '        types = ["sliding_attention" if i % 2 else "full_attention" for i in range(n)]\n',
            )
        ],
        files=[d.CONFIG],
        repro=scenario({"arch": "gemma2", "seed": 6}, [greedy(1509, 44)]),
        truth_file=d.CONFIG,
        truth_function="sliding_windows",
        component="attention",
        mechanism="gemma2's per-layer attention types are hard-coded with the wrong parity (and the config's "
        "layer_types ignored), so the sliding window is applied to the global layers and vice versa",
    ),
    AtBaseCase(
        id="ts-base-int8-truncate",
        issue_number=1510,
        category="quantization",
        modeled_on=["pytorch/ao#1014", "intel/neural-compressor#1180"],
        title="Weight-only int8 is less accurate than the same scheme elsewhere",
        bug_message="quantization: weight-only int8 / int4 at load time",
        bug=[
            (
                d.QUANT,
                "    return torch.round(w32 / scale.unsqueeze(-1)).clamp(-127, 127).to(torch.int8), scale\n",
                "    return (w32 / scale.unsqueeze(-1)).clamp(-127, 127).to(torch.int8), scale\n",
            )
        ],
        files=[d.QUANT],
        repro=scenario({"arch": "llama", "seed": 9}, [greedy(1510, 20)], {"block_size": 16, "quantization": "int8"}),
        truth_file=d.QUANT,
        truth_function="quantize_per_channel_int8",
        component="linear",
        mechanism="int8 quantizer casts w / s to int8 without rounding, truncating toward zero: every weight "
        "loses up to a whole quantization step instead of half of one",
    ),
]
