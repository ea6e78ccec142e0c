"""Moved to :mod:`lerobot_sql.torch.shard` (manifest sharding, docs/cluster.md), the training wing's folder. This path,
which the docs named before, re-exports it for one release (a DeprecationWarning at import)."""

import warnings

from .torch.shard import *  # noqa: F401,F403  (every name the old path had)
from .torch.shard import (  # noqa: F401  (the documented ones)
    ShardedManifestDataset,
    rank_and_world,
    shard_manifest,
    shard_sizes,
    worker_shard,
)

warnings.warn("lerobot_sql.shard moved to lerobot_sql.torch.shard; import from there (or from lerobot_sql.torch)"
              " (this path goes in 0.3)", DeprecationWarning, stacklevel=2)
