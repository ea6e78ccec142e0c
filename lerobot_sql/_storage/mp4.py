"""The payload-free view of an mp4 for demuxing: its boxes as they are, its media payload as zeros, and the video
track's sample table read from the ``moov`` box alone (ISO/IEC 14496-12).

A remote video index then costs the container's ``moov`` box and a few box headers, never the media bytes
(:meth:`lerobot_sql._storage.source.Source.open_demux`). Knows bytes and boxes only: no dataset format, no decoder.
"""

from __future__ import annotations

import io
import struct
from typing import Callable, NamedTuple

import numpy as np

HEAD_READ = 32 << 10  # bytes fetched with each mp4 box header when building a remote video index (PyAV's block)


class PayloadFreeMP4(io.RawIOBase):
    """Reads an ISO-BMFF file with the payload of every top-level ``mdat`` box replaced by zeros (never fetched).

    Args:
        f: a seekable binary file object over the whole mp4.
        missing: ``missing(start, end)`` is true when bytes ``[start, end)`` are not cached yet; with ``fetch``
            (``fetch(start, end)`` caches them), box headers and the ``moov`` box are fetched in few round trips
            (:meth:`lerobot_sql._storage.source.Source.missing` / ``fetch`` of a remote root). None: read as is.
    """

    def __init__(self, f, missing: Callable[[int, int], bool] | None = None,
                 fetch: Callable[[int, int], object] | None = None):
        self.f = f
        self.size = f.size if hasattr(f, "size") else f.seek(0, 2)
        self.pos = 0
        self.holes: list[tuple[int, int]] = []
        off = 0
        if missing is None:
            fetch = None
        while off + 8 <= self.size:  # walk the top-level boxes by their headers
            if fetch is not None and missing(off, min(self.size, off + 16)):
                # A box header plus what the demuxer reads next (ftyp's rest, the first packets after an mdat
                # header: the container probe reads them) in one request instead of several 16-byte ones.
                fetch(off, min(self.size, off + HEAD_READ))
            f.seek(off)
            head = f.read(16)
            size, typ = struct.unpack(">I4s", head[:8])
            hdr = 8
            if size == 1:
                size, hdr = struct.unpack(">Q", head[8:16])[0], 16
            elif size == 0:
                size = self.size - off
            if size < hdr:
                break  # not a box: let the demuxer see the bytes as they are
            if typ == b"moov" and fetch is not None:
                # The demuxer reads moov in 32 KiB steps (a growing readahead: ~6 round trips for a 1 MB moov);
                # its size is known here, so fetch it in one request.
                fetch(off, min(self.size, off + size + HEAD_READ))
            if typ == b"mdat":
                self.holes.append((off + hdr, off + size))
            off += size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:
        n = min(len(b), self.size - self.pos)
        if n <= 0:
            return 0
        out = bytearray(n)
        pos, end = self.pos, self.pos + n
        for a, z in self.holes + [(self.size, self.size)]:
            if z <= pos:
                continue
            if a > pos:  # real bytes up to the next hole
                stop = min(a, end)
                self.f.seek(pos)
                out[pos - self.pos:stop - self.pos] = self.f.read(stop - pos)
                pos = stop
            if pos >= end:
                break
            pos = min(z, end)  # zeros inside the hole
            if pos >= end:
                break
        b[:n] = out
        self.pos += n
        return n

    def close(self) -> None:
        self.f.close()
        super().close()


MOOV_MAX = 256 << 20  # a moov larger than this is not a LeRobot video (and not worth holding in memory)


def _mp4_boxes(buf: bytes, start: int = 0, end: int | None = None):
    """(type, payload start, payload end) of each box in ``buf[start:end]``; stops at the first malformed header."""
    end = len(buf) if end is None else end
    off = start
    while off + 8 <= end:
        size, typ = struct.unpack_from(">I4s", buf, off)
        hdr = 8
        if size == 1:
            if off + 16 > end:
                return
            size, hdr = struct.unpack_from(">Q", buf, off + 8)[0], 16
        elif size == 0:
            size = end - off
        if size < hdr or off + size > end:
            return
        yield typ, off + hdr, off + size
        off += size


class Mp4Samples(NamedTuple):
    """An mp4 video track's sample table (ISO/IEC 14496-12 8.6-8.7), one entry per sample in decode order."""
    sizes: tuple[int, ...]  # bytes of each sample (stsz)
    sync: frozenset[int] | None  # 1-based numbers of the sync samples (stss); None: every sample is one
    offsets: np.ndarray | None  # int64: byte offset of each sample in the file (stsc + stco/co64); None if unknown
    deltas: np.ndarray | None  # int64: decode-time step after each sample, in the track's time base (stts)
    reordered: bool  # a ctts box: presentation order differs from decode order (B-frames)
    file_size: int  # bytes of the file as read
    edited: bool = False  # an edit list (elst) other than one edit of the whole media from time 0
    track_id: int | None = None  # the trak's tkhd track_ID: FFmpeg's AVStream.id (PyAV's stream.id) for it


def _sample_deltas(n: int, stts) -> np.ndarray | None:
    """Each sample's decode-time step (int64 (n,)), from the ``stts`` runs (count, delta); None when the runs do not
    count ``n`` samples. Vectorised: a Python loop took 23 ms for 191,000 samples."""
    if not stts:
        return None
    runs = np.asarray(stts, np.int64).reshape(-1, 2)
    if int(runs[:, 0].sum()) != n:
        return None
    return np.repeat(runs[:, 1], runs[:, 0])


def _sample_offsets(sizes, stsc, chunks) -> np.ndarray | None:
    """Each sample's byte offset (int64): chunk k (1-based) holds the samples-per-chunk of the last stsc run starting
    at or before k, packed from the chunk's offset. None when the tables disagree with the sample count.
    Vectorised: a Python loop over the samples took 71 ms for 191,000 of them."""
    if not stsc or not chunks or stsc[0][0] != 1:
        return None
    n_chunks, n = len(chunks), len(sizes)
    runs = np.asarray(stsc + [(n_chunks + 1, 0)], np.int64).reshape(-1, 2)
    first, nxt = runs[:-1, 0], runs[1:, 0]
    if (first > nxt).any() or (nxt > n_chunks + 1).any() or (runs[:-1, 1] < 0).any():
        return None
    per_chunk = np.repeat(runs[:-1, 1], nxt - first)  # samples in each chunk, chunks 1..n_chunks in order
    if len(per_chunk) > n_chunks or int(per_chunk.sum()) != n:
        return None
    size = np.asarray(sizes, np.int64)
    start = np.concatenate([[0], np.cumsum(size)[:-1]]) if n else size  # bytes before each sample, in order
    chunk_of = np.repeat(np.arange(len(per_chunk)), per_chunk)
    first_sample = np.cumsum(per_chunk) - per_chunk  # each chunk's first sample
    base = np.asarray(chunks, np.int64)[chunk_of]
    return base + start - start[first_sample][chunk_of]


# hdlr handler types FFmpeg's mov demuxer turns into a stream type (mov_read_hdlr); others (a QuickTime minf's
# 'alis' data handler) leave the type as it was
_MEDIA_HANDLERS = (b"vide", b"soun", b"m1a ", b"subp", b"clcp", b"text", b"sbtl", b"subt")


def _children(buf: bytes, a: int, z: int) -> dict[bytes, list[tuple[int, int]]]:
    """The boxes directly inside box ``buf[a:z]``, by type: ``{type: [(start, end), ...]}``, in file order."""
    out: dict[bytes, list[tuple[int, int]]] = {}
    for t, a2, z2 in _mp4_boxes(buf, a, z):
        out.setdefault(t, []).append((a2, z2))
    return out


def mp4_sample_table(f) -> Mp4Samples | None:
    """The sample table of an mp4's first video track, read from its ``moov`` box only (no media payload).

    For PyAV < 16, which has no ``stream.index_entries``: on the payload-free view (:class:`PayloadFreeMP4`) the
    H.264 parser cannot see which packets are keyframes, so the flags come from the container's own table
    (ISO/IEC 14496-12 8.6.2 ``stss``), as FFmpeg's mov demuxer takes them.

    Args:
        f: a seekable binary file object over the whole mp4 (the payload-free view is enough).

    PyAV 15 also demuxes a truncated file only up to the cut, where PyAV 16's ``index_entries`` list every sample
    of the moov; the offsets and decode-time deltas here let the index keep the samples past the cut (see
    video._demux_index), so a cut file is reported as such rather than as clips that run past the video.

    Returns:
        :class:`Mp4Samples`, or None when the file has no ``moov`` with a video track and an ``stsz`` (fragmented
        or malformed files: the caller then reads packets with their payload). The caller matches the sizes
        against the demuxed packets before trusting the numbering. Hostile sizes and counts give None, never an exception or a huge allocation.
    """
    try:
        size = f.seek(0, 2)
        off, moov = 0, None
        while off + 8 <= size:  # the top-level boxes, by their headers
            f.seek(off)
            head = f.read(16)
            if len(head) < 8:
                return None
            box, typ = struct.unpack(">I4s", head[:8])
            hdr = 8
            if box == 1 and len(head) == 16:
                box, hdr = struct.unpack(">Q", head[8:16])[0], 16
            elif box == 0:
                box = size - off
            if box < hdr:
                return None
            if typ == b"moov":
                if box > MOOV_MAX:
                    return None
                f.seek(off)
                moov = f.read(box)
                break
            off += box
        if moov is None or len(moov) < 8:
            return None
        if any(t == b"mvex" for t, _a, _z in _mp4_boxes(moov, 8)):
            return None  # fragmented (moof boxes after the moov hold more samples than its table; hostile review 18)
        video = []
        for typ, a, z in _mp4_boxes(moov, 8):
            if typ != b"trak":
                continue
            # One of each box on the way to the table, and the track's type as FFmpeg takes it: every hdlr it
            # meets (mdia's and minf's) sets the type, the last one wins. A second mdia, minf or stbl (FFmpeg keeps
            # the last copy of each table, this reader read the first), or a copy of the video track whose minf
            # hdlr says sound (FFmpeg: not video; this reader took its table) gave another track's index (hostile
            # review 19): such files are no table.
            kids = _children(moov, a, z)
            if len(kids.get(b"mdia", ())) != 1 or len(kids.get(b"edts", ())) > 1 or len(kids.get(b"tkhd", ())) != 1:
                return None
            mdia = _children(moov, *kids[b"mdia"][0])
            if len(mdia.get(b"minf", ())) != 1 or len(mdia.get(b"hdlr", ())) > 1:
                return None
            minf = _children(moov, *mdia[b"minf"][0])
            if len(minf.get(b"stbl", ())) != 1:
                return None
            handlers = [moov[a2 + 8:a2 + 12] for a2, z2 in (*mdia.get(b"hdlr", ()), *minf.get(b"hdlr", ()))
                        if z2 - a2 >= 12]
            media = [h for h in handlers if h in _MEDIA_HANDLERS]
            if not media or media[-1] != b"vide":
                continue
            if len(media) > 1:
                return None  # two media types in one track: what FFmpeg makes of it depends on their order
            video.append((kids, minf[b"stbl"][0]))
        if len(video) != 1:
            return None  # (several video tracks: the one FFmpeg streams is not decided here)
        (kids, stbl), = video
        ta, tz = kids[b"tkhd"][0]
        version = moov[ta] if tz - ta >= 24 else None
        track_id = struct.unpack_from(">I", moov, ta + (20 if version == 1 else 12))[0] \
            if version is not None and tz - ta >= (24 if version == 1 else 16) else None
        sizes = sync = stts = stsc = chunks = None
        reordered = edited = False
        # A table FFmpeg may read otherwise is no table (the caller demuxes every packet): a box twice (FFmpeg
        # keeps the first or the last, by version), stco and co64 both, sync samples out of order or past the
        # count, or more than one sample description (FFmpeg skips the chunks naming one it lacks); hostile
        # review 17
        tables = _children(moov, *stbl)
        if any(len(tables.get(t, ())) > 1 for t in (b"stsz", b"stss", b"stts", b"stsc", b"stco", b"co64", b"stsd")) \
                or (b"stco" in tables and b"co64" in tables):
            return None
        edts = kids[b"edts"][0] if b"edts" in kids else None
        if edts is not None:
            for t, a2, z2 in _mp4_boxes(moov, *edts):
                if t == b"elst" and z2 - a2 >= 8:
                    version, n = moov[a2], struct.unpack_from(">I", moov, a2 + 4)[0]
                    w = 20 if version == 1 else 12
                    if n != 1 or 8 + w * n > z2 - a2:
                        edited = True
                    else:  # (segment duration, media time, rate): one edit from media time 0 at rate 1
                        media = struct.unpack_from(">q" if version == 1 else ">i", moov,
                                                   a2 + 8 + (8 if version == 1 else 4))[0]
                        rate = struct.unpack_from(">i", moov, a2 + 8 + w - 4)[0]
                        edited = media != 0 or rate != 1 << 16
        for t, a2, z2 in _mp4_boxes(moov, *stbl):
            if t == b"stsz" and z2 - a2 >= 12:  # (stz2, compact sizes, is not written by FFmpeg: None)
                one, n = struct.unpack_from(">II", moov, a2 + 4)
                if one:
                    sizes = (one,) * min(n, 1 << 24) if n <= 1 << 24 else None
                elif 12 + 4 * n <= z2 - a2:
                    sizes = struct.unpack_from(f">{n}I", moov, a2 + 12)
                else:
                    return None  # the table claims more entries than its box holds
            elif t == b"stss" and z2 - a2 >= 8:
                n = struct.unpack_from(">I", moov, a2 + 4)[0]
                if 8 + 4 * n > z2 - a2:
                    return None  # the table claims more entries than its box holds
                listed = struct.unpack_from(f">{n}I", moov, a2 + 8)
                if any(b <= a for a, b in zip(listed, listed[1:])) or (listed and listed[0] < 1):
                    return None  # not strictly increasing from 1: FFmpeg reads them in order, a set would not
                sync = frozenset(listed)
            elif t in (b"stts", b"stsc", b"stco", b"co64") and z2 - a2 >= 8:
                n = struct.unpack_from(">I", moov, a2 + 4)[0]
                w = {b"stts": 8, b"stsc": 12, b"stco": 4, b"co64": 8}[t]
                if 8 + w * n > z2 - a2:
                    return None
                v = struct.unpack_from(f">{n * w // 4}I" if t != b"co64" else f">{n}Q", moov, a2 + 8)
                if t == b"stts":
                    stts = list(zip(v[0::2], v[1::2]))
                elif t == b"stsc":
                    if any(d != 1 for d in v[2::3]):
                        return None  # a chunk of another sample description
                    stsc = list(zip(v[0::3], v[1::3]))
                else:
                    chunks = v
            elif t == b"ctts":
                reordered = True
            elif t == b"stsd" and (z2 - a2 < 8 or struct.unpack_from(">I", moov, a2 + 4)[0] != 1):
                return None  # more than one sample description
        if sizes is None or (sync and max(sync) > len(sizes)):
            return None
        return Mp4Samples(sizes, sync, _sample_offsets(sizes, stsc, chunks), _sample_deltas(len(sizes), stts),
                          reordered, size, edited, track_id)
    except (OSError, ValueError, struct.error):
        return None


def mp4_sync_samples(f) -> tuple[tuple[int, ...], frozenset[int] | None] | None:
    """(sample sizes, sync-sample numbers) of :func:`mp4_sample_table`, or None."""
    t = mp4_sample_table(f)
    return None if t is None else (t.sizes, t.sync)
