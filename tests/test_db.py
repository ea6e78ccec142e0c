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
