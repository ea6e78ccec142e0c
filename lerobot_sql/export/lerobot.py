"""The LeRobot v3.0 export driver: ``export_dataset`` writes a query's frames as a new dataset, ``export_collection``
a collection's selection as one.

Export plan: the query is resolved to a manifest by ``db.manifest(sql)`` (:mod:`lerobot_sql._plan.manifest`; the same
row cap, fast path and order as ``dataset()``), cut into *parts* (one output episode each: a whole source episode
or a window, told apart by ``result_row``, or a contiguous run of ``index`` rows of one episode), and each part is
written in order (:mod:`.parts` cuts them; the writers are :mod:`.data_writer` and :mod:`.video_writer`, the
meta/episodes' statistics columns :mod:`.episode_stats`):

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

Several datasets (``export_collection``, ``Collection.export``): the same driver over a collection's manifest. Each
selected dataset is an :class:`~lerobot_sql.export.target.ExportSource` (its Database, its name, its source-key ->
output-key map), each part names its source, and the writers read that source's files and column names; tasks are
merged by text, and meta/episodes gains ``source_dataset`` / ``source_episode_index``. What one dataset cannot hold (two fps, two
robot_types, a camera's videos of two codecs, resolutions or pixel formats) is refused before any write.

Everything is written into a hidden sibling folder and renamed into place at the end, so the destination appears
complete or not at all. ``meta/lerobot_sql_export.json`` marks the folder as ours and lists the files written: an
overwrite replaces only an empty folder or such an export, and no destination may be the source, lie inside it or
hold it (symlinks resolved; :mod:`.destination`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._format import stats_json, v2
from .._plan.manifest import Meta, collection_meta, dataset_codes
from .._readers import decode, locate, regrid, video_index
from ..errors import DatasetFormatError, IncompatibleDatasetsError, ResultContractError, warn
from . import destination, episode_stats
from .data_writer import DataWriter
from .parts import Part, Rotator, cut_parts
from .target import ExportSource, ExportTarget
from .video_encoder import EncodingVideoWriter
from .video_writer import VideoWriter, source_rows

EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_POINTERS = ("meta/episodes/chunk_index", "meta/episodes/file_index")
INDEX_COLUMNS = ("index", "episode_index", "task_index")  # renumbered on export, so their stats are recomputed


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


def export_dataset(db, sql: str, dest: str | os.PathLike, *, overwrite: bool = False, progress: bool = True,
                   tolerance_s: float = 1e-4, align: str = "timestamp", fps: int | None = None) -> ExportReport:
    """Write the frames ``sql`` selects as a new LeRobot v3.0 dataset at ``dest`` (a local folder).

    ``sql`` follows the dataset() contract (see :mod:`lerobot_sql._plan.contract`): ``episode_index`` rows export whole
    episodes, ``(episode_index, start_s, end_s)`` rows export one episode per window (frame_index and timestamp
    restart at 0), ``index`` rows export each contiguous run of frames of one episode as an episode. Output episodes
    follow the result order (for a query without ORDER BY, the order dataset() gives it: sorted by the contract
    columns) and are numbered 0..N-1; ``index`` is contiguous; tasks still used are renumbered in
    source order. Extra result columns are not written.

    The dataset is written into a hidden sibling folder and renamed into place, with ``meta/lerobot_sql_export.json``
    listing every file written (name and size), so that a later ``overwrite=True`` can tell an export of ours from
    anything else.

    Args:
        overwrite: replace an existing ``dest`` (only once the new dataset is complete), and only if it is a
            dataset this function exported, holding only the files it wrote. Any other folder (the source, one that
            holds it, a dataset written by another tool, a folder with files of the user's) is refused. An empty
            folder is written into either way.
        progress: show a tqdm bar.
        tolerance_s: how far a data timestamp may be from its video frame's pts (as in dataset()).
        align: how each row's camera frame is found, as in dataset(): ``"timestamp"`` (default) or
            ``"frame_index"`` (the row's frame_index-th frame of its episode's clip, for wall-clock timestamps over
            clips on the fps grid); with ``"frame_index"`` the copy's timestamps are written as frame_index / fps,
            the time of each frame in its new video, so the copy reads with the default options.
        fps: write the selection as a recording at this lower frame rate (a whole number dividing the source's
            fps; the rule: :mod:`lerobot_sql._readers.regrid`, as ``db.dataset(sql, fps=fps)`` serves it): every
            k-th frame of each episode, ``k = source fps / fps``, frame_index / timestamp / index renumbered at the
            new rate, statistics recomputed, info.json's ``fps`` and each camera's ``video.fps`` the new rate. Every
            kept camera frame is decoded and encoded again, losslessly (:mod:`.video_encoder`: RGB cameras as
            lossless H.264, so info.json's ``video.codec`` becomes ``h264``; depth maps with their own lossless
            settings), so the copy's items equal the selection's at that rate bit for bit.

    Returns:
        :class:`ExportReport` (episodes, frames, files written, frames re-encoded, seconds).

    Raises:
        QueryError / ResultContractError: the SQL or its result is unusable.
        DestinationExistsError (a FileExistsError): ``dest`` exists, is not an empty folder and ``overwrite`` is
            False, or it is not an empty folder or an unchanged export of ours.
        DestinationError (an OSError): ``dest`` is the source, inside it or holds it; a dangling symlink; a parent is
            a file; the disk is full or read-only (nothing is left at ``dest``).
        FrameNotFoundError: a selected frame has no video frame within ``tolerance_s``.
        DatasetFormatError / VideoDecodeError / MissingFileError: the source dataset is inconsistent or unreadable.
        TypeError / ValueError: ``tolerance_s`` is not a number, or not a finite number > 0; ``align`` is not
            "timestamp" or "frame_index"; ``fps`` is not a number, is above the source's, or does not divide it
            (naming the rates that work).
    """
    t0 = time.perf_counter()
    tolerance_s = locate.check_tolerance(tolerance_s)  # before the query runs, not deep in the first video part
    align = locate.check_align(align)
    stride = 1 if fps is None else regrid.stride(fps, db.layout.fps)
    dest = destination.check_dest([db], dest, overwrite)
    # db.manifest, as dataset() resolves the same SQL: the row cap, the pointer fast path for whole episodes, and
    # a deterministic order for a query without ORDER BY. Each sample's result_row says which output episode
    # (window, whole episode) it belongs to.
    # no extras: a list of text or a NULL list is no error; the tolerance too, as dataset() resolves with it (without
    # it the timestamps check refused asking for the very tolerance_s the caller gave)
    manifest = db.manifest(sql, extras=False, align=align, tolerance_s=tolerance_s)
    mode = Meta.of(manifest).mode
    manifest = regrid.on_grid(manifest, stride, mode, "the query")  # (another frame rate: its frames on the grid)
    parts = cut_parts(manifest, mode, stride=stride)
    return _write(dest, [ExportSource(db, align=align, clips=Meta.of(manifest).clips)], manifest, parts,
                  tolerance_s, progress, t0, overwrite=overwrite,
                  fps=None if stride == 1 else int(fps))


def export_collection(coll, manifest: pa.Table, dest: str | os.PathLike, *, present: list[str],
                      keymaps: dict[str, dict[str, str]], keys: set[str], overwrite: bool = False,
                      progress: bool = True, tolerance_s: float = 1e-4,
                      aligns: dict[str, str] | None = None) -> ExportReport:
    """Write a collection manifest's frames (``Collection.manifest``) as one new LeRobot v3.0 dataset at ``dest``.

    ``present`` are the datasets with samples, ``keymaps`` each one's ``{source feature key: output key}`` and
    ``keys`` the feature keys kept, as ``mixture.line_up`` checked them (``Collection.export`` passes them). Output
    episodes follow the manifest's order, numbered 0..N-1 across datasets; each is cut as :func:`export_dataset`
    cuts one dataset's (whole episodes, windows, runs of ``index`` rows). Tasks are merged by text (one
    ``task_index`` per distinct text, in order of first use: datasets in ``present`` order, each in its own
    task_index order). meta/episodes gains ``source_dataset`` (string, the name) and ``source_episode_index``
    (int64, the episode's index in that dataset). info.json is the first dataset's, with the kept features
    (renamed) and the new totals. Video packets are copied; a new mp4 is started where the source stream's codec
    header (extradata) differs from the one the current file was opened with, so every file stays one stream.
    ``aligns``: each dataset's ``align`` (:func:`lerobot_sql._readers.locate.check_align`; default ``"timestamp"``).

    Raises:
        IncompatibleDatasetsError: the datasets' fps or robot_type differ; a kept camera is a video in one and an
            image in another; a camera's videos differ in codec, resolution or pixel format (naming the datasets,
            the key and both values).
        and everything :func:`export_dataset` raises.
    """
    t0 = time.perf_counter()
    tolerance_s = locate.check_tolerance(tolerance_s)
    # every dataset of the collection, not only those with samples: an export must never write into, nor replace,
    # a dataset the open collection reads
    dest = destination.check_dest([coll[n] for n in coll.names], dest, overwrite)
    codes_of = {n: coll.names.index(n) for n in present}
    sources = [ExportSource(coll[n], n, codes_of[n], {**{k: k for k in coll[n].layout.features if k not in keymaps[n]},
                                                 **{k: v for k, v in keymaps[n].items() if v in keys}},
                      align=locate.check_align((aligns or {}).get(n, "timestamp")),
                      clips=json.loads(collection_meta(manifest)["manifests"][n]).get("clips") or {})
               for n in present]
    codes = dataset_codes(manifest, coll.names)
    lookup = np.full(len(coll.names), -1, np.int64)  # dataset code -> position in sources
    lookup[[s.code for s in sources]] = np.arange(len(sources))
    src_of_row = lookup[codes.astype(np.int64)]
    _check_compatible(sources, manifest, src_of_row)
    # One query, one contract: every dataset's part of the manifest has the same mode.
    meta = collection_meta(manifest)
    modes = {json.loads(v).get("mode") for n, v in meta["manifests"].items() if n in present}
    if len(modes) != 1:
        raise ResultContractError(f"the collection manifest mixes result contracts {sorted(map(str, modes))}; "
                                  "export one query's manifest (Collection.manifest(sql))")
    parts = cut_parts(manifest, modes.pop(), src_of_row)
    return _write(dest, sources, manifest, parts, tolerance_s, progress, t0, codes=src_of_row, overwrite=overwrite)


def _write(dest: Path, sources: list[ExportSource], manifest: pa.Table, parts: list[Part], tolerance_s: float,
           progress: bool, t0: float, codes: np.ndarray | None = None, overwrite: bool = False,
           fps: int | None = None) -> ExportReport:
    """Run the export into a staging folder that is moved into place at the end
    (:func:`lerobot_sql.export.destination.write_folder`), its marker naming the sources; ``fps``: the lower
    frame rate the parts are written at (None: the source's)."""
    names = {s.name: s.db.source.url for s in sources} if sources[0].name is not None else None
    report = destination.write_folder(
        dest, lambda tmp: Exporter(sources, manifest, parts, tmp, tolerance_s, codes, fps).run(progress),
        overwrite=overwrite, source=sources[0].db.source.url, sources=names)
    report.dest = str(dest)
    report.files_written = sum(1 for p in dest.rglob("*") if p.is_file())
    report.seconds = time.perf_counter() - t0
    return report


def _check_compatible(sources: list[ExportSource], manifest: pa.Table, src_of_row: np.ndarray) -> None:
    """Refuse what one dataset cannot hold: several fps or robot_types, a camera that is a video in one source and
    an image in another, or whose videos differ in codec, resolution or pixel format (probed from each source's
    first selected mp4 of that camera: the stream is what a remux copies, whatever info.json says).
    ``src_of_row``: each manifest row's position in ``sources``.

    Raises:
        IncompatibleDatasetsError: naming the datasets, the key and the values.
    """
    def refuse(what: str, values: dict[str, Any], fix: str) -> None:
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            shown = ", ".join(f"{n}: {v}" for n, v in values.items())
            raise IncompatibleDatasetsError(f"cannot export these datasets as one dataset: {what} differs ({shown});"
                                            f" {fix}")

    refuse("fps", {s.name: s.layout.fps for s in sources},
           "a LeRobot dataset has one fps: export the datasets of each fps separately (add a WHERE dataset IN (...))")
    refuse("robot_type", {s.name: s.layout.info.get("robot_type") for s in sources},
           "a LeRobot dataset has one robot_type: export each robot's datasets separately")
    first = sources[0]
    outs = [first.out(k) for k in first.layout.features]
    for key in [k for k in outs if k is not None]:
        kinds = {s.name: s.layout.features[s.src_key(key)].dtype for s in sources}
        if not any(d in ("video", "image") for d in kinds.values()):
            continue
        refuse(f"how camera {key!r} is stored", kinds, "pass features=[...] without it, or export the datasets of "
               "each kind separately")
        if kinds[first.name] != "video":
            continue
        sig = {}
        for si, s in enumerate(sources):
            rel = manifest[f"{s.src_key(key)}/file"][int(np.flatnonzero(src_of_row == si)[0])].as_py()
            with video_index.open_container(s.src, rel) as c:
                cc = c.streams.video[0].codec_context
                # the codec's name, not its decoder's (libdav1d decodes av1)
                codec = getattr(cc.codec, "canonical_name", None) or cc.name
                sig[s.name] = {"codec": codec, "resolution": f"{cc.width}x{cc.height}",
                               "pix_fmt": cc.format.name if cc.format is not None else cc.pix_fmt}
        for field in ("codec", "resolution", "pix_fmt"):
            refuse(f"the {field} of camera {key!r}", {n: v[field] for n, v in sig.items()},
                   "its videos cannot be stream-copied into one track: re-encode one dataset's videos to match, "
                   "pass features=[...] without this camera, or export the datasets separately")


class Exporter:
    """One export run into the folder ``root``: reads the sources' metadata, drives the writers part by part, and
    writes meta/. Every file is written in place, as the whole folder is renamed into place at the end
    (:func:`export_dataset`), so no single file needs ``atomic_write``. The writers take the target
    (:class:`~lerobot_sql.export.target.ExportTarget`: where and how files are written, the frame counts they add
    to), the sources (a part's ``source`` indexes them), and the video writer the manifest (``m``: one dataset's,
    or a collection's with every source's rows) and ``tolerance_s``. Output settings (chunks_size, file sizes, path
    templates, info.json) are the first source's; ``fps``: a lower frame rate the parts are written at (every
    ``part.stride``-th frame; videos re-encoded by :class:`~lerobot_sql.export.video_encoder.EncodingVideoWriter`).
    """

    def __init__(self, sources: list[ExportSource], manifest: pa.Table, parts: list[Part], root: Path,
                 tolerance_s: float, codes: np.ndarray | None = None, fps: int | None = None):
        self.sources = sources
        first = sources[0]
        self.db, self.src, self.layout = first.db, first.src, first.layout
        self.m, self.parts, self.tol = manifest, parts, tolerance_s
        # codes: each manifest row's source (None: every row is the one source's)
        self.codes = np.zeros(manifest.num_rows, np.int64) if codes is None else codes
        self.features = {first.out(k): f for k, f in self.layout.features.items() if first.out(k) is not None}
        self.video_keys = [k for k, f in self.features.items() if f.is_video]
        self.target = ExportTarget.of(self.layout, root)
        self.fps = fps
        if fps is not None:
            self.target.fps = fps

    # ---- driver -------------------------------------------------------------------------------------------
    def run(self, progress: bool) -> ExportReport:
        """Write every part, then meta/; returns the report (``dest``, ``files_written`` and ``seconds`` are filled
        in by :func:`export_dataset`)."""
        from tqdm.auto import tqdm

        self._load_episodes()
        self._tasks()
        self.data = DataWriter(self.target, self.sources)
        self.videos = {k: VideoWriter(self.target, k, self.features[k].info, self.sources, self.m, self.tol)
                       if self.fps is None else
                       EncodingVideoWriter(self.target, k, self.features[k].info, self.sources, self.m, self.tol,
                                           depth=self.features[k].is_depth_map)
                       for k in self.video_keys}
        for si, s in enumerate(self.sources):
            # depth mp4s decode to their 12-bit codes (gray12le), never RGB; self.codes holds each row's position
            # in self.sources (not the dataset's code in the collection, s.code)
            depth = [k for k in s.layout.video_keys if s.layout.features[k].is_depth_map
                     and f"{k}/file" in self.m.column_names]
            rows = self.m.filter(pa.array(self.codes == si)) if depth else None
            s.decoders = decode.DecoderPool(s.src, max_open=4, gray={
                rel for k in depth for rel in pc.unique(rows[f"{k}/file"]).drop_null().to_pylist()})
        self.depth_recomputed: dict[str, int] = {}  # depth video key -> output episodes whose stats were recomputed
        rows, ep_stats = [], []
        next_index = 0
        try:
            bar = tqdm(self.parts, desc="export", unit="episode", disable=not progress or len(self.parts) < 2)
            for new_ep, part in enumerate(bar):
                s = self.sources[part.source]
                table = self.data.write(part, new_ep, next_index)
                row = {}
                for col, v in s.src_rows[part.src_episode].items():
                    name = s.column(col)
                    if name is not None:
                        row[name] = v
                row.update({"episode_index": new_ep, "length": part.length,
                            "dataset_from_index": next_index, "dataset_to_index": next_index + part.length,
                            "data/chunk_index": self.data.rot.chunk, "data/file_index": self.data.rot.file,
                            "tasks": [self.new_tasks[t] for t in np.unique(table["task_index"].to_numpy())]})
                if s.name is not None:  # a collection's export: where the episode comes from
                    row.update({"source_dataset": s.name, "source_episode_index": part.src_episode})
                for w in self.videos.values():
                    row.update(w.write(part))
                part_stats = self._episode_stats(part, table)
                for (feat, stat), col in self.stat_cols.items():
                    if feat in part_stats and stat in part_stats[feat]:
                        row[col] = part_stats[feat][stat]
                rows.append(row)
                ep_stats.append(part_stats)
                next_index += part.length
        finally:
            # Every writer and reader is closed even if one fails (a full disk fails the data footer first): one
            # left open was closed by the garbage collector after the staging folder was removed.
            with contextlib.ExitStack() as stack:
                for s in self.sources:
                    if getattr(s, "decoders", None) is not None:
                        stack.callback(s.decoders.close)
                for w in self.videos.values():
                    stack.callback(w.close)
                stack.callback(self.data.close)
        if self.depth_recomputed:
            warn(
                f"export: statistics of depth video(s) {self.depth_recomputed} (camera: episodes) were recomputed "
                "from the 12-bit quantized frames, dequantized to info.depth_unit; lerobot computed the source's "
                "from the raw frames, which the mp4 no longer holds, so min/max/mean/quantiles differ by up to one "
                "quantization step (whole source episodes keep lerobot's numbers)")
        self._write_episodes(rows)
        self._write_stats(ep_stats)
        self._write_info(len(self.parts), next_index)
        return ExportReport("", len(self.parts), next_index, len(self.new_tasks), 0, self.data.files,
                            sum(w.files for w in self.videos.values()), self.target.frames_reencoded,
                            self.target.frames_remuxed,
                            0.0)

    # ---- metadata in --------------------------------------------------------------------------------------
    def _load_episodes(self) -> None:
        """Each source's episode rows and the output meta/episodes schema, from the catalog's ``_episodes_raw``.

        ``_episodes_raw`` has the same columns for v3.x (meta/episodes/*.parquet) and v2.x (episodes.jsonl and
        episodes_stats.jsonl), so export never parses the metadata files itself. The output schema is the first
        source's (columns renamed with their features), then the columns only later sources have; a collection's
        export adds ``source_dataset`` and ``source_episode_index``.
        """
        fields: dict[str, pa.Field] = {}
        meta = None
        for si, s in enumerate(self.sources):
            ep = s.db.con.sql("SELECT * FROM _episodes_raw").to_arrow_table()
            schema = self._episodes_schema(s, ep.schema)
            meta = meta if si else schema.metadata
            for fld in schema:
                name = s.column(fld.name)
                if name is not None and name not in fields:
                    fields[name] = fld.with_name(name)
            want = sorted(set(int(p.src_episode) for p in self.parts if p.source == si))
            sub = ep.filter(pc.is_in(ep["episode_index"], pa.array(want, pa.int64()))).to_pylist()
            s.src_rows = {int(r["episode_index"]): r for r in sub}
            missing = set(want) - set(s.src_rows)
            if missing:
                where = s.layout.episode_files[0] if s.layout.episode_files else "meta/episodes"
                raise DatasetFormatError(f"{s.src.path(where)}: no row for episode(s) {sorted(missing)[:5]}; run "
                                         "`lerobot-sql doctor`")
            s.stat_cols = {}
            for name in ep.column_names:
                if name.startswith("stats/"):
                    feat, _, stat = name[len("stats/"):].rpartition("/")
                    s.stat_cols[(feat, stat)] = name
        # A camera whose source has no per-episode statistics (v2.1 without episodes_stats.jsonl, meta/episodes
        # without its stats/ columns) gets them computed from its frames (_episode_stats), as lerobot's writer
        # computes them: without columns for them its episodes and stats.json would have none, and lerobot-train
        # would leave that camera un-normalised. The types are lerobot's ((C, 1, 1) nested lists, count a list).
        image = pa.list_(pa.list_(pa.list_(pa.float64())))
        for s in self.sources:
            for src_name, feat in s.layout.features.items():
                name = s.out(src_name)
                if name is None or not (feat.is_video or feat.is_image) or f"stats/{name}/mean" in fields:
                    continue
                for st in ("min", "max", "mean", "std", *map(stats_json.qkey, stats_json.QUANTILES)):
                    fields[f"stats/{name}/{st}"] = pa.field(f"stats/{name}/{st}", image)
                fields[f"stats/{name}/count"] = pa.field(f"stats/{name}/count", pa.list_(pa.int64()))
        if self.sources[0].name is not None:
            fields["source_dataset"] = pa.field("source_dataset", pa.string())
            fields["source_episode_index"] = pa.field("source_episode_index", pa.int64())
        self.ep_schema = pa.schema(list(fields.values()), metadata=meta)
        # Output stat columns, keyed by output feature.
        self.stat_cols: dict[tuple[str, str], str] = {}
        for name in self.ep_schema.names:
            if name.startswith("stats/"):
                feat, _, stat = name[len("stats/"):].rpartition("/")
                self.stat_cols[(feat, stat)] = name
        self.stat_types = {name: self.ep_schema.field(name).type for name in self.stat_cols.values()}

    def _episodes_schema(self, s: ExportSource, raw: pa.Schema) -> pa.Schema:
        """Columns of ``_episodes_raw`` plus the meta/episodes pointers. A v3 source keeps the exact types and the
        schema metadata of its first meta/episodes file (only its footer is read); other columns (all of them for
        v2.x) get plain Arrow types (list<double>, string)."""
        ref: dict[str, pa.DataType] = {}
        meta = None
        if not s.layout.legacy and s.layout.episode_files:
            with s.src.open(s.layout.episode_files[0]) as f:
                first = pq.read_schema(f)
            ref, meta = {fld.name: fld.type for fld in first}, first.metadata
        fields = [pa.field(fld.name, ref.get(fld.name) or _plain_type(fld.type)) for fld in raw]
        fields += [pa.field(c, pa.int64()) for c in EPISODES_POINTERS if c not in raw.names]
        return pa.schema(fields, metadata=meta)

    def _tasks(self) -> None:
        """Output tasks: one task_index per distinct text, numbered in order of first use (sources in order, each
        in its task_index order); each source's ``task_map``."""
        task_index = self.m["task_index"].to_numpy()
        by_text: dict[str, int] = {}
        self.new_tasks = {}
        for si, s in enumerate(self.sources):
            used = np.unique(task_index[self.codes == si])
            texts = dict(s.db.con.sql("SELECT task_index, task FROM tasks").fetchall())
            absent = [int(t) for t in used if int(t) not in texts]
            if absent:
                raise DatasetFormatError(f"{s.src.path(s.layout.tasks_file or 'meta/tasks.parquet')}: no task_index "
                                         f"{absent[:5]}, used by the selected frames; run `lerobot-sql doctor`")
            s.task_map = np.full(int(used.max()) + 1 if len(used) else 1, -1, np.int64)
            for t in used:
                text = texts[int(t)]
                if text not in by_text:
                    by_text[text] = len(by_text)
                    self.new_tasks[by_text[text]] = text
                s.task_map[int(t)] = by_text[text]
        self.task_map = self.sources[0].task_map

    # ---- stats --------------------------------------------------------------------------------------------
    def _episode_stats(self, part: Part, table: pa.Table) -> dict[str, dict[str, np.ndarray]]:
        """Per-feature stats of one output episode (output keys): copied from the source for whole episodes, else
        recomputed."""
        s = self.sources[part.source]
        copied = self._source_stats(s, part.src_episode) if part.whole else {}
        out: dict[str, dict[str, np.ndarray]] = {}
        for src_name, feat in s.layout.features.items():
            name = s.out(src_name)
            if name is None or feat.dtype in ("string", "language"):
                continue
            if name in copied and name not in INDEX_COLUMNS and copied[name]:
                out[name] = copied[name]
                continue
            if feat.is_video:
                if (name, "mean") in self.stat_cols or not self.stat_cols:
                    if feat.is_depth_map:
                        codes = self._video_samples(name, part)
                        out[name] = stats_json.depth_stats(stats_json.dequantize_depth(
                            codes, feat.depth_quantization, feat.depth_unit or "mm"))
                        self.depth_recomputed[name] = self.depth_recomputed.get(name, 0) + 1
                    else:
                        out[name] = stats_json.image_stats(self._video_samples(name, part))
            elif feat.is_image:
                if name in table.column_names and ((name, "mean") in self.stat_cols or not self.stat_cols):
                    if feat.is_depth_map:  # the raw values (lossless TIFF): lerobot's numbers
                        out[name] = stats_json.depth_stats(self._png_samples(table[name], part.length, raw=True))
                    else:
                        out[name] = stats_json.image_stats(self._png_samples(table[name], part.length))
            elif name in table.column_names:
                arr = episode_stats.numeric(table[name])
                out[name] = stats_json.feature_stats(arr.reshape(len(arr), -1), feat.shape if arr.ndim > 1 else (1,))
        return out

    def _source_stats(self, s: ExportSource, episode: int) -> dict[str, dict[str, np.ndarray]]:
        """The source episode's meta/episodes stats, keyed by output feature."""
        row = s.src_rows[episode]
        out: dict[str, dict[str, np.ndarray]] = {}
        for (feat, stat), col in s.stat_cols.items():
            v = row.get(col)
            name = s.out(feat)
            if v is not None and name is not None:
                out.setdefault(name, {})[stat] = np.asarray(v)
        return out

    def _video_samples(self, key: str, part: Part) -> np.ndarray:
        s = self.sources[part.source]
        skey = s.src_key(key)
        rel = self.m[f"{skey}/file"][int(part.rows[0])].as_py()
        index = video_index.FrameIndex.load(video_index.ensure_index(s.src, rel, s.db.cache_dir))
        pick = stats_json.sample_indices(part.length)
        r = source_rows(self.m, self.tol, s, index, skey, part.rows[pick], part.src_episode)
        frames = s.decoders.decode(index, r)
        return np.stack([stats_json.downsample(frames[int(index.pts[x])].transpose(2, 0, 1)) for x in r])

    def _png_samples(self, column: pa.ChunkedArray, n: int, raw: bool = False) -> np.ndarray:
        """lerobot's sampled frames of an image column, (k, C, H, W): RGB uint8, or with ``raw`` (depth maps) the
        image's own values and dtype (lerobot's load_image_as_numpy keeps a TIFF's uint16 / float32)."""
        import io

        from PIL import Image

        imgs = []
        for i in stats_json.sample_indices(n):
            v = column[int(i)].as_py()
            img = Image.open(io.BytesIO(v["bytes"] if isinstance(v, dict) else v))
            a = np.asarray(img) if raw else np.asarray(img.convert("RGB"))
            a = a[:, :, None] if a.ndim == 2 else a
            imgs.append(stats_json.downsample(a.transpose(2, 0, 1)))
        return np.stack(imgs)

    # ---- metadata out -------------------------------------------------------------------------------------
    def _write_episodes(self, rows: list[dict]) -> None:
        rot = Rotator(self.target.chunks_size)
        for r in rows:
            for col, typ in self.stat_types.items():
                if col in r and isinstance(r[col], np.ndarray):
                    r[col] = episode_stats.to_py(r[col], typ)
        per_row = max(1, len(json.dumps(rows[0], default=str)))
        per_file = max(1, int(self.target.data_limit // per_row))
        for start in range(0, len(rows), per_file):
            chunk = rows[start:start + per_file]
            for r in chunk:
                r["meta/episodes/chunk_index"], r["meta/episodes/file_index"] = rot.chunk, rot.file
            rel = EPISODES_PATH.format(chunk_index=rot.chunk, file_index=rot.file)
            path = self.target.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(chunk, schema=self.ep_schema), path)
            rot.advance()

    def _write_stats(self, ep_stats: list[dict]) -> None:
        feats = [f for f in self.features if any(f in s for s in ep_stats)]
        agg = {}
        for f in feats:
            lst = [s[f] for s in ep_stats if f in s and {"mean", "std", "count", "min", "max"} <= set(s[f])]
            if lst:
                agg[f] = {k: v.tolist() for k, v in stats_json.aggregate(lst).items()}
        if agg:
            (self.target.root / "meta" / "stats.json").write_text(json.dumps(agg, indent=4))

    def _write_info(self, episodes: int, frames: int) -> None:
        import pandas as pd

        info = json.loads(json.dumps(self.layout.info))
        first = self.sources[0]
        if first.keys is not None:  # a collection's export: the kept features, renamed, in the first's order
            info["features"] = {first.out(k): v for k, v in info["features"].items() if first.out(k) is not None}
        if self.layout.legacy:
            v2.info_to_v3(info)
        info.update(total_episodes=episodes, total_frames=frames, total_tasks=len(self.new_tasks),
                    splits={"train": f"0:{episodes}"})
        if self.fps is not None:  # another frame rate: every fps the file holds, and the re-encoded videos' info
            info["fps"] = self.fps
            for key, f in info["features"].items():
                if "fps" in f:  # (v2.1 conversions keep one per non-video feature)
                    f["fps"] = self.fps
                if key in self.videos:
                    f["info"] = self.videos[key].info(f.get("info") or {})
        (self.target.root / "meta").mkdir(parents=True, exist_ok=True)
        (self.target.root / "meta" / "info.json").write_text(json.dumps(info, indent=4, ensure_ascii=False))
        # As lerobot 0.4.4 writes it: task text in the unnamed pandas index (__index_level_0__), task_index column.
        tasks = pd.DataFrame({"task_index": np.arange(len(self.new_tasks), dtype=np.int64)},
                             index=[self.new_tasks[i] for i in range(len(self.new_tasks))])
        tasks.to_parquet(self.target.root / "meta" / "tasks.parquet")


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
