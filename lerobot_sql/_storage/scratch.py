"""Scratch files and folders that must not outlive their writer: who wrote one, whether that writer still runs,
and when a leftover may be swept.

Three kinds exist: a dataset's per-sample file (``lerobot_sql._samples``, held by an ``flock`` for its life), an
export's staging folder (``lerobot_sql.export.destination``) and a DataLoader worker's batch-memory ring
(``lerobot_sql.batch``, whose mapping the main process drops when the worker is gone). Each is named after its
writer, ``<tag>-<host>-<pid>-...``, so that a later process can tell a leftover of a killed writer (no cleanup
ran) from the live file of a process running now. The rules for that live here, once:

* :func:`pid_alive`: whether a pid of this host runs. ``os.kill(pid, 0)`` probes on POSIX; on Windows signal 0 is
  ``CTRL_C_EVENT`` and would interrupt the process, so nothing is ever judged gone there (leftovers stay; never
  a live writer's file removed).
* :func:`host_tag`: the host part of a name (a pid means nothing on another host sharing the folder).
* :func:`hold` and :func:`is_leftover`: a writer holds an exclusive ``flock`` on its file while it lives; the
  kernel drops it however the writer ends (SIGKILL included), so a free lock means a leftover even across
  containers that share the cache and the host name. Where locks do not exist (Windows) or the filesystem refuses
  them, the pid rule applies. A file younger than ``YOUNG_S`` may not be locked yet: never a leftover.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from pathlib import Path

YOUNG_S = 60.0  # a file this new may not hold its writer's lock yet (created, not yet locked): never swept


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host may still run: False only when it certainly does not (this process,
    another user's process, an unanswerable probe and any pid on Windows count as alive, so their files stay)."""
    if pid == os.getpid() or os.name == "nt":  # Windows: os.kill(pid, 0) sends CTRL_C_EVENT, it probes nothing
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process; anything else: cannot tell, keep its files
        return True
    return True


def host_tag() -> str:
    """This host's name as it appears in scratch names: letters and digits only (others become ``_``, so no
    name separator ``-`` appears), at most 40 characters."""
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40] or "host"


def owner_prefix(tag: str) -> str:
    """``<tag>-<host>-<pid>-``: the start of the name of a scratch file this process writes."""
    return f"{tag}-{host_tag()}-{os.getpid()}-"


def hold(fd: int) -> None:
    """Take an exclusive ``flock`` on the open scratch file ``fd`` for as long as it stays open: other processes
    then see it as live (:func:`is_leftover`). Nothing where locks do not exist or the filesystem refuses them."""
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ImportError, OSError):
        pass


def is_leftover(path: Path, pid: int | None) -> bool:
    """Whether the scratch file ``path`` belongs to no live process: its writer's lock (:func:`hold`) is free, or,
    without locks, ``pid`` (its writer on this host, parsed from its name; None: another host's, or unknown) does
    not run. Files younger than ``YOUNG_S`` are never leftovers."""
    try:
        if time.time() - path.stat().st_mtime < YOUNG_S:
            return False
    except OSError:
        return False
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
    except ImportError:
        fd = None
    except OSError:
        return False
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True  # nobody holds it: the writer is gone
        except BlockingIOError:
            return False
        except OSError:
            pass  # no locks on this filesystem: the pid rule below
        finally:
            os.close(fd)
    return pid is not None and not pid_alive(pid)


def writer_pid(name: str, tag: str) -> int | None:
    """The pid in scratch name ``name`` (``<tag>-<host>-<pid>-...``) when it was written on this host, else None."""
    here = f"{tag}-{host_tag()}-"
    if not name.startswith(here):
        return None  # another host's pid means nothing here
    pid = name[len(here):].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def sweep(folder: Path, tag: str, suffix: str, keep: str | None = None) -> None:
    """Remove the scratch files ``<tag>-*<suffix>`` in ``folder`` whose writer has exited (a crash or kill skips
    its cleanup; on Windows a file still mapped cannot be deleted by its writer), except ``keep``."""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if not (name.startswith(tag + "-") and name.endswith(suffix)) or str(folder / name) == keep:
                continue
            if is_leftover(folder / name, writer_pid(name, tag)):
                with contextlib.suppress(OSError):
                    os.unlink(folder / name)
