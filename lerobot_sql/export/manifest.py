"""``export_manifest``: a query's manifest written as one Parquet file, and ``dataset_identity``, the digest that
lets that file be opened through a copy of its dataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._plan.manifest import Meta
from ..errors import DestinationExistsError
from . import destination


@dataclasses.dataclass
class ManifestReport:
    """What :func:`export_manifest` wrote: ``path``, ``rows`` (samples), ``episodes`` (distinct), ``seconds``."""

    path: str
    rows: int
    episodes: int
    seconds: float


def dataset_identity(layout) -> str:
    """A digest of what makes two dataset folders the same dataset for a manifest: info.json's
    ``codebase_version``, ``total_episodes``, ``total_frames``, ``fps`` and ``features`` (sha256 hex of their JSON).

    A manifest stores its source's (``lerobot_sql.manifest`` -> ``dataset_id``); ``db.dataset(manifest)`` through
    another root accepts it only when that root's digest is equal (a copied or moved dataset), since a manifest's
    rows are file rows and indices of that one dataset.
    """
    info = layout.info
    keys = ("codebase_version", "total_episodes", "total_frames", "fps", "features")
    text = json.dumps({k: info.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def export_manifest(db, sql: str, path: str | os.PathLike, *, overwrite: bool = False) -> ManifestReport:
    """Write the manifest of ``sql`` (see :mod:`lerobot_sql._plan.manifest`) as one Parquet file, one row per sample.

    Columns: those of ``db.manifest(sql)`` (``index, episode_index, frame_index, timestamp, task_index, data_file,
    data_row, ep_from_index, ep_to_index, ep_data_row0, result_row``, per camera ``<video_key>/file`` and
    ``<video_key>/from_timestamp``, the query's extra columns) plus, per camera, ``<video_key>/time_s`` (float64,
    seconds in that mp4 = from_timestamp + timestamp). Paths are relative to the dataset root, which is stored in the
    schema metadata (``lerobot_sql.manifest`` -> ``root``). ``db.dataset(path)`` rebuilds the same items; Ray Data
    or Daft read it with their Parquet readers and shard it by row.

    The file is written under a temporary name and renamed into place: without ``overwrite`` only into an absent
    path (a manifest another export wrote there meanwhile is kept; DestinationExistsError). ``overwrite=True``
    replaces only a manifest this function wrote (a Parquet file with ``lerobot_sql.manifest`` metadata), never
    another file.

    Raises:
        QueryError / ResultContractError: the SQL or its result is unusable.
        DestinationExistsError (a FileExistsError): ``path`` exists (or appeared while this ran) and ``overwrite``
            is False, or it is not a manifest lerobot_sql wrote.
        DestinationError (an OSError): ``path`` is a folder, a dangling symlink, inside the source dataset, has a
            file where a parent folder should be, or the disk is full / read-only (nothing is left at ``path``).
    """
    t0 = time.perf_counter()
    path = destination.check_file_dest([db], path, "export_manifest", overwrite=overwrite,
                                       example="manifest.parquet")
    if os.path.lexists(path):
        if not _is_our_manifest(path):
            raise DestinationExistsError(f"{path}: exists and is not a manifest lerobot_sql wrote (no lerobot_sql."
                                         "manifest metadata); overwrite=True never replaces other files: remove it "
                                         "yourself or choose another path")
    m = db.manifest(sql)
    meta = dataclasses.replace(Meta.of(m), root=db.source.url,
                               dataset_id=dataset_identity(db.layout))  # a copy elsewhere opens it (db.dataset)
    for k in db.layout.video_keys:
        t = pc.add(m[f"{k}/from_timestamp"].cast(pa.float64()), m["timestamp"].cast(pa.float64()))
        m = m.append_column(f"{k}/time_s", t)
    m = meta.attach(m)
    # The temporary file is made by pq.write_table (the umask's permissions, as for any file the user writes), and
    # moved into place without replacing a manifest another export wrote meanwhile (overwrite=False).
    with destination.writing(path):
        destination.write_file(path, lambda tmp: pq.write_table(m, tmp), overwrite=overwrite,
                               replaceable=_is_our_manifest)
    episodes = len(np.unique(m["episode_index"].to_numpy()))
    return ManifestReport(str(path), m.num_rows, episodes, time.perf_counter() - t0)


def _is_our_manifest(path: Path) -> bool:
    """Whether ``path`` is a Parquet file with ``lerobot_sql.manifest`` schema metadata (one export_manifest wrote)."""
    try:
        return b"lerobot_sql.manifest" in (pq.read_schema(path).metadata or {})
    except (OSError, pa.ArrowException, ValueError):
        return False
