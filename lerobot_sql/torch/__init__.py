"""The training wing: PyTorch datasets, samplers, batches, manifest sharding and the Ray Data hand-off, after the
manifest (files only, never DuckDB). torch is imported here and, besides this folder, only by ``lerobot_sql.demo``
(``tests/test_layering.py`` holds that as a folder rule).

Public names: :class:`LeRobotSQLDataset` (``db.dataset(sql)``), :class:`CollectionDataset` (``coll.dataset(sql)``),
the samplers :class:`EpisodeAwareSampler`, :class:`EpisodeShardedSampler`, :class:`MixtureSampler`, :class:`WeightedSampler`, :class:`Batch`
(what ``__getitems__`` returns), :func:`shard_manifest` and :class:`ShardedManifestDataset`
(:mod:`lerobot_sql.torch.shard`), :class:`Decoder` (:mod:`lerobot_sql.torch.ray_data`). The public modules:
``dataset``, ``samplers``, ``shard``, ``ray_data``, ``meta`` (``ds.meta``) and ``train`` (``lerobot-sql train``).

``import torch`` inside this folder is an absolute import: it finds the real torch, not this package.
"""

from __future__ import annotations

# Each name loads its module on first use, so importing the folder, or one of its modules that never needed torch
# (meta, ray_data, train, _samples), still does not import torch: an eager import here would load it for all of them.
_HOME = {
    "LeRobotSQLDataset": "dataset",
    "CollectionDataset": "mixture",
    "EpisodeAwareSampler": "samplers",
    "EpisodeShardedSampler": "samplers",
    "MixtureSampler": "samplers",
    "WeightedSampler": "samplers",
    "Batch": "batch",
    "shard_manifest": "shard",
    "ShardedManifestDataset": "shard",
    "Decoder": "ray_data",
}


def __getattr__(name: str):
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))  # the lazily loaded names too


__all__ = list(_HOME)
