"""The piece store: fetched byte ranges of remote files, kept on disk as immutable pieces.

One folder per remote file version (named by the file's path and identity, so a changed remote file never serves
stale bytes), one file per piece, named ``<start>-<end>.piece`` (12-digit byte offsets, ``[start, end)``). Pieces
never cross a ``REGION`` (4 MiB) boundary; a file lock per (file, region) makes workers that want the same bytes
wait for one another instead of fetching them twice. A piece is written under a temporary name and renamed into
place, so an interrupted download leaves nothing that is ever read, and a restart re-fetches only the regions that
are still missing. The total size of the pieces is bounded by ``cache_size``; the least recently read pieces are
deleted first (read time = the piece's mtime).

Knows files and byte ranges only: what to fetch comes from the caller (:mod:`lerobot_sql._storage.remote`).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
from pathlib import Path
from typing import Any, Callable

from .cache import atomic_write, file_lock, key

REGION = 4 << 20                 # unit of locking; largest piece (bytes)
MERGE_GAP = 16 << 10             # ranges closer than this are fetched as one (fewer requests for a few KiB more)


def gaps(pieces: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of ``[lo, hi)`` that the sorted ``pieces`` (``[start, end)`` each) do not cover.

    Pieces never cross a region boundary, so none that starts before ``lo``'s region reaches it: the walk starts
    there (a bisection), not at the folder's first piece (hundreds after an epoch, ~40 us per call)."""
    out, pos = [], lo
    for i in range(bisect.bisect_left(pieces, (lo - lo % REGION, -1)), len(pieces)):
        a, b = pieces[i]
        if a >= hi:
            break
        if b <= pos:
            continue
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    if pos < hi:
        out.append((pos, hi))
    return out


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


def _bridge(spans: list[tuple[int, int]], pieces: list[tuple[int, int]], gap: int = MERGE_GAP) -> list[tuple[int, int]]:
    """Sorted disjoint gaps to fetch, with two that are less than ``gap`` apart within one region, with only cached
    bytes (``pieces``) between them, fetched as one span: those few cached bytes come again (a new piece
    overlapping the old ones; readers take either). Bytes no one asked for are never bridged.

    Why: a data file's pieces are scattered small column chunks DuckDB read for the query (the ``index`` column
    of every row group), so the bytes a pipelined epoch needs around them were one request per gap: 54 of ~105
    requests per 4,096 multifile60 items, for 0.77 MB, each ~1 ms of a worker's CPU."""
    out: list[list[int]] = []
    for a, b in spans:
        if out and a - out[-1][1] < gap and a // REGION == (b - 1) // REGION == out[-1][0] // REGION \
                and not gaps(pieces, out[-1][1], a):
            out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _name(a: int, b: int) -> str:
    return f"{a:012d}-{b:012d}.piece"


def _piece(fdir: Path, a: int, b: int) -> str:
    return f"{fdir}/{_name(a, b)}"  # a str, not a Path: built for every piece written and read


def _mtime(d: str) -> int | None:
    try:
        return os.stat(d).st_mtime_ns
    except FileNotFoundError:
        return None


class PieceStore:
    """The pieces under ``dir`` (one folder per remote file version), bounded by ``cache_size`` bytes.

    Shared by the processes reading one dataset (file locks); the piece lists seen by this process are remembered
    and re-read from disk whenever a read finds a gap and the folder changed since.

    Costs that grow with an epoch are kept off the per-request path: a folder holds one piece per GOP run fetched
    (hundreds after a long epoch), and parsing every name on every listing cost ~1 us per piece (0.38 ms per request
    at 400), so a listing parses only the names it has not seen (:meth:`scan`); and this process's own writes keep
    the folder's remembered mtime current (:meth:`write`), so they do not make the next :meth:`missing` list it again.
    """

    def __init__(self, dir: str | os.PathLike, cache_size: int):
        self.dir, self.cache_size = Path(dir), int(cache_size)
        self._pieces: dict[str, list[tuple[int, int]]] = {}
        self._names: dict[str, dict[str, tuple[int, int]]] = {}  # folder -> {piece file name: (start, end)}
        self._listed: dict[str, int | None] = {}  # folder -> its mtime (ns) when last listed (None: absent)
        self._total: int | None = None
        self.after_fork()

    def after_fork(self) -> None:
        """New locks (a forked child must not wait on a lock a thread of its parent held)."""
        self._lock = threading.RLock()
        self._region_locks: dict[tuple[str, int], threading.Lock] = {}

    def folder(self, path: str, identity: str) -> Path:
        """The folder of the pieces of ``path`` at the version ``identity``."""
        return self.dir / key(path, identity)

    def scan(self, fdir: Path) -> list[tuple[int, int]]:
        """The pieces of ``fdir`` on disk now, sorted (remembered for :meth:`missing`)."""
        d = str(fdir)
        mtime = _mtime(d)  # before listing: a piece renamed in after it changes the folder's mtime again
        names: list[str] = []
        with contextlib.suppress(FileNotFoundError):
            names = os.listdir(d)
        cur = set(names)
        with self._lock:
            known = self._names.get(d, {})
            # set operations, not a loop over the names: a folder of 400 pieces lists in ~0.15 ms, a loop would
            # double it. Only the new names are parsed.
            added = [n for n in cur.difference(known) if n.endswith(".piece")]
            removed = known.keys() - cur
            if added or removed or d not in self._pieces:
                now = {n: ab for n, ab in known.items() if n not in removed} if removed else dict(known)
                for name in added:
                    a, b = name[:-6].split("-")
                    now[name] = (int(a), int(b))
                self._names[d] = now
                self._pieces[d] = sorted(now.values())
            self._listed[d] = mtime
            return self._pieces[d]

    def missing(self, fdir: Path, start: int, end: int) -> list[tuple[int, int]]:
        """Byte ranges of ``[start, end)`` not in ``fdir`` (as this process last saw it, re-read on a gap when the
        folder changed since).

        A gap is re-checked with one stat of the folder, not a listing of it: a pipeline asks about every range
        of its next batches, most of them not fetched yet. A piece another process renamed in within the same
        mtime tick can be missed; the caller then fetches through :meth:`fill`, which lists the folder again under
        the region lock and fetches nothing that is there.
        """
        d = str(fdir)
        pieces = self._pieces.get(d)
        if pieces is not None:
            out = gaps(pieces, start, end)
            if not out or _mtime(d) == self._listed.get(d, -1):
                return out
        return gaps(self.scan(fdir), start, end)

    def _region_lock(self, fdir: Path, r: int) -> threading.Lock:
        """Threads of this process queue on a plain lock first: one descriptor's flock per region and process."""
        with self._lock:
            return self._region_locks.setdefault((str(fdir), r), threading.Lock())

    def fill(self, fdir: Path, ranges: list[tuple[int, int]],
             fetch_all: Callable[[list[tuple[int, int]]], list[tuple[Any, Any]]]) -> int:
        """Fetch and store what of ``ranges`` is missing from ``fdir``; returns the bytes fetched.

        :meth:`fill_many` for one folder: ``fetch_all(gaps)`` gets its ``[start, end)`` gaps and returns
        ``(data, None)`` or ``(None, exception)`` per gap."""
        return self.fill_many([(fdir, ranges)], lambda gaps: fetch_all([(a, b) for _, a, b in gaps]))

    def fill_many(self, jobs: list[tuple[Path, list[tuple[int, int]]]],
                  fetch_all: Callable[[list[tuple[int, int, int]]], list[tuple[Any, Any]]]) -> int:
        """Fetch and store what of each job's ``(fdir, ranges)`` is missing, in one call of ``fetch_all`` (one
        network round for every gap of every file); returns the bytes fetched.

        Under the locks of every region the ranges touch (taken in one global order, folder then region, as every
        caller takes them: no two callers can deadlock), the gaps are computed again (another worker may have
        fetched them), split at region boundaries, and handed to ``fetch_all(gaps)`` as ``(job, start, end)``
        (``job``: the index in ``jobs``), which returns ``(data, None)`` or ``(None, exception)`` per gap. The
        pieces that arrived are stored, the cache is evicted down to its bound, then the first failure is raised
        (nothing partial is left in the cache).
        """
        for fdir, _ in jobs:
            os.makedirs(fdir, exist_ok=True)
        locks = sorted({(str(fdir), r) for fdir, ranges in jobs for a, b in ranges
                        for r in range(a // REGION, (b - 1) // REGION + 1)})
        with contextlib.ExitStack() as stack:
            for d, r in locks:
                stack.enter_context(self._region_lock(Path(d), r))
                stack.enter_context(file_lock(f"{d}/r{r:07d}.lock"))
            todo: list[tuple[int, int, int]] = []
            for j, (fdir, ranges) in enumerate(jobs):
                # Another process may have fetched them since this one looked: listed again when the folder
                # changed since (a listing of hundreds of pieces is ~0.2 ms, most of a request's own CPU). A piece
                # renamed in within the same mtime tick as this process's last look is fetched again: bytes, never
                # wrong data.
                d = str(fdir)
                pieces = self._pieces.get(d)
                if pieces is None or _mtime(d) != self._listed.get(d, -1):
                    pieces = self.scan(fdir)
                want: set[tuple[int, int]] = set()
                for a, b in ranges:
                    for r in range(a // REGION, (b - 1) // REGION + 1):  # pieces never cross a region boundary
                        want.update(gaps(pieces, max(a, r * REGION), min(b, (r + 1) * REGION)))
                todo.extend((j, a, b) for a, b in _bridge(_disjoint(sorted(want)), pieces))
            written: set[str] = set()
            fetched, error = 0, None
            for (j, a, b), (data, err) in zip(todo, fetch_all(todo) if todo else []):
                if err is not None:
                    error = error or err
                    continue
                fdir = jobs[j][0]
                self.write(fdir, a, b, data)
                written.add(_piece(fdir, a, b))
                fetched += len(data)
        self.evict(protect=written)
        if error is not None:
            raise error
        return fetched

    def write(self, fdir: Path, a: int, b: int, data: bytes) -> None:
        """Store bytes ``[a, b)`` as one piece (temporary name, then renamed into place).

        When the folder had not changed since this process last listed it (its mtime before the write is the one
        remembered), the mtime after the write is remembered instead: the folder is then the list known plus this
        piece. Another process's piece renamed in between the two stats is missed until the folder changes again;
        a read wanting it then goes to :meth:`fill`, which lists the folder under the region lock and fetches
        nothing that is there.
        """
        d, name = str(fdir), _name(a, b)
        before = _mtime(d)  # before the temporary file: creating it changes the mtime too
        atomic_write(f"{d}/{name}", data)
        after = _mtime(d)
        with self._lock:
            names = self._names.setdefault(d, {})
            if name not in names:
                names[name] = (a, b)
                lst = list(self._pieces.get(d, ()))  # a new list: another thread may be iterating the old one
                bisect.insort(lst, (a, b))
                self._pieces[d] = lst
            if before is not None and before == self._listed.get(d, -1):
                self._listed[d] = after
            if self._total is not None:
                self._total += len(data)

    def store_whole(self, fdir: Path, data: bytes) -> None:
        """Keep a whole file as region pieces (never re-fetched while cached); pieces already there are kept."""
        fdir.mkdir(parents=True, exist_ok=True)
        have = self.scan(fdir)
        for r in range((len(data) + REGION - 1) // REGION):
            a, b = r * REGION, min(len(data), (r + 1) * REGION)
            if gaps(have, a, b):
                self.write(fdir, a, b, data[a:b])

    def assemble(self, fdir: Path, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` from the pieces of ``fdir`` (``path``: the remote file, for the message); each
        piece read is touched (LRU).

        Raises:
            FileNotFoundError: a piece is missing or short (evicted by another process since it was listed).
        """
        out = bytearray()
        pos = start
        d = str(fdir)
        for a, b in self._pieces.get(d, []):
            if b <= pos or a > pos:
                if a > pos:
                    break
                continue
            p = f"{d}/{a:012d}-{b:012d}.piece"
            n = min(b, end) - pos
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # no Python file object per piece read
            try:
                chunk = os.pread(fd, n, pos - a)
                if len(chunk) != n:
                    raise FileNotFoundError(p)
                with contextlib.suppress(OSError):
                    os.utime(fd if os.utime in os.supports_fd else p)  # LRU: the mtime of a piece is its last read
            finally:
                os.close(fd)
            out += chunk
            pos += n
            if pos >= end:
                break
        if pos < end:
            raise FileNotFoundError(f"{path}: bytes {pos}-{end}")
        return bytes(out)

    def evict(self, protect: set[str] = frozenset()) -> None:
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
                        if lst is not None and (int(a), int(b)) in lst:  # a new list, as in write()
                            self._pieces[d] = [p for p in lst if p != (int(a), int(b))]
                        self._names.get(d, {}).pop(name, None)
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
