"""Source: roots (local, URLs, Hub ids), Hub revision resolution, HTTP file lists, the payload-free mp4 view."""

from __future__ import annotations

import io
import os
import struct
import types

import av
import pytest

from http_range_server import RangeServer
from lerobot_sql._format.layout import load_layout
from lerobot_sql._storage import hub
from lerobot_sql._storage.cache import parse_size
from lerobot_sql._storage.hub import resolve_hub_revision
from lerobot_sql._storage.mp4 import mp4_sync_samples
from lerobot_sql._storage.source import open_source
from lerobot_sql.errors import LeRobotSQLError, UnsupportedVersionError


def _api(*names, branches=("main",)):
    ref = lambda n: types.SimpleNamespace(name=n, ref=f"refs/tags/{n}", target_commit="0" * 40)  # noqa: E731
    refs = types.SimpleNamespace(branches=[ref(b) for b in branches], tags=[ref(n) for n in names], converts=[])
    calls = []

    class Api:
        def list_repo_refs(self, repo_id, repo_type=None):
            calls.append((repo_id, repo_type))
            return refs

    return Api(), calls


@pytest.mark.parametrize("tags,expected", [
    (["v2.1", "v3.0", "v3.0.1"], "v3.0"),      # the exact v3.0 ref wins
    (["v2.1", "v3.0.1", "v3.0.2"], "v3.0.2"),  # else the highest v3.0.x
    ([], "main"),                              # no version ref: the default branch
])
def test_hub_revision_resolution(tags, expected):
    api, calls = _api(*tags)
    assert resolve_hub_revision("org/name", api=api) == expected
    assert calls == [("org/name", "dataset")]


def test_hub_revision_refuses_other_majors():
    with pytest.raises(UnsupportedVersionError, match="convert_dataset_v21_to_v30 --repo-id=org/name"):
        resolve_hub_revision("org/name", api=_api("v2.0", "v2.1")[0])
    with pytest.raises(UnsupportedVersionError, match="only newer"):
        resolve_hub_revision("org/name", api=_api("v3.1")[0])


def test_hub_roots(monkeypatch, tmp_path):
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(hub, "resolve_hub_revision", lambda repo_id, token=None: "v3.0")
    assert hub.hub_root("hf://datasets/org/name@v2.1", {}) == ("datasets/org/name@v2.1",
                                                                     "hf://datasets/org/name@v2.1")
    assert hub.hub_root("org/name", {}) == ("datasets/org/name@v3.0", "hf://datasets/org/name@v3.0")
    assert hub.hub_root("hf://datasets/org/name", {})[0] == "datasets/org/name@v3.0"
    # Offline, the last resolution is reused.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "resolve_hub_revision", None)
    assert hub.hub_root("org/name", {})[0] == "datasets/org/name@v3.0"
    # An existing local folder that looks like org/name stays local; other URLs are not Hub roots.
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert hub.hub_root("org/name", {}) is None
    assert hub.hub_root("s3://bucket/ds", {}) is None


def test_local_root_unchanged(datasets):
    src = open_source(datasets / "small20")
    assert src.is_local and src.root == os.path.abspath(datasets / "small20")  # as given: symlinks kept
    assert src.glob("data/*/*.parquet") == ["data/chunk-000/file-000.parquet"]
    assert src.local_path("meta/info.json") == src.path("meta/info.json")


def test_parse_size():
    assert parse_size("2GiB") == 2 << 30 and parse_size("500MB") == 500_000_000 and parse_size(1234) == 1234


@pytest.mark.parametrize("name", ["small20", "multifile60", "v21_small20"])
def test_http_file_list_from_metadata(datasets, tmp_path, name):
    """HTTP cannot list folders: the file list derived from the metadata is exactly the dataset's files."""
    root = datasets / name
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    with RangeServer(datasets) as srv:
        src = open_source(f"{srv.url}/{name}", cache_dir=tmp_path)
        with pytest.raises(LeRobotSQLError, match="plain HTTP cannot list folders"):
            src.glob("data/*/*.parquet")  # storage knows no format: the list comes from the metadata (load_layout)
        load_layout(src)
        assert src.listed_files() == on_disk
        assert src.glob("data/*/*.parquet") == sorted(f for f in on_disk if f.startswith("data/"))
        assert src.exists("videos") == any(f.startswith("videos/") for f in on_disk)
        assert not src.exists("nope")


def _packets(f, use_index_keys: bool):
    """(pts, pos, size, keyframe) of every packet; keyframe from the container's sync-sample table when
    use_index_keys (``index_entries`` on PyAV 16+, the ``stss`` box via mp4_sync_samples on PyAV 15)."""
    table = mp4_sync_samples(f) if use_index_keys else None
    c = av.open(f)
    s = c.streams.video[0]
    rows = [(p.pts, p.pos, p.size, bool(p.is_keyframe)) for p in c.demux(s) if p.pts is not None]
    if use_index_keys and hasattr(s, "index_entries"):
        keys = {e.pos for e in s.index_entries if e.is_keyframe}
        rows = [(t, pos, n, pos in keys) for t, pos, n, _ in rows]
    elif use_index_keys:
        sizes, sync = table
        assert list(sizes) == [r[2] for r in rows]
        rows = [(t, pos, n, sync is None or k + 1 in sync) for k, (t, pos, n, _) in enumerate(rows)]
    c.close()
    return sorted(rows)


@pytest.mark.parametrize("name", ["small20", "h264_20"])
def test_mp4_sync_samples_match_the_decoders_keyframes(datasets, tmp_path, name):
    """The stss reader (PyAV 15's only keyframe source for payload-free remote reads) gives, over the payload-free
    view, exactly the keyframes and sizes a full demux reports; on any PyAV."""
    rel = "videos/observation.images.front/chunk-000/file-000.mp4"
    full = [(p.size, bool(p.is_keyframe)) for p in _demux_all(str(datasets / name / rel))]
    with RangeServer(datasets) as srv:
        src = open_source(f"{srv.url}/{name}", cache_dir=tmp_path)
        with src.open_demux(rel) as f:
            sizes, sync = mp4_sync_samples(f)
    assert list(sizes) == [n for n, _ in full]
    got = [True] * len(sizes) if sync is None else [k + 1 in sync for k in range(len(sizes))]
    assert got == [k for _, k in full] and 0 < sum(got) < len(got)


def _demux_all(path):
    c = av.open(path)
    try:
        return [p for p in c.demux(c.streams.video[0]) if p.pts is not None]
    finally:
        c.close()


def test_mp4_sync_samples_refuses_hostile_tables(datasets, tmp_path):
    """A crafted stss/stsz claiming billions of entries, or no moov at all, gives None (the caller then demuxes
    with payload), never a huge allocation or a struct error."""
    data = (datasets / "h264_20" / "videos/observation.images.front/chunk-000/file-000.mp4").read_bytes()
    assert mp4_sync_samples(io.BytesIO(b"\0\0\0\x10mdat" + bytes(8))) is None
    for box in (b"stss", b"stsz"):
        i = data.index(box)
        bad = data[:i + 8] + struct.pack(">I", 0x3FFFFFFF) + data[i + 12:] if box == b"stss" else \
            data[:i + 12] + struct.pack(">I", 0x3FFFFFFF) + data[i + 16:]
        assert mp4_sync_samples(io.BytesIO(bad)) is None, box


@pytest.mark.parametrize("name", ["small20", "h264_20"])
def test_payload_free_view_indexes_like_a_full_demux(datasets, tmp_path, name):
    rel = "videos/observation.images.front/chunk-000/file-000.mp4"
    expected = _packets(str(datasets / name / rel), use_index_keys=False)
    with RangeServer(datasets) as srv:
        src = open_source(f"{srv.url}/{name}", cache_dir=tmp_path)
        assert _packets(src.open_demux(rel), use_index_keys=True) == expected
        size = (datasets / name / rel).stat().st_size
        assert src.fs.io_stats()["bytes_fetched"] < 0.1 * size  # the moov box and little else


def test_a_root_that_is_no_path_or_url_is_named(datasets):
    """connect(None) raised os.fspath's bare TypeError, connect("foo://x") fsspec's "Protocol not known: foo"."""
    import lerobot_sql as lsql
    from lerobot_sql.errors import MissingFileError

    for bad in (None, 3, b"/x", ["a"]):
        with pytest.raises(TypeError, match=rf"root must be a dataset root: a folder path, a URL .*got "
                                            rf"{type(bad).__name__}"):
            lsql.connect(bad)
    for url, proto in (("foo://x", "foo"), ("s4://bucket/ds", "s4"), ("simplecachex::s3://b/ds", "simplecachex")):
        with pytest.raises(MissingFileError, match=rf"root '{url}': no filesystem for the protocol '{proto}'\..* Give "
                                                   r"a local folder, hf://datasets/ORG/NAME .*s3://, gs://"):
            lsql.connect(url)
    with pytest.raises(MissingFileError, match="Did you mean 'simplecache'"):
        lsql.connect("simplecachex::s3://b/ds")
    # what worked still works: a path object, and file:// URLs of a local folder
    assert open_source(datasets / "small20").root == os.path.abspath(datasets / "small20")
    assert lsql.connect(f"file://{datasets / 'small20'}").layout.info["total_frames"] == 4762


@pytest.mark.parametrize("folder", ["a*", "q?m", "br[x]", "br["])
def test_a_root_whose_path_holds_glob_characters_is_read_literally(datasets, tmp_path, folder):
    """The root is a folder name, not a pattern: listing its files and reading them (DuckDB globs the paths it is
    given) must neither miss them (``br[x]`` matched ``brx``: an empty dataset) nor take a sibling's (``a*``
    matched ``ab``: its files, and DuckDB counted both datasets' rows)."""
    import shutil
    import warnings

    import torch

    import lerobot_sql as lsql

    root = tmp_path / folder / "ds"
    shutil.copytree(datasets / "small20", root)
    sibling = tmp_path / (folder.replace("*", "b").replace("?", "x").replace("[x]", "x").replace("[", "x")) / "ds"
    shutil.copytree(datasets / "h264_20", sibling)
    src = open_source(str(root))
    assert src.glob("data/*/*.parquet") == ["data/chunk-000/file-000.parquet"]
    assert src.glob("meta/episodes/*/*.parquet") == ["meta/episodes/chunk-000/file-000.parquet"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "metadata-only copy" warning
        db = lsql.connect(str(root))
        assert db.sql("SELECT count(*), count(DISTINCT episode_index) FROM frames").fetchall() == [(4762, 20)]
        assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]
        assert db.sql("SELECT count(*) FROM video_frames").fetchall()[0][0] == 2 * 4762
        ds = db.dataset(episodes=[1])
        ref = lsql.connect(str(datasets / "small20")).dataset(episodes=[1])
        assert len(ds) == len(ref) == 158
        a, b = ds[5], ref[5]
        assert set(a) == set(b)
        for k, v in b.items():
            assert (torch.equal(a[k], v) if isinstance(v, torch.Tensor) else a[k] == v), k


def test_parquet_read_through_a_dataset_file_object_never_decodes_on_arrows_thread_pool(datasets, tmp_path,
                                                                                        monkeypatch):
    """A threaded decode of Parquet read through a Python file object can drop its last Python-owned buffer in an
    Arrow pool thread after the read returned; at interpreter exit that aborted the process (SIGABRT, 2 of 30 runs
    of an export script under load). Every read the connection, planning, export and doctor make is one-threaded."""
    import pyarrow.parquet as pq

    import lerobot_sql as lsql
    from lerobot_sql import doctor

    threaded = []
    for name in ("read", "read_row_group", "read_row_groups", "iter_batches"):
        orig = getattr(pq.ParquetFile, name)

        def spy(self, *a, _orig=orig, _name=name, **k):
            if k.get("use_threads", True):
                threaded.append(_name)
            return _orig(self, *a, **k)
        monkeypatch.setattr(pq.ParquetFile, name, spy)

    calls = 0
    for name in ("small20", "multifile60", "img5_extras"):
        db = lsql.connect(datasets / name, cache_dir=tmp_path / "cache")
        ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index IN (0, 1)")
        assert len(ds) == db.sql("SELECT sum(length) FROM episodes WHERE episode_index IN (0, 1)").fetchall()[0][0]
        rep = db.export("SELECT episode_index FROM episodes WHERE episode_index = 1", tmp_path / f"out_{name}",
                        progress=False)
        assert rep.episodes == 1
        assert doctor.run(db, decode=name == "img5_extras").ok  # decoding reads image cells from Parquet there
        calls += 1
    assert calls == 3 and threaded == []


@pytest.mark.parametrize("where", ["", "meta", "data/chunk-000", "via symlink"])
def test_a_cache_folder_inside_the_dataset_is_refused(datasets, tmp_path, monkeypatch, where):
    """``LSQL_CACHE_DIR=<dataset>/meta`` wrote video indexes and kept selections into the dataset folder, which an
    upload, a copy or doctor's stray-file check then picks up (hostile review 10, H6): a CacheError naming both
    folders, whether the cache folder is given as a path in the dataset or through a symlink to it. A folder beside
    the dataset is fine."""
    import shutil

    import lerobot_sql as lsql
    from lerobot_sql.errors import CacheError

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root, ignore=shutil.ignore_patterns("videos"))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    if where == "via symlink":
        (tmp_path / "link").symlink_to(root / "meta")
        folder = tmp_path / "link"
    else:
        folder = root / where
    monkeypatch.setenv("LSQL_CACHE_DIR", str(folder))
    with pytest.raises(CacheError, match=r"this cache folder is inside the dataset .*small20.*LSQL_CACHE_DIR"):
        lsql.connect(root)
    with pytest.raises(CacheError, match=r"inside the dataset"):
        lsql.connect(root, cache_dir=folder / "sub")
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing written into it
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "beside"))
    assert len(lsql.connect(root).dataset(episodes=[1], cameras=[])) > 0


def test_a_dataset_opened_through_a_symlinked_folder_connects(datasets, tmp_path, monkeypatch):
    """The check that the cache folder is not inside the dataset applied the dataset's symlink rule to its root
    itself: a dataset opened through a symlink (`latest -> run-12`, or a parent `/data -> /mnt/disk`) was refused as
    "a symlink outside the dataset root" (hostile review 14, F2). It connects, and a cache folder inside it through
    the link is still refused."""
    import shutil

    import lerobot_sql as lsql
    from lerobot_sql.errors import CacheError

    real = tmp_path / "disk" / "run-12"
    shutil.copytree(datasets / "small20", real, ignore=shutil.ignore_patterns("videos"))
    (tmp_path / "latest").symlink_to(real)
    (tmp_path / "data").symlink_to(tmp_path / "disk")
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    for root in (tmp_path / "latest", tmp_path / "data" / "run-12"):
        assert lsql.connect(root).sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]
    with pytest.raises(CacheError, match="inside the dataset"):
        lsql.connect(tmp_path / "latest", cache_dir=real / "meta" / "c")


@pytest.mark.parametrize("damage", ["sync samples out of order", "sync sample past the count",
                                    "a chunk of sample description 2", "two sample descriptions"])
def test_an_mp4_sample_table_ffmpeg_may_read_otherwise_is_no_table(datasets, tmp_path, damage):
    """The video index is built from the mp4's own sample table where it describes FFmpeg's packets; crafted tables
    that FFmpeg reads otherwise (sync samples in another order: FFmpeg takes them in order, a set would not; a chunk
    of a sample description the file lacks, which FFmpeg skips) passed the spot checks and gave a wrong keyframe or
    frame numbering (hostile review 17). They are no table: the index demuxes every packet, as before."""
    import struct

    from lerobot_sql._storage.mp4 import mp4_sample_table

    src = datasets / "small20/videos/observation.images.front/chunk-000/file-000.mp4"
    data = bytearray(src.read_bytes())
    with open(src, "rb") as f:
        assert mp4_sample_table(f) is not None  # the file as written: a table
    stss, stsc, stsd = data.find(b"stss"), data.find(b"stsc"), data.find(b"stsd")
    if damage == "sync samples out of order":  # swap the 2nd and 3rd entries
        a, b = struct.unpack_from(">II", data, stss + 16)
        struct.pack_into(">II", data, stss + 16, b, a)
    elif damage == "sync sample past the count":
        n = struct.unpack_from(">I", data, stss + 8)[0]
        struct.pack_into(">I", data, stss + 12 + 4 * (n - 1), 10**6)
    elif damage == "a chunk of sample description 2":
        struct.pack_into(">I", data, stsc + 12 + 8, 2)  # the first run's sample description index
    else:
        struct.pack_into(">I", data, stsd + 8, 2)
    out = tmp_path / "crafted.mp4"
    out.write_bytes(bytes(data))
    with open(out, "rb") as f:
        assert mp4_sample_table(f) is None


@pytest.mark.parametrize("craft", ["decoy track before the video", "a second stbl", "a second mdia", "two hdlrs"])
def test_the_sample_table_is_the_streamed_tracks_or_none(datasets, tmp_path, craft):
    """FFmpeg takes a track's type from every hdlr it meets (mdia's, then minf's: the last wins) and keeps the last
    copy of a table box; the sample-table reader took the first video-looking trak and the first stbl. A copy of the
    video track put first with a minf hdlr 'soun' (audio to FFmpeg), or a second stbl / mdia, gave the index of
    another table than the one FFmpeg streams: wrong keyframes, a frame missing (hostile review 19). Now the table is
    the streamed track's (its track_ID is the stream's id, checked by the index), or None (every packet demuxed)."""
    import copy
    import struct

    import av

    from helpers import mp4_boxes, mp4_child, write_mp4_boxes
    from lerobot_sql._storage.mp4 import mp4_sample_table

    src = datasets / "small20/videos/observation.images.front/chunk-000/file-000.mp4"
    data = src.read_bytes()
    with open(src, "rb") as f:
        want = mp4_sample_table(f)
    with av.open(str(src)) as c:
        assert want.track_id == c.streams.video[0].id  # the written file: the streamed track's table
    top = mp4_boxes(data)
    moov = mp4_child(top, b"moov")
    trak = next(b for b in moov if b[0] == b"trak")
    if craft == "decoy track before the video":
        decoy = copy.deepcopy(trak)
        tkhd = next(b for b in decoy[1] if b[0] == b"tkhd")
        at = 12 if tkhd[1][0] == 0 else 20
        tkhd[1] = tkhd[1][:at] + struct.pack(">I", 7) + tkhd[1][at + 4:]
        hdlr = next(b for b in mp4_child(decoy[1], b"mdia") if b[0] == b"hdlr")
        mp4_child(decoy[1], b"mdia", b"minf").insert(0, [b"hdlr", hdlr[1][:8] + b"soun" + hdlr[1][12:]])
        stsz = next(b for b in mp4_child(decoy[1], b"mdia", b"minf", b"stbl") if b[0] == b"stsz")
        stsz[1] = stsz[1][:12] + bytes(len(stsz[1]) - 12)  # other sizes: a table that is not the stream's
        moov.insert(moov.index(trak), decoy)
    elif craft == "a second stbl":
        minf = mp4_child(trak[1], b"mdia", b"minf")
        minf.append(copy.deepcopy(next(b for b in minf if b[0] == b"stbl")))
    elif craft == "a second mdia":
        trak[1].append(copy.deepcopy(next(b for b in trak[1] if b[0] == b"mdia")))
    else:
        mdia = mp4_child(trak[1], b"mdia")
        hdlr = next(b for b in mdia if b[0] == b"hdlr")
        mp4_child(trak[1], b"mdia", b"minf").insert(0, [b"hdlr", hdlr[1][:8] + b"soun" + hdlr[1][12:]])
    out = tmp_path / "crafted.mp4"
    out.write_bytes(write_mp4_boxes(top))
    with open(out, "rb") as f:
        got = mp4_sample_table(f)
    if craft == "decoy track before the video":
        assert got is not None and got.track_id == want.track_id and got.sizes == want.sizes
    else:
        assert got is None
