"""The docs' examples run: every TOML and shell block in docs/ is parsed, probed or executed.

A block is marked by an HTML comment on the line above its fence:

    <!-- test: parse -->            a scenario that must load (and its model config must build)
    <!-- test: invalid -->          a scenario that must be rejected
    <!-- test: probe agree -->      a scenario probed with its tiny model; `agree` or `diverge`
    <!-- test: save NAME -->        written to NAME in the run folder (scenarios are also loaded)
    <!-- test: run exit=N -->       shell lines run in a folder holding every saved file and a
                                    link to benchmark/ (as from a checkout's root); all but the
                                    last must exit 0, the last with N; `expect=TEXT` (quoted if
                                    it has spaces) must appear in the last one's output
    <!-- test: skip (why) -->       not run, for the reason given

`slow` after the action marks the test slow.
"""

import os
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools.scenario import ScenarioError, loads

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
TAGGED = re.compile(r"<!-- test: (?P<action>\w+)(?P<args>[^>]*?) -->\n```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)
FENCE = re.compile(r"^```(toml|bash)\s*$", re.M)
RUN_TIMEOUT_S = 900


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    action: str
    args: tuple[str, ...]
    lang: str
    body: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}:{self.action}"


def doc_blocks() -> list[Block]:
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in TAGGED.finditer(text):
            out.append(
                Block(
                    path.name,
                    text[: m.start()].count("\n") + 1,
                    m["action"],
                    tuple(shlex.split(m["args"])),
                    m["lang"],
                    m["body"],
                )
            )
    return out


BLOCKS = doc_blocks()


def params(*actions: str):
    return [
        pytest.param(b, id=b.id, marks=[pytest.mark.slow] if "slow" in b.args else [])
        for b in BLOCKS
        if b.action in actions
    ]


def saved_files() -> dict[str, str]:
    return {b.args[0]: b.body for b in BLOCKS if b.action == "save"}


def test_every_toml_and_shell_block_is_tested_or_says_why_not():
    for path in DOCS:
        text = path.read_text()
        fences = len(FENCE.findall(text))
        tagged = sum(1 for b in BLOCKS if b.doc == path.name and b.lang in ("toml", "bash"))
        assert fences == tagged, f"{path.name}: {fences - tagged} toml/bash block(s) without a <!-- test: … --> mark"
    assert {b.action for b in BLOCKS} <= {"parse", "invalid", "probe", "save", "run", "skip"}


def test_saved_names_are_unique():
    names = [b.args[0] for b in BLOCKS if b.action == "save"]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("path", DOCS + [ROOT / "CONTRIBUTING.md"], ids=lambda p: p.name)
def test_relative_links_resolve(path):
    for target in re.findall(r"\]\(([^)#:]+\.md)\)", path.read_text()):
        assert (path.parent / target).is_file(), f"{path.name} links to missing {target}"


def scenario_of(block: Block):
    from transformers import AutoConfig

    from tools.probe.checkpoints import model_config_keys

    sc = loads(block.body)
    if "arch" in sc.model:  # the model table must also make a config transformers accepts
        AutoConfig.for_model(sc.model["arch"], **model_config_keys(sc.model))
    return sc


@pytest.mark.parametrize("block", params("parse", "save", "probe"))
def test_scenarios_load(block):
    if block.lang == "toml" and "model" in tomllib.loads(block.body):
        scenario_of(block)


@pytest.mark.parametrize("block", params("invalid"))
def test_invalid_scenarios_are_rejected(block):
    with pytest.raises(ScenarioError):
        loads(block.body)


@pytest.mark.parametrize("block", params("probe"))
def test_scenarios_probe(block):
    from tools.probe.prober import probe

    result = probe(scenario_of(block))
    assert result.diverged == ("diverge" in block.args), result.summary


@pytest.mark.parametrize("block", params("run"))
def test_commands_run(block, tmp_path):
    for name, body in saved_files().items():
        (tmp_path / name).write_text(body)
    (tmp_path / "benchmark").symlink_to(ROOT / "benchmark")
    want = int(next(a for a in block.args if a.startswith("exit="))[len("exit=") :])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lines = [ln for ln in block.body.splitlines() if ln.strip() and not ln.startswith("#")]
    for i, line in enumerate(lines):
        proc = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        expected = want if i == len(lines) - 1 else 0
        assert proc.returncode == expected, (
            f"{line!r} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
        if i == len(lines) - 1:
            for text in (a[len("expect=") :] for a in block.args if a.startswith("expect=")):
                assert text in proc.stdout + proc.stderr, f"{line!r} did not say {text!r}"
        if proc.returncode == 2:  # bad input: one line of error, no traceback
            assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
