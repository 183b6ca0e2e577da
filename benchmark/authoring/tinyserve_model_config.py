"""tinyserve cases: per-architecture config handling (model-config)."""

from __future__ import annotations

from benchmark.authoring.common import CaseSpec, issue_text, repro_toml
from benchmark.authoring.tinyserve_history import (
    ARJUN,
    CLAIRE,
    CONFIG,
    FATIMA,
    GEMMA2,
    GREEDY,
    HYEJIN,
    IGOR,
    JONAS,
    LUCIA,
    MEI,
    NADIA,
    OWEN,
    RAFAEL,
    SUBJECT,
    SVEN,
    d_bm_usage_v2,
    d_config_dtype_alias,
    d_config_max_num_seqs,
    d_embed_doc,
    d_engine_abort_v2,
    d_fwd_doc,
    d_llama_doc,
    d_llm_doc_v2,
    d_params_penalty_range,
    d_readme_native,
    d_rope_error,
    d_sched_counts,
    d_seq_repr_v2,
    d_test_config,
    d_test_kernels,
    d_tokenizer_vocab_v2,
    good_ref_before,
    history_hourly,
    prompt,
)


def case_mistral_window_dropped() -> CaseSpec:
    bug = [
        (
            CONFIG,
            "    if types is None:\n        return [window] * n\n",
            "    if types is None:\n"
            "        # qwen2-style configs carry a sliding_window they only honour with use_sliding_window\n"
            '        return [window if hf.get("use_sliding_window") else None] * n\n',
        )
    ]
    entries = [
        (OWEN, "sampling_params: validate presence/frequency penalty range", d_params_penalty_range()),
        (CLAIRE, "config: accept dtype aliases (bf16, fp32, half)", d_config_dtype_alias()),
        (
            ARJUN,
            "config: respect use_sliding_window\n\n"
            "Qwen2 checkpoints ship sliding_window (e.g. 32768 or 131072) together with\n"
            "use_sliding_window=false; only apply the window when the config asks for it.",
            bug,
        ),
        (HYEJIN, "llm: document per-prompt sampling params", d_llm_doc_v2()),
        (SVEN, "tests: config parsing", d_test_config()),
        (FATIMA, "block_manager: add usage property", d_bm_usage_v2()),
        (RAFAEL, "forward_context: note that it is only valid inside a forward", d_fwd_doc()),
    ]
    steps, bug_index = history_hourly("2026-01-12", 1210, entries), 3
    return CaseSpec(
        subject=SUBJECT,
        id="ts-mistral-window-dropped",
        issue_number=1210,
        category="model-config",
        modeled_on=["vllm-project/vllm#5908", "sgl-project/sglang#4823"],
        title="Mistral-style model: outputs diverge from HF once prompt + output exceed the sliding window",
        issue=issue_text("ts-mistral-window-dropped"),
        repro=repro_toml(
            {"arch": "mistral", "seed": 10},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1210, 50), "max_tokens": 8, "sampling": GREEDY}],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=CONFIG,
        truth_function="sliding_windows",
        component="config",
        mechanism="configs without layer_types get a sliding window only when use_sliding_window is set, which "
        "mistral configs never carry, so mistral runs full attention",
        steps=steps,
        bug_index=bug_index,
    )


def case_gemma2_query_scale() -> CaseSpec:
    bug = [
        (
            GEMMA2,
            "        scale = cfg.query_pre_attn_scalar ** -0.5\n"
            "        self.self_attn = LlamaAttention(cfg, layer_idx, kernels, max_model_len, scale=scale)\n",
            "        # Gemma 2 scales queries by head_dim ** -0.5 like Llama: use LlamaAttention's default\n"
            "        self.self_attn = LlamaAttention(cfg, layer_idx, kernels, max_model_len)\n",
        )
    ]
    entries = [
        (MEI, "gemma2: use the default attention scale", bug),
        (LUCIA, "models/llama: document per-arch differences", d_llama_doc()),
        (OWEN, "rope: name the rope parameters in the unsupported-type error", d_rope_error()),
        (JONAS, "scheduler: expose num_waiting / num_running for metrics", d_sched_counts()),
        (NADIA, "docs: how to rule out the optimized kernels", d_readme_native()),
        (IGOR, "tests: kernel twins agree on small inputs", d_test_kernels()),
    ]
    steps = history_hourly("2026-02-09", 1211, entries)
    return CaseSpec(
        subject=SUBJECT,
        id="ts-gemma2-query-scale",
        issue_number=1211,
        category="model-config",
        modeled_on=["ggml-org/llama.cpp#8197", "ggml-org/llama.cpp#8240"],
        title="Gemma 2 variant with query_pre_attn_scalar != head_dim produces different logits than transformers",
        issue=issue_text("ts-gemma2-query-scale"),
        repro=repro_toml(
            {"arch": "gemma2", "seed": 11, "query_pre_attn_scalar": 32},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1211, 24), "max_tokens": 8, "sampling": GREEDY}],
        ),
        truth_file=GEMMA2,
        truth_function="Gemma2DecoderLayer.__init__",
        component="gemma2",
        mechanism="gemma2 attention uses head_dim ** -0.5 instead of query_pre_attn_scalar ** -0.5",
        steps=steps,
        bug_index=1,
    )


def case_rope_theta_legacy() -> CaseSpec:
    bug = [
        (
            CONFIG,
            '    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))\n',
            "    # legacy exports keep rope_theta at the top level next to rope_scaling: that one wins\n"
            '    params["rope_theta"] = hf.get("rope_theta", 10000.0)\n',
        )
    ]
    entries = [
        (HYEJIN, "tokenizer: vocab_size property", d_tokenizer_vocab_v2()),
        (ARJUN, "embedding: note on padded vocab rows", d_embed_doc()),
        (SVEN, "engine: add abort_request()", d_engine_abort_v2()),
        (
            RAFAEL,
            "config: top-level rope_theta takes precedence\n\n"
            "Some converted checkpoints carry both a top-level rope_theta and a stale value in\n"
            "rope_scaling; transformers 4.x read the top-level one.",
            bug,
        ),
        (CLAIRE, "config: validate max_num_seqs", d_config_max_num_seqs()),
        (MEI, "sequence: readable repr", d_seq_repr_v2()),
    ]
    steps, bug_index = history_hourly("2026-03-16", 1212, entries), 4
    return CaseSpec(
        subject=SUBJECT,
        id="ts-rope-theta-legacy",
        issue_number=1212,
        category="model-config",
        modeled_on=["unslothai/unsloth#6197", "ggml-org/llama.cpp#24823"],
        title="Qwen2 checkpoint (rope_theta 1e6) diverges from transformers; rope_theta 10000 models are fine",
        issue=issue_text("ts-rope-theta-legacy"),
        repro=repro_toml(
            {"arch": "qwen2", "seed": 12, "rope_theta": 1000000.0},
            {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16}},
            [{"prompt_ids": prompt(1212, 30), "max_tokens": 8, "sampling": GREEDY}],
            good_ref=good_ref_before(len(entries), bug_index),
        ),
        truth_file=CONFIG,
        truth_function="rope_parameters",
        component="config",
        mechanism="rope_theta taken from the top-level config key (default 10000) over rope_parameters, so a "
        "transformers-5 config's rope_theta is ignored",
        steps=steps,
        bug_index=bug_index,
    )


CASES = [
    case_mistral_window_dropped(),
    case_gemma2_query_scale(),
    case_rope_theta_legacy(),
]
