"""lerobot_sql.display: the plotted lines are the Parquet values, grid cells are the right frames (framecode), and
show_item's images decode back to the item's pixels."""

from __future__ import annotations

import base64
import io
import json
import re
import sys

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image

import lerobot_sql as lsql
from lerobot_sql import display
from lerobot_sql.errors import QueryError

matplotlib = pytest.importorskip("matplotlib", reason="matplotlib is in the test-slow extra: pip install -e '.[test-slow]'")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers import SAMPLE  # noqa: E402

CAMS = ["observation.images.front", "observation.images.wrist"]


@pytest.fixture(scope="module")
def db():
    with lsql.connect(SAMPLE) as d:
        yield d


@pytest.fixture(scope="module")
def episode3():
    t = pq.read_table(SAMPLE / "data" / "chunk-000" / "file-000.parquet")
    return t.filter(pc.equal(t["episode_index"], 3)).sort_by("frame_index")


@pytest.fixture(scope="module")
def info():
    return json.loads((SAMPLE / "meta" / "info.json").read_text())


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _vectors(col) -> np.ndarray:
    return np.stack(col.to_numpy(zero_copy_only=False)).astype(np.float64)


def test_episode_frame_reads_the_episode_rows(db, episode3):
    ts, values = display.episode_frame(db, 3, ["observation.state", "action"])
    np.testing.assert_array_equal(ts, episode3["timestamp"].to_numpy().astype(np.float64))
    np.testing.assert_array_equal(values["action"], _vectors(episode3["action"]))
    np.testing.assert_array_equal(values["observation.state"], _vectors(episode3["observation.state"]))


def test_plot_episode_one_row_per_feature_one_line_per_joint(db, episode3, info):
    tasks = pq.read_table(SAMPLE / "meta" / "tasks.parquet").to_pandas()
    axes = display.plot_episode(db, 3)  # default: every numeric non-camera feature
    assert [a.get_ylabel() for a in axes] == ["observation.state", "action"]
    for a, feature in zip(axes, ["observation.state", "action"]):
        lines = a.get_lines()
        assert [ln.get_label() for ln in lines] == info["features"][feature]["names"]
        np.testing.assert_array_equal(np.stack([ln.get_ydata() for ln in lines], 1), _vectors(episode3[feature]))
        np.testing.assert_array_equal(lines[0].get_xdata(), episode3["timestamp"].to_numpy())
    assert axes[-1].get_xlabel() == "timestamp (s)"
    task_texts = set(tasks.index if "task" not in tasks else tasks["task"])
    task_of_3 = [t for t in task_texts if t in axes[0].get_title()]
    assert axes[0].get_title().startswith("episode 3") and len(task_of_3) == 1


def test_plot_episode_on_given_axes(db):
    fig, ax = plt.subplots()
    assert display.plot_episode(db, 0, ["observation.state", "action"], ax=ax) == [ax, ax]
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert len(labels) == 12 and labels[0] == "observation.state shoulder_pan.pos"
    with pytest.raises(ValueError, match="one Axes per feature"):
        display.plot_episode(db, 0, ["observation.state", "action"], ax=[ax])


@pytest.mark.parametrize("kwargs, match", [
    ({"episode_index": 0, "features": ["actoin"]}, "Did you mean 'action'"),
    ({"episode_index": 0, "features": ["observation.images.front"]}, "frame_grid"),
    ({"episode_index": 999, "features": ["action"]}, "episode_index 999 has no frames"),
])
def test_plot_episode_errors(db, kwargs, match):
    with pytest.raises(QueryError, match=match):
        display.plot_episode(db, **kwargs)


def test_missing_matplotlib_gives_an_install_hint(db, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"lerobot_sql\[notebook\]"):
        display.plot_episode(db, 0, "action")


def test_frame_grid_shows_the_right_frames(db, framecode):
    ds = db.dataset("SELECT episode_index, 1.0 AS start_s, 2.0 AS end_s FROM episodes WHERE episode_index = 2",
                    return_uint8=True, delta_timestamps={"observation.images.front": [-1 / 30, 0.0]})
    fig = display.frame_grid(ds, indices=[0, 10, 29])
    axes = np.array(fig.axes).reshape(3, 3)  # rows: items; columns: front t-1, front t, wrist
    for r, i in enumerate([0, 10, 29]):
        item = ds[i]
        f = int(item["frame_index"])
        assert axes[r, 0].get_ylabel() == f"ep 2 frame {f} t {float(item['timestamp']):.2f}s"
        for c, (cam, frame) in enumerate([(CAMS[0], f - 1), (CAMS[0], f), (CAMS[1], f)]):
            shown = axes[r, c].get_images()[0].get_array()
            assert framecode.verify_frame(np.asarray(shown), 2, frame, cam)["ok"], (i, cam, frame)
    assert [a.get_title() for a in axes[0]] == ["front [0]", "front [1]", "wrist"]


def test_frame_grid_errors(db):
    item = {"observation.state": np.zeros(6)}
    with pytest.raises(ValueError, match="no camera frames"):
        display.frame_grid(item)
    ds = db.dataset("SELECT index FROM frames WHERE index = 0")
    with pytest.raises(KeyError, match="observation.images.front"):
        display.frame_grid(ds, keys="observation.images.side")


def test_show_item_table_and_images(db):
    ds = db.dataset("SELECT index FROM frames WHERE index = 100", return_uint8=True,
                    delta_timestamps={"observation.images.wrist": [-2 / 30, 0.0]})
    item = ds[0]
    view = display.show_item(item)
    text = repr(view).splitlines()
    assert text[0].split() == ["key", "dtype", "shape", "value"]
    assert len(text) == 1 + len(item)
    row = {ln.split()[0]: ln for ln in text[1:]}
    assert row["index"].split()[1:] == ["int64", "()", "100"]
    assert row["task"].endswith(item["task"])
    html = view._repr_html_()
    pngs = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
    assert len(pngs) == 1 + 2  # front (one frame) + wrist (two frames)
    decoded = [np.asarray(Image.open(io.BytesIO(base64.b64decode(p)))) for p in pngs]
    np.testing.assert_array_equal(decoded[0], item[CAMS[0]].permute(1, 2, 0).numpy())
    np.testing.assert_array_equal(decoded[2], item[CAMS[1]][1].permute(1, 2, 0).numpy())
