"""The per-sample table of a dataset: where each sample's data row and camera frames are, in one shared file.

:class:`SampleTable` resolves, once and vectorised, every manifest row to its data row group (a *slot*: data file
``f``'s row group ``rg`` is slot ``rg_base[f] + rg``) and offset in it, and each camera's samples to their mp4
(a code into the camera's file list) and their place among that mp4's samples (:class:`CameraSamples`). The
arrays and the manifest itself live in one named Arrow file under ``<cache>/manifests`` (:class:`SampleFile`) that
every process maps: forked DataLoader workers share its pages, and spawned/forkserver workers, which receive the
dataset pickled, map the same file by name instead of unpickling copies (the table pickles as its file's name and
a few per-file lists, kilobytes whatever the number of samples). The file is a scratch file
(:mod:`lerobot_sql._storage.scratch`): held by its writer's lock while it lives, deleted by that process only,
swept by a later one after a crash.

Nothing is built or decoded here: the video rows come from each mp4's index in the process that reads it
(:mod:`lerobot_sql.torch._worker`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa

from .._readers import tabular
from .._storage import scratch
from .._storage.source import Source
from ..errors import CacheError, DatasetFormatError

# the manifest columns read per sample (besides each camera's from_timestamp), as numpy views of the mapping
_COLUMNS = {"index": "index", "episode_index": "episode_index", "timestamp": "timestamp",
            "ep_from": "ep_from_index", "ep_to": "ep_to_index", "row0": "ep_data_row0", "task_index": "task_index"}


@dataclasses.dataclass
class CameraSamples:
    """One camera's samples: which mp4 each reads and where it sits among that mp4's samples."""

    files: list[str]  # the camera's mp4s (relative paths); ``code`` indexes this list
    starts: np.ndarray  # int64 (len(files) + 1): ``order[starts[c]:starts[c + 1]]`` are mp4 c's samples
    code: np.ndarray  # int32 per sample: its mp4
    order: np.ndarray  # int32: the samples grouped by mp4, ascending within each
    position: np.ndarray  # int32 per sample: its place among its mp4's samples (an index into that mp4's run)
    from_timestamp: np.ndarray  # per sample: where its episode starts in the mp4 (seconds; the manifest's)

    def of_file(self, code: int) -> np.ndarray:
        """The samples (positions in the dataset) reading mp4 ``code``, ascending."""
        return self.order[self.starts[code]:self.starts[code + 1]]


class SampleTable:
    """A manifest's per-sample arrays, mapped from their shared file (see the module docstring).

    Per sample (numpy views of the mapping): ``file`` (int32, an index into ``data_files``), ``slot`` (int32, the
    row group, see ``rg_base``), ``offset`` (int64, the row in it), and the manifest's ``index``, ``episode_index``,
    ``timestamp``, ``ep_from`` / ``ep_to`` (the episode's index range), ``row0`` (the episode's first data row in its
    file), ``task_index``; per camera a :class:`CameraSamples`. Per data file: ``infos`` (footers), ``rg_base``
    (its first slot); per slot: ``slot_file`` (its data file), ``rg_len`` (its rows). ``manifest`` is the mapped
    manifest table.
    """

    def __init__(self, src: Source, manifest: pa.Table, video_keys: list[str], cache_dir: Path):
        m = manifest
        n = m.num_rows
        self.data_files, file_codes = codes(m["data_file"])
        self.infos = [tabular.data_file_info(src, f) for f in self.data_files]
        counts = np.array([len(info.rg_offsets) - 1 for info in self.infos], np.int64)
        self.rg_base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.slot_file = np.repeat(np.arange(len(self.infos), dtype=np.int32), counts)
        self.rg_len = np.concatenate([np.diff(info.rg_offsets) for info in self.infos]).astype(np.int64)
        data_row = m["data_row"].to_numpy()
        slot = np.zeros(n, np.int32)
        off = np.zeros(n, np.int64)
        order, starts = groups(file_codes, len(self.data_files))
        for f, info in enumerate(self.infos):
            sel = order[starts[f]:starts[f + 1]]
            rg, o = info.locate(data_row[sel])
            slot[sel], off[sel] = rg + self.rg_base[f], o
        cols: dict[str, np.ndarray] = {"_file": file_codes, "_slot": slot, "_off": off}
        self.video_files: dict[str, list[str]] = {}
        self._starts: dict[str, np.ndarray] = {}
        for k in video_keys:
            names, vcodes = codes(m[f"{k}/file"])
            self.video_files[k] = names
            order, self._starts[k] = groups(vcodes, len(names))
            pos = np.empty(n, np.int32)
            pos[order] = np.arange(n) - np.repeat(self._starts[k][:-1], np.diff(self._starts[k]))
            cols[f"_vfile/{k}"], cols[f"_vorder/{k}"], cols[f"_vpos/{k}"] = vcodes, order, pos
        self.map = write_file(m, cols, cache_dir)
        self._manifest_cols, self._derived_cols = list(m.column_names), list(cols)
        self.n = n
        self._attach()

    def _attach(self) -> None:
        """Take the arrays from the mapped file: zero-copy views, in the building process and in every process that
        unpickles the table alike."""
        mapped = self.map.read()
        self.manifest = m = mapped.select(self._manifest_cols)
        derived = mapped.select(self._derived_cols)
        d = {c: derived[c].to_numpy() for c in derived.column_names}

        def col(name: str) -> np.ndarray:
            return m[name].chunk(0).to_numpy() if m[name].num_chunks == 1 else m[name].to_numpy()

        self.file, self.slot, self.offset = d["_file"], d["_slot"], d["_off"]
        for attr, name in _COLUMNS.items():
            setattr(self, attr, col(name))
        self.cameras = {k: CameraSamples(names, self._starts[k], d[f"_vfile/{k}"], d[f"_vorder/{k}"],
                                         d[f"_vpos/{k}"], col(f"{k}/from_timestamp"))
                        for k, names in self.video_files.items()}

    def __getstate__(self):
        # the mapped arrays travel as the file's name (SampleFile pickles as its path): re-mapped on arrival
        state = dict(self.__dict__)
        for k in ("manifest", "file", "slot", "offset", "cameras", *_COLUMNS):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._attach()

    def close(self) -> None:
        """Delete the shared file now (see :meth:`SampleFile.close`)."""
        self.map.close()


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


def write_file(manifest: pa.Table, derived: dict[str, np.ndarray], cache_dir: Path) -> "SampleFile":
    """Write the manifest and the derived per-sample arrays to one named Arrow IPC file (:class:`SampleFile`).

    The file lives in ``<cache>/manifests`` (or the system temp folder when the cache is read-only) while the
    dataset that wrote it lives: its pages are file-backed, so forked DataLoader workers share them through the
    page cache, and spawned/forkserver workers, which get the dataset pickled, map the same file by name. Before
    writing, files whose writer is gone (killed before cleanup: its lock is free) are removed.

    Raises:
        CacheError: neither the cache folder nor the temp folder can hold the file.
    """
    d = cache_dir / "manifests"
    full = manifest.combine_chunks()
    for name, arr in derived.items():
        full = full.append_column(name, pa.array(arr))
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=file_prefix(), suffix=".arrow")
    except OSError:
        # A read-only cache with complete entries stays usable: this file is transient.
        d = Path(tempfile.gettempdir())
        try:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=file_prefix(), suffix=".arrow")
        except OSError as e:
            raise CacheError(f"{cache_dir / 'manifests'}: cannot write the per-sample file ({e}); the cache folder "
                             "is full or not writable, set LSQL_CACHE_DIR (or connect(..., cache_dir=...)) to a "
                             "writable folder") from e
    scratch.hold(fd)  # before anything else: a sweeping process must see the file as live from its first moment
    scratch.sweep(d, TAG, ".arrow", keep=tmp)
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, full.schema) as w:
            w.write_table(full)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
            os.close(fd)
        raise CacheError(f"{d}: cannot write the per-sample file ({e}); the cache folder is full or not writable, "
                         "set LSQL_CACHE_DIR (or connect(..., cache_dir=...)) to a writable folder with room") from e
    return SampleFile(tmp, owner=True, fd=fd)


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

    def __init__(self, path: str, owner: bool, fd: int | None = None):
        self.path = path
        self._fin = weakref.finalize(self, _remove, path, os.getpid(), fd) if owner else None
        if owner:
            MAPS[path] = self

    def read(self) -> pa.Table:
        """The file's table, memory-mapped (zero-copy).

        Raises:
            CacheError: the file is gone: its owner dataset was closed or collected (or its cache folder was
                cleaned) before this copy of the dataset was unpickled.
        """
        try:
            return pa.ipc.open_file(pa.memory_map(self.path, "r")).read_all()
        except FileNotFoundError as e:
            raise CacheError(f"{self.path}: the dataset's per-sample file is gone; a pickled dataset (a spawned "
                             "DataLoader worker's copy) maps the file of the dataset it was pickled from, which "
                             "must stay alive (not closed, not collected, its cache folder not cleaned) while "
                             "copies start. Build the dataset again (db.dataset(...))") from e
        except OSError as e:
            raise CacheError(f"{self.path}: cannot map the dataset's per-sample file ({e})") from e

    def close(self) -> None:
        if self._fin is not None:
            self._fin()

    def __reduce__(self):
        return (_attach, (self.path,))


def _attach(path: str) -> SampleFile:
    own = MAPS.get(path)
    return own if own is not None else SampleFile(path, owner=False)
