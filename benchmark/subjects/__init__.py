"""Subjects: the code bases under test (docs/design.md §6), looked up lazily by name.

A subject is plain data: which folder is copied into the repo, where it lands,
and who "released" it. The git side (pristine repo, cache) lives in benchmark.build.

Extra subjects (a tiny fake one in tests, a local fork) come from the environment, so
that worker processes see them too:

    DIFFDX_SUBJECTS="minisub=/tmp/minisub:fork@1.2=/src/fork"   # name[@version]=folder, os.pathsep-separated

An entry there overrides a built-in subject of the same name.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

SUBJECTS_ENV = "DIFFDX_SUBJECTS"
TRANSFORMERS_VERSION = "5.24.0"
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")

SUBJECTS = {
    "tinyserve": "benchmark.subjects:tinyserve",
    "transformers": "benchmark.subjects:transformers",
    "llama.cpp": "benchmark.subjects.llamacpp:subject",
}


class SubjectError(ValueError):
    """A subject that is unknown or cannot be snapshotted; the message says why."""


@dataclass(frozen=True)
class Subject:
    name: str
    source: Path                 # folder whose files make up the snapshot
    prefix: str = ""             # where `source` lands under the repo root ("" = the root itself)
    version: str | None = None   # tagged v<version> next to `base`
    maintainer: str = "diffdx maintainers <maintainers@diffdx.invalid>"  # snapshot author, committer of every case commit
    date: str = "2025-01-06T10:00:00+00:00"                              # snapshot author/committer date
    message: str = "Import snapshot"

    def files(self) -> list[Path]:
        """Snapshot files, relative to `source`, sorted (no __pycache__, no bytecode)."""
        if not self.source.is_dir():
            raise SubjectError(f"subject {self.name!r}: folder {self.source} does not exist")
        out = []
        for dirpath, dirnames, filenames in os.walk(self.source):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            out += [Path(dirpath, f).relative_to(self.source) for f in filenames if not f.endswith(SKIP_SUFFIXES)]
        if not out:
            raise SubjectError(f"subject {self.name!r}: folder {self.source} has no files")
        return sorted(out)

    def fingerprint(self) -> str:
        """Content hash of the snapshot and its identity: a changed file means a new pristine repo."""
        h = hashlib.sha256(repr((self.name, self.prefix, self.version, self.maintainer,
                                 self.date, self.message)).encode())
        for rel in self.files():
            h.update(str(rel).encode() + b"\0" + (self.source / rel).read_bytes() + b"\0")
        return h.hexdigest()[:16]

    def copy_to(self, root: Path) -> None:
        """Write the snapshot into the (empty) repo root."""
        dest = root / self.prefix if self.prefix else root
        for rel in self.files():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.source / rel, dest / rel)


def tinyserve() -> Subject:
    return Subject(name="tinyserve", source=Path(__file__).resolve().parent / "tinyserve",
                   maintainer="tinyserve maintainers <maintainers@tinyserve.dev>",
                   date="2025-02-03T09:30:00+00:00", message="tinyserve: import engine snapshot")


def transformers() -> Subject:
    """The installed transformers package, pinned: a different version would change every case."""
    import transformers as hf

    if hf.__version__ != TRANSFORMERS_VERSION:
        raise SubjectError(f"subject 'transformers' is pinned to {TRANSFORMERS_VERSION}, but "
                           f"transformers {hf.__version__} is installed; pip install transformers=={TRANSFORMERS_VERSION}")
    return Subject(name="transformers", source=Path(hf.__file__).resolve().parent, prefix="transformers",
                   version=TRANSFORMERS_VERSION, maintainer="Hugging Face <transformers@huggingface.co>",
                   date="2025-06-12T14:02:11+00:00", message=f"Release: v{TRANSFORMERS_VERSION}")


def env_subjects() -> dict[str, Subject]:
    """Subjects declared in $DIFFDX_SUBJECTS (name[@version]=folder entries)."""
    out = {}
    for entry in filter(None, os.environ.get(SUBJECTS_ENV, "").split(os.pathsep)):
        key, sep, folder = entry.partition("=")
        if not sep or not key or not folder:
            raise SubjectError(f"${SUBJECTS_ENV} entry {entry!r} is not name[@version]=folder")
        name, _, version = key.partition("@")
        out[name] = Subject(name=name, source=Path(folder).expanduser().resolve(), version=version or None)
    return out


def known_subjects() -> list[str]:
    return sorted(set(SUBJECTS) | set(env_subjects()))


def get_subject(name: str) -> Subject:
    """Subject name -> Subject. Imports (and checks) only the subject asked for."""
    extra = env_subjects()
    if name in extra:
        return extra[name]
    if name not in SUBJECTS:
        raise SubjectError(f"unknown subject {name!r}; known subjects: {', '.join(known_subjects())}")
    module, func = SUBJECTS[name].split(":")
    return getattr(importlib.import_module(module), func)()
