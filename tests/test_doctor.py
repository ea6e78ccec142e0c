"""The doctor: passes the clean shared datasets, and finds each seeded defect in a copy (one test per kind)."""

from __future__ import annotations

import functools
import json
import re
import shutil
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import data_root, linked_copy
from lerobot_sql import doctor
from lerobot_sql._query import library
from lerobot_sql._readers import verify

CLEAN = ["small20", "multifile60", "h264_20", "img5_extras", "g1_real_v30", "v21_small20", "g1_real_v21"]
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
DATA = "data/chunk-000/file-000.parquet"


def _copy(datasets, tmp_path, name: str):
    dst = tmp_path / name
    shutil.copytree(datasets / name, dst)
    return dst


def _copy_files(datasets, tmp_path, name: str, *damaged: str):
    """A copy of dataset NAME in which only the files ``damaged`` (relative paths) are real copies, safe to edit;
    every other file is a hard link (helpers.linked_copy: never to the shipped file; never write to those)."""
    dst = linked_copy(datasets / name, tmp_path / name)
    for rel in damaged:
        (dst / rel).unlink()
        shutil.copy2(datasets / name / rel, dst / rel)
    return dst


def _edit_parquet(path, fn) -> None:
    """Rewrite a Parquet file with ``fn(table) -> table`` (schema metadata kept)."""
    t = pq.read_table(path)
    pq.write_table(fn(t).replace_schema_metadata(t.schema.metadata), path)


def _set(table: pa.Table, column: str, fn) -> pa.Table:
    """Replace column values by ``fn(list) -> list`` (same type)."""
    i = table.schema.get_field_index(column)
    values = fn(table[column].to_pylist())
    return table.set_column(i, column, pa.array(values, table.schema.field(i).type))


def _failed(report) -> set[str]:
    return {c.name for c in report.checks if not c.ok}


def _run(root, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return doctor.run(lsql.connect(root), **kw)


@functools.lru_cache(maxsize=None)
def _clean(name: str, decode: bool = False):
    """The report on a shipped (or corpus) dataset as it is, made once per test run and only read by the tests."""
    return _run(data_root(name), decode=decode)


@pytest.mark.parametrize("name", CLEAN)
def test_clean_datasets_pass(name):
    report = _clean(name)
    assert report.ok and not _failed(report), report.to_text()
    ran = {c.name for c in report.checks if not c.skipped}
    assert {"episode_index_contiguous", "index_contiguous", "episode_ranges", "data_file_pointers", "tasks_exist",
            "stats_present", "frame_index_contiguous", "data_files_present", "data_files_decode",
            "data_rows_in_index_order", "feature_names"} <= ran
    if name != "img5_extras":
        assert {"video_files_present", "video_segments", "video_segment_frames", "video_frame_pts",
                "video_files_complete"} <= ran


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (float("nan"), ValueError),
                                        (float("inf"), ValueError), ("1e-4", TypeError), (True, TypeError)])
def test_a_tolerance_that_is_not_positive_and_finite_is_refused(bad, error):
    """tolerance_s=0 / -1 / nan failed healthy small20 (4434 frame_index_contiguous violations with 0, four checks
    FAIL with DuckDB's "must be a number, not NaN") with the hints "rewrite the episode's rows" and "re-encode the
    episode". Now refused before any check runs, as dataset() refuses it; a positive tolerance still runs."""
    db = lsql.connect(data_root("small20"))
    with pytest.raises(error, match="tolerance_s must be a .*number of seconds"):
        doctor.run(db, tolerance_s=bad, check_video=False)
    report = doctor.run(db, tolerance_s=2e-4, check_video=False)
    assert report.ok and report.tolerance_s == 2e-4, report.to_text()


def test_every_check_is_a_named_query():
    names = {q["name"] for q in library.list_queries([library.BUNDLED / "doctor"])}
    assert {s.name for s in doctor.CHECKS} <= names
    for spec in doctor.CHECKS:
        nq = library.load(f"doctor/{spec.name}")
        assert nq.description and nq.returns, spec.name
        assert {p.name for p in nq.params} == set(spec.params), spec.name


def test_record_test_reports_its_missing_videos_only(real_datasets):
    report = _run(real_datasets / "record-test")
    assert not report.ok
    assert _failed(report) == {"video_files_present"}
    missing = {r["path"] for r in report["video_files_present"].sample}
    assert missing == {f"videos/observation.images.{k}/chunk-000/file-000.mp4" for k in ("front", "top")}
    assert report["video_frame_pts"].skipped and "missing" in report["video_frame_pts"].skipped
    text = report.to_text()
    assert "FAIL video_files_present" in text and "videos/observation.images.top/chunk-000/file-000.mp4" in text
    js = json.loads(report.to_json())
    assert js["ok"] is False and js["codebase_version"] == "v3.0"
    assert [c["name"] for c in js["checks"]] == [c.name for c in report.checks]


def test_non_contiguous_episode_index(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    _edit_parquet(root / EPISODES, lambda t: _set(t, "episode_index", lambda v: [70 if x == 7 else x for x in v]))
    report = _run(root, check_video=False)
    c = report["episode_index_contiguous"]
    assert not c.ok and c.n_violations == 2
    assert [(r["previous"], r["episode_index"]) for r in c.sample] == [(6, 8), (19, 70)]
    assert "missing 7)" in c.sample[0]["problem"]


def test_index_gap(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    _edit_parquet(root / DATA, lambda t: t.set_column(
        t.schema.get_field_index("index"), "index",
        pc.if_else(pc.equal(t["episode_index"], 19), pc.add(t["index"], 5), t["index"])))
    report = _run(root, check_video=False)
    c = report["index_contiguous"]
    start = pq.read_table(datasets / "small20" / EPISODES, columns=["dataset_from_index"])[0][-1].as_py()
    assert not c.ok and c.n_violations == 1
    assert (c.sample[0]["previous_index"], c.sample[0]["index"], c.sample[0]["episode_index"]) == (start - 1,
                                                                                                  start + 5, 19)
    assert {r["episode_index"] for r in report["episode_ranges"].sample} == {19}


def test_frame_index_wrong(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    _edit_parquet(root / DATA, lambda t: _set(t, "frame_index", lambda v: [5 if i == 100 else x
                                                                             for i, x in enumerate(v)]))
    c = _run(root, check_video=False)["frame_index_contiguous"]
    assert not c.ok and c.n_violations == 1
    assert (c.sample[0]["index"], c.sample[0]["frame_index"], c.sample[0]["expected_frame_index"]) == (100, 5, 100)


@pytest.mark.parametrize("how", ["swap", "all"])
def test_rows_out_of_index_order_are_named(datasets, tmp_path, how):
    """Two adjacent rows of episode 3 swapped (frames 10 and 11), or every row of the file shuffled (each row keeps
    its index, frame_index, timestamp): dataset() refuses the episode (neighbours are read by position), its error
    sends the user here, and doctor passed both. Now data_rows_in_index_order names the file, the rows and their
    episodes, and is the only check that fails."""
    root = _copy(datasets, tmp_path, "small20")
    rng = np.random.default_rng(0)

    def reorder(t):
        ep = t["episode_index"].to_numpy()
        perm = np.arange(t.num_rows)
        if how == "swap":
            j = int(np.flatnonzero(ep == 3)[10])
            perm[j], perm[j + 1] = perm[j + 1], perm[j]
        else:
            perm = rng.permutation(t.num_rows)
        return t.take(pa.array(perm))

    _edit_parquet(root / DATA, reorder)
    report = _run(root)
    assert not report.ok and _failed(report) == {"data_rows_in_index_order"}, report.to_text()
    c = report["data_rows_in_index_order"]
    idx = pq.read_table(root / DATA, columns=["index"])["index"].to_numpy()
    later = np.flatnonzero(idx[1:] <= idx[:-1]) + 1  # rows whose index is not above the row before
    assert c.n_violations == len(later)
    assert [r["row"] for r in c.sample] == later[:doctor.SAMPLE_ROWS].tolist()
    assert all(r["data_file"] == DATA for r in c.sample)
    assert [(r["index"], r["previous_index"]) for r in c.sample] == \
        [(int(idx[r]), int(idx[r - 1])) for r in later[:doctor.SAMPLE_ROWS]]
    if how == "swap":
        lo = pq.read_table(root / EPISODES, columns=["dataset_from_index"])[0][3].as_py()
        assert c.sample == [{"data_file": DATA, "row": lo + 11, "index": lo + 10, "previous_index": lo + 11,
                             "episode_index": 3, "previous_episode_index": 3,
                             "problem": f"row {lo + 11} holds index {lo + 10} (episode 3) after index {lo + 11} "
                                        "(episode 3) in the row before"}]
    assert "sorted by `index`" in c.hint and "FAIL data_rows_in_index_order" in report.to_text()


def test_scrambled_index_ranges(datasets, tmp_path):
    """lerobot issue #1919 (huggingface/lerobot): dataset_from_index/_to_index of two episodes swapped."""
    root = _copy(datasets, tmp_path, "small20")

    def swap(v):
        v = list(v)
        v[2], v[3] = v[3], v[2]
        return v

    _edit_parquet(root / EPISODES, lambda t: _set(_set(t, "dataset_from_index", swap), "dataset_to_index", swap))
    report = _run(root, check_video=False)
    c = report["episode_ranges"]
    assert not c.ok and {r["episode_index"] for r in c.sample} == {2, 3}
    assert _failed(report) == {"episode_ranges"}
    # Reading is unaffected: rows are found by episode_index.
    db = lsql.connect(root)
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index = 3", cameras=[])
    first = pq.read_table(datasets / "small20" / DATA, filters=[("episode_index", "=", 3)])
    assert len(ds) == first.num_rows and int(ds[0]["index"]) == first["index"][0].as_py()


def test_stale_data_file_pointer(datasets, tmp_path, framecode):
    """lerobot issue #2401 (huggingface/lerobot): the first episode of a new data file still points at the previous file."""
    root = _copy(datasets, tmp_path, "multifile60")
    ep = pq.read_table(root / EPISODES)
    first_of_file1 = min(e for e, f in zip(ep["episode_index"].to_pylist(), ep["data/file_index"].to_pylist())
                         if f == 1)
    _edit_parquet(root / EPISODES, lambda t: _set(t, "data/file_index", lambda v: [
        0 if e == first_of_file1 else x for e, x in zip(t["episode_index"].to_pylist(), v)]))
    report = _run(root, check_video=False)
    c = report["data_file_pointers"]
    assert not c.ok and c.n_violations == 1
    row = c.sample[0]
    assert row["episode_index"] == first_of_file1
    assert row["pointed_file"] == "data/chunk-000/file-000.parquet"
    assert row["actual_files"] == ["data/chunk-000/file-001.parquet"]
    assert _failed(report) == {"data_file_pointers"}
    # The reader ignores the stale pointer.
    ds = lsql.connect(root).dataset(f"SELECT episode_index FROM episodes WHERE episode_index = {first_of_file1}",
                                    cameras=[])
    np.testing.assert_array_equal(ds[3]["observation.state"].numpy(), framecode.expected_state(first_of_file1, 3))


def test_missing_task(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    _edit_parquet(root / "meta/tasks.parquet", lambda t: t.slice(0, t.num_rows - 1))
    lost = pq.read_table(datasets / "small20" / "meta/tasks.parquet").to_pylist()[-1]
    n_frames = pc.sum(pc.equal(pq.read_table(datasets / "small20" / DATA, columns=["task_index"])["task_index"],
                               lost["task_index"])).as_py()
    c = _run(root, check_video=False)["tasks_exist"]
    assert not c.ok
    by_source = {r["source"]: r for r in c.sample}
    assert by_source["frames"]["task_index"] == lost["task_index"] and by_source["frames"]["n_frames"] == n_frames
    assert by_source["episodes"]["task"] == lost["__index_level_0__"]


@pytest.mark.parametrize("name", ["small20", "v21_small20"])
def test_episode_tasks_that_contradict_the_frames_are_named(datasets, tmp_path, name):
    """meta/episodes said episode 0's task was 'Fold the towel in half.' while its frames carry 'Put the marker back
    in the cup.': doctor said OK, and `list_contains(tasks, ...)` (episodes_by_task) picked episode 0 for the towel
    task, whose items all say the marker task. Now episode_tasks names the episode and both lists (a warning, as
    feature_names: the items are right, the selections by task are not)."""
    root = _copy(datasets, tmp_path, name)
    towel, marker = "Fold the towel in half.", "Put the marker back in the cup."
    if name == "small20":
        _edit_parquet(root / EPISODES, lambda t: _set(t, "tasks", lambda v: [[towel]] + v[1:]))
    else:
        lines = (root / "meta/episodes.jsonl").read_text().splitlines()
        first = json.loads(lines[0])
        assert first["tasks"] == [marker]
        first["tasks"] = [towel]
        (root / "meta/episodes.jsonl").write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    report = _run(root)
    c = report["episode_tasks"]
    assert not c.ok and c.severity == "warning" and c.n_violations == 1, report.to_text()
    assert c.sample == [{"episode_index": 0, "listed": [towel], "used": [marker],
                         "problem": f'meta/episodes lists ["{towel}"] but its frames carry ["{marker}"]'}]
    assert _failed(report) == {"episode_tasks"} and report.ok, report.to_text()
    assert report["tasks_exist"].ok  # the text exists in the tasks table: that check cannot see it


def test_total_tasks_and_feature_names_that_disagree_are_named(datasets, tmp_path):
    """info.json total_tasks 3 for 7 tasks, and observation.state's names listing 2 names for shape [6]: doctor
    passed both (wrong total_frames / total_episodes were caught). Now tasks_exist fails with the count row, and
    feature_names (a warning: items are unaffected, frames_ext names no element) names the feature and both sizes;
    names in a one-key dict or a nested list, one per element, pass."""
    root = _copy(datasets, tmp_path, "small20")
    info = json.loads((root / "meta/info.json").read_text())
    n_tasks = pq.read_metadata(root / "meta/tasks.parquet").num_rows
    assert info["total_tasks"] == n_tasks == 7
    six = info["features"]["action"]["names"]
    info["total_tasks"] = 3
    info["features"]["observation.state"]["names"] = ["a", "b"]
    info["features"]["action"]["names"] = {"motors": six}
    (root / "meta/info.json").write_text(json.dumps(info))
    report = _run(root)
    assert not report.ok and _failed(report) == {"tasks_exist", "feature_names"}, report.to_text()
    assert report["tasks_exist"].sample == [{"source": "info", "task_index": None, "task": None, "n_frames": None,
                                             "first_episode": None,
                                             "problem": "info.json total_tasks is 3 but the tasks table has 7 tasks"}]
    assert "total_tasks" in report["tasks_exist"].hint
    c = report["feature_names"]
    assert c.severity == "warning" and c.n_violations == 1
    row = c.sample[0]
    assert (row["name"], row["shape"], row["n_names"]) == ("observation.state", [6], 2)
    assert row["problem"] == "names lists 2 name(s) for 6 elements"
    info["features"]["observation.state"]["names"] = [six]
    info["total_tasks"] = 7
    (root / "meta/info.json").write_text(json.dumps(info))
    report = _run(root)
    assert report.ok and not _failed(report), report.to_text()


def test_missing_stats(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    _edit_parquet(root / EPISODES, lambda t: t.drop_columns([c for c in t.column_names
                                                             if c.startswith("stats/action/")]))
    c = _run(root, check_video=False)["stats_present"]
    assert not c.ok
    assert {(r["feature"], r["stat"]) for r in c.sample} == {("action", s) for s in ("count", "max", "mean", "min", "std")}
    assert all(r["n_episodes"] == 20 for r in c.sample)


def test_missing_video_file(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "multifile60")
    gone = "videos/observation.images.wrist/chunk-001/file-000.mp4"
    (root / gone).unlink()
    report = _run(root)
    c = report["video_files_present"]
    assert not c.ok and [r["path"] for r in c.sample] == [gone]
    # the other 10 mp4s are indexed and checked (they were all skipped), and pass
    assert not report["video_frame_pts"].skipped and report["video_frame_pts"].ok
    assert _failed(report) == {"video_files_present"}


def test_video_segment_duration(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    col = "videos/observation.images.front/to_timestamp"
    _edit_parquet(root / EPISODES, lambda t: _set(t, col, lambda v: [x + 0.5 if i == 4 else x for i, x in enumerate(v)]))
    report = _run(root)
    c = report["video_segments"]
    assert not c.ok
    assert {(r["video_key"], r["episode_index"]) for r in c.sample} == {("observation.images.front", 4),
                                                                         ("observation.images.front", 5)}
    assert not report["video_segment_frames"].ok  # the clip now claims frames of episode 5


def test_video_clip_runs_past_the_file(datasets, tmp_path):
    """The last clip of a file shifted by one frame: it holds length - 1 real frames."""
    root = _copy(datasets, tmp_path, "small20")
    shift = lambda v: [x + 1 / 30 if i == 19 else x for i, x in enumerate(v)]  # noqa: E731
    _edit_parquet(root / EPISODES, lambda t: _set(_set(t, "videos/observation.images.wrist/from_timestamp", shift),
                                                  "videos/observation.images.wrist/to_timestamp", shift))
    report = _run(root)
    c = report["video_segment_frames"]
    length = pq.read_table(root / EPISODES, columns=["length"])["length"][19].as_py()
    assert not c.ok and c.n_violations == 1
    assert (c.sample[0]["episode_index"], c.sample[0]["length"], c.sample[0]["frames_in_clip"]) == (19, length,
                                                                                                  length - 1)
    pts = report["video_frame_pts"]
    assert not pts.ok and pts.n_violations == 1  # the last frame has no video frame at all


def test_video_offset_drift(datasets, tmp_path):
    """from_timestamp drifting 10 ms from the real pts: every frame is off, within half a frame."""
    root = _copy(datasets, tmp_path, "small20")
    drift = lambda v: [x + 0.01 for x in v]  # noqa: E731
    _edit_parquet(root / EPISODES, lambda t: _set(_set(t, "videos/observation.images.front/from_timestamp", drift),
                                                  "videos/observation.images.front/to_timestamp", drift))
    report = _run(root)
    c = report["video_frame_pts"]
    total = pq.read_metadata(root / DATA).num_rows
    assert not c.ok and c.n_violations == total
    assert all(r["video_key"] == "observation.images.front" for r in c.sample)
    np.testing.assert_allclose([r["error_s"] for r in c.sample], 0.01, atol=1e-6)
    # Each clip [from, to) now takes the next clip's first frame instead of its own; only the file's last clip
    # comes up one short.
    seg = report["video_segment_frames"]
    assert seg.n_violations == 1 and seg.sample[0]["episode_index"] == 19
    assert _run(root, tolerance_s=0.02)["video_frame_pts"].ok


def test_codec_label_differs_from_file(datasets, tmp_path):
    """info.json says h264 for an AV1 stream: a warning; frames still decode from what the file holds."""
    root = _copy(datasets, tmp_path, "small20")
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.images.front"]["info"]["video.codec"] = "h264"
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    report = _run(root)
    c = report["video_codec"]
    assert not c.ok and c.severity == "warning" and report.ok
    assert c.sample[0]["info_codec"] == "h264" and c.sample[0]["file_codec"] == "av1"
    assert "WARN video_codec" in report.to_text()
    got = lsql.connect(root).dataset("SELECT index FROM frames WHERE index = 40", return_uint8=True)[0]
    want = lsql.connect(datasets / "small20").dataset("SELECT index FROM frames WHERE index = 40",
                                                      return_uint8=True)[0]
    assert np.array_equal(got["observation.images.front"].numpy(), want["observation.images.front"].numpy())


def test_v21_wrong_length_in_episodes_jsonl(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "v21_small20")
    lines = (root / "meta/episodes.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    rows[4]["length"] += 3
    (root / "meta/episodes.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    report = _run(root)
    c = report["episode_ranges"]
    assert not c.ok and c.sample[0]["episode_index"] == 4 and c.sample[0]["rows_found"] == rows[4]["length"] - 3
    assert not report["video_segment_frames"].ok  # the episode's mp4 holds the real length


# ---- each check alone, through db.query ---------------------------------------------------------------------------
@pytest.mark.parametrize("check", [s.name for s in doctor.CHECKS])
@pytest.mark.parametrize("name", ["small20", "v21_small20"])
def test_check_runs_standalone_on_a_fresh_connection(datasets, name, check):
    """``db.query("doctor/<check>")`` needs nothing that doctor.run prepares: the views it reads build themselves."""
    db = lsql.connect(datasets / name)
    assert db.query(f"doctor/{check}").fetchall() == []


def test_video_files_view_and_standalone_missing_file(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    gone = "videos/observation.images.wrist/chunk-000/file-000.mp4"
    kept = "videos/observation.images.front/chunk-000/file-000.mp4"
    (root / gone).unlink()
    db = lsql.connect(root)
    n_eps = pq.read_metadata(root / EPISODES).num_rows
    got = db.query("doctor/video_files_present").fetchall()
    assert got == [("observation.images.wrist", gone, n_eps, 0)]
    rows = db.sql("SELECT video_key, path, present, size_bytes, codec FROM video_files ORDER BY path").fetchall()
    import av

    with av.open(str(root / kept)) as c:
        codec = c.streams.video[0].codec_context.codec.canonical_name
    assert rows == [("observation.images.front", kept, True, (root / kept).stat().st_size, codec),
                    ("observation.images.wrist", gone, False, None, None)]
    assert db.query("doctor/video_codec").fetchall() == []


# ---- clips against the mp4's real frames (the check dataset() also makes when it opens) ---------------------------
FRONT_FROM, FRONT_TO = "videos/observation.images.front/from_timestamp", "videos/observation.images.front/to_timestamp"


def _first_frames(root) -> np.ndarray:
    """Ordinal of each episode's first frame in small20's single mp4 per camera: the running sum of data rows."""
    ep = pq.read_table(root / DATA, columns=["episode_index"])["episode_index"].to_numpy()
    counts = np.bincount(ep)
    return np.concatenate([[0], np.cumsum(counts)]), counts


def test_video_clip_start_alone_shifted(datasets, tmp_path):
    """from_timestamp alone +1 frame: the clip's length still passes the one-frame slack dataset() allows, but its
    frames run into episode 6's clip."""
    root = _copy(datasets, tmp_path, "small20")
    _edit_parquet(root / EPISODES, lambda t: _set(t, FRONT_FROM, lambda v: [x + 1 / 30 if i == 5 else x
                                                                            for i, x in enumerate(v)]))
    c = _run(root)["video_clip_frames"]
    first, counts = _first_frames(root)
    assert not c.ok and c.n_violations == 2
    r5, r6 = c.sample
    assert (r5["episode_index"], r5["first_frame"], r5["last_frame"]) == (5, first[5] + 1, first[5] + counts[5])
    assert "run into the clip of episode 6" in r5["problem"]
    assert r6["episode_index"] == 6 and "inside the clip of episode 5" in r6["problem"]


def test_video_clip_last_of_file_shifted(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    shift = lambda v: [x + 1 / 30 if i == 19 else x for i, x in enumerate(v)]  # noqa: E731
    _edit_parquet(root / EPISODES, lambda t: _set(_set(t, FRONT_FROM, shift), FRONT_TO, shift))
    c = _run(root)["video_clip_frames"]
    first, counts = _first_frames(root)
    import av

    with av.open(str(root / "videos/observation.images.front/chunk-000/file-000.mp4")) as f:
        n_frames = sum(1 for p in f.demux(video=0) if p.pts is not None)
    assert not c.ok and c.n_violations == 1
    r = c.sample[0]
    assert (r["episode_index"], r["frames_in_file"], r["last_frame"]) == (19, n_frames, first[19] + counts[19])
    assert "past the file's last frame" in r["problem"]


def test_video_clip_to_timestamp_one_frame_short_passes(datasets, tmp_path):
    """Writers that store to_timestamp = from_timestamp + (length - 1) / fps: the clips still hold their frames."""
    root = _copy(datasets, tmp_path, "small20")

    def f(t):
        n = np.asarray(t["length"].to_numpy(), np.float64)
        return _set(t, FRONT_TO, lambda v: list(t[FRONT_FROM].to_numpy() + (n - 1) / 30))

    _edit_parquet(root / EPISODES, f)
    report = _run(root)
    assert report["video_clip_frames"].ok and not report["video_clip_frames"].skipped
    # a convention both readers decode correctly: a warning naming every such clip, not a failure
    assert report["video_segments"].ok, report.to_text()
    conv = report["video_segments_end_convention"]
    assert not conv.ok and conv.severity == "warning" and conv.n_violations == 20
    assert {r["video_key"] for r in conv.sample} == {"observation.images.front"}
    assert report.ok


def test_missing_data_file_is_named_and_warned(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "multifile60")
    gone = "data/chunk-000/file-001.parquet"
    eps = sorted(set(pq.read_table(root / gone, columns=["episode_index"])["episode_index"].to_pylist()))
    (root / gone).unlink()
    report = _run(root)
    c = report["data_files_present"]
    assert not c.ok and c.sample == [{"path": gone, "n_episodes": len(eps), "first_episode": eps[0]}]
    db = lsql.connect(root)
    with pytest.warns(UserWarning, match=rf"1 data file\(s\) that meta/episodes points to are missing, e.g. .*{gone}"):
        db.sql("SELECT count(*) FROM frames").fetchall()


def test_damaged_page_is_named_with_its_row_group(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    md = pq.ParquetFile(root / DATA).metadata
    rg = 9
    col = md.row_group(rg).column(0)
    with open(root / DATA, "r+b") as f:  # overwrite the first page header of row group 9's first column chunk
        f.seek(col.data_page_offset)
        f.write(bytes(range(256)) * 2)
    report = _run(root)
    c = report["data_files_decode"]
    assert not c.ok and [(r["path"], r["row_group"]) for r in c.sample] == [(DATA, rg)]
    assert _failed(report) == {"data_files_decode"}


def test_truncated_mp4_is_reported(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    rel = "videos/observation.images.front/chunk-000/file-000.mp4"
    size = (root / rel).stat().st_size
    with open(root / rel, "r+b") as f:
        f.truncate(int(size * 0.6))
    report = _run(root)
    c = report["video_files_complete"]
    assert not c.ok and [r["path"] for r in c.sample] == [rel]
    assert c.sample[0]["size_bytes"] == int(size * 0.6) < c.sample[0]["bytes_needed"] <= size
    assert c.sample[0]["frames_past_end"] > 0


@pytest.mark.parametrize("damage", ["zero_bytes", "garbage"])
def test_empty_or_unreadable_mp4_fails_the_report(datasets, tmp_path, damage):
    """A zero-byte (or unreadable) mp4 that meta/episodes references is a failure naming the file, not a run of
    skipped video checks and an OK report; the other camera's file is not named."""
    root = _copy(datasets, tmp_path, "small20")
    rel = "videos/observation.images.front/chunk-000/file-000.mp4"
    (root / rel).write_bytes(b"" if damage == "zero_bytes" else b"\x00" * 4096)
    report = _run(root)
    assert not report.ok, report.to_text()
    c = report["video_files_readable"]
    assert not c.ok and c.n_violations == 1 and not c.skipped
    r = c.sample[0]
    assert (r["video_key"], r["path"], r["size_bytes"], r["n_episodes"]) == (
        "observation.images.front", rel, 0 if damage == "zero_bytes" else 4096, 20)
    assert "PROBLEMS" in report.to_text() and rel in report.to_text()


def test_an_mp4_with_two_video_streams_fails_the_report_naming_it(datasets, tmp_path):
    """The wrist camera muxed into the front camera's file as stream 0: readers took stream 0, so every front item
    was a wrist picture while doctor said OK. Now video_files_readable fails naming the file and the stream count,
    the video index checks are skipped saying why, and `lerobot-sql doctor` exits 1 (run in this process)."""
    from helpers import FRONT_MP4, WRIST_MP4, muxed_copy, run_cli

    root = muxed_copy(datasets / "small20", tmp_path / "two", [WRIST_MP4, FRONT_MP4])
    out = run_cli("doctor", root, "--json", env={"LSQL_CACHE_DIR": str(tmp_path / "cache")})
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["ok"] is False, out.stdout
    checks = {c["name"]: c for c in report["checks"]}
    assert {n for n, c in checks.items() if not c["ok"]} == {"video_files_readable"}
    c = checks["video_files_readable"]
    assert c["n_violations"] == 1 and "one video stream" in c["hint"]
    r = c["sample"][0]
    assert (r["video_key"], r["path"], r["n_episodes"]) == ("observation.images.front", FRONT_MP4, 20)
    assert r["problem"].startswith("holds 2 video streams") and "-map 0:v:N" in r["problem"]
    # the index refuses the file: its checks are skipped saying why
    skipped = checks["video_frame_pts"]["skipped"]
    assert "2 video streams" in skipped and FRONT_MP4 in skipped


def test_video_stream_rate_other_than_info_fps_is_named(datasets, tmp_path):
    """A 30 fps stream behind an info.json that says 15 fps: a warning naming each mp4 and both rates."""
    root = _copy(datasets, tmp_path, "small20")
    info = json.loads((root / "meta/info.json").read_text())
    info["fps"] = 15
    (root / "meta/info.json").write_text(json.dumps(info))
    report = _run(root, tolerance_s=1.0)
    c = report["video_stream_rate"]
    assert not c.ok and c.severity == "warning" and not c.skipped
    assert [(r["video_key"], r["info_fps"], r["stream_fps"]) for r in c.sample] == [
        ("observation.images.front", 15.0, 30.0), ("observation.images.wrist", 15.0, 30.0)]
    assert _clean("small20")["video_stream_rate"].ok


def test_camera_video_fps_and_resolution_other_than_the_file_are_named(datasets, tmp_path):
    """small20 with the front camera's info.video.fps 15 (its stream: 30 fps) and the wrist camera's shape [64, 64,
    3] (its mp4: 96x128): doctor said OK while dataset() warned and served the file's size. Now two warnings, each
    naming the camera, the file and both values; the report still passes (the items are the files' frames); the
    resolution warning also for video.height / video.width that disagree, and for a [C, H, W] shape named so."""
    root = _copy(datasets, tmp_path, "small20")
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    info["features"]["observation.images.front"]["info"]["video.fps"] = 15
    info["features"]["observation.images.wrist"]["shape"] = [64, 64, 3]
    path.write_text(json.dumps(info, indent=4))
    front, wrist = (f"videos/observation.images.{k}/chunk-000/file-000.mp4" for k in ("front", "wrist"))
    report = _run(root)
    assert report.ok and _failed(report) == {"video_info_fps", "video_resolution"}, report.to_text()
    fps, res = report["video_info_fps"], report["video_resolution"]
    assert fps.severity == res.severity == "warning"
    assert [(r["video_key"], r["path"], r["info_video_fps"], r["stream_fps"]) for r in fps.sample] == [
        ("observation.images.front", front, 15.0, 30.0)]
    assert res.sample == [{"video_key": "observation.images.wrist", "path": wrist, "declared_shape": [64, 64, 3],
                           "info_height": 96, "info_width": 128, "file_height": 96, "file_width": 128}]
    with pytest.warns(UserWarning, match=r"video frames of camera 'observation.images.wrist' are 96x128 .* 64x64"):
        item = lsql.connect(root).dataset(cameras=["observation.images.wrist"])[0]
    assert tuple(item["observation.images.wrist"].shape) == (3, 96, 128)  # what the warning is about
    text = report.to_text()
    assert "WARN video_info_fps" in text and "WARN video_resolution" in text and "stream_fps=30.0" in text

    info["features"]["observation.images.front"]["info"]["video.fps"] = 30
    info["features"]["observation.images.wrist"].update(shape=[3, 96, 128], names=["channels", "height", "width"])
    info["features"]["observation.images.wrist"]["info"]["video.width"] = 64
    path.write_text(json.dumps(info, indent=4))
    report = _run(root)
    assert _failed(report) == {"video_resolution"}, report.to_text()
    assert [(r["declared_shape"], r["info_width"], r["file_width"]) for r in report["video_resolution"].sample] == [
        ([3, 96, 128], 64, 128)]
    assert _clean("small20")["video_resolution"].ok


def test_missing_clip_timestamps_fail_the_report(datasets, tmp_path):
    """meta/episodes without the videos/*/from_timestamp and to_timestamp columns (the mp4s all there): a failure
    naming each camera and its episodes, and the video checks say why they skip (not 'no video files referenced')."""
    root = _copy(datasets, tmp_path, "small20")
    _edit_parquet(root / EPISODES, lambda t: t.drop_columns(
        [c for c in t.column_names if c.startswith("videos/") and c.endswith("_timestamp")]))
    report = _run(root)
    assert not report.ok
    c = report["video_pointers_present"]
    assert [(r["video_key"], r["n_episodes"], r["first_episode"]) for r in c.sample] == [
        ("observation.images.front", 20, 0), ("observation.images.wrist", 20, 0)]
    assert "from_timestamp" in c.sample[0]["problem"]
    skipped = report["video_frame_pts"].skipped  # no clip bounds; the mp4s the pointers name are checked
    assert "from_timestamp" in skipped and "video_pointers_present" in skipped, skipped
    assert not report["video_files_present"].skipped and not report["video_stream_rate"].skipped
    assert "no video files referenced" not in report.to_text()


def test_frame_pts_hint_names_the_timestamp_column_when_it_is_off(datasets, tmp_path):
    """Episode 3's timestamps 10 ms off frame_index / fps in data/ (from_timestamp intact): video_frame_pts fails
    for its frames, and its hint names the timestamp column, not from_timestamp drift."""
    root = _copy(datasets, tmp_path, "small20")

    def f(t):
        ep = t["episode_index"].to_numpy()
        ts = t["timestamp"].to_numpy().copy()
        ts[ep == 3] += 0.01
        return _set(t, "timestamp", lambda v: ts.tolist())

    _edit_parquet(root / DATA, f)
    report = _run(root)
    assert not report["frame_index_contiguous"].ok
    c = report["video_frame_pts"]
    assert not c.ok and {r["episode_index"] for r in c.sample} == {3}
    assert "timestamp column" in c.hint and "episodes 3" in c.hint and "drifts" not in c.hint
    assert "drifts" in _clean("small20")["video_frame_pts"].hint  # the usual hint elsewhere


def test_wall_clock_timestamps_over_grid_clips_get_the_frame_index_advice(datasets, tmp_path):
    """Timestamps of a clock running at 0.9x (drift up to 1.3 s) over videos whose clips hold exactly their
    episodes' frames on the fps grid: the video_frame_pts hint names the timestamp column and recommends
    align="frame_index", not a tolerance_s as large as the drift (which picks the frame nearest each wall-clock
    time: another row's). Where the clips are off the grid (the videos' frames follow the same clock), the tolerance
    stays the advice, with its condition."""
    root = _copy_files(datasets, tmp_path, "small20", DATA)

    def f(t):
        fi = np.asarray(t["frame_index"].to_pylist())
        return _set(t, "timestamp", lambda v: (fi / 30 * 0.9).tolist())

    _edit_parquet(root / DATA, f)
    report = _run(root)
    assert not report["frame_index_contiguous"].ok
    c = report["video_frame_pts"]
    assert not c.ok
    assert "timestamp column" in c.hint and 'align="frame_index"' in c.hint, c.hint
    assert "as large as the drift if" not in c.hint and "another row's" in c.hint
    # the rule itself: on grid for every episode here, off grid for a clip stretched to the same 0.9x clock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = lsql.connect(root)
    assert doctor._clips_on_grid(db, [3, 4]) == {3, 4}
    hint = doctor._frame_pts_hint({"video_frame_pts": {3}, "frame_index_contiguous": {3}}, "h", lambda eps: set())
    assert "tolerance_s as large as the drift" in hint and "follow the same clock" in hint and "align" not in hint


def test_declared_shape_mismatch_is_named_not_a_redownload(datasets, tmp_path):
    """info.json declares observation.state as 7 values where the data holds 6: the failure names the column, both
    sizes and the info.json fix; no hint says to re-download."""
    root = _copy(datasets, tmp_path, "small20")
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.state"]["shape"] = [7]
    (root / "meta/info.json").write_text(json.dumps(info))
    report = _run(root)
    assert not report.ok
    bad = [c for c in report.checks if not c.ok]
    assert bad and all("re-download" not in c.hint for c in bad), report.to_text()
    c = report["data_files_decode"]
    assert c.sample == [{"path": DATA, "column": "observation.state", "declared_shape": [7], "values_per_row": 6}]
    assert "shape" in c.hint and "info.json" in c.hint
    # meta/stats.json's 6 values and the 6 names no longer fit the declared 7 either: named (the stats with the
    # shape as the first suspect)
    assert _failed(report) == {"data_files_decode", "stats_json_valid", "feature_names"}, report.to_text()
    assert "fix the shape in meta/info.json" in report["stats_json_valid"].hint


def test_missing_column_hint_says_which_and_not_redownload(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    _edit_parquet(root / DATA, lambda t: t.drop_columns(["task_index"]))
    report = _run(root)
    c = report["tasks_exist"]
    assert not c.ok and "'task_index'" in c.hint and "re-download" in c.hint and "will not help" in c.hint


def test_unreadable_metadata_is_a_finding_not_a_crash(datasets, tmp_path):
    root = _copy(datasets, tmp_path, "small20")
    rel = "meta/tasks.parquet"
    (root / rel).write_bytes((root / rel).read_bytes()[:-300])
    report = _run(root)
    assert not report.ok and _failed(report) == {"metadata_readable"}
    assert f"{rel}: cannot be read as Parquet" in report["metadata_readable"].sample[0]["error"]


REFUSED_INFO = [
    ({"chunks_size": "many"}, "chunks_size", "'chunks_size' must be an integer"),
    ({"fps": float("nan")}, "fps", "'fps' must be a number of frames per second from 0.001 to 100000"),
    ({"fps": 1e-300}, "fps", "'fps' must be a number of frames per second from 0.001 to 100000, found 1e-300"),
    ({"codebase_version": 3}, "codebase_version", "'codebase_version' must be a string like 'v3.0', found 3 (int)"),
    ({"total_episodes": "twenty"}, "total_episodes", "'total_episodes' must be an integer"),
    ({"data_path": "../../{file_index}.parquet"}, "data_path", "has a '.' or '..' path segment"),
    ({"video_path": "videos/{video_key!r}/{file_index}.mp4"}, "video_path", "which is not allowed"),
    ({"codebase_version": "v9.0"}, "codebase_version", "is not supported"),
    ({"features": {"observation.state": {"dtype": "float32", "shape": ["six"]}}},
     "features['observation.state']", "each dimension must be an integer"),
]


@pytest.mark.parametrize("change,key,message", REFUSED_INFO)
def test_doctor_reports_a_refused_info_json_as_a_failed_check(datasets, tmp_path, change, key, message):
    """`lerobot-sql doctor` on a dataset whose info.json connect() refuses: a report with one failed check naming
    the key, the message and the fix (before: the CLI's error line, whose hint was to run `lerobot-sql doctor`).
    The command runs in this process (helpers.run_cli)."""
    from helpers import run_cli

    root = _copy_files(datasets, tmp_path, "small20", "meta/info.json")
    info = json.loads((root / "meta/info.json").read_text())
    info.update(change)
    (root / "meta/info.json").write_text(json.dumps(info))
    env = {"LSQL_CACHE_DIR": str(tmp_path / "cache")}
    text = run_cli("doctor", root, env=env)
    assert text.returncode == 1 and "Traceback" not in text.stderr, text.stderr
    assert "FAIL info_json_valid: 1 violation(s)" in text.stdout
    assert f"key={key!r}" in text.stdout and f"hint: fix {key!r} in meta/info.json (" in text.stdout, text.stdout
    assert message in text.stdout.split("hint:")[1], text.stdout
    js = run_cli("doctor", root, "--json", env=env)
    report = json.loads(js.stdout)
    assert js.returncode == 1 and report["ok"] is False and [c["name"] for c in report["checks"]] == ["info_json_valid"]
    row = report["checks"][0]["sample"][0]
    assert row["file"] == "meta/info.json" and row["key"] == key and message in row["error"]
    assert str(root / "meta/info.json") in row["error"]


@pytest.mark.parametrize("name,stray", [("small20", "data/chunk-000/recorder_raw.parquet"),
                                        ("v21_small20", "data/chunk-000/raw_000.parquet")])
def test_stray_parquet_in_data_is_not_read_and_doctor_names_it(datasets, tmp_path, name, stray):
    """A raw recorder file of other columns beside the dataset's own data files: frames once took its rows in,
    with NULL episode_index (4762 + 50 rows for small20); now only files data_path names are read."""
    root = _copy(datasets, tmp_path, name)
    pq.write_table(pa.table({"ts_ns": pa.array(range(50), pa.int64()), "joint_raw": pa.array([0.5] * 50)}),
                   root / stray)
    info = json.loads((root / "meta/info.json").read_text())
    with pytest.warns(UserWarning, match=rf"1 Parquet file\(s\) do not match info.json's data_path .* {stray}"):
        db = lsql.connect(root)
    assert db.sql("SELECT count(*), count(episode_index), count(DISTINCT episode_index) FROM frames").fetchall() == \
        [(info["total_frames"], info["total_frames"], info["total_episodes"])]
    assert stray not in db.layout.data_files and db.layout.stray_data_files == (stray,)
    report = _run(root)
    c = report["data_files_stray"]
    assert not c.ok and c.severity == "warning"
    assert c.sample == [{"path": stray, "reason": f"its name does not match info.json's data_path "
                                                  f"{info['data_path']!r}"}]
    assert report.ok, report.to_text()  # the dataset itself reads: a warning, not a failure
    assert stray in report.to_text()


def test_v21_file_named_like_an_episode_file_of_no_episode_is_listed_as_a_stray(datasets, tmp_path):
    """issue 36, real data: raw recorder files in data/chunk-001/ named like episode files (episode_000123.parquet)
    that no episode of meta/episodes.jsonl names. doctor's stray check said ok (their names match data_path) while
    their rows sat in frames with NULL episode_index. Now they are listed, with why, and the other checks pass."""
    root = _copy(datasets, tmp_path, "v21_small20")  # a real copy: a hard link changes the shipped file's ctime
    rel = "data/chunk-001/episode_000123.parquet"
    (root / rel).parent.mkdir()
    pq.write_table(pa.table({"ts_ns": pa.array(range(50), pa.int64()), "joint_raw": pa.array([0.5] * 50)}),
                   root / rel)
    report = _run(root)
    c = report["data_files_stray"]
    assert not c.ok and c.severity == "warning"
    assert c.sample == [{"path": rel, "reason": "no episode of meta/episodes.jsonl names it and it has no "
                                                "episode_index column"}]
    assert _failed(report) == {"data_files_stray"} and report.ok, report.to_text()


def test_a_damaged_data_file_is_named_and_the_other_checks_still_run(datasets, tmp_path):
    """One truncated data file of two: doctor stopped at "metadata_readable" (no other check ran). Now
    data_files_decode names the file (its footer: row_group None); the checks that read frames say they could not
    run because of it (not "re-download" of the metadata); the metadata and video checks run and pass."""
    root = _copy(datasets, tmp_path, "multifile60")
    rel = "data/chunk-000/file-001.parquet"
    (root / rel).write_bytes((root / rel).read_bytes()[:-100])
    report = _run(root)
    assert not report.ok
    c = report["data_files_decode"]
    assert [(r["path"], r["row_group"]) for r in c.sample] == [(rel, None)]
    frames_checks = {"index_contiguous", "frame_index_contiguous", "episode_ranges", "tasks_exist"}
    assert frames_checks <= _failed(report)
    for name in frames_checks:
        assert f"{rel}: cannot be read as Parquet" in report[name].sample[0]["error"]
        assert "a data file it reads is damaged" in report[name].hint
    for name in ("episode_index_contiguous", "stats_present", "video_files_present", "video_codec",
                 "video_segments"):
        assert report[name].ok and not report[name].skipped, name


@pytest.mark.parametrize("name", ["small20", "multifile60"])
def test_every_data_file_damaged_is_named_by_data_files_decode(datasets, tmp_path, name):
    """Every data file truncated (small20 has one): no view can be built, and doctor reported only
    metadata_readable ("re-download the named file; no other check can run"), unlike the two-file case. Now
    data_files_decode names each file (its footer: row_group None) and every other check is reported as not run,
    saying why; a truncated metadata file still gives metadata_readable."""
    root = _copy(datasets, tmp_path, name)
    files = sorted(p.relative_to(root).as_posix() for p in (root / "data").rglob("*.parquet"))
    for rel in files:
        (root / rel).write_bytes((root / rel).read_bytes()[:-100])
    report = _run(root)
    assert not report.ok and _failed(report) == {"data_files_decode"}, report.to_text()
    c = report["data_files_decode"]
    assert [(r["path"], r["row_group"]) for r in c.sample] == [(rel, None) for rel in files]
    assert [s.name for s in doctor.CHECKS] + [doctor.DECODE.name] == [c.name for c in report.checks]
    for check in report.checks:
        if check.name != "data_files_decode":
            assert check.skipped and "no data file can be read (see data_files_decode)" in check.skipped, check.name
    text = report.to_text()
    assert "FAIL data_files_decode: " in text and files[0] in text
    meta = _copy(datasets, tmp_path / "meta", name)
    (meta / EPISODES).write_bytes((meta / EPISODES).read_bytes()[:-100])
    assert _failed(_run(meta)) == {"metadata_readable"}


# ---- decode=True: every frame of every mp4 decoded (video_files_decode) -------------------------------------------
DEPTH_MP4 = "videos/observation.images.depth/chunk-000/file-000.mp4"
FRONT_MP4 = "videos/observation.images.front/chunk-000/file-000.mp4"


def _export_depth4_cut_mid_gop(datasets, out):
    """depth4 with every episode cut mid-GOP (frames 3..14 of each) into one mp4 per camera: test_export's
    test_depth_windows_cut_in_every_episode_decode_in_order's export (the HEVC depth runs are copied, their CRA
    keyframes follow another part's frames)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # depth4's float depth is quantized
        rep = lsql.connect(datasets / "depth4").export(
            "SELECT episode_index, 0.1 AS start_s, 0.5 AS end_s FROM episodes", out, progress=False)
    assert rep.episodes == 3 and rep.frames == 36 and rep.frames_remuxed > 0
    return out


def test_decode_finds_the_out_of_order_hevc_export_the_packet_checks_pass(datasets, tmp_path, monkeypatch):
    """The export bug before the BLA fix (video_writer._new_sequence the identity): from the seam before the third
    part on, FFmpeg output the depth mp4's frames out of pts order and held two back, while every packet check
    passed. decode=True names the file, the first offending frame (22, pts 11264 = 22/30 s in 1/15360 units: the
    second part's last frames come out after the third part's first) and the episodes of those frames (1 and 2);
    decode=False still passes and says the check did not run."""
    from lerobot_sql.export import video_writer

    monkeypatch.setattr(video_writer.VideoWriter, "_new_sequence", lambda self, pkt: pkt)
    out = _export_depth4_cut_mid_gop(datasets, tmp_path / "out")

    quick = _run(out)
    assert quick.ok and not _failed(quick), quick.to_text()
    c = quick["video_files_decode"]
    assert c.ok and c.skipped == doctor.DECODE_OFF and c.skipped.startswith("not run")
    assert "SKIP video_files_decode (not run: decoding every frame is opt-in" in quick.to_text()

    report = _run(out, decode=True)
    assert not report.ok and _failed(report) == {"video_files_decode"}, report.to_text()
    c = report["video_files_decode"]
    assert c.severity == "error" and not c.skipped and c.n_violations == 1  # the AV1 camera's mp4 decodes in order
    r = c.sample[0]
    assert (r["video_key"], r["path"], r["codec"]) == ("observation.images.depth", DEPTH_MP4, "hevc")
    assert (r["frame"], r["pts"], r["episodes"], r["frames_in_index"]) == (22, 11264, [1, 2], 36)
    assert r["pts_s"] == pytest.approx(22 / 30)
    assert r["n_out_of_order"] > 0 and r["n_extra"] == 0 and r["error"] is None
    assert r["frames_decoded"] + r["n_missing"] == 36
    assert "not in pts order from decoded frame" in r["problem"]
    assert "open-GOP keyframe" in c.hint and "Re-encode the file or re-export it" in c.hint
    text = report.to_text()
    assert "FAIL video_files_decode: 1 violation(s)" in text and DEPTH_MP4 in text and "episodes=[1, 2]" in text


def test_decode_passes_the_same_export_with_the_bla_fix(datasets, tmp_path):
    out = _export_depth4_cut_mid_gop(datasets, tmp_path / "out")
    report = _run(out, decode=True)
    c = report["video_files_decode"]
    assert report.ok and not c.skipped and c.ok and c.n_violations == 0, report.to_text()


def test_decode_names_every_image_cell_that_does_not_decode(datasets, tmp_path):
    """img5_extras (images in Parquet) with the front PNG of episode 1, frame 57 cut to 50 bytes and the wrist cell
    of episode 3, frame 0 left with only a path: --decode passed it (only mp4s were decoded) while those items
    raise. Now data_images_decode names the data file, row, episode, index and column of both, in the items'
    words; without decode=True it says it did not run, and the intact dataset passes it."""
    from lerobot_sql.errors import DatasetFormatError

    clean = _clean("img5_extras", decode=True)["data_images_decode"]
    assert clean.ok and not clean.skipped and clean.n_violations == 0
    root = _copy(datasets, tmp_path, "img5_extras")
    t = pq.read_table(root / DATA)
    ep, fi, idx = (t[c].to_numpy() for c in ("episode_index", "frame_index", "index"))
    cut, pathless = int(np.flatnonzero((ep == 1) & (fi == 57))[0]), int(np.flatnonzero((ep == 3) & (fi == 0))[0])

    def damage(table):
        table = _set(table, "observation.images.front",
                     lambda v: [dict(x, bytes=x["bytes"][:50]) if i == cut else x for i, x in enumerate(v)])
        return _set(table, "observation.images.wrist",
                    lambda v: [dict(x, bytes=None, path="frame_000000.png") if i == pathless else x
                               for i, x in enumerate(v)])

    _edit_parquet(root / DATA, damage)
    quick = _run(root)
    assert quick.ok and quick["data_images_decode"].skipped == doctor.IMAGE_DECODE_OFF

    report = _run(root, decode=True)
    assert _failed(report) == {"data_images_decode"}, report.to_text()
    c = report["data_images_decode"]
    assert c.severity == "error" and c.n_violations == 2
    assert c.sample == [
        {"path": DATA, "row": cut, "episode_index": 1, "index": int(idx[cut]), "column": "observation.images.front",
         "error": "is not a readable image (OSError: image file is truncated)"},
        {"path": DATA, "row": pathless, "episode_index": 3, "index": int(idx[pathless]),
         "column": "observation.images.wrist", "error": "holds no image bytes"}]
    ds = lsql.connect(root).dataset()
    for row in c.sample:  # the items of those rows raise, naming the same column and index
        with pytest.raises(DatasetFormatError, match=f"column '{row['column']}' .*index {row['index']}\\) "
                           + row["error"].split(" (")[0]):
            ds[row["index"]]
    assert "FAIL data_images_decode: 2 violation(s)" in report.to_text()


def _rewrite_dts(path, dts_of) -> list[tuple[int, int]]:
    """Remux the mp4 ``path`` in place, each packet's bytes and pts kept and its dts ``dts_of(dts, previous dts)``;
    returns the new (pts, dts) in decode order."""
    import av

    tmp = path.with_name("rewrite.mp4")
    out_pkts, last = [], None
    with av.open(str(path)) as inp, av.open(str(tmp), "w", format="mp4", options={"movflags": "faststart"}) as out:
        s = inp.streams.video[0]
        o = out.add_stream_from_template(s, opaque=True)
        o.time_base = s.time_base
        out.start_encoding()
        for pkt in inp.demux(s):
            if pkt.pts is None:
                continue
            last = min(dts_of(pkt.dts, last), pkt.pts)
            pkt.dts, pkt.stream = last, o
            out_pkts.append((pkt.pts, last))
            out.mux(pkt)
    tmp.replace(path)
    return out_pkts


def test_decode_finds_an_mp4_that_decodes_in_order_but_not_after_a_seek(datasets, tmp_path):
    """depth4's episode 0 cut at frame 3 (mid-GOP) as export wrote it before the dts fix (rebuilt here from today's
    export: the same packets and pts, the old dts): the re-encoded head's dts 0, 1, 2, then the copied packets'
    512, 1024, ... It decodes front to back exactly as indexed, but FFmpeg seeks by dts, so a seek to the keyframe
    at pts 512 decodes pts 1536 first and items read at random raise "decoding skipped"; doctor --decode passed it.
    Now video_files_decode names the file, the first keyframe a seek misses (frame 1, pts 512) and episode 0."""
    from lerobot_sql.errors import VideoDecodeError

    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # depth4's float depth is quantized
        lsql.connect(datasets / "depth4").export(
            "SELECT 0 AS episode_index, 0.1 AS start_s, 0.5 AS end_s", out, progress=False)
    pkts = _rewrite_dts(out / DEPTH_MP4, lambda dts, last: max(dts - 512, 0 if last is None else last + 1))
    assert [d for _, d in pkts[:5]] == [0, 1, 2, 512, 1024]  # the file the old writer wrote
    with pytest.raises(VideoDecodeError, match="decoding skipped pts=512 .got 1536"):
        lsql.connect(out).dataset()[1]

    report = _run(out, decode=True)
    assert _failed(report) == {"video_files_decode"}, report.to_text()
    c = report["video_files_decode"]
    assert c.n_violations == 1  # the AV1 camera's mp4 seeks right
    r = c.sample[0]
    assert (r["video_key"], r["path"], r["codec"]) == ("observation.images.depth", DEPTH_MP4, "hevc")
    assert (r["frame"], r["pts"], r["episodes"], r["frames_in_index"], r["frames_decoded"]) == (1, 512, [0], 12, 12)
    assert r["n_out_of_order"] == r["n_missing"] == r["n_extra"] == 0 and r["error"] is None
    assert r["n_bad_seeks"] > 0 and "seeks to a keyframe decoded another frame first" in r["problem"]
    assert "keyframe pts 512 (0.033 s), pts 1536 (0.100 s) decoded first" in r["problem"]
    assert doctor._SEEK in c.hint


@pytest.mark.parametrize("name", ["small20", *(pytest.param(n, marks=pytest.mark.slow) for n in (
    "multifile60", "h264_20", "depth4"))])  # decode=True decodes every frame: small20 in the fast tier
def test_shipped_samples_decode_as_indexed(name):
    report = _clean(name, decode=True)
    c = report["video_files_decode"]
    assert report.ok and not _failed(report) and not c.skipped and c.ok, report.to_text()
    assert c.description.startswith("every mp4 decodes front to back")


def test_decode_of_a_truncated_mp4_is_reported_not_raised(datasets, tmp_path):
    """A file cut at 60 %: decoding stops with an error at the packet the cut goes through (dav1d refuses it); the
    frames from there on are missing, and every episode with frames from there on is named. (An H.264 file with
    B-frames is indexed only up to the cut, so there the other video checks name the episodes past it.)"""
    root = _copy(datasets, tmp_path, "small20")
    size = (root / FRONT_MP4).stat().st_size
    with open(root / FRONT_MP4, "r+b") as f:
        f.truncate(int(size * 0.6))
    report = _run(root, decode=True)
    assert _failed(report) == {"video_files_complete", "video_files_decode"}, report.to_text()
    past_end = report["video_files_complete"].sample[0]["frames_past_end"]
    c = report["video_files_decode"]
    assert c.n_violations == 1
    r = c.sample[0]
    n = int(pq.read_metadata(root / DATA).num_rows)
    assert (r["video_key"], r["path"], r["codec"], r["frames_in_index"]) == ("observation.images.front", FRONT_MP4,
                                                                            "av1", n)
    # the frames that never decoded are the file's last ones, at least those whose bytes are past the end
    assert r["n_missing"] >= past_end and r["frame"] == n - r["n_missing"] and r["frames_decoded"] == r["frame"]
    assert r["pts_s"] == pytest.approx(r["frame"] / 30) and r["pts"] == r["frame"] * 512
    first, counts = _first_frames(root)
    assert r["episodes"] == [e for e in range(len(counts)) if first[e] + counts[e] > r["frame"]]
    assert r["error"].startswith("InvalidDataError") and "1 decode error(s)" in r["problem"]
    assert "cut short" in c.hint and "damaged" not in c.hint


def test_decode_error_inside_an_mp4_names_the_frame_and_its_episode(datasets, tmp_path):
    """Garbage over the packet of frame 1000 (episode 3 of small20's front camera): the packets decode around it,
    the frames it and its dependants held are missing, and only episode 3 is named."""
    root = _copy(datasets, tmp_path, "small20")
    db = lsql.connect(root)
    off, pts = db.sql(f"SELECT byte_offset, pts FROM video_frames WHERE path = '{FRONT_MP4}' AND frame = 1000"
                      ).fetchall()[0]
    with open(root / FRONT_MP4, "r+b") as f:
        f.seek(off + 2)
        f.write(bytes(range(256)) * 2)
    report = _run(root, decode=True)
    assert _failed(report) == {"video_files_decode"}, report.to_text()
    r = report["video_files_decode"].sample[0]
    first, counts = _first_frames(root)
    ep = int(np.searchsorted(first, 1000, side="right") - 1)
    assert (r["path"], r["frame"], r["pts"], r["episodes"]) == (FRONT_MP4, 1000, pts, [ep])
    assert r["error"] and r["n_missing"] > 0 and r["n_out_of_order"] == 0
    assert "damaged" in report["video_files_decode"].hint and "cut short" not in report["video_files_decode"].hint


def test_decode_comparison_counts_repeats_extras_and_drops(datasets):
    """verify.compare_decode on decoder outputs no sample file gives: a pts output twice, one not in the index, and the
    lead-in frames an edit list tells the decoder to drop (a stream-copied cut), which are not missing."""
    from fractions import Fraction

    from lerobot_sql._readers.decode import DecodedStream

    want = np.arange(-2, 10, dtype=np.int64) * 512  # frames 0, 1 are an edit list's lead-in (negative pts)
    clips = [(0, -0.5 / 30, 5.5 / 30), (1, 5.5 / 30, 9.5 / 30)]
    tb = Fraction(1, 15360)
    drop = np.array([-1024, -512], np.int64)
    clean = DecodedStream("v.mp4", tb, want[2:], discarded_pts=drop)
    assert verify.compare_decode(want, clean, clips) is None
    got = DecodedStream("v.mp4", tb, np.array([0, 512, 1024, 1024, 1536, 2048, 2560, 3072, 3300, 3584, 4096, 4608]),
                        discarded_pts=drop)
    r = verify.compare_decode(want, got, clips)
    assert (r["frame"], r["pts"], r["episodes"]) == (4, 1024, [0, 1])
    assert (r["n_out_of_order"], r["n_missing"], r["n_extra"], r["frames_decoded"]) == (1, 0, 1, 12)
    assert "1 pts output more than once (first pts 1024)" in r["problem"]
    assert "1 decoded pts not in the index (first pts 3300" in r["problem"]
    assert verify.compare_decode(want, DecodedStream("v.mp4", tb, want[2:]), clips)["n_missing"] == 2  # no drop


@pytest.mark.parametrize("text, match", [
    ('{"action": {"mean": "oops"}', r"not valid JSON"),
    ('{"action": {"mean": [1, 2], "std": [1, 1, 1, 1, 1, 1]}}', r"'action'.*'mean'"),
])
def test_a_broken_stats_json_fails_stats_json_valid(datasets, tmp_path, text, match):
    """meta/stats.json that does not parse, or a statistic whose size does not fit its feature: ds.meta.stats
    (stats="dataset") and db.stats() raise naming it, and doctor passed it. Now stats_json_valid fails with that
    error; the sample as written passes it, and a dataset without the file skips it."""
    root = _copy(datasets, tmp_path, "small20")
    report = _run(root)
    assert report["stats_json_valid"].ok and not report["stats_json_valid"].skipped, report.to_text()
    (root / "meta/stats.json").write_text(text)
    report = _run(root)
    c = report["stats_json_valid"]
    assert not report.ok and _failed(report) == {"stats_json_valid"} and c.n_violations == 1, report.to_text()
    assert re.search(match, c.sample[0]["error"]) and "meta/stats.json" in c.sample[0]["error"], c.sample
    (root / "meta/stats.json").unlink()
    assert _run(root)["stats_json_valid"].skipped == "no meta/stats.json"


# ---- coverage: video checks that ran on nothing (issue 36, real data 5) -----------------------------------------
def test_missing_clip_timestamps_still_get_the_file_and_index_checks(datasets, tmp_path):
    """meta/episodes without videos/*/from_timestamp and to_timestamp (chunk and file index kept), info.json at 15
    fps over 30 fps mp4s: doctor skipped every video check ("points to no mp4"), so the stream of another rate went
    unreported. Now the mp4s the pointers name are probed and indexed: video_stream_rate names both files and rates,
    the file checks run, the pointer check fails naming both cameras, and the checks that need clip bounds say why
    they skip (never a violation per frame of a clip that has no bounds)."""
    root = _copy_files(datasets, tmp_path, "small20", EPISODES, "meta/info.json")
    _edit_parquet(root / EPISODES, lambda t: t.drop_columns(
        [c for c in t.column_names if c.startswith("videos/") and c.endswith("_timestamp")]))
    info = json.loads((root / "meta/info.json").read_text())
    info["fps"] = 15
    (root / "meta/info.json").write_text(json.dumps(info))
    report = _run(root, tolerance_s=1.0)
    c = report["video_stream_rate"]
    assert not c.skipped, c.skipped
    assert [(r["video_key"], r["path"], r["info_fps"], r["stream_fps"]) for r in c.sample] == [
        (f"observation.images.{k}", f"videos/observation.images.{k}/chunk-000/file-000.mp4", 15.0, 30.0)
        for k in ("front", "wrist")]
    for name in ("video_files_present", "video_files_readable", "video_files_complete", "video_codec"):
        assert not report[name].skipped and report[name].ok, name
    assert [r["video_key"] for r in report["video_pointers_present"].sample] == [
        "observation.images.front", "observation.images.wrist"]
    for name in ("video_segments", "video_segment_frames", "video_clip_frames", "video_frame_pts"):
        assert report[name].ok and "from_timestamp" in (report[name].skipped or ""), (name, report[name].skipped)
    # (frame_index_contiguous: the data's 30 fps timestamps against info.json's 15)
    assert _failed(report) == {"frame_index_contiguous", "video_pointers_present", "video_stream_rate"}, \
        report.to_text()


def test_some_mp4s_missing_the_present_ones_are_still_checked(datasets, tmp_path):
    """multifile60 with 2 of its mp4s gone and another one cut short: every index check was skipped ("2 video
    file(s) missing"), so the cut file went unreported. Now the missing files are named by video_files_present and
    the present ones are indexed and checked: video_files_complete names the cut one; no check reports a violation
    for the episodes of the missing files (their frames have no index to be checked against)."""
    gone = ["videos/observation.images.wrist/chunk-001/file-000.mp4",
            "videos/observation.images.front/chunk-000/file-001.mp4"]
    cut = "videos/observation.images.front/chunk-000/file-000.mp4"
    root = _copy_files(datasets, tmp_path, "multifile60", cut)
    for rel in gone:
        (root / rel).unlink()
    size = (root / cut).stat().st_size
    with open(root / cut, "r+b") as f:
        f.truncate(int(size * 0.6))
    report = _run(root)
    assert sorted(r["path"] for r in report["video_files_present"].sample) == sorted(gone)
    c = report["video_files_complete"]
    assert not c.skipped and [r["path"] for r in c.sample] == [cut]
    for name in ("video_frame_pts", "video_segment_frames", "video_clip_frames", "video_stream_rate"):
        assert not report[name].skipped, (name, report[name].skipped)
        assert all(r.get("path") not in gone for r in report[name].sample), name
    # the episodes of the cut file fail the frame checks, those of the missing files are not reported as such
    assert _failed(report) >= {"video_files_present", "video_files_complete"}


def test_a_video_folder_named_by_the_template_is_what_the_hint_names(datasets, tmp_path):
    """info.json's video_path 'video/{video_key}/...' (not 'videos/'), one mp4 missing: the hint said
    allow_patterns='videos/*', a folder the dataset does not have. It names the template's folder now."""
    import shutil

    root = _copy_files(datasets, tmp_path, "small20", "meta/info.json")
    shutil.move(root / "videos", root / "video")
    info = json.loads((root / "meta/info.json").read_text())
    assert info["video_path"].startswith("videos/")
    info["video_path"] = "video/" + info["video_path"][len("videos/"):]
    (root / "meta/info.json").write_text(json.dumps(info))
    gone = "video/observation.images.wrist/chunk-000/file-000.mp4"
    (root / gone).unlink()
    report = _run(root)
    c = report["video_files_present"]
    assert [r["path"] for r in c.sample] == [gone]
    assert "allow_patterns='video/*'" in c.hint and "videos/*" not in c.hint, c.hint
    assert "videos/*" not in report.to_text()
    assert _failed(report) == {"video_files_present"}, report.to_text()


def test_the_stats_call_doctor_recommends_works_on_wall_clock_timestamps(datasets, tmp_path):
    """A broken meta/stats.json on a dataset whose timestamps stray from frame_index / fps (info.json's fps 29 over
    30 fps data): doctor recommended db.stats('SELECT episode_index FROM episodes'), which was refused asking for a
    tolerance_s that db.stats does not take. The call the hint names now computes every feature's statistics."""
    import re

    root = _copy_files(datasets, tmp_path, "small20", "meta/info.json", "meta/stats.json")
    info = json.loads((root / "meta/info.json").read_text())
    info["fps"] = 29
    (root / "meta/info.json").write_text(json.dumps(info))
    (root / "meta/stats.json").write_text('{"action": {"mean": "oops"}}')
    report = _run(root, check_video=False)
    c = report["stats_json_valid"]
    assert not c.ok
    (call,) = re.findall(r"db\.stats\('[^']*'\)", c.hint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = lsql.connect(root)
    st = eval(call, {"db": db})  # the very call the hint names
    assert set(st) == set(json.loads((datasets / "small20" / "meta/stats.json").read_text()))
    with pytest.raises(lsql.errors.MissingFileError, match=re.escape(call)):
        (root / "meta/stats.json").unlink()
        db.stats()


# ---- every hint names options that exist (issue 36, real data 5) --------------------------------------------------
PUBLIC_MODULES = ("lerobot_sql", "lerobot_sql.db", "lerobot_sql.collection", "lerobot_sql.export",
                  "lerobot_sql.doctor", "lerobot_sql.display", "lerobot_sql.stats", "lerobot_sql.nearest",
                  "lerobot_sql.prefetch", "lerobot_sql.torch.dataset", "lerobot_sql.torch.samplers",
                  "lerobot_sql.torch.shard", "lerobot_sql.torch.ray_data", "lerobot_sql.torch.meta",
                  "lerobot_sql.torch.mixture", "lerobot_sql.torch.train")
# Options of other libraries that hints name, with the library: not lerobot_sql's to check.
EXTERNAL_OPTIONS = {"client_kwargs": "fsspec's HTTPFileSystem (storage_options)",
                    "allow_patterns": "huggingface_hub.snapshot_download"}


def _public_callables():
    """The public callables a hint may name, by the name hints call them: Database's and Collection's methods,
    connect / connect_many (their keywords are Database's / Collection's), doctor.run, the export functions."""
    import lerobot_sql.export as ex
    from lerobot_sql.collection import Collection

    out: dict[str, list] = {}
    for cls in (lsql.Database, Collection):
        for name in dir(cls):
            if not name.startswith("_") and callable(getattr(cls, name)):
                out.setdefault(name, []).append(getattr(cls, name))
    out["export"] += [ex.export_dataset]  # Database.export(sql, dest, **kwargs) passes them on
    out["export_manifest"] += [ex.export_manifest]
    out["connect"] = [lsql.connect, lsql.Database.__init__]
    out["connect_many"] = [lsql.connect_many, Collection.__init__]
    out["run"] = [doctor.run]
    return out


def _every_public_parameter() -> set[str]:
    """Every parameter of every public function, method and class of the public modules."""
    import importlib
    import inspect

    names: set[str] = set()
    for mod in map(importlib.import_module, PUBLIC_MODULES):
        for attr in dir(mod):
            obj = getattr(mod, attr)
            if attr.startswith("_") or not callable(obj) or not getattr(obj, "__module__", "").startswith("lerobot"):
                continue
            members = [obj] + ([v for k, v in vars(obj).items() if callable(v) and (not k.startswith("_") or
                                                                                    k == "__init__")]
                               if inspect.isclass(obj) else [])
            for f in members:
                try:
                    names |= set(inspect.signature(f).parameters)
                except (TypeError, ValueError):
                    continue
    return names


def _hint_strings():
    """(file, line, text) of every string literal in lerobot_sql outside docstrings (f-strings with {} for their
    fields), adjacent literals joined as Python joins them."""
    import ast
    import pathlib

    pkg = pathlib.Path(lsql.__file__).parent
    for path in sorted(pkg.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        parts = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.JoinedStr):
                parts.update(id(v) for v in n.values)
        for n in ast.walk(tree):
            if isinstance(n, ast.JoinedStr):
                yield path.name, n.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs | parts:
                yield path.name, n.lineno, n.value


def test_every_hint_names_an_option_the_function_it_names_takes():
    """Hints in error messages and reports name calls users then type: "dataset(..., cameras=[...])",
    "db.export(sql, dest, features=[...])". For every such call in every message of the package, the option is a
    parameter of the function named (Database, Collection, connect, doctor.run, export); and every option advised
    alone ("pass X=...") is a parameter of some public function. (db.stats and db.export were advised
    "cameras=", which neither took.)"""
    import inspect
    import re

    funcs = _public_callables()

    def params(f):
        return set(inspect.signature(f).parameters)

    everything = _every_public_parameter() | set(EXTERNAL_OPTIONS)
    call = re.compile(r"(?:\b(?:db|ds|coll|lsql|doctor|export)\.)?\b(\w+)\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
    bad = []
    for where, line, text in _hint_strings():
        for m in call.finditer(text):
            name, args = m.group(1), m.group(2)
            if name not in funcs:
                continue
            for opt in re.findall(r"(?<![\w.'\"])([a-z_]\w*)=(?!=)", args):
                if not any(opt in params(f) for f in funcs[name]):
                    bad.append(f"{where}:{line}: {name}(..., {opt}=) in {text[:120]!r}")
        for opt in re.findall(r"\b(?:[Pp]ass|[Uu]se|[Tt]ry|[Ss]et) ([a-z_]\w*)=", text):
            if opt not in everything:
                bad.append(f"{where}:{line}: {opt}= in {text[:120]!r}")
    assert not bad, "\n".join(bad)
