"""An export at a lower frame rate (``db.export(sql, dest, fps=...)``, ``lerobot-sql export --fps``; its videos:
lerobot_sql/export/video_encoder.py): the copy is a valid LeRobot v3.0 dataset at the new rate (its files against
the source's, ``lerobot-sql doctor`` with every frame decoded), and reads back as ``db.dataset(sql, fps=...)``
serves the same selection: every key, camera frames included, bit for bit (the kept frames are re-encoded
losslessly). lerobot 0.4.4 reads it (the peer, when installed)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import textwrap

import av
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from helpers import PEER_PYTHON, run_cli
from lerobot_sql import doctor
from lerobot_sql.errors import ResultContractError

# what every export renumbers (episodes 0..N-1, index contiguous, windows from frame 0, tasks still used)
RENUMBERED = {"index", "episode_index", "frame_index", "timestamp", "task_index"}


def _table(root, sub) -> pd.DataFrame:
    files = sorted((root / sub).glob("*/*.parquet"))
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def _all_items_equal(a, b, keys_out=frozenset()) -> None:
    """Every item of datasets ``a`` and ``b`` equal on every key (but ``keys_out``), checked a batch at a time."""
    assert len(a) == len(b)
    for start in range(0, len(a), 64):
        ii = list(range(start, min(start + 64, len(a))))
        x = torch.utils.data.default_collate(a.__getitems__(ii))
        y = torch.utils.data.default_collate(b.__getitems__(ii))
        assert x.keys() == y.keys()
        for k in set(x) - set(keys_out):
            assert _equal(x[k], y[k]), (start, k)


@pytest.mark.parametrize("name, fps", [("small20", 10), ("h264_20", 15)])
def test_an_export_at_a_lower_rate_reads_back_as_the_dataset_at_that_rate(datasets, tmp_path, name, fps):
    src = datasets / name
    db = lsql.connect(src)
    k = 30 // fps
    sql = "SELECT episode_index FROM episodes WHERE episode_index < 3"  # the first episodes: numbered alike
    rep = db.export(sql, tmp_path / "out", fps=fps, progress=False)
    out = tmp_path / "out"
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes WHERE episode_index < 3").fetchall())
    n = [math.ceil(lengths[e] / k) for e in range(3)]
    assert rep.frames == sum(n) and rep.episodes == 3
    assert rep.frames_reencoded == 2 * sum(n) and rep.frames_remuxed == 0  # two cameras, every kept frame

    # the files: info.json, meta/episodes, data at the new rate
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["fps"] == fps and info["total_frames"] == sum(n) and info["total_episodes"] == 3
    for key in db.layout.video_keys:
        vi = info["features"][key]["info"]
        assert (vi["video.fps"], vi["video.codec"], vi["video.pix_fmt"]) == (fps, "h264", "yuv420p")
        for f in sorted((out / "videos" / key).glob("*/*.mp4")):
            with av.open(str(f)) as c:
                s = c.streams.video[0]
                assert s.codec_context.name == "h264" and s.average_rate == fps
                keys = [p.pts * s.time_base * fps for p in c.demux(s) if p.pts is not None and p.is_keyframe]
    e = _table(out, "meta/episodes")
    assert e["length"].tolist() == n and e["dataset_from_index"].tolist() == [0, n[0], n[0] + n[1]]
    for key in db.layout.video_keys:
        frm, to = e[f"videos/{key}/from_timestamp"].to_numpy(), e[f"videos/{key}/to_timestamp"].to_numpy()
        np.testing.assert_allclose(to - frm, np.array(n) / fps, atol=1e-9)
        np.testing.assert_allclose(frm[1:], to[:-1], atol=1e-9)
    assert {0, n[0], n[0] + n[1]} <= {int(round(x)) for x in keys}  # every episode opens on a keyframe
    d, sd = _table(out, "data"), _table(src, "data")
    kept = sd[(sd.episode_index < 3) & (sd.frame_index % k == 0)].sort_values("index")
    assert d["index"].tolist() == list(range(sum(n)))
    assert d["frame_index"].tolist() == (kept["frame_index"] // k).tolist()
    np.testing.assert_array_equal(d["timestamp"].to_numpy(), (d["frame_index"].to_numpy() / fps).astype(np.float32))
    np.testing.assert_array_equal(np.stack(d["action"]), np.stack(kept["action"]))
    st = json.loads((out / "meta" / "stats.json").read_text())
    state = np.stack(kept["observation.state"]).astype(np.float64)
    np.testing.assert_allclose(st["observation.state"]["mean"], state.mean(0), rtol=1e-6)
    assert st["frame_index"]["max"] == [max(n) - 1] and st["index"]["count"] == [sum(n)]

    # items: the export reopened == the source served at the new rate, every key, bit for bit
    dt = {"action": [-1 / fps, 0.0, 1 / fps], "observation.images.front": [-1 / fps, 0.0]}
    theirs = lsql.connect(out).dataset(delta_timestamps=dt, return_uint8=True)
    ours = db.dataset(sql, fps=fps, delta_timestamps=dt, return_uint8=True)
    _all_items_equal(ours, theirs)
    assert ours.meta.episodes["length"] == theirs.meta.episodes["length"] and ours.fps == theirs.fps == fps


def test_doctor_passes_an_export_at_a_lower_rate(datasets, tmp_path):
    db = lsql.connect(datasets / "small20")
    db.export("SELECT episode_index FROM episodes WHERE episode_index IN (1, 4, 6, 9)", tmp_path / "out", fps=5,
              progress=False)
    report = doctor.run(lsql.connect(tmp_path / "out"), decode=True)
    assert report.ok and all(c.ok for c in report.checks if not c.skipped), report.to_text()


def test_videos_at_a_lower_rate_rotate_into_files_of_whole_episodes(datasets, tmp_path, monkeypatch):
    """A video_files_size_in_mb too small for two episodes: each episode in an mp4 of its own, starting at 0."""
    from lerobot_sql.export import target

    of = target.ExportTarget.of.__func__
    monkeypatch.setattr(target.ExportTarget, "of", classmethod(
        lambda cls, layout, root: dataclasses.replace(of(cls, layout, root), video_limit=1)))
    db = lsql.connect(datasets / "small20")
    sql = "SELECT episode_index FROM episodes WHERE episode_index IN (1, 2)"
    db.export(sql, tmp_path / "out", fps=10, progress=False)
    e = _table(tmp_path / "out", "meta/episodes")
    key = "observation.images.front"
    files = list(zip(e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"]))
    assert files == [(0, 0), (0, 1)] and len(list((tmp_path / "out" / "videos" / key).glob("*/*.mp4"))) == 2
    assert e[f"videos/{key}/from_timestamp"].tolist() == [0.0] * 2
    _all_items_equal(db.dataset(sql, fps=10, return_uint8=True),
                     lsql.connect(tmp_path / "out").dataset(return_uint8=True), RENUMBERED)
    assert doctor.run(lsql.connect(tmp_path / "out")).ok


def test_depth_maps_and_images_export_at_a_lower_rate_losslessly(datasets, tmp_path):
    """depth4 (lerobot 0.6.1's writer): an AV1 camera, an HEVC gray12le depth video (its own lossless settings), depth
    images in Parquet; the whole dataset at 10 fps reads back as depth4 at 10 fps, every key."""
    db = lsql.connect(datasets / "depth4")
    # (its statistics are the kept frames', as lerobot's writer would compute them at 10 fps: from the 12-bit codes)
    with pytest.warns(UserWarning, match="recomputed from the 12-bit quantized frames"):
        db.export("SELECT episode_index FROM episodes", tmp_path / "out", fps=10, progress=False)
    info = json.loads((tmp_path / "out" / "meta" / "info.json").read_text())
    depth = info["features"]["observation.images.depth"]["info"]
    assert (depth["video.codec"], depth["video.pix_fmt"], depth["video.fps"]) == ("hevc", "gray12le", 10)
    assert depth["video.extra_options"] == {"x265-params": "lossless=1"} and depth["is_depth_map"]
    ours = db.dataset(fps=10, delta_timestamps={"observation.images.depth": [-0.1, 0.0]})
    theirs = lsql.connect(tmp_path / "out").dataset(delta_timestamps={"observation.images.depth": [-0.1, 0.0]})
    _all_items_equal(ours, theirs)
    assert doctor.run(lsql.connect(tmp_path / "out"), decode=True).ok


def test_windows_at_a_lower_rate_become_episodes_from_frame_0(datasets, tmp_path):
    db = lsql.connect(datasets / "small20")
    sql = "SELECT 2 AS episode_index, 0.5 AS start_s, 1.5 AS end_s UNION ALL SELECT 7, 0.1, 0.45"
    db.export(sql, tmp_path / "out", fps=10, progress=False)
    d = _table(tmp_path / "out", "data")
    assert d.groupby("episode_index").size().tolist() == [10, 4]  # frames 15..42 and 3..12 of every third
    assert d["frame_index"].tolist() == list(range(10)) + list(range(4))
    _all_items_equal(db.dataset(sql, fps=10, return_uint8=True),
                     lsql.connect(tmp_path / "out").dataset(return_uint8=True), RENUMBERED)


def test_an_export_at_a_rate_that_does_not_divide_writes_nothing(datasets, tmp_path):
    db = lsql.connect(datasets / "small20")
    with pytest.raises(ValueError, match=r"fps=20 does not divide the dataset's 30 fps.*fps in \[1, 2, 3, 5"):
        db.export("SELECT episode_index FROM episodes", tmp_path / "out", fps=20, progress=False)
    with pytest.raises(ResultContractError, match=r"index rows name frames a recording at 1/3 of the rate"):
        db.export("SELECT index FROM frames WHERE episode_index = 1", tmp_path / "out", fps=10, progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


def test_the_cli_exports_at_a_lower_rate(datasets, tmp_path):
    r = run_cli("export", datasets / "small20", tmp_path / "out", "--sql",
                "SELECT episode_index FROM episodes WHERE episode_index = 5", "--fps", "10", "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out" / "meta" / "info.json").read_text())["fps"] == 10
    r = run_cli("export", datasets / "small20", tmp_path / "out2", "--sql", "SELECT 5 AS episode_index",
                "--fps", "20", "-q")
    assert r.returncode != 0 and "fps=20 does not divide the dataset's 30 fps" in r.stderr and not (tmp_path / "out2").exists()


PEER_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    root, out, idx, dt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    ds = LeRobotDataset("lsql/fps_test", root=root, delta_timestamps=dt)  # default backend (torchcodec)
    arrays, scalars = {}, {}
    for i in idx:
        for k, v in ds[i].items():
            if hasattr(v, "numpy"):
                arrays[f"{i}/{k}"] = v.numpy()
            else:
                scalars[f"{i}/{k}"] = v
    np.savez(out, **arrays)
    print(json.dumps({"scalars": scalars, "num_frames": ds.num_frames, "fps": ds.fps}))
""")


@pytest.mark.slow
def test_lerobot_reads_an_export_at_a_lower_rate_as_we_serve_the_source_at_it(datasets, tmp_path):
    """lerobot 0.4.4 (torchcodec) on the whole of small20 exported at 10 fps == db.dataset(fps=10) on small20."""
    if not (os.path.exists(PEER_PYTHON) and subprocess.run([PEER_PYTHON, "-c", "import lerobot"],
                                                           capture_output=True).returncode == 0):
        pytest.skip(f"lerobot peer interpreter {PEER_PYTHON} missing (set LSQL_PEER_PYTHON)")
    db = lsql.connect(datasets / "small20")
    db.export("SELECT episode_index FROM episodes", tmp_path / "out", fps=10, progress=False)
    dt = {"action": [-0.1, 0.0, 0.1, 0.2], "observation.images.front": [-0.1, 0.0], "observation.state": [-0.2, 0.0]}
    ours = db.dataset(fps=10, delta_timestamps=dt)
    pick = [0, 1, 115, 116, 117, 800, len(ours) - 1]  # (115: the last frame of episode 0, 348 frames at 30 fps)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    r = subprocess.run([PEER_PYTHON, "-c", PEER_SCRIPT, str(tmp_path / "out"), str(tmp_path / "peer.npz"),
                        json.dumps(pick), json.dumps(dt)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["num_frames"] == len(ours) and res["fps"] == 10
    npz = np.load(tmp_path / "peer.npz")
    for i in pick:
        mine = ours[i]
        theirs = {k.split("/", 1)[1]: npz[k] for k in npz.files if k.split("/", 1)[0] == str(i)}
        assert set(theirs) | {"task"} == set(mine) and res["scalars"][f"{i}/task"] == mine["task"]
        for k, v in theirs.items():
            np.testing.assert_array_equal(v, mine[k].numpy(), err_msg=f"{i} {k}")
