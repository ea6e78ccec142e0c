"""SQL building blocks registered on every connection: views and DuckDB macros for temporal questions.

Reference with examples: docs/sql.md. In short:

Views
  ``frames_ext``     ``frames`` plus, per vector feature F with ``names`` in info.json, one column per element
                     (``"F.<name>"``, e.g. ``"observation.state.gripper.pos"``); per-episode relative time
                     (``length``, ``duration_s``, ``progress`` 0..1, ``time_to_end_s``, ``dt_s``); and per numeric
                     vector feature F the frame-to-frame differences ``"F.delta"`` (F[t] - F[t-1], NULL on an
                     episode's first frame), ``"F.velocity"`` (delta / dt, units per second) and ``"F.speed"``
                     (L2 norm of the velocity).
  ``camera_frames``  one row per decoded camera frame, from the video index's actual pts: ``episode_index,
                     video_key, frame_index`` (0-based within the episode's segment of the mp4), ``timestamp``
                     (seconds from the episode start: pts_s - videos.from_timestamp, to the nanosecond), ``path, frame, pts, pts_s,
                     is_keyframe``.

Scalar macros
  ``element_index(feature, name)``  1-based position of ``name`` in ``feature``'s ``names`` (error if unknown).
  ``vec_sub(a, b)``, ``vec_norm(v)``  elementwise difference and L2 norm of numeric lists/arrays.

Table macros (the only functions allowed in FROM; see ``TABLE_MACROS``)
  ``first_event(pred)``                       per episode, the first frame of ``frames_ext`` where ``pred`` holds.
  ``event_windows(pred, before_s, after_s)``  ``[event_s - before_s, event_s + after_s)`` clipped to the episode;
                                              empty windows are dropped (an event at t = 0 has none before it).
  ``segments(pred, min_duration_s)``          maximal runs of consecutive frames where ``pred`` holds.
  ``nearest_camera_frame(video_key)``         for every ``frames`` row, the camera frame nearest in time.
All window-returning macros give ``(episode_index, start_s, end_s)`` rows (half-open, seconds from the episode start)
that ``Database.dataset()`` accepts.
"""

from __future__ import annotations

import json

from .._format.layout import Layout
from .._query.sqltext import ident as q
from .._query.sqltext import literal as lit
from .._query.sqltext import number, sql_key
from ..errors import warn

# Half-open windows are compared against float32 timestamps: this slack (seconds) matches plan.build_manifest.
TOL_S = 1e-4
NUMERIC = {"float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


_WINDOW = ("episode_index", "start_s", "end_s")
# Table macros users may call in FROM: name -> result columns.
TABLE_MACROS: dict[str, tuple[str, ...]] = {
    "first_event": ("episode_index", "event_s", "index", "frame_index"),
    "event_windows": _WINDOW + ("event_s",),
    "segments": _WINDOW + ("duration_s", "n_frames"),
    "nearest_camera_frame": ("index", "episode_index", "frame_index", "timestamp", "video_key",
                             "camera_frame_index", "camera_timestamp", "dt_s", "path", "frame", "pts", "pts_s"),
}
# The view each table macro's expression arguments are evaluated over.
MACRO_READS = {"first_event": "frames_ext", "event_windows": "frames_ext", "segments": "frames_ext",
               "nearest_camera_frame": "frames"}


def vector_features(layout: Layout, frame_cols: dict[str, str]):
    """(feature, length, element names or None) for 1-D vector features stored as lists/arrays in ``frames``."""
    for name, f in layout.features.items():
        typ = frame_cols.get(name, "")
        if len(f.shape) == 1 and f.shape[0] >= 1 and (typ.endswith("]")) and f.dtype in NUMERIC:
            yield name, f.shape[0], f.flat_names


def _frames_ext_sql(layout: Layout, frame_cols: dict[str, str], has_length: bool) -> str:
    """The ``frames_ext`` view. Names are compared as DuckDB does (ASCII case-insensitively, :func:`sql_key`), and a
    name is never given two meanings: a real ``frames`` column wins over everything; an element name that another
    element or a derived column (``F.delta``, ``length`` ...) also claims gets no column at all (read it as
    ``"F"[i]``; ``element_index`` names its position); each left-out name is warned about, naming both claims."""
    real = {sql_key(c): c for c in frame_cols}
    cand: list[tuple[str, str, str]] = []  # (expression, column name, what claims it)
    vecs = list(vector_features(layout, frame_cols))
    for feat, _n, names in vecs:
        for i, el in enumerate(names or []):
            cand.append((f"f.{q(feat)}[{i + 1}]", f"{feat}.{el}", f"element {i + 1} of {feat!r}"))
    # names that are not one per element name no element: said, not silently left out
    miscount = [(feat, len(layout.features[feat].listed_names), n) for feat, n, names in vecs
                if names is None and layout.features[feat].listed_names is not None]
    if miscount:
        said = "; ".join(f"{f!r} lists {k} name(s) for its {n} elements (shape [{n}])" for f, k, n in miscount)
        warn(f"frames_ext: {said} in meta/info.json, so it gets no named element columns; read its elements as "
             "\"feature\"[i], or fix 'names' in meta/info.json to one name per element (`lerobot-sql doctor`: "
             "feature_names)")
    fps = number(layout.fps)
    length = "e.length" if has_length else "count(*) OVER ep"
    derived = [(length, "length"), (f"{length} / {fps}", "duration_s"),
               (f"CASE WHEN {length} > 1 THEN f.frame_index / ({length} - 1) ELSE 0.0 END", "progress"),
               (f"{length} / {fps} - f.timestamp", "time_to_end_s"), ("f.timestamp - lag(f.timestamp) OVER w", "dt_s")]
    for feat, _n, _names in vecs:
        col = f"f.{q(feat)}"
        delta = f"vec_sub({col}, lag({col}) OVER w)"
        vel = f"list_transform({delta}, lambda d: d / (f.timestamp - lag(f.timestamp) OVER w))"
        derived += [(delta, f"{feat}.delta"), (vel, f"{feat}.velocity"), (f"vec_norm({vel})", f"{feat}.speed")]
    cand += [(e, n, "a derived column") for e, n in derived]
    claims: dict[str, list[str]] = {}
    for _e, name, who in cand:
        claims.setdefault(sql_key(name), []).append(who)
    sel, taken, dropped = ["f.*"], set(real), []
    claimed = set()  # names already said to be claimed twice: said once, listing every claim
    for expr, name, who in cand:
        key = sql_key(name)
        if key in real:
            dropped.append(f"{name!r} ({who}) is the real column {real[key]!r}")
        elif who != "a derived column" and len(claims[key]) > 1:
            if key not in claimed:
                claimed.add(key)
                dropped.append(f"{name!r} is claimed by {_claimants(claims[key])}")
        elif key not in taken:
            taken.add(key)
            sel.append(f"{expr} AS {q(name)}")
    if dropped:
        warn(f"frames_ext: {len(dropped)} column name(s) have more than one meaning in SQL (which ignores "
             f"letter case) and were left out: {'; '.join(dropped[:5])}. Read an element as "
             "\"feature\"[i] (element_index(feature, name) gives i), or fix 'names' in meta/info.json")
    join = "JOIN episodes e USING (episode_index)" if has_length else ""
    return (f"SELECT {', '.join(sel)} FROM frames f {join} "
            "WINDOW w AS (PARTITION BY f.episode_index ORDER BY f.frame_index), ep AS (PARTITION BY f.episode_index)")


def _claimants(who: list[str]) -> str:
    """``element 1 of 'a' and element 2 of 'a' and a derived column`` said as ``elements 1, 2 of 'a' and a derived
    column`` (a name listed six times is one claim of six elements, not six sentences)."""
    groups: dict[str, list[str]] = {}
    for w in dict.fromkeys(who):
        head, sep, feat = w.partition(" of ")
        if w.startswith("element ") and sep:
            groups.setdefault(feat, []).append(head.split(" ", 1)[1])
        else:
            groups.setdefault(w, [])
    return " and ".join(f"element{'s' if len(ix) > 1 else ''} {', '.join(ix)} of {g}" if ix else g
                        for g, ix in groups.items())


def _element_index_sql(layouts: list[Layout]) -> str:
    """The ``element_index(feature, name)`` macro over one dataset's ``names`` (a collection: every dataset's; a
    (feature, name) pair at different positions in two datasets has no one answer and is unknown)."""
    pos: dict[tuple[str, str], set[int]] = {}
    for layout in layouts:
        for name, f in layout.features.items():
            els = f.flat_names or [] if len(f.shape) == 1 else []
            for i, el in enumerate(els):
                if els.count(el) == 1:  # a name listed twice has no one position: it is unknown, not the first
                    pos.setdefault((name, el), set()).add(i + 1)
    whens = [f"WHEN {lit(n + chr(0) + e)} THEN {next(iter(p))}" for (n, e), p in pos.items() if len(p) == 1]
    if len(layouts) == 1:
        known = {name: f.flat_names for name, f in layouts[0].features.items() if len(f.shape) == 1 and f.flat_names}
        msg = lit("element_index: unknown feature/name; valid: " + json.dumps(known)[:2000])
    else:
        msg = lit("element_index: unknown feature/name, or one at different positions in the collection's datasets "
                  "(read it per dataset as \"feature\"[i])")
    body = " ".join(whens) or "WHEN NULL THEN NULL"
    return (f"CREATE OR REPLACE MACRO element_index(feature, name) AS "
            f"CASE feature || chr(0) || name {body} ELSE error({msg} || ' (got ' || feature || ', ' || name || ')') END")


# timestamp rounded to the nanosecond: the float64 difference left residues (-1.4e-14 s at an episode's first
# frame in a later file segment) that broke `timestamp = 0` and joins on frame times; a time base is coarser than 1 ns.
# `+ 0.0`: a residue rounded to -0.0 would print as -0.0 (and db.nearest's dt_s with it); -0.0 + 0.0 is +0.0.
CAMERA_FRAMES = f"""
SELECT v.episode_index, v.video_key,
       (row_number() OVER (PARTITION BY v.episode_index, v.video_key ORDER BY i.pts) - 1)::BIGINT AS frame_index,
       round(i.pts_s - v.from_timestamp, 9) + 0.0 AS timestamp, i.path, i.frame, i.pts, i.pts_s, i.is_keyframe
FROM videos v JOIN video_frames i
  ON i.video_key = v.video_key AND i.path = v.path
 AND i.pts_s >= v.from_timestamp - {TOL_S!r} AND i.pts_s < v.to_timestamp - {TOL_S!r}
UNION ALL
-- Loud, not empty, if the video index was not built for this query (Database.check builds it on use).
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE CASE WHEN NOT EXISTS (SELECT 1 FROM video_frames) AND EXISTS (SELECT 1 FROM videos)
           THEN error('camera_frames: the video index is not built yet; run '
                      || 'db.sql(''SELECT count(*) FROM video_frames'') once') ELSE false END
"""

# Nearest = the closer of the last camera frame at or before and the first at or after (two ASOF joins).
NEAREST_CAMERA_FRAME = """
WITH cam AS (SELECT * FROM camera_frames WHERE video_key = vkey),
     fr AS (SELECT @D@index, episode_index, frame_index, timestamp::DOUBLE AS t FROM frames),
     b AS (SELECT fr.*, c.frame_index AS cfi, c.timestamp AS ct FROM fr ASOF LEFT JOIN cam c
           ON @c.D=fr.D@c.episode_index = fr.episode_index AND c.timestamp <= fr.t),
     a AS (SELECT @fr.D@fr.index, c.frame_index AS cfi, c.timestamp AS ct FROM fr ASOF LEFT JOIN cam c
           ON @c.D=fr.D@c.episode_index = fr.episode_index AND c.timestamp >= fr.t),
     pick AS (SELECT @b.D@b.index, b.episode_index, b.frame_index, b.t,
                CASE WHEN a.cfi IS NULL OR (b.cfi IS NOT NULL AND b.t - b.ct <= a.ct - b.t) THEN b.cfi ELSE a.cfi END AS cfi
              FROM b JOIN a USING (@D@index))
SELECT @p.D@p.index, p.episode_index, p.frame_index, p.t AS timestamp, c.video_key, c.frame_index AS camera_frame_index,
       c.timestamp AS camera_timestamp, c.timestamp - p.t AS dt_s, c.path, c.frame, c.pts, c.pts_s
FROM pick p JOIN cam c ON @c.D=p.D@c.episode_index = p.episode_index AND c.frame_index = p.cfi
UNION ALL
-- Loud, not empty, for a key that is no camera (a typo, or the short name 'front'), as camera_frames does.
SELECT @NULL.D@NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE CASE WHEN NOT EXISTS (SELECT 1 FROM videos WHERE video_key = vkey)
           THEN error('nearest_camera_frame: ' || coalesce('''' || vkey::VARCHAR || '''', 'NULL')
                      || ' is not a camera (video_key) of videos; valid: '
                      || coalesce((SELECT string_agg(DISTINCT video_key, ', ' ORDER BY video_key) FROM videos),
                                  'none, the dataset has no videos')) ELSE false END
"""

FIRST_EVENT = """
SELECT @K@, arg_min(timestamp, frame_index)::DOUBLE AS event_s, arg_min(index, frame_index) AS index,
       min(frame_index) AS frame_index
FROM frames_ext WHERE @PRED@ GROUP BY @K@
"""

# Clipped to the episode, a window can be empty: an event on the first frame (event_s = 0) has nothing before it, so
# event_windows(pred, before_s, 0) gives no row for that episode rather than a zero-length window (which would be a
# training sample without frames).
# A NaN bound would compare false everywhere and give no rows, silently: arg raises instead (the filter depends on
# its value, so DuckDB cannot prune it away).
EVENT_WINDOWS = """
WITH arg AS (SELECT CASE WHEN before_s IS NULL OR after_s IS NULL OR isnan(before_s::DOUBLE) OR isnan(after_s::DOUBLE)
                    THEN error('event_windows: before_s and after_s must be numbers of seconds, not NaN or NULL (got '
                               || coalesce(before_s::VARCHAR, 'NULL') || ', ' || coalesce(after_s::VARCHAR, 'NULL')
                               || ')')
                    -- a negative bound, or both 0, gives windows that end before they start: no rows, silently
                    WHEN before_s::DOUBLE < 0 OR after_s::DOUBLE < 0 OR before_s::DOUBLE + after_s::DOUBLE <= 0
                    THEN error('event_windows: before_s and after_s must be seconds >= 0, not both 0 (got '
                               || before_s::VARCHAR || ', ' || after_s::VARCHAR || '): the window is [event_s - '
                               || 'before_s, event_s + after_s)')
                    ELSE before_s::DOUBLE END AS b_s, after_s::DOUBLE AS a_s)
SELECT @ev.K@, greatest(ev.event_s - arg.b_s, 0.0) AS start_s,
       least(ev.event_s + arg.a_s, e.duration_s) AS end_s, ev.event_s
FROM first_event(pred) ev JOIN episodes e USING (@K@), arg
WHERE least(ev.event_s + arg.a_s, e.duration_s) > greatest(ev.event_s - arg.b_s, 0.0)
"""

# Gaps and islands: a run ends wherever pred flips; frame_index - row_number() is constant within a run.
# Timestamps are float32 (about 2e-7 s apart from k/fps at t = 4 s): a run of exactly min_duration_s must not be dropped
# for that, hence the TOL_S slack rather than an exact comparison.
SEGMENTS = f"""
WITH hit AS (SELECT @K@, frame_index, timestamp::DOUBLE AS t FROM frames_ext WHERE @PRED@),
     runs AS (SELECT *, frame_index - row_number() OVER (PARTITION BY @K@ ORDER BY frame_index) AS run
              FROM hit),
     seg AS (SELECT @runs.K@, min(t) AS start_s, max(t) + 1.0 / any_value(i.fps) AS end_s, count(*) AS n_frames
             FROM runs @JOIN_INFO@ GROUP BY @runs.K@, run),
     arg AS (SELECT CASE WHEN min_duration_s IS NULL OR isnan(min_duration_s::DOUBLE)
                    THEN error('segments: min_duration_s must be a number of seconds, not NaN or NULL (got '
                               || coalesce(min_duration_s::VARCHAR, 'NULL') || ')')
                    ELSE min_duration_s::DOUBLE END AS min_s)
SELECT @K@, start_s, end_s, end_s - start_s AS duration_s, n_frames FROM seg, arg
WHERE end_s - start_s >= arg.min_s - {TOL_S!r}
ORDER BY @K@, start_s
"""


# The predicate of first_event / segments (and so event_windows): a condition, not a number or text that DuckDB
# would cast to one (first_event(frame_index) took every frame but the first as the event).
def _pred(macro: str) -> str:
    return (f"CASE WHEN typeof(pred) NOT IN ('BOOLEAN', '\"NULL\"') THEN error('{macro}: pred must be a true/false "
            "condition over frames_ext (e.g. \"observation.state.gripper.pos\" < 20), not a value of type ' || "
            "typeof(pred)) ELSE coalesce(pred::BOOLEAN, false) END")


def _keyed(template: str, collection: bool) -> str:
    """A table macro's SQL for one dataset (episodes keyed by ``episode_index``) or for a collection (keyed by
    ``dataset, episode_index``, frames by ``dataset, index``: each dataset numbers its own)."""
    if not collection:
        subs = {"@K@": "episode_index", "@ev.K@": "ev.episode_index", "@runs.K@": "episode_index",
                "@JOIN_INFO@": ", info i", "@D@": "", "@c.D=fr.D@": "", "@c.D=p.D@": "", "@fr.D@": "", "@b.D@": "",
                "@p.D@": "", "@NULL.D@": ""}
    else:
        subs = {"@K@": "dataset, episode_index", "@ev.K@": "ev.dataset, ev.episode_index",
                "@runs.K@": "runs.dataset, runs.episode_index", "@JOIN_INFO@": "JOIN info i USING (dataset)",
                "@D@": "dataset, ", "@c.D=fr.D@": "c.dataset = fr.dataset AND ", "@c.D=p.D@": "c.dataset = p.dataset AND ",
                "@fr.D@": "fr.dataset, ", "@b.D@": "b.dataset, ", "@p.D@": "p.dataset, ", "@NULL.D@": "NULL, "}
    for k, v in subs.items():
        template = template.replace(k, v)
    assert "@" not in template, template
    return template


def _table_macros(con, collection: bool) -> None:
    first_event = FIRST_EVENT.replace("@PRED@", _pred("first_event / event_windows"))
    con.execute(f"CREATE OR REPLACE MACRO first_event(pred) AS TABLE {_keyed(first_event, collection)}")
    con.execute(f"CREATE OR REPLACE MACRO event_windows(pred, before_s, after_s) AS TABLE "
                f"{_keyed(EVENT_WINDOWS, collection)}")
    segments = SEGMENTS.replace("@PRED@", _pred("segments"))
    con.execute(f"CREATE OR REPLACE MACRO segments(pred, min_duration_s) AS TABLE {_keyed(segments, collection)}")
    con.execute(f"CREATE OR REPLACE MACRO nearest_camera_frame(vkey) AS TABLE "
                f"{_keyed(NEAREST_CAMERA_FRAME, collection)}")


def _vector_macros(con) -> None:
    con.execute("CREATE OR REPLACE MACRO vec_sub(a, b) AS "
                "CASE WHEN a IS NULL OR b IS NULL THEN NULL "
                "ELSE list_transform(list_zip(a, b), lambda p: p[1]::DOUBLE - p[2]::DOUBLE) END")
    con.execute("CREATE OR REPLACE MACRO vec_norm(v) AS sqrt(list_sum(list_transform(v, lambda x: x::DOUBLE * x::DOUBLE)))")


# A collection's table macros give the dataset first (its rows are keyed by dataset, episode_index).
COLLECTION_TABLE_MACROS: dict[str, tuple[str, ...]] = {k: ("dataset",) + v for k, v in TABLE_MACROS.items()}


def register_collection(con, layouts: list[Layout]) -> None:
    """The macros of a collection, in the current (top-level) schema, over the collection's views: the table
    macros keyed by ``dataset, episode_index``, ``vec_sub`` / ``vec_norm``, and ``element_index`` over every
    dataset's ``names`` (a (feature, name) pair at different positions in two datasets has no one answer: an
    error naming it). ``frames_ext`` and ``camera_frames`` are union views (collection.UNION_VIEWS)."""
    _vector_macros(con)
    con.execute(_element_index_sql(layouts))
    _table_macros(con, True)


def register(con, layout: Layout, table_macros: bool = True) -> None:
    """Register the building-block views and macros on ``con`` (after catalog.register_views).

    Creates the views ``frames_ext`` and ``camera_frames`` and the macros listed in the module docstring.
    ``camera_frames`` binds to ``video_frames``: register_views' placeholder until the Database replaces it.
    """
    frame_cols = {r[0]: r[1] for r in con.sql("DESCRIBE frames").fetchall()}
    ep_cols = {r[0] for r in con.sql("DESCRIBE episodes").fetchall()}
    _vector_macros(con)
    con.execute(_element_index_sql([layout]))
    con.execute(f"CREATE OR REPLACE VIEW frames_ext AS {_frames_ext_sql(layout, frame_cols, 'length' in ep_cols)}")
    con.execute(f"CREATE OR REPLACE VIEW camera_frames AS {CAMERA_FRAMES}")
    if table_macros:  # a collection's datasets need none of their own: users call the collection's
        _table_macros(con, False)
