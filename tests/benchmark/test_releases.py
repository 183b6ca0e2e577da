"""Release-history subjects: real PyPI wheels (small ones: idna, six) turned into a tagged repo.

The wheels come from the package index once per test session (the session cache), so these
tests need PyPI or a warm $DIFFDX_TEST_CACHE; the offline cases point pip at nothing at all.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tomli_w

from benchmark.build import BuildError, build_case_repo, git, read_commit_map
from benchmark.cases import CaseError, load_case, load_truth
from benchmark.releases import Releases, wheel_path
from tools.probe.checkpoints import cache_root

REPRO = """[model]
arch = "llama"

[target]
engine = "transformers"
dtype = "float32"

[[workload.requests]]
prompt_ids = [1, 5, 9]
max_tokens = 2
"""


def release_case(root: Path, name: str, package: str, versions: list[str], truth_commit: str | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    meta = {
        "id": name,
        "issue_number": 9000 + len(name),
        "subject": "transformers",
        "category": "numerics",
        "modeled_on": ["example/repo#1"],
        "title": "wrong after upgrade",
        "track": "real",
        "releases": {"package": package, "versions": versions},
    }
    (folder / "case.toml").write_text(tomli_w.dumps(meta))
    (folder / "issue.md").write_text("It worked before the upgrade.\n")
    (folder / "repro.toml").write_text(REPRO)
    truth = {"file": f"{package}/core.py", "function": "encode", "component": "c", "mechanism": "m"}
    (folder / "truth.toml").write_text(tomli_w.dumps({**truth, **({"commit": truth_commit} if truth_commit else {})}))
    return folder


@pytest.fixture
def offline(monkeypatch):
    """pip sees no index, no links and no config: only the diffdx cache can serve a wheel."""
    for key, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}.items():
        monkeypatch.setenv(key, value)


def test_release_history_is_tagged_and_deterministic(tmp_path, monkeypatch):
    case = release_case(tmp_path / "cases", "idna-upgrade", "idna", ["3.6", "3.7"], truth_commit="v3.7")
    repo = build_case_repo(case, tmp_path / "a" / "repo")
    log = git(repo, "log", "--format=%an|%aI|%s").splitlines()
    assert log == ["Release|2024-01-02T12:00:00+00:00|Release: v3.7", "Release|2024-01-01T12:00:00+00:00|Release: v3.6"]
    assert sorted(git(repo, "tag").split()) == ["base", "v3.6", "v3.7"]
    assert git(repo, "rev-parse", "base") == git(repo, "rev-parse", "HEAD~1")
    assert "idna/core.py" in git(repo, "ls-tree", "-r", "--name-only", "HEAD").split()
    assert "__version__ = '3.7'" in git(repo, "show", "HEAD:idna/package_data.py")
    assert read_commit_map(repo)["patches"]["v3.7"]["sha"] == git(repo, "rev-parse", "HEAD")
    assert load_truth(case).commit == "v3.7"
    monkeypatch.setenv("DIFFDX_CACHE", str(tmp_path / "fresh-cache"))  # wheels fetched again, repo rebuilt
    again = build_case_repo(case, tmp_path / "b" / "repo")
    assert git(again, "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")


@pytest.fixture
def idna_cached():
    """idna 3.6 in the session's wheel cache, fetched while the index is still reachable (before `offline`)."""
    return wheel_path("idna", "3.6")


def test_offline_rebuild_reuses_the_wheel_cache(tmp_path, idna_cached, offline):
    repo = build_case_repo(release_case(tmp_path, "idna-offline", "idna", ["3.6"]), tmp_path / "repo")
    assert git(repo, "log", "--format=%s") == "Release: v3.6"


def test_missing_version_is_one_line_naming_it(tmp_path):
    case = release_case(tmp_path / "cases", "idna-missing", "idna", ["3.6", "99.0"])
    with pytest.raises(BuildError, match=r"^case idna-missing: idna==99.0 does not exist on the package index") as e:
        build_case_repo(case, tmp_path / "repo")
    assert "\n" not in str(e.value)
    assert not list((cache_root() / "wheels").glob("*99.0*")), "nothing half-built left in the cache"


def test_unfetchable_wheel_offline_is_one_line(tmp_path, offline):
    case = release_case(tmp_path / "cases", "idna-old", "idna", ["2.10"])
    with pytest.raises(BuildError, match=r"^case idna-old: idna==2.10: no wheel can be fetched.*offline") as e:
        build_case_repo(case, tmp_path / "repo")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "repo").exists()
    assert not [p for p in (cache_root() / "wheels").iterdir() if "2.10" in p.name]


def test_wheel_without_the_package_folder_names_it(tmp_path):
    case = release_case(tmp_path / "cases", "six-module", "six", ["1.16.0"])  # six ships six.py, no six/
    with pytest.raises(BuildError, match=r"six-1.16.0-py2.py3-none-any.whl holds no package folder six/"):
        build_case_repo(case, tmp_path / "repo")


def test_versions_out_of_order_are_refused_at_load(tmp_path):
    case = release_case(tmp_path / "cases", "backwards", "idna", ["3.7", "3.6"])
    with pytest.raises(CaseError, match=r"oldest first.*3.6 comes after 3.7"):
        load_case(case)


def test_truth_commit_must_be_a_later_release(tmp_path):
    case = release_case(tmp_path / "cases", "truth-at-base", "idna", ["3.6", "3.7"], truth_commit="v3.6")
    with pytest.raises(CaseError, match=r"commit 'v3.6' is not a patch stem or a later release tag; known: v3.7"):
        load_truth(case)


def test_releases_folder_name():
    assert Releases("typing-extensions", ("4.0",)).folder == "typing_extensions"


def test_unknown_package_is_one_line_and_leaves_nothing(tmp_path):
    case = release_case(tmp_path / "cases", "no-such-package", "diffdx-no-such-package", ["1.0"])
    with pytest.raises(
        BuildError, match=r"^case no-such-package: diffdx-no-such-package==1.0: no wheel can be fetched"
    ) as e:
        build_case_repo(case, tmp_path / "repo")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "repo").exists()
    assert not [p for p in (cache_root() / "wheels").iterdir() if "no-such-package" in p.name]


def test_versions_out_of_order_build_nothing(tmp_path):
    """Refused before any wheel is fetched: no repo, no cache entry for either version."""
    case = release_case(tmp_path / "cases", "backwards-build", "idna", ["3.5", "3.4"])
    with pytest.raises((CaseError, BuildError), match=r"oldest first.*3.4 comes after 3.5") as e:
        build_case_repo(case, tmp_path / "repo")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "repo").exists()
    wheels = cache_root() / "wheels"
    assert not [p for p in (wheels.iterdir() if wheels.is_dir() else []) if p.name in ("idna-3.5", "idna-3.4")]
