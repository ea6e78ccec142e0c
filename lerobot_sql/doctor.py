"""``lerobot-sql doctor``: the format's invariants (what meta/ promises about data/ and videos/) run as SQL over the
views, with a report.

Each check is one named query in ``queries/doctor/<check>.sql`` that returns one row per violation; no rows means
the check passed. Every check also runs alone, ``db.named_query("doctor/<check>")``: what SQL cannot do comes from views
the Database builds on first use, ``video_files`` (file existence, size and stream codec, probed by
:func:`lerobot_sql._readers.video_index.probe_video_files`) and ``video_frames`` (the video index, by demuxing).
``run`` builds the video index only when every video file is present.

Two checks are computed in Python alone, as no view can hold them, both opt-in with ``run(db, decode=True)``
(``lerobot-sql doctor --decode``): ``video_files_decode`` (:data:`DECODE`) decodes every frame of every mp4 and
compares what the decoder outputs with the file's index; ``data_images_decode`` (:data:`IMAGE_DECODE`) decodes every
image stored in the data files. They are reported like the others, and as skipped ("not run") when off.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import duckdb
import pyarrow as pa

from ._catalog.connection import query_error
from ._query import library
from ._readers import locate, verify
from .errors import DatasetFormatError, LeRobotSQLError, MissingFileError

SAMPLE_ROWS = 5


@dataclasses.dataclass(frozen=True)
class Spec:
    """A check: its query name, what it needs, how bad a failure is and what to do about it."""

    name: str
    hint: str
    severity: str = "error"          # "error" makes the report fail; "warning" is reported only
    needs: str = ""                  # "" (metadata and data), "videos" (files present), "index" (video_frames)
    params: tuple[str, ...] = ()     # which run() parameters the query takes
    clips: bool = False              # reads the clips' from/to_timestamp: nothing to check without any


CHECKS: tuple[Spec, ...] = (
    Spec("episode_index_contiguous", "renumber meta/episodes to 0..N-1 in order, or fix total_episodes in info.json"),
    Spec("index_contiguous", "rewrite the data files' `index` as 0..n-1 (lerobot's writer does), or fix total_frames"),
    Spec("frame_index_contiguous", "frame_index must restart at 0 in each episode and timestamp equal "
         "frame_index / fps; rewrite the episode's rows", params=("tolerance_s",)),
    Spec("data_rows_in_index_order", "rewrite the named data files with their rows sorted by `index`, as lerobot "
         "writes them (e.g. pq.write_table(pq.read_table(path).sort_by('index'), path)): neighbours "
         "(delta_timestamps) and exports read rows by position, so dataset() refuses these episodes"),
    Spec("episode_ranges", "recompute length, dataset_from_index and dataset_to_index from the data files; "
         "lerobot_sql reads rows by episode_index, but lerobot trusts these ranges"),
    Spec("data_file_pointers", "rewrite data/chunk_index and data/file_index in meta/episodes from the file holding "
         "each episode (a known converter bug, lerobot issue #2401)"),
    Spec("data_files_present", "download the missing data files (e.g. huggingface_hub.snapshot_download with "
         "allow_patterns='data/*'); until then queries over frames lack their episodes"),
    Spec("data_files_stray", "move these files out of data/ (if one is the dataset's own: rename it to match "
         "info.json's data_path, or list its episode in meta/episodes / point the episode's data/chunk_index and "
         "data/file_index to it): they are not read as frames, but tools that read data/ whole take them in",
         severity="warning"),
    Spec("data_files_decode", "re-download the named data files: a page does not decode (damaged or partial copy)"),
    Spec("tasks_exist", "add the missing tasks to meta/tasks.parquet (tasks.jsonl for v2.x) or fix task_index; "
         "for the count row, fix total_tasks in info.json"),
    Spec("episode_tasks", "rewrite the episode's `tasks` in meta/episodes (meta/episodes.jsonl for v2.x) as the "
         "distinct task texts of its frames, or fix the frames' task_index: a warning, as the items carry the frames' "
         "own task, but selections by task (list_contains(tasks, ...), episodes_by_task) read meta/episodes and pick "
         "the wrong episodes", severity="warning"),
    Spec("feature_names", "give the feature one name per element in meta/info.json's 'names' (or null): frames_ext "
         "names no element of it, and tools that label elements by these names mislabel them", severity="warning"),
    Spec("stats_present", "recompute per-episode statistics (lerobot's compute_episode_stats); normalisation needs "
         "them"),
    Spec("video_pointers_present", "restore the videos/<key>/chunk_index, file_index, from_timestamp and "
         "to_timestamp columns of meta/episodes from the dataset's source (or rewrite them from the mp4s); until then "
         "that camera's frames cannot be located (dataset(..., cameras=[]) reads the tabular data; the mp4s the "
         "pointers name are still checked below)"),
    Spec("video_files_present", "download the missing mp4s (e.g. huggingface_hub.snapshot_download with "
         "allow_patterns='videos/*'); frames of those cameras cannot be read", needs="videos"),
    Spec("video_files_readable", "re-download the named mp4s (an empty or unreadable file: the frames of that camera "
         "cannot be read, and the video index checks below cannot run on it); a file of several video streams: "
         "lerobot writes one video stream per camera file and the readers refuse the others, so keep the camera's "
         "own stream N in a copy (ffmpeg -i FILE -map 0:v:N -map 0:a? -c copy fixed.mp4) and put it in place of the "
         "file", needs="videos"),
    Spec("video_files_complete", "re-download the truncated mp4s: frames past the cut cannot be decoded",
         needs="index"),
    Spec("video_codec", "info.json mislabels the stream's codec; decoding follows the file, so this only misleads "
         "tools that trust info.json", severity="warning", needs="videos"),
    Spec("video_resolution", "the mp4's frames are not the size info.json declares for the camera (its shape, "
         "video.height / video.width): a warning, not a failure, because the readers serve each file's own size as "
         "lerobot does (the items are the right frames), but models and batches built from info.json's shape get "
         "another size. Fix the camera's shape and video.height / video.width in meta/info.json to the file's size, "
         "or re-encode the mp4 at the declared size", severity="warning", needs="videos"),
    Spec("video_segments", "fix videos/<key>/from_timestamp and to_timestamp in meta/episodes: clips must last "
         "length / fps and chain within a file", params=("tolerance_s",), clips=True),
    Spec("video_segments_end_convention", "to_timestamp marks the clip's last frame ((length - 1) / fps after "
         "from_timestamp), not its end (length / fps, as lerobot writes): both readers decode it correctly; rewrite "
         "to_timestamp = from_timestamp + length / fps for tools that treat [from, to) as the clip's span",
         severity="warning", params=("tolerance_s",), clips=True),
    Spec("video_segment_frames", "the clip's real frames do not match its length: re-encode the episode or fix "
         "from/to_timestamp", needs="index", params=("tolerance_s",), clips=True),
    Spec("video_clip_frames", "an episode's clip overlaps another clip or runs past the file's end in the mp4's real "
         "frames, so its items would be another episode's frames (the items reading that mp4 raise): fix "
         "videos/<key>/from_timestamp so each clip starts on the frame after the previous episode's last",
         needs="index", clips=True),
    Spec("video_stream_rate", "the mp4's frame rate is not info.json's fps: frames are looked up by time (the real "
         "pts), so fix 'fps' in info.json if the data's timestamps follow the video, or re-encode the video at the "
         "dataset's fps; frames whose time has no video frame are listed by video_frame_pts", severity="warning",
         needs="index"),
    Spec("video_info_fps", "the camera's info.video.fps in meta/info.json is not its mp4's frame rate: fix "
         "video.fps to the stream's rate. A warning: the readers look frames up by time at info.json's top-level "
         "fps (video_stream_rate checks that one) and never read video.fps, so only tools that trust it are misled",
         severity="warning", needs="index"),
    Spec("video_frame_pts", "from_timestamp drifts from the file's real pts (lerobot issue #3177): recompute "
         "from_timestamp from the video, or pass a larger tolerance_s if the drift is known, harmless and under half "
         "a frame (1 / (2 fps) s; a larger one would pick a neighbouring frame)",
         needs="index", params=("tolerance_s",), clips=True),
)

# The check no SQL can make: FFmpeg decodes every frame (a full decode of every mp4, minutes for a large dataset, so
# opt-in). It is not a named query: there is no view of decoded frames (lerobot_sql._readers.verify decodes).
DECODE = Spec("video_files_decode", "the named mp4 does not decode the way its index (its demuxed packets) says: "
              "items reading the listed episodes raise (\"decoding skipped pts=...\") or miss frames. Re-encode the "
              "file or re-export it from its source", needs="index")
DECODE_DESCRIPTION = ("every mp4 decodes front to back with its frames' pts strictly increasing, exactly the pts of "
                      "its demuxed packets (none missing, none extra) and no decode error, and a seek to each of up "
                      "to 64 keyframes per file (as the readers seek) decodes that keyframe first (run with "
                      "decode=True, CLI --decode)")
DECODE_OFF = ("not run: decoding every frame is opt-in, pass decode=True (CLI: --decode); the mp4s' packets were "
              "checked, not their decoded frames")
# The images stored in the data files (dtype image: PNG/TIFF bytes per cell), decoded with PIL as the items decode
# them; opt-in with DECODE (a full decode of every image).
IMAGE_DECODE = Spec("data_images_decode", "the named image cells do not decode (a cut or damaged PNG/TIFF, or a cell "
                    "holding no bytes): items reading those rows raise DatasetFormatError. Re-download the data file "
                    "if its source's copy is intact, else re-encode those frames' images from the recording (or "
                    "drop the rows)")
IMAGE_DECODE_DESCRIPTION = ("every cell of every image feature (dtype image) in the data files holds image bytes PIL "
                            "decodes whole, as the items read them (run with decode=True, CLI --decode)")
IMAGE_DECODE_OFF = ("not run: decoding every image is opt-in, pass decode=True (CLI: --decode); the data files' pages "
                    "were checked, not the images in them")
# meta/stats.json, as db.stats() and ds.meta.stats (stats="dataset") read it: JSON, numbers, one value per element.
STATS_JSON = Spec("stats_json_valid", "where the statistics have the data's sizes and info.json's shape is the wrong "
                  "one (data_files_decode then names it), fix the shape in meta/info.json; otherwise recompute "
                  "meta/stats.json (lerobot's aggregate_stats over the per-episode statistics; here db.stats('SELECT "
                  "episode_index FROM episodes') computes them from the data) or take the source's copy again: "
                  "normalisation (ds.meta.stats with stats='dataset') reads it")
STATS_JSON_DESCRIPTION = ("meta/stats.json parses as JSON, every statistic is numbers, and each has one value per "
                          "element of its feature's info.json shape (one per channel for a camera)")
# Hints added to DECODE's by what was found (the likely cause, named per kind of failure).
_OPEN_GOP = ("frames out of order in an HEVC / H.264 file made by concatenating or stream-copying parts are the usual "
             "sign of an open-GOP keyframe after a cut (an HEVC CRA, an H.264 recovery-point I frame) that keeps the "
             "picture order of the part before it: re-encode from the cut (closed GOPs, e.g. x265 'no-open-gop=1'), "
             "or relabel the CRA as a BLA (lerobot_sql's export does)")
_CUT = ("the file's last frames never decode (video_files_complete fails too when its bytes end before its last "
        "packet): the file is cut short, re-download it")
_SEEK = ("a seek to a keyframe decodes another frame first while a front-to-back decode is right: FFmpeg seeks an mp4 "
         "by its sample table (the dts), and these dts disagree with the pts (lerobot_sql's export of windows cut "
         "mid-GOP wrote such files before the dts fix), so items read at random raise \"decoding skipped\": "
         "re-export from the source with this version, or re-encode the file")
_DAMAGED = ("decode errors inside the file: its packets' bytes are damaged (bit rot, a bad copy), re-download it; if "
            "the source's copy fails too, re-encode the episodes from the original recording")


@dataclasses.dataclass
class Check:
    """The outcome of one check.

    Attributes:
        name: the check, also its query ``doctor/<name>``.
        ok: no violations (a skipped check is ok).
        n_violations: number of violation rows.
        sample: up to 5 violation rows, as dicts.
        hint: how to fix a violation.
        severity: ``error`` or ``warning`` (warnings do not fail the report).
        description: the first lines of the query's header.
        skipped: why the check did not run, or None.
    """

    name: str
    ok: bool
    n_violations: int
    sample: list[dict]
    hint: str
    severity: str = "error"
    description: str = ""
    skipped: str | None = None


@dataclasses.dataclass
class Report:
    """All checks of one dataset. ``ok`` is False when any error-severity check found violations."""

    dataset: str
    version: str
    tolerance_s: float
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok or c.severity != "error" for c in self.checks)

    def __getitem__(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {[c.name for c in self.checks]}")

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, "codebase_version": self.version, "tolerance_s": self.tolerance_s,
                "ok": self.ok, "checks": [dataclasses.asdict(c) for c in self.checks]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def to_text(self) -> str:
        lines = [f"lerobot-sql doctor: {self.dataset} ({self.version}), tolerance_s={self.tolerance_s:g}"]
        for c in self.checks:
            if c.skipped:
                mark = "SKIP"
            elif c.ok:
                mark = "ok  "
            else:
                mark = "FAIL" if c.severity == "error" else "WARN"
            lines.append(f"  {mark} {c.name}" + (f": {c.n_violations} violation(s)" if not c.ok else "")
                         + (f" ({c.skipped})" if c.skipped else ""))
            if not c.ok:
                for row in c.sample:
                    lines.append("         " + ", ".join(f"{k}={_short(v)}" for k, v in row.items()))
                if c.n_violations > len(c.sample):
                    lines.append(f"         ... {c.n_violations - len(c.sample)} more")
                lines.append(f"       hint: {c.hint}")
        n_err = sum(1 for c in self.checks if not c.ok and c.severity == "error")
        n_warn = sum(1 for c in self.checks if not c.ok and c.severity != "error")
        lines.append("OK" if self.ok and not n_warn else
                     f"{'OK' if self.ok else 'PROBLEMS'}: {n_err} failed, {n_warn} warning(s)")
        return "\n".join(lines)


def _short(v: Any) -> str:
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) <= 120 else s[:117] + "..."


SHAPE_HINT = ("a column's values per row differ from the shape info.json declares for it: fix the feature's shape in "
              "meta/info.json (or rewrite the data files to that shape); the files themselves decode")


def _could_not_run(e: Exception, spec: Spec) -> str:
    """The hint of a check whose query failed, by the real cause: a column the data lacks (a converter that did not
    write it) is not a reason to re-download; otherwise the check's own hint."""
    import re

    m = re.search(r"unknown column '([^']+)' in '([^']+)'", str(e)) or \
        re.search(r'Referenced column "([^"]+)" not found', str(e))
    if m:
        where = f" of {m.group(2)}" if m.lastindex and m.lastindex > 1 else ""
        return (f"the check could not run: the dataset has no column {m.group(1)!r}{where}, which it reads (a "
                "converter that did not write it): add the column to the data files (lerobot writes it), or read "
                "what does not need it; re-downloading will not help")
    if isinstance(e, DatasetFormatError) and "cannot be read as Parquet" in str(e):
        return ("the check could not run: a data file it reads is damaged (data_files_decode names every one); "
                "re-download it from the dataset's source, then run doctor again")
    return f"the check could not run on this dataset's metadata; {spec.hint}"


def _shape_mismatches(db) -> list[dict[str, Any]]:
    """Numeric list columns whose values per row (first row of each data file) are not the product of the shape
    info.json declares: ``path``, ``column``, ``declared_shape``, ``values_per_row``."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out = []
    feats = {k: f for k, f in db.layout.features.items() if len(f.shape) and not f.is_video and not f.is_image}
    for rel in db.layout.data_files:
        try:
            with db.source.open(rel) as fh:
                pf = pq.ParquetFile(fh)
                cols = [c for c in pf.schema_arrow.names if c in feats]
                if not cols or not pf.metadata.num_rows:
                    continue
                first = pf.read_row_group(0, columns=cols, use_threads=False).slice(0, 1)
        except (pa.ArrowException, OSError):
            continue
        for c in cols:
            col = first[c]
            t = col.type
            if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
                continue
            flat = col.combine_chunks()
            while pa.types.is_list(flat.type) or pa.types.is_large_list(flat.type) or \
                    pa.types.is_fixed_size_list(flat.type):
                flat = pc.list_flatten(flat)
            want = int(np.prod(feats[c].shape))
            if len(flat) != want:
                out.append({"path": rel, "column": c, "declared_shape": list(feats[c].shape),
                            "values_per_row": len(flat)})
    return out


def refused_report(dataset: str, error: Exception, tolerance_s: float = 1e-4) -> Report:
    """The report for a dataset that ``connect()`` refused (its meta/info.json is invalid or unsupported): one failed
    check, ``info_json_valid``, whose sample row names the file, the key that is wrong and the message (which says
    what the key must hold); no other check can run.

    Args:
        dataset: the root as the user gave it. error: the DatasetFormatError raised by ``connect()`` (its ``key``
            attribute, set by :func:`lerobot_sql._format.info.check_info`, names the info.json key).
    """
    key = getattr(error, "key", None)
    msg = str(error)
    # The message starts with the file's path or URL; the hint repeats what follows it (what is wrong, the fix).
    what = msg.split("meta/info.json", 1)[1].lstrip(" :") if "meta/info.json" in msg else msg
    row = {"key": key or "(see the error)", "file": "meta/info.json", "error": f"{type(error).__name__}: {msg}"}
    hint = (f"fix {key!r} in meta/info.json ({what}); " if key else f"fix meta/info.json ({what}); ") + \
        "no other check can run until connect() accepts the file"
    return Report(str(dataset), "?", float(tolerance_s), [Check(
        "info_json_valid", False, 1, [row], hint, "error",
        "meta/info.json passes validation (types, ranges, path templates)")])


def _no_data_file_reads(db, error: Exception, tolerance_s: float) -> Report | None:
    """The report when the views cannot be built because no data file reads (a one-file dataset whose file is
    truncated): ``data_files_decode`` names every damaged file (pyarrow, no view needed) and every other check is
    reported as not run, saying why. None when ``error`` is not about a damaged data file (the caller reports
    ``metadata_readable``). With one readable data file the views are built and every check runs."""
    if not isinstance(error, DatasetFormatError) or "cannot be read as Parquet" not in str(error):
        return None
    bad = verify.undecodable_data_files(db.source, db.layout.data_files)
    if not any(str(db.source.path(r["path"])) in str(error) for r in bad):
        return None  # the file named is a metadata file
    why = "not run: no data file can be read (see data_files_decode), so no view of the dataset can be built"
    checks = []
    for spec in CHECKS:
        nq = library.load(f"doctor/{spec.name}")
        if spec.name == "data_files_decode":
            checks.append(Check(spec.name, False, len(bad), bad[:SAMPLE_ROWS], spec.hint, spec.severity,
                                nq.description))
        else:
            checks.append(Check(spec.name, True, 0, [], spec.hint, spec.severity, nq.description, why))
    checks.append(Check(DECODE.name, True, 0, [], DECODE.hint, DECODE.severity, DECODE_DESCRIPTION, why))
    return Report(db.source.url, db.layout.version, float(tolerance_s), checks)


def run(db, *, tolerance_s: float = 1e-4, check_video: bool = True, decode: bool = False,
        progress: bool | None = None) -> Report:
    """Run every check on ``db`` (a :class:`lerobot_sql.Database`) and return the :class:`Report`.

    Args:
        tolerance_s: seconds allowed between a frame's expected time and the real pts, and for clip bounds.
        check_video: also build the video index (demux every mp4 once, cached), check every frame's pts and the
            codec labels. With False only the files' existence and the clip metadata are checked for videos.
        decode: also decode every frame of every mp4 the episodes point to (``video_files_decode``: FFmpeg's output
            order, the decoded pts against the index, decode errors). Costs a full decode of the dataset's videos
            (sample/multifile60, 26k small frames in 11 mp4s: about 2 s on 2 cores) and a seek to each of up to 64
            keyframes per mp4 (there 704 seeks, about 0.2 s); needs ``check_video``. Also decode every image
            stored in the data files (``data_images_decode``). Off: both checks are reported as skipped ("not
            run").
        progress: a progress bar over the mp4s being decoded (None: only for 8 files or more).

    A check whose query fails (e.g. a column missing from meta/episodes) is reported as failed with DuckDB's
    message; nothing is raised for a broken dataset.

    Raises:
        TypeError, ValueError: ``tolerance_s`` is not a finite number of seconds > 0 (as ``dataset()``): 0, a
            negative or NaN tolerance failed a healthy dataset's timestamp and video checks with wrong fixes.
    """
    tolerance_s = locate.check_tolerance(tolerance_s)
    params = {"tolerance_s": tolerance_s}
    try:  # the views read meta/episodes, tasks and every data footer: an unreadable one stops every check
        _ = db.con
    except LeRobotSQLError as e:
        damaged = _no_data_file_reads(db, e, tolerance_s)
        if damaged is not None:
            return damaged
        return Report(db.source.url, db.layout.version, float(tolerance_s), [Check(
            "metadata_readable", False, 1, [{"error": f"{type(e).__name__}: {e}"}],
            "re-download the named file; no other check can run until the metadata and data footers read",
            "error", "the metadata files and data file footers can be read")])
    # Reading video_files makes the Database probe the mp4s (once per connection).
    n_files, n_missing = db.con.sql(db.check(
        "SELECT count(*), count(*) FILTER (WHERE NOT present) FROM video_files")).fetchall()[0]
    # clips with both bounds: the checks of clips (Spec.clips) have nothing to check without any
    n_clips = db.con.sql(db.check(
        "SELECT count(*) FROM videos WHERE from_timestamp IS NOT NULL AND to_timestamp IS NOT NULL")).fetchall()[0][0]
    index_ready: str | None = None
    if n_files and check_video and n_missing < n_files:
        try:
            db.check("SELECT * FROM video_frames")  # builds the video index (view video_frames) on first use
        except MissingFileError:
            pass  # every present mp4 is indexed and checked; video_files_present names the missing ones
        except LeRobotSQLError as e:
            index_ready = f"the video index could not be built: {e}"
    checks = []
    failing: dict[str, set] = {}  # check -> episodes it found bad (for hints that name the real cause)
    for spec in CHECKS:
        nq = library.load(f"doctor/{spec.name}")
        skipped = _video_skip(db, spec, check_video, n_files, n_missing, index_ready, n_clips)
        if skipped is None and spec.name in ("video_codec", "video_resolution") and not check_video:
            skipped = "video checks disabled"
        elif skipped is None and spec.name == "stats_present" and db.layout.legacy and \
                not db.layout.episode_stats_file:
            skipped = "v2.0 keeps no per-episode statistics (meta/stats.json only)"
        if skipped:
            checks.append(Check(spec.name, True, 0, [], _hint(db, spec), spec.severity, nq.description, skipped))
            continue
        try:
            # Through db.check, as db.query runs it: the same SQL checks, and the views it reads are built.
            sql = db.check(library.render(f"doctor/{spec.name}", {p: params[p] for p in spec.params}))
            result = db.con.sql(sql).to_arrow_table()
        except (duckdb.Error, LeRobotSQLError) as e:
            shapes = _shape_mismatches(db) if "Cannot cast list" in str(e) else []
            if shapes:  # info.json declares a shape the data does not have: not a damaged file
                checks.append(Check(spec.name, False, len(shapes), shapes[:SAMPLE_ROWS], SHAPE_HINT, spec.severity,
                                    nq.description))
                continue
            if spec.name == "data_files_decode":  # DuckDB's decode error names no file: find them with pyarrow
                bad = verify.undecodable_data_files(db.source, db.layout.data_files)
                if bad:
                    checks.append(Check(spec.name, False, len(bad), bad[:SAMPLE_ROWS], spec.hint, spec.severity,
                                        nq.description))
                    continue
            if isinstance(e, duckdb.Error):  # as db.sql words it: a damaged data file is named as such
                e = query_error(e, sql)
            checks.append(Check(spec.name, False, 1, [{"error": f"{type(e).__name__}: {e}"}], _could_not_run(e, spec),
                                spec.severity, nq.description))
            continue
        hint = _hint(db, spec)
        if "episode_index" in result.column_names and result.num_rows:
            failing[spec.name] = set(result["episode_index"].to_pylist())
            if spec.name == "video_frame_pts":
                hint = _frame_pts_hint(failing, hint, lambda eps: _clips_on_grid(db, eps))
        checks.append(Check(spec.name, result.num_rows == 0, result.num_rows,
                            result.slice(0, SAMPLE_ROWS).to_pylist(), hint, spec.severity, nq.description))
    checks.append(_decode_check(db, decode, check_video, n_files, n_missing, index_ready, progress))
    checks.append(_image_decode_check(db, decode))
    checks.append(_stats_json_check(db))
    return Report(db.source.url, db.layout.version, float(tolerance_s), checks)


def _frame_pts_hint(failing: dict[str, set], hint: str, on_grid=None) -> str:
    """video_frame_pts's hint, naming the real cause where the data's own timestamps are off the fps grid
    (frame_index_contiguous failed for those episodes): the lookups follow the timestamp column, so from_timestamp
    is not the thing to fix there. For wall-clock timestamps, ``on_grid(episodes)`` (:func:`_clips_on_grid`) tells
    the advice: clips holding exactly their frames on the fps grid are read by position (``align="frame_index"``;
    a tolerance as large as the drift would pick another row's frame), other clips with a tolerance_s."""
    off = failing.get("video_frame_pts", set()) & failing.get("frame_index_contiguous", set())
    if not off:
        return hint
    n = len(failing["video_frame_pts"])
    eps = ", ".join(map(str, sorted(off)[:5])) + (", ..." if len(off) > 5 else "")
    rest = "" if len(off) == n else f"; for the other {n - len(off)} episode(s): {hint}"
    grid = on_grid(sorted(off)) if on_grid is not None else set()
    if grid >= off:
        wall = ("if they are wall-clock times, read the frames by their position: these episodes' clips hold exactly "
                "their frames on the fps grid, so dataset(..., align=\"frame_index\") gives each row its own frame "
                "(a tolerance_s as large as the drift would pick the frame nearest each wall-clock time: another "
                "row's)")
    else:
        wall = ("if they are wall-clock times and the videos' frames follow the same clock (these clips do not hold "
                "exactly their frames on the fps grid), pass a tolerance_s as large as the drift (frames outside an "
                "episode's clip are never served)")
    return (f"{len(off)} of these {n} episode(s) (episodes {eps}) have timestamps that are not frame_index / fps in "
            "the data files (see frame_index_contiguous): frames are looked up at from_timestamp + timestamp, so "
            f"fix the timestamp column (or info.json's fps) first; {wall}{rest}")


def _clips_on_grid(db, episodes) -> set[int]:
    """Of ``episodes``, those whose clip in every camera's mp4 holds exactly its frames in data/ on the fps grid: from
    the clip's first frame (the first no earlier than half a frame before from_timestamp), ``length`` frames each
    within a quarter frame of ``from_timestamp + k / fps`` (:data:`lerobot_sql._readers.locate.GRID_FRAMES`), as
    ``dataset(align="frame_index")`` requires. Reads the video index (``video_frames``); error path only."""
    from ._readers.locate import GRID_FRAMES

    eps = ", ".join(str(int(e)) for e in episodes)
    if not eps:
        return set()
    rows = db.con.sql(db.check(
        f"WITH n AS (SELECT episode_index, count(*) AS length FROM frames WHERE episode_index IN ({eps}) GROUP BY 1), "
        "c AS (SELECT v.video_key, v.path, v.episode_index, v.from_timestamp, n.length FROM videos v JOIN n "
        "USING (episode_index)), "
        "a AS (SELECT c.video_key, c.path, c.episode_index, c.from_timestamp, c.length, min(vf.frame) AS first "
        "FROM c JOIN video_frames vf ON vf.video_key = c.video_key AND vf.path = c.path "
        "AND vf.pts_s >= c.from_timestamp - 0.5 / (SELECT fps FROM info) GROUP BY ALL) "
        "SELECT a.episode_index, bool_and(a.n_grid = a.length) AS ok FROM (SELECT a.*, count(vf.frame) AS n_grid "
        "FROM a LEFT JOIN video_frames vf ON vf.video_key = a.video_key AND vf.path = a.path "
        "AND vf.frame BETWEEN a.first AND a.first + a.length - 1 "
        "AND abs(vf.pts_s - (a.from_timestamp + (vf.frame - a.first) / (SELECT fps FROM info))) "
        f"<= {GRID_FRAMES} / (SELECT fps FROM info) GROUP BY ALL) a GROUP BY 1")).fetchall()
    return {int(e) for e, ok in rows if ok}


def _video_skip(db, spec: Spec, check_video: bool, n_files: int, n_missing: int, index_ready: str | None,
                n_clips: int | None = None) -> str | None:
    """Why a check that needs the videos (``spec.needs``) cannot run, or None: no mp4 at all; for the video index,
    video checks disabled, every file missing (with some present, those are indexed and checked), or the index
    that could not be built; for a check of clips (``spec.clips``), no clip with both bounds."""
    if spec.needs and not n_files:
        return ("no video features" if not db.layout.video_keys else
                "meta/episodes points to no mp4 (see video_pointers_present)")
    if spec.needs == "index" and not check_video:
        return "video checks disabled"
    if spec.needs == "index" and n_missing and n_missing >= n_files:
        return f"{n_missing} video file(s) missing, none to index (see video_files_present)"
    if spec.needs == "index" and index_ready:
        return index_ready
    if spec.clips and n_files and n_clips == 0:
        return ("no clip has bounds: meta/episodes has no videos/<camera>/from_timestamp and to_timestamp (see "
                "video_pointers_present); the mp4s themselves are checked")
    return None


def _hint(db, spec: Spec) -> str:
    """``spec.hint`` with the folders it names for downloads as this dataset's templates have them (info.json's
    video_path and data_path: a dataset may keep its mp4s under video/, not videos/)."""
    hint = spec.hint
    for default, template in (("'videos/*'", db.layout.video_path), ("'data/*'", db.layout.data_path)):
        if default in hint and template:
            hint = hint.replace(default, repr(_download_pattern(template)))
    return hint


def _download_pattern(template: str) -> str:
    """The ``allow_patterns`` of a path template's files: its first fixed folder and everything under it
    (``videos/{video_key}/...`` -> ``videos/*``), or the template with each field a ``*`` when it starts with a
    field."""
    import re

    head = template.split("{", 1)[0]
    if "/" in head:
        return head.split("/", 1)[0] + "/*"
    return re.sub(r"\{[^}]*\}", "*", template)


def _decode_check(db, decode: bool, check_video: bool, n_files: int, n_missing: int, index_ready: str | None,
                  progress: bool | None) -> Check:
    """The :data:`DECODE` check: skipped (with why) unless ``decode`` and the video index is there, else one
    violation row per mp4 that does not decode as indexed (:func:`_undecodable_videos`)."""
    spec = DECODE
    skipped = DECODE_OFF if n_files and not decode else \
        _video_skip(db, spec, check_video, n_files, n_missing, index_ready)
    if skipped:
        return Check(spec.name, True, 0, [], spec.hint, spec.severity, DECODE_DESCRIPTION, skipped)
    try:
        bad = _undecodable_videos(db, progress)
    except (duckdb.Error, LeRobotSQLError) as e:  # the videos / episodes views cannot be read: as a query check
        return Check(spec.name, False, 1, [{"error": f"{type(e).__name__}: {e}"}], _could_not_run(e, spec),
                     spec.severity, DECODE_DESCRIPTION)
    hint = spec.hint
    if any(r["n_out_of_order"] and r["codec"] in ("hevc", "h264") for r in bad):
        hint += "; " + _OPEN_GOP
    # the file's last frames never decoded (the first offending is frame n - n_missing), with or without an error:
    # dav1d refuses the packet a cut goes through, FFmpeg's H.264 decoder takes it silently
    cut = [bool(r["n_missing"] and r["frames_decoded"] and r["frame"] == r["frames_in_index"] - r["n_missing"])
           for r in bad]
    if any(cut):
        hint += "; " + _CUT
    if any(r["n_bad_seeks"] for r in bad):
        hint += "; " + _SEEK
    if any(r["error"] and not c for r, c in zip(bad, cut)):
        hint += "; " + _DAMAGED
    return Check(spec.name, not bad, len(bad), bad[:SAMPLE_ROWS], hint, spec.severity, DECODE_DESCRIPTION)


def _stats_json_check(db) -> Check:
    """The :data:`STATS_JSON` check: skipped without meta/stats.json (stats_present checks the per-episode ones),
    else meta/stats.json read as :meth:`lerobot_sql.Database.stats` reads it; its DatasetFormatError (the file,
    the feature, the statistic) is the one violation row."""
    spec = STATS_JSON
    if not db.source.exists("meta/stats.json"):
        return Check(spec.name, True, 0, [], spec.hint, spec.severity, STATS_JSON_DESCRIPTION, "no meta/stats.json")
    try:
        db.stats()
    except DatasetFormatError as e:
        return Check(spec.name, False, 1, [{"error": str(e)}], spec.hint, spec.severity, STATS_JSON_DESCRIPTION)
    return Check(spec.name, True, 0, [], spec.hint, spec.severity, STATS_JSON_DESCRIPTION)


def _image_decode_check(db, decode: bool) -> Check:
    """The :data:`IMAGE_DECODE` check: skipped without image features or unless ``decode``, else one violation row
    per image cell that does not decode (:func:`lerobot_sql._readers.verify.undecodable_images`)."""
    spec = IMAGE_DECODE
    skipped = "no image features" if not db.layout.image_keys else None if decode else IMAGE_DECODE_OFF
    if skipped:
        return Check(spec.name, True, 0, [], spec.hint, spec.severity, IMAGE_DECODE_DESCRIPTION, skipped)
    bad = verify.undecodable_images(db.source, db.layout)
    return Check(spec.name, not bad, len(bad), bad[:SAMPLE_ROWS], spec.hint, spec.severity, IMAGE_DECODE_DESCRIPTION)


def _undecodable_videos(db, progress: bool | None = None) -> list[dict[str, Any]]:
    """Every readable mp4 of the ``video_files`` view decoded and compared with its video index, the clips of the
    ``videos`` view telling which episodes a finding touches (:func:`lerobot_sql._readers.verify.undecodable_videos`).

    Returns:
        One dict per mp4 that fails, ordered by video_key and path: ``video_key``, ``path`` (relative to the root),
        ``codec``, ``problem`` (what was found, in words), ``frame`` / ``pts`` / ``pts_s`` (the first offending
        frame in presentation order: its ordinal in the file as ``video_frames.frame``, its pts in stream time-base
        units and in seconds), ``episodes`` (the episodes whose clip, from_timestamp up to the later of to_timestamp
        and from_timestamp + length / fps, holds an offending frame), ``frames_in_index``, ``frames_decoded``,
        ``n_out_of_order`` (frames output with a pts not above every pts output before them), ``n_missing`` (index
        pts never output), ``n_extra`` (output pts not in the index), ``n_bad_seeks`` (keyframes that decode in the
        forward pass but a seek to which decodes another frame first), ``error`` (the first decode error, None).

    Raises:
        LeRobotSQLError / duckdb.Error: the views cannot be read. A file that does not decode is a row, not an error.
    """
    def rows(sql: str) -> list[tuple]:
        return db.con.sql(db.check(sql)).fetchall()

    fps = float(rows("SELECT fps FROM info")[0][0])
    files = rows("SELECT video_key, path, codec FROM video_files WHERE present AND codec IS NOT NULL "
                 "ORDER BY video_key, path")
    clips: dict[tuple[str, str], list[tuple]] = {}
    for key, rel, ep, lo, hi, n in rows(
            "SELECT v.video_key, v.path, v.episode_index, v.from_timestamp, v.to_timestamp, e.length "
            "FROM videos v JOIN episodes e USING (episode_index) WHERE v.from_timestamp IS NOT NULL "
            "ORDER BY v.episode_index"):
        # A clip ends at to_timestamp (lerobot: from + length / fps) or, where the writer stored its last frame's
        # time (from + (length - 1) / fps), one frame later; frames are placed half a frame either side.
        ends = [x for x in (hi, None if n is None else lo + n / fps) if x is not None]
        end = max(ends) if ends else lo + 1 / fps
        clips.setdefault((key, rel), []).append((ep, lo - 0.5 / fps, end - 0.5 / fps))
    return verify.undecodable_videos(db.source, db.cache_dir, files, clips, progress)



# ---- per episode: the episode_quality view ----------------------------------------------------------------------
@dataclasses.dataclass
class EpisodeReport:
    """The verdicts of the ``episode_quality`` view (docs/curate.md): ``counts`` (verdict -> episodes), ``reasons``
    (reason -> episodes), ``worst`` (the worst episodes: ``exclude`` before ``review``, more reasons first, as dicts
    of ``episode_index``, ``verdict``, ``reasons``, ``length``, ``rows``), ``ok``: no episode is ``exclude``."""

    dataset: str
    counts: dict[str, int]
    reasons: dict[str, int]
    worst: list[dict[str, Any]]
    thresholds: dict[str, float]

    @property
    def ok(self) -> bool:
        return not self.counts.get("exclude")

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps({**dataclasses.asdict(self), "ok": self.ok}, indent=indent, default=str)

    def to_text(self) -> str:
        total = sum(self.counts.values())
        lines = [f"lerobot-sql doctor --episodes: {self.dataset}: {total} episode(s): "
                 + ", ".join(f"{self.counts.get(v, 0)} {v}" for v in ("pass", "review", "exclude"))]
        if self.reasons:
            lines.append("  reasons: " + ", ".join(f"{r} {n}" for r, n in self.reasons.items()))
        if self.worst:
            lines.append(f"  worst {len(self.worst)}:")
            for row in self.worst:
                lines.append(f"    episode {row['episode_index']}: {row['verdict']} ({', '.join(row['reasons'])}); "
                             f"length {row['length']}, rows {row['rows']}")
            lines.append("  hint: SELECT * FROM episode_quality WHERE episode_index = N has the facts behind a "
                         "verdict (docs/curate.md); train on the rest: SELECT episode_index FROM episode_quality "
                         "WHERE verdict = 'pass'")
        elif total:  # (nothing to list: say so, and where the facts are)
            lines.append("  every episode passes: no episode to list. SELECT * FROM episode_quality has the facts "
                         "behind each verdict; --threshold NAME=VALUE makes a check stricter (docs/curate.md)")
        return "\n".join(lines)


def episodes(db, *, worst: int = 20, **thresholds: float) -> EpisodeReport:
    """The per-episode verdicts of ``db``'s ``episode_quality`` view, with ``thresholds`` changed first
    (:meth:`lerobot_sql.Database.quality_thresholds`).

    Raises:
        TypeError, ValueError: as ``quality_thresholds``. MissingFileError, DatasetFormatError: a data file gone or
            unreadable.
    """
    t = db.quality_thresholds(**thresholds)
    counts = dict(db.sql("SELECT verdict, count(*) FROM episode_quality GROUP BY 1 ORDER BY 1").fetchall())
    reasons = dict(db.sql("SELECT r, count(*) FROM (SELECT unnest(reasons) AS r FROM episode_quality) GROUP BY 1 "
                          "ORDER BY 2 DESC, 1").fetchall())
    rows = db.sql("SELECT episode_index, verdict, reasons, length, rows FROM episode_quality WHERE verdict <> 'pass' "
                  "ORDER BY verdict = 'exclude' DESC, len(reasons) DESC, episode_index "
                  f"LIMIT {max(0, int(worst))}").fetchall()
    worst_rows = [{"episode_index": e, "verdict": v, "reasons": list(r), "length": n, "rows": k}
                  for e, v, r, n, k in rows]
    return EpisodeReport(str(db.source.url), counts, reasons, worst_rows, t)
