"""``lerobot-sql doctor``: the format's invariants (spec section 8) run as SQL over the views, with a report.

Each check is one named query in ``queries/doctor/<check>.sql`` that returns one row per violation; no rows means
the check passed. Every check also runs alone, ``db.named_query("doctor/<check>")``: what SQL cannot do comes from views
the Database builds on first use, ``video_files`` (file existence, size and stream codec, probed by
:func:`lerobot_sql._readers.video_index.probe_video_files`) and ``video_frames`` (the video index, by demuxing).
``run`` builds the video index only when every video file is present.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import duckdb
import pyarrow as pa

from ._catalog.connection import query_error
from ._query import library
from .errors import DatasetFormatError, LeRobotSQLError

SAMPLE_ROWS = 5


@dataclasses.dataclass(frozen=True)
class Spec:
    """A check: its query name, what it needs, how bad a failure is and what to do about it."""

    name: str
    hint: str
    severity: str = "error"          # "error" makes the report fail; "warning" is reported only
    needs: str = ""                  # "" (metadata and data), "videos" (files present), "index" (video_frames)
    params: tuple[str, ...] = ()     # which run() parameters the query takes


CHECKS: tuple[Spec, ...] = (
    Spec("episode_index_contiguous", "renumber meta/episodes to 0..N-1 in order, or fix total_episodes in info.json"),
    Spec("index_contiguous", "rewrite the data files' `index` as 0..n-1 (lerobot's writer does), or fix total_frames"),
    Spec("frame_index_contiguous", "frame_index must restart at 0 in each episode and timestamp equal "
         "frame_index / fps; rewrite the episode's rows", params=("tolerance_s",)),
    Spec("episode_ranges", "recompute length, dataset_from_index and dataset_to_index from the data files; "
         "lerobot_sql reads rows by episode_index, but lerobot trusts these ranges"),
    Spec("data_file_pointers", "rewrite data/chunk_index and data/file_index in meta/episodes from the file holding "
         "each episode (a known converter bug, lerobot issue #2401)"),
    Spec("data_files_present", "download the missing data files (e.g. huggingface_hub.snapshot_download with "
         "allow_patterns='data/*'); until then queries over frames lack their episodes"),
    Spec("data_files_stray", "move these files out of data/ (or rename them to match info.json's data_path if they "
         "are the dataset's own): they are not read as frames, but tools that read data/ whole take them in",
         severity="warning"),
    Spec("data_files_decode", "re-download the named data files: a page does not decode (damaged or partial copy)"),
    Spec("tasks_exist", "add the missing tasks to meta/tasks.parquet (tasks.jsonl for v2.x) or fix task_index"),
    Spec("stats_present", "recompute per-episode statistics (lerobot's compute_episode_stats); normalisation needs "
         "them"),
    Spec("video_pointers_present", "restore the videos/<key>/chunk_index, file_index, from_timestamp and "
         "to_timestamp columns of meta/episodes from the dataset's source (or rewrite them from the mp4s); until then "
         "that camera's frames cannot be located (cameras=[] reads the tabular data)"),
    Spec("video_files_present", "download the missing mp4s (e.g. huggingface_hub.snapshot_download with "
         "allow_patterns='videos/*'); frames of those cameras cannot be read", needs="videos"),
    Spec("video_files_readable", "re-download the named mp4s (an empty or unreadable file: the frames of that camera "
         "cannot be read, and the video index checks below cannot run on it)", needs="videos"),
    Spec("video_files_complete", "re-download the truncated mp4s: frames past the cut cannot be decoded",
         needs="index"),
    Spec("video_codec", "info.json mislabels the stream's codec; decoding follows the file, so this only misleads "
         "tools that trust info.json", severity="warning", needs="videos"),
    Spec("video_segments", "fix videos/<key>/from_timestamp and to_timestamp in meta/episodes: clips must last "
         "length / fps and chain within a file", params=("tolerance_s",)),
    Spec("video_segments_end_convention", "to_timestamp marks the clip's last frame ((length - 1) / fps after "
         "from_timestamp), not its end (length / fps, as lerobot writes): both readers decode it correctly; rewrite "
         "to_timestamp = from_timestamp + length / fps for tools that treat [from, to) as the clip's span",
         severity="warning", params=("tolerance_s",)),
    Spec("video_segment_frames", "the clip's real frames do not match its length: re-encode the episode or fix "
         "from/to_timestamp", needs="index", params=("tolerance_s",)),
    Spec("video_clip_frames", "an episode's clip overlaps another clip or runs past the file's end in the mp4's real "
         "frames, so its items would be another episode's frames (the items reading that mp4 raise): fix "
         "videos/<key>/from_timestamp so each clip starts on the frame after the previous episode's last",
         needs="index"),
    Spec("video_stream_rate", "the mp4's frame rate is not info.json's fps: frames are looked up by time (the real "
         "pts), so fix 'fps' in info.json if the data's timestamps follow the video, or re-encode the video at the "
         "dataset's fps; frames whose time has no video frame are listed by video_frame_pts", severity="warning",
         needs="index"),
    Spec("video_frame_pts", "from_timestamp drifts from the file's real pts (lerobot issue #3177): recompute "
         "from_timestamp from the video, or pass a larger tolerance_s if the drift is known and harmless",
         needs="index", params=("tolerance_s",)),
)


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


def _undecodable(db) -> list[dict[str, Any]]:
    """The data files (and first row group) pyarrow cannot decode: ``path``, ``row_group`` (None: the footer),
    ``error``."""
    import pyarrow.parquet as pq

    bad = []
    for rel in db.layout.data_files:
        try:
            with db.source.open(rel) as f:
                pf = pq.ParquetFile(f)
                for rg in range(pf.num_row_groups):
                    try:
                        pf.read_row_group(rg)
                    except (pa.ArrowException, OSError) as e:
                        bad.append({"path": rel, "row_group": rg, "error": f"{type(e).__name__}: {e}"})
                        break
        except (pa.ArrowException, OSError) as e:
            bad.append({"path": rel, "row_group": None, "error": f"{type(e).__name__}: {e}"})
    return bad


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
                first = pf.read_row_group(0, columns=cols).slice(0, 1)
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
            attribute, set by :func:`lerobot_sql._format.layout.check_info`, names the info.json key).
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


def run(db, *, tolerance_s: float = 1e-4, check_video: bool = True) -> Report:
    """Run every check on ``db`` (a :class:`lerobot_sql.Database`) and return the :class:`Report`.

    Args:
        tolerance_s: seconds allowed between a frame's expected time and the real pts, and for clip bounds.
        check_video: also build the video index (demux every mp4 once, cached), check every frame's pts and the
            codec labels. With False only the files' existence and the clip metadata are checked for videos.

    A check whose query fails (e.g. a column missing from meta/episodes) is reported as failed with DuckDB's
    message; nothing is raised for a broken dataset.
    """
    params = {"tolerance_s": float(tolerance_s)}
    try:  # the views read meta/episodes, tasks and every data footer: an unreadable one stops every check
        db.con
    except LeRobotSQLError as e:
        return Report(db.source.url, db.layout.version, float(tolerance_s), [Check(
            "metadata_readable", False, 1, [{"error": f"{type(e).__name__}: {e}"}],
            "re-download the named file; no other check can run until the metadata and data footers read",
            "error", "the metadata files and data file footers can be read")])
    # Reading video_files makes the Database probe the mp4s (once per connection).
    n_files, n_missing = db.con.sql(db.check(
        "SELECT count(*), count(*) FILTER (WHERE NOT present) FROM video_files")).fetchall()[0]
    index_ready: str | None = None
    if n_files and check_video and not n_missing:
        try:
            db.check("SELECT * FROM video_frames")  # builds the video index (view video_frames) on first use
        except LeRobotSQLError as e:
            index_ready = f"the video index could not be built: {e}"
    checks = []
    failing: dict[str, set] = {}  # check -> episodes it found bad (for hints that name the real cause)
    for spec in CHECKS:
        nq = library.load(f"doctor/{spec.name}")
        skipped = None
        if spec.needs and not n_files:
            skipped = ("no video features" if not db.layout.video_keys else
                       "meta/episodes points to no mp4 (see video_pointers_present)")
        elif spec.needs == "index" and not check_video:
            skipped = "video checks disabled"
        elif spec.name == "video_codec" and not check_video:
            skipped = "video checks disabled"
        elif spec.needs == "index" and n_missing:
            skipped = f"{n_missing} video file(s) missing"
        elif spec.needs == "index" and index_ready:
            skipped = index_ready
        elif spec.name == "stats_present" and db.layout.legacy and not db.layout.episode_stats_file:
            skipped = "v2.0 keeps no per-episode statistics (meta/stats.json only)"
        if skipped:
            checks.append(Check(spec.name, True, 0, [], spec.hint, spec.severity, nq.description, skipped))
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
                bad = _undecodable(db)
                if bad:
                    checks.append(Check(spec.name, False, len(bad), bad[:SAMPLE_ROWS], spec.hint, spec.severity,
                                        nq.description))
                    continue
            if isinstance(e, duckdb.Error):  # as db.sql words it: a damaged data file is named as such
                e = query_error(e, sql)
            checks.append(Check(spec.name, False, 1, [{"error": f"{type(e).__name__}: {e}"}], _could_not_run(e, spec),
                                spec.severity, nq.description))
            continue
        hint = spec.hint
        if "episode_index" in result.column_names and result.num_rows:
            failing[spec.name] = set(result["episode_index"].to_pylist())
            if spec.name == "video_frame_pts":
                hint = _frame_pts_hint(failing, hint)
        checks.append(Check(spec.name, result.num_rows == 0, result.num_rows,
                            result.slice(0, SAMPLE_ROWS).to_pylist(), hint, spec.severity, nq.description))
    return Report(db.source.url, db.layout.version, float(tolerance_s), checks)


def _frame_pts_hint(failing: dict[str, set], hint: str) -> str:
    """video_frame_pts's hint, naming the real cause where the data's own timestamps are off the fps grid
    (frame_index_contiguous failed for those episodes): the lookups follow the timestamp column, so from_timestamp
    is not the thing to fix there."""
    off = failing.get("video_frame_pts", set()) & failing.get("frame_index_contiguous", set())
    if not off:
        return hint
    n = len(failing["video_frame_pts"])
    eps = ", ".join(map(str, sorted(off)[:5])) + (", ..." if len(off) > 5 else "")
    rest = "" if len(off) == n else f"; for the other {n - len(off)} episode(s): {hint}"
    return (f"{len(off)} of these {n} episode(s) (episodes {eps}) have timestamps that are not frame_index / fps in "
            "the data files (see frame_index_contiguous): frames are looked up at from_timestamp + timestamp, so "
            "fix the timestamp column (or info.json's fps) first, or pass a tolerance_s as large as the drift if the "
            f"timestamps are wall-clock{rest}")
