"""Remote faults over the loopback HTTP server, beyond what tests/test_remote.py covers (5xx, truncated bodies and
slow servers: test_server_faults_retry_then_clear_error; interrupted downloads: test_interrupted_download_resumes;
concurrent readers: test_concurrent_readers_fetch_each_range_once). Added here: connection resets and files that
change on the server. Matrix: docs/reliability.md."""

from __future__ import annotations

import os
import socket
import struct
import time
import warnings

import numpy as np
import pytest
from damage import DATA, rewrite_parquet, set_column

import lerobot_sql as lsql
from http_range_server import RangeServer, _Handler
from lerobot_sql._storage.source import open_source
from lerobot_sql.errors import RemoteIOError

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
    412 and raises FileChangedError (a RemoteIOError) naming the URL; the cache holds only bytes of the first version.

    Small columns are off here: this data file's columns are all under ``SMALL_COLUMN``, so the first read would
    fetch every row group's chunks at once and no later read would reach the server (the run then reads the first
    version throughout, which is also never mixed)."""
    from lerobot_sql._storage import readahead
    from lerobot_sql.errors import FileChangedError

    monkeypatch.setattr(readahead, "SMALL_COLUMN", 0)
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


# ---- servers that lie or stall ------------------------------------------------------------------------------
class _LyingHandler(_Handler):
    """Adds faults: ``drip`` (the body one byte every ``drip_s``), ``long_length`` (Content-Length 1000 bytes more
    than the body, the connection kept open), ``no_range`` (Range ignored: 200 and the whole file), ``no_tags`` (no
    ETag, no Last-Modified), ``mute_s`` (a GET waits this long before its headers)."""

    def _headers(self, p, status, length, extra=None):
        f = self.server.faults
        if f.get("no_range") and status == 206:
            status, length, extra = 200, p.stat().st_size, {}
            self._whole = True
        if f.get("long_length"):
            length += 1000
        if f.get("no_tags"):
            self.send_response(status)
            self.send_header("Content-Length", str(length))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            return
        super()._headers(p, status, length, extra)

    def do_GET(self):
        f = self.server.faults
        self._whole = False
        if f.get("mute_s"):
            time.sleep(f["mute_s"])
        if not (f.get("drip") or f.get("no_range")):
            return super().do_GET()
        p = self._file()
        size = p.stat().st_size
        a, _, b = self.headers["Range"][6:].partition("-")
        start, end = int(a), min(int(b) + 1, size)
        self._headers(p, 206, end - start, {"Content-Range": f"bytes {start}-{end - 1}/{size}"})
        if self._whole:
            start, end = 0, size
        with open(p, "rb") as fh:
            fh.seek(start)
            body = fh.read(end - start)
        try:
            if f.get("drip"):
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(f["drip_s"])
            else:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        with self.server.lock:
            self.server._log.append((str(p.relative_to(self.server.root)), start, end, len(body)))


class LyingServer(RangeServer):
    def __init__(self, root):
        super().__init__(root)
        self.RequestHandlerClass = _LyingHandler


@pytest.fixture
def liar(tmp_path):
    data = np.random.default_rng(2).integers(0, 256, 6 << 20, dtype=np.uint8).tobytes()
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "blob.bin").write_bytes(data)
    with LyingServer(tmp_path / "srv") as srv:
        src = open_source(srv.url, cache_dir=tmp_path / "c")  # the default HTTP options users get
        src.fs.backoff_s = 0.01
        yield srv, src.fs, f"{srv.url}/blob.bin", data


@pytest.mark.timeout(30)
@pytest.mark.parametrize("drip_s", [2.0, 0.02])
def test_a_dripping_server_gives_a_remote_error_not_a_hang(liar, drip_s):
    """One byte every 2 s never trips a socket-read timeout; nor does a steady trickle (50 bytes/s): the body must
    keep a minimum rate after a grace period (stall_s), else RemoteIOError after one retry."""
    srv, fs, url, data = liar
    fs.info(url)
    fs.stall_s = 1.0
    srv.faults.update({"drip": True, "drip_s": drip_s})
    t0 = time.monotonic()
    with pytest.raises(RemoteIOError, match=r"blob\.bin: bytes 1000-5000.*failed after 2 attempt.*(stopped sending|less than)"):
        fs.read_range(url, 1000, 5000)
    assert time.monotonic() - t0 < 8
    assert fs.missing(url, 1000, 5000) == [(1000, 5000)]
    srv.faults.clear()
    assert fs.read_range(url, 1000, 5000) == data[1000:5000]


@pytest.mark.timeout(30)
def test_a_server_that_never_answers_gives_a_remote_error_after_one_retry(liar):
    """No headers within stall_s: Stalled, retried once (not `retries` times at the session's 60 s sock_read)."""
    srv, fs, url, data = liar
    fs.info(url)
    fs.stall_s = 0.5
    srv.faults["mute_s"] = 3.0
    t0 = time.monotonic()
    with pytest.raises(RemoteIOError, match=r"bytes 1000-5000.*failed after 2 attempt.*no answer .* within 0.5 s"):
        fs.read_range(url, 1000, 5000)
    assert time.monotonic() - t0 < 2.5
    srv.faults.clear()
    assert fs.read_range(url, 1000, 5000) == data[1000:5000]


@pytest.mark.timeout(30)
def test_a_content_length_longer_than_the_body_fails_at_once(liar):
    srv, fs, url, data = liar
    fs.info(url)
    srv.faults["long_length"] = True
    t0 = time.monotonic()
    with pytest.raises(RemoteIOError, match=r"bytes 1000-5000.*failed after 1 attempt.*Content-Length 5000"):
        fs.read_range(url, 1000, 5000)
    assert time.monotonic() - t0 < 3  # was 5 tries x 60 s of socket timeout
    srv.faults.clear()
    assert fs.read_range(url, 1000, 5000) == data[1000:5000]


@pytest.mark.timeout(30)
def test_a_server_ignoring_range_is_fetched_whole_once_with_a_warning(liar, tmp_path):
    srv, fs, url, data = liar
    fs.info(url)
    srv.faults["no_range"] = True
    n = len(srv.log)
    with pytest.warns(UserWarning, match=r"blob\.bin: the server ignores Range") as rec:
        assert fs.read_range(url, 1000, 5000) == data[1000:5000]
    assert [w.filename for w in rec] == [__file__]  # the caller's line, not remote.py's
    assert fs.read_range(url, 5_000_000, 5_100_000) == data[5_000_000:5_100_000]  # another region: cached already
    assert fs.read_range(url, 0, len(data)) == data
    assert [e[3] for e in srv.log[n:]] == [len(data)]  # one whole-file GET, never one per try or per read
    assert fs.io_stats()["bytes_fetched"] == len(data)  # counted whole: it crossed the link (was 4000)
    other = tmp_path / "srv" / "blob2.bin"  # a second file of the same server: fetched whole too, not warned again
    other.write_bytes(data[:1 << 20])
    n = len(srv.log)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        fs.ensure_ranges(f"{srv.url}/blob2.bin", [(10, 20), (300_000, 300_010), (900_000, 900_010)])
        assert fs.read_range(f"{srv.url}/blob2.bin", 300_000, 300_010) == data[300_000:300_010]
    assert [str(w.message) for w in again] == []
    # three ranges in one round: one whole-file GET, not three (each would have brought the whole file)
    assert [e[3] for e in srv.log[n:]] == [1 << 20]
    import pickle  # a spawned worker's copy knows it too: a third file whole at once, no warning again

    (tmp_path / "srv" / "blob3.bin").write_bytes(data[:1 << 19])
    child, n = pickle.loads(pickle.dumps(fs)), len(srv.log)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        child.ensure_ranges(f"{srv.url}/blob3.bin", [(10, 20), (300_000, 300_010)])
    assert [str(w.message) for w in again] == [] and [e[3] for e in srv.log[n:]] == [1 << 19]


@pytest.mark.timeout(30)
def test_a_same_size_change_on_a_server_without_etag_is_noticed_on_reconnect(liar, tmp_path):
    """No ETag, no Last-Modified: a CRC of the file's ends joins its identity, so a later session reads the new
    bytes instead of the cached old ones (a change in the middle alone stays unnoticed: docs/reliability.md)."""
    srv, _fs, url, data = liar
    srv.faults["no_tags"] = True
    from lerobot_sql.errors import RemoteWarning

    fs1 = open_source(srv.url, cache_dir=tmp_path / "c2").fs
    with pytest.warns(RemoteWarning, match="no validators"):  # each session says it once
        assert fs1.read_range(url, len(data) - 100, len(data)) == data[-100:]
    new = data[:-100] + bytes(100)  # same size, new tail (a rewritten Parquet footer)
    (tmp_path / "srv" / "blob.bin").write_bytes(new)
    fs2 = open_source(srv.url, cache_dir=tmp_path / "c2").fs
    with pytest.warns(RemoteWarning, match="no validators"):
        assert fs2.read_range(url, len(data) - 100, len(data)) == new[-100:]


@pytest.mark.usefixtures("quick_retries")
@pytest.mark.timeout(60)
def test_storage_answering_503_at_the_first_query_is_a_remote_error(datasets, tmp_path):
    """The first query makes DuckDB's views: a 503 there was reported as "Parquet truncated or corrupt"."""
    with RangeServer(datasets) as srv:
        db = lsql.connect(f"{srv.url}/small20", cache_dir=tmp_path / "c")
        srv.faults["status"] = 10**6
        with pytest.raises(RemoteIOError, match=r"small20/.*\.parquet.*503") as e:
            db.sql('SELECT sum("action"[2]) FROM frames WHERE episode_index = 13').fetchall()
        assert "corrupt" not in str(e.value) and "Traceback" not in str(e.value)
        srv.faults.clear()
        assert db.sql("SELECT count(*) FROM frames").fetchall()[0][0] == 4762
