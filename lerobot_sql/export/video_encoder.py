"""The video writer of an export at a lower frame rate (``db.export(sql, dest, fps=F)``): every kept frame decoded
from the source and encoded again, losslessly.

Why re-encode: at ``1 / k`` of the rate an episode keeps every k-th frame, and a remux cannot drop the others, since
each inter frame is decoded from the ones before it. Why lossless: the export at ``F`` fps must read back as
``db.dataset(sql, fps=F)`` serves the same frames, bit for bit. RGB cameras are encoded with libx264 at ``qp=0`` in
the decoded frames' own pixel format (yuv420p for lerobot's videos): H.264's lossless mode (High 4:4:4 Predictive
profile, which FFmpeg's decoder, so PyAV and torchcodec, reads), so decoding the new file gives the source's decoded
YUV planes back, and the same RGB (checked on AV1 and H.264 sources, PyAV 15.1 and 18.1). Depth maps keep their own
encoder settings from info.json (lerobot's HEVC ``gray12le`` with ``lossless=1``: the 12-bit codes survive).

One encoder per output file; each episode starts on a forced keyframe (an IDR picture), as lerobot's per-episode
encodes do, so its first frame decodes without the episode before it; no B-frames, so decode order is presentation
order and every packet's dts is its pts. Frame ``j`` of a file has pts ``j / F``; an episode's ``from_timestamp`` is
its first frame's. Files rotate by ``video_files_size_in_mb``, estimated from the bytes per frame written so far.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Iterator

import av
import numpy as np
from av.video.frame import PictureType

from ..errors import DatasetFormatError, VideoDecodeError
from .parts import Part
from .target import ExportSource, ExportTarget
from .video_writer import VideoWriter, encoder_settings, source_rows

LOSSLESS_RGB = "libx264"  # qp=0: lossless in every pixel format it takes (crf=0 only in 8-bit ones)


class EncodingVideoWriter(VideoWriter):
    """Writes videos/<key>/chunk-*/file-*.mp4 for one camera of an export at a lower frame rate: each part's frames
    (every ``part.stride``-th source frame) decoded and encoded again, losslessly (see the module docstring).
    ``depth``: the camera is a depth map (encoded with its own lossless settings from ``feature_info``)."""

    def __init__(self, target: ExportTarget, key: str, feature_info: dict, sources: list[ExportSource],
                 manifest, tolerance_s: float, *, depth: bool = False):
        super().__init__(target, key, feature_info, sources, manifest, tolerance_s)
        self.depth = depth
        self.n_file = 0  # frames in the file being written
        self.settings: dict[str, Any] = {}  # what info.json's video info of the camera says of the new files

    def write(self, part: Part) -> dict[str, Any]:
        """Append ``part``'s frames of this camera; returns its meta/episodes columns (as
        :meth:`VideoWriter.write`).

        Raises:
            FrameNotFoundError / DatasetFormatError: as :func:`source_rows`; the kept frames are not every
                ``part.stride``-th frame of the source video.
            VideoDecodeError: the source cannot be decoded, or no lossless encoder takes its pixel format.
        """
        s = self.sources[part.source]
        skey = s.src_key(self.key)
        rel = self.m[f"{skey}/file"][int(part.rows[0])].as_py()
        index, _ = self._index(part.source, rel, skey)
        rows = source_rows(self.m, self.tol, s, index, skey, part.rows, part.src_episode)
        if np.any(np.diff(rows) != part.stride):
            raise DatasetFormatError(f"{rel}: frames of episode {part.src_episode} ({self.key}) are not every "
                                     f"{part.stride}-th frame of the video; the timestamps disagree with the video "
                                     "(`lerobot-sql doctor`)")
        if self.out is not None and self.rot.used and \
                self.bytes + self.bytes / max(self.n_file, 1) * len(rows) >= self.target.video_limit:
            self._close_file()
            self.rot.advance()
        start = self.n_file
        tb = Fraction(1, int(self.target.fps))
        n = 0
        # frame by frame, decoded and encoded as they come: an episode's frames are never held together
        for fr in self._decoded(self._input(part.source, rel), index, rows):
            if self.out is None:
                self._open_encoder(fr)
            f = fr if fr.format.name == self.stream.pix_fmt else fr.reformat(format=self.stream.pix_fmt)
            f.pts, f.time_base = start + n, tb
            # the episode's first frame a keyframe (forced-idr: an IDR), the rest as the encoder chooses (a decoded
            # frame keeps its source picture type, which the encoder would obey)
            f.pict_type = PictureType.I if n == 0 else PictureType.NONE
            self._mux(self.stream.encode(f))
            n += 1
        self.n_file += n
        self.target.frames_reencoded += n
        self.rot.used = True
        p = f"videos/{self.key}/"
        fps = float(self.target.fps)
        return {p + "chunk_index": self.rot.chunk, p + "file_index": self.rot.file,
                p + "from_timestamp": start / fps, p + "to_timestamp": self.n_file / fps}

    def _decoded(self, inp, index, rows: np.ndarray) -> Iterator:
        """The frames of video ``rows`` (ascending), decoded from the keyframe before the first, one at a time.

        Raises:
            VideoDecodeError: decoding fails, or fewer frames than ``rows`` come out.
        """
        want = {int(index.pts[r]) for r in rows}
        lo, hi = int(index.pts[rows[0]]), int(index.pts[rows[-1]])
        stream = inp.streams.video[0]
        n = 0
        try:
            inp.seek(int(index.keyframe_pts[rows[0]]), stream=stream, backward=True, any_frame=False)
            for fr in inp.decode(stream):
                if fr.pts is None or fr.pts < lo:
                    continue
                if fr.pts > hi:
                    break
                if int(fr.pts) in want:
                    n += 1
                    yield fr
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"{index.path}: decoding failed near pts={lo} ({e})") from e
        if n != len(rows):
            raise VideoDecodeError(f"{index.path}: decoded {n} of the {len(rows)} frames between pts {lo} and "
                                   f"{hi}; the file may be corrupt")

    def _open_encoder(self, frame) -> None:
        """A new output file whose stream is a lossless encoder for frames like ``frame``."""
        fmt = frame.format.name
        if self.depth:
            name, opts = encoder_settings(self.feat_info, "hevc")
            fmt = self.feat_info.get("video.pix_fmt") or fmt
        else:
            name = LOSSLESS_RGB
            formats = {f.name for f in av.Codec(name, "w").video_formats or ()}
            if fmt not in formats:
                raise VideoDecodeError(f"camera {self.key!r}: its frames are {fmt}, which {name} cannot encode "
                                       f"losslessly (it takes {sorted(formats)}); an export at another frame rate "
                                       "re-encodes every kept frame: export this camera at its own rate")
            # (veryfast: half the time of the default preset for 2% more bytes, measured on small20; the output
            # is lossless at every preset)
            opts = {"qp": "0", "g": str(self.feat_info.get("video.g") or 2), "preset": "veryfast"}
        # no B-frames (dts = pts), and forced keyframes as IDR pictures (each episode decodes on its own)
        opts = {**opts, "bf": "0", "forced-idr": "1"}
        if name == "libx265":
            opts["x265-params"] = ":".join(filter(None, [opts.get("x265-params", ""), "bframes=0"]))
        rel = self.target.video_path.format(video_key=self.key, chunk_index=self.rot.chunk, file_index=self.rot.file)
        path = self.target.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self.out = av.open(str(path), "w", format="mp4", options={"movflags": "faststart"})
        try:
            self.stream = self.out.add_stream(name, rate=int(self.target.fps), options=opts)
        except (av.error.FFmpegError, ValueError) as e:
            raise VideoDecodeError(f"camera {self.key!r}: no {name!r} encoder in this PyAV build, which an export "
                                   "at another frame rate needs") from e
        self.stream.width, self.stream.height, self.stream.pix_fmt = frame.width, frame.height, fmt
        self.files += 1
        self.settings = {"video.codec": "hevc" if name == "libx265" else "h264", "video.pix_fmt": fmt,
                         "video.g": int(opts["g"])}
        if not self.depth:  # info.json's encoder keys, where the source has them: what a later cut re-encodes with
            self.settings.update({"video.crf": 0, "video.preset": "veryfast", "video.fast_decode": 0,
                                  "video.extra_options": {"qp": 0}})

    def _mux(self, packets) -> None:
        for pkt in packets:
            pkt.dts = pkt.pts  # no B-frames: decode order is presentation order (libx265 under PyAV 15 can hand
            # back an unset dts)
            self.bytes += pkt.size
            self.out.mux(pkt)

    def _close_file(self) -> None:
        # Forgotten before closing (as VideoWriter's): a failed close must not leave it to the garbage collector.
        out, stream, self.out, self.stream = self.out, self.stream, None, None
        self.bytes, self.n_file = 0, 0  # (the next file's counts)
        if out is None:
            return
        try:
            for pkt in stream.encode(None):  # the encoder's delayed frames
                pkt.dts = pkt.pts
                out.mux(pkt)
        finally:
            out.close()

    def info(self, base: dict) -> dict:
        """``base`` (info.json's video info of the camera) for the new files: their fps, codec, pixel format and
        (where ``base`` has encoder keys) encoder settings."""
        out = {**base, "video.fps": int(self.target.fps)}
        out.update({k: v for k, v in self.settings.items()
                    if k in ("video.codec", "video.pix_fmt") or k in base})
        return out
