"""SQL text: the one quoting helper (``sqltext``), the read-only checks of user SQL (``checks``) and the named-query
library. sqlglot only: no DuckDB connection, no files."""
