"""The dataset's per-sample table kept as runs (lerobot_sql.torch._samples): every per-sample value computed from
the runs equals the one the manifest gives for that sample, for every selection kind, and a whole episode costs one
run (or one per row group it spans), not one entry per frame."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql.torch import _samples

SELECTIONS = {
    "every episode": ("small20", None),
    "some episodes, out of order, one twice": ("small20", [7, 2, 7, 11]),
    "windows": ("small20", "SELECT episode_index, 1.0 AS start_s, 2.5 AS end_s FROM episodes WHERE episode_index < 6"),
    "an index list, shuffled, with repeats": ("small20", "SELECT index FROM frames WHERE index % 7 = 3 "
                                                         "UNION ALL SELECT 100 ORDER BY index % 5, index DESC"),
    "several data and video files": ("multifile60", None),
    "a v2.1 dataset (a file per episode)": ("v21_small20", None),
}


def expected(ds) -> dict[str, np.ndarray]:
    """Each per-sample value as the manifest gives it (the per-frame table the runs stand for)."""
    s, m = ds._samples, ds.manifest
    files = s.data_files
    out = {"file": np.array([files.index(f) for f in m["data_file"].to_pylist()]),
           "index": m["index"].to_numpy(), "episode_index": m["episode_index"].to_numpy(),
           "ep_from": m["ep_from_index"].to_numpy(), "ep_to": m["ep_to_index"].to_numpy(),
           "row0": m["ep_data_row0"].to_numpy()}
    rows = m["data_row"].to_numpy()
    slot, off = np.zeros(len(rows), np.int64), np.zeros(len(rows), np.int64)
    for j, f in enumerate(out["file"]):
        info = s.infos[f]
        rg = int(np.searchsorted(info.rg_offsets, rows[j], side="right") - 1)
        slot[j], off[j] = s.rg_base[f] + rg, rows[j] - info.rg_offsets[rg]
    out["slot"], out["offset"] = slot, off
    return out


@pytest.mark.parametrize("name", SELECTIONS)
def test_run_values_equal_the_manifests_per_sample_values(datasets, name):
    folder, sel = SELECTIONS[name]
    db = lsql.connect(datasets / folder)
    ds = db.dataset(episodes=sel) if isinstance(sel, list) else db.dataset(sel)
    s = ds._samples
    want = expected(ds)
    n = len(ds)
    assert s.n == n == ds.manifest.num_rows and int(s.runs.start[-1]) == n
    every = np.arange(n)
    for attr, values in want.items():
        col = getattr(s, attr)
        np.testing.assert_array_equal(np.asarray(col), values, err_msg=attr)  # materialized
        np.testing.assert_array_equal(col[every[::-1]], values[::-1], err_msg=attr)  # gathered, any order
        for i in (0, n // 3, n - 1, -1):  # one sample, as an item asks
            assert col[i] == values[i], (attr, i)
    # each camera: the sample's mp4, its place among that mp4's samples (ascending), where its episode starts
    m = ds.manifest
    for k, cam in s.cameras.items():
        names = m[f"{k}/file"].to_pylist()
        code = np.array([cam.files.index(x) for x in names])
        np.testing.assert_array_equal(cam.code[every], code)
        np.testing.assert_array_equal(cam.from_timestamp[every], m[f"{k}/from_timestamp"].to_numpy())
        for c in range(len(cam.files)):
            of = cam.of_file(c)
            np.testing.assert_array_equal(of, np.flatnonzero(code == c))
            np.testing.assert_array_equal(cam.position[of], np.arange(len(of)))


def test_a_whole_episode_is_one_run_per_row_group_it_spans(datasets):
    db = lsql.connect(datasets / "multifile60")
    ds = db.dataset()
    s = ds._samples
    m = ds.manifest
    # the row groups each episode's rows touch, from the footers
    touched = 0
    for ep in np.unique(m["episode_index"].to_numpy()):
        rows = m.filter(pa.compute.equal(m["episode_index"], ep))
        f = s.data_files.index(rows["data_file"][0].as_py())
        data_row = rows["data_row"].to_numpy()
        rgs = np.searchsorted(s.infos[f].rg_offsets, data_row, side="right") - 1
        touched += len(np.unique(rgs))
    assert len(s.runs.start) - 1 == touched
    assert touched < len(ds) / 20  # runs, not frames
    assert ds.num_episodes == pq.read_table(datasets / "multifile60" / "meta" / "episodes").num_rows


def test_a_row_group_boundary_inside_an_episode_splits_its_run(tmp_path, datasets):
    """Data files rewritten with small row groups (episodes spanning several): the items are the same, and every
    run lies in one row group (the offset of a sample is its run's plus its distance into the run)."""
    import shutil

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    for f in (root / "data").rglob("*.parquet"):
        t = pq.read_table(f)
        pq.write_table(t, f, row_group_size=97)
    ds = lsql.connect(root).dataset(episodes=[3, 4], cameras=[])
    ref = lsql.connect(datasets / "small20").dataset(episodes=[3, 4], cameras=[])
    s = ds._samples
    assert len(s.runs.start) - 1 > 2  # more runs than episodes
    slot, off = np.asarray(s.slot), np.asarray(s.offset)
    assert (off < s.rg_len[slot]).all() and (off >= 0).all()
    for i in (0, 96, 97, 98, len(ds) - 1):
        a, b = ds[i], ref[i]
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k] == b[k]).all() if hasattr(a[k], "shape") else a[k] == b[k], (i, k)


def test_runs_survive_pickling(datasets):
    import pickle

    ds = lsql.connect(datasets / "small20").dataset(episodes=[5, 1])
    s2 = pickle.loads(pickle.dumps(ds._samples))
    np.testing.assert_array_equal(s2.runs.start, ds._samples.runs.start)
    np.testing.assert_array_equal(np.asarray(s2.index), np.asarray(ds._samples.index))
    assert isinstance(_samples.Runs(np.array([0, 3, 5])).of(np.array([0, 2, 3, 4])), np.ndarray)


def test_a_kept_selection_parses_its_footers_before_a_fork_not_at_the_open(tmp_path, datasets):
    """A warm open reads no footer; forked DataLoader workers must still share one parse of them (each footer is
    ~32 MB at 5,000 row groups) instead of each parsing privately: they are parsed before the fork."""
    import os
    import shutil

    root = tmp_path / "multifile60"
    shutil.copytree(datasets / "multifile60", root, ignore=shutil.ignore_patterns("videos"))
    lsql.connect(root).dataset(cameras=[])
    ds = lsql.connect(root).dataset(cameras=[])  # the kept selection
    footers = ds._samples.infos
    assert ds._samples.map.kept and len(footers) > 1
    assert sum(p is None for p in footers._parsed) >= len(footers) - 1  # at most the one the item columns need
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every footer already there, inherited
        os.write(w, b"1" if all(p is not None for p in footers._parsed) else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    os.close(r)
    os.close(w)


# ---- a large whole-episode selection, opened without its frames (SampleTable.from_episodes) -------------------
LAZY = {
    "every episode": ("small20", {}),
    "several data and video files": ("multifile60", {}),
    "some episodes, out of order": ("small20", {"episodes": [11, 2, 7]}),
    "delta_timestamps": ("small20", {"delta_timestamps": {"observation.state": [-0.1, 0.0], "action": [0.0, 0.1],
                                                         "observation.images.front": [-1 / 30, 0.0]}}),
    "by frame_index": ("small20", {"align": "frame_index"}),
    "tabular only": ("small20", {"cameras": []}),
    "a query's episodes, in its order": ("multifile60", {"sql": "SELECT episode_index FROM episodes WHERE "
                                                                "episode_index % 3 = 0 ORDER BY episode_index DESC"}),
    "a query's episodes, no ORDER BY": ("small20", {"sql": "SELECT episode_index FROM episodes WHERE length > 200"}),
    # windows: planned on the fps grid, checked where read (SampleTable.from_episodes with rules.windows)
    "windows, across row groups and files": ("multifile60", {"sql": "SELECT episode_index, 0.5 AS start_s, "
                                                                    "1.75 AS end_s FROM episodes"}),
    "windows: overlapping, adjacent, past the end, on frame times, no ORDER BY": (
        "small20", {"sql": "SELECT episode_index, 1.0/3 AS start_s, 0.5 AS end_s FROM episodes UNION ALL "
                           "SELECT 3, 0.2, 0.7 UNION ALL SELECT 3, 0.7, 0.9 UNION ALL SELECT 4, 0, 1 UNION ALL "
                           "SELECT 5, length / 30.0 - 0.5, length / 30.0 + 3 FROM episodes WHERE episode_index = 5"}),
    "windows in the query's order, with delta_timestamps": (
        "small20", {"sql": "SELECT episode_index, 2.0 AS start_s, 2.2 AS end_s FROM episodes ORDER BY "
                           "episode_index DESC", "delta_timestamps": {"action": [-0.1, 0.0, 0.1],
                                                                      "observation.images.front": [-1 / 30, 0.0]}}),
    "windows with integer bounds, tabular": ("small20", {"sql": "SELECT episode_index, 1 AS start_s, 2 AS end_s "
                                                                "FROM episodes", "cameras": []}),
}


def _same_item(a: dict, b: dict, where) -> None:
    assert a.keys() == b.keys(), where
    for k in a:
        if hasattr(a[k], "shape"):
            assert a[k].dtype == b[k].dtype and bool((a[k] == b[k]).all()), (where, k)
        else:
            assert a[k] == b[k], (where, k)


def _lazy(monkeypatch, root, cache, **kw):
    from lerobot_sql._plan import episodes

    monkeypatch.setattr(episodes, "LAZY_FRAMES", 0)  # every whole-episode selection counts as large
    ds = lsql.connect(root, cache_dir=cache).dataset(**kw)
    assert ds._samples.lazy and ds._samples.manifest.num_rows == 0
    return ds


@pytest.mark.parametrize("name", LAZY)
def test_a_selection_opened_without_its_frames_gives_the_same_items_batches_and_manifest(monkeypatch, tmp_path,
                                                                                         datasets, name):
    """The same len, items, DataLoader batch, manifest (built on demand) and meta as the open that reads every
    frame; and the next open maps the kept runs-only entry."""
    import torch

    root, kw = LAZY[name]
    eager = lsql.connect(datasets / root, cache_dir=tmp_path / "eager").dataset(**kw)
    assert not eager._samples.lazy
    lazy = _lazy(monkeypatch, datasets / root, tmp_path / "lazy", **kw)
    assert len(lazy) == len(eager)
    picks = np.random.default_rng(0).choice(len(eager), 24, replace=False)
    for i in [0, len(eager) - 1, *picks.tolist()]:
        _same_item(lazy[i], eager[i], i)
    b1, b2 = (next(iter(torch.utils.data.DataLoader(d, batch_size=16, shuffle=False))) for d in (eager, lazy))
    _same_item(b1, b2, "batch")
    m1, m2 = eager.manifest, lazy.manifest
    assert m2.schema == m1.schema and m2.schema.metadata == m1.schema.metadata
    for c in m1.column_names:
        if kw.get("cameras") == [] and "/" in c:
            assert m2[c].null_count == m2.num_rows  # a camera left out: null, as the manifest allows
        else:
            assert m2[c].to_pylist() == m1[c].to_pylist(), c
    assert lazy.meta.total_tasks == eager.meta.total_tasks and lazy.num_episodes == eager.num_episodes
    assert lazy.meta.episodes["dataset_from_index"] == eager.meta.episodes["dataset_from_index"]
    again = _lazy(monkeypatch, datasets / root, tmp_path / "lazy", **kw)  # the kept entry: runs only
    # (a query's result may depend on anything: never kept)
    assert (again._samples.map.path == lazy._samples.map.path) == ("sql" not in kw)
    _same_item(again[int(picks[0])], eager[int(picks[0])], "kept")


def test_a_selection_opened_without_its_frames_keeps_bytes_per_run_not_per_frame(monkeypatch, tmp_path, datasets):
    lazy = _lazy(monkeypatch, datasets / "multifile60", tmp_path, cameras=[])
    s = lazy._samples
    size = os.path.getsize(s.map.path)
    runs = len(s.runs.start) - 1
    assert runs <= 2 * lazy.num_episodes and size < 16_000 + 200 * runs, (size, runs, len(lazy))


def _write_a_row_group_per_episode(t: pa.Table, f) -> None:
    ep = t["episode_index"].to_numpy()
    cuts = [0, *(np.flatnonzero(np.diff(ep)) + 1).tolist(), t.num_rows]
    with pq.ParquetWriter(f, t.schema) as w:
        for a, b in zip(cuts, cuts[1:]):
            w.write_table(t.slice(a, b - a))


@pytest.mark.parametrize("row_groups", ["200 rows", "an episode each"])
@pytest.mark.parametrize("damage", ["timestamp off the grid", "a row of another episode", "frame -1 of the clip",
                                    "two rows swapped"])
def test_frames_left_to_their_row_group_are_checked_where_read(monkeypatch, tmp_path, datasets, damage, row_groups):
    """The checks the open of every frame makes (lerobot_sql._plan.clips.check_frames) run per row group when a
    selection opens without its frames: the damaged row group's items raise DatasetFormatError naming the data file
    and episode; the other row groups' items are served, equal to the intact dataset's."""
    import shutil

    from lerobot_sql.errors import DatasetFormatError

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    f = next((root / "data").rglob("*.parquet"))
    t = pq.read_table(f)
    rows = t.num_rows
    pq.write_table(t, f, row_group_size=200)  # so that the damage stays in one row group
    ref = lsql.connect(datasets / "small20", cache_dir=tmp_path / "ref").dataset()
    ep = t["episode_index"].to_numpy()
    j = int(np.flatnonzero(ep == 5)[0])  # episode 5's first row
    cols = {c: t[c].to_numpy().copy() for c in ("timestamp", "episode_index", "frame_index", "index")}
    if damage == "two rows swapped":  # every row on the grid, of its episode, in its clip: only the order is wrong
        for v in cols.values():
            v[[j + 3, j + 4]] = v[[j + 4, j + 3]]
    elif damage == "timestamp off the grid":
        cols["timestamp"][j + 3] += 0.7 / 30
    elif damage == "a row of another episode":
        cols["episode_index"][j + 3] = 6
    else:  # on the grid, the row count unchanged: only the clip bound sees it
        cols["frame_index"][j] = -1
        cols["timestamp"][j] = -1 / 30
    for c, v in cols.items():
        t = t.set_column(t.column_names.index(c), c, pa.array(v, t[c].type))
    if row_groups == "200 rows":
        pq.write_table(t, f, row_group_size=200)
    else:  # (a run per row group: the lazy check's one-run path)
        _write_a_row_group_per_episode(t, f)
    if damage != "two rows swapped":  # (the join reads each frame by its own index: a swap is no error there)
        with pytest.raises(DatasetFormatError):  # the open that reads every frame refuses it
            lsql.connect(root, cache_dir=tmp_path / "eager").dataset()
    lazy = _lazy(monkeypatch, root, tmp_path / "lazy")
    with pytest.raises(DatasetFormatError, match="episode 5"):
        lazy[j + 3]
    other = (j + 400) % rows  # another row group
    _same_item(lazy[other], ref[other], other)


# ---- hostile review 8: the open without frames ---------------------------------------------------------------
def test_a_warm_open_of_a_kept_large_selection_has_its_statistics(monkeypatch, tmp_path, datasets):
    """The kept entry of a selection opened without its frames holds no manifest rows: the next open (a training
    restart) computed its statistics over nothing ("the selection is empty"); they are the selection's frames'."""
    import gc

    cold = _lazy(monkeypatch, datasets / "small20", tmp_path, episodes=[3, 4], cameras=[])
    want = cold.meta.stats["action"]["mean"]
    del cold
    gc.collect()
    warm = _lazy(monkeypatch, datasets / "small20", tmp_path, episodes=[3, 4], cameras=[])
    assert warm._samples.map.kept
    np.testing.assert_array_equal(np.asarray(warm.meta.stats["action"]["mean"]), np.asarray(want))


def test_a_stale_data_file_pointer_is_read_where_the_rows_are(monkeypatch, tmp_path, datasets):
    """An episode whose data/file_index names a file that does not exist (its rows in another): the open without
    frames refused the whole set with MissingFileError; it reads the frames instead, as a smaller open does."""
    import shutil

    root = tmp_path / "multifile60"
    shutil.copytree(datasets / "multifile60", root)
    p = next((root / "meta" / "episodes").rglob("*.parquet"))
    t = pq.read_table(p)
    files = t["data/file_index"].to_pylist()
    ep = next(i for i, f in enumerate(files) if f == 1)
    files[ep] = 5  # no file-005
    t = t.set_column(t.column_names.index("data/file_index"), "data/file_index",
                     pa.array(files, t.schema.field("data/file_index").type))
    pq.write_table(t, p)
    from lerobot_sql._plan import episodes

    monkeypatch.setattr(episodes, "LAZY_FRAMES", 0)
    ds = lsql.connect(root, cache_dir=tmp_path / "c").dataset(episodes=[ep], cameras=[])
    ref = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "r").dataset(episodes=[ep], cameras=[])
    assert len(ds) == len(ref)
    for i in (0, len(ds) // 2, len(ds) - 1):
        _same_item(ds[i], ref[i], i)


def test_a_v21_dataset_is_not_opened_without_its_frames(monkeypatch, tmp_path, datasets):
    """v2.x episode pointers are derived from the lengths in episodes.jsonl: one length off by one shifted every
    later episode, and the open without frames refused their intact rows as "not in index order". v2.x sets are
    read frame by frame (as lerobot derives the ranges from the data)."""
    import json
    import shutil

    root = tmp_path / "v21"
    shutil.copytree(datasets / "v21_small20", root)
    j = root / "meta" / "episodes.jsonl"
    rows = [json.loads(x) for x in j.read_text().splitlines() if x.strip()]
    rows[3]["length"] -= 1
    j.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from lerobot_sql._plan import episodes

    monkeypatch.setattr(episodes, "LAZY_FRAMES", 0)
    ds = lsql.connect(root, cache_dir=tmp_path / "c").dataset(episodes=[5], cameras=[])
    assert not ds._samples.lazy
    ref = lsql.connect(datasets / "v21_small20", cache_dir=tmp_path / "r").dataset(episodes=[5], cameras=[])
    _same_item(ds[0], ref[0], 0)


def test_footers_are_shared_before_a_fork_only_for_a_few_files(monkeypatch, datasets):
    """A dataset of a file per episode (v2.x; 92,000 at DROID's size) would parse every footer in the parent at the
    first fork (17 s, 2 GB): past SHARE_FOOTERS files each worker parses what it reads."""
    ds = lsql.connect(datasets / "v21_small20").dataset(cameras=[])
    footers = ds._samples.infos
    footers._parsed = [None] * len(footers)
    monkeypatch.setattr(_samples, "SHARE_FOOTERS", len(footers) - 1)
    footers.parse_all()
    assert footers._parsed == [None] * len(footers)
    monkeypatch.setattr(_samples, "SHARE_FOOTERS", len(footers))
    footers.parse_all()
    assert all(p is not None for p in footers._parsed)


# ---- windows planned on the fps grid (grid_window), checked where read (check_window_frames) -----------------
def test_grid_windows_select_the_frames_the_join_selects(monkeypatch, tmp_path, datasets):
    """400 random windows, a third with a bound on a frame's time (or a float's width from it, either side), some
    past the episode's end or before its start: the plan on the grid selects exactly the frames the join over the
    timestamps selects, sample for sample."""
    rng = np.random.default_rng(7)
    fps = 30.0
    length = dict(lsql.connect(datasets / "small20").sql("SELECT episode_index, length FROM episodes").fetchall())
    rows = []
    for _ in range(400):
        ep = int(rng.integers(0, 20))
        a = float(rng.uniform(-0.01, length[ep] / fps - 0.1))
        if rng.random() < 0.35:  # on a frame's time, less the join's tolerance, or a hair either side of it
            a = int(rng.integers(0, length[ep] - 3)) / fps + float(rng.choice([0.0, 1e-4, -1e-12, 1e-12, 1e-4 + 1e-9]))
        b = a + float(rng.uniform(1.01 / fps, 2.0))  # (a window narrower than a frame may be empty on the grid)
        rows.append(f"({ep}, {a!r}::DOUBLE, {b!r}::DOUBLE)")
    sql = ("SELECT * FROM (VALUES " + ", ".join(rows) + ") t(episode_index, start_s, end_s)")
    eager = lsql.connect(datasets / "small20", cache_dir=tmp_path / "e").manifest(sql)
    lazy = _lazy(monkeypatch, datasets / "small20", tmp_path / "l", sql=sql, cameras=[])
    got = lazy.manifest
    for c in ("index", "result_row", "timestamp", "data_row"):
        assert got[c].to_pylist() == eager[c].to_pylist(), c


def _damaged_windows(tmp_path, datasets, change):
    """small20 with row groups of 100 rows, episode 5's columns changed by ``change(cols, j)`` (j: its first row)."""
    import shutil

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    f = next((root / "data").rglob("*.parquet"))
    t = pq.read_table(f)
    j = int(np.flatnonzero(t["episode_index"].to_numpy() == 5)[0])
    cols = {c: t[c].to_numpy().copy() for c in ("timestamp", "frame_index")}
    change(cols, j)
    for c, v in cols.items():
        t = t.set_column(t.column_names.index(c), c, pa.array(v, t[c].type))
    pq.write_table(t, f, row_group_size=100)
    return root, j


@pytest.mark.parametrize("case", ["a frame inside drifts out", "the frame before drifts in",
                                  "the frame after, in the next row group, drifts in", "a frame out of its place"])
def test_a_window_whose_timestamps_disagree_with_the_grid_is_refused_where_read(monkeypatch, tmp_path, datasets,
                                                                               case):
    """Timestamps within half a frame of the grid (the open accepts them) that put a frame on the other side of a
    window's bound than the grid: the items of that window raise DatasetFormatError naming the file, the episode,
    the window's result row and the way out; the open that reads every frame gives its own answer, and other
    windows' items are served."""
    from lerobot_sql.errors import DatasetFormatError

    k0 = {"a frame inside drifts out": 30, "the frame before drifts in": 29,
          "the frame after, in the next row group, drifts in": 0, "a frame out of its place": 40}[case]

    def change(cols, j):
        nonlocal k0
        if case == "the frame after, in the next row group, drifts in":
            k0 = (-j) % 100 + 100  # the episode's first frame that opens a row group (rows of 100), past the first
            cols["timestamp"][j + k0] -= 0.4 / 30
        elif case == "a frame inside drifts out":
            cols["timestamp"][j + k0] -= 0.4 / 30
        elif case == "the frame before drifts in":
            cols["timestamp"][j + k0] += 0.4 / 30
        else:
            for c in ("frame_index", "timestamp"):  # two rows swapped, each on the grid of its frame_index
                cols[c][j + k0], cols[c][j + k0 + 1] = cols[c][j + k0 + 1], cols[c][j + k0]

    root, j = _damaged_windows(tmp_path, datasets, change)
    start, end = k0 / 30, k0 / 30 + 0.5  # frame k0 opens the window on the grid
    if case == "the frame before drifts in":  # frame k0 is the one before the window on the grid
        start = (k0 + 0.3) / 30
    elif case == "the frame after, in the next row group, drifts in":  # frame k0 is the one after the window
        start, end = (k0 - 5) / 30, k0 / 30
    sql = (f"SELECT * FROM (VALUES (5, {start!r}::DOUBLE, {end!r}::DOUBLE), (2, 1.0::DOUBLE, 1.5::DOUBLE)) "
           "t(episode_index, start_s, end_s) ORDER BY episode_index DESC")
    lsql.connect(root, cache_dir=tmp_path / "eager").dataset(sql, cameras=[])  # reads every frame: its own answer
    lazy = _lazy(monkeypatch, root, tmp_path / "lazy", sql=sql, cameras=[])
    with pytest.raises(DatasetFormatError, match=r"episode 5.*(result row 0|frame_index).*LSQL_LAZY_FRAMES") as e:
        lazy[0]
    assert "chunk-000" in str(e.value)
    n5 = len(lazy) - 15  # episode 2's window: 15 frames, served
    ref = lsql.connect(datasets / "small20", cache_dir=tmp_path / "ref").dataset(
        "SELECT 2 AS episode_index, 1.0::DOUBLE AS start_s, 1.5::DOUBLE AS end_s", cameras=[])
    _same_item(lazy[n5], ref[0], "episode 2")


def test_windows_that_hold_no_frame_are_named_in_a_warning(monkeypatch, tmp_path, datasets):
    """A window past its episode's end (or between two frames) holds no frame: its result row gave no sample, and
    nothing said so. Both opens warn, naming the rows. A window between two frames is opened by reading every frame
    (a frame within half a frame of its time could lie in it, and no read of a plan would look); one far past the
    end is planned."""
    sql = ("SELECT * FROM (VALUES (3, 0.5::DOUBLE, 1.0::DOUBLE), (4, 100.0::DOUBLE, 101.0::DOUBLE), "
           "(6, 1.01::DOUBLE, 1.02::DOUBLE)) t(episode_index, start_s, end_s)")
    with pytest.warns(UserWarning, match=r"2 of the 3 window rows hold no frame.*row 1: episode 4, 100.0 .. 101.0 s"):
        eager = lsql.connect(datasets / "small20", cache_dir=tmp_path / "e").dataset(sql, cameras=[])
    assert len(eager) == 15
    from lerobot_sql._plan import episodes

    monkeypatch.setattr(episodes, "LAZY_FRAMES", 0)
    with pytest.warns(UserWarning, match=r"2 of the 3 window rows hold no frame.*row 1: episode 4, 100.0 .. 101.0 s"):
        between = lsql.connect(datasets / "small20", cache_dir=tmp_path / "b").dataset(sql, cameras=[])
    assert not between._samples.lazy and len(between) == 15
    far = sql.replace("(6, 1.01::DOUBLE, 1.02::DOUBLE)", "(6, 50.0::DOUBLE, 51.0::DOUBLE)")
    with pytest.warns(UserWarning, match=r"2 of the 3 window rows hold no frame.*row 2: episode 6, 50.0 .. 51.0 s"):
        lazy = _lazy(monkeypatch, datasets / "small20", tmp_path / "l", sql=far, cameras=[])
    assert len(lazy) == 15


@pytest.mark.parametrize("value", ["abc", "-1", "1.5"])
def test_a_bad_lazy_frames_bound_is_named(monkeypatch, tmp_path, datasets, value):
    monkeypatch.setenv("LSQL_LAZY_FRAMES", value)
    with pytest.raises(ValueError, match=f"LSQL_LAZY_FRAMES={value!r}"):  # (an empty cache: nothing kept to map)
        lsql.connect(datasets / "small20", cache_dir=tmp_path).dataset(cameras=[])


def test_the_lazy_frames_bound_is_set_by_the_environment(monkeypatch, tmp_path, datasets):
    """$LSQL_LAZY_FRAMES=0 opens every whole-episode or window selection without its frames; a bound above the
    selection reads every frame at the open (the way out the window checks name)."""
    sql = "SELECT episode_index, 1.0 AS start_s, 2.0 AS end_s FROM episodes"
    monkeypatch.setenv("LSQL_LAZY_FRAMES", "0")
    assert lsql.connect(datasets / "small20", cache_dir=tmp_path / "a").dataset(sql, cameras=[])._samples.lazy
    monkeypatch.setenv("LSQL_LAZY_FRAMES", "1_000_000")
    assert not lsql.connect(datasets / "small20", cache_dir=tmp_path / "b").dataset(sql, cameras=[])._samples.lazy


# ---- hostile review 21: windows opened without their frames -----------------------------------------------------
def _h21_copy(tmp_path, datasets, change=None, meta=None, row_group_size=None):
    """small20 copied; ``change(cols, j)`` edits the data's numpy columns (j: episode 5's first row), ``meta(t)``
    returns a new meta/episodes table."""
    import shutil

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    f = next((root / "data").rglob("*.parquet"))
    t = pq.read_table(f)
    if change is not None:
        j = int(np.flatnonzero(t["episode_index"].to_numpy() == 5)[0])
        cols = {c: t[c].to_numpy().copy() for c in ("timestamp", "frame_index")}
        change(cols, j)
        for c, v in cols.items():
            t = t.set_column(t.column_names.index(c), c, pa.array(v, t[c].type))
    pq.write_table(t, f, row_group_size=row_group_size or t.num_rows)
    if meta is not None:
        p = next((root / "meta" / "episodes").rglob("*.parquet"))
        pq.write_table(meta(pq.read_table(p)), p)
    return root


def _episode_5_one_short(t: pa.Table) -> pa.Table:
    """meta/episodes with episode 5 one frame shorter than its rows, episode 6 starting a row early (the file's total
    holds)."""
    for name, fix in (("dataset_to_index", {5: -1}), ("dataset_from_index", {6: -1}), ("length", {5: -1, 6: 1})):
        v = t[name].to_pylist()
        for e, d in fix.items():
            v[e] += d
        t = t.set_column(t.column_names.index(name), t.schema.field(name), pa.array(v, t.schema.field(name).type))
    return t


def _h21_same_or_refused(monkeypatch, tmp_path, root, **kw):
    """The lazy open gives the eager open's samples (len, manifest index / result_row), or raises a typed error
    where its frames are read."""
    from lerobot_sql.errors import DatasetFormatError, ResultContractError

    eager = lsql.connect(root, cache_dir=tmp_path / "eager").dataset(**kw)
    assert not eager._samples.lazy
    from lerobot_sql._plan import episodes

    monkeypatch.setattr(episodes, "LAZY_FRAMES", 0)  # planned on the grid where it can be, else every frame read
    lazy = lsql.connect(root, cache_dir=tmp_path / "lazy").dataset(**kw)
    try:
        got = lazy.manifest
    except (DatasetFormatError, ResultContractError):
        return
    want = eager.manifest
    assert len(lazy) == len(eager)
    for c in ("index", "result_row", "timestamp"):
        assert got[c].to_pylist() == want[c].to_pylist(), c


def test_hostile21_empty_window_holding_a_jittered_frame(monkeypatch, tmp_path, datasets):
    """A window narrower than a frame, empty on the fps grid, over a frame jittered by +0.015 s (within half a frame:
    both opens accept the data). The join selects that frame; the lazy plan has no run for the window, so nothing
    reads or checks the frames around it, and the frame vanishes (with a warning that the row holds no frame)."""
    def change(cols, j):
        cols["timestamp"][j + 30] = np.float32(1.0 + 0.015)

    root = _h21_copy(tmp_path, datasets, change)
    sql = ("SELECT * FROM (VALUES (5, 1.01::DOUBLE, 1.02::DOUBLE), (2, 1.0::DOUBLE, 1.5::DOUBLE)) "
           "t(episode_index, start_s, end_s)")
    _h21_same_or_refused(monkeypatch, tmp_path, root, sql=sql, cameras=[])


def test_hostile21_tolerance_lets_a_frame_two_before_the_window_in(monkeypatch, tmp_path, datasets):
    """tolerance_s=0.1 (3 frames at 30 fps): frame 28 stamped 1.0233 s (0.09 s off its grid time) lies in [1.0, 1.5).
    The join selects it; the lazy check reads only the window's frames and frame 29 (the one just before)."""
    def change(cols, j):
        cols["timestamp"][j + 28] = np.float32(28 / 30 + 0.09)

    root = _h21_copy(tmp_path, datasets, change)
    _h21_same_or_refused(monkeypatch, tmp_path, root, cameras=[], tolerance_s=0.1,
                         sql="SELECT 5 AS episode_index, 1.0::DOUBLE AS start_s, 1.5::DOUBLE AS end_s")


def test_hostile21_align_frame_index_a_far_frame_stamped_inside_the_window(monkeypatch, tmp_path, datasets):
    """align="frame_index" bounds no timestamp (wall-clock times); the join still selects a window's frames by
    timestamp, so frame 100 stamped 1.2 s is in [1.0, 1.5). The lazy check never reads frame 100."""
    def change(cols, j):
        cols["timestamp"][j + 100] = np.float32(1.2)

    root = _h21_copy(tmp_path, datasets, change)
    _h21_same_or_refused(monkeypatch, tmp_path, root, cameras=[], align="frame_index",
                         sql="SELECT 5 AS episode_index, 1.0::DOUBLE AS start_s, 1.5::DOUBLE AS end_s")


def test_hostile21_integer_bounds_are_compared_in_float32_by_the_join(monkeypatch, tmp_path, datasets):
    """`1 AS start_s`: the join's `f.timestamp >= r.start_s - 0.0001` is INTEGER - DECIMAL = DECIMAL, which DuckDB
    compares with the FLOAT timestamp in FLOAT (float32(0.9999) >= it); the plan and its check use float64
    (0.99989998 < 0.9999). Frame 29 stamped float32(0.9999) (align="frame_index": wall-clock times) is in the join's
    window and outside the plan's, and the check of the frame before the window agrees with the plan."""
    def change(cols, j):
        cols["timestamp"][j + 29] = np.float32(0.9999)

    root = _h21_copy(tmp_path, datasets, change)
    _h21_same_or_refused(monkeypatch, tmp_path, root, cameras=[], align="frame_index",
                         sql="SELECT 5 AS episode_index, 1 AS start_s, 2 AS end_s")


def test_hostile21_meta_episodes_one_frame_short_window_to_the_end(monkeypatch, tmp_path, datasets):
    """meta/episodes says episode 5 has 284 frames (dataset_to_index, length; episode 6 starting one row earlier, so
    the file's total holds), the data 285. A window to the episode's end: the join serves the data's 15 frames (and
    warns that meta/episodes disagrees); the lazy plan clips at meta's length, reads no frame after it, says nothing."""
    root = _h21_copy(tmp_path, datasets, meta=_episode_5_one_short)
    _h21_same_or_refused(monkeypatch, tmp_path, root, cameras=[],
                         sql="SELECT 5 AS episode_index, 9.0::DOUBLE AS start_s, 100.0::DOUBLE AS end_s")


def test_hostile21_decimal_bounds_beyond_float64_sort_like_the_join(monkeypatch, tmp_path, datasets):
    """No ORDER BY: the join sorts the result by its DECIMAL bounds (1.0 before 1.000000000000000000001), the lazy
    plan by their float64 casts (equal, then by end_s): the same frames in another order."""
    sql = "SELECT * FROM (VALUES (3, 1.000000000000000000001, 2.0), (3, 1.0, 3.0)) t(episode_index, start_s, end_s)"
    _h21_same_or_refused(monkeypatch, tmp_path, datasets / "small20", sql=sql, cameras=[])


def test_hostile21_meta_stats_after_the_dataset_is_dropped(monkeypatch, tmp_path, datasets):
    """`db.dataset(windows).meta` kept, the dataset collected: the statistics of a lazy window selection follow a
    weak reference to the dataset, and raised AttributeError ('NoneType' object has no attribute 'manifest')."""
    import gc

    sql = "SELECT episode_index, 1.0 AS start_s, 2.0 AS end_s FROM episodes"
    want = lsql.connect(datasets / "small20", cache_dir=tmp_path / "e").dataset(sql, cameras=[]).meta.stats
    from lerobot_sql._plan import episodes

    monkeypatch.setattr(episodes, "LAZY_FRAMES", 0)
    meta = lsql.connect(datasets / "small20", cache_dir=tmp_path / "l").dataset(sql, cameras=[]).meta
    gc.collect()
    np.testing.assert_array_equal(np.asarray(meta.stats["action"]["mean"]), np.asarray(want["action"]["mean"]))


def test_windows_over_float64_timestamps_are_planned_on_their_grid(monkeypatch, tmp_path, datasets):
    """Timestamps stored as float64 (exactly k / fps): the plan uses that grid, not lerobot's float32 one, which put
    frame 31 on the other side of a bound 1e-4 s past its time and refused the data as straying from the grid."""
    import shutil

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    f = next((root / "data").rglob("*.parquet"))
    t = pq.read_table(f)
    exact = t["frame_index"].to_numpy() / 30.0
    t = t.set_column(t.column_names.index("timestamp"), pa.field("timestamp", pa.float64()), pa.array(exact))
    pq.write_table(t, f)
    sql = f"SELECT 5 AS episode_index, {31 / 30 + 1e-4!r}::DOUBLE AS start_s, 3.0::DOUBLE AS end_s"
    eager = lsql.connect(root, cache_dir=tmp_path / "e").dataset(sql, cameras=[])
    lazy = _lazy(monkeypatch, root, tmp_path / "l", sql=sql, cameras=[])
    assert len(lazy) == len(eager)
    for i in (0, len(lazy) // 2, len(lazy) - 1):  # items first: their row groups checked as the items read them
        _same_item(lazy[i], eager[i], i)
    assert lazy.manifest["index"].to_pylist() == eager.manifest["index"].to_pylist()


@pytest.mark.parametrize("row_groups", ["one", "cut where meta/episodes says each episode ends",
                                        "cut so, without statistics"])
def test_a_whole_episode_shorter_in_meta_than_in_its_rows_is_refused_where_read(monkeypatch, tmp_path, datasets,
                                                                               row_groups):
    """meta/episodes gives episode 5 one frame fewer than its rows (episode 6 starting a row early, so the file's
    total holds): episode 5 alone, opened without its frames, read its 284 rows and left the 285th out, silently
    (the open of every frame serves the rows, with a warning). The row after its range is checked where read: in
    the same row group, or in the next one (its footer statistics hold episode 5: that row group is read)."""
    from lerobot_sql.errors import DatasetFormatError

    root = _h21_copy(tmp_path, datasets, meta=_episode_5_one_short)
    if row_groups != "one":
        f = next((root / "data").rglob("*.parquet"))
        t = pq.read_table(f)
        ends = pq.read_table(next((root / "meta" / "episodes").rglob("*.parquet")))["dataset_to_index"].to_pylist()
        with pq.ParquetWriter(f, t.schema, write_statistics="without" not in row_groups) as w:
            a = 0
            for b in ends:
                w.write_table(t.slice(a, b - a))
                a = b
        assert pq.ParquetFile(f).num_row_groups == len(ends)
    lazy = _lazy(monkeypatch, root, tmp_path / "l", episodes=[5], cameras=[])
    with pytest.raises(DatasetFormatError, match=r"row after episode 5's frames.*holds index \d+ of episode 5"):
        lazy[0]
    ok = _lazy(monkeypatch, datasets / "small20", tmp_path / "ok", episodes=[5], cameras=[])
    assert len(ok) == 285 and int(ok[284]["frame_index"]) == 284


def test_a_row_group_read_again_is_not_checked_again(monkeypatch, tmp_path, datasets):
    """A shuffled epoch reads a row group once per item of it once the decoded set's bound has let it go: its frames
    are checked the first time only (the checks cost more than the read), and its items stay equal."""
    from lerobot_sql._plan import clips

    ds = _lazy(monkeypatch, datasets / "small20", tmp_path, cameras=[])
    calls = []
    real = clips.check_frames
    monkeypatch.setattr(_samples, "check_frames", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = ds[100]
    n = len(calls)
    assert n >= 1
    w = ds._w()
    w.views = type(w.views)(budget=1)  # nothing kept but the last row group read
    ds._samples.frames.MAX_ROW_GROUPS = 1  # nor its decoded frame columns
    ds[4000]  # another row group
    again = ds[100]  # read again
    assert len(calls) == n + 1  # the other row group's check only
    _same_item(first, again, 100)


@pytest.mark.parametrize("lazy", [False, True])
def test_windows_cut_at_an_episodes_end_are_named_and_a_selection_of_empty_windows_says_which(monkeypatch, tmp_path,
                                                                                            datasets, lazy):
    """A window reaching past its episode's last frame gave the frames there, fewer than its seconds, without a
    word (a new user's 8.5 s window of a 1.7 s episode: 7 items); a selection whose every window is empty said only
    "matched no frames". Both opens now name the rows, with the episode's span."""
    from lerobot_sql._plan import episodes
    from lerobot_sql.errors import ResultContractError

    if lazy:
        monkeypatch.setattr(episodes, "LAZY_FRAMES", 0)
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"1 of the 1 window rows reach past.*row 0: episode 10, 1.5 .. 10.0 s "
                                         r"\(its frames at 0 .. 1.7 s\)"):
        ds = db.dataset("SELECT 10 AS episode_index, 1.5::DOUBLE AS start_s, 10.0::DOUBLE AS end_s", cameras=[])
    assert len(ds) == 7 and ds._samples.lazy == lazy
    with pytest.raises(ResultContractError, match=r"no window holds a frame \(row 0: episode 0, 100.0 .. 101.0 s "
                                                  r"\(its frames at 0 .. 11.57 s\); row 1: episode 1"):
        db.dataset("SELECT episode_index, 100.0::DOUBLE AS start_s, 101.0::DOUBLE AS end_s FROM episodes "
                   "WHERE episode_index < 2", cameras=[])


def test_a_lazy_selections_frame_lock_held_at_a_fork_does_not_hang_the_child(datasets, tmp_path, monkeypatch):
    """(hostile review 23: FrameColumns' lock, held by an item thread when a DataLoader forked its workers, stayed
    held in each worker for good: its first item hung)"""
    import time

    monkeypatch.setenv("LSQL_LAZY_FRAMES", "1")  # (every selection opens as runs, its frames read per row group)
    ds = lsql.connect(datasets / "small20", cache_dir=tmp_path / "c").dataset(cameras=[])
    held = ds._samples.frames._lock
    lock = held if hasattr(held, "acquire") else held()  # (the lock before the fix; this process's lock after)
    r, w = os.pipe()
    with lock:  # as an item thread of this process would hold it at the fork
        pid = os.fork()
        if pid == 0:  # the child: an item of a row group the parent has not read
            try:
                os.write(w, str(int(ds[len(ds) - 1]["index"])).encode())
            finally:
                os._exit(0)
    os.close(w)
    deadline, done = time.time() + 20, 0
    while not done and time.time() < deadline:  # (well under a second when it does not hang)
        done = os.waitpid(pid, os.WNOHANG)[0]
        time.sleep(0.02)
    if not done:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    got = os.read(r, 64).decode()
    os.close(r)
    assert done and got == str(len(ds) - 1)
