"""Verification by a candidate fix on real tinyserve trees (bugs at base: no history to restore).

The tree is a git repo holding a copy of the bundled subject; it plays the user's checkout, which
no template edit may leave changed. Every probe is a real engine run on a tiny seeded model.
"""

from __future__ import annotations

import pytest

from tests.faults_tinyserve import ATTENTION_OPS, CAUSAL_STRICT, checkout_digest, tree_at_base
from tests.tools.probe.test_no_false_alarms_tinyserve import EVERYTHING
from tests.tools.probe.test_no_false_alarms_tinyserve import FULL as FULL_MATRIX
from tests.tools.probe.test_no_false_alarms_tinyserve import scenario as matrix_scenario
from tools.hypotheses.evidence import Hypothesis, Reproduction
from tools.hypotheses.verify import FIX_PROBES_PER_FUNCTION, verify
from tools.probe.prober import Prober
from tools.scenario import from_dict

NORM = "tinyserve/ops/norm.py"
LLAMA = "tinyserve/models/llama.py"
slow = pytest.mark.slow
FAST_CELL = ("llama", "float32", EVERYTHING)


def scenario(arch: str = "llama", dtype: str = "float32"):
    reqs = [{"prompt_ids": list(range(3, 15)), "max_tokens": 3, "sampling": {"ignore_eos": True}}]
    return from_dict(
        {
            "model": {"arch": arch, "seed": 0},
            "target": {"engine": "tinyserve", "dtype": dtype},
            "workload": {"requests": reqs},
        }
    )


def candidate(file: str, function: str) -> Hypothesis:
    return Hypothesis(file, function, None, "attention", 0.3, "", ["names the divergent component"], score=1.0)


def test_a_mask_comparison_bug_at_base_is_verified_by_its_fix_template(tmp_path):
    repo = tree_at_base(tmp_path / "repo", CAUSAL_STRICT)
    prober, sc = Prober(), scenario()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged and repro.probe.first.tap.endswith("attn.out")
    before, runs = checkout_digest(repo), prober.engine_runs
    softcap, visible = candidate(ATTENTION_OPS, "_softcap"), candidate(ATTENTION_OPS, "_visible")
    softcap.score = 2.0  # ranked first: its edits are tried, and fail, before the right function's
    ranked = verify(repo, [softcap, visible], repro, prober, None)
    assert ranked[0] is visible and visible.verified and visible.verified_by == "fix-template"
    assert "-    mask = kv_pos < q_pos" in visible.verifying_diff
    assert "+    mask = kv_pos <= q_pos" in visible.verifying_diff
    assert visible.evidence[0].startswith("verified: the fix `mask-comparison")
    assert not softcap.verified and softcap.verified_by is None
    assert any("none removes the divergence" in e for e in softcap.evidence)
    assert 2 <= prober.engine_runs - runs <= 2 * (FIX_PROBES_PER_FUNCTION + 1)
    assert checkout_digest(repo) == before  # the edits ran in a temporary worktree


# The false-alarm matrix of the probe (tests/tools/probe/test_no_false_alarms_tinyserve.py): every
# arch x dtype, engine features off and all on (prefix caching, chunked prefill, small blocks).
FALSE_ALARMS = [
    pytest.param(arch, dtype, options, marks=[] if (arch, dtype, options) == FAST_CELL else slow)
    for arch, dtype, options in FULL_MATRIX
]


@pytest.mark.parametrize("arch,dtype,options", FALSE_ALARMS)
def test_no_fix_template_verifies_anything_on_a_bug_free_tree(arch, dtype, options, tmp_path):
    """Nothing to fix: the probe agrees before any edit, so no edit may claim to have removed a
    divergence (a no-op edit of `_softcap` would 'agree' too) and no engine runs for templates."""
    repo = tree_at_base(tmp_path / "repo", None)
    (repo / "notes.txt").write_text("the user's own untracked file\n")
    prober, sc = Prober(), from_dict(matrix_scenario(arch, dtype, **options))
    probe = prober.probe(sc, repo)
    assert not probe.diverged, probe.summary
    before, runs = checkout_digest(repo), prober.engine_runs
    cands = [candidate(ATTENTION_OPS, "_softcap"), candidate(ATTENTION_OPS, "_visible"), candidate(NORM, "rms_norm")]
    for claimed in (False, True):  # a reproduction that claims a divergence its probe does not show
        checked = verify(repo, cands, Reproduction(claimed, sc, probe), prober, None)
        assert not any(h.verified or h.verified_by for h in checked)
    assert prober.engine_runs == runs
    assert checkout_digest(repo) == before


# A decode-only bug at base in the split-KV merge: the partitions' weights take the wrong sign.
MERGE_SIGN = (
    "    weights = torch.exp(lses - lse).nan_to_num(0.0)\n",
    "    weights = torch.exp(lses + lse).nan_to_num(0.0)\n",
)


def test_a_caller_that_routes_around_its_faulty_callee_hands_the_credit_to_the_callee(tmp_path):
    """Regression: verification credited the caller. `paged_attention`'s first template edit (`>` ->
    `>=`) sends decode rows through the prefill kernel too, which removes the divergence without
    touching the faulty merge; the merge's own edit removes it as well and takes the credit."""
    repo = tree_at_base(tmp_path / "repo", MERGE_SIGN)
    (repo / "notes.txt").write_text("the user's own untracked file\n")
    (repo / ATTENTION_OPS).write_text((repo / ATTENTION_OPS).read_text() + "# an uncommitted note\n")
    prober, sc = Prober(), scenario()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged
    before = checkout_digest(repo)
    caller, merge = candidate(ATTENTION_OPS, "paged_attention"), candidate(ATTENTION_OPS, "merge_attn_partitions")
    caller.score = 2.0  # ranked first: its edits are tried first, and one of them verifies
    ranked = verify(repo, [caller, merge], repro, prober, None)
    assert ranked[0] is merge and merge.verified and merge.verified_by == "fix-template"
    assert "+    weights = torch.exp(lses - lse)" in merge.verifying_diff
    assert not caller.verified and caller.verified_by is None and caller.verifying_diff == ""
    assert "credited to the callee" in caller.evidence[0] and "merge_attn_partitions" in caller.evidence[0]
    assert checkout_digest(repo) == before


def test_touched_calls_names_the_calls_an_edit_removed_or_changed():
    from tools.hypotheses.verify import touched_calls

    before = "def f(x):\n    y = g(x) + self.h(x)\n    return k(y)\n"
    assert touched_calls(before, "def f(x):\n    y = g(x + 1) + self.h(x)\n    return k(y)\n") == {"g"}
    assert touched_calls(before, "def f(x):\n    y = self.h(x)\n    return k(y)\n") == {"g"}
    assert touched_calls(before, before.replace("return k(y)", "return k(y) * 2")) == set()


def test_only_use_changed_tells_a_switch_to_a_callee_from_other_edits():
    from tools.hypotheses.verify import only_use_changed, touched_calls

    before = "def f(cfg, d):\n    s = g(d)\n    return h(d, cfg.scale)\n"
    restored = "def f(cfg, d):\n    s = g(d)\n    return h(d, d ** -0.5)\n"
    assert touched_calls(before, restored) == {"h", "scale"}  # a property is used without a call
    assert only_use_changed(before, restored, "scale")
    assert not only_use_changed(before, restored.replace("g(d)", "g(d + 1)"), "scale")


def test_a_caller_that_stops_reading_an_input_keeps_the_credit_from_its_new_helper():
    """Regression (ts-prefix-hash-chain's shape went from rank 1 to 2 when the new-helper rule came in):
    a commit adds a correct memoized helper and switches the caller to it, dropping the parent hash
    from what is hashed. The helper is new and the caller's change is only its use, but the caller
    stopped reading its own parameter: the fault is the caller's."""
    from tools.hypotheses.verify import dropped_inputs, only_use_changed

    buggy = "def hash_block(prev_hash, token_ids):\n    return _hash_tuple(tuple(token_ids))\n"
    restored = "def hash_block(prev_hash, token_ids):\n    return hash((prev_hash, tuple(token_ids)))\n"
    assert only_use_changed(buggy, restored, "_hash_tuple")
    assert dropped_inputs(buggy, restored) == ["prev_hash"]
    # the switch to a faulty helper that is given the same inputs drops nothing
    method = "    def scale(self, d):\n        return {}\n"
    assert dropped_inputs(method.format("softmax_scale(d)"), method.format("d ** -0.5")) == []
    assert dropped_inputs("def f(x\n", restored) == []  # unparsable text: nothing claimed


def test_a_restore_that_only_switches_a_caller_to_a_new_helper_credits_the_helper(tmp_path):
    """Regression (the caller was credited): a commit adds a faulty helper and switches the caller to
    it. Restoring the caller removes the divergence, but its change is only that use, and the helper
    has no earlier version to restore: the credit goes to the helper, with the reason."""
    import subprocess

    repo = tree_at_base(tmp_path / "repo", None)
    path = repo / LLAMA
    text = path.read_text().replace("else d ** -0.5, kernels,", "else softmax_scale(d), kernels,")
    path.write_text(text + "\n\ndef softmax_scale(head_dim: int) -> float:\n    return (head_dim + 1) ** -0.5\n")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "scale helper"], cwd=repo)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    prober, sc = Prober(), scenario()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged
    caller, helper = candidate(LLAMA, "LlamaAttention.__init__"), candidate(LLAMA, "softmax_scale")
    caller.commit = helper.commit = sha
    caller.score = 2.0
    ranked = verify(repo, [caller, helper], repro, prober, None)
    assert ranked[0] is helper and helper.verified and helper.verified_by == "restore"
    assert "whose change is only its use of softmax_scale" in helper.evidence[0]
    assert not caller.verified and "credited to the callee" in caller.evidence[0]


RUNNER = "tinyserve/engine/model_runner.py"
# A commit puts the model's forward behind persistent input buffers (a new class) whose positions are
# refreshed only when the token count changes: equal-sized decode steps reuse stale positions.
STATIC_INPUTS = """

class StaticInputs:
    \"\"\"The model's forward behind buffers allocated once; each step's inputs are copied in.\"\"\"

    def __init__(self, forward, max_tokens: int):
        self.forward = forward
        self.positions = torch.zeros(max_tokens, dtype=torch.long)
        self.num_tokens = 0

    def __call__(self, input_ids, positions):
        n = input_ids.shape[0]
        if n != self.num_tokens:
            self.positions[:n].copy_(positions)
            self.num_tokens = n
        return self.forward(input_ids, self.positions[:n])
"""


def test_a_restored_caller_hands_the_credit_to_the_new_class_it_builds_when_its_template_verifies(tmp_path):
    """Regression (the caller was credited): restoring the caller that builds the new class removes
    the divergence, but the fault is in the class. Its methods are reached by the class's name and
    `__call__` takes the credit (by its template edit, or as the callee the caller's change routes)."""
    import subprocess

    repo = tree_at_base(tmp_path / "repo", None)
    path = repo / RUNNER
    build = "        self.model = load_model(config)\n"
    wrapped = build + "        self.model.forward = StaticInputs(self.model.forward, config.max_num_batched_tokens)\n"
    path.write_text(path.read_text().replace(build, wrapped) + STATIC_INPUTS)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "static inputs"], cwd=repo)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    prober = Prober()
    sc = from_dict(
        {
            "model": {"arch": "llama", "seed": 0},
            "target": {"engine": "tinyserve", "dtype": "float32"},
            "workload": {
                "requests": [{"prompt_ids": list(range(3, 15)), "max_tokens": 4, "sampling": {"ignore_eos": True}}]
            },
        }
    )
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged
    caller = candidate(RUNNER, "ModelRunner.__init__")
    init, call = candidate(RUNNER, "StaticInputs.__init__"), candidate(RUNNER, "StaticInputs.__call__")
    for h in (caller, init, call):
        h.commit = sha
    caller.score = 2.0  # ranked first: its restore verifies before the class is looked at
    ranked = verify(repo, [caller, init, call], repro, prober, None)
    assert ranked[0] is call and call.verified
    # Two rules can hand it the credit: its memo-guard template verifying it, or the caller's restore
    # whose only change is its use of `__call__` (the callee rule, which runs first once the caller's
    # restore verified). Either way the class's method, not the caller, is the verified suspect.
    if call.verified_by == "fix-template":
        assert "memo-guard" in call.evidence[0] and "+        if True:" in call.verifying_diff
    else:
        assert call.verified_by == "restore" and "ModelRunner.__init__" in call.evidence[0]
    assert not caller.verified and "credited to the callee" in caller.evidence[0]


SAMPLER = "tinyserve/layers/sampler.py"
# The filters start from the logits before penalties and temperature: a value taken before its update.
TRUNCATED_EARLY = (
    "        logits = self.adjuster(logits, st)\n        truncated = logits\n",
    "        truncated = logits\n        logits = self.adjuster(logits, st)\n",
)


def test_a_value_taken_before_its_input_is_updated_is_verified_by_the_stale_value_template(tmp_path):
    repo = tree_at_base(tmp_path / "repo", TRUNCATED_EARLY, file=SAMPLER)
    sampling = {"temperature": 0.5, "top_p": 0.7, "seed": 5, "ignore_eos": True}
    sc = from_dict(
        {
            "model": {"arch": "llama", "seed": 4},
            "target": {"engine": "tinyserve", "dtype": "float32"},
            "workload": {"requests": [{"prompt_ids": list(range(3, 15)), "max_tokens": 4, "sampling": sampling}]},
        }
    )
    prober = Prober()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged and repro.probe.first.tap.startswith("sampler")
    forward = candidate(SAMPLER, "Sampler.forward")
    ranked = verify(repo, [forward], repro, prober, None)
    assert ranked[0] is forward and forward.verified and forward.verified_by == "fix-template"
    assert "stale-value: `truncated = …` after `logits` is updated" in forward.evidence[0]
    after = [line[1:].strip() for line in forward.verifying_diff.splitlines()[2:] if line[:1] in (" ", "+")]
    assert after.index("truncated = logits") == after.index("logits = self.adjuster(logits, st)") + 1


LOADER = "tinyserve/model_loader.py"
SCALE_NORMS = """

def scale_norms(model, factor):
    \"\"\"Norm weights folded with a factor (for checkpoints stored pre-scaled).\"\"\"
    for name, p in model.named_parameters():
        if factor and name.endswith("norm.weight"):
            p.data.mul_(factor)
"""


def test_a_new_argument_s_effect_is_credited_to_the_new_procedure_it_reaches(tmp_path):
    """Regression (the caller was credited): a commit passes a new argument from the caller through a
    changed callee to a new procedure that mutates the model wrongly. Restoring the caller verifies;
    the callee cannot be restored alone (its signature changed with the caller); the new procedure
    it passes the argument on to, made a no-op as it was before the commit, verifies and is credited."""
    import subprocess

    repo = tree_at_base(tmp_path / "repo", None)
    loader = repo / LOADER
    text = loader.read_text().replace(
        "def load_model(config: Config) -> nn.Module:", "def load_model(config: Config, norm_factor=None) -> nn.Module:"
    )
    text = text.replace(
        "    load_weights(model, config.model)\n    return model.eval()",
        "    load_weights(model, config.model)\n    scale_norms(model, norm_factor)\n    return model.eval()",
    )
    loader.write_text(text + SCALE_NORMS)
    runner = repo / RUNNER
    runner.write_text(
        runner.read_text().replace("self.model = load_model(config)", "self.model = load_model(config, 0.5)")
    )
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "prescaled norms"], cwd=repo)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    prober, sc = Prober(), scenario()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged
    caller, changed, new = (
        candidate(RUNNER, "ModelRunner.__init__"),
        candidate(LOADER, "load_model"),
        candidate(LOADER, "scale_norms"),
    )
    for h in (caller, changed, new):
        h.commit = sha
    caller.score = 2.0
    ranked = verify(repo, [caller, changed, new], repro, prober, None)
    assert ranked[0] is new and new.verified and new.verified_by == "restore"
    assert "a no-op (as before that commit) removes the divergence" in new.evidence[0]
    assert "+    pass" in new.verifying_diff
    assert not caller.verified and not changed.verified


def test_a_procedure_s_no_op_version_keeps_its_header_and_docstring():
    from tools.hypotheses.verify import noop_version

    method = '    @staticmethod\n    def freeze(m, n):\n        """Doc."""\n        m.x = n\n        return\n'
    assert noop_version(method) == '    @staticmethod\n    def freeze(m, n):\n        """Doc."""\n        pass\n'
    assert noop_version("def f(xs, m):\n    for x in xs:\n        x.set(m)\n") == "def f(xs, m):\n    pass\n"
    assert noop_version("def f(x):\n    if x:\n        return x\n") is None  # returns a value: no neutral version
    assert noop_version("def g(xs):\n    yield from xs\n") is None


BLOCKS = """class Blocks:
    def __init__(self):
        self.table = {"a": 1}
        self.hash = "a"

    def fresh(self):
        self._evict()
        return self.table

    def _evict(self):
        self.table.pop(self.hash, None)
        self.hash = None
"""


def test_a_restored_method_brings_back_the_helper_its_commit_deleted(tmp_path):
    """Regression (the restore crashed, so the culprit was untestable): a commit inlines a helper into
    its caller and deletes it. The caller's old version calls the helper; restored alone it fails on
    the missing name. Restored with the deleted sibling, it runs as it did before the commit."""
    import subprocess

    from tools.hypotheses.verify import restore_version
    from tools.source.index import open_index

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "blocks.py").write_text(BLOCKS)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    lazy = BLOCKS.split("    def _evict")[0].rstrip() + "\n"
    (repo / "blocks.py").write_text(lazy.replace("        self._evict()\n", "        self.hash = None\n"))
    subprocess.run([*git, "commit", "-qam", "evict lazily"], cwd=repo, check=True)

    old = open_index(repo, commit="HEAD~1", include_tests=False)
    before = next(s for s in old.find("Blocks.fresh"))
    assert restore_version(repo, "blocks.py", "Blocks.fresh", old.read(before), old)
    namespace: dict = {}
    exec((repo / "blocks.py").read_text(), namespace)
    assert namespace["Blocks"]().fresh() == {}  # the old behaviour: the stale entry is dropped
    assert (repo / "blocks.py").read_text().count("def _evict") == 1
    # a sibling the tree still has is not duplicated
    assert restore_version(repo, "blocks.py", "Blocks.fresh", old.read(before), old)
    assert (repo / "blocks.py").read_text().count("def _evict") == 1


VEC_C = """static float vec_sum(const float * x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) {
        s += x[i];
    }
    return s;
}

float vec_mean(const float * x, int n) {
    return vec_sum(x, n) / n;
}
"""


def test_a_c_function_is_restored_to_its_version_before_the_commit(tmp_path):
    """Regression (verification never ran on a native tree: the restore took only `.py` files, so
    every C/C++ suspect of a llama.cpp case went unverified): a C function is restored in place,
    its neighbour untouched."""
    import subprocess

    from tools.hypotheses.verify import restore_version
    from tools.source.index import open_index

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "vec.c").write_text(VEC_C)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    buggy = VEC_C.replace("for (int i = 0; i < n; ++i)", "for (int i = 0; i + 1 < n; ++i)")
    (repo / "vec.c").write_text(buggy.replace("/ n;", "/ (float) n;"))
    subprocess.run([*git, "commit", "-qam", "unroll"], cwd=repo, check=True)

    old = open_index(repo, commit="HEAD~1", include_tests=False)
    before = next(s for s in old.find("vec_sum"))
    assert restore_version(repo, "vec.c", "vec_sum", old.read(before), old)
    text = (repo / "vec.c").read_text()
    assert "i < n; ++i" in text and "i + 1 < n" not in text  # vec_sum is back
    assert "/ (float) n;" in text  # vec_mean keeps its own change


def test_a_comment_only_change_is_not_reverted_and_does_not_refute_its_function(tmp_path):
    """Regression (lc at-base: the function computing the wrong op had a recent comment edit; its
    revert rebuilt the tree, left the bug in base there, and the -3 refutation ranked the function
    below its own chunk worker): a revert that changes only comments or layout is not run and says
    nothing about the function."""
    import subprocess

    from tools.history import gitrepo
    from tools.hypotheses.verify import function_text, function_text_at, revert_and_probe
    from tools.source.index import same_code

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "vec.c").write_text(VEC_C)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    (repo / "vec.c").write_text(VEC_C.replace("float s = 0.0f;", "float s = 0.0f;  // running sum\n"))
    subprocess.run([*git, "commit", "-qam", "comment"], cwd=repo, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True).stdout
    h = Hypothesis("vec.c", "vec_sum", sha.strip(), "kernel", 0.3, "", [], score=4.0)
    prober = Prober()
    with gitrepo.worktree_pool():
        outcome, before, after = revert_and_probe(repo, h, Reproduction(True, scenario(), None), prober)
        assert not gitrepo._POOL.idle  # judged on HEAD's blob: no scratch checkout taken
    assert outcome is None and prober.engine_runs == 0 and before != after and same_code("vec.c", before, after)
    assert before == function_text(repo, "vec.c", "vec_sum") == function_text_at(repo, "HEAD", "vec.c", "vec_sum")
    assert not same_code("vec.c", before, before.replace("s += x[i]", "s -= x[i]"))


ROTARY_OPS = "tinyserve/ops/rotary.py"


@slow
def test_a_rotation_written_into_its_own_input_at_base_is_verified_by_writing_into_a_copy(tmp_path):
    """Regression (fifth held-out set: no template repaired the helper, its caller kept rank 1): the
    rotation's output aliases its input, so the second half is computed from the overwritten first."""
    aliased = ("    out = torch.empty_like(x)\n", "    out = x\n")
    repo = tree_at_base(tmp_path / "repo", aliased, ROTARY_OPS)
    prober, sc = Prober(), scenario()
    repro = Reproduction(True, sc, prober.probe(sc, repo))
    assert repro.probe.diverged
    rotate = candidate(ROTARY_OPS, "_rotate")
    ranked = verify(repo, [rotate], repro, prober, None)
    assert ranked[0] is rotate and rotate.verified and rotate.verified_by == "fix-template"
    assert "aliased-output" in rotate.evidence[0] and "+    out = x.clone()" in rotate.verifying_diff
