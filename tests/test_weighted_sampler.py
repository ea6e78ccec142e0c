"""WeightedSampler, and MixtureSampler's sample_weights: samples drawn in proportion to a column of the selection
(a weight per episode or window reaches every sample of it), exact per-epoch counts, deterministic per (seed, epoch),
resumable, one global order sliced per rank; the refusals of bad weights.

Tolerances. The sampler gives each epoch exact counts (randomized systematic sampling), so the epoch's draws of a
sample of weight ``w_i`` are floor or ceil of ``e_i = T * w_i / sum(w)`` with ``block_size=1`` (within 1) and
fewer than 2 away with blocks; an episode's draws, and a dataset's, are floor or ceil of their expected counts
(within 1). For comparison, ``T`` i.i.d. draws (``WeightedRandomSampler``) would give an episode of probability ``p`` a
binomial count with sigma ``sqrt(T p (1 - p))``, about 90 draws at T = 100k, p = 0.1; the checks below also hold
that bound (4 sigma), and a rank's slice of ``n`` draws (a random part of the shuffled epoch: hypergeometric, at
most the binomial variance, times ``block_size`` for draws that come in blocks) within ``4 * sqrt(B n p (1 - p))``.
Over many epochs each sample's mean count is its ``e_i``: a sample with fractional part ``f`` of ``e_i`` gets
floor or ceil each epoch, a Bernoulli(f) excess, so the mean of ``K`` epochs is within ``5 * sqrt(f (1 - f) / K)``
(but for a ~6e-7 chance per sample; the seeds are fixed, so a pass is deterministic).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import lerobot_sql as lsql
from lerobot_sql.torch.samplers import MixtureSampler, WeightedSampler

# a weight per episode of small20's first 8, one of them 0 (never drawn)
W_EP = {0: 0.0, 1: 0.5, 2: 1.0, 3: 2.0, 4: 4.0, 5: 1.0, 6: 0.25, 7: 3.0}
CASE = "CASE episode_index " + " ".join(f"WHEN {e} THEN {w}" for e, w in W_EP.items()) + " END"
SQL = f"SELECT episode_index, {CASE} AS weight FROM episodes WHERE episode_index < 8"


@pytest.fixture(scope="module")
def db(datasets):
    return lsql.connect(datasets / "small20")


@pytest.fixture(scope="module")
def ds(db):
    return db.dataset(SQL, cameras=[])


def _ep(ds) -> np.ndarray:
    return ds.manifest["episode_index"].to_numpy()


def _expected(ds, total: int) -> np.ndarray:
    """Each sample's expected draws, from W_EP and the manifest's episodes (not from the sampler)."""
    w = np.array([W_EP[e] for e in _ep(ds)])
    return total * w / w.sum()


def test_a_weight_column_reaches_every_sample_of_its_row_in_items_and_batches(db, ds):
    """The result's extra column is on every sample of the row's episode (or window), in the manifest, each item
    (a 0-d tensor of the column's dtype: DOUBLE float64, FLOAT float32) and each DataLoader batch."""
    ep = _ep(ds)
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes WHERE episode_index < 8").fetchall())
    assert len(ds) == sum(lengths.values())
    assert ds.manifest["weight"].to_pylist() == [W_EP[e] for e in ep]
    for i in (0, len(ds) // 2, len(ds) - 1):
        item = ds[i]
        assert item["weight"].dtype == torch.float64 and item["weight"].ndim == 0
        assert float(item["weight"]) == W_EP[int(item["episode_index"])]
    batch = next(iter(DataLoader(ds, batch_size=64, shuffle=False)))
    assert batch["weight"].dtype == torch.float64 and batch["weight"].shape == (64,)
    assert batch["weight"].tolist() == [W_EP[int(e)] for e in batch["episode_index"]]
    # windows: every frame of the window carries the window's row's weight; FLOAT gives float32
    win = db.dataset("SELECT episode_index, 1.0 AS start_s, 2.0 AS end_s, CAST(episode_index * 0.5 AS FLOAT) AS w "
                     "FROM episodes WHERE episode_index < 3", cameras=[])
    fps = db.sql("SELECT fps FROM info").fetchall()[0][0]
    assert len(win) == 3 * round(fps)
    assert win.manifest["w"].to_pylist() == [e * 0.5 for e in _ep(win)]
    assert win[len(win) - 1]["w"].dtype == torch.float32 and float(win[len(win) - 1]["w"]) == 1.0


@pytest.mark.parametrize("block_size", [1, 8])
def test_frequencies_over_100k_draws_match_the_weights(ds, block_size):
    """100,000 draws over 4 ranks: per sample within 1 (2 with blocks) of T * w / sum(w), per episode within its
    units' rounding and within 4 binomial sigma, a weight-0 episode never; each rank's slice within 4 sigma."""
    ranks, T = 4, 100_000
    samplers = [WeightedSampler(ds, "weight", num_samples=T, block_size=block_size, seed=11, num_replicas=ranks,
                                rank=r) for r in range(ranks)]
    orders = [np.array(list(s)) for s in samplers]
    assert [len(o) for o in orders] == [T // ranks] * ranks
    e = _expected(ds, T)
    assert samplers[0].expected == pytest.approx(e)
    count = np.bincount(np.concatenate(orders), minlength=len(ds))
    assert np.abs(count - e).max() < (1 if block_size == 1 else 2)
    ep = _ep(ds)
    for x, w in W_EP.items():
        mine = ep == x
        got, want = int(count[mine].sum()), float(e[mine].sum())
        p = want / T
        assert abs(got - want) < 1, (x, got, want)  # an episode's draws: floor or ceil of its expected
        assert abs(got - want) <= 4 * math.sqrt(T * p * (1 - p)) + 1e-9, (x, got, want)
        if w == 0:
            assert got == 0
    for order in orders:
        n = len(order)
        for x in W_EP:
            p = float(e[ep == x].sum()) / T
            got = int(np.isin(order, np.flatnonzero(ep == x)).sum())
            assert abs(got - p * n) <= 4 * math.sqrt(block_size * n * p * (1 - p)) + 1e-9, (x, got, p * n)


def test_each_samples_mean_count_over_epochs_is_its_expected_draws(ds):
    """Fractional expectations (about 0.1 to 1.6 draws per sample per epoch, blocks of 8): over 400 epochs each
    sample's mean count is T * w / sum(w) within 5 sigma of its Bernoulli excess (module docstring)."""
    T, K = 1000, 400
    s = WeightedSampler(ds, "weight", num_samples=T, block_size=8, seed=2)
    total = np.zeros(len(ds))
    for epoch in range(K):
        s.set_epoch(epoch)
        total += np.bincount(list(s), minlength=len(ds))
    e = _expected(ds, T)
    f = e - np.floor(e)
    tol = 5 * np.sqrt(f * (1 - f) / K) + 1e-9
    assert (np.abs(total / K - e) <= tol).all(), np.abs(total / K - e).max()


def test_equal_weights_draw_a_permutation_read_in_blocks(db):
    """Equal weights and len(ds) draws: every sample once (as EpisodeAwareSampler), blocks read forward."""
    ds = db.dataset("SELECT episode_index, 1 AS weight FROM episodes WHERE episode_index < 6", cameras=[])
    order = np.array(list(WeightedSampler(ds, "weight", seed=4)))
    assert sorted(order.tolist()) == list(range(len(ds)))
    assert (np.diff(order) == 1).mean() > 0.8  # at most one jump per block of 8
    one = np.array(list(WeightedSampler(ds, "weight", block_size=1, seed=4)))
    assert sorted(one.tolist()) == list(range(len(ds))) and (np.diff(one) == 1).mean() < 0.05


def test_deterministic_per_seed_and_epoch(ds):
    a = WeightedSampler(ds, "weight", num_samples=3000, seed=5)
    first = list(a)
    assert list(WeightedSampler(ds, "weight", num_samples=3000, seed=5)) == first
    assert list(WeightedSampler(ds, "weight", num_samples=3000, seed=6)) != first
    a.set_epoch(1)
    second = list(a)
    assert second != first
    b = WeightedSampler(ds, "weight", num_samples=3000, seed=5)
    b.set_epoch(1)
    assert list(b) == second
    # the weights as an array give the same order as the column
    w = ds.manifest["weight"].to_numpy()
    assert list(WeightedSampler(ds, w, num_samples=3000, seed=5)) == first


def test_resume_gives_the_same_continuation(ds):
    s = WeightedSampler(ds, "weight", num_samples=6000, seed=9, num_replicas=2, rank=1)
    s.set_epoch(3)
    full = list(s)
    s.set_epoch(3, start=500)
    state = s.state_dict(consumed=1234)
    assert state["start"] == 1734 and state["epoch"] == 3 and state["weights"].startswith("sha256:")
    r = WeightedSampler(ds, "weight", num_samples=6000, seed=9, num_replicas=2, rank=1)
    r.load_state_dict(state)
    assert len(r) == 3000 - 1734
    rest = list(r)
    assert rest == full[1734:]
    assert list(r) == full  # the next pass is the whole epoch
    # other weights (another scale of the same column is other numbers too), draws, blocks or seed: refused
    other = ds.manifest["weight"].to_numpy() * 2
    for bad, says in ((WeightedSampler(ds, other, num_samples=6000, seed=9, num_replicas=2, rank=1), "sample weights"),
                      (WeightedSampler(ds, "weight", num_samples=8000, seed=9, num_replicas=2, rank=1), "samples"),
                      (WeightedSampler(ds, "weight", num_samples=6000, seed=9, num_replicas=2, rank=1, block_size=4),
                       "block_size"),
                      (WeightedSampler(ds, "weight", num_samples=6000, seed=8, num_replicas=2, rank=1), "seed")):
        with pytest.raises(ValueError, match=says):
            bad.load_state_dict(state)


@pytest.mark.parametrize("num_samples", [3000, 3001])
def test_ranks_are_disjoint_slices_covering_the_global_order(ds, num_samples):
    r = 3
    parts = [list(WeightedSampler(ds, "weight", num_samples=num_samples, seed=1, num_replicas=r, rank=k))
             for k in range(r)]
    per = -(-num_samples // r)
    assert [len(p) for p in parts] == [per] * r
    whole = WeightedSampler(ds, "weight", num_samples=per * r, seed=1, num_replicas=1, rank=0)
    assert sum(parts, []) == list(whole)  # rank k holds draws [k * per, (k + 1) * per) of the one order
    with pytest.raises(ValueError, match="rank"):
        WeightedSampler(ds, "weight", num_replicas=2, rank=2)


def test_a_dataloader_with_two_workers_gives_the_drawn_items(ds):
    sampler = WeightedSampler(ds, "weight", num_samples=96, seed=7)
    order = list(sampler)
    batches = list(DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2))
    got = torch.cat([b["index"] for b in batches]).tolist()
    assert got == ds.manifest["index"].to_numpy()[order].tolist()
    assert torch.cat([b["weight"] for b in batches]).tolist() == [W_EP[int(e)] for e in _ep(ds)[order]]


@pytest.mark.parametrize("value, says", [
    ("NULL", r"NULL or NaN at sample \d+ \(episode 3, result row 3\); (\d+) of \d+ samples have a NULL"),
    ("'NaN'::DOUBLE", r"NULL or NaN at sample \d+ \(episode 3, result row 3\)"),
    ("'inf'::DOUBLE", r"inf at sample \d+ \(episode 3, result row 3\)"),
    ("-1.0", r"-1.0 at sample \d+ \(episode 3, result row 3\).*must be finite and >= 0"),
])
def test_bad_weights_are_refused_naming_the_column_and_an_episode(db, value, says):
    bad = db.dataset(f"SELECT episode_index, CASE WHEN episode_index = 3 THEN {value} ELSE 1.0 END AS score "
                     "FROM episodes WHERE episode_index < 6", cameras=[])
    with pytest.raises(ValueError, match="weights column 'score': " + says) as e:
        WeightedSampler(bad, "score")
    if value == "NULL":
        length = db.sql("SELECT length FROM episodes WHERE episode_index = 3").fetchall()[0][0]
        assert f" {length} of {len(bad)} samples" in str(e.value)  # every sample of episode 3
    with pytest.raises(ValueError, match="weights column 'score'"):
        MixtureSampler(bad, sample_weights="score")


def test_other_refusals(db, ds):
    with pytest.raises(KeyError, match=r"no column 'wieght' in the selection's result \(its columns besides the "
                                        r"contract's: \['weight'\]\).*Did you mean 'weight'"):
        WeightedSampler(ds, "wieght")
    zero = db.dataset("SELECT episode_index, 0.0 AS weight FROM episodes WHERE episode_index < 2", cameras=[])
    with pytest.raises(ValueError, match="every weight of the .* samples is 0"):
        WeightedSampler(zero, "weight")
    text = db.dataset("SELECT episode_index, 'high' AS weight, true AS keep FROM episodes WHERE episode_index < 2",
                      cameras=[])
    with pytest.raises(TypeError, match="holds string, not numbers.*CAST"):
        WeightedSampler(text, "weight")
    with pytest.raises(TypeError, match="holds bool, not numbers"):
        WeightedSampler(text, "keep")
    with pytest.raises(ValueError, match=r"\(3,\) for \d+ samples"):
        WeightedSampler(ds, [1.0, 2.0, 3.0])
    ep, idx = _ep(ds), ds.manifest["index"].to_numpy()
    with pytest.raises(TypeError, match="names a column"):
        WeightedSampler((ep, idx), "weight")
    assert list(WeightedSampler((ep, idx), ds.manifest["weight"].to_numpy(), seed=1)) == \
        list(WeightedSampler(ds, "weight", seed=1))
    with pytest.raises(ValueError, match="num_samples"):
        WeightedSampler(ds, "weight", num_samples=0)
    with pytest.raises(ValueError, match="block_size"):
        WeightedSampler(ds, "weight", block_size=0)


# ---- over a collection: global weights, or the datasets' shares with weights within each ----------------------------
@pytest.fixture(scope="module")
def coll_ds(datasets):
    coll = lsql.connect_many([datasets / "small20", datasets / "h264_20"])
    # small20's episodes weigh 1..4, h264_20's 1 (so small20's share of the weight is larger than of the samples)
    return coll.dataset("SELECT dataset, episode_index, CASE WHEN dataset = 'small20' THEN episode_index + 1.0 "
                        "ELSE 1.0 END AS weight FROM episodes WHERE episode_index < 4", cameras=[])


def test_over_a_collection_the_weights_compare_across_datasets(coll_ds):
    w = coll_ds.manifest["weight"].to_numpy()
    code = np.asarray(coll_ds.dataset_index)
    s = WeightedSampler(coll_ds, "weight", num_samples=50_000, block_size=1, seed=3)
    assert s.names == ["small20", "h264_20"]
    assert s.shares == pytest.approx({"small20": w[code == 0].sum() / w.sum(), "h264_20": w[code == 1].sum() / w.sum()})
    order = list(s)
    count = np.bincount(order, minlength=len(coll_ds))
    assert np.abs(count - 50_000 * w / w.sum()).max() < 1
    assert abs(int((code[order] == 0).sum()) - 50_000 * s.shares["small20"]) < 1  # a dataset's: floor or ceil


def test_mixture_with_sample_weights_keeps_the_shares_and_weighs_within_each(coll_ds):
    """MixtureSampler(ds, shares, sample_weights=col): each dataset's quota exactly as without, and within it each
    sample floor or ceil of quota * w / (its dataset's weights), block_size=1."""
    w = coll_ds.manifest["weight"].to_numpy()
    code = np.asarray(coll_ds.dataset_index)
    shares = {"small20": 0.3, "h264_20": 0.7}
    s = MixtureSampler(coll_ds, shares, sample_weights="weight", num_samples=100_000, block_size=1, seed=5,
                       num_replicas=2, rank=0)
    plain = MixtureSampler(coll_ds, shares, num_samples=100_000, block_size=1, seed=5, num_replicas=2, rank=0)
    assert s.quotas == plain.quotas and s.quotas == {"small20": 30_000, "h264_20": 70_000}
    order = np.concatenate([list(s), list(MixtureSampler(coll_ds, shares, sample_weights="weight",
                                                         num_samples=100_000, block_size=1, seed=5,
                                                         num_replicas=2, rank=1))])
    count = np.bincount(order, minlength=len(coll_ds))
    want = np.where(code == 0, 30_000 * w / w[code == 0].sum(), 70_000 * w / w[code == 1].sum())
    assert s.expected == pytest.approx(want)
    assert np.abs(count - want).max() < 1
    assert int((code[order] == 0).sum()) == 30_000
    # blocks: each sample within 2, the quotas still exact
    b8 = np.array(list(MixtureSampler(coll_ds, shares, sample_weights="weight", num_samples=20_000, seed=5)))
    assert np.abs(np.bincount(b8, minlength=len(coll_ds)) - 20_000 / 100_000 * want).max() < 2
    assert int((code[b8] == 0).sum()) == 6_000
    # a resume under other sample weights is refused; the state saved with none has None
    state = plain.state_dict()
    assert state["sample_weights"] is None and s.state_dict()["sample_weights"].startswith("sha256:")
    with pytest.raises(ValueError, match="sample_weights"):
        s.load_state_dict(state)


def test_mixture_with_sample_weights_refusals(coll_ds):
    code = np.asarray(coll_ds.dataset_index)
    w = np.where(code == 1, 0.0, coll_ds.manifest["weight"].to_numpy())
    with pytest.raises(ValueError, match=r"h264_20 \(weight 0.5\): a share of the draws, but every sample weight"):
        MixtureSampler(coll_ds, {"small20": 1, "h264_20": 1}, sample_weights=w)
    assert MixtureSampler(coll_ds, {"small20": 1, "h264_20": 0}, sample_weights=w).quotas == {"small20": len(coll_ds)}
    # replacement=False: a sample expected more than once per epoch is refused, naming it
    with pytest.raises(ValueError, match=r"replacement=False.*small20: [\d.]+ draws expected of sample \d+ \(episode 3 "
                                         r"of small20, result row \d+, weight 4\)"):
        MixtureSampler(coll_ds, sample_weights="weight", replacement=False)
    ok = MixtureSampler(coll_ds, sample_weights="weight", replacement=False, num_samples=len(coll_ds) // 4, seed=1)
    order = list(ok)
    assert len(order) == len(set(order))  # each sample at most once


def test_weights_near_the_float_maximum_draw_by_their_ratio(ds):
    """Weights of 1e308 (their sum is inf in float64): drawn as their ratios, as the same weights scaled down."""
    w = ds.manifest["weight"].to_numpy()
    big = WeightedSampler(ds, w * 1e307, num_samples=5000, seed=3)
    small = WeightedSampler(ds, w, num_samples=5000, seed=3)
    assert np.isfinite(big.expected).all() and big.expected == pytest.approx(small.expected)
    assert np.abs(np.bincount(list(big), minlength=len(ds)) - small.expected).max() < 2
    coll_w = MixtureSampler(ds, sample_weights=w * 1e307, num_samples=5000, seed=3)
    assert coll_w.expected == pytest.approx(MixtureSampler(ds, sample_weights=w, num_samples=5000, seed=3).expected)
