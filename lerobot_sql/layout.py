"""The dataset's layout as meta/info.json describes it: format version, fps, features, path templates, file lists.

Knows nothing of DuckDB or torch. v3.x is read natively; v2.x is recognised and refused with a clear message.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from .errors import DatasetFormatError, MissingFileError, UnsupportedVersionError
from .source import Source

DEFAULT_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
EPISODES_GLOB = "meta/episodes/*/*.parquet"
DEFAULT_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


@dataclasses.dataclass(frozen=True)
class Feature:
    """One entry of info.json's ``features``.

    Attributes:
        name: the feature key exactly as lerobot writes it (``observation.state``).
        dtype: numpy dtype name, or ``video``, ``image``, ``string``, ``language``.
        shape: as in info.json; cameras are (height, width, channels).
        names: as in info.json: None, a list, a nested list or a dict.
        info: the video ``info`` block (``video.codec``, ``video.fps`` ...) or {}.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    names: Any
    info: dict

    @property
    def is_video(self) -> bool:
        return self.dtype == "video"

    @property
    def is_image(self) -> bool:
        return self.dtype == "image"

    @property
    def is_camera(self) -> bool:
        return self.dtype in ("video", "image")

    @property
    def flat_names(self) -> list[str] | None:
        """One name per vector element, from a list, a nested list or a one-key dict; None if absent or mismatched."""
        n = self.names
        if isinstance(n, dict) and len(n) == 1:
            n = next(iter(n.values()))
        while isinstance(n, list) and len(n) == 1 and isinstance(n[0], list):
            n = n[0]
        if isinstance(n, list) and all(isinstance(x, str) for x in n) and len(n) == _prod(self.shape):
            return list(n)
        return None


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


@dataclasses.dataclass(frozen=True)
class Layout:
    """What info.json says, plus the files found under the root.

    Attributes:
        version: ``codebase_version`` as written (``v3.0``).
        fps: frames per second of the dataset (float; int in lerobot-written data).
        features: name -> Feature, in info.json order.
        data_path, video_path: ``str.format`` templates relative to the root.
        info: the raw info.json dict.
        episode_files, data_files: relative paths, sorted.
    """

    version: str
    fps: float
    features: dict[str, Feature]
    data_path: str
    video_path: str | None
    info: dict
    episode_files: tuple[str, ...]
    data_files: tuple[str, ...]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_video]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_image]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_camera]

    def video_file(self, video_key: str, chunk_index: int, file_index: int) -> str:
        tmpl = self.video_path or DEFAULT_VIDEO_PATH
        return tmpl.format(video_key=video_key, chunk_index=int(chunk_index), file_index=int(file_index))


def parse_version(v: Any) -> tuple[int, int]:
    m = re.fullmatch(r"v?(\d+)(?:\.(\d+))?.*", str(v))
    if not m:
        raise ValueError(v)
    return int(m.group(1)), int(m.group(2) or 0)


def _parse_features(raw: Any, where: str) -> dict[str, Feature]:
    if not isinstance(raw, dict) or not raw:
        raise DatasetFormatError(f"{where}: 'features' is missing or empty; a LeRobot info.json lists every feature")
    out = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict) or "dtype" not in spec:
            raise DatasetFormatError(f"{where}: feature {name!r} has no 'dtype'; each feature needs dtype and shape")
        info = spec.get("info") or spec.get("video_info") or {}
        shape = spec.get("shape") or [1]
        out[name] = Feature(name, str(spec["dtype"]), tuple(int(s) for s in shape), spec.get("names"), dict(info))
    return out


def load_layout(src: Source) -> Layout:
    """Read meta/info.json and list the metadata and data files (no Parquet is opened).

    Raises:
        MissingFileError: meta/info.json does not exist under the root.
        DatasetFormatError: info.json is not valid JSON or lacks fps/features.
        UnsupportedVersionError: codebase_version is not v3.x (v2.x support is tracked separately).
    """
    where = src.path("meta/info.json")
    if not src.exists("meta/info.json"):
        raise MissingFileError(
            f"{where}: not found. Is {src.url!r} the root of a LeRobot dataset (the folder holding meta/, data/, videos/)?"
        )
    try:
        with src.open("meta/info.json") as f:
            info = json.loads(f.read())
    except json.JSONDecodeError as e:
        raise DatasetFormatError(f"{where}: invalid JSON ({e}); restore the file from the dataset's source") from e
    if not isinstance(info, dict):
        raise DatasetFormatError(f"{where}: expected a JSON object")
    version = str(info.get("codebase_version", ""))
    try:
        major, _minor = parse_version(version)
    except ValueError:
        raise DatasetFormatError(f"{where}: codebase_version {version!r} is not a version like 'v3.0'") from None
    if major != 3:
        hint = (
            "v2.x datasets are not read yet; convert with "
            "`python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id=NAME --root=PARENT --push-to-hub=false`"
            if major == 2
            else "this reader handles LeRobot format v3.x"
        )
        raise UnsupportedVersionError(f"{where}: codebase_version {version!r} is not supported: {hint}")
    fps = info.get("fps")
    if not isinstance(fps, (int, float)) or fps <= 0:
        raise DatasetFormatError(f"{where}: 'fps' must be a positive number, found {fps!r}")
    features = _parse_features(info.get("features"), where)
    episode_files = tuple(src.glob(EPISODES_GLOB))
    if not episode_files:
        raise MissingFileError(f"{src.path('meta/episodes')}: no episode metadata files ({EPISODES_GLOB}) found")
    data_files = tuple(src.glob("data/*/*.parquet"))
    if not data_files:
        raise MissingFileError(f"{src.path('data')}: no data files (data/*/*.parquet) found")
    return Layout(
        version=version,
        fps=float(fps),
        features=features,
        data_path=info.get("data_path") or DEFAULT_DATA_PATH,
        video_path=info.get("video_path") or (DEFAULT_VIDEO_PATH if any(f.is_video for f in features.values()) else None),
        info=info,
        episode_files=episode_files,
        data_files=data_files,
    )
