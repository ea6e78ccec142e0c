"""Video access: a per-file frame index built by demuxing (no decoding), and a pool of reusable PyAV decoders.

The index of an mp4 has one row per frame: its pts (stream time-base units and seconds), whether it is a keyframe,
and the pts of the keyframe it depends on, plus its packet's byte range. It is read from the container's sample
table when no frame is reordered (checked against the first packets), else by demuxing every packet; never by
decoding. It is cached as one small Parquet file per mp4, keyed by the file's identity (size, mtime, inode, ctime;
or ETag), and exposed in SQL as ``video_frames``; a memory-mappable Arrow twin (pts, pts_s, key_row) serves the
readers.

``DecoderPool`` keeps open decoders per process and reaches each target by decoding forward from where the decoder
stands, seeking (straight to the target's keyframe) only when that keyframe lies further ahead than ``reach``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from fractions import Fraction
from pathlib import Path

import av
from av.video.reformatter import VideoReformatter
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._storage import cache
from . import locate
from ..errors import DatasetFormatError, LeRobotSQLError, MissingFileError, VideoDecodeError
from .._storage.mp4 import mp4_sample_table, mp4_sync_samples
from .._storage.source import Source, local_identity


def _sws_single_thread() -> dict:
    """``reformat()`` keywords for a single-threaded swscale: ``{"threads": 1}`` where PyAV has the option (16+),
    else ``{}`` (PyAV 15, which lerobot 0.4 / 0.6 pin, has no ``threads`` keyword and always converts on one thread).
    Probed once at import on a 2x2 frame, not by version number."""
    try:
        VideoReformatter().reformat(av.VideoFrame(2, 2, "yuv420p"), format="rgb24", threads=1)
        return {"threads": 1}
    except TypeError:
        return {}


_SWS_KW = _sws_single_thread()

INDEX_VERSION = 2  # 2: entries carry a checksum sidecar (cache.check)
INDEX_SCHEMA = pa.schema([
    ("frame", pa.int64()),          # ordinal of the frame in the file, in presentation order
    ("pts", pa.int64()),            # presentation time, stream time-base units
    ("pts_s", pa.float64()),        # presentation time, seconds
    ("is_keyframe", pa.bool_()),
    ("keyframe_pts", pa.int64()),   # pts of the keyframe a decoder must start from to reach this frame
    ("byte_offset", pa.int64()),    # packet position in the file (-1 if unknown)
    ("byte_size", pa.int64()),      # packet size in bytes
])
# The rows of the view ``video_files`` (probe_video_files): one per distinct mp4 of ``videos``.
PROBE_SCHEMA = pa.schema([
    ("video_key", pa.string()),
    ("path", pa.string()),          # relative to the dataset root
    ("present", pa.bool_()),
    ("size_bytes", pa.int64()),     # NULL when missing
    ("codec", pa.string()),         # FFmpeg canonical name; NULL when missing or unreadable
])


def open_container(src: Source, rel: str, demux_only: bool = False):
    """The PyAV input container of video ``rel``; ``demux_only``: on a remote root, through the payload-free view
    (only the container's boxes are fetched; enough to index, not to decode).

    Raises:
        MissingFileError: a local file is missing. VideoDecodeError: PyAV cannot open it.
    """
    local = src.local_path(rel)
    try:
        if local is not None:
            if not os.path.exists(local):
                raise MissingFileError(f"{local}: video file not found (referenced by meta/episodes); "
                                       "download the dataset's videos/ folder or re-fetch this file")
            return av.open(local)
        # Indexing a remote file needs only its moov box: the payload-free view never fetches media bytes.
        return av.open(src.open_demux(rel) if demux_only else src.open(rel))
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{src.path(rel)}: PyAV cannot open this video ({e}); the file may be truncated "
                               "or corrupt, re-fetch it from the dataset's source") from e


def _container_index(container, stream) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(pts, keyframe, byte offset, size) arrays, one entry per packet in decode order, from the container's own
    sample table, without reading packets.

    The mp4 demuxer fills ``index_entries`` from the moov atom when it opens the file. Their timestamps are decode
    times, equal to presentation times only when no frame is reordered, so this path is taken only for streams
    without B-frames whose first packets agree with it entry for entry; otherwise None (demux everything instead).
    """
    try:
        entries = list(stream.index_entries)
    except (AttributeError, av.error.FFmpegError):
        return None
    n = len(entries)
    if n == 0 or stream.codec_context.has_b_frames or (stream.frames and stream.frames != n):
        return None
    if any(e.is_discard for e in entries):
        return None
    # One array per field rather than a tuple per packet: tens of thousands of tuples wake the garbage collector,
    # which then walks every object of the process (torch's included).
    pts = np.fromiter((e.timestamp for e in entries), np.int64, n)
    key = np.fromiter((e.is_keyframe for e in entries), np.bool_, n)
    pos = np.fromiter((e.pos for e in entries), np.int64, n)
    size = np.fromiter((e.size for e in entries), np.int64, n)
    for k, pkt in zip(range(min(32, n)), container.demux(stream)):
        if pkt.pts is None or (pkt.pts, bool(pkt.is_keyframe), pkt.pos, pkt.size) != \
                (int(pts[k]), bool(key[k]), int(pos[k]), int(size[k])):
            return None
    return pts, key, pos, size


def _sync_flags(src: Source, rel: str, stream, rows: list[tuple]) -> list[bool] | None:
    """Keyframe flag of each demuxed packet (``rows``: (pts, flag, pos, size) in decode order) from the container's
    sync-sample table, for packets read through the payload-free view; None when no table matches the packets.

    PyAV 16+ exposes the table as ``stream.index_entries`` (keyed by byte position). PyAV 15, which lerobot 0.4 /
    0.6 pin, does not: the ``stss`` box is then read from the cached ``moov`` (:func:`lerobot_sql._storage.mp4.mp4_sync_samples`),
    numbered by sample, and trusted only when the track's sample sizes equal the packets' sizes one for one (an
    edit list or fragment that made FFmpeg drop or add packets fails that, and the caller demuxes with payload).
    """
    entries = getattr(stream, "index_entries", None)
    if entries is not None:
        keys = {e.pos for e in entries if e.is_keyframe}
        return [r[2] in keys for r in rows] if keys else [r[1] for r in rows]
    with src.open_demux(rel) as f:
        table = mp4_sync_samples(f)
    if table is None:
        return None
    sizes, sync = table
    if len(sizes) != len(rows) or any(s != r[3] for s, r in zip(sizes, rows)):
        return None
    return [True] * len(rows) if sync is None else [k + 1 in sync for k in range(len(rows))]


def _past_the_cut(src: Source, rel: str, rows: list[tuple]) -> list[tuple]:
    """``rows`` (pts, keyframe, pos, size; decode order) of a file cut short, completed from its ``moov``.

    PyAV 16's ``index_entries`` list every sample of the moov, so the index of a truncated mp4 keeps the frames
    past the cut (their bytes lie past the end of the file: decoding them raises, and ``doctor`` reports the file
    as cut). PyAV 15 demuxes only up to the cut; without this the clips past it would look like bad
    ``from_timestamp`` metadata. The samples past the cut are added only when the demuxed packets equal the table's
    first samples (sizes and offsets), the next sample does end past the file, and no frame is reordered
    (presentation times are then the decode times: the last pts plus the ``stts`` steps); otherwise ``rows``.
    """
    with src.open_demux(rel) as f:
        t = mp4_sample_table(f)
    if t is None or t.offsets is None or t.deltas is None or t.reordered or len(t.sizes) <= len(rows):
        return rows
    m = len(rows)
    while m and t.offsets[m - 1] + t.sizes[m - 1] > t.file_size:
        m -= 1  # a packet the cut went through: FFmpeg hands out its first bytes; the table's entry replaces it
    if (not m or m == len(t.sizes) or t.offsets[m] + t.sizes[m] <= t.file_size
            or any(r[3] != n or r[2] != o for r, n, o in zip(rows[:m], t.sizes, t.offsets))):
        return rows
    out, pts = list(rows[:m]), rows[m - 1][0]
    for k in range(m, len(t.sizes)):
        pts += t.deltas[k - 1]
        out.append((pts, t.sync is None or k + 1 in t.sync, t.offsets[k], t.sizes[k]))
    return out


def _demux_index(src: Source, rel: str) -> pa.Table:
    container = open_container(src, rel, demux_only=True)
    try:
        stream = container.streams.video[0]
        packets = _container_index(container, stream)
        if packets is None:  # reopen rather than seek back: the check above may have consumed packets
            container.close()
            container = open_container(src, rel, demux_only=True)
            stream = container.streams.video[0]
            rows = [(pkt.pts, bool(pkt.is_keyframe), -1 if pkt.pos is None else pkt.pos, pkt.size)
                    for pkt in container.demux(stream) if pkt.pts is not None]
            if not src.is_local:
                # Payload-free remote reads: H.264 keyframe flags come from the payload, so take them from the
                # container's sync-sample table instead.
                flags = _sync_flags(src, rel, stream, rows)
                if flags is None:  # no table that matches the packets: demux again, payload and all (correct)
                    container.close()
                    container = open_container(src, rel)
                    stream = container.streams.video[0]
                    rows = [(pkt.pts, bool(pkt.is_keyframe), -1 if pkt.pos is None else pkt.pos, pkt.size)
                            for pkt in container.demux(stream) if pkt.pts is not None]
                else:
                    rows = [(r[0], k, r[2], r[3]) for r, k in zip(rows, flags)]
            if not hasattr(stream, "index_entries") and stream.frames and len(rows) < stream.frames:
                rows = _past_the_cut(src, rel, rows)
            packets = tuple(np.array([r[i] for r in rows], dt).reshape(-1)
                            for i, dt in enumerate((np.int64, np.bool_, np.int64, np.int64)))
        tb = stream.time_base
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{src.path(rel)}: demuxing failed ({e}); the file may be corrupt") from e
    finally:
        container.close()
    pts, key, pos, size = packets
    n = len(pts)
    if not n:
        raise VideoDecodeError(f"{src.path(rel)}: the video stream holds no frames")
    # Decode order: a frame depends on the last keyframe at or before it (itself before the first keyframe).
    last = np.maximum.accumulate(np.where(key, np.arange(n), -1))
    key_pts = np.where(last >= 0, pts[np.maximum(last, 0)], pts)
    order = np.argsort(pts, kind="stable")  # presentation order; equal pts keep decode order
    pts = pts[order]
    return pa.table({
        "frame": np.arange(n, dtype=np.int64),
        "pts": pts,
        "pts_s": pts * float(tb),
        "is_keyframe": key[order],
        "keyframe_pts": key_pts[order],
        "byte_offset": pos[order],
        "byte_size": size[order],
    }, schema=INDEX_SCHEMA.with_metadata({"time_base": f"{tb.numerator}/{tb.denominator}", "path": rel}))


Stamp = tuple  # (inode, size, mtime_ns, ctime_ns, identity) of a local file: see stamp()


def stamp(src: Source, rel: str) -> Stamp | None:
    """(inode, size in bytes, mtime in ns, ctime in ns, :func:`~lerobot_sql._storage.source.local_identity`) of local file
    ``rel``, or None when it is missing or remote.

    A dataset takes one stamp per mp4 when it is opened and compares it whenever a process indexes the file or
    hands it to a decoder: a file replaced by a rename (new inode) or rewritten in place (new size, mtime or
    ctime; ctime also catches a same-size rewrite whose mtime was set back) differs. One ``os.stat``, about a
    microsecond. Remote files are pinned by their ETag instead (see remote.py).
    """
    local = src.local_path(rel)
    if local is None:
        return None
    try:
        st = os.stat(local)
    except FileNotFoundError:
        return None
    return _stamp_of(st)


def _stamp_of(st: os.stat_result) -> Stamp:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, local_identity(st)


def changed_error(src: Source, rel: str, then: Stamp, now: Stamp | None) -> LeRobotSQLError:
    """The error for an mp4 that is no longer the file the dataset was opened on (or is gone)."""
    if now is None:
        return MissingFileError(f"{src.path(rel)}: video file not found; it existed when the dataset was opened. "
                                "Restore it, or open the dataset again (db.dataset(...)) with cameras=[...] without it")
    return DatasetFormatError(
        f"{src.path(rel)}: the video file changed after the dataset was opened (inode-size-mtime-ctime "
        f"{'-'.join(map(str, then[:4]))} then, {'-'.join(map(str, now[:4]))} now); its frame index and episode clips "
        "describe the old file, so decoding it would give wrong frames. Open the dataset again (db.dataset(...)) to "
        "read the new version")


def _check_pin(src: Source, rel: str, pin: Stamp | None) -> None:
    if pin is not None:
        now = stamp(src, rel)
        if now != pin:
            raise changed_error(src, rel, pin, now)


def index_path(src: Source, rel: str, cache_dir: Path, pin: Stamp | None = None) -> Path:
    """Where the cached index of ``rel`` lives (it may not exist yet): keyed by the file's identity, the pinned
    one when ``pin`` (a :func:`stamp`) is given."""
    identity = pin[4] if pin is not None else src.identity(rel)  # pin[4] is Source.identity's local form
    return cache_dir / "video_index" / f"{cache.key(src.url, rel, identity, INDEX_VERSION)}.parquet"


def ensure_index(src: Source, rel: str, cache_dir: Path) -> Path:
    """Build (once) and return the cached index Parquet of video file ``rel``.

    A damaged entry (truncated, garbled: see :func:`lerobot_sql._storage.cache.check`) is rebuilt once, with a warning.

    Raises:
        MissingFileError: the mp4 does not exist.
        VideoDecodeError: PyAV cannot demux it.
        CacheError: the entry cannot be written.
    """
    path = index_path(src, rel, cache_dir)
    return cache.ensure(path, lambda tmp: pq.write_table(_demux_index(src, rel), tmp))


def ensure_index_arrow(src: Source, rel: str, cache_dir: Path, pin: Stamp | None = None) -> Path:
    """Build (once) the memory-mappable Arrow IPC form of the index of ``rel`` (pts, pts_s, key_row).

    ``pin``: the file's :func:`stamp` when the dataset was opened; the file must still be that one.

    Raises:
        MissingFileError: the mp4 does not exist.
        DatasetFormatError: the mp4 is not the file ``pin`` describes (replaced or rewritten since).
        VideoDecodeError: PyAV cannot demux it.

    Workers map this file instead of loading the Parquet, so the index pages are shared through the OS page cache
    and a worker's private memory does not grow with the number of frames.
    """
    _check_pin(src, rel, pin)  # a stat: the index must describe the file the dataset's clips were checked for
    parquet = index_path(src, rel, cache_dir, pin)
    path = parquet.with_suffix(".arrow")

    def write(tmp: str) -> None:
        # The Parquet form serves the SQL view `video_frames` and is written only when a query needs it; reading
        # frames needs only this file, straight from the demux (writing Parquet cost 30 ms per 46k-frame mp4).
        ok = parquet.exists() and cache.check_once(parquet) is None  # a damaged Parquet form is not copied
        t = pq.read_table(parquet, columns=["pts", "pts_s", "is_keyframe", "keyframe_pts"]) if ok \
            else _demux_index(src, rel)
        pts = t["pts"].to_numpy()
        key_row = locate.key_rows(pts, t["keyframe_pts"].to_numpy(), t["is_keyframe"].to_numpy(zero_copy_only=False))
        out = pa.table({"pts": pts, "pts_s": t["pts_s"].to_numpy(), "key_row": key_row},
                       schema=pa.schema([("pts", pa.int64()), ("pts_s", pa.float64()), ("key_row", pa.int64())],
                                        metadata=t.schema.metadata))
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, out.schema) as w:
            w.write_table(out)

    return cache.ensure(path, write)


def _stream_codec(src: Source, rel: str) -> str | None:
    """FFmpeg's canonical codec name (``av1``, ``h264``, ``mpeg4`` ...) of the file's first video stream; None if
    PyAV cannot open it (the video index checks then report the file). Remote files are opened payload-free (only
    the container's boxes are fetched)."""
    local = src.local_path(rel)
    try:
        with (av.open(local) if local is not None else av.open(src.open_demux(rel))) as container:
            return container.streams.video[0].codec_context.codec.canonical_name
    except (av.error.FFmpegError, IndexError, LeRobotSQLError, OSError):
        return None


def probe_video_files(src: Source, files: list[tuple[str, str]]) -> pa.Table:
    """The rows of the view ``video_files``: for each (video_key, path) of the ``videos`` view, whether the file
    exists, its size and its stream's codec.

    Args:
        src: the dataset's :class:`lerobot_sql._storage.source.Source`.
        files: distinct (video_key, path relative to the root) pairs.

    Returns:
        Arrow table ``video_key`` string, ``path`` string, ``present`` bool, ``size_bytes`` int64 (NULL when
        missing), ``codec`` string (FFmpeg canonical name, NULL when missing or unreadable).

    Raises:
        RemoteIOError: a remote file's existence could not be asked (network down, never seen offline).
    """
    from tqdm.auto import tqdm

    keys, paths, present, sizes, codecs = [], [], [], [], []
    for key, rel in tqdm(files, desc="probe videos", unit="file", disable=len(files) < 64):
        try:  # Source.size, not Source.exists: on HTTP the latter trusts the metadata's file list
            size = src.size(rel)
        except FileNotFoundError:
            size = None
        keys.append(key)
        paths.append(rel)
        present.append(size is not None)
        sizes.append(size)
        codecs.append(_stream_codec(src, rel) if size is not None else None)
    return pa.table([keys, paths, present, sizes, codecs], schema=PROBE_SCHEMA)


@dataclasses.dataclass(frozen=True)
class FrameIndex:
    """The loaded index of one mp4; arrays are sorted by pts (int64 (n,) / float64 (n,)).

    Attributes:
        path: the mp4, relative to the dataset root.
        time_base: seconds per pts unit.
        pts: presentation time of each frame, time-base units.
        pts_s: the same in seconds.
        key_row: row of the keyframe decoding must start from to reach each frame.
    """

    path: str
    time_base: Fraction
    pts: np.ndarray
    pts_s: np.ndarray
    key_row: np.ndarray

    @property
    def keyframe_pts(self) -> np.ndarray:
        return self.pts[self.key_row]

    @classmethod
    def load(cls, index_file: Path) -> "FrameIndex":
        """Load an index from its Arrow IPC form (memory-mapped) or its Parquet form."""
        if str(index_file).endswith(".arrow"):
            t = pa.ipc.open_file(pa.memory_map(str(index_file), "r")).read_all()
            key_row = t["key_row"].to_numpy()
        else:
            t = pq.read_table(index_file)
            key_row = locate.key_rows(t["pts"].to_numpy(), t["keyframe_pts"].to_numpy(),
                                t["is_keyframe"].to_numpy(zero_copy_only=False))
        meta = t.schema.metadata
        num, den = meta[b"time_base"].decode().split("/")
        return cls(meta[b"path"].decode(), Fraction(int(num), int(den)), t["pts"].to_numpy(),
                   t["pts_s"].to_numpy(), key_row)

    def nearest(self, times_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, |error| in seconds) of the frame nearest to each time (:func:`lerobot_sql._readers.locate.nearest`)."""
        return locate.nearest(self.pts_s, times_s)

    def locate(self, times_s: np.ndarray, tolerance_s: float, *, episode_index: int, video_key: str) -> np.ndarray:
        """Index rows (positions in ``pts``) of the frames presented at ``times_s`` (seconds in the file).

        Raises:
            FrameNotFoundError: some time has no frame within ``tolerance_s`` (:func:`lerobot_sql._readers.locate.locate`).
        """
        return locate.locate(self.pts, self.pts_s, times_s, tolerance_s, path=self.path,
                             episode_index=episode_index, video_key=video_key)


# Formats whose planar-RGB conversion was seen to equal the packed rgb24 one, per process (see _OpenFile._convert).
_PLANAR_OK: dict[tuple, bool] = {}


MAX_SIDE = 8192         # pixels: a frame side beyond 8K is refused as a decode bomb, whatever info.json declares
MAX_PIXEL_RATIO = 64    # a frame of more than 64 x the declared pixel count is refused too (a 4K stream under 96x128)
_WARNED: set[tuple[str, tuple[int, int]]] = set()  # (mp4, its frame size): warned once per process


def check_resolution(path: str, hw: tuple[int, int], camera: str | None, declared: tuple[int, int] | None) -> None:
    """Compare an mp4's frame size (``hw``: height, width from the stream at decoder open) with info.json's.

    Datasets legitimately hold files of one camera at several resolutions (lerobot serves each file's own size),
    so a difference only warns, once per file and process. Cheap: called when a decoder opens, never per frame.

    Raises:
        DatasetFormatError: a side over :data:`MAX_SIDE`, or more than :data:`MAX_PIXEL_RATIO` x the declared pixel
            count: each decoded frame would cost that memory (uint8 3 x H x W per frame of every item).
    """
    h, w = int(hw[0]), int(hw[1])
    said = f" of camera {camera!r}" if camera else ""
    want = f"info.json declares {declared[0]}x{declared[1]} (HxW)" if declared else "no declared shape"
    if max(h, w) > MAX_SIDE or (declared and h * w > MAX_PIXEL_RATIO * max(1, declared[0] * declared[1])):
        raise DatasetFormatError(
            f"{path}: video frames{said} are {h}x{w} (HxW), {want}; refused as a decode bomb (limits: sides up to "
            f"{MAX_SIDE}, at most {MAX_PIXEL_RATIO}x the declared pixel count). Re-encode the mp4 at the declared "
            "size, or leave the camera out (cameras=[...])")
    if declared and (h, w) != tuple(declared) and (path, (h, w)) not in _WARNED:
        _WARNED.add((path, (h, w)))
        import warnings

        warnings.warn(f"{path}: video frames{said} are {h}x{w} (HxW) but {want}; serving the file's own size "
                      "(as lerobot does), so items of this camera differ in shape across files", stacklevel=5)


class _OpenFile:
    """One open container positioned somewhere in its stream, decoding forward.

    ``pos`` is the index row of the frame the decoder will output next (None after an error or before the first
    seek): a target at or after ``pos`` whose keyframe is not far ahead is reached by decoding forward, anything else
    by one seek straight to the target's keyframe. Frames are converted by one ``VideoReformatter`` kept for the
    file, single-threaded (swscale's default spawns a thread pool per call, which costs more than a small frame).
    """

    def __init__(self, src: Source, rel: str, threads: int, thread_type: str = "AUTO"):
        self.rel = rel
        self.path = src.path(rel)
        self.container = open_container(src, rel)
        self.stream = self.container.streams.video[0]
        cc = self.stream.codec_context
        if threads == 1:
            cc.thread_count = 1
        else:
            cc.thread_type = thread_type
            cc.thread_count = threads  # 0 = FFmpeg picks
        self.reformatter = VideoReformatter()
        self.frames = None
        self.pos: int | None = None
        self.planar: bool | None = None
        self.seeks = 0    # counters for tests and benchmarks
        self.decoded = 0

    def _seek(self, index: FrameIndex, key_row: int) -> None:
        self.container.seek(int(index.pts[key_row]), stream=self.stream, backward=True, any_frame=False)
        self.frames = self.container.decode(self.stream)
        self.pos = key_row
        self.seeks += 1

    def _convert(self, frame, out: np.ndarray) -> None:
        """Write ``frame`` as RGB (3, H, W) uint8 into ``out``.

        swscale's planar GBR output equals its packed rgb24 output for the formats checked (yuv420p AV1/H.264),
        and lands in channel-first order without a transpose; the first frame of each pixel format is converted
        both ways and the planar path is used only if the two agree bit for bit.
        """
        if frame.height != out.shape[1] or frame.width != out.shape[2]:
            raise VideoDecodeError(f"{self.path}: frame at pts={frame.pts} is {frame.width}x{frame.height} but the "
                                   f"stream declares {out.shape[2]}x{out.shape[1]}; frames of changing size are not "
                                   "supported")
        if self.planar is None:
            fmt = (frame.format.name, frame.width, frame.height, int(frame.colorspace), int(frame.color_range))
            if fmt not in _PLANAR_OK:
                ref = self.reformatter.reformat(frame, format="rgb24", **_SWS_KW).to_ndarray().transpose(2, 0, 1)
                self._planar_into(frame, out)
                _PLANAR_OK[fmt] = bool(np.array_equal(out, ref))
            self.planar = _PLANAR_OK[fmt]
        if self.planar:
            self._planar_into(frame, out)
        else:
            out[...] = self.reformatter.reformat(frame, format="rgb24", **_SWS_KW).to_ndarray().transpose(2, 0, 1)

    def _planar_into(self, frame, out: np.ndarray) -> None:
        g = self.reformatter.reformat(frame, format="gbrp", **_SWS_KW)
        h, w = out.shape[1:]
        for c, p in ((0, 2), (1, 0), (2, 1)):  # gbrp planes are G, B, R
            plane = g.planes[p]
            out[c] = np.frombuffer(plane, np.uint8).reshape(h, plane.line_size)[:, :w]

    @property
    def shape(self) -> tuple[int, int, int]:
        cc = self.stream.codec_context
        return 3, cc.height, cc.width

    def decode_into(self, index: FrameIndex, rows: np.ndarray, out: np.ndarray, reach: int) -> None:
        """Write the frames at index ``rows`` into ``out[j]`` ((len(rows), 3, H, W) uint8), in one forward pass
        over the sorted rows where the keyframes allow it."""
        # one row (an item without delta_timestamps) is most calls: argsort's ~3 us was ~1% of an item
        order = (0,) if len(rows) == 1 else np.argsort(rows, kind="stable")
        prev_row, prev_j = -1, -1
        for j in order:
            r = int(rows[j])
            if r == prev_row:
                out[j] = out[prev_j]
                continue
            kr = int(index.key_row[r])
            # Decoding forward from pos costs r - pos frames; a seek costs r - kr frames plus a flush. Forward wins
            # unless the target's keyframe lies more than `reach` frames past the current position.
            if self.pos is None or r < self.pos or kr - self.pos > reach:
                self._seek(index, kr)
            want = int(index.pts[r])
            try:
                for frame in self.frames:
                    self.decoded += 1
                    p = frame.pts
                    if p == want:
                        self._convert(frame, out[j])
                        break
                    if p is not None and p > want:
                        self.pos = None
                        raise VideoDecodeError(f"{self.path}: decoding skipped pts={want} (got {p}); the stream's "
                                               "index disagrees with its packets, the file may be corrupt")
                else:
                    self.pos = None
                    raise VideoDecodeError(f"{self.path}: stream ended before pts={want}; the file may be truncated")
            except av.error.FFmpegError as e:
                self.pos = None
                raise VideoDecodeError(f"{self.path}: decoding failed near pts={want} ({e}); the file may be "
                                       "corrupt, re-fetch it") from e
            self.pos = r + 1
            prev_row, prev_j = r, j

    def close(self) -> None:
        self.container.close()


class DecoderPool:
    """Open decoders of one process, at most ``max_open`` (LRU), each reused for forward reads.

    A pool must be created in the process that uses it: the dataset makes one lazily per worker. Several threads may
    share a pool as long as each file is used by one thread at a time (the dataset decodes each camera, i.e. each
    file, in its own thread).

    Args:
        threads: FFmpeg decoder threads per open file; 1 suits seeking and small frames, 0 lets FFmpeg choose.
        reach: how many frames past the current position a target's keyframe may lie before a seek is cheaper
            than decoding forward.
    """

    def __init__(self, src: Source, max_open: int = 16, threads: int = 1, reach: int = 2,
                 thread_type: str = "AUTO", pins: dict[str, Stamp | None] | None = None,
                 declared: dict[str, tuple[str, tuple[int, int]]] | None = None):
        self.src, self.max_open, self.threads, self.reach = src, max_open, threads, reach
        self.pins = pins or {}
        self.declared = declared or {}  # rel -> (camera key, info.json's (height, width)): checked at each open
        self._local: dict[str, str] = {}  # rel -> OS path of pinned files (spares a join per check)
        self.thread_type = thread_type
        self._open: collections.OrderedDict[str, _OpenFile] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._closed = {"seeks": 0, "decoded": 0}

    def _take(self, rel: str) -> _OpenFile:
        with self._lock:
            f = self._open.pop(rel, None)
        if f is None:
            f = _OpenFile(self.src, rel, self.threads, self.thread_type)
            try:
                check_resolution(f.path, f.shape[1:], *self.declared.get(rel, (None, None)))
            except BaseException:
                f.close()
                raise
        return f

    def _give(self, f: _OpenFile) -> None:
        with self._lock:
            other = self._open.pop(f.rel, None)
            self._open[f.rel] = f
            if other is not None and other is not f:
                self._retire(other)
            while len(self._open) > self.max_open:
                self._retire(self._open.popitem(last=False)[1])

    def _retire(self, f: _OpenFile) -> None:
        self._closed["seeks"] += f.seeks
        self._closed["decoded"] += f.decoded
        f.close()

    def stats(self) -> dict[str, int]:
        """Seeks and decoded frames so far in this process, and how many files are open."""
        with self._lock:
            files = list(self._open.values())
            out = dict(self._closed)
        out["seeks"] += sum(f.seeks for f in files)
        out["decoded"] += sum(f.decoded for f in files)
        out["open_files"] = len(files)
        return out

    def decode(self, index: FrameIndex, rows: np.ndarray) -> dict[int, np.ndarray]:
        """HWC uint8 RGB frames (dict pts -> (H, W, 3) array) for the given rows of ``index``'s file."""
        frames = self.decode_chw(index, rows)
        return {int(index.pts[r]): frames[j].transpose(1, 2, 0) for j, r in enumerate(np.asarray(rows))}

    def decode_chw(self, index: FrameIndex, rows: np.ndarray) -> np.ndarray:
        """RGB frames at ``rows`` of ``index``'s file: uint8 (len(rows), 3, H, W), in the order of ``rows``.

        Raises:
            MissingFileError: the mp4 is gone.
            DatasetFormatError: the mp4 is no longer the file its pin (``pins``) describes.
            VideoDecodeError: PyAV failed, or the stream disagrees with the index.
        """
        f = self._take(index.path)
        ok = False
        try:
            # One stat per call (an item's camera), after the open: a file replaced by a rename before the open, or
            # rewritten in place under an open decoder, would otherwise be decoded through the old file's index.
            pin = self.pins.get(index.path)
            if pin is not None:
                local = self._local.get(index.path)
                if local is None:
                    local = self._local[index.path] = self.src.local_path(index.path)
                try:
                    st = os.stat(local)
                except FileNotFoundError:
                    raise changed_error(self.src, index.path, pin, None) from None
                # the four numbers, not _stamp_of: building the identity string per call cost ~1% of an item
                if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != pin[:4]:
                    raise changed_error(self.src, index.path, pin, _stamp_of(st))
            out = np.empty((len(rows), *f.shape), np.uint8)
            f.decode_into(index, np.asarray(rows), out, self.reach)
            ok = True
            return out
        finally:
            if ok:
                self._give(f)
            else:  # a read failed inside PyAV (e.g. a remote error): its demuxer is spent, the next item reopens it
                with self._lock:
                    self._retire(f)

    def close(self) -> None:
        with self._lock:
            for f in self._open.values():
                self._retire(f)
            self._open.clear()
