"""Decoding (lerobot_sql/_readers/decode.py): exact frames in any order, forward reads without seeks, planar and
packed conversion alike, fork safety of the frame path, and the frame-size checks at decoder open."""

from __future__ import annotations

import os
import shutil

import av
import numpy as np
import pytest
import torch

import lerobot_sql as lsql
from helpers import data_root, decode_planar_and_packed
from lerobot_sql._readers import decode, video_index
from lerobot_sql._storage.source import open_source

# the same files as test_video_index.py

CASES = [("small20", "videos/observation.images.front/chunk-000/file-000.mp4"),    # AV1, sample-table path
         ("h264_20", "videos/observation.images.wrist/chunk-000/file-000.mp4"),    # H.264 with B-frames: demux path
         ("g1_real_v30", "videos/observation.images.cam_high/chunk-000/file-000.mp4")]


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
def test_decoder_pool_reads_exact_frames_in_any_order(tmp_path, name, rel):
    src = open_source(data_root(name))
    index = video_index.FrameIndex.load(video_index.ensure_index_arrow(src, rel, tmp_path))
    n = min(len(index.pts), 300)  # the file's start is enough, and keeps the test fast
    truth = _decode_all(data_root(name) / rel, limit=n + 8)
    rng = np.random.default_rng(0)
    pool = decode.DecoderPool(src, max_open=2)
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


def test_depth_file_decodes_to_gray12le_codes_in_any_order(datasets, tmp_path):
    """A ``gray`` file of the pool (depth4's HEVC gray12le depth video, B-frames) gives lerobot 0.6's
    ``to_ndarray(format="gray12le")`` codes: uint16 (n, 1, H, W), 0..4095, exact in any order (PyAV 15 and 18);
    the same file outside ``gray`` is still RGB."""
    rel = "videos/observation.images.depth/chunk-000/file-000.mp4"
    src = open_source(datasets / "depth4")
    index = video_index.FrameIndex.load(video_index.ensure_index_arrow(src, rel, tmp_path))
    with av.open(str(datasets / "depth4" / rel)) as c:
        truth = {f.pts: f.to_ndarray(format="gray12le") for f in c.decode(video=0)}
    assert len(truth) == len(index.pts) == 72
    pool = decode.DecoderPool(src, gray={rel})
    for rows in (np.arange(72), np.random.default_rng(0).integers(0, 72, 30), np.array([71, 0, 40, 40, 39])):
        frames = pool.decode_chw(index, rows)
        assert frames.dtype == np.uint16 and frames.shape == (len(rows), 1, 48, 64)
        assert frames.max() <= 4095 and frames.max() > 255  # 12-bit codes, not 8-bit luma
        for j, r in enumerate(rows):
            np.testing.assert_array_equal(frames[j, 0], truth[int(index.pts[r])], err_msg=f"row {r}")
    pool.close()
    assert decode.DecoderPool(src).decode_chw(index, np.array([3])).shape == (1, 3, 48, 64)


def test_forward_reads_do_not_seek(datasets, tmp_path):
    src = open_source(datasets / "small20")
    rel = CASES[0][1]
    index = video_index.FrameIndex.load(video_index.ensure_index_arrow(src, rel, tmp_path))
    pool = decode.DecoderPool(src, reach=2)
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
    a, b = decode_planar_and_packed(src, CASES[2][1], tmp_path)
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
    monkeypatch.setattr(decode, "MAX_PIXEL_RATIO", 4, raising=False)
    db = lsql.connect(wrist_320x240, cache_dir=tmp_path / "cache")
    ds = db.dataset("SELECT index FROM frames WHERE episode_index = 0 ORDER BY index LIMIT 4", cameras=[
        "observation.images.wrist"])
    with pytest.raises(lsql.DatasetFormatError, match=r"observation\.images\.wrist/chunk-000/file-000\.mp4: video "
                       r"frames of camera 'observation\.images\.wrist' are 240x320 \(HxW\), info\.json declares "
                       r"96x128 \(HxW\); refused as a decode bomb"):
        ds[0]
    monkeypatch.setattr(decode, "MAX_PIXEL_RATIO", 64)
    monkeypatch.setattr(decode, "MAX_SIDE", 300)  # the absolute bound, whatever info.json says
    with pytest.raises(lsql.DatasetFormatError, match="refused as a decode bomb"):
        decode.check_resolution("x.mp4", (240, 320), "cam", None)
    decode.check_resolution("x.mp4", (240, 300), "cam", (240, 300))  # within both bounds: no error


@pytest.mark.parametrize("name,rel", CASES[:2])
def test_decode_every_frame_outputs_the_index_pts_in_order_and_never_raises(name, rel, tmp_path):
    """The doctor's full pass: a sound file (AV1; H.264 with B-frames, reordered) gives exactly its index's pts in
    increasing order; the same file cut in half gives its first frames without raising (dav1d refuses the packet
    the cut goes through, an error; FFmpeg's H.264 decoder takes it silently); a file that is gone is a result with
    the open's error."""
    src = open_source(data_root(name))
    want = video_index.FrameIndex.load(video_index.ensure_index(src, rel, tmp_path / "cache")).pts
    got = decode.decode_every_frame(src, rel)
    assert got.pts.tolist() == want.tolist() and got.error is None and got.n_errors == 0 and not got.no_pts
    assert got.time_base == video_index.FrameIndex.load(video_index.ensure_index(src, rel, tmp_path / "cache")).time_base
    cut = tmp_path / "cut"
    shutil.copytree(data_root(name), cut)
    os.truncate(cut / rel, (cut / rel).stat().st_size // 2)
    short = decode.decode_every_frame(open_source(cut), rel)
    assert 0 < len(short.pts) < len(want) and set(short.pts.tolist()) <= set(want.tolist())
    if name == "small20":
        assert short.error.startswith("InvalidDataError") and short.n_errors == 1
        assert short.error_pts in want and short.frames_before_error == len(short.pts)
    (cut / rel).unlink()
    gone = decode.decode_every_frame(open_source(cut), rel)
    assert len(gone.pts) == 0 and gone.time_base is None and gone.error.startswith("MissingFileError")


def test_the_decoder_refuses_a_file_of_two_video_streams_even_through_an_older_index(datasets, tmp_path):
    """The decoder checks the file it opens, not only the index: an index entry cached before the rule (here the
    front file's own index, as it stood before the wrist stream was muxed in front of it) would otherwise decode
    stream 0, the wrist camera, as front frames."""
    import dataclasses

    from helpers import FRONT_MP4, WRIST_MP4, muxed_copy
    from lerobot_sql.errors import DatasetFormatError

    root = muxed_copy(datasets / "small20", tmp_path / "two", [WRIST_MP4, FRONT_MP4])
    index = video_index.FrameIndex.load(video_index.ensure_index_arrow(open_source(datasets / "small20"), FRONT_MP4,
                                                                       tmp_path / "c"))
    index = dataclasses.replace(index, path=FRONT_MP4)
    with pytest.raises(DatasetFormatError, match=rf"{FRONT_MP4}: holds 2 video streams.*-map 0:v:N"):
        decode.DecoderPool(open_source(root)).decode_chw(index, np.array([0, 5]))


def test_decoder_pool_is_bounded_by_the_bytes_its_open_files_cost(datasets, tmp_path, monkeypatch):
    """The pool closes the least recently used files once their estimated cost (the demuxer's index, ~48 bytes per
    frame, and the decoder's frames) passes its byte budget, not only past ``max_open`` files (issue 38: a count of
    16 thrashed over 39 small-frame files, and would hold far more memory for 1080p ones); the file just used stays
    open even when it alone is over the budget; the frames stay exact however often files are closed."""
    src = open_source(datasets / "multifile60")
    rels = sorted(str(p.relative_to(datasets / "multifile60"))
                  for p in (datasets / "multifile60/videos").rglob("*.mp4"))[:3]
    assert len(rels) == 3
    idx = {r: video_index.FrameIndex.load(video_index.ensure_index_arrow(src, r, tmp_path)) for r in rels}
    truth = {r: _decode_all(datasets / "multifile60" / r, limit=4) for r in rels}
    probe = decode.DecoderPool(src, max_open=64, max_bytes=1 << 40)
    costs = {}
    for r in rels:
        probe.decode_chw(idx[r], np.array([0]))
        costs[r] = probe._open[r].cost
        with av.open(str(datasets / "multifile60" / r)) as c:  # the estimate: index + decoder frames
            s = c.streams.video[0]
            assert costs[r] == s.frames * decode.INDEX_BYTES_PER_FRAME + \
                s.codec_context.width * s.codec_context.height * 3 // 2 * (decode.DECODER_FRAMES + 1)
    assert probe.stats()["open_files"] == 3 and probe.stats()["open_bytes"] == sum(costs.values())
    probe.close()
    assert probe.stats()["open_bytes"] == 0

    two = sum(sorted(costs.values())[1:])  # any two fit, never three
    pool = decode.DecoderPool(src, max_open=64, max_bytes=two)  # room for two of them
    for k in range(9):
        r = rels[k % 3]
        frames = pool.decode_chw(idx[r], np.array([k % 4]))
        np.testing.assert_array_equal(frames[0], truth[r][int(idx[r].pts[k % 4])])
        st = pool.stats()
        assert st["open_bytes"] <= two and st["open_files"] <= 2 and r in pool._open
    assert list(pool._open) == [rels[1], rels[2]]  # the least recently used went first
    tiny = decode.DecoderPool(src, max_open=64, max_bytes=1)  # over budget alone: the one just used stays
    tiny.decode_chw(idx[rels[0]], np.array([1]))
    tiny.decode_chw(idx[rels[1]], np.array([1]))
    assert list(tiny._open) == [rels[1]]
    for p in (pool, tiny):
        p.close()


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "abc"])
def test_a_decoder_budget_that_cannot_work_is_named(monkeypatch, value):
    monkeypatch.setenv("LSQL_DECODER_MB", value)
    with pytest.raises(ValueError, match=r"LSQL_DECODER_MB=.*must be a finite number > 0"):
        decode.decoder_budget()
    monkeypatch.setenv("LSQL_DECODER_MB", "1.5")
    assert decode.decoder_budget() == int(1.5 * (1 << 20))


def test_a_sync_sample_that_is_no_keyframe_is_refused_not_decoded_into_garbage(tmp_path):
    """An mp4 whose sample table calls P-frames keyframes (here: no stss box, which by ISO 14496-12 makes every
    sample a sync sample) made a seek land on a P-frame and decode it from nothing: MPEG-4 part 2 gave garbage
    pictures with no error on PyAV 15 and 18 (hostile review 19). The first frame after a seek must be a keyframe:
    else VideoDecodeError naming the file; frames reached by decoding forward from a real keyframe stay exact."""
    import av

    from helpers import mp4_boxes, mp4_child, write_mp4_boxes
    from lerobot_sql.errors import VideoDecodeError

    path = tmp_path / "v.mp4"
    with av.open(str(path), "w") as c:  # a keyframe every 10 frames, P-frames between (a block moving right)
        s = c.add_stream("mpeg4", rate=15, options={"g": "10", "bf": "0", "sc_threshold": "1000000000"})
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for k in range(30):
            img = np.full((48, 64, 3), 100, np.uint8)
            img[16:32, 2 * k:2 * k + 8] = 250
            c.mux(s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        c.mux(s.encode())
    with av.open(str(path)) as c:
        assert [p.is_keyframe for p in c.demux(video=0)][8:12] == [False, False, True, False]
    with av.open(str(path)) as c:
        truth = [f.to_ndarray(format="rgb24").transpose(2, 0, 1) for f in c.decode(video=0)]
    top = mp4_boxes(path.read_bytes())
    stbl = mp4_child(top, b"moov", b"trak", b"mdia", b"minf", b"stbl")
    stbl[:] = [b for b in stbl if b[0] != b"stss"]
    path.write_bytes(write_mp4_boxes(top))
    src = open_source(tmp_path)
    index = video_index.FrameIndex.load(video_index.ensure_index_arrow(src, "v.mp4", tmp_path / "cache"))
    assert int(index.key_row[15]) == 15  # the table's word: every frame a keyframe
    pool = decode.DecoderPool(src, max_open=2)
    with pytest.raises(VideoDecodeError, match=r"v\.mp4: the frame at pts=\d+ that a seek to keyframe .* is not a "
                                               r"keyframe"):
        pool.decode_chw(index, np.array([15]))
    got = pool.decode_chw(index, np.array([10, 11, 12, 13]))  # from a real keyframe, forward: exact
    for j, r in enumerate((10, 11, 12, 13)):
        np.testing.assert_array_equal(got[j], truth[r])
    pool.close()
