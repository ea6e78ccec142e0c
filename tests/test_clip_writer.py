"""lerobot_sql.export.clip_writer: a window of one camera as a standalone mp4. Copied clips hold the source's own
packets (decoded, bit for bit the source's frames of the window) with an edit list that hides the pre-roll; other
codecs, depth maps and windows cut inside reordered frames are encoded again (frames within a codec tolerance)."""

from __future__ import annotations

import io
import struct
from fractions import Fraction

import av
import numpy as np
import pytest

from helpers import DATASETS, mp4_boxes, mp4_child
from lerobot_sql._readers import video_index
from lerobot_sql._readers.decode import DecoderPool
from lerobot_sql._storage.source import open_source
from lerobot_sql.export.clip_writer import copy_reason, write_clip

FRONT = "videos/observation.images.front/chunk-000/file-000.mp4"
DEPTH = "videos/observation.images.depth/chunk-000/file-000.mp4"


class _pool:
    """A DecoderPool closed on exit."""

    def __init__(self, src, **kw):
        self.p = DecoderPool(src, **kw)

    def __enter__(self) -> DecoderPool:
        return self.p

    def __exit__(self, *exc):
        self.p.close()


def _index(src, rel, tmp_path):
    return video_index.FrameIndex.load(video_index.ensure_index(src, rel, tmp_path))


def _decode(data: bytes) -> tuple[list[np.ndarray], list[int], object]:
    """(RGB frames, pts, the opened container) of an mp4's bytes, as FFmpeg plays it."""
    c = av.open(io.BytesIO(data))
    frames, pts = [], []
    for f in c.decode(video=0):
        frames.append(f.to_ndarray(format="rgb24"))
        pts.append(int(f.pts))
    return frames, pts, c


def _source_frames(path, a: int, b: int) -> list[np.ndarray]:
    """Frames ``a..b`` (presentation order) of an mp4, decoded from its start."""
    out = []
    with av.open(str(path)) as c:
        for f in c.decode(video=0):
            out.append(f.to_ndarray(format="rgb24"))
            if len(out) > b + 4:  # a few past b: a decoder outputs reordered frames late
                break
    return out[a:b + 1]


def _edit_list(data: bytes) -> list[tuple[int, int]]:
    """(segment duration in movie time units, media time in track units) of each edit of the one track."""
    elst = mp4_child(mp4_boxes(data), b"moov", b"trak", b"edts")
    body = next(b for t, b in elst if t == b"elst")
    version, n = body[0], struct.unpack_from(">I", body, 4)[0]
    fmt, size = (">Ii", 12) if version == 0 else (">Qq", 20)  # then media_rate (4 bytes)
    return [struct.unpack_from(fmt, body, 8 + i * size)[:2] for i in range(n)]


@pytest.mark.parametrize("name", ["small20", "h264_20"])
@pytest.mark.parametrize("ra", [31, 30])  # 31: mid-GOP (one frame of pre-roll); 30: on a keyframe
def test_copied_window_plays_from_its_first_frame_for_its_length(name, ra, tmp_path):
    src = open_source(DATASETS / name)
    index = _index(src, FRONT, tmp_path)
    rb = ra + 59
    with _pool(src) as pool:
        clip = write_clip(src, index, ra, rb, 30.0, pool=pool)
    assert clip.copied and clip.reason is None and clip.frames == 60 and clip.duration_s == 2.0
    assert clip.preroll == ra - int(index.key_row[ra]) == ra % 2
    frames, pts, c = _decode(clip.mp4)
    stream = c.streams.video[0]
    # the edit list hides the pre-roll: the first frame shown is the window's, at time 0, and the clip lasts 60 frames
    assert pts[0] == 0 and len(frames) == 60, (pts[:3], len(frames))
    assert c.duration / 1e6 == pytest.approx(2.0, abs=1 / 30 / 2)
    assert float(stream.time_base * (pts[-1] - pts[0])) == pytest.approx(59 / 30)
    want = _source_frames(DATASETS / name / FRONT, ra, rb)
    for got, exp in zip(frames, want):
        np.testing.assert_array_equal(got, exp)  # the source's own packets: bit for bit
    duration, media_time = _edit_list(clip.mp4)[-1]
    assert media_time == clip.preroll * 512  # one frame is 512 units of 1/15360 s at 30 fps


def test_a_depth_map_is_encoded_again_as_8bit_gray_h264(tmp_path):
    src = open_source(DATASETS / "depth4")
    index = _index(src, DEPTH, tmp_path)
    with _pool(src, gray={DEPTH}) as pool:
        codes = pool.decode_chw(index, np.arange(3, 13))  # (10, 1, H, W) uint16, 12-bit
        clip = write_clip(src, index, 3, 12, 30.0, pool=pool, gray=True)
    assert not clip.copied and clip.codec == "h264" and "depth map (hevc gray12le)" in clip.reason
    frames, pts, c = _decode(clip.mp4)
    assert len(frames) == 10 and pts[0] == 0
    assert c.duration / 1e6 == pytest.approx(10 / 30, abs=1 / 60)
    want = (codes[:, 0] >> 4).astype(np.float64)
    got = np.stack([f[..., 0] for f in frames]).astype(np.float64)[:, :want.shape[1], :want.shape[2]]
    # gray g (the code's top 8 bits) comes back as RGB (g, g, g), x264 at crf 20 within a few levels
    assert np.abs(got - want).mean() < 3.0


def test_reencode_gives_h264_of_the_same_frames(tmp_path):
    src = open_source(DATASETS / "small20")
    index = _index(src, FRONT, tmp_path)
    with _pool(src) as pool:
        clip = write_clip(src, index, 31, 45, 30.0, pool=pool, reencode=True)
    assert not clip.copied and clip.codec == "h264" and clip.reason == "re-encoding was asked for"
    frames, pts, _ = _decode(clip.mp4)
    want = _source_frames(DATASETS / "small20" / FRONT, 31, 45)
    assert len(frames) == 15 and pts[0] == 0
    assert max(np.abs(g.astype(int) - w.astype(int)).mean() for g, w in zip(frames, want)) < 4.0


def test_a_window_cut_inside_reordered_frames_is_encoded_again(tmp_path):
    """libx264's default B-frames: a window ending on a frame that is decoded after a later one cannot be copied
    without frames past it, so it is encoded again, with the source's frames."""
    root = tmp_path / "ds"
    (root / "videos").mkdir(parents=True)
    yy, xx = np.mgrid[0:48, 0:64]
    with av.open(str(root / "videos" / "b.mp4"), "w") as out:
        st = out.add_stream("libx264", rate=30)
        st.width, st.height, st.pix_fmt = 64, 48, "yuv420p"
        st.options = {"bf": "3", "g": "30", "crf": "18"}
        for j in range(60):  # a smooth pattern moving a pixel a frame: each frame tells which it is
            v = 127 + 100 * np.sin((xx + j) / 6.0) * np.cos(yy / 9.0)
            img = np.stack([v, np.roll(v, 7, axis=1), 255 - v], -1).astype(np.uint8)
            for p in st.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(p)
        for p in st.encode(None):
            out.mux(p)
    src = open_source(root)
    index = _index(src, "videos/b.mp4", tmp_path)
    with av.open(str(root / "videos" / "b.mp4")) as c:
        decode_order = [int(p.pts) for p in c.demux(video=0) if p.pts is not None]
    # a frame whose packet comes after a later frame's packet (a B-frame), as the window's last frame
    pos = {p: k for k, p in enumerate(decode_order)}
    rb = next(r for r in range(2, 28) if pos[int(index.pts[r + 1])] < pos[int(index.pts[r])])
    with _pool(src) as pool:
        clip = write_clip(src, index, 1, rb, 30.0, pool=pool)
    assert not clip.copied and "B-frames" in clip.reason
    frames, pts, _ = _decode(clip.mp4)
    src_frames = _source_frames(root / "videos" / "b.mp4", 0, rb + 1)
    assert len(frames) == rb and pts[0] == 0
    for j, g in enumerate(frames):  # each frame is its source frame (x264's loss on this small pattern: < 8 levels)
        err = [np.abs(g.astype(int) - w.astype(int)).mean() for w in src_frames]
        assert int(np.argmin(err)) == j + 1 and err[j + 1] < 8.0, (j, err)
    with _pool(src) as pool:  # a window not cut inside the reordering is copied
        whole = write_clip(src, index, 0, len(index.pts) - 1, 30.0, pool=pool)
    assert whole.copied


def test_which_codecs_are_copied():
    assert copy_reason("h264", "yuv420p") is None and copy_reason("av1", "yuv420p") is None
    assert copy_reason("vp9", "yuv420p") is None
    assert "platform decoder" in copy_reason("hevc", "yuv420p")
    assert "yuv444p" in copy_reason("h264", "yuv444p") and "yuv420p10le" in copy_reason("av1", "yuv420p10le")
    assert "not a codec browsers play" in copy_reason("mpeg4", "yuv420p")


def test_rows_outside_the_file_are_refused(tmp_path):
    src = open_source(DATASETS / "small20")
    index = _index(src, FRONT, tmp_path)
    with _pool(src) as pool, pytest.raises(ValueError, match=r"frames 5\.\.4 are not frames of the file"):
        write_clip(src, index, 5, 4, 30.0, pool=pool)
    assert Fraction(index.time_base) == Fraction(1, 15360)
