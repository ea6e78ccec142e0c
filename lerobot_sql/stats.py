"""Statistics of a selection, in lerobot's ``meta/stats.json`` form, computed where the data is.

``db.stats(sql)`` and ``ds.meta.stats`` return ``{feature: {"min", "max", "mean", "std", "count"[, "q01", "q10",
"q50", "q90", "q99"]}}`` with numpy arrays as lerobot's ``LeRobotDatasetMetadata.stats`` holds them (it passes each
value to ``torch.as_tensor``): a vector feature of shape ``(D,)`` gets arrays of shape ``(D,)``, a scalar feature
``(1,)``, a camera ``(3, 1, 1)`` (values in [0, 1]); ``count`` is ``int64`` of shape ``(1,)``; everything else is
float64 (min and max of an integer feature are int64, as lerobot's json round trip gives them).

What is exact and what is aggregated:

* **Numeric features** (vectors and scalars: ``observation.state``, ``action``, ``timestamp``, ``index``...) are
  computed over exactly the selected samples, read from the data files (:mod:`lerobot_sql._readers.column_stats`:
  the rows each sample's ``data_row`` names, or a large whole-episode selection's runs, each row checked to hold its
  sample's ``index``; DuckDB over the ``frames`` view where a file lacks a column the view derives): min, max and
  exact quantiles (numpy's linear interpolation; equal to ``np.quantile`` bit for bit on the shipped sets), mean,
  and population std (lerobot's) in float64 by a streaming merge (within ~1e-15 relative of numpy's). lerobot's own
  quantiles are histogram estimates (5,000 bins between min and max), so they can differ from these by up to a bin
  width. A frame that the selection serves twice (two overlapping windows) counts twice: the statistics describe the
  training set as it is sampled. A NaN makes its element's statistics NaN (numpy's answer), never a number computed around it.
* **Cameras** (``video`` and ``image`` features) cannot be computed without decoding every frame; they are
  aggregated, as lerobot's ``aggregate_stats`` does, from the per-episode statistics in ``meta/episodes``
  (``episode_stats`` view) of every episode the selection touches, each episode whole. For a selection of whole
  episodes that is what lerobot would write for a dataset of exactly those episodes; for windows and single frames
  it is the statistics of the episodes they come from.
* **Cameras of episodes without per-episode statistics** (meta/episodes without ``stats/<camera>/*`` columns, a v2.1
  dataset without ``meta/episodes_stats.jsonl``, v2.0) are computed from the episode's frames as lerobot's
  ``compute_episode_stats`` computes them when it records (:func:`frame_stats`): the frames of
  ``stats_json.sample_indices`` (every frame under 100, then ``n ** 0.75`` of them), decoded from the mp4 (or the
  image cells of the data files), downsampled (``stats_json.downsample``), per channel in [0, 1] (depth maps in their
  unit), with a ``UserWarning`` naming the cameras and episodes; then aggregated with the others. lerobot computes them from
  the frames before encoding, so the numbers differ from the ones it would have written by the codec's loss (about
  0.005 in a mean on the shipped sets). A camera whose frames cannot be found either is refused
  (``StatsUnavailableError``, with the ways out), never left out: a training run would feed it un-normalised.
* Features without numbers (``string``, ``language`` columns) get no entry.

Quantile keys appear when the source's statistics have them (lerobot >= 0.4 writes q01..q99); a v2.1 dataset
without them gets min/max/mean/std/count only.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._format import stats_json
from ._format.layout import Layout
from ._query.sqltext import ident, literal
from ._readers import column_stats, decode, locate, tabular, video_index
from .errors import DatasetFormatError, StatsUnavailableError, warn

if TYPE_CHECKING:
    import duckdb

    from ._format.files import DatasetFiles


def selection_stats(con: "duckdb.DuckDBPyConnection", layout: Layout, manifest: "pa.Table | EpisodeRuns", *,
                    quantiles: bool = True, files: "DatasetFiles | None" = None,
                    cameras: list[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of the samples of ``manifest`` (see the module docstring for what is exact).

    Args:
        con: a DuckDB connection with the dataset's ``frames``, ``videos`` and ``episode_stats`` views (the
            Database's).
        layout: the dataset's layout (features, dtypes, shapes).
        manifest: one row per sample (``index``, ``episode_index``: int64; with ``data_file``, ``data_row`` the
            numbers are read from those rows), as ``db.manifest(sql)`` returns it; or :class:`EpisodeRuns` (a large
            selection of whole episodes, read without a row per frame).
        quantiles: add q01, q10, q50, q90, q99 (set False for a source whose statistics have none).
        files: the dataset's files (source, cache folder): where the frames of a camera without per-episode
            statistics are read (:func:`frame_stats`); None refuses such a camera instead.
        cameras: the camera features to give statistics (default every one); the others get no entry.

    Returns:
        ``{feature: {stat: np.ndarray}}``, features in info.json order.

    Raises:
        DatasetFormatError: a selected index has no row in the data files, or its row holds another (the manifest
            is of another dataset or the data changed since), naming how many.
        StatsUnavailableError: a camera has no per-episode statistics for some selected episodes and its frames
            cannot be read to compute them (naming the camera, the episodes and the ways out).
    """
    runs = isinstance(manifest, EpisodeRuns)
    if (manifest.episodes if runs else manifest).num_rows == 0:
        raise ValueError("the selection is empty: statistics of no samples are undefined; check the query")
    numeric = stats_json.numeric_features(layout)
    name = f"_lsql_stats_{uuid.uuid4().hex}"  # the selected episodes
    rows_name = None  # the selected samples, one row each, where DuckDB reads the numbers
    eps = manifest.episodes["episode_index"] if runs else pc.unique(manifest.column("episode_index"))
    con.register(name, pa.table({"episode_index": eps.cast(pa.int64())}))
    try:
        read = _numeric_from_files(con, name, files, layout, manifest, numeric, quantiles)  # (checks rows' index)
        if read is None:
            rows = manifest.samples() if runs else manifest
            sel = pa.table({"index": rows.column("index").cast(pa.int64())})
            rows_name = f"{name}_rows"
            con.register(rows_name, sel)
            found = con.sql(f"SELECT count(*) FROM {ident(rows_name)} s JOIN frames f ON f.index = s.index"
                            ).fetchall()[0][0]
            if found != sel.num_rows:
                raise DatasetFormatError(
                    f"{sel.num_rows - found} of {sel.num_rows} selected samples have no row in the data files "
                    "(frames.index): the manifest describes another dataset or the data changed since it was made; "
                    "build the selection again from this Database")
        out: dict[str, dict[str, np.ndarray]] = {}
        cams = [k for k in layout.camera_keys if cameras is None or k in cameras]  # video and image features
        per_camera = _camera_stats(con, layout, name, cams, files, quantiles)
        for key in layout.features:
            if key in numeric:
                out[key] = read[key] if read is not None else _numeric_stats(con, layout, rows_name, key, quantiles)
            elif key in per_camera:
                out[key] = per_camera[key]
        return out
    finally:
        con.unregister(name)
        if rows_name is not None:
            con.unregister(rows_name)


@dataclasses.dataclass
class EpisodeRuns:
    """A selection of whole episodes, each once, kept as its episodes (no row per frame): what
    :func:`lerobot_sql._plan.resolve.episode_runs` opens a large selection as.

    Attributes:
        episodes: one row per episode: ``episode_index``, ``ep_from_index``, ``ep_to_index``, ``ep_data_row0`` (its
            first row in its data file), ``file`` (int32 into ``infos``).
        infos: the data files' footer facts.
    """

    episodes: pa.Table
    infos: list

    def samples(self) -> pa.Table:
        """One row per sample (``index``, ``episode_index``), for what reads a selection row by row."""
        lo, hi = (self.episodes[c].to_numpy().astype(np.int64) for c in ("ep_from_index", "ep_to_index"))
        n = hi - lo
        return pa.table({"index": column_stats.concat_ranges(lo, n),
                         "episode_index": np.repeat(self.episodes["episode_index"].to_numpy().astype(np.int64), n)})

    def runs(self) -> list[column_stats.FileRuns]:
        t = self.episodes
        file = t["file"].to_numpy()
        lo, hi, row0 = (t[c].to_numpy().astype(np.int64) for c in ("ep_from_index", "ep_to_index", "ep_data_row0"))
        out = []
        for f in np.unique(file).tolist():
            m = file == f
            out.append(column_stats.FileRuns(self.infos[f], row0[m], (hi - lo)[m], lo[m], np.ones(int(m.sum()), np.int64)))
        return out


def _episode_ranges(con, sel: str, keys: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Where each element of ``keys`` lies over the episodes of registered table ``sel``, by the per-episode min
    and max of meta/episodes (``episode_stats``): the quantiles' histogram bins (a stale range costs a pass, never
    a wrong value: :func:`lerobot_sql._readers.column_stats.column_stats`)."""
    rows = con.sql(
        "SELECT feature, i, min(v) FILTER (WHERE stat = 'min'), max(v) FILTER (WHERE stat = 'max') FROM ("
        "SELECT feature, stat, UNNEST(CAST(value AS DOUBLE[])) AS v, generate_subscripts(value, 1) AS i "
        f"FROM episode_stats WHERE stat IN ('min', 'max') AND feature IN ({', '.join(literal(k) for k in keys)}) "
        f"AND episode_index IN (SELECT episode_index FROM {ident(sel)})) GROUP BY ALL ORDER BY ALL").fetchall()
    per: dict[str, list] = {}
    for feature, _i, lo, hi in rows:
        per.setdefault(feature, []).append((lo, hi))
    out = {}
    for k, v in per.items():
        lo, hi = (np.array(x, np.float64) for x in zip(*v))
        if np.isfinite(lo).all() and np.isfinite(hi).all():  # (a NULL or a partial entry: no range)
            out[k] = (lo, hi)
    return out


def _numeric_from_files(con, sel: str, files: "DatasetFiles | None", layout: Layout,
                        selection: "pa.Table | EpisodeRuns", keys: list[str],
                        quantiles: bool) -> dict[str, dict[str, np.ndarray]] | None:
    """The numeric features' statistics read from the data files (:mod:`lerobot_sql._readers.column_stats`), or
    None where that reader does not apply and DuckDB computes them (:func:`_numeric_stats`): no dataset files, a
    manifest without the rows' data files, or a data file lacking a feature or ``index`` (a column the frames view
    derives from the metadata)."""
    if files is None or not keys:
        return None
    src = files.source
    if isinstance(selection, EpisodeRuns):
        infos = selection.infos
    elif {"data_file", "data_row"} <= set(selection.column_names):
        enc = pc.dictionary_encode(selection.column("data_file")).combine_chunks()
        infos = [tabular.data_file_info(src, rel, keep=False, cache_dir=files.cache_dir)
                 for rel in enc.dictionary.to_pylist()]
    else:
        return None
    if any(not {*keys, "index"} <= set(info.schema.names) for info in infos):
        return None
    if isinstance(selection, EpisodeRuns):
        runs = selection.runs()
    else:
        runs = column_stats.runs_of_rows(infos, enc.indices.to_numpy(), selection.column("data_row").to_numpy()
                                         .astype(np.int64), selection.column("index").to_numpy().astype(np.int64))
    got = column_stats.column_stats(src, layout, runs, keys, quantiles=stats_json.QUANTILES if quantiles else (),
                                    ranges=_episode_ranges(con, sel, keys) if quantiles else None)
    return {k: _as_lerobot(layout.features[k], g["min"], g["max"], g["mean"], g["std"], int(g["count"][0]),
                           g["quantiles"] if quantiles else None) for k, g in got.items()}


def _numeric_stats(con, layout: Layout, sel: str, key: str, quantiles: bool) -> dict[str, np.ndarray]:
    """One numeric feature over the selected samples: one DuckDB pass, per element of a vector."""
    feat = layout.features[key]
    col = f"f.{ident(key)}"
    qs = f", quantile_cont(v, [{', '.join(map(str, stats_json.QUANTILES))}])" if quantiles else ""
    # A vector is unnested with its element number (two UNNESTs in one SELECT zip), so one GROUP BY gives every
    # element's statistics however long the vector is; a scalar is element 1.
    is_list = con.sql(f"SELECT {col} FROM frames f LIMIT 0").types[0].id in ("list", "array")
    src = (f"SELECT UNNEST(CAST({col} AS DOUBLE[])) AS v, UNNEST(range(1, len({col}) + 1)) AS i "
           f"FROM {ident(sel)} s JOIN frames f ON f.index = s.index") if is_list else \
        f"SELECT CAST({col} AS DOUBLE) AS v, 1 AS i FROM {ident(sel)} s JOIN frames f ON f.index = s.index"
    rows = con.sql(f"SELECT i, min(v), max(v), avg(v), stddev_pop(v), count(v), count(*){qs} FROM ({src}) "
                   "GROUP BY i ORDER BY i").fetchall()
    if any(r[5] != r[6] for r in rows):
        raise DatasetFormatError(f"feature {key!r}: NULL values among the selected samples (column {key!r} of "
                                 "the data files); statistics over them would be wrong. Select rows without NULLs")
    qs = np.array([r[7] for r in rows], np.float64).T if quantiles else None
    return _as_lerobot(feat, *(np.array([r[c] for r in rows]) for c in range(1, 5)), rows[0][6] if rows else 0, qs)


def _as_lerobot(feat, lo: np.ndarray, hi: np.ndarray, mean: np.ndarray, std: np.ndarray, count: int,
                quantiles: np.ndarray | None) -> dict[str, np.ndarray]:
    """One numeric feature's statistics, per element (flat arrays; ``quantiles`` (len(QUANTILES), elements) or
    None), in lerobot's form: the feature's shape (flat when the element count differs from it), min and max int64
    for an integer feature, the rest float64, ``count`` int64 ``(1,)``."""
    shape = tuple(feat.shape) if int(np.prod(feat.shape or (1,))) == np.size(mean) else (np.size(mean),)
    integer = feat.dtype.startswith(("int", "uint")) or feat.dtype == "bool"
    ext = np.int64 if integer else np.float64
    st = {"min": np.asarray(lo).astype(ext).reshape(shape), "max": np.asarray(hi).astype(ext).reshape(shape),
          "mean": np.asarray(mean, np.float64).reshape(shape), "std": np.asarray(std, np.float64).reshape(shape),
          "count": np.array([count], np.int64)}
    if quantiles is not None:
        for j, q in enumerate(stats_json.QUANTILES):
            st[stats_json.qkey(q)] = np.asarray(quantiles[j], np.float64).reshape(shape)
    return st


def array_stats(feat, values: np.ndarray, *, quantiles: bool = True) -> dict[str, np.ndarray]:
    """One numeric feature's statistics over ``values`` held in memory (``(n,)`` or ``(n, *shape)``), in the form
    :func:`selection_stats` gives: exact (numpy: min, max, mean, population std in float64, ``np.quantile``'s linear
    interpolation), ``feat`` the feature's info.json entry (:class:`lerobot_sql._format.info.Feature`). What a
    selection served at another frame rate has for the values the rate renumbers (``index``, ``frame_index``,
    ``timestamp``: ``Database._grid_stats``).

    Raises:
        ValueError: ``values`` is empty.
    """
    x = np.asarray(values)
    if not len(x):
        raise ValueError("the selection is empty: statistics of no samples are undefined; check the query")
    x = x.reshape(len(x), -1).astype(np.float64)
    qs = np.quantile(x, stats_json.QUANTILES, axis=0) if quantiles else None
    return _as_lerobot(feat, x.min(axis=0), x.max(axis=0), x.mean(axis=0), x.std(axis=0), len(x), qs)


def _camera_stats(con, layout: Layout, sel: str, cams: list[str], files: "DatasetFiles | None" = None,
                  quantiles: bool = True) -> dict[str, dict[str, np.ndarray]]:
    """Cameras aggregated from the per-episode statistics of every episode the selection touches; an episode whose
    meta/episodes holds none for a camera (no ``stats/<camera>/*`` columns, or NULL cells) gets them computed from
    its frames (:func:`frame_stats`), with one warning."""
    if not cams:
        return {}
    rows = con.sql(
        f"SELECT e.feature, e.episode_index, e.stat, e.value FROM episode_stats e "
        f"WHERE e.feature IN ({', '.join(literal(c) for c in cams)}) "
        f"AND e.episode_index IN (SELECT DISTINCT episode_index FROM {ident(sel)}) "
        "ORDER BY e.feature, e.episode_index, e.stat").fetchall()
    per: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for feature, ep, stat, value in rows:
        if value is not None:  # a NULL cell is no statistic (a column absent for some files, or unwritten)
            per.setdefault(feature, {}).setdefault(int(ep), {})[stat] = np.asarray(value, np.float64)
    selected = [int(e) for (e,) in con.sql(f"SELECT DISTINCT episode_index FROM {ident(sel)} ORDER BY 1").fetchall()]
    out, computed = {}, {}
    for key in cams:
        eps = per.get(key, {})
        absent = [e for e in selected if e not in eps]
        if absent:
            # Never leave the camera out: a training run would feed its frames un-normalised (lerobot-train
            # normalises them). Computed as lerobot computes them when it records.
            got = frame_stats(files, con, layout, key, absent)
            if not quantiles:  # as the numeric features of a source without quantiles
                got = {e: {k: v for k, v in s.items() if not k.startswith("q")} for e, s in got.items()}
            eps = {**eps, **got}
            computed[key] = absent
        stats = []
        for ep in selected:
            s = eps[ep]
            missing = {"min", "max", "mean", "std", "count"} - set(s)
            if missing:
                raise DatasetFormatError(f"meta/episodes: episode {ep} has no {sorted(missing)} statistics for "
                                         f"camera {key!r}; statistics of a selection need them (re-run lerobot's "
                                         "stats computation, or read the source's meta/stats.json: "
                                         "db.dataset(..., stats='dataset'))")
            for k, v in s.items():
                sizes = stats_json.stat_sizes(layout, key, k)
                if sizes is not None and v.size not in sizes:
                    raise DatasetFormatError(
                        f"meta/episodes: episode {ep}, camera {key!r}: statistic {k!r} has {v.size} value(s), but "
                        f"the camera's shape {list(layout.features[key].shape)} in meta/info.json has "
                        f"{' or '.join(map(str, sorted(sizes)))} channel(s); {stats_json.RECOMPUTE}")
            # one value per channel, stored (C, 1, 1) or flat: (C, 1, 1) as lerobot holds them
            stats.append({k: (v.astype(np.int64) if k == "count" else v.reshape(-1, 1, 1)) for k, v in s.items()})
        out[key] = stats_json.aggregate(stats)
    if computed:
        warn("statistics of a selection: meta/episodes holds no per-episode statistics of "
             + "; ".join(f"camera {k!r} for {len(e)} of the selected episodes (e.g. {e[:5]})"
                         for k, e in computed.items())
             + "; they were computed from the episodes' frames as lerobot's compute_episode_stats samples them "
             "(decoded from the mp4s or the data files' images), so they may differ from lerobot's own by the "
             "codec's loss")
    return out


# ---- cameras without per-episode statistics: computed from their frames ------------------------------------------
def _cells(src, key: str, data_files: list[str], rows: np.ndarray) -> list:
    """The cells of column ``key`` at (``data_files[i]``, ``rows[i]``), in that order: only the row groups holding
    them are read, one column."""
    import pyarrow.parquet as pq

    from ._readers import tabular

    out: list = [None] * len(rows)
    for rel in dict.fromkeys(data_files):
        at = np.flatnonzero(np.asarray(data_files, dtype=object) == rel)
        rg, off = tabular.data_file_info(src, rel).locate(rows[at])
        with src.open(rel) as f:
            pf = pq.ParquetFile(f)
            for g in np.unique(rg):
                col = pf.read_row_group(int(g), columns=[key], use_threads=False).column(0)  # one thread: Source.open
                for j in np.flatnonzero(rg == g):
                    out[int(at[j])] = col[int(off[j])].as_py()
    return out


def image_cells(cells: list, raw: bool = False) -> np.ndarray:
    """Image cells of the data files (PNG / TIFF bytes, or lerobot's ``{"bytes", "path"}`` struct) as (k, C, H, W),
    each downsampled (:func:`lerobot_sql._format.stats_json.downsample`): RGB uint8, or with ``raw`` (depth maps)
    the image's own values and dtype (lerobot's load_image_as_numpy keeps a TIFF's uint16 / float32)."""
    import io

    from PIL import Image

    imgs = []
    for v in cells:
        data = v.get("bytes") if isinstance(v, dict) else v
        if not isinstance(data, bytes):
            raise DatasetFormatError(f"an image cell holds no image bytes ({type(data).__name__}); run "
                                     "`lerobot-sql doctor --decode` (data_images_decode) to find every such cell")
        with Image.open(io.BytesIO(data)) as img:
            a = np.asarray(img) if raw else np.asarray(img.convert("RGB"))
        a = a[:, :, None] if a.ndim == 2 else a
        imgs.append(stats_json.downsample(a.transpose(2, 0, 1)))
    return np.stack(imgs)


def frame_stats(files: "DatasetFiles | None", con, layout: Layout, key: str, episodes: list[int]
                ) -> dict[int, dict[str, np.ndarray]]:
    """Per-episode statistics of camera ``key`` computed from the frames, as lerobot's ``compute_episode_stats``
    computes them when it records (the rules of :mod:`lerobot_sql._format.stats_json`): the frames at
    ``sample_indices`` of each episode's rows (in ``index`` order), downsampled, per channel (``image_stats``:
    [0, 1]; a depth map, ``depth_stats``, in its ``depth_unit``, from the dequantized codes of a depth video as export computes them).

    A row's video frame is its own: the clip's frame at the row's position where the clip's frames lie on the fps
    grid (:func:`lerobot_sql._readers.locate.rows_by_position`: what the items show, also for wall-clock timestamps,
    which name another row's frame), else the clip's frame nearest ``from_timestamp + timestamp`` within half a
    frame (a stream of another rate). Never another episode's frame.

    Args:
        files: the dataset's files (source, cache folder for the video index); None: the frames cannot be read.
        con: a connection with the dataset's ``frames``, ``_frames_loc`` (each frame's data file and row) and
            ``videos`` views.
        episodes: the episodes to compute.

    Returns:
        ``{episode_index: {stat: np.ndarray}}``, each value ``(C, 1, 1)`` float64, ``count`` int64 ``(1,)``.

    Raises:
        StatsUnavailableError: ``files`` is None, or an episode's frames cannot be found (no video pointer, no frame
            of its clip for a sampled row), naming the camera, the episode and the ways out.
        MissingFileError, VideoDecodeError: the mp4 is missing or does not decode.
    """
    feat = layout.features[key]
    ways = ("restore the camera's per-episode statistics (the stats/... columns of meta/episodes, or v2.1's "
            "meta/episodes_stats.jsonl) from the dataset's source; or train with the source's meta/stats.json "
            "(db.dataset(..., stats='dataset')); or leave the camera out (db.dataset(..., cameras=[...]) without "
            "it, db.stats(sql, cameras=[...]))")
    episodes = [int(e) for e in episodes]
    head = f"camera {key!r}: meta/episodes holds no per-episode statistics for episodes {episodes[:5]}" + \
        (f" and {len(episodes) - 5} more" if len(episodes) > 5 else "")
    if files is None:
        raise StatsUnavailableError(f"{head}, and no dataset files were given to compute them from the frames; {ways}")
    in_eps = ", ".join(map(str, episodes))  # ints: nothing from the dataset is pasted
    # The sampled rows only (an image dataset's cells are megabytes): each episode's length, then its picks.
    lengths = dict(con.sql(f"SELECT episode_index, count(*) FROM frames WHERE episode_index IN ({in_eps}) "
                           "GROUP BY 1").fetchall())
    picks = {e: stats_json.sample_indices(int(lengths.get(e, 0))) for e in episodes}
    name = f"_lsql_picks_{uuid.uuid4().hex}"
    con.register(name, pa.table({"episode_index": pa.array([e for e in episodes for _ in picks[e]], pa.int64()),
                                 "pos": pa.array([int(x) for e in episodes for x in picks[e]], pa.int64())}))
    try:
        # _frames_loc: each frame's data file and row in it (where the image cells are read)
        rows = con.sql(
            f"SELECT p.episode_index, p.pos, f.timestamp::DOUBLE AS ts, f.data_file, f.row FROM (SELECT "
            "episode_index, row_number() OVER (PARTITION BY episode_index ORDER BY index) - 1 AS pos, timestamp, "
            f"data_file, row FROM _frames_loc WHERE episode_index IN ({in_eps})) f JOIN {ident(name)} p "
            "USING (episode_index, pos) ORDER BY 1, 2").to_arrow_table()
        clips = {} if feat.is_image else {int(e): (rel, f) for e, rel, f in con.sql(
            f"SELECT episode_index, path, from_timestamp FROM videos WHERE video_key = {literal(key)} AND "
            f"episode_index IN ({in_eps})").fetchall()}
    finally:
        con.unregister(name)
    ep_col = rows["episode_index"].to_numpy()
    out: dict[int, dict[str, np.ndarray]] = {}
    depth = feat.is_depth_map
    if feat.is_image:
        cells = _cells(files.source, key, rows["data_file"].to_pylist(), rows["row"].to_numpy())
        for e in episodes:
            mine = [c for c, x in zip(cells, ep_col) if x == e]
            if not mine:
                raise StatsUnavailableError(f"{head}, and episode {e} has no rows in the data files; {ways}")
            imgs = image_cells(mine, raw=depth)
            out[e] = stats_json.depth_stats(imgs) if depth else stats_json.image_stats(imgs)
        return out
    fps = float(layout.fps)
    gray = {clips[e][0] for e in clips if depth and clips[e][0] is not None}
    pool = decode.DecoderPool(files.source, max_open=2, gray=gray)
    indexes: dict[str, video_index.FrameIndex] = {}
    try:
        for e in episodes:
            rel, from_ts = clips.get(e, (None, None))
            if rel is None or from_ts is None or not lengths.get(e):
                why = "has no rows in the data files" if not lengths.get(e) else \
                    "has no video pointer (videos/<camera>/chunk_index, file_index, from_timestamp) in meta/episodes"
                raise StatsUnavailableError(f"{head}, and episode {e} {why}, so they cannot be computed from its "
                                            f"frames either; {ways}")
            if rel not in indexes:
                indexes[rel] = video_index.FrameIndex.load(video_index.ensure_index_arrow(files.source, rel,
                                                                                        files.cache_dir))
            index = indexes[rel]
            m = ep_col == e
            pos = rows["pos"].to_numpy()[m]
            n = int(lengths[e])
            first = int(locate.clip_first_rows(index.pts_s, from_ts, fps))
            # The row's own frame: its position in a clip on the fps grid (what items show, whatever the
            # timestamps: wall-clock times would name another row's frame); off the grid (a stream of another
            # rate), the clip's frame within half a frame of the row's time.
            at = locate.rows_by_position(index.pts_s, first, pos, n, from_ts, fps)
            if (at < 0).any():
                by_time = locate.keep_in_clip(locate.rows_within(index.pts_s, locate.time_in_file(
                    from_ts, rows["ts"].to_numpy(zero_copy_only=False)[m]), 0.5 / fps), first, n)
                at = np.where(at >= 0, at, by_time)
            if (at < 0).any():
                j = int(np.flatnonzero(at < 0)[0])
                raise StatsUnavailableError(
                    f"{head}, and they cannot be computed from the frames of episode {e} either: its row {int(pos[j])} "
                    f"names no frame of the episode's clip in {files.source.path(rel)} (neither by its timestamp nor "
                    f"by its position: run `lerobot-sql doctor`); {ways}")
            imgs = np.stack([stats_json.downsample(x) for x in pool.decode_chw(index, at)])
            out[e] = stats_json.depth_stats(stats_json.dequantize_depth(
                imgs, feat.depth_quantization, feat.depth_unit or "mm")) if depth else stats_json.image_stats(imgs)
    finally:
        pool.close()
    return out
