"""What the ``lerobot-sql`` commands and the ``lerobot-sql shell`` prompt share: running a query for the terminal,
writing a result (table, CSV, JSON Lines, Parquet), and the ``error:`` / ``hint:`` lines of a failure.

Its own module so that the shell (:mod:`lerobot_sql.cli.shell`) and the commands (:mod:`lerobot_sql.cli`) both import
it and never each other.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import (
    DatasetFormatError,
    DestinationError,
    FrameNotFoundError,
    LeRobotSQLError,
    MissingFileError,
    QueryError,
    QueryInterrupted,
    RemoteIOError,
    ResultContractError,
    TrainSetupError,
    UnsupportedVersionError,
    VideoDecodeError,
)


class UsageError(Exception):
    """Arguments that parse but do not fit together; reported like argparse errors (exit 2)."""



def named_sql(db, name: str, params: dict | None) -> str:
    """Named query ``name`` rendered for ``db``: through ``db.named_query_sql`` for one dataset (its ``vector``
    parameters checked against its frames), through the library for a collection."""
    from .._query import library

    try:
        if hasattr(db, "named_query_sql"):
            return db.named_query_sql(name, **(params or {}))
        return library.render(name, params or {}, extra_dirs=db.query_dirs)
    except QueryError as e:
        if getattr(e, "usage", False):  # a misspelt name, a bad --param: the command line's mistake (exit 2)
            raise UsageError(str(e)) from e
        raise


def run_sql(db, sql: str, params: dict | None = None, name: str | None = None, timeout: float | None = None):
    import duckdb

    try:
        if name:
            sql = named_sql(db, name, params)
        return db.sql(sql, timeout=timeout)
    except duckdb.Error as e:
        raise QueryError(f"{type(e).__name__}: {e}") from e


def materialize(rel, what: str):
    """Run the relation to an Arrow table, turning DuckDB runtime errors (casts, ...) into QueryError."""
    import duckdb

    try:
        return rel.to_arrow_table()
    except duckdb.Error as e:
        raise QueryError(f"{type(e).__name__}: {e}") from e


# DuckDB's box renderer (relation.show) fetches at most 10,000 rows and elides from those: past that it showed row
# 10,000 as the "last" row, "? rows", and with --max-rows 0 stopped at 10,000. We stream the result once, keep what
# is shown (the first and last halves of max_rows, or every row), count every row, and hand DuckDB only tables it
# renders whole.
_RENDER_CHUNK = 5_000
_ROW_COUNT = re.compile(r"\s*\((?:>?\d[\d,]* rows, )?\d[\d,]* shown\)|\s*(?:\d[\d,]*|\?) rows")


def _kept_rows(rel, max_rows: int):
    """(head, tail, total): Arrow tables of the first ``ceil(max_rows/2)`` and the last ``max_rows//2`` rows (every
    row in ``head``, ``tail`` empty, when ``max_rows <= 0`` or nothing is left out) and the result's row count."""
    import collections

    import duckdb
    import pyarrow as pa

    want_head = (max_rows + 1) // 2 if max_rows > 0 else None
    want_tail = max_rows // 2 if max_rows > 0 else 0
    head: list = []
    tail: collections.deque = collections.deque()
    n_head = n_tail = total = 0

    def consume(reader):
        nonlocal n_head, n_tail, total
        for batch in reader:
            total += batch.num_rows
            if want_head is None or n_head < want_head:
                take = batch if want_head is None else batch.slice(0, want_head - n_head)
                head.append(take)
                n_head += take.num_rows
                batch = batch.slice(take.num_rows)
            if batch.num_rows and want_tail:
                tail.append(batch)
                n_tail += batch.num_rows
                while n_tail - tail[0].num_rows >= want_tail:  # keep only the batches the last rows are in
                    n_tail -= tail.popleft().num_rows
        return reader.schema

    try:
        # db.sql's Result scans under its --timeout / Ctrl-C guard; a plain DuckDB relation (tests) streams as is.
        schema = rel.scan(consume) if hasattr(type(rel), "scan") else consume(rel.to_arrow_reader(2048))
    except duckdb.Error as e:
        raise QueryError(f"{type(e).__name__}: {e}") from e
    head_t = pa.Table.from_batches(head, schema=schema)
    tail_t = pa.Table.from_batches(list(tail), schema=schema)
    tail_t = tail_t.slice(max(tail_t.num_rows - want_tail, 0))
    if head_t.num_rows + tail_t.num_rows == total:  # nothing left out: one table
        head_t, tail_t = pa.concat_tables([head_t, tail_t]), tail_t.slice(0, 0)
    return head_t, tail_t, total


def _render(table, width: int) -> tuple[list[str], list[str]]:
    """DuckDB's box rendering of every row of ``table`` (at most _RENDER_CHUNK rows): (the box's lines, the footer's
    lines without DuckDB's row count, e.g. "30 columns (9 shown)" on a narrow terminal)."""
    import io

    from .._catalog.sandbox import connect, interrupted_by_signal  # (connect: the progress bar off: it would land
    # in the captured box)

    out = io.StringIO()
    try:
        with contextlib.closing(connect()) as con, contextlib.redirect_stdout(out):
            con.from_arrow(table).show(max_width=width, max_rows=max(table.num_rows, 1))
    except RuntimeError as e:  # (a Ctrl-C that DuckDB's own check saw on this unguarded connection: Python's)
        if interrupted_by_signal(e):
            raise KeyboardInterrupt from e
        raise
    lines = out.getvalue().rstrip("\n").split("\n")
    end = max(i for i, ln in enumerate(lines) if ln.startswith("└"))
    footer = [_ROW_COUNT.sub("", ln).rstrip() for ln in lines[end + 1:]]
    return lines[:end + 1], [ln for ln in footer if ln.strip()]


def print_table(rel, max_rows: int) -> None:
    """Print the result ``rel`` as a box table on stdout: every row when ``max_rows <= 0`` or nothing would be left
    out, else the first ``ceil(max_rows/2)`` and the last ``max_rows//2`` rows around a ``·`` line. The footer gives
    the row count and, when rows are left out, which ones are shown ("14,286 rows (40 shown: rows 1-20 and
    14,267-14,286)"). Past 5,000 rows shown, the rows come as consecutive tables of 5,000 (DuckDB draws at most
    10,000 rows per table).

    Raises:
        QueryError: the query fails while it runs.
    """
    import pyarrow as pa

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 100_000
    head, tail, total = _kept_rows(rel, max_rows)
    shown = head.num_rows + tail.num_rows
    if shown == total:
        footer: list[str] = []
        for start in range(0, max(total, 1), _RENDER_CHUNK):
            box, footer = _render(head.slice(start, _RENDER_CHUNK), width)
            print("\n".join(box))
        note = f"{total:,} rows" + (f" (in tables of {_RENDER_CHUNK:,})" if total > _RENDER_CHUNK else "")
    else:
        box, footer = _render(pa.concat_tables([head, tail]), width)
        first = next(i for i, ln in enumerate(box) if ln.startswith("├")) + 1
        # Where the rows are left out, three "·" lines in the shape of a data row, as DuckDB draws them.
        dots = "│".join(" " * (len(c) - 2) + "· " if len(c) >= 3 else c for c in box[first].split("│"))
        at = first + head.num_rows
        print("\n".join(box[:at] + [dots] * 3 + box[at:]))
        last = f" and {total - tail.num_rows + 1:,}-{total:,}" if tail.num_rows else ""
        note = f"{total:,} rows ({shown:,} shown: rows 1-{head.num_rows:,}{last})"
    print("  " + note)
    for ln in footer:
        print(ln)


def jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return str(v)  # dates, decimals, UUIDs


@contextlib.contextmanager
def _out(path: str | None, binary: bool = False):
    if path in (None, "-"):
        yield sys.stdout.buffer if binary else sys.stdout
    else:
        with open(path, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            yield f


# --output's extension -> --format, when -f is not given (so `-o x.csv` never writes a box-drawn table).
FORMAT_BY_EXTENSION = {".csv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json", ".parquet": "parquet",
                       ".pq": "parquet", ".txt": "table"}


def format_of(fmt: str | None, output: str | None) -> str:
    """The output format: ``-f`` if given, else inferred from ``--output``'s extension, else table (stdout)."""
    if fmt:
        return fmt
    if output in (None, "-"):
        return "table"
    ext = Path(output).suffix.lower()
    if ext not in FORMAT_BY_EXTENSION:
        raise UsageError(f"cannot tell the format of {output!r} from its extension; use one of "
                         f"{sorted(FORMAT_BY_EXTENSION)} or pass -f table|csv|json|parquet")
    return FORMAT_BY_EXTENSION[ext]


def _float32_shortest(table):
    """``table`` with float32 (also inside lists/structs) as float64 holding the shortest decimal that round-trips
    the float32 (25.24413, not 25.244129180908203): JSON then prints the same digits as CSV and the table view."""
    import pyarrow as pa

    def swap(t, to):
        if pa.types.is_float32(t) or pa.types.is_float16(t):
            return to
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            field = t.value_field.with_type(swap(t.value_type, to))
            if pa.types.is_fixed_size_list(t):
                return pa.list_(field, t.list_size)
            return pa.large_list(field) if pa.types.is_large_list(t) else pa.list_(field)
        if pa.types.is_struct(t):
            return pa.struct([t.field(i).with_type(swap(t.field(i).type, to)) for i in range(t.num_fields)])
        return t

    for i, field in enumerate(table.schema):
        if swap(field.type, pa.string()) != field.type:
            # Arrow's float -> string cast writes the shortest round-trip digits; parsing them back as float64 keeps
            # exactly those digits for json.dumps.
            col = table.column(i).cast(swap(field.type, pa.string())).cast(swap(field.type, pa.float64()))
            table = table.set_column(i, field.with_type(col.type), col)
    return table


def write_result(rel, fmt: str, output: str | None, max_rows: int, timeout: float | None = None) -> None:
    """Write the result ``rel`` as ``fmt`` to ``output`` (stdout for None or ``-``). ``timeout``: seconds the
    whole command may take, the query and the writing (JSON Lines are written row by row in Python: 22M rows of a
    runaway cross join took minutes after the query itself was done).

    Raises:
        QueryInterrupted: the timeout passed while rows were written (``.reason == "timeout"``).
    """
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    if fmt == "table":
        if output not in (None, "-"):
            with _out(output) as f, contextlib.redirect_stdout(f):
                print_table(rel, max_rows)
        else:
            print_table(rel, max_rows)
    elif fmt == "json":  # JSON Lines: one object per row, streams into jq / pandas.read_json(lines=True)
        table = _float32_shortest(materialize(rel, "json"))
        with _out(output) as f:
            for batch in table.to_batches(max_chunksize=4096):
                if deadline is not None and time.monotonic() > deadline:
                    raise QueryInterrupted(f"the command was stopped at its timeout of {timeout:g} s while writing "
                                           f"the result ({table.num_rows:,} rows; --timeout)", "timeout")
                for row in batch.to_pylist():
                    f.write(json.dumps(jsonable(row), ensure_ascii=False) + "\n")
    elif fmt == "csv":
        import duckdb

        # DuckDB writes lists and structs as readable text ([1.0, 2.0]) and floats in their shortest form. The
        # dataset's connection is locked down (no file writes: lerobot_sql.sandbox), so the result is handed as Arrow
        # to a private in-memory connection that writes the file; stdout goes through a temp file.
        import pyarrow as pa

        from .._query.sqltext import ident

        table = materialize(rel, "csv")
        from .._catalog.sandbox import connect  # the progress bar off: it would precede the CSV on stdout

        with tempfile.TemporaryDirectory() as tmp, contextlib.closing(connect()) as con:
            path = output if output not in (None, "-") else os.path.join(tmp, "out.csv")
            try:
                out = con.from_arrow(table)
                # Nested columns holding text (the tasks list, structs) as JSON: DuckDB's own text form
                # ([Open the drawer., Pick, then place]) cannot be split back when a task has ", " in it. Numeric
                # lists keep DuckDB's form ([0.1, 0.2], shortest floats: also valid JSON).
                texty = [f.name for f in table.schema if pa.types.is_nested(f.type) and _holds_text(f.type)]
                if texty:
                    out = out.select(", ".join(f"to_json({ident(c)}) AS {ident(c)}" if c in texty else ident(c)
                                               for c in table.column_names))
                out.write_csv(path, header=True)
            except duckdb.Error as e:
                raise QueryError(f"{type(e).__name__}: {e}") from e
            if output in (None, "-"):
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, sys.stdout.buffer)
    elif fmt == "parquet":
        if output in (None, "-") and sys.stdout.isatty():
            raise UsageError("--format parquet needs --output FILE.parquet (or a redirect: > out.parquet)")
        import pyarrow.parquet as pq

        table = materialize(rel, "parquet")
        with _out(output, binary=True) as f:
            pq.write_table(table, f)
    sys.stdout.flush()


def _holds_text(t) -> bool:
    """A string or binary type, or a list, struct or map type with one anywhere inside."""
    import pyarrow as pa

    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    if pa.types.is_struct(t):
        return any(_holds_text(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _holds_text(t.key_type) or _holds_text(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _holds_text(t.value_type)
    return False


def views_and_columns(db) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    # A sidecar's view is a placeholder until a query names it: asked through db.sql, which reads its file's columns
    # (a broken file is shown as its error, not a failed listing).
    side = {r[0] for r in db.sql("SELECT view FROM sidecars").fetchall()}
    for view in db.views():
        if view in side:
            try:
                r = db.sql(f'SELECT * FROM "{view}" LIMIT 0')
                out[view] = [(c, str(t)) for c, t in zip(r.columns, r.types)]
            except QueryInterrupted as e:  # a Ctrl-C while it was checked stops the listing, as anywhere else
                if e.reason == "sigint":
                    raise KeyboardInterrupt from e
                raise
            except LeRobotSQLError as e:
                out[view] = [("(unreadable)", one_line(e))]
            continue
        # DESCRIBE runs on our own connection: db.sql() accepts only SELECT queries.
        out[view] = [(r[0], r[1]) for r in db.con.sql(f'DESCRIBE "{view}"').fetchall()]
    return out


# ---- errors and hints --------------------------------------------------------------------------------------------------------
SCHEMA = "`lerobot-sql schema DATASET [VIEW]` lists the views and their columns"
QUOTING = 'quote names that contain dots: "observation.state"'
HINTS: list[tuple[type, str]] = [
    (UnsupportedVersionError, "lerobot_sql reads LeRobot format v3.x"),
    (ResultContractError, "return `index`, or `episode_index, start_s, end_s`, or `episode_index` columns"),
    (QueryError, SCHEMA),  # refined by QUERY_HINTS
    (MissingFileError, "`lerobot-sql doctor DATASET` lists every file the metadata points to that is missing"),
    (DatasetFormatError, "`lerobot-sql doctor DATASET` checks the metadata against the files"),
    (FrameNotFoundError, "`lerobot-sql doctor DATASET` checks timestamps against the video frames"),
    (VideoDecodeError, "`lerobot-sql doctor DATASET` finds unreadable video files"),
    (RemoteIOError, "check the network and the URL; `lerobot-sql prefetch` downloads ahead of training"),
    (DestinationError, "write to a new path outside the source dataset, on a writable disk with room"),
    (FileExistsError, "choose a new destination or pass --overwrite"),
    (PermissionError, "check the permissions of the path"),
    (OSError, "check the path"),
]
# A QueryError's hint follows what went wrong: (regex over the message, hint); the first match wins. The messages
# come from lerobot_sql.query, lerobot_sql.library and DuckDB; tests/test_cli.py covers each row.
QUERY_HINTS: list[tuple[str, str]] = [
    (r"^(no named query|query '[^']*'[: ]|.*\.sql: (parameter|no SQL|the SQL uses))",
     "`lerobot-sql query --list` lists the named queries and their parameters"),
    (r"^(DESCRIBE|SUMMARIZE|SHOW)\b", "`lerobot-sql schema DATASET VIEW` lists a view's columns and types"),
    (r"^only queries|statement\(s\) of type",
     "the views are read-only: only a SELECT (or WITH ... SELECT) runs here"),
    (r"^cannot parse the SQL: .*unclosed", "close every quote ('text', \"name\") and /* comment */"),
    (r"^cannot parse|Parser Error", "fix the SQL where the error points (marked >>> <<<, or 'at or near'); "
                                    "examples: docs/sql.md"),
    (r"exactly one SQL statement", "run one statement per call; `lerobot-sql shell` runs a script of several"),
    (r"^(table functions|file paths in FROM)", f"query the views; {SCHEMA}"),
    (r"qualified table names|read as table\.column", QUOTING),
    (r"unknown column|Referenced column|column .* not found|Binder Error.*column",
     f"{SCHEMA}; {QUOTING}"),
    (r"^(LIMIT|OFFSET) \d+ is out of range", "LIMIT and OFFSET take a row count up to 2^63 - 1; leave LIMIT out "
                                              "to get every row"),
    (r"Invalid Input Error: [\w.]+: ", "this check is part of lerobot_sql's SQL: `lerobot-sql query --list` shows "
                                       "the named queries' parameters, docs/sql.md the macros"),
    (r"Conversion Error|Out of Range Error|out of range",
     "a value does not fit its SQL type: check the literals and casts (::INT, ::FLOAT) in the query"),
    (r"Function with name|does not exist", "DuckDB's functions: https://duckdb.org/docs/sql/functions/overview; "
                                           "lerobot_sql's macros: docs/sql.md"),
]


def one_line(e: BaseException, limit: int = 500) -> str:
    """The message's first paragraph on one line (DuckDB adds 'LINE 1: ...' carets; we add 'SQL: ...'), at most
    ``limit`` characters."""
    lines = []
    for line in str(e).splitlines():
        if not line.strip() or line.startswith(("SQL:", "LINE ")):
            break
        lines.append(line.strip())
    text = " ".join(lines) or type(e).__name__
    # "ConversionException: Conversion Error: ..." -> "Conversion Error: ...": DuckDB names the kind twice.
    text = re.sub(r"^[A-Z]\w*Exception: (?=[A-Z][\w ]* Error: )", "", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def error_hint(e: BaseException) -> str | None:
    """The ``hint:`` line for an error: specific to the kind of error (and, for QueryError, to its message)."""
    if isinstance(e, (MissingFileError, RemoteIOError)) and str(e).startswith("no local folder "):
        return "DATASET is a local folder holding meta/info.json, or a Hub repo id ORG/NAME (hf://datasets/ORG/NAME)"
    if isinstance(e, MissingFileError) and "meta/info.json" in str(e):
        return "DATASET is the dataset root: the folder holding meta/info.json, data/ and videos/"
    if isinstance(e, FileExistsError) and ("replaces only" in str(e) or "never" in str(e)):
        # --overwrite was given but the destination is not ours to replace: passing it again would not help.
        return "--overwrite replaces only an empty folder or an earlier lerobot-sql export; choose a new destination"
    if isinstance(e, DestinationError) and "lerobot-sql query -o writes a regular file" in str(e):
        return "leave out -o to print the result to stdout, and redirect it where it should go"
    if isinstance(e, DestinationError) and "lerobot-sql query -o" in str(e):
        return "give -o a path outside the dataset's folder (its files are never written by a query)"
    if isinstance(e, ResultContractError) and "no rows" in str(e):
        return "the query selected nothing: check its WHERE clause, e.g. with `lerobot-sql query DATASET \"SELECT ...\"`"
    if isinstance(e, ResultContractError) and ("collection" in str(e) or "do not line up" in str(e)
                                                or "differs (" in str(e)):
        return ("over several datasets a query returns `dataset` with `index`, or `episode_index[, start_s, end_s]`; "
                "keys line up with --features (export), --rename NAME:KEY=NEW (train) or rename=/features= (Python); "
                "see docs/collections.md")
    if isinstance(e, QueryInterrupted) and e.reason == "timeout":
        return "give --timeout more seconds, or narrow the query (WHERE, LIMIT, an aggregate)"
    if isinstance(e, TrainSetupError) and "not installed" in str(e):
        return "run lerobot-sql train with the Python that has lerobot (0.4.x-0.6.x), e.g. your training environment"
    if isinstance(e, QueryError) and not isinstance(e, ResultContractError):
        text = str(e).removeprefix("QueryError: ")
        for pattern, hint in QUERY_HINTS:
            if re.search(pattern, text, flags=re.DOTALL):
                return hint
    for cls, hint in HINTS:
        if isinstance(e, cls):
            return hint
    return None
