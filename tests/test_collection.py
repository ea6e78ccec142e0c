"""SQL across many datasets (lerobot_sql.collection, _catalog/union): the views span every dataset with a
``dataset`` column, counts are the sums of each dataset's own, identity is (dataset, episode_index) /
(dataset, index), and a query's result becomes one manifest resolved by each dataset alone."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import renamed_copy, shortened_vector_copy

SETS = ["small20", "multifile60", "h264_20", "v21_small20"]


@pytest.fixture(scope="module")
def coll(datasets):
    c = lsql.connect_many([datasets / n for n in SETS])
    yield c
    c.close()


def test_names_and_datasets_view_follow_info_json(coll, datasets):
    assert coll.names == SETS
    rows = coll.sql("SELECT dataset, root, codebase_version, fps, total_episodes, total_frames, camera_keys "
                    "FROM datasets ORDER BY dataset").fetchall()
    assert [r[0] for r in rows] == sorted(SETS)
    for name, root, version, fps, n_ep, n_fr, cams in rows:
        info = json.loads((datasets / name / "meta/info.json").read_text())
        assert root == str(datasets / name)
        assert version == info["codebase_version"] and fps == info["fps"]
        assert (n_ep, n_fr) == (info["total_episodes"], info["total_frames"])
        assert cams == [k for k, f in info["features"].items() if f["dtype"] in ("video", "image")]


@pytest.mark.parametrize("view", ["episodes", "frames", "tasks", "episode_stats", "videos", "features",
                                  "video_frames", "camera_frames", "frames_ext", "info"])
def test_counts_are_the_sums_of_each_datasets_own(coll, view, datasets):
    got = dict(coll.sql(f"SELECT dataset, count(*) FROM {view} GROUP BY dataset").fetchall())
    for name in SETS:
        own = lsql.connect(datasets / name).sql(f"SELECT count(*) FROM {view}").fetchall()[0][0]
        assert got.get(name, 0) == own, (view, name)
    if view in ("episodes", "frames"):
        key = {"episodes": "total_episodes", "frames": "total_frames"}[view]
        for name in SETS:
            assert got[name] == json.loads((datasets / name / "meta/info.json").read_text())[key]


def test_a_datasets_rows_are_its_own_view(coll, datasets):
    own = lsql.connect(datasets / "multifile60").sql(
        "SELECT episode_index, length, tasks FROM episodes ORDER BY episode_index").fetchall()
    got = coll.sql("SELECT episode_index, length, tasks FROM episodes WHERE dataset = 'multifile60' "
                   "ORDER BY episode_index").fetchall()
    assert got == own and len(got) == 60


def test_table_macros_are_keyed_by_dataset(coll, datasets):
    pred = '"observation.state"[1] > 0'
    got = coll.sql(f"SELECT * FROM segments({pred}, 0.2) ORDER BY dataset, episode_index, start_s").fetchall()
    for name in SETS:
        own = lsql.connect(datasets / name).sql(
            f"SELECT * FROM segments({pred}, 0.2) ORDER BY episode_index, start_s").fetchall()
        assert [r[1:] for r in got if r[0] == name] == own, name
        assert own, name
    ev = coll.sql(f"SELECT dataset, count(*) FROM event_windows({pred}, 0.1, 0.2) GROUP BY 1").fetchall()
    assert {n for n, _ in ev} <= set(SETS) and sum(c for _, c in ev) > 0


def test_user_sql_cannot_reach_a_datasets_schema(coll):
    with pytest.raises(lsql.QueryError):
        coll.sql("SELECT * FROM _lsql_src_0.frames")
    with pytest.raises(lsql.QueryError):
        coll.sql("CREATE VIEW x AS SELECT 1")


def test_manifest_needs_the_dataset_column_and_known_names(coll):
    with pytest.raises(lsql.ResultContractError, match="dataset column"):
        coll.manifest("SELECT episode_index FROM episodes")
    with pytest.raises(lsql.ResultContractError, match="small2O|not the name"):
        coll.manifest("SELECT 'small2O' AS dataset, 0 AS episode_index")
    with pytest.raises(lsql.ResultContractError, match="NULL"):
        coll.manifest("SELECT NULL::VARCHAR AS dataset, 0 AS episode_index")
    with pytest.raises(lsql.ResultContractError, match="'h264_20'"):
        coll.manifest("SELECT 'h264_20' AS dataset, 99999 AS index")  # its frames end at 4306: named


def test_manifest_rows_follow_the_order_and_result_rows(coll):
    sql = ("SELECT dataset, index FROM frames WHERE frame_index = 5 AND episode_index < 3 "
           "ORDER BY episode_index DESC, dataset")
    expect = coll.sql(sql).fetchall()
    m = coll.manifest(sql)
    assert list(zip(m["dataset"].cast(pa.string()).to_pylist(), m["index"].to_pylist())) == expect
    assert m["result_row"].to_pylist() == list(range(len(expect)))
    # Without ORDER BY: datasets in the collection's order, each in its own deterministic order.
    m2 = coll.manifest("SELECT dataset, index FROM frames WHERE frame_index = 5 AND episode_index < 3")
    names = m2["dataset"].cast(pa.string()).to_pylist()
    assert names == sorted(names, key=SETS.index) and len(names) == len(expect)


def test_window_results_per_dataset(coll, datasets):
    sql = "SELECT dataset, episode_index, 0.5 AS start_s, 1.0 AS end_s FROM episodes WHERE episode_index IN (1, 4)"
    m = coll.manifest(sql)
    fps = {n: json.loads((datasets / n / "meta/info.json").read_text())["fps"] for n in SETS}
    counts = {}
    for n in m["dataset"].cast(pa.string()).to_pylist():
        counts[n] = counts.get(n, 0) + 1
    assert counts == {n: 2 * int(0.5 * fps[n]) for n in SETS}


def test_vectors_of_different_lengths_are_lists_in_sql(tmp_path, datasets):
    short = shortened_vector_copy(datasets / "small20", tmp_path / "short_state", "observation.state", 3)
    c = lsql.connect_many([datasets / "small20", short])
    r = c.sql('SELECT dataset, len("observation.state") AS n FROM frames WHERE index = 7 ORDER BY dataset')
    assert r.fetchall() == [("short_state", 3), ("small20", 6)]
    first = pq.read_table(next(iter(sorted(short.glob("data/*/*.parquet")))))["observation.state"][0].as_py()
    got = c.sql("SELECT \"observation.state\" FROM frames WHERE dataset = 'short_state' AND index = 0").fetchall()
    np.testing.assert_array_equal(np.float32(got[0][0]), np.float32(first))


def test_hostile_dataset_names_stay_values(datasets):
    evil = ["x'); DROP VIEW frames; --", 'q"uote\\ \n ü']
    c = lsql.connect_many([datasets / "small20", datasets / "h264_20"], names=evil)
    got = dict(c.sql("SELECT dataset, count(*) FROM episodes GROUP BY 1").fetchall())
    assert got == {evil[0]: 20, evil[1]: 20}
    assert c.sql("SELECT count(*) FROM frames").fetchall()[0][0] == 4762 + 4307


def test_sources_from_a_folder_a_glob_and_a_dict(tmp_path, datasets):
    for n in ("small20", "h264_20"):
        shutil.copytree(datasets / n, tmp_path / "lab" / n)
    (tmp_path / "lab" / "notes").mkdir()
    assert lsql.connect_many(tmp_path / "lab").names == ["h264_20", "small20"]
    assert lsql.connect_many(str(tmp_path / "lab" / "s*")).names == ["small20"]
    c = lsql.connect_many({"a": datasets / "small20", "b": datasets / "h264_20"})
    assert c.names == ["a", "b"] and c["a"].layout.info["total_frames"] == 4762
    with pytest.raises(KeyError, match="Did you mean .a."):
        c["aa"]
    with pytest.raises(lsql.MissingFileError, match="notes"):
        lsql.connect_many([tmp_path / "lab" / "notes"])
    with pytest.raises(ValueError, match="unique"):
        lsql.connect_many([datasets / "small20", datasets / "h264_20"], names=["a", "a"])


def test_default_names_are_unique(tmp_path, datasets):
    for site in ("site_a", "site_b"):
        shutil.copytree(datasets / "small20", tmp_path / site / "small20")
    c = lsql.connect_many([tmp_path / "site_a" / "small20", tmp_path / "site_b" / "small20"])
    assert c.names == ["site_a_small20", "site_b_small20"]


def test_renamed_cameras_line_up_in_sql(tmp_path, datasets):
    top = renamed_copy(datasets / "small20", tmp_path / "top20", {"observation.images.front": "observation.images.top"})
    c = lsql.connect_many([datasets / "small20", top])
    rows = c.sql("SELECT dataset, video_key, count(*) FROM videos GROUP BY ALL ORDER BY ALL").fetchall()
    assert rows == [("small20", "observation.images.front", 20), ("small20", "observation.images.wrist", 20),
                    ("top20", "observation.images.top", 20), ("top20", "observation.images.wrist", 20)]


def test_remote_and_local_datasets_in_one_collection(datasets, tmp_path, monkeypatch):
    """Two datasets over HTTP and one local: DuckDB routes each remote path to its own dataset's cache (one
    filesystem protocol per remote dataset), and items equal the local copies'."""
    from helpers import assert_items_equal
    from http_range_server import RangeServer

    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    with RangeServer(datasets) as srv:
        c = lsql.connect_many([f"{srv.url}/small20", f"{srv.url}/h264_20", datasets / "multifile60"])
        assert dict(c.sql("SELECT dataset, count(*) FROM frames GROUP BY 1").fetchall()) == \
            {"small20": 4762, "h264_20": 4307, "multifile60": 13024}
        sql = "SELECT dataset, index FROM frames WHERE frame_index = 3 AND episode_index < 2 ORDER BY dataset, index"
        ds = c.dataset(sql)
        assert len(ds) == 6
        for i in range(len(ds)):
            item = ds[i]
            own = lsql.connect(datasets / item["dataset"]).dataset(f"SELECT {int(item['index'])} AS index")
            assert_items_equal({k: v for k, v in item.items() if k not in ("dataset", "dataset_index")}, own[0])
        assert c["small20"].io_stats()["bytes_fetched"] > 0 and c["h264_20"].io_stats()["bytes_fetched"] > 0


def test_stats_across_datasets_equal_numpy_over_the_selected_rows(coll, datasets):
    sql = "SELECT dataset, index FROM frames WHERE frame_index % 5 = 0 AND episode_index < 7"
    got = coll.stats(sql)
    rows = {"observation.state": [], "action": []}
    for name in SETS:
        t = lsql.connect(datasets / name).sql(
            'SELECT "observation.state", action FROM frames WHERE frame_index % 5 = 0 AND episode_index < 7').arrow()
        rows["observation.state"].append(np.array(t["observation.state"].to_pylist(), np.float64))
        rows["action"].append(np.array(t["action"].to_pylist(), np.float64))
    for k, parts in rows.items():
        x = np.concatenate(parts)
        assert got[k]["count"].tolist() == [len(x)]
        np.testing.assert_allclose(got[k]["mean"], x.mean(0), rtol=1e-9)
        np.testing.assert_allclose(got[k]["std"], x.std(0), rtol=1e-7)
        np.testing.assert_array_equal(np.float32(got[k]["min"]), np.float32(x.min(0)))
        np.testing.assert_array_equal(np.float32(got[k]["max"]), np.float32(x.max(0)))
    per = coll.stats(sql, per_dataset=True)
    assert set(per) == set(SETS)
    own = lsql.connect(datasets / "h264_20").stats("SELECT index FROM frames WHERE frame_index % 5 = 0 AND "
                                                    "episode_index < 7")
    for k in own:  # the same numbers (DuckDB's parallel sums may differ in the last bit between runs)
        for st in own[k]:
            np.testing.assert_allclose(per["h264_20"][k][st], own[k][st], rtol=1e-12)
    cams = got["observation.images.front"]
    assert cams["mean"].shape == (3, 1, 1) and cams["count"][0] > 0


def test_a_feature_named_dataset_is_refused_naming_the_dataset(tmp_path, datasets):
    odd = renamed_copy(datasets / "small20", tmp_path / "odd", {"action": "Dataset"})
    c = lsql.connect_many([datasets / "h264_20", odd])
    with pytest.raises(lsql.DatasetFormatError, match=r"dataset 'odd'.*'Dataset'.*rename"):
        c.sql("SELECT count(*) FROM frames")


def test_a_collection_manifest_is_read_only_by_its_own_collection(coll, datasets, tmp_path):
    sql = "SELECT dataset, index FROM frames WHERE frame_index = 2 AND episode_index < 2"
    m = coll.manifest(sql)
    with pytest.raises(lsql.ResultContractError, match="collection"):
        coll["small20"].dataset(m)  # its index values are four datasets' frames
    path = tmp_path / "m.parquet"
    pq.write_table(m, path)
    ds = coll.dataset(path)
    ref = coll.dataset(sql)
    assert len(ds) == len(ref) == 8
    assert [ds[i]["index"] for i in range(8)] == [ref[i]["index"] for i in range(8)]
    other = lsql.connect_many([datasets / n for n in reversed(SETS)])
    with pytest.raises(lsql.ResultContractError, match="same datasets"):
        other.dataset(m)
    with pytest.raises(lsql.ResultContractError, match="same datasets"):
        other.stats(m)  # before the review: computed over the other collection's frames
    with pytest.raises(lsql.ResultContractError, match="same datasets"):
        other.export(path, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_a_collection_manifest_without_its_location_columns_is_named_not_a_key_error(coll):
    """m.select([...]) keeps the collection metadata and drops where each frame is: a KeyError ('Field
    "episode_index" does not exist') deep in the reader before; now the table is named with what it lacks."""
    m = coll.manifest("SELECT dataset, index FROM frames WHERE frame_index = 2 AND episode_index < 2")
    for use in (coll.dataset, coll.stats):
        with pytest.raises(lsql.ResultContractError, match=r"not a manifest.*'episode_index'.*'data_file'"):
            use(m.select(["dataset", "index"]))


def test_real_datasets_in_one_collection():
    """Second tier: the real G1 set in both layouts and a real so101 recording; SQL counts per dataset equal each
    dataset's own totals, items equal each dataset's own items, and the keys that do not line up are named."""
    from helpers import assert_items_equal, real_root

    roots = [real_root("g1_real_v30"), real_root("g1_real_v21"), real_root("record-test")]
    c = lsql.connect_many(roots)
    got = dict(c.sql("SELECT dataset, count(*) FROM frames GROUP BY 1").fetchall())
    assert got == {n: json.loads((r / "meta/info.json").read_text())["total_frames"] for n, r in zip(c.names, roots)}
    with pytest.raises(lsql.ResultContractError, match=r"'action' differs: .*\(26,\).*\(6,\)"):
        c.dataset("SELECT dataset, episode_index FROM episodes WHERE episode_index = 0")
    sql = "SELECT dataset, index FROM frames WHERE frame_index IN (0, 77) AND episode_index < 3 AND dataset LIKE 'g1%'"
    ds = c.dataset(sql, delta_timestamps={"action": [0.0, 1 / 30]})
    assert len(ds) == 12
    for i in range(len(ds)):
        item = ds[i]
        own = c[item["dataset"]].dataset(f"SELECT {int(item['index'])} AS index", delta_timestamps={"action": [0.0, 1 / 30]})
        assert_items_equal({k: v for k, v in item.items() if k not in ("dataset", "dataset_index")}, own[0])


def test_video_files_spans_every_dataset(coll, datasets):
    got = dict(coll.sql("SELECT dataset, count(*) FROM video_files GROUP BY 1").fetchall())
    for name in SETS:  # was: only the first dataset's files, under no dataset column
        assert got[name] == lsql.connect(datasets / name).sql("SELECT count(*) FROM video_files").fetchall()[0][0]
    assert coll.sql("SELECT count(*) FROM video_files WHERE dataset = 'h264_20' AND codec = 'h264'").fetchall()[0][0] \
        == got["h264_20"]


def test_the_same_dataset_twice_is_refused(datasets, tmp_path):
    with pytest.raises(ValueError, match="twice"):
        lsql.connect_many([datasets / "small20", datasets / "h264_20", str(datasets / "small20") + "/"])
