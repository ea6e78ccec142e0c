"""The selection cache: a whole-episode selection's per-sample file, kept for the next open of the same selection.

Opening whole episodes (``db.dataset()``, ``db.dataset(episodes=[...])``) reads every selected frame's ``index,
episode_index, frame_index, timestamp, task_index`` to check them (:mod:`lerobot_sql._plan.episodes`) and writes
the per-sample file (:mod:`lerobot_sql.torch._samples`): about a second per million frames. A training restart
opens the same selection again; this cache keeps the file under ``<cache>/selections/<key>.arrow``, so the next
open maps it instead (the footers are still read, and each mp4 is pinned as on any open).

A selection of more than :func:`lerobot_sql._plan.episodes.lazy_frames` frames is opened without reading its
frames (:meth:`lerobot_sql.torch._samples.SampleTable.from_episodes`): its file holds the runs only, a few dozen
bytes an episode.

The key holds everything the file was computed from, so a changed source is never served stale: the package's
version, the dataset's URL, the content of the info.json and of the episode pointers the planner used (a Database
reads meta/episodes once; keying by the files' identity at the open would let one opened before a change keep stale
content under the new files' key), the data and video path templates the layout resolved (a video folder found by
listing the root is not in info.json), the identity (size, mtime, inode, ctime, or a remote ETag:
:meth:`Source.identity`) of every data file holding the selected episodes (an entry whose rows came from other
files, through a stale pointer, is not kept), and the selection's options (episodes, cameras, tolerance_s, align). A query (SQL) is never cached: its result may depend on
anything (``random()``, the clock).

Bound: the :data:`MAX_ENTRIES` most recently used entries of a dataset are kept, and no more bytes than
:func:`budget` allows; an entry a live dataset maps holds a shared lock and is never evicted. An entry that fails
to match its checksum (truncated, garbled, one value changed) is deleted with a CacheWarning and built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa

from .._format.files import DatasetFiles
from .._storage import cache
from .._version import __version__
from ..errors import CacheError, MissingFileError
from ._samples import SampleFile

VERSION = 5  # of the file's content: a change to what the per-sample file holds must bump it
FOLDER = cache.SELECTIONS
MAX_ENTRIES = 8


def entry(files: DatasetFiles, ptr: pa.Table | None, data_files, *, episodes, cameras, tolerance_s,
          align) -> Path | None:
    """Where the per-sample file of this whole-episode selection is kept (see the module docstring for the key);
    ``ptr``: the episode pointers the planner will use (the Database's, read once: their content is in the key, not
    the files' identity, so a Database that read them before meta/episodes changed keys its entry by what it used);
    ``data_files``: the data files the selected episodes' rows are in. None: not kept (no usable pointers; a data
    file missing: a stale pointer, the planner finds the rows or names what is missing)."""
    src, layout = files.source, files.layout
    if ptr is None:
        return None
    src.describe(list(data_files))  # remote: every file's version in one parallel round (a no-op for local files)
    try:
        ids = [(rel, src.identity(rel)) for rel in data_files]
    except MissingFileError:
        return None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ptr.schema) as w:
        w.write_table(ptr)
    used = hashlib.sha256(json.dumps(layout.info, sort_keys=True, default=str).encode())
    used.update(sink.getvalue())
    # the paths the layout resolved, beyond info.json's text (a video folder found by listing the root: the entry
    # holds the mp4 paths it named), and the package's version (a release that reads entries otherwise)
    key = cache.key(VERSION, __version__, src.url, used.hexdigest(), layout.data_path, layout.video_path, ids,
                    None if episodes is None else list(episodes), None if cameras is None else list(cameras),
                    repr(tolerance_s), align)
    return files.cache_dir / FOLDER / f"{key}.arrow"


def load(path: Path | None) -> SampleFile | None:
    """The kept file at ``path``, checked against its checksum (once per process: ~1 s per 3 GB), held (a shared
    lock) and mapped; None when there is none. A damaged one is deleted with a CacheWarning naming it (the caller
    builds it again)."""
    if path is None or not path.exists():
        return None
    why = cache.check_once(path)
    if why is not None:
        cache.discard(path, why)
        return None
    kept = SampleFile(str(path), owner=False, kept=True)
    try:
        runs, _ = kept.read()
        if (runs.schema.metadata or {}).get(b"entry") != path.stem.encode():  # another entry's file put here
            raise CacheError(f"{path}: holds the selection of another entry")
    except CacheError:
        kept.close()
        _remove_entry(path)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # most recently used
    return kept


def budget(folder: Path) -> int:
    """Bytes the selection cache of one dataset may hold: a tenth of the free space of its disk, at least 1 GiB."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = 0
    return max(1 << 30, free // 10)


def evict(folder: Path, keep: Path) -> None:
    """Delete the least recently used entries of ``folder`` beyond :data:`MAX_ENTRIES` or :func:`budget`, never
    ``keep`` and never one a live dataset holds (its shared lock)."""
    try:
        entries = sorted((p for p in folder.glob("*.arrow") if p != keep), key=lambda p: p.stat().st_mtime,
                         reverse=True)
    except OSError:
        return
    room = budget(folder) - (keep.stat().st_size if keep.exists() else 0)
    for n, p in enumerate(entries, start=1):
        try:
            size = p.stat().st_size
        except OSError:
            continue
        if n < MAX_ENTRIES and size <= room:
            room -= size
            continue
        if _unused(p):
            _remove_entry(p)


def _remove_entry(path: Path) -> None:
    """Delete an entry with its checksum sidecar and lock file."""
    for q in (path, path.with_name(path.name + cache.SUM_SUFFIX), path.with_name(path.name + ".lock")):
        with contextlib.suppress(OSError):
            os.unlink(q)


def _unused(path: Path) -> bool:
    """Whether no process holds ``path`` (an exclusive lock can be taken; True where locks do not exist)."""
    try:
        import fcntl
    except ImportError:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
