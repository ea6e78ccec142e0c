"""The torch ``Dataset`` over a manifest: items equal to ``LeRobotDataset.__getitem__`` for the same frames.

No SQL runs here. The manifest is resolved in the main process; each DataLoader worker opens its own memory maps
and decoders on first use after the fork (see ``_Worker``).
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import torch

from . import frames as _frames
from . import tabular, video
from .errors import LeRobotSQLError, MissingFileError
from .layout import Layout
from .source import Source


class _Worker:
    """Per-process state: memory-mapped row groups, loaded video indexes, decoders, a thread pool for cameras."""

    def __init__(self, ds: "LeRobotSQLDataset"):
        self.pid = os.getpid()
        self.row_groups: dict[tuple[int, int], tabular.RowGroupView] = {}
        self.indexes: dict[str, video.FrameIndex] = {}
        self.decoders = video.DecoderPool(ds._src, max_open=ds._max_open_decoders, threads=ds._decoder_threads)
        n = len(ds._video_keys)
        self.pool = concurrent.futures.ThreadPoolExecutor(n) if ds._parallel_cameras and n > 1 else None


class LeRobotSQLDataset(torch.utils.data.Dataset):
    """Map-style dataset over the frames a query selected; ``len`` = number of manifest rows.

    ``ds[i]`` returns a dict, as ``LeRobotDataset.__getitem__`` (lerobot 0.4.4) does for the same frame:
      * every data-file column of the frame as tensors: ``index``, ``episode_index``, ``frame_index``,
        ``task_index`` int64 0-d, ``timestamp`` float32 0-d, vector features 1-D of their dtype (e.g.
        ``observation.state`` float32 (6,)), scalar features 0-d; keys of ``delta_timestamps`` instead hold
        ``(T, *shape)`` stacks of the clamped neighbour frames;
      * each camera (``observation.images.<camera>``): float32 (C, H, W) in [0, 1], or uint8 with
        ``return_uint8=True``; (T, C, H, W) for a camera in ``delta_timestamps`` with T > 1. Video frames are read
        from ``videos/<video_key>/...mp4`` at ``from_timestamp + timestamp`` seconds; images stored in Parquet are
        decoded from their PNG bytes;
      * ``<key>_is_pad``: bool (T,) per ``delta_timestamps`` key, True where the offset left the episode;
      * ``task``: the task text (meta/tasks.parquet) of the frame's ``task_index``;
      * the query's extra columns under their own names (numbers as tensors, text as str).

    Raises (from ``__getitem__``):
        FrameNotFoundError: no video frame within ``tolerance_s`` of the wanted time.
        MissingFileError: a video file the frame needs does not exist.
        VideoDecodeError: PyAV failed on the file.
    """

    def __init__(self, src: Source, layout: Layout, manifest: pa.Table, tasks: dict[int, str], *,
                 cache_dir: Path, delta_timestamps: dict[str, list[float]] | None = None,
                 tolerance_s: float = 1e-4, return_uint8: bool = False,
                 image_transforms: Callable | None = None, cameras: list[str] | None = None,
                 decoder_threads: int = 1, parallel_cameras: bool = True, max_open_decoders: int = 16):
        self._src, self._layout, self._tasks = src, layout, tasks
        self._cache_dir = Path(cache_dir)
        self.fps = layout.fps
        self.tolerance_s = float(tolerance_s)
        self.return_uint8 = return_uint8
        self.image_transforms = image_transforms
        self._decoder_threads, self._parallel_cameras = decoder_threads, parallel_cameras
        self._max_open_decoders = max_open_decoders
        if cameras is None:
            cameras = layout.camera_keys
        unknown = [c for c in cameras if c not in layout.camera_keys]
        if unknown:
            raise ValueError(f"cameras {unknown} are not camera features; valid: {layout.camera_keys}")
        self._video_keys = [k for k in layout.video_keys if k in cameras]
        self._skip_columns = {k for k in layout.image_keys if k not in cameras}
        self.delta_timestamps = delta_timestamps
        self._delta = _frames.delta_indices(delta_timestamps, layout.fps, self.tolerance_s, layout.features)
        meta = json.loads((manifest.schema.metadata or {}).get(b"lerobot_sql.manifest", b"{}"))
        self._extras = list(meta.get("extras", []))
        self.manifest = manifest
        self._prepare()
        self._worker: _Worker | None = None

    # ---- main process -------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        m = self.manifest
        self._files, file_codes = _codes(m["data_file"])
        self._infos = [tabular.data_file_info(self._src, f) for f in self._files]
        self._video_files: dict[str, list[str]] = {}
        cols = {"file": file_codes}
        for k in self._video_keys:
            names, codes = _codes(m[f"{k}/file"])
            self._video_files[k] = names
            cols[k] = codes
        for c in ("index", "episode_index", "timestamp", "data_row", "ep_from_index", "ep_to_index", "ep_data_row0", "task_index"):
            cols[c] = m[c].to_numpy()
        self._cols = cols
        self._from_ts = {k: m[f"{k}/from_timestamp"].to_numpy() for k in self._video_keys}
        # Build every row group the items can touch (whole episodes when neighbours are read) before any fork.
        need: set[tuple[int, int]] = set()
        n_ep = cols["ep_to_index"] - cols["ep_from_index"]
        for fi, info in enumerate(self._infos):
            sel = cols["file"] == fi
            rows = cols["data_row"][sel]
            if self._delta:
                starts = np.unique(cols["ep_data_row0"][sel])
                ends = np.unique(cols["ep_data_row0"][sel] + n_ep[sel] - 1)
                rows = np.concatenate([rows, starts, ends])
            lo, hi = tabular.DataFileInfo.locate(info, np.array([rows.min(), rows.max()]))[0]
            rgs = np.unique(info.locate(rows)[0]) if not self._delta else np.arange(lo, hi + 1)
            need.update((fi, int(rg)) for rg in rgs)
        self._rg_paths = {k: tabular.ensure_row_group(self._src, self._infos[k[0]], k[1], self._layout,
                                                      self._cache_dir) for k in sorted(need)}
        self._index_paths: dict[str, Path] = {}
        self._index_errors: dict[str, LeRobotSQLError] = {}
        for k in self._video_keys:
            for rel in self._video_files[k]:
                try:
                    self._index_paths[rel] = video.ensure_index(self._src, rel, self._cache_dir)
                except MissingFileError as e:
                    self._index_errors[rel] = e
        if self._index_errors:
            warnings.warn(f"{len(self._index_errors)} video file(s) are missing, e.g. "
                          f"{next(iter(self._index_errors.values()))}; items needing them will raise "
                          "MissingFileError (pass cameras=[...] to leave those cameras out)", stacklevel=3)
        self._columns = [c for c in tabular.RowGroupView(next(iter(self._rg_paths.values())), self._layout)
                         .table.column_names if c not in self._skip_columns] if self._rg_paths else []

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_worker"] = None
        return state

    def __len__(self) -> int:
        return len(self._cols["index"])

    # ---- any process --------------------------------------------------------------------------------------
    def _w(self) -> _Worker:
        if self._worker is None or self._worker.pid != os.getpid():
            self._worker = _Worker(self)
        return self._worker

    def _rows(self, w: _Worker, fi: int, rows: np.ndarray, column: str):
        """Values of ``column`` at file rows (numpy (T, *shape), or list of Arrow scalars for other types)."""
        info = self._infos[fi]
        rgs, offs = info.locate(rows)
        parts = []
        for rg in np.unique(rgs):
            key = (fi, int(rg))
            view = w.row_groups.get(key)
            if view is None:
                view = w.row_groups[key] = tabular.RowGroupView(self._rg_paths[key], self._layout)
            parts.append((rgs == rg, view.column(column), offs[rgs == rg]))
        if len(parts) == 1:
            _, arr, o = parts[0]
            return arr[o] if isinstance(arr, np.ndarray) else [arr[int(x)] for x in o]
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

    def _image(self, value) -> torch.Tensor:
        from PIL import Image

        raw = value.as_py() if hasattr(value, "as_py") else value
        data = raw["bytes"] if isinstance(raw, dict) else raw
        arr = np.asarray(Image.open(io.BytesIO(data)))
        if arr.ndim == 2:
            arr = arr[:, :, None]
        t = torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))
        if t.dtype == torch.uint8 and not self.return_uint8:
            t = t.to(torch.float32) / 255
        return t

    def _tensor(self, column: str, values) -> Any:
        if column in self._layout.image_keys:
            imgs = [self._image(v) for v in values]
            return imgs[0] if len(imgs) == 1 else torch.stack(imgs)
        if isinstance(values, np.ndarray):
            return torch.from_numpy(np.array(values))
        return [v.as_py() for v in values]

    def _video(self, w: _Worker, key: str, i: int, times: np.ndarray) -> torch.Tensor:
        rel = self._video_files[key][self._cols[key][i]]
        if rel in self._index_errors:
            raise self._index_errors[rel]
        index = w.indexes.get(rel)
        if index is None:
            index = w.indexes[rel] = video.FrameIndex.load(self._index_paths[rel])
        rows = index.locate(self._from_ts[key][i] + times.astype(np.float64), self.tolerance_s,
                            episode_index=int(self._cols["episode_index"][i]), video_key=key)
        decoded = w.decoders.decode(index, rows)
        arr = np.stack([decoded[int(index.pts[r])] for r in rows])
        t = torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()
        if not self.return_uint8:
            t = t.to(torch.float32) / 255
        return t[0] if len(rows) == 1 else t

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"item {i} out of range for a dataset of {len(self)} samples")
        i = int(i) % len(self)
        w = self._w()
        c = self._cols
        fi, row, idx = int(c["file"][i]), int(c["data_row"][i]), int(c["index"][i])
        ep_from, ep_to, row0 = int(c["ep_from_index"][i]), int(c["ep_to_index"][i]), int(c["ep_data_row0"][i])
        here = np.array([row])
        item: dict[str, Any] = {}
        pads: dict[str, torch.Tensor] = {}
        video_times = {k: np.array([c["timestamp"][i]], np.float32) for k in self._video_keys}
        for col in self._columns:
            if col in self._delta:
                q, pad = _frames.query_indices(idx, self._delta[col], ep_from, ep_to)
                item[col] = self._tensor(col, self._rows(w, fi, row0 + (q - ep_from), col))
                if col in self._layout.image_keys and len(q) > 1 and item[col].ndim == 3:
                    item[col] = item[col][None]
                pads[f"{col}_is_pad"] = torch.from_numpy(pad)
            else:
                v = self._rows(w, fi, here, col)
                t = self._tensor(col, v)
                item[col] = t[0] if isinstance(t, (list, torch.Tensor)) and col not in self._layout.image_keys else t
        for k in self._video_keys:
            if k in self._delta:
                q, pad = _frames.query_indices(idx, self._delta[k], ep_from, ep_to)
                video_times[k] = self._rows(w, fi, row0 + (q - ep_from), "timestamp")
                pads[f"{k}_is_pad"] = torch.from_numpy(pad)
        item.update(pads)
        if self._video_keys:
            if w.pool is not None:
                futs = {k: w.pool.submit(self._video, w, k, i, video_times[k]) for k in self._video_keys}
                frames = {k: f.result() for k, f in futs.items()}
            else:
                frames = {k: self._video(w, k, i, video_times[k]) for k in self._video_keys}
            item = {**frames, **item}
        if self.image_transforms is not None:
            for k in self._layout.camera_keys:
                if k in item:
                    item[k] = self.image_transforms(item[k])
        item["task"] = self._tasks.get(int(c["task_index"][i]))
        for e in self._extras:
            v = self.manifest[e][i].as_py()
            item[e] = torch.tensor(v) if isinstance(v, (int, float, bool)) or (
                isinstance(v, list) and v and all(isinstance(x, (int, float, bool)) for x in v)) else v
        return item

    def __repr__(self) -> str:
        return (f"LeRobotSQLDataset({self._src.url!r}, samples={len(self)}, fps={self.fps:g}, "
                f"cameras={self._video_keys + [k for k in self._layout.image_keys if k not in self._skip_columns]}, "
                f"delta_timestamps={sorted(self._delta)})")


def _codes(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    enc = column.combine_chunks().dictionary_encode()
    return enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False).astype(np.int32)
