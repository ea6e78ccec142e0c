"""Remote pipelining: with ``ds.pipeline(sampler, batches=k)`` each DataLoader worker fetches its next
batches' bytes in background threads. Over the loopback HTTP server: items identical to the local dataset's and
to a run without pipelining, bytes fetched within 1.2x of that run, and the next batch read from the cache."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import lerobot_sql as lsql
from http_range_server import RangeServer
from lerobot_sql.torch import pipeline as pipe
from lerobot_sql.torch.samplers import EpisodeAwareSampler
from test_batch import _delta, _same

FPS = 30


@pytest.fixture
def served(datasets, tmp_path, monkeypatch):
    """A copy of multifile60 (3 data files, 12 mp4s) served over loopback HTTP; each test its own cache."""
    shutil.copytree(datasets / "multifile60", tmp_path / "srv" / "multifile60")
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LSQL_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with RangeServer(tmp_path / "srv") as srv:
        yield srv, tmp_path


def _remote(srv, tmp_path, name: str, profile: str = "diffusion"):
    db = lsql.connect(f"{srv.url}/multifile60", cache_dir=tmp_path / name)
    cams = db.layout.video_keys
    return db, db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta(profile, cams),
                          return_uint8=True)


def _media_requests(srv, since: int) -> list:
    return [e for e in srv.log[since:] if e[0].split("/", 2)[1] in ("data", "videos")]


def _read_pipelined(srv, ds, order: list[int], batches: int, b: int = 16) -> tuple[list, list]:
    """Batches of ``b`` of ``order`` read in one process, each after the previous one's prefetch finished: the
    batches, and the video requests the server saw meanwhile."""
    ds.pipeline(order, batches=batches)
    mark = len(srv.log)
    got = []
    for j in range(0, len(order), b):
        got.append(ds.__getitems__(order[j:j + b]))
        ds._pipeline.wait()
    return got, [e for e in _media_requests(srv, mark) if e[0].split("/", 2)[1] == "videos"]


def _same_as_local(datasets, ds, got: list, order: list[int], every: int = 1, b: int = 16) -> None:
    """Every ``every``-th batch of ``got`` (batches of ``b`` of ``order``) equals the local dataset's."""
    local = lsql.connect(datasets / "multifile60").dataset("SELECT index FROM frames ORDER BY index",
                                                          delta_timestamps=_delta("plain", ds._video_keys),
                                                          return_uint8=True)
    for j in range(0, len(got), every):
        _same(torch.utils.data.default_collate(got[j]),
              torch.utils.data.default_collate(local.__getitems__(order[b * j:b * (j + 1)])), f"batch {j}")


def test_workers_pipelined_equal_unpipelined_within_the_bytes(served, datasets):
    srv, tmp = served
    local = lsql.connect(datasets / "multifile60").dataset(
        "SELECT index FROM frames ORDER BY index", delta_timestamps=_delta("diffusion", ["observation.images.front",
                                                                                       "observation.images.wrist"]),
        return_uint8=True)
    runs = {}
    for mode in ("plain", "pipelined"):
        _db, ds = _remote(srv, tmp, mode)
        # 384 items of 13,024 in EpisodeAwareSampler's order: a whole (short) epoch, scattered over the files. An
        # epoch cut short would leave the last k*W batches fetched ahead and never read (up to k*W/24 more bytes).
        sampler = EpisodeAwareSampler(ds, block_size=4, seed=5).order()[:384].tolist()
        if mode == "pipelined":
            ds.pipeline(sampler, batches=3)
        sent = srv.bytes_sent()
        got = list(DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2, multiprocessing_context="fork"))
        runs[mode] = (got, srv.bytes_sent() - sent, np.array(sampler))
    (plain, b_plain, order), (piped, b_piped, order2) = runs["plain"], runs["pipelined"]
    assert np.array_equal(order, order2) and len(plain) == len(piped) == 24
    for j, (a, b) in enumerate(zip(plain, piped)):
        _same(b, a, f"batch {j}")
        if j % 6 == 0:  # and both are the local dataset's items
            _same(b, torch.utils.data.default_collate(local.__getitems__(order[16 * j:16 * (j + 1)].tolist())),
                  f"batch {j} vs local")
    assert b_piped <= 1.2 * b_plain, (b_piped, b_plain)


def test_the_next_batch_is_read_from_the_cache(served, datasets):
    """In one process (W = 1): after batch 0 and its prefetch, batch 1 costs no request for data or video."""
    srv, tmp = served
    _db, ds = _remote(srv, tmp, "one")
    order = [int(i) for i in np.random.default_rng(2).permutation(len(ds))[:64]]
    ds.pipeline(order, batches=2)
    first = ds.__getitems__(order[:16])
    ds._pipeline.wait()
    st = ds._pipeline.stats()
    assert st["submitted"] == 2 and st["bytes"] > 0 and st["failed"] == st["unmatched"] == 0, st
    ds.pipeline(None)  # so that reading batch 1 submits nothing further: every request now is the batch's own
    mark = len(srv.log)
    second = ds.__getitems__(order[16:32])
    assert _media_requests(srv, mark) == []
    local = lsql.connect(datasets / "multifile60").dataset(
        "SELECT index FROM frames ORDER BY index", delta_timestamps=_delta("diffusion", ds._video_keys),
        return_uint8=True)
    _same(torch.utils.data.default_collate(second), torch.utils.data.default_collate(local.__getitems__(order[16:32])))
    _same(torch.utils.data.default_collate(first), torch.utils.data.default_collate(local.__getitems__(order[:16])))


def test_a_sampler_that_disagrees_or_a_small_budget_fetches_nothing_ahead(served):
    srv, tmp = served
    _db, ds = _remote(srv, tmp, "off", profile="plain")
    order = [int(i) for i in np.random.default_rng(4).permutation(len(ds))[:48]]
    ds.pipeline(order[::-1], batches=2)  # not the order the batches come in
    for j in range(0, 48, 16):
        ds.__getitems__(order[j:j + 16])
    ds._pipeline.wait()
    st = ds._pipeline.stats()
    assert st["unmatched"] == st["batches"] == 3 and st["submitted"] == st["bytes"] == 0, st
    _db, ds = _remote(srv, tmp, "tiny", profile="plain")
    ds.pipeline(order, batches=2, max_bytes=1000)
    ds.__getitems__(order[:16])
    ds._pipeline.wait()
    st = ds._pipeline.stats()
    assert st["submitted"] == 2 and st["over_budget"] == 2 and st["bytes"] == 0, st
    with pytest.raises(ValueError, match="batches"):
        ds.pipeline(order, batches=0)
    assert ds.pipeline(None)._pipeline is None


def test_pipeline_on_a_local_dataset_is_a_no_op(datasets):
    ds = lsql.connect(datasets / "small20").dataset("SELECT index FROM frames ORDER BY index", cameras=[])
    order = list(range(64))
    ds.pipeline(order)
    _same(torch.utils.data.default_collate(ds.__getitems__(order[:16])),
          torch.utils.data.default_collate([ds[i] for i in order[:16]]))
    assert ds._pipeline.stats() == {}


def test_a_sampler_of_another_dataset_is_warned_about(datasets):
    """ds.pipeline([10**9, 5, -3]) or a sampler built on a larger dataset was taken in silence: the fetch ahead
    skipped every position it could not serve. Positions this dataset has, negative ones included, say nothing."""
    db = lsql.connect(datasets / "small20")
    ds = db.dataset("SELECT index FROM frames WHERE episode_index < 2", cameras=[])
    with pytest.warns(UserWarning, match=rf"1 of 3 sampler positions are outside this dataset's {len(ds)} samples "
                                         r"\(e.g. 1000000000\)"):
        ds.pipeline([10**9, 5, -3])
    big = lsql.EpisodeAwareSampler(db.dataset(cameras=[]), seed=0)
    with pytest.warns(UserWarning, match="sampler of another dataset"):
        ds.pipeline(big)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.pipeline(lsql.EpisodeAwareSampler(ds, seed=0))
        ds.pipeline(list(range(len(ds))))


@pytest.mark.slow
def test_spawned_workers_get_the_sampler_and_pipeline(served, datasets):
    """lerobot 0.6.1's start method: the sampler travels pickled with the dataset, and the items stay exact."""
    srv, tmp = served
    _db, ds = _remote(srv, tmp, "spawn", profile="act")
    sampler = EpisodeAwareSampler(ds, block_size=8, seed=9)
    ds.pipeline(sampler, batches=2)
    order = sampler.order()[:96]
    got = [b for _, b in zip(range(6), DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2,
                                                  multiprocessing_context="spawn"))]
    local = lsql.connect(datasets / "multifile60").dataset("SELECT index FROM frames ORDER BY index",
                                                          delta_timestamps=_delta("act", []), return_uint8=True)
    for j, b in enumerate(got):
        _same(b, torch.utils.data.default_collate(local.__getitems__(order[16 * j:16 * (j + 1)].tolist())), f"{j}")


def test_each_mp4_is_demuxed_once_with_the_pipeline(served, datasets, monkeypatch):
    """The pipeline plans GOP fetches from the packets' byte ranges: it takes them from the mapped Arrow index the
    reader builds, not from a Parquet form demuxed a second time (half the CPU of a cold epoch's index builds)."""
    from lerobot_sql._readers import video_index

    srv, tmp = served
    demuxed: list[str] = []
    real = video_index._demux_index
    monkeypatch.setattr(video_index, "_demux_index", lambda src, rel: demuxed.append(rel) or real(src, rel))
    _db, ds = _remote(srv, tmp, "once")
    order = [int(i) for i in EpisodeAwareSampler(ds, block_size=8, seed=3).order()[:96]]
    ds.pipeline(order, batches=2)
    got = [ds.__getitems__(order[j:j + 16]) for j in range(0, 96, 16)]
    ds._pipeline.wait()
    st = ds._pipeline.stats()
    assert st["submitted"] > 0 and st["bytes"] > 0 and st["failed"] == 0, st
    assert demuxed and len(demuxed) == len(set(demuxed)), sorted(demuxed)
    local = lsql.connect(datasets / "multifile60").dataset(
        "SELECT index FROM frames ORDER BY index", delta_timestamps=_delta("diffusion", ds._video_keys),
        return_uint8=True)
    for j, b in enumerate(got):
        _same(torch.utils.data.default_collate(b),
              torch.utils.data.default_collate(local.__getitems__(order[16 * j:16 * (j + 1)])), f"batch {j}")


def test_prefetched_heads_leave_no_sliver_for_a_request_of_its_own(served, datasets):
    """A batch's mp4 head range ends where PyAV's first read block does (what the index build fetched with the
    moov), not a block past the first packet: that passed it by the free and mdat box headers, and each mp4 cost
    a 16-byte request (a round trip and ~0.5 ms of CPU) of its own."""
    srv, tmp = served
    _db, ds = _remote(srv, tmp, "heads", profile="plain")
    order = [int(i) for i in EpisodeAwareSampler(ds, block_size=16, seed=1).order()[:128]]
    got, video = _read_pipelined(srv, ds, order, batches=3)
    assert video and min(b - a for _, a, b, _ in video) >= 64, sorted(video, key=lambda e: e[2] - e[1])[:3]
    _same_as_local(datasets, ds, got, order)


def test_a_block_a_batch_boundary_cuts_is_fetched_by_one_job(served, datasets):
    """EpisodeAwareSampler's blocks rarely align with batches: the two halves of a cut block read the same GOPs,
    and the second batch's job fetched the few KB its range reaches past the first one's as a request of its own
    (105 of 245 requests over a multifile60 epoch). The job that comes first now fetches the block's union:
    (almost) no video request starts where an earlier one of the same file ended, and the bytes stay the same."""
    srv, tmp = served
    _db, ds = _remote(srv, tmp, "cut", profile="plain")
    order = [int(i) for i in EpisodeAwareSampler(ds, block_size=24, seed=3).order()[:320]]
    got, video = _read_pipelined(srv, ds, order, batches=2)
    # (the container heads, fetched with the moov box when the index was built, are not the batches' ranges)
    video = [e for e in video if e[1] >= 64 << 10]
    ends: dict[str, set] = {}
    extensions = 0
    for path, a, b, _ in video:
        extensions += a in ends.get(path, ())
        ends.setdefault(path, set()).add(b)
    # Without the union 18-20 of ~47 requests extend an earlier one; with it 1-3 of 26-28, which of the two jobs'
    # fills takes a region's lock first being up to thread timing (3 of 28 on a loaded machine): at most 1 in 7.
    assert video and 7 * extensions <= len(video), (extensions, len(video))
    assert ds._pipeline.stats()["failed"] == 0
    _same_as_local(datasets, ds, got, order, every=5)


def test_the_dataset_pins_the_mp4s_in_the_parent_and_workers_ask_for_none(served, datasets):
    """The dataset asks for the query's mp4s' infos (size, ETag) in the parent, at its open, one HEAD each in one
    parallel round (``ds.pipeline()`` before; hostile review 12 moved it to ``dataset()``); forked workers inherit
    those pins: they send no HEAD (before, each worker asked for every mp4 on its first read of it, one round trip
    each, every epoch) and all read the versions the parent pinned."""
    srv, tmp = served
    h0 = len(srv.heads)
    _db, ds = _remote(srv, tmp, "pins", "plain")
    order = EpisodeAwareSampler(ds, block_size=8, seed=1).order()[:128].tolist()
    mp4s = sorted({rel for names in ds._samples.video_files.values() for rel in names})
    assert len(mp4s) == 11  # 6 front, 5 wrist
    assert sorted(h for h in srv.heads[h0:] if h.endswith(".mp4")) == [f"multifile60/{r}" for r in mp4s]
    h0 = len(srv.heads)
    ds.pipeline(order, batches=2)
    assert srv.heads[h0:] == []
    pins = {r: ds._src.fs.info(ds._src.path(r))["identity"] for r in mp4s}
    h1 = len(srv.heads)
    got = list(DataLoader(ds, batch_size=16, sampler=order, num_workers=2, multiprocessing_context="fork"))
    assert srv.heads[h1:] == []
    local = lsql.connect(datasets / "multifile60").dataset("SELECT index FROM frames ORDER BY index",
                                                          delta_timestamps=_delta("plain", ds._video_keys),
                                                          return_uint8=True)
    for j in range(0, len(got), 2):
        _same(got[j], torch.utils.data.default_collate(local.__getitems__(order[16 * j:16 * (j + 1)])), f"batch {j}")
    ds.pipeline(order, batches=2)  # known already: nothing asked again
    assert len(srv.heads) == h1 and {r: ds._src.fs.info(ds._src.path(r))["identity"] for r in mp4s} == pins


class _Src:
    """What ``_Here.widen`` asks of a source: the cached ranges are ``cached``."""

    def __init__(self, cached):
        self.cached = cached

    def missing(self, rel, ranges):
        from lerobot_sql._storage.pieces import gaps
        return [g for a, b in ranges for g in gaps(sorted(self.cached.get(rel, [])), a, b)]


def test_widen_grows_a_request_to_its_block_over_needed_uncached_bytes_only(monkeypatch):
    from lerobot_sql.torch import pipeline as pipe
    monkeypatch.setattr(pipe, "WIDEN", 4096)
    h = pipe._Here(list(range(4)), 4, 1, 1 << 20)
    h.need = {"v.mp4": [(0, 100), (200, 5000), (9000, 9100)], "d.parquet": [(0, 10)]}
    src = _Src({"v.mp4": [(1000, 1500)]})
    got = h.widen({"v.mp4": [(250, 300)], "d.parquet": [], "other.mp4": [(5, 9)]}, src)
    # block [0, 4096): the needed bytes in it, less the cached piece; nothing of [4096, 5000) (the next block),
    # nothing of the gap [100, 200) no batch needs; files the epoch plan does not name are left as they are
    assert got == {"v.mp4": [(0, 100), (200, 1000), (1500, 4096)], "d.parquet": [], "other.mp4": [(5, 9)]}
    assert h.counts["widened"] == 1
    # a range across a block boundary takes both blocks
    assert h.widen({"v.mp4": [(4000, 4200)]}, _Src({})) == {"v.mp4": [(0, 100), (200, 5000)]}
    h.need = None  # no plan (yet, or too large for the cache): the batch's own ranges
    assert h.widen({"v.mp4": [(250, 300)]}, src) == {"v.mp4": [(250, 300)]}


def _dense_run(srv, tmp, name: str, cache_size=None):
    """The first 4 episodes in EpisodeAwareSampler's order, all their frames (a whole epoch of that query), read
    pipelined in one process: (batches, video requests, media bytes sent, pipeline stats, the order)."""
    db = lsql.connect(f"{srv.url}/multifile60", cache_dir=tmp / name, cache_size=cache_size)
    ds = db.dataset("SELECT index FROM frames WHERE episode_index < 4 ORDER BY index",
                    delta_timestamps=_delta("plain", db.layout.video_keys), return_uint8=True)
    order = [int(i) for i in EpisodeAwareSampler(ds, block_size=16, seed=2).order()]
    mark = len(srv.log)
    got, video = _read_pipelined(srv, ds, order, batches=2)
    sent = sum(e[3] for e in _media_requests(srv, mark))
    return got, video, sent, ds._pipeline.stats(), order


def test_a_dense_epoch_is_fetched_in_blocks_not_a_request_per_gop_run(served, datasets, monkeypatch):
    """Every GOP of a whole epoch is read sometime in it; a request per batch and GOP run (~10-30 KB at 96x128,
    each ~1 ms of a worker's CPU) made the HTTP client a worker's largest cost. Jobs now widen their requests to
    the aligned block over bytes the epoch needs: far fewer requests, the same bytes, the same items."""
    from lerobot_sql.torch import pipeline as pipe
    srv, tmp = served
    got, video, sent, st, order = _dense_run(srv, tmp, "wide")
    monkeypatch.setattr(pipe, "WIDEN", 0)
    got0, video0, sent0, st0, order0 = _dense_run(srv, tmp, "narrow")
    assert order == order0 and len(got) == len(got0) > 40
    assert st["widened"] > 0 and st0["widened"] == 0 and st["failed"] == st0["failed"] == 0, (st, st0)
    assert 2 * len(video) <= len(video0), (len(video), len(video0))
    assert sent <= 1.05 * sent0, (sent, sent0)
    for j in range(0, len(got), 7):
        _same(torch.utils.data.default_collate(got[j]), torch.utils.data.default_collate(got0[j]), f"batch {j}")
    local = lsql.connect(datasets / "multifile60").dataset(
        "SELECT index FROM frames WHERE episode_index < 4 ORDER BY index",
        delta_timestamps=_delta("plain", ["observation.images.front", "observation.images.wrist"]), return_uint8=True)
    for j in range(0, len(got), 9):
        _same(torch.utils.data.default_collate(got[j]),
              torch.utils.data.default_collate(local.__getitems__(order[16 * j:16 * (j + 1)])), f"batch {j} vs local")


def test_no_widening_when_the_epoch_would_not_fit_a_quarter_of_the_cache(served):
    """Bytes fetched for later batches must still be cached when those come: with a cache under 4x the epoch's
    bytes the LRU could evict them first (and they would be fetched twice), so jobs keep to their own ranges."""
    srv, tmp = served
    _got, video, _sent, st, _order = _dense_run(srv, tmp, "small", cache_size=2 << 20)
    assert video and st["widened"] == 0 and st["bytes"] > 0 and st["failed"] == 0, st


def test_the_epoch_plan_is_dropped_when_the_sampler_draws_another_set(served):
    """The plan is made for the positions the sampler yields at ``ds.pipeline()``. A next epoch that reshuffles the
    same set keeps it; one that draws another set (a rank's share after set_epoch) must not widen over bytes of
    positions it no longer reads: it fetches its own ranges only, until ``ds.pipeline(sampler)`` plans again."""
    srv, tmp = served
    db = lsql.connect(f"{srv.url}/multifile60", cache_dir=tmp / "sets")
    ds = db.dataset("SELECT index FROM frames WHERE episode_index < 4 ORDER BY index",
                    delta_timestamps=_delta("plain", db.layout.video_keys), return_uint8=True)
    half = len(ds) // 2

    class Halves:  # epoch 0: the first half of the positions, epoch 1: the second, epoch 2: the first reversed
        epoch = 0

        def order(self):
            a = np.arange(half) if self.epoch != 1 else np.arange(half, len(ds))
            return a[::-1].copy() if self.epoch == 2 else a

        def __iter__(self):
            return iter(self.order().tolist())

    s = Halves()
    for epoch, widens in ((1, False), (2, True)):
        ds.pipeline(s, batches=2)  # planned for epoch 0's set
        s.epoch = epoch
        order = s.order().tolist()
        for j in range(0, 64, 16):
            ds.__getitems__(order[j:j + 16])
            ds._pipeline.wait()
        st = ds._pipeline.stats()
        assert st["submitted"] > 0 and st["failed"] == 0 and (st["widened"] > 0) == widens, (epoch, st)
        s.epoch = 0


@pytest.mark.parametrize("profile", ["plain", "diffusion"])
def test_a_batch_plan_from_the_packet_table_equals_the_rule_per_batch(datasets, tmp_path, monkeypatch, profile):
    """A job plans its batch by gathering rows from each mp4's packet table (locate.packet_spans, built once per
    process); the ranges are those locate.packet_ranges gives the same batch (the table off), file for file, with
    the row groups and container heads alike."""
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    ds = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta(profile, db.layout.video_keys))
    order = EpisodeAwareSampler(ds, block_size=16, seed=3).order()
    batches = [np.asarray(order[j:j + 24], np.int64) for j in range(0, 480, 24)]
    with_table = [pipe.byte_ranges(ds._w(), jj) for jj in batches]
    assert all(ds._w().spans.values()), "multifile60's GOPs are short: every mp4 has a table"
    monkeypatch.setattr("lerobot_sql._readers.locate.packet_spans", lambda *a, **k: None)
    ds2 = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta(profile, db.layout.video_keys))
    without = [pipe.byte_ranges(ds2._w(), jj) for jj in batches]
    assert not any(ds2._w().spans.values())
    assert with_table == without
    assert all(any(rel.endswith(".mp4") for rel in plan) for plan in with_table)


def test_a_batch_plan_by_frame_index_equals_the_plan_by_time_on_grid_data(datasets, tmp_path):
    """align="frame_index" plans a window's camera rows with the items' own rule (locate.rows_by_position): on data
    whose timestamps are frame_index / fps (multifile60), the same rows, so the same byte ranges and the same epoch
    blocks as the plan by time."""
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    delta = _delta("diffusion", db.layout.video_keys)
    by_time = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=delta)
    by_pos = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=delta, align="frame_index")
    order = EpisodeAwareSampler(by_time, block_size=16, seed=3).order()
    for j in range(0, 240, 24):
        jj = np.asarray(order[j:j + 24], np.int64)
        plan = pipe.byte_ranges(by_pos._w(), jj)
        assert plan == pipe.byte_ranges(by_time._w(), jj) and any(rel.endswith(".mp4") for rel in plan)
    pos = np.unique(order)
    for a, b in zip(pipe.item_blocks(by_pos._w(), pos), pipe.item_blocks(by_time._w(), pos)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("profile", ["plain", "diffusion"])
def test_the_epoch_block_table_covers_every_batch_plan(datasets, tmp_path, profile):
    """With the epoch planned, a job gathers its items' blocks from the table the main process built
    (``pipeline.item_blocks``) instead of planning its batch: every byte any batch's own plan names (row groups, a
    window's neighbours, GOP runs, container heads) lies in a block the table gives that batch's items, so no
    batch waits on bytes the table missed."""
    from lerobot_sql.torch import pipeline as pipe
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    ds = db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta(profile, db.layout.video_keys))
    order = EpisodeAwareSampler(ds, block_size=16, seed=3).order()
    pos = np.unique(order)
    files, off, keys = pipe.item_blocks(ds._w(), pos)
    assert len(keys) >= 2 * len(pos) and (np.diff(off) > 0).all()  # every item reads its data and its mp4s
    fid = {f: i for i, f in enumerate(files)}
    checked = 0
    for j in range(0, len(order), 32):
        r = np.searchsorted(pos, order[j:j + 32])
        have = set(np.concatenate([keys[off[i]:off[i + 1]] for i in r]).tolist())
        for rel, rs in pipe.byte_ranges(ds._w(), np.asarray(order[j:j + 32])).items():
            for a, b in rs:
                for blk in range(a // pipe.WIDEN, (b - 1) // pipe.WIDEN + 1):
                    assert (fid[rel] << 32 | blk) in have, (j, rel, a, b)
                    checked += 1
    assert checked > len(order) // 32 * 3


def test_a_job_whose_blocks_are_fetched_asks_the_cache_nothing(monkeypatch):
    """Once a block was fetched (or found cached) by this process, a later job whose items read only fetched
    blocks makes no cache lookup and no request; a block not done yet gets the epoch's need within it."""
    from lerobot_sql.torch import pipeline as pipe
    monkeypatch.setattr(pipe, "WIDEN", 4096)
    h = pipe._Here(list(range(4)), 4, 1, 1 << 20)
    h.need = {"v.mp4": [(0, 100), (200, 5000)], "d.parquet": [(0, 10)]}
    # positions 0..3: 0 and 1 read v.mp4's block 0 and d.parquet's block 0, 2 and 3 v.mp4's block 1
    pos, off = np.arange(4), np.array([0, 2, 4, 5, 6])
    keys = np.array([0 << 32 | 0, 1 << 32 | 0, 0 << 32 | 0, 1 << 32 | 0, 0 << 32 | 1, 0 << 32 | 1])
    h.blocks = (pos, ["v.mp4", "d.parquet"], off, keys)
    asked = []

    class Src(_Src):
        def missing(self, rel, ranges):
            asked.append(rel)
            return super().missing(rel, ranges)

    src = Src({"v.mp4": [(1000, 1500)]})
    got, new = h.block_missing(np.array([0, 1]), src)
    assert got == {"v.mp4": [(0, 100), (200, 1000), (1500, 4096)], "d.parquet": [(0, 10)]} and len(new) == 2
    h.done.update(new)
    asked.clear()
    assert h.block_missing(np.array([1, 0]), src) == ({}, []) and asked == []
    assert h.block_missing(np.array([1, 2]), src) == ({"v.mp4": [(4096, 5000)]}, [0 << 32 | 1])
