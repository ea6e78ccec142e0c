"""Manifest sharding: parts are disjoint, cover the selection, follow (seed, epoch), keep items intact."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from lerobot_sql.torch.shard import ShardedManifestDataset, assign, shard_manifest, shard_sizes, worker_shard


@pytest.fixture(scope="module")
def db(sample):
    d = lsql.connect(sample)
    yield d
    d.close()


@pytest.fixture(scope="module")
def manifest(db):
    # 17 of 20 episodes, a query extra, in a non-trivial result order.
    return db.manifest("SELECT episode_index, length AS ep_len FROM episodes WHERE episode_index NOT IN (3, 7, 11) "
                       "ORDER BY length DESC")


def synthetic(lengths, seed=0):
    """A manifest-shaped table: episode e has lengths[e] rows, index contiguous, episodes in shuffled order."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    ep = np.concatenate([np.full(lengths[e], e) for e in order])
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    idx = np.concatenate([start[e] + np.arange(lengths[e]) for e in order])
    return pa.table({"index": idx.astype(np.int64), "episode_index": ep.astype(np.int64)})


@pytest.mark.parametrize("by", ["episode", "sample"])
@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_parts_are_disjoint_and_cover(manifest, by, world):
    want = np.sort(manifest["index"].to_numpy())
    for epoch in range(3):
        parts = [shard_manifest(manifest, r, world, epoch=epoch, seed=5, by=by) for r in range(world)]
        got = np.concatenate([p["index"].to_numpy() for p in parts])
        assert len(got) == manifest.num_rows
        np.testing.assert_array_equal(np.sort(got), want)  # every row once: disjoint and covering
        sizes = np.array([p.num_rows for p in parts])
        np.testing.assert_array_equal(shard_sizes(manifest, world, epoch=epoch, seed=5, by=by), sizes)
        if by == "sample":
            assert sizes.max() - sizes.min() <= 1
        else:
            longest = np.bincount(manifest["episode_index"].to_numpy()).max()
            assert sizes.max() - sizes.min() <= longest

            owners = {}
            for r, p in enumerate(parts):
                for e in np.unique(p["episode_index"].to_numpy()):
                    assert owners.setdefault(int(e), r) == r, f"episode {e} on ranks {owners[int(e)]} and {r}"
            assert sorted(owners) == sorted(set(manifest["episode_index"].to_pylist()))


def test_rows_keep_manifest_order_and_metadata(manifest):
    pos = {int(i): k for k, i in enumerate(manifest["index"].to_numpy())}
    for by in ("episode", "sample"):
        part = shard_manifest(manifest, 1, 3, epoch=2, by=by)
        where = [pos[int(i)] for i in part["index"].to_numpy()]
        assert where == sorted(where)
        assert part.schema == manifest.schema
        assert part.schema.metadata == manifest.schema.metadata  # query extras travel with the part


def test_deterministic_per_seed_and_epoch(manifest):
    def owners(**kw):
        return assign(manifest, 3, **kw)

    np.testing.assert_array_equal(owners(epoch=4, seed=1), owners(epoch=4, seed=1))
    for by in ("episode", "sample"):
        base = owners(epoch=0, seed=0, by=by)
        assert any(not np.array_equal(base, owners(epoch=e, seed=0, by=by)) for e in (1, 2, 3))
        assert any(not np.array_equal(base, owners(epoch=0, seed=s, by=by)) for s in (1, 2, 3))
        # shuffle=False ignores epoch and seed
        np.testing.assert_array_equal(owners(epoch=0, by=by, shuffle=False), owners(epoch=9, seed=3, by=by,
                                                                                   shuffle=False))


def test_unshuffled_parts_are_contiguous(manifest):
    for by in ("episode", "sample"):
        parts = [shard_manifest(manifest, r, 4, by=by, shuffle=False) for r in range(4)]
        got = np.concatenate([p["index"].to_numpy() for p in parts])
        np.testing.assert_array_equal(got, manifest["index"].to_numpy())


def test_balance_on_many_episodes():
    lengths = np.random.default_rng(1).integers(200, 401, 1000)
    m = synthetic(lengths)
    sizes = shard_sizes(m, 8, epoch=3)
    assert sizes.sum() == lengths.sum()
    assert sizes.max() - sizes.min() <= lengths.max()


def test_few_huge_episodes_still_fill_every_rank():
    m = synthetic(np.array([1000, 1000, 3, 3]))
    sizes = shard_sizes(m, 4)
    assert (sizes > 0).all() and sizes.sum() == 2006


def test_bad_arguments(manifest):
    with pytest.raises(ValueError, match="rank 3 is not in"):
        shard_manifest(manifest, 3, 3)
    with pytest.raises(ValueError, match="by must be one of"):
        shard_manifest(manifest, 0, 2, by="file")
    with pytest.raises(ValueError, match="17 episode"):
        shard_manifest(manifest, 0, 18)
    assert shard_manifest(manifest, 17, 18, by="sample").num_rows > 0
    with pytest.raises(ValueError, match="world_size"):
        shard_manifest(manifest, 0, 0)


def _assert_items_equal(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_dataset_over_a_part_gives_the_same_items(db, manifest):
    dt = {"action": [-1 / 30, 0, 1 / 30], "observation.images.front": [0, 2 / 30]}
    full = db.dataset(manifest, delta_timestamps=dt)
    pos = {int(i): k for k, i in enumerate(manifest["index"].to_numpy())}
    part = shard_manifest(manifest, 1, 2, epoch=1)
    ds = db.dataset(part, delta_timestamps=dt)
    assert len(ds) == part.num_rows
    for i in (0, len(ds) // 2, len(ds) - 1):
        item = ds[i]
        _assert_items_equal(item, full[pos[int(item["index"])]])
        assert "ep_len" in item  # the query extra survived sharding


def test_parquet_manifest_round_trip(db, tmp_path):
    path = tmp_path / "m.parquet"
    db.export_manifest("SELECT episode_index FROM episodes WHERE episode_index < 6", path)
    m = pq.read_table(path)
    parts = [shard_manifest(m, r, 3, epoch=7) for r in range(3)]
    assert sorted(np.concatenate([p["index"].to_numpy() for p in parts]).tolist()) == sorted(m["index"].to_pylist())


def test_worker_shard_outside_workers():
    assert worker_shard(2, 4) == (2, 4)
    assert worker_shard() == (0, 1)  # no torch.distributed, no RANK/WORLD_SIZE in the test environment


def test_sharded_iterable_with_dataloader_workers(db):
    """2 simulated ranks x 2 DataLoader workers: 4 disjoint parts that together are the selection, items intact."""
    m = db.manifest("SELECT episode_index FROM episodes WHERE episode_index IN (1, 4, 9, 12, 15, 18)")
    full = db.dataset(m, cameras=[])
    by_index = {int(full[k]["index"]): k for k in range(len(full))}
    seen = []
    for rank in range(2):
        it = ShardedManifestDataset(db, m, rank=rank, world_size=2, seed=3, cameras=[])
        it.set_epoch(1)
        loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
        items = list(loader)
        for item in items[:: max(1, len(items) // 5)]:
            _assert_items_equal(item, full[by_index[int(item["index"])]])
        seen += [int(x["index"]) for x in items]
    assert len(seen) == m.num_rows  # no row twice ...
    assert sorted(seen) == sorted(m["index"].to_pylist())  # ... and every row


def test_worker_parts_follow_rank_and_worker(db, monkeypatch):
    """Worker w of rank r reads share w of rank r's part; the rank's part does not depend on num_workers."""
    m = db.manifest("SELECT episode_index FROM episodes")
    for rank in range(2):
        rank_part = shard_manifest(m, rank, 2, epoch=5, seed=1)
        shares = []
        for wid in range(3):
            info = type("Info", (), {"id": wid, "num_workers": 3})()
            monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda info=info: info)
            it = ShardedManifestDataset(db, m, rank=rank, world_size=2, seed=1)
            it.set_epoch(5)
            want = rank_part.take(pa.array(np.flatnonzero(assign(rank_part, 3, epoch=5, seed=1) == wid)))
            assert it.part()["index"].to_pylist() == want["index"].to_pylist()
            assert len(set(it.part()["episode_index"].to_pylist())) >= 1  # whole episodes, none empty here
            shares += it.part()["index"].to_pylist()
        assert sorted(shares) == sorted(rank_part["index"].to_pylist())
        monkeypatch.undo()


def _epochs(it, loader, epochs) -> list[list[int]]:
    """The ``index`` values the loader yields in each epoch (set_epoch called before each, as with
    DistributedSampler)."""
    out = []
    for e in epochs:
        it.set_epoch(e)
        out.append([int(x["index"]) for x in loader])
    return out


def test_set_epoch_reaches_persistent_dataloader_workers(db):
    """Epoch e gives rank r exactly shard_manifest(m, r, 2, epoch=e)'s rows, with fresh workers per epoch and with
    persistent ones (whose copy of the dataset outlives the epoch), and the two ranks together cover the selection
    once per epoch."""
    # 6 frames of each of 6 episodes: few items, so the test is about the partition, not item reads.
    m = db.manifest("SELECT episode_index, 0.0 AS start_s, 0.2 AS end_s FROM episodes "
                    "WHERE episode_index IN (1, 4, 9, 12, 15, 18)")
    assert m.num_rows == 36
    epochs = [0, 1, 2, 3]
    per_rank = []
    for rank in range(2):
        got = {}
        for persistent in (False, True):
            it = ShardedManifestDataset(db, m, rank=rank, world_size=2, seed=3, cameras=[])
            loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2, persistent_workers=persistent)
            got[persistent] = [sorted(x) for x in _epochs(it, loader, epochs)]
            del loader
        assert got[True] == got[False]  # persistent workers follow set_epoch like fresh ones
        for e, items in zip(epochs, got[True]):
            assert items == sorted(shard_manifest(m, rank, 2, epoch=e, seed=3)["index"].to_pylist()), e
        per_rank.append(got[True])
    for k in range(len(epochs)):
        assert sorted(per_rank[0][k] + per_rank[1][k]) == sorted(m["index"].to_pylist())  # each row once per epoch
    assert len({tuple(x) for x in per_rank[0]}) > 1  # the partition does follow the epoch


@pytest.mark.parametrize("by, world, workers", [("episode", 1, 4), ("episode", 2, 4), ("episode", 3, 2),
                                                ("sample", 1, 4)])
def test_more_workers_than_episodes(db, by, world, workers):
    """3 episodes, world x workers > 3: idle workers yield nothing; every row appears exactly once per epoch."""
    m = db.manifest("SELECT episode_index, 0.0 AS start_s, 0.2 AS end_s FROM episodes "
                    "WHERE episode_index IN (2, 5, 11)")
    for persistent in (False, True):
        seen = {e: [] for e in (0, 1)}
        for rank in range(world):
            it = ShardedManifestDataset(db, m, rank=rank, world_size=world, seed=0, by=by, cameras=[])
            loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=workers,
                                                 persistent_workers=persistent)
            for e, items in zip((0, 1), _epochs(it, loader, (0, 1))):
                assert sorted(items) == sorted(shard_manifest(m, rank, world, epoch=e, by=by)["index"].to_pylist())
                seen[e] += items
            del loader
        for e in (0, 1):
            assert sorted(seen[e]) == sorted(m["index"].to_pylist())


def test_fewer_episodes_than_ranks_fails_before_workers_start(db):
    m = db.manifest("SELECT episode_index FROM episodes WHERE episode_index IN (2, 5)")
    with pytest.raises(ValueError, match="2 episode\\(s\\) cannot give each of 3 ranks"):
        ShardedManifestDataset(db, m, rank=0, world_size=3, cameras=[])
    with pytest.raises(ValueError, match="rank 3 is not in"):
        ShardedManifestDataset(db, m, rank=3, world_size=3, by="sample", cameras=[])


def test_a_manifest_of_another_dataset_is_refused_by_the_sharded_dataset(datasets, tmp_path):
    """ShardedManifestDataset(db_a, manifest of b) and LeRobotSQLDataset(db_a.files, manifest of b) served A's rows
    at B's positions, silently, for an unedited manifest of B (a db.manifest() table, or an export_manifest file read
    back); db.dataset(path) refused the same input. Both now refuse naming the other dataset; A's own manifest (and a
    table of its own, written and read back) still serves A's items."""
    from lerobot_sql.torch.dataset import LeRobotSQLDataset

    a, b = lsql.connect(datasets / "small20"), lsql.connect(datasets / "multifile60")
    sql = "SELECT index FROM frames WHERE index IN (400, 401)"
    path = tmp_path / "b.parquet"
    b.export_manifest(sql, path)
    for given in (b.manifest(sql), pq.read_table(path)):
        with pytest.raises(lsql.ResultContractError, match="another dataset|opened through the dataset at"):
            ShardedManifestDataset(a, given, rank=0, world_size=1)
        with pytest.raises(lsql.ResultContractError, match="another dataset|opened through the dataset at"):
            LeRobotSQLDataset(a.files, given)
    own = a.manifest(sql)
    want = a.dataset(sql)
    got = list(ShardedManifestDataset(a, own, rank=0, world_size=1, shuffle=False))
    assert [int(i["index"]) for i in got] == [400, 401]
    assert all(torch.equal(g["observation.state"], want[j]["observation.state"]) for j, g in enumerate(got))


def test_the_sharded_dataset_checks_the_rows_of_a_manifest_given_with_the_database(datasets, tmp_path):
    """Given the Database, ShardedManifestDataset checks every row as db.dataset(table) does: an edited task_index
    (or a manifest of another dataset with the same info.json, e.g. an export with its episodes reordered) was served
    as it was. Given a table whose lerobot_sql metadata was lost (a pandas round trip), it is refused: nothing says
    which dataset its rows are of."""
    import pyarrow.compute as pc

    from lerobot_sql.torch.dataset import LeRobotSQLDataset

    a = lsql.connect(datasets / "small20")
    m = a.manifest("SELECT index FROM frames WHERE episode_index = 3 AND frame_index < 4")
    edited = m.set_column(m.column_names.index("task_index"), "task_index", pc.add(m["task_index"], 1))
    with pytest.raises(lsql.ResultContractError, match=r"ShardedManifestDataset: row 0 .*column 'task_index'"):
        ShardedManifestDataset(a, edited, rank=0, world_size=1)
    bare = pa.Table.from_pandas(m.to_pandas(), preserve_index=False).replace_schema_metadata(None)
    with pytest.raises(lsql.ResultContractError, match="without its lerobot_sql.manifest schema metadata"):
        ShardedManifestDataset(a.files, bare, rank=0, world_size=1)
    with pytest.raises(lsql.ResultContractError, match="without its lerobot_sql.manifest schema metadata"):
        LeRobotSQLDataset(a.files, bare)
    # with the Database, its rows are checked: the bare table serves, and a Path is a manifest file as elsewhere
    want = [int(i["index"]) for i in ShardedManifestDataset(a, m, rank=0, world_size=1, shuffle=False)]
    assert len(want) == 4
    assert [int(i["index"]) for i in ShardedManifestDataset(a, bare, rank=0, world_size=1, shuffle=False)] == want
    a.export_manifest("SELECT index FROM frames WHERE episode_index = 3 AND frame_index < 4", tmp_path / "m.parquet")
    assert [int(i["index"]) for i in ShardedManifestDataset(a, tmp_path / "m.parquet", rank=0, world_size=1,
                                                            shuffle=False)] == want
