"""Shared fixtures: where ../shared is, the bundled sample, a per-session cache, helpers to compare items."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from helpers import DATASETS, REFERENCE, SAMPLE, SHARED  # noqa: F401  (re-exported for fixtures)


def _need_shared():
    if not DATASETS.is_dir():
        pytest.fail(f"{SHARED} not found: the tests read the shared datasets beside the repo (or set LSQL_SHARED)")


@pytest.fixture(scope="session")
def datasets() -> Path:
    _need_shared()
    return DATASETS


@pytest.fixture(scope="session")
def reference() -> Path:
    _need_shared()
    return REFERENCE


@pytest.fixture(scope="session")
def sample() -> Path:
    return SAMPLE


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory) -> Path:
    """Every test session gets its own cache root, so no test reads another run's cache."""
    d = tmp_path_factory.mktemp("lsql_cache")
    os.environ["LSQL_CACHE_DIR"] = str(d)
    return d


@pytest.fixture(scope="session")
def framecode():
    _need_shared()
    spec = importlib.util.spec_from_file_location("framecode", SHARED / "tools" / "framecode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
