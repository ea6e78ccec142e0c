"""Everything v2.x (v2.0, v2.1): the JSON-lines metadata, read into the tables v3 keeps in Parquet.

v2 keeps its metadata in JSON lines (meta/episodes.jsonl, episodes_stats.jsonl, tasks.jsonl; small, read whole).
:func:`episodes` shapes them like v3's meta/episodes: ``dataset_from_index``/``dataset_to_index`` from the
cumulative ``length``, ``from_timestamp = 0`` and ``to_timestamp = length / fps`` (one mp4 per episode), and
``chunk_index``/``file_index`` holding ``episode_chunk``/``episode_index``, the two placeholders of v2 path
templates. The catalog's views and the episode pointers both read v2 through here. No DuckDB. And the other way:
a v2.x info.json rewritten as v3.0 (:func:`info_to_v3`), what an export of a v2.x source writes.
"""

from __future__ import annotations

import pyarrow as pa

from .._storage.source import Source
from ..errors import DatasetFormatError
from .info import DEFAULT_DATA_MB, DEFAULT_DATA_PATH, DEFAULT_VIDEO_MB, DEFAULT_VIDEO_PATH
from .jsontext import load_json
from .layout import V2_TASKS, Layout

V3_VERSION = "v3.0"  # what info_to_v3 writes

# The fix for a line that is not JSON: lerobot v2.x writes one JSON object per line.
RESTORE_JSONL = "restore it from the dataset's source (lerobot v2.x writes one JSON object per line)"


def read_jsonl(src: Source, rel: str) -> list[dict]:
    """The objects of a JSON-lines file (blank lines skipped).

    Raises:
        DatasetFormatError: a line is not a JSON object (not valid JSON, nested too deeply to parse, or another
            value); names the file and line.
    """
    out = []
    with src.open(rel) as f:
        # Lines of bytes, each parsed (and decoded) on its own: a byte that is not UTF-8 is named with its line,
        # and only \n / \r end a line (str.splitlines would also cut a task text at U+2028).
        for n, line in enumerate(f.read().splitlines(), 1):
            if not line.strip():
                continue
            obj = load_json(line, f"{src.path(rel)}:{n}", RESTORE_JSONL)
            if not isinstance(obj, dict):
                raise DatasetFormatError(f"{src.path(rel)}:{n}: expected a JSON object per line")
            out.append(obj)
    return out


def tasks(src: Source) -> pa.Table:
    """meta/tasks.jsonl as ``task_index`` (int64), ``task`` (string), one row per line, as written (the caller
    checks that each task and task_index appears once).

    Raises:
        DatasetFormatError: a line is not a JSON object or lacks an integer task_index / a string task.
    """
    rows = read_jsonl(src, V2_TASKS)
    bad = [r for r in rows if not isinstance(r.get("task_index"), int) or isinstance(r.get("task_index"), bool)
           or not isinstance(r.get("task"), str)]
    if bad:
        raise DatasetFormatError(f"{src.path(V2_TASKS)}: every line needs an integer task_index and a string "
                                 f"task, found {bad[0]}")
    return pa.table({"task_index": pa.array([r["task_index"] for r in rows], pa.int64()),
                     "task": pa.array([r["task"] for r in rows], pa.string())})


def episodes(src: Source, layout: Layout) -> pa.Table:
    """meta/episodes.jsonl (+ episodes_stats.jsonl) as a table with v3 meta/episodes columns, in episode order."""
    rel = layout.episode_files[0]
    rows = read_jsonl(src, rel)
    for n, r in enumerate(rows):
        # bool is an int subclass in Python, but not to pyarrow: `true` must be refused here, naming the line.
        if any(not isinstance(r.get(k), int) or isinstance(r.get(k), bool) for k in ("episode_index", "length")):
            raise DatasetFormatError(f"{src.path(rel)}: line {n + 1} lacks an integer episode_index or length: {r}")
    # lerobot v2.1 sorts episodes by episode_index and derives each episode's index range from cumulative lengths.
    rows.sort(key=lambda r: r["episode_index"])
    ep = [r["episode_index"] for r in rows]
    length = [r["length"] for r in rows]
    start = [0] * len(rows)
    for i in range(1, len(rows)):
        start[i] = start[i - 1] + length[i - 1]
    chunk = [e // layout.chunks_size for e in ep]
    cols: dict[str, pa.Array] = {
        "episode_index": pa.array(ep, pa.int64()),
        "tasks": pa.array([r.get("tasks") if isinstance(r.get("tasks"), list) else None for r in rows],
                          pa.list_(pa.string())),
        "length": pa.array(length, pa.int64()),
        "data/chunk_index": pa.array(chunk, pa.int64()),
        "data/file_index": pa.array(ep, pa.int64()),
        "dataset_from_index": pa.array(start, pa.int64()),
        "dataset_to_index": pa.array([s + n for s, n in zip(start, length)], pa.int64()),
    }
    for k in layout.video_keys:
        cols[f"videos/{k}/chunk_index"] = pa.array(chunk, pa.int64())
        cols[f"videos/{k}/file_index"] = pa.array(ep, pa.int64())
        cols[f"videos/{k}/from_timestamp"] = pa.array([0.0] * len(rows), pa.float64())
        cols[f"videos/{k}/to_timestamp"] = pa.array([n / layout.fps for n in length], pa.float64())
    if layout.episode_stats_file:
        pos = {e: i for i, e in enumerate(ep)}
        stats: dict[str, list] = {}
        for r in read_jsonl(src, layout.episode_stats_file):
            i = pos.get(r.get("episode_index"))
            if i is None or not isinstance(r.get("stats"), dict):
                continue
            for feat, per in r["stats"].items():
                for stat, value in (per.items() if isinstance(per, dict) else ()):
                    stats.setdefault(f"stats/{feat}/{stat}", [None] * len(ep))[i] = (
                        value if isinstance(value, list) else [value])
        for name, values in stats.items():
            try:
                cols[name] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise DatasetFormatError(f"{src.path(layout.episode_stats_file)}: {name} mixes shapes or types "
                                         f"across episodes ({e})") from e
    return pa.table(cols)


def info_to_v3(info: dict) -> None:
    """A v2.x info.json rewritten in place as lerobot 0.4.4's converter (``convert_info``) writes v3.0: version,
    file sizes and path templates of v3.0, no per-episode totals, and every non-video feature at the dataset's fps."""
    info["codebase_version"] = V3_VERSION
    info.pop("total_chunks", None)
    info.pop("total_videos", None)
    info.setdefault("data_files_size_in_mb", DEFAULT_DATA_MB)
    info.setdefault("video_files_size_in_mb", DEFAULT_VIDEO_MB)
    has_video = any(isinstance(f, dict) and f.get("dtype") == "video" for f in info.get("features", {}).values())
    info["data_path"] = DEFAULT_DATA_PATH
    info["video_path"] = DEFAULT_VIDEO_PATH if has_video else None
    if float(info["fps"]).is_integer():
        info["fps"] = int(info["fps"])
    for f in info.get("features", {}).values():
        if isinstance(f, dict) and f.get("dtype") != "video":
            f["fps"] = info["fps"]
