"""The sweep's matrix: axes and their values -> cells -> scenarios (docs/check.md).

A matrix names, per axis, the values to cross:

    arch     = ["llama", "qwen2", "mistral", "gemma2"]
    dtype    = ["float32", "bfloat16", "float16"]
    features = ["none", "prefix_caching", "all"]     # feature sets the engine's adapter declares
    workload = ["staggered", "long", "sampled"]      # request shapes (WORKLOADS)
    config   = ["preset", "rope_yarn"]               # checkpoint config variants the adapter declares
    strength = 3                                     # cells: every 3 values of 3 axes (5 = the full product)

The model-config axis is crossed one strength lower than the others (every config variant meets
every value of each other axis, in pairs): a config variant changes what the checkpoint says, so
its bugs need the variant and at most one other trigger, and the cell count stays near the
four-axis array's.

Every cell is one probe of the target against the reference. Plain data and pure functions; the
probing is `agent.check`'s job.
"""

from __future__ import annotations

import itertools
import random
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from tools.engines.protocol import Capabilities
from tools.errors import BadInput
from tools.probe.checkpoints import FILE_KEYS, TINY_PRESETS
from tools.scenario import DTYPES, EngineSpec, Scenario, from_dict, unhonoured_sampling

AXES = ("arch", "dtype", "features", "workload", "config")
PAIRED_AXES = ("config",)
CONFIG_TRIPLE = (
    "dtype",
    "workload",
)  # besides pairs, every config variant meets these two axes' values together  # crossed with every other axis in pairs only, never in triples
PRESET = "preset"  # the config axis's value for the tiny preset as transformers 5 writes it
DEFAULT_STRENGTH = 3  # every triple of values of three axes is in some cell: a third of the full product
TARGET_DTYPES = tuple(d for d in DTYPES if d != "float64")  # a float64 target is the reference itself
SHARED_PREFIX = list(range(40, 76))  # 36 tokens: crosses 16-token blocks, shared by later requests
SHARED_PREFIX_LEN = len(SHARED_PREFIX)
# the long workload's prompt: 7 blocks of 16 (8 with its decode, what a small KV pool holds), rope angles
# past 100 rad at its last positions
LONG_PROMPT = 112
# Config values of the sweep's tiny models where the preset lets two fields coincide that real
# checkpoints keep apart (gemma2-27b: query_pre_attn_scalar 144, head_dim 128): a code path that
# reads the one for the other is then wrong by a visible factor.
MODEL_OVERRIDES = {"gemma2": {"query_pre_attn_scalar": 24}}
# Every cell's weights have their constant-initialised tensors perturbed (biases, norm weights): under
# transformers' init they are 0 and 1, and an engine that drops a bias or a norm's weight would pass.
BASE_MODEL = {"seed": 0, "perturb_init": True}
# Per-request sampling in one batch, each request with settings the others lack, so a sampler that
# applies one request's settings (or the batch's largest) to every row shows: a top-k that bites, a
# min-p that bites, presence/frequency and repetition penalties, a greedy request with penalties.
SAMPLED = {"temperature": 0.8, "top_k": 4, "top_p": 0.9, "min_p": 0.02, "repetition_penalty": 1.2, "seed": 7}
SAMPLED_OTHER = {"temperature": 1.3, "top_k": 0, "min_p": 0.2, "presence_penalty": 0.4, "frequency_penalty": 0.6}
GREEDY_PENALISED = {"temperature": 0.0, "presence_penalty": 0.3, "frequency_penalty": 0.2, "repetition_penalty": 1.1}
# Each cut alone as well, at a temperature other than 1: a tight nucleus (top_p 0.3: most of the mass is cut,
# so the cumulative sum is compared far from 1, where a sum kept in half precision has stopped growing) with
# top-k switched off as OpenAI / vLLM clients write it (-1, not 0); and a top-k alone.
TOP_P_ALONE = {"temperature": 0.7, "top_p": 0.3, "top_k": -1, "seed": 13}
TOP_K_ALONE = {"temperature": 0.6, "top_k": 12, "seed": 5}
# Two requests with the same min-p settings (a cut that bites, at a temperature that sharpens), so an
# engine that batches requests by their settings samples them together: a cut scaled by another row's
# top probability (the batch's, not the row's own) shows in the row with the lower top probability.
MIN_P_TWINS = {"temperature": 0.5, "min_p": 0.5, "seed": 17}
# Text in several scripts: multi-byte UTF-8 pieces (2-, 3- and 4-byte characters) in the prompt, so
# incremental detokenization meets characters split across tokens.
MULTI_BYTE_TEXT = "Grüße, 東京の夜 🙂 ça va? Ελλάδα."
# Sampled, not greedy: a tiny random model decoding greedily loops on a few pieces; sampling at
# temperature 1 visits many. Its near-uniform distribution makes the draw the seed's (the same ids on
# every arch at the preset scale), so the seed is one whose 16 ids hold the detokenizer's edge cases:
# a special id (skipped in text, as ignore_eos runs meet them), a piece that completes text and then
# starts a character, pieces ending inside a character (picked on the clean engine by those counts).
TEXT_SAMPLING = {"temperature": 1.0, "seed": 26}
# Uncut requests at a low temperature, each with its own seed and prompt: the kept distribution is the whole
# vocabulary sharpened, so a draw from the distribution before temperature (reported after it) is too flat by
# a wide margin. Within the tight cuts at temperatures near 1 of the rows above it moves little mass.
COLD = {"temperature": 0.3}
COLD_PROMPTS = (list(range(400, 414)), list(range(420, 432)), list(range(440, 456)))
COLD_SEEDS = (31, 33, 35)


class MatrixError(BadInput):
    """A matrix file that cannot be run; the message says which axis or value and why."""


def _staggered(window: int | None) -> list[dict]:
    """Five requests arriving at different steps: the second shares the first's prefix (a prefix
    cache hit) and decodes on after the first has finished (shared blocks outlive their first
    owner while new requests take blocks); the third starts with a 16-token block of the first's prompt at another position
    (the same block content where the cache must not match: a block's identity includes what
    precedes it); the fourth is text with multi-byte characters, sampled on for 16 tokens; the last
    extends the first's prompt after the first has finished (a chat's next turn: a hit on freed
    blocks, or, in a small pool, on blocks evicted and reused meanwhile). Two more while the first
    decodes: one whose whole prompt is cached (the first's 32 leading tokens, a multiple of every
    block size swept: no token left to compute unless the last is recomputed), and one that differs
    from the first only from token 31 on (the last token of a block at sizes 4, 16 and 32: the
    block must miss). Last, the third's prompt again once it has finished and its blocks may have
    been evicted and handed to other requests (a retry after other traffic: the cache must not
    serve a block that now holds someone else's keys)."""
    return [
        {"prompt_ids": SHARED_PREFIX + [7, 9, 11, 13], "max_tokens": 6},
        {"prompt_ids": SHARED_PREFIX + [21, 23], "max_tokens": 10, "arrival_step": 2},
        {"prompt_ids": SHARED_PREFIX[16:32] + list(range(300, 311)), "max_tokens": 6, "arrival_step": 2},
        {"prompt": MULTI_BYTE_TEXT, "max_tokens": 16, "arrival_step": 1, "sampling": dict(TEXT_SAMPLING)},
        {"prompt_ids": SHARED_PREFIX + [7, 9, 11, 13, 15, 17], "max_tokens": 3, "arrival_step": 8},
        {"prompt_ids": SHARED_PREFIX[:32], "max_tokens": 4, "arrival_step": 4},
        {"prompt_ids": SHARED_PREFIX[:31] + [450, 451, 452], "max_tokens": 4, "arrival_step": 5},
        {"prompt_ids": SHARED_PREFIX[16:32] + list(range(300, 311)), "max_tokens": 3, "arrival_step": 18},
    ]


def _long(window: int | None) -> list[dict]:
    """A prompt past the sliding window (when the arch has one) and several KV blocks, at positions
    where rope angles reach 100+ radians (an error in the rotary frequencies grows with the
    position), decoded on in the same steps as a shorter one also past the window and a short
    request: rows of very different context lengths in one batch, two of them windowed."""
    length = max(LONG_PROMPT, (window or 0) + 24)
    middle = (window or SHARED_PREFIX_LEN) + 20
    return [
        {"prompt_ids": [(17 * i + 5) % 480 + 3 for i in range(length)], "max_tokens": 10},
        {"prompt_ids": [(29 * i + 11) % 480 + 3 for i in range(9)], "max_tokens": 10},
        {"prompt_ids": [(41 * i + 7) % 480 + 3 for i in range(middle)], "max_tokens": 6},
    ]


def _sampled(window: int | None) -> list[dict]:
    """Eleven requests with different sampling in one batch: plain greedy (no penalty: the penalised
    rows are a subset of the batch, not its first rows); top-k/top-p/min-p with a repetition
    penalty; a hotter one whose min-p bites, with presence/frequency penalties; greedy with penalties;
    a tight nucleus alone (top-k off as -1); a top-k alone; two requests with the same min-p settings
    (one batch where an engine batches equal settings); three uncut requests at temperature 0.3 with
    their own seeds and prompts. The last three are for the drawn tokens' test (`sampler.draws`): a
    sampler that draws from the distribution before temperature while reporting the one after keeps
    every token in the kept set and, within the tight cuts at temperatures near 1 above, moves little
    mass (not caught at 128 tokens a request); a sharpened uncut distribution shows it in 8 tokens on
    the trained_scale cells (docs/sampling.md). At the preset scale every kept distribution is near
    uniform, with or without temperature, and no row shows it."""
    return [
        {"prompt_ids": list(range(150, 166)), "max_tokens": 8, "sampling": {"temperature": 0.0}},
        {"prompt_ids": SHARED_PREFIX[:20], "max_tokens": 8, "sampling": dict(SAMPLED)},
        {
            "prompt_ids": list(range(200, 214)),
            "max_tokens": 8,
            "arrival_step": 1,
            "sampling": dict(SAMPLED_OTHER, seed=11),
        },
        {"prompt_ids": list(range(100, 111)), "max_tokens": 8, "arrival_step": 1, "sampling": dict(GREEDY_PENALISED)},
        {"prompt_ids": list(range(230, 243)), "max_tokens": 8, "sampling": dict(TOP_P_ALONE)},
        {"prompt_ids": list(range(260, 270)), "max_tokens": 8, "arrival_step": 2, "sampling": dict(TOP_K_ALONE)},
        {"prompt_ids": list(range(320, 334)), "max_tokens": 8, "sampling": dict(MIN_P_TWINS)},
        {"prompt_ids": list(range(360, 374)), "max_tokens": 8, "sampling": dict(MIN_P_TWINS)},
    ] + [
        {"prompt_ids": prompt, "max_tokens": 8, "sampling": dict(COLD, seed=seed)}
        for prompt, seed in zip(COLD_PROMPTS, COLD_SEEDS, strict=True)
    ]


WORKLOADS = {"staggered": _staggered, "long": _long, "sampled": _sampled}


@dataclass(frozen=True)
class Cell:
    arch: str
    dtype: str
    features: str  # "none", one declared feature, or "all"
    workload: str
    config: str = PRESET  # a checkpoint config variant the adapter declares, or the preset

    @property
    def id(self) -> str:
        base = f"{self.arch}-{self.dtype}-{self.features}-{self.workload}"
        return base if self.config == PRESET else f"{base}-{self.config}"

    def axis(self, name: str) -> str:
        return getattr(self, name)


@dataclass(frozen=True)
class Feature:
    """A feature the engine's adapter declares (its trigger axis): the options that switch it on;
    `alone`: never switched on together with the others (its options exclude theirs); `archs`: the
    archs the engine runs it on (() = all)."""

    options: dict
    alone: bool = False
    archs: tuple[str, ...] = ()

    def fits(self, arch: str) -> bool:
        return not self.archs or arch in self.archs


@dataclass(frozen=True)
class ConfigVariant:
    """A checkpoint config variant the engine's adapter declares (its config axis): the [model]
    keys the checkpoint factory writes it with, the archs whose checkpoints ship it (() = all), and
    engine options a deployment of such a checkpoint sets (a context past max_position_embeddings
    for a rope scaling made for it)."""

    model: dict
    archs: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)
    crossed: tuple[str, ...] = CONFIG_TRIPLE  # the axes (two or more) whose value combinations it meets together

    def fits(self, arch: str) -> bool:
        return not self.archs or arch in self.archs

    def model_for(self, arch: str) -> dict:
        """The [model] keys for a checkpoint of `arch`: the variant's, with its `by_arch` entry for
        that arch over them (a key only one arch's exports carry, e.g. gemma2's legacy hidden_act)."""
        keys = {k: v for k, v in self.model.items() if k != "by_arch"}
        extra = self.model.get("by_arch", {}).get(arch, {})
        config_json = {**keys.get("config_json", {}), **extra.get("config_json", {})}
        return {**keys, **extra, **({"config_json": config_json} if config_json else {})}


@dataclass(frozen=True)
class Scope:
    """What the engine under test runs, as its adapter's Capabilities declare it (archs, dtypes, windows): a
    cell outside is left out of the sweep (with its reason, `agent.check` logs and reports it), never run
    into an adapter's refusal that would read as a failing cell."""

    engine: str
    caps: Capabilities

    def refuses(self, cell: Cell, variants: dict[str, ConfigVariant] | None = None) -> str | None:
        """Why the engine does not run the cell (None: it does)."""
        arch = self.caps.arch_refusal(self.engine, cell.arch)
        if arch:
            return f"{cell.arch}: {arch}"
        if cell.dtype not in self.caps.dtypes:
            return (
                f"{cell.dtype}: {self.engine} runs {', '.join(d for d in TARGET_DTYPES if d in self.caps.dtypes)} only"
            )
        window = cell_window(cell, variants)
        longest = longest_sequence(WORKLOADS[cell.workload](window))
        past = self.caps.window_refusal(self.engine, cell.arch, window, longest)
        return f"{cell.arch} x {cell.workload}: {past}" if past else None


def cell_window(cell: Cell, variants: dict[str, ConfigVariant] | None = None) -> int | None:
    """The sliding window of the cell's checkpoint: its config variant's, else its arch preset's."""
    variant = (variants or {}).get(cell.config)
    keys = variant.model_for(cell.arch) if variant else {}
    return keys.get("sliding_window", TINY_PRESETS[cell.arch].get("sliding_window"))


def longest_sequence(requests: list[dict]) -> int:
    """The most tokens one request of a workload holds (prompt + generated); a text prompt counts
    its UTF-8 bytes, an upper bound on its tokens under a byte-level tokenizer."""
    return max(
        (len(r["prompt_ids"]) if "prompt_ids" in r else len(r["prompt"].encode())) + r.get("max_tokens", 16)
        for r in requests
    )


@dataclass(frozen=True)
class Matrix:
    arch: tuple[str, ...]
    dtype: tuple[str, ...]
    features: tuple[str, ...]
    workload: tuple[str, ...]
    config: tuple[str, ...] = (PRESET,)
    strength: int = DEFAULT_STRENGTH  # t: the cells cover every t values of t axes; len(AXES) = full product

    def cells(
        self,
        variants: dict[str, ConfigVariant] | None = None,
        declared: dict[str, Feature] | None = None,
        scope: Scope | None = None,
    ) -> list[Cell]:
        """The covering array of the other axes, each cell then given the config variant that
        meets the most (variant, value) pairs not met yet, plus copies for pairs still missing;
        only variants that fit the cell's arch (`variants`: the adapter's; others fit every arch),
        only feature sets the engine runs on the arch (`declared`: the adapter's features), and only
        cells the engine runs (`scope`), left out before the covering so what is left stays covered."""
        variants = variants or {}

        def fits(config: str, arch: str) -> bool:
            return config not in variants or variants[config].fits(arch)

        def runs(cell: Cell) -> bool:
            return scope is None or scope.refuses(cell, variants) is None

        product = itertools.product(self.arch, self.dtype, self.features, self.workload)
        base = [c for c in (Cell(*values) for values in product) if features_fit(c, declared or {}) and runs(c)]
        if self.strength >= len(AXES):
            return [c for c in (replace(c, config=k) for c in base for k in self.config if fits(k, c.arch)) if runs(c)]
        crossed = {k: v.crossed for k, v in variants.items()}
        cells = with_configs(covering(base, min(self.strength, len(AXES) - 1)), self.config, fits, crossed)
        return [c for c in cells if runs(c)]  # a variant's own window can put a cell out of scope

    def left_out(self, scope: Scope, variants: dict[str, ConfigVariant] | None = None) -> list[str]:
        """Why parts of the matrix are not swept: one line per reason, in axis order."""
        product = itertools.product(self.arch, self.dtype, ("none",), self.workload, self.config)
        reasons = (scope.refuses(Cell(*values), variants) for values in product)
        return list(dict.fromkeys(r for r in reasons if r))


def features_fit(cell: Cell, declared: dict[str, Feature]) -> bool:
    """Whether the engine runs the cell's feature set on its arch (`all`: every feature in it does)."""
    if cell.features == "all":
        return all(f.fits(cell.arch) for f in declared.values() if not f.alone)
    feature = declared.get(cell.features)
    return feature is None or feature.fits(cell.arch)


def feature_sets(declared: dict[str, Feature]) -> tuple[str, ...]:
    """The default feature axis: nothing on, each declared feature alone, every feature that goes
    with the others on together."""
    together = [name for name, f in declared.items() if not f.alone]
    return ("none", *declared, "all") if len(together) > 1 else ("none", *declared)


def default_matrix(declared: dict[str, Feature], variants: dict[str, ConfigVariant] | None = None) -> Matrix:
    configs = (PRESET, *(variants or {}))
    return Matrix(tuple(TINY_PRESETS), TARGET_DTYPES, feature_sets(declared), tuple(WORKLOADS), configs)


def load_matrix(
    path: Path | None, declared: dict[str, Feature], variants: dict[str, ConfigVariant] | None = None
) -> Matrix:
    """The matrix file (TOML, the axes as top-level keys; missing axes take the default's values;
    `strength`, 1 to 5, how many axes' values the cells cross in full; `config` left out: the
    preset only), checked against what exists:
    archs, dtypes, workloads, and the features and config variants the engine declares."""
    variants = variants or {}
    base = default_matrix(declared, variants)
    if path is None:
        return base
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise MatrixError(f"matrix {path}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise MatrixError(f"matrix {path}: not valid TOML ({e})") from None
    strength = data.pop("strength", base.strength)
    if not isinstance(strength, int) or isinstance(strength, bool) or not 1 <= strength <= len(AXES):
        raise MatrixError(f"matrix {path}: strength must be an integer from 1 to {len(AXES)}, got {strength!r}")
    unknown = sorted(set(data) - set(AXES))
    if unknown:
        raise MatrixError(f"matrix {path}: unknown axes {unknown}; the axes are {', '.join(AXES)} (and strength)")
    allowed = {
        "arch": tuple(TINY_PRESETS),
        "dtype": TARGET_DTYPES,
        "features": ("none", *declared, "all"),
        "workload": tuple(WORKLOADS),
        "config": (PRESET, *variants),
    }
    values = {}
    for axis in AXES:
        # a file that leaves out the config axis sweeps the preset checkpoints (files written
        # before the axis existed keep their cells); the other axes left out take the defaults
        given = data.get(axis, [PRESET] if axis == "config" else list(getattr(base, axis)))
        if not isinstance(given, list) or not given or not all(isinstance(v, str) for v in given):
            raise MatrixError(f"matrix {path}: {axis} must be a non-empty list of names, got {given!r}")
        bad = [v for v in given if v not in allowed[axis]]
        if bad:
            raise MatrixError(f"matrix {path}: {axis} {bad} unknown here; one of {', '.join(allowed[axis])}")
        values[axis] = tuple(dict.fromkeys(given))
    return Matrix(**values, strength=strength)


def options_of(cell: Cell, declared: dict[str, Feature]) -> dict:
    """The engine options a cell's feature set switches on."""
    if cell.features == "none":
        return {}
    if cell.features == "all":
        merged: dict = {}
        for f in declared.values():
            if not f.alone:
                merged.update(f.options)
        return merged
    return dict(declared[cell.features].options)


def scenario_of(
    cell: Cell,
    target: EngineSpec,
    declared: dict[str, Feature],
    reference: dict | None = None,
    variants: dict[str, ConfigVariant] | None = None,
    sampling_keys: tuple[str, ...] | None = None,
) -> Scenario:
    """The cell as a Scenario: the tiny seeded model of its arch written as its config variant
    says, its workload, the target's own options (from --engine) under the feature set's. Sampling keys
    the engine does not honour (`sampling_keys`, its Capabilities'; None: all) are left out of the workload:
    the cell sweeps what the engine serves (agent.check's summary names what was left out)."""
    window = TINY_PRESETS[cell.arch].get("sliding_window")
    requests = WORKLOADS[cell.workload](window)
    for r in requests:
        sampling = r.setdefault("sampling", {})
        for key in unhonoured_sampling(sampling, sampling_keys):
            del sampling[key]
        sampling["ignore_eos"] = True  # every cell decodes its full length
    variant = (variants or {}).get(cell.config)
    keys = variant.model_for(cell.arch) if variant else {}
    model = {"arch": cell.arch, **BASE_MODEL, **MODEL_OVERRIDES.get(cell.arch, {}), **keys}
    data = {
        "model": model,
        "target": {
            "engine": target.engine,
            "dtype": cell.dtype,
            "options": {**(variant.options if variant else {}), **target.options, **options_of(cell, declared)},
        },
        "workload": {"requests": requests},
    }
    if reference:
        data["reference"] = dict(reference)
    return from_dict(data)


def with_configs(cells: list[Cell], configs: tuple[str, ...], fits, crossed: dict | None = None) -> list[Cell]:
    """Cells (config unset) -> the same cells each with the fitting config that adds the most
    (config, other axis value) pairs not yet met, then copies of cells for the pairs still unmet:
    every config variant meets every value of every other axis that some fitting cell holds, and
    every pair of values of its `crossed` axes (default CONFIG_TRIPLE's)."""
    others = [a for a in AXES if a not in PAIRED_AXES]
    crossed = crossed or {}

    def pairs(cell: Cell) -> set:
        return _config_pairs(cell, others, crossed.get(cell.config, CONFIG_TRIPLE))

    met: set = set()
    out: list[Cell] = []
    for cell in cells:
        fitting = [k for k in configs if fits(k, cell.arch)]
        gain = [(len(pairs(replace(cell, config=k)) - met), -i) for i, k in enumerate(fitting)]
        best = replace(cell, config=fitting[-max(gain)[1]])
        met |= pairs(best)
        out.append(best)
    for config in configs:
        for cell in cells:
            if fits(config, cell.arch) and pairs(replace(cell, config=config)) - met:
                extra = replace(cell, config=config)
                met |= pairs(extra)
                out.append(extra)
    return out


def _config_pairs(cell: Cell, others: list[str], crossed: tuple[str, ...] = CONFIG_TRIPLE) -> set:
    """What a cell's config variant meets: each value of each other axis, and the values of its
    `crossed` axes together (by default the dtype and the workload: a variant's bug may need a
    precision and a prompt shape, as rope frequencies rounded to bfloat16 show only at a long prompt's
    positions; outlier activations need a precision and a code path instead)."""
    together = tuple(cell.axis(a) for a in crossed)
    return {(cell.config, a, cell.axis(a)) for a in others} | {(cell.config, crossed, together)}


def covering_order(cells: list[Cell], seed: int = 0) -> list[Cell]:
    """Cells ordered so that a prefix covers as much as it can: first every value of every axis,
    then every pair of values of two axes, then the rest (seeded shuffle). Cutting the list
    anywhere (a time budget) keeps the widest coverage for the cells run."""
    ordered, rest = _greedy_cover(cells, (1, 2), seed)
    return ordered + rest


def covering(cells: list[Cell], strength: int, seed: int = 0) -> list[Cell]:
    """The cells, taken greedily in covering order (values, pairs, ... up to `strength`), that
    cover every combination of `strength` axes' values that `cells` hold: a covering array."""
    ordered, _ = _greedy_cover(cells, tuple(range(1, strength + 1)), seed)
    return ordered


def _greedy_cover(cells: list[Cell], arities: tuple[int, ...], seed: int) -> tuple[list[Cell], list[Cell]]:
    """-> (cells chosen, each adding the most combinations not yet covered, arity by arity; the
    cells left, in a seeded shuffle)."""
    rng = random.Random(seed)
    rest = list(cells)
    rng.shuffle(rest)
    ordered: list[Cell] = []
    for arity in arities:
        seen: set = set().union(*(_combos(c, arity) for c in ordered))
        while True:
            gain = [(len(_combos(c, arity) - seen), i) for i, c in enumerate(rest)]
            best = max(gain, default=(0, -1))
            if best[0] == 0:
                break
            cell = rest.pop(best[1])
            ordered.append(cell)
            seen |= _combos(cell, arity)
    return ordered, rest


def _combos(cell: Cell, arity: int) -> set:
    """The combinations of `arity` axes' values the cell holds; PAIRED_AXES only in pairs or alone."""
    pairs = [(a, cell.axis(a)) for a in AXES]
    combos = itertools.combinations(pairs, arity)
    return {c for c in combos if arity <= 2 or not any(a in PAIRED_AXES for a, _ in c)}


# --- cells nearest a reported scenario first -------------------------------------------------------

_ROPE_KEYS = {"rope_scaling": "rope", "rope_parameters": "rope", "rope_theta": "rope"}


def nearest_first(cells: list[Cell], report: Scenario, declared: dict[str, Feature], variants) -> list[Cell]:
    """The cells (in their order) re-ordered so the ones sharing most with a reported scenario
    come first: its arch, dtype, engine options (canonical names), the config keys its model
    sets, its workload's shape. Only what the matrix knows about each cell is compared; ties keep
    the covering order, so a budget cut still spreads over the rest."""
    scored = [(-closeness(c, report, declared, variants), i, c) for i, c in enumerate(cells)]
    return [c for _, _, c in sorted(scored)]


def closeness(cell: Cell, report: Scenario, declared: dict[str, Feature], variants) -> int:
    """How many traits a cell shares with a reported scenario (options already canonical), less
    one for a feature set or a config variant the report shows nothing of (the plainer cell of two
    otherwise alike is nearer)."""
    score = int(cell.arch == report.model.get("arch")) + int(cell.dtype == report.target.dtype)
    shared = sum(report.target.options.get(k) == v for k, v in options_of(cell, declared).items())
    score += shared - int(cell.features != "none" and not shared)
    score += int(cell.workload in workload_shapes(report))
    variant = (variants or {}).get(cell.config)
    config = config_closeness(variant.model_for(cell.arch), report.model) if variant else 0
    return score + (config if config or not variant else -1)


def workload_shapes(report: Scenario) -> set[str]:
    """Which of the sweep's workload shapes a scenario's requests have."""
    shapes = set()
    if any(not r.greedy for r in report.requests):
        shapes.add("sampled")
    if any(r.prompt_ids is not None and len(r.prompt_ids) >= 64 for r in report.requests):
        shapes.add("long")
    if len(report.requests) > 1:
        shapes.add("staggered")
    return shapes


def config_closeness(variant: dict, model: dict) -> int:
    """Config keys a variant writes or leaves out that a reported [model] table also sets, plus 2
    when both name the same rope scaling type."""
    written = {k for k in variant if k not in FILE_KEYS} | set(variant.get("config_json", {}))
    touched = {_ROPE_KEYS.get(k, k) for k in written | set(variant.get("omit_keys", ()))}
    reported = {_ROPE_KEYS.get(k, k) for k in model if k not in ("arch", "seed", "path")}
    same_rope = _rope_type({**variant, **variant.get("config_json", {})}) == _rope_type(model) != "default"
    return len(touched & reported) + 2 * int(same_rope)


def _rope_type(keys: dict) -> str:
    rope = keys.get("rope_scaling") or keys.get("rope_parameters") or {}
    return str(rope.get("rope_type", rope.get("type", "default")))
