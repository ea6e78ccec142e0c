"""Parquet column-scan readahead: the byte ranges worth fetching ahead when a reader scans the same columns of
consecutive row groups of a remote Parquet file.

DuckDB reads each column chunk of a scan with its own request; without this a count over a 200-row-group file costs
200 sequential round trips. The scan is recognised from the file's footer, and only when the footer is already
cached (it is never fetched for this). Knows Parquet's footer layout, not datasets.
"""

from __future__ import annotations

import io
import threading
from typing import Callable

COLUMN_READAHEAD = 4 << 20       # bytes a Parquet column scan fetches ahead per request (see ColumnReadahead.ranges)

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

    def ranges(self, path: str, start: int, end: int, size: int, cached: Cached) -> list[tuple[int, int]]:
        """Ranges worth fetching with a Parquet read ``[start, end)`` of ``path`` (``size`` bytes): when it is the
        column chunks ``cols`` of row group ``rg`` and the same columns of ``rg - 1`` or ``rg - 2`` were read just
        before (a scan), the same columns of the next ``k`` row groups (``k`` doubling 2, 4 ... 64 while the scan
        goes on, at most ``COLUMN_READAHEAD`` bytes). A query that skips row groups (a filter the statistics prune)
        never looks like a scan, so it fetches nothing extra."""
        if not path.endswith(".parquet"):
            return []
        pq_ = self.chunks(path, size, cached)
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
