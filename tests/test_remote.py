"""Remote datasets over loopback servers: an HTTP server with Range support and an S3 server (moto)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import assert_items_equal
from http_range_server import RangeServer
from lerobot_sql._storage import transport
from lerobot_sql._storage.readahead import SMALL_COLUMN
from lerobot_sql._storage.source import open_source
from lerobot_sql.errors import RemoteIOError
from lerobot_sql.prefetch import prefetch

EPISODE_SQL = "SELECT episode_index FROM episodes WHERE episode_index IN (3, 11)"


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    """Each test its own cache root, so byte counts never depend on another test."""
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LSQL_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture(scope="module")
def http(datasets):
    with RangeServer(datasets) as srv:
        yield srv


def _dataset_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _check_query_and_items(db, local_root: Path) -> None:
    # The query answer, computed independently with pyarrow over the local files.
    t = pq.read_table(local_root / "data/chunk-000/file-000.parquet", columns=["episode_index", "index"])
    ep = t["episode_index"].to_numpy()
    got = db.sql("SELECT episode_index, count(*), max(index) FROM frames WHERE episode_index IN (3, 11) "
                 "GROUP BY ALL ORDER BY 1").fetchall()
    assert got == [(e, int((ep == e).sum()), int(t["index"].to_numpy()[ep == e].max())) for e in (3, 11)]
    local = lsql.connect(local_root).dataset(EPISODE_SQL, delta_timestamps={"action": [-1 / 30, 0, 1 / 30]})
    remote = db.dataset(EPISODE_SQL, delta_timestamps={"action": [-1 / 30, 0, 1 / 30]})
    assert len(remote) == len(local) == int(np.isin(ep, [3, 11]).sum())
    for i in (0, 1, 57, len(local) - 1):
        assert_items_equal(remote[i], local[i])


def test_http_query_and_items_without_full_download(http, datasets):
    db = lsql.connect(f"{http.url}/small20")
    _check_query_and_items(db, datasets / "small20")
    stats = db.io_stats()
    total = _dataset_bytes(datasets / "small20")
    assert stats["bytes_fetched"] == http.bytes_sent() - 0  # every byte the server sent was counted
    assert 0 < stats["bytes_fetched"] < 0.35 * total, (stats, total)
    assert stats["bytes_from_cache"] > 0


@pytest.fixture(scope="module")
def s3(datasets):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    client.create_bucket(Bucket="robots")
    root = datasets / "h264_20"
    for p in root.rglob("*"):
        if p.is_file():
            client.upload_file(str(p), "robots", f"h264_20/{p.relative_to(root)}")
    yield opts
    server.stop()


def test_s3_query_and_items_without_full_download(s3, datasets):
    db = lsql.connect("s3://robots/h264_20", storage_options=s3)
    _check_query_and_items(db, datasets / "h264_20")
    stats = db.io_stats()
    assert 0 < stats["bytes_fetched"] < 0.35 * _dataset_bytes(datasets / "h264_20"), stats


def test_cache_reused_across_connections_and_offline(http, datasets, monkeypatch):
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 5"
    first = lsql.connect(f"{http.url}/small20")
    items = [first.dataset(sql)[i] for i in (0, 100)]
    assert first.io_stats()["bytes_fetched"] > 0
    sent = http.bytes_sent()
    second = lsql.connect(f"{http.url}/small20")
    again = [second.dataset(sql)[i] for i in (0, 100)]
    assert second.io_stats()["bytes_fetched"] == 0 and http.bytes_sent() == sent
    for a, b in zip(items, again):
        assert_items_equal(a, b)
    # meta/ was fetched whole: the dataset opens and answers metadata queries without the network.
    monkeypatch.setenv("LSQL_OFFLINE", "1")
    third = lsql.connect(f"{http.url}/small20")
    assert third.sql("SELECT count(*), sum(length) FROM episodes").fetchall() == [(20, 4762)]
    assert_items_equal(third.dataset(sql)[100], items[1])
    assert http.bytes_sent() == sent
    with pytest.raises(RemoteIOError, match="offline"):
        third.dataset("SELECT episode_index FROM episodes WHERE episode_index = 17")[0]


@pytest.fixture
def blob_server(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 9 << 20, dtype=np.uint8).tobytes()
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "blob.bin").write_bytes(data)
    with RangeServer(tmp_path / "srv") as srv:
        yield srv, data


def _blob_fs(srv, tmp_path, timeout_s: float = 0.5, **kw):
    """A remote filesystem on ``srv`` whose requests time out after ``timeout_s`` (short, for the tests of timeouts;
    a test that counts requests passes a long one, so a busy machine's slow answer is not a retried request)."""
    import aiohttp

    src = open_source(f"{srv.url}", {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=timeout_s)}},
                      cache_dir=tmp_path / "c", **kw)
    src.fs.backoff_s = 0.01
    return src.fs, f"{srv.url}/blob.bin"


def _no_partial_files(tmp_path):
    return not [p for p in (tmp_path / "c").rglob("*.tmp")]


@pytest.mark.parametrize("fault", ["status", "truncate", "delay"])
def test_server_faults_retry_then_clear_error(blob_server, tmp_path, fault):
    srv, data = blob_server
    fs, url = _blob_fs(srv, tmp_path)
    srv.faults.update({fault: 2, "delay_s": 1.5})
    assert fs.read_range(url, 1000, 5000) == data[1000:5000]  # two failures, then a good answer
    assert fs.io_stats()["requests"] >= 3
    srv.faults.update({fault: 100})
    with pytest.raises(RemoteIOError, match=r"blob\.bin: bytes 6000000-6100000"):
        fs.read_range(url, 6_000_000, 6_100_000)
    assert fs.missing(url, 6_000_000, 6_100_000) == [(6_000_000, 6_100_000)]
    assert _no_partial_files(tmp_path)
    srv.faults.clear()
    assert fs.read_range(url, 6_000_000, 6_100_000) == data[6_000_000:6_100_000]


def test_interrupted_download_resumes(blob_server, tmp_path, monkeypatch):
    srv, data = blob_server
    fs, url = _blob_fs(srv, tmp_path)
    fs.read_range(url, 0, 100)  # learn the size, then fail the download of the third region
    calls = []
    orig = transport.http_get_async

    async def flaky(fs_, path, a, b, *args, **kw):  # both the first round (on the loop) and the retries (threads)
        calls.append((a, b))
        if a >= 8 << 20:
            raise ConnectionResetError("peer went away")
        return await orig(fs_, path, a, b, *args, **kw)

    monkeypatch.setattr(transport, "http_get_async", flaky)
    with pytest.raises(RemoteIOError, match=r"bytes 8388608-.*ConnectionResetError: peer went away"):
        fs.ensure(url, 100, len(data))
    assert calls.count(calls[-1]) == fs.retries + 1  # the failing region: its first try, then `retries` more
    monkeypatch.setattr(transport, "http_get_async", orig)
    srv.log.clear()
    assert fs.read_range(url, 0, len(data)) == data
    assert [(a, b) for _, a, b, _ in srv.log] == [(8 << 20, len(data))]  # only the missing region again
    assert _no_partial_files(tmp_path)


def test_concurrent_readers_fetch_each_range_once(blob_server, tmp_path):
    srv, data = blob_server
    readers = [_blob_fs(srv, tmp_path)[0] for _ in range(4)]  # separate instances share one cache folder
    url = f"{srv.url}/blob.bin"
    for fs in readers:
        fs.info(url)
    srv.log.clear()
    out = []
    threads = [threading.Thread(target=lambda fs=fs: out.append(fs.read_range(url, 123, 7_000_000))) for fs in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o == data[123:7_000_000] for o in out) and len(out) == 4
    fetched = sorted((a, b) for _, a, b, _ in srv.log)
    assert sum(b - a for a, b in fetched) == 7_000_000 - 123  # no byte twice
    assert sum(fs.io_stats()["bytes_fetched"] for fs in readers) == 7_000_000 - 123


def test_eviction_keeps_cache_under_bound_lru(blob_server, tmp_path):
    srv, data = blob_server
    fs, url = _blob_fs(srv, tmp_path, cache_size=1_000_000)
    spans = [(i * 1_000_000, i * 1_000_000 + 300_000) for i in range(6)]
    for a, b in spans[:3]:
        assert fs.read_range(url, a, b) == data[a:b]
    fs.read_range(url, *spans[0])  # span 0 is now more recent than span 1
    for a, b in spans[3:]:
        assert fs.read_range(url, a, b) == data[a:b]
        assert fs.cached_bytes() <= 1_000_000
    assert fs.missing(url, *spans[1]) == [spans[1]]  # least recently read: evicted
    assert fs.missing(url, *spans[5]) == []          # just read: kept
    assert fs.read_range(url, *spans[1]) == data[slice(*spans[1])]


def test_prefetch_fetches_what_items_need(http, datasets):
    db = lsql.connect(f"{http.url}/multifile60")
    sql = "SELECT episode_index FROM episodes WHERE episode_index % 10 = 3"
    report = prefetch(db, sql, progress=False)
    assert report.files > 0 and report.bytes_needed > 0
    assert report.bytes_fetched <= 1.3 * report.bytes_needed + 2 * (1 << 20)  # + video index (moov) bytes
    before = db.io_stats()
    ds = db.dataset(sql)
    local = lsql.connect(datasets / "multifile60").dataset(sql)
    for i in range(0, len(ds), 97):
        assert_items_equal(ds[i], local[i])
    assert db.io_stats()["bytes_fetched"] == before["bytes_fetched"]  # everything came from the cache
    again = prefetch(db, sql, progress=False)
    assert again.bytes_fetched == 0 and again.bytes_already_cached == again.bytes_needed


def test_http_v21_dataset_query_and_items(http, datasets):
    """A v2.1 dataset over plain HTTP (no listing): the file list comes from meta/episodes.jsonl and the v2 path
    templates, and only the selected episodes' mp4s are read."""
    local_root = datasets / "v21_small20"
    db = lsql.connect(f"{http.url}/v21_small20")
    assert db.layout.legacy
    # The query answer, from pyarrow over the local per-episode files.
    want = []
    for e in (3, 11):
        t = pq.read_table(local_root / f"data/chunk-000/episode_{e:06d}.parquet", columns=["index", "action"])
        want.append((e, t.num_rows, int(t["index"].to_numpy().max()),
                     float(np.stack(t["action"].to_numpy(zero_copy_only=False))[:, 0].astype(np.float64).sum())))
    got = db.sql("SELECT episode_index, count(*), max(index), sum(action[1]::DOUBLE) FROM frames "
                 "WHERE episode_index IN (3, 11) GROUP BY ALL ORDER BY 1").fetchall()
    assert [g[:3] for g in got] == [w[:3] for w in want]
    np.testing.assert_allclose([g[3] for g in got], [w[3] for w in want], rtol=1e-9)
    dt = {"action": [-1 / 30, 0, 1 / 30], "observation.images.front": [-2 / 30, 0]}
    local = lsql.connect(local_root).dataset(EPISODE_SQL, delta_timestamps=dt)
    remote = db.dataset(EPISODE_SQL, delta_timestamps=dt)
    assert len(remote) == len(local) == sum(w[1] for w in want)
    for i in (0, 1, 57, want[0][1], len(local) - 1):  # want[0][1]: the first frame of episode 11
        assert_items_equal(remote[i], local[i])
    mp4s = {p for p, *_ in http.log if p.startswith("v21_small20/videos/")}
    assert mp4s == {f"v21_small20/videos/chunk-000/{k}/episode_{e:06d}.mp4"
                    for k in db.layout.video_keys for e in (3, 11)}


def test_http_range_reads_pinned_to_first_etag(blob_server, tmp_path):
    """Each range GET sends If-Match with the ETag first seen; once the file changes the server answers 412 and the
    read raises RemoteIOError naming the URL and range, without retrying and without caching the new bytes."""
    srv, data = blob_server
    fs, url = _blob_fs(srv, tmp_path)
    assert fs.read_range(url, 0, 1000) == data[:1000]
    new = bytes(255 - x for x in data[:5_000_000]) + data[5_000_000:]
    path = srv.root / "blob.bin"
    st = path.stat()
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new ETag (size-mtime)
    srv.log.clear()
    with pytest.raises(RemoteIOError, match=r"blob\.bin: the file changed on the server during this run.*"
                                            r"bytes 4000000-4100000"):
        fs.read_range(url, 4_000_000, 4_100_000)
    assert [(a, b, sent) for _, a, b, sent in srv.log] == [(0, 0, 0)]  # one 412, no retry, no body
    assert fs.missing(url, 4_000_000, 4_100_000) == [(4_000_000, 4_100_000)]
    assert fs.read_range(url, 0, 1000) == data[:1000]  # what was cached stays the first version
    fresh, _ = _blob_fs(srv, tmp_path)  # a new session sees the new ETag: a new cache key, the new bytes
    assert fresh.read_range(url, 4_000_000, 4_100_000) == new[4_000_000:4_100_000]


def test_ranges_of_several_files_are_fetched_in_one_round_on_the_loop(blob_server, tmp_path, monkeypatch):
    """A pipelined batch's missing ranges (several gaps of a row-group file and its mp4s) go out as one round of
    requests on fsspec's IO loop, not a thread and a loop hop each: one GET per gap, the right bytes in each piece,
    each request counted once, and no thread fetch at all while nothing fails."""
    srv, data = blob_server
    other = bytes(reversed(data[:3 << 20]))
    (srv.root / "other.bin").write_bytes(other)
    fs, url = _blob_fs(srv, tmp_path)
    url2 = f"{srv.url}/other.bin"
    fs.info(url), fs.info(url2)
    srv.log.clear()
    before = fs.io_stats()

    def no_threads(fn, spans):
        raise AssertionError(f"fetched in threads: {spans}")

    monkeypatch.setattr(transport, "fetch_each", no_threads)
    want = [(url, [(0, 1000), (5_000_000, 5_001_000)]), (url2, [(10, 2000), (3_000_000, 3_100_000)])]
    assert fs.ensure_many(want) == 1000 + 1000 + 1990 + 100_000
    assert sorted((p, a, b) for p, a, b, _ in srv.log) == [
        ("blob.bin", 0, 1000), ("blob.bin", 5_000_000, 5_001_000), ("other.bin", 10, 2000),
        ("other.bin", 3_000_000, 3_100_000)]
    after = fs.io_stats()
    assert (after["requests"] - before["requests"], after["bytes_fetched"] - before["bytes_fetched"]) == (4, 103_990)
    assert fs.read_range(url, 5_000_000, 5_001_000) == data[5_000_000:5_001_000]
    assert fs.read_range(url2, 3_000_000, 3_100_000) == other[3_000_000:3_100_000]
    assert fs.ensure_many(want) == 0 and len(srv.log) == 4  # all cached now: nothing asked


def test_a_file_changed_under_a_round_of_requests_raises_file_changed_without_retries(blob_server, tmp_path):
    """The 412 of a request made in a round on the loop is the same FileChangedError as a single read's, raised
    without a retry; the other file's bytes of the round are kept, the changed file's new bytes are not."""
    from lerobot_sql.errors import FileChangedError

    srv, data = blob_server
    (srv.root / "other.bin").write_bytes(data[:1 << 20])
    fs, url = _blob_fs(srv, tmp_path)
    url2 = f"{srv.url}/other.bin"
    fs.info(url), fs.info(url2)
    path = srv.root / "blob.bin"
    st = path.stat()
    path.write_bytes(bytes(255 - x for x in data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new ETag (size-mtime)
    srv.log.clear()
    with pytest.raises(FileChangedError, match=r"blob\.bin: the file changed on the server during this run.*"
                                               r"bytes 4000000-4100000"):
        fs.ensure_many([(url, [(4_000_000, 4_100_000)]), (url2, [(0, 5000)])])
    assert sorted((p, a, b, sent) for p, a, b, sent in srv.log) == [("blob.bin", 0, 0, 0), ("other.bin", 0, 5000, 5000)]
    assert fs.missing(url, 4_000_000, 4_100_000) == [(4_000_000, 4_100_000)]
    assert fs.missing(url2, 0, 5000) == []


def test_s3_range_reads_pinned_to_first_etag(s3, tmp_path):
    import boto3

    ep = s3["client_kwargs"]["endpoint_url"]
    client = boto3.client("s3", endpoint_url=ep, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    old, new = os.urandom(300_000), os.urandom(300_000)
    client.put_object(Bucket="robots", Key="pin/blob.bin", Body=old)
    src = open_source("s3://robots/pin", s3, cache_dir=tmp_path / "c")
    fs, path = src.fs, src.path("blob.bin")
    fs.backoff_s = 0.01
    assert fs.read_range(path, 0, 1000) == old[:1000]
    client.put_object(Bucket="robots", Key="pin/blob.bin", Body=new)
    with pytest.raises(RemoteIOError, match=r"s3://robots/pin/blob\.bin: the file changed on the server"):
        fs.read_range(path, 100_000, 200_000)
    assert fs.missing(path, 100_000, 200_000) == [(100_000, 200_000)]


def test_one_handle_read_from_threads_seek_then_read(blob_server, tmp_path):
    """DuckDB reads one handle from several threads, each as seek() then read() in two calls: every thread gets the
    bytes at the place it sought to, even when another thread seeks in between (the position is per thread)."""
    srv, data = blob_server
    fs, url = _blob_fs(srv, tmp_path)
    f = fs.open(url)
    sought, moved = threading.Event(), threading.Event()
    got = {}

    def a():
        f.seek(1_000_000)
        sought.set()
        moved.wait(10)
        got["a"] = f.read(5000)

    def b():
        sought.wait(10)
        f.seek(7_000_000)  # between a's seek and a's read
        moved.set()
        got["b"] = f.read(5000)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["a"] == data[1_000_000:1_005_000] and got["b"] == data[7_000_000:7_005_000]
    f.seek(100)
    seen = []
    t = threading.Thread(target=lambda: seen.append(f.tell()))  # a new thread starts where the last user left
    t.start()
    t.join()
    assert seen == [100]


def _chunk(md, rg: int, col: int) -> tuple[int, int]:
    c = md.row_group(rg).column(col)
    a = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
    return a, a + c.total_compressed_size


def test_parquet_column_scan_fetches_ahead_only_when_scanning(http, datasets):
    """Reading one column chunk per row group in order (DuckDB's scan) fetches the same column of the next row
    groups ahead, in parallel; reads that skip row groups (pruned by statistics) fetch nothing extra of a column
    larger than SMALL_COLUMN (observation.state here)."""
    rel = "data/chunk-000/file-000.parquet"
    md = pq.read_metadata(datasets / "multifile60" / rel)
    src = open_source(f"{http.url}/multifile60")
    fs, path = src.fs, src.path(rel)
    with src.open(rel) as f:
        _ = pq.ParquetFile(f).metadata  # the footer is cached first, as DuckDB and pyarrow read it
    col = next(j for j in range(md.num_columns) if md.schema.column(j).path.startswith("observation.state"))
    assert sum(_chunk(md, rg, col)[1] - _chunk(md, rg, col)[0] for rg in range(md.num_row_groups)) > SMALL_COLUMN
    for rg in (0, 5, 10):  # skipping: no readahead
        fs.read_range(path, *_chunk(md, rg, col))
    assert fs.missing(path, *_chunk(md, 11, col)) and fs.missing(path, *_chunk(md, 1, col))
    for rg in (20, 21):  # a scan: the next 2 row groups' chunks of this column arrive with the second read
        fs.read_range(path, *_chunk(md, rg, col))
    assert not fs.missing(path, *_chunk(md, 22, col)) and not fs.missing(path, *_chunk(md, 23, col))
    assert fs.missing(path, *_chunk(md, 24, col))
    assert fs.missing(path, *_chunk(md, 22, col + 1))
    fs.read_range(path, *_chunk(md, 24, col))  # the scan goes on: 4 more
    assert not fs.missing(path, *_chunk(md, 28, col)) and fs.missing(path, *_chunk(md, 29, col))
    local = (datasets / "multifile60" / rel).read_bytes()
    for rg in range(20, 29):
        assert fs.read_range(path, *_chunk(md, rg, col)) == local[slice(*_chunk(md, rg, col))]


def test_small_columns_are_fetched_whole_at_their_first_read(http, datasets):
    """The first read of a small column chunk (episode_index: ~100 bytes per row group) fetches every small column
    of every row group of the file at once (adjacent chunks as one range, requests in parallel), and nothing of the
    large columns; later small reads, whatever their row group, are served from the cache."""
    rel = "data/chunk-000/file-000.parquet"
    md = pq.read_metadata(datasets / "multifile60" / rel)
    src = open_source(f"{http.url}/multifile60")
    fs, path = src.fs, src.path(rel)
    with src.open(rel) as f:
        _ = pq.ParquetFile(f).metadata
    ncol, nrg = md.num_columns, md.num_row_groups
    size = [sum(_chunk(md, rg, j)[1] - _chunk(md, rg, j)[0] for rg in range(nrg)) for j in range(ncol)]
    small = [j for j in range(ncol) if size[j] <= SMALL_COLUMN]
    large = [j for j in range(ncol) if size[j] > SMALL_COLUMN]
    names = [md.schema.column(j).path for j in small]
    assert {"index", "frame_index", "episode_index", "timestamp"} <= set(names) and large
    col = md.schema.names.index("episode_index")
    before = {(rg, j): fs.missing(path, *_chunk(md, rg, j)) for rg in range(nrg) for j in large}
    small_gaps = sum(b - a for rg in range(nrg) for j in small for a, b in fs.missing(path, *_chunk(md, rg, j)))
    assert sum(len(v) for v in before.values()) >= nrg  # (the footer's read brought the file's last few KB)
    n = len(http.log)
    fs.read_range(path, *_chunk(md, 5, col))
    for rg in range(nrg):
        for j in small:
            assert not fs.missing(path, *_chunk(md, rg, j)), (rg, names[small.index(j)])
        for j in large:
            assert fs.missing(path, *_chunk(md, rg, j)) == before[rg, j]
    got = http.log[n:]
    assert len(got) <= nrg  # the small columns of a row group lie side by side here: one range each
    assert sum(e[3] for e in got) == small_gaps > 0.9 * sum(size[j] for j in small)
    n = len(http.log)
    local = (datasets / "multifile60" / rel).read_bytes()
    for rg in (0, 30, nrg - 1):
        for j in small:
            assert fs.read_range(path, *_chunk(md, rg, j)) == local[slice(*_chunk(md, rg, j))]
    assert len(http.log) == n


def test_remote_dataset_open_reads_small_columns_in_one_parallel_round(http, datasets):
    """Opening a dataset over HTTP (query, manifest joins, episode checks: several scans of index, frame_index,
    timestamp, episode_index) costs a few requests per data file plus one per row group, all of them for the small
    columns in one parallel round: not one sequential request per row group and column (182 requests on
    multifile60's 58 row groups before)."""
    root = datasets / "multifile60"
    files = sorted((root / "data").rglob("*.parquet"))
    nrg = sum(pq.read_metadata(p).num_row_groups for p in files)
    db = lsql.connect(f"{http.url}/multifile60")
    n = len(http.log)
    ds = db.dataset("SELECT index FROM frames ORDER BY index")
    got = [e for e in http.log[n:] if e[0].startswith("multifile60/data/")]
    assert len(ds) == sum(pq.read_metadata(p).num_rows for p in files)
    assert len(got) <= nrg + 4 * len(files), got
    # nothing of the large columns (state, action over SMALL_COLUMN) was fetched to open it, but in the last 64 KiB
    # (pyarrow reads a footer so)
    checked = 0
    for p in files:
        md = pq.read_metadata(p)
        rel, tail = f"multifile60/{p.relative_to(root)}", p.stat().st_size - (64 << 10)
        for j in range(md.num_columns):
            chunks = [_chunk(md, rg, j) for rg in range(md.num_row_groups)]
            if sum(b - a for a, b in chunks) <= SMALL_COLUMN:
                continue
            for a, b in chunks:
                if b <= tail:
                    checked += 1
                    assert not any(e[0] == rel and e[1] < b and a < e[2] for e in got), (rel, a, b)
    assert checked > 50


def test_prefetch_warms_row_groups_before_the_manifest_query(http, datasets):
    """prefetch fetches the selected episodes' row groups in parallel first, so the manifest query (DuckDB, one
    request per row group otherwise) reads only the cache."""
    from lerobot_sql.prefetch import warm_episode_row_groups

    root = datasets / "multifile60"
    db = lsql.connect(f"{http.url}/multifile60")
    sql = "SELECT episode_index FROM episodes WHERE episode_index % 10 = 3"
    assert warm_episode_row_groups(db, sql) > 0
    fs = db.source.fs
    n_files = 0
    for p in sorted((root / "data").rglob("*.parquet")):
        pf = pq.ParquetFile(p)
        for rg in range(pf.metadata.num_row_groups):  # independently: which row groups hold selected episodes
            eps = pf.read_row_group(rg, columns=["episode_index"])["episode_index"].to_numpy()
            c = pf.metadata.row_group(rg).column(0)
            a = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
            if (eps % 10 == 3).any():
                n_files += 1
                assert fs.missing(db.source.path(str(p.relative_to(root))), a, a + c.total_compressed_size) == []
    assert n_files > 0
    # What the manifest query still fetches: only episode_index chunks of other episodes (the video-clip check
    # counts the frames of every episode sharing an mp4 with a selected one), never the selected row groups.
    ep_chunks = set()
    for p in sorted((root / "data").rglob("*.parquet")):
        md = pq.read_metadata(p)
        col = md.schema.names.index("episode_index")
        ep_chunks.update((f"multifile60/{p.relative_to(root)}", _chunk(md, rg, col)[0]) for rg in range(md.num_row_groups))
    n = len(http.log)
    db.manifest(sql)
    assert {(path, a) for path, a, _b, _ in http.log[n:]} <= ep_chunks
    assert warm_episode_row_groups(db, "SELECT index FROM frames WHERE index < 5") == 0  # not an episode query


@pytest.mark.usefixtures("quick_retries")
def test_server_gone_falls_back_to_the_cache_and_5xx_is_not_missing_file(datasets, tmp_path):
    """A network failure is never reported as a missing file: an unreachable server or 503s raise RemoteIOError,
    and a dataset whose metadata was cached opens offline by itself."""
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 5"
    with RangeServer(datasets) as srv:
        url = f"{srv.url}/small20"
        want = lsql.connect(url).dataset(sql)[10]
        srv.faults["status"] = 10**6
        fresh = tmp_path / "fresh"
        with pytest.raises(RemoteIOError, match=r"info\.json.*503"):
            lsql.connect(url, cache_dir=fresh)
    # the server is down now: the cached dataset still opens and gives the cached items
    db = lsql.connect(url)
    assert_items_equal(db.dataset(sql)[10], want)
    with pytest.raises(RemoteIOError):
        db.dataset("SELECT episode_index FROM episodes WHERE episode_index = 17")[0]


@pytest.mark.usefixtures("quick_retries")
def test_a_failed_remote_read_does_not_spoil_the_next_items(datasets, tmp_path):
    local = lsql.connect(datasets / "small20").dataset(episodes=[1, 8, 13])
    with RangeServer(datasets) as srv:
        ds = lsql.connect(f"{srv.url}/small20").dataset(episodes=[1, 8, 13])
        assert_items_equal(ds[0], local[0])
        srv.faults["status"] = 10**6
        with pytest.raises(RemoteIOError):
            ds[111]  # fails inside PyAV's read of the open container
        with pytest.raises(RemoteIOError):  # was VideoDecodeError "Error in PyAV callback ... may be corrupt"
            ds[148]
        srv.faults.clear()
        for i in (148, 111):
            assert_items_equal(ds[i], local[i])


@pytest.mark.usefixtures("quick_retries")
def test_storage_failure_under_sql_is_a_remote_error_not_a_query_error(datasets):
    with RangeServer(datasets) as srv:
        db = lsql.connect(f"{srv.url}/small20")
        sql = 'SELECT sum("action"[2]) FROM frames WHERE episode_index = 13'
        db.sql("SELECT count(*) FROM episodes").fetchall()  # views made, metadata cached
        srv.faults["status"] = 10**6
        with pytest.raises(RemoteIOError, match=r"file-000\.parquet: bytes .*503.*while running: SELECT") as e:
            db.sql(sql).fetchall()
        assert "Traceback" not in str(e.value)
        srv.faults.clear()
        want = pq.read_table(datasets / "small20/data/chunk-000/file-000.parquet", columns=["episode_index", "action"])
        sel = want.filter(pc.equal(want["episode_index"], 13))["action"].to_pylist()
        assert db.sql(sql).fetchall()[0][0] == pytest.approx(  # DuckDB lists are 1-based
            sum(float(a[1]) for a in sel), rel=1e-9)


def test_forked_worker_reads_after_the_parent_read_over_the_network(http, datasets):
    """A DataLoader worker forked after the parent fetched over HTTP reads on its own (fsspec < 2024.3 left the
    parent's IO loop in the child, whose thread is gone: the worker's first read waited forever). ``timeout``
    turns a hang into a failure here instead of the suite's 300 s limit."""
    from torch.utils.data import DataLoader

    db = lsql.connect(f"{http.url}/small20")
    ds = db.dataset(EPISODE_SQL)
    parent = ds[0]  # the parent reads over the network first: fsspec's IO loop runs in this process
    idx = [0, 5, len(ds) - 1]
    got = list(DataLoader(ds, batch_size=None, sampler=idx, num_workers=1, multiprocessing_context="fork",
                          timeout=60))
    local = lsql.connect(datasets / "small20").dataset(EPISODE_SQL)
    assert_items_equal(parent, local[0])
    for i, item in zip(idx, got):
        assert_items_equal(item, local[i])


def test_a_worker_waiting_on_another_ones_cache_build_sleeps(tmp_path):
    """DataLoader workers wait on each other's cache builds (row groups, video indexes) and piece fetches: the
    waiter blocks in the kernel on the same flock a filelock.FileLock holder takes (so the two interoperate), and
    uses the other one's entry. It polled every 2 ms before, ~50 ms of CPU per 0.6 s wait."""
    import subprocess
    import sys
    import time

    from lerobot_sql._storage.cache import build_once

    entry = tmp_path / "entry.bin"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, filelock, pathlib\n"
        "with filelock.FileLock(sys.argv[1] + '.lock'):\n"
        "    print('held', flush=True); time.sleep(0.6)\n"
        "    pathlib.Path(sys.argv[1]).write_bytes(b'theirs')\n"), str(entry)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        built: list[str] = []
        c0, t0 = time.thread_time(), time.perf_counter()
        build_once(entry, lambda tmp: built.append(tmp) or Path(tmp).write_bytes(b"ours"))
        cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
    finally:
        holder.wait(10)
    assert built == [] and entry.read_bytes() == b"theirs"  # waited for the other build, did not build again
    assert wall > 0.3 and cpu < 0.01, (wall, cpu)


def test_asking_about_unfetched_ranges_does_not_relist_the_piece_folder(tmp_path, monkeypatch):
    """A pipeline asks ``missing`` about every range of its next batches, most not fetched yet: the folder is
    listed again only when it changed (one stat), and what another process fetched meanwhile is still used."""
    import time

    from lerobot_sql._storage import pieces as P

    data = bytes(range(256)) * 64  # 16 KiB
    got = lambda gs: [(data[x:y], None) for x, y in gs]  # noqa: E731
    mine, other = P.PieceStore(tmp_path / "c", 1 << 30), P.PieceStore(tmp_path / "c", 1 << 30)  # two processes
    fdir = mine.folder("videos/a.mp4", "16384-etag")
    mine.fill(fdir, [(0, 4096)], got)
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(P.os, "listdir", lambda d: listed.append(d) or real(d))
    for _ in range(50):
        assert mine.missing(fdir, 0, 8192) == [(4096, 8192)]
    assert listed == [], len(listed)  # 50 listings before; 1 while this process's own write changed the mtime
    # the other process fetches bytes this one asked about: fill lists the folder under the region lock and
    # fetches nothing that is there, whatever missing() said
    assert other.fill(fdir, [(4096, 8192)], got) == 4096
    fetched: list = []
    assert mine.fill(fdir, [(4096, 8192)], lambda gs: fetched.extend(gs) or got(gs)) == 0 and fetched == []
    time.sleep(0.05)  # a later mtime tick of the folder
    assert other.fill(fdir, [(8192, 12288)], got) == 4096
    assert mine.missing(fdir, 0, 12288) == []  # the folder changed: listed again
    assert mine.assemble(fdir, "videos/a.mp4", 100, 12000) == data[100:12000]


def test_gaps_between_small_cached_pieces_are_fetched_in_one_request(tmp_path):
    """DuckDB's reads leave small pieces scattered over a data file (a column chunk per row group); the bytes a
    batch then needs around them were one request per gap (54 of ~105 requests of a 4,096-item multifile60 pass).
    Gaps closer than MERGE_GAP in one region are one request now, re-fetching the cached bytes between; the bytes
    read back are the file's; a region boundary still splits."""
    from lerobot_sql._storage import pieces as P

    data = np.random.default_rng(1).integers(0, 256, 2 * P.REGION, dtype=np.uint8).tobytes()
    asked: list = []

    def got(gs):
        asked.append(list(gs))
        return [(data[x:y], None) for x, y in gs]

    store = P.PieceStore(tmp_path / "c", 1 << 30)
    fdir = store.folder("data/a.parquet", f"{len(data)}-etag")
    store.fill(fdir, [(4096, 6144), (12288, 14336), (60_000, 80_000)], got)  # the last is wider than MERGE_GAP
    asked.clear()
    assert store.fill(fdir, [(0, 100_000)], got) == 80_000  # (0, 60000) bridged over two pieces, then the rest
    assert asked == [[(0, 60_000), (80_000, 100_000)]]
    assert store.assemble(fdir, "data/a.parquet", 0, 100_000) == data[:100_000]
    edge = P.REGION
    store.fill(fdir, [(edge - 100, edge + 100)], got)
    asked.clear()
    store.fill(fdir, [(edge - 5000, edge + 5000)], got)
    assert asked == [[(edge - 5000, edge - 100), (edge + 100, edge + 5000)]]  # not across the region boundary
    assert store.assemble(fdir, "data/a.parquet", edge - 5000, edge + 5000) == data[edge - 5000:edge + 5000]
    asked.clear()  # bytes nobody asked for (two small columns' chunks with a large one between) stay unfetched
    store.fill(fdir, [(200_000, 201_000), (205_000, 206_000)], got)
    assert asked == [[(200_000, 201_000), (205_000, 206_000)]]


def test_own_piece_writes_keep_the_listing_current_and_a_listing_tracks_other_processes(tmp_path, monkeypatch):
    """A folder holds one piece per GOP run fetched (hundreds after a long epoch): this process's own writes do not
    make the next ``missing`` or ``fill`` list the folder again (each fill did before: a listing per request, ~0.2 ms at
    400 pieces), and a listing that does happen, after another process wrote or evicted pieces, gives exactly the
    pieces on disk (it parses only the names it has not seen); ``fill`` then fetches nothing another process has."""
    import time

    from lerobot_sql._storage import pieces as P

    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    got = lambda gs: [(data[x:y], None) for x, y in gs]  # noqa: E731
    mine, other = P.PieceStore(tmp_path / "c", 1 << 30), P.PieceStore(tmp_path / "c", 1 << 30)  # two processes
    fdir = mine.folder("videos/a.mp4", "1048576-etag")
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(P.os, "listdir", lambda d: listed.append(d) or real(d))
    relisted = 0
    for i in range(40):
        a = i * 16384
        n = len(listed)
        assert mine.fill(fdir, [(a, a + 4096)], got) == 4096
        assert mine.missing(fdir, a, a + 8192) == [(a + 4096, a + 8192)]
        relisted += (len(listed) - n) if i else 0  # the first fill lists the new folder
    assert relisted == 0, relisted  # 39 before: one listing per fill
    # another process writes three pieces and evicts two of this one's
    time.sleep(0.05)  # a later mtime tick of the folder
    for a in (4096, 20480, 36864):
        assert other.fill(fdir, [(a, a + 4096)], got) == 4096
    for a in (0, 16384):
        os.unlink(os.path.join(str(fdir), f"{a:012d}-{a + 4096:012d}.piece"))
    on_disk = sorted(tuple(int(x) for x in n[:-6].split("-")) for n in real(str(fdir)) if n.endswith(".piece"))
    assert len(on_disk) == 41
    # the folder changed: a fill lists it again and fetches only what no process has (a second read would raise)
    once = iter([[(data[0:4096], None)]])
    assert mine.fill(fdir, [(0, 8192), (20480, 24576)], lambda gs: next(once) if gs == [(0, 4096)] else 1 / 0) == 4096
    assert mine.missing(fdir, 0, 8192) == []
    on_disk.insert(0, (0, 4096))
    assert mine.scan(fdir) == on_disk
    assert mine.assemble(fdir, "videos/a.mp4", 32768, 32768 + 8192) == data[32768:32768 + 8192]


def test_describe_many_pins_files_in_one_round_and_leaves_failures_to_the_first_read(blob_server, tmp_path):
    """``describe_many`` (what ``ds.pipeline`` calls for the query's mp4s): the files not known yet, one HEAD each,
    all at once; the pins are the ones the later reads use (a change after it is a 412, not the new bytes); a missing
    file is not an error there but at its first read, named; offline nothing is asked."""
    srv, data = blob_server
    for i in range(5):
        (srv.root / f"b{i}.bin").write_bytes(data[i::7][:100_000])
    fs, url = _blob_fs(srv, tmp_path, timeout_s=60)
    urls = [f"{srv.url}/b{i}.bin" for i in range(5)] + [url, f"{srv.url}/gone.bin"]
    assert fs.describe_many(urls) == 6
    assert sorted(srv.heads) == sorted([f"b{i}.bin" for i in range(5)] + ["blob.bin"])  # (a 404 is not logged)
    assert fs.describe_many(urls[:6]) == 0 and len(srv.heads) == 6  # known: nothing asked again
    assert fs.info(urls[2])["size"] == 100_000 and len(srv.heads) == 6
    path = srv.root / "b2.bin"
    st = path.stat()
    path.write_bytes(bytes(255 - x for x in data[2::7][:100_000]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new ETag after the pin
    with pytest.raises(RemoteIOError, match=r"b2\.bin: the file changed on the server during this run"):
        fs.read_range(urls[2], 0, 1000)
    with pytest.raises(FileNotFoundError):
        fs.read_range(urls[6], 0, 10)
    off, _ = _blob_fs(srv, tmp_path / "off")
    off.offline = True  # as LSQL_OFFLINE / HF_HUB_OFFLINE, or after the network went away mid-session
    n = len(srv.heads)
    assert off.describe_many(urls) == 0 and len(srv.heads) == n


@pytest.mark.parametrize("kind", ["cannot be made", "a file"])
def test_an_unwritable_cache_folder_is_a_cache_error_not_a_missing_dataset(http, tmp_path, kind):
    """A remote dataset whose cache folder cannot be created (under /proc) or is a regular file raised
    MissingFileError ("meta/info.json: not found. Is ... the root of a LeRobot dataset?") or a bare
    NotADirectoryError, sending the user after the URL; it is a CacheError naming the cache folder, as locally."""
    from lerobot_sql.errors import CacheError, MissingFileError
    if kind == "a file":
        cache = tmp_path / "afile"
        cache.write_text("x")
    else:
        cache = Path("/proc/lsql-no-such-folder")
    with pytest.raises(CacheError, match="cannot write the remote dataset's cache") as e:
        lsql.connect(f"{http.url}/small20", cache_dir=cache).dataset()
    assert not isinstance(e.value, MissingFileError) and str(cache) in str(e.value)


# ---- servers whose validators cannot be trusted, and 206 answers that do not say which bytes they are (issue 36) ----
def test_etags_rotating_for_unchanged_bytes_are_not_a_change(datasets, tmp_path):
    """A server farm whose nodes tag the same bytes differently (here: a new ETag on every answer, so no If-Match
    ever matches) made every remote dataset fail at connect with "the file changed on the server". A 412 is now
    checked before it is believed: same size, same Last-Modified and the bytes this session holds equal to the
    server's: the ETags are unstable, said once (RemoteWarning), reads are pinned by Last-Modified instead, and a
    later session keys the cache without the ETag (nothing fetched again)."""
    import warnings

    from lerobot_sql.errors import RemoteWarning

    local = lsql.connect(datasets / "small20").dataset(EPISODE_SQL)
    with RangeServer(datasets) as srv:
        srv.faults["rotating_etag"] = True
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            db = lsql.connect(f"{srv.url}/small20")
            ds = db.dataset(EPISODE_SQL)
            for i in (0, 57, len(ds) - 1):
                assert_items_equal(ds[i], local[i])
        unstable = [w for w in said if issubclass(w.category, RemoteWarning)]
        assert len(unstable) == 1 and "ETag" in str(unstable[0].message), [str(w.message) for w in said]
        assert "small20" in str(unstable[0].message)
        assert srv.tags_given > 10  # the fault was live: every answer had its own ETag
        first = srv.bytes_sent()
        # The next sessions key the cache without ETags (the store remembers): the second fetches again only the
        # few files the first one cached under an ETag before it found them unstable; the third, nothing.
        again = lsql.connect(f"{srv.url}/small20").dataset(EPISODE_SQL)
        assert_items_equal(again[57], local[57])
        second = srv.bytes_sent() - first
        assert second < first / 10, (first, second)
        third = lsql.connect(f"{srv.url}/small20").dataset(EPISODE_SQL)
        assert_items_equal(third[len(ds) - 1], local[len(ds) - 1])
        assert srv.bytes_sent() == first + second


def test_a_real_change_under_rotating_etags_is_still_a_file_change(blob_server, tmp_path):
    """The same server (a new ETag per answer), but the bytes did change: a same-size rewrite with the same mtime
    (Last-Modified unchanged) is caught by comparing the bytes this session holds with the server's; a rewrite with a
    new mtime by the Last-Modified pin. Both FileChangedError; the new bytes are never cached."""
    from lerobot_sql.errors import FileChangedError

    srv, data = blob_server
    fs, url = _blob_fs(srv, tmp_path, timeout_s=60)
    assert fs.read_range(url, 0, 1000) == data[:1000]  # the ETag is stable still: pinned by it
    path = srv.root / "blob.bin"
    st = path.stat()
    new = bytes(255 - x for x in data[:1000]) + data[1000:]
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same Last-Modified: only the bytes tell
    srv.faults["rotating_etag"] = True
    with pytest.raises(FileChangedError, match=r"blob\.bin: the file changed on the server"):
        fs.read_range(url, 4_000_000, 4_100_000)
    assert fs.missing(url, 4_000_000, 4_100_000) == [(4_000_000, 4_100_000)]
    assert fs.read_range(url, 0, 1000) == data[:1000]  # the cached first version
    # A session that found the ETags unstable pins by Last-Modified: a rewrite with a new mtime is a change.
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    fs2, _ = _blob_fs(srv, tmp_path / "two", timeout_s=60)
    with pytest.warns(UserWarning, match="ETag"):
        assert fs2.read_range(url, 0, 1000) == data[:1000]
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    with pytest.raises(FileChangedError, match=r"blob\.bin: the file changed on the server"):
        fs2.read_range(url, 4_000_000, 4_100_000)


def test_a_server_without_validators_is_said_once_at_connect(datasets):
    """No ETag, no Last-Modified: a same-size change in the middle of a cached file cannot be noticed (only the ends
    are checked, by CRC). Said once at connect (RemoteWarning naming the dataset), not once per file."""
    import warnings

    from lerobot_sql.errors import RemoteWarning

    with RangeServer(datasets) as srv:
        srv.faults["no_validators"] = True
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            db = lsql.connect(f"{srv.url}/small20")
            assert [w for w in said if issubclass(w.category, RemoteWarning)], [str(w.message) for w in said]
            db.dataset(EPISODE_SQL)[0]
        mine = [str(w.message) for w in said if issubclass(w.category, RemoteWarning)]
        assert len(mine) == 1 and "small20" in mine[0] and "no strong ETag" in mine[0] and "revalidated" in mine[0]


@pytest.mark.parametrize("fault", [{"no_content_range": True, "range_shift": 1}, {"no_content_range": True},
                                   {"range_shift": 1}])
def test_a_206_without_or_with_another_content_range_blames_the_server_not_the_file(blob_server, tmp_path, fault):
    """A 206 must say which bytes it holds (RFC 9110 14.4: Content-Range). Without it a body shifted by a byte
    was cached as the range asked for (wrong bytes silently; a Parquet page then "corrupt, re-download it"). Now a
    RemoteIOError naming the URL, the range and the server or proxy, with a way out that exists, nothing cached;
    a Content-Range for other bytes is refused the same way."""
    srv, data = blob_server
    fs, url = _blob_fs(srv, tmp_path, timeout_s=60)
    fs.info(url)
    srv.faults.update(fault)
    with pytest.raises(RemoteIOError, match=r"blob\.bin.*bytes 1000-5000") as e:
        fs.read_range(url, 1000, 5000)
    msg = str(e.value)
    assert "proxy" in msg and "not the file" in msg and "Re-download it" not in msg and "corrupt" not in msg, msg
    assert ("without Content-Range" in msg) == ("no_content_range" in fault), msg
    assert fs.missing(url, 1000, 5000) == [(1000, 5000)]
    srv.faults.clear()
    assert fs.read_range(url, 1000, 5000) == data[1000:5000]


@pytest.mark.usefixtures("quick_retries")
def test_a_206_without_content_range_under_sql_and_items_is_a_remote_error_and_caches_nothing(datasets):
    """The same server under a query and an item: it was "TProtocolException: Invalid data" (a QueryError) and
    "cannot be read as Parquet ... the file is truncated or corrupt. Re-download it", and the shifted bytes stayed
    in the cache, so the query kept failing after the server was fixed. Now RemoteIOError, and once the server
    answers properly the same session reads the right values."""
    sql = 'SELECT sum("action"[2]) FROM frames WHERE episode_index = 13'
    with RangeServer(datasets) as srv:
        db = lsql.connect(f"{srv.url}/small20")
        for p in (datasets / "small20/meta").rglob("*"):  # every meta/ file cached (whole): no data byte yet
            if p.is_file():
                db.source.fs.read_range(db.source.path(str(p.relative_to(datasets / "small20"))), 0, 1)
        srv.faults.update({"no_content_range": True, "range_shift": 1})
        with pytest.raises(RemoteIOError, match=r"small20/.*: bytes .*206 without Content-Range") as e:
            db.sql(sql).fetchall()
        assert "corrupt" not in str(e.value)
        with pytest.raises(RemoteIOError, match=r"small20/.*: bytes .*206 without Content-Range"):
            db.dataset(episodes=[4])[3]  # its mp4's bytes at least were never fetched
        srv.faults.clear()
        want = pq.read_table(datasets / "small20/data/chunk-000/file-000.parquet", columns=["episode_index", "action"])
        sel = want.filter(pc.equal(want["episode_index"], 13))["action"].to_pylist()
        assert db.sql(sql).fetchall()[0][0] == pytest.approx(sum(float(a[1]) for a in sel), rel=1e-9)
        assert_items_equal(db.dataset(episodes=[4])[3], lsql.connect(datasets / "small20").dataset(episodes=[4])[3])


@pytest.mark.parametrize("rotating", [False, True, "etag on HEAD only", "weak etags, no Last-Modified on GET",
                                      "HEAD Last-Modified only, GET ETag only", "HEAD ETag only, GET Last-Modified only",
                                      "rotating, on GET only"])
def test_a_server_ignoring_if_match_gives_no_bytes_of_another_version(blob_server, tmp_path, rotating):
    """A server that sends ETags but evaluates no condition (Python's http.server, some static hosts) answered a
    read pinned by If-Match with the bytes of a file changed at the same size: a running dataset mixed two versions
    (hostile review 8, F8: items carried the new file's actions beside the old). The answer's own ETag is compared
    with the pin: FileChangedError, nothing of the new version cached. A farm whose nodes tag the same bytes
    differently and ignore If-Match is still told apart by the bytes (the rotating case reads on)."""
    from lerobot_sql.errors import FileChangedError

    srv, data = blob_server
    srv.faults["ignore_conditions"] = True
    if rotating == "etag on HEAD only":  # its answers' Last-Modified against the one pinned (hostile review 9, G1)
        srv.faults["etag_on_head_only"] = True
        rotating = False
    elif rotating == "weak etags, no Last-Modified on GET":  # the answers' weak ETag against the pinned one (10, H5)
        srv.faults.update(weak_etag=True, lm_on_head_only=True)
        rotating = False
    elif rotating == "HEAD Last-Modified only, GET ETag only":  # the answers' first ETag pins (hostile review 11, F1)
        srv.faults.update(lm_on_head_only=True, etag_on_get_only=True)
        rotating = False
    elif rotating == "HEAD ETag only, GET Last-Modified only":  # the answers' first Last-Modified pins (11, F1)
        srv.faults.update(etag_on_head_only=True, lm_on_get_only=True)
        rotating = False
    elif rotating == "rotating, on GET only":  # a farm's ETags first seen on a range answer: told apart by the bytes
        srv.faults.update(lm_on_head_only=True, etag_on_get_only=True)
    fs, url = _blob_fs(srv, tmp_path, timeout_s=60)
    assert fs.read_range(url, 0, 1000) == data[:1000]  # pinned by its ETag
    path = srv.root / "blob.bin"
    st = path.stat()
    if rotating:
        srv.faults["rotating_etag"] = True  # same bytes, a new ETag per answer
        with pytest.warns(UserWarning, match="ETag"):
            assert fs.read_range(url, 4_000_000, 4_100_000) == data[4_000_000:4_100_000]
        return
    new = bytes(255 - x for x in data)
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new version (ETag and Last-Modified)
    with pytest.raises(FileChangedError, match=r"blob\.bin: the file changed on the server"):
        fs.read_range(url, 4_000_000, 4_100_000)
    assert fs.missing(url, 4_000_000, 4_100_000) == [(4_000_000, 4_100_000)]


def test_a_206_announcing_another_file_size_is_a_file_change(blob_server, tmp_path):
    """The Content-Range of a 206 names the file's size: another size than the one this session pinned means the
    file changed on the server (the only sign a server without validators gives mid-run): FileChangedError."""
    from lerobot_sql.errors import FileChangedError

    srv, data = blob_server
    fs, url = _blob_fs(srv, tmp_path, timeout_s=60)
    fs.info(url)
    srv.faults["range_total"] = len(data) + 10
    with pytest.raises(FileChangedError, match=rf"blob\.bin: the file changed on the server.*{len(data) + 10}"):
        fs.read_range(url, 1000, 5000)
    assert fs.missing(url, 1000, 5000) == [(1000, 5000)]
    srv.faults["range_total"] = "*"  # an unknown size is allowed (RFC 9110 14.4)
    assert fs.read_range(url, 1000, 5000) == data[1000:5000]


_MIXED_SERVERS = {"HEAD Last-Modified, GET ETag, conditions ignored": dict(lm_on_head_only=True, etag_on_get_only=True,
                                                                          ignore_conditions=True),
                  "HEAD ETag, GET Last-Modified, conditions ignored": dict(etag_on_head_only=True, lm_on_get_only=True,
                                                                          ignore_conditions=True),
                  # ETags only, If-Match honoured: the 412 of a file replaced before its first read was taken for a
                  # farm's unstable ETags, with nothing held to compare (hostile review 15, F1)
                  "ETag only, If-Match honoured": dict(lm_on_head_only=True, lm_on_get_only=True),
                  "weak ETag only, conditions ignored": dict(lm_on_head_only=True, lm_on_get_only=True, weak_etag=True,
                                                             ignore_conditions=True)}


@pytest.mark.parametrize("lazy,workers,server", [(False, 0, None), (True, 0, None), (False, 2, None), (True, 2, None),
                                                 *[(False, 0, k) for k in _MIXED_SERVERS]])
def test_a_remote_mp4_replaced_after_the_open_is_never_served(datasets, tmp_path, monkeypatch, lazy, workers,
                                                              server):
    """A remote mp4 was pinned where a process first read it, not at the open: replaced on the server after
    ``dataset()`` (the wrist mp4 over the front one, at the same size), items carried wrist pictures under the front
    key, and forked workers could serve two versions in one epoch (hostile review 12, F1). Every mp4 of the
    selection is pinned at the open: FileChangedError, in the process and in every worker; also from a server whose
    range answers carry the other kind of validator than its HEAD answers and that ignores conditions: what they
    carry is learned at the pin, not at the first read (14, F1); and from a server giving ETags only, whose answer
    for the new file is not taken for a farm's unstable ETags when nothing of the file is held yet (15, F1)."""
    import shutil
    import struct

    import torch

    from lerobot_sql._plan import episodes as plan_episodes
    from lerobot_sql.errors import FileChangedError

    if lazy:
        monkeypatch.setattr(plan_episodes, "LAZY_FRAMES", 0)
    root = tmp_path / "srv" / "small20"
    shutil.copytree(datasets / "small20", root)
    front = root / "videos/observation.images.front/chunk-000/file-000.mp4"
    wrist = root / "videos/observation.images.wrist/chunk-000/file-000.mp4"
    pad = wrist.stat().st_size - front.stat().st_size  # a free box: the same frames, the wrist file's size
    assert pad >= 8
    with open(front, "ab") as f:
        f.write(struct.pack(">I", pad) + b"free" + b"\0" * (pad - 8))
    with RangeServer(tmp_path / "srv") as srv:
        srv.faults.update(_MIXED_SERVERS.get(server, {}))
        ds = lsql.connect(f"{srv.url}/small20").dataset(episodes=[0, 1], cameras=["observation.images.front"])
        st = front.stat()
        os.replace(wrist, front)  # after the open, before any item was read
        os.utime(front, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        if workers == 0:
            with pytest.raises(FileChangedError, match=r"file-000\.mp4: the file changed on the server"):
                ds[5]
        else:
            it = iter(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers,
                                                  multiprocessing_context="fork"))
            try:
                with pytest.raises(FileChangedError, match=r"file-000\.mp4: the file changed on the server"):
                    for _ in it:
                        pass
            finally:  # now, not when the next test collects the iterator (its workers' join took seconds there)
                it._shutdown_workers()


def test_statistics_of_a_remote_selection_equal_the_local_ones(http, datasets, monkeypatch):
    """db.stats reads the numeric features from the rows' row groups (lerobot_sql._readers.column_stats): over HTTP
    the same numbers as locally, for a manifest's rows and for whole episodes read as runs (LAZY_FRAMES 0), each
    statistic bit for bit."""
    from lerobot_sql._plan import episodes as plan_episodes
    from lerobot_sql._readers import column_stats

    calls = []
    real = column_stats.column_stats
    monkeypatch.setattr(column_stats, "column_stats", lambda *a, **k: (calls.append(a[0].url), real(*a, **k))[1])
    local = lsql.connect(datasets / "small20")
    remote = lsql.connect(f"{http.url}/small20")
    for sql in ("SELECT index FROM frames WHERE frame_index % 4 = 1 AND episode_index < 7", EPISODE_SQL):
        want, got = local.stats(sql), remote.stats(sql)
        assert set(got) == set(want)
        for k in want:
            for s in want[k]:
                np.testing.assert_array_equal(got[k][s], want[k][s], err_msg=f"{sql} {k} {s}")
    monkeypatch.setattr(plan_episodes, "LAZY_FRAMES", 0)
    np.testing.assert_array_equal(remote.stats(EPISODE_SQL)["action"]["q90"], local.stats(EPISODE_SQL)["action"]["q90"])
    assert sum(u.startswith("http") for u in calls) == 3  # read from the files, not by the DuckDB fallback
