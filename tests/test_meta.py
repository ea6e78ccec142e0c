"""``ds.meta`` and the dataset attributes lerobot's training code reads (lerobot_sql.torch.meta): totals, runs with
their positions, tasks by position, stats by choice, and what survives pickling into a DataLoader worker."""

from __future__ import annotations

import json
import pickle

import av
import numpy as np
import pytest
import torch

import lerobot_sql as lsql
from helpers import REFERENCE
from lerobot_sql.torch.meta import runs


def _lerobot_sampler_indices(meta, episodes, drop_n_last_frames=0):
    """lerobot 0.4.4's EpisodeAwareSampler.__init__ index list, written out (lerobot/datasets/sampler.py)."""
    out = []
    for episode_idx, (start, end) in enumerate(zip(meta.episodes["dataset_from_index"],
                                                     meta.episodes["dataset_to_index"], strict=True)):
        if episodes is None or episode_idx in episodes:
            out.extend(range(start, end - drop_n_last_frames))
    return out


def test_runs_split_at_episode_changes_and_frame_gaps():
    ep = np.array([3, 3, 3, 3, 5, 5, 3, 3])
    fr = np.array([0, 1, 2, 7, 0, 1, 2, 3])
    s, e = runs(ep, fr)
    assert s.tolist() == [0, 3, 4, 6] and e.tolist() == [3, 4, 6, 8]
    assert [x.tolist() for x in runs(np.array([], np.int64), np.array([], np.int64))] == [[], []]


def test_whole_episodes_meta_matches_the_selection(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index IN (2, 5, 6) ORDER BY episode_index")
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes WHERE episode_index IN (2, 5, 6)").fetchall())
    meta = ds.meta
    assert meta.total_episodes == ds.num_episodes == 3
    assert meta.total_frames == ds.num_frames == len(ds) == sum(lengths.values())
    assert meta.episodes["episode_index"] == [2, 5, 6]
    assert meta.episodes["length"] == [lengths[2], lengths[5], lengths[6]]
    assert meta.episodes["dataset_from_index"] == [0, lengths[2], lengths[2] + lengths[5]]
    assert meta.episodes["dataset_to_index"] == [lengths[2], lengths[2] + lengths[5], len(ds)]
    assert not any(c.startswith("stats/") for c in meta.episodes.column_names)
    info = json.loads((sample / "meta" / "info.json").read_text())
    assert meta.info["total_episodes"] == 3 and meta.info["total_frames"] == len(ds)
    for f in info["features"].values():  # lerobot's load_info makes shapes tuples
        f["shape"] = tuple(f["shape"])
    assert meta.features == info["features"] and ds.features == info["features"]
    assert meta.fps == ds.fps == info["fps"] and meta.robot_type == info.get("robot_type")
    assert type(ds.fps) is type(meta.fps) is type(info["fps"]) is int  # lerobot's ds.fps is info.json's int
    assert meta.camera_keys == ds.camera_keys == ["observation.images.front", "observation.images.wrist"]
    assert meta.video_keys == meta.camera_keys and meta.image_keys == [] and meta.depth_keys == []
    assert meta.shapes["action"] == tuple(info["features"]["action"]["shape"])
    assert meta.names["action"] == info["features"]["action"]["names"]
    assert ds.episodes is None and ds.repo_id == "small20" and str(ds.root) == str(sample)
    assert meta.repo_id == ds.repo_id and meta.has_language_columns is False


def test_info_reads_as_lerobot_04s_dict_and_as_lerobot_06s_object(sample, tmp_path):
    """lerobot 0.6's meta.info is a DatasetInfo (``ds.meta.info.fps``), 0.4's a dict (``info["fps"]``): ours answers
    both (``info.fps`` raised AttributeError), with DatasetInfo's defaults for its optional fields, pickles, and
    gives a JSON copy as DatasetInfo.to_dict does."""
    ds = lsql.connect(sample, cache_dir=tmp_path).dataset("SELECT episode_index FROM episodes WHERE episode_index < 2")
    info = ds.meta.info
    assert info.fps == info["fps"] == 30 and info.features is info["features"]
    assert info.total_episodes == 2 and info.codebase_version == "v3.0" and info.tools is None
    assert isinstance(info, dict) and info.splits == {"train": "0:2"}
    with pytest.raises(AttributeError, match="no 'not_a_key'"):
        _ = info.not_a_key
    again = pickle.loads(pickle.dumps(info))
    assert again == info and again.fps == 30
    plain = info.to_dict()
    assert type(plain) is dict and plain["features"]["observation.state"]["shape"] == [6]
    json.dumps(plain)
    assert info["features"]["observation.state"]["shape"] == (6,)  # the copy, not the meta, has lists


def test_lerobots_sampler_draws_exactly_this_datasets_samples(sample, tmp_path):
    """Windows of one episode twice, out of order: every position once, runs never cross an episode or a gap."""
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = ("SELECT * FROM (VALUES (4, 1.0, 2.0), (1, 0.0, 0.5), (4, 0.0, 0.5)) t(episode_index, start_s, end_s) "
           "ORDER BY episode_index DESC, start_s DESC")
    ds = db.dataset(sql, cameras=[])
    meta = ds.meta
    assert meta.episodes["episode_index"] == [4, 4, 1] and meta.total_episodes == 2
    idx = _lerobot_sampler_indices(meta, ds.episodes)
    assert sorted(idx) == list(range(len(ds)))
    for row in meta.episodes:
        items = [ds[i] for i in range(row["dataset_from_index"], row["dataset_to_index"])]
        assert {int(it["episode_index"]) for it in items} == {row["episode_index"]}
        fr = [int(it["frame_index"]) for it in items]
        assert fr == list(range(fr[0], fr[0] + len(fr)))
    # drop_n_last_frames drops the last frames of each run (lerobot: of each episode)
    assert len(_lerobot_sampler_indices(meta, ds.episodes, 2)) == len(ds) - 2 * len(meta.episodes)


def test_tasks_are_looked_up_by_position_as_lerobot_does(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    ds = db.dataset("SELECT index FROM frames WHERE index % 97 = 0", cameras=[])
    tasks = ds.meta.tasks
    assert tasks.index.name == "task" and tasks["task_index"].dtype == np.int64
    for i in range(len(ds)):
        item = ds[i]
        assert tasks.iloc[int(item["task_index"])].name == item["task"]
        assert ds.meta.get_task_index(item["task"]) == int(item["task_index"])
    used = db.sql("SELECT count(DISTINCT task_index) FROM frames WHERE index % 97 = 0").fetchall()[0][0]
    assert ds.meta.total_tasks == used


def test_stats_are_the_selections_by_default_and_the_sources_on_request(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = "SELECT episode_index FROM episodes WHERE episode_index < 5"
    st = db.dataset(sql).meta.stats
    ref = db.stats(sql)
    assert set(st) == set(ref)
    for k in ref:  # DuckDB sums in parallel, so two runs agree to rounding, not bit for bit
        for s in ref[k]:
            np.testing.assert_allclose(st[k][s], ref[k][s], rtol=1e-12, atol=0)
    src = db.dataset(sql, stats="dataset").meta.stats
    whole = db.stats()
    np.testing.assert_array_equal(src["action"]["mean"], whole["action"]["mean"])
    assert db.dataset(sql, stats=None).meta.stats is None
    with pytest.raises(ValueError, match="stats"):
        db.dataset(sql, stats="episodes")
    # lerobot hands each value to torch.as_tensor
    assert torch.as_tensor(st["action"]["mean"]).shape == (6,)
    assert torch.as_tensor(st["observation.images.front"]["std"]).shape == (3, 1, 1)


def test_meta_pickles_with_computed_stats_and_says_so_without(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = "SELECT episode_index FROM episodes WHERE episode_index < 3"
    ds = db.dataset(sql, cameras=[])
    _ = ds.meta.stats
    copy = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(copy.meta.stats["action"]["max"], ds.meta.stats["action"]["max"])
    assert copy.meta.episodes["dataset_to_index"] == ds.meta.episodes["dataset_to_index"]
    fresh = db.dataset(sql, cameras=[])
    copy2 = pickle.loads(pickle.dumps(fresh))
    with pytest.raises(RuntimeError, match="main process"):
        _ = copy2.meta.stats


def test_delta_indices_are_lerobots(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    fps = db.layout.fps
    dt = {"action": [i / fps for i in range(-1, 5)], "observation.images.front": [-1 / fps, 0.0]}
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index = 0", delta_timestamps=dt)
    assert ds.delta_timestamps == dt
    assert ds.delta_indices == {"action": [-1, 0, 1, 2, 3, 4], "observation.images.front": [-1, 0]}
    assert db.dataset("SELECT episode_index FROM episodes WHERE episode_index = 0").delta_indices is None


def test_a_legacy_marked_depth_camera_is_decoded_as_depth_not_rgb(datasets, tmp_path):
    """lerobot 0.6 also takes the legacy ``info["video.is_depth_map"]`` mark: such a camera is a depth key, decoded
    as lerobot does (``to_ndarray(format="gray12le")``, dequantized with the default quantizer as no
    ``video.depth_*`` is recorded) to float32 (1, H, W) mm; never RGB. The other cameras still read as RGB."""
    import math
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["observation.images.wrist"]["info"]["video.is_depth_map"] = True
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index = 0")
    assert ds.meta.depth_keys == ["observation.images.wrist"]
    item = ds[3]
    assert item["observation.images.front"].shape == (3, 96, 128)
    got = item["observation.images.wrist"]
    assert got.dtype == torch.float32 and got.shape == (1, 96, 128)
    with av.open(str(root / "videos" / "observation.images.wrist" / "chunk-000" / "file-000.mp4")) as c:
        codes = [f.to_ndarray(format="gray12le") for _, f in zip(range(4), c.decode(video=0))][3]
    lo, hi = math.log(0.01 + 3.5), math.log(10.0 + 3.5)  # lerobot's defaults: depth_min, depth_max, shift
    want = torch.from_numpy(codes.astype(np.float32))[None]
    want.mul_((hi - lo) / 4095).add_(lo).exp_().sub_(3.5).clamp_(0.01, 10.0).mul_(1000.0).round_().clamp_(0, 65535)
    assert torch.equal(got, want)


@pytest.mark.parametrize("unit", ["mm", "m"])
def test_depth_stats_in_the_output_unit_as_lerobot_061(datasets, unit):
    """lerobot 0.6 rescales a depth key's stats from its recorded ``depth_unit`` to ``depth_output_unit``
    (``meta.rescale_depth_stats``): with stats="dataset" ours equal its ``meta.stats`` exactly (depth4's reference),
    and the selection's statistics of every frame agree with them (aggregated from the episodes' stats)."""
    ref = json.loads((REFERENCE / "depth4.json").read_text())
    want = ref["depth_stats"]["plain" if unit == "mm" else "metres"]
    db = lsql.connect(datasets / "depth4")
    for stats in ("dataset", "selection"):
        st = db.dataset(stats=stats, depth_output_unit=unit).meta.stats
        for key in ref["depth_keys"]:
            assert set(st[key]) == set(want[key]), (stats, key)
            for s, v in want[key].items():
                if stats == "dataset" or s in ("min", "max", "count"):
                    np.testing.assert_array_equal(st[key][s], np.asarray(v), err_msg=f"{stats} {key} {s}")
                else:
                    np.testing.assert_allclose(st[key][s], np.asarray(v), rtol=1e-6, err_msg=f"{stats} {key} {s}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("first_in_worker", ["meta", "stats"])
def test_stats_first_read_in_a_forked_worker_is_an_error_not_a_hang(sample, tmp_path, first_in_worker):
    """DuckDB does not survive a fork: computing the selection's stats inside a forked DataLoader worker hung."""
    from lerobot_sql.errors import StatsUnavailableError

    db = lsql.connect(sample, cache_dir=tmp_path)
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index = 3", cameras=[])
    if first_in_worker == "stats":
        _ = ds.meta  # meta built in the main process, stats not yet computed

    class Reads(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            try:
                _ = ds.meta.stats
            except StatsUnavailableError as e:
                return str(e)
            return "computed"

    loader = torch.utils.data.DataLoader(Reads(), batch_size=2, num_workers=1, multiprocessing_context="fork")
    (batch,) = list(loader)
    assert all("main process" in m for m in batch), batch
    assert ds.meta.stats["action"]["count"].tolist() == [db.sql(
        "SELECT length FROM episodes WHERE episode_index = 3").fetchall()[0][0]]  # the main process still can


def test_stats_leave_out_the_cameras_the_items_leave_out(sample, tmp_path):
    db = lsql.connect(sample, cache_dir=tmp_path)
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index < 2", cameras=["observation.images.wrist"])
    assert "observation.images.wrist" in ds.meta.stats and "observation.images.front" not in ds.meta.stats
    assert set(ds.meta.stats) <= set(ds.meta.features)


@pytest.mark.parametrize("field,value,error", [
    ("depth_unit", "cm", r"depth_png.*depth_unit is 'cm'"),
    ("video.depth_min", "near", r"depth.*video\.depth_min.*not a finite number"),
    ("video.depth_max", 0.005, r"depth.*unusable.*depth_max > depth_min"),
    ("video.use_log", "yes", r"depth.*video\.use_log.*not a boolean"),
])
def test_unusable_depth_metadata_is_refused_naming_the_feature(datasets, tmp_path, field, value, error):
    """A depth unit lerobot does not know (it would divide by 1000 as if mm), or a quantizer that is no number or
    no range: DatasetFormatError naming the feature at dataset(), never a silently wrong depth."""
    import shutil

    from lerobot_sql.errors import DatasetFormatError

    root = tmp_path / "ds"
    shutil.copytree(datasets / "depth4", root)
    info = json.loads((root / "meta" / "info.json").read_text())
    key = "observation.images.depth_png" if field == "depth_unit" else "observation.images.depth"
    info["features"][key]["info"][field] = value
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    with pytest.raises(DatasetFormatError, match=error):
        db.dataset()
    assert db.dataset(cameras=["observation.images.front"])[0]["observation.images.front"].shape == (3, 48, 64)


def test_a_depth_image_without_a_recorded_unit_is_returned_as_stored_with_a_warning(datasets, tmp_path):
    """lerobot 0.6 returns a depth image without info.depth_unit as stored (and warns): so does this."""
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(datasets / "depth4", root)
    info = json.loads((root / "meta" / "info.json").read_text())
    del info["features"]["observation.images.depth_m"]["info"]["depth_unit"]
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    ref, npz = json.loads((REFERENCE / "depth4.json").read_text()), np.load(REFERENCE / "depth4.npz")
    with pytest.warns(UserWarning, match=r"depth_m.*no info\.depth_unit"):
        ds = lsql.connect(root, cache_dir=tmp_path / "c").dataset()
    i = ref["items"][2]["index"]
    got = ds[i]["observation.images.depth_m"]
    np.testing.assert_array_equal(got.numpy(), npz[f"metres/{i}/observation.images.depth_m"])  # the stored metres


def test_meta_shapes_are_the_items_when_the_mp4s_disagree_with_info_json(sample, tmp_path):
    """info.json declares the front camera 64x64 but its mp4s are 96x128: items are the files' size (as lerobot's),
    and so are meta.shapes / ds.features (a policy built from ds.meta must take the items), with the warning."""
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(sample, root)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["observation.images.front"]["shape"] = [64, 64, 3]
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    ds = lsql.connect(root, cache_dir=tmp_path / "c").dataset("SELECT episode_index FROM episodes WHERE "
                                                              "episode_index < 2")
    with pytest.warns(UserWarning, match=r"96x128 \(HxW\) but info.json declares 64x64 \(HxW\)"):
        meta, item = ds.meta, ds[0]
    for key in ("observation.images.front", "observation.images.wrist"):
        c, h, w = item[key].shape
        assert meta.shapes[key] == ds.features[key]["shape"] == (h, w, c), key
        assert meta.features[key]["info"]["video.height"] == h and meta.features[key]["info"]["video.width"] == w
    assert tuple(item["observation.images.front"].shape) == (3, 96, 128)
    # the rest is info.json's
    assert meta.shapes["action"] == tuple(info["features"]["action"]["shape"])
