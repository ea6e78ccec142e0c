"""Where bytes live: one dataset root (local, fsspec URL, Hub id) as a :class:`source.Source`; the remote byte-range
cache (``remote``: the fsspec face, over ``pieces``, ``transport`` and ``readahead``); the payload-free mp4 view
(``mp4``); the on-disk cache folder (``cache``). Knows no dataset format (tests/test_layering.py keeps it so)."""
