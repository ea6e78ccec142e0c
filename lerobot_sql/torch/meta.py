"""``ds.meta``: what lerobot's ``LeRobotDatasetMetadata`` answers, for the selection a dataset was built from.

lerobot's training code reads the dataset's metadata, not only its items: ``make_policy(cfg.policy,
ds_meta=dataset.meta)`` (features, stats), the processors (``dataset.meta.stats``), ``EpisodeAwareSampler(
dataset.meta.episodes["dataset_from_index"], dataset.meta.episodes["dataset_to_index"],
episode_indices_to_use=dataset.episodes, ...)``. :class:`SelectionMetadata` describes the selection as if it were
a dataset of its own:

* ``info``, ``features``, ``fps``, ``robot_type``, key lists, ``names``, ``shapes`` come from the source's
  ``meta/info.json`` (``info``'s totals and ``splits`` are the selection's; ``info`` is a dict that also reads as
  attributes, :class:`Info`, as lerobot 0.4's dict and 0.6's ``DatasetInfo`` both are read; served at another frame
  rate, ``db.dataset(fps=...)``, its ``fps`` and every ``video.fps`` / feature ``fps`` are that rate), except a video
  camera whose mp4s all hold frames of another size than info.json declares: its ``shape`` (and ``info.video.height/width``) are the
  files' size, the size its items have (the dataset warns of the difference);
* ``episodes`` has one row per **run**: a stretch of consecutive samples of the dataset that are consecutive
  frames of one episode (a whole-episode selection: one run per episode; two windows of one episode: two runs),
  with the source's ``meta/episodes`` columns of that episode (no ``stats/...`` columns, as lerobot loads them),
  ``length`` the run's sample count, and ``dataset_from_index`` / ``dataset_to_index`` the run's half-open range of
  **positions in this dataset** (what ``ds[i]`` takes), so lerobot's sampler draws exactly this dataset's samples
  and ``drop_n_last_frames`` drops the last frames of each run. The dataset's ``episodes`` is therefore None
  ("every row of meta.episodes"), as a LeRobotDataset built without ``episodes=`` has it;
* ``tasks`` is the source's whole task table (a pandas DataFrame indexed by task text, column ``task_index``):
  items carry the source's ``task_index``, and lerobot looks texts up by position (``tasks.iloc[task_index]``);
  ``total_tasks`` counts the tasks the selection uses;
* ``stats``: the selection's statistics (:mod:`lerobot_sql.stats`), or with ``stats="dataset"`` the source's
  ``meta/stats.json`` unchanged (what lerobot itself uses with ``episodes=[...]``); computed on first use, in the
  main process (DuckDB), and kept, so a DataLoader started later pickles the numbers, not the query. Depth keys'
  entries are then rescaled from their recorded ``depth_unit`` to the dataset's ``depth_output_unit``, as lerobot
  0.6 does (``db.stats()`` itself keeps the recorded units).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from .._format import depth
from .._format.layout import Layout
from .._readers import decode, video_index
from ..errors import LeRobotSQLError, StatsUnavailableError


def runs(episode_index: np.ndarray, frame_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Half-open ``(starts, ends)`` of the runs of a dataset's samples: maximal stretches where each sample is the
    next frame of the previous sample's episode. int64 arrays of equal length; empty input gives empty arrays."""
    n = len(episode_index)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ep, fr = np.asarray(episode_index, np.int64), np.asarray(frame_index, np.int64)
    brk = np.flatnonzero((ep[1:] != ep[:-1]) | (fr[1:] != fr[:-1] + 1)) + 1
    starts = np.concatenate([[0], brk]).astype(np.int64)
    ends = np.concatenate([brk, [n]]).astype(np.int64)
    return starts, ends


class EpisodeTable:
    """``meta.episodes``: the reads lerobot's code makes of its ``datasets.Dataset`` of episodes, without the
    ``datasets`` package: ``episodes["dataset_from_index"]`` (a list of the column's Python values),
    ``episodes[i]`` (row i as a dict), ``len(episodes)``, iteration over rows, ``column_names``, ``features``
    (names), ``to_pandas()``, ``select_columns(names)``. Backed by an Arrow table."""

    def __init__(self, table: pa.Table):
        self._t = table

    def __len__(self) -> int:
        return self._t.num_rows

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, str):
            if key not in self._t.column_names:
                raise KeyError(f"meta.episodes has no column {key!r}; columns: {self._t.column_names}")
            return self._t.column(key).to_pylist()
        if isinstance(key, (int, np.integer)):
            n = self._t.num_rows
            if not -n <= key < n:
                raise IndexError(f"meta.episodes row {key} out of range for {n} rows")
            return {c: v[0] for c, v in self._t.slice(int(key) % n, 1).to_pydict().items()}
        raise TypeError(f"meta.episodes takes a column name or a row number, not {type(key).__name__}")

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    @property
    def column_names(self) -> list[str]:
        return list(self._t.column_names)

    @property
    def features(self) -> list[str]:
        return self.column_names

    def select_columns(self, names: list[str]) -> "EpisodeTable":
        return EpisodeTable(self._t.select(list(names)))

    def to_pandas(self):
        return self._t.to_pandas()

    def to_arrow(self) -> pa.Table:
        return self._t

    def __repr__(self) -> str:
        return f"EpisodeTable({len(self)} runs, columns={self.column_names})"


class Info(dict):
    """``meta.info``: info.json as a dict (lerobot 0.4's ``meta.info``, ``info["fps"]``) whose keys also read as
    attributes (lerobot 0.6's ``DatasetInfo``, ``info.fps``), so code written for either version reads it.

    The optional fields of lerobot 0.6's ``DatasetInfo`` read as its defaults when info.json lacks them
    (``robot_type``, ``video_path``, ``tools``: None; ``splits``: {}). Other missing names raise AttributeError.
    """

    _DEFAULTS = {"robot_type": None, "video_path": None, "tools": None, "splits": {}}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # pickle, copy and friends look these up: never a key
            raise AttributeError(name)
        if name in self:
            return self[name]
        if name in Info._DEFAULTS:
            return copy.copy(Info._DEFAULTS[name])
        raise AttributeError(f"info.json has no {name!r} (keys: {sorted(self)})")

    def to_dict(self) -> dict:
        """A plain JSON-serialisable copy (shapes as lists), as lerobot 0.6's ``DatasetInfo.to_dict``."""
        out = copy.deepcopy(dict(self))
        for f in out.get("features", {}).values():
            if isinstance(f, dict) and isinstance(f.get("shape"), tuple):
                f["shape"] = list(f["shape"])
        return out


class FeatureKeys:
    """What lerobot's metadata derives from ``info["features"]``, for a class holding ``info`` (a selection's meta,
    a collection's): ``features``, the key lists, ``names``, ``shapes`` (as info.json writes them: cameras
    (H, W, C), with a camera's H and W the size its items have when all its mp4s disagree with info.json alike) and
    ``has_language_columns`` (a feature of dtype ``language``, as lerobot 0.6 reports it)."""

    info: dict

    @property
    def features(self) -> dict[str, dict]:
        return self.info["features"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "image"]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "video"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] in ("video", "image")]

    @property
    def names(self) -> dict[str, Any]:
        return {k: f.get("names") for k, f in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple]:
        return {k: tuple(f["shape"]) for k, f in self.features.items()}

    @property
    def has_language_columns(self) -> bool:
        return any(f["dtype"] == "language" for f in self.features.values())


class SelectionMetadata(FeatureKeys):
    """What ``LeRobotDatasetMetadata`` answers, for one dataset built from a selection (see the module docstring).

    Built by the dataset (``ds.meta``); not meant to be constructed by users.
    """

    def __init__(self, layout: Layout, episodes: pa.Table, tasks: dict[int, str], *, total_frames: int,
                 task_indices: np.ndarray, repo_id: str, root: Path | str,
                 stats_fn: Callable[[], dict] | None, cameras: list[str] | None = None, owner_pid: int | None = None,
                 depth_output_unit: str = "mm", served: dict[str, tuple[tuple[int, ...], tuple[int, int]]] | None = None,
                 fps: int | float | None = None):
        self._layout = layout
        self._depth_output_unit = depth_output_unit
        self.repo_id = repo_id
        self.root = root
        self.revision = None
        self.episodes = EpisodeTable(episodes)
        self._task_map = dict(tasks)
        self._total_frames = int(total_frames)
        self._total_episodes = len(set(episodes.column("episode_index").to_pylist())) if episodes.num_rows else 0
        self._total_tasks = int(len(np.unique(task_indices)))
        self._stats_fn = stats_fn
        # the process holding the Database (the dataset's builder): the only one that may call stats_fn
        self._pid = os.getpid() if owner_pid is None else owner_pid
        self._stats: dict | None = None
        self._tasks_df = None
        info = copy.deepcopy(layout.info)
        if cameras is not None:  # cameras left out of the items are left out of the features lerobot builds from
            info["features"] = {k: f for k, f in info["features"].items()
                                if f.get("dtype") not in ("video", "image") or k in cameras}
        for f in info["features"].values():  # lerobot's load_info makes every shape a tuple
            if isinstance(f, dict) and isinstance(f.get("shape"), list):
                f["shape"] = tuple(f["shape"])
        # a camera whose mp4s all hold another frame size than info.json's: the items have the files' size, and a
        # policy built from these features must take the items (the dataset warned of the difference)
        for k, (shape, (h, w)) in (served or {}).items():
            if k in info["features"]:
                info["features"][k]["shape"] = tuple(shape)
                vinfo = info["features"][k].get("info")
                if isinstance(vinfo, dict) and "video.height" in vinfo and "video.width" in vinfo:
                    vinfo["video.height"], vinfo["video.width"] = h, w
        if fps is not None and fps != info.get("fps"):  # served at another frame rate: the recording at that rate's
            info["fps"] = fps
            for f in info["features"].values():
                if isinstance(f, dict) and "fps" in f:  # (v2.1 conversions keep one per non-video feature)
                    f["fps"] = fps
                vinfo = f.get("info") if isinstance(f, dict) else None
                if isinstance(vinfo, dict) and "video.fps" in vinfo:
                    vinfo["video.fps"] = fps
        info["total_episodes"] = self._total_episodes
        info["total_frames"] = self._total_frames
        info["total_tasks"] = self._total_tasks
        info["splits"] = {"train": f"0:{self._total_episodes}"}
        self.info = Info(info)

    # ---- straight from info.json, as lerobot's properties --------------------------------------------------
    @property
    def fps(self) -> int | float:
        return self.info["fps"]

    @property
    def robot_type(self) -> str | None:
        return self.info.get("robot_type")

    @property
    def data_path(self) -> str:
        return self.info["data_path"]

    @property
    def video_path(self) -> str | None:
        return self.info.get("video_path")

    @property
    def chunks_size(self) -> int:
        return self.info["chunks_size"]

    @property
    def depth_keys(self) -> list[str]:
        """Cameras marked as depth maps (``info.is_depth_map``, or the legacy ``info["video.is_depth_map"]`` /
        ``video_info["video.is_depth_map"]``), as lerobot 0.6's: items carry them as float32 (1, H, W) in
        ``depth_output_unit`` (mm by default), and ``stats`` holds them in that unit."""
        return [k for k in self.camera_keys if self._layout.features[k].is_depth_map]

    # ---- the selection ------------------------------------------------------------------------------------
    @property
    def total_episodes(self) -> int:
        """Distinct episodes the selection touches (``meta.episodes`` may hold more rows: one per run)."""
        return self._total_episodes

    @property
    def total_frames(self) -> int:
        """Samples in the dataset (``len(ds)``)."""
        return self._total_frames

    @property
    def total_tasks(self) -> int:
        """Distinct tasks the selection's samples carry."""
        return self._total_tasks

    @property
    def tasks(self):
        """The source's tasks: a pandas DataFrame indexed by task text with column ``task_index`` (int64), in
        task_index order (lerobot reads ``tasks.iloc[task_index].name``)."""
        if self._tasks_df is None:
            import pandas as pd

            ordered = sorted(self._task_map.items())
            self._tasks_df = pd.DataFrame({"task_index": np.array([i for i, _ in ordered], np.int64)},
                                          index=pd.Index([t for _, t in ordered], name="task"))
        return self._tasks_df

    def get_task_index(self, task: str) -> int | None:
        """task_index of a task text, or None (as lerobot's)."""
        return next((i for i, t in self._task_map.items() if t == task), None)

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]] | None:
        """Statistics as lerobot's ``meta.stats`` (see the module docstring); None when the dataset was built with
        ``stats=None``. Computed on first use (DuckDB, main process) and kept.

        Raises:
            StatsUnavailableError: first use inside a process that cannot compute them (a DataLoader worker, a
                pickled copy): read ``ds.meta.stats`` once in the main process before the DataLoader starts.
        """
        if self._stats is None and self._stats_fn is not None:
            if os.getpid() != self._pid:  # a forked worker: DuckDB is not fork-safe (using it there hangs)
                stats_unavailable()
            st = self._stats_fn()
            # only what the items carry: cameras left out with cameras=[...] are not in features either
            self._stats = None if st is None else rescale_depth_stats(
                {k: v for k, v in st.items() if k in self.features}, self._layout, self.depth_keys,
                self._depth_output_unit)
        return self._stats

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_stats_fn"] = stats_unavailable if state["_stats"] is None and state["_stats_fn"] else None
        return state

    def __repr__(self) -> str:
        return (f"SelectionMetadata(repo_id={self.repo_id!r}, total_episodes={self.total_episodes}, "
                f"total_frames={self.total_frames}, fps={self.fps}, features={list(self.features)})")


def rescale_depth_stats(stats: dict, layout: Layout, depth_keys: list[str], unit: str) -> dict:
    """Depth keys' statistics from the unit their frames were recorded in (``info.depth_unit``; lerobot computes
    them on the raw frames) to ``unit``, as lerobot 0.6's ``LeRobotDatasetMetadata.rescale_depth_stats``: every
    entry but ``count`` times :func:`lerobot_sql._format.depth.unit_factor` (1000 from m to mm, 1/1000 from mm to
    m), float64. A key without a recorded unit is left as
    it is (lerobot warns the same)."""
    for key in depth_keys:
        stored = layout.features[key].depth_unit
        if stored is None or stored == unit or key not in stats:
            continue
        factor = depth.unit_factor(stored, unit)
        stats[key] = {s: v if s == "count" else v * factor for s, v in stats[key].items()}
    return stats


def stats_unavailable():
    raise StatsUnavailableError("ds.meta.stats was first read in a copy of the dataset (a DataLoader worker or an "
                                "unpickled dataset), where no DuckDB connection exists to compute it; read "
                                "ds.meta.stats once in the main process before starting the DataLoader, or build "
                                "the dataset with stats='dataset'")


def repo_id(url: str, root: str) -> str:
    """The dataset's lerobot ``repo_id``: ``org/name`` of a Hub dataset (``hf://datasets/org/name[@rev][/sub]``),
    else the root folder's name."""
    if url.startswith("hf://datasets/"):
        return "/".join(url[len("hf://datasets/"):].split("@")[0].split("/")[:2])
    return Path(root.rstrip("/")).name or url


def episodes_table(source_episodes: pa.Table | None, episode_index: np.ndarray, frame_index: np.ndarray | None,
                   bounds: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
    """The runs of a dataset's samples as ``meta.episodes`` rows (see the module docstring).

    ``source_episodes``: the source's meta/episodes rows (any columns; ``episode_index`` required), or None for
    the minimal table (episode_index, length, dataset_from_index, dataset_to_index). ``bounds``: the runs'
    ``(starts, ends)`` when known (then ``episode_index`` holds one value per run and ``frame_index`` is unused).
    """
    if bounds is not None:
        starts, ends = (np.asarray(b, np.int64) for b in bounds)
        eps = np.asarray(episode_index, np.int64)
    else:
        starts, ends = runs(episode_index, frame_index)
        eps = np.asarray(episode_index, np.int64)[starts] if len(starts) else np.zeros(0, np.int64)
    base = None
    if source_episodes is not None and source_episodes.num_rows:
        keep = [c for c in source_episodes.column_names if not c.startswith("stats/")
                and c not in ("length", "dataset_from_index", "dataset_to_index")]
        src = source_episodes.select(keep)
        pos = {int(e): i for i, e in enumerate(src.column("episode_index").to_pylist())}
        take = [pos.get(int(e)) for e in eps]
        if all(t is not None for t in take):
            base = src.take(pa.array(take, pa.int64()))
    cols = {"episode_index": pa.array(eps, pa.int64())}
    if base is not None:
        cols = {c: base.column(c) for c in base.column_names}
    cols["length"] = pa.array(ends - starts, pa.int64())
    cols["dataset_from_index"] = pa.array(starts, pa.int64())
    cols["dataset_to_index"] = pa.array(ends, pa.int64())
    return pa.table(cols)


def episode_task_indices(source_episodes: pa.Table | None, tasks: dict[int, str], samples,
                         whole: bool = True) -> np.ndarray:
    """The task_index values of the selected episodes (``samples``, opened without their frames), from
    meta/episodes' ``tasks`` lists mapped through ``tasks`` (task_index -> text): each distinct one once. Without
    that column (or a text not in ``tasks``), the samples' own task_index column (every row group is read); so too
    for windows (not ``whole``) of an episode with several tasks, which need not hold each of them."""
    if source_episodes is None or "tasks" not in source_episodes.column_names:
        return np.asarray(samples.task_index)
    index_of = {text: i for i, text in tasks.items()}
    out = set()
    for texts in source_episodes.column("tasks").to_pylist():
        if not whole and isinstance(texts, list) and len(set(texts)) > 1:
            return np.asarray(samples.task_index)
        for text in texts if isinstance(texts, list) else [texts]:
            if text not in index_of:
                return np.asarray(samples.task_index)
            out.add(index_of[text])
    return np.array(sorted(out), np.int64)


def served_frame_sizes(src, layout: Layout, video_files: dict[str, list[str]], pins: dict,
                       declared: dict) -> dict[str, tuple[tuple[int, ...], tuple[int, int]]]:
    """Video cameras whose mp4s (``video_files``: camera -> its files in a selection) all hold frames of one size
    other than info.json's: camera -> (its info.json shape with that size put in, (height, width)). Items carry each
    file's own size (as lerobot's decoder), so this is what ``meta.features`` / ``meta.shapes`` must say for a policy
    built from them to take the items. ``pins``: mp4 -> its version stamp (None: missing), ``declared``: mp4 ->
    (camera, declared (H, W)), as the dataset holds them.

    Reads mp4 headers (no decoding; a remote file's boxes only, as its index build does): a camera's first
    readable file, and all of them only when it differs from info.json; warns of a file whose size differs from
    info.json's, as the decoder would (once per file and process). A camera whose files differ among themselves
    keeps info.json's shape (no one shape is right; the warnings name the files). Missing or unreadable files are
    left to their items, which raise naming them.

    Raises:
        DatasetFormatError: a file's frames are a decode bomb (:func:`decode.check_resolution`).
    """
    # here: importing lerobot_sql.torch.meta stays free of torch (only the dataset calls this)
    from ._values import hw_axes

    out = {}
    for k, files in video_files.items():
        axes = hw_axes(layout.features[k])
        if axes is None:
            continue
        sizes = set()
        shape = list(int(x) for x in layout.features[k].shape)
        for rel in files:
            if pins.get(rel) is None and src.local_path(rel) is not None:
                continue  # missing: its items raise MissingFileError
            try:
                with video_index.open_container(src, rel, demux_only=True) as c:
                    cc = c.streams.video[0].codec_context
                    hw = (int(cc.height), int(cc.width))
            except (LeRobotSQLError, IndexError):
                continue  # unreadable or no video stream: its items raise naming the file
            decode.check_resolution(src.path(rel), hw, k, declared.get(rel, (None, None))[1])
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
