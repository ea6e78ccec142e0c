"""Per-episode facts read from a dataset's data files in one numpy pass: what ``episode_quality`` judges.

Why a pass of its own, not the ``frames`` view in DuckDB: the facts are differences of consecutive frames of each
episode, per element of list columns (frozen state, speed, velocity and jerk spikes), which DuckDB computes with
window functions over unnested lists (tens of seconds per million frames); pyarrow hands each column to numpy as one
buffer, and a row group at a time suffices. And why the raw rows, not the rows meta/episodes says an episode has: a
defect (a duplicated row, a missing one, an episode split across files) must be counted, not refused.

Rows are grouped by their own ``episode_index`` value, consecutive rows of one episode (in file order) forming a
stretch; differences are taken within a stretch only. Every data file is read whole (its row groups in spans of about
:data:`SPAN_ROWS` rows), the stretch of an episode carried from one span (or file) to the next.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from .._format.layout import Layout
from .._storage.source import Source
from . import tabular

SPAN_ROWS = 1 << 19  # rows read at a time
_CARRY = 3  # rows of the previous span kept for the differences (the jerk needs three before)


@dataclasses.dataclass
class Vectors:
    """Which columns the pass reads beyond the frame columns: ``state`` (the feature whose motion is judged,
    ``observation.state`` when present), ``action`` (saturation), their element counts, ``gripper`` (the element
    of ``state``, else of ``action``, whose name says gripper: ``(key, element)`` or None), ``numeric`` (every
    numeric feature: non-finite counts) and ``limits`` (the action's per-element (lo, hi) from meta/stats.json, or
    None)."""

    state: str | None
    action: str | None
    gripper: tuple[str, int] | None
    numeric: list[str]
    limits: tuple[np.ndarray, np.ndarray] | None


def vectors_of(layout: Layout, limits: tuple[np.ndarray, np.ndarray] | None) -> Vectors:
    """The :class:`Vectors` of a dataset: its numeric features, ``observation.state`` and ``action`` when they are
    float vectors, the gripper element by the features' ``names``."""
    frame_cols = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
    numeric = [k for k, f in layout.features.items() if k not in frame_cols and not (f.is_video or f.is_image)
               and f.dtype in ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
                               "uint32", "uint64", "bool")]

    def vec(key: str) -> str | None:
        f = layout.features.get(key)
        return key if f is not None and key in numeric and f.dtype.startswith("float") else None

    state, action = vec("observation.state"), vec("action")
    gripper = None
    for key in (state, action):  # the measured position first: did the gripper move, not was it told to
        if key is None:
            continue
        names = _element_names(layout.features[key].names)
        hit = [i for i, n in enumerate(names) if "gripper" in n.lower()]
        if hit:
            gripper = (key, hit[0])
            break
    return Vectors(state, action, gripper, numeric, limits if action else None)


def _element_names(names) -> list[str]:
    """Element names of a feature's info.json ``names`` (a list, or a dict of lists as some writers give)."""
    if isinstance(names, dict):
        names = next((v for v in names.values() if isinstance(v, list)), [])
    if isinstance(names, list) and len(names) == 1 and isinstance(names[0], list):  # [[...]]: one axis, nested
        names = names[0]
    return [str(n) for n in names] if isinstance(names, list) else []


class _Acc:
    """Per-episode accumulators, keyed by episode_index (grown as larger ones appear)."""

    def __init__(self, ns: int, na: int, nn: int = 0):
        self.ns, self.na, self.nn = ns, na, nn
        self.tasks: dict[int, set[int]] = {}  # slot -> the task_index values its rows hold
        self.cols: dict[str, np.ndarray] = {}
        self.n = 0
        # episode_index value -> its slot: dense, so a hostile value (2**60, negative) costs one slot, not an array
        # as long as the value
        self.slot: dict[int, int] = {}

    def slots(self, ep: np.ndarray) -> np.ndarray:
        """The slot of each of ``ep``'s episode_index values (new values get the next slots)."""
        uniq, inv = np.unique(ep, return_inverse=True)
        out = np.empty(len(uniq), np.int64)
        for i, v in enumerate(uniq.tolist()):
            out[i] = self.slot.setdefault(v, len(self.slot))
        self.grow(len(self.slot) - 1)
        return out[inv.reshape(-1)]

    _SPEC = {  # column -> (fill, per-element kind: None scalar, "s" state elements, "a" action elements)
        "rows": (0, None), "frame_min": (np.iinfo(np.int64).max, None), "frame_max": (np.iinfo(np.int64).min, None),
        "repeated_frames": (0, None), "frame_gaps": (0, None), "frames_back": (0, None),
        "timestamp_drift_s": (0.0, None), "nonfinite_values": (0, None),
        "task_min": (np.iinfo(np.int64).max, None), "task_max": (np.iinfo(np.int64).min, None),
        "frozen_state_frames": (0, None), "speed_sum": (0.0, None), "steps": (0, None),
        "vel_max": (0.0, "s"), "vel_sum": (0.0, "s"), "vel_sq": (0.0, "s"),
        "jerk_max": (0.0, "s"), "jerk_sq": (0.0, "s"), "jerk_n": (0, None),
        "saturated_frames": (0, None), "grip_min": (np.inf, None), "grip_max": (-np.inf, None),
        "stretches": (0, None), "index_breaks": (0, None), "nonfinite_by": (0, "n"),
    }

    def grow(self, top: int) -> None:
        if top < self.n:
            return
        n = max(top + 1, 2 * self.n, 1024)
        for name, (fill, kind) in self._SPEC.items():
            width = {None: (), "s": (self.ns,), "a": (self.na,), "n": (self.nn,)}[kind]
            dtype = np.float64 if isinstance(fill, float) else np.int64
            new = np.full((n, *width), fill, dtype)
            if name in self.cols:
                new[: self.n] = self.cols[name]
            self.cols[name] = new
        self.n = n


def episode_facts(src: Source, layout: Layout, vectors: Vectors) -> pa.Table:
    """One row per ``episode_index`` value found in the data files, with the facts ``episode_quality`` judges.

    Columns (units in the names or below): ``episode_index``; ``rows`` (data rows holding it); ``frame_min`` /
    ``frame_max`` (frame_index); ``repeated_frames`` / ``frame_gaps`` / ``frames_back`` (consecutive rows whose
    frame_index repeats, jumps ahead by more than one, goes back); ``timestamp_drift_s`` (max |timestamp -
    frame_index / fps|); ``nonfinite_values`` (rows x features holding a NaN or an infinity) and
    ``nonfinite_features`` (their names); ``task_min`` / ``task_max`` / ``task_indices`` (the task_index values its
    rows hold); ``stretches`` (separate stretches of rows in file order: 1 for rows in one place) and
    ``index_breaks`` (consecutive rows whose ``index`` does not follow on); and, when the dataset has an
    ``observation.state`` vector: ``frozen_state_frames`` (rows whose state equals the previous row's),
    ``state_speed`` (mean Euclidean norm of the state's change per second), ``velocity_max`` / ``velocity_sum`` /
    ``velocity_sq`` (per element: max, sum and sum of squares of |change per frame|, for z-scores against the
    dataset's own spread), ``jerk_max`` / ``jerk_sq`` / ``jerk_n`` (the same for the third difference);
    ``saturated_frames`` (rows with an action element within 0.1% of the action's range of its min or max, by
    ``vectors.limits``); ``gripper_min`` / ``gripper_max`` (the gripper element's range).

    Raises:
        MissingFileError, DatasetFormatError: as :func:`lerobot_sql._readers.tabular.read_row_groups` (a data file
            gone or not readable).
    """
    v = vectors
    fps = float(layout.info["fps"])
    ns = layout.features[v.state].shape[0] if v.state else 0
    acc = _Acc(ns, 0, len(v.numeric))
    acc.grow(0)  # the columns exist even when no data file does (a metadata-only copy: no rows, every column)
    cols = ["episode_index", "frame_index", "timestamp", "task_index", "index", *v.numeric]
    for rel in layout.data_files:
        info = tabular.data_file_info(src, rel)
        have = [c for c in cols if c in info.schema.names]
        carry: dict[str, np.ndarray] | None = None
        offsets = info.rg_offsets
        rg, n_rg = 0, len(offsets) - 1
        while rg < n_rg:
            stop = rg + max(1, int(np.searchsorted(offsets[rg + 1:] - offsets[rg], SPAN_ROWS, side="right")))
            stop = min(stop, n_rg)
            t = tabular.read_row_groups(src, info, list(range(rg, stop)), layout, columns=have, one_table=True)[0]
            rg = stop
            carry = _add_span(acc, t, v, fps, carry)
    return _table(acc, v)


def _flat(col: pa.ChunkedArray, width: int) -> np.ndarray:
    """A column as numpy: (rows,) for a scalar, (rows, width) for a fixed-size list."""
    arr = col.combine_chunks()
    if pa.types.is_fixed_size_list(arr.type) or pa.types.is_list(arr.type):
        return np.asarray(arr.flatten().to_numpy(zero_copy_only=False)).reshape(len(arr), -1)
    return arr.to_numpy(zero_copy_only=False)


def _add_span(acc: _Acc, t: pa.Table, v: Vectors, fps: float, carry: dict | None) -> dict:
    """Add the rows of table ``t`` (a span of one data file, in file order) to ``acc``; ``carry``: the last rows of
    the span before it in the same file (None at a file's start), for the differences. Returns this span's."""
    cur = {"ep": _flat(t["episode_index"], 1).astype(np.int64),
           "fi": _flat(t["frame_index"], 1).astype(np.int64) if "frame_index" in t.column_names else None,
           "ts": _flat(t["timestamp"], 1).astype(np.float64) if "timestamp" in t.column_names else None,
           "task": _flat(t["task_index"], 1).astype(np.int64) if "task_index" in t.column_names else None,
           "idx": _flat(t["index"], 1).astype(np.int64) if "index" in t.column_names else None}
    if v.state and v.state in t.column_names:
        cur["s"] = _flat(t[v.state], 0).astype(np.float64)
    k = 0 if carry is None else len(carry["ep"])
    if carry is not None:
        for name in list(cur):
            if cur[name] is not None and carry.get(name) is not None:
                cur[name] = np.concatenate([carry[name], cur[name]])
    ep_values = cur["ep"]
    n = len(ep_values)
    own = slice(k, n)  # this span's own rows (the carried ones were counted before)
    ep = acc.slots(ep_values) if n else ep_values  # accumulator slots, equal where the episode_index values are
    e_own = ep[own]
    c = acc.cols
    np.add.at(c["rows"], e_own, 1)
    same = np.zeros(n, bool)  # row i continues row i-1's episode
    same[1:] = ep[1:] == ep[:-1]
    # an episode's rows are one stretch of its data file (lerobot writes an episode into one file, in index order):
    # a second stretch, or an index that does not follow on, is rows out of place
    np.add.at(c["stretches"], e_own[~same[own]], 1)
    if cur["idx"] is not None:
        di = np.zeros(n, np.int64)
        di[1:] = cur["idx"][1:] - cur["idx"][:-1]
        np.add.at(c["index_breaks"], e_own[same[own] & (di[own] != 1)], 1)
    if cur["fi"] is not None:
        fi = cur["fi"]
        np.minimum.at(c["frame_min"], e_own, fi[own])
        np.maximum.at(c["frame_max"], e_own, fi[own])
        d = np.zeros(n, np.int64)
        d[1:] = fi[1:] - fi[:-1]
        m = same[own]
        dd = d[own]
        np.add.at(c["repeated_frames"], e_own[m & (dd == 0)], 1)
        np.add.at(c["frame_gaps"], e_own[m & (dd > 1)], 1)
        np.add.at(c["frames_back"], e_own[m & (dd < 0)], 1)
        if cur["ts"] is not None:
            np.maximum.at(c["timestamp_drift_s"], e_own, np.abs(cur["ts"][own] - fi[own] / fps))
    if cur["task"] is not None:
        np.minimum.at(c["task_min"], e_own, cur["task"][own])
        np.maximum.at(c["task_max"], e_own, cur["task"][own])
        for slot, task in np.unique(np.stack([e_own, cur["task"][own]]), axis=1).T.tolist():
            acc.tasks.setdefault(slot, set()).add(task)
    for j, key in enumerate(v.numeric):
        if key not in t.column_names:
            continue
        x = _flat(t[key], 0)
        if x.dtype.kind != "f":
            continue
        bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1)
        if bad.any():
            np.add.at(c["nonfinite_values"], e_own[bad], 1)
            np.add.at(c["nonfinite_by"][:, j], e_own[bad], 1)
    if v.action and v.action in t.column_names and v.limits is not None:
        a = _flat(t[v.action], 0).astype(np.float64)
        lo, hi = v.limits
        eps = 1e-3 * np.maximum(hi - lo, 0)
        sat = ((a <= lo + eps) | (a >= hi - eps)).any(axis=1)
        np.add.at(c["saturated_frames"], e_own[sat], 1)
    if v.gripper is not None and v.gripper[0] in t.column_names:
        g = _flat(t[v.gripper[0]], 0)[:, v.gripper[1]].astype(np.float64)
        np.minimum.at(c["grip_min"], e_own, g)
        np.maximum.at(c["grip_max"], e_own, g)
    if "s" in cur:
        s = cur["s"]
        ds = np.zeros_like(s)
        ds[1:] = s[1:] - s[:-1]
        m = same.copy()
        m[:k] = False  # differences of carried rows were counted with their own span
        e = ep[m]
        dsm = ds[m]
        np.add.at(c["frozen_state_frames"], e[(dsm == 0).all(axis=1)], 1)
        np.add.at(c["speed_sum"], e, np.sqrt((dsm * dsm).sum(axis=1)) * fps)
        np.add.at(c["steps"], e, 1)
        ad = np.abs(dsm)
        np.maximum.at(c["vel_max"], e, ad)
        np.add.at(c["vel_sum"], e, ad)
        np.add.at(c["vel_sq"], e, ad * ad)
        same3 = np.zeros(n, bool)
        same3[3:] = (ep[3:] == ep[2:-1]) & (ep[3:] == ep[1:-2]) & (ep[3:] == ep[:-3])
        same3[:k] = False
        if same3.any():
            j3 = np.zeros_like(s)
            j3[3:] = s[3:] - 3 * s[2:-1] + 3 * s[1:-2] - s[:-3]
            e3, aj = ep[same3], np.abs(j3[same3])
            np.maximum.at(c["jerk_max"], e3, aj)
            np.add.at(c["jerk_sq"], e3, aj * aj)
            np.add.at(c["jerk_n"], e3, 1)
    keep = {name: (arr[-_CARRY:] if arr is not None else None) for name, arr in cur.items()}
    return keep


def _table(acc: _Acc, v: Vectors) -> pa.Table:
    c = acc.cols
    values = np.fromiter(acc.slot.keys(), np.int64, len(acc.slot))
    found = np.fromiter(acc.slot.values(), np.int64, len(acc.slot))[np.argsort(values, kind="stable")]
    names = [k for k in v.numeric]
    by = c["nonfinite_by"][found]
    out = {"episode_index": np.sort(values), "rows": c["rows"][found],
           "frame_min": c["frame_min"][found], "frame_max": c["frame_max"][found],
           "repeated_frames": c["repeated_frames"][found], "frame_gaps": c["frame_gaps"][found],
           "frames_back": c["frames_back"][found], "timestamp_drift_s": c["timestamp_drift_s"][found],
           "nonfinite_values": c["nonfinite_values"][found],
           "nonfinite_features": pa.array([[nm for j, nm in enumerate(names) if row[j]] for row in by],
                                          pa.list_(pa.string())),
           "task_min": c["task_min"][found], "task_max": c["task_max"][found],
           "task_indices": pa.array([sorted(acc.tasks.get(int(f), ())) for f in found], pa.list_(pa.int64())),
           "stretches": c["stretches"][found], "index_breaks": c["index_breaks"][found]}
    if v.state:
        steps = c["steps"][found]
        with np.errstate(invalid="ignore", divide="ignore"):
            out["frozen_state_frames"] = c["frozen_state_frames"][found]
            out["state_speed"] = np.where(steps > 0, c["speed_sum"][found] / np.maximum(steps, 1), np.nan)
        out["steps"] = steps
        for name in ("vel_max", "vel_sum", "vel_sq", "jerk_max", "jerk_sq"):
            out[name] = pa.FixedSizeListArray.from_arrays(pa.array(c[name][found].ravel()), acc.ns)
        out["jerk_n"] = c["jerk_n"][found]
    if v.limits is not None:
        out["saturated_frames"] = c["saturated_frames"][found]
    if v.gripper is not None:
        out["gripper_min"] = c["grip_min"][found]
        out["gripper_max"] = c["grip_max"][found]
    return pa.table(out)


__all__ = ["Vectors", "episode_facts", "vectors_of"]
