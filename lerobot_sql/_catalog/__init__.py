"""DuckDB: the connection's views over meta/ and data/, its macros, and its lock-down. Only this stage and the
planner (``_plan``) hold a connection."""
