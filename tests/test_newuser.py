"""What a new user hit following the README (issue 14 "errors that blame the wrong thing", issue 20's first items):
each test fails on the code before its fix. Only the in-repo datasets (sample/, tests/data) are used."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import lerobot_sql as lsql


def test_extra_columns_keep_their_arrow_dtype_in_items_and_batches(sample):
    """float32 rounded 123456789 + 2 to 123456792 and a Unix time to 1.7e9: each extra keeps its own dtype."""
    db = lsql.connect(sample)
    ds = db.dataset("SELECT index, CASE WHEN index % 2 = 0 THEN 123456789 + index END AS id, "
                    "1700000000.123::DOUBLE AS wall_s, 123456789123::BIGINT AS big, 0.1::FLOAT AS f32, "
                    "[1700000000.5, 2.0]::DOUBLE[] AS vec, 2.25::DECIMAL(6,2) AS dec "
                    "FROM frames WHERE episode_index = 0 ORDER BY index", cameras=[])
    it = ds[2]
    assert it["id"].dtype == torch.float64 and it["id"].item() == 123456791.0  # NULL-holding int: float64, NaN
    assert math.isnan(ds[1]["id"].item())
    assert it["wall_s"].dtype == torch.float64 and it["wall_s"].item() == 1700000000.123
    assert it["big"].dtype == torch.int64 and it["big"].item() == 123456789123
    assert it["f32"].dtype == torch.float32
    assert it["vec"].dtype == torch.float64 and it["vec"].tolist() == [1700000000.5, 2.0]
    assert it["dec"].dtype == torch.float64 and it["dec"].item() == 2.25
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert batch["id"].dtype == torch.float64 and batch["id"][0].item() == 123456789.0
    assert batch["wall_s"].tolist() == [1700000000.123] * 4
    assert batch["big"].dtype == torch.int64 and batch["big"].tolist() == [123456789123] * 4
