"""Manifests of whole episodes straight from the episode pointers, with pyarrow and numpy, no DuckDB.

Selecting whole episodes (``db.dataset()``, ``db.dataset(episodes=[...])``, or a query returning ``episode_index``
rows) needs no join over the frames: meta/episodes says where each episode lives (``dataset_from_index`` /
``dataset_to_index``, ``data/chunk_index`` / ``data/file_index``, and per camera the mp4 and ``from_timestamp``),
and lerobot writes an episode's frames as consecutive rows of its data file, files in ``index`` order. So the file
row of a frame is ``index - (first index of the file)``, and only the row groups holding the selected episodes are
read, and only their ``index, episode_index, frame_index, timestamp, task_index`` columns.

Nothing is trusted unchecked: the ``index`` and ``episode_index`` values read at the computed rows must be the
expected ones and each file's row count must equal the lengths its episodes claim; where they are not (a file
written in another order), :func:`episode_manifest` returns None and the caller uses the general DuckDB join, which
reads each frame's real row. The checks that refuse bad metadata (:mod:`lerobot_sql._plan.clips`) are shared with
that path, so both give the same errors.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._format.layout import Layout, check_stored_type
from .._format.metadata import parquet_read_errors, read_pointers, video_clips
from .._storage.source import Source
from ..errors import DatasetFormatError, MissingFileError, ResultContractError
from .clips import (
    FrameRules,
    check_clips,
    duplicate_episode_error,
    frames_kind,
    grid_error,
    grid_limit,
    outside_clip,
    outside_clip_error,
)
from .contract import WINDOW_TOLERANCE_S, check_window_samples

FRAME_COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "task_index")


def episode_manifest(src: Source, layout: Layout, result: pa.Table, extras: list[str], *, sql: str,
                     ptr: pa.Table | None = None, cameras: list[str] | None = None,
                     tolerance_s: float | None = None,
                     align: str = "timestamp") -> tuple[pa.Table, dict[str, dict[str, list]]] | None:
    """The manifest (same columns, order and types as :func:`lerobot_sql._plan.resolve.build_manifest`'s, which adds the
    metadata) of ``result``'s ``episode_index`` rows, in row order, each episode's frames by ``frame_index``;
    ``extras`` columns of ``result`` repeat over their episode's frames. ``cameras`` (default every video key): the
    cameras whose clips are checked and returned (the others' columns may be null); ``tolerance_s``: timestamps may
    stray from ``frame_index / fps`` by this much when it is more than half a frame (:func:`grid_limit`);
    ``align="frame_index"``: frames are read by position, so timestamps are neither bounded nor checked against the
    clips (a NaN is still refused).

    Returns:
        (the manifest, the checked clips from :func:`check_clips`), or None when the data files are not laid out as
        lerobot writes them (see the module doc).

    Raises:
        ResultContractError: an episode_index is NULL or not in meta/episodes.
        DatasetFormatError: duplicate meta/episodes rows, timestamps off the fps grid, bad clip pointers, an
            unreadable data file.
    """
    from .._readers.tabular import check_frame_nulls, row_group_ranges

    p = _pointers(src, layout, result, ptr, sql)
    if p is None:
        return None
    ptr, want, all_ep, pos, lo, hi, files, fcode, total, row0_all = p
    sel_rows = np.fromiter(map(pos.__getitem__, want.tolist()), np.int64, len(want))  # pointer row of each result row
    uniq_rows = np.unique(sel_rows)
    # Read each touched data file's needed row groups: the frame columns of the selected episodes only.
    frames: dict[int, tuple[pa.Table, np.ndarray, np.ndarray]] = {}
    for code in np.unique(fcode[uniq_rows]):
        rel = files[code]
        with parquet_read_errors(src, rel):
            info = _footer(src, layout, rel, int(total[code]))
            if info is None:
                return None
            md, offsets, names = info.metadata, info.rg_offsets, info.schema.names
            eps = uniq_rows[fcode[uniq_rows] == code]
            rgs = info.row_groups(row0_all[eps], row0_all[eps] + (hi - lo)[eps])
            if not len(rgs):  # only zero-length episodes in this file
                continue
            cols = [c for c in FRAME_COLUMNS if c in names]
            if not src.is_local:  # fetch those column chunks in one parallel call, not a round trip each
                from .._storage.pieces import merge_ranges

                src.fetch(rel, merge_ranges(row_group_ranges(md, rgs, cols)))
            with src.open(rel) as fh:
                pf = pq.ParquetFile(fh, metadata=md)
                whole = len(rgs) == md.num_row_groups  # (one read is faster than 200 row-group reads)
                t = (pf.read(columns=cols, use_threads=False) if whole  # one thread: see Source.open
                     else pf.read_row_groups(rgs.tolist(), columns=cols, use_threads=False))
        check_frame_nulls(t, src.path(rel))
        # table position of file row r: r - offsets[rg] + (rows of the earlier row groups read)
        sizes = offsets[rgs + 1] - offsets[rgs]
        base = np.concatenate([[0], np.cumsum(sizes)])[:-1]
        frames[int(code)] = (t, offsets, np.stack([rgs, base]))

    # Per result row: its episode's frames, in order.
    n_per = (hi - lo)[sel_rows]
    rowidx = np.repeat(np.arange(len(sel_rows)), n_per)
    if not len(rowidx):
        raise ResultContractError(f"the query's episode selection matched no frames: {sql!r}")
    start = np.concatenate([[0], np.cumsum(n_per)])[:-1]
    k_in_ep = np.arange(len(rowidx)) - np.repeat(start, n_per)
    prow = sel_rows[rowidx]  # pointer row per sample
    data_row = row0_all[prow] + k_in_ep
    sample_code = fcode[prow]
    tables, take = [], np.empty(len(rowidx), np.int64)
    shift = 0
    for code, (t, offsets, rb) in frames.items():
        m = sample_code == code
        r = data_row[m]
        rg = np.searchsorted(offsets, r, side="right") - 1
        j = np.searchsorted(rb[0], rg)
        take[m] = r - offsets[rg] + rb[1][j] + shift
        tables.append(t)
        shift += t.num_rows
    ft = pa.concat_tables(tables, promote_options="permissive")
    if "task_index" not in ft.column_names:
        return None  # the DuckDB join derives it from meta/episodes' tasks (or refuses, naming the column)
    if not (len(take) == ft.num_rows and (take == np.arange(len(take))).all()):  # whole files in order: as read
        ft = ft.take(pa.array(take))
    index = ft["index"].to_numpy()
    exp_index = lo[prow] + k_in_ep
    if not (np.array_equal(index, exp_index) and np.array_equal(ft["episode_index"].to_numpy(), all_ep[prow])):
        return None  # rows not in index order within the files: the DuckDB join reads each frame's real row
    ts = ft["timestamp"].to_numpy().astype(np.float64)
    fi = ft["frame_index"].to_numpy()
    err = np.abs(ts - fi / float(layout.fps))
    limit = grid_limit(layout.fps, tolerance_s, align)
    bad = np.flatnonzero(~(err <= limit))  # written so that a NaN timestamp is off the grid too
    clips = video_clips(layout, ptr)
    if len(bad):
        rows = np.unique(prow[bad])  # error path: do the cameras' clips hold exactly these episodes' frames?
        kind = frames_kind([(clips[k]["from_timestamp"].to_numpy(zero_copy_only=False)[rows],
                             clips[k]["to_timestamp"].to_numpy(zero_copy_only=False)[rows], (hi - lo)[rows])
                            for k in (layout.video_keys if cameras is None else cameras) if k in clips], layout.fps)
        raise grid_error(all_ep[prow[bad]], err[bad], fi[bad], lambda j: files[sample_code[bad[j]]], layout.fps, limit,
                          kind)

    length = dict(zip(all_ep.tolist(), (hi - lo).tolist()))  # (a later row of an episode wins, as before)
    touched = {}
    for k, t in clips.items():
        paths = t["path"].to_pylist()
        sel_paths = {paths[r] for r in uniq_rows} - {None}  # no pointer: plan refuses those samples
        touched[k] = t.filter(pa.array([p in sel_paths for p in paths]))
    checked = check_clips(layout, touched, length, all_ep[uniq_rows], keys=cameras)
    if checked and align != "frame_index":  # a camera reads frames at from_timestamp + timestamp: every row must
        # name one of its clip's frames
        out = np.flatnonzero(outside_clip(ts, (hi - lo)[prow], layout.fps))
        if len(out):
            j = int(out[np.argmin(all_ep[prow[out]])])
            raise outside_clip_error(checked, int(all_ep[prow[j]]), int(fi[j]), float(ts[j]),
                                     int((hi - lo)[prow[j]]), layout.fps, files[sample_code[j]])

    cols: dict[str, pa.Array] = {
        "index": pa.array(index, pa.int64()),
        "episode_index": pa.array(all_ep[prow], pa.int64()),
        "frame_index": pa.array(fi, pa.int64()),
        "timestamp": ft["timestamp"].cast(pa.float32()),
        "task_index": ft["task_index"].cast(pa.int64()),
        "data_file": pa.array([files[c] for c in range(len(files))], pa.string()).take(pa.array(sample_code)),
        "data_row": pa.array(data_row, pa.int64()),
        "ep_from_index": pa.array(lo[prow], pa.int64()),
        "ep_to_index": pa.array(hi[prow], pa.int64()),
        "ep_data_row0": pa.array(row0_all[prow], pa.int64()),
        "result_row": pa.array(rowidx, pa.int64()),
    }
    for k, t in clips.items():
        cols[f"{k}/file"] = t["path"].take(pa.array(prow))
        cols[f"{k}/from_timestamp"] = t["from_timestamp"].take(pa.array(prow))
    for e in extras:
        cols[e] = result[e].take(pa.array(rowidx))
    return pa.table(cols), checked


def _pointers(src: Source, layout: Layout, result: pa.Table, ptr: pa.Table | None, sql: str):
    """The episode pointers' plan shared by :func:`episode_manifest` and :func:`episode_runs` (O(episodes), no data
    file read): ``(ptr, wanted episodes, every episode, pointer row by episode, from, to, data files, file code per
    pointer row, rows per file, first file row per pointer row)``, or None when the pointers do not say where
    every episode's rows are (the caller then reads the frames' real rows).

    Raises:
        ResultContractError: an episode_index is NULL or not in meta/episodes.
        DatasetFormatError: meta/episodes lists a selected episode twice.
    """
    ptr = read_pointers(src, layout) if ptr is None else ptr
    if ptr is None or not layout.data_files:
        return None
    want = result["episode_index"]
    if want.null_count:
        raise ResultContractError(f"the result has NULL episode_index values: {sql!r}")
    want = want.to_numpy().astype(np.int64)
    all_ep = ptr["episode_index"].to_numpy()
    if ptr["dataset_from_index"].null_count or ptr["dataset_to_index"].null_count or \
            ptr["data/chunk_index"].null_count or ptr["data/file_index"].null_count:
        return None
    uniq, counts = np.unique(all_ep, return_counts=True)
    dup = uniq[(counts > 1) & np.isin(uniq, want)]
    if len(dup):
        raise duplicate_episode_error(int(dup[0]), int(counts[uniq == dup[0]][0]))
    pos = dict(zip(all_ep.tolist(), range(len(all_ep))))  # (the last row of a repeated episode; refused above)
    unknown = [int(e) for e in dict.fromkeys(want.tolist()) if e not in pos]
    if unknown:
        raise ResultContractError(f"episodes {unknown[:5]} are not in meta/episodes (it holds {len(all_ep)} episodes, "
                                  f"{int(all_ep.min())}..{int(all_ep.max())}): {sql!r}")
    lo = ptr["dataset_from_index"].to_numpy()
    hi = ptr["dataset_to_index"].to_numpy()
    chunk, filei = ptr["data/chunk_index"].to_numpy(), ptr["data/file_index"].to_numpy()
    # each (chunk, file) pair named once (100,000 episodes point to 20 files: the template is filled 20 times)
    chunk, filei = chunk.astype(np.int64), filei.astype(np.int64)
    if len(chunk) and min(chunk.min(), filei.min()) >= 0 and max(chunk.max(), filei.max()) < 2 ** 31:
        # one int64 key per pair: np.unique over rows (axis=0) sorts a structured view, 0.14 s at 100,000 episodes
        keys, inverse = np.unique(chunk << 32 | filei, return_inverse=True)
        pairs = np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1)
    else:
        pairs, inverse = np.unique(np.stack([chunk, filei], axis=1), axis=0, return_inverse=True)
    pair_rels = [layout.data_file(int(c), int(fi)) for c, fi in pairs]
    files = sorted(set(pair_rels))
    code_of = {r: i for i, r in enumerate(files)}
    fcode = np.array([code_of[r] for r in pair_rels], np.int64)[np.asarray(inverse).reshape(-1)]
    # Crafted pointers (an episode claiming K more rows, the next K fewer: per-file totals still match) must not
    # reach np.repeat, which would allocate K elements or fail on a negative count. lerobot writes each file's
    # episodes as one gap-free run of `index`; anything else goes to the DuckDB join, which reads the real rows.
    if (hi < lo).any():
        return None
    order = np.lexsort((lo, fcode))
    same = fcode[order][1:] == fcode[order][:-1]
    if (hi[order][:-1][same] != lo[order][1:][same]).any():
        return None
    first = np.full(len(files), np.iinfo(np.int64).max)
    total = np.zeros(len(files), np.int64)
    np.minimum.at(first, fcode, lo)
    np.add.at(total, fcode, hi - lo)
    row0_all = lo - first[fcode]

    return ptr, want, all_ep, pos, lo, hi, files, fcode, total, row0_all


def _footer(src: Source, layout: Layout, rel: str, rows: int, keep: bool = True, cache_dir=None):
    """Data file ``rel``'s footer (:class:`lerobot_sql._readers.tabular.DataFileInfo`, parsed once per process), or
    None when it does not hold the ``rows`` rows its episodes claim, or lacks a frame column (the caller then reads
    the frames' real rows).

    Raises:
        DatasetFormatError: a feature's stored type disagrees with info.json (an int dtype over floats).
    """
    from .._readers.tabular import FRAME_INTEGERS, data_file_info

    info = data_file_info(src, rel, keep=keep, cache_dir=cache_dir)
    for field in info.schema:  # an int dtype over floats must not reach the reader's cast
        t = field.type
        while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            t = t.value_type
        check_stored_type(layout.features.get(field.name), pa.types.is_floating(t) or pa.types.is_decimal(t),
                          src.path(rel))
        if field.name in (*FRAME_INTEGERS, "timestamp") and not (
                pa.types.is_integer(field.type) or pa.types.is_floating(field.type) or pa.types.is_decimal(field.type)):
            # (floats: check_stored_type above, against info.json's dtype)
            raise DatasetFormatError(f"{src.path(rel)}: column {field.name!r} is stored as {field.type}, not as "
                                     "numbers (lerobot writes "
                                     f"{'float32 seconds' if field.name == 'timestamp' else 'int64'}); rewrite the "
                                     "file with that column as lerobot writes it, or restore it from the dataset's "
                                     "source")
    if info.rg_offsets[-1] != rows or not all(c in info.schema.names for c in FRAME_COLUMNS[:4]):
        return None
    return info


# Selections of more frames than this are opened without reading their frames (episode_runs): each row group's
# frames are checked where a process first reads it. Below it, every frame is read and checked at the open.
# $LSQL_LAZY_FRAMES sets another bound (lazy_frames).
LAZY_FRAMES = 2_000_000


def lazy_frames() -> int:
    """The selection size (frames) above which a selection opens without reading its frames: ``$LSQL_LAZY_FRAMES``
    (an integer >= 0), else :data:`LAZY_FRAMES`.

    Raises:
        SettingError: the variable is not a whole number >= 0 (naming it).
    """
    from .. import _settings

    return _settings.whole_number("LSQL_LAZY_FRAMES", LAZY_FRAMES, "frames")


def grid_timestamp(k: np.ndarray, fps: float, float32: bool = True) -> np.ndarray:
    """The timestamp lerobot writes for frame ``k`` of an episode (``k / fps`` stored as float32; ``float32=False``:
    as float64), as float64."""
    t = np.asarray(k, np.int64) / float(fps)
    return t.astype(np.float32).astype(np.float64) if float32 else t


def grid_window(start_s: np.ndarray, end_s: np.ndarray, length: np.ndarray, fps: float,
                tol: float = WINDOW_TOLERANCE_S, float32: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Each window's frames on the fps grid: ``(first, end)`` (int64 arrays, frame positions in the episode,
    ``first <= end``), the frames ``k`` in ``[0, length)`` whose grid timestamp (:func:`grid_timestamp`) ``t`` has
    ``start_s - tol <= t < end_s - tol``: the frames the join selects when the data holds lerobot's timestamps.
    ``start_s`` / ``end_s``: float64 seconds from the episode start; ``length``: the episode's frames."""
    length = np.asarray(length, np.int64)
    fps = float(fps)

    def grid(k):
        return grid_timestamp(k, fps, float32)

    def first_at_least(seconds: np.ndarray) -> np.ndarray:
        thr = np.asarray(seconds, np.float64) - tol
        with np.errstate(invalid="ignore", over="ignore"):
            base = np.clip(np.floor(thr * fps) - 1, 0, length).astype(np.int64)
        out = length.copy()
        # the grid's rounding moves the first frame at or after thr by at most one from floor(thr * fps): of these
        # four candidates the smallest that qualifies is it (the grid increases with k)
        for d in (3, 2, 1, 0):
            k = np.minimum(base + d, length)
            out = np.where((k < length) & (grid(k) >= thr), k, out)
        return out

    first, end = first_at_least(start_s), first_at_least(end_s)
    return first, np.maximum(end, first)


def _stray_into_empty(first: np.ndarray, end: np.ndarray, start_s: np.ndarray, end_s: np.ndarray,
                      length: np.ndarray, fps: float, float32: bool, tol: float = WINDOW_TOLERANCE_S) -> bool:
    """Whether a window empty on the grid (``first == end``, :func:`grid_window`) lies within half a frame of a
    frame's grid time (the frame before it or after it): a timestamp the reads accept (half a frame from its
    grid time) could then put that frame in it, and no read would look (an empty window has no run)."""
    empty = np.flatnonzero(first == end)
    if not len(empty):
        return False
    half = 0.5 / float(fps)
    lo_s, hi_s = start_s[empty] - tol, end_s[empty] - tol
    for k in (first[empty] - 1, first[empty]):
        inside = (k >= 0) & (k < length[empty])
        t = grid_timestamp(np.clip(k, 0, None), fps, float32)
        if (inside & (t + half >= lo_s) & (t - half < hi_s)).any():
            return True
    return False


def episode_runs(src: Source, layout: Layout, result: pa.Table, *, sql: str, ptr: pa.Table | None = None,
                 cameras: list[str] | None = None, tolerance_s: float | None = None,
                 align: str = "timestamp", cache_dir=None) -> tuple[pa.Table, list, dict, FrameRules] | None:
    """``result``'s whole episodes (its ``episode_index`` rows, in order), or its windows (``episode_index``,
    ``start_s``, ``end_s`` rows, float64 seconds), without reading their frames: what :func:`episode_manifest`
    checks from meta/episodes, the data files' footers (row counts, column types) and the clips, at O(episodes)
    cost; the frame-level checks (each row's ``index`` and ``episode_index`` where the pointers put it, timestamps on
    the fps grid and inside the clip, frame_index positions) are left to :func:`check_frames`, per row group, where
    a process first reads it. A window's frames are planned on the fps grid (:func:`grid_window`); where its rows
    are read, :func:`check_window_frames` checks that their timestamps put the same frames in it.

    Returns:
        ``(episodes, infos, clips, rules)``: one row per result row (``episode_index``, ``ep_from_index``,
        ``ep_to_index``, ``ep_data_row0``: the episode's first row in its data file, ``sel_from_index`` /
        ``sel_to_index``: the frames it selects (the episode's, or the window's on the grid), ``file``: int32 into
        ``infos``, ``result_row``; for windows ``lo_s`` / ``hi_s``, the timestamps its frames lie in, ``[lo_s,
        hi_s)``; per video key ``<key>/file`` and ``<key>/from_timestamp``), the touched data files' footers, the
        checked clips (:func:`check_clips`) and the :class:`FrameRules`; or None when the pointers or files are not
        laid out as lerobot writes them, or lack ``task_index`` (the caller reads the frames).

    Raises:
        as :func:`episode_manifest`, for what it checks from the pointers, footers and clips.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .._readers.tabular import release_freed_memory

    p = _pointers(src, layout, result, ptr, sql)
    if p is None:
        return None
    ptr, want, all_ep, pos, lo, hi, files, fcode, total, row0_all = p
    sel_rows = np.fromiter(map(pos.__getitem__, want.tolist()), np.int64, len(want))
    sel_from, sel_to = lo[sel_rows].astype(np.int64), hi[sel_rows].astype(np.int64)
    windows = "start_s" in result.column_names
    used = np.unique(fcode[np.unique(sel_rows)])

    def footer(code):
        try:
            with parquet_read_errors(src, files[code]):
                return _footer(src, layout, files[code], int(total[code]), keep=False, cache_dir=cache_dir)
        except MissingFileError:  # a stale pointer, maybe: the frames' path finds the rows where they are
            return None

    # footers in parallel (40 ms each at 5,000 row groups locally, a round trip each remotely), not kept: each
    # process parses a file's footer where it first reads it
    if src.is_local:
        infos = []
        for code in used:
            infos.append(footer(code))
            release_freed_memory()
    else:
        with ThreadPoolExecutor(min(8, len(used)) or 1) as pool:
            infos = list(pool.map(footer, used))
        release_freed_memory()
    if any(i is None or "task_index" not in i.schema.names for i in infos):
        return None
    if windows:
        # on the grid of the timestamps as stored: lerobot's float32, or float64 where every file holds that
        ts32 = not all(pa.types.is_float64(i.schema.field("timestamp").type) for i in infos)
        start_s = result["start_s"].to_numpy(zero_copy_only=False).astype(np.float64)
        end_s = result["end_s"].to_numpy(zero_copy_only=False).astype(np.float64)
        first, end = grid_window(start_s, end_s, sel_to - sel_from, layout.fps, float32=ts32)
        if _stray_into_empty(first, end, start_s, end_s, sel_to - sel_from, layout.fps, ts32):
            return None  # a window empty on the grid that a frame within half a frame of it may lie in: read them
        sel_from, sel_to = sel_from + first, sel_from + end
    if not (sel_to - sel_from).sum():
        if windows:  # which windows, and why they hold nothing (raises)
            check_window_samples(result, sel_to - sel_from, sql, (hi - lo)[sel_rows], layout.fps)
        raise ResultContractError(f"the query's {'window' if windows else 'episode'} selection matched no frames: "
                                  f"{sql!r}")
    # the episodes with frames selected (a window may hold none): their clips, as the join finds them
    uniq_rows = np.unique(sel_rows[sel_to > sel_from])
    new_code = np.full(len(files), -1, np.int32)
    new_code[used] = np.arange(len(used), dtype=np.int32)
    clips = video_clips(layout, ptr)
    length = dict(zip(all_ep.tolist(), (hi - lo).tolist()))  # (a later row of an episode wins, as before)
    touched = {}
    for k, t in clips.items():
        paths = t["path"].to_pylist()
        sel_paths = {paths[r] for r in uniq_rows} - {None}
        touched[k] = t.filter(pa.array([q in sel_paths for q in paths]))
    checked = check_clips(layout, touched, length, all_ep[uniq_rows], keys=cameras)
    cols = {"episode_index": pa.array(all_ep[sel_rows], pa.int64()),
            "ep_from_index": pa.array(lo[sel_rows], pa.int64()), "ep_to_index": pa.array(hi[sel_rows], pa.int64()),
            "ep_data_row0": pa.array(row0_all[sel_rows], pa.int64()),
            "sel_from_index": pa.array(sel_from, pa.int64()), "sel_to_index": pa.array(sel_to, pa.int64()),
            "file": pa.array(new_code[fcode[sel_rows]], pa.int32()),
            "result_row": pa.array(np.arange(len(sel_rows)), pa.int64())}
    if windows:
        cols["lo_s"] = pa.array(start_s - WINDOW_TOLERANCE_S, pa.float64())  # (grid_window's thresholds)
        cols["hi_s"] = pa.array(end_s - WINDOW_TOLERANCE_S, pa.float64())
    for k, t in clips.items():
        cols[f"{k}/file"] = t["path"].take(pa.array(sel_rows))
        cols[f"{k}/from_timestamp"] = t["from_timestamp"].take(pa.array(sel_rows))
    release_freed_memory()
    rules = FrameRules(fps=float(layout.fps), limit=grid_limit(layout.fps, tolerance_s, align),
                       in_clip=bool(checked) and align != "frame_index", positions=align == "frame_index",
                       clips=checked, windows=windows)
    return pa.table(cols), infos, checked, rules
