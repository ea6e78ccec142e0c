"""Pieces shared by the frame-access benchmark and its lerobot peer script (standard library + numpy only, so the
peer interpreter, which has lerobot but not lerobot_sql, can import this file by path)."""

from __future__ import annotations

import json
import os
import time

import numpy as np


def plan(n_frames: int, fps: float, cameras: list[str], n: int, n_delta: int, dl_batches: int, seed: int) -> dict:
    """The work both readers do: the same item indices for every mode."""
    rng = np.random.default_rng(seed)
    start = n_frames // 3
    delta = {"observation.state": [-2 / fps, -1 / fps, 0.0], "action": [k / fps for k in range(10)]}
    for cam in cameras:
        delta[cam] = [-1 / fps, 0.0]
    return {
        "random": rng.integers(0, n_frames, n).tolist(),
        "sequential": list(range(start, min(n_frames, start + n))),
        "delta": rng.integers(0, n_frames, n_delta).tolist(),
        "dataloader": rng.integers(0, n_frames, 32 * dl_batches).tolist(),
        "delta_timestamps": delta,
    }


def time_items(get, indices: list[int], rounds: int = 1) -> dict:
    """Mean seconds per ``get(i)`` over ``indices``: ``wall`` and ``cpu`` (this process, all threads), each the best
    of ``rounds`` passes, after one untimed warm-up item.

    The minimum over rounds is the estimate least disturbed by other processes on shared cores; CPU time is not
    disturbed by them at all, but counts every thread (it does not credit work done in parallel).
    """
    return time_interleaved({"x": get}, indices, rounds)["x"]


def time_interleaved(getters: dict, indices: list[int], rounds: int = 1) -> dict:
    """``time_items`` for several readers of the same items, alternating them round by round so that load from
    other processes falls on all of them alike."""
    for get in getters.values():
        get(indices[0])
    best = {k: {"wall": float("inf"), "cpu": float("inf")} for k in getters}
    for _ in range(rounds):
        for k, get in getters.items():
            c, t = time.process_time(), time.perf_counter()
            for i in indices:
                get(i)
            n = len(indices)
            best[k]["wall"] = min(best[k]["wall"], (time.perf_counter() - t) / n)
            best[k]["cpu"] = min(best[k]["cpu"], (time.process_time() - c) / n)
    return best


def proc_memory(pid: int) -> dict:
    """Peak RSS (VmHWM), RSS, and private memory (USS = Private_Clean + Private_Dirty), PSS of a process, in MB.

    A forked DataLoader worker's RSS includes every page it shares with the parent (torch, the interpreter); its
    private memory is what the worker itself adds.
    """
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM", "VmRSS")):
                    out[line.split(":")[0]] = int(line.split()[1]) / 1024
        with open(f"/proc/{pid}/smaps_rollup") as f:
            priv = 0
            for line in f:
                if line.startswith(("Private_Clean", "Private_Dirty")):
                    priv += int(line.split()[1])
                elif line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1]) / 1024
            out["USS"] = priv / 1024
    except OSError:
        pass
    return out


def time_dataloader(torch, dataset, indices: list[int], batch_size: int = 32, num_workers: int = 2,
                    sampler=None) -> dict:
    """Items/s of a DataLoader over ``indices`` (after its first batch: worker start-up is reported apart) and the
    workers' memory, read just before they exit."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                         sampler=sampler if sampler is not None else indices,
                                         multiprocessing_context="fork")
    t0 = time.perf_counter()
    it = iter(loader)
    nb = len(loader)
    next(it)
    t1 = time.perf_counter()
    items = 0
    mem = []
    for b in range(1, nb):
        batch = next(it)
        items += len(batch["index"])
        if b == nb - 1:
            mem = [proc_memory(w.pid) for w in getattr(it, "_workers", [])]
    t2 = time.perf_counter()
    del it
    return {"first_batch_s": t1 - t0, "items_per_s": items / (t2 - t1) if items else float("nan"),
            "ms_per_item": 1000 * (t2 - t1) / items if items else float("nan"),
            "worker_peak_rss_mb": max((m.get("VmHWM", 0) for m in mem), default=None),
            "worker_uss_mb": max((m.get("USS", 0) for m in mem), default=None),
            "worker_pss_mb": max((m.get("Pss", 0) for m in mem), default=None)}


def emit(obj: dict) -> None:
    print("BENCH_JSON " + json.dumps(obj), flush=True)


def cpu_info() -> str:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores visible"
