"""Spawned and forkserver DataLoader workers map the dataset's per-sample file by name: the
pickled dataset is bytes, not O(samples); their items equal forked and in-process ones; the file lives while the
dataset that wrote it lives, is deleted by that process only, and leaves nothing in the cache."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import lerobot_sql as lsql
from lerobot_sql.errors import CacheError
from test_batch import _delta, _same

REPO = Path(__file__).resolve().parents[1]


def _maps(cache: Path) -> list[Path]:
    return sorted(cache.glob("**/manifests/lsql-samples-*.arrow"))


def test_pickled_dataset_is_small(datasets, tmp_path):
    """Before: 1,708,959 bytes for small20's 4,762 samples (the arrays themselves); now the file's name."""
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path)
    full = db.dataset("SELECT index FROM frames ORDER BY index")
    few = db.dataset("SELECT index FROM frames WHERE episode_index < 20 AND frame_index < 5 ORDER BY index")
    assert len(full) == db.sql("SELECT sum(length) FROM episodes").fetchall()[0][0] == 4762 and len(few) == 100
    big, small = len(pickle.dumps(full)), len(pickle.dumps(few))
    assert big < 64_000, big  # the per-sample arrays alone are ~350 bytes x 4,762
    assert (big - small) / (len(full) - len(few)) < 1.0, (big, small)  # no per-sample growth beyond noise
    # the unpickled copy maps the same file and serves the same items
    copy = pickle.loads(pickle.dumps(full))
    assert copy._samples.map.path == full._samples.map.path and Path(full._samples.map.path).parent == _maps(tmp_path)[0].parent
    for i in (0, 2381, 4761):
        _same(copy[i], full[i], f"item {i}")


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawned_workers_equal_forked_and_in_process(datasets, tmp_path, framecode, context):
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path)
    cams = db.dataset("SELECT index FROM frames LIMIT 1").camera_keys
    ds = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta("diffusion", cams),
                    return_uint8=True)
    idx = [int(i) for i in np.random.default_rng(3).permutation(len(ds))[:48]]
    path = Path(ds._samples.map.path)

    def batches(ctx):
        # timeout: a worker that never answers fails the test instead of holding the suite (one run of the whole
        # suite, on two loaded cores, waited here forever once; not seen again)
        dl = DataLoader(ds, batch_size=8, sampler=idx,  # noqa: F821 (ds is deleted after these calls)
                        num_workers=2, multiprocessing_context=ctx, timeout=300)
        return list(dl)

    spawned, forked = batches(context), batches("fork")
    in_process = [torch.utils.data.default_collate(ds.__getitems__(idx[j:j + 8])) for j in range(0, 48, 8)]
    assert len(spawned) == len(forked) == 6
    for j, (a, b, c) in enumerate(zip(spawned, forked, in_process)):
        _same(a, b, f"batch {j} {context} vs fork")
        _same(a, c, f"batch {j} {context} vs in-process")
    # ground truth for one batch: the frames are the ones asked for
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    got = spawned[0]
    for j in range(8):
        ep, f = int(got["episode_index"][j]), int(got["frame_index"][j])
        assert int(got["index"][j]) == int(ds.manifest["index"][idx[j]].as_py())
        g = int(np.clip(f - 1, 0, lengths[ep] - 1))
        for k in cams:
            assert framecode.verify_frame(got[k][j, 0].permute(1, 2, 0).numpy(), ep, g, k)["ok"], (k, ep, f)
    assert path.exists()  # the workers exited without taking the parent's file
    del ds
    gc.collect()
    assert not path.exists()


def test_file_gone_after_close_and_collection_and_never_deleted_by_a_child(datasets, tmp_path):
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path)
    ds = db.dataset("SELECT index FROM frames WHERE episode_index < 2", cameras=[])
    path = Path(ds._samples.map.path)
    assert path.exists()
    # a forked child that closes and drops its copy leaves the parent's file alone
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ds.close()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert path.exists()
    # a deep copy shares the file: it lives while either does
    import copy

    twin = copy.deepcopy(ds)
    del ds
    gc.collect()
    assert path.exists()
    first = twin[0]
    twin.close()
    assert not path.exists()
    _same(twin[0], first)  # this process keeps its mapping
    with pytest.raises(CacheError, match="per-sample file is gone"):
        pickle.loads(pickle.dumps(twin))  # what a spawned worker started after close() gets
    other = db.dataset("SELECT index FROM frames WHERE episode_index = 3", cameras=[])
    p2 = Path(other._samples.map.path)
    del other
    gc.collect()
    assert not p2.exists() and _maps(tmp_path) == []


def _age(*paths: Path) -> None:
    for p in paths:  # older than the sweep's grace for files not yet locked by their writer
        os.utime(p, (p.stat().st_atime, p.stat().st_mtime - 3600))


def test_leftovers_of_dead_processes_are_swept(datasets, tmp_path):
    """A live dataset's file is held by its writer's flock (released by the kernel however the writer ends); the
    next dataset built removes files nobody holds, and never a file just created or still held."""
    import fcntl

    db = lsql.connect(datasets / "small20", cache_dir=tmp_path)
    ds = db.dataset("SELECT index FROM frames WHERE episode_index = 0", cameras=[])
    folder = Path(ds._samples.map.path).parent
    stale = folder / "lsql-samples-otherhost-1-abc.arrow"  # a writer killed before its finalizer ran
    held = folder / "lsql-samples-otherhost-2-abc.arrow"  # another container's live file (lock held)
    young = folder / "lsql-samples-otherhost-3-abc.arrow"  # just created, not yet locked by its writer
    for p in (stale, held, young):
        p.write_bytes(b"x")
    _age(stale, held, Path(ds._samples.map.path))
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        ds2 = db.dataset("SELECT index FROM frames WHERE episode_index = 1", cameras=[])
        assert not stale.exists() and held.exists() and young.exists()
        assert Path(ds._samples.map.path).exists() and Path(ds2._samples.map.path).exists()  # ds's file is old but held
    finally:
        os.close(fd)
    for p in (held, young):
        p.unlink()


@pytest.mark.slow
def test_no_file_left_after_a_run_with_spawned_workers(datasets, tmp_path):
    """A whole program: datasets built, a spawned DataLoader run, the program exits without closing anything;
    the cache's manifests folder is empty afterwards (exit-time cleanup), and a SIGKILLed run's files (their
    locks released by the kernel) are swept by the next dataset."""
    script = textwrap.dedent(f"""
        import sys, lerobot_sql as lsql
        from torch.utils.data import DataLoader
        db = lsql.connect({str(datasets / 'small20')!r}, cache_dir={str(tmp_path)!r})
        keep = [db.dataset("SELECT index FROM frames WHERE episode_index < 3", cameras=[]) for _ in range(2)]
        n = sum(len(b["index"]) for b in DataLoader(keep[0], batch_size=16, num_workers=2,
                                                     multiprocessing_context="spawn", timeout=300))
        print(n, len(keep[1]))
        if sys.argv[1] == "kill":
            import os, signal
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-c", script, "exit"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    n = lsql.connect(datasets / "small20").sql("SELECT sum(length) FROM episodes WHERE episode_index < 3").fetchall()
    assert r.stdout.split() == [str(n[0][0])] * 2
    assert _maps(tmp_path) == []
    r = subprocess.run([sys.executable, "-c", script, "kill"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == -9 and len(_maps(tmp_path)) == 2  # killed: no cleanup ran
    _age(*_maps(tmp_path))
    lsql.connect(datasets / "small20", cache_dir=tmp_path).dataset("SELECT index FROM frames LIMIT 1", cameras=[])
    assert _maps(tmp_path) == []  # the next dataset swept the dead run's files (its own is gone: collected)
