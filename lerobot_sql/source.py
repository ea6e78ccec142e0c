"""Where a dataset lives: a root on some fsspec filesystem, and how to name, open and identify its files.

Everything above this module speaks of paths relative to the dataset root (``data/chunk-000/file-000.parquet``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import fsspec

from .errors import MissingFileError


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset root on a filesystem.

    Attributes:
        fs: the fsspec filesystem holding the dataset.
        root: the root path as ``fs`` spells it (no protocol for local paths).
        url: the root as the user gave it, normalised; part of every cache key.
    """

    fs: Any
    root: str
    url: str

    @property
    def is_local(self) -> bool:
        return _is_local_fs(self.fs)

    def path(self, rel: str) -> str:
        """The filesystem path of ``rel`` (relative to the root)."""
        return f"{self.root.rstrip('/')}/{rel.lstrip('/')}"

    def duckdb_path(self, rel: str) -> str:
        """The path DuckDB should read: a plain local path, or a ``protocol://`` URL for a registered fsspec fs."""
        if self.is_local:
            return self.path(rel)
        proto = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"{proto}://{self.path(rel)}"

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    def glob(self, pattern: str) -> list[str]:
        """Paths relative to the root matching ``pattern``, sorted (the order lerobot concatenates files in)."""
        base = self.root.rstrip("/") + "/"
        hits = self.fs.glob(self.path(pattern))
        return sorted(h[len(base):] if h.startswith(base) else h.split(base, 1)[-1] for h in hits)

    def open(self, rel: str, mode: str = "rb"):
        """Open ``rel``; a missing file raises :class:`MissingFileError` naming it."""
        try:
            return self.fs.open(self.path(rel), mode)
        except FileNotFoundError as e:
            raise MissingFileError(f"{self.path(rel)}: file not found (referenced by the dataset's metadata)") from e

    def local_path(self, rel: str) -> str | None:
        """An OS path for ``rel`` when the file is local (PyAV and mmap then read it directly), else None."""
        return self.path(rel) if self.is_local else None

    def identity(self, rel: str) -> str:
        """A string that changes whenever the file's content may have changed: size+mtime, or the ETag.

        Raises:
            MissingFileError: the file does not exist.
        """
        p = self.path(rel)
        if self.is_local:
            try:
                st = os.stat(p)
            except FileNotFoundError as e:
                raise MissingFileError(f"{p}: file not found (referenced by the dataset's metadata)") from e
            return f"{st.st_size}-{st.st_mtime_ns}"
        try:
            info = self.fs.info(p)
        except FileNotFoundError as e:
            raise MissingFileError(f"{p}: file not found (referenced by the dataset's metadata)") from e
        tag = info.get("ETag") or info.get("etag") or info.get("last_commit") or info.get("mtime") or ""
        return f"{info.get('size')}-{tag}"


def _is_local_fs(fs: Any) -> bool:
    proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return proto in ("file", "local")


def open_source(root: str | os.PathLike, storage_options: dict | None = None) -> Source:
    """Resolve a user-given root (local path or fsspec URL) to a :class:`Source`."""
    root = os.fspath(root)
    fs, path = fsspec.core.url_to_fs(root, **(storage_options or {}))
    if _is_local_fs(fs):
        path = os.path.abspath(path)
        return Source(fs=fs, root=path, url=path)
    return Source(fs=fs, root=path.rstrip("/"), url=root.rstrip("/"))
