"""The metadata checks both manifest resolvers share: one row per episode, timestamps on the fps grid, and per
camera clip pointers that cannot give a neighbouring frame without an error.

The episode fast path (:mod:`lerobot_sql._plan.episodes`, pyarrow) and the DuckDB join
(:mod:`lerobot_sql._plan.resolve`) raise these same errors, so a bad dataset fails the same way whichever path
resolved the query. The clips returned by :func:`check_clips` go into the manifest's metadata; the dataset checks
them against each mp4's real frames (:func:`lerobot_sql._readers.locate.check_clips`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa

from .._format.layout import Layout
from ..errors import DatasetFormatError, warn
from .contract import WINDOW_TOLERANCE_S


def duplicate_episode_error(episode_index: int, rows: int) -> DatasetFormatError:
    """The error for an episode that meta/episodes lists ``rows`` times."""
    return DatasetFormatError(f"meta/episodes: episode {episode_index} has {rows} rows; each episode must have "
                              "exactly one. Remove the duplicate rows (run `lerobot-sql doctor`)")


def timestamp_error(episode_index: int, err: float, fps: float, *, data_file: str | None = None,
                    frame_index: int | None = None, others: list[tuple[int, float]] = (), n_off: int = 1,
                    limit: float | None = None, frames: str = "tabular") -> DatasetFormatError:
    """The error for an episode whose ``timestamp`` column strays from ``frame_index / fps`` by ``err`` seconds
    (``err`` NaN or infinite: a timestamp that is not a finite number); ``others``: the next worst (episode, err),
    ``n_off`` episodes in all beyond ``limit`` seconds (the grid check's bound, :func:`grid_limit`).

    ``frames`` (:func:`frames_kind`) decides the advice for wall-clock timestamps: ``"tabular"`` (no camera read:
    ``tolerance_s``, which only lets the items carry them), ``"grid"`` (the cameras' clips hold exactly the episodes'
    frames, one every 1/fps: ``align="frame_index"``, since a tolerance_s would pick the frame nearest each
    wall-clock time, another row's), ``"other"`` (clips of another length: a tolerance_s, right only where the video's
    frames follow the same clock)."""
    if not math.isfinite(err):
        where = f" in {data_file}" if data_file else ""
        at = f" (frame_index {frame_index})" if frame_index is not None else ""
        return DatasetFormatError(f"episode {episode_index}: a timestamp{where}{at} is NaN or infinite; every "
                                  "timestamp must be frame_index / fps: repair or re-record that data file "
                                  "(`lerobot-sql doctor` checks timestamps)")
    also = "".join(f", episode {e} by {x:.4f} s" for e, x in others)
    count = f"; {n_off} selected episodes in all are off by more than {limit:.6g} s" if n_off > 1 and limit else ""
    tol = f"tolerance_s={math.ceil(err * 1000) / 1000:g}"
    if frames == "grid":
        advice = ("If they are wall-clock times: the cameras' clips in meta/episodes hold exactly these episodes' "
                  "frames, one every 1/fps, so read each row's frame by its position in its clip, "
                  "dataset(..., align=\"frame_index\") (checked against each mp4's real frames; "
                  "export(..., align=\"frame_index\") writes a copy with timestamp = frame_index / fps); a "
                  "tolerance_s would pick the frame nearest each wall-clock time, another row's")
    elif frames == "other":
        advice = (f"If they are wall-clock times and the videos' frames follow the same clock (their clips in "
                  f"meta/episodes are not length / fps long), pass {tol} or more (dataset(..., tolerance_s=...); "
                  "frames outside an episode's clip are never served)")
    else:
        advice = (f"If they are wall-clock times (lerobot reads them with tolerance_s), pass {tol} or more "
                  "(dataset(..., tolerance_s=...))")
    return DatasetFormatError(
        f"episode {episode_index}: timestamps differ from frame_index / fps by up to {err:.4f} s{also}{count}, with "
        f"fps={fps:g} from meta/info.json. {advice}; else fix 'fps' in info.json or the data files' timestamp column "
        "(run `lerobot-sql doctor`)")


def frames_kind(clips: list[tuple[np.ndarray, np.ndarray, np.ndarray]], fps: float) -> str:
    """For :func:`timestamp_error`: ``"tabular"`` when ``clips`` is empty (no camera read), ``"grid"`` when every
    clip (per camera, ``(from_timestamp, to_timestamp, length)`` arrays over the episodes, ``length`` their frames in
    data/) lasts exactly its episode's frames at fps (``length / fps``, or ``(length - 1) / fps`` as some writers
    store to_timestamp, within half a frame), else ``"other"``. Error path only."""
    if not clips:
        return "tabular"
    for frm, to, n in clips:
        d = (np.asarray(to, np.float64) - np.asarray(frm, np.float64)) * float(fps)
        n = np.asarray(n, np.float64)
        if not ((np.abs(d - n) <= 0.5) | (np.abs(d - (n - 1)) <= 0.5)).all():
            return "other"
    return "grid"


def grid_limit(fps: float, tolerance_s: float | None, align: str = "timestamp") -> float:
    """Seconds a timestamp may stray from ``frame_index / fps``: half a frame (a timestamp then still names its own
    frame), or ``tolerance_s`` if larger (the caller accepts timestamps that far off, as lerobot does); no bound
    with ``align="frame_index"``, which locates no frame by its timestamp (a NaN is still refused)."""
    if align == "frame_index":
        return math.inf
    return max(0.5 / float(fps), float(tolerance_s or 0.0))


def outside_clip(timestamp, length, fps: float) -> np.ndarray:
    """Which rows (bool, the shape of ``timestamp``) lie outside their episode's clip: a time (seconds from the
    clip's start, float) whose nearest frame on the fps grid is not one of the episode's ``length`` frames, i.e. not
    in ``(-0.5 / fps, (length - 0.5) / fps]`` (a tie goes to the earlier frame, as
    :func:`lerobot_sql._readers.locate.nearest` breaks it). Such a row (frame_index -1 at -1/fps, or frame_index == length) is on the grid and leaves the row
    count unchanged, but its frame is the neighbouring clip's, whatever tolerance_s is. NaN counts as outside."""
    ts = np.asarray(timestamp, np.float64)
    half = 0.5 / float(fps)
    return ~((ts > -half) & (ts <= (np.asarray(length, np.float64) - 0.5) / float(fps)))


def outside_clip_error(clips: dict[str, dict[str, list]], episode_index: int, frame_index: int, timestamp: float,
                       length: int, fps: float, data_file: str | None = None) -> DatasetFormatError:
    """The error for a data row of ``episode_index`` whose ``timestamp`` lies outside the episode's clip
    (:func:`outside_clip`); ``clips``: :func:`check_clips`'s result, whose first camera holding the episode is named
    with its mp4 and ``from_timestamp``."""
    cam = next((k for k, c in clips.items() if episode_index in c["episode_index"]), None)
    where = ""
    if cam is not None:
        c = clips[cam]
        j = c["episode_index"].index(episode_index)
        where = f" in {c['path'][j]} (from_timestamp={c['from_timestamp'][j]:.6f} s)"
    side = "before its first frame" if timestamp < 0 else "after its last frame"
    in_file = f" of {data_file}" if data_file else ""
    if frame_index is not None and 0 <= frame_index < length:  # the row is the episode's; its time is not
        fix = ("If the timestamps are wall-clock times (off frame_index / fps) over clips holding exactly the "
               "episode's frames, read each row's frame by its position: dataset(..., align=\"frame_index\"); else "
               "fix the data file's timestamp column (timestamp = frame_index / fps; `lerobot-sql doctor`: "
               "frame_index_contiguous)")
    else:
        fix = ("Fix the row in the data file (frame_index = index - the episode's first index, timestamp = "
               "frame_index / fps); `lerobot-sql doctor` lists such rows (frame_index_contiguous)")
    return DatasetFormatError(
        f"episode {episode_index}, camera {cam!r}: the row{in_file} with frame_index {frame_index} has timestamp "
        f"{timestamp:.6f} s, outside the episode's clip{where} ({side}: its {length} frames are at timestamps "
        f"{0:.6f}..{(length - 1) / float(fps):.6f} s, fps={float(fps):g}); the frame at that time is another "
        f"episode's or none, whatever tolerance_s is, so it is never served. {fix}")


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
        # A NaN or infinite clip bound (NULL is a missing pointer, refused where the manifest is finished) would sort
        # anywhere in its mp4's chain: the chain's checks would then blame the intact clips around it.
        given = (t["from_timestamp"].is_valid().to_numpy(zero_copy_only=False)
                 & t["to_timestamp"].is_valid().to_numpy(zero_copy_only=False))[keep]
        nonfinite = np.flatnonzero(given & ~(np.isfinite(f.astype(np.float64)) & np.isfinite(to.astype(np.float64))))
        if len(nonfinite):
            j = nonfinite[np.argmin(ep[nonfinite])]
            raise DatasetFormatError(
                f"meta/episodes: episode {int(ep[j])}, camera {k!r}: video clip bounds from_timestamp={float(f[j])}, "
                f"to_timestamp={float(to[j])} s (of {path[j]}, which selected episodes share) are not finite numbers; no "
                f"clip of that mp4 can be placed. Restore videos/{k}/from_timestamp and to_timestamp of episode "
                f"{int(ep[j])} from the dataset's source (`lerobot-sql doctor`), or leave the camera out "
                "(db.dataset(..., cameras=[...]) without it)")
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


def grid_error(ep: np.ndarray, err: np.ndarray, fi: np.ndarray, file_of, fps: float, limit: float,
                frames: str = "tabular"):
    """The timestamp error for the off-grid frames (episode, |error|, frame_index per frame; ``file_of(j)``: frame
    j's data file): a NaN first, else the worst episodes by their largest error; ``frames``: see
    :func:`lerobot_sql._plan.clips.timestamp_error`."""
    nan = np.flatnonzero(~np.isfinite(err))
    if len(nan):
        j = int(nan[0])
        return timestamp_error(int(ep[j]), float(err[j]), float(fps), data_file=file_of(j),
                               frame_index=int(fi[j]))
    uniq, inv = np.unique(ep, return_inverse=True)
    worst = np.zeros(len(uniq))
    np.maximum.at(worst, inv, err)
    order = np.argsort(-worst, kind="stable")
    top = [(int(uniq[i]), float(worst[i])) for i in order[:4]]
    return timestamp_error(*top[0], float(fps), others=top[1:], n_off=len(uniq), limit=limit, frames=frames)


@dataclasses.dataclass
class FrameRules:
    """What each frame of a selection opened by :func:`lerobot_sql._plan.episodes.episode_runs` must satisfy, checked per row group where it is
    first read (:func:`check_frames`): ``fps``; ``limit``, how far a timestamp may stray from ``frame_index / fps``
    (:func:`grid_limit`); ``in_clip``, every timestamp must name one of its episode's clip frames (the cameras are
    read by time); ``positions``, every frame_index must be its position in the episode (align="frame_index");
    ``clips``, the checked clips (:func:`check_clips`), named in the errors; ``windows``, the selection's windows were
    planned on the fps grid (:func:`check_window_frames` checks each window's rows, and the frames beside it)."""

    fps: float
    limit: float
    in_clip: bool
    positions: bool
    clips: dict = dataclasses.field(default_factory=dict)
    windows: bool = False


def check_frames(rules: FrameRules, data_file: str, index: np.ndarray, episode_index: np.ndarray,
                 frame_index: np.ndarray, timestamp: np.ndarray, exp_index: np.ndarray, exp_episode: np.ndarray,
                 ep_from: np.ndarray, length: np.ndarray) -> None:
    """Check the frames of some rows of ``data_file`` (one row group's, as read) against where the episode
    pointers put them (``exp_index``, ``exp_episode``, the episode's first index ``ep_from`` and ``length``, per
    row) and ``rules`` (see :class:`FrameRules`): the same checks :func:`episode_manifest` makes of every frame at
    the open.

    Raises:
        DatasetFormatError: a row is not the one the pointers name (the file is not laid out as lerobot writes
            it), a timestamp off the fps grid or outside its episode's clip, or a frame_index that is not its
            position (align="frame_index"); naming the file, episode, row and the fix.
    """
    bad = np.flatnonzero((index != exp_index) | (episode_index != exp_episode))
    if len(bad):
        j = int(bad[0])
        raise DatasetFormatError(
            f"{data_file}: the row where meta/episodes puts index {int(exp_index[j])} of episode "
            f"{int(exp_episode[j])} holds index {int(index[j])} of episode {int(episode_index[j])}: the file's rows are not one block per "
            "episode in index order, as lerobot writes them (and meta/episodes' dataset_from_index / "
            "dataset_to_index say). Select the frames with a query, which reads each frame's own row "
            "(db.dataset(\"SELECT index FROM frames ORDER BY index\")), or fix the file (`lerobot-sql doctor`)")
    ts = np.asarray(timestamp, np.float64)
    fi = np.asarray(frame_index, np.int64)
    err = np.abs(ts - fi / rules.fps)
    off = np.flatnonzero(~(err <= rules.limit))
    if len(off):
        raise grid_error(exp_episode[off], err[off], fi[off], lambda j: data_file, rules.fps, rules.limit,
                          "grid" if rules.in_clip or rules.positions else "tabular")
    if rules.in_clip:
        out = np.flatnonzero(outside_clip(ts, length, rules.fps))
        if len(out):
            j = int(out[0])
            raise outside_clip_error(rules.clips, int(exp_episode[j]), int(fi[j]), float(ts[j]), int(length[j]),
                                     rules.fps, data_file)
    if rules.positions:
        wrong = np.flatnonzero(fi != index - ep_from)
        if len(wrong):
            j = int(wrong[0])
            raise DatasetFormatError(
                f"episode {int(exp_episode[j])}: the row with index {int(index[j])} of {data_file} has frame_index "
                f"{int(fi[j])}, but it is frame {int(index[j] - ep_from[j])} of the episode (index - the episode's "
                "first index): align=\"frame_index\" reads each row's frame by its position, so the item would "
                "carry a frame_index that is not its frame's. Fix the data files' frame_index (`lerobot-sql "
                "doctor`: frame_index_contiguous), or read by time (align=\"timestamp\")")


def check_window_frames(data_file: str, episode_index: np.ndarray, result_row: np.ndarray, index: np.ndarray,
                        position: np.ndarray, frame_index: np.ndarray, timestamp: np.ndarray, lo_s: np.ndarray,
                        hi_s: np.ndarray, inside: np.ndarray) -> None:
    """Check rows of ``data_file`` against the windows planned on the fps grid
    (:func:`lerobot_sql._plan.episodes.grid_window`): per row its episode, the window's ``result_row``, ``index``,
    ``position`` in the episode (``index - ep_from``), stored ``frame_index`` and ``timestamp`` (seconds, as stored,
    as float64), the window's ``[lo_s, hi_s)`` (its bounds less the join's tolerance) and ``inside`` (True: a frame
    the window holds; False: the frame just before or after it). The join that reads every frame selects the frames
    whose timestamp lies in ``[lo_s, hi_s)``; the plan holds only where each read frame agrees, and where
    frame_index is the row's position (a frame elsewhere in the episode would otherwise be found by its time).

    Raises:
        DatasetFormatError: naming the file, episode, window, frame and the ways out.
    """
    plan = ("a selection of more than LSQL_LAZY_FRAMES frames (default 2,000,000) opens without reading its "
            "frames, its windows planned on the fps grid (frame k at k / fps)")
    out = ("open it reading every frame (set LSQL_LAZY_FRAMES above its frame count, or select less), or fix the "
           "data files (`lerobot-sql doctor`: frame_index_contiguous, tolerance_s)")
    wrong = np.flatnonzero(frame_index != position)
    if len(wrong):
        j = int(wrong[0])
        raise DatasetFormatError(
            f"{data_file}: episode {int(episode_index[j])}'s row with index {int(index[j])} has frame_index "
            f"{int(frame_index[j])}, but it is frame {int(position[j])} of the episode: {plan}, and a frame out of "
            f"its place may belong to another window. To select by the rows' own times, {out}")
    ts = np.asarray(timestamp, np.float64)
    holds = (ts >= lo_s) & (ts < hi_s)
    bad = np.flatnonzero(holds != inside)
    if len(bad):
        j = int(bad[0])
        raise DatasetFormatError(
            f"{data_file}: episode {int(episode_index[j])}'s frame {int(frame_index[j])} has timestamp "
            f"{float(ts[j])!r} s, {'outside' if inside[j] else 'inside'} the window of result row "
            f"{int(result_row[j])} (frames at [{float(lo_s[j])!r}, {float(hi_s[j])!r}) s: its bounds less "
            f"{WINDOW_TOLERANCE_S} s), "
            f"where the fps grid puts frame {int(position[j])} {'inside' if inside[j] else 'outside'}: {plan}, and "
            f"this dataset's timestamps stray from the grid at the window's bound. Move the bound half a frame "
            f"away from the frame times, or {out}")
