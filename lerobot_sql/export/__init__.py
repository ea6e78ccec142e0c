"""Write a query's frames as a new LeRobot v3.0 dataset (``export_dataset``) or as a Parquet manifest
(``export_manifest``).

Export plan: the query is resolved to a manifest by ``db.manifest(sql)`` (:mod:`lerobot_sql._plan.manifest`; the same
row cap, fast path and order as ``dataset()``), cut into *parts* (one output episode each: a whole source episode
or a window, told apart by ``result_row``, or a contiguous run of ``index`` rows of one episode), and each part is
written in order:

* data: the part's source rows, with ``episode_index``/``index``/``frame_index``/``timestamp``/``task_index``
  rewritten, one row group per episode, files rotated by ``data_files_size_in_mb``;
* video, per camera: packets copied as they are (PyAV remux, no decode) from the first kept frame on when it is a
  keyframe; frames before the first keyframe of a part (a window cut mid-GOP) are decoded and re-encoded with the
  encoder settings of info.json (lerobot's defaults where info.json has none). Files rotate by
  ``video_files_size_in_mb``; each episode's ``from_timestamp`` is where its first frame sits in the new file;
* meta/episodes (source row copied, pointers/lengths/tasks replaced, stats recomputed for cut parts and for the
  renumbered ``index``/``episode_index``/``task_index`` columns), tasks.parquet (tasks still used, in source order),
  stats.json (aggregated as lerobot 0.4.4 does), info.json (totals and splits).

The source may be v3.x or v2.0/v2.1: episode metadata and tasks are read through the catalog (``_episodes_raw``,
``tasks``), which gives both versions the same columns, so a v2.x selection is written as a v3.0 dataset (info.json
converted as lerobot 0.4.4's ``convert_dataset_v21_to_v30`` does it).

Everything is written into a hidden sibling folder and renamed into place at the end, so the destination appears
complete or not at all. ``meta/lerobot_sql_export.json`` marks the folder as ours and lists the files written: an
overwrite replaces only an empty folder or such an export, and no destination may be the source, lie inside it or
hold it (symlinks resolved).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import time
import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._readers import decode, locate, video_index
from .._version import __version__
from ..errors import DatasetFormatError, DestinationError, DestinationExistsError, LeRobotSQLError, VideoDecodeError
from .._format.layout import DEFAULT_DATA_PATH, DEFAULT_VIDEO_PATH
from .._plan.manifest import Meta

EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_POINTERS = ("meta/episodes/chunk_index", "meta/episodes/file_index")
V3_VERSION = "v3.0"
DEFAULT_DATA_MB, DEFAULT_VIDEO_MB = 100, 200  # lerobot 0.4.4 DEFAULT_DATA_FILE_SIZE_IN_MB / DEFAULT_VIDEO_...
MAX_OPEN_INPUTS = 8  # source files kept open per stream (v2.x has one data file and one mp4 per episode)
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
INDEX_COLUMNS = ("index", "episode_index", "task_index")  # renumbered on export, so their stats are recomputed
# info.json "video.codec" (FFmpeg decoder name) -> the encoder lerobot uses for it.
ENCODERS = {"av1": "libsvtav1", "libdav1d": "libsvtav1", "h264": "libx264", "hevc": "libx265"}


@dataclasses.dataclass
class ExportReport:
    """What :func:`export_dataset` wrote.

    Attributes:
        dest: the new dataset root.
        episodes, frames: totals of the new dataset.
        tasks: rows of the new meta/tasks.parquet.
        files_written: every file under ``dest``.
        data_files, video_files: how many of each.
        frames_reencoded: video frames decoded and re-encoded (summed over cameras); all others were remuxed.
        frames_remuxed: video frames whose packets were copied unchanged (summed over cameras).
        seconds: wall time.
    """

    dest: str
    episodes: int
    frames: int
    tasks: int
    files_written: int
    data_files: int
    video_files: int
    frames_reencoded: int
    frames_remuxed: int
    seconds: float


@dataclasses.dataclass
class ManifestReport:
    """What :func:`export_manifest` wrote: ``path``, ``rows`` (samples), ``episodes`` (distinct), ``seconds``."""

    path: str
    rows: int
    episodes: int
    seconds: float


@dataclasses.dataclass
class _Part:
    """One output episode: ``length`` consecutive frames of source episode ``src_episode`` from ``frame_start``."""

    src_episode: int
    frame_start: int
    length: int
    whole: bool
    data_file: str
    data_row: int
    rows: np.ndarray  # manifest rows of this part, in frame order


# ---- destination safety -----------------------------------------------------------------------------------------
# What an overwrite may delete: only a folder that is empty or that this module wrote (the marker lists every file it
# wrote, with its size), and only a manifest file that carries our schema metadata. Everything else (the source, a
# folder that holds it, the user's files) is refused before any work, so an export can never delete what it did not
# write.
MARKER = "meta/lerobot_sql_export.json"
MARKER_FORMAT = 1
# errno values that can only come from writing the destination (reading the source never raises them).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _local_dest(dest: str | os.PathLike, what: str) -> Path:
    """``dest`` as an absolute local path; symlinks are resolved, a dangling one is refused."""
    if "://" in os.fspath(dest):
        raise DestinationError(f"{os.fspath(dest)}: {what} writes to a local path; write locally and upload the "
                               "result afterwards")
    p = Path(os.path.abspath(os.fspath(dest)))
    if os.path.islink(p) and not os.path.exists(p):
        raise DestinationError(f"{p}: is a symlink to {os.readlink(p)!r}, which does not exist; remove the link, "
                               "create its target, or choose another destination")
    return Path(os.path.realpath(p))


def _refuse_source(db, dest: Path, what: str) -> None:
    """Refuse a destination that is the source root, inside it or a folder holding it (symlinks resolved)."""
    if not db.source.is_local:
        return
    src = Path(os.path.realpath(db.source.root))
    if dest == src or dest.is_relative_to(src):
        raise DestinationError(f"{dest}: is inside the source dataset {src}; {what} never writes into its own "
                               "source: choose a destination outside it")
    if src.is_relative_to(dest):
        raise DestinationError(f"{dest}: holds the source dataset {src}; {what} never replaces a folder that holds "
                               "its source: choose another destination")


def _our_files(root: Path) -> dict[str, int]:
    """Every file and symlink under ``root`` (relative posix path -> size; a symlink counts as -1, never ours)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = Path(full).relative_to(root).as_posix()
            out[rel] = -1 if os.path.islink(full) else os.lstat(full).st_size
    return out


def _check_replaceable(dest: Path) -> None:
    """Raise DestinationExistsError unless ``dest`` is an empty folder or an export of ours left as we wrote it."""
    if not dest.is_dir():
        raise DestinationExistsError(f"{dest}: exists and is not a folder; overwrite=True replaces only an empty "
                                     "folder or a dataset lerobot_sql exported: remove it yourself or choose another "
                                     "destination")
    present = _our_files(dest)
    if not present:
        return
    marker = dest / MARKER
    try:
        written = json.loads(marker.read_text())["files"]
        if not isinstance(written, dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DestinationExistsError(
            f"{dest}: exists and is not a dataset lerobot_sql exported (no readable {MARKER}); overwrite=True "
            "replaces only an empty folder or a previous export: remove it yourself or choose another destination"
        ) from e
    present.pop(MARKER, None)
    foreign = sorted(r for r, size in present.items() if written.get(r) != size)
    if foreign:
        raise DestinationExistsError(
            f"{dest}: holds {len(foreign)} file(s) the previous export did not write or that changed since "
            f"(e.g. {foreign[:3]}); overwrite=True never deletes them: move them away or choose another destination")


def _make_parents(folder: Path, dest: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns the folders created (to remove on failure)."""
    missing = []
    p = folder
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    created = []
    for d in reversed(missing):
        try:
            d.mkdir()
        except OSError as e:
            _remove_dirs(created)
            why = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror
            raise DestinationError(f"{dest}: cannot create the folder {d} ({why}); choose another destination") \
                from e
        created.append(d)
    if not folder.is_dir():
        raise DestinationError(f"{dest}: its parent {folder} is not a folder; choose another destination")
    return created


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            pass


def _write_error(e: OSError, dest: Path) -> DestinationError | None:
    """The typed error for a failed write to ``dest`` (disk full, quota, read-only), or None if ``e`` is not one."""
    if isinstance(e, LeRobotSQLError):
        return None
    text = str(e)
    if e.errno in _WRITE_ERRNOS or "No space left on device" in text or "Read-only file system" in text:
        why = e.strerror or text
        return DestinationError(f"{dest}: writing failed ({why}); nothing was left there: free space on "
                                f"{dest.parent} (or make it writable) and export again, or choose another destination")
    return None


def _is_our_manifest(path: Path) -> bool:
    try:
        return b"lerobot_sql.manifest" in (pq.read_schema(path).metadata or {})
    except (OSError, pa.ArrowException, ValueError):
        return False


# ---- manifest ---------------------------------------------------------------------------------------------------
def dataset_identity(layout) -> str:
    """A digest of what makes two dataset folders the same dataset for a manifest: info.json's
    ``codebase_version``, ``total_episodes``, ``total_frames``, ``fps`` and ``features`` (sha256 hex of their JSON).

    A manifest stores its source's (``lerobot_sql.manifest`` -> ``dataset_id``); ``db.dataset(manifest)`` through
    another root accepts it only when that root's digest is equal (a copied or moved dataset), since a manifest's
    rows are file rows and indices of that one dataset.
    """
    import hashlib

    info = layout.info
    keys = ("codebase_version", "total_episodes", "total_frames", "fps", "features")
    text = json.dumps({k: info.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def export_manifest(db, sql: str, path: str | os.PathLike, *, overwrite: bool = False) -> ManifestReport:
    """Write the manifest of ``sql`` (see :mod:`lerobot_sql._plan.manifest`) as one Parquet file, one row per sample.

    Columns: those of ``db.manifest(sql)`` (``index, episode_index, frame_index, timestamp, task_index, data_file,
    data_row, ep_from_index, ep_to_index, ep_data_row0, result_row``, per camera ``<video_key>/file`` and
    ``<video_key>/from_timestamp``, the query's extra columns) plus, per camera, ``<video_key>/time_s`` (float64,
    seconds in that mp4 = from_timestamp + timestamp). Paths are relative to the dataset root, which is stored in the
    schema metadata (``lerobot_sql.manifest`` -> ``root``). ``db.dataset(path)`` rebuilds the same items; Ray Data
    or Daft read it with their Parquet readers and shard it by row.

    The file is written under a temporary name and renamed into place. ``overwrite=True`` replaces only a manifest
    this function wrote (a Parquet file with ``lerobot_sql.manifest`` metadata), never another file.

    Raises:
        QueryError / ResultContractError: the SQL or its result is unusable.
        DestinationExistsError (a FileExistsError): ``path`` exists and ``overwrite`` is False, or it is not a
            manifest lerobot_sql wrote.
        DestinationError (an OSError): ``path`` is a folder, a dangling symlink, inside the source dataset, has a
            file where a parent folder should be, or the disk is full / read-only (nothing is left at ``path``).
    """
    t0 = time.perf_counter()
    path = _local_dest(path, "export_manifest")
    _refuse_source(db, path, "export_manifest")
    if path.is_dir():
        raise DestinationError(f"{path}: is a folder; export_manifest writes one Parquet file: give a file path "
                               f"such as {path / 'manifest.parquet'}")
    if os.path.lexists(path):
        if not overwrite:
            raise DestinationExistsError(f"{path}: exists; pass overwrite=True or choose another path")
        if not _is_our_manifest(path):
            raise DestinationExistsError(f"{path}: exists and is not a manifest lerobot_sql wrote (no lerobot_sql."
                                         "manifest metadata); overwrite=True never replaces other files: remove it "
                                         "yourself or choose another path")
    m = db.manifest(sql)
    meta = dataclasses.replace(Meta.of(m), root=db.source.url,
                               dataset_id=dataset_identity(db.layout))  # a copy elsewhere opens it (db.dataset)
    for k in db.layout.video_keys:
        t = pc.add(m[f"{k}/from_timestamp"].cast(pa.float64()), m["timestamp"].cast(pa.float64()))
        m = m.append_column(f"{k}/time_s", t)
    m = meta.attach(m)
    created = _make_parents(path.parent, path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    ok = False
    try:
        pq.write_table(m, tmp)
        os.replace(tmp, path)
        ok = True
    except OSError as e:
        err = _write_error(e, path)
        if err is None:
            raise
        raise err from e
    finally:
        if tmp.exists():
            tmp.unlink()
        if not ok:
            _remove_dirs(created)
    episodes = len(np.unique(m["episode_index"].to_numpy()))
    return ManifestReport(str(path), m.num_rows, episodes, time.perf_counter() - t0)


# ---- dataset ----------------------------------------------------------------------------------------------------
def export_dataset(db, sql: str, dest: str | os.PathLike, *, overwrite: bool = False, progress: bool = True,
                   tolerance_s: float = 1e-4) -> ExportReport:
    """Write the frames ``sql`` selects as a new LeRobot v3.0 dataset at ``dest`` (a local folder).

    ``sql`` follows the dataset() contract (see :mod:`lerobot_sql._plan.resolve`): ``episode_index`` rows export whole
    episodes, ``(episode_index, start_s, end_s)`` rows export one episode per window (frame_index and timestamp
    restart at 0), ``index`` rows export each contiguous run of frames of one episode as an episode. Output episodes
    follow the result order (for a query without ORDER BY, the order dataset() gives it: sorted by the contract
    columns) and are numbered 0..N-1; ``index`` is contiguous; tasks still used are renumbered in
    source order. Extra result columns are not written.

    The dataset is written into a hidden sibling folder and renamed into place, with ``meta/lerobot_sql_export.json``
    listing every file written (name and size), so that a later ``overwrite=True`` can tell an export of ours from
    anything else.

    Args:
        overwrite: replace an existing ``dest`` (only once the new dataset is complete), and only if it is an empty
            folder or a dataset this function exported, holding only the files it wrote. Any other folder (the
            source, one that holds it, a dataset written by another tool, a folder with files of the user's) is
            refused.
        progress: show a tqdm bar.
        tolerance_s: how far a data timestamp may be from its video frame's pts (as in dataset()).

    Returns:
        :class:`ExportReport` (episodes, frames, files written, frames re-encoded, seconds).

    Raises:
        QueryError / ResultContractError: the SQL or its result is unusable.
        DestinationExistsError (a FileExistsError): ``dest`` exists and ``overwrite`` is False, or it is not an empty
            folder or an unchanged export of ours.
        DestinationError (an OSError): ``dest`` is the source, inside it or holds it; a dangling symlink; a parent is
            a file; the disk is full or read-only (nothing is left at ``dest``).
        FrameNotFoundError: a selected frame has no video frame within ``tolerance_s``.
        DatasetFormatError / VideoDecodeError / MissingFileError: the source dataset is inconsistent or unreadable.
    """
    t0 = time.perf_counter()
    dest = _local_dest(dest, "export")
    _refuse_source(db, dest, "export")
    replacing = os.path.lexists(dest)
    if replacing:
        if not overwrite:
            raise DestinationExistsError(f"{dest}: already exists; pass overwrite=True or choose another destination")
        _check_replaceable(dest)
    # db.manifest, as dataset() resolves the same SQL: the row cap, the pointer fast path for whole episodes, and
    # a deterministic order for a query without ORDER BY. Each sample's result_row says which output episode
    # (window, whole episode) it belongs to.
    manifest = db.manifest(sql)
    parts = _parts(manifest, Meta.of(manifest).mode)

    created = _make_parents(dest.parent, dest)
    tmp = dest.parent / f".{dest.name}.lsql-export-{uuid.uuid4().hex[:8]}"
    ok = False
    try:
        try:
            tmp.mkdir()
        except OSError as e:
            raise DestinationError(f"{dest}: cannot create a folder in {dest.parent} ({e.strerror}); make it "
                                   "writable or choose another destination") from e
        writer = _Exporter(db, manifest, parts, tmp, tolerance_s)
        report = writer.run(progress)
        _write_marker(tmp, db)
        if os.path.lexists(dest):
            _check_replaceable(dest)  # again: it may have changed during the export
            old = dest.parent / f".{dest.name}.lsql-old-{uuid.uuid4().hex[:8]}"
            os.rename(dest, old)
            try:
                os.rename(tmp, dest)
            except BaseException:
                os.rename(old, dest)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dest)
        ok = True
    except OSError as e:
        err = _write_error(e, dest)
        if err is None:
            raise
        raise err from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not ok:
            _remove_dirs(created)
    report.dest = str(dest)
    report.files_written = sum(1 for p in dest.rglob("*") if p.is_file())
    report.seconds = time.perf_counter() - t0
    return report


def _write_marker(root: Path, db) -> None:
    """meta/lerobot_sql_export.json: who wrote this folder, from what, and every file it holds (name -> bytes)."""
    files = _our_files(root)
    marker = {"written_by": "lerobot_sql", "format": MARKER_FORMAT, "version": __version__,
              "source": db.source.url, "files": dict(sorted(files.items()))}
    (root / MARKER).parent.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(json.dumps(marker, indent=1, ensure_ascii=False))


def _parts(m: pa.Table, mode: str) -> list[_Part]:
    """Cut the manifest into output episodes: per result row (episode/window modes) or per contiguous run."""
    ep = m["episode_index"].to_numpy()
    fi = m["frame_index"].to_numpy()
    row = m["data_row"].to_numpy()
    files = m["data_file"].to_pylist()
    ep_len = m["ep_to_index"].to_numpy() - m["ep_from_index"].to_numpy()
    brk = np.ones(len(ep), bool)
    if len(ep) > 1:
        same = (ep[1:] == ep[:-1]) & (fi[1:] == fi[:-1] + 1) & (row[1:] == row[:-1] + 1)
        if mode != "index":
            pid = m["result_row"].to_numpy()
            same &= pid[1:] == pid[:-1]
        brk[1:] = ~same
    starts = np.flatnonzero(brk)
    ends = np.append(starts[1:], len(ep))
    out = []
    for s, e in zip(starts, ends):
        n = int(e - s)
        out.append(_Part(int(ep[s]), int(fi[s]), n, bool(fi[s] == 0 and n == ep_len[s]), files[s], int(row[s]),
                         np.arange(s, e)))
    return out


class _Rotator:
    """chunk/file counters of one output stream (data, episodes metadata or one camera)."""

    def __init__(self, chunks_size: int):
        self.chunks_size, self.chunk, self.file, self.used = max(int(chunks_size), 1), 0, 0, False

    def advance(self) -> None:
        self.file += 1
        if self.file >= self.chunks_size:
            self.chunk, self.file = self.chunk + 1, 0


class _Exporter:
    def __init__(self, db, manifest: pa.Table, parts: list[_Part], root: Path, tolerance_s: float):
        self.db, self.src, self.layout = db, db.source, db.layout
        self.m, self.parts, self.root, self.tol = manifest, parts, root, tolerance_s
        info = self.layout.info
        self.fps = self.layout.fps
        self.chunks_size = int(info.get("chunks_size") or 1000)
        self.data_limit = float(info.get("data_files_size_in_mb") or DEFAULT_DATA_MB) * 1024 * 1024
        self.video_limit = float(info.get("video_files_size_in_mb") or DEFAULT_VIDEO_MB) * 1024 * 1024
        # Output path templates: the source's own for v3.x; v2.x templates name one file per episode, so a v2 source
        # is written with lerobot's v3.0 defaults.
        legacy = self.layout.legacy
        self.data_path = DEFAULT_DATA_PATH if legacy else self.layout.data_path
        self.video_path = DEFAULT_VIDEO_PATH if legacy or not self.layout.video_path else self.layout.video_path
        self.frames_reencoded = self.frames_remuxed = 0
        self.data_files = self.video_files = 0

    # ---- driver -------------------------------------------------------------------------------------------
    def run(self, progress: bool) -> ExportReport:
        from tqdm.auto import tqdm

        self._load_episodes()
        self._tasks()
        self.data = _DataWriter(self)
        self.videos = {k: _VideoWriter(self, k) for k in self.layout.video_keys}
        self.decoders = decode.DecoderPool(self.src, max_open=4)
        rows, ep_stats = [], []
        next_index = 0
        try:
            bar = tqdm(self.parts, desc="export", unit="episode", disable=not progress or len(self.parts) < 2)
            for new_ep, part in enumerate(bar):
                table = self.data.write(part, new_ep, next_index)
                row = dict(self.src_rows[part.src_episode])
                row.update({"episode_index": new_ep, "length": part.length,
                            "dataset_from_index": next_index, "dataset_to_index": next_index + part.length,
                            "data/chunk_index": self.data.rot.chunk, "data/file_index": self.data.rot.file,
                            "tasks": [self.new_tasks[t] for t in np.unique(table["task_index"].to_numpy())]})
                for k, w in self.videos.items():
                    row.update(w.write(part))
                stats = self._episode_stats(part, table)
                for (feat, stat), col in self.stat_cols.items():
                    if feat in stats and stat in stats[feat]:
                        row[col] = stats[feat][stat]
                rows.append(row)
                ep_stats.append(stats)
                next_index += part.length
        finally:
            self.data.close()
            for w in self.videos.values():
                w.close()
            self.decoders.close()
        self._write_episodes(rows)
        self._write_stats(ep_stats)
        self._write_info(len(self.parts), next_index)
        return ExportReport("", len(self.parts), next_index, len(self.new_tasks), 0, self.data.files,
                            sum(w.files for w in self.videos.values()), self.frames_reencoded, self.frames_remuxed,
                            0.0)

    # ---- metadata in --------------------------------------------------------------------------------------
    def _load_episodes(self) -> None:
        """The source episode rows and the output meta/episodes schema, from the catalog's ``_episodes_raw``.

        ``_episodes_raw`` has the same columns for v3.x (meta/episodes/*.parquet) and v2.x (episodes.jsonl and
        episodes_stats.jsonl), so export never parses the metadata files itself.
        """
        ep = self.db.con.sql("SELECT * FROM _episodes_raw").to_arrow_table()
        self.ep_schema = self._episodes_schema(ep.schema)
        want = sorted(set(int(p.src_episode) for p in self.parts))
        sub = ep.filter(pc.is_in(ep["episode_index"], pa.array(want, pa.int64()))).to_pylist()
        self.src_rows = {int(r["episode_index"]): r for r in sub}
        missing = set(want) - set(self.src_rows)
        if missing:
            where = self.layout.episode_files[0] if self.layout.episode_files else "meta/episodes"
            raise DatasetFormatError(f"{self.src.path(where)}: no row for episode(s) {sorted(missing)[:5]}; run "
                                     "`lerobot-sql doctor`")
        self.stat_cols: dict[tuple[str, str], str] = {}
        for name in ep.column_names:
            if name.startswith("stats/"):
                feat, _, stat = name[len("stats/"):].rpartition("/")
                self.stat_cols[(feat, stat)] = name
        self.stat_types = {name: self.ep_schema.field(name).type for name in self.stat_cols.values()}

    def _episodes_schema(self, raw: pa.Schema) -> pa.Schema:
        """Columns of ``_episodes_raw`` plus the meta/episodes pointers. A v3 source keeps the exact types and the
        schema metadata of its first meta/episodes file (only its footer is read); other columns (all of them for
        v2.x) get plain Arrow types (list<double>, string)."""
        ref: dict[str, pa.DataType] = {}
        meta = None
        if not self.layout.legacy and self.layout.episode_files:
            with self.src.open(self.layout.episode_files[0]) as f:
                first = pq.read_schema(f)
            ref, meta = {fld.name: fld.type for fld in first}, first.metadata
        fields = [pa.field(fld.name, ref.get(fld.name) or _plain_type(fld.type)) for fld in raw]
        fields += [pa.field(c, pa.int64()) for c in EPISODES_POINTERS if c not in raw.names]
        return pa.schema(fields, metadata=meta)

    def _tasks(self) -> None:
        used = np.unique(self.m["task_index"].to_numpy())
        texts = dict(self.db.con.sql("SELECT task_index, task FROM tasks").fetchall())
        absent = [int(t) for t in used if int(t) not in texts]
        if absent:
            raise DatasetFormatError(f"{self.src.path(self.layout.tasks_file or 'meta/tasks.parquet')}: no task_index "
                                     f"{absent[:5]}, used by the selected frames; run `lerobot-sql doctor`")
        self.task_map = np.full(int(used.max()) + 1, -1, np.int64)
        self.task_map[used] = np.arange(len(used))
        self.new_tasks = {i: texts[int(t)] for i, t in enumerate(used)}

    # ---- stats --------------------------------------------------------------------------------------------
    def _episode_stats(self, part: _Part, table: pa.Table) -> dict[str, dict[str, np.ndarray]]:
        """Per-feature stats of one output episode: copied from the source for whole episodes, else recomputed."""
        copied = self._source_stats(part.src_episode) if part.whole else {}
        out: dict[str, dict[str, np.ndarray]] = {}
        for name, feat in self.layout.features.items():
            if feat.dtype in ("string", "language"):
                continue
            if name in copied and name not in INDEX_COLUMNS and copied[name]:
                out[name] = copied[name]
                continue
            if feat.is_video:
                if (name, "mean") in self.stat_cols or not self.stat_cols:
                    out[name] = _image_stats(self._video_samples(name, part))
            elif feat.is_image:
                if name in table.column_names and ((name, "mean") in self.stat_cols or not self.stat_cols):
                    out[name] = _image_stats(self._png_samples(table[name], part.length))
            elif name in table.column_names:
                arr = _numeric(table[name])
                out[name] = _feature_stats(arr.reshape(len(arr), -1), feat.shape if arr.ndim > 1 else (1,))
        return out

    def _source_stats(self, episode: int) -> dict[str, dict[str, np.ndarray]]:
        row = self.src_rows[episode]
        out: dict[str, dict[str, np.ndarray]] = {}
        for (feat, stat), col in self.stat_cols.items():
            v = row.get(col)
            if v is not None:
                out.setdefault(feat, {})[stat] = np.asarray(v)
        return out

    def _video_samples(self, key: str, part: _Part) -> np.ndarray:
        rel = self.m[f"{key}/file"][int(part.rows[0])].as_py()
        index = video_index.FrameIndex.load(video_index.ensure_index(self.src, rel, self.db.cache_dir))
        pick = _sample_indices(part.length)
        rows_m = part.rows[pick]
        times = locate.time_in_file(self.m[f"{key}/from_timestamp"].to_numpy()[rows_m],
                                    self.m["timestamp"].to_numpy()[rows_m])
        r = index.locate(times, self.tol, episode_index=part.src_episode, video_key=key)
        frames = self.decoders.decode(index, r)
        return np.stack([_downsample(frames[int(index.pts[x])].transpose(2, 0, 1)) for x in r])

    def _png_samples(self, column: pa.ChunkedArray, n: int) -> np.ndarray:
        import io

        from PIL import Image

        imgs = []
        for i in _sample_indices(n):
            v = column[int(i)].as_py()
            a = np.asarray(Image.open(io.BytesIO(v["bytes"] if isinstance(v, dict) else v)).convert("RGB"))
            imgs.append(_downsample(a.transpose(2, 0, 1)))
        return np.stack(imgs)

    # ---- metadata out -------------------------------------------------------------------------------------
    def _write_episodes(self, rows: list[dict]) -> None:
        rot = _Rotator(self.chunks_size)
        for r in rows:
            for col, typ in self.stat_types.items():
                if col in r and isinstance(r[col], np.ndarray):
                    r[col] = _py(r[col], typ)
        per_row = max(1, len(json.dumps(rows[0], default=str)))
        per_file = max(1, int(self.data_limit // per_row))
        for start in range(0, len(rows), per_file):
            chunk = rows[start:start + per_file]
            for r in chunk:
                r["meta/episodes/chunk_index"], r["meta/episodes/file_index"] = rot.chunk, rot.file
            rel = EPISODES_PATH.format(chunk_index=rot.chunk, file_index=rot.file)
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(chunk, schema=self.ep_schema), path)
            rot.advance()

    def _write_stats(self, ep_stats: list[dict]) -> None:
        feats = [f for f in self.layout.features if any(f in s for s in ep_stats)]
        agg = {}
        for f in feats:
            lst = [s[f] for s in ep_stats if f in s and {"mean", "std", "count", "min", "max"} <= set(s[f])]
            if lst:
                agg[f] = {k: v.tolist() for k, v in _aggregate(lst).items()}
        if agg:
            (self.root / "meta" / "stats.json").write_text(json.dumps(agg, indent=4))

    def _write_info(self, episodes: int, frames: int) -> None:
        import pandas as pd

        info = json.loads(json.dumps(self.layout.info))
        if self.layout.legacy:
            _v2_info_to_v3(info)
        info.update(total_episodes=episodes, total_frames=frames, total_tasks=len(self.new_tasks),
                    splits={"train": f"0:{episodes}"})
        (self.root / "meta").mkdir(parents=True, exist_ok=True)
        (self.root / "meta" / "info.json").write_text(json.dumps(info, indent=4, ensure_ascii=False))
        # As lerobot 0.4.4 writes it: task text in the unnamed pandas index (__index_level_0__), task_index column.
        tasks = pd.DataFrame({"task_index": np.arange(len(self.new_tasks), dtype=np.int64)},
                             index=[self.new_tasks[i] for i in range(len(self.new_tasks))])
        tasks.to_parquet(self.root / "meta" / "tasks.parquet")


class _DataWriter:
    """Writes data/chunk-*/file-*.parquet, one row group per episode, rotating by data_files_size_in_mb."""

    def __init__(self, ex: _Exporter):
        self.ex = ex
        self.rot = _Rotator(ex.chunks_size)
        self.writer: pq.ParquetWriter | None = None
        self.fh = None
        self.schema: pa.Schema | None = None
        self.files = 0
        self._cache: dict[tuple[str, int], pa.Table] = {}
        self._pf: dict[str, tuple[pq.ParquetFile, np.ndarray, Any]] = {}

    def _source_rows(self, rel: str, row0: int, n: int) -> pa.Table:
        if rel not in self._pf:
            if len(self._pf) >= MAX_OPEN_INPUTS:  # parts arrive in file order: the oldest is done with
                old = next(iter(self._pf))
                self._pf.pop(old)[2].close()
                self._cache = {k: v for k, v in self._cache.items() if k[0] != old}
            fh = self.ex.src.open(rel)
            pf = pq.ParquetFile(fh)
            md = pf.metadata
            offs = np.concatenate([[0], np.cumsum([md.row_group(i).num_rows for i in range(md.num_row_groups)])])
            size = self.ex.src.fs.size(self.ex.src.path(rel))
            self._pf[rel] = (pf, offs, fh, size / max(md.num_rows, 1))
        pf, offs, _, _ = self._pf[rel]
        first = int(np.searchsorted(offs, row0, side="right") - 1)
        last = int(np.searchsorted(offs, row0 + n - 1, side="right") - 1)
        parts = []
        for rg in range(first, last + 1):
            key = (rel, rg)
            if key not in self._cache:
                if len(self._cache) > 8:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = pf.read_row_group(rg)
            parts.append(self._cache[key])
        t = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        return t.slice(row0 - int(offs[first]), n)

    def write(self, part: _Part, new_ep: int, next_index: int) -> pa.Table:
        ex = self.ex
        t = self._source_rows(part.data_file, part.data_row, part.length)
        got_fi = t["frame_index"].to_numpy()
        if t.num_rows != part.length or got_fi[0] != part.frame_start or np.any(np.diff(got_fi) != 1) or \
                np.any(t["episode_index"].to_numpy() != part.src_episode):
            raise DatasetFormatError(f"{part.data_file}: rows {part.data_row}..{part.data_row + part.length - 1} "
                                     f"are not frames {part.frame_start}.. of episode {part.src_episode}; the data "
                                     "file changed since the query ran, or is inconsistent (`lerobot-sql doctor`)")
        n = part.length
        ts = t["timestamp"].to_numpy().astype(np.float32)
        if not part.whole:
            grid = (np.arange(part.frame_start, part.frame_start + n) / ex.fps).astype(np.float32)
            # lerobot writes timestamp = frame_index / fps; keep that form when the source follows it.
            ts = (np.arange(n) / ex.fps).astype(np.float32) if np.array_equal(ts, grid) else \
                (ts.astype(np.float64) - float(ts[0])).astype(np.float32)
        task = t["task_index"].to_numpy() if "task_index" in t.column_names else np.zeros(n, np.int64)
        new = {"index": np.arange(next_index, next_index + n, dtype=np.int64),
               "episode_index": np.full(n, new_ep, np.int64), "frame_index": np.arange(n, dtype=np.int64),
               "timestamp": ts, "task_index": ex.task_map[task]}
        for name, values in new.items():
            if name in t.column_names:
                i = t.schema.get_field_index(name)
                t = t.set_column(i, t.schema.field(i), pa.array(values).cast(t.schema.field(i).type))
        self._rotate_if_needed(n, self._pf[part.data_file][3])
        if self.writer is None:
            self._open(t.schema)
        try:
            t = t.cast(self.schema) if t.schema != self.schema else t
        except (pa.ArrowInvalid, ValueError) as e:
            raise DatasetFormatError(f"{part.data_file}: its schema differs from the first data file's ({e}); "
                                     "export one source data file layout at a time") from e
        self.writer.write_table(t, row_group_size=max(n, 1))
        self.rot.used = True
        return t

    def _rotate_if_needed(self, n: int, bytes_per_frame: float) -> None:
        if self.writer is not None and self.rot.used and self.fh.tell() + bytes_per_frame * n >= self.ex.data_limit:
            self._close_file()
            self.rot.advance()
            self.rot.used = False

    def _open(self, schema: pa.Schema) -> None:
        rel = self.ex.data_path.format(chunk_index=self.rot.chunk, file_index=self.rot.file)
        path = self.ex.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self.schema = self.schema or schema
        self.fh = open(path, "wb")
        self.writer = pq.ParquetWriter(self.fh, self.schema, compression="snappy")
        self.files += 1

    def _close_file(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.fh.close()
            self.writer = self.fh = None

    def close(self) -> None:
        self._close_file()
        for _, _, fh, _ in self._pf.values():
            fh.close()
        self._pf.clear()


class _VideoWriter:
    """Writes videos/<key>/chunk-*/file-*.mp4 for one camera: remuxed packets, re-encoded heads of mid-GOP cuts."""

    def __init__(self, ex: _Exporter, key: str):
        self.ex, self.key = ex, key
        self.rot = _Rotator(ex.chunks_size)
        self.out = self.stream = None
        self.tb: Fraction | None = None
        self.t_pts = 0          # where the next episode starts, output time-base units
        self.bytes = 0
        self.last_dts: int | None = None
        self.files = 0
        self.inputs: dict[str, Any] = {}
        self.indexes: dict[str, tuple[video_index.FrameIndex, np.ndarray]] = {}
        self.feat_info = ex.layout.features[key].info

    def _index(self, rel: str) -> tuple[video_index.FrameIndex, np.ndarray]:
        if rel not in self.indexes:
            p = video_index.ensure_index(self.ex.src, rel, self.ex.db.cache_dir)
            self.indexes[rel] = (video_index.FrameIndex.load(p), pq.read_table(p, columns=["byte_size"])["byte_size"]
                                 .to_numpy())
        return self.indexes[rel]

    def _input(self, rel: str):
        if rel not in self.inputs:
            if len(self.inputs) >= MAX_OPEN_INPUTS:
                old = next(iter(self.inputs))
                self.inputs.pop(old).close()
                self.indexes.pop(old, None)
            self.inputs[rel] = video_index.open_container(self.ex.src, rel)
        return self.inputs[rel]

    def write(self, part: _Part) -> dict[str, Any]:
        ex, key = self.ex, self.key
        i0 = int(part.rows[0])
        rel = ex.m[f"{key}/file"][i0].as_py()
        from_src = float(ex.m[f"{key}/from_timestamp"][i0].as_py())
        index, sizes = self._index(rel)
        ts = ex.m["timestamp"].to_numpy()[part.rows].astype(np.float64)
        rows = index.locate(locate.time_in_file(from_src, ts), ex.tol, episode_index=part.src_episode, video_key=key)
        if np.any(np.diff(rows) != 1):
            raise DatasetFormatError(f"{rel}: frames of episode {part.src_episode} ({key}) are not consecutive in "
                                     "the video; the timestamps disagree with the video (`lerobot-sql doctor`)")
        ra, rb = int(rows[0]), int(rows[-1])
        est = int(sizes[ra:rb + 1].sum())
        inp = self._input(rel)
        in_stream = inp.streams.video[0]
        if self.out is not None and self.rot.used and self.bytes + est >= ex.video_limit:
            self._close_file()
            self.rot.advance()
        if self.out is None:
            self._open(in_stream)
        in_tb = Fraction(index.time_base)
        # A whole episode keeps its timestamps, so its first frame sits at from_timestamp + timestamp[0] (0 for
        # lerobot-written data); a cut one restarts at 0.
        lead = float(ts[0]) if part.whole else 0.0
        start_pts = self.t_pts + int(round(Fraction(lead) / self.tb)) if lead else self.t_pts
        from_ts = float(self.t_pts * self.tb)

        base, ratio = int(index.pts[ra]), in_tb / self.tb

        def out_pts(src_pts: int) -> int:
            if ratio == 1:  # the usual case: same time base, plain integer shift
                return start_pts + src_pts - base
            return start_pts + int(round((src_pts - base) * ratio))

        is_key = index.keyframe_pts == index.pts
        keys = np.flatnonzero(is_key[ra:rb + 1]) + ra
        rk = int(keys[0]) if len(keys) else rb + 1
        end_pts = None
        if rk > ra:
            end_pts = self._encode(inp, in_stream, index, ra, rk - 1, out_pts)
            ex.frames_reencoded += rk - ra
        if rk <= rb:
            ok, end_pts = self._remux(inp, in_stream, index, rk, rb, out_pts)
            if not ok:  # frames reordered across the cut (B-frames): re-encode that part instead
                end_pts = self._encode(inp, in_stream, index, rk, rb, out_pts)
                ex.frames_reencoded += rb - rk + 1
            else:
                ex.frames_remuxed += rb - rk + 1
        self.bytes += est
        self.rot.used = True
        self.t_pts = max(end_pts, start_pts)
        p = f"videos/{key}/"
        return {p + "chunk_index": self.rot.chunk, p + "file_index": self.rot.file, p + "from_timestamp": from_ts,
                p + "to_timestamp": float(self.t_pts * self.tb)}

    def _open(self, in_stream) -> None:
        rel = self.ex.video_path.format(video_key=self.key, chunk_index=self.rot.chunk, file_index=self.rot.file)
        path = self.ex.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self.out = av.open(str(path), "w", format="mp4", options={"movflags": "faststart"})
        self.stream = self.out.add_stream_from_template(in_stream, opaque=True)
        self.stream.time_base = in_stream.time_base
        self.out.start_encoding()
        self.tb = Fraction(self.stream.time_base)
        self.t_pts, self.bytes, self.last_dts = 0, 0, None
        self.files += 1

    def _mux(self, pkt, pts: int, dts: int | None) -> None:
        dts = pts if dts is None else dts
        if self.last_dts is not None and dts <= self.last_dts:
            dts = self.last_dts + 1
        dts = min(dts, pts)
        pkt.stream = self.stream
        pkt.time_base = self.stream.time_base
        pkt.pts, pkt.dts = pts, dts
        self.out.mux(pkt)
        self.last_dts = dts

    def _remux(self, inp, in_stream, index: video_index.FrameIndex, ra: int, rb: int, out_pts) -> tuple[bool, int]:
        """Copy the packets of frames ra..rb (ra is a keyframe). False if decode order crosses the cut."""
        lo, hi = int(index.pts[ra]), int(index.pts[rb])
        frame_dur = int(round(Fraction(1) / Fraction(self.ex.fps) / Fraction(index.time_base)))
        try:
            inp.seek(lo, stream=in_stream, backward=True, any_frame=False)
            pkts, seen_after = [], False
            for pkt in inp.demux(in_stream):
                if pkt.pts is None:
                    continue
                if pkt.pts > hi:
                    if pkt.is_keyframe:
                        break
                    seen_after = True
                    continue
                if pkt.pts < lo:
                    continue
                if seen_after:
                    return False, 0
                pkts.append(pkt)
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"{index.path}: demuxing failed near pts={lo} ({e}); the file may be corrupt") \
                from e
        if len(pkts) != rb - ra + 1:
            raise VideoDecodeError(f"{index.path}: expected {rb - ra + 1} packets between pts {lo} and {hi}, found "
                                   f"{len(pkts)}; the file may be corrupt")
        end = 0
        for pkt in pkts:
            p, d = out_pts(pkt.pts), None if pkt.dts is None else out_pts(pkt.dts)
            end = max(end, out_pts(pkt.pts + int(pkt.duration or frame_dur)))
            self._mux(pkt, p, d)
        return True, end

    def _encode(self, inp, in_stream, index: video_index.FrameIndex, ra: int, rb: int, out_pts) -> int:
        """Decode frames ra..rb and encode them as a new GOP with info.json's encoder settings."""
        lo, hi = int(index.pts[ra]), int(index.pts[rb])
        frames = []
        try:
            inp.seek(int(index.keyframe_pts[ra]), stream=in_stream, backward=True, any_frame=False)
            for fr in inp.decode(in_stream):
                if fr.pts is None or fr.pts < lo:
                    continue
                if fr.pts > hi:
                    break
                frames.append(fr)
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"{index.path}: decoding failed near pts={lo} ({e})") from e
        if len(frames) != rb - ra + 1:
            raise VideoDecodeError(f"{index.path}: decoded {len(frames)} frames between pts {lo} and {hi}, expected "
                                   f"{rb - ra + 1}; the file may be corrupt")
        src_pts = [int(f.pts) for f in frames]
        cc = self._encoder(frames[0])
        enc_tb = Fraction(1, int(round(self.ex.fps))) if float(self.ex.fps).is_integer() else \
            Fraction(self.ex.fps).limit_denominator(1001) ** -1
        packets = []
        for j, fr in enumerate(frames):
            f = fr.reformat(format=cc.pix_fmt) if fr.format.name != cc.pix_fmt else fr
            f.pts, f.time_base = j, enc_tb
            packets += cc.encode(f)
        packets += cc.encode(None)
        frame_dur = int(round(enc_tb / self.tb))
        end = 0
        base = out_pts(src_pts[0])
        for pkt in packets:
            j = int(pkt.pts)
            p = out_pts(src_pts[j]) if 0 <= j < len(src_pts) else base + int(round(j * enc_tb / self.tb))
            d = None if pkt.dts is None else base + int(round(int(pkt.dts) * enc_tb / self.tb))
            if cc.name in ("libx264", "libx265"):
                pkt = av.Packet(_annexb_to_length_prefixed(bytes(pkt)))
                pkt.is_keyframe = j == 0
            self._mux(pkt, p, d)
            end = max(end, p + frame_dur)
        return end

    def _encoder(self, frame):
        info = self.feat_info
        codec = info.get("video.codec") or self.stream.codec_context.name
        name = ENCODERS.get(codec, codec)
        opts = {"g": str(info.get("video.g") or 2), "crf": str(info.get("video.crf") or 30)}
        preset = info.get("video.preset")
        if name == "libsvtav1":
            opts["preset"] = str(12 if preset is None else preset)
        elif preset is not None:
            opts["preset"] = str(preset)
        if info.get("video.fast_decode"):
            opts["svtav1-params" if name == "libsvtav1" else "tune"] = \
                f"fast-decode={info['video.fast_decode']}" if name == "libsvtav1" else "fastdecode"
        for k, v in (info.get("video.extra_options") or {}).items():
            opts.setdefault(str(k), str(v))
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its config banner per encoder otherwise
        try:
            cc = av.CodecContext.create(name, "w")
        except (av.error.FFmpegError, ValueError) as e:
            raise VideoDecodeError(f"camera {self.key!r}: no {name!r} encoder in this PyAV build to re-encode a "
                                   "mid-GOP cut; cut windows on keyframes (even frame_index) or install it") from e
        cc.width, cc.height = frame.width, frame.height
        cc.pix_fmt = info.get("video.pix_fmt") or "yuv420p"
        fps = Fraction(self.ex.fps).limit_denominator(1001)
        cc.time_base, cc.framerate = 1 / fps, fps
        cc.options = opts
        cc.open()
        return cc

    def _close_file(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = self.stream = None

    def close(self) -> None:
        self._close_file()
        for c in self.inputs.values():
            c.close()
        self.inputs.clear()


# ---- helpers ----------------------------------------------------------------------------------------------------
def _v2_info_to_v3(info: dict) -> None:
    """A v2.x info.json rewritten in place as lerobot 0.4.4's converter (``convert_info``) writes v3.0."""
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


def _plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with list fields renamed to Arrow's default and string views/large types made plain, as pyarrow and
    lerobot write meta/episodes (DuckDB names list children ``l``)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) \
            or pa.types.is_large_list_view(t):
        return pa.list_(_plain_type(t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_plain_type(t.value_type), t.list_size)
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def _annexb_to_length_prefixed(data: bytes) -> bytes:
    """H.264/H.265 Annex B (start codes) -> the 4-byte length-prefixed NAL units an mp4 track holds."""
    out, i, n = bytearray(), 0, len(data)
    starts = []
    while i < n - 2:
        if data[i] == 0 and data[i + 1] == 0 and data[i + 2] == 1:
            starts.append(i + 3)
            i += 3
        else:
            i += 1
    for s, nxt in zip(starts, starts[1:] + [n + 3]):
        end = nxt - 3
        while end > s and data[end - 1] == 0:  # trailing zero of a 4-byte start code
            end -= 1
        nal = data[s:end]
        out += len(nal).to_bytes(4, "big") + nal
    return bytes(out) if starts else data


def _numeric(column: pa.ChunkedArray) -> np.ndarray:
    """(N, *shape) float64 of a numeric or (fixed-size) list column."""
    arr = column.combine_chunks()
    depth = []
    while pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type) or pa.types.is_large_list(arr.type):
        depth.append(len(arr))
        arr = arr.flatten()
    flat = arr.to_numpy(zero_copy_only=False).astype(np.float64)
    if not depth:
        return flat
    return flat.reshape(depth[0], -1)


def _sample_indices(n: int) -> np.ndarray:
    """lerobot's compute_stats.sample_indices: evenly spaced frames used for image stats."""
    k = n if n < 100 else max(100, min(int(n ** 0.75), 10_000))
    return np.round(np.linspace(0, n - 1, k)).astype(int)


def _downsample(img: np.ndarray, target: int = 150, threshold: int = 300) -> np.ndarray:
    """lerobot's auto_downsample_height_width for a CHW image."""
    _, h, w = img.shape
    if max(w, h) < threshold:
        return img
    f = int(w / target) if w > h else int(h / target)
    return img[:, ::f, ::f]


def _feature_stats(x: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """lerobot's get_feature_stats for (N, D) data: min, max, mean, std, count, histogram quantiles q01..q99."""
    n = len(x)
    mn, mx, mean = x.min(0), x.max(0), x.mean(0)
    if n < 2:
        st = {"min": mn, "max": mx, "mean": mean, "std": x.std(0)}
        st.update({_qkey(q): mean.copy() for q in QUANTILES})
    else:
        st = {"min": mn, "max": mx, "mean": mean, "std": np.sqrt(np.maximum(0, (x ** 2).mean(0) - mean ** 2))}
        qs = np.empty((len(QUANTILES), x.shape[1]))
        for d in range(x.shape[1]):
            edges = np.linspace(mn[d] - 1e-10, mx[d] + 1e-10, 5001)
            qs[:, d] = _hist_quantiles(np.histogram(x[:, d], bins=edges)[0], edges, n)
        st.update({_qkey(q): qs[qi] for qi, q in enumerate(QUANTILES)})
    shape = tuple(shape) if int(np.prod(shape)) == x.shape[1] else (x.shape[1],)
    out = {k: v.reshape(shape) for k, v in st.items()}
    out["count"] = np.array([n], np.int64)
    return out


def _hist_quantiles(hist: np.ndarray, edges: np.ndarray, n: int) -> np.ndarray:
    """lerobot's RunningQuantileStats._compute_single_quantile for each of QUANTILES."""
    cum = np.cumsum(hist)
    out = np.empty(len(QUANTILES))
    for qi, q in enumerate(QUANTILES):
        target = q * n
        i = int(np.searchsorted(cum, target))
        if i == 0:
            out[qi] = edges[0]
        elif i >= len(cum):
            out[qi] = edges[-1]
        else:
            before, inbin = cum[i - 1], cum[i] - cum[i - 1]
            out[qi] = edges[i] if inbin == 0 else edges[i] + (target - before) / inbin * (edges[i + 1] - edges[i])
    return out


def _image_stats(imgs: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats of (N, C, H, W) uint8 images, scaled to [0, 1], shaped (C, 1, 1), count = N images.

    Same numbers as lerobot's get_feature_stats over axis (0, 2, 3), computed from 256-value pixel counts (the
    histogram of uint8 data is exact from its value counts) instead of sorting millions of pixels.
    """
    c = imgs.shape[1]
    v = np.arange(256, dtype=np.float64)
    st = {k: np.empty(c) for k in ("min", "max", "mean", "std", *map(_qkey, QUANTILES))}
    for ch in range(c):
        cnt = np.bincount(imgs[:, ch].ravel(), minlength=256).astype(np.float64)
        n = cnt.sum()
        nz = np.flatnonzero(cnt)
        mn, mx = v[nz[0]], v[nz[-1]]
        mean = (v * cnt).sum() / n
        st["min"][ch], st["max"][ch], st["mean"][ch] = mn, mx, mean
        st["std"][ch] = np.sqrt(max(0.0, (v * v * cnt).sum() / n - mean ** 2))
        if n < 2:
            qs = np.full(len(QUANTILES), mean)
        else:
            edges = np.linspace(mn - 1e-10, mx + 1e-10, 5001)
            b = np.clip(np.searchsorted(edges, v[nz], side="right") - 1, 0, 4999)
            qs = _hist_quantiles(np.bincount(b, weights=cnt[nz], minlength=5000), edges, int(n))
        for qi, q in enumerate(QUANTILES):
            st[_qkey(q)][ch] = qs[qi]
    out = {k: (x / 255.0).reshape(c, 1, 1) for k, x in st.items()}
    out["count"] = np.array([len(imgs)], np.int64)
    return out


def _qkey(q: float) -> str:
    return f"q{int(q * 100):02d}"


def _aggregate(stats: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """lerobot 0.4.4's aggregate_feature_stats: global min/max, weighted mean, pooled std, count-weighted quantiles."""
    means = np.stack([s["mean"] for s in stats]).astype(np.float64)
    var = np.stack([np.asarray(s["std"], np.float64) ** 2 for s in stats])
    counts = np.stack([np.asarray(s["count"]) for s in stats]).astype(np.float64)
    total = counts.sum(0)
    while counts.ndim < means.ndim:
        counts = counts[..., None]
    mean = (means * counts).sum(0) / total
    out = {"min": np.min(np.stack([s["min"] for s in stats]), 0), "max": np.max(np.stack([s["max"] for s in stats]), 0),
           "mean": mean, "std": np.sqrt(((var + (means - mean) ** 2) * counts).sum(0) / total),
           "count": total.astype(np.int64)}
    for q in (k for k in stats[0] if k.startswith("q") and k[1:].isdigit()):
        if all(q in s for s in stats):
            out[q] = (np.stack([s[q] for s in stats]) * counts).sum(0) / total
    return out


def _py(value: np.ndarray, typ: pa.DataType) -> Any:
    """A numpy stat as the nested Python value of Arrow type ``typ`` (list<double>, list<list<list<double>>> ...)."""
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        v = np.asarray(value)
        if v.ndim == 0:
            v = v.reshape(1)
        return [_py(x, typ.value_type) for x in v]
    v = np.asarray(value).reshape(-1)[0] if np.ndim(value) else value
    if pa.types.is_integer(typ):
        return int(v)
    if pa.types.is_boolean(typ):
        return bool(v)
    return float(v)


__all__ = ["export_dataset", "export_manifest", "ExportReport", "ManifestReport"]
