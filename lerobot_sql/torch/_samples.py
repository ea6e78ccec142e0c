"""The per-sample table of a dataset: where each sample's data row and camera frames are, kept as runs.

:class:`SampleTable` cuts the manifest, once and vectorised, into *runs*: maximal stretches of consecutive samples
that are consecutive rows of one data row group (a *slot*: data file ``f``'s row group ``rg`` is slot
``rg_base[f] + rg``), of one episode and query result row, and read the same mp4 from the same ``from_timestamp``
for every camera. A whole episode is one run (a few when its rows span row groups), so the bookkeeping a dataset
holds grows with the episodes selected, not with their frames: every per-sample value (``index``, ``slot``,
``offset``, a camera's mp4 and the sample's place among that mp4's samples, ...) is its run's value plus the
sample's distance into the run, computed when asked (:class:`RunValues`, vectorised for batches).

The manifest itself and the runs table (:func:`run_table`) live in one named file (:func:`write_parts`) that
every process maps: forked DataLoader workers share its pages, and spawned/forkserver workers, which receive the
dataset pickled, map the same file by name instead of unpickling copies (the table pickles as its file's name and a
few per-file lists, kilobytes whatever the number of samples). Opening it reads the runs, not the manifest's pages.
The file is a scratch file under ``<cache>/manifests`` (:mod:`lerobot_sql._storage.scratch`): held by its writer's
lock while it lives, deleted by that process only, swept by a later one after a crash; or, for a whole-episode
selection, an entry of the selection cache (:mod:`lerobot_sql.torch._selections`), kept for the next open.

Nothing is built or decoded here: the video rows come from each mp4's index in the process that reads it
(:mod:`lerobot_sql.torch._worker`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa

from .._plan.clips import check_frames, check_window_frames
from .._readers import tabular
from .._storage import cache, scratch
from .._storage.source import Source
from ..errors import CacheError, DatasetFormatError


class Runs:
    """Where the runs start: ``start`` (int64, runs + 1 entries; run ``r`` is samples ``start[r]:start[r + 1]``)
    and the lookup of a sample's run (the last scalar lookup is remembered: an item asks for several values of the
    same sample)."""

    def __init__(self, start: np.ndarray):
        self.start = start
        self._last = (-1, 0)

    def of(self, i):
        """The run of sample ``i`` (an int) or of each of samples ``i`` (an int array)."""
        if isinstance(i, np.ndarray):
            return np.searchsorted(self.start, i, side="right") - 1
        last = self._last  # one read: helper threads decoding other cameras look up samples too
        if last[0] == i:
            return last[1]
        r = int(np.searchsorted(self.start, i, side="right")) - 1
        self._last = (i, r)
        return r


def sample_index(i, n: int):
    """``i`` (an int, an int array or a slice over ``n`` samples) as an int (negative counted from the end) or an
    int array, the forms the per-sample columns index by."""
    if isinstance(i, slice):
        return np.arange(*i.indices(n))
    if isinstance(i, np.ndarray):
        return i
    i = int(i)
    return i + n if i < 0 else i


def spans(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts`` items laid end to end: each item's group and its place in it (int64 arrays)."""
    owner = np.repeat(np.arange(len(counts)), counts)
    return owner, np.arange(int(np.sum(counts))) - np.repeat(np.cumsum(counts) - counts, counts)


class RunValues:
    """A per-sample column held per run: sample ``i`` of run ``r`` has ``per_run[r] + step * (i - start[r])``
    (``step`` 1 for values that count along the run: ``index``, the row offset; 0 for the run's constants).
    Indexed like the numpy array it stands for (an int, an int array, a slice); ``np.asarray`` materializes it."""

    def __init__(self, runs: Runs, per_run: np.ndarray, step: int = 0):
        self.runs, self.per_run, self.step = runs, per_run, step

    def __len__(self) -> int:
        return int(self.runs.start[-1])

    def __getitem__(self, i):
        if type(i) is int and i >= 0:  # (an item's scalar lookups, six per item: no length, no conversion)
            r = self.runs.of(i)
            v = self.per_run[r]
            return v + (i - self.runs.start[r]) if self.step else v
        i = sample_index(i, len(self))
        r = self.runs.of(i)
        v = self.per_run[r]
        if self.step:
            v = v + (i - self.runs.start[r])
        return v

    def __array__(self, dtype=None, copy=None):
        counts = np.diff(self.runs.start)
        out = np.repeat(self.per_run, counts)
        if self.step:
            out = out + (np.arange(len(out)) - np.repeat(self.runs.start[:-1], counts)).astype(out.dtype)
        return out if dtype is None else out.astype(dtype)


class CameraSamples:
    """One camera's samples: which mp4 each reads, where it sits among that mp4's samples, from which time."""

    def __init__(self, runs: Runs, files: list[str], run_code: np.ndarray, run_from_timestamp: np.ndarray):
        self.files = files  # the camera's mp4s (relative paths); ``code`` indexes this list
        self.runs, self._run_code = runs, run_code
        counts = np.diff(runs.start)
        # each run's first sample's place among its mp4's samples: the samples of the mp4's earlier runs
        order = np.argsort(run_code, kind="stable")
        c = counts[order]
        before = np.cumsum(c) - c  # samples of the runs before, in the code-grouped order
        first_of_code = np.searchsorted(run_code[order], run_code[order], side="left")
        base = np.empty(len(run_code), np.int64)
        base[order] = before - before[first_of_code]
        self.code = RunValues(runs, run_code)  # int32 per sample: its mp4
        self.position = RunValues(runs, base, step=1)  # int64 per sample: its place among its mp4's samples
        self.from_timestamp = RunValues(runs, run_from_timestamp)  # seconds: where its episode starts in the mp4

    def of_file(self, code: int) -> np.ndarray:
        """The samples (positions in the dataset, int64, ascending) reading mp4 ``code``."""
        r = np.flatnonzero(self._run_code == code)
        a, b = self.runs.start[r], self.runs.start[r + 1]
        counts = b - a
        return np.repeat(a - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(int(counts.sum()))


class Footers:
    """The data files' footers (:class:`lerobot_sql._readers.tabular.DataFileInfo`), indexed by file code: each
    parsed on first use in each process (a 5,000-row-group footer is ~40 ms); ``rels``, ``identities`` (at the
    open) and ``rg_offsets`` known without them. A footer parsed later must be of the same file version.

    Raises (from indexing):
        DatasetFormatError: the file changed since the dataset was opened (naming it, and to open it again).
    """

    def __init__(self, src: Source, rels: list[str], identities: list[str], rg_offsets: list[np.ndarray],
                 parsed: list | None = None):
        self.src, self.rels, self.identities, self.rg_offsets = src, list(rels), list(identities), rg_offsets
        self._parsed = list(parsed) if parsed is not None else [None] * len(self.rels)
        _OPEN_FOOTERS.add(self)

    def __setstate__(self, state):
        self.__dict__.update(state)
        _OPEN_FOOTERS.add(self)

    def __len__(self) -> int:
        return len(self.rels)

    def __getitem__(self, f: int):
        info = self._parsed[f]
        if info is None:
            info = tabular.data_file_info(self.src, self.rels[f])
            if info.identity != self.identities[f] or not np.array_equal(info.rg_offsets, self.rg_offsets[f]):
                raise DatasetFormatError(
                    f"{self.src.path(self.rels[f])}: the file changed after the dataset was opened (identity "
                    f"{self.identities[f]} then, {info.identity} now); open the dataset again to read the new version")
            self._parsed[f] = info
        return info

    def parse_all(self) -> None:
        """Parse every footer not parsed yet (see :func:`_before_fork`), for up to :data:`SHARE_FOOTERS` files: a
        dataset of more files (v2.x: a file per episode) leaves each worker to parse what it reads (92,000 footers
        would take the parent 17 s and 2 GB at the first fork, or as many round trips remotely)."""
        if len(self.rels) > SHARE_FOOTERS:
            return
        for f in range(len(self.rels)):
            self[f]

    def __getstate__(self):
        # a receiving process parses the footers it reads itself (each is megabytes pickled)
        return {**self.__dict__, "_parsed": [None] * len(self.rels)}


SHARE_FOOTERS = 256  # data files whose footers a process parses before a fork (see Footers.parse_all)

# Footers of this process's datasets, parsed before a fork: forked DataLoader workers then share one parse (a
# 5,000-row-group footer is ~32 MB) instead of each parsing the files it reads into private memory. A warm open
# parses none (it needs none), so the first DataLoader pays this once.
_OPEN_FOOTERS: "weakref.WeakSet[Footers]" = weakref.WeakSet()


def _before_fork() -> None:
    for footers in list(_OPEN_FOOTERS):
        with contextlib.suppress(Exception):  # noqa: BLE001  (a file gone or changed: its first read says so)
            footers.parse_all()


os.register_at_fork(before=_before_fork)


class SampleTable:
    """A manifest's per-sample values, held per run (see the module docstring).

    Per sample (:class:`RunValues`, indexed like arrays): ``file`` (int32, an index into ``data_files``), ``slot``
    (the row group, see ``rg_base``), ``offset`` (int64, the row in it), ``index``, ``episode_index``, ``ep_from`` /
    ``ep_to`` (the episode's index range), ``row0`` (the episode's first data row in its file); numpy views of the
    mapped manifest: ``timestamp``, ``task_index``; per camera a :class:`CameraSamples`. Per data file: ``infos``
    (footers), ``rg_base`` (its first slot); per slot: ``slot_file`` (its data file), ``rg_len`` (its rows).
    ``manifest`` is the mapped manifest table; ``runs`` the :class:`Runs`, ``run_episode`` each run's episode.

    Built from a manifest (``SampleTable(src, manifest, video_keys, cache_dir)``), its file a scratch file, or one
    kept under ``keep`` (a path in the selection cache, :mod:`lerobot_sql.torch._selections`); or mapped from such
    a kept file (:meth:`load`).
    """

    def __init__(self, src: Source, manifest: pa.Table, video_keys: list[str], cache_dir: Path,
                 keep: Path | None = None):
        m = manifest
        self.data_files, file_codes = codes(m["data_file"])
        parsed = [tabular.data_file_info(src, f) for f in self.data_files]  # (the planner parsed them: cached)
        self.infos = Footers(src, self.data_files, [i.identity for i in parsed], [i.rg_offsets for i in parsed],
                             parsed)
        self._slots()
        runs = run_table(m, file_codes, self.infos, self.rg_base, video_keys)
        self.video_files = json.loads(runs.schema.metadata[b"video_files"])
        self.map = _write(m, runs, cache_dir, keep)
        self._attach()

    @classmethod
    def from_episodes(cls, src: Source, manifest: pa.Table, episodes: pa.Table, infos: list, rules,
                      video_keys: list[str], cache_dir: Path, keep: Path | None = None) -> "SampleTable":
        """The table of a whole-episode (or window) selection opened without its frames
        (:func:`lerobot_sql._plan.episodes.episode_runs`: ``episodes`` one row per selected episode, ``infos`` the
        data files' footers, ``rules`` the :class:`~lerobot_sql._plan.clips.FrameRules`); ``manifest`` is the
        zero-row manifest carrying the metadata. Its runs are the episodes cut at row-group boundaries; the frames'
        ``timestamp`` and ``task_index`` are read per row group where first asked (:class:`FrameColumns`), which
        checks that row group's frames against the runs and ``rules``. The file holds the runs only (a few dozen
        bytes an episode), kept under ``keep`` like any selection."""
        self = cls.__new__(cls)
        self.data_files = [i.rel for i in infos]
        self.infos = Footers(src, self.data_files, [i.identity for i in infos], [i.rg_offsets for i in infos])
        self._slots()
        runs = episode_run_table(episodes, self.infos, video_keys, rules)
        self.video_files = json.loads(runs.schema.metadata[b"video_files"])
        self.map = _write(manifest, runs, cache_dir, keep)
        self._attach()
        return self

    @classmethod
    def load(cls, src: Source, kept: "SampleFile") -> "SampleTable":
        """The table of a kept file (a selection cache entry; see :meth:`SampleFile.read` for its errors)."""
        self = cls.__new__(cls)
        self.map = kept
        runs, m = kept.read()
        meta = runs.schema.metadata
        self.data_files = json.loads(meta[b"data_files"])
        self.video_files = json.loads(meta[b"video_files"])
        # the footers are parsed when a process first reads a file; their row-group offsets were kept with the runs
        # (and still describe the files: the entry's key holds each file's identity, checked again at the parse)
        offsets = [np.asarray(o, np.int64) for o in json.loads(meta[b"rg_offsets"])]
        self.infos = Footers(src, self.data_files, json.loads(meta[b"identities"]), offsets)
        self._slots()
        self._attach()
        return self

    def _slots(self) -> None:
        offsets = self.infos.rg_offsets
        counts = np.array([len(o) - 1 for o in offsets], np.int64)
        self.rg_base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.slot_file = np.repeat(np.arange(len(offsets), dtype=np.int32), counts)
        self.rg_len = np.concatenate([np.diff(o) for o in offsets]).astype(np.int64) if offsets else \
            np.zeros(0, np.int64)

    def _attach(self) -> None:
        """Map the file: the per-run columns into numpy, the manifest as zero-copy views; in the building process
        and in every process that unpickles the table alike."""
        t, m = self.map.read()
        self.manifest = m

        def run_col(name: str) -> np.ndarray:
            # zero-copy: numbers without nulls, as run_table wrote them (a copying to_numpy imports pandas: 0.3 s)
            col = t[name]
            arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            return arr.to_numpy(zero_copy_only=not arr.null_count)

        count = run_col("count")
        self.runs = runs = Runs(np.concatenate([[0], np.cumsum(count)]).astype(np.int64))
        run_file, run_row = run_col("file"), run_col("data_row")
        run_slot = np.zeros(len(count), np.int64)
        run_off = np.zeros(len(count), np.int64)
        for f, offsets in enumerate(self.infos.rg_offsets):
            sel = np.flatnonzero(run_file == f)
            rg, run_off[sel] = tabular.locate(offsets, run_row[sel])
            run_slot[sel] = rg + self.rg_base[f]
        self.run_episode = run_col("episode_index")
        self.file = RunValues(runs, run_file)
        self.slot = RunValues(runs, run_slot)
        self.offset = RunValues(runs, run_off, step=1)
        self.index = RunValues(runs, run_col("index"), step=1)
        self.episode_index = RunValues(runs, self.run_episode)
        self.ep_from = RunValues(runs, run_col("ep_from_index"))
        self.ep_to = RunValues(runs, run_col("ep_to_index"))
        self.row0 = RunValues(runs, run_col("ep_data_row0"))
        # (a selection opened without its frames) each run's result row; for windows its frames and their times
        self.run_result_row = run_col("result_row") if "result_row" in t.column_names else None
        self.run_window = {c: run_col(c) for c in ("sel_from_index", "sel_to_index", "lo_s", "hi_s")} \
            if "lo_s" in t.column_names else None

        self.n = int(runs.start[-1])

        def col(name: str) -> np.ndarray:  # zero-copy: no page of the manifest is read here
            return m[name].chunk(0).to_numpy() if m[name].num_chunks == 1 else m[name].to_numpy()

        rules = t.schema.metadata.get(b"frames")
        self.lazy = rules is not None  # opened without its frames (from_episodes): they are read per row group
        if self.lazy:
            from .._plan.clips import FrameRules
            from .._plan.manifest import Meta

            self.frames = FrameColumns(self, FrameRules(**json.loads(rules), clips=Meta.of(m).clips), run_slot,
                                       run_off, count)
            self.timestamp, self.task_index = self.frames.column("timestamp"), self.frames.column("task_index")
        else:
            self.timestamp, self.task_index = col("timestamp"), col("task_index")
        self.cameras = {k: CameraSamples(runs, names, run_col(f"{k}/file"), run_col(f"{k}/from_timestamp"))
                        for k, names in self.video_files.items()}

    def full_manifest(self) -> pa.Table:
        """(A selection opened without its frames) its manifest, one row per sample, with the columns and metadata
        of the zero-row manifest it keeps: every selected row group's frame columns are read (and checked)."""
        ep = np.asarray(self.episode_index)
        index, ep_from = np.asarray(self.index), np.asarray(self.ep_from)
        run_row = self.run_result_row
        if run_row is None:  # (an entry kept by an earlier version) whole episodes, each once: a row per episode
            run_row = np.cumsum(np.concatenate([[1], self.run_episode[1:] != self.run_episode[:-1]])) - 1 \
                if len(self.run_episode) else np.zeros(0, np.int64)
        values = {"index": index, "episode_index": ep, "frame_index": np.asarray(self.frames.column("frame_index")),
                  "timestamp": np.asarray(self.timestamp), "task_index": np.asarray(self.task_index),
                  "data_file": pa.DictionaryArray.from_arrays(pa.array(np.asarray(self.file), pa.int32()),
                                                              pa.array(self.data_files, pa.string())),
                  "data_row": np.asarray(self.row0) + (index - ep_from), "ep_from_index": ep_from,
                  "ep_to_index": np.asarray(self.ep_to), "ep_data_row0": np.asarray(self.row0),
                  "result_row": np.asarray(RunValues(self.runs, run_row.astype(np.int64)))}
        for k, cam in self.cameras.items():
            values[f"{k}/file"] = pa.DictionaryArray.from_arrays(pa.array(np.asarray(cam.code), pa.int32()),
                                                                 pa.array(cam.files, pa.string()))
            values[f"{k}/from_timestamp"] = np.asarray(cam.from_timestamp)
        schema = self.manifest.schema
        cols = []
        for field in schema:
            v = values.get(field.name)
            if v is None:  # a camera left out (cameras=[...]): its columns stay null, as the frames' path gives
                cols.append(pa.nulls(self.n, field.type))
            else:
                arr = v if isinstance(v, pa.Array) else pa.array(v)
                cols.append(arr.cast(field.type))
        return pa.Table.from_arrays(cols, schema=schema)

    def __getstate__(self):
        # the mapped arrays travel as the file's name (SampleFile pickles as its path): re-mapped on arrival
        state = dict(self.__dict__)
        for k in ("manifest", "runs", "run_episode", "file", "slot", "offset", "index", "episode_index", "ep_from",
                  "ep_to", "row0", "timestamp", "task_index", "cameras", "frames", "run_result_row", "run_window"):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._attach()

    def close(self) -> None:
        """Delete the shared file now, or let go of a kept one (see :meth:`SampleFile.close`)."""
        self.map.close()


def run_table(m: pa.Table, file_codes: np.ndarray, infos: "Footers", rg_base: np.ndarray,
              video_keys: list[str]) -> pa.Table:
    """The runs of manifest ``m`` (see the module docstring; ``file_codes``: each sample's data file, an index into
    ``infos.rels``) as a table, one row per run: ``count`` (samples), ``index``, ``data_row`` (its first sample's),
    ``episode_index``, ``ep_from_index``, ``ep_to_index``, ``ep_data_row0``, ``file`` (int32, into ``data_files``)
    and per camera ``<key>/file`` (int32, into the camera's mp4 list) and ``<key>/from_timestamp``; in the schema
    metadata the data files (``infos.rels``), their identities and row-group offsets, and the mp4 lists. One
    vectorised pass over the manifest."""
    n = m.num_rows
    data_files = infos.rels
    col = {name: m[name].to_numpy() for name in ("index", "data_row", "episode_index", "ep_from_index",
                                                 "ep_to_index", "ep_data_row0", "result_row")}
    slot = np.zeros(n, np.int64)
    order, starts = groups(file_codes, len(data_files))
    for f, offsets in enumerate(infos.rg_offsets):
        sel = order[starts[f]:starts[f + 1]]
        slot[sel] = tabular.locate(offsets, col["data_row"][sel])[0] + rg_base[f]
    # A run breaks wherever a value that is constant along a run changes, or one that counts along it skips.
    brk = np.zeros(n, bool)
    if n:
        brk[0] = True
    for name in ("episode_index", "ep_from_index", "ep_to_index", "ep_data_row0", "result_row"):
        _changes(col[name], brk)
    _changes(slot, brk)
    for name in ("index", "data_row"):
        v = col[name]
        brk[1:] |= v[1:] != v[:-1] + 1
    video_files, vcodes, vts = {}, {}, {}
    for k in video_keys:
        video_files[k], vcodes[k] = codes(m[f"{k}/file"])
        _changes(vcodes[k], brk)
        ts = vts[k] = m[f"{k}/from_timestamp"].to_numpy(zero_copy_only=False)
        brk[1:] |= ~((ts[1:] == ts[:-1]) | (np.isnan(ts[1:]) & np.isnan(ts[:-1])))
    first = np.flatnonzero(brk)
    cols = {"count": np.diff(np.append(first, n)).astype(np.int64), "file": file_codes[first]}
    for name in ("index", "data_row", "episode_index", "ep_from_index", "ep_to_index", "ep_data_row0"):
        cols[name] = col[name][first]
    for k in video_keys:
        cols[f"{k}/file"], cols[f"{k}/from_timestamp"] = vcodes[k][first], vts[k][first]
    return pa.table({c: pa.array(v) for c, v in cols.items()}).replace_schema_metadata(_run_meta(infos, video_files))


def _run_meta(infos: "Footers", video_files: dict[str, list[str]]) -> dict[bytes, bytes]:
    """The runs table's metadata: the data files, their identities and row-group offsets, each camera's mp4s."""
    return {b"data_files": json.dumps(infos.rels).encode(), b"video_files": json.dumps(video_files).encode(),
            b"identities": json.dumps(infos.identities).encode(),
            b"rg_offsets": json.dumps([o.tolist() for o in infos.rg_offsets]).encode()}


def _write(manifest: pa.Table, runs: pa.Table, cache_dir: Path, keep: Path | None) -> "SampleFile":
    """The per-sample file: kept under ``keep`` (a selection cache entry) when given and the cache can hold it, else
    a scratch file (a read-only or full cache: as for a query)."""
    if keep is not None:
        with contextlib.suppress(CacheError):
            return write_kept(manifest, runs, keep)
    return write_file(manifest, runs, cache_dir)


def episode_run_table(episodes: pa.Table, infos: "Footers", video_keys: list[str], rules) -> pa.Table:
    """The runs (:func:`run_table`'s columns and metadata, and ``result_row``) of whole episodes or windows, from
    their pointers alone (``episodes``: :func:`lerobot_sql._plan.episodes.episode_runs`'s table, ``file`` indexing
    ``infos``): each row's frames ``[sel_from_index, sel_to_index)``, rows of its episode's block from
    ``ep_data_row0``, cut at its file's row-group boundaries, in the table's order (a row with no frame has no run);
    for windows each run's ``sel_from_index``, ``sel_to_index``, ``lo_s``, ``hi_s`` too. The frame ``rules`` go into
    the metadata (``frames``), which marks the samples' frames as read per row group."""
    n_files = len(infos.rels)
    totals = np.array([o[-1] for o in infos.rg_offsets], np.int64)
    base = np.concatenate([[0], np.cumsum(totals)]).astype(np.int64)
    # every file's row groups on one axis of "global rows": a boundary between files is one between row groups
    bounds = np.concatenate([o[:-1] + base[f] for f, o in enumerate(infos.rg_offsets)] + [base[-1:]]).astype(np.int64) \
        if n_files else np.zeros(1, np.int64)
    f = episodes["file"].to_numpy().astype(np.int64)
    ep_from, ep_to = episodes["ep_from_index"].to_numpy(), episodes["ep_to_index"].to_numpy()
    sel_from, sel_to = episodes["sel_from_index"].to_numpy(), episodes["sel_to_index"].to_numpy()
    row0 = episodes["ep_data_row0"].to_numpy()
    keep = np.flatnonzero(sel_to > sel_from)  # an empty episode or window has no samples, hence no run
    a = base[f[keep]] + row0[keep] + (sel_from - ep_from)[keep]
    b = a + (sel_to - sel_from)[keep]
    rg_a = np.searchsorted(bounds, a, side="right") - 1
    rg_b = np.searchsorted(bounds, b - 1, side="right") - 1
    rep, k = spans(rg_b - rg_a + 1)  # each run's result row (among ``keep``) and its place among that row's runs
    rg = rg_a[rep] + k
    start = np.maximum(a[rep], bounds[rg])
    end = np.minimum(b[rep], bounds[rg + 1])
    e = keep[rep]  # the result row of each run
    cols = {"count": (end - start).astype(np.int64), "index": sel_from[e] + (start - a[rep]),
            "data_row": start - base[f[e]], "episode_index": episodes["episode_index"].to_numpy()[e],
            "ep_from_index": ep_from[e], "ep_to_index": ep_to[e], "ep_data_row0": row0[e],
            "file": f[e].astype(np.int32), "result_row": episodes["result_row"].to_numpy()[e]}
    if rules.windows:  # what the window checks need: its frames' range and the timestamps they lie in
        for c in ("sel_from_index", "sel_to_index", "lo_s", "hi_s"):
            cols[c] = episodes[c].to_numpy()[e]
    video_files = {}
    for key in video_keys:
        video_files[key], vcodes = codes(episodes[f"{key}/file"])
        cols[f"{key}/file"] = vcodes[e]
        cols[f"{key}/from_timestamp"] = episodes[f"{key}/from_timestamp"].to_numpy(zero_copy_only=False)[e]
    frames = {"fps": rules.fps, "limit": rules.limit, "in_clip": rules.in_clip, "positions": rules.positions,
              "windows": rules.windows}
    meta = {**_run_meta(infos, video_files), b"frames": json.dumps(frames).encode()}
    return pa.table({c: pa.array(v) for c, v in cols.items()}).replace_schema_metadata(meta)


def _episode_range(md, j: int, rg: int) -> tuple[float, float]:
    """The (min, max) of ``episode_index`` that row group ``rg``'s footer statistics give (``md`` the file's parsed
    footer, ``j`` the column's leaf position), or the whole line where there are none or they are not finite numbers
    (a column of another type than lerobot's int64): nothing is ruled out there."""
    st = md.row_group(rg).column(j).statistics
    if st is not None and st.has_min_max:
        lo, hi = st.min, st.max
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and math.isfinite(lo) and math.isfinite(hi):
            return lo, hi
    return -math.inf, math.inf


class FrameColumns:
    """The frame columns (``timestamp`` float32, ``task_index`` int64) of a selection opened without its frames
    (:meth:`SampleTable.from_episodes`), read per row group straight from its data file where this process first
    asks for one of its samples, and checked then (:func:`lerobot_sql._plan.clips.check_frames`: each row is
    the one the runs name, timestamps on the grid and in the clip). The last :data:`MAX_ROW_GROUPS` row groups
    read stay decoded (a few kilobytes each).

    Raises (from indexing):
        DatasetFormatError: the row group's frames fail the checks, or its file cannot be read (naming it).
    """

    MAX_ROW_GROUPS = 4096
    COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "task_index")

    def __init__(self, table: "SampleTable", rules, run_slot: np.ndarray, run_off: np.ndarray, count: np.ndarray):
        import collections

        self.t, self.rules = table, rules
        self._order = np.argsort(run_slot, kind="stable")  # the runs of each slot, to check its rows
        # slot s's runs are _order[_slot_runs[s]:_slot_runs[s + 1]] (8 bytes a row group; a lookup per row group
        # read, not a search)
        self._slot_runs = np.searchsorted(run_slot[self._order], np.arange(len(table.rg_len) + 1))
        self._run_off, self._count = run_off, count
        self._cache: "collections.OrderedDict[int, dict]" = collections.OrderedDict()
        self._locks = (os.getpid(), threading.Lock())  # item threads decoding other cameras ask too
        self._episode_column: dict[int, int] = {}  # data file -> its episode_index leaf column in the footer
        self._float32_time: dict[int, bool] = {}  # data file -> its timestamp column is float32, as lerobot's
        # the row groups this process has checked: a row group read again (a shuffled epoch reads each once per
        # item of it, past the decoded set's bound) is not checked again (a byte per row group of the files read)
        self._checked = np.zeros(len(table.rg_len), bool)

    def _lock(self) -> threading.Lock:
        """This process's lock: a forked child (a DataLoader worker) gets a new one, as the copy of one a parent's
        thread held at the fork would stay held in the child for good."""
        pid, lock = self._locks
        if pid != os.getpid():
            self._locks = pid, lock = os.getpid(), threading.Lock()
        return lock

    def column(self, name: str) -> "FrameColumn":
        return FrameColumn(self, name)

    def slot(self, slot: int) -> dict[str, np.ndarray]:
        """Row group ``slot``'s frame columns (its rows, as the file holds them), checked."""
        with self._lock():
            got = self._cache.get(slot)
            if got is not None:
                self._cache.move_to_end(slot)
                return got
        return self._put(slot, self._read(slot))

    def offer(self, slot: int, view: "tabular.RowGroupView") -> None:
        """Take row group ``slot``'s frame columns from ``view`` (the whole row group, which a process has just
        read for its items' data), checked, instead of reading them again; the numpy columns are the view's own,
        which the items then reuse."""
        with self._lock():
            if slot in self._cache:
                return
        f = int(self.t.slot_file[slot])
        as_stored = self._float32_time.get(f)
        if as_stored is None:
            as_stored = self._float32_time[f] = self.t.infos[f].schema.field("timestamp").type == pa.float32()
        if not as_stored:
            # (the view holds the timestamps cast to info.json's float32: the checks compare them as stored)
            self._put(slot, self._read(slot))
            return
        self._put(slot, self._columns(slot, None, view))

    def _put(self, slot: int, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock():
            self._cache[slot] = got
            while len(self._cache) > self.MAX_ROW_GROUPS:
                self._cache.popitem(last=False)
        return got

    def _read(self, slot: int) -> dict[str, np.ndarray]:
        t = self.t
        f = int(t.slot_file[slot])
        rg = slot - int(t.rg_base[f])
        (tbl,) = tabular.read_row_groups(t.infos.src, t.infos[f], [rg], None, list(self.COLUMNS))
        return self._columns(slot, tbl)

    def _columns(self, slot: int, tbl: pa.Table | None, view: "tabular.RowGroupView | None" = None
                 ) -> dict[str, np.ndarray]:
        """Row group ``slot``'s frame columns from ``tbl`` or else ``view`` (whose Arrow table is made only if a
        column needs a cast: a view of the row-group store has none), checked where this process first reads it."""
        t = self.t
        if tbl is None:
            tbl = _LazyTable(view)
        f = int(t.slot_file[slot])
        rel, src = t.data_files[f], t.infos.src
        cols = {}
        for c in self.COLUMNS:
            v = view.column(c) if view is not None else None
            cols[c] = v if isinstance(v, np.ndarray) else tbl[c].to_numpy()  # (a DECIMAL column: Python numbers)
        # the rows the runs of this slot cover, against the runs
        runs = self._order[self._slot_runs[slot]:self._slot_runs[slot + 1]]
        if len(runs) and not self._checked[slot]:
            if len(runs) == 1 and t.run_window is None:
                # (a row group per episode, lerobot's layout: the run's rows a slice, its constants broadcast; a
                # random item's first read of a row group, where gathering them cost as much as the checks)
                r0 = int(runs[0])
                a, n = int(self._run_off[r0]), int(self._count[r0])
                lo, hi = int(t.ep_from.per_run[r0]), int(t.ep_to.per_run[r0])
                first = int(t.index.per_run[r0])
                rows = slice(a, a + n)
                check_frames(self.rules, src.path(rel), cols["index"][rows], cols["episode_index"][rows],
                             cols["frame_index"][rows], cols["timestamp"][rows], np.arange(first, first + n),
                             np.full(n, t.run_episode[r0], np.int64), np.full(n, lo, np.int64),
                             np.full(n, hi - lo, np.int64))
            else:
                rep, k = spans(self._count[runs])
                rows = self._run_off[runs][rep] + k
                r = runs[rep]
                index = t.index.per_run[r] + k  # (each row's index: its run's first, counted along the run)
                if t.run_window is None:
                    ep_from, ep_to = t.ep_from.per_run[r], t.ep_to.per_run[r]
                    check_frames(self.rules, src.path(rel), cols["index"][rows], cols["episode_index"][rows],
                                 cols["frame_index"][rows], cols["timestamp"][rows], index, t.run_episode[r],
                                 ep_from, ep_to - ep_from)
                else:  # (these checks of every row of the windows' episodes here, a superset of the runs' rows)
                    self._check_windows(slot, cols, runs, rows, r, index)
            self._check_edges(slot, cols, runs)
            self._checked[slot] = True
        # (as stored by lerobot, float32 and int64: no cast; another type through Arrow's checked cast)
        ts, task = cols["timestamp"], cols["task_index"]
        return {"timestamp": ts if ts.dtype == np.float32 else tbl["timestamp"].cast(pa.float32()).to_numpy(),
                "task_index": task if task.dtype == np.int64 else tbl["task_index"].cast(pa.int64()).to_numpy(),
                "frame_index": cols["frame_index"]}


    def _episodes_here(self, slot: int, runs: np.ndarray):
        """For the episodes of ``runs`` (runs of row group ``slot``): one run of each, and their rows in the slot:
        ``(u, rows, run)`` (``u`` a run per episode; ``rows`` slot rows; ``run`` the run of ``u`` each row is of)."""
        t = self.t
        f = int(t.slot_file[slot])
        start = int(t.infos.rg_offsets[f][slot - int(t.rg_base[f])])  # the slot's first row in its file
        ep = t.run_episode[runs]
        _, at = np.unique(ep, return_index=True)
        u = runs[at]
        row0, length = t.row0.per_run[u], t.ep_to.per_run[u] - t.ep_from.per_run[u]
        a = np.maximum(row0 - start, 0)
        b = np.minimum(row0 + length - start, int(t.rg_len[slot]))
        rep, k = spans(np.maximum(b - a, 0))
        return u, a[rep] + k, u[rep], start

    def _check_edges(self, slot: int, cols: dict, runs: np.ndarray) -> None:
        """The rows just before and after each episode of ``runs`` in its data file (where meta/episodes says the
        episode begins and ends) must hold the index before and after its range and another episode: else
        meta/episodes' range is shorter than the episode's rows, and the frames past it would be left out. A row
        in an adjacent row group is judged from that row group's ``episode_index`` statistics in the footer when
        they exclude the episode, else read."""
        t = self.t
        f = int(t.slot_file[slot])
        rg = slot - int(t.rg_base[f])
        start = int(t.infos.rg_offsets[f][rg])
        here, total = int(t.rg_len[slot]), int(t.infos.rg_offsets[f][-1])
        eps = t.run_episode[runs]
        if len(runs) == 1 or (eps == eps[0]).all():  # one episode (a row group per episode): in Python's ints
            r = int(runs[0])
            ep, lo, hi, row0 = int(eps[0]), int(t.ep_from.per_run[r]), int(t.ep_to.per_run[r]), int(t.row0.per_run[r])
            for row, want, side in ((row0 - 1, lo - 1, "before"), (row0 + hi - lo, hi, "after")):
                if 0 <= row < total:
                    at = row - start
                    got = (int(cols["index"][at]), int(cols["episode_index"][at])) if 0 <= at < here else \
                        self._row_elsewhere(f, row, ep, rg + (1 if at >= here else -1))
                    if got is not None and (got[1] == ep or got[0] != want):
                        self._edge_error(f, side, 0, runs[:1], got)
            return
        u = runs[np.unique(eps, return_index=True)[1]]
        ep, ep_from, ep_to, row0 = t.run_episode[u], t.ep_from.per_run[u], t.ep_to.per_run[u], t.row0.per_run[u]
        for row, want, side in ((row0 - 1, ep_from - 1, "before"), (row0 + (ep_to - ep_from), ep_to, "after")):
            at = row - start
            inside = (at >= 0) & (at < here)
            # (vectorised over the rows in this row group; those in another, at most one per side, one by one)
            k = np.flatnonzero(inside)
            bad = k[(cols["index"][at[k]] != want[k]) | (cols["episode_index"][at[k]] == ep[k])]
            if len(bad):
                j = int(bad[0])
                self._edge_error(f, side, j, u, (int(cols["index"][at[j]]), int(cols["episode_index"][at[j]])))
            for j in np.flatnonzero(~inside & (row >= 0) & (row < total)).tolist():
                got = self._row_elsewhere(f, int(row[j]), int(ep[j]))
                if got is not None and (got[1] == int(ep[j]) or got[0] != int(want[j])):
                    self._edge_error(f, side, j, u, got)

    def _edge_error(self, f: int, side: str, j: int, u: np.ndarray, got: tuple[int, int]):
        t = self.t
        r = int(u[j])
        ep, lo, hi, row0 = int(t.run_episode[r]), int(t.ep_from.per_run[r]), int(t.ep_to.per_run[r]), int(t.row0.per_run[r])
        want = lo - 1 if side == "before" else hi
        raise DatasetFormatError(
            f"{t.infos.src.path(t.data_files[f])}: the row {side} episode {ep}'s frames (meta/episodes: index "
            f"{lo}..{hi - 1}, rows {row0}..{row0 + hi - lo - 1} of this file) holds index {got[0]} of episode {got[1]}, "
            f"where index {want} of another episode belongs: meta/episodes' range disagrees with the data's rows, so "
            "frames would be left out or taken from another episode. Restore meta/episodes from the dataset's "
            "source (`lerobot-sql doctor`: episode_ranges), or read every frame at the open (set LSQL_LAZY_FRAMES "
            "above the selection's frame count)")

    def _row_elsewhere(self, f: int, row: int, episode: int, near: int | None = None) -> tuple[int, int] | None:
        """(index, episode_index) of data file ``f``'s row ``row`` (in another row group than the one being read),
        or None when that row group's footer statistics say no row of it belongs to ``episode`` (``near``: the row
        group that likely holds it, looked at before a search)."""
        t = self.t
        info = t.infos[f]
        offsets = t.infos.rg_offsets[f]
        rg = near if near is not None and offsets[near] <= row < offsets[near + 1] else \
            int(np.searchsorted(offsets, row, side="right")) - 1
        md = info.metadata
        if md is not None:
            j = self._episode_column.get(f)
            if j is None:  # (the leaf column's position, once per file)
                names = [md.schema.column(i).path for i in range(md.num_columns)]
                j = self._episode_column[f] = names.index("episode_index") if "episode_index" in names else -1
            # (a row group's statistics when asked, ~5 us: gathering a file's 5,000 at once costs 50 ms, as much as
            # parsing its footer, which a random read's first item of each file would pay)
            if j >= 0:
                lo, hi = _episode_range(md, j, rg)
                if not lo <= episode <= hi:
                    return None
        (tbl,) = tabular.read_row_groups(t.infos.src, info, [rg], None, ["index", "episode_index"])
        at = row - int(offsets[rg])
        return int(tbl["index"][at].as_py()), int(tbl["episode_index"][at].as_py())

    def _check_windows(self, slot: int, cols: dict, runs: np.ndarray, rows: np.ndarray, r: np.ndarray,
                       index: np.ndarray) -> None:
        """(windows planned on the fps grid) Check the rows ``rows`` of row group ``slot`` (``cols``: its frame
        columns as read; ``r``: each row's run, ``index`` its index) and, for this slot's runs that begin or end a
        window, the frame just before or after the window (read from the next row group when it lies there):
        :func:`lerobot_sql._plan.clips.check_window_frames`."""
        t = self.t
        w = t.run_window
        f = int(t.slot_file[slot])
        rel, src = t.data_files[f], t.infos.src
        ep_from, ep_to = t.ep_from.per_run, t.ep_to.per_run
        first_index = t.index.per_run[runs]
        # the neighbours: (run, its index, its row in this slot, which may be -1 or past the slot's last row)
        before = runs[(first_index == w["sel_from_index"][runs]) & (w["sel_from_index"][runs] > ep_from[runs])]
        last_index = first_index + self._count[runs] - 1
        after = runs[(last_index == w["sel_to_index"][runs] - 1) & (w["sel_to_index"][runs] < ep_to[runs])]
        n_idx = np.concatenate([w["sel_from_index"][before] - 1, w["sel_to_index"][after]]).astype(np.int64)
        n_run = np.concatenate([before, after])
        n_row = np.concatenate([self._run_off[before] - 1, self._run_off[after] + self._count[after]])
        # every row of these episodes in this slot, not only the windows': where the pointers put it, on the grid,
        # in the clip, at its position (a frame two away from a window cannot then lie in it)
        _, e_rows, e_run, start = self._episodes_here(slot, runs)
        e_index = ep_from[e_run] + (start + e_rows - t.row0.per_run[e_run])
        check_frames(self.rules, src.path(rel), cols["index"][e_rows], cols["episode_index"][e_rows],
                     cols["frame_index"][e_rows], cols["timestamp"][e_rows], e_index, t.run_episode[e_run],
                     ep_from[e_run], ep_to[e_run] - ep_from[e_run])
        got = {c: [cols[c][rows], cols[c][e_rows]] for c in self.COLUMNS}
        inside = [np.ones(len(rows), bool), np.ones(len(e_rows), bool)]
        all_r, all_index = [r, e_run], [index, e_index]
        lo_any, hi_any = [w["lo_s"][r], np.full(len(e_rows), -np.inf)], [w["hi_s"][r], np.full(len(e_rows), np.inf)]
        here = (n_row >= 0) & (n_row < int(t.rg_len[slot]))
        parts = [(n_run[here], n_idx[here], n_row[here], cols)]
        for other, sel in ((slot - 1, n_row < 0), (slot + 1, n_row >= int(t.rg_len[slot]))):
            if sel.any():  # (the neighbour opens or closes the adjacent row group of the same file: read it)
                rg = other - int(t.rg_base[f])
                (tbl,) = tabular.read_row_groups(src, t.infos[f], [rg], None, list(self.COLUMNS))
                at = n_row[sel] + (int(t.rg_len[other]) if other < slot else -int(t.rg_len[slot]))
                parts.append((n_run[sel], n_idx[sel], at, {c: tbl[c].to_numpy() for c in self.COLUMNS}))
        for nr, ni, at, src_cols in parts:
            if len(nr):
                ep_f = ep_from[nr]
                # the neighbour is a frame of the episode where the pointers put it: the checks every read row gets
                check_frames(self.rules, src.path(rel), src_cols["index"][at], src_cols["episode_index"][at],
                             src_cols["frame_index"][at], src_cols["timestamp"][at], ni, t.run_episode[nr], ep_f,
                             ep_to[nr] - ep_f)
                for c in self.COLUMNS:
                    got[c].append(src_cols[c][at])
                inside.append(np.zeros(len(nr), bool))
                all_r.append(nr)
                all_index.append(ni)
                lo_any.append(w["lo_s"][nr])
                hi_any.append(w["hi_s"][nr])
        r_all, idx_all = np.concatenate(all_r), np.concatenate(all_index)
        # (the episodes' rows: their position only, as "inside" (-inf, inf); the windows' rows and neighbours: both)
        check_window_frames(src.path(rel), t.run_episode[r_all], t.run_result_row[r_all], idx_all,
                            idx_all - ep_from[r_all], np.concatenate(got["frame_index"]),
                            np.concatenate(got["timestamp"]).astype(np.float64), np.concatenate(lo_any),
                            np.concatenate(hi_any), np.concatenate(inside))


class _LazyTable:
    """``view.table[c]``, with the table made at the first column asked (rarely: a cast the checks need)."""

    def __init__(self, view: "tabular.RowGroupView"):
        self.view = view

    def __getitem__(self, c: str):
        return self.view.table[c]


class FrameColumn:
    """One frame column of a :class:`FrameColumns`, indexed by sample like the array it stands for (an int, an
    int array, a slice)."""

    def __init__(self, frames: FrameColumns, name: str):
        self.frames, self.name = frames, name

    def __len__(self) -> int:
        return self.frames.t.n

    def __getitem__(self, i):
        t = self.frames.t
        i = sample_index(i, len(self))
        if not isinstance(i, np.ndarray):
            return self.frames.slot(int(t.slot[i]))[self.name][int(t.offset[i])]
        slot, off = t.slot[i], t.offset[i]
        out = np.empty(len(i), np.float32 if self.name == "timestamp" else np.int64)  # as the manifest's
        for s in np.unique(slot):
            m = slot == s
            out[m] = self.frames.slot(int(s))[self.name][off[m]]
        return out

    def __array__(self, dtype=None, copy=None):
        out = self[np.arange(len(self))]
        return out if dtype is None else out.astype(dtype)


def _changes(v: np.ndarray, brk: np.ndarray) -> None:
    """Mark in ``brk`` each position where ``v`` differs from the one before."""
    brk[1:] |= v[1:] != v[:-1]


def codes(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    """(the distinct values, int32 code per row) of a string column."""
    enc = column.combine_chunks().dictionary_encode()
    return enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False).astype(np.int32)


def groups(codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): ``order[starts[c]:starts[c + 1]]`` are the positions holding code ``c``, ascending.
    A stable sort, linear on the usual already-grouped codes."""
    order = np.argsort(codes, kind="stable").astype(np.int32)  # manifests stay far below 2**31 rows
    starts = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=k))]).astype(np.int64)
    return order, starts


def check_positions(manifest: pa.Table) -> None:
    """Refuse, for ``align="frame_index"``, samples whose ``frame_index`` is not their position in the episode
    (``index - ep_from_index``): frames are read by position, so the item's frame_index must name the frame it
    carries. One vectorised pass over the manifest.

    Raises:
        DatasetFormatError: naming the first such episode, its index and frame_index, and the fix.
    """
    fi = manifest["frame_index"].to_numpy()
    pos = manifest["index"].to_numpy() - manifest["ep_from_index"].to_numpy()
    bad = np.flatnonzero(fi != pos)
    if len(bad):
        j = int(bad[0])
        ep = manifest["episode_index"][j].as_py()
        raise DatasetFormatError(
            f"episode {ep}: the row with index {int(manifest['index'][j].as_py())} has frame_index {int(fi[j])}, but "
            f"it is frame {int(pos[j])} of the episode (index - the episode's first index; {len(bad)} such rows "
            "selected): align=\"frame_index\" reads each row's frame by its position, so the item would carry a "
            "frame_index that is not its frame's. Fix the data files' frame_index (`lerobot-sql doctor`: "
            "frame_index_contiguous), or read by time (align=\"timestamp\")")


# ---- the shared file -------------------------------------------------------------------------------------------
TAG = "lsql-samples"  # scratch name: lsql-samples-<host>-<pid>-<random>.arrow
MAPS: "weakref.WeakValueDictionary[str, SampleFile]" = weakref.WeakValueDictionary()  # this process's own files


def file_prefix() -> str:
    """``lsql-samples-<host>-<pid>-``: who wrote a per-sample file, so a later run can tell a leftover."""
    return scratch.owner_prefix(TAG)


def write_file(manifest: pa.Table, runs: pa.Table, cache_dir: Path) -> "SampleFile":
    """Write the manifest and its runs (:func:`run_table`) to one named scratch file (:class:`SampleFile`, the
    layout in :func:`write_parts`).

    The file lives in ``<cache>/manifests`` (or the system temp folder when the cache is read-only) while the
    dataset that wrote it lives: its pages are file-backed, so forked DataLoader workers share them through the
    page cache, and spawned/forkserver workers, which get the dataset pickled, map the same file by name. Before
    writing, files whose writer is gone (killed before cleanup: its lock is free) are removed.

    Raises:
        CacheError: neither the cache folder nor the temp folder can hold the file.
    """
    d = cache_dir / cache.MANIFESTS
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=file_prefix(), suffix=".arrow")
    except OSError:
        # A read-only cache with complete entries stays usable: this file is transient.
        d = Path(tempfile.gettempdir())
        try:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=file_prefix(), suffix=".arrow")
        except OSError as e:
            raise CacheError(f"{cache_dir / cache.MANIFESTS}: cannot write the per-sample file ({e}); the cache folder "
                             "is full or not writable, set LSQL_CACHE_DIR (or connect(..., cache_dir=...)) to a "
                             "writable folder") from e
    scratch.hold(fd)  # before anything else: a sweeping process must see the file as live from its first moment
    scratch.sweep(d, TAG, ".arrow", keep=tmp)
    try:
        write_parts(tmp, manifest, runs)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
            os.close(fd)
        raise CacheError(f"{d}: cannot write the per-sample file ({e}); the cache folder is full or not writable, "
                         "set LSQL_CACHE_DIR (or connect(..., cache_dir=...)) to a writable folder with room") from e
    return SampleFile(tmp, owner=True, fd=fd)


def write_kept(manifest: pa.Table, runs: pa.Table, path: Path) -> "SampleFile":
    """Write the file of a selection cache entry at ``path`` (whole or not at all: a temporary name renamed into
    place; its checksum sidecar first), and hold it (:class:`SampleFile` with ``kept=True``).

    Raises:
        CacheError: the cache folder cannot hold it.
    """
    try:
        # with its checksum sidecar, as every cache entry: a later open checks it once (lerobot_sql._storage.cache);
        # its key inside, so that a file copied over another entry is not taken for it
        runs = runs.replace_schema_metadata({**runs.schema.metadata, b"entry": path.stem.encode()})
        cache.build_once(path, lambda tmp: write_parts(tmp, manifest, runs), checksum=True)
    except OSError as e:
        raise cache.cache_error(path.parent, f"cannot write a selection's per-sample file ({e})") from e
    return SampleFile(str(path), owner=False, kept=True)


_MAGIC = b"LSQLRUNS"
_TRAILER = 24  # the manifest part's length, the runs part's offset (8 bytes each, little-endian), _MAGIC


def write_parts(path: str, manifest: pa.Table, runs: pa.Table) -> None:
    """The per-sample file: the manifest as an Arrow IPC file (from byte 0, so its pages map in place), the runs
    table as a second one (64-byte aligned), then :data:`_TRAILER`."""
    with pa.OSFile(path, "wb") as sink:
        with pa.ipc.new_file(sink, manifest.schema) as w:
            w.write_table(manifest.combine_chunks())
        m_len = sink.tell()
        pad = (-m_len) % 64
        sink.write(b"\0" * pad)
        part = pa.BufferOutputStream()
        with pa.ipc.new_file(part, runs.schema) as w:
            w.write_table(runs)
        sink.write(part.getvalue())
        sink.write(m_len.to_bytes(8, "little") + (m_len + pad).to_bytes(8, "little") + _MAGIC)


def read_parts(path: str) -> tuple[pa.Table, pa.Table]:
    """(runs, manifest) of a per-sample file, memory-mapped (zero-copy).

    Raises:
        OSError: the file cannot be mapped. ValueError / pyarrow.ArrowInvalid: it is not a whole per-sample file.
    """
    buf = pa.memory_map(path, "r").read_buffer()
    size = buf.size
    tail = buf.slice(max(0, size - _TRAILER)).to_pybytes()
    if size < _TRAILER or tail[16:] != _MAGIC:
        raise ValueError(f"{path}: not a whole per-sample file (no trailer)")
    m_len, r_off = int.from_bytes(tail[:8], "little"), int.from_bytes(tail[8:16], "little")
    if not 0 < m_len <= r_off < size - _TRAILER:
        raise ValueError(f"{path}: not a whole per-sample file (its trailer points outside it)")
    runs = pa.ipc.open_file(buf.slice(r_off, size - _TRAILER - r_off)).read_all()
    return runs, pa.ipc.open_file(buf.slice(0, m_len)).read_all()


def _remove(path: str, pid: int, fd: int | None) -> None:
    # Only the writing process deletes: a forked worker inherits this finalizer with the dataset, and must never
    # take the file from under the parent and its other workers.
    if os.getpid() == pid:
        with contextlib.suppress(OSError):  # Windows refuses while mapped: the next run's sweep removes it
            os.unlink(path)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # releases the lock


class SampleFile:
    """The per-sample file of a dataset (manifest + derived arrays, Arrow IPC), shared by name.

    The writing process owns it and holds an exclusive ``flock`` on it while it lives (so other processes can tell
    a leftover: :func:`lerobot_sql._storage.scratch.is_leftover`): a finalizer deletes it when the last object
    holding it there is collected, on ``close()``, or at interpreter exit, never in another process (forked
    children inherit the finalizer but fail its pid check; spawned ones only ever receive the name). It pickles as
    its path: unpickled in the owner process (``copy.deepcopy``, ``pickle`` round trips) it is the owner's object,
    so the file lives while any copy does; elsewhere a non-owning handle. Several datasets and processes never
    share a file (each name is unique).
    """

    def __init__(self, path: str, owner: bool, fd: int | None = None, kept: bool = False):
        self.path, self.kept = path, kept
        self._fin = weakref.finalize(self, _remove, path, os.getpid(), fd) if owner else None
        if owner:
            MAPS[path] = self
        if kept:  # a selection cache entry: a shared lock while in use, so that no eviction takes it
            self._fin = weakref.finalize(self, _release, _hold_shared(path))

    def read(self) -> tuple[pa.Table, pa.Table]:
        """The file's (runs, manifest) tables, memory-mapped (zero-copy; :func:`read_parts`).

        Raises:
            CacheError: the file is gone: its owner dataset was closed or collected (or its cache folder was
                cleaned) before this copy of the dataset was unpickled.
        """
        try:
            return read_parts(self.path)
        except FileNotFoundError as e:
            raise CacheError(f"{self.path}: the dataset's per-sample file is gone; a pickled dataset (a spawned "
                             "DataLoader worker's copy) maps the file of the dataset it was pickled from, which "
                             "must stay alive (not closed, not collected, its cache folder not cleaned) while "
                             "copies start. Build the dataset again (db.dataset(...))") from e
        except (OSError, ValueError, pa.ArrowInvalid) as e:
            raise CacheError(f"{self.path}: cannot map the dataset's per-sample file ({e})") from e

    def close(self) -> None:
        if self._fin is not None:
            self._fin()

    def __reduce__(self):
        return (_attach, (self.path, self.kept))


def _attach(path: str, kept: bool = False) -> SampleFile:
    own = MAPS.get(path)
    return own if own is not None else SampleFile(path, owner=False, kept=kept)


def _hold_shared(path: str) -> int | None:
    """An open descriptor of ``path`` under a shared ``flock`` (None where locks do not exist or it is gone)."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        return None
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return fd


def _release(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
