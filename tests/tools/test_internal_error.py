"""A bug in diffdx itself must not exit 1 ("diverged"): run_cli answers 5 with the traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from tools.errors import run_cli

def main(argv):
    {body}

sys.exit(run_cli(main, []))
"""


def run(body: str) -> subprocess.CompletedProcess:
    code = SCRIPT.format(body=body)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_an_unexpected_exception_exits_5_with_its_traceback():
    proc = run("return {}['missing']")
    assert proc.returncode == 5
    assert "Traceback" in proc.stderr and "KeyError" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("internal error (a bug in diffdx")


def test_known_errors_keep_their_codes_and_one_line():
    bad = run("from tools.errors import BadInput; raise BadInput('scenario.toml: no [model] table')")
    env = run("from tools.errors import EnvironmentFailure; raise EnvironmentFailure('worker crashed')")
    diverged = run("return 1")
    assert (bad.returncode, env.returncode, diverged.returncode) == (2, 3, 1)
    assert bad.stderr.strip() == "error: scenario.toml: no [model] table" and "Traceback" not in env.stderr
