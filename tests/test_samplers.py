"""Samplers: blocks of consecutive frames, deterministic shuffles per (seed, epoch), resume, sharding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lerobot_sql as lsql
from lerobot_sql.torch.samplers import EpisodeAwareSampler, EpisodeShardedSampler, blocks


@pytest.fixture(scope="module")
def ds(datasets):
    db = lsql.connect(datasets / "small20")
    # a selection with gaps inside episodes, so blocks must also break where index jumps
    return db.dataset("SELECT index FROM frames WHERE episode_index < 6 AND frame_index % 50 < 40 ORDER BY index",
                      return_uint8=True)


def _cols(ds):
    return ds.manifest["episode_index"].to_numpy(), ds.manifest["index"].to_numpy()


def test_blocks_are_runs_of_consecutive_frames_of_one_episode(ds):
    ep, idx = _cols(ds)
    b = blocks(ep, idx, 8)
    assert b[0] == 0 and b[-1] == len(idx)
    for s, e in zip(b[:-1], b[1:]):
        assert 1 <= e - s <= 8
        assert len(set(ep[s:e])) == 1
        assert (np.diff(idx[s:e]) == 1).all()
    # every break in the data is a block boundary
    breaks = set((np.flatnonzero((np.diff(ep) != 0) | (np.diff(idx) != 1)) + 1).tolist())
    assert breaks <= set(b.tolist())


def test_shuffle_is_a_permutation_deterministic_per_seed_and_epoch(ds):
    s = EpisodeAwareSampler(ds, block_size=8, seed=7)
    a = list(s)
    assert sorted(a) == list(range(len(ds)))
    assert list(EpisodeAwareSampler(ds, block_size=8, seed=7)) == a
    s.set_epoch(1)
    b = list(s)
    assert sorted(b) == list(range(len(ds))) and b != a
    assert list(EpisodeAwareSampler(ds, block_size=8, seed=8)) != a
    # inside the order, positions come in runs that follow the blocks forward
    ep, idx = _cols(ds)
    bounds = blocks(ep, idx, 8)
    starts = set(bounds[:-1].tolist())
    pos = 0
    while pos < len(a):
        assert a[pos] in starts
        size = int(bounds[np.searchsorted(bounds, a[pos], side="right")] - a[pos])
        assert a[pos:pos + size] == list(range(a[pos], a[pos] + size))
        pos += size


def test_resume_from_a_position(ds):
    s = EpisodeAwareSampler(ds, seed=3)
    s.set_epoch(2)
    full = list(s)
    r = EpisodeAwareSampler(ds, seed=3)
    r.load_state_dict({"seed": 3, "epoch": 2, "start": 100})
    assert list(r) == full[100:] and len(r) == len(full) - 100
    with pytest.raises(ValueError, match="seed"):
        r.load_state_dict({"seed": 4, "epoch": 2, "start": 0})
    # not a state_dict at all (a bare KeyError 'epoch' before)
    for bad in ({}, {"seed": 3}, [2, 100]):
        with pytest.raises(ValueError, match=r"not a sampler state_dict \(it needs 'epoch'"):
            r.load_state_dict(bad)


def test_no_shuffle_is_identity(ds):
    assert list(EpisodeAwareSampler(ds, shuffle=False)) == list(range(len(ds)))


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_shards_cover_everything_with_equal_lengths(ds, drop_last):
    n, r = len(ds), 3
    parts = [list(EpisodeAwareSampler(ds, seed=1, num_replicas=r, rank=k, drop_last=drop_last)) for k in range(r)]
    assert len({len(p) for p in parts}) == 1
    flat = [x for p in parts for x in p]
    if drop_last:
        assert len(flat) == n - n % r and len(set(flat)) == len(flat)
    else:
        assert set(flat) == set(range(n)) and len(flat) == -(-n // r) * r
    with pytest.raises(ValueError, match="rank"):
        EpisodeAwareSampler(ds, num_replicas=2, rank=2)


def test_episode_shards_are_disjoint_whole_episodes(ds):
    ep, _ = _cols(ds)
    r = 4
    samplers = [EpisodeShardedSampler(ds, seed=5, num_replicas=r, rank=k) for k in range(r)]
    eps = [set(ep[list(s)].tolist()) for s in samplers]
    for a in range(r):
        for b in range(a + 1, r):
            assert not eps[a] & eps[b]
    assert set().union(*eps) == set(ep.tolist())
    assert len({len(s) for s in samplers}) == 1
    for s in samplers:  # every sample of the rank's episodes appears
        mine = np.flatnonzero(np.isin(ep, list(s.episodes)))
        assert set(s) == set(mine.tolist())
        a = list(s)
        s.set_epoch(1)
        assert list(s) != a  # reshuffled per epoch, same episodes
        assert set(ep[list(s)].tolist()) == set(s.episodes.tolist())
    with pytest.raises(ValueError, match="episode"):
        EpisodeShardedSampler(ds, num_replicas=7, rank=0)


def test_dataloader_with_sampler_and_two_workers_gives_the_sampled_items(ds):
    s = EpisodeAwareSampler(ds, block_size=8, seed=0)
    order = list(s)[:96]
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, order), batch_size=32, num_workers=2)
    got = torch.cat([b["index"] for b in loader]).tolist()
    assert got == ds.manifest["index"].to_numpy()[order].tolist()


def test_distributed_sampler_works_on_the_dataset(ds):
    idx = ds.manifest["index"].to_numpy()
    seen = []
    for rank in range(2):
        ds_sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
        loader = torch.utils.data.DataLoader(ds, batch_size=16, sampler=ds_sampler)
        positions = list(ds_sampler)
        batch = next(iter(loader))
        assert batch["index"].tolist() == idx[positions[:16]].tolist()
        seen += positions
    assert set(seen) == set(range(len(ds)))


def test_checkpoint_with_consumed_samples_resumes_exactly(ds):
    """Train 2 steps of 32 from a resumed position, checkpoint with what was consumed, resume: no sample is
    replayed or skipped across the two restarts."""
    s = EpisodeAwareSampler(ds, seed=5)
    s.set_epoch(1)
    full = list(s)
    s.set_epoch(1, start=40)
    state = s.state_dict(consumed=64)
    assert {k: state[k] for k in ("seed", "epoch", "start")} == {"seed": 5, "epoch": 1, "start": 104}
    assert state["sampler"] == "EpisodeAwareSampler" and state["samples"] == len(ds) and state["block_size"] == 8
    r = EpisodeAwareSampler(ds, seed=5)
    r.load_state_dict(state)
    assert full[:40] + full[40:104] + list(r) == full
    with pytest.raises(ValueError, match="consumed"):
        s.state_dict(consumed=-1)


@pytest.mark.parametrize("cls", [EpisodeAwareSampler, EpisodeShardedSampler])
def test_torchrun_environment_shards_before_the_process_group_exists(ds, monkeypatch, cls):
    """torchrun sets $RANK/$WORLD_SIZE; a sampler built before init_process_group must still take only its share
    (it took every sample on every rank: duplicated training), by the same rule as shard.worker_shard."""
    assert not torch.distributed.is_initialized()
    parts = []
    for r in range(2):
        monkeypatch.setenv("RANK", str(r))
        monkeypatch.setenv("WORLD_SIZE", "2")
        s = cls(ds, seed=3)
        assert (s.rank, s.num_replicas) == (r, 2)
        parts.append(list(s))
    assert not set(parts[0]) & set(parts[1]) or cls is EpisodeAwareSampler  # padding may repeat a few
    assert set(parts[0]) | set(parts[1]) == set(range(len(ds)))
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="rank 2"):
        cls(ds)


def test_a_resume_under_another_sampler_setup_is_refused(ds):
    """A state saved under other ranks, block_size, sampler class or dataset was accepted and silently skipped or
    repeated samples (a new user's finding); so was a position beyond the epoch."""
    st = EpisodeAwareSampler(ds, num_replicas=2, rank=0).state_dict(consumed=64)
    with pytest.raises(ValueError, match="num_replicas 2, this sampler has 4"):
        EpisodeAwareSampler(ds, num_replicas=4, rank=0).load_state_dict(st)
    with pytest.raises(ValueError, match="block_size 8, this sampler has 4"):
        EpisodeAwareSampler(ds, block_size=4).load_state_dict(EpisodeAwareSampler(ds).state_dict(consumed=8))
    with pytest.raises(ValueError, match="sampler 'EpisodeAwareSampler', this sampler has 'EpisodeShardedSampler'"):
        EpisodeShardedSampler(ds).load_state_dict(EpisodeAwareSampler(ds).state_dict(consumed=10))
    small = EpisodeAwareSampler((np.zeros(50, np.int64), np.arange(50)))
    with pytest.raises(ValueError, match=rf"samples {len(ds)}, this sampler has 50"):
        small.load_state_dict(EpisodeAwareSampler(ds).state_dict(consumed=20))
    with pytest.raises(ValueError, match="beyond"):
        EpisodeAwareSampler(ds).state_dict(consumed=len(ds) + 1)
    with pytest.raises(ValueError, match="beyond"):
        small.load_state_dict({"seed": 0, "epoch": 0, "start": 51})  # an older state without the fingerprint
    old = EpisodeAwareSampler(ds)
    old.load_state_dict({"seed": 0, "epoch": 2, "start": 5})  # states saved before the fingerprint still load
    assert len(old) == len(ds) - 5


def test_a_resumed_pass_is_followed_by_whole_passes(ds):
    """After load_state_dict the offset applied to every later pass until set_epoch: a loop cycling the DataLoader
    without set_epoch (as lerobot's does) dropped the first `start` samples of each epoch."""
    s = EpisodeAwareSampler(ds, seed=3)
    s.set_epoch(0)
    full = list(s)
    s.load_state_dict(s.state_dict(consumed=100))
    assert list(s) == full[100:]
    assert list(s) == full and len(s) == len(full)


@pytest.mark.parametrize("bad", [1.5, 64.0, "64", True, None])
def test_consumed_must_be_an_integer(ds, bad):
    """consumed=1.5 resumed at position 1 without a word (int() truncated it)."""
    s = EpisodeAwareSampler(ds, seed=5)
    with pytest.raises(TypeError, match=rf"consumed must be an integer number of samples .*got {type(bad).__name__}"):
        s.state_dict(consumed=bad)
    # integers of any kind resume at the same place
    assert s.state_dict(consumed=np.int64(3))["start"] == s.state_dict(consumed=torch.tensor(3))["start"] == 3
