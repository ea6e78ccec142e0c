"""Third-party and converted variants of the v3.0 layout give the same views and items as the original.

Each test rewrites one aspect of a copy of small20 the way some writer does, then compares with small20 itself.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql

EPISODES = "meta/episodes/chunk-000/file-000.parquet"
DATA = "data/chunk-000/file-000.parquet"
TASKS = "meta/tasks.parquet"
PICKS = [0, 1, 347, 348, 349, 1000, 2500, 4761]
DELTA = {"observation.state": [-2 / 30, -1 / 30, 0.0], "action": [i / 30 for i in range(5)],
         "observation.images.front": [-1 / 30, 0.0]}


@pytest.fixture(scope="module")
def original(datasets):
    return lsql.connect(datasets / "small20")


@pytest.fixture()
def copy(datasets, tmp_path):
    dst = tmp_path / "small20_variant"
    shutil.copytree(datasets / "small20", dst)
    return dst


def _connect_quiet(root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lsql.connect(root)


def _assert_items_equal(a_db, b_db, *, delta=None, picks=PICKS):
    q = "SELECT index FROM frames ORDER BY index"
    a = a_db.dataset(q, delta_timestamps=delta, return_uint8=True)
    b = b_db.dataset(q, delta_timestamps=delta, return_uint8=True)
    assert len(a) == len(b)
    for i in picks:
        x, y = a[i], b[i]
        assert set(x) == set(y), i
        for k in y:
            if isinstance(y[k], torch.Tensor):
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), (i, k)
            else:
                assert x[k] == y[k], (i, k)


def test_list_vectors_pandas_metadata_reordered_columns(copy, original):
    """A data file rewritten through pandas: list<float> instead of fixed_size_list, pandas schema metadata, columns
    in another order, several row groups not aligned with episodes."""
    t = pq.read_table(copy / DATA)
    df = t.select(list(reversed(t.column_names))).to_pandas()
    df.to_parquet(copy / DATA, index=False, row_group_size=1000)
    written = pq.read_schema(copy / DATA)
    assert pa.types.is_list(written.field("action").type) and b"pandas" in written.metadata
    assert written.names[0] == "task_index"
    db = lsql.connect(copy)
    types = {r[0]: r[1] for r in db.con.sql("DESCRIBE frames").fetchall()}
    assert types["action"] == "FLOAT[6]" and types["observation.state"] == "FLOAT[6]"
    cols = 'index, episode_index, frame_index, timestamp, task_index, "observation.state", action'
    assert db.sql(f"SELECT {cols} FROM frames ORDER BY index").fetchall() == \
        original.sql(f"SELECT {cols} FROM frames ORDER BY index").fetchall()
    _assert_items_equal(db, original)
    _assert_items_equal(db, original, delta=DELTA)


def test_episodes_without_quantiles_in_another_order(copy, original):
    """meta/episodes as the v2.1 converter writes it: no q01..q99 stats, columns in another order."""
    t = pq.read_table(copy / EPISODES)
    keep = [c for c in t.column_names if not any(c.endswith(f"/{q}") for q in ("q01", "q10", "q50", "q90", "q99"))]
    pq.write_table(t.select(list(reversed(keep))), copy / EPISODES)
    db = lsql.connect(copy)
    stats = {s for (s,) in db.sql("SELECT DISTINCT stat FROM episode_stats").fetchall()}
    assert stats == {"min", "max", "mean", "std", "count"}
    q = ('SELECT episode_index, tasks, length, dataset_from_index, "videos/observation.images.wrist/from_timestamp" '
         "FROM episodes ORDER BY episode_index")
    assert db.sql(q).fetchall() == original.sql(q).fetchall()
    q = "SELECT * FROM episode_stats WHERE stat = 'mean' ORDER BY episode_index, feature"
    assert db.sql(q).fetchall() == original.sql(q).fetchall()
    _assert_items_equal(db, original, picks=[0, 349, 4761])


def _tasks_variant(kind: str, orig: pa.Table) -> pa.Table:
    text = orig["__index_level_0__"].cast(pa.string())
    idx = orig["task_index"]
    if kind == "named_task_column":  # lerobot 0.6.2
        return pa.table({"task_index": idx, "task": text})
    if kind == "no_pandas_metadata":
        return pa.table({"task_index": idx, "__index_level_0__": orig["__index_level_0__"]})
    if kind == "other_text_name":
        return pa.table({"description": text, "task_index": idx})
    if kind == "pandas_named_index":
        return pa.Table.from_pandas(pa.table({"task_index": idx, "instruction": text}).to_pandas()
                                    .set_index("instruction"))
    if kind == "positional":  # no task_index: lerobot resolves it by row number
        return pa.table({"task": text})
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["named_task_column", "no_pandas_metadata", "other_text_name",
                                  "pandas_named_index", "positional"])
def test_tasks_table_variants(copy, original, kind):
    orig = pq.read_table(copy / TASKS)
    assert pa.types.is_large_string(orig.schema.field("__index_level_0__").type)  # pandas 3 wrote the original
    pq.write_table(_tasks_variant(kind, orig), copy / TASKS)
    db = lsql.connect(copy)
    assert db.tasks() == original.tasks() == dict(zip(orig["task_index"].to_pylist(),
                                                      orig["__index_level_0__"].to_pylist()))
    ds = db.dataset("SELECT index FROM frames WHERE index IN (0, 400, 4000) ORDER BY index", cameras=[])
    want = original.dataset("SELECT index FROM frames WHERE index IN (0, 400, 4000) ORDER BY index", cameras=[])
    assert [ds[i]["task"] for i in range(3)] == [want[i]["task"] for i in range(3)]


def test_ambiguous_tasks_table_is_refused(copy):
    pq.write_table(pa.table({"a": ["x"], "b": ["y"], "n": [0], "m": [1]}), copy / TASKS)
    with pytest.raises(lsql.DatasetFormatError, match="tasks.parquet"):
        lsql.connect(copy).tasks()
    with pytest.raises(lsql.DatasetFormatError, match="tasks.parquet"):
        lsql.connect(copy).sql("SELECT * FROM tasks")


def test_info_json_unknown_absent_keys_and_float_fps(copy, original):
    info = json.loads((copy / "meta/info.json").read_text())
    for k in ("total_episodes", "total_frames", "total_tasks", "chunks_size", "data_path", "video_path", "splits",
              "data_files_size_in_mb", "video_files_size_in_mb", "robot_type"):
        info.pop(k)
    info["fps"] = 30.0
    info["total_chunks"] = 1  # a v2.x leftover
    info["my_writer"] = {"version": "9.9"}
    for f in info["features"].values():
        f.pop("names", None)
        if f["dtype"] != "video":
            f["fps"] = 30  # the converter adds this
    (copy / "meta/info.json").write_text(json.dumps(info))
    db = lsql.connect(copy)
    assert db.sql("SELECT fps, total_episodes, data_path FROM info").fetchall() == \
        [(30.0, None, "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet")]
    _assert_items_equal(db, original, picks=[0, 348, 4761])
    _assert_items_equal(db, original, delta=DELTA, picks=[0, 348, 4761])


def test_video_folder_differs_from_template(copy, original):
    """Third-party writers put the mp4s in video/ while video_path says videos/: found, with a warning."""
    (copy / "videos").rename(copy / "video")
    with pytest.warns(UserWarning, match="video_path"):
        db = lsql.connect(copy)
    paths = {p for (p,) in db.sql("SELECT DISTINCT path FROM videos").fetchall()}
    assert paths == {f"video/observation.images.{k}/chunk-000/file-000.mp4" for k in ("front", "wrist")}
    assert all((copy / p).is_file() for p in paths)
    _assert_items_equal(db, original, picks=[0, 2500, 4761])


def test_missing_video_folder_is_not_guessed(copy):
    """Two candidate folders: no guess, the template is kept and the missing files are reported when read."""
    (copy / "videos").rename(copy / "video")
    shutil.copytree(copy / "video", copy / "clips")
    db = _connect_quiet(copy)
    assert db.layout.video_path == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    with pytest.warns(UserWarning, match="missing"):
        ds = db.dataset("SELECT index FROM frames WHERE index = 0")
    with pytest.raises(lsql.MissingFileError, match="videos/observation.images"):
        ds[0]
