"""Views of lerobot_sql/catalog.py checked against the files read with pyarrow."""

from __future__ import annotations

import glob

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import data_root


@pytest.mark.parametrize("name", ["small20", "g1_real_v30", "img5_extras"])
def test_episode_stats_is_every_stats_column_of_meta_episodes(name):
    root = data_root(name)
    t = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(str(root / "meta/episodes/*/*.parquet")))],
                         promote_options="permissive")
    want = {}
    for c in t.column_names:
        if not c.startswith("stats/"):
            continue
        feature, stat = c[len("stats/"):].rsplit("/", 1)
        for ep, v in zip(t["episode_index"].to_pylist(), t[c].to_pylist()):
            want[(ep, feature, stat)] = None if v is None else np.asarray(v, np.float64).ravel().tolist()
    got = {(e, f, s): v for e, f, s, v in lsql.connect(root).sql(
        "SELECT episode_index, feature, stat, value FROM episode_stats").fetchall()}
    assert len(want) > 0 and got.keys() == want.keys()
    assert all(got[k] == want[k] for k in want)
