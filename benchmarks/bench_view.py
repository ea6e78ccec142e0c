#!/usr/bin/env python
"""Clip page time: ``show_clips`` (the page ``lerobot-sql view`` writes) against decoding the same frames.

    python -m benchmarks.bench_view [--root DATASET] [--windows 20] [--seconds 2.0] [--repeat 3]

``--root`` defaults to view480 in $LSQL_BENCH_DATA (default ../bench_data beside the checkout), generated there on
first use by ``benchmarks.make_scale_video_set`` (40 episodes, two 480x640 cameras, 30 fps, H.264 with lerobot's GOP
of 2; about a minute). The selection: ``--windows`` windows of ``--seconds`` each, one per episode, every other one
starting mid-GOP (so half the clips carry a frame of pre-roll). Timed, best of ``--repeat``, with the video index
built (its one-time demux is reported apart):

* ``page``: ``show_clips(db, sql)`` and ``.html()``: locate, copy each camera's packets into an mp4 with an edit
  list, read the signals, write the page (what a user waits for);
* ``decode``: the same frames decoded by PyAV, each window from its keyframe, to YUV frames, no conversion (what any
  tool that builds a GIF or a re-encoded clip pays at least);
* ``items``: the same frames as ``db.dataset(sql, return_uint8=True)`` items (decode + RGB + the rows).

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import av  # noqa: E402
import common  # noqa: E402

import lerobot_sql as lsql  # noqa: E402
from lerobot_sql.display import show_clips  # noqa: E402


def ensure_set(root: Path) -> Path:
    if not (root / "meta" / "info.json").exists():
        subprocess.run([sys.executable, "-m", "benchmarks.make_scale_video_set", "generate", "--episodes", "40",
                        "--cameras", "2", "--size", "480x640", "--fps", "30", "--clips", "4", "--root", str(root)],
                       cwd=REPO, check=True)
    return root


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def decode_windows(db, page) -> int:
    """Decode every frame of the page's clips from the source mp4s (from each window's keyframe), PyAV, no
    conversion; returns the frames decoded in the windows."""
    n = 0
    for card in page.cards:
        for key, _ in card.videos:
            rel, from_ts = db.sql(f"SELECT path, from_timestamp FROM videos WHERE episode_index = "
                                  f"{card.episode_index} AND video_key = '{key}'").fetchall()[0]
            t0 = from_ts + card.start_s
            with av.open(str(Path(db.source.local_path(rel)))) as c:
                s = c.streams.video[0]
                s.thread_count = 1
                c.seek(int(t0 / s.time_base), stream=s, backward=True, any_frame=False)
                for f in c.decode(s):
                    t = float(f.pts * s.time_base)
                    if t >= t0 + card.frames / db.fps - 0.5 / db.fps:
                        break
                    n += t >= t0 - 0.5 / db.fps
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=common.BENCH_DATA / "view480")
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    db = lsql.connect(ensure_set(a.root))
    sql = (f"SELECT episode_index, 1.0 + (episode_index % 2) / {db.fps} AS start_s, "
           f"1.0 + (episode_index % 2) / {db.fps} + {a.seconds} AS end_s FROM episodes ORDER BY episode_index "
           f"LIMIT {a.windows}")
    t = time.perf_counter()
    db.build_video_index(progress=False)
    index_s = time.perf_counter() - t
    page_s, page = best(lambda: (lambda p: (p, p.html()))(show_clips(db, sql, max_clips=a.windows))[0], a.repeat)
    decode_s, frames = best(lambda: decode_windows(db, page), a.repeat)
    ds = db.dataset(sql, return_uint8=True)
    items_s, _ = best(lambda: [ds[i] for i in range(len(ds))], 1)
    cams = len(page.cards[0].videos)
    out = {"bench": "view", "root": str(a.root), "windows": len(page.cards), "cameras": cams,
           "frames_per_camera": sum(c.frames for c in page.cards), "decoded_frames": frames,
           "page_s": round(page_s, 3), "decode_s": round(decode_s, 3), "items_s": round(items_s, 3),
           "index_once_s": round(index_s, 3), "mp4_mb": round(page.mp4_bytes / 2 ** 20, 2),
           "copied": sum(v.copied for c in page.cards for _, v in c.videos)}
    print(f"{out['windows']} windows x {cams} cameras, {out['frames_per_camera']} frames per camera, "
          f"{out['mp4_mb']} MB of mp4 in the page ({out['copied']} clips copied)")
    print(f"  page (show_clips + html)   {page_s:7.3f} s")
    print(f"  decode the frames (PyAV)   {decode_s:7.3f} s   ({frames} frames, {decode_s / page_s:.1f}x the page)")
    print(f"  dataset items              {items_s:7.3f} s")
    print(f"  video index, once          {index_s:7.3f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
