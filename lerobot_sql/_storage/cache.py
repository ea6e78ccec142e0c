"""On-disk caches: one root per user, one folder per dataset, entries keyed by the source file's identity.

Writes go to a temporary name in the same folder and are renamed into place (:func:`atomic_write`, which the
package's other whole-file writes use too), under a file lock, so a reader never sees a half-written entry and two
processes never build the same entry twice.

Entries built with ``checksum=True`` get a sidecar ``<entry>.crc`` (size and CRC-32 of the entry, written before
the entry is renamed into place). :func:`check_once` compares an entry with it the first time a process uses the
entry (one pass over its bytes at ~4 GB/s, never per item); a truncated, empty, garbled or bit-flipped entry, or one
without its sidecar, is then discarded with a warning naming it (:func:`discard`) and built again by the caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import tempfile
import threading
import uuid
import zlib
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock

try:
    import fcntl
except ImportError:  # Windows: filelock's own lock
    fcntl = None

from ..errors import CacheError, LeRobotSQLError, warn


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing, never removed) between processes for the
    ``with`` block; not reentrant.

    The same ``flock`` that :class:`filelock.FileLock` takes on POSIX (processes using either exclude each other),
    without its bookkeeping: FileLock cost ~200 us of CPU per acquire and release here, and a waiter polled (every
    2-50 ms) where this one sleeps in the kernel until the holder releases. A remote read's piece writes and cache
    builds take one or two per file region. Windows (no fcntl): FileLock.
    """
    if fcntl is None:
        with FileLock(str(path)):
            yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # unlock before close: a forked child holding a copy of the descriptor would keep the lock otherwise
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# The fix every cache failure names: put the cache elsewhere.
CACHE_DIR_FIX = "set LSQL_CACHE_DIR (or connect(..., cache_dir=...))"


def cache_error(where: str | os.PathLike, problem: str, *, first: str | None = "free space there",
                to: str = "a writable folder with room") -> CacheError:
    """The one wording of a cache failure: ``"<where>: <problem>; <first>, or set LSQL_CACHE_DIR (or connect(...,
    cache_dir=...)) to <to>"`` (without ``first``: ``"...; set LSQL_CACHE_DIR ... to <to>"``). ``problem`` says what
    failed and why, e.g. ``"cannot write this cache entry (<OSError>); the cache folder is full or not writable"``."""
    fix = f"{first}, or {CACHE_DIR_FIX}" if first else CACHE_DIR_FIX
    return CacheError(f"{where}: {problem}; {fix} to {to}")


def cache_root() -> Path:
    """``$LSQL_CACHE_DIR``, else ``$XDG_CACHE_HOME/lerobot_sql``, else ``~/.cache/lerobot_sql``."""
    env = os.environ.get("LSQL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg or Path.home() / ".cache") / "lerobot_sql"


def key(*parts: object) -> str:
    """A short stable hash of ``parts`` (file URL, identity, format version ...)."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:24]


SUM_SUFFIX = ".crc"
_CHECKED: set[str] = set()  # entries of this process already compared with their sidecar


class CacheWarning(UserWarning):
    """A cache entry was damaged (truncated, emptied, garbled) and is being rebuilt."""


def _digest(path: str | os.PathLike) -> str:
    """``"<size> <crc32 hex>"`` of a file (the sidecar's content)."""
    # Read in blocks, not mapped: a mapping would count every page of a multi-GB entry (a kept selection) in the
    # process's RSS; reads go through the page cache alone, at the same speed.
    crc, size = 0, 0
    with open(path, "rb") as f:
        block = bytearray(8 << 20)
        view = memoryview(block)
        while n := f.readinto(block):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return f"{size} {crc:08x}"


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SUM_SUFFIX)


def check(path: Path) -> str | None:
    """Why entry ``path`` cannot be trusted (no checksum, wrong size, wrong CRC), or None if it matches its
    sidecar. Reads the whole entry."""
    try:
        want = _sidecar(path).read_text().strip()
    except FileNotFoundError:
        return "has no checksum file"
    except (OSError, UnicodeDecodeError):
        return "has an unreadable checksum file"
    try:
        got = _digest(path)
    except FileNotFoundError:
        return "is missing"
    if got == want:
        return None
    parts = want.split()
    if len(parts) != 2 or not parts[0].isdigit():
        return "has a garbled checksum file"
    if got.split()[0] != parts[0]:
        return f"is {got.split()[0]} bytes, not {parts[0]} (truncated or overwritten)"
    return "does not match its checksum (its bytes were changed)"


def check_once(path: Path) -> str | None:
    """:func:`check`, once per process and entry: None (trusted) on later calls once an entry passed."""
    key_ = str(path)
    if key_ in _CHECKED:
        return None
    why = check(path)
    if why is None:
        _CHECKED.add(key_)
    return why


def discard(path: Path, why: str) -> None:
    """Remove a damaged entry (and its sidecar) so the caller builds it again, with a :class:`CacheWarning` naming
    it. Under the entry's lock, and only if it is still bad: another process may have rebuilt it meanwhile."""
    warn(f"{path}: cache entry {why}; rebuilding it", CacheWarning)
    try:
        with file_lock(str(path) + ".lock"):
            if check(path) is None:
                return
            for p in (path, _sidecar(path)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
    except OSError as e:
        raise cache_error(path, f"this cache entry is damaged ({why}) and cannot be removed ({e})",
                          first="delete the cache folder", to="another folder") from e
    _CHECKED.discard(str(path))


def ensure(path: Path, write: Callable[[str], None]) -> Path:
    """``build_once(path, write, checksum=True)``, then the entry checked against its checksum (once per process);
    a damaged entry is rebuilt once, with a warning.

    Raises:
        CacheError: the entry cannot be written, or is damaged again right after its rebuild (a failing disk).
    """
    build_once(path, write, checksum=True)
    why = check_once(path)
    if why is not None:
        discard(path, why)
        build_once(path, write, checksum=True)
        verify_rebuilt(path)
    return path


def verify_rebuilt(path: Path) -> None:
    """Check an entry just rebuilt after :func:`discard`; raises CacheError if it is bad again."""
    why = check_once(path)
    if why is not None:
        raise cache_error(path, f"this cache entry {why} even after it was rebuilt; the disk or the cache folder is "
                          "failing", first=None, to="another folder")


def build_once(path: Path, write: Callable[[str], None], *, checksum: bool = False) -> Path:
    """Return ``path``, calling ``write(tmp_path)`` first if it does not exist yet.

    ``write`` must create the file at ``tmp_path``; it is renamed to ``path`` only after ``write`` returns, so a
    crash leaves at most a stray temporary file that is never read. With ``checksum`` the sidecar (see
    :func:`check`) is written first, so a published entry always has one.
    """
    if path.exists():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(str(path) + ".lock"):  # DataLoader workers wait on each other's builds
            if path.exists():
                return path
            if checksum:  # the sidecar first, so a published entry always has one
                def write_both(tmp: str) -> None:
                    write(tmp)
                    atomic_write(_sidecar(path), _digest(tmp).encode())

                atomic_write(path, write_both)
                _CHECKED.add(str(path))  # just computed from these bytes
            else:
                atomic_write(path, write)
    except OSError as e:
        if isinstance(e, LeRobotSQLError):  # MissingFileError, RemoteIOError from the source: already ours
            raise
        raise cache_error(path, f"cannot write this cache entry ({e}); the cache folder is full or not writable") \
            from e
    return path


def atomic_write(path: str | os.PathLike, data: bytes | Callable[[str], None], *, private: bool = True) -> Path:
    """Write ``path`` whole or not at all: a reader sees the old file (or none) until the new one is complete.

    ``data`` is the file's bytes, or ``write(tmp_path)`` that writes the file at ``tmp_path``. Either goes to a
    temporary name in ``path``'s folder (``<name>.<random>.tmp``, hidden with a leading dot when not ``private``),
    which is renamed over ``path`` (``os.replace``, atomic on POSIX and Windows) once complete; on any failure the
    temporary file is removed and the error raised as it is (the caller names it: CacheError, DestinationError).

    Args:
        private: the temporary file is created exclusively with mode 0600 (cache entries stay the user's own):
            for bytes by descriptor (``_write_bytes_private``, the remote pieces' hot path), for ``write`` by
            ``mkstemp``, which ``write`` then overwrites. False leaves its creation to ``write`` (to ``open(.., "xb")`` for bytes), under
            the process umask, for a file the user shares (an exported manifest).

    Returns:
        ``path``, as a Path.
    """
    if private and not callable(data):
        _write_bytes_private(str(path), data)
        return Path(path)
    path = Path(path)
    if private:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        os.close(fd)
    else:
        tmp = str(path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"))
    try:
        if callable(data):
            data(tmp)
        else:
            with open(tmp, "wb" if private else "xb") as f:
                f.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


_TMP = itertools.count()


def _write_bytes_private(path: str, data: bytes) -> None:
    """:func:`atomic_write` of bytes, private, by descriptor: a cold remote epoch writes hundreds of small pieces,
    and mkstemp, a Python file object and Path objects cost ~3x the write itself. The temporary name is unique per
    process and thread (``<name>.<pid>-<thread>-<n>.tmp``), created with ``O_EXCL`` and mode 0600 as mkstemp's (a
    name taken by another host's process sharing the cache: the next number), removed on failure."""
    while True:
        tmp = f"{path}.{os.getpid()}-{threading.get_ident()}-{next(_TMP)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
            break
        except FileExistsError:
            continue
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def root_for(dataset_url: str) -> Path:
    """The cache folder of one dataset (by its URL or absolute path)."""
    return cache_root() / key(dataset_url)


DEFAULT_CACHE_SIZE = 50 << 30    # bound on a remote dataset's cached bytes: 50 GiB


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


# ---- the cache folders of datasets: what `lerobot-sql cache` lists and clears --------------------------------------
SOURCE_FILE = "source.json"  # in a dataset's cache folder: the URL it was made for (written at the first open)

# A dataset's cache folder holds one sub-folder per kind of entry, each written by one module (named here, where the
# folder's layout is known; ``lerobot-sql cache`` recognises a folder by them).
ROW_GROUPS = "row_groups"    # _readers.row_group_store: the row groups as decoded, a store file per data file
FOOTERS = "footers"          # _readers.tabular: the facts an open reads from each data file's footer
CHECKS = "checks"            # _catalog: the footer survey and the row groups' ranges, per version of the data files
VIDEO_INDEX = "video_index"  # _readers.video_index: an index per mp4
SELECTIONS = "selections"    # torch._selections: the runs of an opened selection, to reuse at the next open
MANIFESTS = "manifests"      # torch._samples: the per-sample files DataLoader workers map
QUALITY = "quality"          # _catalog.quality: the episode_quality view's per-episode facts
REMOTE = "remote"            # _storage.remote: the byte ranges fetched from a remote dataset
DUCKDB_TMP = "duckdb_tmp"    # DuckDB's spill folder (connect(temp_directory=...) moves it)
PARTS = (ROW_GROUPS, FOOTERS, CHECKS, VIDEO_INDEX, SELECTIONS, MANIFESTS, QUALITY, REMOTE, DUCKDB_TMP)


def is_dataset_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is one dataset's cache folder (it holds one of :data:`PARTS`): what a path given as
    ``connect(cache_dir=...)`` becomes."""
    return any((Path(folder) / part).is_dir() for part in PARTS)


def note_source(folder: Path, url: str) -> None:
    """Record in ``folder`` (a dataset's cache folder) the URL of the dataset it serves, once: what ``lerobot-sql
    cache`` names it by (the folder's own name is a hash of it). Only a folder :func:`root_for` made (a key under the
    cache root): one given as ``connect(cache_dir=...)`` is the caller's. A folder that cannot be written records
    nothing."""
    path = Path(folder) / SOURCE_FILE
    if not _is_key(Path(folder).name) or path.exists():
        return
    with contextlib.suppress(OSError, LeRobotSQLError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"url": url}).encode())


@dataclasses.dataclass(frozen=True)
class DatasetCache:
    """One dataset's cache folder.

    Attributes:
        folder: the folder (``<cache root>/<key>`` for the default, one per dataset URL).
        url: the dataset it serves (None: made before it was recorded, or not a dataset's folder).
        bytes: the space its files take on disk (allocated blocks: the row-group store's files are sparse).
        parts: bytes per top-level entry (``row_groups``, ``video_index``, ``checks``, ...).
        last_used: the newest modification time of its files (seconds since the epoch; 0 for an empty folder).
    """

    folder: Path
    url: str | None
    bytes: int
    parts: dict[str, int]
    last_used: float


def _is_key(name: str) -> bool:
    return len(name) == 24 and all(c in "0123456789abcdef" for c in name)


def dataset_caches(root: Path | None = None) -> list[DatasetCache]:
    """The dataset cache folders under ``root`` (default :func:`cache_root`), largest first: the folders named by a
    :func:`key` (what :func:`root_for` makes), never another one (a folder given as ``connect(cache_dir=...)`` is the
    caller's: it may hold more than caches). A folder that cannot be read is listed with what could be read."""
    root = Path(root) if root is not None else cache_root()
    out = []
    try:
        found = sorted(p for p in root.iterdir() if _is_key(p.name) and p.is_dir() and not p.is_symlink())
    except OSError:
        found = []
    for folder in found:
        url = None
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            url = json.loads((folder / SOURCE_FILE).read_text())["url"]
            url = url if isinstance(url, str) and url else None  # (null or "": no dataset recorded, not "None")
        parts, newest = {}, 0.0
        try:
            entries = list(folder.iterdir())
        except OSError:
            entries = []
        for entry in entries:
            size = 0
            for p in ([entry] if not entry.is_dir() or entry.is_symlink() else [entry, *entry.rglob("*")]):
                with contextlib.suppress(OSError):
                    st = p.lstat()
                    size += st.st_blocks * 512
                    newest = max(newest, st.st_mtime)
            parts[entry.name] = size
        out.append(DatasetCache(folder, url, sum(parts.values()), parts, newest))
    return sorted(out, key=lambda c: -c.bytes)


def clear(entry: DatasetCache) -> int:
    """Delete dataset cache folder ``entry``; returns the bytes it took. Everything in it is rebuilt from the
    dataset's own files when next needed; while a dataset of it is open, a ``spawn``/``forkserver`` DataLoader
    worker started afterwards cannot map its per-sample file (CacheError; docs/training.md).

    Raises:
        CacheError: the folder cannot be deleted (naming it).
    """
    import shutil

    try:
        shutil.rmtree(entry.folder)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise cache_error(entry.folder, f"this cache folder cannot be deleted ({e})",
                          first="delete it by hand (it holds only caches)", to="another folder") from e
    return entry.bytes
