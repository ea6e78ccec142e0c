"""Looking at a dataset in Jupyter: an episode's features against time, a grid of camera frames, one item as a table,
and the clips a query selected, playing (:func:`show_clips`).

matplotlib is imported only inside :func:`plot_episode` and :func:`frame_grid` (install it with
``pip install 'lerobot_sql[notebook]'``); :func:`show_item` needs only Pillow, :func:`show_clips` nothing more.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any, Iterable, Sequence

import numpy as np

from ._format.layout import DEFAULT_COLUMNS
from ._query.sqltext import ident as q
from .errors import QueryError, did_you_mean

__all__ = ["plot_episode", "frame_grid", "show_item", "ItemView", "show_clips"]


def _plt():
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("lerobot_sql.display needs matplotlib for plots: pip install 'lerobot_sql[notebook]' "
                          "(or pip install matplotlib)") from e
    return plt


# ---- an episode against time -------------------------------------------------------------------------------------
def _plottable(db) -> list[str]:
    """Numeric, non-camera features other than the bookkeeping columns, in info.json order."""
    return [k for k, f in db.layout.features.items()
            if not f.is_camera and k not in DEFAULT_COLUMNS and f.dtype not in ("string", "language")]


def episode_frame(db, episode_index: int, features: Sequence[str] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The timestamps and feature values of one episode, read from the ``frames`` view.

    Returns:
        ``(timestamp, {feature: values})``: ``timestamp`` float64 (N,) in seconds from episode start (column
        ``timestamp`` of data/*.parquet), each feature float64 (N, D) (D = 1 for scalar features), in frame order.

    Raises:
        QueryError: an unknown or camera feature, or an episode_index the dataset does not have.
    """
    features = list(features) if features is not None else _plottable(db)
    for f in features:
        feat = db.layout.features.get(f)
        if feat is None:
            raise QueryError(f"unknown feature {f!r}.{did_you_mean(f, db.layout.features)} "
                             f"Plottable features: {_plottable(db)}")
        if feat.is_camera or feat.dtype in ("string", "language"):
            raise QueryError(f"feature {f!r} ({feat.dtype}) cannot be plotted against time; use frame_grid() for "
                             f"cameras. Plottable features: {_plottable(db)}")
    cols = ", ".join(q(f) for f in features)
    t = db.sql(f"SELECT timestamp{', ' + cols if cols else ''} FROM frames "
               f"WHERE episode_index = {int(episode_index)} ORDER BY frame_index").to_arrow_table()
    if t.num_rows == 0:
        lo, hi = db.sql("SELECT min(episode_index), max(episode_index) FROM episodes").fetchall()[0]
        raise QueryError(f"episode_index {int(episode_index)} has no frames in this dataset "
                         f"(episode_index ranges {lo}..{hi}); pick one from `SELECT episode_index FROM episodes`")
    out = {}
    for f in features:
        col = t[f].combine_chunks()
        if hasattr(col, "flatten") and hasattr(col.type, "value_type"):  # (fixed-size) list column -> (N, D)
            values = np.asarray(col.flatten().to_numpy(zero_copy_only=False), np.float64).reshape(t.num_rows, -1)
        else:
            values = np.asarray(col.to_numpy(zero_copy_only=False), np.float64).reshape(-1, 1)
        out[f] = values
    return np.asarray(t["timestamp"].to_numpy(), np.float64), out


def _element_names(db, feature: str, width: int) -> list[str]:
    names = db.layout.features[feature].flat_names
    if names and len(names) == width:
        return names
    return [feature] if width == 1 else [f"{feature}[{i}]" for i in range(width)]


def plot_episode(db, episode_index: int, features: Sequence[str] | str | None = None, ax=None):
    """Plot features of one episode against time: one line per element, labelled with info.json ``names``.

    Args:
        db: a :class:`lerobot_sql.Database`.
        episode_index: the episode to plot.
        features: feature keys (``"observation.state"``, ``"action"``); default: every numeric non-camera
            feature except ``timestamp, frame_index, episode_index, index, task_index``.
        ax: a matplotlib Axes (all features drawn on it, labels prefixed by the feature), or one Axes per
            feature; default: a new figure with one row per feature sharing the time axis.

    Returns:
        The list of Axes drawn on. The x axis is ``timestamp`` in seconds from the episode start.

    Raises:
        QueryError: unknown/camera feature or unknown episode (see :func:`episode_frame`).
        ImportError: matplotlib is not installed.
    """
    if isinstance(features, str):
        features = [features]
    ts, values = episode_frame(db, episode_index, features)
    plt = _plt()
    names = list(values)
    if ax is None:
        fig, axes = plt.subplots(len(names), 1, sharex=True, squeeze=False,
                                 figsize=(9, 2.6 * len(names)), constrained_layout=True)
        axes = list(axes[:, 0])
    elif isinstance(ax, (list, tuple, np.ndarray)):
        axes = list(np.ravel(ax))
        if len(axes) != len(names):
            raise ValueError(f"got {len(axes)} Axes for {len(names)} features {names}; pass one Axes per feature "
                             "or a single Axes")
    else:
        axes = [ax] * len(names)
    shared = len(set(map(id, axes))) < len(axes)
    for a, f in zip(axes, names):
        v = values[f]
        for j, label in enumerate(_element_names(db, f, v.shape[1])):
            a.plot(ts, v[:, j], label=f"{f} {label}" if shared else label, linewidth=1.2)
        if not shared:
            a.set_ylabel(f)
        a.grid(True, alpha=0.3)
        a.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[-1].set_xlabel("timestamp (s)")
    title = f"episode {int(episode_index)}"
    if "tasks" in db.sql("SELECT * FROM episodes LIMIT 0").columns:  # meta/episodes lists the episode's task texts
        tasks = db.sql(f"SELECT tasks FROM episodes WHERE episode_index = {int(episode_index)}").fetchall()
        if tasks and tasks[0][0]:
            title += " - " + "; ".join(tasks[0][0])
    axes[0].set_title(title, fontsize="medium")
    return axes


# ---- camera frames -------------------------------------------------------------------------------------------------
def _is_image(v: Any) -> bool:
    shape = getattr(v, "shape", None)
    return shape is not None and len(shape) in (3, 4) and shape[-3] in (1, 3, 4) and shape[-1] > 4


def _to_hwc(img) -> np.ndarray:
    """(C, H, W) tensor/array, float in [0, 1] or uint8 -> (H, W, C) uint8 (or (H, W) for one channel)."""
    a = img.detach().cpu().numpy() if hasattr(img, "detach") else np.asarray(img)
    if a.dtype != np.uint8:
        a = (np.clip(a.astype(np.float32), 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
    a = a.transpose(1, 2, 0)
    return a[:, :, 0] if a.shape[2] == 1 else a


def _frames_of(item: dict, key: str) -> list[np.ndarray]:
    v = item[key]
    return [_to_hwc(v)] if len(v.shape) == 3 else [_to_hwc(x) for x in v]


def _items(items_or_dataset, indices: Iterable[int] | None, max_items: int) -> list[dict]:
    if isinstance(items_or_dataset, dict):
        return [items_or_dataset]
    if indices is None:
        n = len(items_or_dataset)
        indices = np.unique(np.linspace(0, n - 1, min(n, max_items)).round().astype(int)) if n else []
    return [items_or_dataset[int(i)] for i in indices]


def _caption(item: dict) -> str:
    parts = []
    for k, short in (("episode_index", "ep"), ("frame_index", "frame"), ("timestamp", "t")):
        v = item.get(k)
        if v is not None and getattr(v, "ndim", 0) == 0:
            x = v.item() if hasattr(v, "item") else v
            parts.append(f"{short} {x:.2f}s" if k == "timestamp" else f"{short} {x}")
    return " ".join(parts)


def frame_grid(items_or_dataset, keys: Sequence[str] | str | None = None, *, indices: Iterable[int] | None = None,
               max_items: int = 6, cell_inches: float = 2.0):
    """A grid of camera frames: one row per item, one column per camera (and per time offset of stacked cameras).

    Args:
        items_or_dataset: a dataset (e.g. ``db.dataset(...)``), a list of items, or one item (a dict).
        keys: camera keys to show (``"observation.images.front"``); default: every image-shaped value of the
            first item, i.e. tensors (C, H, W) or (T, C, H, W) with C in 1, 3, 4.
        indices: which items of a dataset to show; default: ``max_items`` spread evenly over it.
        max_items: the number of rows when ``indices`` is not given.
        cell_inches: the size of one cell.

    Returns:
        The matplotlib Figure. Rows are captioned with the item's episode, frame and timestamp (seconds).

    Raises:
        KeyError: a key is not in the items. ValueError: no image-shaped values. ImportError: no matplotlib.
    """
    items = _items(items_or_dataset, indices, max_items)
    if not items:
        raise ValueError("frame_grid got no items to show")
    if isinstance(keys, str):
        keys = [keys]
    keys = list(keys) if keys is not None else [k for k, v in items[0].items() if _is_image(v)]
    if not keys:
        raise ValueError(f"no camera frames among the item's keys {sorted(items[0])}; pass keys=[...]")
    missing = [k for k in keys if k not in items[0]]
    if missing:
        raise KeyError(f"{missing} not in the item; image keys are {[k for k, v in items[0].items() if _is_image(v)]}")
    rows = [[(k, t, img) for k in keys for t, img in enumerate(_frames_of(it, k))] for it in items]
    ncols = max(len(r) for r in rows)
    h, w = rows[0][0][2].shape[:2]
    plt = _plt()
    fig, axes = plt.subplots(len(rows), ncols, squeeze=False, constrained_layout=True,
                             figsize=(cell_inches * ncols, cell_inches * h / w * len(rows) + 0.4))
    for r, (item, cells) in enumerate(zip(items, rows)):
        for c in range(ncols):
            a = axes[r, c]
            a.set_xticks([])
            a.set_yticks([])
            if c >= len(cells):
                a.axis("off")
                continue
            k, t, img = cells[c]
            a.imshow(img, cmap="gray" if img.ndim == 2 else None)
            if r == 0:
                stacked = len(item[k].shape) == 4
                a.set_title(k.rsplit(".", 1)[-1] + (f" [{t}]" if stacked else ""), fontsize="small")
            if c == 0:
                a.set_ylabel(_caption(item), fontsize="x-small")
    return fig


# ---- one item as a table -------------------------------------------------------------------------------------------
def _summary(v: Any) -> tuple[str, str, str]:
    """(dtype, shape, short value) of one item value."""
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        dtype = str(v.dtype).removeprefix("torch.")
        shape = "(" + ", ".join(str(int(s)) for s in v.shape) + ")"
        a = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
        if a.ndim == 0:
            return dtype, shape, f"{a.item():.6g}" if a.dtype.kind == "f" else str(a.item())
        if a.size <= 12:
            with np.printoptions(precision=4, suppress=True):
                return dtype, shape, np.array2string(a, separator=", ")
        af = a.astype(np.float64)
        return dtype, shape, f"min {af.min():.4g}  mean {af.mean():.4g}  max {af.max():.4g}"
    return type(v).__name__, "", repr(v) if not isinstance(v, str) else v


def _png_data_uri(img: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class ItemView:
    """An item (the dict ``dataset[i]`` returns) shown as a table: key, dtype, shape and a value summary.

    In Jupyter the HTML form also shows every camera frame (stacked frames side by side); ``repr`` gives the
    plain-text table.
    """

    def __init__(self, item: dict, image_scale: int = 2):
        self.item = item
        self.image_scale = int(image_scale)

    def rows(self) -> list[tuple[str, str, str, str]]:
        return [(k, *_summary(v)) for k, v in self.item.items()]

    def __repr__(self) -> str:
        rows = [("key", "dtype", "shape", "value")] + self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        out = ["<table style='font-family:monospace;font-size:12px'>",
               "<tr><th style='text-align:left'>key</th><th>dtype</th><th>shape</th>"
               "<th style='text-align:left'>value</th></tr>"]
        for (k, dtype, shape, value), v in zip(self.rows(), self.item.values()):
            if _is_image(v):
                imgs = [_to_hwc(v)] if len(v.shape) == 3 else [_to_hwc(x) for x in v]
                value_html = "".join(
                    f"<img src='{_png_data_uri(im)}' width='{im.shape[1] * self.image_scale}' "
                    f"style='image-rendering:pixelated;margin-right:4px' title='{html.escape(k)} [{t}]'/>"
                    for t, im in enumerate(imgs)) + f"<br/>{html.escape(value)}"
            else:
                value_html = html.escape(value)
            out.append(f"<tr><td style='text-align:left'>{html.escape(k)}</td><td>{html.escape(dtype)}</td>"
                       f"<td>{shape}</td><td style='text-align:left'>{value_html}</td></tr>")
        out.append("</table>")
        return "".join(out)


def show_item(item: dict, image_scale: int = 2) -> ItemView:
    """Render one item for Jupyter: a table of keys, dtypes, shapes and values, with the camera frames as images.

    Args:
        item: a dict as returned by ``dataset[i]`` (tensors, str).
        image_scale: each frame is shown this many times its pixel size.

    Returns:
        An :class:`ItemView`; as the last expression of a cell it renders as HTML, ``print`` gives plain text.
    """
    return ItemView(item, image_scale)


# ---- clips of a selection, playing ---------------------------------------------------------------------------------
def show_clips(db_or_dataset, sql: str | None = None, *, max_clips: int = 24, max_bytes: int = 64 << 20,
               cameras: Sequence[str] | str | None = None, signals: Sequence[str] | str | None = None,
               reencode: bool = False, tolerance_s: float = 1e-4, align: str = "timestamp"):
    """Play what a query selected: one clip per window (or episode, or run of frames), every camera side by side and
    in sync, captioned with the episode, its bounds and task, over a plot of the chosen signals whose marker follows
    the frame shown.

    Each camera's clip is the dataset's own mp4 packets from the keyframe at or before the window through its last
    frame, copied (nothing decoded) with an edit list so that it plays from the window's first frame and lasts the
    window (:mod:`lerobot_sql.export.clip_writer`); only a codec browsers do not play (HEVC, lerobot's depth maps)
    is decoded and encoded again, as H.264. A remote dataset fetches only the clips' packets (and the signals' rows).

    Args:
        db_or_dataset: a :class:`lerobot_sql.Database` (with ``sql``), or a dataset from ``db.dataset(...)`` (its
            own selection; no ``sql``).
        sql: a SELECT by the dataset() contract: ``episode_index`` rows (whole episodes), ``(episode_index,
            start_s, end_s)`` windows, or ``index`` rows (one clip per run of consecutive frames); default every
            episode. Clips follow its ORDER BY (else episode, then window start).
        max_clips: at most this many clips (default 24); the rest are named on the page as left out.
        max_bytes: at most this many mp4 bytes in the page (default 64 MiB; counted before anything is fetched):
            clips past it are left out, and the page says so.
        cameras: video keys to show (default every video camera, info.json order).
        signals: numeric features to plot (default ``observation.state``, else ``action``; ``[]``: none).
        reencode: encode every clip as H.264 (for a browser without AV1, e.g. Safari on older Macs).
        tolerance_s, align: how each row's frame is found, as ``db.dataset()`` takes them.

    Returns:
        A :class:`lerobot_sql.view.ClipsPage`: as a cell's last expression it renders the clips;
        ``.write("clips.html")`` saves the same page as one self-contained HTML file; ``.cards`` holds each clip's
        mp4 bytes and signal arrays.

    Raises:
        QueryError / ResultContractError: the SQL or its result is unusable; an unknown camera or signal (naming the
            ones there are).
        TypeError: neither a Database nor a dataset; ``sql`` given with a dataset.
        ValueError: ``max_clips`` / ``max_bytes`` not an integer >= 1; a bad ``tolerance_s`` or ``align``.
        FrameNotFoundError / DatasetFormatError / VideoDecodeError / MissingFileError: as an export of the
            selection would raise them.
    """
    from .view import clips_page

    return clips_page(db_or_dataset, sql, max_clips=max_clips, max_bytes=max_bytes,
                      cameras=list(cameras) if isinstance(cameras, (list, tuple)) else cameras,
                      signals=list(signals) if isinstance(signals, (list, tuple)) else signals,
                      reencode=reencode, tolerance_s=tolerance_s, align=align)
