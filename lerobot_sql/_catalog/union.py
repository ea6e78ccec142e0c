"""The DuckDB side of a collection of datasets: one connection, each dataset's views in a private schema, and the
views users query spanning all of them with a ``dataset`` column.

Each dataset's views are made exactly as for one dataset (:func:`lerobot_sql._catalog.connection.populate`) in its
own schema ``_lsql_src_<i>`` (views resolve unqualified names in their own schema first, so a dataset's ``frames``
reads its own ``_episodes_raw`` and macros). The top-level views are ``UNION ALL BY NAME`` of the datasets' views,
each row tagged with the dataset's name: a column some datasets lack is NULL in the others' rows. User SQL never
reaches a schema (qualified names are refused by the query checks); ``WHERE dataset = 'x'`` is the per-dataset view.

Identity across a collection is ``(dataset, episode_index)`` for an episode and ``(dataset, index)`` for a frame:
each dataset numbers its own from 0.
"""

from __future__ import annotations

import re

import duckdb
import pyarrow as pa

from .._format.files import DatasetFiles
from .._query.sqltext import ident, literal, sql_key
from ..errors import DatasetFormatError, warn
from . import macros, sandbox, sidecars, views
from .connection import LAZY_VIEWS, Connection, populate

# The views that span the collection (each dataset's view of that name, tagged with ``dataset``).
UNION_VIEWS = ("episodes", "episode_stats", "frames", "frames_ext", "language", "tasks", "videos", "features", "info",
               "tools", "sidecars", "video_frames", "video_files", "camera_frames", "episode_quality")
# A one-dimensional array or list type as DuckDB spells it (FLOAT[6], DOUBLE[]): its element type.
_ONE_DIM = re.compile(r"^(?P<base>[A-Z][A-Z0-9_ ]*?)(\[\d*\])$")


def schema_of(i: int) -> str:
    """The private schema of the collection's ``i``-th dataset."""
    return f"_lsql_src_{i}"


def prefix_of(i: int) -> str:
    """The Arrow registration prefix of the collection's ``i``-th dataset."""
    return f"s{i}_"


class CollectionConnection(Connection):
    """One DuckDB connection over several datasets (see the module docstring); cursors, registrations, lazy views
    and lock-down as :class:`~lerobot_sql._catalog.connection.Connection`.

    Args:
        names: the datasets' names (the ``dataset`` column), unique.
        members: their files, in the same order.
        threads, memory_limit, temp_directory: as :func:`lerobot_sql.connect`.
    """

    def __init__(self, names: list[str], members: list[DatasetFiles], **settings):
        super().__init__(members[0], **settings)
        self.names, self._members = list(names), list(members)
        self._ready = {name: not any(f.layout.video_keys for f in members) for name in LAZY_VIEWS}
        self._ready["episode_quality"] = False

    def members(self) -> list[DatasetFiles]:
        return list(self._members)

    def _open(self) -> duckdb.DuckDBPyConnection:
        con = self._new_duckdb()
        allowed, targets = [], []
        self._sidecars = {}  # top-level sidecar view -> [(member, its file)]: each member's view of that name
        for i, files in enumerate(self._members):
            con.execute(f"CREATE SCHEMA {ident(schema_of(i))}")
            con.execute(f"SET schema = {literal(schema_of(i))}")
            try:
                dirs, links, found, _ = populate(con, files, self._relations, prefix_of(i), table_macros=False)
            except DatasetFormatError as e:
                raise type(e)(f"dataset {self.names[i]!r}: {e}") from e
            allowed += dirs
            targets += links
            for name, rel in found.items():
                self._sidecars.setdefault(name, []).append((i, rel))
        con.execute("SET schema = 'main'")
        for name in self._sidecars:
            con.execute(f"CREATE OR REPLACE VIEW {ident(name)} AS {sidecars.PLACEHOLDER}")
        views.register_table(con, "datasets", datasets_table(self.names, self._members), self._relations)
        # Every dataset view's columns in one catalog query (a DESCRIBE per view binds it: 1,100 binds at 100 datasets).
        columns: dict[tuple[str, str], dict[str, str]] = {}
        for schema, table, col, typ in con.sql(
                "SELECT schema_name, table_name, column_name, data_type FROM duckdb_columns() WHERE schema_name "
                "LIKE '\\_lsql\\_src\\_%' ESCAPE '\\' ORDER BY schema_name, table_name, column_index").fetchall():
            columns.setdefault((schema, table), {})[col] = typ
        # The macros bind their bodies when created: against one dataset's views that is cheap, against the
        # unions of 100 it took 5 s. They bind again on every call, so they are made first, then the unions.
        for view in UNION_VIEWS:
            con.execute(f"CREATE OR REPLACE VIEW {ident(view)} AS SELECT {literal(self.names[0])} AS dataset, * "
                        f"FROM {ident(schema_of(0))}.{ident(view)}")
        macros.register_collection(con, [f.layout for f in self._members])
        for view in UNION_VIEWS:
            described = [columns[(schema_of(i), view)] for i in range(len(self.names))]
            con.execute(f"CREATE OR REPLACE VIEW {ident(view)} AS {union_sql(con, view, self.names, described)}")
        sandbox.lock_down(con, allowed, allowed_paths=targets)
        return con

    def _build_sidecar(self, name: str) -> None:
        """The top-level sidecar view ``name``: each member's view of that name built, then their union by name with
        ``dataset`` (the members without such a file have no rows in it)."""
        con = self.cursor()
        for i, rel in self._sidecars[name]:
            sidecars.build(con, self._members[i].source, name, rel, self.register, prefix_of(i), schema_of(i))
        members = [i for i, _ in self._sidecars[name]]
        con.execute(f"CREATE OR REPLACE VIEW {ident(name)} AS "
                    f"{union_sql(con, name, [self.names[i] for i in members], members=members)}")

    def source_cursor(self, i: int) -> duckdb.DuckDBPyConnection:
        """A new cursor whose unqualified names are dataset ``i``'s views (its schema first): what the resolvers
        of one dataset need (``_frames_loc``, ``episodes`` ...). The caller closes it."""
        self.cursor()  # opens the connection
        own = f"_lsql_arrow_{prefix_of(i)}"
        with self._con_lock:
            cur = self._con.cursor()
            # Only this dataset's registrations: its views read nothing else (registering every dataset's on each
            # cursor made a 100-dataset manifest quadratic).
            for name, table in self._relations.items():
                if name.startswith(own):
                    cur.register(name, table)
        cur.execute(f"SET schema = {literal(schema_of(i))}")
        return cur

    def build_video_index(self, progress: bool | None = True) -> None:
        """Index every dataset's mp4s (see :meth:`Connection.build_video_index`); a dataset without cameras has
        nothing to index."""
        from ..errors import MissingFileError

        missing = []
        for i, files in enumerate(self._members):
            if files.layout.video_keys:
                try:
                    self._index_videos(files, schema_of(i), prefix_of(i), progress)
                except MissingFileError as e:
                    missing.append(f"dataset {self.names[i]!r}: {e}")
        self._ready["video_frames"] = True
        if missing:
            raise MissingFileError("; ".join(missing))

    def _quality_views(self) -> None:
        for i, files in enumerate(self._members):
            self._quality_view(files, schema_of(i), prefix_of(i))

    def _build_video_files(self) -> None:
        for i, files in enumerate(self._members):
            if files.layout.video_keys:
                self._probe_videos(files, schema_of(i), prefix_of(i))
        self._ready["video_files"] = True


def datasets_table(names: list[str], members: list[DatasetFiles]) -> pa.Table:
    """The ``datasets`` view: one row per dataset (name, where it lives, info.json's version, fps, robot_type,
    totals, its feature names and camera keys)."""
    rows = [(n, f.source.url, f.layout) for n, f in zip(names, members)]
    return pa.table({
        "dataset": [n for n, _, _ in rows],
        "root": [u for _, u, _ in rows],
        "codebase_version": [lay.version for _, _, lay in rows],
        "fps": pa.array([float(lay.fps) for _, _, lay in rows], pa.float64()),
        "robot_type": pa.array([lay.info.get("robot_type") for _, _, lay in rows], pa.string()),
        "total_episodes": pa.array([lay.info.get("total_episodes") for _, _, lay in rows], pa.int64()),
        "total_frames": pa.array([lay.info.get("total_frames") for _, _, lay in rows], pa.int64()),
        "total_tasks": pa.array([lay.info.get("total_tasks") for _, _, lay in rows], pa.int64()),
        "features": pa.array([list(lay.features) for _, _, lay in rows], pa.list_(pa.string())),
        "camera_keys": pa.array([list(lay.camera_keys) for _, _, lay in rows], pa.list_(pa.string())),
        "is_local": [not ("://" in u) or u.startswith("file://") for _, u, _ in rows],
    })


def _common_list_type(types: list[str]) -> str | None:
    """``T[]`` for one-dimensional arrays/lists of different lengths or element types (DuckDB's union would pick
    the longest fixed length and fail on the others' rows), else None (DuckDB's own rule)."""
    bases = []
    for t in types:
        m = _ONE_DIM.match(t)
        if not m:
            return None
        bases.append(m.group("base"))
    if len(set(bases)) == 1:
        return f"{bases[0]}[]"
    numeric = {"FLOAT", "DOUBLE", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
               "UBIGINT", "BOOLEAN"}
    return "DOUBLE[]" if set(bases) <= numeric else None


def union_sql(con: duckdb.DuckDBPyConnection, view: str, names: list[str],
              described: list[dict[str, str]] | None = None, members: list[int] | None = None) -> str:
    """The SQL of top-level ``view``: each dataset's ``view`` with a leading ``dataset`` column, by name.
    ``described``: each dataset's view columns (name -> DuckDB type), else read with DESCRIBE. ``members``: the
    collection positions of the datasets ``names`` are (default: ``names`` is the whole collection, in order).

    Columns whose types differ between datasets: one-dimensional vectors of different lengths or element types
    become lists (``T[]``, ``DOUBLE[]`` across number types); any other difference is DuckDB's union rule, and
    when DuckDB has none the column is read as text, with a warning naming the datasets and types.

    Raises:
        DatasetFormatError: a dataset's view has a column named ``dataset`` (compared as SQL compares names),
            which the collection needs for the dataset's name.
    """
    members = list(range(len(names))) if members is None else members
    if described is None:
        described = [{r[0]: r[1] for r in con.sql(f"DESCRIBE {ident(schema_of(i))}.{ident(view)}").fetchall()}
                     for i in members]
    for name, cols in zip(names, described):
        clash = [c for c in cols if sql_key(c) == "dataset"]
        if clash:
            raise DatasetFormatError(
                f"dataset {name!r}: its {view!r} view has a column {clash[0]!r}, the name a collection gives the "
                "dataset column; rename that feature in the dataset (meta/info.json and the data files) to query "
                "it in a collection")
    by_col: dict[str, dict[str, str]] = {}
    for cols, name in zip(described, names):
        for c, t in cols.items():
            by_col.setdefault(c, {})[name] = t
    casts: dict[str, str] = {}
    for c, per in by_col.items():
        if len(set(per.values())) > 1:
            common = _common_list_type(list(per.values()))
            if common:
                casts[c] = common

    def body(cast_text: dict[str, str]) -> str:
        parts = []
        for i, name, cols in zip(members, names, described):
            sel = []
            for c in cols:
                typ = casts.get(c) or cast_text.get(c)
                sel.append(f"CAST({ident(c)} AS {typ}) AS {ident(c)}" if typ else ident(c))
            parts.append(f"SELECT {literal(name)} AS dataset, {', '.join(sel)} FROM {ident(schema_of(i))}.{ident(view)}")
        return " UNION ALL BY NAME ".join(parts)

    sql = body({})
    if all(len(set(per.values())) == 1 or c in casts for c, per in by_col.items()):
        return sql  # every column has one type across the datasets: the union binds (checking costs a bind)
    try:
        con.sql(f"DESCRIBE {sql}").fetchall()
        return sql
    except duckdb.Error:
        pass
    text = {c: "VARCHAR" for c, per in by_col.items() if len(set(per.values())) > 1 and c not in casts}
    warn(f"collection view {view!r}: column(s) {sorted(text)[:5]} have types DuckDB cannot combine "
         f"({ {c: by_col[c] for c in sorted(text)[:3]} }); they are read as text (VARCHAR) across the "
         "collection: compare them per dataset (WHERE dataset = ...) or rename them to line up")
    return body(text)
