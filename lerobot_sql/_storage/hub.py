"""Hugging Face Hub roots: which repo and revision a root names, and the revision read when it names none.

``hf://datasets/ORG/NAME[@REV]`` or a bare ``ORG/NAME`` (when no local folder of that name exists) is a Hub dataset;
without a revision, the one lerobot would read (:func:`resolve_hub_revision`), remembered on disk so that a dataset
opened once opens offline. :func:`hub_root` gives :func:`lerobot_sql._storage.source.open_source` the fsspec path
and URL; its errors say both readings of a bare ``ORG/NAME`` (a Hub repo id, or a mistyped local path).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

from ..errors import (
    DatasetFormatError,
    LeRobotSQLError,
    MissingFileError,
    RemoteIOError,
    UnsupportedVersionError,
    closest,
)
from . import cache

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./%-]+)?$")
_VERSION_REF = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?$")
CODEBASE_VERSION = (3, 0)


def resolve_hub_revision(repo_id: str, api: Any = None, token: Any = None) -> str:
    """The revision to read when the user gave none, as lerobot chooses it (the rule below).

    The exact ref ``v3.0`` if it exists, else the highest ref ``v3.0.x``; a repo with version refs of other majors
    only is refused; a repo with no version ref at all is read at ``main``.

    Raises:
        UnsupportedVersionError: only older (v2.x: with the conversion command) or only newer version refs.
    """
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    refs = api.list_repo_refs(repo_id, repo_type="dataset")
    names = [r.name for r in list(refs.branches) + list(refs.tags)]
    versions = {}
    for n in names:
        m = _VERSION_REF.match(n)
        if m:
            versions[n] = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    if "v3.0" in versions:
        return "v3.0"
    ok = [n for n, v in versions.items() if v[0] == CODEBASE_VERSION[0] and v[1] <= CODEBASE_VERSION[1]]
    if ok:
        return max(ok, key=versions.__getitem__)
    if versions:
        best = max(versions, key=versions.__getitem__)
        if versions[best][0] < CODEBASE_VERSION[0]:
            hint = (f"convert it with `python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id={repo_id}`"
                    if versions[best][0] == 2 else "this reader handles format v3.0")
            raise UnsupportedVersionError(f"hf://datasets/{repo_id}: newest version ref is {best!r}; {hint}, or "
                                          "pass an explicit revision (hf://datasets/ORG/NAME@REV)")
        raise UnsupportedVersionError(f"hf://datasets/{repo_id}: only newer format versions ({sorted(versions)}); "
                                      "upgrade lerobot_sql or pass an explicit revision (hf://datasets/ORG/NAME@REV)")
    return "main"


def hub_root(root: str, storage_options: dict) -> tuple[str, str] | None:
    """(fs path ``datasets/org/name@rev``, url) for a Hub root, or None if ``root`` is not one."""
    if root.startswith("hf://"):
        rest = root[len("hf://"):]
        if not rest.startswith("datasets/"):
            return None  # models/spaces/buckets: pass to fsspec as given
        rest = rest[len("datasets/"):]
    elif HUB_ID.match(root) and not os.path.exists(root):
        rest = root
    else:
        return None
    parts = rest.rstrip("/").split("/")
    repo, sub = "/".join(parts[:2]), "/".join(parts[2:])
    repo_id, _, rev = repo.partition("@")
    if not rev:
        # A bare `org/name` may as well be a mistyped relative path (`sample/smal20`): errors say both readings.
        local = None if root.startswith("hf://") else root
        rev = _cached_hub_revision(repo_id, storage_options.get("token"), local=local)
    path = f"datasets/{repo_id}@{rev}" + (f"/{sub}" if sub else "")
    return path, f"hf://{path}"


def _near_folder(local: str) -> str:
    """`` (did you mean 'sample/small20'?)`` when a folder spelt nearly like ``local`` exists, one segment at a time
    from the first that is missing: a misspelt local path reads as an ``org/name`` repo id."""
    parts = local.replace("\\", "/").split("/")
    base = ""
    for i, seg in enumerate(parts):
        cand = os.path.join(base, seg) if base else seg
        if os.path.isdir(cand):
            base = cand
            continue
        try:
            names = [n for n in os.listdir(base or ".") if os.path.isdir(os.path.join(base or ".", n))]
        except OSError:
            return ""
        fixed = closest(seg, names)
        if fixed is None:
            return ""
        return f" (did you mean {'/'.join([*parts[:i], fixed, *parts[i + 1:]])!r}?)"
    return ""


def _hub_error(repo_id: str, cause: BaseException | None, local: str | None) -> LeRobotSQLError:
    """The typed error for a Hub repo that cannot be resolved: MissingFileError when the Hub says there is no such
    repo (or we are offline with nothing cached), RemoteIOError when it cannot be reached. With ``local`` (the root
    was a bare ``org/name``), the message starts with the local reading: no folder of that name; and when its first
    segment is a local folder, the error is MissingFileError whatever the Hub said."""
    try:
        from huggingface_hub.errors import RepositoryNotFoundError
    except ImportError:  # huggingface_hub 0.24 (our floor) has it only in huggingface_hub.utils
        from huggingface_hub.utils import RepositoryNotFoundError

    if cause is None:
        why, cls = "offline (HF_HUB_OFFLINE / LSQL_OFFLINE) and no revision known", MissingFileError
    else:
        first = (str(cause).splitlines() or [""])[0]
        why = f"{type(cause).__name__}: {first}"
        cls = MissingFileError if isinstance(cause, RepositoryNotFoundError) else RemoteIOError
    if local is not None and os.path.isdir(local.replace("\\", "/").split("/")[0]):
        # `sample/nope` beside a folder `sample`: a mistyped path is the likelier reading, so the error is the
        # missing file's (an `except FileNotFoundError` catches it) even when the Hub could not be asked
        cls = MissingFileError
    if local is not None:
        return cls(f"no local folder {local} (resolved to {os.path.abspath(local)}){_near_folder(local)}; as a Hub repo id "
                   f"hf://datasets/{repo_id}: {why}. Check the path (a dataset root holds meta/info.json), or the "
                   "repo id and the network")
    fix = ("check the repo id on https://huggingface.co/datasets" if cls is MissingFileError and cause is not None
           else "check the network (once opened online, a dataset opens offline), or pass hf://datasets/ORG/NAME@REV")
    return cls(f"hf://datasets/{repo_id}: cannot resolve the dataset's revision on the Hugging Face Hub ({why}); "
               f"{fix}")


def _cached_hub_revision(repo_id: str, token: Any, local: str | None = None) -> str:
    """resolve_hub_revision, remembered on disk so a dataset opened once opens offline.

    Raises:
        MissingFileError: the Hub has no such repo, or offline with no revision remembered.
        RemoteIOError: the Hub cannot be reached and no revision is remembered.
    """
    store = cache.cache_root() / "hub_revisions.json"
    try:
        known = json.loads(store.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        known = {}
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("LSQL_OFFLINE", "HF_HUB_OFFLINE"))
    if not offline:
        try:
            rev = resolve_hub_revision(repo_id, token=token)
        except (UnsupportedVersionError, DatasetFormatError):
            raise
        except Exception as e:  # noqa: BLE001 - no network: fall back to the last resolution
            if repo_id not in known:
                raise _hub_error(repo_id, e, local) from e
            return known[repo_id]
        if known.get(repo_id) != rev:
            known[repo_id] = rev
            with contextlib.suppress(OSError):  # only an offline convenience
                store.parent.mkdir(parents=True, exist_ok=True)
                cache.atomic_write(store, json.dumps(known).encode())
        return rev
    if repo_id not in known:
        if local is not None:
            raise _hub_error(repo_id, None, local)
        raise MissingFileError(f"hf://datasets/{repo_id}: offline and no revision known; connect once online, "
                               "or pass hf://datasets/ORG/NAME@REVISION")
    return known[repo_id]
