"""Moved: the named-query library is :mod:`lerobot_sql._query.library`; use ``db.named_query(name, **params)`` and
``db.named_query_sql(name, **params)``. This path (which docs/sql.md showed in 0.1) re-exports it for one release."""

import warnings

from ._query.library import *  # noqa: F401,F403
from ._query.library import BUNDLED, list_queries, load, render  # noqa: F401  (the names docs/sql.md used)

warnings.warn("lerobot_sql.library moved; use db.named_query(...) / db.named_query_sql(...) (this path goes in 0.3)",
              DeprecationWarning, stacklevel=2)
