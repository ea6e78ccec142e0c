"""Where a dataset lives: a root on some fsspec filesystem, and how to name, open and identify its files.

Everything above this module speaks of paths relative to the dataset root (``data/chunk-000/file-000.parquet``).
Roots may be local paths, any fsspec URL (``s3://``, ``gs://``, ``http(s)://``, ...) or a Hugging Face Hub dataset
(``hf://datasets/<org>/<name>[@revision]`` or plain ``<org>/<name>``; which revision: :mod:`lerobot_sql._storage.hub`).
Remote roots are read through :class:`lerobot_sql._storage.remote.RemoteCacheFS`: byte ranges on demand, cached on
disk.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from typing import Any

import fsspec

from ..errors import DatasetFormatError, LeRobotSQLError, MissingFileError
from . import cache, hub
from .mp4 import PayloadFreeMP4
from .remote import RemoteCacheFS
from .transport import identity_of

_GLOB_CHARS = re.compile(r"([*?[])")


def glob_escape(path: str) -> str:
    """``path`` with its glob characters (``*``, ``?``, ``[``) bracketed, so fsspec's glob and DuckDB's file
    expansion read it as the literal name: a root folder named ``a*`` or ``run[1]`` is a folder, not a pattern
    (unescaped, ``a*`` took a sibling ``ab``'s files and ``run[1]`` matched nothing)."""
    return _GLOB_CHARS.sub(r"[\1]", path)


def confine(rel: str, origin: str | None = None) -> str:
    """The one check that a relative path from a dataset's metadata stays inside the dataset root; returns ``rel``.

    Refused: any ``..`` segment (even one that ``normpath`` would fold back inside: through a symlinked folder the
    OS resolves ``link/..`` physically, not lexically), a NUL character, and a URL (``scheme://``). A leading ``/``
    is read relative to the root, as :meth:`Source.path` always has. Cheap (two substring tests on the common
    path), so it runs on every path the readers resolve, local and remote.

    Args:
        rel: the path relative to the root, as built from info.json templates, camera keys or meta/episodes.
        origin: what produced it (``meta/info.json 'video_path' ... with camera ...``), for the message.

    Raises:
        DatasetFormatError: naming the path, its origin, and the fix.
    """
    if ".." in rel or "\0" in rel or "://" in rel:
        segs = rel.replace("\\", "/").split("/")
        if ".." in segs or "\0" in rel or "://" in rel:
            src = f" (from {origin})" if origin else " (built from the dataset's metadata: info.json's data_path / " \
                                                     "video_path, a camera key, or meta/episodes)"
            raise DatasetFormatError(f"{rel!r}{src} leaves the dataset root or is not a plain relative path; "
                                     "lerobot_sql reads only files under the root. Fix the template or key in "
                                     "meta/info.json")
    return rel


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset root on a filesystem.

    Attributes:
        fs: the fsspec filesystem holding the dataset (a :class:`~lerobot_sql._storage.remote.RemoteCacheFS` when remote).
        root: the root path as ``fs`` spells it (no protocol for local paths).
        url: the root as the user gave it, normalised (Hub roots carry their resolved revision); part of every
            cache key.
    """

    fs: Any
    root: str
    url: str
    _listing: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # rel -> None once check_link passed (a local file's symlinks resolved once per file per process).
    _links: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def is_local(self) -> bool:
        return _is_local_fs(self.fs)

    def path(self, rel: str) -> str:
        """The filesystem path of ``rel`` (relative to the root).

        Raises:
            DatasetFormatError: ``rel`` would leave the root (see :func:`confine`).
        """
        return f"{self.root.rstrip('/')}/{confine(rel).lstrip('/')}"

    def duckdb_path(self, rel: str) -> str:
        """The path DuckDB should read: a plain local path, or a ``protocol://`` URL for a registered fsspec fs."""
        if self.is_local:
            return self.path(rel)
        proto = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"{proto}://{self.path(rel)}"

    def exists(self, rel: str) -> bool:
        """True if ``rel`` is a file or a folder under the root (on HTTP, given a listing: a file it names, or a
        folder holding one; else the filesystem's answer for a file)."""
        files = self._listing.get("files")
        if files is not None:
            rel = rel.strip("/")
            if rel in files or any(f.startswith(rel + "/") for f in files):
                return True
        return self.fs.exists(self.path(rel))

    def glob(self, pattern: str) -> list[str]:
        """Paths relative to the root matching ``pattern``, sorted (the order lerobot concatenates files in).

        Plain HTTP has no directory listing: there the file list given by :meth:`set_listing` (the metadata's, see
        :func:`lerobot_sql._format.listing.list_files`) is matched against ``pattern``.

        Raises:
            LeRobotSQLError: an HTTP root that was given no listing.
        """
        if self.is_http:
            return sorted(f for f in self.listed_files() if fnmatch.fnmatchcase(f, pattern))
        base = self.root.rstrip("/") + "/"
        hits = self.fs.glob(glob_escape(base) + confine(pattern).lstrip("/"))
        return sorted(h[len(base):] if h.startswith(base) else h.split(base, 1)[-1] for h in hits)

    @property
    def is_http(self) -> bool:
        """True for a plain HTTP(S) root, whose filesystem cannot list folders."""
        target = self.fs.target if isinstance(self.fs, RemoteCacheFS) else self.fs
        proto = target.protocol if isinstance(target.protocol, str) else target.protocol[0]
        return proto in ("http", "https")

    def set_listing(self, files) -> None:
        """Give this root its file list (paths relative to the root): where the filesystem cannot list (HTTP),
        :meth:`exists` and :meth:`glob` answer from it. Set once per open, by
        :func:`lerobot_sql._format.layout.load_layout` from :func:`lerobot_sql._format.listing.list_files`."""
        self._listing["files"] = sorted(files)

    def listed_files(self) -> list[str]:
        """The file list given by :meth:`set_listing`, sorted.

        Raises:
            LeRobotSQLError: none was given (an HTTP root opened without :func:`lerobot_sql._format.layout.load_layout`).
        """
        files = self._listing.get("files")
        if files is None:
            raise LeRobotSQLError(f"{self.url}: plain HTTP cannot list folders and this root was given no file "
                                  "list; open it with lerobot_sql.connect() (load_layout lists the files its "
                                  "metadata names)")
        return files

    def open(self, rel: str, mode: str = "rb"):
        """Open ``rel``; a missing file raises :class:`MissingFileError` naming it, a symlink leaving the dataset
        :class:`DatasetFormatError` (see :meth:`check_link`).

        Parquet read through this (Python) file object is read with ``use_threads=False``: Arrow wraps each chunk
        read in a buffer that holds a Python object, and a decode on Arrow's thread pool may drop the last one in a
        pool thread after the read has returned. If the interpreter is exiting by then, that thread is killed inside
        a C++ destructor and the process aborts ("terminate called without an active exception", SIGABRT)."""
        self.check_link(rel)
        try:
            return self.fs.open(self.path(rel), mode)
        except FileNotFoundError as e:
            raise MissingFileError(f"{self.path(rel)}: file not found (referenced by the dataset's metadata)") from e

    def open_demux(self, rel: str):
        """A file object for *demuxing only* an mp4: the container's boxes are real, the media payload (``mdat``)
        reads as zeros. PyAV then reports every packet's pts, position and size after fetching only the ``moov``
        box; packet flags that depend on the payload (keyframe for H.264) must be taken from
        ``stream.index_entries`` instead. Local files are opened as they are."""
        if self.is_local:
            return self.open(rel)
        return PayloadFreeMP4(self.open(rel), lambda a, b: bool(self.missing(rel, [(a, b)])),
                              lambda a, b: self.fetch(rel, [(a, b)]))

    def size(self, rel: str) -> int:
        """Bytes of the file ``rel``: a stat of a local file (its symlinks checked, see :meth:`check_link`), the
        remote ``info`` (remembered for the session, offline from the cache) of a remote one.

        Raises:
            MissingFileError: the file does not exist (a FileNotFoundError).
            DatasetFormatError: the local file is a symlink leaving the dataset.
            RemoteIOError: the remote could not be asked.
        """
        p = self.path(rel)
        try:
            if self.is_local:
                self.check_link(rel)
                return int(os.stat(p).st_size)
            return int(self.fs.info(p)["size"])
        except FileNotFoundError as e:
            raise MissingFileError(f"{p}: file not found (referenced by the dataset's metadata)") from e

    def fetch(self, rel: str, ranges: list[tuple[int, int]]) -> int:
        """Fetch byte ranges ``[start, end)`` of a remote file into the cache in one parallel call, before a reader
        (pyarrow, PyAV) asks for them one round trip at a time. Local files (and filesystems without a cache):
        nothing to do. Returns the bytes fetched.

        Raises:
            RemoteIOError: the remote failed after retries (the ranges that did arrive stay cached).
        """
        return self.fetch_many([(rel, ranges)])

    def fetch_many(self, jobs: list[tuple[str, list[tuple[int, int]]]]) -> int:
        """:meth:`fetch` of several files, ``(rel, ranges)`` each, in one round: every missing range of every file
        requested at once (a pipelined batch's row-group file and mp4s). Returns the bytes fetched.

        Raises:
            RemoteIOError: the remote failed after retries (the ranges that did arrive stay cached).
        """
        if not isinstance(self.fs, RemoteCacheFS):
            return 0
        jobs = [(self.path(rel), sorted(rs)) for rel, rs in jobs if rs]
        return self.fs.ensure_many(jobs) if jobs else 0

    def describe(self, rels) -> int:
        """Pin the version (size, ETag or equivalent) of each remote file ``rels`` names that this process has not
        read yet, in one parallel round, so that DataLoader workers forked or pickled from here read those versions
        and ask the server nothing first (:meth:`RemoteCacheFS.describe_many`). Returns how many were described;
        0 for local roots, offline sessions and files already known. A file that fails is left for its first read
        to raise."""
        if not isinstance(self.fs, RemoteCacheFS):
            return 0
        return self.fs.describe_many([self.path(r) for r in rels])

    def missing(self, rel: str, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The byte ranges of ``ranges`` (``[start, end)`` each) of ``rel`` that are not in the cache yet, in the
        order asked; ``[]`` for local files (and filesystems without a cache)."""
        if not isinstance(self.fs, RemoteCacheFS):
            return []
        p = self.path(rel)
        return [g for a, b in ranges for g in self.fs.missing(p, a, b)]

    def io_stats(self) -> dict[str, int]:
        """Counters of this process for this root: ``requests`` (network calls, retries included),
        ``bytes_fetched`` (received from the remote), ``bytes_from_cache`` (served from the cache); zeros for a
        local root."""
        if not isinstance(self.fs, RemoteCacheFS):
            return {"requests": 0, "bytes_fetched": 0, "bytes_from_cache": 0}
        return self.fs.io_stats()

    def local_path(self, rel: str) -> str | None:
        """An OS path for ``rel`` when the file is local (PyAV and mmap then read it directly), else None.

        Raises:
            DatasetFormatError: the local file is a symlink leaving the dataset (see :meth:`check_link`).
        """
        if not self.is_local:
            return None
        self.check_link(rel)
        return self.path(rel)

    def _link_dirs(self) -> tuple[str, ...]:
        """Where a local dataset's files may really live, each ending in '/': the root's real path, and for a
        Hugging Face hub cache snapshot (``<repo>/snapshots/<rev>[/sub]``) the real path of ``<repo>/blobs``."""
        if ("dirs",) not in self._links:  # a tuple key: never a relative path
            inside = [os.path.realpath(self.root).rstrip("/") + "/"]
            parts = os.path.abspath(self.root).split("/")
            if "snapshots" in parts:  # <repo>/snapshots/<rev>[/sub]: the repo's blobs folder holds the real files
                repo = "/".join(parts[:len(parts) - 1 - parts[::-1].index("snapshots")])
                blobs = os.path.realpath(os.path.join(repo, "blobs"))
                if os.path.isdir(blobs):
                    inside.append(blobs.rstrip("/") + "/")
            self._links[("dirs",)] = tuple(inside)
        return self._links[("dirs",)]

    def link_target(self, path: str) -> tuple[str, bool]:
        """The one rule for symlinks in a local dataset, for SQL and the Python readers alike: (real path of
        ``path``, whether reading it is allowed). Allowed: no symlink on the way, or a real path inside the root or
        the hub-cache repo's ``blobs/`` folder (see :meth:`_link_dirs`). ``path`` is an OS path under the root.
        Costs a ``realpath`` (an lstat per path component)."""
        target = os.path.realpath(path)
        if target == os.path.abspath(path):
            return target, True
        return target, any(target.startswith(d) for d in self._link_dirs())

    def check_link(self, rel: str) -> None:
        """Refuse to read ``rel`` when it is (or lies under) a symlink whose target is outside the dataset (the
        rule of :meth:`link_target`, the same one the SQL sandbox applies through :meth:`symlink_targets`).

        Local roots only (remote filesystems have no symlinks); each file is resolved once per process (the
        verdict is remembered on this Source), so the readers can call it at every open.

        Raises:
            DatasetFormatError: naming the file, its target, and the fix.
        """
        if rel in self._links or not self.is_local:
            return
        p = self.path(rel)
        target, ok = self.link_target(p)
        if not ok:
            raise DatasetFormatError(f"{p}: is a symlink to {target}, outside the dataset root and outside the "
                                     "hub cache's blobs/ folder; lerobot_sql reads only the dataset's own files. "
                                     "Copy the file into the dataset folder (or re-download the dataset)")
        self._links[rel] = None

    def symlink_targets(self) -> tuple[list[str], list[str]]:
        """(allowed, refused): the real paths of the files under a local root that are symlinks to files outside it.

        A Hugging Face hub cache (``huggingface_hub.snapshot_download``) is ``<repo>/snapshots/<rev>/...`` where
        every file is a symlink into ``<repo>/blobs/<hash>``. DuckDB's sandbox checks the resolved path, so those
        blobs must be allowed one by one (``allowed_paths``) for SQL to read the dataset. Only targets that
        :meth:`link_target` allows (inside the dataset root or the ``blobs`` folder of the hub-cache repo holding
        the root) are allowed; a symlink to anything else (``/etc/passwd``, another folder) is ``refused`` (its
        path under the root) and stays unreadable to SQL, as :meth:`check_link` keeps it from the Python readers.
        A symlinked folder is never allowed (its files are not listed); one that points outside is ``refused``.
        Remote roots: ([], []). One walk of the root (a stat per entry), at connection time only.
        """
        if not self.is_local:
            return [], []
        allowed, refused = [], []
        for folder, dirs, files in os.walk(self.root):
            for name in files + dirs:
                p = os.path.join(folder, name)
                if not os.path.islink(p):
                    continue
                target, ok = self.link_target(p)
                if not os.path.isfile(target):
                    # A symlinked folder: os.walk does not enter it and DuckDB lists it as a path (so it is never
                    # allowed); one pointing outside is reported like a file, since SQL and the readers refuse it.
                    if not ok and os.path.isdir(target):
                        refused.append(p)
                    continue
                if ok:
                    allowed.append(target)
                else:
                    refused.append(p)
        return sorted(set(allowed)), refused

    def identity(self, rel: str) -> str:
        """A string that changes whenever the file's content may have changed: :func:`local_identity` (size, mtime,
        inode, ctime) of a local file, or the remote ETag / size+mtime(+CRC) (remote.py).

        Raises:
            MissingFileError: the file does not exist.
        """
        p = self.path(rel)
        if self.is_local:
            self.check_link(rel)  # the identity is the target's: it keys caches built from the file's bytes
            try:
                st = os.stat(p)
            except FileNotFoundError as e:
                raise MissingFileError(f"{p}: file not found (referenced by the dataset's metadata)") from e
            return local_identity(st)
        try:
            info = self.fs.info(p)
        except FileNotFoundError as e:
            raise MissingFileError(f"{p}: file not found (referenced by the dataset's metadata)") from e
        if "identity" in info:
            return info["identity"]
        return identity_of(info)


def local_identity(st: os.stat_result) -> str:
    """The identity of a local file from its stat: ``"size-mtime_ns-inode-ctime_ns"``.

    Size and mtime alone are kept by a replacement (``cp -p``, ``rsync -t``, ``tar x``, ``os.utime`` set mtime back),
    so a same-size rewrite would be served from caches built from the old bytes. The inode (a new file or a rename
    over the old one) and st_ctime_ns (set by the kernel on every write, rename, utime or chmod; no user tool can set
    it back) are what a replacement cannot keep. The cost of a false change: a copy, restore or chmod of the
    dataset rebuilds its caches (tabular row groups, video indexes) once, and a dataset open at the time refuses the
    file until reopened.
    """
    return f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}-{st.st_ctime_ns}"


def _is_local_fs(fs: Any) -> bool:
    proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return proto in ("file", "local")


def _default_http_options(fs_protocol: str, storage_options: dict) -> dict:
    """Bound HTTP reads in time (aiohttp's default is 5 minutes per request) unless the caller chose a timeout."""
    if fs_protocol in ("http", "https") and "timeout" not in (storage_options.get("client_kwargs") or {}):
        import aiohttp

        ck = dict(storage_options.get("client_kwargs") or {})
        ck["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
        return {**storage_options, "client_kwargs": ck}
    return storage_options


def _check_protocol(root: str) -> None:
    """Refuse a URL whose protocol no fsspec filesystem knows (fsspec says only ``Protocol not known: foo``).
    A known protocol whose package is missing (``gs`` without gcsfs) keeps fsspec's ImportError, which names it."""
    from ..errors import did_you_mean

    proto = fsspec.core.split_protocol(root)[0]
    if not proto:
        return
    proto = proto.split("::")[0]  # chained URLs (simplecache::s3://...): the outer filesystem first
    try:
        fsspec.get_filesystem_class(proto)
    except ValueError:
        known = sorted(set(fsspec.available_protocols()) | set(fsspec.registry))
        raise MissingFileError(
            f"root {root!r}: no filesystem for the protocol {proto!r}.{did_you_mean(proto, known)} Give a local folder, "
            f"hf://datasets/ORG/NAME (the Hugging Face Hub), s3://, gs://, az://, http(s):// or another fsspec "
            f"protocol ({len(known)} known: fsspec.available_protocols())") from None
    except ImportError:
        return  # fsspec's message names the package to install


def open_source(root: str | os.PathLike, storage_options: dict | None = None, *, cache_dir: str | os.PathLike | None = None,
                cache_size: int | str | None = None) -> Source:
    """Resolve a user-given root (local path, fsspec URL or Hub repo id) to a :class:`Source`.

    Args:
        root: ``/path``, ``s3://bucket/ds``, ``gs://...``, ``https://host/ds``, ``hf://datasets/org/name[@rev]`` or
            ``org/name`` (Hub; without a revision the ``v3.0`` ref, see
            :func:`lerobot_sql._storage.hub.resolve_hub_revision`).
        storage_options: passed to the fsspec filesystem (credentials, endpoint_url, client_kwargs ...).
        cache_dir: the dataset's cache folder (default :func:`lerobot_sql._storage.cache.root_for` of the URL); remote
            bytes go under ``cache_dir/remote``.
        cache_size: bound on the remote-bytes cache (bytes or ``"20GB"``; default 50 GiB), LRU eviction.

    Raises:
        TypeError: ``root`` is not a string or path (``None``, a list ...).
        MissingFileError: ``root`` is a URL of a protocol no fsspec filesystem handles (``foo://x``), naming it,
            the closest known one and the usual ones.
        UnsupportedVersionError: a Hub repo with only non-v3 version refs.
    """
    if not isinstance(root, (str, os.PathLike)) or isinstance(os.fspath(root), bytes):
        raise TypeError(f"root must be a dataset root: a folder path, a URL (hf://datasets/ORG/NAME, s3://bucket/path, "
                        f"https://host/path) or a Hub repo id ORG/NAME; got {type(root).__name__} {root!r:.80}")
    root = os.fspath(root)
    options = dict(storage_options or {})
    hub_path = hub.hub_root(root, options)
    if hub_path is None:
        _check_protocol(root)
    if hub_path is not None:
        from huggingface_hub import HfFileSystem

        path, url = hub_path
        fs = HfFileSystem(**options)
    else:
        fs, path = fsspec.core.url_to_fs(root, **options)
        if _is_local_fs(fs):
            path = os.path.abspath(path)
            return Source(fs=fs, root=path, url=path)
        proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        fixed = _default_http_options(proto, options)
        if fixed is not options:
            fs, path = fsspec.core.url_to_fs(root, **fixed)
        url = root.rstrip("/")
    path = path.rstrip("/")
    cdir = cache_dir if cache_dir is not None else cache.root_for(url)
    return Source(fs=RemoteCacheFS(fs, path, url, cdir, cache_size), root=path, url=url)
