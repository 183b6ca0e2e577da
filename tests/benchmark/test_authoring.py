"""Authoring as one tool: CaseSpec -> case folder, the TOML writer, and `python -m benchmark.author [--check]`."""

from __future__ import annotations

import tomllib

import pytest

from benchmark import author
from benchmark.authoring.common import CaseSpec, repro_data, repro_toml, with_good_ref
from benchmark.authoring.patches import Step, write_patches
from benchmark.authoring.toml_writer import toml_document
from benchmark.build import build_case_repo, git
from benchmark.cases import BUNDLED_CASES_DIR, CaseError, load_case, load_truth
from tests.benchmark.conftest import REPRO, STEPS

# a bundled case whose regeneration is quick (tinyserve, 7 commits): the CLI test checks it byte for byte
# (.ci/run checks every case with `python -m benchmark.author --check`)
QUICK_CASE = "ts-prefix-hash-chain"


def spec(**overrides) -> CaseSpec:
    fields = dict(
        subject="minisub",
        id="mini-scale",
        issue_number=501,
        category="numerics",
        modeled_on=["vllm-project/vllm#5639"],
        title="outputs off by one",
        issue="\nOutputs are off by one since the upgrade.\n\n",
        repro=dict(REPRO),
        truth_file="minisub/ops.py",
        truth_function="scale",
        component="ops",
        mechanism="scale() adds a stray constant",
        steps=[STEPS["docs"], STEPS["bug"], STEPS["mixer"]],
        bug_index=2,
    )
    return CaseSpec(**(fields | overrides))


def test_writer_keeps_prompts_on_one_line_and_reads_back_the_same_data():
    data = repro_data(
        {"arch": "llama", "seed": 0, "rms_norm_eps": 1e-5},
        {"engine": "tinyserve", "dtype": "float32", "options": {"block_size": 16, "native_kernels": []}},
        [{"prompt_ids": [5, 6, 7], "max_tokens": 2, "sampling": {"temperature": 0.0, "ignore_eos": True}}],
        good_ref="v0.4",
        reference={"engine": "refmodel"},
    )
    text = toml_document(data, comment="two lines\nof comment")
    assert text == (
        "# two lines\n# of comment\n"
        'good_ref = "v0.4"\n\n'
        '[model]\narch = "llama"\nseed = 0\nrms_norm_eps = 1e-05\n\n'
        '[target]\nengine = "tinyserve"\ndtype = "float32"\noptions = { block_size = 16, native_kernels = [] }\n\n'
        '[reference]\nengine = "refmodel"\n\n'
        "[[workload.requests]]\nprompt_ids = [5, 6, 7]\nmax_tokens = 2\n"
        "sampling = { temperature = 0.0, ignore_eos = true }\n"
    )
    assert tomllib.loads(text) == data
    assert toml_document({"title": 'say "hi"\nnow, Tomás'}) == 'title = "say \\"hi\\"\\nnow, Tomás"\n'


def test_spec_writes_the_case_folder_the_loader_reads(cases_dir, tmp_path):
    folder = spec().write(cases_dir)
    case, truth = load_case(folder), load_truth(folder)
    assert case.track == "easy" and case.patch_stems() == ["01-document-shift", "02-fold-scale", "03-mixer-complement"]
    assert truth.commit == "02-fold-scale" and truth.function == "scale"
    assert (folder / "issue.md").read_text() == "Outputs are off by one since the upgrade.\n"
    assert (folder / "case.toml").read_text().splitlines()[3:5] == ['category = "numerics"', 'track = "easy"']
    assert git(build_case_repo(folder, tmp_path / "built"), "log", "-1", "--format=%s") == (
        "mixer: name the complement weight"
    )


def test_base_steps_fold_into_base_and_the_truth_names_no_commit(cases_dir, tmp_path):
    folder = spec(
        track="at-base", base_steps=[STEPS["readme"], STEPS["bug"]], steps=[STEPS["docs"]], bug_index=None
    ).write(cases_dir)
    names = sorted(p.name for p in (folder / "commits").glob("*.patch"))
    assert names == ["00-base-01-readme.patch", "00-base-02-fold-scale.patch", "01-document-shift.patch"]
    assert load_truth(folder).commit is None and load_case(folder).track == "at-base"
    repo = build_case_repo(folder, tmp_path / "built")
    assert "x * 2 + 1" in git(repo, "show", "base:minisub/ops.py"), "the bug is in base itself"
    assert git(repo, "rev-list", "--count", "base..HEAD") == "1"


def test_tags_and_good_ref_reach_case_toml_and_repro(cases_dir):
    folder = spec(tags={"v0.4": 1}, good_ref="v0.4").write(cases_dir)
    assert tomllib.loads((folder / "case.toml").read_text())["tags"] == {"v0.4": "01-document-shift"}
    assert tomllib.loads((folder / "repro.toml").read_text())["good_ref"] == "v0.4"
    text = repro_toml({"arch": "llama"}, {"engine": "e"}, [{"prompt_ids": [1]}], good_ref="HEAD~2", comment="why")
    assert with_good_ref(text, "v1").splitlines()[:2] == ["# why", 'good_ref = "v1"']
    assert with_good_ref(repro_toml({"arch": "llama"}, {"engine": "e"}, [], comment="why"), "v1").startswith(
        '# why\ngood_ref = "v1"\n\n[model]\n'
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"track": "medium"}, "track 'medium' is not one of easy, hard, at-base, real"),
        ({"bug_index": 4}, "bug_index 4 is not a step"),
        ({"bug_index": None}, "no bug_index and no base_steps"),
        ({"tags": {"v1": 9}}, "tag 'v1' names step 9"),
    ],
)
def test_spec_rejects_what_no_case_can_be(overrides, message):
    with pytest.raises(ValueError, match=message):
        spec(**overrides)


def test_unknown_track_in_a_case_folder_is_a_clear_error(cases_dir):
    folder = spec().write(cases_dir)
    text = (folder / "case.toml").read_text()
    (folder / "case.toml").write_text(text.replace('track = "easy"', 'track = "medium"'))
    with pytest.raises(CaseError, match="track 'medium' is not one of easy, hard, at-base, real"):
        load_case(folder)
    (folder / "case.toml").write_text(text.replace('track = "easy"\n', ""))
    assert load_case(folder).track == "easy", "outside cases without a track run unchanged"


def test_check_names_every_file_that_differs(cases_dir):
    case = spec()
    folder = case.write(cases_dir)
    assert author.check_cases([case], cases_dir) == []
    (folder / "issue.md").write_text("edited by hand\n")
    (folder / "commits" / "04-extra.patch").write_text("")
    (folder / "truth.toml").unlink()
    assert author.check_cases([case], cases_dir) == [
        "mini-scale/truth.toml: only in the regenerated case",
        "mini-scale/commits/04-extra.patch: committed but not written by the authoring",
        "mini-scale/issue.md: differs from what the authoring writes",
    ]


def test_every_bundled_case_has_one_authoring_module():
    """Every authored case (patches written from data) comes from one module; a release-history
    case (`[releases]`, the real track) is PyPI releases as published, with nothing to author."""
    found = author.discover()
    folders = [p for p in BUNDLED_CASES_DIR.iterdir() if (p / "case.toml").is_file()]
    authored = sorted(p.name for p in folders if "releases" not in tomllib.loads((p / "case.toml").read_text()))
    assert sorted(found) == authored
    assert len(authored) < len(folders)  # the real track's release cases are there, and left out here
    assert all(module.startswith("benchmark.authoring.") for module, _ in found.values())


def test_old_import_path_still_gives_the_library():
    """Case modules written against `from benchmark.author import Step, Replacement, write_patches` keep working."""
    from benchmark.authoring import patches

    assert author.Step is Step and author.write_patches is write_patches and author.Replacement is patches.Replacement


def test_cli_checks_a_bundled_case_byte_for_byte(capsys):
    assert author.main(["--check", QUICK_CASE]) == 0
    assert capsys.readouterr().out.strip() == "ok: 1 cases match their authoring"
    assert author.main(["no-such-case"]) == 2


@pytest.mark.slow
def test_every_bundled_case_is_what_its_authoring_writes(capsys):
    """issue 15 item 4: the committed case files are regenerated byte for byte; .ci/run runs the same check
    (`python -m benchmark.author --check`). Regression: ts-base-gemma2-window-layers and ts-base-int8-truncate
    had drifted (modeled_on) while CI checked one case only."""
    assert author.main(["--check"]) == 0, capsys.readouterr().out
