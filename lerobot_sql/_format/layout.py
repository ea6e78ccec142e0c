"""The dataset's layout as meta/info.json describes it: format version, fps, features, path templates, file lists.

Knows nothing of DuckDB or torch. v3.x and the legacy v2.0/v2.1 layout (one parquet and one mp4 per episode,
JSON-lines metadata: meta/episodes.jsonl, tasks.jsonl, episodes_stats.jsonl) are both read natively;
``Layout.legacy`` tells them apart.
Problems that do not stop reading (no data files, a video folder that differs from ``video_path``) are
collected in ``Layout.warnings`` and emitted once with :func:`warnings.warn`. info.json itself (its features, path
templates and limits, and the one check of it) is :mod:`lerobot_sql._format.info`'s; here, the files it leads to.
"""

from __future__ import annotations

import dataclasses
import re
import string

from .._storage.source import Source, confine
from ..errors import DatasetFormatError, MissingFileError, warn
from . import listing
from .info import (
    DEFAULT_VIDEO_PATH,
    NUMERIC_DTYPES,
    V2_VIDEO_PATH,
    VIDEO_FIELDS_V2,
    VIDEO_FIELDS_V3,
    Feature,
    check_info,
    check_template,
)
from .jsontext import load_json

DEFAULT_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
EPISODES_GLOB = "meta/episodes/*/*.parquet"
V2_EPISODES = "meta/episodes.jsonl"
V2_EPISODES_STATS = "meta/episodes_stats.jsonl"
V2_TASKS = "meta/tasks.jsonl"
V3_TASKS = "meta/tasks.parquet"


@dataclasses.dataclass(frozen=True)
class Layout:
    """What info.json says, plus the files found under the root.

    Attributes:
        version: ``codebase_version`` as written (``v3.0``).
        fps: frames per second of the dataset (float; int in lerobot-written data).
        features: name -> Feature, in info.json order.
        data_path, video_path: ``str.format`` templates relative to the root.
        info: the raw info.json dict.
        episode_files: v3: ``meta/episodes/*/*.parquet``; v2: ``("meta/episodes.jsonl",)``; () if absent.
        data_files: relative paths of the dataset's data Parquet files (``data/*/*.parquet`` matching
            ``data_path``), sorted; () for a metadata-only copy.
        stray_data_files: the other Parquet files found under ``data/*/`` (raw recorder output next to the
            dataset's own), sorted: not read, reported by ``lerobot-sql doctor`` (``data_files_stray``). A file
            ``data_path`` matches but no episode of meta/episodes names is in ``data_files``: the catalog judges it
            when it reads meta/episodes (``lerobot_sql._catalog.views``: not read when its rows are no episode's
            own): connect() opens no Parquet file.
        legacy: True for the v2.0/v2.1 layout.
        chunks_size: info.json ``chunks_size`` (v2: episodes per chunk folder; v3: files per chunk folder).
        tasks_file: ``meta/tasks.parquet`` (v3) or ``meta/tasks.jsonl`` (v2); None if absent.
        episode_stats_file: v2.1 ``meta/episodes_stats.jsonl``, None otherwise (v3 keeps stats in meta/episodes).
        warnings: what was odd but readable, one message each (already emitted with warnings.warn).

    In the v2 layout the per-episode file of camera K is addressed like a v3 file with
    ``chunk_index = episode_chunk`` and ``file_index = episode_index`` (see :meth:`video_file`).
    """

    version: str
    fps: float
    features: dict[str, Feature]
    data_path: str
    video_path: str | None
    info: dict
    episode_files: tuple[str, ...]
    data_files: tuple[str, ...]
    legacy: bool = False
    chunks_size: int = 1000
    tasks_file: str | None = V3_TASKS
    episode_stats_file: str | None = None
    warnings: tuple[str, ...] = ()
    stray_data_files: tuple[str, ...] = ()

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_video]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_image]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_camera]

    def check_cameras(self, cameras: list[str]) -> None:
        """Raise ValueError naming the keys of ``cameras`` that are not camera features, and the valid ones."""
        unknown = [c for c in cameras if c not in self.camera_keys]
        if unknown:
            raise ValueError(f"cameras {unknown} are not camera features; valid: {self.camera_keys}")

    def video_file(self, video_key: str, chunk_index: int, file_index: int) -> str:
        """Relative mp4 path of camera ``video_key``; for v2, chunk_index is episode_chunk, file_index episode_index."""
        tmpl = self.video_path or (V2_VIDEO_PATH if self.legacy else DEFAULT_VIDEO_PATH)
        rel = tmpl.format(video_key=video_key, chunk_index=int(chunk_index), file_index=int(file_index),
                          episode_chunk=int(chunk_index), episode_index=int(file_index))
        return confine(rel, f"meta/info.json 'video_path' {tmpl!r} with camera {video_key!r}")

    def data_file(self, chunk_index: int, file_index: int) -> str:
        """Relative data path from ``data_path``; for v2, chunk_index is episode_chunk, file_index episode_index."""
        rel = self.data_path.format(chunk_index=int(chunk_index), file_index=int(file_index),
                                    episode_chunk=int(chunk_index), episode_index=int(file_index))
        return confine(rel, f"meta/info.json 'data_path' {self.data_path!r}")


_INTEGRAL = NUMERIC_DTYPES - {"float16", "float32", "float64"}


def check_stored_type(feature: Feature | None, stored_is_float: bool, where: str) -> None:
    """Refuse an integer or bool dtype in info.json over a column stored as floats: casting would truncate every
    value (SQL silently, tensors with pyarrow's bare ArrowInvalid). Called where a data file's schema is first read
    (the catalog's frames view, the tabular reader's footer), before any value is converted.

    Raises:
        DatasetFormatError: naming the file, the column, both types and the fix.
    """
    if feature is not None and stored_is_float and feature.dtype in _INTEGRAL:
        raise DatasetFormatError(f"{where}: column {feature.name!r} is stored as floating point, but meta/info.json "
                                 f"declares dtype {feature.dtype!r}; converting would truncate the values. Fix the "
                                 "feature's dtype in meta/info.json (e.g. 'float32')")


def check_item_keys(layout: Layout, cameras, delta_keys, where: str) -> None:
    """Refuse a feature whose item key one of the item's own keys would take: ``task`` (the frame's task text) and
    ``<key>_is_pad`` for a ``delta_timestamps`` key (that key's padding). lerobot 0.4.4's ``__getitem__`` writes them
    over the feature without a word (``item = {**item, **padding}``, then ``item["task"] = ...``), so the feature's
    values are lost; lerobot's writer never makes a ``task`` feature (its ``validate_frame`` takes ``task`` as the
    frame's text). Refused rather than served either way; checked once, when a dataset is built.

    Args:
        layout: the dataset's. cameras: the camera keys its items carry (a camera left out is no item key).
        delta_keys: the ``delta_timestamps`` keys. where: the dataset's root (URL or path), for the message.

    Raises:
        DatasetFormatError: naming the dataset, the feature and the way out (a copy with the feature renamed,
            written by a one-dataset collection's export; or the key out of ``delta_timestamps``).
    """
    carried = {k for k, f in layout.features.items() if not f.is_camera or k in cameras}
    clashes = [("task", "task_feature", "the frame's task text (meta/tasks)", "")] if "task" in carried else []
    for k in delta_keys:
        if f"{k}_is_pad" in carried:
            clashes.append((f"{k}_is_pad", f"{k}_pad_feature", f"the padding of delta_timestamps key {k!r}",
                            f"drop {k!r} from delta_timestamps, or "))
    if not clashes:
        return
    key, new, what, other = clashes[0]
    export = (f"lerobot_sql.connect_many({{'d': {where!r}}}).export(\"SELECT 'd' AS dataset, episode_index FROM "
              f"episodes\", DEST, rename={{'d': {{{key!r}: {new!r}}}}})")
    camera = " (or leave the camera out: cameras=[...])" if layout.features[key].is_camera else ""
    raise DatasetFormatError(
        f"{where}: feature {key!r} (meta/info.json) has the name of the key every item carries {what} under, which "
        f"would replace the feature's values in every item and batch without a word (lerobot's __getitem__ does). "
        f"Refused: {other}read a copy with the feature renamed, e.g. {export}{camera}")




















def load_layout(src: Source) -> Layout:
    """Read meta/info.json and list the metadata and data files (no Parquet is opened).

    v3.x and v2.x (v2.0, v2.1) are accepted. A copy without data files or without episode metadata still opens
    (its views are empty) with a warning, so metadata-only copies can be queried.

    Raises:
        MissingFileError: meta/info.json does not exist under the root.
        DatasetFormatError: info.json is not valid JSON or lacks fps/features.
        UnsupportedVersionError: codebase_version is neither v2.x nor v3.x.
    """
    where = src.path("meta/info.json")
    if not src.exists("meta/info.json"):
        import os

        inner = dataset_folders_in(src.path("")) if src.is_local else []  # (remote: a listing is a request)
        names = [os.path.relpath(p, src.path("")) for p in inner[:3]]
        hint = (f" It holds {len(inner)} dataset folder(s) ({', '.join(names)}{', ...' if len(inner) > 3 else ''}): "
                f"open one (lsql.connect({inner[0]!r})), or all of them at once "
                f"(lsql.connect_many({src.url!r}))") if inner else ""
        raise MissingFileError(
            f"{where}: not found. Is {src.url!r} the root of a LeRobot dataset (the folder holding meta/, data/, "
            f"videos/)?{hint}")
    with src.open("meta/info.json") as f:
        info = load_json(f.read(), where, "restore it from the dataset's source (or write it again with lerobot's "
                         "writer)")
    v = check_info(info, where)
    if src.is_http:  # no directory listing: every exists/glob below answers from the files the metadata names
        src.set_listing(listing.list_files(src, v))
    legacy, fps, features, has_video, chunks_size = v.legacy, v.fps, v.features, v.has_video, v.chunks_size
    version = v.version
    notes: list[str] = []

    if legacy:
        episode_files = (V2_EPISODES,) if src.exists(V2_EPISODES) else ()
        stats_file = V2_EPISODES_STATS if src.exists(V2_EPISODES_STATS) else None
        tasks_file = V2_TASKS if src.exists(V2_TASKS) else None
        data_path, video_path = v.data_path, v.video_path
        if not episode_files:
            notes.append(f"{src.path(V2_EPISODES)}: not found; the episodes view is empty")
    else:
        episode_files = tuple(src.glob(EPISODES_GLOB))
        stats_file = None
        tasks_file = V3_TASKS if src.exists(V3_TASKS) else None
        data_path, video_path = v.data_path, v.video_path
        if not episode_files:
            notes.append(f"{src.path('meta/episodes')}: no episode metadata files ({EPISODES_GLOB}); "
                         "the episodes, episode_stats and videos views are empty")
    if tasks_file is None:
        notes.append(f"{src.path(V2_TASKS if legacy else V3_TASKS)}: not found; the tasks view is empty and "
                     "dataset() refuses frames whose task text it cannot give")
    data_files, strays = _split_data_files(src, tuple(src.glob("data/*/*.parquet")), data_path, notes)
    if not data_files:
        notes.append(f"{src.path('data')}: no data files (data/*/*.parquet); this is a metadata-only copy, the "
                     "frames view is empty. Download data/ to read frames")
    if video_path is not None and has_video:
        video_path = _find_video_dir(src, video_path, notes, VIDEO_FIELDS_V2 if legacy else VIDEO_FIELDS_V3, where)
    for n in notes:
        warn(n)  # the caller of lerobot_sql.connect()
    return Layout(
        version=version,
        fps=float(fps),
        features=features,
        data_path=data_path,
        video_path=video_path,
        info=info,
        episode_files=episode_files,
        data_files=data_files,
        legacy=legacy,
        chunks_size=chunks_size,
        tasks_file=tasks_file,
        episode_stats_file=stats_file,
        warnings=tuple(notes),
        stray_data_files=strays,
    )


def _split_data_files(src: Source, found: tuple[str, ...], data_path: str,
                      notes: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``found`` split into the dataset's data files (those ``data_path`` can name) and the strays.

    A Parquet file of other columns beside the dataset's own (raw recorder output) would join the frames view
    with NULL ``episode_index`` rows: only files the template names are read, and the others are named in a note.
    When no file matches the template (a writer that ignored its own data_path), all are read, as before, with a
    note: refusing would leave nothing to read.
    """
    pattern = re.compile("".join(re.escape(text) + (r"\d+" if field is not None else "")
                                 for text, field, _spec, _conv in string.Formatter().parse(data_path)))
    ours = tuple(f for f in found if pattern.fullmatch(f))
    strays = tuple(f for f in found if not pattern.fullmatch(f))
    if not strays:
        return found, ()
    if not ours:
        notes.append(f"{src.path('data')}: none of the {len(found)} Parquet files under data/ match info.json's "
                     f"data_path {data_path!r} (e.g. {found[0]}); all are read as data files. Fix data_path")
        return found, ()
    shown = ", ".join(strays[:5]) + (f" and {len(strays) - 5} more" if len(strays) > 5 else "")
    notes.append(f"{src.path('data')}: {len(strays)} Parquet file(s) do not match info.json's data_path "
                 f"{data_path!r} and are not read as frames: {shown}. They are not part of the dataset "
                 "(lerobot-sql doctor lists them); move them out of data/")
    return ours, strays


def _find_video_dir(src: Source, video_path: str, notes: list[str], fields: frozenset[str] = VIDEO_FIELDS_V3,
                    where: str = "meta/info.json") -> str:
    """``video_path`` with its top folder replaced when that folder is absent but exactly one other top-level
    folder holds mp4 files (third-party writers put videos in ``video/`` while the template says ``videos/``).

    Only the literal first path segment is compared, so this costs one or two listings, not one per file. The
    folder's name is data from a listing, not template text: its braces are escaped, and the rewritten template
    goes through the same :func:`~lerobot_sql._format.info.check_template` (and so :func:`lerobot_sql._storage.source.confine`) as info.json's; a
    name that fails it (a backslash, a NUL) is not used, with a note. A folder that is a symlink out of the
    dataset is refused where its files are opened (:meth:`lerobot_sql._storage.source.Source.check_link`).
    """
    top = video_path.split("/", 1)
    if len(top) != 2 or "{" in top[0]:
        return video_path
    try:
        if src.exists(top[0]):
            return video_path
        candidates = sorted({p.split("/", 1)[0] for p in src.glob("*/**/*.mp4")} - {"meta", "data"})
    except Exception:  # noqa: BLE001 - a filesystem that cannot list (plain HTTP) keeps the template as written
        return video_path
    if len(candidates) != 1:
        return video_path
    folder = candidates[0]
    fixed = f"{folder.replace('{', '{{').replace('}', '}}')}/{top[1]}"
    try:
        check_template(fixed, fields, "video_path", f"{where} (rewritten to the folder {folder!r} found under the "
                                                    "root)")
    except DatasetFormatError as e:
        notes.append(f"{src.path(top[0])}: not found; {src.path(folder)} holds mp4 files but its name cannot be "
                     f"used as a video folder ({e}); videos are read through info.json's video_path {video_path!r}. "
                     "Rename the folder to match video_path")
        return video_path
    notes.append(f"{src.path(top[0])}: not found, but {src.path(folder)} holds mp4 files; reading videos "
                 f"through {fixed!r} instead of info.json's video_path {video_path!r}")
    return fixed


def dataset_folders_in(folder: str) -> list[str]:
    """The dataset roots a local folder of datasets holds: its sub-folders, one or two levels down, that have
    meta/info.json (sorted paths). What ``connect_many(folder)`` opens, and what ``connect(folder)`` names when given
    such a folder."""
    import glob
    import os

    found = (glob.glob(os.path.join(glob.escape(folder), "*", "meta", "info.json")) +
             glob.glob(os.path.join(glob.escape(folder), "*", "*", "meta", "info.json")))
    return sorted({os.path.dirname(os.path.dirname(p)) for p in found})
