"""The DuckDB connection of one dataset: made on first use, its views registered, then locked down; one cursor per
thread; the views built on first read (``LAZY_VIEWS``); the errors a DuckDB failure becomes; the manifest row cap.

:class:`Connection` is all the DuckDB a ``Database`` holds. It is made without DuckDB (``connect()`` reads only
info.json), and opens the connection when a query first needs it: a whole-episode dataset never does.
"""

from __future__ import annotations

import os
import re
import threading
import weakref

import duckdb
import pyarrow as pa

from .. import _settings
from .._format.files import DatasetFiles
from .._format.layout import Layout
from .._format.metadata import corrupt_parquet_files, damaged_parquet_error
from .._format.metadata import unreadable_error as parquet_error
from .._format.sidecar_files import find_sidecars
from .._query import narrowing
from .._query.sqltext import ident, literal
from .._readers import video_index
from .._storage import cache
from .._storage.source import Source, glob_escape
from ..errors import (
    DatasetFormatError,
    FileChangedError,
    LeRobotSQLError,
    MissingFileError,
    QueryError,
    QueryInterrupted,
    RemoteIOError,
    ResultContractError,
    warn,
)
from . import frames_part, macros, quality, sandbox, sidecars, views

# Names a sidecar view never gets besides the dataset's own views and macros: the views of a collection and the
# listing of the sidecars themselves.
RESERVED_NAMES = frozenset({"datasets", "sidecars"})

# Most rows a query given to dataset()/manifest() may return (samples; duplicates allowed for oversampling).
MAX_RESULT_ROWS = 200_000_000  # hard ceiling on a manifest's rows, whatever the memory
MANIFEST_BYTES_PER_ROW = 320  # peak bytes per sample while a manifest is built (30M frames peaked at 9.3 GB)


def max_manifest_rows() -> int:
    """Most samples a manifest may have: ``$LSQL_MAX_MANIFEST_ROWS``, else what half of RAM holds, at most
    MAX_RESULT_ROWS (about 37M samples on a 24 GB machine)."""
    cap = _settings.whole_number("LSQL_MAX_MANIFEST_ROWS", None, "samples a manifest may have", minimum=1)
    if cap is not None:
        return cap
    total = sandbox.total_memory()
    return MAX_RESULT_ROWS if total is None else min(MAX_RESULT_ROWS, total // 2 // MANIFEST_BYTES_PER_ROW)


# DuckDB's error when a query opens a Parquet file whose footer does not parse
_DAMAGED = re.compile(r"((?:No magic bytes found at end of file|Invalid Input Error)[^\n']*?) ?'([^'\n]+\.parquet)'")
# DuckDB's error when the frames view casts a data file's list to info.json's fixed-size array (views.register)
_CAST_LENGTH = re.compile(r"Cannot cast list with length (\d+) to array with length (\d+) when casting from source "
                          r"column (.+)$", re.M)


def query_error(e: BaseException, sql: str, layouts: list[tuple[str, Layout]] = ()) -> LeRobotSQLError:
    """The error for a DuckDB failure: a :class:`RemoteIOError` when the storage under a remote view failed (DuckDB
    reports our fsspec layer's exception as text, traceback included), a :class:`DatasetFormatError` when a view
    raised for a column the data lacks (``views.ERROR_MARKER``) or, for a vector feature of one of ``layouts``
    (``(dataset root, layout)`` pairs), holds lists of another length than info.json's shape, else a :class:`QueryError` naming the SQL."""
    text = str(e)
    if sandbox.interrupted_by_signal(e):  # Ctrl-C that DuckDB's own signal check saw before a guard of ours was armed
        return QueryInterrupted.ctrl_c(sql)
    if views.ERROR_MARKER in text:  # a view's error() for a column the data lacks (views._derived_columns)
        return DatasetFormatError(text[text.rindex(views.ERROR_MARKER) + len(views.ERROR_MARKER):].strip())
    m = _DAMAGED.search(text) if isinstance(e, (duckdb.InvalidInputException, duckdb.IOException)) else None
    if m:  # a data file a query opened is damaged (views.frames made the view over it: a partial download)
        return damaged_parquet_error(m[2], f"{type(e).__name__}: {m[1].strip()}")
    m = _CAST_LENGTH.search(text) if isinstance(e, duckdb.ConversionException) else None
    if m:
        held, want, col = int(m[1]), int(m[2]), m[3].strip()
        roots = [root for root, lay in layouts if col in lay.features and tuple(lay.features[col].shape) == (want,)]
        if roots:  # the frames view's cast of a feature, not a cast the user wrote over another column
            return DatasetFormatError(
                f"{', '.join(roots)}: the data files hold column {col!r} as lists of {held} values, but "
                f"meta/info.json gives it shape [{want}]; fix the feature's shape in meta/info.json (or rewrite the "
                f"data files to that shape; `lerobot-sql doctor` names the files) (while running: {sql})")
    for cls in (FileChangedError, RemoteIOError):
        marker = f"{cls.__name__}: "
        if marker in text:
            msg = text[text.rindex(marker) + len(marker):].strip()
            return cls(f"{msg} (while running: {sql})")
    # DuckDB's advice to run SET / PRAGMA, which this locked connection refuses, replaced by what works
    return QueryError(sandbox.locked_advice(f"{type(e).__name__}: {e}\nSQL: {sql}"))


def unreadable_error(src: Source, layout: Layout, cause: BaseException,
                     sql: str | None = None) -> LeRobotSQLError | KeyboardInterrupt:
    """A DatasetFormatError for a Parquet file DuckDB or pyarrow could not read, naming the file(s) whose footer does
    not parse (checked one by one, footers only), else every data file, and the fix. A storage failure (503s,
    a dead server: in ``cause`` or while the footers are checked) is a RemoteIOError instead, not a corrupt file.
    With the user's ``sql`` (the failure came while its result was resolved): a DuckDB Binder/Conversion error while
    every footer parses is the result's types, not the files: a ResultContractError naming the query. DuckDB
    stopped by Ctrl-C (:func:`sandbox.interrupted_by_signal`) is no damaged file: a KeyboardInterrupt to raise."""
    if sandbox.interrupted_by_signal(cause):
        return KeyboardInterrupt()
    remote = query_error(cause, sql or "opening the dataset's tables", [(src.url, layout)])
    if isinstance(remote, (RemoteIOError, DatasetFormatError)):  # DatasetFormatError: a missing column, named
        return remote
    if isinstance(cause, duckdb.OutOfMemoryException):  # memory_limit, not the files (it was "cannot be read")
        return remote
    try:
        bad = corrupt_parquet_files(src, layout)
    except RemoteIOError as e:
        return type(e)(f"{e} (while checking the Parquet files after: {type(cause).__name__}: "
                       f"{str(cause).splitlines()[0] if str(cause) else ''})")
    if not bad and sql is not None and isinstance(cause, (duckdb.BinderException, duckdb.ConversionException)):
        return ResultContractError(f"the query's result cannot be matched to the frames ({type(cause).__name__}: "
                                   f"{str(cause).splitlines()[0]}); check the types of its columns (index and "
                                   f"episode_index integers, start_s/end_s seconds) and alias computed columns "
                                   f"named like a feature: {sql!r}")
    return parquet_error(src, bad, cause)


def missing_data_files(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The data files (relative paths, sorted) that meta/episodes points to and that are not under data/, from the
    views of the dataset ``con``'s current schema holds: the connect-time warning and the "no frames" errors of
    :mod:`lerobot_sql._plan.resolve` both ask here."""
    return [r[0] for r in con.sql("SELECT DISTINCT path FROM _episode_data_files WHERE path NOT IN "
                                  "(SELECT path FROM _data_files_listed) ORDER BY 1").fetchall()]


def _missing_data_files_warning(con: duckdb.DuckDBPyConnection, src, missing: list[str]) -> str:
    """The warning for data files meta/episodes points to that do not exist, worded by what is wrong: a stale
    pointer whose episode's rows are in another data file (frames and dataset() find them by episode_index), or an
    episode with no rows anywhere (every query lacks it). Error path only: scans the data's episode_index."""
    head = f"{len(missing)} data file(s) that meta/episodes points to are missing, e.g. {src.path(missing[0])}"
    try:
        rows = con.sql(
            "WITH gone AS (SELECT episode_index, path FROM _episode_data_files WHERE path NOT IN "
            "(SELECT path FROM _data_files_listed)), "
            "found AS (SELECT episode_index, min(data_file) AS at, count(*) AS n FROM _frames_loc "
            "WHERE episode_index IN (SELECT episode_index FROM gone) GROUP BY 1) "
            "SELECT g.episode_index, g.path, f.at, f.n FROM gone g LEFT JOIN found f USING (episode_index) "
            "ORDER BY g.episode_index").fetchall()
    except duckdb.Error:  # the frames cannot be scanned (a damaged data file): say only what is known
        return (f"{head}: the frames view and every query over it may lack their episodes. Download data/ again; "
                "`lerobot-sql doctor` lists them (data_files_present)")
    found = [r for r in rows if r[3]]
    lost = [r for r in rows if not r[3]]
    parts = [head]
    if found:
        e, p, at, n = found[0]
        parts.append(f"{len(found)} episode(s) pointing there have their rows in other data files (e.g. episode {e}: "
                     f"{n} rows in {at}, not {p}) and are read from there, found by episode_index; fix their "
                     "data/chunk_index and data/file_index in meta/episodes (`lerobot-sql doctor`: data_file_pointers)")
    if lost:
        eps = ", ".join(str(r[0]) for r in lost[:5]) + (", ..." if len(lost) > 5 else "")
        parts.append(f"{len(lost)} episode(s) have no rows in any data file (episodes {eps}): the frames view and "
                     "every query over it lack them. Download data/ again; `lerobot-sql doctor` lists the files "
                     "(data_files_present)")
    return "; ".join(parts)


def populate(con: duckdb.DuckDBPyConnection, files: DatasetFiles, relations: dict[str, pa.Table],
             prefix: str = "", table_macros: bool = True
             ) -> tuple[list[str], list[str], dict[str, str], frames_part.FramesPlan | None]:
    """Create one dataset's views and macros in ``con``'s current schema (Arrow registrations named with
    ``prefix``, recorded in ``relations``), and a placeholder per sidecar file (:mod:`lerobot_sql._catalog.sidecars`,
    built on first read); warn about missing data files and symlinks out of the root.

    Returns:
        (the folders DuckDB must be allowed to read: the root and the cache folder; the symlink targets it may
        read), for :func:`lerobot_sql._catalog.sandbox.lock_down`; the sidecar views (view name -> file); how the
        frames view is made (None: queries read it whole), for a query's part of it.

    Raises:
        DatasetFormatError / RemoteIOError: a metadata or data file cannot be read (:func:`unreadable_error`).
    """
    src, layout = files.source, files.layout
    try:
        plan = views.register_views(con, src, layout, relations, prefix, cache_dir=files.cache_dir)
    except (duckdb.Error, pa.ArrowException, OSError) as e:
        if isinstance(e, LeRobotSQLError):
            raise
        raise unreadable_error(src, layout, e) from e
    missing = missing_data_files(con)
    if missing:
        warn(_missing_data_files_warning(con, src, missing))
    macros.register(con, layout, table_macros)  # over register_views' placeholders of video_frames / video_files
    own = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal AND "
                                 "schema_name = current_schema()").fetchall()}
    found = sidecars.view_names(find_sidecars(src), own | set(macros.TABLE_MACROS) | RESERVED_NAMES,
                                sidecars.keywords(con))
    sidecars.register_placeholders(con, found, relations, prefix)
    # Second wall behind the query checks: DuckDB itself reads only the dataset and our cache from here on.
    # A hub-cache snapshot's files are symlinks into its blobs/ folder: those targets, and only those, readable.
    targets, refused = src.symlink_targets()
    if refused:
        warn(f"{len(refused)} file(s) or folder(s) under the dataset root are symlinks to files outside it "
             f"(e.g. {refused[0]} -> {os.path.realpath(refused[0])}); SQL, dataset() and export refuse to "
             "read them. Copy the files into the dataset folder")
    root = src.duckdb_path("")
    # The data files are given to DuckDB with glob characters bracketed (views.file_list), and DuckDB checks that
    # spelling against allowed_directories: a root named ``a*`` is allowed as ``a[*]`` too.
    escaped = glob_escape(root) if src.is_local else root
    return [root, *([escaped] if escaped != root else []), str(files.cache_dir)], list(targets), found, plan


class Connection:
    """The DuckDB side of one dataset: the connection (made on first :meth:`cursor`), a cursor per thread, the Arrow
    relations behind internal views, and the views built on first read.

    Threads: the thread that made the connection uses it; every other thread gets its own cursor of it, which
    shares the views, the sandbox settings and the lock-down, so queries of different threads run side by side.

    Args:
        files: the dataset.
        threads, memory_limit, temp_directory: DuckDB settings, as :func:`lerobot_sql.connect`.
    """

    def __init__(self, files: DatasetFiles, *, threads: int | None = None, memory_limit: str | None = None,
                 temp_directory: str | os.PathLike | None = None):
        self.files = files
        self._settings = (*sandbox.check_settings(threads, memory_limit), temp_directory)  # before DuckDB sees them
        self._con: duckdb.DuckDBPyConnection | None = None
        self._con_lock = threading.Lock()
        self._build_lock = threading.RLock()  # lazily built views (video index, video_files)
        self._local = threading.local()  # other threads' cursors
        self._cursors: list[tuple[weakref.ref, duckdb.DuckDBPyConnection]] = []
        self._relations: dict[str, pa.Table] = {}  # Arrow tables behind internal views, registered on each cursor
        self._relations_gen = 0  # bumped by each register: cursors compare it to what they registered
        # view -> built; without cameras there is nothing to build (the placeholders are the views)
        self._ready = {name: not files.layout.video_keys for name in LAZY_VIEWS}
        self._ready["episode_quality"] = False  # built from the data files, cameras or not
        self.quality_thresholds = quality.Thresholds()
        self._sidecars: dict = {}  # sidecar view -> what builds it (its file), known once the connection is open
        self._sidecars_built: set[str] = set()
        self._attached: set[str] = set()  # names of the tables attach() made views of (lower case)
        self.frames_plan: frames_part.FramesPlan | None = None  # set when the views are made (None: read whole)
        self._parts = frames_part.Parts()

    @property
    def opened(self) -> bool:
        """True once the DuckDB connection exists."""
        return self._con is not None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's connection or cursor, with the views and every internal Arrow relation registered on it;
        the connection is made on the first call.

        A DuckDB connection serves one query at a time ("connection is busy" from a second thread); a cursor shares
        the database (views, macros, settings, lock-down) but has its own client context. Arrow registrations are
        per client context, so each cursor registers the relations itself, also those added later (video index).
        """
        if self._con is None:
            with self._con_lock:  # two threads' first queries make one connection
                if self._con is None:
                    con = self._open()
                    self._local.cur, self._local.registered = con, dict(self._relations)
                    self._local.seen = self._relations_gen
                    self._con = con
        local = self._local
        cur = getattr(local, "cur", None)
        if cur is not None and local.seen == self._relations_gen:
            return cur
        with self._con_lock:
            # Registrations are made by each thread on its own connection or cursor: registering on another
            # thread's while it runs a query fails ("connection is busy").
            if cur is None:
                cur = self._con.cursor()
                local.cur, local.registered = cur, {}
                alive = []
                for ref, c in self._cursors:  # close the cursors of threads that ended
                    thread = ref()
                    if thread is None or not thread.is_alive():
                        c.close()
                    else:
                        alive.append((ref, c))
                self._cursors = alive + [(weakref.ref(threading.current_thread()), cur)]
            for name, table in list(self._relations.items()):
                if local.registered.get(name) is not table:
                    cur.register(name, table)
                    local.registered[name] = table
            local.seen = self._relations_gen
        return cur

    def register(self, name: str, table: pa.Table) -> None:
        """Register ``table`` as ``name`` on the connection and, from their next use, on every cursor."""
        with self._con_lock:
            self._relations[name] = table
            self._relations_gen += 1
        _ = self.cursor()  # registers it on this thread's connection or cursor now; the others on their next use

    def _open(self) -> duckdb.DuckDBPyConnection:
        """A new DuckDB connection with the views and macros, locked down to the dataset and its cache."""
        con = self._new_duckdb()
        try:
            allowed, targets, self._sidecars, self.frames_plan = populate(con, self.files, self._relations)
            sandbox.lock_down(con, allowed, allowed_paths=targets)
        except (duckdb.Error, RuntimeError) as e:
            con.close()
            if sandbox.interrupted_by_signal(e):  # Ctrl-C while the views were made: the caller's KeyboardInterrupt,
                raise KeyboardInterrupt from e  # not DuckDB's bare RuntimeError with a traceback
            raise
        return con

    def _new_duckdb(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with our settings, the remote filesystems registered, nothing created yet."""
        threads, memory_limit, temp_directory = self._settings
        # threads: all cores (DuckDB's default); memory_limit: min(RAM/4, 4 GiB), not DuckDB's 80% of RAM, which
        # would leave nothing to DataLoader workers (see sandbox.default_config).
        config = sandbox.default_config(threads or None, memory_limit or None)
        # Spill next to our other caches, not into DuckDB's default `.tmp` in the user's working directory.
        config["temp_directory"] = str(temp_directory or self.files.cache_dir / cache.DUCKDB_TMP)
        con = sandbox.connect(config)  # progress bar off: it would be drawn on stdout
        for files in self.members():
            if not files.source.is_local:
                con.register_filesystem(files.source.fs)
        # Views re-bind on every query; without this DuckDB re-parses every Parquet footer each time (at 100k
        # episodes: connect 10.7 s -> 1.2 s, benchmarks/README.md "Scale").
        con.execute("SET parquet_metadata_cache = true")
        # Database.check reads DuckDB's own parse tree (json_serialize_sql); the json extension must be loaded
        # before lock_down turns extension loading off.
        con.execute("LOAD json")
        return con

    def narrowed(self, sql: str, tree: str, guard=None) -> tuple[str, tuple[frames_part.Pin, ...]] | None:
        """Checked query ``sql`` (DuckDB's parse tree ``tree``) reading only the row groups of ``frames`` its WHERE
        can keep rows of (:mod:`lerobot_sql._catalog.frames_part`), and what keeps them registered while a result
        of it may run; None: run it as written. ``guard()``: a context manager each run of a bounding subquery is
        made under (the query's timeout and Ctrl-C).

        Raises:
            DatasetFormatError / RemoteIOError: a data file cannot be read (as the query would have failed).
        """
        plan = self.frames_plan
        if plan is None:
            return None
        found = narrowing.narrow_frames(tree, sql)
        if not found:
            return None
        return self._parts.narrowed_sql(self.cursor(), plan, found, sql, guard)

    def loc(self, bounds: dict, view: str = "_frames_loc") -> tuple[str, frames_part.Pin] | None:
        """A FROM item with every row of ``view`` (``_frames_loc`` or ``frames``) whose values meet ``bounds``
        (``{"episode_index" or "index": intervals}``, see :func:`lerobot_sql._catalog.frames_part.intervals`), read
        from the row groups that may hold them, and what keeps it registered; None: read the view itself.

        Raises:
            DatasetFormatError / RemoteIOError: a data file cannot be read.
        """
        if self.frames_plan is None:
            return None
        return self._parts.loc_sql(self.cursor(), self.frames_plan, bounds, view == "_frames_loc")

    def members(self) -> list[DatasetFiles]:
        """The datasets whose views this connection holds (one; a collection's connection holds several)."""
        return [self.files]

    def layouts(self) -> list[tuple[str, Layout]]:
        """``(root URL, layout)`` of each member: what :func:`query_error` names a dataset's shape errors by."""
        return [(f.source.url, f.layout) for f in self.members()]

    # ---- the views built on first read --------------------------------------------------------------------
    def ensure(self, name: str) -> None:
        """Build the lazy view ``name`` (a key of :data:`LAZY_VIEWS`) unless it is built; one thread builds, the
        others wait for it."""
        if not self._ready[name]:
            with self._build_lock:
                if not self._ready[name]:
                    LAZY_VIEWS[name](self)

    def build_video_index(self, progress: bool | None = True) -> None:
        """Build the frame index of every mp4 (demux only, cached on disk by file identity) and point the
        ``video_frames`` view at it (see ``Database.build_video_index``).

        Raises:
            MissingFileError: some mp4s are missing; every other file is indexed and queryable first.
            VideoDecodeError: PyAV cannot demux a file.
        """
        try:
            self._index_videos(self.files, "", "", progress)
        except MissingFileError:  # the files that are there are indexed and queryable
            self._ready["video_frames"] = True
            raise
        self._ready["video_frames"] = True

    def _index_videos(self, files: DatasetFiles, schema: str, prefix: str, progress: bool | None) -> None:
        """Index ``files``' mp4s and replace the ``video_frames`` placeholder in ``schema`` ("" for the current
        one) with a view over the index files; Arrow registrations named with ``prefix``."""
        from tqdm.auto import tqdm

        src, cache_dir = files.source, files.cache_dir
        at = f"{ident(schema)}." if schema else ""
        rows = self.cursor().sql(f"SELECT DISTINCT video_key, chunk_index, file_index, path FROM {at}videos "
                                 "ORDER BY video_key, chunk_index, file_index").fetchall()
        out, missing = [], []
        for key, chunk, file, rel in tqdm(rows, desc="video index", unit="file",
                                          disable=(len(rows) < 8) if progress is None else not progress):
            try:
                out.append((key, chunk, file, rel, str(video_index.ensure_index(src, rel, cache_dir))))
            except MissingFileError as e:
                missing.append(e)
        m = pa.table({"video_key": [f[0] for f in out], "chunk_index": [f[1] for f in out],
                      "file_index": [f[2] for f in out], "path": [f[3] for f in out],
                      "_index_file": [f[4] for f in out]})
        # A view over a registered Arrow table, not a DuckDB table: SQL cannot rewrite which index file a camera's
        # frames come from (see views.register_table).
        arrow = f"_lsql_arrow_{prefix}video_files"
        with self._build_lock:
            self.register(arrow, m)
            con = self.cursor()
            con.execute(f"CREATE OR REPLACE VIEW {at}_video_files AS SELECT * FROM {ident(arrow)}")
            if out:
                lst = "[" + ", ".join(literal(f[4]) for f in out) + "]"
                con.execute(
                    f"CREATE OR REPLACE VIEW {at}video_frames AS SELECT v.video_key, v.chunk_index, v.file_index, "
                    f"v.path, {', '.join('i.' + ident(f.name) for f in video_index.INDEX_SCHEMA)} "  # the placeholder's
                    f"FROM read_parquet({lst}, filename=true) i JOIN {at}_video_files v ON v._index_file = i.filename"
                )
        if missing:
            raise MissingFileError(f"{len(missing)} of {len(rows)} video files are missing (the other "
                                   f"{len(out)} are indexed), e.g. {missing[0]}")

    def _build_video_files(self) -> None:
        """Fill the view ``video_files`` (one row per distinct mp4 of ``videos``: present, size_bytes, codec) by
        probing the files (see :func:`lerobot_sql._readers.video_index.probe_video_files`)."""
        self._probe_videos(self.files, "", "")
        self._ready["video_files"] = True

    def _probe_videos(self, files: DatasetFiles, schema: str, prefix: str) -> None:
        at = f"{ident(schema)}." if schema else ""
        rows = self.cursor().sql(f"SELECT DISTINCT video_key, path FROM {at}videos ORDER BY video_key, path").fetchall()
        arrow = f"_lsql_arrow_{prefix}video_probe"
        self.register(arrow, video_index.probe_video_files(files.source, rows))
        self.cursor().execute(f"CREATE OR REPLACE VIEW {at}video_files AS SELECT * FROM {ident(arrow)}")

    def build_episode_quality(self, thresholds: "quality.Thresholds | None" = None) -> None:
        """Make the ``episode_quality`` view (:mod:`lerobot_sql._catalog.quality`): the data files' per-episode facts
        (one numpy pass, cached by the files' identities), the cameras' from the video index (built first if it is
        not), the verdict by ``thresholds`` (None: the ones in effect).

        Raises:
            MissingFileError, DatasetFormatError: a data file or an mp4 is gone or unreadable.
        """
        with self._build_lock:
            if thresholds is not None:
                self.quality_thresholds = thresholds
            if any(f.layout.video_keys for f in self.members()):
                try:
                    self.ensure("video_frames")
                except MissingFileError as e:  # the missing clips hold no frames: their episodes say clip_short
                    warn(f"episode_quality: {e}; their episodes' clips count 0 frames")
            self._quality_views()
            self._ready["episode_quality"] = True

    def _quality_views(self) -> None:
        self._quality_view(self.files, "", "")

    def _quality_view(self, files: DatasetFiles, schema: str, prefix: str) -> None:
        at = f"{ident(schema)}." if schema else ""
        fps = float(files.layout.info["fps"])
        facts_name = f"_lsql_arrow_{prefix}episode_facts"
        if facts_name not in self._relations:
            self.register(facts_name, quality.facts(files))
        cams = None
        if files.layout.video_keys:
            cams = f"_lsql_arrow_{prefix}camera_facts"
            if cams not in self._relations:
                self.register(cams, quality.camera_facts(self.cursor(), at, fps))
        self.cursor().execute(f"CREATE OR REPLACE VIEW {at}episode_quality AS "
                              f"{quality.view_sql(at, facts_name, cams, fps, self.quality_thresholds)}")

    # ---- sidecar and attached tables -------------------------------------------------------------------------
    def unbuilt_sidecars(self) -> list[str]:
        """The sidecar views still placeholders (the connection must be open)."""
        return [n for n in self._sidecars if n not in self._sidecars_built]

    def ensure_sidecars(self, names, strict: bool = True) -> bool:
        """Build the sidecar views ``names`` not built yet (one thread builds, the others wait); True if one was.
        ``strict=False`` (a name merely written in the query: a column, a string) keeps a build's error for the
        query that really reads the view (``strict=True`` raises it), so a broken sidecar fails only its own reads
        (hostile review 20, M1: a broken meta/episode_index.json failed `SELECT episode_index FROM episodes`).

        Raises:
            DatasetFormatError / MissingFileError: as :func:`lerobot_sql._catalog.sidecars.build` (an unreadable
                file or folder named like a sidecar is a DatasetFormatError naming it).
        """
        errors = self.__dict__.setdefault("_sidecar_errors", {})
        if strict:
            bad = [n for n in names if n in errors]
            if bad:
                raise errors[bad[0]]
        todo = [n for n in names if n in self._sidecars and n not in self._sidecars_built and n not in errors]
        if not todo:
            return False
        built = False
        with self._build_lock:
            for n in todo:
                if n in self._sidecars_built:
                    continue
                try:
                    self._build_sidecar(n)
                except (LeRobotSQLError, OSError, duckdb.Error) as e:
                    err = e if isinstance(e, LeRobotSQLError) else DatasetFormatError(
                        f"sidecar view {n!r}: its file cannot be read ({type(e).__name__}: {e}); the view stays "
                        "unreadable until the file is fixed or removed (it is not part of the LeRobot format)")
                    errors[n] = err
                    if strict:
                        raise err from e
                    continue
                self._sidecars_built.add(n)
                built = True
        return built

    def _build_sidecar(self, name: str) -> None:
        sidecars.build(self.cursor(), self.files.source, name, self._sidecars[name], self.register)

    def attach_name(self, name: str, replace: bool = False) -> str:
        """``name`` checked as the name of an attached table's view; returns it in lower case.

        Raises:
            TypeError / QueryError: as :func:`lerobot_sql._catalog.sidecars.check_attach_name`.
        """
        con = self.cursor()
        existing = {r[0].lower() for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal AND "
                                                  "schema_name = 'main'").fetchall()}
        existing |= set(macros.TABLE_MACROS) | RESERVED_NAMES
        return sidecars.check_attach_name(name, existing, self._attached, sidecars.keywords(con), replace)

    def attach(self, name: str, table: pa.Table, as_json: list[str], replace: bool = False,
               where: str = "the attached table") -> None:
        """Make ``name`` (checked by :meth:`attach_name`) a view over ``table`` (see
        :func:`lerobot_sql._catalog.sidecars.attach`; ``where`` names the file in its errors)."""
        with self._build_lock:
            key = self.attach_name(name, replace)
            sidecars.attach(self.cursor(), name, table, as_json, self.register, where)
            self._attached.add(key)

    def close(self) -> None:
        with self._con_lock:
            for _, cur in self._cursors:
                cur.close()
            self._cursors = []
        if self._con is not None:
            self._con.close()


# Views that a query's first read builds (view -> its builder); views.register_views makes their placeholders
# (no rows, the real columns) so that the checks know their columns before they are built.
LAZY_VIEWS = {
    "video_frames": lambda c: c.build_video_index(progress=None),
    "video_files": lambda c: c._build_video_files(),  # late-bound: a collection's connection builds its own
    "episode_quality": lambda c: c.build_episode_quality(),
}
