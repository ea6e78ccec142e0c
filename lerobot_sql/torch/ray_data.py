"""Past one machine: a manifest read by Ray Data (or Daft, Spark) and decoded into the same items as ``db.dataset()``.

The planning happens once, where DuckDB runs: ``db.export_manifest(sql, "m.parquet")`` writes one row per sample
(columns and metadata in :mod:`lerobot_sql._plan.manifest`, the dataset root among them). The cluster engine reads
that Parquet file with its own reader, splits it into blocks however it likes, and calls :class:`Decoder` (or
:func:`decode_batch`) on each block of rows. The decoder builds a :class:`~lerobot_sql.torch.dataset.LeRobotSQLDataset`
over exactly those rows, the same class ``db.dataset()`` returns, so each item equals ``db.dataset(path)[i]`` for
the same row. No DuckDB runs in the workers.

    import ray, lerobot_sql as lsql
    from lerobot_sql.torch.ray_data import Decoder

    db.export_manifest("SELECT episode_index FROM episodes WHERE length > 200", "m.parquet")
    ds = ray.data.read_parquet("m.parquet").map_batches(
        Decoder, fn_constructor_kwargs={"manifest": "m.parquet", "delta_timestamps": {"action": [0, 1/30]}},
        batch_format="pyarrow", batch_size=64, concurrency=4)
    for batch in ds.iter_torch_batches(batch_size=32): ...

The workers need the dataset root readable under the same path or URL (a shared filesystem, or an fsspec URL such
as ``hf://datasets/...`` or ``s3://...``; pass ``root=`` to override) and write their caches under
``$LSQL_CACHE_DIR`` (default ``~/.cache/lerobot_sql``) on their own node. See docs/cluster.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyarrow as pa

from .._format.files import open_files
from .._plan import manifest as plan_manifest  # `manifest` is the path argument here
from .._storage.source import local_identity


def manifest_schema(path: str | os.PathLike, *, filesystem=None) -> pa.Schema:
    """The Arrow schema of a manifest written by ``db.export_manifest`` (with its ``lerobot_sql.manifest`` metadata).

    Raises:
        ValueError: the file has no ``lerobot_sql.manifest`` metadata (not written by export_manifest).
    """
    return plan_manifest.read_schema(path, filesystem=filesystem)


def manifest_root(path: str | os.PathLike, *, filesystem=None) -> str:
    """The dataset root (path or URL) stored in a manifest file by ``db.export_manifest``."""
    return plan_manifest.file_root(path, filesystem=filesystem)


def _as_table(batch: Any) -> pa.Table:
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if isinstance(batch, dict):
        return pa.table({k: pa.array(list(v)) if isinstance(v, np.ndarray) and v.dtype == object else v
                         for k, v in batch.items()})
    import pandas as pd

    if isinstance(batch, pd.DataFrame):
        return pa.Table.from_pandas(batch, preserve_index=False)
    raise TypeError(f"expected a pyarrow Table/RecordBatch, a pandas DataFrame or a dict of numpy arrays, "
                    f"got {type(batch).__name__}")


def stack_items(items: list[dict]) -> dict[str, np.ndarray]:
    """Items (dicts of tensors / str / numbers) as one column per key: ``(B, *item shape)`` arrays of the items'
    dtypes; text and other Python values as object arrays. Ray turns these into tensor and string columns."""
    if not items:
        return {}
    out: dict[str, np.ndarray] = {}
    for key in items[0]:
        vals = [it[key] for it in items]
        if hasattr(vals[0], "numpy"):
            out[key] = np.stack([v.numpy() for v in vals])
        else:
            arr = np.empty(len(vals), dtype=object)
            arr[:] = vals
            out[key] = arr
    return out


class Decoder:
    """A callable for ``ray.data.Dataset.map_batches``: manifest rows in, the same rows' items out (column-wise).

    Ray constructs it once per worker (pass the class and ``fn_constructor_kwargs``), so the dataset's layout,
    tasks and caches are opened once per worker, not per batch.

    Args:
        manifest: path of the Parquet manifest (``db.export_manifest``): gives the dataset root, the manifest
            schema and the query's extra columns. Optional when ``root`` is given and batches keep the schema
            metadata.
        root: the dataset root, overriding the one stored in the manifest (e.g. the same data at another mount).
        storage_options, cache_dir: as :func:`lerobot_sql.connect`.
        **dataset_kwargs: as ``db.dataset()``: ``delta_timestamps``, ``tolerance_s``, ``return_uint8``,
            ``image_transforms``, ``cameras``, ...

    Call: ``decoder(batch)`` with a pyarrow Table, pandas DataFrame or dict of numpy arrays holding manifest rows
    (any subset, any order); returns ``{key: array}`` with one entry per item key, row ``j`` being the item of batch
    row ``j`` (see :func:`stack_items`). :meth:`items` returns the item dicts themselves.

    Raises:
        ValueError: neither a manifest file nor a root; the manifest file lacks lerobot_sql metadata.
        ResultContractError / DatasetFormatError / FrameNotFoundError / MissingFileError: as ``db.dataset()``.
    """

    def __init__(self, manifest: str | os.PathLike | None = None, *, root: str | os.PathLike | None = None,
                 storage_options: dict | None = None, cache_dir: str | os.PathLike | None = None,
                 **dataset_kwargs: Any):
        self._schema = manifest_schema(manifest) if manifest is not None else None
        if root is None:
            if manifest is None:
                raise ValueError("Decoder needs the manifest file (manifest=) or the dataset root (root=)")
            root = manifest_root(manifest)
        # Files only: no DuckDB connection is made in the worker. The tasks are read here, once per worker.
        self._files = open_files(root, storage_options=storage_options, cache_dir=cache_dir)
        self._files.tasks()
        self._kwargs = dataset_kwargs

    def _manifest(self, batch: Any) -> pa.Table:
        t = _as_table(batch)
        if self._schema is not None:
            # Engines may drop schema metadata or widen types (pandas): restore the manifest's exact schema, which
            # also carries the query's extra columns, so items are built as db.dataset(path) builds them.
            missing = [n for n in self._schema.names if n not in t.column_names]
            if missing:
                raise ValueError(f"the batch lacks manifest columns {missing}; read every column of the manifest")
            t = t.select(self._schema.names).cast(self._schema)
        return t

    def items(self, batch: Any) -> list[dict]:
        """The items of the batch's rows, in row order (dicts as ``LeRobotSQLDataset.__getitem__`` returns)."""
        from .dataset import LeRobotSQLDataset

        m = self._manifest(batch)
        if m.num_rows == 0:
            return []
        ds = LeRobotSQLDataset(self._files, m, **self._kwargs)
        return [ds[i] for i in range(len(ds))]

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        return stack_items(self.items(batch))


# (manifest, root, options) -> (the manifest file's identity when its Decoder was made, the Decoder)
_DECODERS: dict[str, tuple[Any, Decoder]] = {}


def _file_identity(manifest: str | os.PathLike | None) -> str | None:
    """A local manifest file's identity (:func:`lerobot_sql._storage.source.local_identity`: size, mtime, inode,
    ctime); None for none, or a URL (not checked)."""
    if manifest is None or "://" in str(manifest):
        return None
    try:
        return local_identity(os.stat(manifest))
    except OSError:
        return None


def decode_batch(batch: Any, *, manifest: str | os.PathLike | None = None, root: str | os.PathLike | None = None,
                 **kwargs: Any) -> dict[str, np.ndarray]:
    """Function form of :class:`Decoder` for ``map_batches(decode_batch, fn_kwargs={...})``, for Daft UDFs or
    Spark's ``mapInArrow``: one Decoder per process and argument set, reused across batches while a local manifest
    file is unchanged (size, mtime, inode, ctime); a manifest at a URL is read once per process.

    Arguments and result as :class:`Decoder`; ``delta_timestamps`` and the other dataset options go in ``kwargs``.
    """
    key = json.dumps([str(manifest), str(root), repr(sorted(kwargs.items()))])
    ident = _file_identity(manifest)
    got = _DECODERS.get(key)
    # a manifest file rewritten at the same path (export_manifest(..., overwrite=True), maybe of another dataset) is
    # read again: the Decoder made for the old file would read the new rows through the old dataset's files
    if got is None or got[0] != ident:
        got = _DECODERS[key] = (ident, Decoder(manifest, root=root, **kwargs))
    return got[1](batch)
