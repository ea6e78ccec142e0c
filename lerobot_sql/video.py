"""Video access: a per-file frame index built by demuxing (no decoding), and a pool of reusable PyAV decoders.

The index of an mp4 has one row per frame: its pts (stream time-base units and seconds), whether it is a keyframe,
and the pts of the keyframe it depends on, plus its packet's byte range. It is cached as one small Parquet file per
mp4, keyed by the file's identity (size + mtime, or ETag), and exposed in SQL as ``video_frames``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import cache
from .errors import FrameNotFoundError, MissingFileError, VideoDecodeError
from .source import Source

INDEX_VERSION = 1
INDEX_SCHEMA = pa.schema([
    ("frame", pa.int64()),          # ordinal of the frame in the file, in presentation order
    ("pts", pa.int64()),            # presentation time, stream time-base units
    ("pts_s", pa.float64()),        # presentation time, seconds
    ("is_keyframe", pa.bool_()),
    ("keyframe_pts", pa.int64()),   # pts of the keyframe a decoder must start from to reach this frame
    ("byte_offset", pa.int64()),    # packet position in the file (-1 if unknown)
    ("byte_size", pa.int64()),      # packet size in bytes
])


def _open_container(src: Source, rel: str):
    local = src.local_path(rel)
    try:
        if local is not None:
            if not os.path.exists(local):
                raise MissingFileError(f"{local}: video file not found (referenced by meta/episodes); "
                                       "download the dataset's videos/ folder or re-fetch this file")
            return av.open(local)
        return av.open(src.open(rel))
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{src.path(rel)}: PyAV cannot open this video ({e}); the file may be truncated "
                               "or corrupt, re-fetch it from the dataset's source") from e


def _demux_index(src: Source, rel: str) -> pa.Table:
    container = _open_container(src, rel)
    try:
        stream = container.streams.video[0]
        rows = []
        last_key = None
        for pkt in container.demux(stream):
            if pkt.pts is None:
                continue
            if pkt.is_keyframe:
                last_key = pkt.pts
            rows.append((pkt.pts, bool(pkt.is_keyframe), last_key if last_key is not None else pkt.pts,
                         -1 if pkt.pos is None else pkt.pos, pkt.size))
        tb = stream.time_base
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{src.path(rel)}: demuxing failed ({e}); the file may be corrupt") from e
    finally:
        container.close()
    if not rows:
        raise VideoDecodeError(f"{src.path(rel)}: the video stream holds no frames")
    rows.sort(key=lambda r: r[0])
    pts = np.array([r[0] for r in rows], np.int64)
    return pa.table({
        "frame": np.arange(len(rows), dtype=np.int64),
        "pts": pts,
        "pts_s": pts * float(tb),
        "is_keyframe": [r[1] for r in rows],
        "keyframe_pts": np.array([r[2] for r in rows], np.int64),
        "byte_offset": np.array([r[3] for r in rows], np.int64),
        "byte_size": np.array([r[4] for r in rows], np.int64),
    }, schema=INDEX_SCHEMA.with_metadata({"time_base": f"{tb.numerator}/{tb.denominator}", "path": rel}))


def index_path(src: Source, rel: str, cache_dir: Path) -> Path:
    """Where the cached index of ``rel`` lives (it may not exist yet)."""
    return cache_dir / "video_index" / f"{cache.key(src.url, rel, src.identity(rel), INDEX_VERSION)}.parquet"


def ensure_index(src: Source, rel: str, cache_dir: Path) -> Path:
    """Build (once) and return the cached index Parquet of video file ``rel``.

    Raises:
        MissingFileError: the mp4 does not exist.
        VideoDecodeError: PyAV cannot demux it.
    """
    path = index_path(src, rel, cache_dir)
    return cache.build_once(path, lambda tmp: pq.write_table(_demux_index(src, rel), tmp))


@dataclasses.dataclass(frozen=True)
class FrameIndex:
    """The loaded index of one mp4 (see module docstring); arrays are sorted by pts."""

    path: str
    time_base: Fraction
    pts: np.ndarray
    pts_s: np.ndarray
    keyframe_pts: np.ndarray

    @classmethod
    def load(cls, index_file: Path) -> "FrameIndex":
        t = pq.read_table(index_file)
        meta = t.schema.metadata
        num, den = meta[b"time_base"].decode().split("/")
        return cls(meta[b"path"].decode(), Fraction(int(num), int(den)), t["pts"].to_numpy(),
                   t["pts_s"].to_numpy(), t["keyframe_pts"].to_numpy())

    def locate(self, times_s: np.ndarray, tolerance_s: float, *, episode_index: int, video_key: str) -> np.ndarray:
        """Index rows (positions in ``pts``) of the frames presented at ``times_s`` (seconds in the file).

        Raises:
            FrameNotFoundError: some time has no frame within ``tolerance_s``; names file, episode, camera, the
                queried time and the nearest pts. A neighbouring frame is never returned instead.
        """
        times_s = np.asarray(times_s, np.float64)
        pos = np.clip(np.searchsorted(self.pts_s, times_s), 1, len(self.pts_s) - 1) if len(self.pts_s) > 1 else \
            np.zeros(len(times_s), np.int64)
        left = np.maximum(pos - 1, 0)
        pick = np.where(np.abs(self.pts_s[left] - times_s) <= np.abs(self.pts_s[pos] - times_s), left, pos)
        err = np.abs(self.pts_s[pick] - times_s)
        bad = np.flatnonzero(~(err <= tolerance_s))
        if len(bad):
            i = bad[0]
            raise FrameNotFoundError(
                f"{self.path}: no frame of camera {video_key!r} within tolerance_s={tolerance_s} of t={times_s[i]:.6f}s "
                f"(episode {episode_index}); nearest frame has pts={int(self.pts[pick[i]])} "
                f"({self.pts_s[pick[i]]:.6f}s, off by {err[i]:.6f}s). The episode's from_timestamp or timestamps "
                "disagree with the video: run `lerobot-sql doctor`, or raise tolerance_s if the drift is expected."
            )
        return pick


class _OpenFile:
    """One open container positioned somewhere in its stream, decoding forward."""

    def __init__(self, src: Source, rel: str, threads: int):
        self.rel = rel
        self.path = src.path(rel)
        self.container = _open_container(src, rel)
        self.stream = self.container.streams.video[0]
        cc = self.stream.codec_context
        if threads == 1:
            cc.thread_count = 1
        else:
            cc.thread_type = "AUTO"
            cc.thread_count = threads
        self.frames = None
        self.last_pts: int | None = None

    def _seek(self, pts: int) -> None:
        self.container.seek(int(pts), stream=self.stream, backward=True, any_frame=False)
        self.frames = self.container.decode(self.stream)
        self.last_pts = None

    def decode(self, index: FrameIndex, rows: np.ndarray, reach: int) -> dict[int, np.ndarray]:
        """HWC uint8 RGB frames for index ``rows``, keyed by pts; one forward pass where the rows allow it."""
        out: dict[int, np.ndarray] = {}
        for r in sorted(set(int(x) for x in rows)):
            want = int(index.pts[r])
            key = int(index.keyframe_pts[r])
            if self.frames is None or self.last_pts is None or self.last_pts >= want:
                self._seek(key)
            else:
                last_row = int(np.searchsorted(index.pts, self.last_pts))
                key_row = int(np.searchsorted(index.pts, key))
                if r - last_row > (r - key_row) + reach:
                    self._seek(key)
            try:
                for frame in self.frames:
                    self.last_pts = frame.pts
                    if frame.pts == want:
                        out[want] = frame.to_ndarray(format="rgb24")
                        break
                    if frame.pts is not None and frame.pts > want:
                        raise VideoDecodeError(f"{self.path}: decoding skipped pts={want} (got {frame.pts}); "
                                               "the stream's index disagrees with its packets, the file may be corrupt")
                else:
                    raise VideoDecodeError(f"{self.path}: stream ended before pts={want}; the file may be truncated")
            except av.error.FFmpegError as e:
                self.frames = None
                raise VideoDecodeError(f"{self.path}: decoding failed near pts={want} ({e}); the file may be "
                                       "corrupt, re-fetch it") from e
        return out

    def close(self) -> None:
        self.container.close()


class DecoderPool:
    """Open decoders of one process, at most ``max_open`` (LRU), each reused for forward reads.

    A pool must be created in the process that uses it: the dataset makes one lazily per worker.
    """

    def __init__(self, src: Source, max_open: int = 16, threads: int = 1, reach: int = 8):
        self.src, self.max_open, self.threads, self.reach = src, max_open, threads, reach
        self._open: collections.OrderedDict[str, _OpenFile] = collections.OrderedDict()
        self._lock = threading.Lock()

    def decode(self, index: FrameIndex, rows: np.ndarray) -> dict[int, np.ndarray]:
        """HWC uint8 RGB frames (dict pts -> array) for the given rows of ``index``'s file."""
        rel = index.path
        with self._lock:
            f = self._open.pop(rel, None)
        if f is None:
            f = _OpenFile(self.src, rel, self.threads)
        try:
            return f.decode(index, rows, self.reach)
        finally:
            with self._lock:
                self._open[rel] = f
                while len(self._open) > self.max_open:
                    self._open.popitem(last=False)[1].close()

    def close(self) -> None:
        with self._lock:
            for f in self._open.values():
                f.close()
            self._open.clear()
