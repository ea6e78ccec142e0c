"""A query's part of ``frames``: the row groups whose statistics meet its bounds (:mod:`lerobot_sql._query.narrowing`),
read with pyarrow and put in the place of the view for that query.

Why: over ``read_parquet`` of every data file, DuckDB weighs every row group's statistics at each query, ~12-23 us
each: one episode's frames took 1.3-2.1 s at 100,000 row groups, whatever the one row group it then read. Here the
``episode_index`` / ``index`` range of every row group (from the footers, once per version of the data files, kept in
the dataset's cache folder) is compared with the bounds in numpy, and only the row groups that may hold a kept row are
read. The view's own SELECT (:class:`FramesPlan`, from :func:`lerobot_sql._catalog.views.frames`) then runs over
them, and the query's WHERE over that, so the rows, their order and their types are the view's.

A manifest's joins read a part of ``_frames_loc`` the same way (:meth:`Parts.loc_sql`): the row groups of the
result's frames or episodes, their default columns only.

A read this cannot serve as the view would gives None, and the query runs over the whole view as before: a
collection, data files of several schemas or a damaged one, a bound column the data files lack, a column DuckDB
cannot scan from Arrow (float16, decimal256), a CTE of the query named like a relation the view's SELECT reads, fewer
than :data:`MIN_ROW_GROUPS` row groups in all, or more than half of them, :data:`MAX_ROWS` rows or
:data:`MAX_BYTES` bytes to read, where DuckDB's parallel scan is the better reader.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import re
import threading
import weakref
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from .._query.narrowing import COLUMNS, tables_read
from .._query.sqltext import ident, sql_key
from .._readers import tabular
from .._storage import cache
from .._storage.source import Source
from ..errors import CacheError

# The most rows (and decoded bytes, by the footers' uncompressed sizes) a query's part may read: above, DuckDB's
# parallel scan of the view does it. A part decodes every column, DuckDB only those a query reads: on the scale set
# `count(*) ... WHERE episode_index < N` took 1.1 s as a part and 2.5 s over the view at 1.2M rows, 2.6 s and 1.9 s
# at 1.95M (a new user's trial, 2 cores).
MAX_ROWS = 1_000_000
MAX_BYTES = 256 << 20
# Data files of fewer row groups are read whole as before: DuckDB weighs ~12-23 us per row group, a part costs
# ~1.5 ms to read and register (multifile60's 58 row groups: a bounded query 4.1-4.6 ms over the view, 5.9 ms as a
# part), so a part pays from a few hundred row groups on.
MIN_ROW_GROUPS = 256
_LOC_COLUMNS = {"index", "episode_index", "frame_index", "timestamp", "task_index"}
_INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"}
# a DuckDB list or array type of numbers: the one kind of column whose type pyarrow and read_parquet may spell apart
# (a fixed-size list: FLOAT[6] from the Arrow schema pyarrow keeps in the file, FLOAT[] from DuckDB's reader)
_NUMBER_LIST = re.compile(r"(?:TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|UTINYINT|USMALLINT|UINTEGER|UBIGINT|FLOAT|"
                          r"DOUBLE|BOOLEAN)(?:\[\d*\])+")


@dataclasses.dataclass(frozen=True)
class FramesPlan:
    """How the ``frames`` view is made from the data files' rows (what a part of it needs).

    Attributes:
        src, data_files: the dataset and the data files the view reads, in its order.
        columns: the data files' columns as ``read_parquet`` gives them (name -> DuckDB type), in file order.
        select: the view's select list over the rows.
        derived: the derived columns' expressions over row ``d`` (``expr AS name, ...``), or None.
        cache_dir: the dataset's cache folder (the row groups' ranges are kept there per version of the files).
    """

    src: Source
    data_files: tuple[str, ...]
    columns: dict[str, str]
    select: str
    derived: str | None
    cache_dir: Path | None
    # the name of the data file column _frames_loc's rows carry (not a data column's name)
    file_column: str = "_lsql_data_file"

    def rows(self, source: str) -> str:
        """``source`` (a FROM item giving the data files' columns) with the derived columns after them."""
        if self.derived is None:
            return source
        return f"(SELECT d.*, {self.derived} FROM {source} d) AS _lsql_rows"

    def body(self, source: str) -> str:
        """The frames view's SELECT over ``source``, a FROM item that gives the data files' columns."""
        return f"SELECT {self.select} FROM {self.rows(source)}"

    def loc_body(self, source: str, data_file: str) -> str:
        """The ``_frames_loc`` view's SELECT over ``source`` (the data files' columns, the data file's path column
        and ``file_row_number``): each frame's ``index, episode_index, frame_index, timestamp, task_index`` and
        where it is: ``data_file`` (the path relative to the root: ``data_file``, an SQL expression over the path
        column) and ``row`` (in the file)."""
        return (f"SELECT index, episode_index, frame_index, timestamp, task_index, {data_file} AS data_file, "
                f"file_row_number AS row FROM {self.rows(source)}")


@dataclasses.dataclass(frozen=True)
class _Ranges:
    """Every row group of the data files (in the view's file order): its file, its number in the file, its rows and
    decoded bytes, and per narrowing column its statistics' [lo, hi] (``known`` False: none; it may hold any)."""

    file: np.ndarray
    rg: np.ndarray
    rows: np.ndarray
    nbytes: np.ndarray
    lo: dict[str, np.ndarray]
    hi: dict[str, np.ndarray]
    known: dict[str, np.ndarray]
    schema: pa.Schema


_RANGES: "collections.OrderedDict[tuple, _Ranges]" = collections.OrderedDict()
_RANGES_LOCK = threading.Lock()
_RANGES_VERSION = 2  # 2: a bound column's statistics are those of the first column of its name in any ASCII case


def file_ranges(md, f: int, out: dict) -> None:
    """Append data file ``f``'s row groups (parsed footer ``md``) to ``out``'s lists of :class:`_Ranges` arrays."""
    paths = [md.schema.column(j).path for j in range(md.num_columns)]
    n = md.num_row_groups
    out["data_file"].append(np.full(n, f, np.int32))
    out["rg"].append(np.arange(n, dtype=np.int32))
    rows, nbytes = np.empty(n, np.int64), np.empty(n, np.int64)
    # DuckDB names columns ignoring ASCII case: of "Index" and "index" the first is the view's index (the other
    # index_1), so its statistics are the ones to judge by (a dotless path is a top-level column's own)
    found = {c: next((j for j, p in enumerate(paths) if sql_key(p) == c), None) for c in COLUMNS}
    lo = {c: np.zeros(n, np.int64) for c in COLUMNS}
    hi = {c: np.zeros(n, np.int64) for c in COLUMNS}
    known = {c: np.zeros(n, bool) for c in COLUMNS}
    # (a plain INT64 / INT32 column's statistics are its values as stored: min_raw is min without the logical
    # type's conversion, half the cost at 5,000 row groups a file; any other type through min, as Arrow converts it)
    cols = [(c, j, md.schema.column(j).physical_type in ("INT64", "INT32")
             and md.schema.column(j).logical_type.type == "NONE") for c, j in found.items() if j is not None]
    for i in range(n):  # (one RowGroupMetaData per row group: making it is most of the cost, ~2 us)
        g = md.row_group(i)
        rows[i], nbytes[i] = g.num_rows, g.total_byte_size
        for c, j, plain in cols:
            st = g.column(j).statistics
            # (a row group without integer statistics may hold any value: read whenever the column is bounded)
            if st is None or not st.has_min_max:
                continue
            a, b = (st.min_raw, st.max_raw) if plain else (st.min, st.max)
            if type(a) is int and type(b) is int and -2**63 <= a <= b < 2**63:
                lo[c][i], hi[c][i], known[c][i] = a, b, True
    out["rows"].append(rows)
    out["nbytes"].append(nbytes)
    for c in COLUMNS:
        out[f"lo/{c}"].append(lo[c])
        out[f"hi/{c}"].append(hi[c])
        out[f"known/{c}"].append(known[c])


def ranges_arrays(src: Source, files, identities, each=None) -> dict[str, np.ndarray]:
    """The arrays of :class:`_Ranges` (and ``schema``: the first file's Arrow schema, serialized) from the footers
    of data files ``files`` at ``identities``, each parsed once and let go; ``each(f, md, rows)`` is called with
    every parsed footer and its row groups' row counts (the connection's footer survey reads them in the same
    pass)."""
    out: dict[str, list] = collections.defaultdict(list)
    schema = None
    for f, (rel, identity) in enumerate(zip(files, identities)):
        md = _footer(src, rel, identity, keep=False).metadata
        if schema is None:
            schema = md.schema.to_arrow_schema()
        file_ranges(md, f, out)
        if each is not None:
            each(f, md, out["rows"][-1])
        del md
    got = {name: np.concatenate(parts) for name, parts in out.items()}
    got["schema"] = np.frombuffer(schema.serialize().to_pybytes(), np.uint8)
    return got


def keep_ranges(src: Source, files, identities, cache_dir: Path | None, arrays: dict | None = None) -> dict:
    """The row groups' ranges of ``files`` at ``identities`` as :func:`ranges_arrays` gives them: ``arrays`` if
    given (just computed), else kept ones, else computed now; kept in ``cache_dir`` (checksummed) so that a later
    process parses no footer. A cache folder that cannot be written keeps nothing (read in memory)."""
    k = cache.key(_RANGES_VERSION, src.url, *itertools.chain.from_iterable(zip(files, identities)))

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **(arrays if arrays is not None else ranges_arrays(src, files, identities)))

    if cache_dir is not None:
        try:
            return dict(np.load(cache.ensure(Path(cache_dir) / cache.CHECKS / f"rowgroup-ranges-{k}.npz", write),
                                allow_pickle=False))
        except CacheError:
            pass  # a full or read-only cache folder: read in memory (the whole view's reading needs none either)
    return arrays if arrays is not None else ranges_arrays(src, files, identities)


def _ranges(plan: FramesPlan, identities: tuple[str, ...]) -> _Ranges:
    """The row groups' ranges of the data files at ``identities``: kept per process, and in the dataset's cache
    folder (the footer survey of the connection's first open writes them; 5,000 row groups: ~70 ms per file)."""
    k = (plan.src.url, plan.data_files, identities)
    with _RANGES_LOCK:
        got = _RANGES.get(k)
        if got is not None:
            _RANGES.move_to_end(k)
            return got
    data = keep_ranges(plan.src, plan.data_files, identities, plan.cache_dir)
    got = _Ranges(data["data_file"], data["rg"], data["rows"], data["nbytes"],
                  {c: data[f"lo/{c}"] for c in COLUMNS}, {c: data[f"hi/{c}"] for c in COLUMNS},
                  {c: data[f"known/{c}"] for c in COLUMNS},
                  pa.ipc.read_schema(pa.py_buffer(data["schema"].tobytes())))
    with _RANGES_LOCK:
        _RANGES[k] = got
        while len(_RANGES) > 16:
            _RANGES.popitem(last=False)
    return got


def _meets(lo: np.ndarray, hi: np.ndarray, bounds: tuple) -> np.ndarray:
    """Per row group: does [lo, hi] meet one of the intervals ``bounds`` (sorted, disjoint, closed; +-inf ends)?"""
    big = np.iinfo(np.int64)
    # (statistics are int64: a bound beyond, a HUGEINT literal such as 2**63, is clipped to int64's range, and an
    # interval wholly beyond it meets no row group)
    iv = [(max(a, big.min), min(b, big.max)) for a, b in bounds if a <= big.max and b >= big.min]
    if not iv:
        return np.zeros(len(lo), bool)
    a = np.array([x[0] for x in iv], np.int64)
    b = np.array([x[1] for x in iv], np.int64)
    k = np.searchsorted(a, hi, side="right") - 1  # the last interval starting at or below hi ...
    return (k >= 0) & (b[np.maximum(k, 0)] >= lo)  # ... reaches lo: (disjoint, so it is the one reaching furthest)


def _integer_column(plan: FramesPlan, column: str) -> bool:
    """Whether the data files hold ``column`` (named as DuckDB compares names) as integers: a derived index, or one
    stored as floats, has no statistics to narrow by."""
    return {sql_key(k): t for k, t in plan.columns.items()}.get(sql_key(column)) in _INTEGER_TYPES


def _current_ranges(plan: FramesPlan) -> tuple[_Ranges, tuple[str, ...]] | None:
    """The row groups' ranges of the data files as they are now, and their versions; None below
    :data:`MIN_ROW_GROUPS` row groups in all."""
    identities = tuple(plan.src.identity(rel) for rel in plan.data_files)
    r = _ranges(plan, identities)
    return (r, identities) if len(r.rows) >= MIN_ROW_GROUPS else None


def _narrowable(plan: FramesPlan, column: str, current) -> bool:
    """Whether a bound on ``column`` can narrow a read of the data files at all, as :func:`row_groups` judges before
    the bounds (``current()``: :func:`_current_ranges`, made once per query)."""
    return _integer_column(plan, column) and current() is not None


def row_groups(plan: FramesPlan, bounds, current=None) -> tuple[_Ranges, np.ndarray, tuple[str, ...]] | None:
    """The row groups (positions in :class:`_Ranges`) that may hold rows whose values meet ``bounds`` (column ->
    intervals, as :class:`lerobot_sql._query.narrowing.Narrowing` gives them, or ``(column, intervals)`` pairs, all
    met), and the data files' versions they were judged at; None when the view must be read whole (no bound column
    the data files hold as integers; too few row groups; too many to read). ``current()``: the data files' ranges
    and versions as one query judges them (:func:`_current_ranges`, by default looked at now)."""
    bounds = [(c, iv) for c, iv in (bounds.items() if isinstance(bounds, dict) else bounds)
              if _integer_column(plan, c)]
    got = (current or (lambda: _current_ranges(plan)))() if bounds else None
    if got is None:
        return None
    r, identities = got
    keep = np.ones(len(r.rows), bool)
    for c, iv in bounds:  # (two bounds of one column: both kept, each narrows)
        keep &= ~r.known[c] | _meets(r.lo[c], r.hi[c], iv)
    pick = np.flatnonzero(keep)
    if int(r.rows[pick].sum()) > MAX_ROWS or int(r.nbytes[pick].sum()) > MAX_BYTES or \
            (len(pick) > 8 and 2 * len(pick) > len(keep)):
        return None  # (most of the row groups: DuckDB's parallel scan of the columns a query reads is the better)
    return r, pick, identities


class Pin:
    """Keeps a part registered on its cursor while a result of the query may still run (the Result holds it)."""

    def __init__(self, parts: "Parts", cur, name: str):
        self.name = name
        weakref.finalize(self, parts._released, id(cur), name)


class Parts:
    """The parts registered on a connection's cursors, each unregistered once no result holds its :class:`Pin`
    (at the next part made on the same cursor: a cursor is used by its own thread only)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._dead: dict[int, list[str]] = collections.defaultdict(list)
        self._count = itertools.count()

    def _released(self, cur_id: int, name: str) -> None:
        with self._lock:
            self._dead[cur_id].append(name)

    def _sweep(self, cur) -> None:
        with self._lock:
            names = self._dead.pop(id(cur), [])
        for name in names:
            try:
                cur.unregister(name)
            except duckdb.Error:
                pass  # (already gone with its cursor)

    def narrowed_sql(self, cur: duckdb.DuckDBPyConnection, plan: FramesPlan, narrowings, sql: str, guard=None
                     ) -> tuple[str, tuple[Pin, ...]] | None:
        """``sql`` (the checked query) with each reference to ``frames`` of ``narrowings`` (``Narrowing`` objects,
        in text order) replaced by the view's SELECT over the row groups it may keep rows of, registered on ``cur``;
        and the :class:`Pin` objects that keep them registered. A reference whose part cannot be made stays as it is
        (see the module's docstring); None: none was replaced. ``guard()``: a context manager each bounding
        subquery is run alone under (the query's timeout and Ctrl-C).

        Raises:
            DatasetFormatError: a data file changed since the dataset was opened, or a row group cannot be
                decoded (as a query over the view would have failed); RemoteIOError: the remote failed.
        """
        splices, pins = [], []  # (start, end, text) of the query's bytes to replace
        # (the data files' ranges and versions, looked at once for the whole query: a stat of every data file each)
        current = functools.cache(lambda: _current_ranges(plan))
        for n in narrowings:
            name = f"_lsql_part_{next(self._count)}"
            if n.ctes:
                # a CTE of the name of a relation the view's SELECT reads (tasks, _episodes_raw, the part) would
                # stand in for it there: the view itself is read where the query's CTEs are not seen
                tree = cur.sql("SELECT json_serialize_sql($1)", params=[plan.body(ident(name))]).fetchall()[0][0]
                if n.ctes & tables_read(tree):
                    continue
            bounds, ran = list(n.bounds.items()), []
            for col, text, a, b in n.subqueries:  # (column IN (SELECT ... FROM episodes ...): run alone)
                if not _narrowable(plan, col, current):
                    continue  # (no part of these files can be made by it: run alone for nothing, then again)
                got = _subquery_values(cur, text, guard)
                if got is not None:
                    bounds.append((col, intervals(got[1])))
                    ran.append((a, b, got[0]))
            got = self._part(cur, plan, bounds, name, False, current) if bounds else None
            if got is None:
                continue
            splices.append((n.start, n.end, f"({plan.body(got[0])}) AS {ident(n.alias)}"))
            pins.append(got[1])
            for a, b, values in ran:
                # (the values the part was read by stand in the subquery's place: run again, a LIMIT, SAMPLE or
                # random() in it could give others, whose rows the part does not hold)
                vname = f"_lsql_values_{next(self._count)}"
                while vname in n.ctes:  # (a CTE of the query of that name would be read in the values' place)
                    vname = f"_lsql_values_{next(self._count)}"
                cur.register(vname, values)
                pins.append(Pin(self, cur, vname))
                splices.append((a, b, f"(SELECT * FROM {ident(vname)})"))
        if not splices:
            return None
        splices.sort()
        if any(x[1] > y[0] for x, y in zip(splices, splices[1:])):
            return None  # (spans that overlap: not a reading to splice by; the pins go with this frame)
        raw = sql.encode("utf-8")
        for a, b, text in reversed(splices):  # (from the end: the spans before stay where they are)
            raw = raw[:a] + text.encode() + raw[b:]
        return raw.decode("utf-8"), tuple(pins)

    def loc_sql(self, cur: duckdb.DuckDBPyConnection, plan: FramesPlan, bounds: dict, loc: bool = True
                ) -> tuple[str, Pin] | None:
        """A FROM item (``(SELECT ...)``) holding every row of ``_frames_loc`` (``loc`` False: of ``frames``) whose
        values meet ``bounds`` (column -> intervals), and maybe others: the rows of the row groups that may hold
        them; and the :class:`Pin` that keeps them registered on ``cur``. None: read the view itself. Raises as
        :meth:`narrowed_sql`."""
        got = self._part(cur, plan, bounds, f"_lsql_part_{next(self._count)}", loc)
        if got is None:
            return None
        return f"({plan.loc_body(got[0], ident(plan.file_column)) if loc else plan.body(got[0])})", got[1]

    def _part(self, cur: duckdb.DuckDBPyConnection, plan: FramesPlan, bounds: dict, name: str, loc: bool,
              current=None) -> tuple[str, Pin] | None:
        """The row groups that may hold rows meeting ``bounds``, read and registered on ``cur`` as ``name``: a FROM
        item giving the data files' columns as ``read_parquet`` does (and with ``loc`` each row's data file, as
        ``plan.file_column``, and ``file_row_number``), and its :class:`Pin`."""
        self._sweep(cur)
        got = row_groups(plan, bounds, current)
        if got is None:
            return None
        r, pick, identities = got
        # (_frames_loc reads the default columns: the others, the large ones, are not read)
        columns = [c for c in plan.columns if sql_key(c) in _LOC_COLUMNS] if loc else None
        wanted = {c: t for c, t in plan.columns.items() if columns is None or c in columns}

        def one_file(f: int) -> list[pa.Table]:
            here = r.file == f
            rgs = r.rg[pick[r.file[pick] == f]].tolist()
            info = _footer(plan.src, plan.data_files[f], identities[f])
            # (a NULL frame cell read as the view reads it: SQL shows it, a manifest's checks name it)
            read = tabular.read_row_groups(plan.src, info, rgs, None, columns, check_nulls=False)
            if loc:
                starts = np.concatenate([[0], np.cumsum(r.rows[here])])
                rel = plan.src.duckdb_path(plan.data_files[f])[len(plan.src.duckdb_path("")):]
                read = [t.append_column(plan.file_column, pa.array([rel] * t.num_rows, pa.string()))
                        .append_column("file_row_number", pa.array(np.arange(starts[g], starts[g] + t.num_rows)))
                        for g, t in zip(rgs, read)]
            return read

        files = np.unique(r.file[pick]).tolist()
        if len(files) < 2:
            tables = [t for f in files for t in one_file(f)]
        else:
            # (two files at a time: parsing a data file's footer, ~40 ms at 5,000 row groups, is most of a file's
            # cost and pyarrow does it without the GIL; two, not more, as each parsed footer holds ~32 MB)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                tables = [t for read in pool.map(one_file, files) for t in read]
        try:
            schema = r.schema if not loc else pa.schema([r.schema.field(c) for c in columns]).append(
                pa.field(plan.file_column, pa.string())).append(pa.field("file_row_number", pa.int64()))
            part = pa.concat_tables(tables) if tables else schema.empty_table()
        except pa.ArrowInvalid:
            return None  # (the files' schemas differ after all: the view's union reads them)
        try:
            cur.register(name, part)
        except duckdb.Error:
            return None  # (an Arrow type DuckDB cannot scan, float16 or decimal256, that its Parquet reader reads)
        pin = Pin(self, cur, name)
        types = dict(row[:2] for row in cur.sql(f"DESCRIBE SELECT * FROM {ident(name)}").fetchall())
        extra = [plan.file_column, "file_row_number"] if loc else []
        if list(types) != list(wanted) + extra:
            return None  # (pin dropped: unregistered at the next sweep)
        cols = []
        for c, want in wanted.items():
            have = types[c]
            if have == want:
                cols.append(ident(c))
            elif _NUMBER_LIST.fullmatch(have) and _NUMBER_LIST.fullmatch(want):
                cols.append(f"CAST({ident(c)} AS {want}) AS {ident(c)}")
            else:
                return None
        return f"(SELECT {', '.join(cols + [ident(c) for c in extra])} FROM {ident(name)})", pin


def _subquery_values(cur: duckdb.DuckDBPyConnection, text: str, guard=None) -> tuple[pa.Table, np.ndarray] | None:
    """The distinct rows of subquery ``text`` (``(SELECT ...)``, one column, reading metadata views only:
    :func:`lerobot_sql._query.narrowing.narrow_frames` chose it), run alone, as it gave them (NULL included), and
    their values (int64, no NULL); None when it does not run alone (a correlated subquery: a column of the outer
    query), gives another type than integers (DuckDB would compare 5.0 with 5), more than one column, or more than
    :data:`MAX_ROWS` values."""
    sql = f"SELECT DISTINCT * FROM {text} AS _lsql_values"
    try:
        # (a piece of a checked query, cut where DuckDB's parse tree says: still one SELECT, or it is not run)
        stmts = cur.extract_statements(sql)
        if len(stmts) != 1 or stmts[0].type != duckdb.StatementType.SELECT:
            return None
        with guard() if guard is not None else contextlib.nullcontext():  # (an interrupted run: a duckdb.Error)
            got = cur.sql(sql).limit(MAX_ROWS + 1).to_arrow_table()
    except duckdb.Error:
        return None
    if got.num_columns != 1 or got.num_rows > MAX_ROWS or not pa.types.is_integer(got.schema.field(0).type):
        return None
    col = got.column(0).drop_null()
    return got, (col.to_numpy().astype(np.int64) if len(col) else np.zeros(0, np.int64))


def intervals(values) -> tuple[tuple[int, int], ...]:
    """Integer ``values`` (any order, repeats) as sorted, disjoint, closed intervals of consecutive values."""
    v = np.unique(np.asarray(values, np.int64))
    if not len(v):
        return ()
    cut = np.flatnonzero(np.diff(v) != 1)
    starts, ends = v[np.concatenate([[0], cut + 1])], v[np.concatenate([cut, [len(v) - 1]])]
    return tuple(zip(starts.tolist(), ends.tolist()))


_FOOTERS: "collections.OrderedDict[tuple, tabular.DataFileInfo]" = collections.OrderedDict()
_FOOTERS_LOCK = threading.Lock()


def _footer(src: Source, rel: str, identity: str, keep: bool = True) -> tabular.DataFileInfo:
    """Data file ``rel`` at version ``identity`` with its parsed footer (the one the process's datasets keep, else
    parsed now). ``keep``: the last two parsed here stay (~32 MB each at 5,000 row groups: the next query of the same
    file, the usual case, parses none; more would hold memory a notebook notices)."""
    k = (src.url, rel, identity)
    with _FOOTERS_LOCK:
        got = _FOOTERS.get(k)
        if got is not None:
            _FOOTERS.move_to_end(k)
            return got
    got = tabular.with_footer(src, tabular.DataFileInfo(rel, identity, np.zeros(1, np.int64)))
    if keep:
        with _FOOTERS_LOCK:
            _FOOTERS[k] = got
            while len(_FOOTERS) > 2:
                _FOOTERS.popitem(last=False)
    return got
