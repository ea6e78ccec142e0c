"""Sidecar tables and attached tables as views: the names they get, the placeholders listed at connect, the views
built on first read.

A dataset's sidecar files (:func:`lerobot_sql._format.sidecar_files.find_sidecars`) are listed when the connection opens
and each gets a view named after its file (:func:`view_names`) and a row in the ``sidecars`` view; nothing is read
then. A placeholder (one column, no rows) stands in for each until a query names it: ``QueryFace._check`` builds
it first (:func:`build`), so the checks see its real columns. A Parquet sidecar's view reads the file lazily, as
every Parquet view does; a JSON one is parsed whole at that first read (``_format.sidecar_files.json_table``).

``db.attach`` (:func:`attach`) registers a table the user read from their own file: an Arrow scan, never a DuckDB
table, so SQL cannot change it, and never a path DuckDB reads, so the lock-down (``sandbox.lock_down``) stays.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import duckdb
import pyarrow as pa

from .._format.sidecar_files import read_json_sidecar
from .._query.sqltext import ident
from .._storage.source import Source
from ..errors import DatasetFormatError, QueryError
from . import views

PREFIX = "sidecar_"
# The placeholder's one column: a query naming the view builds it before it is checked, so this is seen only by
# db.con's raw SQL (which reads no rows from it).
PLACEHOLDER = "SELECT NULL::VARCHAR AS _lsql_not_read_yet WHERE false"
_SAFE = re.compile(r"[^0-9a-z_]")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


_KEYWORDS: frozenset[str] | None = None


def keywords(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """The SQL keywords DuckDB does not take as a table name unquoted (reserved and type/function names); asked
    once per process (the same for every connection of this DuckDB build; 5 ms, at each of a collection's
    datasets)."""
    global _KEYWORDS
    if _KEYWORDS is None:
        _KEYWORDS = frozenset(r[0].lower() for r in con.sql(
            "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category IN ('reserved', 'type_function')"
        ).fetchall())
    return _KEYWORDS


def view_names(paths: list[str], taken: set[str], reserved: frozenset[str]) -> dict[str, str]:
    """View name -> sidecar file, for ``paths`` in order. The rule:

    1. the file name without its extension, lower case, each character other than ``a-z``, ``0-9`` and ``_``
       replaced by ``_`` (``temporal_proportions_sparse.json`` -> ``temporal_proportions_sparse``,
       ``Camera Curation.json`` -> ``camera_curation``);
    2. prefixed with ``sidecar_`` when it is empty, starts with a digit or ``_``, is an SQL keyword (``reserved``:
       ``order.json`` -> ``sidecar_order``) or a name already ``taken`` (lerobot_sql's own views and macros:
       ``frames.parquet`` -> ``sidecar_frames``);
    3. ``_2``, ``_3`` ... appended when an earlier file has the name (in the order
       :func:`~lerobot_sql._format.sidecar_files.find_sidecars` lists them: ``meta/*.parquet``, ``meta/*.json``,
       ``*.parquet``, ``*.json``, each by name: ``meta/scores.parquet`` and ``meta/scores.json`` -> ``scores``,
       ``scores_2``).

    Every name is then a plain identifier: a file name never reaches SQL text (its path does, as a literal).
    """
    out: dict[str, str] = {}
    ours = {t.lower() for t in taken}
    used = set(ours)
    for rel in paths:
        base = _SAFE.sub("_", PurePosixPath(rel).stem.lower())
        if not base or not base[0].isalpha() or base in reserved or base in ours:
            base = PREFIX + base
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}_{n}"
        used.add(name)
        out[name] = rel
    return out


def register_placeholders(con: duckdb.DuckDBPyConnection, names: dict[str, str], relations: dict[str, pa.Table],
                          prefix: str = "") -> None:
    """Create a placeholder per sidecar view and the ``sidecars`` view (view, path, format: one row per file)."""
    for name in names:
        con.execute(f"CREATE OR REPLACE VIEW {ident(name)} AS {PLACEHOLDER}")
    table = pa.table({"view": pa.array(list(names), pa.string()),
                      "path": pa.array(list(names.values()), pa.string()),
                      "format": pa.array([PurePosixPath(p).suffix[1:] for p in names.values()], pa.string())})
    views.register_table(con, "sidecars", table, relations, prefix=prefix)


def build(con: duckdb.DuckDBPyConnection, src: Source, name: str, rel: str, register, prefix: str = "",
          schema: str = "") -> None:
    """Replace the placeholder of sidecar view ``name`` (in ``schema``, "" for the current one) with the view of
    file ``rel``: over ``read_parquet`` for a Parquet file (read when queried), over the registered Arrow table of a
    JSON file (parsed now). ``register(arrow_name, table)`` registers an Arrow table on every cursor.

    Raises:
        DatasetFormatError: the file is a symlink out of the dataset, not Parquet, not JSON, or too large a JSON
            (each naming the file).
        MissingFileError: the file is gone.
    """
    at = f"{ident(schema)}." if schema else ""
    src.check_link(rel)
    if rel.endswith(".parquet"):
        body = f"SELECT * FROM read_parquet({views.file_list(src, [rel])})"
        try:
            con.execute(f"CREATE OR REPLACE VIEW {at}{ident(name)} AS {body}")
        except duckdb.Error as e:
            raise DatasetFormatError(f"{src.path(rel)}: cannot be read as Parquet ({type(e).__name__}: "
                                     f"{str(e).splitlines()[0]}); the {name!r} view stays unreadable until the file is "
                                     "fixed or removed (it is not part of the LeRobot format)") from e
        return
    table, as_json = read_json_sidecar(src, rel)
    columns = select_list(table, as_json, src.path(rel))  # checked before anything is registered
    arrow = f"_lsql_arrow_{prefix}sidecar_{name}"
    register(arrow, table)
    con.execute(f"CREATE OR REPLACE VIEW {at}{ident(name)} AS SELECT {columns} FROM {ident(arrow)}")


def select_list(table: pa.Table, as_json: list[str], where: str) -> str:
    """The columns of ``table`` in order, those in ``as_json`` cast to DuckDB's JSON.

    Raises:
        DatasetFormatError: no column, a column name empty or holding NUL, or two names equal but for case (DuckDB
            binds names case-insensitively: ``"a"`` read ``"A"``'s values, silently; hostile review 20, H4), naming
            ``where`` (the file) and the names.
    """
    names = table.column_names
    if not names:
        raise DatasetFormatError(f"{where}: holds no column (e.g. a JSON list of empty objects); nothing to query")
    bad = [c for c in names if not c or "\x00" in c]
    if bad:
        raise DatasetFormatError(f"{where}: column name {bad[0]!r} is empty or holds NUL; rename it in the file")
    seen: dict[str, str] = {}
    for c in names:
        if c.lower() in seen:
            raise DatasetFormatError(f"{where}: columns {seen[c.lower()]!r} and {c!r} differ only in case, which SQL "
                                     "names cannot tell apart; rename one in the file")
        seen[c.lower()] = c
    return ", ".join(f"CAST({ident(c)} AS JSON) AS {ident(c)}" if c in as_json else ident(c) for c in names)


def mentioned(sql: str, names) -> list[str]:
    """The names of ``names`` (plain lower-case identifiers) that occur in ``sql`` as a word: a query can read a
    view only by writing its name (DuckDB has no escaped identifiers), so these are the ones to build before it is
    checked."""
    text = sql.lower()
    return [n for n in names if re.search(rf"(?<![0-9a-z_]){re.escape(n)}(?![0-9a-z_])", text)]


def check_attach_name(name: object, existing: set[str], attached: set[str], reserved: frozenset[str],
                      replace: bool) -> str:
    """The name a user attaches a table under, checked.

    Raises:
        TypeError: not a string.
        QueryError: not a plain identifier (a letter, then letters, digits, ``_``), an SQL keyword, the name of a
            lerobot_sql view or macro (or of a sidecar), or of a table attached before without ``replace=True``.
    """
    if not isinstance(name, str):
        raise TypeError(f"attach(name={name!r}): the view name must be a string")
    if not _NAME.fullmatch(name):
        raise QueryError(f"attach: {name!r} is not a plain SQL name; use a letter, then letters, digits or _ "
                         "(e.g. 'scores', 'keep_list')")
    key = name.lower()
    if key in reserved:
        raise QueryError(f"attach: {name!r} is an SQL keyword; choose another name (e.g. '{key}_table')")
    if key in attached:
        if not replace:
            raise QueryError(f"attach: a table is already attached as {name!r}; pass replace=True to replace it")
        return key
    if key in existing:
        raise QueryError(f"attach: {name!r} is the name of a view of this dataset; choose another name (views: "
                         f"{sorted(v for v in existing if not v.startswith('_'))})")
    return key


def attach(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table, as_json: list[str], register,
           where: str = "the attached table") -> None:
    """Make ``name`` a view over ``table`` (registered with ``register`` as ``_lsql_arrow_attached_<name>``), its
    JSON columns cast to JSON.

    Raises:
        DatasetFormatError: as :func:`select_list` (naming ``where``).
    """
    columns = select_list(table, as_json, where)  # checked before anything is registered
    arrow = f"_lsql_arrow_attached_{name.lower()}"  # (DuckDB names ignore case: one registration per view)
    register(arrow, table)
    con.execute(f"CREATE OR REPLACE VIEW {ident(name)} AS SELECT {columns} FROM {ident(arrow)}")

