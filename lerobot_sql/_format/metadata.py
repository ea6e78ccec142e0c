"""Metadata readers that need no DuckDB: tasks, episode pointers, per-camera clips, and the errors of unreadable
Parquet metadata.

The catalog's ``tasks`` view and :meth:`DatasetFiles.tasks <lerobot_sql._format.files.DatasetFiles.tasks>` (what
items carry), the episode fast path (:mod:`lerobot_sql._plan.episodes`) and the connection's error for unreadable
files (:func:`lerobot_sql._catalog.connection.unreadable_error`) read the metadata through here, so each file is
parsed by one rule and its errors name the file the same way. v2.x JSON lines are read by
:mod:`lerobot_sql._format.v2`.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pyarrow.parquet as pq

from .._storage.source import Source
from ..errors import DatasetFormatError, LeRobotSQLError, RemoteIOError
from . import v2
from .jsontext import load_json
from .layout import V2_TASKS, Layout

POINTERS = ("episode_index", "dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index")
VIDEO_POINTERS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")


@contextlib.contextmanager
def parquet_read_errors(src: Source, rel: str):
    """Turn pyarrow's errors while reading ``rel`` into a :class:`DatasetFormatError` naming the file and the fix
    (errors already ours, e.g. MissingFileError or RemoteIOError, pass unchanged)."""
    try:
        yield
    except LeRobotSQLError:
        raise
    except (pa.ArrowException, OSError) as e:
        raise DatasetFormatError(f"{src.path(rel)}: cannot be read as Parquet ({type(e).__name__}: {e}); the file is "
                                 "truncated or corrupt. Re-download it from the dataset's source (`lerobot-sql "
                                 "doctor` checks every file)") from e


def _tasks_text_column(src: Source) -> tuple[str | None, str]:
    """(task_index column, task text column) of meta/tasks.parquet.

    Text: ``task``, else the pandas metadata's ``index_columns``, else ``__index_level_0__``, else the only string
    column. task_index: ``task_index``, else the only integer column, else None (then the row number is the
    task_index, which is how lerobot resolves it).
    """
    with parquet_read_errors(src, "meta/tasks.parquet"), src.open("meta/tasks.parquet") as f:
        schema = pq.read_schema(f)
    names = schema.names
    strings = [fld.name for fld in schema if pa.types.is_string(fld.type) or pa.types.is_large_string(fld.type)
               or pa.types.is_string_view(fld.type)]
    ints = [fld.name for fld in schema if pa.types.is_integer(fld.type)]
    idx_col = "task_index" if "task_index" in names else (ints[0] if len(ints) == 1 else None)
    text = "task" if "task" in names else None
    if text is None and schema.metadata and b"pandas" in schema.metadata:
        meta = load_json(schema.metadata[b"pandas"], f"{src.path('meta/tasks.parquet')} (its pandas metadata)",
                         "restore the file from the dataset's source (or write it again with lerobot's writer)")
        index = meta.get("index_columns") if isinstance(meta, dict) else None
        cols = [c for c in index if isinstance(c, str) and c in strings] if isinstance(index, list) else []
        text = cols[0] if cols else None
    if text is None and "__index_level_0__" in strings:
        text = "__index_level_0__"
    if text is None and len(strings) == 1:
        text = strings[0]
    if text is None or (idx_col is None and len(ints) > 1):
        raise DatasetFormatError(
            f"{src.path('meta/tasks.parquet')}: expected columns task_index and task (or a pandas index holding the "
            f"task text), found {schema}"
        )
    return idx_col, text


def read_tasks(src: Source, layout: Layout) -> pa.Table:
    """``task_index`` (int64), ``task`` (string) from meta/tasks.parquet (v3) or meta/tasks.jsonl (v2); empty when
    the file is absent. Small (one row per task), so it is read whole with pyarrow: the ``tasks`` view and
    ``Database.tasks()`` both come from here.

    Raises:
        DatasetFormatError: the file lacks a task text column, or a JSON line lacks task_index / task.
    """
    if layout.tasks_file is None:
        return pa.table({"task_index": pa.array([], pa.int64()), "task": pa.array([], pa.string())})
    if layout.tasks_file == V2_TASKS:
        return _unique_tasks(src.path(V2_TASKS), v2.tasks(src))
    idx_col, text_col = _tasks_text_column(src)
    with parquet_read_errors(src, layout.tasks_file), src.open(layout.tasks_file) as f:
        t = pq.ParquetFile(f).read(columns=[c for c in (idx_col, text_col) if c], use_threads=False)
    # No task_index column: lerobot resolves task_index positionally, so the row number is the index.
    idx = t[idx_col].cast(pa.int64()) if idx_col else pa.array(range(t.num_rows), pa.int64())
    return _unique_tasks(src.path(layout.tasks_file),
                         pa.table({"task_index": idx, "task": t[text_col].cast(pa.string())}))


def _unique_tasks(where: str, t: pa.Table) -> pa.Table:
    """``t`` if it has one row per task, as lerobot writes it (a pandas frame indexed by the distinct task texts,
    task_index 0..n-1). Two rows for one task_index would give items the last one's text and double every SQL
    join with ``tasks``; two task_index values for one text make the text no key.

    Raises:
        DatasetFormatError: a NULL or repeated task_index, a NULL or repeated task text; names the file and value.
    """
    for col in ("task_index", "task"):
        if t[col].null_count:
            raise DatasetFormatError(f"{where}: a row has a NULL {col}; each row needs a task_index and its task "
                                     "text. Restore the file from the dataset's source")
        values = t[col].to_pylist()
        seen: dict = {}
        for i, v in enumerate(values):
            j = seen.setdefault(v, i)
            if j != i:
                other = "task_index" if col == "task" else "task"
                raise DatasetFormatError(
                    f"{where}: {col} {v!r} is listed twice (rows {j} and {i}, {other} {t[other][j].as_py()!r} and "
                    f"{t[other][i].as_py()!r}); lerobot writes one row per distinct task. Restore the file from the "
                    "dataset's source")
    return t


def read_pointers(src: Source, layout: Layout) -> pa.Table | None:
    """Episode pointers: :data:`POINTERS` and ``videos/<video_key>/<VIDEO_POINTERS>`` per camera, one row per
    meta/episodes row (v3: the Parquet files, those columns only; v2: meta/episodes.jsonl as
    :func:`lerobot_sql._format.v2.episodes` shapes it). None when a column is missing (the DuckDB path then
    reports it).
    """
    want = list(POINTERS) + [f"videos/{k}/{c}" for k in layout.video_keys for c in VIDEO_POINTERS]
    if not layout.episode_files:
        return None
    if layout.legacy:
        t = v2.episodes(src, layout)
        return t.select(want) if all(c in t.column_names for c in want) else None
    parts = []
    for rel in layout.episode_files:
        with parquet_read_errors(src, rel), src.open(rel) as f:
            pf = pq.ParquetFile(f)
            names = set(pf.schema_arrow.names)
            if not all(c in names for c in want):
                return None
            parts.append(pf.read(columns=want, use_threads=False))
    t = pa.concat_tables(parts, promote_options="permissive")
    cols = {}
    for c in want:
        try:
            cols[c] = t[c].cast(pa.float64() if c.endswith("_timestamp") else pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:  # 0.5 as an episode_index, 2**63 + 5, a date
            raise DatasetFormatError(
                f"{src.path(layout.episode_files[0]) if len(layout.episode_files) == 1 else src.path('meta/episodes')}"
                f": column {c!r} ({t[c].type}) holds a value that is not "
                f"{'a number of seconds' if c.endswith('_timestamp') else 'a whole number in int64'} ({e}); it "
                "points into the data or video files, so no frame can be located from it. Restore meta/episodes from "
                "the dataset's source (`lerobot-sql doctor`)") from e
    return pa.table(cols)


def read_episodes(src: Source, layout: Layout, episodes=None) -> pa.Table | None:
    """meta/episodes without the ``stats/...`` columns (as lerobot's ``load_episodes`` selects them), the rows of
    ``episodes`` (episode_index values; all when None), in file order. v2: meta/episodes.jsonl shaped as v3 rows by
    :func:`lerobot_sql._format.v2.episodes`. None when the dataset has no episode metadata.

    Raises:
        DatasetFormatError: a file cannot be read (naming it).
    """
    if not layout.episode_files:
        return None
    if layout.legacy:
        t = v2.episodes(src, layout)
    else:
        parts = []
        for rel in layout.episode_files:
            with parquet_read_errors(src, rel), src.open(rel) as f:
                pf = pq.ParquetFile(f)
                parts.append(pf.read(columns=[c for c in pf.schema_arrow.names if not c.startswith("stats/")],
                                     use_threads=False))
        t = pa.concat_tables(parts, promote_options="permissive")
    t = t.select([c for c in t.column_names if not c.startswith("stats/")])
    if episodes is not None:
        import pyarrow.compute as pc

        t = t.filter(pc.is_in(t["episode_index"], pa.array(sorted({int(e) for e in episodes}), pa.int64())))
    return t


def video_clips(layout: Layout, ptr: pa.Table) -> dict[str, pa.Table]:
    """Per video_key, the clip pointers of every episode: ``episode_index``, ``path`` (mp4 relative to the root),
    ``from_timestamp``, ``to_timestamp``."""
    ep = ptr["episode_index"]
    out = {}
    for k in layout.video_keys:
        chunk = ptr[f"videos/{k}/chunk_index"].to_pylist()
        file = ptr[f"videos/{k}/file_index"].to_pylist()
        path = [None if c is None or fi is None else layout.video_file(k, c, fi) for c, fi in zip(chunk, file)]
        out[k] = pa.table({"episode_index": ep, "path": pa.array(path, pa.string()),
                           "from_timestamp": ptr[f"videos/{k}/from_timestamp"],
                           "to_timestamp": ptr[f"videos/{k}/to_timestamp"]})
    return out


def corrupt_parquet_files(src: Source, layout: Layout) -> list[str]:
    """Full paths of the dataset's Parquet files (meta/episodes, tasks, data) whose footer does not parse, checked
    one by one, footers only.

    Raises:
        RemoteIOError: the storage failed while a footer was read (not a corrupt file).
    """
    files = [f for f in (*layout.episode_files, layout.tasks_file, *layout.data_files) if f and f.endswith(".parquet")]
    bad = []
    for rel in files:
        try:
            with src.open(rel) as f:
                pq.read_metadata(f)
        except RemoteIOError:
            raise
        except (pa.ArrowException, OSError):
            bad.append(src.path(rel))
    return bad


def unreadable_error(src: Source, bad: list[str], cause: BaseException) -> DatasetFormatError:
    """The error for Parquet files that could not be read (``cause``): naming ``bad`` (from
    :func:`corrupt_parquet_files`), else every data file, and the fix."""
    where = ", ".join(bad[:3]) if bad else f"one of the data files under {src.path('data')}"
    return damaged_parquet_error(where, f"{type(cause).__name__}: {cause}")


def damaged_parquet_error(where: str, why: str) -> DatasetFormatError:
    """The one wording of "this Parquet file is damaged": ``where`` (the file(s)), ``why`` (the reader's message)."""
    return DatasetFormatError(f"{where}: cannot be read as Parquet ({why}); the file is truncated or corrupt. "
                              "Re-download it from the dataset's source (`lerobot-sql doctor` checks every file)")
