"""The video writer of an export: videos/<video_key>/chunk-*/file-*.mp4, one writer per camera.

Each part's frames are located in the source mp4 (:mod:`lerobot_sql._readers.locate`, within ``tolerance_s``).
From the part's first keyframe on, packets are copied as they are (PyAV remux, no decode), with pts shifted to
where the episode starts in the new file. Frames before it (a window cut mid-GOP), and a run whose decode order
crosses the cut (B-frames), are decoded and re-encoded as a new GOP with the encoder settings of info.json
(``ENCODERS`` maps its decoder name to lerobot's encoder; lerobot's defaults where info.json has none). H.264/H.265
encoder output is Annex B and is rewritten length-prefixed, as an mp4 track holds it. Copied and re-encoded packets
alike get their dts from the file's frame grid, a fixed reorder lag behind (:meth:`VideoWriter._mux_run`). Files
rotate by ``video_files_size_in_mb`` (estimated from the source packets' sizes).
"""

from __future__ import annotations

import contextlib
import os
from contextlib import ExitStack
from fractions import Fraction
from typing import Any, Iterator

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from av.video.frame import PictureType

from .._readers import locate, video_index
from ..errors import DatasetFormatError, VideoDecodeError
from .parts import MAX_OPEN_INPUTS, Part, Rotator
from .target import ExportSource, ExportTarget

# info.json "video.codec" (FFmpeg decoder name) -> the encoder lerobot uses for it.
ENCODERS = {"av1": "libsvtav1", "libdav1d": "libsvtav1", "h264": "libx264", "hevc": "libx265"}


def source_rows(manifest: pa.Table, tolerance_s: float, s: ExportSource, index, skey: str, rows_m: np.ndarray,
                episode: int) -> np.ndarray:
    """Rows (int64) in ``index`` (the source mp4 of camera ``skey``) of the frames of ``manifest`` rows ``rows_m``,
    all of source episode ``episode`` of ``s``, by ``s.align`` as the dataset reads them. By time: nearest within
    ``tolerance_s`` (FrameNotFoundError) and inside the episode's clip; by
    frame_index: the clip's first frame plus the row's frame_index, which must be its position in the episode and
    lie at ``from_timestamp + frame_index / fps``.

    Raises:
        FrameNotFoundError: by time, a frame has no video frame within ``tolerance_s``.
        DatasetFormatError: a frame outside the episode's clip, off the fps grid (by frame_index), or a frame_index
            that is not its row's position (:func:`lerobot_sql._readers.locate.clip_error`).
    """
    m, fps = manifest, float(s.layout.fps)
    from_ts = m[f"{skey}/from_timestamp"].to_numpy()[rows_m]
    ep_from = m["ep_from_index"].to_numpy()[rows_m]
    pos, length = m["index"].to_numpy()[rows_m] - ep_from, m["ep_to_index"].to_numpy()[rows_m] - ep_from
    first = locate.clip_first_rows(index.pts_s, from_ts, fps)
    where = {"episode_index": episode, "video_key": skey}
    if s.align == "frame_index":
        fi = m["frame_index"].to_numpy()[rows_m]
        if (fi != pos).any():
            j = int(np.flatnonzero(fi != pos)[0])
            raise DatasetFormatError(
                f"episode {episode}: the row with frame_index {int(fi[j])} is frame {int(pos[j])} of the episode "
                "(index - its first index): align=\"frame_index\" reads frames by position. Fix the data files' "
                "frame_index (`lerobot-sql doctor`: frame_index_contiguous), or export by time")
        rows = locate.rows_by_position(index.pts_s, first, pos, length, from_ts, fps)
    else:
        ts = m["timestamp"].to_numpy()[rows_m]
        rows = locate.keep_in_clip(index.locate(locate.time_in_file(from_ts, ts), tolerance_s, **where), first, length)
    bad = np.flatnonzero(rows < 0)
    if len(bad):
        j = int(bad[0])
        more = {} if s.align == "frame_index" else {
            "time_s": float(locate.time_in_file(from_ts[j], ts[j:j + 1])[0]), "tolerance_s": tolerance_s,
            "row": int(locate.nearest(index.pts_s, locate.time_in_file(from_ts[j], ts[j:j + 1]))[0][0])}
        raise locate.clip_error(s.src.path(index.path), index.pts_s, int(rows[j]), position=int(pos[j]),
                                first=int(first[j]), length=int(length[j]), from_timestamp=float(from_ts[j]), fps=fps,
                                **where, **more)
    return rows



def copy_packets(inp, in_stream, index: video_index.FrameIndex, ra: int, rb: int, src_fd: Fraction
                 ) -> list[tuple[Any, int, int]] | None:
    """The packets of frames ``ra..rb`` (index rows; ``ra`` a keyframe) of the open mp4 ``inp`` as they are, demuxed,
    never decoded: (packet, pts, end), source time base, decode order; None if decode order crosses the cut (a frame
    after ``rb`` is decoded before one of the run: B-frames). An export's parts and a clip page's clips
    (:mod:`.clip_writer`) copy through here.

    Raises:
        VideoDecodeError: the file cannot be demuxed there, or holds another number of packets than the index says.
    """
    lo, hi = int(index.pts[ra]), int(index.pts[rb])
    frame_dur = int(round(src_fd))
    try:
        inp.seek(lo, stream=in_stream, backward=True, any_frame=False)
        pkts, seen_after = [], False
        for pkt in inp.demux(in_stream):
            if pkt.pts is None:
                continue
            if pkt.pts > hi:
                if pkt.is_keyframe:
                    break
                seen_after = True
                continue
            if pkt.pts < lo:
                continue
            if seen_after:
                return None
            pkts.append(pkt)
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{index.path}: demuxing failed near pts={lo} ({e}); the file may be corrupt") \
            from e
    if len(pkts) != rb - ra + 1:
        raise VideoDecodeError(f"{index.path}: expected {rb - ra + 1} packets between pts {lo} and {hi}, found "
                               f"{len(pkts)}; the file may be corrupt")
    return [(pkt, int(pkt.pts), int(pkt.pts) + int(pkt.duration or frame_dur)) for pkt in pkts]


def grid_dts(shown: list[int], k: int, frame_dur) -> int:
    """The dts of a packet on the frame grid: ``shown`` is the file's presentation times so far, sorted; ``k`` the
    packet's position in decode order minus the file's reorder lag (:meth:`VideoWriter._mux_run` says why). Before
    the first presented frame (k < 0) the grid is extended back by ``frame_dur`` per step (time-base units)."""
    return shown[k] if k >= 0 else shown[0] + int(round(k * frame_dur))


@contextlib.contextmanager
def keep_scheduling() -> Iterator[None]:
    """Give the calling thread its scheduling policy and priority back after the block.

    Why: opening libsvtav1 (SVT-AV1, lerobot's AV1 encoder) switches the calling thread to SCHED_FIFO priority 99
    where the process may (root, CAP_SYS_NICE, an rtprio limit), and leaves it so. Measured here as root: after an
    export that re-encoded a cut, the main thread stayed real-time, every thread it started later (DuckDB's workers)
    and every child process (DataLoader workers) inherited it, and a busy real-time DuckDB thread kept the main
    thread off its core: Ctrl-C and ``timeout=`` no longer stopped queries (signals stayed pending), and other work
    on the machine starved. The encoder's own threads keep what SVT-AV1 gives them while they encode.
    """
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    except (AttributeError, OSError):  # not Linux (no per-thread policy to keep)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.sched_getscheduler(0) != policy or os.sched_getparam(0).sched_priority != param.sched_priority:
                os.sched_setscheduler(0, policy, param)

class VideoWriter:
    """Writes videos/<key>/chunk-*/file-*.mp4 for one camera: remuxed packets, re-encoded heads of mid-GOP cuts."""

    def __init__(self, target: ExportTarget, key: str, feature_info: dict, sources: list[ExportSource],
                 manifest: pa.Table, tolerance_s: float):
        self.target, self.key, self.sources, self.m, self.tol = target, key, sources, manifest, tolerance_s
        self.rot = Rotator(target.chunks_size)
        self.out = self.stream = None
        self.tb: Fraction | None = None
        self.t_pts = 0          # where the next episode starts, output time-base units
        self.bytes = 0
        self.last_dts: int | None = None
        self.lag = 0            # the file's dts lag, frames (see _mux_run)
        self.n_muxed = 0        # packets muxed into the file
        self.shown: list[int] = []  # the file's pts so far, in presentation order
        self.files = 0
        # keyed by (source, relative path): two datasets of a collection have files of the same name
        self.inputs: dict[tuple[int, str], Any] = {}
        self.indexes: dict[tuple[int, str], tuple[video_index.FrameIndex, np.ndarray]] = {}
        self.feat_info = feature_info  # info.json's video info of the camera (encoder settings)
        self.extradata: bytes | None = None  # the codec header of the file being written

    def _index(self, source: int, rel: str, skey: str) -> tuple[video_index.FrameIndex, np.ndarray]:
        """Source mp4 ``rel``'s frame index and packet sizes, its clips checked against its frames on first use
        (:func:`lerobot_sql._readers.locate.check_clips`, as the dataset checks them before serving a frame: a clip
        chain shifted by a frame, e.g. an edit list moved, was exported one picture late, silently).

        Raises:
            DatasetFormatError: a selected episode's clip disagrees with the file's frames (naming mp4, camera, fix).
        """
        s = self.sources[source]
        if (source, rel) not in self.indexes:
            p = video_index.ensure_index(s.src, rel, s.db.cache_dir)
            index = video_index.FrameIndex.load(p)
            locate.check_clips(index.pts_s, s.clips.get(skey), rel, fps=s.layout.fps, where=s.src.path(rel),
                               video_key=skey)
            self.indexes[(source, rel)] = (index, pq.read_table(p, columns=["byte_size"])["byte_size"].to_numpy())
        return self.indexes[(source, rel)]

    def _input(self, source: int, rel: str):
        src, rel = self.sources[source].src, (source, rel)
        if rel not in self.inputs:
            if len(self.inputs) >= MAX_OPEN_INPUTS:
                old = next(iter(self.inputs))
                self.inputs.pop(old).close()
                self.indexes.pop(old, None)
            self.inputs[rel] = video_index.open_container(src, rel[1])
        return self.inputs[rel]

    def write(self, part: Part) -> dict[str, Any]:
        """Append ``part``'s frames of this camera; returns its meta/episodes columns
        ``videos/<key>/chunk_index``, ``file_index`` (int), ``from_timestamp``, ``to_timestamp`` (float seconds in
        the new file).

        Raises:
            FrameNotFoundError: a frame has no video frame within ``tolerance_s``.
            DatasetFormatError: the part's frames are not consecutive in the video, or one is not the row's
                (:func:`source_rows`).
            VideoDecodeError: the source cannot be demuxed/decoded, or no encoder for a cut exists in this PyAV.
        """
        target, key = self.target, self.key
        skey = self.sources[part.source].src_key(key)  # the camera's name in the part's source
        i0 = int(part.rows[0])
        rel = self.m[f"{skey}/file"][i0].as_py()
        index, sizes = self._index(part.source, rel, skey)
        ts = self.m["timestamp"].to_numpy()[part.rows].astype(np.float64)
        rows = source_rows(self.m, self.tol, self.sources[part.source], index, skey, part.rows, part.src_episode)
        if np.any(np.diff(rows) != 1):
            raise DatasetFormatError(f"{rel}: frames of episode {part.src_episode} ({key}) are not consecutive in "
                                     "the video; the timestamps disagree with the video (`lerobot-sql doctor`)")
        ra, rb = int(rows[0]), int(rows[-1])
        est = int(sizes[ra:rb + 1].sum())
        inp = self._input(part.source, rel)
        in_stream = inp.streams.video[0]
        in_tb = Fraction(index.time_base)
        src_fd = Fraction(1) / Fraction(self.target.fps) / in_tb  # one frame, source time-base units
        # The part's packets, in decode order, with their source pts and end (source time base), gathered before
        # anything is muxed: the file's dts lag must cover their reordering (_mux_run), or a new file starts.
        is_key = index.keyframe_pts == index.pts
        keys = np.flatnonzero(is_key[ra:rb + 1]) + ra
        rk = int(keys[0]) if len(keys) else rb + 1
        head, copied = [], []
        if rk > ra:
            head = self._encode(inp, in_stream, index, ra, rk - 1, src_fd)
            target.frames_reencoded += rk - ra
        if rk <= rb:
            copied = copy_packets(inp, in_stream, index, rk, rb, src_fd)
            if copied is None:  # frames reordered across the cut (B-frames): re-encode that part instead
                head += self._encode(inp, in_stream, index, rk, rb, src_fd)
                target.frames_reencoded += rb - rk + 1
                copied = []
            else:
                target.frames_remuxed += rb - rk + 1
        lag = reorder_depth([p for _, p, _ in head + copied])
        # A file is one stream with one codec header: another source's header (a collection's export) starts a new
        # file, as copied packets are decoded with the header of the file they are in. So does a part reordered
        # deeper than the file's dts lag (its dts would not fit between the parts before and after).
        other_header = self.out is not None and bytes(in_stream.codec_context.extradata or b"") != self.extradata
        deeper = self.out is not None and lag > self.lag
        full = self.bytes + est >= target.video_limit
        if self.out is not None and self.rot.used and (full or other_header or deeper):
            self._close_file()
            self.rot.advance()
        if self.out is None:
            # The lag is the source file's (every part of it then fits), or this part's if deeper.
            self._open(in_stream, max(lag, file_reorder_depth(index)))
        # A whole episode keeps its timestamps, so its first frame sits at from_timestamp + timestamp[0] (0 for
        # lerobot-written data); a cut one restarts at 0, as does one copied by frame_index (timestamps rewritten).
        lead = float(ts[0]) if part.whole and self.sources[part.source].align != "frame_index" else 0.0
        start_pts = self.t_pts + int(round(Fraction(lead) / self.tb)) if lead else self.t_pts
        from_ts = float(self.t_pts * self.tb)

        base, ratio = int(index.pts[ra]), in_tb / self.tb

        def out_pts(src_pts: int) -> int:
            if ratio == 1:  # the usual case: same time base, plain integer shift
                return start_pts + src_pts - base
            return start_pts + int(round((src_pts - base) * ratio))

        if copied and (self.n_muxed or head):  # another part, or this part's head, precedes the copied run
            copied[0] = (self._new_sequence(copied[0][0]), copied[0][1], copied[0][2])
        run = [(pkt, out_pts(p), out_pts(e)) for pkt, p, e in head + copied]
        self._mux_run(run)
        end_pts = max(e for _, _, e in run)
        self.bytes += est
        self.rot.used = True
        self.t_pts = max(end_pts, start_pts)
        p = f"videos/{key}/"
        return {p + "chunk_index": self.rot.chunk, p + "file_index": self.rot.file, p + "from_timestamp": from_ts,
                p + "to_timestamp": float(self.t_pts * self.tb)}

    def _open(self, in_stream, lag: int) -> None:
        rel = self.target.video_path.format(video_key=self.key, chunk_index=self.rot.chunk, file_index=self.rot.file)
        path = self.target.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self.out = av.open(str(path), "w", format="mp4", options={"movflags": "faststart"})
        self.stream = self.out.add_stream_from_template(in_stream, opaque=True)
        self.stream.time_base = in_stream.time_base
        self.out.start_encoding()
        self.tb = Fraction(self.stream.time_base)
        self.extradata = bytes(in_stream.codec_context.extradata or b"")
        self.t_pts, self.bytes, self.last_dts = 0, 0, None
        self.lag, self.n_muxed, self.shown = lag, 0, []
        self.files += 1

    def _mux_run(self, run: list[tuple[Any, int, int]]) -> None:
        """Mux ``run`` (packet, pts, end; output time base, decode order), the packets of one part.

        Every packet's dts is the pts of the frame presented ``self.lag`` frames before it in the file (the first
        ones: that many frame durations before the file's first pts), as an encoder with that reorder delay writes
        it. So the dts sit on the frame grid, strictly increasing, at most the packet's pts (the lag is at least the
        run's :func:`reorder_depth`), consistently across re-encoded and copied runs: the mp4's sample table, by
        which FFmpeg seeks, is then the source's. (Encoder dts and the copied packets' own dts, each with its own
        delay, put side by side, left a seek to a pts landing a GOP late: "decoding skipped".)
        """
        frame_dur = Fraction(1) / Fraction(self.target.fps) / self.tb
        self.shown += sorted(p for _, p, _ in run)
        for pkt, pts, end in run:
            dts = grid_dts(self.shown, self.n_muxed - self.lag, frame_dur)
            if (self.last_dts is not None and dts <= self.last_dts) or dts > pts:
                raise VideoDecodeError(f"camera {self.key!r}: packet pts {pts} would get dts {dts} (previous dts "
                                       f"{self.last_dts}, lag {self.lag} frames); the parts overlap in time, a bug "
                                       "of the export: please report it")
            pkt.stream = self.stream
            pkt.time_base = self.stream.time_base
            pkt.pts, pkt.dts = pts, dts
            # the frame's own duration: an encoder's packet carries none, and the mp4's last sample must not last 0
            # (FFmpeg's demuxer then drops it: a one-frame export decoded no frame at all)
            pkt.duration = max(int(end) - int(pts), 1)
            self.out.mux(pkt)
            self.last_dts = dts
            self.n_muxed += 1

    def _new_sequence(self, pkt):
        """``pkt`` (the first packet of a copied run that follows another part in the file) as a splice point.

        lerobot's libx265 depth streams are open-GOP: their keyframes are CRA pictures, which do not restart the
        picture order count (POC) the way an IDR does. Copied after another part (other frames, their own POCs), a
        CRA keeps counting from the part before, and the decoder outputs frames by POC across the seam: out of
        order, frames held back to the end of the file (an export of depth4 with all three episodes cut did
        this). HEVC's splice picture is BLA (broken link access): the same slice syntax as a CRA, but the POC restarts
        and the frames before it are output first. So the run's CRA slices are relabelled BLA_W_LP (nal_unit_type
        21 -> 16); its own leading pictures, which a BLA drops, are not copied anyway (their pts precede the cut).
        Other codecs: unchanged (AV1 key frames and libx264's IDRs already restart).
        """
        if self.stream.codec_context.name != "hevc":
            return pkt
        ed, data = self.extradata, bytearray(bytes(pkt))
        if len(ed) < 23 or ed[0] != 1:  # not hvcC (Annex B start codes in the mp4): left as it is
            return pkt
        size, i, changed = (ed[21] & 3) + 1, 0, False  # hvcC: each NAL unit prefixed by its length
        while i + size < len(data):
            n = int.from_bytes(data[i:i + size], "big")
            h = i + size
            if (data[h] >> 1) & 0x3F == 21:  # CRA_NUT
                data[h] = (16 << 1) | (data[h] & 0x81)  # BLA_W_LP, keeping the forbidden bit and the layer id's top bit
                changed = True
            i = h + n
        if not changed:
            return pkt
        out = av.Packet(bytes(data))
        out.pts, out.dts, out.time_base = pkt.pts, pkt.dts, pkt.time_base
        out.duration = pkt.duration
        out.is_keyframe = True
        return out

    def _encode(self, inp, in_stream, index: video_index.FrameIndex, ra: int, rb: int, src_fd: Fraction
                ) -> list[tuple[Any, int, int]]:
        """Decode frames ra..rb and encode them as a new GOP with info.json's encoder settings: (packet, pts, end),
        source time base, decode order."""
        lo, hi = int(index.pts[ra]), int(index.pts[rb])
        frames = []
        try:
            inp.seek(int(index.keyframe_pts[ra]), stream=in_stream, backward=True, any_frame=False)
            for fr in inp.decode(in_stream):
                if fr.pts is None or fr.pts < lo:
                    continue
                if fr.pts > hi:
                    break
                frames.append(fr)
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"{index.path}: decoding failed near pts={lo} ({e})") from e
        if len(frames) != rb - ra + 1:
            raise VideoDecodeError(f"{index.path}: decoded {len(frames)} frames between pts {lo} and {hi}, expected "
                                   f"{rb - ra + 1}; the file may be corrupt")
        src_pts = [int(f.pts) for f in frames]
        enc_tb = Fraction(1, int(round(self.target.fps))) if float(self.target.fps).is_integer() else \
            Fraction(self.target.fps).limit_denominator(1001) ** -1
        packets = []
        with keep_scheduling():
            cc = self._encoder(frames[0], in_stream)
            for j, fr in enumerate(frames):
                f = fr.reformat(format=cc.pix_fmt) if fr.format.name != cc.pix_fmt else fr
                f.pts, f.time_base = j, enc_tb
                # A decoded frame keeps its picture type (B, P), and libx265 obeys it as a forced type: a lone B
                # frame opening a GOP ("frame type 5 at 0") came out with unusable pts/dts on PyAV 15 (intermittently
                # PatchWelcomeError / OverflowError at mux). The encoder chooses: keyframe first, as the GOP needs.
                f.pict_type = PictureType.NONE
                packets += cc.encode(f)
            packets += cc.encode(None)
        out = []
        for pkt in packets:
            # Only the encoder's pts (frame j) is used: the dts come from the file's lag (_mux_run). libx265 under
            # PyAV 15 at times hands back an unset dts (garbage, e.g. -3.9e16) anyway.
            j = int(pkt.pts)
            p = src_pts[j] if 0 <= j < len(src_pts) else src_pts[0] + int(round(j * src_fd))
            if cc.name in ("libx264", "libx265"):
                pkt = av.Packet(annexb_to_length_prefixed(bytes(pkt)))
                pkt.is_keyframe = j == 0
            out.append((pkt, p, p + int(round(src_fd))))
        if len(out) != len(frames):
            raise VideoDecodeError(f"camera {self.key!r}: the {cc.name} encoder returned {len(out)} packets for "
                                   f"{len(frames)} frames ({index.path}, pts {lo}..{hi}); re-encoding this cut "
                                   "failed, cut windows on keyframes (even frame_index) instead")
        return out

    def _encoder(self, frame, in_stream):
        name, opts = encoder_settings(self.feat_info, in_stream.codec_context.name)
        try:
            cc = av.CodecContext.create(name, "w")
        except (av.error.FFmpegError, ValueError) as e:
            raise VideoDecodeError(f"camera {self.key!r}: no {name!r} encoder in this PyAV build to re-encode a "
                                   "mid-GOP cut; cut windows on keyframes (even frame_index) or install it") from e
        cc.width, cc.height = frame.width, frame.height
        cc.pix_fmt = self.feat_info.get("video.pix_fmt") or "yuv420p"
        fps = Fraction(self.target.fps).limit_denominator(1001)
        cc.time_base, cc.framerate = 1 / fps, fps
        cc.options = opts
        cc.open()
        return cc

    def _close_file(self) -> None:
        # Forgotten before closing: a container left set after a failed close (a full disk) would be closed again by
        # the garbage collector, after the staging folder is gone ("No such file or directory" from __dealloc__).
        out, self.out, self.stream = self.out, None, None
        if out is not None:
            out.close()

    def close(self) -> None:
        """Close the mp4 being written and every source container; each is closed even if one before it fails."""
        with ExitStack() as stack:
            for c in self.inputs.values():
                stack.callback(c.close)
            self.inputs.clear()
            self._close_file()


def encoder_settings(info: dict, codec: str) -> tuple[str, dict[str, str]]:
    """(encoder name, options) of the encoder settings ``info`` (info.json's video info of a camera) names, as
    lerobot's writer passes them (its defaults where ``info`` has none); ``codec``: the stream's codec, where
    ``info`` names none."""
    name = ENCODERS.get(info.get("video.codec") or codec, info.get("video.codec") or codec)
    opts = {"g": str(info.get("video.g") or 2), "crf": str(info.get("video.crf") or 30)}
    preset = info.get("video.preset")
    if name == "libsvtav1":
        opts["preset"] = str(12 if preset is None else preset)
    elif preset is not None:
        opts["preset"] = str(preset)
    if info.get("video.fast_decode"):
        opts["svtav1-params" if name == "libsvtav1" else "tune"] = \
            f"fast-decode={info['video.fast_decode']}" if name == "libsvtav1" else "fastdecode"
    for k, v in (info.get("video.extra_options") or {}).items():
        opts.setdefault(str(k), str(v))
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its config banner per encoder otherwise
    if name == "libx265" and "log-level" not in opts.get("x265-params", ""):
        # x265 prints ~10 "x265 [info]" lines per encoder (one per cut window) to stderr otherwise
        opts["x265-params"] = ":".join(filter(None, [opts.get("x265-params", ""), "log-level=error"]))
    return name, opts


def reorder_depth(pts) -> int:
    """How many frames a decoder holds back for ``pts`` (one run's packets in decode order, unique): the largest
    k - rank(pts[k]) over packet k, where rank is the position in presentation order; 0 without reordering (AV1),
    1 for I P B P B (lerobot's libx265 with g=2)."""
    pts = np.asarray(pts, np.int64)
    if len(pts) < 2:
        return 0
    return max(0, int((np.arange(len(pts)) - np.argsort(np.argsort(pts, kind="stable"), kind="stable")).max()))


def file_reorder_depth(index: video_index.FrameIndex) -> int:
    """:func:`reorder_depth` of a whole source mp4, from its index: decode order is the packets' byte order. 0 when
    the index has no byte offsets (a remote file's demuxer may give none): the parts then set the lag alone."""
    off = index.byte_offset
    if off is None or len(off) < 2 or (off < 0).any():
        return 0
    return reorder_depth(index.pts[np.argsort(off, kind="stable")])


def annexb_to_length_prefixed(data: bytes) -> bytes:
    """H.264/H.265 Annex B (start codes) -> the 4-byte length-prefixed NAL units an mp4 track holds."""
    out, i, n = bytearray(), 0, len(data)
    starts = []
    while i < n - 2:
        if data[i] == 0 and data[i + 1] == 0 and data[i + 2] == 1:
            starts.append(i + 3)
            i += 3
        else:
            i += 1
    for s, nxt in zip(starts, starts[1:] + [n + 3]):
        end = nxt - 3
        while end > s and data[end - 1] == 0:  # trailing zero of a 4-byte start code
            end -= 1
        nal = data[s:end]
        out += len(nal).to_bytes(4, "big") + nal
    return bytes(out) if starts else data

