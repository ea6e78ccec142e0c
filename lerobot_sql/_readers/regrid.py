"""A selection served at a lower frame rate than its dataset's: which frames a recording at that rate holds, and how
it numbers them. Index math (numpy), plus the one filter of a manifest to those frames (pyarrow); no I/O.

The rule (``db.dataset(sql, fps=F)``, ``db.export(sql, dest, fps=F)``; docs/training.md, "Another frame rate"):

* ``F`` is a whole number that divides the dataset's fps: ``k = source_fps / F`` source frames per new frame
  (:func:`stride`). A ratio that is not whole (30 -> 20) is refused: a 20 fps recording has frames at times where a
  30 fps one has none, and the nearest frame would carry a time it was not recorded at (up to half a source frame,
  16.7 ms at 30 fps, 167 times lerobot's ``tolerance_s``) with actions paced unevenly (1, 2, 1, 2 source frames).
* Kept frames: those whose position in their episode (``index - ep_from_index``, which is ``frame_index`` in
  lerobot-written data, and must be) is a multiple of ``k``: frames 0, k, 2k, ... An episode of ``L`` frames has
  ``ceil(L / k)`` frames at the new rate (:meth:`Grid.lengths`).
* Numbering, as a recording at ``F`` fps numbers them (:class:`Grid`): ``frame_index = position // k``;
  ``timestamp = float32(frame_index / F)`` (lerobot's recorder); ``index`` = the index the whole dataset recorded
  at ``F`` gives that frame (the new lengths of the episodes before it, in episode_index order, plus its
  frame_index), which is what ``db.export("SELECT episode_index FROM episodes", dest, fps=F)`` writes.
  ``episode_index``, ``task_index``, features and camera frames are the source frame's own.
* ``delta_timestamps`` are seconds on the new grid (multiples of ``1 / F``); an offset of ``j`` new frames is ``k *
  j`` source frames, clamped to the episode's kept frames (its first frame and its last kept one, ``first + k *
  (ceil(L / k) - 1)``), ``_is_pad`` where it left them (:func:`lerobot_sql._readers.deltas.query_indices`' stride).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import DatasetFormatError, ResultContractError, as_real


def divisors(source_fps: float) -> list[int]:
    """The whole frame rates a dataset of ``source_fps`` can be served at (the divisors of a whole fps; just it
    otherwise)."""
    if not float(source_fps).is_integer():
        return []
    n = int(source_fps)
    return [d for d in range(1, n + 1) if n % d == 0]


def stride(fps: Any, source_fps: float) -> int:
    """Source frames per new frame, ``source_fps / fps``, for serving a dataset of ``source_fps`` at ``fps``.

    Raises:
        TypeError: ``fps`` is not a number (a string, a bool).
        ValueError: ``fps`` is not finite and > 0, is above ``source_fps`` (a recording at a higher rate has frames
            this one lacks), is not a whole number, or does not divide ``source_fps``; naming both rates and the
            rates that work.
    """
    ok = divisors(source_fps)
    v = as_real(fps)
    if v is None:
        raise TypeError(f"fps={fps!r} ({type(fps).__name__}): give the frame rate to serve the dataset at, a whole "
                        f"number dividing its {source_fps:g} fps ({ok or [source_fps]})")
    works = f"rates that work: fps in {ok}" if ok else \
        f"the dataset's fps ({source_fps:g}) is not a whole number, so it is served at its own rate only"
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"fps={fps!r}: give a whole number of frames per second > 0; {works}")
    if v > float(source_fps):
        raise ValueError(f"fps={v:g} is above the dataset's {source_fps:g} fps: a recording at {v:g} fps has frames "
                         f"at times this one has none (only a lower rate can be served from it); {works}")
    k = float(source_fps) / v
    if not v.is_integer():
        raise ValueError(f"fps={v:g}: a frame rate here is a whole number, as info.json's fps is (a {v:g} fps "
                         f"dataset could not say its rate); {works}")
    if not float(source_fps).is_integer() or int(source_fps) % int(v):
        raise ValueError(
            f"fps={v:g} does not divide the dataset's {source_fps:g} fps ({source_fps:g} / {v:g} = {k:.4g} source "
            f"frames per frame): a {v:g} fps recording has frames at times this dataset has none, and serving the "
            f"nearest frame instead would label it with a time it was not recorded at (up to half a source frame, "
            f"{500 / float(source_fps):.3g} ms, off: beyond lerobot's tolerance_s of 0.1 ms) and pace the actions "
            f"unevenly; {works}")
    return int(round(k))


@dataclasses.dataclass(frozen=True)
class Grid:
    """How a dataset served at ``fps`` numbers its frames (see the module docstring).

    Attributes:
        fps: the new frame rate (a whole number).
        stride: source frames per new frame, ``k``.
        episodes: int64 (E,), every episode_index of the dataset, ascending.
        first_index: int64 (E,), each episode's first ``index`` at the new rate (``ceil(L / k)`` of the episodes
            before it summed).
    """

    fps: int
    stride: int
    episodes: np.ndarray
    first_index: np.ndarray

    @classmethod
    def of(cls, fps: int, stride: int, episode_index: np.ndarray, length: np.ndarray) -> "Grid":
        """The grid of a dataset whose episodes ``episode_index`` (any order) hold ``length`` frames each (every
        episode of the dataset, from meta/episodes)."""
        ep = np.asarray(episode_index, np.int64)
        order = np.argsort(ep, kind="stable")
        n = cls.lengths_of(np.asarray(length, np.int64)[order], stride)
        return cls(int(fps), int(stride), ep[order], np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64))

    @staticmethod
    def lengths_of(length, stride: int):
        """Frames of episodes of ``length`` source frames at the new rate: ``ceil(length / stride)``."""
        return -(-np.asarray(length, np.int64) // stride)

    def lengths(self, length):
        """:meth:`lengths_of` at this grid's stride."""
        return self.lengths_of(length, self.stride)

    def frame_index(self, position):
        """int64: the new ``frame_index`` of frames at ``position`` (frames from their episode's start, on the
        grid)."""
        return np.asarray(position, np.int64) // self.stride

    def timestamp(self, position):
        """float32: the new ``timestamp`` (seconds) of frames at ``position``: ``frame_index / fps`` as lerobot's
        recorder writes it (float64 division, then float32)."""
        return (self.frame_index(position) / float(self.fps)).astype(np.float32)

    def index(self, episode_index, position):
        """int64: the new ``index`` of frames at ``position`` of episodes ``episode_index``.

        Raises:
            DatasetFormatError: an episode_index the grid does not know (not in meta/episodes).
        """
        ep = np.asarray(episode_index, np.int64)
        j = np.searchsorted(self.episodes, ep)
        jj = np.minimum(j, max(len(self.episodes) - 1, 0))
        if not len(self.episodes) or (self.episodes[jj] != ep).any():
            raise DatasetFormatError(f"episode(s) {np.unique(ep[self.episodes[jj] != ep])[:5].tolist()} are not in "
                                     "meta/episodes, so their frames have no index at another frame rate; run "
                                     "`lerobot-sql doctor`")
        return self.first_index[jj] + self.frame_index(position)


def on_grid(manifest: pa.Table, stride: int, mode: str | None, where: str) -> pa.Table:
    """``manifest``'s samples that a recording at ``1 / stride`` of its rate holds (position in the episode a
    multiple of ``stride``), in their order, metadata kept. Whole episodes and windows keep their frames on the
    grid; ``index`` rows (``mode`` "index") each name a frame, so a row off the grid is refused, never dropped.

    Raises:
        DatasetFormatError: a sample's ``frame_index`` is not its position in the episode (``index -
            ep_from_index``): the new numbering would not be its frame's.
        ResultContractError: ``index`` rows off the grid (naming how many, the first, and ``where``); a window
            (a result row) with no frame on the grid; no sample left on the grid.
    """
    if stride == 1 or manifest.num_rows == 0:
        return manifest
    index, ep_from = manifest["index"].to_numpy(), manifest["ep_from_index"].to_numpy()
    pos, fi = index - ep_from, manifest["frame_index"].to_numpy()
    bad = np.flatnonzero(fi != pos)
    if len(bad):
        j = int(bad[0])
        raise DatasetFormatError(
            f"episode {manifest['episode_index'][j].as_py()}: the row with index {int(index[j])} has frame_index "
            f"{int(fi[j])}, but it is frame {int(pos[j])} of the episode ({len(bad)} such rows selected); another "
            "frame rate keeps every k-th frame of an episode and numbers it frame_index // k, which needs "
            "frame_index to be each row's position. Fix the data files' frame_index (`lerobot-sql doctor`: "
            "frame_index_contiguous), or leave fps out")
    keep = pos % stride == 0
    if mode == "index" and not keep.all():
        off = np.flatnonzero(~keep)
        j = int(off[0])
        raise ResultContractError(
            f"{where}: {len(off)} of {len(keep)} index rows name frames a recording at 1/{stride} of the rate does "
            f"not hold (e.g. index {int(index[j])}, frame_index {int(fi[j])} of episode "
            f"{manifest['episode_index'][j].as_py()}: frame_index % {stride} != 0); index rows name frames, so none "
            f"is dropped silently: select frames on the grid (WHERE frame_index % {stride} = 0), or whole episodes "
            "or windows, whose frames on the grid are kept")
    if not keep.any():
        raise ResultContractError(f"{where}: none of the {len(keep)} selected frames is on the grid of 1/{stride} "
                                  f"of the rate (frame_index % {stride} = 0); widen the windows")
    if mode != "index" and "result_row" in manifest.column_names and not keep.all():
        # a window holding no frame of the grid would vanish: refused, as an empty window is at the source rate
        rows = manifest["result_row"].to_numpy()
        lost = np.setdiff1d(np.unique(rows), np.unique(rows[keep]))
        if len(lost):
            j = int(np.flatnonzero(rows == lost[0])[0])
            raise ResultContractError(
                f"{where}: {len(lost)} result row(s) hold no frame a recording at 1/{stride} of the rate has (e.g. "
                f"result row {int(lost[0])}: episode {manifest['episode_index'][j].as_py()}, frame_index "
                f"{int(fi[j])} to {int(fi[rows == lost[0]].max())}; kept frames have frame_index % {stride} = 0); "
                "none is dropped silently: widen such windows to a frame on the grid, or leave them out")
    return manifest if keep.all() else manifest.filter(pa.array(keep))
