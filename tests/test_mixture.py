"""One training set over many datasets (lerobot_sql.torch.mixture.CollectionDataset): each item equals its own
dataset's item for that frame, with ``dataset`` / ``dataset_index`` added; keys line up by ``rename=`` / ``features=``;
datasets whose items do not line up are refused, naming datasets and keys; each dataset checks delta_timestamps
on its own fps grid."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import lerobot_sql as lsql
from helpers import assert_items_equal, renamed_copy, shortened_vector_copy, wall_clock

SETS = ["small20", "multifile60", "h264_20", "v21_small20"]
PICK = "frame_index % 61 = 7 AND episode_index < 6"


@pytest.fixture(scope="module")
def coll(datasets):
    return lsql.connect_many([datasets / n for n in SETS])


def _own(item: dict) -> dict:
    return {k: v for k, v in item.items() if k not in ("dataset", "dataset_index")}


def _by_index(ds) -> dict:
    return {int(ds[j]["index"]): j for j in range(len(ds))}


def test_items_equal_each_datasets_own_items(coll, datasets, framecode):
    dt = {"action": [0.0, 1 / 30, 2 / 30], "observation.images.front": [-1 / 30, 0.0]}
    ds = coll.dataset(f"SELECT dataset, index FROM frames WHERE {PICK} ORDER BY index, dataset", delta_timestamps=dt)
    own = {n: lsql.connect(datasets / n).dataset(f"SELECT index FROM frames WHERE {PICK} ORDER BY index",
                                                 delta_timestamps=dt) for n in SETS}
    pos = {n: _by_index(d) for n, d in own.items()}
    assert len(ds) == sum(len(d) for d in own.values()) > 40
    seen = {n: 0 for n in SETS}
    for i in range(len(ds)):
        item = ds[i]
        name = item["dataset"]
        assert item["dataset_index"].dtype == torch.int64 and int(item["dataset_index"]) == SETS.index(name)
        ref = own[name][pos[name][int(item["index"])]]
        assert_items_equal(_own(item), ref)
        seen[name] += 1
    assert seen == {n: len(d) for n, d in own.items()}
    # and the frames are the right ones (the generated sets encode frame identity in their pixels and state)
    for i in range(0, len(ds), 7):
        item = ds[i]
        ep, fi = int(item["episode_index"]), int(item["frame_index"])
        assert framecode.verify_frame(item["observation.images.front"][1].permute(1, 2, 0).numpy(), ep, fi,
                                      "observation.images.front")["ok"], (item["dataset"], ep, fi)
        np.testing.assert_allclose(item["observation.state"].numpy(), framecode.expected_state(ep, fi), rtol=1e-6)


def test_getitems_equals_default_collate_of_items(coll):
    dt = {"observation.state": [-1 / 30, 0.0], "action": [0.0, 1 / 30]}
    ds = coll.dataset(f"SELECT dataset, index, frame_index * 2 AS twice FROM frames WHERE {PICK}",
                      delta_timestamps=dt, return_uint8=True)
    rng = np.random.default_rng(0)
    for idx in (rng.choice(len(ds), 9, replace=False).tolist(), [0, 1, 2], [len(ds) - 1, 0]):
        assert_items_equal(default_collate(ds.__getitems__(idx)), default_collate([ds[i] for i in idx]))


def test_dataloader_workers_give_the_same_batches(coll):
    ds = coll.dataset("SELECT dataset, episode_index, 0.0 AS start_s, 0.3 AS end_s FROM episodes "
                      "WHERE episode_index < 2", return_uint8=True)
    ref = [default_collate([ds[i] for i in range(b, min(b + 8, len(ds)))]) for b in range(0, len(ds), 8)]
    got = list(DataLoader(ds, batch_size=8, num_workers=2))
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a["dataset"] == b["dataset"]
        for k in ("observation.images.wrist", "action", "index", "dataset_index"):
            assert torch.equal(a[k], b[k]), k



def test_dataloader_workers_shuffled_mixed_batches_equal_items(coll):
    """Shuffled: every batch mixes datasets; float frames and windows; the combined batch is built in the
    workers' recycled batch memory, streamed one batch at a time: all keys equal default_collate of the items."""
    dt = {"observation.state": [-1 / 30, 0.0], "action": [0.0, 1 / 30]}
    ds = coll.dataset(f"SELECT dataset, index FROM frames WHERE {PICK}", delta_timestamps=dt)
    order = np.random.default_rng(4).permutation(len(ds))[:96].tolist()
    n = 0
    for j, batch in enumerate(DataLoader(ds, batch_size=16, sampler=order, num_workers=2,
                                         multiprocessing_context="fork")):
        idx = order[16 * j:16 * (j + 1)]
        assert len(set(batch["dataset"])) > 1
        assert_items_equal(batch, default_collate([ds[i] for i in idx]))
        n += len(idx)
        del batch
    assert n == 96

def test_samplers_keep_episodes_of_different_datasets_apart(coll):
    ds = coll.dataset("SELECT dataset, episode_index FROM episodes WHERE episode_index < 2")
    s = lsql.EpisodeShardedSampler(ds, num_replicas=2, rank=0, seed=1)
    t = lsql.EpisodeShardedSampler(ds, num_replicas=2, rank=1, seed=1)
    a, b = list(s), list(t)
    assert set(a) | set(b) == set(range(len(ds)))  # the shorter shard repeats its own start
    assert set(s.positions.tolist()).isdisjoint(t.positions.tolist())
    key = lambda i: (ds.names[ds.dataset_index[i]], int(ds.manifest["episode_index"][i].as_py()))  # noqa: E731
    assert not {key(i) for i in a} & {key(i) for i in b}  # (dataset, episode) is the unit, not episode_index
    assert len({key(i) for i in a} | {key(i) for i in b}) == 8


@pytest.fixture(scope="module")
def top20(tmp_path_factory, datasets):
    return renamed_copy(datasets / "small20", tmp_path_factory.mktemp("ren") / "top20",
                        {"observation.images.front": "observation.images.top"})


def test_keys_that_do_not_line_up_are_refused_then_renamed(datasets, top20):
    c = lsql.connect_many([datasets / "small20", top20])
    sql = "SELECT dataset, index FROM frames WHERE frame_index = 3 AND episode_index < 3"
    with pytest.raises(lsql.ResultContractError, match=r"observation.images.top.*missing in \['small20'\]"):
        c.dataset(sql)
    ds = c.dataset(sql, rename={"top20": {"observation.images.top": "observation.images.front"}},
                   delta_timestamps={"observation.images.front": [-1 / 30, 0.0]})
    own = lsql.connect(datasets / "small20").dataset("SELECT index FROM frames WHERE frame_index = 3 AND "
                                                     "episode_index < 3 ORDER BY index",
                                                     delta_timestamps={"observation.images.front": [-1 / 30, 0.0]})
    by_name = {}
    for i in range(len(ds)):
        by_name.setdefault(ds[i]["dataset"], []).append(_own(ds[i]))
    for name in ("small20", "top20"):  # the renamed copy's frames are small20's frames, key for key
        assert len(by_name[name]) == len(own) == 3
        for a, b in zip(by_name[name], [own[j] for j in range(len(own))]):
            assert_items_equal(a, b)
    tab = c.dataset(sql, features=["observation.state", "action"])
    assert "observation.images.wrist" not in tab[0] and tab[0]["action"].shape == (6,)
    with pytest.raises(KeyError, match="observation.images.top"):
        c.dataset(sql, rename={"top20": {"observation.images.topp": "x"}})


def _fps15_copy(orig, dst):
    """small20 relabelled as 15 fps (info.json and the data timestamps, frame_index / 15), without its cameras."""
    shutil.copytree(orig, dst, ignore=shutil.ignore_patterns("videos"))
    info = json.loads((dst / "meta/info.json").read_text())
    info["fps"] = 15
    info["features"] = {k: f for k, f in info["features"].items() if f["dtype"] != "video"}
    for f in dst.glob("meta/episodes/*/*.parquet"):
        t = pq.read_table(f)
        pq.write_table(t.select([c for c in t.column_names if not c.startswith("videos/")]), f)
    (dst / "meta/info.json").write_text(json.dumps(info))
    for f in dst.glob("data/*/*.parquet"):
        t = pq.read_table(f)
        ts = pa.array((t["frame_index"].to_numpy() / np.float32(15)).astype(np.float32))
        pq.write_table(t.set_column(t.column_names.index("timestamp"), "timestamp", ts), f)
    return dst


def test_different_fps_check_their_own_grid(tmp_path, datasets):
    slow = _fps15_copy(datasets / "small20", tmp_path / "slow15")
    c = lsql.connect_many([datasets / "small20", slow])
    sql = "SELECT dataset, index FROM frames WHERE frame_index = 10 AND episode_index = 2"
    ds = c.dataset(sql, features=["observation.state", "action"], delta_timestamps={"action": [0.0, 2 / 30]})
    by = {ds[i]["dataset"]: ds[i] for i in range(len(ds))}
    # 2/30 s is 2 frames at 30 fps and 1 frame at 15 fps: each dataset finds its own neighbour
    state = pq.read_table(sorted((datasets / "small20").glob("data/*/*.parquet"))[0], columns=["index", "action"])
    actions = {i: a for i, a in zip(state["index"].to_pylist(), state["action"].to_pylist())}
    i0 = int(by["small20"]["index"])
    np.testing.assert_array_equal(by["small20"]["action"].numpy(), np.float32([actions[i0], actions[i0 + 2]]))
    np.testing.assert_array_equal(by["slow15"]["action"].numpy(), np.float32([actions[i0], actions[i0 + 1]]))
    with pytest.raises(ValueError, match="slow15"):  # 1/30 s is off the 15 fps grid
        c.dataset(sql, features=["observation.state", "action"], delta_timestamps={"action": [0.0, 1 / 30]})


def test_vectors_of_another_length_are_refused_naming_both(tmp_path, datasets):
    short = shortened_vector_copy(datasets / "small20", tmp_path / "short", "action", 3)
    c = lsql.connect_many([datasets / "small20", short])
    sql = "SELECT dataset, index FROM frames WHERE frame_index = 3 AND episode_index = 0"
    with pytest.raises(lsql.ResultContractError, match=r"'action' differs: small20: .*\(6,\).*short: .*\(3,\)"):
        c.dataset(sql)
    ds = c.dataset(sql, features=["observation.state", "observation.images.front"])
    assert {ds[i]["dataset"] for i in range(len(ds))} == {"small20", "short"} and "action" not in ds[0]


def test_rename_never_takes_a_name_the_item_already_uses(coll):
    sql = "SELECT dataset, episode_index FROM episodes WHERE episode_index < 1"
    for target in ("task", "dataset", "timestamp", "observation.state_is_pad", "observation.state"):
        with pytest.raises(ValueError, match="already uses"):
            coll.dataset(sql, rename={"small20": {"action": target}})
    with pytest.raises(ValueError, match="default column"):
        coll.dataset(sql, rename={"small20": {"index": "idx"}})
    with pytest.raises(TypeError, match=r"features=\['action'\]"):
        coll.dataset(sql, features="action")
    # a swap within one dataset is a rename, not a clash
    ds = coll.dataset(sql, rename={n: {"observation.state": "action", "action": "observation.state"} for n in SETS},
                      features=["action", "observation.state"])
    own = lsql.connect(coll["small20"].source.root).dataset("SELECT index FROM frames WHERE episode_index = 0 "
                                                            "ORDER BY index")
    i = next(j for j in range(len(ds)) if ds.dataset_index[j] == 0)
    assert torch.equal(ds[i]["action"], own[int(ds.local[i])]["observation.state"])


def test_a_collection_dataset_takes_the_same_indices(coll):
    ds = coll.dataset(f"SELECT dataset, index FROM frames WHERE {PICK}", cameras=[])
    assert int(ds[np.int64(2)]["index"]) == int(ds[torch.tensor(2)]["index"]) == int(ds[2]["index"])
    for bad in (True, torch.tensor([2]), np.array([2]), 2.0):
        with pytest.raises(TypeError, match="dataset indices must be integers"):
            ds[bad]


def test_a_collection_dataset_takes_slices_as_a_datasets_own(coll):
    """`coll.dataset(sql)[0:2]` was a TypeError whose message offered slices ("... or slices (as LeRobotDataset)");
    a dataset's own `ds[0:3]` gives the list of items, as lerobot 0.6. Now a collection's does too."""
    ds = coll.dataset(f"SELECT dataset, index FROM frames WHERE {PICK}", cameras=[])
    n = len(ds)
    for sl, want in ((slice(0, 2), [0, 1]), (slice(None, None, 7), list(range(0, n, 7))),
                     (slice(-3, None), [n - 3, n - 2, n - 1]), (slice(5, 2), []), (slice(n - 1, n + 10), [n - 1])):
        got = ds[sl]
        assert isinstance(got, list) and len(got) == len(want), sl
        for item, j in zip(got, want):
            assert_items_equal(item, ds[j])
    assert {it["dataset"] for it in ds[::3]} == set(coll.names)  # items of every dataset in one slice


def test_a_feature_named_like_a_key_the_collection_adds_is_refused_then_renamed(datasets, tmp_path):
    """A dataset's own float32 (6,) feature ``dataset_index`` came back as tensor(0) / tensor(1) (the collection's
    key) in items and batches. Refused at coll.dataset(), naming the dataset, the key and the rename= that keeps
    it; that rename gives the source's vector under the new key, and the collection's dataset_index beside it."""
    from helpers import extra_feature_copy, feature_values
    from lerobot_sql.errors import DatasetFormatError

    arm = extra_feature_copy(datasets / "small20", tmp_path / "arm", "dataset_index")
    coll = lsql.connect_many({"small20": datasets / "small20", "arm": arm})
    sql = "SELECT dataset, index FROM frames WHERE episode_index = 3 AND frame_index < 3 ORDER BY dataset, index"
    sql_arm = sql.replace("WHERE", "WHERE dataset = 'arm' AND")
    fix = "rename={'arm': {'dataset_index': 'source.dataset_index'}}"
    for query, kw in ((sql_arm, {}), (sql, {"features": ["action", "dataset_index"]})):
        with pytest.raises(DatasetFormatError) as e:
            coll.dataset(query, cameras=[], **kw)
        msg = str(e.value)
        assert "dataset 'arm'" in msg and "feature 'dataset_index'" in msg and str(arm) in msg and fix in msg
    # dropped by features=, the feature cannot clash
    both = coll.dataset(sql, cameras=[], features=["action"])
    assert sorted(int(both[i]["dataset_index"]) for i in range(len(both))) == [0, 0, 0, 1, 1, 1]
    # the fix the message names, exactly
    ds = coll.dataset(sql_arm, cameras=[], rename=eval(fix.split("=", 1)[1]))
    assert len(ds) == 3
    for i in range(3):
        item = ds[i]
        assert item["dataset"] == "arm" and item["dataset_index"].dtype == torch.int64
        assert int(item["dataset_index"]) == 1
        want = feature_values(arm, "dataset_index", int(item["index"]))
        assert item["source.dataset_index"].dtype == torch.float32
        np.testing.assert_array_equal(item["source.dataset_index"].numpy(), want)
        assert not np.array_equal(want, np.full(6, 1, np.float32))
    batch = next(iter(DataLoader(ds, batch_size=3)))
    assert batch["dataset_index"].tolist() == [1, 1, 1] and batch["source.dataset_index"].shape == (3, 6)
    np.testing.assert_array_equal(batch["source.dataset_index"][2].numpy(),
                                  feature_values(arm, "dataset_index", int(batch["index"][2])))
    # a query column of that name is replaced the same way: refused, naming the alias fix
    with pytest.raises(lsql.ResultContractError, match=r"'dataset_index'.*alias"):
        coll.dataset("SELECT dataset, index, 7 AS dataset_index FROM frames WHERE index < 2", cameras=[],
                     features=["action"])


def test_a_feature_named_like_a_padding_key_keeps_its_own_rename(datasets, tmp_path):
    """A dataset's own bool (6,) feature ``action_is_pad`` (no delta_timestamps on action, so no padding key takes
    its name) was taken for action's padding key by the collection's renaming: ``rename={'arm': {'action_is_pad':
    ...}}`` was ignored and renaming ``action`` renamed it too, in items and batches."""
    from helpers import extra_feature_copy, feature_values

    arm = extra_feature_copy(datasets / "small20", tmp_path / "arm", "action_is_pad", dtype="bool")
    coll = lsql.connect_many({"arm": arm})
    sql = "SELECT dataset, index FROM frames WHERE episode_index = 3 AND frame_index < 3 ORDER BY index"
    for rename, key in (({"action_is_pad": "action_flags"}, "action_flags"), ({"action": "act"}, "action_is_pad")):
        ds = coll.dataset(sql, cameras=[], rename={"arm": rename})
        item = ds[1]
        assert key in item and "act_is_pad" not in item and (key == "action_is_pad" or "action_is_pad" not in item)
        want = feature_values(arm, "action_is_pad", int(item["index"]))
        assert item[key].dtype == torch.bool and want.any() and not want.all()
        np.testing.assert_array_equal(item[key].numpy(), want)
        batch = next(iter(DataLoader(ds, batch_size=3)))
        assert set(batch) == set(item)
        np.testing.assert_array_equal(batch[key][1].numpy(), want)
    # a rename whose padding key would be that feature's name: refused as any rename onto a name in use
    with pytest.raises(ValueError, match=r"'observation.state' -> 'action'.*already uses"):
        coll.dataset(sql, cameras=[], rename={"arm": {"observation.state": "action", "action": "observation.state"}},
                     delta_timestamps={"action": [0.0, 1 / 30]})


def test_align_per_dataset_reads_a_wall_clock_dataset_by_frame_index(datasets, tmp_path, framecode):
    """A collection holding a dataset whose timestamp column is wall-clock time (a clock at 0.9x over clips on the fps
    grid) beside a normal one: by time it is refused naming that dataset and align="frame_index" (the collection
    took no align at all: its manifest always located by time); with align={name: "frame_index"} every item of it
    is its own frame (framecode) and the other dataset's items are its own items by time."""
    wc = tmp_path / "wc"
    shutil.copytree(datasets / "small20", wc)
    wall_clock(wc, 0.9)
    coll = lsql.connect_many({"wc": wc, "ok": datasets / "multifile60"})
    sql = "SELECT dataset, index FROM frames WHERE episode_index IN (2, 3) AND frame_index % 17 = 5 ORDER BY dataset, index"
    with pytest.raises(lsql.DatasetFormatError, match="frame_index"):
        coll.dataset(sql)
    with pytest.raises(KeyError, match="not a dataset of this collection"):
        coll.dataset(sql, align={"wcc": "frame_index"})
    ds = coll.dataset(sql, align={"wc": "frame_index"}, return_uint8=True)
    own = lsql.connect(datasets / "multifile60").dataset(
        "SELECT index FROM frames WHERE episode_index IN (2, 3) AND frame_index % 17 = 5 ORDER BY index",
        return_uint8=True)
    names = [ds[i]["dataset"] for i in range(len(ds))]
    assert names.count("wc") > 10 and names.count("ok") == len(own)
    for i in range(len(ds)):
        item = ds[i]
        ep, fi = int(item["episode_index"]), int(item["frame_index"])
        if item["dataset"] == "wc":
            for cam in ("observation.images.front", "observation.images.wrist"):
                assert framecode.verify_frame(item[cam].permute(1, 2, 0).numpy(), ep, fi, cam)["ok"], (ep, fi, cam)
        else:
            assert_items_equal(_own(item), own[names[:i].count("ok")])
