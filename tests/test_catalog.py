"""Views of lerobot_sql/catalog.py checked against the files read with pyarrow."""

from __future__ import annotations

import glob
import json
import shutil

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


@pytest.mark.parametrize("name,dup", [("small20", "index"), ("small20", "text"), ("v21_small20", "index"),
                                      ("v21_small20", "text")])
def test_a_task_listed_twice_is_refused(datasets, tmp_path, name, dup):
    # Two rows for task_index 0: items carried the injected (last) text and a SQL join with tasks doubled rows.
    root = tmp_path / name
    shutil.copytree(datasets / name, root, ignore=shutil.ignore_patterns("videos"))
    if name == "small20":
        p = root / "meta/tasks.parquet"
        t = pq.read_table(p)
        row = {"task_index": [0 if dup == "index" else 99], "__index_level_0__": [
            "EVIL TASK TEXT" if dup == "index" else t["__index_level_0__"][0].as_py()]}
        pq.write_table(pa.concat_tables([t, pa.table(row).cast(t.schema)]), p)
    else:
        p = root / "meta/tasks.jsonl"
        first = json.loads(p.read_text().splitlines()[0])
        extra = {"task_index": 0, "task": "EVIL TASK TEXT"} if dup == "index" else {**first, "task_index": 99}
        p.write_text(p.read_text() + json.dumps(extra) + "\n")
    what = r"task_index 0 is listed twice" if dup == "index" else r"task '[^']+' is listed twice .* task_index 0 and 99"
    db = lsql.connect(root)
    with pytest.raises(lsql.DatasetFormatError, match=rf"meta/tasks\.(parquet|jsonl): {what}"):
        db.sql("SELECT count(*) FROM frames f JOIN tasks t USING (task_index)").fetchall()
    with pytest.raises(lsql.DatasetFormatError, match=what):
        lsql.connect(root).dataset(episodes=[0], cameras=[])
