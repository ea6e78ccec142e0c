"""Ports of lerobot 0.4.4's per-episode statistics (``compute_stats``), and its aggregation (``aggregate_stats``).

Export recomputes the stats of every output episode that is not a whole source episode, and of the columns it
renumbers; these functions give the numbers lerobot would write for the same frames (min, max, mean, std, count and
the histogram quantiles q01..q99), as numpy arrays, and turn them into the nested Python values of
meta/episodes' Arrow types. The aggregation (``aggregate``, lerobot's ``aggregate_feature_stats``) is the one of
:mod:`lerobot_sql.stats`, which ``db.stats`` uses too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

# One copy of the quantiles, their keys and the aggregation, shared with db.stats (lerobot_sql/stats.py).
from ..stats import QUANTILES, aggregate, qkey


def numeric(column: pa.ChunkedArray) -> np.ndarray:
    """(N, *shape) float64 of a numeric or (fixed-size) list column."""
    arr = column.combine_chunks()
    depth = []
    while pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type) or pa.types.is_large_list(arr.type):
        depth.append(len(arr))
        arr = arr.flatten()
    flat = arr.to_numpy(zero_copy_only=False).astype(np.float64)
    if not depth:
        return flat
    return flat.reshape(depth[0], -1)


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
            qs[:, d] = _hist_quantiles(np.histogram(x[:, d], bins=edges)[0], edges, n)
        st.update({qkey(q): qs[qi] for qi, q in enumerate(QUANTILES)})
    shape = tuple(shape) if int(np.prod(shape)) == x.shape[1] else (x.shape[1],)
    out = {k: v.reshape(shape) for k, v in st.items()}
    out["count"] = np.array([n], np.int64)
    return out


def _hist_quantiles(hist: np.ndarray, edges: np.ndarray, n: int) -> np.ndarray:
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
            qs = _hist_quantiles(np.bincount(b, weights=cnt[nz], minlength=5000), edges, int(n))
        for qi, q in enumerate(QUANTILES):
            st[qkey(q)][ch] = qs[qi]
    out = {k: (x / 255.0).reshape(c, 1, 1) for k, x in st.items()}
    out["count"] = np.array([len(imgs)], np.int64)
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
            qs[:, d] = _hist_quantiles(np.histogram(x[:, d], bins=edges)[0], edges, len(x))
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
        d = np.exp(codes.astype(np.float64) * ((b - a) / 4095) + a) - shift
    else:
        d = codes.astype(np.float64) * ((hi - lo) / 4095) + lo
    d = np.clip(d, lo, hi)
    return d if unit == "m" else np.clip(np.rint(d * 1000.0), 0, 65535)


def to_py(value: np.ndarray, typ: pa.DataType) -> Any:
    """A numpy stat as the nested Python value of Arrow type ``typ`` (list<double>, list<list<list<double>>> ...)."""
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        v = np.asarray(value)
        if v.ndim == 0:
            v = v.reshape(1)
        return [to_py(x, typ.value_type) for x in v]
    v = np.asarray(value).reshape(-1)[0] if np.ndim(value) else value
    if pa.types.is_integer(typ):
        return int(v)
    if pa.types.is_boolean(typ):
        return bool(v)
    return float(v)

