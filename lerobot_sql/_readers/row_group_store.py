"""The row-group store: the data files' row groups as decoded, on disk, shared by every process that reads them.

Why: a random item reads one row group, and decoding it from Parquet costs 0.15-0.5 ms of CPU (the upper end where
video decoding has just emptied the CPU caches). A shuffled epoch reads each row group once per item of it (300
times for 300-frame episodes), and a process keeps only the last ~48 MB decoded (:class:`tabular.RowGroups`): on a
set of millions of frames nearly every item decoded its row group again. The store keeps each row group as a process
first decoded and checked it, in one file per data-file version; the next read of it, in any process (another
DataLoader worker, the next epoch, the next run), is one ``pread`` of its bytes (~10 us) instead of a decode.

What is stored: the numpy arrays :meth:`tabular.RowGroupView.column` gives for every column, only where every
column is a number or a fixed-size list of numbers without NULL (lerobot's frame columns; a dataset with images or
strings in its data files is read from Parquet as before).

A store file: a 4 KiB header (magic, the JSON's length and CRC-32, and JSON: the data file, the columns' names,
dtypes and per-row shapes, the row-group count),
then a directory of 16 bytes per row group (its payload's offset, and a check of that offset), then payloads,
appended as row groups are first read: a 32-byte header (magic, row group, size, CRC-32 of the bytes) and the
columns' bytes back to back, each column's rows contiguous.

Concurrency: each process appends into a region of the file it reserved at the file's end under the file's
``flock`` (a megabyte at a time; a thread lock within a process); a payload is written before its directory entry,
each by ``pwrite``. A reader trusts nothing it reads: an entry
whose check fails (never written, or torn by a concurrent write), or a payload whose header, size or CRC disagrees
is a miss: the row group is decoded from Parquet and written again. A process killed mid-append leaves at most an
unreferenced payload.

Bound: the store files of a cache folder together stay under ``$LSQL_ROW_GROUP_CACHE_MB`` megabytes (default: a
quarter of the free space where the folder is, at a process's first use); the datasets' default folders in the cache
root (``$LSQL_CACHE_DIR``) count as one (:func:`scope_of`). The bytes a process appends are counted per such folder,
and the total looked at every eighth of the budget (at most 32 MB); the least recently used files are deleted first
(a file's mtime is its last use), and when only files in use are left over the budget the process stores nothing for
:data:`KEEP_RECENT_S`, then looks again. ``LSQL_ROW_GROUP_CACHE_MB=0`` turns the store off. A full disk or an
unwritable folder turns writing off for the process, with one warning; reading from Parquet goes on.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import math
import os
import shutil
import struct
import threading
import time
import uuid
import weakref
import zlib
from pathlib import Path

import numpy as np

from .. import _settings
from .._storage import cache
from ..errors import warn

try:
    import fcntl
except ImportError:  # Windows: no flock; the store is off there
    fcntl = None

MAGIC = b"LSQLRGS2"           # a store file's first bytes
PAYLOAD_MAGIC = b"LSQLRGP1"   # a payload's first bytes
HEADER_BYTES = 4096
ENTRY = struct.Struct("<qq")            # payload offset, offset ^ CHECK ^ (row group << 20)
PAYLOAD = struct.Struct("<8sqqI4x")     # magic, row group, bytes of columns, CRC-32 of them
CHECK = 0x5A17_C0DE_5EED_F00D
ALIGN = 64                              # payloads start on 64-byte boundaries (numpy views of them are aligned)
SUFFIX = ".rowgroups"
FOLDER = cache.ROW_GROUPS
EVICT_EVERY = 32 << 20                  # a process checks the folder's total after this many bytes appended (or an
                                        # eighth of the budget)
KEEP_RECENT_S = 30.0                    # a file used this recently is not evicted (another process may be filling it)
STALE_TMP_S = 3600.0                    # a temporary header file older than this is a killed process's: deleted
RESERVE = 1 << 20                       # bytes a process reserves at the file's end at a time, for its payloads
TOUCH_EVERY_S = 5.0                     # a process marks a file it uses at most this often (KEEP_RECENT_S > it)

# number kinds numpy can view from raw bytes, as RowGroupView.column gives them
_STORABLE_KINDS = "iufb"  # (bool: lerobot's next.done, a byte each)


def budget() -> int:
    """Bytes the store files of one cache folder may take: ``$LSQL_ROW_GROUP_CACHE_MB`` megabytes; unset: decided per
    folder by :func:`default_budget`; 0: the store is off.

    Raises:
        SettingError: the variable is not a finite number of megabytes >= 0 (naming it).
    """
    got = _settings.megabytes("LSQL_ROW_GROUP_CACHE_MB", None, "decoded row groups kept on disk (the row-group "
                              "store)", zero="the store off")
    return -1 if got is None else got


def default_budget(folder: Path) -> int:
    """A quarter of the free space on the disk holding ``folder`` (its nearest existing parent), at the time asked."""
    p = folder
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free // 4
    except OSError:
        return 0


def storable(arrays: dict[str, np.ndarray]) -> bool:
    """True if every column is a numpy array of plain numbers (what a payload can hold and give back as views)."""
    return all(isinstance(a, np.ndarray) and a.dtype.kind in _STORABLE_KINDS and a.dtype.isnative
               for a in arrays.values())


class RowGroupStore:
    """The store file of one data-file version (``path``), as this process uses it.

    ``get(rg, rows)`` gives the arrays a process stored for row group ``rg`` (``rows`` rows), or None; ``put(rg,
    arrays)`` stores them. Neither raises for the store's own failures (a damaged entry is a miss; a failed write
    turns writing off for this process with a warning): the caller reads Parquet instead.
    """

    def __init__(self, path: Path, n_row_groups: int, limit: int, columns: list[str] | None = None, rel: str = "",
                 scope: Path | None = None):
        self.path, self.n, self.rel = Path(path), int(n_row_groups), rel  # rel: the data file, for messages
        self.columns = columns  # the data file's columns, in file order: a file holding others is not used
        self.limit = limit  # bytes for the folder's store files; -1: decided at the first write (default_budget)
        # the folder whose every sub-folder's store files share the budget (the cache root: :func:`scope_of`);
        # None: this store's folder alone
        self.scope = None if scope is None else Path(scope)
        self._scope_key = str(self.scope or self.path.parent)
        self._fd: int | None = None
        self._pid = -1
        self._spec: list[tuple[str, np.dtype, tuple[int, ...], int]] | None = None
        self._row_bytes = 0
        self._lock = threading.Lock()
        self._writable = True
        self._touched = 0.0
        self._damaged: set[int] = set()  # row groups whose entry led to a damaged payload in this process
        self._region: list[int] | None = None  # [next free, end, pid] of the file region this process reserved

    def close(self) -> None:
        """Close the descriptor of the file (in a forked child: its own copy; the parent's stays open)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self):
        self.close()

    # ---- opening -------------------------------------------------------------------------------------------------
    def _open(self) -> bool:
        """Open the file (again after a fork: a flock is shared with the parent through an inherited descriptor) and
        read its column spec; False while it does not exist or is not a store file."""
        if self._fd is not None and self._pid == os.getpid():
            return True
        self.close()  # (a copy inherited through a fork: its flock would be the parent's)
        self._region = None
        try:
            fd = os.open(self.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return False
        try:
            head = os.pread(fd, HEADER_BYTES, 0)
            spec = _parse_header(head, self.n)
        except (OSError, ValueError):
            spec = None
        if spec is not None and self.columns is not None and [c[0] for c in spec] != self.columns:
            spec = None
        if spec is None:  # not ours, or damaged (put() replaces it)
            os.close(fd)
            return False
        self._fd, self._pid = fd, os.getpid()
        _opened(self)
        self._spec = spec
        self._row_bytes = sum(d.itemsize * n for _, d, _, n in spec)
        self._touched = 0.0
        self._touch()
        return True

    def _touch(self) -> None:
        """Mark the file used now (its mtime: what eviction orders by), at most every few seconds."""
        now = time.monotonic()
        if now - self._touched > TOUCH_EVERY_S:
            self._touched = now
            with contextlib.suppress(OSError):
                os.utime(self._fd if os.utime in os.supports_fd else self.path)

    def _create(self, arrays: dict[str, np.ndarray]) -> bool:
        """Make the file with ``arrays``' columns as its spec, unless another process made it first."""
        spec = [{"name": k, "dtype": a.dtype.str, "shape": list(a.shape[1:])} for k, a in arrays.items()]
        body = json.dumps({"version": 1, "data_file": self.rel, "row_groups": self.n, "columns": spec}).encode()
        if len(body) > HEADER_BYTES - 16:
            self._writable = False  # (thousands of columns: not worth a larger header)
            return False
        # (the JSON's CRC: a flipped bit in a dtype ('<f4' -> '>f4') would read every payload wrongly, CRCs and all)
        head = MAGIC + struct.pack("<II", len(body), zlib.crc32(body)) + body
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(head.ljust(HEADER_BYTES, b"\0"))
                f.truncate(HEADER_BYTES + self.n * ENTRY.size)  # the directory: zeros, no entry yet
            try:
                os.link(tmp, self.path)  # (atomic: a file made by another process meanwhile is kept)
            except FileExistsError:
                if not self._open():  # there, but not a store file of these columns (damaged): replaced
                    os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return self._open()

    # ---- reading -------------------------------------------------------------------------------------------------
    def get(self, rg: int, rows: int) -> dict[str, np.ndarray] | None:
        """Row group ``rg``'s arrays (read-only numpy views of one buffer, each (rows, *shape)), or None when the
        store does not hold it (or holds it damaged)."""
        # (the reads under the lock, as the descriptor's closing is: read after it, another thread opening one store
        # file too many could close the descriptor and the next file opened take its number, another store file,
        # whose payload of the same row group and size passes every check; hostile review 23)
        with self._lock:
            if not self._open():
                return None
            spec, size = self._spec, rows * self._row_bytes
            try:
                entry = os.pread(self._fd, ENTRY.size, HEADER_BYTES + rg * ENTRY.size)
                off, check = ENTRY.unpack(entry)
                if off <= 0 or check != off ^ CHECK ^ (rg << 20):
                    return None
                # (no read past the file's end: a header of absurd shapes would ask for terabytes, or more than a
                # read can take)
                if off + PAYLOAD.size + size > os.fstat(self._fd).st_size:
                    self._damaged.add(rg)
                    return None
                buf = os.pread(self._fd, PAYLOAD.size + size, off)
            except (OSError, struct.error):
                return None
            self._touch()
        if len(buf) != PAYLOAD.size + size:
            self._damaged.add(rg)
            return None
        magic, got_rg, got_size, crc = PAYLOAD.unpack_from(buf)
        if magic != PAYLOAD_MAGIC or got_rg != rg or got_size != size or zlib.crc32(memoryview(buf)[PAYLOAD.size:]) != crc:
            self._damaged.add(rg)  # (an entry to a damaged payload: put() writes the row group again)
            return None
        out, at = {}, PAYLOAD.size
        for name, dtype, shape, per_row in spec:
            n = rows * per_row
            out[name] = np.frombuffer(buf, dtype, n, at).reshape((rows, *shape)) if shape else \
                np.frombuffer(buf, dtype, n, at)
            at += n * dtype.itemsize
        return out

    # ---- writing -------------------------------------------------------------------------------------------------
    def put(self, rg: int, arrays: dict[str, np.ndarray]) -> None:
        """Store row group ``rg``'s ``arrays`` (every column, as :meth:`get` gives them back) unless it is held
        already; nothing when the arrays do not match the file's columns (another normalisation made the file)."""
        if not self._writable or fcntl is None or not hasattr(os, "pwritev"):  # (Windows; macOS before 11)
            return
        acct = _folder(self._scope_key)
        if acct.off:
            return
        try:
            if acct.full_until:  # the files in use filled the budget: see whether room was made since
                if time.monotonic() < acct.full_until or not self._keep_within_budget(acct):
                    return
            with self._lock:
                if not self._open() and not self._create(arrays):
                    return
                spec = self._spec
                if len(spec) != len(arrays) or any(
                        n != name or a.dtype != d or a.shape[1:] != s
                        for (n, d, s, _), (name, a) in zip(spec, arrays.items())):
                    return
                rows = len(next(iter(arrays.values()))) if arrays else 0
                # (the columns' own bytes, not copies: written by one pwritev; a C-contiguous array is its own
                # buffer, as a row group read gives them)
                parts = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays.values()]
                size, crc = 0, 0
                for p in parts:
                    size += p.nbytes
                    crc = zlib.crc32(p, crc)
                if size != rows * self._row_bytes:
                    return
                fd = self._fd
                at = HEADER_BYTES + rg * ENTRY.size
                held, check = ENTRY.unpack(os.pread(fd, ENTRY.size, at))
                if held > 0 and check == held ^ CHECK ^ (rg << 20) and rg not in self._damaged:
                    return  # (another worker stored it while this one decoded it: not written twice)
                self._damaged.discard(rg)
                need = -(-(PAYLOAD.size + size) // ALIGN) * ALIGN
                off = self._reserve(need)
                if os.pwritev(fd, [PAYLOAD.pack(PAYLOAD_MAGIC, rg, size, crc), *parts], off) != PAYLOAD.size + size:
                    raise OSError(f"short write at byte {off}")
                # (after the payload: an entry is never seen before its bytes. Two processes storing the same row
                # group each write a whole valid entry; a torn mix of the two fails its check: a miss)
                os.pwrite(fd, ENTRY.pack(off, off ^ CHECK ^ (rg << 20)), at)
                self._touch()
            # (the bytes appended counted per folder, not per store: a process filling many data files' stores at
            # once went past the budget by an eighth of it (at most 32 MB) per file; hostile review 23)
            limit = self.limit if self.limit >= 0 else acct.default
            with _OPEN_LOCK:
                acct.appended += need
                due = acct.appended >= min(EVICT_EVERY, max(limit // 8, 1))
                if due:
                    acct.appended = 0
            if due:
                self._keep_within_budget(acct)
        except OSError as e:  # a full disk, a read-only folder: Parquet is read as before, without the store
            if acct.off:
                return
            acct.off = True
            first = "Free space there" if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT, None) else \
                "Make the folder writable"
            warn(f"{self.path}: the row-group store cannot be written ({e}); row groups are decoded from the data "
                 f"files on every read in this process. {first}, set LSQL_CACHE_DIR (or connect(..., "
                 "cache_dir=...)) to a writable folder with room, or LSQL_ROW_GROUP_CACHE_MB=0 to turn the store off")

    def _reserve(self, n: int) -> int:
        """The offset of ``n`` bytes of the file for this process alone: taken from the region it reserved last, or
        from a new one of :data:`RESERVE` bytes past the file's end, reserved under the file's flock (a region
        left unused by a process that ends is a hole: no disk block is written for it)."""
        if self._region is None or self._region[2] != self._pid or self._region[0] + n > self._region[1]:
            fd = self._fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                start = -(-os.fstat(fd).st_size // ALIGN) * ALIGN
                end = start + max(RESERVE, n)
                os.ftruncate(fd, end)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            self._region = [start, end, self._pid]
        off = self._region[0]
        self._region[0] += n
        return off

    def _keep_within_budget(self, acct: "_Folder") -> bool:
        """Delete the folder's least recently used store files until they fit the budget; stop writing (this
        process, every file of the folder, for :data:`KEEP_RECENT_S`) when only files in use are left over it: False
        then. A file deleted under this process (by another's eviction) is made anew."""
        if self.limit >= 0:
            limit = self.limit
        else:
            if acct.default < 0:
                acct.default = default_budget(self.scope or self.path.parent)
            limit = acct.default
        mine = None
        with self._lock:  # (the descriptor is closed under it)
            try:
                mine = os.fstat(self._fd).st_ino if self._fd is not None else None
                gone = mine is not None and os.stat(self.path).st_ino != mine
            except OSError:
                gone = True
            if gone:  # deleted by another process's eviction: made anew at the next write
                self.close()
                return True
        folders = [self.path.parent]
        if self.scope is not None:  # (every dataset's folder in the cache root: their store files share the budget)
            with contextlib.suppress(OSError), os.scandir(self.scope) as it:
                folders += [Path(e.path) / FOLDER for e in it if e.is_dir(follow_symlinks=False)]
        files, seen = [], set()
        for k, folder in enumerate(folders):
            try:
                entries = list(os.scandir(folder))
            except OSError:
                if k == 0:
                    raise
                continue
            for e in entries:
                if e.name.startswith(".") and e.name.endswith(".tmp"):  # a header a killed process left half-made
                    with contextlib.suppress(OSError):
                        if time.time() - e.stat(follow_symlinks=False).st_mtime > STALE_TMP_S:
                            os.unlink(e.path)
                elif e.name.endswith(SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat(follow_symlinks=False)
                        if (st.st_dev, st.st_ino) not in seen:  # (its own folder is listed twice)
                            seen.add((st.st_dev, st.st_ino))
                            files.append((st.st_mtime, st.st_blocks * 512, e.path, st.st_ino))
        total = sum(f[1] for f in files)
        now = time.time()
        for mtime, size, path, ino in sorted(files):
            if total <= limit:
                break
            if now - mtime < KEEP_RECENT_S or ino == mine:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                total -= size
        # the files in use fill the budget: read what they hold, store no more for a while
        acct.full_until = time.monotonic() + KEEP_RECENT_S if total > limit else 0.0
        return not acct.full_until


MAX_OPEN = 64  # store files a process keeps open (a v2.1 dataset has a data file per episode: thousands)
_OPEN: "collections.OrderedDict[int, weakref.ref]" = collections.OrderedDict()
_OPEN_LOCK = threading.Lock()  # (also over the folders' accounts)


class _Folder:
    """This process's account of one cache folder's store files (the budget is the folder's, not a store's)."""

    def __init__(self):
        self.appended = 0  # bytes its stores appended since the folder's total was last summed
        self.default = -1  # default_budget, decided at the first sum
        self.full_until = 0.0  # time.monotonic() until which nothing is written (files in use filled the budget)
        self.off = False  # a write failed (a full disk, a read-only folder): nothing more written, warned once


_FOLDERS: dict[str, _Folder] = {}


def _folder(key: str) -> _Folder:
    """The account of the folder ``key`` (a path, as text: a store's budget scope)."""
    got = _FOLDERS.get(key)  # (a lookup per row group stored: no lock, no new _Folder, when it is there)
    if got is None:
        with _OPEN_LOCK:
            got = _FOLDERS.setdefault(key, _Folder())
    return got


def _opened(store: RowGroupStore) -> None:
    """Note ``store``'s file as opened by this process; close the least recently opened beyond :data:`MAX_OPEN` (each
    opens again at its next use)."""
    with _OPEN_LOCK:
        _OPEN[id(store)] = weakref.ref(store)
        _OPEN.move_to_end(id(store))
        busy = []
        while len(_OPEN) > MAX_OPEN:
            key, ref = _OPEN.popitem(last=False)
            old = ref()
            if old is None or old is store:
                continue
            if old._lock.acquire(blocking=False):
                try:  # (never under a thread reading or writing with it: its descriptor could go to another file)
                    old.close()
                finally:
                    old._lock.release()
            else:  # (kept on the list, first out at the next turn: dropped, it stayed open for good; review 23)
                busy.append((key, ref))
        for key, ref in reversed(busy):
            _OPEN[key] = ref
            _OPEN.move_to_end(key, last=False)


def _new_open_lock() -> None:  # (a fork while a thread held it)
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_open_lock)


def _parse_header(head: bytes, n: int) -> list[tuple[str, np.dtype, tuple[int, ...], int]] | None:
    """The columns (name, dtype, per-row shape, elements per row) a store file's header gives, or None when it is
    not a store file of ``n`` row groups."""
    if len(head) < 16 or head[:8] != MAGIC:
        return None
    length, crc = struct.unpack_from("<II", head, 8)
    body = head[16:16 + length]
    if not 0 < length <= HEADER_BYTES - 16 or len(body) != length or zlib.crc32(body) != crc:
        return None
    try:  # (what the CRC passes is still read as foreign: any other form is not a store file of ours)
        meta = json.loads(body)
        if meta.get("version") != 1 or meta.get("row_groups") != n:
            return None
        spec = []
        for c in meta["columns"]:
            dtype = np.dtype(c["dtype"])
            if dtype.kind not in _STORABLE_KINDS or not dtype.isnative:  # (what put() writes: native numbers)
                return None
            shape = tuple(int(x) for x in c["shape"])
            if any(x < 0 or x > 1 << 31 for x in shape):
                return None
            spec.append((str(c["name"]), dtype, shape, math.prod(shape)))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return spec


def scope_of(cache_dir: Path) -> Path | None:
    """The folder whose datasets' store files share one budget with ``cache_dir``'s: the cache root
    (``$LSQL_CACHE_DIR``) when ``cache_dir`` is a dataset's folder in it (the default, one per dataset URL: a budget
    each let every dataset read take as much again); None for a folder elsewhere (``connect(..., cache_dir=...)``):
    its own store files alone."""
    root = cache.cache_root()
    return root if os.path.realpath(Path(cache_dir).parent) == os.path.realpath(root) else None


def for_data_file(cache_dir: Path, src, info, layout, n_row_groups: int, limit: int,
                  scope: Path | None = None) -> RowGroupStore:
    """The store of data file ``info`` (a :class:`tabular.DataFileInfo` of source ``src``) as normalised to
    ``layout``'s features: ``<cache_dir>/row_groups/<key>.rowgroups``, the key from the source URL, the file's path
    and version (``info.identity``: a rewritten file is another store) and the features' dtypes and shapes (what
    the decoded arrays depend on). ``limit``: :func:`budget`; ``scope``: :func:`scope_of`."""
    fingerprint = sorted((k, f.dtype, list(f.shape)) for k, f in layout.features.items())
    key = cache.key(src.url, info.rel, info.identity, fingerprint, "row-group-store-2")
    return RowGroupStore(Path(cache_dir) / FOLDER / f"{key}{SUFFIX}", n_row_groups, limit,
                         list(info.schema.names) if info.schema is not None else None, info.rel, scope)
