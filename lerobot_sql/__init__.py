"""lerobot_sql: SQL over LeRobot datasets, and PyTorch training sets straight from a query.

Public surface::

    import lerobot_sql as lsql
    db = lsql.connect("path/to/dataset")          # Database: views over meta/ and data/, nothing copied
    db.sql("SELECT * FROM episodes").df()         # a DuckDB relation
    ds = db.dataset("SELECT episode_index FROM episodes WHERE length > 200",
                    delta_timestamps={"action": [i / 30 for i in range(10)]})
    ds[0]                                         # the dict LeRobotDataset.__getitem__ returns
    db.export(sql, "out/subset")                  # a new LeRobot v3.0 dataset with exactly those frames
    db.dataset(sql, fps=10), db.export(sql, "out/at10", fps=10)  # a 30 fps set as a 10 fps recording would be
    db.export_manifest(sql, "m.parquet")          # one row per sample, for Ray Data / Daft / torch ranks
    db.named_query("split", subset="validation")  # named queries from queries/
    db.nearest(at_sql, ["action", "observation.images.front"])  # align streams of different rates
    db.stats(sql)                                 # lerobot's stats dict for exactly the selected frames
    db.attach("keep", "keep.csv")                 # your own table file as a view: ... JOIN keep USING (episode_index)
    ds.meta, ds.num_frames, ds.meta.stats         # what lerobot's training code reads (lerobot_sql.torch.meta)
    lerobot_sql.display.show_clips(db, sql)       # watch the windows: playable clips over their signals

    coll = lsql.connect_many(["site_a", "site_b"])  # Collection: every view spans both, with a dataset column
    coll.sql("SELECT dataset, count(*) FROM episodes GROUP BY dataset")
    ds = coll.dataset("SELECT dataset, episode_index FROM episodes WHERE duration_s > 10")  # items carry dataset

Training with lerobot's own script on a query: ``lerobot-sql train DATASET --sql "SELECT ..." -- <lerobot-train
arguments>`` (:mod:`lerobot_sql.torch.train`; lerobot is not imported by ``import lerobot_sql``).

Samplers: :class:`EpisodeAwareSampler` (shuffled blocks of consecutive frames, per-epoch seeds, resume, rank
shards), :class:`EpisodeShardedSampler` (whole episodes per rank), :class:`MixtureSampler` (datasets of a
collection in given proportions: ``MixtureSampler(ds, {"site_a": 0.7, "site_b": 0.3})`` or ``alpha=0.5``) and
:class:`WeightedSampler` (samples in proportion to a column of the selection: ``WeightedSampler(ds, "weight")`` over
``SELECT episode_index, length / 100.0 AS weight FROM episodes``).
Manifest sharding for many processes and the Ray Data hand-off: :mod:`lerobot_sql.torch.shard`, :mod:`lerobot_sql.torch.ray_data`. CLI: ``lerobot-sql --help``.

Errors all derive from :class:`LeRobotSQLError` (see :mod:`lerobot_sql.errors`).
"""

from ._version import __version__
from .collection import Collection, connect_many
from .db import Database, connect
from .errors import *  # noqa: F401,F403  (every error class and RemoteWarning: errors.__all__ is the one list)
from .errors import __all__ as _ERRORS


def __getattr__(name: str):
    # torch loads only when a torch-facing class is asked for.
    if name == "LeRobotSQLDataset":
        from .torch.dataset import LeRobotSQLDataset

        return LeRobotSQLDataset
    if name == "CollectionDataset":
        from .torch.mixture import CollectionDataset

        return CollectionDataset
    if name in ("EpisodeAwareSampler", "EpisodeShardedSampler", "MixtureSampler", "WeightedSampler"):
        from .torch import samplers

        return getattr(samplers, name)
    raise AttributeError(name)


def __dir__():
    return sorted(set(globals()) | set(__all__))  # the lazily loaded names too


__all__ = [
    "connect",
    "Database",
    "connect_many",
    "Collection",
    "LeRobotSQLDataset",
    "CollectionDataset",
    "EpisodeAwareSampler",
    "EpisodeShardedSampler",
    "MixtureSampler",
    "WeightedSampler",
    *_ERRORS,
]
