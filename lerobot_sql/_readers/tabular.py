"""Tabular frame data: Parquet row groups read straight from the data files and decoded in memory.

A reader asks for the row groups its items need (:func:`read_row_groups`): each is read from the data file (a local
file through Arrow's own reader; a remote one from the byte ranges the source has fetched into its cache) and
normalised to the shapes in info.json (``list<float>`` becomes ``fixed_size_list<float>[n]``). A process keeps the
row groups it read last (:class:`RowGroups`, bounded by bytes), so memory stays flat however many row groups a
dataset has; what it decoded also goes to the data file's row-group store (:mod:`.row_group_store`: one file per data
file, not a file per row group, which meant 100,000 files and memory maps for a DROID-sized dataset).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import _settings
from .._format.layout import Layout
from .._storage.source import Source
from ..errors import DatasetFormatError, LeRobotSQLError

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


def data_file_info(src: Source, rel: str, keep: bool = True, cache_dir: Path | None = None) -> DataFileInfo:
    """Row-group offsets and schema of a data file, from its footer alone (no page is read). Parsed once per process
    and file version (the manifest and the dataset both need it; a 10k-row-group footer is megabytes).
    ``keep=False``: the facts without the parsed footer (``metadata`` None), not kept for later calls (an open that
    needs only the offsets of thousands of row groups: each parsed footer is ~32 MB at 5,000 row groups); with
    ``cache_dir`` (the dataset's cache folder) those facts are kept there per file version
    (``footers/<key>.arrow``, a few bytes per row group), so that a later open parses no footer (35 ms each at
    5,000 row groups; a round trip remotely).

    Raises:
        CacheError: ``cache_dir`` cannot be written.
    """
    identity = src.identity(rel)
    key = (src.url, rel, identity)
    info = _FOOTERS.get(key)
    if info is None and not keep:
        if cache_dir is not None:
            return _kept_facts(src, rel, identity, Path(cache_dir))
        return _parse_facts(src, rel, identity)
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


def with_footer(src: Source, info: DataFileInfo) -> DataFileInfo:
    """``info`` with its parsed footer: the one this process keeps, else parsed now and not kept (a scan of every
    data file would otherwise keep ~32 MB per 5,000 row groups of each)."""
    if info.metadata is not None:
        return info
    kept = _FOOTERS.get((src.url, info.rel, info.identity))
    if kept is not None:
        return kept
    with src.open(info.rel) as f:
        md = pq.read_metadata(f)
    return dataclasses.replace(info, metadata=md)


def _parse_facts(src: Source, rel: str, identity: str) -> DataFileInfo:
    """:func:`data_file_info`'s ``keep=False`` facts, from the footer."""
    with src.open(rel) as f:
        md = pq.read_metadata(f)
    return _facts_of(md, rel, identity)


def _facts_of(md: pq.FileMetaData, rel: str, identity: str, rows: np.ndarray | None = None) -> DataFileInfo:
    """The ``keep=False`` facts of data file ``rel`` from its parsed footer ``md`` (``rows``: its row groups' row
    counts, when a pass over them has them already)."""
    counts = rows if rows is not None else \
        np.fromiter((md.row_group(i).num_rows for i in range(md.num_row_groups)), np.int64, md.num_row_groups)
    return DataFileInfo(rel, identity, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                        md.schema.to_arrow_schema(), None)


FACTS_VERSION = 1


def _facts_path(src: Source, rel: str, identity: str, cache_dir: Path) -> Path:
    from .._storage import cache

    return Path(cache_dir) / cache.FOOTERS / f"{cache.key(FACTS_VERSION, src.url, rel, identity)}.arrow"


def _write_facts(tmp: str, info: DataFileInfo) -> None:
    t = pa.table({"rg_offsets": pa.array(info.rg_offsets, pa.int64())},
                 metadata={b"rel": info.rel.encode(), b"identity": info.identity.encode(),
                           b"data_schema": info.schema.serialize().to_pybytes()})
    with pa.OSFile(tmp, "wb") as f, pa.ipc.new_file(f, t.schema) as w:
        w.write_table(t)


def keep_facts(src: Source, rel: str, identity: str, cache_dir: Path | None, md: pq.FileMetaData,
               rows: np.ndarray | None = None) -> None:
    """Keep data file ``rel``'s facts at ``identity`` in ``cache_dir`` as :func:`data_file_info` (``keep=False``)
    keeps them, from a footer parsed already (``md``; ``rows``: its row groups' row counts, if counted already): the
    connection's footer survey parses every footer once, and the first open of a selection then parses none again
    (0.85 s for the scale set's 20 footers). Best effort: a cache folder that cannot be written keeps nothing (the
    open parses them, as before)."""
    from .._storage import cache
    from ..errors import CacheError

    if cache_dir is None:
        return
    path = _facts_path(src, rel, identity, cache_dir)
    if path.exists():
        return
    with contextlib.suppress(CacheError, OSError):
        cache.ensure(path, lambda tmp: _write_facts(tmp, _facts_of(md, rel, identity, rows)))


def _kept_facts(src: Source, rel: str, identity: str, cache_dir: Path) -> DataFileInfo:
    """:func:`_parse_facts`, kept in ``cache_dir/footers`` under the file's version (its identity: a changed file
    is a new entry, never the old facts), checksummed like the other cache entries (a damaged entry is rebuilt)."""
    from .._storage import cache

    path = _facts_path(src, rel, identity, cache_dir)
    parsed: list[DataFileInfo] = []

    def write(tmp: str) -> None:
        info = _parse_facts(src, rel, identity)
        parsed.append(info)
        _write_facts(tmp, info)

    cache.ensure(path, write)
    if parsed:
        return parsed[0]
    try:
        t = pa.ipc.open_file(pa.OSFile(str(path), "rb")).read_all()
        meta = t.schema.metadata or {}
        if meta.get(b"rel") != rel.encode() or meta.get(b"identity") != identity.encode():
            raise ValueError("another file's facts")
        schema = pa.ipc.read_schema(pa.py_buffer(meta[b"data_schema"]))
        return DataFileInfo(rel, identity, t["rg_offsets"].to_numpy().astype(np.int64), schema, None)
    except (OSError, ValueError, KeyError, pa.ArrowException):  # unreadable despite its checksum: parse the footer
        return _parse_facts(src, rel, identity)


def release_freed_memory() -> None:
    """Hand memory freed by the C allocator back to the system (glibc's ``malloc_trim``; nothing elsewhere).
    Parsing thousands of row groups' footers leaves hundreds of megabytes freed but held in the allocator's
    fragmented arenas: the process's RSS would keep them."""
    global _TRIM
    if _TRIM is None:
        import ctypes

        try:
            # (the process's own symbols, where glibc's are: ctypes.util.find_library runs `ldconfig -p`, 0.2 s of
            # a first query's 2.2 s on the scale set)
            _TRIM = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError, TypeError):  # (no malloc_trim: musl, macOS; Windows takes no None)
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


def _is_list(t: pa.DataType) -> bool:
    """Whether ``t`` is a list type of any kind (variable, large or fixed-size): a vector feature's cells."""
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _flat_values(col, name: str, feat, where: str):
    """A list column's values flattened, checked against the feature's shape in info.json (``n`` values per row).

    Raises:
        DatasetFormatError: the column holds another number of values per row than the shape says.
    """
    n = int(np.prod(feat.shape))
    flat = col
    while _is_list(flat.type):
        flat = pc.list_flatten(flat)
    # (the total alone is not enough: rows of 5 and 7 values for a shape of 6 would be cut into rows of 6, each
    # then holding some of its neighbour's values)
    per_row = _values_per_row(col)
    odd = np.flatnonzero(per_row != n) if per_row is not None else ()
    if len(flat) != n * len(col) or len(odd):
        which = f"has {int(per_row[odd[0]])} values in row {int(odd[0])} (of those read)" if len(odd) else \
            f"holds {len(flat)} values for {len(col)} rows"
        raise DatasetFormatError(f"{where}: column {name!r} {which}, "
                                 f"but info.json gives shape {list(feat.shape)}; fix the feature's "
                                 "shape in meta/info.json (or rewrite the data files to that shape)")
    return flat


def _values_per_row(col) -> np.ndarray | None:
    """Leaf values in each row of a list column (any nesting; a NULL cell holds none), or None where every level is
    a fixed-size list (every row holds the same number, which the total checks)."""
    t, variable = col.type, False
    while _is_list(t):
        variable |= not pa.types.is_fixed_size_list(t)
        t = t.value_type
    if not variable:
        return None
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return np.bincount(_leaf_rows(col), minlength=len(col)).astype(np.int64)


def _leaf_rows(col: pa.Array) -> np.ndarray:
    """The row of ``col`` (a list column, any nesting) each of its leaf values belongs to, in flattened order (a
    NULL cell holds none)."""
    parents, flat = None, col
    while _is_list(flat.type):
        # (each leaf's row: its parent at each level, mapped up to the outer one)
        p = pc.list_parent_indices(flat).to_numpy(zero_copy_only=False)
        parents = p if parents is None else parents[p]
        flat = pc.list_flatten(flat)
    return parents


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
        if feat is not None and feat.dtype in _NUMERIC and _is_list(col.type):
            _flat_values(col.combine_chunks(), name, feat, where)


# The columns every item and manifest reads as integers: a NULL there has no value an item can carry (pyarrow would
# hand it over as a float NaN, and the row's index / frame_index as float64).
FRAME_INTEGERS = ("index", "episode_index", "frame_index", "task_index")


def check_frame_nulls(table: pa.Table, where: str) -> None:
    """Refuse a NULL in ``table``'s frame integer columns (:data:`FRAME_INTEGERS`) or ``timestamp`` (rows of
    ``where``: a data file, or one of its row groups).

    Raises:
        DatasetFormatError: naming the file, the column and the row (of ``table``).
    """
    names = set(table.column_names)
    for name in (*FRAME_INTEGERS, "timestamp"):
        if name in names and table[name].null_count:
            row = int(pc.index(pc.is_null(table[name]), True).as_py())
            kind = "a float32" if name == "timestamp" else "an int64"
            raise DatasetFormatError(f"{where}: column {name!r} is NULL (row {row} of those read); every frame has "
                                     f"a value there (lerobot's {name} is {kind}). Restore the file from the "
                                     "dataset's source (`lerobot-sql doctor` reads every row)")


def _check_feature_nulls(col: pa.Array, name: str, where: str) -> None:
    """Refuse a NULL in a numeric feature's column (a cell, or one element of a list cell): an item would carry it
    as NaN (a float), fail to convert (a bool), or a list would be short of the feature's shape (hostile review 10:
    lerobot gives None there, or raises; db.stats refuses such columns).

    Raises:
        DatasetFormatError: naming the file, the column and the row (of the rows read).
    """
    if not col.null_count and pa.types.is_fixed_size_list(col.type) and \
            not pa.types.is_nested(col.type.value_type) and not col.values.null_count:
        return  # (the usual cell: a fixed-size list of numbers without a NULL; no flatten needed)
    if col.null_count:
        what, row = "is NULL in row", int(pc.index(pc.is_null(col), True).as_py())
    else:
        flat = col
        while _is_list(flat.type):
            flat = flat.flatten()
        if not flat.null_count:
            return
        # (the leaf's own row: cells of other lengths than the shape's, refused after this check, would put it in
        # another row by a division)
        leaf = int(pc.index(pc.is_null(flat), True).as_py())
        what, row = "has a NULL element in row", int(_leaf_rows(col)[leaf])
    raise DatasetFormatError(f"{where}: column {name!r} {what} {row} (of those read); every value of a numeric "
                             "feature is a number (lerobot would carry None, or fail). Restore the file from the "
                             "dataset's source (`lerobot-sql doctor` reads every row)")


# File schemas already as info.json says, per layout: a row group of such a file needs its NULL checks only.
# id(layout) -> (the layout, kept alive so that its id is not reused; [(schema, its numeric list columns)]), a few
# entries per layout (one per file schema of a dataset), the last 64 layouts.
_NORMAL_SCHEMAS: dict[int, tuple[Layout, list[tuple[pa.Schema, list[int]]]]] = {}
_NORMAL_SCHEMAS_LOCK = threading.Lock()


def _new_schemas_lock() -> None:  # (a fork while an item thread held it: the child's copy would stay held)
    global _NORMAL_SCHEMAS_LOCK
    _NORMAL_SCHEMAS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_schemas_lock)


def _normalise(table: pa.Table, layout: Layout, where: str) -> pa.Table:
    batches = table.to_batches()  # (one, for a row group read: its columns without the chunked wrappers)
    arrays = batches[0].columns if len(batches) == 1 else table.columns
    if any(c.null_count for c in arrays):  # (the usual row group has none: one pass, no lookups by name)
        check_frame_nulls(table, where)
    else:
        # a known schema: only the list cells' elements can still hold a NULL (a random item's row group: the
        # per-column type checks below cost 0.1 ms of a 0.6 ms item)
        for schema, lists in _NORMAL_SCHEMAS.get(id(layout), (None, ()))[1]:
            if table.schema.equals(schema):
                for j in lists:
                    col = arrays[j]
                    if any(c.values.null_count for c in (col.chunks if len(batches) != 1 else [col])):
                        _check_feature_nulls(col if len(batches) == 1 else col.combine_chunks(),
                                             table.schema.names[j], where)
                return table
    cols, changed = {}, False
    for name, col in zip(table.column_names, table.columns):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        feat = layout.features.get(name)
        if feat is not None and feat.dtype in _NUMERIC:
            _check_feature_nulls(col, name, where)
            n, typ = _feature_type(feat)
            if col.type == typ or (n > 0 and pa.types.is_fixed_size_list(col.type) and col.type.list_size == n
                                   and col.type.value_type == typ):
                pass  # already as the feature says (lerobot writes it so; no NULL, checked above): nothing to convert
            elif _is_list(col.type):
                flat = _flat_values(col, name, feat, where)
                col, changed = pa.FixedSizeListArray.from_arrays(flat.cast(typ), n), True
            else:
                col, changed = col.cast(typ), True
        cols[name] = col
    if changed:
        return pa.table(cols)  # (a random item's row group: 0.05 ms of 0.3 rebuilding it)
    # (under a lock: item threads of two new layouts evicting at once both chose the oldest entry, and the second
    # pop was a bare KeyError; hostile review 22. Readers look up without it: a dict lookup and a list append are
    # each atomic)
    with _NORMAL_SCHEMAS_LOCK:
        if id(layout) not in _NORMAL_SCHEMAS and len(_NORMAL_SCHEMAS) >= 64:
            _NORMAL_SCHEMAS.pop(next(iter(_NORMAL_SCHEMAS)))  # (a process that opens many datasets: the oldest out)
        known = _NORMAL_SCHEMAS.setdefault(id(layout), (layout, []))[1]
        if len(known) < 8 and not any(table.schema.equals(k) for k, _ in known):
            lists = [j for j, (name, col) in enumerate(zip(table.column_names, table.columns))
                     if pa.types.is_fixed_size_list(col.type) and name in layout.features
                     and layout.features[name].dtype in _NUMERIC]
            known.append((table.schema, lists))
    return table


_FEATURE_TYPES: dict[tuple, tuple[int, pa.DataType]] = {}


def _feature_type(feat) -> tuple[int, pa.DataType]:
    """(elements, Arrow value type) of a numeric feature, per dtype and shape (computed once: every row group read
    asks)."""
    key = (feat.dtype, tuple(feat.shape))
    got = _FEATURE_TYPES.get(key)
    if got is None:
        n = int(np.prod(feat.shape))
        typ = pa.from_numpy_dtype(np.dtype(feat.dtype))
        got = _FEATURE_TYPES[key] = (n, typ)
    return got


def read_row_groups(src: Source, info: DataFileInfo, rgs: list[int], layout: Layout | None,
                    columns: list[str] | None = None, *, one_table: bool = False,
                    use_threads: bool = False, check_nulls: bool = True) -> list[pa.Table]:
    """Row groups ``rgs`` of data file ``info`` (``columns``, default all), each normalised to info.json's shapes
    (``layout``; None: as stored), in memory; the file opened once. A local file is read by Arrow's own reader (no
    Python file object: a third of the time); a remote one from the ranges fetched first in one parallel request.
    ``one_table``: the row groups back to back as one table (a list of it; a scan of thousands of row groups, where
    a call per row group costs more than its decoding); ``use_threads``: Arrow's thread pool decodes (the main
    process only: see the comment below); ``check_nulls`` False (``layout`` None only): a NULL in a frame column
    is read as it is (SQL shows it, as DuckDB's scan of the file does), not refused.

    Raises:
        MissingFileError: the data file is gone.
        DatasetFormatError: a row group cannot be decoded (a damaged page), a column disagrees with the shape
            info.json gives it, or a local file changed since ``info`` was read (its row groups may have moved; a
            remote source pins the version it first saw).
        RemoteIOError: the remote failed after retries.
    """
    out, where = _read_tables(src, info, rgs, columns, one_table, use_threads)
    names = [f"row groups {int(rgs[0])}..{int(rgs[-1])}"] if one_table else [f"row group {int(rg)}" for rg in rgs]
    if layout is None:
        if check_nulls:
            for name, t in zip(names, out):
                check_frame_nulls(t, f"{where} ({name})")
        return out
    return [_normalise(t, layout, f"{where} ({name})") for name, t in zip(names, out)]


def read_views(src: Source, info: DataFileInfo, rgs: list[int], layout: Layout) -> list["RowGroupView"]:
    """Row groups ``rgs`` of data file ``info``, every column, as :class:`RowGroupView` s of info.json's shapes
    (``layout``): what :func:`read_row_groups` reads, checked the same way. A row group of numbers only (lerobot's
    frame columns) becomes its numpy arrays in one pass (:func:`_numpy_columns`: a random item's first read of a row
    group, where :func:`_normalise` and the view's conversions cost as much as the decoding); any other goes
    through :func:`_normalise`.

    Raises:
        as :func:`read_row_groups`.
    """
    out, where = _read_tables(src, info, rgs, None, False, False)
    views = []
    for rg, t in zip(rgs, out):
        arrays = _numpy_columns(t, layout)
        views.append(RowGroupView.stored(arrays, layout, t.get_total_buffer_size()) if arrays is not None else
                     RowGroupView(_normalise(t, layout, f"{where} (row group {int(rg)})"), layout))
    return views


def _numpy_columns(table: pa.Table, layout: Layout) -> dict[str, np.ndarray] | None:
    """Every column of a row group as read (``table``, one record batch) as :meth:`RowGroupView.column` gives it
    (numpy; vectors (rows, *shape)), in file order, where each is already as info.json says: numbers of the
    feature's dtype, or lists of exactly the shape's values per row, without a NULL anywhere. None otherwise (a
    NULL, another dtype or length, strings, images: :func:`_normalise` converts or refuses them, naming the cell)."""
    batches = table.to_batches()
    if len(batches) != 1:
        return None
    feats, out = layout.features, {}
    for name, col in zip(table.schema.names, batches[0].columns):
        if col.null_count:
            return None
        typ = col.type
        kind = typ.id
        feat = feats.get(name)
        if feat is not None and feat.dtype not in _NUMERIC:
            return None
        if kind in _NUMBER_TYPES:
            if feat is not None and typ != _feature_type(feat)[1]:
                return None
            out[name] = col.to_numpy(zero_copy_only=False)
            continue
        if kind != _FIXED_SIZE_LIST and kind != _LIST and kind != _LARGE_LIST:
            return None
        vt = typ.value_type
        if vt.id not in _NUMBER_TYPES:
            return None
        rows = len(col)
        if feat is None:
            if kind != _FIXED_SIZE_LIST:
                return None
            n, shape = typ.list_size, (typ.list_size,)
        else:
            n, ftyp = _feature_type(feat)
            if vt != ftyp:
                return None
            shape = tuple(feat.shape)
        if kind == _FIXED_SIZE_LIST:
            if typ.list_size != n:
                return None
            start = col.offset * n
        else:
            offs = col.offsets.to_numpy()
            start = int(offs[0])
            if int(offs[-1]) - start != n * rows or (rows and not (offs[1:] - offs[:-1] == n).all()):
                return None
        vals = col.values.slice(start, n * rows)
        if vals.null_count:
            return None
        out[name] = vals.to_numpy(zero_copy_only=False).reshape((rows, *shape))
    return out


def _read_tables(src: Source, info: DataFileInfo, rgs: list[int], columns: list[str] | None, one_table: bool,
                 use_threads: bool) -> tuple[list[pa.Table], str]:
    """:func:`read_row_groups`' reading, before any check: (the tables as stored, the file's path for messages)."""
    where = src.path(info.rel)
    md = info.metadata
    if md is None:  # offsets only (data_file_info(keep=False)): parse the footer now
        info = data_file_info(src, info.rel)
        md = info.metadata
    local = check_unchanged(src, info)
    if local is None:
        src.fetch(info.rel, row_group_ranges(md, rgs, columns))
    out = []
    try:
        # One thread: this runs in DataLoader workers forked from a parent whose Arrow thread pool was busy; one row
        # group gains nothing from threads, and a fork-inherited pool is a hazard.
        if local is not None and one_table:
            # a scan (statistics, exports): a reader of its own, not kept. A kept one holds the footer it was given,
            # and a scan's footers are parsed afresh, not kept (~32 MB each at 5,000 row groups): kept per scan
            # thread, 20 files' footers stayed alive for each pass of db.stats
            with pq.ParquetFile(local, metadata=md, pre_buffer=False) as pf:
                out = [pf.read_row_groups([int(rg) for rg in rgs], columns=columns, use_threads=use_threads)]
        elif local is not None:
            pf = _reader(local, info.identity, md)
            # (every column: Arrow's reader straight, without the wrapper's column lookup, 10-20 us of a random
            # item's ~150 us read)
            out = [pf.reader.read_row_group(int(rg), use_threads=False) for rg in rgs] if columns is None else \
                [pf.read_row_group(int(rg), columns=columns, use_threads=False) for rg in rgs]
        else:
            with src.open(info.rel) as f:
                pf = pq.ParquetFile(f, metadata=md)
                out = [pf.read_row_groups([int(rg) for rg in rgs], columns=columns, use_threads=use_threads)] \
                    if one_table else [pf.read_row_group(int(rg), columns=columns, use_threads=False) for rg in rgs]
    except LeRobotSQLError:  # already ours (e.g. the remote file changed): keep its own message
        raise
    except FileNotFoundError:
        src.open(info.rel).close()  # MissingFileError naming it
        raise
    except (pa.ArrowException, OSError) as e:  # a damaged page: name the file, not a bare pyarrow error
        which = f"one of row groups {int(rgs[0])}..{int(rgs[-1])}" if one_table else \
            f"row group {rgs[len(out)] if len(out) < len(rgs) else rgs[-1]}"
        raise DatasetFormatError(f"{where}: {which} cannot be decoded ({e}); the file is corrupt, re-download it "
                                 "from the dataset's source") from e
    return out, where


def check_unchanged(src: Source, info: DataFileInfo) -> str | None:
    """The local path of data file ``info`` after checking (a stat) that it is still the version whose footer
    ``info`` holds (read maybe hours ago); None for a remote source (which pins the version it first saw).

    Raises:
        DatasetFormatError: the local file changed since (naming it and the fix).
    """
    if not src.is_local:
        return None
    now = src.identity(info.rel)
    if now != info.identity:
        raise DatasetFormatError(f"{src.path(info.rel)}: the file changed after the dataset was opened "
                                 f"(size-mtime-inode-ctime {info.identity} then, {now} now); open the dataset again "
                                 "(db.dataset(...)) to read the new version")
    return src.local_path(info.rel)


_READERS: "collections.OrderedDict[tuple, tuple[int, pq.ParquetFile]]" = collections.OrderedDict()
_MAX_READERS = 32  # open data files per process (a v2.1 dataset has one per episode: thousands)
_READERS_LOCK = threading.Lock()


def _reader(path: str, identity: str, md: pq.FileMetaData) -> pq.ParquetFile:
    """An open reader of local data file ``path`` at version ``identity``, kept per process and thread (opening one
    costs more than reading a small row group); the last :data:`_MAX_READERS` stay open. A fork gets its own, and so
    does each thread: one reader read from two threads at once crashed the process or failed ("ReadRangeCache did
    not find matching cache entry")."""
    key = (path, identity, threading.get_ident())
    with _READERS_LOCK:
        got = _READERS.get(key)
        if got is not None and got[0] == os.getpid():
            _READERS.move_to_end(key)
            return got[1]
    # pre_buffer off (pyarrow 26 turns it on): its coalescing read cache cost 0.4 of the 0.5 ms a random row group
    # of 238 rows took; a row group is a few contiguous kilobytes, read in one go either way (a buffered stream,
    # buffer_size=64 KiB, was 5% slower, interleaved on the scale set)
    pf = pq.ParquetFile(path, metadata=md, pre_buffer=False)
    with _READERS_LOCK:
        _READERS[key] = (os.getpid(), pf)
        _READERS.move_to_end(key)
        while len(_READERS) > _MAX_READERS:
            _READERS.popitem(last=False)
    return pf


_FIXED_SIZE_LIST = pa.list_(pa.int8(), 1).id
_LIST = pa.list_(pa.int8()).id
_LARGE_LIST = pa.large_list(pa.int8()).id
_NUMBER_TYPES = {pa.from_numpy_dtype(np.dtype(d)).id for d in
                 ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                  "float64", "bool")}


class RowGroupView:
    """Numpy views of one decoded row group (a table :func:`read_row_groups` gave): vectors as (rows, *shape),
    scalars as (rows,)."""

    def __init__(self, table: pa.Table, layout: Layout):
        self._table = table
        self.has_index = table.schema.get_field_index("index") >= 0  # (v2.x data may lack it: nothing to compare)
        batches = table.to_batches()  # (one, for a row group read: its arrays without the chunked wrappers)
        self._batch = batches[0] if len(batches) == 1 else None
        # (the buffers' sizes: nbytes walks every column's slices, 0.02 ms a row group; a table read from a file is
        # not a slice, so the two agree)
        self.nbytes = int(table.get_total_buffer_size())
        self._arrays: dict[str, object] = {}
        self._layout = layout

    @classmethod
    def stored(cls, arrays: dict[str, np.ndarray], layout: Layout, nbytes: int | None = None) -> "RowGroupView":
        """A view of a row group whose every column is already as :meth:`column` gives it: one the row-group store
        gave back (:mod:`lerobot_sql._readers.row_group_store`), or :func:`read_views` converted (``nbytes``: the
        bytes of the Arrow buffers its arrays keep alive; default the arrays' own)."""
        v = cls.__new__(cls)
        v._table, v._batch, v._layout = None, None, layout
        v.has_index = "index" in arrays
        v._arrays = dict(arrays)
        v.nbytes = sum(a.nbytes for a in arrays.values()) if nbytes is None else int(nbytes)
        return v

    @property
    def table(self) -> pa.Table:
        """The row group as an Arrow table (for a stored one: made from its arrays, vectors as fixed-size lists)."""
        if self._table is None:
            cols = {}
            for name, a in self._arrays.items():
                if a.ndim == 1:
                    cols[name] = pa.array(a)
                else:
                    n = int(np.prod(a.shape[1:], dtype=np.int64))
                    cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), n)
            self._table = pa.table(cols)
        return self._table

    def arrays(self) -> dict[str, object] | None:
        """Every column as :meth:`column` gives it, in file order (what the row-group store keeps); None, before any
        is converted, when a column is not numbers or fixed-size lists of numbers without a NULL cell (a column no
        item reads, such as one of a later data file only, is never converted: :meth:`column` may refuse it)."""
        if self._table is None:
            return dict(self._arrays)
        for col in (self._batch.columns if self._batch is not None else self._table.columns):
            typ = col.type
            if typ.id == _FIXED_SIZE_LIST:
                if col.null_count:
                    return None
                typ = typ.value_type
            if typ.id not in _NUMBER_TYPES:
                return None
        return {name: self.column(name) for name in self._table.column_names}

    def column(self, name: str):
        """A numpy array (numbers), or the Arrow array (strings, image structs)."""
        got = self._arrays.get(name)
        if got is not None:
            return got
        if self._batch is not None:
            col = self._batch.column(name)
        else:
            col = self.table.column(name)
            col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        feat = self._layout.features.get(name)
        kind = col.type.id
        if kind == _FIXED_SIZE_LIST:
            shape = feat.shape if feat is not None else (col.type.list_size,)
            n = col.type.list_size
            # the child's values of these rows: flatten() is a compute call (0.03 ms), the slice is the same
            # values when no cell is NULL (a NULL cell's slots hold no value: flatten() leaves them out)
            vals = col.flatten() if col.null_count else col.values.slice(col.offset * n, len(col) * n)
            vals = vals.to_numpy(zero_copy_only=False)
            arr = vals.reshape((len(col), *shape))
        elif kind in _NUMBER_TYPES:
            arr = col.to_numpy(zero_copy_only=False)
        else:
            arr = col
        self._arrays[name] = arr
        return arr


def row_group_budget() -> int:
    """Bytes of decoded row groups a process keeps (:class:`RowGroups`): ``$LSQL_ROW_GROUP_MB`` megabytes, default
    48 (about 1,500 row groups of 300 frames of a 14-float state and action; a set of up to ~500,000 such frames is
    kept whole). 48, not 64: a DataLoader worker shuffling the 30M-frame scale set holds 145 MB, not 168 (issue 38's
    150 MB), at the same samples/s: at that size a shuffled read hits a kept row group rarely either way.

    Raises:
        SettingError: the variable is not a finite number of megabytes > 0 (naming it).
    """
    return _settings.megabytes("LSQL_ROW_GROUP_MB", 48, "row groups a process keeps")


class RowGroups:
    """The row groups a process read last, by key (the dataset's slot), least recently used first out once their
    decoded bytes pass ``budget``; the one just put in always stays."""

    def __init__(self, budget: int | None = None):
        self.budget = row_group_budget() if budget is None else int(budget)
        self._views: "collections.OrderedDict[int, RowGroupView]" = collections.OrderedDict()
        self.nbytes = 0
        self._lock = threading.Lock()  # items read from several threads share a process's set

    def __contains__(self, key: int) -> bool:
        return key in self._views

    def get(self, key: int) -> RowGroupView | None:
        with self._lock:
            v = self._views.get(key)
            if v is not None:
                self._views.move_to_end(key)
            return v

    def put(self, key: int, view: RowGroupView) -> None:
        with self._lock:
            old = self._views.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._views[key] = view
            self.nbytes += view.nbytes
            while self.nbytes > self.budget and len(self._views) > 1:
                _, v = self._views.popitem(last=False)
                self.nbytes -= v.nbytes


