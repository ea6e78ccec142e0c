"""v2.1 datasets read natively: same views and items as their v3.0 twins, frames equal a direct PyAV decode."""

from __future__ import annotations

import json
import shutil

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from helpers import assert_item_equals_reference, load_reference
from lerobot_sql import doctor
from lerobot_sql._format.info import parse_version

CAMS = {"observation.images.front": 1, "observation.images.wrist": 2}
DELTA = {"observation.state": [-2 / 30, -1 / 30, 0.0], "action": [i / 30 for i in range(10)],
         "observation.images.front": [-1 / 30, 0.0], "observation.images.wrist": [-1 / 30, 0.0]}


@pytest.fixture(scope="module")
def v21(datasets):
    return lsql.connect(datasets / "v21_small20")


@pytest.fixture(scope="module")
def v30(datasets):
    return lsql.connect(datasets / "small20")


def _decode_episode(root, key: str, ep: int) -> list[np.ndarray]:
    """Every frame of the episode's own v2.1 mp4, decoded by PyAV in order (HWC uint8 RGB)."""
    with av.open(str(root / f"videos/chunk-000/{key}/episode_{ep:06d}.mp4")) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_views_equal_the_v30_twin(v21, v30, datasets):
    cols = "episode_index, tasks, length, dataset_from_index, dataset_to_index, duration_s"
    assert v21.sql(f"SELECT {cols} FROM episodes ORDER BY 1").fetchall() == \
        v30.sql(f"SELECT {cols} FROM episodes ORDER BY 1").fetchall()
    assert v21.tasks() == v30.tasks()
    assert v21.sql("SELECT codebase_version FROM info").fetchall() == [("v2.1",)]
    # Frames, against the v2.1 episode files read directly with pyarrow.
    files = sorted((datasets / "v21_small20" / "data").glob("chunk-*/episode_*.parquet"))
    assert len(files) == 20
    direct = {}
    for f in files:
        t = pq.read_table(f)
        for r in t.to_pylist():
            direct[r["index"]] = r
    rows = v21.sql('SELECT index, episode_index, frame_index, timestamp, task_index, "observation.state", action '
                   "FROM frames ORDER BY index").fetchall()
    assert [r[0] for r in rows] == sorted(direct) == list(range(4762))
    for r in rows[::37]:
        d = direct[r[0]]
        assert (r[1], r[2], r[4]) == (d["episode_index"], d["frame_index"], d["task_index"])
        assert np.float32(r[3]) == np.float32(d["timestamp"])
        np.testing.assert_array_equal(np.float32(r[5]), np.float32(d["observation.state"]))
    # Whole-table equality with the v3.0 twin.
    q = ('SELECT index, episode_index, frame_index, timestamp, task_index, "observation.state", action '
         "FROM frames ORDER BY index")
    assert v21.sql(q).fetchall() == v30.sql(q).fetchall()
    # Per-episode stats from episodes_stats.jsonl: every non-image feature has min/max/mean/std/count, values as
    # computed from the data.
    got = dict(((f, s), v) for f, s, v in v21.sql(
        "SELECT feature, stat, value FROM episode_stats WHERE episode_index = 3").fetchall())
    state = np.stack([np.float32(d["observation.state"]) for d in direct.values() if d["episode_index"] == 3])
    np.testing.assert_allclose(got[("observation.state", "min")], state.min(0), rtol=0, atol=0)
    np.testing.assert_allclose(got[("observation.state", "max")], state.max(0), rtol=0, atol=0)
    assert got[("observation.state", "count")] == [len(state)]
    assert ("observation.images.front", "mean") in got and len(got[("observation.images.front", "mean")]) == 3


def test_videos_view_points_at_episode_mp4s(v21, datasets):
    rows = v21.sql("SELECT episode_index, video_key, path, from_timestamp, to_timestamp FROM videos "
                   "ORDER BY video_key, episode_index").fetchall()
    lengths = dict(v21.sql("SELECT episode_index, length FROM episodes").fetchall())
    assert len(rows) == 40
    for ep, key, path, t0, t1 in rows:
        assert path == f"videos/chunk-000/{key}/episode_{ep:06d}.mp4"
        assert (datasets / "v21_small20" / path).is_file()
        assert t0 == 0.0 and t1 == lengths[ep] / 30


@pytest.mark.slow  # decodes every frame
def test_every_camera_frame_is_right_and_equals_direct_pyav(v21, datasets, framecode):
    root = datasets / "v21_small20"
    ds = v21.dataset("SELECT index FROM frames ORDER BY index", return_uint8=True)
    assert len(ds) == 4762
    decoded = {}
    for i in range(len(ds)):
        item = ds[i]
        ep, f = int(item["episode_index"]), int(item["frame_index"])
        for key, cam in CAMS.items():
            if (key, ep) not in decoded:
                decoded = {k: v for k, v in decoded.items() if k[1] == ep}  # keep memory small
                decoded[(key, ep)] = _decode_episode(root, key, ep)
            img = item[key].permute(1, 2, 0).numpy()
            np.testing.assert_array_equal(img, decoded[(key, ep)][f], err_msg=f"index {i} {key}")
            if f % 5 == 0:  # framecode on a stride: the pixel equality above already pins the frame
                assert framecode.verify_frame(img, ep, f, cam)["ok"], (ep, f, key)


@pytest.mark.parametrize("delta", [False, True])
def test_items_equal_small20_items(v21, v30, datasets, framecode, delta):
    """Tabular values, task and *_is_pad equal small20's items; camera stacks equal direct decodes (clamped)."""
    root = datasets / "v21_small20"
    dt = DELTA if delta else None
    a = v21.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=dt, return_uint8=True)
    tab_dt = {k: v for k, v in dt.items() if k not in CAMS} if dt else None  # b is tabular-only
    b = v30.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=tab_dt, cameras=[])
    bounds = v30.sql("SELECT dataset_from_index, dataset_to_index - 1 FROM episodes").fetchall()
    picks = sorted({x for r in bounds for x in r} | set(range(1, 4762, 97)))
    decoded = {}
    for i in picks:
        x, y = a[i], b[i]
        pad_keys = {f"{k}_is_pad" for k in CAMS} if delta else set()
        assert set(x) - set(CAMS) - pad_keys == set(y), i
        for k, v in y.items():
            if isinstance(v, torch.Tensor):
                assert x[k].dtype == v.dtype and torch.equal(x[k], v), (i, k)
            else:
                assert x[k] == v, (i, k)
        ep, f = int(x["episode_index"]), int(x["frame_index"])
        for key, cam in CAMS.items():
            if (key, ep) not in decoded:
                decoded[(key, ep)] = _decode_episode(root, key, ep)
            frames = decoded[(key, ep)]
            offsets = [round(o * 30) for o in DELTA[key]] if delta else [0]
            want = np.stack([frames[min(max(f + o, 0), len(frames) - 1)].transpose(2, 0, 1) for o in offsets])
            got = x[key].numpy() if delta else x[key].numpy()[None]
            np.testing.assert_array_equal(got, want, err_msg=f"index {i} {key}")
            if delta:
                pad = [not 0 <= f + o < len(frames) for o in offsets]
                assert x[f"{key}_is_pad"].tolist() == pad, (i, key)
            assert framecode.verify_frame(got[-1].transpose(1, 2, 0), ep, f, cam)["ok"], (i, key)


@pytest.mark.parametrize("mode", ["plain", "delta"])
def test_g1_real_v21_items_equal_g1_real_v30_reference(real_datasets, mode):
    """The real v2.1 set gives exactly what lerobot 0.4.4 returned for its converted v3.0 twin."""
    ref, npz = load_reference("g1_real_v30")
    db = lsql.connect(real_datasets / "g1_real_v21")
    ds = db.dataset("SELECT index FROM frames ORDER BY index",
                    delta_timestamps=ref["delta_timestamps"] if mode == "delta" else None)
    assert len(ds) == ref["total_frames"]
    for it in ref["items"]:
        assert_item_equals_reference(ds[it["index"]], it, npz, mode)


def test_v2_path_templates_resolve(v21):
    layout = v21.layout
    assert layout.legacy and parse_version(layout.version) == (2, 1)
    assert layout.video_file("observation.images.front", 0, 7) == \
        "videos/chunk-000/observation.images.front/episode_000007.mp4"
    assert layout.data_file(0, 7) == "data/chunk-000/episode_000007.parquet"
    assert set(layout.data_files) == {layout.data_file(0, e) for e in range(20)}


def test_v20_without_episode_stats_opens(datasets, tmp_path, v21):
    """v2.0: same layout without meta/episodes_stats.jsonl; the episode_stats view is empty, items unchanged."""
    root = tmp_path / "v20"
    shutil.copytree(datasets / "v21_small20", root)
    (root / "meta/episodes_stats.jsonl").unlink()
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.0"}))
    db = lsql.connect(root)
    assert db.layout.legacy and db.layout.episode_stats_file is None
    assert db.sql("SELECT count(*) FROM episode_stats").fetchall() == [(0,)]
    a = db.dataset("SELECT index FROM frames WHERE index IN (0, 2000, 4761) ORDER BY index", return_uint8=True)
    b = v21.dataset("SELECT index FROM frames WHERE index IN (0, 2000, 4761) ORDER BY index", return_uint8=True)
    for i in range(3):
        x, y = a[i], b[i]
        assert set(x) == set(y) and all(torch.equal(x[k], y[k]) if isinstance(y[k], torch.Tensor) else x[k] == y[k]
                                        for k in y)
    report = doctor.run(db)
    assert report.ok and report["stats_present"].skipped


def test_v21_small_chunks_size_spreads_episodes_over_chunk_folders(datasets, tmp_path, v21, framecode):
    """chunks_size counts episodes per chunk folder in v2: episode e lives in chunk-{e // chunks_size}."""
    root = tmp_path / "v21_chunks"
    shutil.copytree(datasets / "v21_small20", root)
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "chunks_size": 8}))
    for ep in range(8, 20):
        chunk = f"chunk-{ep // 8:03d}"
        src = root / f"data/chunk-000/episode_{ep:06d}.parquet"
        (root / "data" / chunk).mkdir(exist_ok=True)
        src.rename(root / "data" / chunk / src.name)
        for key in CAMS:
            v = root / f"videos/chunk-000/{key}/episode_{ep:06d}.mp4"
            (root / "videos" / chunk / key).mkdir(parents=True, exist_ok=True)
            v.rename(root / "videos" / chunk / key / v.name)
    db = lsql.connect(root)
    assert db.sql("SELECT path FROM videos WHERE episode_index = 17 AND video_key = 'observation.images.wrist'"
                  ).fetchall() == [("videos/chunk-002/observation.images.wrist/episode_000017.mp4",)]
    q = "SELECT index, episode_index, frame_index, action FROM frames ORDER BY index"
    assert db.sql(q).fetchall() == v21.sql(q).fetchall()
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index IN (7, 8, 17)", return_uint8=True)
    for i in range(0, len(ds), 23):
        item = ds[i]
        ep, f = int(item["episode_index"]), int(item["frame_index"])
        for key, cam in CAMS.items():
            assert framecode.verify_frame(item[key].permute(1, 2, 0).numpy(), ep, f, cam)["ok"], (ep, f, key)
