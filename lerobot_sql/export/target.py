"""The two ends of an export as its writers see them: each dataset it reads (:class:`ExportSource`) and the folder
it writes with lerobot's output settings (:class:`ExportTarget`).

The writers (:mod:`.data_writer`, :mod:`.video_writer`) take these, not the driver (:class:`.lerobot.Exporter`): a
writer knows where to write, how large a file may grow and which source a part comes from, and adds to the target's
counts of frames copied and re-encoded; nothing else of the run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from .._format.info import DEFAULT_DATA_MB, DEFAULT_DATA_PATH, DEFAULT_VIDEO_MB, DEFAULT_VIDEO_PATH
from .._format.layout import Layout


@dataclasses.dataclass
class ExportTarget:
    """Where an export writes, and how its files are cut.

    Attributes:
        root: the folder written (the staging folder, renamed into place at the end).
        fps: the output dataset's frames per second.
        chunks_size: files per chunk folder (info.json's ``chunks_size``).
        data_limit, video_limit: bytes a data / video file may grow to before the next one is started
            (info.json's ``data_files_size_in_mb`` / ``video_files_size_in_mb``).
        data_path, video_path: the output path templates (the source's for v3.x; lerobot's v3.0 defaults for a v2.x
            source, whose templates name one file per episode).
        frames_reencoded, frames_remuxed: video frames decoded and re-encoded / whose packets were copied, summed
            over cameras: the writers add to them.
    """

    root: Path
    fps: float
    chunks_size: int
    data_limit: float
    video_limit: float
    data_path: str
    video_path: str
    frames_reencoded: int = 0
    frames_remuxed: int = 0

    @classmethod
    def of(cls, layout: Layout, root: Path) -> "ExportTarget":
        """The target ``root`` with the output settings of ``layout`` (the first source's: its fps, chunks, file
        sizes, path templates)."""
        info = layout.info
        legacy = layout.legacy
        return cls(root=root, fps=layout.fps, chunks_size=int(info.get("chunks_size") or 1000),
                   data_limit=float(info.get("data_files_size_in_mb") or DEFAULT_DATA_MB) * 1024 * 1024,
                   video_limit=float(info.get("video_files_size_in_mb") or DEFAULT_VIDEO_MB) * 1024 * 1024,
                   data_path=DEFAULT_DATA_PATH if legacy else layout.data_path,
                   video_path=DEFAULT_VIDEO_PATH if legacy or not layout.video_path else layout.video_path)


@dataclasses.dataclass
class ExportSource:
    """One dataset an export reads. A one-dataset export has one, ``name`` None and ``keys`` None (every column as
    it is); a collection's export has one per selected dataset: ``name``, ``code`` (its code in the manifest's
    ``dataset`` column) and ``keys``, each exported source feature key -> its output key (features not in it are
    not written; columns that are not features keep their name). ``align``: how the source's camera frames are found
    (:func:`lerobot_sql._readers.locate.check_align`; the writers call
    :func:`lerobot_sql.export.video_writer.source_rows`).

    The driver fills in, per source, before the writers run: ``src_rows`` (episode_index -> its ``_episodes_raw``
    row), ``stat_cols`` ((source feature, stat) -> column), ``task_map`` (int64, source task_index -> output
    task_index, -1 unused), ``decoders`` (its decoder pool).
    """

    db: Any
    name: str | None = None
    code: int = 0
    keys: dict[str, str] | None = None
    align: str = "timestamp"
    # camera key -> the manifest's checked clips of this source (Meta.clips): each mp4's clip chain is checked
    # against its real frames before anything of it is copied (video_writer.VideoWriter._index)
    clips: dict = dataclasses.field(default_factory=dict, repr=False)
    src_rows: dict[int, dict] = dataclasses.field(default_factory=dict, repr=False)
    stat_cols: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict, repr=False)
    task_map: np.ndarray | None = dataclasses.field(default=None, repr=False)
    decoders: Any = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        self.layout, self.src = self.db.layout, self.db.source
        self.inv = {v: k for k, v in (self.keys or {}).items()}

    def out(self, key: str) -> str | None:
        """The output name of source column/feature ``key``; None if it is not exported."""
        if self.keys is None or key not in self.layout.features:
            return key
        return self.keys.get(key)

    def src_key(self, out_key: str) -> str:
        """The source feature key written as ``out_key``."""
        return out_key if self.keys is None else self.inv[out_key]

    def column(self, name: str) -> str | None:
        """The output name of meta/episodes column ``name`` (``stats/<key>/...``, ``videos/<key>/...`` renamed with
        their feature; None for a feature not exported)."""
        if self.keys is None:
            return name
        for prefix in ("stats/", "videos/"):
            if name.startswith(prefix):
                feat, _, rest = name[len(prefix):].rpartition("/")
                if feat in self.layout.features:
                    out = self.keys.get(feat)
                    return None if out is None else f"{prefix}{out}/{rest}"
        return name
