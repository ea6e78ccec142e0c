"""The video index: one row per frame of an mp4, built by demuxing (never decoding), cached per file identity.

Each row holds a frame's pts (stream time-base units and seconds), whether it is a keyframe, the pts of the keyframe
it depends on, and its packet's byte range. It is read from the container's sample table when no frame is reordered
(checked against the first packets), else by demuxing every packet. It is cached as one small Parquet file per mp4,
keyed by the file's identity (size, mtime, inode, ctime; or ETag), and exposed in SQL as ``video_frames``; a
memory-mappable Arrow twin (pts, pts_s, key_row) serves the readers as :class:`FrameIndex`. The pins (:func:`stamp`)
say whether an mp4 is still the file a dataset was opened on; ``probe_video_files`` fills the view ``video_files``.
Where a frame is, given an index, is :mod:`lerobot_sql._readers.locate`; decoding it is
:mod:`lerobot_sql._readers.decode`.

Its size on disk is per frame, not per byte of video: about 70 bytes per frame with both forms (measured on the
shipped sets and the real G1 sets: the Parquet form 29-39 B/frame, the Arrow twin 40-46 B/frame, five 8-byte columns
uncompressed so that workers can map it). As a share of the mp4 bytes that is under 1% for camera frames of a few KB
(G1's 480x640: 8.9 KB/frame, 0.8-0.9%) but 18-23% for the shipped sets' 96x128 frames (330-380 B/frame); the Arrow
twin exists only for files a dataset has read.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._storage import cache
from .._storage.mp4 import mp4_sample_table, mp4_sync_samples
from .._storage.source import Source, local_identity
from ..errors import DatasetFormatError, LeRobotSQLError, MissingFileError, VideoDecodeError
from . import locate

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
    ("height", pa.int64()),         # the stream's frame size, pixels (its header); NULL as codec
    ("width", pa.int64()),
    ("video_streams", pa.int64()),  # video streams in the file (audio not counted); over 1 is refused; NULL as codec
])


def open_container(src: Source, rel: str, demux_only: bool = False):
    """The PyAV input container of video ``rel``; ``demux_only``: on a remote root, through the payload-free view
    (only the container's boxes are fetched; enough to index, not to decode).

    Every reader of an mp4 (the index, the decoders, the export's stream copy) opens it here, so the file's
    streams are checked once per open (:func:`check_one_video_stream`), never per frame.

    Raises:
        MissingFileError: a local file is missing. VideoDecodeError: PyAV cannot open it.
        DatasetFormatError: it holds more than one video stream.
    """
    local = src.local_path(rel)
    try:
        if local is not None:
            if not os.path.exists(local):
                raise MissingFileError(f"{local}: video file not found (referenced by meta/episodes); "
                                       "download the dataset's videos/ folder or re-fetch this file")
            container = av.open(local)
        else:
            # Indexing a remote file needs only its moov box: the payload-free view never fetches media bytes.
            container = av.open(src.open_demux(rel) if demux_only else src.open(rel))
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{src.path(rel)}: PyAV cannot open this video ({e}); the file may be truncated "
                               "or corrupt, re-fetch it from the dataset's source") from e
    try:
        check_one_video_stream(container, src.path(rel))
    except BaseException:
        container.close()
        raise
    return container


def check_one_video_stream(container, where: str) -> None:
    """Refuse an mp4 holding more than one video stream (audio streams are fine: lerobot's ``has_audio``).

    lerobot writes one video stream per camera file, and nothing in the metadata says which of several streams is
    the camera's: every reader takes video stream 0, which in a file muxing all cameras (a recorder's output) is
    another camera's frames, served without an error. Refusing is the one answer that is never a wrong frame.

    Raises:
        DatasetFormatError: naming the file (``where``), its video streams and the ffmpeg command that keeps one.
    """
    streams = container.streams.video
    if len(streams) <= 1:
        return

    def describe(k: int, s) -> str:
        cc = s.codec_context
        name = getattr(cc.codec, "canonical_name", None) or cc.name
        return f"0:v:{k} {name} {cc.width}x{cc.height}, {s.frames or '?'} frames"

    listed = "; ".join(describe(k, s) for k, s in enumerate(streams))
    raise DatasetFormatError(
        f"{where}: holds {len(streams)} video streams ({listed}); lerobot writes one video stream per camera file "
        "and nothing says which of these is this camera's, so the file is not read (stream 0 could be another "
        f"camera's frames). Keep the camera's own stream, N (0..{len(streams) - 1}), in a copy and put it in "
        f"place of this file: ffmpeg -i {shlex.quote(str(where))} -map 0:v:N -map 0:a? -c copy fixed.mp4 (no "
        "re-encoding); or leave the camera out (dataset(..., cameras=[...]))")


def _table_usable(moov, n: int, stream) -> bool:
    """Whether an mp4 sample table can stand for FFmpeg's index of ``stream``'s ``n`` packets: the track FFmpeg
    streams (its track_ID is the stream's id), no composition offsets, no edit list but one edit of the whole media
    from time 0, byte offsets and decode deltas known, ``n`` samples."""
    return moov is not None and moov.track_id is not None and moov.track_id == stream.id and not moov.reordered \
        and not moov.edited and moov.offsets is not None and moov.deltas is not None and len(moov.sizes) == n > 0


def _table_arrays(moov, n: int, t0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(pts from ``t0`` by the decode deltas, keyframe from the sync samples, byte offset, size) of the table."""
    size = np.asarray(moov.sizes, np.int64)
    pos = np.asarray(moov.offsets, np.int64)
    pts = np.empty(n, np.int64)
    pts[0] = t0
    np.cumsum(np.asarray(moov.deltas[:-1], np.int64), out=pts[1:])
    pts[1:] += t0
    if moov.sync is None:
        key = np.ones(n, np.bool_)
    else:
        key = np.zeros(n + 1, np.bool_)
        sync = np.fromiter(moov.sync, np.int64, len(moov.sync))
        key[sync[(sync >= 1) & (sync <= n)]] = True
        key = key[1:]
    return pts, key, pos, size


def _checked_by_demux(container, stream, payload_free: bool, moov) -> tuple | None:
    """PyAV 15 (no ``index_entries``): the sample table (:func:`_table_arrays`) where the packets FFmpeg demuxes
    agree with it, entry for entry, at the file's start, middle and end (32 packets each, by byte offset); else
    None (every packet is demuxed, as before). ``payload_free``: keyframe flags not compared (see
    :func:`_container_index`)."""
    if moov is None or stream.codec_context.has_b_frames:
        return None
    table = moov()
    n = len(table.sizes) if table is not None else 0
    if not _table_usable(table, n, stream) or (stream.frames and stream.frames != n):
        return None
    head = [pkt for _, pkt in zip(range(min(32, n)), container.demux(stream))]
    if not head or head[0].pts is None:
        return None
    pts, key, pos, size = _table_arrays(table, n, int(head[0].pts))

    def agree(pkt, j: int) -> bool:
        return pkt.pts is not None and (pkt.pts, pkt.pos, pkt.size) == (int(pts[j]), int(pos[j]), int(size[j])) \
            and (payload_free or bool(pkt.is_keyframe) == bool(key[j]))

    def agree_from(at: int, to_end: bool) -> bool:
        """The packets demuxed from row ``at`` (sought) agree with the table, 32 of them, or every one to the
        stream's end, whose last must be the table's last sample: a fragment after it (moof boxes the moov's table
        does not list, where PyAV 15's frame count is the table's) would otherwise go unseen (hostile review 18)."""
        window = {int(pos[j]): j for j in range(max(0, at - 64), min(n, at + 96))}
        container.seek(int(pts[at]), stream=stream, backward=True, any_frame=True)
        matched, ended = 0, False
        for pkt in container.demux(stream):
            if pkt.size == 0 and pkt.pts is None:  # the demuxer's end-of-stream packet
                continue
            j = window.get(pkt.pos)
            if ended or j is None or not agree(pkt, j):
                return False
            matched += j >= at
            ended = j == n - 1
            if not to_end and matched >= min(32, n - at):
                break
        return matched >= min(32, n - at) and (ended or not to_end)

    if not all(agree(pkt, j) for j, pkt in enumerate(head)):
        return None
    if (n // 2 >= len(head) and not agree_from(n // 2, False)) or not agree_from(max(0, n - 32), True):
        return None
    return pts, key, pos, size


def _from_sample_table(moov, entries, n: int, stream) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(pts, keyframe, byte offset, size) of every packet from the mp4's own sample table (``moov``:
    :func:`lerobot_sql._storage.mp4.mp4_sample_table`), vectorised, when it describes the same packets as FFmpeg's
    ``index_entries`` (``entries``, ``n`` of them): no composition offsets (B-frames), no edit list but one edit of
    the whole media from time 0 (FFmpeg's edit-list handling shifts and drops entries), the same count, and equal
    entries at 512 positions spread over the file (its first and last 64 among them). Else None (the caller reads
    every entry, ~1 us each: 0.2 s for 191,000 frames, where this takes ~40 ms).
    """
    if not _table_usable(moov, n, stream):
        return None
    pts, key, pos, size = _table_arrays(moov, n, entries[0].timestamp)
    probe = np.unique(np.concatenate([np.arange(min(64, n)), np.arange(max(0, n - 64), n),
                                      np.linspace(0, n - 1, 384).astype(np.int64)]))
    for k in probe.tolist():
        e = entries[k]
        if e.is_discard or (e.timestamp, bool(e.is_keyframe), e.pos, e.size) != \
                (int(pts[k]), bool(key[k]), int(pos[k]), int(size[k])):
            return None
    return pts, key, pos, size


def _container_index(container, stream, payload_free: bool = False,
                     moov: Callable[[], Any] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(pts, keyframe, byte offset, size) arrays, one entry per packet in decode order, from the container's own
    sample table, without reading packets.

    The mp4 demuxer fills ``index_entries`` from the moov atom when it opens the file. Their timestamps are decode
    times, equal to presentation times only when no frame is reordered, so this path is taken only for streams
    without B-frames whose first packets agree with it entry for entry; otherwise None (demux everything instead).
    ``payload_free`` (a remote file's payload-free view): the packets' keyframe flags are not compared, since
    FFmpeg's H.264 parser takes them from the payload, which that view leaves out; the table's own flags (the
    moov's sync samples) are what the remote path takes for such packets anyway (:func:`_sync_flags`). Before,
    every remote H.264 file was demuxed packet by packet instead (1.2 s per file of 191,000 frames).
    """
    try:
        table = stream.index_entries
        n = len(table)
    except AttributeError:  # PyAV 15 (lerobot's pin): the sample table, checked against demuxed packets
        return _checked_by_demux(container, stream, payload_free, moov)
    except av.error.FFmpegError:
        return None
    if n == 0 or stream.codec_context.has_b_frames or (stream.frames and stream.frames != n):
        return None
    got = _from_sample_table(moov(), table, n, stream) if moov is not None else None
    if got is not None:
        pts, key, pos, size = got
    else:
        entries = list(table)
        if any(e.is_discard for e in entries):
            return None
        # One array per field rather than a tuple per packet: tens of thousands of tuples wake the garbage
        # collector, which then walks every object of the process (torch's included).
        pts = np.fromiter((e.timestamp for e in entries), np.int64, n)
        key = np.fromiter((e.is_keyframe for e in entries), np.bool_, n)
        pos = np.fromiter((e.pos for e in entries), np.int64, n)
        size = np.fromiter((e.size for e in entries), np.int64, n)
    for k, pkt in zip(range(min(32, n)), container.demux(stream)):
        if pkt.pts is None or (pkt.pts, pkt.pos, pkt.size) != (int(pts[k]), int(pos[k]), int(size[k])) or \
                (not payload_free and bool(pkt.is_keyframe) != bool(key[k])):
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


def _moov_table(src: Source, rel: str):
    """The mp4's sample table (:func:`lerobot_sql._storage.mp4.mp4_sample_table`, from its moov box), or None."""
    try:
        with src.open_demux(rel) as f:
            return mp4_sample_table(f)
    except (OSError, ValueError):
        return None


def _demux_index(src: Source, rel: str) -> pa.Table:
    container = open_container(src, rel, demux_only=True)
    try:
        stream = container.streams.video[0]
        packets = _container_index(container, stream, payload_free=not src.is_local, moov=lambda: _moov_table(src, rel))
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
    return stamp_of(st)


def stamp_of(st: os.stat_result) -> Stamp:
    """The :data:`Stamp` of a file from its ``os.stat`` result."""
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
    return cache_dir / cache.VIDEO_INDEX / f"{cache.key(src.url, rel, identity, INDEX_VERSION)}.parquet"


def ensure_index(src: Source, rel: str, cache_dir: Path) -> Path:
    """Build (once) and return the cached index Parquet of video file ``rel``.

    A damaged entry (truncated, garbled: see :func:`lerobot_sql._storage.cache.check`) is rebuilt once, with a warning.

    Raises:
        MissingFileError: the mp4 does not exist.
        VideoDecodeError: PyAV cannot demux it.
        DatasetFormatError: it holds more than one video stream (:func:`check_one_video_stream`).
        CacheError: the entry cannot be written.
    """
    path = index_path(src, rel, cache_dir)
    return cache.ensure(path, lambda tmp: pq.write_table(_demux_index(src, rel), tmp))


def ensure_index_arrow(src: Source, rel: str, cache_dir: Path, pin: Stamp | None = None) -> Path:
    """Build (once) the memory-mappable Arrow IPC form of the index of ``rel`` (pts, pts_s, key_row).

    ``pin``: the file's :func:`stamp` when the dataset was opened; the file must still be that one.

    Raises:
        MissingFileError: the mp4 does not exist.
        DatasetFormatError: the mp4 is not the file ``pin`` describes (replaced or rewritten since), or it holds
            more than one video stream.
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
        t = pq.read_table(parquet, columns=["pts", "pts_s", "is_keyframe", "keyframe_pts", "byte_offset",
                                            "byte_size"]) if ok else _demux_index(src, rel)
        pts = t["pts"].to_numpy()
        key_row = locate.key_rows(pts, t["keyframe_pts"].to_numpy(), t["is_keyframe"].to_numpy(zero_copy_only=False))
        # The packets' byte ranges too: a remote pipeline plans its fetches from them, and without them here it
        # built the Parquet form as well, a second demux of every mp4 (its moov read again through Python).
        out = pa.table({"pts": pts, "pts_s": t["pts_s"].to_numpy(), "key_row": key_row,
                        "byte_offset": t["byte_offset"].to_numpy(), "byte_size": t["byte_size"].to_numpy()},
                       schema=pa.schema([("pts", pa.int64()), ("pts_s", pa.float64()), ("key_row", pa.int64()),
                                         ("byte_offset", pa.int64()), ("byte_size", pa.int64())],
                                        metadata=t.schema.metadata))
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, out.schema) as w:
            w.write_table(out)

    return cache.ensure(path, write)


def _stream_probe(src: Source, rel: str) -> tuple[str | None, int | None, int | None, int | None]:
    """FFmpeg's canonical codec name (``av1``, ``h264``, ``mpeg4`` ...) and the frame height and width (pixels) of
    the file's first video stream, from its header, and how many video streams it holds (more than one: the readers
    refuse it, :func:`check_one_video_stream`); Nones if PyAV cannot open it (the video index checks then report
    the file). Remote files are opened payload-free (only the container's boxes are fetched)."""
    local = src.local_path(rel)
    try:
        with (av.open(local) if local is not None else av.open(src.open_demux(rel))) as container:
            cc = container.streams.video[0].codec_context
            return (cc.codec.canonical_name, (int(cc.height) or None), (int(cc.width) or None),
                    len(container.streams.video))
    except (av.error.FFmpegError, IndexError, LeRobotSQLError, OSError):
        return None, None, None, None


def probe_video_files(src: Source, files: list[tuple[str, str]]) -> pa.Table:
    """The rows of the view ``video_files``: for each (video_key, path) of the ``videos`` view, whether the file
    exists, its size, its stream's codec and frame size, and its number of video streams.

    Args:
        src: the dataset's :class:`lerobot_sql._storage.source.Source`.
        files: distinct (video_key, path relative to the root) pairs.

    Returns:
        Arrow table ``video_key`` string, ``path`` string, ``present`` bool, ``size_bytes`` int64 (NULL when
        missing), ``codec`` string (FFmpeg canonical name, NULL when missing or unreadable), ``height``, ``width``
        int64 (pixels, from the stream's header; NULL as codec), ``video_streams`` int64 (video streams in the
        file, audio not counted; over 1 the readers refuse the file; NULL as codec).

    Raises:
        RemoteIOError: a remote file's existence could not be asked (network down, never seen offline).
    """
    from tqdm.auto import tqdm

    keys, paths, present, sizes, probes = [], [], [], [], []
    for key, rel in tqdm(files, desc="probe videos", unit="file", disable=len(files) < 64):
        try:  # Source.size, not Source.exists: on HTTP the latter trusts the metadata's file list
            size = src.size(rel)
        except FileNotFoundError:
            size = None
        keys.append(key)
        paths.append(rel)
        present.append(size is not None)
        sizes.append(size)
        probes.append(_stream_probe(src, rel) if size is not None else (None, None, None, None))
    codecs, heights, widths, n_video = zip(*probes) if probes else ((), (), (), ())
    return pa.table([keys, paths, present, sizes, list(codecs), list(heights), list(widths), list(n_video)],
                    schema=PROBE_SCHEMA)


@dataclasses.dataclass(frozen=True)
class FrameIndex:
    """The loaded index of one mp4; arrays are sorted by pts (int64 (n,) / float64 (n,)).

    Attributes:
        path: the mp4, relative to the dataset root.
        time_base: seconds per pts unit.
        pts: presentation time of each frame, time-base units.
        pts_s: the same in seconds.
        key_row: row of the keyframe decoding must start from to reach each frame.
        byte_offset, byte_size: each frame's packet in the mp4 (int64 (n,), bytes; offset -1 when the demuxer
            gave none), None for an Arrow form written before it carried them.
    """

    path: str
    time_base: Fraction
    pts: np.ndarray
    pts_s: np.ndarray
    key_row: np.ndarray
    byte_offset: np.ndarray | None = None
    byte_size: np.ndarray | None = None

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
        packets = [t[c].to_numpy() if c in t.column_names else None for c in ("byte_offset", "byte_size")]
        return cls(meta[b"path"].decode(), Fraction(int(num), int(den)), t["pts"].to_numpy(),
                   t["pts_s"].to_numpy(), key_row, *packets)

    def locate(self, times_s: np.ndarray, tolerance_s: float, *, episode_index: int, video_key: str) -> np.ndarray:
        """Index rows (positions in ``pts``) of the frames presented at ``times_s`` (seconds in the file).

        Raises:
            FrameNotFoundError: some time has no frame within ``tolerance_s`` (:func:`lerobot_sql._readers.locate.locate`).
        """
        return locate.locate(self.pts, self.pts_s, times_s, tolerance_s, path=self.path,
                             episode_index=episode_index, video_key=video_key)
