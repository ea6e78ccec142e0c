"""Remote dataset over a throttled loopback HTTP link: time to first batch and bytes fetched vs a full download.

    python benchmarks/bench_remote.py [--root DATASET ...] [--mbit 100] [--latency-ms 20] [--sql QUERY]
        [--threads N] [--runs lazy,prefetch] [--first-batch-only] [--no-download] [--shuffle]

At scale (the 10,000-episode video set, 8 GB; issue 38's remote targets):

    python benchmarks/bench_remote.py --root $LSQL_BENCH_DATA/scale_video/10000 --mbit 1000 --latency-ms 20 \
        --sql "SELECT episode_index FROM episodes" --runs lazy --first-batch-only --no-download --shuffle

The server (tests/http_range_server.py) serves the dataset folder with Range support, one token bucket of
``--mbit`` for all connections and ``--latency-ms`` before each response body. Runs, each with an empty cache:
  * full download: every file of the dataset, 8 parallel GETs (what snapshot_download would do); ``--no-download``:
    not made, its time estimated as the dataset's bytes over the link rate (a multi-GB set would fill the disk);
  * lazy: connect, the query (default every 10th episode: 10% of episodes, scattered), first DataLoader batch
    (``--shuffle``: of a shuffled order, seed 0, as training reads), then all items (not with --first-batch-only);
  * prefetch: connect, ``prefetch`` the same query, first batch, all items.
"Bytes the items need" = meta/ files + the byte ranges ``prefetch.needed_ranges`` computes (Parquet footers and row
groups of the selected episodes, video packets from each frame's keyframe to the frame, container heads).
Each line splits the time to the first batch into connect, prefetch, ``db.dataset()`` (manifest query, metadata
checks, video indexes) and the batch itself, with the requests of each.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import common  # noqa: E402
import torch  # noqa: E402

import lerobot_sql as lsql  # noqa: E402
from http_range_server import RangeServer  # noqa: E402
from lerobot_sql import prefetch as pf  # noqa: E402


def full_download(srv: RangeServer, root: Path, dest: Path) -> tuple[float, int]:
    import urllib.request

    files = [p.relative_to(root.parent) for p in root.rglob("*") if p.is_file()]
    t0 = time.perf_counter()

    def get(rel):
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(f"{srv.url}/{rel}") as r, open(out, "wb") as f:
            return f.write(r.read())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        n = sum(pool.map(get, files))
    return time.perf_counter() - t0, n


def run(srv: RangeServer, root: Path, sql: str, use_prefetch: bool, batch: int, all_items: bool = True,
        threads: int | None = None, shuffle: bool = False) -> dict:
    os.environ["LSQL_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="lsql_bench_")
    atexit.register(shutil.rmtree, cache, True)  # (each run a fresh cache: hundreds of MB left in /tmp otherwise)
    t0 = time.perf_counter()
    db = lsql.connect(f"{srv.url}/{root.name}", threads=threads)
    out = {"connect_s": time.perf_counter() - t0, "connect_requests": db.io_stats()["requests"]}
    if use_prefetch:
        rep = pf.prefetch(db, sql, progress=False)
        out["prefetch_s"] = rep.seconds
    t1, r1 = time.perf_counter(), db.io_stats()["requests"]
    ds = db.dataset(sql)  # the manifest query, the metadata checks, the video indexes (moov boxes, demux)
    out["dataset_s"], out["dataset_requests"] = time.perf_counter() - t1, db.io_stats()["requests"] - r1
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=0, shuffle=shuffle,
                                         generator=torch.Generator().manual_seed(0) if shuffle else None)
    it = iter(loader)
    t2, r2 = time.perf_counter(), db.io_stats()["requests"]
    next(it)
    out["batch_s"], out["batch_requests"] = time.perf_counter() - t2, db.io_stats()["requests"] - r2
    out["first_batch_s"] = time.perf_counter() - t0
    out["first_batch_bytes"] = db.io_stats()["bytes_fetched"]
    if all_items:
        for _ in it:
            pass
    out["all_items_s"] = time.perf_counter() - t0 if all_items else float("nan")
    out["bytes_fetched"] = db.io_stats()["bytes_fetched"]
    out["requests"] = db.io_stats()["requests"]
    if all_items:  # (after the first batch alone, what "all items" need says nothing)
        manifest = db.manifest(sql)
        need = pf.needed_ranges(db, manifest)
        meta = sum(p.stat().st_size for p in (root / "meta").rglob("*") if p.is_file())
        out["bytes_needed"] = meta + sum(b - a for rs in need.values() for a, b in rs)
    else:
        out["bytes_needed"] = float("nan")
    out["items"] = len(ds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = common.BENCH_DATA / "syn200_96"
    ap.add_argument("--root", type=Path, action="append",
                    help="dataset folder (repeat for several; default syn200_96 in $LSQL_BENCH_DATA, else "
                         "../bench_data beside the checkout, when present, or the bundled sample small20)")
    ap.add_argument("--mbit", type=float, default=100)
    ap.add_argument("--latency-ms", type=float, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sql", default="SELECT episode_index FROM episodes WHERE episode_index % 10 = 3",
                    help="the query (default: every 10th episode, scattered)")
    ap.add_argument("--runs", default="lazy,prefetch", help="which of lazy,prefetch to run")
    ap.add_argument("--threads", type=int, default=None,
                    help="DuckDB threads (connect(threads=)); default: one per core. Remote scans wait on round "
                         "trips, so more threads than cores overlap them")
    ap.add_argument("--first-batch-only", action="store_true",
                    help="stop after the first batch (bytes then count what the first batch read)")
    ap.add_argument("--no-download", action="store_true",
                    help="no full download (its time: the dataset's bytes over the link rate)")
    ap.add_argument("--shuffle", action="store_true", help="the first batch of a shuffled order (seed 0)")
    args = ap.parse_args()
    for root in args.root or [default if default.is_dir() else HERE.parent / "sample" / "small20"]:
        bench(root.resolve(), args)


def bench(root: Path, args) -> None:
    n_ep = lsql.connect(root).sql("SELECT count(*) FROM episodes").fetchall()[0][0]
    sql = args.sql
    with RangeServer(root.parent, rate_bps=args.mbit * 1e6, latency_s=args.latency_ms / 1000) as srv:
        if args.no_download:
            n_full = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
            t_full = n_full * 8 / (args.mbit * 1e6)
        else:
            with tempfile.TemporaryDirectory() as d:
                t_full, n_full = full_download(srv, root, Path(d))
        print(f"dataset {root.name}: {n_ep} episodes, {n_full / 1e6:.1f} MB; link {args.mbit:g} Mbit/s, "
              f"{args.latency_ms:g} ms latency; query: {sql}; DuckDB threads: {args.threads or 'default'}; "
              f"load {os.getloadavg()[0]:.2f}")
        print(f"full download: {t_full:.2f} s{' (estimated: bytes / link rate)' if args.no_download else ''}, "
              f"{n_full / 1e6:.2f} MB")
        for name in args.runs.split(","):
            r = run(srv, root, sql, name == "prefetch", args.batch, not args.first_batch_only, args.threads,
                    args.shuffle)
            print(f"{name:8s}: first batch {r['first_batch_s']:.2f} s ({r['first_batch_s'] / t_full:.3f}x full) = "
                  f"connect {r['connect_s']:.2f} s ({r['connect_requests']} req)"
                  + (f" + prefetch {r['prefetch_s']:.2f} s" if "prefetch_s" in r else "")
                  + f" + dataset() {r['dataset_s']:.2f} s ({r['dataset_requests']} req) + first batch "
                  f"{r['batch_s']:.2f} s ({r['batch_requests']} req); all {r['items']} items {r['all_items_s']:.2f} s; "
                  f"fetched {r['bytes_fetched'] / 1e6:.2f} MB in {r['requests']} requests = "
                  f"{r['bytes_fetched'] / r['bytes_needed']:.2f}x the {r['bytes_needed'] / 1e6:.2f} MB the items need "
                  f"({r['bytes_fetched'] / n_full:.1%} of the dataset)", flush=True)


if __name__ == "__main__":
    main()
