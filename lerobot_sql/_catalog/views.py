"""The views users write SQL against: ``VIEWS``, one small function per view, run in order by ``register_views``.

``register_views`` reads only info.json and Parquet footers: every view over Parquet is lazy and re-reads its
files when queried, so nothing is copied at connect time. The view reference lives in docs/sql.md ("Views").
A new view is one function added to ``VIEWS`` (one built on first use: an entry in
:data:`lerobot_sql._catalog.connection.LAZY_VIEWS` and its placeholder here).

The legacy v2.x layout gets the same views: its JSON-lines metadata is read into Arrow tables shaped like v3's
meta/episodes and meta/tasks.parquet by :mod:`lerobot_sql._format.v2`, and registered as views over those tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from pathlib import Path

import duckdb
import pyarrow as pa

from .._format import v2
from .._format.info import LANGUAGE_EVENTS, LANGUAGE_PERSISTENT, parse_template
from .._format.jsontext import json_text
from .._format.layout import Layout, check_stored_type
from .._format.metadata import corrupt_parquet_files, read_tasks
from .._query.sqltext import ident, literal, number, sql_key
from .._readers import video_index
from .._readers.tabular import FRAME_INTEGERS
from .._storage.source import Source, glob_escape
from ..errors import DatasetFormatError, LeRobotSQLError, as_int, as_real, warn
from . import frames_part, quality

DUCKDB_TYPES = {
    "float32": "FLOAT", "float64": "DOUBLE", "float16": "FLOAT", "int64": "BIGINT", "int32": "INTEGER",
    "int16": "SMALLINT", "int8": "TINYINT", "uint8": "UTINYINT", "uint16": "USMALLINT", "uint32": "UINTEGER",
    "uint64": "UBIGINT", "bool": "BOOLEAN", "string": "VARCHAR",
}


_ARROW_TO_DUCKDB = {pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN", pa.string(): "VARCHAR"}


def _empty_view(columns) -> str:
    """A SELECT of no rows with these (name, Arrow type) columns: a placeholder view with the real columns."""
    return "SELECT " + ", ".join(f"NULL::{_ARROW_TO_DUCKDB[t]} AS {ident(n)}" for n, t in columns) + " WHERE false"


# The columns of the two views a Database fills on first use (db.py: build_video_index, _ensure_video_files), taken
# from the tables that fill them, so a placeholder and its real view cannot drift apart.
VIDEO_FRAMES_COLUMNS = (("video_key", pa.string()), ("chunk_index", pa.int64()), ("file_index", pa.int64()),
                        ("path", pa.string())) + tuple((f.name, f.type) for f in video_index.INDEX_SCHEMA)
VIDEO_FRAMES_EMPTY = _empty_view(VIDEO_FRAMES_COLUMNS)
VIDEO_FILES_EMPTY = _empty_view((f.name, f.type) for f in video_index.PROBE_SCHEMA)

# DuckDB types a stats column may have (per element): numbers and booleans cast to DOUBLE.
_STATS_TYPES = {"BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE"}


def file_list(src: Source, files) -> str:
    """A DuckDB list literal of ``files``' paths (relative to ``src``) as DuckDB reads them, each a quoted literal."""
    # DuckDB expands glob characters in the paths it reads: a local root named ``a*`` would also read a sibling
    # ``ab``'s files. The ``filename`` column still gives the real path.
    esc = glob_escape if src.is_local else (lambda p: p)
    return "[" + ", ".join(literal(esc(src.duckdb_path(f))) for f in files) + "]"


def template_to_printf(template: str, values: dict[str, str]) -> tuple[str, list[str]]:
    """Turn a ``str.format`` path template into a DuckDB ``printf`` format and its argument expressions.

    ``values`` maps placeholder names to SQL expressions; ``{chunk_index:03d}`` becomes ``%03d``. v3 templates
    use ``video_key``, ``chunk_index``, ``file_index``; v2 templates ``episode_chunk`` and ``episode_index``. The
    template is parsed by :func:`lerobot_sql._format.info.parse_template` (Python's own ``str.format`` parser), so the
    SQL builds exactly the path ``str.format`` gives; the format itself is passed as one string literal.

    Raises:
        DatasetFormatError: the template uses a placeholder that ``values`` does not define, or a format spec other
            than ``[0][width]d``.
    """
    args: list[str] = []
    out = []
    for text, name, spec in parse_template(template, set(values), "path template"):
        out.append(text.replace("%", "%%"))
        if name is None:
            continue
        args.append(values[name])
        out.append("%" + spec[:-1] + "d" if spec else "%s")
    return "".join(out), args


def _describe(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, str]:
    return {r[0]: r[1] for r in con.sql(f"DESCRIBE {sql}").fetchall()}


def _empty_episodes_sql(layout: Layout) -> str:
    cols = ["NULL::BIGINT AS episode_index", "NULL::VARCHAR[] AS tasks", "NULL::BIGINT AS length",
            'NULL::BIGINT AS "data/chunk_index"', 'NULL::BIGINT AS "data/file_index"',
            "NULL::BIGINT AS dataset_from_index", "NULL::BIGINT AS dataset_to_index"]
    for k in layout.video_keys:
        cols += [f"NULL::BIGINT AS {ident(f'videos/{k}/chunk_index')}", f"NULL::BIGINT AS {ident(f'videos/{k}/file_index')}",
                 f"NULL::DOUBLE AS {ident(f'videos/{k}/from_timestamp')}", f"NULL::DOUBLE AS {ident(f'videos/{k}/to_timestamp')}"]
    return f"SELECT {', '.join(cols)} WHERE false"


def register_table(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table, relations: dict | None = None,
                    select: str = "*", prefix: str = "") -> None:
    """Make ``name`` a view over the Arrow ``table``, registered as ``_lsql_arrow_<prefix><name>``, and record the
    registration in ``relations`` (each DuckDB cursor needs it registered again: registrations are per connection).
    ``prefix`` keeps the registrations of a collection's datasets apart: a registration is one name per connection,
    whatever schema the view that reads it is in.

    A view over an Arrow scan, never a DuckDB base table: no SQL, even sent straight to ``db.con``, can UPDATE,
    DELETE or INSERT rows that lerobot_sql reads back (a table here let one query swap v2.1 video pointers).
    """
    arrow_name = f"_lsql_arrow_{prefix}{name.strip('_')}"
    con.register(arrow_name, table)
    if relations is not None:
        relations[arrow_name] = table
    con.execute(f"CREATE OR REPLACE VIEW {ident(name)} AS SELECT {select} FROM {ident(arrow_name)}")


def _register_episodes(con: duckdb.DuckDBPyConnection, src: Source, layout: Layout,
                       relations: dict | None = None, prefix: str = "") -> dict[str, str]:
    """Create ``_episodes_raw`` (every meta/episodes column, stats included); return its column -> type."""
    if not layout.episode_files:
        con.execute(f"CREATE OR REPLACE VIEW _episodes_raw AS {_empty_episodes_sql(layout)}")
    elif layout.legacy:
        register_table(con, "_episodes_raw", v2.episodes(src, layout), relations, prefix=prefix)
    else:
        ep_src = f"read_parquet({file_list(src, layout.episode_files)}, union_by_name=true)"
        ep_cols = _describe(con, f"SELECT * FROM {ep_src}")
        if "episode_index" not in ep_cols:
            raise DatasetFormatError(f"{src.path(layout.episode_files[0])}: no episode_index column in episode metadata")
        con.execute(f"CREATE OR REPLACE VIEW _episodes_raw AS SELECT * FROM {ep_src}")
    return _describe(con, "SELECT * FROM _episodes_raw")


# How DuckDB reads lerobot 0.6's language columns (datasets/language.py's Arrow types): (persistent, events).
_MESSAGE = 'STRUCT("role" VARCHAR, "content" VARCHAR, style VARCHAR, {}camera VARCHAR, tool_calls JSON[])[]'
LANGUAGE_TYPES = (_MESSAGE.format('"timestamp" FLOAT, '), _MESSAGE.format(""))


def _empty_frames_sql(layout: Layout) -> str:
    cols = []
    for f in layout.features.values():
        if f.is_video:
            continue
        if f.dtype == "language":
            typ = LANGUAGE_TYPES[f.name != LANGUAGE_PERSISTENT]
        elif f.is_image or f.dtype == "string":
            typ = "VARCHAR"
        elif f.dtype in DUCKDB_TYPES:
            typ = DUCKDB_TYPES[f.dtype] + (f"[{f.shape[0]}]" if len(f.shape) == 1 and f.shape[0] != 1 else "")
            if len(f.shape) > 1:
                typ = DUCKDB_TYPES[f.dtype] + "[]" * len(f.shape)
        else:
            typ = "VARCHAR"
        cols.append(f"NULL::{typ} AS {ident(f.name)}")
    for c, typ in (("timestamp", "FLOAT"), ("frame_index", "BIGINT"), ("episode_index", "BIGINT"),
                   ("index", "BIGINT"), ("task_index", "BIGINT")):
        if c not in layout.features:
            cols.append(f"NULL::{typ} AS {c}")
    return f"SELECT {', '.join(cols)} WHERE false"




@dataclasses.dataclass
class Build:
    """What each view function of :data:`VIEWS` gets: the connection, the dataset, the Arrow tables registered so
    far (``relations``, filled by the functions) and the columns of ``_episodes_raw`` (name -> DuckDB type)."""

    con: duckdb.DuckDBPyConnection
    src: Source
    layout: Layout
    relations: dict[str, pa.Table]
    episode_columns: dict[str, str]
    prefix: str = ""  # of the Arrow registrations (see register_table)
    # The data files the frames view reads, and (path, why) of every other Parquet file under data/: set by
    # _split_unnamed before the views are made (layout.data_files less the files no episode names).
    data_files: tuple[str, ...] = ()
    strays: tuple[tuple[str, str], ...] = ()
    cache_dir: Path | None = None  # the dataset's cache folder: checks whose result is kept per file version
    survey: dict | None | bool = False  # _footer_survey's finding, once made (False: not yet)
    # The frames view's columns (name -> DuckDB type) once it is made; None: read them with DESCRIBE.
    frame_columns: dict[str, str] | None = None
    # How frames is made, for a query's part of it (frames_part); None: queries read the whole view.
    frames_plan: "frames_part.FramesPlan | None" = None


def episodes(b: Build) -> None:
    """``episodes``: meta/episodes without its stats columns, plus ``duration_s``."""
    ep_cols = b.episode_columns
    plain = [c for c in ep_cols if not c.startswith("stats/")]
    dur = f", length / {number(b.layout.fps)} AS duration_s" if "length" in ep_cols else ""
    b.con.execute(f"CREATE OR REPLACE VIEW episodes AS SELECT {', '.join(map(ident, plain))}{dur} FROM _episodes_raw")


def episode_stats(b: Build) -> None:
    """``episode_stats``: meta/episodes' ``stats/<feature>/<stat>`` columns unpivoted to (episode_index, feature,
    stat, value DOUBLE[]); a column that is not numbers is left out, with a warning."""
    cols, names, skipped = [], [], []
    for c, typ in b.episode_columns.items():
        m = re.fullmatch(r"stats/(.+)/([^/]+)", c, re.DOTALL)  # a feature name may hold a newline
        if not m:
            continue
        # A stats column of text or structs cannot become DOUBLE[]: the cast would fail every query of the view
        # with an error that blames the user's SQL. Such a column is left out of episode_stats, with a warning.
        base = re.sub(r"(\[\d*\])+$", "", typ)
        if base not in _STATS_TYPES and not base.startswith("DECIMAL"):
            skipped.append(f"{c!r} ({typ})")
            continue
        depth = typ.count("[]")
        expr = ident(c)
        for _ in range(max(depth - 1, 0)):
            expr = f"flatten({expr})"
        if depth == 0:
            expr = f"[{expr}]"
        cols.append(f"CAST({expr} AS DOUBLE[]) AS {ident(str(len(names)))}")
        names.append((m.group(1), m.group(2)))
    if names:
        # One scan of meta/episodes, unpivoted: a UNION ALL of one SELECT per stats column took ~0.1 s to bind.
        on = ", ".join(ident(str(i)) for i in range(len(names)))
        keys = ", ".join(f"({literal(str(i))}, {literal(f)}, {literal(st)}, {i})" for i, (f, st) in enumerate(names))
        body = (f"SELECT u.episode_index, m.feature, m.stat, u.value FROM (SELECT episode_index, {', '.join(cols)} "
                f"FROM _episodes_raw) UNPIVOT INCLUDE NULLS (value FOR k IN ({on})) u "
                f"JOIN (VALUES {keys}) m(k, feature, stat, pos) USING (k) ORDER BY m.pos, u.episode_index")
    else:
        body = ("SELECT NULL::BIGINT AS episode_index, NULL::VARCHAR AS feature, NULL::VARCHAR AS stat, "
                "NULL::DOUBLE[] AS value WHERE false")
    b.con.execute(f"CREATE OR REPLACE VIEW episode_stats AS {body}")
    if skipped:
        warn(f"meta/episodes: {len(skipped)} stats column(s) are not numbers and are left out of "
             f"episode_stats: {', '.join(skipped[:5])}; they stay in the meta/episodes files "
             "(restore meta/episodes from the dataset's source to have them back)")


def _warn_features_vs_columns(layout: Layout, data_cols: dict[str, str], first: str, derived=()) -> None:
    """Warn when info.json and the data files disagree on which features exist: a declared (non-video) feature with
    no data column gives items without that key, and a list column info.json does not declare is read untyped
    (and an export would write it without a feature entry). Both are fixed in meta/info.json. The default columns
    in ``derived`` are left to :func:`_derived_columns`' own warnings (SQL has them; items do not)."""

    absent = [k for k, f in layout.features.items() if not f.is_video and k not in data_cols and k not in derived]
    if absent:
        warn(f"{first}: meta/info.json declares feature(s) {absent} that the data files have no column for; "
             "items and queries will not have them. Remove them from meta/info.json's features, or restore "
             "the data files")
    undeclared = [c for c, t in data_cols.items() if c not in layout.features and t.endswith("]")]
    if undeclared:
        warn(f"{first}: data column(s) {undeclared} hold vectors but meta/info.json declares no feature for "
             "them (dtype, shape, names): they are read as untyped lists. Add them to meta/info.json's "
             "features")


def frames(b: Build) -> None:
    """``frames`` (every data-file column; fixed-length vectors as DuckDB arrays, images as their path) and the
    private ``_frames_loc`` (frame -> data file and row)."""
    con, src, layout = b.con, b.src, b.layout
    if not b.data_files:
        con.execute(f"CREATE OR REPLACE VIEW frames AS {_empty_frames_sql(layout)}")
        con.execute("CREATE OR REPLACE VIEW _frames_loc AS SELECT NULL::BIGINT AS index, NULL::BIGINT AS episode_index, "
                    "NULL::BIGINT AS frame_index, NULL::FLOAT AS timestamp, NULL::BIGINT AS task_index, "
                    "NULL::VARCHAR AS data_file, NULL::BIGINT AS row WHERE false")
        return
    # union_by_name lines up files whose columns differ (in order or presence) but reads every footer to bind
    uniform = (_footer_survey(b) or {}).get("uniform", False)
    data_src = f"read_parquet({file_list(src, b.data_files)}{'' if uniform else ', union_by_name=true'}"
    try:
        data_cols = _describe(con, f"SELECT * FROM {data_src})")
    except duckdb.Error:
        # A damaged data file (a partial download): union_by_name reads every footer here, so one bad file
        # would fail every view, the metadata ones too. The frames view is then made over all the files
        # without union_by_name (DuckDB takes the schema from the first, a readable one, and opens the others
        # when a query runs): every query reading frames raises naming the damaged file (query_error), none
        # reads the other files' rows alone (no frame is silently missing), and episodes, tasks, ... stay
        # readable. No damaged file found (or all of them): the original error stands.
        damaged = set(corrupt_parquet_files(src, layout))
        good = [f for f in b.data_files if src.path(f) not in damaged]
        if not good or len(good) == len(b.data_files):
            raise
        data_cols = _describe(con, f"SELECT * FROM read_parquet({file_list(src, good)}, union_by_name=true)")
        order = good[:1] + [f for f in b.data_files if f != good[0]]
        data_src = f"read_parquet({file_list(src, order)}"
        bad = sorted(damaged & {src.path(f) for f in b.data_files})
        warn(f"{len(bad)} of {len(b.data_files)} data file(s) cannot be read as Parquet (truncated or "
             f"corrupt), e.g. {bad[0]}: every query over frames raises until it is re-downloaded from the "
             "dataset's source; the metadata views (episodes, episode_stats, tasks, videos, ...) read as usual, "
             "and so do items of the episodes in the other files (`lerobot-sql doctor` checks every file)")
    first = src.path(b.data_files[0])
    derived, from_meta = _derived_columns(b, data_cols, first)
    _warn_features_vs_columns(layout, data_cols, first, derived)
    sel = []
    for c, typ in data_cols.items():
        feat = layout.features.get(c)
        check_stored_type(feat, re.sub(r"(\[\d*\])+$", "", typ) in ("FLOAT", "DOUBLE") or
                          typ.startswith("DECIMAL"), first)
        if c in (*FRAME_INTEGERS, "timestamp") and not (typ in _NUMBER_TYPES or typ.startswith("DECIMAL")):
            # (a string or TIMESTAMP here ended every frame query in DuckDB's bare binder error)
            raise DatasetFormatError(f"{first}: column {c!r} is stored as {typ}, not as numbers (lerobot writes "
                                     f"{'float32 seconds' if c == 'timestamp' else 'int64'}); rewrite the data files "
                                     "with that column as lerobot writes it, or restore them from the dataset's source")
        if feat is not None and feat.is_image and typ.startswith("STRUCT"):
            sel.append(f"{ident(c)}.path AS {ident(c)}")
        elif feat is not None and len(feat.shape) == 1 and typ.endswith("[]") and feat.dtype in DUCKDB_TYPES:
            sel.append(f"CAST({ident(c)} AS {DUCKDB_TYPES[feat.dtype]}[{feat.shape[0]}]) AS {ident(c)}")
        else:
            sel.append(ident(c))
    # A task_index derived from meta/episodes is a column of frames like index (the value _frames_loc, manifests and
    # the items' task text use); one that is not (it raises when read, or 0 without a tasks file) only in _frames_loc.
    sel += [ident(c) for c in derived if c != "task_index" or c in from_meta]
    # Each frame's file and row come from DuckDB's own columns, which a data column of the same name (compared
    # as DuckDB does, ignoring ASCII case) would clash with. The file name column can be renamed; the row
    # number cannot (DuckDB 2.0 has no such option), so a data column named like it is refused.
    keys = {sql_key(c) for c in data_cols}
    if "file_row_number" in keys:
        col = next(c for c in data_cols if sql_key(c) == "file_row_number")
        raise DatasetFormatError(
            f"{first}: the data column {col!r} has the name of DuckDB's row-number "
            "column, which lerobot_sql needs to locate each frame's row; it is not a LeRobot feature: rename or "
            "drop it in the data files")
    fname = "_lsql_data_file"
    while sql_key(fname) in keys:
        fname += "_"

    extra = ", ".join(f"{expr} AS {ident(c)}" for c, expr in derived.items()) or None
    # (one spelling of the views' SELECTs: a query's part of frames or _frames_loc (frames_part) is the same SELECT
    # over fewer rows)
    plan = frames_part.FramesPlan(src, tuple(b.data_files), dict(data_cols), ", ".join(sel), extra, b.cache_dir,
                                  fname)
    con.execute(f"CREATE OR REPLACE VIEW frames AS {plan.body(data_src + ')')}")
    if uniform:
        b.frames_plan = plan  # (files of several schemas, or a damaged one: every query reads the views whole)
    # (the language view's columns come from here: a second DESCRIBE of frames would bind it again)
    b.frame_columns = {**data_cols, **dict.fromkeys(derived, "")}
    root = src.duckdb_path("")
    con.execute("CREATE OR REPLACE VIEW _frames_loc AS " + plan.loc_body(
        f"{data_src}, filename={literal(fname)}, file_row_number=true)", f"substr({ident(fname)}, {len(root) + 1})"))


# The marker query_error (_catalog/connection.py) turns back into a DatasetFormatError: a view over data that lacks
# a column raises through DuckDB's error() only when a query reads that column, so every other view and column
# stays readable.
ERROR_MARKER = "lerobot_sql.DatasetFormatError: "


def _raise_sql(message: str, typ: str) -> str:
    return f"error({literal(ERROR_MARKER + message)})::{typ}"


def _derived_columns(b: Build, data_cols: dict[str, str], first: str) -> tuple[dict[str, str], set[str]]:
    """SQL expressions (over the data row ``d``, reading ``_episodes_raw`` and ``tasks``) for the default columns
    the data files lack, in the order of the defaults, and the names of those derived from the metadata. Each is
    derived where the metadata makes it unambiguous, else raises when read, naming the column and the file:

    * ``index`` (v2.x only: lerobot v2.1 numbers frames by episode order) is ``dataset_from_index + frame_index``,
      the episode's start from the cumulative lengths of meta/episodes.jsonl; a frame_index outside the episode's
      length raises rather than give another episode's index.
    * ``task_index`` is the index of the episode's task when meta/episodes lists exactly one for every episode
      (and the tasks table holds that text once); else reading it raises, naming an episode with several.
    * ``episode_index``, ``frame_index``, ``timestamp``: never derived.

    Items never carry a derived column: an item holds its data row's own columns, as lerobot's do (lerobot's
    LeRobotDataset does not read such files at all: it casts the data to info.json's features and looks each
    item's task up by its ``task_index``). One warning says which keys items lack, beside what SQL derives.
    """
    con, layout = b.con, b.layout
    eps = b.episode_columns
    out: dict[str, str] = {}
    from_meta: set[str] = set()
    notes = []
    for c, typ in (("index", "BIGINT"), ("episode_index", "BIGINT"), ("frame_index", "BIGINT"),
                   ("timestamp", "FLOAT"), ("task_index", "BIGINT")):
        if c in data_cols:
            continue
        why = (f"{first}: the data files lack the {c!r} column (a default LeRobot column, every frame has one)")
        if c == "index" and layout.legacy and {"episode_index", "frame_index"} <= data_cols.keys() and \
                {"episode_index", "dataset_from_index", "length"} <= eps.keys() and \
                con.sql("SELECT count(*) = count(DISTINCT episode_index) FROM _episodes_raw").fetchall()[0][0]:
            bad = _raise_sql(f"{why}; it is derived as the episode's start (meta/episodes.jsonl lengths) + "
                             "frame_index, but a frame_index lies outside its episode's length or its episode is "
                             "not in meta/episodes.jsonl: rewrite the data files with an index column", "BIGINT")
            out[c] = (f"COALESCE((SELECT min(e.dataset_from_index) + d.frame_index FROM _episodes_raw e WHERE "
                      "e.episode_index = d.episode_index AND d.frame_index >= 0 AND d.frame_index < e.length), "
                      f"{bad})")
            notes.append(f"{why}: derived as each episode's start (the cumulative lengths of "
                         "meta/episodes.jsonl, as lerobot v2.1 numbers frames) + frame_index")
            from_meta.add(c)
        elif c == "task_index" and layout.tasks_file is not None and "tasks" in eps and "episode_index" in data_cols:
            # Decided for the whole dataset here, not row by row: DuckDB may compute a column for rows a query
            # later filters out, so a per-row error would fire in queries about other episodes.
            n_bad, example = con.sql(
                "SELECT count(*) FILTER (WHERE n <> 1), min(episode_index) FILTER (WHERE n <> 1) FROM (SELECT "
                "e.episode_index, (SELECT count(*) FROM tasks t WHERE len(e.tasks) = 1 AND t.task = e.tasks[1]) "
                "+ (SELECT count(*) - 1 FROM _episodes_raw e2 WHERE e2.episode_index = e.episode_index) AS n "
                "FROM _episodes_raw e)").fetchall()[0]
            if n_bad == 0:
                bad = _raise_sql(f"{why}; it is derived from the episode's one task in meta/episodes, but this "
                                 "frame's episode is not in meta/episodes: add task_index to the data files", "BIGINT")
                out[c] = (f"COALESCE((SELECT min(t.task_index) FROM tasks t, _episodes_raw e WHERE e.episode_index = "
                          f"d.episode_index AND t.task = e.tasks[1]), {bad})")
                notes.append(f"{why}: derived from each episode's one task in meta/episodes")
                from_meta.add(c)
            else:
                out[c] = _raise_sql(f"{why}; it cannot be derived from meta/episodes: {n_bad} episode(s) (e.g. "
                                    f"episode {example}) list more than one task, or one the tasks table does not "
                                    "hold exactly once. Items need each frame's task: add task_index to the data "
                                    "files", "BIGINT")
                notes.append(f"{why}: {n_bad} episode(s) (e.g. episode {example}) do not have exactly one task, so "
                             "it cannot be derived; queries and items that read it raise, the other views and "
                             "columns work")
        elif c == "task_index" and layout.tasks_file is None:
            out[c] = "0::BIGINT"  # no tasks file: items refuse for the missing task text (load_layout warned)
        else:
            out[c] = _raise_sql(f"{why}; only the views and columns that do not need it can be read: rewrite the "
                                f"data files with a {c!r} column", typ)
            notes.append(f"{why}: queries and items that read it raise; the other views and columns work")
    if out:
        keys = " and ".join(repr(c) for c in out)
        declared = [c for c in out if c in layout.features]
        why_not = ([f"it casts them to info.json's features, which list {declared}"] if declared else []) + (
            ["its items look their task up by task_index"] if "task_index" in out else [])
        lerobot = (f"lerobot's LeRobotDataset does not read these files at all: {'; '.join(why_not)}" if why_not
                   else "lerobot's items lack them too")
        notes.append(f"{first}: items of dataset() carry no {keys} key: an item holds its data row's own columns, "
                     f"as lerobot's items do ({lerobot}). The derived values serve queries, manifests and the "
                     "items' task text; rewrite the data files with the column(s) to have them in items")
    for n in notes:
        warn(n)
    return out, from_meta


def tasks(b: Build) -> None:
    """``tasks``: (task_index, task), read whole (:func:`lerobot_sql._format.metadata.read_tasks`)."""
    register_table(b.con, "tasks", read_tasks(b.src, b.layout), b.relations, prefix=b.prefix)


def _episode_data_files_sql(b: Build) -> str | None:
    """The SELECT of (episode_index, path): the data file meta/episodes points each episode to (data/chunk_index,
    data/file_index through info.json's data_path; v2.x: episode_index // chunks_size and episode_index, as
    :func:`lerobot_sql._format.v2.episodes` shapes them); None when meta/episodes has no such pointers."""
    if not all(c in b.episode_columns for c in ("data/chunk_index", "data/file_index")):
        return None
    values = {"chunk_index": ident("data/chunk_index"), "file_index": ident("data/file_index"),
              "episode_chunk": ident("data/chunk_index"), "episode_index": ident("data/file_index")}
    fmt, args = template_to_printf(b.layout.data_path, values)
    return f"SELECT episode_index, printf({literal(fmt)}, {', '.join(args)}) AS path FROM _episodes_raw"


def _split_unnamed(b: Build) -> None:
    """Set ``b.data_files`` (what the frames view reads) and ``b.strays`` (path, why): the layout's strays (names
    data_path cannot give), plus the data files no episode of meta/episodes points to whose rows are no episode's
    own.

    The rule, v2.x and v3.x alike: a file data_path matches but no episode names (v2: episode_chunk/episode_index
    of an episode of meta/episodes.jsonl; v3: its data/chunk_index, data/file_index) is a stray when it has no
    ``episode_index`` column (raw recorder output named like an episode file) or each of its episodes is either
    not in meta/episodes or has its rows in the files meta/episodes names (a copy left by a half-finished merge).
    Read, such a file gave rows with NULL episode_index (its columns added to the view) or every copied frame
    twice. A file holding the only rows of an episode of meta/episodes is read whatever the pointers say (lerobot
    issue #2401's converter pointed the first episode of a new file at the previous one): rows are found by
    episode_index. No pointers in meta/episodes: no file is judged. The file contents are scanned only when some
    file is not named (one small query over meta/episodes otherwise).
    """
    con, src, layout = b.con, b.src, b.layout
    b.data_files = layout.data_files
    b.strays = tuple((p, f"its name does not match info.json's data_path {layout.data_path!r}")
                     for p in layout.stray_data_files)
    sql = _episode_data_files_sql(b)
    if sql is None or not layout.data_files:
        return
    named = {r[0] for r in con.sql(f"SELECT DISTINCT path FROM ({sql}) WHERE path IS NOT NULL").fetchall()}
    unnamed = [f for f in layout.data_files if f not in named]
    if not unnamed:
        return
    meta, verb = ("meta/episodes.jsonl", "names") if layout.legacy else ("meta/episodes", "points to")
    why: dict[str, str] = {}
    try:
        with_eps = []
        for f in unnamed:
            if "episode_index" in _describe(con, f"SELECT * FROM read_parquet({file_list(src, [f])})"):
                with_eps.append(f)
            else:
                why[f] = f"no episode of {meta} {verb} it and it has no episode_index column"
        if with_eps:
            # each unnamed file's episodes, one query per file (only files no episode names: rare, and few)
            eps = {f: {r[0] for r in con.sql(f"SELECT DISTINCT episode_index FROM read_parquet("
                                              f"{file_list(src, [f])}) WHERE episode_index IS NOT NULL").fetchall()}
                   for f in with_eps}
            known = {r[0] for r in con.sql("SELECT DISTINCT episode_index FROM _episodes_raw").fetchall()}
            named_here = [f for f in layout.data_files if f in named]
            found = set()
            ours = [f for f in with_eps if eps[f] & known]  # rows of episodes meta/episodes lists
            if ours and named_here:
                # which of those episodes have rows in the named files (values never pasted: data is hostile)
                found = {r[0] for r in con.sql(
                    f"SELECT DISTINCT episode_index FROM read_parquet({file_list(src, named_here)}, "
                    "union_by_name=true) WHERE episode_index IN (SELECT episode_index FROM _episodes_raw) AND "
                    f"episode_index IN (SELECT episode_index FROM read_parquet({file_list(src, ours)}, "
                    "union_by_name=true))").fetchall()}
            for f in with_eps:
                if eps[f] & (known - found):
                    continue  # the only rows of some episode: the dataset's own, whatever its pointers say
                why[f] = (f"no episode of {meta} {verb} it and the rows of its episodes are in the files {meta} "
                          f"{verb} (a copy: read, they would count twice)" if eps[f] & known else
                          f"no episode of {meta} {verb} it and its rows are of no episode of {meta}")
    except duckdb.Error:
        return  # a file that cannot be read: the frames view names it (views.frames), every file stays in
    if not why:
        return
    b.data_files = tuple(f for f in layout.data_files if f not in why)
    b.strays = tuple(sorted(b.strays + tuple(why.items())))
    shown = "; ".join(f"{f}: {w}" for f, w in list(why.items())[:5]) + (
        f"; and {len(why) - 5} more" if len(why) > 5 else "")
    fix = ("if one is an episode's own file, add the episode to meta/episodes.jsonl" if layout.legacy else
           "if one holds an episode's rows, point the episode's data/chunk_index and data/file_index in "
           "meta/episodes to it")
    warn(f"{src.path('data')}: {len(why)} data file(s) match info.json's data_path but no episode of {meta} "
         f"{verb} them, and their rows are no episode's own, so they are not read as frames ({shown}). "
         f"`lerobot-sql doctor` lists them (data_files_stray): move them out of data/ ({fix})")


_NUMBER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                 "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE"}


def _warn_repeated_rows(b: Build) -> None:
    """Warn, naming both files, when a data file's rows repeat ``index`` values another data file holds (a file
    copied over another by a half-finished merge or download): every count over frames would count those frames
    twice, without a word. Candidates come from the Parquet footers' min/max of ``index`` (``episode_index`` when
    the data has no index), read with pyarrow (:func:`lerobot_sql._readers.tabular.data_file_info`: parsed once per
    process, the dataset reads the same footers; DuckDB's ``parquet_metadata`` took 3.9 s at 100k row groups); only
    overlapping files are scanned, to count the repeated values. Files without statistics are not judged (doctor's
    index_contiguous scans every row)."""
    con, src, files = b.con, b.src, b.data_files
    if len(files) < 2:
        return
    found = _repeated_candidates(b)
    if found is None:
        return
    col, pairs = found
    try:
        for (a, _alo, _ahi, _an), (f, lo, hi, n) in pairs[:3]:
            k = con.sql(f"SELECT count(*) FROM read_parquet({file_list(src, [f])}) WHERE {ident(col)} IN "
                        f"(SELECT {ident(col)} FROM read_parquet({file_list(src, [a])}))").fetchall()[0][0]
            if k:
                what = "`index` values" if col == "index" else "episodes (episode_index values)"
                warn(f"{src.path(f)}: {k} of its {n} rows repeat {what} that {a} holds ({col} {lo}..{hi}): every "
                     "count over frames has those frames counted twice, and a query selecting them by index is "
                     "refused. A data file copied over another (a half-finished merge or download)? Restore the "
                     "data files from the dataset's source (`lerobot-sql doctor`: index_contiguous lists the "
                     "repeated values)")
    except duckdb.Error:
        return  # a damaged file: the frames view names it at the first query that reads it


def _repeated_candidates(b: Build) -> tuple[str, list] | None:
    """(column, pairs of data files whose ``index`` ranges overlap: ``((file, lo, hi, rows), (file, lo, hi,
    rows))``) from the footers' statistics (:func:`_footer_survey`), or None when they cannot be judged."""
    survey = _footer_survey(b)
    return None if survey is None else survey["repeated"]


def _footer_survey(b: Build) -> dict | None:
    """What the connection needs from every data file's footer, read with pyarrow once per version of the data
    files: ``{"repeated": (column, overlapping pairs) or None, "uniform": whether every file has the same Arrow
    schema}``; None when a footer cannot be read (a damaged or missing file: the frames view names it).

    Each footer is parsed and let go (100,000 row groups: 0.7 s and 640 MB if kept); the survey is kept on the
    build and in the dataset's cache folder under the data files' versions, so a later connect to the same files
    parses none. Why "uniform": DuckDB's ``union_by_name`` reads every footer to bind the frames view (0.7 s at
    100,000 row groups, at every connect); files of one schema need only the first one's.
    """
    if b.survey is not False:
        return b.survey
    from .._readers.tabular import keep_facts, release_freed_memory
    from .._storage import cache

    src, files = b.src, b.data_files
    memo = None
    if len(files) < 2:
        b.survey = {"repeated": None, "uniform": True}
        return b.survey
    try:
        identities = [src.identity(f) for f in files]
    except (OSError, LeRobotSQLError):
        b.survey = None  # a missing file: the frames view names it at the first query that reads it
        return None
    if b.cache_dir is not None:
        try:
            memo = b.cache_dir / cache.CHECKS / f"footers-{cache.key(3, src.url, list(zip(files, identities)))}.json"
            kept = json.loads(memo.read_text())
            rep = kept["repeated"]
            b.survey = {"repeated": None if rep is None else (rep["col"], [tuple(map(tuple, p)) for p in rep["pairs"]]),
                        "uniform": bool(kept["uniform"])}
            return b.survey
        except (OSError, ValueError, KeyError, TypeError, LeRobotSQLError):
            pass  # not kept yet (or unreadable): judged below
    col, ranges, schema, uniform = None, [], None, True

    def each(f: int, md, rows) -> None:
        nonlocal col, schema, uniform
        # (the facts an open of a selection reads from each footer, kept from this pass: it parses none again)
        keep_facts(src, files[f], identities[f], b.cache_dir, md, rows)
        this = md.schema.to_arrow_schema()
        if schema is None:
            schema = this
        elif uniform and not this.equals(schema, check_metadata=False):
            uniform = False
        if col is None:
            paths = {md.schema.column(j).path for j in range(md.num_columns)}
            col = "index" if "index" in paths else "episode_index"  # v2.x without index: derived per episode

    try:
        # (one pass over the footers: the row groups' ranges a bounded query narrows by are kept from it too)
        arrays = frames_part.ranges_arrays(src, files, identities, each)
    except (OSError, pa.ArrowException, LeRobotSQLError):
        b.survey = None  # a damaged or missing file: the frames view names it at the first query that reads it
        return None
    finally:
        release_freed_memory()
    if uniform:
        frames_part.keep_ranges(src, files, identities, b.cache_dir, arrays)
    for f, rel in enumerate(files):
        at = arrays["data_file"] == f
        if at.any() and arrays[f"known/{col}"][at].all():  # (else not judged, as DuckDB's TRY_CAST left it out)
            ranges.append((rel, int(arrays[f"lo/{col}"][at].min()), int(arrays[f"hi/{col}"][at].max()),
                           int(arrays["rows"][at].sum())))
    ranges.sort(key=lambda r: (r[1], r[0]))
    pairs, prev = [], None
    for f, lo, hi, n in ranges:
        if prev is not None and lo <= prev[2]:
            pairs.append((prev, (f, lo, hi, n)))
        if prev is None or hi > prev[2]:
            prev = (f, lo, hi, n)
    b.survey = {"repeated": None if col is None else (col, pairs), "uniform": uniform}
    if memo is not None:
        with contextlib.suppress(OSError):  # a read-only cache: judged again next time
            memo.parent.mkdir(parents=True, exist_ok=True)
            rep = None if col is None else {"col": col, "pairs": pairs}
            cache.atomic_write(memo, json.dumps({"repeated": rep, "uniform": uniform}).encode())
    return b.survey


def data_files(b: Build) -> None:
    """``_data_files_listed`` (the data files the frames view reads), ``_data_files_stray`` (path, reason: the
    other Parquet files under data/, not read: doctor's data_files_stray) and ``_episode_data_files`` (the file
    meta/episodes points each episode to): doctor's data_files_present, and the warning a connection gives when
    episodes point to files that are not there."""
    con = b.con
    register_table(con, "_data_files_listed", pa.table({"path": pa.array(list(b.data_files), pa.string())}),
                    b.relations, prefix=b.prefix)
    register_table(con, "_data_files_stray",
                    pa.table({"path": pa.array([p for p, _ in b.strays], pa.string()),
                              "reason": pa.array([w for _, w in b.strays], pa.string())}), b.relations,
                    prefix=b.prefix)
    sql = _episode_data_files_sql(b)
    if sql is not None:
        con.execute(f"CREATE OR REPLACE VIEW _episode_data_files AS {sql}")
    else:
        con.execute("CREATE OR REPLACE VIEW _episode_data_files AS SELECT NULL::BIGINT AS episode_index, "
                    "NULL::VARCHAR AS path WHERE false")


def videos(b: Build) -> None:
    """``videos``: one row per (episode, camera): the mp4 path from the template, its clip's from/to timestamps.

    A camera whose meta/episodes names its files (``chunk_index``, ``file_index``) but lacks the ``from_timestamp``
    / ``to_timestamp`` columns gets its rows with NULL times, as a NULL cell of those columns would: its mp4s are
    still known (doctor probes and indexes them), and no frame is located in a clip without bounds (the manifest
    refuses a NULL from_timestamp as a missing pointer)."""
    layout, ep_cols = b.layout, b.episode_columns
    vids = []
    for k in layout.video_keys:
        need = [f"videos/{k}/{c}" for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        if not all(c in ep_cols for c in need[:2]):
            continue
        times = [f"CAST({ident(c)} AS DOUBLE)" if c in ep_cols else "NULL::DOUBLE" for c in need[2:]]
        values = {"video_key": literal(k), "chunk_index": ident(need[0]), "file_index": ident(need[1])}
        if layout.legacy:
            values.update(episode_chunk=ident(need[0]), episode_index=ident(need[1]))
        fmt, args = template_to_printf(layout.video_path, values)
        vids.append(
            f"SELECT episode_index, {literal(k)} AS video_key, CAST({ident(need[0])} AS BIGINT) AS chunk_index, "
            f"CAST({ident(need[1])} AS BIGINT) AS file_index, printf({literal(fmt)}, {', '.join(args)}) AS path, "
            f"{times[0]} AS from_timestamp, {times[1]} AS to_timestamp FROM _episodes_raw"
        )
    empty = ("SELECT NULL::BIGINT AS episode_index, NULL::VARCHAR AS video_key, NULL::BIGINT AS chunk_index, "
             "NULL::BIGINT AS file_index, NULL::VARCHAR AS path, NULL::DOUBLE AS from_timestamp, "
             "NULL::DOUBLE AS to_timestamp WHERE false")
    b.con.execute(f"CREATE OR REPLACE VIEW videos AS {' UNION ALL '.join(vids) or empty}")


def _depth_quantizer(f) -> dict:
    """A depth map's quantizer as lerobot 0.6 decodes it (info.json's values, lerobot's defaults where absent); {}
    for other features, and for a depth map whose values are unusable (its items are refused, naming them)."""
    if not (f.is_video and f.is_depth_map):
        return {}
    try:
        return f.depth_quantization
    except DatasetFormatError:
        return {}


def features(b: Build) -> None:
    """``features``: one row per info.json feature (dtype, shape, names as JSON, the video settings, the depth-map
    entries lerobot 0.6 reads, and the feature's whole ``info`` block as JSON)."""
    fs = list(b.layout.features.values())
    quant = [_depth_quantizer(f) for f in fs]
    unit = [f.depth_unit if f.is_depth_map and isinstance(f.depth_unit, str) else None for f in fs]
    feats = pa.table({
        "name": [f.name for f in fs],
        "dtype": [f.dtype for f in fs],
        "shape": pa.array([list(f.shape) for f in fs], pa.list_(pa.int64())),
        "names": [json_text(f.names) for f in fs],
        "is_video": [f.is_video for f in fs],
        "codec": pa.array([_text(f.info.get("video.codec")) for f in fs], pa.string()),
        "fps": pa.array([_real(f.info.get("video.fps")) for f in fs], pa.float64()),
        "height": pa.array([_whole(f.info.get("video.height")) for f in fs], pa.int64()),
        "width": pa.array([_whole(f.info.get("video.width")) for f in fs], pa.int64()),
        "pix_fmt": pa.array([_text(f.info.get("video.pix_fmt")) for f in fs], pa.string()),
        "is_depth_map": [f.is_depth_map for f in fs],
        "depth_unit": pa.array(unit, pa.string()),
        "depth_min": pa.array([q.get("depth_min") for q in quant], pa.float64()),
        "depth_max": pa.array([q.get("depth_max") for q in quant], pa.float64()),
        "depth_shift": pa.array([q.get("shift") for q in quant], pa.float64()),
        "depth_use_log": pa.array([q.get("use_log") for q in quant], pa.bool_()),
        "info": [json_text(f.own_info or f.video_info) for f in fs],
    })
    register_table(b.con, "features", feats, b.relations,
                   select="* EXCLUDE (names, info), CAST(names AS JSON) AS names, CAST(info AS JSON) AS info",
                   prefix=b.prefix)


# info.json values of the type each column holds, else NULL: a writer's odd value (a string fps, a list codec)
# reads as NULL in these columns and as written in the JSON ones (features.info, info.info_json).
def _text(v):
    return v if isinstance(v, str) else None


def _real(v):
    return as_real(v)


def _whole(v):
    n = as_int(v)
    return n if n is not None and -2**63 <= n < 2**63 else None


def info(b: Build) -> None:
    """``info``: one row of info.json's settings (fps, version, totals, path templates), its ``tools`` (JSON, NULL
    when the dataset declares none) and the whole file as JSON (``info_json``: every key, unknown ones too)."""
    layout = b.layout
    i = layout.info
    table = pa.table({
        "fps": [layout.fps],
        "codebase_version": [layout.version],
        "robot_type": pa.array([_text(i.get("robot_type"))], pa.string()),
        "total_episodes": pa.array([_whole(i.get("total_episodes"))], pa.int64()),
        "total_frames": pa.array([_whole(i.get("total_frames"))], pa.int64()),
        "total_tasks": pa.array([_whole(i.get("total_tasks"))], pa.int64()),
        "chunks_size": pa.array([_whole(i.get("chunks_size"))], pa.int64()),
        "data_path": [layout.data_path],
        "video_path": pa.array([layout.video_path], pa.string()),
        "tools": pa.array([None if i.get("tools") is None else json_text(i["tools"])], pa.string()),
        "info_json": [json_text(i, b.src.path("meta/info.json"))],
    })
    register_table(b.con, "info", table, b.relations,
                   select="* EXCLUDE (tools, info_json), CAST(tools AS JSON) AS tools, "
                          "CAST(info_json AS JSON) AS info_json", prefix=b.prefix)


def tools(b: Build) -> None:
    """``tools``: one row per entry of info.json's ``tools`` (OpenAI-style function schemas, lerobot 0.6's
    ``DatasetInfo.tools``): position (1-based), type, name, description, parameters (JSON) and the whole entry
    (JSON); no rows when the dataset declares none (lerobot then falls back to its ``say`` tool)."""
    raw = b.layout.info.get("tools")
    if raw is not None and not isinstance(raw, list):
        warn(f"{b.src.path('meta/info.json')}: 'tools' is {type(raw).__name__}, not a list of tool schemas; the "
             "tools view is empty (info.tools holds the value as JSON). lerobot writes a list of OpenAI-style "
             "function schemas there")
        raw = None
    entries = raw or []
    fn = [e.get("function") if isinstance(e, dict) and isinstance(e.get("function"), dict) else {} for e in entries]
    table = pa.table({
        "position": pa.array(range(1, len(entries) + 1), pa.int64()),
        "type": pa.array([_text(e.get("type")) if isinstance(e, dict) else None for e in entries], pa.string()),
        "name": pa.array([_text(f.get("name")) for f in fn], pa.string()),
        "description": pa.array([_text(f.get("description")) for f in fn], pa.string()),
        "parameters": pa.array([json_text(f["parameters"]) if "parameters" in f else None for f in fn], pa.string()),
        "tool": pa.array([json_text(e) for e in entries], pa.string()),
    })
    register_table(b.con, "tools", table, b.relations,
                   select="* EXCLUDE (parameters, tool), CAST(parameters AS JSON) AS parameters, "
                          "CAST(tool AS JSON) AS tool", prefix=b.prefix)


# The language view's columns (name, DuckDB type), after the frame's episode_index, frame_index, index, timestamp.
_MESSAGE_COLUMNS = (("language_column", "VARCHAR"), ("position", "BIGINT"), ("role", "VARCHAR"),
                    ("content", "VARCHAR"), ("style", "VARCHAR"), ("message_timestamp", "FLOAT"),
                    ("camera", "VARCHAR"), ("tool_calls", "JSON"))


def language(b: Build) -> None:
    """``language``: one row per message of the frames' language columns (lerobot 0.6's ``language_persistent`` and
    ``language_events``, and any other feature of dtype ``language``): the frame's episode_index, frame_index, index
    and timestamp, ``language_column`` (which column), ``position`` (1-based, in the frame's list), role, content,
    style, ``message_timestamp`` (seconds: the message's own ``timestamp`` field, which persistent messages carry;
    an event has none and fires at its frame's timestamp), camera and tool_calls (JSON).

    lerobot repeats an episode's persistent messages on every frame of the episode: each is listed once per
    episode (per place in the list), at the first frame that carries it; events, once per frame they sit on. A
    column that is not a list of structs is left out, with a warning."""
    con, layout = b.con, b.layout
    cols = b.frame_columns if b.frame_columns is not None else _describe(con, "SELECT * FROM frames")
    keys = ("episode_index", "frame_index", "index", "timestamp")
    parts = []
    for c, typ in cols.items():
        feat = layout.features.get(c)
        if c not in (LANGUAGE_PERSISTENT, LANGUAGE_EVENTS) and (feat is None or feat.dtype != "language"):
            continue
        if not (typ.startswith("STRUCT(") and typ.endswith(")[]")) or not all(k in cols for k in keys):
            warn(f"{b.src.path(b.data_files[0]) if b.data_files else c}: column {c!r} is {typ}, not a list of "
                 "messages (lerobot 0.6 writes language columns as lists of {role, content, style, timestamp, "
                 "camera, tool_calls}); the language view leaves it out (frames has it as stored)")
            continue
        fields = _describe(con, f"SELECT m.* FROM (SELECT unnest({ident(c)}) AS m FROM frames)")

        def field(name: str, typ: str, fields=fields) -> str:
            return f"CAST(struct_extract(m, {literal(name)}) AS {typ})" if name in fields else f"NULL::{typ}"

        calls = "CAST(to_json(struct_extract(m, 'tool_calls')) AS JSON)" if "tool_calls" in fields else "NULL::JSON"
        msg = (f"{literal(c)} AS language_column, position, {field('role', 'VARCHAR')} AS role, "
               f"{field('content', 'VARCHAR')} AS content, {field('style', 'VARCHAR')} AS style, "
               f"COALESCE({field('timestamp', 'FLOAT')}, fr.timestamp) AS message_timestamp, {field('camera', 'VARCHAR')} AS camera, "
               f"{calls} AS tool_calls")
        frame = "struct_pack(frame_index := frame_index, index := index, timestamp := timestamp)"
        each = (f"SELECT episode_index, fr, unnest(l) AS m, unnest(range(1, len(l) + 1)) AS position FROM "
                f"(SELECT episode_index, {frame} AS fr, {ident(c)} AS l FROM frames WHERE len({ident(c)}) > 0)")
        if c == LANGUAGE_PERSISTENT:
            # Each distinct list of an episode once (lerobot writes one per episode), then each message once.
            slices = (f"SELECT episode_index, arg_min({frame}, index) AS fr, {ident(c)} AS l FROM frames WHERE "
                      f"len({ident(c)}) > 0 GROUP BY episode_index, {ident(c)}")
            each = (f"SELECT episode_index, arg_min(fr, fr.index) AS fr, m, position FROM (SELECT episode_index, fr, "
                    f"unnest(l) AS m, unnest(range(1, len(l) + 1)) AS position FROM ({slices})) GROUP BY "
                    "episode_index, m, position")
        parts.append(f"SELECT episode_index, fr.frame_index AS frame_index, fr.index AS index, fr.timestamp AS "
                     f"timestamp, {msg} FROM ({each})")
    if not parts:
        parts = ["SELECT NULL::BIGINT AS episode_index, NULL::BIGINT AS frame_index, NULL::BIGINT AS index, "
                 "NULL::FLOAT AS timestamp, " + ", ".join(f"NULL::{t} AS {n}" for n, t in _MESSAGE_COLUMNS)
                 + " WHERE false"]
    con.execute(f"CREATE OR REPLACE VIEW language AS {' UNION ALL '.join(parts)}")


# The plain views, in the order they are created (each reads only _episodes_raw, the files and what is before it:
# frames derives a missing task_index from tasks).
VIEWS = (episodes, episode_stats, tasks, frames, language, data_files, videos, features, info, tools)


def _warn_totals(b: Build) -> None:
    """info.json's ``total_episodes`` / ``total_frames`` against what meta/episodes lists (its rows and their
    ``length``): a partial download of meta/ or a converter that did not update info.json. Metadata only, two
    columns of meta/episodes (~5 ms); the data files' own row counts are doctor's ``episode_ranges`` check."""
    length = "sum(length)" if "length" in b.episode_columns else "NULL"
    n, frames = b.con.sql(f"SELECT count(DISTINCT episode_index), {length} FROM _episodes_raw").fetchall()[0]
    if not n:  # no episode metadata at all: the listing warned already (a metadata-only copy)
        return
    want_eps, want_frames = b.layout.info.get("total_episodes"), b.layout.info.get("total_frames")
    off = []
    if isinstance(want_eps, int) and want_eps != n:
        off.append(f"total_episodes is {want_eps} but meta/episodes lists {n} episode(s)")
    if isinstance(want_frames, int) and frames is not None and want_frames != int(frames):
        off.append(f"total_frames is {want_frames} but meta/episodes' lengths sum to {int(frames)}")
    if off:
        warn(f"{b.src.path('meta/info.json')}: {'; '.join(off)}. Queries and training sets read what meta/episodes "
             "and the data files hold; lerobot's LeRobotDataset trusts info.json's totals. A partial download of "
             "meta/ or a converter that left info.json behind: re-download meta/ from the dataset's source, or fix "
             "the totals in meta/info.json (`lerobot-sql doctor` checks the data files too)")


def register_views(con: duckdb.DuckDBPyConnection, src: Source, layout: Layout,
                   relations: dict[str, pa.Table] | None = None, prefix: str = "", cache_dir: Path | None = None
                   ) -> "frames_part.FramesPlan | None":
    """Create the views of :data:`VIEWS` (``episodes``, ``episode_stats``, ``frames``, ``tasks``, ``videos``,
    ``features``, ``info`` and the private ``_frames_loc``, ``_data_files_listed``, ``_episode_data_files``) over
    ``_episodes_raw`` on ``con``, and the placeholders (no rows, the real columns) of ``video_frames``,
    ``video_files`` and ``episode_quality``, which the connection replaces when a query first reads them.

    Missing pieces of a partial copy (no data files, no episode metadata, no tasks file) give empty views with the
    usual columns; :func:`lerobot_sql._format.layout.load_layout` has already warned about them.

    Every view reads Parquet files or an Arrow table registered on ``con``; none is a DuckDB base table, so the
    relations lerobot_sql reads back cannot be written by SQL.

    ``prefix``: of the Arrow registrations' names (a collection gives each dataset its own; the views go into
    ``con``'s current schema). ``cache_dir``: the dataset's cache folder, where the footer check of repeated rows
    keeps its finding per version of the data files (None: checked at every connect).

    ``relations`` (None: a dict of its own) is filled with the Arrow tables registered on ``con`` (name -> table): a
    cursor of ``con`` must register them too before it reads the views.

    Returns:
        How the frames view is made (:class:`lerobot_sql._catalog.frames_part.FramesPlan`), for a query's part of it;
        None where every query reads it whole (no data files; files of several schemas, or a damaged one).

    Raises:
        DatasetFormatError: the episodes metadata lacks ``episode_index``; a JSON-lines metadata file is
            malformed. A default column the data files lack (``index``, ``task_index`` ...) does not raise here:
            it is derived where the metadata makes it unambiguous, else reading it raises DatasetFormatError
            (through :data:`ERROR_MARKER`) naming the column and a data file, and the other views stay readable.
    """
    relations = {} if relations is None else relations
    b = Build(con, src, layout, relations, _register_episodes(con, src, layout, relations, prefix), prefix,
              cache_dir=cache_dir)
    _split_unnamed(b)
    for view in VIEWS:
        view(b)
    _warn_repeated_rows(b)
    _warn_totals(b)
    con.execute(f"CREATE OR REPLACE VIEW video_frames AS {VIDEO_FRAMES_EMPTY}")
    con.execute(f"CREATE OR REPLACE VIEW video_files AS {VIDEO_FILES_EMPTY}")
    con.execute(f"CREATE OR REPLACE VIEW episode_quality AS {quality.PLACEHOLDER}")
    return b.frames_plan
