"""``connect()`` and the ``Database`` it returns: SQL over a LeRobot dataset, and queries turned into datasets.

The SQL face itself (check, then run; the :class:`~lerobot_sql._sql.Result`) is :class:`lerobot_sql._sql.QueryFace`,
shared with a collection; here is what one dataset adds: its files, manifests, datasets, statistics and the
delegates to the features (export, nearest), each imported inside its method.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ._catalog import macros, sandbox
from ._catalog.connection import Connection, unreadable_error
from ._format import stats_json
from ._format.files import DatasetFiles, open_files
from ._format.layout import Layout
from ._format.metadata import read_pointers
from ._plan import contract, resolve
from ._plan import manifest as plan_manifest  # `manifest` is the tables' name here
from ._readers import locate, regrid
from ._sql import QueryFace, Result  # noqa: F401  (Result: what db.sql returns, importable from here)
from ._storage.source import Source
from .errors import DatasetFormatError, MissingFileError, ResultContractError, as_int


class Database(QueryFace):
    """One dataset (its :class:`~lerobot_sql._format.files.DatasetFiles`, ``db.files``), its DuckDB connection and
    views (:class:`lerobot_sql._catalog.connection.Connection`, made on the first query). Create it with
    :func:`connect`.

    Views (full reference in docs/sql.md): ``episodes``, ``episode_stats``, ``frames``, ``language``, ``tasks``,
    ``videos``, ``video_frames`` and ``video_files`` (both built on first use), ``features``, ``info``, ``tools``,
    ``sidecars`` and one view per sidecar file (read when a query names it), and the tables :meth:`attach` adds.

    Threads: one Database may be used from several threads. The thread that made the DuckDB connection uses it;
    every other thread gets its own cursor of it (``db.con`` returns the calling thread's), which shares the views,
    the sandbox settings and the lock-down, so queries of different threads run side by side.
    """

    def __init__(self, root: str | os.PathLike, *, storage_options: dict | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_size: int | str | None = None,
                 threads: int | None = None, memory_limit: str | None = None,
                 temp_directory: str | os.PathLike | None = None):
        sandbox.check_settings(threads, memory_limit)  # a typo is named before any file is opened
        self._init(open_files(root, storage_options=storage_options, cache_dir=cache_dir, cache_size=cache_size),
                   threads=threads, memory_limit=memory_limit, temp_directory=temp_directory)

    @classmethod
    def _of(cls, files: DatasetFiles, **settings: Any) -> "Database":
        """A Database over already opened ``files`` (a collection's members); ``settings`` as :func:`connect`'s
        DuckDB settings."""
        db = cls.__new__(cls)
        db._init(files, **settings)
        return db

    def _init(self, files: DatasetFiles, **settings: Any) -> None:
        self.files: DatasetFiles = files
        self._init_queries(Connection(self.files, **settings))
        self._pointers = None
        self._query_dirs: list[Path] = []

    @property
    def source(self) -> Source:
        """Where the dataset's bytes are (``files.source``)."""
        return self.files.source

    @property
    def layout(self) -> Layout:
        """meta/info.json and the file lists (``files.layout``)."""
        return self.files.layout

    @property
    def cache_dir(self) -> Path:
        """This dataset's cache folder (``files.cache_dir``)."""
        return self.files.cache_dir

    @property
    def fps(self) -> float:
        """Frames per second of the dataset (info.json's ``fps``; a float, whole in lerobot-written data)."""
        return self.layout.fps

    # ---- datasets -------------------------------------------------------------------------------------------
    def manifest(self, sql: str, *, cameras: list[str] | None = None, tolerance_s: float | None = None,
                 extras: bool = True, align: str = "timestamp") -> pa.Table:
        """The manifest of a query: one row per sample (columns: :mod:`lerobot_sql._plan.manifest`; the result
        contract: :mod:`lerobot_sql._plan.contract`).

        Args:
            cameras: the cameras whose video pointers and clips are checked and recorded (default every camera;
                ``[]``: a tabular-only manifest, which needs no video metadata; ``dataset()`` refuses the manifest
                for a camera it was not resolved for).
            tolerance_s: seconds the data's ``timestamp`` may stray from ``frame_index / fps`` when more than half a
                frame (wall-clock timestamps, which lerobot reads with its ``tolerance_s``); default half a frame.
            align: ``"timestamp"`` (default: each row's timestamp must also lie in its episode's video clip) or
                ``"frame_index"`` (frames by position, as ``dataset(align="frame_index")`` reads them: timestamps
                are not bounded).
            extras: False leaves the query's extra columns out of the manifest, and so out of the checks that they
                suit a DataLoader (what :meth:`export` resolves: it writes none of them).

        Raises:
            ResultContractError: the result is empty or has none of the accepted column sets.
            DatasetFormatError: timestamps off the grid (naming the worst episodes), a missing video pointer or bad
                clip of one of ``cameras``.
        """
        checked, result = self._capped_result(sql)
        return self._resolve(result, sql, checked.ordered, cameras=cameras, tolerance_s=tolerance_s, extras=extras,
                             align=locate.check_align(align))

    def _sql_selection(self, sql: str, windows: bool = False, **kw) -> tuple[pa.Table, tuple | None, pa.Table]:
        """User query ``sql`` resolved: ``(manifest, lazy, result)``. A large selection of whole episodes, each once,
        (with ``windows``, or of windows) is kept as its runs (:func:`lerobot_sql._plan.resolve.episode_runs`:
        ``lazy`` its ``(episodes, infos, clips, rules)``, ``manifest`` the zero-row one carrying the metadata), else
        ``lazy`` is None and ``manifest`` has a row per sample; ``result`` the query's rows. ``kw``: ``cameras``,
        ``tolerance_s``, ``align`` as :meth:`manifest` takes them."""
        checked, result = self._capped_result(sql)
        lazy = resolve.episode_runs(self.layout, result, sql=sql, src=self.source, ptr=self._episode_pointers(),
                                    ordered=checked.ordered, cache_dir=self.cache_dir, windows=windows, **kw)
        if lazy is not None:
            return lazy[0], lazy[1:], result
        return self._resolve(result, sql, checked.ordered, **kw), None, result

    def _resolve(self, result: pa.Table, sql: str, ordered: bool, con=None, *, cameras: list[str] | None = None,
                 tolerance_s: float | None = None, before: int = 0, extras: bool = True,
                 align: str = "timestamp") -> pa.Table:
        """The manifest of ``result`` (the rows of user query ``sql``), resolved with ``con`` (a function returning
        a connection whose unqualified names are this dataset's views; default: this Database's own); ``cameras``,
        ``tolerance_s``, ``extras``, ``align`` as :meth:`manifest` takes them; ``before``: a collection's samples
        resolved before these (the manifest bound is on the whole)."""
        pins = []  # (what keeps the parts of _frames_loc the resolve reads registered until it returns)

        def loc(bounds: dict, view: str) -> str:
            got = self._connection.loc(bounds, view)
            if got is None:
                return view
            pins.append(got[1])
            return got[0]

        try:
            return resolve.build_manifest(con or (lambda: self.con), self.layout, result, sql=sql, ordered=ordered,
                                       src=self.source, ptr=self._episode_pointers(), cameras=cameras,
                                       tolerance_s=tolerance_s, before=before, keep_extras=extras, align=align,
                                       loc=None if con is not None else loc)
        except duckdb.Error as e:  # the data files failed while the frames were resolved, or the result's types
            raise unreadable_error(self.source, self.layout, e, sql=sql) from e

    def tasks(self) -> dict[int, str]:
        """task_index -> task text, from meta/tasks.parquet (v2: meta/tasks.jsonl); read once per connection."""
        return self.files.tasks()

    def _episode_pointers(self):
        if self._pointers is None:
            self._pointers = read_pointers(self.source, self.layout)
        return self._pointers

    def _data_files_of(self, episodes: list[int] | None) -> list[str]:
        """The data files (relative paths) meta/episodes points the ``episodes`` (None: all) to; every data file
        when there are no usable pointers."""
        ptr = self._episode_pointers()
        if episodes is None or ptr is None or ptr["data/chunk_index"].null_count or ptr["data/file_index"].null_count:
            return list(self.layout.data_files)
        sel = pc.is_in(ptr["episode_index"], pa.array(episodes, pa.int64()))
        pairs = {(int(c), int(f)) for c, f in zip(ptr["data/chunk_index"].filter(sel).to_pylist(),
                                                   ptr["data/file_index"].filter(sel).to_pylist())}
        return sorted(self.layout.data_file(c, f) for c, f in pairs)

    def _episodes_manifest(self, episodes, **kw) -> pa.Table:
        """The manifest of whole episodes (all when ``episodes`` is None), in the given order; ``kw``: ``cameras``,
        ``tolerance_s``, ``align`` as :meth:`manifest` takes them."""
        ptr = self._episode_pointers()
        if episodes is None and ptr is None:  # no usable pointers: let the catalog say why
            return self.manifest("SELECT episode_index FROM episodes ORDER BY episode_index", **kw)
        result, sql = _episode_result(ptr, None if episodes is None else _episode_list(episodes))
        try:
            return resolve.build_manifest(lambda: self.con, self.layout, result, sql=sql, src=self.source, ptr=ptr, **kw)
        except duckdb.Error as e:
            raise unreadable_error(self.source, self.layout, e) from e

    def _episode_runs(self, episodes: list[int] | None, **kw):
        """Whole episodes (all when ``episodes`` is None) as :func:`lerobot_sql._plan.resolve.episode_runs` keeps
        them, without their frames, or None (a small selection, or pointers that do not say where the rows are);
        ``kw``: ``cameras``, ``tolerance_s``, ``align``."""
        ptr = self._episode_pointers()
        if ptr is None:
            return None
        result, sql = _episode_result(ptr, episodes)
        return resolve.episode_runs(self.layout, result, sql=sql, src=self.source, ptr=ptr,
                                    cache_dir=self.cache_dir, **kw)

    def _check_links(self) -> None:
        """Refuse, with a DatasetFormatError naming file and target, a data or metadata file that is a symlink out
        of the dataset (:meth:`lerobot_sql._storage.source.Source.check_link`) before a manifest or an export reads it
        (through DuckDB, whose sandbox would say only "Permission Error"). Each file is resolved once per process;
        the mp4s are checked where they are opened (Source.local_path)."""
        lay = self.layout
        for rel in (*lay.data_files, *lay.episode_files, *(f for f in (lay.tasks_file, lay.episode_stats_file) if f)):
            self.source.check_link(rel)

    def dataset(self, sql: str | os.PathLike | pa.Table | None = None, *, episodes: list[int] | None = None,
                delta_timestamps: dict[str, list[float]] | None = None, tolerance_s: float = 1e-4,
                return_uint8: bool = False, image_transforms: Any = None, cameras: list[str] | None = None,
                stats: str | None = "selection", decoder_threads: int = 1, parallel_cameras: bool | str = "auto",
                max_open_decoders: int = 64, seek_reach: int = 2, depth_output_unit: str = "mm",
                align: str = "timestamp", fps: int | None = None):
        """A torch Dataset over the frames the query selects; items equal ``LeRobotDataset.__getitem__``'s.

        Args:
            sql: a str is SQL: a query over the views whose result is ``index`` rows, ``(episode_index, start_s,
                end_s)`` windows or ``episode_index`` rows (see docs/training.md, "Adapter contract"). An
                ``os.PathLike`` (``pathlib.Path``) is a manifest file written by :meth:`export_manifest`; a
                ``pyarrow.Table`` a manifest from :meth:`manifest` (either is checked against this dataset). None:
                every frame of ``episodes`` (as ``LeRobotDataset(repo_id, episodes=...)``), of all episodes when
                that is None too. Whole episodes are resolved from meta/episodes without DuckDB. (A str ending in
                .parquet that names an existing file is still read as a manifest file, with a DeprecationWarning,
                until 0.3.)
            episodes: episode_index values (only with ``sql=None``); as in ``LeRobotDataset``, a set: frames come in
                index order, each once. A custom order or repeats: use SQL (``... ORDER BY``).
            delta_timestamps: {feature key: [offsets in seconds]}, as LeRobotDataset's.
            tolerance_s: how far a frame's timestamp may be from the wanted time, seconds (lerobot's 1e-4); a
                finite number > 0, else ValueError. Whatever it is, a frame outside the row's episode's clip (and,
                beyond half a frame, another row's frame of a clip on the fps grid) is never served:
                DatasetFormatError from the item.
            align: how each row's camera frame is found. ``"timestamp"`` (default, lerobot's rule): the frame
                nearest to ``from_timestamp + timestamp`` within ``tolerance_s``. ``"frame_index"``: the row's
                ``frame_index``-th frame of its episode's clip (the first frame no earlier than half a frame
                before ``from_timestamp``, plus frame_index), ignoring the timestamps, for data whose
                ``timestamp`` column holds wall-clock times while each clip holds exactly its episode's frames on
                the fps grid (what the refusal of such timestamps recommends). Checked per mp4: the frame must lie
                at ``from_timestamp + frame_index / fps`` (within a quarter frame) and inside the clip, and each
                sample's frame_index must be its position in the episode; else DatasetFormatError.
            return_uint8: camera frames as uint8 (C, H, W) instead of float32 in [0, 1] (lerobot 0.6's option).
            image_transforms: a callable applied to each camera frame (lerobot's ``ImageTransforms``).
            cameras: subset of camera keys to return, ``[]`` for tabular-only items (default all).
            stats: what ``ds.meta.stats`` holds: ``"selection"`` (default: statistics of exactly the selected
                frames, :meth:`stats`), ``"dataset"`` (the source's meta/stats.json unchanged, what lerobot uses
                with ``episodes=[...]``; None when the file is missing) or None (no statistics).
            decoder_threads: FFmpeg threads per open file (default 1; 0 lets FFmpeg choose; at most 64).
            parallel_cameras: True, False or ``"auto"``: decode an item's cameras in threads for frames of
                320x240 and more, outside DataLoader workers.
            max_open_decoders: open containers per process, LRU (default 64; at least 1); their memory is bounded
                too, by ``$LSQL_DECODER_MB`` (default 512 MB per process: each file's demuxer index, ~48 bytes per
                frame, and its decoder's frames).
            seek_reach: decode forward instead of seeking when the target's keyframe is at most this many frames
                ahead (default 2; at least 0).
            depth_output_unit: ``"mm"`` (default) or ``"m"``: the unit of depth maps (``ds.meta.depth_keys``,
                float32 (1, H, W)) and of their statistics, as lerobot 0.6's option of the same name.
            fps: serve the selection as a recording at this lower frame rate would (default: the dataset's own), a
                whole number dividing the dataset's fps, ``k = dataset fps / fps`` (:mod:`lerobot_sql._readers.regrid`
                states the rule): every k-th frame of each episode (frame_index % k == 0); items carry
                ``frame_index // k``, ``timestamp = frame_index / fps`` (float32) and the ``index`` the whole
                dataset recorded at ``fps`` gives the frame (what ``export(..., fps=fps)`` of every episode
                writes), the rest (features, cameras' frames, ``episode_index``, ``task_index``) the source
                frame's own; ``delta_timestamps`` are seconds on the new grid (multiples of 1/fps), clamped and
                padded at the episode's kept frames; ``ds.fps``, ``ds.meta`` and ``ds.meta.stats`` (numeric
                features over the kept frames; cameras as for windows, from their episodes' statistics) are the
                recording's. Whole episodes and windows keep their frames on the grid; ``index`` rows off it are
                refused (ResultContractError). A large whole-episode selection is resolved frame by frame.

        Returns:
            :class:`lerobot_sql.torch.dataset.LeRobotSQLDataset`.

        Raises:
            QueryError / ResultContractError: the SQL or its result is unusable (or the manifest, naming the row).
            MissingFileError: ``sql`` is a path naming no file.
            DatasetFormatError: a data, metadata or video file is a symlink to a file outside the dataset root and
                outside the hub cache's ``blobs/`` folder (see :meth:`lerobot_sql._storage.source.Source.check_link`);
                a feature is named ``task``, or ``<key>_is_pad`` for a ``delta_timestamps`` key (the item's own key
                would replace it: :func:`lerobot_sql._format.layout.check_item_keys`).
            ValueError: bad delta_timestamps (unknown key, offset off the 1/fps grid); both sql and episodes given;
                ``fps`` above the dataset's, or not a whole number dividing it (naming the rates that work);
                ``stats`` not one of the three choices; ``depth_output_unit`` not "mm" or "m"; ``align`` not
                "timestamp" or "frame_index";
                ``decoder_threads``, ``max_open_decoders`` or ``seek_reach`` out of range.
            TypeError: ``episodes`` holds something other than integers; ``fps`` is not a number; ``decoder_threads``,
                ``max_open_decoders`` or ``seek_reach`` is not an integer.
        """
        from .torch.dataset import LeRobotSQLDataset, check_decoder_options

        # before the manifest is built (seconds on a large query), not after it
        check_decoder_options(decoder_threads, max_open_decoders, seek_reach)
        locate.check_align(align)
        if stats not in ("selection", "dataset", None):
            raise ValueError(f"stats must be 'selection' (statistics of the selected frames), 'dataset' (the "
                             f"source's meta/stats.json) or None, not {stats!r}")
        # another frame rate: checked before any frame is read (its stride 1 is the dataset itself)
        stride = 1 if fps is None else regrid.stride(fps, self.layout.fps)
        from ._plan.episodes import lazy_frames

        lazy_frames()  # a malformed $LSQL_LAZY_FRAMES is named whatever path the open takes (a kept one asks none)
        self._check_links()
        if episodes is not None and sql is not None:
            raise ValueError("pass either sql or episodes, not both (a query can filter episodes itself)")
        # The manifest checks only what these items read: the chosen cameras' pointers and clips, and timestamps
        # within tolerance_s (cameras=[] needs no video metadata at all).
        kw = {"cameras": None if cameras is None else [cameras] if isinstance(cameras, str) else list(cameras),
              "tolerance_s": tolerance_s, "align": align}
        # before the manifest: its whole-episode path would meet a bad key as a bare KeyError
        self.layout.check_cameras(kw["cameras"] or [])
        path = plan_manifest.manifest_path_of(sql)  # a str is SQL (one naming an existing .parquet file: deprecated)
        kept = keep = lazy = None
        frames_unread = False  # opened without reading its frames (a large whole-episode selection)
        windows_unread = False  # (of them) a window selection, whose frames are checked where read
        if stride > 1 and (sql is None or isinstance(sql, str) and path is None):
            # every frame of the selection resolved (no selection cache, no lazy open), then its frames on the grid
            if sql is None:
                manifest = self._episodes_manifest(episodes, **kw)
            else:
                with plan_manifest.path_hint(sql):
                    checked, result = self._capped_result(sql)
                    manifest = self._resolve(result, sql, checked.ordered, **kw)
        elif sql is None:  # its own manifest, from the pointers: nothing to check
            from .torch import _selections

            # whole episodes: the last open of the same selection over the same files may have kept its result
            ep = None if episodes is None else _episode_list(episodes)
            keyed = self._data_files_of(ep)
            keep = _selections.entry(self.files, self._episode_pointers(), keyed, episodes=ep, **kw)
            kept = _selections.load(keep)
            if kept is not None:
                runs, manifest = kept.read()
                frames_unread = b"frames" in (runs.schema.metadata or {})
            else:
                # a large selection opens from the pointers alone; its frames are checked per row group as read
                lazy = self._episode_runs(ep, **kw)
                if lazy is not None:
                    manifest, lazy = lazy[0], lazy[1:]
                    frames_unread = True
                else:
                    manifest = self._episodes_manifest(episodes, **kw)
                    if keep is not None and not set(pc.unique(manifest["data_file"]).to_pylist()) <= set(keyed):
                        keep = None  # rows found in files the pointers do not name (stale ones): not in the key
        elif isinstance(sql, pa.Table):
            manifest = self._given_manifest(sql, "the table passed to dataset()", **kw)
        elif path is not None:
            manifest = self._given_manifest(plan_manifest.read_manifest_file(path, "db.export_manifest(sql, path)"),
                                            str(path), **kw)
        else:
            with plan_manifest.path_hint(sql):
                # whole episodes, each once, of a large selection: opened from the pointers, as episodes= is
                manifest, lazy, result = self._sql_selection(sql, windows=True, **kw)
                if lazy is not None:
                    frames_unread = True
                    episodes = result["episode_index"].to_pylist()
                    windows_unread = lazy[2].windows  # the statistics read its frames through the same checks
        grid = None
        if stride > 1:
            manifest = regrid.on_grid(manifest, stride, plan_manifest.Meta.of(manifest).mode,
                                      "the query" if isinstance(sql, str) else str(path or "the manifest"))
            grid = self._grid(int(fps), stride)
        tasks = self.tasks()
        wanted = pc.unique(manifest["task_index"]).drop_null().to_pylist() if "task_index" in manifest.column_names \
            else []
        unknown = sorted(t for t in wanted if t not in tasks)
        if unknown:
            # Items carry the task text (as LeRobotDataset's do); a None would fail much later, in collate.
            where = self.source.path(self.layout.tasks_file) if self.layout.tasks_file else \
                self.source.path("meta/tasks.jsonl" if self.layout.legacy else "meta/tasks.parquet")
            err = DatasetFormatError if self.layout.tasks_file else MissingFileError
            raise err(f"{where}: no task text for task_index {unknown[:5]} of the selected frames"
                      f"{'' if self.layout.tasks_file else ' (the file is missing)'}; items carry the task text as "
                      "LeRobotDataset's do. Restore the file from the dataset's source (`lerobot-sql doctor`: "
                      "tasks_exist)")
        if stats == "selection" and grid is not None:
            def stats_fn(db=self, m=manifest, g=grid):  # the kept frames, numbered at the new rate
                return db._grid_stats(m, g)
        elif stats == "selection" and windows_unread:
            samples: list = []  # (the dataset's sample table, set below: ds.meta, which holds this, may outlive ds)

            def stats_fn(db=self, samples=samples):  # its manifest, every frame read (and checked) now
                return db._stats_of(samples[0].full_manifest())
        elif stats == "selection" and frames_unread:
            def stats_fn(db=self, eps=episodes, kw=kw):  # its frames, read now (the open read none)
                return db._stats_of(db._whole_episodes(eps, **kw))
        elif stats == "selection":
            def stats_fn(db=self, m=manifest):  # this dataset's own manifest (built or checked above)
                return db._stats_of(m)
        elif stats == "dataset":
            def stats_fn(db=self):
                return db.stats() if db.source.exists("meta/stats.json") else None
        else:
            stats_fn = None
        ds = LeRobotSQLDataset(self.files, manifest, delta_timestamps=delta_timestamps, tolerance_s=tolerance_s,
                               return_uint8=return_uint8, image_transforms=image_transforms, cameras=cameras,
                               decoder_threads=decoder_threads, parallel_cameras=parallel_cameras,
                               max_open_decoders=max_open_decoders, seek_reach=seek_reach, stats=stats_fn,
                               depth_output_unit=depth_output_unit, align=align, _kept=kept, _keep=keep,
                               _episodes=lazy, _grid=grid)
        if stats == "selection" and windows_unread:
            samples.append(ds._samples)
        return ds

    def _grid(self, fps: int, stride: int) -> regrid.Grid:
        """How this dataset served at ``fps`` (``stride`` source frames per frame) numbers its frames: every
        episode's length from meta/episodes' pointers (``dataset_to_index - dataset_from_index``), else from the
        ``episodes`` view."""
        ptr = self._episode_pointers()
        if ptr is not None and not (ptr["dataset_from_index"].null_count or ptr["dataset_to_index"].null_count):
            ep = ptr["episode_index"].to_numpy()
            n = ptr["dataset_to_index"].to_numpy() - ptr["dataset_from_index"].to_numpy()
        else:
            t = self.con.sql("SELECT episode_index, length FROM episodes WHERE episode_index IS NOT NULL "
                             "AND length IS NOT NULL").to_arrow_table()
            ep, n = t["episode_index"].to_numpy(), t["length"].to_numpy()
        return regrid.Grid.of(fps, stride, ep, n)

    def _grid_stats(self, manifest: pa.Table, grid: regrid.Grid) -> dict:
        """:meth:`stats` of ``manifest`` (frames on ``grid``) served at the grid's rate: the source frames' values,
        with ``index``, ``frame_index`` and ``timestamp`` those the grid numbers them with (exact, numpy)."""
        from . import stats

        st = self._stats_of(manifest)
        index, ep_from = manifest["index"].to_numpy(), manifest["ep_from_index"].to_numpy()
        pos = index - ep_from
        new = {"index": lambda: grid.index(manifest["episode_index"].to_numpy(), pos),
               "frame_index": lambda: grid.frame_index(pos), "timestamp": lambda: grid.timestamp(pos)}
        for key, values in new.items():
            if key in st and key in self.layout.features:
                st[key] = stats.array_stats(self.layout.features[key], values(), quantiles="q01" in st[key])
        return st

    def _given_manifest(self, manifest: pa.Table, where: str, *, cameras: list[str] | None,
                        tolerance_s: float | None, align: str) -> pa.Table:
        """A manifest from outside (a saved file or a table handed to :meth:`dataset` / :meth:`stats`: hostile input)
        once checked: not a collection's, its location columns there, written from this dataset
        (:func:`lerobot_sql._plan.manifest.check_source`), and every row this dataset's own
        (:meth:`_verify_manifest`). ``where`` names it in the errors.

        Raises:
            ResultContractError: any of these fails, naming ``where`` and the fix.
        """
        if plan_manifest.COLLECTION_KEY in (manifest.schema.metadata or {}):
            # Its index / data_row values are each dataset's own: read through one dataset they are other frames.
            raise ResultContractError("a manifest of a collection (Collection.manifest), given to one dataset's "
                                      "Database: open it with the collection's dataset() (lsql.connect_many"
                                      "(...).dataset(manifest)), or select this dataset's rows in SQL")
        plan_manifest.check_columns(manifest, where)
        plan_manifest.check_source(manifest, where, self.source.url, self.layout)
        return self._verify_manifest(manifest, where, cameras=cameras, tolerance_s=tolerance_s, align=align)

    def _verify_manifest(self, manifest: pa.Table, where: str, *, cameras: list[str] | None,
                         tolerance_s: float | None, align: str) -> pa.Table:
        """``manifest`` (a saved file or a table given to :meth:`dataset`: hostile input) once every column it
        claims is this dataset's own for the frame each row's ``index`` names (:func:`lerobot_sql._plan.manifest.check_against`):
        re-derived through the planner, as whole episodes with pyarrow when the manifest covers most of its
        episodes' frames, else its ``index`` values through the DuckDB join; ``cameras``, ``tolerance_s``,
        ``align`` as :meth:`dataset` resolves with them. Its metadata's clips become the dataset's own.

        Raises:
            ResultContractError: a row differs (naming ``where``, the row, the column, both values and the fix), or
                an extra in the metadata is named like an item key, or is of a type a query's extra may not have
                (DATE, STRUCT, lists of lists, ragged lists: :func:`lerobot_sql._plan.contract.check_given_extras`).
            DatasetFormatError: as :meth:`manifest`, the dataset itself is unreadable for those frames.
        """
        if manifest.num_rows == 0:
            return manifest  # names no frame (an empty shard part): nothing to check
        meta = plan_manifest.Meta.of(manifest, where=where)
        plan_manifest.check_extras(meta, manifest, self.layout, where)
        manifest = contract.check_given_extras(manifest, meta.extras, where, meta.sql)  # as a query's extras
        # the cameras these items read and the manifest was resolved for (dataset() refuses the others itself)
        keys = [k for k in self.layout.video_keys if (cameras is None or k in cameras)
                and (meta.cameras is None or k in meta.cameras)]
        want = None if keys == list(self.layout.video_keys) else keys
        ptr = self._episode_pointers()
        bounds = None
        if ptr is not None and not (ptr["dataset_from_index"].null_count or ptr["dataset_to_index"].null_count):
            bounds = dict(zip(ptr["episode_index"].to_pylist(), zip(ptr["dataset_from_index"].to_pylist(),
                                                                    ptr["dataset_to_index"].to_pylist())))
        how, values = plan_manifest.reference_plan(manifest, bounds, where=where)
        kw = {"cameras": want, "tolerance_s": tolerance_s, "align": align}
        try:
            if how == "episode":
                ref = self._episodes_manifest(values, **kw)
            else:
                ref = self._resolve(pa.table({"index": pa.array(values, pa.int64())}), f"the index values of {where}",
                                    True, extras=False, **kw)
        except ResultContractError as e:  # a row naming no frame: say which row of which manifest, and the fix
            row = None if bounds is None else plan_manifest.first_outside(manifest, bounds)
            if row is not None:
                raise plan_manifest.not_a_frame(manifest, row, where) from e
            raise ResultContractError(f"{where}: {e}; {plan_manifest.FIX}") from e
        return plan_manifest.check_against(manifest, ref, where=where, cameras=keys, meta=meta)

    # ---- delegated capabilities (each lives in its own module) ------------------------------------------------
    def named_query(self, name: str, **params: Any) -> Result:
        """Run a named query from ``queries/`` (or a folder added with ``add_query_dir``) with parameters.

        ``db.dataset(db.named_query_sql(name, **params))`` turns it into a training set.
        ``lerobot-sql query DATASET --name NAME --param k=v`` is the CLI form.

        Raises:
            QueryError: unknown name (with a did-you-mean), a missing or mistyped parameter, or the query fails.
        """
        return self.sql(self.named_query_sql(name, **params))

    query = named_query  # its name in 0.1; kept as an alias

    def named_query_sql(self, name: str, **params: Any) -> str:
        """The SQL text of named query ``name`` with ``params`` filled in (each value type-checked and quoted by
        the library's parameter rules), e.g. to pass to :meth:`dataset` or :meth:`export`.

        Raises:
            QueryError: unknown name or a missing / mistyped parameter.
        """
        from ._query import library

        return library.render(name, params, extra_dirs=self._query_dirs, vectors=self._vector_columns())

    def _vector_columns(self) -> dict[str, str]:
        """The numeric vector features of ``frames`` (name -> DuckDB type; :func:`macros.vector_features`, the ones
        frames_ext differentiates): what a ``vector`` parameter of a named query may name (idle_segments' ``feature``), so that a scalar or text column is refused by name before the
        SQL runs, not by DuckDB's "Parameter type needs to be List"."""
        frame_cols = {r[0]: r[1] for r in self.con.sql("DESCRIBE frames").fetchall()}
        return {name: frame_cols[name] for name, _n, _names in macros.vector_features(self.layout, frame_cols)}

    def stats(self, sql: str | os.PathLike | pa.Table | None = None, *, episodes: list[int] | None = None,
              cameras: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Statistics in lerobot's ``meta/stats.json`` form: ``{feature: {"min", "max", "mean", "std", "count"
        [, "q01".."q99"]}}`` of numpy arrays (vectors ``(D,)``, cameras ``(3, 1, 1)`` in [0, 1], ``count`` int64
        ``(1,)``), what lerobot's ``LeRobotDatasetMetadata.stats`` holds.

        ``sql``: a selection as :meth:`dataset` takes it (a str is SQL; an ``os.PathLike`` such as
        ``pathlib.Path("m.parquet")`` a manifest file, refused when written from another dataset; a table a
        manifest); or ``episodes``: whole episodes, as ``db.dataset(episodes=[...])``. Numeric features are computed
        over exactly the selected samples, read from the data files (a large whole-episode selection as its
        episodes' runs, no row per frame); cameras are aggregated from the per-episode statistics of the
        episodes the selection touches, as lerobot's ``aggregate_stats`` does, and computed from the episode's
        frames where meta/episodes holds none (:mod:`lerobot_sql.stats` says what is exact). Without ``sql``: the
        source's ``meta/stats.json`` unchanged, which is what lerobot uses even with ``episodes=[...]``.

        The selection's rows are what :meth:`manifest` selects; statistics locate no frame by a row's timestamp, so
        the selection is taken without the cameras' pointer, clip and timestamp checks that ``dataset()`` makes
        (its ``tolerance_s`` and ``align`` change which frame an item shows, not which rows are selected).

        ``cameras``: the camera features to give statistics, as ``dataset(cameras=...)`` (default every camera; for
        a manifest table, the cameras it was resolved for and every image feature); the others get no entry.

        Raises:
            MissingFileError: no ``sql`` and the dataset has no meta/stats.json; ``sql`` is a path naming no file.
            DatasetFormatError: no ``sql`` and meta/stats.json is not valid JSON, or a statistic is not numbers or
                its size does not fit the feature's info.json shape (naming the file, feature and statistic).
            StatsUnavailableError: a camera has no per-episode statistics for some selected episodes and its
                frames cannot be read to compute them (naming the camera, the episodes and the ways out).
            ValueError: the selection is empty; ``cameras`` names a feature that is no camera.
            QueryError, ResultContractError: as :meth:`manifest`.
        """
        path = plan_manifest.manifest_path_of(sql)  # a str is SQL (one naming an existing .parquet file: deprecated)
        # A manifest from outside is checked as dataset() checks it (an edited episode_index gave another episode's
        # camera statistics beside this one's numbers); the camera columns play no part in statistics.
        rows_only = {"cameras": [], "tolerance_s": None, "align": "frame_index"}
        if path is not None:
            sql = self._given_manifest(plan_manifest.read_manifest_file(path, "db.export_manifest(sql, path)"),
                                       str(path), **rows_only)
        elif isinstance(sql, pa.Table):
            sql = self._given_manifest(sql, "the table passed to stats()", **rows_only)
        return self._stats_of(sql, episodes=episodes, cameras=cameras)

    def _stats_of(self, sql: "str | pa.Table | stats.EpisodeRuns | None", *, episodes: list[int] | None = None,
                  cameras: list[str] | None = None) -> dict:
        """:meth:`stats` of SQL, of a manifest this dataset built or checked (or its episodes kept as runs), or of
        ``episodes``."""
        from . import stats  # (imports the decoders: only when statistics are computed)

        if cameras is not None:
            cameras = [cameras] if isinstance(cameras, str) else list(cameras)
            self.layout.check_cameras(cameras)
        elif isinstance(sql, pa.Table) and plan_manifest.Meta.of(sql).cameras is not None:
            # a dataset's own manifest (ds.meta.stats): the cameras its items carry
            resolved = plan_manifest.Meta.of(sql).cameras
            cameras = [k for k in self.layout.camera_keys if k in resolved or k not in self.layout.video_keys]
        # The rows only: no camera's pointers, clips or timestamps are checked (cameras=[], align="frame_index").
        rows_only = {"cameras": [], "align": "frame_index"}
        if episodes is not None:
            if sql is not None:
                raise ValueError("pass either sql or episodes, not both (a query can filter episodes itself)")
            sql = self._whole_episodes(episodes, **rows_only)
        elif sql is None and cameras is not None:
            raise ValueError("cameras= applies to the statistics of a selection: pass sql or episodes as well "
                             "(without them, db.stats() returns meta/stats.json unchanged)")
        if sql is None:
            if not self.source.exists("meta/stats.json"):
                raise MissingFileError(f"{self.source.path('meta/stats.json')}: this dataset has no meta/stats.json; "
                                       "db.stats('SELECT episode_index FROM episodes') computes them from the data")
            with self.source.open("meta/stats.json") as f:
                text = f.read()
            return stats_json.from_json(text, self.source.path("meta/stats.json"), self.layout)
        if isinstance(sql, (pa.Table, stats.EpisodeRuns)):
            manifest = sql
        else:
            with plan_manifest.path_hint(sql):
                # a large selection of whole episodes: its episodes, not a row per frame (read once, by the stats)
                manifest, lazy, _ = self._sql_selection(sql, **rows_only)
                if lazy is not None:
                    manifest = stats.EpisodeRuns(lazy[0], lazy[1])
        return self._selection_stats(manifest, cameras=cameras)

    def _whole_episodes(self, episodes, **kw) -> "pa.Table | stats.EpisodeRuns":
        """Whole episodes (all when ``episodes`` is None) for their statistics: kept as runs when the selection is
        large (:meth:`_episode_runs`), else their manifest; ``kw`` as :meth:`_episodes_manifest` takes it."""
        from . import stats

        lazy = self._episode_runs(None if episodes is None else _episode_list(episodes), **kw)
        return stats.EpisodeRuns(lazy[1], lazy[2]) if lazy is not None else self._episodes_manifest(episodes, **kw)

    def _selection_stats(self, manifest: pa.Table, con: duckdb.DuckDBPyConnection | None = None,
                         cameras: list[str] | None = None) -> dict:
        """:func:`lerobot_sql.stats.selection_stats` of this dataset's ``manifest``, quantiles when the source's
        statistics have them; ``con``: a connection whose unqualified names are this dataset's views (default its
        own); ``cameras``: as :meth:`stats`. Cameras without per-episode statistics are computed from this
        dataset's files."""
        from . import stats

        con = con or self.con
        has_q = bool(con.sql("SELECT 1 FROM episode_stats WHERE stat = 'q01' LIMIT 1").fetchall())
        return stats.selection_stats(con, self.layout, manifest, quantiles=has_q, files=self.files, cameras=cameras)

    @property
    def query_dirs(self) -> list[Path]:
        """User folders of named ``.sql`` queries, searched in this order before the bundled ``queries/``."""
        return list(self._query_dirs)

    def add_query_dir(self, path: str | os.PathLike) -> None:
        """Add a folder of ``.sql`` files to the named-query library (searched before the bundled ``queries/``).

        Raises:
            MissingFileError: ``path`` is not an existing folder (a typo would otherwise show only later, as an
                unknown query name).
        """
        p = Path(path)
        if not p.is_dir():
            what = "is a file, not a folder" if p.exists() else "does not exist"
            raise MissingFileError(f"add_query_dir: {p} (resolved to {p.resolve()}) {what}; pass the folder holding "
                                   "your .sql files")
        self._query_dirs.insert(0, p)

    def nearest(self, at: Any, streams: Iterable[str] | str | None = None, k: int = 1, *,
                tolerance_s: float | None = None) -> pa.Table:
        """For each query time, the ``k`` samples of each stream nearest in time within the same episode.

        Args:
            at: the query times: a SQL query (run through the usual checks), an Arrow table, a pandas DataFrame, a
                dict of columns, or an iterable of ``(episode_index, timestamp)`` pairs. Needs ``episode_index``
                and ``timestamp`` (seconds from the episode start, as in ``frames.timestamp``).
            streams: feature keys: tabular features (columns of ``frames``) and/or camera keys with
                ``dtype: video``. Default: every video camera.
            k: samples per (time, stream), >= 1; rank 1 is the nearest, ties go to the earlier sample.
            tolerance_s: if given, samples farther than this from the query time are left out (so a time can get
                fewer than k rows, or none). Never replaced by a farther sample.

        Returns:
            An Arrow table, one row per (query time, stream, rank); its columns are
            :func:`lerobot_sql.nearest.nearest`'s.

        Raises:
            QueryError: unknown stream (with the valid names), ``k`` < 1, ``tolerance_s`` negative or not finite,
                ``at`` lacks the columns, holds a NaN or infinite time, or names an episode_index the dataset does
                not have.
        """
        from . import nearest

        return nearest.nearest(self, at, streams, k, tolerance_s=tolerance_s)

    def export(self, sql: str, dest: str | os.PathLike, *, overwrite: bool = False, progress: bool = True,
               tolerance_s: float = 1e-4, align: str = "timestamp", fps: int | None = None):
        """Write the frames ``sql`` selects as a new LeRobot v3.0 dataset at ``dest`` (a local folder).

        Args:
            sql: a query following the :meth:`dataset` contract: ``episode_index`` rows export whole episodes,
                ``(episode_index, start_s, end_s)`` rows one episode per window, ``index`` rows each contiguous run
                of frames of one episode as an episode. Extra result columns are not written.
            dest: the new dataset's root; written into a hidden sibling folder and renamed into place.
            overwrite: replace an existing ``dest`` (once the new dataset is complete), only if it is a dataset
                this method exported, holding only the files it wrote; an empty folder is written into either way.
            progress: show a tqdm bar.
            tolerance_s: how far a data timestamp may be from its video frame's pts (as in :meth:`dataset`).
            align: ``"timestamp"`` (default) or ``"frame_index"``, as in :meth:`dataset`.
            fps: write the selection as a recording at this lower frame rate, as ``dataset(sql, fps=fps)`` serves
                it (every k-th frame, renumbered; every camera frame re-encoded losslessly, RGB cameras as H.264):
                :func:`lerobot_sql.export.export_dataset`.

        Returns:
            :class:`lerobot_sql.export.ExportReport` (episodes, frames, files written, frames re-encoded, seconds).

        Raises:
            As :func:`lerobot_sql.export.export_dataset`: QueryError / ResultContractError, DestinationExistsError,
            DestinationError, FrameNotFoundError, DatasetFormatError / VideoDecodeError / MissingFileError,
            TypeError / ValueError (``fps`` too); and DatasetFormatError for a data file that is a symlink out of the
            dataset.
        """
        from . import export

        self._check_links()
        return export.export_dataset(self, sql, dest, overwrite=overwrite, progress=progress,
                                     tolerance_s=tolerance_s, align=align, fps=fps)

    def export_manifest(self, sql: str, path: str | os.PathLike, *, overwrite: bool = False):
        """Write the manifest of ``sql`` (one row per sample, :meth:`manifest`'s columns plus each camera's
        ``<video_key>/time_s``, the dataset root in its metadata) as one Parquet file at ``path``;
        ``dataset(pathlib.Path(path))`` rebuilds the same items (a str is SQL), and Ray Data or Daft read it with
        their Parquet readers.

        Args:
            overwrite: replace ``path`` if it is a manifest this method wrote (never another file).

        Returns:
            :class:`lerobot_sql.export.ManifestReport` (path, rows, episodes, seconds).

        Raises:
            As :func:`lerobot_sql.export.export_manifest`: QueryError / ResultContractError,
            DestinationExistsError, DestinationError; and DatasetFormatError for a data file that is a symlink out
            of the dataset.
        """
        from . import export

        self._check_links()
        return export.export_manifest(self, sql, path, overwrite=overwrite)

    def io_stats(self) -> dict[str, int]:
        """Bytes and requests read from the dataset's storage: requests, bytes_fetched, bytes_from_cache."""
        return self.source.io_stats()

    def close(self) -> None:
        """Close the DuckDB connection and every thread's cursor of it; no query runs on this Database afterwards.
        ``with connect(...) as db:`` closes it at the end of the block."""
        self._connection.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        i = self.layout.info
        return (f"Database({self.source.url!r}, {self.layout.version}, episodes={i.get('total_episodes')}, "
                f"frames={i.get('total_frames')}, fps={self.fps:g}, cameras={self.layout.camera_keys})")


def _episode_result(ptr: pa.Table, episodes: list[int] | None) -> tuple[pa.Table, str]:
    """(the ``episode_index`` rows, the SQL the manifest's metadata records) of whole episodes: ``episodes`` (a
    checked list) in order, or every episode of the pointers ``ptr`` by episode."""
    if episodes is None:
        ep = sorted(set(ptr["episode_index"].to_pylist()))
        sql = "SELECT episode_index FROM episodes ORDER BY episode_index"
    else:
        ep = episodes
        sql = f"SELECT episode_index FROM episodes WHERE episode_index IN ({', '.join(map(str, ep))}) " \
              "ORDER BY episode_index"
    return pa.table({"episode_index": pa.array(ep, pa.int64())}), sql


def _episode_list(episodes: Any) -> list[int]:
    """Sorted distinct episode_index values, as ``LeRobotDataset(..., episodes=...)`` treats its list (a set: frames
    follow the dataset's order). Accepts ints, numpy integers, 0-d integer tensors, any iterable of them.

    Raises:
        TypeError: a value is not an integer (a float, bool or string would silently pick another episode).
        ResultContractError: the list is empty, or a value does not fit int64 (no episode_index can be it).
    """
    items = [episodes] if not hasattr(episodes, "__iter__") or isinstance(episodes, (str, bytes)) else list(episodes)
    out = set()
    for e in items:
        v = as_int(e)
        if v is None:
            raise TypeError(f"episodes holds {e!r} ({type(e).__name__}); pass episode_index integers, e.g. "
                            "episodes=[0, 3, 17]")
        if not -2**63 <= v < 2**63:  # met a bare OverflowError converting to int64
            raise ResultContractError(f"episodes [{v}] are not in meta/episodes: episode_index is an int64 column, "
                                      f"and {v} does not fit it; pass episode_index values of the dataset")
        out.add(v)
    if not out:
        raise ResultContractError("episodes=[] selects nothing; pass episode_index values, or None for all")
    return sorted(out)


def connect(root: str | os.PathLike, **kwargs: Any) -> Database:
    """Open a LeRobot dataset. Reads meta/info.json and lists the files; copies no table.

    The DuckDB connection and its views are made on the first query (``db.sql``, ``db.con``, a SQL ``dataset``):
    ``connect(root).dataset()`` / ``.dataset(episodes=[...])`` need no DuckDB at all.

    Args:
        root: the dataset root (the folder holding meta/, data/, videos/): a local path, an fsspec URL
            (``https://``, ``s3://``, ...), or a Hugging Face Hub dataset (``hf://datasets/ORG/NAME[@REVISION]``;
            a bare ``ORG/NAME`` is one when no local folder of that name exists, so such a path, mistyped, is also
            looked up on the Hub: the error then gives both readings).
        storage_options: passed to fsspec for remote roots.
        cache_dir: this dataset's cache folder itself (video indexes, row-group store, footer facts, remote
            bytes), yours to manage: two datasets given the same folder share it, and ``lerobot-sql cache`` does not
            list or clear it. Default: a folder per dataset, named by its key, under ``$LSQL_CACHE_DIR`` or
            ``~/.cache/lerobot_sql`` (what ``lerobot-sql cache`` lists and clears).
        cache_size: bound of the remote-bytes cache (bytes, or a string like ``"20GB"``; default 50 GiB),
            least-recently-read pieces are evicted first. Local datasets are read in place.
        threads, memory_limit: DuckDB settings (e.g. ``threads=2, memory_limit="8GB"``); defaults: all cores,
            min(RAM / 4, 4 GiB), which holds at 30M frames on a 24 GB machine. ``threads``: an integer from 1 to
            4096; ``memory_limit``: a string, a positive number with a unit (``"512MB"``, ``"8GB"``, ``"4GiB"``) or
            a share of RAM (``"50%"``).
        temp_directory: where DuckDB spills when a query exceeds memory_limit (default
            ``<cache_dir>/duckdb_tmp``).

    Raises:
        TypeError: ``root`` is not a path or a string (``None``); ``threads`` is not an integer (``1.5``, ``True``),
            ``memory_limit`` not a string.
        ValueError: ``threads`` or ``memory_limit`` out of range or malformed (``threads=0``, ``memory_limit="-1"``
            or ``"abc"``), naming the argument and the valid form.
        MissingFileError: no meta/info.json (or no data / episode files) under ``root``; ``root`` is a URL of a
            protocol no fsspec filesystem knows (``foo://x``); a bare ``ORG/NAME`` that is neither a local folder nor
            a Hub dataset (also when the Hub cannot be reached and ``ORG`` is a local folder: ``sample/nope``).
        RemoteIOError: a remote root, or the Hub for a bare ``ORG/NAME``, cannot be reached (after retries).
        UnsupportedVersionError: the dataset's codebase_version is not v2.0, v2.1 or v3.x (v2.x datasets are read
            as they are, without conversion).
        DatasetFormatError: info.json is malformed. Malformed metadata files (meta/episodes, tasks, data footers)
            raise DatasetFormatError on first use, naming the file.
    """
    return Database(root, **kwargs)
