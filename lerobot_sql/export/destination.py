"""Where an export may write, the life of what it writes there, and the one error block around its writes.

What an overwrite may delete: only a folder that is empty or that lerobot_sql exported (its marker ``MARKER`` lists
every file written, with its size), and only a manifest file that carries our schema metadata. Everything else (the
source, a folder that holds it, the user's files) is refused before any work, so an export never deletes what it
did not write. A write that fails because the disk is full or read-only is a :class:`DestinationError` naming the
destination, and leaves nothing behind, not even the parent folders the export made (:func:`writing`). The move
into place never replaces what another writer put at the destination while the export ran, unless ``overwrite``
asked for it (:func:`rename_no_replace`, :func:`write_file`): of two exports of one destination, the second fails.

A folder export's life, start to end: :func:`check_dest` before any work, then :func:`write_folder` (stale staging
folders removed, a staging folder written, :func:`write_marker`, :func:`swap_into_place`). A file export's:
:func:`check_file_dest`, then :func:`write_file` inside :func:`writing`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import stat
import sys
import threading
import uuid
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from .._storage import scratch
from .._version import __version__
from ..errors import DestinationError, DestinationExistsError, LeRobotSQLError, warn

T = TypeVar("T")

MARKER = "meta/lerobot_sql_export.json"
MARKER_FORMAT = 1
# errno values that can only come from writing the destination (reading the source never raises them).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def local_dest(dest: str | os.PathLike, what: str) -> Path:
    """``dest`` as an absolute local path; ``~`` is expanded (as ``connect`` does), symlinks are resolved, a
    dangling one is refused."""
    dest = os.path.expanduser(os.fspath(dest))  # else "~/out" became ./~/out under the working folder
    if "://" in dest:
        raise DestinationError(f"{os.fspath(dest)}: {what} writes to a local path; write locally and upload the "
                               "result afterwards")
    p = Path(os.path.abspath(os.fspath(dest)))
    if os.path.islink(p) and not os.path.exists(p):
        raise DestinationError(f"{p}: is a symlink to {os.readlink(p)!r}, which does not exist; remove the link, "
                               "create its target, or choose another destination")
    return Path(os.path.realpath(p))


def refuse_source(db, dest: Path, what: str) -> None:
    """Refuse a destination that is the source root, inside it or a folder holding it (symlinks resolved)."""
    if not db.source.is_local:
        return
    src = Path(os.path.realpath(db.source.root))
    if dest == src or dest.is_relative_to(src):
        raise DestinationError(f"{dest}: is inside the source dataset {src}; {what} never writes into its own "
                               "source: choose a destination outside it")
    if src.is_relative_to(dest):
        raise DestinationError(f"{dest}: holds the source dataset {src}; {what} never replaces a folder that holds "
                               "its source: choose another destination")


def our_files(root: Path) -> dict[str, int]:
    """Every file and symlink under ``root`` (relative posix path -> size; a symlink counts as -1, never ours)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = Path(full).relative_to(root).as_posix()
            out[rel] = -1 if os.path.islink(full) else os.lstat(full).st_size
    return out


def check_replaceable(dest: Path) -> None:
    """Raise DestinationExistsError unless ``dest`` is an empty folder or an export of ours left as we wrote it."""
    if not dest.is_dir():
        raise DestinationExistsError(f"{dest}: exists and is not a folder; overwrite=True replaces only an empty "
                                     "folder or a dataset lerobot_sql exported: remove it yourself or choose another "
                                     "destination")
    present = our_files(dest)
    if not present:
        return
    marker = dest / MARKER
    try:
        written = json.loads(marker.read_text())["files"]
        if not isinstance(written, dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DestinationExistsError(
            f"{dest}: exists and is not a dataset lerobot_sql exported (no readable {MARKER}); overwrite=True "
            "replaces only an empty folder or a previous export: remove it yourself or choose another destination"
        ) from e
    present.pop(MARKER, None)
    mtimes = json.loads(marker.read_text()).get("mtimes")  # (markers before 0.2.1 hold sizes only)
    mtimes = mtimes if isinstance(mtimes, dict) else {}
    foreign = sorted(r for r, size in present.items() if written.get(r) != size
                     or (r in mtimes and size >= 0 and os.lstat(dest / r).st_mtime_ns != mtimes[r]))
    if foreign:
        raise DestinationExistsError(
            f"{dest}: holds {len(foreign)} file(s) the previous export did not write or that changed since "
            f"(e.g. {foreign[:3]}); overwrite=True never deletes them: move them away or choose another destination")


def _make_parents(folder: Path, dest: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns the folders created (to remove on failure)."""
    missing = []
    p = folder
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    created = []
    for d in reversed(missing):
        try:
            d.mkdir()
        except OSError as e:
            _remove_dirs(created)
            why = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror
            raise DestinationError(f"{dest}: cannot create the folder {d} ({why}); choose another destination") \
                from e
        created.append(d)
    if not folder.is_dir():
        raise DestinationError(f"{dest}: its parent {folder} is not a folder; choose another destination")
    return created


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            pass


def _write_error(e: OSError, dest: Path) -> DestinationError | None:
    """The typed error for a failed write to ``dest`` (disk full, quota, read-only), or None if ``e`` is not one."""
    if isinstance(e, LeRobotSQLError):
        return None
    text = str(e)
    if e.errno in _WRITE_ERRNOS or "No space left on device" in text or "Read-only file system" in text:
        why = e.strerror or text
        return DestinationError(f"{dest}: writing failed ({why}); nothing was left there: free space on "
                                f"{dest.parent} (or make it writable) and export again, or choose another destination")
    return None


def staging_path(dest: Path) -> Path:
    """The hidden sibling an export of ``dest`` is written into before its rename: ``.<name>.lsql-export-<host>-
    <pid>-<random>``, so a later export can tell a staging folder whose writer is gone (``remove_stale_staging``)."""
    return dest.parent / f".{dest.name}.lsql-export-{scratch.host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def remove_stale_staging(dest: Path) -> list[Path]:
    """Remove the staging folders of earlier exports of ``dest`` whose process is gone (killed with SIGKILL or the
    machine lost power: no cleanup ran), with a warning naming each; returns them.

    Only folders of exactly :func:`staging_path`'s form, written by a process of this host (same host name) that
    no longer exists, are removed: another host's, or a live process's (an export running now), are left alone.
    """
    host = re.escape(scratch.host_tag())
    pattern = re.compile(rf"^\.{re.escape(dest.name)}\.lsql-export-{host}-(\d+)-[0-9a-f]{{8}}$")
    removed = []
    try:
        siblings = list(os.scandir(dest.parent))
    except OSError:  # no parent yet, or not listable: nothing of ours there
        return removed
    for entry in siblings:
        m = pattern.match(entry.name)
        if not m or not entry.is_dir(follow_symlinks=False) or scratch.pid_alive(int(m.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
        warn(f"{entry.path}: removed the staging folder of an earlier export of {dest} whose process "
             f"({m.group(1)}) ended without cleaning up (killed?)")
    return removed


# ---- a folder export: checked, staged, marked, moved into place ----------------------------------------------------
def check_dest(dbs: list, dest: str | os.PathLike, overwrite: bool) -> Path:
    """``dest`` resolved, after the checks made before any work: not a source, not in one, not holding one, and
    replaceable if it exists (``overwrite``)."""
    dest = local_dest(dest, "export")
    for db in dbs:
        refuse_source(db, dest, "export")
    if os.path.lexists(dest):
        # An empty folder (made beforehand, as users do for a job's output) holds nothing to lose: written into
        # without overwrite=True; anything else needs it, and then check_replaceable's rules.
        if not overwrite and not empty_folder(dest):
            raise DestinationExistsError(f"{dest}: already exists; pass overwrite=True or choose another destination")
        check_replaceable(dest)
    return dest


def empty_folder(path: Path) -> bool:
    """True when ``path`` is a folder holding nothing (written into without ``overwrite``)."""
    if not path.is_dir():
        return False
    with os.scandir(path) as entries:
        return next(entries, None) is None


def swap_into_place(tmp: Path, dest: Path, overwrite: bool) -> None:
    """Rename the finished folder ``tmp`` to ``dest``: into an absent path, or over an empty folder, or (only with
    ``overwrite``) over a previous export.

    Not ``_storage.cache.atomic_write``: that replaces one file, while ``os.replace`` cannot replace a folder that
    is not empty. Every rename into ``dest`` is :func:`rename_no_replace`: a destination another export
    finished at while this one ran (``overwrite`` False) is kept and this one raises DestinationExistsError (its
    staging folder is removed by ``writing``); before, the second rename replaced the first export.
    With ``overwrite``, the old export is renamed aside first and renamed back if the second rename fails, so
    ``dest`` holds the old or the new dataset at every moment, and is deleted only once the new one is in place.
    """
    if overwrite and os.path.lexists(dest) and not empty_folder(dest):
        check_replaceable(dest)  # again: it may have changed during the export
        old = dest.parent / f".{dest.name}.lsql-old-{uuid.uuid4().hex[:8]}"
        os.rename(dest, old)
        try:
            rename_no_replace(tmp, dest)
        except FileExistsError as e:  # another export landed between the two renames: it stays, ours is removed
            raise DestinationExistsError(
                f"{dest}: another export was moved there while this one replaced the previous export; it was left "
                f"as it is, this export's files were removed, and the previous export is at {old}: keep the one you "
                "want, remove the other, or export again") from e
        except BaseException:
            os.rename(old, dest)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    if empty_folder(dest):
        # An empty folder holds nothing to lose (written into without overwrite, as check_dest allows); rmdir fails
        # if anything arrived in it meanwhile, and the rename below then refuses it.
        with contextlib.suppress(OSError):
            os.rmdir(dest)
    try:
        rename_no_replace(tmp, dest)
    except FileExistsError as e:
        raise DestinationExistsError(appeared_meanwhile(dest, "export", "destination")) from e


def write_marker(root: Path, source: str, sources: dict[str, str] | None = None) -> None:
    """meta/lerobot_sql_export.json: who wrote this folder, from what, and every file it holds (name -> bytes, and
    name -> modification time in ns).
    ``source`` is the (first) source's URL; a collection's export adds ``sources`` (dataset name -> URL)."""
    files = our_files(root)
    marker = {"written_by": "lerobot_sql", "format": MARKER_FORMAT, "version": __version__, "source": source}
    if sources is not None:
        marker["sources"] = dict(sources)
    marker["files"] = dict(sorted(files.items()))
    # an edit at the same size (a word of info.json changed) is a change too: overwrite=True must not delete it
    marker["mtimes"] = {r: os.lstat(root / r).st_mtime_ns for r, size in sorted(files.items()) if size >= 0}
    (root / MARKER).parent.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(json.dumps(marker, indent=1, ensure_ascii=False))


def write_folder(dest: Path, fill: Callable[[Path], T], *, overwrite: bool, source: str,
                 sources: dict[str, str] | None = None) -> T:
    """The life of a folder export (``export``, ``coll.export``), after :func:`check_dest`: earlier exports' stale
    staging folders removed, a staging sibling made (:func:`staging_path`), ``fill(staging)`` writes the dataset
    there, the marker lists what it wrote (:func:`write_marker`, ``source`` / ``sources`` as it takes them), and
    the folder is moved into place (:func:`swap_into_place`). Returns what ``fill`` returns.

    Raises:
        DestinationError: the staging folder cannot be made, or the disk filled (:func:`writing`).
        DestinationExistsError: another export finished at ``dest`` meanwhile (:func:`swap_into_place`).
        Whatever ``fill`` raises; the staging folder is removed either way.
    """
    remove_stale_staging(dest)
    tmp = staging_path(dest)
    with writing(dest, tmp):
        try:
            tmp.mkdir()
        except OSError as e:
            raise DestinationError(f"{dest}: cannot create a folder in {dest.parent} ({e.strerror}); make it "
                                   "writable or choose another destination") from e
        out = fill(tmp)
        write_marker(tmp, source, sources)
        swap_into_place(tmp, dest, overwrite)
    return out


# ---- a file export -------------------------------------------------------------------------------------------------
def check_file_dest(dbs: list, path: str | os.PathLike, what: str, *, overwrite: bool, example: str) -> Path:
    """The rules for a destination that is one file (``export_manifest``, ``lerobot-sql query -o``), checked before
    any work: local (:func:`local_dest`), outside every source in ``dbs`` (:func:`refuse_source`), not a folder, and
    absent unless ``overwrite``. ``example`` is a file name the folder error suggests. Returns the path resolved.

    Raises:
        DestinationError: a URL, a dangling symlink, inside (or holding) a source, a folder.
        DestinationExistsError: it exists and ``overwrite`` is False.
    """
    path = local_dest(path, what)
    for db in dbs:
        refuse_source(db, path, what)
    if path.is_dir():
        raise DestinationError(f"{path}: is a folder; {what} writes one file: give a file path such as "
                               f"{path / example}")
    refuse_special(path, what)
    if os.path.lexists(path) and not overwrite:
        raise DestinationExistsError(f"{path}: exists; pass overwrite=True or choose another path")
    return path


def refuse_special(path: Path, what: str) -> None:
    """Refuse a destination that exists and is not a regular file (a device such as /dev/null, a FIFO, a socket):
    the file is written under a temporary name and renamed over it, which would put a regular file in its place (as
    root, ``-o /dev/null --overwrite`` replaced the system's /dev/null), and reading one to check what it holds (is it
    a manifest?) blocks forever on a FIFO.

    Raises:
        DestinationError: naming the path, its kind and what to do instead.
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # absent (or a file where a parent folder should be: named later)
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
                "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise DestinationError(f"{path}: is {kind}; {what} writes a regular file (under a temporary name, then "
                               "renamed into place, which would replace it): choose a file path"
                               + (", or leave out -o and redirect stdout (> /dev/null, | consumer)"
                                  if what.startswith("lerobot-sql") else ""))


def write_file(dest: Path, write: Callable[[str], None], *, overwrite: bool,
               replaceable: Callable[[Path], bool] | None = None, what: str = "export") -> None:
    """Write the one file ``dest``: ``write(tmp)`` writes a hidden sibling ``.lsql-tmp-<random>.<name>`` (the same
    folder, so the move is a rename; the same ending, so a writer that picks compression by the extension, as
    DuckDB's CSV writer does, picks the same), which is then moved to ``dest``. Run it inside :func:`writing`.

    Without ``overwrite`` the move happens only if nothing is at ``dest`` (:func:`rename_no_replace`): a file that
    appeared while ``write`` ran (another export of the same path finished first) is kept. With ``overwrite`` the
    move replaces ``dest`` (``os.replace``, atomic) if ``replaceable(dest)`` still holds. ``dest`` holds the old file
    or the new one at every moment; the temporary file is removed on any failure.

    Raises:
        DestinationExistsError: ``dest`` appeared meanwhile (``overwrite`` False), or is no longer replaceable.
        Whatever ``write`` raises.
    """
    tmp = dest.with_name(f".lsql-tmp-{uuid.uuid4().hex[:8]}.{dest.name}")
    try:
        write(str(tmp))
        if overwrite and os.path.lexists(dest):
            refuse_special(dest, what)  # one that appeared while write() ran
            if replaceable is not None and not replaceable(dest):
                raise DestinationExistsError(f"{dest}: was replaced by another file while this {what} ran, which "
                                             "overwrite=True does not replace: it was left as it is; remove it "
                                             "yourself or choose another path")
            os.replace(tmp, dest)
            return
        try:
            rename_no_replace(tmp, dest)
        except FileExistsError as e:
            raise DestinationExistsError(appeared_meanwhile(dest, what, "path")) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def appeared_meanwhile(dest: Path, what: str, noun: str) -> str:
    """The message of a destination that another writer created while this one ran."""
    return (f"{dest}: appeared while this {what} ran (another writer, such as a second export to the same {noun}, "
            f"finished first); it was left as it is and nothing of this {what} was kept there: pass overwrite=True "
            f"to replace it, or choose another {noun}")


# Linux renameat2(RENAME_NOREPLACE) (kernel 3.15, glibc 2.28) and macOS renamex_np(RENAME_EXCL) (10.12): the kernel
# renames only if nothing is at the new path, in one step, for a file and a folder alike.
_RENAME_NOREPLACE, _RENAME_EXCL, _AT_FDCWD = 1, 0x4, -100
_native = None  # (name, function) of the system's no-replace rename, False if none; looked up on first use
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}


def rename_no_replace(src: Path, dest: Path) -> None:
    """Rename ``src`` (a file or a folder) to ``dest`` only if nothing is at ``dest``.

    ``os.rename`` / ``os.replace`` replace an existing file silently, and a folder onto an existing empty folder
    too, so of two exports of one destination the second replaced the first. The system's no-replace rename
    (:func:`_native_rename_noreplace`) is atomic. Where there is none (an older kernel or libc, a filesystem that
    refuses the flag), a file is moved by ``os.link`` (POSIX, Linux and macOS alike: fails with EEXIST if ``dest``
    exists, never replaces) then ``unlink`` of ``src``; a folder (or a file on a filesystem without hard links) by
    ``os.rename`` after a check that ``dest`` is absent: rename(2) never replaces a non-empty folder, or a file with
    a folder, so all that this check-then-rename window can replace is an empty folder created in that instant.

    Raises:
        FileExistsError: something is at ``dest``; ``src`` is left where it was.
        OSError: the rename failed otherwise.
    """
    if _native_rename_noreplace(src, dest):
        return
    if not os.path.isdir(src):
        try:
            os.link(src, dest)
        except FileExistsError:
            raise
        except OSError as e:
            if e.errno not in _UNSUPPORTED | {errno.EPERM, errno.EMLINK}:  # EPERM: FAT, some network mounts
                raise
        else:
            os.unlink(src)
            return
    if os.path.lexists(dest):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest))
    try:
        os.rename(src, dest)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest)) from e
        raise


def _native_rename_noreplace(src: Path, dest: Path) -> bool:
    """Rename with the system's no-replace rename; False (nothing done) where it has none or the filesystem refuses
    the flag. Raises FileExistsError if something is at ``dest``, OSError for other failures."""
    global _native
    if _native is None:
        _native = _find_native_rename()
    if not _native:
        return False
    import ctypes

    name, fn = _native
    s, d = os.fsencode(src), os.fsencode(dest)
    rc = fn(_AT_FDCWD, s, _AT_FDCWD, d, _RENAME_NOREPLACE) if name == "renameat2" else fn(s, d, _RENAME_EXCL)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dest))  # EEXIST makes a FileExistsError


def _find_native_rename():
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    if sys.platform.startswith("linux"):
        fn = getattr(libc, "renameat2", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            return "renameat2", fn
    elif sys.platform == "darwin":
        fn = getattr(libc, "renamex_np", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            return "renamex_np", fn
    return False


@contextlib.contextmanager
def writing(dest: Path, tmp: Path | None = None) -> Iterator[None]:
    """The error handling around writing ``dest`` (export_dataset and export_manifest alike).

    Creates ``dest``'s missing parent folders, then runs the body, which writes ``tmp`` (or another temporary name)
    and renames it to ``dest``. Afterwards ``tmp`` (a file or a folder) is removed if it is still there; if the
    body failed, so are the parent folders created here.

    Raises:
        DestinationError: a parent cannot be created (a file is in the way, no permission), or the body failed
            with an OSError from a full or read-only disk (chained as ``__cause__``). Other errors pass unchanged.
    """
    created = _make_parents(dest.parent, dest)
    ok = False
    old_term = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # SIGTERM (timeout, kill, Slurm, docker stop) would end the process without running the cleanup below and
        # leave the half-written staging folder behind for good: while writing, it exits through Python instead
        # (SystemExit 143, the shell's code for a SIGTERM), so the finally clause removes it.
        def _term(signum, frame):
            terminated.append(signum)
            raise SystemExit(128 + signal.SIGTERM)

        old_term = signal.signal(signal.SIGTERM, _term)
    terminated: list[int] = []
    try:
        yield
        ok = True
    except BaseException as e:
        if terminated and not isinstance(e, SystemExit):
            # The SystemExit was raised inside a library call that reports it its own way (DuckDB's "Query
            # interrupted"): the export still ends as the SIGTERM asked, not as that library's error.
            raise SystemExit(128 + signal.SIGTERM) from e
        if not isinstance(e, OSError):
            raise
        err = _write_error(e, dest)
        if err is None:
            raise
        raise err from e
    finally:
        if tmp is not None and tmp.exists():
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink()
        if not ok:
            _remove_dirs(created)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
