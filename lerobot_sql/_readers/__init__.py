"""Read a manifest's bytes: tabular rows through memory-mapped Arrow, frames through a per-file video index and
PyAV, and where a frame is (``locate``). No SQL: DataLoader workers use this stage and never see DuckDB."""
