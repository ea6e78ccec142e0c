"""``lerobot-sql``: the command line. Each subcommand is a small ``cmd_<name>(args) -> int`` function.

Exit codes: 0 success, 1 failure (a :class:`LeRobotSQLError`, an I/O error, ``doctor`` finding problems),
2 usage error (argparse, options that do not fit together, an unknown ``--name`` or a bad ``--param``), 130
interrupted. Errors print as ``error: <message>`` plus a ``hint:`` line on stderr;
set ``LSQL_DEBUG=1`` for the traceback. The interactive prompt lives in :mod:`lerobot_sql.cli.shell`; what both print
(result writers, error and hint lines) in :mod:`lerobot_sql.cli.output`.

Over 400 lines on purpose: the parser with its help texts and examples and the handlers are the whole CLI surface
and read best side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import LeRobotSQLError, MissingFileError, QueryError, QueryInterrupted, did_you_mean
from .output import (
    UsageError,
    error_hint,
    format_of,
    named_sql,
    one_line,
    print_table,
    run_sql,
    views_and_columns,
    write_result,
)

REPO = Path(__file__).resolve().parents[2]  # the checkout: lerobot_sql/cli/commands.py -> ../../..

EPILOG = """\
examples:
  lerobot-sql info sample/small20
  lerobot-sql schema sample/small20 episodes
  lerobot-sql query sample/small20 "SELECT episode_index, length, tasks FROM episodes WHERE length > 300"
  lerobot-sql query sample/small20 "SELECT * FROM frames WHERE episode_index = 3" -f parquet -o ep3.parquet
  lerobot-sql query --list
  lerobot-sql query sample/small20 --name NAME --param key=value
  lerobot-sql export sample/small20 /tmp/long_eps --sql "SELECT episode_index FROM episodes WHERE length > 300"
  lerobot-sql view sample/small20 --sql "SELECT episode_index, 1.0 AS start_s, 3.0 AS end_s FROM episodes" -o clips.html
  lerobot-sql index sample/small20 && lerobot-sql doctor sample/small20
  lerobot-sql shell sample/small20

DATASET is the root of a LeRobot v3.0 (or v2.0/v2.1) dataset (the folder holding meta/, data/, videos/) or an fsspec URL.
"""


# ---- helpers -------------------------------------------------------------------------------------------------------
def _seconds(text: str) -> float:
    """A finite number of seconds > 0 (``--timeout``, ``--tolerance-s``: what ``dataset()`` and ``doctor.run``
    accept; 0, a negative or NaN tolerance matches no frame, so doctor would fail a healthy dataset with wrong fixes
    and export end in a traceback; inf any frame)."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return v


def _at_least(lo: int, what: str):
    """An argparse type: an integer >= ``lo``; ``what`` says what is expected in the error."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < lo:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    return parse


_rows = _at_least(0, "a number of rows >= 0 (0 = all)")  # --max-rows
_count = _at_least(1, "a whole number >= 1")  # --max-clips


def _megabytes(text: str) -> float:
    """A finite number of megabytes > 0 (``--max-mb``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of megabytes, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of megabytes > 0, got {text!r}")
    return v


def _param(text: str) -> tuple[str, str]:
    """``key=value`` -> (key, value). Values stay strings: the library parses them by the declared type."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), raw


def _attach(text: str) -> tuple[str, str]:
    """``NAME=PATH`` -> (name, path) of --attach."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH (a view name and a Parquet, CSV or JSON file), got "
                                         f"{text!r}")
    return name.strip(), path


ATTACH_HELP = ("make a Parquet, CSV or JSON file (a local path or URL: your own, anywhere) a view NAME beside the "
               "dataset's, e.g. --attach keep=keep.csv to JOIN keep USING (episode_index) (repeatable)")


DATASET_HELP = ("dataset root (holds meta/, data/, videos/) or URL; several datasets (a collection, every view with a "
                "dataset column): a comma-separated list a,b,c, a glob 'data/*', or a folder whose sub-folders (one "
                "or two levels down) are datasets")


ONE_DATASET_HELP = ("dataset root (holds meta/, data/, videos/) or URL; one dataset (for several, run the command "
                    "once per dataset)")


def _collection_sources(text: str) -> list[str] | str | None:
    """What DATASET names when it is a collection: a comma-separated list (``a,b,c``), a glob, or a local folder
    of datasets; None for one dataset (an existing path is always taken as it is)."""
    from ..collection import is_dataset_root

    if os.path.exists(text):
        return text if os.path.isdir(text) and not is_dataset_root(text) else None
    if "," in text:
        return [p.strip() for p in text.split(",") if p.strip()]
    if "://" not in text and any(ch in text for ch in "*?["):
        return text
    return None


def _connect(args, collection_ok: bool = True):
    """The Database of DATASET, or the Collection when DATASET is a list, a glob or a folder of datasets."""
    import lerobot_sql as lsql

    kw = {"cache_dir": args.cache_dir} if getattr(args, "cache_dir", None) else {}
    many = _collection_sources(os.fspath(args.dataset))
    if many is not None:
        if not collection_ok:
            raise UsageError(f"{args.dataset} names several datasets; this command takes one dataset root")
        if getattr(args, "query_dir", None) or getattr(args, "name", None):
            raise UsageError("named queries (--name, --query-dir) are written for one dataset; over a collection "
                             "give the SQL itself (every view has a dataset column)")
        return _attached(lsql.connect_many(many, **kw), args)
    db = lsql.connect(args.dataset, **kw)
    for d in getattr(args, "query_dir", None) or []:
        db.add_query_dir(d)
    return _attached(db, args)


def _attached(db, args):
    """``db`` with the tables of ``--attach NAME=PATH`` attached (:meth:`lerobot_sql.Database.attach`)."""
    from ..errors import LeRobotSQLError

    for name, path in getattr(args, "attach", None) or []:
        try:
            db.attach(name, path)
        except (ValueError, TypeError) as e:
            if isinstance(e, LeRobotSQLError):
                raise
            raise UsageError(f"--attach {name}={path}: {e}") from e
    return db


def _info_collection(coll, as_json: bool) -> int:
    rows = coll.sql("SELECT d.dataset, d.codebase_version, d.robot_type, d.fps, count(e.episode_index), "
                    "coalesce(sum(e.length), 0), d.total_tasks, d.camera_keys, d.root FROM datasets d "
                    "LEFT JOIN episodes e USING (dataset) GROUP BY ALL").fetchall()
    order = {n: i for i, n in enumerate(coll.names)}
    rows.sort(key=lambda r: order[r[0]])
    out = [{"dataset": r[0], "codebase_version": r[1], "robot_type": r[2], "fps": r[3], "episodes": r[4],
            "frames": int(r[5]), "tasks": r[6], "duration_s": round(int(r[5]) / r[3], 3), "cameras": r[7],
            "root": r[8]} for r in rows]
    if as_json:
        print(json.dumps({"datasets": out, "episodes": sum(r["episodes"] for r in out),
                          "frames": sum(r["frames"] for r in out)}, indent=2))
        return 0
    w = max(len(r["dataset"]) for r in out)
    print(f"collection   {len(out)} datasets   episodes {sum(r['episodes'] for r in out)}   frames "
          f"{sum(r['frames'] for r in out)}   duration {sum(r['duration_s'] for r in out) / 3600:.2f} h")
    for r in out:
        print(f"  {r['dataset']:<{w}}  {r['codebase_version']:<5} {str(r['robot_type']):<16} {r['fps']:>5g} fps  "
              f"{r['episodes']:>6} episodes {r['frames']:>9} frames  {len(r['cameras'])} cameras  {r['root']}")
    return 0


def _sql_from(args, db, *, required: bool = True, default: str | None = None) -> str | None:
    """The SQL text of ``--sql``/positional SQL (``-`` reads stdin) or of the named query ``--name`` rendered."""
    sql = getattr(args, "sql", None)
    if sql == "-":
        sql = sys.stdin.read()
    name = getattr(args, "name", None)
    if sql and name:
        raise UsageError(f"give either {getattr(args, 'sql_spelling', 'SQL')} or --name, not both")
    if getattr(args, "param", None) and not name:
        raise UsageError("--param only applies to a named query (--name NAME)")
    if name:
        return named_sql(db, name, dict(args.param or []))
    if not sql and required and default is None:
        how = getattr(args, "sql_spelling", "SQL")
        raise UsageError(f"no query: give {how} (or {how.replace('SQL', '-')} to read it from stdin) or --name NAME")
    return sql or default


# ---- subcommands ---------------------------------------------------------------------------------------------------
def _manifest_or_sql(args, sql: str | None) -> str | Path | None:
    """``--sql`` naming an existing ``*.parquet`` file is that manifest file, handed on as a Path (the library reads a
    str as SQL); anything else, and a named query's SQL, stays text."""
    if getattr(args, "name", None) or not sql:
        return sql
    path = os.path.expanduser(sql.strip())
    return Path(path) if path.endswith(".parquet") and os.path.isfile(path) else sql


def cmd_info(args) -> int:
    db = _connect(args)
    if not hasattr(db, "layout"):  # a collection
        return _info_collection(db, args.json)
    lay = db.layout
    ep = db.sql("SELECT count(*), sum(length), min(length), max(length) FROM episodes").fetchall()[0]
    note = ""
    if not ep[0]:  # a metadata-only copy: fall back to the totals info.json states
        ep = (lay.info.get("total_episodes"), lay.info.get("total_frames"), None, None)
        note = "   (totals from info.json: no episode metadata files here)"
    n_tasks = db.sql("SELECT count(*) FROM tasks").fetchall()[0][0]
    feats = []
    for k, f in lay.features.items():
        detail = ""
        if f.is_video:
            i = f.info
            detail = f"{i.get('video.codec', '?')} {i.get('video.pix_fmt', '')} {i.get('video.fps', '')} fps".strip()
        elif f.flat_names:
            detail = ", ".join(f.flat_names)
        feats.append({"name": k, "dtype": f.dtype, "shape": list(f.shape), "detail": detail})
    videos = db.sql("SELECT count(DISTINCT path) FROM videos").fetchall()[0][0]
    info = {
        "dataset": db.source.url, "codebase_version": lay.version, "robot_type": lay.info.get("robot_type"),
        "fps": lay.fps, "episodes": ep[0], "frames": ep[1], "tasks": n_tasks,
        "duration_s": round((ep[1] or 0) / lay.fps, 3), "episode_length": [ep[2], ep[3]],
        "cameras": lay.camera_keys, "files": {"data": len(lay.data_files), "episodes": len(lay.episode_files),
                                              "video": videos},
        "features": feats,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"dataset      {info['dataset']}")
    print(f"format       {lay.version}   robot_type {info['robot_type']}   fps {lay.fps:g}")
    lengths = f"   episode length {ep[2]}..{ep[3]} frames" if ep[2] is not None else ""
    print(f"episodes     {ep[0]}   frames {ep[1]}   tasks {n_tasks}   duration {info['duration_s']:.1f} s"
          f"{lengths}{note}")
    print(f"files        {len(lay.data_files)} data, {len(lay.episode_files)} episode metadata, {videos} video")
    print("features")
    w = max(len(f["name"]) for f in feats)
    for f in feats:
        shape = str(tuple(f["shape"]))
        print(f"  {f['name']:<{w}}  {f['dtype']:<8} {shape:<14} {f['detail']}".rstrip())
    return 0


def cmd_schema(args) -> int:
    db = _connect(args)
    views = views_and_columns(db)
    if args.view:
        if args.view not in views:
            raise QueryError(f"unknown view {args.view!r}.{did_you_mean(args.view, views)} "
                             f"Views: {sorted(views)}")
        views = {args.view: views[args.view]}
    if args.json:
        print(json.dumps({v: [{"column": c, "type": t} for c, t in cols] for v, cols in views.items()}, indent=2))
        return 0
    for v, cols in views.items():
        note = "  (built from the mp4 files on first use; see `lerobot-sql index`)" if v == "video_frames" else ""
        print(f"{v}{note}")
        w = max((len(c) for c, _ in cols), default=0)
        for c, t in cols:
            print(f"  {c:<{w}}  {t}")
    return 0


def cmd_query(args) -> int:
    if args.list:
        import textwrap

        from .._query import library

        width = min(shutil.get_terminal_size().columns, 110)
        for e in library.list_queries(extra_dirs=[Path(d) for d in args.query_dir or []]):
            print(e["name"])
            desc = (e.get("description") or "").split(". ")[0].rstrip(".")  # the first sentence
            if desc:
                print(textwrap.fill(desc + ".", width, initial_indent="    ", subsequent_indent="    "))
            for prm in e.get("params") or []:
                need = "required" if prm.get("required") else f"default {prm.get('default')!r}"
                if prm.get("bound"):  # enforced by the library: shown so a refused value is no surprise
                    need += f", {prm['bound'][0]} {prm['bound'][1]:g}"
                print(textwrap.fill(f"-p {prm['name']}={str(prm.get('type', '')).upper()}  ({need}) "
                                    f"{prm.get('doc') or ''}".rstrip(), width, initial_indent="    ",
                                    subsequent_indent="        "))
        return 0
    if not args.dataset:
        raise UsageError("DATASET is required (except with --list)")
    db = _connect(args)
    fmt = format_of(args.format, args.output)
    try:
        dest = None if args.output in (None, "-") else _output_file(db, args.output, fmt, args.overwrite)
        if args.name:
            if args.sql:
                raise UsageError(f"give either {getattr(args, 'sql_spelling', 'SQL')} or --name, not both")
            rel = run_sql(db, None, dict(args.param or []), name=args.name, timeout=args.timeout)
        else:
            rel = run_sql(db, _sql_from(args, db), timeout=args.timeout)
        if dest is None:
            write_result(rel, fmt, args.output, args.max_rows, timeout=args.timeout)
            return 0
        from ..export import destination

        # Under a temporary name, renamed into place only once complete: a query failing while it runs (a cast, the
        # timeout while rows are written) leaves the old file as it was.
        with destination.writing(dest):
            destination.write_file(dest, lambda tmp: write_result(rel, fmt, tmp, args.max_rows, timeout=args.timeout),
                                   overwrite=args.overwrite, what="query")
    except FileExistsError as e:  # the library speaks Python (overwrite=True); say the flag here
        raise type(e)(str(e).replace("overwrite=True", "--overwrite")) from e
    return 0


def _output_file(db, output: str, fmt: str, overwrite: bool) -> Path:
    """``-o FILE`` checked before the query runs, by export_manifest's rules (``destination.check_file_dest``): a
    local path, never inside (or holding) a source dataset (a collection: any of its datasets), not a folder, and
    not an existing file unless ``--overwrite``."""
    from ..export import destination

    dbs = [db[n] for n in db.names] if not hasattr(db, "layout") else [db]  # a collection: each of its datasets
    ext = {"table": "txt"}.get(fmt, fmt)
    return destination.check_file_dest(dbs, output, "lerobot-sql query -o", overwrite=overwrite,
                                       example=f"result.{ext}")


def _print_report(report: Any) -> None:
    """A report dataclass as aligned ``field  value`` lines (or its own ``to_text()``)."""
    import dataclasses

    if hasattr(report, "to_text"):
        print(report.to_text())
    elif dataclasses.is_dataclass(report):
        fields = dataclasses.asdict(report)
        w = max(map(len, fields))
        for k, v in fields.items():
            print(f"{k:<{w}}  {round(v, 3) if isinstance(v, float) else v}")
    elif report is not None:
        print(report)


def cmd_export(args) -> int:
    db = _connect(args)
    sql = _sql_from(args, db)
    if not hasattr(db, "layout"):  # a collection's export takes a saved collection manifest too
        sql = _manifest_or_sql(args, sql)
    try:
        kw = {}
        if getattr(args, "features", None):
            if hasattr(db, "layout"):
                raise UsageError("--features applies to an export over several datasets (DATASET a list, a glob or "
                                 "a folder); for one dataset, give it as a one-dataset list ('ROOT,') or, in Python, "
                                 "lsql.connect_many([root]).export(sql, dest, features=[...])")
            kw["features"] = [f.strip() for f in args.features.split(",") if f.strip()]
        if getattr(args, "align", "timestamp") != "timestamp":
            kw["align"] = args.align  # a collection: every dataset (Collection.export takes a per-dataset dict too)
        if getattr(args, "fps", None) is not None:
            if not hasattr(db, "layout"):
                raise UsageError("--fps applies to one dataset's export (a collection's datasets are exported at "
                                 "their own fps): export each dataset at the lower rate on its own")
            from .._readers import regrid

            try:  # a rate the dataset cannot be served at is a usage error (the rates that work named)
                regrid.stride(args.fps, db.layout.fps)
            except ValueError as e:
                raise UsageError(f"--fps: {e}") from None
            kw["fps"] = args.fps
        report = db.export(sql, args.dest, overwrite=args.overwrite, progress=not args.quiet,
                           tolerance_s=args.tolerance_s, **kw)
    except FileExistsError as e:  # the library speaks Python (overwrite=True); say the flag here
        raise FileExistsError(str(e).replace("overwrite=True", "--overwrite")) from e
    _print_report(report)
    return 0


def cmd_prefetch(args) -> int:
    from .. import prefetch

    db = _connect(args, collection_ok=False)
    sql = _manifest_or_sql(args, _sql_from(args, db, default="SELECT episode_index FROM episodes"))
    kw: dict[str, Any] = {"cameras": args.camera, "workers": args.workers}
    if args.delta_timestamps:
        try:
            kw["delta_timestamps"] = json.loads(args.delta_timestamps)
        except json.JSONDecodeError as e:
            raise UsageError(f"--delta-timestamps must be JSON such as '{{\"action\": [0, 0.0333]}}': {e}") from e
    _print_report(prefetch.prefetch(db, sql, progress=not args.quiet, **kw))
    return 0


def cmd_view(args) -> int:
    from ..display import show_clips
    from ..export import destination

    db = _connect(args, collection_ok=False)
    sql = _sql_from(args, db, default="SELECT episode_index FROM episodes ORDER BY episode_index")
    try:  # checked before any clip is cut: a page never lands inside the dataset, nor over a file unasked
        dest = destination.check_file_dest([db], args.output, "lerobot-sql view -o", overwrite=args.overwrite,
                                           example="clips.html")
        page = show_clips(db, sql, max_clips=args.max_clips, max_bytes=max(1, math.ceil(args.max_mb * (1 << 20))),
                          cameras=args.camera, signals=args.signal if args.signal is None or args.signal != ["-"]
                          else [], reencode=args.reencode, tolerance_s=args.tolerance_s, align=args.align)
        text = page.html()
        with destination.writing(dest):
            destination.write_file(dest, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"),
                                   overwrite=args.overwrite, what="view")
    except FileExistsError as e:  # the library speaks Python (overwrite=True); say the flag here
        raise type(e)(str(e).replace("overwrite=True", "--overwrite")) from e
    copied = sum(v.copied for c in page.cards for _, v in c.videos)
    print(f"wrote {dest}: {len(page.cards)} clips, {sum(len(c.videos) for c in page.cards)} camera clips "
          f"({copied} copied, {len(page.reencoded)} re-encoded), {len(text) / (1 << 20):.1f} MB, built in "
          f"{page.seconds:.2f} s")
    for note in page.left_out:
        print(f"left out: {note}")
    return 0


def cmd_index(args) -> int:
    db = _connect(args)
    files = db.sql("SELECT DISTINCT video_key, path FROM videos ORDER BY video_key, path").fetchall()
    if not files:
        print("no video features: nothing to index")
        return 0
    # One demux pass per mp4 (packets only, no decoding); results are cached and reused by db.dataset().
    db.build_video_index(progress=not args.quiet)
    files = "count(DISTINCT (dataset, path))" if not hasattr(db, "layout") else "count(DISTINCT path)"  # a collection
    rel = db.sql(f"SELECT video_key, {files} AS files, count(*) AS frames, "
                 "count(*) FILTER (WHERE is_keyframe) AS keyframes, "
                 "round(count(*) / greatest(count(*) FILTER (WHERE is_keyframe), 1), 2) AS mean_gop "
                 "FROM video_frames GROUP BY video_key ORDER BY video_key")
    print_table(rel, 0)
    where = db.cache_dir if hasattr(db, "cache_dir") else "each dataset's cache"
    print(f"index cached under {where}; the video_frames view now lists every frame")
    return 0


def cmd_doctor(args) -> int:
    from .. import doctor
    from ..errors import DatasetFormatError

    many = _collection_sources(os.fspath(args.dataset))
    if args.episodes:
        return _doctor_episodes(args, many)
    if many is not None:  # several datasets: one report each, each opened on its own (one broken one stops none)
        import lerobot_sql as lsql

        from ..collection import default_names, expand_sources

        roots = expand_sources(many)
        reports = {}
        kw = {"cache_dir": args.cache_dir} if getattr(args, "cache_dir", None) else {}
        for name, root in zip(default_names(roots), roots):
            try:
                one = lsql.connect(root, **kw)
            except DatasetFormatError as e:
                reports[name] = doctor.refused_report(root, e, tolerance_s=args.tolerance_s)
            else:
                reports[name] = doctor.run(one, tolerance_s=args.tolerance_s, check_video=not args.no_video,
                                           decode=args.decode)
        if args.json:
            print(json.dumps({n: json.loads(r.to_json()) for n, r in reports.items()}, indent=2))
        else:
            print("\n\n".join(f"== {n}\n{r.to_text()}" for n, r in reports.items()))
        return 0 if all(r.ok for r in reports.values()) else 1
    try:
        db = _connect(args)
    except DatasetFormatError as e:  # info.json refused at connect: a failed check with the key, not a traceback
        report = doctor.refused_report(args.dataset, e, tolerance_s=args.tolerance_s)
    else:
        report = doctor.run(db, tolerance_s=args.tolerance_s, check_video=not args.no_video, decode=args.decode)
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.ok else 1


def _doctor_episodes(args, many) -> int:
    """``doctor --episodes [--worst N]``: the per-episode verdicts (episode_quality), per dataset of a collection; exit 1
    when an episode is ``exclude``."""
    import lerobot_sql as lsql

    from .. import doctor

    thresholds = {}
    for item in args.threshold or []:
        name, eq, value = item.partition("=")
        try:
            thresholds[name.strip()] = float(value)
        except ValueError:
            eq = ""
        if not eq:
            raise UsageError(f"--threshold {item!r} is not NAME=NUMBER (e.g. --threshold spike_z=40; the names: "
                             "docs/curate.md)")
    kw = {"cache_dir": args.cache_dir} if getattr(args, "cache_dir", None) else {}
    if many is not None:
        from ..collection import default_names, expand_sources

        roots = expand_sources(many)
        dbs = {n: lsql.connect(r, **kw) for n, r in zip(default_names(roots), roots)}
    else:
        dbs = {None: _connect(args)}
    try:
        reports = {n: doctor.episodes(db, worst=args.worst, **thresholds) for n, db in dbs.items()}
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.json:
        out = {n: json.loads(r.to_json()) for n, r in reports.items()}
        print(json.dumps(out[None] if None in out else out, indent=2))
    else:
        print("\n\n".join((f"== {n}\n" if n else "") + r.to_text() for n, r in reports.items()))
    return 0 if all(r.ok for r in reports.values()) else 1


def cmd_bench(args) -> int:
    root = Path(args.repo) if args.repo else REPO
    if not (root / "benchmarks" / "run.py").is_file():
        raise MissingFileError(f"{root / 'benchmarks' / 'run.py'}: not found; `lerobot-sql bench` runs the "
                               "benchmarks of a source checkout (git clone, then pip install -e .)")
    extra = [a for a in args.bench_args if a != "--"]
    cmd = [sys.executable, "-m", "benchmarks.run", *(["--full"] if args.full else []), *extra]  # quick by default
    print("$ " + " ".join(cmd), file=sys.stderr)
    return 0 if subprocess.call(cmd, cwd=root) == 0 else 1


def _size(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def cmd_cache(args) -> int:
    import datetime

    from .._storage import cache

    root = Path(args.cache_dir) if args.cache_dir else cache.cache_root()
    entries = cache.dataset_caches(root)
    if args.clear is not None or args.clear_all:
        if args.clear_all:
            chosen = entries
        else:
            want = args.clear
            local = os.path.realpath(want) if "://" not in want else want
            # (a folder whose dataset is not recorded matches by its name only: its url None compared as "" was
            # equal to "/" stripped of its slashes, and `--clear /` removed every such folder)
            chosen = [e for e in entries if e.folder.name == want or e.url is not None and (
                e.url in (want, local) or (e.url.rstrip("/") or e.url) == (local.rstrip("/") or local))]
            if not chosen:
                known = ", ".join(sorted(e.url or e.folder.name for e in entries)[:10]) or "none"
                raise UsageError(f"no cache folder under {root} is of {want!r} (give a dataset as `lerobot-sql "
                                 f"cache` lists it, or its folder's name; known: {known}){_own_folder(root)}")
        freed = 0
        for e in chosen:
            freed += cache.clear(e)
            print(f"removed {e.folder} ({e.url or 'dataset unknown'}, {_size(e.bytes)})")
        print(f"{len(chosen)} cache folder(s) removed, {_size(freed)} freed")
        return 0
    if args.json:
        print(json.dumps([{"folder": str(e.folder), "dataset": e.url, "bytes": e.bytes, "parts": e.parts,
                           "last_used": e.last_used} for e in entries], indent=2))
        return 0
    if not entries:
        print(f"no dataset cache folders under {root}{_own_folder(root)}")
        return 0
    rows = [["dataset", "size", "last used", "of it", "folder"]]
    for e in entries:
        used = datetime.datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M") if e.last_used else "-"
        top = ", ".join(f"{k} {_size(v)}" for k, v in sorted(e.parts.items(), key=lambda kv: -kv[1])[:3] if v)
        name = e.url or "(unknown: made by an older version)"
        if e.url is not None and "://" not in e.url and not os.path.exists(e.url):
            name += " (gone: nothing there now)"  # (a local dataset deleted or moved: its cache serves nothing)
        rows.append([name, _size(e.bytes), used, top or "-", e.folder.name])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"\n{len(entries)} dataset cache folder(s) under {root}, {_size(sum(e.bytes for e in entries))} on disk; "
          "`lerobot-sql cache --clear DATASET` (or --clear-all) removes them")
    return 0


def _own_folder(root: Path) -> str:
    """A note for ``cache`` when ``root`` is itself one dataset's cache folder (given as ``connect(cache_dir=...)``,
    which the command neither lists nor clears: such a folder is the caller's), else ""."""
    from .._storage import cache

    if cache.is_dataset_folder(root):
        return (f"; {root} is itself a dataset's cache folder, given as connect(cache_dir=...): yours to delete "
                "when no dataset of it is open")
    return ""


def cmd_demo(args) -> int:
    from .. import demo

    rc = demo.main([args.dataset] if args.dataset else [])
    return int(rc or 0)


def cmd_shell(args) -> int:
    from .shell import SQLShell

    return SQLShell(_connect(args), max_rows=args.max_rows).run()


# ---- parser --------------------------------------------------------------------------------------------------------
def cmd_train(args) -> int:
    from ..torch import train

    roots = [os.fspath(d) for d in args.dataset]
    if len(roots) == 1 and _collection_sources(roots[0]) is not None:
        many = _collection_sources(roots[0])
        roots = many if isinstance(many, list) else [many]
        source = roots
    else:
        source = roots if len(roots) > 1 else roots[0]
    collection = isinstance(source, list)
    if collection and (args.name or args.query_dir):
        raise UsageError("named queries (--name, --query-dir) are written for one dataset; over several datasets "
                         "give the SQL itself (every view has a dataset column)")
    shares, column = _weights(args.weights)
    if not collection and (shares or args.alpha is not None or args.rename):
        raise UsageError("--weights NAME=WEIGHT,..., --alpha and --rename are for several datasets: give two or more "
                         "DATASETs (one dataset takes --weights COLUMN: sample weights from a column of the query)")
    if shares and args.alpha is not None:
        raise UsageError("give --weights NAME=WEIGHT,... or --alpha, not both (alpha makes the weights n_i ** alpha)")
    sql = args.sql
    if sql == "-":
        sql = sys.stdin.read()
    if args.name:
        if sql:
            raise UsageError("give either --sql or --name, not both")
        from .._query import library

        sql = library.render(args.name, dict(args.param or []), extra_dirs=args.query_dir or [])
    if not sql and not train.resuming(args.lerobot_args):
        raise UsageError("no selection: give --sql SELECT ... or --name NAME (or --resume=true with lerobot's "
                         "--config_path to continue a run)")
    # None: the default, or on resume the run's own (train.run refuses a resume that changes either)
    result = train.run(source, sql or None, args.lerobot_args, stats=args.stats, cache_dir=args.cache_dir,
                       dataset_kwargs={"align": args.align} if args.align else None,
                       rename=_renames(args.rename) if collection else None,
                       weights=shares, alpha=args.alpha, sample_weights=column)
    return int(result) if isinstance(result, int) else 0


def _weights(values: list[str] | None) -> tuple[dict[str, float] | None, str | None]:
    """``--weights`` (repeatable) as ``(shares, column)``: a value with ``=`` gives the datasets' shares
    (``'a=0.7,b=0.3'``, :func:`_shares`), one without names a column of the query's result holding each sample's
    weight (``--weights score``); at most one of each.

    Raises:
        UsageError: two share lists or two columns, a value that is neither, or a bad share list.
    """
    shares, column = None, None
    for text in values or []:
        if "=" in text:
            if shares is not None:
                raise UsageError(f"--weights {text!r}: the datasets' shares are given twice; give them in one "
                                 "--weights NAME=WEIGHT,...")
            shares = _shares(text)
            continue
        name = text.strip()
        if not name or "," in name:
            raise UsageError(f"--weights {text!r} is neither NAME=WEIGHT,... (the datasets' shares, e.g. 'site_a=0.7,"
                             "site_b=0.3') nor one column of the query's result holding each sample's weight (e.g. "
                             "--weights score)")
        if column is not None:
            raise UsageError(f"--weights {column!r} and --weights {name!r}: one column of sample weights (combine "
                             "them in the query, e.g. a * b AS weight)")
        column = name
    return shares, column


def _shares(text: str) -> dict[str, float]:
    """``--weights 'a=0.7,b=0.3'`` as {name: weight}.

    Raises:
        UsageError: a part that is not NAME=NUMBER, or a name given twice.
    """
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        try:
            w = float(value)
        except ValueError:
            w = None
        if not eq or not name.strip() or w is None:
            raise UsageError(f"--weights {text!r}: {part!r} is not NAME=WEIGHT (e.g. --weights 'site_a=0.7,"
                             "site_b=0.3', names as the dataset column has them)")
        if not math.isfinite(w) or w < 0:
            raise UsageError(f"--weights {text!r}: {part!r}: a weight is a finite number >= 0 (0 leaves the "
                             "dataset out)")
        if name.strip() in out:
            raise UsageError(f"--weights {text!r}: {name.strip()!r} is given twice")
        out[name.strip()] = w
    return out


def _renames(items: list[str] | None) -> dict[str, dict[str, str]] | None:
    """``--rename NAME:SOURCE_KEY=ITEM_KEY`` (repeatable) as ``Collection.dataset``'s ``rename``.

    Raises:
        UsageError: an item that is not NAME:KEY=KEY.
    """
    out: dict[str, dict[str, str]] = {}
    for item in items or []:
        name, colon, rest = item.partition(":")
        src, eq, dst = rest.partition("=")
        if not colon or not eq or not name or not src or not dst:
            raise UsageError(f"--rename {item!r} is not DATASET:SOURCE_KEY=ITEM_KEY (e.g. --rename "
                             "'site_b:observation.images.top=observation.images.front')")
        out.setdefault(name, {})[src] = dst
    return out or None


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="lerobot-sql", formatter_class=fmt, epilog=EPILOG,
        description="SQL over LeRobot datasets (v3.0, and v2.x read natively; Parquet + MP4), without loading or downloading them.")
    p.add_argument("--version", action="version", version=f"lerobot-sql {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", help="where video indexes and kept selections go (default $LSQL_CACHE_DIR "
                                            "or ~/.cache/lerobot_sql)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name, help_, examples, func, dataset=True, one=False):
        sp = sub.add_parser(name, help=help_, description=help_, parents=[common], formatter_class=fmt,
                            epilog="examples:\n" + "\n".join("  " + e for e in examples))
        if dataset:
            sp.add_argument("dataset", metavar="DATASET", help=ONE_DATASET_HELP if one else DATASET_HELP)
        sp.set_defaults(func=func)
        return sp

    def query_source(sp, positional: bool, manifest: str = ""):
        if positional:
            sp.add_argument("sql", nargs="?", metavar="SQL", help="a SELECT over the views; - reads it from stdin")
        else:
            sp.add_argument("--sql", help=f"a SELECT over the views; - reads it from stdin{manifest}")
        sp.set_defaults(sql_spelling="SQL" if positional else "--sql SQL")  # for _sql_from's "no query" error
        sp.add_argument("--name", help="a named query from the library (see `lerobot-sql query --list`)")
        sp.add_argument("--param", "-p", action="append", type=_param, metavar="KEY=VALUE",
                        help="a parameter of the named query (repeatable)")
        sp.add_argument("--query-dir", action="append", metavar="DIR",
                        help="a folder of .sql named queries, searched before the bundled ones (repeatable)")

    sp = add("info", "summary of a dataset: format, fps, episodes, frames, tasks, features, files",
             ["lerobot-sql info sample/small20", "lerobot-sql info sample/small20 --json"], cmd_info)
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")

    sp = add("schema", "the views (episodes, frames, tasks, ...) and their columns",
             ["lerobot-sql schema sample/small20", "lerobot-sql schema sample/small20 frames"], cmd_schema)
    sp.add_argument("view", nargs="?", help="only this view")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")

    sp = sub.add_parser(
        "query", help="run a SQL query (or a named query) and print or save the result", parents=[common],
        description="Run a read-only SELECT over the views, or a named query, and print or save the result.",
        formatter_class=fmt, epilog="examples:\n" + "\n".join("  " + e for e in [
            'lerobot-sql query sample/small20 "SELECT episode_index, length FROM episodes ORDER BY length DESC"',
            'lerobot-sql query sample/small20 "SELECT * FROM tasks" -f csv > tasks.csv',
            'lerobot-sql query sample/small20 "SELECT * FROM frames" -o frames.parquet   # format from the extension',
            'echo "SELECT count(*) FROM frames" | lerobot-sql query sample/small20 -',
            "lerobot-sql query --list",
            "lerobot-sql query sample/small20 --name NAME -p key=value -f json"]))
    sp.add_argument("dataset", nargs="?", metavar="DATASET", help=DATASET_HELP)
    query_source(sp, positional=True)
    sp.add_argument("--list", action="store_true", help="list the named queries and their parameters")
    sp.add_argument("--format", "-f", choices=["table", "csv", "json", "parquet"],
                    help="table, csv, json (JSON Lines: one object per row) or parquet; default: from --output's "
                         "extension (.csv, .json/.jsonl, .parquet, .txt), else table. csv and json print a float as "
                         "the shortest decimal that reads back to the same value (float32: 25.24413)")
    sp.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout (required for parquet "
                                                           "on a terminal); never inside the dataset, never over an "
                                                           "existing file without --overwrite")
    sp.add_argument("--overwrite", action="store_true",
                    help="let --output replace an existing file (once the new result is complete; a query that "
                         "fails leaves the old file as it was)")
    sp.add_argument("--max-rows", type=_rows, default=40, help="rows shown by the table format (0 = all; default 40)")
    sp.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                    help="stop the query after this many seconds (exit 1); Ctrl-C stops it at any time (exit 130)")
    sp.add_argument("--attach", action="append", type=_attach, metavar="NAME=PATH", help=ATTACH_HELP)
    sp.set_defaults(func=cmd_query)

    sp = add("export", "write the frames a query selects as a new LeRobot v3.0 dataset",
             ['lerobot-sql export sample/small20 /tmp/drawer --sql "SELECT episode_index FROM episodes '
              "WHERE list_contains(tasks, 'Open the top drawer.')\"",
              'lerobot-sql export sample/small20 /tmp/windows --sql "SELECT episode_index, 1.0 AS start_s, '
              '3.0 AS end_s FROM episodes"',
              "lerobot-sql export sample/small20 /tmp/subset --name NAME -p key=value",
              'lerobot-sql export sample/small20 /tmp/at10fps --sql "SELECT episode_index FROM episodes" --fps 10'],
             cmd_export)
    sp.add_argument("dest", metavar="DEST", help="folder of the new dataset")
    query_source(sp, positional=False, manifest="; over several datasets, an existing *.parquet file is a "
                                                "collection manifest saved from coll.manifest(sql)")
    sp.add_argument("--overwrite", action="store_true", help="replace DEST if it exists (once the new one is complete); only an empty folder "
                         "or an earlier lerobot-sql export is ever replaced")
    sp.add_argument("--tolerance-s", type=_seconds, default=1e-4,
                    help="how far a data timestamp may be from its video frame, in seconds (default 1e-4)")
    sp.add_argument("--align", choices=["timestamp", "frame_index"], default="timestamp",
                    help="how each row's camera frame is found: by time (default) or frame_index, the row's "
                         "frame_index-th frame of its episode's clip, for wall-clock timestamps over clips holding "
                         "exactly their frames on the fps grid; the copy's timestamps are then frame_index / fps")
    sp.add_argument("--fps", type=int, metavar="N",
                    help="write the selection as a recording at this lower frame rate (a whole number dividing the "
                         "dataset's fps: every k-th frame, k = fps ratio, renumbered; camera frames re-encoded "
                         "losslessly, RGB as H.264)")
    sp.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    sp.add_argument("--features", metavar="KEYS",
                    help="over several datasets: the feature keys to write, comma-separated (e.g. leave out a camera "
                         "whose codec differs between them)")
    sp.add_argument("--attach", action="append", type=_attach, metavar="NAME=PATH", help=ATTACH_HELP)

    sp = add("prefetch", "download (into the cache) the files a query needs from a remote dataset",
             ["lerobot-sql prefetch hf://datasets/ORG/NAME",
              'lerobot-sql prefetch hf://datasets/ORG/NAME --sql "SELECT episode_index FROM episodes LIMIT 5"'],
             cmd_prefetch, one=True)
    query_source(sp, positional=False, manifest="; an existing *.parquet file is a manifest (db.export_manifest)")
    sp.add_argument("--delta-timestamps", metavar="JSON",
                    help='the delta_timestamps you will train with, e.g. \'{"action": [0, 0.0333]}\'')
    sp.add_argument("--camera", action="append", metavar="KEY", help="only this camera (repeatable; default all)")
    sp.add_argument("--workers", type=int, default=8, help="parallel range requests (default 8)")
    sp.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    sp = add("view", "write a page of playable clips of what a query selects: one self-contained HTML file",
             ['lerobot-sql view sample/small20 --sql "SELECT episode_index, 1.0 AS start_s, 3.0 AS end_s FROM '
              'episodes" -o clips.html',
              'lerobot-sql view sample/small20 --sql "SELECT episode_index FROM episode_quality WHERE verdict '
              "<> 'pass'\" -o review.html --camera observation.images.front --signal action"], cmd_view, one=True)
    query_source(sp, positional=False)
    sp.epilog += ("\n\nEach clip plays the dataset's own mp4 packets from the window's first frame (cameras side by "
                  "side,\nin sync), over a plot of the signals; HEVC (depth maps) is re-encoded as H.264. The page "
                  "needs\nno server and no network: open it in a browser or mail it (docs/view.md).")
    sp.add_argument("--output", "-o", metavar="FILE", required=True,
                    help="the page to write (e.g. clips.html); never inside the dataset, never over an existing file "
                         "without --overwrite")
    sp.add_argument("--overwrite", action="store_true", help="let --output replace an existing file")
    sp.add_argument("--max-clips", type=_count, default=24, help="at most this many clips (default 24); the page "
                                                                "names what it left out")
    sp.add_argument("--max-mb", type=_megabytes, default=64.0,
                    help="at most this many MB of mp4 in the page (default 64; the file is a third larger)")
    sp.add_argument("--camera", action="append", metavar="KEY", help="only this camera (repeatable; default all)")
    sp.add_argument("--signal", action="append", metavar="KEY",
                    help="a feature to plot under each clip (repeatable; default observation.state, else action; "
                         "- for none)")
    sp.add_argument("--reencode", action="store_true",
                    help="re-encode every clip as H.264 (for browsers without AV1, e.g. Safari on older Macs)")
    sp.add_argument("--tolerance-s", type=_seconds, default=1e-4,
                    help="how far a data timestamp may be from its video frame, in seconds (default 1e-4)")
    sp.add_argument("--align", choices=["timestamp", "frame_index"], default="timestamp",
                    help="how each row's camera frame is found (as export --align)")

    sp = add("index", "build the video frame index of every mp4 (one demux pass each, cached)",
             ["lerobot-sql index sample/small20"], cmd_index)
    sp.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    sp = add("doctor", "check a dataset: metadata vs files, timestamps, video frames; exit 1 on problems",
             ["lerobot-sql doctor sample/small20", "lerobot-sql doctor sample/small20 --json --no-video",
              "lerobot-sql doctor sample/small20 --decode", "lerobot-sql doctor sample/small20 --episodes --worst 10"],
             cmd_doctor)
    sp.add_argument("--json", action="store_true", help="print the report as JSON")
    sp.add_argument("--tolerance-s", type=_seconds, default=1e-4,
                    help="allowed timestamp error in seconds (default 1e-4, as lerobot)")
    sp.add_argument("--no-video", action="store_true", help="skip the video checks (faster)")
    sp.add_argument("--episodes", action="store_true",
                    help="instead of the dataset checks, the per-episode verdicts of the episode_quality view "
                         "(pass / review / exclude, with reasons) and the worst episodes; exit 1 when an episode is "
                         "exclude")
    sp.add_argument("--worst", type=int, default=20, metavar="N",
                    help="with --episodes: how many of the worst episodes to list (default 20)")
    sp.add_argument("--threshold", action="append", metavar="NAME=NUMBER",
                    help="with --episodes: change a verdict threshold, e.g. spike_z=40 (repeatable; docs/curate.md)")
    sp.add_argument("--decode", action="store_true",
                    help="also decode every frame of every mp4 (check video_files_decode: frames come out in pts "
                         "order, none missing or extra, no decode error); slow, a full decode of the videos; "
                         "without it that check is reported as not run")

    sp = add("shell", "interactive SQL prompt with the views registered (.help inside)",
             ["lerobot-sql shell sample/small20", "echo 'SELECT count(*) FROM frames;' | lerobot-sql shell sample/small20",
             "lerobot-sql shell sample/small20 < script.sql 2>&1 | tee log.txt"], cmd_shell)
    sp.epilog += ("\n\nexit status: piped input (a script) runs every statement, printing each error in order with "
                  "the\nresults, and exits 1 if any statement or dot command failed, else 0 (.quit ends the script "
                  "early\nand keeps that status). An interactive session exits 0.")
    sp.add_argument("--max-rows", type=_rows, default=40, help="rows shown per result (0 = all; default 40)")
    sp.add_argument("--attach", action="append", type=_attach, metavar="NAME=PATH", help=ATTACH_HELP)

    sp = add("cache", "list the datasets' cache folders (video indexes, row-group stores, remote pieces, kept "
             "selections) with their size on disk, or remove them",
             ["lerobot-sql cache", "lerobot-sql cache --json", "lerobot-sql cache --clear sample/small20",
              "lerobot-sql cache --clear-all"], cmd_cache, dataset=False)
    clear = sp.add_mutually_exclusive_group()
    clear.add_argument("--clear", metavar="DATASET", help="remove the cache folder of DATASET (as listed, or its "
                                                        "folder's name); it is rebuilt when the dataset is read "
                                                        "again. Safe while no dataset of it is open")
    clear.add_argument("--clear-all", action="store_true", help="remove every dataset's cache folder")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")

    sp = add("bench", "run the benchmarks (needs a source checkout: git clone, then pip install -e .)",
             ["lerobot-sql bench", "lerobot-sql bench --full", "lerobot-sql bench -- --help"], cmd_bench,
             dataset=False)
    sp.add_argument("--full", action="store_true", help="the full run (about 3x longer) instead of the quick one")
    sp.add_argument("--repo", help="the source checkout (default: the one this package was installed from)")
    sp.add_argument("bench_args", nargs=argparse.REMAINDER, help="passed on to python -m benchmarks.run")

    sp = add("train", "run lerobot's own training (lerobot-train) on the frames a query selects, from one dataset or "
             "a mixture of several",
             ['lerobot-sql train sample/small20 --sql "SELECT episode_index FROM episodes WHERE length > 200" -- '
              "--policy.type=act --policy.device=cpu --steps=1000 --output_dir=outputs/act_long",
              "lerobot-sql train hf://datasets/ORG/NAME --name split -p subset=train -- --policy.type=diffusion",
              "lerobot-sql train sample/small20 --sql \"SELECT episode_index, CASE WHEN length > 200 THEN 2.0 ELSE 1.0 "
              "END AS weight FROM episodes\" --weights weight -- --policy.type=act --output_dir=outputs/act_weighted",
              "lerobot-sql train data/site_a data/site_b --sql \"SELECT dataset, episode_index FROM episodes\" "
              "--weights 'site_a=0.7,site_b=0.3' --rename 'site_b:observation.images.top=observation.images.front' "
              "-- --policy.type=act --output_dir=outputs/mix"],
             cmd_train, dataset=False)
    sp.add_argument("dataset", nargs="+", metavar="DATASET",
                    help="dataset root or URL; several (or a comma list, a glob, a folder of datasets) train on a "
                         "mixture: the SQL then returns dataset, and every view has it")
    query_source(sp, positional=False)
    sp.add_argument("--stats", choices=["selection", "dataset"], default=None,
                    help="normalization statistics: of the selected frames (default) or the source's "
                         "meta/stats.json (what lerobot uses with --dataset.episodes); over several datasets each "
                         "one's, combined by lerobot's aggregate_stats rule; a resumed run keeps its own")
    sp.add_argument("--align", choices=["timestamp", "frame_index"], default=None,
                    help="how each row's camera frame is found: by time, from_timestamp + timestamp within lerobot's "
                         "--tolerance_s (default), or frame_index: the row's frame_index-th frame of its episode's "
                         "clip, for wall-clock timestamps over clips holding exactly their frames on the fps grid "
                         "(what dataset() recommends when it refuses such timestamps; a resumed run keeps its own)")
    sp.add_argument("--weights", metavar="NAME=W,... | COLUMN", action="append",
                    help="several datasets: each dataset's share of the samples drawn, e.g. 'site_a=0.7,site_b=0.3' "
                         "(normalised; 0 leaves a dataset out); default: proportional to its selected frames. "
                         "COLUMN (no '='): a column of the query's result holding each row's weight (e.g. length / "
                         "100.0 AS weight), which every sample of its episode or window carries: samples are drawn in "
                         "proportion to it (exact per-epoch counts); over several datasets across them all, or "
                         "within each when shares (NAME=W,... or --alpha) are given too (repeat --weights)")
    sp.add_argument("--alpha", type=float, metavar="A",
                    help="several datasets: weights n_i ** A over each dataset's selected frames n_i (1: "
                         "proportional, 0: equal shares, between: small datasets up-weighted)")
    sp.add_argument("--rename", action="append", metavar="NAME:KEY=NEW",
                    help="several datasets: line a dataset's feature up under another key, e.g. "
                         "'site_b:observation.images.top=observation.images.front' (repeatable)")
    sp.set_defaults(lerobot_args=[])  # everything after `--`, split off in main() before parsing
    sp.usage = "lerobot-sql train [-h] [--sql SQL | --name NAME [-p KEY=VALUE ...]] [--stats {selection,dataset}] " \
               "[--align {timestamp,frame_index}] [--weights NAME=W,... | --alpha A] [--weights COLUMN] " \
               "[--rename NAME:KEY=NEW ...] " \
               "DATASET [DATASET ...] -- [lerobot-train arguments ...]"

    sp = add("demo", "a tour on the bundled sample: SQL results, a training set, a DataLoader pass",
             ["lerobot-sql demo", "lerobot-sql demo path/to/dataset"], cmd_demo, dataset=False)
    sp.add_argument("dataset", nargs="?", metavar="DATASET", help="default: the bundled sample/small20")
    return p


def _warn(message, category, filename, lineno, file=None, line=None) -> None:
    # Library warnings (metadata-only copies, missing videos) as one line each, without the source line.
    # (longer than an error's line: a warning names its rows, then the query it is about)
    print(f"warning: {one_line(message, limit=2000)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """The ``lerobot-sql`` command: the exit code (0, 1 an error, 2 a usage error, 130 interrupted by Ctrl-C)."""
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # Ctrl-C anywhere, also in an import or the argument parsing
        code = 130
    if code == 130:
        print("interrupted", file=sys.stderr)
        if argv is None:  # run as the command (console script, python -m), not called by a program
            _ignore_further_ctrl_c()
    return code


def _ignore_further_ctrl_c() -> None:
    # The command is over. A SIGINT still pending (it arrived while DuckDB stopped, and Python runs the handler of
    # the moment: the default one once the query's was given back) or a second Ctrl-C would otherwise raise
    # KeyboardInterrupt on the way out: killed by SIGINT (-2) with a traceback after "interrupted" was printed.
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main(argv: list[str] | None) -> int:
    import warnings

    warnings.showwarning = _warn
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passed_on = []
    if argv[:1] == ["train"] and "--" in argv:  # lerobot-train's arguments are not ours to parse
        k = argv.index("--")
        argv, passed_on = argv[:k], argv[k + 1:]
    args = parser.parse_args(argv)
    if passed_on:
        args.lerobot_args = passed_on
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        sub = next((a for a in parser._subparsers._group_actions[0].choices.values()  # the subcommand's usage line
                    if a.prog.endswith(" " + args.command)), parser)
        sub.print_usage(sys.stderr)
        print(f"{sub.prog}: error: {e}", file=sys.stderr)
        hint = error_hint(e.__cause__) if e.__cause__ is not None else None  # a library error made a usage error
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return 2
    except (LeRobotSQLError, OSError) as e:
        if _by_ctrl_c(e):  # Ctrl-C stopped DuckDB: as KeyboardInterrupt
            return 130
        if isinstance(e, BrokenPipeError):  # `lerobot-sql query ... | head`: the reader left; not an error
            with contextlib.suppress(OSError):
                sys.stdout = open(os.devnull, "w")
            return 0
        if os.environ.get("LSQL_DEBUG"):
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        hint = error_hint(e)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return 1
    except Exception as e:
        if _by_ctrl_c(e):  # an interrupt DuckDB raised where no error of ours wraps it
            return 130
        raise


def _by_ctrl_c(e: BaseException) -> bool:
    """Whether Ctrl-C caused ``e``: our query guard stopped DuckDB for a SIGINT, or DuckDB saw the signal itself
    (work outside a guarded fetch, e.g. making the views: DuckDB's interrupt error somewhere in the chain)."""
    from .._catalog.sandbox import interrupted_by_signal

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, QueryInterrupted):  # our guard says why it stopped DuckDB (a timeout is no Ctrl-C), and
            return e.reason == "sigint"  # its cause is DuckDB's interrupt error either way
        if isinstance(e, KeyboardInterrupt) or interrupted_by_signal(e):
            return True
        e = e.__cause__ or e.__context__
    return False
