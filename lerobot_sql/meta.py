"""Moved to :mod:`lerobot_sql.torch.meta` (``ds.meta``), the training wing's folder. This path, which the docs named
before, re-exports it for one release (a DeprecationWarning at import)."""

import warnings

from .torch.meta import *  # noqa: F401,F403  (every name the old path had)
from .torch.meta import (  # noqa: F401  (the documented ones)
    EpisodeTable,
    SelectionMetadata,
    episodes_table,
    repo_id,
    runs,
)

warnings.warn("lerobot_sql.meta moved to lerobot_sql.torch.meta; import from there"
              " (this path goes in 0.3)", DeprecationWarning, stacklevel=2)
