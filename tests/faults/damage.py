"""Damage helpers for the fault suite: copy a shared dataset into tmp_path, then break the copy in one precise way.

The shared datasets are read-only and never touched; every damaging helper works on a copy made by ``damaged``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DATA = "data/chunk-000/file-000.parquet"


EPISODES = "meta/episodes/chunk-000/file-000.parquet"


TASKS = "meta/tasks.parquet"


INFO = "meta/info.json"


FRONT = "videos/observation.images.front/chunk-000/file-000.mp4"


WRIST = "videos/observation.images.wrist/chunk-000/file-000.mp4"


def truncate(path: Path, keep: float) -> None:
    """Cut ``path`` to the first ``keep`` fraction of its bytes."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def scribble(path: Path, at: float, n: int, seed: int = 0) -> None:
    """Overwrite ``n`` bytes at fraction ``at`` of ``path`` with random garbage (size unchanged)."""
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i:i + n] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def edit_info(root: Path, fn: Callable[[dict], None]) -> None:
    """Apply ``fn`` to meta/info.json's dict in place."""
    p = root / INFO
    info = json.loads(p.read_text())
    fn(info)
    p.write_text(json.dumps(info, indent=4))


def rewrite_parquet(path: Path, fn: Callable[[pa.Table], pa.Table], **write_kwargs) -> None:
    """Replace a Parquet file by ``fn(table)``, keeping its schema metadata; one row group per 10_000 rows unless
    given."""
    t = pq.read_table(path)
    out = fn(t)
    if out.schema.metadata is None and t.schema.metadata:
        out = out.replace_schema_metadata(t.schema.metadata)
    pq.write_table(out, path, **write_kwargs)


def set_column(t: pa.Table, name: str, values) -> pa.Table:
    i = t.column_names.index(name)
    return t.set_column(i, name, pa.array(values, t.schema.field(name).type))


def shorten_mp4(path: Path, keep_frames: int) -> None:
    """Rewrite ``path`` with only its first ``keep_frames`` packets (stream copy: same pts, same pixels)."""
    src = path.with_suffix(".orig.mp4")
    path.rename(src)
    with av.open(str(src)) as inp, av.open(str(path), "w", format="mp4") as out:
        s_in = inp.streams.video[0]
        s_out = out.add_stream_from_template(s_in, opaque=True)
        for k, pkt in enumerate(inp.demux(s_in)):
            if pkt.dts is None:
                continue
            if k >= keep_frames:
                break
            pkt.stream = s_out
            out.mux(pkt)
    src.unlink()
