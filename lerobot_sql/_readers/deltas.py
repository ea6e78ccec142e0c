"""Index math without I/O: delta_timestamps validation, and the clamp of a window to its episode with ``_is_pad``.

Mirrors lerobot 0.4.4 (``check_delta_timestamps``, ``get_delta_indices``, ``_get_query_indices``) so that items match.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import did_you_mean

MAX_OFFSET_FRAMES = 2**31 - 1  # a delta_timestamps offset beyond this many frames is a mistake (years of recording)


def delta_indices(delta_timestamps: dict[str, list[float]] | None, fps: float, tolerance_s: float,
                  features: dict) -> dict[str, np.ndarray]:
    """Frame offsets ``round(d * fps)`` for every key of ``delta_timestamps``.

    Args:
        delta_timestamps: feature key -> offsets in seconds (negative = past).
        fps: dataset frame rate.
        tolerance_s: how far an offset may sit from a multiple of 1/fps.
        features: the dataset's feature names (keys must be among them).

    Returns:
        key -> int64 array of frame offsets, same order as given.

    Raises:
        TypeError: ``delta_timestamps`` is not a mapping (a bare list of offsets).
        ValueError: a key is not a feature, a list is empty, an offset is not a number (a string such as "0.1", a
            bool), NaN, infinite or beyond 2**31 frames, or an offset is not a multiple of 1/fps within tolerance_s
            (the offenders are listed, with the key).
    """
    if delta_timestamps is None:
        return {}
    if not isinstance(delta_timestamps, Mapping):  # a bare list of offsets raised AttributeError on .items()
        raise TypeError(f"delta_timestamps must be a dict {{feature key: [seconds]}}, e.g. "
                        f"{{'action': [i / 30 for i in range(10)]}}; got {type(delta_timestamps).__name__} "
                        f"{delta_timestamps!r:.80}")
    out = {}
    for key, deltas in delta_timestamps.items():
        if key not in features:
            raise ValueError(f"delta_timestamps key {key!r} is not a feature of this dataset."
                             f"{did_you_mean(str(key), features)} Valid keys: {sorted(features)}")
        try:
            if isinstance(deltas, (str, bytes)):  # list("0.1") would be its characters
                raise TypeError
            values = list(deltas)
            # numpy reads "0.1" as 0.1 and True as 1.0: a quoted or boolean offset is a mistake, not a number
            wrong = [v for v in values if v is None or isinstance(v, (bool, np.bool_, str, bytes))]
            d = None if wrong else np.asarray(values, np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"delta_timestamps[{key!r}] must be a list of offsets in seconds, e.g. "
                             f"[-1 / {fps:g}, 0.0]; got {deltas!r}") from None
        if wrong:
            raise ValueError(f"delta_timestamps[{key!r}] holds {wrong[0]!r} ({type(wrong[0]).__name__}), not a "
                             f"number of seconds; give numbers, e.g. [-1 / {fps:g}, 0.0]")
        if d.ndim != 1 or len(d) == 0:
            raise ValueError(f"delta_timestamps[{key!r}] must be a non-empty list of seconds")
        # NaN passes the grid test below (every comparison with NaN is False) and NaN, inf or 1e30 seconds cast to
        # int64 frames as -2**63: refuse them rather than pad silently.
        bad = d[~np.isfinite(d)]
        if len(bad):
            raise ValueError(f"delta_timestamps[{key!r}] holds offsets that are not finite numbers: {bad.tolist()}; "
                             f"give seconds such as [-1 / {fps:g}, 0.0]")
        bad = d[np.abs(d) * fps > MAX_OFFSET_FRAMES]
        if len(bad):
            raise ValueError(f"delta_timestamps[{key!r}] has offsets beyond +-{MAX_OFFSET_FRAMES / fps:.4g} s "
                             f"(2**31 frames at fps={fps:g}): {bad.tolist()}; no episode is that long, so every "
                             "such frame would be padding")
        off = np.abs(d * fps - np.round(d * fps)) / fps
        bad = d[off > tolerance_s]
        if len(bad):
            raise ValueError(
                f"delta_timestamps[{key!r}] has offsets that are not multiples of 1/fps={1 / fps:.6f}s within "
                f"tolerance_s={tolerance_s}: {bad.tolist()}; use values like [i / {fps:g} for i in ...]"
            )
        out[key] = np.round(d * fps).astype(np.int64)
    return out


def query_indices(index, offsets, ep_from, ep_to, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The one clamp-and-pad rule (lerobot's ``_get_query_indices``): absolute frame indices for ``index + offsets``
    clamped to the episode ``[ep_from, ep_to)``, and the pad mask. Arrays broadcast (a batch: ``index[:, None]``
    with ``offsets[None, :]``).

    ``stride`` > 1: the episode served at 1/``stride`` of its rate (:mod:`lerobot_sql._readers.regrid`; ``offsets``
    are then whole multiples of it): its frames are ``ep_from``, ``ep_from + stride``, ..., so the clamp's upper end
    is its last such frame, not ``ep_to - 1``.

    Returns:
        (indices int64, is_pad bool), of the broadcast shape; padded positions repeat the episode's first or last
        frame.
    """
    target = index + offsets
    # the episode's last frame (at another rate: its last frame on the grid)
    last = ep_to - 1 if stride == 1 else ep_from + (ep_to - 1 - ep_from) // stride * stride
    is_pad = (target < ep_from) | (target > last)
    # minimum(maximum()), not np.clip: the same values, at a third of clip's cost on the per-item path's few offsets
    return np.minimum(np.maximum(target, ep_from), last), is_pad
