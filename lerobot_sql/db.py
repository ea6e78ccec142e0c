"""``connect()`` and the ``Database`` it returns: SQL over a LeRobot dataset, and queries turned into datasets."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import signal
import threading
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ._catalog import macros
from ._catalog.connection import (MANIFEST_BYTES_PER_ROW, Connection, max_manifest_rows, query_error,
                                  unreadable_error)
from ._format.files import DatasetFiles, open_files
from ._format.layout import Layout
from ._format.metadata import read_pointers
from ._plan import manifest as plan_manifest
from ._plan import resolve as plan
from ._query import checks as query
from ._readers import locate
from ._storage.source import Source
from .errors import DatasetFormatError, MissingFileError, QueryError, ResultContractError, as_int, as_real

class _Interruptible:
    """While a query runs: ``timeout`` seconds on a timer, and on the main thread Ctrl-C (SIGINT), each call
    ``con.interrupt()``, which stops DuckDB within milliseconds (Python's own SIGINT handling waits for the query to
    end, which may be never). The connection stays usable afterwards.

    The timeout has two clocks. A ``threading.Timer`` works on any thread but needs the GIL to run its callback. On
    the main thread, when nobody else uses SIGALRM (pytest-timeout's signal method does; then only the Timer runs),
    an interval timer (``setitimer(ITIMER_REAL)``) also fires, every second after ``timeout``: DuckDB's Python layer
    calls ``PyErr_CheckSignals`` between execution tasks, so the handler runs on the query's own thread and calls
    ``con.interrupt()`` even when the Timer thread cannot get the GIL.

    What neither bounds: DuckDB checks the interrupt flag only between chunks of work, so one value that takes long
    to build (``printf('%01000000000d', 1)``, measured: interrupted 1 s in, ended 3.8 s in) runs to its end; the
    query checks refuse such values before the query runs (``query.MAX_GENERATED``). A Python callback of the
    query's (the fsspec filesystem of a remote root) blocked in I/O returns first.

    After the block: ``reason`` is None, ``"timeout"`` or ``"sigint"``. A Ctrl-C that arrives just as the query ends
    is not lost: it is raised as KeyboardInterrupt.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, timeout: float | None):
        self.con, self.timeout, self.reason = con, timeout, None
        self._timer: threading.Timer | None = None
        self._old_handler = None
        self._old_alarm = None

    def _fire(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        try:
            self.con.interrupt()
        except duckdb.Error:  # the connection was closed meanwhile
            pass

    def __enter__(self) -> "_Interruptible":
        if self.timeout is not None:
            self._timer = threading.Timer(self.timeout, self._fire, ("timeout",))
            self._timer.daemon = True
            self._timer.start()
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # Only Python's default handler is replaced: a handler the application installed is left alone.
            self._old_handler = signal.signal(signal.SIGINT, lambda signum, frame: self._fire("sigint"))
        if self.timeout is not None and main and hasattr(signal, "setitimer") and \
                signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
            # SIGALRM unclaimed (default action, no alarm pending): ours for the block, every second after timeout
            # in case one interrupt lands before DuckDB's next task.
            self._old_alarm = signal.signal(signal.SIGALRM, lambda signum, frame: self._fire("timeout"))
            signal.setitimer(signal.ITIMER_REAL, self.timeout, 1.0)
        return self

    def __exit__(self, typ, exc, tb) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._old_alarm is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)  # first stop the clock, then give SIGALRM back
            signal.signal(signal.SIGALRM, self._old_alarm)
        if self._old_handler is not None:
            signal.signal(signal.SIGINT, self._old_handler)
        if typ is None and self.reason == "sigint":
            raise KeyboardInterrupt

    def error(self, sql: str) -> QueryError:
        if self.reason == "timeout":
            err = QueryError(f"the query was stopped at its timeout of {self.timeout:g} s (timeout=...; CLI "
                             f"--timeout); the connection is still usable. SQL: {sql}")
        else:
            err = QueryError(f"the query was interrupted (Ctrl-C); the connection is still usable. SQL: {sql}")
        err.interrupted = self.reason  # the CLI exits 130 for Ctrl-C
        return err


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    v = as_real(timeout)
    if v is None or not math.isfinite(v) or v <= 0:
        raise ValueError(f"timeout={timeout!r}: give a positive number of seconds, or None for no limit")
    return v


class Result:
    """A lazy, read-only query result over a DuckDB relation. DuckDB errors, also those raised while fetching,
    arrive as :class:`QueryError` naming the SQL.

    Only reading methods are offered (``READ_METHODS``, ``READ_ATTRIBUTES``, ``.limit(n, offset)`` with integers):
    a DuckDB relation's other methods take SQL text that the query checks never see (``.query(name, sql)`` runs any
    statement, ``.filter(str)`` / ``.project(str)`` / ``.order(str)`` / ``.aggregate(str)`` take expressions) or
    write files (``.write_csv``, ``.to_parquet``); they raise AttributeError saying to pass the whole query to
    ``Database.sql`` instead.

    Every call that runs the query can be stopped: after ``timeout`` seconds (given to ``Database.sql``) and, on the
    main thread, by Ctrl-C; both raise QueryError (with ``.interrupted`` set to ``"timeout"`` or ``"sigint"``).
    """

    def __init__(self, rel: duckdb.DuckDBPyRelation, sql: str, con: duckdb.DuckDBPyConnection | None = None,
                 timeout: float | None = None, layouts: list = ()):
        self._rel, self._sql, self._con, self._timeout, self._layouts = rel, sql, con, timeout, layouts

    def _call(self, fn, *args, **kwargs):
        if self._con is None:
            guard = contextlib.nullcontext()
        else:
            guard = _Interruptible(self._con, self._timeout)
        with guard:
            try:
                out = fn(*args, **kwargs)
            except (duckdb.Error, RuntimeError) as e:
                # An interrupt surfaces as duckdb.InterruptException or, when it lands in the result fetch of
                # DuckDB's Python layer, as a bare RuntimeError("Query interrupted"): both are ours once we fired.
                if getattr(guard, "reason", None):
                    raise guard.error(self._sql) from e
                if not isinstance(e, duckdb.Error):
                    raise
                raise query_error(e, self._sql, self._layouts) from e
        return Result(out, self._sql, self._con, self._timeout, self._layouts) \
            if isinstance(out, duckdb.DuckDBPyRelation) else out

    def arrow(self) -> pa.Table:
        """All rows as a pyarrow Table."""
        return self._call(self._rel.to_arrow_table)

    def df(self):
        """All rows as a pandas DataFrame."""
        return self._call(self._rel.df)

    def fetchall(self) -> list[tuple]:
        return self._call(self._rel.fetchall)

    def scan(self, consume, batch_size: int = 2048):
        """``consume(reader)`` over the rows as a ``pyarrow.RecordBatchReader`` (batches of at most ``batch_size``
        rows), under this result's timeout and Ctrl-C handling for the whole scan (a reader handed out would
        stream unguarded); returns what ``consume`` returns. Raises QueryError like the other fetches."""
        return self._call(lambda: consume(self._rel.to_arrow_reader(batch_size)))

    # Relation methods that only run the query and hand back its rows (or print them), forwarded as they are.
    # (DuckDB 2.x dropped fetchone/fetchmany from relations: forwarded, DuckDB's own error says what to use.)
    READ_METHODS = frozenset({"fetchall", "fetchone", "fetchmany", "fetchnumpy", "fetchdf", "to_df", "pl",
                              "to_arrow_table", "fetch_arrow_table", "fetch_record_batch", "fetch_arrow_reader",
                              "to_arrow_reader", "show"})
    # Attributes that describe the result without running SQL of the caller's.
    READ_ATTRIBUTES = frozenset({"columns", "types", "dtypes", "description", "shape", "alias", "type"})

    def limit(self, n: int, offset: int = 0) -> "Result":
        """The first ``n`` rows after ``offset`` (integers), as a Result.

        Raises:
            TypeError: ``n`` or ``offset`` is not an integer (DuckDB's relation would take SQL text here).
        """
        k, skip = as_int(n), as_int(offset)
        if k is None or skip is None:  # a bool too: True is 1 to operator.index
            raise TypeError(f"limit({n!r}, {offset!r}): give integers; for other row selections put LIMIT / "
                            "OFFSET / WHERE in the query passed to db.sql")
        if k < 0 or skip < 0:
            raise TypeError(f"limit({n!r}, {offset!r}): give non-negative integers")
        return self._call(self._rel.limit, k, skip)

    def __len__(self) -> int:
        return self._call(len, self._rel)

    def __getattr__(self, name: str):
        if name.startswith("__") or (name not in self.READ_METHODS and name not in self.READ_ATTRIBUTES):
            raise AttributeError(
                f"Result has no {name!r}: results of db.sql are read-only and take no further SQL text (a DuckDB "
                f"relation's .query/.filter/.project/.order/.aggregate would run SQL the checks never see, "
                f".write_csv/.to_parquet would write files). Put the whole query in db.sql(...); write data out with "
                f"db.export() / db.export_manifest(), or fetch it (.arrow(), .df()) and write that. Available: "
                f"{sorted(self.READ_METHODS | self.READ_ATTRIBUTES | {'arrow', 'df', 'limit'})}")
        attr = getattr(self._rel, name)
        return (lambda *a, **k: self._call(attr, *a, **k)) if callable(attr) else attr

    def __repr__(self) -> str:
        return self._call(str, self._rel)

    def _repr_html_(self) -> str:
        return self._call(lambda: self._rel.limit(50).df().to_html(max_rows=50))


_LAMBDA_ARGS: dict[str, frozenset[int]] | None = None


def _lambda_args(con: duckdb.DuckDBPyConnection) -> dict[str, frozenset[int]]:
    """DuckDB's own list of the functions that take a lambda, and at which argument positions: where a 1.x
    ``x -> e`` is a lambda to rewrite (query.rewrite_lambdas); every other ``->`` is JSON extraction. Read once per
    process (~25 ms: the same for every connection of this DuckDB build; users cannot define functions), and only
    when a query has a ``->``."""
    global _LAMBDA_ARGS
    if _LAMBDA_ARGS is None:
        args: dict[str, set[int]] = {}
        for name, types in con.sql("SELECT function_name, parameter_types FROM duckdb_functions() "
                                   "WHERE list_contains(parameter_types, 'LAMBDA')").fetchall():
            args.setdefault(name.lower(), set()).update(i for i, t in enumerate(types) if t == "LAMBDA")
        _LAMBDA_ARGS = {n: frozenset(p) for n, p in args.items()}
    return _LAMBDA_ARGS


class QueryFace:
    """The SQL face both a :class:`Database` and a collection (:class:`lerobot_sql.collection.Collection`) offer:
    the checks, ``sql``, ``check``, ``views``, the lazily built video views. Needs ``_connection`` (a
    :class:`~lerobot_sql._catalog.connection.Connection`), ``_ctx`` and ``_ctx_lock``."""

    _TABLE_MACROS = macros.TABLE_MACROS  # the table macros users may call in FROM, and their columns

    def _init_queries(self, connection: Connection) -> None:
        self._connection = connection
        self._ctx: query.Context | None = None
        self._ctx_lock = threading.RLock()  # two threads' first checks build one context

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The calling thread's DuckDB connection (or cursor) with the views, created on first use: opening a
        dataset and building a whole-episode dataset need no DuckDB, so ``connect()`` reads only info.json and lists
        the files."""
        return self._connection.cursor()

    # ---- SQL ------------------------------------------------------------------------------------------------
    def views(self) -> list[str]:
        """Names of the user-facing views."""
        return sorted(v for v in self._context().views if not v.startswith("_"))

    def _context(self) -> query.Context:
        if self._ctx is None:
            with self._ctx_lock:
                return self._context_locked()
        return self._ctx

    def _context_locked(self) -> query.Context:
        if self._ctx is None:
            views: dict[str, list[str]] = {}
            for t, c in self.con.sql("SELECT table_name, column_name FROM duckdb_columns() "
                                     "WHERE NOT internal AND schema_name = 'main' ORDER BY table_name, column_index").fetchall():
                views.setdefault(t, []).append(c)
            self._ctx = query.Context(views, dict(self._TABLE_MACROS), dict(macros.MACRO_READS),
                                      functools.partial(_lambda_args, self.con))
        return self._ctx

    def _ensure_video_frames(self) -> None:
        self._connection.ensure("video_frames")

    def build_video_index(self, progress: bool | None = True) -> None:
        """Build the frame index of every mp4 (demux only, cached on disk by file identity) and point the
        ``video_frames`` view at it. Runs by itself the first time a query reads ``video_frames``.

        Args:
            progress: show a tqdm bar (None: only for 8 files or more).

        Raises:
            MissingFileError: some mp4s are missing; every other file is indexed and queryable first.
            VideoDecodeError: PyAV cannot demux a file.
        """
        self._connection.build_video_index(progress)

    def check(self, sql: str) -> str:
        """Validate user SQL (see :mod:`lerobot_sql._query.checks`) and return what DuckDB will run.

        Raises:
            QueryError: not a single read-only query over the views, with the reason and a fix.
        """
        return self._check(sql).sql

    def _check(self, sql: str) -> query.CheckedQuery:
        """:meth:`check`'s query, parsed once: the text DuckDB runs, sqlglot's tree, and what DuckDB's own parse tree
        says it reads and whether it is ordered (which builds the lazy views it reads)."""
        if not isinstance(sql, str):
            hint = (" For whole episodes pass episodes=[...] to db.dataset() or db.stats()."
                    if isinstance(sql, (list, tuple, range)) or hasattr(sql, "__index__") else "")
            raise TypeError(f"SQL must be a string (a SELECT over the views), not {type(sql).__name__} {sql!r:.80}.{hint}")
        ctx = self._context()
        checked = query.check_sql(sql, ctx)
        con = self.con
        # DuckDB's own parser must agree that this is one SELECT: a tokenizer difference between sqlglot and
        # DuckDB (quoting, comments) must never let a second statement through.
        try:
            stmts = con.extract_statements(checked.sql)
        except duckdb.Error as e:
            raise query_error(e, sql) from e
        if len(stmts) != 1 or stmts[0].type != duckdb.StatementType.SELECT:
            raise QueryError(f"DuckDB reads {len(stmts)} statement(s) of type(s) "
                             f"{[s.type.name for s in stmts]} here; only one query (SELECT) is allowed. SQL: {sql!r}")
        # ... and its parse tree, walked whole, must hold only reads of our views (query.duckdb_facts): the wall
        # that does not depend on sqlglot reading the SQL as DuckDB does.
        try:
            serialized = con.sql("SELECT json_serialize_sql($1)", params=[checked.sql]).fetchall()[0][0]
        except duckdb.Error as e:
            raise query_error(e, sql) from e
        facts = query.duckdb_facts(serialized, ctx, sql)
        # DuckDB's reading decides what the query reads and whether it is ordered.
        checked = dataclasses.replace(checked, tables=facts.relations | facts.functions, ordered=facts.ordered)
        if checked.reads(*query.VIDEO_INDEX_NAMES):
            self._connection.ensure("video_frames")
        if checked.reads("video_files"):
            self._connection.ensure("video_files")
        return checked

    def sql(self, sql: str, *, timeout: float | None = None) -> "Result":
        """Run a read-only query over the views.

        Args:
            sql: one SELECT (or WITH ... SELECT) over the views, at most 1,000,000 characters (a longer selection
                belongs in a table: ``db.dataset(pyarrow_table)`` or a join).
            timeout: seconds each run of the result (``.fetchall()``, ``.arrow()``, ``.df()`` ...) may take
                before DuckDB is interrupted; None: no limit. Ctrl-C interrupts a run on the main thread either way.

        Returns:
            :class:`Result`, a lazy DuckDB relation: ``.df()``, ``.arrow()`` (a pyarrow Table), ``.fetchall()``,
            ``.show()``; it renders as a table in Jupyter.

        Raises:
            QueryError: the SQL was rejected by the checks or failed in DuckDB (the DuckDB message is kept), also
                when the failure only shows while rows are fetched; the run hit ``timeout`` or was interrupted by
                Ctrl-C (``.interrupted`` is ``"timeout"`` / ``"sigint"``; the connection stays usable).
            ValueError: ``timeout`` is not a positive number.
        """
        timeout = _check_timeout(timeout)
        return self._run(self._check(sql), sql, timeout)

    def _run(self, checked: query.CheckedQuery, sql: str, timeout: float | None = None) -> "Result":
        """``checked`` (from :meth:`_check` of user SQL ``sql``, which errors name) as a lazy :class:`Result`."""
        con = self.con
        try:
            return Result(con.sql(checked.sql), sql, con, timeout, self._connection.layouts())
        except duckdb.Error as e:
            raise query_error(e, sql, self._connection.layouts()) from e

    def _capped_result(self, sql: str) -> tuple[query.CheckedQuery, pa.Table]:
        """The checked query and its rows, for a manifest: at most ``max_manifest_rows()``, fetched as one more so
        that a runaway query (a cross join) fails fast instead of filling RAM.

        Raises:
            ResultContractError: more rows than a manifest may have.
        """
        max_rows = max_manifest_rows()
        checked = self._check(sql)
        result = self._run(checked, sql).limit(max_rows + 1).arrow()
        if result.num_rows > max_rows:
            raise ResultContractError(
                f"the query returns more than {max_rows:,} rows, more samples than this machine's memory holds as a "
                f"manifest (about {MANIFEST_BYTES_PER_ROW} bytes per sample while it is built); check its joins (a "
                f"missing ON gives a cross product), add a LIMIT, or set LSQL_MAX_MANIFEST_ROWS: {sql!r}")
        return checked, result

    def _arrow(self, sql: str) -> pa.Table:
        return self.sql(sql).arrow()


class Database(QueryFace):
    """One dataset (its :class:`~lerobot_sql._format.files.DatasetFiles`, ``db.files``), its DuckDB connection and
    views (:class:`lerobot_sql._catalog.connection.Connection`, made on the first query). Create it with
    :func:`connect`.

    Views (full reference in docs/sql.md): ``episodes``, ``episode_stats``, ``frames``, ``tasks``, ``videos``,
    ``video_frames`` and ``video_files`` (both built on first use), ``features``, ``info``.

    Threads: one Database may be used from several threads. The thread that made the DuckDB connection uses it;
    every other thread gets its own cursor of it (``db.con`` returns the calling thread's), which shares the views,
    the sandbox settings and the lock-down, so queries of different threads run side by side.
    """

    def __init__(self, root: str | os.PathLike, *, storage_options: dict | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_size: int | str | None = None,
                 threads: int | None = None, memory_limit: str | None = None,
                 temp_directory: str | os.PathLike | None = None):
        self._init(open_files(root, storage_options=storage_options, cache_dir=cache_dir, cache_size=cache_size),
                   threads=threads, memory_limit=memory_limit, temp_directory=temp_directory)

    @classmethod
    def _of(cls, files: DatasetFiles, **settings: Any) -> "Database":
        """A Database over already opened ``files`` (a collection's members); ``settings`` as :func:`connect`'s
        DuckDB settings."""
        db = cls.__new__(cls)
        db._init(files, **settings)
        return db

    def _init(self, files: DatasetFiles, **settings: Any) -> None:
        self.files: DatasetFiles = files
        self._init_queries(Connection(self.files, **settings))
        self._pointers = None
        self._query_dirs: list[Path] = []

    @property
    def source(self) -> Source:
        """Where the dataset's bytes are (``files.source``)."""
        return self.files.source

    @property
    def layout(self) -> Layout:
        """meta/info.json and the file lists (``files.layout``)."""
        return self.files.layout

    @property
    def cache_dir(self) -> Path:
        """This dataset's cache folder (``files.cache_dir``)."""
        return self.files.cache_dir

    @property
    def fps(self) -> float:
        return self.layout.fps

    # ---- datasets -------------------------------------------------------------------------------------------
    def manifest(self, sql: str, *, cameras: list[str] | None = None, tolerance_s: float | None = None,
                 extras: bool = True, align: str = "timestamp") -> pa.Table:
        """The manifest of a query: one row per sample (see :mod:`lerobot_sql._plan.resolve` for columns and contract).

        Args:
            cameras: the cameras whose video pointers and clips are checked and recorded (default every camera;
                ``[]``: a tabular-only manifest, which needs no video metadata; ``dataset()`` refuses the manifest
                for a camera it was not resolved for).
            tolerance_s: seconds the data's ``timestamp`` may stray from ``frame_index / fps`` when more than half a
                frame (wall-clock timestamps, which lerobot reads with its ``tolerance_s``); default half a frame.
            align: ``"timestamp"`` (default: each row's timestamp must also lie in its episode's video clip) or
                ``"frame_index"`` (frames by position, as ``dataset(align="frame_index")`` reads them: timestamps
                are not bounded).
            extras: False leaves the query's extra columns out of the manifest, and so out of the checks that they
                suit a DataLoader (what :meth:`export` resolves: it writes none of them).

        Raises:
            ResultContractError: the result is empty or has none of the accepted column sets.
            DatasetFormatError: timestamps off the grid (naming the worst episodes), a missing video pointer or bad
                clip of one of ``cameras``.
        """
        checked, result = self._capped_result(sql)
        return self._resolve(result, sql, checked.ordered, cameras=cameras, tolerance_s=tolerance_s, extras=extras,
                             align=locate.check_align(align))

    def _resolve(self, result: pa.Table, sql: str, ordered: bool, con=None, *, cameras: list[str] | None = None,
                 tolerance_s: float | None = None, before: int = 0, extras: bool = True,
                 align: str = "timestamp") -> pa.Table:
        """The manifest of ``result`` (the rows of user query ``sql``), resolved with ``con`` (a function returning
        a connection whose unqualified names are this dataset's views; default: this Database's own); ``cameras``,
        ``tolerance_s``, ``extras``, ``align`` as :meth:`manifest` takes them; ``before``: a collection's samples
        resolved before these (the manifest bound is on the whole)."""
        try:
            return plan.build_manifest(con or (lambda: self.con), self.layout, result, sql=sql, ordered=ordered,
                                       src=self.source, ptr=self._episode_pointers(), cameras=cameras,
                                       tolerance_s=tolerance_s, before=before, keep_extras=extras, align=align)
        except duckdb.Error as e:  # the data files failed while the frames were resolved, or the result's types
            raise unreadable_error(self.source, self.layout, e, sql=sql) from e

    def tasks(self) -> dict[int, str]:
        """task_index -> task text, from meta/tasks.parquet (v2: meta/tasks.jsonl); read once per connection."""
        return self.files.tasks()

    def _episode_pointers(self):
        if self._pointers is None:
            self._pointers = read_pointers(self.source, self.layout)
        return self._pointers

    def _episodes_manifest(self, episodes, **kw) -> pa.Table:
        """The manifest of whole episodes (all when ``episodes`` is None), in the given order; ``kw``: ``cameras``,
        ``tolerance_s``, ``align`` as :meth:`manifest` takes them."""
        ptr = self._episode_pointers()
        if episodes is None:
            if ptr is None:  # no usable pointers: let the catalog say why
                return self.manifest("SELECT episode_index FROM episodes ORDER BY episode_index", **kw)
            ep = sorted(set(ptr["episode_index"].to_pylist()))
            sql = "SELECT episode_index FROM episodes ORDER BY episode_index"
        else:
            ep = _episode_list(episodes)
            sql = f"SELECT episode_index FROM episodes WHERE episode_index IN ({', '.join(map(str, ep))}) " \
                  "ORDER BY episode_index"
        result = pa.table({"episode_index": pa.array(ep, pa.int64())})
        try:
            return plan.build_manifest(lambda: self.con, self.layout, result, sql=sql, src=self.source, ptr=ptr, **kw)
        except duckdb.Error as e:
            raise unreadable_error(self.source, self.layout, e) from e

    def _check_links(self) -> None:
        """Refuse, with a DatasetFormatError naming file and target, a data or metadata file that is a symlink out
        of the dataset (:meth:`lerobot_sql._storage.source.Source.check_link`) before a manifest or an export reads it
        (through DuckDB, whose sandbox would say only "Permission Error"). Each file is resolved once per process;
        the mp4s are checked where they are opened (Source.local_path)."""
        lay = self.layout
        for rel in (*lay.data_files, *lay.episode_files, *(f for f in (lay.tasks_file, lay.episode_stats_file) if f)):
            self.source.check_link(rel)

    def dataset(self, sql: str | os.PathLike | pa.Table | None = None, *, episodes: list[int] | None = None,
                delta_timestamps: dict[str, list[float]] | None = None, tolerance_s: float = 1e-4,
                return_uint8: bool = False, image_transforms: Any = None, cameras: list[str] | None = None,
                stats: str | None = "selection", decoder_threads: int = 1, parallel_cameras: bool | str = "auto",
                max_open_decoders: int = 16, seek_reach: int = 2, depth_output_unit: str = "mm",
                align: str = "timestamp"):
        """A torch Dataset over the frames the query selects; items equal ``LeRobotDataset.__getitem__``'s.

        Args:
            sql: a query over the views whose result is ``index`` rows, ``(episode_index, start_s, end_s)``
                windows or ``episode_index`` rows (see docs/training.md, "Adapter contract"); or a manifest (an Arrow
                table from :meth:`manifest`, or the path of a Parquet file written by :meth:`export_manifest`);
                or None: every frame of ``episodes`` (as ``LeRobotDataset(repo_id, episodes=...)``), of all
                episodes when that is None too. Whole episodes are resolved from meta/episodes without DuckDB.
            episodes: episode_index values (only with ``sql=None``); as in ``LeRobotDataset``, a set: frames come in
                index order, each once. A custom order or repeats: use SQL (``... ORDER BY``).
            delta_timestamps: {feature key: [offsets in seconds]}, as LeRobotDataset's.
            tolerance_s: how far a frame's timestamp may be from the wanted time, seconds (lerobot's 1e-4); a
                finite number > 0, else ValueError. Whatever it is, a frame outside the row's episode's clip (and,
                beyond half a frame, another row's frame of a clip on the fps grid) is never served:
                DatasetFormatError from the item.
            align: how each row's camera frame is found. ``"timestamp"`` (default, lerobot's rule): the frame
                nearest to ``from_timestamp + timestamp`` within ``tolerance_s``. ``"frame_index"``: the row's
                ``frame_index``-th frame of its episode's clip (the first frame no earlier than half a frame
                before ``from_timestamp``, plus frame_index), ignoring the timestamps, for data whose
                ``timestamp`` column holds wall-clock times while each clip holds exactly its episode's frames on
                the fps grid (what the refusal of such timestamps recommends). Checked per mp4: the frame must lie
                at ``from_timestamp + frame_index / fps`` (within a quarter frame) and inside the clip, and each
                sample's frame_index must be its position in the episode; else DatasetFormatError.
            return_uint8: camera frames as uint8 (C, H, W) instead of float32 in [0, 1] (lerobot 0.6's option).
            image_transforms: a callable applied to each camera frame (lerobot's ``ImageTransforms``).
            cameras: subset of camera keys to return, ``[]`` for tabular-only items (default all).
            stats: what ``ds.meta.stats`` holds: ``"selection"`` (default: statistics of exactly the selected
                frames, :meth:`stats`), ``"dataset"`` (the source's meta/stats.json unchanged, what lerobot uses
                with ``episodes=[...]``; None when the file is missing) or None (no statistics).
            decoder_threads: FFmpeg threads per open file (default 1; 0 lets FFmpeg choose; at most 64).
            parallel_cameras: True, False or ``"auto"``: decode an item's cameras in threads for frames of
                320x240 and more, outside DataLoader workers.
            max_open_decoders: open containers per process, LRU (default 16; at least 1).
            seek_reach: decode forward instead of seeking when the target's keyframe is at most this many frames
                ahead (default 2; at least 0).
            depth_output_unit: ``"mm"`` (default) or ``"m"``: the unit of depth maps (``ds.meta.depth_keys``,
                float32 (1, H, W)) and of their statistics, as lerobot 0.6's option of the same name.

        Returns:
            :class:`lerobot_sql.dataset.LeRobotSQLDataset`.

        Raises:
            QueryError / ResultContractError: the SQL or its result is unusable.
            DatasetFormatError: a data, metadata or video file is a symlink to a file outside the dataset root and
                outside the hub cache's ``blobs/`` folder (see :meth:`lerobot_sql._storage.source.Source.check_link`);
                a feature is named ``task``, or ``<key>_is_pad`` for a ``delta_timestamps`` key (the item's own key
                would replace it: :func:`lerobot_sql._format.layout.check_item_keys`).
            ValueError: bad delta_timestamps (unknown key, offset off the 1/fps grid); both sql and episodes given;
                ``stats`` not one of the three choices; ``depth_output_unit`` not "mm" or "m"; ``align`` not
                "timestamp" or "frame_index";
                ``decoder_threads``, ``max_open_decoders`` or ``seek_reach`` out of range.
            TypeError: ``episodes`` holds something other than integers; ``decoder_threads``,
                ``max_open_decoders`` or ``seek_reach`` is not an integer.
        """
        from .dataset import LeRobotSQLDataset, check_decoder_options

        # before the manifest is built (seconds on a large query), not after it
        check_decoder_options(decoder_threads, max_open_decoders, seek_reach)
        locate.check_align(align)
        if stats not in ("selection", "dataset", None):
            raise ValueError(f"stats must be 'selection' (statistics of the selected frames), 'dataset' (the "
                             f"source's meta/stats.json) or None, not {stats!r}")
        self._check_links()
        if episodes is not None and sql is not None:
            raise ValueError("pass either sql or episodes, not both (a query can filter episodes itself)")
        # The manifest checks only what these items read: the chosen cameras' pointers and clips, and timestamps
        # within tolerance_s (cameras=[] needs no video metadata at all).
        kw = {"cameras": None if cameras is None else [cameras] if isinstance(cameras, str) else list(cameras),
              "tolerance_s": tolerance_s, "align": align}
        # before the manifest: its whole-episode path would meet a bad key as a bare KeyError
        self.layout.check_cameras(kw["cameras"] or [])
        if sql is None:
            manifest = self._episodes_manifest(episodes, **kw)
        elif isinstance(sql, pa.Table):
            manifest = sql
            plan_manifest.check_columns(manifest, "the table passed to dataset()")
        elif is_manifest_path(sql):
            manifest = read_manifest_file(sql, "db.export_manifest(sql, path)")
        else:
            manifest = self.manifest(sql, **kw)
        if not isinstance(sql, str) or sql.strip().endswith(".parquet"):
            if plan_manifest.COLLECTION_KEY in (manifest.schema.metadata or {}):
                # Its index / data_row values are each dataset's own: read through one dataset they are other frames.
                raise ResultContractError("a manifest of a collection (Collection.manifest), given to one dataset's "
                                          "Database: open it with the collection's dataset() (lsql.connect_many"
                                          "(...).dataset(manifest)), or select this dataset's rows in SQL")
            self._check_manifest_source(manifest, sql)
        tasks = self.tasks()
        wanted = pc.unique(manifest["task_index"]).drop_null().to_pylist() if "task_index" in manifest.column_names \
            else []
        unknown = sorted(t for t in wanted if t not in tasks)
        if unknown:
            # Items carry the task text (as LeRobotDataset's do); a None would fail much later, in collate.
            where = self.source.path(self.layout.tasks_file) if self.layout.tasks_file else \
                self.source.path("meta/tasks.jsonl" if self.layout.legacy else "meta/tasks.parquet")
            err = DatasetFormatError if self.layout.tasks_file else MissingFileError
            raise err(f"{where}: no task text for task_index {unknown[:5]} of the selected frames"
                      f"{'' if self.layout.tasks_file else ' (the file is missing)'}; items carry the task text as "
                      "LeRobotDataset's do. Restore the file from the dataset's source (`lerobot-sql doctor`: "
                      "tasks_exist)")
        if stats == "selection":
            def stats_fn(db=self, m=manifest):
                return db.stats(m)
        elif stats == "dataset":
            def stats_fn(db=self):
                return db.stats() if db.source.exists("meta/stats.json") else None
        else:
            stats_fn = None
        return LeRobotSQLDataset(self.files, manifest, delta_timestamps=delta_timestamps, tolerance_s=tolerance_s,
                                 return_uint8=return_uint8, image_transforms=image_transforms, cameras=cameras,
                                 decoder_threads=decoder_threads, parallel_cameras=parallel_cameras,
                                 max_open_decoders=max_open_decoders, seek_reach=seek_reach, stats=stats_fn,
                                 depth_output_unit=depth_output_unit, align=align)

    def _check_manifest_source(self, manifest: pa.Table, where) -> None:
        """Refuse a manifest written from another dataset (``export_manifest`` stores its ``root``): its data_file,
        data_row and index values point into that dataset, so read through this one they give other frames.

        Accepted when the roots are the same folder, or when the manifest's ``dataset_id`` (info.json's version,
        totals, fps and features; :func:`lerobot_sql.export.dataset_identity`) equals this dataset's: a copied or
        moved dataset.

        Raises:
            ResultContractError: naming both roots and the fix; or naming the file, its metadata is not a JSON object
                (invalid, nested too deeply).
        """
        from .export import dataset_identity

        name = where if isinstance(where, (str, os.PathLike)) else "the manifest table"
        meta = plan_manifest.Meta.of(manifest, where=str(name))  # the one parser of it; a file's errors name it
        root = meta.root
        if not isinstance(root, str) or not root:
            return  # db.manifest()'s own tables carry no root
        here = self.source.url

        def same(a: str, b: str) -> bool:
            if "://" in a or "://" in b:
                return a.rstrip("/") == b.rstrip("/")
            return os.path.realpath(a) == os.path.realpath(b)

        if same(root, here) or meta.dataset_id == dataset_identity(self.layout):
            return
        why = ("its info.json differs from this one (version, total_episodes, total_frames, fps or features)"
               if meta.dataset_id else "it records no dataset identity to compare")
        raise ResultContractError(
            f"{name}: a manifest of the dataset at {root}, opened through the dataset at {here}; {why}, so its "
            f"data_file/data_row/index values would give this dataset's other frames. Open it through its own "
            f"dataset (lsql.connect({root!r}).dataset(...)), or write a manifest from this one with "
            f"db.export_manifest(sql, path). A copy of the dataset with the same info.json is accepted as is")

    # ---- delegated capabilities (each lives in its own module) ------------------------------------------------
    def named_query(self, name: str, **params: Any) -> duckdb.DuckDBPyRelation:
        """Run a named query from ``queries/`` (or a folder added with ``add_query_dir``) with parameters.

        ``db.dataset(db.named_query_sql(name, **params))`` turns it into a training set.
        ``lerobot-sql query DATASET --name NAME --param k=v`` is the CLI form.

        Raises:
            QueryError: unknown name (with a did-you-mean), a missing or mistyped parameter, or the query fails.
        """
        return self.sql(self.named_query_sql(name, **params))

    query = named_query  # its name in 0.1; kept as an alias

    def named_query_sql(self, name: str, **params: Any) -> str:
        """The SQL text of named query ``name`` with ``params`` filled in (each value type-checked and quoted by
        the library's parameter rules), e.g. to pass to :meth:`dataset` or :meth:`export`.

        Raises:
            QueryError: unknown name or a missing / mistyped parameter.
        """
        from ._query import library

        return library.render(name, params, extra_dirs=self._query_dirs, vectors=self._vector_columns())

    def _vector_columns(self) -> dict[str, str]:
        """The numeric vector features of ``frames`` (name -> DuckDB type; :func:`macros.vector_features`, the ones
        frames_ext differentiates): what a ``vector`` parameter of a named query may name (idle_segments' ``feature``), so that a scalar or text column is refused by name before the
        SQL runs, not by DuckDB's "Parameter type needs to be List"."""
        frame_cols = {r[0]: r[1] for r in self.con.sql("DESCRIBE frames").fetchall()}
        return {name: frame_cols[name] for name, _n, _names in macros.vector_features(self.layout, frame_cols)}

    def stats(self, sql: str | pa.Table | None = None, *, episodes: list[int] | None = None
              ) -> dict[str, dict[str, Any]]:
        """Statistics in lerobot's ``meta/stats.json`` form: ``{feature: {"min", "max", "mean", "std", "count"
        [, "q01".."q99"]}}`` of numpy arrays (vectors ``(D,)``, cameras ``(3, 1, 1)`` in [0, 1], ``count`` int64
        ``(1,)``), what lerobot's ``LeRobotDatasetMetadata.stats`` holds.

        ``sql``: a selection as :meth:`dataset` takes it (SQL text or a manifest table); or ``episodes``: whole
        episodes, as ``db.dataset(episodes=[...])``. Numeric features are computed by DuckDB over exactly the
        selected samples; cameras are aggregated from the per-episode statistics of the episodes the selection
        touches, as lerobot's ``aggregate_stats`` does (:mod:`lerobot_sql.stats` says what is exact). Without
        ``sql``: the source's ``meta/stats.json`` unchanged, which is what lerobot uses even with ``episodes=[...]``.

        Raises:
            MissingFileError: no ``sql`` and the dataset has no meta/stats.json.
            DatasetFormatError: no ``sql`` and meta/stats.json is not valid JSON, or a statistic is not numbers or
                its size does not fit the feature's info.json shape (naming the file, feature and statistic).
            ValueError: the selection is empty.
            QueryError, ResultContractError: as :meth:`manifest`.
        """
        from . import stats

        if episodes is not None:
            if sql is not None:
                raise ValueError("pass either sql or episodes, not both (a query can filter episodes itself)")
            sql = self._episodes_manifest(episodes)
        if sql is None:
            if not self.source.exists("meta/stats.json"):
                raise MissingFileError(f"{self.source.path('meta/stats.json')}: this dataset has no meta/stats.json; "
                                       "db.stats('SELECT episode_index FROM episodes') computes them from the data")
            with self.source.open("meta/stats.json") as f:
                text = f.read()
            return stats.from_json(text, self.source.path("meta/stats.json"), self.layout)
        if isinstance(sql, pa.Table):
            plan_manifest.check_columns(sql, "the table passed to stats()")
        manifest = sql if isinstance(sql, pa.Table) else self.manifest(sql)
        return self._selection_stats(manifest)

    def _selection_stats(self, manifest: pa.Table, con: duckdb.DuckDBPyConnection | None = None) -> dict:
        """:func:`lerobot_sql.stats.selection_stats` of this dataset's ``manifest``, quantiles when the source's
        statistics have them; ``con``: a connection whose unqualified names are this dataset's views (default its
        own)."""
        from . import stats

        con = con or self.con
        has_q = bool(con.sql("SELECT 1 FROM episode_stats WHERE stat = 'q01' LIMIT 1").fetchall())
        return stats.selection_stats(con, self.layout, manifest, quantiles=has_q)

    @property
    def query_dirs(self) -> list[Path]:
        """User folders of named ``.sql`` queries, searched in this order before the bundled ``queries/``."""
        return list(self._query_dirs)

    def add_query_dir(self, path: str | os.PathLike) -> None:
        """Add a folder of ``.sql`` files to the named-query library (searched before the bundled ``queries/``).

        Raises:
            MissingFileError: ``path`` is not an existing folder (a typo would otherwise show only later, as an
                unknown query name).
        """
        p = Path(path)
        if not p.is_dir():
            what = "is a file, not a folder" if p.exists() else "does not exist"
            raise MissingFileError(f"add_query_dir: {p} (resolved to {p.resolve()}) {what}; pass the folder holding "
                                   "your .sql files")
        self._query_dirs.insert(0, p)

    def nearest(self, *args: Any, **kwargs: Any) -> pa.Table:
        """For given timestamps, the k nearest samples of named streams (see :func:`lerobot_sql.nearest.nearest`)."""
        from . import nearest as temporal

        return temporal.nearest(self, *args, **kwargs)

    def export(self, sql: str, dest: str | os.PathLike, **kwargs: Any):
        """Write the query's frames as a new LeRobot v3.0 dataset (see :func:`lerobot_sql.export.export_dataset`)."""
        from . import export

        self._check_links()
        return export.export_dataset(self, sql, dest, **kwargs)

    def export_manifest(self, sql: str, path: str | os.PathLike, **kwargs: Any):
        """Write the query's manifest as Parquet (see :func:`lerobot_sql.export.export_manifest`)."""
        from . import export

        self._check_links()
        return export.export_manifest(self, sql, path, **kwargs)

    def io_stats(self) -> dict[str, int]:
        """Bytes and requests read from the dataset's storage: requests, bytes_fetched, bytes_from_cache."""
        return self.source.io_stats()

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        i = self.layout.info
        return (f"Database({self.source.url!r}, {self.layout.version}, episodes={i.get('total_episodes')}, "
                f"frames={i.get('total_frames')}, fps={self.fps:g}, cameras={self.layout.camera_keys})")


def is_manifest_path(sql: Any) -> bool:
    """True when ``dataset()``'s first argument names a saved manifest (a path, or text ending in .parquet)."""
    return isinstance(sql, os.PathLike) or (isinstance(sql, str) and sql.strip().endswith(".parquet")
                                            and " " not in sql.strip())


def read_manifest_file(path: str | os.PathLike, how: str) -> pa.Table:
    """The manifest saved at ``path`` (Parquet, schema metadata kept).

    Raises:
        MissingFileError: no such file, naming ``how`` one is written.
    """
    import pyarrow.parquet as pq

    path = os.path.expanduser(os.fspath(path))  # as export_manifest writes "~/m.parquet"
    if not os.path.exists(path):
        raise MissingFileError(f"{path}: manifest file not found; write one with {how}, or pass a query instead")
    table = pq.read_table(path)
    plan_manifest.check_columns(table, path)
    return table


def _episode_list(episodes: Any) -> list[int]:
    """Sorted distinct episode_index values, as ``LeRobotDataset(..., episodes=...)`` treats its list (a set: frames
    follow the dataset's order). Accepts ints, numpy integers, 0-d integer tensors, any iterable of them.

    Raises:
        TypeError: a value is not an integer (a float, bool or string would silently pick another episode).
        ResultContractError: the list is empty.
    """
    items = [episodes] if not hasattr(episodes, "__iter__") or isinstance(episodes, (str, bytes)) else list(episodes)
    out = set()
    for e in items:
        v = as_int(e)
        if v is None:
            raise TypeError(f"episodes holds {e!r} ({type(e).__name__}); pass episode_index integers, e.g. "
                            "episodes=[0, 3, 17]")
        out.add(v)
    if not out:
        raise ResultContractError("episodes=[] selects nothing; pass episode_index values, or None for all")
    return sorted(out)


def connect(root: str | os.PathLike, **kwargs: Any) -> Database:
    """Open a LeRobot dataset. Reads meta/info.json and lists the files; copies no table.

    The DuckDB connection and its views are made on the first query (``db.sql``, ``db.con``, a SQL ``dataset``):
    ``connect(root).dataset()`` / ``.dataset(episodes=[...])`` need no DuckDB at all.

    Args:
        root: the dataset root (the folder holding meta/, data/, videos/): a local path, an fsspec URL
            (``https://``, ``s3://``, ...), or a Hugging Face Hub dataset (``hf://datasets/ORG/NAME[@REVISION]``;
            a bare ``ORG/NAME`` is one when no local folder of that name exists, so such a path, mistyped, is also
            looked up on the Hub: the error then gives both readings).
        storage_options: passed to fsspec for remote roots.
        cache_dir: where the video index, tabular and remote-bytes caches go (default ``$LSQL_CACHE_DIR`` or
            ``~/.cache/lerobot_sql``, one folder per dataset).
        cache_size: bound of the remote-bytes cache (bytes, or a string like ``"20GB"``; default 50 GiB),
            least-recently-read pieces are evicted first. Local datasets are read in place.
        threads, memory_limit: DuckDB settings (e.g. ``threads=2, memory_limit="8GB"``); defaults: all cores,
            min(RAM / 4, 4 GiB), which holds at 30M frames on a 24 GB machine.
        temp_directory: where DuckDB spills when a query exceeds memory_limit (default
            ``<cache_dir>/duckdb_tmp``).

    Raises:
        TypeError: ``root`` is not a path or a string (``None``).
        MissingFileError: no meta/info.json (or no data / episode files) under ``root``; ``root`` is a URL of a
            protocol no fsspec filesystem knows (``foo://x``); a bare ``ORG/NAME`` that is neither a local folder nor
            a Hub dataset (also when the Hub cannot be reached and ``ORG`` is a local folder: ``sample/nope``).
        RemoteIOError: a remote root, or the Hub for a bare ``ORG/NAME``, cannot be reached (after retries).
        UnsupportedVersionError: the dataset's codebase_version is not v2.0, v2.1 or v3.x (v2.x datasets are read
            as they are, without conversion).
        DatasetFormatError: info.json is malformed. Malformed metadata files (meta/episodes, tasks, data footers)
            raise DatasetFormatError on first use, naming the file.
    """
    return Database(root, **kwargs)
