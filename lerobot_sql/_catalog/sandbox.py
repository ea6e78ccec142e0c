"""DuckDB's own lock-down, the second wall behind :mod:`lerobot_sql._query.checks`'s checks, and resource defaults.

``_query.checks.check_sql`` (the first wall) lets only one read-only query over our views through ``Database.sql``. But a
user also holds ``db.con``, and a check can have a gap. After the views exist, :func:`lock_down` turns off DuckDB's
external access except for the dataset root and our cache folder, and locks the configuration. Then no SQL on this
connection can read or list files elsewhere, attach a database, install or load an extension, or undo these
settings, whichever route it takes (a table function in a subquery, a path string in FROM, ``COPY``, ``ATTACH``,
``INSTALL``/``LOAD``, ``SET``/``PRAGMA``/``RESET``).

What the lock does not cover: DuckDB's ``allowed_directories`` grants reading *and writing*. A ``COPY ... TO``
inside the dataset root or the cache is stopped only by the first wall (``Database.sql`` accepts only queries, and
a query cannot write files). Remote roots are fsspec filesystems registered on the connection
(``lsqlremote://...``): DuckDB reaches them through the registered Python filesystem, which
``enable_external_access=false`` does not cut off; allowed_directories names their URL prefix too.

The first wall also walks DuckDB's own parse tree (``_query.tree_facts.duckdb_facts``), and nothing lerobot_sql
reads back is a DuckDB base table (views over Parquet or registered Arrow tables, ``views.register_table``), so
no SQL on the connection, first wall or not, can UPDATE, DELETE or INSERT the metadata behind ``dataset()``. Each
thread other than the connection's owner uses a cursor of it (``Database.con``); the settings here are the
database's, so they hold for every cursor (``tests/test_security.py::test_one_database_from_four_threads``).

DuckDB references: "Securing DuckDB" (enable_external_access, allowed_directories, allowed_paths,
lock_configuration, autoload/autoinstall of extensions).
"""

from __future__ import annotations

import os
import re

import duckdb

from ..errors import LeRobotSQLError, as_int

# Resource defaults for a small training box (2 cores, 24 GB): DuckDB only plans manifests and answers queries
# while DataLoader workers and the decoders need the rest of the memory, so it gets a quarter of RAM, at most 4 GiB
# (DuckDB's own default is 80% of RAM); beyond it, sorts and joins spill to the temp directory. Threads: one per
# core, as DuckDB does (2 on the reference machine).
DEFAULT_MAX_MEMORY = 4 << 30


def total_memory() -> int | None:
    """Physical memory of this machine in bytes (POSIX sysconf), or None where it cannot be asked."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


MAX_THREADS = 4096  # more is a mistake (each is an OS thread DuckDB starts at connect)
# the units DuckDB's memory_limit parser takes (case-insensitive, a space allowed before them): bytes per unit
_MEMORY_UNITS = {
    **dict.fromkeys(("b", "byte", "bytes"), 1),
    **{u: 1000 ** i for i, names in enumerate((("k", "kb", "kilobyte", "kilobytes"), ("m", "mb", "megabyte",
       "megabytes"), ("g", "gb", "gigabyte", "gigabytes"), ("t", "tb", "terabyte", "terabytes")), 1) for u in names},
    **{u: 1024 ** i for i, u in enumerate(("kib", "mib", "gib", "tib"), 1)},
}
# (no "+": DuckDB's parser refuses it; "-" is read to refuse it by name below)
_MEMORY = re.compile(r"\s*(-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)\s*([a-z]+|%)?\s*", re.IGNORECASE)
_MEMORY_FORM = ("a string with a unit, e.g. memory_limit=\"8GB\", \"512MB\", \"4GiB\", or a share of RAM "
                "\"50%\" (None: min(RAM / 4, 4 GiB))")


def check_settings(threads, memory_limit) -> tuple[int | None, str | None]:
    """``(threads, memory_limit)`` of :func:`lerobot_sql.connect`, checked before DuckDB sees them: DuckDB raised
    its own bare exceptions for ``threads=-1`` or ``memory_limit="abc"`` / ``10**12``, took ``"-1"`` as no limit
    at all, and ``threads=0`` / ``1.5`` / ``True`` and ``memory_limit=0`` passed silently.

    Returns:
        ``threads`` as an int (or None: one per core), ``memory_limit`` as given (or None: the default).

    Raises:
        TypeError: ``threads`` is not an integer (a bool, a float, a string), ``memory_limit`` not a string.
        ValueError: ``threads`` not from 1 to :data:`MAX_THREADS`; ``memory_limit`` not a positive amount with a
            unit DuckDB takes (b, KB, MB, GB, TB, KiB ... TiB; k, m, g, t; kilobytes ...) or a share of RAM above 0%
            and at most 100%, or past DuckDB's range. Each names the argument, the value and the valid form.
    """
    if threads is not None:
        v = as_int(threads)
        if v is None:
            raise TypeError(f"threads={threads!r} ({type(threads).__name__}): give an integer from 1 to "
                            f"{MAX_THREADS}, DuckDB's threads (None: one per core)")
        if not 1 <= v <= MAX_THREADS:
            raise ValueError(f"threads={v}: give an integer from 1 to {MAX_THREADS}, DuckDB's threads (None: one "
                             "per core)")
        threads = v
    if memory_limit is not None:
        if not isinstance(memory_limit, str):
            raise TypeError(f"memory_limit={memory_limit!r} ({type(memory_limit).__name__}): give {_MEMORY_FORM}")
        m = _MEMORY.fullmatch(memory_limit)
        unit = m and (m.group(2) or "").lower()
        amount = m and float(m.group(1))
        if m is None or (amount > 0 and unit != "%" and unit not in _MEMORY_UNITS):
            raise ValueError(f"memory_limit={memory_limit!r} is not a number with a unit of bytes (b, KB, MB, GB, "
                             f"TB, KiB, MiB, GiB, TiB) or a %: give {_MEMORY_FORM}")
        if amount <= 0:  # DuckDB takes "-1" as no limit at all: the bound keeps memory for DataLoader workers
            raise ValueError(f"memory_limit={memory_limit!r}: give a positive amount ({_MEMORY_FORM}); a "
                             "negative or zero limit is not taken (to lift the bound, give \"100%\")")
        if unit == "%" and amount > 100:
            raise ValueError(f"memory_limit={memory_limit!r}: a share of RAM is at most 100%")
        if unit != "%" and amount * _MEMORY_UNITS[unit] >= 2 ** 63:
            raise ValueError(f"memory_limit={memory_limit!r}: past DuckDB's range (below 8 EiB); give "
                             f"{_MEMORY_FORM}")
        if unit != "%" and amount * _MEMORY_UNITS[unit] < 1 << 20:  # "0.5b", "1e-20GB": every query out of memory
            raise ValueError(f"memory_limit={memory_limit!r}: below 1 MB, no query could run; give {_MEMORY_FORM}")
    return threads, memory_limit


def default_config(threads: int | None = None, memory_limit: str | None = None) -> dict[str, str | int]:
    """DuckDB settings for ``duckdb.connect(config=...)``: the given values, else the defaults above.

    Returns:
        ``{"threads": int, "memory_limit": "<n>MiB" or the given string}``.
    """
    if threads is None:
        threads = os.cpu_count() or 1
    if memory_limit is None:
        total = total_memory()
        mem = DEFAULT_MAX_MEMORY if total is None else max(256 << 20, min(DEFAULT_MAX_MEMORY, total // 4))
        memory_limit = f"{mem >> 20}MiB"
    return {"threads": int(threads), "memory_limit": str(memory_limit)}


def connect(config: dict[str, str | int] | None = None) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(config=config)`` with DuckDB's progress bar off for the life of the connection.

    DuckDB's Python client turns the bar on by itself in an interactive session (``python -c``, code piped to
    ``python -``, a REPL, a notebook) and draws it on fd 1, past ``sys.stdout``, for any query running over 2 s: a
    script printing JSON, or ``lerobot-sql query -f csv > out.csv`` run from one, would get it as its first line.
    Both settings are per connection (``config`` refuses them), so they are set here, before :func:`lock_down`
    freezes them; ``enable_progress_bar_print = false`` is the one that holds, since ``SET progress_bar_time``
    turns ``enable_progress_bar`` back on. Cursors of the connection start with the bar off (DuckDB's default:
    the client turns it on only for the connection it opens) and the lock keeps it off.

    Raises:
        duckdb.Error: DuckDB refused ``config``.
    """
    con = duckdb.connect(config=config or {})
    con.execute("SET enable_progress_bar = false")
    con.execute("SET enable_progress_bar_print = false")
    return con


# DuckDB's error messages advise SET / PRAGMA statements, which the locked connection refuses (lock_down): each
# advice that a user of lerobot_sql can follow another way is replaced by that way, the others are removed. (A
# regex over DuckDB's text, the advice sentence exactly as DuckDB 1.x / 2.x words it; anything not matched keeps
# DuckDB's words and gets the note below.)
_ADVICE = [
    (re.compile(r"\* Reducing the number of threads \(SET threads=X\)"),
     "* Reducing the number of threads: lerobot_sql.connect(root, threads=1)"),
    (re.compile(r"\* Disabling insertion-order preservation \(SET preserve_insertion_order=false\)\n?"), ""),
    (re.compile(r"\* Increasing the memory limit \(SET memory_limit='\.\.\.GB'\)"),
     "* Increasing the memory limit: lerobot_sql.connect(root, memory_limit='8GB') (the default is a quarter of "
     "RAM, at most 4 GiB)"),
    (re.compile(r", or SET error_on_division_by_zero=false to return NULL for all divisions by zero"), ""),
    (re.compile(r'Use "SET scalar_subquery_error_on_multiple_rows=false" to revert to previous behavior of '
                r"returning a random row\."),
     "Make the subquery return one row (a WHERE that picks one, an aggregate such as max(...), or LIMIT 1), or "
     "compare with IN (subquery)."),
    (re.compile(r'Use "SET max_expression_depth TO x" to increase the maximum expression depth\.'),
     "Simplify the expression: fewer nested operators or parentheses, a WITH clause per step."),
    (re.compile(r"\* SET order_by_non_integer_literal=true to allow this behavior\."),
     "* Order by a column name or position (ORDER BY 1), not a string literal."),
    (re.compile(r"(?:Or set )?(?:SET|PRAGMA) temp_directory='/path/to/tmp\.tmp'"),
     "lerobot_sql.connect(root, temp_directory='/path/to/tmp')"),
    (re.compile(r"You can adjust this setting, by using \(for example\) PRAGMA max_temp_directory_size='10GiB'"),
     "Free space on the disk of temp_directory (lerobot_sql.connect(root, temp_directory=...) moves it)"),
]
_SETTING_ADVICE = re.compile(r"\b(?:SET|PRAGMA|RESET) [a-z_]+", re.IGNORECASE)
LOCKED_NOTE = ("(SET, PRAGMA and RESET statements are refused on lerobot_sql's connection: its settings are locked; "
               "lerobot_sql.connect takes threads=, memory_limit= and temp_directory=)")


def interrupted_by_signal(e: BaseException) -> bool:
    """Whether ``e`` is DuckDB stopping work because the process got SIGINT (Ctrl-C) while no guard of ours was
    armed: DuckDB's Python layer checks for signals and raises ``duckdb.InterruptException``, or a bare
    ``RuntimeError("Query interrupted")`` when the check lands in its result fetch. Never while SIGINT is ignored
    (a process started with ``cmd &``): DuckDB words another signal's handler raising (an application's SIGALRM
    limit) the same way."""
    import signal

    return (isinstance(e, duckdb.InterruptException) or (type(e) is RuntimeError and
                                                          str(e).strip().lower() == "query interrupted")) \
        and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


def locked_advice(message: str) -> str:
    """DuckDB's error ``message`` with its advice to run SET / PRAGMA statements replaced by what works on a locked
    connection (``_ADVICE``), and a note on the lock when an advice it does not know remains. Text before
    ``\nSQL:`` only: the user's SQL is quoted as written."""
    head, sep, sql = message.partition("\nSQL:")
    for pattern, replacement in _ADVICE:
        head = pattern.sub(replacement, head)
    if _SETTING_ADVICE.search(head):
        head = f"{head.rstrip()}\n{LOCKED_NOTE}"
    return head + sep + sql


def _dir(path: str) -> str:
    """A directory entry for allowed_directories: local paths absolute and ending in '/', URLs kept as given."""
    p = str(path)
    if "://" not in p:
        p = os.path.abspath(p)
    return p.rstrip("/") + "/"


def lock_down(con: duckdb.DuckDBPyConnection, allowed_dirs: list[str], allowed_paths: list[str] | None = None) -> None:
    """Restrict ``con`` to reading under ``allowed_dirs`` and freeze its configuration. Call it once the views
    exist (creating them reads the Parquet footers).

    Sets: ``allowed_directories`` to ``allowed_dirs`` (the dataset root, as ``Source.duckdb_path('')`` spells it,
    and the dataset's cache folder, where the video index and spill files live), ``temp_directory`` to
    ``<first local allowed dir>/duckdb_tmp`` when the current one lies outside them, ``autoinstall_known_extensions``
    and ``autoload_known_extensions`` off, ``enable_external_access`` off, then ``lock_configuration`` on. The
    settings hold for the life of the connection; they cannot be undone by SQL. ``allowed_paths``: single files
    outside ``allowed_dirs`` that may be read, for symlinked datasets (DuckDB checks a symlink's resolved target;
    see :meth:`lerobot_sql._storage.source.Source.symlink_targets`).

    Views and macros created before the call keep working, and so do those created later over files under
    ``allowed_dirs`` (the lazily built ``video_frames`` view reads index files from the cache).

    Raises:
        LeRobotSQLError: DuckDB refused a setting (for example the configuration was already locked).
    """
    dirs = [_dir(d) for d in allowed_dirs if d]
    local = [d for d in dirs if "://" not in d]
    try:
        con.execute("SET allowed_directories = $1", [dirs])
        if allowed_paths:
            con.execute("SET allowed_paths = $1", [list(allowed_paths)])
        temp = con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0]
        if local and not any(_dir(os.path.abspath(temp or ".")).startswith(d) for d in local):
            # DuckDB spills big sorts and joins here; keep it inside what it may write.
            spill = os.path.join(local[-1], "duckdb_tmp")
            con.execute("SET temp_directory = $1", [spill])
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except duckdb.Error as e:
        raise LeRobotSQLError(f"cannot lock down the DuckDB connection ({type(e).__name__}: {e}); allowed "
                              f"directories were {dirs}") from e
