"""The torch ``Dataset`` over a manifest: items equal to ``LeRobotDataset.__getitem__`` for the same frames.

No SQL runs here. Construction only does vectorised bookkeeping over the manifest (data-file footers, each sample's
row group and offset); the row-group caches and video indexes are built on first use, by whichever process reads the
item (DataLoader workers included), and each process opens its own memory maps and decoders (see ``_Worker``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import io
import math
import os
import socket
import tempfile
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ._readers import deltas as _frames
from ._readers import decode, locate, tabular, video_index
from ._storage.pieces import merge_ranges
from .errors import CacheError, DatasetFormatError, LeRobotSQLError, MissingFileError, as_int, warn
from ._format.files import DatasetFiles
from ._format.layout import check_item_keys
from . import meta as _meta
from . import batch_memory as _batch_memory
from . import pipeline as _pipe
from ._plan.manifest import Meta


_INHERITED: list = []  # per-process state inherited from a parent process; kept, never freed
# A forked child (a DataLoader worker) must not free what it inherited either: PyAV/FFmpeg objects of any dataset
# the parent read from own threads that exist only in the parent, and the cyclic GC would free unreachable ones in
# the child (a segfault or a hang). Everything alive at the fork is moved out of the collector's reach.
os.register_at_fork(after_in_child=gc.freeze)


@dataclasses.dataclass
class _VideoFile:
    """One camera's mp4 as a process sees it: its loaded index and the video row of each of the file's samples, or
    the error every item reading it raises (a missing file, a clip that disagrees with the frames)."""

    index: video_index.FrameIndex | None = None
    rows: np.ndarray | None = None  # int32, per sample of the file in ``_vorder`` order; -1: no frame in tolerance,
    # locate.OUTSIDE / OFF_GRID: the frame is outside the episode's clip / not the row's own (never served)
    first: np.ndarray | None = None  # int32, the same order: row of the first frame of the sample's episode's clip
    error: LeRobotSQLError | None = None


class _Worker:
    """Per-process state: row-group maps, video indexes and rows, decoders, a thread for the other cameras.

    Created lazily in the process that reads (keyed by pid), so nothing opened before a DataLoader fork (containers,
    threads) is used inside a worker. Row-group cache files and video indexes are built here on first use; the cache's
    locks make concurrent workers build each entry once.
    """

    def __init__(self, ds: "LeRobotSQLDataset"):
        self.pid = os.getpid()
        self.views: list[tabular.RowGroupView | None] = [None] * len(ds._rg_len)
        self.indexes: dict[str, video_index.FrameIndex] = {}
        self.videos: dict[tuple[str, int], _VideoFile] = {}
        self.decoders = decode.DecoderPool(ds._src, max_open=ds._max_open_decoders, threads=ds._decoder_threads,
                                          pins=ds._video_pins, declared=ds._video_declared, gray=ds._gray_files)
        n = len(ds._video_keys)
        # The calling thread decodes the last camera itself, so n - 1 helper threads are enough.
        self.pool = concurrent.futures.ThreadPoolExecutor(n - 1) if ds._use_parallel() and n > 1 else None
        self.packets: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}  # mp4 -> (byte_offset, byte_size)
        self.spans: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}  # mp4 -> every row's packet range
        self.rg_folders: dict[int, Path] = {}  # data file -> its row-group cache folder (two hashes to compute)

    def view(self, ds: "LeRobotSQLDataset", slot: int) -> tabular.RowGroupView:
        v = self.views[slot]
        if v is None:
            self.map(ds, [slot])
            v = self.views[slot]
        return v

    def map(self, ds: "LeRobotSQLDataset", slots) -> None:
        """Map the row groups ``slots`` (all of one data file), building the missing cache files in one pass."""
        todo = [int(s) for s in slots if self.views[int(s)] is None]
        if not todo:
            return
        fi = int(ds._slot_file[todo[0]])
        base = int(ds._rg_base[fi])
        paths = tabular.ensure_row_groups(ds._src, ds._infos[fi], [s - base for s in todo], ds._layout,
                                          ds._cache_dir)
        for s, path in zip(todo, paths):
            self.views[s] = tabular.RowGroupView(path, ds._layout)

    def index(self, ds: "LeRobotSQLDataset", rel: str) -> video_index.FrameIndex:
        """The index of mp4 ``rel``, built (demux, cached on disk) on first use and memory-mapped."""
        index = self.indexes.get(rel)
        if index is None:
            index = self.indexes[rel] = video_index.FrameIndex.load(
                video_index.ensure_index_arrow(ds._src, rel, ds._cache_dir, ds._video_pins.get(rel)))
        return index


# The decoder knobs' ranges. FFmpeg takes any thread count and fails only at the first decoder open, with an
# error ("Cannot allocate memory") that reads as a damaged file; a pool of 0 decoders fails at its first eviction.
DECODER_THREADS_MAX = 64
_DECODER_OPTIONS = {"decoder_threads": (0, DECODER_THREADS_MAX, "FFmpeg threads per open file; 0 lets FFmpeg "
                                        "choose, 1 (default) suits seeking"),
                    "max_open_decoders": (1, None, "open mp4s kept per process (default 16)"),
                    "seek_reach": (0, None, "frames a keyframe may lie ahead before a seek is used (default 2)")}


def check_decoder_options(decoder_threads: Any, max_open_decoders: Any, seek_reach: Any) -> tuple[int, int, int]:
    """``(decoder_threads, max_open_decoders, seek_reach)`` as ints, checked: ``decoder_threads`` in
    0..``DECODER_THREADS_MAX``, ``max_open_decoders`` >= 1, ``seek_reach`` >= 0 (Python or numpy integers).

    Raises:
        TypeError: a value is not an integer (a bool, float or string), naming the argument and the value.
        ValueError: a value is out of its range, naming the argument, the value and the range.
    """
    out = []
    for name, value in zip(_DECODER_OPTIONS, (decoder_threads, max_open_decoders, seek_reach)):
        lo, hi, what = _DECODER_OPTIONS[name]
        allowed = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
        v = as_int(value)
        if v is None:
            raise TypeError(f"{name}={value!r} ({type(value).__name__}): give {allowed} ({what})")
        if v < lo or (hi is not None and v > hi):
            raise ValueError(f"{name}={v}: give {allowed} ({what})")
        out.append(int(v))
    return out[0], out[1], out[2]


class LeRobotSQLDataset(torch.utils.data.Dataset):
    """Map-style dataset over the frames a query selected; ``len`` = number of manifest rows.

    ``ds[i]`` returns a dict, as ``LeRobotDataset.__getitem__`` (lerobot 0.4.4) does for the same frame:
      * every data-file column of the frame as tensors: ``index``, ``episode_index``, ``frame_index``,
        ``task_index`` int64 0-d, ``timestamp`` float32 0-d, vector features 1-D of their dtype (e.g.
        ``observation.state`` float32 (6,)), scalar features 0-d; keys of ``delta_timestamps`` instead hold
        ``(T, *shape)`` stacks of the clamped neighbour frames;
      * each camera (``observation.images.<camera>``): float32 (C, H, W) in [0, 1], or uint8 with
        ``return_uint8=True``; (T, C, H, W) for a camera in ``delta_timestamps`` with T > 1. Video frames are read
        from ``videos/<video_key>/...mp4`` at ``from_timestamp + timestamp`` seconds (with ``align="frame_index"``:
        the row's frame_index-th frame of its episode's clip, see ``Database.dataset``), never outside the
        episode's clip; images stored in Parquet are decoded from their PNG bytes;
      * each depth map (a camera with ``info.is_depth_map``, ``ds.meta.depth_keys``), as lerobot 0.6.1 returns
        it: float32 (1, H, W) ((T, 1, H, W) with deltas), in millimetres (whole mm, as lerobot rounds them), or
        metres with ``depth_output_unit="m"``; ``return_uint8`` and ``image_transforms`` leave depth maps alone.
        A depth video's 12-bit ``gray12le`` codes are dequantized with its ``video.depth_min`` / ``depth_max`` /
        ``shift`` / ``use_log`` (torch ops in lerobot's order, bit for bit); a depth image in Parquet (16-bit or
        float TIFF) is its values as float32, converted from its ``info.depth_unit`` to the output unit;
      * ``<key>_is_pad``: bool (T,) per ``delta_timestamps`` key, True where the offset left the episode;
      * ``task``: the task text (meta/tasks.parquet) of the frame's ``task_index``;
      * the query's extra columns under their own names: numbers as 0-d tensors of the column's Arrow dtype
        (int64 stays int64, float64 float64, HUGEINT int64; DECIMAL and NULL-holding numbers float64 with NaN),
        lists of numbers 1-D tensors of their element dtype, text as str (NULL: None); ``db.dataset`` refuses
        other types (dates, structs, bytes).

    Speed knobs (results never change): ``decoder_threads`` (FFmpeg threads per open file, default 1: best for
    seeking on few cores), ``parallel_cameras`` (decode an item's cameras in concurrent threads; ``"auto"`` does so
    for frames of at least 320x240 outside DataLoader workers, where the spare core exists), ``max_open_decoders``
    (open mp4s kept per worker), ``seek_reach`` (frames a keyframe may lie ahead before a seek beats decoding
    forward).

    Made by ``db.dataset(...)``; directly: ``LeRobotSQLDataset(files, manifest, **options)`` with ``files`` a
    :class:`~lerobot_sql._format.files.DatasetFiles` (``db.files``, or ``open_files(root)``), ``manifest`` a
    manifest of that dataset and the options of ``db.dataset``.

    Construction reads only the data files' footers: each row group's Arrow cache file and each mp4's frame index is
    built when an item first needs it, in the process reading it (so a remote dataset's first batch waits only for
    the pieces it uses). Errors in those files therefore surface from ``__getitem__``, not from the constructor; a
    missing local mp4 is still warned about at construction.

    DataLoader workers of any start method (``fork``, ``spawn``, ``forkserver``) share one copy of the per-sample
    arrays: they live in a named Arrow file under ``<cache>/manifests`` that the dataset maps, and the pickled
    dataset (what spawned workers receive) carries only its name (kilobytes, whatever the number of samples). The
    file is deleted when this dataset (and any deep copy of it) is collected, on :meth:`close`, or at exit, and
    only by the process that built it.

    Raises (from ``__getitem__``):
        FrameNotFoundError: no video frame within ``tolerance_s`` of the wanted time.
        MissingFileError: a video file the frame needs does not exist (the message names it and ``cameras=[...]``).
        DatasetFormatError: the mp4 holding the frame has a selected episode's clip (``from_timestamp`` and frame
            count) that disagrees with its real frames (raised by every item reading that mp4 and camera); the frame
            found lies outside the sample's episode's clip, or (``tolerance_s`` over half a frame) is not the row's
            own frame of a clip on the fps grid, or (``align="frame_index"``) is not at ``from_timestamp +
            frame_index / fps``: never served, the message names the mp4, camera, episode and frame_index; a data
            row group cannot be decoded or disagrees with info.json's shapes, or a data file or mp4 was replaced or
            rewritten after the dataset was opened (open it again to read the new version).
        VideoDecodeError: PyAV failed on the file.
        CacheError: the cache folder is full or not writable.
    """

    def __init__(self, files: DatasetFiles, manifest: pa.Table, *, delta_timestamps: dict[str, list[float]] | None = None,
                 tolerance_s: float = 1e-4, return_uint8: bool = False,
                 image_transforms: Callable | None = None, cameras: list[str] | None = None,
                 decoder_threads: int = 1, parallel_cameras: bool | str = "auto", max_open_decoders: int = 16,
                 seek_reach: int = 2, stats: Callable[[], dict] | None = None, depth_output_unit: str = "mm",
                 align: str = "timestamp"):
        # The task texts are read here, in the main process, before any worker starts (once per DatasetFiles).
        layout = files.layout
        self._src, self._layout, self._tasks, self._cache_dir = files.source, layout, files.tasks(), files.cache_dir
        # info.json's own value, as lerobot's ds.fps (an int in lerobot-written data); layout.fps is its float
        self.fps = layout.info.get("fps", layout.fps)
        self.tolerance_s = locate.check_tolerance(tolerance_s)
        self.align = locate.check_align(align)
        # By time, only a tolerance beyond half a frame lets a timestamp off the grid match another row's frame of a
        # clip on the grid (locate.keep_own_frame); below it, the manifest's grid check already rules that out.
        self._own_frames = self.tolerance_s > 0.5 / float(layout.fps)
        if self.align == "frame_index":
            _check_positions(manifest)
        if not isinstance(return_uint8, (bool, np.bool_)):  # "yes" or 0 would silently pick a frame dtype
            raise TypeError(f"return_uint8 must be True or False, got {return_uint8!r}")
        self.return_uint8 = bool(return_uint8)
        if image_transforms is not None and not callable(image_transforms):  # else a TypeError at the first item
            raise TypeError(f"image_transforms must be a callable taking and returning a (C, H, W) frame tensor "
                            f"(e.g. a torchvision.transforms.v2 transform), or None; got {image_transforms!r}")
        self.image_transforms = image_transforms
        if parallel_cameras not in (True, False, "auto"):
            raise ValueError(f"parallel_cameras must be True, False or 'auto', not {parallel_cameras!r}")
        self._decoder_threads, self._max_open_decoders, self._seek_reach = check_decoder_options(
            decoder_threads, max_open_decoders, seek_reach)
        self._parallel_cameras = parallel_cameras
        if cameras is None:
            cameras = layout.camera_keys
        elif isinstance(cameras, str):
            cameras = [cameras]
        layout.check_cameras(cameras)
        dropped = [k for k in (delta_timestamps or {}) if k in layout.camera_keys and k not in cameras]
        if dropped:
            raise ValueError(f"delta_timestamps names cameras {dropped} that cameras={list(cameras)} leaves out; "
                             "add them to cameras or drop them from delta_timestamps")
        if depth_output_unit not in ("mm", "m"):
            raise ValueError(f"depth_output_unit must be 'mm' or 'm' (lerobot 0.6's choices), not "
                             f"{depth_output_unit!r}")
        self.depth_output_unit = depth_output_unit
        # depth video key -> its quantizer; depth image key -> the unit it was recorded in (None: returned as is)
        self._depth_video = {k: layout.features[k].depth_quantization for k in cameras
                             if layout.features[k].is_depth_map and layout.features[k].is_video}
        self._depth_image = {k: _depth_unit(layout.features[k]) for k in cameras
                             if layout.features[k].is_depth_map and layout.features[k].is_image}
        self._video_keys = [k for k in layout.video_keys if k in cameras]
        self._depth_keys = set(self._depth_video) | set(self._depth_image)
        self._skip_columns = {k for k in layout.image_keys if k not in cameras}
        self.delta_timestamps = delta_timestamps
        self._delta = _frames.delta_indices(delta_timestamps, layout.fps, self.tolerance_s, layout.features)
        check_item_keys(layout, cameras, self._delta, files.source.url)  # a feature named task or <key>_is_pad
        self._meta = Meta.of(manifest)  # parsed once: the extras and the clips to check
        unchecked = [k for k in self._video_keys if self._meta.cameras is not None and k not in self._meta.cameras]
        if unchecked:  # its pointers may be null and its clips were never checked
            raise ValueError(f"the manifest was resolved for cameras {list(self._meta.cameras)} only, so it cannot "
                             f"serve {unchecked}: pass cameras={list(self._meta.cameras)}, or resolve it again with "
                             f"db.manifest(sql, cameras={list(self._video_keys)})")
        self._extras = list(self._meta.extras)
        self._prepare(manifest)
        self._worker: _Worker | None = None
        self._pipeline: _pipe.Pipeline | None = None
        self._stats_fn = stats  # ds.meta.stats: called once, on first use (db.dataset passes the Database's)
        self._owner_pid = os.getpid()  # only this process may call it: DuckDB does not survive a fork
        self._meta_obj: _meta.SelectionMetadata | None = None

    # ---- main process -------------------------------------------------------------------------------------
    def _prepare(self, m: pa.Table) -> None:
        """Resolve every sample to (row-group slot, offset) from the data files' footers, and group each camera's
        samples by mp4; then keep all per-sample arrays in one named, memory-mapped Arrow file (``_SampleFile``), so
        forked workers share its pages and spawned/forkserver workers map the same file by name instead of
        unpickling copies. Nothing is built or decoded here (see ``_Worker``)."""
        n = m.num_rows
        self._files, file_codes = _codes(m["data_file"])
        self._infos = [tabular.data_file_info(self._src, f) for f in self._files]
        # A slot per row group of every touched file: file fi's row group rg is slot _rg_base[fi] + rg.
        counts = np.array([len(info.rg_offsets) - 1 for info in self._infos], np.int64)
        self._rg_base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._slot_file = np.repeat(np.arange(len(self._infos), dtype=np.int32), counts)
        self._rg_len = np.concatenate([np.diff(info.rg_offsets) for info in self._infos]).astype(np.int64)
        # per delta key: sorted offsets mean the clamped rows are sorted too, so their ends bound them
        self._delta_sorted = {k: bool((np.diff(v) >= 0).all()) for k, v in self._delta.items()}
        data_row = m["data_row"].to_numpy()
        slot = np.zeros(n, np.int32)
        off = np.zeros(n, np.int64)
        order, starts = _groups(file_codes, len(self._files))
        for fi, info in enumerate(self._infos):
            sel = order[starts[fi]:starts[fi + 1]]
            rg, o = info.locate(data_row[sel])
            slot[sel], off[sel] = rg + self._rg_base[fi], o
        cols: dict[str, np.ndarray] = {"_file": file_codes, "_slot": slot, "_off": off}
        # Video: per camera, its mp4s and each sample's place among its file's samples. The video rows themselves
        # come from each file's index, on first use in the reading process (_video).
        self._video_files: dict[str, list[str]] = {}
        self._video_pins: dict[str, video_index.Stamp | None] = {}
        self._video_declared: dict[str, tuple[str, tuple[int, int]]] = {}  # mp4 -> camera, declared (H, W)
        self._vstarts: dict[str, np.ndarray] = {}
        missing: list[str] = []
        for k in self._video_keys:
            names, codes = _codes(m[f"{k}/file"])
            self._video_files[k] = names
            order, self._vstarts[k] = _groups(codes, len(names))
            pos = np.empty(n, np.int32)
            pos[order] = np.arange(n) - np.repeat(self._vstarts[k][:-1], np.diff(self._vstarts[k]))
            cols[f"_vfile/{k}"], cols[f"_vorder/{k}"], cols[f"_vpos/{k}"] = codes, order, pos
            hw = _declared_hw(self._layout.features[k])
            if hw is not None:
                self._video_declared.update({rel: (k, next(iter(hw))) for rel in names})
            for rel in names:  # only where it costs a stat: a remote file's absence shows at its first item
                # The stamp pins the file: every process checks it before indexing or decoding the mp4 (a file
                # replaced since would be read through an index and clips checked for another file).
                pin = self._video_pins[rel] = video_index.stamp(self._src, rel)
                local = self._src.local_path(rel)
                if local is not None and pin is None:
                    missing.append(local)
        self._clips = {k: v for k, v in self._meta.clips.items() if k in self._video_keys}
        self._gray_files = frozenset(rel for k in self._depth_video for rel in self._video_files[k])
        if missing:
            warn(f"{len(missing)} video file(s) are missing, e.g. {missing[0]}; items needing them will raise "
                 "MissingFileError (pass cameras=[...] to leave those cameras out)")
        self._map = _map_table(m, cols, self._cache_dir)
        self._manifest_cols, self._derived_cols = list(m.column_names), list(cols)
        self._n = n
        self._attach(self._map.read())
        # Columns and their kinds from the first data file's schema: the columns of its row-group cache files.
        schema = self._infos[0].schema
        self._columns = [c for c in schema.names if c not in self._skip_columns]
        self._plain = [(c, "image" if c in self._layout.image_keys else
                        "num" if tabular.is_numeric(schema.field(c), self._layout) else "other")
                       for c in self._columns if c not in self._delta]
        self._image_hw = {k: _declared_hw(self._layout.features[k]) for k in self._layout.image_keys}

    def _attach(self, mapped: pa.Table) -> None:
        """Take the per-sample arrays from the mapped per-sample file (``_SampleFile.read``): the manifest, the
        derived columns, the extras. Zero-copy views of the mapping, in the building process and in every process
        that unpickles the dataset alike."""
        self.manifest = mapped.select(self._manifest_cols)
        derived = mapped.select(self._derived_cols)
        self._c = {c: derived[c].to_numpy() for c in derived.column_names}
        for c in ("index", "episode_index", "timestamp", "ep_from_index", "ep_to_index", "ep_data_row0",
                  "task_index") + tuple(f"{k}/from_timestamp" for k in self._video_keys):
            self._c[c] = self.manifest[c].chunk(0).to_numpy() if self.manifest[c].num_chunks == 1 else \
                self.manifest[c].to_numpy()
        # Each extra keeps its Arrow dtype (float64 stays float64, int64 int64): a float32 tensor would round
        # 123456789 to 123456792 and a Unix time to 1.7e9. A number column with NULLs is float64 with NaN already
        # (plan._plain_numbers); here such a column (a manifest written elsewhere) is made so too.
        self._extra_cols = []
        for e in self._extras:
            col = self.manifest[e]
            col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            if _is_number(col.type) and col.null_count:
                col = col.cast(pa.float64()).fill_null(float("nan"))
            numeric = _is_number(col.type) and col.null_count == 0
            inner = getattr(col.type, "value_type", None)
            ltype = _torch_dtype(inner) if inner is not None and _is_number(inner) else None
            self._extra_cols.append((e, col.to_numpy(zero_copy_only=False) if numeric else col, numeric, ltype))

    # ---- any process --------------------------------------------------------------------------------------
    def _video(self, w: _Worker, key: str, code: int) -> _VideoFile:
        """Camera ``key``'s mp4 number ``code`` in this process: on first use, index it, check its clips and find
        the video row of each of its samples (one vectorised search); later, the cached result or error.

        Raises:
            MissingFileError: the mp4 does not exist (with the ``cameras=[...]`` way out).
            DatasetFormatError: a clip in it disagrees with its frames (see ``_check_clips``).
        """
        vf = w.videos.get((key, code))
        if vf is None:
            vf = w.videos[(key, code)] = self._open_video(w, key, code)
        if vf.error is not None:
            e = vf.error
            hint = (f" (camera {key!r}; pass cameras=[...] without it, or cameras=[] for tabular-only items)"
                    if isinstance(e, MissingFileError) else "")
            raise type(e)(f"{e}{hint}") from e
        return vf

    def _open_video(self, w: _Worker, key: str, code: int) -> _VideoFile:
        rel = self._video_files[key][code]
        try:
            index = w.index(self, rel)
        except MissingFileError as e:
            return _VideoFile(error=e)
        try:
            self._check_clips(key, rel, index)
        except DatasetFormatError as e:
            return _VideoFile(index, error=e)
        rows = None
        a, b = self._vstarts[key][code], self._vstarts[key][code + 1]
        sel = self._c[f"_vorder/{key}"][a:b]
        # Each sample's episode clip in this file: its first frame's row, then `length` frames (the rule of
        # locate.check_clips, which has just checked the chain). int32: these arrays are private to each process (no
        # mp4 holds 2**31 frames).
        first = locate.clip_first_rows(index.pts_s, self._c[f"{key}/from_timestamp"][sel], self._layout.fps)
        if key not in self._delta:  # delta cameras locate each item's frames as they go
            from_ts = self._c[f"{key}/from_timestamp"][sel]
            ep_from = self._c["ep_from_index"][sel]
            length, pos = self._c["ep_to_index"][sel] - ep_from, self._c["index"][sel] - ep_from
            if self.align == "frame_index":
                rows = locate.rows_by_position(index.pts_s, first, pos, length, from_ts, self._layout.fps)
            else:
                # A time with no frame within tolerance keeps -1 (__getitem__ raises FrameNotFoundError for it), a
                # frame outside the episode's clip OUTSIDE, another row's frame OFF_GRID (DatasetFormatError): a
                # large tolerance_s must not reach into the neighbouring episode's or another row's frames.
                rows = locate.rows_within(index.pts_s, locate.time_in_file(from_ts, self._c["timestamp"][sel]),
                                          self.tolerance_s)
                rows = locate.keep_in_clip(rows, first, length)
                if self._own_frames:
                    rows = locate.keep_own_frame(rows, index.pts_s, first, pos, from_ts, self._layout.fps)
            rows = rows.astype(np.int32)
        return _VideoFile(index, rows, first.astype(np.int32))

    def _check_clips(self, key: str, rel: str, index: video_index.FrameIndex) -> None:
        """The selected episodes' clips in mp4 ``rel`` against its real frames
        (:func:`lerobot_sql._readers.locate.check_clips`; the clips come from the manifest's metadata).

        Raises:
            DatasetFormatError: naming the mp4, camera and episode, what overlaps, and the fix.
        """
        locate.check_clips(index.pts_s, self._clips.get(key), rel, fps=self._layout.fps, where=self._src.path(rel),
                           video_key=key)

    def _frame(self, key: str, i: int) -> tuple[str, video_index.FrameIndex, int]:
        """(mp4, its index, video row) of sample ``i``'s frame of camera ``key`` (not a delta key), in this process.

        Raises as ``__getitem__`` does (MissingFileError, DatasetFormatError, FrameNotFoundError)."""
        code = int(self._c[f"_vfile/{key}"][i])
        vf = self._video(self._w(), key, code)
        r = int(vf.rows[self._c[f"_vpos/{key}"][i]])
        if r < 0:
            self._no_frame(key, i, vf)
        return self._video_files[key][code], vf.index, r

    def _clip_rows(self, key: str, i: int, vf: _VideoFile, position: np.ndarray, times=None) -> np.ndarray:
        """Rows (int64) in ``vf`` of sample ``i``'s camera ``key`` frames at ``position`` (frames from its episode's
        start: the sample's own, or its delta_timestamps neighbours' clamped to the episode) by ``self.align``,
        looked up by ``times`` (seconds from the episode start: their data timestamps) with align="timestamp".
        A row < 0 has no frame that may be served (see ``_no_frame``).

        Raises:
            FrameNotFoundError: align="timestamp" and a time has no frame within ``tolerance_s``.
        """
        c, fps = self._c, self._layout.fps
        first = int(vf.first[c[f"_vpos/{key}"][i]])
        length = int(c["ep_to_index"][i] - c["ep_from_index"][i])
        from_ts = c[f"{key}/from_timestamp"][i]
        if self.align == "frame_index":
            return locate.rows_by_position(vf.index.pts_s, first, position, length, from_ts, fps)
        rows = vf.index.locate(locate.time_in_file(from_ts, times), self.tolerance_s,
                               episode_index=int(c["episode_index"][i]), video_key=key)
        rows = locate.keep_in_clip(rows, first, length)
        if self._own_frames:
            rows = locate.keep_own_frame(rows, vf.index.pts_s, first, position, from_ts, fps)
        return rows

    def _no_frame(self, key: str, i: int, vf: _VideoFile, position=None, times=None) -> None:
        """Raise the error of sample ``i``'s camera ``key`` frame(s) in ``vf``, one of which has no row (error path
        only): ``position`` / ``times`` as :meth:`_clip_rows` takes them (default the sample's own) are looked up again.

        Raises:
            FrameNotFoundError: a time with no frame within ``tolerance_s`` (file, camera, episode, time, nearest pts).
            DatasetFormatError: the frame lies outside the episode's clip, or is not the row's own frame of a clip on
                the fps grid (:func:`locate.clip_error`: file, camera, episode, frame_index, times, the fix).
        """
        c = self._c
        ep_from = int(c["ep_from_index"][i])
        position = np.atleast_1d(int(c["index"][i]) - ep_from if position is None else position)
        times = c["timestamp"][i:i + 1] if times is None else np.atleast_1d(times)
        rows = self._clip_rows(key, i, vf, position, times)  # raises FrameNotFoundError for a time without a frame
        j = int(np.flatnonzero(rows < 0)[0]) if (rows < 0).any() else 0
        from_ts = float(c[f"{key}/from_timestamp"][i])
        where = dict(episode_index=int(c["episode_index"][i]), video_key=key, position=int(position[j]),
                     first=int(vf.first[c[f"_vpos/{key}"][i]]), length=int(c["ep_to_index"][i]) - ep_from,
                     from_timestamp=from_ts, fps=self._layout.fps)
        if self.align == "frame_index":
            raise locate.clip_error(self._src.path(vf.index.path), vf.index.pts_s, int(rows[j]), **where)
        t = float(locate.time_in_file(from_ts, times[j:j + 1])[0])
        found = int(locate.nearest(vf.index.pts_s, [t])[0][0])
        raise locate.clip_error(self._src.path(vf.index.path), vf.index.pts_s, int(rows[j]), time_s=t, row=found,
                                tolerance_s=self.tolerance_s, **where)

    def _use_parallel(self) -> bool:
        if self._parallel_cameras != "auto":
            return bool(self._parallel_cameras)
        if torch.utils.data.get_worker_info() is not None:
            return False  # DataLoader workers already keep the cores busy
        shape = self._layout.features[self._video_keys[0]].shape if self._video_keys else (0, 0)
        return (os.cpu_count() or 1) > 1 and int(shape[0]) * int(shape[1]) >= 240 * 320

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_worker"] = None  # maps, indexes and decoders are re-opened in the receiving process
        # The per-sample arrays (~350 bytes a sample) travel as the name of their file: a spawned or forkserver
        # worker maps the pages a forked one shares, instead of unpickling a private copy (3.5 GB at 10M samples).
        for k in ("manifest", "_c", "_extra_cols"):
            state.pop(k, None)
        # The statistics function holds the Database (DuckDB does not pickle, nor cross a fork): a copy keeps the
        # numbers if they were computed, else says where to compute them (SelectionMetadata.__getstate__).
        state["_stats_fn"] = _meta.stats_unavailable if self._stats_fn is not None else None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._attach(self._map.read())

    def close(self) -> None:
        """Delete the per-sample file now (it is otherwise deleted when the last dataset sharing it is collected,
        or at exit). This process keeps reading items (its mapping stays valid); DataLoader workers started
        afterwards with ``spawn``/``forkserver`` cannot map it and raise CacheError, forked ones are unaffected."""
        self._map.close()

    # ---- what lerobot's training code reads besides items (lerobot_sql.meta) ------------------------------
    @property
    def meta(self) -> "_meta.SelectionMetadata":
        """What ``LeRobotDatasetMetadata`` answers, for this dataset's selection (:mod:`lerobot_sql.meta`):
        ``info``, ``features``, ``fps``, ``camera_keys``, ``episodes`` (one row per run, positions in this dataset),
        ``tasks``, ``stats``, totals. Built on first use from meta/episodes (pyarrow, no DuckDB) and the headers of
        the selection's mp4s (no decoding): a camera whose files all hold another frame size than info.json's gets
        the files' size in ``features`` / ``shapes``, the size of its items, with a warning.

        Raises:
            DatasetFormatError: meta/episodes cannot be read; an mp4's frames are a decode bomb (a side over 8192,
                or 64 x info.json's pixel count).
        """
        if self._meta_obj is None:
            from ._format.metadata import read_episodes

            ep = self._c["episode_index"]
            fr = self.manifest["frame_index"].to_numpy()
            source_eps = read_episodes(self._src, self._layout, np.unique(ep))
            self._meta_obj = _meta.SelectionMetadata(
                self._layout, _meta.episodes_table(source_eps, ep, fr), self._tasks, total_frames=self._n,
                task_indices=self._c["task_index"], repo_id=self.repo_id, root=self.root, stats_fn=self._stats_fn,
                cameras=self.camera_keys, owner_pid=self._owner_pid, depth_output_unit=self.depth_output_unit,
                served=self._served_frame_sizes())
        return self._meta_obj

    def _served_frame_sizes(self) -> dict[str, tuple[tuple[int, ...], tuple[int, int]]]:
        """Video cameras whose mp4s in this selection all hold frames of one size other than info.json's: camera
        -> (its info.json shape with that size put in, (height, width)). Items carry each file's own size (as
        lerobot's decoder), so this is what ``meta.features`` / ``meta.shapes`` must say for a policy built from
        them to take the items.

        Reads mp4 headers (no decoding; a remote file's boxes only, as its index build does): a camera's first
        readable file, and all of them only when it differs from info.json; warns of a file whose size differs from
        info.json's, as the decoder would (once per file and process). A camera whose
        files differ among themselves keeps info.json's shape (no one shape is right; the warnings name the files).
        Missing or unreadable files are left to their items, which raise naming them.

        Raises:
            DatasetFormatError: a file's frames are a decode bomb (:func:`decode.check_resolution`).
        """
        out = {}
        for k in self._video_keys:
            axes, declared = _hw_axes(self._layout.features[k]), self._video_declared
            if axes is None:
                continue
            sizes = set()
            shape = list(int(x) for x in self._layout.features[k].shape)
            for rel in self._video_files[k]:
                if self._video_pins.get(rel) is None and self._src.local_path(rel) is not None:
                    continue  # missing: its items raise MissingFileError
                try:
                    with video_index.open_container(self._src, rel, demux_only=True) as c:
                        cc = c.streams.video[0].codec_context
                        hw = (int(cc.height), int(cc.width))
                except (LeRobotSQLError, IndexError):
                    continue  # unreadable or no video stream: its items raise naming the file
                decode.check_resolution(self._src.path(rel), hw, k, declared.get(rel, (None, None))[1])
                sizes.add(hw)
                # The first readable file agreeing with info.json settles it: the rest are not opened (a remote
                # camera of hundreds of mp4s would cost a header fetch each at ds.meta; a file that disagrees
                # among agreeing ones is warned of by its decoder, and meta keeps info.json's shape, as below).
                if len(sizes) == 1 and hw == (shape[axes[0]], shape[axes[1]]):
                    break
            if len(sizes) == 1:
                (hw,) = sizes
                if (shape[axes[0]], shape[axes[1]]) != hw:
                    shape[axes[0]], shape[axes[1]] = hw
                    out[k] = (tuple(shape), hw)
        return out

    @property
    def features(self) -> dict[str, dict]:
        """info.json's ``features`` for what the items carry (cameras left out with ``cameras=`` are not here; a
        camera's shape is its files' frame size when they all disagree with info.json: see :attr:`meta`)."""
        return self.meta.features

    @property
    def camera_keys(self) -> list[str]:
        """The cameras the items carry (video and image keys), in info.json order."""
        return [k for k in self._layout.camera_keys if k in self._video_keys or
                (k in self._layout.image_keys and k not in self._skip_columns)]

    @property
    def num_frames(self) -> int:
        """Samples in the dataset (``len(ds)``; a frame selected twice counts twice)."""
        return self._n

    @functools.cached_property
    def num_episodes(self) -> int:
        """Distinct episodes the samples come from (counted once: a sort of every sample's episode_index)."""
        return int(len(np.unique(self._c["episode_index"])))

    @property
    def episodes(self) -> None:
        """None: every row of ``meta.episodes`` belongs to this dataset (as LeRobotDataset without ``episodes=``);
        the episode indices are ``meta.episodes["episode_index"]``."""
        return None

    @property
    def absolute_to_relative_idx(self) -> None:
        """None: ``meta.episodes`` ranges are already positions in this dataset (lerobot 0.6's sampler reads it)."""
        return None

    @property
    def delta_indices(self) -> dict[str, list[int]] | None:
        """Frame offsets of ``delta_timestamps`` (``round(d * fps)`` per key), as lerobot 0.4's; None without."""
        return {k: [int(x) for x in v] for k, v in self._delta.items()} if self._delta else None

    @property
    def repo_id(self) -> str:
        """The Hub repo id of a Hub dataset (``org/name``), else the root folder's name."""
        return _meta.repo_id(self._src.url, self._src.root)

    @property
    def root(self) -> Path | str:
        """The dataset root: a Path for a local dataset, else its URL."""
        return Path(self._src.root) if self._src.is_local else self._src.url

    def __len__(self) -> int:
        return self._n

    def _w(self) -> _Worker:
        w = self._worker
        if w is None or w.pid != os.getpid():
            if w is not None:
                # Inherited across a fork: never free it here. Its PyAV/swscale objects own threads that exist only
                # in the parent, and freeing them in the child blocks forever in pthread_cond_destroy.
                _INHERITED.append(w)
            w = self._worker = _Worker(self)
        return w

    def _rows(self, w: _Worker, fi: int, rows: np.ndarray, column: str):
        """Values of ``column`` at file rows (numpy (T, *shape), or list of Arrow scalars for other types)."""
        info = self._infos[fi]
        rgs, offs = info.locate(rows)
        base = int(self._rg_base[fi])
        if rgs[0] == rgs[-1] and (len(rgs) < 3 or (rgs == rgs[0]).all()):
            arr = w.view(self, base + int(rgs[0])).column(column)
            return arr[offs] if isinstance(arr, np.ndarray) else [arr[int(x)] for x in offs]
        uniq = np.unique(rgs)
        w.map(self, base + uniq)  # the row groups this item spans, built together
        parts = []
        for rg in uniq:
            mask = rgs == rg
            parts.append((mask, w.view(self, base + int(rg)).column(column), offs[mask]))
        first = parts[0][1]
        if isinstance(first, np.ndarray):
            out = np.empty((len(rows), *first.shape[1:]), first.dtype)
            for mask, arr, o in parts:
                out[mask] = arr[o]
            return out
        out = [None] * len(rows)
        for mask, arr, o in parts:
            for j, x in zip(np.flatnonzero(mask), o):
                out[j] = arr[int(x)]
        return out

    def _neighbours(self, w: _Worker, i: int, key: str, column: str, fi: int, idx: int, ep_from: int, ep_to: int,
                    row0: int):
        """(values of ``column`` at the clamped neighbours ``idx + offsets`` of ``key``, is_pad).

        The neighbours usually sit in the frame's own row group: then they are read straight from it, at the
        frame's offset plus their distance in frames (an episode's rows are contiguous in its data file).
        """
        off = self._delta[key]
        target = off + idx
        pad = (target < ep_from) | (target >= ep_to)
        q = np.minimum(np.maximum(target, ep_from), ep_to - 1)
        slot = int(self._c["_slot"][i])
        o = q + (int(self._c["_off"][i]) - idx)
        lo, hi = (int(o[0]), int(o[-1])) if self._delta_sorted[key] else (int(o.min()), int(o.max()))
        if lo >= 0 and hi < self._rg_len[slot]:
            arr = w.view(self, slot).column(column)
            vals = arr[o] if isinstance(arr, np.ndarray) else [arr[int(x)] for x in o]
        else:
            vals = self._rows(w, fi, row0 + (q - ep_from), column)
        return vals, pad

    def _image(self, value, column: str, i: int) -> torch.Tensor:
        """Decode one ``image`` cell (lerobot's ``{bytes, path}`` struct of PNG/TIFF bytes) of sample ``i``.

        Returns lerobot's tensor (``ToTensor``): float32 (C, H, W) in [0, 1], uint8 with ``return_uint8``;
        16-bit images as their integer values, (1, H, W); a depth map (``info.is_depth_map``) as lerobot 0.6:
        float32 (1, H, W) of its values (uint16 mm or float m TIFF), converted from ``info.depth_unit`` to
        ``depth_output_unit`` (x1000 or /1000).

        Raises:
            DatasetFormatError: the cell has no bytes (only a path, which is never opened: it is dataset text),
                is not an image PIL can read, or its header's size is not the declared one (checked before the
                pixels are decoded, so a small PNG declaring 12000 x 12000 costs nothing). lerobot would serve
                any size; a refusal here keeps batches and model inputs at the declared shape.
        """
        from PIL import Image

        raw = value.as_py() if hasattr(value, "as_py") else value
        data = raw.get("bytes") if isinstance(raw, dict) else raw
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise self._image_error(column, i, "holds no image bytes" + (
                " (only a path, which is not opened: re-encode the dataset with the images embedded)"
                if isinstance(raw, dict) and raw.get("path") else ""))
        try:
            img = Image.open(io.BytesIO(data))  # lazy: reads the header only
            want = self._image_hw.get(column)
            if want is not None and (img.height, img.width) not in want:
                raise self._image_error(
                    column, i, f"is a {img.width}x{img.height} (WxH) {img.mode} image but info.json declares shape "
                    f"{list(self._layout.features[column].shape)} for {column!r}; fix the image or the declared shape")
            arr = np.asarray(img)
        except DatasetFormatError:
            raise
        except Exception as e:  # PIL: UnidentifiedImageError, a truncated stream (OSError), DecompressionBombError
            raise self._image_error(column, i, f"is not a readable image ({type(e).__name__}: {e})") from e
        if arr.ndim == 2:
            arr = arr[:, :, None]
        arr = np.ascontiguousarray(arr.transpose(2, 0, 1))
        if column in self._depth_image:
            # lerobot 0.6 (pil_to_chw_tensor): a 16-bit depth image as float32 values, a float TIFF as it is (ToTensor
            # keeps mode F); then from its recorded unit to the output unit, with the same torch op
            if arr.dtype == np.uint16 or not arr.flags.writeable:  # PIL's float array is read-only: copy it
                arr = arr.astype(np.float32 if arr.dtype == np.uint16 else arr.dtype)
            t = torch.from_numpy(arr)
            unit = self._depth_image[column]
            if unit is not None and unit != self.depth_output_unit:
                t = t * _MM_PER_METRE if unit == "m" else t / _MM_PER_METRE
            return t
        if arr.dtype == np.uint8 and not self.return_uint8:
            arr = _to_unit_float(arr)
        return torch.from_numpy(arr)

    def _image_error(self, column: str, i: int, what: str) -> DatasetFormatError:
        c = self._c
        return DatasetFormatError(
            f"{self._src.path(self._files[int(c['_file'][i])])}: column {column!r} of sample {i} (episode "
            f"{int(c['episode_index'][i])}, index {int(c['index'][i])}"
            f"{', or a frame of its delta_timestamps window' if column in self._delta else ''}) {what}")

    def _tensor(self, column: str, values, i: int) -> Any:
        if column in self._layout.image_keys:
            imgs = [self._image(v, column, i) for v in values]
            return imgs[0] if len(imgs) == 1 else torch.stack(imgs)
        if isinstance(values, np.ndarray):
            return torch.from_numpy(np.array(values))
        return [v.as_py() for v in values]

    def _video_rows(self, w: _Worker, key: str, i: int, fi: int, idx: int, ep_from: int, ep_to: int,
                    row0: int, pads: dict) -> tuple[video_index.FrameIndex, np.ndarray]:
        vf = self._video(w, key, int(self._c[f"_vfile/{key}"][i]))
        index = vf.index
        if key in self._delta:
            target = self._delta[key] + idx
            position = np.minimum(np.maximum(target, ep_from), ep_to - 1) - ep_from
            if self.align == "frame_index":  # no timestamp is read
                times, pad = None, (target < ep_from) | (target >= ep_to)
            else:
                times, pad = self._neighbours(w, i, key, "timestamp", fi, idx, ep_from, ep_to, row0)
            pads[f"{key}_is_pad"] = torch.from_numpy(pad)
            rows = self._clip_rows(key, i, vf, position, times)
            if int(rows.min()) < 0:
                self._no_frame(key, i, vf, position, times)
            return index, rows
        r = int(vf.rows[self._c[f"_vpos/{key}"][i]])
        if r < 0:
            self._no_frame(key, i, vf)
        return index, np.array([r])

    def _decode(self, w: _Worker, key: str, index: video_index.FrameIndex, rows: np.ndarray) -> torch.Tensor:
        arr = w.decoders.decode_chw(index, rows)
        if key in self._depth_video:  # 12-bit codes (n, 1, H, W): lerobot's float32 copy, then its in-place ops
            t = _dequantize_(torch.from_numpy(arr.astype(np.float32)), self._depth_video[key], self.depth_output_unit)
        else:
            if not self.return_uint8:
                arr = _to_unit_float(arr)
            t = torch.from_numpy(arr)
        return t[0] if len(rows) == 1 else t

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):  # as lerobot 0.6's LeRobotDataset: a list of the items, in the slice's order
            return [self[j] for j in range(*i.indices(len(self)))]
        i = item_index(i)
        n = self._n
        if not -n <= i < n:
            raise IndexError(f"item {i} out of range for a dataset of {n} samples")
        i = int(i) % n
        w = self._w()
        c = self._c
        fi, idx = int(c["_file"][i]), int(c["index"][i])
        ep_from, ep_to, row0 = int(c["ep_from_index"][i]), int(c["ep_to_index"][i]), int(c["ep_data_row0"][i])
        pads: dict[str, torch.Tensor] = {}
        # Locate every camera's frames first (cheap), then decode: other cameras in helper threads (PyAV releases
        # the GIL), while this thread reads the tabular columns and decodes the last camera.
        targets = [self._video_rows(w, k, i, fi, idx, ep_from, ep_to, row0, pads) for k in self._video_keys]
        futures = []
        if w.pool is not None:
            futures = [w.pool.submit(self._decode, w, k, index, rows)
                       for k, (index, rows) in zip(self._video_keys, targets[:-1])]
        try:
            item: dict[str, Any] = {}
            view = w.view(self, int(c["_slot"][i]))
            off = int(c["_off"][i])
            for col in self._columns:
                if col in self._delta:
                    vals, pad = self._neighbours(w, i, col, col, fi, idx, ep_from, ep_to, row0)
                    item[col] = self._tensor(col, vals, i)
                    if col in self._layout.image_keys and len(pad) > 1 and item[col].ndim == 3:
                        item[col] = item[col][None]
                    pads[f"{col}_is_pad"] = torch.from_numpy(pad)
            for col, kind in self._plain:
                v = view.column(col)[off]
                if kind == "num":
                    item[col] = torch.from_numpy(np.array(v))
                elif kind == "image":
                    item[col] = self._image(v, col, i)
                else:
                    item[col] = v.as_py()
            if self._delta:  # keep lerobot's key order: data columns in file order
                item = {col: item[col] for col in self._columns}
            item.update(sorted(pads.items(), key=lambda kv: self._pad_order(kv[0])))
            frames = {}
            if futures:
                frames[self._video_keys[-1]] = self._decode(w, self._video_keys[-1], *targets[-1])
                for k, f in zip(self._video_keys, futures):
                    frames[k] = f.result()
                futures = []
            else:
                for k, (index, rows) in zip(self._video_keys, targets):
                    frames[k] = self._decode(w, k, index, rows)
        finally:
            for f in futures:  # an error above: let helper threads finish with their decoders before leaving
                f.cancel() or f.exception()
        if frames:
            item = {**{k: frames[k] for k in self._video_keys}, **item}
        if self.image_transforms is not None:
            for k in self._layout.camera_keys:
                if k in item and k not in self._depth_keys:  # as lerobot 0.6: transforms never see depth maps
                    item[k] = self.image_transforms(item[k])
        item["task"] = self._tasks.get(int(c["task_index"][i]))
        for e, arr, numeric, ltype in self._extra_cols:
            if numeric:  # 0-d tensor of the column's own dtype
                item[e] = torch.from_numpy(np.array(arr[i]))
                continue
            item[e] = _extra_value(arr[i].as_py(), ltype)
        return item

    def _pad_order(self, key: str) -> int:
        base = key[: -len("_is_pad")]
        return self._columns.index(base) if base in self._columns else len(self._columns) + \
            self._video_keys.index(base)

    # ---- batched fetch (DataLoader) ------------------------------------------------------------------------
    def __getitems__(self, indices) -> "Batch":
        """The items ``[self[i] for i in indices]``, built together: what torch's DataLoader calls with a batch.

        Returns a :class:`Batch`: a sequence of ``len(indices)`` item dicts (item ``j`` equals ``self[indices[j]]``
        bit for bit: same keys in the same order, dtypes, shapes; tensors are views into the batch's tensors) that
        also holds the collated batch. torch's fetcher hands the returned value to ``collate_fn``; torch's
        ``default_collate`` cannot be given a ready dict (it indexes ``batch[0]`` and stacks), so this module
        registers its item type in ``default_collate_fn_map``: ``default_collate`` on a ``Batch`` returns the
        prepared batch directly (``{key: (B, *item shape) tensor | collated list}``), which equals
        ``default_collate([self[i] for i in indices])`` key by key, bit for bit. A plain
        ``DataLoader(ds, batch_size=B)`` therefore stays correct and skips the per-item stack; any other
        ``collate_fn`` sees a sequence of ordinary item dicts. Keys that are not tensors in the batch (``task``,
        text and list extras, strings; every camera when ``image_transforms`` is set, which runs per item as in
        ``__getitem__``) are collated by ``default_collate`` itself from the per-item values, so its rules and
        errors (e.g. ``TypeError`` for a NULL text extra) are unchanged.

        The work is done where the time goes: tabular columns are gathered with one vectorised take per row group
        (``delta_timestamps`` windows too, where they sit in the frame's row group), each mp4's frames for the
        whole batch are decoded in one call (sorted rows: one forward pass per GOP run), and results are written
        straight into batch tensors (in shared memory inside a DataLoader worker, as ``default_collate`` does).

        Raises: as ``__getitem__`` does for the first failing item (``IndexError``, ``TypeError`` for non-integer
        indices, FrameNotFoundError, MissingFileError, DatasetFormatError, VideoDecodeError, CacheError).
        """
        ii = self._batch_indices(indices)
        mem = _batch_memory.begin()  # this worker's recycled shared memory for the batch tensors (None elsewhere)
        try:
            return self._getitems(ii, mem)
        finally:
            if mem is not None:
                mem.close()

    def _getitems(self, ii: np.ndarray, mem) -> "Batch":
        b = len(ii)
        w = self._w()
        if self._pipeline is not None and b:  # this worker's next batches, fetched while it reads this one
            self._pipeline.after_batch(ii, self._n, lambda jj: self._byte_ranges(w, jj), self._src)
        c = self._c
        tensors: dict[str, torch.Tensor] = {}  # key -> (B, *item shape)
        lists: dict[str, list] = {}  # key -> per-item values, collated by default_collate
        order: list[str] = []
        if b == 0:
            return Batch(order, tensors, lists, 0, mem)
        fi, idx = c["_file"][ii].astype(np.int64), c["index"][ii].astype(np.int64)
        ep_from, ep_to, row0 = (c["ep_from_index"][ii].astype(np.int64), c["ep_to_index"][ii].astype(np.int64),
                                c["ep_data_row0"][ii].astype(np.int64))
        slot, off = c["_slot"][ii].astype(np.int64), c["_off"][ii].astype(np.int64)
        for f in np.unique(fi):  # the batch's row groups of each file, cache files built together
            w.map(self, np.unique(slot[fi == f]))
        pads: dict[str, np.ndarray] = {}
        windows: dict[str, tuple] = {}

        def window(key: str):
            # (clamped file rows q (B, T), pad (B, T), offsets in the frame's row group o (B, T), inside (B,))
            if key not in windows:
                target = self._delta[key][None, :] + idx[:, None]
                pad = (target < ep_from[:, None]) | (target >= ep_to[:, None])
                q = np.minimum(np.maximum(target, ep_from[:, None]), ep_to[:, None] - 1)
                o = q + (off - idx)[:, None]
                inside = (o.min(axis=1) >= 0) & (o.max(axis=1) < self._rg_len[slot])
                windows[key] = (q, pad, o, inside)
            return windows[key]

        def gather(column: str, o: np.ndarray, sel: np.ndarray, out: np.ndarray) -> None:
            # out[j] = column at row o[j] of row group slot[j], for j in sel: one take per row group
            ss = slot[sel]
            for s in np.unique(ss):
                m = sel[ss == s]
                out[m] = w.view(self, int(s)).column(column)[o[m]]

        def neighbours(column: str, key: str, out: np.ndarray) -> None:
            q, pad, o, inside = window(key)
            sel = np.flatnonzero(inside)
            if len(sel):
                gather(column, o, sel, out)
            for j in np.flatnonzero(~inside):  # a window crossing row groups: read per item
                out[j] = self._rows(w, int(fi[j]), row0[j] + (q[j] - ep_from[j]), column)

        # video: locate every camera's frames for the batch, then decode per (camera, mp4) in file order
        frames: dict[str, torch.Tensor] = {}
        targets = []
        for k in self._video_keys:
            codes = c[f"_vfile/{k}"][ii]
            files = {int(code): self._video(w, k, int(code)) for code in np.unique(codes)}
            if k in self._delta:
                q, pad, o, inside = window(k)
                times = None
                if self.align != "frame_index":  # (by frame_index, no timestamp is read)
                    # the data file's timestamp dtype, as __getitem__ reads the window's times from the row group
                    times = np.empty(q.shape, w.view(self, int(slot[0])).column("timestamp").dtype)
                    neighbours("timestamp", k, times)
                rows = np.empty(q.shape, np.int64)
                position = q - ep_from[:, None]
                for j in range(b):
                    vf = files[int(codes[j])]
                    rows[j] = self._clip_rows(k, int(ii[j]), vf, position[j], None if times is None else times[j])
                for j in np.flatnonzero((rows < 0).any(axis=1))[:1]:  # outside the clip, or not the row's frame
                    self._no_frame(k, int(ii[j]), files[int(codes[j])], position[j],
                                   None if times is None else times[j])
                pads[f"{k}_is_pad"] = pad
            else:
                pos = c[f"_vpos/{k}"][ii]
                rows = np.empty((b, 1), np.int64)
                for code, vf in files.items():
                    m = codes == code
                    rows[m, 0] = vf.rows[pos[m]]
                for j in np.flatnonzero(rows[:, 0] < 0)[:1]:
                    self._no_frame(k, int(ii[j]), files[int(codes[j])])
            targets.append((k, codes, files, rows))
        # decode per (camera, mp4), rows sorted inside decode_into: one forward pass per GOP run; the other cameras
        # in helper threads where __getitem__ would use them (PyAV releases the GIL)
        futures = []
        if w.pool is not None and len(targets) > 1:
            futures = [w.pool.submit(self._decode_batch, w, *tg, mem) for tg in targets[:-1]]
        try:
            for tg in targets[len(futures):]:  # all cameras, or the last one beside the helpers
                frames[tg[0]] = self._decode_batch(w, *tg, mem)
            for tg, f in zip(targets, futures):
                frames[tg[0]] = f.result()
            futures = []
        finally:
            for f in futures:  # an error above: let helper threads finish with their decoders before leaving
                f.cancel() or f.exception()

        # tabular columns, in __getitem__'s order
        item_cols: dict[str, Any] = {}
        for col in self._columns:
            if col in self._delta:
                q, pad, o, inside = window(col)
                first = w.view(self, int(slot[0])).column(col)
                if isinstance(first, np.ndarray):  # numbers: what __getitem__'s _tensor turns into one tensor
                    out_t = _batch_tensor((b, *o.shape[1:], *first.shape[1:]), _np_torch(first.dtype), mem)
                    neighbours(col, col, out_t.numpy())
                    item_cols[col] = out_t
                else:
                    vals = []
                    for j in range(b):
                        v, _ = self._neighbours(w, int(ii[j]), col, col, int(fi[j]), int(idx[j]), int(ep_from[j]),
                                                int(ep_to[j]), int(row0[j]))
                        x = self._tensor(col, v, int(ii[j]))
                        if col in self._layout.image_keys and len(v) > 1 and x.ndim == 3:
                            x = x[None]
                        vals.append(x)
                    item_cols[col] = vals
                pads[f"{col}_is_pad"] = pad
        for col, kind in self._plain:
            if kind == "num":
                first = w.view(self, int(slot[0])).column(col)
                out_t = _batch_tensor((b, *first.shape[1:]), _np_torch(first.dtype), mem)
                gather(col, off, np.arange(b), out_t.numpy())
                item_cols[col] = out_t
            elif kind == "image":
                item_cols[col] = [self._image(w.view(self, int(slot[j])).column(col)[int(off[j])], col, int(ii[j]))
                                  for j in range(b)]
            else:
                item_cols[col] = [w.view(self, int(slot[j])).column(col)[int(off[j])].as_py() for j in range(b)]
        if self._delta:
            item_cols = {col: item_cols[col] for col in self._columns}
        for k in sorted(pads, key=self._pad_order):
            item_cols[k] = _batch_tensor(pads[k].shape, torch.bool, mem)
            item_cols[k].numpy()[...] = pads[k]
        batch = {**{k: frames[k] for k in self._video_keys}, **item_cols}
        if self.image_transforms is not None:
            # per item, item-major and in camera order, as __getitem__ calls it (a random transform draws the same)
            cams = [k for k in self._layout.camera_keys if k in batch and k not in self._depth_keys]
            per = {k: [] for k in cams}
            for j in range(b):
                for k in cams:
                    per[k].append(self.image_transforms(batch[k][j]))
            batch.update(per)
        batch["task"] = [self._tasks.get(int(x)) for x in c["task_index"][ii]]
        for e, arr, numeric, ltype in self._extra_cols:
            if numeric:
                batch[e] = torch.from_numpy(np.ascontiguousarray(arr[ii]))
                continue
            batch[e] = [_extra_value(v, ltype) for v in arr.take(pa.array(ii)).to_pylist()]
        for k, v in batch.items():
            (tensors if isinstance(v, torch.Tensor) else lists)[k] = v
        return Batch(list(batch), tensors, lists, b, mem)

    # ---- remote pipelining (lerobot_sql.pipeline) ---------------------------------------------------------
    def pipeline(self, sampler, *, batches: int = 8, max_bytes: int | None = None) -> "LeRobotSQLDataset":
        """Fetch ahead, in each DataLoader worker, the remote bytes of the worker's next ``batches`` batches.

        ``sampler`` is the one the DataLoader draws from (``DataLoader(ds, sampler=sampler, batch_size=B, ...)``;
        this package's samplers, a list of indices, or any sampler whose order is the same in a worker's copy).
        On ``__getitems__`` of batch ``j`` a worker submits to two background threads the byte ranges of batches
        ``j + W .. j + batches*W`` (its own, under torch's round robin; ``W`` = ``num_workers``, 1 without
        workers): data row groups not cached yet, video packets from each frame's keyframe, container heads.
        ``max_bytes`` bounds the bytes a worker holds fetched ahead and unread (default ``min(128 MiB,
        cache_size / (4 * W))``). Why this design and what disables it: :mod:`lerobot_sql.pipeline`.

        Items never change (the bytes go through the same pinned piece cache). Local datasets: a no-op. With
        ``spawn`` workers the sampler is pickled with the dataset. Returns the dataset (for chaining); call again
        to replace the sampler, ``ds.pipeline(None)`` to switch it off.

        Raises:
            ValueError: ``batches < 1`` or ``max_bytes <= 0``. TypeError: ``sampler`` is not iterable.

        On a remote dataset it also pins, in one parallel round of requests, the version of every mp4 the query's
        cameras read (their size and ETag; the data files are pinned by the open): the workers inherit those
        pins, so all of them read the same version of a file, and none asks the server for them first.
        """
        self._pipeline = None if sampler is None else _pipe.Pipeline(sampler, batches, max_bytes)
        if self._pipeline is not None:
            # The order, once: checked here, planned over on a remote dataset (the only case that iterates a
            # sampler without an order of its own). A sampler that fails to iterate: the DataLoader's own
            # iteration raises, named there.
            try:
                order = _pipe.sampler_order(sampler, iterate=not self._src.is_local and bool(_pipe.WIDEN))
            except Exception:  # noqa: BLE001
                order = None
            self._warn_outside(order)
            # the mp4s' versions pinned here, in one parallel round: the workers inherit them instead of each
            # asking for every file on its first read (a round trip each, per worker and epoch)
            self._src.describe(sorted({rel for names in self._video_files.values() for rel in names}))
            if not self._src.is_local:
                self._pipeline.need, self._pipeline.blocks, self._pipeline.need_of = self._epoch_need(order)
        return self

    def _epoch_need(self, order: np.ndarray | None) -> tuple[dict[str, list[tuple[int, int]]] | None, tuple | None,
                                                            str | None]:
        """The byte ranges the sampler's whole epoch reads (:meth:`_byte_ranges` of its positions), for the
        pipeline's widened requests (:func:`lerobot_sql.pipeline.fits_cache` decides); the blocks each of its
        positions reads (``(positions, *``:meth:`_item_blocks` ``)``, :attr:`lerobot_sql.pipeline.Pipeline.blocks`);
        and the key of the positions (:func:`lerobot_sql.pipeline.positions_key`), for the sampler's ``order``
        (:func:`lerobot_sql.pipeline.sampler_order`); ``(None, None, None)`` without one, or with widening off.

        Built in the main process, once: the workers inherit it. The video indexes it needs are opened first, four
        at once (a remote one is a moov fetch each, and the workers would otherwise each build or load it on
        first use): ~40 ms of CPU for a 13,024-frame epoch besides."""
        if not _pipe.WIDEN or order is None:
            return None, None, None
        try:
            order = _pipe.wrap(order, self._n)
        except (TypeError, ValueError):  # positions that are not integers: the DataLoader raises at them
            return None, None, None
        pos = np.unique(order)
        w = self._w()

        def open_one(kc) -> None:
            with contextlib.suppress(LeRobotSQLError, OSError):  # raised by the item's own read, named
                self._video(w, *kc)

        todo = [(k, int(code)) for k in self._video_keys for code in np.unique(self._c[f"_vfile/{k}"][pos])]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(4, len(todo)))) as pool:
            list(pool.map(open_one, todo))
        need = _pipe.fits_cache(self._byte_ranges(w, pos), getattr(self._src.fs, "cache_size", None))
        blocks = None if need is None else (pos, *self._item_blocks(w, pos))
        return need, blocks, _pipe.positions_key(order)

    def _warn_outside(self, order: np.ndarray | None) -> None:
        """Warn when the pipeline's sampler's ``order`` names positions this dataset does not have (the sampler of
        another, larger dataset, say): the fetch ahead skips them, so it is silently useless, and the DataLoader
        raises IndexError when it reaches one. Nothing for an order not known here (None)."""
        if order is None or len(order) == 0 or order.dtype.kind not in "iu":
            return
        bad = (order < -len(self)) | (order >= len(self))
        if bad.any():
            warn(f"pipeline: {int(bad.sum())} of {len(order)} sampler positions are outside this dataset's "
                 f"{len(self)} samples (e.g. {int(order[bad][0])}): is it the sampler of another dataset? The "
                 "fetch ahead skips them and the DataLoader raises IndexError at them; build the sampler "
                 "on this dataset")

    def _byte_ranges(self, w: _Worker, jj: np.ndarray) -> dict[str, list[tuple[int, int]]]:
        """``{file: merged [start, end) ranges}`` the items ``jj`` read and this process has not built from yet:
        the row groups (windows' too) whose cache files do not exist, and per camera and mp4 the packets from each
        frame's keyframe run to a few packets past it (plus PyAV's read block), with the container head. The
        rule of :func:`lerobot_sql.prefetch.needed_ranges`, per batch. A file that fails to open is left out (the
        item's own read raises)."""
        out = {}
        for f, info, base, _m, own, window in self._data_rows(jj):
            rgs = set(own.tolist())
            if window is not None:
                rgs.update(info.row_groups(window[0], window[1] + 1).tolist())
            folder = w.rg_folders.get(int(f))
            if folder is None:
                folder = w.rg_folders[int(f)] = tabular.row_group_folder(self._src, info, self._cache_dir,
                                                                         self._layout)
            todo = [rg for rg in sorted(rgs) if w.views[base + rg] is None and not
                    tabular.row_group_path(self._src, info, rg, self._cache_dir, self._layout, folder).exists()]
            if todo:
                out[info.rel] = tabular.row_group_ranges(info.metadata, todo)
        for rel, vf, packets, _m, rows in self._camera_rows(w, jj):
            start, size = packets
            rows = np.unique(rows[rows >= 0])
            spans = self._spans(w, rel, vf.index, packets)
            if spans is not None:  # a gather from the file's table, built once per process
                ranges = list(zip(spans[0][rows].tolist(), spans[1][rows].tolist()))
            else:
                ranges = locate.packet_ranges(rows, vf.index.key_row, start, size, readahead=locate.AVIO_BUFFER)
            ranges.append((0, self._head_end(start)))
            out.setdefault(rel, []).extend(ranges)
        return {rel: merge_ranges(r) for rel, r in out.items()}

    @staticmethod
    def _head_end(start: np.ndarray) -> int:
        """Where an mp4's head read ends: opening reads the head (ftyp, moov) in PyAV's blocks from offset 0, up to
        the end of the block the first packet starts in. Not first packet + a block: that passed what building the
        index fetched (moov + one block) by the free and mdat headers, a 16-byte request per mp4."""
        blk = locate.AVIO_BUFFER
        return -(-(int(start.min()) + 1) // blk) * blk

    def _data_rows(self, jj: np.ndarray):
        """Per data file, the items of ``jj`` in it: yields ``(f, info, base, m, own, window)``, ``m`` a bool mask
        over ``jj``, ``own`` int64 the row group (in the file) of each item's row, ``window`` None or ``(lo,
        hi)`` int64 the file rows of the first and last row its ``delta_timestamps`` windows reach (clamped to the
        episode, as ``__getitems__`` reads them)."""
        c = self._c
        fi, slot = c["_file"][jj], c["_slot"][jj].astype(np.int64)
        idx, ep_from, ep_to = c["index"][jj].astype(np.int64), c["ep_from_index"][jj], c["ep_to_index"][jj]
        if self._delta:  # windows reach rows of neighbouring row groups
            offs = np.concatenate(list(self._delta.values()))
            q_lo = np.clip(idx + offs.min(), ep_from, ep_to - 1)
            q_hi = np.clip(idx + offs.max(), ep_from, ep_to - 1)
        for f in np.unique(fi):
            m = fi == f
            base = int(self._rg_base[int(f)])
            window = None
            if self._delta:
                row0 = c["ep_data_row0"][jj][m]
                window = (row0 + (q_lo[m] - ep_from[m]), row0 + (q_hi[m] - ep_from[m]))
            yield int(f), self._infos[int(f)], base, m, slot[m] - base, window

    def _camera_rows(self, w: _Worker, jj: np.ndarray):
        """Per camera and mp4, the items of ``jj`` that read it: yields ``(rel, video file, packets, m, rows)``,
        ``m`` a bool mask over ``jj``, ``rows`` int64 (m.sum(), T) the video rows each item decodes (T = 1, or the
        window's length for a ``delta_timestamps`` camera; -1: none). The frame rule of ``__getitems__`` (a
        window's neighbours clamped to the episode, then the nearest row). A file whose index fails to open, or
        whose packets' positions are unknown, is left out (the item's own read raises)."""
        c = self._c
        idx, ep_from, ep_to = c["index"][jj].astype(np.int64), c["ep_from_index"][jj], c["ep_to_index"][jj]
        fps = float(self._layout.fps)
        for k in self._video_keys:
            codes = c[f"_vfile/{k}"][jj]
            # the items' frame times (a window's clamped neighbours too) once per camera, not per mp4
            vpos = c[f"_vpos/{k}"][jj]
            if k in self._delta:  # data timestamps are on the fps grid
                q = np.clip(idx[:, None] + self._delta[k][None, :], ep_from[:, None], ep_to[:, None] - 1)
                t_all = locate.time_in_file(c[f"{k}/from_timestamp"][jj][:, None], c["timestamp"][jj][:, None]) \
                    + (q - idx[:, None]) / fps
            for code in np.unique(codes):
                rel = self._video_files[k][int(code)]
                try:
                    vf = self._video(w, k, int(code))
                    packets = self._packets(w, rel, vf.index)
                except (LeRobotSQLError, OSError):
                    continue
                if packets is None:
                    continue
                m = codes == code
                if k in self._delta and self.align == "frame_index":  # the items' own rule (never-served rows < 0)
                    rows = locate.rows_by_position(vf.index.pts_s, vf.first[vpos[m]][:, None],
                                                   q[m] - ep_from[m][:, None], (ep_to[m] - ep_from[m])[:, None],
                                                   c[f"{k}/from_timestamp"][jj[m]][:, None], fps)
                elif k in self._delta:
                    rows = locate.nearest(vf.index.pts_s, t_all[m].ravel())[0].reshape(int(m.sum()), -1)
                else:
                    rows = vf.rows[vpos[m]][:, None]
                yield rel, vf, packets, m, rows

    def _item_blocks(self, w: _Worker, jj: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Which ``pipeline.WIDEN``-aligned blocks of which files each item of ``jj`` reads: ``(files, offsets,
        keys)``, item ``i``'s blocks ``keys[offsets[i]:offsets[i + 1]]`` (sorted, unique; ``file << 32 | block``,
        ``file`` an index into ``files``). For the pipeline's jobs (:meth:`lerobot_sql.pipeline._Here.block_missing`):
        planned for the whole epoch at once in the main process (numpy passes over every item, ~20x cheaper per
        item than a plan per batch), so that a job only gathers its items' blocks.

        An item's extent per file covers what it reads: its row groups (a window's too) from the first one's first
        column chunk to the last one's end; per mp4 the packets of its rows' spans (:func:`locate.packet_spans`)
        and the container head. The blocks are only where to look: what is fetched is the epoch's need within them
        (so a coarse extent fetches nothing extra)."""
        files: dict[str, int] = {}
        parts: list[tuple[np.ndarray, np.ndarray]] = []

        def add(rel: str, items: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            keep = b > a
            items, a, b = items[keep], a[keep], b[keep]
            if not len(items):
                return
            fid = files.setdefault(rel, len(files))
            lo, hi = a // _pipe.WIDEN, (b - 1) // _pipe.WIDEN
            cnt = hi - lo + 1
            first = np.repeat(np.cumsum(cnt) - cnt, cnt)
            blk = np.repeat(lo, cnt) + (np.arange(int(cnt.sum()), dtype=np.int64) - first)
            parts.append((np.repeat(items, cnt), (np.int64(fid) << 32) | blk))

        for _f, info, _base, m, own, window in self._data_rows(jj):
            ext = np.asarray(tabular.row_group_ranges(info.metadata, range(len(info.rg_offsets) - 1)), np.int64)
            lo = hi = own
            if window is not None:
                lo, hi = np.minimum(own, info.locate(window[0])[0]), np.maximum(own, info.locate(window[1])[0])
            add(info.rel, np.flatnonzero(m), ext[lo, 0], ext[hi, 1])
        for rel, vf, packets, m, rows in self._camera_rows(w, jj):
            items = np.flatnonzero(m)
            ok = rows >= 0
            r = np.where(ok, rows, 0)
            spans = self._spans(w, rel, vf.index, packets)
            if spans is not None:
                a, b = spans[0][r], spans[1][r]
            else:  # long keyframe runs: the rule row by row (once per epoch, in the main process)
                pr = np.asarray(locate.packet_ranges(r.ravel(), vf.index.key_row, *packets,
                                                     readahead=locate.AVIO_BUFFER), np.int64).reshape(*r.shape, 2)
                a, b = pr[..., 0], pr[..., 1]
            big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
            add(rel, items, np.where(ok, a, big).min(axis=1), np.where(ok, b, small).max(axis=1))
            add(rel, items, np.zeros(len(items), np.int64), np.full(len(items), self._head_end(packets[0])))
        n = len(jj)
        if not parts:
            return list(files), np.zeros(n + 1, np.int64), np.zeros(0, np.int64)
        item = np.concatenate([p[0] for p in parts])
        key = np.concatenate([p[1] for p in parts])
        o = np.lexsort((key, item))
        item, key = item[o], key[o]
        keep = np.ones(len(key), bool)
        keep[1:] = (item[1:] != item[:-1]) | (key[1:] != key[:-1])
        item, key = item[keep], key[keep]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(item, minlength=n), out=offsets[1:])
        return list(files), offsets, key

    def _spans(self, w: _Worker, rel: str, index: video_index.FrameIndex, packets) -> tuple | None:
        """:func:`lerobot_sql._readers.locate.packet_spans` of mp4 ``rel`` (every row's packet range, the
        demuxer's block included), once per process; None for a file with long keyframe runs."""
        if rel not in w.spans:
            w.spans[rel] = locate.packet_spans(index.key_row, *packets, readahead=locate.AVIO_BUFFER)
        return w.spans[rel]

    def _packets(self, w: _Worker, rel: str, index: video_index.FrameIndex):
        """(byte_offset, byte_size) int64 (n,) of mp4 ``rel``'s packets in ``index``'s row order (from its mapped
        Arrow form, or the Parquet form for an Arrow form cached without them), or None when unknown (a packet
        without a position)."""
        if rel not in w.packets:
            if index.byte_offset is not None:  # in the mapped Arrow form: no second demux for the Parquet form
                start, size, pts = index.byte_offset, index.byte_size, index.pts
            else:  # an Arrow form cached before it carried them
                t = pq.read_table(video_index.ensure_index(self._src, rel, self._cache_dir),
                                  columns=["pts", "byte_offset", "byte_size"])
                start, size, pts = t["byte_offset"].to_numpy(), t["byte_size"].to_numpy(), t["pts"].to_numpy()
            ok = len(start) == len(index.pts) and bool((pts == index.pts).all()) and \
                len(start) and start.min() >= 0
            w.packets[rel] = (start, size) if ok else None
        return w.packets[rel]

    def _decode_batch(self, w: _Worker, key: str, codes: np.ndarray, files: dict, rows: np.ndarray,
                      mem=None) -> torch.Tensor:
        """Camera ``key``'s frames for a batch: one ``decode_chw`` per mp4 (``codes[j]`` the file of item j,
        ``rows`` (B, T) its video rows), written into one (B, T, 3, H, W) batch tensor (uint8, or float32 in
        [0, 1]; a depth map's (B, T, 1, H, W) float32, dequantized in place over the whole batch, element for
        element what ``__getitem__`` computes); (B, 3, H, W) unless ``key`` is a delta key with T > 1, as
        ``__getitem__``'s shapes."""
        b, t = rows.shape
        depth = self._depth_video.get(key)
        direct = self.return_uint8 and depth is None
        out = na = None
        if len(files) == 1 and direct:  # one mp4 for the whole batch (and no conversion): decode into the batch
            made = []

            def alloc(shape, dtype):
                made.append(_batch_tensor((b, t, *shape[1:]), torch.uint8, mem))
                return made[0].numpy().reshape(shape)

            w.decoders.decode_chw(files[next(iter(files))].index, rows.reshape(-1), alloc=alloc)
            out = made[0]
            return out if (key in self._delta and t > 1) else out[:, 0]
        for code in sorted(files):
            m = np.flatnonzero(codes == code)
            arr = w.decoders.decode_chw(files[code].index, rows[m].reshape(-1))
            if out is None:
                out = _batch_tensor((b, t, *arr.shape[1:]), torch.uint8 if direct else torch.float32, mem)
                na = out.numpy()
            arr = arr.reshape(len(m), t, *arr.shape[1:])
            if direct or depth is not None:
                na[m] = arr  # depth: uint16 codes into float32, exact (lerobot's .to(torch.float32))
            elif len(m) == b:  # the whole batch from this mp4: convert straight into the batch tensor
                np.true_divide(arr, np.float32(255), out=na, dtype=np.float32)  # = _to_unit_float, no temporary
            else:
                na[m] = _to_unit_float(arr)
        if depth is not None:
            _dequantize_(out, depth, self.depth_output_unit)
        return out if (key in self._delta and t > 1) else out[:, 0]

    def _batch_indices(self, indices) -> np.ndarray:
        """``indices`` as int64 positions in [0, n), checked as ``__getitem__`` checks one index."""
        try:
            ii = np.fromiter((item_index(i) for i in indices), np.int64)
        except TypeError:
            ii = None
        n = self._n
        if ii is None or len(ii) and (ii.min() < -n or ii.max() >= n):
            for i in indices:  # raises __getitem__'s TypeError / IndexError for the first bad index
                self.__getitem__(i)
        return ii % n if len(ii) else ii

    def __repr__(self) -> str:
        return (f"LeRobotSQLDataset({self._src.url!r}, samples={len(self)}, fps={self.fps:g}, "
                f"cameras={self._video_keys + [k for k in self._layout.image_keys if k not in self._skip_columns]}, "
                f"delta_timestamps={sorted(self._delta)})")



class BatchItem(dict):
    """One item of a :class:`Batch`: a plain dict of the item's values (its type tells ``default_collate`` that
    the batch it came from is already collated)."""

    __slots__ = ()


class Batch(list):
    """What ``LeRobotSQLDataset.__getitems__`` returns: a list of B items (what torch documents ``__getitems__``
    to return and a ``collate_fn`` to receive), that also holds their collated batch.

    ``batch[j]`` is item j as a dict (its tensors are views of the batch tensors: keeping one item keeps the
    batch's memory alive, and ``torch.save`` of a view writes the whole batch tensor; ``.clone()`` what you keep).
    ``default_collate(batch)`` returns the collated dict without re-stacking (see ``_collate_batch``).
    """

    def __init__(self, keys: list[str], tensors: dict[str, torch.Tensor], lists: dict[str, list], n: int,
                 memory=None):
        # unbind: one call per key for all B views (indexing per item cost ~2x as much)
        per = {k: tensors[k].unbind(0) if k in tensors else lists[k] for k in keys}
        super().__init__(BatchItem((k, per[k][j]) for k in keys) for j in range(n))
        self.keys, self.tensors, self.lists = keys, tensors, lists
        self._memory = memory  # the worker's batch slot (lerobot_sql.batch_memory), None elsewhere

    def __reduce__(self):
        # Pickled when a collate_fn returns the items as they are (``collate_fn=lambda items: items``) from a worker:
        # a plain list of the item dicts, which torch sends as it sends any list of tensors. The batch's own
        # attributes (the worker's memory slot, its lock) cannot cross processes: pickling failed in the worker's
        # queue thread and the DataLoader would wait forever.
        return list, (list(self),)

    def collated(self, collate_fn_map) -> dict[str, Any]:
        """``default_collate`` of the items: the batch tensors as they are, the other keys collated by torch."""
        from torch.utils.data._utils.collate import collate

        out = {k: self.tensors[k] if k in self.tensors else collate(self.lists[k], collate_fn_map=collate_fn_map)
               for k in self.keys}
        return out if self._memory is None else self._memory.wrap(out)


def _collate_batch(batch, *, collate_fn_map=None):
    """``default_collate``'s rule for :class:`BatchItem`: a whole ``Batch`` (torch's fetcher passes what
    ``__getitems__`` returned) is already collated; anything else (a list of items taken out of batches, or a
    caller's own collate map) goes through torch's generic dict rule."""
    from torch.utils.data._utils.collate import collate, default_collate_fn_map

    if isinstance(batch, Batch) and collate_fn_map is default_collate_fn_map:
        return batch.collated(collate_fn_map)
    return collate([dict(x) for x in batch], collate_fn_map=collate_fn_map)


def _register_collate() -> None:
    # torch >= 1.13 dispatches default_collate on the first element's exact type through this public registry
    # (documented in torch.utils.data._utils.collate.collate); older torch never calls __getitems__ either.
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:
        return
    default_collate_fn_map.setdefault(BatchItem, _collate_batch)


_register_collate()


def _np_torch(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _batch_tensor(shape: tuple, dtype: torch.dtype, mem=None) -> torch.Tensor:
    """An uninitialised batch tensor; in a DataLoader worker in shared memory (``mem``: the worker's recycled batch
    slot, :mod:`lerobot_sql.batch_memory`; else new shared memory, as ``default_collate`` allocates its stacks),
    so the batch crosses to the main process without a copy."""
    if mem is not None:
        return mem.tensor(tuple(shape), dtype)
    return torch.empty(shape, dtype=dtype)


def _check_positions(manifest: pa.Table) -> None:
    """Refuse, for ``align="frame_index"``, samples whose ``frame_index`` is not their position in the episode
    (``index - ep_from_index``): frames are read by position, so the item's frame_index must name the frame it
    carries. One vectorised pass over the manifest.

    Raises:
        DatasetFormatError: naming the first such episode, its index and frame_index, and the fix.
    """
    fi = manifest["frame_index"].to_numpy()
    pos = manifest["index"].to_numpy() - manifest["ep_from_index"].to_numpy()
    bad = np.flatnonzero(fi != pos)
    if len(bad):
        j = int(bad[0])
        ep = manifest["episode_index"][j].as_py()
        raise DatasetFormatError(
            f"episode {ep}: the row with index {int(manifest['index'][j].as_py())} has frame_index {int(fi[j])}, but "
            f"it is frame {int(pos[j])} of the episode (index - the episode's first index; {len(bad)} such rows "
            "selected): align=\"frame_index\" reads each row's frame by its position, so the item would carry a "
            "frame_index that is not its frame's. Fix the data files' frame_index (`lerobot-sql doctor`: "
            "frame_index_contiguous), or read by time (align=\"timestamp\")")


def item_index(i: Any) -> int:
    """``ds[i]``'s ``i`` as an int: a Python or numpy integer, or a 0-d integer tensor / array.

    Raises:
        TypeError: anything else, naming it: a float (1.0) or "1" is a mistake; a bool (True is 1 to Python) or a
            one-element array / tensor (``torch.tensor([3])`` converts to 3) would silently pick a sample.
    """
    i_ok = as_int(i)
    if i_ok is None:
        shape = f" of shape {tuple(i.shape)}" if isinstance(i, (torch.Tensor, np.ndarray)) else ""
        raise TypeError(f"dataset indices must be integers (Python, numpy, or a 0-d integer tensor) or slices (as "
                        f"LeRobotDataset), not {type(i).__name__}{shape} {i!r:.80}; for several samples use ds[a:b], "
                        "[ds[j] for j in ...] or a DataLoader")
    return i_ok


def _extra_value(v, ltype: torch.dtype | None):
    """A query's non-numeric extra column value as an item carries it: a list of numbers as a 1-D tensor of the
    list's value dtype (NULL elements become NaN, as float64); anything else (text, None, other lists) as is."""
    if isinstance(v, list) and v and all(isinstance(x, (int, float, bool)) for x in v):
        return torch.tensor(v, dtype=ltype) if ltype is not None else torch.tensor(v)
    if isinstance(v, list) and v and ltype is not None and all(x is None or isinstance(x, (int, float)) for x in v):
        return torch.tensor([float("nan") if x is None else x for x in v], dtype=torch.float64)
    return v


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _torch_dtype(t: pa.DataType) -> torch.dtype:
    """The torch dtype holding Arrow number type ``t`` exactly (float16/32/64, int8..64, uint8, bool; wider
    unsigned ints as int64, which holds every count a query gives)."""
    np_dtype = np.dtype(t.to_pandas_dtype())
    if np_dtype.kind == "u" and np_dtype.itemsize > 1:
        np_dtype = np.dtype(np.int64)
    return torch.from_numpy(np.zeros(0, np_dtype)).dtype


def _codes(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    enc = column.combine_chunks().dictionary_encode()
    return enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False).astype(np.int32)


def _hw_axes(feature) -> tuple[int, int] | None:
    """The axes of height and width in a camera feature's info.json shape: [H, W, C] (lerobot's) -> (0, 1), or
    [C, H, W] when its names start with a channel, or, without names, when only the first side looks like a channel
    count (older writers) -> (1, 2); [H, W] -> (0, 1); None when the shape says nothing usable."""
    shape = [int(x) for x in feature.shape if isinstance(x, (int, np.integer))]
    if len(shape) != len(feature.shape) or len(shape) not in (2, 3):
        return None
    if len(shape) == 2:
        return 0, 1
    names = feature.names if isinstance(feature.names, list) else []
    chw = str(names[0]).startswith("channel") if names else shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4)
    return (1, 2) if chw else (0, 1)


def _declared_hw(feature) -> set[tuple[int, int]] | None:
    """The (height, width) a camera feature's info.json shape allows (axes: :func:`_hw_axes`); None when the shape
    says nothing usable (then no check)."""
    axes = _hw_axes(feature)
    if axes is None:
        return None
    return {(int(feature.shape[axes[0]]), int(feature.shape[axes[1]]))}


_MM_PER_METRE = 1000.0  # lerobot.datasets.depth_utils.MM_PER_METRE
_DEPTH_QMAX = 4095      # lerobot.configs.video.DEPTH_QMAX: 12-bit codes


def _depth_unit(feature) -> str | None:
    """The recorded unit of depth image ``feature`` ("mm" / "m"), or None (lerobot returns the values as they are,
    and warns; so does this, once per dataset).

    Raises:
        DatasetFormatError: ``info.depth_unit`` is something else (lerobot would divide it by 1000 as if mm).
    """
    unit = feature.depth_unit
    if unit is None:
        warn(f"depth map {feature.name!r} has no info.depth_unit in meta/info.json: its values are returned "
             "as stored, not converted to depth_output_unit (as lerobot 0.6 does); set depth_unit to "
             "'mm' or 'm' to convert them")
    elif unit not in ("mm", "m"):
        raise DatasetFormatError(f"depth map {feature.name!r}: info.depth_unit is {unit!r}; lerobot 0.6 knows 'mm' "
                                 "and 'm' only. Fix it in meta/info.json")
    return unit


def _dequantize_(buf: torch.Tensor, q: dict, unit: str) -> torch.Tensor:
    """lerobot 0.6.1's ``dequantize_depth`` (its torch path, which its reader takes), in place on ``buf``: float32
    12-bit codes, any shape, become depth in ``unit`` ("mm": whole millimetres, float32; "m": metres).

    Op for op as lerobot (``mul_(scale).add_(offset)``, ``exp_().sub_(shift)`` with ``use_log``, ``clamp_(min,
    max)``, then for mm ``mul_(1000).round_().clamp_(0, 65535)``), with the scale and offset computed in Python
    floats as there: the same torch kernels give the same float32 bits (numpy's scalar promotion and its exp are
    other code, never checked equal). Checked against lerobot's items: tests/test_dataset.py."""
    lo, hi, shift = float(q["depth_min"]), float(q["depth_max"]), float(q["shift"])
    if q["use_log"]:
        log_min, log_max = math.log(lo + shift), math.log(hi + shift)
        scale, offset = (log_max - log_min) / _DEPTH_QMAX, log_min
    else:
        scale, offset = (hi - lo) / _DEPTH_QMAX, lo
    buf.mul_(scale).add_(offset)
    if q["use_log"]:
        buf.exp_().sub_(shift)
    buf.clamp_(lo, hi)
    if unit == "m":
        return buf
    return buf.mul_(_MM_PER_METRE).round_().clamp_(0.0, 65535)


def _to_unit_float(arr: np.ndarray) -> np.ndarray:
    """float32(u8) / 255, bit for bit what lerobot's ``frames.type(torch.float32) / 255`` gives (IEEE division is
    correctly rounded in both). numpy runs it on the calling thread: torch would hand a 36k-element op to its
    intra-op pool, whose wake-ups cost milliseconds on a busy 2-core machine."""
    return np.true_divide(arr, np.float32(255), dtype=np.float32)


def _groups(codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): ``order[starts[c]:starts[c + 1]]`` are the positions holding code ``c``, ascending.
    A stable sort, linear on the usual already-grouped codes."""
    order = np.argsort(codes, kind="stable").astype(np.int32)  # manifests stay far below 2**31 rows
    starts = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=k))]).astype(np.int64)
    return order, starts


def _map_table(manifest: pa.Table, derived: dict[str, np.ndarray], cache_dir: Path) -> "_SampleFile":
    """Write the manifest and the derived per-sample arrays to one named Arrow IPC file (``_SampleFile``).

    The file lives in ``<cache>/manifests`` (or the system temp folder when the cache is read-only) while the
    dataset that wrote it lives: its pages are file-backed, so forked DataLoader workers share them through the
    page cache, and spawned/forkserver workers, which get the dataset pickled, map the same file by name. Before
    writing, files whose writer is gone (killed before cleanup: its lock is free) are removed.

    Raises:
        CacheError: neither the cache folder nor the temp folder can hold the file.
    """
    d = cache_dir / "manifests"
    full = manifest.combine_chunks()
    for name, arr in derived.items():
        full = full.append_column(name, pa.array(arr))
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=_map_prefix(), suffix=".arrow")
    except OSError:
        # A read-only cache with complete entries stays usable: this file is transient.
        d = Path(tempfile.gettempdir())
        try:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=_map_prefix(), suffix=".arrow")
        except OSError as e:
            raise CacheError(f"{cache_dir / 'manifests'}: cannot write the per-sample file ({e}); the cache folder "
                             "is full or not writable, set LSQL_CACHE_DIR (or connect(..., cache_dir=...)) to a "
                             "writable folder") from e
    _hold(fd)  # before anything else: a sweeping process must see the file as live from its first moment
    _sweep_maps(d, keep=tmp)
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, full.schema) as w:
            w.write_table(full)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
            os.close(fd)
        raise CacheError(f"{d}: cannot write the per-sample file ({e}); the cache folder is full or not writable, "
                         "set LSQL_CACHE_DIR (or connect(..., cache_dir=...)) to a writable folder with room") from e
    return _SampleFile(tmp, owner=True, fd=fd)


_MAP_TAG = "lsql-samples"
_MAPS: "weakref.WeakValueDictionary[str, _SampleFile]" = weakref.WeakValueDictionary()  # this process's own files


def _map_prefix() -> str:
    """``lsql-samples-<host>-<pid>-``: who wrote the file, so a later run can tell a leftover from a live file."""
    host = "".join(ch if ch.isalnum() else "_" for ch in socket.gethostname())[:40] or "host"
    return f"{_MAP_TAG}-{host}-{os.getpid()}-"


_YOUNG_S = 60.0  # a file this new may not hold its writer's lock yet (created, not yet locked): never swept


def _hold(fd: int) -> None:
    """Take an exclusive ``flock`` on the per-sample file for the life of the dataset: the kernel releases it when
    the writer exits in any way (SIGKILL included), so another process (another container sharing the cache and
    the hostname, too) tells a live file from a leftover without trusting pids. Where ``flock`` does not exist
    (Windows) or the filesystem refuses it, the pid rule of :func:`_sweep_maps` applies."""
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ImportError, OSError):
        pass


def _leftover(path: Path, name: str, host_prefix: str) -> bool:
    """Whether ``path`` (a per-sample file) belongs to no live process: its writer's lock is free, or (no locks
    here) it names this host and a pid that does not run. Files younger than ``_YOUNG_S`` are never leftovers."""
    import time

    try:
        if time.time() - path.stat().st_mtime < _YOUNG_S:
            return False
    except OSError:
        return False
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
    except ImportError:
        fd = None
    except OSError:
        return False
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True  # nobody holds it: the writer is gone
        except BlockingIOError:
            return False
        except OSError:
            pass  # no locks on this filesystem: the pid rule below
        finally:
            os.close(fd)
    if not name.startswith(host_prefix):
        return False  # another host's pid means nothing here
    pid = name[len(host_prefix):].split("-", 1)[0]
    return pid.isdigit() and not _alive(int(pid))


def _sweep_maps(d: Path, keep: str) -> None:
    """Remove per-sample files in ``d`` whose writer has exited (a crash or kill skips the finalizer; on Windows
    the finalizer cannot delete a file still mapped): see :func:`_leftover`."""
    host_prefix = _map_prefix().rsplit("-", 2)[0] + "-"
    with contextlib.suppress(OSError):
        for name in os.listdir(d):
            if not (name.startswith(_MAP_TAG + "-") and name.endswith(".arrow")) or str(d / name) == keep:
                continue
            if _leftover(d / name, name, host_prefix):
                with contextlib.suppress(OSError):
                    os.unlink(d / name)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (another user's), or cannot tell: keep its file
    return True


def _remove_map(path: str, pid: int, fd: int | None) -> None:
    # Only the writing process deletes: a forked worker inherits this finalizer with the dataset, and must never
    # take the file from under the parent and its other workers.
    if os.getpid() == pid:
        with contextlib.suppress(OSError):  # Windows refuses while mapped: the next run's sweep removes it
            os.unlink(path)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # releases the lock


class _SampleFile:
    """The per-sample file of a dataset (manifest + derived arrays, Arrow IPC), shared by name.

    The writing process owns it and holds an exclusive ``flock`` on it while it lives (so other processes can tell
    a leftover: :func:`_leftover`): a finalizer deletes it when the last object holding it there is collected,
    on ``close()``, or at interpreter exit, never in another process (forked children inherit the finalizer but
    fail its pid check; spawned ones only ever receive the name). It pickles as its path: unpickled in the owner
    process (``copy.deepcopy``, ``pickle`` round trips) it is the owner's object, so the file lives while any copy
    does; elsewhere a non-owning handle. Several datasets and processes never share a file (each name is unique).
    """

    def __init__(self, path: str, owner: bool, fd: int | None = None):
        self.path = path
        self._fin = weakref.finalize(self, _remove_map, path, os.getpid(), fd) if owner else None
        if owner:
            _MAPS[path] = self

    def read(self) -> pa.Table:
        """The file's table, memory-mapped (zero-copy).

        Raises:
            CacheError: the file is gone: its owner dataset was closed or collected (or its cache folder was
                cleaned) before this copy of the dataset was unpickled.
        """
        try:
            return pa.ipc.open_file(pa.memory_map(self.path, "r")).read_all()
        except FileNotFoundError as e:
            raise CacheError(f"{self.path}: the dataset's per-sample file is gone; a pickled dataset (a spawned "
                             "DataLoader worker's copy) maps the file of the dataset it was pickled from, which "
                             "must stay alive (not closed, not collected, its cache folder not cleaned) while "
                             "copies start. Build the dataset again (db.dataset(...))") from e
        except OSError as e:
            raise CacheError(f"{self.path}: cannot map the dataset's per-sample file ({e})") from e

    def close(self) -> None:
        if self._fin is not None:
            self._fin()

    def __reduce__(self):
        return (_attach_map, (self.path,))


def _attach_map(path: str) -> _SampleFile:
    own = _MAPS.get(path)
    return own if own is not None else _SampleFile(path, owner=False)
