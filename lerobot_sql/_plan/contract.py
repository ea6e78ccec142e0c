"""The result contract: which query results can become a manifest, and what each of their columns means.

A result is one of three shapes (:func:`result_mode`, checked in this order):
  * an ``index`` column: one sample per row, in result order;
  * ``episode_index`` with ``start_s`` and ``end_s``: the frames of each window, seconds from episode start,
    half-open ``[start_s, end_s)``;
  * ``episode_index`` alone: all frames of those episodes.
Other columns travel along as extras and are added to every item under their own names (:func:`columns_of`);
columns named like a frame's own must hold the frame's values. Everything here is checked on the result itself,
before the join (:mod:`lerobot_sql._plan.resolve`) reads a frame; the one exception, :func:`shadow_differ`, compares
shadow columns with the frames inside the join's connection. The contract's prose is docs/training.md's "Adapter
contract".
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._catalog.connection import MANIFEST_BYTES_PER_ROW, max_manifest_rows
from .._format.layout import Layout
from .._query.sqltext import ident as q
from ..errors import ResultContractError, closest, warn
from ..errors import did_you_mean as _did_you_mean
from . import manifest as _manifest

CORE, LOCATION = _manifest.CORE, _manifest.LOCATION
# The contract's own columns of each mode (the join's keys, and the sort of a result without ORDER BY).
# Columns the resolver's join holds besides the features and the manifest's: the frame's file row, the result's order
JOIN_COLUMNS = ("row", "data_file", "_ord")
KEYS = {"index": ("index",), "window": ("episode_index", "start_s", "end_s"), "episode": ("episode_index",)}
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
    return closest(low, ["start_s", "end_s"], cutoff=0.75)


def _did_you_mean_any(names: list[str], candidates: list[str]) -> str:
    for n in names:
        hint = _did_you_mean(n, candidates)
        if hint:
            return f" Column {n!r}:{hint}"
    return ""


def check_contract_types(result: pa.Table, mode: str, sql: str) -> pa.Table:
    """Refuse contract columns of the wrong type, or NULL, before they reach a join: DuckDB would cast a string
    `index` inside our join (a ConversionException that is the query's fault, not the files'), and numpy would turn
    a NULL episode_index into garbage with a RuntimeWarning.

    Raises:
        ResultContractError: naming the column, its type or the row, and the cast that fixes it.

    Returns:
        ``result``, with whole-number DECIMAL keys (DuckDB's HUGEINT, e.g. of ``sum()``) as int64.
    """
    cols = KEYS[mode]
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
        if col.null_count and not seconds:  # NULL/NaN seconds: check_window_bounds names the row
            i = int(pc.index(pc.is_null(col), True).as_py())
            raise ResultContractError(f"result column {c} is NULL in row {i}: every row must name a frame "
                                      f"({'an index' if c == 'index' else 'an episode_index'}). A NULL the query "
                                      f"makes: filter it out (`WHERE {c} IS NOT NULL`); one read from the data or "
                                      "meta/episodes files is damage that filtering would hide: `lerobot-sql doctor` "
                                      f"names the file: {sql!r}")
    return result


def check_window_bounds(result: pa.Table, sql: str) -> None:
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


# A window [start_s, end_s) holds the frames whose timestamp t has start_s - tol <= t < end_s - tol: the join's rule
# (lerobot_sql._plan.resolve.build_manifest), which the plan on the fps grid follows (_plan.episodes.grid_window).
WINDOW_TOLERANCE_S = 1e-4


def pointer_lengths(ptr: pa.Table | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``(episode_index, frames)`` per meta/episodes row (``dataset_to_index - dataset_from_index``, int64), or None
    without usable pointers."""
    if ptr is None or ptr["dataset_from_index"].null_count or ptr["dataset_to_index"].null_count:
        return None
    return (ptr["episode_index"].to_numpy(),
            (ptr["dataset_to_index"].to_numpy() - ptr["dataset_from_index"].to_numpy()).astype(np.int64))


def lengths_of(want: np.ndarray, eps: np.ndarray, lens: np.ndarray, missing: int = 0) -> np.ndarray:
    """The frames (int64) of each episode of ``want``, by the episodes ``eps`` and their ``lens``; ``missing`` for
    one not among them."""
    want = np.asarray(want).astype(np.int64)
    if not len(eps):
        return np.full(len(want), missing, np.int64)
    order = np.argsort(eps, kind="stable")
    eps, lens = eps[order], np.asarray(lens)[order].astype(np.int64)
    at = np.minimum(np.searchsorted(eps, want), len(eps) - 1)
    return np.where(eps[at] == want, lens[at], missing)


def check_sample_count(result: pa.Table, mode: str, layout: Layout, ptr: pa.Table | None, con, sql: str,
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
        known = pointer_lengths(ptr)
        if known is None:
            t = (con if isinstance(con, duckdb.DuckDBPyConnection) else con()).sql(
                "SELECT episode_index, length FROM episodes WHERE episode_index IS NOT NULL AND length IS NOT NULL"
            ).to_arrow_table()
            known = t["episode_index"].to_numpy(), t["length"].to_numpy()
        # an episode missing from meta/episodes counts 0 here: resolving it raises naming it
        length = lengths_of(result["episode_index"].to_numpy(zero_copy_only=False), *known)
        # Crafted pointers may claim 10**10 frames or a negative count (the join then reads the real rows): no
        # episode holds more frames than the dataset.
        most = layout.info.get("total_frames")
        length = np.clip(length, 0, most if isinstance(most, int) and not isinstance(most, bool) and most >= 0 else None)
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


def warn_repeated_rows(result: pa.Table, mode: str, sql: str) -> None:
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
             f"(a query over frames returns one row per frame{'; for those frames alone, SELECT index' if mode == 'episode' else ''}): {sql!r:.200}")


def window_bounds_as_seconds(result: pa.Table) -> pa.Table:
    """``result`` with its ``start_s`` / ``end_s`` as float64 seconds: the one type both the join over the frames
    and the plan on the fps grid compare in (an INTEGER bound less the tolerance was a DECIMAL, which DuckDB
    compared with the float32 timestamp in float32; a DECIMAL finer than float64 sorted apart from its float64)."""
    for c in ("start_s", "end_s"):
        if result[c].type != pa.float64():
            result = result.set_column(result.column_names.index(c), c, result[c].cast(pa.float64()))
    return result


def _rows_text(result: pa.Table, rows: np.ndarray, length: np.ndarray | None = None, fps: float | None = None) -> str:
    """``row j: episode e, s .. e s`` for the first three of window ``rows`` of ``result`` (with the episode's span
    in seconds where ``length`` (frames, per row) and ``fps`` are given), ``; ...`` after them when there are more."""
    out = []
    for j in rows[:3].tolist():
        span = f" (its frames at 0 .. {(int(length[j]) - 1) / fps:.4g} s)" if length is not None else ""
        out.append(f"row {j}: episode {result['episode_index'][j].as_py()}, {result['start_s'][j].as_py()} .. "
                   f"{result['end_s'][j].as_py()} s{span}")
    return "; ".join(out) + ("; ..." if len(rows) > 3 else "")


def check_window_samples(result: pa.Table, samples: np.ndarray, sql: str, length: np.ndarray | None = None,
                         fps: float | None = None) -> None:
    """Refuse a window result none of whose rows holds a frame; warn when window rows of ``result`` hold no frame (``samples``: each row's sample count): past the episode's
    end, before its start, or narrower than a frame and between two. Their rows give no sample, which nothing
    said (a selection of 40 windows trained on 38). With each row's episode ``length`` (frames) and ``fps``, also
    warn of windows that reach past their episode's last frame time or start before 0, which are cut there (a
    window of 8.5 s gave 7 frames, without a word).

    Raises:
        ResultContractError: every row holds no frame (naming the first rows).
    """
    samples = np.asarray(samples)
    empty = np.flatnonzero(samples == 0)
    if len(empty) == result.num_rows:
        raise ResultContractError(
            f"the query's window selection matched no frames: no window holds a frame ({_rows_text(result, empty, length, fps)})"
            ". Windows are [start_s, end_s) in seconds from the episode's start (frame k at k / fps): "
            f"{sql!r:.200}")
    if len(empty):
        warn(f"{len(empty)} of the {result.num_rows} window rows hold no frame ({_rows_text(result, empty, length, fps)})"
             ": they give no sample. Windows are [start_s, end_s) in seconds from the episode's start (frame k at "
             f"k / fps): one past the episode's end, or narrower than a frame and between two, holds none: "
             f"{sql!r:.200}")
    if length is not None and fps:
        tol = WINDOW_TOLERANCE_S
        start = result["start_s"].to_numpy(zero_copy_only=False).astype(np.float64)
        end = result["end_s"].to_numpy(zero_copy_only=False).astype(np.float64)
        with np.errstate(invalid="ignore"):
            # a frame the episode would have next (at length / fps), or one before its first, lies in the window
            cut = np.flatnonzero((samples > 0) & ((end - tol > np.asarray(length) / float(fps)) | (start - tol < -1.0 / float(fps))))
        if len(cut):
            warn(f"{len(cut)} of the {result.num_rows} window rows reach past their episode's last frame or before "
                 f"its first ({_rows_text(result, cut, length, fps)}): each gives the frames the episode has there, "
                 f"fewer than its length in seconds (clamp the bounds to the episode, e.g. least(end_s, "
                 f"length / fps), to say so in the query; delta_timestamps pad past the ends instead): {sql!r:.200}")


def columns_of(result: pa.Table, mode: str, layout: Layout, sql: str, keep_extras: bool = True
               ) -> tuple[pa.Table, tuple[str, ...], list[str], list[str]]:
    """A result's columns by their part in the contract: ``(result, keys, extras, shadow)``.

    ``keys`` are the contract's columns of ``mode``; ``extras`` the query's other columns, carried into every item
    under their own names (none with ``keep_extras=False``), checked to be of types an item carries
    (:func:`check_extra_types`, which may convert HUGEINT to int64: the ``result`` returned) and to stack in a batch
    (:func:`check_stackable`); ``shadow`` the columns named like a frame's own (``SELECT * FROM frames``): not
    extras but the frame's values, which the join then checks are equal (:func:`shadow_differ`).

    Raises:
        ResultContractError: a column clashes with a manifest column (also ``<key>/time_s``, which
            ``export_manifest`` adds) or an item's own key (``task``, ``<key>_is_pad``); an extra of a type an item
            cannot carry or a DataLoader cannot batch; frame columns in an episode or window result (it selects
            frames by episode, so they name no frame).
    """
    # ``<key>/time_s``: the column export_manifest adds per camera (a user's of that name was written beside it,
    # twice, and the file could not be read back)
    video_cols = [*_manifest.video_columns(layout.video_keys), *(f"{k}/time_s" for k in layout.video_keys)]
    reserved = set(CORE) | set(LOCATION) | set(video_cols)
    keys = KEYS[mode]
    extras = [c for c in result.column_names if c not in keys and c not in layout.features and c not in reserved]
    if not keep_extras:
        result, extras = result.drop_columns(extras), []
    clash = [c for c in result.column_names if c not in keys and c in set(LOCATION) | set(video_cols)]
    clash += [c for c in extras if c == "task" or c.endswith("_is_pad")]
    # SQL names are case-insensitive: an extra named like a frame column, a manifest column or the join's own
    # (``row``, ``_ord``) in any case would be read as that column, or reorder the samples (``_ord``)
    taken = {c.lower() for c in (*reserved, *JOIN_COLUMNS, *layout.features, *keys)}
    clash += [c for c in extras if c.lower() in taken and c not in clash]
    if clash:
        raise ResultContractError(f"result columns {clash} clash with the manifest's, the frames' or the item's own "
                                  f"columns (SQL names are case-insensitive); alias them (e.g. `... AS "
                                  f"my_{clash[0].replace('/', '_')}`) in: {sql!r}")
    result = check_extra_types(result, extras, sql)
    check_stackable(result, extras, sql)
    # Columns named like a frame column are the frame's own values (SELECT * FROM frames): they are not carried as
    # extras, so they must equal what the item will hold, never silently differ from it.
    shadow = [c for c in result.column_names if c not in keys and (c in layout.features or c in CORE)]
    if shadow and mode != "index":
        raise ResultContractError(f"result columns {shadow} are per-frame columns, but this {mode} result selects "
                                  f"frames by episode_index; alias or drop them in: {sql!r}")
    return result, keys, extras, shadow


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


def check_extra_types(result: pa.Table, extras: list[str], sql: str) -> pa.Table:
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
            t = col.type
        _refuse_rounded_by_nan(col, t, c, sql)
    return result


def _refuse_rounded_by_nan(col, t: pa.DataType, c: str, sql: str) -> None:
    """An integer extra holding NULLs (or a list of integers holding NULL elements) reaches items as float64 with
    NaN, which rounds integers beyond 2**53 (9007199254740993 came back 9007199254740992.0, hostile review 11, F2;
    the scalar form ended in a bare ArrowInvalid, F3): refused, naming the column."""
    listed = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    inner = t.value_type if listed else t
    if not pa.types.is_integer(inner) or inner.bit_width < 64:
        return
    flat = pc.list_flatten(col) if listed else col
    if not flat.null_count or len(flat) == flat.null_count:
        return
    lo, hi = (v.as_py() for v in pc.min_max(flat).values())
    if hi > 2**53 or lo < -2**53:
        raise ResultContractError(
            f"result column {c!r} holds NULLs beside integers beyond 2**53 ({hi if hi > 2**53 else lo}); an item "
            f"carries a NULL-holding number as float64 with NaN, which would round them. Fill the NULLs in the query "
            f"(`coalesce({q(c)}, 0)`{', or `list_transform(' + q(c) + ', x -> coalesce(x, 0))`' if listed else ''}) "
            f"or `CAST({q(c)} AS DOUBLE{'[]' if listed else ''})` to accept rounding: {sql!r:.200}")


def check_stackable(result: pa.Table, extras: list[str], sql: str) -> None:
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


def check_given_extras(manifest: pa.Table, extras: list[str], where: str, sql: str | None) -> pa.Table:
    """The extras of a manifest from outside (a saved file or a table handed to ``dataset()``: its metadata's
    ``extras``) checked as a query's are (:func:`check_extra_types`, :func:`check_stackable`): an
    ``export_manifest`` file whose extra column was rewritten as DATE, STRUCT or lists of lists reached items as
    ``datetime.date``, dict or nested lists, and ragged lists failed only in the DataLoader's collate. ``sql``: the
    query the metadata records, quoted in the errors (``where`` without one).

    Returns:
        ``manifest``, a HUGEINT (``decimal128(38, 0)``) extra as int64, as a query's.

    Raises:
        ResultContractError: naming ``where``, the column, what it holds and the fix.
    """
    try:
        manifest = check_extra_types(manifest, list(extras), sql or where)
        check_stackable(manifest, list(extras), sql or where)
    except ResultContractError as e:
        raise ResultContractError(f"{where}: an extra column of this manifest is not what items carry: {e}. Write "
                                  "the manifest again with db.export_manifest(sql, path) from a query that converts "
                                  "it (or leave it out); a manifest's extras must be what the query's would be") \
            from None
    return manifest


def shadow_differ(con: duckdb.DuckDBPyConnection, shadow: list[str], frames: str = "frames") -> list[tuple]:
    """The first result row (``_lsql_result``) whose ``shadow`` columns differ from its frame's own: ``(index,
    *values)``. ``frames``: a FROM item holding at least the result's frames of the ``frames`` view."""
    differ = " OR ".join(f"r.{q(c)} IS DISTINCT FROM f.{q(c)}" for c in shadow)
    return con.sql(f"SELECT r.index, {', '.join(f'r.{q(c)}' for c in shadow)} FROM _lsql_result r "
                   f"JOIN {frames} f ON f.index = r.index WHERE {differ} LIMIT 1").fetchall()


def shadow_type_error(con: duckdb.DuckDBPyConnection, res: pa.Table, shadow: list[str],
                       sql: str, frames: str = "frames") -> ResultContractError | None:
    """The error for a result column named like a frame column whose values cannot be compared with the frame's
    (``0.0 AS action`` against FLOAT[6]): DuckDB's Conversion/Binder error there is the query's mistake, not a
    damaged data file. Found by trying the columns one at a time (error path only); None if none fails alone."""
    for c in shadow:
        try:
            shadow_differ(con, [c], frames)
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
