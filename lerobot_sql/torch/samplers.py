"""Samplers that keep reads local in the video files, shuffle deterministically, resume, and shard.

Random frames cost a seek and a keyframe decode each; consecutive frames of one episode cost one decoded frame each.
``EpisodeAwareSampler`` cuts the samples into *blocks* (runs of consecutive frames of one episode, ``block_size``
long), shuffles the blocks per (seed, epoch) and yields each block in frame order. A DataLoader hands batch ``k``
to worker ``k % num_workers`` and a batch is a contiguous slice of the sampler's order, so each worker reads whole
blocks forward and its decoders rarely seek. Batches mix ``batch_size / block_size`` episodes.

``EpisodeShardedSampler`` gives each distributed rank a fixed set of whole episodes (so each rank opens only its
own files or file regions, which matters most when streaming from remote storage) and shuffles blocks within it.

``MixtureSampler`` draws several datasets of a collection (``coll.dataset(sql)``) in given proportions (weights,
or ``n_i ** alpha``): exact per-epoch quotas, each dataset's blocks shuffled (a small dataset with a large weight
repeats, reshuffled), the blocks of all datasets interleaved at random, one global order sliced per rank.

``WeightedSampler`` draws samples in proportion to per-sample weights, a column of the selection (a score per
episode or window reaches each of its samples): exact per-epoch counts by randomized systematic sampling, blocks cut
where the weight changes; ``MixtureSampler(sample_weights=...)`` draws each dataset's quota by them.

One module, past the ~400 lines of the house rule: the four samplers share the resumable base, the blocks and the
weighted draw, and each is a short class over them.

All work with any sized map-style dataset whose samples are described by ``episode_index`` and ``index``
(a :class:`~lerobot_sql.torch.dataset.LeRobotSQLDataset`, a :class:`~lerobot_sql.torch.mixture.CollectionDataset`, their
``manifest``, or arrays); over a collection an episode is ``(dataset, episode_index)``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import torch

from .._plan.partition import largest_first
from ..errors import as_int, warn
from .shard import rank_and_world


def _columns(source) -> tuple[np.ndarray, np.ndarray]:
    """(episode_index, index) int64 arrays, one per sample, from a dataset, manifest or (episodes, index) pair."""
    m = getattr(source, "manifest", source)
    if isinstance(m, pa.Table):
        ep = m["episode_index"].to_numpy().astype(np.int64, copy=False)
        idx = m["index"].to_numpy().astype(np.int64, copy=False)
        if "dataset" in m.column_names:
            # A collection: identity is (dataset, episode_index) / (dataset, index); each dataset numbers its own
            # from 0, so the dataset's position goes into the high bits (episode and frame numbers stay < 2**40).
            code = _groups(m)[1] << np.int64(40)
            ep, idx = ep + code, idx + code
        return ep, idx
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


def _expand(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Runs ``(starts, sizes)`` as the positions they cover, in order (int64)."""
    n = int(sizes.sum())
    return np.repeat(starts, sizes) + (np.arange(n) - np.repeat(np.cumsum(sizes) - sizes, sizes))


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
    _done: bool = False  # a pass over the order ran to its end: the next one starts at 0 (see __iter__)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use the order of ``epoch``, skipping its first ``start`` samples (for resuming mid-epoch: pass the number
        of samples this rank already consumed, e.g. ``steps * batch_size``; the DataLoader's prefetching means the
        sampler itself runs ahead of what was trained on). ``start`` applies to the next pass only: a pass that
        runs to its end makes the one after it whole again (a training loop that cycles the DataLoader without
        calling ``set_epoch`` would otherwise drop the first ``start`` samples of every later pass).

        Raises:
            ValueError: ``start`` is negative or beyond this rank's samples of the epoch.
        """
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        if start > self._length():
            raise ValueError(f"start {start} is beyond the {self._length()} samples of an epoch of this sampler "
                             "(this rank); a state saved for another dataset, ranks or block_size?")
        self.epoch, self.start, self._done = int(epoch), int(start), False

    def _fingerprint(self) -> dict:
        """What decides the order besides (seed, epoch): a resume under other values would not continue it."""
        # checked in this order: the most specific cause first ("samples" per rank follows from the others too)
        return {"sampler": type(self).__name__,
                **{k: getattr(self, k) for k in ("num_replicas", "block_size", "shuffle", "drop_last")
                   if hasattr(self, k)}, "samples": int(self._length())}

    def state_dict(self, consumed: int = 0) -> dict:
        """What to save in a checkpoint: seed, epoch and the position to resume from.

        Args:
            consumed: samples of this epoch trained on since iteration (re)started, e.g. ``steps * batch_size``.
                The sampler cannot count them itself: a DataLoader prefetches, so the sampler runs ahead of
                training, and counting what it yielded would skip the prefetched samples on resume.

        Raises:
            TypeError: ``consumed`` is not an integer (1.5 would resume at 1; a bool is refused too).
            ValueError: ``consumed`` is negative or past the end of this rank's epoch.
        """
        n = as_int(consumed)  # ints, numpy ints, 0-d int tensors
        if n is None:
            raise TypeError(f"consumed must be an integer number of samples (e.g. steps * batch_size), got "
                            f"{type(consumed).__name__} {consumed!r:.80}")
        consumed = n
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        start = self.start + int(consumed)
        if start > self._length():
            raise ValueError(f"consumed {consumed} (from position {self.start}) is beyond the {self._length()} "
                             "samples of this epoch for this rank: count only this epoch's samples (steps of this "
                             "epoch x batch_size)")
        return {"seed": self.seed, "epoch": self.epoch, "start": start, **self._fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict` (``epoch``, ``start``, ``seed``).

        Raises:
            ValueError: ``state`` has no ``epoch`` (not a state_dict of this package's samplers), or was saved
                with another seed.
        """
        if not isinstance(state, dict) or "epoch" not in state:
            has = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a sampler state_dict (it needs 'epoch'; got {has}): pass what "
                             "sampler.state_dict() returned")
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this sampler has seed {self.seed}")
        for key, mine in self._fingerprint().items():  # states saved before these keys existed carry none
            if key in state and state[key] != mine:
                raise ValueError(f"state was saved with {key} {state[key]!r}, this sampler has {mine!r}: its order "
                                 "is not the saved one; build the sampler as the saved run did (same dataset, "
                                 "block_size, shuffle, ranks, drop_last)")
        self.set_epoch(state["epoch"], state.get("start", 0))

    def _order(self) -> np.ndarray:
        raise NotImplementedError

    def order(self) -> np.ndarray:
        """The positions ``iter(self)`` yields now, as one int64 array (``ds.pipeline`` reads it in each worker)."""
        return self._order()[self.start:]

    def __iter__(self) -> Iterator[int]:
        if self._done:  # the resumed (or any) pass ran to its end: this one is the whole epoch again
            self.start, self._done = 0, False
        return self._run(self.order().tolist())

    def _run(self, order: list[int]) -> Iterator[int]:
        yield from order
        self._done = True

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
        return _expand(self.bounds[:-1][perm], np.diff(self.bounds)[perm])  # each block in shuffled order

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


def _groups(source) -> tuple[list[str], np.ndarray]:
    """(names, codes): the datasets of a source and each sample's position in ``names`` (int64 (N,)).

    A :class:`~lerobot_sql.torch.mixture.CollectionDataset` gives its ``names`` / ``dataset_index``; a collection
    manifest its ``lerobot_sql.collection`` names (else the ``dataset`` column's dictionary, else its values in
    order of first appearance); anything else is one dataset, named by its ``repo_id`` (or ``"dataset"``).
    """
    if hasattr(source, "dataset_index") and hasattr(source, "names"):
        return list(source.names), np.asarray(source.dataset_index, np.int64)
    m = getattr(source, "manifest", source)
    if isinstance(m, pa.Table) and "dataset" in m.column_names:
        import pyarrow.compute as pc

        from .._plan.manifest import COLLECTION_KEY, collection_meta, dataset_codes

        col = m["dataset"].combine_chunks()
        if COLLECTION_KEY in (m.schema.metadata or {}):
            names = list(collection_meta(m)["names"])
        elif pa.types.is_dictionary(col.type):
            names = col.dictionary.to_pylist()
        else:
            names = pc.unique(col).to_pylist()
        return names, dataset_codes(m, names).astype(np.int64)
    n = len(_columns(source)[1])
    return [str(getattr(source, "repo_id", None) or "dataset")], np.zeros(n, np.int64)


def _quotas(p: np.ndarray, total: int) -> np.ndarray:
    """int64 quotas summing to ``total``, each within 1 of ``p * total`` (largest remainder; ties to the lower
    position, so the result is deterministic)."""
    raw = p * total
    q = np.floor(raw).astype(np.int64)
    rest = total - int(q.sum())
    if rest > 0:
        frac = raw - q
        q[np.argsort(-frac, kind="stable")[:rest]] += 1
    return q


def _result_columns(m: pa.Table) -> list[str]:
    """The columns of a manifest that came from the query's result besides the contract's (its extras)."""
    from .._plan.manifest import CORE, LOCATION

    return [c for c in m.column_names if c not in (*CORE, *LOCATION, "dataset") and "/" not in c]


def _where(source, i: int) -> str:
    """Sample ``i`` of ``source`` in a user's terms: its episode (and dataset) and the result row it came from."""
    m = getattr(source, "manifest", source)
    if not isinstance(m, pa.Table):
        return f"episode_index {int(_columns(source)[0][i])}"
    out = f"episode {m['episode_index'][i].as_py()}"
    if "dataset" in m.column_names:
        out += f" of {m['dataset'][i].as_py()}"
    if "result_row" in m.column_names:
        out += f", result row {m['result_row'][i].as_py()}"
    return out


def _sample_weights(source, weights) -> np.ndarray:
    """Per-sample weights, float64 (N,), from a column of the source's manifest (``weights`` a str: a column the
    query returned, e.g. ``q.score AS weight``, which the manifest carries on every sample of its row's episode or
    window) or given as an array of N numbers; checked.

    Raises:
        KeyError: no such column (naming the result's columns).
        TypeError: a column name for a source without a manifest; a column that is not numbers (a bool column too:
            cast it, so that a flag is not taken for a weight by mistake).
        ValueError: an array of another length; a weight NULL, NaN, infinite or negative (naming the column, the
            first such sample's episode and result row, and how many); every weight 0.
    """
    from ..errors import did_you_mean

    n = len(_columns(source)[1])
    m = getattr(source, "manifest", source)
    if isinstance(weights, str):
        if not isinstance(m, pa.Table):
            raise TypeError(f"weights={weights!r} names a column, and (episode_index, index) arrays have none: pass "
                            "the weights as an array of one number per sample, or pass the dataset or its manifest")
        if weights not in m.column_names:
            raise KeyError(f"weights: no column {weights!r} in the selection's result (its columns besides the "
                           f"contract's: {_result_columns(m) or 'none'}); return it from the query, e.g. SELECT "
                           f"episode_index, length / 100.0 AS {weights} FROM episodes, or pass one number per "
                           "sample."
                           f"{did_you_mean(weights, m.column_names)}")
        col = m[weights]
        t = col.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
            raise TypeError(f"weights column {weights!r} holds {t}, not numbers: return a number per row (e.g. "
                            f"CAST({weights} AS DOUBLE), which makes a flag 0 or 1)")
        import pyarrow.compute as pc

        null = col.is_null().to_numpy(zero_copy_only=False) if col.null_count else np.zeros(n, bool)
        w = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        what = f"weights column {weights!r}"
    else:
        try:
            w = np.asarray(weights, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"weights must be a column name or an array of numbers, got {type(weights).__name__}") \
                from None
        if w.shape != (n,):
            raise ValueError(f"weights: {w.shape} for {n} samples: give one number per sample")
        null, what = np.zeros(n, bool), "weights"
    bad = null | ~np.isfinite(w) | (w < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        # a NULL number reaches the manifest as NaN (the result contract's rule for items)
        value = "NULL" if null[i] else "NULL or NaN" if np.isnan(w[i]) else f"{float(w[i])!r}"
        raise ValueError(f"{what}: {value} at sample {i} ({_where(source, i)}); {int(bad.sum())} of {n} samples "
                         "have a NULL, NaN, infinite or negative weight: weights must be finite and >= 0 (0 leaves a "
                         "sample out; COALESCE(x, 0) in the query turns NULLs into 0)")
    if not (w > 0).any():
        raise ValueError(f"{what}: every weight of the {n} samples is 0: nothing to draw")
    return w


def _units(ep: np.ndarray, idx: np.ndarray, w: np.ndarray, block_size: int):
    """The weighted draw's units: blocks (as :func:`blocks`) also cut where the weight changes, so each holds
    samples of one weight; ``(starts, sizes, weight)`` of those with weight > 0."""
    key = np.concatenate([[0], np.cumsum((np.diff(ep) != 0) | (np.diff(w) != 0))]).astype(np.int64)
    b = blocks(key, idx, block_size)
    starts, sizes = b[:-1], np.diff(b)
    uw = w[starts] if len(starts) else np.zeros(0)
    keep = uw > 0
    return starts[keep], sizes[keep], uw[keep]


def _draw_runs(starts: np.ndarray, sizes: np.ndarray, weight: np.ndarray, episode: np.ndarray, dataset: np.ndarray,
               total: int, rng):
    """``total`` draws over the units (``starts``, ``sizes``, each sample of a unit weighing ``weight``; the unit's
    ``episode`` and ``dataset`` codes), each sample's expected draws ``total * weight / sum(weights of all samples)``,
    as runs read forward: ``(starts, sizes)`` int64, in random order, sizes summing to ``total``.

    Randomized systematic sampling: the units lie end to end on a line, dataset by dataset, each dataset's episodes in
    a random order and each episode's units in a random order, each unit an interval of ``total`` * its share of the
    weight (size x weight); ``total`` points one apart from a uniform offset are the draws. Any stretch of the line
    holds floor or ceil of its length in points, so each unit, each episode and each dataset gets floor or ceil of its
    expected draws, and exactly them on average. A unit of ``s`` samples with ``c`` draws gives each sample ``c // s``
    of them (whole passes, each one run read forward) and ``c % s`` samples one more: a window of consecutive samples
    from a uniform random start, wrapping round (one or two runs), so each sample gets floor or ceil of ``c / s``,
    exactly ``c / s`` on average.
    """
    _, ep_code = np.unique(episode, return_inverse=True)
    ep_rank = rng.permutation(int(ep_code.max()) + 1 if len(ep_code) else 0)[ep_code]
    perm = np.lexsort((rng.random(len(starts)), ep_rank, dataset))  # the last key sorts first
    st, sz, wt = starts[perm], sizes[perm], weight[perm]
    mass = sz * (wt / wt.max())  # scaled first: weights near the float64 maximum would sum to inf
    cum = np.cumsum(mass) * (total / mass.sum())
    cum[-1] = total  # the last edge exactly: rounding must not add or lose a draw
    u = rng.random()
    count = np.diff(np.concatenate([[0], np.clip(np.ceil(cum - u), 0, total).astype(np.int64)]))
    whole, rest = count // sz, count % sz
    phase = np.minimum((rng.random(len(st)) * sz).astype(np.int64), sz - 1)
    part = rest > 0
    wraps = part & (phase + rest > sz)
    run_st = np.concatenate([np.repeat(st, whole), st[part] + phase[part], st[wraps]])
    run_sz = np.concatenate([np.repeat(sz, whole), np.minimum(rest, sz - phase)[part], (phase + rest - sz)[wraps]])
    o = rng.permutation(len(run_st))
    return run_st[o], run_sz[o]


def _digest(w: np.ndarray) -> str:
    """A short fingerprint of per-sample weights (what a resume checks: other weights give another order)."""
    import hashlib

    return "sha256:" + hashlib.sha256(np.ascontiguousarray(w, np.float64).tobytes()).hexdigest()[:16]


class WeightedSampler(_Resumable):
    """Samples drawn in proportion to per-sample weights (a column of the selection, e.g. a quality score per
    episode); exact per-epoch counts, blocks of consecutive frames, deterministic per (seed, epoch), resumable,
    sharded.

    A query's extra column reaches every sample of its row (the episode's frames, or the window's), so a score per
    episode is a weight per sample::

        ds = db.dataset("WITH q(episode_index, score) AS (VALUES (0, 0.9), (1, 0.2), (2, 1.0)) "
                        "SELECT e.episode_index, q.score AS weight FROM episodes e JOIN q USING (episode_index)")
        sampler = WeightedSampler(ds, "weight")   # sample i drawn T * w_i / sum(w) times per epoch on average
        sampler = WeightedSampler(ds, [scores[e] for e in ds.manifest["episode_index"].to_pylist()])  # from Python

    How an epoch is drawn (``T = num_replicas * ceil(num_samples / num_replicas)`` draws over all ranks):

    1. **Units.** The samples are cut into blocks as :class:`EpisodeAwareSampler` cuts them (at most ``block_size``
       consecutive frames of one episode, so decoders read forward) and also where the weight changes, so the
       samples of a unit share one weight. Units of weight 0 are never drawn.
    2. **Counts: exact per-epoch quotas** (randomized systematic sampling). The units lie end to end on a line
       (dataset by dataset; each dataset's episodes in a random order per (seed, epoch), each episode's units in a
       random order), each an interval of length ``T *`` (its samples' weights) ``/`` (all weights); ``T`` points
       one apart from a uniform random offset are the draws. Every unit, every episode and every dataset gets the
       floor or the ceiling of its expected draws, and exactly them on average. With ``block_size=1`` (units of one sample)
       each sample is drawn the floor or ceiling of ``T * w_i / sum(w)`` times; with blocks, a unit drawn ``c``
       times gives each of its ``s`` samples ``c // s`` draws and a window of ``c % s`` consecutive ones (from a
       random start, wrapping round) one more, so each sample is drawn fewer than 2 away from ``T * w_i /
       sum(w)``, and exactly that on average.
    3. **Order.** A unit's draws are read forward in frame order (one run, more when it is drawn more often than it
       has samples); all runs are shuffled per (seed, epoch), and rank ``r`` takes the ``r``-th of
       ``num_replicas`` equal contiguous slices of that one order.

    Why quotas and not i.i.d. draws with replacement (``torch.utils.data.WeightedRandomSampler``): an epoch then
    draws each sample as often as its weight says, up to rounding, as :class:`MixtureSampler`'s quotas give each
    dataset its share; i.i.d. draws scatter the counts (a sample expected 3 times per epoch gets none with
    probability 5%, 6 or more with 8%). What stays random is which units get the rounding's extra draw (a
    sample expected 0.3 times per epoch is drawn in 30% of the epochs) and the order, both new each epoch. Equal
    weights and ``num_samples=len(source)`` draw every sample once: a permutation, as :class:`EpisodeAwareSampler`.

    Over a collection the weights compare across datasets (each dataset's share of the draws is its weights' sum,
    ``shares``); for given dataset shares with weights within each, use
    ``MixtureSampler(ds, shares, sample_weights=...)``.

    Args:
        source: a :class:`~lerobot_sql.torch.dataset.LeRobotSQLDataset` (``db.dataset(sql)``), a
            :class:`~lerobot_sql.torch.mixture.CollectionDataset`, a manifest, or ``(episode_index, index)``
            arrays (then ``weights`` must be an array).
        weights: the name of a column of the selection's result (``ds.manifest[weights]``: numbers, finite, >= 0;
            0 leaves a sample out), or one such number per sample (array-like, ``(len(source),)``).
        num_samples: draws per epoch over all ranks (default ``len(source)``); rounded up to a multiple of
            ``num_replicas``.
        block_size: samples per block (frames read forward in a row); 1 draws single frames.
        seed: base seed; epoch ``e``'s order depends only on (seed, e) and the arguments.
        num_replicas, rank: distributed sharding (default from ``torch.distributed`` / torchrun's $RANK and
            $WORLD_SIZE, else 1, 0).

    Attributes:
        column: the weights' column name (None for an array). ``names``: the datasets of the source (one for a
        single dataset). ``shares``: name -> the expected share of the draws (its weights' sum over all weights).
        ``expected``: float64 ``(len(source),)``, each sample's draws per epoch (over all ranks) on average.
        ``num_samples``: ``T``.

    Yields:
        sample positions (ints in ``[0, len(source))``); ``len(sampler)`` is ``T / num_replicas`` (less the resumed
        start).

    Raises:
        KeyError: ``weights`` names no column of the result (the message lists the result's columns).
        TypeError: a column that is not numbers (cast it: a bool flag is refused, so it is not taken for a weight by
            mistake); a column name with ``(episode_index, index)`` arrays.
        ValueError: a weight NULL, NaN, infinite or negative (naming the column, the first such sample's episode and
            result row, and how many); every weight 0; an array of another length; ``num_samples`` or
            ``block_size`` < 1; a bad rank.
    """

    def __init__(self, source, weights, *, num_samples: int | None = None, block_size: int = 8, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None):
        ep, idx = _columns(source)
        w = _sample_weights(source, weights)
        self.column = weights if isinstance(weights, str) else None
        self.seed, self.block_size = int(seed), int(block_size)
        self.num_replicas, self.rank = _dist(num_replicas, rank)
        total = len(idx) if num_samples is None else int(num_samples)
        if total < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self._per = -(-total // self.num_replicas)
        self.num_samples = self._per * self.num_replicas
        self.names, codes = _groups(source)
        starts, sizes, unit_w = _units(ep, idx, w, self.block_size)
        self._blocks = (starts, sizes, unit_w, ep[starts], codes[starts])
        scaled = w / w.max()  # weights near the float64 maximum would sum to inf
        self.expected = self.num_samples * (scaled / scaled.sum())
        share = np.bincount(codes, weights=scaled, minlength=len(self.names)) / scaled.sum()
        self.shares = {nm: float(x) for nm, x in zip(self.names, share)}
        self._weights_digest = _digest(w)

    def _global(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.epoch])
        return _expand(*_draw_runs(*self._blocks, self.num_samples, rng))

    def _order(self) -> np.ndarray:
        return self._global()[self.rank * self._per:(self.rank + 1) * self._per]

    def _length(self) -> int:
        return self._per

    def _fingerprint(self) -> dict:
        return {**super()._fingerprint(), "weights": self._weights_digest, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict` (``epoch``, ``start``, ``seed``): the rest of the saved epoch's order.

        Raises:
            ValueError: not a sampler state_dict; saved under other weights (a fingerprint of every sample's
                weight: another column, another selection, or changed scores), or another seed, num_samples,
                block_size or ranks: this sampler's order is not the saved one.
        """
        if isinstance(state, dict) and state.get("weights", self._weights_digest) != self._weights_digest:
            raise ValueError(f"state was saved under other sample weights ({state['weights']}; this sampler's: "
                             f"{self._weights_digest}): its order is not the saved one; build the sampler with the "
                             "saved run's weights (the same column of the same selection)")
        super().load_state_dict(state)


class MixtureSampler(_Resumable):
    """A weighted mixture of datasets: each epoch draws the datasets in the given proportions, blocks of
    consecutive frames at a time, in a shuffled interleaving; deterministic per (seed, epoch), resumable, sharded.

    How an epoch is drawn (``T`` draws in all, ``T = num_replicas * ceil(num_samples / num_replicas)``):

    1. **Quotas.** Dataset ``i`` gets exactly ``quota[i]`` draws, within 1 of ``p_i * T`` (largest-remainder
       rounding of the normalised weights ``p``), so the epoch's proportions are the weights, not a random
       approximation of them; ``quotas`` holds them.
    2. **Each dataset's stream.** Its samples are cut into blocks as :class:`EpisodeAwareSampler` does (runs of at
       most ``block_size`` consecutive frames of one episode, so decoders read forward); the blocks are shuffled
       per (seed, epoch, dataset) and the dataset's draws are the first ``quota[i]`` samples of that stream. A
       dataset whose quota exceeds its samples (a small dataset with a large weight) starts its stream again,
       reshuffled, as often as needed: each of its samples is drawn ``quota / n`` times per epoch on average
       (``repeats`` holds that), never more than ``ceil(quota / n)`` times. With ``replacement=False`` that is
       refused instead (each sample at most once per epoch). A dataset with a smaller quota than samples sees a
       different random subset each epoch. With ``sample_weights``, the dataset's ``quota[i]`` draws follow
       them instead, as :class:`WeightedSampler` draws (exact per-epoch counts by randomized systematic sampling,
       blocks cut where the weight changes): each sample's expected draws are ``quota[i] * w / sum(w)`` over the
       dataset's samples.
    3. **Interleaving.** The blocks of all datasets are put in one uniformly random order (per (seed, epoch)), so
       any stretch of the order (a batch, a rank's slice) holds the datasets in about the weights' proportions:
       the count of dataset ``i`` among ``n`` consecutive draws is hypergeometric, within
       ``4 * sqrt(block_size * n * p_i * (1 - p_i))`` of ``n * p_i`` but for a ~1e-4 chance per stretch.

    Without weights and with ``alpha`` unset, the weights are proportional to the samples (``alpha=1``), and an
    epoch of ``len(ds)`` draws on one rank is a permutation of the samples, as :class:`EpisodeAwareSampler`.

    Weights from SQL, e.g. hours of each dataset's selected episodes::

        w = dict(coll.sql("SELECT dataset, sum(duration_s) FROM episodes GROUP BY 1").fetchall())
        sampler = MixtureSampler(ds, w)

    (its WHERE should match the selection's: a dataset with a weight but no samples in the selection is an error).

    Per-sample weights within each dataset, from a column of the selection (the shares stay the datasets')::

        ds = coll.dataset("SELECT dataset, episode_index, length / 100.0 AS weight FROM episodes")
        sampler = MixtureSampler(ds, {"site_a": 0.7, "site_b": 0.3}, sample_weights="weight")

    (:class:`WeightedSampler` over the collection instead draws every sample in proportion to its weight across the
    datasets, so each dataset's share is its weights' sum.)

    Args:
        source: a :class:`~lerobot_sql.torch.mixture.CollectionDataset` (``coll.dataset(sql)``), a collection manifest
            (``coll.manifest(sql)``), or a single dataset / its manifest / ``(episode_index, index)`` arrays (one
            dataset, named by its ``repo_id``, else ``"dataset"``).
        weights: dataset name -> weight (any non-negative finite numbers, normalised here; 0 excludes the
            dataset). Every dataset with samples in the selection needs a weight. Default: from ``alpha``.
        alpha: temperature weights ``n_i ** alpha``, ``n_i`` the dataset's samples in the selection (1:
            proportional, 0: uniform over datasets, between: small datasets up-weighted). Exclusive with
            ``weights``. Default 1 when ``weights`` is not given.
        num_samples: draws per epoch over all ranks (default ``len(source)``); rounded up to a multiple of
            ``num_replicas``.
        block_size: samples per block (frames read forward in a row); 1 draws single frames.
        seed: base seed; epoch ``e``'s order depends only on (seed, e) and the arguments.
        num_replicas, rank: distributed sharding (default from ``torch.distributed`` / torchrun's $RANK and
            $WORLD_SIZE, else 1, 0): rank ``r`` yields the ``r``-th of ``num_replicas`` equal contiguous slices
            of the epoch's global order (disjoint draws, together the whole order).
        replacement: allow a sample to be drawn more than once per epoch (default True).
        sample_weights: within each dataset, draw its samples in proportion to these: a column of the selection's
            result (its name: a number per result row, which every sample of the row's episode or window carries)
            or one number per sample (checked as :class:`WeightedSampler` checks them). Named apart from
            ``weights``, which are the datasets' shares. Default: every sample of a dataset alike.

    Attributes:
        names: every dataset name of the source. ``weights``: name -> normalised weight (float, sums to 1; the
        datasets with weight > 0). ``counts``: name -> samples in the selection. ``quotas``: name -> draws per epoch
        over all ranks (int). ``repeats``: name -> ``quota / count``. ``num_samples``: ``T``, draws per epoch over
        all ranks. ``expected``: float64 ``(len(source),)``, each sample's draws per epoch on average.

    Yields:
        sample positions (ints in ``[0, len(source))``); ``len(sampler)`` is ``T / num_replicas`` (less the resumed
        start).

    Raises:
        KeyError: a weight names no dataset of the source (with the closest name).
        ValueError: weights and alpha both given; a weight negative, NaN or infinite, or all zero; a dataset with
            samples in the selection has no weight; a dataset with a weight > 0 has no samples in the selection;
            ``replacement=False`` and a quota larger than the dataset's samples (with sample weights: a sample
            expected more than once); ``num_samples`` < 1; a bad rank; a dataset with a weight > 0 whose sample
            weights are all 0; bad sample weights (as :class:`WeightedSampler`, which also says the KeyError and
            TypeError it raises for them).
    """

    def __init__(self, source, weights=None, *, alpha: float | None = None, num_samples: int | None = None,
                 block_size: int = 8, seed: int = 0, num_replicas: int | None = None, rank: int | None = None,
                 replacement: bool = True, sample_weights=None):
        from collections.abc import Mapping

        from ..errors import did_you_mean

        ep, idx = _columns(source)
        names, codes = _groups(source)
        if len(codes) != len(idx):
            raise ValueError(f"{len(codes)} dataset codes for {len(idx)} samples")
        self.names, self.seed, self.block_size = names, int(seed), int(block_size)
        self.replacement = bool(replacement)
        self.num_replicas, self.rank = _dist(num_replicas, rank)
        n = np.bincount(codes, minlength=len(names)).astype(np.int64)
        self.counts = {nm: int(c) for nm, c in zip(names, n)}
        if weights is not None and alpha is not None:
            raise ValueError("pass weights or alpha, not both (alpha makes the weights n_i ** alpha)")
        if weights is None:
            a = 1.0 if alpha is None else float(alpha)
            if not np.isfinite(a):
                raise ValueError(f"alpha must be a finite number, got {alpha!r}")
            w = np.zeros(len(names))
            # n_i ** a as (n_i / max n) ** a: the same proportions, and no overflow to inf for a large alpha
            m = n[n > 0].astype(np.float64)
            w[n > 0] = (m / m.max()) ** a if len(m) else m
        else:
            if not isinstance(weights, Mapping):
                raise TypeError(f"weights must be a mapping dataset name -> weight, got {type(weights).__name__}")
            w = np.zeros(len(names))
            for k, v in weights.items():
                if k not in names:
                    raise KeyError(f"weights: no dataset {k!r} in {names}.{did_you_mean(str(k), names)}")
                try:
                    x = float(v)
                except (TypeError, ValueError):
                    raise ValueError(f"weights[{k!r}] = {v!r} is not a number") from None
                if not np.isfinite(x) or x < 0:
                    raise ValueError(f"weights[{k!r}] = {v!r}: weights must be finite and >= 0 (0 excludes)")
                w[names.index(k)] = x
            unweighted = [f"{nm} ({c} samples)" for nm, c in zip(names, n) if c and nm not in weights]
            if unweighted:
                raise ValueError(f"weights give no weight to {', '.join(unweighted)} of the selection: give each "
                                 "a weight (0 excludes it) or leave it out of the query")
            empty = [f"{nm} (weight {weights[nm]})" for nm, c, x in zip(names, n, w) if x > 0 and c == 0]
            if empty:
                raise ValueError(f"{', '.join(empty)}: weight > 0 but no samples in the selection (of "
                                 f"{len(idx)} samples: {', '.join(f'{a}={b}' for a, b in self.counts.items() if b)})"
                                 "; select some of its samples, or give it weight 0")
        if w.max(initial=0.0) > 0:
            w = w / w.max()  # proportions kept; weights near the float limit (1e308 each) no longer sum to inf
        if not w.sum() > 0:
            raise ValueError(f"every weight is 0 (or the selection is empty: {len(idx)} samples), or alpha={alpha!r} "
                             "leaves every dataset but the largest at weight 0: nothing to draw")
        p = w / w.sum()
        total = len(idx) if num_samples is None else int(num_samples)
        if total < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self._per = -(-total // self.num_replicas)
        self.num_samples = self._per * self.num_replicas
        q = _quotas(p, self.num_samples)
        if int(q.sum()) != self.num_samples or not np.isfinite(p).all():  # (the weights above were normalised)
            raise ValueError(f"the weights {dict(zip(names, w.tolist()))} give no usable proportions")
        self.weights = {nm: float(x) for nm, x in zip(names, p) if x > 0}
        self.quotas = {nm: int(x) for nm, x in zip(names, q) if p[names.index(nm)] > 0}
        self.repeats = {nm: self.quotas[nm] / self.counts[nm] for nm in self.quotas}
        starved = [f"{nm} (weight {self.weights[nm]:.3g})" for nm, x in self.quotas.items() if x == 0]
        if starved:
            warn(f"{', '.join(starved)}: weight > 0 but 0 of the epoch's {self.num_samples} draws "
                 "(rounded down): raise num_samples or the weight")
        raw = None if sample_weights is None else _sample_weights(source, sample_weights)
        self._sample_digest = None if raw is None else _digest(raw)
        # scaled (the draws do not change): weights near the float64 maximum would sum to inf
        sw = None if raw is None else raw / raw.max()
        if sw is None:
            self.expected = (q / np.maximum(n, 1))[codes]
        else:
            mass = np.bincount(codes, weights=sw, minlength=len(names))
            zero = [f"{nm} (weight {self.weights[nm]:.3g})" for nm, m in zip(names, mass) if m <= 0 and nm in
                    self.weights]
            if zero:
                raise ValueError(f"{', '.join(zero)}: a share of the draws, but every sample weight of its samples "
                                 f"is 0 (sample_weights={sample_weights!r:.80}): give it weight 0, or its samples "
                                 "weights > 0")
            self.expected = q[codes] * sw / np.where(mass > 0, mass, 1)[codes]
        if not self.replacement:
            if sw is None:
                over = [f"{nm}: {self.quotas[nm]} draws > {self.counts[nm]} samples" for nm in self.quotas
                        if self.quotas[nm] > self.counts[nm]]
            else:
                top = [int(np.argmax(np.where(codes == c, self.expected, -1))) for c in range(len(names))]
                over = [f"{nm}: {self.expected[i]:.3g} draws expected of sample {i} ({_where(source, i)}, weight "
                        f"{raw[i]:.3g})" for nm, i in zip(names, top) if nm in self.quotas and
                        self.expected[i] > 1 + 1e-9]
            if over:
                raise ValueError(f"replacement=False, but the weights ask for more draws than samples ({'; '.join(over)}"
                                 f"; {self.num_samples} draws per epoch): pass replacement=True (such a dataset "
                                 "repeats, reshuffled), fewer num_samples, or smaller weights")
        if sw is None:
            b = blocks(ep, idx, self.block_size)
            starts, sizes = b[:-1], np.diff(b)
            unit_w = None
        else:
            starts, sizes, unit_w = _units(ep, idx, sw, self.block_size)
        owner = codes[starts] if len(starts) else np.zeros(0, np.int64)  # a block never spans datasets (keys)
        self._blocks = {int(c): (starts[owner == c], sizes[owner == c],
                                 None if unit_w is None else (unit_w[owner == c], ep[starts[owner == c]]))
                        for c in np.flatnonzero(q > 0)}
        self._q = q

    def _stream(self, code: int) -> tuple[np.ndarray, np.ndarray]:
        """Dataset ``code``'s draws this epoch as blocks: (starts, sizes), the first ``quota`` samples of its
        stream of shuffled passes over its blocks (the last block cut to fit); with sample weights, ``quota`` draws
        by them (:func:`_draw_runs`)."""
        st, sz, weighted = self._blocks[code]
        need = int(self._q[code])
        rng = np.random.default_rng([self.seed, self.epoch, 1 + code])
        if weighted is not None:
            unit_w, unit_ep = weighted
            return _draw_runs(st, sz, unit_w, unit_ep, np.zeros(len(st), np.int64), need, rng)
        passes = -(-need // int(sz.sum()))
        # one uniformly random permutation per pass (argsort of iid uniforms), all passes at once
        perm = np.argsort(rng.random((passes, len(st))), axis=1).ravel()
        st, sz = st[perm], sz[perm]
        cum = np.cumsum(sz)
        k = int(np.searchsorted(cum, need)) + 1  # blocks needed to reach `need` samples
        st, sz = st[:k], sz[:k].copy()
        sz[-1] -= int(cum[k - 1]) - need
        return st, sz

    def _global(self) -> np.ndarray:
        parts = {c: self._stream(c) for c in self._blocks}
        label = np.concatenate([np.full(len(parts[c][0]), c, np.int64) for c in parts])
        rng = np.random.default_rng([self.seed, self.epoch])
        label = label[rng.permutation(len(label))]
        # dataset c's blocks fill its slots of the interleaving in stream order: a stable sort by dataset lists
        # the slots dataset by dataset (ascending codes, as `parts`), each dataset's in order
        slots = np.argsort(label, kind="stable")
        st = np.empty(len(label), np.int64)
        sz = np.empty(len(label), np.int64)
        st[slots] = np.concatenate([parts[c][0] for c in parts])
        sz[slots] = np.concatenate([parts[c][1] for c in parts])
        return _expand(st, sz)

    def _order(self) -> np.ndarray:
        return self._global()[self.rank * self._per:(self.rank + 1) * self._per]

    def _length(self) -> int:
        return self._per

    def state_dict(self, consumed: int = 0) -> dict:
        """As :meth:`EpisodeAwareSampler.state_dict`, plus the epoch's ``quotas`` and a fingerprint of the sample
        weights (what a resume checks: a resume under other weights, num_samples or datasets would not continue the
        saved order)."""
        return {**super().state_dict(consumed), "quotas": dict(self.quotas), "block_size": self.block_size,
                "num_replicas": self.num_replicas, "sample_weights": self._sample_digest}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict`: the rest of the saved epoch's order exactly.

        Raises:
            ValueError: the state was saved with another seed, other quotas (weights, num_samples, datasets),
                sample weights, block_size or num_replicas: this sampler's order is not the saved one.
        """
        for key, mine in (("quotas", self.quotas), ("sample_weights", self._sample_digest),
                          ("block_size", self.block_size), ("num_replicas", self.num_replicas)):
            if key in state and state[key] != mine:
                raise ValueError(f"state was saved with {key} {state[key]}, this sampler has {mine}: its order is "
                                 "not the saved one; build the sampler with the saved run's weights, sample "
                                 "weights, num_samples, block_size and ranks")
        super().load_state_dict(state)
