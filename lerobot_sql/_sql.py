"""The SQL face of a Database and a Collection: user SQL checked, then run, and its lazy result.

:class:`QueryFace` is the check-then-run base both faces share: the sqlglot checks
(:mod:`lerobot_sql._query.checks`), DuckDB's own parse of the same text (:mod:`lerobot_sql._query.tree_facts`: the
second look, which decides what the query reads), then the run. :class:`Result` is what ``db.sql`` returns: reading
methods only, every run under its timeout and Ctrl-C (:class:`_Interruptible`, which raises
:class:`~lerobot_sql.errors.QueryInterrupted`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import signal
import stat
import threading

import duckdb
import pyarrow as pa

from ._catalog import macros, sandbox, sidecars
from ._catalog.connection import MANIFEST_BYTES_PER_ROW, Connection, max_manifest_rows, query_error
from ._query import checks, tree_facts
from .errors import (
    DatasetFormatError,
    MissingFileError,
    QueryError,
    QueryInterrupted,
    RemoteIOError,
    ResultContractError,
    as_int,
    as_real,
)

_wake_lock = threading.Lock()
# (read end, write end, (device, inode) of the pipe, the watcher thread) of the signal watcher's pipe
_wake_fds: tuple[int, int, tuple[int, int], threading.Thread] | None = None
_armed: list["_Interruptible"] = []  # the guards on the main thread whose handlers are installed now


def _still_ours(fds) -> bool:
    """Whether the pipe is still open under its numbers and its watcher alive: code elsewhere in the process that
    closes a descriptor number twice can close it, and then the number may name another file, which signal bytes
    must never be written to."""
    r, w, ident, thread = fds
    try:
        return thread.is_alive() and all((st.st_dev, st.st_ino) == ident and stat.S_ISFIFO(st.st_mode)
                                         for st in (os.fstat(r), os.fstat(w)))
    except OSError:
        return False


def _wake_fd() -> int:
    """The write end of the pipe that :func:`signal.set_wakeup_fd` makes Python's C-level signal handler write each
    signal's number to, at the moment the signal arrives; a daemon thread reads it (:func:`_watch`). Made on first
    use, once per process (a forked child makes its own: :func:`_forget_wake_fds`), and again if it was closed."""
    global _wake_fds
    with _wake_lock:
        if _wake_fds is None or not _still_ours(_wake_fds):
            r, w = os.pipe()
            os.set_blocking(w, False)  # set_wakeup_fd requires it: the C handler must never block
            thread = threading.Thread(target=_watch, args=(r,), name="lerobot_sql-signals", daemon=True)
            thread.start()
            st = os.fstat(r)
            _wake_fds = (r, w, (st.st_dev, st.st_ino), thread)
        return _wake_fds[1]


def _watch(r: int) -> None:
    """Forever: each signal number the C handler wrote, to the armed guards (off the main thread, which is inside
    DuckDB and runs no Python until the query returns)."""
    while True:
        try:
            data = os.read(r, 64)
        except OSError:  # the pipe was closed (interpreter shutdown)
            return
        if not data:
            return
        for signum in data:
            for guard in list(_armed):
                guard._on_signal(signum)


def _forget_wake_fds() -> None:
    # A forked child (DataLoader worker) has the pipe but not the thread that reads it: it makes its own.
    global _wake_fds
    _wake_fds = None
    _armed.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_wake_fds)


class _Interruptible:
    """While a query runs: ``timeout`` seconds on a timer, and on the main thread Ctrl-C (SIGINT), each call
    ``con.interrupt()``, which stops DuckDB within milliseconds (Python's own SIGINT handling waits for the query to
    end, which may be never). The connection stays usable afterwards.

    Ctrl-C: a Python signal handler runs on the main thread, and only when that thread runs Python again. DuckDB's
    Python layer checks for signals between execution tasks, but when the main thread itself executes a long task
    (always with ``threads=1``, often with more: a filtered cross join is one task for minutes) no check comes until
    the query ends. So while the guard is armed, ``signal.set_wakeup_fd`` has the C-level handler write the signal's
    number to a pipe the moment it arrives, and a watcher thread (:func:`_watch`) calls ``con.interrupt()``; the
    Python handler stays installed too, for the signal check DuckDB does make. A wakeup fd that someone else had set
    (asyncio) gets each signal number forwarded, and is restored after the block.

    The timeout has two clocks. A ``threading.Timer`` works on any thread but needs the GIL to run its callback. On
    the main thread, when nobody else uses SIGALRM (pytest-timeout's signal method does; then only the Timer runs),
    an interval timer (``setitimer(ITIMER_REAL)``) also fires, every second after ``timeout``; its handler and the
    signal watcher each call ``con.interrupt()``.

    What neither bounds: DuckDB checks the interrupt flag only between chunks of work, so one value that takes long
    to build (``printf('%01000000000d', 1)``, measured: interrupted 1 s in, ended 3.8 s in) runs to its end; the
    query checks refuse such values before the query runs (``tree_facts.MAX_GENERATED``). A Python callback of the
    query's (the fsspec filesystem of a remote root) blocked in I/O returns first.

    After the block: ``reason`` is None, ``"timeout"`` or ``"sigint"``. A Ctrl-C that arrives just as the query ends
    is not lost: it is raised as KeyboardInterrupt.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, timeout: float | None):
        self.con, self.timeout, self.reason = con, timeout, None
        self._timer: threading.Timer | None = None
        self._old_handler = None
        self._old_alarm = None
        self._old_wakeup: int | None = None  # set: the wakeup fd is ours for the block, this was the one before
        # The interrupt is repeated until the block ends: DuckDB forgets an interrupt that lands before the query
        # executes (while it is bound and planned, which takes seconds on a loaded machine), and the query then ran
        # to its end. Re-entrant: the Python SIGINT handler runs on the main thread, maybe inside __exit__'s lock.
        self._lock = threading.RLock()
        self._ended = threading.Event()
        self._repeater: threading.Thread | None = None

    def _fire(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._interrupt()
        with self._lock:
            if self._repeater is None and not self._ended.is_set():
                self._repeater = threading.Thread(target=self._repeat, name="lerobot_sql-interrupt", daemon=True)
                self._repeater.start()

    def _interrupt(self) -> None:
        """``con.interrupt()`` unless the block has ended (the next query on the connection is not this one's)."""
        with self._lock:
            if self._ended.is_set():
                return
            try:
                self.con.interrupt()
            except duckdb.Error:  # the connection was closed meanwhile
                pass

    def _repeat(self) -> None:
        while not self._ended.wait(0.2):
            self._interrupt()

    def _on_signal(self, signum: int) -> None:
        """The watcher thread's call for each signal that arrived while this guard is armed."""
        if signum == signal.SIGINT and self._old_handler is not None:
            self._fire("sigint")
        elif signum == signal.SIGALRM and self._old_alarm is not None:
            self._fire("timeout")
        old = self._old_wakeup
        if old is not None and old >= 0:  # the wakeup fd we replaced (asyncio's) still learns of every signal
            with contextlib.suppress(OSError):
                os.write(old, bytes([signum]))

    def _arm(self) -> None:
        """Take the wakeup fd for the block (see the class docstring); without it only DuckDB's own signal checks
        run the handlers."""
        try:
            self._old_wakeup = signal.set_wakeup_fd(_wake_fd(), warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread of the main interpreter, or no pipe
            self._old_wakeup = None
            return
        _armed.append(self)

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
        if self._old_handler is not None or self._old_alarm is not None:
            self._arm()
        return self

    def __exit__(self, typ, exc, tb) -> None:
        with self._lock:
            self._ended.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._old_wakeup is not None:
            with contextlib.suppress(ValueError):
                _armed.remove(self)
            signal.set_wakeup_fd(self._old_wakeup)
        if self._old_alarm is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)  # first stop the clock, then give SIGALRM back
            signal.signal(signal.SIGALRM, self._old_alarm)
        if self._old_handler is not None:
            signal.signal(signal.SIGINT, self._old_handler)
        if typ is None and self.reason == "sigint":
            raise KeyboardInterrupt

    def error(self, sql: str) -> QueryInterrupted:
        """The error for a run this guard stopped (``reason`` set), naming why and ``sql``."""
        if self.reason == "timeout":
            return QueryInterrupted(f"the query was stopped at its timeout of {self.timeout:g} s (timeout=...; CLI "
                                    f"--timeout); the connection is still usable. SQL: {sql}", "timeout")
        return QueryInterrupted.ctrl_c(sql)


@contextlib.contextmanager
def _ctrl_c_is_query_interrupted(sql: str):
    """A Ctrl-C that DuckDB's own signal check saw outside a run's guard (while the query is checked, bound or
    narrowed: DuckDB's Python layer raises a bare ``RuntimeError("Query interrupted")`` there) raised as the
    guarded run's would be: :class:`QueryInterrupted` ``.reason == "sigint"`` naming ``sql``. (DuckDB words an
    exception that another signal's Python handler raised there, an application's SIGALRM limit, the same way and
    drops it: unguarded, the two cannot be told apart; a guarded run tells them, see :meth:`Result._call`.)"""
    try:
        yield
    except RuntimeError as e:
        if sandbox.interrupted_by_signal(e):
            raise QueryInterrupted.ctrl_c(sql) from e
        raise


def check_timeout(timeout: float | None) -> float | None:
    """``timeout`` as seconds (None: no limit).

    Raises:
        ValueError: not a positive finite number.
    """
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
    main thread, by Ctrl-C; both raise :class:`~lerobot_sql.errors.QueryInterrupted` (a QueryError, its ``.reason``
    ``"timeout"`` or ``"sigint"``).
    """

    def __init__(self, rel: duckdb.DuckDBPyRelation, sql: str, con: duckdb.DuckDBPyConnection | None = None,
                 timeout: float | None = None, layouts: list = (), pin: object = None):
        # pin: what keeps the rows a narrowed query reads registered while this result (or one made from it) may
        # run (lerobot_sql._catalog.frames_part.Pin)
        self._rel, self._sql, self._con, self._timeout, self._layouts = rel, sql, con, timeout, layouts
        self._pin = pin

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
                # A bare one while the guard holds SIGINT (its handler never raises) is another signal's handler
                # raising (the application's SIGALRM or SIGTERM): no Ctrl-C, DuckDB's error as it is.
                if not isinstance(e, duckdb.Error) and (not sandbox.interrupted_by_signal(e) or
                                                        getattr(guard, "_old_handler", None) is not None):
                    raise
                raise query_error(e, self._sql, self._layouts) from e
        return Result(out, self._sql, self._con, self._timeout, self._layouts, self._pin) \
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
    ``x -> e`` is a lambda to rewrite (:func:`lerobot_sql._query.lambdas.rewrite_lambdas`); every other ``->`` is
    JSON extraction. Read once per process (~25 ms: the same for every connection of this DuckDB build; users cannot
    define functions), and only when a query has a ``->``."""
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
        self._ctx: checks.Context | None = None
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

    def _context(self) -> checks.Context:
        if self._ctx is None:
            with self._ctx_lock:
                return self._context_locked()
        return self._ctx

    def _context_locked(self) -> checks.Context:
        if self._ctx is None:
            views: dict[str, list[str]] = {}
            for t, c in self.con.sql("SELECT table_name, column_name FROM duckdb_columns() "
                                     "WHERE NOT internal AND schema_name = 'main' ORDER BY table_name, column_index").fetchall():
                views.setdefault(t, []).append(c)
            self._ctx = checks.Context(views, dict(self._TABLE_MACROS), dict(macros.MACRO_READS),
                                      functools.partial(_lambda_args, self.con))
        return self._ctx

    def _fresh_context(self) -> checks.Context:
        """The checks' context made again (a view was built or attached since)."""
        with self._ctx_lock:
            self._ctx = None
            return self._context_locked()

    def attach(self, name: str, path: str | os.PathLike, *, replace: bool = False, format: str | None = None,
               storage_options: dict | None = None) -> None:
        """Make the user's own table file a view ``name``, so that it joins the dataset's views in one query
        (``SELECT episode_index FROM episodes JOIN keep USING (episode_index)``).

        The file is read once, whole, by this process (not by DuckDB: the connection still reads nothing outside the
        dataset and its cache), and held in memory as an Arrow table; the view reads that table, and no SQL can
        change it. A collection's attached view is one table beside the union views (join on ``dataset`` too).

        Args:
            name: the view's name: a letter, then letters, digits or ``_``; not an SQL keyword, not a view of the
                dataset (``episodes``, a sidecar's ...).
            path: a local file (any path this process may read: the user's own, not confined to the dataset root)
                or an fsspec URL (``https://``, ``s3://``, ``hf://`` ...). Parquet (``.parquet``), CSV (``.csv``:
                a header row, types inferred by pyarrow), JSON (``.json``: the rule of the sidecar views, docs/sql.md)
                or JSON lines (``.jsonl``).
            replace: replace a table attached before under ``name`` (never one of the dataset's views).
            format: ``"parquet"``, ``"csv"``, ``"json"`` or ``"jsonl"`` when the extension does not say.
            storage_options: passed to fsspec for a URL.

        Raises:
            TypeError: ``name`` is not a string.
            QueryError: ``name`` is not a plain name, is a keyword, a view's name, or attached already (without
                ``replace=True``).
            MissingFileError: no such file (or a folder, or a URL that cannot be opened).
            DatasetFormatError: the file is not a table of its format (naming the file).
            ValueError: the format cannot be told from the extension (pass ``format=``).
        """
        from ._format.sidecar_files import read_user_table

        self._connection.attach_name(name, replace)  # before the file is read (and again when it is made a view)
        table, as_json = read_user_table(path, format=format, storage_options=storage_options)
        self._connection.attach(name, table, as_json, replace, where=str(path))
        self._fresh_context()

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

    def quality_thresholds(self, **changes: float) -> dict[str, float]:
        """The thresholds behind the ``episode_quality`` view's ``verdict`` (docs/curate.md lists each with its
        reason), after ``changes``; with changes, later reads of the view use them (its facts are not read again).

        Example: ``db.quality_thresholds(spike_z=40, frozen_frac=0.8)``.

        Raises:
            TypeError: a name that is no threshold. ValueError: a value that is not a finite number >= 0.
        """
        conn = self._connection
        if changes:
            t = conn.quality_thresholds.changed(**changes)
            with conn._build_lock:
                conn.quality_thresholds = t
                if conn._ready["episode_quality"]:
                    conn._quality_views()
        return dataclasses.asdict(conn.quality_thresholds)

    def check(self, sql: str) -> str:
        """Validate user SQL (see :mod:`lerobot_sql._query.checks`) and return what DuckDB will run.

        Raises:
            QueryError: not a single read-only query over the views, with the reason and a fix.
        """
        return self._check(sql).sql

    def _check(self, sql: str) -> checks.CheckedQuery:
        """:meth:`check`'s query, parsed once: the text DuckDB runs, sqlglot's tree, and what DuckDB's own parse tree
        says it reads and whether it is ordered (which builds the lazy views it reads)."""
        if not isinstance(sql, str):
            hint = (" For whole episodes pass episodes=[...] to db.dataset() or db.stats()."
                    if isinstance(sql, (list, tuple, range)) or hasattr(sql, "__index__") else "")
            raise TypeError(f"SQL must be a string (a SELECT over the views), not {type(sql).__name__} {sql!r:.80}.{hint}")
        ctx = self._context()
        # A sidecar view the query names is built first (its file's columns replace the placeholder's), so that the
        # checks know its columns.
        if self._connection.ensure_sidecars(sidecars.mentioned(sql, self._connection.unbuilt_sidecars()), strict=False):
            ctx = self._fresh_context()
        checked = checks.check_sql(sql, ctx)
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
        # ... and its parse tree, walked whole, must hold only reads of our views (tree_facts.duckdb_facts): the wall
        # that does not depend on sqlglot reading the SQL as DuckDB does.
        try:
            serialized = con.sql("SELECT json_serialize_sql($1)", params=[checked.sql]).fetchall()[0][0]
        except duckdb.Error as e:
            raise query_error(e, sql) from e
        facts = tree_facts.duckdb_facts(serialized, ctx, sql)
        # DuckDB's reading decides what the query reads and whether it is ordered.
        checked = dataclasses.replace(checked, tables=facts.relations | facts.functions, ordered=facts.ordered,
                                      duckdb_tree=serialized)
        if self._connection.ensure_sidecars([n for n in self._connection.unbuilt_sidecars() if checked.reads(n)]):
            # (strict: a view this query really reads and whose file is broken raises here, naming the file)
            self._fresh_context()
            return self._check(sql)  # (never seen: a query names every view it reads; mentioned() finds them)
        if checked.reads(*checks.VIDEO_INDEX_NAMES):
            self._connection.ensure("video_frames")
        if checked.reads("video_files"):
            self._connection.ensure("video_files")
        if checked.reads("episode_quality"):
            self._connection.ensure("episode_quality")
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
                Ctrl-C: then it is a :class:`~lerobot_sql.errors.QueryInterrupted`, ``.reason`` ``"timeout"`` /
                ``"sigint"``; the connection stays usable.
            ValueError: ``timeout`` is not a positive number.
        """
        timeout = check_timeout(timeout)
        with _ctrl_c_is_query_interrupted(sql):
            return self._run(self._check(sql), sql, timeout)

    def _run(self, checked: checks.CheckedQuery, sql: str, timeout: float | None = None) -> "Result":
        """``checked`` (from :meth:`_check` of user SQL ``sql``, which errors name) as a lazy :class:`Result`."""
        con = self.con
        if checked.duckdb_tree:
            # (a WHERE that bounds episode_index or index: only the row groups that may hold its rows are read;
            # DuckDB would weigh the statistics of every row group of every data file, ~1.5 s at 100,000)
            # (a bounding subquery over the metadata views is run here, alone, before the Result exists: under the
            # query's timeout and Ctrl-C too, or a slow one, a cross join of episodes, held db.sql() unbounded; a
            # guard per run, around the DuckDB run only: Ctrl-C reading a part with pyarrow stays KeyboardInterrupt)
            guards: list[_Interruptible] = []

            def guard() -> _Interruptible:
                guards.append(_Interruptible(con, timeout))
                return guards[-1]

            try:
                got = self._connection.narrowed(checked.sql, checked.duckdb_tree, guard)
            except (RemoteIOError, MissingFileError, DatasetFormatError) as e:
                raise type(e)(f"{e} (while running: {sql})") from e  # (as query_error names a view's failure)
            except RuntimeError as e:  # (an interrupt landing in DuckDB's Python layer: a bare RuntimeError)
                stopped = next((g for g in guards if g.reason), None)
                if stopped is not None:
                    raise stopped.error(sql) from e
                raise
            stopped = next((g for g in guards if g.reason), None)
            if stopped is not None:  # (the interrupted subquery gave no values: the answer is not made without them)
                raise stopped.error(sql)
            if got is not None:
                try:
                    return Result(con.sql(got[0]), sql, con, timeout, self._connection.layouts(), got[1])
                except duckdb.Error:
                    pass  # (a query DuckDB refuses: its error as it reads the query the user wrote, below)
        try:
            return Result(con.sql(checked.sql), sql, con, timeout, self._connection.layouts())
        except duckdb.Error as e:
            raise query_error(e, sql, self._connection.layouts()) from e

    def _capped_result(self, sql: str) -> tuple[checks.CheckedQuery, pa.Table]:
        """The checked query and its rows, for a manifest: at most ``max_manifest_rows()``, fetched as one more so
        that a runaway query (a cross join) fails fast instead of filling RAM.

        Raises:
            ResultContractError: more rows than a manifest may have.
        """
        max_rows = max_manifest_rows()
        with _ctrl_c_is_query_interrupted(sql):
            checked = self._check(sql)
            run = self._run(checked, sql)
        result = run.limit(max_rows + 1).arrow()  # (a guarded run: Result._call tells a Ctrl-C from other signals)
        if result.num_rows > max_rows:
            raise ResultContractError(
                f"the query returns more than {max_rows:,} rows, more samples than this machine's memory holds as a "
                f"manifest (about {MANIFEST_BYTES_PER_ROW} bytes per sample while it is built); check its joins (a "
                f"missing ON gives a cross product), add a LIMIT, or set LSQL_MAX_MANIFEST_ROWS: {sql!r}")
        return checked, result

    def _arrow(self, sql: str) -> pa.Table:
        return self.sql(sql).arrow()
