"""Statistics of a selection (lerobot_sql.stats, ``db.stats``): numeric features against numpy over exactly the
selected rows, cameras against lerobot's aggregation of the per-episode statistics read straight from
meta/episodes with pyarrow, and the source's meta/stats.json unchanged for ``db.stats()``."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql

QKEYS = ("q01", "q10", "q50", "q90", "q99")


def _rows(db, indices):
    """The selected frames' values, read back through SQL, one row per sample (repeats kept)."""
    df = db.sql("SELECT * FROM frames ORDER BY index").df().set_index("index", drop=False)
    return df.loc[list(indices)]


def _check_numeric(st, df, key):
    x = np.stack([np.atleast_1d(np.asarray(v, np.float64)) for v in df[key].to_numpy()])
    ref = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    ref.update({k: np.quantile(x, q, axis=0) for k, q in zip(QKEYS, (0.01, 0.10, 0.50, 0.90, 0.99))})
    for k, v in ref.items():
        np.testing.assert_allclose(st[key][k], v, rtol=1e-12, atol=1e-12, err_msg=f"{key} {k}")
        assert st[key][k].shape == v.shape
    assert st[key]["count"].dtype == np.int64 and st[key]["count"].tolist() == [len(x)]


def _episode_stats_from_parquet(root, key, episodes):
    """Per-episode camera statistics straight from meta/episodes/*.parquet, without lerobot_sql."""
    out = {}
    for p in sorted((root / "meta" / "episodes").rglob("*.parquet")):
        t = pq.read_table(p).to_pylist()
        for row in t:
            if row["episode_index"] in episodes:
                out[row["episode_index"]] = {s: np.asarray(row[f"stats/{key}/{s}"], np.float64)
                                             for s in ("min", "max", "mean", "std", "count", *QKEYS)}
    return [out[e] for e in sorted(out)]


def _lerobot_aggregate(stats):
    """lerobot 0.4.4's aggregate_feature_stats, written out here as the reference."""
    counts = np.array([s["count"][0] for s in stats], np.float64)
    means = np.stack([s["mean"].reshape(-1) for s in stats])
    stds = np.stack([s["std"].reshape(-1) for s in stats])
    total = counts.sum()
    mean = (means * counts[:, None]).sum(0) / total
    var = (((stds ** 2) + (means - mean) ** 2) * counts[:, None]).sum(0) / total
    ref = {"min": np.min([s["min"].reshape(-1) for s in stats], 0), "max": np.max([s["max"].reshape(-1) for s in stats], 0),
           "mean": mean, "std": np.sqrt(var)}
    ref.update({q: (np.stack([s[q].reshape(-1) for s in stats]) * counts[:, None]).sum(0) / total for q in QKEYS})
    return ref, int(total)


@pytest.mark.parametrize("sql", [
    "SELECT episode_index FROM episodes WHERE episode_index IN (1, 4, 7)",
    "SELECT index FROM frames WHERE frame_index % 7 = 0 AND episode_index < 10",
    "SELECT episode_index, 0.5 AS start_s, 1.5 AS end_s FROM episodes WHERE episode_index IN (2, 3)",
])
def test_numeric_features_equal_numpy_over_the_selected_rows(sample, tmp_path, sql):
    db = lsql.connect(sample, cache_dir=tmp_path)
    m = db.manifest(sql)
    st = db.stats(sql)
    df = _rows(db, m.column("index").to_pylist())
    for key in ("observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index"):
        _check_numeric(st, df, key)
    assert st["frame_index"]["min"].dtype == np.int64 and st["action"]["mean"].dtype == np.float64


def test_a_frame_served_twice_counts_twice(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = ("SELECT 3 AS episode_index, 0.0 AS start_s, 1.0 AS end_s "
           "UNION ALL SELECT 3, 0.5, 1.5 ORDER BY start_s")
    m = db.manifest(sql)
    assert m.num_rows > len(set(m.column("index").to_pylist()))  # the windows overlap
    st = db.stats(sql)
    _check_numeric(st, _rows(db, m.column("index").to_pylist()), "action")


def test_cameras_are_lerobots_aggregate_of_the_touched_episodes(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = "SELECT index FROM frames WHERE episode_index IN (2, 5, 9) AND frame_index < 10"  # partial episodes
    st = db.stats(sql)
    for cam in ("observation.images.front", "observation.images.wrist"):
        ref, total = _lerobot_aggregate(_episode_stats_from_parquet(sample, cam, {2, 5, 9}))
        for k, v in ref.items():
            assert st[cam][k].shape == (3, 1, 1), (cam, k)
            np.testing.assert_allclose(st[cam][k].reshape(-1), v, rtol=1e-12, err_msg=f"{cam} {k}")
        assert st[cam]["count"].tolist() == [total]


def test_all_episodes_agree_with_the_sources_stats_json(sample, tmp_path):
    """Whole episodes, all of them: what lerobot wrote for the dataset (float32 sums there: 1e-5 relative)."""
    db = lsql.connect(sample, cache_dir=tmp_path)
    st = db.stats("SELECT episode_index FROM episodes")
    ref = json.loads((sample / "meta" / "stats.json").read_text())
    assert set(st) == set(ref)
    for key, stats in ref.items():
        for s in ("min", "max", "mean", "std", "count"):
            np.testing.assert_allclose(np.asarray(st[key][s], np.float64).reshape(-1),
                                       np.asarray(stats[s], np.float64).reshape(-1), rtol=2e-5, atol=1e-6,
                                       err_msg=f"{key} {s}")


def test_no_sql_gives_the_sources_stats_json_unchanged(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    st = db.stats()
    ref = json.loads((sample / "meta" / "stats.json").read_text())
    assert set(st) == set(ref)
    for key, stats in ref.items():
        assert set(st[key]) == set(stats)
        for s, v in stats.items():
            assert isinstance(st[key][s], np.ndarray)
            np.testing.assert_array_equal(st[key][s], np.asarray(v))


def test_v21_has_no_quantiles_and_still_gets_the_rest(datasets, tmp_path):
    db = lsql.connect(datasets / "v21_small20", cache_dir=tmp_path)
    st = db.stats("SELECT episode_index FROM episodes WHERE episode_index < 4")
    assert set(st["action"]) == {"min", "max", "mean", "std", "count"}
    assert set(st["observation.images.front"]) == {"min", "max", "mean", "std", "count"}
    m = db.manifest("SELECT episode_index FROM episodes WHERE episode_index < 4")
    df = _rows(db, m.column("index").to_pylist())
    x = np.stack(df["action"].to_numpy()).astype(np.float64)
    np.testing.assert_allclose(st["action"]["mean"], x.mean(0), rtol=1e-12)


def test_an_empty_selection_is_an_error(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="no rows"):
        db.stats("SELECT index FROM frames WHERE index < 0")


@pytest.mark.parametrize("text, match", [
    ('{"action": {"mean": "oops"}', r"not valid JSON \(line 1, column 28: Expecting ',' delimiter"),
    ('{"action": {"mean": "oops"}}', r"'action' 'mean' is 'oops', not numbers"),
    ('{"action": {"mean": [1, 2]}}', r"'action' 'mean' has 2 value\(s\) \(shape \[2\]\) but the feature's shape "
                                     r"\[6\] in meta/info.json needs 6"),
    ('{"action": {"count": [5, 5]}}', r"'action' 'count' has 2 value\(s\).* needs 1"),
    ('{"observation.images.front": {"std": [[[0.1]], [[0.2]]]}}', r"'observation.images.front' 'std' has 2 "
                                                                 r"value\(s\) \(shape \[2, 1, 1\]\).* needs 3"),
    ('[1, 2]', r"not a JSON object of \{feature: \{stat: values\}\}"),
])
def test_a_broken_stats_json_is_a_format_error_naming_the_file_feature_and_stat(sample, tmp_path, text, match):
    """ds.meta.stats with stats='dataset' (and db.stats()) read meta/stats.json: a file that is no JSON, a statistic
    that is no numbers, or one whose size does not fit the feature's info.json shape is a DatasetFormatError naming
    the file, the feature and the statistic, with the fix; never a bare JSONDecodeError or numbers passed on."""
    import shutil

    from lerobot_sql.errors import DatasetFormatError

    root = tmp_path / "ds"
    shutil.copytree(sample, root)
    (root / "meta" / "stats.json").write_text(text)
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index < 2", stats="dataset", cameras=[])
    for read in (lambda: ds.meta.stats, db.stats):
        with pytest.raises(DatasetFormatError, match=match) as e:
            read()
        assert "meta/stats.json" in str(e.value) and "recompute" in str(e.value)
    # the statistics of the selection (the default) do not read the file
    assert db.dataset("SELECT episode_index FROM episodes WHERE episode_index < 2",
                      cameras=[]).meta.stats["action"]["mean"].shape == (6,)


@pytest.mark.parametrize("name", ["small20", "depth4", "img5_extras", "multifile60", "h264_20"])
def test_every_bundled_stats_json_passes_the_shape_check(datasets, tmp_path, name):
    """The check refuses only what cannot fit: every bundled dataset's stats.json (vectors, scalars, RGB and depth
    cameras) loads unchanged."""
    st = lsql.connect(datasets / name, cache_dir=tmp_path).stats()
    ref = json.loads((datasets / name / "meta" / "stats.json").read_text())
    assert set(st) == set(ref)
    for key, stats in ref.items():
        for s, v in stats.items():
            np.testing.assert_array_equal(st[key][s], np.asarray(v))
