"""Statistics of a selection, in lerobot's ``meta/stats.json`` form, computed where the data is.

``db.stats(sql)`` and ``ds.meta.stats`` return ``{feature: {"min", "max", "mean", "std", "count"[, "q01", "q10",
"q50", "q90", "q99"]}}`` with numpy arrays as lerobot's ``LeRobotDatasetMetadata.stats`` holds them (it passes each
value to ``torch.as_tensor``): a vector feature of shape ``(D,)`` gets arrays of shape ``(D,)``, a scalar feature
``(1,)``, a camera ``(3, 1, 1)`` (values in [0, 1]); ``count`` is ``int64`` of shape ``(1,)``; everything else is
float64 (min and max of an integer feature are int64, as lerobot's json round trip gives them).

What is exact and what is aggregated:

* **Numeric features** (vectors and scalars: ``observation.state``, ``action``, ``timestamp``, ``index``...) are
  computed by DuckDB over exactly the selected samples, read from the data files: population std (lerobot's), and
  exact quantiles (linear interpolation, numpy's default). lerobot's own quantiles are histogram estimates (5,000
  bins between min and max), so they can differ from these by up to a bin width. A frame that the selection serves
  twice (two overlapping windows) counts twice: the statistics describe the training set as it is sampled.
* **Cameras** (``video`` and ``image`` features) cannot be computed without decoding every frame; they are
  aggregated, as lerobot's ``aggregate_stats`` does, from the per-episode statistics in ``meta/episodes``
  (``episode_stats`` view) of every episode the selection touches, each episode whole. For a selection of whole
  episodes that is what lerobot would write for a dataset of exactly those episodes; for windows and single frames
  it is the statistics of the episodes they come from.
* Features without numbers (``string``, ``language`` columns) get no entry; neither do cameras of a dataset that
  keeps no per-episode statistics (v2.0).

Quantile keys appear when the source's statistics have them (lerobot >= 0.4 writes q01..q99); a v2.1 dataset
without them gets min/max/mean/std/count only.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ._format.jsontext import load_json
from ._format.layout import Layout
from ._query.sqltext import ident, literal
from .errors import DatasetFormatError

if TYPE_CHECKING:
    import duckdb

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
NUMERIC_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                  "uint64", "bool"}


def qkey(q: float) -> str:
    """``0.01`` -> ``"q01"``: lerobot's name of a quantile statistic."""
    return f"q{round(q * 100):02d}"


def numeric_features(layout: Layout) -> list[str]:
    """Features whose statistics come from the data files (numeric dtypes), in info.json order."""
    return [k for k, f in layout.features.items() if f.dtype in NUMERIC_DTYPES]


_RECOMPUTE = ("recompute it: ds.meta.stats with stats='selection' (the default) and db.stats(sql) compute statistics "
              "from the data, and lerobot's compute_stats rewrites the file; or re-download it")


def from_json(text: str | bytes, where: str, layout: Layout) -> dict[str, dict[str, np.ndarray]]:
    """``meta/stats.json`` (its text) as lerobot loads it (``cast_stats_to_numpy``: every value through
    ``np.array``), checked against info.json's features.

    Each statistic of a numeric feature must hold one number per element of the feature's shape (``(6,)`` for a
    6-vector, ``(1,)`` for a scalar), a camera's one per channel (``(3, 1, 1)``), ``count`` one. A statistic of
    another size is refused, not warned of: no normalization is right with it (a 2-value mean of a 6-vector either
    broadcasts against the wrong elements or fails mid-training). Entries of features info.json does not declare,
    or without numbers (``string``), are kept unchecked (``ds.meta.stats`` leaves out what the items do not carry).

    Raises:
        DatasetFormatError: naming ``where`` (and the feature and statistic): not valid JSON (with line and column)
            or nested too deeply to parse, not ``{feature: {stat: number or nested list}}``, a statistic that is not
            numbers, or whose number of values does not fit the feature's shape; each with the fix (recompute the
            statistics).
    """
    raw = load_json(text, where, _RECOMPUTE)
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise DatasetFormatError(f"{where}: not a JSON object of {{feature: {{stat: values}}}}; {_RECOMPUTE}")
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, st in raw.items():
        out[key] = {}
        for stat, v in st.items():
            try:
                arr = np.array(v)
            except (TypeError, ValueError) as e:
                raise DatasetFormatError(f"{where}: {key!r} {stat!r} is not a number or a regular nested list "
                                         f"({e}); {_RECOMPUTE}") from e
            if arr.dtype.kind not in "biuf":
                raise DatasetFormatError(f"{where}: {key!r} {stat!r} is {v!r:.60}, not numbers; {_RECOMPUTE}")
            sizes = _stat_sizes(layout, key, stat)
            if sizes is not None and arr.size not in sizes:
                want = " or ".join(str(n) for n in sorted(sizes))
                raise DatasetFormatError(
                    f"{where}: {key!r} {stat!r} has {arr.size} value(s) (shape {list(arr.shape)}) but the feature's "
                    f"shape {list(layout.features[key].shape)} in meta/info.json needs {want}; the statistics are "
                    f"of another feature layout (an edited info.json, or stats.json of another dataset): {_RECOMPUTE}")
            out[key][stat] = arr
    return out


def _stat_sizes(layout: Layout, key: str, stat: str) -> set[int] | None:
    """How many values statistic ``stat`` of feature ``key`` may hold (None: not checked)."""
    f = layout.features.get(key)
    if f is None or not f.shape or not all(isinstance(x, (int, np.integer)) for x in f.shape):
        return None
    if stat == "count":
        return {1}
    if f.dtype in ("video", "image"):
        # one per channel: lerobot's (H, W, C), or (C, H, W) as some writers declare it
        if len(f.shape) != 3:
            return None
        return {int(c) for c in (f.shape[-1], f.shape[0]) if c in (1, 3, 4)} or {int(f.shape[-1])}
    if f.dtype in NUMERIC_DTYPES:
        return {int(np.prod(f.shape))}
    return None


def selection_stats(con: "duckdb.DuckDBPyConnection", layout: Layout, manifest: pa.Table, *,
                    quantiles: bool = True) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of the samples of ``manifest`` (see the module docstring for what is exact).

    Args:
        con: a DuckDB connection with the dataset's ``frames`` and ``episode_stats`` views (the Database's).
        layout: the dataset's layout (features, dtypes, shapes).
        manifest: one row per sample (``index``, ``episode_index``: int64), as ``db.manifest(sql)`` returns it.
        quantiles: add q01, q10, q50, q90, q99 (set False for a source whose statistics have none).

    Returns:
        ``{feature: {stat: np.ndarray}}``, features in info.json order.

    Raises:
        DatasetFormatError: a selected index has no row in the data files (the manifest is of another dataset or
            the data changed since), naming how many are missing.
    """
    if manifest.num_rows == 0:
        raise ValueError("the selection is empty: statistics of no samples are undefined; check the query")
    name = f"_lsql_stats_{uuid.uuid4().hex}"
    sel = pa.table({"index": manifest.column("index").cast(pa.int64()),
                    "episode_index": manifest.column("episode_index").cast(pa.int64())})
    con.register(name, sel)
    try:
        out: dict[str, dict[str, np.ndarray]] = {}
        numeric = numeric_features(layout)
        found = con.sql(f"SELECT count(*) FROM {ident(name)} s JOIN frames f ON f.index = s.index").fetchall()[0][0]
        if found != manifest.num_rows:
            raise DatasetFormatError(
                f"{manifest.num_rows - found} of {manifest.num_rows} selected samples have no row in the data files "
                "(frames.index): the manifest describes another dataset or the data changed since it was made; "
                "build the selection again from this Database")
        per_camera = _camera_stats(con, layout, name, layout.camera_keys)  # video and image features
        for key in layout.features:
            if key in numeric:
                out[key] = _numeric_stats(con, layout, name, key, quantiles)
            elif key in per_camera:
                out[key] = per_camera[key]
        return out
    finally:
        con.unregister(name)


def _numeric_stats(con, layout: Layout, sel: str, key: str, quantiles: bool) -> dict[str, np.ndarray]:
    """One numeric feature over the selected samples: one DuckDB pass, per element of a vector."""
    feat = layout.features[key]
    col = f"f.{ident(key)}"
    qs = f", quantile_cont(v, [{', '.join(map(str, QUANTILES))}])" if quantiles else ""
    # A vector is unnested with its element number (two UNNESTs in one SELECT zip), so one GROUP BY gives every
    # element's statistics however long the vector is; a scalar is element 1.
    is_list = con.sql(f"SELECT {col} FROM frames f LIMIT 0").types[0].id in ("list", "array")
    src = (f"SELECT UNNEST(CAST({col} AS DOUBLE[])) AS v, UNNEST(range(1, len({col}) + 1)) AS i "
           f"FROM {ident(sel)} s JOIN frames f ON f.index = s.index") if is_list else \
        f"SELECT CAST({col} AS DOUBLE) AS v, 1 AS i FROM {ident(sel)} s JOIN frames f ON f.index = s.index"
    rows = con.sql(f"SELECT i, min(v), max(v), avg(v), stddev_pop(v), count(v), count(*){qs} FROM ({src}) "
                   "GROUP BY i ORDER BY i").fetchall()
    if any(r[5] != r[6] for r in rows):
        raise DatasetFormatError(f"feature {key!r}: NULL values among the selected samples (column {key!r} of "
                                 "the data files); statistics over them would be wrong. Select rows without NULLs")
    n = rows[0][6] if rows else 0
    shape = tuple(feat.shape) if int(np.prod(feat.shape or (1,))) == len(rows) else (len(rows),)
    integer = feat.dtype.startswith(("int", "uint")) or feat.dtype == "bool"
    ext = np.int64 if integer else np.float64
    st = {"min": np.array([r[1] for r in rows], ext), "max": np.array([r[2] for r in rows], ext),
          "mean": np.array([r[3] for r in rows], np.float64), "std": np.array([r[4] for r in rows], np.float64)}
    st = {k: v.reshape(shape) for k, v in st.items()}
    st["count"] = np.array([n], np.int64)
    if quantiles:
        for j, q in enumerate(QUANTILES):
            st[qkey(q)] = np.array([r[7][j] for r in rows], np.float64).reshape(shape)
    return st


def _camera_stats(con, layout: Layout, sel: str, cams: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Cameras aggregated from the per-episode statistics of every episode the selection touches."""
    if not cams:
        return {}
    rows = con.sql(
        f"SELECT e.feature, e.episode_index, e.stat, e.value FROM episode_stats e "
        f"WHERE e.feature IN ({', '.join(literal(c) for c in cams)}) "
        f"AND e.episode_index IN (SELECT DISTINCT episode_index FROM {ident(sel)}) "
        "ORDER BY e.feature, e.episode_index, e.stat").fetchall()
    per: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for feature, ep, stat, value in rows:
        per.setdefault(feature, {}).setdefault(int(ep), {})[stat] = np.asarray(value, np.float64)
    out = {}
    for key in cams:
        eps = per.get(key)
        if not eps:
            continue
        channels = layout.features[key].shape[-1] if layout.features[key].shape else 3
        stats = []
        for ep, s in eps.items():
            missing = {"min", "max", "mean", "std", "count"} - set(s)
            if missing:
                raise DatasetFormatError(f"meta/episodes: episode {ep} has no {sorted(missing)} statistics for "
                                         f"camera {key!r}; statistics of a selection need them (re-run lerobot's "
                                         "stats computation, or use stats='dataset')")
            stats.append({k: (v.astype(np.int64) if k == "count" else v.reshape(channels, 1, 1))
                          for k, v in s.items()})
        out[key] = aggregate(stats)
    return out


def aggregate(stats: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """lerobot 0.4.4's ``aggregate_feature_stats``: global min/max, count-weighted mean, pooled std (population),
    count-weighted quantiles (keys present in every input); ``count`` the total."""
    means = np.stack([s["mean"] for s in stats]).astype(np.float64)
    var = np.stack([np.asarray(s["std"], np.float64) ** 2 for s in stats])
    counts = np.stack([np.asarray(s["count"]) for s in stats]).astype(np.float64)
    total = counts.sum(0)
    while counts.ndim < means.ndim:
        counts = counts[..., None]
    mean = (means * counts).sum(0) / total
    out = {"min": np.min(np.stack([s["min"] for s in stats]), 0), "max": np.max(np.stack([s["max"] for s in stats]), 0),
           "mean": mean, "std": np.sqrt(((var + (means - mean) ** 2) * counts).sum(0) / total),
           "count": total.astype(np.int64)}
    for q in (k for k in stats[0] if k.startswith("q") and k[1:].isdigit()):
        if all(q in s for s in stats):
            out[q] = (np.stack([s[q] for s in stats]) * counts).sum(0) / total
    return out
