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
