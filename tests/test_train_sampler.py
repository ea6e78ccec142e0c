"""The samplers ``lerobot-sql train`` puts in place of lerobot's ``EpisodeAwareSampler``
(lerobot_sql.torch.train_sampler), without lerobot: lerobot 0.4.4's sampler is written out here, and the mixture
sampler is driven as lerobot's scripts drive it (0.4: built, iterated; 0.6: built, ``load_state_dict``, iterated).
"""

from __future__ import annotations

import json
import logging
import types

import numpy as np
import pytest


class _Lerobot044Sampler:
    """lerobot 0.4.4's EpisodeAwareSampler (lerobot/datasets/sampler.py), written out for the tier without lerobot."""

    def __init__(self, dataset_from_indices, dataset_to_indices, episode_indices_to_use=None,
                 drop_n_first_frames=0, drop_n_last_frames=0, shuffle=False):
        self.indices = []
        for episode_idx, (start, end) in enumerate(zip(dataset_from_indices, dataset_to_indices, strict=True)):
            if episode_indices_to_use is None or episode_idx in episode_indices_to_use:
                self.indices.extend(range(start + drop_n_first_frames, end - drop_n_last_frames))
        self.shuffle = shuffle

    def __iter__(self):
        return iter(self.indices)


def test_the_train_sampler_drops_by_episode_ends_not_by_runs(sample, tmp_path):
    """A strided selection is one run per sample: lerobot's sampler over meta.episodes would drop every sample for
    drop_n_last_frames=3. lerobot-sql train's sampler keeps lerobot's rule by the episode: every selected frame at
    least 3 frames before its episode's end."""
    import lerobot_sql as lsql
    from lerobot_sql.errors import TrainSetupError
    from lerobot_sql.torch.train_sampler import keep_positions, sampler_class

    db = lsql.connect(sample, cache_dir=tmp_path)
    length = db.sql("SELECT length FROM episodes WHERE episode_index = 2").fetchall()[0][0]
    ds = db.dataset("SELECT index FROM frames WHERE episode_index = 2 AND frame_index % 2 = 0", cameras=[])
    eps = ds.meta.episodes
    assert len(_Lerobot044Sampler(eps["dataset_from_index"], eps["dataset_to_index"], None, 0, 3).indices) == 0
    S = sampler_class(_Lerobot044Sampler, lambda: ds)
    got = list(S(eps["dataset_from_index"], eps["dataset_to_index"], ds.episodes, 1, 3))
    frames = [int(ds[i]["frame_index"]) for i in got]
    assert frames == [f for f in range(0, length, 2) if 1 <= f < length - 3]
    with pytest.raises(TrainSetupError, match="leaves none"):
        keep_positions(ds.manifest, 0, length)


@pytest.fixture(scope="module")
def mix(datasets, tmp_path_factory):
    """A collection dataset of two shipped sets: small20's episodes 0-1 and h264_20's episode 0 (no cameras)."""
    import lerobot_sql as lsql

    coll = lsql.connect_many([datasets / "small20", datasets / "h264_20"], cache_dir=tmp_path_factory.mktemp("c"))
    return coll.dataset("SELECT dataset, episode_index FROM episodes WHERE (dataset = 'small20' AND episode_index < 2)"
                        " OR (dataset = 'h264_20' AND episode_index = 0)", cameras=[])


def _mixture(ds, cfg=None, **kw):
    from lerobot_sql.torch.train_sampler import mixture_sampler_class

    return mixture_sampler_class(lambda: ds, cfg_of=lambda: cfg, **{"weights": {"small20": 0.7, "h264_20": 0.3},
                                                                    **kw})


def test_the_mixture_sampler_draws_the_weights_exactly_per_epoch_and_advances_the_epoch(mix, caplog):
    """Each iter() is the next epoch (lerobot 0.6's rule; 0.4 cycles the DataLoader, which iterates again): a
    different order, each drawing the datasets in exactly the quotas the weights give, over the selection's samples
    only, and logging the quotas and what it drew."""
    S = _mixture(mix)(mix.meta.episodes["dataset_from_index"], mix.meta.episodes["dataset_to_index"], None, 0, 0,
                      shuffle=True, seed=3)
    n = len(mix)
    assert len(S) == n
    with caplog.at_level(logging.INFO, logger="lerobot_sql.train"):
        a, b = list(S), list(S)
    assert a != b and len(a) == len(b) == n
    for order in (a, b):
        codes = mix.dataset_index[np.asarray(order)]
        assert abs(int((codes == 0).sum()) - 0.7 * n) <= 1 and int((codes == 0).sum()) + int((codes == 1).sum()) == n
    text = caplog.text
    q0 = round(0.7 * n)
    assert f"epoch 0 from draw 0 of {n}; quotas small20={q0} (0.700)" in text, text
    assert f"epoch 1 drew {n}: small20={q0}" in text, text


def test_the_mixture_sampler_keeps_lerobots_per_episode_drop_rule(mix):
    """drop_n_last_frames (diffusion's) and drop_n_first_frames leave out the frames at each episode's ends, as
    lerobot's sampler does: no drawn sample is within them, and the epoch is the kept samples' count."""
    S = _mixture(mix, weights=None, alpha=0.0)(None, None, None, 2, 7, shuffle=True, seed=0)
    m = mix.manifest
    pos = m["index"].to_numpy() - m["ep_from_index"].to_numpy()
    length = m["ep_to_index"].to_numpy() - m["ep_from_index"].to_numpy()
    kept = np.flatnonzero((pos >= 2) & (pos < length - 7))
    assert len(S) == len(kept) == len(mix) - 3 * 9
    drawn = np.asarray(list(S))
    assert set(drawn.tolist()) <= set(kept.tolist())
    codes = mix.dataset_index[drawn]
    assert abs(int((codes == 0).sum()) - len(kept) / 2) <= 1  # alpha=0: equal shares


def test_a_resumed_mixture_goes_on_with_the_same_order_on_both_lerobot_versions(mix, tmp_path):
    """lerobot 0.6 calls load_state_dict({"epoch", "start_index"}) with its compute_sampler_state; lerobot 0.4 does
    not, so the sampler positions itself at the checkpoint's step (training_state/training_step.json). Either way
    the draws are the uninterrupted run's from that point on."""
    from lerobot_sql.errors import TrainSetupError
    from lerobot_sql.torch.train_sampler import resume_state

    cls = _mixture(mix)
    whole = cls(None, None, seed=5)
    first, second, third = list(whole), list(whole), list(whole)
    n = len(first)
    resumed = cls(None, None, seed=5)  # 0.6
    resumed.load_state_dict({"epoch": 1, "start_index": 96})
    assert list(resumed) == second[96:] and list(resumed) == third  # then the next epoch, whole
    # through accelerate, which calls set_epoch(its pass count, from 0 in every process) before each pass
    assert _accelerated(cls(None, None, seed=5), 2) == [first, second]
    resumed = cls(None, None, seed=5)
    resumed.load_state_dict({"epoch": 1, "start_index": 96})
    assert _accelerated(resumed, 2) == [second[96:], third]
    ckpt = tmp_path / "checkpoints" / "000040"
    (ckpt / "training_state").mkdir(parents=True)
    (ckpt / "training_state" / "training_step.json").write_text(json.dumps({"step": 40}))
    cfg = types.SimpleNamespace(seed=5, resume=True, checkpoint_path=str(ckpt), batch_size=8)
    per_epoch = -(-n // 8)
    state = resume_state(cfg, n)
    assert state == {"epoch": 40 // per_epoch, "start_index": (40 % per_epoch) * 8}
    S04 = _mixture(mix, cfg=cfg, resume_on_init=True)(None, None)  # 0.4: no seed passed, the config's
    got = list(S04)
    assert got == (first if state["epoch"] == 0 else second)[state["start_index"]:]
    (ckpt / "training_state" / "training_step.json").write_text("{}")
    with pytest.raises(TrainSetupError, match="no training step"):
        resume_state(cfg, n)


def _accelerated(sampler, passes: int) -> list[list[int]]:
    """``passes`` passes over ``sampler`` as accelerate's DataLoaderShard makes them: ``set_epoch(k)`` before pass
    ``k``, ``k`` counted from 0 in this process (a resumed run's too)."""
    out = []
    for k in range(passes):
        sampler.set_epoch(k)
        out.append(list(sampler))
    return out


def test_the_mixture_sampler_refuses_a_state_outside_its_epoch(mix):
    S = _mixture(mix)(None, None, seed=0)
    with pytest.raises(ValueError, match="outside an epoch"):
        S.load_state_dict({"epoch": 0, "start_index": len(S) + 1})


# ---- sample weights from a column (--weights COLUMN, issue 39) -------------------------------------------------------
W_SQL = ("SELECT episode_index, CASE episode_index WHEN 0 THEN 3.0 WHEN 1 THEN 1.0 ELSE 0.0 END AS weight "
         "FROM episodes WHERE episode_index < 3")


@pytest.fixture(scope="module")
def weighted(sample, tmp_path_factory):
    """small20's episodes 0-2 weighing 3, 1 and 0 (no cameras)."""
    import lerobot_sql as lsql

    return lsql.connect(sample, cache_dir=tmp_path_factory.mktemp("w")).dataset(W_SQL, cameras=[])


def _kept(ds, first=0, last=0):
    m = ds.manifest
    pos = m["index"].to_numpy() - m["ep_from_index"].to_numpy()
    length = m["ep_to_index"].to_numpy() - m["ep_from_index"].to_numpy()
    return np.flatnonzero((pos >= first) & (pos < length - last))


def test_the_weighted_train_sampler_draws_by_the_column_and_keeps_the_drop_rule(weighted, caplog):
    """lerobot-sql train --weights COLUMN on one dataset: built as lerobot 0.4 builds its sampler (diffusion's
    drop_n_last_frames), each epoch draws every kept sample floor or ceil of n * w / sum(w) times (weight 0:
    never), no dropped frame, a new order per iter(); the log gives the draws' mean weight and its expected value."""
    from lerobot_sql.torch.train_sampler import mixture_sampler_class

    S = mixture_sampler_class(lambda: weighted, sample_weights="weight")
    assert S.__name__ == "WeightedTrainSampler"
    s = S([0], [1], None, 1, 7, shuffle=True, seed=3)
    kept = _kept(weighted, 1, 7)
    w = weighted.manifest["weight"].to_numpy()
    assert len(s) == len(kept)
    with caplog.at_level(logging.INFO, logger="lerobot_sql.train"):
        a, b = list(s), list(s)
    assert a != b
    e = len(kept) * w[kept] / w[kept].sum()
    for order in (a, b):
        assert len(order) == len(kept) and set(order) <= set(kept.tolist())
        count = np.bincount(order, minlength=len(weighted))[kept]
        assert np.abs(count - e).max() < 1 and count[w[kept] == 0].sum() == 0
    mean = (e * w[kept]).sum() / e.sum()
    drawn = w[np.asarray(a)].mean()
    assert f"weighted sampler: epoch 0 from draw 0 of {len(kept)}; weights 'weight': mean weight expected " \
           f"{mean:.4g} (unweighted {w[kept].mean():.4g})" in caplog.text, caplog.text
    assert f"weighted sampler: epoch 0 drew {len(kept)}: mean weight {drawn:.4g} (expected {mean:.4g})" \
        in caplog.text, caplog.text
    assert abs(drawn - mean) < 3 / len(kept)  # exact counts: only the rounding of each sample's draws


def test_a_resumed_weighted_run_goes_on_with_the_same_order_on_both_lerobot_versions(weighted, tmp_path):
    from lerobot_sql.torch.train_sampler import mixture_sampler_class, resume_state

    cls = mixture_sampler_class(lambda: weighted, sample_weights="weight")
    whole = cls(None, None, seed=5)
    first, second = list(whole), list(whole)
    resumed = cls(None, None, seed=5)  # 0.6
    resumed.load_state_dict({"epoch": 1, "start_index": 100})
    assert _accelerated(resumed, 2)[0] == second[100:]  # accelerate's set_epoch(0) keeps the resumed epoch
    # 0.4: positioned from the checkpoint's step, 3 steps into the second epoch (batch 8)
    step = -(-len(first) // 8) + 3
    ckpt = tmp_path / "checkpoints" / f"{step:06d}"
    (ckpt / "training_state").mkdir(parents=True)
    (ckpt / "training_state" / "training_step.json").write_text(json.dumps({"step": step}))
    cfg = types.SimpleNamespace(seed=5, resume=True, checkpoint_path=str(ckpt), batch_size=8)
    assert resume_state(cfg, len(first)) == {"epoch": 1, "start_index": 24}
    got = _accelerated(mixture_sampler_class(lambda: weighted, sample_weights="weight", cfg_of=lambda: cfg,
                                             resume_on_init=True)(None, None), 1)[0]
    assert got == second[24:]


def test_the_weighted_train_sampler_over_a_collection_global_or_within_shares(datasets, tmp_path, caplog):
    """Over several datasets: --weights COLUMN alone compares the weights across datasets (each dataset's share
    is its weights' sum); with shares (--weights NAME=W or --alpha) each dataset gets its quota and the column
    weighs within it."""
    import lerobot_sql as lsql
    from lerobot_sql.torch.train_sampler import mixture_sampler_class

    coll = lsql.connect_many([datasets / "small20", datasets / "h264_20"], cache_dir=tmp_path)
    ds = coll.dataset("SELECT dataset, episode_index, CASE WHEN dataset = 'small20' THEN 3.0 ELSE 1.0 END AS weight "
                      "FROM episodes WHERE episode_index = 0", cameras=[])
    w = ds.manifest["weight"].to_numpy()
    code = np.asarray(ds.dataset_index)
    with caplog.at_level(logging.INFO, logger="lerobot_sql.train"):
        g = list(mixture_sampler_class(lambda: ds, sample_weights="weight")(None, None, seed=1))
    share = w[code == 0].sum() / w.sum()
    assert abs(int((code[np.asarray(g)] == 0).sum()) - share * len(ds)) < 1  # floor or ceil of its share
    assert f"expected shares small20={share:.3f}" in caplog.text, caplog.text
    mix = mixture_sampler_class(lambda: ds, weights={"small20": 0.5, "h264_20": 0.5}, sample_weights="weight")
    assert mix.__name__ == "MixtureTrainSampler"
    m = list(mix(None, None, seed=1))
    assert abs(int((code[np.asarray(m)] == 0).sum()) - len(ds) / 2) <= 1


def test_weights_the_kept_samples_cannot_honour_are_refused_naming_the_drop_rule(sample, tmp_path):
    """Weight only on each episode's first 5 frames (a per-frame weight from an `index` query), and a policy
    dropping the first 5 frames: every kept sample weighs 0. Refused when lerobot's script builds the sampler, naming
    the drop rule; without the rule the same weights draw only those frames."""
    import lerobot_sql as lsql
    from lerobot_sql.errors import TrainSetupError
    from lerobot_sql.torch.train_sampler import mixture_sampler_class

    ds = lsql.connect(sample, cache_dir=tmp_path).dataset(
        "SELECT index, CASE WHEN frame_index < 5 THEN 1.0 ELSE 0.0 END AS weight FROM frames WHERE episode_index < 2",
        cameras=[])
    S = mixture_sampler_class(lambda: ds, sample_weights="weight")
    with pytest.raises(TrainSetupError, match=r"drop_n_first_frames=5 / drop_n_last_frames=0 keep: .*every weight of "
                                              r"the \d+ samples is 0"):
        S(None, None, None, 5, 0)
    drawn = {int(ds[i]["frame_index"]) for i in S(None, None, None, 0, 0)}
    assert drawn == set(range(5))
