"""Every error lerobot_sql raises.

Each class also subclasses the builtin that fits its meaning, so ``except ValueError`` in existing training code keeps
working. Messages name the file, episode, camera or column involved and say how to fix the problem; the original
library exception (DuckDB, PyAV, pyarrow, fsspec) is chained as ``__cause__``.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any


class LeRobotSQLError(Exception):
    """Root of all lerobot_sql errors."""


class DatasetFormatError(LeRobotSQLError, ValueError):
    """The dataset on disk is not a LeRobot dataset this reader understands (missing or malformed metadata)."""


class UnsupportedVersionError(DatasetFormatError):
    """``codebase_version`` in meta/info.json is one this reader does not handle."""


class MissingFileError(LeRobotSQLError, FileNotFoundError):
    """A data, metadata or video file that the metadata points to does not exist."""


class QueryError(LeRobotSQLError, ValueError):
    """User SQL was rejected (not a query, unknown view or column, forbidden construct) or failed to run."""


class QueryInterrupted(QueryError):
    """A query stopped before its end, the connection still usable: at its ``timeout`` (``reason == "timeout"``;
    ``db.sql(sql, timeout=...)``, CLI ``--timeout``) or by Ctrl-C (``reason == "sigint"``; the CLI exits 130)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason

    @property
    def interrupted(self) -> str:
        """``reason``, under the name 0.1 set on a QueryError."""
        return self.reason

    def __reduce__(self):  # pickled with its reason (a DataLoader worker's error crosses a pipe)
        return type(self), (str(self), self.reason)

    @classmethod
    def ctrl_c(cls, sql: str) -> "QueryInterrupted":
        """The error for query ``sql`` stopped by Ctrl-C (SIGINT), ``reason == "sigint"``."""
        return cls(f"the query was interrupted (Ctrl-C); the connection is still usable. SQL: {sql}", "sigint")


class ResultContractError(QueryError):
    """A query result cannot be turned into a dataset (wrong columns, or no rows)."""


class IncompatibleDatasetsError(ResultContractError):
    """A selection across several datasets cannot be written as one dataset: their fps or robot_type differ, or a
    camera's videos differ in codec, resolution or pixel format (so its packets cannot be stream-copied into one
    track). The message names the datasets, the key and both values."""


class FrameNotFoundError(LeRobotSQLError, LookupError):
    """No video frame lies within ``tolerance_s`` of the requested time. Never replaced by a neighbouring frame."""


class VideoDecodeError(LeRobotSQLError, RuntimeError):
    """PyAV could not open or decode a video file (truncated, corrupt, or an unsupported codec)."""


class DestinationExistsError(LeRobotSQLError, FileExistsError):
    """An export's destination already exists (pass ``overwrite=True``, or ``--overwrite`` on the CLI)."""


class DestinationError(LeRobotSQLError, OSError):
    """An export destination cannot be written: it lies inside (or holds) the source dataset, is a dangling symlink,
    has a file where a parent folder should be, is a folder where a file is wanted, or the disk is full or read-only.
    Nothing is left at the destination; the message names the path and the fix."""


class RemoteIOError(LeRobotSQLError, OSError):
    """Reading a remote file failed after retries."""


class FileChangedError(RemoteIOError):
    """A remote file no longer matches the version (ETag / S3 version id) this session first read of it: the
    dataset changed on the server mid-run. Reading on would mix two versions' bytes; open the dataset again."""


class RemoteWarning(UserWarning):
    """A remote server behaves in a way that weakens what the byte cache can promise, said once per dataset and
    session: it ignores Range requests (whole files are fetched), its ETags change for unchanged bytes (a farm of
    nodes tagging differently: reads are pinned by Last-Modified instead), or it gives no validators at all (no ETag,
    no Last-Modified: a same-size change inside a cached file cannot be noticed)."""


class UnsupportedFeatureError(LeRobotSQLError, NotImplementedError):
    """A feature of the dataset that lerobot_sql cannot return correctly yet: refused,
    naming the key and how to leave it out, rather than returned as a wrong value."""


class StatsUnavailableError(LeRobotSQLError, RuntimeError):
    """``ds.meta.stats`` first read in a process that cannot compute it (a DataLoader worker, an unpickled copy):
    selection statistics need the Database's DuckDB connection, which never crosses a fork or a pickle. Read
    ``ds.meta.stats`` once in the main process before the DataLoader starts (or build with ``stats="dataset"``).
    Also: a camera without per-episode statistics whose frames cannot be read to compute them (``db.stats``,
    ``ds.meta.stats``); the message names the camera, the episodes and the ways out."""


class TrainSetupError(LeRobotSQLError, ValueError):
    """``lerobot-sql train`` cannot start: lerobot missing or of an unsupported version, or a lerobot-train option
    that a SQL selection replaces (``--dataset.episodes``, ``--dataset.streaming``, ``--eval_split``)."""


class SettingError(LeRobotSQLError, ValueError):
    """An ``LSQL_*`` environment variable holds a value that cannot be used (the message names it, what it takes and
    its default); unset it or give one of those values."""


class CacheError(LeRobotSQLError, OSError):
    """A cache entry could not be written (disk full, read-only or unwritable cache folder). Nothing partial is left
    that a later run would read; free space or set ``LSQL_CACHE_DIR`` / ``cache_dir=`` to a writable folder."""


__all__ = [
    "LeRobotSQLError",
    "DatasetFormatError",
    "UnsupportedVersionError",
    "MissingFileError",
    "QueryError",
    "QueryInterrupted",
    "ResultContractError",
    "IncompatibleDatasetsError",
    "FrameNotFoundError",
    "VideoDecodeError",
    "RemoteIOError",
    "FileChangedError",
    "RemoteWarning",
    "CacheError",
    "SettingError",
    "TrainSetupError",
    "StatsUnavailableError",
    "UnsupportedFeatureError",
    "DestinationExistsError",
    "DestinationError",
]


def as_int(value: Any) -> int | None:
    """``value`` as a Python int when it is an integer (a Python or numpy integer, a 0-d integer array or tensor:
    what ``operator.index`` takes), else None. Bools are None too: ``True`` is 1 to ``operator.index``, so a flag
    passed by mistake would silently count as 1; so are one-element arrays and tensors (``torch.tensor([3])`` is 3
    to it). The one test behind every "must be an integer" check: each caller raises its own TypeError."""
    if isinstance(value, bool) or getattr(value, "ndim", 0) != 0 or str(getattr(value, "dtype", "")) in (
            "bool", "torch.bool"):
        return None
    try:
        return int(operator.index(value))
    except TypeError:
        return None


def as_real(value: Any) -> float | None:
    """``value`` as a Python float when it is a real number (``numbers.Real``: a Python or numpy int or float), else
    None. Bools are None: ``float(True)`` is 1.0, so a flag passed by mistake would count as 1; strings are None
    too (``float('1')`` would take them from a config file unchecked). NaN and infinities are returned as they are:
    each caller checks the range it needs. The one test behind every "must be a number" check, as :func:`as_int`
    is for integers."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def closest(name: str, candidates, cutoff: float = 0.6) -> str | None:
    """The candidate closest to ``name`` (case-insensitive, difflib ratio >= ``cutoff``), as spelt in
    ``candidates``; None when none is that close."""
    import difflib

    by_lower = {c.lower(): c for c in candidates}
    near = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[near[0]] if near else None


def did_you_mean(name: str, candidates) -> str:
    """`` Did you mean 'x'?`` for the candidate :func:`closest` to ``name``, else ``""``: the one spelling of the
    hint every error message uses (query checks, result contracts)."""
    near = closest(name, candidates)
    return f" Did you mean {near!r}?" if near is not None else ""


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the line that called into lerobot_sql: the caller of the outermost frame of
    this package on the stack, however deep inside it (DuckDB callbacks, pyarrow writers calling our generators,
    readers, storage) the warning arises. A fixed ``stacklevel`` is right for one call path only, and "the first
    frame outside the package" is a library's when the package is called back through one (pyarrow's writer).
    Frames of importlib's bootstrap are skipped as ``warnings`` itself skips them when it counts. A warning from a
    thread or worker entered by the package (no caller outside) points at that thread's entry."""
    import os
    import sys
    import warnings

    here = os.path.join(os.path.dirname(__file__), "")  # the package folder, with its trailing separator
    f, level, outermost = sys._getframe(0), 1, 1
    while f is not None:
        if f.f_code.co_filename.startswith(here):
            outermost = level
        f = f.f_back
        while f is not None and "importlib" in f.f_code.co_filename and "_bootstrap" in f.f_code.co_filename:
            f = f.f_back
        level += 1
    warnings.warn(message, category, stacklevel=outermost + 1)
