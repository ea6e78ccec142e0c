"""One dataset's files, without DuckDB: where they are, what they mean, where our caches for them go, their tasks.

A :class:`DatasetFiles` is what every reader of a dataset needs and all it needs: the ``Database`` holds one (and
adds DuckDB on top), and the training sets (``LeRobotSQLDataset``, ``ShardedManifestDataset``) and the cluster
decoder (``ray_data.Decoder``) take one. It pickles, so it travels to DataLoader workers (fork or spawn) and Ray
workers with the dataset; nothing in it ever opens a DuckDB connection.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .._storage import cache
from .._storage.source import Source, open_source
from .layout import Layout, load_layout
from .metadata import read_tasks


@dataclasses.dataclass(eq=False)
class DatasetFiles:
    """One opened dataset: make it with :func:`open_files`.

    Attributes:
        source: where the bytes are (local folder or fsspec URL, with the remote-bytes cache).
        layout: meta/info.json and the file lists (format version, fps, features, path templates).
        cache_dir: this dataset's cache folder (video indexes, kept selections, per-sample files, DuckDB spill).
    """

    source: Source
    layout: Layout
    cache_dir: Path
    _tasks: dict[int, str] | None = dataclasses.field(default=None, repr=False)

    def tasks(self) -> dict[int, str]:
        """task_index -> task text, from meta/tasks.parquet (v2: meta/tasks.jsonl); read on first call, once (a new
        dict each call: callers may change theirs).

        Raises:
            DatasetFormatError: the tasks file is malformed (see :func:`lerobot_sql._format.metadata.read_tasks`).
        """
        if self._tasks is None:
            t = read_tasks(self.source, self.layout)
            self._tasks = dict(zip(t["task_index"].to_pylist(), t["task"].to_pylist()))
        return dict(self._tasks)


def open_files(root: str | os.PathLike, *, storage_options: dict | None = None,
               cache_dir: str | os.PathLike | None = None, cache_size: int | str | None = None) -> DatasetFiles:
    """Open the dataset at ``root``: reads meta/info.json and lists the files; opens no Parquet file.

    Args: as :func:`lerobot_sql.connect` (``cache_dir`` default: :func:`lerobot_sql._storage.cache.root_for` of
    the dataset's URL, under ``$LSQL_CACHE_DIR`` or ``~/.cache/lerobot_sql``).

    Raises:
        MissingFileError / UnsupportedVersionError / DatasetFormatError: as
            :func:`lerobot_sql._format.layout.load_layout`.
    """
    source = open_source(root, storage_options, cache_dir=cache_dir, cache_size=cache_size)
    folder = Path(cache_dir) if cache_dir else cache.root_for(source.url)
    _refuse_cache_inside(source, folder)
    layout = load_layout(source)
    cache.note_source(folder, source.url)  # (what `lerobot-sql cache` names the folder by)
    return DatasetFiles(source, layout, folder)


def _refuse_cache_inside(source, folder: Path) -> None:
    """A cache folder inside a local dataset (``LSQL_CACHE_DIR=<root>/meta``) would write video indexes, kept
    selections and spill files into the dataset, which an upload, a copy or doctor's stray-file check then picks
    up (hostile review 10, H6).

    Raises:
        CacheError: naming both folders and the fix.
    """
    if not source.is_local:
        return
    root = source.root  # (not local_path(""): that checks the root itself as a symlink leaving the dataset)
    real_root, real = Path(os.path.realpath(root)), Path(os.path.realpath(folder))
    if real == real_root or real_root in real.parents:
        raise cache.cache_error(folder, f"this cache folder is inside the dataset {root}, whose folder would then "
                                "hold cache files", first=None, to="a folder outside the dataset")
