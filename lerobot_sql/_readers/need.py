"""Which bytes a set of items reads: the one rule, for the dataset's fetch ahead and for ``prefetch``.

An item reads, per data file, the row group of its row and, with ``delta_timestamps``, the row groups its windows
reach (neighbours clamped to the episode: :func:`lerobot_sql._readers.deltas.query_indices`); per camera and mp4,
the packets from its frames' keyframe up to a few packets past each (:func:`locate.packet_ranges`, the decoder's
own keyframe rule, plus PyAV's read block), and the mp4's head (:func:`head_end`). Its frames are the rows its
decoder reads: a window's neighbours clamped to the episode, then the nearest frame in time (:func:`window_rows`,
:func:`nearest_rows`); the dataset passes the rows it already holds where it has them.

Pure functions over arrays, data-file footers and video-index columns: no I/O, no process state. The callers
(:mod:`lerobot_sql.torch.pipeline`, per batch and per epoch; :mod:`lerobot_sql.prefetch`, per query) open the files.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from . import deltas, locate, tabular


def head_end(start: np.ndarray) -> int:
    """Where an mp4's head read ends (``start``: its packets' byte offsets): opening reads the head (ftyp, moov) in
    PyAV's blocks from offset 0, up to the end of the block the first packet starts in. Not first packet + a block:
    that passed what building the index fetched (moov + one block) by the free and mdat headers, a 16-byte request
    per mp4."""
    blk = locate.AVIO_BUFFER
    return -(-(int(start.min()) + 1) // blk) * blk


# ---- data files ------------------------------------------------------------------------------------------------
def window_rows(index: np.ndarray, ep_from: np.ndarray, ep_to: np.ndarray, row0: np.ndarray,
                offsets: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` int64: the file rows of the first and last rows the ``delta_timestamps`` windows of items at
    ``index`` reach (``offsets``: every key's frame offsets), clamped to their episodes ``[ep_from, ep_to)`` whose
    first row is ``row0`` in the file (an episode's rows are contiguous there); ``stride``: served at another
    frame rate (:func:`deltas.query_indices`)."""
    index = np.asarray(index, np.int64)
    lo, _ = deltas.query_indices(index, offsets.min(), ep_from, ep_to, stride)
    hi, _ = deltas.query_indices(index, offsets.max(), ep_from, ep_to, stride)
    return row0 + (lo - ep_from), row0 + (hi - ep_from)


def row_groups(info: tabular.DataFileInfo, own: np.ndarray, window: tuple | None) -> np.ndarray:
    """The row groups (sorted, unique) items of one data file read: ``own`` their rows' row groups, ``window``
    None or :func:`window_rows`' ``(lo, hi)`` for them."""
    rgs = np.unique(own)
    if window is not None:
        rgs = np.union1d(rgs, info.row_groups(window[0], window[1] + 1))
    return rgs.astype(np.int64)


def data_extents(info: tabular.DataFileInfo, own: np.ndarray, window: tuple | None) -> tuple[np.ndarray,
                                                                                              np.ndarray]:
    """Per item of one data file, the byte extent ``[a, b)`` of what it reads: its row groups (a window's too)
    from the first one's first column chunk to the last one's end."""
    ext = np.asarray(tabular.row_group_ranges(info.metadata, range(len(info.rg_offsets) - 1)), np.int64)
    lo = hi = own
    if window is not None:
        lo, hi = np.minimum(own, info.locate(window[0])[0]), np.maximum(own, info.locate(window[1])[0])
    return ext[lo, 0], ext[hi, 1]


# ---- videos ----------------------------------------------------------------------------------------------------
def window_times(index: np.ndarray, ep_from: np.ndarray, ep_to: np.ndarray, from_ts: np.ndarray,
                 timestamp: np.ndarray, offsets: np.ndarray, fps: float, stride: int = 1
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(q, t)`` (n, T): the frame indices of each item's window (``offsets`` in frames) clamped to its episode, and
    their times in the mp4 (the item's own time plus whole frames: data timestamps lie on the fps grid; ``fps`` the
    source's, ``stride``: served at another frame rate, :func:`deltas.query_indices`)."""
    index = np.asarray(index, np.int64)
    q, _ = deltas.query_indices(index[:, None], offsets[None, :], ep_from[:, None], ep_to[:, None], stride)
    t = locate.time_in_file(from_ts[:, None], timestamp[:, None]) + (q - index[:, None]) / float(fps)
    return q, t


def nearest_rows(pts_s: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The rows of the frames nearest to ``times`` (any shape), the frames a decoder reads for them."""
    return locate.nearest(pts_s, times.ravel())[0].reshape(times.shape)


def packet_table(key_row: np.ndarray, start: np.ndarray, size: np.ndarray) -> tuple | None:
    """Every row's packet range of an mp4 (:func:`locate.packet_spans` with PyAV's read block), for a planner that
    gathers many rows; None for a file with long keyframe runs (then :func:`video_ranges` plans row by row)."""
    return locate.packet_spans(key_row, start, size, readahead=locate.AVIO_BUFFER)


def video_ranges(rows: np.ndarray, key_row: np.ndarray, start: np.ndarray, size: np.ndarray,
                 spans: tuple | None = None) -> list[tuple[int, int]]:
    """The byte ranges (unmerged) an mp4's decoder reads for video ``rows`` (any shape; < 0: none): from each
    frame's keyframe run to a few packets past it, plus PyAV's read block, and the container head. ``spans``:
    the file's :func:`packet_table`, when the caller keeps one."""
    rows = np.unique(rows[rows >= 0])
    if spans is not None:  # a gather from the file's table
        ranges = list(zip(spans[0][rows].tolist(), spans[1][rows].tolist()))
    else:
        ranges = locate.packet_ranges(rows, key_row, start, size, readahead=locate.AVIO_BUFFER)
    ranges.append((0, head_end(start)))
    return ranges


def video_extents(rows: np.ndarray, key_row: np.ndarray, start: np.ndarray, size: np.ndarray,
                  spans: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per item (``rows`` (n, T) its video rows in one mp4; < 0: none), the byte extent ``[a, b)`` of the packets
    its frames read (``a > b`` for an item without one)."""
    ok = rows >= 0
    r = np.where(ok, rows, 0)
    if spans is not None:
        a, b = spans[0][r], spans[1][r]
    else:  # long keyframe runs: the rule row by row
        pr = np.asarray(locate.packet_ranges(r.ravel(), key_row, start, size, readahead=locate.AVIO_BUFFER),
                        np.int64).reshape(*r.shape, 2)
        a, b = pr[..., 0], pr[..., 1]
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    return np.where(ok, a, big).min(axis=1), np.where(ok, b, small).max(axis=1)


# ---- blocks ----------------------------------------------------------------------------------------------------
def item_blocks(n: int, extents: Iterable[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
                block: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Which ``block``-aligned blocks of which files each of ``n`` items reads, from ``extents``: ``(file, items,
    a, b)``, items ``items`` read ``[a[j], b[j])`` of ``file`` (empty extents read nothing). Returns ``(files,
    offsets, keys)``: item ``i``'s blocks are ``keys[offsets[i]:offsets[i + 1]]`` (sorted, unique; ``file << 32 |
    block``, ``file`` an index into ``files``)."""
    files: dict[str, int] = {}
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    for rel, items, a, b in extents:
        keep = b > a
        items, a, b = items[keep], a[keep], b[keep]
        if not len(items):
            continue
        fid = files.setdefault(rel, len(files))
        lo, hi = a // block, (b - 1) // block
        cnt = hi - lo + 1
        first = np.repeat(np.cumsum(cnt) - cnt, cnt)
        blk = np.repeat(lo, cnt) + (np.arange(int(cnt.sum()), dtype=np.int64) - first)
        parts.append((np.repeat(items, cnt), (np.int64(fid) << 32) | blk))
    if not parts:
        return list(files), np.zeros(n + 1, np.int64), np.zeros(0, np.int64)
    item = np.concatenate([p[0] for p in parts])
    key = np.concatenate([p[1] for p in parts])
    o = np.lexsort((key, item))
    item, key = item[o], key[o]
    keep = np.ones(len(key), bool)
    keep[1:] = (item[1:] != item[:-1]) | (key[1:] != key[:-1])
    item, key = item[keep], key[keep]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(item, minlength=n), out=offsets[1:])
    return list(files), offsets, key
