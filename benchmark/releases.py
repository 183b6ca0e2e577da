"""Release histories (docs/design.md §6b): a `[releases]` table -> a git repo of PyPI releases.

Each release's wheel is fetched once with `pip download --no-deps --only-binary=:all:` into
the diffdx cache (`<cache>/wheels/<package>-<version>/`); offline re-runs reuse it. A wheel is
downloaded into a temporary folder and renamed into place, so a failed fetch leaves nothing
half-written behind. The repo: the oldest release is the first commit (tags `base`,
`v<oldest>`), every later release one commit (author "Release", message `Release: v<version>`,
a fixed date per position) tagged `v<version>`. The wheel's package folder lands at the repo
root, so `PYTHONPATH=<repo>` imports the release.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath

from tools.probe.checkpoints import cache_root

RELEASE_IDENTITY = "Release <release@pypi.invalid>"
FIRST_DATE = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)  # release i is dated FIRST_DATE + i days


class ReleaseError(RuntimeError):
    """A release that cannot be fetched or unpacked; the message names package and version."""


@dataclass(frozen=True)
class Releases:
    package: str  # PyPI distribution name
    versions: tuple[str, ...]  # oldest first

    @property
    def folder(self) -> str:
        """The import package the wheel holds: 'transformers', 'typing-extensions' -> 'typing_extensions'."""
        return re.sub(r"[-.]+", "_", self.package).lower()

    def tags(self) -> list[str]:
        return [f"v{v}" for v in self.versions]

    def fingerprint(self) -> str:
        return hashlib.sha256(repr((self.package, self.versions, RELEASE_IDENTITY, FIRST_DATE)).encode()).hexdigest()[
            :16
        ]


def check_order(package: str, versions: list[str]) -> str | None:
    """None when `versions` are valid and strictly increasing, else what is wrong (one line)."""
    from packaging.version import InvalidVersion, Version

    try:
        parsed = [Version(v) for v in versions]
    except InvalidVersion as e:
        return f"{package}: {e}"
    for (a, pa), (b, pb) in zip(zip(versions, parsed), zip(versions[1:], parsed[1:])):
        if pb <= pa:
            return f"{package} versions must be listed oldest first without repeats: {b} comes after {a}"
    return None


def wheel_path(package: str, version: str) -> Path:
    """The cached wheel of `package==version`, fetched first if it is not cached."""
    folder = cache_root() / "wheels" / f"{package}-{version}"
    cached = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if cached:
        return cached[0]
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".fetch-{package}-{version}-", dir=folder.parent))
    try:
        _pip_download(package, version, tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process cached it first; its wheel is the same file
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(folder.glob("*.whl"))[0]


def _pip_download(package: str, version: str, dest: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        f"{package}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if proc.returncode == 0 and len(wheels) == 1:
        return
    raise ReleaseError(_why_not_fetched(package, version, proc.stdout + proc.stderr))


def _why_not_fetched(package: str, version: str, log: str) -> str:
    """pip's log -> one line: a version the index lacks, or nothing fetchable at all."""
    offered = re.search(r"\(from versions: ([^)]*)\)", log)
    listed = offered.group(1).strip() if offered else ""
    if listed and listed != "none":
        recent = ", ".join(listed.split(", ")[-5:])
        return f"{package}=={version} does not exist on the package index (latest there: {recent})"
    if offered:  # pip cannot tell an unknown package from an unreachable index
        return (
            f"{package}=={version}: no wheel can be fetched: the package is unknown to the index, or the "
            f"index cannot be reached (offline) and {cache_root() / 'wheels'} holds no cached wheel"
        )
    last = [line for line in log.strip().splitlines() if line.strip()]
    return f"{package}=={version}: pip download failed: {last[-1][:200] if last else 'no output'}"


def unpack_package(wheel: Path, folder: str, dest: Path) -> None:
    """Extract the wheel's `folder/` (no bytecode) into `dest/folder`."""
    with zipfile.ZipFile(wheel) as zf:
        members = [
            n
            for n in zf.namelist()
            if PurePosixPath(n).parts[:1] == (folder,)
            and not n.endswith((".pyc", ".pyo", "/"))
            and "__pycache__" not in n
        ]
        if not members:
            tops = sorted({PurePosixPath(n).parts[0] for n in zf.namelist()})
            raise ReleaseError(f"{wheel.name} holds no package folder {folder}/ (top level: {', '.join(tops)})")
        for name in members:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))


def release_date(index: int) -> str:
    return (FIRST_DATE + timedelta(days=index)).isoformat()


def write_history(releases: Releases, work: Path, git) -> None:
    """Commit each release into the empty repo `work` (`git` is benchmark.build.git)."""
    for i, version in enumerate(releases.versions):
        wheel = wheel_path(releases.package, version)
        shutil.rmtree(work / releases.folder, ignore_errors=True)
        unpack_package(wheel, releases.folder, work)
        git(work, "add", "-A")
        git(
            work,
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            f"Release: v{version}",
            identity=RELEASE_IDENTITY,
            date=release_date(i),
        )
        git(work, "tag", f"v{version}")
        if i == 0:
            git(work, "tag", "base")
