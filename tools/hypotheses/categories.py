"""The bug categories (docs/design.md §6): a case's `category`, a hypothesis's. The one definition;
no imports, so the benchmark's case loader reads it without loading torch."""

CATEGORIES = (
    "numerics",
    "quantization",
    "attention",
    "positional-encoding",
    "kv-cache",
    "batching",
    "sampling",
    "parallelism",
    "kernel",
    "model-config",
    "tokenizer",
    "spec-decode",
    "compilation",
)
