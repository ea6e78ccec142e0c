"""The on-disk cache heals itself: a truncated, emptied, garbled or silently changed cache entry (a video index in
its Arrow or Parquet form) is noticed the first time a process uses it, rebuilt once with a CacheWarning naming it,
and the items equal those of an undamaged cache. Row groups are read from the data files, never cached on disk: a
corrected info.json takes effect at once. Matrix: docs/reliability.md."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from damage import FRONT, INFO, scribble, truncate

import lerobot_sql as lsql
from helpers import assert_items_equal
from lerobot_sql._readers import video_index
from lerobot_sql._storage import cache
from lerobot_sql._storage.cache import CacheWarning
from lerobot_sql._storage.source import open_source

EP0 = "SELECT index FROM frames WHERE episode_index = 0 AND frame_index < 30 ORDER BY index"


def _new_process(monkeypatch):
    """What a new process knows of the cache: nothing checked yet (the per-process record of checked entries)."""
    monkeypatch.setattr(cache, "_CHECKED", set(), raising=False)


def _read(root, cache_dir):
    ds = lsql.connect(root, cache_dir=cache_dir).dataset(EP0, return_uint8=True)
    return [ds[i] for i in range(len(ds))]


def _entry(cache_dir):
    for p in (cache_dir / "video_index").rglob("*.arrow"):  # the front camera's index
        if pa.ipc.open_file(pa.memory_map(str(p))).schema.metadata[b"path"].decode() == FRONT:
            return p
    raise AssertionError("no index of the front camera")


def _change_a_value(path):
    """A few bytes inside one value the items read: the time of the front camera's frame 10 set to that of frame 11
    (the index then sends frame 11's time to frame 10)."""
    t = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    data = bytearray(path.read_bytes())
    pts_s = t["pts_s"].to_numpy()
    old, new = pts_s[10:11].tobytes(), pts_s[11:12].tobytes()
    at = data.find(old)
    assert at > 0 and data.find(old, at + 1) < 0
    changed = sum(a != b for a, b in zip(old, new))
    assert 0 < changed <= len(old) == 8
    data[at:at + len(old)] = new
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbled", "value", "no_checksum"])
def test_a_damaged_cache_entry_is_rebuilt_once_with_a_warning(datasets, tmp_path, monkeypatch, damage):
    root, c = datasets / "small20", tmp_path / "c"
    want = _read(root, c)
    victim = _entry(c)
    before = victim.read_bytes()
    if damage == "truncated":
        truncate(victim, 0.6)
    elif damage == "empty":
        victim.write_bytes(b"")
    elif damage == "garbled":
        scribble(victim, 0.0, 64)
    elif damage == "value":
        _change_a_value(victim)
    else:
        victim.with_name(victim.name + ".crc").unlink()
    _new_process(monkeypatch)
    with pytest.warns(CacheWarning, match=re.escape(str(victim))):
        got = _read(root, c)
    assert len(got) == len(want) == 30
    for a, b in zip(got, want):
        assert a.pop("task") == b["task"]
        assert_items_equal(a, {k: v for k, v in b.items() if k != "task"})
    assert victim.read_bytes() == before  # rebuilt, byte for byte
    _new_process(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # healed: the next process trusts it
        assert len(_read(root, c)) == 30


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_a_damaged_parquet_video_index_is_rebuilt(datasets, tmp_path, monkeypatch, damage):
    """The Parquet form of an index serves the SQL view video_frames."""
    src = open_source(datasets / "small20")
    p = video_index.ensure_index(src, FRONT, tmp_path)
    want = pq.read_table(p)
    truncate(p, 0.5) if damage == "truncated" else scribble(p, 0.3, 16)
    _new_process(monkeypatch)
    with pytest.warns(CacheWarning, match=re.escape(str(p))):
        assert video_index.ensure_index(src, FRONT, tmp_path) == p
    assert pq.read_table(p).equals(want)
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path / "c2")
    assert db.sql("SELECT count(*) FROM video_frames").fetchall()[0][0] == 2 * 4762


def test_fixing_info_json_is_not_masked_by_the_tabular_cache(damaged, tmp_path):
    """A row group decoded under a wrong dtype in info.json must not be served once info.json is corrected (row
    groups are read from the data file under the info.json of each connection)."""
    root = damaged()
    c = tmp_path / "c"
    good = json.loads((root / INFO).read_text())
    bad = json.loads(json.dumps(good))
    bad["features"]["action"]["dtype"] = "float64"
    (root / INFO).write_text(json.dumps(bad))
    item = lsql.connect(root, cache_dir=c).dataset(EP0, cameras=[])[3]
    assert item["action"].dtype == torch_float64()
    (root / INFO).write_text(json.dumps(good))
    item = lsql.connect(root, cache_dir=c).dataset(EP0, cameras=[])[3]
    assert str(item["action"].dtype) == "torch.float32"
    want = pq.read_table(root / "data/chunk-000/file-000.parquet", columns=["action"])["action"][3].as_py()
    np.testing.assert_array_equal(item["action"].numpy(), np.asarray(want, np.float32))


def torch_float64():
    import torch

    return torch.float64
