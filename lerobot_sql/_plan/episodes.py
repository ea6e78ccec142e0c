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
reads each frame's real row. The checks that refuse bad metadata (:func:`check_timestamps`, :func:`check_clips`)
are shared with that path, so both give the same errors.
"""

from __future__ import annotations

import math
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import DatasetFormatError, ResultContractError
from .._format.layout import Layout, check_stored_type
from .._storage.source import Source

POINTERS = ("episode_index", "dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index")
VIDEO_POINTERS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
FRAME_COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "task_index")


def read_pointers(src: Source, layout: Layout) -> pa.Table | None:
    """Episode pointers: :data:`POINTERS` and ``videos/<video_key>/<VIDEO_POINTERS>`` per camera, one row per
    meta/episodes row (v3: the Parquet files, those columns only; v2: meta/episodes.jsonl as the catalog shapes it).
    None when a column is missing (the DuckDB path then reports it).
    """
    from .._catalog.views import v2_episodes, parquet_read_errors

    want = list(POINTERS) + [f"videos/{k}/{c}" for k in layout.video_keys for c in VIDEO_POINTERS]
    if not layout.episode_files:
        return None
    if layout.legacy:
        t = v2_episodes(src, layout)
        return t.select(want) if all(c in t.column_names for c in want) else None
    parts = []
    for rel in layout.episode_files:
        with parquet_read_errors(src, rel), src.open(rel) as f:
            pf = pq.ParquetFile(f)
            names = set(pf.schema_arrow.names)
            if not all(c in names for c in want):
                return None
            parts.append(pf.read(columns=want, use_threads=False))
    t = pa.concat_tables(parts, promote_options="permissive")
    cols = {c: t[c].cast(pa.float64() if c.endswith("_timestamp") else pa.int64()) for c in want}
    return pa.table(cols)


def duplicate_episode_error(episode_index: int, rows: int) -> DatasetFormatError:
    """The error for an episode that meta/episodes lists ``rows`` times."""
    return DatasetFormatError(f"meta/episodes: episode {episode_index} has {rows} rows; each episode must have "
                              "exactly one. Remove the duplicate rows (run `lerobot-sql doctor`)")


def timestamp_error(episode_index: int, err: float, fps: float, *, data_file: str | None = None,
                    frame_index: int | None = None) -> DatasetFormatError:
    """The error for an episode whose ``timestamp`` column strays from ``frame_index / fps`` by ``err`` seconds
    (``err`` NaN or infinite: a timestamp that is not a finite number)."""
    if not math.isfinite(err):
        where = f" in {data_file}" if data_file else ""
        at = f" (frame_index {frame_index})" if frame_index is not None else ""
        return DatasetFormatError(f"episode {episode_index}: a timestamp{where}{at} is NaN or infinite; every "
                                  "timestamp must be frame_index / fps: repair or re-record that data file "
                                  "(`lerobot-sql doctor` checks timestamps)")
    return DatasetFormatError(f"episode {episode_index}: timestamps differ from frame_index / fps by up to {err:.4f} s "
                              f"with fps={fps:g} from meta/info.json; fix 'fps' in info.json or the data files' "
                              "timestamp column (run `lerobot-sql doctor`)")


def check_clips(layout: Layout, videos: dict[str, pa.Table], length: dict[int, int],
                selected: np.ndarray) -> dict[str, dict[str, list]]:
    """Refuse per-camera clip pointers that would give a neighbouring frame without an error, and return the clips.

    Checks, per camera over the selected episodes: the clip starts at or after 0 (within half a frame), lasts the
    episode's frame count in data/ within one frame (writers that store ``to_timestamp = (length - 1) / fps`` pass),
    and does not start half a frame or more before the end of the previous clip of its mp4 (by ``from_timestamp``),
    nor does the next clip start before its end. A start shifted by whole frames passes these; the dataset checks
    those against the mp4's real frames from what this returns.

    Args:
        videos: per video_key, the clips of every episode sharing an mp4 with a selected one: ``episode_index``,
            ``path``, ``from_timestamp``, ``to_timestamp`` (seconds).
        length: frames in data/ per episode (episodes absent or with 0 frames occupy no frame and are skipped).
        selected: the selected episode_index values.

    Returns:
        per video_key, column lists over the selected episodes ordered by episode: ``episode_index``, ``path``,
        ``from_timestamp``, ``length``, and the clips just before and after in the same mp4: ``prev_episode``,
        ``prev_from_timestamp``, ``prev_length``, ``next_episode``, ``next_from_timestamp`` (None at the file's ends).

    Raises:
        DatasetFormatError: naming the episode, camera, mp4 and the fix (the lowest bad episode_index first).
    """
    fps = float(layout.fps)
    half = 0.5 / fps
    sel = set(int(e) for e in selected)
    out = {}
    for k in layout.video_keys:
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
        wrong_len = is_sel & (np.abs((to - f) * fps - n) > 1.001)
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
        }
    return out


def video_clips(layout: Layout, ptr: pa.Table) -> dict[str, pa.Table]:
    """Per video_key, the clip pointers of every episode: ``episode_index``, ``path`` (mp4 relative to the root),
    ``from_timestamp``, ``to_timestamp``."""
    ep = ptr["episode_index"]
    out = {}
    for k in layout.video_keys:
        chunk = ptr[f"videos/{k}/chunk_index"].to_pylist()
        file = ptr[f"videos/{k}/file_index"].to_pylist()
        path = [None if c is None or fi is None else layout.video_file(k, c, fi) for c, fi in zip(chunk, file)]
        out[k] = pa.table({"episode_index": ep, "path": pa.array(path, pa.string()),
                           "from_timestamp": ptr[f"videos/{k}/from_timestamp"],
                           "to_timestamp": ptr[f"videos/{k}/to_timestamp"]})
    return out


def episode_manifest(src: Source, layout: Layout, result: pa.Table, extras: list[str], *, sql: str,
                     ptr: pa.Table | None = None) -> tuple[pa.Table, dict[str, dict[str, list]]] | None:
    """The manifest (same columns, order and types as :func:`lerobot_sql._plan.resolve.build_manifest`'s, which adds the
    metadata) of ``result``'s ``episode_index`` rows, in row order, each episode's frames by ``frame_index``;
    ``extras`` columns of ``result`` repeat over their episode's frames.

    Returns:
        (the manifest, the checked clips from :func:`check_clips`), or None when the data files are not laid out as
        lerobot writes them (see the module doc).

    Raises:
        ResultContractError: an episode_index is NULL or not in meta/episodes.
        DatasetFormatError: duplicate meta/episodes rows, timestamps off the fps grid, bad clip pointers, an
            unreadable data file.
    """
    from .._catalog.views import parquet_read_errors
    from .._readers.tabular import data_file_info, row_group_ranges

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
    pos = {int(e): i for i, e in enumerate(all_ep)}
    unknown = [int(e) for e in dict.fromkeys(want.tolist()) if e not in pos]
    if unknown:
        raise ResultContractError(f"episodes {unknown[:5]} are not in meta/episodes (it holds {len(all_ep)} episodes, "
                                  f"{int(all_ep.min())}..{int(all_ep.max())}): {sql!r}")
    lo = ptr["dataset_from_index"].to_numpy()
    hi = ptr["dataset_to_index"].to_numpy()
    chunk, filei = ptr["data/chunk_index"].to_numpy(), ptr["data/file_index"].to_numpy()
    rels = [layout.data_file(c, fi) for c, fi in zip(chunk, filei)]
    files = sorted(set(rels))
    code_of = {r: i for i, r in enumerate(files)}
    fcode = np.array([code_of[r] for r in rels], np.int64)
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

    sel_rows = np.array([pos[int(e)] for e in want], np.int64)  # pointer row of each result row
    uniq_rows = np.unique(sel_rows)
    # Read each touched data file's needed row groups: the frame columns of the selected episodes only.
    frames: dict[int, tuple[pa.Table, np.ndarray, np.ndarray]] = {}
    for code in np.unique(fcode[uniq_rows]):
        rel = files[code]
        with parquet_read_errors(src, rel):
            info = data_file_info(src, rel)  # parsed once: the dataset reads the same footer next
            md, offsets, names = info.metadata, info.rg_offsets, info.schema.names
            for field in info.schema:  # an int dtype over floats must not reach the reader's cast
                t = field.type
                while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
                    t = t.value_type
                check_stored_type(layout.features.get(field.name), pa.types.is_floating(t) or pa.types.is_decimal(t),
                                  src.path(rel))
            if md.num_rows != total[code] or not all(c in names for c in FRAME_COLUMNS[:4]):
                return None
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
                t = pf.read(columns=cols) if whole else pf.read_row_groups(rgs.tolist(), columns=cols)
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
    if not (len(take) == ft.num_rows and (take == np.arange(len(take))).all()):  # whole files in order: as read
        ft = ft.take(pa.array(take))
    index = ft["index"].to_numpy()
    exp_index = lo[prow] + k_in_ep
    if not (np.array_equal(index, exp_index) and np.array_equal(ft["episode_index"].to_numpy(), all_ep[prow])):
        return None  # rows not in index order within the files: the DuckDB join reads each frame's real row
    ts = ft["timestamp"].to_numpy().astype(np.float64)
    fi = ft["frame_index"].to_numpy()
    err = np.abs(ts - fi / float(layout.fps))
    bad = np.flatnonzero(~(err <= 0.5 / float(layout.fps)))  # written so that a NaN timestamp is off the grid too
    if len(bad):
        e = all_ep[prow[bad]]
        worst = min(set(e.tolist()))
        mine = bad[e == worst]
        nan = mine[~np.isfinite(err[mine])]
        j = int(nan[0]) if len(nan) else int(mine[np.argmax(err[mine])])
        raise timestamp_error(worst, float(err[j]), float(layout.fps), data_file=files[sample_code[j]],
                              frame_index=int(fi[j]))

    length = {int(all_ep[r]): int(hi[r] - lo[r]) for r in range(len(all_ep))}
    clips = video_clips(layout, ptr)
    touched = {}
    for k, t in clips.items():
        paths = t["path"].to_pylist()
        sel_paths = {paths[r] for r in uniq_rows} - {None}  # no pointer: plan refuses those samples
        touched[k] = t.filter(pa.array([p in sel_paths for p in paths]))
    checked = check_clips(layout, touched, length, all_ep[uniq_rows])

    cols: dict[str, pa.Array] = {
        "index": pa.array(index, pa.int64()),
        "episode_index": pa.array(all_ep[prow], pa.int64()),
        "frame_index": pa.array(fi, pa.int64()),
        "timestamp": ft["timestamp"].cast(pa.float32()),
        "task_index": ft["task_index"].cast(pa.int64()) if "task_index" in ft.column_names
        else pa.array(np.zeros(len(rowidx), np.int64)),
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
