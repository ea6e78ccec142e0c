"""Pieces shared by the frame-access benchmark and its lerobot peer script (standard library + numpy only, so the
peer interpreter, which has lerobot but not lerobot_sql, can import this file by path), and the default locations
every benchmark script uses for what is not in the repository (``PEER_PYTHON``, ``PEER06_PYTHON``, ``BENCH_DATA``,
``SHARED``): an environment variable, else a folder beside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

# Defaults for what lives outside the repository, relative to the checkout unless an environment variable is set.
REPO = Path(__file__).resolve().parents[1]
# lerobot 0.4.4's interpreter: $LSQL_PEER_PYTHON, else a venv named peer beside the checkout (../peer/bin/python).
PEER_PYTHON = os.environ.get("LSQL_PEER_PYTHON") or str(REPO.parent / "peer" / "bin" / "python")
# lerobot 0.6.1's interpreter: $LSQL_PEER06_PYTHON, else a venv named peer06 beside the checkout.
PEER06_PYTHON = os.environ.get("LSQL_PEER06_PYTHON") or str(REPO.parent / "peer06" / "bin" / "python")
# Generated benchmark datasets (syn200_96, syn20_480, scale/, ...): $LSQL_BENCH_DATA, else ../bench_data.
BENCH_DATA = Path(os.environ.get("LSQL_BENCH_DATA") or REPO.parent / "bench_data")
# The external corpus (datasets/, tools/): $LSQL_SHARED, else ../shared, as in tests/helpers.py.
SHARED = Path(os.environ.get("LSQL_SHARED") or REPO.parent / "shared")


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


def cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` in seconds (/proc/<pid>/stat), 0.0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def train_loader(torch, ds, indices: list[int], batch: int, workers: int) -> dict:
    """One pass of a training DataLoader (``workers`` forked workers, ``batch``, default collate, ``indices`` as
    sampler) over ``ds``: a lerobot_sql dataset or a ``LeRobotDataset``, whose batches both carry ``index``.

    Returns ``items_per_s`` (after the first batch: worker start-up excluded), ``cpu_ms_per_item`` (the workers'
    utime + stime over the same span: what other jobs on shared cores disturb least, so the steadier figure on a
    loaded machine), ``first_batch_s`` (from ``iter()``: fork, worker start-up, first batch) and
    ``epoch_items_per_s`` (every item over the whole pass, start-up and first batch included: the figure a cold
    first epoch is compared on), ``frame_dtype`` (of the first batch's image tensors, None without cameras).
    """
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers, sampler=indices,
                                     multiprocessing_context="fork")
    t_start = time.perf_counter()
    it = iter(dl)
    b0 = next(it)
    first = len(b0["index"])
    # the frames' dtype as delivered (float32, or uint8 with return_uint8): shows that a reader did what was asked
    dtype = next((str(v.dtype) for v in b0.values() if getattr(v, "ndim", 0) >= 4), None)
    del b0
    pids = [w.pid for w in getattr(it, "_workers", [])]
    c0 = sum(cpu_s(p) for p in pids)
    t0 = time.perf_counter()
    items, c1 = 0, c0
    for b in range(1, len(dl)):
        items += len(next(it)["index"])
        if b == len(dl) - 1:  # before the workers exit (their /proc entries go with them)
            c1 = sum(cpu_s(p) for p in pids)
    t1 = time.perf_counter()
    del it
    nan = float("nan")
    return {"items_per_s": items / (t1 - t0) if items else nan,
            "cpu_ms_per_item": 1000 * (c1 - c0) / items if items else nan,
            "first_batch_s": t0 - t_start, "epoch_items_per_s": (items + first) / (t1 - t_start),
            "frame_dtype": dtype}


def run_peer(python: str, script: Path, plan: dict, timeout: float, hf_home: str | None = None,
             endpoint: str | None = None) -> dict:
    """Run ``script PLAN.json`` in another interpreter (lerobot's venv), offline, with ``hf_home`` as HF_HOME (a
    throwaway one when None), and return the dict of its last ``BENCH_JSON`` line, or ``{"error": reason}`` (time-out,
    or the last line of its stderr).

    With ``endpoint`` (a Hub API URL, e.g. tests/http_range_server.py's HubServer) it runs online instead:
    HF_ENDPOINT=endpoint, HF_HUB_OFFLINE and HF_DATASETS_OFFLINE unset, LSQL_PEER_ONLINE=1 (peer_lerobot.py then
    leaves them unset), progress bars off, the throwaway folder as working directory."""
    with tempfile.TemporaryDirectory(prefix="lsql_bench_peer_") as tmp:
        pf = Path(tmp) / "plan.json"
        pf.write_text(json.dumps(plan))
        env = {**os.environ, "HF_HOME": hf_home or str(Path(tmp) / "hf"), "HF_HUB_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1"}
        if endpoint:
            for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
                env.pop(k)
            env.update(HF_ENDPOINT=endpoint, LSQL_PEER_ONLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        try:
            p = subprocess.run([python, str(script), str(pf)], capture_output=True, text=True, env=env,
                               timeout=timeout, cwd=tmp if endpoint else None)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:g}s"}
    out = None
    for line in p.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            out = json.loads(line[len("BENCH_JSON "):])
    if out is None:
        return {"error": (p.stderr.strip().splitlines() or [f"no output (exit {p.returncode})"])[-1][:300]}
    return out


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
