"""Query result -> manifest: the Manifest type and the two resolvers (the DuckDB join, whole episodes from the
pointers with pyarrow). Knows no decoding."""
