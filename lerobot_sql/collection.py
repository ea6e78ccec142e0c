"""``connect_many()`` and the ``Collection`` it returns: SQL across many LeRobot datasets, and one training set from a
query over them.

Why a function of its own rather than ``connect([...])``: :func:`lerobot_sql.connect` returns a
:class:`~lerobot_sql.db.Database`, whose contract is one dataset (``db.layout``, ``db.fps``, ``db.files``, one
``episode_index`` numbering). A collection has none of these as single values, so it is a different type, and a
call that returned one or the other depending on its argument would leave every reader of ``db.fps`` guessing.

Identity across a collection is ``(dataset, episode_index)`` for an episode and ``(dataset, index)`` for a frame:
every dataset numbers its episodes and frames from 0. Every view has the ``dataset`` column (the dataset's short
name), and a query turned into a training set must return it.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._catalog import macros, sandbox
from ._catalog.union import CollectionConnection
from ._format import stats_json
from ._format.files import open_files
from ._format.layout import dataset_folders_in
from ._plan import manifest as _manifest
from ._readers import locate
from ._sql import QueryFace
from ._storage import cache
from .db import Database
from .errors import LeRobotSQLError, MissingFileError, ResultContractError, did_you_mean, warn


def is_dataset_root(path: str) -> bool:
    """True when the local folder ``path`` is a dataset root (holds meta/info.json)."""
    return os.path.isfile(os.path.join(path, "meta", "info.json"))


def expand_sources(sources) -> list[str]:
    """The dataset roots ``sources`` names, in order: a list (or tuple) of roots, each a local dataset folder, an
    fsspec URL or a Hub id; a local glob (``/data/so101_*``: the matches that are datasets, sorted); a local folder
    that is not a dataset itself but holds datasets (its sub-folders, one or two levels down, that have
    meta/info.json, sorted).

    Raises:
        MissingFileError: a glob or folder holds no dataset; ``sources`` is empty.
    """
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    out: list[str] = []
    for item in items:
        s = os.fspath(item)
        if "://" not in s and any(ch in s for ch in "*?["):
            hits = [h for h in sorted(glob.glob(s)) if is_dataset_root(h)]
            if not hits:
                raise MissingFileError(f"{s}: the glob matches no dataset folder (one holding meta/info.json)")
            out += hits
        elif "://" not in s and os.path.isdir(s) and not is_dataset_root(s):
            hits = dataset_folders_in(s)
            if not hits:
                raise MissingFileError(f"{s}: neither a dataset (no meta/info.json) nor a folder of datasets (no "
                                       "sub-folder holds meta/info.json)")
            out += hits
        else:
            out.append(s)
    if not out:
        raise MissingFileError("connect_many: no datasets given; pass roots, a glob or a folder of datasets")
    return out


def default_names(roots: list[str]) -> list[str]:
    """Short stable names: each root's last path part (a Hub id's repo name), made unique by adding the part
    before it (``org_name``), then a counter."""
    def parts(r: str) -> list[str]:
        r = r.split("://", 1)[-1].rstrip("/\\")
        return [p for p in r.replace("\\", "/").split("/") if p]

    last = [(parts(r) or [f"dataset{i}"])[-1] for i, r in enumerate(roots)]
    names = ["_".join(parts(r)[-2:]) if last.count(last[i]) > 1 and len(parts(r)) > 1 else last[i]
             for i, r in enumerate(roots)]
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 and names.count(n) == 1 else f"{n}_{seen[n]}")
    return out


class Collection(QueryFace):
    """Several datasets under one SQL connection: every view spans them all with a ``dataset`` column. Make it
    with :func:`connect_many`.

    Attributes:
        names: the datasets' names, in order (the values of the ``dataset`` column).
        members: name -> the dataset's own :class:`~lerobot_sql.db.Database` (``coll["name"]`` too), for what is
            per dataset (``doctor``, ``export`` of one dataset, its own SQL).

    Views: ``datasets`` (one row per dataset: name, root, codebase_version, fps, robot_type, totals, features,
    camera_keys), and ``episodes``, ``episode_stats``, ``frames``, ``frames_ext``, ``tasks``, ``videos``,
    ``video_frames``, ``video_files``, ``camera_frames``, ``features``, ``info``: each dataset's view of that name,
    its rows tagged with ``dataset``; a column some datasets lack is NULL in the others' rows; vectors of
    different lengths become lists. The table macros (``first_event``, ``event_windows``, ``segments``,
    ``nearest_camera_frame``) return ``dataset`` first and work per ``(dataset, episode_index)``.
    """

    _TABLE_MACROS = macros.COLLECTION_TABLE_MACROS

    def __init__(self, roots: list[str], names: list[str], *, storage_options: dict | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_size: int | str | None = None,
                 threads: int | None = None, memory_limit: str | None = None,
                 temp_directory: str | os.PathLike | None = None):
        sandbox.check_settings(threads, memory_limit)  # a typo is named before any dataset is opened
        settings = dict(threads=threads, memory_limit=memory_limit, temp_directory=temp_directory)
        self.names: list[str] = list(names)
        self.members: dict[str, Database] = {}
        for name, root in zip(names, roots):
            cdir = Path(cache_dir) / cache.key(os.fspath(root)) if cache_dir else None
            try:
                files = open_files(root, storage_options=storage_options, cache_dir=cdir, cache_size=cache_size)
            except LeRobotSQLError as e:
                raise type(e)(f"dataset {name!r} ({root}): {e}") from e
            self.members[name] = Database._of(files, **settings)
        self._init_queries(CollectionConnection(self.names, [m.files for m in self.members.values()], **settings))

    def __getitem__(self, name: str) -> Database:
        """The dataset ``name``'s own Database.

        Raises:
            KeyError: no dataset of that name (with a did-you-mean).
        """
        try:
            return self.members[name]
        except KeyError:
            raise KeyError(f"no dataset {name!r} in this collection (its datasets: {self.names})."
                           f"{did_you_mean(name, self.names)}") from None

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self):
        return iter(self.names)

    # ---- query -> manifest ------------------------------------------------------------------------------------
    def manifest(self, sql: str, *, extras: bool = True, align: str | dict[str, str] = "timestamp",
                 tolerance_s: float | None = None) -> pa.Table:
        """The manifest of a query over the collection: one row per sample, a ``dataset`` column (dictionary of the
        names) first, then each dataset's own manifest columns (:mod:`lerobot_sql._plan.manifest`; a camera
        column of another dataset is NULL). Each dataset's rows are resolved by that dataset alone.

        The result must hold ``dataset`` and one of the contracts of :meth:`Database.dataset` (``index`` rows,
        ``episode_index, start_s, end_s`` windows, ``episode_index`` rows), each per dataset. Samples follow the
        result's order with ORDER BY; without one, datasets come in :attr:`names` order, each in its own
        deterministic order. ``result_row`` is the row of the whole result. ``extras=False``: as
        :meth:`Database.manifest` (what :meth:`export` resolves). ``align``: as :meth:`Database.manifest`, for
        every dataset (a string) or per dataset (``{name: "frame_index"}``; datasets not named: ``"timestamp"``).
        ``tolerance_s``: as :meth:`Database.manifest` (how far each row's timestamp may be off the fps grid).

        Raises:
            ResultContractError: no ``dataset`` column, a NULL or unknown name in it, or a dataset's rows break its
                contract (the dataset is named).
            ValueError / KeyError: ``align`` not one of the two modes, or naming a dataset not in the collection.
        """
        aligns = self._aligns(align)
        checked, result = self._capped_result(sql)
        if result.num_rows == 0:
            raise ResultContractError(f"the query returned no rows, so there is nothing to train on: {sql!r}")
        if "dataset" not in result.column_names:
            raise ResultContractError(
                "a query over a collection must return the dataset column beside the frames it selects (identity "
                "is (dataset, index) and (dataset, episode_index): each dataset numbers its own), e.g. SELECT "
                f"dataset, index FROM frames WHERE ...; got columns {result.column_names}: {sql!r}")
        return self._resolve(result, sql, checked.ordered, extras, aligns, tolerance_s)

    def _aligns(self, align: str | dict[str, str]) -> dict[str, str]:
        """``align`` as ``{name: mode}`` for every dataset (see :meth:`manifest`), each mode checked."""
        if isinstance(align, dict):
            unknown = [n for n in align if n not in self.members]
            if unknown:
                raise KeyError(f"align names {unknown[0]!r}, not a dataset of this collection ({self.names})."
                               f"{did_you_mean(str(unknown[0]), self.names)}")
            return {n: locate.check_align(align.get(n, "timestamp")) for n in self.names}
        return dict.fromkeys(self.names, locate.check_align(align))

    def _resolve(self, result: pa.Table, sql: str, ordered: bool, extras: bool = True,
                 aligns: dict[str, str] | None = None, tolerance_s: float | None = None) -> pa.Table:
        col = result["dataset"]
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
                or pa.types.is_dictionary(col.type)):
            raise ResultContractError(f"the dataset column must hold dataset names (text), not {col.type}: {sql!r}")
        col = col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col
        codes = pc.index_in(col, value_set=pa.array(self.names, pa.string()))
        if codes.null_count:
            bad = pc.unique(pc.filter(col, pc.is_null(codes))).to_pylist()
            shown = ", ".join("NULL" if b is None else repr(b) for b in bad[:5])
            hint = did_you_mean(str(bad[0]), self.names) if bad[0] is not None else ""
            raise ResultContractError(f"the dataset column holds {shown}, not the name of a dataset of this collection "
                                      f"({self.names}): {sql!r}.{hint}")
        codes = codes.to_numpy(zero_copy_only=False).astype(np.int32)
        rest = result.drop_columns(["dataset"])
        parts, offset = [], 0
        for code in np.unique(codes):  # names order
            name = self.names[code]
            member = self.members[name]
            pos = np.flatnonzero(codes == code)
            member._check_links()
            cursor = []  # made on first use: whole episodes resolve from the pointers without DuckDB

            def con(code=int(code), cursor=cursor):
                if not cursor:
                    cursor.append(self._connection.source_cursor(code))
                return cursor[0]

            try:
                m = member._resolve(rest.take(pa.array(pos)), sql, ordered, con=con, before=sum(len(q) for _, q in parts),
                                    extras=extras, align=(aligns or {}).get(name, "timestamp"), tolerance_s=tolerance_s)
            except ResultContractError as e:
                raise type(e)(f"dataset {name!r}: {e}") from e
            finally:
                for c in cursor:
                    c.close()
            rr = m["result_row"].to_numpy()
            # result_row: the row of the whole result (ordered), or this dataset's rows after the ones before it
            m = m.set_column(m.column_names.index("result_row"), "result_row",
                             pa.array(pos[rr] if ordered else rr + offset, pa.int64()))
            offset += len(pos)
            parts.append((int(code), m))
        return _manifest.collection_manifest(parts, self.names, {n: self.members[n].source.url for n in self.names},
                                             sql, ordered)

    def dataset(self, sql: str | os.PathLike | pa.Table, *, features: list[str] | None = None,
                rename: dict[str, dict[str, str]] | None = None, align: str | dict[str, str] = "timestamp",
                **options: Any):
        """One torch Dataset over a query's frames across the collection; item ``i`` is the item its dataset's own
        :meth:`Database.dataset` gives for that frame (equal value for value), with keys renamed by ``rename``,
        only the ``features`` kept, and two more keys: ``dataset`` (str, the name) and ``dataset_index`` (int64
        tensor, the dataset's position in :attr:`names`).

        Args:
            sql: a str is SQL: a query returning ``dataset`` and a contract of :meth:`Database.dataset` per
                dataset. A manifest from :meth:`manifest` is given as the Arrow table, or as an ``os.PathLike``
                (``pathlib.Path``) naming the Parquet file it was written to with ``pyarrow.parquet.write_table``
                (a str naming an existing .parquet file is still read as one, with a DeprecationWarning, until
                0.3).
            features: the feature keys items carry (after ``rename``; default: every feature of the selected
                datasets, which must then agree). Keys that are not features (``index``, ``episode_index``,
                ``frame_index``, ``timestamp``, ``task_index``, ``task``, extra result columns) are always kept.
            rename: per dataset, ``{source key: key in items}``, e.g. ``{"site_b": {"observation.images.top":
                "observation.images.front"}}``, so that cameras and vectors named differently line up; also applies to
                ``delta_timestamps`` keys and ``_is_pad`` keys.
            align: how camera frames are found, as :meth:`Database.dataset`'s ``align``: one mode for every dataset,
                or per dataset (``{"site_b": "frame_index"}``, others ``"timestamp"``), for a collection holding a
                dataset whose ``timestamp`` column is wall-clock time.
            options: as :meth:`Database.dataset` (``delta_timestamps`` in seconds with keys as items name them,
                ``tolerance_s``, ``return_uint8``, ``image_transforms``, ``decoder_threads`` ...); each dataset checks
                ``delta_timestamps`` against its own fps.

        Raises:
            ResultContractError: as :meth:`manifest`; the selected datasets' features do not line up (a key missing
                in some, a vector of another length or dtype, a camera of another resolution), naming datasets and
                keys and the fix (``features=`` / ``rename=``).
            KeyError: ``rename`` names an unknown dataset or a key the dataset does not have.
            DatasetFormatError: a kept feature of a dataset is named ``dataset`` or ``dataset_index`` (after
                ``rename``), the keys every item adds, naming the ``rename=`` that keeps it; or as
                :meth:`Database.dataset` (a feature named ``task`` or ``<key>_is_pad``).
        """
        from .torch.mixture import CollectionDataset

        aligns = self._aligns(align)
        # verify=False: each part's Database.dataset checks its own rows (once, not twice)
        manifest = self._manifest_of(sql, aligns=aligns, verify=False)
        return CollectionDataset.build(self, manifest, features=features, rename=rename, options=options,
                                       aligns=aligns)

    def _manifest_of(self, sql: str | os.PathLike | pa.Table, extras: bool = True,
                     aligns: dict[str, str] | None = None, tolerance_s: float | None = None,
                     verify: bool = True) -> pa.Table:
        """The collection manifest ``sql`` stands for: a saved one (an ``os.PathLike``) or a table, checked to be of
        this collection (:meth:`_check_manifest_source`) and, with ``verify``, row by row (:meth:`_verify_parts`),
        else the manifest of the query, a str (``extras`` as :meth:`manifest`)."""
        where = "the table passed to the collection"
        path = _manifest.manifest_path_of(sql)  # a str is SQL (one naming an existing .parquet file: deprecated)
        if path is not None:
            where = f"the manifest file {os.fspath(path)}"
            sql = _manifest.read_manifest_file(path, "pyarrow.parquet.write_table(coll.manifest(sql), path)")
        if isinstance(sql, pa.Table):
            self._check_manifest_source(sql)
            # a manifest with its location columns dropped (m.select([...]) keeps the metadata) met a bare
            # KeyError deep in the reader
            _manifest.check_columns(sql, where)
            if verify:
                self._verify_parts(sql, where, aligns or {}, tolerance_s)
            return sql
        with _manifest.path_hint(sql):
            return self.manifest(sql, extras=extras, align=aligns or "timestamp", tolerance_s=tolerance_s)

    def _verify_parts(self, manifest: pa.Table, where: str, aligns: dict[str, str],
                      tolerance_s: float | None) -> None:
        """Check a given collection manifest (hostile input: a saved file may have been edited) part by part, each
        dataset's rows against what its own planner derives for the frames their ``index`` names
        (:meth:`Database._verify_manifest`). ``dataset()`` needs no call: each part's ``Database.dataset`` checks
        its table; ``export`` and ``stats`` read the manifest's columns directly, and an edited camera
        ``from_timestamp`` or ``file`` was exported as the next frame or the other camera's picture.

        Raises:
            ResultContractError: a row differs, naming ``where``, the dataset, the row, the column and the fix.
        """
        meta = _manifest.collection_meta(manifest)
        codes = _manifest.dataset_codes(manifest, meta["names"])
        for code, name in enumerate(meta["names"]):
            part, pos = _manifest.part_of(manifest, name, code, meta, codes)
            if len(pos):
                self.members[name]._verify_manifest(part, f"{where}, dataset {name!r}", cameras=None,
                                                    tolerance_s=tolerance_s, align=aligns.get(name, "timestamp"))

    def _check_manifest_source(self, manifest: pa.Table) -> None:
        """Refuse a collection manifest made over other datasets (names or roots differ): its index values are those
        datasets' frames.

        Raises:
            ResultContractError: naming what differs.
        """
        meta = _manifest.collection_meta(manifest)
        roots = {n: self.members[n].source.url for n in self.names}
        if meta.get("names") != self.names or meta.get("roots", roots) != roots:
            theirs = meta.get("roots") or dict.fromkeys(meta.get("names") or [])
            raise ResultContractError(
                f"a manifest of the collection {theirs}, opened through the collection {roots}: its index values are "
                "those datasets' frames. Open it through a collection of the same datasets under the same names, "
                "or build it again with coll.manifest(sql)")

    def stats(self, sql: str | os.PathLike | pa.Table | None = None, *, per_dataset: bool = False,
              rename: dict[str, dict[str, str]] | None = None) -> dict:
        """Statistics of a selection across the collection, in lerobot's ``meta/stats.json`` form (see
        :meth:`Database.stats` and :mod:`lerobot_sql.stats`).

        Each dataset's statistics are those of its own selected samples (:meth:`Database.stats`: numeric features
        exact, cameras aggregated from per-episode statistics). Across datasets, per feature key (after
        ``rename``) over the datasets that have it, they are combined by lerobot's ``aggregate_stats`` rule
        (:func:`lerobot_sql._format.stats_json.aggregate`): min of mins, max of maxes, count-weighted mean, pooled population
        std, total count, which is exact for min/max/mean/std/count of numeric features; quantiles are
        count-weighted means of each dataset's quantiles (an estimate, as lerobot's).

        Args:
            sql: a str is SQL, a collection query (``dataset`` plus a contract); or a collection manifest, as
                :meth:`dataset` takes it (the table, or an ``os.PathLike`` naming its Parquet file); None: every
                episode.
            per_dataset: return ``{dataset: its stats}`` instead of the combined statistics.
            rename: as :meth:`dataset`, so that differently named features combine.

        Raises:
            ValueError: the selection is empty. QueryError, ResultContractError: as :meth:`manifest`.
            Features whose shapes differ between datasets (a 6- and a 14-dim state) are not combined: they are
            left out with a warning naming the datasets (``per_dataset=True`` has them).
        """
        manifest = self._manifest_of(sql if sql is not None else "SELECT dataset, episode_index FROM episodes")
        meta = _manifest.collection_meta(manifest)
        codes = _manifest.dataset_codes(manifest, meta["names"])
        per: dict[str, dict] = {}
        for code, name in enumerate(meta["names"]):
            part, pos = _manifest.part_of(manifest, name, code, meta, codes)
            if not len(pos):
                continue
            cur = self._connection.source_cursor(code)
            try:
                got = self.members[name]._selection_stats(part, con=cur)
            finally:
                cur.close()
            m = (rename or {}).get(name, {})
            per[name] = {m.get(k, k): v for k, v in got.items()}
        if per_dataset:
            return per
        out: dict[str, dict] = {}
        keys = list(dict.fromkeys(k for s in per.values() for k in s))
        for k in keys:
            have = {n: s[k] for n, s in per.items() if k in s}
            shapes = {n: np.shape(v["mean"]) for n, v in have.items()}
            if len(set(shapes.values())) > 1:
                warn(f"stats: {k!r} has different shapes across datasets ({shapes}); it is left out of "
                     "the combined statistics (stats(..., per_dataset=True) has each)")
                continue
            out[k] = stats_json.aggregate(list(have.values())) if len(have) > 1 else next(iter(have.values()))
        return out

    def export(self, sql: str | os.PathLike | pa.Table, dest: str | os.PathLike, *, features: list[str] | None = None,
               rename: dict[str, dict[str, str]] | None = None, align: str | dict[str, str] = "timestamp",
               **kwargs: Any):
        """Write a query's frames across the collection as one new LeRobot v3.0 dataset at ``dest`` (a local
        folder); lerobot's ``aggregate_datasets``, from a query.

        The query returns ``dataset`` and a contract of :meth:`Database.export` per dataset (``episode_index`` rows:
        whole episodes; ``episode_index, start_s, end_s``: windows; ``index`` rows: runs of frames). Output episodes
        follow the result's order (see :meth:`manifest`), numbered 0..N-1, ``index`` and ``frame_index``
        renumbered as a one-dataset export does. Tasks are merged by text: one ``task_index`` per distinct text.
        meta/episodes has ``source_dataset`` (string, the dataset's name) and ``source_episode_index`` (int64, its
        episode_index there). Video packets are stream-copied (frames before a window's first keyframe are
        re-encoded, as in a one-dataset export); data values are copied; stats are copied for whole episodes and
        recomputed otherwise, then aggregated as lerobot does. info.json, chunk and file sizes are the first
        selected dataset's.

        Args:
            sql: a str is SQL, the query; or a manifest from :meth:`manifest`, as :meth:`dataset` takes it (the
                table, or an ``os.PathLike`` naming its Parquet file).
            features, rename: as :meth:`dataset`: which feature keys to write (after ``rename``; default every
                feature, which the selected datasets must then all have alike) and per dataset
                ``{its key: output key}``.
            align: as :meth:`dataset` (one mode, or per dataset); a ``"frame_index"`` dataset's rows are written
                with ``timestamp = frame_index / fps``, as :meth:`Database.export` writes them.
            kwargs: as :func:`lerobot_sql.export.export_dataset` (``overwrite``, ``progress``, ``tolerance_s``).

        Returns:
            :class:`lerobot_sql.export.ExportReport`.

        Raises:
            ResultContractError: as :meth:`manifest`; the features do not line up (a key missing in some datasets,
                a vector of another dtype or shape, a camera of another resolution), naming datasets and keys.
            IncompatibleDatasetsError (a ResultContractError): the datasets' fps or robot_type differ, or a camera's
                videos differ in codec, resolution or pixel format (naming datasets, key and values).
            KeyError / ValueError: ``rename`` names an unknown dataset or key.
            and what :meth:`Database.export` raises (destination, source files).
        """
        from . import export
        from .torch.mixture import line_up

        aligns = self._aligns(align)
        # extras are not written; the tolerance the caller gives is the one the timestamps are checked with (without
        # it the check refused asking for the very tolerance_s given)
        manifest = self._manifest_of(sql, extras=False, aligns=aligns, tolerance_s=kwargs.get("tolerance_s"))
        present, keymaps, keys = line_up(self, manifest, self.names, features, rename,
                                         why="so they cannot be written as one dataset")
        for n in present:
            self.members[n]._check_links()
        return export.export_collection(self, manifest, dest, present=present, keymaps=keymaps, keys=keys,
                                        aligns=aligns, **kwargs)

    # ---- lifecycle ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._connection.close()
        for m in self.members.values():
            m.close()

    def __enter__(self) -> "Collection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Collection({len(self.names)} datasets: {', '.join(self.names[:8])}{' ...' if len(self.names) > 8 else ''})"


def connect_many(sources, names: list[str] | dict | None = None, **kwargs: Any) -> Collection:
    """Open many LeRobot datasets as one SQL collection. Reads each meta/info.json and lists the files; copies
    no table; the DuckDB connection is made on the first query.

    Args:
        sources: the datasets: a list of roots (local folders, fsspec URLs, Hub ids), a local glob
            (``"/data/so101_*"``), or a local folder of datasets (see :func:`expand_sources`); or a dict
            ``{name: root}``.
        names: the datasets' names (the ``dataset`` column), one per root; default: each root's folder or repo
            name, made unique (:func:`default_names`).
        kwargs: as :func:`lerobot_sql.connect` (``storage_options``, ``cache_dir`` (each dataset gets its own
            sub-folder), ``cache_size``, ``threads``, ``memory_limit``, ``temp_directory``).

    Raises:
        MissingFileError: a root is not a dataset; a glob or folder holds none (each error names the dataset).
        ValueError: ``names`` has the wrong length, a repeated name or one that is not a non-empty string;
            ``threads`` / ``memory_limit`` out of range or malformed (as :func:`lerobot_sql.connect`).
        TypeError: ``threads`` is not an integer or ``memory_limit`` not a string.
    """
    if isinstance(sources, dict):
        if names is not None:
            raise ValueError("pass names either as the dict's keys or as names=, not both")
        names, roots = list(sources), [os.fspath(v) for v in sources.values()]
    else:
        roots = expand_sources(sources)
    if names is None:
        names = default_names(roots)
    names = list(names)
    if len(names) != len(roots):
        raise ValueError(f"names has {len(names)} entries for {len(roots)} datasets ({roots[:5]})")
    for n in names:
        if not isinstance(n, str) or not n.strip():
            raise ValueError(f"dataset names must be non-empty strings, got {n!r}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"dataset names must be unique; repeated: {dup}")
    seen: dict[str, str] = {}
    for r in roots:
        key = os.path.realpath(r) if "://" not in r and os.path.exists(r) else r.rstrip("/")
        if key in seen:
            # Every frame would count twice in SQL, statistics and training: an oversampled dataset is a weight
            # (MixtureSampler) or a repeated row in SQL, not a second copy of the dataset.
            raise ValueError(f"the same dataset is given twice ({seen[key]!r} and {r!r}); give each once (weight it "
                             "with MixtureSampler or repeat rows in SQL to oversample)")
        seen[key] = r
    return Collection(roots, names, **kwargs)
