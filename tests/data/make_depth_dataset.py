#!/usr/bin/env python
"""Write ``sample/depth4`` with lerobot 0.6.1's own writer, then dump lerobot 0.6.1's items of it as references.

    PEER06/bin/python tests/data/make_depth_dataset.py --root sample/depth4 --ref tests/data/reference/depth4

Run it in a venv with lerobot 0.6.1 (PEER06: the corpus folder's ``tools/install_peer_06.sh`` makes one; Python
>= 3.12); ``$LSQL_SHARED/tools`` must hold ``dump_reference.py``. Everything on disk is
lerobot's: ``LeRobotDataset.create`` -> ``add_frame`` -> ``save_episode`` -> ``finalize`` with lerobot's default
encoders (RGB: libsvtav1 yuv420p; depth: ``DepthEncoderConfig()``, HEVC ``gray12le`` with ``x265-params
lossless=1`` and log quantization ``depth_min=0.01``, ``depth_max=10``, ``shift=3.5`` m). Only the content is ours,
deterministic per (episode, frame):

* ``observation.state`` / ``action``: ``framecode.expected_state`` / ``expected_action`` (float32[6]);
* ``observation.images.front`` (video, 48x64 RGB): ``framecode.make_image(ep, f, 1)``;
* ``observation.images.depth`` (video, 48x64x1, depth map): uint16 millimetres (``depth_unit`` "mm"), see
  :func:`depth_mm`, quantized by lerobot to 12-bit codes;
* ``observation.images.depth_png`` (image in Parquet, 24x32x1, depth map): uint16 mm, stored by lerobot as a
  16-bit TIFF (``depth_unit`` "mm");
* ``observation.images.depth_m`` (image in Parquet, 24x32x1, depth map): float32 metres, stored as a float TIFF
  (``depth_unit`` "m": lerobot converts it to the output unit on read).

The references (``<ref>.npz`` / ``<ref>.json``, the layout of ``shared/tools/dump_reference.py``: npz keys
``"<mode>/<index>/<key>"``) hold what ``LeRobotDataset(root, ...)`` returned for every listed index in four modes:
``plain``; ``uint8`` (``return_uint8=True``: lerobot 0.6's lerobot-train always passes it); ``delta``
(``delta_timestamps`` state ``[-2,-1,0]/fps``, action ``[0..9]/fps``, every camera, depth ones included,
``[-1,0]/fps``); ``metres`` (``depth_output_unit="m"``). RGB float frames are stored as uint8 = round(x*255)
(lossless, checked), everything else (depth maps included) as lerobot returned it, bit for bit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("SVT_LOG", "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import framecode  # noqa: E402

FPS = 30
LENGTHS = [24, 20, 28]  # three episodes, 72 frames
TASKS = ["pick the cube", "place the cube"]
H, W = 48, 64      # RGB and depth video
HI, WI = 24, 32    # depth images in Parquet
FRONT, DEPTH, DEPTH_PNG, DEPTH_M = ("observation.images.front", "observation.images.depth",
                                    "observation.images.depth_png", "observation.images.depth_m")


def depth_mm(ep: int, f: int, h: int, w: int) -> np.ndarray:
    """A synthetic depth map in uint16 mm: a tilted plane (0.2 .. ~8 m) with a moving box nearer the camera and a
    few zero (invalid) pixels, so the log quantizer's clip at depth_min and its whole range are exercised."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    plane = 200.0 + 7800.0 * (yy / (h - 1)) * 0.6 + 7800.0 * (xx / (w - 1)) * 0.4
    plane = plane * (1.0 + 0.02 * ep) + 5.0 * f
    y0, x0 = (3 * f + 5 * ep) % (h - 8), (5 * f + 7 * ep) % (w - 10)
    plane[y0:y0 + 8, x0:x0 + 10] = 350.0 + 11.0 * f + 100.0 * ep
    plane[0, : 1 + (f % 4)] = 0.0
    return np.clip(np.rint(plane), 0, 65535).astype(np.uint16)


def frame_of(ep: int, f: int, task: str) -> dict:
    return {
        "observation.state": framecode.expected_state(ep, f),
        "action": framecode.expected_action(ep, f),
        FRONT: framecode.make_image(ep, f, 1, H, W),
        DEPTH: depth_mm(ep, f, H, W)[:, :, None],
        DEPTH_PNG: depth_mm(ep, f + 100, HI, WI)[:, :, None],
        DEPTH_M: (depth_mm(ep, f + 200, HI, WI).astype(np.float32) / np.float32(1000.0))[:, :, None],
        "task": task,
    }


def make(root: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    joints = framecode.JOINTS
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": joints},
        "action": {"dtype": "float32", "shape": (6,), "names": joints},
        FRONT: {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
        DEPTH: {"dtype": "video", "shape": (H, W, 1), "names": ["height", "width", "channels"],
                "info": {"is_depth_map": True}},
        DEPTH_PNG: {"dtype": "image", "shape": (HI, WI, 1), "names": ["height", "width", "channels"],
                    "info": {"is_depth_map": True}},
        DEPTH_M: {"dtype": "image", "shape": (HI, WI, 1), "names": ["height", "width", "channels"],
                  "info": {"is_depth_map": True}},
    }
    if root.exists():
        shutil.rmtree(root)
    ds = LeRobotDataset.create("lerobot_sql/depth4", fps=FPS, features=features, root=root,
                               robot_type="so101_follower", use_videos=True)
    for ep, n in enumerate(LENGTHS):
        for f in range(n):
            task = TASKS[1] if (ep == 1 and f >= n // 2) else TASKS[ep % 2]
            ds.add_frame(frame_of(ep, f, task))
        ds.save_episode()
    ds.finalize()


def pick(ds) -> list[tuple[int, str]]:
    eps = ds.meta.episodes
    start, end = list(eps["dataset_from_index"]), list(eps["dataset_to_index"])
    chosen: dict[int, str] = {}
    for e, (a, b) in enumerate(zip(start, end)):
        chosen.setdefault(int(a), f"first frame of episode {e}")
        chosen.setdefault(int(a) + 1, f"frame 1 of episode {e} (partial padding)")
        chosen.setdefault(int(b) - 1, f"last frame of episode {e}")
    rng = np.random.default_rng(0)
    while len(chosen) < 14:
        chosen.setdefault(int(rng.integers(0, ds.meta.total_frames)), "random")
    return sorted(chosen.items())


def to_u8_exact(x: np.ndarray) -> np.ndarray:
    u = np.clip(np.rint(x.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
    back = u.astype(np.float32) / np.float32(255.0)
    if not np.array_equal(back.view(np.uint32), x.astype(np.float32).view(np.uint32)):
        raise SystemExit("an RGB frame is not float32(round(x*255))/255: the uint8 form would be lossy")
    return u


def dump(root: Path, ref: Path) -> None:
    import importlib.metadata as md

    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    base = LeRobotDataset("lerobot_sql/depth4", root=root)
    fps = base.meta.fps
    delta = {"observation.state": [-2 / fps, -1 / fps, 0.0], "action": [k / fps for k in range(10)],
             **{cam: [-1 / fps, 0.0] for cam in base.meta.camera_keys}}
    modes = {
        "plain": base,
        "uint8": LeRobotDataset("lerobot_sql/depth4", root=root, return_uint8=True),
        "delta": LeRobotDataset("lerobot_sql/depth4", root=root, delta_timestamps=delta),
        "metres": LeRobotDataset("lerobot_sql/depth4", root=root, depth_output_unit="m"),
    }
    depth_keys = list(base.meta.depth_keys)
    arrays: dict[str, np.ndarray] = {}
    items = []
    for idx, why in pick(base):
        rec = {"index": idx, "why": why}
        for mode, ds in modes.items():
            item = ds[idx]
            out = {"scalars": {}, "keys": {}, "is_pad": {}}
            for key, val in item.items():
                if isinstance(val, str):
                    out["scalars"][key] = val
                    continue
                a = val.detach().cpu().numpy()
                npz = f"{mode}/{idx}/{key}"
                meta = {"shape": list(a.shape), "dtype": str(a.dtype), "npz": npz}
                if key in ds.meta.camera_keys and key not in depth_keys and a.dtype == np.float32:
                    arrays[npz] = to_u8_exact(a)
                    meta["stored_dtype"] = "uint8"
                else:
                    arrays[npz] = a
                out["keys"][key] = meta
                if key.endswith("_is_pad"):
                    out["is_pad"][key] = [bool(b) for b in a.reshape(-1)]
                elif a.ndim == 0:
                    out["scalars"][key] = a.item()
            rec[mode] = out
        items.append(rec)
    stats = {mode: {k: {s: np.asarray(v).tolist() for s, v in ds.meta.stats[k].items()} for k in depth_keys}
             for mode, ds in (("plain", base), ("metres", modes["metres"]))}
    doc = {
        "dataset": root.name,
        "generated_by": "tests/data/make_depth_dataset.py",
        "lerobot_version": md.version("lerobot"),
        "versions": {p: md.version(p) for p in ("torch", "av", "numpy", "datasets", "pyarrow", "pillow")},
        "video_backend": base._video_backend,
        "fps": fps,
        "camera_keys": list(base.meta.camera_keys),
        "depth_keys": depth_keys,
        "modes": {"plain": {}, "uint8": {"return_uint8": True}, "delta": {"delta_timestamps": delta},
                  "metres": {"depth_output_unit": "m"}},
        "indices": [r["index"] for r in items],
        "depth_stats": stats,
        "items": items,
    }
    shared = Path(os.environ.get("LSQL_SHARED", Path(__file__).resolve().parents[3] / "shared"))
    sys.path.insert(0, str(shared / "tools"))  # the corpus folder's dump_reference.py: lerobot's reference format
    from dump_reference import _compact_json, save_npz  # noqa: PLC0415

    ref.parent.mkdir(parents=True, exist_ok=True)
    save_npz(str(ref) + ".npz", arrays)
    Path(str(ref) + ".json").write_text(_compact_json(doc) + "\n")
    print(f"{len(items)} items x {len(modes)} modes, {len(arrays)} arrays; torch {torch.__version__}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--ref", required=True, type=Path, help="reference prefix: writes REF.npz and REF.json")
    p.add_argument("--dump-only", action="store_true", help="keep the dataset, only dump the references")
    a = p.parse_args()
    if not a.dump_only:
        make(a.root)
    dump(a.root, a.ref)


if __name__ == "__main__":
    main()
