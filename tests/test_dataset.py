"""Items from db.dataset() against lerobot 0.4.4's LeRobotDataset items (shared/reference), exactly."""

from __future__ import annotations

import json
import shutil

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from helpers import (
    REFERENCE_SETS,
    assert_item_equals_reference,
    assert_items_equal,
    data_root,
    exp_bounds,
    load_reference,
)
from lerobot_sql._readers import row_group_store, tabular, video_index


@pytest.mark.parametrize("name", REFERENCE_SETS)
@pytest.mark.parametrize("mode", ["plain", "delta"])
def test_items_equal_lerobot_reference(name, mode):
    ref, npz = load_reference(name)
    db = lsql.connect(data_root(name))
    ds = db.dataset("SELECT index FROM frames ORDER BY index",
                    delta_timestamps=ref["delta_timestamps"] if mode == "delta" else None)
    assert len(ds) == ref["total_frames"]
    for it in ref["items"]:
        assert_item_equals_reference(ds[it["index"]], it, npz, mode)


def test_uint8_frames_are_what_the_floats_came_from(datasets):
    ref, npz = load_reference("small20")
    db = lsql.connect(datasets / "small20")
    ds = db.dataset("SELECT index FROM frames ORDER BY index", return_uint8=True)
    it = ref["items"][5]
    item = ds[it["index"]]
    for key in ref["video_keys"]:
        assert item[key].dtype == torch.uint8
        np.testing.assert_array_equal(item[key].numpy(), npz[f"plain/{it['index']}/{key}"])


def test_partial_episode_selection_pads_against_full_episode(datasets):
    """A window in the middle of an episode still reads neighbours outside it, and pads only at the episode edge."""
    db = lsql.connect(datasets / "small20")
    length = db.sql("SELECT length FROM episodes WHERE episode_index = 3").fetchall()[0][0]
    dt = {"action": [i / 30 for i in range(-3, 4)]}
    full = db.dataset("SELECT index FROM frames WHERE episode_index = 3 ORDER BY index", delta_timestamps=dt)
    part = db.dataset("SELECT 3 AS episode_index, 1.0 AS start_s, 2.0 AS end_s", delta_timestamps=dt)
    assert len(part) == 30
    assert len(full) == length
    for j in range(len(part)):
        a, b = part[j], full[30 + j]
        assert int(a["frame_index"]) == 30 + j
        torch.testing.assert_close(a["action"], b["action"], rtol=0, atol=0)
        assert torch.equal(a["action_is_pad"], b["action_is_pad"])
    first = full[0]
    assert first["action_is_pad"].tolist() == [True, True, True, False, False, False, False]
    torch.testing.assert_close(first["action"][0], first["action"][3], rtol=0, atol=0)


def test_result_contract_modes_and_extras(datasets, framecode):
    db = lsql.connect(datasets / "small20")
    eps = db.dataset("SELECT episode_index, length * 2 AS twice FROM episodes WHERE episode_index IN (2, 5)")
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    assert len(eps) == lengths[2] + lengths[5]
    item = eps[0]
    assert int(item["episode_index"]) == 2 and int(item["frame_index"]) == 0
    assert item["twice"].item() == 2 * lengths[2]
    last = eps[len(eps) - 1]
    assert int(last["episode_index"]) == 5 and int(last["frame_index"]) == lengths[5] - 1
    np.testing.assert_array_equal(last["observation.state"].numpy(),
                                  framecode.expected_state(5, lengths[5] - 1))
    # index mode keeps result order
    idx = db.dataset("SELECT index, 'tag' AS note FROM frames WHERE index IN (7, 3, 100) ORDER BY index DESC")
    assert [int(idx[i]["index"]) for i in range(3)] == [100, 7, 3]
    assert idx[0]["note"] == "tag"


def test_result_contract_errors(datasets):
    db = lsql.connect(datasets / "small20")
    with pytest.raises(lsql.ResultContractError, match="index.*episode_index"):
        db.dataset("SELECT length FROM episodes")
    with pytest.raises(lsql.ResultContractError, match="no rows"):
        db.dataset("SELECT episode_index FROM episodes WHERE length < 0")
    with pytest.raises(ValueError, match="multiples of 1/fps"):
        db.dataset("SELECT episode_index FROM episodes", delta_timestamps={"action": [0.01]})
    with pytest.raises(ValueError, match="not a feature"):
        db.dataset("SELECT episode_index FROM episodes", delta_timestamps={"nope": [0.0]})


def test_frames_are_the_right_frames(datasets, framecode):
    """Ground truth beyond the reference: every camera frame of some episodes carries its own codeword."""
    db = lsql.connect(datasets / "multifile60")
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index IN (10, 11, 21, 22, 46, 47)",
                    return_uint8=True)
    for i in range(0, len(ds), 7):
        item = ds[i]
        ep, f = int(item["episode_index"]), int(item["frame_index"])
        for cam, k in ((1, "observation.images.front"), (2, "observation.images.wrist")):
            assert framecode.verify_frame(item[k].permute(1, 2, 0).numpy(), ep, f, cam)["ok"], (ep, f, k)


def test_dataloader_two_workers_on_real_g1_matches_direct_pyav(real_datasets):
    root = real_datasets / "g1_real_v30"
    db = lsql.connect(root)
    ds = db.dataset("SELECT index FROM frames WHERE episode_index IN (1, 6) AND frame_index % 40 = 0 ORDER BY index",
                    return_uint8=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False, num_workers=2)
    batches = list(loader)
    got = torch.cat([b["observation.images.cam_high"] for b in batches])
    idx = torch.cat([b["index"] for b in batches])
    assert len(got) == len(ds) > 0
    want_idx = [r[0] for r in db.sql("SELECT index FROM frames WHERE episode_index IN (1, 6) AND frame_index % 40 = 0 "
                                      "ORDER BY index").fetchall()]
    assert idx.tolist() == want_idx
    # Direct PyAV: decode the whole file sequentially, pick frame round((from_timestamp + timestamp) * fps).
    rows = db.con.execute(
        "SELECT f.index, v.path, v.from_timestamp + f.timestamp AS t FROM frames f JOIN videos v USING (episode_index) "
        "WHERE list_contains(?, f.index) ORDER BY f.index", [want_idx]).fetchall()
    wanted = {round(t * 30): i for i, _, t in rows}
    found = {}
    with av.open(str(root / rows[0][1])) as c:
        for n, frame in enumerate(c.decode(video=0)):
            if n in wanted:
                found[wanted[n]] = frame.to_ndarray(format="rgb24").transpose(2, 0, 1)
    for k, i in enumerate(want_idx):
        np.testing.assert_array_equal(got[k].numpy(), found[i], err_msg=f"index {i}")


def test_extra_numbers_collate_decimals_and_nulls(datasets):
    """DuckDB types 1.5 as DECIMAL and CASE without ELSE gives NULLs: both must reach the DataLoader as tensors."""
    db = lsql.connect(datasets / "small20")
    ds = db.dataset("SELECT index, 1.5 AS w, [1.0, 2.5] AS vec, CASE WHEN index % 2 = 0 THEN 7 END AS maybe "
                    "FROM frames WHERE index < 4 ORDER BY index", cameras=[])
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)))
    assert batch["w"].tolist() == [1.5] * 4
    assert batch["vec"].tolist() == [[1.0, 2.5]] * 4
    assert batch["maybe"][0].item() == 7 and torch.isnan(batch["maybe"][1])


def test_result_columns_never_silently_replace_item_keys(datasets):
    db = lsql.connect(datasets / "small20")
    with pytest.raises(lsql.ResultContractError, match="differ from the frames' own values"):
        db.dataset("SELECT index, 99 AS frame_index FROM frames WHERE index < 3", cameras=[])
    with pytest.raises(lsql.ResultContractError, match=r"\['task'\] clash"):
        db.dataset("SELECT index, 'x' AS task FROM frames WHERE index < 3", cameras=[])
    with pytest.raises(lsql.ResultContractError, match="per-frame columns"):
        db.dataset("SELECT episode_index, 3 AS frame_index FROM episodes", cameras=[])
    # the frame's own columns, selected as they are, are fine
    ds = db.dataset("SELECT * FROM frames WHERE episode_index = 1 ORDER BY index", cameras=[])
    assert int(ds[5]["frame_index"]) == 5


def test_option_mistakes_get_clear_errors(datasets):
    db = lsql.connect(datasets / "small20")
    sql = "SELECT index FROM frames WHERE index < 3"
    one = db.dataset(sql, cameras="observation.images.front")  # a single key is a list of one
    assert "observation.images.front" in one[0] and "observation.images.wrist" not in one[0]
    with pytest.raises(ValueError, match=r"must be a list of offsets in seconds"):
        db.dataset(sql, delta_timestamps={"action": 0.1})
    with pytest.raises(ValueError, match="leaves out"):
        db.dataset(sql, cameras=[], delta_timestamps={"observation.images.front": [0.0]})


def test_missing_video_names_the_file_and_the_way_out(real_datasets):
    db = lsql.connect(real_datasets / "record-test")
    with pytest.warns(UserWarning, match="missing"):
        ds = db.dataset("SELECT index FROM frames WHERE index < 3")
    with pytest.raises(lsql.MissingFileError, match=r"observation.images.front/chunk-000/file-000.mp4.*cameras=\[\]"):
        ds[0]
    tab = db.dataset("SELECT index FROM frames WHERE index < 3", cameras=[])
    assert tab[2]["observation.state"].shape == (6,)


def test_same_query_same_manifest_without_order_by(datasets):
    """DuckDB's row order is undefined without ORDER BY (window functions make it vary run to run): such results are
    sorted by the contract columns, so a query always gives the same samples in the same order; ORDER BY is kept."""
    db = lsql.connect(datasets / "multifile60")
    sql = 'SELECT index FROM frames_ext WHERE "observation.state.speed" > 50'
    runs = [db.manifest(sql)["index"].to_pylist() for _ in range(3)]
    assert runs[0] == runs[1] == runs[2] == sorted(runs[0])
    win = 'SELECT * FROM event_windows("observation.state.gripper.pos" < 20, 2, 0)'
    a, b = db.manifest(win), db.manifest(win)
    assert a["index"].to_pylist() == b["index"].to_pylist()
    assert a["episode_index"].to_pylist() == sorted(a["episode_index"].to_pylist())
    desc = db.manifest(sql + " ORDER BY index DESC")["index"].to_pylist()
    assert desc == sorted(runs[0], reverse=True)


def test_manifest_row_cap_follows_memory(datasets, monkeypatch):
    db = lsql.connect(datasets / "small20")
    monkeypatch.setenv("LSQL_MAX_MANIFEST_ROWS", "1000")
    with pytest.raises(lsql.ResultContractError, match="more than 1,000 rows"):
        db.dataset("SELECT a.index FROM frames a, frames b", cameras=[])
    monkeypatch.delenv("LSQL_MAX_MANIFEST_ROWS")
    from lerobot_sql._catalog.connection import max_manifest_rows

    assert 1_000_000 <= max_manifest_rows() <= 200_000_000


def test_manifest_path_typo_is_a_missing_file_not_a_sql_error(datasets, tmp_path):
    db = lsql.connect(datasets / "small20")
    with pytest.raises(lsql.MissingFileError, match="manifest file not found"):
        db.dataset(tmp_path / "nope.parquet")  # a Path: a file (a str is SQL, test_manifest)


# ---- lazy construction: items read (and index) only what they need ------------------------------------------------
def _cache_files(cache) -> set:
    """Finished video-index entries under a cache folder (not locks or temporary files); row groups are never
    written as files of their own (lerobot_sql._readers.tabular: read straight from the data files, then kept in
    one row-group store per data file, lerobot_sql._readers.row_group_store)."""
    return {p for sub in ("tabular", "video_index") for p in (cache / sub).rglob("*")
            if p.suffix in (".arrow", ".parquet")}


def _frame_home(root, index: int) -> tuple[str, int, int, int]:
    """(data file, row group, row in the file, episode) of frame ``index``, read with pyarrow alone."""
    for f in sorted((root / "data").rglob("*.parquet")):
        pf = pq.ParquetFile(f)
        start = 0
        for rg in range(pf.num_row_groups):
            t = pf.read_row_group(rg, columns=["index", "episode_index"])
            hit = np.flatnonzero(t["index"].to_numpy() == index)
            if len(hit):
                return (str(f.relative_to(root)), rg, start + int(hit[0]),
                        int(t["episode_index"].to_numpy()[hit[0]]))
            start += t.num_rows
    raise AssertionError(f"frame {index} not in the data files")


def _mp4s(root, episode: int) -> list[str]:
    """Each camera's mp4 holding ``episode`` (meta/episodes pointers and info.json's video_path)."""
    info = json.loads((root / "meta/info.json").read_text())
    eps = pq.read_table(sorted((root / "meta/episodes").rglob("*.parquet"))).to_pylist()
    row = next(r for r in eps if r["episode_index"] == episode)
    keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    return [info["video_path"].format(video_key=k, chunk_index=row[f"videos/{k}/chunk_index"],
                                      file_index=row[f"videos/{k}/file_index"]) for k in keys]


def _expected(src, cache, mp4s: set) -> set:
    """Video-index cache files of mp4s, named as video_index names its entries (items need only the Arrow form; the
    Parquet one is for the SQL view video_frames)."""
    return {video_index.index_path(src, rel, cache).with_suffix(".arrow") for rel in mp4s}


def _log_reads(monkeypatch, log=None) -> list:
    """Record each row group read from a data file, or from its row-group store, as (data file, row group);
    appended to file ``log`` too (so DataLoader workers' reads are seen)."""
    reads = []
    real, real_views, real_get = tabular.read_row_groups, tabular.read_views, row_group_store.RowGroupStore.get

    def note(rel, rgs):
        reads.extend((rel, int(rg)) for rg in rgs)
        if log is not None:
            with open(log, "a") as f:
                f.writelines(f"rg {rel} {int(rg)}\n" for rg in rgs)

    def read(src, info, rgs, layout, columns=None):
        note(info.rel, rgs)
        return real(src, info, rgs, layout, columns)

    def views(src, info, rgs, layout):  # (an item's row groups, every column)
        note(info.rel, rgs)
        return real_views(src, info, rgs, layout)

    def get(store, rg, rows):
        got = real_get(store, rg, rows)
        if got is not None:
            note(store.rel, [rg])
        return got

    monkeypatch.setattr(tabular, "read_row_groups", read)
    monkeypatch.setattr(tabular, "read_views", views)
    monkeypatch.setattr(row_group_store.RowGroupStore, "get", get)
    return reads


def test_construction_builds_nothing_and_items_only_what_they_read(datasets, tmp_path, monkeypatch):
    root, cache = datasets / "multifile60", tmp_path / "c"
    reads = _log_reads(monkeypatch)
    db = lsql.connect(root, cache_dir=cache)
    ds = db.dataset("SELECT index FROM frames ORDER BY index")
    assert _cache_files(cache) == set() and reads == []  # no row group read, no mp4 demuxed
    n = len(ds)
    homes, mp4s = set(), set()
    for idx in (n - 5, 700, 702, 30):  # the second data file, then the first; 702 shares 700's row group
        item = ds[idx]
        assert int(item["index"]) == idx
        rel, rg, _, ep = _frame_home(root, idx)
        homes.add((rel, rg))
        mp4s.update(_mp4s(root, ep))
        assert set(reads) == homes and len(reads) == len(homes), idx  # each row group read once
        assert _cache_files(cache) == _expected(db.source, cache, mp4s), idx
    assert len({rel for rel, _ in homes}) == 2 and len(mp4s) > 2
    assert not (cache / "tabular").exists()  # no file per row group


def test_neighbours_across_row_groups_read_both_and_the_right_rows(datasets, tmp_path, monkeypatch):
    """Row groups of 100 rows, so an episode spans several: an item near a boundary needs two of them."""
    root, cache = tmp_path / "ds", tmp_path / "c"
    shutil.copytree(datasets / "small20", root)
    data = root / "data/chunk-000/file-000.parquet"
    data.chmod(0o644)
    table = pq.read_table(data)
    pq.write_table(table, data, row_group_size=100)
    reads = _log_reads(monkeypatch)
    db = lsql.connect(root, cache_dir=cache)
    dt = {"action": [k / 30 for k in range(-2, 3)]}
    for idx, rgs in ((100, {0, 1}), (150, {1})):
        ds = db.dataset(f"SELECT index FROM frames WHERE index = {idx}", delta_timestamps=dt, cameras=[])
        reads.clear()
        item = ds[0]
        rel, rg, row, ep = _frame_home(root, idx)
        assert rg == max(rgs) and ep == 0  # episode 0 has 348 frames: no clamping here
        assert set(reads) == {(rel, g) for g in rgs}
        np.testing.assert_array_equal(item["action"].numpy(),
                                      np.array(table["action"].to_pylist()[row - 2: row + 3], np.float32))


def test_dataloader_workers_read_only_the_needed_row_groups_and_match_one_process(datasets, tmp_path, monkeypatch):
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    data = root / "data/chunk-000/file-000.parquet"
    data.chmod(0o644)
    pq.write_table(pq.read_table(data), data, row_group_size=100)
    builds = tmp_path / "builds.log"  # one line per row group read / mp4 demuxed, by any process
    real_demux = video_index._demux_index

    def demux(src, rel):
        with open(builds, "a") as f:
            f.write("mp4\n")
        return real_demux(src, rel)

    _log_reads(monkeypatch, builds)
    monkeypatch.setattr(video_index, "_demux_index", demux)
    sql = "SELECT index FROM frames WHERE episode_index IN (0, 3, 7) AND frame_index % 23 IN (0, 1) ORDER BY index"
    dt = {"action": [-2 / 30, 0, 2 / 30], "observation.images.front": [-1 / 30, 0]}
    runs = {}
    for workers in (2, 0):
        cache = tmp_path / f"c{workers}"
        builds.unlink(missing_ok=True)
        ds = lsql.connect(root, cache_dir=cache).dataset(sql, delta_timestamps=dt, return_uint8=True)
        assert _cache_files(cache) == set()
        builds.unlink(missing_ok=True)  # (the query read its row groups of frames: counted are the items' reads)
        loader = torch.utils.data.DataLoader(ds, batch_size=6, num_workers=workers, multiprocessing_context="fork"
                                             if workers else None)
        runs[workers] = (list(loader), sorted(p.relative_to(cache) for p in _cache_files(cache)),
                         builds.read_text().splitlines())
        assert not list(cache.rglob("*.tmp"))
    (par, par_files, par_builds), (one, one_files, one_builds) = runs[2], runs[0]
    assert len(par) == len(one) > 1
    for a, b in zip(par, one):
        assert a["task"] == b["task"]
        assert_items_equal({k: v for k, v in a.items() if k != "task"}, {k: v for k, v in b.items() if k != "task"})
    # the same video entries either way, each built once; the row groups holding the frames and their clamped
    # neighbours read, once in one process (each worker reads the ones its batches need)
    assert par_files == one_files and par_builds.count("mp4") == one_builds.count("mp4") == 2
    rows = pq.read_table(data, columns=["episode_index", "frame_index"]).to_pandas()
    rows["row"] = np.arange(len(rows))  # row in the file
    ends = rows.groupby("episode_index")["row"].agg(["min", "max"])
    pf = pq.ParquetFile(data)
    offsets = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
    sel = rows[rows.episode_index.isin([0, 3, 7]) & rows.frame_index.mod(23).isin([0, 1])]
    need = set()
    for _, r in sel.iterrows():
        lo, hi = ends.loc[r.episode_index]
        for d in (-2, 0, 2):
            need.add(int(np.searchsorted(offsets, min(max(r.row + d, lo), hi), side="right") - 1))
    one_rgs = [int(b.split()[-1]) for b in one_builds if b.startswith("rg ")]
    par_rgs = [int(b.split()[-1]) for b in par_builds if b.startswith("rg ")]
    assert sorted(one_rgs) == sorted(need) and set(par_rgs) == need


# ---- non-finite input ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nan_timestamp(datasets, tmp_path_factory):
    """A copy of small20 whose episode 1, frame 10 has timestamp NaN (all else unchanged)."""
    import pyarrow as pa

    root = tmp_path_factory.mktemp("nan_ts") / "small20"
    shutil.copytree(datasets / "small20", root)
    f = root / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(f)
    ts = t["timestamp"].to_numpy().copy()
    hit = (t["episode_index"].to_numpy() == 1) & (t["frame_index"].to_numpy() == 10)
    assert hit.sum() == 1
    ts[hit] = np.nan
    t = t.set_column(t.column_names.index("timestamp"), "timestamp", pa.array(ts, pa.float32()))
    rg = pq.ParquetFile(datasets / "small20" / "data" / "chunk-000" / "file-000.parquet").metadata.row_group(0)
    pq.write_table(t, f, row_group_size=rg.num_rows)  # the source's row groups, so only the value differs
    return root


@pytest.mark.parametrize("sql", ["SELECT 1 AS episode_index",  # pointer fast path (pyarrow)
                                 "SELECT 1 AS episode_index, 0.0 AS start_s, 1.0 AS end_s",  # DuckDB path
                                 "SELECT index FROM frames WHERE episode_index = 1 ORDER BY index"])
def test_nan_timestamp_fails_the_fps_grid_check(nan_timestamp, tmp_path, sql):
    """A NaN timestamp used to pass the grid check (every comparison with NaN is False): the 1 s window then had
    29 frames, silently. Now: DatasetFormatError naming the episode, the data file and the frame."""
    db = lsql.connect(nan_timestamp, cache_dir=tmp_path / "c")
    with pytest.raises(lsql.DatasetFormatError,
                       match=r"episode 1: a timestamp in data/chunk-000/file-000\.parquet \(frame_index 10\) is NaN"):
        db.dataset(sql, cameras=[])
    # Other episodes are untouched and still exact in length.
    n2 = db.sql("SELECT length FROM episodes WHERE episode_index = 2").fetchall()[0][0]
    assert len(db.dataset("SELECT 2 AS episode_index", cameras=[])) == n2
    assert len(db.dataset("SELECT 2 AS episode_index, 0.0 AS start_s, 1.0 AS end_s", cameras=[])) == 30


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e30, -1e12])
def test_non_finite_or_absurd_delta_timestamps_are_refused(datasets, bad):
    db = lsql.connect(datasets / "small20")
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]") as e:
        db.dataset("SELECT 2 AS episode_index", delta_timestamps={"action": [0.0, bad]}, cameras=[])
    assert ("not finite" in str(e.value)) == (not np.isfinite(bad))
    # a long but real offset still works (and pads)
    ds = db.dataset("SELECT 2 AS episode_index", delta_timestamps={"action": [0.0, 3600.0]}, cameras=[])
    assert ds[0]["action_is_pad"].tolist() == [False, True]


@pytest.mark.parametrize("start, end, col", [("'nan'::DOUBLE", "1.0", "start_s"), ("0.0", "'nan'::DOUBLE", "end_s"),
                                             ("0.0", "NULL::DOUBLE", "end_s")])
def test_nan_window_bounds_are_refused(datasets, start, end, col):
    """DuckDB orders NaN above every number: `timestamp < NaN` holds, so a NaN end_s selected the whole rest of the
    episode (158 frames for a window meant to be short); a NaN start_s selected nothing."""
    db = lsql.connect(datasets / "small20")
    sql = f"SELECT 1 AS episode_index, {start} AS start_s, {end} AS end_s"
    with pytest.raises(lsql.ResultContractError,
                       match=rf"result column {col} is (nan|NULL) in row 0 \(episode_index 1\)"):
        db.dataset(sql, cameras=[])
    # infinite bounds keep their meaning: the whole episode
    n1 = db.sql("SELECT length FROM episodes WHERE episode_index = 1").fetchall()[0][0]
    assert len(db.dataset("SELECT 1 AS episode_index, '-inf'::DOUBLE AS start_s, 'inf'::DOUBLE AS end_s",
                          cameras=[])) == n1


@pytest.mark.parametrize("sql, msg", [
    ("SELECT * FROM event_windows(\"observation.state\"[1] > 0, 'nan'::DOUBLE, 1)", "event_windows: before_s"),
    ("SELECT * FROM event_windows(\"observation.state\"[1] > 0, 1, NULL)", "event_windows: before_s"),
    ("SELECT * FROM segments(\"observation.state\"[1] > 0, 'nan'::DOUBLE)", "segments: min_duration_s"),
])
def test_window_macros_refuse_nan_arguments(datasets, sql, msg):
    """A NaN argument made every comparison false: no rows, no error."""
    db = lsql.connect(datasets / "small20")
    with pytest.raises(lsql.QueryError, match=msg):
        db.sql(sql).fetchall()
    ok = sql.replace("'nan'::DOUBLE", "0.5").replace("NULL", "1")
    assert db.sql(f"SELECT count(*) FROM ({ok})").fetchall()[0][0] > 0


def test_nearest_refuses_non_finite_times_and_tolerance(datasets):
    db = lsql.connect(datasets / "small20")
    for t in (float("nan"), float("inf")):
        with pytest.raises(lsql.QueryError, match=r"query time (nan|inf) \(row 1, episode_index 1\)"):
            db.nearest([(1, 0.5), (1, t)], ["action"])
    for tol in (float("inf"), float("nan")):
        with pytest.raises(lsql.QueryError, match="tolerance_s must be a finite number"):
            db.nearest([(1, 0.5)], ["action"], tolerance_s=tol)
    t = db.nearest([(1, 0.5)], ["action"], tolerance_s=0.01)
    assert t.num_rows == 1 and abs(t["dt_s"][0].as_py()) < 0.01


def _png(w: int, h: int) -> bytes:
    import io

    from PIL import Image

    b = io.BytesIO()
    Image.new("RGB", (w, h)).save(b, format="PNG")
    return b.getvalue()


@pytest.mark.parametrize("case", ["wrong_size", "bytes_null", "not_an_image", "bomb"])
def test_hostile_image_cells_are_format_errors(datasets, tmp_path, case):
    """A PNG of another size than declared (lerobot would serve it; the batch shape would change), a 12000 x 12000
    PNG of a few kB (0.43 GB decoded: refused from its header, before decoding), a cell with only a path (never
    opened), and bytes that are no image: each a DatasetFormatError naming the data file, column and sample."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cell = {"wrong_size": lambda: {"bytes": _png(640, 480), "path": None},  # built for its case only: the bomb
            "bytes_null": lambda: {"bytes": None, "path": "/etc/hostname"},   # takes seconds to compress
            "not_an_image": lambda: {"bytes": b"hello, not a png", "path": None},
            "bomb": lambda: {"bytes": _png(12000, 12000), "path": None}}[case]()
    root = tmp_path / "img5_extras"
    shutil.copytree(datasets / "img5_extras", root)
    f = root / "data/chunk-000/file-000.parquet"
    f.chmod(0o644)
    t = pq.read_table(f)
    key = "observation.images.front"
    col = t[key].combine_chunks().to_pylist()
    col[0] = cell
    pq.write_table(t.set_column(t.column_names.index(key), key, pa.array(col, t.schema.field(key).type)), f)
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    ds = db.dataset("SELECT index FROM frames WHERE index < 3 ORDER BY index")
    assert tuple(ds[1][key].shape) == (3, 96, 128)  # the intact cells still decode
    with pytest.raises(lsql.DatasetFormatError,
                       match=r"file-000\.parquet: column 'observation\.images\.front' "
                             r"of sample 0 \(episode 0, index 0\)") as e:
        ds[0]
    msg = str(e.value)
    if case in ("wrong_size", "bomb"):
        assert "declares shape [96, 128, 3]" in msg
        assert ("640x480" if case == "wrong_size" else "12000x12000") in msg
    elif case == "bytes_null":
        assert "holds no image bytes" in msg and "hostname" not in msg
    else:
        assert "not a readable image" in msg and e.value.__cause__ is not None


DEPTH_MODES = ["plain", "uint8", "delta", "metres"]


def _depth_options(ref: dict, mode: str) -> dict:
    """db.dataset keywords of a depth4 reference mode: lerobot's LeRobotDataset arguments of the same names."""
    return dict(ref["modes"][mode])


@pytest.mark.parametrize("mode", DEPTH_MODES)
def test_depth_items_equal_lerobot_061_reference(datasets, mode):
    """sample/depth4 (written by lerobot 0.6.1: an HEVC gray12le depth video, 16-bit and float TIFF depth images in
    Parquet, an RGB video) read as lerobot 0.6.1 returned it: depth maps float32 (1, H, W) in mm (metres with
    depth_output_unit="m"), bit for bit, also with return_uint8 and with delta_timestamps on the depth keys; metres
    from the log-quantized video within 2 ulp (torch's exp differs in the last bit by CPU: helpers.exp_bounds)."""
    ref, npz = load_reference("depth4")
    db = lsql.connect(datasets / "depth4")
    ds = db.dataset("SELECT index FROM frames ORDER BY index", **_depth_options(ref, mode))
    assert len(ds) == 72
    assert ds.meta.depth_keys == ref["depth_keys"]
    bounds = exp_bounds(datasets / "depth4", ref["modes"][mode])
    for it in ref["items"]:
        assert_item_equals_reference(ds[it["index"]], it, npz, mode, bounds)


def test_return_uint8_must_be_a_bool(datasets):
    with pytest.raises(TypeError, match="return_uint8 must be True or False"):
        lsql.connect(datasets / "small20").dataset(return_uint8="yes")


@pytest.mark.parametrize("how", ["episodes query", "episodes=", "index query"])
def test_an_unknown_camera_is_named_with_the_valid_ones_on_every_path(datasets, how):
    """A camera key that is not one (misspelt, or the short name): the same error whichever way the items are
    chosen (the whole-episode path met it as a bare KeyError in the clip check before)."""
    db = lsql.connect(datasets / "small20")
    kw = {"episodes query": dict(sql="SELECT episode_index FROM episodes WHERE episode_index = 0"),
          "episodes=": dict(episodes=[0]),
          "index query": dict(sql="SELECT index FROM frames WHERE episode_index = 0")}[how]
    for bad in (["observation.images.top"], "front"):
        with pytest.raises(ValueError, match=r"cameras \['(observation\.images\.top|front)'\] are not camera "
                                             r"features; valid: \['observation\.images\.front', "
                                             r"'observation\.images\.wrist'\]"):
            db.dataset(cameras=bad, **kw)


@pytest.mark.parametrize("name, bad, err, msg", [
    ("decoder_threads", -1, ValueError, r"decoder_threads=-1: give an integer from 0 to 64"),
    ("decoder_threads", 65, ValueError, r"decoder_threads=65: give an integer from 0 to 64"),
    ("decoder_threads", "x", TypeError, r"decoder_threads='x' \(str\): give an integer from 0 to 64"),
    ("decoder_threads", 1.5, TypeError, r"decoder_threads=1.5 \(float\)"),
    ("decoder_threads", True, TypeError, r"decoder_threads=True \(bool\)"),
    ("max_open_decoders", -1, ValueError, r"max_open_decoders=-1: give an integer >= 1"),
    ("max_open_decoders", 0, ValueError, r"max_open_decoders=0: give an integer >= 1"),
    ("seek_reach", -1, ValueError, r"seek_reach=-1: give an integer >= 0"),
    ("seek_reach", None, TypeError, r"seek_reach=None \(NoneType\)"),
])
def test_decoder_options_out_of_range_are_refused_naming_them(datasets, name, bad, err, msg):
    """Before: decoder_threads=-1 raised VideoDecodeError blaming a healthy mp4 ("the file may be corrupt"),
    max_open_decoders=-1 a bare KeyError at the first eviction, 'x' a bare int() error, seek_reach=-1 passed."""
    db = lsql.connect(datasets / "small20")
    with pytest.raises(err, match=msg):
        db.dataset("SELECT index FROM frames WHERE index < 3", **{name: bad})
    with pytest.raises(err, match=msg):  # the same from the constructor (collections, shards, Ray build it)
        lsql.LeRobotSQLDataset(db.files, db.manifest("SELECT index FROM frames WHERE index < 3"), **{name: bad})


def test_decoder_options_at_their_bounds_give_the_same_items(datasets):
    db = lsql.connect(datasets / "small20")
    sql = "SELECT index FROM frames WHERE episode_index = 1 AND frame_index % 7 = 0 ORDER BY index DESC"
    want = db.dataset(sql)
    for kw in (dict(decoder_threads=0), dict(decoder_threads=np.int64(64)), dict(max_open_decoders=1),
               dict(seek_reach=0)):
        ds = db.dataset(sql, **kw)
        assert len(ds) == len(want) == 23
        for i in range(len(ds)):
            assert_items_equal(ds[i], want[i])


def test_only_integers_and_slices_index_a_dataset(datasets):
    """As the README says: ints, numpy integers and 0-d integer tensors. Before, ds[torch.tensor([3])] and ds[True]
    (item 1) were served while ds[np.array([3])] was a TypeError."""
    db = lsql.connect(datasets / "small20")
    ds = db.dataset("SELECT index FROM frames WHERE index % 10 = 0 ORDER BY index", cameras=[])
    for i in (3, np.int64(3), np.int32(3), torch.tensor(3), np.array(3), torch.tensor(3, dtype=torch.uint8)):
        assert int(ds[i]["index"]) == 30
    assert int(ds[-1]["index"]) == 10 * (len(ds) - 1) and len(ds) == (db.layout.info["total_frames"] + 9) // 10
    for bad, shape in ((np.array([3]), r" of shape \(1,\)"), (torch.tensor([3]), r" of shape \(1,\)"),
                       (True, ""), (np.True_, ""), (torch.tensor(True), r" of shape \(\)"), (1.0, ""), ("1", "")):
        with pytest.raises(TypeError, match=rf"dataset indices must be integers .* not {type(bad).__name__}{shape}"):
            ds[bad]
    with pytest.raises(TypeError, match="not bool"):
        ds.__getitems__([1, True])  # the DataLoader's batched fetch checks the same
    assert [int(it["index"]) for it in ds[1:3]] == [10, 20]


@pytest.mark.parametrize("bad", ["1", True, b"1", None])
def test_tolerance_s_that_is_not_a_number_is_refused(datasets, bad):
    """float('1') and float(True) used to pass: a string or bool tolerance was taken as 1 s silently."""
    with pytest.raises(TypeError, match="tolerance_s must be a number of seconds"):
        lsql.connect(datasets / "small20").dataset(episodes=[1], tolerance_s=bad)


def test_features_named_like_the_items_own_keys_are_refused(datasets, tmp_path):
    """An item carries ``task`` (the task text) and ``<key>_is_pad`` per delta_timestamps key on top of the
    features; lerobot 0.4.4's ``__getitem__`` writes them over a feature of that name without a word
    (``item = {**item, **padding}``; ``item["task"] = ...``), and so did we. Refused at db.dataset(), naming the
    dataset, the feature and the way out; a ``_is_pad`` feature whose key has no delta_timestamps is the item's."""
    from helpers import extra_feature_copy, feature_values
    from lerobot_sql.errors import DatasetFormatError

    sql = "SELECT index FROM frames WHERE episode_index = 2 AND frame_index < 3 ORDER BY index"
    root = extra_feature_copy(datasets / "small20", tmp_path / "t", "task")
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(sql, cameras=[])
    msg = str(e.value)
    assert str(root) in msg and "feature 'task'" in msg and "task text" in msg
    assert "rename={'d': {'task': 'task_feature'}}" in msg  # the copy with the feature renamed (tested below)

    root = extra_feature_copy(datasets / "small20", tmp_path / "p", "observation.state_is_pad", dtype="bool")
    db = lsql.connect(root)
    dt = {"observation.state": [-1 / 30, 0.0]}
    with pytest.raises(DatasetFormatError) as e:
        db.dataset(sql, cameras=[], delta_timestamps=dt)
    msg = str(e.value)
    assert str(root) in msg and "feature 'observation.state_is_pad'" in msg and "delta_timestamps" in msg
    assert "'observation.state'" in msg and "rename=" in msg
    # deltas on another key: the feature is the item's own, the padding key is action's
    ds = db.dataset(sql, cameras=[], delta_timestamps={"action": [0.0, 1 / 30]})
    for i in range(3):
        item = ds[i]
        want = feature_values(root, "observation.state_is_pad", int(item["index"]))
        assert item["observation.state_is_pad"].dtype == torch.bool and want.any() and not want.all()
        np.testing.assert_array_equal(item["observation.state_is_pad"].numpy(), want)
        assert item["action_is_pad"].tolist() == [False, False]


def test_the_rename_the_refusal_of_a_task_feature_names_makes_a_readable_copy(datasets, tmp_path):
    """The way out the refusal of a feature named ``task`` gives: a copy written by a one-dataset collection's
    export with the feature renamed; its items carry the feature's vector under the new name, the text as task."""
    from helpers import extra_feature_copy, feature_values

    root = extra_feature_copy(datasets / "small20", tmp_path / "t", "task")
    lsql.connect_many({"d": root}).export("SELECT 'd' AS dataset, episode_index FROM episodes WHERE "
                                          "episode_index IN (2, 3)", tmp_path / "fixed",
                                          rename={"d": {"task": "task_feature"}}, progress=False)
    fixed = lsql.connect(tmp_path / "fixed")
    ds = fixed.dataset("SELECT index FROM frames WHERE episode_index = 0 AND frame_index < 3 ORDER BY index")
    src = lsql.connect(datasets / "small20").dataset(
        "SELECT index FROM frames WHERE episode_index = 2 AND frame_index < 3 ORDER BY index")
    for i in range(3):
        item, ref = ds[i], src[i]
        assert item["task"] == ref["task"] and isinstance(item["task"], str)
        np.testing.assert_array_equal(item["task_feature"].numpy(), feature_values(root, "task", int(ref["index"])))
        assert torch.equal(item["observation.images.front"], ref["observation.images.front"])


@pytest.mark.parametrize("var,value", [("LSQL_ROW_GROUP_MB", "lots"), ("LSQL_ROW_GROUP_CACHE_MB", "inf"),
                                       ("LSQL_DECODER_MB", "-1"), ("LSQL_BATCH_MEMORY", "maybe"),
                                       ("LSQL_LAZY_FRAMES", "many"), ("LSQL_MAX_MANIFEST_ROWS", "abc")])
def test_a_bad_setting_is_a_setting_error_at_the_open_naming_it(datasets, tmp_path, monkeypatch, var, value):
    """(a new user's trial: each was a bare ValueError, the item ones only at the first item, in a DataLoader worker
    "Caught ValueError in DataLoader worker process 0")"""
    monkeypatch.setenv(var, value)
    with pytest.raises(lsql.SettingError, match=f"{var}={value!r}") as e:
        lsql.connect(datasets / "small20", cache_dir=tmp_path / "c").dataset(cameras=[])
    assert isinstance(e.value, ValueError)  # (existing `except ValueError` code keeps working)
