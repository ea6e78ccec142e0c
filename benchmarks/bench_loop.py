#!/usr/bin/env python
"""The training-loop view (issue 38): a whole large video dataset opened as a training set and read through a
shuffling DataLoader, lerobot_sql against LeRobotDataset, each reader and profile in a fresh process.

    python -m benchmarks.bench_loop [--root DIR] [--profiles act,diffusion] [--batches N] [--peer-batches N]
                                    [--workers 2] [--batch 32] [--step-ms 20] [--seed 0] [--peer-python PY]
                                    [--peer-06 PY] [--no-peer] [--quick] [--json out.json]

``--root`` defaults to the DROID-shaped video scale set (``make_scale_video_set.py generate --episodes 10000``:
10,000 episodes, 2.4M frames, 3 cameras 180x320 h264 at 15 fps, 39 mp4s of ~200 MB). ``--quick``: the 1,000-episode
set and few batches, a sanity run.

Profiles (as ``bench_train``): ACT (action ``[0..49]/fps``), diffusion (state and every camera ``[-1, 0]/fps``, action
``[-1..14]/fps``), plain (no windows). Readers: **lerobot_sql** (``lsql.connect(root, cache_dir=C).dataset(
delta_timestamps=dt)``, every episode); **lerobot 0.4.4** (``LeRobotDataset(repo_id, root=root,
delta_timestamps=dt)`` in ``--peer-python``, default ``$LSQL_PEER_PYTHON``); **lerobot 0.6.1** when ``--peer-06``
names an interpreter. Each (reader, profile) runs in a fresh process (this file run as a script in the reader's
interpreter; only the standard library, numpy and torch at the top) which:

1. imports torch and the reader, then times the open (**open s**);
2. makes ``DataLoader(ds, batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed), num_workers,
   multiprocessing_context="fork", persistent_workers=False)`` (the same on every side: the same torch draws the
   same permutation, which the first batch's indices confirm);
3. pass 1: ``iter()`` and the first batch (**first batch s**: fork, worker start-up, first batch), then ``--batches``
   more: **samples/s** over them, the workers' CPU (utime + stime) per sample over the same span (what other jobs
   on shared cores disturb least), **p50 / p99** of the time waiting in each ``next(it)``, **distinct episodes per
   batch** (mean: how well shuffled the batches are), each worker's private memory (USS = Private_Clean +
   Private_Dirty of /proc/<pid>/smaps_rollup) just after the first batch, after half the batches and after the last
   (each reading taken out of the timed span: it costs 15-30 ms of the worker's kernel time);
4. pass 2 (new workers): the same number of batches, sleeping ``--step-ms`` after each (a stand-in for the GPU step):
   **data wait** = time in ``next(it)`` / wall time, after the first batch (0% = the loader keeps up).

A thread samples the process tree (this process + its DataLoader workers) every 50 ms over both passes: **peak
tree RSS** (sum of VmRSS: counts the pages the workers share with the parent once per process); and at the end of
pass 1 the **tree PSS** (sum of Pss: shared pages split, the memory the tree really holds).

Before the timed processes, one untimed "prep" process per reader opens the set on its empty cache (its **cold open**
is printed below the table): lerobot_sql on a fresh cache folder of this run (then one item per ~mp4 is read so its
video indexes are built, and every tabular row group decoded once into its row-group store, as after any earlier
epoch), lerobot with a fresh HF_HOME of this run (it builds its Arrow cache of the tabular data). The timed processes
reuse those caches (warm). The OS page cache is not dropped.

Frames: on datasets written by ``make_scale_video_set.py`` (generator.json), 4 items of the first batch and 4 of the
last batch of pass 1 of every process are checked: index / episode_index / frame_index, and each camera frame of the
window (offset clamped to the episode, as lerobot pads) carries the framecode of its (clip, frame). lerobot's frames are
checked the same way. Also, the first batch's items (the same indices on both sides) are compared between lerobot_sql
and lerobot 0.4.4: per item, camera and frame, the mean pixel value.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402  (standard library + numpy: importable from the peer interpreters too)

DEFAULT_ROOT = Path(os.environ.get("LSQL_SCALE_ROOT", common.BENCH_DATA / "scale_video")) / "10000"
QUICK_ROOT = DEFAULT_ROOT.parent / "1000"
REPO_ID = "bench/scale_video"
CHECK_ITEMS = 4  # items checked in the first and in the last batch of pass 1


def profiles(fps: float, cams: list[str]) -> dict[str, dict | None]:
    return {"plain": None,
            "act": {"action": [i / fps for i in range(50)]},
            "diffusion": {"observation.state": [-1 / fps, 0.0], "action": [i / fps for i in range(-1, 15)],
                          **{k: [-1 / fps, 0.0] for k in cams}}}


# ---- the child: one reader, one profile, a fresh process -------------------------------------------------------------
def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeSampler(threading.Thread):
    """Peak sum of VmRSS over this process and its children (the DataLoader workers), every ``period`` seconds. Only
    /proc/<pid>/status (microseconds): smaps_rollup costs 15-30 ms of kernel time per read of a worker and holds its
    mmap lock, which slowed the loader it measured on 2 cores."""

    def __init__(self, period: float = 0.05):
        super().__init__(daemon=True)
        self.period, self.stop, self.peak_rss, self.samples = period, threading.Event(), 0, 0

    def run(self):
        me = os.getpid()
        while not self.stop.is_set():
            self.peak_rss = max(self.peak_rss, sum(_status_kb(p, "VmRSS") for p in [me] + _children(me)))
            self.samples += 1
            self.stop.wait(self.period)


def _uss(pids: list[int]) -> list[float]:
    return [round(common.proc_memory(p).get("USS", float("nan")), 1) for p in pids]


def _snap(batch: dict, cams: list[str], rows: list[int]) -> list[dict]:
    """What the frame check needs of some items of a batch (copied: the batch is freed)."""
    out = []
    for r in rows:
        d = {k: int(batch[k][r]) for k in ("index", "episode_index", "frame_index")}
        for c in cams:
            d[c] = batch[c][r].clone()  # (C, H, W) or (T, C, H, W)
        out.append(d)
    return out


def _check(snaps: list[dict], p: dict, fc) -> tuple[int, list[str], list[dict]]:
    """Framecode check of the snapped items (see the module docstring); returns (frames checked, problems, means)."""
    gen = p.get("gen")
    n, bad, means = 0, [], []
    ep_from = np.concatenate([[0], np.cumsum(gen["ep_len"])[:-1]]) if gen else None
    for d in snaps:
        i = d["index"]
        m = {"index": i}
        if gen:
            ep = int(np.searchsorted(ep_from, i, side="right") - 1)
            f = i - int(ep_from[ep])
            if (d["episode_index"], d["frame_index"]) != (ep, f):
                bad.append(f"item {i}: episode/frame {d['episode_index']}/{d['frame_index']}, expected {ep}/{f}")
        for ci, c in enumerate(p["cams"]):
            t = d[c]
            frames = t.unsqueeze(0) if t.ndim == 3 else t
            offs = p["cam_offsets"] if t.ndim == 4 else [0]
            m[c] = [float(x.float().mean()) for x in frames]
            if not gen:
                continue
            clip = (ep * gen["clip_stride"] + ci) % gen["n_clips"]
            for o, img in zip(offs, frames):
                want = min(max(f + o, 0), int(gen["ep_len"][ep]) - 1)
                r = fc.verify_frame(img.numpy(), clip, want, gen["clip_cam"])
                n += 1
                if not r["ok"]:
                    bad.append(f"item {i} {c} offset {o}: not frame {want} of clip {clip} ({r})")
        means.append(m)
    return n, bad, means


def _open(p: dict):
    if p["reader"] == "lerobot_sql":
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        import lerobot_sql as lsql

        t = time.perf_counter()
        ds = lsql.connect(p["root"], cache_dir=p["cache_dir"]).dataset(delta_timestamps=p["dt"])
        return ds, time.perf_counter() - t, {"version": getattr(lsql, "__version__", "?")}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    t = time.perf_counter()
    ds = LeRobotDataset(REPO_ID, root=p["root"], delta_timestamps=p["dt"])
    info = {"version": getattr(lerobot, "__version__", "?"),
            "backend": str(getattr(ds, "video_backend", None) or getattr(ds, "_video_backend", "?"))}
    return ds, time.perf_counter() - t, info


def _pass(torch, dl, n: int, step_s: float, p: dict, keep: bool) -> dict:
    """One pass: iter(), the first batch, ``n`` more (sleeping ``step_s`` after each when > 0)."""
    t0 = time.perf_counter()
    it = iter(dl)
    b = next(it)
    first_s = time.perf_counter() - t0
    pids = [w.pid for w in getattr(it, "_workers", [])]
    out = {"first_batch_s": first_s, "first_indices": [int(x) for x in b["index"][:8]]}
    if keep:
        out["uss_start"] = _uss(pids)
        out["snap_first"] = _snap(b, p["cams"], range(min(CHECK_ITEMS, len(b["index"]))))
    del b
    waits, eps, items = [], [], 0
    last = None
    paused = 0.0  # the mid-pass memory reading, taken out of the wall time
    c0 = sum(common.cpu_s(q) for q in pids)
    t1 = time.perf_counter()
    for k in range(n):
        tw = time.perf_counter()
        try:
            last = next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - tw)
        items += len(last["index"])
        eps.append(len(np.unique(last["episode_index"].numpy())))
        if keep and k == n // 2:
            tp = time.perf_counter()
            out["uss_mid"] = _uss(pids)
            paused += time.perf_counter() - tp
        if step_s:
            time.sleep(step_s)
    wall = time.perf_counter() - t1 - paused
    # the workers' utime + stime over the same span (they prefetch as far ahead at the end as at the start)
    out["worker_cpu_ms_per_sample"] = 1e3 * (sum(common.cpu_s(q) for q in pids) - c0) / items if items else None
    if keep:  # the workers live until the iterator goes (they are still prefetching)
        out["uss_end"] = _uss(pids)
        out["tree_pss_end_mb"] = (_pss_kb(os.getpid()) + sum(_pss_kb(q) for q in pids)) / 1024
        if last is not None:
            out["snap_last"] = _snap(last, p["cams"], range(min(CHECK_ITEMS, len(last["index"]))))
    del last, it
    w = np.array(waits) if waits else np.array([float("nan")])
    out.update({"batches": len(waits), "items": items, "wall_s": wall,
                "samples_per_s": items / wall if items else float("nan"),
                "wait_p50_ms": 1e3 * float(np.percentile(w, 50)), "wait_p99_ms": 1e3 * float(np.percentile(w, 99)),
                "wait_mean_ms": 1e3 * float(w.mean()), "wait_frac": float(w.sum()) / wall if wall else float("nan"),
                "distinct_episodes": float(np.mean(eps)) if eps else float("nan")})
    return out


def child(p: dict) -> dict:
    import torch

    spec = importlib.util.spec_from_file_location("framecode", REPO / "tests" / "data" / "framecode.py")
    fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fc)
    rss_imports = _status_kb(os.getpid(), "VmRSS") / 1024
    ds, open_s, info = _open(p)
    out = {"reader": p["reader"], "profile": p["profile"], "open_s": open_s, "n": len(ds), "torch": torch.__version__,
           "rss_imports_mb": rss_imports, "rss_after_open_mb": _status_kb(os.getpid(), "VmRSS") / 1024, **info}
    if p.get("prep"):  # the untimed prep process: the cold open, and (lerobot_sql) one item per stretch of frames
        t = time.perf_counter()
        for i in np.linspace(0, len(ds) - 1, p.get("prep_items", 0)).astype(int).tolist():
            ds[i]
        out["prep_items_s"] = time.perf_counter() - t
        if p["reader"] == "lerobot_sql":
            # the tabular data decoded once, as lerobot's prep builds its Arrow cache of it: every row group into
            # the row-group store, which a long training run's first epoch fills (an item every 100 frames: every
            # episode of 120-360 frames, so every row group, is touched), 2 workers
            import lerobot_sql as lsql

            t = time.perf_counter()
            tab = lsql.connect(p["root"], cache_dir=p["cache_dir"]).dataset(cameras=[])
            for _ in torch.utils.data.DataLoader(tab, batch_size=256, sampler=range(0, len(tab), 100),
                                                 num_workers=2, multiprocessing_context="fork"):
                pass
            out["prep_store_s"] = time.perf_counter() - t
        return out
    sampler = TreeSampler()
    sampler.start()
    g = torch.Generator().manual_seed(p["seed"])
    dl = torch.utils.data.DataLoader(ds, batch_size=p["batch"], shuffle=True, generator=g,
                                     num_workers=p["workers"], multiprocessing_context="fork",
                                     persistent_workers=False)
    out["pass1"] = _pass(torch, dl, p["batches"], 0.0, p, keep=True)
    out["pass2"] = _pass(torch, dl, p["batches"], p["step_ms"] / 1000, p, keep=False)
    sampler.stop.set()
    sampler.join()
    out["peak_tree_rss_mb"] = sampler.peak_rss / 1024
    out["rss_samples"] = sampler.samples
    snaps = out["pass1"].pop("snap_first") + out["pass1"].pop("snap_last", [])
    n, bad, means = _check(snaps, p, fc)
    out.update({"frames_checked": n, "frame_problems": bad, "first_batch_means": means[:CHECK_ITEMS]})
    return out


# ---- the driver -------------------------------------------------------------------------------------------------------
def _run_child(python: str, plan: dict, env: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="lsql_bench_loop_") as tmp:
        pf = Path(tmp) / "plan.json"
        pf.write_text(json.dumps(plan))
        t = time.perf_counter()
        try:
            r = subprocess.run([python, str(Path(__file__).resolve()), "--child", str(pf)], capture_output=True,
                               text=True, env={**os.environ, **env}, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:g} s"}
    line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith("BENCH_JSON ")), None)
    if line is None:
        tail = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-3:] or [f"no output (exit {r.returncode})"]
        return {"error": " | ".join(tail)[-600:]}
    out = json.loads(line[len("BENCH_JSON "):])
    out["process_s"] = time.perf_counter() - t
    return out


def _gen(root: Path) -> dict | None:
    """What the frame check needs of a make_scale_video_set dataset: episode lengths, clips (None: not one)."""
    g = root / "generator.json"
    if not g.exists():
        return None
    args = json.loads(g.read_text())["args"]
    import make_scale_video_set as mk  # this interpreter only (it imports av, pyarrow)

    _, ep_len, _ = mk._plan(args["episodes"], args["seed"], tuple(args["lengths"]))
    return {"ep_len": ep_len.tolist(), "n_clips": args["n_clips"], "clip_cam": args["clip_cam"],
            "clip_stride": args.get("clip_stride", mk.CLIP_STRIDE)}


def _f(x, spec) -> str:
    return "-" if x is None or x != x else format(x, spec)


def _name(r: dict) -> str:
    """The reader's column label: lerobot_sql with its version; a lerobot slot, with the version found when other."""
    if r["reader"] == "lerobot_sql":
        return f"lerobot_sql {r.get('version', '')}".strip()
    v = r.get("version")
    return r["reader"] if not v or r["reader"].endswith(v) else f"{r['reader']} (has {v})"


def _mem(r: dict) -> str:
    p = r["pass1"]
    s, m, e = p.get("uss_start") or [], p.get("uss_mid") or [], p.get("uss_end") or []
    return " / ".join(f"{a:.0f}→{b:.0f}→{c:.0f}" for a, b, c in zip(s, m, e)) or "-"


def table(res: dict) -> str:
    rows = res["runs"]
    base = {r["profile"]: r for r in rows if r["reader"] == "lerobot_sql" and "error" not in r}
    lines = ["| reader | profile | open s | first batch s | samples/s (batches) | ours / this | workers' CPU ms/sample (ours / "
             "this) | wait p50 / p99 ms | "
             f"data wait at {res['args']['step_ms']:g} ms/step | tree RSS peak / PSS at end, GB | worker USS MB, start→mid→end | "
             "distinct episodes / batch | frames checked |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['reader']} | {r['profile']} | failed: {r['error'][:200]} |" + " |" * 10)
            continue
        p1, p2 = r["pass1"], r["pass2"]
        ours = base.get(r["profile"])
        ratio = (f"{ours['pass1']['samples_per_s'] / p1['samples_per_s']:.2f}x"
                 if ours and r["reader"] != "lerobot_sql" else "")
        nbad = len(r["frame_problems"])
        cpu = p1.get("worker_cpu_ms_per_sample")
        ocpu = ours["pass1"].get("worker_cpu_ms_per_sample") if ours else None
        cpu_cell = _f(cpu, ".2f") + (f" ({ocpu / cpu:.2f}x)" if ours and r["reader"] != "lerobot_sql" and cpu and ocpu
                                     else "")
        fc = f"{r['frames_checked']} " + ("ok" if not nbad else f"- {nbad} BAD") if r["frames_checked"] else "-"
        lines.append(
            f"| {_name(r)} | {r['profile']} | {r['open_s']:.2f} | "
            f"{p1['first_batch_s']:.2f} | {p1['samples_per_s']:,.0f} ({p1['batches']}) | {ratio} | {cpu_cell} | "
            f"{p1['wait_p50_ms']:.1f} / {p1['wait_p99_ms']:.1f} | {100 * p2['wait_frac']:.0f}% "
            f"({p2['samples_per_s']:,.0f}/s) | {r['peak_tree_rss_mb'] / 1024:.2f} / {p1['tree_pss_end_mb'] / 1024:.2f} | "
            f"{_mem(r)} | {_f(p1['distinct_episodes'], '.1f')} | {fc} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=None, help=f"default {DEFAULT_ROOT} (--quick: {QUICK_ROOT})")
    ap.add_argument("--profiles", default="act,diffusion", help="comma-separated: plain, act, diffusion")
    ap.add_argument("--batches", type=int, default=None,
                    help="batches after the first, per pass, lerobot_sql (default 300; --quick 20)")
    ap.add_argument("--peer-batches", type=int, default=None,
                    help="the same for lerobot (default 60; --quick 10): it is slower, each pass would take minutes")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer-python", default=common.PEER_PYTHON, help="lerobot 0.4.4 (default $LSQL_PEER_PYTHON)")
    ap.add_argument("--peer-06", default=None, help="an interpreter with lerobot 0.6.1 (default: none)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the 1,000-episode set and 20 / 10 batches")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per process")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        common.emit(child(json.loads(a.child.read_text())))
        return 0
    a.root = (a.root or (QUICK_ROOT if a.quick else DEFAULT_ROOT)).resolve()
    a.batches = a.batches or (20 if a.quick else 300)
    a.peer_batches = a.peer_batches or (10 if a.quick else 60)
    if not (a.root / "meta" / "info.json").exists():
        sys.exit(f"{a.root}: no dataset (python -m benchmarks.make_scale_video_set generate --episodes 10000)")
    info = json.loads((a.root / "meta" / "info.json").read_text())
    fps = info["fps"]
    cams = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    profs = profiles(fps, cams)
    names = [x.strip().lower() for x in a.profiles.split(",") if x.strip()]
    if bad := [x for x in names if x not in profs]:
        sys.exit(f"unknown profiles {bad}: choose from {list(profs)}")
    gen = _gen(a.root)
    readers = [("lerobot_sql", sys.executable, a.batches)]
    notes = []
    if not a.no_peer:
        for name, py in (("lerobot 0.4.4", a.peer_python), ("lerobot 0.6.1", a.peer_06)):
            if py and Path(py).exists():
                readers.append((name, py, a.peer_batches))
            elif py:
                notes.append(f"{name}: {py} not found, skipped")
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    res = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}, "root": str(a.root),
           "frames": info.get("total_frames"), "episodes": info.get("total_episodes"), "cameras": cams,
           "cpu": common.cpu_info(), "load_before": load0, "prep": {}, "runs": []}
    with tempfile.TemporaryDirectory(prefix="lsql_bench_loop_cache_") as tmp:
        cache_dir = Path(tmp) / "lsql_cache"
        envs = {}
        for reader, py, _nb in readers:
            env = {"PYTHONPATH": ""}
            if reader != "lerobot_sql":  # a throwaway HF_HOME per lerobot, shared by its processes of this run
                env.update(HF_HOME=str(Path(tmp) / f"hf_{reader.split()[-1]}"), HF_HUB_OFFLINE="1",
                           HF_DATASETS_OFFLINE="1")
            envs[reader] = env
            plan = {"reader": reader, "root": str(a.root), "cache_dir": str(cache_dir), "dt": None, "prep": True,
                    "prep_items": 64 if reader == "lerobot_sql" else 0, "profile": "prep"}
            print(f"[bench_loop] {reader}: prep (cold open) ...", file=sys.stderr, flush=True)
            res["prep"][reader] = r = _run_child(py, plan, env, a.timeout)
            print(f"  {json.dumps({k: v for k, v in r.items() if not isinstance(v, (dict, list))})}",
                  file=sys.stderr, flush=True)
        for prof in names:
            for reader, py, nb in readers:
                if "error" in res["prep"].get(reader, {}):
                    res["runs"].append({"reader": reader, "profile": prof, "error": res["prep"][reader]["error"]})
                    continue
                dt = profs[prof]
                offs = [round(x * fps) for x in dt[cams[0]]] if dt and cams and cams[0] in dt else [0]
                plan = {"reader": reader, "root": str(a.root), "cache_dir": str(cache_dir), "dt": dt,
                        "profile": prof, "batch": a.batch, "workers": a.workers, "seed": a.seed, "batches": nb,
                        "step_ms": a.step_ms, "cams": cams, "cam_offsets": offs, "gen": gen}
                print(f"[bench_loop] {reader} {prof}: {nb} batches x 2 passes ...", file=sys.stderr, flush=True)
                t = time.perf_counter()
                r = _run_child(py, plan, envs[reader], a.timeout)
                r.setdefault("reader", reader)
                r.setdefault("profile", prof)
                r["load_after"] = os.getloadavg()
                res["runs"].append(r)
                msg = r.get("error") or (f"{r['pass1']['samples_per_s']:.0f} samples/s, first batch "
                                         f"{r['pass1']['first_batch_s']:.2f} s, frames {r['frames_checked']}, "
                                         f"problems {len(r['frame_problems'])}")
                print(f"  {time.perf_counter() - t:.0f} s: {msg}", file=sys.stderr, flush=True)
    res["load_after"] = os.getloadavg()
    res["seconds"] = time.perf_counter() - t_start
    # the same indices and values on both sides: the first batch's items compared with lerobot 0.4.4's
    by = {(r["reader"], r["profile"]): r for r in res["runs"] if "error" not in r}
    cross = []
    for prof in names:
        o, l = by.get(("lerobot_sql", prof)), by.get(("lerobot 0.4.4", prof))
        if not (o and l):
            continue
        same = o["pass1"]["first_indices"] == l["pass1"]["first_indices"]
        diffs = [abs(x - y) for mo, ml in zip(o["first_batch_means"], l["first_batch_means"]) if mo["index"] == ml["index"]
                 for c in cams for x, y in zip(mo[c], ml[c])]
        cross.append({"profile": prof, "same_order": same, "frames": len(diffs),
                      "max_mean_diff": max(diffs) if diffs else None})
    res["cross"] = cross
    print(f"\n{a.root}: {res['episodes']:,} episodes, {res['frames']:,} frames, cameras {len(cams)} x "
          f"{'x'.join(map(str, info['features'][cams[0]]['shape'][:2])) if cams else '-'}, {fps} fps; DataLoader: "
          f"batch {a.batch}, {a.workers} forked workers, shuffle (torch.Generator seed {a.seed}), persistent workers "
          f"off; batches after the first, per pass: lerobot_sql {a.batches}, lerobot {a.peer_batches}"
          f"{' (--quick)' if a.quick else ''}; {res['cpu']}\n")
    print(table(res))
    print()
    for reader, r in res["prep"].items():
        if "error" in r:
            print(f"{reader}: prep failed: {r['error']}")
        else:
            extra = (f"; then {64} items spread over the set (video indexes built) {r['prep_items_s']:.1f} s; the "
                     f"tabular row groups decoded into the row-group store {r.get('prep_store_s', float('nan')):.1f} s"
                     if reader == "lerobot_sql" else "")
            print(f"{_name(r)}: cold open (empty cache) {r['open_s']:.2f} s{extra}")
    for c in cross:
        print(f"{c['profile']}: first batch, same indices on both sides: {c['same_order']}; {c['frames']} camera "
              f"frames compared with lerobot 0.4.4, max |mean pixel difference| {_f(c['max_mean_diff'], '.4f')}")
    total = sum(r.get("frames_checked", 0) for r in res["runs"])
    probs = [f"{r['reader']} {r['profile']}: {p}" for r in res["runs"] for p in r.get("frame_problems", [])]
    ours_n = sum(r.get("frames_checked", 0) for r in res["runs"] if r["reader"] == "lerobot_sql")
    ours_bad = sum(len(r.get("frame_problems", [])) for r in res["runs"] if r["reader"] == "lerobot_sql")
    verdict = "ok" if not ours_bad else f"- {ours_bad} BAD"
    print(f"frames checked: {ours_n} {verdict} (lerobot_sql; all readers: "
          f"{total}, {len(probs)} bad)" if gen else "frames checked: 0 (no generator.json: no framecode check)")
    for p in probs[:10]:
        print("  " + p)
    for n in notes:
        print(n)
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; after: "
          f"{res['load_after'][0]:.2f} {res['load_after'][1]:.2f} {res['load_after'][2]:.2f}; "
          f"total {res['seconds'] / 60:.1f} min")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 1 if probs else 0


if __name__ == "__main__":
    sys.exit(main())
