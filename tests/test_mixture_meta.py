"""``ds.meta`` of a collection dataset (lerobot_sql.torch.mixture_meta): what lerobot's training code reads of a
dataset's metadata, for a selection across datasets, checked against each dataset's own."""

from __future__ import annotations

import numpy as np
import pytest

RENAME = {"top20": {"observation.images.top": "observation.images.front"}}
SQL = ("SELECT dataset, episode_index FROM episodes WHERE (dataset = 'small20' AND episode_index IN (1, 4)) "
       "OR (dataset = 'top20' AND episode_index = 2)")


@pytest.fixture(scope="module")
def coll(datasets, tmp_path_factory):
    """small20 and a copy of h264_20 whose front camera is named observation.images.top."""
    import lerobot_sql as lsql
    from helpers import renamed_copy

    top = renamed_copy(datasets / "h264_20", tmp_path_factory.mktemp("ren") / "top20",
                       {"observation.images.front": "observation.images.top"})
    return lsql.connect_many([datasets / "small20", top], cache_dir=tmp_path_factory.mktemp("c"))


def test_a_collection_datasets_meta_is_its_parts_lined_up(coll):
    """features as items name them (renamed), in the first dataset's order; one fps (also as info.fps, lerobot
    0.6's form); one meta.episodes row per episode run with the dataset and positions in the collection dataset;
    statistics combined by lerobot's aggregate_stats rule; totals over the datasets."""
    ds = coll.dataset(SQL, rename=RENAME, stats="dataset")
    m = ds.meta
    one = coll["small20"].dataset("SELECT episode_index FROM episodes WHERE episode_index IN (1, 4)",
                                  stats="dataset").meta
    assert list(m.features) == list(one.features) and m.features == one.features
    assert m.camera_keys == ["observation.images.front", "observation.images.wrist"] == ds.camera_keys
    assert m.fps == m.info.fps == m.info["fps"] == ds.fps == 30
    lengths = dict(((d, e), n) for d, e, n in coll.sql(
        f"SELECT dataset, episode_index, length FROM episodes WHERE (dataset, episode_index) IN "
        f"(SELECT (dataset, episode_index) FROM ({SQL}))").fetchall())
    eps = m.episodes.to_pandas()
    assert list(zip(eps["dataset"], eps["episode_index"])) == [("small20", 1), ("small20", 4), ("top20", 2)]
    assert eps["length"].tolist() == [lengths[("small20", 1)], lengths[("small20", 4)], lengths[("top20", 2)]]
    assert eps["dataset_from_index"].tolist() == [0, *np.cumsum(eps["length"])[:-1].tolist()]
    assert eps["dataset_to_index"].iloc[-1] == len(ds) == m.total_frames == ds.num_frames
    assert m.total_episodes == ds.num_episodes == 3
    parts = {"small20": ds.parts["small20"].meta.stats, "top20": ds.parts["top20"].meta.stats}
    for key in ("observation.state", "action", "observation.images.front"):
        a = parts["small20"][key]
        b = parts["top20"]["observation.images.top" if key == "observation.images.front" else key]
        got = m.stats[key]
        np.testing.assert_array_equal(got["min"], np.minimum(a["min"], b["min"]))
        np.testing.assert_array_equal(got["max"], np.maximum(a["max"], b["max"]))
        assert int(got["count"][0]) == int(a["count"][0]) + int(b["count"][0])
        w = np.asarray(a["count"], np.float64)[0], np.asarray(b["count"], np.float64)[0]
        np.testing.assert_allclose(got["mean"], (a["mean"] * w[0] + b["mean"] * w[1]) / sum(w), rtol=1e-12)
    assert "observation.images.top" not in m.stats and "observation.images.top" not in m.features
    texts = set(coll["small20"].sql("SELECT task FROM tasks").fetchall()) | set(
        coll["top20"].sql("SELECT task FROM tasks").fetchall())
    assert set(m.tasks.index) == {t for (t,) in texts} and m.total_tasks == len(texts)
    assert ds.repo_id == m.repo_id == "small20+top20"


@pytest.mark.parametrize("stats", ["dataset", "selection"])
def test_a_collection_of_one_dataset_has_that_datasets_meta(coll, stats):
    """One selected dataset: features, stats (bit for bit), episodes and repo_id are that dataset's own, so lerobot
    builds the same policy and normalization as on the single-dataset command."""
    ds = coll.dataset("SELECT dataset, episode_index FROM episodes WHERE dataset = 'small20' AND episode_index < 3",
                      stats=stats)
    one = coll["small20"].dataset("SELECT episode_index FROM episodes WHERE episode_index < 3", stats=stats)
    assert ds.meta.features == one.meta.features and ds.repo_id == one.repo_id == ds.meta.repo_id
    assert ds.meta.stats.keys() == one.meta.stats.keys()
    for k, st in one.meta.stats.items():
        for s, v in st.items():
            got = ds.meta.stats[k][s]
            assert got.dtype == v.dtype and np.array_equal(got, v), (k, s)
    a, b = ds.meta.episodes.to_pandas(), one.meta.episodes.to_pandas()
    for col in ("episode_index", "length", "dataset_from_index", "dataset_to_index"):
        assert a[col].tolist() == b[col].tolist()


def test_several_fps_are_refused_where_fps_is_read(coll):
    """Datasets of 30 and 15 fps: a policy's frame offsets would be different times in each, so reading meta.fps
    raises naming both (info.fps is None: no one value); the rest of meta still answers."""
    import lerobot_sql as lsql

    ds = coll.dataset(SQL, rename=RENAME, cameras=[])
    ds.parts["top20"].meta.info["fps"] = 15  # as a 15 fps dataset's meta would say
    with pytest.raises(lsql.DatasetFormatError, match="different fps.*small20: 30.*top20: 15"):
        _ = ds.meta.fps
    assert ds.meta.info.fps is None and ds.meta.total_frames == len(ds)
