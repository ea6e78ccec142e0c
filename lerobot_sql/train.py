"""Moved to :mod:`lerobot_sql.torch.train` (``lerobot-sql train``), the training wing's folder. This path, which the
docs named before, re-exports it for one release (a DeprecationWarning at import)."""

import warnings

from .torch.train import *  # noqa: F401,F403  (every name the old path had)
from .torch.train import (  # noqa: F401  (the documented ones)
    keep_positions,
    make_factory,
    resuming,
    run,
    sampler_class,
    saved_run,
)

warnings.warn("lerobot_sql.train moved to lerobot_sql.torch.train; import from there"
              " (this path goes in 0.3)", DeprecationWarning, stacklevel=2)
