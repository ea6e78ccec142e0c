#!/usr/bin/env python
"""Many datasets: how opening a collection and its first queries cost as the number of datasets grows.

    python benchmarks/bench_collection.py [--sizes 1 10 30 100] [--root /tmp/lsql_bench_collection]

Data: copies of sample/small20's meta/ and data/ (no videos: the open reads info.json, the SQL reads meta/ and the
data footers; 556 KB each), named ds000 ... ds099, made once under ``--root``. Each size is measured in a fresh
process with an empty lerobot_sql cache:

* ``open``: ``connect_many(roots)`` (each info.json read, files listed; no DuckDB yet);
* ``views``: the first query, ``SELECT dataset, count(*) FROM episodes GROUP BY 1`` (makes the DuckDB connection:
  every dataset's views in its schema, the union views);
* ``episodes q``: a second query over episodes (``sum(duration_s)`` per dataset), warm;
* ``frames q``: ``count(*)`` and ``avg`` of a state element over every dataset's frames (reads the data files);
* ``manifest``: ``coll.manifest`` of 2 whole episodes per dataset.

Prints a table (seconds, and per dataset for the largest size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make(root: Path, n: int) -> list[Path]:
    src = REPO / "sample" / "small20"
    out = []
    for i in range(n):
        d = root / f"ds{i:03d}"
        if not (d / "meta" / "info.json").exists():
            shutil.copytree(src / "meta", d / "meta")
            shutil.copytree(src / "data", d / "data")
        out.append(d)
    return out


def measure(roots: list[str]) -> dict:
    sys.path.insert(0, str(REPO))
    import lerobot_sql as lsql

    t = {}
    t0 = time.perf_counter()
    coll = lsql.connect_many(roots)
    t["open"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = coll.sql("SELECT dataset, count(*) FROM episodes GROUP BY 1").fetchall()
    t["views"] = time.perf_counter() - t0
    assert len(n) == len(roots) and all(c == 20 for _, c in n)
    t0 = time.perf_counter()
    coll.sql("SELECT dataset, sum(duration_s) FROM episodes GROUP BY 1").fetchall()
    t["episodes q"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = coll.sql('SELECT count(*), avg("observation.state"[1]) FROM frames').fetchall()
    t["frames q"] = time.perf_counter() - t0
    assert r[0][0] == 4762 * len(roots)
    t0 = time.perf_counter()
    m = coll.manifest("SELECT dataset, episode_index FROM episodes WHERE episode_index < 2")
    t["manifest"] = time.perf_counter() - t0
    assert m.num_rows > 0
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 30, 100])
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "lsql_bench_collection"))
    ap.add_argument("--measure", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure is not None:
        print(json.dumps(measure(a.measure)))
        return
    roots = make(Path(a.root), max(a.sizes))
    rows = []
    for n in a.sizes:
        env = dict(os.environ, LSQL_CACHE_DIR=tempfile.mkdtemp(prefix="lsql_bench_cache_"))
        out = subprocess.run([sys.executable, __file__, "--measure", *map(str, roots[:n])], env=env,
                             capture_output=True, text=True, check=True)
        rows.append((n, json.loads(out.stdout.strip().splitlines()[-1])))
    keys = list(rows[0][1])
    print(f"| datasets | {' | '.join(k + ' (s)' for k in keys)} |")
    print("|---:|" + "---:|" * len(keys))
    for n, t in rows:
        print(f"| {n} | {' | '.join(f'{t[k]:.3f}' for k in keys)} |")
    n, t = rows[-1]
    print(f"\nper dataset at {n}: " + ", ".join(f"{k} {1000 * t[k] / n:.1f} ms" for k in keys))


if __name__ == "__main__":
    main()
