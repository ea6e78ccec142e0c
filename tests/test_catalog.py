"""Views of lerobot_sql/catalog.py checked against the files read with pyarrow."""

from __future__ import annotations

import glob
import json
import shutil
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import data_root, language_copy


@pytest.mark.parametrize("name", ["small20", "g1_real_v30", "img5_extras"])
def test_episode_stats_is_every_stats_column_of_meta_episodes(name):
    root = data_root(name)
    t = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(str(root / "meta/episodes/*/*.parquet")))],
                         promote_options="permissive")
    want = {}
    for c in t.column_names:
        if not c.startswith("stats/"):
            continue
        feature, stat = c[len("stats/"):].rsplit("/", 1)
        for ep, v in zip(t["episode_index"].to_pylist(), t[c].to_pylist()):
            want[(ep, feature, stat)] = None if v is None else np.asarray(v, np.float64).ravel().tolist()
    got = {(e, f, s): v for e, f, s, v in lsql.connect(root).sql(
        "SELECT episode_index, feature, stat, value FROM episode_stats").fetchall()}
    assert len(want) > 0 and got.keys() == want.keys()
    assert all(got[k] == want[k] for k in want)


@pytest.mark.parametrize("name,dup", [("small20", "index"), ("small20", "text"), ("v21_small20", "index"),
                                      ("v21_small20", "text")])
def test_a_task_listed_twice_is_refused(datasets, tmp_path, name, dup):
    # Two rows for task_index 0: items carried the injected (last) text and a SQL join with tasks doubled rows.
    root = tmp_path / name
    shutil.copytree(datasets / name, root, ignore=shutil.ignore_patterns("videos"))
    if name == "small20":
        p = root / "meta/tasks.parquet"
        t = pq.read_table(p)
        row = {"task_index": [0 if dup == "index" else 99], "__index_level_0__": [
            "EVIL TASK TEXT" if dup == "index" else t["__index_level_0__"][0].as_py()]}
        pq.write_table(pa.concat_tables([t, pa.table(row).cast(t.schema)]), p)
    else:
        p = root / "meta/tasks.jsonl"
        first = json.loads(p.read_text().splitlines()[0])
        extra = {"task_index": 0, "task": "EVIL TASK TEXT"} if dup == "index" else {**first, "task_index": 99}
        p.write_text(p.read_text() + json.dumps(extra) + "\n")
    what = r"task_index 0 is listed twice" if dup == "index" else r"task '[^']+' is listed twice .* task_index 0 and 99"
    db = lsql.connect(root)
    with pytest.raises(lsql.DatasetFormatError, match=rf"meta/tasks\.(parquet|jsonl): {what}"):
        db.sql("SELECT count(*) FROM frames f JOIN tasks t USING (task_index)").fetchall()
    with pytest.raises(lsql.DatasetFormatError, match=what):
        lsql.connect(root).dataset(episodes=[0], cameras=[])


@pytest.mark.parametrize("col", ["filename", "file_row_number", "FILE_ROW_NUMBER"])
def test_a_data_column_named_like_duckdbs_file_columns(datasets, tmp_path, col):
    # _frames_loc asks read_parquet for the file name and row number columns; a data column of either name made
    # connect report the files as corrupt ("re-download").
    root = tmp_path / "vcol"
    shutil.copytree(datasets / "small20", root, ignore=shutil.ignore_patterns("videos"))
    f = root / "data/chunk-000/file-000.parquet"
    t = pq.read_table(f)
    n = t.num_rows
    v = pa.array(["elsewhere.parquet"] * n) if col == "filename" else pa.array([min(i + 10, n - 1) for i in range(n)])
    pq.write_table(t.append_column(col, v), f)
    db = lsql.connect(root)
    if col != "filename":
        with pytest.raises(lsql.DatasetFormatError, match=rf"data column '{col}' has the name of DuckDB's row-number"):
            db.sql("SELECT count(*) FROM frames").fetchall()
        return
    assert db.sql("SELECT data_file, row FROM _frames_loc WHERE index = 400").fetchall() == \
        [("data/chunk-000/file-000.parquet", 400)]
    assert db.sql("SELECT DISTINCT filename FROM frames").fetchall() == [("elsewhere.parquet",)]
    ds = db.dataset("SELECT index FROM frames WHERE episode_index = 1 ORDER BY index", cameras=[])
    it = ds[0]
    assert int(it["index"]) == 348 and float(it["action"][0]) == pytest.approx(t["action"][348].as_py()[0])


def test_a_bool_episode_index_in_v21_episodes_jsonl_is_named(datasets, tmp_path):
    root = tmp_path / "v21"
    shutil.copytree(datasets / "v21_small20", root, ignore=shutil.ignore_patterns("videos"))
    p = root / "meta/episodes.jsonl"
    rows = [json.loads(line) for line in p.read_text().splitlines()]
    rows[0]["episode_index"] = True
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(lsql.DatasetFormatError, match=r"meta/episodes\.jsonl: line 1 lacks an integer episode_index"):
        lsql.connect(root).dataset(cameras=[])


@pytest.mark.parametrize("kind", ["string", "struct"])
def test_a_stats_column_that_is_not_numbers_is_left_out_with_a_warning(datasets, tmp_path, kind):
    root = tmp_path / "stats"
    shutil.copytree(datasets / "small20", root, ignore=shutil.ignore_patterns("videos"))
    ep = root / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(ep)
    arr = pa.array(["1e999x"] * t.num_rows) if kind == "string" else pa.array([{"a": 1}] * t.num_rows)
    pq.write_table(t.append_column("stats/action/evil", arr), ep)
    want = lsql.connect(datasets / "small20").sql(
        "SELECT feature, stat, count(*) FROM episode_stats GROUP BY ALL ORDER BY ALL").fetchall()
    with pytest.warns(UserWarning, match=r"1 stats column\(s\) are not numbers .* 'stats/action/evil'"):
        db = lsql.connect(root)
        got = db.sql("SELECT feature, stat, count(*) FROM episode_stats GROUP BY ALL ORDER BY ALL").fetchall()
    assert got == want and len(want) > 10


def test_declared_shape_mismatch_in_sql_names_info_json(datasets, tmp_path):
    """info.json declares observation.state as 7 values where the data holds 6: a query reading it raised DuckDB's
    "Cannot cast list with length 6 to array with length 7" as a QueryError (nothing about info.json), and
    dataset(sql) called it a problem of the query's result types. Now a DatasetFormatError naming the dataset, the
    column, both sizes and the fix; a cast the user writes over another list column keeps DuckDB's own error."""
    from lerobot_sql.errors import DatasetFormatError, QueryError

    src = tmp_path / "src"
    shutil.copytree(datasets / "small20", src)
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["observation.state"]["shape"] = [7]
    (src / "meta/info.json").write_text(json.dumps(info))
    db = lsql.connect(src, cache_dir=tmp_path / "cache")
    want = (r"the data files hold column 'observation.state' as lists of 6 values, but meta/info.json gives it "
            r"shape \[7\]; fix the feature's shape in meta/info.json")
    for sql in ('SELECT "observation.state" FROM frames', 'SELECT "observation.state.speed" FROM frames_ext'):
        with pytest.raises(DatasetFormatError, match=want):
            db.sql(sql).fetchall()
    with pytest.raises(DatasetFormatError, match=want):
        db.dataset("SELECT * FROM frames WHERE episode_index = 1")
    assert db.sql("SELECT count(*) FROM frames").fetchall() == [(info["total_frames"],)]  # other columns read
    with pytest.raises(QueryError, match="Cannot cast") as e:  # the user's own cast: not info.json's
        db.sql("SELECT value::FLOAT[99] FROM episode_stats").fetchall()
    assert not isinstance(e.value, DatasetFormatError)


@pytest.mark.parametrize("where", ["local", "http"])
@pytest.mark.parametrize("damaged", [0, 1])
def test_a_damaged_data_file_leaves_the_metadata_views_readable(datasets, tmp_path, damaged, where, monkeypatch,
                                                                request):
    """One truncated data file (a partial download) made every view fail at the first query, episodes and tasks
    too. Now connect warns naming it; the metadata views read; every query over frames raises naming the file
    (never the other files' rows alone: no frame silently missing); items of the intact file's episodes read.
    The same over HTTP (the file damaged on the server): DuckDB reads it through the piece cache."""
    import contextlib

    import numpy as np

    from http_range_server import RangeServer
    from lerobot_sql.errors import DatasetFormatError

    src = tmp_path / "src"
    shutil.copytree(datasets / "multifile60", src, ignore=shutil.ignore_patterns("videos"))
    rel = f"data/chunk-000/file-{damaged:03d}.parquet"
    assert sorted(p.name for p in (src / "data/chunk-000").iterdir()) == ["file-000.parquet", "file-001.parquet"]
    intact = lsql.connect(src, cache_dir=tmp_path / "c0")
    eps, frames, stats = intact.sql("SELECT count(*), sum(length) FROM episodes").fetchall()[0] + \
        intact.sql("SELECT count(*) FROM episode_stats").fetchall()[0]
    kept = [e for (e,) in intact.sql(f'SELECT episode_index FROM episodes WHERE "data/file_index" != {damaged} '
                                     "ORDER BY 1").fetchall()]
    lost = intact.sql(f'SELECT min(episode_index) FROM episodes WHERE "data/file_index" = {damaged}').fetchall()[0][0]
    want = intact.dataset(episodes=kept[:2], cameras=[])
    (src / rel).write_bytes((src / rel).read_bytes()[:-100])

    stack = contextlib.ExitStack()
    request.addfinalizer(stack.close)
    if where == "http":
        monkeypatch.delenv("LSQL_OFFLINE", raising=False)
        srv = stack.enter_context(RangeServer(tmp_path))
    db = lsql.connect(src if where == "local" else f"{srv.url}/src", cache_dir=tmp_path / "c1")
    with pytest.warns(UserWarning, match=rf"1 of 2 data file\(s\) cannot be read as Parquet .*{rel}: every query "
                                         r"over frames raises"):
        assert db.sql("SELECT count(*), sum(length) FROM episodes").fetchall() == [(eps, frames)]
    assert db.sql("SELECT count(*) FROM episode_stats").fetchall() == [(stats,)]
    assert db.sql("SELECT count(*) FROM tasks").fetchall() == intact.sql("SELECT count(*) FROM tasks").fetchall()
    for sql in ("SELECT count(*) FROM frames", f"SELECT count(*) FROM frames WHERE episode_index = {kept[0]}",
                f"SELECT count(*) FROM frames WHERE episode_index = {lost}",
                f"SELECT * FROM frames_ext WHERE episode_index = {kept[0]}"):
        with pytest.raises(DatasetFormatError, match=rf"{rel}: cannot be read as Parquet .*Re-download"):
            db.sql(sql).fetchall()
    got = db.dataset(f"SELECT episode_index FROM episodes WHERE episode_index IN ({kept[0]}, {kept[1]})", cameras=[])
    assert len(got) == len(want)
    for i in (0, len(want) - 1):
        for k, v in want[i].items():
            assert np.array_equal(np.asarray(got[i][k]), np.asarray(v)), k
    with pytest.raises(DatasetFormatError, match=rf"{rel}: cannot be read as Parquet"):
        db.dataset(episodes=[lost], cameras=[])[0]


def test_info_json_totals_that_disagree_with_meta_episodes_warn(datasets, tmp_path):
    """info.json's total_episodes / total_frames above what meta/episodes lists (a partial meta/ download, a
    converter that left info.json behind) went through in silence; lerobot trusts those totals. Now a warning
    naming the file and both counts; the counts the views give are meta/episodes' own."""
    src = tmp_path / "src"
    shutil.copytree(datasets / "small20", src)
    info = json.loads((src / "meta/info.json").read_text())
    eps, frames = info["total_episodes"], info["total_frames"]
    info.update(total_episodes=eps + 1, total_frames=frames + 100)
    (src / "meta/info.json").write_text(json.dumps(info))
    db = lsql.connect(src, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match=rf"meta/info.json: total_episodes is {eps + 1} but meta/episodes lists "
                                         rf"{eps} episode\(s\); total_frames is {frames + 100} but meta/episodes' "
                                         rf"lengths sum to {frames}\. .*fix the totals"):
        got = db.sql("SELECT count(*), sum(length) FROM episodes").fetchall()
    assert got == [(eps, frames)]


def test_info_json_and_data_columns_that_disagree_warn(datasets, tmp_path):
    """A feature info.json declares but the data files lack, and a vector column the data hold but info.json does
    not declare: each a warning naming the column and the fix (both went through in silence: items without the
    key, an untyped float[] column, an export writing it without a feature entry)."""
    import warnings

    src = tmp_path / "src"
    shutil.copytree(datasets / "small20", src)
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["observation.extra"] = {"dtype": "float32", "shape": [2], "names": None}
    del info["features"]["action"]
    (src / "meta/info.json").write_text(json.dumps(info))
    db = lsql.connect(src, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning) as rec:
        db.sql("SELECT count(*) FROM frames").fetchall()
    msgs = [str(w.message) for w in rec]
    assert any("declares feature(s) ['observation.extra']" in m and "no column" in m for m in msgs), msgs
    assert any("data column(s) ['action']" in m and "declares no feature" in m for m in msgs), msgs
    with warnings.catch_warnings():  # the sample as written: neither
        warnings.simplefilter("error")
        lsql.connect(datasets / "small20", cache_dir=tmp_path / "c2").sql("SELECT count(*) FROM frames").fetchall()


def test_frames_ext_says_why_a_features_names_give_no_columns_once(datasets, tmp_path):
    """observation.state's names listing 2 names for shape [6]: frames_ext left its named columns out without a
    word; action's names all 'j' (6 times): the warning said "'action.j' is claimed by ..." six times. Now one
    warning names the feature and both sizes, and the clash is said once, listing the six elements; the elements
    read as "F"[i], equal to the data file's values."""
    src = tmp_path / "src"
    shutil.copytree(datasets / "small20", src, ignore=shutil.ignore_patterns("videos"))
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["observation.state"]["names"] = ["a", "b"]
    info["features"]["action"]["names"] = ["j"] * 6
    (src / "meta/info.json").write_text(json.dumps(info))
    db = lsql.connect(src, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning) as rec:
        cols = db.sql("SELECT * FROM frames_ext LIMIT 0").columns
    msgs = [str(w.message) for w in rec if "frames_ext" in str(w.message)]
    assert len(msgs) == 2, msgs
    assert "'observation.state' lists 2 name(s) for its 6 elements (shape [6])" in msgs[0]
    assert "feature_names" in msgs[0] and "no named element columns" in msgs[0]
    assert msgs[1].count("claimed by") == 1 and "1 column name(s)" in msgs[1]
    assert "'action.j' is claimed by elements 1, 2, 3, 4, 5, 6 of 'action'." in msgs[1]
    assert not [c for c in cols if c.startswith(("observation.state.", "action.")) and
                not c.endswith((".delta", ".velocity", ".speed"))]
    got = db.sql('SELECT "observation.state"[6], action[1] FROM frames ORDER BY index LIMIT 1').fetchall()[0]
    t = pq.read_table(datasets / "small20" / "data/chunk-000/file-000.parquet").slice(0, 1)
    assert got == pytest.approx((t["observation.state"][0].as_py()[5], t["action"][0].as_py()[0]))


@pytest.mark.parametrize("sql, msg", [
    ("SELECT * FROM nearest_camera_frame('nosuch')", r"nearest_camera_frame: 'nosuch' is not a camera \(video_key\) "
                                                     r"of videos; valid: observation\.images\.front, "
                                                     r"observation\.images\.wrist"),
    ("SELECT * FROM nearest_camera_frame('front')", r"'front' is not a camera"),
    ("SELECT * FROM first_event(frame_index)", r"first_event / event_windows: pred must be a true/false condition "
                                               r"over frames_ext .* not a value of type BIGINT"),
    ("SELECT * FROM first_event('yes')", r"not a value of type VARCHAR"),
    ("SELECT * FROM event_windows(frame_index, 1, 1)", r"pred must be a true/false condition"),
    ("SELECT * FROM segments(\"observation.state\"[1], 0.5)", r"segments: pred must be a true/false condition .* "
                                                            r"type FLOAT"),
    ("SELECT * FROM event_windows(frame_index >= 30, 0, -2)", r"event_windows: before_s and after_s must be seconds "
                                                              r">= 0, not both 0 \(got 0, -2\)"),
    ("SELECT * FROM event_windows(frame_index >= 30, -0.5, 1)", r"must be seconds >= 0, not both 0 \(got -0\.5, 1\)"),
    ("SELECT * FROM event_windows(frame_index >= 30, 0, 0)", r"not both 0 \(got 0, 0\)"),
])
def test_table_macros_refuse_arguments_that_select_nothing(datasets, sql, msg):
    """Before, each of these returned no rows (or, for a number as the predicate, took it for true), with no error."""
    db = lsql.connect(datasets / "small20")
    with pytest.raises(lsql.QueryError, match=msg):
        db.sql(sql).fetchall()


def test_table_macros_with_good_arguments_answer_from_the_data(datasets):
    db = lsql.connect(datasets / "small20")
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    total = db.layout.info["total_frames"]
    assert db.sql("SELECT count(*) FROM nearest_camera_frame('observation.images.front')").fetchall() == [(total,)]
    got = db.sql("SELECT episode_index, frame_index FROM first_event(frame_index >= 30) ORDER BY 1").fetchall()
    assert got == [(e, 30) for e, n in sorted(lengths.items()) if n > 30]
    got = db.sql("SELECT episode_index, start_s, end_s FROM event_windows(frame_index >= 30, 0, 1) ORDER BY 1")
    assert [(e, round(s, 6), round(t, 6)) for e, s, t in got.fetchall()] == \
        [(e, 1.0, round(min(2.0, n / 30), 6)) for e, n in sorted(lengths.items()) if n > 30]
    assert db.sql("SELECT count(*) FROM first_event(NULL)").fetchall() == [(0,)]  # NULL: never true, as before


def test_camera_frames_timestamps_are_the_frame_times_without_float_residue(datasets, tmp_path):
    """camera_frames.timestamp = pts_s - from_timestamp left -1.4e-14 s at the first frame of an episode that starts
    inside an mp4 (multifile60: 32 such frames), so ``timestamp = 0`` missed them; rounded to the nanosecond, every
    frame sits at frame_index / fps (these files' pts fall on the frame grid)."""
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    db.sql("SELECT count(*) FROM video_frames").fetchall()
    n, off_grid, first_not_zero = db.sql(
        "SELECT count(*), count(*) FILTER (WHERE abs(timestamp - frame_index / 30.0) > 1e-9), "
        "count(*) FILTER (WHERE frame_index = 0 AND timestamp <> 0) FROM camera_frames").fetchall()[0]
    want = db.sql("SELECT sum(length) * 2 FROM episodes").fetchall()[0][0]  # two cameras
    assert (n, off_grid, first_not_zero) == (want, 0, 0)
    ts = np.array([r[0] for r in db.sql("SELECT timestamp FROM camera_frames").fetchall()])
    assert not np.signbit(ts).any()  # rounding -1.4e-14 gave -0.0, printed as such by db.nearest and the CLI


# ---- Data files meta/episodes names no episode to, and copies of data files (issue 36) ---------------------------
def _raw_recorder_file(path, n=50):
    """What a recorder leaves beside a dataset's own files: a Parquet file of other columns, no episode_index."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"ts_ns": pa.array(range(n), pa.int64()), "joint_raw": pa.array([0.5] * n)}), path)


def test_v21_files_named_like_episode_files_of_no_episode_are_not_read(datasets, tmp_path):
    """Real v2.1 sets hold raw recorder files named like episode files (data/chunk-001/episode_000123.parquet) that
    no episode of meta/episodes.jsonl names: frames took their rows in (NULL episode_index, their columns added to
    the view) and doctor's stray check said ok. v2's episode -> file map is known (data_path with episode_chunk =
    episode_index // chunks_size): files outside it, whose rows are no episode's own, are strays, not read, named
    in a warning at the first query (and by doctor: test_doctor)."""
    root = tmp_path / "v21"
    shutil.copytree(datasets / "v21_small20", root, ignore=shutil.ignore_patterns("videos"))
    strays = ["data/chunk-000/episode_000020.parquet", "data/chunk-001/episode_000123.parquet"]
    for rel in strays:
        _raw_recorder_file(root / rel)
    info = json.loads((root / "meta/info.json").read_text())
    pristine = lsql.connect(datasets / "v21_small20")
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    assert db.layout.stray_data_files == ()  # every name matches data_path: only the map tells them apart
    with pytest.warns(UserWarning, match=r"2 data file\(s\) match info.json's data_path but no episode of "
                                         r"meta/episodes.jsonl names them.*not read as frames \(data/chunk-000/"
                                         r"episode_000020.parquet: .*data/chunk-001/episode_000123.parquet: .*"
                                         r"data_files_stray"):
        got = db.sql("SELECT count(*), count(episode_index), count(index) FROM frames").fetchall()
    assert got == [(info["total_frames"],) * 3]
    assert db.sql("SELECT * FROM frames LIMIT 0").columns == pristine.sql("SELECT * FROM frames LIMIT 0").columns
    sql = "SELECT index FROM frames WHERE episode_index = 3 ORDER BY index"
    assert db.sql(sql).fetchall() == pristine.sql(sql).fetchall()
    ds = db.dataset("SELECT index FROM frames WHERE index % 100 = 7", cameras=[])
    assert len(ds) == len(pristine.sql("SELECT index FROM frames WHERE index % 100 = 7").fetchall())
    assert db.sql("SELECT path, reason FROM _data_files_stray ORDER BY path").fetchall() == \
        [(rel, "no episode of meta/episodes.jsonl names it and it has no episode_index column") for rel in strays]


def test_v3_copy_of_a_data_file_no_episode_points_to_is_not_read(datasets, tmp_path):
    """A half-finished merge left data/chunk-000/file-001.parquet, a copy of file-000, that no episode of
    meta/episodes points to: every SQL count doubled without a word, and an index query was refused with "index
    values that are not in the data files (e.g. [])". The copy is a stray now (its episodes' rows are all in the
    files meta/episodes points to), not read, named at the first query."""
    root = tmp_path / "s"
    shutil.copytree(datasets / "small20", root, ignore=shutil.ignore_patterns("videos"))
    shutil.copy(root / "data/chunk-000/file-000.parquet", root / "data/chunk-000/file-001.parquet")
    info = json.loads((root / "meta/info.json").read_text())
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match=r"1 data file\(s\) match info.json's data_path but no episode of "
                                         r"meta/episodes points to them.*file-001.parquet.*rows of its episodes are "
                                         r"in the files meta/episodes points to"):
        got = db.sql("SELECT count(*), count(DISTINCT index) FROM frames").fetchall()
    assert got == [(info["total_frames"], info["total_frames"])]
    ds = db.dataset("SELECT index FROM frames WHERE episode_index = 2", cameras=[])
    assert len(ds) == db.sql("SELECT length FROM episodes WHERE episode_index = 2").fetchall()[0][0]
    assert db.sql("SELECT path FROM _data_files_stray").fetchall() == [("data/chunk-000/file-001.parquet",)]


def test_a_file_of_no_episode_whose_rows_are_an_episodes_own_is_still_read(datasets, tmp_path):
    """The stray rule must not drop real rows: lerobot issue #2401's converter pointed the first episode of a new
    data file at the previous file; when the new file holds only that episode, no episode points to it. Its rows
    are the only rows of an episode of meta/episodes, so it is read (doctor's data_file_pointers names the
    pointer)."""
    root = tmp_path / "m"
    shutil.copytree(datasets / "multifile60", root, ignore=shutil.ignore_patterns("videos"))
    rel = "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(root / rel)
    t = t.set_column(t.column_names.index("data/file_index"), "data/file_index",
                     pa.array([0] * t.num_rows, t.schema.field("data/file_index").type))
    pq.write_table(t, root / rel)
    info = json.loads((root / "meta/info.json").read_text())
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    assert db.sql("SELECT count(*), count(DISTINCT episode_index) FROM frames").fetchall() == \
        [(info["total_frames"], info["total_episodes"])]
    assert db.sql("SELECT count(*) FROM _data_files_stray").fetchall() == [(0,)]


@pytest.mark.parametrize("name, src, dst", [
    ("multifile60", "data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet"),
    ("v21_small20", "data/chunk-000/episode_000005.parquet", "data/chunk-000/episode_000006.parquet")])
def test_a_data_file_whose_rows_repeat_anothers_is_named_at_the_first_query(datasets, tmp_path, name, src, dst):
    """A data file meta/episodes does point to, overwritten by a copy of another (a half-finished merge): every SQL
    count over the copied rows doubled with no warning, and an index query was refused with "index values that are
    not in the data files (e.g. [])". Now the first query warns naming both files and how many rows repeat, and
    the index query says the values are held more than once."""
    root = tmp_path / name
    shutil.copytree(datasets / name, root, ignore=shutil.ignore_patterns("videos"))
    shutil.copy(root / src, root / dst)
    n = pq.read_metadata(root / src).num_rows
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match=rf"{dst}: {n} of its {n} rows repeat `index` values that {src} holds.*"
                                         r"counted twice"):
        db.sql("SELECT count(*) FROM episodes").fetchall()
    ep = pq.read_table(root / src, columns=["episode_index"])["episode_index"][0].as_py()
    with pytest.raises(lsql.ResultContractError, match=r"more than once in the data files \(e\.g\. index \d+ "
                                                       rf"in {src} and {dst}\)"):
        db.dataset(f"SELECT index FROM frames WHERE episode_index = {ep}", cameras=[])


def test_the_repeated_rows_finding_is_kept_per_version_of_the_data_files(datasets, tmp_path, monkeypatch):
    """The footer check (100,000 row groups: 1.5 s and 640 MB at each connect) is kept in the cache folder under the
    data files' versions: the next connect parses no footer and still warns; a changed file is judged again."""

    name, src, dst = "multifile60", "data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet"
    root = tmp_path / name
    shutil.copytree(datasets / name, root, ignore=shutil.ignore_patterns("videos"))
    shutil.copy(root / src, root / dst)
    with pytest.warns(UserWarning, match=rf"{dst}: .* rows repeat"):
        lsql.connect(root, cache_dir=tmp_path / "cache").sql("SELECT count(*) FROM episodes").fetchall()
    import pyarrow.parquet as pq

    real = pq.read_metadata
    monkeypatch.setattr(pq, "read_metadata", lambda *a, **k: pytest.fail("a footer parsed again"))
    with pytest.warns(UserWarning, match=rf"{dst}: .* rows repeat"):
        lsql.connect(root, cache_dir=tmp_path / "cache").sql("SELECT count(*) FROM episodes").fetchall()
    monkeypatch.setattr(pq, "read_metadata", real)
    shutil.copy(datasets / name / dst, root / dst)  # repaired: a new version, judged again, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lsql.connect(root, cache_dir=tmp_path / "cache").sql("SELECT count(*) FROM episodes").fetchall()


@pytest.mark.parametrize("name", ["small20", "v21_small20"])
def test_derived_task_index_is_in_frames_and_items_say_what_they_lack(datasets, tmp_path, name):
    """Data files without task_index (and, v2.1, without index): the warning said both were derived, but the frames
    view had no task_index and items lacked both keys, while another warning said "items and queries will not have
    them". lerobot cannot read such a set (it casts the data to info.json's features; its __getitem__ reads
    item["task_index"]). Now frames carries the derived task_index (the values _frames_loc and the items' `task`
    use), and one warning says plainly that items carry no such key."""
    root = tmp_path / name
    shutil.copytree(datasets / name, root, ignore=shutil.ignore_patterns("videos"))
    dropped = ["index", "task_index"] if name == "v21_small20" else ["task_index"]
    for f in sorted(root.glob("data/*/*.parquet")):
        pq.write_table(pq.read_table(f).drop_columns(dropped), f)
    pristine = lsql.connect(datasets / name)
    one_task = [e for e, t in pristine.sql("SELECT episode_index, tasks FROM episodes").fetchall() if len(t) == 1]
    if name == "v21_small20":  # one task per episode, so task_index can be derived
        lines = [json.loads(x) for x in (root / "meta/episodes.jsonl").read_text().splitlines()]
        (root / "meta/episodes.jsonl").write_text("".join(json.dumps({**x, "tasks": x["tasks"][:1]}) + "\n"
                                                          for x in lines))
    else:
        rel = root / "meta/episodes/chunk-000/file-000.parquet"
        t = pq.read_table(rel)
        t = t.set_column(t.column_names.index("tasks"), "tasks",
                         pa.array([x[:1] for x in t["tasks"].to_pylist()], t.schema.field("tasks").type))
        pq.write_table(t, rel)
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning) as rec:
        cols = db.sql("SELECT * FROM frames LIMIT 0").columns
    msgs = [str(w.message) for w in rec]
    assert "task_index" in cols and "index" in cols
    assert not [m for m in msgs if "will not have them" in m], msgs
    keys = " and ".join(repr(c) for c in dropped)
    assert any(f"items of dataset() carry no {keys} key" in m for m in msgs), msgs
    sql = ("SELECT index, episode_index, task_index FROM frames WHERE episode_index IN "
           f"({', '.join(map(str, one_task))}) ORDER BY index")
    assert db.sql(sql).fetchall() == pristine.sql(sql).fetchall()
    item = db.dataset(f"SELECT index FROM frames WHERE episode_index = {one_task[0]}", cameras=[])[0]
    ref = pristine.dataset(f"SELECT index FROM frames WHERE episode_index = {one_task[0]}", cameras=[])[0]
    assert set(ref) - set(item) == set(dropped) and item["task"] == ref["task"]


def test_data_files_of_one_schema_bind_without_reading_every_footer(datasets, tmp_path):
    """DuckDB's union_by_name reads every data file's footer to bind the frames view (0.7 s at each connect over
    100,000 row groups); files of one Arrow schema (found by the footer survey, kept per version of the files)
    need only the first one's. Files whose columns differ in order keep union_by_name, and read the same values."""
    def frames_sql(db):
        return db.con.sql("SELECT sql FROM duckdb_views() WHERE view_name = 'frames'").fetchall()[0][0]

    root = tmp_path / "multifile60"
    shutil.copytree(datasets / "multifile60", root, ignore=shutil.ignore_patterns("videos"))
    query = "SELECT index, episode_index, frame_index, action[2] AS a FROM frames ORDER BY index"
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    assert "union_by_name" not in frames_sql(db)
    want = db.sql(query).fetchall()
    again = lsql.connect(root, cache_dir=tmp_path / "cache")  # from the kept survey
    assert "union_by_name" not in frames_sql(again) and again.sql(query).fetchall() == want
    f = root / "data/chunk-000/file-001.parquet"
    t = pq.read_table(f)
    pq.write_table(t.select(list(reversed(t.column_names))), f)  # the same columns, in another order
    mixed = lsql.connect(root, cache_dir=tmp_path / "cache")
    assert "union_by_name = true" in frames_sql(mixed)
    assert mixed.sql(query).fetchall() == want and len(want) == pq.read_metadata(f).num_rows + pq.read_metadata(
        root / "data/chunk-000/file-000.parquet").num_rows


def test_features_view_holds_the_depth_entries_and_each_features_whole_info_block(datasets):
    info = json.loads((datasets / "depth4/meta/info.json").read_text())["features"]
    rows = lsql.connect(datasets / "depth4").sql(
        "SELECT name, is_depth_map, depth_unit, depth_min, depth_max, depth_shift, depth_use_log, info "
        "FROM features").fetchall()
    assert [r[0] for r in rows] == list(info)
    for name, is_depth, unit, lo, hi, shift, use_log, block in rows:
        own = info[name].get("info") or {}
        assert json.loads(block) == own  # every key, unknown ones too
        assert is_depth == bool(own.get("is_depth_map")) and unit == (own.get("depth_unit") if is_depth else None)
        quant = (own.get("video.depth_min"), own.get("video.depth_max"), own.get("video.shift"), own.get("video.use_log"))
        # a depth video's quantizer (what lerobot 0.6 decodes with); PNG/TIFF depth images have none
        assert (lo, hi, shift, use_log) == (quant if is_depth and info[name]["dtype"] == "video" else (None,) * 4)
    assert sum(r[1] for r in rows) == 3


SAY = {"type": "function", "function": {"name": "say", "description": "Speak a short utterance to the user.",
                                        "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                                       "required": ["text"]}}}


def test_info_json_tools_are_in_info_and_in_the_tools_view(datasets, tmp_path):
    def with_tools(tools):
        root = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
        shutil.copytree(datasets / "small20", root)
        info = json.loads((root / "meta/info.json").read_text())
        info.update({} if tools is None else {"tools": tools})
        (root / "meta/info.json").write_text(json.dumps(info))
        return lsql.connect(root)

    odd = {"type": "function", "function": {"name": "wave"}, "x-own": [1]}
    db = with_tools([SAY, odd, "not a schema"])
    assert json.loads(db.sql("SELECT tools FROM info").fetchall()[0][0]) == [SAY, odd, "not a schema"]
    got = db.sql("SELECT position, type, name, description, parameters, tool FROM tools ORDER BY position").fetchall()
    assert [r[:4] for r in got] == [(1, "function", "say", SAY["function"]["description"]), (2, "function", "wave", None),
                                    (3, None, None, None)]
    assert [None if r[4] is None else json.loads(r[4]) for r in got] == [SAY["function"]["parameters"], None, None]
    assert [json.loads(r[5]) for r in got] == [SAY, odd, "not a schema"]
    db = with_tools(None)  # none declared: lerobot falls back to its own say tool; SQL shows what the file holds
    assert db.sql("SELECT tools FROM info").fetchall() == [(None,)]
    assert db.sql("SELECT count(*) FROM tools").fetchall() == [(0,)]
    db = with_tools({"say": SAY})
    with pytest.warns(UserWarning, match="'tools' is dict, not a list"):
        assert db.sql("SELECT count(*) FROM tools").fetchall() == [(0,)]
    assert json.loads(db.sql("SELECT tools FROM info").fetchall()[0][0]) == {"say": SAY}


SAY_CALL = {"type": "function", "function": {"name": "say", "arguments": {"text": "on it"}}}
PERSISTENT = {0: [{"role": "assistant", "content": "pick the cube", "style": "subtask", "timestamp": 0.0},
                  {"role": "assistant", "content": "place it", "style": "subtask", "timestamp": 1.5}],
              3: [{"role": "user", "content": "stack them", "style": "plan", "timestamp": 0.0,
                   "tool_calls": [SAY_CALL]}]}
EVENTS = {(0, 10): [{"role": "user", "content": "stop!", "style": "interjection"},
                    {"role": "assistant", "content": None, "style": None, "tool_calls": [SAY_CALL]}],
          (2, 5): [{"role": "user", "content": "where is it?", "style": "vqa", "camera": "observation.images.front"}]}


@pytest.mark.parametrize("inferred", [False, True], ids=["language.py_types", "annotation_writer_types"])
def test_language_view_has_one_row_per_message_written(datasets, tmp_path, inferred):
    import pyarrow as pa

    if not inferred and not hasattr(pa, "json_"):
        pytest.skip("writing lerobot 0.6.1's json extension type (tool_calls) needs pyarrow >= 19 (this one is "
                    f"{pa.__version__}); the newest leg runs it, and the writer's own types run here")
    root = language_copy(datasets / "small20", tmp_path / "lang", PERSISTENT, EVENTS, inferred=inferred)
    db = lsql.connect(root)
    t = pq.read_table(root / "data/chunk-000/file-000.parquet", columns=["episode_index", "frame_index", "index",
                                                                         "timestamp"]).to_pylist()
    frame = {(r["episode_index"], r["frame_index"]): r for r in t}
    want = []
    for ep, msgs in PERSISTENT.items():  # once per episode, at its first frame (lerobot repeats them on every frame)
        for pos, m in enumerate(msgs, 1):
            f = frame[(ep, 0)]
            want.append((ep, 0, f["index"], f["timestamp"], "language_persistent", pos, m["role"], m["content"],
                         m["style"], m["timestamp"], None, m.get("tool_calls")))
    for (ep, fi), msgs in EVENTS.items():  # once, on the frame it fires at (its time: the frame's)
        for pos, m in enumerate(msgs, 1):
            f = frame[(ep, fi)]
            want.append((ep, fi, f["index"], f["timestamp"], "language_events", pos, m["role"], m["content"],
                         m["style"], f["timestamp"], m.get("camera"), m.get("tool_calls")))
    got = db.sql("SELECT episode_index, frame_index, index, timestamp, language_column, position, role, content, style, "
                 "message_timestamp, camera, tool_calls FROM language").fetchall()
    got = [(*r[:-1], None if r[-1] is None else json.loads(r[-1])) for r in got]
    assert sorted(got, key=str) == sorted(want, key=str)
    assert len(got) == sum(map(len, PERSISTENT.values())) + sum(map(len, EVENTS.values()))
    # frames keeps the columns as lerobot stores them: the persistent slice on every frame of its episode
    per_frame = dict(db.sql("SELECT episode_index, count(*) FILTER (WHERE len(language_persistent) = "
                            "CASE episode_index WHEN 0 THEN 2 WHEN 3 THEN 1 ELSE 0 END) = count(*) "
                            "FROM frames GROUP BY ALL").fetchall())
    assert all(per_frame.values()) and len(per_frame) == 20
    assert db.sql("SELECT language_events[2].tool_calls[1]->'function'->>'name' FROM frames "
                  "WHERE episode_index = 0 AND frame_index = 10").fetchall() == [("say",)]
    # a collection lines the view up with a dataset that has no language columns
    coll = lsql.connect_many({"lang": root, "plain": datasets / "small20"})
    assert coll.sql("SELECT dataset, count(*) FROM language GROUP BY ALL").fetchall() == [("lang", len(want))]


def test_language_view_is_empty_with_its_columns_without_language_columns(datasets):
    db = lsql.connect(datasets / "small20")
    r = db.sql("SELECT * FROM language")
    assert r.fetchall() == [] and r.columns == [
        "episode_index", "frame_index", "index", "timestamp", "language_column", "position", "role", "content",
        "style", "message_timestamp", "camera", "tool_calls"]


def test_an_info_json_nested_near_the_recursion_limit_is_a_typed_error(datasets, tmp_path):
    """Hostile review 20, M4: info.json nested about 985 levels deep parsed, then writing it back for info.info_json
    recursed deeper and crashed with a raw RecursionError. Now a DatasetFormatError naming meta/info.json."""
    import shutil
    import sys

    root = tmp_path / "deep"
    shutil.copytree(datasets / "small20", root)
    info = json.loads((root / "meta/info.json").read_text())
    depth = sys.getrecursionlimit() - 15
    text = json.dumps(info)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
    (root / "meta/info.json").write_text(text)
    try:  # parsed or not (the test's own stack depth decides), a typed error naming the file
        lsql.connect(root).sql("SELECT fps FROM info").fetchall()
    except lsql.DatasetFormatError as e:
        assert "info.json" in str(e)
    # the writing side alone, deterministically: a value the parser took, nested past what json.dumps recurses
    from lerobot_sql._format.jsontext import json_text

    deep: list = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    with pytest.raises(lsql.DatasetFormatError, match="meta/info.json: JSON nested too deeply"):
        json_text(deep, "meta/info.json")
