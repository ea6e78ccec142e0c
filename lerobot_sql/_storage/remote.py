"""Remote datasets: an fsspec filesystem that reads another one (s3, gs, http(s), hf ...) through an on-disk cache.

Only the bytes a reader asks for are fetched. Fetched byte ranges are kept as immutable *pieces* on disk, one file per
piece, named by the remote file's identity (path, size, ETag) and the byte range, so a changed remote file never
serves stale bytes. Pieces never cross a ``REGION`` (4 MiB) boundary; a file lock per (file, region) makes workers
that want the same bytes wait for one another instead of fetching them twice. A piece is written under a temporary
name and renamed into place, so an interrupted download leaves nothing that is ever read, and a restart re-fetches
only the regions that are still missing (downloads resume at region granularity). The total size of the pieces is
bounded by ``cache_size``; the least recently read pieces are deleted first (read time = the piece's mtime).

Files under ``meta/`` are fetched whole, and the answers of ``info``/``glob`` are stored beside the pieces, so once
a dataset's metadata has been read it opens offline (``LSQL_OFFLINE=1``/``HF_HUB_OFFLINE=1``, or automatically
after the network failed).

Every network call is retried with exponential backoff on 5xx answers, resets, truncated bodies and timeouts, then
raises :class:`RemoteIOError` naming the URL and byte range. Range reads are pinned to the version of the file first
seen in the session (HTTP ``If-Match``, S3 version id / ``IfMatch``): a file that changes on the server mid-run raises
:class:`FileChangedError` instead of mixing versions in the cache.

Missing pieces of one read are fetched in parallel (``ensure_ranges``), and a Parquet column scan (the same columns
of consecutive row groups, recognised from the cached footer) fetches the next row groups' chunks ahead.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from filelock import FileLock

from ..errors import MissingFileError, RemoteIOError

REGION = 4 << 20                 # unit of locking; largest piece (bytes)
MERGE_GAP = 16 << 10             # ranges closer than this are fetched as one (fewer requests for a few KiB more)
MAX_READAHEAD = 256 << 10        # sequential readers fetch ahead up to this much (bytes). 4 MiB overshot episode
                                 # ends by MBs when decoding video (5.4x the bytes needed at 480x640) for no fewer
                                 # requests: a decoder's reads are short runs, so the readahead rarely grows past this
MIN_READAHEAD = 64 << 10
DEFAULT_CACHE_SIZE = 50 << 30    # 50 GiB
WHOLE_PREFIXES = ("meta/",)      # fetched whole: small, read often, needed offline
FETCH_THREADS = 16               # parallel range requests of one ensure_ranges call
COLUMN_READAHEAD = 4 << 20       # bytes a Parquet column scan fetches ahead per request (see _column_readahead)


def parse_size(size: int | str | None) -> int:
    """``50GB``, ``512MiB``, ``10_000_000`` or an int -> bytes; None -> DEFAULT_CACHE_SIZE."""
    if size is None:
        return DEFAULT_CACHE_SIZE
    if isinstance(size, (int, float)):
        return int(size)
    s = str(size).strip().upper().replace("_", "")
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "KB": 10**3, "MB": 10**6,
             "GB": 10**9, "TB": 10**12, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "B": 1}
    for u, mult in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * mult)
    return int(s)


STALL_S = 20.0                  # an HTTP answer may pause this long (headers, or between body bytes)
MIN_RATE = 32 << 10              # ... and must deliver a body at this average rate (bytes/s) after STALL_S
WHOLE_MAX = 64 << 20             # a file of a server that ignores Range is fetched whole up to this size
CHECK_BYTES = 64 << 10           # bytes at each end of an untagged file hashed into its identity


class _Truncated(OSError):
    """The server sent fewer bytes than asked for."""


class _Stalled(OSError):
    """The server stopped sending (no byte for ``stall_s``) or sends slower than ``min_rate``: retried once."""


class _Lying(OSError):
    """The server's answer contradicts the request (a Content-Length or Content-Range for other bytes): not
    retried, another try gets the same answer."""


def _retryable(e: BaseException) -> bool:
    """True for errors a second try may cure: 5xx/408/429 answers, resets, timeouts, truncated bodies."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotImplementedError, TypeError,
                      KeyError, MissingFileError, _Lying)):
        return False
    status = getattr(e, "status", None) or getattr(e, "status_code", None)
    if status is None:
        resp = getattr(e, "response", None)
        status = getattr(resp, "status_code", None) if resp is not None and not isinstance(resp, dict) else None
        if isinstance(resp, dict):
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return False
    return True


class FileChangedError(RemoteIOError):
    """The remote file no longer matches the version (ETag / version id) this session first saw."""


def _precondition_failed(e: BaseException) -> bool:
    """True for an HTTP 412 / S3 ``PreconditionFailed`` answer (the If-Match / If-Unmodified-Since test failed)."""
    for x in (e, e.__cause__, e.__context__):
        if x is None:
            continue
        status = getattr(x, "status", None) or getattr(x, "status_code", None)
        resp = getattr(x, "response", None)
        if isinstance(resp, dict):
            status = status or resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if resp.get("Error", {}).get("Code") == "PreconditionFailed":
                return True
        if status == 412 or "PreconditionFailed" in str(x) or "Precondition Failed" in str(x):
            return True
    return False


def version_of(info: dict) -> dict:
    """What pins the bytes of the version described by ``info`` (a target's raw ``info()``): the S3 version id, a
    strong ETag (a weak ``W/`` one cannot be used with If-Match), the Last-Modified date. Missing keys are left out."""
    out = {}
    vid = info.get("VersionId") or info.get("version_id")
    if vid and vid != "null":
        out["version_id"] = str(vid)
    etag = info.get("ETag") or info.get("etag")
    if isinstance(etag, str) and etag and not etag.startswith("W/"):
        out["etag"] = etag if etag.startswith('"') else f'"{etag}"'
    lm = info.get("Last-Modified")
    if isinstance(lm, str) and lm:
        out["last_modified"] = lm
    return out


def identity_of(info: dict) -> str:
    """size + the strongest content tag fsspec reports (ETag, blob id, LFS sha256, last commit, mtime)."""
    lfs = info.get("lfs") or {}
    tag = (info.get("ETag") or info.get("etag") or info.get("blob_id") or (lfs.get("sha256") if isinstance(lfs, dict)
           else None) or info.get("last_commit") or info.get("LastModified") or info.get("Last-Modified")
           or info.get("mtime") or info.get("updated") or "")
    if isinstance(tag, dict):
        tag = tag.get("oid") or json.dumps(tag, sort_keys=True, default=str)
    return f"{info.get('size')}-{str(tag).strip(chr(34))}"


class RemoteCacheFS(AbstractFileSystem):
    """Read-only fsspec filesystem: ``target`` (any fsspec fs) seen through the on-disk piece cache.

    Paths are ``target``'s own paths (``bucket/ds/meta/info.json``, ``http://host/ds/meta/info.json``), optionally
    prefixed with ``lsqlremote://`` (the protocol under which DuckDB sees this filesystem).

    Args:
        target: the remote filesystem.
        root: the dataset root as ``target`` spells it (files under ``root/meta/`` are fetched whole).
        url: the dataset URL (named in errors).
        cache_dir: the dataset's cache folder; pieces go under ``cache_dir/remote``.
        cache_size: bound on the pieces' total size in bytes (int or ``"20GB"``).
        retries: tries after the first on a retryable error; backoff ``backoff_s * 2**k`` seconds.
        offline: never touch the network (default: ``LSQL_OFFLINE`` or ``HF_HUB_OFFLINE`` set to 1).
    """

    protocol = "lsqlremote"
    cachable = False

    def __init__(self, target: Any, root: str, url: str, cache_dir: str | os.PathLike, cache_size: int | str | None = None,
                 retries: int = 4, backoff_s: float = 0.2, offline: bool | None = None, stall_s: float = STALL_S,
                 min_rate: float = MIN_RATE, **kwargs: Any):
        super().__init__(**kwargs)
        self.stall_s, self.min_rate = float(stall_s), float(min_rate)
        self._warned: set[str] = set()
        self.target, self.root, self.url = target, root.rstrip("/"), url
        self.dir = Path(cache_dir) / "remote"
        self.cache_size = parse_size(cache_size)
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        if offline is None:
            offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("LSQL_OFFLINE", "HF_HUB_OFFLINE"))
        self.offline = bool(offline)
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._stats = {"requests": 0, "bytes_fetched": 0, "bytes_from_cache": 0}
        self._infos: dict[str, dict] = {}
        self._pieces: dict[str, list[tuple[int, int]]] = {}
        self._total: int | None = None
        self._region_locks: dict[tuple[str, int], threading.Lock] = {}
        self._pq: dict[str, dict] = {}
        self._scans: dict[tuple, tuple[int, int]] = {}

    # ---- plumbing ---------------------------------------------------------------------------------------------
    def __reduce__(self):
        # The file infos go along: a DataLoader worker then reads the versions (ETags) its parent pinned, and asks
        # the server nothing before its first range read.
        return (_rebuild, (self.target, self.root, self.url, str(self.dir.parent), self.cache_size, self.retries,
                           self.backoff_s, self.offline, dict(self._infos), self.stall_s, self.min_rate))

    def _fs(self):
        """The target, re-created after a fork (async fsspec filesystems refuse to run in a forked child)."""
        if self._pid != os.getpid():
            t = self.target
            self.target = type(t)(*getattr(t, "storage_args", ()), **getattr(t, "storage_options", {}))
            self._pid = os.getpid()
            self._stats = {"requests": 0, "bytes_fetched": 0, "bytes_from_cache": 0}
            self._lock = threading.RLock()
            self._region_locks = {}
        return self.target

    def io_stats(self) -> dict[str, int]:
        """Counters of this process: ``requests`` (network calls, retries included), ``bytes_fetched`` (bytes
        received from the remote), ``bytes_from_cache`` (bytes served from pieces already on disk)."""
        return dict(self._stats)

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self._stats[k] += v

    def _url(self, path: str) -> str:
        rel = self._rel(path)
        return f"{self.url}/{rel}" if rel is not None else path

    def _rel(self, path: str) -> str | None:
        base = self.root + "/"
        return path[len(base):] if path.startswith(base) else None

    def _call(self, what: str, fn, *args: Any, **kwargs: Any):
        """``fn(*args)`` with retries; RemoteIOError after the last one; FileNotFoundError passes through."""
        last: BaseException | None = None
        stalls = 0
        for attempt in range(self.retries + 1):
            self._count(requests=1)
            try:
                return fn(*args, **kwargs)
            except FileNotFoundError as e:
                # fsspec's HTTP info() reports any failure (a 503, a reset) as FileNotFoundError: look underneath.
                cause = e.__cause__
                if cause is None or isinstance(cause, FileNotFoundError) or not _retryable(cause):
                    raise
                last = cause  # a 5xx, a refused connection: a network failure, not a missing file
                if attempt == self.retries:
                    break
                time.sleep(self.backoff_s * (2 ** attempt) * (1 + 0.25 * random.random()))
                continue
            except FileChangedError:
                raise  # another try cannot bring the old version back
            except Exception as e:  # noqa: BLE001 - any library's transport error; classified below
                last = e
                stalls += isinstance(e, _Stalled)
                # A stalled server costs stall_s (or more) per try: one more try, not `retries` more.
                if not _retryable(e) or attempt == self.retries or stalls > 1:
                    break
                time.sleep(self.backoff_s * (2 ** attempt) * (1 + 0.25 * random.random()))
        raise RemoteIOError(f"{what}: failed after {attempt + 1} attempt(s): {type(last).__name__}: {last}. "
                            "Check the network and credentials (storage_options), then retry; the cache holds "
                            "nothing partial from this read.") from last

    # ---- metadata (persisted for offline use) ---------------------------------------------------------------
    def _store_path(self) -> Path:
        return self.dir / "listing.json"

    def _load_store(self) -> dict:
        try:
            return json.loads(self._store_path().read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"info": {}, "glob": {}}

    def _save_store(self, section: str, key: str, value: Any) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self._store_path()) + ".lock"):
            store = self._load_store()
            store.setdefault(section, {})[key] = value
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix="listing.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(store, f)
            os.replace(tmp, self._store_path())

    def _meta_op(self, section: str, key: str, fn):
        """Run a listing/info call online, remember its answer on disk; offline (or if it fails), use that answer."""
        if not self.offline:
            try:
                value = self._call(f"{self._url(key)}: {section}", fn)
            except RemoteIOError:
                stored = self._load_store().get(section, {}).get(key)
                if stored is None:
                    raise
                self.offline = True  # the network is gone: stop trying for this session
                return stored
            self._save_store(section, key, value)
            return value
        stored = self._load_store().get(section, {}).get(key)
        if stored is None:
            if section == "info" and key in self._load_store().get("missing", {}):
                raise FileNotFoundError(key)
            raise RemoteIOError(f"{self._url(key)}: offline and never read before; connect once with the network "
                                "to cache the dataset's metadata (unset LSQL_OFFLINE/HF_HUB_OFFLINE)")
        return stored

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        if path in self._infos:
            return self._infos[path]

        def fetch():
            fs = self._fs()
            i = fs.info(path)
            out = {"name": path, "size": i.get("size"), "type": i.get("type", "file"), "identity": identity_of(i),
                   **version_of(i)}
            proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
            if proto in ("http", "https") and not (out.get("etag") or out.get("last_modified")) \
                    and out["type"] == "file" and isinstance(out["size"], int) and out["size"] > 0:
                # Nothing tags this version: a change of the same size would keep serving the old cached bytes.
                # A CRC of the file's first and last CHECK_BYTES (a Parquet footer, an mp4's moov box) joins the
                # identity; a change elsewhere alone stays unnoticed (docs/remote).
                n = out["size"]
                head = self._http_get(fs, path, 0, min(n, CHECK_BYTES), {}, n, store=False)
                tail = self._http_get(fs, path, max(0, n - CHECK_BYTES), n, {}, n, store=False) \
                    if n > CHECK_BYTES else b""
                import zlib

                out["identity"] += f"-crc{zlib.crc32(tail, zlib.crc32(head)):08x}"
            return out

        try:
            info = self._meta_op("info", path, fetch)
        except FileNotFoundError:
            if not self.offline:
                with contextlib.suppress(OSError):
                    self._save_store("missing", path, True)
            raise
        self._infos[path] = info
        return info

    def exists(self, path, **kwargs):
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    def glob(self, path, **kwargs):
        path = self._strip_protocol(path)
        if not any(c in path for c in "*?["):  # DuckDB globs every file it opens; HTTP would GET it whole
            return [path] if self.exists(path) else []
        return list(self._meta_op("glob", path, lambda: sorted(self._fs().glob(path))))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        names = self._meta_op("ls", path, lambda: sorted(self._fs().ls(path, detail=False)))
        return [self.info(n) for n in names] if detail else list(names)

    def modified(self, path):
        """A datetime that changes when the content does (DuckDB keys its Parquet metadata cache on it): derived
        from the file's identity, since object stores' mtimes are not content versions."""
        import datetime
        import hashlib

        h = int.from_bytes(hashlib.sha256(self.info(path)["identity"].encode()).digest()[:4], "big")
        return datetime.datetime.fromtimestamp(1_000_000_000 + h, tz=datetime.timezone.utc)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise PermissionError(f"{self._url(path)}: remote datasets are read-only here (mode {mode!r})")
        return RemoteFile(self, self._strip_protocol(path))

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        size = self.info(path)["size"]
        start = 0 if start is None else (start + size if start < 0 else start)
        end = size if end is None else (end + size if end < 0 else end)
        return self.read_range(path, start, end)

    # ---- pieces -----------------------------------------------------------------------------------------------
    def _file_dir(self, path: str) -> Path:
        from .cache import key

        return self.dir / key(path, self.info(path)["identity"])

    def _scan(self, fdir: Path) -> list[tuple[int, int]]:
        out = []
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(fdir):
                if name.endswith(".piece"):
                    a, b = name[:-6].split("-")
                    out.append((int(a), int(b)))
        out.sort()
        self._pieces[str(fdir)] = out
        return out

    @staticmethod
    def _gaps(pieces: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
        gaps, pos = [], lo
        for a, b in pieces:
            if b <= pos or a >= hi:
                continue
            if a > pos:
                gaps.append((pos, a))
            pos = max(pos, b)
        if pos < hi:
            gaps.append((pos, hi))
        return gaps

    def _whole(self, path: str) -> bool:
        rel = self._rel(path)
        return rel is not None and rel.startswith(WHOLE_PREFIXES)

    def missing(self, path: str, start: int, end: int) -> list[tuple[int, int]]:
        """Byte ranges of ``[start, end)`` of ``path`` not in the cache (as this process last saw it)."""
        fdir = self._file_dir(path)
        pieces = self._pieces.get(str(fdir))
        if pieces is None or self._gaps(pieces, start, end):
            pieces = self._scan(fdir)
        return self._gaps(pieces, start, end)

    def ensure(self, path: str, start: int, end: int) -> int:
        """Fetch whatever of ``[start, end)`` is not cached yet; returns the bytes fetched.

        Raises:
            RemoteIOError: the remote failed after retries (nothing partial is left in the cache).
        """
        return self.ensure_ranges(path, [(start, end)])

    def ensure_ranges(self, path: str, ranges: list[tuple[int, int]]) -> int:
        """Fetch whatever of ``ranges`` (``[start, end)`` byte ranges) is not cached yet, the missing pieces in
        parallel (one request per gap, at most ``FETCH_THREADS`` at once); returns the bytes fetched.

        Raises:
            RemoteIOError: the remote failed after retries (the pieces that did arrive are kept; nothing partial).
        """
        path = self._strip_protocol(path)
        size = self.info(path)["size"]
        if self._whole(path):
            ranges = [(0, size)]
        ranges = [(max(0, a), min(b, size)) for a, b in ranges if min(b, size) > max(0, a)]
        ranges = [(a, b) for a, b in ranges if self.missing(path, a, b)]
        if not ranges:
            return 0
        fdir = self._file_dir(path)
        fdir.mkdir(parents=True, exist_ok=True)
        regions = sorted({r for a, b in ranges for r in range(a // REGION, (b - 1) // REGION + 1)})
        # Locks in ascending region order (as every caller takes them): no two callers can deadlock.
        with contextlib.ExitStack() as stack:
            for r in regions:
                stack.enter_context(self._region_lock(fdir, r))
                stack.enter_context(FileLock(str(fdir / f"r{r:07d}.lock")))
            pieces = self._scan(fdir)  # re-read: another worker may have fetched them
            gaps: set[tuple[int, int]] = set()
            for a, b in ranges:
                for r in range(a // REGION, (b - 1) // REGION + 1):  # pieces never cross a region boundary
                    gaps.update(self._gaps(pieces, max(a, r * REGION), min(b, (r + 1) * REGION)))
            gaps = _disjoint(sorted(gaps))
            if gaps and self.offline:
                a, b = gaps[0]
                raise RemoteIOError(f"{self._url(path)}: bytes {a}-{b} are not cached and the session is "
                                    "offline; reconnect with the network, or prefetch before going offline")
            written: set[str] = set()
            fetched, error = 0, None
            fetch = lambda g: self._call(f"{self._url(path)}: bytes {g[0]}-{g[1]}", self._get, path, *g)  # noqa: E731
            results = [(gaps[0], _try(fetch, gaps[0]))] if len(gaps) == 1 else \
                list(zip(gaps, _pool().map(lambda g: _try(fetch, g), gaps)))
            for (a, b), (data, err) in results:
                if err is not None:
                    error = error or err
                    continue
                self._write_piece(fdir, a, b, data)
                written.add(str(fdir / f"{a:012d}-{b:012d}.piece"))
                fetched += len(data)
        self._evict(protect=written)
        if error is not None:
            raise error
        return fetched

    def _write_piece(self, fdir: Path, a: int, b: int, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=fdir, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, fdir / f"{a:012d}-{b:012d}.piece")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        with self._lock:
            self._pieces[str(fdir)] = sorted(self._pieces.get(str(fdir), []) + [(a, b)])
            if self._total is not None:
                self._total += len(data)

    # ---- Parquet column scans ---------------------------------------------------------------------------------
    def _parquet_chunks(self, path: str) -> dict | None:
        """For a Parquet file whose footer is cached: ``{start: (row group, [columns], end)}`` per column chunk and
        ``chunks[rg][col] = (start, end)``. None while the footer is not cached (it is never fetched for this)."""
        known = self._pq.get(path)
        if known is not None:
            return known
        size = self.info(path)["size"]
        if size < 12 or self.missing(path, size - 8, size):
            return None
        tail = self._assemble(path, size - 8, size)
        n = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or n + 8 > size or self.missing(path, size - 8 - n, size):
            return None
        import io

        import pyarrow.parquet as pq

        try:
            md = pq.read_metadata(io.BytesIO(b"PAR1" + self._assemble(path, size - 8 - n, size)))
        except Exception:  # noqa: BLE001 - not our business to judge the file here; just no column readahead
            self._pq[path] = {"by_start": {}, "chunks": []}
            return self._pq[path]
        chunks = []
        for i in range(md.num_row_groups):
            g = md.row_group(i)
            row = []
            for j in range(g.num_columns):
                c = g.column(j)
                a = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else \
                    c.data_page_offset
                row.append((int(a), int(a + c.total_compressed_size)))
            chunks.append(row)
        by_start = {}
        for i, row in enumerate(chunks):
            for j, (a, _b) in enumerate(row):
                by_start.setdefault(a, (i, j))
        self._pq[path] = {"by_start": by_start, "chunks": chunks}
        return self._pq[path]

    def _column_readahead(self, path: str, start: int, end: int) -> list[tuple[int, int]]:
        """Ranges worth fetching with a Parquet read ``[start, end)``: when it is the column chunks ``cols`` of row
        group ``rg`` and the same columns of ``rg - 1`` or ``rg - 2`` were read just before (a scan), the same
        columns of the next ``k`` row groups (``k`` doubling 2, 4 ... 64 while the scan goes on, at most
        ``COLUMN_READAHEAD`` bytes). DuckDB reads each column chunk of a scan with its own request; without this a
        count over a 200-row-group file costs 200 sequential round trips. A query that skips row groups (a filter
        the statistics prune) never looks like a scan, so it fetches nothing extra."""
        if not path.endswith(".parquet") or self._whole(path):
            return []
        pq_ = self._parquet_chunks(path)
        hit = pq_ and pq_["by_start"].get(start)
        if not hit:
            return []
        rg, first = hit
        row = pq_["chunks"][rg]
        cols = tuple(j for j in range(first, len(row)) if row[j][0] >= start and row[j][1] <= end) or (first,)
        key = (path, cols)
        with self._lock:
            hi, k = self._scans.get(key, (-10, 0))
            if 0 <= hi - rg < k:  # inside the last readahead (a second reader thread got here first): in flight
                return []
            k = min(max(2 * k, 2), 64) if 1 <= rg - hi <= 2 else 0
            last = min(len(pq_["chunks"]) - 1, rg + k)
            self._scans[key] = (max(rg, last), k)
        out, budget = [], COLUMN_READAHEAD
        for i in range(rg + 1, last + 1):
            r = pq_["chunks"][i]
            a, b = min(r[j][0] for j in cols), max(r[j][1] for j in cols)
            budget -= b - a
            if budget < 0:
                break
            out.append((a, b))
        return out

    def _region_lock(self, fdir: Path, r: int) -> threading.Lock:
        """Threads of this process queue on a plain lock (FileLock would make them poll every 50 ms)."""
        with self._lock:
            return self._region_locks.setdefault((str(fdir), r), threading.Lock())

    def _get(self, path: str, a: int, b: int) -> bytes:
        """Bytes [a, b) of the version of ``path`` this session first saw (its ``info``): HTTP sends ``If-Match``
        (or ``If-Unmodified-Since`` when the server gave no strong ETag), S3 reads the version id or sends
        ``IfMatch``; the server refuses (412) once the file changed, and we raise :class:`FileChangedError` instead of
        caching bytes of another version beside the old ones. Other filesystems are read unpinned."""
        fs, pin = self._fs(), self.info(path)
        proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        try:
            if proto in ("http", "https"):
                headers = ({"If-Match": pin["etag"]} if pin.get("etag")
                           else {"If-Unmodified-Since": pin["last_modified"]} if pin.get("last_modified") else {})
                data = self._http_get(fs, path, a, b, headers, pin.get("size"))
            elif proto in ("s3", "s3a") and pin.get("version_id"):
                data = fs.cat_file(path, start=a, end=b, version_id=pin["version_id"])
            elif proto in ("s3", "s3a") and pin.get("etag") and hasattr(fs, "_call_s3"):
                data = self._s3_get(fs, path, a, b, pin["etag"])
            else:
                data = fs.cat_file(path, start=a, end=b)
        except Exception as e:  # noqa: BLE001 - each library reports a 412 its own way
            if _precondition_failed(e):
                raise FileChangedError(
                    f"{self._url(path)}: the file changed on the server during this run (it no longer matches "
                    f"{pin.get('version_id') or pin.get('etag') or pin.get('last_modified')}, the version first "
                    f"read); bytes {a}-{b} were not read, so no item mixes two versions. Connect again to read the "
                    "new version") from e
            raise
        self._count(bytes_fetched=len(data))
        if len(data) != b - a:
            raise _Truncated(f"got {len(data)} of {b - a} bytes")
        return data

    def _http_get(self, fs, path: str, a: int, b: int, headers: dict, size: int | None, store: bool = True) -> bytes:
        """Bytes [a, b) by one ranged GET on fsspec's aiohttp session, checking the answer as it comes.

        * The headers must announce exactly the bytes asked for (206 with that Content-Length and Content-Range):
          a server announcing more than it sends would otherwise hold each read until the socket timeout, for every
          retry. Any other announcement raises at once, before the body (``_Lying``, not retried).
        * The body must keep coming: no pause over ``stall_s`` and, past ``stall_s``, at least ``min_rate`` bytes/s
          on average (``_Stalled``, retried once). A server dripping a byte every few seconds never trips a socket
          read timeout by itself.
        * A server that ignores Range (200 and the whole file): the whole file (up to ``WHOLE_MAX`` bytes) is read
          once and stored in the cache with a warning, so no later read (or retry) fetches it again; a larger file
          raises RemoteIOError.
        """
        import asyncio

        from fsspec.asyn import sync

        url = self._url(path)

        async def body(r, n: int) -> bytes:
            out = bytearray()
            deadline = time.monotonic() + self.stall_s + n / self.min_rate
            while len(out) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Stalled(f"{url}: the server sent {len(out)} of {n} bytes in {self.stall_s + n / self.min_rate:.0f} s "
                                   f"(less than {self.min_rate / 1024:.0f} KiB/s)")
                try:
                    chunk = await asyncio.wait_for(r.content.read(min(1 << 20, n - len(out))),
                                                   timeout=min(left, self.stall_s))
                except asyncio.TimeoutError:
                    raise _Stalled(f"{url}: the server stopped sending after {len(out)} of {n} bytes (nothing for "
                                   f"{min(left, self.stall_s):.0f} s)") from None
                if not chunk:
                    raise _Truncated(f"{url}: the connection closed after {len(out)} of {n} bytes")
                out += chunk
            return bytes(out)

        async def get():
            session = await fs.set_session()
            kw = dict(getattr(fs, "kwargs", {}) or {})
            h = {**(kw.pop("headers", None) or {}), **headers, "Range": f"bytes={a}-{b - 1}"}
            async with session.get(fs.encode_url(path), headers=h, **kw) as r:
                if r.status == 404:
                    raise FileNotFoundError(url)
                r.raise_for_status()  # 412 -> FileChangedError in _get; 5xx -> retried
                n = r.content_length
                if r.status == 200:
                    total = n if n is not None else size
                    if total is None or (size is not None and total != size):
                        raise _Lying(f"{url}: asked for bytes {a}-{b}, the server answered 200 with "
                                     f"{total} bytes, not the file's {size}")
                    if total > WHOLE_MAX and not (a == 0 and b == total):
                        raise _Lying(f"{url}: the server ignores Range requests (answered 200 with the whole "
                                     f"{total}-byte file for bytes {a}-{b}); files over {WHOLE_MAX} bytes are "
                                     "not fetched whole. Use a server or mirror that supports Range")
                    return await body(r, total), True
                if r.status != 206:
                    raise _Lying(f"{url}: unexpected HTTP status {r.status} for bytes {a}-{b}")
                cr = r.headers.get("Content-Range", "")
                if (n is not None and n != b - a) or (cr and not cr.startswith(f"bytes {a}-{b - 1}/")):
                    raise _Lying(f"{url}: asked for bytes {a}-{b} ({b - a} bytes), the server announced "
                                 f"Content-Length {n}, Content-Range {cr or 'none'}; it sends other bytes than "
                                 "asked for (a misconfigured server or proxy)")
                return await body(r, b - a), False

        data, whole = sync(fs.loop, get)
        if whole and not store:
            return data[a:b]
        if whole:
            if url not in self._warned:
                self._warned.add(url)
                import warnings

                warnings.warn(f"{url}: the server ignores Range requests (it answered 200 with the whole file); "
                              f"fetched the whole file ({len(data)} bytes) once into the cache", stacklevel=2)
            self._store_whole(path, data)
            data = data[a:b]
        return data

    def _store_whole(self, path: str, data: bytes) -> None:
        """Keep a whole file as region pieces (never re-fetched while cached); pieces already there are kept."""
        fdir = self._file_dir(path)
        fdir.mkdir(parents=True, exist_ok=True)
        have = self._scan(fdir)
        for r in range((len(data) + REGION - 1) // REGION):
            a, b = r * REGION, min(len(data), (r + 1) * REGION)
            if self._gaps(have, a, b):
                self._write_piece(fdir, a, b, data[a:b])

    @staticmethod
    def _s3_get(fs, path: str, a: int, b: int, etag: str) -> bytes:
        """A ranged S3 GetObject with ``IfMatch`` (s3fs's cat_file takes no conditions)."""
        from fsspec.asyn import sync

        bucket, key, _ = fs.split_path(path)

        async def get():
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={a}-{b - 1}", IfMatch=etag)
            try:
                return await resp["Body"].read()
            finally:
                resp["Body"].close()

        return sync(fs.loop, get)

    def read_range(self, path: str, start: int, end: int, readahead: int = 0) -> bytes:
        """Bytes ``[start, end)`` of ``path``, fetching what is missing (plus up to ``readahead`` bytes after ``end``)."""
        path = self._strip_protocol(path)
        size = self.info(path)["size"]
        end = min(end, size)
        if start >= end:
            return b""
        for _ in range(3):
            fetched = 0
            if self.missing(path, start, end):
                fetched = self.ensure_ranges(path, [(start, min(size, max(end, start + readahead)))]
                                             + self._column_readahead(path, start, end))
            try:
                data = self._assemble(path, start, end)
            except FileNotFoundError:  # a piece was evicted by another process between listing and reading
                self._scan(self._file_dir(path))
                continue
            self._count(bytes_from_cache=max(0, len(data) - fetched))
            return data
        raise RemoteIOError(f"{self._url(path)}: bytes {start}-{end} keep disappearing from the cache; cache_size "
                            f"({self.cache_size} bytes) is too small for the readers sharing it, raise it")

    def _assemble(self, path: str, start: int, end: int) -> bytes:
        fdir = self._file_dir(path)
        out = bytearray()
        pos = start
        for a, b in self._pieces.get(str(fdir), []):
            if b <= pos or a > pos:
                if a > pos:
                    break
                continue
            p = fdir / f"{a:012d}-{b:012d}.piece"
            n = min(b, end) - pos
            with open(p, "rb") as f:
                f.seek(pos - a)
                chunk = f.read(n)
            if len(chunk) != n:
                raise FileNotFoundError(p)
            with contextlib.suppress(OSError):
                os.utime(p)  # LRU: the mtime of a piece is its last read
            out += chunk
            pos += n
            if pos >= end:
                break
        if pos < end:
            raise FileNotFoundError(f"{path}: bytes {pos}-{end}")
        return bytes(out)

    def _evict(self, protect: set[str] = frozenset()) -> None:
        """Delete least recently read pieces until the total is at most 90% of ``cache_size`` (never the pieces
        in ``protect``, just written for the current read)."""
        if self._total is not None and self._total <= self.cache_size:
            return
        entries = []
        with contextlib.suppress(FileNotFoundError):
            for d in os.scandir(self.dir):
                if not d.is_dir():
                    continue
                for e in os.scandir(d.path):
                    if e.name.endswith(".piece"):
                        with contextlib.suppress(FileNotFoundError):
                            st = e.stat()
                            entries.append((st.st_mtime_ns, st.st_size, d.path, e.name))
        total = sum(e[1] for e in entries)
        if total > self.cache_size:
            goal = int(self.cache_size * 0.9)
            for _mt, sz, d, name in sorted(entries):
                if total <= goal:
                    break
                if os.path.join(d, name) in protect:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(d, name))
                    total -= sz
                    a, b = name[:-6].split("-")
                    with self._lock:
                        lst = self._pieces.get(d)
                        if lst is not None and (int(a), int(b)) in lst:
                            lst.remove((int(a), int(b)))
        self._total = total

    def cached_bytes(self) -> int:
        """Total size of the pieces on disk (all processes)."""
        self._total = None
        total = 0
        with contextlib.suppress(FileNotFoundError):
            for d in os.scandir(self.dir):
                if d.is_dir():
                    total += sum(e.stat().st_size for e in os.scandir(d.path) if e.name.endswith(".piece"))
        return total


def merge_ranges(ranges: list[tuple[int, int]], gap: int = MERGE_GAP) -> list[tuple[int, int]]:
    """Byte ranges [start, end) sorted, with those that overlap, touch or lie within ``gap`` bytes of each other
    merged into one: what to ask a server for (fewer requests for a few KiB more)."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _disjoint(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans with overlaps merged (two wanted ranges may share a gap); touching spans stay apart (they may
    lie in two regions)."""
    out: list[list[int]] = []
    for a, b in spans:
        if out and a < out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _try(fn, arg):
    """(fn(arg), None) or (None, the exception): parallel fetches report failures after the others are stored."""
    try:
        return fn(arg), None
    except BaseException as e:  # noqa: BLE001 - re-raised by the caller
        return None, e


_POOL: tuple[int, Any] | None = None


def _pool():
    """The process's fetch threads (re-created after a fork: a pool's threads do not survive one)."""
    global _POOL
    import concurrent.futures

    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), concurrent.futures.ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="lsql-fetch"))
    return _POOL[1]


def _rebuild(target, root, url, cache_dir, cache_size, retries, backoff_s, offline, infos=None, stall_s=STALL_S,
             min_rate=MIN_RATE):
    fs = RemoteCacheFS(target, root, url, cache_dir, cache_size, retries=retries, backoff_s=backoff_s, offline=offline,
                       stall_s=stall_s, min_rate=min_rate)
    fs._infos.update(infos or {})
    return fs


class RemoteFile(AbstractBufferedFile):
    """A read-only file of :class:`RemoteCacheFS`. Sequential readers (PyAV, DuckDB) get a growing readahead
    (64 KiB doubling to 256 KiB, reset by a seek), so a stream is fetched in few requests without overshooting much.

    The position (and the readahead state) is kept per thread: DuckDB reads one handle from several threads at once,
    each as ``seek(location)`` then ``read(n)`` in two calls, so with one shared position a thread could read at the
    place another thread just sought to. A thread that never sought starts where the file's last user left it."""

    def __init__(self, fs: RemoteCacheFS, path: str):
        self._tls = threading.local()
        self._last = (0, -1, 0)  # (loc, next, readahead) of the last thread to move: a new thread starts there
        super().__init__(fs, path, mode="rb", block_size=0, cache_type="none", size=fs.info(path)["size"])

    def _state(self) -> list:
        st = getattr(self._tls, "st", None)
        if st is None:
            st = self._tls.st = list(self._last)
        return st

    @property
    def loc(self) -> int:
        return self._state()[0]

    @loc.setter
    def loc(self, value: int) -> None:
        st = self._state()
        st[0] = value
        self._last = tuple(st)

    def _fetch_range(self, start: int, end: int) -> bytes:
        st = self._state()
        if start == st[1]:
            st[2] = min(max(st[2] * 2, MIN_READAHEAD), MAX_READAHEAD)
        else:
            st[2] = 0
        st[1] = end
        return self.fs.read_range(self.path, start, end, readahead=end - start + st[2])
