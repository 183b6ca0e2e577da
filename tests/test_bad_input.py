"""Bad input to every CLI: one line `error: …` on stderr and the documented exit code
(tools/errors.py: 2 bad input, 3 environment failure), never a traceback, never an engine run.

Each test runs the real command as a subprocess. Regression tests for issue 16's list: a
--target-source that is missing or a file was dropped and the installed engine probed
("agree"); --taps matching nothing gave an empty table and "agree"; [reference] dtype was
ignored (now it sets the trusted run's precision; half precision is refused); an unreachable GitHub was "the issue is empty"; a busy port was AttributeError 'jobs'.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tools.errors import BAD_INPUT, ENVIRONMENT

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = """
[model]
arch = "llama"
[target]
engine = "tinyserve"
dtype = "float32"
[[workload.requests]]
prompt_ids = [1, 5, 9]
max_tokens = 4
"""
SLOW = pytest.mark.slow  # same check, another spelling: the CI subset keeps one per row
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused


def cli(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1,localhost", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, cwd=ROOT, env=full_env, timeout=timeout
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *words: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines and lines[-1].startswith("error: "), proc.stderr[-2000:]
    for word in words:
        assert word in lines[-1], lines[-1]


def scenario_file(tmp_path: Path, text: str = SCENARIO) -> str:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return str(path)


# --- tools.probe.prober -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda t: t / "missing", ["does not exist"]),
        (lambda t: (t / "file.py").write_text("x") and t / "file.py", ["is a file"]),
        (lambda t: (t / "empty").mkdir() or t / "empty", ["no `tinyserve/` package", "installed copy"]),
        pytest.param(
            lambda t: (t / "fork" / "tinyserve").mkdir(parents=True) or t / "fork" / "tinyserve",
            ["did you mean"],
            marks=SLOW,
        ),
    ],
)
def test_probe_target_source_must_hold_the_package(tmp_path, make, words):
    proc = cli("tools.probe.prober", "--scenario", scenario_file(tmp_path), "--target-source", str(make(tmp_path)))
    assert_one_line_error(proc, BAD_INPUT, "--target-source", *words)


def test_probe_taps_matching_nothing_are_an_error(tmp_path):
    proc = cli("tools.probe.prober", "--scenario", scenario_file(tmp_path), "--taps", "layers.*.attn.q", "layers.7.*")
    assert_one_line_error(proc, BAD_INPUT, "'layers.7.*' matches no tap", "2 layers")


@pytest.mark.parametrize(
    "edit,words",
    [
        (
            SCENARIO + '[reference]\nengine = "transformers"\ndtype = "float16"\n',
            ["[reference] dtype", "cannot be the trusted"],
        ),
        (SCENARIO.replace("max_tokens = 4", "max_tokens = 2000"), ["exceeds the model's 1024 positions"]),
        pytest.param(
            SCENARIO.replace("max_tokens = 4", "max_tokens = 100000000"), ["max_tokens must be between"], marks=SLOW
        ),
        (SCENARIO.replace("prompt_ids = [1, 5, 9]", 'prompt = "  "'), ["prompt is empty"]),
        pytest.param(
            SCENARIO.replace("prompt_ids = [1, 5, 9]", "prompt_ids = [1, 5, 99999]"),
            ["outside the model's vocabulary"],
            marks=SLOW,
        ),
        (
            SCENARIO.replace('dtype = "float32"', 'dtype = "float32"\noptions = { prefix_cashing = true }'),
            ["prefix_cashing", "not accepted by tinyserve"],
        ),
        pytest.param(
            SCENARIO.replace('engine = "tinyserve"', 'engine = "vllm"'), ["unknown engine 'vllm'"], marks=SLOW
        ),
        ("typo = 1\n" + SCENARIO, ["unknown top-level keys ['typo']"]),
        pytest.param(
            SCENARIO.replace("[[workload.requests]]", "[workload]\nrequest = []\n[[workload.requests]]"),
            ["[workload] has unknown keys"],
            marks=SLOW,
        ),
        pytest.param(SCENARIO + "[[workload.requests]]\nprompt_ids = [1]\n" * 300, ["at most 256"], marks=SLOW),
    ],
)
def test_probe_scenario_checked_before_any_engine_runs(tmp_path, edit, words):
    proc = cli("tools.probe.prober", "--scenario", scenario_file(tmp_path, edit))
    assert_one_line_error(proc, BAD_INPUT, *words)


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--reference", "transformers:bfloat16"], ["[reference] dtype"]),
        pytest.param(["--target", "tinyserve:float32:block_size"], ["not key=value"], marks=SLOW),
        pytest.param(["--target", "a:b:c:d"], ["is not ENGINE"], marks=SLOW),
    ],
)
def test_probe_engine_spec_flags_are_checked(tmp_path, argv, words):
    proc = cli("tools.probe.prober", "--scenario", scenario_file(tmp_path), *argv)
    assert_one_line_error(proc, BAD_INPUT, *words)


def test_probe_missing_scenario_file(tmp_path):
    assert_one_line_error(cli("tools.probe.prober", "--scenario", str(tmp_path / "nope.toml")), BAD_INPUT, "not found")


# --- agent.run ------------------------------------------------------------------------------------


def test_agent_run_out_that_is_a_file(tmp_path):
    (tmp_path / "out").write_text("")
    proc = cli("agent.run", "--issue", "1101", "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, BAD_INPUT, "is a file")


def test_agent_run_out_that_is_unwritable():
    proc = cli("agent.run", "--issue", "1101", "--out", "/proc/diffdx-out")
    assert_one_line_error(proc, ENVIRONMENT, "not writable")


def test_agent_run_config_value_of_the_wrong_type(tmp_path):
    (tmp_path / "run.toml").write_text('engine_timeout_s = "ten minutes"\n')
    proc = cli("agent.run", "--issue", "1101", "--config", str(tmp_path / "run.toml"), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, BAD_INPUT, "engine_timeout_s must be > 0")


def test_agent_run_issue_without_model_or_prompts_names_what_is_missing(tmp_path):
    (tmp_path / "issue.md").write_text("The output is wrong since the upgrade.\n")
    proc = cli(
        "agent.run",
        "--issue-file",
        str(tmp_path / "issue.md"),
        "--target-source",
        str(tmp_path),
        "--out",
        str(tmp_path / "o"),
    )
    assert_one_line_error(proc, BAD_INPUT, "missing: model", "prompts (")


def test_agent_run_issue_with_prose_prompts_is_read(tmp_path):
    """Prompts given as a numbered list of quoted strings are understood: with them the only
    missing field is named (here the model), not the prompts."""
    (tmp_path / "issue.md").write_text('Wrong output. Prompts:\n1. "The capital of France is"\n2. "Once upon"\n')
    proc = cli(
        "agent.run",
        "--issue-file",
        str(tmp_path / "issue.md"),
        "--target-source",
        str(tmp_path),
        "--out",
        str(tmp_path / "o"),
    )
    assert_one_line_error(proc, BAD_INPUT, "missing: model")
    assert "prompts (" not in proc.stderr


def test_agent_run_github_unreachable_says_so(tmp_path):
    proc = cli(
        "agent.run",
        "--issue",
        "7",
        "--repo",
        "acme/engine",
        "--target-source",
        str(tmp_path),
        "--out",
        str(tmp_path / "o"),
        env={"GITHUB_API_URL": UNREACHABLE},
    )
    assert_one_line_error(proc, ENVIRONMENT, "could not reach the GitHub API at 127.0.0.1")


def test_agent_run_target_source_without_the_package(tmp_path):
    (tmp_path / "issue.md").write_text("Wrong output.\n")
    proc = cli(
        "agent.run",
        "--issue-file",
        str(tmp_path / "issue.md"),
        "--repro",
        scenario_file(tmp_path),
        "--target-source",
        str(tmp_path),
        "--out",
        str(tmp_path / "o"),
    )
    assert_one_line_error(proc, BAD_INPUT, "no `tinyserve/` package")


# --- agent.triage ---------------------------------------------------------------------------------


def test_triage_classify_missing_file(tmp_path):
    proc = cli("agent.triage", "classify", str(tmp_path / "issues.jsonl"))
    assert_one_line_error(proc, BAD_INPUT, "no such file")


def test_triage_issues_must_be_numbers():
    proc = cli("agent.triage", "--repo", "acme/engine", "--issues", "1,x", env={"GITHUB_API_URL": UNREACHABLE})
    assert_one_line_error(proc, BAD_INPUT, "--issues '1,x'", "'x' is not one")


def test_triage_since_must_be_a_date():
    proc = cli("agent.triage", "--repo", "acme/engine", "--since", "last tuesday", env={"GITHUB_API_URL": UNREACHABLE})
    assert_one_line_error(proc, BAD_INPUT, "--since 'last tuesday' is not a date")


def test_triage_unknown_repo_is_bad_input(tmp_path):
    from tests.tools.fake_github import FakeGitHub

    with FakeGitHub([], repo="acme/engine") as gh:
        proc = cli(
            "agent.triage",
            "--repo",
            "acme/other",
            "--issues",
            "3",
            "--db",
            str(tmp_path / "t.db"),
            env={"GITHUB_API_URL": gh.url},
        )
    assert_one_line_error(proc, BAD_INPUT, "acme/other", "404")


def test_triage_github_unreachable_says_so(tmp_path):
    proc = cli(
        "agent.triage",
        "--repo",
        "acme/engine",
        "--issues",
        "1",
        "--db",
        str(tmp_path / "t.db"),
        env={"GITHUB_API_URL": UNREACHABLE},
    )
    assert_one_line_error(proc, ENVIRONMENT, "could not reach the GitHub API")


def test_triage_serve_on_a_busy_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = cli("agent.triage", "serve", "--port", str(port), "--secret", "s", "--db", str(tmp_path / "t.db"))
    assert_one_line_error(proc, ENVIRONMENT, f"cannot listen on 127.0.0.1:{port}", "another process holds the port")


@pytest.mark.parametrize("length", ["abc", "-5", ""])
def test_webhook_bad_content_length_is_a_400(length):
    """A negative length used to make the handler read until the client hung up; text, a traceback."""
    from agent.triage_webhook import WebhookServer

    server = WebhookServer(("127.0.0.1", 0), "secret", lambda repo, issue: None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(server.server_address, timeout=10) as s:
            header = f"Content-Length: {length}\r\n" if length else ""
            s.sendall(f"POST / HTTP/1.1\r\nHost: x\r\n{header}X-GitHub-Event: issues\r\n\r\n{{}}".encode())
            answer = b""
            while chunk := s.recv(4096):  # the server closes after its reply
                answer += chunk
            answer = answer.decode()
    finally:
        server.shutdown()
        server.server_close()
    assert answer.startswith("HTTP/1.0 400") and "malformed Content-Length" in answer.split("\r\n\r\n", 1)[1]


def test_webhook_signed_body_that_is_not_an_object_is_a_400():
    from agent.triage_webhook import WebhookServer, sign

    server = WebhookServer(("127.0.0.1", 0), "secret", lambda repo, issue: None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body = b"[1, 2]"
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.server_address[1]}/",
        data=body,
        method="POST",
        headers={"X-Hub-Signature-256": sign("secret", body), "X-GitHub-Event": "issues"},
    )
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert e.value.code == 400 and b"not a JSON object" in e.value.read()


# --- benchmark.run / benchmark.validate -----------------------------------------------------------


def test_benchmark_run_out_that_is_a_file(tmp_path):
    (tmp_path / "out").write_text("")
    assert_one_line_error(cli("benchmark.run", "--out", str(tmp_path / "out")), BAD_INPUT, "is a file")


def test_benchmark_run_out_that_is_unwritable():
    assert_one_line_error(cli("benchmark.run", "--out", "/proc/diffdx-out"), ENVIRONMENT, "not writable")


def test_benchmark_run_unknown_case(tmp_path):
    proc = cli("benchmark.run", "no-such-case", "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, BAD_INPUT, "unknown case 'no-such-case'")


def test_benchmark_validate_unknown_case():
    assert_one_line_error(cli("benchmark.validate", "no-such-case"), BAD_INPUT, "unknown case 'no-such-case'")


def test_benchmark_run_list_names_every_case_and_works_with_cases_dir(tmp_path):
    from benchmark.cases import load_cases

    cases = load_cases()
    proc = cli("benchmark.run", "--list")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()[1:]
    assert len(rows) == len(cases)
    for case, row in zip(cases, rows):
        assert row.split()[:4] == [case.id, str(case.issue_number), case.subject, case.category]
        assert row.endswith(case.title)
    picked = tmp_path / "cases"
    picked.mkdir()
    (picked / cases[0].id).symlink_to(cases[0].dir)
    proc = cli("benchmark.run", "--list", "--cases-dir", str(picked))
    assert proc.returncode == 0 and proc.stdout.splitlines()[1].split()[0] == cases[0].id
    assert_one_line_error(
        cli("benchmark.run", "--list", "--cases-dir", str(tmp_path / "none")), BAD_INPUT, "does not exist"
    )


@pytest.mark.parametrize(
    "module",
    [
        ("tools.probe.prober",),
        ("agent.run",),
        ("agent.triage", "classify"),
        ("agent.triage", "serve"),
        ("agent.triage",),
        ("benchmark.run",),
        ("benchmark.validate",),
    ],
)
def test_every_cli_documents_the_exit_codes(module):
    proc = cli(*module, "--help")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "exit status: 0 agree" in text and "2 bad input" in text
    assert "3 environment failure" in text


def test_the_bad_input_rows_never_wrote_a_report(tmp_path):
    """An up-front error leaves no report claiming anything: the --out folder stays empty."""
    (tmp_path / "issue.md").write_text("broken\n")
    cli(
        "agent.run",
        "--issue-file",
        str(tmp_path / "issue.md"),
        "--target-source",
        str(tmp_path),
        "--out",
        str(tmp_path / "o"),
    )
    assert not (tmp_path / "o" / "report.json").exists() and not (tmp_path / "o" / "args.json").exists()


# --- a newcomer's odd inputs: refused at once, with the field named ------------------------------------


def test_a_typo_is_refused_before_torch_is_imported(tmp_path):
    """Regression: every refusal waited for torch and transformers (17-44 s under load): the prober
    imported torch at module level and preflight built an AutoConfig before any key check. The config
    fields are read from transformers once per installed version, then from a cached file."""
    edit = SCENARIO.replace('arch = "llama"', 'arch = "llama"\nnum_hidden_layer = 3')
    cli("tools.probe.prober", "--scenario", scenario_file(tmp_path, edit))  # the first reads the config fields
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tools.probe.prober", "--scenario", scenario_file(tmp_path, edit)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == BAD_INPUT and "did you mean num_hidden_layers" in proc.stderr, proc.stderr[-500:]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "transformers" not in imported


@pytest.mark.parametrize(
    "edit,words",
    [
        (  # regression: gemma2's soft-capping on a llama was kept as an unused attribute, and the probe said "agree"
            SCENARIO.replace('arch = "llama"', 'arch = "llama"\nattn_logit_softcapping = 50.0'),
            ["attn_logit_softcapping belong(s) to the gemma2 config, not llama's", "tinyserve would ignore it"],
        ),
        (  # regression: a float32 trusted run judged a float64 target, and "agree" came with ratios of 893
            SCENARIO.replace('dtype = "float32"', 'dtype = "float64"') + '[reference]\ndtype = "float32"\n',
            ["[reference] dtype = 'float32' is less precise than the target's 'float64'"],
        ),
        (  # regression: 50 s under load, the time a worker takes to start and say so
            SCENARIO.replace('engine = "tinyserve"', 'engine = "nosuch_adapter:Engine"'),
            ["[target] engine 'nosuch_adapter:Engine': no module 'nosuch_adapter'"],
        ),
        (SCENARIO.replace("max_tokens = 4", "max_tokens = 0"), ["max_tokens must be between 1"]),
        (SCENARIO.replace("[[workload.requests]]\nprompt_ids = [1, 5, 9]\nmax_tokens = 4\n", ""), ["is empty"]),
    ],
)
def test_odd_scenarios_are_refused_naming_the_field(tmp_path, edit, words):
    assert_one_line_error(cli("tools.probe.prober", "--scenario", scenario_file(tmp_path, edit)), BAD_INPUT, *words)


@SLOW
def test_an_adapter_whose_capabilities_raise_is_bad_input(tmp_path):
    """Regression: the raise was swallowed (no options or sampling checked) and the run then failed as an
    environment failure, a minute later."""
    (tmp_path / "raising_adapter.py").write_text(
        "class Engine:\n    def capabilities(self):\n        raise RuntimeError('not ready')\n"
    )
    edit = SCENARIO.replace('engine = "tinyserve"', 'engine = "raising_adapter:Engine"')
    proc = cli(
        "tools.probe.prober",
        "--scenario",
        scenario_file(tmp_path, edit),
        env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
        timeout=600,
    )
    assert_one_line_error(proc, BAD_INPUT, "capabilities() raised RuntimeError: not ready")


def test_agent_run_good_ref_needs_a_git_tree_that_has_it(tmp_path):
    """Regression: good_ref with a --target-source outside any git repository was dropped without a word
    (the report's bisection: "not run"); so was a good_ref naming no commit."""
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "benchmark" / "subjects" / "tinyserve", tree)
    (tmp_path / "issue.md").write_text("Greedy output differs from transformers.\n")
    repro = scenario_file(tmp_path, 'good_ref = "v0.1"\n' + SCENARIO)
    argv = ["agent.run", "--issue-file", str(tmp_path / "issue.md"), "--repro", repro, "--target-source", str(tree)]
    assert_one_line_error(cli(*argv, "--out", str(tmp_path / "o")), BAD_INPUT, "good_ref = 'v0.1'", "not in a git")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(
        ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init", "--allow-empty"],
        check=True,
    )
    assert_one_line_error(cli(*argv, "--out", str(tmp_path / "o")), BAD_INPUT, "names no commit")


def test_benchmark_run_case_given_twice_is_bad_input(tmp_path):
    """Regression: a case named twice was run and scored twice, weighing the benchmark's scores."""
    case = sorted(p.name for p in (ROOT / "benchmark" / "cases").iterdir() if (p / "case.toml").is_file())[0]
    proc = cli("benchmark.run", case, case, "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, BAD_INPUT, "given more than once", case)


@SLOW
@pytest.mark.parametrize("command", ["prober", "agent"])
def test_a_checkpoint_whose_weights_hold_a_nan_cannot_be_judged(tmp_path, command):
    """Regression: NaN rows in both runs were blanked and read as agreement up to the sampler, whose
    probabilities then "diverged" (ratio 5e4): a false alarm, exit 1. Now: cannot judge, exit 2."""
    import shutil

    from safetensors.torch import load_file, save_file

    from tools.probe.checkpoints import ensure_checkpoint

    checkpoint = tmp_path / "nan"
    shutil.copytree(ensure_checkpoint({"arch": "llama"}), checkpoint)
    weights = load_file(checkpoint / "model.safetensors")
    weights["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    repro = scenario_file(tmp_path, SCENARIO.replace('arch = "llama"', f'path = "{checkpoint}"'))
    if command == "prober":
        proc = cli("tools.probe.prober", "--scenario", repro, timeout=900)
    else:
        tree = tmp_path / "tree"
        shutil.copytree(ROOT / "benchmark" / "subjects" / "tinyserve", tree)
        (tmp_path / "issue.md").write_text("Greedy output differs from transformers.\n")
        argv = ["--issue-file", str(tmp_path / "issue.md"), "--repro", repro, "--target-source", str(tree)]
        proc = cli("agent.run", *argv, "--quiet", "--out", str(tmp_path / "o"), timeout=900)
    assert proc.returncode == BAD_INPUT, proc.stderr[-2000:]
    assert "cannot judge: the trusted reference" in proc.stderr and "NaN or inf at layers.0.mlp.down" in proc.stderr
    assert "Traceback" not in proc.stderr
