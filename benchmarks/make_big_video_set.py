#!/usr/bin/env python
"""Make the >= 1 GB video dataset of the remote benchmark with lerobot's own writer (run in lerobot's interpreter).

    HF_HUB_OFFLINE=1 HF_HOME=$(mktemp -d) ${LSQL_PEER_PYTHON:-../peer/bin/python} benchmarks/make_big_video_set.py \
        [--source DIR] [--copies 30] [--dest DIR]

Run from the checkout. lerobot's interpreter: $LSQL_PEER_PYTHON, else ../peer/bin/python beside the checkout.
``--source`` and ``--dest`` default to syn200_96 and syn_big_96 in $LSQL_BENCH_DATA, else in ../bench_data beside the
checkout.

``lerobot.datasets.aggregate.aggregate_datasets`` merges ``--copies`` copies of ``--source`` (each reached through
its own symlink, as it wants one root per repo id) with lerobot's default file limits (data 100 MB, video 200 MB):
mp4s are joined by stream copy, no re-encode, so it takes about 2 minutes. 30 copies of syn200_96 (40 MB) give
1.1 GB: 6,000 episodes, 1.39M frames, 6 mp4s of up to 194 MB. The content repeats; the byte layout (GOPs, file
sizes, episodes per file) is what lerobot writes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (standard library + numpy: importable in lerobot's interpreter)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=common.BENCH_DATA / "syn200_96")
    ap.add_argument("--copies", type=int, default=30)
    ap.add_argument("--dest", type=Path, default=common.BENCH_DATA / "syn_big_96")
    a = ap.parse_args()
    from lerobot.datasets.aggregate import aggregate_datasets

    links = a.dest.parent / f"_{a.dest.name}_copies"
    links.mkdir(parents=True, exist_ok=True)
    roots = []
    for i in range(a.copies):
        link = links / f"c{i:02d}"
        if not link.exists():
            link.symlink_to(a.source.resolve(), target_is_directory=True)
        roots.append(link)
    t = time.time()
    aggregate_datasets(repo_ids=[f"bench/{a.source.name}_c{i:02d}" for i in range(a.copies)],
                       aggr_repo_id=f"bench/{a.dest.name}", roots=roots, aggr_root=a.dest)
    print(f"{a.dest}: written in {time.time() - t:.0f} s")


if __name__ == "__main__":
    main()
