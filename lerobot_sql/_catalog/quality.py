"""The ``episode_quality`` view: one row per episode, the facts behind doctor's checks and the ones curators ask
for, each a column with its unit, and a ``verdict`` (``pass`` / ``review`` / ``exclude``) with its ``reasons``.

Built on first read (a lazy view, as ``video_frames``), once per connection (a data file changed after that is read
again by the next ``connect``): the per-episode facts of the data files come from one numpy
pass (:mod:`lerobot_sql._readers.episode_facts`), cached on disk under the data files' identities (a changed file is
read again, never served stale); the cameras' facts from the video index (demuxed packets' timestamps: no frame is
decoded), also cached. The verdict is SQL over those two small tables, ``episodes`` and ``tasks``, with the
thresholds of :class:`Thresholds` (``db.quality_thresholds(...)`` makes the view again with others).

Where a fact needs the dataset's own distribution (a velocity spike, a still episode, a length outlier), it is
relative to the dataset's episodes: the root mean square of each state element's change per frame over every frame,
the median episode speed, the median and MAD of the episode lengths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._format import stats_json
from .._query.sqltext import ident, literal, number
from .._readers import episode_facts
from .._storage import cache

# The view's columns, with their types: the placeholder (no rows) and the real view have exactly these.
COLUMNS = (
    ("episode_index", "BIGINT"), ("length", "BIGINT"), ("rows", "BIGINT"), ("repeated_frames", "BIGINT"),
    ("frame_gaps", "BIGINT"), ("frames_back", "BIGINT"), ("timestamp_drift_s", "DOUBLE"),
    ("nonfinite_values", "BIGINT"), ("nonfinite_features", "VARCHAR[]"), ("clip_frames", "BIGINT"),
    ("clip_missing_frames", "BIGINT"), ("clip_offset_s", "DOUBLE"), ("video_drift_s", "DOUBLE"),
    ("worst_camera", "VARCHAR"), ("frozen_state_frac", "DOUBLE"), ("state_speed", "DOUBLE"),
    ("state_speed_rel", "DOUBLE"), ("velocity_z", "DOUBLE"), ("jerk_z", "DOUBLE"), ("saturated_frac", "DOUBLE"),
    ("gripper_range_frac", "DOUBLE"), ("length_z", "DOUBLE"), ("task_missing", "BOOLEAN"),
    ("task_mismatch", "BOOLEAN"), ("verdict", "VARCHAR"), ("reasons", "VARCHAR[]"),
)
PLACEHOLDER = "SELECT " + ", ".join(f"NULL::{t} AS {ident(n)}" for n, t in COLUMNS) + " WHERE false"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When an episode is ``exclude`` or ``review`` (docs/curate.md lists each reason).

    ``exclude`` (the data is wrong): rows in the data other than meta/episodes' length, or an episode only one side
    has (``rows``); a repeated, skipped or backward frame_index (``frame_index``); a NaN or infinity
    (``nonfinite``); a timestamp off ``frame_index / fps`` by more than ``drift_frames`` frames
    (``timestamp_drift``); a camera's clip holding fewer frames than the data has rows (``clip_short``); a
    task_index the tasks table lacks (``task_missing``); an episode's rows in more than one place, or out of
    ``index`` order (``row_order``).

    ``review`` (the data may be fine): a camera's first frame more than ``clip_offset_frames`` frames off its clip's
    start, or a clip's duration more than ``video_drift_frames`` frames off the data's (``clip_shifted``,
    ``video_drift``); more than ``frozen_frac`` of the state's changes exactly zero (``frozen_state``); a mean
    state speed below ``still_rel`` of the dataset's median episode (``still``); a state element's change per
    frame above ``spike_z`` times its root mean square over the dataset (``velocity_spike``), or its third
    difference above ``jerk_z`` times its own (``jerk_spike``); more than ``saturated_frac`` of the frames with an
    action element within 0.1% of the action's range of its min or max (``action_saturated``); a gripper moving
    less than ``gripper_range`` of the median episode's gripper range (``gripper_static``); a length more than
    ``length_z`` robust z-scores (median, 1.4826 x MAD) from the median, in a dataset of at least
    ``length_min_episodes`` episodes (``length_outlier``); a task of its rows that the episode's meta/episodes
    ``tasks`` do not list (``task_mismatch``).
    """

    drift_frames: float = 0.5
    clip_offset_frames: float = 1.0
    video_drift_frames: float = 1.0
    frozen_frac: float = 0.5
    still_rel: float = 0.05
    spike_z: float = 25.0
    jerk_z: float = 40.0
    saturated_frac: float = 0.75
    gripper_range: float = 0.05
    length_z: float = 5.0
    length_min_episodes: float = 10  # below this, median and MAD say little: no length_outlier

    def changed(self, **changes) -> "Thresholds":
        """These thresholds with ``changes``.

        Raises:
            TypeError: a name that is no threshold (naming the ones there are).
            ValueError: a value that is not a finite number >= 0.
        """
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"no quality threshold {unknown[0]!r}; thresholds: {sorted(names)}")
        for k, v in changes.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or not 0 <= v <= 1e9:
                # (bounded: times a frame's duration it must stay a finite number in the view's SQL)
                raise ValueError(f"quality threshold {k}={v!r}: give a finite number from 0 to 1e9")
        return dataclasses.replace(self, **{k: float(v) for k, v in changes.items()})


def _limits(files) -> tuple[np.ndarray, np.ndarray] | None:
    """The action's per-element (min, max) from meta/stats.json, or None (no file, no action entry, unreadable:
    the saturation column is then NULL)."""
    src, layout = files.source, files.layout
    if "action" not in layout.features or not src.exists("meta/stats.json"):
        return None
    try:
        with src.open("meta/stats.json") as f:
            st = stats_json.from_json(f.read(), src.path("meta/stats.json"), layout)
        lo, hi = (np.asarray(st["action"][k], np.float64).reshape(-1) for k in ("min", "max"))
    except Exception:  # noqa: BLE001  (a bad stats.json is doctor's finding; here the column is left NULL)
        return None
    return (lo, hi) if np.isfinite(lo).all() and np.isfinite(hi).all() else None


def facts(files) -> pa.Table:
    """The per-episode facts of a dataset's data files (:func:`episode_facts.episode_facts`) with the columns
    relative to the dataset (``frozen_state_frac``, ``state_speed_rel``, ``velocity_z``, ``jerk_z``,
    ``saturated_frac``, ``gripper_range_frac``), cached under the data files' identities.

    Raises:
        MissingFileError, DatasetFormatError: a data file gone or unreadable.
        CacheError: the cache entry cannot be written.
    """
    src, layout = files.source, files.layout
    vectors = episode_facts.vectors_of(layout, _limits(files))
    key = json.dumps({"v": 3, "fps": layout.info.get("fps"), "vectors": [vectors.state, vectors.action,
                      vectors.gripper, vectors.numeric, None if vectors.limits is None else
                      [vectors.limits[0].tolist(), vectors.limits[1].tolist()]],
                      "files": [[rel, src.identity(rel)] for rel in layout.data_files]}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    path = files.cache_dir / cache.QUALITY / f"episode_facts-{digest}.parquet"
    cache.ensure(path, lambda tmp: pq.write_table(episode_facts.episode_facts(src, layout, vectors), tmp))
    return _derived(pq.read_table(path), vectors)  # the raw facts are kept: a new rule needs no new pass


def _derived(t: pa.Table, vectors: episode_facts.Vectors) -> pa.Table:
    """``t`` with the columns relative to the dataset (see :func:`facts`)."""
    n = t.num_rows
    rows = t["rows"].to_numpy().astype(np.float64) if n else np.zeros(0)
    nan = np.full(n, np.nan)
    out = {"frozen_state_frac": nan, "state_speed": nan, "state_speed_rel": nan, "velocity_z": nan, "jerk_z": nan,
           "saturated_frac": nan, "gripper_range_frac": nan}
    if "steps" in t.column_names and n:
        steps = t["steps"].to_numpy().astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["frozen_state_frac"] = np.where(steps > 0, t["frozen_state_frames"].to_numpy() / steps, np.nan)
            speed = t["state_speed"].to_numpy()
            out["state_speed"] = speed
            med = np.nanmedian(speed) if np.isfinite(speed).any() else np.nan
            out["state_speed_rel"] = speed / med if med and np.isfinite(med) else nan
            for fact, sq, count in (("velocity", "vel_sq", steps), ("jerk", "jerk_sq",
                                                                    t["jerk_n"].to_numpy().astype(np.float64))):
                mx = np.stack(t[f"{'vel' if fact == 'velocity' else 'jerk'}_max"].to_numpy(zero_copy_only=False))
                total = np.stack(t[sq].to_numpy(zero_copy_only=False)).sum(0)
                rms = np.sqrt(total / max(count.sum(), 1))
                z = np.where(rms > 0, mx / np.where(rms > 0, rms, 1), 0.0)
                out[f"{fact}_z"] = np.where(count > 0, z.max(1) if z.shape[1] else np.nan, np.nan)
    if "saturated_frames" in t.column_names and n:
        out["saturated_frac"] = t["saturated_frames"].to_numpy() / rows
    if "gripper_min" in t.column_names and n:
        # over the median episode's range, not the dataset's min to max: a few extreme episodes widen that
        gr = t["gripper_max"].to_numpy() - t["gripper_min"].to_numpy()
        med = np.nanmedian(gr) if np.isfinite(gr).any() else np.nan
        out["gripper_range_frac"] = gr / med if med > 0 else np.where(gr > 0, np.inf, 0.0)
    keep = ["episode_index", "rows", "repeated_frames", "frame_gaps", "frames_back", "timestamp_drift_s",
            "nonfinite_values", "nonfinite_features", "task_indices", "stretches", "index_breaks"]
    cols = {c: t[c] for c in keep if c in t.column_names}
    # NaN (no state, no steps) as NULL: DuckDB orders NaN above every number, so `NaN > threshold` would be true
    cols.update({k: pa.array(np.asarray(v, np.float64), pa.float64(), mask=~np.isfinite(np.asarray(v, np.float64)))
                 for k, v in out.items()})
    return pa.table(cols)


def camera_facts(con, at: str, fps: float) -> pa.Table:
    """Per episode, the cameras' worst: ``clip_frames`` (the fewest frames a camera's clip holds: video frames
    whose pts lies in ``[from_timestamp, to_timestamp)`` within half a frame), ``worst_camera`` (that camera),
    ``clip_offset_s`` (the largest |first frame's pts - from_timestamp|), ``clip_seconds`` (the largest
    ``to_timestamp - from_timestamp``) and ``clip_seconds_min``: from the ``videos`` view and the video index
    (``video_frames``: demuxed packets, nothing decoded)."""
    half = number(0.5 / fps)
    return con.sql(
        f"WITH v AS (SELECT episode_index, video_key, path, from_timestamp, to_timestamp FROM {at}videos), "
        f"f AS (SELECT v.episode_index, v.video_key, any_value(v.from_timestamp) AS from_s, "
        f"any_value(v.to_timestamp) AS to_s, count(vf.pts_s) AS clip_frames, min(vf.pts_s) AS first_s "
        f"FROM v LEFT JOIN {at}video_frames vf ON vf.path = v.path AND vf.pts_s >= v.from_timestamp - {half} "
        f"AND vf.pts_s < v.to_timestamp - {half} GROUP BY v.episode_index, v.video_key) "
        "SELECT episode_index, min(clip_frames) AS clip_frames, arg_min(video_key, clip_frames) AS worst_camera, "
        "max(abs(first_s - from_s)) AS clip_offset_s, max(to_s - from_s) AS clip_seconds, "
        "min(to_s - from_s) AS clip_seconds_min FROM f GROUP BY episode_index").to_arrow_table()


def view_sql(at: str, facts_name: str, cameras_name: str | None, fps: float, t: Thresholds) -> str:
    """The SELECT of the ``episode_quality`` view over ``episodes``, ``tasks`` (in schema ``at``, "" or
    ``"schema".``), the registered facts ``facts_name`` and camera facts ``cameras_name`` (None: no cameras)."""
    frame = 1.0 / float(fps)
    cam = (f"LEFT JOIN {ident(cameras_name)} c ON c.episode_index = coalesce(e.episode_index, q.episode_index)"
           if cameras_name else "LEFT JOIN (SELECT NULL::BIGINT AS episode_index, NULL::BIGINT AS clip_frames, "
           "NULL::VARCHAR AS worst_camera, NULL::DOUBLE AS clip_offset_s, NULL::DOUBLE AS clip_seconds, "
           "NULL::DOUBLE AS clip_seconds_min) c ON false")
    n = number
    length_z = ("(e.length - med.m) / nullif(1.4826 * med.mad, 0)")
    excl = [("rows", "coalesce(q.rows, 0) <> coalesce(e.length, -1)"),
            ("frame_index", "q.repeated_frames > 0 OR q.frame_gaps > 0 OR q.frames_back > 0"),
            ("nonfinite", "q.nonfinite_values > 0"),
            ("timestamp_drift", f"q.timestamp_drift_s > {n(t.drift_frames * frame)}"),
            ("clip_short", "c.clip_frames < q.rows"),
            ("row_order", "q.stretches > 1 OR q.index_breaks > 0"),
            ("task_missing", "tk.missing")]
    review = [("clip_shifted", f"c.clip_offset_s > {n(t.clip_offset_frames * frame)}"),
              ("video_drift", f"greatest(abs(c.clip_seconds - e.length * {n(frame)}), abs(c.clip_seconds_min - "
                              f"e.length * {n(frame)})) > {n(t.video_drift_frames * frame)}"),
              ("frozen_state", f"q.frozen_state_frac > {n(t.frozen_frac)}"),
              ("still", f"q.state_speed_rel < {n(t.still_rel)}"),
              ("velocity_spike", f"q.velocity_z > {n(t.spike_z)}"),
              ("jerk_spike", f"q.jerk_z > {n(t.jerk_z)}"),
              ("action_saturated", f"q.saturated_frac > {n(t.saturated_frac)}"),
              ("gripper_static", f"q.gripper_range_frac < {n(t.gripper_range)}"),
              ("length_outlier", f"abs({length_z}) > {n(t.length_z)} AND med.episodes >= {n(t.length_min_episodes)}"),
              ("task_mismatch", "tk.mismatch")]

    def flags(items):
        return "list_filter([" + ", ".join(f"CASE WHEN coalesce(({cond}), false) THEN {literal(name)} END"
                                           for name, cond in items) + "], lambda r: r IS NOT NULL)"

    return (
        f"WITH med AS (SELECT median(length) AS m, median(abs(length - (SELECT median(length) FROM {at}episodes))) "
        f"AS mad, count(*) AS episodes FROM {at}episodes), "
        # every task_index an episode's rows hold: one the tasks table lacks, or whose text meta/episodes' tasks of
        # the episode do not list
        f"tk AS (SELECT u.episode_index, bool_or(t.task IS NULL) AS missing, bool_or(t.task IS NOT NULL AND "
        f"e.tasks IS NOT NULL AND NOT list_contains(e.tasks, t.task)) AS mismatch FROM (SELECT episode_index, "
        f"unnest(task_indices) AS ti FROM {ident(facts_name)}) u LEFT JOIN {at}tasks t ON t.task_index = u.ti "
        f"LEFT JOIN {at}episodes e ON e.episode_index = u.episode_index GROUP BY u.episode_index), "
        f"j AS (SELECT e.episode_index AS e_ep, e.length, e.tasks, q.*, c.clip_frames, c.worst_camera, "
        f"c.clip_offset_s, greatest(abs(c.clip_seconds - e.length * {n(frame)}), abs(c.clip_seconds_min - e.length "
        f"* {n(frame)})) AS video_drift_s, {length_z} AS length_z, "
        f"coalesce(tk.missing, false) AS task_missing, tk.mismatch AS mismatch, "
        f"{flags(excl)} AS ex, {flags(review)} AS rv "
        f"FROM {at}episodes e FULL OUTER JOIN {ident(facts_name)} q ON q.episode_index = e.episode_index "
        f"{cam} CROSS JOIN med "
        "LEFT JOIN tk ON tk.episode_index = coalesce(e.episode_index, q.episode_index)) "
        "SELECT coalesce(e_ep, episode_index) AS episode_index, length, coalesce(rows, 0) AS rows, repeated_frames, "
        "frame_gaps, frames_back, timestamp_drift_s, nonfinite_values, nonfinite_features, clip_frames, "
        "greatest(coalesce(rows, 0) - clip_frames, 0) AS clip_missing_frames, clip_offset_s, video_drift_s, "
        "worst_camera, frozen_state_frac, state_speed, state_speed_rel, velocity_z, jerk_z, saturated_frac, "
        "gripper_range_frac, length_z, task_missing, "
        "coalesce(mismatch, false) AS task_mismatch, "
        "CASE WHEN len(ex) > 0 THEN 'exclude' WHEN len(rv) > 0 THEN 'review' ELSE 'pass' END AS verdict, "
        "list_concat(ex, rv) AS reasons FROM j ORDER BY 1")


__all__ = ["COLUMNS", "PLACEHOLDER", "Thresholds", "camera_facts", "facts", "view_sql"]
