"""``export_manifest``: a query's manifest written as one Parquet file (its form, and the ``dataset_identity`` it
records, are :mod:`lerobot_sql._plan.manifest`'s).
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._plan.manifest import Meta, dataset_identity, is_manifest_file
from ..errors import DestinationExistsError
from . import destination


@dataclasses.dataclass
class ManifestReport:
    """What :func:`export_manifest` wrote: ``path``, ``rows`` (samples), ``episodes`` (distinct), ``seconds``."""

    path: str
    rows: int
    episodes: int
    seconds: float


def export_manifest(db, sql: str, path: str | os.PathLike, *, overwrite: bool = False) -> ManifestReport:
    """Write the manifest of ``sql`` (see :mod:`lerobot_sql._plan.manifest`) as one Parquet file, one row per sample.

    Columns: those of ``db.manifest(sql)`` (``index, episode_index, frame_index, timestamp, task_index, data_file,
    data_row, ep_from_index, ep_to_index, ep_data_row0, result_row``, per camera ``<video_key>/file`` and
    ``<video_key>/from_timestamp``, the query's extra columns) plus, per camera, ``<video_key>/time_s`` (float64,
    seconds in that mp4 = from_timestamp + timestamp). Paths are relative to the dataset root, which is stored in the
    schema metadata (``lerobot_sql.manifest`` -> ``root``). ``db.dataset(pathlib.Path(path))`` rebuilds the same
    items (a str is SQL); Ray Data or Daft read it with their Parquet readers and shard it by row.

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
        if not is_manifest_file(path):
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
                               replaceable=is_manifest_file)
    episodes = len(np.unique(m["episode_index"].to_numpy()))
    return ManifestReport(str(path), m.num_rows, episodes, time.perf_counter() - t0)

