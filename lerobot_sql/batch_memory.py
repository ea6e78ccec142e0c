"""Batch memory of DataLoader workers: shared-memory slots reused from batch to batch.

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

SLOTS = 8  # per worker: prefetch_factor (2) batches queued + one being built + those the main process still holds
HEADER = 4096  # "worker holds" bytes at [0, SLOTS), "main holds" bytes at [64, 64 + SLOTS)
MAIN = 64
ALIGN = 64
MAX_SLOT_BYTES = 1 << 30  # a batch above 1 GiB keeps torch's allocation (the ring would pin SLOTS of them)


def enabled() -> bool:
    """Whether workers reuse batch memory: Linux (``os.memfd_create``) and ``LSQL_BATCH_MEMORY`` not off.

    Raises:
        ValueError: ``LSQL_BATCH_MEMORY`` is set to something other than 1/true/yes/on or 0/false/no/off.
    """
    v = os.environ.get("LSQL_BATCH_MEMORY", "1").strip().lower()
    if v not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(f"LSQL_BATCH_MEMORY={os.environ['LSQL_BATCH_MEMORY']!r}: use 1 (reuse workers' batch "
                         "memory, the default) or 0 (new shared memory per batch, as torch's collate)")
    return hasattr(os, "memfd_create") and v in ("1", "true", "yes", "on")


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rebuild(pid: int, dupfd, s: int, slot_bytes: int, entries: dict) -> dict:
    """In the main process: the batch as a plain dict whose slot tensors are views of this process's mapping."""
    fd = dupfd.detach()
    try:
        st = os.fstat(fd)
        key = (pid, st.st_dev, st.st_ino)
        with _MAP_LOCK:
            mapping = _MAPPINGS.get(key)
            if mapping is None:
                for k in [k for k in _MAPPINGS if not _alive(k[0])]:
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
