"""Benchmark cases on tinyserve's part-2 features (issues 1401-1404).

    python -m benchmark.authoring.tinyserve_part2 [CASE ...] [--cases-dir DIR]

One case per feature family: quantization (int4 group scales), spec-decode (KV rollback
after a rejected draft), parallelism (k/v shards under GQA at TP=2), tokenizer (incremental
detokenization at a multi-byte boundary). Each writes `benchmark/cases/<id>/` (case.toml,
issue.md, repro.toml, truth.toml) and regenerates `commits/*.patch` with
`benchmark.author.write_patches`, so it can be re-run whenever the subject changes. Every
edit is a (file, old_text, new_text) replacement against the subject's current source.
"""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.patches import Step

SUBJECT = "tinyserve"

QMM = "tinyserve/ops/quant_matmul.py"
QUANT = "tinyserve/quantization.py"
LINEAR = "tinyserve/layers/linear.py"
CONFIG = "tinyserve/config.py"
SPEC = "tinyserve/spec_decode/engine.py"
PROPOSERS = "tinyserve/spec_decode/proposers.py"
REJECTION = "tinyserve/spec_decode/rejection.py"
TP_LOADER = "tinyserve/distributed/loader.py"
TP_RUNNER = "tinyserve/distributed/runner.py"
TP_STATE = "tinyserve/distributed/parallel_state.py"
DETOK = "tinyserve/detokenizer.py"
TOKENIZER = "tinyserve/tokenizer.py"
ENGINE = "tinyserve/engine/llm_engine.py"
README = "README.md"

NADIA = "Nadia Rahman <nadia.rahman@fastmail.com>"
JONAS = "Jonas Berg <jonas.berg@posteo.de>"
MEI = "Mei Lin <mei.lin.dev@gmail.com>"
RAFAEL = "Rafael Costa <rcosta@tinyserve.dev>"
ANYA = "Anya Volkova <a.volkova@tinyserve.dev>"
TARIQ = "Tariq Haddad <tariq.haddad@outlook.com>"


def steps(dated: list[tuple[str, str, str, list]]) -> list[Step]:
    """[(date, author, message, edits)] -> Steps."""
    return [Step(message=m, author=a, date=d, edits=e) for d, a, m, e in dated]


def repro(arch: str, dtype: str, options: dict, requests: list[dict], good_ref: str | None = None) -> dict:
    data = {
        "model": {"arch": arch, "seed": 0},
        "target": {"engine": "tinyserve", "dtype": dtype, "options": options},
        "workload": {"requests": requests},
    }
    return {"good_ref": good_ref, **data} if good_ref else data


# ============================================================================= 1401 quantization


def case_int4_group_scales() -> CaseSpec:
    bug = [
        (
            QMM,
            """    # sum_k x_k (q_k - z) s = s * (x . q - z * sum_k x_k), per group
    xg = x.unflatten(-1, (-1, group_size))                                    # [T, G, g]
    qg = unpack_int4(qweight).to(x.dtype).unflatten(-1, (-1, group_size))     # [O, G, g]
    partial = torch.einsum("tgk,ogk->tog", xg, qg)                            # [T, O, G]
    shift = zero.to(x.dtype)[None] * xg.sum(-1)[:, None, :]                   # [T, O, G]
    return ((partial - shift) * scale.to(x.dtype)[None]).sum(-1)
""",
            """    # sum_k x_k (q_k - z) s = s * (x . q - z * sum_k x_k), per group. Group-major [T, G, O]
    # partials let the scales broadcast over tokens without a [T, O, G] copy of them.
    xg = x.unflatten(-1, (-1, group_size))                                    # [T, G, g]
    qg = unpack_int4(qweight).to(x.dtype).unflatten(-1, (-1, group_size))     # [O, G, g]
    s = scale.to(x.dtype).reshape(-1, qg.shape[0])                            # [G, O]
    z = zero.to(x.dtype).reshape(-1, qg.shape[0])                             # [G, O]
    partial = torch.einsum("tgk,ogk->tgo", xg, qg)                            # [T, G, O]
    return ((partial - z[None] * xg.sum(-1)[..., None]) * s[None]).sum(1)
""",
        )
    ]
    history = steps(
        [
            (
                "2025-04-02T10:14:08+02:00",
                MEI,
                "quant_matmul: document the nibble order of packed int4 weights",
                [
                    (
                        QMM,
                        "def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:\n",
                        "def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:\n"
                        "    # low nibble = even input column, high nibble = odd one (tinyserve.quantization packs it so)\n",
                    )
                ],
            ),
            (
                "2025-04-04T16:40:51+02:00",
                RAFAEL,
                "quantization: QuantizedWeight reports its bit width",
                [
                    (
                        QUANT,
                        "    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:\n",
                        "    @property\n    def bits(self) -> int:\n        return 8 if self.zero is None else 4\n\n"
                        "    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:\n",
                    )
                ],
            ),
            (
                "2025-04-09T09:05:33+00:00",
                JONAS,
                "quant_matmul: dequantize_weight is also what a reference loads",
                [
                    (
                        QMM,
                        '''    """-> float32 weight [O, I]."""''',
                        '''    """-> float32 weight [O, I]: the weights a reference checkpoint must hold to match this engine."""''',
                    )
                ],
            ),
            (
                "2025-04-11T14:22:17+02:00",
                MEI,
                "quant_matmul: int4 partials group-major\n\nThe scales now broadcast over tokens directly; saves the "
                "[T, O, G] shift temporary on long prefills.",
                bug,
            ),
            (
                "2025-04-15T11:48:02+00:00",
                TARIQ,
                "linear: show the quantization scheme in the module repr",
                [
                    (
                        LINEAR,
                        "    def shard_offset(self, shard_id: int) -> tuple[int, int]:\n",
                        "    def extra_repr(self) -> str:\n"
                        '        scheme = "" if self.quant is None else f", int{self.quant.bits}"\n'
                        '        return f"in={self.input_size}, out={self.output_sizes}{scheme}"\n\n'
                        "    def shard_offset(self, shard_id: int) -> tuple[int, int]:\n",
                    )
                ],
            ),
            (
                "2025-04-18T17:30:45+02:00",
                RAFAEL,
                "quant_matmul: reject activations whose width does not match the weight",
                [
                    (
                        QMM,
                        "    # [T, I] -> [T, O]; accumulates in fp32 (or wider), casts back to x's dtype\n",
                        "    # [T, I] -> [T, O]; accumulates in fp32 (or wider), casts back to x's dtype\n"
                        "    in_features = qweight.shape[-1] * (2 if zero is not None else 1)\n"
                        "    if x.shape[-1] != in_features:\n"
                        '        raise ValueError(f"activation width {x.shape[-1]} != weight input features {in_features}")\n',
                    )
                ],
            ),
            (
                "2025-04-23T10:02:19+00:00",
                JONAS,
                "README: int4 group size trade-off",
                [
                    (
                        README,
                        "Quantized layers multiply through the `dequant_matmul` kernel",
                        "Smaller int4 groups track the weights more closely at the cost of more scales (one fp32\n"
                        "scale and one zero point per group and output channel).\n\n"
                        "Quantized layers multiply through the `dequant_matmul` kernel",
                    )
                ],
            ),
        ]
    )
    reqs = [
        {
            "prompt_ids": [12, 87, 301, 45, 9, 230, 118, 64, 77, 402, 15, 290, 33, 150],
            "max_tokens": 8,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        }
    ]
    return CaseSpec(
        subject=SUBJECT,
        id="ts-int4-group-scales",
        issue_number=1401,
        category="quantization",
        modeled_on=["ModelCloud/GPTQModel#2350", "ggerganov/llama.cpp#8311"],
        title="int4 weight-only quantization far off its dequantized reference; int8 fine",
        issue=issue_text("ts-int4-group-scales"),
        repro=repro("llama", "float32", {"quantization": "int4"}, reqs, good_ref="HEAD~4"),
        truth_file=QMM,
        truth_function="_int4_matmul",
        component="quantization",
        mechanism="int4 scales/zero points [O, G] reshaped to [G, O] instead of transposed, so with more "
        "than one group per row each group is scaled by another channel's scale",
        steps=history,
        bug_index=4,
    )


# ============================================================================= 1402 spec-decode


def case_spec_rollback_partial_block() -> CaseSpec:
    bug = [
        (
            SPEC,
            '''    """Give back the blocks past the first `num_tokens` tokens (they held rejected drafts only)."""
    keep = -(-num_tokens // block_manager.block_size)
''',
            '''    """Give back the blocks past the first `num_tokens` tokens (they held rejected drafts only)."""
    keep = num_tokens // block_manager.block_size       # whole blocks of accepted tokens stay
''',
        )
    ]
    history = steps(
        [
            (
                "2025-05-06T09:12:40+00:00",
                ANYA,
                "spec_decode: acceptance-rate statistic",
                [
                    (
                        SPEC,
                        "    def step(self) -> list[RequestOutput]:\n",
                        "    @property\n    def acceptance_rate(self) -> float:\n"
                        "        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0\n\n"
                        "    def step(self) -> list[RequestOutput]:\n",
                    )
                ],
            ),
            (
                "2025-05-08T15:31:02+02:00",
                TARIQ,
                "proposers: note why n-gram proposals need no probabilities",
                [
                    (
                        PROPOSERS,
                        "class NgramProposer:\n",
                        'class NgramProposer:\n    """Prompt lookup: proposals are copied context, a point mass for the rejection sampler."""\n\n',
                    )
                ],
            ),
            (
                "2025-05-12T11:20:13+00:00",
                ANYA,
                "spec_decode: free whole blocks of rejected drafts on rollback\n\nOnly blocks past the accepted tokens go "
                "back to the pool; simpler bound than before.",
                bug,
            ),
            (
                "2025-05-14T18:03:55+02:00",
                NADIA,
                "spec_decode: explain the draft budget caps",
                [
                    (
                        SPEC,
                        "        if seq.forced_token_ids is not None or seq.num_uncomputed_tokens != 1:\n",
                        "        # teacher-forced sequences and unfinished prefills verify nothing\n"
                        "        if seq.forced_token_ids is not None or seq.num_uncomputed_tokens != 1:\n",
                    )
                ],
            ),
            (
                "2025-05-19T10:47:26+00:00",
                RAFAEL,
                "rejection: name the residual distribution in a comment",
                [
                    (
                        REJECTION,
                        "    residual = probs.clone()\n",
                        "    # the residual max(p - q, 0) with q a point mass at the draft: p without the draft\n"
                        "    residual = probs.clone()\n",
                    )
                ],
            ),
            (
                "2025-05-21T13:09:38+02:00",
                NADIA,
                "engine: abort_request",
                [
                    (
                        ENGINE,
                        "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n",
                        "    def has_unfinished_requests(self) -> bool:\n        return self.scheduler.has_unfinished()\n\n"
                        "    def abort_request(self, request_id: str) -> bool:\n"
                        '        """Finish a running request now (its blocks go back to the pool); -> whether it was running."""\n'
                        "        for seq in list(self.scheduler.running):\n"
                        "            if seq.request_id == request_id:\n"
                        '                self.scheduler.finish(seq, "abort")\n'
                        "                return True\n"
                        "        return False\n",
                    )
                ],
            ),
            (
                "2025-05-26T09:58:11+00:00",
                TARIQ,
                "spec_decode: docstring for verification_rows' ordering",
                [
                    (
                        SPEC,
                        '    sequence. -> (rows, scheduled-sequence index per row, draft verified per row or -1)."""\n',
                        '    sequence, in batch order. -> (rows, scheduled-sequence index per row, draft verified per row or -1)."""\n',
                    )
                ],
            ),
        ]
    )
    loop = [104, 23, 87, 311, 56, 9]
    reqs = [
        {"prompt_ids": loop * 4 + [104, 23], "max_tokens": 16, "sampling": {"temperature": 0.0, "ignore_eos": True}},
        {
            "prompt_ids": [200, 31, 200, 31, 200, 31, 7, 200],
            "max_tokens": 12,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
    ]
    return CaseSpec(
        subject=SUBJECT,
        id="ts-spec-rollback-partial-block",
        issue_number=1402,
        category="spec-decode",
        modeled_on=["sgl-project/sglang#24175", "vllm-project/vllm#36580"],
        title="Greedy output changes when n-gram speculative decoding is on",
        issue=issue_text("ts-spec-rollback-partial-block"),
        repro=repro("llama", "float32", {"speculative": "ngram", "num_speculative_tokens": 3, "block_size": 4}, reqs),
        truth_file=SPEC,
        truth_function="free_tail_blocks",
        component="kv-cache",
        mechanism="rollback after a rejected draft keeps floor(num_tokens / block_size) blocks, freeing the "
        "partly filled block that still holds accepted tokens' KV",
        steps=history,
        bug_index=3,
    )


# ============================================================================= 1403 parallelism


def case_tp_gqa_kv_shard() -> CaseSpec:
    feature = [
        (
            CONFIG,
            """        for what, n in (("num_attention_heads", cfg.num_attention_heads), ("num_key_value_heads",
                        cfg.num_key_value_heads), ("intermediate_size", cfg.intermediate_size),
                        ("vocab_size", cfg.vocab_size)):
            if n % tp:
                raise ValueError(f"tensor_parallel_size {tp} does not divide {what} ({n})")
""",
            """        for what, n in (("num_attention_heads", cfg.num_attention_heads),
                        ("intermediate_size", cfg.intermediate_size), ("vocab_size", cfg.vocab_size)):
            if n % tp:
                raise ValueError(f"tensor_parallel_size {tp} does not divide {what} ({n})")
        kvh = cfg.num_key_value_heads
        if kvh % tp and tp % kvh:   # fewer KV heads than ranks is fine when they replicate evenly
            raise ValueError(f"tensor_parallel_size {tp} and num_key_value_heads {kvh}: one must divide the other")
""",
        ),
        (
            TP_LOADER,
            """    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=cfg.num_key_value_heads // tp,""",
            """    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=max(1, cfg.num_key_value_heads // tp),""",
        ),
        (
            TP_LOADER,
            '''def shard_tensor(name: str, tensor: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """A checkpoint tensor -> this rank's part of it (see the module docstring)."""
    module = name.split(".")[-2]
    if module in COLUMN_PARALLEL or module in VOCAB_PARALLEL:''',
            '''def shard_tensor(name: str, tensor: torch.Tensor, rank: int, tp: int, cfg: ModelConfig) -> torch.Tensor:
    """A checkpoint tensor -> this rank's part of it (see the module docstring)."""
    module = name.split(".")[-2]
    if module in KV_PROJ:
        # a rank's query heads are r*H/tp..; the KV heads they read start at that head's group.
        # With fewer KV heads than ranks each rank keeps a copy of its one KV head.
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        per_rank = max(1, kv_heads // tp)
        first = rank * per_rank // (heads // kv_heads)
        return torch.cat(tensor.chunk(kv_heads, dim=0)[first:first + per_rank])
    if module in COLUMN_PARALLEL or module in VOCAB_PARALLEL:''',
        ),
        (
            TP_LOADER,
            """COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")""",
            """COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
KV_PROJ = ("k_proj", "v_proj")""",
        ),
        (
            TP_LOADER,
            """def load_sharded_weights(model: nn.Module, model_dir, rank: int, tp: int) -> None:""",
            """def load_sharded_weights(model: nn.Module, model_dir, rank: int, tp: int, full: ModelConfig) -> None:""",
        ),
        (
            TP_LOADER,
            """        part = shard_tensor(name, tensor, rank, tp)""",
            """        part = shard_tensor(name, tensor, rank, tp, full)""",
        ),
        (
            TP_LOADER,
            """    load_sharded_weights(model, config.model, rank, tp)""",
            """    load_sharded_weights(model, config.model, rank, tp, config.model_config)""",
        ),
    ]
    history = steps(
        [
            (
                "2025-06-03T10:31:27+00:00",
                JONAS,
                "parallel_state: is_driver helper",
                [
                    (
                        TP_STATE,
                        "def get_tp_size() -> int:\n    return _world\n",
                        "def get_tp_size() -> int:\n    return _world\n\n\ndef is_driver() -> bool:\n"
                        '    """Rank 0 schedules and samples; the other ranks only follow."""\n    return _rank == 0\n',
                    )
                ],
            ),
            (
                "2025-06-05T14:12:50+02:00",
                MEI,
                "tp loader: comment on vocab shards and tied heads",
                [
                    (
                        TP_LOADER,
                        '''    """Swap in the collective-aware layer classes; vocabulary tables shrink to this rank's rows."""''',
                        '''    """Swap in the collective-aware layer classes; vocabulary tables shrink to this rank's rows.
    A tied LM head is the embedding module itself, so it is resized once."""''',
                    )
                ],
            ),
            (
                "2025-06-10T09:44:03+00:00",
                RAFAEL,
                "tensor parallel: allow fewer KV heads than ranks\n\nMQA-style checkpoints (num_key_value_heads < tp) "
                "now load: each rank keeps a copy of the KV head its query heads use.",
                feature,
            ),
            (
                "2025-06-12T16:25:39+02:00",
                ANYA,
                "tp runner: world_size property",
                [
                    (
                        TP_RUNNER,
                        "    def allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:\n",
                        "    @property\n    def world_size(self) -> int:\n        return self.config.tensor_parallel_size\n\n"
                        "    def allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:\n",
                    )
                ],
            ),
            (
                "2025-06-17T11:05:12+00:00",
                JONAS,
                "tp loader: every rank reads the whole checkpoint",
                [
                    (
                        TP_LOADER,
                        "    params = dict(model.named_parameters())\n    loaded = set()\n",
                        "    # every rank reads every tensor and keeps its slice: simple, and the models here are small\n"
                        "    params = dict(model.named_parameters())\n    loaded = set()\n",
                    )
                ],
            ),
            (
                "2025-06-19T15:37:58+02:00",
                MEI,
                "tp loader: shard_config docstring",
                [
                    (
                        TP_LOADER,
                        "def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:\n",
                        "def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:\n"
                        '    """The config one rank\'s model is built from: its share of heads and MLP channels."""\n',
                    )
                ],
            ),
            (
                "2025-06-24T10:20:44+00:00",
                TARIQ,
                "README: tensor-parallel head layout",
                [
                    (
                        README,
                        "Quantized layers multiply through the `dequant_matmul` kernel",
                        "Under tensor parallelism rank r holds query heads r*H/tp.. and the KV heads they read.\n\n"
                        "Quantized layers multiply through the `dequant_matmul` kernel",
                    )
                ],
            ),
        ]
    )
    reqs = [
        {
            "prompt_ids": [15, 240, 88, 301, 7, 412, 66, 19, 250, 133, 91, 45],
            "max_tokens": 6,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        }
    ]
    return CaseSpec(
        subject=SUBJECT,
        id="ts-tp-gqa-kv-shard",
        issue_number=1403,
        category="parallelism",
        modeled_on=["vllm-project/vllm#3775", "vllm-project/vllm#2760"],
        title="TP=2 output differs from TP=1 on GQA checkpoints",
        issue=issue_text("ts-tp-gqa-kv-shard"),
        repro=repro("llama", "float32", {"tensor_parallel_size": 2}, reqs, good_ref="HEAD~5"),
        truth_file=TP_LOADER,
        truth_function="shard_tensor",
        component="parallelism",
        mechanism="k/v shard start computed as rank * per_rank // group_size, so with GQA (group > 1) "
        "rank 1 loads KV head 0 instead of head 1",
        steps=history,
        bug_index=3,
    )


# ============================================================================= 1404 tokenizer


def case_detok_multibyte() -> CaseSpec:
    bug = [
        (
            DETOK,
            """    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text = decode(ids[prefix_offset:])
    if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
        return new_text[len(prefix_text):], read_offset, len(ids)
    return "", prefix_offset, read_offset
""",
            """    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text = decode(ids[prefix_offset:])
    if new_text.endswith(REPLACEMENT_CHAR):
        # stream what is complete now instead of stalling until the character finishes
        new_text = new_text.rstrip(REPLACEMENT_CHAR)
    if len(new_text) > len(prefix_text):
        return new_text[len(prefix_text):], read_offset, len(ids)
    return "", prefix_offset, read_offset
""",
        )
    ]
    history = steps(
        [
            (
                "2025-07-01T09:15:22+00:00",
                NADIA,
                "tokenizer: vocab_size property",
                [
                    (
                        TOKENIZER,
                        "    def encode(self, text: str) -> list[int]:\n",
                        "    @property\n    def vocab_size(self) -> int:\n        return self._tok.get_vocab_size()\n\n"
                        "    def encode(self, text: str) -> list[int]:\n",
                    )
                ],
            ),
            (
                "2025-07-03T13:42:10+02:00",
                TARIQ,
                "detokenizer: document take_delta's holdback",
                [
                    (
                        DETOK,
                        '''        """Text not yet streamed, keeping the last `holdback` characters back (a stop string may still
        match there and cut them) until the sequence finishes."""''',
                        '''        """Text not yet streamed, keeping the last `holdback` characters back (a stop string may still
        match there and cut them) until the sequence finishes. holdback is the longest stop string
        minus one: a match needs at least one new character."""''',
                    )
                ],
            ),
            (
                "2025-07-07T10:08:51+00:00",
                MEI,
                "detokenizer: take_touched docstring",
                [
                    (
                        DETOK,
                        "    def take_touched(self) -> list:\n",
                        '    def take_touched(self) -> list:\n        """Sequences whose text may have grown since the last call (streaming only)."""\n',
                    )
                ],
            ),
            (
                "2025-07-09T16:55:03+02:00",
                NADIA,
                "detokenizer: stream complete text sooner\n\nA token that ends in the "
                "middle of a character no longer holds back the characters before it.",
                bug,
            ),
            (
                "2025-07-14T11:27:36+00:00",
                RAFAEL,
                "detokenizer: DetokState field comments",
                [
                    (
                        DETOK,
                        "    prefix_offset: int = 0\n    read_offset: int = 0\n",
                        "    prefix_offset: int = 0      # first token of the window decoded for context\n"
                        "    read_offset: int = 0        # first token whose text was not emitted yet\n",
                    )
                ],
            ),
            (
                "2025-07-16T14:03:29+02:00",
                TARIQ,
                "tokenizer: decode docstring",
                [
                    (
                        TOKENIZER,
                        "    def decode(self, token_ids: list[int]) -> str:\n",
                        "    def decode(self, token_ids: list[int]) -> str:\n"
                        '        """Special tokens are left out (as serving APIs do by default)."""\n',
                    )
                ],
            ),
            (
                "2025-07-22T09:49:12+00:00",
                MEI,
                "README: streaming example",
                [
                    (
                        README,
                        "`LLMEngine.stream_step()` returns, per request that produced text,",
                        'Streaming: `for out in engine.stream_step(): print(out.delta, end="")`.\n\n'
                        "`LLMEngine.stream_step()` returns, per request that produced text,",
                    )
                ],
            ),
        ]
    )
    reqs = [
        {
            "prompt": "Héllo wörld, naïve café, 東京 and Straße are written with multi-byte characters.",
            "max_tokens": 24,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
        {
            "prompt_ids": [411, 398, 391, 98, 122, 74, 174, 105, 171, 301, 26, 69],
            "max_tokens": 24,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
        {
            "prompt_ids": [176, 166, 277, 412, 329, 377, 292, 31, 418, 243, 99, 497],
            "max_tokens": 24,
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
    ]
    return CaseSpec(
        subject=SUBJECT,
        id="ts-detok-multibyte",
        issue_number=1404,
        category="tokenizer",
        modeled_on=["vllm-project/vllm#8627", "NVIDIA/TensorRT-LLM#14312"],
        title="Returned text drops characters at multi-byte boundaries; token ids are right",
        issue=issue_text("ts-detok-multibyte"),
        repro=repro("llama", "float32", {}, reqs),
        truth_file=DETOK,
        truth_function="decode_increment",
        component="tokenizer",
        mechanism="incomplete trailing characters are stripped and the read offset advanced past their "
        "bytes, so the character they start is never emitted",
        steps=history,
        bug_index=4,
    )


CASES = [
    case_int4_group_scales(),
    case_spec_rollback_partial_block(),
    case_tp_gqa_kv_shard(),
    case_detok_multibyte(),
]
