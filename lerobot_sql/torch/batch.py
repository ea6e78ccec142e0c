"""Batches: what ``__getitems__`` returns (:class:`Batch`, a list of items that also holds their collated
tensors, and ``default_collate``'s rule for it), a camera's frames decoded straight into a batch tensor
(:func:`decode_frames`), and where a batch's tensors live: in a DataLoader worker, shared memory slots reused from
batch to batch (:func:`begin`, :class:`Slot`), so that a batch crosses to the main process without a copy and
without new pages.

A DataLoader worker hands each batch to the main process in shared memory. torch's ``default_collate`` (and this
package's ``__getitems__`` with ``LSQL_BATCH_MEMORY=0``) allocates new shared memory for every tensor of every batch
(``_new_shared``: a new shm file, then one page fault per 4 KiB page as it is written, and again in the main
process as it is read). Measured on the benchmark machine: writing 4.7 MB into new shared memory costs ~10 ms,
into memory already mapped ~0.5 ms; for a batch of 32 float frames of two 96x128 cameras that was ~0.3 ms of the
worker's ~0.85 ms per item (benchmarks/HISTORY.md, "Training loader").

Here each worker process keeps one *ring*: a ``memfd`` of ``SLOTS`` slots, each as large as the worker's first
batch, mapped once by the worker and once by the main process. A batch's tensors are carved out of one free slot
(:func:`begin` ... :meth:`Slot.tensor`). The collated batch is a :class:`SharedBatch` (a dict) that pickles its
slot tensors as ``(offset, shape, dtype)`` plus the ring's file descriptor (``multiprocessing.reduction.DupFd``,
as torch sends its own storages); the main process rebuilds them as views of its mapping of the ring, with no
copy and no new pages.

When may a slot be written again? Only when nobody can read it any more, in either process. Each slot has two
bytes in the ring's header: "the worker holds it" and "the main process holds it"; a slot is claimed only when
both are clear. Every tensor of a slot is ``torch.from_numpy`` of its own numpy view, and torch keeps exactly that
array alive for the lifetime of the tensor's storage (every view, slice or ``.numpy()`` of the tensor included),
so a ``weakref.finalize`` on each of those arrays runs only after the last user of that tensor is gone. A
countdown per batch and process clears its byte when all of its tensors are gone (in the worker, not before the
batch is complete: the batch's own handle counts too). The "main" byte is set when the batch is pickled to the
main process. A batch that never leaves the worker (an error mid-batch, another ``collate_fn`` that copies the
items) frees itself through the worker's countdown alone. When no slot is free (the main process holds many
batches, e.g. ``list(loader)``), or a batch is larger than a slot, the tensors that do not fit get torch's own
shared memory, as before: never wrong, only as slow as before.

Only inside DataLoader workers, only on Linux (``os.memfd_create``), only with ``torch.from_numpy``-compatible
dtypes; elsewhere :func:`begin` returns None and callers allocate as before. ``LSQL_BATCH_MEMORY=0`` switches it
off. A batch's tensors in the main process are ordinary CPU tensors; they are not resizable (``resize_`` raises),
and sending one on to a third process through ``torch.multiprocessing`` copies it.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np
import torch

from .. import _settings
from .._storage import scratch
from ._values import dequantize_


# ---- the batch a dataset returns -------------------------------------------------------------------------------
class BatchItem(dict):
    """One item of a :class:`Batch`: a plain dict of the item's values (its type tells ``default_collate`` that
    the batch it came from is already collated)."""

    __slots__ = ()


class Batch(list):
    """What ``LeRobotSQLDataset.__getitems__`` returns: a list of B items (what torch documents ``__getitems__``
    to return and a ``collate_fn`` to receive), that also holds their collated batch.

    ``batch[j]`` is item j as a dict (its tensors are views of the batch tensors: keeping one item keeps the
    batch's memory alive, and ``torch.save`` of a view writes the whole batch tensor; ``.clone()`` what you keep).
    ``default_collate(batch)`` returns the collated dict without re-stacking (see ``_collate_batch``).
    """

    def __init__(self, keys: list[str], tensors: dict[str, torch.Tensor], lists: dict[str, list], n: int,
                 memory=None):
        # unbind: one call per key for all B views (indexing per item cost ~2x as much)
        per = {k: tensors[k].unbind(0) if k in tensors else lists[k] for k in keys}
        super().__init__(BatchItem((k, per[k][j]) for k in keys) for j in range(n))
        self.keys, self.tensors, self.lists = keys, tensors, lists
        self._memory = memory  # the worker's batch slot (:class:`Slot`), None elsewhere

    def __reduce__(self):
        # Pickled when a collate_fn returns the items as they are (``collate_fn=lambda items: items``) from a worker:
        # a plain list of the item dicts, which torch sends as it sends any list of tensors. The batch's own
        # attributes (the worker's memory slot, its lock) cannot cross processes: pickling failed in the worker's
        # queue thread and the DataLoader would wait forever.
        return list, (list(self),)

    def collated(self, collate_fn_map) -> dict[str, Any]:
        """``default_collate`` of the items: the batch tensors as they are, the other keys collated by torch."""
        from torch.utils.data._utils.collate import collate

        out = {k: self.tensors[k] if k in self.tensors else collate(self.lists[k], collate_fn_map=collate_fn_map)
               for k in self.keys}
        return out if self._memory is None else self._memory.wrap(out)


def _collate_batch(batch, *, collate_fn_map=None):
    """``default_collate``'s rule for :class:`BatchItem`: a whole ``Batch`` (torch's fetcher passes what
    ``__getitems__`` returned) is already collated; anything else (a list of items taken out of batches, or a
    caller's own collate map) goes through torch's generic dict rule."""
    from torch.utils.data._utils.collate import collate, default_collate_fn_map

    if isinstance(batch, Batch) and collate_fn_map is default_collate_fn_map:
        return batch.collated(collate_fn_map)
    return collate([dict(x) for x in batch], collate_fn_map=collate_fn_map)


def _register_collate() -> None:
    # torch >= 1.13 dispatches default_collate on the first element's exact type through this public registry
    # (documented in torch.utils.data._utils.collate.collate); older torch never calls __getitems__ either.
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:
        return
    default_collate_fn_map.setdefault(BatchItem, _collate_batch)


_register_collate()


def batch_tensor(shape: tuple, dtype: torch.dtype, mem: "Slot | None" = None) -> torch.Tensor:
    """An uninitialised batch tensor: in a DataLoader worker in shared memory (``mem``, the worker's batch slot from
    :func:`begin`: a recycled slot, or new shared memory as ``default_collate`` allocates its stacks), so the batch
    crosses to the main process without a copy; elsewhere (``mem`` None) in ordinary memory."""
    if mem is not None:
        return mem.tensor(tuple(shape), dtype)
    return torch.empty(shape, dtype=dtype)


def decode_frames(decoders, codes: np.ndarray, files: dict, rows: np.ndarray, *, quantizer: dict | None,
                  uint8: bool, unit: str, window: bool, mem: "Slot | None" = None) -> torch.Tensor:
    """One camera's frames for a batch: one ``decode_chw`` per mp4 (``decoders``: the process's
    ``decode.DecoderPool``; ``codes[j]`` the mp4 of item j, ``files`` {code: its ``_worker.VideoFile``}, ``rows``
    (B, T) its video rows), written into one (B, T, 3, H, W) batch tensor: uint8 (``uint8``), or float32 in [0, 1];
    a depth map's (``quantizer``: its depth quantization) (B, T, 1, H, W) float32 in ``unit``, dequantized in place
    over the whole batch, element for element what an item's decode computes. (B, 3, H, W) unless ``window`` (a
    ``delta_timestamps`` camera) with T > 1: the items' shapes."""
    b, t = rows.shape
    direct = uint8 and quantizer is None
    out = na = None
    if len(files) == 1 and direct:  # one mp4 for the whole batch (and no conversion): decode into the batch
        made = []

        def alloc(shape, dtype):
            made.append(batch_tensor((b, t, *shape[1:]), torch.uint8, mem))
            return made[0].numpy().reshape(shape)

        decoders.decode_chw(files[next(iter(files))].index, rows.reshape(-1), alloc=alloc)
        out = made[0]
        return out if (window and t > 1) else out[:, 0]
    for code in sorted(files):
        m = np.flatnonzero(codes == code)
        arr = decoders.decode_chw(files[code].index, rows[m].reshape(-1))
        if out is None:
            out = batch_tensor((b, t, *arr.shape[1:]), torch.uint8 if direct else torch.float32, mem)
            na = out.numpy()
        arr = arr.reshape(len(m), t, *arr.shape[1:])
        if direct or quantizer is not None:
            na[m] = arr  # depth: uint16 codes into float32, exact (lerobot's .to(torch.float32))
        elif len(m) == b:  # the whole batch from this mp4: convert straight into the batch tensor
            np.true_divide(arr, np.float32(255), out=na, dtype=np.float32)  # = to_unit_float, no temporary
        else:
            # each item's frames converted straight into its place in the batch tensor (= to_unit_float): a float
            # temporary of the group, then copied in through the index, wrote every float twice (~1 ms of a
            # diffusion sample's 4, three cameras at 180x320)
            for k, j in enumerate(m.tolist()):
                np.true_divide(arr[k], np.float32(255), out=na[j], dtype=np.float32)
    if quantizer is not None:
        dequantize_(out, quantizer, unit)
    return out if (window and t > 1) else out[:, 0]


# ---- workers' batch memory -------------------------------------------------------------------------------------------
SLOTS = 8  # per worker: prefetch_factor (2) batches queued + one being built + those the main process still holds
HEADER = 4096  # "worker holds" bytes at [0, SLOTS), "main holds" bytes at [64, 64 + SLOTS)
MAIN = 64
ALIGN = 64
MAX_SLOT_BYTES = 1 << 30  # a batch above 1 GiB keeps torch's allocation (the ring would pin SLOTS of them)


def enabled() -> bool:
    """Whether workers reuse batch memory: Linux (``os.memfd_create``) and ``LSQL_BATCH_MEMORY`` not off.

    Raises:
        SettingError: ``LSQL_BATCH_MEMORY`` is set to something other than 1/true/yes/on or 0/false/no/off.
    """
    on = _settings.switch("LSQL_BATCH_MEMORY", True, "reuse workers' batch memory",
                          "new shared memory per batch, as torch's collate")
    return hasattr(os, "memfd_create") and on


def _np_dtype(dtype: torch.dtype) -> np.dtype | None:
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16)
        return None


class _Countdown:
    """Runs ``release`` once, when ``open`` handles and tensors are all gone (``add`` one per tensor)."""

    __slots__ = ("n", "release", "lock")

    def __init__(self, release, n: int = 0):
        self.n, self.release, self.lock = n, release, threading.Lock()

    def add(self, array: np.ndarray) -> None:
        with self.lock:
            self.n += 1
        weakref.finalize(array, self.done)

    def done(self) -> None:
        with self.lock:
            self.n -= 1
            last = self.n == 0
        if last:
            self.release()


class _Ring:
    """This worker's ring: the memfd, its mapping, the header bytes, the slot size."""

    def __init__(self, slot_bytes: int):
        self.pid = os.getpid()
        self.slot_bytes = -(-slot_bytes // 4096) * 4096
        size = HEADER + SLOTS * self.slot_bytes
        self.fd = os.memfd_create("lerobot-sql-batches", getattr(os, "MFD_CLOEXEC", 0))
        os.ftruncate(self.fd, size)  # pages are allocated as they are first written, never before
        self.mm = mmap.mmap(self.fd, size)
        self.worker = np.frombuffer(self.mm, np.uint8, SLOTS, 0)
        self.main = np.frombuffer(self.mm, np.uint8, SLOTS, MAIN)
        self.base = np.frombuffer(self.mm, np.uint8, size - HEADER, HEADER)
        self.base_ptr = self.base.ctypes.data
        self.lock = threading.Lock()

    def claim(self) -> int | None:
        with self.lock:
            free = np.flatnonzero((self.worker == 0) & (self.main == 0))
            if not len(free):
                return None
            s = int(free[0])  # the lowest: the same few slots are reused, the others never get pages
            self.worker[s] = 1
            return s

    def release_worker(self, s: int) -> None:
        with self.lock:
            self.worker[s] = 0


_RING: _Ring | None = None
_SIZE_HINT: int = 0  # bytes the first batch of this worker needed (the ring's slot size)


def _ring() -> _Ring | None:
    global _RING
    if _RING is not None and _RING.pid != os.getpid():
        _RING = None  # a fork of a worker: the parent's ring is not this process's
    if _RING is None and _SIZE_HINT:
        _RING = _Ring(_SIZE_HINT)
    return _RING


class Slot:
    """The memory of one batch being built: tensors carved from a ring slot while they fit, torch's shared
    memory after that (or for the whole batch when there is no ring or no free slot). ``close()`` when the batch
    is complete or abandoned (the slot is not freed before, even if early tensors are gone)."""

    def __init__(self, reuse: bool = True):
        self.ring = _ring() if reuse else None
        self.s = self.ring.claim() if self.ring is not None else None
        self.used = self.needed = 0
        self.array = None
        self.closed = False
        self.lock = threading.Lock()  # cameras are decoded into the batch from helper threads
        if self.s is not None:
            r = self.ring
            self.array = r.base[self.s * r.slot_bytes:(self.s + 1) * r.slot_bytes]
            self.count = _Countdown(lambda r=r, s=self.s: r.release_worker(s), n=1)  # 1: this handle

    def tensor(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape``/``dtype``, in the slot when it fits, else in new shared memory."""
        np_dtype = _np_dtype(dtype)
        if np_dtype is None:  # a dtype numpy lacks (bfloat16): torch's memory
            return _torch_shared(shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        with self.lock:
            at = -(-self.used // ALIGN) * ALIGN
            self.needed = -(-self.needed // ALIGN) * ALIGN + nbytes
            fits = self.array is not None and not self.closed and nbytes and \
                at + nbytes <= len(self.array)
            if fits:
                self.used = at + nbytes
        if not fits:
            return _torch_shared(shape, dtype)
        v = self.array[at:at + nbytes].view(np_dtype).reshape(shape)
        self.count.add(v)
        return torch.from_numpy(v)

    def close(self) -> None:
        """The batch is complete (or abandoned): the slot is freed in this process once its tensors are gone."""
        global _SIZE_HINT
        if self.closed:
            return
        self.closed = True
        if not _SIZE_HINT and 0 < self.needed <= MAX_SLOT_BYTES:
            _SIZE_HINT = self.needed
        if self.array is not None:
            self.count.done()

    def wrap(self, batch: dict) -> dict:
        """The collated batch, as a :class:`SharedBatch` when some of its tensors live in the slot."""
        if self.array is None or not self.used:
            return batch
        out = SharedBatch(batch)
        out._slot = self
        return out


def begin() -> Slot | None:
    """The memory for the next batch of this DataLoader worker, or None outside a worker. Switched off (or without
    ``memfd_create``) a worker's slot has no ring: every tensor gets torch's new shared memory, as before."""
    if torch.utils.data.get_worker_info() is None:
        return None
    return Slot(reuse=enabled())


def _torch_shared(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """As ``default_collate`` allocates a stack inside a worker: new shared memory (crosses without a copy)."""
    try:
        numel = int(np.prod(shape, dtype=np.int64))
        storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
        return torch.empty(0, dtype=dtype).new(storage).view(shape)
    except (AttributeError, RuntimeError, TypeError):  # a torch without these internals: a private tensor
        return torch.empty(shape, dtype=dtype)


class SharedBatch(dict):
    """A collated batch some of whose tensors live in a ring slot (a plain dict to its readers). Pickled (to the
    main process), those tensors travel as offsets into the ring, whose fd goes along."""

    __slots__ = ("_slot", "__weakref__")

    def __reduce_ex__(self, protocol):
        # Slot references only on the way to the main process: a DataLoader worker's queue pickles in its feeder
        # thread. Anything else (copy.deepcopy, torch.save, a queue of the user's own) gets a plain dict, so a copy
        # is a copy and a file holds the values, never a file descriptor of this worker.
        if threading.current_thread().name != "QueueFeederThread":
            return dict, (dict(self),)
        from multiprocessing.reduction import DupFd

        slot = self._slot
        r = slot.ring
        lo = r.base_ptr + slot.s * r.slot_bytes
        hi = lo + r.slot_bytes
        entries = {}
        for k, v in self.items():
            if isinstance(v, torch.Tensor) and v.is_contiguous() and v.numel() and lo <= v.data_ptr() < hi:
                entries[k] = ("slot", v.data_ptr() - lo, tuple(v.shape), str(_np_dtype(v.dtype)))
            else:
                entries[k] = ("value", v)
        if not any(e[0] == "slot" for e in entries.values()):  # e.g. torch moved them to its own shared memory
            return dict, (dict(self),)
        r.main[slot.s] = 1  # before the bytes leave: the main process clears it when its tensors are gone
        return _rebuild, (r.pid, DupFd(r.fd), slot.s, r.slot_bytes, entries)


class _Mapping:
    """The main process's mapping of one worker's ring."""

    def __init__(self, fd: int):
        size = os.fstat(fd).st_size
        self.mm = mmap.mmap(fd, size)
        self.main = np.frombuffer(self.mm, np.uint8, SLOTS, MAIN)
        self.base = np.frombuffer(self.mm, np.uint8, size - HEADER, HEADER)


# Kept while the worker lives (not only while a batch of it is alive: the next batch then needs no new mmap and
# no page-table faults in this process); rings of workers that exited are dropped when a new ring arrives.
_MAPPINGS: dict[tuple, _Mapping] = {}
_MAP_LOCK = threading.Lock()


def _rebuild(pid: int, dupfd, s: int, slot_bytes: int, entries: dict) -> dict:
    """In the main process: the batch as a plain dict whose slot tensors are views of this process's mapping."""
    fd = dupfd.detach()
    try:
        st = os.fstat(fd)
        key = (pid, st.st_dev, st.st_ino)
        with _MAP_LOCK:
            mapping = _MAPPINGS.get(key)
            if mapping is None:
                for k in [k for k in _MAPPINGS if not scratch.pid_alive(k[0])]:
                    del _MAPPINGS[k]  # its batches still alive keep their mapping through their countdown
                mapping = _MAPPINGS[key] = _Mapping(fd)
    finally:
        os.close(fd)
    count = _Countdown(lambda m=mapping, s=s: m.main.__setitem__(s, 0))  # holds the mapping while tensors live
    out: dict[str, Any] = {}
    base = s * slot_bytes
    for k, e in entries.items():
        if e[0] == "slot":
            _, off, shape, dt = e
            dt = np.dtype(dt)
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            v = mapping.base[base + off:base + off + n].view(dt).reshape(shape)
            count.add(v)
            out[k] = torch.from_numpy(v)
        else:
            out[k] = e[1]
    return out
