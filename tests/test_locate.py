"""Where a frame is (lerobot_sql/locate.py): time in the file, nearest pts within tolerance, keyframe row, packet
ranges; and prefetch planning its bytes with the decoder's own keyframe rule."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql import prefetch
from lerobot_sql._readers import locate, video_index

FPS = 30.0
N = 24


def _open_gop_index():
    """A 24-frame index in presentation order, keyframes at rows 0, 6, 12, 18; rows 4-5, 10-11, 16-17 are
    B-frames decoded after the next keyframe (open GOP), so the demuxer records that later keyframe for them.
    Packet i sits at byte i * 100_000, 1000 bytes long."""
    rows = np.arange(N)
    pts = rows * 512
    is_key = rows % 6 == 0
    kf_row = (rows // 6) * 6
    kf_row = np.where(rows % 6 >= 4, np.minimum(kf_row + 6, N - 6), kf_row)  # B-frames: the next keyframe
    t = pa.table({"frame": rows, "pts": pts, "pts_s": pts / (512 * FPS), "is_keyframe": is_key,
                  "keyframe_pts": pts[kf_row], "byte_offset": rows * 100_000, "byte_size": np.full(N, 1000)},
                 schema=video_index.INDEX_SCHEMA)
    return t


def test_key_rows_never_start_after_the_frame():
    t = _open_gop_index()
    got = locate.key_rows(t["pts"].to_numpy(), t["keyframe_pts"].to_numpy(), t["is_keyframe"].to_numpy())
    assert got.tolist() == [0] * 6 + [6] * 6 + [12] * 6 + [18] * 6


def test_nearest_and_locate_within_tolerance():
    pts_s = np.arange(5) / FPS
    rows, err = locate.nearest(pts_s, [0.0, 0.5 / FPS, 1.4 / FPS, 9.0])
    assert rows.tolist() == [0, 0, 1, 4]  # a tie goes to the earlier frame
    assert np.allclose(err, [0, 0.5 / FPS, 0.4 / FPS, 9.0 - 4 / FPS])
    pts = np.arange(5) * 512
    assert locate.locate(pts, pts_s, [2 / FPS + 1e-5], 1e-4, path="v.mp4", episode_index=3, video_key="cam") == [2]
    with pytest.raises(lsql.FrameNotFoundError, match=r"v.mp4: no frame of camera 'cam' .* \(episode 3\)"):
        locate.locate(pts, pts_s, [2.5 / FPS], 1e-4, path="v.mp4", episode_index=3, video_key="cam")
    # the same rule without raising: -1 where no frame is within tolerance
    assert locate.rows_within(pts_s, [2 / FPS + 1e-5, 2.5 / FPS, 4 / FPS], 1e-4).tolist() == [2, -1, 4]
    assert locate.time_in_file(np.array([11.6]), np.array([0.5], np.float32)).tolist() == [12.1]


def test_packet_ranges_start_at_the_keyframe_run():
    t = _open_gop_index()
    kr = locate.key_rows(t["pts"].to_numpy(), t["keyframe_pts"].to_numpy(), t["is_keyframe"].to_numpy())
    got = locate.packet_ranges([10, 23], kr, t["byte_offset"].to_numpy(), t["byte_size"].to_numpy(), readahead=7)
    assert got == [(600_000, 1_401_000 + 7), (1_800_000, 2_301_000 + 7)]


def test_packet_ranges_vectorised_equal_the_rule_row_by_row():
    """Short spans are planned in one vectorised pass, long ones row by row: both give, for every row, the earliest
    packet from its keyframe run to the row and the end of the last packet up to ``delay`` past it."""
    rng = np.random.default_rng(5)
    for gop in (1, 2, 7, 90):  # 90: spans past the vectorised bound
        n = 400
        key_row = (np.arange(n) // gop) * gop
        size = rng.integers(50, 5000, n)
        order = np.arange(n)
        for g in range(0, n, gop):  # packets stored in decode order: B-frames' bytes after later frames' ones
            order[g + 1:g + gop] = rng.permutation(order[g + 1:g + gop])
        offset = np.empty(n, np.int64)
        offset[order] = np.concatenate([[0], np.cumsum(size[order])[:-1]])
        rows = np.unique(rng.integers(0, n, 120))
        want = [(int(offset[key_row[r]:r + 1].min()), int((offset + size)[key_row[r]:min(r + 4, n - 1) + 1].max()) + 9)
                for r in rows]
        assert locate.packet_ranges(rows, key_row, offset, size, readahead=9, delay=4) == want, gop
    assert locate.packet_ranges([], key_row, offset, size) == []


def test_packet_spans_are_packet_ranges_of_every_row():
    """The per-file table the pipeline's planner gathers from gives, row for row, what packet_ranges gives; a file
    whose keyframe runs pass the vectorised bound has no table (None: the planner asks packet_ranges per batch)."""
    rng = np.random.default_rng(9)
    for gop in (1, 3, 30):
        n = 20_000  # past one 8192-row chunk
        key_row = (np.arange(n) // gop) * gop
        size = rng.integers(50, 5000, n)
        offset = np.concatenate([[0], np.cumsum(size)[:-1]])
        starts, ends = locate.packet_spans(key_row, offset, size, readahead=11)
        assert starts.dtype == ends.dtype == np.int64 and len(starts) == n
        rows = np.arange(n)
        assert list(zip(starts.tolist(), ends.tolist())) == locate.packet_ranges(rows, key_row, offset, size,
                                                                                 readahead=11), gop
    key_row = (np.arange(500) // 100) * 100
    assert locate.packet_spans(key_row, np.arange(500) * 10, np.full(500, 10)) is None
    assert [len(a) for a in locate.packet_spans(np.zeros(0, np.int64), np.zeros(0, np.int64),
                                                np.zeros(0, np.int64))] == [0, 0]


def test_prefetch_plans_from_the_keyframe_the_decoder_seeks_to(datasets, tmp_path, monkeypatch):
    """B-frames whose recorded keyframe is presented after them: prefetch used its own copy of the keyframe rule
    (without the presentation-order correction) and planned from a later keyframe than the decoder reads (here: an
    empty packet run, a ValueError). Now it asks locate.key_rows, as the decoder does."""
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path)
    path = tmp_path / "open_gop.parquet"
    pq.write_table(_open_gop_index(), path)
    monkeypatch.setattr(video_index, "ensure_index", lambda src, rel, cache_dir: path)
    real_info = db.source.fs.info  # every file a large one (a folder stays a folder: connect lists meta/)
    monkeypatch.setattr(db.source.fs, "info", lambda p, **kw: {**real_info(p, **kw), "size": 10**9})
    m = db.manifest("SELECT index FROM frames WHERE episode_index = 0 AND frame_index IN (10, 11) ORDER BY index")
    need = prefetch.needed_ranges(db, m)
    a = prefetch.AVIO_BUFFER
    for k in db.layout.video_keys:
        rel = m[f"{k}/file"][0].as_py()
        # the container head, then frames 10 and 11 from keyframe row 6 up to DECODER_DELAY packets past each
        assert need[rel] == [(0, a), (600_000, 1_501_000 + a)], k


def test_dataset_raises_frame_not_found_for_drifted_timestamps(datasets):
    db = lsql.connect(datasets / "small20")
    m = db.manifest("SELECT index FROM frames WHERE episode_index = 2 AND frame_index < 4")
    key = "observation.images.wrist"
    col = m.column_names.index(f"{key}/from_timestamp")
    m = m.set_column(col, f"{key}/from_timestamp", pa.compute.add(m[f"{key}/from_timestamp"], 0.5 / 30))
    # db.dataset() refuses such an edited manifest (test_manifest.py); the reader's own guard behind it still holds
    with pytest.raises(lsql.ResultContractError, match=f"'{key}/from_timestamp' holds"):
        db.dataset(m)
    from lerobot_sql.torch.dataset import LeRobotSQLDataset

    ds = LeRobotSQLDataset(db.files, m)
    with pytest.raises(lsql.FrameNotFoundError, match="wrist"):
        ds[0]
    ok = LeRobotSQLDataset(db.files, m, cameras=["observation.images.front"])  # the other camera still reads
    assert ok[0]["observation.images.front"].shape == (3, 96, 128)


def test_rows_outside_their_clip_are_marked_never_served():
    """The clip guard: a clip's frames are its first row (the first frame no earlier than half a frame before
    from_timestamp) and the length - 1 after it; a row found by time outside them is OUTSIDE, as is a position
    outside the clip or past the file (frame-index alignment)."""
    pts_s = np.arange(10) / FPS
    first = locate.clip_first_rows(pts_s, [0.0, 4 / FPS + 0.4 / FPS, 4 / FPS - 0.4 / FPS], FPS)
    assert first.tolist() == [0, 4, 4]
    rows = locate.rows_within(pts_s, 4 / FPS + np.array([-1, 0, 2, 3, 7]) / FPS, 1.0)  # 1 s: any frame matches
    assert rows.tolist() == [3, 4, 6, 7, 9]
    got = locate.keep_in_clip(rows, np.full(5, 4), np.full(5, 3))
    assert got.tolist() == [locate.OUTSIDE, 4, 6, locate.OUTSIDE, locate.OUTSIDE]
    assert locate.keep_in_clip(np.array([-1, 5]), np.array([4, 4]), np.array([3, 3])).tolist() == [-1, 5]
    # frame-index alignment: the clip of 3 frames from row 4 (from_timestamp 4 / FPS)
    pos = np.array([-1, 0, 2, 3])
    assert locate.rows_by_position(pts_s, 4, pos, 3, 4 / FPS, FPS).tolist() == [locate.OUTSIDE, 4, 6, locate.OUTSIDE]
    assert locate.rows_by_position(pts_s, 8, np.array([1, 2]), 3, 8 / FPS, FPS).tolist() == [9, locate.OUTSIDE]
    # a clip whose frames are not at from_timestamp + k / fps (a 15 fps stream behind 30 fps): off the grid
    slow = np.arange(10) / 15
    assert locate.rows_by_position(slow, 0, np.array([0, 1, 2]), 3, 0.0, FPS).tolist() == [0, locate.OFF_GRID,
                                                                                           locate.OFF_GRID]
    # found by time: a frame other than the row's own on a grid clip is OFF_GRID; off-grid clips are left alone
    found = np.array([4, 6, -1, 5])
    assert locate.keep_own_frame(found, pts_s, 4, np.array([0, 1, 1, 1]), 4 / FPS, FPS).tolist() == \
        [4, locate.OFF_GRID, -1, 5]
    assert locate.keep_own_frame(np.array([0, 2]), slow, 0, np.array([0, 1]), 0.0, FPS).tolist() == [0, 2]
    assert locate.check_align("frame_index") == "frame_index"
    with pytest.raises(ValueError, match="'timestamp'.*'frame_index'"):
        locate.check_align("frames")



def test_a_frame_outside_the_episode_clip_is_never_served_whatever_the_tolerance(datasets, framecode, tmp_path):
    """A time just before episode 5's clip (its first sample at -1/fps: the frame there is episode 4's last) in a
    manifest handed to dataset(), read with tolerance_s=1.0 (any frame within a second would do): the item raises
    DatasetFormatError naming the mp4, camera and episode, in ds[i] and in batches, instead of serving episode 4's
    frame. The same for a delta_timestamps camera whose neighbour row (the data file rewritten after the manifest was
    made) sits outside the clip. The other samples are their own frames."""
    import shutil

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    key = "observation.images.front"
    m = db.manifest("SELECT index FROM frames WHERE episode_index = 5 AND frame_index < 3 ORDER BY index")
    col = m.column_names.index("timestamp")
    ts = m["timestamp"].to_numpy().copy()
    ts[0] = np.float32(-1 / 30)
    bad = m.set_column(col, "timestamp", pa.array(ts, pa.float32()))
    # db.dataset() refuses such an edited manifest (test_manifest.py); the reader's own guard behind it still holds
    with pytest.raises(lsql.ResultContractError, match="column 'timestamp' holds"):
        db.dataset(bad, tolerance_s=1.0)
    from lerobot_sql.torch.dataset import LeRobotSQLDataset

    ds = LeRobotSQLDataset(db.files, bad, tolerance_s=1.0, return_uint8=True)
    for read in (lambda: ds[0], lambda: ds.__getitems__([1, 0])):
        with pytest.raises(lsql.DatasetFormatError) as e:
            read()
        msg = str(e.value)
        for needle in ("file-000.mp4", repr(key), "episode 5", "clip is frames",
                       "never served", "align=\"frame_index\""):
            assert needle in msg, (needle, msg)
    for j in (1, 2):
        assert framecode.verify_frame(ds[j][key], 5, j, key)["ok"]
    # a delta camera: episode 5's first row in the data file moves to -1/fps after the manifest was made
    delta = {key: [-1 / 30, 0.0]}
    m2 = db.manifest("SELECT index FROM frames WHERE episode_index = 5 AND frame_index IN (1, 2) ORDER BY index")
    data = root / "data/chunk-000/file-000.parquet"
    t = pq.read_table(data)
    r = int(np.flatnonzero(t["episode_index"].to_numpy() == 5)[0])
    ts = t["timestamp"].to_numpy().copy()
    ts[r] = np.float32(-1 / 30)
    pq.write_table(t.set_column(t.column_names.index("timestamp"), "timestamp", pa.array(ts, pa.float32())), data)
    db2 = lsql.connect(root, cache_dir=tmp_path / "cache")
    with pytest.raises(lsql.DatasetFormatError, match="episode 5.*never served"):  # db.dataset() re-resolves it
        db2.dataset(m2, tolerance_s=1.0, delta_timestamps=delta)
    ds = LeRobotSQLDataset(db2.files, m2, tolerance_s=1.0, delta_timestamps=delta, return_uint8=True)
    for read in (lambda: ds[0], lambda: ds.__getitems__([0])):
        with pytest.raises(lsql.DatasetFormatError, match="episode 5.*never served"):
            read()
    item = ds[1]  # frame 2: its neighbours are frames 1 and 2, inside the clip
    assert [framecode.verify_frame(item[key][k], 5, f, key)["ok"] for k, f in enumerate((1, 2))] == [True, True]
