"""Batched fetch: ``ds.__getitems__`` and what a DataLoader yields with it equal
``default_collate([ds[i] for i in idx])`` key by key, bit for bit, for every training profile and dataset kind."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import lerobot_sql as lsql

KINDS = ["small20", "multifile60", "h264_20", "img5_extras", "v21_small20", "depth4"]
PROFILES = ["plain", "act", "diffusion"]
FPS = 30


def _delta(profile: str, cams: list[str]) -> dict | None:
    if profile == "plain":
        return None
    if profile == "act":  # an action chunk of 50
        return {"action": [i / FPS for i in range(50)]}
    d = {"observation.state": [-1 / FPS, 0.0], "action": [i / FPS for i in range(-1, 15)]}
    d.update({k: [-1 / FPS, 0.0] for k in cams})  # diffusion: state and cameras at [-1, 0], action [-1..14]
    return d


def _same(a, b, where="") -> None:
    """Equal bit for bit: tensors of the same dtype and shape (NaN where NaN), other values by type and ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        if a.dtype.is_floating_point:  # bits, so NaN equals NaN and -0.0 differs from 0.0
            a, b = a.contiguous().view(torch.uint8 if a.element_size() == 1 else torch.int16 if a.element_size() == 2
                                       else torch.int32 if a.element_size() == 4 else torch.int64), \
                b.contiguous().view(torch.uint8 if b.element_size() == 1 else torch.int16 if b.element_size() == 2
                                    else torch.int32 if b.element_size() == 4 else torch.int64)
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, list(a), list(b))
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for j, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{j}]")
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def _indices(ds, n: int, seed: int) -> list[int]:
    """Shuffled indices over the whole set, with episode edges (padding both sides) and one index twice."""
    rng = np.random.default_rng(seed)
    ep = ds.manifest["episode_index"].to_numpy()
    firsts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    lasts = np.r_[firsts[1:] - 1, len(ep) - 1]
    idx = list(rng.choice(len(ds), n, replace=False)) + [int(firsts[1]), int(lasts[2]), int(lasts[-1])]
    idx.append(idx[3])  # repeated
    rng.shuffle(idx)
    return [int(i) for i in idx]


def _loader_batch(ds, idx, **kw):
    return next(iter(DataLoader(ds, batch_size=len(idx), sampler=idx, **kw)))


@pytest.mark.parametrize("uint8", [False, True], ids=["float", "uint8"])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", KINDS)
def test_batch_equals_collated_items(datasets, kind, profile, uint8):
    db = lsql.connect(datasets / kind)
    cams = db.dataset("SELECT index FROM frames LIMIT 1").camera_keys
    ds = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta(profile, cams),
                    return_uint8=uint8)
    idx = _indices(ds, 13, seed=len(kind) + len(profile))
    ref = default_collate([ds[i] for i in idx])
    calls = []
    real = ds.__getitems__
    ds.__getitems__ = lambda ii: calls.append(list(ii)) or real(ii)  # the fetcher looks the hook up on the instance
    got = _loader_batch(ds, idx)
    assert calls == [idx]  # the DataLoader took the batched path
    _same(ref, got)
    assert len(got["index"]) == len(idx) and got["index"].tolist() == ds.manifest["index"].to_numpy()[idx].tolist()
    if profile == "act":
        assert got["action"].shape == (len(idx), 50, 6) and got["action_is_pad"].any()
    if profile == "diffusion" and cams:
        h, w, ch = ds.features[cams[0]]["shape"]
        assert got[cams[0]].shape == (len(idx), 2, ch, h, w) and got[f"{cams[0]}_is_pad"].any()
    depth = set(ds.meta.depth_keys)  # depth maps stay float32 with return_uint8, as lerobot 0.6's
    for k in cams:
        assert got[k].dtype == (torch.uint8 if uint8 and k not in depth else torch.float32)
    if kind == "multifile60":  # the batch spans several mp4s and data files
        for k in cams:
            assert len(set(ds.manifest[f"{k}/file"].to_numpy(zero_copy_only=False)[idx])) > 1
        assert len(set(ds.manifest["data_file"].to_numpy(zero_copy_only=False)[idx])) > 1


@pytest.mark.parametrize("kind", ["small20", "multifile60"])
@pytest.mark.parametrize("align", ["timestamp", "frame_index"])
def test_a_batch_locates_window_frames_as_its_items_do(datasets, tmp_path, kind, align):
    """A batch's delta_timestamps camera frames are located per mp4 for all its items at once (by time within
    tolerance_s and the clip, or by position with align="frame_index"): the same frames as each item's own lookup
    (a frame outside the clip raises as its item does: test_locate.py)."""
    db = lsql.connect(datasets / kind, cache_dir=tmp_path / "c")
    cams = db.dataset("SELECT index FROM frames LIMIT 1").camera_keys
    ds = db.dataset("SELECT index FROM frames ORDER BY index", align=align, return_uint8=True,
                    delta_timestamps={**{k: [-2 / FPS, -1 / FPS, 0.0, 1 / FPS] for k in cams}})
    idx = _indices(ds, 21, seed=3)
    _same(default_collate([ds[i] for i in idx]), default_collate(ds.__getitems__(idx)))


@pytest.mark.parametrize("kind", ["small20", "img5_extras"])
def test_bare_getitems_contract(datasets, kind):
    """The bare result: a sequence of the items (each equal to ``ds[i]``), and default_collate of it is the batch."""
    db = lsql.connect(datasets / kind)
    ds = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta("diffusion", []))
    idx = [7, 7, 300, 0, np.int64(1200), torch.tensor(5), -1]
    out = ds.__getitems__(idx)
    assert isinstance(out, list) and len(out) == len(idx)  # what torch documents __getitems__ to return
    assert len(out + []) == len(idx) and len(list(out)) == len(idx)
    for j, i in enumerate(idx):
        _same(dict(ds[int(i)]), dict(out[j]), f"item {j}")
    assert [dict(x)["index"].item() for x in out] == [dict(out[j])["index"].item() for j in range(len(idx))]
    _same(default_collate([ds[int(i)] for i in idx]), default_collate(out))
    # items taken out of batches collate as ordinary dicts
    _same(default_collate([ds[7], ds[300]]), default_collate([out[0], out[2]]))
    assert ds.__getitems__([]) is not None and len(ds.__getitems__([])) == 0
    with pytest.raises(IndexError):
        ds.__getitems__([0, len(ds)])
    with pytest.raises(TypeError):
        ds.__getitems__([0, 1.5])


def _outcome(f):
    try:
        return "ok", f()
    except Exception as e:  # the same error type either way
        return "error", type(e)


def test_extras_task_and_nulls(datasets):
    """Query extras (numbers, NULL numbers, text, NULL text, lists, NULL-holding lists) and task, both paths."""
    db = lsql.connect(datasets / "small20")
    ds = db.dataset("""SELECT index, index * 2 AS twice, index / 7 AS ratio, 'tag' || (index % 3) AS note,
                              CASE WHEN index % 2 = 0 THEN NULL ELSE index END AS maybe_num,
                              CASE WHEN index % 2 = 0 THEN NULL ELSE 'odd' END AS maybe_text,
                              [index, index + 1] AS pair, [1.5, NULL] AS holey, ['a', 'b'] AS words
                       FROM frames ORDER BY index""", cameras=[])
    for idx in ([1, 4, 9, 4, 2000], [2, 3, 5]):  # maybe_text first None: default_collate refuses, both ways
        ref = _outcome(lambda: default_collate([ds[i] for i in idx]))  # noqa: B023 (called here)
        got = _outcome(lambda: _loader_batch(ds, idx))  # noqa: B023 (called here)
        assert ref[0] == got[0]
        if ref[0] == "ok":
            _same(ref[1], got[1])
            assert got[1]["maybe_num"].dtype == torch.float64 and torch.isnan(got[1]["maybe_num"][1])
            assert got[1]["twice"].dtype == torch.int64 and got[1]["note"][0] == "tag1"
        else:
            assert ref[1] is got[1]
        for j, i in enumerate(idx):  # per item, always
            _same(ds[i], dict(ds.__getitems__(idx)[j]))
    assert "observation.images.front" not in ds.__getitems__([0])[0]


@pytest.mark.parametrize("kind", ["small20", "img5_extras", "depth4"])
def test_image_transforms_run_per_item_in_the_same_order(datasets, kind):
    """A random transform draws the same numbers in the same order: per item, cameras in order."""
    db = lsql.connect(datasets / kind)

    def jitter(x):
        return x.float() * torch.rand(()) + torch.rand(x.shape[-1])

    ds = db.dataset("SELECT index FROM frames ORDER BY index", image_transforms=jitter,
                    delta_timestamps=_delta("diffusion", db.dataset("SELECT index FROM frames LIMIT 1").camera_keys))
    idx = [3, min(900, len(ds) - 1), 3, 41]
    torch.manual_seed(0)
    ref = default_collate([ds[i] for i in idx])
    it = iter(DataLoader(ds, batch_size=len(idx), sampler=idx))  # the iterator draws its own seed first
    torch.manual_seed(0)
    got = next(it)
    _same(ref, got)
    torch.manual_seed(0)
    _same(ref, default_collate(ds.__getitems__(idx)))


@pytest.mark.parametrize("mode", ["plain", "uint8", "delta", "metres"])
def test_depth_batch_equals_lerobot_061_reference(datasets, mode):
    """The batch path on sample/depth4 (depth video dequantized over the whole batch tensor, depth images per item):
    every item of one batch over all reference indices (shuffled, one twice) is lerobot 0.6.1's (bit for bit, but
    metres from a log-quantized video: within 2 ulp, helpers.exp_bounds), and
    an image transform changes the RGB camera only (lerobot skips depth keys)."""
    from helpers import assert_item_equals_reference, exp_bounds, load_reference

    ref, npz = load_reference("depth4")
    db = lsql.connect(datasets / "depth4")
    items = ref["items"] + ref["items"][:1]
    order = np.random.default_rng(1).permutation(len(items))
    items = [items[j] for j in order]
    ds = db.dataset("SELECT index FROM frames ORDER BY index", **ref["modes"][mode])
    batch = ds.__getitems__([it["index"] for it in items])
    bounds = exp_bounds(datasets / "depth4", ref["modes"][mode])
    for j, it in enumerate(items):
        assert_item_equals_reference(dict(batch[j]), it, npz, mode, bounds)
    flip = db.dataset("SELECT index FROM frames ORDER BY index", image_transforms=lambda x: x.flip(-1),
                      **ref["modes"][mode])
    fb = flip.__getitems__([it["index"] for it in items])
    for j, it in enumerate(items):
        got = dict(fb[j])
        for key in ref["depth_keys"]:
            _same(got[key], batch[j][key], key)
        _same(got["observation.images.front"], batch[j]["observation.images.front"].flip(-1))
        _same(dict(flip[it["index"]]), got)


def test_one_camera_and_workers(datasets):
    """cameras=[one], two DataLoader workers (batch tensors in shared memory), every batch of an epoch."""
    db = lsql.connect(datasets / "multifile60")
    ds = db.dataset("SELECT index FROM frames WHERE episode_index % 7 = 0 ORDER BY index",
                    cameras=["observation.images.wrist"], delta_timestamps=_delta("act", []))
    idx = [int(i) for i in np.random.default_rng(1).permutation(len(ds))[:40]]
    batches = list(DataLoader(ds, batch_size=16, sampler=idx, num_workers=2))
    assert len(batches) == 3
    for j, got in enumerate(batches):
        _same(default_collate([ds[i] for i in idx[16 * j:16 * j + 16]]), got, f"batch {j}")
        assert "observation.images.front" not in got


def test_a_batch_needing_a_missing_mp4_raises_as_its_item_does(datasets, tmp_path):
    """A copy of multifile60 with one wrist mp4 deleted: a batch with an item from it raises the item's
    MissingFileError (naming the file and cameras=[...]); a batch of the other files is still exact."""
    import shutil
    import warnings

    from lerobot_sql.errors import MissingFileError

    root = tmp_path / "mf"
    shutil.copytree(datasets / "multifile60", root)
    gone = sorted((root / "videos" / "observation.images.wrist").rglob("*.mp4"))[-1]
    gone.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = lsql.connect(root).dataset("SELECT index FROM frames ORDER BY index")
    files = ds.manifest["observation.images.wrist/file"].to_numpy(zero_copy_only=False)
    bad = int(np.flatnonzero(files == str(gone.relative_to(root)))[0])
    good = [int(i) for i in np.flatnonzero(files != str(gone.relative_to(root)))[::997]]
    with pytest.raises(MissingFileError) as one:
        ds[bad]
    with pytest.raises(MissingFileError) as many:
        _loader_batch(ds, good[:3] + [bad] + good[3:])
    assert str(many.value) == str(one.value) and gone.name in str(many.value) and "cameras=[" in str(many.value)
    _same(default_collate([ds[i] for i in good]), _loader_batch(ds, good))


def test_parallel_cameras_batch(datasets):
    """parallel_cameras=True: the other camera's mp4s decode in the helper thread; the batch is unchanged."""
    db = lsql.connect(datasets / "multifile60")
    ds = db.dataset("SELECT index FROM frames ORDER BY index", parallel_cameras=True,
                    delta_timestamps={"observation.images.front": [-1 / FPS, 0.0]})
    assert ds._w().pool is not None
    idx = [int(i) for i in np.random.default_rng(2).permutation(len(ds))[:24]]
    _same(default_collate([ds[i] for i in idx]), _loader_batch(ds, idx))


def test_windows_across_row_groups(datasets, tmp_path):
    """small20 re-laid with row groups of 100 rows: windows crossing a boundary (read per item) and windows inside
    one (gathered per row group) in the same batch, all equal to the items; the batch spans many row groups."""
    import shutil

    import pyarrow.parquet as pq

    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    data = root / "data/chunk-000/file-000.parquet"
    data.chmod(0o644)
    pq.write_table(pq.read_table(data), data, row_group_size=100)
    db = lsql.connect(root)
    cams = db.dataset("SELECT index FROM frames LIMIT 1").camera_keys
    for profile in ("act", "diffusion"):
        ds = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta(profile, cams))
        idx = [99, 100, 101, 150, 1999, 2000, 60, 4761, 0, 100]
        assert len(set(np.asarray(ds._samples.slot)[idx])) >= 5
        _same(default_collate([ds[i] for i in idx]), _loader_batch(ds, idx), profile)


def test_batch_frames_and_windows_are_the_right_ones(datasets, framecode):
    """Ground truth, not only agreement with ds[i]: a diffusion batch over multifile60 (several mp4s and episodes)
    holds the frames [f-1, f] (clamped at the episode start) of each camera and state [f-1, f], action [f-1..f+14]
    clamped to the episode, per framecode."""
    db = lsql.connect(datasets / "multifile60")
    cams = db.dataset("SELECT index FROM frames LIMIT 1").camera_keys
    ds = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta("diffusion", cams),
                    return_uint8=True)
    idx = _indices(ds, 12, seed=7)
    got = _loader_batch(ds, idx)
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    for j in range(len(idx)):
        ep, f = int(got["episode_index"][j]), int(got["frame_index"][j])
        fr = np.clip(np.array([f - 1, f]), 0, lengths[ep] - 1)
        np.testing.assert_array_equal(got["observation.state"][j].numpy(), framecode.expected_state(ep, fr))
        fa = np.clip(np.arange(f - 1, f + 15), 0, lengths[ep] - 1)
        np.testing.assert_array_equal(got["action"][j].numpy(), framecode.expected_action(ep, fa))
        assert got["action_is_pad"][j].tolist() == [not 0 <= x < lengths[ep] for x in range(f - 1, f + 15)]
        for k in cams:
            for t, g in enumerate(fr):
                img = got[k][j, t].permute(1, 2, 0).numpy()
                assert framecode.verify_frame(img, ep, int(g), k)["ok"], (k, ep, f, t)


@pytest.mark.parametrize("memory", ["1", "0"])
def test_a_collate_fn_that_returns_the_items_as_they_are(datasets, monkeypatch, memory):
    """``collate_fn=lambda items: items`` in a worker: the Batch (holding the worker's memory slot and its lock)
    could not be pickled, the worker's queue thread printed the TypeError and the DataLoader waited forever
    (with or without LSQL_BATCH_MEMORY). Now it arrives as a list of item dicts equal to ``ds[i]``."""
    monkeypatch.setenv("LSQL_BATCH_MEMORY", memory)
    ds = lsql.connect(datasets / "small20").dataset(episodes=[0])
    dl = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=lambda items: items, timeout=120)
    got = [b for _, b in zip(range(6), dl)]
    assert len(got) == 6
    for j, b in enumerate(got):
        assert type(b) is list and len(b) == 4
        for k, item in enumerate(b):
            ref = ds[4 * j + k]
            assert item.keys() == ref.keys()
            for key, v in ref.items():
                assert torch.equal(item[key], v) if isinstance(v, torch.Tensor) else item[key] == v, (j, k, key)


def test_extras_a_dataloader_cannot_batch_are_refused_at_the_query(datasets):
    """``SELECT * FROM episodes`` brings ``tasks`` (one or two task texts per episode): ds[i] served it, and the
    first DataLoader batch mixing lengths failed inside torch's collate ("each element in list of batch should be
    of equal size"). A ragged list of numbers likewise. Both are refused when the dataset is built, naming the
    column; lists of one length still pass (of text too: test_extras_task_and_nulls)."""
    from lerobot_sql.errors import ResultContractError

    db = lsql.connect(datasets / "small20")
    assert db.sql("SELECT min(len(tasks)), max(len(tasks)) FROM episodes").fetchall() == [(1, 2)]
    with pytest.raises(ResultContractError, match=r"'tasks' holds lists of 1 to 2 texts.*tasks\[1\] AS tasks_first"):
        db.dataset("SELECT * FROM episodes", cameras=[])
    with pytest.raises(ResultContractError, match=r"'vl' holds lists of 0 to 2 values"):
        db.dataset("SELECT index, range(frame_index % 3) AS vl FROM frames", cameras=[])
    ds = db.dataset("SELECT index, [index, 2 * index] AS pair FROM frames WHERE episode_index = 0", cameras=[])
    b = default_collate([ds[i] for i in range(4)])
    assert b["pair"].tolist() == [[i, 2 * i] for i in range(4)]
