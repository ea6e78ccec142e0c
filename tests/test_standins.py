"""First-tier checks of what only the real-data tests (second tier) checked, on stand-ins built from small20.

tests/standins.py builds each stand-in; tests/README.md maps each real-data test to the test here that covers the
same behaviour without the external corpus. Truth: small20's own items (whose equality with lerobot's is
test_dataset.py's reference test), a direct sequential PyAV decode of the per-episode mp4s, framecode.
"""

from __future__ import annotations

import glob
import json
import warnings

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
import standins
from helpers import decode_planar_and_packed
from lerobot_sql import doctor
from lerobot_sql._format.layout import load_layout
from lerobot_sql._plan import resolve as plan
from lerobot_sql._readers import decode, tabular, video_index
from lerobot_sql._storage.source import open_source
from standins import DATA, EPISODES, FRONT, TASKS, WRIST, video_rel

DELTA = {"observation.state": [-2 / 30, -1 / 30, 0.0], "action": [i / 30 for i in range(10)],
         FRONT: [-1 / 30, 0.0], WRIST: [-1 / 30, 0.0]}


@pytest.fixture(scope="module")
def g1(datasets, tmp_path_factory):
    """(root, builder result, per-episode wrist frames (decode truth), small20 connection)."""
    root = tmp_path_factory.mktemp("standin") / "g1_like"
    made = standins.g1_like(datasets / "small20", root)
    truth = {e: standins.decode_all(p) for e, p in made["per_episode"].items()}
    return root, made, truth, lsql.connect(datasets / "small20")


def _picks(lengths):
    """Frames on both sides of every episode and file boundary, plus a few inside."""
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    out = {0, 1, 100, int(starts[-1]) - 1}
    for s in starts[1:-1]:
        out |= {int(s) - 1, int(s), int(s) + 1}
    return sorted(out)


def _no_join():
    raise AssertionError("the pointer path fell back to the DuckDB join")


def _u8_to_float(img_hwc: np.ndarray) -> np.ndarray:
    """lerobot's conversion of a decoded frame: float32(u8) / 255, channels first."""
    return img_hwc.transpose(2, 0, 1).astype(np.float32) / np.float32(255)


# ---- g1_real_v30: items, frames, DataLoader --------------------------------------------------------------------
def test_g1_like_layout_is_what_the_real_set_has(g1):
    root, made, _, _ = g1
    pf = pq.ParquetFile(root / DATA)
    assert pf.num_row_groups == 1 and b"pandas" in pf.schema_arrow.metadata
    assert b"huggingface" not in pf.schema_arrow.metadata
    assert pa.types.is_list(pf.schema_arrow.field("observation.state").type)
    assert not any("/q01" in c for c in pq.read_schema(root / EPISODES).names)
    for key in (FRONT, WRIST):
        assert sorted(p.name for p in (root / "videos" / key / "chunk-000").iterdir()) == ["file-000.mp4",
                                                                                           "file-001.mp4"]
    with av.open(str(root / video_rel(WRIST, 0))) as c:
        s = c.streams.video[0]
        assert (s.codec_context.height, s.codec_context.width) == made["wrist_hw"] == (480, 640)
    with av.open(str(root / video_rel(WRIST, 1))) as c:   # episodes 2 (odd length, 277) and 3, joined
        keys = [p.pts // standins.STEP for p in c.demux(c.streams.video[0]) if p.pts is not None and p.is_keyframe]
    assert 277 in keys and 276 in keys   # keyframes 1 frame apart at the join, as in g1's joined files


@pytest.mark.parametrize("mode", ["plain", "delta"])
def test_g1_like_items_equal_small20_items_and_a_direct_decode(g1, mode, framecode):
    """The g1 parity on generated data: 2 files per camera at 2 resolutions. Tabular values and the stream-copied
    96x128 camera equal small20's items bit for bit; the joined 480x640 camera equals PyAV's sequential decode of
    the per-episode mp4 it was joined from, converted as lerobot converts (float32(u8) / 255)."""
    root, made, truth, small = g1
    lengths = made["lengths"]
    dt = DELTA if mode == "delta" else None
    ds = lsql.connect(root).dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=dt)
    ref = small.dataset(f"SELECT index FROM frames WHERE episode_index < {len(lengths)} ORDER BY index",
                        delta_timestamps=dt)
    assert len(ds) == len(ref) == sum(lengths)
    for i in _picks(lengths):
        a, b = ds[i], ref[i]
        assert set(a) == set(b), i
        ep, f = int(b["episode_index"]), int(b["frame_index"])
        for k in a:
            if k == WRIST:
                continue
            if isinstance(a[k], torch.Tensor):
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (i, k)
            else:
                assert a[k] == b[k], (i, k)
        if mode == "plain":
            assert a[WRIST].shape == (3, 480, 640) and a[WRIST].dtype == torch.float32
            np.testing.assert_array_equal(a[WRIST].numpy(), _u8_to_float(truth[ep][f]), err_msg=f"index {i}")
            img = (a[WRIST].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            assert framecode.verify_frame(img, ep, f, 2)["ok"], (ep, f)
        else:
            assert a[WRIST].shape == (2, 3, 480, 640)
            assert a[f"{WRIST}_is_pad"].tolist() == b[f"{WRIST}_is_pad"].tolist() == [f == 0, False]
            for j, g in enumerate((max(f - 1, 0), f)):   # a padded position repeats the episode's first frame
                np.testing.assert_array_equal(a[WRIST][j].numpy(), _u8_to_float(truth[ep][g]), err_msg=f"{i}/{j}")


@pytest.mark.slow  # decodes every frame
def test_g1_like_every_joined_frame_equals_the_per_episode_decode(g1, framecode):
    """check_converted_frames.py's check, on the stand-in: every frame read through the joined files is the
    per-episode mp4's frame, bit for bit (uint8), and carries its own codeword."""
    root, made, truth, _ = g1
    ds = lsql.connect(root).dataset("SELECT index FROM frames ORDER BY index", cameras=[WRIST], return_uint8=True)
    n = 0
    for i in range(len(ds)):
        item = ds[i]
        ep, f = int(item["episode_index"]), int(item["frame_index"])
        got = item[WRIST].permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(got, truth[ep][f], err_msg=f"index {i}")
        if f % 9 == 0:
            assert framecode.verify_frame(got, ep, f, 2)["ok"], (ep, f)
        n += 1
    assert n == sum(made["lengths"])


def test_g1_like_dataloader_two_workers_matches_direct_decode(g1):
    root, made, truth, _ = g1
    db = lsql.connect(root)
    sql = "SELECT index FROM frames WHERE frame_index % 40 = 0 OR frame_index = 1 ORDER BY index"
    ds = db.dataset(sql, return_uint8=True)
    batches = list(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False, num_workers=2))
    got = torch.cat([b[WRIST] for b in batches])
    eps = torch.cat([b["episode_index"] for b in batches]).tolist()
    fis = torch.cat([b["frame_index"] for b in batches]).tolist()
    assert torch.cat([b["index"] for b in batches]).tolist() == [r[0] for r in db.sql(sql).fetchall()]
    assert len(got) == len(ds) > 2 * len(made["lengths"])
    for k, (e, f) in enumerate(zip(eps, fis)):
        np.testing.assert_array_equal(got[k].permute(1, 2, 0).numpy(), truth[e][f], err_msg=f"{e}/{f}")


# ---- g1_real_v30: video index, decoder, conversion -----------------------------------------------------------
@pytest.mark.parametrize("key,file_index", [(WRIST, 0), (FRONT, 1)])
def test_g1_like_index_equals_full_demux_and_decoder_reads_exact_frames(g1, tmp_path, key, file_index):
    root = g1[0]
    rel = video_rel(key, file_index)
    src = open_source(root)
    pq_index = pq.read_table(video_index.ensure_index(src, rel, tmp_path))
    with av.open(str(root / rel)) as c:
        s = c.streams.video[0]
        pk = sorted((p.pts, bool(p.is_keyframe), p.pos, p.size) for p in c.demux(s) if p.pts is not None)
    assert pq_index["pts"].to_pylist() == [p[0] for p in pk]
    assert pq_index["is_keyframe"].to_pylist() == [p[1] for p in pk]
    assert pq_index["byte_offset"].to_pylist() == [p[2] for p in pk]
    assert pq_index["byte_size"].to_pylist() == [p[3] for p in pk]
    index = video_index.FrameIndex.load(video_index.ensure_index_arrow(src, rel, tmp_path))
    full = [f.transpose(2, 0, 1) for f in standins.decode_all(root / rel)]
    assert len(index.pts) == len(full)
    rng = np.random.default_rng(0)
    pool = decode.DecoderPool(src, max_open=2)
    for rows in (np.arange(0, 12), rng.integers(0, len(full), 20), np.array([len(full) - 1, 0, len(full) // 2])):
        got = pool.decode_chw(index, rows)
        for j, r in enumerate(rows):
            np.testing.assert_array_equal(got[j], full[r], err_msg=f"{rel} row {r}")


def test_g1_like_planar_and_packed_conversion_agree_at_480x640(g1, tmp_path):
    root = g1[0]
    src = open_source(root)
    a, b = decode_planar_and_packed(src, video_rel(WRIST, 0), tmp_path)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 3, 480, 640)


# ---- g1_real_v30: tabular, catalog, pointers, doctor ------------------------------------------------------------
def test_g1_like_row_group_equals_the_parquet_rows_and_column_kinds(g1, tmp_path):
    root = g1[0]
    src = open_source(root)
    layout = load_layout(src)
    info = tabular.data_file_info(src, DATA)
    pf = pq.ParquetFile(root / DATA)
    assert info.rg_offsets.tolist() == [0, pf.metadata.num_rows]
    (got,) = tabular.read_row_groups(src, info, [0], layout)
    want = pf.read_row_group(0)
    for name in want.column_names:
        a, b = got[name].to_pylist(), want[name].to_pylist()
        assert a == b, name
    view = tabular.RowGroupView(got, layout)
    assert view.column("observation.state").shape == (pf.metadata.num_rows, 6)
    for field in info.schema:
        assert tabular.is_numeric(field, layout) == isinstance(view.column(field.name), np.ndarray), field


def test_g1_like_episode_stats_without_quantiles(g1):
    root = g1[0]
    t = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(str(root / "meta/episodes/*/*.parquet")))])
    want = {}
    for c in t.column_names:
        if c.startswith("stats/"):
            feature, stat = c[len("stats/"):].rsplit("/", 1)
            for ep, v in zip(t["episode_index"].to_pylist(), t[c].to_pylist()):
                want[(ep, feature, stat)] = np.asarray(v, np.float64).ravel().tolist()
    got = {(e, f, s): v for e, f, s, v in lsql.connect(root).sql(
        "SELECT episode_index, feature, stat, value FROM episode_stats").fetchall()}
    assert len(want) > 0 and got == want
    assert {s for _, _, s in want} == {"min", "max", "mean", "std", "count"}  # no quantiles, as in g1


def test_g1_like_fast_manifest_equals_the_join(g1):
    db = lsql.connect(g1[0])
    sql = "SELECT episode_index, length * 2 AS twice FROM episodes WHERE episode_index <> 1 ORDER BY length DESC"
    res = db.sql(sql).arrow()
    fast = plan.build_manifest(_no_join, db.layout, res, sql=sql, src=db.source)
    slow = plan.build_manifest(db.con, db.layout, res, sql=sql)
    assert fast.equals(slow)
    assert fast.num_rows == sum(n for e, n in enumerate(g1[1]["lengths"]) if e != 1)


def test_g1_like_passes_the_doctor(g1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = doctor.run(lsql.connect(g1[0]))
    assert report.ok and not [c.name for c in report.checks if not c.ok], report.to_text()
    ran = {c.name for c in report.checks if not c.skipped}
    assert {"video_files_present", "video_segments", "video_segment_frames", "video_frame_pts",
            "video_files_complete", "data_files_decode"} <= ran


# ---- record-test: mp4s missing, action first --------------------------------------------------------------------
@pytest.fixture(scope="module")
def record(datasets, tmp_path_factory):
    return standins.record_like(datasets / "small20", tmp_path_factory.mktemp("standin") / "record_like")


def test_record_like_tables_work_and_frames_name_the_missing_mp4(record):
    db = lsql.connect(record)
    data = pq.read_table(record / DATA)
    assert pq.ParquetFile(record / DATA).num_row_groups == 4
    assert pq.read_schema(record / TASKS).field("__index_level_0__").type == pa.string()
    assert db.sql("SELECT count(*), max(index) FROM frames").fetchall() == [(data.num_rows, data.num_rows - 1)]
    assert [r[0] for r in db.con.sql("DESCRIBE frames").fetchall()][0] == "action"  # column order kept
    got = db.sql('SELECT "action" FROM frames WHERE index = 500').fetchall()[0][0]
    assert list(got) == data["action"][500].as_py()
    with pytest.warns(UserWarning, match="video file\\(s\\) are missing"):
        ds = db.dataset("SELECT index FROM frames WHERE episode_index = 2 ORDER BY index")
    with pytest.raises(lsql.MissingFileError, match=r"videos/observation\.images\.(front|wrist)/chunk-000/file-000\.mp4"
                                                     r".*cameras=\[\]"):
        ds[0]
    item = db.dataset("SELECT index FROM frames WHERE episode_index = 2 ORDER BY index", cameras=[])[0]
    assert int(item["episode_index"]) == 2 and int(item["frame_index"]) == 0
    assert item["task"] == db.tasks()[int(item["task_index"])]
    assert item["observation.state"].shape == (6,)


def test_record_like_doctor_reports_its_missing_videos_only(record):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = doctor.run(lsql.connect(record))
    assert not report.ok and {c.name for c in report.checks if not c.ok} == {"video_files_present"}
    assert {r["path"] for r in report["video_files_present"].sample} == {video_rel(k, 0) for k in (FRONT, WRIST)}
    assert report["video_frame_pts"].skipped and "missing" in report["video_frame_pts"].skipped
    js = json.loads(report.to_json())
    assert js["ok"] is False and [c["name"] for c in js["checks"]] == [c.name for c in report.checks]


def test_record_like_fast_manifest_equals_the_join(record):
    db = lsql.connect(record)
    sql = "SELECT episode_index FROM episodes WHERE episode_index % 3 <> 1 ORDER BY length DESC"
    res = db.sql(sql).arrow()
    fast = plan.build_manifest(_no_join, db.layout, res, sql=sql, src=db.source)
    assert fast.equals(plan.build_manifest(db.con, db.layout, res, sql=sql))
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    assert fast.num_rows == sum(lengths[e] for e in res["episode_index"].to_pylist())


# ---- oc_models_meta_only and the aloha pre-release JSON ---------------------------------------------------------
@pytest.mark.filterwarnings("ignore:.*data file\\(s\\) that meta/episodes points to are missing")
def test_meta_only_opens_with_empty_frames(datasets, tmp_path):
    root = standins.meta_only(datasets / "small20", tmp_path / "meta_only")
    assert pq.read_schema(root / EPISODES).metadata is None and pq.ParquetFile(root / EPISODES).num_row_groups == 5
    with pytest.warns(UserWarning, match="no data files"):
        db = lsql.connect(root)
    ep = pq.read_table(root / EPISODES, columns=["episode_index", "length"])
    assert db.sql("SELECT episode_index, length FROM episodes ORDER BY 1").fetchall() == \
        list(zip(ep["episode_index"].to_pylist(), ep["length"].to_pylist()))
    assert db.sql("SELECT count(*) FROM frames").fetchall() == [(0,)]
    cols = {r[0]: r[1] for r in db.con.sql("DESCRIBE frames").fetchall()}
    assert cols["observation.state"] == "FLOAT[6]" and cols["index"] == "BIGINT" and cols["timestamp"] == "FLOAT"
    assert FRONT not in cols  # video features have no column in the data files
    tasks = pq.read_table(root / TASKS)
    assert db.tasks() == dict(zip(tasks["task_index"].to_pylist(), tasks["__index_level_0__"].to_pylist()))
    with pytest.raises(lsql.ResultContractError, match="no rows"):
        db.dataset("SELECT index FROM frames")


def test_prerelease_json_only_opens(datasets, tmp_path):
    """Float fps, files_size_in_mb, video_info, no total_videos, no meta/episodes, no tasks: metadata views only."""
    root = standins.prerelease_json_only(datasets / "small20", tmp_path / "prerelease")
    info = json.loads((root / "meta/info.json").read_text())
    with pytest.warns(UserWarning) as rec:
        db = lsql.connect(root)
    msgs = " | ".join(str(w.message) for w in rec)
    assert "meta/episodes" in msgs and "tasks.parquet" in msgs and "no data files" in msgs
    assert db.fps == 30.0
    assert db.sql("SELECT fps, total_episodes, total_frames FROM info").fetchall() == [(30.0, 20, 4762)]
    feats = dict(db.sql("SELECT name, codec FROM features").fetchall())
    assert feats[FRONT] == info["features"][FRONT]["video_info"]["video.codec"] == "av1"
    assert "next.done" in feats
    for view in ("episodes", "frames", "tasks", "videos", "episode_stats"):
        assert db.sql(f"SELECT count(*) FROM {view}").fetchall() == [(0,)], view
    cols = [r[0] for r in db.con.sql("DESCRIBE episodes").fetchall()]
    assert {"episode_index", "length", "dataset_from_index", f"videos/{FRONT}/from_timestamp"} <= set(cols)


# ---- g1_real_v21: nested-list names ----------------------------------------------------------------------------
def test_v21_nested_list_names(datasets, tmp_path):
    root = standins.nested_names_v21(datasets / "v21_small20", tmp_path / "nested")
    lay = load_layout(open_source(root))
    assert lay.legacy and lay.version == "v2.1"
    assert lay.episode_files == ("meta/episodes.jsonl",)
    assert lay.episode_stats_file == "meta/episodes_stats.jsonl" and lay.tasks_file == "meta/tasks.jsonl"
    assert len(lay.data_files) == 20 and all("/episode_" in f for f in lay.data_files)
    assert lay.features["observation.state"].flat_names[0] == "shoulder_pan.pos"
    assert lay.features["action"].flat_names[-1] == "gripper.pos"
    item = lsql.connect(root).dataset("SELECT index FROM frames WHERE index = 7", cameras=[])[0]
    want = lsql.connect(datasets / "v21_small20").dataset("SELECT index FROM frames WHERE index = 7", cameras=[])[0]
    assert torch.equal(item["observation.state"], want["observation.state"]) and item["task"] == want["task"]
