"""Moved to :mod:`lerobot_sql.torch.samplers` (the samplers), the training wing's folder. This path, which the docs
named before, re-exports it for one release (a DeprecationWarning at import)."""

import warnings

from .torch.samplers import *  # noqa: F401,F403  (every name the old path had)
from .torch.samplers import (  # noqa: F401  (the documented ones)
    EpisodeAwareSampler,
    EpisodeShardedSampler,
    MixtureSampler,
    blocks,
)

warnings.warn("lerobot_sql.samplers moved to lerobot_sql.torch.samplers; import from there (or from lerobot_sql)"
              " (this path goes in 0.3)", DeprecationWarning, stacklevel=2)
