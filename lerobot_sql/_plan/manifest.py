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
their pointers and clips were checked; the other cameras' columns may be null) and, in a saved manifest, ``root``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._format.jsontext import load_json
from ..errors import ResultContractError

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
                another value), naming ``where``.
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
           clips: dict, cameras: list[str] | None = None) -> pa.Table:
    """A resolver's last step: the columns in their documented order, and the metadata attached.

    Raises:
        ResultContractError: a documented column is missing (a resolver bug, named).
    """
    want = columns(video_keys, extras)
    missing = [c for c in want if c not in table.column_names]
    if missing:
        raise ResultContractError(f"internal: the manifest lacks columns {missing} (resolver bug; please report)")
    return Meta(mode, tuple(extras), tuple(video_keys), fps, sql, clips,
                cameras=None if cameras is None else tuple(cameras)).attach(table.select(want))


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
    own = json.loads(meta["manifests"][name])
    cols = columns(own.get("video_keys", ()), own.get("extras", ()))
    sub = manifest.take(pa.array(pos)).select(cols)
    return sub.replace_schema_metadata({META_KEY: meta["manifests"][name].encode()}), pos
