"""Samplers that keep reads local in the video files, shuffle deterministically, resume, and shard.

Random frames cost a seek and a keyframe decode each; consecutive frames of one episode cost one decoded frame each.
``EpisodeAwareSampler`` cuts the samples into *blocks* (runs of consecutive frames of one episode, ``block_size``
long), shuffles the blocks per (seed, epoch) and yields each block in frame order. A DataLoader hands batch ``k``
to worker ``k % num_workers`` and a batch is a contiguous slice of the sampler's order, so each worker reads whole
blocks forward and its decoders rarely seek. Batches mix ``batch_size / block_size`` episodes.

``EpisodeShardedSampler`` gives each distributed rank a fixed set of whole episodes (so each rank opens only its
own files or file regions, which matters most when streaming from remote storage) and shuffles blocks within it.

Both work with any sized map-style dataset whose samples are described by ``episode_index`` and ``index``
(a :class:`~lerobot_sql.dataset.LeRobotSQLDataset`, its ``manifest``, or arrays).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import torch

from ._plan.partition import largest_first
from .shard import rank_and_world


def _columns(source) -> tuple[np.ndarray, np.ndarray]:
    """(episode_index, index) int64 arrays, one per sample, from a dataset, manifest or (episodes, index) pair."""
    m = getattr(source, "manifest", source)
    if isinstance(m, pa.Table):
        return (m["episode_index"].to_numpy().astype(np.int64, copy=False),
                m["index"].to_numpy().astype(np.int64, copy=False))
    if isinstance(m, tuple) and len(m) == 2:
        ep, idx = (np.asarray(x, np.int64) for x in m)
        if ep.shape != idx.shape or ep.ndim != 1:
            raise ValueError("(episode_index, index) must be two 1-D arrays of the same length")
        return ep, idx
    raise TypeError(f"expected a LeRobotSQLDataset, a manifest (pyarrow.Table) or (episode_index, index) arrays, "
                    f"got {type(source).__name__}")


def blocks(episode_index: np.ndarray, index: np.ndarray, block_size: int) -> np.ndarray:
    """Block boundaries over the samples: int64 (n_blocks + 1,) positions; block ``b`` is ``[s[b], s[b+1])``.

    A block is at most ``block_size`` samples, all of one episode with consecutive ``index`` values (so a decoder
    moves forward one frame per sample inside it).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = len(index)
    if n == 0:
        return np.zeros(1, np.int64)
    brk = np.flatnonzero((np.diff(episode_index) != 0) | (np.diff(index) != 1)) + 1
    runs = np.concatenate([[0], brk, [n]])
    starts = [np.arange(a, b, block_size) for a, b in zip(runs[:-1], runs[1:])]
    return np.concatenate(starts + [np.array([n])]).astype(np.int64)


def _dist(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    # shard.rank_and_world: the same rule as the sharded dataset (torchrun's $RANK/$WORLD_SIZE before the process
    # group exists, so ranks never silently all take every sample)
    r, w = rank_and_world(rank, num_replicas)
    return w, r


class _Resumable(torch.utils.data.Sampler):
    """Epoch and start position handling shared by the samplers."""

    seed: int
    epoch: int = 0
    start: int = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use the order of ``epoch``, skipping its first ``start`` samples (for resuming mid-epoch: pass the number
        of samples this rank already consumed, e.g. ``steps * batch_size``; the DataLoader's prefetching means the
        sampler itself runs ahead of what was trained on)."""
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        self.epoch, self.start = int(epoch), int(start)

    def state_dict(self, consumed: int = 0) -> dict:
        """What to save in a checkpoint: seed, epoch and the position to resume from.

        Args:
            consumed: samples of this epoch trained on since iteration (re)started, e.g. ``steps * batch_size``.
                The sampler cannot count them itself: a DataLoader prefetches, so the sampler runs ahead of
                training, and counting what it yielded would skip the prefetched samples on resume.
        """
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        return {"seed": self.seed, "epoch": self.epoch, "start": self.start + int(consumed)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this sampler has seed {self.seed}")
        self.set_epoch(state["epoch"], state.get("start", 0))

    def _order(self) -> np.ndarray:
        raise NotImplementedError

    def order(self) -> np.ndarray:
        """The positions ``iter(self)`` yields now, as one int64 array (``ds.pipeline`` reads it in each worker)."""
        return self._order()[self.start:]

    def __iter__(self) -> Iterator[int]:
        return iter(self.order().tolist())

    def __len__(self) -> int:
        return max(0, self._length() - self.start)

    def _length(self) -> int:
        raise NotImplementedError


class EpisodeAwareSampler(_Resumable):
    """Shuffled blocks of consecutive frames; optionally one shard of them per distributed rank.

    Args:
        source: a LeRobotSQLDataset, its manifest, or ``(episode_index, index)`` arrays (one entry per sample).
        block_size: samples per block (frames read forward in a row); 1 gives a plain random permutation.
        shuffle: shuffle blocks (and nothing else) per (seed, epoch); False yields the samples in order.
        seed: base seed; the order of epoch ``e`` depends only on (seed, e).
        num_replicas, rank: distributed sharding (default: from ``torch.distributed`` when initialised, else 1, 0).
            Every rank gets the same number of samples: the shuffled order is padded by repeating its start (or cut,
            with ``drop_last``) to a multiple of ``num_replicas`` and split into contiguous parts, so blocks stay
            whole except where a part boundary falls.
        drop_last: cut instead of pad when sharding.

    Yields:
        sample positions (ints in ``[0, len(dataset))``).
    """

    def __init__(self, source, *, block_size: int = 8, shuffle: bool = True, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None, drop_last: bool = False):
        ep, idx = _columns(source)
        self.bounds = blocks(ep, idx, block_size)
        self.n = len(idx)
        self.block_size, self.shuffle, self.seed, self.drop_last = block_size, shuffle, int(seed), drop_last
        self.num_replicas, self.rank = _dist(num_replicas, rank)

    def _global(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n, dtype=np.int64)
        rng = np.random.default_rng([self.seed, self.epoch])
        perm = rng.permutation(len(self.bounds) - 1)
        sizes = np.diff(self.bounds)[perm]
        # positions: for each block in shuffled order, its start + 0..size-1 (vectorised)
        starts = np.repeat(self.bounds[:-1][perm], sizes)
        within = np.arange(self.n) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return starts + within

    def _per_rank(self) -> int:
        r = self.num_replicas
        return self.n // r if self.drop_last else -(-self.n // r)

    def _order(self) -> np.ndarray:
        g = self._global()
        per, r = self._per_rank(), self.num_replicas
        if per * r > len(g):
            g = np.concatenate([g, np.resize(g, per * r - len(g))])
        return g[self.rank * per:(self.rank + 1) * per]

    def _length(self) -> int:
        return self._per_rank()


class EpisodeShardedSampler(_Resumable):
    """Whole episodes per distributed rank (fixed across epochs), blocks shuffled within the rank per epoch.

    Episodes are dealt to ranks in a seed-determined order, each to the rank with the fewest samples so far, so
    shards are balanced to within one episode. Every rank yields the same number of samples (the largest shard's
    count, shorter shards repeating their own start; or the smallest, with ``drop_last``), as DistributedDataParallel
    needs.

    Args: as :class:`EpisodeAwareSampler`.
    """

    def __init__(self, source, *, block_size: int = 8, shuffle: bool = True, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None, drop_last: bool = False):
        ep, idx = _columns(source)
        self.num_replicas, self.rank = _dist(num_replicas, rank)
        self.block_size, self.shuffle, self.seed, self.drop_last = block_size, shuffle, int(seed), drop_last
        episodes, first, counts = np.unique(ep, return_index=True, return_counts=True)
        owner = largest_first(counts, self.num_replicas, self.seed)  # largest first, ties in seeded order
        load = np.bincount(owner, weights=counts, minlength=self.num_replicas).astype(np.int64)
        if (load == 0).any():
            raise ValueError(f"{len(episodes)} episode(s) cannot fill {self.num_replicas} ranks with whole episodes; "
                             "use EpisodeAwareSampler (it splits blocks across ranks) or fewer ranks")
        self.shard_sizes = load
        mine = np.isin(ep, episodes[owner == self.rank])
        self.positions = np.flatnonzero(mine).astype(np.int64)
        self.episodes = episodes[owner == self.rank]
        self._inner = EpisodeAwareSampler((ep[mine], idx[mine]), block_size=block_size, shuffle=shuffle,
                                          seed=seed, num_replicas=1, rank=0)

    def _length(self) -> int:
        return int(self.shard_sizes.min() if self.drop_last else self.shard_sizes.max())

    def _order(self) -> np.ndarray:
        self._inner.set_epoch(self.epoch)
        local = self.positions[self._inner._order()]
        need = self._length()
        if len(local) == 0:
            return local
        return local[:need] if len(local) >= need else np.resize(local, need)
