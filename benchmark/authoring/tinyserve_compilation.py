"""Compilation cases on tinyserve (issue 12 item 3): the compiled model forward diverges, the eager one does not.

    python -m benchmark.author ts-compile-stale-positions ts-compile-shared-window ts-compile-frozen-ntk

tinyserve's pristine snapshot has no torch.compile path, and changing it would change the subject's
fingerprint (every tinyserve case would need rebuilding). So each case here folds the compile path
into its own `base` (`commits/00-base-01-…patch`, `CaseSpec.base_steps`): `tinyserve/compilation.py`
plus the `compile*` options in `Config` and the compiled forward in `ModelRunner`. The history after
base is the shared hard-track stream (benchmark/authoring/tinyserve_stream.py, release tags v0.2.0 …)
with compile-path distractors and the case's culprit inserted, so these are "hard" cases: the culprit
sits 20+ commits after the `good_ref` tag, next to behaviour-changing and numerically equivalent
commits on the same file. Issue prose lives in benchmark/authoring/issues/<id>.md.
"""

from __future__ import annotations

from benchmark.authoring.common import repro_toml
from benchmark.authoring.patches import Step
from benchmark.authoring.tinyserve_hard import HardCase, greedy, stream_case
from benchmark.authoring.tinyserve_stream import CONFIG, ROPE, RUNNER, Commit

SUBJECT = "tinyserve"
COMPILATION = "tinyserve/compilation.py"

YUKI = "Yuki Sato <yuki.sato@inferlab.dev>"
PAVEL = "Pavel Novak <pnovak@posteo.de>"
AMARA = "Amara Obi <amara.obi@gmail.com>"
THEO = "Theo Martin <theo.martin@proton.me>"

# ----------------------------------------------------------------------------- the compile path (folded into base)

COMPILATION_PY = '''"""torch.compile for the model forward (Config.compile), in the manner of vLLM's compilation.

The model's forward is handed to `torch.compile` (inductor by default). Attention stays
eager: it reads the paged cache through the forward context and loops over sequences, so
it is an opaque splitting op in the graph (as vLLM's piecewise compile splits at attention);
everything between two attention calls - norms, projections, rotary, activation - is
compiled. Shapes are dynamic by default (`compile_dynamic`), so one graph serves every
number of scheduled tokens.

Forward hooks registered on submodules before the first forward are traced in: they run
at their module's boundary on the values the compiled code produced.
"""
from __future__ import annotations

import torch
from torch import nn

# Under compile these kernels run their native twin (plain torch ops inductor can fuse), as vLLM
# disables its custom ops under inductor; the optimized ones write in place, which the graph would
# have to functionalize. Attention and the int8/int4 matmul stay opaque kernels.
COMPILED_AS_NATIVE = ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul", "gelu_tanh_and_mul")
BACKENDS = ("inductor", "aot_eager", "eager")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def kernels_under_compile(native: tuple) -> tuple:
    """The native-kernel set a compiled model is built with."""
    return tuple(sorted(set(native) | set(COMPILED_AS_NATIVE)))


def check_compile_options(backend: str, mode: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"compile_backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if mode not in MODES:
        raise ValueError(f"compile_mode {mode!r} is not one of {', '.join(MODES)}")


def compile_model(model: nn.Module, backend: str, mode: str, dynamic: bool | None):
    """model -> a callable with the model's forward signature, compiled lazily on first call."""
    from tinyserve.layers.attention import Attention
    for module in model.modules():
        if isinstance(module, Attention):
            # opaque to the graph: it reads the paged cache through the forward context
            module.forward = torch.compiler.disable(module.forward)
    options = {"mode": mode} if backend == "inductor" and mode != "default" else {}
    return torch.compile(model, backend=backend, dynamic=dynamic, **options)
'''

COMPILE_OPTIONS = (
    "    compile: bool = False                    # run the model forward under torch.compile (tinyserve.compilation)\n"
    '    compile_backend: str = "inductor"        # torch.compile backend: inductor | aot_eager | eager\n'
    '    compile_mode: str = "default"            # torch.compile mode (inductor)\n'
    "    compile_dynamic: bool | None = True      # dynamic shapes: one graph for every number of scheduled tokens\n"
)
TP_OPTION = "    tensor_parallel_size: int = 1            # ranks (processes, gloo) the model is sharded over\n"
COMPILE_CALL = (
    "            self.forward = compile_model(self.model, config.compile_backend, config.compile_mode,\n"
    "                                         config.compile_dynamic)\n"
)

COMPILE_PATH = Step(
    "compile: optional torch.compile path for the model forward\n\n"
    "Config.compile hands the model forward to torch.compile (inductor by default); attention\n"
    "stays eager and the fusable kernels run their native twins. Off by default.",
    YUKI,
    "2025-01-27T10:14:05+00:00",
    [
        (COMPILATION, None, COMPILATION_PY),
        (CONFIG, TP_OPTION, TP_OPTION + COMPILE_OPTIONS),
        (
            CONFIG,
            "        self._check_tensor_parallel()\n\n",
            "        self._check_tensor_parallel()\n"
            "        if self.compile:\n"
            "            from tinyserve.compilation import check_compile_options, kernels_under_compile\n"
            "            check_compile_options(self.compile_backend, self.compile_mode)\n"
            "            self.native_kernels = kernels_under_compile(self.native_kernels)\n\n",
        ),
        (
            RUNNER,
            "        self.model = load_model(config)\n",
            "        self.model = load_model(config)\n"
            "        self.forward = self.model\n"
            "        if config.compile:\n"
            "            from tinyserve.compilation import compile_model\n" + COMPILE_CALL,
        ),
        (
            RUNNER,
            "            hidden = self.model(input_ids, ctx.positions)\n",
            "            hidden = self.forward(input_ids, ctx.positions)\n",
        ),
    ],
    slug="compile-path",
)

COMPILE_RETURN = "    return torch.compile(model, backend=backend, dynamic=dynamic, **options)\n"
OPAQUE_ATTENTION = "            module.forward = torch.compiler.disable(module.forward)\n"
INDUCTOR_OPTIONS = '    options = {"mode": mode} if backend == "inductor" and mode != "default" else {}\n'

# ----------------------------------------------------------------------------- compile-path distractors

DOC_MODES = Commit(
    "compilation: document the modes\n\nreduce-overhead and max-autotune only change anything on a GPU; say so.",
    PAVEL,
    [
        (
            COMPILATION,
            'MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")\n',
            "# reduce-overhead (CUDA graphs) and max-autotune only change anything on a GPU\n"
            'MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")\n',
        )
    ],
)
BACKEND_ERROR = Commit(
    "compilation: suggest the eager backend when a backend is unknown",
    YUKI,
    [
        (
            COMPILATION,
            "        raise ValueError(f\"compile_backend {backend!r} is not one of {', '.join(BACKENDS)}\")\n",
            "        raise ValueError(f\"compile_backend {backend!r} is not one of {', '.join(BACKENDS)} \"\n"
            '                         "(eager: dynamo only, to tell a tracing problem from a codegen one)")\n',
        )
    ],
)
# behaviour changes on another path: compile with speculative decoding is refused at start-up
NO_SPEC_COMPILE = Commit(
    "config: refuse compile with speculative decoding\n\nThe verifier runs the model eagerly anyway, and the draft "
    "model was compiled\nwith the target's options, which made the first step take minutes for nothing.",
    AMARA,
    [
        (
            CONFIG,
            '        if self.speculative == "draft" and not',
            "        if self.compile and self.speculative:\n"
            '            raise ValueError("compile is not supported with speculative decoding (the verifier runs eagerly)")\n'
            '        if self.speculative == "draft" and not',
        )
    ],
)
# on the failing path, no change in what runs
INDUCTOR_MODE = Commit(
    "compilation: spell out which backends take a mode",
    THEO,
    [
        (
            COMPILATION,
            INDUCTOR_OPTIONS,
            "    options = {}\n"
            '    if backend == "inductor" and mode != "default":\n'
            '        options["mode"] = mode  # aot_eager and eager have no modes\n',
        )
    ],
)
MODE_COMMENT = Commit(
    "config: compile_mode values",
    PAVEL,
    [
        (
            CONFIG,
            '    compile_mode: str = "default"            # torch.compile mode (inductor)\n',
            '    compile_mode: str = "default"            # torch.compile mode (inductor): default | reduce-overhead | '
            "max-autotune\n",
        )
    ],
)


def compile_inserts(culprit_at: int, culprit: Commit) -> dict[int, list[Commit]]:
    """Compile-path distractors around the culprit, keyed by stream position (v0.2.0 is stream commit 8);
    the equivalent refactor of compile_model lands three commits after the culprit."""
    inserts: dict[int, list[Commit]] = {}
    for at, commit in ((2, DOC_MODES), (12, BACKEND_ERROR), (17, NO_SPEC_COMPILE), (27, MODE_COMMENT)):
        inserts.setdefault(at, []).append(commit)
    inserts.setdefault(culprit_at, []).append(culprit)
    inserts.setdefault(culprit_at + 3, []).append(INDUCTOR_MODE)
    return inserts


# ----------------------------------------------------------------------------- culprits

STATIC_INPUTS = Commit(
    "compile: persistent input buffers for the compiled forward\n\n"
    "The compiled graph now always reads input_ids and positions from buffers allocated once,\n"
    "so its inputs keep their addresses from step to step (what inductor's cudagraph mode needs\n"
    "to replay without copies). Positions only change when the batch does, so they are copied\n"
    "when the number of scheduled tokens changes.",
    YUKI,
    [
        (
            COMPILATION,
            COMPILE_RETURN,
            COMPILE_RETURN
            + '''

class StaticInputForward:
    """A compiled forward behind persistent input buffers (as vLLM keeps them for CUDA graphs):
    each step's input_ids and positions are copied into buffers allocated once, and the graph
    runs on their first n rows."""

    def __init__(self, compiled, max_tokens: int):
        self.compiled = compiled
        self.input_ids = torch.zeros(max_tokens, dtype=torch.long)
        self.positions = torch.zeros(max_tokens, dtype=torch.long)
        self.num_tokens = 0

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids)
        if n != self.num_tokens:  # positions move with the batch
            self.positions[:n].copy_(positions)
            self.num_tokens = n
        return self.compiled(self.input_ids[:n], self.positions[:n])
''',
        ),
        (
            RUNNER,
            "            from tinyserve.compilation import compile_model\n" + COMPILE_CALL,
            "            from tinyserve.compilation import StaticInputForward, compile_model\n"
            "            compiled = compile_model(self.model, config.compile_backend, config.compile_mode,\n"
            "                                     config.compile_dynamic)\n"
            "            self.forward = StaticInputForward(compiled, config.max_num_batched_tokens)\n",
        ),
    ],
)

SHARE_LAYER_SETTINGS = Commit(
    "compile: one graph for all decoder layers\n\n"
    "Dynamo guards on each attention layer's scalar settings, so layers whose settings differ\n"
    "get their own graph and every step dispatches between them. The layers of one model share\n"
    "scale and soft-cap, and the window is applied by the attention kernel, outside the graph:\n"
    "give every layer the first layer's settings before compiling.",
    THEO,
    [
        (COMPILATION, OPAQUE_ATTENTION, OPAQUE_ATTENTION + "    share_layer_settings(model)\n"),
        (
            COMPILATION,
            COMPILE_RETURN,
            COMPILE_RETURN
            + '''

def share_layer_settings(model: nn.Module) -> None:
    """Every attention layer takes the first one's scalar settings, so that one graph serves all."""
    from tinyserve.layers.attention import Attention
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    for layer in layers[1:]:
        layer.scale, layer.softcap = layers[0].scale, layers[0].softcap
        layer.sliding_window = layers[0].sliding_window
''',
        ),
    ],
)

FREEZE_DYNAMIC_ROPE = Commit(
    "compile: no graph break in dynamic-NTK rotary\n\n"
    "Dynamic NTK picks its cos/sin table from the largest position of each forward, a\n"
    "data-dependent branch that breaks the graph in every layer. Under compile every forward now\n"
    "reads one table built for the longest sequence the engine admits (max_model_len), as vLLM's\n"
    "DynamicNTKScalingRotaryEmbedding does; the eager path is unchanged.",
    PAVEL,
    [
        (
            ROPE,
            "    def forward(self, positions, query, key):\n",
            "    def freeze(self, seq_len: int) -> None:\n"
            '        """Serve every forward from the table of a `seq_len`-token sequence (no per-forward branch)."""\n'
            "        self.cos_sin_cache = self.cache_for(torch.arange(seq_len))\n"
            "        self.is_dynamic = False\n\n"
            "    def forward(self, positions, query, key):\n",
        ),
        (
            COMPILATION,
            "def compile_model(model: nn.Module, backend: str, mode: str, dynamic: bool | None):\n",
            "def compile_model(model: nn.Module, backend: str, mode: str, dynamic: bool | None, max_len: int | None = None):\n",
        ),
        (COMPILATION, COMPILE_RETURN, "    freeze_dynamic_rope(model, max_len)\n" + COMPILE_RETURN),
        (
            COMPILATION,
            "def compile_model(",
            '''def freeze_dynamic_rope(model: nn.Module, max_len: int | None) -> None:
    """Dynamic-NTK rotary layers get one fixed table, built for the longest admitted sequence."""
    from tinyserve.layers.rotary_embedding import RotaryEmbedding
    for module in model.modules():
        if isinstance(module, RotaryEmbedding) and module.is_dynamic and max_len:
            module.freeze(max_len)


def compile_model(''',
        ),
        (
            RUNNER,
            COMPILE_CALL,
            "            self.forward = compile_model(self.model, config.compile_backend, config.compile_mode,\n"
            "                                         config.compile_dynamic, config.max_model_len)\n",
        ),
    ],
)


# ----------------------------------------------------------------------------- cases

# the reporters saw it with inductor; aot_eager (dynamo + AOT autograd, no codegen) shows the same and starts
# in seconds instead of minutes, so that is what their repro runs
COMPILED = {"compile": True, "compile_backend": "aot_eager"}


def compile_case(
    id: str,
    number: int,
    modeled_on: list[str],
    title: str,
    repro: str,
    truth: tuple[str, str, str],
    at: int,
    culprit: Commit,
) -> HardCase:
    file, function, mechanism = truth
    return stream_case(
        id, number, "compilation", modeled_on, title, repro, (file, function, "compilation", mechanism),
        compile_inserts(at, culprit), culprit, base_steps=(COMPILE_PATH,),
    )  # fmt: skip


def stale_positions() -> HardCase:
    target = {"engine": "tinyserve", "dtype": "float32", "options": COMPILED}
    return compile_case(
        "ts-compile-stale-positions",
        2021,
        ["NVIDIA/TensorRT-LLM#18207", "huggingface/candle#3729"],
        "Compiled engine drifts from the second generated token on (compile off is fine)",
        repro_toml({"arch": "llama", "seed": 0}, target, [greedy(20, 2021, 12)], good_ref="v0.2.0"),
        (
            COMPILATION,
            "StaticInputForward.__call__",
            "positions are copied into the persistent buffer only when the token count changes, so decode steps "
            "of equal size rotate q/k with the first decode step's position",
        ),
        23,
        STATIC_INPUTS,
    )


def shared_window() -> HardCase:
    target = {"engine": "tinyserve", "dtype": "float32", "options": COMPILED}
    return compile_case(
        "ts-compile-shared-window",
        2022,
        ["vllm-project/vllm-gaudi#1663", "huggingface/transformers#37447"],
        "gemma2 compiled: wrong output once the prompt is longer than the sliding window",
        repro_toml({"arch": "gemma2", "seed": 0}, target, [greedy(48, 2022, 6)], good_ref="v0.2.0"),
        (
            COMPILATION,
            "share_layer_settings",
            "every attention layer is given layer 0's sliding window before compiling, so gemma2's global layers "
            "attend through a window",
        ),
        14,
        SHARE_LAYER_SETTINGS,
    )


def frozen_ntk() -> HardCase:
    model = {"arch": "llama", "seed": 5, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    target = {"engine": "tinyserve", "dtype": "float32", "options": COMPILED | {"max_model_len": 2048}}
    return compile_case(
        "ts-compile-frozen-ntk",
        2023,
        ["vllm-project/vllm#5093", "huggingface/transformers#27033"],
        "Dynamic-NTK llama with compile on differs from transformers even on short prompts",
        repro_toml(model, target, [greedy(24, 2023, 8)], good_ref="v0.2.0"),
        (
            COMPILATION,
            "freeze_dynamic_rope",
            "under compile every dynamic-NTK rotary layer is frozen to the table of a max_model_len-token sequence, "
            "so prompts shorter than max_position_embeddings are rotated with NTK-scaled frequencies",
        ),
        19,
        FREEZE_DYNAMIC_ROPE,
    )


CASES = [stale_positions(), shared_window(), frozen_ntk()]
