"""Video index (vs a full PyAV demux), location through it, decoder reuse, and fork safety of the frame path."""

from __future__ import annotations

import os
import shutil

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from helpers import data_root
from lerobot_sql._readers import video
from lerobot_sql._storage.source import open_source

CASES = [("small20", "videos/observation.images.front/chunk-000/file-000.mp4"),    # AV1, sample-table path
         ("h264_20", "videos/observation.images.wrist/chunk-000/file-000.mp4"),    # H.264 with B-frames: demux path
         ("g1_real_v30", "videos/observation.images.cam_high/chunk-000/file-000.mp4")]


def _demux(path):
    """Independent truth: every packet of the file, by a plain PyAV demux."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        pk = [(p.pts, bool(p.is_keyframe), p.pos, p.size) for p in c.demux(s) if p.pts is not None]
        return pk, s.time_base


def _decode_all(path, limit=None):
    """Independent truth: the file's first ``limit`` frames (all by default), one sequential pass, keyed by pts."""
    with av.open(str(path)) as c:
        out = {}
        for f in c.decode(video=0):
            out[f.pts] = f.to_ndarray(format="rgb24").transpose(2, 0, 1)
            if limit and len(out) >= limit:
                break
        return out


@pytest.mark.parametrize("name,rel", CASES)
def test_index_equals_full_demux(tmp_path, name, rel):
    src = open_source(data_root(name))
    t = pa.ipc.open_file(pa.memory_map(str(video.ensure_index_arrow(src, rel, tmp_path)))).read_all()
    pq_index = pq.read_table(video.ensure_index(src, rel, tmp_path))
    pk, tb = _demux(data_root(name) / rel)
    pk_sorted = sorted(pk)
    assert pq_index["pts"].to_pylist() == [p[0] for p in pk_sorted]
    assert pq_index["is_keyframe"].to_pylist() == [p[1] for p in pk_sorted]
    assert pq_index["byte_offset"].to_pylist() == [p[2] for p in pk_sorted]
    assert pq_index["byte_size"].to_pylist() == [p[3] for p in pk_sorted]
    np.testing.assert_allclose(pq_index["pts_s"].to_numpy(), np.array([p[0] for p in pk_sorted]) * float(tb))
    # keyframe_pts: the last keyframe at or before the packet in decode order
    last, want = None, {}
    for pts, key, _, _ in pk:
        last = pts if key else last
        want[pts] = last
    assert pq_index["keyframe_pts"].to_pylist() == [want[p[0]] for p in pk_sorted]
    # the mmap form agrees, and its key rows start at a keyframe at or before each frame
    assert t["pts"].to_pylist() == pq_index["pts"].to_pylist()
    key_row = t["key_row"].to_numpy()
    assert (key_row <= np.arange(len(key_row))).all()
    assert pq_index["is_keyframe"].to_numpy(zero_copy_only=False)[key_row].all()


def test_index_cache_is_keyed_by_file_identity(datasets, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    src = open_source(root)
    rel = CASES[0][1]
    p1 = video.ensure_index(src, rel, tmp_path / "cache")
    assert video.ensure_index(src, rel, tmp_path / "cache") == p1
    st = os.stat(root / rel)
    os.utime(root / rel, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    p2 = video.ensure_index(src, rel, tmp_path / "cache")
    assert p2 != p1 and p2.exists()


def test_video_frames_view_counts_every_frame(datasets):
    db = lsql.connect(datasets / "multifile60")
    got = db.sql("SELECT path, count(*), sum(is_keyframe::INT), min(frame), max(frame) FROM video_frames "
                 "GROUP BY path ORDER BY path").fetchall()
    files = db.sql("SELECT DISTINCT path FROM videos ORDER BY path").fetchall()
    assert [g[0] for g in got] == [f[0] for f in files]
    for path, n, keys, lo, hi in got:
        pk, _ = _demux(datasets / "multifile60" / path)
        assert n == len(pk) and keys == sum(p[1] for p in pk) and (lo, hi) == (0, n - 1)
    # every frame of the frames view has its video frame within tolerance
    miss = db.sql("SELECT count(*) FROM frames f JOIN videos v USING (episode_index) "
                  "ANTI JOIN video_frames vf ON vf.path = v.path AND abs(vf.pts_s - (v.from_timestamp + f.timestamp)) "
                  "< 1e-4").fetchall()[0][0]
    assert miss == 0


def test_locate_picks_nearest_and_refuses_out_of_tolerance(datasets, tmp_path):
    src = open_source(datasets / "small20")
    rel = CASES[0][1]
    index = video.FrameIndex.load(video.ensure_index_arrow(src, rel, tmp_path))
    pts_s = index.pts_s
    rows = np.array([0, 5, 100, len(pts_s) - 1])
    assert index.locate(pts_s[rows] + 3e-5, 1e-4, episode_index=0, video_key="k").tolist() == rows.tolist()
    assert index.locate(pts_s[rows] - 3e-5, 1e-4, episode_index=0, video_key="k").tolist() == rows.tolist()
    # half a frame away: no frame within tolerance, never a neighbour
    with pytest.raises(lsql.FrameNotFoundError, match=r"camera 'cam'.*episode 7.*file-000\.mp4|file-000\.mp4.*'cam'"):
        index.locate(np.array([pts_s[10], pts_s[10] + 0.5 / 30]), 1e-4, episode_index=7, video_key="cam")
    # the same index loaded from Parquet agrees
    pq_index = video.FrameIndex.load(video.ensure_index(src, rel, tmp_path))
    np.testing.assert_array_equal(pq_index.key_row, index.key_row)


def test_dataset_raises_frame_not_found_for_drifted_timestamps(datasets):
    db = lsql.connect(datasets / "small20")
    m = db.manifest("SELECT index FROM frames WHERE episode_index = 2 AND frame_index < 4")
    key = "observation.images.wrist"
    col = m.column_names.index(f"{key}/from_timestamp")
    m = m.set_column(col, f"{key}/from_timestamp", pa.compute.add(m[f"{key}/from_timestamp"], 0.5 / 30))
    ds = db.dataset(m)
    with pytest.raises(lsql.FrameNotFoundError, match="wrist"):
        ds[0]
    ok = db.dataset(m, cameras=["observation.images.front"])  # the other camera still reads
    assert ok[0]["observation.images.front"].shape == (3, 96, 128)


def test_missing_video_file_warns_then_raises_on_read(datasets, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    os.unlink(root / "videos/observation.images.wrist/chunk-000/file-000.mp4")
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match="missing"):
        ds = db.dataset("SELECT index FROM frames WHERE index < 3")
    with pytest.raises(lsql.MissingFileError, match="file-000.mp4"):
        ds[0]
    assert db.dataset("SELECT index FROM frames WHERE index < 3", cameras=["observation.images.front"])[0]


@pytest.mark.parametrize("name,rel", CASES)
def test_decoder_pool_reads_exact_frames_in_any_order(tmp_path, name, rel):
    src = open_source(data_root(name))
    index = video.FrameIndex.load(video.ensure_index_arrow(src, rel, tmp_path))
    n = min(len(index.pts), 300)  # the file's start is enough, and keeps the test fast
    truth = _decode_all(data_root(name) / rel, limit=n + 8)
    rng = np.random.default_rng(0)
    pool = video.DecoderPool(src, max_open=2)
    orders = [np.arange(0, min(n, 40)),                      # forward run: one seek
              rng.integers(0, n, 25),                        # random
              np.array([30, 29, 28, 5, 5, 6, 200 % n]),      # backwards, repeats
              np.array([n - 1, 0, n - 2])]
    for rows in orders:
        frames = pool.decode_chw(index, rows)
        for j, r in enumerate(rows):
            np.testing.assert_array_equal(frames[j], truth[int(index.pts[r])], err_msg=f"{name} row {r}")
    # dict form used by export: pts -> HWC
    d = pool.decode(index, np.array([3, 4]))
    np.testing.assert_array_equal(d[int(index.pts[4])], truth[int(index.pts[4])].transpose(1, 2, 0))
    pool.close()


def test_forward_reads_do_not_seek(datasets, tmp_path):
    src = open_source(datasets / "small20")
    rel = CASES[0][1]
    index = video.FrameIndex.load(video.ensure_index_arrow(src, rel, tmp_path))
    pool = video.DecoderPool(src, reach=2)
    for r in range(100, 160):
        pool.decode_chw(index, np.array([r]))
    s = pool.stats()
    assert s["seeks"] == 1 and s["decoded"] == 160 - index.key_row[100]
    t = 162
    assert 0 < index.key_row[t] - 160 <= 2                  # its keyframe is just ahead: decode forward
    pool.decode_chw(index, np.array([t]))
    s1 = pool.stats()
    assert s1["seeks"] == 1 and s1["decoded"] - s["decoded"] == t - 160 + 1
    far = 400                                                # far ahead: one seek to its keyframe
    pool.decode_chw(index, np.array([far]))
    s2 = pool.stats()
    assert s2["seeks"] == 2 and s2["decoded"] - s1["decoded"] == far - index.key_row[far] + 1


def test_planar_and_packed_conversion_agree(real_datasets, tmp_path):
    src = open_source(real_datasets / "g1_real_v30")
    rel = CASES[2][1]
    index = video.FrameIndex.load(video.ensure_index_arrow(src, rel, tmp_path))
    rows = np.array([3, 50, 51])
    a = video.DecoderPool(src).decode_chw(index, rows)
    f = video._OpenFile(src, rel, 1)
    f.planar = False  # force the packed rgb24 path
    b = np.empty_like(a)
    f.decode_into(index, rows, b, 2)
    np.testing.assert_array_equal(a, b)


def test_fork_safety_parent_reads_then_two_workers(datasets, framecode):
    db = lsql.connect(datasets / "multifile60")
    ds = db.dataset("SELECT index FROM frames WHERE episode_index IN (10, 11, 33, 34) AND frame_index % 9 = 0 "
                    "ORDER BY index", return_uint8=True, parallel_cameras=True)
    parent = [ds[i] for i in range(len(ds))]  # opens decoders, maps and threads in the parent
    loader = torch.utils.data.DataLoader(ds, batch_size=5, shuffle=False, num_workers=2,
                                         multiprocessing_context="fork")
    got = {k: torch.cat([b[k] for b in loader]) for k in ("index", "observation.images.front",
                                                           "observation.images.wrist", "frame_index",
                                                           "episode_index")}
    assert got["index"].tolist() == [int(p["index"]) for p in parent]
    for j, p in enumerate(parent):
        for cam, k in ((1, "observation.images.front"), (2, "observation.images.wrist")):
            assert torch.equal(got[k][j], p[k])
            ep, f = int(got["episode_index"][j]), int(got["frame_index"][j])
            assert framecode.verify_frame(got[k][j].permute(1, 2, 0).numpy(), ep, f, cam)["ok"], (ep, f, k)


# ---- a video file replaced while a dataset reads it (issue 14, High #4) -------------------------------------------
FRONT = "videos/observation.images.front/chunk-000/file-000.mp4"
WRIST = "videos/observation.images.wrist/chunk-000/file-000.mp4"
CAMS = ("observation.images.front", "observation.images.wrist")


def _writable_copy(datasets, tmp_path, name="small20"):
    root = tmp_path / name
    shutil.copytree(datasets / name, root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def _swap_cameras(root):
    """front <-> wrist by renames (new inodes, other sizes): each path now holds the other camera's frames."""
    tmp = root / "swap.tmp"
    os.replace(root / FRONT, tmp)
    os.replace(root / WRIST, root / FRONT)
    os.replace(tmp, root / WRIST)


def _overwrite_in_place(root):
    """front's bytes overwritten by wrist's in the same inode (as `cp wrist front` does)."""
    with open(root / WRIST, "rb") as src, open(root / FRONT, "r+b") as dst:
        dst.truncate(0)
        shutil.copyfileobj(src, dst)


def _assert_right_frames(framecode, item):
    ep, f = int(item["episode_index"]), int(item["frame_index"])
    for cam in CAMS:
        img = item[cam].numpy().transpose(1, 2, 0)
        assert framecode.verify_frame(img, ep, f, cam)["ok"], (cam, ep, f)


SQL_SWAP = "SELECT index FROM frames WHERE episode_index = 3 AND frame_index < 40 ORDER BY index"


@pytest.mark.parametrize("replace", [_swap_cameras, _overwrite_in_place])
@pytest.mark.parametrize("when", ["before_first_item", "mid_run"])
def test_a_replaced_mp4_is_refused_never_read_through_the_stale_index(datasets, tmp_path, framecode, replace, when):
    from lerobot_sql.errors import DatasetFormatError

    root = _writable_copy(datasets, tmp_path)
    ds = lsql.connect(root, cache_dir=tmp_path / "c").dataset(SQL_SWAP, return_uint8=True)
    done = 0 if when == "before_first_item" else 5
    for i in range(done):  # decoders are open on both files now
        _assert_right_frames(framecode, ds[i])
    replace(root)
    for i in range(done, len(ds)):
        with pytest.raises(DatasetFormatError, match=r"observation\.images\.front/chunk-000/file-000\.mp4.*changed"):
            ds[i]
    # a dataset opened anew reads what the files now hold, through a fresh index
    ds2 = lsql.connect(root, cache_dir=tmp_path / "c").dataset(SQL_SWAP, return_uint8=True)
    item = ds2[0]
    ep, f = int(item["episode_index"]), int(item["frame_index"])
    assert framecode.verify_frame(item["observation.images.front"].numpy().transpose(1, 2, 0), ep, f,
                                  "observation.images.wrist")["ok"]


def test_a_replaced_mp4_between_dataloader_epochs_is_refused_in_the_workers(datasets, tmp_path, framecode):
    from lerobot_sql.errors import DatasetFormatError

    root = _writable_copy(datasets, tmp_path)
    ds = lsql.connect(root, cache_dir=tmp_path / "c").dataset(SQL_SWAP, return_uint8=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    n = 0
    for batch in loader:  # epoch 1: the workers build the indexes and open decoders
        for j in range(len(batch["index"])):
            _assert_right_frames(framecode, {k: v[j] for k, v in batch.items() if k != "task"})
            n += 1
    assert n == len(ds) == 40
    _swap_cameras(root)
    with pytest.raises(DatasetFormatError, match=r"file-000\.mp4.*changed"):
        for _ in loader:  # epoch 2: fresh workers forked from a dataset that pinned the old files
            pass


def test_index_cache_sees_a_replacement_that_kept_size_and_mtime(datasets, tmp_path):
    """A copy with ``cp -p`` over the mp4 keeps size and mtime; inode and ctime still key a new index entry."""
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    src = open_source(root)
    rel = CASES[0][1]
    p1 = video.ensure_index(src, rel, tmp_path / "cache")
    st = os.stat(root / rel)
    shutil.copy2(root / rel, root / (rel + ".new"))
    os.replace(root / (rel + ".new"), root / rel)
    os.utime(root / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(root / rel).st_size, os.stat(root / rel).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    p2 = video.ensure_index(src, rel, tmp_path / "cache")
    assert p2 != p1 and p2.exists()
    pin = video.stamp(src, rel)
    assert video.index_path(src, rel, tmp_path / "cache", pin) == p2  # the pinned key is Source.identity's
    assert p2.with_suffix(".arrow") == video.ensure_index_arrow(src, rel, tmp_path / "cache", pin).with_suffix(".arrow")


@pytest.fixture(scope="module")
def wrist_320x240(datasets, tmp_path_factory):
    """small20 with its wrist mp4 re-encoded at 320x240 (info.json declares 96x128), same frames and timing."""
    import fractions

    root = tmp_path_factory.mktemp("mp4res") / "small20"
    shutil.copytree(datasets / "small20", root)
    p = root / "videos/observation.images.wrist/chunk-000/file-000.mp4"
    with av.open(str(p)) as c:
        n = c.streams.video[0].frames
    with av.open(str(p) + ".new.mp4", "w") as out:
        s = out.add_stream("libx264", rate=30, options={"preset": "ultrafast"})
        s.width, s.height, s.pix_fmt = 320, 240, "yuv420p"
        s.codec_context.time_base = fractions.Fraction(1, 30)
        for i in range(n):
            fr = av.VideoFrame.from_ndarray(np.full((240, 320, 3), i % 255, np.uint8), format="rgb24")
            fr.pts = i
            out.mux(s.encode(fr))
        out.mux(s.encode())
    os.replace(str(p) + ".new.mp4", p)
    return root


def test_an_mp4_of_another_resolution_than_declared_is_served_with_one_warning(wrist_320x240, tmp_path):
    """Real datasets hold one camera's files at several sizes (lerobot serves each file's own): served, but the
    user hears of it once per file, naming the mp4, the camera and both shapes."""
    import warnings

    db = lsql.connect(wrist_320x240, cache_dir=tmp_path / "cache")
    ds = db.dataset("SELECT index FROM frames WHERE episode_index = 0 ORDER BY index LIMIT 4")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        items = [ds[i] for i in range(3)]
    assert [tuple(it["observation.images.wrist"].shape) for it in items] == [(3, 240, 320)] * 3
    assert tuple(items[0]["observation.images.front"].shape) == (3, 96, 128)
    msgs = [str(w.message) for w in rec if "video frames" in str(w.message)]
    assert len(msgs) == 1, msgs  # at decoder open, not per frame
    assert "observation.images.wrist/chunk-000/file-000.mp4" in msgs[0] and "'observation.images.wrist'" in msgs[0]
    assert "240x320 (HxW)" in msgs[0] and "declares 96x128" in msgs[0]


def test_an_mp4_far_larger_than_declared_is_refused_as_a_decode_bomb(wrist_320x240, tmp_path, monkeypatch):
    """Past the bound (here lowered to 4 x the declared pixels so a small encode shows it; the shipped bound is 64 x,
    or a side over 8192) the decoder is not used: a DatasetFormatError naming the mp4, camera and both shapes."""
    monkeypatch.setattr(video, "MAX_PIXEL_RATIO", 4, raising=False)
    db = lsql.connect(wrist_320x240, cache_dir=tmp_path / "cache")
    ds = db.dataset("SELECT index FROM frames WHERE episode_index = 0 ORDER BY index LIMIT 4", cameras=[
        "observation.images.wrist"])
    with pytest.raises(lsql.DatasetFormatError, match=r"observation\.images\.wrist/chunk-000/file-000\.mp4: video "
                       r"frames of camera 'observation\.images\.wrist' are 240x320 \(HxW\), info\.json declares "
                       r"96x128 \(HxW\); refused as a decode bomb"):
        ds[0]
    monkeypatch.setattr(video, "MAX_PIXEL_RATIO", 64)
    monkeypatch.setattr(video, "MAX_SIDE", 300)  # the absolute bound, whatever info.json says
    with pytest.raises(lsql.DatasetFormatError, match="refused as a decode bomb"):
        video.check_resolution("x.mp4", (240, 320), "cam", None)
    video.check_resolution("x.mp4", (240, 300), "cam", (240, 300))  # within both bounds: no error
