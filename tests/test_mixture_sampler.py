"""MixtureSampler: datasets of a collection drawn in given proportions (weights, n_i ** alpha, weights from SQL), in
blocks of consecutive frames, deterministic per (seed, epoch), resumable, one global order sliced per rank.

Tolerance of the proportion checks: within an epoch each dataset's draws are an exact quota (within 1 of
``p * T``); a stretch of ``n`` consecutive draws is a random sample of the epoch's slots without replacement, so
its count of dataset ``i`` has at most the binomial variance ``n p (1 - p)``. With blocks of up to ``B`` samples
there are about ``n / B`` independent units of up to ``B`` samples each, so the sample count's standard deviation is
at most ``sigma = sqrt(B * n * p * (1 - p))``; the tests allow ``4 * sigma`` (a chance of ~6e-5 per check under
the model, and the seeds are fixed, so a pass is deterministic)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import lerobot_sql as lsql
from helpers import assert_items_equal
from lerobot_sql.torch.samplers import MixtureSampler, blocks

SETS = ["small20", "multifile60", "h264_20", "v21_small20"]
# v21_small20 is in the collection but not in the selection: weights for it must be 0
SQL = "SELECT dataset, index FROM frames WHERE episode_index < 3 AND dataset <> 'v21_small20'"
W = {"small20": 0.6, "multifile60": 0.3, "h264_20": 0.1, "v21_small20": 0}


@pytest.fixture(scope="module")
def coll(datasets):
    return lsql.connect_many([datasets / n for n in SETS])


@pytest.fixture(scope="module")
def ds(coll):
    return coll.dataset(SQL)


def _names_of(ds, order) -> np.ndarray:
    return np.asarray(ds.names)[ds.dataset_index[np.asarray(order)]]


def test_selection_is_what_the_tests_assume(ds):
    counts = np.bincount(ds.dataset_index, minlength=4)
    assert counts.tolist()[3] == 0 and (counts[:3] > 400).all()


@pytest.mark.parametrize("block_size", [1, 8])
def test_proportions_over_10k_draws_match_the_weights(ds, block_size):
    ranks = 4
    per_rank = 10_000
    samplers = [MixtureSampler(ds, W, num_samples=ranks * per_rank, block_size=block_size, seed=11,
                               num_replicas=ranks, rank=r) for r in range(ranks)]
    s = samplers[0]
    assert s.num_samples == 40_000 and s.weights == pytest.approx({"small20": 0.6, "multifile60": 0.3, "h264_20": 0.1})
    orders = [np.array(list(x)) for x in samplers]
    everything = np.concatenate(orders)
    names = _names_of(ds, everything)
    # the epoch: exact quotas, within 1 of p * T; the excluded dataset never drawn
    for name, p in s.weights.items():
        assert abs(s.quotas[name] - p * 40_000) <= 1
        assert (names == name).sum() == s.quotas[name]
    assert "v21_small20" not in set(names)
    # each rank's 10k draws: within 4 sigma (module docstring) of the weights
    for order in orders:
        assert len(order) == per_rank
        got = _names_of(ds, order)
        for name, p in s.weights.items():
            tol = 4 * math.sqrt(block_size * per_rank * p * (1 - p))
            assert abs((got == name).sum() - p * per_rank) <= tol, (name, (got == name).sum(), tol)
    # oversampled datasets repeat their samples evenly: each at most ceil(quota / n) times
    for name in s.weights:
        mine = everything[names == name]
        most = np.bincount(mine).max()
        assert most <= math.ceil(s.quotas[name] / s.counts[name])
        if s.quotas[name] >= s.counts[name]:  # every sample of it drawn at least once
            assert len(np.unique(mine)) == s.counts[name]


def test_blocks_are_read_forward(ds):
    ep = ds.manifest["episode_index"].to_numpy()
    idx = ds.manifest["index"].to_numpy()
    order = np.array(list(MixtureSampler(ds, W, num_samples=8000, block_size=8, seed=2)))
    forward = (np.diff(order) == 1) & (np.diff(idx[order]) == 1) & (np.diff(ep[order]) == 0)
    assert forward.mean() > 0.8  # at most one jump per block of 8 (short blocks at episode ends)
    one = np.array(list(MixtureSampler(ds, W, num_samples=8000, block_size=1, seed=2)))
    assert (np.diff(one) == 1).mean() < 0.05
    # the order is blocks of blocks(), each read from its start forward (a dataset's last block of the epoch may
    # be cut short)
    b = blocks(np.asarray(ds.dataset_index, np.int64) * 1_000_000 + ep, idx, 8)
    jumps = np.concatenate([[True], np.diff(order) != 1])
    assert np.isin(order[jumps], b[:-1]).all()  # every jump lands on a block's start


def test_alpha_weights(ds):
    n = np.bincount(ds.dataset_index, minlength=4)[:3].astype(float)
    names = ds.names[:3]
    for alpha in (0.0, 0.5, 1.0, -0.5):
        s = MixtureSampler(ds, alpha=alpha, num_samples=9000)
        p = n ** alpha / (n ** alpha).sum()
        assert list(s.weights) == names
        assert s.weights == pytest.approx(dict(zip(names, p)))
        for name, pi in zip(names, p):
            assert abs(s.quotas[name] - pi * 9000) <= 1
    assert len(set(MixtureSampler(ds, alpha=0.0, num_samples=9000).quotas.values())) == 1  # uniform: 3000 each
    # the default is alpha=1 and len(ds) draws: one rank's epoch is a permutation of the samples
    default = list(MixtureSampler(ds, seed=4))
    assert sorted(default) == list(range(len(ds)))
    assert MixtureSampler(ds).weights == pytest.approx(MixtureSampler(ds, alpha=1).weights)


def test_weights_from_a_sql_column(coll, ds):
    """The README's recipe: hours per dataset of the selected episodes as the weights."""
    w = dict(coll.sql("SELECT dataset, sum(duration_s) FROM episodes WHERE episode_index < 3 "
                      "AND dataset <> 'v21_small20' GROUP BY 1").fetchall())
    assert set(w) == {"small20", "multifile60", "h264_20"}
    s = MixtureSampler(ds, w, num_samples=20_000)
    hours = np.array([w[n] for n in s.weights])
    for name, p in zip(s.weights, hours / hours.sum()):
        assert s.weights[name] == pytest.approx(p)
        assert abs(s.quotas[name] - p * 20_000) <= 1
    # duration_s is length / fps and every set here is 30 fps: hours weights are the samples' proportions
    assert s.weights == pytest.approx(MixtureSampler(ds, alpha=1).weights)
    # the whole collection's hours include v21_small20, which has no samples here: refused, naming it
    everything = dict(coll.sql("SELECT dataset, sum(duration_s) FROM episodes GROUP BY 1").fetchall())
    with pytest.raises(ValueError, match=r"v21_small20 \(weight .*no samples in the selection"):
        MixtureSampler(ds, everything)


def test_deterministic_per_seed_and_epoch(ds):
    a = MixtureSampler(ds, W, num_samples=3000, seed=5)
    first = list(a)
    assert list(MixtureSampler(ds, W, num_samples=3000, seed=5)) == first
    assert list(MixtureSampler(ds, W, num_samples=3000, seed=6)) != first
    a.set_epoch(1)
    second = list(a)
    assert second != first
    b = MixtureSampler(ds, W, num_samples=3000, seed=5)
    b.set_epoch(1)
    assert list(b) == second
    a.set_epoch(0)
    assert list(a) == first
    # different subsets per epoch for an undersampled dataset (quota < its samples)
    small = MixtureSampler(ds, W, num_samples=2000, seed=5)
    sub = [set(np.array(list(small))[_names_of(ds, list(small)) == "h264_20"].tolist())]
    small.set_epoch(1)
    o = list(small)
    sub.append(set(np.array(o)[_names_of(ds, o) == "h264_20"].tolist()))
    assert sub[0] != sub[1] and len(sub[0]) == small.quotas["h264_20"]


def test_resume_equals_uninterrupted(ds):
    s = MixtureSampler(ds, W, num_samples=6000, seed=9, num_replicas=2, rank=1)
    s.set_epoch(3)
    full = list(s)
    s.set_epoch(3, start=500)
    state = s.state_dict(consumed=1234)
    assert state["start"] == 1734 and state["epoch"] == 3 and state["quotas"] == s.quotas
    r = MixtureSampler(ds, W, num_samples=6000, seed=9, num_replicas=2, rank=1)
    r.load_state_dict(state)
    assert len(r) == 3000 - 1734
    rest = list(r)
    assert rest == full[1734:] and full[:500] + full[500:1734] + rest == full
    assert list(r) == full  # the resume position applied to that pass only: the next one is the whole epoch
    # a resume under other weights (or draws, block size, ranks) would not continue the saved order: refused
    with pytest.raises(ValueError, match="quotas"):
        MixtureSampler(ds, {**W, "small20": 0.5}, num_samples=6000, seed=9, num_replicas=2, rank=1) \
            .load_state_dict(state)
    with pytest.raises(ValueError, match="quotas"):
        MixtureSampler(ds, W, num_samples=8000, seed=9, num_replicas=2, rank=1).load_state_dict(state)
    with pytest.raises(ValueError, match="block_size"):
        MixtureSampler(ds, W, num_samples=6000, seed=9, num_replicas=2, rank=1, block_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        MixtureSampler(ds, W, num_samples=6000, seed=8, num_replicas=2, rank=1).load_state_dict(state)


@pytest.mark.parametrize("num_samples", [3000, 3001])
def test_ranks_are_disjoint_slices_covering_the_global_order(ds, num_samples):
    r = 3
    parts = [list(MixtureSampler(ds, W, num_samples=num_samples, seed=1, num_replicas=r, rank=k)) for k in range(r)]
    per = -(-num_samples // r)
    assert [len(p) for p in parts] == [per] * r
    whole = MixtureSampler(ds, W, num_samples=per * r, seed=1, num_replicas=1, rank=0)
    assert sum(parts, []) == list(whole)  # rank k holds slots [k * per, (k + 1) * per) of the one order
    with pytest.raises(ValueError, match="rank"):
        MixtureSampler(ds, W, num_replicas=2, rank=2)


def test_collection_manifest_and_single_dataset(coll, ds, datasets):
    assert lsql.MixtureSampler is MixtureSampler and "MixtureSampler" in lsql.__all__  # lazy, as the others
    m = coll.manifest(SQL)
    assert list(MixtureSampler(m, W, num_samples=2000, seed=3)) == list(MixtureSampler(ds, W, num_samples=2000,
                                                                                        seed=3))
    one = lsql.connect(datasets / "small20").dataset("SELECT index FROM frames WHERE episode_index < 4")
    s = MixtureSampler(one, seed=2)
    assert s.names == ["small20"] and s.quotas == {"small20": len(one)}
    assert sorted(s) == list(range(len(one)))
    assert list(MixtureSampler(one, {"small20": 3.0}, seed=2)) == list(s)
    assert list(MixtureSampler(one.manifest, {"dataset": 1}, seed=2)) == list(s)  # a bare manifest: "dataset"
    big = MixtureSampler(one, num_samples=3 * len(one), seed=2)
    assert np.bincount(list(big)).tolist() == [3] * len(one)  # oversampled evenly: 3 shuffled passes
    with pytest.raises(KeyError, match="Did you mean 'small20'"):
        MixtureSampler(one, {"smal20": 1})


def test_errors_name_the_dataset_and_the_fix(ds):
    with pytest.raises(KeyError, match="no dataset 'multifile6' .*Did you mean 'multifile60'"):
        MixtureSampler(ds, {**W, "multifile6": 1})
    with pytest.raises(ValueError, match=r"no weight to h264_20 \(\d+ samples\)"):
        MixtureSampler(ds, {"small20": 1, "multifile60": 1})
    with pytest.raises(ValueError, match="v21_small20 .*no samples in the selection"):
        MixtureSampler(ds, {**W, "v21_small20": 0.2})
    with pytest.raises(ValueError, match="not both"):
        MixtureSampler(ds, W, alpha=0.5)
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite and >= 0"):
            MixtureSampler(ds, {**W, "small20": bad})
    with pytest.raises(ValueError, match="not a number"):
        MixtureSampler(ds, {**W, "small20": "lots"})
    with pytest.raises(ValueError, match="every weight is 0"):
        MixtureSampler(ds, dict.fromkeys(W, 0))
    with pytest.raises(ValueError, match="alpha"):
        MixtureSampler(ds, alpha=float("nan"))
    with pytest.raises(ValueError, match="num_samples"):
        MixtureSampler(ds, W, num_samples=0)
    with pytest.raises(TypeError, match="mapping"):
        MixtureSampler(ds, [0.5, 0.5])
    # replacement=False: each sample at most once per epoch, so an oversampled dataset is refused, with numbers
    n_small = int((ds.dataset_index == 0).sum())
    with pytest.raises(ValueError, match=rf"small20: 6000 draws > {n_small} samples.*replacement=True"):
        MixtureSampler(ds, W, num_samples=10_000, replacement=False)
    ok = MixtureSampler(ds, replacement=False, seed=1)  # proportional, len(ds): fits
    assert sorted(ok) == list(range(len(ds)))
    with pytest.warns(UserWarning, match=r"h264_20 \(weight 0.001\): weight > 0 but 0 of the epoch's 100 draws"):
        MixtureSampler(ds, {"small20": 0.5, "multifile60": 0.499, "h264_20": 0.001}, num_samples=100)


def test_dataloader_with_two_workers_gives_the_in_process_batches(ds):
    sampler = MixtureSampler(ds, W, num_samples=96, block_size=8, seed=7)
    order = list(sampler)
    # the batched path (__getitems__ across datasets) in workers against the one-item path in process
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2)
    batches = list(loader)
    assert len(batches) == 6
    got_index = torch.cat([b["index"] for b in batches]).tolist()
    assert got_index == ds.manifest["index"].to_numpy()[order].tolist()
    assert sum((b["dataset"] for b in batches), []) == _names_of(ds, order).tolist()
    in_process = [default_collate([ds[i] for i in order[k:k + 16]]) for k in range(0, 96, 16)]
    for b, ref in zip(batches, in_process):
        assert_items_equal(b, ref)


def test_huge_weights_and_alphas_keep_their_proportions(ds):
    """Hostile review 20: weights of 1e308 each summed to inf, every quota became 0 and an epoch was 2 samples with no
    error (`train --weights a=1e308,b=1e308` trained on 2 frames); alpha=200 made n ** alpha inf and a raw
    ValueError. Weights are proportions: normalised by their largest first."""
    names = [n for n, c in MixtureSampler(ds).counts.items() if c]
    big = MixtureSampler(ds, {n: 1e308 for n in names})
    even = MixtureSampler(ds, {n: 1.0 for n in names})
    assert big.quotas == even.quotas and sum(big.quotas.values()) == len(ds) == len(list(big))
    with pytest.warns(UserWarning, match="0 of the epoch"):
        steep = MixtureSampler(ds, alpha=1000)
    largest = max(steep.counts, key=steep.counts.get)
    assert steep.quotas[largest] == len(ds)
