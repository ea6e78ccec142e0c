"""Helpers for the fault suite: copy a shipped dataset into tmp_path, then break the copy in one precise way.

The shipped datasets (``sample/``, tests/data/README.md) are never touched; every damaging helper works on a copy
made by ``damaged``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest
from damage import (  # noqa: F401
    DATA,
    EPISODES,
    FRONT,
    INFO,
    TASKS,
    WRIST,
    edit_info,
    rewrite_parquet,
    scribble,
    set_column,
    shorten_mp4,
    truncate,
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each fault test its own cache root: a damaged copy never meets another test's cache entries."""
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def damaged(tmp_path, datasets) -> Callable[[str], Path]:
    """``damaged("small20")`` -> a fresh writable copy of that shipped dataset under tmp_path."""
    n = [0]

    def make(name: str = "small20") -> Path:
        n[0] += 1
        dst = tmp_path / f"{name}-{n[0]}"
        shutil.copytree(datasets / name, dst)
        for p in dst.rglob("*"):  # the source may be read-only (a shared checkout); the copy must be editable
            p.chmod(0o755 if p.is_dir() else 0o644)
        return dst

    return make


@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(size)`` -> a folder on its own tmpfs of ``size`` (e.g. "200k"), for full-disk and read-only faults.
    ``small_fs.remount(opts)`` changes it (e.g. "ro", "rw,size=32m"). Skips where mounting is not permitted."""
    import subprocess

    mounts = []

    class Small:
        def __call__(self, size: str) -> Path:
            d = tmp_path / f"tmpfs{len(mounts)}"
            d.mkdir()
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True)
            if r.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); needs CAP_SYS_ADMIN")
            mounts.append(d)
            return d

        def remount(self, d: Path, opts: str) -> None:
            subprocess.run(["mount", "-o", f"remount,{opts}", str(d)], check=True)

    yield Small()
    for d in mounts:  # lazy: memory maps of test objects may still be open
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
