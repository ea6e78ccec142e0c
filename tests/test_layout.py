"""info.json -> Layout for v3.x and v2.x, partial copies (metadata only, missing videos), and clear refusals."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql._catalog.views import template_to_printf
from lerobot_sql._format.info import parse_version
from lerobot_sql._format.layout import load_layout
from lerobot_sql._storage.source import open_source

ALOHA = "aloha_sim_transfer_cube_human_prerelease_meta_only"


def _info(root):
    return json.loads((root / "meta/info.json").read_text())


def test_v30_layout(datasets):
    lay = load_layout(open_source(datasets / "multifile60"))
    assert not lay.legacy and parse_version(lay.version) == (3, 0) and lay.fps == 30.0
    assert lay.tasks_file == "meta/tasks.parquet" and lay.episode_stats_file is None and lay.warnings == ()
    assert lay.data_files == ("data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet")
    assert lay.video_file("observation.images.front", 1, 0) == \
        "videos/observation.images.front/chunk-001/file-000.mp4"
    assert lay.data_file(0, 1) == "data/chunk-000/file-001.parquet"
    assert list(lay.features) == list(_info(datasets / "multifile60")["features"])


def test_v21_layout(real_datasets):
    lay = load_layout(open_source(real_datasets / "g1_real_v21"))
    assert lay.legacy and lay.version == "v2.1"
    assert lay.episode_files == ("meta/episodes.jsonl",)
    assert lay.episode_stats_file == "meta/episodes_stats.jsonl" and lay.tasks_file == "meta/tasks.jsonl"
    assert len(lay.data_files) == 12 and all("/episode_" in f for f in lay.data_files)
    assert lay.features["observation.state"].flat_names[0] == "kLeftShoulderPitch"  # nested-list names


def test_template_to_printf_v2_placeholders():
    fmt, args = template_to_printf("videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
                                   {"video_key": "'k'", "episode_chunk": "c", "episode_index": "e"})
    assert fmt == "videos/chunk-%03d/%s/episode_%06d.mp4" and args == ["c", "'k'", "e"]
    with pytest.raises(lsql.DatasetFormatError, match="episode_index"):
        template_to_printf("x/{episode_index}.mp4", {"chunk_index": "c"})


def test_metadata_only_v30_opens_with_empty_frames(real_datasets):
    datasets = real_datasets  # fetched set: second tier
    with pytest.warns(UserWarning, match="no data files"):
        db = lsql.connect(datasets / "oc_models_meta_only")
    ep = pq.read_table(datasets / "oc_models_meta_only/meta/episodes/chunk-000/file-000.parquet",
                       columns=["episode_index", "length"])
    assert db.sql("SELECT episode_index, length FROM episodes ORDER BY 1").fetchall() == \
        list(zip(ep["episode_index"].to_pylist(), ep["length"].to_pylist()))
    assert db.sql("SELECT count(*) FROM frames").fetchall() == [(0,)]
    cols = {r[0]: r[1] for r in db.con.sql("DESCRIBE frames").fetchall()}
    assert cols["observation.state"] == "FLOAT[6]" and cols["index"] == "BIGINT" and cols["timestamp"] == "FLOAT"
    assert "observation.images.top_phone" not in cols  # video features have no column in the data files
    assert db.tasks() == {0: pq.read_table(datasets / "oc_models_meta_only/meta/tasks.parquet")
                          .to_pylist()[0]["__index_level_0__"]}
    with pytest.raises(lsql.ResultContractError, match="no rows"):
        db.dataset("SELECT index FROM frames")


def test_prerelease_json_only_copy_opens(real_datasets):
    """Float fps, files_size_in_mb, video_info, no total_videos, no meta/episodes, no tasks: metadata views only."""
    datasets = real_datasets  # fetched set: second tier
    with pytest.warns(UserWarning) as rec:
        db = lsql.connect(datasets / ALOHA)
    msgs = " | ".join(str(w.message) for w in rec)
    assert "meta/episodes" in msgs and "tasks.parquet" in msgs and "no data files" in msgs
    assert db.fps == 50.0
    info = _info(datasets / ALOHA)
    assert db.sql("SELECT fps, total_episodes, total_frames FROM info").fetchall() == \
        [(50.0, info["total_episodes"], info["total_frames"])]
    feats = dict(db.sql("SELECT name, codec FROM features").fetchall())
    assert feats["observation.images.top"] == info["features"]["observation.images.top"]["video_info"]["video.codec"]
    assert "next.done" in feats
    for view in ("episodes", "frames", "tasks", "videos", "episode_stats"):
        assert db.sql(f"SELECT count(*) FROM {view}").fetchall() == [(0,)], view
    cols = [r[0] for r in db.con.sql("DESCRIBE episodes").fetchall()]
    assert {"episode_index", "length", "dataset_from_index", "videos/observation.images.top/from_timestamp"} <= set(cols)


def test_record_test_tables_work_and_frames_name_the_missing_mp4(real_datasets):
    root = real_datasets / "record-test"
    db = lsql.connect(root)
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    assert db.sql("SELECT count(*), max(index) FROM frames").fetchall() == [(data.num_rows, data.num_rows - 1)]
    assert [r[0] for r in db.con.sql("DESCRIBE frames").fetchall()][0] == "action"  # column order kept
    got = db.sql('SELECT "action" FROM frames WHERE index = 500').fetchall()[0][0]
    assert got == pytest.approx(data["action"][500].as_py(), rel=0, abs=0)
    with pytest.warns(UserWarning, match="video file\\(s\\) are missing"):
        ds = db.dataset("SELECT index FROM frames WHERE episode_index = 2 ORDER BY index")
    with pytest.raises(lsql.MissingFileError, match=r"videos/observation\.images\.(front|top)/chunk-000/file-000\.mp4"):
        ds[0]
    tab = db.dataset("SELECT index FROM frames WHERE episode_index = 2 ORDER BY index", cameras=[])
    item = tab[0]
    assert int(item["episode_index"]) == 2 and int(item["frame_index"]) == 0
    assert item["task"] == db.tasks()[int(item["task_index"])]


def test_a_folder_of_datasets_given_as_a_root_names_them_and_connect_many(datasets, tmp_path):
    """A new user's `connect("sample")`: the error named only the missing meta/info.json; it now names the dataset
    folders inside and the two calls that open them."""
    for name in ("b_set", "a_set"):
        shutil.copytree(datasets / "small20" / "meta", tmp_path / name / "meta")
    (tmp_path / "not_a_dataset").mkdir()
    with pytest.raises(lsql.MissingFileError, match=r"holds 2 dataset folder\(s\) \(a_set, b_set\).*"
                                                    r"lsql\.connect\('.*/a_set'\).*lsql\.connect_many\("):
        lsql.connect(tmp_path)
    with pytest.warns(UserWarning, match="metadata-only copy"):  # (meta/ only: the copies hold no data/)
        coll = lsql.connect_many(tmp_path)  # (the call the message names opens them)
    assert sorted(coll.names) == ["a_set", "b_set"]


def test_refusals(datasets, tmp_path):
    with pytest.raises(lsql.MissingFileError, match="meta/info.json"):
        lsql.connect(tmp_path)
    root = tmp_path / "v1"
    shutil.copytree(datasets / "small20" / "meta", root / "meta")
    info = _info(root)
    for version, err, pattern in (("v1.6", lsql.UnsupportedVersionError, "v2.0, v2.1 and v3.x"),
                                  ("three", lsql.DatasetFormatError, "not a version")):
        (root / "meta/info.json").write_text(json.dumps({**info, "codebase_version": version}))
        with pytest.raises(err, match=pattern):
            lsql.connect(root)
    for fps in (0, "30", None, True):
        (root / "meta/info.json").write_text(json.dumps({**info, "fps": fps}))
        with pytest.raises(lsql.DatasetFormatError, match="fps"):
            lsql.connect(root)
    (root / "meta/info.json").write_text(json.dumps({k: v for k, v in info.items() if k != "features"}))
    with pytest.raises(lsql.DatasetFormatError, match="features"):
        lsql.connect(root)
    (root / "meta/info.json").write_text("{not json")
    with pytest.raises(lsql.DatasetFormatError, match="not valid JSON"):
        lsql.connect(root)


def test_broken_jsonl_names_file_and_line(datasets, tmp_path):
    root = tmp_path / "v21"
    shutil.copytree(datasets / "v21_small20", root)
    lines = (root / "meta/episodes.jsonl").read_text().splitlines()
    lines[2] = lines[2][:-5]
    (root / "meta/episodes.jsonl").write_text("\n".join(lines) + "\n")
    db = lsql.connect(root)  # reads info.json only: the metadata files are read on first use
    with pytest.raises(lsql.DatasetFormatError, match=r"episodes\.jsonl:3"):
        db.sql("SELECT count(*) FROM episodes")
    with pytest.raises(lsql.DatasetFormatError, match=r"episodes\.jsonl:3"):
        lsql.connect(root).dataset()  # the whole-episode path reads the pointers without DuckDB


# ---- info.json is validated up front, its templates never reach outside the root ----------


def _with_info(datasets, tmp_path, **changes):
    root = tmp_path / "ds"
    if not root.exists():
        shutil.copytree(datasets / "small20", root)
    info = _info(datasets / "small20")
    for k, v in changes.items():
        if v is None:
            info.pop(k, None)
        else:
            info[k] = v
    (root / "meta/info.json").write_text(json.dumps(info))  # allow_nan: writes NaN / Infinity as Python reads them
    return root


BAD_TEMPLATES = [
    "../evil/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
    "data/../../evil/file-{file_index:03d}.parquet",
    "/tmp/evil/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
    "~/evil/file-{file_index:03d}.parquet",
    "http://127.0.0.1:9/evil/file-{file_index:03d}.parquet",
    "file:///etc/file-{file_index:03d}.parquet",
    "s3://bucket/file-{file_index:03d}.parquet",
    "data/chunk-{chunk_index:>999999}/file-{file_index:03d}.parquet",
    "data/chunk-{chunk_index!r}/file-{file_index:03d}.parquet",
    "data/chunk-{chunk_index.real}/file-{file_index:03d}.parquet",
    "data/chunk-{nope:03d}/file-{file_index:03d}.parquet",
    "data/chunk-{chunk_index:03d/file.parquet",
    5,
]


@pytest.mark.parametrize("template", BAD_TEMPLATES)
@pytest.mark.parametrize("key", ["data_path", "video_path"])
def test_path_templates_are_confined_at_connect(datasets, tmp_path, key, template):
    if key == "video_path" and isinstance(template, str):
        template = template.replace("file_index:03d}.parquet", "file_index:03d}.mp4").replace(
            "{file_index", "{video_key}/{file_index")
    root = _with_info(datasets, tmp_path, **{key: template})
    with pytest.raises(lsql.DatasetFormatError, match=rf"meta/info.json '{key}'") as e:
        lsql.connect(root)
    assert "Parquet" not in str(e.value) and "re-download" not in str(e.value)


def test_a_data_path_with_dotdot_never_reads_outside_the_root(datasets, tmp_path):
    """The escape as found: the whole-episode path read ../evil's Parquet while SQL read the file inside."""
    root = _with_info(datasets, tmp_path, data_path="../evil/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet")
    evil = tmp_path / "evil/chunk-000"
    evil.mkdir(parents=True)
    t = pq.read_table(datasets / "small20/data/chunk-000/file-000.parquet")
    pq.write_table(t.set_column(t.column_names.index("action"), "action", t["action"]), evil / "file-000.parquet")
    with pytest.raises(lsql.DatasetFormatError, match="data_path"):
        lsql.connect(root).dataset()


def test_resolved_paths_stay_under_the_root_local_and_remote(datasets, tmp_path):
    import dataclasses

    from lerobot_sql._storage.source import confine

    for root in (str(datasets / "small20"), "memory://lsql-confine/ds"):
        src = open_source(root)
        assert src.path("data/chunk-000/file-000.parquet").endswith("/data/chunk-000/file-000.parquet")
        for rel in ("../x", "data/../../x", "videos/k/../../../etc/passwd", "a\0b", "data/http://h/x"):
            with pytest.raises(lsql.DatasetFormatError, match="leaves the dataset root"):
                src.path(rel)
    layout = load_layout(open_source(datasets / "small20"))
    with pytest.raises(lsql.DatasetFormatError, match="video_path.*camera '../..'"):
        layout.video_file("../..", 0, 0)  # a key that passed no validation (the Layout built by hand)
    bad = dataclasses.replace(layout, data_path="{file_index}/../../x")
    with pytest.raises(lsql.DatasetFormatError, match="data_path"):
        bad.data_file(0, 0)
    assert confine("videos/a b'\"\\;/chunk-000/file-000.mp4") == "videos/a b'\"\\;/chunk-000/file-000.mp4"


@pytest.mark.parametrize("key", ["..", "../../etc", "/abs", "a//b", "."])
def test_camera_keys_must_be_folder_names(datasets, tmp_path, key):
    info = _info(datasets / "small20")
    feats = {key if k == "observation.images.front" else k: v for k, v in info["features"].items()}
    root = _with_info(datasets, tmp_path, features=feats)
    with pytest.raises(lsql.DatasetFormatError, match="camera key"):
        lsql.connect(root)


BAD_INFO = [
    ({"fps": float("nan")}, "'fps'"),
    ({"fps": float("inf")}, "'fps'"),
    ({"fps": -30}, "'fps'"),
    ({"fps": 1e300}, "'fps'"),
    # issue 36: a positive fps so small that every time is astronomically far (1/fps s per frame), zero, a flag
    ({"fps": 1e-300}, "'fps'"),
    ({"fps": 5e-324}, "'fps'"),
    ({"fps": 0}, "'fps'"),
    ({"fps": True}, "'fps'"),
    ({"fps": False}, "'fps'"),
    # issue 36: a version that is not a string (str(3) read as 'v3.0')
    ({"codebase_version": 3}, "'codebase_version'"),
    ({"codebase_version": 3.0}, "'codebase_version'"),
    ({"codebase_version": ["v3.0"]}, "'codebase_version'"),
    ({"chunks_size": 10 ** 30}, "'chunks_size'"),
    ({"chunks_size": 0}, "'chunks_size'"),
    ({"chunks_size": -5}, "'chunks_size'"),
    ({"chunks_size": "1000"}, "'chunks_size'"),
    ({"chunks_size": 2.5}, "'chunks_size'"),
    # issue 39: a dataset stored as a Lance table (lerobot after 0.6.1) has no data/*.parquet to read
    ({"storage_format": "lance"}, r"'storage_format' is 'lance'.*data/\*\.parquet.*LanceDatasetReader"),
    ({"storage_format": "PARQUET"}, r"'storage_format' is 'PARQUET'"),
    ({"storage_format": ["parquet"]}, r"'storage_format' is \['parquet'\]"),
]
BAD_FEATURE = [
    ({"shape": [-6]}, "shape"),
    ({"shape": [0]}, "shape"),
    ({"shape": [10 ** 7, 10 ** 7]}, "shape"),
    ({"shape": ["six"]}, "shape"),
    ({"shape": 6}, "shape"),
    ({"shape": [6.5]}, "shape"),
    ({"shape": [True]}, "shape"),
    ({"dtype": "float128"}, "dtype"),
    ({"dtype": 5}, "dtype"),
]


@pytest.mark.parametrize("change,what", BAD_INFO + [({"features": f}, w) for f, w in BAD_FEATURE])
def test_info_json_is_validated_at_connect(datasets, tmp_path, change, what):
    if "features" in change:
        info = _info(datasets / "small20")
        info["features"]["observation.state"] = {**info["features"]["observation.state"], **change["features"]}
        change = {"features": info["features"]}
        what = rf"feature 'observation.state'.*{what}"
    root = _with_info(datasets, tmp_path, **change)
    with pytest.raises(lsql.DatasetFormatError, match=rf"meta/info.json.*{what}") as e:
        lsql.connect(root)
    assert "Parquet" not in str(e.value) and "re-download" not in str(e.value)


def test_an_int_dtype_over_float_data_names_file_and_column(datasets, tmp_path):
    info = _info(datasets / "small20")
    info["features"]["observation.state"]["dtype"] = "int64"
    root = _with_info(datasets, tmp_path, features=info["features"])
    pattern = r"file-000\.parquet: column 'observation.state' is stored as floating point.*'int64'"
    with pytest.raises(lsql.DatasetFormatError, match=pattern):  # SQL truncated the values silently
        lsql.connect(root).sql('SELECT "observation.state" FROM frames').fetchall()
    with pytest.raises(lsql.DatasetFormatError, match=pattern):  # whole episodes: no DuckDB on this path
        lsql.connect(root).dataset()
    with pytest.raises(lsql.DatasetFormatError, match=pattern):
        lsql.connect(root).dataset("SELECT index FROM frames WHERE episode_index = 1")


def test_valid_info_json_variants_still_open(datasets, tmp_path):
    root = _with_info(datasets, tmp_path, fps=30.0, chunks_size=1000.0)
    assert lsql.connect(root).sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]
    # storage_format Parquet (as written or null), and keys this reader does not know, anywhere: read, and the
    # unknown ones reachable in SQL (info.info_json, features.info)
    own = {"by": "another writer", "nan": float("nan"), "deep": [[{"x": 1}]]}
    info = _info(datasets / "small20")
    info["features"]["observation.state"]["info"] = {"curation": {"kept": True}}
    info["features"]["action"]["my_key"] = [1, 2]
    for fmt in ("parquet", None):
        root = _with_info(datasets, tmp_path, storage_format=fmt, my_writer=own, features=info["features"])
        db = lsql.connect(root)
        assert db.sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]
        assert db.sql("SELECT info_json->'my_writer'->>'by', info_json->'my_writer'->>'nan', "
                      "info_json->'my_writer'->'deep' FROM info").fetchall() == [("another writer", None, '[[{"x":1}]]')]
        assert db.sql("SELECT info->'curation'->>'kept' FROM features WHERE name = 'observation.state'"
                      ).fetchall() == [("true",)]
    root = _with_info(datasets, tmp_path, chunks_size=None,
                      data_path="data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet")
    assert lsql.connect(root).layout.chunks_size == 1000


HTTP_BAD_INFO = [
    ("small20", {"chunks_size": "many"}, "'chunks_size'"),
    ("small20", {"chunks_size": 10 ** 30}, "'chunks_size'"),
    ("small20", {"chunks_size": [1000]}, "'chunks_size'"),
    ("small20", {"total_episodes": "twenty"}, "'total_episodes'"),
    ("small20", {"total_episodes": -1}, "'total_episodes'"),
    ("small20", {"data_path": "../{chunk_index}/{file_index}.parquet"}, "'data_path'"),
    ("small20", {"video_path": "videos/{video_key}/{chunk_index.real}/{file_index}.mp4"}, "'video_path'"),
    ("small20", {"features": "none"}, "'features'"),
    ("v21_small20", {"chunks_size": "many"}, "'chunks_size'"),
    ("v21_small20", {"video_path": "/abs/{video_key}/{episode_index}.mp4"}, "'video_path'"),
]


@pytest.mark.parametrize("name,change,what", HTTP_BAD_INFO)
def test_http_roots_validate_info_json_before_listing(datasets, tmp_path, monkeypatch, name, change, what):
    """Plain HTTP cannot list: load_layout derives the file list from info.json (_format/listing.py), so the
    validation must come first (the listing once ran int(chunks_size) and str.format before it)."""
    from http_range_server import RangeServer

    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "srv" / name
    shutil.copytree(datasets / name, root)
    info = _info(root)
    info.update(change)
    (root / "meta/info.json").write_text(json.dumps(info))
    with RangeServer(tmp_path / "srv") as srv:
        with pytest.raises(lsql.DatasetFormatError, match=rf"{srv.url}/{name}/meta/info.json.*{what}") as e:
            lsql.connect(f"{srv.url}/{name}")
    assert "Parquet" not in str(e.value) and "re-download" not in str(e.value)


def test_http_root_with_a_valid_info_json_lists_its_files(datasets, tmp_path, monkeypatch):
    from http_range_server import RangeServer

    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    with RangeServer(datasets) as srv:
        for name, n in (("small20", 4762), ("v21_small20", 4762), ("multifile60", None)):
            db = lsql.connect(f"{srv.url}/{name}")
            local = sorted(str(p.relative_to(datasets / name)) for p in (datasets / name).rglob("*") if p.is_file())
            assert db.source.listed_files() == local
            if n:
                assert db.sql("SELECT count(*) FROM frames").fetchall() == [(n,)]


def test_http_v21_data_path_written_with_chunk_index_and_file_index_lists_its_files(datasets, tmp_path,
                                                                                   monkeypatch):
    """A v2.x data_path may name an episode's file with {chunk_index}/{file_index} (check_info accepts them, and
    Layout.data_file fills them with episode_chunk/episode_index): the HTTP listing filled only episode_chunk and
    episode_index, so connect() died with a bare KeyError: 'chunk_index'."""
    from http_range_server import RangeServer

    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "srv" / "v21"
    shutil.copytree(datasets / "v21_small20", root, ignore=shutil.ignore_patterns("videos"))
    info = _info(root)
    info.update(data_path="data/chunk-{chunk_index:03d}/episode_{file_index:06d}.parquet", video_path=None,
                features={k: v for k, v in info["features"].items() if v["dtype"] != "video"})
    (root / "meta/info.json").write_text(json.dumps(info))
    with RangeServer(tmp_path / "srv") as srv:
        db = lsql.connect(f"{srv.url}/v21")
        assert len([f for f in db.source.listed_files() if f.startswith("data/")]) == 20
        assert db.sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]


def _relay_meta_episodes(src, root, places):
    """Copy ``src`` to ``root`` with meta/episodes split into ``len(places)`` equal files at the (chunk, file)
    positions ``places`` (their meta/episodes/* columns rewritten to match); info.json is left as it was."""
    shutil.copytree(src, root)
    old = root / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(old)
    old.unlink()
    n = -(-t.num_rows // len(places))
    for i, (c, f) in enumerate(places):
        part = t.slice(i * n, n)
        for col, v in (("meta/episodes/chunk_index", c), ("meta/episodes/file_index", f)):
            part = part.set_column(part.schema.get_field_index(col), col,
                                   pa.array([v] * part.num_rows, part.schema.field(col).type))
        (root / f"meta/episodes/chunk-{c:03d}").mkdir(parents=True, exist_ok=True)
        pq.write_table(part, root / f"meta/episodes/chunk-{c:03d}/file-{f:03d}.parquet")


# multifile60 says chunks_size 2; its meta/episodes re-laid more densely (5 files in chunk-000) and more sparsely
# (1 file per chunk) than that.
RELAID = {"dense": [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)], "sparse": [(0, 0), (1, 0), (2, 0)]}


@pytest.mark.parametrize("layout", sorted(RELAID))
def test_http_listing_finds_meta_episodes_numbered_unlike_chunks_size(datasets, tmp_path, monkeypatch, layout):
    """Plain HTTP cannot list: the meta/episodes files are found by walking file indices. Walking by chunks_size
    alone stopped at chunk-001/file-000 in the dense layout and read 24 of 60 episodes without a word."""
    from http_range_server import RangeServer

    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "srv" / "ds"
    _relay_meta_episodes(datasets / "multifile60", root, RELAID[layout])
    info = _info(root)
    with RangeServer(tmp_path / "srv") as srv:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            db = lsql.connect(f"{srv.url}/ds")
        local = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        assert db.source.listed_files() == local
        assert db.sql("SELECT count(*), sum(length) FROM episodes").fetchall() == \
            [(info["total_episodes"], info["total_frames"])]
        assert db.sql("SELECT count(*) FROM frames").fetchall() == [(info["total_frames"],)]


def test_http_listing_short_of_total_episodes_warns_with_both_counts(datasets, tmp_path, monkeypatch):
    """A meta/episodes file missing at the end of the walk: the episodes read are kept, with a warning giving
    how many were found and how many info.json promises."""
    from http_range_server import RangeServer

    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "srv" / "ds"
    _relay_meta_episodes(datasets / "multifile60", root, RELAID["dense"])
    (root / "meta/episodes/chunk-000/file-003.parquet").unlink()
    with RangeServer(tmp_path / "srv") as srv:
        with pytest.warns(UserWarning, match=r"hold 36 episodes but info.json's total_episodes is 60.*"
                                             r"neither meta/episodes/chunk-001/file-000.parquet nor "
                                             r"meta/episodes/chunk-000/file-003.parquet exists.*other 24"):
            db = lsql.connect(f"{srv.url}/ds")
        assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(36,)]


@pytest.mark.parametrize("folder", ["vid{0}", "v{chunk_index.real}", "x}{", "clips%s", "{video_key}"])
def test_a_video_folder_found_by_listing_is_data_not_template(datasets, tmp_path, folder):
    """_find_video_dir puts the one top folder holding mp4s into the template: its braces are literal text."""
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    (root / "videos").rename(root / folder)
    with pytest.warns(UserWarning, match="holds mp4 files; reading videos through"):
        db = lsql.connect(root)
    assert db.layout.video_path.startswith(folder.replace("{", "{{").replace("}", "}}") + "/{video_key}/")
    sql = "SELECT index FROM frames WHERE episode_index IN (2, 9) ORDER BY index"
    a, b = lsql.connect(datasets / "small20").dataset(sql), db.dataset(sql)
    assert len(a) == len(b) == 495
    from helpers import assert_items_equal

    for i in (0, 247, 494):
        assert_items_equal(b[i], a[i])
    paths = sorted(r[0] for r in db.sql("SELECT DISTINCT path FROM videos").fetchall())
    assert paths == [f"{folder}/observation.images.{c}/chunk-000/file-000.mp4" for c in ("front", "wrist")]


@pytest.mark.parametrize("folder", ["vid\\eos", "~videos", "c:videos"])
def test_a_video_folder_whose_name_is_no_template_is_not_used(datasets, tmp_path, folder):
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    (root / "videos").rename(root / folder)
    with pytest.warns(UserWarning, match=r"cannot be used as a video folder .*meta/info.json \(rewritten to the "
                                         rf"folder {re.escape(repr(folder))}"):
        db = lsql.connect(root)
    assert db.layout.video_path == _info(root)["video_path"]
    with pytest.raises(lsql.MissingFileError):
        db.dataset("SELECT index FROM frames WHERE episode_index = 2")[0]


def _drop_data_column(datasets, tmp_path, name, column, one_task=False):
    """A copy of ``name`` whose data files lack ``column`` (as a third-party v2.1 converter writes them); with
    ``one_task`` every episode lists only its first task in meta/episodes (the data's task_index is that one)."""
    root = tmp_path / f"{name}-no-{column}"
    shutil.copytree(datasets / name, root)
    for f in sorted(root.glob("data/*/*.parquet")):
        t = pq.read_table(f)
        pq.write_table(t.drop_columns([column]).replace_schema_metadata(t.schema.metadata), f)
    if one_task and name == "v21_small20":
        rows = [json.loads(line) for line in (root / "meta/episodes.jsonl").read_text().splitlines() if line.strip()]
        (root / "meta/episodes.jsonl").write_text("".join(json.dumps({**r, "tasks": r["tasks"][:1]}) + "\n"
                                                          for r in rows))
    elif one_task:
        f = root / "meta/episodes/chunk-000/file-000.parquet"
        t = pq.read_table(f)
        i = t.schema.get_field_index("tasks")
        pq.write_table(t.set_column(i, "tasks", pa.array([v[:1] for v in t["tasks"].to_pylist()],
                                                          t.schema.field(i).type)), f)
    return root


@pytest.mark.parametrize("name", ["small20", "v21_small20"])
@pytest.mark.parametrize("column", ["index", "task_index"])
def test_a_missing_data_column_leaves_the_other_views_readable(datasets, tmp_path, name, column):
    """One missing default column once made every view raise at the first query (even info, features, tasks);
    task_index absent gave every item task 0's text. Now the views that do not need it work, and what cannot be
    derived raises DatasetFormatError naming the column and a data file."""
    root = _drop_data_column(datasets, tmp_path, name, column)
    info = _info(root)
    with pytest.warns(UserWarning, match=rf"lack the '{column}' column"):
        db = lsql.connect(root)
        db.sql("SELECT 1 FROM frames LIMIT 0").fetchall()
    assert db.sql("SELECT fps, total_frames FROM info").fetchall() == [(30.0, info["total_frames"])]
    assert db.sql("SELECT count(*) FROM features").fetchall() == [(len(info["features"]),)]
    assert db.sql("SELECT count(*) FROM tasks").fetchall() == [(info["total_tasks"],)]
    assert db.sql("SELECT count(*), sum(length) FROM episodes").fetchall() == \
        [(info["total_episodes"], info["total_frames"])]
    assert db.sql("SELECT count(*), count(DISTINCT episode_index), max(frame_index) FROM frames").fetchall() == \
        lsql.connect(datasets / name).sql("SELECT count(*), count(DISTINCT episode_index), max(frame_index) "
                                         "FROM frames").fetchall()
    first = db.layout.data_files[0]
    derived = column == "index" and name == "v21_small20"  # v2.x: lerobot v2.1 numbers frames by episode order
    if derived:
        want = lsql.connect(datasets / name).sql("SELECT episode_index, frame_index, index FROM frames ORDER BY 2, 1")
        assert db.sql("SELECT episode_index, frame_index, index FROM frames ORDER BY 2, 1").fetchall() == \
            want.fetchall()
        return
    if column == "index":
        with pytest.raises(lsql.DatasetFormatError, match=rf"{re.escape(first)}: the data files lack the 'index'"):
            db.sql("SELECT max(index) FROM frames").fetchall()
    tail = r".*e\.g\. episode 1\)" if column == "task_index" else ""  # episode 1 lists two tasks
    with pytest.raises(lsql.DatasetFormatError, match=rf"{re.escape(first)}: the data files lack the '{column}'"
                                                      rf"{tail}"):
        db.dataset("SELECT index FROM frames WHERE episode_index = 2")[0]


@pytest.mark.parametrize("name", ["small20", "v21_small20"])
def test_a_missing_task_index_is_derived_from_each_episodes_one_task(datasets, tmp_path, name):
    root = _drop_data_column(datasets, tmp_path, name, "task_index", one_task=True)
    with pytest.warns(UserWarning, match="derived from each episode's one task"):
        db = lsql.connect(root)
        ds = db.dataset("SELECT index FROM frames WHERE episode_index IN (0, 2, 7)")
    want = lsql.connect(datasets / name).dataset("SELECT index FROM frames WHERE episode_index IN (0, 2, 7)")
    assert len(ds) == len(want)
    for i in (0, 1, len(want) // 2, len(want) - 1):
        got, ref = ds[i], want[i]
        assert got["task"] == ref["task"] and int(got["index"]) == int(ref["index"])


def test_whole_episode_items_with_a_missing_task_index_get_their_own_task(datasets, tmp_path):
    root = _drop_data_column(datasets, tmp_path, "small20", "task_index", one_task=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = lsql.connect(root).dataset(episodes=[2])[0]
    assert got["task"] == lsql.connect(datasets / "small20").dataset(episodes=[2])[0]["task"]
