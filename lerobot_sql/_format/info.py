"""meta/info.json: its model (:class:`Feature`, the path templates, the limits on its numbers) and its one
validation (:func:`check_info` -> :class:`CheckedInfo`), before any of its values is used.

What the dataset's files are, given a checked info.json, is :mod:`lerobot_sql._format.layout`'s (``load_layout``) and,
for roots that cannot list, :mod:`lerobot_sql._format.listing`'s; both read the :class:`CheckedInfo` made here.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from typing import Any

from .._query.sqltext import sql_key
from .._storage.source import confine
from ..errors import DatasetFormatError, UnsupportedVersionError, as_real
from . import depth

DEFAULT_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DEFAULT_DATA_MB, DEFAULT_VIDEO_MB = 100, 200  # lerobot 0.4.4 DEFAULT_DATA_FILE_SIZE_IN_MB / DEFAULT_VIDEO_...
# v2.x: one file per episode; episode_chunk = episode_index // chunks_size (episodes per chunk in v2).
V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
# dtypes a LeRobot feature may declare (lerobot's writers: numpy dtype names, plus the non-tensor kinds).
NUMERIC_DTYPES = frozenset({"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                            "uint32", "uint64", "bool"})
KNOWN_DTYPES = NUMERIC_DTYPES | {"video", "image", "string", "language"}
# lerobot 0.6's language columns (datasets/language.py: LANGUAGE_PERSISTENT, LANGUAGE_EVENTS), dtype "language": per
# frame, a list of {role, content, style, timestamp (persistent only, float32 s), camera, tool_calls (JSON list)}.
# The persistent column repeats its episode's slice on every frame; an event sits on the frame it fires at.
LANGUAGE_PERSISTENT, LANGUAGE_EVENTS = "language_persistent", "language_events"
# Bounds on info.json numbers: far beyond any real dataset, small enough that no count, shape or path built from
# them overflows int64 or allocates absurd memory. A 4K RGB camera is 2160*3840*3 = 2.5e7 elements.
MAX_FPS = 100_000.0
# One frame every 1000 s: a slower "recording" is no LeRobot dataset, and a tinier positive fps (1e-300) makes every
# time 1/fps seconds astronomically far (length / fps overflows to inf) while passing a bare `fps > 0`.
MIN_FPS = 1e-3
MAX_DIM = 1 << 20
MAX_ELEMENTS = 1 << 30
MAX_CHUNKS_SIZE = 1 << 31
# The placeholders each path template may use (what Layout.data_file / video_file and the catalog's SQL define).
DATA_FIELDS = frozenset({"chunk_index", "file_index", "episode_chunk", "episode_index"})
VIDEO_FIELDS_V3 = frozenset({"video_key", "chunk_index", "file_index"})
VIDEO_FIELDS_V2 = frozenset({"video_key", "episode_chunk", "episode_index", "chunk_index", "file_index"})
_INT_SPEC = re.compile(r"0?[1-9]?[0-9]?d")  # "", "d", "03d", "06d": what lerobot's templates use, width <= 99
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclasses.dataclass(frozen=True)
class Feature:
    """One entry of info.json's ``features``.

    Attributes:
        name: the feature key exactly as lerobot writes it (``observation.state``).
        dtype: numpy dtype name, or ``video``, ``image``, ``string``, ``language``.
        shape: as in info.json; cameras are (height, width, channels).
        names: as in info.json: None, a list, a nested list or a dict.
        info: the video ``info`` block (``video.codec``, ``video.fps`` ...) or {} (the legacy ``video_info`` block
            when there is no ``info``).
        own_info: the feature's ``info`` block alone ({} without one): where lerobot 0.6 reads a depth map's
            quantization and unit from.
        video_info: the legacy ``video_info`` block, or {}.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    names: Any
    info: dict
    own_info: dict = dataclasses.field(default_factory=dict, compare=False)
    video_info: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def is_video(self) -> bool:
        return self.dtype == "video"

    @property
    def is_depth_map(self) -> bool:
        """lerobot 0.6's depth flag (``LeRobotDatasetMetadata.depth_keys``): ``info.is_depth_map``, or the legacy
        ``info["video.is_depth_map"]`` or ``video_info["video.is_depth_map"]``."""
        return bool(self.info.get("is_depth_map") or self.info.get("video.is_depth_map")
                    or self.video_info.get("video.is_depth_map"))

    @property
    def depth_quantization(self) -> dict[str, Any]:
        """A depth video's quantizer as lerobot 0.6 reads it back (``DepthEncoderConfig.from_video_info(info)``):
        ``depth_min``, ``depth_max``, ``shift`` (metres) and ``use_log`` from ``info["video.<name>"]``, each
        missing or null one at lerobot's default (0.01, 10.0, 3.5, True).

        Raises:
            DatasetFormatError: a value is not a number (``use_log``: not a boolean), ``depth_max <= depth_min``, or
                ``use_log`` with ``depth_min + shift <= 0`` (the log of the range would not exist).
        """
        out: dict[str, Any] = dict(depth.DEFAULTS)
        for k in out:
            v = self.own_info.get(f"video.{k}")
            if v is None:
                continue
            ok = isinstance(v, bool) if k == "use_log" else (isinstance(v, (int, float)) and not isinstance(v, bool)
                                                             and math.isfinite(v))
            if not ok:
                raise DatasetFormatError(f"feature {self.name!r}: info['video.{k}'] is {v!r}, not a "
                                         f"{'boolean' if k == 'use_log' else 'finite number of metres'}; fix it in "
                                         "meta/info.json (lerobot writes the depth encoder's value there)")
            out[k] = v
        if not out["depth_max"] > out["depth_min"] or (out["use_log"] and out["depth_min"] + out["shift"] <= 0):
            raise DatasetFormatError(f"feature {self.name!r}: depth quantization {out} is unusable (needs depth_max > "
                                     "depth_min, and depth_min + shift > 0 with use_log); fix meta/info.json")
        return out

    @property
    def depth_unit(self) -> Any:
        """The unit a depth map was recorded in (``info.depth_unit``: lerobot writes ``"mm"`` or ``"m"``), None if
        not recorded; any other value as found (the dataset refuses it)."""
        return self.own_info.get("depth_unit")

    @property
    def is_image(self) -> bool:
        return self.dtype == "image"

    @property
    def is_camera(self) -> bool:
        return self.dtype in ("video", "image")

    @property
    def listed_names(self) -> list[str] | None:
        """The names as listed, from a list, a nested list or a one-key dict, however many; None if absent or not
        a list of strings."""
        n = self.names
        if isinstance(n, dict) and len(n) == 1:
            n = next(iter(n.values()))
        while isinstance(n, list) and len(n) == 1 and isinstance(n[0], list):
            n = n[0]
        if isinstance(n, list) and all(isinstance(x, str) for x in n):
            return list(n)
        return None

    @property
    def flat_names(self) -> list[str] | None:
        """One name per vector element (:attr:`listed_names`); None if absent or not one per element."""
        n = self.listed_names
        return n if n is not None and len(n) == _prod(self.shape) else None


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def parse_version(v: Any) -> tuple[int, int]:
    m = re.fullmatch(r"v?(\d+)(?:\.(\d+))?.*", str(v))
    if not m:
        raise ValueError(v)
    return int(m.group(1)), int(m.group(2) or 0)


def parse_template(template: Any, fields: set[str] | frozenset[str], where: str) -> list[tuple[str, str | None, str]]:
    """Split a ``str.format`` path template with Python's own parser into (literal text, placeholder, spec) parts
    (the last part's placeholder is None).

    Only plain placeholders from ``fields`` are accepted: no attribute or index access (``{chunk_index.real}``), no
    conversion (``!r``), no format spec but ``[0][width]d`` on integers and none on ``video_key``. Anything else
    would make the path depend on Python internals or build a huge string.

    Raises:
        DatasetFormatError: naming ``where`` (which info.json key), the template and what to write instead.
    """
    fix = (f"write it like {DEFAULT_DATA_PATH!r} (placeholders {sorted(fields)}, integer specs like :03d)")
    if not isinstance(template, str) or not template:
        raise DatasetFormatError(f"{where}: must be a non-empty string, found {template!r}; {fix}")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise DatasetFormatError(f"{where}: {template!r} is not a str.format template ({e}); {fix}") from e
    out = []
    for text, name, spec, conv in parts:
        if name is None:
            out.append((text, None, ""))
            continue
        if name not in fields:
            raise DatasetFormatError(f"{where}: {template!r} uses unknown placeholder {{{name}}}; {fix}")
        if conv is not None or (spec and (name == "video_key" or not _INT_SPEC.fullmatch(spec))):
            raise DatasetFormatError(f"{where}: {template!r} formats {{{name}}} with {('!' + conv) if conv else ''}"
                                     f"{(':' + spec) if spec else ''}, which is not allowed; {fix}")
        out.append((text, name, spec or ""))
    return out


def check_template(template: Any, fields: set[str] | frozenset[str], key: str,
                   info_file: str = "meta/info.json") -> str:
    """Validate info.json's path template ``key`` (``data_path`` / ``video_path``): a relative path under the
    dataset root, whatever the placeholders are filled with (see :func:`parse_template` and
    :func:`lerobot_sql._storage.source.confine`).

    Args:
        info_file: the info.json as the user should see it (its full path or URL), for the message.

    Raises:
        DatasetFormatError: naming meta/info.json, the key, the template and the fix.
    """
    where = f"{info_file} {key!r}"
    parts = parse_template(template, fields, where)
    text = "".join(t for t, _, _ in parts)
    why = None
    if template.startswith(("/", "\\")):
        why = "is an absolute path"
    elif template.startswith("~"):
        why = "starts with '~' (a home folder)"
    elif _SCHEME.match(template) or "://" in template:
        why = "is a URL or has a drive/protocol prefix"
    elif "\\" in text or "\0" in text:
        why = "holds a backslash or NUL"
    elif any(seg in ("..", ".") for seg in re.split(r"[/{}]", template)):
        why = "has a '.' or '..' path segment"
    if why:
        raise DatasetFormatError(f"{where}: {template!r} {why}; path templates are relative to the dataset root, "
                                 f"e.g. {DEFAULT_DATA_PATH!r}. Fix {key} in meta/info.json")
    sample = template.format(**{f: ("k" if f == "video_key" else 0) for f in fields})
    confine(sample, f"{where} {template!r}")
    return template


def _positive_int(value: Any, what: str, hi: int) -> int:
    """``value`` as an int in [1, hi]; integral floats (``30.0``) accepted, bools and strings not."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise ValueError(f"{what} must be an integer from 1 to {hi:,}, found {value!r}")
    return value


def _parse_features(raw: Any, where: str) -> dict[str, Feature]:
    if not isinstance(raw, dict) or not raw:
        raise DatasetFormatError(f"{where}: 'features' is missing or empty; a LeRobot info.json lists every feature")
    out: dict[str, Feature] = {}
    seen: dict[str, str] = {}
    for name, spec in raw.items():
        try:
            out[name] = _parse_feature(name, spec, where)
        except DatasetFormatError as e:
            e.key = f"features[{name!r}]"
            raise
        # DuckDB identifiers ignore ASCII case: `"ACTION"` would silently read `action`'s column (and the video
        # pointers `videos/<key>/...` of a camera would be another camera's), so two such names are refused.
        other = seen.setdefault(sql_key(name), name)
        if other != name:
            e = DatasetFormatError(f"{where}: features {other!r} and {name!r} differ only by letter case, which SQL "
                                   "(DuckDB) cannot tell apart; rename one of them (its data column, and for a "
                                   "camera its videos/ folder and meta/episodes columns)")
            e.key = f"features[{name!r}]"
            raise e
    return out


def _parse_feature(name: Any, spec: Any, where: str) -> Feature:
    """One entry of info.json's ``features``, validated (see :func:`_parse_features`)."""
    if not isinstance(spec, dict) or "dtype" not in spec:
        raise DatasetFormatError(f"{where}: feature {name!r} has no 'dtype'; each feature needs dtype and shape")
    if not name or "\0" in name:
        raise DatasetFormatError(f"{where}: feature name {name!r} is empty or holds a NUL character; rename it")
    dtype = spec["dtype"]
    if not isinstance(dtype, str) or dtype not in KNOWN_DTYPES:
        raise DatasetFormatError(f"{where}: feature {name!r} has dtype {dtype!r}, which is not a LeRobot dtype; "
                                 f"use one of {sorted(KNOWN_DTYPES)} in meta/info.json")
    info = spec.get("info") or spec.get("video_info") or {}
    if not isinstance(info, dict):
        raise DatasetFormatError(f"{where}: feature {name!r}: 'info' must be an object, found {info!r}")
    shape = spec.get("shape") or [1]
    try:
        if not isinstance(shape, list):
            raise ValueError(f"shape must be a list of integers like [6] or [480, 640, 3], found {shape!r}")
        dims = tuple(_positive_int(s, "each dimension", MAX_DIM) for s in shape)
        if _prod(dims) > MAX_ELEMENTS:
            raise ValueError(f"shape {shape!r} has {_prod(dims):,} elements per frame, more than {MAX_ELEMENTS:,}")
    except ValueError as e:
        raise DatasetFormatError(f"{where}: feature {name!r}: {e}; fix its 'shape' in meta/info.json") from None
    if dtype == "video" and not usable_camera_folder(name):
        raise DatasetFormatError(f"{where}: camera key {name!r} is not a usable folder name (it is absolute or "
                                 "has an empty, '.' or '..' segment); rename the feature and its videos/ "
                                 "folder")
    own, legacy = spec.get("info"), spec.get("video_info")
    return Feature(name, dtype, dims, spec.get("names"), dict(info), dict(own) if isinstance(own, dict) else {},
                   dict(legacy) if isinstance(legacy, dict) else {})


def usable_camera_folder(name: str) -> bool:
    """Whether camera key ``name`` can name its folder (``videos/<key>/...``, read and written): one or more plain
    path segments, not absolute, no empty, ``.`` or ``..`` segment. The one rule for a key read from
    info.json and for a key an export writes (``rename=``: ``../../x`` wrote an mp4 outside the destination)."""
    segs = name.split("/")
    return not name.startswith("/") and not any(seg in ("", ".", "..") for seg in segs)


@dataclasses.dataclass(frozen=True)
class CheckedInfo:
    """meta/info.json's values once :func:`check_info` accepted them.

    Attributes:
        version: ``codebase_version`` as written; legacy: True for v2.x.
        fps: frames per second (MIN_FPS to MAX_FPS).
        features: name -> Feature; has_video: some feature has dtype ``video``.
        chunks_size: files (v3) or episodes (v2) per chunk folder, 1..MAX_CHUNKS_SIZE (1000 when absent).
        total_episodes: 0..MAX_CHUNKS_SIZE**2 (0 when absent).
        data_path: the validated data template (the version's default when absent).
        video_path: the validated video template (the default when absent and there are videos), or None.
    """

    version: str
    legacy: bool
    fps: float
    features: dict[str, Feature]
    has_video: bool
    chunks_size: int
    total_episodes: int
    data_path: str
    video_path: str | None


# The values of info.json's ``storage_format`` this reader reads: absent (None) or Parquet. lerobot after 0.6.1
# (its PR #4363, LanceDatasetReader) reads datasets whose info.json says ``"storage_format": "lance"``: their frames
# are in a Lance table, not in data/*.parquet.
STORAGE_FORMATS = (None, "parquet")


def check_storage_format(value: Any, where: str) -> None:
    """Refuse a ``storage_format`` other than Parquet (absent, null or ``"parquet"``).

    Not read rather than read: a Lance table needs the ``lance`` library (lerobot_sql adds no dependency) or DuckDB's
    lance extension (the locked connection loads none), and without its frames every view and item of such a dataset
    would be empty or missing files, not a clear no.

    Raises:
        DatasetFormatError: naming ``where``, the value and what is read.
    """
    if value not in STORAGE_FORMATS:
        raise DatasetFormatError(
            f"{where}: 'storage_format' is {value!r}; lerobot_sql reads datasets whose frames are in "
            "data/*.parquet files ('storage_format' absent, null or \"parquet\"). A dataset stored as a Lance "
            "table (\"lance\") is read by lerobot's own LeRobotDataset (lerobot newer than 0.6.1: "
            "LanceDatasetReader); query a copy of it written as data/*.parquet here")


def check_info(info: Any, where: str) -> CheckedInfo:
    """The one validation of a parsed meta/info.json (types, ranges, finite numbers, path templates), before any
    value is used: by :func:`load_layout` at ``connect()``, before :func:`lerobot_sql._format.listing.list_files`
    (HTTP roots) derives the file list from it.

    Args:
        info: the parsed JSON. where: the file as the user should see it (``.../meta/info.json``).

    Raises:
        DatasetFormatError: naming ``where``, the key (or feature) that is wrong, and the fix; its ``key``
            attribute is that key (``fps``, ``features['observation.state']``, ``data_path`` ...), for reports
            (``lerobot-sql doctor``).
        UnsupportedVersionError: codebase_version is neither v2.x nor v3.x.

    Keys this reader does not know (``tools``, ``splits``, a writer's own) pass unchecked: the ``info`` view holds
    the whole file as JSON.
    """
    stage = "(the whole file)"  # the info.json key being checked: a refusal carries it as ``error.key``
    try:
        if not isinstance(info, dict):
            raise DatasetFormatError(f"{where}: expected a JSON object")
        stage = "codebase_version"
        version = info.get("codebase_version", "")
        if not isinstance(version, str):  # str(3) would parse as v3.0: a number is not what lerobot writes
            raise DatasetFormatError(f"{where}: 'codebase_version' must be a string like 'v3.0', found {version!r} "
                                     f"({type(version).__name__}); write it as lerobot does (\"v3.0\", \"v2.1\") "
                                     "in meta/info.json")
        try:
            major, _minor = parse_version(version)
        except ValueError:
            raise DatasetFormatError(f"{where}: codebase_version {version!r} is not a version like 'v3.0'") from None
        if major not in (2, 3):
            raise UnsupportedVersionError(f"{where}: codebase_version {version!r} is not supported: this reader "
                                          "handles LeRobot formats v2.0, v2.1 and v3.x")
        legacy = major == 2
        stage = "storage_format"
        check_storage_format(info.get("storage_format"), where)
        stage = "fps"
        fps = info.get("fps")
        if as_real(fps) is None or not math.isfinite(fps) or not MIN_FPS <= fps <= MAX_FPS:
            raise DatasetFormatError(f"{where}: 'fps' must be a number of frames per second from {MIN_FPS:g} to "
                                     f"{MAX_FPS:g}, found {fps!r}; set it to the recording rate (e.g. 30) in "
                                     "meta/info.json")
        stage = "features"
        features = _parse_features(info.get("features"), where)
        has_video = any(f.is_video for f in features.values())
        stage = "chunks_size"
        chunks_size = info.get("chunks_size")
        if chunks_size is None:
            chunks_size = 1000  # lerobot's default
        else:
            try:
                chunks_size = _positive_int(chunks_size, "'chunks_size'", MAX_CHUNKS_SIZE)
            except ValueError as e:
                raise DatasetFormatError(f"{where}: {e}; lerobot writes 1000 (fix it in meta/info.json)") from None
        stage = "total_episodes"
        total = info.get("total_episodes")
        if total is None or total == 0 and not isinstance(total, bool):
            total = 0
        else:
            try:
                total = _positive_int(total, "'total_episodes'", MAX_CHUNKS_SIZE * MAX_CHUNKS_SIZE)
            except ValueError as e:
                raise DatasetFormatError(f"{where}: {e} (or 0); set it to the number of episodes in meta/episodes "
                                         "(fix it in meta/info.json)") from None
        data_default, video_default = ((V2_DATA_PATH, V2_VIDEO_PATH) if legacy else
                                       (DEFAULT_DATA_PATH, DEFAULT_VIDEO_PATH))
        stage = "data_path"
        data_path = check_template(info.get("data_path") or data_default, DATA_FIELDS, "data_path", where)
        stage = "video_path"
        video_path = info.get("video_path") or (video_default if has_video else None)
        if video_path is not None:
            check_template(video_path, VIDEO_FIELDS_V2 if legacy else VIDEO_FIELDS_V3, "video_path", where)
            n_video = sum(1 for f in features.values() if f.dtype == "video")
            if n_video > 1 and "video_key" not in {name for _, name, _, _ in string.Formatter().parse(video_path)}:
                # every camera would read the same mp4: one camera's pictures under the others' keys
                raise DatasetFormatError(
                    f"{where} 'video_path': {video_path!r} has no {{video_key}}, so the {n_video} video features "
                    "would all read the same mp4 (one camera's pictures under every camera's key). Put "
                    f"{{video_key}} in video_path, e.g. {DEFAULT_VIDEO_PATH!r}, and each camera's mp4s in its "
                    "folder")
    except DatasetFormatError as e:
        if getattr(e, "key", None) is None:
            e.key = stage
        raise
    return CheckedInfo(version, legacy, float(fps), features, has_video, chunks_size, total, data_path, video_path)
