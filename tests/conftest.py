"""Shared test set-up: one checkpoint cache per test session, one CPU thread per process."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def diffdx_cache(tmp_path_factory):
    """Checkpoints are built once per session into a private cache (never the user's)."""
    if os.environ.get("DIFFDX_TEST_CACHE"):
        os.environ["DIFFDX_CACHE"] = os.environ["DIFFDX_TEST_CACHE"]
    else:
        os.environ["DIFFDX_CACHE"] = str(tmp_path_factory.mktemp("diffdx-cache"))
    return os.environ["DIFFDX_CACHE"]
