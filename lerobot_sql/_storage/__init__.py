"""Where bytes live: one dataset root (local, fsspec URL, Hub id) as a :class:`source.Source`, the remote byte-range
cache, and the on-disk cache folder. Knows no dataset format (tests/test_layering.py keeps it so)."""
