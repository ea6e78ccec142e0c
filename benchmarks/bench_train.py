#!/usr/bin/env python
"""Training-loader benchmark (issue 18, batched fetch): DataLoader items/s with ``__getitems__`` on and off.

    python -m benchmarks.bench_train [--dataset small20] [--rounds 5] [--items 1536] [--batch 32] [--workers 2]
                                     [--uint8] [--json OUT]

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
    a = ap.parse_args(argv)
    import torch

    import lerobot_sql as lsql

    # the 1-process column models one DataLoader worker, which torch runs with one intra-op thread
    torch.set_num_threads(1)

    root = _find(a.dataset)
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
