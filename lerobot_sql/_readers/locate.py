"""Where a frame is: the one home of the rule episode -> mp4 -> time in the file -> frame row -> keyframe row.

A sample's camera frame lives in the mp4 the manifest names (``<video_key>/file``), at ``from_timestamp +
timestamp`` seconds (:func:`time_in_file`: where the episode starts in that file plus the frame's time in the
episode). The frame shown there is the one whose pts is nearest to that time, and only within ``tolerance_s``
(:func:`nearest`, :func:`locate`, :func:`rows_within`; a neighbouring frame is never returned instead), and only inside
the episode's clip (:func:`clip_first_rows`, :func:`keep_in_clip`, :func:`keep_own_frame`); with
``align="frame_index"`` it is the clip's first frame plus the row's frame_index instead (:func:`rows_by_position`,
checked to lie on the fps grid). Decoding it must start at its
keyframe row (:func:`key_rows`, corrected for reordered frames), and a reader fetches the packets from that keyframe
up to a few packets past the frame (:func:`packet_ranges`, :func:`packet_spans`). An episode's clip must match the mp4's real frames
(:func:`check_clips`), which per-frame lookups cannot tell. The dataset, ``prefetch`` and ``export`` all ask here;
the arrays come from a file's index (:class:`lerobot_sql._readers.video_index.FrameIndex`, built by demuxing).

Arrays: ``pts`` int64 (n,) in stream time-base units and ``pts_s`` float64 (n,) seconds, sorted by presentation
time; rows are positions in them.
"""

from __future__ import annotations

import numpy as np

from ..errors import DatasetFormatError, FrameNotFoundError, as_real

DECODER_DELAY = 4  # packets a decoder may read past a frame before it outputs that frame
AVIO_BUFFER = 32 << 10  # PyAV reads files in blocks of this size: a decode reads up to one block past its packet


def check_tolerance(tolerance_s) -> float:
    """``tolerance_s`` (seconds a frame's pts may be from the time asked for; lerobot's default 1e-4) as a float.

    Raises:
        TypeError: not a real number: a string or a bool (``float('1')`` and ``float(True)`` would pass, and a
            typo'd config value must not become a tolerance silently).
        ValueError: not finite or not > 0. A negative or NaN tolerance matches no frame (every item would raise),
            an infinite one any frame. 0 as well: lerobot keeps a frame only if |ts - pts| < tolerance_s
            (strictly), so 0 fails every video item there, and here it would serve the frames whose float pts
            happen to equal the time and fail the rest.
    """
    v = as_real(tolerance_s)
    if v is None:
        raise TypeError(f"tolerance_s must be a number of seconds (lerobot's default: 1e-4), not "
                        f"{type(tolerance_s).__name__} {tolerance_s!r}")
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"tolerance_s must be a finite number of seconds > 0 (lerobot's default: 1e-4), not "
                         f"{tolerance_s!r}")
    return v


def time_in_file(from_timestamp, timestamp) -> np.ndarray:
    """Seconds in the mp4 (float64) of frames at ``timestamp`` (seconds from the episode start, float32 in the data
    files) of an episode whose clip starts at ``from_timestamp`` (float64, meta/episodes)."""
    return np.asarray(from_timestamp, np.float64) + np.asarray(timestamp).astype(np.float64)


def key_rows(pts: np.ndarray, keyframe_pts: np.ndarray, is_keyframe: np.ndarray) -> np.ndarray:
    """Row of the keyframe a decoder must start from for each row (rows sorted by pts), int64 (n,).

    The keyframe recorded at demux time is the last one before the packet in decode order. With reordered frames
    (B-frames, open GOPs) that keyframe may be presented after the frame itself, so take the earlier of it and the
    last keyframe in presentation order: starting earlier costs decode time, never a wrong frame.
    """
    n = len(pts)
    by_decode = np.minimum(np.searchsorted(pts, keyframe_pts), np.arange(n))
    marks = np.where(is_keyframe, np.arange(n), 0)
    by_pts = np.maximum.accumulate(marks) if n else marks
    return np.minimum(by_decode, by_pts).astype(np.int64)


def nearest(pts_s: np.ndarray, times_s) -> tuple[np.ndarray, np.ndarray]:
    """(row int64, |error| float64 seconds) of the frame nearest to each time; ties go to the earlier frame."""
    times_s = np.asarray(times_s, np.float64)
    if len(pts_s) == 1:
        pick = np.zeros(times_s.shape, np.int64)
    else:
        pos = np.clip(np.searchsorted(pts_s, times_s), 1, len(pts_s) - 1)
        left = pos - 1
        pick = np.where(np.abs(pts_s[left] - times_s) <= np.abs(pts_s[pos] - times_s), left, pos)
    return pick, np.abs(pts_s[pick] - times_s)


def rows_within(pts_s: np.ndarray, times_s, tolerance_s: float) -> np.ndarray:
    """Row (int64) of the frame nearest to each time, -1 where none lies within ``tolerance_s``: the rule of
    :func:`locate` without raising, for readers that locate many frames at once and raise per item."""
    pick, err = nearest(pts_s, times_s)
    return np.where(err <= tolerance_s, pick, -1)


def locate(pts: np.ndarray, pts_s: np.ndarray, times_s, tolerance_s: float, *, path: str, episode_index: int,
           video_key: str) -> np.ndarray:
    """Rows of the frames presented at ``times_s`` (seconds in the file ``path``).

    Raises:
        FrameNotFoundError: some time has no frame within ``tolerance_s``; names file, episode, camera, the queried
            time and the nearest pts. A neighbouring frame is never returned instead.
    """
    times_s = np.asarray(times_s, np.float64)
    pick, err = nearest(pts_s, times_s)
    bad = np.flatnonzero(~(err <= tolerance_s))
    if len(bad):
        i = bad[0]
        # The file's own rate (error path only): a stream of another rate than info.json's fps shows here first.
        step = float(np.median(np.diff(pts_s))) if len(pts_s) > 1 else 0.0
        rate = f" The file's frames come at {1 / step:.2f} fps (median pts spacing); if info.json's fps differs, " \
            "frames are still looked up by time (doctor: video_stream_rate)." if step > 0 else ""
        raise FrameNotFoundError(
            f"{path}: no frame of camera {video_key!r} within tolerance_s={tolerance_s} of t={times_s[i]:.6f}s "
            f"(episode {episode_index}); nearest frame has pts={int(pts[pick[i]])} "
            f"({pts_s[pick[i]]:.6f}s, off by {err[i]:.6f}s). The episode's from_timestamp or timestamps "
            f"disagree with the video: run `lerobot-sql doctor`, or raise tolerance_s if the drift is expected and "
            f"under half a frame (wall-clock timestamps over clips holding exactly their frames: "
            f"align=\"frame_index\").{rate}"
        )
    return pick


OUTSIDE = -2  # a row marker: the frame found lies outside the episode's clip (never served)
OFF_GRID = -3  # a row marker: the frame found is not the row's own frame of a clip on the fps grid (never served)
GRID_FRAMES = 0.25  # a frame is "on the grid" when its pts is within this many frames of from_timestamp + k / fps
ALIGNS = ("timestamp", "frame_index")


def check_align(align) -> str:
    """``align`` (how a row's camera frame is found) as given, if it is one of :data:`ALIGNS`.

    ``"timestamp"`` (default, lerobot's rule): the frame nearest to ``from_timestamp + timestamp`` within
    ``tolerance_s``. ``"frame_index"``: the row's ``frame_index``-th frame of its episode's clip (the clip's first
    frame, :func:`clip_first_rows`, plus frame_index), for data whose timestamps are not the video's (wall-clock
    times) over clips holding exactly the episode's frames on the fps grid; checked: the frame lies at
    ``from_timestamp + frame_index / fps`` (:func:`rows_by_position`).

    Raises:
        ValueError: anything else (naming both choices).
    """
    if not isinstance(align, str) or align not in ALIGNS:
        raise ValueError(f"align must be 'timestamp' (frames at from_timestamp + timestamp, lerobot's rule) or "
                         f"'frame_index' (each row's frame_index-th frame of its episode's clip), not {align!r}")
    return align


def clip_first_rows(pts_s: np.ndarray, from_timestamp, fps: float) -> np.ndarray:
    """Row (int64) of the first frame of each clip starting at ``from_timestamp`` (seconds in the file): the first
    frame presented no earlier than half a frame before it, the rule of :func:`chain_problems`. The clip's frames
    are that row and the ``length - 1`` after it."""
    return np.searchsorted(pts_s, np.asarray(from_timestamp, np.float64) - 0.5 / float(fps)).astype(np.int64)


def keep_in_clip(rows: np.ndarray, first: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``rows`` (int, -1: no frame within tolerance) with :data:`OUTSIDE` where the frame lies outside its clip,
    frames ``first .. first + length - 1``: the nearest frame to a time may be the neighbouring episode's when the
    tolerance is larger than the gap to it, and it must never be served as this episode's."""
    out = (rows >= 0) & ((rows < first) | (rows >= first + length))
    return np.where(out, OUTSIDE, rows).astype(rows.dtype)


def on_grid(pts_s: np.ndarray, first, position, from_timestamp, fps: float) -> np.ndarray:
    """Whether the frame at ``position`` (0-based) of each clip (first row ``first``, starting at ``from_timestamp``
    seconds) exists and is presented at ``from_timestamp + position / fps`` within :data:`GRID_FRAMES` of a frame,
    as lerobot's encoder writes every frame (bool, the broadcast shape)."""
    rows = np.asarray(first, np.int64) + np.asarray(position, np.int64)
    n = len(pts_s)
    if not n:
        return np.zeros(np.shape(rows), bool)
    at = pts_s[np.clip(rows, 0, n - 1)]
    want = np.asarray(from_timestamp, np.float64) + np.asarray(position, np.float64) / float(fps)
    return (rows >= 0) & (rows < n) & (np.asarray(position) >= 0) & (np.abs(at - want) <= GRID_FRAMES / float(fps))


def rows_by_position(pts_s: np.ndarray, first, position, length, from_timestamp, fps: float) -> np.ndarray:
    """Rows (int64) of the frames at ``position`` (a row's frame_index) in clips starting at row ``first`` of
    ``length`` frames: the ``align="frame_index"`` rule, which reads no timestamp. :data:`OUTSIDE` where the
    position is not one of the clip's frames or lies past the file's end, :data:`OFF_GRID` where that frame is not
    at ``from_timestamp + position / fps`` (:func:`on_grid`: then the position does not name the row's frame)."""
    position = np.asarray(position, np.int64)
    rows = np.asarray(first, np.int64) + position
    inside = (position >= 0) & (position < length) & (rows < len(pts_s))
    return np.where(inside, np.where(on_grid(pts_s, first, position, from_timestamp, fps), rows, OFF_GRID), OUTSIDE)


def keep_own_frame(rows: np.ndarray, pts_s: np.ndarray, first, position, from_timestamp, fps: float) -> np.ndarray:
    """``rows`` found by time with :data:`OFF_GRID` where the row's own frame (``position`` in its clip) is on the
    fps grid (:func:`on_grid`) but the frame found is another: timestamps more than half a frame off the grid (wall-
    clock times) read with a ``tolerance_s`` that lets them match, which would serve another row's frame."""
    own = np.asarray(first, np.int64) + np.asarray(position, np.int64)
    bad = (rows >= 0) & (rows != own) & on_grid(pts_s, first, position, from_timestamp, fps)
    return np.where(bad, OFF_GRID, rows).astype(rows.dtype)


def clip_error(path: str, pts_s: np.ndarray, kind: int, *, episode_index: int, video_key: str, position: int,
               first: int, length: int, from_timestamp: float, fps: float, time_s: float | None = None,
               row: int | None = None, tolerance_s: float | None = None) -> DatasetFormatError:
    """The error for a frame never served (``kind``: :data:`OUTSIDE` or :data:`OFF_GRID`) of the row at ``position``
    (frame_index) of an episode whose clip in ``path`` is frames ``first .. first + length - 1`` from
    ``from_timestamp``; ``time_s``, ``row``, ``tolerance_s``: the time looked up and the frame found (None with
    ``align="frame_index"``). Names the file, camera, episode, frame, times and the fix."""
    fps = float(fps)
    last = first + length - 1
    n = len(pts_s)
    clip = (f"the episode's clip is frames {first}..{last} of the file ({pts_s[first]:.6f}..{pts_s[last]:.6f} s)"
            if 0 <= first and last < n else
            f"the episode's clip, frames {first}..{last}, runs past the file's last frame ({n - 1})")
    head = f"{path}: camera {video_key!r}, episode {episode_index}, frame_index {position}: "
    want = from_timestamp + position / fps
    if time_s is None:  # align="frame_index"
        if kind == OUTSIDE:
            return DatasetFormatError(
                f"{head}align=\"frame_index\" reads frame {first + position} of the file, but {clip}: it is not one "
                f"of the episode's {length} frames, and another episode's frame is never served. Fix the row's "
                "frame_index (index - the episode's first index) or videos/<camera>/from_timestamp in meta/episodes "
                "(run `lerobot-sql doctor`)")
        r = first + position
        return DatasetFormatError(
            f"{head}align=\"frame_index\" reads frame {r} of the file, presented at {pts_s[r]:.6f} s, but the "
            f"row's frame is due at from_timestamp + frame_index / fps = {want:.6f} s (fps={fps:g}; off by "
            f"{abs(pts_s[r] - want) * fps:.2f} frames): this clip's frames are not on the fps grid, so a position "
            "does not name a frame. Read by time (align=\"timestamp\", the default) or fix "
            f"videos/{video_key}/from_timestamp in meta/episodes (run `lerobot-sql doctor`: video_frame_pts, "
            "video_segment_frames)")
    found = f"the frame nearest to t={time_s:.6f} s within tolerance_s={tolerance_s} is frame {row} of the file " \
        f"({pts_s[row]:.6f} s)"
    if kind == OUTSIDE:
        return DatasetFormatError(
            f"{head}{found}, but {clip}: another episode's frame is never served, whatever tolerance_s is. The "
            "row's timestamp disagrees with the video: if the timestamps are wall-clock times and each clip holds "
            "exactly its episode's frames, read with align=\"frame_index\" (frames by their position in the clip); "
            "else fix the timestamp column or from_timestamp (run `lerobot-sql doctor`)")
    own = first + position
    return DatasetFormatError(
        f"{head}{found}, but the clip's frames are on the fps grid and the row's own frame is frame {own} "
        f"({pts_s[own]:.6f} s = from_timestamp + frame_index / fps, {abs(row - own)} frame(s) away): the row's "
        f"timestamp is off the video by more than half a frame (wall-clock times?), and tolerance_s={tolerance_s} "
        "would serve another row's frame. Read the frames by their position in the clip: align=\"frame_index\"; "
        "or fix the data files' timestamp column (run `lerobot-sql doctor`: frame_index_contiguous)")


def packet_ranges(rows, key_row: np.ndarray, byte_offset: np.ndarray, byte_size: np.ndarray, *,
                  readahead: int = 0, delay: int = DECODER_DELAY) -> list[tuple[int, int]]:
    """Byte ranges [start, end) a decoder reads to output the frames at ``rows``: from the earliest packet of the
    frame's keyframe run up to ``delay`` packets past the frame, plus ``readahead`` bytes (a demuxer reads in
    blocks). Rows are presentation order; packets of reordered frames are found among the rows between. One range
    per row, in the order given (:func:`packet_spans` is the rule, for all rows of a file at once)."""
    rows = np.asarray(rows, np.int64).ravel()
    if not len(rows):
        return []
    starts, ends = _spans(rows, key_row, byte_offset, byte_size, readahead, delay)
    return list(zip(starts.tolist(), ends.tolist()))


SPAN_VECTOR = 64  # keyframe run + delay (packets) up to which the spans are one (rows, span) numpy pass


def packet_spans(key_row: np.ndarray, byte_offset: np.ndarray, byte_size: np.ndarray, *, readahead: int = 0,
                 delay: int = DECODER_DELAY) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`packet_ranges` of every row of a file, as two int64 (n,) arrays ``(start, end)``, or None when a
    keyframe run is longer than ``SPAN_VECTOR`` packets (then the table would cost rows x span: ask
    :func:`packet_ranges` for the rows needed instead).

    Built once per mp4 and process by the pipeline's planner, so that each batch's plan is a gather of its rows
    (per batch, the numpy passes of :func:`packet_ranges` over ~64 rows were ~0.1 ms each, 4-8 per batch)."""
    n = len(byte_offset)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    key_row = np.asarray(key_row, np.int64)
    rows = np.arange(n, dtype=np.int64)
    if int((np.minimum(rows + delay, n - 1) - key_row).max()) + 1 > SPAN_VECTOR:
        return None
    starts, ends = np.empty(n, np.int64), np.empty(n, np.int64)
    for a in range(0, n, 8192):  # chunks: the (rows, span) temporaries stay a few MB
        starts[a:a + 8192], ends[a:a + 8192] = _spans(rows[a:a + 8192], key_row, byte_offset, byte_size,
                                                      readahead, delay)
    return starts, ends


def _spans(rows: np.ndarray, key_row: np.ndarray, byte_offset: np.ndarray, byte_size: np.ndarray, readahead: int,
           delay: int) -> tuple[np.ndarray, np.ndarray]:
    """The rule of :func:`packet_ranges` for ``rows`` (int64, non-empty), as ``(start, end)`` int64 arrays.

    Vectorised over the rows when the spans (keyframe run + delay) are short, as lerobot's GOPs are. Long spans
    (a file with few keyframes) go row by row, so the work stays the rows' spans, not rows x span."""
    last = len(byte_offset) - 1
    end = byte_offset + byte_size
    lo = np.asarray(key_row, np.int64)[rows]
    hi = np.minimum(rows + delay, last)
    span = int((hi - lo).max()) + 1
    if span > SPAN_VECTOR:
        pairs = [(int(byte_offset[a:r + 1].min()), int(end[a:h + 1].max()) + readahead)
                 for a, r, h in zip(lo.tolist(), rows.tolist(), hi.tolist())]
        return np.array([a for a, _ in pairs], np.int64), np.array([b for _, b in pairs], np.int64)
    k = lo[:, None] + np.arange(span)  # (rows, span): each row's packets, clipped below to stay in the file
    kk = np.minimum(k, last)
    starts = np.where(k <= rows[:, None], byte_offset[kk], np.iinfo(np.int64).max).min(axis=1)
    ends = np.where(k <= hi[:, None], end[kk], np.iinfo(np.int64).min).max(axis=1) + readahead
    return starts.astype(np.int64), ends.astype(np.int64)


def check_clips(pts_s: np.ndarray, clips: dict | None, rel: str, *, fps: float, where: str, video_key: str) -> None:
    """Check the clip chain of mp4 ``rel`` against its real frames, where per-frame lookups cannot.

    In a lerobot-written file each episode's clip is a run of ``length`` consecutive frames starting at the frame
    presented at ``from_timestamp``, and the clips of one file do not share frames. A start shifted by whole frames
    still finds a frame for every timestamp (the neighbour's), so only this check can tell. It takes every clip of
    the file (the manifest's ``chains``), not only the selected ones: a run of consecutive clips all shifted by the
    same whole frames overlaps nothing inside, and shows only where the run ends, maybe far from the selection (see
    :func:`chain_problems` for the rule). ``to_timestamp`` is not used, so writers that store ``to_timestamp =
    from_timestamp + (length - 1) / fps`` pass. A time maps to the first frame presented no earlier than half a
    frame before it. Cost: a few vectorised passes over the file's clips, once per mp4 and process.

    Args:
        pts_s: the file's frame times (float64 seconds, sorted). clips: column lists from
            :func:`lerobot_sql._plan.clips.check_clips` (the manifest's metadata) for camera ``video_key``, or None.
            where: the mp4's path or URL, for the message.

    Raises:
        DatasetFormatError: a selected episode's clip is implicated; names the mp4, camera, the episodes (the run),
            the offset in frames and seconds where the frames tell it, and the fix.
    """
    if not clips:
        return
    sel = np.flatnonzero(np.asarray(clips["path"], dtype=object) == rel)
    if not len(sel):
        return
    chain = (clips.get("chains") or {}).get(rel)
    if chain is None:  # a manifest written before chains
        return _check_neighbours(pts_s, clips, sel, fps=fps, where=where, video_key=video_key)
    msg = chain_problems(pts_s, chain, {clips["episode_index"][j] for j in sel}, fps=fps, video_key=video_key)
    if msg:
        raise DatasetFormatError(f"{where}: camera {video_key!r}, {msg}")


def chain_problems(pts_s: np.ndarray, chain: dict, selected, *, fps: float, video_key: str) -> str | None:
    """What is wrong with the clip of the first implicated selected episode in one mp4's clip chain, or None.

    The rule. Clip i occupies frames ``a_i .. a_i + length_i - 1`` of the file (``a_i``: the first frame presented
    no earlier than half a frame before ``from_timestamp``). A clip is *bad* if it starts before the file's first
    frame, runs past its last frame, or shares frames with the clip before or after it (both clips of an overlap are
    bad: which one is wrong, the frames cannot tell). Clips whose frames follow each other with no gap and no overlap
    form a *run*; a run is *anchored* if it starts at the file's first frame or ends at its last one (a shift would
    have moved that end off the file's edge). Every clip of an unanchored run holding a bad clip is implicated too:
    the run moved as one (an off-by-one merge, drift reaching a whole frame), and every lookup in it lands on a real
    frame, the wrong one. Nothing is corrected: a run that is k frames late fits the frames just as well as a file
    with k spare frames before it and k frames lost at its end, and lerobot reads the shifted frames, so the fix
    (the metadata) is named instead. Gaps (frames in no clip) alone are not an error (episodes deleted from the
    metadata, clips longer than their episodes).

    Args:
        chain: ``episode_index``, ``from_timestamp`` (seconds), ``length`` (frames in data/) of every clip in the
            file with at least one frame. selected: episode indices the caller reads.
    """
    ep = np.asarray(chain["episode_index"], np.int64)
    f = np.asarray(chain["from_timestamp"], np.float64)
    n = np.asarray(chain["length"], np.int64)
    order = np.lexsort((ep, f))
    ep, f, n = ep[order], f[order], n[order]
    m, total = len(ep), len(pts_s)
    if not m:
        return None
    half = 0.5 / float(fps)
    a = np.searchsorted(pts_s, f - half).astype(np.int64)
    b = a + n
    early = f < (pts_s[0] if total else 0.0) - half
    over = b[:-1] - a[1:]  # frames clip i shares with clip i + 1 (< 0: frames between them that are in no clip)
    bad = early | (b > total)
    bad[:-1] |= over > 0
    bad[1:] |= over > 0
    if not bad.any():
        return None
    breaks = np.flatnonzero(over != 0)
    run = np.r_[0, np.cumsum(over != 0)]
    first, last = np.r_[0, breaks + 1], np.r_[breaks, m - 1]
    anchored = ((a[first] == 0) & ~early[first]) | (b[last] == total)
    run_bad = np.zeros(len(first), bool)
    run_bad[run[bad]] = True
    implicated = bad | (run_bad & ~anchored)[run]
    hit = np.flatnonzero(implicated & np.isin(ep, np.fromiter(selected, np.int64)))
    if not len(hit):
        return None
    j = int(hit[0])
    whys = []
    if early[j]:
        whys.append(f"its clip starts at from_timestamp={f[j]:.6f} s, before the file's first frame "
                    f"({pts_s[0]:.6f} s)" if total else "the file has no frames")
    if b[j] > total:
        whys.append(f"its {int(n[j])} frames (frames {a[j]}..{b[j] - 1} of the file) run past the file's last frame "
                    f"({total - 1})")
    if j > 0 and over[j - 1] > 0:
        whys.append(f"its first frame (frame {a[j]} of the file) is one of the {int(n[j - 1])} frames of episode "
                    f"{int(ep[j - 1])}'s clip, which starts at {f[j - 1]:.6f} s")
    if j < m - 1 and over[j] > 0:
        whys.append(f"its {int(n[j])} frames (frames {a[j]}..{b[j] - 1} of the file) run into the clip of episode "
                    f"{int(ep[j + 1])}, which starts at frame {a[j + 1]} ({f[j + 1]:.6f} s)")
    r = run[j]
    i0, i1 = int(first[r]), int(last[r])
    eps = f"episodes {ep[i0]}-{ep[i1]}" if i1 > i0 else f"episode {ep[i0]}"
    shift = None
    if not anchored[r]:
        before = (int(round((f[i0] - pts_s[0]) * fps)) if early[i0] and total else
                  int(a[i0] - (b[i0 - 1] if i0 > 0 else 0)))  # > 0: free frames before the run; < 0: shared
        after = int((a[i1 + 1] if i1 < m - 1 else total) - b[i1])
        end = (f"into the clip of episode {ep[i1 + 1]}" if i1 < m - 1 else "past the file's last frame")
        clips_of = f"the clips of {eps} (one unbroken run, frames {a[i0]}..{b[i1] - 1} of the file)" if i1 > i0 \
            else f"the clip of {eps} (frames {a[i0]}..{b[i1] - 1} of the file)"
        if before > 0 and after == -before:
            shift = before
            whys.append(f"{clips_of} sit{'s' if i1 == i0 else ''} {before} frame{'s' if before > 1 else ''} late "
                        f"({before / fps:.6f} s): the {before} frame(s) before {'it' if i1 == i0 else 'the run'} are "
                        f"in no clip and its end runs {before} frame(s) {end}; every lookup in it would land on a real "
                        f"frame, {before} late")
        elif before < 0 and after == -before:
            shift = before
            whys.append(f"{clips_of} sit{'s' if i1 == i0 else ''} {-before} frame{'s' if -before > 1 else ''} early "
                        f"({-before / fps:.6f} s): its start shares {-before} frame(s) with the clip before it and the "
                        f"{after} frame(s) after it are in no clip; every lookup in it would land on a real frame, "
                        f"{-before} early")
        else:
            whys.append(f"{clips_of} move{'s' if i1 == i0 else ''} with it: no anchor in the file tells how far "
                        f"({before:+d} frame(s) free before it, {after:+d} after it)")
    fix = (f"{'subtract' if shift > 0 else 'add'} {abs(shift)}/fps = {abs(shift) / fps:.6f} s "
           f"{'from' if shift > 0 else 'to'} videos/{video_key}/from_timestamp and to_timestamp of {eps} in "
           "meta/episodes" if shift else
           f"fix videos/{video_key}/from_timestamp in meta/episodes so each clip starts on the frame after the "
           "previous episode's last")
    return (f"episode {int(ep[j])}: the clip starting at from_timestamp={f[j]:.6f} s disagrees with the video: "
            f"{'; '.join(whys)}. Reading it would give another episode's frames, shifted frames or none, so no item "
            f"reading this mp4 is served. Fix: {fix} (run `lerobot-sql doctor`)")


def _check_neighbours(pts_s: np.ndarray, clips: dict, sel: np.ndarray, *, fps: float, where: str,
                      video_key: str) -> None:
    """The check of manifests written before ``chains`` (the selected clips against their two neighbours only)."""
    half = 0.5 / float(fps)

    def num(name: str, fill: float) -> np.ndarray:
        return np.array([fill if x is None else x for x in clips[name]], np.float64)

    def row(t: np.ndarray) -> np.ndarray:
        return np.searchsorted(pts_s, t - half).astype(np.float64)

    f, n = num("from_timestamp", np.nan), num("length", 0)
    pf, pn, nf_ = num("prev_from_timestamp", np.nan), num("prev_length", 0), num("next_from_timestamp", np.nan)
    r0 = row(f[sel])
    end = r0 + n[sel]
    prev_end = np.where(np.isnan(pf[sel]), -np.inf, row(pf[sel]) + pn[sel])
    nxt = np.where(np.isnan(nf_[sel]), np.inf, row(nf_[sel]))
    bad = np.flatnonzero((r0 < prev_end) | (end > nxt) | (end > len(pts_s)))
    if not len(bad):
        return
    j = int(sel[bad[0]])
    i = int(bad[0])
    ep, a, b = clips["episode_index"][j], int(r0[i]), int(end[i]) - 1
    if end[i] > len(pts_s):
        why = (f"its {int(n[j])} frames (frames {a}..{b} of the file) run past the file's last frame "
               f"({len(pts_s) - 1})")
    elif r0[i] < prev_end[i]:
        why = (f"its first frame (frame {a} of the file) is one of the {int(pn[j])} frames of episode "
               f"{clips['prev_episode'][j]}'s clip, which starts at {pf[j]:.6f} s")
    else:
        why = (f"its {int(n[j])} frames (frames {a}..{b} of the file) run into the clip of episode "
               f"{clips['next_episode'][j]}, which starts at frame {int(nxt[i])} ({nf_[j]:.6f} s)")
    raise DatasetFormatError(
        f"{where}: camera {video_key!r}, episode {ep}: the clip starting at from_timestamp={f[j]:.6f} s disagrees "
        f"with the video: {why}; reading it would give another episode's frames or none. Fix "
        f"videos/{video_key}/from_timestamp in meta/episodes (run `lerobot-sql doctor`)")
