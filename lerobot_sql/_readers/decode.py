"""Decoding: a pool of reusable PyAV decoders per process, writing RGB frames (or a depth map's 12-bit codes) straight
into caller arrays.

``DecoderPool`` keeps open decoders per process and reaches each target by decoding forward from where the decoder
stands, seeking (straight to the target's keyframe) only when that keyframe lies further ahead than ``reach``. The
rows it decodes come from a file's :class:`~lerobot_sql._readers.video_index.FrameIndex` (where a frame is:
:mod:`lerobot_sql._readers.locate`); each file is checked against its pin and its declared frame size when it opens.
Frames are converted by swscale to planar RGB where that was seen to equal the packed rgb24 conversion. The mp4s of
a depth camera (``gray`` files of the pool) are converted to ``gray12le`` instead, as lerobot 0.6's
``frame.to_ndarray(format="gray12le")``: uint16 codes 0..4095, dequantized by the dataset.

``decode_every_frame`` is the other use of an open file: one forward pass over all of it, keeping only what the
decoder outputs (``lerobot-sql doctor --decode``); ``probe_seeks`` the third: seeks to keyframes, as the readers
seek, checking each lands where it was asked.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from fractions import Fraction

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from .. import _settings
from .._storage.source import Source
from ..errors import DatasetFormatError, LeRobotSQLError, VideoDecodeError, warn
from .video_index import FrameIndex, Stamp, changed_error, open_container, stamp_of


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

        warn(f"{path}: video frames{said} are {h}x{w} (HxW) but {want}; serving the file's own size "
             "(as lerobot does), so items of this camera differ in shape across files")


class _OpenFile:
    """One open container positioned somewhere in its stream, decoding forward.

    ``pos`` is the index row of the frame the decoder will output next (None after an error or before the first
    seek): a target at or after ``pos`` whose keyframe is not far ahead is reached by decoding forward, anything else
    by one seek straight to the target's keyframe. Frames are converted by one ``VideoReformatter`` kept for the
    file, single-threaded (swscale's default spawns a thread pool per call, which costs more than a small frame).
    """

    def __init__(self, src: Source, rel: str, threads: int, thread_type: str = "AUTO", gray: bool = False):
        self.rel = rel
        self.gray = gray  # a depth map's stream: one uint16 plane of 12-bit codes per frame, not RGB
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
        # what keeping it open costs (DecoderPool's budget): the demuxer's index and the decoder's frames, bytes
        self.cost = int(self.stream.frames or 0) * INDEX_BYTES_PER_FRAME + \
            (cc.width or 0) * (cc.height or 0) * 3 // 2 * (DECODER_FRAMES + max(threads, 1))
        self.frames = None
        self.pos: int | None = None
        self.planar: bool | None = None
        self.seeks = 0    # counters for tests and benchmarks
        self.sought = False
        self.decoded = 0

    def _seek(self, index: FrameIndex, key_row: int) -> None:
        self.container.seek(int(index.pts[key_row]), stream=self.stream, backward=True, any_frame=False)
        self.frames = self.container.decode(self.stream)
        self.pos = key_row
        self.seeks += 1
        self.sought = True  # the next frame decoded must be a keyframe (:meth:`_unkeyed_after_seek`)

    def _unkeyed_after_seek(self, frame) -> bool:
        """Whether ``frame`` is the first decoded after a seek and no keyframe: the file calls a non-keyframe a
        sync sample (its stss), and decoding from it gives a picture predicted from nothing (MPEG-4 part 2 and HEVC
        on PyAV 15 gave garbage, no error; hostile review 19). Clears the seek's mark."""
        first, self.sought = self.sought, False
        return first and not frame.key_frame

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
        if self.gray:
            # lerobot 0.6: frame.to_ndarray(format="gray12le"), (H, W) uint16; a gray12le stream (its depth encoder's
            # output) passes through unconverted, any other pixel format through the same swscale conversion
            out[0] = self.reformatter.reformat(frame, format="gray12le", **_SWS_KW).to_ndarray()
            return
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
        return (1 if self.gray else 3), cc.height, cc.width

    @property
    def dtype(self) -> type:
        return np.uint16 if self.gray else np.uint8

    def decode_into(self, index: FrameIndex, rows: np.ndarray, out: np.ndarray, reach: int) -> None:
        """Write the frames at index ``rows`` into ``out[j]`` ((len(rows), 3, H, W) uint8; (len(rows), 1, H, W)
        uint16 for a ``gray`` file), in one forward pass over the sorted rows where the keyframes allow it."""
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
                    if self._unkeyed_after_seek(frame):
                        self.pos = None
                        raise VideoDecodeError(
                            f"{self.path}: the frame at pts={p} that a seek to keyframe pts={int(index.pts[kr])} "
                            "gave is not a keyframe: the file lists a non-keyframe as a sync sample (its stss box), "
                            "so frames decoded from there would be wrong. Re-mux or re-encode the file (ffmpeg -i "
                            "in.mp4 -c:v libsvtav1 -g 2 out.mp4), or leave the camera out (dataset(..., "
                            "cameras=[...]))")
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


# What an open mp4 costs a process, as measured (180x320 H.264, 39 files of 191,000 frames: 44 bytes per frame of
# FFmpeg's demuxer index; av 15): the container's index of every packet, and the decoder's reference and threads'
# frames (YUV 4:2:0, 1.5 bytes per pixel).
INDEX_BYTES_PER_FRAME = 48
DECODER_FRAMES = 8


def decoder_budget() -> int:
    """Bytes of open decoders a process keeps (:class:`DecoderPool`): ``$LSQL_DECODER_MB`` megabytes, default 512
    (all 39 mp4s of the 10,000-episode benchmark set, 3 cameras at 180x320: each file's index of 191,000 frames is
    ~9 MB; a file of 1080p frames adds ~25 MB of decoder frames).

    Raises:
        SettingError: the variable is not a finite number of megabytes > 0 (naming it).
    """
    return _settings.megabytes("LSQL_DECODER_MB", 512, "open decoders a process keeps")


class DecoderPool:
    """Open decoders of one process, least recently used closed first once there are more than ``max_open`` or
    their estimated memory (:attr:`_OpenFile.cost`) passes ``max_bytes`` (default :func:`decoder_budget`); the one
    just used always stays. Each is reused for forward reads.

    Why bytes: a pool bounded by count alone holds 16 x 9 MB for 180x320 files of 191,000 frames and thrashes over
    39 of them (an ``av.open`` of such a file is ~15 ms, 3 per random item), while 16 files of long 1080p episodes
    hold far more; the budget keeps as many open as fit.

    A pool must be created in the process that uses it: the dataset makes one lazily per worker. Several threads may
    share a pool as long as each file is used by one thread at a time (the dataset decodes each camera, i.e. each
    file, in its own thread).

    Args:
        threads: FFmpeg decoder threads per open file; 1 suits seeking and small frames, 0 lets FFmpeg choose.
        gray: the mp4s (paths relative to the root) of depth cameras: decoded to 12-bit gray codes, not RGB.
        reach: how many frames past the current position a target's keyframe may lie before a seek is cheaper
            than decoding forward.
    """

    def __init__(self, src: Source, max_open: int = 64, threads: int = 1, reach: int = 2,
                 thread_type: str = "AUTO", pins: dict[str, Stamp | None] | None = None,
                 declared: dict[str, tuple[str, tuple[int, int]]] | None = None,
                 gray: frozenset[str] | set[str] = frozenset(), max_bytes: int | None = None):
        self.src, self.max_open, self.threads, self.reach = src, max_open, threads, reach
        self.max_bytes = decoder_budget() if max_bytes is None else int(max_bytes)
        self._bytes = 0  # the open files' cost
        self.gray = frozenset(gray)
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
            if f is not None:
                self._bytes -= f.cost  # ``_bytes`` counts the files in ``_open``, not those in use
        if f is None:
            f = _OpenFile(self.src, rel, self.threads, self.thread_type, gray=rel in self.gray)
            try:
                check_resolution(f.path, f.shape[1:], *self.declared.get(rel, (None, None)))
            except BaseException:
                f.close()
                raise
        return f

    def _give(self, f: _OpenFile) -> None:
        with self._lock:
            other = self._open.pop(f.rel, None)
            if other is not None:  # another thread opened the same file meanwhile
                self._bytes -= other.cost
                if other is not f:
                    self._retire(other)
            self._open[f.rel] = f
            self._bytes += f.cost
            while len(self._open) > 1 and (len(self._open) > self.max_open or self._bytes > self.max_bytes):
                old = self._open.popitem(last=False)[1]
                self._bytes -= old.cost
                self._retire(old)

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
        out["open_bytes"] = self._bytes
        return out

    def decode(self, index: FrameIndex, rows: np.ndarray) -> dict[int, np.ndarray]:
        """HWC uint8 RGB frames (dict pts -> (H, W, 3) array) for the given rows of ``index``'s file."""
        frames = self.decode_chw(index, rows)
        return {int(index.pts[r]): frames[j].transpose(1, 2, 0) for j, r in enumerate(np.asarray(rows))}

    def decode_chw(self, index: FrameIndex, rows: np.ndarray, alloc=None) -> np.ndarray:
        """RGB frames at ``rows`` of ``index``'s file: uint8 (len(rows), 3, H, W), in the order of ``rows``; for a
        ``gray`` (depth) file the 12-bit codes lerobot 0.6 decodes, uint16 (len(rows), 1, H, W) in 0..4095.
        ``alloc(shape, dtype)``: returns the array to write into (e.g. a view of a batch tensor), called once the
        file's frame shape is known; default ``np.empty``.

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
                # the four numbers, not stamp_of: building the identity string per call cost ~1% of an item
                if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != pin[:4]:
                    raise changed_error(self.src, index.path, pin, stamp_of(st))
            out = (alloc or np.empty)((len(rows), *f.shape), f.dtype)
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
            self._bytes = 0


@dataclasses.dataclass(frozen=True)
class DecodedStream:
    """What FFmpeg outputs when one mp4 is decoded front to back (:func:`decode_every_frame`).

    Attributes:
        path: the mp4, relative to the dataset root.
        time_base: seconds per pts unit (None when the file did not open).
        pts: int64 (n,): each output frame's pts, time-base units, in the order the decoder output them (a sound
            file: its index's pts, increasing); frames without a pts are left out and counted in ``no_pts``.
        no_pts: frames output without a pts.
        corrupt_pts: int64: pts of the frames FFmpeg output but flagged corrupt (concealed decode errors).
        discarded_pts: int64: pts of the packets the container marks to be dropped after decoding (an edit list
            starting the stream after them, as a stream-copied cut writes): the decoder outputs no frame for them.
        n_errors: packets (or demux / flush steps) that raised.
        error: the first of those errors, ``"ClassName: message"``, or None.
        error_pts: pts of the packet whose decoding raised first (None: it was not a packet's, e.g. the open, the
            demuxer or the final flush, or no error).
        frames_before_error: frames output before the first error (None without one).
    """

    path: str
    time_base: Fraction | None
    pts: np.ndarray
    no_pts: int = 0
    corrupt_pts: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, np.int64))
    discarded_pts: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, np.int64))
    n_errors: int = 0
    error: str | None = None
    error_pts: int | None = None
    frames_before_error: int | None = None


def decode_every_frame(src: Source, rel: str, threads: int = 0) -> DecodedStream:
    """Decode every frame of video ``rel`` in one forward pass and record what the decoder outputs (nothing is
    converted or kept but the pts): what ``lerobot-sql doctor --decode`` compares with the file's index.

    The container is opened and threaded as the readers' decoders are (:class:`_OpenFile`). Packets are fed one by
    one, so a packet that fails to decode is counted and the pass goes on to the next one (the frames it held show
    as missing); a demuxer error (a file cut short) ends the pass, and the decoder is drained.

    Args:
        src: the dataset's source. rel: the mp4, relative to the root (a remote file is read whole).
        threads: FFmpeg decoder threads (0: FFmpeg picks, about one per core; a forward pass over a whole file can
            use frame threads, which the readers' seeks cannot). The output order does not depend on it.

    Returns:
        :class:`DecodedStream`; a file that cannot be opened is one with no frames and the open's error. Never
        raises for a damaged file.
    """
    try:
        f = _OpenFile(src, rel, threads)
    except (LeRobotSQLError, OSError) as e:
        return DecodedStream(rel, None, np.empty(0, np.int64), n_errors=1, error=f"{type(e).__name__}: {e}",
                             frames_before_error=0)
    pts: list[int] = []
    corrupt: list[int] = []
    discarded: list[int] = []
    no_pts = n_errors = 0
    first: tuple | None = None  # (error text, packet pts, frames output before it)

    def take(frames) -> None:
        nonlocal no_pts
        for fr in frames:
            if fr.pts is None:
                no_pts += 1
                continue
            pts.append(fr.pts)
            if getattr(fr, "is_corrupt", False):  # PyAV 15 has it too; getattr in case a build lacks it
                corrupt.append(fr.pts)

    try:
        cc = f.stream.codec_context
        packets = f.container.demux(f.stream)
        while True:
            try:
                pkt = next(packets)
            except StopIteration:  # the demuxer's last packet (no data) has flushed the decoder
                break
            except (av.error.FFmpegError, OSError) as e:  # cut short, or a remote read failed: drain what is held
                n_errors += 1
                first = first or (f"{type(e).__name__}: {e} (while demuxing)", None, len(pts))
                try:
                    take(cc.decode(None))
                except (av.error.FFmpegError, OSError):
                    pass
                break
            if pkt.is_discard and pkt.pts is not None:
                discarded.append(pkt.pts)
            try:
                take(cc.decode(pkt))
            except (av.error.FFmpegError, OSError) as e:
                n_errors += 1
                first = first or (f"{type(e).__name__}: {e}", pkt.pts, len(pts))
        tb = f.stream.time_base
    finally:
        f.close()
    return DecodedStream(rel, tb, np.asarray(pts, np.int64), no_pts, np.asarray(corrupt, np.int64),
                         np.asarray(discarded, np.int64), n_errors, *(first or (None, None, None)))


# Keyframes a seek probe tries per file (evenly spread, first and last included): bounded, as each is a seek and a
# flush plus the frames up to the keyframe.
SEEK_PROBES = 64


def probe_seeks(src: Source, rel: str, index: FrameIndex, limit: int = SEEK_PROBES) -> tuple[int, list[tuple]]:
    """Seek to keyframes of video ``rel`` the way the readers do (:meth:`_OpenFile._seek`: to the keyframe's pts,
    backward, single-threaded) and check that the first frame decoded at or after it is that keyframe. An mp4 can
    decode right front to back and still fail here: FFmpeg seeks by the sample table (the dts), so dts that
    disagree with the pts land a seek on a later keyframe, and every item reached through that seek raises
    "decoding skipped".

    Args:
        src: the dataset's source. rel: the mp4, relative to the root. index: its :class:`FrameIndex`.
        limit: at most this many keyframes, evenly spread over the file (first and last included).

    Returns:
        (keyframes probed, failures): each failure ``(asked, got, error)``: the keyframe's pts (time-base units),
        the pts of the first frame decoded at or after it (None: none before the stream ended or an error) and the
        error text (None). Never raises for a damaged file: one that does not open gives ``(0, [])`` (the forward
        decode reports it).
    """
    keys = np.unique(index.key_row)
    if len(keys) > limit:
        keys = keys[np.unique(np.linspace(0, len(keys) - 1, limit).round().astype(np.int64))]
    try:
        f = _OpenFile(src, rel, threads=1)
    except (LeRobotSQLError, OSError, av.error.FFmpegError):
        return 0, []
    bad = []
    try:
        for kr in keys:
            want, got, err = int(index.pts[kr]), None, None
            try:
                f._seek(index, int(kr))
                for frame in f.frames:
                    if f._unkeyed_after_seek(frame):  # (as decode_into refuses it)
                        err = f"the first frame decoded, pts={frame.pts}, is not a keyframe"
                        break
                    if frame.pts is not None and frame.pts >= want:
                        got = int(frame.pts)
                        break
            except (av.error.FFmpegError, OSError) as e:
                err = f"{type(e).__name__}: {e}"
            if got != want:
                bad.append((want, got, err))
    finally:
        f.close()
    return len(keys), bad
