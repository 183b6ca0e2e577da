"""A second held-out set of bugs at base on tinyserve (issues 2501-2504; DESIGN §6b "Bug at base").

    python -m benchmark.author ts-base-window-first-tile ...

Same shape as tinyserve_atbase_heldout: each bug is folded into the `base` commit
(`commits/00-base-<slug>.patch`), so no commit introduces it and there is no good ref; the history after
base is the 10+ distractor commits that touch the faulty component's file
(benchmark/authoring/atbase_data/distractors.py). Four categories: attention, positional-encoding,
sampling, numerics. Each is modelled on an upstream silent bug; the issue texts
(benchmark/authoring/issues/<id>.md) say it has never worked for the reporter.
"""

from __future__ import annotations

from benchmark.authoring.atbase_data import distractors as d
from benchmark.authoring.tinyserve_atbase import AtBaseCase, greedy, scenario

CASES = [
    AtBaseCase(
        id="ts-base-window-first-tile",
        issue_number=2501,
        category="attention",
        modeled_on=["flashinfer-ai/flashinfer#4401", "flagos-ai/FlagAttention#25", "ROCm/aiter#723"],
        title="Mistral: prompts longer than about twice the sliding window have never produced sane output",
        bug_message="ops: paged attention kernels",
        bug=[(d.ATTN, "        correction = torch.exp(m - m_safe)\n", "        correction = torch.exp(m - m_new)\n")],
        files=[d.ATTN],
        repro=scenario({"arch": "mistral", "seed": 2501}, [greedy(2501, 80, 8)]),
        truth_file=d.ATTN,
        truth_function="paged_attention_prefill",
        component="attention",
        mechanism="the online-softmax rescale factor is exp(m - m_new) instead of exp(m - m_safe): for a query whose "
        "every key in the first visited tile lies outside its sliding window both maxima are -inf, the factor is "
        "NaN and the row's output becomes NaN",
    ),
    AtBaseCase(
        id="ts-base-yarn-ramp-reversed",
        issue_number=2502,
        category="positional-encoding",
        modeled_on=["jquesnelle/yarn#24", "mlx-node/mlx-node#60", "paiml/aprender#2161"],
        title="YaRN-scaled checkpoints have never matched transformers, from the first tokens on",
        bug_message="layers: rotary embedding and its scaling variants",
        bug=[
            (
                d.ROPE,
                "    extrapolation_weight = 1 - ramp\n",
                "    extrapolation_weight = ramp   # how far along the ramp a dimension is\n",
            )
        ],
        files=[d.ROPE],
        repro=scenario(
            {
                "arch": "llama",
                "seed": 2502,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "rope_theta": 10000.0,
                    "original_max_position_embeddings": 256,
                },
            },
            [greedy(2502, 32, 8)],
        ),
        truth_file=d.ROPE,
        truth_function="yarn_inv_freq",
        component="rotary_embedding",
        mechanism="the YaRN blend weights are reversed: the high-frequency dimensions (ramp 0) are divided by the "
        "scaling factor and the low-frequency ones (ramp 1) keep their original frequency, the opposite of "
        "extrapolating the fast dimensions and interpolating the slow ones",
    ),
    AtBaseCase(
        id="ts-base-repetition-prompt-free",
        issue_number=2503,
        category="sampling",
        modeled_on=["PaddlePaddle/FastDeploy#2954", "vllm-project/vllm#1406", "huggingface/transformers#36642"],
        title="repetition_penalty has never given the same tokens as transformers' generate",
        bug_message="layers: batched sampler",
        bug=[
            (
                d.SAMPLER,
                "        seen = st.prompt_mask | (st.output_counts > 0)\n",
                "        seen = st.output_counts > 0    # tokens this request has produced\n",
            )
        ],
        files=[d.SAMPLER],
        repro=scenario(
            {"arch": "llama", "seed": 2503},
            [
                greedy(2503, 16, 16)
                | {"sampling": {"temperature": 0.0, "repetition_penalty": 1.3, "ignore_eos": True}},
            ],
        ),
        truth_file=d.SAMPLER,
        truth_function="LogitsAdjuster.apply_penalties",
        component="sampler",
        mechanism="the repetition penalty is applied only to tokens the request has generated, while the "
        "transformers definition (CTRL) penalises every token of the prompt and the output: prompt tokens keep "
        "their full logits",
    ),
    AtBaseCase(
        id="ts-base-norm-eps-outside",
        issue_number=2504,
        category="numerics",
        modeled_on=["fla-org/flash-linear-attention#508", "tile-ai/tilelang#1243", "NVIDIA/TransformerEngine#364"],
        title="A checkpoint with small-magnitude activations has never matched transformers",
        bug_message="ops: RMSNorm kernels",
        bug=[
            (
                d.NORM,
                "    inv_rms = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)\n",
                "    inv_rms = 1.0 / (xf.square().mean(-1, keepdim=True).sqrt() + eps)\n",
            )
        ],
        files=[d.NORM],
        repro=scenario(
            {"arch": "llama", "seed": 2504, "rms_norm_eps": 1e-5, "initializer_range": 0.002}, [greedy(2504, 14, 8)]
        ),
        truth_file=d.NORM,
        truth_function="rms_norm",
        component="norm",
        mechanism="the optimized RMSNorm adds eps to the root mean square instead of to the mean square "
        "(1 / (sqrt(ms) + eps) instead of 1 / sqrt(ms + eps)): rows whose mean square is comparable to eps are "
        "normalised by a very different factor",
    ),
]
