"""The ``episode_quality`` view (lerobot_sql._catalog.quality): a copy of small20 with one defect injected per
episode gets each injected episode its verdict and reason, and every other episode stays ``pass``; the shipped
sets' episodes all pass; thresholds, the cache, collections and ``doctor --episodes``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql

DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
FRONT = "videos/observation.images.front"


def _rewrite(path: Path, edit) -> None:
    """Rewrite a Parquet file with ``edit({column: numpy array}) -> None`` applied (schema and metadata kept)."""
    t = pq.read_table(path)
    cols = {}
    for name in t.column_names:
        col = t[name].combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            cols[name] = col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), -1).copy()
        else:
            cols[name] = col.to_numpy(zero_copy_only=False).copy()
    edit(cols)
    arrays = []
    for f in t.schema:
        v = cols[f.name]
        if pa.types.is_fixed_size_list(f.type):
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(v.ravel(), f.type.value_type), f.type.list_size))
        else:
            arrays.append(pa.array(v, f.type))
    pq.write_table(pa.Table.from_arrays(arrays, schema=t.schema), path)


@pytest.fixture(scope="module")
def injected(datasets, tmp_path_factory):
    """small20 with: episode 2 frozen (its state constant), 3 a state spike, 4 a NaN action, 5 a front clip 10
    frames shorter than the data, 6 a gripper that never moves, 7 a row repeated (frame_index twice), 0 a front clip
    starting 10 frames before the file's first frame (shifted)."""
    root = tmp_path_factory.mktemp("q") / "small20"
    shutil.copytree(datasets / "small20", root)
    eps = pq.read_table(root / EPISODES).to_pydict()
    rng = {e: (a, b) for e, a, b in zip(eps["episode_index"], eps["dataset_from_index"], eps["dataset_to_index"])}

    def data(c):
        s, a = c["observation.state"], c["action"]
        lo, hi = rng[2]
        s[lo:hi] = s[lo]
        lo, hi = rng[3]
        s[lo + 40, 1] += 1000 * (s[:, 1].max() - s[:, 1].min())
        lo, hi = rng[4]
        a[lo + 7, 2] = np.nan
        lo, hi = rng[6]
        s[lo:hi, 5] = s[lo, 5]
        lo, hi = rng[7]
        for k in ("observation.state", "action", "timestamp", "frame_index", "index", "task_index"):
            c[k][lo + 20] = c[k][lo + 19]

    _rewrite(root / DATA, data)

    def meta(c):
        i5, i0 = eps["episode_index"].index(5), eps["episode_index"].index(0)
        c[f"{FRONT}/to_timestamp"][i5] -= 10 / 30
        c[f"{FRONT}/from_timestamp"][i0] -= 10 / 30
        c[f"{FRONT}/to_timestamp"][i0] -= 10 / 30

    _rewrite(root / EPISODES, meta)
    return root


EXPECTED = {2: ("review", {"frozen_state", "still"}), 3: ("review", {"velocity_spike", "jerk_spike"}),
            4: ("exclude", {"nonfinite"}), 5: ("exclude", {"clip_short", "video_drift"}),
            6: ("review", {"gripper_static"}), 7: ("exclude", {"frame_index"}),
            0: ("exclude", {"clip_short", "clip_shifted"})}


def test_each_injected_defect_gets_its_verdict_and_reason_and_clean_episodes_pass(injected, tmp_path):
    db = lsql.connect(injected, cache_dir=tmp_path)
    got = {e: (v, set(r)) for e, v, r in db.sql("SELECT episode_index, verdict, reasons FROM episode_quality")
           .fetchall()}
    assert len(got) == 20
    for ep, (verdict, reasons) in EXPECTED.items():
        assert got[ep][0] == verdict and reasons <= got[ep][1], (ep, got[ep])
    assert all(got[e] == ("pass", set()) for e in got if e not in EXPECTED), got
    row = db.sql("SELECT * FROM episode_quality WHERE episode_index = 4").df().iloc[0]
    assert row["nonfinite_values"] == 1 and list(row["nonfinite_features"]) == ["action"]
    row = db.sql("SELECT * FROM episode_quality WHERE episode_index = 5").df().iloc[0]
    assert row["clip_missing_frames"] == 10 and row["worst_camera"] == "observation.images.front"
    assert row["video_drift_s"] == pytest.approx(10 / 30, abs=1e-6)
    row = db.sql("SELECT * FROM episode_quality WHERE episode_index = 7").df().iloc[0]
    assert row["repeated_frames"] == 1 and row["rows"] == row["length"]
    row = db.sql("SELECT * FROM episode_quality WHERE episode_index = 2").df().iloc[0]
    assert row["frozen_state_frac"] == 1.0 and row["state_speed"] == 0.0


@pytest.mark.parametrize("name", ["small20", "multifile60", "h264_20", "img5_extras", "depth4", "v21_small20"])
def test_every_episode_of_the_shipped_sets_passes(datasets, name, tmp_path):
    """No false positive on the shipped sets (their episodes are clean by construction)."""
    db = lsql.connect(datasets / name, cache_dir=tmp_path)
    rows = db.sql("SELECT verdict, count(*) FROM episode_quality GROUP BY 1").fetchall()
    total = db.sql("SELECT count(*) FROM episodes").fetchall()[0][0]
    assert rows == [("pass", total)], rows


@pytest.mark.parametrize("other", [99, 2**60, -5])
def test_rows_only_one_side_has_are_excluded(datasets, tmp_path, other):
    """An episode of meta/episodes without data rows, and rows of an episode meta/episodes lacks (orphaned): both
    exclude with reason rows. A hostile episode_index (2**60, negative) is one more episode, not an array as long
    as its value (the facts were kept in arrays indexed by the value: 2**60 asked for exabytes)."""
    root = tmp_path / "orphan"
    shutil.copytree(datasets / "small20", root)
    _rewrite(root / DATA, lambda c: c["episode_index"].__setitem__(slice(0, 348), other))  # episode 0's rows
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    got = dict(db.sql("SELECT episode_index, reasons FROM episode_quality WHERE verdict = 'exclude'").fetchall())
    assert set(got) == {0, other} and all("rows" in r for r in got.values()), got
    assert sorted(db.sql(f"SELECT rows, length FROM episode_quality WHERE episode_index IN (0, {other})").fetchall(),
                  key=str) == [(0, 348), (348, None)]


def test_thresholds_are_tunable_and_checked(datasets, tmp_path):
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path)
    assert db.sql("SELECT count(*) FROM episode_quality WHERE verdict = 'pass'").fetchall() == [(20,)]
    t = db.quality_thresholds(spike_z=0.5)
    assert t["spike_z"] == 0.5 and t["frozen_frac"] == 0.5
    assert db.sql("SELECT count(*) FROM episode_quality WHERE list_contains(reasons, 'velocity_spike')").fetchall() \
        == [(20,)]
    with pytest.raises(TypeError, match="no quality threshold 'spike'"):
        db.quality_thresholds(spike=1)
    with pytest.raises(ValueError, match="finite number"):
        db.quality_thresholds(spike_z=float("nan"))


def test_facts_are_cached_and_read_again_when_a_data_file_changes(datasets, tmp_path):
    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    q = "SELECT verdict FROM episode_quality WHERE episode_index = 4"
    assert lsql.connect(root, cache_dir=tmp_path / "c").sql(q).fetchall() == [("pass",)]
    assert list((tmp_path / "c").rglob("episode_facts-*.parquet"))
    _rewrite(root / DATA, lambda c: c["action"].__setitem__((400, 0), np.inf))  # a row of episode 1
    got = dict(lsql.connect(root, cache_dir=tmp_path / "c").sql(
        "SELECT episode_index, verdict FROM episode_quality WHERE verdict <> 'pass'").fetchall())
    assert got == {1: "exclude"}


def test_a_collection_has_each_datasets_verdicts(datasets, tmp_path):
    coll = lsql.connect_many([datasets / "small20", datasets / "h264_20"], cache_dir=tmp_path)
    assert coll.sql("SELECT dataset, verdict, count(*) FROM episode_quality GROUP BY ALL ORDER BY 1").fetchall() == \
        [("h264_20", "pass", 20), ("small20", "pass", 20)]


def test_doctor_episodes_prints_the_worst_and_exits_1_on_exclude(injected, tmp_path):
    from helpers import run_cli

    r = run_cli("doctor", injected, "--episodes", "--worst", "3", "--cache-dir", tmp_path)
    assert r.returncode == 1, r.stderr
    assert "20 episode(s): 13 pass, 3 review, 4 exclude" in r.stdout, r.stdout
    assert r.stdout.count("    episode ") == 3 and "episode 0: exclude" in r.stdout
    r = run_cli("doctor", injected, "--episodes", "--json", "--threshold", "frozen_frac=1", "--cache-dir", tmp_path)
    out = json.loads(r.stdout)
    assert out["counts"] == {"exclude": 4, "pass": 13, "review": 3} and out["thresholds"]["frozen_frac"] == 1.0
    r = run_cli("doctor", injected, "--episodes", "--threshold", "frozen", "--cache-dir", tmp_path)
    assert r.returncode == 2 and "NAME=NUMBER" in r.stderr


def test_every_task_of_an_episodes_rows_is_checked_and_rows_out_of_place_are_excluded(datasets, tmp_path):
    """Hostile review 20: a task_index between an episode's smallest and largest that the tasks table lacks passed
    (only the two ends were checked), and an episode's last row swapped with the next episode's first passed for
    both (differences were taken within stretches only)."""
    root = tmp_path / "s"
    shutil.copytree(datasets / "small20", root)
    eps = pq.read_table(root / EPISODES).to_pydict()
    rng = {e: (a, b) for e, a, b in zip(eps["episode_index"], eps["dataset_from_index"], eps["dataset_to_index"])}
    n_tasks = pq.read_table(root / "meta/tasks.parquet").num_rows

    def data(c):
        lo, hi = rng[1]
        c["task_index"][lo:hi] = 0
        c["task_index"][lo + 5] = n_tasks + 7  # in no task row
        c["task_index"][hi - 1] = 1
        lo, hi = rng[3][1] - 1, rng[4][0]  # the last row of episode 3 and the first of episode 4
        for k in c:
            c[k][[lo, hi]] = c[k][[hi, lo]]

    _rewrite(root / DATA, data)
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    got = {e: set(r) for e, r in db.sql("SELECT episode_index, reasons FROM episode_quality WHERE verdict <> 'pass'")
           .fetchall()}
    assert "task_missing" in got[1] and {"row_order"} <= got[3] and {"row_order"} <= got[4], got


def test_nonfinite_features_are_named_past_62_features(datasets, tmp_path):
    """Hostile review 20: the names came from one int64 bitmask; a NaN in the 71st numeric feature named twelve."""
    root = tmp_path / "wide"
    shutil.copytree(datasets / "small20", root)
    t = pq.read_table(root / DATA)
    info = json.loads((root / "meta/info.json").read_text())
    for j in range(70):
        values = np.zeros(t.num_rows, np.float32)
        if j == 68:
            values[500] = np.nan
        t = t.append_column(f"f{j}", pa.array(values))
        info["features"][f"f{j}"] = {"dtype": "float32", "shape": [1], "names": None}
    pq.write_table(t, root / DATA)
    (root / "meta/info.json").write_text(json.dumps(info))
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    row = db.sql("SELECT episode_index, nonfinite_features FROM episode_quality WHERE nonfinite_values > 0")
    assert row.fetchall() == [(1, ["f68"])]
