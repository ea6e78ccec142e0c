"""File lists named by the metadata, for roots whose filesystem cannot list (plain HTTP has no directory listing).

:func:`list_files` follows a dataset's metadata (meta/info.json, the meta/episodes files) to every file it names;
:func:`lerobot_sql._format.layout.load_layout` gives that list to the :class:`~lerobot_sql._storage.source.Source`
(``Source.set_listing``), whose ``exists`` and ``glob`` then answer from it. Storage knows no dataset format: the
list is made here, beside the layout.
"""

from __future__ import annotations

import concurrent.futures

from .._storage.source import Source
from ..errors import DatasetFormatError, warn
from . import sidecar_files
from .info import CheckedInfo
from .jsontext import load_json


def list_files(src: Source, info: CheckedInfo) -> list[str]:
    """Every file a dataset's metadata names, sorted: meta/info.json, stats and tasks, the sidecar files of known
    names (:data:`lerobot_sql._format.sidecar_files.KNOWN`: sarm_progress.parquet ...), the meta/episodes files
    (v3.x: followed from ``chunk-000/file-000`` until ``total_episodes`` are seen; v2.x: meta/episodes.jsonl), and
    the data and video files they point to.

    The v3.x walk goes to the next file where ``chunks_size`` puts it, and when that file does not exist, to where
    a denser or sparser numbering would (the same chunk past ``chunks_size`` files, or the next chunk's
    ``file-000``): writers do not all follow info.json's ``chunks_size`` in meta/episodes.

    Args:
        src: the dataset root (one HEAD per metadata file asked about, the meta/episodes files read whole).
        info: its meta/info.json, already validated (:func:`lerobot_sql._format.info.check_info`).

    Returns:
        Paths relative to the root (``data/chunk-000/file-000.parquet``).

    Warns:
        UserWarning: the walk ends with fewer episodes than ``total_episodes``, giving both counts and the two
            files it looked for (the episodes found are kept).

    Raises:
        DatasetFormatError: meta/episodes.jsonl (v2.x) has a line without an integer episode_index.
    """
    import pyarrow.parquet as pq

    total, per_chunk = info.total_episodes, info.chunks_size
    files = {"meta/info.json"}
    v2 = info.legacy
    extras = ("meta/stats.json",) + (("meta/tasks.jsonl", "meta/episodes.jsonl", "meta/episodes_stats.jsonl")
                                     if v2 else ("meta/tasks.parquet",)) + sidecar_files.KNOWN
    # One round trip for all (each is a HEAD): the other version's files are not asked about at all.
    with concurrent.futures.ThreadPoolExecutor(len(extras)) as pool:
        found = list(pool.map(src.exists, extras))
    files.update(rel for rel, ok in zip(extras, found) if ok)
    if v2:
        return sorted(files | _v2_files(src, info))
    if not src.exists(_episodes_file(0, 0)):
        return sorted(files)  # no episode metadata: load_layout says so
    data_tmpl, video_tmpl = info.data_path, info.video_path
    chunk, file, seen = 0, 0, 0
    while True:
        rel = _episodes_file(chunk, file)
        files.add(rel)
        with src.open(rel) as f:
            pf = pq.ParquetFile(f)
            cols = [c for c in pf.schema_arrow.names if c in ("episode_index", "data/chunk_index",
                                                              "data/file_index") or c.startswith("videos/")]
            t = pf.read(columns=cols, use_threads=False).to_pydict()  # one thread: see Source.open
        seen += len(t.get("episode_index", []))
        for c, fi in zip(t.get("data/chunk_index", []), t.get("data/file_index", [])):
            files.add(data_tmpl.format(chunk_index=int(c), file_index=int(fi)))
        keys = {c[len("videos/"):-len("/chunk_index")] for c in t if c.endswith("/chunk_index") and
                c.startswith("videos/")}
        for k in keys if video_tmpl else ():
            for c, fi in zip(t[f"videos/{k}/chunk_index"], t[f"videos/{k}/file_index"]):
                if c is not None and fi is not None:
                    files.add(video_tmpl.format(video_key=k, chunk_index=int(c), file_index=int(fi)))
        if total and seen >= total:
            break
        # The next file where chunks_size says it is, then where the other layout would put it: writers number
        # meta/episodes more densely (more files per chunk) or sparsely than info.json's chunks_size, and a
        # walk that trusted it alone dropped the episodes of every later file without a word.
        nxt = [(chunk, file + 1), (chunk + 1, 0)]
        if file + 1 >= per_chunk:
            nxt.reverse()
        found = next(((c, fi) for c, fi in nxt if src.exists(_episodes_file(c, fi))), None)
        if found is None:
            if total and seen < total:
                warn(
                    f"{src.path('meta/episodes')}: the meta/episodes files followed from chunk-000/file-000 hold "
                    f"{seen} episodes but info.json's total_episodes is {total}; neither "
                    f"{_episodes_file(*nxt[0])} nor {_episodes_file(*nxt[1])} exists, and plain HTTP cannot list "
                    f"the folder to find the other {total - seen}: they are not read. Fix total_episodes in "
                    "meta/info.json, or restore the missing meta/episodes files")
            break
        chunk, file = found
    return sorted(files)


def _episodes_file(chunk: int, file: int) -> str:
    return f"meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"


def _v2_files(src: Source, info: CheckedInfo) -> set[str]:
    """Data and video files of a v2.x dataset: one per episode listed in meta/episodes.jsonl."""
    per_chunk = info.chunks_size
    keys = [k for k, f in info.features.items() if f.is_video]
    out = set()
    where = src.path("meta/episodes.jsonl")
    eps = []
    with src.open("meta/episodes.jsonl") as f:
        for n, line in enumerate(f.read().decode(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                ep = load_json(line, f"{where}:{n}", "restore it from the dataset's source (lerobot v2.x writes one "
                               "JSON object per line)")["episode_index"]
                if isinstance(ep, bool) or not isinstance(ep, int) or ep < 0:
                    raise TypeError(ep)
            except (KeyError, TypeError) as e:
                raise DatasetFormatError(f"{where}:{n}: expected a JSON object with an integer episode_index "
                                         f"({type(e).__name__}: {e}); restore the file") from e
            eps.append(ep)
    data_tmpl, video_tmpl = info.data_path, info.video_path
    for ep in eps:
        # every placeholder a v2 template may use, filled as Layout.data_file / video_file fill them
        at = {"episode_chunk": int(ep) // per_chunk, "episode_index": int(ep)}
        at.update(chunk_index=at["episode_chunk"], file_index=at["episode_index"])
        out.add(data_tmpl.format(**at))
        for k in keys if video_tmpl else ():
            out.add(video_tmpl.format(video_key=k, **at))
    return out
