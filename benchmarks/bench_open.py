#!/usr/bin/env python
"""Opening a large dataset as a training set: lerobot_sql's ``dataset()`` against ``LeRobotDataset``, cold and warm.

    python -m benchmarks.bench_open [--root DIR] [--items 1000] [--peer-python PY] [--peer-06 PY] [--json out.json]

``--root`` defaults to the 100,000-episode tabular scale set (``bench_scale.py generate --episodes 100000``: 30M
frames, 20 data files, 2.6 GB). Each measurement runs in a fresh process whose imports (torch, lerobot_sql or
lerobot) are done before the clock starts, so the figures are the open itself:

* **lerobot_sql**: ``lsql.connect(root).dataset()`` (every episode), then ``--items`` random items (each
  in a row group not read yet) and 2,000 items of 50 row groups already read. *cold*: an empty
  lerobot_sql cache; *warm*: the next process, with the cache the cold one left (a training restart), its items of
  row groups no process read (another seed), then the cold run's items again, whose row groups the cold run left in
  the row-group store (``lerobot_sql._readers.row_group_store``); *SQL 10%*: a
  query selecting every tenth episode (``SELECT episode_index FROM episodes WHERE episode_index % 10 = 0``), after
  the warm run: the first SQL connect surveys the data files' footers (kept per file version), the next process
  (a training restart) reads what it kept. *SQL windows*: the last second of every episode (a window per
  episode, 3M frames), opened as runs on the fps grid, and the same with ``LSQL_LAZY_FRAMES`` above its frame count
  (every frame read and joined at the open, as before windows opened as runs).
* **SQL** (a fresh process, its own cache): one episode's frames, ``db.stats`` of every frame (as the source's
  metadata has quantiles or not, and with exact quantiles forced, as for a lerobot >= 0.4 source), and an export of
  1% of the episodes. Then the DataLoader workers' private memory over 600 shuffled batches of the whole set, and
  the same 600 batches in the next run (their row groups from the store).
* **LeRobotDataset** (lerobot 0.4.4 in ``--peer-python``, default ``$LSQL_PEER_PYTHON``): ``LeRobotDataset(repo_id,
  root=root)``; *cold*: an empty Hugging Face datasets cache (it builds its Arrow cache), *warm*: the next process;
  the same with lerobot 0.6.1 when ``--peer-06`` names its interpreter.

Peak RSS is the process's ``ru_maxrss`` (after the imports; the imports' own is given apart). The OS page cache is
not dropped between runs: "cold" is the libraries' caches, not the disk. The machine's load is printed with the
table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402

DEFAULT_ROOT = Path(os.environ.get("LSQL_SCALE_ROOT", common.BENCH_DATA / "scale")) / "ep100000"
TENTH = "SELECT episode_index FROM episodes WHERE episode_index % 10 = 0"
# the last second of every episode: 100,000 windows, 3M frames (30 fps)
WINDOWS = "SELECT episode_index, length / 30.0 - 1.0 AS start_s, length / 30.0 AS end_s FROM episodes"

# Each script defines open_dataset(argv) in its interpreter; TIMED then times it and 1,000 random items.
TIMED = """
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
ds = open_dataset(sys.argv[1:])
open_s = time.perf_counter() - t
rng = np.random.default_rng(int(os.environ.get("BENCH_SEED", "0")))
idx = rng.integers(0, len(ds), int(sys.argv[-1]))
ts = []
for i in idx:  # random over the whole set: each item a row group not read yet (cold)
    t = time.perf_counter()
    ds[int(i)]
    ts.append(time.perf_counter() - t)
# items of 50 row groups already read (warm): 2,000 of them near 50 random places, after 200 to warm up
near = np.minimum(rng.integers(0, max(1, len(ds) - 300), 50)[rng.integers(0, 50, 2200)] + rng.integers(0, 20, 2200),
                  len(ds) - 1)
for i in near[:200]:
    ds[int(i)]
t = time.perf_counter()
for i in near[200:]:
    ds[int(i)]
warm_s = (time.perf_counter() - t) / 2000
print("BENCH_JSON " + json.dumps({"open_s": open_s, "items_s": sum(ts), "item_p50_s": float(np.median(ts)),
                                  "item_warm_s": warm_s, "n": len(ds), "rss_imports": rss0 * 1024,
                                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

OURS = """
import json, os, resource, sys, time
import numpy as np, torch
import lerobot_sql as lsql
import lerobot_sql.torch.dataset

def open_dataset(a):  # root, cache folder, SQL ("" for every episode), items
    return lsql.connect(a[0], cache_dir=a[1]).dataset(a[2] or None, cameras=[])
""" + TIMED

PEER = """
import json, os, resource, sys, time
import numpy as np, torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

def open_dataset(a):  # root, items
    return LeRobotDataset("bench/scale", root=a[0])
""" + TIMED


# SQL on the set, in a fresh process (its own cache): an episode's frames, the statistics of every frame (what
# db.stats(sql) and ds.meta.stats compute for a training run), and an export of 1% of the episodes.
FRAME_QUERIES = """
import time

def frame_queries(db):
    # one episode's frames: the process's first (with an empty cache the row groups' ranges are built: every footer
    # read once per version of the data files), another episode of another data file (its footer parsed), one of
    # the same file; 10 episodes spread over the files; the first 100 frames by index
    out = {}
    for key, sql in (("episode_query", "SELECT * FROM frames WHERE episode_index = 54321"),
                     ("episode_query_other_file", "SELECT * FROM frames WHERE episode_index = 12345"),
                     ("episode_query_next", "SELECT * FROM frames WHERE episode_index = 12346"),
                     ("episodes10_query", "SELECT episode_index, count(*), avg(timestamp) FROM frames WHERE "
                      "episode_index IN (5, 9999, 20000, 31000, 42000, 53000, 64000, 75000, 86000, 99999) GROUP BY 1"),
                     ("index_query", "SELECT index, action FROM frames WHERE index < 100 ORDER BY index")):
        t = time.perf_counter()
        n = len(db.sql(sql).fetchall())
        out[key + "_s"], out[key.replace("_query", "") + "_rows"] = time.perf_counter() - t, n
    return out
"""

SQL = """
import json, resource, sys, tempfile, time
import lerobot_sql as lsql
from lerobot_sql import stats

db = lsql.connect(sys.argv[1], cache_dir=sys.argv[2])
db.sql("SELECT 1").fetchall()
out = {}
""" + FRAME_QUERIES + """
"""
# The frame queries again in the next process (the row groups' ranges from the cache folder), alone.
SQL_NEXT = """
import json, sys
import lerobot_sql as lsql

db = lsql.connect(sys.argv[1], cache_dir=sys.argv[2])
db.sql("SELECT 1").fetchall()
""" + FRAME_QUERIES + """
print("BENCH_JSON " + json.dumps(frame_queries(db)))
"""
SQL += """
t = time.perf_counter()
out["episodes_rows"] = len(db.sql("SELECT episode_index FROM episodes WHERE length >= 390").fetchall())
out["episodes_query_s"] = time.perf_counter() - t
out.update(frame_queries(db))
plan = db._connection.frames_plan  # the same queries over the whole view, as before the row groups were narrowed
db._connection.frames_plan = None
out["whole"] = frame_queries(db)
db._connection.frames_plan = plan
for key, q in (("dataset_frames", "SELECT * FROM frames WHERE episode_index = 23456"),  # a training set of frames
               ("dataset_frames_next", "SELECT * FROM frames WHERE episode_index = 23457")):
    t = time.perf_counter()
    out[key + "_n"] = len(db.dataset(q, cameras=[]))
    out[key + "_s"] = time.perf_counter() - t
db._connection.frames_plan = None
t = time.perf_counter()
db.dataset("SELECT * FROM frames WHERE episode_index = 23458", cameras=[])
out["whole"]["dataset_frames_next_s"] = time.perf_counter() - t
db._connection.frames_plan = plan
every = "SELECT episode_index FROM episodes"
t = time.perf_counter()
st = db.stats(every)
out["stats_s"], out["stats_quantiles"] = time.perf_counter() - t, "q50" in st["action"]
real = stats.selection_stats  # as for a source whose per-episode statistics have quantiles (lerobot >= 0.4)
stats.selection_stats = lambda *a, **k: real(*a, **{**k, "quantiles": True})
t = time.perf_counter()
st = db.stats(every)
out["stats_q_s"] = time.perf_counter() - t
stats.selection_stats = real
out["stats_count"] = int(st["action"]["count"][0])
with tempfile.TemporaryDirectory() as d:
    t = time.perf_counter()
    r = db.export("SELECT episode_index FROM episodes WHERE episode_index % 100 = 7", d + "/x", progress=False)
    out["export_s"], out["export_frames"] = time.perf_counter() - t, r.frames
out["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("BENCH_JSON " + json.dumps(out))
"""


# DataLoader workers on the whole set (tabular, 2 forked workers, shuffled, batch 32): each worker's private memory
# (USS: smaps_rollup's Private_Clean + Private_Dirty) after 100, 300 and 600 batches.
WORKERS = """
import json, sys, time
import torch
import lerobot_sql as lsql
import lerobot_sql.torch.dataset

def uss_mb(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        d = {ln.split(":")[0]: int(ln.split()[1]) for ln in f if ln.startswith("Private_")}
    return sum(d.values()) / 1024

ds = lsql.connect(sys.argv[1], cache_dir=sys.argv[2]).dataset(cameras=[])
dl = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=2, shuffle=True, persistent_workers=True,
                                 generator=torch.Generator().manual_seed(0))
it, marks = iter(dl), {}
t = time.perf_counter()
for b in range(600):
    next(it)
    if b + 1 in (100, 300, 600):
        marks[b + 1] = [uss_mb(w.pid) for w in it._workers]
print("BENCH_JSON " + json.dumps({"uss_mb": marks, "samples_s": 600 * 32 / (time.perf_counter() - t)}))
"""


def _run(python: str, code: str, args: list[str], env: dict | None = None) -> dict:
    r = subprocess.run([python, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=3600)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if line is None:
        raise RuntimeError(f"{python} failed:\n{r.stderr[-3000:]}")
    return json.loads(line[len("BENCH_JSON "):])


def store_bytes(cache: Path, root: Path) -> dict:
    """The row-group store under ``cache``: its bytes on disk, and the Parquet bytes (compressed, from the footers) of
    the row groups it holds."""
    import pyarrow.parquet as pq

    from lerobot_sql._readers import row_group_store as rgs

    disk = parquet = groups = 0
    for p in (cache / rgs.FOLDER).glob(f"*{rgs.SUFFIX}"):
        disk += p.stat().st_blocks * 512
        head = p.read_bytes()[:rgs.HEADER_BYTES]
        meta = json.loads(head[16:16 + int.from_bytes(head[8:12], "little")])  # (then its CRC-32, 4 bytes)
        n = meta["row_groups"]
        with open(p, "rb") as f:
            f.seek(rgs.HEADER_BYTES)
            raw = np.frombuffer(f.read(16 * n), "<i8").reshape(n, 2)
        held = np.flatnonzero((raw[:, 0] > 0) & (raw[:, 1] == raw[:, 0] ^ np.int64(rgs.CHECK) ^
                                                 (np.arange(n, dtype=np.int64) << 20)))
        md = pq.ParquetFile(root / meta["data_file"]).metadata
        parquet += sum(md.row_group(int(g)).column(j).total_compressed_size for g in held
                       for j in range(md.num_columns))
        groups += len(held)
    return {"disk": disk, "parquet": parquet, "row_groups": groups}


def measure_sql(root: Path) -> dict:
    """The SQL part of :func:`measure` alone (``--only-sql``)."""
    out = {"root": str(root), "load": os.getloadavg()}
    with tempfile.TemporaryDirectory() as cache:
        out["sql"] = _run(sys.executable, SQL, [str(root), cache])
        out["sql_next"] = _run(sys.executable, SQL_NEXT, [str(root), cache])
    out["load_after"] = os.getloadavg()
    return out


def measure(root: Path, items: int, peer: str | None, peer06: str | None = None) -> dict:
    out = {"root": str(root), "items": items, "load": os.getloadavg()}
    with tempfile.TemporaryDirectory() as cache:
        out["ours_cold"] = _run(sys.executable, OURS, [str(root), cache, "", str(items)])
        # the next process: its random items of row groups no process read (another seed), then the first run's
        # items again, whose row groups the first run left in the row-group store
        out["ours_warm"] = _run(sys.executable, OURS, [str(root), cache, "", str(items)], {"BENCH_SEED": "1"})
        out["ours_store"] = _run(sys.executable, OURS, [str(root), cache, "", str(items)])
        out["store"] = store_bytes(Path(cache), root)
        out["ours_sql10_first"] = _run(sys.executable, OURS, [str(root), cache, TENTH, str(items)])
        out["ours_sql10_warm"] = _run(sys.executable, OURS, [str(root), cache, TENTH, str(items)])
        out["ours_windows"] = _run(sys.executable, OURS, [str(root), cache, WINDOWS, str(items)])
        out["ours_windows_read"] = _run(sys.executable, OURS, [str(root), cache, WINDOWS, str(items)],
                                        {"LSQL_LAZY_FRAMES": str(10 ** 12)})
    with tempfile.TemporaryDirectory() as cache:
        out["sql"] = _run(sys.executable, SQL, [str(root), cache])
        out["sql_next"] = _run(sys.executable, SQL_NEXT, [str(root), cache])
        out["workers"] = _run(sys.executable, WORKERS, [str(root), cache])
        out["workers_again"] = _run(sys.executable, WORKERS, [str(root), cache])  # the same order: from the store
    for tag, py in (("lerobot", peer), ("lerobot06", peer06)):
        if py and Path(py).exists():
            with tempfile.TemporaryDirectory() as home:
                env = {"HF_HOME": home, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
                out[f"{tag}_cold"] = _run(py, PEER, [str(root), str(items)], env)
                out[f"{tag}_warm"] = _run(py, PEER, [str(root), str(items)], env)
    out["load_after"] = os.getloadavg()
    return out


def table(res: dict) -> str:
    rows = [("lerobot_sql, cold (empty cache)", "ours_cold"),
            ("lerobot_sql, warm (next process), items of row groups no process read", "ours_warm"),
            ("lerobot_sql, warm (next process), the cold run's items: row groups from the row-group store",
             "ours_store"),
            ("lerobot_sql, SQL: every 10th episode, first SQL (footers surveyed)", "ours_sql10_first"),
            ("lerobot_sql, SQL: every 10th episode, next process", "ours_sql10_warm"),
            ("lerobot_sql, SQL windows: the last second of every episode, as runs", "ours_windows"),
            ("lerobot_sql, the same windows, every frame read at the open (LSQL_LAZY_FRAMES)", "ours_windows_read"),
            ("LeRobotDataset 0.4.4, cold", "lerobot_cold"), ("LeRobotDataset 0.4.4, warm (next process)",
                                                             "lerobot_warm"),
            ("LeRobotDataset 0.6.1, cold", "lerobot06_cold"), ("LeRobotDataset 0.6.1, warm (next process)",
                                                               "lerobot06_warm")]
    lines = ["| open | samples | open (s) | random item, ms (mean / p50) | item of a row group read, ms | "
             "peak RSS (imports) |", "|---|---:|---:|---:|---:|---:|"]
    for name, k in rows:
        r = res.get(k)
        if r is None:
            continue
        p50 = f" / {1e3 * r['item_p50_s']:.2f}" if "item_p50_s" in r else ""
        warm = f"{1e3 * r['item_warm_s']:.3f}" if "item_warm_s" in r else "-"
        lines.append(f"| {name} | {r['n']:,} | {r['open_s']:.2f} | {1e3 * r['items_s'] / max(1, res['items']):.2f}"
                     f"{p50} | {warm} | {r['rss'] / 1e9:.2f} GB ({r['rss_imports'] / 1e9:.2f} GB) |")
    for a, b in (("ours_warm", "lerobot_warm"), ("ours_cold", "lerobot_cold"), ("ours_warm", "lerobot06_warm"),
                 ("ours_cold", "lerobot06_cold")):
        if a in res and b in res:
            lines.append(f"\n{a} / {b}: open {res[a]['open_s'] / res[b]['open_s']:.2f}x, peak RSS "
                         f"{res[a]['rss'] / res[b]['rss']:.2f}x")
    q = res.get("sql")
    if q:
        nx, wh = res.get("sql_next", {}), q["whole"]
        lines += ["", "| SQL on the set (lerobot_sql, a fresh process, an empty cache; then the next process) | "
                  "seconds | next process | over the whole view (before) |", "|---|---:|---:|---:|",
                  f"| an episode query (`SELECT episode_index FROM episodes WHERE length >= 390`, "
                  f"{q['episodes_rows']:,} rows) | {q['episodes_query_s']:.3f} | | |"]
        for key, what in (("episode_query", f"one episode's frames (`SELECT * FROM frames WHERE episode_index = "
                                            f"54321`, {q['episode_rows']} rows), the process's first frames query"),
                          ("episode_query_other_file", "another episode's frames, in another data file"),
                          ("episode_query_next", "another episode's frames, in the same data file"),
                          ("episodes10_query", f"10 episodes over 10 data files, `IN (...)`, grouped "
                                               f"({q['episodes10_rows']} rows)"),
                          ("index_query", "the first 100 frames, `WHERE index < 100 ORDER BY index`")):
            lines.append(f"| {what} | {q[key + '_s']:.3f} | {nx.get(key + '_s', float('nan')):.3f} | "
                         f"{wh[key + '_s']:.3f} |")
        if "dataset_frames_s" in q:
            lines += [f"| `db.dataset('SELECT * FROM frames WHERE episode_index = 23456')`, a training set of one "
                      f"episode's frames ({q['dataset_frames_n']} samples) | {q['dataset_frames_s']:.3f} | | |",
                      f"| the same for another episode, in the same data file | {q['dataset_frames_next_s']:.3f} | | "
                      f"{wh['dataset_frames_next_s']:.3f} |"]
        lines += [f"| `db.stats()` of every frame ({q['stats_count']:,}), "
                  f"{'with' if q['stats_quantiles'] else 'no'} quantiles as the source's metadata | {q['stats_s']:.1f} |",
                  f"| the same with exact quantiles q01..q99 (as for a lerobot >= 0.4 source) | {q['stats_q_s']:.1f} |",
                  f"| export of 1% of the episodes ({q['export_frames']:,} frames) | {q['export_s']:.1f} |"]
    st = res.get("store")
    if st:
        lines += ["", f"row-group store after the three runs above: {st['row_groups']:,} row groups, "
                  f"{st['disk'] / 1e6:.1f} MB on disk, {st['disk'] / max(1, st['parquet']):.2f}x their Parquet bytes"]
    w = res.get("workers")
    if w:
        u = w["uss_mb"]
        lines += ["", f"DataLoader workers (2, shuffled, batch 32, tabular): private memory each, MB, after 100 / 300 / "
                  f"600 batches: {' / '.join(str(round(max(u[k]))) for k in ('100', '300', '600'))} "
                  f"({w['samples_s']:.0f} samples/s)"]
    w = res.get("workers_again")
    if w:
        lines.append(f"the same 600 batches in the next run (their row groups from the store): "
                     f"{w['samples_s']:.0f} samples/s, private memory each "
                     f"{' / '.join(str(round(max(w['uss_mb'][k]))) for k in ('100', '300', '600'))} MB")
    lines.append(f"\nload average before / after: {res['load'][0]:.1f} / {res['load_after'][0]:.1f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--peer-python", default=os.environ.get("LSQL_PEER_PYTHON"))
    ap.add_argument("--peer-06", default=None, help="an interpreter with lerobot 0.6.1 (default: none)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only-sql", action="store_true", help="only the SQL queries (two processes, no peer)")
    a = ap.parse_args()
    if not (a.root / "meta" / "info.json").exists():
        sys.exit(f"{a.root}: no dataset; generate it: python benchmarks/bench_scale.py generate --episodes 100000")
    res = measure_sql(a.root) if a.only_sql else measure(a.root, a.items, a.peer_python, a.peer_06)
    print(table(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
