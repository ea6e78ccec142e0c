"""The dataset's layout as meta/info.json describes it: format version, fps, features, path templates, file lists.

Knows nothing of DuckDB or torch. v3.x and the legacy v2.0/v2.1 layout (one parquet and one mp4 per episode,
JSON-lines metadata: meta/episodes.jsonl, tasks.jsonl, episodes_stats.jsonl) are both read natively;
``Layout.legacy`` tells them apart.
Problems that do not stop reading (no data files, a video folder that differs from ``video_path``) are
collected in ``Layout.warnings`` and emitted once with :func:`warnings.warn`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from typing import Any

from . import listing
from .jsontext import load_json
from ..errors import DatasetFormatError, MissingFileError, UnsupportedVersionError, as_real, warn
from .._storage.source import Source, confine

DEFAULT_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
EPISODES_GLOB = "meta/episodes/*/*.parquet"
DEFAULT_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
# v2.x: one file per episode; episode_chunk = episode_index // chunks_size (episodes per chunk in v2).
V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V2_EPISODES = "meta/episodes.jsonl"
V2_EPISODES_STATS = "meta/episodes_stats.jsonl"
V2_TASKS = "meta/tasks.jsonl"
V3_TASKS = "meta/tasks.parquet"

# dtypes a LeRobot feature may declare (lerobot's writers: numpy dtype names, plus the non-tensor kinds).
NUMERIC_DTYPES = frozenset({"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                            "uint32", "uint64", "bool"})
KNOWN_DTYPES = NUMERIC_DTYPES | {"video", "image", "string", "language"}
# Bounds on info.json numbers: far beyond any real dataset, small enough that no count, shape or path built from
# them overflows int64 or allocates absurd memory. A 4K RGB camera is 2160*3840*3 = 2.5e7 elements.
MAX_FPS = 100_000.0
# lerobot 0.6's depth quantizer defaults (lerobot.configs.video: DEFAULT_DEPTH_MIN/MAX/SHIFT/USE_LOG), metres
DEPTH_DEFAULTS = {"depth_min": 0.01, "depth_max": 10.0, "shift": 3.5, "use_log": True}
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
        out: dict[str, Any] = dict(DEPTH_DEFAULTS)
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


@dataclasses.dataclass(frozen=True)
class Layout:
    """What info.json says, plus the files found under the root.

    Attributes:
        version: ``codebase_version`` as written (``v3.0``).
        fps: frames per second of the dataset (float; int in lerobot-written data).
        features: name -> Feature, in info.json order.
        data_path, video_path: ``str.format`` templates relative to the root.
        info: the raw info.json dict.
        episode_files: v3: ``meta/episodes/*/*.parquet``; v2: ``("meta/episodes.jsonl",)``; () if absent.
        data_files: relative paths of the dataset's data Parquet files (``data/*/*.parquet`` matching
            ``data_path``), sorted; () for a metadata-only copy.
        stray_data_files: the other Parquet files found under ``data/*/`` (raw recorder output next to the
            dataset's own), sorted: not read, reported by ``lerobot-sql doctor`` (``data_files_stray``).
        legacy: True for the v2.0/v2.1 layout.
        chunks_size: info.json ``chunks_size`` (v2: episodes per chunk folder; v3: files per chunk folder).
        tasks_file: ``meta/tasks.parquet`` (v3) or ``meta/tasks.jsonl`` (v2); None if absent.
        episode_stats_file: v2.1 ``meta/episodes_stats.jsonl``, None otherwise (v3 keeps stats in meta/episodes).
        warnings: what was odd but readable, one message each (already emitted with warnings.warn).

    In the v2 layout the per-episode file of camera K is addressed like a v3 file with
    ``chunk_index = episode_chunk`` and ``file_index = episode_index`` (see :meth:`video_file`).
    """

    version: str
    fps: float
    features: dict[str, Feature]
    data_path: str
    video_path: str | None
    info: dict
    episode_files: tuple[str, ...]
    data_files: tuple[str, ...]
    legacy: bool = False
    chunks_size: int = 1000
    tasks_file: str | None = V3_TASKS
    episode_stats_file: str | None = None
    warnings: tuple[str, ...] = ()
    stray_data_files: tuple[str, ...] = ()

    @property
    def version_tuple(self) -> tuple[int, int]:
        return parse_version(self.version)

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_video]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_image]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_camera]

    def check_cameras(self, cameras: list[str]) -> None:
        """Raise ValueError naming the keys of ``cameras`` that are not camera features, and the valid ones."""
        unknown = [c for c in cameras if c not in self.camera_keys]
        if unknown:
            raise ValueError(f"cameras {unknown} are not camera features; valid: {self.camera_keys}")

    def video_file(self, video_key: str, chunk_index: int, file_index: int) -> str:
        """Relative mp4 path of camera ``video_key``; for v2, chunk_index is episode_chunk, file_index episode_index."""
        tmpl = self.video_path or (V2_VIDEO_PATH if self.legacy else DEFAULT_VIDEO_PATH)
        rel = tmpl.format(video_key=video_key, chunk_index=int(chunk_index), file_index=int(file_index),
                          episode_chunk=int(chunk_index), episode_index=int(file_index))
        return confine(rel, f"meta/info.json 'video_path' {tmpl!r} with camera {video_key!r}")

    def data_file(self, chunk_index: int, file_index: int) -> str:
        """Relative data path from ``data_path``; for v2, chunk_index is episode_chunk, file_index episode_index."""
        rel = self.data_path.format(chunk_index=int(chunk_index), file_index=int(file_index),
                                    episode_chunk=int(chunk_index), episode_index=int(file_index))
        return confine(rel, f"meta/info.json 'data_path' {self.data_path!r}")


_INTEGRAL = NUMERIC_DTYPES - {"float16", "float32", "float64"}


def check_stored_type(feature: Feature | None, stored_is_float: bool, where: str) -> None:
    """Refuse an integer or bool dtype in info.json over a column stored as floats: casting would truncate every
    value (SQL silently, tensors with pyarrow's bare ArrowInvalid). Called where a data file's schema is first read
    (the catalog's frames view, the tabular reader's footer), before any value is converted.

    Raises:
        DatasetFormatError: naming the file, the column, both types and the fix.
    """
    if feature is not None and stored_is_float and feature.dtype in _INTEGRAL:
        raise DatasetFormatError(f"{where}: column {feature.name!r} is stored as floating point, but meta/info.json "
                                 f"declares dtype {feature.dtype!r}; converting would truncate the values. Fix the "
                                 "feature's dtype in meta/info.json (e.g. 'float32')")


def check_item_keys(layout: Layout, cameras, delta_keys, where: str) -> None:
    """Refuse a feature whose item key one of the item's own keys would take: ``task`` (the frame's task text) and
    ``<key>_is_pad`` for a ``delta_timestamps`` key (that key's padding). lerobot 0.4.4's ``__getitem__`` writes them
    over the feature without a word (``item = {**item, **padding}``, then ``item["task"] = ...``), so the feature's
    values are lost; lerobot's writer never makes a ``task`` feature (its ``validate_frame`` takes ``task`` as the
    frame's text). Refused rather than served either way; checked once, when a dataset is built.

    Args:
        layout: the dataset's. cameras: the camera keys its items carry (a camera left out is no item key).
        delta_keys: the ``delta_timestamps`` keys. where: the dataset's root (URL or path), for the message.

    Raises:
        DatasetFormatError: naming the dataset, the feature and the way out (a copy with the feature renamed,
            written by a one-dataset collection's export; or the key out of ``delta_timestamps``).
    """
    carried = {k for k, f in layout.features.items() if not f.is_camera or k in cameras}
    clashes = [("task", "task_feature", "the frame's task text (meta/tasks)", "")] if "task" in carried else []
    for k in delta_keys:
        if f"{k}_is_pad" in carried:
            clashes.append((f"{k}_is_pad", f"{k}_pad_feature", f"the padding of delta_timestamps key {k!r}",
                            f"drop {k!r} from delta_timestamps, or "))
    if not clashes:
        return
    key, new, what, other = clashes[0]
    export = (f"lerobot_sql.connect_many({{'d': {where!r}}}).export(\"SELECT 'd' AS dataset, episode_index FROM "
              f"episodes\", DEST, rename={{'d': {{{key!r}: {new!r}}}}})")
    camera = " (or leave the camera out: cameras=[...])" if layout.features[key].is_camera else ""
    raise DatasetFormatError(
        f"{where}: feature {key!r} (meta/info.json) has the name of the key every item carries {what} under, which "
        f"would replace the feature's values in every item and batch without a word (lerobot's __getitem__ does). "
        f"Refused: {other}read a copy with the feature renamed, e.g. {export}{camera}")


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


def sql_key(name: str) -> str:
    """How DuckDB compares identifiers: ASCII letters case-insensitively, every other character as is (``"ACTION"``
    and ``action`` are one column; ``"É"`` and ``"é"`` are two)."""
    return "".join(c.lower() if c.isascii() else c for c in name)


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
    if dtype == "video":
        # The key names a folder (videos/<key>/...): it must be one or more plain path segments.
        segs = name.split("/")
        if name.startswith("/") or any(seg in ("", ".", "..") for seg in segs):
            raise DatasetFormatError(f"{where}: camera key {name!r} is not a usable folder name (it is absolute or "
                                     "has an empty, '.' or '..' segment); rename the feature and its videos/ "
                                     "folder")
    own, legacy = spec.get("info"), spec.get("video_info")
    return Feature(name, dtype, dims, spec.get("names"), dict(info), dict(own) if isinstance(own, dict) else {},
                   dict(legacy) if isinstance(legacy, dict) else {})


@dataclasses.dataclass(frozen=True)
class CheckedInfo:
    """meta/info.json's values once :func:`check_info` accepted them.

    Attributes:
        version: ``codebase_version`` as written; legacy: True for v2.x.
        fps: frames per second (> 0, finite, at most MAX_FPS).
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
    """
    stage = "(the whole file)"  # the info.json key being checked: a refusal carries it as ``error.key``
    try:
        if not isinstance(info, dict):
            raise DatasetFormatError(f"{where}: expected a JSON object")
        stage = "codebase_version"
        version = str(info.get("codebase_version", ""))
        try:
            major, _minor = parse_version(version)
        except ValueError:
            raise DatasetFormatError(f"{where}: codebase_version {version!r} is not a version like 'v3.0'") from None
        if major not in (2, 3):
            raise UnsupportedVersionError(f"{where}: codebase_version {version!r} is not supported: this reader "
                                          "handles LeRobot formats v2.0, v2.1 and v3.x")
        legacy = major == 2
        stage = "fps"
        fps = info.get("fps")
        if as_real(fps) is None or not math.isfinite(fps) or not 0 < fps <= MAX_FPS:
            raise DatasetFormatError(f"{where}: 'fps' must be a positive finite number (at most {MAX_FPS:g}), found "
                                     f"{fps!r}; set it to the recording rate (e.g. 30) in meta/info.json")
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
    except DatasetFormatError as e:
        if getattr(e, "key", None) is None:
            e.key = stage
        raise
    return CheckedInfo(version, legacy, float(fps), features, has_video, chunks_size, total, data_path, video_path)


def load_layout(src: Source) -> Layout:
    """Read meta/info.json and list the metadata and data files (no Parquet is opened).

    v3.x and v2.x (v2.0, v2.1) are accepted. A copy without data files or without episode metadata still opens
    (its views are empty) with a warning, so metadata-only copies can be queried.

    Raises:
        MissingFileError: meta/info.json does not exist under the root.
        DatasetFormatError: info.json is not valid JSON or lacks fps/features.
        UnsupportedVersionError: codebase_version is neither v2.x nor v3.x.
    """
    where = src.path("meta/info.json")
    if not src.exists("meta/info.json"):
        raise MissingFileError(
            f"{where}: not found. Is {src.url!r} the root of a LeRobot dataset (the folder holding meta/, data/, videos/)?"
        )
    with src.open("meta/info.json") as f:
        info = load_json(f.read(), where, "restore it from the dataset's source (or write it again with lerobot's "
                         "writer)")
    v = check_info(info, where)
    if src.is_http:  # no directory listing: every exists/glob below answers from the files the metadata names
        src.set_listing(listing.list_files(src, v))
    legacy, fps, features, has_video, chunks_size = v.legacy, v.fps, v.features, v.has_video, v.chunks_size
    version = v.version
    notes: list[str] = []

    if legacy:
        episode_files = (V2_EPISODES,) if src.exists(V2_EPISODES) else ()
        stats_file = V2_EPISODES_STATS if src.exists(V2_EPISODES_STATS) else None
        tasks_file = V2_TASKS if src.exists(V2_TASKS) else None
        data_path, video_path = v.data_path, v.video_path
        if not episode_files:
            notes.append(f"{src.path(V2_EPISODES)}: not found; the episodes view is empty")
    else:
        episode_files = tuple(src.glob(EPISODES_GLOB))
        stats_file = None
        tasks_file = V3_TASKS if src.exists(V3_TASKS) else None
        data_path, video_path = v.data_path, v.video_path
        if not episode_files:
            notes.append(f"{src.path('meta/episodes')}: no episode metadata files ({EPISODES_GLOB}); "
                         "the episodes, episode_stats and videos views are empty")
    if tasks_file is None:
        notes.append(f"{src.path(V2_TASKS if legacy else V3_TASKS)}: not found; the tasks view is empty and "
                     "dataset() refuses frames whose task text it cannot give")
    data_files, strays = _split_data_files(src, tuple(src.glob("data/*/*.parquet")), data_path, notes)
    if not data_files:
        notes.append(f"{src.path('data')}: no data files (data/*/*.parquet); this is a metadata-only copy, the "
                     "frames view is empty. Download data/ to read frames")
    if video_path is not None and has_video:
        video_path = _find_video_dir(src, video_path, notes, VIDEO_FIELDS_V2 if legacy else VIDEO_FIELDS_V3, where)
    for n in notes:
        warn(n)  # the caller of lerobot_sql.connect()
    return Layout(
        version=version,
        fps=float(fps),
        features=features,
        data_path=data_path,
        video_path=video_path,
        info=info,
        episode_files=episode_files,
        data_files=data_files,
        legacy=legacy,
        chunks_size=chunks_size,
        tasks_file=tasks_file,
        episode_stats_file=stats_file,
        warnings=tuple(notes),
        stray_data_files=strays,
    )


def _split_data_files(src: Source, found: tuple[str, ...], data_path: str,
                      notes: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``found`` split into the dataset's data files (those ``data_path`` can name) and the strays.

    A Parquet file of other columns beside the dataset's own (raw recorder output) would join the frames view
    with NULL ``episode_index`` rows: only files the template names are read, and the others are named in a note.
    When no file matches the template (a writer that ignored its own data_path), all are read, as before, with a
    note: refusing would leave nothing to read.
    """
    pattern = re.compile("".join(re.escape(text) + (r"\d+" if field is not None else "")
                                 for text, field, _spec, _conv in string.Formatter().parse(data_path)))
    ours = tuple(f for f in found if pattern.fullmatch(f))
    strays = tuple(f for f in found if not pattern.fullmatch(f))
    if not strays:
        return found, ()
    if not ours:
        notes.append(f"{src.path('data')}: none of the {len(found)} Parquet files under data/ match info.json's "
                     f"data_path {data_path!r} (e.g. {found[0]}); all are read as data files. Fix data_path")
        return found, ()
    shown = ", ".join(strays[:5]) + (f" and {len(strays) - 5} more" if len(strays) > 5 else "")
    notes.append(f"{src.path('data')}: {len(strays)} Parquet file(s) do not match info.json's data_path "
                 f"{data_path!r} and are not read as frames: {shown}. They are not part of the dataset "
                 "(lerobot-sql doctor lists them); move them out of data/")
    return ours, strays


def _find_video_dir(src: Source, video_path: str, notes: list[str], fields: frozenset[str] = VIDEO_FIELDS_V3,
                    where: str = "meta/info.json") -> str:
    """``video_path`` with its top folder replaced when that folder is absent but exactly one other top-level
    folder holds mp4 files (third-party writers put videos in ``video/`` while the template says ``videos/``).

    Only the literal first path segment is compared, so this costs one or two listings, not one per file. The
    folder's name is data from a listing, not template text: its braces are escaped, and the rewritten template
    goes through the same :func:`check_template` (and so :func:`lerobot_sql._storage.source.confine`) as info.json's; a
    name that fails it (a backslash, a NUL) is not used, with a note. A folder that is a symlink out of the
    dataset is refused where its files are opened (:meth:`lerobot_sql._storage.source.Source.check_link`).
    """
    top = video_path.split("/", 1)
    if len(top) != 2 or "{" in top[0]:
        return video_path
    try:
        if src.exists(top[0]):
            return video_path
        candidates = sorted({p.split("/", 1)[0] for p in src.glob("*/**/*.mp4")} - {"meta", "data"})
    except Exception:  # noqa: BLE001 - a filesystem that cannot list (plain HTTP) keeps the template as written
        return video_path
    if len(candidates) != 1:
        return video_path
    folder = candidates[0]
    fixed = f"{folder.replace('{', '{{').replace('}', '}}')}/{top[1]}"
    try:
        check_template(fixed, fields, "video_path", f"{where} (rewritten to the folder {folder!r} found under the "
                                                    "root)")
    except DatasetFormatError as e:
        notes.append(f"{src.path(top[0])}: not found; {src.path(folder)} holds mp4 files but its name cannot be "
                     f"used as a video folder ({e}); videos are read through info.json's video_path {video_path!r}. "
                     "Rename the folder to match video_path")
        return video_path
    notes.append(f"{src.path(top[0])}: not found, but {src.path(folder)} holds mp4 files; reading videos "
                 f"through {fixed!r} instead of info.json's video_path {video_path!r}")
    return fixed
