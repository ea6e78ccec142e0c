#!/usr/bin/env python
"""Training-loader benchmark (issue 18, batched fetch): DataLoader items/s with ``__getitems__`` on and off.

    python -m benchmarks.bench_train [--dataset small20] [--rounds 5] [--items 1536] [--batch 32] [--workers 2]
                                     [--uint8] [--json OUT]
    python -m benchmarks.bench_train --remote [--mbit 100] [--latency-ms 20] [--order blocks|random] [--block 32]
                                     [--k 4] [--rounds 3] ...

``--remote``: the dataset folder is served by tests/http_range_server.py (one token bucket of ``--mbit`` for all
connections, ``--latency-ms`` before every answer). Per profile, the same items in the same order through a
DataLoader (the list of indices as sampler): the local dataset (warm), then the remote one with a fresh cache
(nothing warm: every batch's bytes cross the link) without and with ``ds.pipeline(indices, batches=k)``. items/s
after the first batch; bytes = what the server sent over the whole run (metadata, footers and moov boxes
included) per item, against what the items need (meta/ + ``prefetch.needed_ranges`` of their manifest rows). Best
of ``--rounds`` (items/s: max; bytes and CPU: min). "all cached": the pipelined remote dataset read once more,
everything in its cache (pieces, row groups, indexes): the remote read path without the network. Workers' CPU per
item (utime + stime, /proc) is the figure other jobs on shared cores disturb least. "link-bound items/s" = link rate / needed bytes per item: the most
the link allows, so a profile "fits the link" when it is above the local items/s.

Profiles (``delta_timestamps`` at the dataset's fps): plain (no windows); ACT (action chunk of 50: ``[0..49]``);
diffusion (state and every camera at ``[-1, 0]``, action ``[-1..14]``). For every profile the same shuffled
indices are read by a DataLoader (``num_workers`` forked workers, ``batch_size``, default collate) over one dataset
object twice: with ``__getitems__`` (the batched fetch: torch's fetcher calls it with the batch) and with it hidden
(``ds.__getitems__ = None``: the fetcher then calls ``ds[i]`` per item and ``default_collate`` stacks). items/s is
counted after each loader's first batch (worker start-up excluded). Caches are warm: one untimed pass over the
indices first builds the row-group cache files and video indexes and fills the page cache. The machine is shared:
rounds interleave on/off and the profiles, and the table gives medians over rounds (and the spread), with the
load average before and after, and the workers' CPU time per item (utime + stime from /proc over the same span),
which the other jobs disturb least. Also per profile: one process (no workers) reading the same items, ``ds[i]`` +
``default_collate`` per batch and ``__getitems__`` per batch, with one torch thread as in a worker, to give the
ceiling ``workers x single-process items/s``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import common  # noqa: E402


def _find(name: str) -> Path:
    for base in [Path(name), REPO / "sample" / name, Path(os.environ.get("LSQL_BENCH_DATA", "/work/bench_data")) / name]:
        if (base / "meta" / "info.json").exists():
            return base
    raise SystemExit(f"dataset {name!r} not found (a path, or a name under sample/ or $LSQL_BENCH_DATA)")


def profiles(fps: float, cams: list[str]) -> dict[str, dict | None]:
    return {"plain": None,
            "ACT": {"action": [i / fps for i in range(50)]},
            "diffusion": {"observation.state": [-1 / fps, 0.0], "action": [i / fps for i in range(-1, 15)],
                          **{k: [-1 / fps, 0.0] for k in cams}}}


def _single(torch, ds, indices: list[int], batch: int, batched: bool) -> float:
    """items/s of one process reading the items and collating batches (no DataLoader)."""
    collate = torch.utils.data.default_collate
    t0 = time.perf_counter()
    for j in range(0, len(indices), batch):
        idx = indices[j:j + batch]
        collate(ds.__getitems__(idx) if batched else [ds[i] for i in idx])
    return len(indices) / (time.perf_counter() - t0)


def _cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` in seconds (/proc/<pid>/stat), 0.0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def loader(torch, ds, indices: list[int], batch: int, workers: int) -> dict:
    """items/s after the first batch, and the workers' CPU ms per item over the same span: CPU time is what
    other jobs on shared cores disturb least, so it is the steadier figure on a loaded machine."""
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers, sampler=indices,
                                     multiprocessing_context="fork")
    it = iter(dl)
    next(it)
    pids = [w.pid for w in getattr(it, "_workers", [])]
    c0 = sum(_cpu_s(p) for p in pids)
    t0 = time.perf_counter()
    items = 0
    for b in range(1, len(dl)):
        items += len(next(it)["index"])
        if b == len(dl) - 1:
            c1 = sum(_cpu_s(p) for p in pids)
    t1 = time.perf_counter()
    del it
    return {"items_per_s": items / (t1 - t0), "cpu_ms_per_item": 1000 * (c1 - c0) / items}


def _remote(a, torch, lsql, root: Path) -> int:
    """``--remote``: steady state over a throttled loopback HTTP link, nothing warm (a fresh cache per run)."""
    import tempfile

    sys.path.insert(0, str(REPO / "tests"))
    from http_range_server import RangeServer

    from lerobot_sql import prefetch as pf
    from lerobot_sql.samplers import EpisodeAwareSampler

    sql = "SELECT index FROM frames ORDER BY index"
    db = lsql.connect(root)
    base = db.dataset(sql)
    n, cams = len(base), base.camera_keys
    if a.order == "random":
        order = np.random.default_rng(a.seed).permutation(n)
    else:  # blocks of consecutive frames of one episode, shuffled (what a training run on video would use)
        order = EpisodeAwareSampler(base, block_size=a.block, seed=a.seed).order()
    indices = [int(i) for i in order[:a.items]]
    meta = sum(p.stat().st_size for p in (root / "meta").rglob("*") if p.is_file())
    load0 = os.getloadavg()
    rows = []
    with RangeServer(root.parent, rate_bps=a.mbit * 1e6, latency_s=a.latency_ms / 1000) as srv:
        for prof, dt in profiles(base.fps, cams).items():
            local = db.dataset(sql, delta_timestamps=dt, return_uint8=a.uint8)
            loader(torch, local, indices, a.batch, a.workers)  # warm
            need = pf.needed_ranges(db, local.manifest.take(indices), dt)
            needed = meta + sum(b - x for rs in need.values() for x, b in rs)
            res = {"local": [], "off": [], "on": [], "warm": [], "bytes_off": [], "bytes_on": [], "cpu_local": [],
                   "cpu_off": [], "cpu_on": []}
            for _ in range(a.rounds):
                m = loader(torch, local, indices, a.batch, a.workers)
                res["local"].append(m["items_per_s"])
                res["cpu_local"].append(m["cpu_ms_per_item"])
                for mode in ("off", "on"):
                    rdb = lsql.connect(f"{srv.url}/{root.name}", cache_dir=tempfile.mkdtemp(prefix="lsql_bt_"))
                    sent = srv.bytes_sent()
                    ds = rdb.dataset(sql, delta_timestamps=dt, return_uint8=a.uint8)
                    if mode == "on":
                        ds.pipeline(indices, batches=a.k)
                    m = loader(torch, ds, indices, a.batch, a.workers)
                    res[mode].append(m["items_per_s"])
                    res[f"cpu_{mode}"].append(m["cpu_ms_per_item"])
                    res[f"bytes_{mode}"].append(srv.bytes_sent() - sent)
                # the same remote dataset again, everything cached (pieces, row groups, indexes): the read path's
                # own ceiling, without the network
                res["warm"].append(loader(torch, ds, indices, a.batch, a.workers)["items_per_s"])
            rows.append((prof, {k: max(v) if not k.startswith(("bytes", "cpu")) else min(v) for k, v in res.items()},
                         needed, res))
            print(f"  {prof}: {res}", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    print(f"\n{root.name}: {n} frames, cameras {cams}, {len(indices)} items in {a.order} order"
          f"{f' (blocks of {a.block})' if a.order == 'blocks' else ''}, batch {a.batch}, {a.workers} workers (fork), "
          f"{'uint8' if a.uint8 else 'float32'}; link {a.mbit:g} Mbit/s + {a.latency_ms:g} ms per answer; fresh "
          f"cache per remote run; best of {a.rounds}; pipeline batches={a.k}; load average {load0[0]:.2f} before, "
          f"{load1[0]:.2f} after; {common.cpu_info()}")
    print("\n| profile | local items/s | remote items/s | remote + pipeline items/s | pipeline / local | "
          "remote, all cached, items/s | workers' CPU ms/item: local / remote / pipeline | needed KB/item | "
          "fetched KB/item, off / pipeline | fetched / needed, off / pipeline | link-bound items/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for prof, m, needed, _res in rows:
        ni = len(indices)
        print(f"| {prof} | {m['local']:,.0f} | {m['off']:,.0f} | {m['on']:,.0f} | {m['on'] / m['local']:.2f}x | "
              f"{m['warm']:,.0f} | {m['cpu_local']:.2f} / {m['cpu_off']:.2f} / {m['cpu_on']:.2f} | "
              f"{needed / ni / 1e3:.1f} | {m['bytes_off'] / ni / 1e3:.1f} / {m['bytes_on'] / ni / 1e3:.1f} | "
              f"{m['bytes_off'] / needed:.2f} / {m['bytes_on'] / needed:.2f} | {a.mbit * 1e6 / 8 / (needed / ni):,.0f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "load": [load0, load1],
                                            "rows": [(p, r, nd) for p, _m, nd, r in rows]}, indent=1))
    return 0


def run(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="small20")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--items", type=int, default=1536)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--uint8", action="store_true", help="return_uint8=True")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--remote", action="store_true",
                    help="steady state over a throttled loopback HTTP link: local vs remote vs remote + pipeline")
    ap.add_argument("--mbit", type=float, default=100)
    ap.add_argument("--latency-ms", type=float, default=20)
    ap.add_argument("--order", choices=["random", "blocks"], default="blocks",
                    help="--remote: item order (blocks: EpisodeAwareSampler's shuffled blocks of --block frames)")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--k", type=int, default=4, help="--remote: batches fetched ahead per worker")
    a = ap.parse_args(argv)
    import torch

    import lerobot_sql as lsql

    # the 1-process column models one DataLoader worker, which torch runs with one intra-op thread
    torch.set_num_threads(1)

    root = _find(a.dataset)
    if a.remote:
        return _remote(a, torch, lsql, root.resolve())
    db = lsql.connect(root)
    base = db.dataset("SELECT index FROM frames ORDER BY index")
    n, cams = len(base), base.camera_keys
    indices = [int(i) for i in np.random.default_rng(a.seed).permutation(n)[:a.items]]
    sets = {p: db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=dt, return_uint8=a.uint8)
            for p, dt in profiles(base.fps, cams).items()}
    load0 = os.getloadavg()
    for ds in sets.values():  # warm: cache files, indexes, page cache
        loader(torch, ds, indices, a.batch, a.workers)
    res: dict[str, dict[str, list[float]]] = {p: {"on": [], "off": [], "single": [], "single_off": [], "cpu_on": [], "cpu_off": []} for p in sets}
    for r in range(a.rounds):
        for p, ds in sets.items():
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                if mode == "off":
                    ds.__getitems__ = None  # the fetcher's per-item path: [ds[i] for i in batch] + default_collate
                try:
                    m = loader(torch, ds, indices, a.batch, a.workers)
                    res[p][mode].append(m["items_per_s"])
                    res[p][f"cpu_{mode}"].append(m["cpu_ms_per_item"])
                finally:
                    ds.__dict__.pop("__getitems__", None)
            res[p]["single"].append(_single(torch, ds, indices[:a.batch * 8], a.batch, True))
            res[p]["single_off"].append(_single(torch, ds, indices[:a.batch * 8], a.batch, False))
    load1 = os.getloadavg()
    med = {p: {m: statistics.median(v) for m, v in d.items()} for p, d in res.items()}
    print(f"\n{root.name}: {n} frames, cameras {cams}, {len(indices)} shuffled items, batch {a.batch}, "
          f"{a.workers} workers (fork), {'uint8' if a.uint8 else 'float32'} frames, median of {a.rounds} rounds; "
          f"load average {load0[0]:.2f} before, {load1[0]:.2f} after; {common.cpu_info()}, torch {torch.__version__}")
    print("\n| profile | __getitems__ on, items/s | off (per item + default_collate), items/s | on / off "
          "(median of per-round ratios) | workers' CPU per item, on / off (ms) | CPU off / on | 1 process, on / off, "
          f"items/s | on / ({a.workers} x 1 process on) | rounds on (min-max) | rounds off (min-max) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for p, m in med.items():
        on, off = res[p]["on"], res[p]["off"]
        paired = statistics.median(x / y for x, y in zip(on, off))
        print(f"| {p} | {m['on']:,.0f} | {m['off']:,.0f} | {paired:.2f}x | {m['cpu_on']:.2f} / {m['cpu_off']:.2f} | "
              f"{m['cpu_off'] / m['cpu_on']:.2f}x | {m['single']:,.0f} / {m['single_off']:,.0f} | "
              f"{m['on'] / (a.workers * m['single']):.2f} | {min(on):,.0f}-{max(on):,.0f} | "
              f"{min(off):,.0f}-{max(off):,.0f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "load": [load0, load1], "rounds": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run())
