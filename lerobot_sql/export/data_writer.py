"""The Parquet data writer of an export: data/chunk-*/file-*.parquet.

Each part's source rows are read by row group (a few kept cached, at most ``MAX_OPEN_INPUTS`` source files open),
their ``index``/``episode_index``/``frame_index``/``timestamp``/``task_index`` rewritten for the new dataset, and
written as one row group per output episode, in the schema of the first source data file; a new file is started
when the next episode would take the current one past ``data_files_size_in_mb`` (estimated from the source file's
bytes per row).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._readers.tabular import check_shapes
from ..errors import DatasetFormatError
from .parts import MAX_OPEN_INPUTS, Part, Rotator
from .target import ExportSource, ExportTarget


class DataWriter:
    """Writes data/chunk-*/file-*.parquet, one row group per episode, rotating by data_files_size_in_mb."""

    def __init__(self, target: ExportTarget, sources: list[ExportSource]):
        self.target, self.sources = target, sources
        self.rot = Rotator(target.chunks_size)
        self.writer: pq.ParquetWriter | None = None
        self.fh = None
        self.schema: pa.Schema | None = None
        self.files = 0
        # keyed by (source, relative path): two datasets of a collection have files of the same name
        self._cache: dict[tuple[tuple[int, str], int], pa.Table] = {}
        self._pf: dict[tuple[int, str], tuple[pq.ParquetFile, np.ndarray, Any, float]] = {}

    def _source_rows(self, source: int, rel: str, row0: int, n: int) -> pa.Table:
        src = self.sources[source].src
        rel = (source, rel)
        if rel not in self._pf:
            if len(self._pf) >= MAX_OPEN_INPUTS:  # parts arrive in file order: the oldest is done with
                old = next(iter(self._pf))
                self._pf.pop(old)[2].close()
                self._cache = {k: v for k, v in self._cache.items() if k[0] != old}
            fh = src.open(rel[1])
            pf = pq.ParquetFile(fh)
            md = pf.metadata
            offs = np.concatenate([[0], np.cumsum([md.row_group(i).num_rows for i in range(md.num_row_groups)])])
            size = src.size(rel[1])
            self._pf[rel] = (pf, offs, fh, size / max(md.num_rows, 1))
        pf, offs, _, _ = self._pf[rel]
        first = int(np.searchsorted(offs, row0, side="right") - 1)
        last = int(np.searchsorted(offs, row0 + n - 1, side="right") - 1)
        parts = []
        for rg in range(first, last + 1):
            key = (rel, rg)
            if key not in self._cache:
                if len(self._cache) > 8:
                    self._cache.pop(next(iter(self._cache)))
                t = pf.read_row_group(rg, use_threads=False)  # one thread: see Source.open
                check_shapes(t, self.sources[source].layout, src.path(rel[1]))  # as dataset() would refuse
                self._cache[key] = t
            parts.append(self._cache[key])
        t = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        return t.slice(row0 - int(offs[first]), n)

    def write(self, part: Part, new_ep: int, next_index: int) -> pa.Table:
        """Write ``part`` as output episode ``new_ep`` whose first frame is dataset row ``next_index``; returns the
        rows written (the source's columns, renumbered, in the output schema).

        Raises:
            DatasetFormatError: the source rows are not the part's frames (the file changed since the query), or
                their schema cannot be cast to the first data file's.
        """
        fps = self.target.fps
        s = self.sources[part.source]
        k = part.stride  # (another frame rate: every k-th row of the span)
        t = self._source_rows(part.source, part.data_file, part.data_row, (part.length - 1) * k + 1)
        if k > 1:
            t = t.take(pa.array(np.arange(0, t.num_rows, k)))
        got_fi = t["frame_index"].to_numpy()
        if t.num_rows != part.length or got_fi[0] != part.frame_start or np.any(np.diff(got_fi) != k) or \
                np.any(t["episode_index"].to_numpy() != part.src_episode):
            raise DatasetFormatError(f"{s.src.path(part.data_file)}: rows {part.data_row}.."
                                     f"{part.data_row + (part.length - 1) * k} are not frames {part.frame_start}.. of "
                                     f"episode {part.src_episode}; the data file changed since the query ran, or is "
                                     "inconsistent (`lerobot-sql doctor`)")
        n = part.length
        ts = t["timestamp"].to_numpy().astype(np.float32)
        if s.align == "frame_index" or k > 1:  # frames copied by position, or at another rate: each row's time is
            # its frame's in the new video, as lerobot's recorder writes it (frame_index / fps, float32)
            ts = (np.arange(n) / fps).astype(np.float32)
        elif not part.whole:
            grid = (np.arange(part.frame_start, part.frame_start + n) / fps).astype(np.float32)
            # lerobot writes timestamp = frame_index / fps; keep that form when the source follows it.
            ts = (np.arange(n) / fps).astype(np.float32) if np.array_equal(ts, grid) else \
                (ts.astype(np.float64) - float(ts[0])).astype(np.float32)
        task = t["task_index"].to_numpy() if "task_index" in t.column_names else np.zeros(n, np.int64)
        new = {"index": np.arange(next_index, next_index + n, dtype=np.int64),
               "episode_index": np.full(n, new_ep, np.int64), "frame_index": np.arange(n, dtype=np.int64),
               "timestamp": ts, "task_index": s.task_map[task]}
        for name, values in new.items():
            if name in t.column_names:
                i = t.schema.get_field_index(name)
                t = t.set_column(i, t.schema.field(i), pa.array(values).cast(t.schema.field(i).type))
        if s.keys is not None:  # a collection's export: kept columns only, renamed
            keep = [(c, s.out(c)) for c in t.column_names if s.out(c) is not None]
            t = t.select([c for c, _ in keep]).rename_columns([o for _, o in keep])
            if self.schema is not None and set(self.schema.names) <= set(t.column_names):
                t = t.select(self.schema.names)  # the first source's column order
        self._rotate_if_needed(n, self._pf[(part.source, part.data_file)][3])
        if self.writer is None:
            self._open(t.schema)
        try:
            t = t.cast(self.schema) if t.schema != self.schema else t
        except (pa.ArrowInvalid, ValueError) as e:
            raise DatasetFormatError(f"{s.src.path(part.data_file)}: its schema differs from the first data file's "
                                     f"({e}); export one source data file layout at a time") from e
        self.writer.write_table(t, row_group_size=max(n, 1))
        self.rot.used = True
        return t

    def _rotate_if_needed(self, n: int, bytes_per_frame: float) -> None:
        if self.writer is not None and self.rot.used and self.fh.tell() + bytes_per_frame * n >= self.target.data_limit:
            self._close_file()
            self.rot.advance()
            self.rot.used = False

    def _open(self, schema: pa.Schema) -> None:
        rel = self.target.data_path.format(chunk_index=self.rot.chunk, file_index=self.rot.file)
        path = self.target.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self.schema = self.schema or schema
        self.fh = open(path, "wb")
        self.writer = pq.ParquetWriter(self.fh, self.schema, compression="snappy")
        self.files += 1

    def _close_file(self) -> None:
        # Forgotten before closing, and the file closed even if the footer write fails (a full disk): a writer left
        # open was closed by the garbage collector later, after the staging folder was gone (ResourceWarning).
        writer, fh, self.writer, self.fh = self.writer, self.fh, None, None
        if writer is not None:
            with ExitStack() as stack:
                stack.callback(fh.close)
                writer.close()

    def close(self) -> None:
        """Close the file being written and every source file; each is closed even if one before it fails (the
        first error is raised after)."""
        with ExitStack() as stack:
            for _, _, fh, _ in self._pf.values():
                stack.callback(fh.close)
            self._pf.clear()
            self._close_file()

