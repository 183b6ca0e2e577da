"""Bug-free tinyserve against transformers over the option matrix.

    OMP_NUM_THREADS=1 python benchmark/subjects/check_tinyserve.py [--quick] [--arch llama ...]

For every arch x dtype x {prefix caching, chunked prefill} x block size x
workload (batch 1, batch 4 together, batch 4 staggered) it generates greedily
with tinyserve, then re-runs transformers (eager attention) teacher-forced on
tinyserve's own sequences:

- float32: tinyserve's greedy tokens must be transformers' argmax at every
  generated position (so greedy generation is identical) and the chosen-token
  logprobs must agree within FP32_LOGPROB_TOL.
- bfloat16: a near-tie may legitimately flip, so tokens are compared by top-1
  agreement with transformers-bf16 (>= BF16_MIN_TOP1) and the logprob error
  against transformers-fp32 must stay within BF16_ERR_RATIO x transformers-bf16's
  own error (plus a small floor): tinyserve must be no noisier than the reference
  at the same dtype.

Part-2 features get rows of their own (`feature` column), each against its reference:
int8 / int4 weight-only quantization against transformers loading the same dequantized
weights (tools.probe.quant); speculative decoding (n-gram, a 1-layer draft model, the model as
its own draft) and tensor_parallel_size=2 against plain transformers. Every row also
checks the engine's incrementally detokenized text against the tokenizer's decoding of
the same tokens (multi-byte characters included).

Prompts are 38-70 tokens (crossing 4/16-token blocks, 24-token prefill chunks
and the 32-token sliding window); two of them share a 36-token prefix so prefix
caching gets real hits; the staggered workload adds requests at later steps.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SUBJECT_ROOT = ROOT / "benchmark" / "subjects" / "tinyserve"
for p in (str(ROOT), str(SUBJECT_ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

ARCHS = ("llama", "qwen2", "mistral", "gemma2")
FP32_LOGPROB_TOL = 1e-4
BF16_MIN_TOP1 = 0.9
BF16_ERR_RATIO, BF16_ERR_FLOOR = 2.0, 2e-2
MAX_TOKENS = 16
CHUNK_BUDGET = 24
WORKLOADS = {"batch1": 1, "batch4": 4, "staggered4": 4}


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 512, (36,), generator=g).tolist()
    lengths = [70, 45, 61, 38][:n]
    prompts = [torch.randint(3, 512, (L,), generator=g).tolist() for L in lengths]
    if n > 1:   # requests 0 and 1 share a prefix: prefix-caching hits
        prompts[0][:36] = shared
        prompts[1][:36] = shared
    return prompts


def arrivals(workload: str, n: int) -> list[int]:
    return [0, 3, 5, 9][:n] if workload.startswith("staggered") else [0] * n


def engine_options(prefix_caching: bool, chunked: bool, block_size: int, **extra) -> dict:
    opts = dict(enable_prefix_caching=prefix_caching, enable_chunked_prefill=chunked, block_size=block_size)
    if chunked:
        opts["max_num_batched_tokens"] = CHUNK_BUDGET
    return {**opts, **extra}


def reference_ckpt(ckpt: str, options: dict) -> str:
    """Quantized targets are compared with transformers running the same dequantized weights."""
    if not options.get("quantization"):
        return ckpt
    from tools.probe.quant import DEFAULT_GROUP_SIZE, ensure_dequantized
    return str(ensure_dequantized(ckpt, options["quantization"], options.get("quant_group_size", DEFAULT_GROUP_SIZE)))


def text_ok(ckpt: str, outputs) -> bool:
    """The engine's streamed text equals the tokenizer's decoding of the same tokens."""
    from transformers import AutoTokenizer
    if ckpt not in _TOKENIZERS:
        _TOKENIZERS[ckpt] = AutoTokenizer.from_pretrained(ckpt)
    return all(o.text == _TOKENIZERS[ckpt].decode(o.token_ids, skip_special_tokens=True) for o in outputs)


_TOKENIZERS: dict = {}


def run_tinyserve(ckpt: str, prompts, arrival_steps, dtype: str, options: dict):
    """-> (engine, outputs in prompt order); requests join at their arrival step."""
    from tinyserve import LLMEngine, SamplingParams

    engine = LLMEngine.from_options(ckpt, dtype=dtype, **options)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    pending = sorted(range(len(prompts)), key=lambda i: arrival_steps[i])
    outputs = {}
    while pending or engine.has_unfinished_requests():
        while pending and arrival_steps[pending[0]] <= engine.step_count:
            i = pending.pop(0)
            engine.add_request(str(i), prompts[i], params)
        for out in engine.step():
            outputs[out.request_id] = out
    if hasattr(engine.model_runner, "shutdown"):     # tensor parallel: stop the other ranks
        engine.model_runner.shutdown()
    return engine, [outputs[str(i)] for i in range(len(prompts))]


_HF_CACHE: dict = {}


def hf_model(ckpt: str, dtype: str):
    key = (ckpt, dtype)
    if key not in _HF_CACHE:
        from transformers import AutoModelForCausalLM
        _HF_CACHE[key] = AutoModelForCausalLM.from_pretrained(
            ckpt, dtype=getattr(torch, dtype), attn_implementation="eager").eval()
    return _HF_CACHE[key]


@torch.inference_mode()
def hf_logprobs(ckpt: str, dtype: str, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Teacher-forced transformers log-probs at the generated positions -> [len(output), V] fp32."""
    logits = hf_model(ckpt, dtype)(torch.tensor([prompt + output])).logits[0].float()
    return logits.log_softmax(-1)[len(prompt) - 1:-1]


def compare(ckpt: str, dtype: str, prompts, outputs) -> dict:
    """Per case: exact-greedy / top-1 agreement and chosen-token logprob errors."""
    agree, total, err, ref_err = 0, 0, 0.0, 0.0
    for prompt, out in zip(prompts, outputs):
        ids = torch.tensor(out.token_ids)
        ref32 = hf_logprobs(ckpt, "float32", prompt, out.token_ids)
        ref = ref32 if dtype == "float32" else hf_logprobs(ckpt, dtype, prompt, out.token_ids)
        agree += int((ref.argmax(-1) == ids).sum())
        total += len(ids)
        chosen32 = ref32.gather(1, ids[:, None]).squeeze(1)
        err = max(err, (torch.tensor(out.logprobs) - chosen32).abs().max().item())
        ref_err = max(ref_err, (ref.gather(1, ids[:, None]).squeeze(1) - chosen32).abs().max().item())
    top1 = agree / total
    if dtype == "float32":
        ok = top1 == 1.0 and err <= FP32_LOGPROB_TOL
    else:
        ok = top1 >= BF16_MIN_TOP1 and err <= BF16_ERR_RATIO * ref_err + BF16_ERR_FLOOR
    return dict(top1=top1, logprob_err=err, ref_err=ref_err, ok=ok)


def check_case(arch: str, dtype: str, workload: str, options: dict, ckpt: str | None = None,
               feature: str = "base") -> dict:
    from tools.probe.checkpoints import ensure_checkpoint

    ckpt = ckpt or str(ensure_checkpoint({"arch": arch, "seed": 0}))
    if options.get("draft_model") in DRAFTS:
        options = {**options, "draft_model": DRAFTS[options["draft_model"]](arch)}
    n = WORKLOADS[workload]
    prompts = make_prompts(n)
    engine, outputs = run_tinyserve(ckpt, prompts, arrivals(workload, n), dtype, options)
    result = compare(reference_ckpt(ckpt, options), dtype, prompts, outputs)
    result["text_ok"] = text_ok(ckpt, outputs)
    result["ok"] = result["ok"] and result["text_ok"]
    return dict(feature=feature, arch=arch, dtype=dtype, workload=workload, steps=engine.step_count,
                prefix_hit_tokens=engine.block_manager.prefix_hit_tokens,
                preemptions=engine.scheduler.num_preemptions, **options, **result)


def matrix(archs, quick: bool):
    dtypes = ("float32",) if quick else ("float32", "bfloat16")
    combos = itertools.product(archs, dtypes, (False, True), (False, True), (4, 16), WORKLOADS)
    for arch, dtype, prefix, chunked, bs, workload in combos:
        if quick and (bs, workload) not in ((4, "staggered4"), (16, "batch1")):
            continue
        yield arch, dtype, workload, engine_options(prefix, chunked, bs)
    for arch in archs:   # extras: preemption under a tiny cache; every kernel on its native twin
        yield arch, "float32", "batch4", engine_options(True, True, 4, num_kv_blocks=24)
        yield arch, "float32", "staggered4", engine_options(False, True, 16, native_kernels=_all_kernels())


def _checkpoint(arch: str, **keys) -> str:
    from tools.probe.checkpoints import ensure_checkpoint
    return str(ensure_checkpoint({"arch": arch, **keys}))


# draft_model placeholders -> the checkpoint, per arch
DRAFTS = {"<small>": lambda arch: _checkpoint(arch, seed=1, num_hidden_layers=1),
          "<self>": lambda arch: _checkpoint(arch, seed=0)}
PART2 = {   # feature -> engine options added to a chunked, prefix-cached, block-size-4 base
    "int8": dict(quantization="int8"),
    "int4": dict(quantization="int4"),
    "int4-g16": dict(quantization="int4", quant_group_size=16),
    "spec-ngram": dict(speculative="ngram", num_speculative_tokens=3),
    "spec-draft": dict(speculative="draft", draft_model="<small>", num_speculative_tokens=4),
    "spec-self": dict(speculative="draft", draft_model="<self>", num_speculative_tokens=5),
    "tp2": dict(tensor_parallel_size=2),
}


def part2_matrix(archs, quick: bool):
    """-> (feature, arch, dtype, workload, options) rows for quantization, spec decode and TP."""
    dtypes = ("float32",) if quick else ("float32", "bfloat16")
    workloads = ("staggered4",) if quick else ("batch1", "staggered4")
    for feature, extra in PART2.items():
        for arch, dtype, workload in itertools.product(archs, dtypes, workloads):
            yield feature, arch, dtype, workload, engine_options(True, True, 4, **extra)


def _all_kernels():
    from tinyserve.ops import KERNELS
    return tuple(KERNELS)


def summarize(rows: list[dict]) -> str:
    lines = [f"{'feature':10} {'arch':8} {'dtype':9} {'cases':>5} {'pass':>5} {'min top1':>9} {'max |dlogp|':>12} "
             f"{'max ref |dlogp|':>16}"]
    key = lambda r: (r.get("feature", "base"), r["arch"], r["dtype"])
    for (feature, arch, dtype), group in itertools.groupby(sorted(rows, key=key), key=key):
        g = list(group)
        lines.append(f"{feature:10} {arch:8} {dtype:9} {len(g):5d} {sum(r['ok'] for r in g):5d} "
                     f"{min(r['top1'] for r in g):9.3f} {max(r['logprob_err'] for r in g):12.2e} "
                     f"{max(r['ref_err'] for r in g):16.2e}")
    total, passed = len(rows), sum(r["ok"] for r in rows)
    lines.append(f"TOTAL {passed}/{total} cases pass "
                 f"(fp32: exact greedy + |dlogp| <= {FP32_LOGPROB_TOL:g}; bf16: top1 >= {BF16_MIN_TOP1}, "
                 f"|dlogp| <= {BF16_ERR_RATIO:g} x HF-bf16 error + {BF16_ERR_FLOOR:g}; text == decode(tokens))")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fp32 only, two block-size/workload combos")
    ap.add_argument("--arch", nargs="*", default=list(ARCHS))
    ap.add_argument("--features", choices=("all", "base", "part2"), default="all",
                    help="base: the original option matrix; part2: quantization, spec decode, TP rows")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows, started = [], time.monotonic()
    plan = []
    if args.features in ("all", "base"):
        plan += [("base", *row) for row in matrix(args.arch, args.quick)]
    if args.features in ("all", "part2"):
        plan += list(part2_matrix(args.arch, args.quick))
    for feature, arch, dtype, workload, options in plan:
        row = check_case(arch, dtype, workload, options, feature=feature)
        rows.append(row)
        if not row["ok"]:
            print("FAIL", row, flush=True)
    print(summarize(rows))
    print(f"wall {time.monotonic() - started:.0f}s")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
