"""Generated stand-ins for the real-data sets of the external corpus, built at test time from the shipped small20.

Each real set (tests/README.md, second tier) is the only check of some behaviour; the first tier must check the same
behaviour without the corpus. Each builder writes a copy of small20 (or part of it) changed the way that real set
differs from lerobot's writer, with pyarrow and PyAV only, into a folder the caller owns:

* ``g1_like``: g1_real_v30's shape. A list<float> data file with pandas (not huggingface) schema metadata, in one
  row group; meta/episodes without quantile stats; the converter's ``"fps"`` on every non-video feature; and two
  cameras at **two resolutions**, each in **two files**. front stays 96x128: small20's bitstream cut by stream copy
  at an episode boundary. wrist is 480x640 (g1's size): small20's wrist frames scaled up 5x, encoded one mp4 per
  episode (as lerobot 0.3.3 did), then joined by stream copy as lerobot's v2.1->v3.0 converter joins them (so a
  keyframe gap of 1 at each join and ``from_timestamp`` accumulating over the file). The per-episode mp4s are kept
  outside the dataset as the decode truth, as shared/tools/check_converted_frames.py used them for g1.
* ``record_like``: record-test's shape. Both mp4s missing while info.json still declares the cameras, ``action``
  first in the data file, four row groups, a ``string`` (pandas 2) task index.
* ``meta_only``: oc_models_meta_only's shape. ``meta/`` only, meta/episodes without HF schema metadata in several
  row groups, a ``string`` task index.
* ``prerelease_json_only``: aloha_sim_transfer_cube_human_prerelease_meta_only's shape. Only meta/info.json and
  meta/stats.json, in the pre-release v3.0 schema (float fps, files_size_in_mb, video_info, no total_videos, a
  ``next.done`` feature).
* ``nested_names_v21``: g1_real_v21's nested-list ``names`` (``[[...]]``) on a copy of v21_small20.
"""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FRONT = "observation.images.front"
WRIST = "observation.images.wrist"
DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
TASKS = "meta/tasks.parquet"
FPS = 30
TIME_BASE = Fraction(1, 15360)   # small20's (and lerobot's AV1 writer's): one frame is 512 ticks
STEP = 512


def video_rel(key: str, file_index: int) -> str:
    return f"videos/{key}/chunk-000/file-{file_index:03d}.mp4"


def _writable_copy(src: Path, dst: Path, ignore=None) -> Path:
    shutil.copytree(src, dst, ignore=ignore)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _edit_info(root: Path, fn) -> None:
    p = root / "meta" / "info.json"
    info = json.loads(p.read_text())
    fn(info)
    p.write_text(json.dumps(info, indent=4))


def _string_task_index(root: Path) -> None:
    """The task text in a ``string`` pandas index column, as pandas 2 writes it (small20's is ``large_string``)."""
    t = pq.read_table(root / TASKS)
    i = t.schema.get_field_index("__index_level_0__")
    t = t.set_column(i, "__index_level_0__", t["__index_level_0__"].cast(pa.string()))
    pq.write_table(t, root / TASKS)


def remux(parts: list[tuple[Path, int, int, int]], out: Path) -> None:
    """Stream copy (no re-encode) into ``out``: for each ``(src, lo, hi, shift)`` the packets of src whose pts lies in
    [lo, hi), in decode order, with pts/dts moved by ``shift`` ticks. The first source's stream is the template."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(parts[0][0])) as first, av.open(str(out), "w", format="mp4") as dst:
        ost = dst.add_stream_from_template(first.streams.video[0], opaque=True)
        # PyAV 15 gives the template stream another time base and muxes the copied ticks unscaled; set it.
        ost.time_base = TIME_BASE
        for src, lo, hi, shift in parts:
            with av.open(str(src)) as c:
                ist = c.streams.video[0]
                assert ist.time_base == TIME_BASE, (src, ist.time_base)
                for pkt in c.demux(ist):
                    if pkt.pts is None or not lo <= pkt.pts < hi:
                        continue
                    pkt.pts += shift
                    pkt.dts = (pkt.dts if pkt.dts is not None else pkt.pts - shift) + shift
                    pkt.stream = ost
                    dst.mux(pkt)


def encode(frames, out: Path, *, codec: str = "libsvtav1") -> None:
    """Encode RGB uint8 frames (H, W, 3) at 30 fps, GOP 2, yuv420p, time base 1/15360: lerobot's AV1 settings."""
    out.parent.mkdir(parents=True, exist_ok=True)
    frames = list(frames)
    h, w = frames[0].shape[:2]
    # crf 20 (lerobot: 30) keeps the codeword blocks readable at 480x640 in every frame; preset 10 is fast.
    opts = {"g": "2", "crf": "20", "preset": "10"} if codec == "libsvtav1" else {"g": "2"}
    from lerobot_sql.export.video_writer import keep_scheduling

    # (libsvtav1 leaves the calling thread SCHED_FIFO 99 as root: see keep_scheduling)
    with keep_scheduling(), av.open(str(out), "w", format="mp4") as c:
        s = c.add_stream(codec, rate=FPS, options=opts)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.codec_context.time_base = TIME_BASE
        for i, img in enumerate(frames):
            fr = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            fr.pts, fr.time_base = i * STEP, TIME_BASE
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def decode_all(path: Path) -> list[np.ndarray]:
    """Every frame of an mp4, one sequential PyAV pass, (H, W, 3) uint8 rgb24: the truth a reader must equal."""
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


SPLIT = {FRONT: 1, WRIST: 2}   # the first episode of file-001, per camera: the cameras roll over at different episodes


def g1_like(small20: Path, dst: Path, episodes: int = 4, scale: int = 5) -> dict:
    """Build the g1_real_v30 stand-in at ``dst`` from small20's first ``episodes`` episodes (see the module doc).

    Per camera, episodes before ``SPLIT[camera]`` are in its file-000, the rest in file-001. Episode 2 has an odd
    length (277), so the wrist join 2|3 puts two keyframes 1 frame apart, as g1's joins do. Returns ``{"per_episode":
    {ep: per-episode wrist mp4 (outside dst)}, "lengths": [...], "wrist_hw": (H, W)}``.
    """
    dst = _writable_copy(small20, dst, ignore=shutil.ignore_patterns("videos"))
    work = dst.parent / f"{dst.name}_sources"
    work.mkdir()
    ep_t = pq.read_table(small20 / EPISODES)
    lengths = ep_t["length"].to_pylist()[:episodes]
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int).tolist()   # frame offsets in small20's files
    n_frames = starts[-1]

    # -- data: one row group, list<float> (not fixed_size_list), pandas schema metadata (g1's converter output)
    data = pq.read_table(small20 / DATA)
    data = data.filter(pc.less(data["episode_index"], episodes))
    cols = [data[c].cast(pa.list_(pa.float32())) if pa.types.is_fixed_size_list(data[c].type) else data[c]
            for c in data.column_names]
    data = pa.table(dict(zip(data.column_names, cols)))
    pandas_meta = pa.Table.from_pandas(data.to_pandas(), preserve_index=False).schema.metadata
    pq.write_table(data.replace_schema_metadata(pandas_meta), dst / DATA, row_group_size=1 << 20)

    # -- videos. front: small20's own bitstream, cut at an episode start (a keyframe) into two files.
    src_front = small20 / video_rel(FRONT, 0)
    cut = starts[SPLIT[FRONT]] * STEP
    remux([(src_front, 0, cut, 0)], dst / video_rel(FRONT, 0))
    remux([(src_front, cut, n_frames * STEP, -cut)], dst / video_rel(FRONT, 1))
    # wrist: small20's frames scaled up (nearest, so the codeword blocks stay blocks), one mp4 per episode, joined.
    wrist = decode_all(small20 / video_rel(WRIST, 0))
    per_episode = {}
    for e in range(episodes):
        big = (np.repeat(np.repeat(f, scale, axis=0), scale, axis=1) for f in wrist[starts[e]:starts[e + 1]])
        per_episode[e] = work / f"wrist_episode_{e:06d}.mp4"
        encode(big, per_episode[e])
    for file_index, eps in ((0, range(SPLIT[WRIST])), (1, range(SPLIT[WRIST], episodes))):
        parts, offset = [], 0
        for e in eps:
            parts.append((per_episode[e], 0, lengths[e] * STEP, offset))
            offset += lengths[e] * STEP
        remux(parts, dst / video_rel(WRIST, file_index))

    # -- meta/episodes: the kept episodes, no quantile stats, the new video pointers
    keep = [c for c in ep_t.column_names if not any(c.endswith(f"/q{q:02d}") for q in (1, 10, 50, 90, 99))]
    ep_t = ep_t.select(keep).slice(0, episodes)
    for key in (FRONT, WRIST):
        file_of = [0 if e < SPLIT[key] else 1 for e in range(episodes)]
        t_from = [(starts[e] - starts[0 if e < SPLIT[key] else SPLIT[key]]) / FPS for e in range(episodes)]
        t_to = [t + n / FPS for t, n in zip(t_from, lengths)]
        for col, values in ((f"videos/{key}/chunk_index", [0] * episodes), (f"videos/{key}/file_index", file_of),
                            (f"videos/{key}/from_timestamp", t_from), (f"videos/{key}/to_timestamp", t_to)):
            i = ep_t.schema.get_field_index(col)
            ep_t = ep_t.set_column(i, col, pa.array(values, ep_t.schema.field(i).type))
    pq.write_table(ep_t, dst / EPISODES)

    h, w = wrist[0].shape[0] * scale, wrist[0].shape[1] * scale

    def info_fn(info):
        info.update(total_episodes=episodes, total_frames=n_frames, splits={"train": f"0:{episodes}"})
        info["features"][WRIST]["shape"] = [h, w, 3]
        info["features"][WRIST]["info"].update({"video.height": h, "video.width": w})
        for feat in info["features"].values():   # lerobot's v2.1->v3.0 converter adds these
            if feat["dtype"] != "video":
                feat["fps"] = FPS

    _edit_info(dst, info_fn)
    return {"per_episode": per_episode, "lengths": lengths, "wrist_hw": (h, w)}


def record_like(small20: Path, dst: Path) -> Path:
    """The record-test stand-in: small20 without its mp4s, ``action`` first, 4 row groups, a ``string`` task index."""
    dst = _writable_copy(small20, dst, ignore=shutil.ignore_patterns("videos"))
    data = pq.read_table(small20 / DATA)
    order = ["action"] + [c for c in data.column_names if c != "action"]
    pq.write_table(data.select(order), dst / DATA, row_group_size=-(-data.num_rows // 4))
    _string_task_index(dst)
    return dst


def meta_only(small20: Path, dst: Path) -> Path:
    """The oc_models_meta_only stand-in: ``meta/`` only; meta/episodes without schema metadata, in row groups of 4."""
    _writable_copy(small20 / "meta", dst / "meta")
    ep = pq.read_table(small20 / EPISODES)
    pq.write_table(ep.replace_schema_metadata(None), dst / EPISODES, row_group_size=4)
    _string_task_index(dst)
    return dst


def prerelease_json_only(small20: Path, dst: Path) -> Path:
    """The aloha pre-release stand-in: meta/info.json (pre-release v3.0 schema) and meta/stats.json only."""
    (dst / "meta").mkdir(parents=True)
    shutil.copyfile(small20 / "meta" / "stats.json", dst / "meta" / "stats.json")
    info = json.loads((small20 / "meta" / "info.json").read_text())
    info["fps"] = float(info["fps"])
    size = float(info.pop("data_files_size_in_mb"))
    info.pop("video_files_size_in_mb")
    info["files_size_in_mb"] = size
    info.pop("total_videos", None)
    for feat in info["features"].values():
        if feat["dtype"] == "video":
            vi = feat.pop("info")
            vi["video.fps"] = float(vi["video.fps"])
            feat["video_info"] = vi
    info["features"]["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    (dst / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    return dst


def nested_names_v21(v21_small20: Path, dst: Path) -> Path:
    """The g1_real_v21 quirk on v21_small20: ``names`` of state and action as a nested list ``[[...]]``."""
    dst = _writable_copy(v21_small20, dst)

    def fn(info):
        for k in ("observation.state", "action"):
            info["features"][k]["names"] = [info["features"][k]["names"]]

    _edit_info(dst, fn)
    return dst
