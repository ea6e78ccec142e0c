"""How an export's selection is cut into output files: the manifest into parts (one output episode each), and the
chunk/file numbering of each output stream.

A part is a run of manifest rows that are consecutive frames of one source episode, stored in consecutive rows of
one data file, and (for whole-episode and window queries) from one result row: a whole source episode, a window, or
a contiguous run of ``index`` rows. The writers (``data_writer``, ``video_writer``, the driver's meta/episodes) each
hold a :class:`Rotator` that says which ``chunk-XXX/file-YYY`` they write.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from ..errors import warn

# Source files a writer keeps open per stream (v2.x has one data file and one mp4 per episode); parts arrive in file
# order, so the oldest open file is the one done with.
MAX_OPEN_INPUTS = 8


@dataclasses.dataclass
class Part:
    """One output episode: ``length`` consecutive frames of source episode ``src_episode`` from ``frame_start``
    (at another frame rate: every ``stride``-th frame from it).

    Attributes:
        whole: the part is the whole source episode at its own rate (frame 0 on, its full length, stride 1): its
            stats are copied, its timestamps kept.
        data_file, data_row: where its first frame's row is in the source (relative path, row in that file).
        rows: int64 (length,), the manifest rows of this part, in frame order.
        source: which of the export's sources the part comes from (its position in ``Exporter.sources``; 0 for a
            one-dataset export).
        stride: source frames per output frame (an export at 1/stride of the rate: ``fps=``); 1 otherwise.
    """

    src_episode: int
    frame_start: int
    length: int
    whole: bool
    data_file: str
    data_row: int
    rows: np.ndarray
    source: int = 0
    stride: int = 1


def cut_parts(m: pa.Table, mode: str, sources: np.ndarray | None = None, stride: int = 1, *,
              warn_split: bool = True) -> list[Part]:
    """Cut the manifest ``m`` into output episodes, in manifest order: a new part wherever the episode changes,
    the frame or data row does not follow on, or (``mode`` "episode"/"window", from the manifest's metadata) the
    ``result_row`` changes; with ``sources`` (int (N,), each row's source, for a collection's manifest) also
    wherever the source changes, since two datasets' episodes may share an episode_index. ``stride``: ``m`` holds
    every stride-th frame (an export at another frame rate, :func:`lerobot_sql._readers.regrid.on_grid`), so frames
    follow on ``stride`` apart. ``warn_split``: warn when ``index`` rows cut an episode into several parts (an
    export's concern; a clip page shows one per run)."""
    ep = m["episode_index"].to_numpy()
    fi = m["frame_index"].to_numpy()
    row = m["data_row"].to_numpy()
    files = m["data_file"].to_pylist()
    ep_len = m["ep_to_index"].to_numpy() - m["ep_from_index"].to_numpy()
    brk = np.ones(len(ep), bool)
    if len(ep) > 1:
        same = (ep[1:] == ep[:-1]) & (fi[1:] == fi[:-1] + stride) & (row[1:] == row[:-1] + stride)
        if mode != "index":
            pid = m["result_row"].to_numpy()
            same &= pid[1:] == pid[:-1]
        if sources is not None:
            same &= sources[1:] == sources[:-1]
        brk[1:] = ~same
    starts = np.flatnonzero(brk)
    ends = np.append(starts[1:], len(ep))
    if mode == "index" and warn_split:
        _warn_split(ep[starts], ends - starts, sources[starts] if sources is not None else None)
    out = []
    for s, e in zip(starts, ends):
        n = int(e - s)
        out.append(Part(int(ep[s]), int(fi[s]), n, bool(stride == 1 and fi[s] == 0 and n == ep_len[s]), files[s],
                        int(row[s]), np.arange(s, e), int(sources[s]) if sources is not None else 0, stride))
    return out


def _warn_split(eps: np.ndarray, lengths: np.ndarray, srcs: np.ndarray | None) -> None:
    """Warn when ``index`` rows cut a source episode into several output episodes (one per run of consecutive
    frames): legitimate (dropping idle frames), but a strided selection (``index % 10 = 0``) silently became one
    episode per frame before, which a user who meant a lower frame rate would not notice until training."""
    key = eps.astype(np.int64) if srcs is None else eps.astype(np.int64) * (1 << 20) + srcs.astype(np.int64)
    uniq, counts = np.unique(key, return_counts=True)
    split = uniq[counts > 1]
    if not len(split):
        return
    first = int(np.flatnonzero(key == split[0])[0])
    runs = lengths[key == split[0]].tolist()
    single = int((lengths == 1).sum())
    shown = ", ".join(map(str, runs[:6])) + (", ..." if len(runs) > 6 else "")
    warn(
        f"export: the selected frames of {len(split)} source episode(s) are not consecutive, so they are written as "
        f"{int(counts[counts > 1].sum())} episodes, one per run of consecutive frames ({len(lengths)} episodes in "
        f"all, {single} of a single frame); e.g. episode {int(eps[first])} becomes runs of {shown} frames. A stride "
        "(WHERE index % k = 0) does not lower the frame rate: it writes one-frame episodes. To keep episodes whole, "
        "select whole episodes (SELECT episode_index ...), timestamp windows, or consecutive frames")


class Rotator:
    """chunk/file counters of one output stream (data, episodes metadata or one camera): ``chunk``, ``file`` (the
    file being written), ``used`` (it holds an episode already); ``advance()`` moves to the next file, starting a new
    chunk after ``chunks_size`` files."""

    def __init__(self, chunks_size: int):
        self.chunks_size, self.chunk, self.file, self.used = max(int(chunks_size), 1), 0, 0, False

    def advance(self) -> None:
        self.file += 1
        if self.file >= self.chunks_size:
            self.chunk, self.file = self.chunk + 1, 0
