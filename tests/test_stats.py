"""Statistics of a selection (lerobot_sql.stats, ``db.stats``): numeric features against numpy over exactly the
selected rows, cameras against lerobot's aggregation of the per-episode statistics read straight from
meta/episodes with pyarrow, and the source's meta/stats.json unchanged for ``db.stats()``."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import linked_copy

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


# ---- cameras of episodes without per-episode statistics (issue 36, real data 4) ----------------------------------
FRONT, WRIST = "observation.images.front", "observation.images.wrist"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"


def _without_camera_stats(datasets, tmp_path, name, *, pointers_of: str | None = None):
    """A copy of dataset NAME (hard links but for meta/episodes) whose meta/episodes keeps no ``stats/<camera>/*``
    column (the numeric features keep theirs); ``pointers_of``: also drop that camera's ``videos/<camera>/*``
    columns."""

    root = tmp_path / name
    linked_copy(datasets / name, root)
    for p in sorted((root / "meta" / "episodes").rglob("*.parquet")):
        p.unlink()
        t = pq.read_table(datasets / name / p.relative_to(root))
        cams = [k for k, f in json.loads((root / "meta/info.json").read_text())["features"].items()
                if f["dtype"] in ("video", "image")]
        drop = [c for c in t.column_names if any(c.startswith(f"stats/{k}/") for k in cams)
                or (pointers_of and c.startswith(f"videos/{pointers_of}/"))]
        pq.write_table(t.drop_columns(drop), p)
    return root


def _sampled(n: int) -> np.ndarray:
    """lerobot 0.4.4's compute_stats.sample_indices, written out: every frame under 100, else n ** 0.75 of them."""
    k = n if n < 100 else max(100, min(int(n ** 0.75), 10_000))
    return np.round(np.linspace(0, n - 1, k)).astype(int)


def _sampled_frames(root, key, episodes) -> np.ndarray:
    """The frames lerobot samples (``_sampled``) of each of ``episodes`` for camera KEY, decoded straight with PyAV
    from the mp4 (an episode's clip: its `length` frames from from_timestamp on), stacked in episode order,
    (n, H, W, 3) uint8. Only those frames are converted to RGB (the conversion is the slow part)."""
    import av

    meta = {e["episode_index"]: e for p in sorted((root / "meta" / "episodes").rglob("*.parquet"))
            for e in pq.read_table(p).to_pylist()}
    out = []
    for ep in episodes:
        e = meta[ep]
        rel = f"videos/{key}/chunk-{e[f'videos/{key}/chunk_index']:03d}/file-{e[f'videos/{key}/file_index']:03d}.mp4"
        want, k = set(_sampled(e["length"]).tolist()), -1
        with av.open(str(root / rel)) as c:
            for f in c.decode(video=0):
                if f.time < e[f"videos/{key}/from_timestamp"] - 0.5 / 30:
                    continue
                k += 1
                if k in want:
                    out.append(f.to_ndarray(format="rgb24"))
                if k >= max(want):
                    break
    return np.stack(out)


def test_cameras_without_episode_stats_are_computed_from_their_frames(datasets, tmp_path):
    """meta/episodes without the cameras' stats/* columns: db.stats left both cameras out silently (and so did
    ds.meta.stats: lerobot-sql train fed them un-normalised). Now they are computed from the frames as lerobot's
    compute_episode_stats samples them, with a warning: min, max, mean, std, count equal numpy over the sampled frames
    decoded straight with PyAV; and close to what lerobot wrote from the frames before encoding. (ds.meta.stats,
    which is db.stats of the dataset's manifest: test_v21_without_episodes_stats_jsonl_computes_the_cameras.)"""
    root = _without_camera_stats(datasets, tmp_path, "small20")
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    sql = "SELECT index FROM frames WHERE episode_index IN (2, 7) AND frame_index < 20"  # partial episodes
    with pytest.warns(UserWarning, match=r"no per-episode statistics of camera 'observation.images.front' for 2 "
                                         r"of the selected episodes \(e.g. \[2, 7\]\).*computed from the episodes' "
                                         r"frames"):
        st = db.stats(sql)
    assert list(st) == list(lsql.connect(datasets / "small20").stats(sql))  # the cameras, in info.json order
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    assert lengths[7] > 100  # one episode sampled, one whole
    for cam in (FRONT, WRIST):
        x = _sampled_frames(datasets / "small20", cam, (2, 7))
        px = x.reshape(-1, 3).astype(np.float64) / 255.0  # every pixel of every sampled frame, per channel
        assert set(st[cam]) == {"min", "max", "mean", "std", "count", *QKEYS}
        for s, ref in (("min", px.min(0)), ("max", px.max(0)), ("mean", px.mean(0)), ("std", px.std(0))):
            assert st[cam][s].shape == (3, 1, 1)
            np.testing.assert_allclose(st[cam][s].reshape(-1), ref, rtol=1e-9, atol=1e-12, err_msg=f"{cam} {s}")
        assert st[cam]["count"].tolist() == [len(x)]
        assert (st[cam]["q01"] <= st[cam]["q50"]).all() and (st[cam]["q50"] <= st[cam]["q99"]).all()
        # what lerobot wrote, from the frames before encoding: the codec's loss apart, the same mean and count (its
        # stored std of these synthetic sets is 0, not a std of their pixels)
        ref, total = _lerobot_aggregate(_episode_stats_from_parquet(datasets / "small20", cam, {2, 7}))
        assert st[cam]["count"].tolist() == [total]
        np.testing.assert_allclose(st[cam]["mean"].reshape(-1), ref["mean"], atol=0.01, err_msg=cam)


def test_v21_without_episodes_stats_jsonl_computes_the_cameras(datasets, tmp_path):
    """v2.1 without meta/episodes_stats.jsonl: the cameras were left out of ds.meta.stats (what lerobot-sql train
    normalises with); now computed from the frames (one mp4 per episode: its frames, decoded straight with PyAV
    here), without quantiles, as the numeric features of a source without them."""

    import av

    root = tmp_path / "v21"
    linked_copy(datasets / "v21_small20", root)
    (root / "meta" / "episodes_stats.jsonl").unlink()
    with pytest.warns(UserWarning, match="computed from the episodes' frames"):
        got = lsql.connect(root, cache_dir=tmp_path / "c").dataset(episodes=[0, 3]).meta.stats
    for cam in (FRONT, WRIST):
        x = []
        for ep in (0, 3):
            with av.open(str(root / f"videos/chunk-000/{cam}/episode_{ep:06d}.mp4")) as c:
                frames = [f for f in c.decode(video=0)]
            x += [frames[j].to_ndarray(format="rgb24") for j in _sampled(len(frames))]
        px = np.stack(x).reshape(-1, 3).astype(np.float64) / 255.0
        assert set(got[cam]) == {"min", "max", "mean", "std", "count"}, cam
        for s, ref in (("min", px.min(0)), ("max", px.max(0)), ("mean", px.mean(0)), ("std", px.std(0))):
            np.testing.assert_allclose(got[cam][s].reshape(-1), ref, rtol=1e-9, atol=1e-12, err_msg=f"{cam} {s}")
        assert got[cam]["count"].tolist() == [len(x)]


def test_image_features_without_episode_stats_are_computed_from_the_cells(datasets, tmp_path):
    """img5_extras (images in the data files) without camera statistics: computed from the sampled cells, decoded
    with PIL here; equal to lerobot's own numbers (lossless PNG: the same pixels) for min, max, count, and the mean
    to float rounding (lerobot's stored std of this synthetic set is 0, not a std of its pixels)."""
    import io

    from PIL import Image

    root = _without_camera_stats(datasets, tmp_path, "img5_extras")
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match="camera 'observation.images.wrist' for 1 of the selected episodes"):
        st = db.stats("SELECT episode_index FROM episodes WHERE episode_index = 1")
    d = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pylist()
    rows = sorted((r for r in d if r["episode_index"] == 1), key=lambda r: r["index"])
    for cam in (FRONT, WRIST):
        x = np.stack([np.asarray(Image.open(io.BytesIO(rows[j][cam]["bytes"])).convert("RGB"))
                      for j in _sampled(len(rows))])
        px = x.reshape(-1, 3).astype(np.float64) / 255.0
        np.testing.assert_allclose(st[cam]["mean"].reshape(-1), px.mean(0), rtol=1e-9, err_msg=cam)
        np.testing.assert_allclose(st[cam]["std"].reshape(-1), px.std(0), rtol=1e-9, err_msg=cam)
        (ref,) = _episode_stats_from_parquet(datasets / "img5_extras", cam, {1})
        for s in ("min", "max", "count"):
            np.testing.assert_array_equal(st[cam][s].reshape(-1), ref[s].reshape(-1), err_msg=f"{cam} {s}")
        np.testing.assert_allclose(st[cam]["mean"].reshape(-1), ref["mean"].reshape(-1), rtol=1e-5, err_msg=cam)


def test_a_camera_whose_frames_cannot_be_found_is_refused_with_ways_out_that_work(datasets, tmp_path):
    """No camera statistics and no video pointer for the front camera: its statistics can be neither read nor
    computed. db.stats refused with "pass cameras=" (it took no cameras=); now a StatsUnavailableError naming the
    camera and episodes, whose ways out exist: db.stats(sql, cameras=[...]) and db.dataset(..., cameras=[...])."""
    from lerobot_sql.errors import StatsUnavailableError

    root = _without_camera_stats(datasets, tmp_path, "small20", pointers_of=FRONT)
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    sql = "SELECT episode_index FROM episodes WHERE episode_index IN (1, 2)"
    with pytest.raises(StatsUnavailableError, match=r"camera 'observation.images.front': meta/episodes holds no "
                                                    r"per-episode statistics for episodes \[1, 2\].*no video pointer"
                       ) as e:
        db.stats(sql)
    msg = str(e.value)
    assert "db.stats(sql, cameras=[...])" in msg and "db.dataset(..., cameras=[...])" in msg
    with pytest.warns(UserWarning, match="camera 'observation.images.wrist'"):
        st = db.stats(sql, cameras=[WRIST])
    assert WRIST in st and FRONT not in st and "action" in st
    with pytest.warns(UserWarning, match="camera 'observation.images.wrist'"):
        meta = db.dataset(sql, cameras=[WRIST]).meta.stats
    assert WRIST in meta and FRONT not in meta
    np.testing.assert_array_equal(meta[WRIST]["mean"], st[WRIST]["mean"])


def test_depth_cameras_without_episode_stats_are_computed_in_their_unit(datasets, tmp_path):
    """depth4 (lerobot 0.6.1) without camera statistics: every camera computed from its frames. The depth images
    (lossless TIFF in the data files) give lerobot's own numbers (min, max, count exactly; mean and std to float32
    rounding), in their depth_unit, never divided by 255; the depth video's, from its dequantized 12-bit codes, are
    lerobot's numbers of the raw depth within the quantization step."""
    root = _without_camera_stats(datasets, tmp_path, "depth4")
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match="camera 'observation.images.depth' for 1 of the selected episodes"):
        st = db.stats(episodes=[1])
    cams = ["observation.images.front", "observation.images.depth", "observation.images.depth_png",
            "observation.images.depth_m"]
    assert all(k in st for k in cams)
    for key in cams[2:]:
        (ref,) = _episode_stats_from_parquet(datasets / "depth4", key, {1})
        for s in ("min", "max", "count"):
            np.testing.assert_array_equal(st[key][s].reshape(-1), ref[s].reshape(-1), err_msg=f"{key} {s}")
        for s in ("mean", "std"):
            np.testing.assert_allclose(st[key][s].reshape(-1), ref[s].reshape(-1), rtol=2e-6, err_msg=f"{key} {s}")
    (ref,) = _episode_stats_from_parquet(datasets / "depth4", "observation.images.depth", {1})
    assert st["observation.images.depth"]["count"].tolist() == ref["count"].tolist()
    assert 300 < float(st["observation.images.depth"]["mean"].reshape(-1)[0]) < 9000  # mm, not /255
    np.testing.assert_allclose(st["observation.images.depth"]["mean"].reshape(-1), ref["mean"].reshape(-1), rtol=0.01)


def test_camera_stats_of_wall_clock_timestamps_take_each_rows_own_frame(datasets, tmp_path):
    """Timestamps of a clock at 0.9x (drift up to 1.2 s) over clips holding exactly their frames on the fps grid,
    no camera statistics: db.stats (which takes no tolerance_s or align) was refused asking for a tolerance; now the
    cameras are computed from each sampled row's own frame, by its position in the clip (no timestamp names it):
    the same numbers as with the true timestamps."""
    import os
    import shutil

    clean = _without_camera_stats(datasets, tmp_path, "small20")
    root = tmp_path / "wall"
    shutil.copytree(clean, root, copy_function=os.link)
    data = root / "data/chunk-000/file-000.parquet"
    data.unlink()
    t = pq.read_table(clean / "data/chunk-000/file-000.parquet")
    i = t.schema.get_field_index("timestamp")
    fi = np.asarray(t["frame_index"].to_pylist())
    t = t.set_column(i, "timestamp", pa.array((fi / 30 * 0.9).astype(np.float32), t.schema.field(i).type))
    pq.write_table(t, data)
    sql = "SELECT episode_index FROM episodes WHERE episode_index IN (4, 9)"
    with pytest.warns(UserWarning, match="computed from the episodes' frames"):
        got = lsql.connect(root, cache_dir=tmp_path / "c1").stats(sql)
    with pytest.warns(UserWarning, match="computed from the episodes' frames"):
        want = lsql.connect(clean, cache_dir=tmp_path / "c2").stats(sql)
    for cam in (FRONT, WRIST):
        for s in ("min", "max", "mean", "std", "count", *QKEYS):
            np.testing.assert_array_equal(got[cam][s], want[cam][s], err_msg=f"{cam} {s}")
    assert not np.array_equal(got["timestamp"]["max"], want["timestamp"]["max"])  # the damage is there


def test_a_manifest_given_to_stats_is_checked_as_datasets_is(datasets, tmp_path):
    """db.stats(Path) and db.stats(table) took a manifest unchecked: a saved manifest with episode_index edited (0 ->
    5, index left alone) gave episode 5's camera statistics beside episode 0's numbers, and a db.manifest() table of
    another dataset gave this dataset's numbers for its rows. Both are refused now, as db.dataset refuses them; the
    dataset's own manifest gives the statistics of the same SQL."""
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    a, b = lsql.connect(datasets / "small20"), lsql.connect(datasets / "multifile60")
    sql = "SELECT index FROM frames WHERE episode_index = 0"
    path = Path(tmp_path) / "m.parquet"
    a.export_manifest(sql, path)
    t = pq.read_table(path)
    ep = t.column_names.index("episode_index")
    pq.write_table(t.set_column(ep, "episode_index", pc.add(t["episode_index"], pa.scalar(5, t["episode_index"].type))),
                   tmp_path / "edited.parquet")
    with pytest.raises(lsql.ResultContractError, match="edited.parquet: row 0"):
        a.stats(Path(tmp_path) / "edited.parquet")
    with pytest.raises(lsql.ResultContractError, match="another dataset"):
        a.stats(b.manifest("SELECT index FROM frames WHERE index < 10"))
    want = a.stats(sql)
    got = a.stats(path)
    assert np.array_equal(np.asarray(got["action"]["mean"]), np.asarray(want["action"]["mean"]))
