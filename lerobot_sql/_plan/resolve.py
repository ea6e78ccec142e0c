"""Turn a query result into a manifest: an Arrow table with one row per sample and everything needed to read it.

Result contract (checked in this order):
  * an ``index`` column: one sample per row, in result order;
  * ``episode_index`` with ``start_s`` and ``end_s``: the frames of each window, seconds from episode start,
    half-open ``[start_s, end_s)``;
  * ``episode_index`` alone: all frames of those episodes.
Other columns travel along as extras and are added to every item under their own names.

The manifest's columns and metadata are defined in :mod:`lerobot_sql._plan.manifest` (``result_row`` is the result row
each sample came from); both this module's DuckDB join and the pointer path end in :func:`lerobot_sql._plan.manifest.finish`.
"""

from __future__ import annotations

import difflib
import math
from typing import Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import manifest as _manifest
from . import episodes as pointers
from .clips import (check_clips, duplicate_episode_error, frames_kind, grid_limit, outside_clip, outside_clip_error,
                    timestamp_error)
from .._catalog.connection import MANIFEST_BYTES_PER_ROW, max_manifest_rows, missing_data_files
from .._query.sqltext import ident as q, literal, number
from ..errors import DatasetFormatError, MissingFileError, ResultContractError, did_you_mean as _did_you_mean, warn
from .._format.layout import Layout
from .._format.metadata import read_pointers
from .._storage.source import Source

CORE, LOCATION = _manifest.CORE, _manifest.LOCATION
CONTRACT = (
    "A query given to dataset() must return either an `index` column (one sample per row), or `episode_index` with "
    "`start_s` and `end_s` (seconds from episode start, half-open windows), or `episode_index` alone (whole episodes). "
    "For example: SELECT episode_index FROM episodes WHERE length > 200"
)


WINDOW_CONTRACT = ("A window result needs `episode_index`, `start_s` and `end_s` (seconds from the episode start, "
                   "half-open [start_s, end_s)), e.g. SELECT episode_index, 1.0 AS start_s, 3.0 AS end_s FROM episodes")
# Names users give window bounds that difflib does not tie to start_s/end_s (-> the contract name to alias them to).
_WINDOW_LOOKALIKES = {"t0": "start_s", "t1": "end_s", "t_start": "start_s", "t_end": "end_s", "tstart": "start_s",
                      "tend": "end_s", "begin": "start_s", "begin_s": "start_s", "stop": "end_s", "stop_s": "end_s",
                      "from_s": "start_s", "to_s": "end_s", "start_time": "start_s", "end_time": "end_s"}


def result_mode(columns: list[str]) -> str:
    """``index``, ``window`` or ``episode`` for a result with these columns.

    Raises:
        ResultContractError: none of the three shapes fits; the message states the contract. Also a result with
            ``episode_index`` and only one of ``start_s``/``end_s``, or with columns named like window bounds
            (``start``/``end``, ``t0``/``t1``, ``start_sec``, ...): read as whole episodes, it would silently train
            on every frame of them.

    Warns:
        UserWarning: the result has ``index`` and ``start_s``/``end_s`` too (``SELECT *, t AS start_s, ...`` over a
            view with ``index``): it is one sample per row, the bounds are extras, not the windows they look like.
    """
    if "index" in columns:
        bounds = " and ".join(c for c in ("start_s", "end_s") if c in columns)
        if bounds:
            warn(f"the result has `index`, so it is read as one sample per row (`index` is checked first), and "
                 f"{bounds} are kept as extra columns, not window bounds. For the frames of each window, leave "
                 f"`index` out (SELECT * EXCLUDE (index) ...); for one sample per row, alias {bounds} to other names "
                 "to keep them as extras without this warning")
        return "index"
    if "episode_index" in columns and "start_s" in columns and "end_s" in columns:
        return "window"
    if "episode_index" in columns:
        half = [c for c in ("start_s", "end_s") if c in columns]
        if half:
            other = "end_s" if half[0] == "start_s" else "start_s"
            near = [c for c in columns if c not in ("episode_index", half[0])]
            raise ResultContractError(f"the result has {half[0]} but no {other}.{_did_you_mean_any(near, [other])} "
                                      f"{WINDOW_CONTRACT}; without both it would select whole episodes")
        look = [(c, _window_lookalike(c)) for c in columns if c != "episode_index"]
        look = [(c, to) for c, to in look if to]
        if look:
            renames = ", ".join(f"{q(c)} AS {to}" for c, to in look)
            raise ResultContractError(
                f"the result has column(s) {[c for c, _ in look]} named like window bounds, but windows are read "
                f"only from start_s and end_s: as it is, it would select whole episodes. {WINDOW_CONTRACT}; rename "
                f"them ({renames}), or alias them to other names if they are meant as extra columns")
        return "episode"
    raise ResultContractError(f"the result has columns {columns}. {CONTRACT}")


def _window_lookalike(name: str) -> str | None:
    """``start_s``/``end_s`` when ``name`` looks like a misnamed window bound, else None."""
    low = name.lower()
    if low in _WINDOW_LOOKALIKES:
        return _WINDOW_LOOKALIKES[low]
    # The project's did-you-mean, at a stricter cutoff than for view names: an extra column called `state` or
    # `stage` must not be taken for `start_s`.
    if difflib.get_close_matches(low, ["start_s", "end_s"], n=1, cutoff=0.75):
        return _did_you_mean_name(low, ["start_s", "end_s"])
    return None


def _did_you_mean_name(name: str, candidates: list[str]) -> str | None:
    hint = _did_you_mean(name, candidates)  # " Did you mean 'x'?" or ""
    return hint.split("'")[1] if hint else None


def _did_you_mean_any(names: list[str], candidates: list[str]) -> str:
    for n in names:
        hint = _did_you_mean(n, candidates)
        if hint:
            return f" Column {n!r}:{hint}"
    return ""


def _check_contract_types(result: pa.Table, mode: str, sql: str) -> pa.Table:
    """Refuse contract columns of the wrong type, or NULL, before they reach a join: DuckDB would cast a string
    `index` inside our join (a ConversionException that is the query's fault, not the files'), and numpy would turn
    a NULL episode_index into garbage with a RuntimeWarning.

    Raises:
        ResultContractError: naming the column, its type or the row, and the cast that fixes it.

    Returns:
        ``result``, with whole-number DECIMAL keys (DuckDB's HUGEINT, e.g. of ``sum()``) as int64.
    """
    cols = {"index": ("index",), "window": ("episode_index", "start_s", "end_s"), "episode": ("episode_index",)}[mode]
    for c in cols:
        col = result[c]
        typ = col.type
        seconds = c in ("start_s", "end_s")
        if not seconds and pa.types.is_decimal(typ) and typ.scale == 0:
            try:
                col = col.cast(pa.int64())
            except pa.ArrowInvalid as e:
                raise ResultContractError(f"result column {c} holds values beyond int64: {sql!r}") from e
            result = result.set_column(result.schema.get_field_index(c), c, col)
            typ = col.type
        ok = pa.types.is_null(typ) or pa.types.is_integer(typ) or (
            seconds and (pa.types.is_floating(typ) or pa.types.is_decimal(typ)))
        if not ok:
            want = "seconds (a number)" if seconds else "an integer"
            cast = "DOUBLE" if seconds else "BIGINT"
            raise ResultContractError(f"result column {c} must be {want}, got {typ}; cast it in the query (e.g. "
                                      f"`CAST(x AS {cast}) AS {c}`): {sql!r}")
        if col.null_count and not seconds:  # NULL/NaN seconds: _check_window_bounds names the row
            i = int(pc.index(pc.is_null(col), True).as_py())
            raise ResultContractError(f"result column {c} is NULL in row {i}: every row must name a frame "
                                      f"({'an index' if c == 'index' else 'an episode_index'}); filter NULLs out "
                                      f"(`WHERE {c} IS NOT NULL`): {sql!r}")
    return result


def _check_pointers(con: duckdb.DuckDBPyConnection, layout: Layout, ext: pa.Table, cameras: list[str] | None = None,
                    tolerance_s: float | None = None, align: str = "timestamp") -> dict[str, dict[str, list]]:
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
    n = con.sql("SELECT episode_index, count(*) FROM _frames_loc WHERE episode_index IN "
                f"({', '.join(str(e) for e in set(t['episode_index'].to_pylist())) or 'NULL'}) GROUP BY 1").fetchall()
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


def _warn_rows_unlike_metadata(con: duckdb.DuckDBPyConnection) -> None:
    """Warn, naming each episode and both counts, when a selected episode's rows in data/ are not as many as
    meta/episodes' ``length`` says (an episode whose rows were left out of its data file, or its data file missing):
    the join would silently serve only what the data holds. Only whole-episode and window results: an ``index``
    result names its frames itself and an unknown index is an error."""
    rows = con.sql(
        "WITH sel AS (SELECT DISTINCT episode_index FROM _lsql_result), "
        "got AS (SELECT episode_index, count(*) AS n FROM _frames_loc SEMI JOIN sel USING (episode_index) GROUP BY 1) "
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


def _warn_repeated_rows(result: pa.Table, mode: str, sql: str) -> None:
    """Warn when the same episode (or the same window) comes more than once: each row gives its frames again, which
    is a training set with repeats, and more often a query over ``frames`` missing a DISTINCT (one row per frame:
    an episode of 158 frames came 158 times, 24,964 samples without a word)."""
    keys = {"episode": ["episode_index"], "index": ["index"]}.get(mode, ["episode_index", "start_s", "end_s"])
    if mode == "index":  # frames: millions of rows, mostly in order. A strictly rising column has no repeats
        idx = result["index"].to_numpy(zero_copy_only=False)
        if len(idx) < 2 or bool(np.all(idx[1:] > idx[:-1])) or pc.count_distinct(result["index"]).as_py() == len(idx):
            return
    counts = result.group_by(keys).aggregate([([], "count_all")])
    rep = counts.filter(pc.greater(counts["count_all"], 1))
    if rep.num_rows:
        top = rep.sort_by([("count_all", "descending")]).slice(0, 1).to_pylist()[0]
        what = (f"episode {top['episode_index']}" if mode == "episode" else f"index {top['index']}" if mode == "index"
                else f"window (episode {top['episode_index']}, {top['start_s']} .. {top['end_s']} s)")
        noun = "frame" if mode == "index" else mode
        warn(f"{rep.num_rows} {noun}(s) come more than once in the result ({what} {top['count_all']} times); "
             f"{'each row is one more sample of its frame' if mode == 'index' else 'each row gives its frames again'}. If you meant each once, SELECT DISTINCT {', '.join(keys)} "
             f"(a query over frames returns one row per frame): {sql!r:.200}")


# What an item can carry of an extra column (docs/training.md, "Adapter contract"): numbers, lists of numbers, text.
_EXTRA_TYPES = "numbers (integers, floats, booleans, DECIMAL), lists of numbers, text (VARCHAR) and lists of text"
# DuckDB types that Arrow hands over as something an item cannot carry, the SQL that makes them one that it can.
_EXTRA_CASTS = (
    (pa.types.is_date, "DATE", "`epoch({c})` (seconds) or `CAST({c} AS VARCHAR)`"),
    (pa.types.is_timestamp, "TIMESTAMP", "`epoch({c})` (seconds) or `CAST({c} AS VARCHAR)`"),
    (pa.types.is_time, "TIME", "`epoch({c})` (seconds) or `CAST({c} AS VARCHAR)`"),
    (pa.types.is_interval, "INTERVAL", "`epoch({c})` (seconds) or `CAST({c} AS VARCHAR)`"),
    (pa.types.is_struct, "STRUCT", "one field per column (`{c}.field AS field`) or `CAST({c} AS VARCHAR)`"),
    (pa.types.is_map, "MAP", "one value per column (`{c}['key'] AS key`) or `CAST({c} AS VARCHAR)`"),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t),
     "BLOB/BIT", "`CAST({c} AS VARCHAR)` or `octet_length({c})`"),
    (pa.types.is_union, "UNION", "`CAST({c} AS VARCHAR)` or one member per column"),
)


def _extra_type_ok(t: pa.DataType, in_list: bool = False) -> bool:
    if not in_list and (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        return _extra_type_ok(t.value_type, True)
    if pa.types.is_dictionary(t):  # DuckDB's ENUM: its text
        return pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t))


def _check_extra_types(result: pa.Table, extras: list[str], sql: str) -> pa.Table:
    """Refuse an extra column of a type an item cannot carry (``_EXTRA_TYPES``): a DATE, TIMESTAMP, STRUCT, MAP,
    BLOB, nested list ... would reach items as ``datetime.date``, dict or bytes and fail only in the DataLoader
    (torch's ``default_collate``: "found <class 'datetime.date'>"), far from the query.

    Returns:
        ``result``, with HUGEINT columns (DuckDB's ``sum()`` of integers; Arrow's ``decimal128(38, 0)``) as int64,
        so that they stay exact integers (as float64 they lose digits past 2**53).

    Raises:
        ResultContractError: naming the column, its type and the cast that fixes it; also a HUGEINT column
            holding values beyond int64 (they would be rounded).
    """
    for c in extras:
        col = result[c]
        t = col.type
        if not _extra_type_ok(t):
            inner = t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) or \
                pa.types.is_fixed_size_list(t) else t
            nested = pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner)
            name, fix = next(((n, f) for is_t, n, f in _EXTRA_CASTS if is_t(inner)),
                             ("nested LIST", "`flatten({c})` or one element per column (`{c}[1] AS first`)")
                             if nested else ("this type", "`CAST({c} AS VARCHAR)`"))
            what = "lists of lists" if nested else f"lists of {name}" if inner is not t else f"{name} values"
            if inner is not t and not nested:
                fix = "`CAST({c} AS VARCHAR[])` or one element per column (`{c}[1] AS first`)"
            raise ResultContractError(
                f"result column {c!r} holds {what} (Arrow {t}), which is not a type items carry ({_EXTRA_TYPES}; "
                f"dates, dicts or bytes in items fail only later, in the DataLoader's collate). Convert it in the "
                f"query, e.g. {fix.format(c=q(c))}, aliased (`... AS {q(c)}`), or leave it out: {sql!r:.200}")
        if pa.types.is_decimal(t) and t.scale == 0 and t.precision == 38:  # HUGEINT (or a DECIMAL(38, 0))
            try:
                col = col.cast(pa.int64())  # checked: a value beyond int64 raises instead of rounding
            except pa.ArrowInvalid as e:
                raise ResultContractError(
                    f"result column {c!r} (HUGEINT) holds values beyond int64, which an item cannot carry exactly; "
                    f"cast it in the query (`CAST({q(c)} AS DOUBLE)` to accept rounding, or compute a smaller "
                    f"number): {sql!r:.200}") from e
            result = result.set_column(result.schema.get_field_index(c), c, col)
    return result


def _check_sample_count(result: pa.Table, mode: str, layout: Layout, ptr: pa.Table | None, con, sql: str,
                        window_tolerance_s: float, before: int = 0) -> None:
    """Refuse an episode or window result whose samples (not rows: 20 episode rows may be 4,762 frames) exceed
    :func:`lerobot_sql._catalog.connection.max_manifest_rows`, before the manifest is built. Counted from the
    episodes' lengths in meta/episodes (``ptr``'s ``dataset_to_index - dataset_from_index``, else the ``episodes``
    view through ``con``): a window ``[start_s, end_s)`` holds the frames ``k`` of the fps grid with
    ``start_s <= k / fps < end_s`` (within ``window_tolerance_s``, as the join selects them), clipped to the
    episode; an episode's length to info.json's ``total_frames``. ``index`` results are capped where their rows are fetched (one row, one sample).
    ``before``: the samples other datasets of a collection already resolved for the same query (the bound is on the
    whole manifest).

    Raises:
        ResultContractError: naming the count, the bound and the fixes.
    """
    if mode == "index":
        return
    cap = max_manifest_rows() - before
    if result.num_rows > cap:  # a cheap bound first: every row is at least one sample
        total = None
    else:
        if ptr is not None and not (ptr["dataset_from_index"].null_count or ptr["dataset_to_index"].null_count):
            eps = ptr["episode_index"].to_numpy()
            lens = ptr["dataset_to_index"].to_numpy() - ptr["dataset_from_index"].to_numpy()
        else:
            t = (con if isinstance(con, duckdb.DuckDBPyConnection) else con()).sql(
                "SELECT episode_index, length FROM episodes WHERE episode_index IS NOT NULL AND length IS NOT NULL"
            ).to_arrow_table()
            eps, lens = t["episode_index"].to_numpy(), t["length"].to_numpy()
        order = np.argsort(eps, kind="stable")
        eps, lens = eps[order], lens[order].astype(np.int64)
        # Crafted pointers may claim 10**10 frames or a negative count (the join then reads the real rows): no
        # episode holds more frames than the dataset.
        most = layout.info.get("total_frames")
        lens = np.clip(lens, 0, most if isinstance(most, int) and not isinstance(most, bool) and most >= 0 else None)
        want = result["episode_index"].to_numpy(zero_copy_only=False).astype(np.int64)
        # an episode missing from meta/episodes counts 0 here: resolving it raises naming it
        length = np.zeros(len(want), np.int64)
        if len(eps):
            at = np.minimum(np.searchsorted(eps, want), len(eps) - 1)
            length = np.where(eps[at] == want, lens[at], 0)
        if mode == "window":
            fps, tol = float(layout.fps), float(window_tolerance_s)
            with np.errstate(invalid="ignore", over="ignore"):
                bound = [np.clip(np.ceil((result[c].cast(pa.float64()).to_numpy(zero_copy_only=False) - tol) * fps),
                                 0, length) for c in ("start_s", "end_s")]
            length = np.maximum(bound[1] - bound[0], 0)
        total = int(np.sum(length))
        if total <= cap:
            return
    what = f"more than {cap:,}" if total is None else f"{total:,}"
    others = f" (besides the {before:,} samples of the collection's other datasets)" if before else ""
    raise ResultContractError(
        f"the query's {result.num_rows:,} {mode} rows select {what} samples{others}, more than the {cap + before:,} "
        f"this machine's memory holds as a manifest (about {MANIFEST_BYTES_PER_ROW} bytes per sample while it is built); select "
        f"fewer or shorter {'windows' if mode == 'window' else 'episodes'} (a LIMIT, a WHERE), or set "
        f"LSQL_MAX_MANIFEST_ROWS: {sql!r:.200}")


def _check_stackable(result: pa.Table, extras: list[str], sql: str) -> None:
    """Refuse an extra column a DataLoader cannot batch: lists whose length varies from row to row (``SELECT * FROM
    episodes`` brings ``tasks``, one or two task texts per episode). ``ds[i]`` would serve them, but torch's
    ``default_collate`` stops the first batch that mixes lengths with "each element in list of batch should be of
    equal size", far from the query that caused it. Lists of one length pass (of text too: collated as torch does,
    one tuple per position).

    A NULL list (``frames_ext``'s ``"<F>.delta"`` on an episode's first frame) is refused too: the item would
    hold None, which ``default_collate`` refuses ("found <class 'NoneType'>").

    Raises:
        ResultContractError: naming the column, what it holds and how to select a value that stacks.
    """
    for c in extras:
        t = result.schema.field(c).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
            continue
        if result[c].null_count:  # a NULL list reaches the item as None (a NULL number becomes NaN)
            nulls = pc.is_null(result[c])
            first = pc.index(nulls, True).as_py()
            raise ResultContractError(
                f"result column {c!r} is NULL in {result[c].null_count} row(s) (e.g. row {first}) where other rows "
                f"hold lists: the item would hold None, which a DataLoader cannot batch (torch's default_collate "
                f"refuses it); give those rows a list in SQL (`coalesce({q(c)}, [...]) AS {q(c)}`), filter them "
                f"(`WHERE {q(c)} IS NOT NULL`; frames_ext's delta and velocity columns are NULL on each episode's "
                f"first frame), or leave the column out: {sql!r:.200}")
        if pa.types.is_fixed_size_list(t):
            continue
        n = pc.list_value_length(result[c])
        lo, hi = pc.min(n).as_py(), pc.max(n).as_py()
        if lo is None or lo == hi:
            continue
        if pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type):
            raise ResultContractError(
                f"result column {c!r} holds lists of {lo} to {hi} texts, which a DataLoader cannot batch (every item "
                f"needs the same length); select one text per row (e.g. `{c}[1] AS {c}_first` or "
                f"`array_to_string({c}, '; ') AS {c}_text`), or leave it out (`SELECT episode_index FROM episodes "
                f"...` selects the episodes): {sql!r:.200}")
        raise ResultContractError(
            f"result column {c!r} holds lists of {lo} to {hi} values, which a DataLoader cannot stack into a "
            f"batch (every item needs the same length); pad or cut them to one length in SQL, or leave the "
            f"column out: {sql!r:.200}")


def _check_window_bounds(result: pa.Table, sql: str) -> None:
    """Refuse NaN or NULL ``start_s``/``end_s``: DuckDB orders NaN above every number, so ``timestamp < NaN`` holds
    and a NaN end would silently select the rest of the episode (a NaN start selects nothing). Infinite bounds keep
    their meaning (from the start / to the end of the episode)."""
    for c in ("start_s", "end_s"):
        try:
            v = result[c].cast(pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ResultContractError(f"result column {c} must be seconds (a number), got {result[c].type}: "
                                      f"{sql!r}") from e
        bad = pc.or_kleene(pc.is_null(v), pc.is_nan(v)).fill_null(True)
        if pc.any(bad).as_py():
            i = int(pc.index(bad, True).as_py())
            raise ResultContractError(f"result column {c} is {v[i].as_py() if v[i].is_valid else 'NULL'} in row {i} "
                                      f"(episode_index {result['episode_index'][i].as_py()}); a window needs "
                                      f"start_s and end_s in seconds from the episode start: {sql!r}")
    # A window [start_s, end_s) with start_s >= end_s holds no frame: among other rows it would vanish unnoticed.
    empty = pc.greater_equal(result["start_s"].cast(pa.float64()), result["end_s"].cast(pa.float64()))
    if pc.any(empty).as_py():
        i = int(pc.index(empty, True).as_py())
        n = int(pc.sum(empty.cast(pa.int64())).as_py())
        raise ResultContractError(
            f"row {i} (episode_index {result['episode_index'][i].as_py()}) is an empty window: start_s "
            f"{result['start_s'][i].as_py()} >= end_s {result['end_s'][i].as_py()} ({n} such row(s)); windows are "
            f"half-open [start_s, end_s) in seconds from the episode start, so end_s must be larger: {sql!r}")


def _shadow_differ(con: duckdb.DuckDBPyConnection, shadow: list[str]) -> list[tuple]:
    differ = " OR ".join(f"r.{q(c)} IS DISTINCT FROM f.{q(c)}" for c in shadow)
    return con.sql(f"SELECT r.index, {', '.join(f'r.{q(c)}' for c in shadow)} FROM _lsql_result r "
                   f"JOIN frames f ON f.index = r.index WHERE {differ} LIMIT 1").fetchall()


def _shadow_type_error(con: duckdb.DuckDBPyConnection, res: pa.Table, shadow: list[str],
                       sql: str) -> ResultContractError | None:
    """The error for a result column named like a frame column whose values cannot be compared with the frame's
    (``0.0 AS action`` against FLOAT[6]): DuckDB's Conversion/Binder error there is the query's mistake, not a
    damaged data file. Found by trying the columns one at a time (error path only); None if none fails alone."""
    for c in shadow:
        try:
            _shadow_differ(con, [c])
        except (duckdb.BinderException, duckdb.ConversionException) as e:
            ftype = con.sql(f"SELECT typeof({q(c)}) FROM frames LIMIT 1").fetchall()
            err = ResultContractError(
                f"result column {c!r} ({res[c].type}) is named like the frames' column {c!r} "
                f"({ftype[0][0] if ftype else '?'}) but cannot be compared with it ({type(e).__name__}: "
                f"{str(e).splitlines()[0]}); items carry the frame's own {c!r}, so alias a computed column (e.g. "
                f"`... AS {q('my_' + c.replace('.', '_'))}`) in: {sql!r}")
            err.__cause__ = e
            return err
    return None


def _contract_error(e: BaseException, sql: str) -> ResultContractError:
    """A DuckDB type error while the result is joined to the frames: the result's column types are at fault."""
    return ResultContractError(f"the query's result cannot be matched to the frames ({type(e).__name__}: "
                               f"{str(e).splitlines()[0]}); check the types of its columns (index and episode_index "
                               f"integers, start_s/end_s seconds): {sql!r}")


def _plain_numbers(t: pa.Table) -> pa.Table:
    """DECIMAL columns (DuckDB types `1.5` as DECIMAL) become float64, and numeric columns with NULLs float64 with
    NaN, so that every extra number becomes a tensor a DataLoader can collate."""
    cols = []
    for name, col in zip(t.column_names, t.columns):
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
                   result: pa.Table, *, sql: str, window_tolerance_s: float = 1e-4, ordered: bool = True,
                   src: Source | None = None, ptr: pa.Table | None = None, cameras: list[str] | None = None,
                   tolerance_s: float | None = None, before: int = 0, keep_extras: bool = True,
                   align: str = "timestamp") -> pa.Table:
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
    none: a list of text, a NULL list or a DATE there need not suit a DataLoader).

    Raises:
        ResultContractError: the result is empty, has the wrong columns, or names frames that do not exist.
        DatasetFormatError: an episode's frames are not in one data file, not one run of ``index``, or not one
            block of rows in ``index`` order (named by file, row and index: neighbours are read by position).
    """
    if result.num_rows == 0:
        raise ResultContractError(f"the query returned no rows, so there is nothing to train on or export"
                                  f"{_missing_data_note(con, src)}: {sql!r}")
    mode = result_mode(result.column_names)
    result = _check_contract_types(result, mode, sql)
    if mode == "window":
        _check_window_bounds(result, sql)
    if ptr is None and src is not None and mode != "index":  # read once, for the count and the pointer path
        ptr = read_pointers(src, layout)
    _check_sample_count(result, mode, layout, ptr, con, sql, window_tolerance_s, before)
    _warn_repeated_rows(result, mode, sql)
    video_cols = _manifest.video_columns(layout.video_keys)
    reserved = set(CORE) | set(LOCATION) | set(video_cols)
    contract = {"index": ("index",), "window": ("episode_index", "start_s", "end_s"),
                "episode": ("episode_index",)}[mode]
    extras = [c for c in result.column_names if c not in contract and c not in layout.features and c not in reserved]
    if not keep_extras:
        result, extras = result.drop_columns(extras), []
    clash = [c for c in result.column_names if c not in contract and c in set(LOCATION) | set(video_cols)]
    clash += [c for c in extras if c == "task" or c.endswith("_is_pad")]
    if clash:
        raise ResultContractError(f"result columns {clash} clash with the manifest's or the item's own keys; alias "
                                  f"them (e.g. `... AS my_{clash[0].replace('/', '_')}`) in: {sql!r}")
    result = _check_extra_types(result, extras, sql)
    _check_stackable(result, extras, sql)
    # Columns named like a frame column are the frame's own values (SELECT * FROM frames): they are not carried as
    # extras, so they must equal what the item will hold, never silently differ from it.
    shadow = [c for c in result.column_names if c not in contract and (c in layout.features or c in CORE)]
    if shadow and mode != "index":
        raise ResultContractError(f"result columns {shadow} are per-frame columns, but this {mode} result selects "
                                  f"frames by episode_index; alias or drop them in: {sql!r}")

    keep = list(contract) + extras + shadow
    if not ordered:
        result = result.sort_by([(c, "ascending") for c in contract])  # stable: equal keys keep their order
    stale: MissingFileError | None = None
    if mode == "episode" and src is not None:
        try:
            fast = pointers.episode_manifest(src, layout, _plain_numbers(result.select(keep)), extras, sql=sql,
                                             ptr=ptr, cameras=cameras, tolerance_s=tolerance_s, align=align)
        except MissingFileError as e:
            # A data file the pointers name is missing: a stale pointer, maybe, whose episode's rows are in another
            # file. The join below finds rows by episode_index (the connection warns, saying which); if the
            # selection then has no rows at all, the missing file is the error.
            fast, stale = None, e
        if fast is not None:
            return _finish(*fast, mode, extras, layout, sql, cameras)
    con = con if isinstance(con, duckdb.DuckDBPyConnection) else con()
    res = _plain_numbers(result.select(keep)).append_column("_ord", pa.array(range(result.num_rows), pa.int64()))
    con.register("_lsql_result", res)
    try:
        if shadow:
            try:
                bad = _shadow_differ(con, shadow)
            except (duckdb.BinderException, duckdb.ConversionException) as e:
                raise _shadow_type_error(con, res, shadow, sql) or _contract_error(e, sql) from e
            if bad:
                raise ResultContractError(
                    f"result columns {shadow} differ from the frames' own values (e.g. at index {bad[0][0]}); items "
                    f"carry the frame's values under those names, so alias computed columns: {sql!r}")
        tol = float(window_tolerance_s)
        join = {
            "index": "JOIN _frames_loc f ON f.index = r.index",
            "window": (f"JOIN _frames_loc f ON f.episode_index = r.episode_index "
                       f"AND f.timestamp >= r.start_s - {number(tol)} AND f.timestamp < r.end_s - {number(tol)}"),
            "episode": "JOIN _frames_loc f ON f.episode_index = r.episode_index",
        }[mode]
        extra_sel = "".join(f", r.{q(c)}" for c in extras)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _lsql_sel AS SELECT r._ord, f.*{extra_sel} FROM _lsql_result r "
                    f"{join} ORDER BY r._ord, f.frame_index")
        if mode != "index":
            _refuse_unknown_episodes(con, sql)
            _warn_rows_unlike_metadata(con)
        if mode == "index":
            n = con.sql("SELECT count(*) FROM _lsql_sel").fetchall()[0][0]
            if n != result.num_rows:
                missing = con.sql("SELECT r.index FROM _lsql_result r ANTI JOIN _frames_loc f ON f.index = r.index "
                                  "LIMIT 5").fetchall()
                raise ResultContractError(f"the result names frame index values that are not in the data files "
                                          f"(e.g. {[m[0] for m in missing]}): {sql!r}")
        ext = con.sql(
            "SELECT episode_index, min(index) AS ep_from_index, max(index) + 1 AS ep_to_index, count(*) AS n, "
            "min(row) AS ep_data_row0, max(row) - min(row) + 1 AS nrows, count(DISTINCT data_file) AS nfiles, "
            # Neighbours (delta_timestamps) and export runs are read by position, row0 + (index - ep_from): exact
            # only if row - index is the same for every frame of the episode (its rows in `index` order).
            "min(row - index) = max(row - index) AS in_order, "
            f"max(abs(timestamp - frame_index / {number(float(layout.fps))})) AS ts_err, "
            # the time range of its rows: each must name a frame of the episode's clip (clips.outside_clip)
            "min(timestamp::DOUBLE) AS ts_min, max(timestamp::DOUBLE) AS ts_max "
            "FROM _frames_loc WHERE episode_index IN (SELECT DISTINCT episode_index FROM _lsql_sel) GROUP BY 1"
        ).to_arrow_table()
        bad = [r for r in ext.to_pylist() if r["nfiles"] != 1 or r["n"] != r["ep_to_index"] - r["ep_from_index"]
               or r["n"] != r["nrows"] or not r["in_order"]]
        if bad:
            raise _episode_rows_error(con, bad[0])
        con.register("_lsql_ext", ext)
        clips = _check_pointers(con, layout, ext, cameras, tolerance_s, align)
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
    if manifest.num_rows == 0:
        if stale is not None:
            raise stale
        raise ResultContractError(f"the query's {mode} selection matched no frames{_missing_data_note(con, src)}: "
                                  f"{sql!r}")
    return _finish(manifest, clips, mode, extras, layout, sql, cameras)


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


def _finish(manifest: pa.Table, clips: dict, mode: str, extras: list[str], layout: Layout, sql: str,
            cameras: list[str] | None = None) -> pa.Table:
    """Both paths' last step: refuse samples of ``cameras`` (default all) without a video pointer; then the
    documented column order and the ``lerobot_sql.manifest`` metadata (:func:`lerobot_sql._plan.manifest.finish`)."""
    keys = layout.video_keys if cameras is None else [k for k in layout.video_keys if k in cameras]
    for k in keys:
        n = manifest[f"{k}/file"].null_count
        if n:
            eps = pc.unique(manifest["episode_index"].filter(pc.is_null(manifest[f"{k}/file"]))).to_pylist()
            raise DatasetFormatError(
                f"meta/episodes has no video pointer for camera {k!r} (videos/{k}/chunk_index, file_index, "
                f"from_timestamp) for {len(eps)} selected episode(s), e.g. {sorted(eps)[:5]}; its frames cannot be "
                f"located. Leave the camera out (cameras=[...] without it, or cameras=[] for tabular items), or "
                "restore those columns of meta/episodes (run `lerobot-sql doctor`)")
    return _manifest.finish(manifest, mode=mode, extras=extras, video_keys=layout.video_keys, fps=layout.fps,
                            sql=sql, clips=clips, cameras=None if cameras is None else keys)
