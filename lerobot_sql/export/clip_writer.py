"""One camera's window as a small mp4 a browser plays: the source's own packets, an edit list to start on time.

The window is frames ``ra..rb`` of the camera's mp4 (index rows, :mod:`lerobot_sql._readers.locate`). Its packets
from the keyframe at or before ``ra`` through ``rb`` are copied as they are (:func:`.video_writer.copy_packets`,
the export's stream copy; nothing is decoded), their pts shifted so that frame ``ra`` is at 0: the pre-roll
(keyframe .. ``ra - 1``) gets negative times, and FFmpeg's mp4 muxer writes an edit list (``elst``: media time =
the pre-roll's length) for it. A player decodes the pre-roll and shows from frame ``ra``; the file's duration is the
window's, ``(rb - ra + 1) / fps`` (checked in Chromium: ``tests/test_view.py``). lerobot's GOP is 2 frames, so the
pre-roll is at most one frame.

Which codecs are copied (:data:`PLAYABLE`): H.264, AV1 and VP9 in 8-bit 4:2:0, what Chrome/Chromium, Edge and Firefox
play without a platform decoder (Safari: H.264 everywhere, AV1 only on hardware that decodes it). HEVC is not:
Chromium plays it only through a platform (hardware) decoder, Firefox not at all (Debian's Chromium 156 here does not
load lerobot's HEVC depth streams, gray12le Rext, nor an 8-bit Main one); nor are other pixel formats. Those windows
are decoded (the frames the dataset reads, :class:`lerobot_sql._readers.decode.DecoderPool`) and encoded again with
libx264 (8-bit 4:2:0, which every browser plays); a depth map's 12-bit codes are shown as gray, 4095 white. So is a
window whose packets' decode order crosses its end (B-frames reordered past the cut), where a copy would need frames
after the window.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
from fractions import Fraction

import av
import numpy as np

from .._readers import video_index
from .._readers.decode import DecoderPool
from ..errors import VideoDecodeError
from .video_writer import copy_packets, grid_dts, reorder_depth

# FFmpeg codec names copied as they are, with their pixel formats (8-bit 4:2:0): see the module docstring.
PLAYABLE = {"h264": {"yuv420p", "yuvj420p"}, "av1": {"yuv420p"}, "vp9": {"yuv420p"}}
REENCODER = "libx264"  # plays in every browser; crf and preset: a page to look at, not to archive
REENCODE_OPTIONS = {"crf": "20", "preset": "veryfast"}


@dataclasses.dataclass(frozen=True)
class ClipVideo:
    """A window of one camera as a standalone mp4.

    Attributes:
        mp4: the file's bytes.
        frames: the window's frames (``rb - ra + 1``); the file plays exactly these, from its time 0.
        duration_s: ``frames / fps``, seconds.
        codec: FFmpeg name of the codec in the file (``av1``, ``h264`` ...).
        copied: the source's packets were copied (True) or the frames decoded and encoded again (False).
        preroll: frames before the window decoded by the player but not shown (copied clips; 0 otherwise).
        reason: why the window was encoded again (None when copied).
    """

    mp4: bytes
    frames: int
    duration_s: float
    codec: str
    copied: bool
    preroll: int = 0
    reason: str | None = None


def copy_reason(codec: str, pix_fmt: str | None) -> str | None:
    """Why a stream of ``codec`` (FFmpeg name) and ``pix_fmt`` cannot be copied into a page, or None if it can."""
    fmts = PLAYABLE.get(codec)
    if fmts is None:
        return (f"{codec} does not play in browsers without a platform decoder (Chromium on Linux, Firefox)"
                if codec == "hevc" else f"{codec} is not a codec browsers play")
    if pix_fmt not in fmts:
        return f"{codec} in {pix_fmt} (browsers play {', '.join(sorted(fmts))})"
    return None


def write_clip(src, index: video_index.FrameIndex, ra: int, rb: int, fps: float, *, pool: DecoderPool,
               gray: bool = False, reencode: bool = False) -> ClipVideo:
    """Frames ``ra..rb`` (rows of ``index``, the mp4's frame index) of one camera as a standalone mp4.

    Args:
        src: the dataset's :class:`~lerobot_sql._storage.source.Source` (a remote file: only the packets read are
            fetched; the caller may fetch them ahead in one round).
        fps: the dataset's frames per second (the window's length is ``(rb - ra + 1) / fps``).
        pool: decoders for a window encoded again (the dataset's frames exactly).
        gray: the camera is a depth map (12-bit gray codes): always encoded again.
        reencode: encode every window again with libx264 (for browsers without AV1), even a playable one.

    Returns:
        :class:`ClipVideo`.

    Raises:
        VideoDecodeError: the mp4 cannot be demuxed or decoded there, or no libx264 in this PyAV.
        MissingFileError: the mp4 is gone.
    """
    if not 0 <= ra <= rb < len(index.pts):
        raise ValueError(f"{index.path}: frames {ra}..{rb} are not frames of the file (0..{len(index.pts) - 1})")
    frames = rb - ra + 1
    inp = video_index.open_container(src, index.path)
    try:
        stream = inp.streams.video[0]
        cc = stream.codec_context
        codec = cc.codec.canonical_name if cc.codec is not None else cc.name
        pix_fmt = cc.format.name if cc.format else None
        reason = f"a depth map ({codec} {pix_fmt}): its 12-bit codes shown as 8-bit gray" if gray else \
            "re-encoding was asked for" if reencode else copy_reason(codec, pix_fmt)
        if reason is None:
            k = int(index.key_row[ra])
            src_fd = Fraction(1) / Fraction(fps).limit_denominator(1001) / Fraction(index.time_base)
            run = copy_packets(inp, stream, index, k, rb, src_fd)
            if run is not None:
                return ClipVideo(_mux_copy(stream, run, int(index.pts[ra]), src_fd), frames, frames / fps, codec,
                                 True, preroll=ra - k)
            reason = "frames after the window are decoded before frames of it (B-frames)"
    finally:
        inp.close()
    # a chunk of frames at a time: a clip held whole was (frames x H x W x 3) bytes, 15 GB for ten minutes at 480p,
    # where the page's byte bound counts compressed packets (hostile review 20, M5)
    chunks = (pool.decode_chw(index, np.arange(a, min(a + _CHUNK, rb + 1))) for a in range(ra, rb + 1, _CHUNK))
    return ClipVideo(_encode(chunks, fps), frames, frames / fps, "h264", False, reason=reason)


_CHUNK = 32  # frames decoded at a time for a re-encoded clip


def _mux_copy(in_stream, run, base: int, src_fd: Fraction) -> bytes:
    """The copied ``run`` (packet, pts, end; source time base, decode order) as an mp4, pts shifted by ``-base``
    (the window's first frame at 0, the pre-roll before it: the muxer's edit list hides it)."""
    buf = io.BytesIO()
    # no "faststart": it re-reads the output by its file name, which an in-memory file has not; a data: URL is
    # complete before the player parses it, so where the moov sits does not matter
    out = av.open(buf, "w", format="mp4")
    try:
        st = out.add_stream_from_template(in_stream, opaque=True)
        st.time_base = in_stream.time_base
        out.start_encoding()
        lag = reorder_depth([p for _, p, _ in run])
        shown = sorted(p - base for _, p, _ in run)
        for j, (pkt, pts, end) in enumerate(run):
            pkt.stream, pkt.time_base = st, st.time_base
            pkt.pts, pkt.dts = pts - base, grid_dts(shown, j - lag, src_fd)
            pkt.duration = max(int(end) - int(pts), 1)  # the last sample must not last 0 (see VideoWriter._mux_run)
            out.mux(pkt)
    finally:
        out.close()
    return buf.getvalue()


def _encode(chunks, fps: float) -> bytes:
    """The frames of ``chunks`` (arrays (n, 3, H, W) uint8 RGB, or (n, 1, H, W) uint16 12-bit depth codes, in
    order; a single array is one chunk) as an H.264 mp4 at ``fps`` (8-bit 4:2:0; an odd width or height loses its
    last column or row, as 4:2:0 needs even sizes)."""
    chunks = iter([chunks] if isinstance(chunks, np.ndarray) else chunks)
    first = next(chunks)
    _, c, h, w = first.shape
    rate = Fraction(fps).limit_denominator(1001)
    buf = io.BytesIO()
    out = av.open(buf, "w", format="mp4")
    try:
        try:
            st = out.add_stream(REENCODER, rate=rate)
        except (av.error.FFmpegError, ValueError) as e:
            raise VideoDecodeError(f"no {REENCODER} encoder in this PyAV build: a clip of a codec browsers do not "
                                   "play cannot be shown; leave that camera out (cameras=[...])") from e
        st.width, st.height, st.pix_fmt = w - w % 2, h - h % 2, "yuv420p"
        st.options = dict(REENCODE_OPTIONS)
        j = 0
        for frames in itertools.chain([first], chunks):
            for x in frames:
                if c == 1:  # 12-bit codes -> 8-bit gray
                    f = av.VideoFrame.from_ndarray((x[0] >> 4).astype(np.uint8), format="gray")
                else:
                    f = av.VideoFrame.from_ndarray(np.ascontiguousarray(x.transpose(1, 2, 0)), format="rgb24")
                f = f.reformat(width=st.width, height=st.height, format="yuv420p")
                f.pts = j
                j += 1
                for pkt in st.encode(f):
                    out.mux(pkt)
        for pkt in st.encode(None):
            out.mux(pkt)
    finally:
        out.close()
    return buf.getvalue()
