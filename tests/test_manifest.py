"""The manifest, the hinge between SQL and the readers (lerobot_sql/plan.py, pointers.py, export.py).

One contract, however the manifest is made: the pointer path (whole episodes with pyarrow, no DuckDB), the DuckDB
join (every result shape), ``db.dataset(episodes=...)``, and ``export_manifest`` -> ``db.dataset(path)`` give the same
columns in the same order, with the same types and the same ``lerobot_sql.manifest`` metadata. This is the guard rail
for any change to how the manifest is built or stored.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import lerobot_sql as lsql
from helpers import data_root
from test_episodes import ALL, _both

SHIPPED = ["small20", "h264_20", "multifile60", "img5_extras", "v21_small20"]
CORE = [("index", pa.int64()), ("episode_index", pa.int64()), ("frame_index", pa.int64()),
        ("task_index", pa.int64()), ("data_file", pa.string()), ("data_row", pa.int64()),
        ("ep_from_index", pa.int64()), ("ep_to_index", pa.int64()), ("ep_data_row0", pa.int64()),
        ("result_row", pa.int64())]
META_KEYS = {"mode", "extras", "video_keys", "fps", "sql", "clips"}


def _meta(t: pa.Table) -> dict:
    return json.loads(t.schema.metadata[b"lerobot_sql.manifest"])


def _check_contract(m: pa.Table, db, mode: str, extras: list[str], sql: str) -> None:
    """The documented columns, in order, with their types; then the metadata."""
    keys = db.layout.video_keys
    want = ["index", "episode_index", "frame_index", "timestamp", "task_index", "data_file", "data_row",
            "ep_from_index", "ep_to_index", "ep_data_row0", "result_row"]
    want += [c for k in keys for c in (f"{k}/file", f"{k}/from_timestamp")] + extras
    assert m.column_names == want
    for name, typ in CORE:
        assert m.schema.field(name).type == typ, name
    assert pa.types.is_floating(m.schema.field("timestamp").type)
    for k in keys:
        assert m.schema.field(f"{k}/file").type == pa.string()
        assert m.schema.field(f"{k}/from_timestamp").type == pa.float64()
    meta = _meta(m)
    assert set(meta) == META_KEYS
    assert meta["mode"] == mode and meta["extras"] == extras and meta["sql"] == sql
    assert meta["video_keys"] == keys and meta["fps"] == db.layout.fps
    assert set(meta["clips"]) == set(keys)
    # every sample's data row and episode extent agree with each other
    idx, lo, hi = (m[c].to_numpy() for c in ("index", "ep_from_index", "ep_to_index"))
    assert ((lo <= idx) & (idx < hi)).all()


@pytest.mark.parametrize("name", ALL)
def test_both_resolvers_give_one_schema_and_metadata(name):
    db = lsql.connect(data_root(name))
    sql = "SELECT episode_index, episode_index * 10 AS tens FROM episodes WHERE episode_index % 2 = 0 " \
          "ORDER BY episode_index DESC"
    fast, slow = _both(db, sql)
    assert fast.schema.equals(slow.schema, check_metadata=True), name
    assert _meta(fast) == _meta(slow)
    _check_contract(fast, db, "episode", ["tens"], sql)
    assert fast.equals(slow)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_result_shape_gives_the_documented_columns(name):
    db = lsql.connect(data_root(name))
    shapes = {
        "index": ("SELECT index, 1.5 AS w FROM frames WHERE index % 7 = 0 ORDER BY index", ["w"]),
        "window": ("SELECT episode_index, 0.2 AS start_s, 0.6 AS end_s, 'x' || episode_index AS tag FROM episodes "
                   "ORDER BY episode_index", ["tag"]),
        "episode": ("SELECT episode_index FROM episodes WHERE episode_index IN (1, 3) ORDER BY episode_index", []),
    }
    for mode, (sql, extras) in shapes.items():
        m = db.manifest(sql)
        _check_contract(m, db, mode, extras, sql)
        if mode == "index":
            assert m["index"].to_pylist() == list(range(0, db.layout.info["total_frames"], 7))
        if mode == "window":  # [0.2, 0.6) s of every episode: the frames on that grid
            n = sum(1 for f in range(100) if 0.2 - 1e-4 <= f / db.layout.fps < 0.6 - 1e-4)
            assert m.num_rows == n * db.layout.info["total_episodes"]


@pytest.mark.parametrize("name", SHIPPED)
def test_episodes_argument_gives_the_manifest_of_its_sql(name):
    db = lsql.connect(data_root(name))
    sql = "SELECT episode_index FROM episodes WHERE episode_index IN (0, 2) ORDER BY episode_index"
    by_arg = db.dataset(episodes=[2, 0], cameras=[]).manifest
    by_sql = db.manifest(sql)
    assert by_arg.select(by_sql.column_names).equals(by_sql.select(by_sql.column_names))
    assert _meta(db._episodes_manifest([2, 0])) == _meta(by_sql)  # the same sql text, too


@pytest.mark.parametrize("name", SHIPPED)
def test_export_manifest_round_trips_through_dataset(name, tmp_path):
    db = lsql.connect(data_root(name))
    sql = "SELECT index, index % 3 AS fold FROM frames WHERE episode_index IN (1, 2) AND frame_index % 4 = 1 " \
          "ORDER BY index DESC"
    m = db.manifest(sql)
    path = tmp_path / "m.parquet"
    report = db.export_manifest(sql, path)
    assert report.rows == m.num_rows and report.episodes == 2
    ds_file, ds_sql = db.dataset(path), db.dataset(sql)
    saved = ds_file.manifest
    keys = db.layout.video_keys
    # the file: the manifest's columns, then each camera's time in its mp4; the metadata gains the root and the
    # source's identity
    assert saved.column_names == m.column_names + [f"{k}/time_s" for k in keys]
    assert saved.select(m.column_names).equals(m)
    assert ds_sql.manifest.select(m.column_names).equals(m)
    meta = _meta(saved)
    assert meta.pop("root") == db.source.url
    from lerobot_sql.export import dataset_identity

    assert meta.pop("dataset_id") == dataset_identity(db.layout)  # what db.dataset(manifest) compares
    assert meta == _meta(m)
    for k in keys:
        t = saved[f"{k}/from_timestamp"].to_numpy() + saved["timestamp"].to_numpy().astype(np.float64)
        assert np.array_equal(saved[f"{k}/time_s"].to_numpy(), t)
    assert len(ds_file) == len(ds_sql) == m.num_rows
    for i in (0, len(ds_sql) // 2, len(ds_sql) - 1):
        a, b = ds_file[i], ds_sql[i]
        assert a.keys() == b.keys() and a["task"] == b["task"]
        assert int(a["fold"]) == int(a["index"]) % 3
        for key in a:
            if key != "task":
                assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), (name, i, key)


def test_export_resolves_its_sql_through_db_manifest(datasets, tmp_path, monkeypatch):
    """export() takes the same road as dataset(): the manifest row cap holds for it too (it used to build its own
    manifest past the cap), and adjacent windows of one episode stay two output episodes (cut by result_row)."""
    db = lsql.connect(datasets / "small20")
    monkeypatch.setenv("LSQL_MAX_MANIFEST_ROWS", "50")
    with pytest.raises(lsql.ResultContractError, match="more than 50 rows"):
        db.export("SELECT index FROM frames WHERE episode_index = 0", tmp_path / "capped", progress=False)
    assert not (tmp_path / "capped").exists()
    monkeypatch.delenv("LSQL_MAX_MANIFEST_ROWS")
    sql = "SELECT 2 AS episode_index, 0.0 AS start_s, 0.5 AS end_s UNION ALL SELECT 2, 0.5, 1.0 ORDER BY start_s"
    m = db.manifest(sql)
    assert sorted(set(m["result_row"].to_pylist())) == [0, 1]
    report = db.export(sql, tmp_path / "two", progress=False)
    n0 = int((m["result_row"].to_numpy() == 0).sum())
    assert report.episodes == 2 and report.frames == m.num_rows
    out = lsql.connect(tmp_path / "two")
    assert out.sql("SELECT length FROM episodes ORDER BY episode_index").fetchall() == [(n0,), (m.num_rows - n0,)]


DATA = "data/chunk-000/file-000.parquet"


def _reordered_copy(datasets, tmp_path, how: str):
    """small20 with the rows of its data file reordered (each row keeps its own index, frame_index, timestamp):
    ``swap`` two adjacent rows of episode 3 (its frames 10 and 11), ``episode`` every episode's rows shuffled in
    place, ``all`` every row of the file shuffled."""
    import shutil

    import pyarrow.parquet as pq

    root = tmp_path / how
    shutil.copytree(datasets / "small20", root)
    t = pq.read_table(root / DATA)
    ep = t["episode_index"].to_numpy()
    perm = np.arange(t.num_rows)
    rng = np.random.default_rng(0)
    if how == "swap":
        j = int(np.flatnonzero(ep == 3)[10])
        perm[j], perm[j + 1] = perm[j + 1], perm[j]
    elif how == "episode":
        for e in np.unique(ep):
            r = np.flatnonzero(ep == e)
            perm[r] = rng.permutation(r)
    else:
        perm = rng.permutation(t.num_rows)
    pq.write_table(t.take(pa.array(perm)).replace_schema_metadata(t.schema.metadata), root / DATA)
    return root


@pytest.mark.parametrize("how", ["swap", "episode", "all"])
def test_rows_out_of_index_order_are_refused_naming_file_row_and_index(datasets, tmp_path, how):
    """Rows of an episode out of `index` order in its data file: neighbours are read by position, so frame 10's
    delta_timestamps stack of action[:, 0] was [39.529, 39.346, 39.696] (source [39.147, 39.346, 39.529]), and an
    export of the episode wrote 390 one-frame episodes. Now every road to a manifest over episode 3 refuses it,
    naming the episode, the file, the first misplaced row and the index it should hold; the intact episodes of the
    swapped copy still give the source's items, stacks included."""
    root = _reordered_copy(datasets, tmp_path, how)
    db = lsql.connect(root)
    lo = db.sql("SELECT dataset_from_index FROM episodes WHERE episode_index = 3").fetchall()[0][0]
    first = {"swap": rf"row {lo + 10} holds index {lo + 11}, where rows in `index` order would hold index {lo + 10}",
             "episode": r"row \d+ holds index \d+, where", "all": r"row \d+ holds index \d+, where"}[how]
    want = rf"episode 3: its 390 frames \(index {lo}\.\.{lo + 389}\) .* in `index` order in {DATA}: {first}.*sort"
    delta = {"action": [-1 / 30, 0, 1 / 30]}
    for kw in (dict(episodes=[3], delta_timestamps=delta), dict(episodes=[3], cameras=[])):
        with pytest.raises(lsql.DatasetFormatError, match=want):
            db.dataset(**kw)
    for sql in ("SELECT index FROM frames WHERE episode_index = 3",
                "SELECT episode_index, 0.0 AS start_s, 1.0 AS end_s FROM episodes WHERE episode_index = 3"):
        with pytest.raises(lsql.DatasetFormatError, match=want):
            db.dataset(sql, cameras=[])
    with pytest.raises(lsql.DatasetFormatError, match=want):
        db.export("SELECT episode_index FROM episodes WHERE episode_index = 3", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    if how == "swap":  # the other episodes' rows are in order: exact, neighbours included
        from helpers import assert_items_equal

        got = db.dataset(episodes=[2, 4], delta_timestamps=delta)
        ref = lsql.connect(datasets / "small20").dataset(episodes=[2, 4], delta_timestamps=delta)
        assert len(got) == len(ref) == db.sql("SELECT sum(length) FROM episodes WHERE episode_index IN (2, 4)"
                                              ).fetchall()[0][0]
        for i in (0, 10, len(ref) - 1):
            assert_items_equal(got[i], ref[i])


_MODE_SQL = {"index": "SELECT index, {e} AS d FROM frames WHERE index < 3",
             "window": "SELECT episode_index, 0.0 AS start_s, 0.1 AS end_s, {e} AS d FROM episodes WHERE episode_index < 2",
             "episode": "SELECT episode_index, {e} AS d FROM episodes WHERE episode_index < 2"}


@pytest.mark.parametrize("mode", sorted(_MODE_SQL))
@pytest.mark.parametrize("expr, what", [
    ("DATE '2020-01-01'", r"DATE values \(Arrow date32\[day\]\).*`epoch\(\"d\"\)`"),
    ("TIMESTAMP '2020-01-01 10:00'", r"TIMESTAMP values"),
    ("INTERVAL 1 DAY", r"INTERVAL values"),
    ("{'a': 1}", r"STRUCT values \(Arrow struct<a: int32>\)"),
    ("MAP {'a': 1}", r"MAP values"),
    ("'x'::BLOB", r"BLOB/BIT values \(Arrow binary\).*`CAST\(\"d\" AS VARCHAR\)`"),
    ("[[1, 2], [3, 4]]", r"lists of lists.*`flatten\(\"d\"\)`"),
    ("[DATE '2020-01-01']", r"lists of DATE.*`CAST\(\"d\" AS VARCHAR\[\]\)`"),
    ("170141183460469231731687303715884105727::HUGEINT", r"\(HUGEINT\) holds values beyond int64"),
])
def test_extra_columns_of_types_items_cannot_carry_are_refused(datasets, mode, expr, what):
    """Before: a DATE reached items as datetime.date (torch's default_collate failed on it in the DataLoader), a
    STRUCT as a dict, a BLOB as bytes, and a HUGEINT was rounded to float64 without a word."""
    db = lsql.connect(datasets / "small20")
    with pytest.raises(lsql.ResultContractError, match=r"result column 'd' .*" + what):
        db.dataset(_MODE_SQL[mode].format(e=expr), cameras=[])


@pytest.mark.parametrize("sql", [
    "SELECT index, CASE WHEN index = 1 THEN NULL ELSE [1.0, 2.0] END AS d FROM frames WHERE index < 3",
    "SELECT episode_index, 0.0 AS start_s, 0.1 AS end_s, CASE WHEN episode_index = 1 THEN NULL ELSE ['a'] END AS d "
    "FROM episodes WHERE episode_index < 2",
    "SELECT episode_index, CASE WHEN episode_index = 1 THEN NULL ELSE [1, 2] END AS d FROM episodes "
    "WHERE episode_index < 2",
])
def test_a_list_extra_holding_null_is_refused_naming_the_column(datasets, sql):
    """`SELECT * FROM frames_ext` brings "observation.state.delta", NULL on each episode's first frame: the item
    held None and torch's default_collate failed in the DataLoader ("found <class 'NoneType'>"), far from the
    query (a NULL number becomes NaN; a list has no such value)."""
    db = lsql.connect(datasets / "small20")
    with pytest.raises(lsql.ResultContractError, match=r"result column 'd' is NULL in 1 row\(s\) \(e\.g\. row \d+\) "
                                                      r"where other rows hold lists.*coalesce.*IS NOT NULL"):
        db.dataset(sql, cameras=[])
    with pytest.raises(lsql.ResultContractError, match=r"'observation\.state\.delta' is NULL in 1 row\(s\)"):
        db.dataset("SELECT * FROM frames_ext WHERE episode_index = 1 AND frame_index < 3", cameras=[])
    ds = db.dataset("SELECT * FROM frames_ext WHERE episode_index = 1 AND frame_index BETWEEN 1 AND 3", cameras=[])
    assert ds[0]["observation.state.delta"].shape == (6,)


@pytest.mark.parametrize("mode", sorted(_MODE_SQL))
def test_a_hugeint_extra_is_an_exact_int64(datasets, mode):
    """DuckDB's sum() of integers is a HUGEINT (Arrow decimal128(38, 0)): as float64, 2**53 + 1 became 2**53."""
    import torch

    db = lsql.connect(datasets / "small20")
    big = 2 ** 53 + 1
    ds = db.dataset(_MODE_SQL[mode].format(e=f"{big}::HUGEINT"), cameras=[])
    assert ds[0]["d"].dtype == torch.int64 and int(ds[0]["d"]) == big
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=2)))
    assert batch["d"].tolist() == [big, big]
    # the common case: a per-episode sum over frames, exact and equal to meta/episodes' length
    ds = db.dataset("SELECT episode_index, sum(1::BIGINT) AS n FROM frames WHERE episode_index < 3 GROUP BY 1",
                    cameras=[])
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    assert {int(ds[i]["episode_index"]): int(ds[i]["n"]) for i in range(len(ds))} == {e: lengths[e] for e in range(3)}


@pytest.mark.parametrize("how", ["dataset()", "episodes=", "episode query", "window query", "open window query",
                                 "index query", "collection", "collection of two"])
def test_manifest_cap_counts_samples_not_rows(datasets, monkeypatch, how):
    """LSQL_MAX_MANIFEST_ROWS bounds the samples of every result mode, before the manifest is built. Before, it bounded
    result rows only: with 10, db.dataset() built all 4,762 samples of small20, and with 100 the 20 episode rows
    of `SELECT episode_index FROM episodes` (4,762 samples) passed. Over a collection it bounds the whole manifest:
    it was checked per dataset, so two datasets built twice the bound."""
    db = lsql.connect(datasets / "small20")
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    total = db.layout.info["total_frames"]
    h264_total = lsql.connect(datasets / "h264_20").layout.info["total_frames"]
    build, n = {
        "dataset()": (lambda: db.dataset(cameras=[]), total),
        "episodes=": (lambda: db.dataset(episodes=[3, 1], cameras=[]), lengths[1] + lengths[3]),
        "episode query": (lambda: db.dataset("SELECT episode_index FROM episodes", cameras=[]), total),
        # frames 15..44 of each episode: 30 each
        "window query": (lambda: db.dataset("SELECT episode_index, 0.5 AS start_s, 1.5 AS end_s FROM episodes",
                                            cameras=[]), 30 * len(lengths)),
        "open window query": (lambda: db.dataset("SELECT episode_index, 1.0 AS start_s, 'inf'::DOUBLE AS end_s "
                                                 "FROM episodes", cameras=[]), total - 30 * len(lengths)),
        "index query": (lambda: db.dataset("SELECT index FROM frames WHERE index % 2 = 0", cameras=[]),
                        (total + 1) // 2),
        "collection": (lambda: lsql.connect_many({"a": datasets / "small20"}).dataset(
            "SELECT dataset, episode_index FROM episodes", cameras=[]), total),
        "collection of two": (lambda: lsql.connect_many({"a": datasets / "small20", "b": datasets / "h264_20"}).dataset(
            "SELECT dataset, episode_index FROM episodes", cameras=[]), total + h264_total),
    }[how]
    monkeypatch.setenv("LSQL_MAX_MANIFEST_ROWS", str(n))
    assert len(build()) == n
    monkeypatch.setenv("LSQL_MAX_MANIFEST_ROWS", str(n - 1))
    with pytest.raises(lsql.ResultContractError, match=rf"more than {n - 1:,}|more than the {n - 1:,}"):
        build()
    monkeypatch.setenv("LSQL_MAX_MANIFEST_ROWS", "10")
    with pytest.raises(lsql.ResultContractError, match="more than"):
        build()


@pytest.mark.parametrize("how", ["table", "path", "stats"])
def test_a_table_that_is_no_manifest_is_refused_naming_its_missing_columns(datasets, tmp_path, how):
    """A query result (or any other Parquet file) passed where a manifest goes met a bare KeyError 'data_file'
    (found by a new user)."""
    import pyarrow.parquet as pq

    db = lsql.connect(datasets / "small20")
    t = db.sql("SELECT episode_index, length FROM episodes").arrow()
    pq.write_table(t, tmp_path / "episodes.parquet")
    arg = tmp_path / "episodes.parquet" if how == "path" else t
    with pytest.raises(lsql.ResultContractError, match=r"is not a manifest: it lacks the columns \['index', "
                                                        r"'frame_index'.*'data_file'.*episodes=") as e:
        db.stats(arg) if how == "stats" else db.dataset(arg)
    if how == "path":
        assert str(tmp_path / "episodes.parquet") in str(e.value)
    # a real manifest, saved and read back, still loads: the check refuses only what lacks the columns
    db.export_manifest("SELECT episode_index FROM episodes WHERE episode_index = 2", tmp_path / "m.parquet")
    assert len(db.dataset(tmp_path / "m.parquet")) == db.sql(
        "SELECT length FROM episodes WHERE episode_index = 2").fetchall()[0][0]
