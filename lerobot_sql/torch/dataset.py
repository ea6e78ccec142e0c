"""The torch ``Dataset`` over a manifest: items equal to ``LeRobotDataset.__getitem__`` for the same frames.

One job: item assembly (options, ``__getitem__`` / ``__getitems__``, pickling, the properties lerobot reads). No
SQL runs here. Construction only does vectorised bookkeeping over the manifest (the per-sample table,
:mod:`lerobot_sql.torch._samples`); row groups are read and video indexes built on first use, by whichever
process reads the item (DataLoader workers included), each process with its own maps and decoders
(:mod:`lerobot_sql.torch._worker`). How stored values become item values: :mod:`lerobot_sql.torch._values`; what a
batch is and where its memory lives: :mod:`lerobot_sql.torch.batch`; the remote fetch ahead:
:mod:`lerobot_sql.torch.pipeline`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import torch

from .._format import depth
from .._format.files import DatasetFiles
from .._format.layout import check_item_keys
from .._plan.manifest import Meta, check_source
from .._readers import decode, deltas, locate, regrid, row_group_store, tabular, video_index
from ..errors import DatasetFormatError, as_int
from . import _samples, _values, _worker
from . import batch as _batch
from . import meta as _meta
from . import pipeline as _pipe
from ._worker import DECODER_THREADS_MAX, check_decoder_options  # noqa: F401  (importable from here)
from .batch import Batch, BatchItem, batch_tensor, begin, decode_frames  # noqa: F401  (BatchItem: importable here)


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
    (open mp4s kept per worker, default 64, within ``$LSQL_DECODER_MB`` megabytes, default 512), ``seek_reach`` (frames a keyframe may lie ahead before a seek beats decoding
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
                 decoder_threads: int = 1, parallel_cameras: bool | str = "auto", max_open_decoders: int = 64,
                 seek_reach: int = 2, stats: Callable[[], dict] | None = None, depth_output_unit: str = "mm",
                 align: str = "timestamp", _kept: "_samples.SampleFile | None" = None, _keep: Path | None = None,
                 _episodes: tuple | None = None, _grid: regrid.Grid | None = None):
        # _kept / _keep (db.dataset, whole episodes: lerobot_sql.torch._selections): the selection cache's file of
        # this manifest to map, or the path to keep the one built here at. _episodes (db.dataset, whole episodes of
        # a large selection: lerobot_sql._plan.resolve.episode_runs): (episodes, footers, frame rules) of a
        # selection opened without its frames; ``manifest`` is then its zero-row manifest (the metadata). _grid
        # (db.dataset(fps=...)): the lower frame rate the samples are served at (lerobot_sql._readers.regrid), the
        # manifest then holds the source frames on its grid only.
        # A manifest built from (or written by) another dataset names that dataset's rows: refused, whoever builds
        # this (db.dataset checks files and tables itself; ShardedManifestDataset, ray_data and direct use did not).
        check_source(manifest, "the manifest given to LeRobotSQLDataset", files.source.url, files.layout,
                     require=True)
        # The task texts are read here, in the main process, before any worker starts (once per DatasetFiles).
        layout = files.layout
        self._src, self._layout, self._tasks, self._cache_dir = files.source, layout, files.tasks(), files.cache_dir
        self._files = files
        # info.json's own value, as lerobot's ds.fps (an int in lerobot-written data); layout.fps is its float. At
        # another frame rate, that rate: frames, windows and meta are the recording at it (regrid)
        self._grid = _grid
        self.fps = layout.info.get("fps", layout.fps) if _grid is None else _grid.fps
        if _grid is not None:
            regrid.on_grid(manifest, _grid.stride, "index", "the manifest given with a grid")  # (db.dataset's own)
        self.tolerance_s = locate.check_tolerance(tolerance_s)
        self.align = locate.check_align(align)
        # The settings items read (in DataLoader workers too), checked here, where a bad value is named at the open
        # and not from a worker's first item: SettingError
        tabular.row_group_budget(), row_group_store.budget(), decode.decoder_budget(), _batch.enabled()
        # By time, only a tolerance beyond half a frame lets a timestamp off the grid match another row's frame of a
        # clip on the grid (locate.keep_own_frame); below it, the manifest's grid check already rules that out.
        self._own_frames = self.tolerance_s > 0.5 / float(layout.fps)
        if self.align == "frame_index":
            _samples.check_positions(manifest)
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
        if depth_output_unit not in depth.UNITS:
            raise ValueError(f"depth_output_unit must be 'mm' or 'm' (lerobot 0.6's choices), not "
                             f"{depth_output_unit!r}")
        self.depth_output_unit = depth_output_unit
        # depth video key -> its quantizer; depth image key -> the unit it was recorded in (None: returned as is)
        self._depth_video = {k: layout.features[k].depth_quantization for k in cameras
                             if layout.features[k].is_depth_map and layout.features[k].is_video}
        self._depth_image = {k: _values.depth_unit(layout.features[k]) for k in cameras
                             if layout.features[k].is_depth_map and layout.features[k].is_image}
        self._video_keys = [k for k in layout.video_keys if k in cameras]
        self._depth_keys = set(self._depth_video) | set(self._depth_image)
        self._skip_columns = {k for k in layout.image_keys if k not in cameras}
        self.delta_timestamps = delta_timestamps
        # frame offsets in the source's frames; at another frame rate the seconds are on its grid (multiples of
        # 1 / fps), each of its frames `stride` source frames
        self._delta = deltas.delta_indices(delta_timestamps, layout.fps, self.tolerance_s, layout.features) \
            if _grid is None else {k: v * _grid.stride for k, v in deltas.delta_indices(
                delta_timestamps, _grid.fps, self.tolerance_s, layout.features).items()}
        check_item_keys(layout, cameras, self._delta, files.source.url)  # a feature named task or <key>_is_pad
        self._meta = Meta.of(manifest)  # parsed once: the extras and the clips to check
        unchecked = [k for k in self._video_keys if self._meta.cameras is not None and k not in self._meta.cameras]
        if unchecked:  # its pointers may be null and its clips were never checked
            raise ValueError(f"the manifest was resolved for cameras {list(self._meta.cameras)} only, so it cannot "
                             f"serve {unchecked}: pass cameras={list(self._meta.cameras)}, or resolve it again with "
                             f"db.manifest(sql, cameras={list(self._video_keys)})")
        self._extras = list(self._meta.extras)
        self._prepare(manifest, _kept, _keep, _episodes)
        self._worker: _worker.Worker | None = None
        self._pipeline: _pipe.Pipeline | None = None
        self._stats_fn = stats  # ds.meta.stats: called once, on first use (db.dataset passes the Database's)
        self._owner_pid = os.getpid()  # only this process may call it: DuckDB does not survive a fork
        self._meta_obj: _meta.SelectionMetadata | None = None

    def _prepare(self, m: pa.Table, kept: "_samples.SampleFile | None" = None, keep: Path | None = None,
                 episodes: tuple | None = None) -> None:
        """The per-sample table (:class:`lerobot_sql.torch._samples.SampleTable`: the samples as runs of consecutive
        rows of a row group, each sample's values computed from its run; the manifest in one shared mapped file),
        each mp4's version stamp, and the item's columns. Nothing is built or decoded here (see
        :mod:`lerobot_sql.torch._worker`)."""
        if kept is not None:
            self._samples = s = _samples.SampleTable.load(self._src, kept)
        else:
            if episodes is not None:
                self._samples = s = _samples.SampleTable.from_episodes(self._src, m, *episodes, self._video_keys,
                                                                       self._cache_dir, keep=keep)
            else:
                self._samples = s = _samples.SampleTable(self._src, m, self._video_keys, self._cache_dir, keep=keep)
            if keep is not None:
                from . import _selections

                _selections.evict(keep.parent, keep)
        self._n = s.n
        # each mp4's version stamp (checked before any process indexes or decodes it), its declared frame size
        self._video_pins, self._video_declared = _worker.pin_videos(self._src, self._layout, s.video_files)
        self._clips = {k: v for k, v in self._meta.clips.items() if k in self._video_keys}
        self._gray_files = frozenset(rel for k in self._depth_video for rel in s.video_files[k])
        self._extra_cols = _values.extra_columns(s.manifest, self._extras)
        # Columns and their kinds from the first data file's schema: the columns of every row group read.
        schema = s.infos[0].schema
        self._columns = [c for c in schema.names if c not in self._skip_columns]
        self._plain = [(c, "image" if c in self._layout.image_keys else
                        "num" if tabular.is_numeric(schema.field(c), self._layout) else "other")
                       for c in self._columns if c not in self._delta]
        self._images = _values.ImageCells(self._layout, self._depth_image)

    @property
    def files(self) -> DatasetFiles:
        """The dataset's files this dataset reads (source, layout, cache folder, tasks), as ``db.files``."""
        return self._files

    @property
    def manifest(self) -> pa.Table:
        """The manifest this dataset reads: one row per sample (columns: :mod:`lerobot_sql._plan.manifest`), a
        zero-copy view of its per-sample file. A whole-episode or window selection of more than
        ``$LSQL_LAZY_FRAMES`` frames (default 2,000,000) is opened without its frames: its manifest is built here
        on each call, reading every selected row group's frame columns (seconds and ~100 bytes a sample at
        millions of samples).

        Raises:
            DatasetFormatError: (such a selection) a frame fails the checks the open left to its row group.
        """
        s = self._samples
        return s.manifest if not s.lazy else s.full_manifest()

    def _use_parallel(self) -> bool:
        if self._parallel_cameras != "auto":
            return bool(self._parallel_cameras)
        if torch.utils.data.get_worker_info() is not None:
            return False  # DataLoader workers already keep the cores busy
        shape = self._layout.features[self._video_keys[0]].shape if self._video_keys else (0, 0)
        return (os.cpu_count() or 1) > 1 and int(shape[0]) * int(shape[1]) >= 240 * 320

    def _w(self) -> _worker.Worker:
        return _worker.current(self)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_worker"] = None  # maps, indexes and decoders are re-opened in the receiving process
        # The manifest (~100 bytes a sample) travels as the name of its file (SampleTable pickles so): a spawned or
        # forkserver worker maps the pages a forked one shares, instead of unpickling a private copy (1 GB at 10M
        # samples). The extras are views of that file too, made again on arrival.
        state.pop("_extra_cols", None)
        # The statistics function holds the Database (DuckDB does not pickle, nor cross a fork): a copy keeps the
        # numbers if they were computed, else says where to compute them (SelectionMetadata.__getstate__).
        state["_stats_fn"] = _meta.stats_unavailable if self._stats_fn is not None else None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._extra_cols = _values.extra_columns(self._samples.manifest, self._extras)

    def close(self) -> None:
        """Delete the per-sample file now (it is otherwise deleted when the last dataset sharing it is collected,
        or at exit). This process keeps reading items (its mapping stays valid); DataLoader workers started
        afterwards with ``spawn``/``forkserver`` cannot map it and raise CacheError, forked ones are unaffected.
        A whole-episode selection's file is an entry of the selection cache (``lerobot_sql.torch._selections``):
        it stays for the next open, and is only let go of (it may then be evicted)."""
        self._samples.close()

    # ---- what lerobot's training code reads besides items (lerobot_sql.torch.meta) ------------------------
    @property
    def meta(self) -> "_meta.SelectionMetadata":
        """What ``LeRobotDatasetMetadata`` answers, for this dataset's selection (:mod:`lerobot_sql.torch.meta`):
        ``info``, ``features``, ``fps``, ``camera_keys``, ``episodes`` (one row per run, positions in this dataset),
        ``tasks``, ``stats``, totals. Built on first use from meta/episodes (pyarrow, no DuckDB) and the headers of
        the selection's mp4s (no decoding): a camera whose files all hold another frame size than info.json's gets
        the files' size in ``features`` / ``shapes``, the size of its items, with a warning.

        Raises:
            DatasetFormatError: meta/episodes cannot be read; an mp4's frames are a decode bomb (a side over 8192,
                or 64 x info.json's pixel count).
        """
        if self._meta_obj is None:
            from .._format.metadata import read_episodes

            s = self._samples
            source_eps = read_episodes(self._src, self._layout, np.unique(s.run_episode))
            served = _meta.served_frame_sizes(self._src, self._layout, s.video_files, self._video_pins,
                                              self._video_declared)
            task_indices = s.task_index
            if s.lazy:  # opened without its frames: a row per stretch of consecutive frames, from the runs
                # (whole episodes: one per episode; windows: one per window, or per windows that follow on)
                first = s.index.per_run
                new = np.concatenate([[True], (s.run_episode[1:] != s.run_episode[:-1]) |
                                      (first[1:] != first[:-1] + np.diff(s.runs.start)[:-1])])
                starts = s.runs.start[:-1][new]
                episodes = _meta.episodes_table(source_eps, s.run_episode[new], None,
                                                bounds=(starts, np.append(starts[1:], self._n)))
                task_indices = _meta.episode_task_indices(source_eps, self._tasks, s,
                                                          whole=s.run_window is None)
            else:
                fi = self.manifest["frame_index"].to_numpy()
                if self._grid is not None:  # runs of consecutive frames at the served rate
                    fi = self._grid.frame_index(fi)
                episodes = _meta.episodes_table(source_eps, s.episode_index, fi)
            self._meta_obj = _meta.SelectionMetadata(
                self._layout, episodes, self._tasks, total_frames=self._n,
                task_indices=task_indices, repo_id=self.repo_id, root=self.root,
                stats_fn=self._stats_fn, cameras=self.camera_keys, owner_pid=self._owner_pid,
                depth_output_unit=self.depth_output_unit, served=served,
                fps=None if self._grid is None else self.fps)
        return self._meta_obj

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
        """Distinct episodes the samples come from (counted once, over the runs: see :mod:`._samples`)."""
        return int(len(np.unique(self._samples.run_episode)))

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
        """Frame offsets of ``delta_timestamps`` (``round(d * fps)`` per key, at the dataset's ``fps``), as lerobot
        0.4's; None without."""
        stride = 1 if self._grid is None else self._grid.stride
        return {k: [int(x) // stride for x in v] for k, v in self._delta.items()} if self._delta else None

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

    # ---- items ----------------------------------------------------------------------------------------------
    def _image(self, value, column: str, i: int) -> torch.Tensor:
        """One image cell of sample ``i`` as the item carries it
        (:meth:`lerobot_sql.torch._values.ImageCells.tensor`)."""
        return self._images.tensor(value, column, lambda what: self._image_error(column, i, what),
                                   uint8=self.return_uint8, unit=self.depth_output_unit)

    def _image_error(self, column: str, i: int, what: str) -> DatasetFormatError:
        s = self._samples
        return DatasetFormatError(
            f"{self._src.path(s.data_files[int(s.file[i])])}: column {column!r} of sample {i} (episode "
            f"{int(s.episode_index[i])}, index {int(s.index[i])}"
            f"{', or a frame of its delta_timestamps window' if column in self._delta else ''}) {what}")

    def _tensor(self, column: str, values, i: int) -> Any:
        if column in self._layout.image_keys:
            imgs = [self._image(v, column, i) for v in values]
            return imgs[0] if len(imgs) == 1 else torch.stack(imgs)
        if isinstance(values, np.ndarray):
            return torch.from_numpy(np.array(values))
        return [v.as_py() for v in values]

    def _decode(self, w: _worker.Worker, key: str, index: video_index.FrameIndex, rows: np.ndarray) -> torch.Tensor:
        arr = w.decoders.decode_chw(index, rows)
        if key in self._depth_video:  # 12-bit codes (n, 1, H, W): lerobot's float32 copy, then its in-place ops
            t = _values.dequantize_(torch.from_numpy(arr.astype(np.float32)), self._depth_video[key],
                                    self.depth_output_unit)
        else:
            if not self.return_uint8:
                arr = _values.to_unit_float(arr)
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
        s = self._samples
        pads: dict[str, np.ndarray] = {}
        # Locate every camera's frames first (cheap), then decode: other cameras in helper threads (PyAV releases
        # the GIL), while this thread reads the tabular columns and decodes the last camera.
        targets = [w.frame_rows(k, i, pads) for k in self._video_keys]
        futures = []
        if w.pool is not None:
            futures = [w.pool.submit(self._decode, w, k, index, rows)
                       for k, (index, rows) in zip(self._video_keys, targets[:-1])]
        try:
            cols: dict[str, Any] = {}
            view = w.view(int(s.slot[i]))
            off = int(s.offset[i])
            if view.has_index and view.column("index")[off] != s.index[i]:  # as check_index, for one row
                w.check_index(lambda _t: view, np.array([s.slot[i]]), np.array([off]), np.array([i]))
            for col in self._columns:
                if col in self._delta:
                    vals, pads[f"{col}_is_pad"] = w.window(i, col, col)
                    cols[col] = self._tensor(col, vals, i)
                    if col in self._layout.image_keys and len(vals) > 1 and cols[col].ndim == 3:
                        cols[col] = cols[col][None]
            for col, kind in self._plain:
                v = view.column(col)[off]
                if kind == "num":
                    cols[col] = torch.from_numpy(np.array(v))
                elif kind == "image":
                    cols[col] = self._image(v, col, i)
                else:
                    cols[col] = v.as_py()
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
        return self._finish(frames, cols, pads, i)

    def _finish(self, frames: dict, cols: dict, pads: dict[str, np.ndarray], ii, mem=None) -> dict[str, Any]:
        """The one rule after the values are read, for an item (``ii`` its position) and for a batch (``ii`` int64
        positions; every value then per item: a (B, ...) tensor or a list): the key order (the cameras' frames in
        info.json order, the data columns in file order, then each ``<key>_is_pad`` in its key's order, as
        lerobot's), ``image_transforms`` (per item, item-major and in camera order, so a random transform draws
        the same either way; never on depth maps, as lerobot 0.6), ``task`` and the query's extras."""
        one = not isinstance(ii, np.ndarray)
        if self._grid is not None:
            self._renumber(cols, ii)
        out = {**{k: frames[k] for k in self._video_keys}, **{c: cols[c] for c in self._columns}}
        for k in sorted(pads, key=self._pad_order):
            if one:
                out[k] = torch.from_numpy(pads[k])
            else:  # in the batch's memory
                out[k] = batch_tensor(pads[k].shape, torch.bool, mem)
                out[k].numpy()[...] = pads[k]
        if self.image_transforms is not None:
            cams = [k for k in self._layout.camera_keys if k in out and k not in self._depth_keys]
            if one:
                for k in cams:
                    out[k] = self.image_transforms(out[k])
            else:
                per = {k: [] for k in cams}
                for j in range(len(ii)):
                    for k in cams:
                        per[k].append(self.image_transforms(out[k][j]))
                out.update(per)
        task_index = self._samples.task_index[ii]
        out["task"] = self._tasks.get(int(task_index)) if one else [self._tasks.get(int(x)) for x in task_index]
        if out["task"] is None or (not one and None in out["task"]):  # (checked at the open, unless its frames
            # were left to their row groups: a large whole-episode selection)
            bad = int(task_index) if one else int(task_index[out["task"].index(None)])
            raise DatasetFormatError(f"{self._src.path(self._layout.tasks_file or 'meta/tasks.parquet')}: no task text "
                                     f"for task_index {bad} of the data files; items carry the task text as "
                                     "LeRobotDataset's do. Restore the file from the dataset's source (`lerobot-sql "
                                     "doctor`: tasks_exist)")
        for e, arr, numeric, ltype in self._extra_cols:
            if numeric:  # 0-d tensors of the column's own dtype
                out[e] = torch.from_numpy(np.array(arr[ii]) if one else np.ascontiguousarray(arr[ii]))
            elif one:
                out[e] = _values.extra_value(arr[ii].as_py(), ltype)
            else:
                out[e] = [_values.extra_value(v, ltype) for v in arr.take(pa.array(ii)).to_pylist()]
        return out

    def _renumber(self, cols: dict, ii) -> None:
        """At another frame rate: ``index``, ``frame_index`` and ``timestamp`` (and their ``delta_timestamps``
        windows) as the recording at that rate numbers the frames (:class:`lerobot_sql._readers.regrid.Grid`),
        written over the source's values in their tensors (the batch's memory, the data file's dtype)."""
        g, s = self._grid, self._samples
        idx, ep_from = np.asarray(s.index[ii], np.int64), np.asarray(s.ep_from[ii], np.int64)
        ep = np.asarray(s.episode_index[ii], np.int64)
        for col in ("index", "frame_index", "timestamp"):
            if col not in cols:
                continue
            if col in self._delta:  # the window's frames (clamped on the grid), per item
                q, _ = deltas.query_indices(idx[..., None], self._delta[col], ep_from[..., None],
                                            np.asarray(s.ep_to[ii], np.int64)[..., None], g.stride)
                pos, e = q - ep_from[..., None], np.broadcast_to(ep[..., None], q.shape)
            else:
                pos, e = idx - ep_from, ep
            new = g.index(e, pos) if col == "index" else g.frame_index(pos) if col == "frame_index" else \
                g.timestamp(pos)
            t = cols[col]
            t.numpy()[...] = new.reshape(t.shape)

    def _pad_order(self, key: str) -> int:
        base = key[: -len("_is_pad")]
        return self._columns.index(base) if base in self._columns else len(self._columns) + \
            self._video_keys.index(base)

    # ---- batched fetch (DataLoader) ------------------------------------------------------------------------
    def __getitems__(self, indices) -> Batch:
        """The items ``[self[i] for i in indices]``, built together: what torch's DataLoader calls with a batch.

        Returns a :class:`~lerobot_sql.torch.batch.Batch`: a sequence of ``len(indices)`` item dicts (item ``j`` equals
        ``self[indices[j]]`` bit for bit: same keys in the same order, dtypes, shapes; tensors are views into the
        batch's tensors) that also holds the collated batch. torch's fetcher hands the returned value to
        ``collate_fn``; torch's ``default_collate`` cannot be given a ready dict (it indexes ``batch[0]`` and
        stacks), so :mod:`lerobot_sql.torch.batch` registers its item type in ``default_collate_fn_map``:
        ``default_collate`` on a ``Batch`` returns the prepared batch directly (``{key: (B, *item shape) tensor |
        collated list}``), which equals ``default_collate([self[i] for i in indices])`` key by key, bit for bit. A
        plain ``DataLoader(ds, batch_size=B)`` therefore stays correct and skips the per-item stack; any other
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
        mem = begin()  # this worker's recycled shared memory for the batch tensors (None elsewhere)
        try:
            return self._getitems(ii, mem)
        finally:
            if mem is not None:
                mem.close()

    def _getitems(self, ii: np.ndarray, mem) -> Batch:
        b = len(ii)
        w = self._w()
        if self._pipeline is not None and b:  # this worker's next batches, fetched while it reads this one
            self._pipeline.after_batch(ii, self._n, lambda jj: _pipe.byte_ranges(w, jj), self._src)
        tensors: dict[str, torch.Tensor] = {}  # key -> (B, *item shape)
        lists: dict[str, list] = {}  # key -> per-item values, collated by default_collate
        if b == 0:
            return Batch([], tensors, lists, 0, mem)
        r = w.batch(ii)  # the batch's data rows, their row groups mapped
        pads: dict[str, np.ndarray] = {}

        def frames_window(k: str):
            # a delta camera's window: (its frames from the episode start, their data timestamps or None)
            q, pads[f"{k}_is_pad"], o, inside = r.window(k)
            times = None
            if self.align != "frame_index":  # (by frame_index, no timestamp is read)
                # the data file's timestamp dtype, as __getitem__ reads the window's times from the row group
                times = np.empty(q.shape, r.first("timestamp").dtype)
                r.neighbours("timestamp", k, times)
            return q - r.ep_from[:, None], times

        def decoded(k: str, codes: np.ndarray, files: dict, rows: np.ndarray) -> torch.Tensor:
            return decode_frames(w.decoders, codes, files, rows, quantizer=self._depth_video.get(k),
                                 uint8=self.return_uint8, unit=self.depth_output_unit, window=k in self._delta,
                                 mem=mem)

        # video: locate every camera's frames for the batch, then decode per (camera, mp4) in file order (rows
        # sorted inside decode_into: one forward pass per GOP run); the other cameras in helper threads where
        # __getitem__ would use them (PyAV releases the GIL)
        w.index_many(ii, self._video_keys)
        if self._pipeline is None and self._video_keys and not self._src.is_local:
            # the batch's packets (each frame's GOP run, per camera and mp4) in one parallel round, as the pipeline
            # fetches its next batches: PyAV would ask for them one read at a time, a round trip each
            self._src.fetch_many(list(_pipe.byte_ranges(w, ii).items()))
        targets = [(k, *w.batch_rows(k, ii, functools.partial(frames_window, k) if k in self._delta else None))
                   for k in self._video_keys]
        frames: dict[str, torch.Tensor] = {}
        futures = []
        if w.pool is not None and len(targets) > 1:
            futures = [w.pool.submit(decoded, *tg) for tg in targets[:-1]]
        try:
            for tg in targets[len(futures):]:  # all cameras, or the last one beside the helpers
                frames[tg[0]] = decoded(*tg)
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
                q, pad, o, inside = r.window(col)
                first = r.first(col)
                if isinstance(first, np.ndarray):  # numbers: what __getitem__'s _tensor turns into one tensor
                    out_t = batch_tensor((b, *o.shape[1:], *first.shape[1:]), _values.np_torch(first.dtype), mem)
                    r.neighbours(col, col, out_t.numpy())
                    item_cols[col] = out_t
                else:
                    vals = []
                    for j in range(b):
                        v, _ = w.window(int(ii[j]), col, col)
                        x = self._tensor(col, v, int(ii[j]))
                        if col in self._layout.image_keys and len(v) > 1 and x.ndim == 3:
                            x = x[None]
                        vals.append(x)
                    item_cols[col] = vals
                pads[f"{col}_is_pad"] = pad
        for col, kind in self._plain:
            if kind == "num":
                first = r.first(col)
                out_t = batch_tensor((b, *first.shape[1:]), _values.np_torch(first.dtype), mem)
                r.gather(col, r.offset, np.arange(b), out_t.numpy())
                item_cols[col] = out_t
            elif kind == "image":
                item_cols[col] = [self._image(v, col, int(ii[j])) for j, v in enumerate(r.values(col))]
            else:
                item_cols[col] = [v.as_py() for v in r.values(col)]
        batch = self._finish(frames, item_cols, pads, ii, mem)
        for k, v in batch.items():
            (tensors if isinstance(v, torch.Tensor) else lists)[k] = v
        return Batch(list(batch), tensors, lists, b, mem)

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

    # ---- remote pipelining (lerobot_sql.torch.pipeline) ---------------------------------------------------
    def pipeline(self, sampler, *, batches: int = 8, max_bytes: int | None = None) -> "LeRobotSQLDataset":
        """Fetch ahead, in each DataLoader worker, the remote bytes of the worker's next ``batches`` batches.

        ``sampler`` is the one the DataLoader draws from (``DataLoader(ds, sampler=sampler, batch_size=B, ...)``;
        this package's samplers, a list of indices, or any sampler whose order is the same in a worker's copy).
        On ``__getitems__`` of batch ``j`` a worker submits to two background threads the byte ranges of batches
        ``j + W .. j + batches*W`` (its own, under torch's round robin; ``W`` = ``num_workers``, 1 without
        workers): data row groups not cached yet, video packets from each frame's keyframe, container heads.
        ``max_bytes`` bounds the bytes a worker holds fetched ahead and unread (default ``min(128 MiB,
        cache_size / (4 * W))``). Why this design and what disables it: :mod:`lerobot_sql.torch.pipeline`.

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
            _pipe.warn_outside(order, self._n)
            # the mp4s' versions pinned here, in one parallel round: the workers inherit them instead of each
            # asking for every file on its first read (a round trip each, per worker and epoch)
            self._src.describe(sorted({rel for names in self._samples.video_files.values() for rel in names}))
            if not self._src.is_local:
                self._pipeline.need, self._pipeline.blocks, self._pipeline.need_of = _pipe.plan_epoch(
                    self._w(), order, self._n)
        return self

    def __repr__(self) -> str:
        return (f"LeRobotSQLDataset({self._src.url!r}, samples={len(self)}, fps={self.fps:g}, "
                f"cameras={self._video_keys + [k for k in self._layout.image_keys if k not in self._skip_columns]}, "
                f"delta_timestamps={sorted(self._delta)})")


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
