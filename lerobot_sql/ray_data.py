"""Moved to :mod:`lerobot_sql.torch.ray_data` (the Ray Data hand-off, docs/cluster.md), the training wing's folder. This
path, which the docs named before, re-exports it for one release (a DeprecationWarning at import)."""

import warnings

from .torch.ray_data import *  # noqa: F401,F403  (every name the old path had)
from .torch.ray_data import (  # noqa: F401  (the documented ones)
    Decoder,
    decode_batch,
    manifest_root,
    manifest_schema,
    stack_items,
)

warnings.warn("lerobot_sql.ray_data moved to lerobot_sql.torch.ray_data; import from there (or from lerobot_sql.torch)"
              " (this path goes in 0.3)", DeprecationWarning, stacklevel=2)
