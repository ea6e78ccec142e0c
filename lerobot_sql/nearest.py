"""Alignment across streams with different rates: for given times, the k nearest samples of named streams.

Tabular features (``observation.state``, ``action`` ...) are sampled at the dataset fps, one row of ``frames`` per
sample. Camera streams are sampled at their own rate: their sample times are the actual pts of the decoded frames,
from the video index (``camera_frames``: pts_s - videos.from_timestamp), so a camera recorded at 15 fps in a 30 fps
dataset is aligned by its real frame times, not by frame_index. The SQL form of the same alignment is an ASOF JOIN
(see ``nearest_camera_frame`` in :mod:`lerobot_sql._catalog.macros` and docs/sql.md).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ._query.sqltext import ident as q
from ._query.sqltext import literal as lit
from .errors import QueryError, as_int, as_real, did_you_mean


def _at_table(db, at: Any) -> pa.Table:
    """``at`` as an Arrow table with ``episode_index`` (int64) and ``timestamp`` (float64 seconds) columns."""
    if isinstance(at, str):
        t = db._arrow(at)
    elif isinstance(at, pa.Table):
        t = at
    elif hasattr(at, "to_arrow") and callable(at.to_arrow) and not isinstance(at, (list, tuple)):
        t = at.to_arrow()  # polars
    elif hasattr(at, "columns") and hasattr(at, "dtypes"):
        t = pa.Table.from_pandas(at, preserve_index=False)
    elif isinstance(at, dict):
        try:
            t = pa.table(at)
        except OverflowError as e:  # an int past int64 (a bare OverflowError before)
            raise QueryError(f"nearest(): the query times hold an integer that does not fit int64 ({e}); "
                             "episode_index is an int64 column: give episode_index values of the dataset") from e
    else:
        rows = list(at)
        eps, times = [as_int(r[0]) for r in rows], [as_real(r[1]) for r in rows]
        bad = next((j for j, (e, ts) in enumerate(zip(eps, times)) if e is None or ts is None), None)
        if bad is not None:  # int(1.5) was 1, int("1") 1, float(True) 1.0: another episode or time, silently
            raise QueryError(f"nearest(): query row {bad} is {tuple(rows[bad])!r}: give (episode_index, timestamp) "
                             "as an integer and a number of seconds")
        big = next((j for j, e in enumerate(eps) if not -2**63 <= e < 2**63), None)
        if big is not None:  # a bare OverflowError converting to int64 before
            raise QueryError(f"nearest(): episode_index [{eps[big]}] (query row {big}) not in this dataset: "
                             f"episode_index is an int64 column, and {eps[big]} does not fit it")
        t = pa.table({"episode_index": pa.array(eps, pa.int64()), "timestamp": pa.array(times, pa.float64())})
    missing = [c for c in ("episode_index", "timestamp") if c not in t.column_names]
    if missing:
        raise QueryError(f"nearest(): the query times need columns episode_index and timestamp (seconds from the "
                         f"episode start); missing {missing} among {t.column_names}. Example: "
                         "db.nearest('SELECT episode_index, timestamp FROM frames WHERE episode_index = 0', "
                         "['observation.images.front'])")
    try:
        out = pa.table({"episode_index": t["episode_index"].cast(pa.int64()),
                        "timestamp": t["timestamp"].cast(pa.float64())})
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise QueryError(f"nearest(): episode_index must be integers and timestamp numbers (seconds): {e}") from e
    for col in ("episode_index", "timestamp"):
        if out[col].null_count:
            # a NULL time (a LEFT JOIN that found nothing in an episode) was answered with the episode's first sample
            row = pc.index(pc.is_null(out[col]), True).as_py()
            raise QueryError(f"nearest(): query row {row} has no {col} (NULL): a query time must name an episode "
                             "and a time; drop such rows (e.g. WHERE timestamp IS NOT NULL after a LEFT JOIN)")
    return out


def _sample_sql(db, stream: str, tabular: list[str], types: dict[str, str]) -> str:
    """Samples of one stream: episode_index, pos (0-based order within the episode), t (seconds), identity columns
    and, for tabular streams, the values of every requested tabular stream (NULL elsewhere)."""
    if stream in db.layout.video_keys:
        vals = "".join(f", NULL::{types[k]} AS {q(k)}" for k in tabular)
        return (f"SELECT episode_index, frame_index AS pos, timestamp AS t, NULL::BIGINT AS index, frame_index, path, "
                f"frame, pts, pts_s{vals} FROM camera_frames WHERE video_key = {lit(stream)}")
    vals = "".join(f", {q(k)}" if k == stream else f", NULL::{types[k]} AS {q(k)}" for k in tabular)
    return ("SELECT episode_index, (row_number() OVER (PARTITION BY episode_index ORDER BY frame_index) - 1) AS pos, "
            "timestamp::DOUBLE AS t, index, frame_index, NULL::VARCHAR AS path, NULL::BIGINT AS frame, "
            f"NULL::BIGINT AS pts, NULL::DOUBLE AS pts_s{vals} FROM frames")


def nearest(db, at: Any, streams: Iterable[str] | str | None = None, k: int = 1, *,
            tolerance_s: float | None = None) -> pa.Table:
    """For each query time, the ``k`` samples of each stream nearest in time within the same episode.

    Args:
        db: the :class:`~lerobot_sql.db.Database`.
        at: the query times: a SQL query (run through the usual checks), an Arrow table, a pandas DataFrame, a
            dict of columns, or an iterable of ``(episode_index, timestamp)`` pairs. Needs ``episode_index`` and
            ``timestamp`` (seconds from the episode start, as in ``frames.timestamp``).
        streams: feature keys: tabular features (columns of ``frames``: ``observation.state``, ``action`` ...)
            and/or camera keys with ``dtype: video``. Default: every video camera.
        k: samples per (time, stream), >= 1; rank 1 is the nearest, ties go to the earlier sample.
        tolerance_s: if given, samples farther than this from the query time are left out (so a time can get
            fewer than k rows, or none). Never replaced by a farther sample.

    Returns:
        An Arrow table, one row per (query time, stream, rank), ordered by ``query_row``, stream (in the order
        given) and ``rank``. Columns: ``query_row`` (int64, position in ``at``), ``episode_index``, ``timestamp``
        (float64 s, the query time), ``stream`` (feature key), ``rank`` (int64, 1..k), ``sample_timestamp``
        (float64 s from the episode start: frames.timestamp, or the camera frame's pts_s - from_timestamp),
        ``dt_s`` (sample_timestamp - timestamp), ``index`` (frames.index; NULL for cameras), ``frame_index``
        (the frame's position in the episode: frames.frame_index, or for cameras the ordinal of the camera frame
        within the episode's segment of the mp4), ``path`` (mp4, cameras only), ``frame`` (ordinal in the mp4),
        ``pts`` (stream time-base units), ``pts_s`` (seconds in the mp4), then one column per requested tabular
        stream holding its value on that stream's rows (NULL on other rows).

    Raises:
        QueryError: unknown stream (with the valid names), ``k`` < 1, ``tolerance_s`` negative or not finite,
            ``at`` lacks the columns, holds a NaN or infinite time, or names an episode_index the dataset does not
            have.
    """
    layout = db.layout
    if streams is None:
        streams = list(layout.video_keys)
    elif isinstance(streams, str):
        streams = [streams]
    streams = list(dict.fromkeys(streams))
    types = {r[0]: r[1] for r in db.con.sql("DESCRIBE frames").fetchall()}
    frame_cols = list(types)
    valid = list(layout.video_keys) + [c for c in frame_cols if c not in layout.image_keys]
    for s in streams:
        if s not in valid:
            why = " (image features are stored per frame: use the frames rows)" if s in layout.image_keys else ""
            raise QueryError(f"nearest(): unknown stream {s!r}{why}.{did_you_mean(s, valid)} Streams: {valid}")
    if not streams:
        raise QueryError(f"nearest(): no streams given and the dataset has no video cameras; pass streams from {valid}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise QueryError(f"nearest(): k must be an integer >= 1, got {k!r}")
    if tolerance_s is not None and not (isinstance(tolerance_s, (int, float)) and 0 <= tolerance_s < math.inf):
        raise QueryError(f"nearest(): tolerance_s must be a finite number of seconds >= 0 (None: no bound), got "
                         f"{tolerance_s!r}")
    at_t = _at_table(db, at)
    # A NaN time is "after" every sample in DuckDB's ordering and an infinite one is nearest to the last sample:
    # either would return a sample with dt_s NaN/inf instead of an error.
    ts = at_t["timestamp"]
    bad = pc.invert(pc.is_finite(ts)).fill_null(False)
    if pc.any(bad).as_py():
        i = int(pc.index(bad, True).as_py())
        raise QueryError(f"nearest(): query time {ts[i].as_py()!r} (row {i}, episode_index "
                         f"{at_t['episode_index'][i].as_py()}) is not a finite number of seconds; give times from "
                         "the episode start, as in frames.timestamp")
    at_t = at_t.append_column("query_row", pa.array(range(at_t.num_rows), pa.int64()))
    if any(s in layout.video_keys for s in streams):
        db._ensure_video_frames()
    tabular = [s for s in streams if s not in layout.video_keys]

    con = db.con
    con.register("_lsql_at", at_t)
    try:
        unknown = con.sql("SELECT DISTINCT episode_index FROM _lsql_at ANTI JOIN episodes USING (episode_index) "
                          "ORDER BY 1 LIMIT 5").fetchall()
        if unknown:
            raise QueryError(f"nearest(): episode_index {[u[0] for u in unknown]} not in this dataset "
                             f"({layout.info.get('total_episodes')} episodes)")
        parts = []
        for order, s in enumerate(streams):
            tol = "" if tolerance_s is None else f" AND abs(s.t - a.timestamp) <= {float(tolerance_s)!r}"
            # ASOF finds the last sample at or before each time (position p); the k nearest lie in p-k+1 .. p+k.
            parts.append(f"""
              SELECT * FROM (
                SELECT a.query_row, a.episode_index, a.timestamp, {lit(s)} AS stream, {order} AS _order,
                       row_number() OVER (PARTITION BY a.query_row ORDER BY abs(s.t - a.timestamp), s.t) AS rank,
                       s.t AS sample_timestamp, s.t - a.timestamp AS dt_s, s.* EXCLUDE (episode_index, pos, t)
                FROM (SELECT q.*, coalesce(s.pos, -1) AS p FROM _lsql_at q
                      ASOF LEFT JOIN ({_sample_sql(db, s, tabular, types)}) s
                      ON s.episode_index = q.episode_index AND s.t <= q.timestamp) a
                JOIN ({_sample_sql(db, s, tabular, types)}) s
                  ON s.episode_index = a.episode_index AND s.pos BETWEEN a.p - {k - 1} AND a.p + {k}{tol}
              ) WHERE rank <= {k}""")
        sql = (f"SELECT * EXCLUDE (_order) FROM ({' UNION ALL '.join(parts)}) "
               "ORDER BY query_row, _order, rank")
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.Error as e:
            raise QueryError(f"nearest(): {type(e).__name__}: {e}") from e
    finally:
        con.unregister("_lsql_at")
