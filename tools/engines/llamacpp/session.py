"""One llama.cpp model + context for one RunJob: load the GGUF, decode steps, collect taps.

The context is built for the job: one unified KV cache (kv_unified, so a batch splits into
ubatches in batch order), one sequence per request, logits for every token, the eval callback
reading the nodes taps.py maps. Everything allocated in C is freed on exit.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import numpy as np

from tools.engines.llamacpp import (
    CACHE_TYPES,
    FLASH_ATTN,
    LOG_ERROR,
    LlamaCppEngine,
    Plan,
    library_file,
    tap_record,
)
from tools.engines.llamacpp.ggml import GraphNode, GraphReader
from tools.engines.llamacpp.gguf_convert import (
    FLOAT_TYPES,
    PERMUTED_ROPE,
    ensure_gguf,
    twin_checkpoint,
)
from tools.engines.llamacpp.taps import EMBED_NODE, graph_taps, wanted_node
from tools.engines.protocol import RunJob
from tools.probe.trace import RequestOutput, TapRecord

MAX_STEPS = 10_000


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _log_errors_only(level: int, text: bytes, _user_data) -> None:
    if level == LOG_ERROR and text:
        print(text.decode(errors="replace"), end="", flush=True)


class Session:
    """`capture_all`: read every graph node and leaf (not only the tap nodes) and keep each step's
    nodes in `graphs` (with the leaves in `reader.leaves`): what an op-level drill-down replays."""

    def __init__(self, job: RunJob, capture_all: bool = False):
        import llama_cpp

        self.ll, self.job = llama_cpp, job
        self.options = dict(job.spec.options)
        self.gguf_type = self.options.get("weights") or FLOAT_TYPES[job.spec.dtype]
        self.gguf = ensure_gguf(job.checkpoint, self.gguf_type)
        config = self.config = json.loads((Path(job.checkpoint) / "config.json").read_text())
        self.head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        self.permuted = config["model_type"] in PERMUTED_ROPE
        self.records: list[TapRecord] = []
        self.nodes: list[GraphNode] = []
        self.graphs: list[list[GraphNode]] | None = [] if capture_all else None
        self.reader = GraphReader(self.nodes.append, want=None if capture_all else wanted_node, read_leaves=capture_all)
        if job.op_checks is not None:  # every op judged on its own inputs (opcheck.py), the taps as before
            from tools.engines.llamacpp.opcheck import OpChecker

            source = Path(job.op_checks) if job.op_checks else None
            self.reader = OpChecker(self.nodes.append, wanted_node, source, self.gguf)
        self.step = 0
        self.model: Any = None
        self.ctx: Any = None
        self.vocab: Any = None

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Session:
        ll = self.ll
        ll.llama_log_set(_log_errors_only, None)
        ll.llama_backend_init()
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self.model = ll.llama_model_load_from_file(str(self.gguf).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.gguf}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        return self

    def open_context(self, n_tokens: int, n_seqs: int) -> None:
        """A context sized for `n_tokens` in all (every request's full sequence) and `n_seqs` sequences."""
        ll, opts = self.ll, self.options
        n_ctx = max(256, -(-n_tokens // 256) * 256)
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = int(opts.get("n_ubatch", n_ctx))
        cparams.n_seq_max = max(1, n_seqs)
        cparams.n_threads = cparams.n_threads_batch = int(opts.get("n_threads", 1))
        cache = CACHE_TYPES[opts.get("cache_type", FLOAT_TYPES[self.job.spec.dtype])]
        cparams.type_k = cparams.type_v = cache
        cparams.flash_attn_type = FLASH_ATTN[bool(opts.get("flash_attn", False))]
        cparams.kv_unified = True
        cparams.cb_eval = self.reader.callback
        cparams.cb_eval_user_data = None
        self.ctx = ll.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError(
                "llama.cpp could not create a context (a quantized cache_type needs flash_attn and a head_dim "
                "that is a multiple of the quant block, 32)"
            )

    def __exit__(self, *exc) -> None:
        if self.ctx:
            self.ll.llama_free(self.ctx)
        if self.model:
            self.ll.llama_model_free(self.model)
        self.ctx = self.model = None

    # ---- requests --------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (ctypes.c_int32 * (len(data) + 8))()
        n = self.ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} slots")
        return list(buf[:n])

    def detokenize(self, tokens: list[int]) -> str:
        out = b""
        buf = ctypes.create_string_buffer(256)
        for t in tokens:
            n = self.ll.llama_token_to_piece(self.vocab, t, buf, len(buf), 0, False)
            out += buf.raw[: max(n, 0)]
        return out.decode(errors="replace")

    def plans(self) -> list[Plan]:
        """Scenario requests (+ teacher sequences) -> Plans; opens the context sized for them."""
        job, plans = self.job, []
        for i, req in enumerate(job.scenario.requests):
            prompt = list(req.prompt_ids) if req.prompt_ids is not None else self.tokenize(req.prompt or "")
            ignore_eos = bool(req.sampling.get("ignore_eos", False))
            if job.teacher is not None:
                full = list(job.teacher[i])
                n = min(len(prompt), len(full) - 1)
                plans.append(Plan(full[:n], len(full) - n, 0, True, forced=full[n:]))
            else:
                plans.append(Plan(prompt, req.max_tokens, req.arrival_step, ignore_eos))
        check_window(self.config, max(len(p.prompt) + p.max_tokens for p in plans))
        self.open_context(sum(len(p.prompt) + p.max_tokens for p in plans), len(plans))
        return plans

    def request_output(self, p: Plan) -> RequestOutput:
        return RequestOutput(
            prompt_ids=list(p.prompt),
            output_ids=list(p.output),
            logprobs=list(p.logprobs),
            text=self.detokenize(p.output),
            finish_reason=p.finish or "length",
        )

    # ---- stepping --------------------------------------------------------------------------

    def drive(self, plans: list[Plan]) -> None:
        """Step until every request is done (teacher forcing: one step feeding every sequence whole)."""
        if self.job.teacher is not None:
            feed = [(r, p.prompt + p.forced, 0) for r, p in enumerate(plans) if p.forced is not None]
            logits = self.decode(feed)
            for (r, _, _), rows in zip(feed, logits):
                self.take_forced(plans[r], rows)
            return
        fed = [0] * len(plans)  # tokens of each request already in the cache
        while any(p.finish is None for p in plans):
            feed = []
            for r, p in enumerate(plans):
                if p.finish is None and p.arrival <= self.step:
                    tokens = (p.prompt + p.output)[fed[r] :]
                    feed.append((r, tokens, fed[r]))
            if self.step > MAX_STEPS:
                raise RuntimeError(f"llama.cpp did not finish within {MAX_STEPS} steps")
            if not feed:
                self.step += 1
                continue
            for (r, tokens, start), rows in zip(feed, self.decode(feed)):
                fed[r] = start + len(tokens)
                self.take_greedy(plans[r], rows[-1])

    def take_greedy(self, p: Plan, logits: np.ndarray) -> None:
        token = int(np.argmax(logits))
        p.output.append(token)
        p.logprobs.append(float(log_softmax(logits)[token]))
        if not p.ignore_eos and self.ll.llama_vocab_is_eog(self.vocab, token):
            p.finish = "stop"
        elif len(p.output) >= p.max_tokens:
            p.finish = "length"

    def take_forced(self, p: Plan, rows: np.ndarray) -> None:
        assert p.forced is not None
        n = len(p.prompt)
        p.output = list(p.forced)
        p.logprobs = [float(log_softmax(rows[n - 1 + k])[t]) for k, t in enumerate(p.forced)]
        p.finish = "length"

    def decode(self, feed: list[tuple[int, list[int], int]]) -> list[np.ndarray]:
        """One llama_decode of (request, tokens, first position) -> per request its logits rows
        [len(tokens), vocab]; the graph's taps are recorded under this step."""
        ll = self.ll
        rows = [(r, start + k, t) for r, tokens, start in feed for k, t in enumerate(tokens)]
        batch = ll.llama_batch_init(len(rows), 0, 1)
        try:
            for i, (r, pos, tok) in enumerate(rows):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                batch.seq_id[i][0], batch.logits[i] = r, True
            batch.n_tokens = len(rows)
            self.nodes.clear()
            code = ll.llama_decode(self.ctx, batch)
            self.reader.check()
            if code != 0:
                raise RuntimeError(f"llama_decode returned {code} at step {self.step}")
        finally:
            ll.llama_batch_free(batch)
        self.record(rows)
        if self.graphs is not None:
            self.graphs.append(list(self.nodes))
        n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        logits = np.ctypeslib.as_array(ll.llama_get_logits(self.ctx), shape=(len(rows), n_vocab)).copy()
        out, at = [], 0
        for _, tokens, _ in feed:
            out.append(logits[at : at + len(tokens)])
            at += len(tokens)
        self.step += 1
        return out

    def record(self, rows: list[tuple[int, int, int]]) -> None:
        """The nodes of this step's graph evaluations (one per ubatch, in batch order) -> tap records."""
        at = 0
        for nodes in ubatches(self.nodes):
            n = ubatch_tokens(nodes)
            part = rows[at : at + n]
            at += n
            for tap, x in graph_taps(nodes, n, self.head_dim, self.permuted).items():
                for r in sorted({q for q, _, _ in part}):
                    idx = [i for i, (q, _, _) in enumerate(part) if q == r]
                    self.records.append(tap_record(tap, self.step, r, [part[i][1] for i in idx], x[idx]))
        if at != len(rows):
            raise RuntimeError(f"graph evaluations covered {at} of {len(rows)} batch tokens at step {self.step}")

    def meta(self) -> dict:
        weights = {}
        if self.options.get("weights"):
            twin = twin_checkpoint(self.job.checkpoint, self.gguf_type)
            weights = {"weights": {"scheme": f"gguf-{self.gguf_type}", "checkpoint": str(twin)}}
        coarse = noise_dtype(self.options, self.job.spec.dtype)
        noise = {"noise_dtype": coarse} if coarse else {}
        return {
            **weights,
            **noise,
            "options": self.options,
            "source": library_file(),
            "gguf": str(self.gguf),
            "gguf_type": self.gguf_type,
            "steps": self.step,
            "teacher_forced": self.job.teacher is not None,
            **({"op_checks": self.reader.report()} if hasattr(self.reader, "report") else {}),
        }


def noise_dtype(options: dict, dtype: str) -> str | None:
    """The dtype whose harmless noise this configuration has, when coarser than the GGUF's own:
    quantized weights are multiplied by activations quantized to 8-bit blocks, a quantized K/V
    cache holds 8 bits or fewer (both as coarse as bfloat16); CPU flash attention casts K/V to f16
    and accumulates V·softmax in f16 over the whole context, so its error grows with the sequence
    (bug-free, F32, 274 tokens: 3.89x float16's floor, a false alarm a few tokens later): as coarse
    as bfloat16 too. An f16 cache under F32 weights rounds each K/V once: float16."""
    cache = options.get("cache_type", FLOAT_TYPES[dtype])
    if options.get("weights") or options.get("flash_attn") or cache not in ("f32", "f16"):
        return "bfloat16"
    if dtype == "float32" and cache == "f16":
        return "float16"
    return None


def check_window(config: dict, longest: int) -> None:
    """Refuse a sequence a sliding window would cut, on an arch whose llama.cpp graph has none: the rule is
    Capabilities.window_refusal's (the one preflight and the sweep apply), for a job that reached the worker
    without either."""
    engine = LlamaCppEngine()
    refusal = engine.capabilities().window_refusal(
        engine.name, config["model_type"], config.get("sliding_window"), longest
    )
    if refusal:
        raise ValueError(f"{refusal}: its output would differ from the reference for that reason alone")


def ubatches(nodes: list[GraphNode]) -> list[list[GraphNode]]:
    """The nodes read during one llama_decode -> one list per graph evaluation (each starts at its embedding)."""
    out: list[list[GraphNode]] = []
    for node in nodes:
        if node.name == EMBED_NODE or not out:
            out.append([])
        out[-1].append(node)
    return out


def ubatch_tokens(nodes: list[GraphNode]) -> int:
    """Tokens of one graph evaluation: the rows (ne[1]) of its embedding."""
    embed = next((n for n in nodes if n.name == EMBED_NODE), None)
    if embed is None:
        raise RuntimeError(f"a graph evaluation without {EMBED_NODE!r}: cannot tell its tokens")
    return embed.ne[1]


def log_softmax(x: np.ndarray) -> np.ndarray:
    # [V] -> [V], in float64
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())
