"""The statistics columns of an export's meta/episodes, between Arrow and numpy: a data column read as numbers for
lerobot's per-episode statistics, and a statistic written back as the nested Python value of its column's Arrow type.

The statistics themselves (lerobot's ``compute_stats`` and ``aggregate_stats`` ports, the quantile keys) are
:mod:`lerobot_sql._format.stats_json`'s, shared with ``db.stats``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


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
