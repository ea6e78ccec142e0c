"""The selection cache (lerobot_sql.torch._selections): a second open of the same whole-episode selection maps the
file the first one kept, with the same items; a changed source, other options or a damaged entry are never served
from it; the cache stays within its bound and never evicts an entry in use."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql import Database
from lerobot_sql.errors import DatasetFormatError
from lerobot_sql.torch import _selections


@pytest.fixture
def root(tmp_path, datasets):
    r = tmp_path / "small20"
    shutil.copytree(datasets / "small20", r)
    return r


def entries(db) -> list:
    return sorted((db.files.cache_dir / _selections.FOLDER).glob("*.arrow"))


def planner_calls(monkeypatch) -> list:
    calls = []
    real = Database._episodes_manifest

    def counted(self, *a, **k):
        calls.append(a)
        return real(self, *a, **k)

    monkeypatch.setattr(Database, "_episodes_manifest", counted)
    return calls


def assert_same_items(a, b, indices) -> None:
    assert len(a) == len(b)
    for i in indices:
        x, y = a[i], b[i]
        assert list(x) == list(y)
        for k in x:
            if hasattr(x[k], "shape"):
                assert x[k].dtype == y[k].dtype and bool((x[k] == y[k]).all()), (i, k)
            else:
                assert x[k] == y[k], (i, k)


def test_a_second_open_maps_the_kept_file(root, monkeypatch):
    calls = planner_calls(monkeypatch)
    first = lsql.connect(root).dataset(episodes=[3, 1])
    assert len(calls) == 1
    db = lsql.connect(root)
    assert len(entries(db)) == 1
    again = db.dataset(episodes=[1, 3])  # the same set of episodes
    assert len(calls) == 1  # not planned again
    assert again._samples.map.kept and again._samples.map.path == str(entries(db)[0])
    assert_same_items(first, again, [0, 1, len(first) // 2, len(first) - 1])
    np.testing.assert_array_equal(again._samples.runs.start, first._samples.runs.start)
    assert again.manifest.equals(first.manifest)


@pytest.mark.parametrize("other", [dict(episodes=[1]), dict(cameras=[]), dict(tolerance_s=2e-4),
                                   dict(align="frame_index")])
def test_other_options_are_other_entries(root, monkeypatch, other):
    calls = planner_calls(monkeypatch)
    lsql.connect(root).dataset(episodes=[3, 1])
    lsql.connect(root).dataset(**{"episodes": [3, 1], **other})
    assert len(calls) == 2 and len(entries(lsql.connect(root))) == 2


@pytest.mark.parametrize("episodes", [None, [0, 1]])
def test_a_changed_data_file_is_never_served_from_the_cache(root, episodes):
    """The first open keeps the selection; then a frame's timestamp is moved off the fps grid. A stale entry would
    open without a word; the new open plans again and refuses it."""
    lsql.connect(root).dataset(episodes=episodes)
    f = sorted((root / "data").rglob("*.parquet"))[0]
    t = pq.read_table(f)
    ts = t["timestamp"].to_numpy().copy()
    ts[5] += 0.3
    pq.write_table(t.set_column(t.schema.get_field_index("timestamp"), "timestamp", pa.array(ts)), f)
    with pytest.raises(DatasetFormatError, match="timestamp"):
        lsql.connect(root).dataset(episodes=episodes)


@pytest.mark.parametrize("damage", ["truncated", "one byte changed"])
def test_a_damaged_entry_is_built_again(root, monkeypatch, damage):
    """A kept file cut short, or with one byte of its manifest changed (a data_row: another frame's row, silently,
    had it been trusted), is found by its checksum, named in a CacheWarning and built again."""
    from lerobot_sql._storage import cache

    first = lsql.connect(root).dataset(episodes=[2])
    path = entries(lsql.connect(root))[0]
    first.close()
    del first
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[:-40]
    else:
        data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))
    cache._CHECKED.clear()  # a new process: the entry is checked again
    calls = planner_calls(monkeypatch)
    with pytest.warns(cache.CacheWarning, match=rf"{path.name}.*rebuilding"):
        again = lsql.connect(root).dataset(episodes=[2])
    assert len(calls) == 1 and again._samples.map.kept
    ref = lsql.connect(root).dataset("SELECT index FROM frames WHERE episode_index = 2 ORDER BY index")
    assert_same_items(again, ref, [0, 7, len(ref) - 1])


def test_the_cache_keeps_its_bound_and_never_evicts_an_entry_in_use(root, monkeypatch):
    monkeypatch.setattr(_selections, "MAX_ENTRIES", 3)
    held = lsql.connect(root).dataset(episodes=[0])  # alive: its entry is in use throughout
    for e in range(1, 6):
        lsql.connect(root).dataset(episodes=[e])
    db = lsql.connect(root)
    kept = entries(db)
    assert held._samples.map.path in map(str, kept)
    assert len(kept) == 3 + 1  # the bound, and the entry in use beyond it
    assert held[3]["episode_index"].item() == 0  # still reads
    del held
    import gc

    gc.collect()
    lsql.connect(root).dataset(episodes=[7])
    assert len(entries(db)) == 3


def test_close_keeps_the_entry_for_the_next_open(root, monkeypatch):
    ds = lsql.connect(root).dataset(episodes=[4])
    ds.close()
    assert len(entries(lsql.connect(root))) == 1
    calls = planner_calls(monkeypatch)
    assert len(lsql.connect(root).dataset(episodes=[4])) == len(ds)
    assert calls == []


def test_a_data_file_changed_after_a_warm_open_is_refused_at_its_first_read(root):
    """A warm open reads no footer (the row-group offsets come with the kept runs); the footer read later must be of
    the file the entry was kept for, else the item names the file instead of reading rows at stale offsets."""
    lsql.connect(root).dataset(cameras=[])
    ds = lsql.connect(root).dataset(cameras=[])
    assert ds._samples.map.kept
    f = sorted((root / "data").rglob("*.parquet"))[0]
    t = pq.read_table(f)
    pq.write_table(t.slice(1), f)  # the first row gone: every later row one place up
    with pytest.raises(DatasetFormatError, match="changed after the dataset was opened"):
        ds[len(ds) - 1]


def test_a_cache_that_cannot_keep_the_selection_still_opens_it(root, monkeypatch):
    """A read-only or full cache folder: the selection goes to a scratch file, as a query's does."""
    from lerobot_sql.errors import CacheError
    from lerobot_sql.torch import _samples

    def refuse(*a, **k):
        raise CacheError("read-only")

    monkeypatch.setattr(_samples, "write_kept", refuse)
    ds = lsql.connect(root).dataset(episodes=[1])
    assert not ds._samples.map.kept and ds[0]["episode_index"].item() == 1


def test_a_change_to_a_file_the_selection_does_not_read_keeps_the_entry(tmp_path, datasets, monkeypatch):
    """The key holds the data files of the selected episodes only: rewriting another file (new identity) leaves the
    entry valid, and a remote subset does not ask the server about every file of the dataset."""
    root = tmp_path / "multifile60"
    shutil.copytree(datasets / "multifile60", root, ignore=shutil.ignore_patterns("videos"))
    db = lsql.connect(root)
    where = dict(db.sql("SELECT episode_index, \"data/file_index\" FROM _episodes_raw").fetchall())
    files = sorted((root / "data").rglob("*.parquet"))
    assert len(files) > 1
    ep = next(e for e, f in where.items() if f == 0)
    lsql.connect(root).dataset(episodes=[ep], cameras=[])
    other = files[-1]
    assert other.name != "file-000.parquet"
    pq.write_table(pq.read_table(other), other)  # the same rows, a new file
    calls = planner_calls(monkeypatch)
    assert lsql.connect(root).dataset(episodes=[ep], cameras=[])._samples.map.kept and calls == []


def test_a_database_opened_before_meta_episodes_changed_keeps_nothing_a_later_open_takes(root, monkeypatch):
    """A Database reads meta/episodes once. When the file changes under it (episode 3's front clip one frame
    earlier, overlapping episode 2), its next open still plans with the old pointers. Keyed by the files' identity
    at that moment, its entry was found by every later open of the new file, which then served the old clip
    without a word instead of refusing the overlap (hostile review 6, F1). The key now holds the pointers used."""
    db = lsql.connect(root)
    db.dataset(episodes=[3])
    p = root / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    for c in ("videos/observation.images.front/from_timestamp", "videos/observation.images.front/to_timestamp"):
        v = t[c].to_numpy().copy()
        v[3] -= 1 / 30
        t = t.set_column(t.column_names.index(c), c, pa.array(v))
    pq.write_table(t, p)
    db.dataset(episodes=[3])  # the old pointers, as before
    with pytest.raises(DatasetFormatError, match="overlap|episode 2|episode 3"):
        lsql.connect(root).dataset(episodes=[3])


def test_an_entry_copied_over_another_is_not_taken_for_it(root, monkeypatch):
    """Another selection's file (and its checksum) put in an entry's place: refused, planned and kept again."""
    a = lsql.connect(root).dataset(episodes=[0])
    b = lsql.connect(root).dataset(episodes=[1])
    pa_, pb = a._samples.map.path, b._samples.map.path
    del a, b
    import gc

    gc.collect()
    shutil.copy(pa_, pb)
    shutil.copy(pa_ + ".crc", pb + ".crc")
    ds = lsql.connect(root).dataset(episodes=[1])
    assert {int(ds[i]["episode_index"]) for i in (0, len(ds) - 1)} == {1}


def test_a_video_folder_found_by_listing_is_in_the_key(root, datasets):
    """A dataset whose mp4s are in a folder found by listing the root (``video/``, not info.json's ``videos/``)
    keeps an entry naming those mp4s; when the right ``videos/`` folder arrives, the next open must read it, not the
    old folder through the kept entry (hostile review 7, F1: the wrist camera's pictures came back as the front's)."""
    good = root.parent / "good_videos"
    shutil.copytree(root / "videos", good)
    (root / "videos").rename(root / "video")
    front, wrist = root / "video" / "observation.images.front", root / "video" / "observation.images.wrist"
    front.rename(root / "video" / "tmp")
    wrist.rename(front)
    (root / "video" / "tmp").rename(wrist)
    with pytest.warns(UserWarning):
        lsql.connect(root).dataset(episodes=[2])[0]  # kept, naming video/...
    good.rename(root / "videos")
    ds = lsql.connect(root).dataset(episodes=[2])
    ref = lsql.connect(datasets / "small20").dataset(episodes=[2])
    for k in ("observation.images.front", "observation.images.wrist"):
        assert bool((ds[0][k] == ref[0][k]).all()), k


def test_rows_read_from_a_file_the_pointers_do_not_name_are_not_kept(tmp_path, datasets):
    """An episode whose data-file pointer is stale (its rows are in the next file) is resolved by reading the rows
    where they are; that file is not in the key, so the selection is not kept (else a rewrite of that file left an
    entry that every later open refused, with advice that did not help: hostile review 7, F2)."""
    root = tmp_path / "multifile60"
    shutil.copytree(datasets / "multifile60", root)
    p = next((root / "meta" / "episodes").rglob("*.parquet"))
    t = pq.read_table(p)
    files = t["data/file_index"].to_pylist()
    ep = next(i for i, f in enumerate(files) if f == 1)  # an episode of file-001, pointed at file-000
    files[ep] = 0
    t = t.set_column(t.column_names.index("data/file_index"), "data/file_index",
                     pa.array(files, t.schema.field("data/file_index").type))
    pq.write_table(t, p)
    db = lsql.connect(root)
    ds = db.dataset(episodes=[ep])
    assert not ds._samples.map.kept and entries(db) == []
    assert ds[3]["episode_index"].item() == ep
