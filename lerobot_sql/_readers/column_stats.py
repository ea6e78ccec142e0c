"""Statistics of numeric data columns over a selection's rows, read from the data files a span of row groups at a
time and reduced with numpy: what ``db.stats(sql)`` gives its numeric features.

Why not DuckDB: its Parquet reader took 7 s to scan one 6-float list column of 30M frames, and the statistics of
every frame of the 100k-episode scale set, unnested per element with exact quantiles, 187 s; pyarrow hands such a
column to numpy as one buffer (all seven numeric columns of that set in 8.7 s, statistics included).

What is computed, per element of each feature, over the selected samples (a data row selected twice counts twice):
``min``/``max`` in the column's own dtype (exact for integers), ``mean`` and population ``std`` in float64 (Chan's
pairwise merge of per-chunk moments), and exact quantiles with numpy's default (linear) interpolation, in one pass
over the data files as a rule:

* integer features are counted exactly (:class:`_Counts`: runs of consecutive values held equally often, an
  ``index`` one run per chunk), from which any rank is read;
* the others get a histogram of 65,536 bins per element (over the range the caller knows from the per-episode
  statistics, else the first chunk's), and keep, as they are binned, the values of the bins near each needed
  rank's place so far (:class:`_Keep`). Once every value is counted, the bins holding the needed ranks are known;
  where the values of all of them were kept, the ranks are read from those exactly; else one more pass, over those
  features' columns only, keeps those bins' values (:func:`_quantiles`).

Memory is a chunk of rows (:data:`CHUNK_ROWS`), the kept values (bounded by :data:`_KEPT_AT_MOST` per element and
:data:`_KEPT_FEATURE_AT_MOST` per feature) and the exact counts' runs (:data:`_RUNS_AT_MOST`); past those bounds a
feature takes the second pass instead.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import pyarrow as pa

from .._format.layout import Layout
from .._storage.source import Source
from ..errors import DatasetFormatError
from . import tabular

CHUNK_ROWS = 1 << 19  # rows decoded at a time: ~50 MB for a 12-float state and action with the frame columns
BINS = 1 << 16  # histogram bins per element, between an underflow and an overflow bin
_KEEP_AT_MOST = 1 << 22  # values an element may keep for its quantiles before its bins are made over its own range
_RUNS_AT_MOST = 1 << 21  # runs of an integer feature's exact counts (every element) before they are given up
_MARGIN_Z = 4.0  # the first pass keeps the values within this many standard errors of a needed rank's place
_MARGIN_MIN = 0.002  # ... and within this fraction of the values at least (scaled by the fraction left to count)
_KEPT_AT_MOST = 1 << 21  # values an element may keep in the first pass (8 MB of float32) before its feature stops
_KEPT_FEATURE_AT_MOST = 1 << 23  # ... and a feature's elements together (32 MB of float32: a 512-element feature
# kept at the per-element bound would hold 4 GB; past this, its quantiles take the second pass)
_INT64_TOP = 2 ** 63 - 2  # the largest value exact counts hold (a run ending past it would wrap in int64)


@dataclasses.dataclass
class FileRuns:
    """The rows of one data file a selection serves, as runs of consecutive rows (an episode, a window, a frame).

    Attributes:
        info: the file's footer facts (:func:`tabular.data_file_info`).
        start: int64, the first row of each run in the file (0-based, the manifest's ``data_row``), any order.
        count: int64, rows in each run (>= 1).
        index0: int64, the ``index`` the run's first row must hold (the next rows hold the next ones).
        weight: int64, the times the run is served; runs may overlap (two windows of one episode): a row counts
            once per run holding it.
    """

    info: tabular.DataFileInfo
    start: np.ndarray
    count: np.ndarray
    index0: np.ndarray
    weight: np.ndarray

    def sorted(self) -> "FileRuns":
        """The runs by first row."""
        o = np.argsort(self.start, kind="stable")
        return FileRuns(self.info, self.start[o], self.count[o], self.index0[o], self.weight[o])


def runs_of_rows(infos: list[tabular.DataFileInfo], file: np.ndarray, data_row: np.ndarray,
                 index: np.ndarray) -> list[FileRuns]:
    """A manifest's samples (row ``i``: data file ``infos[file[i]]``, its row ``data_row[i]``, holding ``index[i]``)
    as runs: consecutive rows holding consecutive indices join one run; a row served twice is two runs."""
    out = []
    for f in np.unique(file).tolist():
        mine = np.flatnonzero(file == f)
        rows, idx = data_row[mine], index[mine]
        o = np.lexsort((idx, rows))
        rows, idx = rows[o], idx[o]
        cut = np.flatnonzero((np.diff(rows) != 1) | (np.diff(idx) != 1)) + 1
        first = np.concatenate([[0], cut])
        count = np.diff(np.append(first, len(rows)))
        out.append(FileRuns(infos[f], rows[first], count.astype(np.int64), idx[first],
                            np.ones(len(first), np.int64)))
    return out


@dataclasses.dataclass
class _Moments:
    """One feature's running statistics, per element (its values given as ``(elements, rows)``)."""

    n: int = 0
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None

    def add(self, xt: np.ndarray, w: np.ndarray | None, lo: np.ndarray, hi: np.ndarray) -> None:
        """Add values ``xt`` (elements, rows): an element's values contiguous, as numpy reduces fastest; ``lo``,
        ``hi``: their min and max per element (the caller's, which the exact counts use too)."""
        xf = xt.astype(np.float64)
        if w is None:
            n_b = xt.shape[1]
            mean_b = xf.sum(1) / n_b
            xf -= mean_b[:, None]
            m2_b = np.einsum("ij,ij->i", xf, xf)
        else:
            n_b = int(w.sum())
            wf = w.astype(np.float64)
            mean_b = xf @ wf / n_b
            xf -= mean_b[:, None]
            m2_b = (xf * xf) @ wf
        if self.n == 0:
            self.n, self.lo, self.hi, self.mean, self.m2 = n_b, lo, hi, mean_b, m2_b
            return
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta * delta * (self.n * n_b / n)
        self.lo, self.hi, self.n = np.minimum(self.lo, lo), np.maximum(self.hi, hi), n


@dataclasses.dataclass
class _Bins:
    """Histogram bins of one feature's elements: bin ``b`` of element ``j`` holds the values ``v`` with
    ``floor((v - lo[j]) * scale[j]) == b - 1``, computed in float32 for float32 columns (bin 0: below ``lo``, bin
    ``BINS + 1``: at or above the top). Only two properties matter, and both hold in any float precision: a value's
    bin is the same in every pass, and it never decreases as the value grows."""

    lo: np.ndarray  # float64 (elements,), finite
    scale: np.ndarray  # float64 (elements,), > 0

    @classmethod
    def over(cls, lo: np.ndarray, hi: np.ndarray) -> "_Bins":
        lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            width = hi - lo
            ok = np.isfinite(width) & (width > 0)
            scale = np.where(ok, BINS / np.where(ok, width, 1.0), 1.0)
        return cls(np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(scale) & (scale > 0), scale, 1.0))

    def same(self, other: "_Bins") -> bool:
        return bool(np.array_equal(self.lo, other.lo) and np.array_equal(self.scale, other.scale))

    def one(self, j: int, x: np.ndarray, nan: bool = True) -> np.ndarray:
        """The bin of each of element ``j``'s values ``x`` (rows,), as intp (what bincount and take index with,
        uncopied; NaN: a bin of its own choosing, as an element holding a NaN has NaN quantiles): an element at a
        time, its temporaries a row of the chunk (the bincount after it then runs over one element's bins, which
        stay in cache). ``nan=False``: ``x`` holds no NaN (its min is a number)."""
        ft = np.float32 if x.dtype == np.float32 else np.float64
        with np.errstate(invalid="ignore", over="ignore"):
            t = np.subtract(x, ft(self.lo[j]), dtype=ft)  # (as x.astype(ft) - lo: the same bins as every pass)
            t *= ft(self.scale[j])
            t += 1  # below lo: [0, 1) truncates to bin 0
            np.clip(t, 0, BINS + 1, out=t)
            b = t.astype(np.intp)
        if nan and x.dtype.kind == "f" and b.min() < 0:  # (a NaN's cast, on x86)
            b[b < 0] = BINS + 1
        return b


@dataclasses.dataclass
class _Counts:
    """Exact counts of an integer feature's values, per element, kept as runs of consecutive values held equally
    often (an ``index`` is one run per chunk, an ``episode_index`` one per episode): its quantiles need no
    histogram and no second pass. Given up (``parts`` None) when a chunk's values span far more values than it
    has rows, or the runs kept exceed :data:`_RUNS_AT_MOST` (values too spread: the histogram's way then)."""

    parts: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] | None  # per element: (start, length, count)
    size: int = 0  # runs kept, every element

    @classmethod
    def of(cls, elements: int) -> "_Counts":
        return cls([[] for _ in range(elements)])

    def add(self, xt: np.ndarray, w: np.ndarray | None, lo: np.ndarray, hi: np.ndarray) -> None:
        """Add values ``xt`` (elements, rows), integers, ``lo``/``hi`` their min and max per element."""
        if self.parts is None:
            return
        if xt.dtype == np.bool_:
            xt = xt.view(np.uint8)
        wf = None if w is None else w.astype(np.float64)
        for j, x in enumerate(xt):
            base = int(lo[j])
            span = int(hi[j]) - base + 1
            # (a bincount over the span costs more than the chunk), or values the runs cannot hold: they are int64
            # and a run's end (start + length) must be one too; a uint64 above 2**63 - 2 or an int64 at its top
            # wrapped there (hostile review 22: negative quantiles, or a false "compute again"); binned instead
            if span > 4 * len(x) + BINS or int(hi[j]) > _INT64_TOP:
                self.parts = None
                return
            # (in int64: an int8 column's difference would wrap; a uint64 one's is exact as it is)
            d = x - lo[j] if x.dtype == np.uint64 else np.subtract(x, np.int64(base), dtype=np.int64)
            c = np.bincount(d.astype(np.intp, copy=False), weights=wf, minlength=span)
            if wf is not None:
                c = np.rint(c).astype(np.int64)
            at = np.flatnonzero(c)
            self.parts[j].append(_runs(at + base, c[at]))
            self.size += len(self.parts[j][-1][0])
        if self.size > _RUNS_AT_MOST // 2:  # merged, an element's chunks share their runs (frame_index)
            self.parts = [[_merged(p)] for p in self.parts]
            self.size = sum(len(p[0][0]) for p in self.parts)
            if self.size > _RUNS_AT_MOST // 2:
                self.parts = None

    def quantiles(self, n: int, quantiles: tuple[float, ...]) -> np.ndarray:
        """The exact quantiles of every element, ``(len(quantiles), elements)`` float64, numpy's linear method
        over ``n`` values.

        Raises:
            DatasetFormatError: the runs hold another count than ``n`` (cannot happen unless the counting is
                wrong: never a quantile of other values).
        """
        below, above, frac = _ranks(n, quantiles)
        out = []
        for parts in self.parts:
            runs = _merged(parts)
            held = int((runs[1] * runs[2]).sum())
            if held != n:
                raise DatasetFormatError(f"exact counts of {held} values where {n} were read; compute the "
                                         "statistics again")
            out.append(_lerp(_of_rank(runs, below), _of_rank(runs, above), frac))
        return np.stack(out, axis=1)


def _of_rank(runs: tuple[np.ndarray, np.ndarray, np.ndarray], r: np.ndarray) -> np.ndarray:
    """The values of ranks ``r`` (0-based) among disjoint sorted runs ``(start, length, count)``: the run holding
    the rank, then its place in it; float64, as the quantiles interpolate."""
    start, length, count = runs
    total = length * count
    cum = np.cumsum(total)
    i = np.searchsorted(cum, r, side="right")
    return (start[i] + (r - (cum[i] - total[i])) // count[i]).astype(np.float64)


def _runs(vals: np.ndarray, cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct sorted integers ``vals`` (int64) with their counts as runs ``(start, length, count)``: consecutive
    values of one count join."""
    cut = np.flatnonzero((np.diff(vals) != 1) | (np.diff(cnt) != 0)) + 1
    first = np.concatenate([[0], cut]).astype(np.int64)
    return vals[first].astype(np.int64), np.diff(np.append(first, len(vals))), cnt[first].astype(np.int64)


def _merged(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs ``(start, length, count)`` that may overlap (one per chunk), as disjoint sorted runs: where runs
    overlap, their counts add."""
    if len(parts) == 1:
        return parts[0]
    start, length, count = (np.concatenate(x) for x in zip(*parts))
    edges, at = np.unique(np.concatenate([start, start + length]), return_inverse=True)
    step = np.zeros(len(edges), np.int64)  # the count change at each edge
    np.add.at(step, at.reshape(-1), np.concatenate([count, -count]))
    held = np.cumsum(step)[:-1]  # the count of every value in [edges[i], edges[i + 1])
    keep = held > 0
    return edges[:-1][keep], np.diff(edges)[keep], held[keep]


@dataclasses.dataclass
class _Keep:
    """The values a binned feature keeps in the first pass so that its quantiles need no second one (a second
    pass reads its columns again: a third of the time on the 30M-frame scale set). Which bins will hold the needed
    ranks is known only once every value is counted; until then each element keeps the values of the bins that
    may: those within a margin of each needed rank's place in the values counted so far (``lut``). The margin
    shrinks as the pass goes on (what is left to count can move a rank less), and a bin that can no longer hold the
    rank whatever the rows left hold is dropped.

    Exactness does not rest on the margin: a bin is ``complete`` while every value counted in it was kept, and an
    element's kept values are used only when every bin holding a needed rank is complete (then they are exactly the
    values a second pass would keep); else that element is read again (:func:`_quantiles`). The margin is a bet on
    the values varying by run (episode) as independent draws: data whose distribution drifts along the files beyond
    it costs the second pass, never a value.
    """

    total: int  # values (weighted) the pass counts
    runs: int  # runs the selection holds (episodes, windows): the draws the margin counts
    need: np.ndarray  # int64, the needed ranks (0-based, sorted)
    lut: np.ndarray  # (elements, BINS + 2) bool: the bins whose values are kept from the chunk counted last
    complete: np.ndarray  # (elements, BINS + 2) bool: the bins whose every value counted so far was kept
    bins: _Bins  # the feature's (its kept values' bins are computed again when needed: half the memory)
    vals: list[list[np.ndarray]]  # per element: kept values, as read
    weights: list[list[np.ndarray | None]]  # per element: their weights (int64; None: a chunk served once)
    held: np.ndarray  # int64 (elements,): values kept
    pruned: np.ndarray  # int64 (elements,): values kept after the last pruning

    @classmethod
    def of(cls, bins: _Bins, elements: int, total: int, runs: int, quantiles: tuple[float, ...]) -> "_Keep":
        return cls(total, max(1, runs), _needed(total, quantiles), np.ones((elements, BINS + 2), bool),
                   np.ones((elements, BINS + 2), bool), bins, [[] for _ in range(elements)],
                   [[] for _ in range(elements)], np.zeros(elements, np.int64), np.zeros(elements, np.int64))

    def add(self, j: int, x: np.ndarray, b: np.ndarray, w: np.ndarray | None, got: np.ndarray, counts: np.ndarray,
            seen: int) -> None:
        """Element ``j``'s values ``x`` of a chunk, their bins ``b`` and weights ``w``, the chunk's counts per bin
        ``got``, and the element's histogram with them (``counts``, ``seen`` values): the bins to keep are chosen
        from the histogram (so the first chunk keeps no more than a later one), their values kept; a bin not kept
        that got values is no longer complete."""
        self._narrow(j, counts, seen)
        at = np.flatnonzero(np.take(self.lut[j], b))  # (take: twice as fast as lut[j][b])
        if len(at):
            self.vals[j].append(x[at])
            self.weights[j].append(None if w is None else w[at])
            self.held[j] += len(at)
        self.complete[j] &= self.lut[j] | (got == 0)

    def _narrow(self, j: int, counts: np.ndarray, seen: int) -> None:
        """Element ``j``'s bins to keep, once ``seen`` values of ``total`` are counted in ``counts`` (BINS + 2,)."""
        left = self.total - seen
        f = seen / self.total
        draws = self.runs * f  # (the runs counted so far, were they of one length)
        p = (self.need + 0.5) / self.total
        # The standard error of the fraction below a rank's value between the runs counted and those left, were
        # each run wholly on one side of it (the most runs can vary: frames of one episode move together)
        spread = np.sqrt(p * (1 - p) * (1 / max(draws, 1.0) + 1 / max(self.runs - draws, 1.0)))
        margin = (1 - f) * np.maximum(_MARGIN_Z * spread, _MARGIN_MIN) * seen  # in ranks of the counted values
        at = p * seen
        cum = np.cumsum(counts)
        # the bins over the counted ranks [at - margin, at + margin], within those that can still hold the rank
        # whatever the rows left hold (all ``left`` values below it, or none)
        lo = np.searchsorted(cum, np.maximum(at - margin, self.need - left), side="right")
        hi = np.searchsorted(cum, np.minimum(at + margin, self.need), side="right")
        lo, hi = np.minimum(lo, BINS + 1), np.minimum(hi, BINS + 1)
        ok = lo <= hi
        step = np.zeros(BINS + 3, np.int64)
        np.add.at(step, lo[ok], 1)
        np.add.at(step, hi[ok] + 1, -1)
        self.lut[j] = (np.cumsum(step[:BINS + 2]) > 0) & self.complete[j]
        if 2 * self.held[j] > 3 * self.pruned[j] + BINS:  # (values of bins dropped since: let go)
            self._prune(j)

    def _prune(self, j: int) -> None:
        x = np.concatenate(self.vals[j])
        b = self.bins.one(j, x)
        inside = np.take(self.lut[j], b)
        # a bin whose values are let go no longer holds all of its values, though it may get no more (the ranks
        # may come back to it: values drifting along the files); "complete" would hand over what is left of it
        # (hostile review 22: a false "the data files changed")
        self.complete[j][b[~inside]] = False
        at = np.flatnonzero(inside)
        w = self._weights(j)  # (before the values are replaced: it pairs each chunk's values with its weights)
        self.vals[j] = [x[at]]
        self.weights[j] = [None if w is None else w[at]]
        self.held[j] = self.pruned[j] = len(at)

    def _weights(self, j: int) -> np.ndarray | None:
        """Element ``j``'s kept values' weights, or None when none is weighted."""
        ws = self.weights[j]
        if all(w is None for w in ws):
            return None
        return np.concatenate([np.ones(len(v), np.int64) if w is None else w for v, w in zip(self.vals[j], ws)])

    def values(self, j: int, want: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Element ``j``'s values in bins ``want`` (those holding the needed ranks, once every value is counted)
        as :func:`_distinct` gives them, or None when some of those bins' values were not all kept."""
        if not self.complete[j][want].all():
            return None
        if not self.vals[j]:
            return np.zeros(0), np.zeros(0, np.int64)
        x = np.concatenate(self.vals[j])
        at = np.flatnonzero(np.isin(self.bins.one(j, x), want))
        w = self._weights(j)
        return _distinct(x[at].astype(np.float64), None if w is None else w[at])


@dataclasses.dataclass
class _Span:
    """Row groups of one data file read as one table, and the runs' rows in them."""

    info: tabular.DataFileInfo
    rgs: np.ndarray  # the row groups, sorted
    file_row: np.ndarray  # the file row of each row of the table read (the row groups back to back)
    runs: FileRuns  # the runs touching these row groups, sorted


def _spans(src: Source, files: list[FileRuns]) -> Iterator[_Span]:
    """The row groups the runs touch, in spans of about :data:`CHUNK_ROWS` rows, file by file.

    Raises:
        DatasetFormatError: a run lies beyond its file.
    """
    for fr in files:
        fr = fr.sorted()
        info = tabular.with_footer(src, fr.info)
        offsets = info.rg_offsets
        end = fr.start + fr.count
        if len(end) and (fr.start.min() < 0 or end.max() > offsets[-1]):
            raise DatasetFormatError(f"{src.path(info.rel)}: the selection names rows up to {int(end.max()) - 1} of a "
                                     f"file of {int(offsets[-1])} rows; build the selection again from this Database")
        first_rg = np.searchsorted(offsets, fr.start, side="right") - 1
        last_rg = np.searchsorted(offsets, end - 1, side="right") - 1
        rgs = np.unique(concat_ranges(first_rg, last_rg - first_rg + 1))
        sizes = offsets[rgs + 1] - offsets[rgs]
        at = 0
        while at < len(rgs):
            stop = at + max(1, int(np.searchsorted(np.cumsum(sizes[at:]), CHUNK_ROWS, side="right")))
            span = rgs[at:stop]
            file_row = concat_ranges(offsets[span], sizes[at:stop])
            at = stop
            hit = (fr.start <= file_row[-1]) & (end > file_row[0])
            yield _Span(info, span, file_row,
                        FileRuns(info, fr.start[hit], fr.count[hit], fr.index0[hit], fr.weight[hit]))


def _chunks(src: Source, layout: Layout, files: list[FileRuns], columns: list[str], *, check: bool = True
            ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
    """Each span of row groups the selection touches: ``({key: values (elements, rows)}, weight or None)`` of the
    rows it serves, each once (``weight``: the times each is served; None when all once), after checking that each
    row holds the ``index`` its runs say (``check``; a later pass over the same files skips it: a local file that
    changed since is refused by :func:`tabular.read_row_groups`, a remote one is pinned at the version read, and
    the quantile pass compares its counts with the first pass's). The next span is found (its file's footer parsed)
    and read in a thread while this one is reduced (Arrow and numpy both release the GIL: two cores overlap).

    Raises:
        DatasetFormatError: a row does not hold its index (the data changed since the selection was made, or a
            manifest of another dataset), a run lies beyond its file, or what :func:`tabular.read_row_groups`
            raises.
    """
    from concurrent.futures import ThreadPoolExecutor

    read = columns + ([] if "index" in columns or not check else ["index"])

    def loaded() -> Iterator[tuple[_Span, pa.Table]]:
        for sp in _spans(src, files):
            yield sp, tabular.read_row_groups(src, sp.info, sp.rgs.tolist(), layout, read, one_table=True,
                                              use_threads=True)[0]

    spans = loaded()
    with ThreadPoolExecutor(1, thread_name_prefix="lerobot_sql-stats") as pool:
        pending = pool.submit(next, spans, None)
        while True:
            got = pending.result()
            if got is None:
                return
            pending = pool.submit(next, spans, None)
            yield _served(src, layout, *got, columns, check)


def _served(src: Source, layout: Layout, sp: _Span, table: pa.Table, columns: list[str], check: bool = True
            ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """:func:`_chunks`' values of one span read (``table``)."""
    fr, file_row = sp.runs, sp.file_row
    a, b = int(file_row[0]), int(file_row[-1]) + 1
    s0, e0 = np.maximum(fr.start, a), np.minimum(fr.start + fr.count, b)
    contiguous = b - a == len(file_row)  # (the span's row groups follow on)
    # The usual span (whole episodes, each once): its runs tile its rows, so every row is served once and the
    # index check is a difference per run (the general way below builds a row number and a weight per row).
    whole = contiguous and len(s0) > 0 and int(s0[0]) == a and int(e0[-1]) == b and \
        bool((s0[1:] == e0[:-1]).all()) and bool((fr.weight == 1).all())
    if whole and check:
        held = table["index"].to_numpy()
        d = held - np.arange(a, b, dtype=held.dtype)  # index minus file row: constant within a run
        heads = s0 - a
        moved = np.flatnonzero(d[1:] != d[:-1]) + 1  # (where it changes: run heads only)
        whole = bool((d[heads] == fr.index0 - fr.start).all()) and \
            bool(np.isin(moved, heads, assume_unique=True).all())  # (else the general way names the row)
    if whole:
        served, w = None, None
    else:
        n = e0 - s0
        rows = concat_ranges(s0, n)
        pos = rows - a if contiguous else np.searchsorted(file_row, rows)  # (every row asked is in the span)
        if check:
            want = rows - np.repeat(fr.start, n) + np.repeat(fr.index0, n)
            held = table["index"].to_numpy()[pos]
            bad = held != want
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                raise DatasetFormatError(
                    f"{src.path(sp.info.rel)}: {int(bad.sum())} selected rows do not hold their sample's index (row "
                    f"{int(rows[j])} holds index {int(held[j])}, the selection says {int(want[j])}): the data "
                    "changed since the selection was made, or it describes another dataset; build the selection "
                    "again from this Database")
        wf = np.bincount(pos, weights=np.repeat(fr.weight, n).astype(np.float64), minlength=table.num_rows)
        served = np.flatnonzero(wf)
        w = np.rint(wf[served]).astype(np.int64)
        if len(served) == table.num_rows:
            served = None
        w = None if bool((w == 1).all()) else w
    values = {}
    for key in columns:
        x = np.asarray(tabular.RowGroupView(table.select([key]), layout).column(key)).reshape(table.num_rows, -1)
        values[key] = np.ascontiguousarray((x if served is None else x[served]).T)  # (elements, rows)
    return values, w


def concat_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, vectorised (int64)."""
    counts = np.asarray(counts, np.int64)
    total = int(counts.sum())
    step = np.ones(total, np.int64)
    if total:
        heads = np.cumsum(counts) - counts
        nonempty = counts > 0
        starts = np.asarray(starts, np.int64)[nonempty]
        heads = heads[nonempty]
        step[heads] = starts - np.concatenate([[0], starts[:-1] + counts[nonempty][:-1] - 1])
    return np.cumsum(step)


def _ranks(n: int, quantiles: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy's linear method: the ranks below and above each quantile (0-based) and the fraction between them."""
    q = np.asarray(quantiles, np.float64)
    h = (n - 1) * q  # numpy's virtual index, method "linear"
    below = np.clip(np.floor(h), 0, n - 1).astype(np.int64)
    above = np.minimum(below + 1, n - 1)
    return below, above, h - np.floor(h)


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's interpolation between neighbouring order statistics (``numpy.lib._function_base_impl._lerp``)."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def column_stats(src: Source, layout: Layout, files: list[FileRuns], keys: list[str], *,
                 quantiles: tuple[float, ...] = (), ranges: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
                 ) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of numeric features ``keys`` over the rows ``files`` serve, per element of each feature.

    Args:
        files: the selection's rows per data file (:func:`runs_of_rows`, or an episode per run); every file holds
            every key and ``index``.
        quantiles: fractions in [0, 1] whose exact quantiles to give (none: no histogram, no values kept).
        ranges: ``{key: (lo, hi)}`` per element, where the values are known to lie (the per-episode min and max of
            the episodes touched): the histogram's range (else the first chunk's). A value outside is still
            counted (in an edge bin, whose values are then kept), so a stale range costs time, never exactness.

    Returns:
        ``{key: {"min", "max": the column's dtype, "mean", "std": float64, "count": int64 (1,), "quantiles":
        float64 (len(quantiles), elements)}}``, arrays per element (flat ``(elements,)``).

    Raises:
        ValueError: ``files`` select no row.
        DatasetFormatError: as :func:`_chunks`.
    """
    keys = list(keys)
    moments = {k: _Moments() for k in keys}
    counts: dict[str, np.ndarray] = {}
    ranges = {k: r for k, r in (ranges or {}).items()  # (a range of another size is not this column's)
              if np.size(r[0]) == np.size(r[1]) == int(np.prod(layout.features[k].shape or (1,)))}
    integer = [k for k in keys if layout.features[k].dtype.startswith(("int", "uint", "bool"))]
    exact = {k: _Counts.of(int(np.prod(layout.features[k].shape or (1,)))) for k in integer} if quantiles else {}
    bins = {k: _Bins.over(*ranges[k]) for k in keys if k in ranges and k not in exact} if quantiles else {}
    keep: dict[str, _Keep] = {}  # the values a binned feature keeps for its quantiles in this pass
    total = sum(int((fr.count * fr.weight).sum()) for fr in files)
    runs = sum(len(fr.start) for fr in files)
    for values, w in _chunks(src, layout, files, keys):
        for k in keys:
            x = values[k]
            lo, hi = x.min(1), x.max(1)
            moments[k].add(x, w, lo, hi)
            if k in exact:
                exact[k].add(x, w, lo, hi)
                if exact[k].parts is None:  # (too spread: binned in a pass of its own below)
                    del exact[k]
            elif quantiles and k not in integer:
                if k not in bins:  # no range known: the first chunk's (a value outside lands in an edge bin)
                    bins[k] = _Bins.over(lo, hi)
                if k not in counts:
                    keep[k] = _Keep.of(bins[k], len(x), total, runs, quantiles)
                _count(counts, k, bins[k], x, w, keep.get(k), lo)
                if k in keep and (int(keep[k].held.max()) > _KEPT_AT_MOST or
                                  int(keep[k].held.sum()) > _KEPT_FEATURE_AT_MOST):  # (by a second pass)
                    del keep[k]
    n = next(iter(moments.values())).n if keys else 0
    if n == 0 and keys:
        raise ValueError("the selection serves no row: statistics of no samples are undefined")
    out = {}
    for k in keys:
        m = moments[k]
        out[k] = {"min": m.lo, "max": m.hi, "mean": m.mean, "std": np.sqrt(np.maximum(m.m2 / m.n, 0.0)),
                  "count": np.array([m.n], np.int64)}
    if quantiles and keys:
        # Binned again over the range the first pass found: an integer feature too spread for exact counts, and
        # a feature whose range (the metadata's, stale or hostile, or the first chunk's) the data far exceeds, so
        # that most values would be kept from a bin below.
        again = [k for k in keys if k not in exact and (
            k not in bins or (_kept_values(counts[k], n, quantiles) > _KEEP_AT_MOST
                              and not bins[k].same(_Bins.over(moments[k].lo, moments[k].hi))))]  # (else the same)
        if again:
            _histograms(src, layout, files, again, moments, bins, counts)
        binned = [k for k in keys if k not in exact]
        nan = {k: np.isnan(moments[k].lo.astype(np.float64)) for k in binned}  # (min propagates a NaN)
        need = _needed(n, quantiles)
        found = {k: [keep[k].values(j, want) for j, want in enumerate(_wanted_bins(counts[k], need))]
                 for k in binned if k in keep and k not in again}  # (binned again: other bins)
        got = _quantiles(src, layout, files, binned, n, quantiles, bins, counts, nan, found) if binned else {}
        for k in keys:
            out[k]["quantiles"] = got[k] if k in got else exact[k].quantiles(n, quantiles)
    return out


def _histograms(src: Source, layout: Layout, files: list[FileRuns], keys: list[str], moments: dict[str, _Moments],
                bins: dict[str, _Bins], counts: dict[str, np.ndarray]) -> None:
    """One pass over ``keys``' columns: their histograms over the range the moments found."""
    for k in keys:
        bins[k] = _Bins.over(moments[k].lo, moments[k].hi)
        counts.pop(k, None)
    for values, w in _chunks(src, layout, files, keys, check=False):
        for k in keys:
            _count(counts, k, bins[k], values[k], w)


def _needed(n: int, quantiles: tuple[float, ...]) -> np.ndarray:
    """The ranks (0-based, sorted, distinct) whose values the quantiles of ``n`` values interpolate between."""
    below, above, _ = _ranks(n, quantiles)
    return np.unique(np.concatenate([below, above]))


def _wanted_bins(counts: np.ndarray, need: np.ndarray) -> list[np.ndarray]:
    """Per element of histogram ``counts`` (elements, BINS + 2): the bins holding the ranks ``need``, sorted."""
    cum = np.cumsum(counts, axis=1)
    return [np.unique(np.searchsorted(cum[j], need, side="right")) for j in range(len(cum))]


def _kept_values(counts: np.ndarray, n: int, quantiles: tuple[float, ...]) -> int:
    """The most values any element of a feature keeps for its quantiles (the counts of its bins holding a needed
    rank), from its histogram ``counts`` (elements, BINS + 2)."""
    return max(int(counts[j][want].sum()) for j, want in enumerate(_wanted_bins(counts, _needed(n, quantiles))))


def _count(counts: dict[str, np.ndarray], key: str, bins: _Bins, x: np.ndarray, w: np.ndarray | None,
           keep: _Keep | None = None, lo: np.ndarray | None = None) -> None:
    """Add values ``x`` (elements, rows) to their histogram ``counts[key]`` (elements, BINS + 2) over ``bins``,
    weighted by ``w`` (rows,); ``keep`` keeps the values of its bins; ``lo``: their min per element, if known
    (an element whose min is a number holds no NaN)."""
    c = counts.get(key)
    if c is None:
        c = counts[key] = np.zeros((len(x), BINS + 2), np.int64)
    wf = None if w is None else w.astype(np.float64)
    for j in range(len(x)):
        b = bins.one(j, x[j], nan=lo is None or bool(np.isnan(lo[j])))
        got = np.bincount(b, weights=wf, minlength=BINS + 2)
        got = got if wf is None else np.rint(got).astype(np.int64)
        c[j] += got
        if keep is not None:
            keep.add(j, x[j], b, w, got, c[j], int(c[j].sum()))


def _quantiles(src: Source, layout: Layout, files: list[FileRuns], keys: list[str], n: int,
               quantiles: tuple[float, ...], bins: dict[str, _Bins], counts: dict[str, np.ndarray],
               nan: dict[str, np.ndarray], found: dict[str, list] | None = None) -> dict[str, np.ndarray]:
    """The exact quantiles of every element, ``(len(quantiles), elements)``: one pass keeps the values of the bins
    holding the needed ranks (distinct values with their counts), reading only the features with an element whose
    values ``found`` (``{key: [per element: what _Keep.values gave]}``, from the first pass) does not hold; a
    value's bin is monotone in the value, so in the kept values, sorted, each needed bin is one block and a rank is
    an offset into it. NaN where an element holds a NaN (numpy's answer).

    Raises:
        DatasetFormatError: the pass found other counts in those bins than the last (a file changed meanwhile).
    """
    below, above, frac = _ranks(n, quantiles)
    need = _needed(n, quantiles)
    wanted = {k: _wanted_bins(counts[k], need) for k in keys}  # per key and element: the bins holding a needed rank
    found = found or {}
    kept: dict[str, list[list]] = {k: [[] if got is None else [got] for got in found.get(k, [None] * len(wanted[k]))]
                                   for k in keys}
    todo = {k: [j for j, got in enumerate(found.get(k, [None] * len(wanted[k]))) if got is None] for k in keys}
    lut = {k: np.zeros((len(wanted[k]), BINS + 2), bool) for k in keys}  # wanted bins as a lookup per element
    for k in keys:
        for j, want in enumerate(wanted[k]):
            lut[k][j, want] = True
    read = [k for k in keys if todo[k]]
    for values, w in (_chunks(src, layout, files, read, check=False) if read else ()):
        for k in read:
            for j in todo[k]:
                x = values[k][j]
                at = np.flatnonzero(np.take(lut[k][j], bins[k].one(j, x)))
                if len(at):
                    kept[k][j].append(_distinct(x[at].astype(np.float64), None if w is None else w[at]))
    out = {}
    for k in keys:
        c = counts[k]
        cum = np.cumsum(c, axis=1)
        per_element = []
        for j, want in enumerate(wanted[k]):
            if nan[k][j]:
                per_element.append(np.full(len(quantiles), np.nan))
                continue
            vals, cnt = _distinct(*map(np.concatenate, zip(*kept[k][j]))) if kept[k][j] else \
                (np.zeros(0), np.zeros(0, np.int64))
            if int(cnt.sum()) != int(c[j][want].sum()):
                raise DatasetFormatError(f"feature {k!r}: the data files changed while their statistics were read "
                                         "(two passes counted different values); compute them again")
            kept_cum = np.cumsum(cnt)
            block = np.concatenate([[0], np.cumsum(c[j][want])])  # where each wanted bin starts among the kept
            bin_of = np.searchsorted(cum[j], need, side="right")
            first = cum[j][bin_of] - c[j][bin_of]  # the rank of each wanted bin's first value
            at = block[np.searchsorted(want, bin_of)] + (need - first)
            value = dict(zip(need.tolist(), vals[np.searchsorted(kept_cum, at, side="right")].tolist()))
            a = np.array([value[int(r)] for r in below], np.float64)
            bb = np.array([value[int(r)] for r in above], np.float64)
            per_element.append(_lerp(a, bb, frac))
        out[k] = np.stack(per_element, axis=1)
    return out


def _distinct(v: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``v``, sorted, with their counts (weighted by ``w``)."""
    if w is None:
        return np.unique(v, return_counts=True)
    vals, inv = np.unique(v, return_inverse=True)
    return vals, np.bincount(inv.reshape(-1), weights=w, minlength=len(vals)).astype(np.int64)
