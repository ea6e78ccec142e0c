"""Parquet column-scan readahead: the byte ranges worth fetching ahead when a reader scans the same columns of
consecutive row groups of a remote Parquet file.

DuckDB reads each column chunk of a scan with its own request; without this a count over a 200-row-group file costs
200 sequential round trips. Two rules, both from the file's footer and only once the footer is cached (it is never
fetched for this):

* small columns whole: the first read of a column whose chunks over the whole file total at most ``SMALL_COLUMN``
  bytes (``index``, ``frame_index``, ``timestamp``, ``episode_index``: a few KB per row group) fetches every small
  column of every row group at once, in parallel. Opening a dataset scans exactly these columns several times (the
  query, the manifest's joins, the episode checks); one request per row group and column made a remote open
  ~180 sequential round trips on a 57-row-group file (3.5 s at 20 ms).
* a scan of larger columns (the same columns of consecutive row groups) fetches the next row groups' chunks ahead.

Knows Parquet's footer layout, not datasets.
"""

from __future__ import annotations

import io
import threading
from typing import Callable

COLUMN_READAHEAD = 4 << 20       # bytes a Parquet column scan fetches ahead per request (see ColumnReadahead.ranges)
SMALL_COLUMN = 256 << 10         # a column whose chunks total at most this over a file is fetched whole, with the
                                 # file's other small columns, at its first read: what a query pruning row groups
                                 # fetches beyond its own chunks is bounded by this per column and file

# cached(start, end) -> the bytes [start, end) of the file when they are all in the cache, else None
Cached = Callable[[int, int], "bytes | None"]


class ColumnReadahead:
    """Per-file footers and per-(file, columns) scan state of one filesystem's readers (threads included)."""

    def __init__(self):
        self._pq: dict[str, dict] = {}
        self._scans: dict[tuple, tuple[int, int]] = {}
        self.after_fork()

    def after_fork(self) -> None:
        """A new lock (a forked child must not wait on a lock a thread of its parent held)."""
        self._lock = threading.RLock()

    def chunks(self, path: str, size: int, cached: Cached) -> dict | None:
        """For a Parquet file whose footer is cached: ``{"by_start": {start: (row group, column)}, "chunks":
        chunks}`` with ``chunks[rg][col] = (start, end)`` per column chunk. None while the footer is not cached."""
        known = self._pq.get(path)
        if known is not None:
            return known
        tail = cached(size - 8, size) if size >= 12 else None
        if tail is None:
            return None
        n = int.from_bytes(tail[:4], "little")
        footer = cached(size - 8 - n, size) if tail[4:] == b"PAR1" and n + 8 <= size else None
        if footer is None:
            return None
        import pyarrow.parquet as pq

        try:
            md = pq.read_metadata(io.BytesIO(b"PAR1" + footer))
        except Exception:  # noqa: BLE001 - not our business to judge the file here; just no column readahead
            self._pq[path] = {"by_start": {}, "chunks": [], "small": frozenset(), "small_ranges": []}
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
        totals = [sum(row[j][1] - row[j][0] for row in chunks) for j in range(len(chunks[0]))] if chunks else []
        small = frozenset(j for j, t in enumerate(totals) if t <= SMALL_COLUMN)
        union: list[list[int]] = []
        for row in chunks:
            for j in sorted(small):
                a, b = row[j]
                if union and union[-1][1] == a:  # adjacent chunks (timestamp, frame_index, ...): one range
                    union[-1][1] = b
                else:
                    union.append([a, b])
        self._pq[path] = {"by_start": by_start, "chunks": chunks, "small": small,
                          "small_ranges": [(a, b) for a, b in union]}
        return self._pq[path]

    def ranges(self, path: str, start: int, end: int, size: int, cached: Cached) -> list[tuple[int, int]]:
        """Ranges worth fetching with a Parquet read ``[start, end)`` of ``path`` (``size`` bytes) that is the column
        chunks ``cols`` of row group ``rg``:

        * every ``cols`` small (see ``SMALL_COLUMN``): the small columns' chunks of every row group (adjacent
          chunks as one range; the caller fetches what of them is missing, so once per file while cached);
        * else, when the same columns of ``rg - 1`` or ``rg - 2`` were read just before (a scan): the same columns
          of the next ``k`` row groups (``k`` doubling 2, 4 ... 64 while the scan goes on, at most
          ``COLUMN_READAHEAD`` bytes). A query that skips row groups (a filter the statistics prune) never looks
          like a scan, so it fetches nothing extra of the larger columns."""
        if not path.endswith(".parquet"):
            return []
        pq_ = self.chunks(path, size, cached)
        hit = pq_ and pq_["by_start"].get(start)
        if not hit:
            return []
        rg, first = hit
        row = pq_["chunks"][rg]
        cols = tuple(j for j in range(first, len(row)) if row[j][0] >= start and row[j][1] <= end) or (first,)
        if all(j in pq_["small"] for j in cols):
            # Every reader missing a small chunk gets the whole union, not only the first: DuckDB's threads miss
            # at once, and the piece store's region locks then let one of them fetch it while the others wait and
            # find it cached (a reader told "in flight" fetched its own chunk before the union's fetch began).
            return pq_["small_ranges"]
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
