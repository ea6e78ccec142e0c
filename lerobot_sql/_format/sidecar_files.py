"""Tables beside a dataset: the sidecar files it carries next to lerobot's metadata, and a user's own table files.

A dataset often carries tables that are not part of the LeRobot format: lerobot 0.6.1's SARM writes per-frame
progress to ``sarm_progress.parquet`` at the root and subtask priors to ``meta/temporal_proportions_<kind>.json``;
curation tools leave ``meta/subtasks.parquet`` or ``meta/camera_curation.json``. :func:`find_sidecars` lists them
(a directory listing, no file read); the catalog makes each a view (:mod:`lerobot_sql._catalog.sidecars`).

JSON files are read here, whole, into Arrow (:func:`json_table`: one rule for every shape of JSON), and a user's own
file for ``db.attach`` too (:func:`read_user_table`: Parquet, CSV or JSON, local or any fsspec URL).
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

import pyarrow as pa

from .._storage.source import Source
from ..errors import DatasetFormatError, MissingFileError
from .jsontext import json_text, load_json

# Where sidecars are looked for: meta/ (beside info.json), and the root, where lerobot 0.6.1's
# compute_rabc_weights writes sarm_progress.parquet (utils/sample_weighting.py reads it from there).
PATTERNS = ("meta/*.parquet", "meta/*.json", "*.parquet", "*.json")
# lerobot's own metadata files (read by the other views) and lerobot_sql's export marker: never sidecars.
STANDARD = frozenset({"meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/lerobot_sql_export.json"})
# Plain HTTP cannot list a folder: there only these names are asked for (one HEAD each, in the listing's round).
KNOWN = ("sarm_progress.parquet", "meta/sarm_progress.parquet", "meta/temporal_proportions_sparse.json",
         "meta/temporal_proportions_dense.json", "meta/subtasks.parquet", "meta/camera_curation.json")
# A JSON table is parsed whole in memory: past this size it is refused (a sidecar of priors or flags is kilobytes).
# It is parsed whole into Python objects, about 45 bytes of memory per byte of text for an array of small
# objects (hostile review 20: a 16 MiB array took 711 MiB): 32 MiB of JSON is at most about 1.5 GB; a table that
# large belongs in Parquet, which is read by DuckDB as it is queried
MAX_JSON_BYTES = 32 << 20
USER_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "jsonl",
                ".ndjson": "jsonl"}


def find_sidecars(src: Source) -> list[str]:
    """The sidecar files of the dataset at ``src``: ``meta/*.parquet``, ``meta/*.json``, ``*.parquet`` and ``*.json``
    (relative paths, in that order, each sorted), less lerobot's own metadata (:data:`STANDARD`) and hidden files
    (names starting with ``.``). File names only: nothing is read. On plain HTTP (no listing) only the
    :data:`KNOWN` names the listing found are there."""
    out: list[str] = []
    for pattern in PATTERNS:
        folder = PurePosixPath(pattern).parent
        for rel in src.glob(pattern):
            p = PurePosixPath(rel)
            # (a listing's match, as plain HTTP's, lets * cross a /: only files of the folder itself count)
            if p.parent == folder and rel not in STANDARD and not p.name.startswith(".") and rel not in out:
                out.append(rel)
    return out


def read_json_sidecar(src: Source, rel: str) -> tuple[pa.Table, list[str]]:
    """The JSON file ``rel`` of ``src`` as :func:`json_table` shapes it.

    Raises:
        DatasetFormatError: not JSON (naming the file, line and column), or larger than :data:`MAX_JSON_BYTES`.
        MissingFileError: the file is gone.
    """
    where = src.path(rel)
    size = src.size(rel)
    if size > MAX_JSON_BYTES:
        raise DatasetFormatError(f"{where}: {size:,} bytes of JSON, more than the {MAX_JSON_BYTES >> 20} MiB a JSON "
                                 "sidecar is read up to (it is parsed whole); write such a table as Parquet")
    with src.open(rel) as f:
        value = load_json(f.read(), where, "fix or remove the file (it is not part of the LeRobot format: the other "
                          "views do not need it)")
    return json_table(value)


def json_table(value: Any) -> tuple[pa.Table, list[str]]:
    """A parsed JSON document as a table, and the names of its columns that hold JSON text (the catalog casts them
    to DuckDB's ``JSON``).

    The rule, by the document's shape:

    * an object: one row per key, in file order: ``key`` (VARCHAR), ``value`` (JSON). lerobot's
      ``temporal_proportions_*.json`` (subtask -> share of the episode) reads as (subtask, share).
    * an array of objects (and at least one): one row per element, one column per key (in order of first
      appearance; a key an element lacks is NULL there). A column is BOOLEAN, BIGINT, DOUBLE or VARCHAR when every
      value is of that JSON kind (integers and fractions together: DOUBLE), else JSON.
    * any other array: one row per element, ``value`` (JSON).
    * a string, number, true, false or null: one row, ``value`` (JSON).
    """
    if isinstance(value, dict):
        return pa.table({"key": pa.array(list(value), pa.string()),
                         "value": pa.array([json_text(v) for v in value.values()], pa.string())}), ["value"]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        keys = list(dict.fromkeys(k for row in value for k in row))
        columns, as_json = {}, []
        for k in keys:
            arr, is_json = _column([row.get(k) for row in value])
            columns[k] = arr
            if is_json:
                as_json.append(k)
        return pa.table(columns), as_json
    rows = value if isinstance(value, list) else [value]
    return pa.table({"value": pa.array([json_text(v) for v in rows], pa.string())}), ["value"]


def _column(values: list) -> tuple[pa.Array, bool]:
    """One column of an array of objects: (its Arrow array, whether it holds JSON text)."""
    seen = [v for v in values if v is not None]
    if seen and all(isinstance(v, bool) for v in seen):
        return pa.array(values, pa.bool_()), False
    if seen and all(isinstance(v, str) for v in seen):
        return pa.array(values, pa.string()), False
    if seen and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
        if all(isinstance(v, int) for v in seen) and all(-2**63 <= v < 2**63 for v in seen):
            return pa.array(values, pa.int64()), False
        if all(isinstance(v, float) or abs(v) < 2**1023 for v in seen):
            return pa.array([None if v is None else float(v) for v in values], pa.float64()), False
    return pa.array([None if v is None else json_text(v) for v in values], pa.string()), True


def user_format(path: str, format: str | None = None) -> str:
    """The format of a user's table file: ``format`` if given, else from the file's extension
    (:data:`USER_FORMATS`).

    Raises:
        ValueError: neither says Parquet, CSV, JSON or JSON lines.
    """
    kinds = sorted(set(USER_FORMATS.values()))
    if format is not None:
        if format not in kinds:
            raise ValueError(f"format={format!r}: give one of {kinds} (None: from the file's extension)")
        return format
    ext = os.path.splitext(str(path).split("?", 1)[0])[1].lower()
    if ext not in USER_FORMATS:
        raise ValueError(f"{path}: cannot tell the table format from the extension {ext or '(none)'!r}; name the file "
                         f"{', '.join(sorted(USER_FORMATS))} or pass format= (one of {kinds})")
    return USER_FORMATS[ext]


def read_user_table(path: str | os.PathLike, *, format: str | None = None,
                    storage_options: dict | None = None) -> tuple[pa.Table, list[str]]:
    """A user's own table file, read whole: Parquet (pyarrow), CSV (pyarrow's reader: header row, types inferred),
    JSON (:func:`json_table`'s rule; JSON columns as text) or JSON lines (one object per line, as an array of them).

    Args:
        path: a local path (any file this process may read: the user's own, not confined to a dataset) or an
            fsspec URL (``https://``, ``s3://``, ``hf://``, ...).
        format: ``"parquet"``, ``"csv"``, ``"json"`` or ``"jsonl"``; None: from the extension.
        storage_options: passed to fsspec for a URL.

    Returns:
        (the table, the names of its columns holding JSON text).

    Raises:
        MissingFileError: no such file (or a folder).
        DatasetFormatError: the file is not a table of that format (pyarrow's or the JSON parser's reason, naming
            the file).
        ValueError: the format cannot be told (see :func:`user_format`).
    """
    import fsspec
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    text = os.fspath(path)
    kind = user_format(text, format)
    try:
        fs, fpath = fsspec.core.url_to_fs(text, **(storage_options or {}))
        folder = fs.isdir(fpath)
    except (ValueError, ImportError, OSError) as e:  # an unknown protocol, a filesystem not installed, no network
        raise MissingFileError(f"{text}: cannot be opened ({type(e).__name__}: {e})") from e
    if folder:
        raise MissingFileError(f"{text}: is a folder; attach a Parquet, CSV or JSON file")
    try:
        with fs.open(fpath, "rb") as f:
            if kind == "parquet":
                return pq.read_table(f), []
            if kind == "csv":
                return pcsv.read_csv(f), []
            raw = f.read()
    except FileNotFoundError as e:
        raise MissingFileError(f"{text}: no such file") from e
    except (pa.ArrowException, OSError) as e:
        raise DatasetFormatError(f"{text}: cannot be read as {kind} ({type(e).__name__}: {e}); check the file and "
                                 "its format (format=...)") from e
    if kind == "json":
        return json_table(load_json(raw, text, "fix the file"))
    rows = [load_json(line, f"{text}:{n}", "fix the file (one JSON object per line)")
            for n, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1) if line.strip()]
    return json_table(rows)
