"""The DuckDB connection and the views users write SQL against.

``register_views`` reads only info.json and Parquet footers: every view is lazy and re-reads its Parquet files
when queried, so nothing is copied at connect time. The view reference lives in README.md ("Views").
"""

from __future__ import annotations

import json
import re

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import DatasetFormatError, MissingFileError
from .layout import Layout
from .source import Source

DUCKDB_TYPES = {
    "float32": "FLOAT", "float64": "DOUBLE", "float16": "FLOAT", "int64": "BIGINT", "int32": "INTEGER",
    "int16": "SMALLINT", "int8": "TINYINT", "uint8": "UTINYINT", "uint16": "USMALLINT", "uint32": "UINTEGER",
    "uint64": "UBIGINT", "bool": "BOOLEAN", "string": "VARCHAR",
}


def q(name: str) -> str:
    """Quote an identifier for DuckDB (feature names contain dots and slashes)."""
    return '"' + name.replace('"', '""') + '"'


def lit(value: str) -> str:
    """A SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


def _file_list(src: Source, files) -> str:
    return "[" + ", ".join(lit(src.duckdb_path(f)) for f in files) + "]"


def template_to_printf(template: str, values: dict[str, str]) -> tuple[str, list[str]]:
    """Turn a ``str.format`` path template into a DuckDB ``printf`` format and its argument expressions.

    ``values`` maps placeholder names to SQL expressions; ``{chunk_index:03d}`` becomes ``%03d``.
    """
    args: list[str] = []

    def sub(m: re.Match) -> str:
        name, spec = m.group(1), m.group(2) or ""
        if name not in values:
            raise DatasetFormatError(f"path template {template!r} uses unknown placeholder {{{name}}}")
        args.append(values[name])
        return "%" + (spec[:-1] if spec.endswith("d") else spec) + ("d" if spec.endswith("d") else "s")

    fmt = re.sub(r"\{(\w+)(?::([^}]*))?\}", sub, template.replace("%", "%%"))
    return fmt, args


def _describe(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, str]:
    return {r[0]: r[1] for r in con.sql(f"DESCRIBE {sql}").fetchall()}


def _tasks_text_column(src: Source) -> tuple[str, str]:
    """(task_index column, task text column) of meta/tasks.parquet, following the pandas metadata if present."""
    with src.open("meta/tasks.parquet") as f:
        schema = pq.read_schema(f)
    names = schema.names
    idx_col = "task_index" if "task_index" in names else None
    text = "task" if "task" in names else None
    if text is None and schema.metadata and b"pandas" in schema.metadata:
        meta = json.loads(schema.metadata[b"pandas"])
        cols = [c for c in meta.get("index_columns", []) if isinstance(c, str) and c in names]
        text = cols[0] if cols else None
    if text is None and "__index_level_0__" in names:
        text = "__index_level_0__"
    if idx_col is None or text is None:
        raise DatasetFormatError(
            f"{src.path('meta/tasks.parquet')}: expected columns task_index and task (or a pandas index holding the "
            f"task text), found {names}"
        )
    return idx_col, text


def register_views(con: duckdb.DuckDBPyConnection, src: Source, layout: Layout) -> None:
    """Create the views ``episodes``, ``episode_stats``, ``frames``, ``tasks``, ``videos``, ``features``, ``info``
    and the private ``_frames_loc`` (frame -> data file and row) on ``con``.

    Raises:
        MissingFileError: meta/tasks.parquet is missing.
        DatasetFormatError: the episodes metadata lacks ``episode_index``.
    """
    fps = layout.fps
    ep_src = f"read_parquet({_file_list(src, layout.episode_files)}, union_by_name=true)"
    ep_cols = _describe(con, f"SELECT * FROM {ep_src}")
    if "episode_index" not in ep_cols:
        raise DatasetFormatError(f"{src.path(layout.episode_files[0])}: no episode_index column in episode metadata")
    con.execute(f"CREATE OR REPLACE VIEW _episodes_raw AS SELECT * FROM {ep_src}")
    plain = [c for c in ep_cols if not c.startswith("stats/")]
    dur = ", length / {} AS duration_s".format(repr(fps)) if "length" in ep_cols else ""
    con.execute(f"CREATE OR REPLACE VIEW episodes AS SELECT {', '.join(map(q, plain))}{dur} FROM _episodes_raw")

    stats = []
    for c, typ in ep_cols.items():
        m = re.fullmatch(r"stats/(.+)/([^/]+)", c)
        if not m:
            continue
        depth = typ.count("[]")
        expr = q(c)
        for _ in range(max(depth - 1, 0)):
            expr = f"flatten({expr})"
        if depth == 0:
            expr = f"[{expr}]"
        stats.append(
            f"SELECT episode_index, {lit(m.group(1))} AS feature, {lit(m.group(2))} AS stat, "
            f"CAST({expr} AS DOUBLE[]) AS value FROM _episodes_raw"
        )
    empty = "SELECT NULL::BIGINT AS episode_index, NULL::VARCHAR AS feature, NULL::VARCHAR AS stat, NULL::DOUBLE[] AS value WHERE false"
    con.execute(f"CREATE OR REPLACE VIEW episode_stats AS {' UNION ALL '.join(stats) or empty}")

    data_src = f"read_parquet({_file_list(src, layout.data_files)}, union_by_name=true"
    data_cols = _describe(con, f"SELECT * FROM {data_src})")
    for c in ("index", "episode_index", "frame_index", "timestamp"):
        if c not in data_cols:
            raise DatasetFormatError(f"{src.path(layout.data_files[0])}: data files lack the {c!r} column")
    sel = []
    for c, typ in data_cols.items():
        feat = layout.features.get(c)
        if feat is not None and feat.is_image and typ.startswith("STRUCT"):
            sel.append(f"{q(c)}.path AS {q(c)}")
        elif feat is not None and len(feat.shape) == 1 and typ.endswith("[]") and feat.dtype in DUCKDB_TYPES:
            sel.append(f"CAST({q(c)} AS {DUCKDB_TYPES[feat.dtype]}[{feat.shape[0]}]) AS {q(c)}")
        else:
            sel.append(q(c))
    con.execute(f"CREATE OR REPLACE VIEW frames AS SELECT {', '.join(sel)} FROM {data_src})")
    prefix = src.duckdb_path("")
    task_col = ", task_index" if "task_index" in data_cols else ", 0::BIGINT AS task_index"
    con.execute(
        "CREATE OR REPLACE VIEW _frames_loc AS SELECT index, episode_index, frame_index, timestamp"
        f"{task_col}, substr(filename, {len(prefix) + 1}) AS data_file, file_row_number AS row "
        f"FROM {data_src}, filename=true, file_row_number=true)"
    )

    if not src.exists("meta/tasks.parquet"):
        raise MissingFileError(f"{src.path('meta/tasks.parquet')}: not found; every v3.0 dataset has a tasks table")
    idx_col, text_col = _tasks_text_column(src)
    con.execute(
        f"CREATE OR REPLACE VIEW tasks AS SELECT CAST({q(idx_col)} AS BIGINT) AS task_index, "
        f"CAST({q(text_col)} AS VARCHAR) AS task FROM read_parquet({lit(src.duckdb_path('meta/tasks.parquet'))})"
    )

    vids = []
    for k in layout.video_keys:
        need = [f"videos/{k}/{c}" for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        if not all(c in ep_cols for c in need):
            continue
        fmt, args = template_to_printf(
            layout.video_path, {"video_key": lit(k), "chunk_index": q(need[0]), "file_index": q(need[1])}
        )
        vids.append(
            f"SELECT episode_index, {lit(k)} AS video_key, CAST({q(need[0])} AS BIGINT) AS chunk_index, "
            f"CAST({q(need[1])} AS BIGINT) AS file_index, printf({lit(fmt)}, {', '.join(args)}) AS path, "
            f"CAST({q(need[2])} AS DOUBLE) AS from_timestamp, CAST({q(need[3])} AS DOUBLE) AS to_timestamp "
            "FROM _episodes_raw"
        )
    empty = ("SELECT NULL::BIGINT AS episode_index, NULL::VARCHAR AS video_key, NULL::BIGINT AS chunk_index, "
             "NULL::BIGINT AS file_index, NULL::VARCHAR AS path, NULL::DOUBLE AS from_timestamp, "
             "NULL::DOUBLE AS to_timestamp WHERE false")
    con.execute(f"CREATE OR REPLACE VIEW videos AS {' UNION ALL '.join(vids) or empty}")

    feats = pa.table({
        "name": [f.name for f in layout.features.values()],
        "dtype": [f.dtype for f in layout.features.values()],
        "shape": pa.array([list(f.shape) for f in layout.features.values()], pa.list_(pa.int64())),
        "names": [json.dumps(f.names) for f in layout.features.values()],
        "is_video": [f.is_video for f in layout.features.values()],
        "codec": [f.info.get("video.codec") for f in layout.features.values()],
        "fps": pa.array([f.info.get("video.fps") for f in layout.features.values()], pa.float64()),
        "height": pa.array([f.info.get("video.height") for f in layout.features.values()], pa.int64()),
        "width": pa.array([f.info.get("video.width") for f in layout.features.values()], pa.int64()),
        "pix_fmt": pa.array([f.info.get("video.pix_fmt") for f in layout.features.values()], pa.string()),
    })
    con.register("_features_arrow", feats)
    con.execute("CREATE OR REPLACE TABLE features AS SELECT * EXCLUDE (names), CAST(names AS JSON) AS names FROM _features_arrow")
    con.unregister("_features_arrow")
    i = layout.info
    info = pa.table({
        "fps": [layout.fps],
        "codebase_version": [layout.version],
        "robot_type": pa.array([i.get("robot_type")], pa.string()),
        "total_episodes": pa.array([i.get("total_episodes")], pa.int64()),
        "total_frames": pa.array([i.get("total_frames")], pa.int64()),
        "total_tasks": pa.array([i.get("total_tasks")], pa.int64()),
        "chunks_size": pa.array([i.get("chunks_size")], pa.int64()),
        "data_path": [layout.data_path],
        "video_path": pa.array([layout.video_path], pa.string()),
    })
    con.register("_info_arrow", info)
    con.execute("CREATE OR REPLACE TABLE info AS SELECT * FROM _info_arrow")
    con.unregister("_info_arrow")
