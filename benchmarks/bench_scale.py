#!/usr/bin/env python
"""Scale: how connect, queries, manifests, the Arrow cache and the first item cost as a dataset grows.

    python benchmarks/bench_scale.py run [--episodes 1000 10000 100000] [--root DIR]
    python benchmarks/bench_scale.py generate --episodes 1000          # data only
    python benchmarks/bench_scale.py measure --episodes 1000           # one size, JSON on stdout
    python benchmarks/bench_scale.py plot                              # benchmarks/scale.png from scale.json

``--root`` (where the datasets are generated) defaults to $LSQL_SCALE_ROOT, else scale/ in $LSQL_BENCH_DATA (default
../bench_data beside the checkout).

Data: generated tabular-only LeRobot v3.0 datasets (no cameras), written the way the recorder writes them: one data
row group per episode (``ParquetWriter.write_table`` per episode, snappy, dictionary on), data files rotated at about
100 MB (5,000 episodes per file), ``meta/episodes`` with per-episode stats of ``observation.state`` and ``action``,
``meta/tasks.parquet`` with the task text as the pandas index. Features: ``observation.state`` and ``action``
float32 (6,), ``timestamp`` float32, ``frame_index``, ``episode_index``, ``index``, ``task_index`` int64. Episode
lengths are uniform in [200, 400] frames (30 fps), so 100k episodes hold about 30M frames. Seeded: the same sizes give
the same files.

Each size is measured in a fresh process with an empty lerobot_sql cache, so peak RSS and cache build are its own.
Row groups scanned come from DuckDB's JSON profile (``total_row_groups_scanned`` / ``total_row_groups_to_scan``).
``run`` writes benchmarks/scale.json and benchmarks/scale.png and prints the table; ``python -m benchmarks.readme``
then puts it into benchmarks/README.md.
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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402

DEFAULT_ROOT = Path(os.environ.get("LSQL_SCALE_ROOT", common.BENCH_DATA / "scale"))
FPS = 30
EPISODES_PER_DATA_FILE = 5000  # about 100 MB of Parquet, lerobot's data_files_size_in_mb default
EPISODES_PER_META_FILE = 50000
META_ROW_GROUP = 1000
TASKS = [f"pick the {c} cube and place it in the bin" for c in
         ("red", "green", "blue", "yellow", "white", "black", "orange", "purple", "pink", "grey")]
VEC = 6
NAMES = ["shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos", "wrist_flex.pos", "wrist_roll.pos", "gripper.pos"]


# ---- generation ---------------------------------------------------------------------------------------------------
def _info(episodes: int, frames: int, files: int) -> dict:
    vec = {"dtype": "float32", "shape": [VEC], "names": NAMES}
    scalar = lambda dt: {"dtype": dt, "shape": [1], "names": None}  # noqa: E731
    return {
        "codebase_version": "v3.0", "robot_type": "so101_follower", "total_episodes": episodes,
        "total_frames": frames, "total_tasks": len(TASKS), "chunks_size": 1000, "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200, "fps": FPS, "splits": {"train": f"0:{episodes}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None,
        "features": {"observation.state": vec, "action": vec, "timestamp": scalar("float32"),
                     "frame_index": scalar("int64"), "episode_index": scalar("int64"), "index": scalar("int64"),
                     "task_index": scalar("int64")},
    }


def _stats(x: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> dict[str, list]:
    """Per-episode min/max/mean/std/count of a (frames, 6) array, as lerobot's list<double> columns."""
    out = {s: [] for s in ("min", "max", "mean", "std", "count")}
    for s, n in zip(starts, lengths):
        seg = x[s:s + n].astype(np.float64)
        out["min"].append(seg.min(0).tolist())
        out["max"].append(seg.max(0).tolist())
        out["mean"].append(seg.mean(0).tolist())
        out["std"].append(seg.std(0).tolist())
        out["count"].append([int(n)])
    return out


def pointer_columns(e0: int, e1: int, tasks: list[str], lengths: np.ndarray, ep_from: np.ndarray,
                    data: dict[str, list]) -> dict[str, pa.Array]:
    """meta/episodes' first columns for episodes ``e0..e1`` as lerobot writes them: index, tasks (one text each),
    length, the data pointers (``data["data/chunk_index"]`` / ``data["data/file_index"]``, per episode from 0) and
    the dataset index range. Shared with make_scale_video_set.py."""
    return {
        "episode_index": pa.array(np.arange(e0, e1, dtype=np.int64)),
        "tasks": pa.array([[t] for t in tasks], pa.list_(pa.string())),
        "length": pa.array(lengths[e0:e1]),
        "data/chunk_index": pa.array(data["data/chunk_index"][e0:e1], pa.int64()),
        "data/file_index": pa.array(data["data/file_index"][e0:e1], pa.int64()),
        "dataset_from_index": pa.array(ep_from[e0:e1]),
        "dataset_to_index": pa.array(ep_from[e0:e1] + lengths[e0:e1]),
    }


def frame_rows(rng: np.random.Generator, e0: int, lens: np.ndarray, first_index: int, ep_task: np.ndarray,
               fps: float, state_dim: int, action_dim: int, schema: pa.Schema) -> tuple[pa.Table, np.ndarray,
                                                                                         np.ndarray]:
    """The data rows of episodes ``e0, e0 + 1, ...`` of lengths ``lens`` (their first ``index`` ``first_index``,
    tasks ``ep_task``): (the table, its state and action as numpy). State is a bounded random walk per episode,
    smooth like joint positions, so Parquet compresses it like real data; action is the state's first
    ``action_dim`` values plus noise. Shared with make_scale_video_set.py."""
    n = int(lens.sum())
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    frame = np.arange(n, dtype=np.int64) - np.repeat(starts, lens)
    walk = np.cumsum(rng.normal(0, 0.01, (n, state_dim)).astype(np.float32), axis=0)
    walk -= np.repeat(walk[starts], lens, axis=0)
    state = np.tanh(walk + rng.uniform(-1, 1, (len(lens), state_dim)).astype(np.float32).repeat(lens, axis=0))
    action = (state[:, :action_dim] + rng.normal(0, 0.005, (n, action_dim))).astype(np.float32)
    state = state.astype(np.float32)
    table = pa.table({
        "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), state_dim),
        "action": pa.FixedSizeListArray.from_arrays(pa.array(action.ravel()), action_dim),
        "timestamp": pa.array((frame / fps).astype(np.float32)),
        "frame_index": pa.array(frame),
        "episode_index": pa.array(np.repeat(np.arange(e0, e0 + len(lens), dtype=np.int64), lens)),
        "index": pa.array(first_index + np.arange(n, dtype=np.int64)),
        "task_index": pa.array(np.repeat(ep_task, lens)),
    }, schema=schema)
    return table, state, action


def write_episodes_file(root: Path, mi: int, cols: dict[str, pa.Array]) -> None:
    """``meta/episodes/chunk-000/file-<mi>.parquet`` from ``cols``, with its own chunk and file index columns, in
    row groups of META_ROW_GROUP rows. Shared with make_scale_video_set.py."""
    n = len(cols["episode_index"])
    cols = {**cols, "meta/episodes/chunk_index": pa.array([0] * n, pa.int64()),
            "meta/episodes/file_index": pa.array([mi] * n, pa.int64())}
    path = root / f"meta/episodes/chunk-000/file-{mi:03d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path, row_group_size=META_ROW_GROUP)


def write_tasks(root: Path, tasks: list[str]) -> None:
    """``meta/tasks.parquet`` as lerobot writes it: the task text as the pandas index, ``task_index`` its column."""
    import pandas as pd

    pd.DataFrame({"task_index": range(len(tasks))}, index=pd.Index(tasks, name=None)).to_parquet(
        root / "meta" / "tasks.parquet")


def generate(root: Path, episodes: int, seed: int = 0) -> dict:
    """Write a tabular v3.0 dataset of ``episodes`` episodes at ``root`` (skipped when info.json already matches)."""
    info_path = root / "meta" / "info.json"
    if info_path.exists() and json.loads(info_path.read_text())["total_episodes"] == episodes:
        return json.loads(info_path.read_text())
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 401, episodes).astype(np.int64)
    ep_task = rng.integers(0, len(TASKS), episodes).astype(np.int64)
    ep_from = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    meta_cols: dict[str, list] = {}
    vec_type = pa.list_(pa.float32(), VEC)
    schema = pa.schema([("observation.state", vec_type), ("action", vec_type), ("timestamp", pa.float32()),
                        ("frame_index", pa.int64()), ("episode_index", pa.int64()), ("index", pa.int64()),
                        ("task_index", pa.int64())])
    n_files = (episodes + EPISODES_PER_DATA_FILE - 1) // EPISODES_PER_DATA_FILE
    for fi in range(n_files):
        e0, e1 = fi * EPISODES_PER_DATA_FILE, min(episodes, (fi + 1) * EPISODES_PER_DATA_FILE)
        lens = lengths[e0:e1]
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        table, state, action = frame_rows(rng, e0, lens, int(ep_from[e0]), ep_task[e0:e1], FPS, VEC, VEC, schema)
        rel = f"data/chunk-{fi // 1000:03d}/file-{fi % 1000:03d}.parquet"
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(tmp / rel, schema, compression="snappy") as w:
            for s, ln in zip(starts, lens):  # the recorder's write_table per episode: one row group each
                w.write_table(table.slice(int(s), int(ln)))
        for key, arr in (("observation.state", state), ("action", action)):
            for stat, vals in _stats(arr, starts, lens).items():
                meta_cols.setdefault(f"stats/{key}/{stat}", []).extend(vals)
        meta_cols.setdefault("data/file_index", []).extend([fi % 1000] * (e1 - e0))
        meta_cols.setdefault("data/chunk_index", []).extend([fi // 1000] * (e1 - e0))
    n_meta = (episodes + EPISODES_PER_META_FILE - 1) // EPISODES_PER_META_FILE
    for mi in range(n_meta):
        e0, e1 = mi * EPISODES_PER_META_FILE, min(episodes, (mi + 1) * EPISODES_PER_META_FILE)
        cols = pointer_columns(e0, e1, [TASKS[t] for t in ep_task[e0:e1]], lengths, ep_from, meta_cols)
        for name, vals in meta_cols.items():
            if name.startswith("stats/"):
                typ = pa.list_(pa.int64()) if name.endswith("/count") else pa.list_(pa.float64())
                cols[name] = pa.array(vals[e0:e1], typ)
        write_episodes_file(tmp, mi, cols)
    write_tasks(tmp, TASKS)
    info = _info(episodes, int(lengths.sum()), n_files)
    (tmp / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, root)
    print(f"generated {root}: {episodes} episodes, {info['total_frames']:,} frames, {n_files} data files, "
          f"{_du(root) / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return info


# ---- measuring ----------------------------------------------------------------------------------------------------
def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) if Path(path).exists() else 0


def _status(field: str) -> int:
    """VmRSS / VmHWM of this process in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:  # "5" resets VmHWM to the current RSS (Linux >= 4.0), so each step's peak is its own
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


class Step:
    """Times a block and records wall seconds, RSS after and peak RSS during it."""

    def __init__(self, out: dict, name: str):
        self.out, self.name = out, name

    def __enter__(self):
        _reset_peak()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.out[self.name] = {"s": time.perf_counter() - self.t0, "rss": _status("VmRSS"),
                               "peak_rss": _status("VmHWM")}


def _profile(con, sql: str) -> dict:
    """Run ``sql`` on ``con`` under DuckDB's JSON profiler; rows and row groups scanned, peak buffer memory."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    con.execute("PRAGMA enable_profiling='json'")
    con.execute(f"PRAGMA profiling_output='{path}'")
    try:
        con.sql(sql).fetchall()
    finally:
        con.execute("PRAGMA disable_profiling")
    p = json.loads(Path(path).read_text())
    os.unlink(path)
    q, s = p.get("query", {}), p.get("system", {})
    return {"row_groups_scanned": q.get("total_row_groups_scanned"),
            "row_groups_total": q.get("total_row_groups_to_scan"), "rows_scanned": q.get("total_rows_scanned"),
            "bytes_scanned": q.get("total_bytes_scanned"), "peak_buffer_memory": s.get("peak_buffer_memory"),
            "bytes_spilled": s.get("total_bytes_spilled"), "peak_temp_dir_size": s.get("peak_temp_dir_size")}


def _twin(db, *, metadata_cache: bool):
    """A second DuckDB connection with the same views as ``db`` (for profiling: the user's connection may have
    its configuration locked). ``metadata_cache`` turns on DuckDB's ``parquet_metadata_cache``."""
    import duckdb

    from lerobot_sql._catalog import macros
    from lerobot_sql._catalog import views as catalog

    con = duckdb.connect()
    if metadata_cache:
        con.execute("SET parquet_metadata_cache = true")
    catalog.register_views(con, db.source, db.layout)
    macros.register(con, db.layout)
    return con


def _timed_query(db, prof, sql: str, repeat: int = 3) -> dict:
    times, rows = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = db.sql(sql).fetchall()
        times.append(time.perf_counter() - t0)
    return {"s": min(times), "s_first": times[0], "result_rows": len(rows), **_profile(prof, db.check(sql))}


def _timed_plain(con, sql: str, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        con.sql(sql).fetchall()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(root: Path, episodes: int, *, full_dataset: bool, spill: bool) -> dict:
    import lerobot_sql as lsql

    info = generate(root, episodes)
    n_frames = info["total_frames"]
    mid = episodes // 2
    every = max(1, episodes // 100)  # 100 episodes (~30k frames) at every size
    sel_fixed = f"SELECT episode_index FROM episodes WHERE episode_index % {every} = 0"
    sel_full = "SELECT episode_index FROM episodes"
    queries = {
        # Episode level: meta/episodes only.
        "q_episodes": "SELECT episode_index, length FROM episodes WHERE length >= 390",
        # Frame level, pruned by the episode_index row-group statistics (10 episodes at every size).
        "q_frames_10ep": f"SELECT count(*), avg(action[1]) FROM frames WHERE episode_index BETWEEN {mid} AND {mid + 9}",
        # Frame level, pruned by the frame_index statistics: only episodes longer than 390 frames can match.
        "q_frames_tail": "SELECT episode_index, count(*) FROM frames WHERE frame_index >= 390 GROUP BY 1",
        # Frame level, no pruning possible: the value predicate reads every row group.
        "q_frames_scan": 'SELECT episode_index, count(*) FROM frames WHERE "observation.state"[1] > 0.9 GROUP BY 1',
    }
    cache = root.parent / f"cache-{root.name}"
    shutil.rmtree(cache, ignore_errors=True)
    r: dict = {"episodes": episodes, "frames": n_frames, "data_files": len(list((root / "data").rglob("*.parquet"))),
               "parquet_bytes": _du(root), "rss_start": _status("VmRSS")}
    steps: dict = {}
    # Imports and DuckDB's first-connection setup are paid once per process whatever the size: pay them on the
    # bundled sample, so "connect" is the dataset's own cost (info.json, globs, Parquet footers, views).
    import lerobot_sql.torch.dataset  # noqa: F401  (torch)

    lsql.connect(REPO / "sample" / "small20", cache_dir=cache / "warmup").close()
    with Step(steps, "connect"):
        db = lsql.connect(root, cache_dir=cache)
    r["duckdb"] = dict(db.con.sql("SELECT name, value FROM duckdb_settings() WHERE name IN ('memory_limit', "
                                  "'threads', 'temp_directory', 'parquet_metadata_cache')").fetchall())
    with Step(steps, "connect_metadata_cache"):
        prof = _twin(db, metadata_cache=True)  # what connect costs with DuckDB's Parquet metadata cache on
    for name, sql in queries.items():
        with Step(steps, name):
            r[name] = _timed_query(db, prof, sql)
        r[name]["s_metadata_cache"] = _timed_plain(prof, db.check(sql))
    with Step(steps, "manifest_fixed"):
        m_fixed = db.manifest(sel_fixed)
    r["manifest_fixed_rows"] = m_fixed.num_rows
    # The join the manifest runs: does the episode filter prune data row groups?
    r["manifest_fixed_scan"] = _profile(prof, f"SELECT count(*) FROM _frames_loc WHERE episode_index IN "
                                              f"(SELECT episode_index FROM ({sel_fixed}))")
    with Step(steps, "dataset_fixed"):
        ds = db.dataset(m_fixed)
    r["cache_fixed_bytes"] = _du(cache / "tabular")
    with Step(steps, "first_item"):
        ds[0]
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(ds), 2000)
    with Step(steps, "items_2000_random"):
        for i in idx:
            ds[int(i)]
    del ds, m_fixed
    # The whole dataset as one training set: manifest of every frame, then sharded for 8 ranks.
    with Step(steps, "manifest_full"):
        m_full = db.manifest(sel_full)
    r["manifest_full_rows"] = m_full.num_rows
    r["manifest_full_bytes"] = m_full.nbytes
    from lerobot_sql.torch.shard import shard_manifest

    with Step(steps, "shard_full_8"):
        r["shard_rows"] = [shard_manifest(m_full, k, 8, epoch=1).num_rows for k in range(8)]
    del m_full
    mpath = root.parent / f"manifest-{root.name}.parquet"
    with Step(steps, "export_manifest_full"):
        db.export_manifest(sel_full, mpath, overwrite=True)  # a rerun replaces the last run's manifest
    r["manifest_parquet_bytes"] = mpath.stat().st_size
    if full_dataset:
        with Step(steps, "dataset_full"):
            ds = db.dataset(mpath)
        r["cache_full_bytes"] = _du(cache / "tabular")
        with Step(steps, "first_item_full"):
            ds[len(ds) // 2]
        del ds
    mpath.unlink()
    if spill:
        tmpdir = root.parent / f"spill-{root.name}"
        shutil.rmtree(tmpdir, ignore_errors=True)
        prof.execute("SET memory_limit='1GB'")
        prof.execute(f"SET temp_directory='{tmpdir}'")
        # A sort of every frame (window over the whole table) cannot fit in 1 GB: DuckDB must spill.
        sql = ('SELECT max(rn) FROM (SELECT row_number() OVER (ORDER BY "observation.state"[1], index) AS rn, '
               "action FROM frames)")
        with Step(steps, "spill_sort_1GB"):
            r["spill_sort_1GB"] = _profile(prof, sql)
        shutil.rmtree(tmpdir, ignore_errors=True)
    prof.close()
    r["steps"] = steps
    r["peak_rss"] = _status("VmHWM")
    db.close()
    shutil.rmtree(cache, ignore_errors=True)
    return r


# ---- report -------------------------------------------------------------------------------------------------------
# The table is the one benchmarks/README.md shows, written by `python -m benchmarks.readme` from scale.json.
from benchmarks.readme import scale_table as table  # noqa: E402


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["frames"] for r in results]
    series = {
        "connect": [r["steps"]["connect"]["s"] for r in results],
        "connect, parquet_metadata_cache on": [r["steps"]["connect_metadata_cache"]["s"] for r in results],
        "episode query": [r["q_episodes"]["s"] for r in results],
        "frame query, 10 episodes": [r["q_frames_10ep"]["s"] for r in results],
        "frame query, frame_index >= 390": [r["q_frames_tail"]["s"] for r in results],
        "frame query, full scan": [r["q_frames_scan"]["s"] for r in results],
        "manifest, 100 episodes": [r["steps"]["manifest_fixed"]["s"] for r in results],
        "dataset(), 100 episodes": [r["steps"]["dataset_fixed"]["s"] for r in results],
        "first item": [r["steps"]["first_item"]["s"] for r in results],
        "manifest, every frame": [r["steps"]["manifest_full"]["s"] for r in results],
    }
    if all("dataset_full" in r["steps"] for r in results):
        series["dataset(), every frame"] = [r["steps"]["dataset_full"]["s"] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5.2))
    for name, ys in series.items():
        a.plot(x, ys, marker="o", label=name)
    lo, hi = min(x), max(x)
    ref = series["frame query, full scan"][0]
    a.plot([lo, hi], [ref, ref * hi / lo], "k:", lw=1, label="linear in frames (from full scan)")
    a.set(xscale="log", yscale="log", xlabel="frames in dataset", ylabel="seconds",
          title="Wall time vs dataset size (2 shared cores)")
    a.legend(fontsize=7)
    a.grid(True, which="both", alpha=0.3)
    names = {"q_frames_10ep": "10 episodes", "q_frames_tail": "frame_index >= 390", "q_frames_scan": "full scan"}
    w = 0.25
    for k, (key, label) in enumerate(names.items()):
        frac = [r[key]["row_groups_scanned"] / r[key]["row_groups_total"] for r in results]
        b.bar(np.arange(len(results)) + (k - 1) * w, frac, w, label=label)
    b.set_xticks(np.arange(len(results)), [f"{r['episodes']:,} eps" for r in results])
    b.set(yscale="log", ylabel="row groups read / row groups in files", title="Pruning: data row groups read")
    b.legend(fontsize=8)
    b.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["run", "generate", "measure", "plot"])
    ap.add_argument("--episodes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--full-dataset", action="store_true", help="also build dataset() over every frame")
    ap.add_argument("--spill", action="store_true", help="also sort every frame under memory_limit=1GB")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "scale.json")
    a = ap.parse_args()
    if a.cmd == "generate":
        for n in a.episodes:
            generate(a.root / f"ep{n}", n)
    elif a.cmd == "measure":
        assert len(a.episodes) == 1
        print(json.dumps(measure(a.root / f"ep{a.episodes[0]}", a.episodes[0], full_dataset=a.full_dataset,
                                 spill=a.spill)))
    elif a.cmd == "run":
        results = []
        for n in a.episodes:
            generate(a.root / f"ep{n}", n)
            cmd = [sys.executable, __file__, "measure", "--episodes", str(n), "--root", str(a.root)]
            cmd += ["--full-dataset"] * a.full_dataset + ["--spill"] * a.spill
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            print(f"measured {n} episodes", file=sys.stderr)
        a.out.write_text(json.dumps(results, indent=1))
        plot(results, a.out.with_suffix(".png"))
        print(table(results))
    else:
        results = json.loads(a.out.read_text())
        plot(results, a.out.with_suffix(".png"))
        print(table(results))


if __name__ == "__main__":
    main()
