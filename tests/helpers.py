"""Constants and comparison helpers shared by the tests (imported by name: ``from helpers import ...``).

Kept out of conftest.py because pytest loads every conftest.py under the module name ``conftest``: a test that
imports from ``conftest`` could get tests/faults/conftest.py instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LSQL_SHARED", REPO.parent / "shared"))
DATASETS = SHARED / "datasets"
REFERENCE = SHARED / "reference"
SAMPLE = REPO / "sample" / "small20"
REFERENCE_SETS = ["small20", "multifile60", "h264_20", "img5_extras", "g1_real_v30"]



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


def assert_items_equal(a: dict, b: dict) -> None:
    """Two items hold the same keys, and equal values: tensors of the same dtype bit for bit, other values by ==."""
    import torch

    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k
