"""lerobot_sql: SQL over LeRobot datasets, and PyTorch training sets straight from a query.

Public surface::

    import lerobot_sql as lsql
    db = lsql.connect("path/to/dataset")          # Database: views over meta/ and data/, nothing copied
    db.sql("SELECT * FROM episodes").df()         # a DuckDB relation
    ds = db.dataset("SELECT episode_index FROM episodes WHERE length > 200",
                    delta_timestamps={"action": [i / 30 for i in range(10)]})
    ds[0]                                         # the dict LeRobotDataset.__getitem__ returns

Errors all derive from :class:`LeRobotSQLError` (see :mod:`lerobot_sql.errors`).
"""

from .db import Database, connect
from .errors import (
    CacheError,
    DatasetFormatError,
    FrameNotFoundError,
    LeRobotSQLError,
    MissingFileError,
    QueryError,
    RemoteIOError,
    ResultContractError,
    UnsupportedVersionError,
    VideoDecodeError,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    # torch loads only when the dataset class is asked for.
    if name == "LeRobotSQLDataset":
        from .dataset import LeRobotSQLDataset

        return LeRobotSQLDataset
    raise AttributeError(name)


__all__ = [
    "connect",
    "Database",
    "LeRobotSQLDataset",
    "LeRobotSQLError",
    "DatasetFormatError",
    "UnsupportedVersionError",
    "MissingFileError",
    "QueryError",
    "ResultContractError",
    "FrameNotFoundError",
    "VideoDecodeError",
    "RemoteIOError",
    "CacheError",
]
