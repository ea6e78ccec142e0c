"""The per-episode facts of the data files (lerobot_sql._readers.episode_facts) against a plain per-episode
computation with pandas/numpy, and the same whatever the span a file is read in (the stretch of an episode carried
across spans)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql._readers import episode_facts


def _expected(root, fps: float) -> dict[int, dict]:
    """Each episode's facts computed directly: its rows (in file order, files in order) as numpy."""
    out = {}
    files = sorted(root.glob("data/*/*.parquet"))
    for f in files:
        t = pq.read_table(f).to_pandas()
        for ep, g in t.groupby("episode_index", sort=False):
            s = np.stack(g["observation.state"].to_numpy()).astype(np.float64)
            ds = np.diff(s, axis=0)
            j3 = s[3:] - 3 * s[2:-1] + 3 * s[1:-2] - s[:-3]
            fi = g["frame_index"].to_numpy()
            out[int(ep)] = {"rows": len(g), "frozen_state_frames": int((ds == 0).all(axis=1).sum()),
                            "state_speed": float(np.mean(np.sqrt((ds * ds).sum(axis=1)) * fps)),
                            "vel_max": np.abs(ds).max(axis=0), "vel_sq": (ds * ds).sum(axis=0),
                            "jerk_max": np.abs(j3).max(axis=0), "jerk_n": len(j3),
                            "timestamp_drift_s": float(np.max(np.abs(g["timestamp"].to_numpy() - fi / fps))),
                            "repeated_frames": int((np.diff(fi) == 0).sum())}
    return out


@pytest.mark.parametrize("name", ["small20", "multifile60"])
def test_facts_equal_a_direct_per_episode_computation(datasets, name, monkeypatch):
    db = lsql.connect(datasets / name)
    v = episode_facts.vectors_of(db.layout, None)
    assert v.state == "observation.state" and v.gripper == ("observation.state", 5)
    want = _expected(datasets / name, float(db.layout.info["fps"]))
    for span in (episode_facts.SPAN_ROWS, 97):  # 97: every episode crosses spans
        monkeypatch.setattr(episode_facts, "SPAN_ROWS", span)
        got = episode_facts.episode_facts(db.source, db.layout, v).to_pylist()
        assert [g["episode_index"] for g in got] == sorted(want)
        for g in got:
            w = want[g["episode_index"]]
            assert g["rows"] == w["rows"] and g["frozen_state_frames"] == w["frozen_state_frames"]
            assert g["repeated_frames"] == w["repeated_frames"] == 0 and g["jerk_n"] == w["jerk_n"]
            assert g["state_speed"] == pytest.approx(w["state_speed"], rel=1e-12)
            np.testing.assert_array_equal(g["vel_max"], w["vel_max"])
            np.testing.assert_array_equal(g["jerk_max"], w["jerk_max"])
            np.testing.assert_allclose(g["vel_sq"], w["vel_sq"], rtol=1e-12)
            assert g["timestamp_drift_s"] == pytest.approx(w["timestamp_drift_s"], abs=1e-12)


def test_the_gripper_is_found_by_name_in_nested_names():
    """info.json `names` as a list, a one-axis nested list ([[...]], as some writers give) or a dict of lists."""
    for names in (["a", "gripper.pos"], [["a", "Gripper"]], {"motors": ["a", "gripper"]}):
        assert episode_facts._element_names(names)[1].lower().startswith("gripper")
    assert episode_facts._element_names("gripper") == [] and episode_facts._element_names(None) == []
