"""The training wing moved into ``lerobot_sql/torch/``: the old public paths still import for one release, warn, and
hand out the very objects of the new home (a pickled reference by the old name resolves too); what is pickled now
names the new home; importing the package (or the folder) still does not import torch."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

# old path -> the documented names it re-exports (every public name of the new module is checked too)
SHIMS = {
    "dataset": ["LeRobotSQLDataset", "item_index"],
    "samplers": ["EpisodeAwareSampler", "EpisodeShardedSampler", "MixtureSampler", "blocks"],
    "shard": ["ShardedManifestDataset", "rank_and_world", "shard_manifest", "shard_sizes", "worker_shard"],
    "ray_data": ["Decoder", "decode_batch", "manifest_root", "manifest_schema", "stack_items"],
    "meta": ["EpisodeTable", "SelectionMetadata", "episodes_table", "repo_id", "runs"],
    "train": ["keep_positions", "make_factory", "resuming", "run", "sampler_class", "saved_run"],
}


@pytest.mark.parametrize("name", sorted(SHIMS))
def test_an_old_path_warns_and_gives_the_same_objects(name, monkeypatch):
    new = importlib.import_module(f"lerobot_sql.torch.{name}")
    monkeypatch.delitem(sys.modules, f"lerobot_sql.{name}", raising=False)  # imported afresh: the warning is said
    with pytest.warns(DeprecationWarning, match=rf"lerobot_sql\.{name} moved to lerobot_sql\.torch\.{name}"):
        old = importlib.import_module(f"lerobot_sql.{name}")
    public = [n for n in dir(new) if not n.startswith("_")]
    assert set(SHIMS[name]) <= set(public)
    assert [n for n in public if getattr(old, n, None) is not getattr(new, n)] == []
    for n in SHIMS[name]:
        # a pickled reference to the old path (a class or function by name) still resolves, to the new home's object
        assert pickle.loads(f"clerobot_sql.{name}\n{n}\n.".encode()) is getattr(new, n)
        # what is pickled now names the new home (the module or one it took the name from, e.g. train's samplers
        # from train_sampler), so unpickling never needs the old path
        assert getattr(new, n).__module__ in (f"lerobot_sql.torch.{name}", f"lerobot_sql.torch.{name}_sampler")


def test_the_package_and_the_folder_import_without_torch():
    """torch loads when a torch-facing name is asked for, not at ``import lerobot_sql`` nor ``import lerobot_sql.torch``
    (whose names load lazily), nor with the wing's torch-free modules."""
    code = ("import sys, lerobot_sql, lerobot_sql.torch, lerobot_sql.torch.meta, lerobot_sql.torch.ray_data, "
            "lerobot_sql.torch.train; assert 'torch' not in sys.modules, 'torch imported'; "
            "assert lerobot_sql.torch.LeRobotSQLDataset is lerobot_sql.LeRobotSQLDataset; "
            "assert 'torch' in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
