#!/usr/bin/env python
"""Frame access benchmark: lerobot_sql vs LeRobotDataset (lerobot 0.4.4) vs the PyAV decode limit, same run.

    python -m benchmarks.run [--full] [--datasets small20,syn200_96,syn20_480] [--peer-python PATH] [--json OUT]

For every dataset, the three readers get the same item indices (``benchmarks/common.plan``):
  * random single frames, sequential frames (a run from a third into the dataset), delta_timestamps items
    (state 3 past, action 10 future, every camera [-1/fps, 0]); best-of-rounds mean ms/item, one warm-up item;
  * a DataLoader (num_workers=2, batch 32, fork) over random indices: items/s after the first batch, and each
    worker's peak RSS and private memory (USS) just before it exits; for lerobot_sql also with EpisodeAwareSampler;
  * open time: cold (empty lerobot_sql cache / fresh HF_HOME) and warm, for every frame (``db.dataset()`` /
    ``LeRobotDataset(repo_id)``), then the first item after the cold open (lerobot_sql builds row groups and video
    indexes on first use); files are in the OS page cache either way. Ours also through SQL (``SELECT index ...``).
LeRobotDataset runs in its own interpreter (``--peer-python``, default ``$LSQL_PEER_PYTHON``, else ../peer/bin/python
beside the checkout; the column is skipped with a note when it is missing), offline with a throwaway HF_HOME. The
decode limit is PyAV alone: one open container per file, seek to the target's keyframe only when decoding forward
cannot reach it, decode to the target, convert to an rgb24 ndarray with a reused single-thread reformatter; cameras
one after the other, no tensors. Datasets are looked up in $LSQL_BENCH_DATA (default ../bench_data beside the
checkout), in sample/, and then in the shared datasets ($LSQL_SHARED/datasets, default ../shared/datasets beside the
checkout).

``run(argv)`` is the entry point (``lerobot-sql bench`` calls it); it prints a table and returns 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import common  # noqa: E402

DEFAULT_PEER = common.PEER_PYTHON
# sample/: the generated sets the repository ships (small20, multifile60, ...), so a fresh clone finds them.
SEARCH = [str(common.BENCH_DATA), str(REPO / "sample"), str(common.SHARED / "datasets")]


def _find(name: str) -> Path | None:
    p = Path(name)
    if (p / "meta" / "info.json").exists():
        return p
    for base in SEARCH:
        q = Path(base) / name
        if (q / "meta" / "info.json").exists():
            return q
    return None


# ---- lerobot_sql -------------------------------------------------------------------------------------------
def bench_ours(root: Path, plan: dict, rounds: int, sampler_row: bool) -> dict:
    import torch

    import lerobot_sql as lsql
    from lerobot_sql.torch.samplers import EpisodeAwareSampler

    out = {"reader": "lerobot_sql"}
    sql = "SELECT index FROM frames ORDER BY index"
    # One-time imports are outside every open timing, on both sides: LeRobotDataset's module imports torch, pandas
    # and datasets before its timer starts; pyarrow imports pandas on its first array.
    import pandas  # noqa: F401

    import lerobot_sql.torch.dataset  # noqa: F401  (as LeRobotDataset's module is imported before its open is timed)
    with tempfile.TemporaryDirectory(prefix="lsql_bench_cache_") as cache:
        for phase in ("cold", "warm"):
            # The same call as LeRobotDataset(repo_id, root=...): every frame, no SQL (meta/episodes pointers).
            t0 = time.perf_counter()
            db = lsql.connect(root, cache_dir=cache)
            t1 = time.perf_counter()
            ds = db.dataset()
            t2 = time.perf_counter()
            out[f"open_{phase}_s"] = t2 - t0
            out[f"open_{phase}_parts_s"] = {"connect": t1 - t0, "dataset()": t2 - t1}
            if phase == "cold":
                # lerobot_sql builds row groups and video indexes on first use: the first item pays for them.
                t = time.perf_counter()
                ds[plan["random"][0]]
                out["first_item_cold_s"] = time.perf_counter() - t
                db.close()
        with tempfile.TemporaryDirectory(prefix="lsql_bench_cache_") as cache2:
            t0 = time.perf_counter()
            dbs = lsql.connect(root, cache_dir=cache2)
            dss = dbs.dataset(sql)  # the same frames through SQL: DuckDB views + the index join
            out["open_sql_cold_s"] = time.perf_counter() - t0
            dbs.close()
        assert len(dss) == len(ds)
        limit = DecodeLimit(db, ds)
        for mode, lim in (("random", limit.item), ("sequential", limit.item)):
            r = common.time_interleaved({"ours": ds.__getitem__, "limit": lim}, plan[mode], rounds)
            out[f"{mode}_s"], out[f"limit_{mode}_s"] = r["ours"], r["limit"]
        dsd = db.dataset(sql, delta_timestamps=plan["delta_timestamps"])
        r = common.time_interleaved({"ours": dsd.__getitem__, "limit": limit.delta_item}, plan["delta"], rounds)
        out["delta_s"], out["limit_delta_s"] = r["ours"], r["limit"]
        limit.close()
        if plan.get("dataloader"):
            fresh = db.dataset(sql)  # nothing opened in the parent before the fork
            out["dataloader"] = common.time_dataloader(torch, fresh, plan["dataloader"])
            if sampler_row:
                order = list(EpisodeAwareSampler(fresh, block_size=8, seed=0))[:len(plan["dataloader"])]
                out["dataloader_sampler"] = common.time_dataloader(torch, fresh, order)
            # uint8 frames: 4x fewer bytes through the worker -> main process queues (convert on the device)
            out["dataloader_uint8"] = common.time_dataloader(torch, db.dataset(sql, return_uint8=True),
                                                             plan["dataloader"])
        db.close()
    return out


class DecodeLimit:
    """PyAV alone, decoding only the frames an item needs (targets come from lerobot_sql's index, untimed)."""

    def __init__(self, db, ds):
        import av
        from av.video.reformatter import VideoReformatter

        from lerobot_sql._readers import locate, video_index

        m = ds.manifest
        self.keys = [k for k in ds.camera_keys if k in db.layout.video_keys]
        self.files = {}
        self.targets = {}  # camera -> per sample (mp4, its index, video row): the frame nearest its time, untimed
        for k in self.keys:
            rels = m[f"{k}/file"].to_numpy(zero_copy_only=False)
            times = locate.time_in_file(m[f"{k}/from_timestamp"].to_numpy(), m["timestamp"].to_numpy())
            per = [None] * len(rels)
            for rel in np.unique(rels):
                c = av.open(str(db.source.path(rel)))
                s = c.streams.video[0]
                s.codec_context.thread_count = 1
                self.files[rel] = [c, s, None, None, VideoReformatter()]  # container, stream, frames, pos, R
                index = video_index.FrameIndex.load(video_index.ensure_index_arrow(db.source, rel, db.cache_dir))
                sel = np.flatnonzero(rels == rel)
                for j, r in zip(sel, locate.nearest(index.pts_s, times[sel])[0]):
                    per[j] = (rel, index, int(r))
            self.targets[k] = per
        self.ep = m["episode_index"].to_numpy()

    def _frame(self, rel: str, index, r: int):
        f = self.files[rel]
        c, s, frames, pos, R = f
        kr = int(index.key_row[r])
        if pos is None or r < pos or kr > pos:
            c.seek(int(index.pts[kr]), stream=s, backward=True, any_frame=False)
            frames = f[2] = c.decode(s)
        want = int(index.pts[r])
        for fr in frames:
            if fr.pts == want:
                arr = R.reformat(fr, format="rgb24", threads=1).to_ndarray()
                f[3] = r + 1
                return arr
        raise RuntimeError(f"{rel}: pts {want} not reached")

    def _rows(self, k: str, i: int):
        return self.targets[k][i]

    def item(self, i: int):
        return [self._frame(*self._rows(k, i)) for k in self.keys]

    def delta_item(self, i: int):
        return self.window_item(i, (-1, 0))  # every camera at [-1/fps, 0]

    def window_item(self, i: int, offsets) -> list:
        """Every camera's frames at ``i + o`` for each offset ``o`` (frames), clamped to ``i``'s episode as lerobot
        pads (the edge frame repeats); a repeated frame is decoded once."""
        if not hasattr(self, "_lo"):  # first/last position of each position's episode (the manifest is in order)
            cut = np.flatnonzero(np.diff(self.ep)) + 1
            starts, ends = np.r_[0, cut], np.r_[cut, len(self.ep)]
            run = np.repeat(np.arange(len(starts)), ends - starts)
            self._lo, self._hi = starts[run], ends[run] - 1
        lo, hi = int(self._lo[i]), int(self._hi[i])
        out = []
        for k in self.keys:
            done: dict[int, object] = {}
            for o in offsets:
                j = min(max(i + o, lo), hi)
                if j not in done:
                    done[j] = self._frame(*self._rows(k, j))
                out.append(done[j])
        return out

    def close(self):
        for f in self.files.values():
            f[0].close()


# ---- lerobot (peer interpreter) ------------------------------------------------------------------------------
def bench_peer(peer: str, root: Path, plan: dict, rounds: int, timeout: int) -> dict:
    script = HERE / "peer_lerobot.py"
    with tempfile.TemporaryDirectory(prefix="lsql_bench_peer_") as tmp:
        hf = str(Path(tmp) / "hf")  # one HF_HOME for both processes: the first open is the cold one
        out = common.run_peer(peer, script, {**plan, "root": str(root), "rounds": rounds}, timeout, hf)
        if "error" not in out and plan.get("dataloader"):  # a second, clean process (see peer_lerobot.py)
            q = common.run_peer(peer, script, {**plan, "root": str(root), "rounds": rounds, "only": "dataloader"},
                                timeout, hf)
            if "error" not in q:
                out.update(q)
        return out


# ---- report ----------------------------------------------------------------------------------------------
def _best(runs: list[dict], key: str, sub: str | None = None, fn=min):
    vals = []
    for r in runs:
        v = r.get(key)
        if sub is not None:
            v = v.get(sub) if isinstance(v, dict) else None
        if isinstance(v, (int, float)) and v == v:
            vals.append(v)
    return fn(vals) if vals else None


def _ms(s):
    return "-" if s is None else f"{1000 * s:.2f} ms ({1 / s:,.0f}/s)"


def _ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def table(name: str, info: dict, ours: list[dict], peer: list[dict], peer_note: str) -> list[str]:
    L = [f"\n### {name}: {info['frames']:,} frames, {info['episodes']} episodes, cameras {info['cameras']} at "
         f"{info['res']}", "",
         "| measure | lerobot_sql | LeRobotDataset | LeRobotDataset, torch 1 thread | decode limit | "
         "speed-up vs LeRobotDataset (default / 1 thread) | lerobot_sql time / limit |",
         "|---|---:|---:|---:|---:|---:|---:|"]
    for clock in ("wall", "cpu"):
        for label, key in (("random item", "random"), ("sequential item", "sequential"),
                           ("delta_timestamps item", "delta")):
            a, b = _best(ours, f"{key}_s", clock), _best(peer, f"{key}_s", clock)
            b1, c = _best(peer, f"{key}_t1_s", clock), _best(ours, f"limit_{key}_s", clock)
            L.append(f"| {label}, {clock} | {_ms(a)} | {_ms(b)} | {_ms(b1)} | {_ms(c)} | {_ratio(b, a)} / "
                     f"{_ratio(b1, a)} | {_ratio(a, c)} |")
    for label, key in (("DataLoader w=2 b=32, items/s", "dataloader"),
                       ("same, EpisodeAwareSampler(block 8)", "dataloader_sampler"),
                       ("same indices, return_uint8=True", "dataloader_uint8")):
        a, b = _best(ours, key, "items_per_s", max), _best(peer, key, "items_per_s", max)
        if a is None and b is None:
            continue
        fa = "-" if a is None else f"{a:,.0f}"
        fb = "-" if b is None else f"{b:,.0f}"
        L.append(f"| {label} | {fa} | {fb} | | | {_ratio(a, b) if a and b else '-'} | |")
    for label, sub in (("worker peak RSS, MB", "worker_peak_rss_mb"), ("worker private (USS), MB", "worker_uss_mb"),
                       ("worker PSS, MB", "worker_pss_mb")):
        a, b = _best(ours, "dataloader", sub, max), _best(peer, "dataloader", sub, max)
        L.append(f"| {label} | {'-' if a is None else f'{a:.0f}'} | {'-' if b is None else f'{b:.0f}'} | | | | |")
    for label, key in (("open, cold cache (s)", "open_cold_s"), ("open, warm cache (s)", "open_warm_s"),
                       ("first item after the cold open (s)", "first_item_cold_s"),
                       ("open through SQL `SELECT index FROM frames`, cold (s)", "open_sql_cold_s")):
        a, b = _best(ours, key), _best(peer, key)
        L.append(f"| {label} | {'-' if a is None else f'{a:.3f}'} | {'-' if b is None else f'{b:.3f}'} | | | "
                 f"time ratio {_ratio(a, b) if a and b else '-'} | |")
    parts = [r.get("open_cold_parts_s") for r in ours if r.get("open_cold_parts_s")]
    if parts:
        p = min(parts, key=lambda d: sum(d.values()))
        L.append("\nlerobot_sql cold open = " + ", ".join(f"{k} {v:.3f} s" for k, v in p.items()))
    if peer_note:
        L.append(f"\nLeRobotDataset column: {peer_note}")
    return L


def _info(root: Path) -> dict:
    meta = json.loads((root / "meta" / "info.json").read_text())
    cams = [k for k, f in meta["features"].items() if f["dtype"] == "video"]
    res = {f"{meta['features'][k]['shape'][0]}x{meta['features'][k]['shape'][1]}" for k in cams}
    return {"frames": meta["total_frames"], "episodes": meta["total_episodes"], "fps": meta["fps"], "cameras": cams,
            "res": ",".join(sorted(res)) or "-"}


def run(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lerobot-sql bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="more items and rounds (about 3x longer)")
    ap.add_argument("--datasets", default="small20,syn200_96,syn20_480",
                    help="comma-separated dataset names (looked up in $LSQL_BENCH_DATA, then shared) or paths")
    ap.add_argument("--peer-python", default=DEFAULT_PEER,
                    help="interpreter with lerobot 0.4.4 (default $LSQL_PEER_PYTHON, else ../peer/bin/python beside "
                         "the checkout)")
    ap.add_argument("--no-peer", action="store_true", help="skip the LeRobotDataset column")
    ap.add_argument("--repeat", type=int, default=None, help="run each reader this many times, keep the best")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write all raw numbers to this file")
    a = ap.parse_args(argv)
    rounds = 5 if a.full else 3
    repeat = a.repeat or (2 if a.full else 1)
    peer_ok = not a.no_peer and Path(a.peer_python).exists()
    peer_note = "" if peer_ok else ("skipped (--no-peer)" if a.no_peer else
                                    f"skipped: {a.peer_python} not found (set --peer-python or $LSQL_PEER_PYTHON)")
    import av
    import torch

    head = [f"# lerobot_sql frame access benchmark ({time.strftime('%Y-%m-%d %H:%M')})",
            f"machine: {common.cpu_info()}, {platform.platform()}, python {platform.python_version()}, "
            f"torch {torch.__version__} (intra-op threads {torch.get_num_threads()}), PyAV {av.__version__}",
            f"load average at start: {os.getloadavg()[0]:.1f}; mode: {'full' if a.full else 'quick'} "
            f"(best of {rounds} rounds x {repeat} repeats)"]
    print("\n".join(head), flush=True)
    lines, raw = list(head), {}
    for name in [d.strip() for d in a.datasets.split(",") if d.strip()]:
        root = _find(name)
        if root is None:
            msg = f"\n### {name}: not found (looked in {SEARCH}), skipped"
            print(msg)
            lines.append(msg)
            continue
        info = _info(root)
        big = info["res"] not in ("96x128", "-")
        n = (300 if big else 1000) if a.full else (100 if big else 300)
        plan = common.plan(info["frames"], info["fps"], info["cameras"], n=n, n_delta=max(50, n // 2),
                           dl_batches=(30 if a.full else 12) if not big else (16 if a.full else 10), seed=a.seed)
        ours, peer = [], []
        for _ in range(repeat):
            print(f"[{name}] lerobot_sql ...", file=sys.stderr, flush=True)
            ours.append(bench_ours(root, plan, rounds, sampler_row=True))
            if peer_ok:
                print(f"[{name}] LeRobotDataset ...", file=sys.stderr, flush=True)
                r = bench_peer(a.peer_python, root, plan, rounds, timeout=1800)
                if "error" in r:
                    peer_note = f"failed: {r['error']}"
                else:
                    peer.append(r)
        t = table(name, info, ours, peer, peer_note if not peer else "")
        print("\n".join(t), flush=True)
        lines += t
        raw[name] = {"info": info, "lerobot_sql": ours, "lerobot": peer}
    end = f"\nload average at end: {os.getloadavg()[0]:.1f}"
    print(end)
    if a.json:
        Path(a.json).write_text(json.dumps({"header": head, "results": raw}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(run())
