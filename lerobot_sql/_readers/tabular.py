"""Tabular frame data: Parquet row groups decoded once into an Arrow IPC cache and read through memory maps.

Each (data file, row group) that a reader touches becomes, on first use, one uncompressed Arrow IPC file under the
cache, keyed by the data file's identity, with columns normalised to the shapes in info.json (``list<float>``
becomes ``fixed_size_list<float>[n]``). Whichever process reads first builds it (under a lock per entry); all
memory-map it: the OS page cache is shared, and no process holds a private copy of the table.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._format.layout import Layout
from .._storage import cache
from .._storage.source import Source
from ..errors import DatasetFormatError, LeRobotSQLError

CACHE_VERSION = 2  # 2: keyed by info.json's numeric features too; entries carry a checksum sidecar
_NUMERIC = {"float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32",
            "uint64", "bool"}


@dataclasses.dataclass(frozen=True)
class DataFileInfo:
    """Footer facts about one data file, gathered in the main process.

    Attributes:
        rel: path relative to the dataset root.
        identity: size-mtime-inode-ctime (local, see source.local_identity) or the remote ETag (part of the cache key).
        rg_offsets: int64 (n_row_groups + 1,): first row of each row group, then the total row count.
        schema: the file's Arrow schema (from the footer): its columns, in file order, are those of every cache file
            built from it.
        metadata: the parsed footer, reused when row groups are built later (saves re-reading and parsing it).
    """

    rel: str
    identity: str
    rg_offsets: np.ndarray
    schema: pa.Schema | None = dataclasses.field(default=None, compare=False)
    metadata: pq.FileMetaData | None = dataclasses.field(default=None, compare=False, repr=False)

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row group, row within it) for file rows."""
        return locate(self.rg_offsets, rows)

    def row_groups(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The row groups (sorted, int64) holding any of the file rows ``[starts[i], ends[i])``; empty spans hold
        none."""
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        keep = ends > starts
        last = len(self.rg_offsets) - 2
        a = np.clip(np.searchsorted(self.rg_offsets, starts[keep], side="right") - 1, 0, last)
        b = np.clip(np.searchsorted(self.rg_offsets, ends[keep] - 1, side="right") - 1, 0, last)
        spans = [np.arange(x, y + 1) for x, y in zip(a, b)]
        return np.unique(np.concatenate(spans)).astype(np.int64) if spans else np.zeros(0, np.int64)


def locate(rg_offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row group, row within it) for file rows, from a file's row-group offsets (:attr:`DataFileInfo.rg_offsets`,
    also known without its footer)."""
    rg = np.searchsorted(rg_offsets, rows, side="right") - 1
    return rg, rows - rg_offsets[rg]


_FOOTERS: dict[tuple[str, str, str], DataFileInfo] = {}  # (root, file, identity) -> info; a handful of entries


def data_file_info(src: Source, rel: str, keep: bool = True) -> DataFileInfo:
    """Row-group offsets and schema of a data file, from its footer alone (no page is read). Parsed once per process
    and file version (the manifest and the dataset both need it; a 10k-row-group footer is megabytes).
    ``keep=False``: the facts without the parsed footer (``metadata`` None), not kept for later calls (an open that
    needs only the offsets of thousands of row groups: each parsed footer is ~32 MB at 5,000 row groups)."""
    identity = src.identity(rel)
    key = (src.url, rel, identity)
    info = _FOOTERS.get(key)
    if info is None and not keep:
        with src.open(rel) as f:
            md = pq.read_metadata(f)
        counts = np.fromiter((md.row_group(i).num_rows for i in range(md.num_row_groups)), np.int64,
                             md.num_row_groups)
        return DataFileInfo(rel, identity, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                            md.schema.to_arrow_schema(), None)
    if info is None:
        with src.open(rel) as f:
            pf = pq.ParquetFile(f)
            md, schema = pf.metadata, pf.schema_arrow
        counts = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        info = DataFileInfo(rel, identity, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), schema, md)
        if len(_FOOTERS) >= 64:
            _FOOTERS.pop(next(iter(_FOOTERS)))
        _FOOTERS[key] = info
    return info


def release_freed_memory() -> None:
    """Hand memory freed by the C allocator back to the system (glibc's ``malloc_trim``; nothing elsewhere).
    Parsing thousands of row groups' footers leaves hundreds of megabytes freed but held in the allocator's
    fragmented arenas: the process's RSS would keep them."""
    global _TRIM
    if _TRIM is None:
        import ctypes
        import ctypes.util

        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM = None


def row_group_ranges(md: pq.FileMetaData, row_groups, columns=None) -> list[tuple[int, int]]:
    """Byte ranges [start, end) of the column chunks of ``row_groups`` (dictionary page included): one range per
    row group spanning its chunks, or with ``columns`` (top-level names) one per chunk of those columns only."""
    out = []
    keep = None if columns is None else [any(p == c or p.startswith(c + ".") for c in columns)
                                         for p in (md.schema.column(j).path for j in range(md.num_columns))]
    for rg in row_groups:
        g = md.row_group(int(rg))
        starts, ends = [], []
        for j in range(g.num_columns):
            if keep is not None and not keep[j]:
                continue
            c = g.column(j)
            start = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
            starts.append(start)
            ends.append(start + c.total_compressed_size)
        if keep is None:
            out.append((min(starts), max(ends)))
        else:
            out += list(zip(starts, ends))
    return out


def is_numeric(field: pa.Field, layout: Layout) -> bool:
    """True if :meth:`RowGroupView.column` gives a numpy array for this column of a data file's schema: numeric
    info.json features (normalised by ``_normalise``), and columns already stored as numbers or fixed-size lists.
    Lets a reader know each column's kind from the footer, before any row group is built."""
    feat = layout.features.get(field.name)
    if feat is not None and feat.dtype in _NUMERIC:
        return True
    t = field.type
    return (pa.types.is_fixed_size_list(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
            or pa.types.is_boolean(t))


def _flat_values(col, name: str, feat, where: str):
    """A list column's values flattened, checked against the feature's shape in info.json (``n`` values per row).

    Raises:
        DatasetFormatError: the column holds another number of values per row than the shape says.
    """
    n = int(np.prod(feat.shape))
    flat = col
    while pa.types.is_list(flat.type) or pa.types.is_large_list(flat.type) or pa.types.is_fixed_size_list(flat.type):
        flat = pc.list_flatten(flat)
    if len(flat) != n * len(col):
        raise DatasetFormatError(f"{where}: column {name!r} holds {len(flat)} values for {len(col)} rows, "
                                 f"but info.json gives shape {list(feat.shape)}; fix the feature's "
                                 "shape in meta/info.json (or rewrite the data files to that shape)")
    return flat


def check_shapes(table: pa.Table, layout: Layout, where: str) -> None:
    """Check every numeric list column of ``table`` (rows of data file ``where``) against its shape in info.json,
    as the readers do (export copies rows without normalising them, and must not write a dataset whose info.json
    disagrees with its data).

    Raises:
        DatasetFormatError: naming the file, the column and the shape.
    """
    for name in table.column_names:
        feat = layout.features.get(name)
        col = table[name]
        if feat is not None and feat.dtype in _NUMERIC and (
                pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type)):
            _flat_values(col.combine_chunks(), name, feat, where)


def _normalise(table: pa.Table, layout: Layout, where: str) -> pa.Table:
    cols = {}
    for name in table.column_names:
        col = table[name].combine_chunks()
        feat = layout.features.get(name)
        if feat is not None and feat.dtype in _NUMERIC:
            n = int(np.prod(feat.shape))
            typ = pa.from_numpy_dtype(np.dtype(feat.dtype))
            if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
                flat = _flat_values(col, name, feat, where)
                col = pa.FixedSizeListArray.from_arrays(flat.cast(typ), n)
            else:
                col = col.cast(typ)
        cols[name] = col
    return pa.table(cols)


def features_key(layout: Layout) -> str:
    """What of info.json decides an entry's decoded values: each numeric feature's name, dtype and shape (see
    ``_normalise``). Part of the cache key, so a corrected info.json is never masked by entries built under the old
    one."""
    sig = sorted((name, f.dtype, [int(x) for x in f.shape]) for name, f in layout.features.items()
                 if f.dtype in _NUMERIC)
    return cache.key(json.dumps(sig))


def row_group_folder(src: Source, info: DataFileInfo, cache_dir: Path, layout: Layout) -> Path:
    """The folder of a data file's row-group cache files: keyed by the file's identity and :func:`features_key`
    (two hashes: a caller asking for many row groups computes it once)."""
    return cache_dir / "tabular" / cache.key(src.url, info.rel, info.identity, features_key(layout), CACHE_VERSION)


def row_group_path(src: Source, info: DataFileInfo, rg: int, cache_dir: Path, layout: Layout,
                   folder: Path | None = None) -> Path:
    """Where the Arrow IPC cache file of row group ``rg`` of a data file lives (it may not exist yet), in
    :func:`row_group_folder` (``folder``, when the caller has it)."""
    return (folder or row_group_folder(src, info, cache_dir, layout)) / f"rg-{rg:05d}.arrow"


def ensure_row_groups(src: Source, info: DataFileInfo, rgs: list[int], layout: Layout, cache_dir: Path) -> list[Path]:
    """Build (once) and return the cache files of several row groups of one data file, opening it at most once.

    Each entry is checked against its checksum the first time this process uses it (:func:`cache.check_once`); a
    damaged one (truncated, emptied, garbled, bytes changed) is rebuilt once, with a ``CacheWarning`` naming it.

    Raises:
        MissingFileError: the data file is gone.
        DatasetFormatError: a column disagrees with the shape info.json gives it, or a local file changed since
            ``info`` was read (its row groups may have moved; a remote source pins the version it first saw).
        CacheError: an entry cannot be written, or is damaged again right after its rebuild.
    """
    folder = row_group_folder(src, info, cache_dir, layout)
    paths = [row_group_path(src, info, rg, cache_dir, layout, folder) for rg in rgs]
    missing, healed = [], []
    for rg, p in zip(rgs, paths):
        if not p.exists():
            missing.append((rg, p))
            continue
        why = cache.check_once(p)
        if why is not None:
            cache.discard(p, why)
            missing.append((rg, p))
            healed.append(p)
    if not missing:
        return paths
    if src.is_local and info.metadata is not None:
        now = src.identity(info.rel)  # a stat: the footer read earlier (maybe hours ago) must still describe the file
        if now != info.identity:
            raise DatasetFormatError(f"{src.path(info.rel)}: the file changed after the dataset was opened "
                                     f"(size-mtime-inode-ctime {info.identity} then, {now} now); open the dataset "
                                     "again (db.dataset(...)) to read the new version")
    try:
        # Readers build entries as their items need them, DataLoader workers concurrently: cache.build_once takes one
        # lock per row group (so they build different row groups, or fetch them remotely, at once) and publishes
        # each entry whole (temporary name, then rename).
        with src.open(info.rel) as f:
            pf = pq.ParquetFile(f, metadata=info.metadata)
            for rg, p in missing:
                cache.build_once(p, lambda tmp, rg=rg: _write(pf, rg, tmp, layout, src.path(info.rel)),
                                 checksum=True)
    except OSError as e:  # remote pieces are cache writes too
        if isinstance(e, LeRobotSQLError):  # MissingFileError / RemoteIOError / CacheError: already ours
            raise
        raise cache.cache_error(folder, f"cannot write the tabular cache ({e}); the cache folder is full or not "
                                "writable") from e
    for p in healed:
        cache.verify_rebuilt(p)
    return paths


def _write(pf: pq.ParquetFile, rg: int, tmp: str, layout: Layout, where: str) -> None:
    """Decode row group ``rg`` of ``pf``, normalise it and write it as Arrow IPC to ``tmp``."""
    try:
        # One thread: this runs in DataLoader workers forked from a parent whose Arrow thread pool was busy; one row
        # group gains nothing from threads, and a fork-inherited pool is a hazard.
        raw = pf.read_row_group(rg, use_threads=False)
    except LeRobotSQLError:  # already ours (e.g. the remote file changed): keep its own message
        raise
    except (pa.ArrowException, OSError) as e:  # a damaged page: name the file, not a bare pyarrow error
        raise DatasetFormatError(f"{where}: row group {rg} cannot be decoded ({e}); the file is corrupt, re-download "
                                 "it from the dataset's source") from e
    table = _normalise(raw, layout, where)
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)


class RowGroupView:
    """Zero-copy numpy views of one memory-mapped row group: vectors as (rows, *shape), scalars as (rows,)."""

    def __init__(self, path: Path, layout: Layout):
        self.table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
        self._arrays: dict[str, object] = {}
        self._layout = layout

    def column(self, name: str):
        """A numpy array (numbers), or the Arrow array (strings, image structs)."""
        if name not in self._arrays:
            col = self.table[name].combine_chunks() if self.table[name].num_chunks != 1 else self.table[name].chunk(0)
            feat = self._layout.features.get(name)
            if pa.types.is_fixed_size_list(col.type):
                shape = feat.shape if feat is not None else (col.type.list_size,)
                vals = col.flatten().to_numpy(zero_copy_only=False)
                arr = vals.reshape((len(col), *shape))
            elif pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
                arr = col.to_numpy(zero_copy_only=False)
            else:
                arr = col
            self._arrays[name] = arr
        return self._arrays[name]
