"""Shared fixtures: the in-repo test data (first tier), the external real-data corpus (second tier), a per-session
cache. Where each lives: tests/README.md; the constants and comparison helpers: tests/helpers.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from helpers import (
    DATASETS,
    FRAMECODE,
    REAL_DATASETS,
    REAL_SETS,
    REAL_SKIP_REASON,
    REFERENCE,
    SAMPLE,
    need_real_corpus,
    real_corpus_present,
)


def pytest_collection_modifyitems(config, items):
    """Without the external corpus, mark its tests skipped at collection (the report names each test and the
    reason): those that take ``real_datasets`` or are parametrized with a real set's name. ``real_root`` /
    ``data_root`` / ``load_reference`` skip at run time too, for a test that reaches the corpus another way."""
    if real_corpus_present():
        return
    mark = pytest.mark.skip(reason=REAL_SKIP_REASON)
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "real_datasets" in item.fixturenames or any(isinstance(v, str) and v in REAL_SETS for v in params.values()):
            item.add_marker(mark)


@pytest.fixture(scope="session")
def datasets() -> Path:
    """The folder of the generated datasets shipped in the repo (``datasets / "small20"``, ``"multifile60"``,
    ``"v21_small20"``, ``"h264_20"``, ``"img5_extras"``). Always present."""
    return DATASETS


@pytest.fixture(scope="session")
def real_datasets() -> Path:
    """The folder of the real datasets fetched from other repositories (``real_datasets / "g1_real_v30"``, ...), in
    the external corpus ``$LSQL_SHARED/datasets``; the test is skipped when the corpus is absent."""
    need_real_corpus()
    return REAL_DATASETS


@pytest.fixture(scope="session")
def reference() -> Path:
    """tests/data/reference: lerobot 0.4.4's items for the shipped sets (``load_reference`` also finds g1's)."""
    return REFERENCE


@pytest.fixture(scope="session")
def sample() -> Path:
    """sample/small20: the demo's dataset, the same folder as ``datasets / "small20"``."""
    return SAMPLE


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory) -> Path:
    """Every test session gets its own cache root, so no test reads another run's cache."""
    d = tmp_path_factory.mktemp("lsql_cache")
    os.environ["LSQL_CACHE_DIR"] = str(d)
    return d


_START_SCHEDULING = (os.sched_getscheduler(0), os.sched_getparam(0)) if hasattr(os, "sched_getscheduler") else None


def _restore_scheduling() -> None:
    if _START_SCHEDULING is not None and (os.sched_getscheduler(0), os.sched_getparam(0)) != _START_SCHEDULING:
        os.sched_setscheduler(0, *_START_SCHEDULING)


@pytest.fixture(autouse=True)
def _normal_scheduling():
    """Each test starts and ends with the scheduling this process started with. A test or fixture that encodes AV1
    in this process (standins, damaged mp4s made with PyAV) opens libsvtav1, which as root switches the thread to
    SCHED_FIFO 99 for good (the library's own export gives it back: video_writer.keep_scheduling); every later child
    of this worker, and DuckDB's threads, would inherit it, and a busy real-time thread starves the machine's two
    cores (a Ctrl-C test's child ran past its own timeout; a standins test hung). Module fixtures run before this
    one: hence the reset at the start too."""
    _restore_scheduling()
    yield
    _restore_scheduling()


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_sample_files(tmp_path_factory):
    """After the session: every per-sample file this process wrote (any cache folder under the session's temp
    root, or the system temp folder) belongs to a dataset still alive (deleted at exit); any other is a leak."""
    yield
    import gc
    import tempfile

    from lerobot_sql.torch._samples import MAPS, file_prefix

    gc.collect()
    mine = file_prefix()
    roots = [tmp_path_factory.getbasetemp(), Path(tempfile.gettempdir())]
    # os.walk, not Path.glob: other processes' folders under the system temp folder (multiprocessing's pymp-*)
    # come and go during the walk, and glob raised FileNotFoundError on one that vanished (os.walk skips it)
    found = {os.path.join(d, f) for r in roots for d, _, files in os.walk(r) for f in files
             if f.startswith(mine) and f.endswith(".arrow")} if roots[0].exists() else set()
    leaked = sorted(found - set(MAPS.keys()))
    assert not leaked, f"per-sample files left without a live dataset: {leaked[:5]}"


@pytest.fixture(scope="session")
def framecode():
    """tests/data/framecode.py: which frame an image is, and the exact state/action of every synthetic frame."""
    spec = importlib.util.spec_from_file_location("framecode", FRAMECODE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def quick_retries(monkeypatch):
    """Remote reads retry after 0.01 s, 0.02 s, ... instead of the default 0.2 s, 0.4 s, ... (3 s per failed read):
    for tests of a server that keeps failing, where only the count of tries and the error matter."""
    from lerobot_sql._storage import remote

    init = remote.RemoteCacheFS.__init__

    def quick(self, *args, **kw):
        kw.setdefault("backoff_s", 0.01)
        init(self, *args, **kw)

    monkeypatch.setattr(remote.RemoteCacheFS, "__init__", quick)
