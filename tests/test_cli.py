"""``lerobot-sql``: every subcommand on the bundled sample, run in this process through ``main(argv)`` (a child
interpreter costs ~2 s); a handful of tests run a real process where the process is the point (the console script,
``python -m``, stdout and stderr interleaved on one pipe, a terminal). Expected values come from pyarrow and PyAV
reading the sample's files directly, not from lerobot_sql."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import DATASETS, REPO, SAMPLE, CliResult, ctrl_c_from_outside, run_cli

CLI = [sys.executable, "-m", "lerobot_sql.cli"]


def run(*args: str, stdin: str | None = None, cwd: Path | None = None) -> CliResult:
    """The command in this process (helpers.run_cli); the tests marked "a real process" below run a child."""
    return run_cli(*args, stdin=stdin, cwd=cwd)


def ok(*args: str, **kw) -> str:
    r = run(*args, **kw)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def assert_error(r: CliResult, *fragments: str) -> None:
    """Exit 1 and exactly one ``error:`` line plus one ``hint:`` line on stderr, no traceback."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "%|" not in ln]  # drop tqdm bars
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0] or f in lines[1], (f, r.stderr)


def box_cells(out: str) -> list[list[str]]:
    """The cell texts of every row of DuckDB's box tables in ``out``."""
    return [[c.strip() for c in ln.strip().strip("│").split("│")] for ln in out.splitlines() if ln.startswith("│")]




@pytest.fixture(scope="module")
def episodes():
    return pq.read_table(SAMPLE / "meta" / "episodes" / "chunk-000" / "file-000.parquet")


@pytest.fixture(scope="module")
def data():
    return pq.read_table(SAMPLE / "data" / "chunk-000" / "file-000.parquet")


# ---- help, version, usage errors ------------------------------------------------------------------------------------
def test_help_lists_every_subcommand_with_examples():
    out = ok("--help")
    for cmd in ("info", "schema", "query", "export", "prefetch", "index", "doctor", "shell", "cache", "bench", "demo"):
        assert f"    {cmd} " in out
    assert "examples:" in out
    sub = ok("query", "--help")
    assert "examples:" in sub and "--format" in sub
    assert "source checkout" in ok("bench", "--help")


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "lerobot-sql"
    assert script.exists(), "pip install -e . creates the lerobot-sql script"
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("lerobot-sql ")


@pytest.mark.parametrize("args", [
    [],                                                     # no subcommand
    ["frobnicate", "x"],                                    # unknown subcommand
    ["query"],                                              # no DATASET
    ["query", "SAMPLE", "SELECT 1", "--format", "xml"],     # bad choice
    ["query", "SAMPLE", "SELECT 1", "--param", "a=1"],      # --param without --name
    ["query", "SAMPLE", "--param", "novalue"],              # not key=value
    ["export", "SAMPLE", "/tmp/x"],                         # no --sql / --name
    ["query", "SAMPLE", "SELECT 1", "--max-rows", "-1"],    # a negative row count (was accepted)
    ["shell", "SAMPLE", "--max-rows", "-5"],
    ["export", "SAMPLE", "/tmp/x", "--name", "last_seconds", "-p", "seconds=-1"],  # a bad --param (was exit 1)
])
def test_usage_errors_exit_2(args):
    r = run(*[str(SAMPLE) if a == "SAMPLE" else a for a in args])
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert "usage:" in r.stderr


@pytest.mark.parametrize("value", ["nan", "0", "-1", "inf", "x"])
@pytest.mark.parametrize("cmd", ["export", "doctor"])
def test_a_bad_tolerance_is_a_usage_error_naming_the_option(cmd, value, tmp_path):
    """--tolerance-s 0 / -1 / nan: export ended in a bare ValueError traceback (exit 1), doctor failed a healthy
    dataset with wrong fixes ("rewrite the episode's rows", "re-encode the episode"), exit 1. Now a usage error
    (exit 2) naming the option and the value, before anything is read or written."""
    args = {"export": ["export", SAMPLE, tmp_path / "out", "--quiet", "--sql",
                       "SELECT episode_index FROM episodes WHERE episode_index = 1"],
            "doctor": ["doctor", SAMPLE, "--no-video"]}[cmd]
    r = run(*args, f"--tolerance-s={value}")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "argument --tolerance-s:" in r.stderr and repr(value) in r.stderr and "number of seconds" in r.stderr, r.stderr
    assert ("> 0" in r.stderr) == (value != "x"), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == "" and not (tmp_path / "out").exists()


def test_a_good_tolerance_still_runs_doctor():
    assert json.loads(ok("doctor", SAMPLE, "--no-video", "--json", "--tolerance-s", "2e-4"))["tolerance_s"] == 2e-4


# ---- info / schema -------------------------------------------------------------------------------------------------
def test_info_json_matches_the_files(episodes):
    info = json.loads((SAMPLE / "meta" / "info.json").read_text())
    got = json.loads(ok("info", SAMPLE, "--json"))
    assert got["episodes"] == episodes.num_rows
    assert got["frames"] == pc.sum(episodes["length"]).as_py()
    assert got["tasks"] == pq.read_table(SAMPLE / "meta" / "tasks.parquet").num_rows
    assert got["fps"] == info["fps"]
    assert [f["name"] for f in got["features"]] == list(info["features"])
    text = ok("info", SAMPLE)
    assert f"episodes     {episodes.num_rows}" in text
    assert ", ".join(info["features"]["action"]["names"]) in text


def test_schema_lists_view_columns(data):
    got = json.loads(ok("schema", SAMPLE, "--json"))
    assert {"episodes", "frames", "tasks", "videos", "episode_stats"} <= set(got)
    assert [c["column"] for c in got["tasks"]] == ["task_index", "task"]
    assert [c["column"] for c in got["frames"]] == data.column_names
    text = ok("schema", SAMPLE, "tasks")
    assert text.splitlines()[0] == "tasks" and "task_index" in text and "episodes" not in text


def test_schema_unknown_view_suggests_the_right_one():
    assert_error(run("schema", SAMPLE, "taks"), "Did you mean 'tasks'?", "lerobot-sql schema")


def test_missing_dataset_is_one_line_with_hint(tmp_path):
    assert_error(run("info", tmp_path / "nowhere"), "meta/info.json", "dataset root")


# ---- query ---------------------------------------------------------------------------------------------------------
def test_query_table_output(episodes):
    top = sorted(episodes["length"].to_pylist(), reverse=True)[:3]
    out = ok("query", SAMPLE, "SELECT episode_index, length FROM episodes ORDER BY length DESC LIMIT 3")
    cells = box_cells(out)
    assert cells[0] == ["episode_index", "length"]
    assert [int(r[1]) for r in cells[2:]] == top


# Three copies of frames (3 x 4,762 rows), past DuckDB's box renderer, which fetches 10,000 rows and elided from
# those: it showed row 10,000 as the last one and "? rows".
TRIPLED = ("SELECT f.index, k.k FROM frames f, (SELECT 1 AS k UNION ALL SELECT 2 UNION ALL SELECT 3) k "
           "ORDER BY k.k, f.index")


def _rows(out: str) -> list[list[str]]:
    cells = box_cells(out)
    return [r for r in cells if r[0] not in ("index", "int64") and "·" not in r[0]]


def test_query_table_past_10000_rows_says_where_it_was_cut(data):
    n = data.num_rows
    out = ok("query", SAMPLE, TRIPLED)  # default --max-rows 40
    rows = _rows(out)
    assert len(rows) == 40
    assert rows[:20] == [[str(i), "1"] for i in range(20)]
    assert rows[20:] == [[str(i), "3"] for i in range(n - 20, n)]  # the real last rows, not rows 9,981-10,000
    assert "·" in out
    footer = out.split("└")[-1]
    assert f"{3 * n:,} rows" in footer and "40 shown" in footer and f"{3 * n - 19:,}-{3 * n:,}" in footer, footer


@pytest.mark.parametrize("how", ["query", "shell"])
def test_query_table_max_rows_0_prints_every_row(data, how):
    n = data.num_rows
    if how == "query":
        out = ok("query", SAMPLE, TRIPLED, "--max-rows", "0")
    else:
        out = ok("shell", SAMPLE, "--max-rows", "0", stdin=TRIPLED + ";\n")
    rows = _rows(out)
    assert rows == [[str(i), str(k)] for k in (1, 2, 3) for i in range(n)]
    assert "·" not in out
    assert f"{3 * n:,} rows" in out.split("└")[-1]


def test_query_csv_equals_parquet(episodes):
    out = ok("query", SAMPLE, "SELECT episode_index, length FROM episodes ORDER BY episode_index", "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    order = np.argsort(episodes["episode_index"].to_numpy())
    assert [int(r["episode_index"]) for r in rows] == episodes["episode_index"].to_numpy()[order].tolist()
    assert [int(r["length"]) for r in rows] == episodes["length"].to_numpy()[order].tolist()


def test_csv_writes_nested_text_as_json_and_numeric_lists_as_they_are(episodes):
    """The tasks list came out as DuckDB's text ([Open the top drawer., Pick up ...]): a task holding ", " could not
    be split back. Nested columns holding text are JSON now; numeric lists keep their short form, also JSON."""
    out = ok("query", SAMPLE, "SELECT episode_index, tasks, [1.5, 2.25]::FLOAT[] AS v, {'a': 'x, y'} AS st, "
             "'plain, text' AS s FROM episodes ORDER BY episode_index", "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    want = dict(zip(episodes["episode_index"].to_pylist(), episodes["tasks"].to_pylist()))
    assert {int(r["episode_index"]): json.loads(r["tasks"]) for r in rows} == want
    assert any(len(t) == 2 for t in want.values())
    assert {r["v"] for r in rows} == {"[1.5, 2.25]"} and {r["st"] for r in rows} == {'{"a":"x, y"}'}
    assert {r["s"] for r in rows} == {"plain, text"}  # a plain string column stays plain


def test_query_json_lines_from_stdin(episodes):
    out = ok("query", SAMPLE, "-", "--format", "json",
             stdin="SELECT episode_index, tasks FROM episodes ORDER BY episode_index")
    rows = [json.loads(ln) for ln in out.splitlines()]
    want = {e: t for e, t in zip(episodes["episode_index"].to_pylist(), episodes["tasks"].to_pylist())}
    assert {r["episode_index"]: r["tasks"] for r in rows} == want
    assert any(len(t) == 2 for t in want.values())  # the sample's task-switching episodes come through as lists


def test_query_parquet_output(tmp_path, data):
    dest = tmp_path / "ep3.parquet"
    ok("query", SAMPLE, 'SELECT index, "observation.state" FROM frames WHERE episode_index = 3 ORDER BY index',
       "-f", "parquet", "-o", dest)
    got = pq.read_table(dest)
    want = data.filter(pc.equal(data["episode_index"], 3)).sort_by("index")
    assert got["index"].to_pylist() == want["index"].to_pylist()
    np.testing.assert_array_equal(np.stack(got["observation.state"].to_numpy(zero_copy_only=False)),
                                  np.stack(want["observation.state"].to_numpy(zero_copy_only=False)))


def test_query_errors_are_one_line_with_hint():
    assert_error(run("query", SAMPLE, "SELECT lenght FROM episodes"), "'length'", "lerobot-sql schema")
    assert_error(run("query", SAMPLE, "DELETE FROM episodes"), "only queries")
    assert_error(run("query", SAMPLE, "SELECT 'a'::INT"), "Conversion")  # fails while running, not binding


@pytest.mark.parametrize("name, fmt", [("eps.csv", "csv"), ("eps.CSV", "csv"), ("eps.json", "json"),
                                       ("eps.jsonl", "json"), ("eps.parquet", "parquet"), ("eps.txt", "table")])
def test_output_format_follows_the_extension(tmp_path, episodes, name, fmt):
    dest = tmp_path / name
    ok("query", SAMPLE, "SELECT episode_index, length FROM episodes ORDER BY episode_index", "-o", dest)
    want = dict(zip(episodes["episode_index"].to_pylist(), episodes["length"].to_pylist()))
    if fmt == "csv":
        rows = list(csv.DictReader(dest.open()))
        got = {int(r["episode_index"]): int(r["length"]) for r in rows}
    elif fmt == "json":
        rows = [json.loads(ln) for ln in dest.read_text().splitlines()]
        got = {r["episode_index"]: r["length"] for r in rows}
    elif fmt == "parquet":
        t = pq.read_table(dest)
        got = dict(zip(t["episode_index"].to_pylist(), t["length"].to_pylist()))
    else:
        got = {int(r[0]): int(r[1]) for r in box_cells(dest.read_text())[2:]}
    assert got == want


def test_output_extension_unknown_or_overridden(tmp_path):
    r = run("query", SAMPLE, "SELECT 1 AS x", "-o", tmp_path / "x.xlsx")
    assert r.returncode == 2 and "usage:" in r.stderr and ".csv" in r.stderr and not (tmp_path / "x.xlsx").exists()
    ok("query", SAMPLE, "SELECT 42 AS x", "-f", "csv", "-o", tmp_path / "x.dat")  # -f wins over the extension
    assert (tmp_path / "x.dat").read_text().splitlines() == ["x", "42"]


def test_csv_and_json_print_float32_alike(data):
    """Both give the shortest decimal that reads back as the same float32 (as numpy's str of a float32)."""
    sql = 'SELECT index, "observation.state", timestamp FROM frames WHERE episode_index = 1 ORDER BY index LIMIT 20'
    rows_json = [json.loads(ln) for ln in ok("query", SAMPLE, sql, "-f", "json").splitlines()]
    rows_csv = list(csv.DictReader(io.StringIO(ok("query", SAMPLE, sql, "-f", "csv"))))
    want = data.filter(pc.equal(data["episode_index"], 1)).sort_by("index").slice(0, 20)
    state = np.stack(want["observation.state"].to_numpy(zero_copy_only=False))
    for rj, rc, st, ts in zip(rows_json, rows_csv, state, want["timestamp"].to_numpy()):
        shortest = [str(np.float32(x)) for x in st]
        assert [repr(x) for x in rj["observation.state"]] == shortest
        assert rc["observation.state"] == "[" + ", ".join(shortest) + "]"
        assert repr(rj["timestamp"]) == rc["timestamp"] == str(np.float32(ts))
        assert np.array_equal(np.float32(rj["observation.state"]), st)  # still the exact float32 values
    assert any(len(str(np.float32(x))) < len(repr(float(x))) for x in state.ravel())  # float32 != float64 digits


QUOTING = "quote"


@pytest.mark.parametrize("args, error, hint", [
    (["DELETE FROM episodes"], "only queries", "read-only"),
    (["SELEC 1"], "line 1, column 7", "where the error points"),
    (["SELECT * FROM frames WHERE"], "WHERE is incomplete: SELECT * FROM frames >>>WHERE<<<", "where the error points"),
    (["SELECT 1 AS x; SELECT 2 AS y"], "exactly one SQL statement", "one statement"),
    (["DESCRIBE frames"], "db.sql('SELECT * FROM frames LIMIT 0').columns", "lerobot-sql schema DATASET VIEW"),
    (["SUMMARIZE frames"], "only SELECT queries", "lerobot-sql schema DATASET VIEW"),
    (["SELECT * FROM read_csv('x.csv')"], "table functions", "lerobot-sql schema"),
    (["SELECT 'a'::INT"], "Conversion", "does not fit its SQL type"),
    (["SELECT nosuchfn(1)"], "nosuchfn", "duckdb.org"),
    (["SELECT * FROM episodes LIMIT 99999999999999999999999"], "LIMIT 99999999999999999999999 is out of range",
     "2^63 - 1"),
])
def test_error_hints_fit_the_error(args, error, hint):
    r = run("query", SAMPLE, *args)
    assert_error(r, error, hint)
    hint_line = r.stderr.strip().splitlines()[-1]
    assert hint in hint_line and QUOTING not in hint_line, r.stderr  # the quoting hint only for names/columns
    assert "Exception:" not in r.stderr  # no raw DuckDB exception class where we know better


@pytest.mark.parametrize("sql", ["SELECT lenght FROM episodes", "SELECT observation.state FROM frames",
                                 "SELECT nope2 AS x"])
def test_quoting_hint_for_names_and_columns(sql):
    r = run("query", SAMPLE, sql)
    assert_error(r)
    assert QUOTING in r.stderr.strip().splitlines()[-1], r.stderr


def test_named_query_from_a_user_folder(tmp_path, episodes):
    (tmp_path / "longer_than.sql").write_text(
        "-- Episodes longer than a number of frames.\n--\n-- params:\n"
        "--   min_length (int): shortest episode kept, in frames\n-- returns: episode_index, length\n"
        "SELECT episode_index, length FROM episodes WHERE length > $min_length ORDER BY episode_index\n")
    listed = ok("query", "--list", "--query-dir", tmp_path)
    assert "longer_than" in listed and "min_length" in listed
    out = ok("query", SAMPLE, "--query-dir", tmp_path, "--name", "longer_than", "-p", "min_length=300", "-f", "json")
    got = [json.loads(ln)["episode_index"] for ln in out.splitlines()]
    lengths = dict(zip(episodes["episode_index"].to_pylist(), episodes["length"].to_pylist()))
    assert got == sorted(e for e, n in lengths.items() if n > 300) and got
    r = run("query", SAMPLE, "--query-dir", tmp_path, "--name", "longer_thn", "-p", "min_length=1")
    assert r.returncode == 2 and "usage:" in r.stderr and "longer_than" in r.stderr, (r.returncode, r.stderr)


@pytest.mark.parametrize("args, error", [
    (["--name", "nope"], "no named query 'nope'"),
    (["--name", "split", "-p", "bogus=1"], "no parameter"),
    (["--name", "episodes_by_length"], None),  # the parameters' defaults: a valid run, for contrast
    (["--name", "episodes_by_length", "-p", "min_length=x"], "parameter 'min_length' (int) must be an integer"),
    (["--name", "episodes_by_length", "-p", "min_length=-1"], "parameter 'min_length' (int) must be >= 0"),
    (["--name", "episodes_by_length", "-p", "min_length=99999999999999999999999"], "must fit in a 64-bit integer"),
    (["--name", "last_seconds", "-p", "seconds=0"], "parameter 'seconds' (float) must be > 0"),
    (["--name", "idle_segments", "-p", "feature=timestamp"], "must be a numeric vector feature"),
])
def test_a_bad_named_query_or_parameter_is_a_usage_error(args, error):
    """Exit 2 (the documented usage-error code) with the usage line, the error and the --list hint; before, exit 1."""
    r = run("query", SAMPLE, *args, "-f", "json")
    if error is None:
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 20, r.stderr  # small20's 20 episodes
        return
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "usage: lerobot-sql query" in r.stderr and "Traceback" not in r.stderr
    assert lines[-2].startswith("lerobot-sql query: error: ") and error in lines[-2], r.stderr
    assert lines[-1].startswith("hint: ") and "lerobot-sql query --list" in lines[-1], r.stderr


@pytest.mark.parametrize("command, spelling", [("query", "give SQL (or - to read"),
                                               ("export", "give --sql SQL (or --sql - to read")])
def test_no_query_names_the_commands_own_spelling(tmp_path, command, spelling):
    """query takes the SQL as an argument, export as --sql: the error spoke of positional SQL for both, and
    ``lerobot-sql export DATASET DEST "SELECT ..."`` is refused by argparse."""
    r = run(command, SAMPLE, *([str(tmp_path / "out")] if command == "export" else []))
    assert r.returncode == 2 and f"no query: {spelling}" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_query_list_shows_the_parameter_bounds():
    """The bounds the library enforces (`min_length` >= 0, `seconds` > 0) are listed with the parameters."""
    out = ok("query", "--list")
    assert "-p min_length=INT  (default 0, >= 0)" in out
    assert "-p seconds=FLOAT  (default 1.0, > 0)" in out
    assert "-p max_length=INT  (default 9223372036854775807)" in out  # no bound, none shown


# ---- export --------------------------------------------------------------------------------------------------------
def test_export_windows_then_reopen(tmp_path, data):
    dest = tmp_path / "windows"
    sql = "SELECT episode_index, 1.0 AS start_s, 2.0 AS end_s FROM episodes WHERE episode_index IN (1, 3)"
    out = ok("export", SAMPLE, dest, "--sql", sql, "--quiet")
    assert str(dest) in out
    want = data.filter(pc.and_(pc.is_in(data["episode_index"], pa_ints([1, 3])),
                               pc.and_(pc.greater_equal(data["timestamp"], 1.0), pc.less(data["timestamp"], 2.0))))
    info = json.loads(ok("info", dest, "--json"))
    assert info["episodes"] == 2 and info["frames"] == want.num_rows
    got = pq.read_table(next((dest / "data").rglob("*.parquet")))
    np.testing.assert_array_equal(np.stack(got["action"].to_numpy(zero_copy_only=False)),
                                  np.stack(want.sort_by("index")["action"].to_numpy(zero_copy_only=False)))
    r = run("export", SAMPLE, dest, "--sql", sql, "--quiet")
    assert_error(r, "already exists", "--overwrite")
    assert "--overwrite" in r.stderr.splitlines()[0] and "overwrite=True" not in r.stderr  # the CLI's spelling
    ok("export", SAMPLE, dest, "--sql", "SELECT episode_index FROM episodes WHERE episode_index = 0",
       "--overwrite", "--quiet")
    assert json.loads(ok("info", dest, "--json"))["episodes"] == 1


def pa_ints(values):
    import pyarrow as pa

    return pa.array(values, pa.int64())


# ---- index / prefetch / doctor -------------------------------------------------------------------------------------
def test_index_counts_every_video_frame():
    out = ok("index", SAMPLE, "--quiet")
    for mp4 in sorted((SAMPLE / "videos").rglob("*.mp4")):
        key = mp4.relative_to(SAMPLE / "videos").parts[0]
        with av.open(str(mp4)) as c:
            packets = [p for p in c.demux(c.streams.video[0]) if p.size]
        row = next(ln for ln in out.splitlines() if f" {key} " in ln)
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert int(cells[2]) == len(packets)                         # frames
        assert int(cells[3]) == sum(p.is_keyframe for p in packets)  # keyframes


def test_index_reports_missing_videos(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(SAMPLE, broken)
    victim = next((broken / "videos").rglob("*.mp4"))
    victim.unlink()
    assert_error(run("index", broken, "--quiet"), "1 of 2 video files are missing", str(victim), "doctor")


def test_info_on_a_metadata_only_copy(tmp_path):
    meta_only = tmp_path / "meta_only"
    shutil.copytree(SAMPLE / "meta", meta_only / "meta", ignore=shutil.ignore_patterns("episodes"))
    info = json.loads((SAMPLE / "meta" / "info.json").read_text())
    r = run("info", meta_only)
    assert r.returncode == 0, r.stderr
    assert f"episodes     {info['total_episodes']}   frames {info['total_frames']}" in r.stdout
    warnings = r.stderr.splitlines()
    assert warnings and all(w.startswith("warning: ") for w in warnings), r.stderr


def test_view_writes_one_page_of_the_clips_and_guards_its_file(tmp_path):
    out = tmp_path / "clips.html"
    sql = "SELECT episode_index, 1.0 AS start_s, 2.0 AS end_s FROM episodes WHERE episode_index IN (1, 3, 5)"
    said = ok("view", SAMPLE, "--sql", sql, "-o", out, "--max-clips", "2", "--camera", "observation.images.wrist")
    page = out.read_text()
    assert said.startswith(f"wrote {out}: 2 clips, 2 camera clips (2 copied, 0 re-encoded)")
    assert "left out: 1 more windows of the selection (max_clips=2), of episodes 5" in said
    assert page.count("<video ") == 2 and "episode 1</b>" in page and "episode 3</b>" in page
    assert "Left out: 1 more windows" in page and "data-camera='observation.images.front'" not in page
    assert_error(run("view", SAMPLE, "--sql", sql, "-o", out), "exists", "--overwrite")
    assert_error(run("view", SAMPLE, "-o", SAMPLE / "clips.html"), "inside the source dataset")
    assert not (SAMPLE / "clips.html").exists()
    assert_error(run("view", SAMPLE, "-o", tmp_path / "x.html", "--camera", "observation.images.side"),
                 "camera 'observation.images.side' is unknown")
    ok("view", SAMPLE, "--sql", "SELECT episode_index FROM episodes WHERE episode_index = 0", "-o", out,
       "--overwrite", "--signal", "-")
    assert out.read_text().count("<video ") == 2 and "<svg" not in out.read_text()
    assert run("view", SAMPLE, "-o", out, "--max-clips", "0").returncode == 2


def test_prefetch_runs_on_a_local_dataset():
    ok("prefetch", SAMPLE, "--sql", "SELECT episode_index FROM episodes WHERE episode_index < 2", "--quiet")


def test_doctor_ok_on_sample_and_exit_1_on_a_missing_video(tmp_path):
    report = json.loads(ok("doctor", SAMPLE, "--json"))
    assert report["ok"] is True
    decode = {c["name"]: c for c in report["checks"]}["video_files_decode"]  # opt-in: said not to have run
    assert decode["ok"] and decode["skipped"].startswith("not run") and "--decode" in decode["skipped"]
    broken = tmp_path / "broken"
    shutil.copytree(SAMPLE, broken)
    victim = next((broken / "videos").rglob("*.mp4"))
    victim.unlink()
    r = run("doctor", broken)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert victim.name in r.stdout


def test_doctor_decode_flag_decodes_every_mp4(tmp_path):
    """--decode runs video_files_decode; an mp4 cut short then fails it (exit 1), naming the file."""
    out = ok("doctor", SAMPLE, "--decode")
    assert "ok   video_files_decode" in out
    assert [x.strip() for x in out.splitlines() if "SKIP" in x] == ["SKIP data_images_decode (no image features)"]
    broken = tmp_path / "broken"
    shutil.copytree(SAMPLE, broken)
    rel = "videos/observation.images.wrist/chunk-000/file-000.mp4"
    os.truncate(broken / rel, (broken / rel).stat().st_size // 2)
    r = run("doctor", broken, "--json", "--decode")
    assert r.returncode == 1, (r.stdout, r.stderr)
    c = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["video_files_decode"]
    assert not c["ok"] and [row["path"] for row in c["sample"]] == [rel]


# ---- shell ---------------------------------------------------------------------------------------------------------
def test_shell_runs_a_script(episodes):
    script = ("SELECT count(*) AS n_episodes\n  FROM episodes;\n"   # a statement over two lines
              ".schema tasks\n"
              "SELECT max(length) AS longest FROM episodes; SELECT 41 + 1 AS answer;\n"
              ".views\n.quit\n")
    out = ok("shell", SAMPLE, stdin=script)
    values = [r for r in box_cells(out)]
    assert ["n_episodes"] in values and [str(episodes.num_rows)] in values
    assert [str(pc.max(episodes["length"]).as_py())] in values and ["42"] in values
    assert "  task_index  BIGINT" in out.splitlines()
    assert "\nframes\n" in out and "\ntasks\n" in out  # .views


def test_shell_reports_errors_and_continues():
    r = run("shell", SAMPLE, stdin="SELECT nope FROM tasks;\nSELECT 7 AS seven;\n.bogus\n")
    assert r.returncode == 1  # a piped script with an error fails, like sqlite3 -bail off but with the status
    assert "seven" in r.stdout
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 2 and "nope" in errors[0] and ".bogus" in errors[1]


def test_shell_errors_in_order_and_exit_status():
    script = "SELECT 1 AS first;\nSELECT nope FROM tasks;\nSELECT 2 AS second;\n.quit\nSELECT 3 AS never;\n"
    r = subprocess.run([*CLI, "shell", str(SAMPLE)], input=script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240, cwd=REPO)  # one pipe for both: the order a user sees with 2>&1
    out = r.stdout
    assert r.returncode == 1  # a statement failed; .quit keeps that status
    assert out.index("first") < out.index("error: unknown column 'nope'") < out.index("hint:") < out.index("second")
    assert "never" not in out  # .quit ends the script
    assert "hint: .schema [VIEW]" in out  # inside the shell the schema is a dot command away
    assert run("shell", SAMPLE, stdin="SELECT 1 AS x;\n.quit\n").returncode == 0
    help_text = " ".join(ok("shell", "--help").split())
    assert "exit status" in help_text and "exits 1 if any statement or dot command failed" in help_text


@pytest.mark.timeout(30)
@pytest.mark.parametrize("script, name, value", [
    ("SELECT E'it\\'s; fine' AS a;\n", "a", "it's; fine"),  # a backslash escape in an E'' string
    ("SELECT 1 /* ; */ AS b;\n", "b", "1"),                 # a ';' in a block comment
    ("SELECT $$ ; $$ AS c;\n", "c", ";"),                    # a ';' in a dollar-quoted string (the cell: ' ; ')
    ("SELECT 'x;' -- ;\n AS d;\n", "d", "x;"),              # a ';' in a line comment, the statement on two lines
])
def test_shell_splits_statements_where_sql_ends_them(script, name, value):
    """The shell's splitter, by hand, took the ';' inside E'it\\'s; fine', /* ; */ and $$ ; $$ for statement ends
    (and ran the halves as broken statements); sqlglot's DuckDB tokenizer now finds them: one result each."""
    r = run("shell", SAMPLE, stdin=script + "SELECT 2 AS after;\n")
    assert (r.returncode, r.stderr) == (0, ""), r
    assert r.stdout.count("┌") == 2  # exactly two results: the statement and the one after it
    cells = box_cells(r.stdout)
    assert cells[0] == [name] and cells[2] == [value] and cells[3:] == [["after"], ["int32"], ["2"]], cells


@pytest.mark.timeout(30)
@pytest.mark.parametrize("tail, what", [
    ("SELECT 'unterminated\n", "a string literal"),
    ("SELECT E'it\\'s\n", "a string literal"),
    ("SELECT 1 /* open\n", "a /* comment"),
    ("SELECT $$ open;\n", "a $$ string"),
    ('SELECT 1 AS "open\n', "a quoted identifier"),
])
def test_shell_input_ending_inside_a_quote_is_one_error(tail, what):
    """Piped input ending inside a quote made the shell loop forever at EOF; now the statements before it run and
    the unfinished one is one `error:` line naming what is open and where it starts, exit status 1."""
    r = run("shell", SAMPLE, stdin="SELECT 5 AS before;\n" + tail)
    assert r.returncode == 1, r
    assert box_cells(r.stdout) == [["before"], ["int32"], ["5"]]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert what in errors[0] and "line 2" in errors[0] and "input ended" in errors[0], errors


# ---- bench / demo --------------------------------------------------------------------------------------------------
def test_bench_outside_a_checkout_says_so(tmp_path):
    assert_error(run("bench", "--repo", tmp_path), "source checkout")


@pytest.mark.skipif(not (REPO / "benchmarks" / "run.py").exists(), reason="benchmarks/run.py not written yet")
def test_bench_passes_arguments_through(capfd):
    ok("bench", "--", "--help")  # the benchmark runs as a child: its help is on the real stdout
    assert "usage" in capfd.readouterr().out.lower()


def test_demo_runs_on_the_sample():
    out = ok("demo")
    assert "episodes" in out


def test_collection_info_query_and_doctor(tmp_path):
    """DATASET as a list, a glob or a folder of datasets is a collection: info per dataset with totals, SQL with the
    dataset column, doctor per dataset (exit 1 when one fails)."""
    info = json.loads(ok("info", f"{SAMPLE},{DATASETS / 'h264_20'}", "--json"))
    assert [(d["dataset"], d["episodes"], d["frames"]) for d in info["datasets"]] == \
        [("small20", 20, 4762), ("h264_20", 20, 4307)]
    assert info["frames"] == 4762 + 4307
    out = ok("query", str(DATASETS / "*20"), "SELECT dataset, count(*) AS n FROM frames GROUP BY 1 ORDER BY 1",
             "-f", "csv")
    assert out.splitlines() == ["dataset,n", "h264_20,4307", "small20,4762", "v21_small20,4762"]
    broken = tmp_path / "lab" / "broken"
    shutil.copytree(SAMPLE, broken)
    shutil.copytree(SAMPLE, tmp_path / "lab" / "fine")
    next(iter(sorted(broken.glob("videos/*/*/*.mp4")))).unlink()
    r = run("doctor", str(tmp_path / "lab"), "--json")
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert set(rep) == {"broken", "fine"}
    ok("export", f"{SAMPLE},{DATASETS / 'multifile60'}", tmp_path / "merged", "--quiet", "--sql",
       "SELECT dataset, episode_index FROM episodes WHERE episode_index < 2")
    merged = ok("query", tmp_path / "merged", "SELECT source_dataset, count(*) AS n FROM episodes GROUP BY 1 ORDER BY 1",
                "-f", "csv")
    assert merged.splitlines() == ["source_dataset,n", "multifile60,2", "small20,2"]
    # one broken dataset in the folder stops none of the others' reports
    bad = tmp_path / "lab" / "badjson"
    shutil.copytree(SAMPLE, bad)
    (bad / "meta/info.json").write_text("{")
    rep = json.loads(run("doctor", str(tmp_path / "lab"), "--json", "--no-video").stdout)
    assert set(rep) == {"badjson", "broken", "fine"}
    assert rep["fine"]["ok"] and not rep["badjson"]["ok"]
    (bad / "meta/info.json").unlink()
    # a camera whose codec differs is left out with --features; the refusal's hint says how
    r = run("export", f"{SAMPLE},{DATASETS / 'h264_20'}", tmp_path / "mixed", "--quiet", "--sql",
            "SELECT dataset, episode_index FROM episodes WHERE episode_index < 1")
    assert r.returncode == 1 and "codec" in r.stderr and "--features" in r.stderr, r.stderr
    ok("export", f"{SAMPLE},{DATASETS / 'h264_20'}", tmp_path / "mixed", "--quiet", "--features",
       "observation.state,action", "--sql", "SELECT dataset, episode_index FROM episodes WHERE episode_index < 1")
    assert json.loads((tmp_path / "mixed/meta/info.json").read_text())["total_episodes"] == 2
    r = run("query", str(SAMPLE), "SELECT 1", "--timeout", "0")
    assert r.returncode == 2 and "number of seconds > 0" in r.stderr and "Traceback" not in r.stderr
    r = run("query", str(tmp_path / "lab"), "--name", "episodes_by_task", "-p", "text=x")
    assert r.returncode == 2 and "named queries" in r.stderr, (r.returncode, r.stderr)


def test_collection_index_and_one_dataset_commands(tmp_path):
    """index over a collection counts each dataset's mp4s (small20 and h264_20 both have
    videos/<camera>/chunk-000/file-000.mp4: 2 files per camera, not 1) and ends without a traceback (it crashed on
    the collection's missing cache_dir); prefetch takes one dataset and says so (exit 2, no traceback: it crashed
    on a missing attribute), its --help says one dataset; train takes the list as a collection (its selection is
    asked for first). export --features on one dataset names the way that exists."""
    both = f"{SAMPLE},{DATASETS / 'h264_20'}"
    out = ok("index", both, "--quiet", "--cache-dir", tmp_path / "cache")
    rows = [ln for ln in out.splitlines() if "observation.images" in ln]
    assert len(rows) == 2 and all(ln.split("│")[2].strip() == "2" for ln in rows), out
    assert "9069" in rows[0]  # 4762 + 4307 frames per camera
    r = run("prefetch", both)
    assert r.returncode == 2 and "names several datasets" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "one dataset" in " ".join(ok("prefetch", "--help").split())
    r = run("train", both, "--", "--steps=1")
    assert r.returncode == 2 and "no selection" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "a mixture" in " ".join(ok("train", "--help").split())
    r = run("export", SAMPLE, tmp_path / "x", "--features", "observation.state", "--sql",
            "SELECT episode_index FROM episodes LIMIT 1")
    assert r.returncode == 2 and "connect_many([root])" in r.stderr, r.stderr


def test_timeout_bounds_writing_the_rows_too():
    """--timeout covers the whole command: a runaway cross join (22.7M rows) whose query is done in a second used to
    spend minutes writing JSON Lines."""
    r = run("query", SAMPLE, "SELECT a.index, b.index FROM frames a, frames b", "--timeout", "1", "-f", "json")
    assert_error(r, "timeout of 1 s", "--timeout")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
@pytest.mark.parametrize("out", [[], ["-o", "-"]])
def test_parquet_to_a_terminal_is_refused(tmp_path, out):
    """Binary Parquet is never written to a terminal: a usage error naming --output (a redirect or -o FILE works)."""
    primary, secondary = os.openpty()
    try:
        r = subprocess.run([*CLI, "query", str(SAMPLE), "SELECT 1 AS a", "-f", "parquet", *out], stdout=secondary,
                           stderr=subprocess.PIPE, text=True, timeout=240, cwd=REPO)
        os.close(secondary)
        written = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(primary, 4096):
                written += chunk
    finally:
        os.close(primary)
    assert r.returncode == 2 and "--format parquet needs --output FILE.parquet" in r.stderr, r.stderr
    assert b"PAR1" not in written
    ok("query", SAMPLE, "SELECT 1 AS a", "-f", "parquet", "-o", tmp_path / "a.parquet")
    assert pq.read_table(tmp_path / "a.parquet").to_pylist() == [{"a": 1}]


# ---- -o FILE: where the result may be written ----------------------------------------------------------------------
def _read_result(path: Path, fmt: str) -> dict[int, int]:
    """episode_index -> length from a result file of `SELECT episode_index, length FROM episodes`."""
    if fmt == "csv":
        return {int(r["episode_index"]): int(r["length"]) for r in csv.DictReader(path.open())}
    if fmt == "json":
        return {r["episode_index"]: r["length"] for r in map(json.loads, path.read_text().splitlines())}
    t = pq.read_table(path)
    return dict(zip(t["episode_index"].to_pylist(), t["length"].to_pylist()))


@pytest.mark.parametrize("target", ["meta/info.json", "data/chunk-000/file-000.parquet"])
def test_output_inside_the_source_is_refused(tmp_path, target):
    """`query ... -o <root>/meta/info.json` (or a data Parquet file) overwrote it and broke the dataset; now the
    rule of export_manifest: exit 1 naming the file and the source, the file unchanged byte for byte, with or
    without --overwrite, for one dataset and for a collection holding it."""
    root = tmp_path / "ds"
    shutil.copytree(SAMPLE, root)
    path = root / target
    before = path.read_bytes()
    for dataset in (root, f"{root},{DATASETS / 'multifile60'}"):
        for extra in ([], ["--overwrite"]):
            r = run("query", dataset, "SELECT 1 AS x", "-f", "json", "-o", path, *extra)
            assert_error(r, str(path), "inside the source dataset", "outside")
            assert path.read_bytes() == before
    assert ok("query", root, "SELECT count(*) AS n FROM frames", "-f", "csv").splitlines() == ["n", "4762"]
    assert not [p for p in root.rglob(".lsql-tmp-*")]


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_output_over_an_existing_file_needs_overwrite(tmp_path, episodes, fmt):
    """`-o FILE` replaced any existing file; now it is refused unless --overwrite (exit 1, the file named, the hint
    says --overwrite), and with --overwrite the file holds the new result."""
    path = tmp_path / f"out.{fmt}"
    path.write_bytes(b"the user's file\n")
    sql = "SELECT episode_index, length FROM episodes ORDER BY episode_index"
    r = run("query", SAMPLE, sql, "-o", path)
    assert_error(r, str(path), "exists", "--overwrite")
    assert "overwrite=True" not in r.stderr and path.read_bytes() == b"the user's file\n"
    ok("query", SAMPLE, sql, "-o", path, "--overwrite")
    assert _read_result(path, fmt) == dict(zip(episodes["episode_index"].to_pylist(), episodes["length"].to_pylist()))
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_output_onto_a_fifo_or_device_is_refused_and_left_as_it_is(tmp_path):
    """`-o FIFO --overwrite` (or a character device: as root `-o /dev/null --overwrite` replaced the system's
    /dev/null) renamed a regular file over it: now refused before the query runs (exit 1, its kind named, the
    stdout redirect suggested), and it is still a FIFO / device."""
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    targets = [(fifo, "a FIFO", stat.S_ISFIFO)]
    if os.geteuid() == 0:  # a device node needs root (CI runs as root)
        dev = tmp_path / "null"
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append((dev, "a character device", stat.S_ISCHR))
    for path, kind, is_kind in targets:
        r = run("query", SAMPLE, "SELECT 1 AS x", "-o", path, "--overwrite", "-f", "csv")
        assert_error(r, str(path), f"is {kind}", "redirect")
        assert is_kind(os.lstat(path).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p, _, _ in targets)


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet", "table"])
def test_a_query_failing_at_run_time_leaves_the_old_file(tmp_path, fmt):
    """A query that fails while it runs (a cast) truncated the old file (table: it was opened before the query ran);
    now the result goes to a temporary name that is renamed only on success: the old file stays byte for byte and no
    temporary file is left."""
    path = tmp_path / f"out.{'txt' if fmt == 'table' else fmt}"
    path.write_bytes(b"the old result\n")
    r = run("query", SAMPLE, "SELECT index, CASE WHEN index < 3000 THEN index ELSE 'a'::INT END AS x FROM frames",
            "-o", path, "--overwrite", "-f", fmt)
    assert_error(r, "Conversion")
    assert path.read_bytes() == b"the old result\n" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_timeout_while_writing_leaves_the_old_file(tmp_path):
    """--timeout stopping a runaway while its JSON Lines were written left a partial file in place of the old one
    (the writing takes minutes, the cross join a second); now the old file stays and no temporary file is left."""
    path = tmp_path / "out.json"
    path.write_bytes(b"the old result\n")
    r = run("query", SAMPLE, "SELECT a.index, b.index FROM frames a, frames b", "--timeout", "1", "-o", path,
            "--overwrite")
    assert_error(r, "timeout of 1 s", "--timeout")
    assert path.read_bytes() == b"the old result\n" and [p.name for p in tmp_path.iterdir()] == [path.name]


CROSS_JOIN = "SELECT count(*) FROM frames a, frames b, frames c WHERE (a.index * b.index + c.index) % 1000003 = 7"


def test_query_ctrl_c_exits_130_within_a_second():
    """Ctrl-C (SIGINT from outside, once a second) during `lerobot-sql query` of a filtered cross join: exit 130 and
    "interrupted" (within about a second; asserted only far below the query's minutes, so a loaded machine cannot
    fail it). Before, the signal waited for the query to end: only --timeout (the test's safety net) stopped it,
    exit 1."""
    # the console script's main() after its imports (signals start once "ready" is out: on a loaded machine one sent
    # a second after the start landed in the imports, before any handler, and killed the interpreter: -2)
    launch = "import sys; from lerobot_sql.cli import main; print('ready', flush=True); sys.exit(main())"
    r = ctrl_c_from_outside(["-c", launch, "query", str(SAMPLE), CROSS_JOIN, "--timeout", "120"],
                            start_after="ready")
    assert r.returncode == 130 and "interrupted" in r.stderr and "Traceback" not in r.stderr, r
    assert r.secs is not None and r.secs < 60, r


@pytest.mark.parametrize("raised", ["runtime", "duckdb"])
def test_ctrl_c_while_the_views_are_made_exits_130(monkeypatch, raised):
    """A Ctrl-C that DuckDB sees itself while the catalog is made (no query guard armed yet): DuckDB raises a bare
    RuntimeError("Query interrupted") or InterruptException. Before: a traceback and exit 1 (seen in 11 of 30
    loaded runs of the test above); now exit 130 "interrupted", and connect() raises KeyboardInterrupt."""
    import duckdb

    from lerobot_sql._catalog import views

    def interrupted(*a, **k):
        raise RuntimeError("Query interrupted") if raised == "runtime" else duckdb.InterruptException("INTERRUPT")

    monkeypatch.setattr(views, "register_views", interrupted)
    r = run_cli("query", SAMPLE, "SELECT 1")
    assert r.returncode == 130 and r.stderr.strip().splitlines()[-1] == "interrupted" and "Traceback" not in r.stderr, r
    with pytest.raises(KeyboardInterrupt):
        lsql.connect(SAMPLE).sql("SELECT 1").fetchall()


def test_a_query_stopped_at_its_timeout_exits_1_saying_timeout_not_interrupted():
    """--timeout stops DuckDB with the same interrupt as Ctrl-C: the CLI must tell them apart by the guard's reason
    (its check for Ctrl-C walked the error's causes and took the timeout's DuckDB interrupt for a Ctrl-C: exit 130,
    "interrupted")."""
    r = run_cli("query", SAMPLE, CROSS_JOIN, "--timeout", "0.5")
    assert r.returncode == 1 and "timeout" in r.stderr and "interrupted" not in r.stderr.splitlines()[-1], r


def test_shell_ctrl_c_stops_the_query_and_the_shell_goes_on():
    """Ctrl-C during a shell statement (signals start once the first statement's result is out): that statement
    reports "interrupted" and the next one runs."""
    r = ctrl_c_from_outside(["-m", "lerobot_sql.cli", "shell", str(SAMPLE)],
                            stdin=f"SELECT 'ready_1' AS r;\n{CROSS_JOIN};\nSELECT 7 AS seven;\n", start_after="ready_1")
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "interrupted (Ctrl-C)" in errors[0], r
    assert ["7"] in box_cells(r.stdout) and r.returncode == 1, r
    assert r.secs is not None and r.secs < 60, r


def test_shell_ctrl_c_while_a_statement_is_checked_reports_it_interrupted(monkeypatch, capsys):
    """A Ctrl-C landing while the shell's statement is still checked (Python raises KeyboardInterrupt there, before
    the query's guard: CI stop 53's floor leg, the signal 50 ms after the first result) reports that statement
    "interrupted (Ctrl-C)" and the next one runs, as one during the run does; before, the shell printed "^C" as
    at its prompt and dropped the statement silently (exit 0 for a piped script)."""
    import io

    from lerobot_sql.cli.shell import SQLShell

    db = lsql.connect(SAMPLE)
    real = db.sql

    def sql(text, **kw):
        if "boom" in text:
            raise KeyboardInterrupt
        return real(text, **kw)

    monkeypatch.setattr(db, "sql", sql)
    shell = SQLShell(db, stdin=io.StringIO("SELECT 'boom' AS b;\nSELECT 7 AS seven;\n"))
    shell.use_rawinput = False
    assert shell.run() == 1
    out = capsys.readouterr()
    errors = [ln for ln in out.err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "interrupted (Ctrl-C)" in errors[0] and "boom" in errors[0], out.err
    assert "^C" not in out.err and ["7"] in box_cells(out.out), out


def test_shell_ctrl_c_while_a_result_is_drawn_reports_it_and_goes_on(monkeypatch, capsys):
    """The shell draws a result with DuckDB's box renderer on a connection of its own, unguarded: a Ctrl-C there is
    DuckDB's bare RuntimeError("Query interrupted") (its own signal check), which escaped the shell (exit 130, the
    statements after it lost) instead of that statement being reported interrupted as during its run."""
    import io

    from lerobot_sql._catalog import sandbox
    from lerobot_sql.cli.shell import SQLShell

    real = sandbox.connect

    class Drawing:  # the renderer's own connection (connect() without a config), whose show() DuckDB interrupts
        def __init__(self, con):
            self._con = con

        def from_arrow(self, table):
            rel = self._con.from_arrow(table)
            if "boom" not in table.column_names:
                return rel

            class Interrupted:
                def show(self, **kw):
                    raise RuntimeError("Query interrupted")
            return Interrupted()

        def close(self):
            self._con.close()

    monkeypatch.setattr(sandbox, "connect", lambda config=None: real(config) if config is not None else Drawing(real()))
    shell = SQLShell(lsql.connect(SAMPLE), stdin=io.StringIO("SELECT 1 AS boom;\nSELECT 7 AS seven;\n"))
    shell.use_rawinput = False
    assert shell.run() == 1
    out = capsys.readouterr()
    errors = [ln for ln in out.err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "interrupted (Ctrl-C)" in errors[0] and "boom" in errors[0], out.err
    assert ["7"] in box_cells(out.out), out


def test_ctrl_c_while_a_sidecar_is_described_is_no_unreadable_view(monkeypatch, tmp_path):
    """`.schema` / `lerobot-sql schema` describe a sidecar view through db.sql, whose errors become "(unreadable)":
    a Ctrl-C while that query is checked (db.sql: QueryInterrupted "sigint" since 6421df5, before a bare
    RuntimeError that propagated) must stop the listing as the user asked, not list the view as unreadable and go
    on (exit 0)."""
    from lerobot_sql.cli.output import views_and_columns

    root = tmp_path / "ds"
    shutil.copytree(SAMPLE, root)
    (root / "meta/temporal_proportions_sparse.json").write_text('{"reach": 0.4, "grasp": 0.6}')
    db = lsql.connect(root)
    real = db.sql

    def sql(text, **kw):
        if "LIMIT 0" in text:
            raise lsql.QueryInterrupted.ctrl_c(text)
        return real(text, **kw)

    monkeypatch.setattr(db, "sql", sql)
    with pytest.raises(KeyboardInterrupt):
        views_and_columns(db)


# ---- --attach and sidecar views (issue 39) --------------------------------------------------------------------------
def test_attach_a_keep_list_to_query_shell_and_export(tmp_path, episodes):
    keep = tmp_path / "keep.csv"
    keep.write_text("episode_index,score\n2,0.9\n5,0.1\n")
    lengths = dict(zip(episodes["episode_index"].to_pylist(), episodes["length"].to_pylist()))
    out = [json.loads(line) for line in ok("query", SAMPLE, "SELECT episode_index, length FROM episodes JOIN keep "
                                           "USING (episode_index) ORDER BY 1", "--attach", f"keep={keep}", "-f",
                                           "json").splitlines()]
    assert out == [{"episode_index": 2, "length": lengths[2]}, {"episode_index": 5, "length": lengths[5]}]
    shell = ok("shell", SAMPLE, "--attach", f"keep={keep}", stdin="SELECT sum(score) AS s FROM keep;\n.schema keep\n")
    assert ["1.0"] in box_cells(shell) and "  score          DOUBLE" in shell.splitlines()
    dest = tmp_path / "kept"
    ok("export", SAMPLE, str(dest), "--sql", "SELECT episode_index FROM episodes JOIN keep USING (episode_index) "
       "WHERE score > 0.5", "--attach", f"keep={keep}", "-q")
    assert lsql.connect(dest).sql("SELECT count(*), sum(length) FROM episodes").fetchall() == [(1, lengths[2])]
    assert_error(run("query", SAMPLE, "SELECT 1", "--attach", f"frames={keep}"), "name of a view")
    assert_error(run("query", SAMPLE, "SELECT 1", "--attach", f"k={tmp_path / 'gone.csv'}"), "no such file")
    r = run("query", SAMPLE, "SELECT 1", "--attach", "nothing")
    assert r.returncode == 2 and "expected NAME=PATH" in r.stderr
    r = run("query", SAMPLE, "SELECT 1", "--attach", f"k={tmp_path / 'k.xlsx'}")
    assert r.returncode == 2 and "--attach k=" in r.stderr and "format" in r.stderr


def test_schema_lists_a_sidecars_columns_and_an_unreadable_one(tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(SAMPLE, root)
    (root / "meta/temporal_proportions_sparse.json").write_text('{"reach": 0.4, "grasp": 0.6}')
    (root / "meta/broken.json").write_text("{")
    got = json.loads(ok("schema", root, "--json"))
    assert got["temporal_proportions_sparse"] == [{"column": "key", "type": "VARCHAR"},
                                                  {"column": "value", "type": "JSON"}]
    assert got["broken"][0]["column"] == "(unreadable)" and "not valid JSON" in got["broken"][0]["type"]
    assert got["sidecars"] and got["frames"]


# ---- cache ----------------------------------------------------------------------------------------------------------
def test_cache_lists_each_datasets_folder_and_clears_one_or_all(tmp_path):
    """`lerobot-sql cache`: every dataset's cache folder under the cache root, named by the dataset it serves (recorded
    at the first open), with its size on disk; --clear removes one (as listed, or by folder name), --clear-all every
    one; an unknown dataset is a usage error naming the known ones."""
    from lerobot_sql._storage import cache

    root = tmp_path / "cache"
    env = {"LSQL_CACHE_DIR": str(root)}
    for name in ("small20", "multifile60"):
        assert run_cli("query", DATASETS / name, "SELECT count(*) FROM frames", env=env).returncode == 0
    (root / "0123456789abcdef01234567").mkdir()  # (a folder of an older version: no dataset recorded)
    (root / "not-a-dataset").mkdir()
    listed = {e.folder.name: e for e in cache.dataset_caches(root)}
    assert len(listed) == 3 and "not-a-dataset" not in listed
    urls = {e.url for e in listed.values()}
    assert urls == {str((DATASETS / "small20").resolve()), str((DATASETS / "multifile60").resolve()), None}
    out = run_cli("cache", env=env).stdout
    assert str((DATASETS / "multifile60").resolve()) in out and "(unknown: made by an older version)" in out
    assert "3 dataset cache folder(s)" in out
    js = json.loads(run_cli("cache", "--json", env=env).stdout)
    assert {j["dataset"] for j in js} == urls and all(j["bytes"] >= 0 for j in js)
    r = run_cli("cache", "--clear", DATASETS / "small20", env=env)
    assert r.returncode == 0 and "1 cache folder(s) removed" in r.stdout
    assert {e.url for e in cache.dataset_caches(root)} == urls - {str((DATASETS / "small20").resolve())}
    r = run_cli("cache", "--clear", "nope", env=env)
    assert r.returncode == 2 and "no cache folder" in r.stderr and "multifile60" in r.stderr
    r = run_cli("cache", "--clear", "0123456789abcdef01234567", env=env)
    assert r.returncode == 0 and not (root / "0123456789abcdef01234567").exists()
    r = run_cli("cache", "--clear-all", env=env)
    assert r.returncode == 0 and cache.dataset_caches(root) == [] and (root / "not-a-dataset").exists()
    assert "no dataset cache folders" in run_cli("cache", env=env).stdout


def test_cache_clear_of_the_root_path_removes_no_folder_of_an_unknown_dataset(tmp_path):
    """`--clear /` (or `//`, `/..`) names no dataset: before, the folders whose dataset is not recorded (an older
    version's, url None) compared their url "" with "/" stripped of its slashes, and every one of them was removed.
    A source.json whose url is null records no dataset (it was listed as the dataset "None")."""
    from lerobot_sql._storage import cache

    root = tmp_path / "cache"
    (root / "0123456789abcdef01234567").mkdir(parents=True)
    (root / "nulled").mkdir()
    (root / "nulled" / "source.json").write_text(json.dumps({"url": None}))
    env = {"LSQL_CACHE_DIR": str(root)}
    assert {e.url for e in cache.dataset_caches(root)} == {None}
    for arg in ("/", "//", "/..", "None"):
        r = run_cli("cache", "--clear", arg, env=env)
        assert r.returncode == 2 and "no cache folder" in r.stderr, (arg, r.stdout)
    assert (root / "0123456789abcdef01234567").is_dir() and (root / "nulled").is_dir()


def test_cache_never_lists_or_clears_a_folder_given_as_cache_dir(tmp_path):
    """A folder given as connect(cache_dir=...) is the caller's (it may hold their work): no source.json is written in
    it, and under a cache root --clear-all removes only the folders the library named (by the dataset's key)."""
    from lerobot_sql._storage import cache

    root = tmp_path / "cache"
    mine = root / "my_project"
    (mine / "notes").mkdir(parents=True)
    lsql.connect(DATASETS / "small20", cache_dir=mine).sql("SELECT count(*) FROM frames").fetchall()
    assert not (mine / cache.SOURCE_FILE).exists()
    (mine / cache.SOURCE_FILE).write_text('{"url": "x"}')  # (even one that looks recorded)
    assert run_cli("query", DATASETS / "small20", "SELECT 1", env={"LSQL_CACHE_DIR": str(root)}).returncode == 0
    assert [e.url for e in cache.dataset_caches(root)] == [str((DATASETS / "small20").resolve())]
    assert run_cli("cache", "--clear-all", env={"LSQL_CACHE_DIR": str(root)}).returncode == 0
    assert (mine / "notes").is_dir() and cache.dataset_caches(root) == []
    r = run_cli("cache", "--clear", "x", "--clear-all", env={"LSQL_CACHE_DIR": str(root)})
    assert r.returncode == 2 and "not allowed with" in r.stderr


def test_every_sub_folder_a_dataset_cache_gets_is_a_named_part(tmp_path):
    """A dataset's cache folder after queries, the episode_quality view, video frames, a training set's items and a
    DataLoader-style per-sample file holds only sub-folders that ``cache.PARTS`` names (what ``lerobot-sql cache``
    recognises a folder by, and what the modules writing them take their names from): a new kind of entry written
    under another name fails here until it is named there."""
    from lerobot_sql._storage import cache

    mine = tmp_path / "mine"
    db = lsql.connect(DATASETS / "small20", cache_dir=mine)
    assert db.sql("SELECT count(*) FROM frames WHERE episode_index = 3").fetchall() == [(390,)]
    assert db.sql("SELECT count(*) FROM episode_quality").fetchall() == [(20,)]
    assert db.sql("SELECT count(*) FROM camera_frames WHERE episode_index = 0").fetchall()[0][0] > 0
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index < 2")
    assert int(ds[5]["index"]) == 5 and tuple(ds[5][ds.meta.camera_keys[0]].shape)[0] == 3
    made = {p.name for p in mine.iterdir() if p.is_dir()}
    assert {cache.ROW_GROUPS, cache.VIDEO_INDEX, cache.QUALITY} <= made, made
    assert made <= set(cache.PARTS), made - set(cache.PARTS)
    assert cache.is_dataset_folder(mine) and not cache.is_dataset_folder(tmp_path)


def test_cache_marks_a_gone_dataset_and_names_a_folder_given_as_cache_dir(tmp_path):
    """A new user's trial: `cache --cache-dir X` where X was given as connect(cache_dir=X) said only "no dataset cache
    folders under X" (and --clear of its dataset failed the same way): now it says X is itself a dataset's cache
    folder, theirs to delete. A local dataset deleted since is marked as gone in the listing."""
    src = tmp_path / "ds"
    shutil.copytree(DATASETS / "small20", src, ignore=shutil.ignore_patterns("videos"))
    mine = tmp_path / "mine"
    assert int(lsql.connect(src, cache_dir=mine).dataset(cameras=[])[3]["index"]) == 3  # (its row group stored)
    r = run_cli("cache", "--cache-dir", mine)
    assert r.returncode == 0 and "no dataset cache folders" in r.stdout and "is itself a dataset's cache folder" in r.stdout
    r = run_cli("cache", "--cache-dir", mine, "--clear", src)
    assert r.returncode == 2 and "is itself a dataset's cache folder" in r.stderr and mine.is_dir()
    root = tmp_path / "cache"
    assert run_cli("query", src, "SELECT count(*) FROM frames", env={"LSQL_CACHE_DIR": str(root)}).returncode == 0
    assert "(gone" not in run_cli("cache", env={"LSQL_CACHE_DIR": str(root)}).stdout
    shutil.rmtree(src)
    out = run_cli("cache", env={"LSQL_CACHE_DIR": str(root)}).stdout
    assert f"{src.resolve()} (gone: nothing there now)" in out
