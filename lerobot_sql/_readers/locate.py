"""Where a frame is: the one home of the rule episode -> mp4 -> time in the file -> frame row -> keyframe row.

A sample's camera frame lives in the mp4 the manifest names (``<video_key>/file``), at ``from_timestamp +
timestamp`` seconds (:func:`time_in_file`: where the episode starts in that file plus the frame's time in the
episode). The frame shown there is the one whose pts is nearest to that time, and only within ``tolerance_s``
(:func:`nearest`, :func:`locate`, :func:`rows_within`; a neighbouring frame is never returned instead). Decoding it must start at its
keyframe row (:func:`key_rows`, corrected for reordered frames), and a reader fetches the packets from that keyframe
up to a few packets past the frame (:func:`packet_ranges`). An episode's clip must match the mp4's real frames
(:func:`check_clips`), which per-frame lookups cannot tell. The dataset, ``prefetch`` and ``export`` all ask here;
the arrays come from a file's index (:class:`lerobot_sql._readers.video_index.FrameIndex`, built by demuxing).

Arrays: ``pts`` int64 (n,) in stream time-base units and ``pts_s`` float64 (n,) seconds, sorted by presentation
time; rows are positions in them.
"""

from __future__ import annotations

import numpy as np

from ..errors import DatasetFormatError, FrameNotFoundError

DECODER_DELAY = 4  # packets a decoder may read past a frame before it outputs that frame
AVIO_BUFFER = 32 << 10  # PyAV reads files in blocks of this size: a decode reads up to one block past its packet


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
        raise FrameNotFoundError(
            f"{path}: no frame of camera {video_key!r} within tolerance_s={tolerance_s} of t={times_s[i]:.6f}s "
            f"(episode {episode_index}); nearest frame has pts={int(pts[pick[i]])} "
            f"({pts_s[pick[i]]:.6f}s, off by {err[i]:.6f}s). The episode's from_timestamp or timestamps "
            "disagree with the video: run `lerobot-sql doctor`, or raise tolerance_s if the drift is expected."
        )
    return pick


def packet_ranges(rows, key_row: np.ndarray, byte_offset: np.ndarray, byte_size: np.ndarray, *,
                  readahead: int = 0, delay: int = DECODER_DELAY) -> list[tuple[int, int]]:
    """Byte ranges [start, end) a decoder reads to output the frames at ``rows``: from the earliest packet of the
    frame's keyframe run up to ``delay`` packets past the frame, plus ``readahead`` bytes (a demuxer reads in
    blocks). Rows are presentation order; packets of reordered frames are found among the rows between."""
    last = len(byte_offset) - 1
    end = byte_offset + byte_size
    return [(int(byte_offset[key_row[r]:r + 1].min()),
             int(end[key_row[r]:min(r + delay, last) + 1].max()) + readahead) for r in rows]


def check_clips(pts_s: np.ndarray, clips: dict | None, rel: str, *, fps: float, where: str, video_key: str) -> None:
    """Check the selected episodes' clips in mp4 ``rel`` against its real frames, where per-frame lookups cannot.

    In a lerobot-written file each episode's clip is a run of ``length`` consecutive frames starting at the frame
    presented at ``from_timestamp``, and the clips of one file do not share frames. A start shifted by whole frames
    still finds a frame for every timestamp (the neighbour's), so only this check can tell: an episode's first frame
    must come after the previous clip's last frame, and its ``length`` frames must end before the next clip's first
    frame and within the file. ``to_timestamp`` is not used, so writers that store ``to_timestamp = from_timestamp +
    (length - 1) / fps`` pass. A time maps to the first frame presented no earlier than half a frame before it.

    Args:
        pts_s: the file's frame times. clips: column lists from ``pointers.check_clips`` (the manifest's metadata)
            for camera ``video_key``, or None. where: the mp4's path or URL, for the message.

    Raises:
        DatasetFormatError: naming the mp4, camera and episode, what overlaps, and the fix.
    """
    if not clips:
        return
    sel = np.flatnonzero(np.asarray(clips["path"], dtype=object) == rel)
    if not len(sel):
        return
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
