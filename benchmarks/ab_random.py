"""A/B timing of the frame path and the open: one dataset, two checkouts of lerobot_sql, interleaved.

    python -m benchmarks.ab_random --base <another checkout> --branch . [--dataset sample/small20]
           [--rounds 6] [--items 2000] [--what items|delta|loader|open]

Each round runs one fresh interpreter per checkout (alternating which goes first). ``items`` (default): it opens
the dataset with a warm cache, reads every planned item once (decoders open, maps made, entries checked), then
times the same random items (mean ms per item, best of 3 passes). ``delta``: the same with benchmarks.run's
delta_timestamps (state 3 frames back, action 10 ahead, each camera 1 back). ``loader``: a DataLoader (2 workers,
fork, batch 32) over the random items, after its first batch: ms per item. ``open``: ``lsql.connect(root).dataset()`` for
all frames (what ``LeRobotDataset(repo_id)`` does) on an empty cache dir (cold), then again on the same cache
(warm), 5 times each in the child, best of each; the figure compared is the warm open, the cold one is printed
beside it. Prints each round and the median per checkout: on shared cores only the interleaved comparison means
anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
import lerobot_sql as lsql
root, cache, n, what = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
db = lsql.connect(root, cache_dir=cache)
delta = None
if what == "delta":
    fps = db.fps
    delta = {"observation.state": [-2 / fps, -1 / fps, 0.0], "action": [k / fps for k in range(10)],
             **{c: [-1 / fps, 0.0] for c in db.layout.camera_keys}}
ds = db.dataset(return_uint8=True, delta_timestamps=delta)
idx = np.random.default_rng(0).integers(0, len(ds), n)
if what == "loader":
    import torch
    from torch.utils.data import DataLoader
    best = 1e9
    for _ in range(2):
        it = iter(DataLoader(ds, batch_size=32, num_workers=2, sampler=idx.tolist(), multiprocessing_context="fork"))
        next(it)
        t, k = time.perf_counter(), 0
        for b in it:
            k += len(b["index"])
        best = min(best, (time.perf_counter() - t) / k)
    print(json.dumps({"file": lsql.__file__, "ms": best * 1e3}))
    sys.exit(0)
for i in idx:
    ds[int(i)]
best = 1e9
for _ in range(3):
    t = time.perf_counter()
    for i in idx:
        ds[int(i)]
    best = min(best, (time.perf_counter() - t) / n)
print(json.dumps({"file": lsql.__file__, "ms": best * 1e3}))
"""

CHILD_OPEN = r"""
import json, os, shutil, sys, time
import lerobot_sql as lsql
root, cache = sys.argv[1], sys.argv[2]
cold = warm = 1e9
for k in range(5):
    c = f"{cache}-{k}"
    shutil.rmtree(c, ignore_errors=True)
    t = time.perf_counter()
    lsql.connect(root, cache_dir=c).dataset()
    cold = min(cold, time.perf_counter() - t)
    t = time.perf_counter()
    lsql.connect(root, cache_dir=c).dataset()
    warm = min(warm, time.perf_counter() - t)
print(json.dumps({"file": lsql.__file__, "ms": warm * 1e3, "cold_ms": cold * 1e3}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--branch", default=".")
    ap.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1] / "sample/small20"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--what", choices=("items", "delta", "loader", "open"), default="items")
    a = ap.parse_args(argv)
    a.dataset = str(Path(a.dataset).resolve())  # each child runs in its checkout, so a relative path would move
    res = {"base": [], "branch": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = ["base", "branch"] if r % 2 == 0 else ["branch", "base"]
            for name in order:
                repo = str(Path(getattr(a, name)).resolve())
                child = [CHILD_OPEN, a.dataset, f"{tmp}/{name}-open"] if a.what == "open" else \
                    [CHILD, a.dataset, f"{tmp}/{name}", str(a.items), a.what]
                out = subprocess.run([sys.executable, "-c", *child],
                                     env={"PYTHONPATH": repo, "PATH": "/usr/bin:/bin"}, capture_output=True,
                                     text=True, check=True, cwd=repo)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                assert got["file"].startswith(repo), got
                res[name].append(got["ms"])
                cold = f" (cold {got['cold_ms']:.2f} ms)" if "cold_ms" in got else ""
                print(f"round {r} {name:6s} {got['ms']:.4f} ms{' warm open' if a.what == 'open' else '/item'}{cold}",
                      flush=True)
    mb, mr = statistics.median(res["base"]), statistics.median(res["branch"])
    print(f"median base {mb:.4f} ms, branch {mr:.4f} ms: branch/base = {mr / mb:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
