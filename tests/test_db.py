"""Database (lerobot_sql/db.py): what dataset() checks before it builds a dataset."""

from __future__ import annotations

import shutil
import warnings

import pytest

import lerobot_sql as lsql


def test_dataset_refuses_frames_without_task_text(datasets, tmp_path):
    root = tmp_path / "notasks"
    shutil.copytree(datasets / "small20", root, ignore=shutil.ignore_patterns("videos"))
    (root / "meta/tasks.parquet").unlink()
    with pytest.warns(UserWarning, match="tasks.parquet: not found"):
        db = lsql.connect(root)
    with pytest.raises(lsql.MissingFileError, match=r"meta/tasks.parquet: no task text for task_index \[0.*missing"):
        db.dataset(cameras=[])
    with pytest.raises(lsql.MissingFileError, match="tasks_exist"):
        db.dataset("SELECT index FROM frames WHERE index < 10", cameras=[])


def test_dataset_refuses_an_empty_v21_tasks_file(datasets, tmp_path):
    root = tmp_path / "v21"
    shutil.copytree(datasets / "v21_small20", root, ignore=shutil.ignore_patterns("videos"))
    (root / "meta/tasks.jsonl").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = lsql.connect(root)
    with pytest.raises(lsql.DatasetFormatError, match=r"meta/tasks.jsonl: no task text for task_index \[\d"):
        db.dataset(episodes=[1], cameras=[])


def test_dataset_files_open_without_duckdb_and_travel_to_workers(datasets, tmp_path):
    """open_files gives what a Database holds as db.files (no DuckDB); it pickles with its tasks, and a dataset
    built over the unpickled copy gives the same items as db.dataset()."""
    import pickle

    import torch

    from lerobot_sql._format.files import open_files
    from lerobot_sql.dataset import LeRobotSQLDataset

    db = lsql.connect(datasets / "small20", cache_dir=tmp_path)
    files = open_files(datasets / "small20", cache_dir=tmp_path)
    assert (files.source.url, files.layout, files.cache_dir) == (db.source.url, db.layout, db.cache_dir)
    assert files.tasks() == db.tasks() and not db._connection.opened
    files.tasks()[0] = "changed"  # callers get their own dict
    assert files.tasks() == db.tasks()
    manifest = db.manifest("SELECT index FROM frames WHERE episode_index = 2 ORDER BY index LIMIT 3")
    ds = LeRobotSQLDataset(pickle.loads(pickle.dumps(files)), manifest, cameras=[])
    want = db.dataset(manifest, cameras=[])
    for i in range(len(want)):
        a, b = ds[i], want[i]
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("bad", [3, [1, 2], None.__class__, 2.5])
def test_sql_that_is_not_a_string_is_a_type_error_naming_it(datasets, bad):
    db = lsql.connect(datasets / "small20")
    for call in (db.sql, db.manifest, db.dataset, db.stats):
        if call is db.dataset and bad is None.__class__:
            continue
        with pytest.raises(TypeError, match=r"SQL must be a string .*not (int|list|type|float)"):
            call(bad)
    with pytest.raises(TypeError, match=r"episodes=\[\.\.\.\]"):
        db.dataset([1, 2])


# A filtered three-way cross join of small20's 4762 frames: minutes of work in one DuckDB task (the filter drops
# every row, so no chunk reaches the result), the query of issue 36's Ctrl-C report.
FILTERED_CROSS_JOIN = ("SELECT count(*) FROM frames a, frames b, frames c "
                       "WHERE (a.index * b.index + c.index) % 1000003 = 7")


def ctrl_c_while_a_query_runs(sent: list, after: float = 0.3):
    """A thread that waits until a query's guard has taken SIGINT (db.Result installs its handler just before DuckDB
    runs), then ``after`` seconds more, then sends SIGINT to the main thread as a terminal's Ctrl-C does; the time it
    sent it goes to ``sent``. Waiting for the handler, not a fixed delay, keeps the signal out of connect and the
    checks on a loaded machine. Call with SIGINT at Python's default handler; stop it with ``.stop.set()``."""
    import signal
    import threading
    import time

    stop = threading.Event()

    def run():
        while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            if stop.wait(0.01):
                return
        if not stop.wait(after):
            sent.append(time.monotonic())
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    t = threading.Thread(target=run, daemon=True)
    t.stop = stop
    t.start()
    return t


@pytest.mark.parametrize("threads", [1, 2])
def test_ctrl_c_stops_a_filtered_cross_join_within_a_second(datasets, tmp_path, threads):
    """SIGINT sent to this process while db.sql runs (from a thread, as a terminal's Ctrl-C): QueryError
    "interrupted", ``.interrupted == "sigint"``, within about a second (asserted only far below the query's minutes,
    so a loaded machine cannot fail it), and the connection answers after. Before, with the query's work on the main
    thread (always with threads=1, often with 2), Python's handler waited for DuckDB to return: only the timeout
    (the test's safety net) stopped it."""
    import signal
    import threading
    import time

    assert threading.current_thread() is threading.main_thread()  # where Python delivers SIGINT
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path / "cache", threads=threads)
    assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a script; restored below
    sent: list[float] = []
    kill = ctrl_c_while_a_query_runs(sent)
    try:
        with pytest.raises(lsql.QueryError, match="interrupted") as e:
            db.sql(FILTERED_CROSS_JOIN, timeout=120).fetchall()
        secs = time.monotonic() - sent[0]
    finally:
        kill.stop.set()
        signal.signal(signal.SIGINT, old)
    assert e.value.interrupted == "sigint", str(e.value)
    assert secs < 60, secs  # about a second; the query itself runs for minutes
    assert db.sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]
    db.close()
