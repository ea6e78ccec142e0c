"""A selection served at a lower frame rate (``db.dataset(sql, fps=...)``; the rule: lerobot_sql/_readers/regrid.py):
the rule's index math against brute force, and the items, windows, meta and statistics of small20 (30 fps) served at
10 fps against the source's own files and items. The export at a lower rate: tests/test_video_encoder.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from lerobot_sql._readers import deltas, regrid
from lerobot_sql.errors import DatasetFormatError, ResultContractError


def _frames(root) -> pd.DataFrame:
    files = sorted((root / "data").glob("*/*.parquet"))
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def _lengths(root) -> dict[int, int]:
    files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    t = pd.concat([pq.read_table(f, columns=["episode_index", "length"]).to_pandas() for f in files])
    return dict(zip(t["episode_index"].tolist(), t["length"].tolist()))


def _new_index(lengths: dict[int, int], k: int) -> dict[tuple[int, int], int]:
    """(episode, new frame_index) -> index of the dataset recorded at 1/k of the rate, counted frame by frame."""
    out, n = {}, 0
    for ep in sorted(lengths):
        for f in range(math.ceil(lengths[ep] / k)):
            out[(ep, f)] = n
            n += 1
    return out


# ---- the rule ------------------------------------------------------------------------------------------------------
def test_the_rates_that_divide_the_source_rate_are_served():
    assert regrid.stride(10, 30) == 3 and regrid.stride(10.0, 30) == 3 and regrid.stride(np.int64(15), 30.0) == 2
    assert regrid.stride(30, 30) == 1 and regrid.stride(1, 30) == 30
    assert regrid.divisors(30) == [1, 2, 3, 5, 6, 10, 15, 30] and regrid.divisors(29.97) == []


@pytest.mark.parametrize("fps, error, match", [
    (20, ValueError, r"fps=20 does not divide the dataset's 30 fps \(30 / 20 = 1\.5 .*16\.7 ms.*"
                     r"fps in \[1, 2, 3, 5, 6, 10, 15, 30\]"),
    (7.5, ValueError, r"fps=7\.5: a frame rate here is a whole number"),  # 30 / 7.5 = 4, but info.json's fps is whole
    (60, ValueError, r"fps=60 is above the dataset's 30 fps.*fps in \[1, 2, 3"),
    (0, ValueError, r"fps=0: give a whole number of frames per second > 0"),
    (-10, ValueError, r"> 0"),
    (float("nan"), ValueError, r"> 0"),
    (float("inf"), ValueError, r"> 0"),
    ("10", TypeError, r"fps='10' \(str\)"),
    (True, TypeError, r"fps=True \(bool\)"),
])
def test_other_rates_are_refused_naming_both_rates(fps, error, match):
    with pytest.raises(error, match=match):
        regrid.stride(fps, 30)


def test_a_source_rate_that_is_not_whole_is_served_at_its_own_rate_only():
    with pytest.raises(ValueError, match=r"29\.97\) is not a whole number, so it is served at its own rate only"):
        regrid.stride(10, 29.97)


def test_the_grid_numbers_frames_as_a_recording_at_the_new_rate():
    lengths = {0: 7, 1: 9, 2: 1, 3: 10, 5: 0, 6: 3}  # (5: an empty episode; 4 absent)
    for k in (1, 2, 3, 4):
        g = regrid.Grid.of(30 // k if 30 % k == 0 else 1, k, np.array(list(lengths))[::-1],
                           np.array(list(lengths.values()))[::-1])  # any order in
        want = _new_index(lengths, k)
        for (ep, f), idx in want.items():
            assert g.index(ep, f * k) == idx and g.frame_index(f * k) == f
        np.testing.assert_array_equal(g.lengths(np.array([7, 9, 1, 10, 0, 3])),
                                      [math.ceil(n / k) for n in (7, 9, 1, 10, 0, 3)])
    g = regrid.Grid.of(10, 3, np.array([0]), np.array([5]))
    assert g.timestamp(np.array([0, 3, 39]))[2] == np.float32(13 / 10) and g.timestamp(3).dtype == np.float32
    with pytest.raises(DatasetFormatError, match=r"episode\(s\) \[4\] are not in meta/episodes"):
        regrid.Grid.of(10, 3, np.array(list(lengths)), np.array(list(lengths.values()))).index(4, 0)


def test_the_clamp_at_a_lower_rate_stops_at_the_last_kept_frame():
    """query_indices with a stride against brute force over the kept frames of episodes of every length mod k."""
    for k in (2, 3, 4):
        for length in range(1, 3 * k + 2):
            ep_from = 1000
            kept = [ep_from + p for p in range(0, length, k)]
            offsets = np.array([-2, -1, 0, 1, 2, 5]) * k
            for a, idx in enumerate(kept):
                q, pad = deltas.query_indices(idx, offsets, ep_from, ep_from + length, k)
                for o, qi, p in zip(offsets // k, q, pad):
                    b = a + o
                    assert p == (b < 0 or b >= len(kept))
                    assert qi == kept[min(max(b, 0), len(kept) - 1)]
    # stride 1 is lerobot's rule, unchanged
    q, pad = deltas.query_indices(np.array([[5], [9]]), np.array([-6, 0, 3]), 0, 10)
    np.testing.assert_array_equal(q, [[0, 5, 8], [3, 9, 9]])
    np.testing.assert_array_equal(pad, [[True, False, False], [False, False, True]])


def test_frames_whose_frame_index_is_not_their_position_are_refused(datasets):
    db = lsql.connect(datasets / "small20")
    m = db.manifest("SELECT episode_index FROM episodes WHERE episode_index = 3")
    assert regrid.on_grid(m, 1, "episode", "q") is m  # the source rate: nothing to do
    fi = m["frame_index"].to_numpy().copy()
    fi[7] += 1
    bad = m.set_column(m.column_names.index("frame_index"), "frame_index", pa.array(fi))
    with pytest.raises(DatasetFormatError, match=r"episode 3: the row with index \d+ has frame_index 8, but it is "
                                                 r"frame 7 of the episode .*frame_index_contiguous"):
        regrid.on_grid(bad, 3, "episode", "q")


# ---- the dataset at 10 fps -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small20(datasets):
    root = datasets / "small20"
    return root, lsql.connect(root), _frames(root), _lengths(root)


def test_items_at_10fps_are_every_third_frame_renumbered(small20):
    root, db, d, lengths = small20
    ds = db.dataset(fps=10, return_uint8=True)
    src = db.dataset(return_uint8=True)
    kept = d[d.frame_index % 3 == 0].sort_values("index").reset_index(drop=True)
    assert len(ds) == len(kept) == sum(math.ceil(n / 3) for n in lengths.values()) == 1593
    assert ds.fps == 10 and isinstance(ds.fps, int)
    new_index = _new_index(lengths, 3)
    for i in (0, 1, 2, 76, 77, 78, 79, 500, 1000, len(ds) - 1):
        a, row = ds[i], kept.iloc[i]
        b = src[int(row["index"])]  # the source's item of the same frame
        assert set(a) == set(b)
        for k in set(a) - {"index", "frame_index", "timestamp", "task"}:
            assert torch.equal(a[k], b[k]), (i, k)
        assert a["task"] == b["task"]
        assert int(a["frame_index"]) == row["frame_index"] // 3 and a["frame_index"].dtype == torch.int64
        assert a["timestamp"].dtype == torch.float32 and \
            a["timestamp"].item() == np.float32(row["frame_index"] // 3 / 10)
        assert int(a["index"]) == new_index[(int(row["episode_index"]), int(row["frame_index"]) // 3)]
    # a batch equals its items, bit for bit
    ii = [0, 77, 78, 1592, 5]
    batch = torch.utils.data.default_collate(ds.__getitems__(ii))
    items = torch.utils.data.default_collate([ds[i] for i in ii])
    assert batch.keys() == items.keys()
    for k, v in items.items():
        assert torch.equal(batch[k], v) if isinstance(v, torch.Tensor) else batch[k] == v


def test_the_source_rate_is_the_dataset_itself(small20):
    _, db, _, _ = small20
    a, b = db.dataset(episodes=[2], fps=30), db.dataset(episodes=[2])
    assert len(a) == len(b) and a.fps == b.fps == 30
    for i in (0, 5, len(a) - 1):
        x, y = a[i], b[i]
        assert all(torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k] for k in x)


def test_delta_timestamps_are_seconds_on_the_new_grid(small20):
    """Windows step 3 source frames per 0.1 s and clamp at the episode's last kept frame, which is not its last frame
    when its length is not 1 mod 3 (a clamp at the last frame would serve a frame a 10 fps recording lacks)."""
    root, db, d, lengths = small20
    dt = {"action": [-0.2, -0.1, 0.0, 0.1, 0.2], "observation.images.front": [-0.1, 0.0, 0.1],
          "frame_index": [0.0, 0.1], "timestamp": [-0.1, 0.0], "index": [0.0, 0.1]}
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index IN (0, 1)", fps=10, delta_timestamps=dt,
                    return_uint8=True)
    src = db.dataset(return_uint8=True)
    assert ds.delta_indices == {k: [round(x * 10) for x in v] for k, v in dt.items()}
    assert {lengths[0] % 3, lengths[1] % 3} - {1}, "episodes 0/1 should include one whose last frame is off the grid"
    by = d.set_index(["episode_index", "frame_index"])
    new_index = _new_index(lengths, 3)
    m = ds.manifest.to_pandas()  # (the source frames served): each episode's first and last frames, a few between
    n_of = m.episode_index.map(lambda e: math.ceil(lengths[e] / 3))
    edge = (m.frame_index < 9) | (m.frame_index // 3 >= n_of - 3) | (m.index % 40 == 0)
    for i in np.flatnonzero(edge.to_numpy()).tolist():
        item = ds[i]
        ep = int(item["episode_index"])
        n_new = math.ceil(lengths[ep] / 3)
        f = int(item["frame_index"][0])  # the item's own new frame_index (offset 0.0 of its window)
        for key, offs in dt.items():
            want_pad = [not 0 <= f + round(o * 10) < n_new for o in offs]
            clamped = [min(max(f + round(o * 10), 0), n_new - 1) for o in offs]
            assert item[f"{key}_is_pad"].tolist() == want_pad, (i, key)
            if key == "action":
                want = np.stack([by.loc[(ep, c * 3), "action"] for c in clamped])
                np.testing.assert_array_equal(item[key].numpy(), want)
            elif key == "observation.images.front":
                for j, c in enumerate(clamped):
                    assert torch.equal(item[key][j], src[int(by.loc[(ep, c * 3), "index"])][key]), (i, j)
            elif key == "frame_index":
                assert item[key].tolist() == clamped
            elif key == "timestamp":
                assert item[key].tolist() == [float(np.float32(c / 10)) for c in clamped]
            else:
                assert item[key].tolist() == [new_index[(ep, c)] for c in clamped]
    with pytest.raises(ValueError, match=r"multiples of 1/fps=0\.100000s"):  # 1/30 s is no 10 fps frame
        db.dataset(episodes=[0], fps=10, delta_timestamps={"action": [0, 1 / 30]})


def test_meta_and_stats_are_the_recordings_at_the_new_rate(small20):
    root, db, d, lengths = small20
    eps = [0, 4, 5]
    ds = db.dataset(episodes=eps, fps=10)
    m = ds.meta
    info = json.loads((root / "meta" / "info.json").read_text())
    assert m.fps == m.info["fps"] == m.info.fps == 10 and ds.fps == 10
    assert all(f["info"]["video.fps"] == 10 for k, f in m.features.items() if f["dtype"] == "video")
    assert info["fps"] == 30  # (the source untouched)
    n = [math.ceil(lengths[e] / 3) for e in eps]
    assert m.total_frames == len(ds) == sum(n) and m.total_episodes == 3
    assert m.episodes["episode_index"] == eps and m.episodes["length"] == n
    assert m.episodes["dataset_from_index"] == [0, n[0], n[0] + n[1]]
    assert m.episodes["dataset_to_index"] == list(np.cumsum(n))
    st = m.stats
    kept = d[d.episode_index.isin(eps) & (d.frame_index % 3 == 0)].sort_values("index")
    state = np.stack(kept["observation.state"]).astype(np.float64)
    np.testing.assert_array_equal(st["observation.state"]["min"], state.min(0))
    np.testing.assert_array_equal(st["observation.state"]["max"], state.max(0))
    np.testing.assert_allclose(st["observation.state"]["mean"], state.mean(0), rtol=1e-12)
    np.testing.assert_allclose(st["observation.state"]["q50"], np.quantile(state, 0.5, axis=0), rtol=1e-12)
    assert int(st["observation.state"]["count"][0]) == len(kept)
    fi = kept["frame_index"].to_numpy() // 3
    new_index = _new_index(lengths, 3)
    idx = np.array([new_index[(e, f)] for e, f in zip(kept["episode_index"], fi)])
    for key, values in {"frame_index": fi, "timestamp": (fi / 10).astype(np.float32), "index": idx}.items():
        v = values.astype(np.float64)
        assert st[key]["min"].tolist() == [v.min()] and st[key]["max"].tolist() == [v.max()], key
        np.testing.assert_allclose(st[key]["mean"], [v.mean()], rtol=1e-12)
        np.testing.assert_allclose(st[key]["std"], [v.std()], rtol=1e-12)
        np.testing.assert_allclose(st[key]["q99"], [np.quantile(v, 0.99)], rtol=1e-12)
    # cameras: their episodes' statistics, as for a window (lerobot_sql/stats.py)
    whole = db.stats(episodes=eps)
    for k in db.layout.video_keys:
        np.testing.assert_array_equal(st[k]["mean"], whole[k]["mean"])


def test_windows_keep_their_frames_on_the_grid_and_index_rows_must_be_on_it(small20):
    root, db, d, lengths = small20
    ds = db.dataset("SELECT 2 AS episode_index, 0.5 AS start_s, 1.5 AS end_s", fps=10)
    e2 = d[d.episode_index == 2]
    want = e2[(e2.timestamp >= 0.5 - 1e-6) & (e2.timestamp < 1.5 - 1e-6) & (e2.frame_index % 3 == 0)]
    assert [int(ds[i]["frame_index"]) for i in range(len(ds))] == (want.frame_index // 3).tolist() == \
        list(range(5, 15))
    assert ds.meta.episodes["length"] == [10]
    on = db.dataset("SELECT index FROM frames WHERE episode_index = 4 AND frame_index % 3 = 0", fps=10)
    assert len(on) == math.ceil(lengths[4] / 3)
    with pytest.raises(ResultContractError, match=r"the query: \d+ of \d+ index rows name frames a recording at 1/3 "
                                                  r"of the rate does not hold .*WHERE frame_index % 3 = 0"):
        db.dataset("SELECT index FROM frames WHERE episode_index = 4", fps=10)
    with pytest.raises(ResultContractError, match="none of the 2 selected frames is on the grid"):
        db.dataset("SELECT 2 AS episode_index, 0.03 AS start_s, 0.09 AS end_s", fps=10)


def test_a_saved_manifest_is_served_at_the_new_rate_too(small20, tmp_path):
    _, db, _, _ = small20
    sql = "SELECT episode_index FROM episodes WHERE episode_index IN (3, 7)"
    db.export_manifest(sql, tmp_path / "m.parquet")
    a, b = db.dataset(tmp_path / "m.parquet", fps=10), db.dataset(sql, fps=10)
    assert len(a) == len(b)
    for i in (0, len(a) // 2, len(a) - 1):
        x, y = a[i], b[i]
        assert all(torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k] for k in x)


def test_rates_that_do_not_divide_are_refused_before_the_query_runs(small20):
    _, db, _, _ = small20
    with pytest.raises(ValueError, match=r"fps=20 does not divide the dataset's 30 fps"):
        db.dataset("SELECT nonsense FROM nowhere", fps=20)
    with pytest.raises(ValueError, match=r"fps=60 is above the dataset's 30 fps"):
        db.dataset(fps=60)


def test_a_window_with_no_frame_on_the_grid_is_refused_not_dropped(datasets):
    """Hostile review 20: windows (episode 0, frames 1-2) and (episode 1, 0-1 s) at fps=10 gave episode 1's frames
    only, and the export wrote 1 episode for 2 windows, with no warning. Now refused naming the result row."""
    db = lsql.connect(datasets / "small20")
    sql = ("SELECT * FROM (VALUES (0, 1 / 30, 2.5 / 30), (1, 0.0, 1.0)) AS w(episode_index, start_s, end_s) "
           "ORDER BY episode_index")
    assert len(db.dataset(sql)) == 2 + 30
    with pytest.raises(lsql.ResultContractError, match="result row 0: episode 0, frame_index 1 to 2"):
        db.dataset(sql, fps=10)
