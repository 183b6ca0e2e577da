"""tinyserve cases: int4/int8 weight-only quantization (quantization)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text
from benchmark.authoring.tinyserve_history import (
    JONAS_BERG,
    LINEAR,
    MEI_LIN,
    QMM,
    QUANT,
    RAFAEL_COSTA,
    README,
    SUBJECT,
    TARIQ,
    dated_steps,
    tinyserve_repro,
)


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
    history = dated_steps(
        [
            (
                "2025-04-02T10:14:08+02:00",
                MEI_LIN,
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
                RAFAEL_COSTA,
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
                JONAS_BERG,
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
                MEI_LIN,
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
                RAFAEL_COSTA,
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
                JONAS_BERG,
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
        repro=tinyserve_repro("llama", "float32", {"quantization": "int4"}, reqs, good_ref="HEAD~4"),
        truth_file=QMM,
        truth_function="_int4_matmul",
        component="quantization",
        mechanism="int4 scales/zero points [O, G] reshaped to [G, O] instead of transposed, so with more "
        "than one group per row each group is scaled by another channel's scale",
        steps=history,
        bug_index=4,
    )


CASES = [
    case_int4_group_scales(),
]
