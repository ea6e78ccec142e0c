"""Collection.export: a cross-dataset selection written as one LeRobot v3.0 dataset (lerobot's aggregate_datasets,
from a query), checked against the collection's own items (frames bit-exact where packets were copied), the
sources' task texts, `lerobot-sql doctor`, and lerobot 0.4.4 reading the result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import renamed_copy
from lerobot_sql import doctor
from test_export import PEER_PYTHON, PEER_SCRIPT, _peer_available

RENUMBERED = {"index", "episode_index", "frame_index", "timestamp", "task_index"}
FRONT, WRIST = "observation.images.front", "observation.images.wrist"


def _episodes(root: Path) -> pd.DataFrame:
    files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def _task_texts(root: Path) -> dict[int, str]:
    t = pd.read_parquet(root / "meta" / "tasks.parquet")  # as lerobot reads it: the text is the index
    return {int(i): s for s, i in zip(t.index, t["task_index"])}


def _same_items(out_ds, coll_ds, framecode=None, cams=(FRONT, WRIST), extras=()) -> int:
    """Item j of the export equals item j of the collection (renumbered keys aside; ``extras``: the query's extra
    columns, which an export does not write); returns how many camera frames were bit-exact (the others must be
    the same frame by its framecode: a re-encoded window head)."""
    assert len(out_ds) == len(coll_ds)
    exact = 0
    for j in range(len(out_ds)):
        a, b = out_ds[j], coll_ds[j]
        assert set(a) | {"dataset", "dataset_index", *extras} == set(b), j
        assert a["task"] == b["task"], j
        assert int(a["index"]) == j
        for k in set(a) - RENUMBERED - {"task"}:
            x, y = a[k].numpy(), b[k].numpy()  # numpy: torch.equal is slow on a busy machine's thread pool
            if k in cams and not np.array_equal(x, y):
                ok = framecode.verify_frame(x.transpose(1, 2, 0), int(b["episode_index"]), int(b["frame_index"]), k)
                assert ok["ok"], (j, k, ok)
                continue
            assert x.dtype == y.dtype and np.array_equal(x, y), (j, k)
            exact += k in cams
    return exact


@pytest.fixture(scope="module")
def av1_pair(datasets):
    """small20 + multifile60: both AV1 96x128 yuv420p at 30 fps, different tasks and episode counts."""
    c = lsql.connect_many([datasets / "small20", datasets / "multifile60"])
    yield c
    c.close()


def test_whole_episodes_across_datasets(av1_pair, tmp_path):
    coll = av1_pair
    where = "WHERE episode_index % 7 = 1"
    order = "ORDER BY dataset DESC, episode_index"  # multifile60's episodes first: the result's order, not names'
    rep = coll.export(f"SELECT dataset, episode_index FROM episodes {where} {order}", tmp_path / "out",
                      progress=False)
    sel = coll.sql(f"SELECT dataset, episode_index, length FROM episodes {where} {order}").fetchall()
    frames = sum(r[2] for r in sel)
    assert (rep.episodes, rep.frames, rep.frames_reencoded) == (len(sel), frames, 0) == (12, 3083, 0)
    assert rep.frames_remuxed == 2 * frames

    out = lsql.connect(tmp_path / "out")
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (len(sel), frames)
    assert info["splits"] == {"train": f"0:{len(sel)}"}
    assert out.sql("SELECT count(*), sum(length) FROM episodes").fetchall() == [(len(sel), frames)]
    # provenance: one row per output episode, in the result's order
    e = _episodes(tmp_path / "out")
    assert list(zip(e["source_dataset"], e["source_episode_index"], e["length"])) == sel
    assert e["episode_index"].tolist() == list(range(len(sel)))
    assert out.sql("SELECT source_dataset, source_episode_index FROM episodes ORDER BY episode_index").fetchall() \
        == [r[:2] for r in sel]
    # tasks merged by text: one task_index per distinct text, every frame's text its source frame's
    src_text = coll.sql("SELECT f.dataset, f.index, t.task FROM frames f JOIN tasks t USING (dataset, task_index) "
                        "WHERE f.episode_index % 7 = 1 ORDER BY f.dataset DESC, f.episode_index, f.frame_index"
                        ).fetchall()
    texts = _task_texts(tmp_path / "out")
    assert sorted(texts.values()) == sorted({t for _, _, t in src_text}) and len(texts) == rep.tasks == 8
    got = out.sql("SELECT task_index FROM frames ORDER BY index").fetchall()
    assert [texts[t] for (t,) in got] == [t for _, _, t in src_text]
    # items equal the collection's items for the same frames, cameras bit-exact (every packet copied)
    coll_ds = coll.dataset(f"SELECT dataset, index FROM frames {where} {order}, frame_index", return_uint8=True)
    out_ds = out.dataset("SELECT index FROM frames ORDER BY index", return_uint8=True)
    assert _same_items(out_ds, coll_ds) == 2 * frames
    report = doctor.run(out)
    assert report.ok, report


def test_windows_across_datasets_and_lerobot_reads_them(av1_pair, tmp_path, framecode):
    coll = av1_pair
    # small20 ep 2 frames 5..39 (an odd start: its head is re-encoded), multifile60 ep 3 frames 0..29, small20 ep 9
    sql = ("SELECT * FROM (SELECT 'small20' AS dataset, 2 AS episode_index, 5/30 AS start_s, 40/30 AS end_s, 0 AS o "
           "UNION ALL SELECT 'multifile60', 3, 0, 30/30, 1 UNION ALL SELECT 'small20', 9, 0, 1e9, 2) ORDER BY o")
    rep = coll.export(sql, tmp_path / "out", progress=False)
    len9 = coll.sql("SELECT length FROM episodes WHERE dataset = 'small20' AND episode_index = 9").fetchall()[0][0]
    lengths = [35, 30, len9]
    assert (rep.episodes, rep.frames) == (3, sum(lengths))
    assert 0 < rep.frames_reencoded < 2 * 35 and rep.frames_reencoded + rep.frames_remuxed == 2 * sum(lengths)
    e = _episodes(tmp_path / "out")
    assert list(zip(e["source_dataset"], e["source_episode_index"], e["length"])) == \
        [("small20", 2, 35), ("multifile60", 3, 30), ("small20", 9, len9)]
    out = lsql.connect(tmp_path / "out")
    assert out.sql("SELECT frame_index FROM frames ORDER BY index").fetchall() == \
        [(i,) for n in lengths for i in range(n)]
    coll_ds = coll.dataset(sql, return_uint8=True)
    out_ds = out.dataset("SELECT index FROM frames ORDER BY index", return_uint8=True)
    exact = _same_items(out_ds, coll_ds, framecode, extras=("o",))
    assert exact == rep.frames_remuxed
    assert doctor.run(out).ok

    if not _peer_available():
        pytest.skip(f"lerobot peer interpreter {PEER_PYTHON} missing or lerobot not importable (set LSQL_PEER_PYTHON)")
    pick = [0, 1, 34, 35, 36, 64, 65, sum(lengths) - 1]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    r = subprocess.run([PEER_PYTHON, "-c", PEER_SCRIPT, str(tmp_path / "out"), str(tmp_path / "peer.npz"),
                        json.dumps(pick)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["num_frames"] == sum(lengths) and res["num_episodes"] == 3
    npz = np.load(tmp_path / "peer.npz")
    ours = out.dataset("SELECT index FROM frames ORDER BY index")
    theirs_coll = coll.dataset(sql)
    for i in pick:
        theirs = {k.split("/", 1)[1]: npz[k] for k in npz.files if k.split("/", 1)[0] == str(i)}
        mine = ours[i]
        assert set(theirs) | {"task"} == set(mine)
        assert res["scalars"][f"{i}/task"] == mine["task"]
        for k, v in theirs.items():  # lerobot on the export == lerobot_sql on the export, exactly
            np.testing.assert_array_equal(v, mine[k].numpy(), err_msg=f"{i} {k}")
        base = theirs_coll[i]
        for k in set(theirs) - RENUMBERED:  # == the collection's item (pixels of copied packets: i >= 35 here)
            if k in (FRONT, WRIST) and i < 35:
                continue
            np.testing.assert_array_equal(theirs[k], base[k].numpy(), err_msg=f"{i} {k}")


def test_codecs_that_differ_are_refused_naming_them(datasets, tmp_path):
    """small20 is AV1, h264_20 H.264: their packets cannot share one mp4 track."""
    coll = lsql.connect_many([datasets / "small20", datasets / "h264_20"])
    with pytest.raises(lsql.IncompatibleDatasetsError) as ei:
        coll.export("SELECT dataset, episode_index FROM episodes WHERE episode_index < 2", tmp_path / "out",
                    progress=False)
    msg = str(ei.value)
    assert "codec" in msg and FRONT in msg and "small20: av1" in msg and "h264_20: h264" in msg
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
    # without the cameras the same selection exports: vectors and tasks only
    rep = coll.export("SELECT dataset, episode_index FROM episodes WHERE episode_index < 2", tmp_path / "out",
                      features=["observation.state", "action"], progress=False)
    n = coll.sql("SELECT sum(length) FROM episodes WHERE episode_index < 2").fetchall()[0][0]
    assert (rep.episodes, rep.frames, rep.video_files) == (4, n, 0)
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert FRONT not in info["features"] and "observation.state" in info["features"]
    assert not (tmp_path / "out/videos").exists()
    e = _episodes(tmp_path / "out")
    assert not [c for c in e.columns if FRONT in c]
    out = lsql.connect(tmp_path / "out")
    a = out.dataset("SELECT index FROM frames ORDER BY index")
    # no ORDER BY: datasets in names order, each in its own order, for the export and the items alike
    b = coll.dataset("SELECT dataset, index FROM frames WHERE episode_index < 2",
                     features=["observation.state", "action"])
    _same_items(a, b, cams=())
    assert doctor.run(out).ok


def test_renamed_cameras_line_up_with_rename(datasets, tmp_path):
    top = renamed_copy(datasets / "small20", tmp_path / "site_b", {FRONT: "observation.images.top"})
    coll = lsql.connect_many([datasets / "small20", top])
    sql = "SELECT dataset, episode_index FROM episodes WHERE episode_index IN (0, 5)"
    with pytest.raises(lsql.ResultContractError, match="cannot be written as one dataset") as ei:
        coll.export(sql, tmp_path / "out", progress=False)
    assert FRONT in str(ei.value) and "site_b" in str(ei.value)
    rep = coll.export(sql, tmp_path / "out", rename={"site_b": {"observation.images.top": FRONT}}, progress=False)
    assert rep.episodes == 4 and rep.frames_reencoded == 0
    # same task texts in both: merged, not doubled
    assert rep.tasks == len(coll["small20"].sql("SELECT DISTINCT task_index FROM frames "
                                                "WHERE episode_index IN (0, 5)").fetchall())
    out = lsql.connect(tmp_path / "out")
    a = out.dataset("SELECT index FROM frames ORDER BY index", return_uint8=True)
    b = coll.dataset(sql, rename={"site_b": {"observation.images.top": FRONT}}, return_uint8=True)
    assert _same_items(a, b) == 2 * rep.frames
    assert doctor.run(out).ok


def test_fps_that_differ_are_refused_naming_them(datasets, tmp_path):
    slow = tmp_path / "slow"
    shutil.copytree(datasets / "small20", slow)
    info = json.loads((slow / "meta/info.json").read_text())
    info["fps"] = 15  # a 15 fps dataset without cameras (its copied mp4s would be 30 fps clips)
    info["features"] = {k: v for k, v in info["features"].items() if v["dtype"] != "video"}
    shutil.rmtree(slow / "videos")
    (slow / "meta/info.json").write_text(json.dumps(info))
    for f in (slow / "data").glob("*/*.parquet"):  # its frames on the 15 fps grid, so the selection resolves
        t = pq.read_table(f)
        ts = pa.array((t["frame_index"].to_numpy() / 15).astype(np.float32))
        pq.write_table(t.set_column(t.schema.get_field_index("timestamp"), "timestamp", ts), f)
    coll = lsql.connect_many([datasets / "small20", slow])
    with pytest.raises(lsql.IncompatibleDatasetsError, match=r"fps differs \(small20: 30(\.0)?, slow: 15"):
        coll.export("SELECT dataset, episode_index FROM episodes WHERE episode_index = 0", tmp_path / "out",
                    features=["observation.state", "action"], progress=False)
    assert not (tmp_path / "out").exists()


def _reencoded_copy(src: Path, dst: Path, options: dict) -> Path:
    """A copy of ``src`` whose mp4s are re-encoded with libx264 ``options`` (same frames, pts and time base, so
    meta/episodes stays right): same codec, resolution and pix_fmt, another codec header (SPS/PPS)."""
    import av

    shutil.copytree(src, dst)
    for f in sorted(dst.glob("videos/*/*/*.mp4")):
        tmp = f.with_suffix(".tmp.mp4")
        with av.open(str(f)) as inp, av.open(str(tmp), "w", format="mp4") as out:
            ist = inp.streams.video[0]
            ost = out.add_stream("libx264", rate=30, options=options)
            ost.width, ost.height, ost.pix_fmt = ist.codec_context.width, ist.codec_context.height, "yuv420p"
            ost.time_base = ist.time_base
            ost.codec_context.time_base = ist.time_base
            for frame in inp.decode(ist):
                frame.pict_type = av.video.frame.PictureType.NONE
                out.mux(ost.encode(frame))
            out.mux(ost.encode(None))
        tmp.replace(f)
    return dst


def test_a_new_codec_header_starts_a_new_video_file(datasets, tmp_path):
    """h264_20 (High profile, CABAC) and a copy re-encoded Baseline (CAVLC): the same codec, resolution and
    pix_fmt, so they export together, but a copied packet decodes only with its own SPS/PPS: each switch of
    source header starts a new mp4, and every frame is still the source's, bit for bit."""
    base = _reencoded_copy(datasets / "h264_20", tmp_path / "baseline",
                           {"profile": "baseline", "g": "2", "bf": "0", "crf": "30"})
    coll = lsql.connect_many([datasets / "h264_20", base])
    sql = ("SELECT * FROM (SELECT 'h264_20' AS dataset, 0 AS episode_index, 0 AS o UNION ALL "
           "SELECT 'baseline', 1, 1 UNION ALL SELECT 'h264_20', 2, 2) ORDER BY o")
    rep = coll.export(sql, tmp_path / "out", progress=False)
    assert rep.video_files == 2 * 3 and rep.frames_reencoded == 0
    e = _episodes(tmp_path / "out")
    assert e[f"videos/{FRONT}/file_index"].tolist() == [0, 1, 2]
    assert e[f"videos/{FRONT}/from_timestamp"].tolist() == [0.0, 0.0, 0.0]
    out = lsql.connect(tmp_path / "out")
    a = out.dataset("SELECT index FROM frames ORDER BY index", return_uint8=True)
    b = coll.dataset(sql, return_uint8=True)
    assert _same_items(a, b, extras=("o",)) == 2 * rep.frames
    assert doctor.run(out).ok


def test_depth_maps_of_a_later_dataset_stay_depth(datasets, tmp_path):
    """A collection whose depth dataset is not the first (small20 has no samples in the selection): a cut depth
    episode's stats are recomputed from its frames decoded as 12-bit codes, as the one-dataset export does. The
    export chose the decoders' depth files by comparing each row's position among the selected datasets with the
    dataset's position in the collection, which differ here: the depth mp4 was decoded as RGB (found in review)."""
    import pyarrow.parquet as pq

    window = "0 AS episode_index, 0.1 AS start_s, 0.5 AS end_s"
    coll = lsql.connect_many([datasets / "small20", datasets / "depth4"])
    with pytest.warns(UserWarning, match="depth video"):
        coll.export(f"SELECT 'depth4' AS dataset, {window}", tmp_path / "coll", progress=False)
    with pytest.warns(UserWarning, match="depth video"):
        lsql.connect(datasets / "depth4").export(f"SELECT {window}", tmp_path / "one", progress=False)

    def depth_stats(root):
        t = pq.read_table(sorted((root / "meta" / "episodes").rglob("*.parquet"))[0])
        return {c: t[c].to_pylist() for c in t.column_names if c.startswith("stats/observation.images.depth/")}

    got, want = depth_stats(tmp_path / "coll"), depth_stats(tmp_path / "one")
    assert want and got == want


def test_extras_a_dataloader_could_not_batch_do_not_stop_an_export(datasets, tmp_path):
    """A collection export writes no extra columns either: `tasks` (1 or 2 texts per episode) raised dataset()'s
    "a DataLoader cannot batch" error."""
    coll = lsql.connect_many({"a": datasets / "small20"})
    sql = "SELECT dataset, episode_index, tasks FROM episodes WHERE episode_index < 3"
    report = coll.export(sql, tmp_path / "out", progress=False)
    lengths = lsql.connect(datasets / "small20").sql(
        "SELECT length FROM episodes WHERE episode_index < 3 ORDER BY episode_index").fetchall()
    assert lsql.connect(tmp_path / "out").sql("SELECT length FROM episodes ORDER BY episode_index").fetchall() == lengths
    assert report.episodes == 3
    with pytest.raises(lsql.ResultContractError, match="DataLoader"):
        coll.dataset(sql, cameras=[])


def test_a_collection_export_never_replaces_one_that_finished_meanwhile(datasets, tmp_path, monkeypatch):
    """Two collection exports to one destination with overwrite=False: the one that finishes second raised nothing
    and replaced the other's export. Now DestinationExistsError; the first one's export stays intact, the second's
    staging folder is removed."""
    from lerobot_sql.export import destination

    coll = lsql.connect_many({"a": datasets / "small20", "b": datasets / "multifile60"})
    dest = tmp_path / "out"
    real, done = destination.write_marker, []

    def rival_finishes_first(*a, **k):  # after the staging folder is complete, before it is moved into place
        real(*a, **k)
        if not done:
            done.append(1)
            coll.export("SELECT dataset, episode_index FROM episodes WHERE dataset = 'b' AND episode_index = 4",
                        dest, progress=False)

    monkeypatch.setattr(destination, "write_marker", rival_finishes_first)
    with pytest.raises(lsql.DestinationExistsError) as e:
        coll.export("SELECT dataset, episode_index FROM episodes WHERE dataset = 'a' AND episode_index < 2", dest,
                    progress=False)
    assert str(dest) in str(e.value) and "overwrite=True" in str(e.value)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    destination.check_replaceable(dest)  # the rival's files, as its marker lists them
    eps = _episodes(dest)
    assert eps["source_dataset"].tolist() == ["b"] and eps["source_episode_index"].tolist() == [4]
    coll.close()


def test_align_per_dataset_exports_a_wall_clock_dataset_on_the_grid(datasets, tmp_path, framecode):
    """A collection export with align={name: "frame_index"} over a dataset whose timestamps are wall-clock time (a clock
    at 0.9x over clips on the fps grid; the CLI refused --align for collections) writes that dataset's rows with
    timestamp = frame_index / fps: the copy opens with default options, its items are their own frames, and the
    other dataset's items equal the collection's."""
    from helpers import run_cli, wall_clock

    wc = tmp_path / "wc"
    shutil.copytree(datasets / "small20", wc)
    wall_clock(wc, 0.9)
    coll = lsql.connect_many({"wc": wc, "ok": datasets / "multifile60"})
    sql = "SELECT dataset, episode_index FROM episodes WHERE episode_index IN (1, 4) ORDER BY dataset, episode_index"
    with pytest.raises(lsql.DatasetFormatError, match="frame_index"):
        coll.export(sql, tmp_path / "refused", progress=False)
    rep = coll.export(sql, tmp_path / "out", align={"wc": "frame_index"}, progress=False)
    assert rep.episodes == 4
    out = lsql.connect(tmp_path / "out")
    ts, fi = (np.asarray(c) for c in zip(*out.sql("SELECT timestamp, frame_index FROM frames").fetchall()))
    np.testing.assert_array_equal(ts.astype(np.float32), (fi / 30).astype(np.float32))
    a = out.dataset("SELECT index FROM frames ORDER BY index", return_uint8=True)
    b = coll.dataset(sql, align={"wc": "frame_index"}, return_uint8=True)
    assert _same_items(a, b, framecode) > 0
    for j in range(0, len(b), 23):  # the wall-clock dataset's frames are their own
        item = b[j]
        assert framecode.verify_frame(item[FRONT].permute(1, 2, 0).numpy(), int(item["episode_index"]),
                                      int(item["frame_index"]), FRONT)["ok"], j
    # the CLI takes --align for a collection (every dataset)
    r = run_cli("export", f"{wc},{datasets / 'small20'}", "--sql",
                "SELECT dataset, episode_index FROM episodes WHERE episode_index = 2", "--align", "frame_index",
                str(tmp_path / "cli"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert lsql.connect(tmp_path / "cli").sql("SELECT count(*) FROM episodes").fetchall() == [(2,)]


def test_a_collection_export_takes_the_tolerance_it_is_given(datasets, tmp_path):
    """coll.export(sql, dest, tolerance_s=0.5) over a dataset whose timestamps are 0.33 s off its (29 fps) grid was
    refused asking for the very tolerance it was given: the collection resolved its selection without it."""
    from test_export import _fps29_copy

    coll = lsql.connect_many({"fps29": _fps29_copy(datasets, tmp_path)})
    sql = "SELECT dataset, episode_index FROM episodes WHERE episode_index = 19"
    with pytest.raises(lsql.DatasetFormatError, match="tolerance_s"):
        coll.export(sql, tmp_path / "refused", progress=False)
    rep = coll.export(sql, tmp_path / "out", progress=False, tolerance_s=0.5)
    assert rep.frames == len(coll["fps29"].dataset("SELECT episode_index FROM episodes WHERE episode_index = 19",
                                                   tolerance_s=0.5)) == 286


@pytest.mark.parametrize("edit", ["from_timestamp", "file", "task_index"])
def test_an_edited_collection_manifest_is_refused_by_export_and_stats(av1_pair, tmp_path, edit):
    """A collection manifest given back to coll.export / coll.stats (a table, or its saved Parquet file) is hostile
    input as coll.dataset's is: a camera's from_timestamp moved by a frame exported every front frame as the next one,
    a front file pointed at the wrist mp4 exported wrist pictures as front ones, a task_index + 1 met a bare KeyError.
    Each dataset's rows are now checked against what its planner derives for their index (nothing written); an
    unedited manifest selecting one dataset of two exports (its stats too: they met a KeyError for the other)."""
    import pyarrow.compute as pc

    coll = av1_pair
    a = coll.names[0]
    m = coll.manifest(f"SELECT dataset, episode_index FROM episodes WHERE episode_index IN (1, 2) AND dataset = '{a}'")
    col = {"from_timestamp": f"{FRONT}/from_timestamp", "file": f"{FRONT}/file", "task_index": "task_index"}[edit]
    v = m[col]
    new = (pc.add(v, 1 / 30) if edit == "from_timestamp" else
           pa.array([s.replace("front", "wrist") for s in v.to_pylist()]) if edit == "file" else pc.add(v, 1))
    bad = m.set_column(m.column_names.index(col), col, new)
    path = tmp_path / "edited.parquet"
    pq.write_table(bad, path)
    for given in (bad, path):
        with pytest.raises(lsql.ResultContractError, match=rf"dataset '{a}': row 0 .*column '{col}'"):
            coll.export(given, tmp_path / "out", progress=False)
        with pytest.raises(lsql.ResultContractError, match=rf"column '{col}'"):
            coll.stats(given)
    assert not (tmp_path / "out").exists()
    rep = coll.export(m, tmp_path / "ok", progress=False)
    assert rep.frames == m.num_rows == len(coll[a].dataset(episodes=[1, 2]))
    assert coll.stats(m)["action"]["count"] == [m.num_rows]


@pytest.mark.parametrize("target", ["../../victim", "/tmp/abs", "a/../b", "observation.images.wrist/chunk-000"])
def test_a_camera_renamed_to_a_path_outside_its_folder_is_refused(av1_pair, tmp_path, target):
    """rename={ds: {front: "../../victim"}} made the export write the camera's mp4 through the '..' path, over a user's
    file outside the destination (the reader refuses such a key; the writer did not). A camera's new key must be a
    usable folder name, the rule info.json's keys follow, and not a folder inside another camera's: refused before
    anything is written."""
    coll = av1_pair
    a = coll.names[0]
    victim = tmp_path / "victim" / "chunk-000"
    victim.mkdir(parents=True)
    (victim / "file-000.mp4").write_bytes(b"precious")
    with pytest.raises(ValueError, match=r"rename\[.*camera 'observation.images.front' -> |inside camera"):
        coll.export(f"SELECT dataset, episode_index FROM episodes WHERE dataset = '{a}' AND episode_index = 1",
                    tmp_path / "out" / "x", rename={a: {FRONT: target}}, progress=False)
    assert (victim / "file-000.mp4").read_bytes() == b"precious"
    assert not (tmp_path / "out").exists()


def test_an_export_never_replaces_a_dataset_of_its_collection_that_has_no_selected_rows(datasets, tmp_path):
    """A collection member that is an earlier export of ours, with no rows in the selection, was replaced by
    ``overwrite=True`` (and written into without it), while the open collection kept reading it (hostile review 7,
    F9): every dataset of the collection is a source the destination may not be, nor lie in."""
    from lerobot_sql.errors import DestinationError

    sub = tmp_path / "sub"
    lsql.connect(datasets / "small20").export("SELECT episode_index FROM episodes WHERE episode_index IN (4, 5)", sub,
                                              progress=False)
    before = sorted((p.relative_to(sub), p.stat().st_size) for p in sub.rglob("*") if p.is_file())
    coll = lsql.connect_many({"a": datasets / "h264_20", "sub": sub})
    sql = "SELECT dataset, episode_index FROM episodes WHERE dataset = 'a' AND episode_index = 0"
    with pytest.raises(DestinationError):
        coll.export(sql, sub, overwrite=True, progress=False)
    with pytest.raises(DestinationError):
        coll.export(sql, sub / "meta" / "inner", progress=False)
    assert sorted((p.relative_to(sub), p.stat().st_size) for p in sub.rglob("*") if p.is_file()) == before
    assert coll.sql("SELECT count(*) FROM frames WHERE dataset = 'sub'").fetchall()[0][0] == \
        lsql.connect(datasets / "small20").sql("SELECT count(*) FROM frames WHERE episode_index IN (4, 5)"
                                               ).fetchall()[0][0]
