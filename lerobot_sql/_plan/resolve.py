"""Turn a query result into a manifest: the DuckDB join that finds each sample's frame, and its errors.

The result is first held to the contract (:mod:`lerobot_sql._plan.contract`: its shape, its columns' types, the
sample bound); whole episodes then go the pointer path (:func:`lerobot_sql._plan.episodes.episode_manifest`, pyarrow),
and ``index`` and window results (or episodes whose files are not laid out as lerobot writes them) this module's
join of the result with ``_frames_loc`` and ``videos``, which also refuses metadata that would give a neighbouring
frame silently (:func:`_check_pointers`). Both paths end in :func:`lerobot_sql._plan.manifest.finish`, which names
the manifest's columns (``result_row`` is the result row each sample came from).
"""

from __future__ import annotations

import math
from typing import Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._catalog.connection import missing_data_files
from .._catalog.frames_part import intervals
from .._format.layout import Layout
from .._format.metadata import read_pointers
from .._query.sqltext import ident as q
from .._query.sqltext import literal, number
from .._storage.source import Source
from ..errors import DatasetFormatError, MissingFileError, ResultContractError, warn
from . import contract, episodes
from . import manifest as _manifest
from .clips import (
    check_clips,
    duplicate_episode_error,
    frames_kind,
    grid_limit,
    outside_clip,
    outside_clip_error,
    timestamp_error,
)


def _check_pointers(con: duckdb.DuckDBPyConnection, layout: Layout, ext: pa.Table, cameras: list[str] | None = None,
                    tolerance_s: float | None = None, align: str = "timestamp",
                    frames_loc: Callable[[str, object], str] = lambda col, values: "_frames_loc"
                    ) -> dict[str, dict[str, list]]:
    """Refuse metadata that would otherwise give a neighbouring frame without any error (selected episodes only).

    Checks: one meta/episodes row per episode; ``timestamp`` within half a frame of ``frame_index / fps`` (a wrong
    fps in info.json), or within ``tolerance_s`` if larger (:func:`lerobot_sql._plan.clips.grid_limit`); per camera
    of ``cameras`` (default all), a clip that starts at or after 0, lasts the episode's frame count within one frame
    (writers that store ``to_timestamp = (length - 1) / fps`` pass) and does not overlap another clip of its file by
    half a frame or more; and, when a camera is read by time, every row's timestamp within its episode's clip
    (:func:`lerobot_sql._plan.clips.outside_clip`). ``align="frame_index"`` (frames by position) bounds no
    timestamp. ``lerobot-sql doctor`` checks the same and more, strictly, over every episode.

    A start shifted by one frame alone, or the last clip of a file shifted, passes these metadata checks; the dataset
    catches them against the real frames of each mp4 (``LeRobotSQLDataset._check_clips``) from what this returns.

    Returns:
        per camera, the clips of the selected episodes and their neighbours in the same file (see
        :func:`lerobot_sql._plan.clips.check_clips`, which the episode fast path shares).

    Raises:
        DatasetFormatError: naming the episode, camera, file and the fix.
    """
    fps = float(layout.fps)
    dup = con.sql("SELECT episode_index, count(*) FROM _episodes_raw WHERE episode_index IN "
                  "(SELECT episode_index FROM _lsql_ext) GROUP BY 1 HAVING count(*) > 1 ORDER BY 1 LIMIT 1").fetchall()
    if dup:
        raise duplicate_episode_error(*dup[0])
    # `not <=` so that NaN (DuckDB's max() of a column holding a NaN timestamp) is off the grid too.
    limit = grid_limit(fps, tolerance_s, align)
    keys = layout.video_keys if cameras is None else [k for k in layout.video_keys if k in cameras]
    off = [r for r in ext.to_pylist() if r["ts_err"] is not None and not r["ts_err"] <= limit]
    if off:
        off.sort(key=lambda r: (math.isfinite(r["ts_err"]), -r["ts_err"]))  # a NaN first, then the worst
        ep, err = off[0]["episode_index"], off[0]["ts_err"]
        where = {"others": [(r["episode_index"], r["ts_err"]) for r in off[1:4]], "n_off": len(off), "limit": limit}
        if not math.isfinite(err):  # error path only: find the frame and the file to name
            row = con.execute("SELECT data_file, frame_index FROM _frames_loc WHERE episode_index = ? AND "
                              "NOT isfinite(timestamp::DOUBLE) ORDER BY frame_index LIMIT 1", [ep]).fetchone()
            where = {"data_file": row[0], "frame_index": row[1]} if row else {}
        else:  # error path only: do the cameras' clips hold exactly these episodes' frames?
            n = {r["episode_index"]: r["n"] for r in off}
            got = con.execute(
                "SELECT video_key, episode_index, from_timestamp, to_timestamp FROM videos WHERE episode_index IN "
                f"({', '.join(str(int(e)) for e in n)}) AND video_key IN ({', '.join(literal(k) for k in keys)})"
            ).fetchall() if keys else []
            per = [[(np.nan if f is None else f, np.nan if t is None else t, n[e]) for k_, e, f, t in got if k_ == k]
                   for k in keys]
            where["frames"] = frames_kind([tuple(np.array(c, np.float64).reshape(-1, 3).T) for c in per], fps)
        raise timestamp_error(ep, err, fps, **where)
    if not keys:
        return {}
    # Every clip of every mp4 a selected episode uses, and the frames in data/ of those episodes.
    t = con.sql(
        "WITH sel AS (SELECT DISTINCT video_key, path FROM videos WHERE episode_index IN "
        "(SELECT episode_index FROM _lsql_ext)) "
        "SELECT v.video_key, v.episode_index, v.path, v.from_timestamp, v.to_timestamp FROM videos v "
        "SEMI JOIN sel ON sel.video_key = v.video_key AND sel.path = v.path"
    ).to_arrow_table()
    eps = sorted({e for e in t["episode_index"].to_pylist() if e is not None})
    n = con.sql(f"SELECT episode_index, count(*) FROM {frames_loc('episode_index', eps)} WHERE episode_index IN "
                f"({', '.join(str(e) for e in eps) or 'NULL'}) GROUP BY 1").fetchall()
    videos = {k: t.filter(pc.equal(t["video_key"], k)).drop_columns(["video_key"]) for k in layout.video_keys}
    clips = check_clips(layout, videos, dict(n), ext["episode_index"].to_numpy(), keys=keys)
    if align == "frame_index":  # frames by position: the timestamps locate none
        return clips
    # Every row of a selected episode (a window's neighbours too) must lie in its clip: its extremes tell.
    ep, rows = ext["episode_index"].to_numpy(), ext["n"].to_numpy()
    lo, hi = ext["ts_min"].to_numpy(zero_copy_only=False), ext["ts_max"].to_numpy(zero_copy_only=False)
    out = np.flatnonzero(outside_clip(lo, rows, fps) | outside_clip(hi, rows, fps))
    if len(out):  # error path only: the episode's first such row, to name it
        j = int(out[np.argmin(ep[out])])
        e, length = int(ep[j]), int(rows[j])
        f, fi, ts = con.execute(
            "SELECT data_file, frame_index, timestamp::DOUBLE FROM _frames_loc WHERE episode_index = ? AND NOT "
            "coalesce(timestamp::DOUBLE > ? AND timestamp::DOUBLE <= ?, false) ORDER BY index LIMIT 1",
            [e, -0.5 / fps, (length - 0.5) / fps]).fetchone() or (None, None, None)
        raise outside_clip_error(clips, e, fi, math.nan if ts is None else float(ts), length, fps, f)
    return clips


def _refuse_unknown_episodes(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse result rows (``_lsql_result``) naming an episode that has no frames selected (``_lsql_sel``) and is not
    in meta/episodes: a window of episode 77 in a dataset of 0..19 would otherwise vanish among the other rows
    (an ``episode_index`` row raises the same in the pointer path, an ``index`` row naming no frame too)."""
    unknown = [r[0] for r in con.sql(
        "SELECT DISTINCT episode_index FROM _lsql_result WHERE episode_index NOT IN (SELECT episode_index FROM "
        "_lsql_sel) AND episode_index NOT IN (SELECT episode_index FROM episodes WHERE episode_index IS NOT NULL) "
        "ORDER BY 1 LIMIT 5").fetchall()]
    if unknown:
        n, lo, hi = con.sql("SELECT count(*), min(episode_index), max(episode_index) FROM episodes").fetchall()[0]
        raise ResultContractError(f"episodes {unknown} are not in meta/episodes (it holds {n} episodes, "
                                  f"{lo}..{hi}): {sql!r}")


def _warn_rows_unlike_metadata(con: duckdb.DuckDBPyConnection, loc: str = "_frames_loc") -> None:
    """Warn, naming each episode and both counts, when a selected episode's rows in data/ are not as many as
    meta/episodes' ``length`` says (an episode whose rows were left out of its data file, or its data file missing):
    the join would silently serve only what the data holds. Only whole-episode and window results: an ``index``
    result names its frames itself and an unknown index is an error. ``loc``: a FROM item holding at least the
    rows of ``_frames_loc`` of the result's episodes."""
    rows = con.sql(
        "WITH sel AS (SELECT DISTINCT episode_index FROM _lsql_result), "
        f"got AS (SELECT episode_index, count(*) AS n FROM {loc} SEMI JOIN sel USING (episode_index) GROUP BY 1) "
        "SELECT s.episode_index, e.length, coalesce(g.n, 0) AS n, d.path, "
        "       d.path IS NULL OR d.path IN (SELECT path FROM _data_files_listed) AS present "
        "FROM sel s JOIN episodes e USING (episode_index) LEFT JOIN got g USING (episode_index) "
        "LEFT JOIN _episode_data_files d USING (episode_index) "
        "WHERE e.length IS NOT NULL AND coalesce(g.n, 0) <> e.length ORDER BY s.episode_index").fetchall()
    if not rows:
        return

    def one(ep, length, n, path, present):
        where = f" ({path} {'holds no rows of it' if n == 0 else f'holds {n:,}'})" if path and present else \
            (f" (its data file {path} is missing)" if path else "")
        return f"episode {ep}: {n:,} rows in data/ where meta/episodes says {length:,} frames{where}"

    said = sum(r[1] for r in rows)
    got = sum(r[2] for r in rows)
    who = "this selected episode has" if len(rows) == 1 else f"these {len(rows)} selected episodes have"
    warn(
        f"{'; '.join(one(*r) for r in rows[:5])}{'; ...' if len(rows) > 5 else ''}: {who} other row counts in data/ "
        f"than meta/episodes says, and only the rows that exist are served ({got:,} frames of {said:,}). "
        "`lerobot-sql doctor` checks the data files against meta/episodes; download the data file again, or leave "
        "the episode out of the query")


def _contract_error(e: BaseException, sql: str) -> ResultContractError:
    """A DuckDB type error while the result is joined to the frames: the result's column types are at fault."""
    return ResultContractError(f"the query's result cannot be matched to the frames ({type(e).__name__}: "
                               f"{str(e).splitlines()[0]}); check the types of its columns (index and episode_index "
                               f"integers, start_s/end_s seconds): {sql!r}")


def _plain_numbers(t: pa.Table) -> pa.Table:
    """DECIMAL columns (DuckDB types `1.5` as DECIMAL) become float64, and numeric columns with NULLs float64 with
    NaN, so that every extra number becomes a tensor a DataLoader can collate."""
    cols = []
    for col in t.columns:
        typ = col.type
        inner = typ.value_type if pa.types.is_list(typ) or pa.types.is_fixed_size_list(typ) else typ
        if pa.types.is_decimal(inner):
            col = col.cast(pa.list_(pa.float64()) if inner is not typ else pa.float64())
        if (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_decimal(col.type)) \
                and col.null_count:
            col = col.cast(pa.float64()).fill_null(float("nan"))
        cols.append(col)
    return pa.table(cols, names=t.column_names)


def build_manifest(con: duckdb.DuckDBPyConnection | Callable[[], duckdb.DuckDBPyConnection], layout: Layout,
                   result: pa.Table, *, sql: str, window_tolerance_s: float = contract.WINDOW_TOLERANCE_S, ordered: bool = True,
                   src: Source | None = None, ptr: pa.Table | None = None, cameras: list[str] | None = None,
                   tolerance_s: float | None = None, before: int = 0, keep_extras: bool = True,
                   align: str = "timestamp", loc: Callable[[dict, str], str] | None = None) -> pa.Table:
    """Resolve ``result`` (the rows of user query ``sql``) to a manifest, in the main process.

    Samples follow the result's row order when ``ordered`` (the query has an ORDER BY). Without one, DuckDB's row
    order can change from run to run, so rows are sorted by the contract columns first (``index``; or
    ``episode_index, start_s, end_s``; or ``episode_index``): the same query then always gives the same manifest.

    Whole-episode results (``episode_index`` rows) are resolved from the episode pointers with pyarrow when ``src``
    is given (:func:`lerobot_sql._plan.episodes.episode_manifest`: no DuckDB, only the selected episodes' row groups are
    read); ``con`` (a connection, or a function returning one) is used only for the other shapes, or when the data
    files are not laid out as lerobot writes them.

    ``cameras`` (default every video key): the cameras whose video pointers and clips are checked and recorded in the
    metadata (``cameras=[]``: tabular reads, no video metadata needed; the other cameras' columns may be null).
    ``tolerance_s``: timestamps may stray from ``frame_index / fps`` by this much when it is more than half a frame.
    ``align``: ``"timestamp"`` (default: frames are found by time, so every row's timestamp must lie in its episode's
    clip) or ``"frame_index"`` (by position: the timestamps are neither bounded nor checked against the clips).
    ``before``: samples of a collection's other datasets in the same manifest (the ``LSQL_MAX_MANIFEST_ROWS``
    bound is on the whole). ``keep_extras=False`` leaves the query's extra columns out, unchecked (an export writes
    none: a list of text, a NULL list or a DATE there need not suit a DataLoader). ``loc``: given bounds
    (``{"index" or "episode_index": intervals}``) and a view (``_frames_loc`` or ``frames``), a FROM item holding
    every row of the view that meets them (:meth:`lerobot_sql._catalog.connection.Connection.loc`: the row groups
    that may hold them, not every data file's row groups weighed by DuckDB); None: the views themselves.

    Raises:
        ResultContractError: the result is empty, has the wrong columns, or names frames that do not exist.
        DatasetFormatError: an episode's frames are not in one data file, not one run of ``index``, or not one
            block of rows in ``index`` order (named by file, row and index: neighbours are read by position).
    """
    if result.num_rows == 0:
        raise ResultContractError(f"the query returned no rows, so there is nothing to train on, export, show or compute statistics of"
                                  f"{_missing_data_note(con, src)}: {sql!r}")
    mode = contract.result_mode(result.column_names)
    result = contract.check_contract_types(result, mode, sql)
    if mode == "window":
        contract.check_window_bounds(result, sql)
        result = contract.window_bounds_as_seconds(result)
    if ptr is None and src is not None and mode != "index":  # read once, for the count and the pointer path
        ptr = read_pointers(src, layout)
    contract.check_sample_count(result, mode, layout, ptr, con, sql, window_tolerance_s, before)
    contract.warn_repeated_rows(result, mode, sql)
    result, keys, extras, shadow = contract.columns_of(result, mode, layout, sql, keep_extras)
    keep = list(keys) + extras + shadow
    if not ordered:
        result = result.sort_by([(c, "ascending") for c in keys])  # stable: equal keys keep their order
    stale: MissingFileError | None = None
    if mode == "episode" and src is not None:
        try:
            fast = episodes.episode_manifest(src, layout, _plain_numbers(result.select(keep)), extras, sql=sql,
                                             ptr=ptr, cameras=cameras, tolerance_s=tolerance_s, align=align)
        except MissingFileError as e:
            # A data file the pointers name is missing: a stale pointer, maybe, whose episode's rows are in another
            # file. The join below finds rows by episode_index (the connection warns, saying which); if the
            # selection then has no rows at all, the missing file is the error.
            fast, stale = None, e
        if fast is not None:
            return _finish(*fast, mode, extras, layout, sql, cameras)
    con = con if isinstance(con, duckdb.DuckDBPyConnection) else con()

    def frames_loc(col: str, values, view: str = "_frames_loc") -> str:
        """``view`` (``_frames_loc`` or ``frames``), or a part of it holding at least its rows whose ``col`` is one
        of ``values``."""
        if loc is None:
            return view
        v = pc.drop_null(values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, pa.int64()))
        return loc({col: intervals(v.to_numpy(zero_copy_only=False))}, view)

    res = _plain_numbers(result.select(keep)).append_column("_ord", pa.array(range(result.num_rows), pa.int64()))
    con.register("_lsql_result", res)
    try:
        if shadow:
            try:
                at = frames_loc("index", res["index"], "frames")  # (the result's frames, as the view gives them)
                bad = contract.shadow_differ(con, shadow, at)
            except (duckdb.BinderException, duckdb.ConversionException) as e:
                raise contract.shadow_type_error(con, res, shadow, sql, at) or _contract_error(e, sql) from e
            if bad:
                raise ResultContractError(
                    f"result columns {shadow} differ from the frames' own values (e.g. at index {bad[0][0]}); items "
                    f"carry the frame's values under those names, so alias computed columns: {sql!r}")
        tol = float(window_tolerance_s)
        # (the rows of _frames_loc these results can join: those of their frames, or of their episodes)
        at = frames_loc("index", res["index"]) if mode == "index" else frames_loc("episode_index", res["episode_index"])
        join = {
            "index": f"JOIN {at} f ON f.index = r.index",
            "window": (f"JOIN {at} f ON f.episode_index = r.episode_index "
                       f"AND f.timestamp >= r.start_s - {number(tol)} AND f.timestamp < r.end_s - {number(tol)}"),
            "episode": f"JOIN {at} f ON f.episode_index = r.episode_index",
        }[mode]
        extra_sel = "".join(f", r.{q(c)}" for c in extras)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _lsql_sel AS SELECT r._ord, f.*{extra_sel} FROM _lsql_result r "
                    f"{join} ORDER BY r._ord, f.frame_index")
        if mode != "index":
            _refuse_unknown_episodes(con, sql)
            _warn_rows_unlike_metadata(con, at)
        if mode == "index":
            n = con.sql("SELECT count(*) FROM _lsql_sel").fetchall()[0][0]
            if n != result.num_rows:
                missing = con.sql(f"SELECT r.index FROM _lsql_result r ANTI JOIN {at} f ON f.index = r.index "
                                  "LIMIT 5").fetchall()
                if not missing:  # every value is there, some more than once: the data files repeat rows
                    i, files = con.sql(
                        f"SELECT index, list(data_file ORDER BY data_file) FROM {at} WHERE index IN (SELECT "
                        "index FROM _lsql_result) GROUP BY 1 HAVING count(*) > 1 ORDER BY 1 LIMIT 1").fetchall()[0]
                    where = (f"in {files[0]} and {files[1]}" if files[0] != files[1] else
                             f"{len(files)} times in {files[0]}")
                    raise ResultContractError(
                        f"the result's frame index values are held more than once in the data files (e.g. index {i} "
                        f"{where}), so no one row is the frame: a data file repeats another's rows (a copy left by a "
                        "half-finished merge or download). Restore the data files from the dataset's source "
                        f"(`lerobot-sql doctor`: index_contiguous lists the repeated values): {sql!r}")
                raise ResultContractError(f"the result names frame index values that are not in the data files "
                                          f"(e.g. {[m[0] for m in missing]}): {sql!r}")
        if mode == "index":  # (the frames of the selected frames' episodes: each episode's rows are checked whole)
            at = frames_loc("episode_index", con.sql("SELECT DISTINCT episode_index FROM _lsql_sel")
                            .to_arrow_table().column(0))
        ext = con.sql(
            "SELECT episode_index, min(index) AS ep_from_index, max(index) + 1 AS ep_to_index, count(*) AS n, "
            "min(row) AS ep_data_row0, max(row) - min(row) + 1 AS nrows, count(DISTINCT data_file) AS nfiles, "
            # Neighbours (delta_timestamps) and export runs are read by position, row0 + (index - ep_from): exact
            # only if row - index is the same for every frame of the episode (its rows in `index` order).
            "min(row - index) = max(row - index) AS in_order, "
            f"max(abs(timestamp - frame_index / {number(float(layout.fps))})) AS ts_err, "
            # the time range of its rows: each must name a frame of the episode's clip (clips.outside_clip)
            "min(timestamp::DOUBLE) AS ts_min, max(timestamp::DOUBLE) AS ts_max, "
            # a NULL timestamp: a window's join would leave its frame out, an index result carry a NULL
            "count(*) - count(timestamp) AS ts_null "
            # (in episode order: the first broken episode is the one named, whichever rows the aggregate read -
            # a part of _frames_loc or the whole view - and in whatever order its threads gave the groups)
            f"FROM {at} WHERE episode_index IN (SELECT DISTINCT episode_index FROM _lsql_sel) GROUP BY 1 ORDER BY 1"
        ).to_arrow_table()
        bad = [r for r in ext.to_pylist() if r["nfiles"] != 1 or r["n"] != r["ep_to_index"] - r["ep_from_index"]
               or r["n"] != r["nrows"] or not r["in_order"]]
        if bad:
            raise _episode_rows_error(con, bad[0])
        nulls = [r for r in ext.to_pylist() if r["ts_null"]]
        if nulls:
            ep = min(r["episode_index"] for r in nulls)
            f, row = con.execute("SELECT data_file, row FROM _frames_loc WHERE episode_index = ? AND timestamp IS NULL "
                                 "ORDER BY data_file, row LIMIT 1", [ep]).fetchone()
            raise DatasetFormatError(f"{src.path(f) if src is not None else f}: column 'timestamp' is NULL in row "
                                     f"{row} (episode {ep}); every frame has a timestamp (seconds, lerobot's "
                                     "float32). Restore the file from the dataset's source (`lerobot-sql doctor` "
                                     "reads every row)")
        con.register("_lsql_ext", ext)
        clips = _check_pointers(con, layout, ext, cameras, tolerance_s, align, frames_loc)
        vsel, vjoin = [], []
        for i, k in enumerate(layout.video_keys):
            vsel.append(f", v{i}.path AS {q(k + '/file')}, v{i}.from_timestamp AS {q(k + '/from_timestamp')}")
            # The key is metadata (hostile): a literal, never pasted (``x' OR '1'='1`` joined every camera row).
            vjoin.append(f" LEFT JOIN videos v{i} ON v{i}.episode_index = s.episode_index AND v{i}.video_key = "
                         f"{literal(k)}")
        manifest = con.sql(
            "SELECT s.index, s.episode_index, s.frame_index, s.timestamp, s.task_index, s.data_file, "
            "s.row AS data_row, e.ep_from_index, e.ep_to_index, e.ep_data_row0, s._ord AS result_row"
            f"{''.join(vsel)}{''.join(f', s.{q(c)}' for c in extras)} "
            f"FROM _lsql_sel s JOIN _lsql_ext e USING (episode_index){''.join(vjoin)} ORDER BY s._ord, s.frame_index"
        ).to_arrow_table()
    finally:
        for name in ("_lsql_result", "_lsql_ext"):
            try:
                con.unregister(name)
            except Exception:
                pass
        con.execute("DROP TABLE IF EXISTS _lsql_sel")
    length = _row_lengths(result, ptr) if mode == "window" else None
    if manifest.num_rows == 0:
        if stale is not None:
            raise stale
        note = _missing_data_note(con, src)
        if mode == "window" and not note:  # which windows, and why they hold nothing
            contract.check_window_samples(result, np.zeros(result.num_rows, np.int64), sql, length, layout.fps)
        raise ResultContractError(f"the query's {mode} selection matched no frames{note}: {sql!r}")
    if mode == "window":
        contract.check_window_samples(result, np.bincount(manifest["result_row"].to_numpy(), minlength=result.num_rows),
                                    sql, length, layout.fps)
    return _finish(manifest, clips, mode, extras, layout, sql, cameras)


def _row_lengths(result: pa.Table, ptr: pa.Table | None) -> np.ndarray | None:
    """Each result row's episode length in frames (meta/episodes' ``dataset_to_index - dataset_from_index``), or
    None without usable pointers (or a row's episode missing from them)."""
    known = contract.pointer_lengths(ptr)
    if known is None:
        return None
    length = contract.lengths_of(result["episode_index"].to_numpy(zero_copy_only=False), *known, missing=-1)
    return None if (length < 0).any() else length


def _missing_data_note(con, src: Source | None) -> str:
    """For an error that no frame was found: ``" (N data files ... are missing, e.g. <path>...)"`` when data files
    meta/episodes points to do not exist (a metadata-only copy, a partial download), else ``""``; the cause was
    otherwise only in the warnings the connection gave long before. Error path only."""
    try:
        gone = missing_data_files(con if isinstance(con, duckdb.DuckDBPyConnection) else con())
    except Exception:  # noqa: BLE001 - a note for an error being raised; without the views, no note
        return ""
    if not gone:
        return ""
    where = src.path(gone[0]) if src is not None else gone[0]
    return (f" ({len(gone)} data file(s) that meta/episodes points to are missing, e.g. {where}: their episodes "
            "have no frames to read; download data/ again, `lerobot-sql doctor` lists them: data_files_present)")


def _episode_rows_error(con: duckdb.DuckDBPyConnection, b: dict) -> DatasetFormatError:
    """The error for an episode whose rows cannot be located by position (``b``: its row of the join's per-episode
    extent): spread over data files, a gap in its ``index`` values, or rows not one block in ``index`` order in its
    file (other episodes' rows between them, or shuffled). Reading by each frame's real row is not done: neighbours
    and export runs are read by position, as lerobot reads them, so such a file gives wrong neighbours there too.
    Error path only: reads the episode's rows to name the first misplaced one."""
    ep, n, lo, hi = b["episode_index"], b["n"], b["ep_from_index"], b["ep_to_index"]
    head = f"episode {ep}: its {n:,} frames"
    if b["nfiles"] != 1:
        files = [r[0] for r in con.execute("SELECT DISTINCT data_file FROM _frames_loc WHERE episode_index = ? "
                                           "ORDER BY 1 LIMIT 3", [ep]).fetchall()]
        return DatasetFormatError(
            f"{head} are spread over {b['nfiles']} data files (e.g. {', '.join(files)}); lerobot writes an episode "
            "into one file: rewrite the data files so each episode's rows are in one (`lerobot-sql doctor`: "
            "data_file_pointers lists them)")
    if n != hi - lo:
        return DatasetFormatError(
            f"{head} are not one contiguous run of `index` (index {lo}..{hi - 1} holds {hi - lo:,} values); fix the "
            "data files' `index` to 0..total_frames-1 in order (`lerobot-sql doctor`: episode_ranges and "
            "index_contiguous list them)")
    row0 = b["ep_data_row0"]
    # The first row of the episode's span (rows row0 .. row0 + nrows - 1 of its file) not holding the index that
    # position gives: another episode's row in between, or a frame out of index order.
    first = con.execute(
        "SELECT data_file, row, index, episode_index FROM _frames_loc WHERE data_file = "
        "(SELECT min(data_file) FROM _frames_loc WHERE episode_index = ?) AND row BETWEEN ? AND ? "
        "AND (episode_index IS DISTINCT FROM ? OR index IS DISTINCT FROM ? + (row - ?)) ORDER BY row LIMIT 1",
        [ep, row0, row0 + b["nrows"] - 1, ep, lo, row0]).fetchone()
    where = ""
    if first:
        f, row, idx, other = first
        what = f"index {idx}" + ("" if other == ep else f" of episode {other}")
        where = (f" in {f}: row {row} holds {what}, where rows in `index` order would hold index "
                 f"{lo + row - row0} (the episode spans rows {row0}..{row0 + b['nrows'] - 1})")
    return DatasetFormatError(
        f"{head} (index {lo}..{hi - 1}) are not one run of rows in `index` order{where}; their neighbours "
        "(delta_timestamps) and exported runs are read by position, so they would be other frames. Rewrite the "
        "file with its rows sorted by `index`, as lerobot writes it (e.g. `pq.write_table(pq.read_table(path)"
        ".sort_by('index'), path)`); `lerobot-sql doctor` (data_rows_in_index_order) lists every such row")


def episode_runs(layout: Layout, result: pa.Table, *, sql: str, src: Source, ptr: pa.Table | None,
                 cameras: list[str] | None = None, tolerance_s: float | None = None, align: str = "timestamp",
                 ordered: bool = True, cache_dir=None, windows: bool = False):
    """A whole-episode selection (``result``: ``episode_index`` rows, each once, in order unless not ``ordered``:
    then by episode, as :func:`build_manifest` sorts it) kept as its episodes, without a row per frame
    (:func:`lerobot_sql._plan.episodes.episode_runs`): for selections of more than
    :func:`lerobot_sql._plan.episodes.lazy_frames` frames, whose open then costs O(episodes). With ``windows``,
    a window selection (``episode_index, start_s, end_s`` rows, numeric bounds taken as float64 seconds, no other
    column) too, each window's frames planned on the fps grid and checked where read (what the dataset's items do:
    statistics and exports read every frame of a window selection).

    Returns:
        ``(manifest, episodes, infos, rules)``: ``manifest`` a zero-row manifest carrying the schema and metadata
        :func:`build_manifest` would give (``check_source``, the clips), the others as
        :func:`~lerobot_sql._plan.episodes.episode_runs` returns them; or None when the selection is smaller than
        the bound, or its files are not laid out as lerobot writes them (then :func:`build_manifest`).

    Raises:
        as :func:`build_manifest` for a whole-episode result (what it checks from pointers, footers and clips).
    """
    # Windows are planned on the grid only where a frame cannot stray into a window from beyond the frame before
    # or after it, which the reads check: timestamps within half a frame of their frame_index (tolerance_s no
    # larger), and bounded at all (align="timestamp"; align="frame_index" bounds none, yet the join selects by time).
    window = windows and sorted(result.column_names) == ["end_s", "episode_index", "start_s"] and \
        align == "timestamp" and grid_limit(layout.fps, tolerance_s, align) <= 0.5 / float(layout.fps)
    if ptr is None or result.num_rows == 0 or not (result.column_names == ["episode_index"] or window) or \
            layout.legacy:
        # (a query's other shapes, or extras: the frames' path; v2.x pointers are derived from the episodes'
        # lengths, so one wrong length would shift every later episode: read the frames)
        return None
    mode = "window" if window else "episode"
    result = contract.check_contract_types(result, mode, sql)
    if window:
        contract.check_window_bounds(result, sql)
        result = contract.window_bounds_as_seconds(_plain_numbers(result.select(["episode_index", "start_s", "end_s"])))
        result = result.set_column(0, "episode_index", result["episode_index"].cast(pa.int64()))
    if not ordered:  # as build_manifest sorts a result without ORDER BY
        result = result.sort_by([(c, "ascending") for c in contract.KEYS[mode]])
    if result["episode_index"].null_count or not window and \
            len(pc.unique(result["episode_index"])) != result.num_rows:  # repeats: one run per repeat, the frames' path
        return None
    lo, hi = ptr["dataset_from_index"], ptr["dataset_to_index"]
    if lo.null_count or hi.null_count:
        return None
    eps = ptr["episode_index"].to_numpy()
    length = hi.to_numpy() - lo.to_numpy()
    if window:  # the windows' frames on the grid (an episode missing from meta/episodes: 0 here, refused below)
        ep_len = contract.lengths_of(result["episode_index"].to_numpy(), eps, length)
        first, end = episodes.grid_window(result["start_s"].to_numpy(), result["end_s"].to_numpy(),
                                          np.maximum(ep_len, 0), layout.fps)
        frames = int((end - first).sum())
    else:
        frames = int(length[np.isin(eps, result["episode_index"].to_numpy())].sum())
    if frames <= episodes.lazy_frames():
        return None
    if window:
        contract.warn_repeated_rows(result, mode, sql)
    got = episodes.episode_runs(src, layout, result, sql=sql, ptr=ptr, cameras=cameras, tolerance_s=tolerance_s,
                                align=align, cache_dir=cache_dir)
    if got is None:
        return None
    table, infos, clips, rules = got
    if window:
        contract.check_window_samples(result, table["sel_to_index"].to_numpy() - table["sel_from_index"].to_numpy(), sql,
                                    table["ep_to_index"].to_numpy() - table["ep_from_index"].to_numpy(), layout.fps)
    _refuse_missing_pointers(table, layout, cameras)  # as the frames' path (_finish), on one row per episode
    empty = {"index": pa.int64(), "episode_index": pa.int64(), "frame_index": pa.int64(), "timestamp": pa.float32(),
             "task_index": pa.int64(), "data_file": pa.string(), "data_row": pa.int64(), "ep_from_index": pa.int64(),
             "ep_to_index": pa.int64(), "ep_data_row0": pa.int64(), "result_row": pa.int64()}
    for k in layout.video_keys:
        empty[f"{k}/file"] = table[f"{k}/file"].type
        empty[f"{k}/from_timestamp"] = table[f"{k}/from_timestamp"].type
    manifest = _finish(pa.schema(empty).empty_table(), clips, mode, [], layout, sql, cameras)
    return manifest, table, infos, rules


def _refuse_missing_pointers(manifest: pa.Table, layout: Layout, cameras: list[str] | None) -> list[str]:
    """Refuse rows of ``manifest`` (samples, or one row per episode) without a video pointer of ``cameras``
    (default all); returns those cameras' keys in info.json order.

    Raises:
        DatasetFormatError: naming the camera, the episodes and the ways out.
    """
    keys = layout.video_keys if cameras is None else [k for k in layout.video_keys if k in cameras]
    for k in keys:
        # no file, or no from_timestamp (a NULL cell, or the column absent: the videos view has NULL there) names
        # no frame: the clip cannot be placed in its mp4
        none = pc.or_(pc.is_null(manifest[f"{k}/file"]), pc.is_null(manifest[f"{k}/from_timestamp"]))
        if pc.any(none).as_py():
            eps = pc.unique(manifest["episode_index"].filter(none)).to_pylist()
            raise DatasetFormatError(
                f"meta/episodes has no video pointer for camera {k!r} (videos/{k}/chunk_index, file_index, "
                f"from_timestamp) for {len(eps)} selected episode(s), e.g. {sorted(eps)[:5]}; its frames cannot be "
                "located. Leave the camera out where the call takes cameras (db.dataset(..., cameras=[...]) "
                "without it, db.dataset(..., cameras=[]) for tabular items; db.manifest and db.stats take it too; "
                "db.export writes every camera, so it needs the pointers), or restore those columns of "
                "meta/episodes (run `lerobot-sql doctor`)")
    return keys


def _finish(manifest: pa.Table, clips: dict, mode: str, extras: list[str], layout: Layout, sql: str,
            cameras: list[str] | None = None) -> pa.Table:
    """Both paths' last step: refuse samples of ``cameras`` (default all) without a video pointer, and frame
    columns named in another case or holding a NULL; then the documented column order and the
    ``lerobot_sql.manifest`` metadata (:func:`lerobot_sql._plan.manifest.finish`)."""
    keys = _refuse_missing_pointers(manifest, layout, cameras)
    from .._readers.tabular import FRAME_INTEGERS

    for c in (*FRAME_INTEGERS, "timestamp"):
        # a data column named like a frame column in another case: SQL reads it as that column (its name as
        # stored), lerobot does not (its keys are case-sensitive)
        other = [n for n in manifest.column_names if n.lower() == c and n != c]
        if c not in manifest.column_names and other:
            raise DatasetFormatError(
                f"{manifest['data_file'][0].as_py() if manifest.num_rows else 'the data files'}: column {other[0]!r} "
                f"is named like {c!r} in another case; lerobot reads {c!r} (names are case-sensitive). Rename the "
                "column in the data files, or restore them from the dataset's source")
    for c in (*FRAME_INTEGERS, "timestamp"):  # a NULL cell of the data (NaN in an item, float64 in its row group's)
        if c in manifest.column_names and manifest[c].null_count:
            j = int(pc.index(pc.is_null(manifest[c]), True).as_py())
            raise DatasetFormatError(
                f"{manifest['data_file'][j].as_py()}: column {c!r} is NULL in row {manifest['data_row'][j].as_py()}; "
                "every frame has a value there. Restore the file from the dataset's source "
                "(`lerobot-sql doctor` reads every row)")
    if "timestamp" in manifest.column_names and manifest["timestamp"].type != pa.float32():
        # as the pointers' path gives it (a DECIMAL or float64 column of the data: the dataset maps it as float32)
        i = manifest.column_names.index("timestamp")
        manifest = manifest.set_column(i, "timestamp", manifest["timestamp"].cast(pa.float32()))
    return _manifest.finish(manifest, mode=mode, extras=extras, video_keys=layout.video_keys, fps=layout.fps,
                            sql=sql, clips=clips, cameras=None if cameras is None else keys,
                            dataset_id=_manifest.dataset_identity(layout))
