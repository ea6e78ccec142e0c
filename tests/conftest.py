"""Shared fixtures: where ../shared is, the bundled sample, a per-session cache, helpers to compare items."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LSQL_SHARED", REPO.parent / "shared"))
DATASETS = SHARED / "datasets"
REFERENCE = SHARED / "reference"
SAMPLE = REPO / "sample" / "small20"
REFERENCE_SETS = ["small20", "multifile60", "h264_20", "img5_extras", "g1_real_v30"]


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


def load_reference(name: str):
    """(json dict, npz) of shared/reference/NAME."""
    return json.loads((REFERENCE / f"{name}.json").read_text()), np.load(REFERENCE / f"{name}.npz")


def assert_item_equals_reference(item: dict, ref_json_item: dict, npz, mode: str) -> None:
    """Exact comparison of one of our items with lerobot's (keys, dtypes, shapes, values, task)."""
    idx = ref_json_item["index"]
    spec = ref_json_item[mode]
    prefix = f"{mode}/{idx}/"
    expected_keys = {k[len(prefix):] for k in npz.files if k.startswith(prefix)} | {"task"}
    assert set(item) == expected_keys, f"index {idx} {mode}: keys differ: {set(item) ^ expected_keys}"
    assert item["task"] == spec["scalars"]["task"]
    for key, meta in spec["keys"].items():
        ours = item[key]
        assert str(ours.dtype).removeprefix("torch.") == meta["dtype"], (idx, key, ours.dtype)
        assert list(ours.shape) == meta["shape"], (idx, key, ours.shape)
        ref = npz[meta["npz"]]
        got = ours.numpy()
        if meta.get("stored_dtype") == "uint8":
            # lerobot computes float32(u8)/255; compare in that exact form.
            ref = ref.astype(np.float32) / np.float32(255)
        np.testing.assert_array_equal(got, ref, err_msg=f"index {idx} {mode} {key}")
