"""Moved to :mod:`lerobot_sql.torch.dataset` (the class ``db.dataset(sql)`` returns), the training wing's folder. This
path, which the docs named before, re-exports it for one release (a DeprecationWarning at import)."""

import warnings

from .torch.dataset import *  # noqa: F401,F403  (every name the old path had)
from .torch.dataset import (  # noqa: F401  (the documented ones)
    LeRobotSQLDataset,
    item_index,
)

warnings.warn("lerobot_sql.dataset moved to lerobot_sql.torch.dataset; import from there (or from lerobot_sql)"
              " (this path goes in 0.3)", DeprecationWarning, stacklevel=2)
