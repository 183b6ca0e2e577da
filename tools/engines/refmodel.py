"""refmodel adapter: the independent reference models (tools/refmodels) as an engine.

As the reference it re-runs each request's full token sequence in one forward
(teacher forcing, step 0), like the transformers adapter; as a target it generates
one request at a time, re-running the whole sequence at every step (no KV cache:
the definition, not an optimisation) and reporting the prompt rows at the first
step and the newest row at each later one. Sampler taps follow tools.probe.sampling_ref
in both modes. Nothing here imports transformers: the tokenizer is read with the
`tokenizers` library from the checkpoint's tokenizer.json.

Options: `exact = true` runs norms, softmax and the rope table in float64 when the
dtype is float64 (default: float32 there, the checkpoints' convention, which is what
transformers computes too).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from tools import refmodels
from tools.engines.protocol import Capabilities, RunJob
from tools.engines.recorder import TORCH_DTYPES, HookRecorder, RowMap, chosen_logprobs, record_teacher_head
from tools.probe import taps as tapnames
from tools.probe.sampling_ref import adjust_row, truncate_row
from tools.probe.trace import RequestOutput, TapRecord, Trace
from tools.scenario import Request


class RefModelEngine:
    name = "refmodel"

    def encode_prompts(self, checkpoint: str, texts: list[str]) -> list[list[int]]:
        """Each text prompt as a run feeds it (prompt_ids, the checkpoint's tokenizer.json)."""
        tok = Tokenizer.from_checkpoint(checkpoint)
        return [prompt_ids(Request(prompt=text), tok) for text in texts]

    def capabilities(self) -> Capabilities:
        return Capabilities(taps=("embed", "layers.*", "final_norm", "logits", "sampler.*"))

    def run(self, job: RunJob) -> Trace:
        model = refmodels.load(
            job.checkpoint,
            TORCH_DTYPES[job.spec.dtype],
            exact=bool(job.spec.options.get("exact", False)),
            device=job.device,
        )
        tok = Tokenizer.from_checkpoint(job.checkpoint)
        prompts = [prompt_ids(r, tok) for r in job.scenario.requests]
        rec = HookRecorder(job.taps)
        with torch.no_grad():
            outputs = (
                teacher_forced(model, job, prompts, rec)
                if job.teacher is not None
                else generate_all(model, job, prompts, rec)
            )
        if tok is not None:
            for o in outputs:
                o.text = tok.decode(o.output_ids)
        records = sorted(rec.records, key=lambda r: (r.step, tapnames.order_key(r.name), r.request))
        meta = {
            "options": job.spec.options,
            "source": refmodels.__file__,
            "device": job.device,
            "numerics": "exact" if model.island == torch.float64 else "float32 norms/softmax/rope table",
        }
        return Trace(engine=self.name, dtype=job.spec.dtype, outputs=outputs, records=records, meta=meta)


def emitter(rec: HookRecorder, rows: RowMap) -> Callable[[str, torch.Tensor], None]:
    """An `emit(tap, [S, F])` for refmodels.forward that keeps the rows and taps asked for."""

    def emit(tap: str, x: torch.Tensor) -> None:
        if tap != "logits" and rec.wants(tap):  # logits are recorded with the sampler taps
            rec.rows = rows
            rec.record(tap, x[None])

    return emit


def teacher_forced(model, job: RunJob, prompts: list[list[int]], rec: HookRecorder) -> list[RequestOutput]:
    """Each request's full sequence in one forward (step 0)."""
    outputs = []
    assert job.teacher is not None, "teacher forcing needs the token sequences to re-run"
    for r, seq in enumerate(job.teacher):
        n_prompt = len(prompts[r])
        rec.step = 0
        logits = refmodels.forward(model, seq, emitter(rec, RowMap([r], [list(range(len(seq)))])))
        record_teacher_head(rec, r, logits, seq, n_prompt, job.scenario.requests[r])
        outputs.append(
            RequestOutput(
                prompt_ids=list(seq[:n_prompt]),
                output_ids=list(seq[n_prompt:]),
                logprobs=chosen_logprobs(logits, seq, n_prompt),
            )
        )
    return outputs


def generate_all(model, job: RunJob, prompts: list[list[int]], rec: HookRecorder) -> list[RequestOutput]:
    """Target mode: requests one after another; steps numbered across them."""
    outputs, step = [], 0
    for r, req in enumerate(job.scenario.requests):
        out, steps = generate_one(model, r, req, prompts[r], rec, step)
        outputs.append(out)
        step += steps
    return outputs


def generate_one(
    model, r: int, req: Request, prompt: list[int], rec: HookRecorder, step0: int
) -> tuple[RequestOutput, int]:
    """-> (RequestOutput, steps taken). Step 0 reports the prompt rows, step k the row of position len-1."""
    s = req.sampling
    stops = set() if s.get("ignore_eos") else set(model.config.eos_token_ids)
    stops |= set(s.get("stop_token_ids") or ())
    rng = torch.Generator().manual_seed(int(s.get("seed", 0)))
    seq, logprobs, reason = list(prompt), [], "length"
    for k in range(req.max_tokens):
        rec.step = step0 + k
        n = len(seq)
        keep = list(range(n)) if k == 0 else [-1] * (n - 1) + [n - 1]
        logits = refmodels.forward(model, seq, emitter(rec, RowMap([r], [keep])))[-1].double()
        token = sample_next(rec, r, n - 1, logits, seq, len(prompt), s, rng)
        logprobs.append(float(torch.log_softmax(logits, -1)[token]))
        seq.append(token)
        if token in stops:
            reason = "stop"
            break
    return RequestOutput(
        prompt_ids=list(prompt), output_ids=seq[len(prompt) :], logprobs=logprobs, finish_reason=reason
    ), k + 1


def sample_next(
    rec: HookRecorder,
    r: int,
    pos: int,
    logits: torch.Tensor,
    seq: list[int],
    n_prompt: int,
    s: dict,
    rng: torch.Generator,
) -> int:
    """[V] logits of position `pos` -> next token (greedy or sampled), recording the head taps."""
    processed = adjust_row(logits, seq, seq[n_prompt:], s)
    probs = torch.softmax(truncate_row(processed, s), -1)
    greedy = float(s.get("temperature", 0.0)) == 0.0
    token = int(processed.argmax()) if greedy else int(torch.multinomial(probs, 1, generator=rng))
    rows = {
        "logits": logits,
        "sampler.logits": processed,
        "sampler.probs": probs,
        "sampler.token": torch.tensor([float(token)], dtype=torch.float64),
    }
    for name, x in rows.items():
        if rec.wants(name):
            rec.records.append(TapRecord(name, rec.step, r, [pos], x[None].clone()))
    return token


# ---- tokenizer (no transformers) -------------------------------------------------------------


class Tokenizer:
    """The checkpoint's tokenizer.json through the `tokenizers` library."""

    def __init__(self, tok, cleanup: bool):
        self.tok, self.cleanup = tok, cleanup

    @classmethod
    def from_checkpoint(cls, checkpoint: str) -> Tokenizer | None:
        from tokenizers import Tokenizer as Fast

        path = Path(checkpoint)
        if not (path / "tokenizer.json").exists():
            return None
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        return cls(Fast.from_file(str(path / "tokenizer.json")), bool(cfg.get("clean_up_tokenization_spaces")))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        # special tokens are left out of text, as serving engines do by default
        text = self.tok.decode(ids, skip_special_tokens=True)
        return cleanup_spaces(text) if self.cleanup else text


def cleanup_spaces(text: str) -> str:
    """The legacy `clean_up_tokenization_spaces`: drop the space before punctuation and contractions."""
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(a, b)
    return text


def prompt_ids(req: Request, tok: Tokenizer | None) -> list[int]:
    if req.prompt_ids is not None:
        return list(req.prompt_ids)
    if tok is None:
        raise ValueError("a text prompt needs a tokenizer.json in the checkpoint dir")
    assert req.prompt is not None  # a Request holds exactly one of prompt_ids and prompt
    return tok.encode(req.prompt)
