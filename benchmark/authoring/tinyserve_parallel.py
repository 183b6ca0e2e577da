"""tinyserve cases: tensor parallelism shards (parallelism)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.tinyserve_history import (
    ANYA,
    CONFIG,
    JONAS_BERG,
    MEI_LIN,
    RAFAEL_COSTA,
    README,
    SUBJECT,
    TARIQ,
    TP_LOADER,
    TP_RUNNER,
    TP_STATE,
    dated_steps,
    tinyserve_repro,
)


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
    history = dated_steps(
        [
            (
                "2025-06-03T10:31:27+00:00",
                JONAS_BERG,
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
                MEI_LIN,
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
                RAFAEL_COSTA,
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
                JONAS_BERG,
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
                MEI_LIN,
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
        repro=tinyserve_repro("llama", "float32", {"tensor_parallel_size": 2}, reqs, good_ref="HEAD~5"),
        truth_file=TP_LOADER,
        truth_function="shard_tensor",
        component="parallelism",
        mechanism="k/v shard start computed as rank * per_rank // group_size, so with GQA (group > 1) "
        "rank 1 loads KV head 0 instead of head 1",
        steps=history,
        bug_index=3,
    )


CASES = [
    case_tp_gqa_kv_shard(),
]
