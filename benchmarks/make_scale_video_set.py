#!/usr/bin/env python
"""A DROID-shaped LeRobot v3.0 dataset with video, for the scale benchmarks (issue 38), written in minutes on 2 cores.

    python -m benchmarks.make_scale_video_set generate --episodes 10000 [--root DIR] [--cameras 3] [--size 180x320]
        [--fps 15] [--video-file-mb 200] [--clips 24] [--seed 0] [--workers 2] [--force]
    python -m benchmarks.make_scale_video_set verify --root DIR [--items 200]

``--root`` defaults to ``<parent>/<episodes>`` where ``<parent>`` is $LSQL_SCALE_ROOT, else scale_video/ in
$LSQL_BENCH_DATA (default ../bench_data beside the checkout). ``generate`` skips a root whose generator.json already
holds the same arguments (``--force`` rewrites it).

What is written, as lerobot's recorder writes it: episodes of 120..360 frames (uniform, 15 fps; DROID's average is
about 290), ``observation.state`` float32 (8,) and ``action`` float32 (7,) as a bounded random walk, 3 cameras
(``observation.images.exterior_1_left``, ``exterior_2_left``, ``wrist_left``) at 180x320, h264 (libx264, yuv420p,
crf 30, GOP 2 as lerobot's writer). Data files hold one row group per episode and rotate at about 100 MB (lerobot's
test: file size + average bytes per frame x new frames >= limit); each camera's mp4s rotate at
``video_files_size_in_mb`` (current file + episode >= limit, sizes estimated from the packets); meta/episodes
carries every ``stats/...`` column lerobot >= 0.4 writes (cameras' statistics are those of the episode's clip, a
constant per clip), and its ``videos/<camera>/from_timestamp`` / ``to_timestamp`` are the running float sum of
``length / fps`` that lerobot writes. ``generator.json`` (beside meta/, not read by lerobot or lerobot_sql) records
the arguments, which ``verify`` needs to know what every frame must show.

How it is fast: ``--clips`` distinct clips (each as long as the longest episode) are encoded once; every episode's
segment of an mp4 is a stream copy (packets remuxed with new pts/dts, no re-encode) of the first ``length`` frames
of clip ``(episode_index * 7 + camera) % clips``. That cut is exact because clips are encoded without B-frames
(decode order = display order, so frames 0..length-1 are packets 0..length-1) and every episode starts at a clip's
frame 0, a keyframe (an IDR: x264's keyframes are IDR without open-GOP). GOP 2 is lerobot's default (any frame
decodes after at most one other), and its cost in bytes is what the benchmarks should see. Each clip frame is
``framecode.make_image(clip, frame, 1)`` (tests/data/framecode.py): a 6x8 grid of dark/bright blocks holding a
48-bit code of (clip, frame), readable after lossy compression, plus a faint moving texture so x264 does real work.

Measured on this machine (2 cores shared with other jobs, PyAV 18, default sizes, ``--workers 2``): 1,000 episodes
(243,859 frames x 3 cameras) in 25 s (46 to 70 s at load 4 to 5), 0.83 GB in 6 mp4s and 1 data file; 10,000
episodes (2,400,145 frames) in 59 s at load 2.5, 85 s at 3 to 4, 122 s at 5 (80 to 97 s of CPU), 8.15 GB in 39 mp4s
of at most 200 MiB, 3 data files and one 14 MB meta/episodes file. Encoding the clips is a fixed ~45 s of CPU (~20 s
on 2 cores); the rest grows with the frames, about 1.1 kB per camera frame on disk: 10k episodes ~8 GB, 20k ~16 GB
(the largest sensible on this machine's disk; 100k, ~82 GB, does not fit). The same arguments give byte-identical files.
``verify`` (200 random items x 3 cameras) found no mismatch at 200, 1,000 and 10,000 episodes;
``lerobot-sql doctor --decode`` reports OK on the 200-episode set, ``doctor`` on the 10,000 one; lerobot 0.4.4's
``LeRobotDataset`` (torchcodec) serves the 200-episode set's frames with the right codes too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402
from bench_scale import frame_rows, pointer_columns, write_episodes_file, write_tasks  # noqa: E402

DEFAULT_PARENT = Path(os.environ.get("LSQL_SCALE_ROOT", common.BENCH_DATA / "scale_video"))
FRAMECODE = REPO / "tests" / "data" / "framecode.py"
CAMERAS = ("observation.images.exterior_1_left", "observation.images.exterior_2_left", "observation.images.wrist_left")
CLIP_CAM = 1  # framecode's camera id in every clip's code: a clip is shared by all cameras
CLIP_STRIDE = 7  # clip of (episode, camera) = (episode * 7 + camera) % n_clips: neighbours and cameras differ
LENGTHS = (120, 360)
STATE_NAMES = [f"joint_{i}" for i in range(7)] + ["gripper_position"]
ACTION_NAMES = ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
TASKS = [f"{verb} the {thing}" for verb, thing in (
    ("put the marker in", "cup"), ("open", "top drawer"), ("close", "cabinet door"), ("pick up", "red block"),
    ("move", "bowl to the left"), ("wipe", "table with the towel"), ("stack", "blue cup on the green cup"),
    ("turn on", "faucet"), ("fold", "cloth in half"), ("push", "chair under the table"))]
DATA_FILE_MB = 100
META_EPISODES_PER_FILE = 50000  # as bench_scale.py
BLOCK = 1000  # episodes of state/action drawn at once: bounded memory at 100k episodes
# bf=0 (FFmpeg's max_b_frames; "bframes" is no option of its libx264 wrapper and was ignored, leaving x264's B-frames
# on): decode order = display order. threads=1: the worker processes already fill both cores.
X264 = {"crf": "30", "g": "2", "bf": "0", "threads": "1"}
MP4_BYTES_PER_FRAME = 6  # mp4 index bytes per sample (stsz, stss, stco...): measured 6.04, for the rotation test
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
MIB = 1024 * 1024  # lerobot's get_file_size_in_mb divides by 1024**2


def _framecode():
    spec = importlib.util.spec_from_file_location("framecode", FRAMECODE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plan(episodes: int, seed: int, lengths: tuple[int, int]) -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
    """The seeded generator, episode lengths and task per episode (``verify`` redraws them to know each frame)."""
    rng = np.random.default_rng(seed)
    ep_len = rng.integers(lengths[0], lengths[1] + 1, episodes).astype(np.int64)
    ep_task = rng.integers(0, len(TASKS), episodes).astype(np.int64)
    return rng, ep_len, ep_task


def clip_of(episode: int, camera: int, n_clips: int) -> int:
    """The clip whose first frames are camera number ``camera``'s video of ``episode``."""
    return (episode * CLIP_STRIDE + camera) % n_clips


def _sample_count(n: int) -> int:
    """How many frames lerobot samples for an episode's image statistics (``estimate_num_samples``)."""
    return n if n < 100 else max(100, min(int(n ** 0.75), 10000))


# ---- clips --------------------------------------------------------------------------------------------------------
def _encode_clip(path: Path, clip: int, n_frames: int, height: int, width: int, fps: int) -> dict:
    """Encode clip ``clip`` to ``path``; return its per-channel image statistics in [0, 1] (lerobot's way: the
    frames it samples, strided when a side is >= 300 px), used for every episode cut from it."""
    fc = _framecode()
    sampled = set(np.round(np.linspace(0, n_frames - 1, _sample_count(n_frames))).astype(int).tolist())
    step = max(1, max(height, width) // 150) if max(height, width) >= 300 else 1
    pixels = []
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps, options=X264)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for f in range(n_frames):
            img = fc.make_image(clip, f, CLIP_CAM, height, width)
            if f in sampled:
                pixels.append(img[::step, ::step].reshape(-1, 3))
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = f  # in 1/fps, the stream's codec time base
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    x = np.concatenate(pixels).astype(np.float64) / 255.0
    stats = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    stats.update({k: np.quantile(x, q, axis=0) for k, q in QUANTILES.items()})
    return {k: v.tolist() for k, v in stats.items()}


_PACKETS: dict[str, list[tuple[bytes, bool]]] = {}  # per process: clip path -> its packets, read once


def _packets(path: Path) -> list[tuple[bytes, bool]]:
    key = str(path)
    if key not in _PACKETS:
        with av.open(key) as inp:
            _PACKETS[key] = [(bytes(p), p.is_keyframe) for p in inp.demux(inp.streams.video[0]) if p.size]
    return _PACKETS[key]


def _write_video(path: Path, clip_paths: list[Path], segments: list[tuple[int, int]], fps: int) -> int:
    """Write one mp4 of ``segments`` = [(clip, length), ...] by stream copy; frame k of the file at pts k / fps."""
    tb = Fraction(1, fps)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(clip_paths[0])) as template, \
            av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as out:
        # The clips' SPS/PPS (avcC) are identical (same encoder settings and size, checked in generate_video_set),
        # so one clip's codec parameters describe every packet, as with lerobot's concat demuxer.
        stream = out.add_stream_from_template(template.streams.video[0])
        k = 0
        for clip, length in segments:
            for data, key in _packets(clip_paths[clip])[:length]:
                packet = av.Packet(data)
                packet.pts = packet.dts = k
                packet.duration = 1  # the last sample's duration too: file duration = frames / fps
                packet.time_base = tb
                packet.is_keyframe = key
                packet.stream = stream
                out.mux(packet)
                k += 1
    return k


def _layout(cameras: list[str], ep_len: np.ndarray, n_clips: int, sizes: list[np.ndarray], fps: int,
            limit_mb: float) -> tuple[dict[str, list], list[tuple[str, int, list]]]:
    """Per camera: each episode's (chunk, file, from_timestamp, to_timestamp) and the mp4s to write, rotated as
    lerobot's writer does (current file + this episode >= limit -> next file; from = previous to)."""
    cols: dict[str, list] = {}
    files: list[tuple[str, int, list]] = []
    cum = [np.concatenate([[0], np.cumsum(s)]) for s in sizes]  # bytes of a clip's first n packets
    for ci, cam in enumerate(cameras):
        rows = cols[cam] = []
        fidx, cur_mb, to_ts = -1, 0.0, 0.0
        for ep, n in enumerate(ep_len.tolist()):
            clip = clip_of(ep, ci, n_clips)
            ep_mb = (cum[clip][n] + MP4_BYTES_PER_FRAME * n) / MIB
            if fidx < 0 or cur_mb + ep_mb >= limit_mb:
                fidx, cur_mb, to_ts, segments = fidx + 1, 0.0, 0.0, []
                files.append((cam, fidx, segments))
            segments.append((clip, n))
            cur_mb += ep_mb
            from_ts, to_ts = to_ts, to_ts + n / fps
            rows.append((fidx // 1000, fidx % 1000, from_ts, to_ts))
    return cols, files


# ---- tabular ------------------------------------------------------------------------------------------------------
def _vector_stats(x: np.ndarray, starts: np.ndarray, lens: np.ndarray, out: dict, key: str) -> None:
    """Append per-episode stats of a (frames, D) array to ``out["stats/<key>/<stat>"]`` (list<double> cells)."""
    x64 = x.astype(np.float64)
    mean = np.add.reduceat(x64, starts) / lens[:, None]
    sq = np.add.reduceat(x64 * x64, starts) / lens[:, None]
    cells = {"min": np.minimum.reduceat(x64, starts), "max": np.maximum.reduceat(x64, starts), "mean": mean,
             "std": np.sqrt(np.maximum(sq - mean * mean, 0))}
    qs = np.stack([np.quantile(x64[s:s + n], list(QUANTILES.values()), axis=0) for s, n in zip(starts, lens)])
    cells.update({k: qs[:, i] for i, k in enumerate(QUANTILES)})
    for stat, v in cells.items():
        out.setdefault(f"stats/{key}/{stat}", []).extend(v.tolist())
    out.setdefault(f"stats/{key}/count", []).extend([[int(n)] for n in lens])


def _index_stats(first: np.ndarray, lens: np.ndarray, step: float, out: dict, key: str, integer: bool) -> None:
    """Per-episode stats of ``first + step * arange(length)`` (timestamp, frame_index, index) or of a constant
    (episode_index, task_index: step 0), in closed form."""
    last = first + step * (lens - 1)
    std = np.abs(step) * np.sqrt((lens.astype(np.float64) ** 2 - 1) / 12)
    cells = {"min": first, "max": last, "mean": (first + last) / 2, "std": std}
    cells.update({k: first + q * (last - first) for k, q in QUANTILES.items()})  # np.quantile of an arithmetic run
    for stat, v in cells.items():
        as_int = integer and stat in ("min", "max")  # lerobot's json round trip keeps ints for int features
        out.setdefault(f"stats/{key}/{stat}", []).extend([[int(a)] if as_int else [float(a)] for a in v])
    out.setdefault(f"stats/{key}/count", []).extend([[int(n)] for n in lens])


def _write_data(tmp: Path, rng: np.random.Generator, ep_len: np.ndarray, ep_task: np.ndarray, fps: int) -> dict:
    """data/ files (one row group per episode, rotated at ~100 MB) and the per-episode metadata columns."""
    vs, va = len(STATE_NAMES), len(ACTION_NAMES)
    schema = pa.schema([("observation.state", pa.list_(pa.float32(), vs)), ("action", pa.list_(pa.float32(), va)),
                        ("timestamp", pa.float32()), ("frame_index", pa.int64()), ("episode_index", pa.int64()),
                        ("index", pa.int64()), ("task_index", pa.int64())])
    ep_from = np.concatenate([[0], np.cumsum(ep_len)[:-1]]).astype(np.int64)
    cols: dict[str, list] = {}
    writer = sink = None
    fidx, file_frames = -1, 0
    for e0 in range(0, len(ep_len), BLOCK):
        e1 = min(len(ep_len), e0 + BLOCK)
        lens = ep_len[e0:e1]
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        table, state, action = frame_rows(rng, e0, lens, int(ep_from[e0]), ep_task[e0:e1], fps, vs, va, schema)
        for s, ln in zip(starts.tolist(), lens.tolist()):
            # lerobot's rotation test, before each episode: file bytes + average bytes/frame x new frames >= limit
            if writer is None or sink.tell() + sink.tell() / file_frames * ln >= DATA_FILE_MB * MIB:
                if writer is not None:
                    writer.close()
                    sink.close()
                fidx, file_frames = fidx + 1, 0
                path = tmp / f"data/chunk-{fidx // 1000:03d}/file-{fidx % 1000:03d}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                sink = pa.OSFile(str(path), "wb")
                writer = pq.ParquetWriter(sink, schema, compression="snappy")
            writer.write_table(table.slice(s, ln))  # the recorder's write_table per episode: one row group each
            file_frames += ln
            cols.setdefault("data/chunk_index", []).append(fidx // 1000)
            cols.setdefault("data/file_index", []).append(fidx % 1000)
        _vector_stats(state, starts, lens, cols, "observation.state")
        _vector_stats(action, starts, lens, cols, "action")
    writer.close()
    sink.close()
    zeros = np.zeros(len(ep_len))
    _index_stats(zeros, ep_len, 1 / fps, cols, "timestamp", integer=False)
    _index_stats(zeros, ep_len, 1, cols, "frame_index", integer=True)
    _index_stats(np.arange(len(ep_len)), ep_len, 0, cols, "episode_index", integer=True)
    _index_stats(ep_from, ep_len, 1, cols, "index", integer=True)
    _index_stats(ep_task, ep_len, 0, cols, "task_index", integer=True)
    return cols


def _aggregate(cols: dict, key: str) -> dict:
    """Dataset-level stats of ``key`` from its per-episode ones, as lerobot 0.4's ``aggregate_feature_stats``:
    weighted mean, pooled variance, global min/max, count-weighted mean of the quantiles."""
    get = lambda s: np.asarray(cols[f"stats/{key}/{s}"], dtype=np.float64)  # noqa: E731
    count = get("count")
    w = count.reshape(count.shape + (1,) * (get("mean").ndim - count.ndim))
    total = count.sum()
    mean = (get("mean") * w).sum(0) / total
    var = ((get("std") ** 2 + (get("mean") - mean) ** 2) * w).sum(0) / total
    out = {"min": get("min").min(0), "max": get("max").max(0), "mean": mean, "std": np.sqrt(var),
           "count": [int(total)]}
    out.update({k: (get(k) * w).sum(0) / total for k in QUANTILES})
    integer = isinstance(cols[f"stats/{key}/min"][0][0], int)
    return {k: (v.astype(np.int64) if integer and k in ("min", "max") else v).tolist() if isinstance(v, np.ndarray)
            else v for k, v in out.items()}


def _info(episodes: int, frames: int, cameras: list[str], height: int, width: int, fps: int,
          video_file_mb: int) -> dict:
    scalar = lambda dt: {"dtype": dt, "shape": [1], "names": None}  # noqa: E731
    video_info = {
        "video.height": height, "video.width": width, "video.codec": "h264", "video.pix_fmt": "yuv420p",
        "video.fps": fps, "video.channels": 3, "has_audio": False,
        # the encoder keys lerobot 0.6 writes; crf/g are lerobot's defaults, bf=0 (no B-frames) makes the cuts exact
        "video.g": 2, "video.crf": 30, "video.preset": None, "video.fast_decode": 0, "video.video_backend": "pyav",
        "video.extra_options": {"bf": 0}, "is_depth_map": False,
        "video.is_depth_map": False,  # what lerobot 0.4 (the benchmarks' peer) writes instead of is_depth_map
    }
    features = {
        "observation.state": {"dtype": "float32", "shape": [len(STATE_NAMES)], "names": STATE_NAMES},
        "action": {"dtype": "float32", "shape": [len(ACTION_NAMES)], "names": ACTION_NAMES},
        **{cam: {"dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"],
                 "info": dict(video_info)} for cam in cameras},
        "timestamp": scalar("float32"), "frame_index": scalar("int64"), "episode_index": scalar("int64"),
        "index": scalar("int64"), "task_index": scalar("int64"),
    }
    return {
        "codebase_version": "v3.0", "robot_type": "franka", "total_episodes": episodes, "total_frames": frames,
        "total_tasks": len(TASKS), "chunks_size": 1000, "data_files_size_in_mb": DATA_FILE_MB,
        "video_files_size_in_mb": video_file_mb, "fps": fps, "splits": {"train": f"0:{episodes}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": features,
    }


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- generation ---------------------------------------------------------------------------------------------------
def generate_video_set(root: Path, episodes: int, cameras: int = 3, height: int = 180, width: int = 320,
                       fps: int = 15, video_file_mb: int = 200, seed: int = 0, n_clips: int = 24, *,
                       lengths: tuple[int, int] = LENGTHS, workers: int = 2, force: bool = False) -> dict:
    """Write the dataset at ``root`` (see the module docstring) and return a summary: episodes, frames, files,
    bytes, seconds. Skipped when ``root/generator.json`` holds the same arguments: the summary of what is there,
    with ``reused`` True.

    ``lengths``: (shortest, longest) episode in frames. ``workers``: processes encoding clips and writing mp4s
    (0: all in this process). Written into ``root``.tmp first, then renamed, so a root is never half written.
    """
    root = Path(root)
    if not 1 <= cameras <= len(CAMERAS):
        raise ValueError(f"cameras must be 1..{len(CAMERAS)}, got {cameras}")
    if height % 2 or width % 2:
        raise ValueError(f"yuv420p needs an even size, got {height}x{width}")
    args = {"episodes": episodes, "cameras": cameras, "height": height, "width": width, "fps": fps,
            "video_file_mb": video_file_mb, "seed": seed, "n_clips": n_clips, "lengths": list(lengths),
            "clip_cam": CLIP_CAM, "clip_stride": CLIP_STRIDE}
    marker = root / "generator.json"
    if not force and marker.exists() and json.loads(marker.read_text())["args"] == args:
        return {**json.loads(marker.read_text())["summary"], "reused": True}
    t0 = time.perf_counter()
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "meta").mkdir(parents=True)
    cams = list(CAMERAS[:cameras])
    rng, ep_len, ep_task = _plan(episodes, seed, lengths)
    clip_dir = tmp / "clips"
    clip_dir.mkdir()
    clip_paths = [clip_dir / f"clip-{c:03d}.mp4" for c in range(n_clips)]
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold library threads
    pool = ProcessPoolExecutor(workers, mp_context=ctx) if workers else None
    submit = pool.submit if pool else _Inline
    try:
        n_max = int(ep_len.max())
        jobs = [submit(_encode_clip, p, c, n_max, height, width, fps) for c, p in enumerate(clip_paths)]
        clip_stats = [j.result() for j in jobs]
        extradata, sizes = set(), []
        for p in clip_paths:
            with av.open(str(p)) as inp:
                extradata.add(bytes(inp.streams.video[0].codec_context.extradata))
                sizes.append(np.array([pk.size for pk in inp.demux(inp.streams.video[0]) if pk.size]))
        if len(extradata) != 1:  # the stream copy writes one SPS/PPS per file: every clip must share it
            raise RuntimeError("the clips were encoded with different SPS/PPS; they cannot share one mp4")
        vcols, vfiles = _layout(cams, ep_len, n_clips, sizes, fps, video_file_mb)
        jobs = [submit(_write_video, tmp / f"videos/{cam}/chunk-{f // 1000:03d}/file-{f % 1000:03d}.mp4",
                       clip_paths, segs, fps) for cam, f, segs in vfiles]
        cols = _write_data(tmp, rng, ep_len, ep_task, fps)  # in this process while the workers write the mp4s
        written = sum(j.result() for j in jobs)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    assert written == cameras * int(ep_len.sum()), (written, ep_len.sum())
    shutil.rmtree(clip_dir)
    for ci, cam in enumerate(cams):
        rows = np.array(vcols[cam], dtype=np.float64)
        cols[f"videos/{cam}/chunk_index"] = rows[:, 0].astype(np.int64).tolist()
        cols[f"videos/{cam}/file_index"] = rows[:, 1].astype(np.int64).tolist()
        cols[f"videos/{cam}/from_timestamp"] = rows[:, 2].tolist()
        cols[f"videos/{cam}/to_timestamp"] = rows[:, 3].tolist()
        clips = [clip_stats[clip_of(e, ci, n_clips)] for e in range(episodes)]
        for stat in ("min", "max", "mean", "std", *QUANTILES):  # (3, 1, 1) per cell, as lerobot's image stats
            cols[f"stats/{cam}/{stat}"] = [[[[v]] for v in c[stat]] for c in clips]
        cols[f"stats/{cam}/count"] = [[_sample_count(int(n))] for n in ep_len]
    _write_meta(tmp, cols, ep_len, ep_task, cams)
    info = _info(episodes, int(ep_len.sum()), cams, height, width, fps, video_file_mb)
    (tmp / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    order = ["observation.state", "action", *cams, "timestamp", "frame_index", "episode_index", "index", "task_index"]
    (tmp / "meta" / "stats.json").write_text(json.dumps({k: _aggregate(cols, k) for k in order}, indent=4))
    summary = {"episodes": episodes, "frames": int(ep_len.sum()), "cameras": cameras,
               "mp4_files": len(list((tmp / "videos").rglob("*.mp4"))),
               "data_files": len(list((tmp / "data").rglob("*.parquet"))), "bytes": _du(tmp),
               "seconds": round(time.perf_counter() - t0, 1)}
    (tmp / "generator.json").write_text(json.dumps({"args": args, "summary": summary}, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, root)
    return summary


class _Inline:
    """``workers=0``: run the call now; ``.result()`` as a future's."""

    def __init__(self, fn, *args):
        self._value = fn(*args)

    def result(self):
        return self._value


def _write_meta(tmp: Path, cols: dict, ep_len: np.ndarray, ep_task: np.ndarray, cams: list[str]) -> None:
    """meta/episodes (columns in lerobot's order, files of META_EPISODES_PER_FILE rows) and meta/tasks.parquet."""
    episodes = len(ep_len)
    ep_from = np.concatenate([[0], np.cumsum(ep_len)[:-1]]).astype(np.int64)
    stats = [c for c in cols if c.startswith("stats/")]
    vid = [f"videos/{cam}/{c}" for cam in cams for c in ("chunk_index", "file_index", "from_timestamp",
                                                         "to_timestamp")]
    for mi in range(-(-episodes // META_EPISODES_PER_FILE)):
        e0, e1 = mi * META_EPISODES_PER_FILE, min(episodes, (mi + 1) * META_EPISODES_PER_FILE)
        table = pointer_columns(e0, e1, [TASKS[t] for t in ep_task[e0:e1]], ep_len, ep_from, cols)
        for c in vid:
            table[c] = pa.array(cols[c][e0:e1], pa.float64() if c.endswith("timestamp") else pa.int64())
        for c in stats:
            first = cols[c][0]
            leaf = pa.int64() if c.endswith("/count") or isinstance(first[0], int) else pa.float64()
            typ = pa.list_(pa.list_(pa.list_(leaf))) if isinstance(first[0], list) else pa.list_(leaf)
            table[c] = pa.array(cols[c][e0:e1], typ)
        write_episodes_file(tmp, mi, table)
    write_tasks(tmp, TASKS)


# ---- verification -------------------------------------------------------------------------------------------------
def verify(root: Path, items: int = 200, seed: int = 1) -> list[str]:
    """Open ``root`` with lerobot_sql and check ``items`` random items: the row is the frame the generator put at
    that position (episode_index, frame_index, timestamp) and each camera frame shows the code of (clip, frame).
    Returns the mismatches (empty: all good)."""
    import lerobot_sql as lsql

    args = json.loads((Path(root) / "generator.json").read_text())["args"]
    fc = _framecode()
    _, ep_len, _ = _plan(args["episodes"], args["seed"], tuple(args["lengths"]))
    ep_from = np.concatenate([[0], np.cumsum(ep_len)[:-1]])
    cams = CAMERAS[:args["cameras"]]
    ds = lsql.connect(root).dataset(return_uint8=True)
    bad = []
    if len(ds) != int(ep_len.sum()):
        bad.append(f"len(ds) = {len(ds)}, generated {int(ep_len.sum())} frames")
    for i in np.random.default_rng(seed).integers(0, len(ds), items).tolist():
        item = ds[i]
        ep = int(np.searchsorted(ep_from, i, side="right") - 1)
        f = i - int(ep_from[ep])
        got = (int(item["index"]), int(item["episode_index"]), int(item["frame_index"]), float(item["timestamp"]))
        want = (i, ep, f, float(np.float32(f / args["fps"])))
        if got != want:
            bad.append(f"item {i}: (index, episode_index, frame_index, timestamp) = {got}, expected {want}")
        for ci, cam in enumerate(cams):
            clip = clip_of(ep, ci, args["n_clips"])
            r = fc.verify_frame(item[cam].numpy(), clip, f, args["clip_cam"])
            if not r["ok"]:
                bad.append(f"item {i} {cam}: not frame {f} of clip {clip} ({r})")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write the dataset")
    g.add_argument("--episodes", type=int, required=True)
    g.add_argument("--root", type=Path, help="default: $LSQL_SCALE_ROOT or $LSQL_BENCH_DATA/scale_video, /<episodes>")
    g.add_argument("--cameras", type=int, default=3)
    g.add_argument("--size", default="180x320", help="HEIGHTxWIDTH")
    g.add_argument("--fps", type=int, default=15)
    g.add_argument("--video-file-mb", type=int, default=200)
    g.add_argument("--clips", type=int, default=24)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    g.add_argument("--force", action="store_true", help="rewrite even when the root holds the same arguments")
    v = sub.add_parser("verify", help="read random items with lerobot_sql and check every frame's code")
    v.add_argument("--root", type=Path, required=True)
    v.add_argument("--items", type=int, default=200)
    a = ap.parse_args(argv)
    if a.cmd == "generate":
        height, width = (int(x) for x in a.size.lower().split("x"))
        root = a.root or DEFAULT_PARENT / f"{a.episodes}"
        s = generate_video_set(root, a.episodes, a.cameras, height, width, a.fps, a.video_file_mb, a.seed, a.clips,
                               workers=a.workers, force=a.force)
        print(f"{root}: {s['episodes']:,} episodes, {s['frames']:,} frames x {s['cameras']} cameras, "
              f"{s['mp4_files']} mp4s, {s['data_files']} data files, {s['bytes'] / 1e9:.2f} GB, "
              f"{'already there, ' if s.get('reused') else ''}written in {s['seconds']:.0f} s")
        return 0
    t0 = time.perf_counter()
    bad = verify(a.root, a.items)
    for line in bad[:20]:
        print(line)
    print(f"{a.root}: {a.items} items checked in {time.perf_counter() - t0:.1f} s, {len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
