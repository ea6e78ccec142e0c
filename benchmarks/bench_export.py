#!/usr/bin/env python
"""Export time: ``db.export`` against lerobot 0.4.4's ``delete_episodes`` on the same selection.

    python benchmarks/bench_export.py [--root DATASET] [--drop-every 5] [--peer-python PATH]

``--root`` defaults to syn200_96 in $LSQL_BENCH_DATA (default ../bench_data beside the checkout) when it is there,
else multifile60 of the shared datasets ($LSQL_SHARED/datasets, default ../shared/datasets beside the checkout).
Selection: drop every N-th episode (so every video file mixes kept and dropped episodes, the case in which lerobot
decodes and re-encodes). lerobot runs in its own interpreter (``--peer-python``, default ``$LSQL_PEER_PYTHON``, else
../peer/bin/python beside the checkout), offline, with a throwaway HF_HOME; only the ``delete_episodes`` call is
timed (opening the source dataset is reported apart). Ours is timed cold (empty lerobot_sql cache: the per-mp4 frame
index is built by demuxing) and warm. A window export (every kept episode cut to [1/fps, 3 s), heads re-encoded) is
timed as well. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402

import lerobot_sql as lsql  # noqa: E402

PEER = """
import json, sys, time
t0 = time.perf_counter()
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.datasets.dataset_tools import delete_episodes
root, out, drop = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ds = LeRobotDataset("bench/src", root=root)
t1 = time.perf_counter()
new = delete_episodes(ds, episode_indices=drop, output_dir=out, repo_id="bench/out")
t2 = time.perf_counter()
print(json.dumps({"open_s": t1 - t0, "delete_s": t2 - t1, "episodes": new.meta.total_episodes,
                  "frames": new.meta.total_frames}))
"""


def _default_root() -> Path:
    big = common.BENCH_DATA / "syn200_96"
    return big if (big / "meta" / "info.json").exists() else common.SHARED / "datasets" / "multifile60"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=_default_root())
    ap.add_argument("--drop-every", type=int, default=5)
    ap.add_argument("--peer-python", default=common.PEER_PYTHON,
                    help="interpreter with lerobot 0.4.4 (default $LSQL_PEER_PYTHON, else ../peer/bin/python beside "
                         "the checkout)")
    ap.add_argument("--skip-lerobot", action="store_true")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_export_"))
    os.environ["LSQL_CACHE_DIR"] = str(work / "cache")
    res: dict = {"root": str(a.root)}
    try:
        db = lsql.connect(a.root)
        n = db.sql("SELECT count(*) FROM episodes").fetchall()[0][0]
        drop = [e for e in range(n) if e % a.drop_every == 0]
        sql = f"SELECT episode_index FROM episodes WHERE episode_index % {a.drop_every} <> 0 ORDER BY episode_index"
        for phase in ("cold", "warm"):
            t = time.perf_counter()
            rep = lsql.connect(a.root).export(sql, work / f"ours_{phase}", progress=False)
            res[f"ours_{phase}_s"] = time.perf_counter() - t
        res.update(episodes=rep.episodes, frames=rep.frames, frames_reencoded=rep.frames_reencoded)
        fps = db.fps
        t = time.perf_counter()
        wrep = db.export(f"SELECT episode_index, {1 / fps!r} AS start_s, 3.0 AS end_s FROM episodes "
                         f"WHERE episode_index % {a.drop_every} <> 0", work / "ours_windows", progress=False)
        res["ours_windows_s"] = time.perf_counter() - t
        res["windows_frames_reencoded"] = wrep.frames_reencoded
        res["windows_frames"] = wrep.frames

        if not a.skip_lerobot and Path(a.peer_python).exists():
            env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(work / "hf"))
            r = subprocess.run([a.peer_python, "-c", PEER, str(a.root), str(work / "lerobot"), json.dumps(drop)],
                               capture_output=True, text=True, env=env)
            if r.returncode != 0:
                res["lerobot_error"] = r.stderr[-2000:]
            else:
                peer = json.loads(r.stdout.strip().splitlines()[-1])
                res.update(lerobot_open_s=peer["open_s"], lerobot_delete_s=peer["delete_s"])
                assert (peer["episodes"], peer["frames"]) == (res["episodes"], res["frames"])
                res["speedup_cold"] = peer["delete_s"] / res["ours_cold_s"]
                res["speedup_warm"] = peer["delete_s"] / res["ours_warm_s"]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"dataset {res['root']}: keep {res['episodes']} episodes / {res['frames']} frames "
          f"(drop every {a.drop_every}th)")
    print(f"  lerobot_sql export, cold cache : {res['ours_cold_s']:8.2f} s  ({res['frames_reencoded']} frames re-encoded)")
    print(f"  lerobot_sql export, warm cache : {res['ours_warm_s']:8.2f} s")
    print(f"  lerobot_sql window export      : {res['ours_windows_s']:8.2f} s  "
          f"({res['windows_frames_reencoded']} of {2 * res['windows_frames']} camera frames re-encoded)")
    if "lerobot_delete_s" in res:
        print(f"  lerobot delete_episodes        : {res['lerobot_delete_s']:8.2f} s  (open {res['lerobot_open_s']:.2f} s)")
        print(f"  speedup cold / warm            : {res['speedup_cold']:8.1f}x / {res['speedup_warm']:.1f}x")
    elif "lerobot_error" in res:
        print("  lerobot failed:", res["lerobot_error"][-500:])
    print(json.dumps(res))


if __name__ == "__main__":
    main()
