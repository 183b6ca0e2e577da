"""The llama.cpp subject: the llama.cpp that llama-cpp-python's pinned sdist vendors, pruned to what
a CPU build of libllama needs (ggml with its CPU backend only, src/, include/, the CMake files, the
licences), so that a case repo stays small and a commit builds in minutes.

The sdist comes from diffdx's cache (downloaded once, tools/engines/llamacpp/build.py); the
pruned tree is extracted once next to it, keyed by the sdist's hash.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from benchmark.subjects import Subject, SubjectError
from tools.engines.llamacpp.build import SDIST_SHA256, VERSION, BuildError, build_root, fetch_sdist

VENDORED = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
# What the CPU build reads, as patterns on paths inside the vendored llama.cpp; the rest (other
# backends, models/, tools/, examples/, tests/, docs, the Python converters) never compiles.
KEEP = (
    "CMakeLists.txt",
    "LICENSE",
    "AUTHORS",
    "cmake/*",
    "include/*",
    "src/*",
    "licenses/*",
    "ggml/CMakeLists.txt",
    "ggml/cmake/*",
    "ggml/include/*",
    "ggml/src/*",  # the core files; of the backend folders only ggml-cpu (kept() below)
    "ggml/src/ggml-cpu/*",
    "vendor/CMakeLists.txt",
    "vendor/*/CMakeLists.txt",  # header-only targets the top CMakeLists declares
    "vendor/hash/*",  # a static library it declares
)


def kept(path: str) -> bool:
    """Whether a path inside the vendored llama.cpp belongs to the subject. Pure."""
    if path.startswith("ggml/src/") and "/" in path.removeprefix("ggml/src/"):
        return path.startswith("ggml/src/ggml-cpu/")
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in KEEP)


def pruned_source() -> Path:
    """The pruned llama.cpp folder, extracted once from the pinned sdist (atomically)."""
    out = build_root() / f"subject-{SDIST_SHA256[:16]}"
    if (out / "CMakeLists.txt").is_file():
        return out
    try:
        sdist = fetch_sdist()
    except BuildError as e:
        raise SubjectError(f"subject 'llama.cpp' is unavailable: {e}") from None
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rel = member.name.removeprefix(VENDORED)
                if member.isfile() and rel != member.name and kept(rel):
                    _extract(tar, member, tmp / rel)
        os.rename(tmp, out)
    except OSError:
        if not (out / "CMakeLists.txt").is_file():
            raise
        # else another worker extracted it first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = tar.extractfile(member)
    assert src is not None  # a regular file always has a body
    dest.write_bytes(src.read())
    dest.chmod(0o755 if member.mode & 0o111 else 0o644)


def subject() -> Subject:
    return Subject(
        name="llama.cpp",
        source=pruned_source(),
        maintainer="ggml authors <ggml@ggml.invalid>",
        date="2025-07-01T12:00:00+00:00",
        message=f"Import llama.cpp (as vendored by llama-cpp-python {VERSION})",
    )
