"""Deal a manifest's episodes or samples to ranks: the rules of ``shard`` and ``samplers``, computed locally.

Both deal whole episodes by one greedy rule (:func:`fewest_first`: each episode to the rank with the fewest rows
so far), so parts differ by at most one episode; they differ in the order they deal: :func:`assign` (``shard``)
takes the episodes in a (seed, epoch)-shuffled order, a new partition each epoch; :func:`largest_first`
(``samplers.EpisodeShardedSampler``) takes them largest first, the same ranks every epoch. numpy only: every
process computes the same parts from the same manifest, with no communication.
"""

from __future__ import annotations

import heapq

import numpy as np
import pyarrow as pa

BY = ("episode", "sample")


def check_part(rank: int, world_size: int, by: str) -> None:
    """Raise ValueError, naming the value, for ``world_size < 1``, ``rank`` outside ``[0, world_size)`` or ``by``
    not in :data:`BY`."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if by not in BY:
        raise ValueError(f"by must be one of {BY}, got {by!r}")


def fewest_first(sizes: np.ndarray, world_size: int) -> np.ndarray:
    """The rank of each item, dealt in the given order: each to the rank with the fewest rows so far (ties: the
    lowest rank). int64, one per item of ``sizes`` (the items' row counts).

    Greedy list scheduling: part sizes differ by at most the largest item, and with at least ``world_size`` items
    every rank gets one. The one dealing rule of :func:`assign` and of ``samplers.EpisodeShardedSampler``; they differ
    only in the order they deal the episodes in.
    """
    heap = [(0, r) for r in range(world_size)]
    out = np.empty(len(sizes), np.int64)
    for j, c in enumerate(np.asarray(sizes).tolist()):
        load, r = heapq.heappop(heap)
        out[j] = r
        heapq.heappush(heap, (load + c, r))
    return out


def largest_first(sizes: np.ndarray, world_size: int, seed: int) -> np.ndarray:
    """The rank of each episode (int64, one per item of ``sizes``, the episodes' sample counts), fixed for a
    ``seed``: :func:`fewest_first` over the episodes taken largest first, ties in the order of
    ``numpy.random.default_rng([seed, 2**31])``. (``EpisodeShardedSampler``'s rule: the same ranks every epoch.)
    """
    sizes = np.asarray(sizes)
    order = np.random.default_rng([int(seed), 2**31]).permutation(len(sizes))
    order = order[np.argsort(-sizes[order], kind="stable")]
    owner = np.empty(len(sizes), np.int64)
    owner[order] = fewest_first(sizes[order], world_size)
    return owner


def assign(manifest: pa.Table, world_size: int, *, epoch: int = 0, seed: int = 0, by: str = "episode",
           shuffle: bool = True, allow_empty: bool = False) -> np.ndarray:
    """The rank of every manifest row: int64 (num_rows,), values in ``[0, world_size)``.

    ``by="episode"``: the distinct ``episode_index`` values are taken in a (seed, epoch)-shuffled order and each goes
    to the rank with the fewest rows so far (:func:`fewest_first`), so part sizes differ by at most the longest
    episode's rows; ``shuffle=False`` cuts the episodes, in manifest order, into contiguous runs of about equal rows.
    ``by="sample"``: rows are shuffled and dealt round-robin (``shuffle=False``: contiguous equal blocks). The random
    generator is ``numpy.random.default_rng([seed, epoch])``.

    ``allow_empty=True`` accepts fewer episodes than parts (the extra parts get no rows): DataLoader workers of one
    rank, where an idle worker is harmless, unlike an idle rank in DistributedDataParallel.

    Raises:
        ValueError: bad ``world_size``/``by``; ``by="episode"`` with fewer episodes than ranks (a rank would be empty)
            unless ``allow_empty``; no ``episode_index`` column.
    """
    check_part(0, world_size, by)
    n = manifest.num_rows
    rng = np.random.default_rng([int(seed), int(epoch)])
    if by == "sample":
        if not shuffle:
            return (np.arange(n, dtype=np.int64) * world_size) // max(n, 1)
        owner = np.empty(n, np.int64)
        owner[rng.permutation(n)] = np.arange(n, dtype=np.int64) % world_size
        return owner
    if "episode_index" not in manifest.column_names:
        raise ValueError(f"by='episode' needs an episode_index column; the manifest has {manifest.column_names}")
    ep = manifest["episode_index"].to_numpy()
    # Work on runs of equal episode_index (a manifest is mostly whole episodes in a row): sorting runs instead of
    # rows keeps this O(rows) for tens of millions of frames.
    starts = np.concatenate([[0], np.flatnonzero(ep[1:] != ep[:-1]) + 1]) if n else np.zeros(0, np.int64)
    run_len = np.diff(np.append(starts, n))
    uniq, first, inverse = np.unique(ep[starts], return_index=True, return_inverse=True)
    counts = np.bincount(inverse.ravel(), weights=run_len, minlength=len(uniq)).astype(np.int64)
    if len(uniq) < world_size and not allow_empty:
        raise ValueError(f"{len(uniq)} episode(s) cannot give each of {world_size} ranks whole episodes; "
                         "use by='sample' or fewer ranks")
    order = np.argsort(first, kind="stable")
    if shuffle:
        # Seeded order, each episode to the rank with the fewest rows so far (ties: lowest rank). Greedy list
        # scheduling keeps max - min <= the longest episode and gives every rank an episode.
        order = order[rng.permutation(len(order))]
        run = fewest_first(counts[order], world_size)
    else:
        # Contiguous runs of about n / world_size rows in manifest order; an episode goes to the run holding its
        # middle row (sizes then differ by at most two episodes).
        c = counts[order]
        mid = np.cumsum(c) - c / 2.0
        run = np.minimum((mid * world_size / n).astype(np.int64), world_size - 1)
        if len(np.unique(run)) < world_size:  # a few huge episodes: one per rank in turn
            run = np.arange(len(order), dtype=np.int64) % world_size
    owner_of_episode = np.empty(len(uniq), np.int64)
    owner_of_episode[order] = run
    return np.repeat(owner_of_episode[inverse.ravel()], run_len)
