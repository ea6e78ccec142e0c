"""Split a manifest between ranks, machines and DataLoader workers: disjoint, covering, the same on every process.

A manifest (see :mod:`lerobot_sql._plan.manifest`) is a plain Arrow table, so a rank that holds it (or reads it from the
Parquet file ``db.export_manifest`` wrote) can compute its own part with no communication: the partition depends
only on the manifest, ``world_size``, ``seed`` and ``epoch``. Each rank then builds a dataset over its part alone,
so it caches and reads only its own row groups and video regions.

``by="episode"`` keeps all rows of an episode on one rank (each rank opens only its episodes' file regions; shard
sizes differ by at most about one episode); ``by="sample"`` deals rows one by one (sizes differ by at most one).
Rows keep their manifest order inside a part (reads stay local); shuffle within a part with the DataLoader or
:mod:`lerobot_sql.torch.samplers`.

For map-style training on one machine, :class:`lerobot_sql.torch.samplers.EpisodeShardedSampler` shards the indices of
one dataset instead and pads every rank to the same length; this module is for the cases where each process should
only ever see its own part (many machines, Ray/Daft/Spark tasks, iterable pipelines).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import torch

from .._plan.manifest import read_manifest_file
from .._plan.partition import assign, check_part


def shard_manifest(manifest: pa.Table, rank: int, world_size: int, *, epoch: int = 0, seed: int = 0,
                   by: str = "episode", shuffle: bool = True) -> pa.Table:
    """The rows of ``manifest`` that belong to ``rank`` of ``world_size`` (see :func:`lerobot_sql._plan.partition.assign` for the rule).

    The ``world_size`` parts are disjoint and together hold every row exactly once, for any (seed, epoch); every
    process computes the same parts from the same manifest. Rows keep their manifest order and the schema metadata
    (query extras) is kept, so ``db.dataset(part)`` and :func:`lerobot_sql.torch.ray_data.decode_batch` accept the
    result.

    Args:
        manifest: from ``db.manifest(sql)`` or ``pyarrow.parquet.read_table(db.export_manifest(...).path)``.
        rank, world_size: this process's part, e.g. ``torch.distributed.get_rank()`` / ``get_world_size()``; or
            :func:`worker_shard` for rank x DataLoader worker.
        epoch, seed: a new partition per epoch (``by="episode"``) or per epoch and seed.
        by: ``"episode"`` (whole episodes per rank) or ``"sample"`` (single rows).
        shuffle: False gives contiguous parts in manifest order (the same every epoch).

    Raises:
        ValueError: ``rank`` not in ``[0, world_size)``, unknown ``by``, or fewer episodes than ranks.
    """
    check_part(rank, world_size, by)
    owner = assign(manifest, world_size, epoch=epoch, seed=seed, by=by, shuffle=shuffle)
    return manifest.take(pa.array(np.flatnonzero(owner == rank)))


def shard_sizes(manifest: pa.Table, world_size: int, **kwargs: Any) -> np.ndarray:
    """Rows per rank, int64 (world_size,), computed locally (same arguments as :func:`shard_manifest`).

    With ``by="episode"`` parts differ in size; DistributedDataParallel needs the same number of steps on every rank,
    so run ``sizes.min() // batch_size`` steps per epoch (every rank computes the same number, no all_reduce needed).
    """
    return np.bincount(assign(manifest, world_size, **kwargs), minlength=world_size).astype(np.int64)


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` of the calling process: the given values, else ``torch.distributed``'s when it is
    initialised, else ``$RANK`` / ``$WORLD_SIZE`` (torchrun sets them before the process group exists), else 0 / 1.
    The one rule for the samplers, :func:`worker_shard` and :class:`ShardedManifestDataset`.

    Raises:
        ValueError: ``rank`` not in ``[0, world_size)``.
    """
    if rank is None or world_size is None:
        dist = torch.distributed
        ready = dist.is_available() and dist.is_initialized()
        if rank is None:
            rank = dist.get_rank() if ready else int(os.environ.get("RANK", 0))
        if world_size is None:
            world_size = dist.get_world_size() if ready else int(os.environ.get("WORLD_SIZE", 1))
    if not 0 <= int(rank) < int(world_size):
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    return int(rank), int(world_size)


def worker_shard(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(shard, num_shards)`` of the calling process: distributed rank x DataLoader worker.

    ``rank``/``world_size`` default to ``torch.distributed``'s when it is initialised, else ``$RANK``/``$WORLD_SIZE``
    (torchrun sets them), else 0/1. Inside a DataLoader worker, shard = ``rank * num_workers + worker_id`` and
    num_shards = ``world_size * num_workers``; elsewhere (the main process) ``(rank, world_size)``.
    """
    rank, world_size = rank_and_world(rank, world_size)
    info = torch.utils.data.get_worker_info()
    if info is None:
        return int(rank), int(world_size)
    return int(rank) * info.num_workers + info.id, int(world_size) * info.num_workers


class ShardedManifestDataset(torch.utils.data.IterableDataset):
    """An iterable dataset that yields, in each process and DataLoader worker, the items of its own manifest part.

    Build it in the main process from a dataset's files (``db.files``, or the ``db`` itself) and a manifest. Each rank takes its part of the
    manifest (:func:`shard_manifest` with ``rank``/``world_size``: the same whatever ``num_workers`` is, as with
    ``DistributedSampler``); each DataLoader worker of the rank then takes its share of that part (whole episodes with
    ``by="episode"``). A worker left without rows (fewer episodes than workers) yields nothing, so every sample of the
    manifest appears exactly once per epoch across ranks x workers. Workers build no DuckDB connection; items are
    exactly ``db.dataset(manifest, **dataset_kwargs)``'s items for the same rows.

    Call :meth:`set_epoch` before each epoch. The epoch is kept in shared memory (a shared torch tensor), so workers
    kept alive by ``persistent_workers=True`` (fork or spawn) read the new value when their next epoch starts.

    Args:
        files: the dataset's :class:`~lerobot_sql._format.files.DatasetFiles` (``db.files``), or a
            :class:`lerobot_sql.Database` (its ``files`` are taken; no DuckDB reaches the workers).
        manifest: the whole selection (every rank passes the same one).
        by, seed, shuffle: as :func:`shard_manifest`.
        rank, world_size: this process's rank; default from ``torch.distributed`` (or ``$RANK``/``$WORLD_SIZE``),
            read when the object is built, so workers started with ``spawn`` see the rank too.
        **dataset_kwargs: passed to LeRobotSQLDataset (``delta_timestamps``, ``cameras``, ...).

    Raises:
        ValueError: bad ``by``/``rank``/``world_size``, or ``by="episode"`` with fewer episodes than ranks (raised
            here, before any worker starts).
    """

    def __init__(self, files, manifest: pa.Table, *, by: str = "episode", seed: int = 0, shuffle: bool = True,
                 rank: int | None = None, world_size: int | None = None, **dataset_kwargs: Any):
        check_part(0, 1, by)
        where = "the manifest given to ShardedManifestDataset"
        if isinstance(manifest, os.PathLike):  # a manifest file, as everywhere a Path is one
            where = str(manifest)
            manifest = read_manifest_file(manifest, "db.export_manifest(sql, path)")
        if hasattr(files, "_given_manifest") and manifest.num_rows:
            # given the Database: checked as db.dataset(table) checks it, its source and then every row (a table whose
            # metadata was lost is judged by its rows); with only the files, LeRobotSQLDataset checks which dataset
            # the manifest was built from, not its rows
            manifest = files._given_manifest(manifest, where, cameras=dataset_kwargs.get("cameras"),
                                             tolerance_s=dataset_kwargs.get("tolerance_s"),
                                             align=dataset_kwargs.get("align", "timestamp"))
        files = getattr(files, "files", files)  # a Database holds its DatasetFiles as .files
        self.manifest, self.by, self.seed, self.shuffle = manifest, by, int(seed), shuffle
        # Resolved here, in the rank's main process: spawned DataLoader workers do not inherit torch.distributed.
        # Only the rank is wanted, not the worker-expanded shard: the rank's part must not depend on num_workers.
        rank, world_size = rank_and_world(rank, world_size)
        self.rank, self.world_size = int(rank), int(world_size)
        check_part(self.rank, self.world_size, by)
        # Fewer episodes than ranks: fail here, in the main process, not later inside a DataLoader worker.
        assign(manifest, self.world_size, by=by, shuffle=shuffle)
        # One int64 in shared memory: set_epoch in the main process is seen by workers that outlive an epoch
        # (persistent_workers=True); a plain attribute is copied into each worker once, when it starts.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self.dataset_kwargs = dataset_kwargs
        from .dataset import LeRobotSQLDataset

        # Prepared once here, before any fork: workers only pick their rows and read items (pyarrow/PyAV set-up
        # inside freshly forked workers crashed under load).
        self._dataset = LeRobotSQLDataset(files, manifest, **dataset_kwargs)

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch.fill_(int(value))

    def set_epoch(self, epoch: int) -> None:
        """Use the partition of ``epoch`` from the next ``iter()`` on, in this process and in its DataLoader workers
        (persistent ones too)."""
        self.epoch = int(epoch)

    def _part_rows(self) -> list[int]:
        """Manifest positions of this rank's rows (in a DataLoader worker: this worker's share of them) for the
        current epoch, in manifest order."""
        epoch = self.epoch
        # Built per iter() (cheap: an arange and two column references), not kept: a spawned worker would be sent
        # another copy of the manifest's columns.
        rows = pa.table({"_row": np.arange(self.manifest.num_rows, dtype=np.int64),
                         "episode_index": self.manifest["episode_index"], "index": self.manifest["index"]})
        part = shard_manifest(rows, self.rank, self.world_size, epoch=epoch, seed=self.seed, by=self.by,
                              shuffle=self.shuffle)
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            owner = assign(part, info.num_workers, epoch=epoch, seed=self.seed, by=self.by, shuffle=self.shuffle,
                           allow_empty=True)
            part = part.take(pa.array(np.flatnonzero(owner == info.id)))
        return part["_row"].to_pylist()

    def part(self) -> pa.Table:
        """This process's (or worker's) rows for the current epoch."""
        return self.manifest.take(self._part_rows())

    def __iter__(self) -> Iterator[dict]:
        ds = self._dataset
        return (ds[i] for i in self._part_rows())
