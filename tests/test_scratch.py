"""Scratch files that must not outlive their writer (lerobot_sql/_storage/scratch.py): the one liveness rule of the
per-sample files, export staging folders and batch rings. The sweeps themselves: tests/test_spawn.py
(``test_leftovers_of_dead_processes_are_swept``), tests/faults/test_faults_process.py (killed exports)."""

from __future__ import annotations

import os
import subprocess
import sys

from lerobot_sql._storage import scratch


def test_a_pid_is_alive_until_its_process_is_gone():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert scratch.pid_alive(p.pid) and scratch.pid_alive(os.getpid())
    finally:
        p.kill()
        p.wait()
    assert not scratch.pid_alive(p.pid)


def test_no_pid_is_probed_on_windows(monkeypatch):
    """``os.kill(pid, 0)`` sends CTRL_C_EVENT on Windows (signal 0): it would interrupt the process it probes. Only
    the export's copy of the rule knew; the per-sample files' and the batch rings' copies called it there."""
    sent = []
    monkeypatch.setattr(os, "kill", lambda *a: sent.append(a))
    monkeypatch.setattr(os, "name", "nt")
    assert scratch.pid_alive(4_000_000) and sent == []


def test_a_writer_pid_counts_on_this_host_only():
    mine = scratch.owner_prefix("lsql-x")
    assert mine == f"lsql-x-{scratch.host_tag()}-{os.getpid()}-" and "-" not in scratch.host_tag()
    assert scratch.writer_pid(mine + "abc.arrow", "lsql-x") == os.getpid()
    assert scratch.writer_pid("lsql-x-otherhost-12-abc.arrow", "lsql-x") is None
