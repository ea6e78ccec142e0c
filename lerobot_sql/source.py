"""Where a dataset lives: a root on some fsspec filesystem, and how to name, open and identify its files.

Everything above this module speaks of paths relative to the dataset root (``data/chunk-000/file-000.parquet``).
Roots may be local paths, any fsspec URL (``s3://``, ``gs://``, ``http(s)://``, ...) or a Hugging Face Hub dataset
(``hf://datasets/<org>/<name>[@revision]`` or plain ``<org>/<name>``). Remote roots are read through
:class:`lerobot_sql.remote.RemoteCacheFS`: byte ranges on demand, cached on disk.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import fnmatch
import io
import json
import os
import re
import struct
import tempfile
from typing import Any, NamedTuple

import fsspec

from . import cache
from .errors import (DatasetFormatError, LeRobotSQLError, MissingFileError, RemoteIOError,
                     UnsupportedVersionError)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./%-]+)?$")
_VERSION_REF = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?$")
CODEBASE_VERSION = (3, 0)
HEAD_READ = 32 << 10  # bytes fetched with each mp4 box header when building a remote video index (PyAV's block)


def confine(rel: str, origin: str | None = None) -> str:
    """The one check that a relative path from a dataset's metadata stays inside the dataset root; returns ``rel``.

    Refused: any ``..`` segment (even one that ``normpath`` would fold back inside: through a symlinked folder the
    OS resolves ``link/..`` physically, not lexically), a NUL character, and a URL (``scheme://``). A leading ``/``
    is read relative to the root, as :meth:`Source.path` always has. Cheap (two substring tests on the common
    path), so it runs on every path the readers resolve, local and remote.

    Args:
        rel: the path relative to the root, as built from info.json templates, camera keys or meta/episodes.
        origin: what produced it (``meta/info.json 'video_path' ... with camera ...``), for the message.

    Raises:
        DatasetFormatError: naming the path, its origin, and the fix.
    """
    if ".." in rel or "\0" in rel or "://" in rel:
        segs = rel.replace("\\", "/").split("/")
        if ".." in segs or "\0" in rel or "://" in rel:
            src = f" (from {origin})" if origin else " (built from the dataset's metadata: info.json's data_path / " \
                                                     "video_path, a camera key, or meta/episodes)"
            raise DatasetFormatError(f"{rel!r}{src} leaves the dataset root or is not a plain relative path; "
                                     "lerobot_sql reads only files under the root. Fix the template or key in "
                                     "meta/info.json")
    return rel


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset root on a filesystem.

    Attributes:
        fs: the fsspec filesystem holding the dataset (a :class:`~lerobot_sql.remote.RemoteCacheFS` when remote).
        root: the root path as ``fs`` spells it (no protocol for local paths).
        url: the root as the user gave it, normalised (Hub roots carry their resolved revision); part of every
            cache key.
    """

    fs: Any
    root: str
    url: str
    _listing: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # rel -> None once check_link passed (a local file's symlinks resolved once per file per process).
    _links: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def is_local(self) -> bool:
        return _is_local_fs(self.fs)

    def path(self, rel: str) -> str:
        """The filesystem path of ``rel`` (relative to the root).

        Raises:
            DatasetFormatError: ``rel`` would leave the root (see :func:`confine`).
        """
        return f"{self.root.rstrip('/')}/{confine(rel).lstrip('/')}"

    def duckdb_path(self, rel: str) -> str:
        """The path DuckDB should read: a plain local path, or a ``protocol://`` URL for a registered fsspec fs."""
        if self.is_local:
            return self.path(rel)
        proto = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"{proto}://{self.path(rel)}"

    def exists(self, rel: str) -> bool:
        """True if ``rel`` is a file or a folder under the root (on HTTP: a file the metadata names, or a folder
        holding one)."""
        if self.is_http:
            rel = rel.strip("/")
            files = self.listed_files()
            if rel in files or any(f.startswith(rel + "/") for f in files):
                return True
        return self.fs.exists(self.path(rel))

    def glob(self, pattern: str) -> list[str]:
        """Paths relative to the root matching ``pattern``, sorted (the order lerobot concatenates files in).

        Plain HTTP has no directory listing: there the file list is derived from the metadata (see
        :meth:`listed_files`) and matched against ``pattern``.
        """
        if self.is_http:
            return sorted(f for f in self.listed_files() if fnmatch.fnmatchcase(f, pattern))
        base = self.root.rstrip("/") + "/"
        hits = self.fs.glob(self.path(pattern))
        return sorted(h[len(base):] if h.startswith(base) else h.split(base, 1)[-1] for h in hits)

    @property
    def is_http(self) -> bool:
        target = getattr(self.fs, "target", self.fs)
        proto = target.protocol if isinstance(target.protocol, str) else target.protocol[0]
        return proto in ("http", "https")

    def listed_files(self) -> list[str]:
        """Every file a v3.x dataset's metadata names: meta/info.json, tasks, the meta/episodes files (followed
        from ``chunk-000/file-000`` until ``total_episodes`` are seen), and the data and video files they point to.

        Used where the filesystem cannot list (HTTP).

        Raises:
            MissingFileError: meta/info.json is missing.
            DatasetFormatError: meta/info.json is refused (:func:`lerobot_sql.layout.check_info`), naming the key.
        """
        if "files" in self._listing:
            return self._listing["files"]
        import pyarrow.parquet as pq

        from .layout import check_info  # layout imports us

        where = self.path("meta/info.json")
        with self.open("meta/info.json") as f:
            raw = f.read()
        try:
            info = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatasetFormatError(f"{where}: invalid JSON ({e}); restore the file from the dataset's source") from e
        # The same validation as load_layout's, before any value is used (this runs before the layout exists).
        checked = check_info(info, where)
        total, per_chunk = checked.total_episodes, checked.chunks_size
        files = {"meta/info.json"}
        v2 = checked.legacy
        extras = ("meta/stats.json",) + (("meta/tasks.jsonl", "meta/episodes.jsonl", "meta/episodes_stats.jsonl")
                                         if v2 else ("meta/tasks.parquet",))
        # One round trip for all (each is a HEAD): the other version's files are not asked about at all.
        with concurrent.futures.ThreadPoolExecutor(len(extras)) as pool:
            found = list(pool.map(lambda rel: self.fs.exists(self.path(rel)), extras))
        files.update(rel for rel, ok in zip(extras, found) if ok)
        if v2:
            self._listing["files"] = sorted(files | self._v2_files(checked))
            return self._listing["files"]
        data_tmpl, video_tmpl = checked.data_path, checked.video_path
        chunk, file, seen = 0, 0, 0
        while True:
            rel = f"meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"
            if not self.fs.exists(self.path(rel)):
                break
            files.add(rel)
            with self.open(rel) as f:
                pf = pq.ParquetFile(f)
                cols = [c for c in pf.schema_arrow.names if c in ("episode_index", "data/chunk_index",
                                                                  "data/file_index") or c.startswith("videos/")]
                t = pf.read(columns=cols).to_pydict()
            seen += len(t.get("episode_index", []))
            for c, fi in zip(t.get("data/chunk_index", []), t.get("data/file_index", [])):
                files.add(data_tmpl.format(chunk_index=int(c), file_index=int(fi)))
            keys = {c[len("videos/"):-len("/chunk_index")] for c in t if c.endswith("/chunk_index") and
                    c.startswith("videos/")}
            for k in keys if video_tmpl else ():
                for c, fi in zip(t[f"videos/{k}/chunk_index"], t[f"videos/{k}/file_index"]):
                    if c is not None and fi is not None:
                        files.add(video_tmpl.format(video_key=k, chunk_index=int(c), file_index=int(fi)))
            if total and seen >= total:
                break
            file += 1
            if file >= per_chunk:
                chunk, file = chunk + 1, 0
        self._listing["files"] = sorted(files)
        return self._listing["files"]

    def _v2_files(self, info) -> set[str]:
        """Data and video files of a v2.x dataset (``info``: its :class:`lerobot_sql.layout.CheckedInfo`): one per
        episode listed in meta/episodes.jsonl."""
        per_chunk = info.chunks_size
        keys = [k for k, f in info.features.items() if f.is_video]
        out = set()
        where = self.path("meta/episodes.jsonl")
        eps = []
        with self.open("meta/episodes.jsonl") as f:
            for n, line in enumerate(f.read().decode(errors="replace").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    ep = json.loads(line)["episode_index"]
                    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 0:
                        raise TypeError(ep)
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise DatasetFormatError(f"{where}:{n}: expected a JSON object with an integer episode_index "
                                             f"({type(e).__name__}: {e}); restore the file") from e
                eps.append(ep)
        data_tmpl, video_tmpl = info.data_path, info.video_path
        for ep in eps:
            chunk = int(ep) // per_chunk
            out.add(data_tmpl.format(episode_chunk=chunk, episode_index=int(ep)))
            for k in keys if video_tmpl else ():
                out.add(video_tmpl.format(episode_chunk=chunk, video_key=k, episode_index=int(ep)))
        return out

    def open(self, rel: str, mode: str = "rb"):
        """Open ``rel``; a missing file raises :class:`MissingFileError` naming it, a symlink leaving the dataset
        :class:`DatasetFormatError` (see :meth:`check_link`)."""
        self.check_link(rel)
        try:
            return self.fs.open(self.path(rel), mode)
        except FileNotFoundError as e:
            raise MissingFileError(f"{self.path(rel)}: file not found (referenced by the dataset's metadata)") from e

    def open_demux(self, rel: str):
        """A file object for *demuxing only* an mp4: the container's boxes are real, the media payload (``mdat``)
        reads as zeros. PyAV then reports every packet's pts, position and size after fetching only the ``moov``
        box; packet flags that depend on the payload (keyframe for H.264) must be taken from
        ``stream.index_entries`` instead. Local files are opened as they are."""
        if self.is_local:
            return self.open(rel)
        return _PayloadFreeMP4(self.open(rel))

    def fetch_ranges(self, rel: str, ranges: list[tuple[int, int]]) -> int:
        """Fetch byte ranges ``[start, end)`` of a remote file into the cache in one parallel call, before a reader
        (pyarrow, PyAV) asks for them one round trip at a time. Local files: nothing to do. Returns bytes fetched."""
        fetch = getattr(self.fs, "ensure_ranges", None)
        if self.is_local or fetch is None or not ranges:
            return 0
        return fetch(self.path(rel), sorted(ranges))

    def local_path(self, rel: str) -> str | None:
        """An OS path for ``rel`` when the file is local (PyAV and mmap then read it directly), else None.

        Raises:
            DatasetFormatError: the local file is a symlink leaving the dataset (see :meth:`check_link`).
        """
        if not self.is_local:
            return None
        self.check_link(rel)
        return self.path(rel)

    def _link_dirs(self) -> tuple[str, ...]:
        """Where a local dataset's files may really live, each ending in '/': the root's real path, and for a
        Hugging Face hub cache snapshot (``<repo>/snapshots/<rev>[/sub]``) the real path of ``<repo>/blobs``."""
        if ("dirs",) not in self._links:  # a tuple key: never a relative path
            inside = [os.path.realpath(self.root).rstrip("/") + "/"]
            parts = os.path.abspath(self.root).split("/")
            if "snapshots" in parts:  # <repo>/snapshots/<rev>[/sub]: the repo's blobs folder holds the real files
                repo = "/".join(parts[:len(parts) - 1 - parts[::-1].index("snapshots")])
                blobs = os.path.realpath(os.path.join(repo, "blobs"))
                if os.path.isdir(blobs):
                    inside.append(blobs.rstrip("/") + "/")
            self._links[("dirs",)] = tuple(inside)
        return self._links[("dirs",)]

    def link_target(self, path: str) -> tuple[str, bool]:
        """The one rule for symlinks in a local dataset, for SQL and the Python readers alike: (real path of
        ``path``, whether reading it is allowed). Allowed: no symlink on the way, or a real path inside the root or
        the hub-cache repo's ``blobs/`` folder (see :meth:`_link_dirs`). ``path`` is an OS path under the root.
        Costs a ``realpath`` (an lstat per path component)."""
        target = os.path.realpath(path)
        if target == os.path.abspath(path):
            return target, True
        return target, any(target.startswith(d) for d in self._link_dirs())

    def check_link(self, rel: str) -> None:
        """Refuse to read ``rel`` when it is (or lies under) a symlink whose target is outside the dataset (the
        rule of :meth:`link_target`, the same one the SQL sandbox applies through :meth:`symlink_targets`).

        Local roots only (remote filesystems have no symlinks); each file is resolved once per process (the
        verdict is remembered on this Source), so the readers can call it at every open.

        Raises:
            DatasetFormatError: naming the file, its target, and the fix.
        """
        if rel in self._links or not self.is_local:
            return
        p = self.path(rel)
        target, ok = self.link_target(p)
        if not ok:
            raise DatasetFormatError(f"{p}: is a symlink to {target}, outside the dataset root and outside the "
                                     "hub cache's blobs/ folder; lerobot_sql reads only the dataset's own files. "
                                     "Copy the file into the dataset folder (or re-download the dataset)")
        self._links[rel] = None

    def symlink_targets(self) -> tuple[list[str], list[str]]:
        """(allowed, refused): the real paths of the files under a local root that are symlinks to files outside it.

        A Hugging Face hub cache (``huggingface_hub.snapshot_download``) is ``<repo>/snapshots/<rev>/...`` where
        every file is a symlink into ``<repo>/blobs/<hash>``. DuckDB's sandbox checks the resolved path, so those
        blobs must be allowed one by one (``allowed_paths``) for SQL to read the dataset. Only targets that
        :meth:`link_target` allows (inside the dataset root or the ``blobs`` folder of the hub-cache repo holding
        the root) are allowed; a symlink to anything else (``/etc/passwd``, another folder) is ``refused`` (its
        path under the root) and stays unreadable to SQL, as :meth:`check_link` keeps it from the Python readers.
        A symlinked folder is never allowed (its files are not listed); one that points outside is ``refused``.
        Remote roots: ([], []). One walk of the root (a stat per entry), at connection time only.
        """
        if not self.is_local:
            return [], []
        allowed, refused = [], []
        for folder, dirs, files in os.walk(self.root):
            for name in files + dirs:
                p = os.path.join(folder, name)
                if not os.path.islink(p):
                    continue
                target, ok = self.link_target(p)
                if not os.path.isfile(target):
                    # A symlinked folder: os.walk does not enter it and DuckDB lists it as a path (so it is never
                    # allowed); one pointing outside is reported like a file, since SQL and the readers refuse it.
                    if not ok and os.path.isdir(target):
                        refused.append(p)
                    continue
                if ok:
                    allowed.append(target)
                else:
                    refused.append(p)
        return sorted(set(allowed)), refused

    def identity(self, rel: str) -> str:
        """A string that changes whenever the file's content may have changed: :func:`local_identity` (size, mtime,
        inode, ctime) of a local file, or the remote ETag / size+mtime(+CRC) (remote.py).

        Raises:
            MissingFileError: the file does not exist.
        """
        p = self.path(rel)
        if self.is_local:
            self.check_link(rel)  # the identity is the target's: it keys caches built from the file's bytes
            try:
                st = os.stat(p)
            except FileNotFoundError as e:
                raise MissingFileError(f"{p}: file not found (referenced by the dataset's metadata)") from e
            return local_identity(st)
        try:
            info = self.fs.info(p)
        except FileNotFoundError as e:
            raise MissingFileError(f"{p}: file not found (referenced by the dataset's metadata)") from e
        if "identity" in info:
            return info["identity"]
        from .remote import identity_of

        return identity_of(info)


class _PayloadFreeMP4(io.RawIOBase):
    """Reads an ISO-BMFF file with the payload of every top-level ``mdat`` box replaced by zeros (never fetched)."""

    def __init__(self, f):
        self.f = f
        self.size = f.size if hasattr(f, "size") else f.seek(0, 2)
        self.pos = 0
        self.holes: list[tuple[int, int]] = []
        off = 0
        fetch = getattr(getattr(f, "fs", None), "ensure", None)  # remote: fetch in few round trips
        while off + 8 <= self.size:  # walk the top-level boxes by their headers
            if fetch is not None and f.fs.missing(f.path, off, min(self.size, off + 16)):
                # A box header plus what the demuxer reads next (ftyp's rest, the first packets after an mdat
                # header: the container probe reads them) in one request instead of several 16-byte ones.
                fetch(f.path, off, min(self.size, off + HEAD_READ))
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
                fetch(f.path, off, min(self.size, off + size + HEAD_READ))
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


def local_identity(st: os.stat_result) -> str:
    """The identity of a local file from its stat: ``"size-mtime_ns-inode-ctime_ns"``.

    Size and mtime alone are kept by a replacement (``cp -p``, ``rsync -t``, ``tar x``, ``os.utime`` set mtime back),
    so a same-size rewrite would be served from caches built from the old bytes. The inode (a new file or a rename
    over the old one) and st_ctime_ns (set by the kernel on every write, rename, utime or chmod; no user tool can set
    it back) are what a replacement cannot keep. The cost of a false change: a copy, restore or chmod of the
    dataset rebuilds its caches (tabular row groups, video indexes) once, and a dataset open at the time refuses the
    file until reopened.
    """
    return f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}-{st.st_ctime_ns}"


_MP4_NESTED = (b"trak", b"mdia", b"minf", b"stbl")
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
    offsets: tuple[int, ...] | None  # byte offset of each sample in the file (stsc + stco/co64); None if unknown
    deltas: tuple[int, ...] | None  # decode-time step after each sample, in the track's time base (stts)
    reordered: bool  # a ctts box: presentation order differs from decode order (B-frames)
    file_size: int  # bytes of the file as read


def _sample_deltas(n: int, stts) -> tuple[int, ...] | None:
    if not stts or sum(c for c, _ in stts) != n:
        return None
    return tuple(d for c, d in stts for _ in range(c))


def _sample_offsets(sizes, stsc, chunks) -> tuple[int, ...] | None:
    """Each sample's byte offset: chunk k (1-based) holds the samples-per-chunk of the last stsc run starting at or
    before k, packed from the chunk's offset. None when the tables disagree with the sample count."""
    if not stsc or not chunks or stsc[0][0] != 1:
        return None
    out, k, runs = [], 0, stsc + [(len(chunks) + 1, 0)]
    for (first, per), (nxt, _) in zip(runs, runs[1:]):
        if not first <= nxt or nxt > len(chunks) + 1:
            return None
        for c in range(first, nxt):
            off = chunks[c - 1]
            for _ in range(per):
                if k >= len(sizes):
                    return None
                out.append(off)
                off += sizes[k]
                k += 1
    return tuple(out) if k == len(sizes) else None


def mp4_sample_table(f) -> Mp4Samples | None:
    """The sample table of an mp4's first video track, read from its ``moov`` box only (no media payload).

    For PyAV < 16, which has no ``stream.index_entries``: on the payload-free view (:meth:`Source.open_demux`) the
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
        for typ, a, z in _mp4_boxes(moov, 8):
            if typ != b"trak":
                continue
            stbl = hdlr = None
            mdia = next(((a2, z2) for t, a2, z2 in _mp4_boxes(moov, a, z) if t == b"mdia"), None)
            if mdia is None:
                continue
            for t, a2, z2 in _mp4_boxes(moov, *mdia):
                if t == b"hdlr" and z2 - a2 >= 12:
                    hdlr = moov[a2 + 8:a2 + 12]
                elif t == b"minf":
                    stbl = next(((a3, z3) for t3, a3, z3 in _mp4_boxes(moov, a2, z2) if t3 == b"stbl"), None)
            if hdlr != b"vide" or stbl is None:
                continue
            sizes = sync = stts = stsc = chunks = None
            reordered = False
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
                    sync = frozenset(struct.unpack_from(f">{n}I", moov, a2 + 8))
                elif t in (b"stts", b"stsc", b"stco", b"co64") and z2 - a2 >= 8:
                    n = struct.unpack_from(">I", moov, a2 + 4)[0]
                    w = {b"stts": 8, b"stsc": 12, b"stco": 4, b"co64": 8}[t]
                    if 8 + w * n > z2 - a2:
                        return None
                    v = struct.unpack_from(f">{n * w // 4}I" if t != b"co64" else f">{n}Q", moov, a2 + 8)
                    if t == b"stts":
                        stts = list(zip(v[0::2], v[1::2]))
                    elif t == b"stsc":
                        stsc = list(zip(v[0::3], v[1::3]))
                    else:
                        chunks = v
                elif t == b"ctts":
                    reordered = True
            if sizes is None:
                return None
            return Mp4Samples(sizes, sync, _sample_offsets(sizes, stsc, chunks), _sample_deltas(len(sizes), stts),
                              reordered, size)
        return None
    except (OSError, ValueError, struct.error):
        return None


def mp4_sync_samples(f) -> tuple[tuple[int, ...], frozenset[int] | None] | None:
    """(sample sizes, sync-sample numbers) of :func:`mp4_sample_table`, or None."""
    t = mp4_sample_table(f)
    return None if t is None else (t.sizes, t.sync)


def _is_local_fs(fs: Any) -> bool:
    proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return proto in ("file", "local")


def resolve_hub_revision(repo_id: str, api: Any = None, token: Any = None) -> str:
    """The revision to read when the user gave none, as lerobot chooses it (spec section 12).

    The exact ref ``v3.0`` if it exists, else the highest ref ``v3.0.x``; a repo with version refs of other majors
    only is refused; a repo with no version ref at all is read at ``main``.

    Raises:
        UnsupportedVersionError: only older (v2.x: with the conversion command) or only newer version refs.
    """
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    refs = api.list_repo_refs(repo_id, repo_type="dataset")
    names = [r.name for r in list(refs.branches) + list(refs.tags)]
    versions = {}
    for n in names:
        m = _VERSION_REF.match(n)
        if m:
            versions[n] = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    if "v3.0" in versions:
        return "v3.0"
    ok = [n for n, v in versions.items() if v[0] == CODEBASE_VERSION[0] and v[1] <= CODEBASE_VERSION[1]]
    if ok:
        return max(ok, key=versions.__getitem__)
    if versions:
        best = max(versions, key=versions.__getitem__)
        if versions[best][0] < CODEBASE_VERSION[0]:
            hint = (f"convert it with `python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id={repo_id}`"
                    if versions[best][0] == 2 else "this reader handles format v3.0")
            raise UnsupportedVersionError(f"hf://datasets/{repo_id}: newest version ref is {best!r}; {hint}, or "
                                          "pass an explicit revision (hf://datasets/ORG/NAME@REV)")
        raise UnsupportedVersionError(f"hf://datasets/{repo_id}: only newer format versions ({sorted(versions)}); "
                                      "upgrade lerobot_sql or pass an explicit revision (hf://datasets/ORG/NAME@REV)")
    return "main"


def _hub_root(root: str, storage_options: dict) -> tuple[str, str] | None:
    """(fs path ``datasets/org/name@rev``, url) for a Hub root, or None if ``root`` is not one."""
    if root.startswith("hf://"):
        rest = root[len("hf://"):]
        if not rest.startswith("datasets/"):
            return None  # models/spaces/buckets: pass to fsspec as given
        rest = rest[len("datasets/"):]
    elif HUB_ID.match(root) and not os.path.exists(root):
        rest = root
    else:
        return None
    parts = rest.rstrip("/").split("/")
    repo, sub = "/".join(parts[:2]), "/".join(parts[2:])
    repo_id, _, rev = repo.partition("@")
    if not rev:
        # A bare `org/name` may as well be a mistyped relative path (`sample/smal20`): errors say both readings.
        local = None if root.startswith("hf://") else root
        rev = _cached_hub_revision(repo_id, storage_options.get("token"), local=local)
    path = f"datasets/{repo_id}@{rev}" + (f"/{sub}" if sub else "")
    return path, f"hf://{path}"


def _hub_error(repo_id: str, cause: BaseException | None, local: str | None) -> LeRobotSQLError:
    """The typed error for a Hub repo that cannot be resolved: MissingFileError when the Hub says there is no such
    repo (or we are offline with nothing cached), RemoteIOError when it cannot be reached. With ``local`` (the root
    was a bare ``org/name``), the message starts with the local reading: no folder of that name."""
    try:
        from huggingface_hub.errors import RepositoryNotFoundError
    except ImportError:  # huggingface_hub 0.24 (our floor) has it only in huggingface_hub.utils
        from huggingface_hub.utils import RepositoryNotFoundError

    if cause is None:
        why, cls = "offline (HF_HUB_OFFLINE / LSQL_OFFLINE) and no revision known", MissingFileError
    else:
        first = (str(cause).splitlines() or [""])[0]
        why = f"{type(cause).__name__}: {first}"
        cls = MissingFileError if isinstance(cause, RepositoryNotFoundError) else RemoteIOError
    if local is not None:
        return cls(f"no local folder {local} (resolved to {os.path.abspath(local)}); as a Hub repo id "
                   f"hf://datasets/{repo_id}: {why}. Check the path (a dataset root holds meta/info.json), or the "
                   "repo id and the network")
    fix = ("check the repo id on https://huggingface.co/datasets" if cls is MissingFileError and cause is not None
           else "check the network (once opened online, a dataset opens offline), or pass hf://datasets/ORG/NAME@REV")
    return cls(f"hf://datasets/{repo_id}: cannot resolve the dataset's revision on the Hugging Face Hub ({why}); "
               f"{fix}")


def _cached_hub_revision(repo_id: str, token: Any, local: str | None = None) -> str:
    """resolve_hub_revision, remembered on disk so a dataset opened once opens offline.

    Raises:
        MissingFileError: the Hub has no such repo, or offline with no revision remembered.
        RemoteIOError: the Hub cannot be reached and no revision is remembered.
    """
    store = cache.cache_root() / "hub_revisions.json"
    try:
        known = json.loads(store.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        known = {}
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("LSQL_OFFLINE", "HF_HUB_OFFLINE"))
    if not offline:
        try:
            rev = resolve_hub_revision(repo_id, token=token)
        except (UnsupportedVersionError, DatasetFormatError):
            raise
        except Exception as e:  # noqa: BLE001 - no network: fall back to the last resolution
            if repo_id not in known:
                raise _hub_error(repo_id, e, local) from e
            return known[repo_id]
        if known.get(repo_id) != rev:
            known[repo_id] = rev
            with contextlib.suppress(OSError):  # only an offline convenience
                store.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=store.parent, suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    json.dump(known, f)
                os.replace(tmp, store)
        return rev
    if repo_id not in known:
        if local is not None:
            raise _hub_error(repo_id, None, local)
        raise MissingFileError(f"hf://datasets/{repo_id}: offline and no revision known; connect once online, "
                               "or pass hf://datasets/ORG/NAME@REVISION")
    return known[repo_id]


def _default_http_options(fs_protocol: str, storage_options: dict) -> dict:
    """Bound HTTP reads in time (aiohttp's default is 5 minutes per request) unless the caller chose a timeout."""
    if fs_protocol in ("http", "https") and "timeout" not in (storage_options.get("client_kwargs") or {}):
        import aiohttp

        ck = dict(storage_options.get("client_kwargs") or {})
        ck["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
        return {**storage_options, "client_kwargs": ck}
    return storage_options


def open_source(root: str | os.PathLike, storage_options: dict | None = None, *, cache_dir: str | os.PathLike | None = None,
                cache_size: int | str | None = None) -> Source:
    """Resolve a user-given root (local path, fsspec URL or Hub repo id) to a :class:`Source`.

    Args:
        root: ``/path``, ``s3://bucket/ds``, ``gs://...``, ``https://host/ds``, ``hf://datasets/org/name[@rev]`` or
            ``org/name`` (Hub; without a revision the ``v3.0`` ref, see :func:`resolve_hub_revision`).
        storage_options: passed to the fsspec filesystem (credentials, endpoint_url, client_kwargs ...).
        cache_dir: the dataset's cache folder (default :func:`lerobot_sql.cache.root_for` of the URL); remote
            bytes go under ``cache_dir/remote``.
        cache_size: bound on the remote-bytes cache (bytes or ``"20GB"``; default 50 GiB), LRU eviction.

    Raises:
        UnsupportedVersionError: a Hub repo with only non-v3 version refs.
    """
    from .remote import RemoteCacheFS

    root = os.fspath(root)
    options = dict(storage_options or {})
    hub = _hub_root(root, options)
    if hub is not None:
        from huggingface_hub import HfFileSystem

        path, url = hub
        fs = HfFileSystem(**options)
    else:
        fs, path = fsspec.core.url_to_fs(root, **options)
        if _is_local_fs(fs):
            path = os.path.abspath(path)
            return Source(fs=fs, root=path, url=path)
        proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        fixed = _default_http_options(proto, options)
        if fixed is not options:
            fs, path = fsspec.core.url_to_fs(root, **fixed)
        url = root.rstrip("/")
    path = path.rstrip("/")
    cdir = cache_dir if cache_dir is not None else cache.root_for(url)
    return Source(fs=RemoteCacheFS(fs, path, url, cdir, cache_size), root=path, url=url)
