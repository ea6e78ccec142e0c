#!/usr/bin/env python
"""Training-loader benchmark: lerobot_sql's DataLoader against lerobot 0.4.4 and 0.6.1 and the PyAV limit.

    python -m benchmarks.bench_train [--dataset small20] [--quick] [--rounds 5] [--items 1536] [--batch 32]
                                     [--workers 2] [--uint8] [--peer-python PATH] [--peer-06 PATH] [--no-peer]
                                     [--json OUT]
    python -m benchmarks.bench_train --remote [--mbit 100|1000] [--latency-ms 20] [--order blocks|random]
                                     [--block 32] [--k 8] [--rounds 3] [--no-pin] ...

Profiles (``delta_timestamps`` at the dataset's fps, the same dicts on every side): plain (no windows); ACT (action
chunk of 50: ``[0..49]``); diffusion (state and every camera at ``[-1, 0]``, action ``[-1..14]``). Every reader gets
the same shuffled indices through the same DataLoader (``num_workers`` forked workers, ``batch_size``, default
collate, the list of indices as sampler; ``common.train_loader``): items/s after the first batch (worker start-up
excluded) and the workers' CPU ms per item (utime + stime from /proc over the same span, which other jobs on shared
cores disturb least).

Local run (default), in this order:
  * cold: per profile, the first epoch of a dataset opened on an empty cache dir (row groups and video indexes are
    built during it), as a whole-epoch figure (items / time from ``iter()`` to the last batch);
  * lerobot_sql, warm (one untimed pass first): per round and profile, one dataset object read with
    ``__getitems__`` (the batched fetch) and with it hidden (``ds.__getitems__ = None``: ``ds[i]`` per item +
    ``default_collate``), alternating which goes first; then one process (no workers, one torch thread as in a
    worker) reading the first 8 batches (``--quick``: 2) with and without ``__getitems__``; then the decode limit:
    one process decoding the same items' camera frames (the profile's camera window, clamped to the episode) with
    PyAV alone (``run.DecodeLimit``: rgb24 ndarrays, no tensors), times the number of workers;
  * lerobot 0.4.4 (``--peer-python``, default ``$LSQL_PEER_PYTHON``, else ../peer/bin/python beside the checkout)
    and lerobot 0.6.1 (``--peer-06``, also spelt ``--peer06-python``, as in bench_open and bench_loop; default ``$LSQL_PEER06_PYTHON``, else ../peer06/bin/python beside the
    checkout when present), each in a clean process of its own (``peer_lerobot.py`` train mode: torchcodec decoders
    fail in workers forked from a process that already decoded), offline with a throwaway HF_HOME: one
    ``LeRobotDataset`` per profile, then ``rounds + 1`` passes, the first being "cold" (the first DataLoader pass
    after the open). A missing interpreter skips its column with a note. ``--uint8`` passes ``return_uint8=True``
    to lerobot_sql and 0.6.1 (what lerobot-train does there); 0.4.4 has no such argument and stays float32 (the
    table says so).
Tables: medians over rounds; the on/off table; the comparison table (ratios ours / lerobot 0.4.4, ours / lerobot
0.6.1, ours / (W x 1 process ours), ours / limit); the cold-vs-steady table (whole-epoch figures on both sides).

``--remote``: the dataset folder is served by tests/http_range_server.py (one token bucket of ``--mbit`` for all
connections, 100 or 1000 Mbit/s, ``--latency-ms`` before every answer). Per profile, the same items in the same order
through a DataLoader: the local dataset (warm), then the remote one with a fresh cache (nothing warm: every batch's
bytes cross the link) without and with ``ds.pipeline(indices, batches=k)``. items/s after the first batch; bytes =
what the server sent over the whole run (metadata, footers and moov boxes included) per item, against what the items
need (meta/ + ``prefetch.needed_ranges`` of their manifest rows). Best of ``--rounds`` (items/s: max; bytes and CPU:
min). "all cached": the pipelined remote dataset read once more, everything in its cache (pieces, row groups,
indexes): the remote read path without the network. "link-bound items/s" = link rate / needed bytes per item: the
most the link allows, so a profile "fits the link" when it is above the local items/s.
``--pin`` (the default with >= 2 CPUs; ``--no-pin`` to switch off): the server runs in a process of its own
(``benchmarks/link_server.py``) pinned to the last CPU, and this process, its DataLoader workers and lerobot's
processes to the others, local and remote runs alike. Without it the server's Python threads and token bucket share
the benchmark's process (its GIL) and the workers' cores, and the remote columns pay for the server's CPU, which no
real remote (the Hub, S3) takes from the training machine. On a 2-CPU machine the benchmark then has one CPU.
Then lerobot's real remote story on the same server and link (its Hub API face, tests/http_range_server.py's
HubServer): per round, profile and lerobot version (0.4.4, and 0.6.1 when its interpreter exists), a clean process
with a fresh HF_HOME and ``HF_ENDPOINT`` at the server runs ``LeRobotDataset("local/<name>")``, which asks for the
refs (the v3.0 tag), downloads every file (snapshot_download), then reads locally; then two DataLoader passes over
the same indices. Second table: per reader, the first batch from nothing (open, lerobot's download included, + fork
+ first batch), the first epoch from nothing, items/s after the first batch (ours: that remote pass; lerobot: its
second pass, on local files), and everything the server sent per item. ``--no-peer`` skips lerobot.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
from run import DecodeLimit  # noqa: E402  (the frame-access benchmark's PyAV-alone reader)

DEFAULT_PEER = common.PEER_PYTHON
DEFAULT_PEER06 = common.PEER06_PYTHON


def _find(name: str) -> Path:
    for base in [Path(name), REPO / "sample" / name, common.BENCH_DATA / name]:
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


def _remote(a, torch, lsql, root: Path) -> int:
    """``--remote``: steady state over a throttled loopback HTTP link, nothing warm (a fresh cache per run)."""

    sys.path.insert(0, str(REPO / "tests"))
    from benchmarks.link_server import LinkProcess, pin_process
    from http_range_server import HubServer  # the range server plus a Hub API face for lerobot, one throttle
    from lerobot_sql import prefetch as pf
    from lerobot_sql.torch.samplers import EpisodeAwareSampler

    sql = "SELECT index FROM frames ORDER BY index"
    db = lsql.connect(root)
    base = db.dataset(sql)
    n, cams = len(base), base.camera_keys
    if a.items > n:  # the order would be cut short silently, and every figure is per item of a.items
        raise SystemExit(f"--items {a.items}: {root.name} has {n} frames")
    if a.order == "random":
        order = np.random.default_rng(a.seed).permutation(n)
    else:  # blocks of consecutive frames of one episode, shuffled (what a training run on video would use)
        order = EpisodeAwareSampler(base, block_size=a.block, seed=a.seed).order()
    indices = [int(i) for i in order[:a.items]]
    meta = sum(p.stat().st_size for p in (root / "meta").rglob("*") if p.is_file())
    load0 = os.getloadavg()
    rows = []
    profs = profiles(base.fps, cams)
    cpus = sorted(os.sched_getaffinity(0))
    pin = a.pin if a.pin is not None else len(cpus) >= 2
    if pin and len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs (the server gets one, the benchmark the others)")
    if pin:  # the server on the last CPU, this process (its threads, workers, lerobot's processes) on the others
        server_cpu, ours = cpus[-1], set(cpus[:-1])
        pin_process(ours)
        where = f"server pinned to CPU {server_cpu}, benchmark and workers to CPUs {sorted(ours)}"
        link = LinkProcess(root.parent, a.mbit * 1e6, a.latency_ms / 1000, cpu=server_cpu)
    else:
        where = f"server in the benchmark's process, all on CPUs {cpus}"
        link = HubServer(root.parent, rate_bps=a.mbit * 1e6, latency_s=a.latency_ms / 1000)
    def remote_pass(mode: str, dt, res: dict, caches: list[str]):
        """One pass over the remote dataset from a fresh cache, pipelined (``on``) or not (``off``): its figures
        into ``res``; returns the dataset (its cache filled)."""
        sent = srv.bytes_sent()
        t_open = time.perf_counter()
        caches.append(tempfile.mkdtemp(prefix="lsql_bt_"))  # warm nothing: a fresh cache each pass
        rdb = lsql.connect(f"{srv.url}/{root.name}", cache_dir=caches[-1])
        ds = rdb.dataset(sql, delta_timestamps=dt, return_uint8=a.uint8)
        if mode == "on":
            ds.pipeline(indices, batches=a.k)
        open_s = time.perf_counter() - t_open
        m = common.train_loader(torch, ds, indices, a.batch, a.workers)
        res[mode].append(m["items_per_s"])
        res[f"cpu_{mode}"].append(m["cpu_ms_per_item"])
        res[f"bytes_{mode}"].append(srv.bytes_sent() - sent)
        # from nothing: open (connect, dataset, pipeline plan) + fork + first batch; and the whole pass
        res[f"open_{mode}"].append(open_s)
        res[f"first_{mode}"].append(open_s + m["first_batch_s"])
        res[f"epoch_{mode}"].append(open_s + len(indices) / m["epoch_items_per_s"])
        return ds

    with link as srv:
        for prof, dt in profs.items():
            local = db.dataset(sql, delta_timestamps=dt, return_uint8=a.uint8)
            common.train_loader(torch, local, indices, a.batch, a.workers)  # warm
            need = pf.needed_ranges(db, local.manifest.take(indices), dt)
            needed = meta + sum(b - x for rs in need.values() for x, b in rs)
            res = {"local": [], "local_after": [], "off": [], "on": [], "warm": [], "bytes_off": [], "bytes_on": [],
                   "cpu_local": [],
                   "cpu_off": [], "cpu_on": [], "first_off": [], "first_on": [], "epoch_off": [], "epoch_on": [],
                   "open_off": [], "open_on": []}
            caches: list[str] = []
            for _ in range(a.rounds):
                m = common.train_loader(torch, local, indices, a.batch, a.workers)
                res["local"].append(m["items_per_s"])
                res["cpu_local"].append(m["cpu_ms_per_item"])
                # the pipelined pass between two local ones (its ratio is over their mean: the machine's speed
                # drifts by up to a third within a minute here, so a local pass further away pairs worse)
                ds = remote_pass("on", dt, res, caches)
                res["local_after"].append(common.train_loader(torch, local, indices, a.batch, a.workers)["items_per_s"])
                # the same remote dataset again, everything cached (pieces, row groups, indexes): the read path's
                # own ceiling, without the network
                res["warm"].append(common.train_loader(torch, ds, indices, a.batch, a.workers)["items_per_s"])
                del ds
                remote_pass("off", dt, res, caches)
                for c in caches:  # 12 MB a pass at 96x128: runs of the bench left gigabytes in /tmp
                    shutil.rmtree(c, ignore_errors=True)
                caches.clear()
            rows.append((prof, {k: max(v) if not k.startswith(("bytes", "cpu", "first", "epoch", "open")) else min(v)
                                for k, v in res.items()}, needed, res))
            print(f"  {prof}: {res}", file=sys.stderr, flush=True)
        load_mid = os.getloadavg()
        hub, notes = _hub_peers(a, srv, root, profs, indices)
        # an endpoint a lerobot / huggingface_hub version calls and the Hub face lacks (the agent-harness registry
        # is optional telemetry: huggingface_hub goes on without it)
        missed = sorted({f"{m} {u.split('?')[0]}" for m, u in srv.missed if "agent-harnesses" not in u})
        if missed:
            notes["Hub face"] = f"answered 404 to {missed[:5]}"
    load1 = os.getloadavg()
    print(f"\n{root.name}: {n} frames, cameras {cams}, {len(indices)} items in {a.order} order"
          f"{f' (blocks of {a.block})' if a.order == 'blocks' else ''}, batch {a.batch}, {a.workers} workers (fork), "
          f"{'uint8' if a.uint8 else 'float32'}; link {a.mbit:g} Mbit/s + {a.latency_ms:g} ms per answer; fresh "
          f"cache per remote run; best of {a.rounds}; pipeline batches={a.k}; load average {load0[0]:.2f} before, "
          f"{load_mid[0]:.2f} after lerobot_sql, {load1[0]:.2f} after lerobot; {common.cpu_info()}; {where}")
    print("\n| profile | local items/s | remote items/s | remote + pipeline items/s | pipeline / local "
          "(best / median of rounds, each over the mean of the local passes before and after it) | "
          "remote, all cached, items/s | workers' CPU ms/item: local / remote / pipeline | needed KB/item | "
          "fetched KB/item, off / pipeline | fetched / needed, off / pipeline | link-bound items/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for prof, m, needed, _res in rows:
        ni = len(indices)
        paired = statistics.median(on / ((lo + lo2) / 2) for on, lo, lo2 in zip(_res["on"], _res["local"],
                                                                                  _res["local_after"]))
        print(f"| {prof} | {m['local']:,.0f} | {m['off']:,.0f} | {m['on']:,.0f} | {m['on'] / m['local']:.2f}x / "
              f"{paired:.2f}x | "
              f"{m['warm']:,.0f} | {m['cpu_local']:.2f} / {m['cpu_off']:.2f} / {m['cpu_on']:.2f} | "
              f"{needed / ni / 1e3:.1f} | {m['bytes_off'] / ni / 1e3:.1f} / {m['bytes_on'] / ni / 1e3:.1f} | "
              f"{m['bytes_off'] / needed:.2f} / {m['bytes_on'] / needed:.2f} | {a.mbit * 1e6 / 8 / (needed / ni):,.0f} |")
    _hub_table(a, rows, hub, notes, len(indices))
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "cpus": where, "load": [load0, load_mid, load1],
                                            "rows": [(p, r, nd) for p, _m, nd, r in rows], "lerobot_hub": hub,
                                            "lerobot_notes": notes}, indent=1))
    return 0


def _peer_interpreters(a, notes: dict):
    """(slot, interpreter, whether it takes return_uint8) of each lerobot to run; a skipped one gets a note."""
    for slot, py, flag, uint8_ok in (("0.4.4", a.peer_python, "--peer-python / $LSQL_PEER_PYTHON", False),
                                     ("0.6.1", a.peer06_python, "--peer06-python / $LSQL_PEER06_PYTHON", True)):
        if a.no_peer:
            notes[slot] = "skipped (--no-peer)"
        elif not py or not Path(py).exists():
            notes[slot] = f"skipped: {py or DEFAULT_PEER06} not found (set {flag})"
        else:
            yield slot, py, uint8_ok


def _hub_peers(a, srv, root: Path, profs: dict, indices: list[int]) -> tuple[dict, dict]:
    """lerobot's remote path over the same link: per round, profile and lerobot version, a clean process
    (peer_lerobot.py hub mode) with a fresh HF_HOME runs ``LeRobotDataset("local/<name>")`` against the server's Hub
    face (refs, repo info, tree, then every file into the HF cache), then two DataLoader passes over the same indices.
    Returns ({slot: {profile: {metric: [per round]}}}, {slot: note}); bytes = what the server sent during the
    process (API answers included)."""
    out, notes = {}, {}
    for slot, py, uint8_ok in _peer_interpreters(a, notes):
        res = {p: {k: [] for k in ("open", "first", "epoch", "steady", "first_pass", "bytes")} for p in profs}
        for r in range(a.rounds):
            for prof, dt in profs.items():
                print(f"[{root.name}] lerobot {slot} from the Hub face, {prof}, round {r + 1}/{a.rounds} ...",
                      file=sys.stderr, flush=True)
                plan = {"only": "hub", "repo_id": f"local/{root.name}", "profile": prof, "delta_timestamps": dt,
                        "indices": indices, "batch": a.batch, "workers": a.workers, "passes": 2,
                        "return_uint8": bool(a.uint8 and uint8_ok)}
                sent = srv.bytes_sent()
                m = common.run_peer(py, HERE / "peer_lerobot.py", plan, a.peer_timeout, endpoint=srv.url)
                if "error" in m:
                    notes[slot] = f"failed: {m['error']}"
                    break
                p0, p1 = m["passes"][0], m["passes"][1]
                res[prof]["bytes"].append(srv.bytes_sent() - sent)
                res[prof]["open"].append(m["open_s"])
                res[prof]["first"].append(m["open_s"] + p0["first_batch_s"])
                res[prof]["epoch"].append(m["open_s"] + len(indices) / p0["epoch_items_per_s"])
                res[prof]["first_pass"].append(p0["items_per_s"])
                res[prof]["steady"].append(p1["items_per_s"])
                if m.get("version") != slot:
                    notes[slot] = f"{py} has lerobot {m.get('version')}, not {slot}"
            if slot in notes and notes[slot].startswith("failed"):
                break
        if all(v["steady"] for v in res.values()):
            out[slot] = res
        if a.uint8 and not uint8_ok:
            notes.setdefault(slot, "float32 frames: lerobot 0.4.4 has no return_uint8")
    return out, notes


def _hub_table(a, rows, hub: dict, notes: dict, ni: int) -> None:
    """The remote comparison table: lerobot_sql streaming against lerobot's download-then-local, from nothing."""
    print(f"\nFrom nothing over the same link ({a.mbit:g} Mbit/s + {a.latency_ms:g} ms): lerobot_sql streams (fresh "
          "cache, reads only what the items need); lerobot downloads the whole dataset first (LeRobotDataset(repo_id) "
          "with a fresh HF_HOME against the server's Hub API face: refs, repo info, tree, snapshot_download of every "
          "file), then reads locally. First batch = open (lerobot: download included) + fork + first batch; epoch = "
          f"the same through the last of {ni} items (the open alone is in --json); items/s after the first batch (lerobot_sql: that same pass, "
          "remote; lerobot: a second pass, local files); KB sent/item = all the server sent for the run / items. "
          f"Best of {a.rounds} (times: min, items/s: max).")
    print("\n| profile | reader | first batch from nothing, s | epoch from nothing, s | items/s | KB sent/item | "
          "pipeline items/s / this | this first batch / pipeline's |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for prof, m, _needed, _res in rows:
        lines = [("lerobot_sql remote", m["first_off"], m["epoch_off"], m["off"], m["bytes_off"]),
                 ("lerobot_sql remote + pipeline", m["first_on"], m["epoch_on"], m["on"], m["bytes_on"])]
        for slot in ("0.4.4", "0.6.1"):
            if slot in hub:
                h = hub[slot][prof]
                lines.append((f"lerobot {slot}, download then local", min(h["first"]), min(h["epoch"]),
                              max(h["steady"]), min(h["bytes"])))
        for name, first, epoch, ips, sent in lines:
            print(f"| {prof} | {name} | {first:.2f} | {epoch:.2f} | {ips:,.0f} | {sent / ni / 1e3:,.1f} | "
                  f"{_ratio(m['on'], ips)} | {_ratio(first, m['first_on'])} |")
    for slot, note in notes.items():
        print(f"{'lerobot ' if slot[0].isdigit() else ''}{slot}: {note}")


def _cam_offsets(dt: dict | None, cams: list[str], fps: float) -> tuple[int, ...] | None:
    """The profile's camera window in frames (every camera gets the same one in these profiles), None without one."""
    wins = {tuple(round(d * fps) for d in dt[k]) for k in cams if dt and k in dt}
    if len(wins) > 1:
        raise SystemExit(f"cameras with different windows {wins}: the decode limit takes one window for all")
    return wins.pop() if wins else None


def _limit(limit, indices: list[int], offsets) -> float:
    """items/s of one process decoding each item's camera frames with PyAV alone (run.DecodeLimit), one warm-up."""
    get = limit.item if offsets is None else (lambda i: limit.window_item(i, offsets))
    get(indices[0])
    t0 = time.perf_counter()
    for i in indices:
        get(i)
    return len(indices) / (time.perf_counter() - t0)


def _cold(torch, lsql, root: Path, sql: str, dt, a) -> dict:
    """The first epoch over an empty lerobot_sql cache (a fresh cache dir: row-group cache files and video indexes
    are built during it); the OS page cache is not dropped (the files may be in memory)."""
    cache = tempfile.mkdtemp(prefix="lsql_bt_cold_")
    try:
        t0 = time.perf_counter()
        db = lsql.connect(root, cache_dir=cache)
        ds = db.dataset(sql, delta_timestamps=dt, return_uint8=a.uint8)
        open_s = time.perf_counter() - t0
        m = common.train_loader(torch, ds, a.indices, a.batch, a.workers)
        db.close()
        return {**m, "open_s": open_s}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _peers(a, root: Path, profs: dict) -> tuple[dict, dict]:
    """lerobot 0.4.4 and 0.6.1 through peer_lerobot.py's train mode, each in a clean process of its own (torchcodec
    decoders fail in workers forked from a process that already decoded). Returns ({slot: result}, {slot: note})."""
    out, notes = {}, {}
    for slot, py, uint8_ok in _peer_interpreters(a, notes):
        print(f"[{root.name}] lerobot {slot} ({py}) ...", file=sys.stderr, flush=True)
        plan = {"only": "train", "root": str(root.resolve()), "indices": a.indices, "profiles": profs,
                "batch": a.batch, "workers": a.workers, "rounds": a.rounds, "return_uint8": bool(a.uint8 and uint8_ok)}
        r = common.run_peer(py, HERE / "peer_lerobot.py", plan, a.peer_timeout)
        if "error" in r:
            notes[slot] = f"failed: {r['error']}"
            continue
        out[slot] = r
        if r.get("version") != slot:
            notes[slot] = f"{py} has lerobot {r.get('version')}, not {slot}"
        elif a.uint8 and not uint8_ok:
            notes[slot] = "float32 frames: lerobot 0.4.4 has no return_uint8"
    return out, notes


def _fmt(x, spec=",.0f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def _ratio(x, y) -> str:
    return "-" if x is None or y is None or not y or x != x or y != y else f"{x / y:.2f}x"


def _local(a, torch, lsql, root: Path) -> int:
    sql = "SELECT index FROM frames ORDER BY index"
    db = lsql.connect(root)
    base = db.dataset(sql)
    n, cams, fps = len(base), base.camera_keys, base.fps
    a.indices = [int(i) for i in np.random.default_rng(a.seed).permutation(n)[:a.items]]
    sub = a.indices[:a.batch * (2 if a.quick else 8)]  # the 1-process and decode-limit items
    profs = profiles(fps, cams)
    load0 = os.getloadavg()
    cold = {}
    for p, dt in profs.items():
        print(f"[{root.name}] lerobot_sql cold {p} ...", file=sys.stderr, flush=True)
        cold[p] = _cold(torch, lsql, root, sql, dt, a)
    sets = {p: db.dataset(sql, delta_timestamps=dt, return_uint8=a.uint8) for p, dt in profs.items()}
    for ds in sets.values():  # warm: cache files, indexes, page cache
        common.train_loader(torch, ds, a.indices, a.batch, a.workers)
        # and this process's own first reads (it opens its files and decoders lazily), so that the 1-process figure
        # of the first round does not pay them
        _single(torch, ds, sub[:a.batch], a.batch, True)
    keys = ("on", "off", "single", "single_off", "cpu_on", "cpu_off", "epoch_on", "first_on", "limit")
    res: dict[str, dict[str, list[float]]] = {p: {k: [] for k in keys} for p in sets}
    for r in range(a.rounds):
        print(f"[{root.name}] lerobot_sql round {r + 1}/{a.rounds} ...", file=sys.stderr, flush=True)
        for p, ds in sets.items():
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                if mode == "off":
                    ds.__getitems__ = None  # the fetcher's per-item path: [ds[i] for i in batch] + default_collate
                try:
                    m = common.train_loader(torch, ds, a.indices, a.batch, a.workers)
                    res[p][mode].append(m["items_per_s"])
                    res[p][f"cpu_{mode}"].append(m["cpu_ms_per_item"])
                    if mode == "on":
                        res[p]["epoch_on"].append(m["epoch_items_per_s"])
                        res[p]["first_on"].append(m["first_batch_s"])
                finally:
                    ds.__dict__.pop("__getitems__", None)
            res[p]["single"].append(_single(torch, ds, sub, a.batch, True))
            res[p]["single_off"].append(_single(torch, ds, sub, a.batch, False))
        # PyAV alone; its containers are opened after this round's forks and closed before the next round's
        limit = DecodeLimit(db, sets["plain"])
        try:
            for p, dt in profs.items():
                res[p]["limit"].append(_limit(limit, sub, _cam_offsets(dt, cams, fps)))
        finally:
            limit.close()
    load1 = os.getloadavg()
    peers, notes = _peers(a, root, profs)
    load2 = os.getloadavg()
    med = {p: {m: statistics.median(v) for m, v in d.items()} for p, d in res.items()}
    W = a.workers
    print(f"\n{root.name}: {n} frames, cameras {cams} at {_res(root)}, {len(a.indices)} shuffled items, batch "
          f"{a.batch}, {W} workers (fork), {'uint8' if a.uint8 else 'float32'} frames, median of {a.rounds} rounds"
          f"{' (--quick)' if a.quick else ''}; load average {load0[0]:.2f} before, {load1[0]:.2f} after lerobot_sql, "
          f"{load2[0]:.2f} after lerobot; {common.cpu_info()}, torch {torch.__version__}")
    print("\n| profile | __getitems__ on, items/s | off (per item + default_collate), items/s | on / off "
          "(median of per-round ratios) | workers' CPU per item, on / off (ms) | CPU off / on | 1 process, on / off, "
          f"items/s | on / ({W} x 1 process on) | rounds on (min-max) | rounds off (min-max) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for p, m in med.items():
        on, off = res[p]["on"], res[p]["off"]
        paired = statistics.median(x / y for x, y in zip(on, off))
        print(f"| {p} | {m['on']:,.0f} | {m['off']:,.0f} | {paired:.2f}x | {m['cpu_on']:.2f} / {m['cpu_off']:.2f} | "
              f"{m['cpu_off'] / m['cpu_on']:.2f}x | {m['single']:,.0f} / {m['single_off']:,.0f} | "
              f"{m['on'] / (W * m['single']):.2f} | {min(on):,.0f}-{max(on):,.0f} | "
              f"{min(off):,.0f}-{max(off):,.0f} |")

    def steady(slot, p, key):
        r = peers.get(slot)
        return statistics.median(x[key] for x in r["steady"][p]) if r and r["steady"][p] else None

    def cold_of(slot, p, key):
        r = peers.get(slot)
        return r["cold"][p][key] if r else None

    l04 = "lerobot 0.4.4" + (" (float32: no return_uint8)" if a.uint8 else "")
    print(f"\nAgainst lerobot and the decode limit (same indices, same delta_timestamps, same DataLoader; lerobot_sql "
          f"= __getitems__ on):\n\n| profile | lerobot_sql items/s | {l04} items/s | lerobot 0.6.1 items/s | "
          f"limit (PyAV x {W}) items/s | {W} x 1 process ours, items/s | workers' CPU ms/item: ours / 0.4.4 / 0.6.1 | "
          f"ours / lerobot 0.4.4 | ours / lerobot 0.6.1 | ours / ({W} x 1 process ours) | ours / limit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p, m in med.items():
        v04, v06 = steady("0.4.4", p, "items_per_s"), steady("0.6.1", p, "items_per_s")
        lim = W * m["limit"]
        print(f"| {p} | {m['on']:,.0f} | {_fmt(v04)} | {_fmt(v06)} | {lim:,.0f} | {W * m['single']:,.0f} | "
              f"{m['cpu_on']:.2f} / {_fmt(steady('0.4.4', p, 'cpu_ms_per_item'), '.2f')} / "
              f"{_fmt(steady('0.6.1', p, 'cpu_ms_per_item'), '.2f')} | {_ratio(m['on'], v04)} | "
              f"{_ratio(m['on'], v06)} | {_ratio(m['on'], W * m['single'])} | {_ratio(m['on'], lim)} |")
    print("\nCold first epoch vs steady state, whole epoch (items / time from iter() to the last batch: worker "
          "start-up and first batch included; first batch in seconds in brackets). lerobot_sql cold = an empty cache "
          "dir (row groups and video indexes built during the epoch); lerobot cold = its first DataLoader pass after "
          "LeRobotDataset() in a fresh process; OS page cache not dropped on either side.\n")
    print("| profile | lerobot_sql cold | lerobot_sql steady | cold / steady | lerobot 0.4.4 first pass | "
          "lerobot 0.4.4 steady | cold / steady | lerobot 0.6.1 first pass | lerobot 0.6.1 steady | cold / steady | "
          "ours / lerobot 0.4.4, cold | ours / lerobot 0.6.1, cold |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p, m in med.items():
        c = cold[p]
        cells = [f"{c['epoch_items_per_s']:,.0f} ({c['first_batch_s']:.2f} s)",
                 f"{m['epoch_on']:,.0f} ({m['first_on']:.2f} s)", _ratio(c["epoch_items_per_s"], m["epoch_on"])]
        for slot in ("0.4.4", "0.6.1"):
            ce, cf = cold_of(slot, p, "epoch_items_per_s"), cold_of(slot, p, "first_batch_s")
            se, sf = steady(slot, p, "epoch_items_per_s"), steady(slot, p, "first_batch_s")
            cells += [f"{_fmt(ce)} ({_fmt(cf, '.2f')} s)" if ce else "-",
                      f"{_fmt(se)} ({_fmt(sf, '.2f')} s)" if se else "-", _ratio(ce, se)]
        cells += [_ratio(c["epoch_items_per_s"], cold_of("0.4.4", p, "epoch_items_per_s")),
                  _ratio(c["epoch_items_per_s"], cold_of("0.6.1", p, "epoch_items_per_s"))]
        print(f"| {p} | " + " | ".join(cells) + " |")
    print()
    for slot in ("0.4.4", "0.6.1"):
        r = peers.get(slot)
        dtypes = sorted({str(c.get("frame_dtype")).replace("torch.", "") for c in r["cold"].values()}) if r else []
        info = (f"lerobot {r['version']}, torch {r['torch']}, {r['backend']} backend, frames {', '.join(dtypes)}, "
                f"open of the {len(r['cold'])} LeRobotDatasets {r['open_s']:.2f} s" if r else "no figures")
        print(f"lerobot {slot} column: {info}{'; ' + notes[slot] if slot in notes else ''}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "load": [load0, load1, load2], "rounds": res,
                                            "cold": cold, "lerobot": peers, "notes": notes}, indent=1))
    return 0


def _res(root: Path) -> str:
    meta = json.loads((root / "meta" / "info.json").read_text())
    return ",".join(sorted({"x".join(map(str, f["shape"][:2])) for f in meta["features"].values()
                            if f["dtype"] == "video"})) or "-"


def run(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="small20", help="a path, or a name under sample/ or $LSQL_BENCH_DATA")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 256 items, 1 round, 64 items for the 1-process and limit figures")
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (--quick: 1)")
    ap.add_argument("--items", type=int, default=None, help="shuffled items per pass, default 1536 (--quick: 256)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--uint8", action="store_true",
                    help="return_uint8=True (lerobot_sql and lerobot 0.6.1; lerobot 0.4.4 stays float32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--peer-python", default=DEFAULT_PEER,
                    help="interpreter with lerobot 0.4.4 (default $LSQL_PEER_PYTHON, else ../peer/bin/python beside "
                         "the checkout)")
    ap.add_argument("--peer06-python", "--peer-06", dest="peer06_python",
                    default=DEFAULT_PEER06 if os.environ.get("LSQL_PEER06_PYTHON") or Path(DEFAULT_PEER06).exists()
                    else "",
                    help="interpreter with lerobot 0.6.1 (default $LSQL_PEER06_PYTHON, else ../peer06/bin/python "
                         "beside the checkout when present; skipped with a note when absent)")
    ap.add_argument("--no-peer", action="store_true", help="skip both lerobot columns (local and --remote)")
    ap.add_argument("--peer-timeout", type=float, default=3600, help="seconds per lerobot process")
    ap.add_argument("--remote", action="store_true",
                    help="steady state over a throttled loopback HTTP link: local vs remote vs remote + pipeline")
    ap.add_argument("--mbit", type=float, default=100,
                    help="--remote: link rate in Mbit/s, 100 (default) or 1000 (the two links its targets are set for)")
    ap.add_argument("--latency-ms", type=float, default=20)
    ap.add_argument("--order", choices=["random", "blocks"], default="blocks",
                    help="--remote: item order (blocks: EpisodeAwareSampler's shuffled blocks of --block frames)")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--k", type=int, default=8, help="--remote: batches fetched ahead per worker")
    ap.add_argument("--pin", dest="pin", action="store_true", default=None,
                    help="--remote: the server in a process of its own on the last CPU, everything else on the "
                         "others (default when there are >= 2 CPUs)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="--remote: the server's threads in the benchmark's process, on every CPU")
    a = ap.parse_args(argv)
    a.rounds = a.rounds or (1 if a.quick else 5)
    a.items = a.items or (256 if a.quick else 1536)
    import torch

    import lerobot_sql as lsql

    # the 1-process column models one DataLoader worker, which torch runs with one intra-op thread
    torch.set_num_threads(1)

    root = _find(a.dataset)
    if a.remote:
        return _remote(a, torch, lsql, root.resolve())
    return _local(a, torch, lsql, root)


if __name__ == "__main__":
    sys.exit(run())
