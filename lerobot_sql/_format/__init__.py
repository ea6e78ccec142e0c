"""What the files mean: info.json, path templates, features, v2.x and v3.0 layouts. No DuckDB, no torch."""
