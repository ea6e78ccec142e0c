"""``ds.meta`` of a collection dataset: what ``LeRobotDatasetMetadata`` answers, for a selection across datasets.

lerobot's training code builds the policy and its processors from ``dataset.meta`` (``features``, ``stats``,
``fps`` through ``resolve_delta_timestamps``, ``camera_keys``, the model card's ``repo_id`` / totals / ``tasks``).
:class:`CollectionMetadata` answers these for a :class:`~lerobot_sql.torch.mixture.CollectionDataset`, from its
parts' own :class:`~lerobot_sql.torch.meta.SelectionMetadata` (each dataset's selection), keys as the items name
them (``rename=`` applied, dropped keys left out):

* ``features``: the first selected dataset's entries, in its order (the parts line up: same dtype and shape per
  key, or the dataset was refused); ``names`` may differ between datasets and are the first one's;
* ``fps``: the datasets' one fps; several raise :class:`~lerobot_sql.errors.DatasetFormatError` where it is read
  (a policy's frame offsets would mean different times in different datasets);
* ``stats``: each part's statistics (its ``stats=`` mode: the selection's, or its ``meta/stats.json``), combined
  per key by lerobot's ``aggregate_stats`` rule (:func:`lerobot_sql._format.stats_json.aggregate`: min of mins,
  max of maxes, count-weighted mean, pooled std, summed count, count-weighted quantiles); one dataset's are its
  own, unchanged;
* ``episodes``: one row per run of consecutive samples of one dataset's episode, ``dataset_from_index`` /
  ``dataset_to_index`` positions in the collection dataset, and the ``dataset`` column;
* ``tasks``: the distinct task texts of the parts, numbered in dataset order. Items keep their own dataset's
  ``task_index`` (equal to that dataset's item); the ``task`` text is what names a task across datasets.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pyarrow as pa

from .._format import stats_json
from ..errors import DatasetFormatError
from .meta import EpisodeTable, FeatureKeys, Info, episodes_table


class CollectionMetadata(FeatureKeys):
    """What ``LeRobotDatasetMetadata`` answers for a collection dataset (see the module docstring).

    Built by :attr:`CollectionDataset.meta <lerobot_sql.torch.mixture.CollectionDataset.meta>`; not meant to be
    constructed by users.
    """

    def __init__(self, names: list[str], parts_meta: dict[str, Any], keymaps: dict[str, dict[str, str]],
                 drop: dict[str, set[str]], episodes: pa.Table, total_frames: int, repo_id: str):
        self._names = [n for n in names if n in parts_meta]
        self._parts = parts_meta
        self._keymaps, self._drop = keymaps, drop
        self.repo_id = repo_id
        self.root = None  # no one folder: each part's meta has its own root
        self.revision = None
        self.episodes = EpisodeTable(episodes)
        self._total_frames = int(total_frames)
        self._stats: dict | None = None
        self._tasks_df = None
        first = parts_meta[self._names[0]]
        feats = {}
        for n in self._names:
            for k, f in self._renamed(n, self._parts[n].features).items():
                feats.setdefault(k, copy.deepcopy(f))
        fps = {n: self._parts[n].fps for n in self._names}
        self.fps_by_dataset = fps
        info = copy.deepcopy(dict(first.info))
        info["features"] = feats
        info["fps"] = next(iter(fps.values())) if len(set(fps.values())) == 1 else None
        info["robot_type"] = self.robot_type
        info["total_episodes"] = self.total_episodes
        info["total_frames"] = self._total_frames
        info["total_tasks"] = len(self._task_texts())
        info["splits"] = {"train": f"0:{self.total_episodes}"}
        self.info = Info(info)

    def _renamed(self, name: str, mapping: dict) -> dict:
        """A per-key dict of dataset ``name`` with its keys as items name them (dropped keys left out)."""
        m, drop = self._keymaps.get(name, {}), self._drop.get(name, set())
        return {m.get(k, k): v for k, v in mapping.items() if k not in drop}

    # ---- from the parts' info.json ---------------------------------------------------------------------------
    @property
    def fps(self) -> int | float:
        """The datasets' fps.

        Raises:
            DatasetFormatError: the selected datasets have several fps, naming each.
        """
        fps = set(self.fps_by_dataset.values())
        if len(fps) > 1:
            raise DatasetFormatError(
                f"the selected datasets have different fps ({', '.join(f'{n}: {f}' for n, f in self.fps_by_dataset.items())})"
                ": a policy's frame offsets (delta_indices) would be different times in each; select datasets of one "
                "fps, or give delta_timestamps in seconds yourself (coll.dataset(sql, delta_timestamps=...))")
        return next(iter(fps))

    @property
    def robot_type(self) -> str | None:
        """The datasets' robot_type when they all have the same, else None."""
        types = {self._parts[n].robot_type for n in self._names}
        return types.pop() if len(types) == 1 else None

    @property
    def depth_keys(self) -> list[str]:
        """Cameras that are depth maps in their datasets (as each part's ``depth_keys``), as items name them."""
        out = []
        for n in self._names:
            out += [k for k in self._renamed(n, {d: d for d in self._parts[n].depth_keys}) if k not in out]
        return [k for k in self.camera_keys if k in out]

    # ---- the selection ------------------------------------------------------------------------------------
    @property
    def total_episodes(self) -> int:
        """Distinct (dataset, episode_index) pairs the selection touches."""
        return sum(p.total_episodes for p in self._parts.values())

    @property
    def total_frames(self) -> int:
        """Samples in the dataset (``len(ds)``)."""
        return self._total_frames

    @property
    def total_tasks(self) -> int:
        """Distinct task texts across the datasets."""
        return len(self._task_texts())

    def _task_texts(self) -> list[str]:
        out: dict[str, None] = {}
        for n in self._names:
            for text in self._parts[n].tasks.index:
                out.setdefault(str(text))
        return list(out)

    @property
    def tasks(self):
        """The distinct task texts of the datasets: a pandas DataFrame indexed by task text with column
        ``task_index`` (0..k-1 in dataset order; items carry their own dataset's ``task_index``)."""
        if self._tasks_df is None:
            import pandas as pd

            texts = self._task_texts()
            self._tasks_df = pd.DataFrame({"task_index": np.arange(len(texts), dtype=np.int64)},
                                          index=pd.Index(texts, name="task"))
        return self._tasks_df

    def get_task_index(self, task: str) -> int | None:
        """The position of a task text in :attr:`tasks`, or None."""
        texts = self._task_texts()
        return texts.index(task) if task in texts else None

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]] | None:
        """Statistics of the items' keys (see the module docstring); None when the parts were built with
        ``stats=None``. Computed on first use, in the main process, and kept.

        Raises:
            StatsUnavailableError: first use in a DataLoader worker or an unpickled copy (each part's meta refuses
                there, as a single dataset's).
        """
        if self._stats is None:
            per = {n: self._parts[n].stats for n in self._names}
            if any(s is None for s in per.values()):
                return None
            per = {n: self._renamed(n, s) for n, s in per.items()}
            out: dict[str, dict] = {}
            for k in self.features:
                have = [s[k] for s in per.values() if k in s]
                if not have:
                    continue
                out[k] = have[0] if len(have) == 1 else stats_json.aggregate(have)
            self._stats = out
        return self._stats

    def __repr__(self) -> str:
        return (f"CollectionMetadata(datasets={self._names}, total_episodes={self.total_episodes}, "
                f"total_frames={self.total_frames}, features={list(self.features)})")


def collection_episodes(dataset_names: list[str], dataset_index: np.ndarray, episode_index: np.ndarray,
                        frame_index: np.ndarray) -> pa.Table:
    """``meta.episodes`` of a collection dataset: one row per run of consecutive samples that are consecutive frames
    of one dataset's episode, with ``dataset`` (the name), ``episode_index``, ``length``, ``dataset_from_index`` and
    ``dataset_to_index`` (positions in the collection dataset)."""
    code = np.asarray(dataset_index, np.int64)
    key = (code << np.int64(40)) + np.asarray(episode_index, np.int64)  # episode numbers stay < 2**40
    t = episodes_table(None, key, np.asarray(frame_index, np.int64))
    run_key = t.column("episode_index").to_numpy()
    names = np.asarray(dataset_names, dtype=object)[run_key >> np.int64(40)] if len(run_key) else []
    return pa.table({"dataset": pa.array(list(names), pa.string()),
                     "episode_index": pa.array(run_key & np.int64((1 << 40) - 1), pa.int64()),
                     "length": t.column("length"), "dataset_from_index": t.column("dataset_from_index"),
                     "dataset_to_index": t.column("dataset_to_index")})


__all__ = ["CollectionMetadata", "collection_episodes"]
