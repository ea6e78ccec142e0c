"""A dataset's own metadata is hostile input: feature names, camera keys, task texts and path templates from
info.json / Parquet must never change the SQL lerobot_sql runs, nor reach files outside the dataset root.

Each hostile dataset is a copy of small20 (or v21_small20) with its names rewritten everywhere lerobot stores them
(info.json features, the data files' column names, meta/episodes ``videos/<key>/...`` and ``stats/<feature>/...``
columns, the mp4 folders, the task texts); its items must equal the original dataset's items, key for key.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from helpers import rename_parquet_columns

# Quotes, backslashes, semicolons, newlines, unicode and SQL, in every name lerobot_sql pastes into SQL text.
STATE = "obs'\"\\;\n é 状态 '); DROP VIEW frames; --"
FRONT = "x' OR '1'='1"
WRIST = "cam\"; DROP TABLE tasks; --\\ ü\n'"
RENAME = {"observation.state": STATE, "observation.images.front": FRONT, "observation.images.wrist": WRIST}
ACTION_NAME = "grip'\"; DROP VIEW frames_ext; -- \\ \n ж"  # replaces action's last element name
TASK_PREFIX = "'); DROP VIEW episodes; -- x' OR '1'='1 \\ \" ; \n ✓ "


def _hostile_copy(orig: Path, dst: Path, rename: dict = RENAME) -> Path:
    """A copy of ``orig`` with the features in ``rename`` renamed everywhere, action's last element name replaced
    by ACTION_NAME and TASK_PREFIX put before every task text."""
    shutil.copytree(orig, dst)
    info = json.loads((dst / "meta/info.json").read_text())
    info["features"] = {rename.get(k, k): v for k, v in info["features"].items()}
    info["features"]["action"]["names"][-1] = ACTION_NAME
    (dst / "meta/info.json").write_text(json.dumps(info))
    for f in sorted(dst.glob("data/*/*.parquet")):
        rename_parquet_columns(f, rename)
    legacy = info["codebase_version"].startswith("v2")
    if legacy:
        for old, new in rename.items():
            for d in dst.glob(f"videos/*/{old}"):
                d.rename(d.parent / new)
        stats = dst / "meta/episodes_stats.jsonl"
        lines = [json.loads(s) for s in stats.read_text().splitlines() if s.strip()]
        for r in lines:
            r["stats"] = {rename.get(k, k): v for k, v in r["stats"].items()}
        stats.write_text("".join(json.dumps(r) + "\n" for r in lines))
        tasks = dst / "meta/tasks.jsonl"
        rows = [json.loads(s) for s in tasks.read_text().splitlines() if s.strip()]
        for r in rows:
            r["task"] = TASK_PREFIX + r["task"]
        tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
        eps = dst / "meta/episodes.jsonl"
        rows = [json.loads(s) for s in eps.read_text().splitlines() if s.strip()]
        for r in rows:
            r["tasks"] = [TASK_PREFIX + t for t in r["tasks"]]
        eps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        for old, new in rename.items():
            if (dst / "videos" / old).is_dir():
                (dst / "videos" / old).rename(dst / "videos" / new)
        for f in sorted(dst.glob("meta/episodes/*/*.parquet")):
            rename_parquet_columns(f, rename)
            t = pq.read_table(f)
            tasks = pa.array([[TASK_PREFIX + s for s in ts] for ts in t["tasks"].to_pylist()], pa.list_(pa.string()))
            pq.write_table(t.set_column(t.column_names.index("tasks"), "tasks", tasks), f)
        t = pq.read_table(dst / "meta/tasks.parquet")
        text = "task" if "task" in t.column_names else "__index_level_0__"
        new = pa.array([TASK_PREFIX + s for s in t[text].to_pylist()], pa.string())
        pq.write_table(t.set_column(t.column_names.index(text), text, new), dst / "meta/tasks.parquet")
    return dst


@pytest.fixture(scope="module", params=["small20", "v21_small20"])
def pair(request, datasets, tmp_path_factory):
    name = request.param
    hostile = _hostile_copy(datasets / name, tmp_path_factory.mktemp("hostile") / name)
    return lsql.connect(datasets / name), lsql.connect(hostile)


def _assert_same_item(orig: dict, got: dict, rename: dict = RENAME, task_prefix: str = TASK_PREFIX) -> None:
    back = {v: k for k, v in rename.items()}
    renamed = {back.get(k.removesuffix("_is_pad"), k.removesuffix("_is_pad")) + ("_is_pad" if k.endswith("_is_pad")
                                                                               else ""): v for k, v in got.items()}
    assert set(renamed) == set(orig)
    for k, v in orig.items():
        if k == "task":
            assert renamed[k] == task_prefix + v
        elif isinstance(v, torch.Tensor):
            assert v.dtype == renamed[k].dtype and torch.equal(v, renamed[k]), k
        else:
            assert renamed[k] == v, k


# Whole episodes (the pointer fast path, no DuckDB), index rows and windows (the DuckDB plan path).
QUERIES = [
    None,
    "SELECT index FROM frames WHERE episode_index IN (3, 7) ORDER BY index",
    "SELECT episode_index, 0.5 AS start_s, 1.5 AS end_s FROM episodes WHERE episode_index % 4 = 1",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_items_equal_the_original_datasets(pair, sql):
    orig_db, db = pair
    a, b = orig_db.dataset(sql), db.dataset(sql)
    assert len(a) == len(b) > 0
    for i in sorted({0, 1, len(a) // 3, len(a) // 2, len(a) - 1}):
        _assert_same_item(a[i], b[i])


def test_views_hold_the_hostile_names_as_data(pair):
    orig_db, db = pair
    assert "frames" in db.views() and "episodes" in db.views() and "tasks" in db.views()
    for view in ("frames", "episodes", "tasks", "videos", "episode_stats", "frames_ext", "features"):
        assert db.sql(f"SELECT count(*) FROM {view}").fetchall() == orig_db.sql(
            f"SELECT count(*) FROM {view}").fetchall(), view
    assert {r[0] for r in db.sql("SELECT DISTINCT video_key FROM videos").fetchall()} == {FRONT, WRIST}
    assert sorted(db.sql("SELECT video_key, path FROM videos").fetchall()) == sorted(
        (RENAME[k], p.replace(k, RENAME[k])) for k, p in orig_db.sql("SELECT video_key, path FROM videos").fetchall())
    assert db.tasks() == {i: TASK_PREFIX + t for i, t in orig_db.tasks().items()}
    assert sorted(r[0] for r in db.sql("SELECT name FROM features").fetchall()) == sorted(
        RENAME.get(r[0], r[0]) for r in orig_db.sql("SELECT name FROM features").fetchall())
    quoted = '"' + STATE.replace('"', '""') + '"'
    assert db.sql(f"SELECT {quoted} FROM frames ORDER BY index").fetchall() == orig_db.sql(
        'SELECT "observation.state" FROM frames ORDER BY index').fetchall()
    got = db.sql("SELECT feature, stat, value FROM episode_stats WHERE episode_index = 2").fetchall()
    assert sorted(got) == sorted((RENAME.get(f, f), s, v) for f, s, v in orig_db.sql(
        "SELECT feature, stat, value FROM episode_stats WHERE episode_index = 2").fetchall())
    assert {f for f, _, _ in got} >= {STATE, FRONT, WRIST}


def test_frames_ext_and_temporal_macros(pair):
    orig_db, db = pair
    quoted = '"' + (STATE + ".speed").replace('"', '""') + '"'
    assert db.sql(f"SELECT {quoted} FROM frames_ext ORDER BY index").fetchall() == orig_db.sql(
        'SELECT "observation.state.speed" FROM frames_ext ORDER BY index').fetchall()
    col = '"' + STATE.replace('"', '""') + '"'
    pred = f"{col}[1] > 0"
    got = db.sql(f"SELECT * FROM segments({pred}, 0.2) ORDER BY ALL").fetchall()
    want = orig_db.sql('SELECT * FROM segments("observation.state"[1] > 0, 0.2) ORDER BY ALL').fetchall()
    assert got == want and len(want) > 0
    assert db.sql(f"SELECT * FROM event_windows({pred}, 0.2, 0.3) ORDER BY ALL").fetchall() == orig_db.sql(
        'SELECT * FROM event_windows("observation.state"[1] > 0, 0.2, 0.3) ORDER BY ALL').fetchall()
    lit = "'" + FRONT.replace("'", "''") + "'"
    got = db.sql(f"SELECT index, camera_frame_index, pts FROM nearest_camera_frame({lit}) ORDER BY index").fetchall()
    want = orig_db.sql("SELECT index, camera_frame_index, pts FROM nearest_camera_frame('observation.images.front') "
                       "ORDER BY index").fetchall()
    assert got == want and len(want) == db.sql("SELECT count(*) FROM frames").fetchall()[0][0]
    # Element names from info.json's `names` become frames_ext columns and element_index() cases.
    name = "'" + ACTION_NAME.replace("'", "''") + "'"
    assert db.sql(f"SELECT element_index('action', {name})").fetchall() == [(6,)]
    quoted = '"' + ("action." + ACTION_NAME).replace('"', '""') + '"'
    assert db.sql(f"SELECT {quoted} FROM frames_ext ORDER BY index").fetchall() == orig_db.sql(
        'SELECT "action.gripper.pos" FROM frames_ext ORDER BY index').fetchall()


@pytest.mark.parametrize("name", ["small20", "v21_small20"])
def test_a_crafted_camera_key_cannot_rewrite_the_video_join(datasets, tmp_path, name):
    """``x' OR '1'='1`` as the only hostile name parses when pasted unquoted into the manifest's video join (it joined
    every camera row of every episode): items must still be the original's, frame for frame."""
    rename = {"observation.images.front": FRONT}
    hostile = _hostile_copy(datasets / name, tmp_path / name, rename)
    sql = "SELECT index FROM frames WHERE episode_index IN (2, 5) ORDER BY index"
    a, b = lsql.connect(datasets / name).dataset(sql), lsql.connect(hostile).dataset(sql)
    assert len(a) == len(b) > 0
    for i in (0, len(a) // 2, len(a) - 1):
        _assert_same_item(a[i], b[i], rename)


# ---- A symlinked dataset (the Hugging Face hub cache layout) ----------------------------------------------------


def _hub_snapshot(orig: Path, base: Path) -> Path:
    """``base/datasets--org--name/snapshots/<rev>/...`` with every file a relative symlink into ``../../blobs/<sha>``,
    as ``huggingface_hub.snapshot_download`` leaves it."""
    import hashlib

    repo = base / f"datasets--org--{orig.name}"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    for f in sorted(orig.rglob("*")):
        if f.is_file():
            h = hashlib.sha256(f.read_bytes()).hexdigest()
            if not (blobs / h).exists():
                shutil.copy(f, blobs / h)
            dst = snap / f.relative_to(orig)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blobs / h, dst.parent), dst)
    return snap


@pytest.mark.parametrize("name", ["small20", "v21_small20"])
def test_a_hub_cache_snapshot_works_and_the_sandbox_still_confines(datasets, tmp_path, name):
    snap = _hub_snapshot(datasets / name, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(datasets / name / "meta/info.json", outside / "secret.json")
    (snap / "extra").mkdir()
    os.symlink(outside / "secret.json", snap / "extra/secret.json")  # a symlink out of the dataset: never readable
    orig = lsql.connect(datasets / name)
    with pytest.warns(UserWarning, match="symlinks to files outside"):
        db = lsql.connect(snap)
        n = db.sql("SELECT count(*) FROM frames").fetchall()
    assert n == orig.sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]
    for view in ("episodes", "tasks", "videos", "episode_stats"):
        assert db.sql(f"SELECT count(*) FROM {view}").fetchall() == orig.sql(f"SELECT count(*) FROM {view}").fetchall()
    assert db.sql("SELECT count(*), sum(pts) FROM video_frames").fetchall() == orig.sql(
        "SELECT count(*), sum(pts) FROM video_frames").fetchall()
    sql = "SELECT index FROM frames WHERE episode_index IN (1, 4) ORDER BY index"
    a, b = orig.dataset(sql), db.dataset(sql)
    assert len(a) == len(b) > 0
    for i in (0, len(a) // 2, len(a) - 1):
        _assert_same_item(a[i], b[i], {}, "")
    # The second wall (db.con skips the query checks): the dataset's own blobs read, nothing else does.
    import duckdb

    info = snap / "meta/info.json"
    assert db.con.sql(f"SELECT count(*) FROM read_json_objects('{info}')").fetchall() == [(1,)]
    for path in (snap / "extra/secret.json", outside / "secret.json", "/etc/passwd"):
        with pytest.raises(duckdb.PermissionException):
            db.con.sql(f"SELECT * FROM read_text('{path}')").fetchall()
    with pytest.raises(duckdb.PermissionException):
        db.con.sql(f"SELECT * FROM glob('{snap.parent.parent / 'blobs'}/*')").fetchall()


# ---- Symlinks out of the dataset: the Python readers apply the SQL sandbox's rule ----------------------------------
MP4 = "videos/observation.images.front/chunk-000/file-000.mp4"
DATA = "data/chunk-000/file-000.parquet"


def _link_out(snap: Path, rel: str, src_file: Path, outside: Path) -> Path:
    """Replace the snapshot's symlink ``rel`` by one to a copy of ``src_file`` outside the dataset and its blobs."""
    outside.mkdir(exist_ok=True)
    target = outside / (rel.replace("/", "_"))
    shutil.copy(src_file, target)
    os.unlink(snap / rel)
    os.symlink(target, snap / rel)
    return target


@pytest.mark.parametrize("rel", [MP4, DATA])
def test_a_file_symlinked_out_of_the_dataset_is_never_served(datasets, tmp_path, rel):
    orig = lsql.connect(datasets / "small20")
    snap = _hub_snapshot(datasets / "small20", tmp_path / "hub")
    good = lsql.connect(snap, cache_dir=tmp_path / "good_cache")  # the legit hub layout: exact items
    sql = "SELECT index FROM frames WHERE episode_index IN (1, 4) ORDER BY index"
    a, b = orig.dataset(sql), good.dataset(sql)
    assert len(a) == len(b) == 404
    for i in (0, 201, 403):
        _assert_same_item(a[i], b[i], {}, "")
    manifest = good.manifest(sql)
    # Another dataset's file (same features, other codec or episodes) behind a symlink out of the dataset.
    target = _link_out(snap, rel, datasets / ("h264_20" if rel == MP4 else "multifile60") / rel, tmp_path / "out")
    with pytest.warns(UserWarning, match="symlinks to files outside"):
        db = lsql.connect(snap, cache_dir=tmp_path / "bad_cache")
        _ = db.con
    refused = rf"{snap / rel}: is a symlink to {target}, outside the dataset root"
    makers = {"sql": lambda: db.dataset(sql), "all": lambda: db.dataset(), "manifest": lambda: db.dataset(manifest),
              "episodes": lambda: db.dataset(episodes=[1]),
              "export": lambda: db.export(sql, tmp_path / "exported", progress=False)}
    if rel == DATA:  # a manifest names the mp4s without opening them; the data is read to build it
        makers["export_manifest"] = lambda: db.export_manifest(sql, tmp_path / "m.parquet")
    for what, make in makers.items():
        with pytest.raises(lsql.DatasetFormatError, match=refused):
            make()
            pytest.fail(what)
    assert not (tmp_path / "exported").exists() and not (tmp_path / "m.parquet").exists()
    # Below db.dataset(): every reader of a file goes through the same check.
    with pytest.raises(lsql.DatasetFormatError, match=refused):
        db.source.open(rel)
    with pytest.raises(lsql.DatasetFormatError, match=refused):
        db.source.local_path(rel)
    with pytest.raises(lsql.DatasetFormatError, match=refused):
        db.source.identity(rel)
    assert db.source.symlink_targets()[1] == [str(snap / rel)]


def test_a_folder_symlinked_out_of_the_dataset_is_refused(datasets, tmp_path):
    snap = _hub_snapshot(datasets / "small20", tmp_path / "hub")
    folder = snap / "videos/observation.images.wrist"
    outside = tmp_path / "elsewhere"
    shutil.copytree(datasets / "h264_20/videos/observation.images.wrist", outside)
    shutil.rmtree(folder)
    os.symlink(outside, folder)
    db = lsql.connect(snap, cache_dir=tmp_path / "cache")
    with pytest.raises(lsql.DatasetFormatError, match=rf"is a symlink to {outside}/chunk-000/file-000.mp4"):
        db.dataset("SELECT index FROM frames WHERE episode_index = 2")
    # Tabular items do not open the mp4s of a camera left out.
    ds = db.dataset("SELECT index FROM frames WHERE episode_index = 2", cameras=["observation.images.front"])
    assert int(ds[0]["episode_index"]) == 2


def test_symlinks_are_resolved_once_per_file_not_per_item(datasets, tmp_path, monkeypatch):
    snap = _hub_snapshot(datasets / "small20", tmp_path / "hub")
    ds = lsql.connect(snap, cache_dir=tmp_path / "cache").dataset("SELECT index FROM frames WHERE episode_index < 3")
    ds[0]
    calls = []
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p, *a, **k: calls.append(p) or real(p, *a, **k))
    for i in range(0, len(ds), 7):
        ds[i]
    assert calls == []


def _edit_info(root: Path, fn) -> None:
    p = root / "meta/info.json"
    info = json.loads(p.read_text())
    fn(info)
    p.write_text(json.dumps(info))


@pytest.mark.parametrize("twin", ["action", "observation.images.front"])
def test_feature_names_differing_only_by_case_are_refused(datasets, tmp_path, twin):
    # DuckDB identifiers ignore ASCII case: `"ACTION"[1]` read action's values, and camera FRONT's meta/episodes
    # pointers (videos/<key>/file_index) resolved to camera front's.
    root = tmp_path / "case"
    shutil.copytree(datasets / "small20", root)
    upper = twin.upper() if twin == "action" else "observation.images.FRONT"
    if twin == "action":
        f = root / "data/chunk-000/file-000.parquet"
        t = pq.read_table(f)
        neg = pa.compute.negate(t["action"].combine_chunks().flatten())
        pq.write_table(t.append_column(upper, pa.FixedSizeListArray.from_arrays(neg, 6)), f)
    _edit_info(root, lambda j: j["features"].__setitem__(upper, dict(j["features"][twin])))
    with pytest.raises(lsql.DatasetFormatError, match=rf"features '{twin}' and '{upper}' differ only by letter case"):
        lsql.connect(root)


def test_element_names_never_take_another_columns_meaning(datasets, tmp_path):
    root = tmp_path / "names"
    shutil.copytree(datasets / "small20", root, ignore=shutil.ignore_patterns("videos"))
    names = {"observation.state": ["delta", "velocity", "A", "a", "x", "x"],
             "action": ["Speed", "b", "c", "d", "e", "f"]}
    _edit_info(root, lambda j: [j["features"][k].__setitem__("names", v) for k, v in names.items()])
    with pytest.warns(UserWarning, match=r"frames_ext: 5 column name\(s\) .*'observation.state.A' is claimed by "
                                         r"elements 3, 4 of 'observation.state'; 'observation.state.x' is claimed "
                                         r"by elements 5, 6 of 'observation.state'"):
        db = lsql.connect(root)
        cols = db.sql("SELECT * FROM frames_ext LIMIT 0").columns
    state = [c for c in cols if c.startswith("observation.state.")]
    assert state == ["observation.state.delta", "observation.state.velocity", "observation.state.speed"]
    assert "action.Speed" not in cols and "action.speed" in cols and "action.b" in cols
    # The derived columns keep their documented meaning (F[t] - F[t-1]), not element 1's value.
    got = db.sql('SELECT "observation.state.delta", "action.b", action[2] FROM frames_ext ORDER BY index '
                 'LIMIT 1 OFFSET 1').fetchall()[0]
    s = db.sql('SELECT "observation.state" FROM frames ORDER BY index LIMIT 2').fetchall()
    assert got[0] == pytest.approx([b - a for a, b in zip(s[0][0], s[1][0])]) and got[1] == got[2]
    with pytest.raises(lsql.QueryError):
        db.sql('SELECT "observation.state.a" FROM frames_ext').fetchall()
    assert db.sql("SELECT element_index('observation.state', 'a'), element_index('observation.state', 'A')"
                  ).fetchall() == [(4, 3)]
    with pytest.raises(lsql.QueryError, match="element_index: unknown feature/name"):
        db.sql("SELECT element_index('observation.state', 'x')").fetchall()


def test_a_folder_symlinked_out_of_the_root_is_warned_about_at_connect(datasets, tmp_path):
    # Files symlinked out were warned about; a symlinked folder was skipped silently (DuckDB still refuses it).
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root, ignore=shutil.ignore_patterns("videos"))
    outside = tmp_path / "outside_private"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOPSECRET\n")
    os.symlink(outside, root / "meta/extra")
    os.symlink(root / "meta/episodes", root / "meta/alias")  # inside the root: no warning
    with pytest.warns(UserWarning, match=rf"1 file\(s\) or folder\(s\) under the dataset root are symlinks to files "
                                         rf"outside it \(e\.g\. {root}/meta/extra -> {outside}\)"):
        db = lsql.connect(root)
        assert db.sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]
    assert db.source.symlink_targets() == ([], [str(root / "meta/extra")])
    with pytest.raises(Exception, match="Permission Error"):
        db.con.sql(f"SELECT content FROM read_text('{root}/meta/extra/secret.txt')").fetchall()


# ---- JSON nested 100,000 deep: a DatasetFormatError naming the file, never a bare RecursionError ------------------
DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON; Python's parser gives up past ~1,000 levels (RecursionError)


def _deep_value_in(text: str) -> str:
    """The JSON object ``text`` with one more key whose value is :data:`DEEP`."""
    return text.rstrip().removesuffix("}") + ', "deep": ' + DEEP + "}"


def _too_deep(e: Exception, *needles: str) -> None:
    msg = str(e)
    assert "nested too deeply" in msg and not isinstance(e, RecursionError), msg
    for n in needles:
        assert n in msg, (n, msg)


@pytest.mark.parametrize("how", ["whole", "value"])
def test_deep_info_json_is_a_format_error_at_connect(datasets, tmp_path, how):
    """100,000-deep JSON in meta/info.json (the whole file, or one value of a valid object) raised a bare
    RecursionError from connect(); now a DatasetFormatError naming the file and the fix, at connect()."""
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    info = root / "meta/info.json"
    info.write_text(DEEP if how == "whole" else _deep_value_in(info.read_text()))
    with pytest.raises(lsql.DatasetFormatError) as e:
        lsql.connect(root)
    _too_deep(e.value, str(info), "restore it from the dataset's source")


@pytest.mark.parametrize("how", ["whole", "value"])
def test_deep_stats_json_is_a_format_error_at_stats(datasets, tmp_path, how):
    """The same in meta/stats.json: connect() does not read it; db.stats() and ds.meta.stats (stats="dataset") raise
    the DatasetFormatError naming the file, and doctor reports it as the stats_json_valid violation."""
    from lerobot_sql import doctor

    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    stats = root / "meta/stats.json"
    stats.write_text(DEEP if how == "whole" else _deep_value_in(stats.read_text()))
    db = lsql.connect(root)
    with pytest.raises(lsql.DatasetFormatError) as e:
        db.stats()
    _too_deep(e.value, str(stats), "compute_stats")
    ds = db.dataset(episodes=[0], stats="dataset")
    with pytest.raises(lsql.DatasetFormatError) as e:
        _ = ds.meta.stats
    _too_deep(e.value, str(stats))
    check = {c.name: c for c in doctor.run(db, check_video=False).checks}["stats_json_valid"]
    assert not check.ok and "nested too deeply" in check.sample[0]["error"]


@pytest.mark.parametrize("rel, reads", [
    ("meta/episodes.jsonl", "SELECT count(*) FROM episodes"),
    ("meta/tasks.jsonl", "SELECT count(*) FROM tasks"),
    ("meta/episodes_stats.jsonl", "SELECT count(*) FROM episode_stats"),
])
def test_deep_jsonl_line_is_a_format_error_naming_file_and_line(datasets, tmp_path, rel, reads):
    """A 100,000-deep value on line 3 of a v2.1 JSON-lines file: a DatasetFormatError naming the file and line, at
    the first query that reads it (connect() reads info.json only) and at dataset(), which reads the metadata
    without DuckDB."""
    root = tmp_path / "v21"
    shutil.copytree(datasets / "v21_small20", root)
    path = root / rel
    lines = path.read_text().splitlines()
    lines[2] = _deep_value_in(lines[2])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(lsql.DatasetFormatError) as e:
        lsql.connect(root).sql(reads).fetchall()
    _too_deep(e.value, f"{path}:3", "restore it from the dataset's source")
    with pytest.raises(lsql.DatasetFormatError) as e:
        lsql.connect(root).dataset()
    _too_deep(e.value, f"{path}:3")


def test_deep_pandas_metadata_of_tasks_parquet_is_a_format_error(datasets, tmp_path):
    """meta/tasks.parquet keeps the task text as a pandas index, found through its pandas schema metadata (JSON):
    100,000 deep there is a DatasetFormatError naming the file, at the first query (which reads the tasks)."""
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    path = root / "meta/tasks.parquet"
    t = pq.read_table(path)
    pq.write_table(t.replace_schema_metadata({b"pandas": DEEP.encode()}), path)
    with pytest.raises(lsql.DatasetFormatError) as e:
        lsql.connect(root).sql("SELECT count(*) FROM tasks").fetchall()
    _too_deep(e.value, str(path), "pandas metadata", "restore the file from the dataset's source")


def test_deep_episodes_jsonl_of_an_http_root_is_a_format_error_at_connect(datasets, tmp_path):
    """Over HTTP (no directory listing) connect() reads meta/episodes.jsonl to list the files: the deep line is
    a DatasetFormatError naming its URL and line there."""
    from http_range_server import RangeServer

    root = tmp_path / "served" / "v21"
    shutil.copytree(datasets / "v21_small20", root)
    path = root / "meta/episodes.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = _deep_value_in(lines[2])
    path.write_text("\n".join(lines) + "\n")
    with RangeServer(tmp_path / "served") as srv:
        with pytest.raises(lsql.DatasetFormatError) as e:
            lsql.connect(f"{srv.url}/v21", cache_dir=tmp_path / "cache")
    _too_deep(e.value, "meta/episodes.jsonl:3")


def test_deep_manifest_metadata_is_a_contract_error_naming_the_file(datasets, tmp_path):
    """A manifest file whose lerobot_sql.manifest (or lerobot_sql.collection) metadata is 100,000 deep: the
    ResultContractError a malformed one gets, naming the file and the fix (write it again), not a RecursionError."""
    db = lsql.connect(datasets / "small20")
    m = db.manifest("SELECT episode_index FROM episodes WHERE episode_index = 1")
    path = tmp_path / "m.parquet"
    pq.write_table(m.replace_schema_metadata({b"lerobot_sql.manifest": DEEP.encode()}), path)
    with pytest.raises(lsql.ResultContractError) as e:
        db.dataset(path)
    _too_deep(e.value, "export_manifest")
    coll = lsql.connect_many([datasets / "small20", datasets / "multifile60"])
    cm = coll.manifest("SELECT dataset, episode_index FROM episodes WHERE episode_index = 1")
    with pytest.raises(lsql.ResultContractError) as e:
        coll.dataset(cm.replace_schema_metadata({b"lerobot_sql.collection": DEEP.encode()}))
    _too_deep(e.value, "Collection.manifest")


# ---- hostile review 7 (metadata) ------------------------------------------------------------------------------
def test_a_video_path_without_video_key_is_refused_when_there_are_several_cameras(datasets, tmp_path):
    """Every camera would read the same mp4 (the wrist key carrying front pictures, silently): refused at connect,
    naming the template and the fix."""
    from lerobot_sql.errors import DatasetFormatError

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    _edit_info(root, lambda i: i.update(video_path="videos/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"))
    with pytest.raises(DatasetFormatError, match=r"no \{video_key\}.*2 video features"):
        lsql.connect(root)


def _edit_pointer(root: Path, column: str, values) -> None:
    p = next((root / "meta/episodes").rglob("*.parquet"))
    t = pq.read_table(p)
    pq.write_table(t.set_column(t.column_names.index(column), column, pa.array(values)), p)


@pytest.mark.parametrize("value", [0.5, 2 ** 63 + 5])
def test_a_pointer_that_is_no_whole_number_is_a_format_error_naming_the_column(datasets, tmp_path, value):
    """An episode_index of 0.5, a dataset_from_index beyond int64: a DatasetFormatError naming meta/episodes and
    the column (was pyarrow's bare ArrowInvalid from db.dataset)."""
    from lerobot_sql.errors import DatasetFormatError

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    t = pq.read_table(next((root / "meta/episodes").rglob("*.parquet")))
    if value == 0.5:
        col, vals = "episode_index", [0.5] + [float(x) for x in t["episode_index"].to_pylist()[1:]]
    else:
        col, vals = "dataset_from_index", pa.array([value] + t["dataset_from_index"].to_pylist()[1:], pa.uint64())
    _edit_pointer(root, col, vals)
    with pytest.raises(DatasetFormatError, match=f"meta/episodes.*{col}"):
        lsql.connect(root).dataset(episodes=[1])


def test_a_nan_clip_bound_is_named_not_blamed_on_the_intact_clips(datasets, tmp_path):
    """Episode 0's from_timestamp NaN: the open of episode 1 (same mp4) names episode 0 and its NaN; before, every
    item said the clips of "episodes 1-0" sat 348 frames late and advised shifting 19 intact clips."""
    from lerobot_sql.errors import DatasetFormatError

    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    col = "videos/observation.images.front/from_timestamp"
    t = pq.read_table(next((root / "meta/episodes").rglob("*.parquet")))
    _edit_pointer(root, col, [float("nan")] + t[col].to_pylist()[1:])
    with pytest.raises(DatasetFormatError, match="episode 0, camera 'observation.images.front'.*not finite"):
        lsql.connect(root).dataset(episodes=[1])[0]
    ds = lsql.connect(root).dataset(episodes=[1], cameras=["observation.images.wrist"])  # the way out it names
    assert ds[0]["observation.images.wrist"].shape[0] == 3
