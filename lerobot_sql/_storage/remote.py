"""Remote datasets: an fsspec filesystem that reads another one (s3, gs, http(s), hf ...) through an on-disk cache.

Only the bytes a reader asks for are fetched, and kept as pieces on disk (:mod:`lerobot_sql._storage.pieces`: one
folder per file version, region locks, LRU eviction bounded by ``cache_size``). Network calls are retried and range
reads pinned to the version of the file first seen (:mod:`lerobot_sql._storage.transport`): a file that changes on
the server mid-run raises :class:`~lerobot_sql.errors.FileChangedError` instead of mixing versions.

Files under ``meta/`` are fetched whole, and the answers of ``info``/``glob`` are stored beside the pieces, so once
a dataset's metadata has been read it opens offline (``LSQL_OFFLINE=1``/``HF_HUB_OFFLINE=1``, or automatically
after the network failed).

Missing pieces of one read, or of a pipelined batch's files, are fetched at once (``ensure_many``), and a Parquet
column scan (the same columns of consecutive row groups, recognised from the cached footer) fetches the next row
groups' chunks ahead (:mod:`lerobot_sql._storage.readahead`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from ..errors import FileChangedError, RemoteIOError, RemoteWarning, warn
from . import cache, transport
from .cache import atomic_write, cache_error, file_lock, parse_size
from .pieces import PieceStore
from .readahead import ColumnReadahead


def _reset_fsspec_loop() -> None:
    """In a forked child: forget fsspec's IO loop, whose thread stayed in the parent.

    fsspec before 2024.3 does not do this itself (no ``register_at_fork``), and ``sync()`` on the parent's loop
    object then waits forever for a thread that does not exist in the child: a DataLoader worker over a remote
    dataset hung on its first read whenever the parent had read over the network before forking (the floor leg,
    fsspec 2024.2). Newer fsspec resets the same two globals itself; doing it twice is harmless.
    """
    import fsspec.asyn

    fsspec.asyn.reset_lock()


os.register_at_fork(after_in_child=_reset_fsspec_loop)

# Each instance is its own protocol (``lsqlremote``, ``lsqlremote1``, ...): DuckDB routes a path to a registered
# filesystem by its protocol alone, so one connection over several remote datasets (a collection) needs one name
# per dataset, each pointing at that dataset's cache.
_INSTANCES = itertools.count()
_OWN_PROTOCOL = re.compile(r"^lsqlremote\d*://")

MAX_READAHEAD = 256 << 10        # sequential readers fetch ahead up to this much (bytes). 4 MiB overshot episode
                                 # ends by MBs when decoding video (5.4x the bytes needed at 480x640) for no fewer
                                 # requests: a decoder's reads are short runs, so the readahead rarely grows past this
MIN_READAHEAD = 64 << 10
WHOLE_PREFIXES = ("meta/",)      # fetched whole: small, read often, needed offline


def _etag_of(pin: dict) -> str | None:
    """The ETag a pin holds: described (strong or weak) or seen first on a range answer."""
    return pin.get("etag") or pin.get("weak_etag") or pin.get("seen_etag")


class RemoteCacheFS(AbstractFileSystem):
    """Read-only fsspec filesystem: ``target`` (any fsspec fs) seen through the on-disk piece cache.

    Paths are ``target``'s own paths (``bucket/ds/meta/info.json``, ``http://host/ds/meta/info.json``), optionally
    prefixed with ``lsqlremote://`` (the protocol under which DuckDB sees this filesystem).

    Args:
        target: the remote filesystem.
        root: the dataset root as ``target`` spells it (files under ``root/meta/`` are fetched whole).
        url: the dataset URL (named in errors).
        cache_dir: the dataset's cache folder; pieces go under ``cache_dir/remote``.
        cache_size: bound on the pieces' total size in bytes (int or ``"20GB"``).
        retries: tries after the first on a retryable error; backoff ``backoff_s * 2**k`` seconds.
        offline: never touch the network (default: ``LSQL_OFFLINE`` or ``HF_HUB_OFFLINE`` set to 1).
        stall_s, min_rate: an HTTP answer may pause ``stall_s`` seconds, then must keep ``min_rate`` bytes/s
            (:func:`lerobot_sql._storage.transport.http_get`).
    """

    protocol = "lsqlremote"
    cachable = False

    def __init__(self, target: Any, root: str, url: str, cache_dir: str | os.PathLike, cache_size: int | str | None = None,
                 retries: int = 4, backoff_s: float = 0.2, offline: bool | None = None,
                 stall_s: float = transport.STALL_S, min_rate: float = transport.MIN_RATE, **kwargs: Any):
        super().__init__(**kwargs)
        n = next(_INSTANCES)
        self.protocol = "lsqlremote" if n == 0 else f"lsqlremote{n}"
        self.stall_s, self.min_rate = float(stall_s), float(min_rate)
        self._ignores_range = False  # the server answered a Range request with the whole file (200): warned once
        self._etags_ok: bool | None = None  # False: the server tags unchanged bytes anew (None: ask the store)
        self._said: set[str] = set()  # the RemoteWarnings said (once per dataset and session)
        self._verify_lock = threading.Lock()  # one 412 checked at a time (_same_bytes_new_etag)
        self.target, self.root, self.url = target, root.rstrip("/"), url
        self.dir = Path(cache_dir) / cache.REMOTE
        self.cache_size = parse_size(cache_size)
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        if offline is None:
            offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("LSQL_OFFLINE", "HF_HUB_OFFLINE"))
        self.offline = bool(offline)
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._stats = {"requests": 0, "bytes_fetched": 0, "bytes_from_cache": 0}
        self._infos: dict[str, dict] = {}
        self._dirs: dict[str, Path] = {}  # path -> its piece folder (the version in _infos, fixed for the session)
        self.pieces = PieceStore(self.dir, self.cache_size)
        self.readahead = ColumnReadahead()

    # ---- plumbing ---------------------------------------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path):
        """The target's path: any instance's ``lsqlremote<n>://`` prefix removed (see ``_INSTANCES``)."""
        if isinstance(path, str):
            path = _OWN_PROTOCOL.sub("lsqlremote://", path, count=1)
        return super()._strip_protocol(path)

    def __reduce__(self):
        # The file infos go along: a DataLoader worker then reads the versions (ETags) its parent pinned, and asks
        # the server nothing before its first range read.
        # So does what the server was found to do: a spawned worker asks a server that ignores Range for whole
        # files at once, pins no ETag of a server whose ETags are unstable, and does not warn again.
        return (_rebuild, (self.target, self.root, self.url, str(self.dir.parent), self.cache_size, self.retries,
                           self.backoff_s, self.offline, dict(self._infos), self.stall_s, self.min_rate,
                           self._ignores_range, set(self._said), self._etags_ok))

    def _fs(self):
        """The target, re-created after a fork (async fsspec filesystems refuse to run in a forked child)."""
        if self._pid != os.getpid():
            t = self.target
            self.target = type(t)(*getattr(t, "storage_args", ()), **getattr(t, "storage_options", {}))
            self._pid = os.getpid()
            self._stats = {"requests": 0, "bytes_fetched": 0, "bytes_from_cache": 0}
            self._lock = threading.RLock()
            self._verify_lock = threading.Lock()
            self.pieces.after_fork()
            self.readahead.after_fork()
        return self.target

    def io_stats(self) -> dict[str, int]:
        """Counters of this process: ``requests`` (network calls, retries included), ``bytes_fetched`` (bytes
        received from the remote), ``bytes_from_cache`` (bytes served from pieces already on disk)."""
        return dict(self._stats)

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self._stats[k] += v

    def _url(self, path: str) -> str:
        rel = self._rel(path)
        return f"{self.url}/{rel}" if rel is not None else path

    def _rel(self, path: str) -> str | None:
        base = self.root + "/"
        return path[len(base):] if path.startswith(base) else None

    def _call(self, what: str, fn, *args: Any, failed: BaseException | None = None):
        """``fn(*args)`` with retries (:func:`lerobot_sql._storage.transport.call`), counted as requests;
        ``failed``: the error of a first try already made and counted."""
        return transport.call(what, fn, *args, retries=self.retries, backoff_s=self.backoff_s,
                              on_attempt=lambda: self._count(requests=1), failed=failed)

    # ---- metadata (persisted for offline use) ---------------------------------------------------------------
    def _store_path(self) -> Path:
        return self.dir / "listing.json"

    def _load_store(self) -> dict:
        try:
            return json.loads(self._store_path().read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"info": {}, "glob": {}}

    def _save_store(self, section: str, key: str, value: Any) -> None:
        self._save_many(section, {key: value})

    def _save_many(self, section: str, items: dict[str, Any]) -> None:
        """One rewrite of the store for many entries (it holds every info: a rewrite per file would be quadratic).

        Raises:
            CacheError: the cache folder cannot be created or written (not a FileNotFoundError: a folder that
                cannot be made is not a dataset file that is missing)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with file_lock(str(self._store_path()) + ".lock"):
                store = self._load_store()
                store.setdefault(section, {}).update(items)
                atomic_write(self._store_path(), json.dumps(store).encode())
        except OSError as e:  # nothing in the block raises our own errors: every OSError is the folder's
            raise cache_error(self.dir, f"cannot write the remote dataset's cache ({e})", first=None,
                              to="a writable folder") from e

    def _meta_op(self, section: str, key: str, fn):
        """Run a listing/info call online, remember its answer on disk; offline (or if it fails), use that answer."""
        if not self.offline:
            try:
                value = self._call(f"{self._url(key)}: {section}", fn)
            except RemoteIOError:
                stored = self._load_store().get(section, {}).get(key)
                if stored is None:
                    raise
                self.offline = True  # the network is gone: stop trying for this session
                return stored
            self._save_store(section, key, value)
            return value
        stored = self._load_store().get(section, {}).get(key)
        if stored is None:
            if section == "info" and key in self._load_store().get("missing", {}):
                raise FileNotFoundError(key)
            raise RemoteIOError(f"{self._url(key)}: offline and never read before; connect once with the network "
                                "to cache the dataset's metadata (unset LSQL_OFFLINE/HF_HUB_OFFLINE)")
        return stored

    def info(self, path, **kwargs):
        known = self._infos.get(path)  # most callers pass the stripped path: spare the protocol regex per read
        if known is not None:
            return known
        path = self._strip_protocol(path)
        if path in self._infos:
            return self._infos[path]

        try:
            info = self._meta_op("info", path, lambda: self._describe(path))
        except FileNotFoundError:
            if not self.offline:
                with contextlib.suppress(OSError):
                    self._save_store("missing", path, True)
            raise
        self._infos[path] = info
        return info

    def _describe(self, path: str) -> dict:
        """One remote ``info`` of ``path`` as the cache keeps it (:func:`transport.describe`), no retries; without
        its ETag when the server's ETags were found unstable (:meth:`_same_bytes_new_etag`).

        An HTTP file without validators (no strong ETag, no Last-Modified) is said once per session
        (:class:`RemoteWarning`): its cached bytes cannot be revalidated."""
        fs = self._fs()
        out = transport.describe(fs, path, url=self._url(path), trust_etag=self._etags_trusted(),
                                 stall_s=self.stall_s, min_rate=self.min_rate)
        if transport.protocol(fs) in ("http", "https") and out.get("type") == "file" \
                and not (out.get("etag") or out.get("last_modified")):
            self._say("validators", f"{self.url}: the server gives no validators (no strong ETag, no Last-Modified; "
                      f"first: {self._url(path)}), so cached bytes cannot be revalidated: a file changed on the "
                      "server with the same size and the same first and last 64 KiB keeps being served from the "
                      "cache, and a change during a session is noticed only if its range answers carry an ETag or "
                      "a Last-Modified. Serve the dataset from a server that "
                      "sends ETag or Last-Modified (a static file server, S3, the Hub), or delete the dataset's "
                      f"cache folder ({self.dir.parent}) after it changes (said once)")
        return out

    def _say(self, what: str, message: str) -> None:
        """A :class:`RemoteWarning`, once per ``what`` for this dataset and session (workers inherit what was said)."""
        with self._lock:
            if what in self._said:
                return
            self._said.add(what)
        warn(message, RemoteWarning)

    # ---- a 412 is checked before it is believed ----------------------------------------------------------------
    def _etags_trusted(self) -> bool:
        """False once this dataset's server was found to tag unchanged bytes with new ETags, in this session or an
        earlier one (remembered in the store): its files are then pinned and keyed without their ETags."""
        if self._etags_ok is None:
            try:
                self._etags_ok = not self._load_store().get("server", {}).get("etags_unstable", False)
            except OSError:  # an unreadable cache folder: its CacheError comes from the first write, named
                return True
        return self._etags_ok

    def _same_bytes_new_etag(self, path: str, pin: dict, err: BaseException) -> bool:
        """Whether the 412 ``err`` of a read of ``path`` pinned by ``pin`` (its ETag) came for unchanged bytes: True
        when the server, asked again, gives the same size and the same Last-Modified (or none, as before), and the
        bytes this session holds of the file (its first and last cached piece, 64 KiB of each at most, fetched again
        without conditions) are the server's now. The ETags are then unstable (a farm of servers tagging the same
        file differently made every remote dataset fail at connect): said once (:class:`RemoteWarning`), every
        pin of this dataset drops its ETag (Last-Modified then pins, or nothing), the store remembers it for later
        sessions (their cache keys leave the ETag out), and the caller reads again. Otherwise the file changed:
        False, the caller raises ``err``.

        Raises:
            RemoteIOError: the server could not be asked again (after retries).
        """
        if not _etag_of(pin) or not isinstance(err, FileChangedError) \
                or getattr(err.__cause__, "kind", "etag") != "etag" \
                or not transport.precondition_failed(err) \
                or transport.protocol(self._fs()) not in ("http", "https"):
            # pinned by Last-Modified or a version id, a change of size, or an object store's ETag (a hash of the
            # content, the same on every node): a change
            return False
        with self._verify_lock:
            now_pin = self._infos.get(path, pin)
            if not _etag_of(now_pin):
                return True  # another thread found the ETags unstable meanwhile: read again with the new pin
            fs, url, size = self._fs(), self._url(path), pin.get("size")
            try:
                now = self._call(f"{url}: info", transport.info_with_validators, fs, path)
            except FileNotFoundError:  # gone from the server: a change
                return False
            if now.get("size") != size or transport.version_of(now).get("last_modified") != pin.get("last_modified"):
                return False
            fdir = self._file_dir(path)
            held = self.pieces.scan(fdir)
            spans = dict.fromkeys([(held[0][0], min(held[0][1], held[0][0] + transport.CHECK_BYTES)),
                                   (max(held[-1][0], held[-1][1] - transport.CHECK_BYTES), held[-1][1])]
                                  if held else [])
            # the answers compared carry the validators this file's range answers first carried: a Last-Modified
            # seen then and changed now is a change, whatever the bytes held say
            check = {"size": size, "seen_etag": None, "seen_last_modified": pin.get("seen_last_modified")}
            for a, b in spans:
                try:
                    mine = self.pieces.assemble(fdir, path, a, b)
                except FileNotFoundError:  # evicted meanwhile: nothing of it can be mixed in any more
                    continue
                try:
                    data, whole = self._call(f"{url}: bytes {a}-{b}", lambda a, b: transport.pinned_get(
                        fs, path, a, b, check, url=url, stall_s=self.stall_s, min_rate=self.min_rate), a, b)
                except FileChangedError:
                    return False
                self._count(bytes_fetched=len(data))
                if (data[a:b] if whole else data) != mine:
                    return False
            if not self._tags_rotate(fs, path, url):
                # The bytes held may be too few to tell a farm's other tag from a new file (an mp4 pinned at dataset()
                # and replaced before its first read: nothing held, no Last-Modified; hostile review 15, F1), or not
                # where the change is (the head and the tail of a file changed in its middle; 16, F3): unstable ETags
                # are believed only when the server also tags answers in a row differently; otherwise a change
                return False
            self._etags_ok = False
            with contextlib.suppress(OSError):  # the next session would find it again: bytes, never wrong data
                self._save_store("server", "etags_unstable", True)
            for p, info in list(self._infos.items()):  # and no ETag its answers carry is learned any more
                self._infos[p] = {**{k: v for k, v in info.items() if k not in ("etag", "weak_etag")},
                                  "seen_etag": None, "seen_last_modified": None}
            lm = pin.get("last_modified")
            self._say("etags", f"{self.url}: the server's ETags change for unchanged bytes ({url} was refused "
                      f"under its ETag {_etag_of(pin)} while its size, Last-Modified and the bytes this session holds "
                      "are unchanged: servers behind one name that tag files differently). Its files are pinned by "
                      + ("Last-Modified instead, and cached without their ETags (said once)" if lm else
                         "nothing from now on (it gives no Last-Modified either): a change during the session is "
                         "not noticed (said once)"))
            return True

    def _tags_rotate(self, fs, path: str, url: str, asks: int = 3) -> bool:
        """Whether ``asks`` answers in a row about ``path`` carry more than one ETag (a farm's nodes tagging the same
        file differently): the proof of unstable ETags that the bytes held alone cannot give."""
        heads, gets = set(), set()
        for _ in range(asks):  # HEAD answers and range answers (a server may tag only one kind)
            i = self._call(f"{url}: info", transport.info_with_validators, fs, path)
            heads.add(i.get("ETag") or i.get("etag"))
            seen: dict = {}
            self._call(f"{url}: bytes 0-1", lambda into: transport.http_get(
                fs, path, 0, 1, {}, None, url=url, stall_s=self.stall_s, min_rate=self.min_rate, pinned=into,
                headers_only=True), seen)
            gets.add(seen.get("seen_etag"))
            if len(heads - {None}) > 1 or len(gets - {None}) > 1:
                return True
        return False

    def describe_many(self, paths) -> int:
        """Ask for the infos (size, version pin) of the ``paths`` not known yet, in parallel (one round trip for up to
        ``transport.FETCH_THREADS`` files); returns how many were described.

        Why: DataLoader workers inherit this process's infos (forked, or pickled by ``__reduce__``). A file the
        parent never described is described by each worker on its first read, sequentially, one round trip each
        (~10 per worker and epoch over multifile60's mp4s, 20 ms each, and the store rewritten each time), and two
        workers could pin two versions of a file that changed between their first reads. Best effort: a file that
        fails is left for its first read to raise (typed, with its name); offline, nothing is asked.
        """
        todo = [p for p in dict.fromkeys(self._strip_protocol(p) for p in paths) if p not in self._infos]
        if not todo or self.offline:
            return 0

        def one(path: str) -> dict:
            return self._call(f"{self._url(path)}: info", self._describe, path)

        got = {p: v for p, (v, err) in zip(todo, transport.fetch_each(one, todo)) if err is None}
        if got:
            with contextlib.suppress(OSError):  # the store serves offline sessions; the infos stand without it
                self._save_many("info", got)
            for p, v in got.items():
                self._infos.setdefault(p, v)  # a version another thread pinned meanwhile stays pinned
        return len(got)

    def exists(self, path, **kwargs):
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    def glob(self, path, **kwargs):
        path = self._strip_protocol(path)
        if not any(c in path for c in "*?["):  # DuckDB globs every file it opens; HTTP would GET it whole
            return [path] if self.exists(path) else []
        return list(self._meta_op("glob", path, lambda: sorted(self._fs().glob(path))))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        names = self._meta_op("ls", path, lambda: sorted(self._fs().ls(path, detail=False)))
        return [self.info(n) for n in names] if detail else list(names)

    def modified(self, path):
        """A datetime that changes when the content does (DuckDB keys its Parquet metadata cache on it): derived
        from the file's identity, since object stores' mtimes are not content versions."""
        import datetime
        import hashlib

        h = int.from_bytes(hashlib.sha256(self.info(path)["identity"].encode()).digest()[:4], "big")
        return datetime.datetime.fromtimestamp(1_000_000_000 + h, tz=datetime.timezone.utc)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise PermissionError(f"{self._url(path)}: remote datasets are read-only here (mode {mode!r})")
        return RemoteFile(self, self._strip_protocol(path))

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        size = self.info(path)["size"]
        start = 0 if start is None else (start + size if start < 0 else start)
        end = size if end is None else (end + size if end < 0 else end)
        return self.read_range(path, start, end)

    # ---- bytes through the piece store ------------------------------------------------------------------------
    def _file_dir(self, path: str) -> Path:
        d = self._dirs.get(path)
        if d is None:  # a hash and a Path per call otherwise, several per read
            d = self._dirs[path] = self.pieces.folder(path, self.info(path)["identity"])
        return d

    def _whole(self, path: str) -> bool:
        rel = self._rel(path)
        return rel is not None and rel.startswith(WHOLE_PREFIXES)

    def missing(self, path: str, start: int, end: int) -> list[tuple[int, int]]:
        """Byte ranges of ``[start, end)`` of ``path`` not in the cache (as this process last saw it)."""
        return self.pieces.missing(self._file_dir(path), start, end)

    def ensure(self, path: str, start: int, end: int) -> int:
        """Fetch whatever of ``[start, end)`` is not cached yet; returns the bytes fetched.

        Raises:
            RemoteIOError: the remote failed after retries (nothing partial is left in the cache).
        """
        return self.ensure_ranges(path, [(start, end)])

    def ensure_ranges(self, path: str, ranges: list[tuple[int, int]]) -> int:
        """Fetch whatever of ``ranges`` (``[start, end)`` byte ranges) of ``path`` is not cached yet
        (:meth:`ensure_many` of one file); returns the bytes fetched."""
        return self.ensure_many([(path, ranges)])

    def ensure_many(self, jobs: list[tuple[str, list[tuple[int, int]]]]) -> int:
        """Fetch whatever of each ``(path, ranges)`` is not cached yet, every missing piece of every file in one
        round (:meth:`_fetch_gaps`: one request per gap, at most ``transport.FETCH_THREADS`` at once); returns the
        bytes fetched.

        Raises:
            RemoteIOError: the remote failed after retries (the pieces that did arrive are kept; nothing partial).
            FileChangedError: a file changed on the server since this session first read it.
        """
        want: dict[str, list[tuple[int, int]]] = {}
        for path, ranges in jobs:
            path = self._strip_protocol(path)
            size = self.info(path)["size"]
            # A server that ignored Range once answers every range with the whole file: ask for it once, not once
            # per range of a round (each would bring the whole file); files over WHOLE_MAX still raise per range.
            if self._whole(path) or (self._ignores_range and size <= transport.WHOLE_MAX):
                ranges = [(0, size)]
            ranges = [(max(0, a), min(b, size)) for a, b in ranges if min(b, size) > max(0, a)]
            want.setdefault(path, []).extend((a, b) for a, b in ranges if self.missing(path, a, b))
        todo = [(path, rs) for path, rs in want.items() if rs]
        if not todo:
            return 0
        return self.pieces.fill_many([(self._file_dir(path), rs) for path, rs in todo],
                                     lambda gaps: self._fetch_gaps([(todo[j][0], a, b) for j, a, b in gaps]))

    def _fetch_gaps(self, spans: list[tuple[str, int, int]]) -> list[tuple[Any, Any]]:
        """Bytes ``[a, b)`` of each ``(path, a, b)``: ``(data, None)`` or ``(None, exception)`` per span, in order.

        Several spans over HTTP(S) are first tried in one round on fsspec's IO loop
        (:func:`lerobot_sql._storage.transport.pinned_get_many`); a span whose try failed is then retried by
        itself (:meth:`_call` with ``failed=``, in threads), so retries, their count and the errors raised are
        those of a single read. Other protocols: one thread per span (:func:`transport.fetch_each`).
        """
        if self.offline:
            path, a, b = spans[0]
            raise RemoteIOError(f"{self._url(path)}: bytes {a}-{b} are not cached and the session is "
                                "offline; reconnect with the network, or prefetch before going offline")

        def what(path: str, a: int, b: int) -> str:
            return f"{self._url(path)}: bytes {a}-{b}"

        first = None
        if len(spans) > 1:
            pins = [self.info(p) for p, _a, _b in spans]
            first = transport.pinned_get_many(self._fs(), [(p, a, b, pin, self._url(p))
                                                           for (p, a, b), pin in zip(spans, pins)],
                                              stall_s=self.stall_s, min_rate=self.min_rate)
        if first is None:
            return transport.fetch_each(lambda span: self._call(what(*span), self._get, *span), spans)
        out: list[tuple[Any, Any]] = []
        for (path, a, b), (got, err) in zip(spans, first):
            self._count(requests=1)
            if err is None:
                try:
                    out.append((self._accept(path, a, b, *got), None))
                    continue
                except Exception as e:  # noqa: BLE001 - a short answer (Truncated): retried as in _call
                    err = e
            out.append((None, err))
        again = [i for i, (_, err) in enumerate(out) if err is not None]

        def retry(i: int) -> bytes:
            err = out[i][1]
            if isinstance(err, FileChangedError):  # a 412 of the round: checked before it is believed, as in _get
                if not self._same_bytes_new_etag(spans[i][0], pins[i], err):
                    raise err
                err = None
            return self._call(what(*spans[i]), self._get, *spans[i], failed=err)

        redo = transport.fetch_each(retry, again) if again else []
        for i, r in zip(again, redo):
            out[i] = r
        return out

    def _get(self, path: str, a: int, b: int) -> bytes:
        """Bytes [a, b) of the version of ``path`` this session first saw (its ``info``), pinned by the protocol's
        entry in :data:`lerobot_sql._storage.transport.PINNERS`.

        A 412 is checked before it is believed (:meth:`_same_bytes_new_etag`): an ETag that changed for unchanged
        bytes is not a change; the read is then made again under the new pin.

        Raises:
            FileChangedError: the file changed on the server (HTTP 412 / S3 PreconditionFailed).
            transport.Truncated: fewer bytes than asked for (retried by the caller).
        """
        fs, pin = self._fs(), self.info(path)
        try:
            data, whole = transport.pinned_get(fs, path, a, b, pin, url=self._url(path), stall_s=self.stall_s,
                                               min_rate=self.min_rate)
        except FileChangedError as e:
            if not self._same_bytes_new_etag(path, pin, e):
                raise
            data, whole = transport.pinned_get(fs, path, a, b, self.info(path), url=self._url(path),
                                               stall_s=self.stall_s, min_rate=self.min_rate)
        return self._accept(path, a, b, data, whole)

    def _accept(self, path: str, a: int, b: int, data: bytes, whole: bool) -> bytes:
        """The bytes [a, b) of an answer (``whole``: the server sent the whole file, which is then kept), counted.

        Raises:
            transport.Truncated: fewer bytes than asked for (retried by the caller).
        """
        self._count(bytes_fetched=len(data))  # a whole file: all of it crossed the link, not only [a, b)
        if whole:  # the server ignores Range: keep the whole file, so no later read (or retry) fetches it again
            if not self._ignores_range:  # once per dataset: the server, not the file, ignores Range
                self._ignores_range = True

                warn(f"{self._url(path)}: the server ignores Range requests (it answered 200 with the whole file); "
                     f"fetched the whole file ({len(data)} bytes) once into the cache, as every file of this "
                     "dataset it serves will be (said once)", RemoteWarning)
            self.pieces.store_whole(self._file_dir(path), data)
            data = data[a:b]
        if len(data) != b - a:
            raise transport.Truncated(f"got {len(data)} of {b - a} bytes")
        return data

    def read_range(self, path: str, start: int, end: int, readahead: int = 0) -> bytes:
        """Bytes ``[start, end)`` of ``path``, fetching what is missing (plus up to ``readahead`` bytes after ``end``)."""
        path = self._strip_protocol(path)
        size = self.info(path)["size"]
        end = min(end, size)
        if start >= end:
            return b""
        for _ in range(3):
            fetched = 0
            if self.missing(path, start, end):
                fetched = self.ensure_ranges(path, [(start, min(size, max(end, start + readahead)))]
                                             + self._column_readahead(path, start, end, size))
            try:
                data = self._assemble(path, start, end)
            except FileNotFoundError:  # a piece was evicted by another process between listing and reading
                self.pieces.scan(self._file_dir(path))
                continue
            self._count(bytes_from_cache=max(0, len(data) - fetched))
            return data
        raise RemoteIOError(f"{self._url(path)}: bytes {start}-{end} keep disappearing from the cache; cache_size "
                            f"({self.cache_size} bytes) is too small for the readers sharing it, raise it")

    def _assemble(self, path: str, start: int, end: int) -> bytes:
        return self.pieces.assemble(self._file_dir(path), path, start, end)

    def _column_readahead(self, path: str, start: int, end: int, size: int) -> list[tuple[int, int]]:
        """The next row groups' chunks of a Parquet column scan (:meth:`ColumnReadahead.ranges`); none for the
        files fetched whole."""
        if self._whole(path):
            return []

        def cached(a: int, b: int) -> bytes | None:
            return None if self.missing(path, a, b) else self._assemble(path, a, b)

        return self.readahead.ranges(path, start, end, size, cached)

    def cached_bytes(self) -> int:
        """Total size of the pieces on disk (all processes)."""
        return self.pieces.cached_bytes()


def _rebuild(target, root, url, cache_dir, cache_size, retries, backoff_s, offline, infos=None,
             stall_s=transport.STALL_S, min_rate=transport.MIN_RATE, ignores_range=False, said=(), etags_ok=None):
    fs = RemoteCacheFS(target, root, url, cache_dir, cache_size, retries=retries, backoff_s=backoff_s, offline=offline,
                       stall_s=stall_s, min_rate=min_rate)
    fs._infos.update(infos or {})
    fs._ignores_range = bool(ignores_range)
    fs._said, fs._etags_ok = set(said), etags_ok
    return fs


class RemoteFile(AbstractBufferedFile):
    """A read-only file of :class:`RemoteCacheFS`. Sequential readers (PyAV, DuckDB) get a growing readahead
    (64 KiB doubling to 256 KiB, reset by a seek), so a stream is fetched in few requests without overshooting much.

    The position (and the readahead state) is kept per thread: DuckDB reads one handle from several threads at once,
    each as ``seek(location)`` then ``read(n)`` in two calls, so with one shared position a thread could read at the
    place another thread just sought to. A thread that never sought starts where the file's last user left it."""

    def __init__(self, fs: RemoteCacheFS, path: str):
        self._tls = threading.local()
        self._last = (0, -1, 0)  # (loc, next, readahead) of the last thread to move: a new thread starts there
        super().__init__(fs, path, mode="rb", block_size=0, cache_type="none", size=fs.info(path)["size"])

    def _state(self) -> list:
        st = getattr(self._tls, "st", None)
        if st is None:
            st = self._tls.st = list(self._last)
        return st

    @property
    def loc(self) -> int:
        return self._state()[0]

    @loc.setter
    def loc(self, value: int) -> None:
        st = self._state()
        st[0] = value
        self._last = tuple(st)

    def _fetch_range(self, start: int, end: int) -> bytes:
        st = self._state()
        if start == st[1]:
            st[2] = min(max(st[2] * 2, MIN_READAHEAD), MAX_READAHEAD)
        else:
            st[2] = 0
        st[1] = end
        return self.fs.read_range(self.path, start, end, readahead=end - start + st[2])
