"""Workers' recycled batch memory (lerobot_sql/torch/batch.py): batches equal in-process items whatever the main
process holds on to (whole batches, one slice of one tensor, everything), slots really reused, a batch that never
leaves its worker freed by the worker, and the switch."""

from __future__ import annotations

import copy
import gc
import pickle
import threading
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import lerobot_sql as lsql
from lerobot_sql._storage.scratch import pid_alive
from lerobot_sql.torch import batch as batch_memory
from test_batch import _delta, _same

pytestmark = pytest.mark.skipif(not batch_memory.enabled(), reason="batch memory needs os.memfd_create (Linux)")


@pytest.fixture(scope="module")
def sets(datasets):
    db = lsql.connect(datasets / "small20")
    cams = db.layout.video_keys
    return {(p, u8): db.dataset("SELECT index FROM frames ORDER BY index", delta_timestamps=_delta(p, cams),
                                return_uint8=u8)
            for p in ("plain", "diffusion") for u8 in (False, True)}


def _order(ds, n=640, seed=3):
    return np.random.default_rng(seed).permutation(len(ds))[:n].tolist()


def _reference(ds, idx, j, b=32):
    return default_collate([ds[i] for i in idx[j * b:(j + 1) * b]])


def _loader(ds, idx, workers=2, **kw):
    return DataLoader(ds, batch_size=32, sampler=idx, num_workers=workers, multiprocessing_context="fork", **kw)


@pytest.mark.parametrize("profile,u8", [("plain", False), ("diffusion", False), ("diffusion", True)])
def test_streamed_batches_equal_items_and_slots_are_reused(sets, profile, u8):
    """Only the current batch alive (a training loop): every batch equals the items, and the frames of 20 batches
    come from a few recycled addresses, not 20 new allocations."""
    ds = sets[(profile, u8)]
    idx = _order(ds)
    cam = ds._video_keys[0]
    ptrs = set()
    for j, batch in enumerate(_loader(ds, idx)):
        assert type(batch) is dict
        _same(batch, _reference(ds, idx, j), f"batch {j}")
        ptrs.add(batch[cam].data_ptr())
        del batch
    assert j == 19 and len(ptrs) <= 2 * 4, len(ptrs)  # 2 workers, each cycling a handful of slots


def test_held_batches_and_a_held_slice_are_never_overwritten(sets):
    """The main process keeps every batch (list(loader): slots run out, torch's memory takes over) and, in a
    second run, only one image of batch 0 (a view: the slot must stay taken until the view is gone)."""
    ds = sets[("diffusion", False)]
    idx = _order(ds, 512)
    got = list(_loader(ds, idx))
    for j, batch in enumerate(got):
        _same(batch, _reference(ds, idx, j), f"held batch {j}")
    del got
    cam = ds._video_keys[1]
    keep = None
    for j, batch in enumerate(_loader(ds, idx)):
        if j == 0:
            keep = batch[cam][5, 1]  # one (3, H, W) frame of one item of batch 0
        del batch
        gc.collect()
    _same(keep, _reference(ds, idx, 0)[cam][5, 1], "the kept frame")


def test_persistent_workers_over_epochs(sets):
    ds = sets[("plain", True)]
    idx = _order(ds, 256)
    dl = _loader(ds, idx, persistent_workers=True)
    for epoch in range(3):
        for j, batch in enumerate(dl):
            _same(batch, _reference(ds, idx, j), f"epoch {epoch} batch {j}")


def test_other_collate_fn_copies_and_the_worker_frees_the_slot(sets):
    """A collate_fn of its own gets plain items (views of the slot) and stacks them itself: the slot never
    leaves the worker and is freed there, so 20 batches still work and equal the items."""
    ds = sets[("diffusion", True)]
    idx = _order(ds)
    dl = _loader(ds, idx, collate_fn=lambda items: default_collate([dict(x) for x in items]))
    for j, batch in enumerate(dl):
        _same(batch, _reference(ds, idx, j), f"batch {j}")
    assert j == 19


def _in_feeder_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), name="QueueFeederThread")
    t.start()
    t.join()
    return out[0]


def test_the_slot_protocol_in_one_process(sets, monkeypatch):
    """The state machine without a DataLoader: claim, pickle (the main byte set), unpickle, free on the last
    tensor's death, reuse; a batch never pickled is freed by the worker's countdown; a full ring falls back."""
    class Info:
        num_workers, id, seed = 1, 0, 0

    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: Info())
    monkeypatch.setattr(batch_memory, "_RING", None)
    monkeypatch.setattr(batch_memory, "_SIZE_HINT", 0)
    ds = sets[("plain", True)]
    idx = _order(ds, 64)
    first = default_collate(ds.__getitems__(idx[:32]))  # sizes the ring
    assert type(first) is dict and batch_memory._RING is None and batch_memory._SIZE_HINT > 0
    sent = default_collate(ds.__getitems__(idx[:32]))
    ring = batch_memory._RING
    assert isinstance(sent, batch_memory.SharedBatch) and ring.worker[0] == 1 and ring.main[0] == 0
    # a copy or a pickle outside a queue's feeder thread is a plain dict of values, and leaves the slot alone
    dup = copy.deepcopy(sent)
    assert type(dup) is dict and ring.main[0] == 0
    dup["observation.images.front"].zero_()
    _same(dict(sent), first, "the original after its deep copy was changed")
    data = _in_feeder_thread(lambda: ForkingPickler.dumps(sent))  # noqa: F821 (deleted below, after this call) as a DataLoader worker's queue pickles
    assert ring.main[0] == 1
    del sent
    gc.collect()
    assert ring.worker[0] == 0 and ring.main[0] == 1  # the worker let go; the "main process" has not yet
    got = pickle.loads(data)
    _same(got, first, "rebuilt")
    view = got["observation.images.front"][3]
    del got
    gc.collect()
    assert ring.main[0] == 1  # a view is still alive
    del view
    gc.collect()
    assert ring.main[0] == 0 and ring.worker[0] == 0
    # never pickled: freed by the worker's countdown alone; then the same slot again
    b = default_collate(ds.__getitems__(idx[32:]))
    assert ring.worker[0] == 1
    del b
    gc.collect()
    assert ring.worker[0] == 0
    # pickled by a queue of the user's own (not a DataLoader's feeder thread): torch's own reduction (it moves
    # the tensors to its shared memory, as for any tensor), never the slot
    c = default_collate(ds.__getitems__(idx[:32]))
    assert isinstance(c, batch_memory.SharedBatch)
    back = pickle.loads(ForkingPickler.dumps(c))
    assert type(back) is dict and ring.main[0] == 0
    _same(back, first, "pickled outside a feeder")
    del c, back
    gc.collect()
    assert ring.worker[0] == 0
    held = [default_collate(ds.__getitems__(idx[:32])) for _ in range(batch_memory.SLOTS + 2)]
    assert sum(isinstance(x, batch_memory.SharedBatch) for x in held) == batch_memory.SLOTS
    for x in held:
        _same(dict(x), first, "held")


def test_switched_off(sets, monkeypatch):
    monkeypatch.setenv("LSQL_BATCH_MEMORY", "0")
    # inside a worker the batch tensors still go to torch's shared memory (no copy on the way to the main process)
    class Info:
        num_workers, id, seed = 1, 0, 0

    with monkeypatch.context() as m:
        m.setattr(torch.utils.data, "get_worker_info", lambda: Info())
        b = default_collate(sets[("plain", False)].__getitems__([0, 5, 9]))
    assert type(b) is dict and all(v.is_shared() for v in b.values() if isinstance(v, torch.Tensor))
    ds = sets[("plain", False)]
    idx = _order(ds, 96)
    for j, batch in enumerate(_loader(ds, idx, workers=1)):
        _same(batch, _reference(ds, idx, j), f"batch {j}")


def test_rings_of_exited_workers_are_unmapped(sets):
    """Non-persistent workers: each epoch's workers make new rings; the main process drops the old ones' mappings
    (else every epoch would keep SLOTS batches of memory per worker)."""
    ds = sets[("plain", True)]
    idx = _order(ds, 128)
    for _epoch in range(4):
        for batch in _loader(ds, idx):  # noqa: B007 (held until the del: the last batch keeps its slot)
            pass
        del batch
    # the last epoch's two rings stay until a new ring arrives; none of the three epochs before
    dead = [k for k in batch_memory._MAPPINGS if not pid_alive(k[0])]
    assert len(dead) <= 2, dead


def test_a_bad_switch_value_is_refused(monkeypatch, sets):
    monkeypatch.setenv("LSQL_BATCH_MEMORY", "maybe")
    with pytest.raises(ValueError, match="LSQL_BATCH_MEMORY='maybe'"):
        batch_memory.enabled()
    monkeypatch.setenv("LSQL_BATCH_MEMORY", "off")
    assert not batch_memory.enabled()

