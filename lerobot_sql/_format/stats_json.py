"""lerobot's statistics as numbers: the ``meta/stats.json`` form, the aggregation of per-episode statistics, and
the per-episode computation (``compute_stats``) ported from lerobot, so that our numbers are lerobot's.

The one home of these rules: ``db.stats`` and ``ds.meta.stats`` (:mod:`lerobot_sql.stats`, the statistics of a
selection) and export (:mod:`lerobot_sql.export`, which rewrites meta/episodes' statistics and stats.json) read them
here. ``{feature: {stat: np.ndarray}}`` throughout; ``count`` is int64 ``(1,)``, cameras ``(C, 1, 1)``. Pure numpy:
no DuckDB, no decoding.
"""

from __future__ import annotations

import numpy as np

from ..errors import DatasetFormatError
from . import depth
from .info import NUMERIC_DTYPES
from .jsontext import load_json
from .layout import Layout

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # lerobot >= 0.4 writes q01, q10, q50, q90, q99

def qkey(q: float) -> str:
    """``0.01`` -> ``"q01"``: lerobot's name of a quantile statistic."""
    return f"q{round(q * 100):02d}"


def numeric_features(layout: Layout) -> list[str]:
    """Features whose statistics come from the data files (numeric dtypes), in info.json order."""
    return [k for k, f in layout.features.items() if f.dtype in NUMERIC_DTYPES]


RECOMPUTE = ("recompute it: ds.meta.stats with stats='selection' (the default) and db.stats(sql) compute statistics "
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
    raw = load_json(text, where, RECOMPUTE)
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise DatasetFormatError(f"{where}: not a JSON object of {{feature: {{stat: values}}}}; {RECOMPUTE}")
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, st in raw.items():
        out[key] = {}
        for stat, v in st.items():
            try:
                arr = np.array(v)
            except (TypeError, ValueError) as e:
                raise DatasetFormatError(f"{where}: {key!r} {stat!r} is not a number or a regular nested list "
                                         f"({e}); {RECOMPUTE}") from e
            if arr.dtype.kind not in "biuf":
                raise DatasetFormatError(f"{where}: {key!r} {stat!r} is {v!r:.60}, not numbers; {RECOMPUTE}")
            sizes = stat_sizes(layout, key, stat)
            if sizes is not None and arr.size not in sizes:
                want = " or ".join(str(n) for n in sorted(sizes))
                raise DatasetFormatError(
                    f"{where}: {key!r} {stat!r} has {arr.size} value(s) (shape {list(arr.shape)}) but the feature's "
                    f"shape {list(layout.features[key].shape)} in meta/info.json needs {want}; the statistics are "
                    f"of another feature layout (an edited info.json, or stats.json of another dataset): {RECOMPUTE}")
            out[key][stat] = arr
    return out


def stat_sizes(layout: Layout, key: str, stat: str) -> set[int] | None:
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


# ---- lerobot's per-episode statistics (compute_stats.py) ---------------------------------------------------------
def sample_indices(n: int) -> np.ndarray:
    """lerobot's compute_stats.sample_indices: evenly spaced frames used for image stats."""
    k = n if n < 100 else max(100, min(int(n ** 0.75), 10_000))
    return np.round(np.linspace(0, n - 1, k)).astype(int)


def downsample(img: np.ndarray, target: int = 150, threshold: int = 300) -> np.ndarray:
    """lerobot's auto_downsample_height_width for a CHW image."""
    _, h, w = img.shape
    if max(w, h) < threshold:
        return img
    f = int(w / target) if w > h else int(h / target)
    return img[:, ::f, ::f]


def hist_quantiles(hist: np.ndarray, edges: np.ndarray, n: int) -> np.ndarray:
    """lerobot's RunningQuantileStats._compute_single_quantile for each of QUANTILES."""
    cum = np.cumsum(hist)
    out = np.empty(len(QUANTILES))
    for qi, q in enumerate(QUANTILES):
        target = q * n
        i = int(np.searchsorted(cum, target))
        if i == 0:
            out[qi] = edges[0]
        elif i >= len(cum):
            out[qi] = edges[-1]
        else:
            before, inbin = cum[i - 1], cum[i] - cum[i - 1]
            out[qi] = edges[i] if inbin == 0 else edges[i] + (target - before) / inbin * (edges[i + 1] - edges[i])
    return out


def image_stats(imgs: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats of (N, C, H, W) uint8 images, scaled to [0, 1], shaped (C, 1, 1), count = N images.

    Same numbers as lerobot's get_feature_stats over axis (0, 2, 3), computed from 256-value pixel counts (the
    histogram of uint8 data is exact from its value counts) instead of sorting millions of pixels.
    """
    c = imgs.shape[1]
    v = np.arange(256, dtype=np.float64)
    st = {k: np.empty(c) for k in ("min", "max", "mean", "std", *map(qkey, QUANTILES))}
    for ch in range(c):
        cnt = np.bincount(imgs[:, ch].ravel(), minlength=256).astype(np.float64)
        n = cnt.sum()
        nz = np.flatnonzero(cnt)
        mn, mx = v[nz[0]], v[nz[-1]]
        mean = (v * cnt).sum() / n
        st["min"][ch], st["max"][ch], st["mean"][ch] = mn, mx, mean
        st["std"][ch] = np.sqrt(max(0.0, (v * v * cnt).sum() / n - mean ** 2))
        if n < 2:
            qs = np.full(len(QUANTILES), mean)
        else:
            edges = np.linspace(mn - 1e-10, mx + 1e-10, 5001)
            b = np.clip(np.searchsorted(edges, v[nz], side="right") - 1, 0, 4999)
            qs = hist_quantiles(np.bincount(b, weights=cnt[nz], minlength=5000), edges, int(n))
        for qi, q in enumerate(QUANTILES):
            st[qkey(q)][ch] = qs[qi]
    out = {k: (x / 255.0).reshape(c, 1, 1) for k, x in st.items()}
    out["count"] = np.array([len(imgs)], np.int64)
    return out


def feature_stats(x: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """lerobot's get_feature_stats for (N, D) data: min, max, mean, std, count, histogram quantiles q01..q99."""
    n = len(x)
    mn, mx, mean = x.min(0), x.max(0), x.mean(0)
    if n < 2:
        st = {"min": mn, "max": mx, "mean": mean, "std": x.std(0)}
        st.update({qkey(q): mean.copy() for q in QUANTILES})
    else:
        st = {"min": mn, "max": mx, "mean": mean, "std": np.sqrt(np.maximum(0, (x ** 2).mean(0) - mean ** 2))}
        qs = np.empty((len(QUANTILES), x.shape[1]))
        for d in range(x.shape[1]):
            edges = np.linspace(mn[d] - 1e-10, mx[d] + 1e-10, 5001)
            qs[:, d] = hist_quantiles(np.histogram(x[:, d], bins=edges)[0], edges, n)
        st.update({qkey(q): qs[qi] for qi, q in enumerate(QUANTILES)})
    shape = tuple(shape) if int(np.prod(shape)) == x.shape[1] else (x.shape[1],)
    out = {k: v.reshape(shape) for k, v in st.items()}
    out["count"] = np.array([n], np.int64)
    return out


def depth_stats(imgs: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats of (N, C, H, W) depth frames in their own unit (lerobot 0.6 does not divide depth by 255),
    shaped (C, 1, 1), count = N frames: lerobot 0.6.1's get_feature_stats over axis (0, 2, 3), every pixel a
    sample, computed as its RunningQuantileStats does for one batch: in float32 at least (uint16 promoted), so
    min, max, mean and std are its numbers; the histogram quantiles q01..q99 are its algorithm on float32 bin
    edges."""
    n, c = imgs.shape[:2]
    x = imgs.transpose(0, 2, 3, 1).reshape(-1, c)
    x = x.astype(np.result_type(x.dtype, np.float32), copy=False)
    if len(x) < 2:
        st = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
        st.update({qkey(q): st["mean"].copy() for q in QUANTILES})
    else:
        mn, mx, mean = x.min(0), x.max(0), np.mean(x, axis=0)
        st = {"min": mn, "max": mx, "mean": mean, "std": np.sqrt(np.maximum(0, np.mean(x ** 2, axis=0) - mean ** 2))}
        qs = np.empty((len(QUANTILES), c))
        eps = x.dtype.type(1e-10)
        for d in range(c):
            edges = np.linspace(mn[d] - eps, mx[d] + eps, 5001, dtype=x.dtype)
            qs[:, d] = hist_quantiles(np.histogram(x[:, d], bins=edges)[0], edges, len(x))
        st.update({qkey(q): qs[qi] for qi, q in enumerate(QUANTILES)})
    out = {k: np.asarray(v, np.float64).reshape(c, 1, 1) for k, v in st.items()}
    out["count"] = np.array([n], np.int64)
    return out


def dequantize_depth(codes: np.ndarray, q: dict, unit: str) -> np.ndarray:
    """12-bit depth codes back to depth in ``unit`` ("mm": whole mm, "m"), float64, lerobot 0.6's formula
    (``dequantize_depth``); for export statistics only: the dataset's items use lerobot's own float32 torch ops."""
    lo, hi, shift = float(q["depth_min"]), float(q["depth_max"]), float(q["shift"])
    if q["use_log"]:
        a, b = np.log(lo + shift), np.log(hi + shift)
        d = np.exp(codes.astype(np.float64) * ((b - a) / depth.QMAX) + a) - shift
    else:
        d = codes.astype(np.float64) * ((hi - lo) / depth.QMAX) + lo
    d = np.clip(d, lo, hi)
    return d if unit == "m" else np.clip(np.rint(d * depth.MM_PER_METRE), 0, depth.MM_MAX)
