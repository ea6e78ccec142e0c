"""A clip page as HTML: one self-contained file (or a Jupyter output) that plays each clip's cameras in sync over
a plot of its signals, with no server, no network and no script from elsewhere.

The mp4s are embedded as ``data:video/mp4;base64,...`` URLs (Chromium plays a 16 MB one; a page is bounded well
below that per clip by the caller), the plots are inline SVG, and one small inline script per page makes each
clip's first camera the clock: its controls play, pause and seek every camera of the clip (the others follow, and
are put back on it when they drift by more than a frame), and a marker on each plot moves with it (clicking a plot
seeks there). Without scripts (an untrusted notebook) every video keeps its own controls and still plays.

Every text from the dataset or the user (task texts, feature and element names, the SQL, the dataset's URL) is
HTML-escaped; the script holds no such text, only the page's own id.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import os
import secrets
from pathlib import Path

import numpy as np

from .._version import __version__
from ..export.clip_writer import ClipVideo

# plot geometry, SVG user units (the SVG scales to the clip's width)
PLOT_W, PLOT_H, LEFT, RIGHT, TOP, BOTTOM = 600, 110, 46, 8, 6, 16
VIDEO_H = 200  # pixels: each camera's height on the page
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")


@dataclasses.dataclass(frozen=True)
class Signal:
    """One feature's values over a clip.

    Attributes:
        feature: the feature key (``observation.state``).
        names: one label per element (info.json ``names``, else ``key[i]``).
        t: float64 (frames,), each frame's ``timestamp``, seconds from the episode start.
        values: float64 (frames, elements).
    """

    feature: str
    names: list[str]
    t: np.ndarray
    values: np.ndarray


@dataclasses.dataclass(frozen=True)
class Card:
    """One clip: a window (or a whole episode, or a run of frames) of one episode.

    Attributes:
        episode_index, frame_start: the episode and the frame_index of the clip's first frame.
        frames: the clip's frame count.
        start_s, end_s: its bounds in the episode, seconds (first frame's timestamp; plus frames / fps).
        task: the first frame's task text (None when tasks.parquet has none for it).
        videos: (camera key, :class:`~lerobot_sql.export.clip_writer.ClipVideo`) per camera, in order.
        signals: the plotted features.
    """

    episode_index: int
    frame_start: int
    frames: int
    start_s: float
    end_s: float
    task: str | None
    videos: list[tuple[str, ClipVideo]]
    signals: list[Signal]


@dataclasses.dataclass
class ClipsPage:
    """A page of clips: ``html()`` gives it, ``write(path)`` saves it, and in Jupyter it renders itself.

    Attributes:
        dataset: the dataset's root or URL. sql: the query (None for a dataset's own selection).
        fps: the dataset's frames per second.
        cards: the clips shown, in the selection's order.
        left_out: what the bounds left out, one sentence each (also written in the page).
        seconds: how long building it took (cutting, copying or encoding the clips, reading the signals).
    """

    dataset: str
    sql: str | None
    fps: float
    cards: list[Card]
    left_out: list[str]
    seconds: float = 0.0

    @property
    def mp4_bytes(self) -> int:
        """The embedded mp4s' size in bytes (the page is about 4/3 of it: base64)."""
        return sum(len(v.mp4) for c in self.cards for _, v in c.videos)

    @property
    def reencoded(self) -> list[tuple[int, str, str]]:
        """(episode_index, camera, why) of every clip encoded again instead of copied."""
        return [(c.episode_index, k, v.reason or "") for c in self.cards for k, v in c.videos if not v.copied]

    def __repr__(self) -> str:
        return (f"ClipsPage({len(self.cards)} clips of {self.dataset}, {self.mp4_bytes:,} mp4 bytes, "
                f"{len(self.reencoded)} camera clips re-encoded, built in {self.seconds:.2f} s"
                + (f"; left out: {'; '.join(self.left_out)}" if self.left_out else "") + ")")

    def _repr_html_(self) -> str:
        return self.html(standalone=False)

    def html(self, standalone: bool = True) -> str:
        """The page: a whole HTML document (``standalone``), or a fragment for a notebook output."""
        pid = "lsql-" + secrets.token_hex(4)
        body = _body(self, pid)
        if not standalone:
            return body
        title = f"{len(self.cards)} clips of {self.dataset}"
        return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
                f"<meta name='generator' content='lerobot_sql {html.escape(__version__)}'>"
                f"<title>{html.escape(title)}</title></head>\n<body style='margin:12px'>\n{body}\n</body></html>\n")

    def write(self, path: str | os.PathLike) -> Path:
        """Write the page to ``path`` (a new file, or over an old one once the new one is complete).

        Returns:
            The path written.

        Raises:
            OSError: the folder does not exist or cannot be written.
        """
        path = Path(path)
        # a new name beside it, opened exclusively (mkstemp's 0600 would make a page to share unreadable to others)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "x", encoding="utf-8") as f:
                f.write(self.html())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _body(page: ClipsPage, pid: str) -> str:
    head = [f"<div id='{pid}' class='lsql-clips'>", _STYLE.replace("ROOT", f"#{pid}"),
            f"<p class='lsql-head'><b>{len(page.cards)} clip{'s' if len(page.cards) != 1 else ''}</b> of "
            f"<code>{_e(page.dataset)}</code>"]
    if page.sql:
        head.append(f"<br>query: <code>{_e(page.sql)}</code>")
    head.append("</p>")
    for note in page.left_out:
        head.append(f"<p class='lsql-note'>Left out: {_e(note)}</p>")
    if page.reencoded:
        why = sorted({r for _, _, r in page.reencoded})
        head.append(f"<p class='lsql-note'>{len(page.reencoded)} camera clip(s) re-encoded to H.264 "
                    f"(the rest are the dataset's own packets): {_e('; '.join(why))}</p>")
    cards = [_card(c, page.fps) for c in page.cards]
    if not cards:
        head.append("<p class='lsql-note'>No clip to show.</p>")
    return "\n".join(head + cards + [f"<script>{_SCRIPT.replace('PAGE_ID', pid)}</script>", "</div>"])


def _card(c: Card, fps: float) -> str:
    dur = c.frames / fps
    vids = []
    for j, (key, v) in enumerate(c.videos):
        src = "data:video/mp4;base64," + base64.b64encode(v.mp4).decode("ascii")
        how = "copied" if v.copied else "re-encoded"
        vids.append(f"<div class='lsql-cam'><video src='{src}' controls muted playsinline preload='auto' "
                    f"data-camera='{_e(key)}'{' data-clock' if j == 0 else ''}></video>"
                    f"<div class='lsql-camname' title='{_e(v.codec)}, {how}'>{_e(key)}</div></div>")
    task = f" &middot; <span class='lsql-task'>{_e(c.task)}</span>" if c.task else ""
    caption = (f"<figcaption><b>episode {c.episode_index}</b> &middot; {c.start_s:.2f}&ndash;{c.end_s:.2f} s "
               f"(frames {c.frame_start}&ndash;{c.frame_start + c.frames - 1}){task} &middot; "
               f"<span class='lsql-time'>t = {c.start_s:.3f} s</span></figcaption>")
    plots = "".join(_plot(s, c.start_s, dur) for s in c.signals)
    return (f"<figure class='lsql-clip' data-episode='{c.episode_index}' data-t0='{c.start_s!r}' "
            f"data-duration='{dur!r}' data-fps='{fps!r}' data-frame0='{c.frame_start}'>"
            f"<div class='lsql-cams'>{''.join(vids)}</div>{caption}{plots}</figure>")


def _plot(s: Signal, t0: float, dur: float) -> str:
    """One signal as an SVG: a line per element over the clip's time, its y range the clip's own, and the marker
    (``line.lsql-marker``: the script moves it; ``data-x0``, ``data-w`` map clip time to x)."""
    v = s.values
    finite = v[np.isfinite(v)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 1.0, hi + 1.0
    w, h = PLOT_W - LEFT - RIGHT, PLOT_H - TOP - BOTTOM
    x = LEFT + (s.t - t0) / dur * w
    lines, legend = [], []
    for j, name in enumerate(s.names):
        y = TOP + (hi - v[:, j]) / (hi - lo) * h
        pts, pen = [], "M"
        for xi, yi in zip(x, y):
            if not np.isfinite(yi):
                pen = "M"  # a NaN or inf breaks the line
                continue
            pts.append(f"{pen}{xi:.1f},{yi:.1f}")
            pen = "L"
        color = COLORS[j % len(COLORS)]
        lines.append(f"<path d='{' '.join(pts)}' stroke='{color}' fill='none' stroke-width='1.2'>"
                     f"<title>{_e(s.feature)} {_e(name)}</title></path>")
        legend.append(f"<span style='color:{color}'>&#9632;</span>&nbsp;{_e(name)}")
    axis = (f"<rect x='{LEFT}' y='{TOP}' width='{w}' height='{h}' fill='none' stroke='#ccc'/>"
            f"<text x='{LEFT - 3}' y='{TOP + 8}' text-anchor='end'>{hi:.3g}</text>"
            f"<text x='{LEFT - 3}' y='{TOP + h}' text-anchor='end'>{lo:.3g}</text>"
            f"<text x='{LEFT}' y='{PLOT_H - 3}'>{t0:.2f} s</text>"
            f"<text x='{LEFT + w}' y='{PLOT_H - 3}' text-anchor='end'>{t0 + dur:.2f} s</text>")
    marker = (f"<line class='lsql-marker' x1='{LEFT}' x2='{LEFT}' y1='{TOP}' y2='{TOP + h}' data-x0='{LEFT}' "
              f"data-w='{w}' stroke='#000' stroke-width='1.5'/>")
    return (f"<div class='lsql-plot'><svg viewBox='0 0 {PLOT_W} {PLOT_H}' data-feature='{_e(s.feature)}'>"
            f"{axis}{''.join(lines)}{marker}</svg><div class='lsql-legend'><b>{_e(s.feature)}</b> "
            f"{' '.join(legend)}</div></div>")


_STYLE = f"""<style>
ROOT {{ font-family: system-ui, sans-serif; font-size: 13px; }}
ROOT .lsql-note {{ color: #8a4b00; margin: 2px 0; }}
ROOT figure.lsql-clip {{ display: inline-block; vertical-align: top; margin: 0 14px 18px 0; padding: 6px;
  border: 1px solid #ddd; border-radius: 4px; width: min-content; }}
ROOT .lsql-cams {{ display: flex; gap: 4px; }}
ROOT .lsql-cam video {{ height: {VIDEO_H}px; display: block; background: #000; }}
ROOT .lsql-camname {{ font-size: 11px; color: #555; }}
ROOT figcaption {{ margin: 4px 0; max-width: 100%; }}
ROOT .lsql-plot svg {{ width: 100%; min-width: 320px; height: auto; display: block; cursor: crosshair; }}
ROOT .lsql-plot text {{ font-size: 10px; fill: #555; }}
ROOT .lsql-legend {{ font-size: 11px; color: #333; }}
</style>"""

# The clock of each clip is its first video (data-clock); the others follow it. No text of the dataset in here.
_SCRIPT = """
(function () {
  var root = document.getElementById('PAGE_ID');
  if (!root) return;
  root.querySelectorAll('figure.lsql-clip').forEach(function (fig) {
    var vids = Array.prototype.slice.call(fig.querySelectorAll('video'));
    var clock = vids[0], others = vids.slice(1);
    if (!clock) return;
    var dur = parseFloat(fig.dataset.duration), fps = parseFloat(fig.dataset.fps);
    var t0 = parseFloat(fig.dataset.t0), frame0 = parseInt(fig.dataset.frame0, 10);
    var markers = Array.prototype.slice.call(fig.querySelectorAll('line.lsql-marker'));
    var label = fig.querySelector('.lsql-time');
    others.forEach(function (v) { v.controls = false; });
    function draw() {
      var t = Math.max(0, Math.min(clock.currentTime, dur));
      markers.forEach(function (m) {
        var x = parseFloat(m.dataset.x0) + parseFloat(m.dataset.w) * t / dur;
        m.setAttribute('x1', x.toFixed(2)); m.setAttribute('x2', x.toFixed(2));
      });
      var k = Math.min(Math.floor(t * fps + 1e-6), Math.round(dur * fps) - 1);
      if (label) label.textContent = 't = ' + (t0 + t).toFixed(3) + ' s (frame ' + (frame0 + k) + ')';
    }
    function follow(force) {
      others.forEach(function (v) {
        if (force || Math.abs(v.currentTime - clock.currentTime) > 1 / fps) v.currentTime = clock.currentTime;
        if (v.playbackRate !== clock.playbackRate) v.playbackRate = clock.playbackRate;
      });
    }
    var raf = 0;
    function tick() { draw(); follow(false); raf = clock.paused ? 0 : requestAnimationFrame(tick); }
    clock.addEventListener('play', function () {
      follow(true);
      others.forEach(function (v) { var p = v.play(); if (p && p.catch) p.catch(function () {}); });
      if (!raf) raf = requestAnimationFrame(tick);
    });
    clock.addEventListener('pause', function () { others.forEach(function (v) { v.pause(); }); follow(true); draw(); });
    clock.addEventListener('seeking', function () { follow(true); draw(); });
    clock.addEventListener('seeked', function () { follow(false); draw(); });
    clock.addEventListener('timeupdate', draw);
    clock.addEventListener('ratechange', function () { follow(true); });
    fig.querySelectorAll('.lsql-plot svg').forEach(function (svg) {
      svg.addEventListener('click', function (ev) {
        var m = svg.querySelector('line.lsql-marker'), box = svg.getBoundingClientRect();
        var vb = svg.viewBox.baseVal, x = (ev.clientX - box.left) / box.width * vb.width;
        var f = (x - parseFloat(m.dataset.x0)) / parseFloat(m.dataset.w);
        clock.currentTime = Math.max(0, Math.min(1, f)) * dur;
      });
    });
    draw();
  });
})();
"""
