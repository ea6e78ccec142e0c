"""The manifest: one row per sample, everything needed to read it, and nothing that needs SQL.

A manifest is an Arrow table (what ``db.manifest(sql)`` returns, ``db.dataset()`` trains on, ``prefetch`` downloads
for, ``export`` writes out and ``export_manifest`` saves as Parquet). This module is the one place that names its
columns and reads or writes its metadata; both resolvers (:mod:`lerobot_sql._plan.resolve`, the DuckDB join, and
:mod:`lerobot_sql._plan.episodes`, whole episodes with pyarrow) build it through :func:`finish`.

Columns, in this order:

* ``index, episode_index, frame_index`` (int64), ``timestamp`` (float32, seconds from episode start),
  ``task_index`` (int64): the frame's own values, from the data files;
* ``data_file`` (string, relative to the dataset root), ``data_row`` (int64, row in that file): where the frame's
  row lives; ``ep_from_index, ep_to_index`` (int64, half-open): the episode's full extent, for delta_timestamps
  clamping; ``ep_data_row0`` (int64): the file row of the episode's first frame;
* ``result_row`` (int64): the row of the query result the sample came from (after the deterministic sort of a
  query without ORDER BY), so that a window or episode selected twice stays two samples runs (export cuts its
  output episodes by it);
* per camera, ``<video_key>/file`` (string) and ``<video_key>/from_timestamp`` (float64, seconds: where the
  episode starts in that mp4);
* the query's extra columns, under their own names.

Schema metadata ``lerobot_sql.manifest`` (JSON, :class:`Meta`): ``mode`` (``index``, ``window`` or ``episode``),
``extras``, ``video_keys``, ``fps``, ``sql``, ``clips`` (per camera, the selected episodes' clips and their
neighbours in the file, and ``chains``: every clip of each touched mp4, which the dataset checks against the mp4's
real frames), ``cameras`` when the manifest was resolved for some cameras only (``dataset(cameras=[...])``: only
their pointers and clips were checked; the other cameras' columns may be null) and, in a saved manifest, ``root``
and ``dataset_id`` (:func:`dataset_identity`).

The file form is here too: :func:`manifest_path_of` (an entry point's argument names a file when it is an
``os.PathLike``; a str is SQL) and :func:`path_hint`, :func:`read_manifest_file`, :func:`read_schema` and
:func:`file_root` (what ``ray_data`` reads), :func:`is_manifest_file` (what an overwrite may replace),
:func:`check_source` (a manifest of another dataset is refused); and a manifest from outside (a file, a table handed
to ``dataset()``) is checked row by row against the planner's own (:func:`check_against`, the last section).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._format.jsontext import load_json
from ..errors import MissingFileError, QueryError, ResultContractError, warn

META_KEY = b"lerobot_sql.manifest"
CORE = ("index", "episode_index", "frame_index", "timestamp", "task_index")
LOCATION = ("data_file", "data_row", "ep_from_index", "ep_to_index", "ep_data_row0", "result_row")


def video_columns(video_keys) -> list[str]:
    """Per camera ``<key>/file`` and ``<key>/from_timestamp``, in camera order."""
    return [c for k in video_keys for c in (f"{k}/file", f"{k}/from_timestamp")]


def columns(video_keys, extras) -> list[str]:
    """A manifest's columns in their order (see the module docstring)."""
    return [*CORE, *LOCATION, *video_columns(video_keys), *extras]


@dataclasses.dataclass(frozen=True)
class Meta:
    """The ``lerobot_sql.manifest`` schema metadata of a manifest (see the module docstring)."""

    mode: str | None = None
    extras: tuple[str, ...] = ()
    video_keys: tuple[str, ...] = ()
    fps: float | None = None
    sql: str | None = None
    clips: dict[str, Any] = dataclasses.field(default_factory=dict)
    root: str | None = None
    dataset_id: str | None = None  # export_manifest: the source's identity (export.dataset_identity)
    cameras: tuple[str, ...] | None = None  # the cameras whose pointers and clips were checked; None: every one

    @classmethod
    def of(cls, table_or_schema: pa.Table | pa.Schema, *, where: str = "the manifest") -> "Meta":
        """The metadata of a manifest table or schema; an Arrow table without it (built by hand) gets the empty
        :class:`Meta` (no extras, no clips to check).

        Raises:
            ResultContractError: the metadata is there but is not a JSON object (invalid, nested too deeply, or
                another value), or its ``extras``, ``video_keys`` or ``cameras`` is not a list (``"extras": "tag"``
                was read letter by letter), naming ``where``.
        """
        schema = table_or_schema.schema if isinstance(table_or_schema, pa.Table) else table_or_schema
        raw = (schema.metadata or {}).get(META_KEY)
        if raw is None:
            return cls()
        fix = "write the manifest again with db.export_manifest"
        d = load_json(raw, f"{where}: its lerobot_sql.manifest metadata", fix, error=ResultContractError)
        if not isinstance(d, dict):
            raise ResultContractError(f"{where}: its lerobot_sql.manifest metadata is not a JSON object (a JSON "
                                      f"{type(d).__name__}); {fix}")
        for key in ("extras", "video_keys", "cameras"):
            if d.get(key) is not None and not isinstance(d[key], list):
                raise ResultContractError(f"{where}: its lerobot_sql.manifest metadata holds {key!r} as a JSON "
                                          f"{type(d[key]).__name__} ({d[key]!r:.80}), not a list of column names; "
                                          f"{fix}")
        return cls(mode=d.get("mode"), extras=tuple(d.get("extras") or ()),
                   video_keys=tuple(d.get("video_keys") or ()), fps=d.get("fps"), sql=d.get("sql"),
                   clips=d.get("clips") or {}, root=d.get("root"), dataset_id=d.get("dataset_id"),
                   cameras=None if d.get("cameras") is None else tuple(d["cameras"]))

    @staticmethod
    def present(schema: pa.Schema) -> bool:
        """True if ``schema`` carries manifest metadata (a file lerobot_sql wrote)."""
        return META_KEY in (schema.metadata or {})

    def attach(self, table: pa.Table) -> pa.Table:
        """``table`` with this metadata as its only schema metadata."""
        d = {"mode": self.mode, "extras": list(self.extras), "video_keys": list(self.video_keys), "fps": self.fps,
             "sql": self.sql, "clips": self.clips}
        if self.root is not None:
            d["root"] = self.root
        if self.dataset_id is not None:
            d["dataset_id"] = self.dataset_id
        if self.cameras is not None:
            d["cameras"] = list(self.cameras)
        return table.replace_schema_metadata({META_KEY: json.dumps(d).encode()})


def check_columns(table: pa.Table, where: str) -> None:
    """Refuse a table given as a manifest that lacks a sample's location columns (``CORE`` and ``LOCATION``): a
    query result or any other Parquet file passed where a manifest goes (``dataset(table)``, ``dataset(path)``)
    met a bare ``KeyError: 'data_file'`` deep in the reader.

    Raises:
        ResultContractError: naming ``where``, the missing columns and how a manifest is made.
    """
    missing = [c for c in (*CORE, *LOCATION) if c not in table.column_names]
    if not missing:
        return
    have = table.column_names
    hint = (" It has episode_index: to train on those episodes pass the query that selected them "
            "(db.dataset(sql)), or db.dataset(episodes=table['episode_index'].to_pylist())."
            if "episode_index" in have else "")
    raise ResultContractError(
        f"{where} is not a manifest: it lacks the columns {missing} that say where each sample's frame is (it has "
        f"{have[:8]}{' ...' if len(have) > 8 else ''}). A manifest is what db.manifest(sql) returns or "
        f"db.export_manifest(sql, path) saves.{hint}")


def finish(table: pa.Table, *, mode: str, extras: list[str], video_keys: list[str], fps: float, sql: str,
           clips: dict, cameras: list[str] | None = None, dataset_id: str | None = None) -> pa.Table:
    """A resolver's last step: the columns in their documented order, and the metadata attached (``dataset_id``:
    the source's :func:`dataset_identity`, so a table handed to another dataset is refused, :func:`check_source`).

    Raises:
        ResultContractError: a documented column is missing (a resolver bug, named).
    """
    want = columns(video_keys, extras)
    missing = [c for c in want if c not in table.column_names]
    if missing:
        raise ResultContractError(f"internal: the manifest lacks columns {missing} (resolver bug; please report)")
    return Meta(mode, tuple(extras), tuple(video_keys), fps, sql, clips,
                cameras=None if cameras is None else tuple(cameras), dataset_id=dataset_id).attach(table.select(want))


# ---- a manifest file (db.export_manifest writes it; dataset(), stats(), a collection's and ray_data read it) --------
def reads_as_a_file_name(sql: Any) -> bool:
    """A str ending in .parquet without whitespace: what 0.2 took for a manifest file's path."""
    return isinstance(sql, str) and sql.strip().endswith(".parquet") and not any(c.isspace() for c in sql.strip())


def manifest_path_of(sql: Any) -> str | os.PathLike | None:
    """The manifest file that the ``sql`` argument of an entry point taking "SQL or a manifest" names (``dataset``,
    ``stats``, a collection's ``dataset`` / ``stats`` / ``export``, ``prefetch``), or None: a str is SQL, a table
    is a table. A manifest file is an ``os.PathLike`` (``pathlib.Path``), never guessed from text.

    For one release (it goes in 0.3), a str ending in .parquet, without whitespace, that names an existing file is
    still that file (0.2 read any such str as one), with a DeprecationWarning saying to pass ``pathlib.Path(...)``.
    One that names no file is SQL like any other str (:func:`path_hint` adds the Path form to its error).
    """
    if isinstance(sql, os.PathLike):
        return sql
    if reads_as_a_file_name(sql) and os.path.isfile(os.path.expanduser(sql.strip())):
        warn(f"a str is SQL: pass the manifest file as pathlib.Path({sql.strip()!r}); reading a manifest file from a "
             "str ending in .parquet goes in 0.3", DeprecationWarning)
        return sql.strip()
    return None


@contextlib.contextmanager
def path_hint(sql: Any) -> Iterator[None]:
    """Around the resolution of ``sql`` as SQL: a str that reads as a file name (and names no file, else
    :func:`manifest_path_of` took it) fails to parse; its QueryError then says how a manifest file is given."""
    try:
        yield
    except QueryError as e:
        if reads_as_a_file_name(sql):  # the same error (class, cause, traceback), its message longer
            e.args = (f"{e}. A str is SQL, and no file {sql.strip()!r} exists: a manifest file is passed as "
                      f"pathlib.Path({sql.strip()!r})", *e.args[1:])
        raise


def read_manifest_file(path: str | os.PathLike, how: str) -> pa.Table:
    """The manifest saved at ``path`` (Parquet, schema metadata kept).

    Raises:
        MissingFileError: no such file, naming ``how`` one is written.
        ResultContractError: the file lacks a manifest's location columns (:func:`check_columns`).
    """
    import pyarrow.parquet as pq

    path = os.path.expanduser(os.fspath(path))  # as export_manifest writes "~/m.parquet"
    if not os.path.exists(path):
        raise MissingFileError(f"{path}: manifest file not found; write one with {how}, or pass a query instead")
    table = pq.read_table(path)
    check_columns(table, path)
    return table


def read_schema(path: str | os.PathLike, *, filesystem=None) -> pa.Schema:
    """The Arrow schema of a manifest file (with its ``lerobot_sql.manifest`` metadata), without its rows.

    Raises:
        ValueError: the file has no ``lerobot_sql.manifest`` metadata (not written by export_manifest).
    """
    import pyarrow.parquet as pq

    schema = pq.read_schema(str(path), filesystem=filesystem)
    if not Meta.present(schema):
        raise ValueError(f"{path}: no 'lerobot_sql.manifest' schema metadata; write the manifest with "
                         "db.export_manifest(sql, path)")
    return schema


def file_root(path: str | os.PathLike, *, filesystem=None) -> str:
    """The dataset root (path or URL) a manifest file records (``export_manifest`` stores it).

    Raises:
        ValueError: not a manifest file, or its metadata names no root.
        ResultContractError: its metadata is not a JSON object.
    """
    root = Meta.of(read_schema(path, filesystem=filesystem), where=str(path)).root
    if not root:
        raise ValueError(f"{path}: the manifest metadata names no dataset root; pass root=")
    return root


def is_manifest_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a Parquet file with ``lerobot_sql.manifest`` schema metadata (one export_manifest wrote,
    which ``overwrite=True`` may replace)."""
    import pyarrow.parquet as pq

    try:
        return Meta.present(pq.read_schema(path))
    except (OSError, pa.ArrowException, ValueError):
        return False


def dataset_identity(layout) -> str:
    """A digest of what makes two dataset folders the same dataset for a manifest: info.json's
    ``codebase_version``, ``total_episodes``, ``total_frames``, ``fps`` and ``features`` (sha256 hex of their JSON).

    A manifest file stores its source's (``dataset_id``); :func:`check_source` accepts it through another root only
    when that root's digest is equal (a copied or moved dataset), since a manifest's rows are file rows and indices
    of that one dataset.
    """
    info = layout.info
    keys = ("codebase_version", "total_episodes", "total_frames", "fps", "features")
    text = json.dumps({k: info.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def check_source(manifest: pa.Table, where: Any, url: str, layout, *, require: bool = False) -> None:
    """Refuse a manifest written from another dataset than the one at ``url`` (``layout``: its layout): its
    data_file, data_row and index values point into that dataset, so read through this one they give other frames.

    Accepted when its ``dataset_id`` equals :func:`dataset_identity` of ``layout`` (the same dataset, or a copied or
    moved one), when the roots are the same folder, or when it records neither (a table from before the identity was
    recorded). ``db.manifest()``'s tables record the identity, files ``export_manifest`` wrote the root too.

    ``require``: a manifest without the metadata is refused too (where no row check follows).

    Raises:
        ResultContractError: naming both roots and the fix; or naming the file (``where``, a path), its metadata is
            not a JSON object (invalid, nested too deeply); with ``require``, the metadata is missing.
    """
    name = where if isinstance(where, (str, os.PathLike)) else "the manifest table"
    if require and not Meta.present(manifest.schema):
        # lost in a round trip (pandas, a dataframe engine): nothing says which dataset its rows belong to, and no
        # row check follows where this is required (LeRobotSQLDataset built without the Database)
        raise ResultContractError(
            f"{name}: a manifest without its lerobot_sql.manifest schema metadata (a pandas or engine round trip drops "
            "it), so which dataset its rows belong to cannot be checked. Keep the metadata "
            "(table.replace_schema_metadata(original.schema.metadata)), or pass it through db.dataset(table), "
            "which checks every row")
    meta = Meta.of(manifest, where=str(name))  # the one parser of it; a file's errors name it
    root = meta.root
    if not isinstance(root, str) or not root:
        if meta.dataset_id is None or meta.dataset_id == dataset_identity(layout):
            return
        # a table db.manifest() built over another dataset (ShardedManifestDataset(db_a, manifest_of_b) read A's rows)
        raise ResultContractError(
            f"{name}: a manifest of another dataset than the one at {url} (its info.json differs: version, "
            "total_episodes, total_frames, fps or features), so its data_file/data_row/index values would give this "
            "dataset's other frames. Build it with this dataset's db.manifest(sql), or pass it with the files of the "
            "dataset it was built from")

    def same(a: str, b: str) -> bool:
        if "://" in a or "://" in b:
            return a.rstrip("/") == b.rstrip("/")
        return os.path.realpath(a) == os.path.realpath(b)

    # the identity first: the same folder may hold another dataset now (a `current` symlink moved, a re-export)
    if meta.dataset_id is not None:
        if meta.dataset_id == dataset_identity(layout):
            return
    elif same(root, url):
        return
    why = ("its info.json differs from this one (version, total_episodes, total_frames, fps or features)"
           if meta.dataset_id else "it records no dataset identity to compare")
    raise ResultContractError(
        f"{name}: a manifest of the dataset at {root}, opened through the dataset at {url}; {why}, so its "
        f"data_file/data_row/index values would give this dataset's other frames. Open it through its own "
        f"dataset (lsql.connect({root!r}).dataset(...)), or write a manifest from this one with "
        f"db.export_manifest(sql, path). A copy of the dataset with the same info.json is accepted as is")


# ---- a collection's manifest ---------------------------------------------------------------------------------------
# One table over several datasets: a ``dataset`` column (dictionary of the collection's names) first, then each
# dataset's own manifest columns (a camera column of another dataset is NULL there); schema metadata
# ``lerobot_sql.collection`` (JSON): ``names``, ``roots`` (name -> URL), ``manifests`` (name -> that dataset's
# own ``lerobot_sql.manifest`` metadata), ``sql``. ``result_row`` is the row of the whole result.
COLLECTION_KEY = b"lerobot_sql.collection"


def collection_manifest(parts: list[tuple[int, pa.Table]], names: list[str], roots: dict[str, str], sql: str,
                        ordered: bool) -> pa.Table:
    """One collection manifest from each dataset's own manifest (``(position in names, manifest)``, in names
    order, ``result_row`` already the whole result's row); rows sorted by ``result_row`` when ``ordered``."""
    tables, metas = [], {}
    for code, m in parts:
        metas[names[code]] = (m.schema.metadata or {}).get(META_KEY, b"{}").decode()
        m = m.replace_schema_metadata(None)
        tables.append(m.add_column(0, "dataset", pa.DictionaryArray.from_arrays(
            pa.array(np.full(m.num_rows, code, np.int32)), pa.array(names, pa.string()))))
    out = pa.concat_tables(tables, promote_options="default")
    if ordered and len(tables) > 1:
        out = out.take(pa.array(np.argsort(out["result_row"].to_numpy(), kind="stable")))
    meta = {"names": list(names), "roots": roots, "manifests": metas, "sql": sql}
    return out.replace_schema_metadata({COLLECTION_KEY: json.dumps(meta).encode()})


def collection_meta(manifest: pa.Table) -> dict:
    """The ``lerobot_sql.collection`` metadata of a collection manifest.

    Raises:
        ResultContractError: the table is not a collection manifest, or its metadata (or a dataset's manifest
            metadata inside it, which :func:`part_of` and the callers parse again) is not JSON objects.
    """
    raw = (manifest.schema.metadata or {}).get(COLLECTION_KEY)
    if raw is None or "dataset" not in manifest.column_names:
        raise ResultContractError("not a collection manifest (no dataset column or no lerobot_sql.collection "
                                  "metadata): make it with Collection.manifest(sql)")
    fix = "make it again with Collection.manifest(sql)"
    meta = load_json(raw, "the collection manifest: its lerobot_sql.collection metadata", fix,
                     error=ResultContractError)
    parts = meta.get("manifests") if isinstance(meta, dict) else None
    if not isinstance(parts, dict) or not all(isinstance(v, str) for v in parts.values()):
        raise ResultContractError("the collection manifest: its lerobot_sql.collection metadata is not a JSON object "
                                  f"with a manifest per dataset; {fix}")
    for name, text in parts.items():  # once here, so the later json.loads of each (part_of, ...) cannot fail
        if not isinstance(load_json(text, f"the collection manifest: the metadata of dataset {name!r}", fix,
                                    error=ResultContractError), dict):
            raise ResultContractError(f"the collection manifest: the metadata of dataset {name!r} is not a JSON "
                                      f"object; {fix}")
    return meta


def dataset_codes(manifest: pa.Table, names: list[str]) -> np.ndarray:
    """int32 (N,): each row's position in ``names`` (the ``dataset`` column's dictionary indices when its
    dictionary is ``names``).

    Raises:
        ResultContractError: a row's dataset is NULL or not in ``names``.
    """
    col = manifest["dataset"].combine_chunks()
    if pa.types.is_dictionary(col.type) and col.dictionary.to_pylist() == list(names) and not col.null_count:
        return col.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    codes = pc.index_in(col.cast(pa.string()), value_set=pa.array(names, pa.string()))
    if codes.null_count:
        bad = pc.filter(col.cast(pa.string()), pc.is_null(codes)).to_pylist()[:3]
        raise ResultContractError(f"{codes.null_count} manifest row(s) have a dataset outside the collection's "
                                  f"names {list(names)} (e.g. {bad}): make the manifest with Collection.manifest(sql)")
    return codes.to_numpy(zero_copy_only=False).astype(np.int32)


def part_of(manifest: pa.Table, name: str, code: int, meta: dict, codes: np.ndarray | None = None
            ) -> tuple[pa.Table, np.ndarray]:
    """Dataset ``name``'s rows of a collection manifest as its own manifest (its columns, its metadata), and their
    positions in the collection manifest. ``codes``: :func:`dataset_codes` of the manifest, when the caller splits
    it into every part (computed here otherwise)."""
    if codes is None:
        codes = dataset_codes(manifest, meta["names"])
    pos = np.flatnonzero(codes == code)
    if name not in meta["manifests"]:  # a dataset none of whose frames was selected
        if len(pos):
            raise ResultContractError(f"a collection manifest whose rows name dataset {name!r} while its metadata "
                                      f"has no manifest of it: {FIX.replace('db.', 'coll.')}")
        return manifest.slice(0, 0), pos
    own = json.loads(meta["manifests"][name])
    cols = columns(own.get("video_keys", ()), own.get("extras", ()))
    sub = manifest.take(pa.array(pos)).select(cols)
    return sub.replace_schema_metadata({META_KEY: meta["manifests"][name].encode()}), pos


# ---- a manifest from outside --------------------------------------------------------------------------------------
# A manifest that comes from outside (a Parquet file, a table handed to ``dataset()``) is hostile input.
#
# The rule: every column a manifest claims about a frame is re-derived from the dataset for the frame its ``index``
# names, and a row whose stored value differs is refused (before this rule, a saved manifest with ``data_row + 1``, a
# camera's ``from_timestamp`` moved by a frame, the front camera's file pointed at the wrist mp4 or ``ep_from_index -
# 5`` gave other frames silently). ``index`` is the key: a row may name any frame, but then everything else in it must
# be that frame's. The reference is the manifest the planner itself builds for those frames (the caller resolves it:
# :func:`reference_plan` says how), so the two can only agree when the file is what ``db.manifest`` gave.
#
# Compared: ``episode_index, frame_index, timestamp, task_index, data_file, data_row, ep_from_index, ep_to_index,
# ep_data_row0``, per checked camera ``<key>/file``, ``<key>/from_timestamp`` and (in a file ``export_manifest`` wrote)
# ``<key>/time_s``. Not compared, since no dataset file holds them: ``result_row`` (the query row a sample came from;
# export cuts episodes by it) and the query's extra columns, which items carry under their own names; an extra may
# therefore not be named like an item key or a manifest column. The metadata's clips (which the dataset checks each mp4
# against) are replaced by the reference's, the dataset's own.
FIX = "write it again from its query: db.export_manifest(sql, path) (or db.manifest(sql) for a table)"
# Compared, in this order (a row's first differing column is the one named).
FRAME_COLUMNS = ("episode_index", "frame_index", "timestamp", "task_index", "data_file", "data_row",
                 "ep_from_index", "ep_to_index", "ep_data_row0")

# The pointer path re-derives whole episodes (about 0.6 us a frame on the shipped sets) where the join costs ~0.1 s
# plus ~0.3 s for a first connection: it is taken while the episodes hold at most this many frames.
POINTER_PATH_RATIO, POINTER_PATH_FRAMES = 8, 500_000


def reference_plan(manifest: pa.Table, bounds: dict[int, tuple[int, int]] | None, *, where: str
                   ) -> tuple[str, list[int]]:
    """How to re-derive ``manifest``: ``("episode", episodes)``, the whole episodes its rows lie in (the pyarrow
    pointer path: no DuckDB), when they hold at most a few times its rows; else ``("index", indices)``, its distinct
    ``index`` values through the DuckDB join, so that a sparse manifest over long episodes costs its own size.
    ``bounds``: per episode ``(dataset_from_index, dataset_to_index)`` from meta/episodes (None: no usable
    pointers, so the join).

    Raises:
        ResultContractError: ``index`` or ``episode_index`` is not an integer column, or NULL, or an episode_index
            is not an episode of the dataset, naming ``where`` and the row.
    """
    for c in ("index", "episode_index"):
        col = manifest[c]
        if not pa.types.is_integer(col.type):
            raise ResultContractError(f"{where}: column {c!r} is {col.type}, not integers; {FIX}")
        if col.null_count:
            j = int(pc.index(pc.is_null(col), True).as_py())
            raise ResultContractError(f"{where}: row {j}: {c} is null; every row must name a frame; {FIX}")
    eps = np.unique(manifest["episode_index"].to_numpy())
    if bounds is not None:
        unknown = [int(e) for e in eps if int(e) not in bounds]
        if unknown:
            j = int(pc.index(manifest["episode_index"], unknown[0]).as_py())
            raise ResultContractError(f"{where}: row {j}: episode_index {unknown[0]} is not an episode of the dataset "
                                      f"(meta/episodes holds {len(bounds)}); {FIX}")
        # the pointer path reads whole episodes: worth it while they are not much more than the manifest's frames
        if sum(bounds[int(e)][1] - bounds[int(e)][0] for e in eps) <= \
                POINTER_PATH_RATIO * manifest.num_rows + POINTER_PATH_FRAMES:
            return "episode", [int(e) for e in eps]
    return "index", np.unique(manifest["index"].to_numpy()).tolist()


def not_a_frame(manifest: pa.Table, row: int, where: str) -> ResultContractError:
    """The error for a manifest row whose ``index`` is not a frame of its ``episode_index``."""
    return ResultContractError(f"{where}: row {row}: index {manifest['index'][row].as_py()} is not a frame of "
                               f"episode {manifest['episode_index'][row].as_py()} in the dataset; {FIX}")


def first_outside(manifest: pa.Table, bounds: dict[int, tuple[int, int]]) -> int | None:
    """The first row whose ``index`` lies outside its episode's ``[from, to)`` in ``bounds`` (meta/episodes'
    ``dataset_from_index``/``dataset_to_index``), or None. Error path only: it names the row the join refused."""
    ep = manifest["episode_index"].to_numpy()
    lo = np.array([bounds.get(int(e), (0, 0))[0] for e in ep], np.int64)
    hi = np.array([bounds.get(int(e), (0, 0))[1] for e in ep], np.int64)
    idx = manifest["index"].to_numpy()
    bad = np.flatnonzero((idx < lo) | (idx >= hi))
    return int(bad[0]) if len(bad) else None


def check_extras(meta: Meta, manifest: pa.Table, layout, where: str) -> None:
    """Refuse extras (added to every item under their own names) that would replace an item's own value or a
    manifest column: a feature, ``task``, ``<key>_is_pad``, a manifest or ``<key>/time_s`` column, or a name the
    table lacks. :func:`lerobot_sql._plan.resolve.build_manifest` never writes such an extra.

    Raises:
        ResultContractError: naming ``where`` and the extra.
    """
    reserved = {*CORE, *LOCATION, *video_columns(layout.video_keys), *(f"{k}/time_s" for k in layout.video_keys)}
    for e in meta.extras:
        if not isinstance(e, str) or e not in manifest.column_names:
            why = "which the table lacks"
        elif e in reserved or e in layout.features or e == "task" or e.endswith("_is_pad"):
            why = "which would replace the item's own value or a manifest column"
        else:
            continue
        raise ResultContractError(f"{where}: its metadata lists {e!r} as an extra column, {why}; {FIX}")


def check_against(manifest: pa.Table, reference: pa.Table, *, where: str, cameras: list[str],
                  meta: Meta | None = None) -> pa.Table:
    """``manifest`` (its rows in their order) once every row agrees with ``reference`` (the planner's manifest of
    the same frames, any order, each index at least once) on the compared columns (module doc) of ``cameras``,
    with the reference's clips, fps and video keys in its metadata (``meta``: the manifest's own, if parsed already).

    Vectorised: one sort of the reference's ``index``, one ``searchsorted``, one ``take`` and an Arrow equality per
    column.

    Raises:
        ResultContractError: naming ``where``, the first differing row, its index and episode, the column, the stored
            and the expected value, and :data:`FIX`; or a row whose index is not a frame of its episode.
    """
    idx = manifest["index"].to_numpy()
    ref_idx = reference["index"].to_numpy()
    cols = list(FRAME_COLUMNS)
    for k in cameras:
        cols += [f"{k}/file", f"{k}/from_timestamp"]
    expected = reference.select(cols)
    if not np.array_equal(idx, ref_idx):  # (a whole-episode manifest in episode order is the reference itself)
        order = np.argsort(ref_idx, kind="stable")
        pos = np.minimum(np.searchsorted(ref_idx[order], idx), len(order) - 1)
        found = ref_idx[order][pos] == idx
        if not found.all():
            raise not_a_frame(manifest, int(np.flatnonzero(~found)[0]), where)
        expected = expected.take(pa.array(order[pos]))
    for k in cameras:
        if f"{k}/time_s" in manifest.column_names:  # export_manifest's: from_timestamp + timestamp, as it adds them
            t = pc.add(expected[f"{k}/from_timestamp"].cast(pa.float64()), expected["timestamp"].cast(pa.float64()))
            expected = expected.append_column(f"{k}/time_s", t)
            cols.append(f"{k}/time_s")
    for c in cols:
        have, want = manifest[c], expected[c]
        if have.type != want.type:
            try:  # an int32 or a pandas round trip is fine if every value survives
                have = have.cast(want.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise ResultContractError(f"{where}: column {c!r} is {manifest[c].type}, where the dataset's is "
                                          f"{want.type}; {FIX}") from None
        # equal, or both null (a camera without a clip); NaN never equals, and the planner refuses NaN times
        same = pc.or_kleene(pc.fill_null(pc.equal(have, want), False), pc.and_(pc.is_null(have), pc.is_null(want)))
        if pc.all(same).as_py():
            continue
        bad = np.flatnonzero(~same.to_numpy(zero_copy_only=False))
        j = int(bad[0])
        raise ResultContractError(
            f"{where}: row {j} (index {int(idx[j])}, episode {manifest['episode_index'][j].as_py()}): column {c!r} "
            f"holds {manifest[c][j].as_py()!r}, where the dataset has {want[j].as_py()!r} for that frame ({len(bad)} "
            f"row(s) differ in this column). A manifest's columns must be the dataset's own for the frame each row's "
            f"index names (the file was edited, or the dataset changed since it was written); {FIX}")
    own, ref = meta or Meta.of(manifest, where=where), Meta.of(reference)
    return dataclasses.replace(own, clips=ref.clips, fps=ref.fps, video_keys=ref.video_keys).attach(manifest)
