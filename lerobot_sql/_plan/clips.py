"""The metadata checks both manifest resolvers share: one row per episode, timestamps on the fps grid, and per
camera clip pointers that cannot give a neighbouring frame without an error.

The episode fast path (:mod:`lerobot_sql._plan.episodes`, pyarrow) and the DuckDB join
(:mod:`lerobot_sql._plan.resolve`) raise these same errors, so a bad dataset fails the same way whichever path
resolved the query. The clips returned by :func:`check_clips` go into the manifest's metadata; the dataset checks
them against each mp4's real frames (:func:`lerobot_sql._readers.locate.check_clips`).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from ..errors import DatasetFormatError, warn
from .._format.layout import Layout


def duplicate_episode_error(episode_index: int, rows: int) -> DatasetFormatError:
    """The error for an episode that meta/episodes lists ``rows`` times."""
    return DatasetFormatError(f"meta/episodes: episode {episode_index} has {rows} rows; each episode must have "
                              "exactly one. Remove the duplicate rows (run `lerobot-sql doctor`)")


def timestamp_error(episode_index: int, err: float, fps: float, *, data_file: str | None = None,
                    frame_index: int | None = None, others: list[tuple[int, float]] = (), n_off: int = 1,
                    limit: float | None = None) -> DatasetFormatError:
    """The error for an episode whose ``timestamp`` column strays from ``frame_index / fps`` by ``err`` seconds
    (``err`` NaN or infinite: a timestamp that is not a finite number); ``others``: the next worst (episode, err),
    ``n_off`` episodes in all beyond ``limit`` seconds (the grid check's bound, :func:`grid_limit`)."""
    if not math.isfinite(err):
        where = f" in {data_file}" if data_file else ""
        at = f" (frame_index {frame_index})" if frame_index is not None else ""
        return DatasetFormatError(f"episode {episode_index}: a timestamp{where}{at} is NaN or infinite; every "
                                  "timestamp must be frame_index / fps: repair or re-record that data file "
                                  "(`lerobot-sql doctor` checks timestamps)")
    also = "".join(f", episode {e} by {x:.4f} s" for e, x in others)
    count = f"; {n_off} selected episodes in all are off by more than {limit:.6g} s" if n_off > 1 and limit else ""
    return DatasetFormatError(
        f"episode {episode_index}: timestamps differ from frame_index / fps by up to {err:.4f} s{also}{count}, with "
        f"fps={fps:g} from meta/info.json. If they are wall-clock times (lerobot reads them with tolerance_s), pass "
        f"tolerance_s={math.ceil(err * 1000) / 1000:g} or more (dataset(..., tolerance_s=...)); else fix 'fps' in "
        "info.json or the data files' timestamp column (run `lerobot-sql doctor`)")


def grid_limit(fps: float, tolerance_s: float | None) -> float:
    """Seconds a timestamp may stray from ``frame_index / fps``: half a frame (a timestamp then still names its own
    frame), or ``tolerance_s`` if larger (the caller accepts timestamps that far off, as lerobot does)."""
    return max(0.5 / float(fps), float(tolerance_s or 0.0))


def check_clips(layout: Layout, videos: dict[str, pa.Table], length: dict[int, int],
                selected: np.ndarray, keys: list[str] | None = None) -> dict[str, dict[str, list]]:
    """Refuse per-camera clip pointers that would give a neighbouring frame without an error, and return the clips.

    Checks, per camera over the selected episodes: the clip starts at or after 0 (within half a frame), lasts at least
    the episode's frame count in data/ less one frame (writers that store ``to_timestamp = (length - 1) / fps``
    pass; a longer clip, frames past the episode's kept in the mp4, is read from its start with a ``UserWarning``),
    and does not start half a frame or more before the end of the previous clip of its mp4 (by ``from_timestamp``),
    nor does the next clip start before its end. A start shifted by whole frames passes these; the dataset checks
    those against the mp4's real frames from what this returns.

    Args:
        videos: per video_key, the clips of every episode sharing an mp4 with a selected one: ``episode_index``,
            ``path``, ``from_timestamp``, ``to_timestamp`` (seconds).
        length: frames in data/ per episode (episodes absent or with 0 frames occupy no frame and are skipped).
        selected: the selected episode_index values.
        keys: the cameras to check (default every video key); the others are neither checked nor returned.

    Returns:
        per video_key, column lists over the selected episodes ordered by episode: ``episode_index``, ``path``,
        ``from_timestamp``, ``length``, and the clips just before and after in the same mp4: ``prev_episode``,
        ``prev_from_timestamp``, ``prev_length``, ``next_episode``, ``next_from_timestamp`` (None at the file's ends);
        and ``chains``: per mp4 a selected episode uses, every clip in it (``episode_index``, ``from_timestamp``,
        ``length``) ordered by ``from_timestamp``, for :func:`lerobot_sql._readers.locate.check_clips`.

    Raises:
        DatasetFormatError: naming the episode, camera, mp4 and the fix (the lowest bad episode_index first).
    """
    fps = float(layout.fps)
    half = 0.5 / fps
    sel = set(int(e) for e in selected)
    out = {}
    long_clips: list[tuple] = []
    for k in layout.video_keys if keys is None else keys:
        t = videos[k]
        ep = t["episode_index"].to_numpy()
        n = np.array([length.get(int(e), 0) for e in ep], np.int64)
        keep = n > 0
        ep, n = ep[keep], n[keep]
        path = np.asarray(t["path"].to_pylist(), dtype=object)[keep]
        f = t["from_timestamp"].to_numpy(zero_copy_only=False)[keep]
        to = t["to_timestamp"].to_numpy(zero_copy_only=False)[keep]
        order = np.lexsort((ep, f, path))
        ep, n, path, f, to = ep[order], n[order], path[order], f[order], to[order]
        same_prev = np.r_[False, path[1:] == path[:-1]]
        same_next = np.r_[path[:-1] == path[1:], False]
        is_sel = np.array([int(e) in sel for e in ep], bool)
        prev = np.maximum(np.arange(len(ep)) - 1, 0)  # (row 0 has no previous clip: same_prev masks it)
        nxt = np.minimum(np.arange(len(ep)) + 1, max(len(ep) - 1, 0))
        starts_early = is_sel & (f < -half)
        # Shorter than the data by more than a frame: its last frames lie outside the clip. Longer: a writer kept
        # frames past the episode's (a discarded take): the first `length` frames are the episode's, as lerobot
        # reads them, and the dataset checks that they do not run into the next clip; warned about below.
        wrong_len = is_sel & (n - (to - f) * fps > 1.001)
        too_long = is_sel & ((to - f) * fps - n > 1.001)
        overlap = same_prev & (is_sel | is_sel[prev]) & (f < to[prev] - half)
        bad = np.flatnonzero(starts_early | wrong_len | overlap)
        if len(bad):
            j = bad[np.argmin(ep[bad])]
            if starts_early[j]:
                why = "starts before 0 s"
            elif overlap[j]:
                why = f"overlaps the clip of episode {int(ep[prev[j]])}, which ends at {to[prev[j]]:.6f} s"
            else:
                why = f"lasts {(to[j] - f[j]) * fps:.2f} frames but the episode has {int(n[j])} frames in data/"
            raise DatasetFormatError(
                f"meta/episodes: episode {int(ep[j])}, camera {k!r}: video clip [{f[j]:.6f}, {to[j]:.6f}) s of "
                f"{path[j]} {why}; reading it would give wrong frames. Fix videos/{k}/from_timestamp and "
                "to_timestamp (run `lerobot-sql doctor`)")
        long_rows = np.flatnonzero(too_long)
        if len(long_rows):
            long_clips += [(int(ep[j]), k, (to[j] - f[j]) * fps, int(n[j]), path[j]) for j in long_rows]
        rows = np.flatnonzero(is_sel)
        rows = rows[np.argsort(ep[rows], kind="stable")]
        opt = lambda mask, values: [v.item() if m else None for m, v in zip(mask, values)]  # noqa: E731
        out[k] = {
            "episode_index": ep[rows].tolist(), "path": path[rows].tolist(), "from_timestamp": f[rows].tolist(),
            "length": n[rows].tolist(),
            "prev_episode": opt(same_prev[rows], ep[prev[rows]]),
            "prev_from_timestamp": opt(same_prev[rows], f[prev[rows]]),
            "prev_length": opt(same_prev[rows], n[prev[rows]]),
            "next_episode": opt(same_next[rows], ep[nxt[rows]]),
            "next_from_timestamp": opt(same_next[rows], f[nxt[rows]]),
            # The whole chain of every touched mp4 (the dataset checks it against the file's frames at first open:
            # a run of clips shifted by whole frames shows only where the run ends, maybe far from the selection).
            "chains": {str(p): {"episode_index": ep[m].tolist(), "from_timestamp": f[m].tolist(),
                                "length": n[m].tolist()}
                       for p in dict.fromkeys(path[rows].tolist()) for m in [path == p]},
        }
    if long_clips:
        long_clips.sort()
        e, k, frames, n_, p = long_clips[0]
        warn(
            f"meta/episodes: episode {e}, camera {k!r}: its video clip in {p} lasts {frames:.2f} frames but the "
            f"episode has {n_} frames in data/ ({len(long_clips)} such clip(s) among the selected episodes); the first "
            f"{n_} frames from from_timestamp are read, as lerobot reads them (checked not to run into the next clip), "
            "and the rest of the clip is left unused. If the data lost rows instead, run `lerobot-sql doctor`")
    return out
