#!/usr/bin/env python
"""LeRobotDataset's side of the frame-access benchmark; runs in a lerobot interpreter (``--peer-python``: default
``$LSQL_PEER_PYTHON``, else ../peer/bin/python beside the checkout; ``bench_train --peer06-python`` likewise with
``$LSQL_PEER06_PYTHON`` and ../peer06/bin/python; see ``common.PEER_PYTHON``).

    python peer_lerobot.py PLAN.json

PLAN.json (written by ``benchmarks/run.py``): root, indices per mode, delta_timestamps, rounds. Runs offline with
the HF home given in the environment; prints one ``BENCH_JSON {...}`` line.

With ``"only": "train"`` (written by ``benchmarks/bench_train.py``): root, indices, profiles (name ->
delta_timestamps or null), batch, workers, rounds, return_uint8; one ``LeRobotDataset`` per profile, then
``rounds + 1`` DataLoader passes over the indices per profile (``common.train_loader``, profiles interleaved within a
round): pass 0 is the first pass after the open ("cold"), the others are steady state. Works with lerobot 0.4.4 and
0.6.1 (``return_uint8`` is passed only when true: 0.4.4 has no such argument).

With ``"only": "hub"`` (``bench_train --remote``; run online: ``common.run_peer(endpoint=...)``, ``HF_ENDPOINT``
at tests/http_range_server.py's HubServer and a fresh HF_HOME): repo_id, profile, delta_timestamps, indices, batch,
workers, return_uint8, passes. ``LeRobotDataset(repo_id)`` with no local copy, as a user training from the Hub gets
it: lerobot asks the Hub for the repo's refs (the codebase-version tag), snapshot_download fetches every file into
the HF cache, then it reads locally. Times ``open_s`` (that open, download included), then ``passes`` DataLoader
passes over the indices (the first one's ``first_batch_s`` completes the time to the first batch from nothing).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

if os.environ.get("LSQL_PEER_ONLINE") != "1":  # hub mode downloads from HF_ENDPOINT; every other mode is offline
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import torch  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402


def _backend(ds) -> str:
    return str(getattr(ds, "video_backend", None) or getattr(ds, "_video_backend", "?"))  # 0.6.1: private


def train(p: dict) -> dict:
    """The training-loader passes of ``bench_train`` (see the module docstring); nothing is read in this process
    before the forks, so lerobot's decoders work in every pass's workers."""
    import lerobot

    kw = {"return_uint8": True} if p.get("return_uint8") else {}
    t = time.perf_counter()
    sets = {name: LeRobotDataset("peer/bench", root=p["root"], delta_timestamps=dt, **kw)
            for name, dt in p["profiles"].items()}
    out = {"reader": "lerobot", "version": getattr(lerobot, "__version__", "?"), "torch": torch.__version__,
           "open_s": time.perf_counter() - t, "backend": _backend(next(iter(sets.values()))),
           "cold": {}, "steady": {name: [] for name in sets}}
    for r in range(p["rounds"] + 1):
        for name, ds in sets.items():
            m = common.train_loader(torch, ds, p["indices"], p["batch"], p["workers"])
            if r == 0:
                out["cold"][name] = m
            else:
                out["steady"][name].append(m)
            print(f"  lerobot {out['version']} {name} pass {r}: {m['items_per_s']:.0f} items/s", file=sys.stderr,
                  flush=True)
    return out


def hub(p: dict) -> dict:
    """``bench_train --remote``'s lerobot side (see the module docstring): download-then-local from nothing."""
    import lerobot

    kw = {"return_uint8": True} if p.get("return_uint8") else {}
    t = time.perf_counter()
    ds = LeRobotDataset(p["repo_id"], delta_timestamps=p["delta_timestamps"], **kw)
    out = {"reader": "lerobot", "version": getattr(lerobot, "__version__", "?"), "open_s": time.perf_counter() - t,
           "root": str(ds.root), "backend": _backend(ds), "passes": []}
    for r in range(p["passes"]):
        m = common.train_loader(torch, ds, p["indices"], p["batch"], p["workers"])
        out["passes"].append(m)
        print(f"  lerobot {out['version']} hub {p['profile']} pass {r}: {m['items_per_s']:.0f} items/s "
              f"(open {out['open_s']:.2f} s)", file=sys.stderr, flush=True)
    return out


def main() -> None:
    p = json.loads(Path(sys.argv[1]).read_text())
    if p.get("only") == "hub":
        common.emit(hub(p))
        return
    if p.get("only") == "train":
        common.emit(train(p))
        return
    root, rounds, repo = p["root"], p["rounds"], "peer/bench"
    out = {"reader": "lerobot"}
    if p.get("only") == "dataloader":
        # Its own process: lerobot's torchcodec decoders, once used in a process, fail inside workers forked from it
        # ("Could not push packet to decoder"), even for a fresh LeRobotDataset, so nothing is read before the fork.
        ds = LeRobotDataset(repo, root=root)
        out["dataloader"] = common.time_dataloader(torch, ds, p["dataloader"])
        common.emit(out)
        return
    import lerobot

    out["version"] = getattr(lerobot, "__version__", "?")
    t = time.perf_counter()
    ds = LeRobotDataset(repo, root=root)  # fresh HF_HOME: converts the parquet into its Arrow cache
    out["open_cold_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ds[p["random"][0]]
    out["first_item_cold_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ds = LeRobotDataset(repo, root=root)
    out["open_warm_s"] = time.perf_counter() - t
    out["backend"] = ds.video_backend
    get = ds.__getitem__
    out["random_s"] = common.time_items(get, p["random"], rounds)
    out["sequential_s"] = common.time_items(get, p["sequential"], rounds)
    dsd = LeRobotDataset(repo, root=root, delta_timestamps=p["delta_timestamps"])
    out["delta_s"] = common.time_items(dsd.__getitem__, p["delta"], rounds)
    # lerobot converts frames with torch ops, which torch spreads over its intra-op threads; on busy shared cores the
    # wake-ups dominate. Timed again with one thread (what DataLoader workers use): its best case.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out["random_t1_s"] = common.time_items(get, p["random"], rounds)
    out["sequential_t1_s"] = common.time_items(get, p["sequential"], rounds)
    out["delta_t1_s"] = common.time_items(dsd.__getitem__, p["delta"], rounds)
    torch.set_num_threads(threads)
    common.emit(out)


if __name__ == "__main__":
    main()
