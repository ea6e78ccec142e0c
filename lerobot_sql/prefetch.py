"""Fetch into the cache exactly the bytes a query's items will read from a remote dataset.

For the query's manifest: the footer and the row groups of each data file that hold the selected frames (and, with
``delta_timestamps``, the rows their windows reach), and for each camera the packets from the keyframe before each
wanted frame up to that frame, and the container head (byte ranges from the video index, which itself costs only
the mp4's ``moov`` box): :mod:`lerobot_sql._readers.need`'s rule, the dataset's. Ranges are merged and fetched in
parallel through :meth:`lerobot_sql._storage.source.Source.fetch`, so a later ``db.dataset(sql)`` reads from disk.
For an episode query the selected episodes' row groups are fetched first, in parallel, so that the manifest query
itself reads the cache (``warm_episode_row_groups``).
``lerobot-sql prefetch DATASET --sql ...`` is the CLI form.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._plan import manifest as plan_manifest
from ._readers import deltas, locate, tabular, video_index
from ._readers import need as _need
from ._readers.tabular import row_group_ranges
from ._storage.pieces import merge_ranges

AVIO_BUFFER = locate.AVIO_BUFFER  # PyAV reads files in blocks of this size (kept here: tests and users read it)


@dataclasses.dataclass
class PrefetchReport:
    """What a prefetch did. Bytes are bytes of the remote files."""

    files: int = 0
    ranges: int = 0
    bytes_needed: int = 0      # total size of the merged ranges the items read
    bytes_fetched: int = 0     # received from the remote during this prefetch (index building included)
    bytes_already_cached: int = 0
    requests: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def needed_ranges(db, manifest: pa.Table, delta_timestamps: dict | None = None,
                  cameras: list[str] | None = None) -> dict[str, list[tuple[int, int]]]:
    """rel path -> merged byte ranges the items of ``manifest`` read (footers, row groups, video packets, container
    heads) when built with these ``delta_timestamps`` and ``cameras``: the rule of
    :mod:`lerobot_sql._readers.need`, the one the dataset's fetch ahead plans with (a window's neighbours clamped
    to their episode, in data files and videos alike).

    Builds the video indexes of the cameras' files if needed (fetching their ``moov`` boxes).

    Raises:
        TypeError, ValueError: ``delta_timestamps`` names no feature or holds no offsets in seconds (as
            ``db.dataset`` refuses them).
    """
    src, layout = db.source, db.layout
    # Offsets in frames, each rounded to its nearest frame (half a frame's tolerance): the dataset takes them at its
    # own tolerance_s, and refuses the rest itself.
    offsets = deltas.delta_indices(delta_timestamps, layout.fps, 0.5 / float(layout.fps), layout.features)
    reach = np.concatenate(list(offsets.values())) if offsets else None
    need: dict[str, list[tuple[int, int]]] = {}
    files = manifest["data_file"].to_numpy(zero_copy_only=False)
    rows = manifest["data_row"].to_numpy()
    idx = manifest["index"].to_numpy()
    ep_from, ep_to = manifest["ep_from_index"].to_numpy(), manifest["ep_to_index"].to_numpy()
    row0 = manifest["ep_data_row0"].to_numpy() if "ep_data_row0" in manifest.column_names else None
    for rel in np.unique(files):
        sel = files == rel
        info = tabular.data_file_info(src, str(rel))
        md = info.metadata
        size = src.size(str(rel))
        tail = md.serialized_size + 8
        window = None
        if reach is not None and row0 is not None:  # the rows the windows reach (a manifest without row0: none)
            window = _need.window_rows(idx[sel], ep_from[sel], ep_to[sel], row0[sel], reach)
        rgs = _need.row_groups(info, info.locate(rows[sel])[0], window)
        need[str(rel)] = row_group_ranges(md, rgs) + [(size - tail, size)]
    keys = [k for k in layout.video_keys if cameras is None or k in cameras]
    ts = manifest["timestamp"].to_numpy()
    # Build the video indexes of all the files first, several at once: each costs a moov fetch (round trips) and
    # a demux (CPU), and the files are independent.
    rels = sorted({str(r) for k in keys for r in manifest[f"{k}/file"].to_pylist() if r is not None})
    with concurrent.futures.ThreadPoolExecutor(max(1, min(4, len(rels)))) as pool:
        index = dict(zip(rels, pool.map(lambda r: video_index.ensure_index(src, r, db.cache_dir), rels)))
    for k in keys:
        vfiles = manifest[f"{k}/file"].to_numpy(zero_copy_only=False)
        from_ts = manifest[f"{k}/from_timestamp"].to_numpy().astype(np.float64)
        offs = offsets.get(k, np.zeros(1, np.int64))
        for rel in np.unique(vfiles[vfiles != None]):  # noqa: E711 - numpy elementwise
            sel = vfiles == rel
            t = pq.read_table(index[str(rel)], columns=["pts", "pts_s", "is_keyframe", "keyframe_pts", "byte_offset",
                                                       "byte_size"])
            # The decoder's own keyframe rule (presentation-order corrected), so the bytes fetched are the ones it
            # reads from where it seeks.
            key_row = locate.key_rows(t["pts"].to_numpy(), t["keyframe_pts"].to_numpy(),
                                      t["is_keyframe"].to_numpy(zero_copy_only=False))
            _, times = _need.window_times(idx[sel], ep_from[sel], ep_to[sel], from_ts[sel], ts[sel], offs,
                                          layout.fps)
            ranges = _need.video_ranges(_need.nearest_rows(t["pts_s"].to_numpy(), times), key_row,
                                        t["byte_offset"].to_numpy(), t["byte_size"].to_numpy())
            size = src.size(str(rel))
            need.setdefault(str(rel), []).extend((a, min(b, size)) for a, b in ranges)
    return {rel: merge_ranges(r) for rel, r in need.items()}


def warm_episode_row_groups(db, sql: str) -> int:
    """Fetch, in parallel, the data row groups of the episodes ``sql`` selects (by meta/episodes' data file and
    ``dataset_from_index``/``dataset_to_index``), before the manifest query reads them. DuckDB reads the row groups
    of a filtered scan one request after another (a round trip each: ~1,000 for 1,000 episodes); from the cache it
    reads them at disk speed. Best effort: a query without ``episode_index``, or metadata that disagrees with the
    data, only makes this fetch less (or more) than needed; ``needed_ranges`` then fetches exactly what is missing.

    Returns the bytes fetched.
    """
    src = db.source
    try:  # q.episode_index, qualified: unqualified, a query without it would match episodes.episode_index
        wanted = db.sql('SELECT "data/chunk_index", "data/file_index", dataset_from_index, dataset_to_index FROM '
                        f"episodes WHERE episode_index IN (SELECT q.episode_index FROM ({sql}) AS q)").fetchall()
        firsts = {(c, f): a for c, f, a in db.sql('SELECT "data/chunk_index", "data/file_index", '
                                                 "min(dataset_from_index) FROM episodes GROUP BY 1, 2").fetchall()}
    except Exception:  # noqa: BLE001 - not an episode query (or v2 metadata): nothing to warm
        return 0
    tmpl = getattr(db.layout, "data_path", None)
    if not tmpl or not wanted or getattr(db.layout, "legacy", False):  # v2: one file per episode, no row groups
        return 0
    jobs = []
    for (c, f), a0 in firsts.items():
        spans = [(a - a0, b - a0) for cc, ff, a, b in wanted if (cc, ff) == (c, f) and a is not None and b is not None]
        if not spans or c is None or f is None:
            continue
        rel = tmpl.format(chunk_index=int(c), file_index=int(f))
        try:
            info = tabular.data_file_info(src, rel)
        except Exception:  # noqa: BLE001 - the manifest query reports a missing or broken file properly
            continue
        rgs = info.row_groups([a for a, _ in spans], [b for _, b in spans])
        jobs.append((rel, merge_ranges(row_group_ranges(info.metadata, rgs))))
    with concurrent.futures.ThreadPoolExecutor(max(1, len(jobs))) as pool:
        return sum(pool.map(lambda j: src.fetch(*j), jobs)) if jobs else 0


def prefetch(db, sql: str | os.PathLike | pa.Table, progress: bool = True, *, delta_timestamps: dict | None = None,
             cameras: list[str] | None = None, workers: int = 8) -> PrefetchReport:
    """Fetch into the cache the bytes the items of ``sql`` (a query, or a manifest: its file or table) need.

    Args:
        db: a :class:`lerobot_sql.db.Database` over a remote root (on a local root this does nothing).
        sql: as for ``db.dataset``: a str is SQL; a manifest file is an ``os.PathLike`` (``pathlib.Path``), a
            manifest a table.
        delta_timestamps, cameras: as you will pass to ``db.dataset`` (neighbour frames, camera subset).
        workers: parallel range requests.

    Raises:
        RemoteIOError: the remote failed after retries (what was fetched stays cached).
    """
    t0 = time.perf_counter()
    src = db.source
    if src.is_local:
        return PrefetchReport(seconds=time.perf_counter() - t0)
    before = src.io_stats()
    path = plan_manifest.manifest_path_of(sql)  # a str is SQL (one naming an existing .parquet file: deprecated)
    if path is not None:
        sql = plan_manifest.read_manifest_file(path, "db.export_manifest(sql, path)")
        plan_manifest.check_source(sql, path, src.url, db.layout)
    if isinstance(sql, pa.Table):
        manifest = sql
    else:
        warm_episode_row_groups(db, sql)
        with plan_manifest.path_hint(sql):
            manifest = db.manifest(sql)
    need = needed_ranges(db, manifest, delta_timestamps, cameras)
    jobs = [(rel, a, b) for rel, rs in need.items() for a, b in rs]
    missing = sum(b - a for rel, a0, b0 in jobs for a, b in src.missing(rel, [(a0, b0)]))
    total = sum(b - a for _, a, b in jobs)
    from tqdm.auto import tqdm

    with tqdm(total=missing, unit="B", unit_scale=True, desc="prefetch", disable=not progress) as bar, \
            concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        futs = [pool.submit(src.fetch, rel, [(a, b)]) for rel, a, b in jobs]
        for fut in concurrent.futures.as_completed(futs):
            bar.update(fut.result())
    after = src.io_stats()
    return PrefetchReport(files=len(need), ranges=len(jobs), bytes_needed=total,
                          bytes_fetched=after["bytes_fetched"] - before["bytes_fetched"],
                          bytes_already_cached=total - missing, requests=after["requests"] - before["requests"],
                          seconds=time.perf_counter() - t0)
