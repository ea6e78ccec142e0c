"""One training set over several datasets: :class:`CollectionDataset`, what ``Collection.dataset(sql)`` returns.

Each selected dataset gets its own :class:`~lerobot_sql.torch.dataset.LeRobotSQLDataset` over its part of the
collection's manifest (so an item is exactly that dataset's item), and the collection dataset maps its sample ``i``
to (dataset, position): ``dataset_index[i]`` and ``local[i]``, two int arrays built once in the main process. Keys
are renamed per dataset (``rename=``) and kept per ``features=``; items gain ``dataset`` (the name) and
``dataset_index``. Workers never touch DuckDB: the parts are plain datasets and pickle as they do.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .._format.info import usable_camera_folder
from .._plan.manifest import collection_meta, dataset_codes, part_of
from ..errors import DatasetFormatError, ResultContractError, did_you_mean
from .batch import begin
from .dataset import Batch, LeRobotSQLDataset, item_index
from .mixture_meta import CollectionMetadata, collection_episodes

# Keys every item has that are not features: kept whatever ``features`` says.
_DEFAULT = ("index", "episode_index", "frame_index", "timestamp", "task_index")
# Keys a collection item adds to its dataset's item (CollectionDataset._finish): a feature or query column of one of
# these names would be written over in every item and batch.
ADDED = ("dataset", "dataset_index")


def _item_spec(layout, key: str) -> tuple:
    """What an item holds under feature ``key``: (kind, dtype, shape); cameras (C, H, W)."""
    f = layout.features[key]
    if f.is_video or f.is_image:
        return ("camera", f.shape)
    return ("vector", f.dtype, tuple(f.shape))


def line_up(coll, manifest: pa.Table, names: list[str], features=None, rename=None,
            why: str = "so they cannot be batched together", added: tuple[str, ...] = ()
            ) -> tuple[list[str], dict[str, dict[str, str]], set[str]]:
    """The item keys of a collection manifest's datasets, checked to line up: ``(present, keymaps, keys)``, the
    datasets with samples (in ``names`` order), per dataset ``{source feature key: item key}`` (``rename``
    applied; the keys every item has are left out), and the feature keys kept (``features``, or every key).
    ``why`` ends the first sentence of the refusal (what the mismatch prevents); ``added``: the keys the caller's
    items add (:data:`ADDED` for ``coll.dataset()``), which no kept feature may be named.
    ``CollectionDataset.build`` and ``Collection.export`` share this one rule.

    Raises:
        DatasetFormatError: a kept feature (after ``rename``) is named like a key of ``added`` (:func:`check_added`).
        ResultContractError: ``features`` names keys no selected dataset has; a kept key is missing in some
            datasets, or differs between them (a vector's dtype or shape, a camera's shape), naming datasets and keys.
        KeyError / ValueError: ``rename`` names an unknown dataset or key, or maps two keys to one name.
    """
    if isinstance(features, str):
        raise TypeError(f"features={features!r}: give a list of feature keys, e.g. features=[{features!r}]")
    rename = dict(rename or {})
    # Names an item already gives a meaning: a feature renamed onto one would replace it or be replaced.
    reserved = set(_DEFAULT) | {"task", "dataset", "dataset_index"}
    for n, mapping in rename.items():
        if n not in coll.names:
            raise KeyError(f"rename: no dataset {n!r} in the collection {coll.names}.{did_you_mean(n, coll.names)}")
        feats = coll[n].layout.features
        for k, v in mapping.items():
            if k not in feats:
                raise KeyError(f"rename[{n!r}]: dataset {n!r} has no feature {k!r}.{did_you_mean(k, feats)}")
            if k in _DEFAULT:  # a feature named like an added key (dataset_index) is renamed: that is its fix
                raise ValueError(f"rename[{n!r}]: {k!r} is a default column every item has under its own name; "
                                 "only features (cameras, vectors) are renamed")
            # v's padding key too (delta_timestamps on it): a feature of that name would be written over
            pad_taken = isinstance(v, str) and f"{v}_is_pad" in feats and f"{v}_is_pad" not in mapping
            if not isinstance(v, str) or not v or v in reserved or v.endswith("_is_pad") or \
                    (v in feats and v not in mapping) or pad_taken:
                raise ValueError(f"rename[{n!r}]: {k!r} -> {v!r} would take a name the item already uses "
                                 f"({'one of its features' if v in feats or pad_taken else 'a key every item carries'}"
                                 f"{f': {v}_is_pad, its padding key' if pad_taken else ''}); choose another name")
            if feats[k].dtype == "video" and not usable_camera_folder(v):
                # an export writes videos/<key>/...: "../../victim" wrote the mp4 over a file outside the export
                raise ValueError(f"rename[{n!r}]: camera {k!r} -> {v!r}: a camera key names its videos/ folder, so "
                                 "it must be plain path segments (not absolute, no empty, '.' or '..' segment); "
                                 "choose another name")
        targets = list(mapping.values())
        if len(set(targets)) != len(targets):
            raise ValueError(f"rename[{n!r}] maps two keys to one name: {mapping}")
        cams = [mapping.get(k, k) for k in feats if feats[k].dtype == "video"]
        nested = [(a, b) for a in cams for b in cams if a != b and b.startswith(a + "/")]
        if nested:  # one camera's folder inside another's (videos/a/b/... under videos/a/chunk-...)
            raise ValueError(f"rename[{n!r}]: camera {nested[0][1]!r} would be a folder inside camera "
                             f"{nested[0][0]!r}'s videos/ folder; choose another name")
    present = [n for n in names if n in set(pc.unique(manifest["dataset"].cast(pa.string())).to_pylist())]
    # Item keys per dataset: source feature key -> item key.
    keymaps = {}
    specs: dict[str, dict[str, tuple]] = {}
    for n in present:
        lay = coll[n].layout
        m = {k: rename.get(n, {}).get(k, k) for k in lay.features if k not in _DEFAULT}
        inv = [v for v in m.values()]
        dup = sorted({v for v in inv if inv.count(v) > 1})
        if dup:
            raise ValueError(f"rename[{n!r}]: {dup} would name two features of {n!r}")
        keymaps[n] = m
        specs[n] = {m[k]: _item_spec(lay, k) for k in m}
    wanted = set(features) if features is not None else None
    if wanted is not None:
        known = set().union(*[set(s) for s in specs.values()])
        unknown = sorted(wanted - known - set(_DEFAULT))
        if unknown:
            raise ResultContractError(f"features={unknown}: no selected dataset has them (after rename); keys: "
                                      f"{sorted(known)}.{did_you_mean(unknown[0], known)}")
    keys = wanted - set(_DEFAULT) if wanted is not None else set().union(*[set(s) for s in specs.values()])
    check_added(coll, present, keymaps, keys, added)  # before the line-up problems: the clash is the cause
    problems = []
    for k in sorted(keys):
        have = {n: specs[n].get(k) for n in present}
        missing = [n for n, v in have.items() if v is None]
        if missing:
            problems.append(f"{k!r} is missing in {missing} (present in "
                            f"{[n for n, v in have.items() if v is not None]})")
            continue
        if len(set(have.values())) > 1:
            problems.append(f"{k!r} differs: " + ", ".join(f"{n}: {v}" for n, v in have.items()))
    if problems:
        raise ResultContractError(
            f"the selected datasets' items do not line up, {why}: "
            + "; ".join(problems[:6]) + ". Pass features=[...] with the keys to keep, rename={dataset: "
            "{its key: common key}} to line names up, or select fewer datasets")
    return present, keymaps, keys


def check_added(coll, present: list[str], keymaps: dict[str, dict[str, str]], keys: set[str],
                added: tuple[str, ...]) -> None:
    """Refuse a kept feature whose item key (after ``rename``) is one of ``added``, the keys the collection's items
    add: written over in every item and batch (a dataset's own ``dataset_index`` 6-vector came back as tensor(0)).

    Raises:
        DatasetFormatError: naming each such dataset and feature, and the ``rename=`` that keeps it under another
            name (one name for all of them, so that they still line up).
    """
    hits = [(n, src, item) for n in present for src, item in keymaps[n].items() if item in added and item in keys]
    if not hits:
        return
    taken = {k for n in present for k in keymaps[n].values()}
    fix = {}
    for n, src, item in hits:
        new = f"source.{item}"
        while new in taken:  # a name no selected dataset's item uses yet
            new = f"source.{new}"
        fix.setdefault(n, {})[src] = new
    which = "; ".join(f"dataset {n!r} ({coll[n].source.url}) has a feature {src!r}" +
                      (f" renamed to {item!r}" if src != item else "") for n, src, item in hits)
    meaning = "the dataset's name" if hits[0][2] == "dataset" else "the dataset's position in coll.names"
    raise DatasetFormatError(
        f"{which}: every collection item adds its own {hits[0][2]!r} ({meaning}), which would replace the "
        f"feature's values in every item and batch. Keep the feature under another name, e.g. rename={fix!r}, or "
        "leave it out with features=[...]")


class CollectionDataset(torch.utils.data.Dataset):
    """A torch Dataset over a query's samples across a collection (see the module docstring).

    Item ``i``: the item of dataset ``names[dataset_index[i]]`` for its sample, keys renamed, plus ``dataset``
    (str) and ``dataset_index`` (int64 0-d tensor). ``__getitems__`` fetches a batch per dataset (each part's
    batched fetch) and returns what ``default_collate`` of the items would give.

    Attributes:
        names: every dataset name of the collection (``dataset_index`` values index it).
        parts: name -> the :class:`~lerobot_sql.torch.dataset.LeRobotSQLDataset` of that dataset's samples.
        dataset_index: int32 (N,), each sample's dataset; ``local``: int64 (N,), its position in its part.
        manifest: the collection manifest (``dataset`` column first).
    """

    def __init__(self, names: list[str], parts: dict[str, LeRobotSQLDataset], dataset_index: np.ndarray,
                 local: np.ndarray, keymaps: dict[str, dict[str, str]], drop: dict[str, set[str]],
                 manifest: pa.Table):
        self.names, self.parts = list(names), parts
        self.dataset_index, self.local = dataset_index, local
        self._keymaps, self._drop = keymaps, drop
        # item key -> source key per dataset, for the batch path (built once, not per batch and key)
        self._inverse = {n: {v: k for k, v in m.items()} for n, m in keymaps.items()}
        self._by_code = [parts.get(n) for n in names]
        self.manifest = manifest
        self._meta_obj: CollectionMetadata | None = None

    @classmethod
    def build(cls, coll, manifest: pa.Table, *, features=None, rename=None, options: dict | None = None,
              aligns: dict[str, str] | None = None) -> "CollectionDataset":
        """The dataset of collection ``coll``'s ``manifest`` (see ``Collection.dataset`` for the arguments)."""
        meta = collection_meta(manifest)
        names = meta["names"]
        options = dict(options or {})
        present, keymaps, keys = line_up(coll, manifest, names, features, rename, added=ADDED)
        for n in present:  # a query column under an added key would be replaced as a feature would
            taken = [c for c in json.loads(meta["manifests"][n]).get("extras", ()) if c in ADDED]
            if taken:
                raise ResultContractError(f"dataset {n!r}: result column {taken[0]!r} has the name of a key every "
                                          f"collection item adds, which would replace it; alias it (e.g. `... AS "
                                          f"my_{taken[0]}`) in: {meta.get('sql')!r}")
        drop = {n: {k for k in keymaps[n].values() if k not in keys} for n in present}
        delta = options.pop("delta_timestamps", None) or {}
        unknown = sorted(set(delta) - keys)
        if unknown:
            raise ValueError(f"delta_timestamps keys {unknown} are not item keys of this selection: "
                             f"{sorted(keys)}.{did_you_mean(unknown[0], keys)}")
        cameras_opt = options.pop("cameras", None)
        codes = dataset_codes(manifest, names)
        parts = {}
        idx = np.empty(manifest.num_rows, np.int32)
        local = np.empty(manifest.num_rows, np.int64)
        for n in present:
            code = names.index(n)
            sub, pos = part_of(manifest, n, code, meta, codes)
            inv = {v: k for k, v in keymaps[n].items()}
            lay = coll[n].layout
            cams = [k for k in lay.camera_keys if keymaps[n][k] in keys]
            if cameras_opt is not None:
                cams = [k for k in cams if keymaps[n][k] in set(cameras_opt)]
            part_delta = {inv[k]: v for k, v in delta.items()}
            try:
                parts[n] = coll[n].dataset(sub, delta_timestamps=part_delta or None, cameras=cams,
                                           align=(aligns or {}).get(n, "timestamp"), **options)
            except (ValueError, ResultContractError) as e:
                raise type(e)(f"dataset {n!r}: {e}") from e
            idx[pos] = code
            local[pos] = np.arange(len(pos))
        return cls(names, parts, idx, local, keymaps, drop, manifest)

    def __len__(self) -> int:
        return len(self.local)

    # ---- what lerobot's training code reads of a dataset (as LeRobotSQLDataset's) ----------------------------
    @property
    def meta(self) -> CollectionMetadata:
        """What ``LeRobotDatasetMetadata`` answers, for the selection across datasets
        (:mod:`lerobot_sql.torch.mixture_meta`): features as items name them, one ``fps``, ``stats`` combined by
        lerobot's ``aggregate_stats`` rule, ``episodes`` (one row per run, positions in this dataset), tasks, totals.

        Raises (on reading ``fps``): DatasetFormatError: the datasets have several fps.
        """
        if self._meta_obj is None:
            names = [n for n in self.names if n in self.parts]
            m = self.manifest
            self._meta_obj = CollectionMetadata(
                names, {n: self.parts[n].meta for n in names}, self._keymaps, self._drop,
                collection_episodes(self.names, self.dataset_index, m["episode_index"].to_numpy(),
                                    m["frame_index"].to_numpy()),
                len(self), self.repo_id)
        return self._meta_obj

    @property
    def features(self) -> dict[str, dict]:
        """info.json's ``features`` of what the items carry, keys as items name them (see :attr:`meta`)."""
        return self.meta.features

    @property
    def camera_keys(self) -> list[str]:
        """The cameras the items carry, as items name them."""
        return self.meta.camera_keys

    @property
    def fps(self) -> int | float:
        """The datasets' one fps (see :attr:`meta`)."""
        return self.meta.fps

    @property
    def num_frames(self) -> int:
        """Samples in the dataset (``len(ds)``)."""
        return len(self)

    @property
    def num_episodes(self) -> int:
        """Distinct (dataset, episode_index) pairs the samples come from."""
        return sum(p.num_episodes for p in self.parts.values())

    @property
    def episodes(self) -> None:
        """None: every row of ``meta.episodes`` belongs to this dataset (as a single dataset's)."""
        return None

    @property
    def absolute_to_relative_idx(self) -> None:
        """None: ``meta.episodes`` ranges are positions in this dataset (lerobot 0.6's sampler reads it)."""
        return None

    @property
    def repo_id(self) -> str:
        """The one selected dataset's ``repo_id``; for several, their names joined by ``+``."""
        present = [n for n in self.names if n in self.parts]
        return self.parts[present[0]].repo_id if len(present) == 1 else "+".join(present)

    def _finish(self, name: str, code: int, item: dict) -> dict:
        m, drop = self._keymaps[name], self._drop[name]
        out = {}
        for k, v in item.items():
            # a padding key follows its feature's rename; a feature named like one (no deltas on its key: the part
            # refuses both at once, layout.check_item_keys) follows its own
            base, pad = (k[: -len("_is_pad")], "_is_pad") if k.endswith("_is_pad") and k not in m and \
                k[: -len("_is_pad")] in m else (k, "")
            new = m.get(base, base)
            if new in drop:
                continue
            out[new + pad] = v
        out["dataset"] = name
        out["dataset_index"] = torch.tensor(code, dtype=torch.int64)
        return out

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):  # as a dataset's own (and lerobot 0.6's LeRobotDataset): the items, in order
            return [self[j] for j in range(*i.indices(len(self)))]
        i = item_index(i)  # as a dataset's own: a bool or a one-element tensor is a TypeError
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"item {i} out of range for a dataset of {n} samples")
        code = int(self.dataset_index[i])
        name = self.names[code]
        return self._finish(name, code, self._by_code[code][int(self.local[i])])

    def __getitems__(self, indices) -> Batch:
        """A batch: per dataset, that part's batched fetch; returns what ``default_collate`` of the items gives
        (see :meth:`lerobot_sql.torch.dataset.LeRobotSQLDataset.__getitems__`)."""
        idx = np.asarray(indices, np.int64)
        mem = begin()  # the combined batch's tensors: the worker's recycled shared memory
        try:
            return self._getitems(idx, mem)
        finally:
            if mem is not None:
                mem.close()

    def _getitems(self, idx: np.ndarray, mem) -> Batch:
        codes = self.dataset_index[idx]
        groups = []
        for code in np.unique(codes):
            where = np.flatnonzero(codes == code)
            name = self.names[int(code)]
            ds = self._by_code[int(code)]
            # each part in private memory: only the combined batch crosses to the main process
            b = ds._getitems(ds._batch_indices(self.local[idx[where]].tolist()), None)
            groups.append((int(code), name, where, b))
        order = np.concatenate([g[2] for g in groups])
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        first = self._finish(groups[0][1], groups[0][0], dict(groups[0][3][0])) if len(idx) else {}
        keys = list(first)
        tensors, lists = {}, {}
        for key in keys:
            if key in ("dataset", "dataset_index"):
                continue
            per = []
            for _code, name, _where, b in groups:
                src = self._source_key(name, key)
                per.append(b.tensors[src] if src in b.tensors else b.lists[src])
            if all(isinstance(p, torch.Tensor) for p in per):
                if mem is None:
                    t = per[0] if len(per) == 1 else torch.cat(per)
                    tensors[key] = t if len(per) == 1 else t[torch.from_numpy(inverse)]
                else:  # rows scattered straight into the batch slot
                    dtype = functools.reduce(torch.promote_types, [p.dtype for p in per])  # as torch.cat
                    out = mem.tensor((len(idx), *per[0].shape[1:]), dtype)
                    for (_, _, where, _), p in zip(groups, per):
                        out[torch.from_numpy(where)] = p
                    tensors[key] = out
            else:
                flat = [x for p in per for x in (p.tolist() if isinstance(p, torch.Tensor) else p)]
                lists[key] = [flat[j] for j in inverse] if len(per) > 1 else flat
        lists["dataset"] = [self.names[int(c)] for c in codes]
        tensors["dataset_index"] = torch.from_numpy(codes.astype(np.int64)) if mem is None else \
            mem.tensor((len(idx),), torch.int64).copy_(torch.from_numpy(codes.astype(np.int64)))
        return Batch(keys, tensors, lists, len(idx), mem)

    def _source_key(self, name: str, key: str) -> str:
        inv = self._inverse[name]
        if key not in inv and key.endswith("_is_pad") and key[: -len("_is_pad")] in inv:
            return inv[key[: -len("_is_pad")]] + "_is_pad"
        return inv.get(key, key)

    def __repr__(self) -> str:
        counts = np.bincount(self.dataset_index, minlength=len(self.names))
        return (f"CollectionDataset(samples={len(self)}, "
                + ", ".join(f"{n}={int(c)}" for n, c in zip(self.names, counts) if c) + ")")


__all__ = ["CollectionDataset"]
