"""SQL building blocks registered on every connection (DuckDB macros). Filled in by the temporal-queries work."""

from __future__ import annotations


def register(con, layout) -> None:
    """Register the building-block macros and views on ``con``."""
