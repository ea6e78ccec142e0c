#!/usr/bin/env python
"""The throttled loopback link of ``bench_train --remote``, in a process of its own, optionally on a CPU of its own.

    python -m benchmarks.link_server ROOT --rate-bps 1e8 --latency-s 0.02 [--cpu 1]

Serves ROOT with tests/http_range_server.py's ``HubServer`` (Range, the Hub API face, one token bucket for all
connections, the latency before every answer). Prints its URL as the first line of stdout; then, for each line
``stats`` read on stdin, one JSON line ``{"requests", "bytes_sent", "missed"}``; it stops when stdin closes.

Why a process: in the benchmark's own process the server's Python threads and token bucket took CPU and the GIL
from the DataLoader's main process, and on the workers' cores, which no real remote (the Hub, S3) does; the remote
columns were charged for the server. ``--cpu`` pins it (all its threads) to that CPU; ``bench_train --pin`` gives
the benchmark and its workers the other CPUs, so that local and remote runs get the same CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--rate-bps", type=float, default=0.0, help="link rate in bits/s (0: unthrottled)")
    ap.add_argument("--latency-s", type=float, default=0.0, help="seconds before every answer")
    ap.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU")
    a = ap.parse_args(argv)
    if a.cpu is not None:  # before the server's threads start: threads inherit their creator's affinity
        os.sched_setaffinity(0, {a.cpu})
    sys.path.insert(0, str(REPO / "tests"))
    from http_range_server import HubServer

    with HubServer(a.root, rate_bps=a.rate_bps, latency_s=a.latency_s) as srv:
        print(srv.url, flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                print(json.dumps(_settled(srv)), flush=True)
    return 0


def _settled(srv) -> dict:
    """The log's counts once it has not grown for 50 ms (at most 2 s): a client has an answer's last byte a moment
    before the server's thread logs it, and asked right after a run, the count would miss that answer."""
    n, t_end = -1, time.monotonic() + 2
    while time.monotonic() < t_end:
        with srv.lock:
            m = len(srv.log)
        if m == n:
            break
        n = m
        time.sleep(0.05)
    with srv.lock:
        return {"requests": len(srv.log), "bytes_sent": sum(e[3] for e in srv.log), "missed": list(srv.missed)}


class LinkProcess:
    """The client side: starts ``link_server`` and answers what bench_train asks of an in-process server
    (``url``, ``bytes_sent()``, ``missed``). A context manager; the server stops when it exits."""

    def __init__(self, root: Path, rate_bps: float, latency_s: float, cpu: int | None = None):
        cmd = [sys.executable, "-m", "benchmarks.link_server", str(root), "--rate-bps", str(rate_bps),
               "--latency-s", str(latency_s)] + ([] if cpu is None else ["--cpu", str(cpu)])
        self.cpu = cpu
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.proc.kill()
            raise RuntimeError(f"benchmarks.link_server did not start (printed {self.url!r})")

    def stats(self) -> dict:
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def bytes_sent(self) -> int:
        return int(self.stats()["bytes_sent"])

    @property
    def missed(self) -> list[tuple[str, str]]:
        return [tuple(m) for m in self.stats()["missed"]]

    def __enter__(self) -> "LinkProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def pin_process(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus`` (threads already running included: DuckDB's and torch's pools
    were started before; forked DataLoader workers and child processes inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            pass


if __name__ == "__main__":
    sys.exit(main())
