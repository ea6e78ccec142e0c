"""On-disk caches: one root per user, one folder per dataset, entries keyed by the source file's identity.

Writes go to a temporary name in the same folder and are renamed into place, under a file lock, so a reader never
sees a half-written entry and two processes never build the same entry twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

from filelock import FileLock

from .errors import CacheError, LeRobotSQLError


def cache_root() -> Path:
    """``$LSQL_CACHE_DIR``, else ``$XDG_CACHE_HOME/lerobot_sql``, else ``~/.cache/lerobot_sql``."""
    env = os.environ.get("LSQL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg or Path.home() / ".cache") / "lerobot_sql"


def key(*parts: object) -> str:
    """A short stable hash of ``parts`` (file URL, identity, format version ...)."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:24]


def build_once(path: Path, write: Callable[[str], None]) -> Path:
    """Return ``path``, calling ``write(tmp_path)`` first if it does not exist yet.

    ``write`` must create the file at ``tmp_path``; it is renamed to ``path`` only after ``write`` returns, so a
    crash leaves at most a stray temporary file that is never read.
    """
    if path.exists():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock", poll_interval=0.002):  # DataLoader workers wait on each other's builds
            if path.exists():
                return path
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
            os.close(fd)
            try:
                write(tmp)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
    except OSError as e:
        if isinstance(e, LeRobotSQLError):  # MissingFileError, RemoteIOError from the source: already ours
            raise
        raise CacheError(f"{path}: cannot write this cache entry ({e}); the cache folder is full or not writable. "
                         "Free space there, or set LSQL_CACHE_DIR (or connect(..., cache_dir=...)) to a writable "
                         "folder with room") from e
    return path


def root_for(dataset_url: str) -> Path:
    """The cache folder of one dataset (by its URL or absolute path)."""
    return cache_root() / key(dataset_url)
