"""Remote pipelining: each DataLoader worker fetches the bytes of its own next batches in background threads.

Set with :meth:`lerobot_sql.torch.dataset.LeRobotSQLDataset.pipeline` (``ds.pipeline(sampler, batches=k)``). On a remote
dataset a worker that reads batch ``j`` otherwise waits on the network for every row group and GOP the batch needs
that is not cached yet. With a pipeline, when ``__getitems__`` is called with batch ``j`` the worker submits, to two
background threads, the byte ranges (data row groups whose cache files do not exist yet, video packets from each
frame's keyframe to the frame, container heads) of the batches it will be handed next, ``j + W, j + 2W, ...
j + kW`` (``W`` workers), so that they are in the piece cache when it gets there.

How a worker knows its next indices. torch's DataLoader gives batch ``j`` to worker ``j % W`` (round robin), and
a batch is the slice ``[j*B, (j+1)*B)`` of the sampler's order; ``__getitems__`` sees only the indices of one
batch. The dataset is handed a reference to the sampler (pickled with the dataset to spawned workers, inherited by
forked ones), and each worker computes the sampler's order itself, once (``sampler.order()`` when the sampler has
it, as this package's samplers do, else ``list(iter(sampler))``). It finds the batch's position in that order by
its first index and checks the whole batch matches there; then the next batches are known. This needs no channel
from the main process and no change to how users build the DataLoader, and it is safe by construction: a sampler
whose order differs in the worker (torch's ``RandomSampler`` without a seeded generator, a persistent worker whose
sampler was ``set_epoch``-ed after it started, another sampler than the one given) makes the check fail, and the
worker then prefetches nothing for that batch (no wrong bytes fetched; a count says so). Alternatives rejected: the
sampler publishing its order into shared memory needs a handle with a lifetime of its own and a hook in every
sampler; prefetching "the next k batches" of every worker would fetch each batch W times over the link's budget.

A job also fetches the other half of a block its batch boundary cuts (``_Here.straddling``: the neighbouring
batches' items that continue its ends' runs of consecutive frames), so the two workers sharing a block's GOPs make
one request for them, not a second one for the few KB past the first (3.5 requests per batch of 32 instead of 5.1
over a multifile60 epoch in EpisodeAwareSampler's order; each costs ~1 ms of a worker's CPU and a round trip).

A job also widens its requests (``_Here.widen``): each grows to the ``WIDEN``-aligned block around it over bytes the
rest of the epoch needs (the whole order's ranges, planned once by ``ds.pipeline()`` in the main process, which
opens the video indexes they need four at once; the workers inherit the plan) and no one has fetched. At 96x128 a GOP
run is 10-30 KB and each request ~1 ms of a worker's CPU in the HTTP client (measured: 0.6-1.0 ms per ranged GET
through fsspec's aiohttp session on this machine, nearly independent of the size up to ~40 KB), so over a dense
epoch the requests, not the bytes, were the remote read's largest cost: 476 requests over a multifile60 epoch
(13,024 items) became 160 with 256 KiB blocks, same bytes. 1 MiB blocks and 8 batches ahead (the defaults) cut a 4096-item pass's requests from ~130 to ~105 and the workers' CPU per remote item by a fifth to a
third (benchmarks/HISTORY.md, "Remote steady state"); 16 batches ahead was slower (more bytes held, later first use). The bytes stay what the epoch reads, so widening is off when they pass a
quarter of the cache (the LRU could evict them before their batch comes). A widened request is cut only where the
epoch needs nothing or bytes are cached; cached bytes shorter than ``pieces.MERGE_GAP`` between two gaps are fetched
again rather than cutting it (``pieces._bridge``: DuckDB's small column chunks of a data file otherwise split its
widened request into one per row group).

With the epoch planned, a job does not plan its batch at all (``_Here.block_missing``): the main process also
records, in the same pass, which ``WIDEN`` blocks each position reads (``Pipeline.blocks``, from
:func:`item_blocks`: ~1-2 us per position, once), so a job gathers its items' blocks, drops those
this process already fetched, and fetches the epoch's need within the rest (what widening its own ranges would
fetch). Planning each batch was 0.5-1.1 ms of a worker's CPU per batch, about half of the background threads'
work; after the first jobs of a dense epoch most batches' blocks are done, and their jobs ask nothing.

Results never change: prefetching only fills the piece cache (pinned to the file versions the dataset opened),
and the readers find the bytes there. The bytes fetched ahead are bounded per worker by ``max_bytes`` (default
``min(128 MiB, cache_size / (4 W))``): a batch is skipped when the bytes already fetched ahead and not yet
consumed plus its own would pass the bound, so the cache's LRU never evicts prefetched pieces before they are read
(nor pieces in use) unless the cache is smaller than ``4 W max_bytes``. A background failure is not raised: the
batch's own read then fetches (and raises) as without the pipeline. Local datasets: nothing to do (a no-op).
The bytes fetched beyond what the read batches need: the last ``k`` batches a worker fetched ahead when iteration
stops early (a loop that breaks mid-epoch); over a whole epoch there are none (tests/test_pipeline.py: 1.06x of the
run without pipelining over a 24-batch epoch, 1.17x when the same 24 batches end a longer epoch early).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import hashlib
import os
import threading
from typing import Callable

import numpy as np
import pyarrow.parquet as pq
import torch

from .._readers import locate, tabular, video_index
from .._readers import need as _need
from .._storage.pieces import merge_ranges
from ..errors import LeRobotSQLError, warn

DEFAULT_MAX_BYTES = 128 << 20
WIDEN = 1 << 20  # a job's request grows to the aligned block of this size around it, over bytes the epoch needs
THREADS = 2  # background jobs per worker: one batch's ranges computed while another's are fetched


class Pipeline:
    """The settings of ``ds.pipeline`` and, per process, the prefetch state (``_Here``, rebuilt after a fork and
    never pickled)."""

    def __init__(self, sampler, batches: int = 8, max_bytes: int | None = None):
        if batches < 1:
            raise ValueError(f"batches must be >= 1 (batches fetched ahead per worker), got {batches}")
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        if not hasattr(sampler, "__iter__"):
            raise TypeError(f"sampler must be the DataLoader's sampler (an iterable of indices), not "
                            f"{type(sampler).__name__}")
        self.sampler, self.batches, self.max_bytes = sampler, int(batches), max_bytes
        # {file: [start, end) ranges} the whole epoch reads, set by the dataset (LeRobotSQLDataset.pipeline) in the
        # main process, so that the workers inherit it (or get it pickled) instead of each building it: None = no
        # widening (local, too large for the cache, or not planned)
        self.need: dict[str, list[tuple[int, int]]] | None = None
        # where each planned position reads, in WIDEN blocks: (positions (sorted int64), files, offsets, keys),
        # position pos[i]'s blocks keys[offsets[i]:offsets[i + 1]] (file index << 32 | block), or None
        self.blocks: tuple[np.ndarray, list[str], np.ndarray, np.ndarray] | None = None
        self.need_of: str | None = None  # positions_key() of the positions it was planned for
        self._here: _Here | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_here"] = None
        return state

    def here(self, n: int, cache_size: int | None) -> "_Here":
        h = self._here
        if h is None or h.pid != os.getpid():
            info = torch.utils.data.get_worker_info()
            workers = info.num_workers if info is not None else 1
            budget = self.max_bytes
            if budget is None:
                budget = DEFAULT_MAX_BYTES if cache_size is None else min(DEFAULT_MAX_BYTES,
                                                                          cache_size // (4 * workers))
            h = self._here = _Here(self.sampler, n, workers, max(1, int(budget)))
            # The plan holds for the positions it was made for: a sampler whose next epoch draws another set (a
            # rank's share of a reshuffled order after set_epoch) widens over bytes this rank may not read; then
            # none (ds.pipeline(sampler) again plans the new set). A reshuffle of the same set keeps it.
            if self.need is not None and positions_key(h.order) == self.need_of:
                h.need, h.blocks = self.need, self.blocks
        return h

    def after_batch(self, ii: np.ndarray, n: int, ranges: Callable[[np.ndarray], dict], src) -> None:
        """Called by ``__getitems__`` with batch ``ii`` (positions in [0, n)): submit the prefetch of this
        worker's next batches. ``ranges(positions)`` gives ``{file: [(start, end), ...]}`` the items read."""
        if src.is_local or not len(ii):
            return
        cache_size = getattr(src.fs, "cache_size", None)
        self.here(n, cache_size).after_batch(ii, self.batches, ranges, src)

    def stats(self) -> dict[str, int]:
        """Counters of this process: ``batches`` seen, ``unmatched`` (not found in the sampler's order: nothing
        prefetched), ``submitted``, ``over_budget`` (skipped), ``late`` (read before its prefetch started),
        ``failed``, ``bytes`` fetched ahead, ``widened`` (files whose request grew over bytes later batches need,
        see :meth:`_Here.widen`; with the epoch's block table, files a job fetched blocks of)."""
        return dict(self._here.counts) if self._here is not None and self._here.pid == os.getpid() else {}

    def wait(self) -> None:
        """Block until this process's submitted prefetches are done (tests, benchmarks)."""
        h = self._here
        if h is not None and h.pid == os.getpid():
            with h.lock:
                futs = list(h.futures)
            concurrent.futures.wait(futs)


def sampler_order(sampler, *, iterate: bool = True) -> np.ndarray | None:
    """The positions ``sampler`` yields in one epoch, as it gives them (not wrapped into ``[0, n)``):
    ``sampler.order()`` when it has it (this package's samplers: no iteration), a list, tuple, range or array as it
    is, else its iteration, or None when ``iterate`` is False. Its own errors propagate."""
    if callable(getattr(sampler, "order", None)):
        return np.asarray(sampler.order())
    if isinstance(sampler, (list, tuple, range, np.ndarray)):
        return np.asarray(sampler)
    return np.asarray([int(i) for i in sampler], np.int64) if iterate else None


def order_of(sampler, n: int) -> np.ndarray:
    """The positions (int64, in ``[0, n)``) ``sampler`` yields in one epoch (:func:`sampler_order`)."""
    return wrap(sampler_order(sampler), n)


def wrap(order: np.ndarray, n: int) -> np.ndarray:
    """Positions as int64 in ``[0, n)`` (negative ones count from the end, as in ``ds[i]``)."""
    return np.asarray(order, np.int64) % max(n, 1)


def positions_key(order: np.ndarray) -> str:
    """A digest of the set of positions in ``order`` (not their order): what an epoch plan was made for."""
    return hashlib.blake2b(np.unique(order).tobytes(), digest_size=16).hexdigest()


def within(need: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of the sorted, disjoint ``need`` ranges inside ``[lo, hi)``."""
    out = []
    # the last needed range starting at or before lo (need is sorted by start, tuples compare by it first)
    i = max(0, bisect.bisect_right(need, (lo, float("inf"))) - 1)
    while i < len(need) and need[i][0] < hi:
        x, y = max(need[i][0], lo), min(need[i][1], hi)
        if x < y:
            out.append((x, y))
        i += 1
    return out


def fits_cache(need: dict[str, list[tuple[int, int]]], cache_size: int | None) -> dict | None:
    """``need`` (the epoch's ranges per file) when widening over it is safe, else None: its bytes must be at most a
    quarter of the cache, or widened requests could be evicted before their batches come (and fetched twice)."""
    total = sum(b - a for rs in need.values() for a, b in rs)
    if not WIDEN or (cache_size is not None and total > cache_size // 4):
        return None
    return {rel: rs for rel, rs in need.items() if rs}


class _Here:
    """One process's view: the sampler's order, where each index first occurs, the jobs in flight."""

    def __init__(self, sampler, n: int, workers: int, max_bytes: int):
        self.pid = os.getpid()
        self.workers, self.max_bytes = workers, max_bytes
        self.order = order_of(sampler, n)
        first = np.full(n, -1, np.int64)
        pos = np.arange(len(self.order), dtype=np.int64)
        first[self.order[::-1]] = pos[::-1]  # the first occurrence wins
        self.first = first
        self.lock = threading.Lock()
        self.ahead: dict[int, int] = {}  # batch start in the order -> bytes fetched ahead for it (0: not yet)
        self.futures: set[concurrent.futures.Future] = set()
        self.pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="lsql-pipeline")
        self.counts = {"batches": 0, "unmatched": 0, "submitted": 0, "over_budget": 0, "late": 0, "failed": 0,
                       "bytes": 0, "widened": 0}
        self.need: dict | None = None  # the epoch's byte ranges per file (Pipeline.need), or None: no widening
        self.blocks: tuple | None = None  # Pipeline.blocks: jobs then fetch blocks (block_missing), no plan each
        self.done: set[int] = set()  # block keys this process fetched (or found cached) for its jobs

    def position(self, ii: np.ndarray) -> int | None:
        p = int(self.first[ii[0]])
        if p < 0 or p + len(ii) > len(self.order) or not np.array_equal(self.order[p:p + len(ii)], ii):
            return None
        return p

    def straddling(self, t: int, b: int) -> np.ndarray:
        """The items of the neighbouring batches (``[t - b, t)`` and ``[t + b, t + 2b)`` of the order) that continue
        the run of consecutive positions at batch ``t``'s ends: the other half of a block a batch boundary cuts
        (EpisodeAwareSampler's blocks rarely align with batches). That half reads the same GOPs and row group; it
        belongs to another worker, whose job would otherwise fetch, a moment later, the few KB its range reaches
        past this one's (a request for a few KB at the end of nearly every batch: 105 of 245 requests over a
        multifile60 epoch). Whichever job comes first fetches the block's union; the other finds it cached.
        Nothing is fetched that a neighbour will not read. Random orders have no such runs: nothing is added."""
        o = self.order
        out = []
        lo = t
        while lo > max(0, t - b) and o[lo - 1] == o[lo] - 1:
            lo -= 1
        out.append(o[lo:t])
        e, hi = t + b, t + b
        if 0 < e < len(o):
            while hi < min(len(o), e + b) and o[hi] == o[hi - 1] + 1:
                hi += 1
            out.append(o[e:hi])
        return np.concatenate(out) if out else o[:0]

    def after_batch(self, ii: np.ndarray, k: int, ranges, src) -> None:
        self.counts["batches"] += 1
        p = self.position(ii)
        if p is None:
            self.counts["unmatched"] += 1
            return
        b, step = len(ii), self.workers * len(ii)
        with self.lock:
            for t in [t for t in self.ahead if t <= p]:  # read now (or passed): no longer held ahead
                del self.ahead[t]
            new = [t for t in (p + m * step for m in range(1, k + 1)) if t < len(self.order) and t not in self.ahead]
            for t in new:
                self.ahead[t] = 0
        for t in new:
            fut = self.pool.submit(self._job, t, self.order[t:t + b].copy(), ranges, src)
            with self.lock:
                self.futures.add(fut)
                self.counts["submitted"] += 1
            fut.add_done_callback(self._done)

    def widen(self, missing: dict[str, list[tuple[int, int]]], src) -> dict[str, list[tuple[int, int]]]:
        """Each missing range grown to the ``WIDEN``-aligned block around it, but only over bytes the epoch's
        other batches need and that are not cached (``self.need``): one request then brings what ~70 batches of
        a dense epoch read (96x128: a GOP run is ~10-30 KB, each request ~1.3 ms of a worker's CPU). The block
        is aligned, so the two workers' jobs widen to the same block and the region lock makes one fetch it.
        Bytes fetched over the epoch stay those the epoch reads; an epoch stopped early leaves at most a block
        per file and job fetched ahead."""
        need = self.need
        if not need:
            return missing
        out = {}
        for rel, rs in missing.items():
            nd = need.get(rel)
            if not rs or not nd:
                out[rel] = rs
                continue
            grown = list(rs)
            for a, b in rs:
                grown += within(nd, a - a % WIDEN, -(-b // WIDEN) * WIDEN)
            grown = src.missing(rel, merge_ranges(grown, 0))
            if sum(b - a for a, b in grown) > sum(b - a for a, b in rs):
                with self.lock:
                    self.counts["widened"] += 1
            out[rel] = grown
        return out

    def block_missing(self, jj: np.ndarray, src) -> tuple[dict[str, list[tuple[int, int]]], list[int]]:
        """What a job fetches for batch ``jj`` with the epoch's block table (``self.blocks``): the epoch's needed
        bytes, not cached, within each ``WIDEN`` block its items read that this process has not fetched yet, and
        those blocks' keys (to mark done once fetched). What :meth:`widen` fetches for the batch's own ranges,
        without planning them: a gather of the items' blocks (~0.02 ms a batch, against 0.5-1.1 ms for its plan:
        a fifth of a worker's extra CPU per remote item), and after the first jobs of a dense epoch most batches'
        blocks are all done, so nothing more. Positions the table lacks read nothing it knows of."""
        pos, files, off, keys = self.blocks
        r = np.searchsorted(pos, jj)
        r = r[(r < len(pos)) & (pos[np.minimum(r, len(pos) - 1)] == jj)]
        lo, cnt = off[r], off[r + 1] - off[r]
        total = int(cnt.sum())
        if not total:
            return {}, []
        sel = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(total, dtype=np.int64)
        with self.lock:
            new = [k for k in np.unique(keys[sel]).tolist() if k not in self.done]
        want: dict[str, list[tuple[int, int]]] = {}
        for k in new:
            rel, blk = files[k >> 32], k & 0xFFFFFFFF
            want.setdefault(rel, []).extend(within(self.need.get(rel, []), blk * WIDEN, (blk + 1) * WIDEN))
        return {rel: src.missing(rel, merge_ranges(rs, 0)) for rel, rs in want.items()}, new

    def _done(self, fut) -> None:
        with self.lock:
            self.futures.discard(fut)

    def _job(self, t: int, jj: np.ndarray, ranges, src) -> None:
        try:
            with self.lock:
                if t not in self.ahead:  # its batch was read before the job started
                    self.counts["late"] += 1
                    return
            if self.blocks is not None and self.need:
                missing, blocks = self.block_missing(jj, src)
            else:
                need = ranges(np.concatenate([jj, self.straddling(t, len(jj))]))
                missing, blocks = self.widen({rel: src.missing(rel, rs) for rel, rs in need.items()}, src), []
            nbytes = sum(b - a for rs in missing.values() for a, b in rs)
            with self.lock:
                if t not in self.ahead:
                    self.counts["late"] += 1
                    return
                if sum(self.ahead.values()) + nbytes > self.max_bytes:
                    del self.ahead[t]
                    self.counts["over_budget"] += 1
                    return
                self.ahead[t] = nbytes
            # the batch's files at once (a row-group file and a few mp4s: one round trip for all, not one each, and
            # one round on fsspec's loop for all the requests, not a thread each)
            got = src.fetch_many([(rel, rs) for rel, rs in missing.items() if rs])
            with self.lock:
                self.counts["bytes"] += got
                self.counts["widened"] += sum(1 for rs in missing.values() if rs) if blocks else 0
                self.done.update(blocks)
        except Exception:  # noqa: BLE001 - best effort: the batch's own read fetches and raises properly
            with self.lock:
                self.counts["failed"] += 1


# ---- the plan: the bytes items read, with this process's state (the rule itself: lerobot_sql._readers.need) ------
def warn_outside(order: np.ndarray | None, n: int) -> None:
    """Warn when the pipeline's sampler's ``order`` names positions a dataset of ``n`` samples does not have (the
    sampler of another, larger dataset, say): the fetch ahead skips them, so it is silently useless, and the
    DataLoader raises IndexError when it reaches one. Nothing for an order not known here (None)."""
    if order is None or len(order) == 0 or order.dtype.kind not in "iu":
        return
    bad = (order < -n) | (order >= n)
    if bad.any():
        warn(f"pipeline: {int(bad.sum())} of {len(order)} sampler positions are outside this dataset's "
             f"{n} samples (e.g. {int(order[bad][0])}): is it the sampler of another dataset? The "
             "fetch ahead skips them and the DataLoader raises IndexError at them; build the sampler "
             "on this dataset")


def plan_epoch(w, order: np.ndarray | None, n: int) -> tuple[dict[str, list[tuple[int, int]]] | None, tuple | None,
                                                             str | None]:
    """For a dataset of ``n`` samples read through worker state ``w`` (``lerobot_sql.torch._worker.Worker``): the byte
    ranges the sampler's whole epoch reads (:func:`byte_ranges` of its positions), for the pipeline's widened
    requests (:func:`fits_cache` decides); the blocks each of its positions reads (``(positions,
    *``:func:`item_blocks` ``)``, :attr:`Pipeline.blocks`); and the key of the positions (:func:`positions_key`),
    for the sampler's ``order`` (:func:`sampler_order`); ``(None, None, None)`` without one, or with widening off.

    Built in the main process, once: the workers inherit it. The video indexes it needs are opened first, four
    at once (a remote one is a moov fetch each, and the workers would otherwise each build or load it on
    first use): ~40 ms of CPU for a 13,024-frame epoch besides."""
    if not WIDEN or order is None:
        return None, None, None
    try:
        order = wrap(order, n)
    except (TypeError, ValueError):  # positions that are not integers: the DataLoader raises at them
        return None, None, None
    pos = np.unique(order)

    def open_one(kc) -> None:
        with contextlib.suppress(LeRobotSQLError, OSError):  # raised by the item's own read, named
            w.video(*kc)

    cams = w.samples.cameras
    todo = [(k, int(code)) for k in w.video_keys for code in np.unique(cams[k].code[pos])]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(4, len(todo)))) as pool:
        list(pool.map(open_one, todo))
    need = fits_cache(byte_ranges(w, pos), getattr(w.src.fs, "cache_size", None))
    blocks = None if need is None else (pos, *item_blocks(w, pos))
    return need, blocks, positions_key(order)


def byte_ranges(w, jj: np.ndarray) -> dict[str, list[tuple[int, int]]]:
    """``{file: merged [start, end) ranges}`` the items ``jj`` read and process state ``w`` has not built from yet:
    the row groups (windows' too) this process does not hold, and per camera and mp4 the packets from each
    frame's keyframe run to a few packets past it (plus PyAV's read block), with the container head
    (:mod:`lerobot_sql._readers.need`'s rule, as ``prefetch`` plans a query). A file that fails to open is left out
    (the item's own read raises)."""
    out = {}
    for _f, info, base, _m, own, window in _data_rows(w, jj):
        todo = [rg for rg in _need.row_groups(info, own, window).tolist() if base + rg not in w.views]
        if todo:
            out[info.rel] = tabular.row_group_ranges(info.metadata, todo)
    for rel, vf, packets, _m, rows in _camera_rows(w, jj):
        ranges = _need.video_ranges(rows, vf.index.key_row, *packets, spans=_spans(w, rel, vf.index, packets))
        out.setdefault(rel, []).extend(ranges)
    return {rel: merge_ranges(r) for rel, r in out.items()}


def item_blocks(w, jj: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Which ``WIDEN``-aligned blocks of which files each item of ``jj`` reads (:func:`need.item_blocks`: ``(files,
    offsets, keys)``). For the pipeline's jobs (:meth:`_Here.block_missing`): planned for the whole epoch at once in
    the main process (numpy passes over every item, ~20x cheaper per item than a plan per batch), so that a job only
    gathers its items' blocks.

    An item's extent per file covers what it reads: its row groups (a window's too) from the first one's first
    column chunk to the last one's end; per mp4 the packets of its rows' spans and the container head. The blocks
    are only where to look: what is fetched is the epoch's need within them (so a coarse extent fetches nothing
    extra)."""

    def extents():
        for _f, info, _base, m, own, window in _data_rows(w, jj):
            yield (info.rel, np.flatnonzero(m), *_need.data_extents(info, own, window))
        for rel, vf, packets, m, rows in _camera_rows(w, jj):
            items = np.flatnonzero(m)
            spans = _spans(w, rel, vf.index, packets)
            yield (rel, items, *_need.video_extents(rows, vf.index.key_row, *packets, spans=spans))
            yield rel, items, np.zeros(len(items), np.int64), np.full(len(items), _need.head_end(packets[0]))

    return _need.item_blocks(len(jj), extents(), WIDEN)


def _data_rows(w, jj: np.ndarray):
    """Per data file, the items of ``jj`` in it: yields ``(f, info, base, m, own, window)``, ``m`` a bool mask
    over ``jj``, ``own`` int64 the row group (in the file) of each item's row, ``window`` None or
    :func:`need.window_rows` of its items (the file rows its ``delta_timestamps`` windows reach)."""
    s = w.samples
    fi, slot = s.file[jj], s.slot[jj].astype(np.int64)
    offsets = np.concatenate(list(w.delta.values())) if w.delta else None
    for f in np.unique(fi):
        m = fi == f
        base = int(s.rg_base[int(f)])
        window = None
        if offsets is not None:  # windows reach rows of neighbouring row groups
            window = _need.window_rows(s.index[jj][m], s.ep_from[jj][m], s.ep_to[jj][m], s.row0[jj][m], offsets,
                                       w.stride)
        yield int(f), s.infos[int(f)], base, m, slot[m] - base, window


def _camera_rows(w, jj: np.ndarray):
    """Per camera and mp4, the items of ``jj`` that read it: yields ``(rel, video file, packets, m, rows)``,
    ``m`` a bool mask over ``jj``, ``rows`` int64 (m.sum(), T) the video rows each item decodes (T = 1, or the
    window's length for a ``delta_timestamps`` camera; -1: none): the items' own rows (the worker's), a window's
    by :mod:`need`'s rule (by position with ``align="frame_index"``, the items' own rule). A file whose index
    fails to open, or whose packets' positions are unknown, is left out (the item's own read raises)."""
    s = w.samples
    idx, ep_from, ep_to = s.index[jj].astype(np.int64), s.ep_from[jj], s.ep_to[jj]
    fps = float(w.fps)
    for k in w.video_keys:
        cam = s.cameras[k]
        codes, vpos = cam.code[jj], cam.position[jj]
        if k in w.delta:  # the items' frame times (a window's clamped neighbours too) once per camera, not per mp4
            q, t_all = _need.window_times(idx, ep_from, ep_to, cam.from_timestamp[jj], s.timestamp[jj], w.delta[k],
                                          fps, w.stride)
        for code in np.unique(codes):
            rel = cam.files[int(code)]
            try:
                vf = w.video(k, int(code))
                packets = _packets(w, rel, vf.index)
            except (LeRobotSQLError, OSError):
                continue
            if packets is None:
                continue
            m = codes == code
            if k in w.delta and w.align == "frame_index":  # the items' own rule (never-served rows < 0)
                rows = locate.rows_by_position(vf.index.pts_s, vf.first[vpos[m]][:, None],
                                               q[m] - ep_from[m][:, None], (ep_to[m] - ep_from[m])[:, None],
                                               cam.from_timestamp[jj[m]][:, None], fps)
            elif k in w.delta:
                rows = _need.nearest_rows(vf.index.pts_s, t_all[m])
            else:
                rows = w.own_rows(k, vf, jj[m])[:, None]
            yield rel, vf, packets, m, rows


def _spans(w, rel: str, index: video_index.FrameIndex, packets) -> tuple | None:
    """:func:`need.packet_table` of mp4 ``rel`` (every row's packet range), once per process; None for a file
    with long keyframe runs."""
    if rel not in w.spans:
        w.spans[rel] = _need.packet_table(index.key_row, *packets)
    return w.spans[rel]


def _packets(w, rel: str, index: video_index.FrameIndex):
    """(byte_offset, byte_size) int64 (n,) of mp4 ``rel``'s packets in ``index``'s row order (from its mapped
    Arrow form, or the Parquet form for an Arrow form cached without them), or None when unknown (a packet
    without a position)."""
    if rel not in w.packets:
        if index.byte_offset is not None:  # in the mapped Arrow form: no second demux for the Parquet form
            start, size, pts = index.byte_offset, index.byte_size, index.pts
        else:  # an Arrow form cached before it carried them
            t = pq.read_table(video_index.ensure_index(w.src, rel, w.cache_dir),
                              columns=["pts", "byte_offset", "byte_size"])
            start, size, pts = t["byte_offset"].to_numpy(), t["byte_size"].to_numpy(), t["pts"].to_numpy()
        ok = len(start) == len(index.pts) and bool((pts == index.pts).all()) and \
            len(start) and start.min() >= 0
        w.packets[rel] = (start, size) if ok else None
    return w.packets[rel]
