"""Remote faults over the loopback HTTP server, beyond what tests/test_remote.py covers (5xx, truncated bodies and
slow servers: test_server_faults_retry_then_clear_error; interrupted downloads: test_interrupted_download_resumes;
concurrent readers: test_concurrent_readers_fetch_each_range_once). Added here: connection resets and files that
change on the server. Matrix: docs/reliability.md."""

from __future__ import annotations

import os
import socket
import struct
import time

import numpy as np
import pytest
import torch

import lerobot_sql as lsql
from lerobot_sql.errors import RemoteIOError
from lerobot_sql.source import open_source

from damage import DATA, rewrite_parquet, set_column
from http_range_server import RangeServer, _Handler

pytestmark = pytest.mark.timeout(90)


class _ResetHandler(_Handler):
    """Adds ``faults["reset"]``: the server drops the TCP connection with a RST instead of answering."""

    def _fault(self) -> bool:
        f = self.server.faults
        if f.get("reset", 0) > 0:
            f["reset"] -= 1
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return True
        return super()._fault()


class ResetServer(RangeServer):
    def __init__(self, root):
        super().__init__(root)
        self.RequestHandlerClass = _ResetHandler


@pytest.fixture(autouse=True)
def _online(monkeypatch):
    monkeypatch.delenv("LSQL_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_connection_reset_retried_then_typed_error(tmp_path):
    import aiohttp

    data = np.random.default_rng(1).integers(0, 256, 5 << 20, dtype=np.uint8).tobytes()
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "blob.bin").write_bytes(data)
    with ResetServer(tmp_path / "srv") as srv:
        src = open_source(srv.url, {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=5)}},
                          cache_dir=tmp_path / "c")
        fs, url = src.fs, f"{srv.url}/blob.bin"
        fs.backoff_s = 0.01
        fs.info(url)
        srv.faults["reset"] = 2
        assert fs.read_range(url, 100, 200_000) == data[100:200_000]  # two resets, then the bytes
        srv.faults["reset"] = 1000
        t0 = time.monotonic()
        with pytest.raises(RemoteIOError, match=r"blob\.bin: bytes 3000000-3100000.*failed after 5 attempt"):
            fs.read_range(url, 3_000_000, 3_100_000)
        assert time.monotonic() - t0 < 30  # bounded: retries with backoff, then the error
        assert fs.missing(url, 3_000_000, 3_100_000) == [(3_000_000, 3_100_000)]
        assert not list((tmp_path / "c").rglob("*.tmp"))
        srv.faults.clear()
        assert fs.read_range(url, 3_000_000, 3_100_000) == data[3_000_000:3_100_000]


def _state(item) -> np.ndarray:
    return item["observation.state"].numpy()


def _bump_state(root, delta: float) -> None:
    """Rewrite the data file with observation.state + delta: new bytes and mtime (so a new ETag), the same size and
    layout (uncompressed, no dictionary), so that stale and fresh byte ranges would both decode."""
    def f(t):
        st = np.stack(t["observation.state"].to_numpy(zero_copy_only=False)).astype(np.float32) + np.float32(delta)
        return set_column(t, "observation.state", list(st))

    rewrite_parquet(root / DATA, f, row_group_size=500, compression="none", use_dictionary=False)
    os.utime(root / DATA, ns=(time.time_ns(), time.time_ns() + 10_000_000))


SQL = "SELECT episode_index FROM episodes WHERE episode_index = {}"


def test_file_changed_between_runs_is_read_anew(damaged, monkeypatch, tmp_path):
    root = damaged()
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    with RangeServer(root.parent) as srv:
        url = f"{srv.url}/{root.name}"
        first = lsql.connect(url).dataset(SQL.format(3), cameras=[])
        old = _state(first[10])
        _bump_state(root, 1000.0)
        again = lsql.connect(url).dataset(SQL.format(3), cameras=[])  # the next run: same cache folder
        local = lsql.connect(root, cache_dir=tmp_path / "local").dataset(SQL.format(3), cameras=[])
        np.testing.assert_array_equal(_state(again[10]), _state(local[10]))
        np.testing.assert_array_equal(_state(again[10]), old + np.float32(1000.0))


def _cause_chain(e: BaseException):
    while e is not None:
        yield e
        e = e.__cause__


def test_file_changed_during_a_run_never_mixes_versions(damaged, monkeypatch, tmp_path):
    """Range GETs carry If-Match with the ETag first seen: after the server's file changes, the next range read gets
    412 and raises FileChangedError (a RemoteIOError) naming the URL; the cache holds only bytes of the first version."""
    from lerobot_sql.remote import FileChangedError

    root = damaged()
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    _bump_state(root, 0.0)  # several row groups, so later episodes are fetched by later range reads
    old_bytes = (root / DATA).read_bytes()
    with RangeServer(root.parent) as srv:
        db = lsql.connect(f"{srv.url}/{root.name}")
        early = db.dataset(SQL.format(1), cameras=[])
        before = _state(early[0])
        _bump_state(root, 1000.0)
        assert (root / DATA).read_bytes() != old_bytes
        with pytest.raises(lsql.LeRobotSQLError) as exc:
            db.dataset(SQL.format(18), cameras=[])[0]
        changed = [e for e in _cause_chain(exc.value) if isinstance(e, FileChangedError)]
        assert changed and isinstance(changed[0], RemoteIOError), exc.value
        assert not isinstance(exc.value, lsql.DatasetFormatError), "a changed file is not a corrupt one"
        assert f"{srv.url}/{root.name}/{DATA}: the file changed on the server" in str(changed[0])
        assert any(p.endswith(DATA) and sent == 0 for p, _a, _b, sent in srv.log)  # the server's 412
        # Every cached piece of the data file (the folder of the identity first seen) holds first-version bytes.
        fdir = db.source.fs._file_dir(db.source.path(DATA))
        pieces = sorted(fdir.glob("*.piece"))
        assert pieces
        for p in pieces:
            a, b = (int(x) for x in p.stem.split("-"))
            assert p.read_bytes() == old_bytes[a:b], p.name
        # What was read before the change is still served, from the first version (the cache).
        np.testing.assert_array_equal(_state(db.dataset(SQL.format(1), cameras=[])[0]), before)
        # A new connection reads the new version throughout.
        fresh = lsql.connect(f"{srv.url}/{root.name}")
        local_new = lsql.connect(root, cache_dir=tmp_path / "local")
        np.testing.assert_array_equal(_state(fresh.dataset(SQL.format(18), cameras=[])[0]),
                                      _state(local_new.dataset(SQL.format(18), cameras=[])[0]))
        np.testing.assert_array_equal(_state(fresh.dataset(SQL.format(1), cameras=[])[0]), before + np.float32(1000.0))
