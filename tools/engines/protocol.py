"""The Engine protocol: run one engine on one scenario, report canonical taps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from tools.probe.trace import Trace
from tools.scenario import EngineSpec, Scenario, from_dict


@dataclass(frozen=True)
class TriggerAxis:
    """An engine feature that hides bugs until it is on: the trigger search (tools/reproduce.py)
    switches it on in a variant of the scenario, and reads an issue for its words."""

    name: str  # variant name, e.g. "prefix_caching"
    options: dict  # engine options that switch it on; the first one says the scenario uses it already
    description: str  # what the variant does, for the report
    label: str  # how the report names the feature ("prefix caching")
    words: tuple[str, ...] = ()  # words an issue uses for it (lower case; `_` and `-` read as spaces)
    workload: str = ""  # the workload shape that exercises it (tools.reproduce.WORKLOADS), "" = as given
    alone: bool = False  # switched on by itself only, never together with the other axes (its options exclude theirs)
    # a model-config axis (Capabilities.config_axes): [model] keys for the checkpoint factory, not
    # engine options (tools.probe.checkpoints: HF config fields, omit_keys, config_json)
    model: dict = field(default_factory=dict)
    archs: tuple[str, ...] = ()  # the archs whose checkpoints ship it, or the engine runs it on (empty: every arch)
    # a config axis whose bugs need a precision and a code path rather than a prompt shape: the sweep axes
    # (two or more) whose every combination of values it meets (empty: the sweep's default, dtype x workload)
    crossed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What an adapter can do, asked of a worker that imports the tree under test
    (tools.engines.engine_capabilities); travels as JSON, so plain data only."""

    taps: tuple[str, ...]  # tap-name patterns the adapter can report
    kernels: tuple[str, ...] = ()  # ops with an optimized and a `native` twin, swappable
    teacher_forcing: bool = True  # can re-run a given token sequence
    dtypes: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")
    tp_sizes: tuple[int, ...] = (1,)
    replace: tuple[str, ...] = ()  # tap-name patterns where reference rows can be injected (RunJob.replace)
    trigger_axes: tuple[TriggerAxis, ...] = ()  # features the trigger search may switch on, cheapest first
    # checkpoint config variants the engine reads (rope scaling types, keys left to defaults, ...):
    # the sweep's model-config axis (tools.sweep.matrix); options: engine options such a deployment sets, if any
    config_axes: tuple[TriggerAxis, ...] = ()
    option_aliases: dict = field(default_factory=dict)  # alias -> the option name the engine takes
    package: str = ""  # the importable package a --target-source root must hold ("": none checked)
    accepted_options: tuple[str, ...] | None = None  # options the tree takes, aliases included; None: any
    # judges each op of its compute graph against the op recomputed in fp64 from the op's own inputs
    # (RunJob.op_checks): the kernel drill-down of an engine without native twins
    op_checks: bool = False
    # request sampling keys (tools.scenario.SAMPLING_KEYS) the engine honours; None: every one. A key it
    # does not honour, set to anything but its neutral value, is refused up front (tools.preflight): the
    # reference sampler would apply it and the target not, a divergence that is the adapter's, not a bug's
    sampling_keys: tuple[str, ...] | None = None
    # model archs (HF model_type) the engine runs; None: every arch the checkpoint factory builds. The sweep
    # leaves the others out of its matrix (tools.sweep.matrix.Scope) instead of failing cells on them
    archs: tuple[str, ...] | None = None
    # archs the engine runs without their sliding window (as plain attention over the whole context): a
    # sequence past the checkpoint's window is outside what it serves, refused by its run and left out of the sweep
    unwindowed_archs: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Capabilities:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

        def axes(key: str) -> tuple[TriggerAxis, ...]:
            return tuple(
                TriggerAxis(
                    **{
                        **a,
                        "words": tuple(a.get("words", ())),
                        "archs": tuple(a.get("archs", ())),
                        "crossed": tuple(a.get("crossed", ())),
                    }
                )
                for a in d.get(key, ())
            )

        return cls(**{**fields, "trigger_axes": axes("trigger_axes"), "config_axes": axes("config_axes")})

    def arch_refusal(self, engine: str, arch: str) -> str | None:
        """Why the engine does not run a model of `arch` (None: it does), from `archs`."""
        if self.archs is None or arch in self.archs:
            return None
        if len(self.archs) <= 8:
            return f"{engine} runs {', '.join(self.archs)} models only, not {arch}"
        return f"{engine} has no {arch} architecture"

    def window_refusal(self, engine: str, arch: str, window: int | None, tokens: int) -> str | None:
        """Why a sequence of `tokens` on an `arch` checkpoint with this sliding `window` is not the engine's to
        serve (None: it is), from `unwindowed_archs`: its output would differ from the reference for that alone."""
        if arch in self.unwindowed_archs and window and tokens > window:
            return f"{tokens} tokens pass {arch}'s {window}-token sliding window, which {engine} does not implement"
        return None

    def canonical_options(self, options: dict) -> dict:
        """Options with aliases replaced by the names the engine takes."""
        return {self.option_aliases.get(k, k): v for k, v in options.items()}


@dataclass
class RunJob:
    """One engine run. Travels as JSON to the worker process."""

    scenario: Scenario
    spec: EngineSpec  # which engine, dtype, options (target or reference)
    checkpoint: str  # HF-format checkpoint dir
    teacher: list[list[int]] | None = None  # full token sequences to re-run (teacher forcing)
    taps: list[str] | None = None  # fnmatch patterns; None = every tap, [] = outputs only
    device: str = "cpu"
    native_kernels: list[str] = field(default_factory=list)  # kernels swapped to the native twin
    coverage_root: str | None = None  # record which functions under this dir ran (spectrum evidence)
    replace: str | None = None  # trace dir whose rows are injected at their taps (tools.probe.replace)
    function_checks: str | None = (
        None  # judge the functions under this dir by their contracts (tools.hypotheses.contracts)
    )
    # judge every op against its fp64 recompute (Capabilities.op_checks), trace meta "op_checks"; the
    # value is the tree under test's root, where the functions computing the ops are named ("": none)
    op_checks: str | None = None

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario.to_dict(),
            "spec": asdict(self.spec),
            "checkpoint": self.checkpoint,
            "teacher": self.teacher,
            "taps": self.taps,
            "device": self.device,
            "native_kernels": list(self.native_kernels),
            "coverage_root": self.coverage_root,
            "replace": self.replace,
            "function_checks": self.function_checks,
            "op_checks": self.op_checks,
        }

    @classmethod
    def from_json(cls, d: dict) -> RunJob:
        return cls(
            scenario=from_dict(d["scenario"]),
            spec=EngineSpec(**d["spec"]),
            checkpoint=d["checkpoint"],
            teacher=d.get("teacher"),
            taps=d.get("taps"),
            device=d.get("device", "cpu"),
            native_kernels=d.get("native_kernels", []),
            coverage_root=d.get("coverage_root"),
            replace=d.get("replace"),
            function_checks=d.get("function_checks"),
            op_checks=d.get("op_checks"),
        )


class Engine(Protocol):
    name: str

    def capabilities(self) -> Capabilities:
        """What the engine in the worker's tree can do; asked once per (engine, tree) in a run."""

    def check_options(self, spec: EngineSpec, device: str = "cpu") -> None:
        """Raise ValueError (one line) for an option the adapter cannot run and tap correctly on `device`."""

    def run(self, job: RunJob) -> Trace: ...

    # Optional: `contract_context(job) -> dict`, what the function contracts (tools.hypotheses.contracts)
    # need to know about the model that no single call's inputs say, read the way the reference reads
    # it: "attention_windows" (one per layer, None = full attention), "masks_per_layer_kind" (the tree
    # builds a separate attention mask per kind of layer). Asked in the worker after `run`.


def check_spec(spec: EngineSpec, device: str = "cpu") -> None:
    """Refuse, before any engine starts, options the engine's adapter cannot tap correctly. An
    adapter only the worker can import (`module:Class` in the tree under test) is not asked here:
    its own run refuses what it cannot tap."""
    from tools.engines import UnknownEngineError, engine_path, get_engine

    engine_path(spec.engine)  # an unknown name is refused all the same
    try:
        adapter = get_engine(spec.engine)
    except UnknownEngineError:
        return
    check = getattr(adapter, "check_options", None)  # optional for outside adapters
    if check is not None:
        check(spec, device)
