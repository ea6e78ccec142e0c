"""What a clip page holds: a selection cut into clips, each camera's window as an mp4, and the signals under it.

A selection is a query's result (whole episodes, ``(episode_index, start_s, end_s)`` windows or ``index`` rows, the
dataset() contract: :mod:`lerobot_sql._plan.contract`) or a dataset's manifest. It is cut into clips as an export
cuts it into output episodes (:func:`lerobot_sql.export.parts.cut_parts`: a window, a whole episode, a run of
consecutive ``index`` rows). Each clip's frames are located in each camera's mp4 by the export's rule
(:func:`lerobot_sql.export.video_writer.source_rows`, the frames the dataset serves) and written by
:func:`lerobot_sql.export.clip_writer.write_clip`; the signals are the clip's rows of the data files.

Bounds (:data:`DEFAULT_MAX_CLIPS`, :data:`DEFAULT_MAX_BYTES`): clips are taken in the selection's order until one
more would pass either; the page says how many were left out and which. The bytes are counted from the video
index before anything is fetched (the copied packets' sizes), so a remote dataset fetches only the clips shown.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._format.layout import DEFAULT_COLUMNS
from .._plan import contract
from .._plan.manifest import Meta
from .._readers import locate, tabular, video_index
from .._readers.decode import DecoderPool
from .._storage.pieces import merge_ranges
from ..errors import DatasetFormatError, QueryError, did_you_mean
from ..export.clip_writer import write_clip
from ..export.parts import Part, cut_parts
from ..export.target import ExportSource
from ..export.video_writer import source_rows
from .html_page import Card, ClipsPage, Signal

DEFAULT_MAX_CLIPS = 24
# mp4 bytes embedded in one page (base64 makes the page a third larger): 20 two-camera 2 s windows of a 480x640
# set at lerobot's settings are ~10 MB
DEFAULT_MAX_BYTES = 64 << 20
SIGNAL_DEFAULTS = ("observation.state", "action")  # the first present is plotted when signals=None


def clips_page(source, sql: str | None = None, *, max_clips: int = DEFAULT_MAX_CLIPS,
               max_bytes: int = DEFAULT_MAX_BYTES, cameras: list[str] | None = None,
               signals: list[str] | None = None, reencode: bool = False, tolerance_s: float = 1e-4,
               align: str = "timestamp") -> ClipsPage:
    """The clip page of a selection: see :func:`lerobot_sql.display.show_clips` (the public door) for the
    arguments, what is returned and raised."""
    t0 = time.perf_counter()
    tolerance_s = locate.check_tolerance(tolerance_s)
    align = locate.check_align(align)
    max_clips, max_bytes = _positive(max_clips, "max_clips"), _positive(max_bytes, "max_bytes")
    files = getattr(source, "files", None)
    if files is None or not hasattr(files, "layout"):
        raise TypeError(f"show_clips takes a Database (lsql.connect(root)) or a dataset (db.dataset(...)), not "
                        f"{type(source).__name__}; for a collection pass one of its datasets: coll['name']")
    layout = files.layout
    cams = _cameras(layout, cameras)
    sigs = _signals(layout, signals)
    manifest, parts, rest, what = _selection(source, sql, max_clips, cams, tolerance_s, align)
    left_out = []
    if rest:
        left_out.append(f"{len(rest)} more {what} of the selection (max_clips={max_clips}), of episodes "
                        f"{_list(dict.fromkeys(rest))}")
    plan = _Plan(files, manifest, cams, tolerance_s, align)
    kept, budget = [], 0
    for part in parts:
        est = sum(plan.estimate(part, k) for k in cams)
        if kept and budget + est > max_bytes or not kept and est > max_bytes:
            rest = parts[len(kept):]
            left_out.append(f"{len(rest)} {what} past the byte bound (max_bytes={max_bytes:,}; these would add "
                            f"about {sum(plan.estimate(p, k) for p in rest for k in cams):,} bytes), episodes "
                            f"{_list([p.src_episode for p in rest])}")
            break
        kept.append(part)
        budget += est
    plan.fetch_ahead(kept)
    tasks = files.tasks()
    fps = float(layout.fps)
    ts_all = manifest["timestamp"].to_numpy()
    task_all = manifest["task_index"].to_numpy()
    cards = []
    try:
        for part in kept:
            ts = ts_all[part.rows].astype(np.float64)
            videos = [(k, plan.clip(part, k, reencode)) for k in cams]
            ti = int(task_all[part.rows[0]])
            cards.append(Card(episode_index=part.src_episode, frame_start=part.frame_start, frames=part.length,
                              start_s=float(ts[0]), end_s=float(ts[0]) + part.length / fps,
                              task=tasks.get(ti), videos=videos, signals=_read_signals(files, part, sigs, ts)))
    finally:
        plan.close()
    src = files.source
    return ClipsPage(dataset=src.url, sql=sql if isinstance(sql, str) else None, fps=fps, cards=cards,
                     left_out=left_out, seconds=time.perf_counter() - t0)


def _positive(v, name: str) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__") or int(v) < 1:
        raise ValueError(f"{name} must be an integer >= 1, not {v!r}")
    return int(v)


def _list(values, n: int = 12) -> str:
    values = list(values)
    return ", ".join(map(str, values[:n])) + (f" ... ({len(values)} in all)" if len(values) > n else "")


def _cameras(layout, cameras) -> list[str]:
    """The video cameras to show (default every video key, info.json order).

    Raises:
        QueryError: an unknown key, or a camera stored as images (PNG cells of the data files: not a video).
    """
    videos = list(layout.video_keys)
    if cameras is None:
        if not videos:
            raise QueryError("this dataset has no video cameras (its cameras, if any, are image cells of the data "
                             "files): there is nothing to play; show frames with display.frame_grid(ds) instead")
        return videos
    if isinstance(cameras, str):
        cameras = [cameras]
    out = []
    for k in cameras:
        if k not in videos:
            kind = "stored as images in the data files, not a video" if k in layout.image_keys else "unknown"
            raise QueryError(f"camera {k!r} is {kind}.{did_you_mean(k, videos)} Video cameras: {videos}")
        if k not in out:
            out.append(k)
    return out


def _signals(layout, signals) -> list[str]:
    """The numeric features to plot (default: ``observation.state``, else ``action``, else none).

    Raises:
        QueryError: an unknown feature, or one that cannot be plotted (a camera, a string).
    """
    plottable = [k for k, f in layout.features.items()
                 if not f.is_camera and k not in DEFAULT_COLUMNS and f.dtype not in ("string", "language")]
    if signals is None:
        return [next(k for k in SIGNAL_DEFAULTS if k in plottable)] if any(k in plottable for k in SIGNAL_DEFAULTS) \
            else []
    if isinstance(signals, str):
        signals = [signals]
    for k in signals:
        if k not in plottable:
            why = "a camera or text" if k in layout.features else "unknown"
            raise QueryError(f"signal {k!r} is {why}.{did_you_mean(k, plottable)} Plottable features: {plottable}")
    return list(dict.fromkeys(signals))


def _selection(source, sql, max_clips: int, cams: list[str], tolerance_s: float, align: str
               ) -> tuple[pa.Table, list[Part], list[int], str]:
    """(manifest, the first ``max_clips`` clips, the episode of each clip left out, what the clips are called).

    A Database resolves ``sql`` (default: every episode): for windows and whole episodes only the first
    ``max_clips`` result rows (in the query's ORDER BY, else by episode and window start, as ``dataset()`` orders
    them) are resolved to frames; ``index`` rows are resolved whole and cut into runs. A dataset gives its manifest.
    """
    if callable(getattr(source, "manifest", None)):  # a Database
        db = source
        if sql is None:
            sql = "SELECT episode_index FROM episodes ORDER BY episode_index"
        elif not isinstance(sql, str):
            raise TypeError(f"sql must be a SELECT (a string), not {type(sql).__name__}")
        checked, result = db._capped_result(sql)
        mode = contract.result_mode(result.column_names)
        kw = {"cameras": cams, "extras": False, "align": align, "tolerance_s": tolerance_s}
        what = {"index": "runs of frames", "window": "windows", "episode": "episodes"}[mode]
        if mode == "index":
            manifest = db._resolve(result, sql, checked.ordered, **kw)
            parts = cut_parts(manifest, mode, warn_split=False)  # a clip per run of frames is the point here
            return manifest, parts[:max_clips], [p.src_episode for p in parts[max_clips:]], what
        if not checked.ordered:  # as build_manifest orders a result without ORDER BY
            keys = ["episode_index", "start_s", "end_s"] if mode == "window" else ["episode_index"]
            result = result.sort_by([(c, "ascending") for c in keys])
        manifest = db._resolve(result.slice(0, max_clips), sql, True, **kw)
        rest = result["episode_index"].slice(max_clips).to_pylist()
        return manifest, cut_parts(manifest, mode), rest, what
    if sql is not None:
        raise TypeError("a dataset already holds its selection: call show_clips(ds) without sql, or pass the "
                        "Database and the SQL: show_clips(db, sql)")
    manifest = source.manifest
    meta = Meta.of(manifest)
    missing = [k for k in cams if meta.cameras is not None and k not in meta.cameras]
    if missing:
        raise QueryError(f"the dataset was opened without cameras {missing} (cameras={list(meta.cameras)}); pass "
                         f"cameras=[...] among those, or open it with them")
    parts = cut_parts(manifest, meta.mode or "index", warn_split=False)
    what = {"index": "runs of frames", "window": "windows", "episode": "episodes"}.get(meta.mode, "clips")
    return manifest, parts[:max_clips], [p.src_episode for p in parts[max_clips:]], what


class _Plan:
    """Where each clip's frames are in each camera's mp4, what they weigh, and the writing of them."""

    def __init__(self, files, manifest: pa.Table, cams: list[str], tolerance_s: float, align: str):
        self.files, self.m, self.tol = files, manifest, tolerance_s
        self.s = ExportSource(files, align=align, clips=Meta.of(manifest).clips)
        self.indexes: dict[str, video_index.FrameIndex] = {}
        self.rows: dict[tuple[int, str], tuple[video_index.FrameIndex, int, int]] = {}
        self.depth = {k for k in cams if files.layout.features[k].is_depth_map}
        # a depth camera's mp4s decode to 12-bit codes (its windows are always encoded again)
        gray = {rel for k in self.depth for rel in pc.unique(manifest[f"{k}/file"]).to_pylist() if rel is not None}
        self.pool = DecoderPool(files.source, max_open=4, gray=frozenset(gray))

    def _index(self, rel: str, key: str) -> video_index.FrameIndex:
        """The mp4's frame index, its clip chain checked against its frames on first use (as the export does)."""
        if rel not in self.indexes:
            lay, src = self.files.layout, self.files.source
            index = video_index.FrameIndex.load(video_index.ensure_index(src, rel, self.files.cache_dir))
            locate.check_clips(index.pts_s, self.s.clips.get(key), rel, fps=lay.fps, where=src.path(rel),
                               video_key=key)
            self.indexes[rel] = index
        return self.indexes[rel]

    def locate(self, part: Part, key: str) -> tuple[video_index.FrameIndex, int, int]:
        """(index, first row, last row) of ``part``'s frames of camera ``key``.

        Raises:
            DatasetFormatError: a missing video pointer, frames not consecutive in the video, or a frame the
                dataset would not serve (:func:`lerobot_sql.export.video_writer.source_rows`).
            FrameNotFoundError: a frame has no video frame within ``tolerance_s``.
        """
        got = self.rows.get((id(part), key))
        if got is None:
            i0 = int(part.rows[0])
            rel = self.m[f"{key}/file"][i0].as_py()
            if rel is None:
                raise DatasetFormatError(f"episode {part.src_episode}: meta/episodes has no video file for camera "
                                         f"{key!r}; leave it out (cameras=[...])")
            index = self._index(rel, key)
            rows = source_rows(self.m, self.tol, self.s, index, key, part.rows, part.src_episode)
            if np.any(np.diff(rows) != 1):
                raise DatasetFormatError(f"{rel}: frames of episode {part.src_episode} ({key}) are not consecutive in "
                                         "the video; the timestamps disagree with the video (`lerobot-sql doctor`)")
            got = self.rows[(id(part), key)] = (index, int(rows[0]), int(rows[-1]))
        return got

    def estimate(self, part: Part, key: str) -> int:
        """Bytes of the packets a copy of ``part``'s frames of camera ``key`` holds (pre-roll included)."""
        index, ra, rb = self.locate(part, key)
        if index.byte_size is None:
            return 0
        return int(index.byte_size[int(index.key_row[ra]):rb + 1].sum())

    def fetch_ahead(self, parts: list[Part]) -> None:
        """A remote dataset: fetch every clip's packets (and a demuxer block past them) in one parallel round,
        before PyAV reads them one block at a time. Nothing else of the mp4s is fetched."""
        src = self.files.source
        if src.is_local:
            return
        jobs: dict[str, list[tuple[int, int]]] = {}
        for part in parts:
            for key in {k for (pid, k) in self.rows if pid == id(part)}:
                index, ra, rb = self.rows[(id(part), key)]
                if index.byte_offset is None or (index.byte_offset < 0).any():
                    continue
                rows = np.arange(int(index.key_row[ra]), rb + 1)
                a = int(index.byte_offset[rows].min())
                b = int((index.byte_offset[rows] + index.byte_size[rows]).max()) + locate.AVIO_BUFFER
                jobs.setdefault(index.path, []).append((a, b))
        src.fetch_many([(rel, merge_ranges(sorted(rs))) for rel, rs in jobs.items()])

    def clip(self, part: Part, key: str, reencode: bool):
        index, ra, rb = self.locate(part, key)
        return write_clip(self.files.source, index, ra, rb, float(self.files.layout.fps), pool=self.pool,
                          gray=key in self.depth, reencode=reencode)

    def close(self) -> None:
        self.pool.close()


def _read_signals(files, part: Part, sigs: list[str], ts: np.ndarray) -> list[Signal]:
    """Each signal's values over ``part``'s frames, float64 (frames, elements), from its rows of the data file."""
    if not sigs:
        return []
    src, lay = files.source, files.layout
    info = tabular.data_file_info(src, part.data_file)
    rgs = info.row_groups(np.array([part.data_row]), np.array([part.data_row + part.length]))
    table = tabular.read_row_groups(src, info, [int(r) for r in rgs], lay, columns=sigs, one_table=True)[0]
    first = int(info.rg_offsets[int(rgs[0])])
    view = tabular.RowGroupView(table, lay)
    out = []
    for k in sigs:
        v = np.asarray(view.column(k), np.float64)
        v = v.reshape(len(v), -1)[part.data_row - first: part.data_row - first + part.length]
        names = lay.features[k].flat_names
        names = names if names and len(names) == v.shape[1] else \
            [k] if v.shape[1] == 1 else [f"{k}[{i}]" for i in range(v.shape[1])]
        out.append(Signal(feature=k, names=list(names), t=ts, values=v))
    return out
