"""Hostile SQL: one test per attack, against both walls.

First wall: ``Database.sql`` (and so ``dataset``/``manifest``/``query``/the CLI) accepts one read-only query over our
views (``lerobot_sql._query.checks`` checks with sqlglot, then DuckDB's own parser must agree). Second wall:
``sandbox.lock_down`` (DuckDB's external access off outside the dataset root and our cache, configuration locked)
holds even for SQL sent straight to ``db.con``.

Every attack targets a copy of small20 and a secret file *outside* it; a test passes only if the attack is refused
with a typed error, the secret's content never comes back, no file appears and the views are intact.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from lerobot_sql._catalog import connection
from lerobot_sql._catalog.sandbox import default_config, lock_down
from lerobot_sql.errors import QueryError, ResultContractError

pytestmark = pytest.mark.timeout(60)

SECRET = "TOPSECRET-5f3a"


@pytest.fixture(scope="module")
def world(tmp_path_factory, datasets):
    """(dataset copy, secret csv outside it, folder where attacks try to write)."""
    base = tmp_path_factory.mktemp("security")
    shutil.copytree(datasets / "small20", base / "ds")
    secret = base / "outside" / "secret.csv"
    secret.parent.mkdir()
    secret.write_text(f"a,b\n{SECRET},1\n")
    (base / "drop").mkdir()
    return base / "ds", secret, base / "drop"


@pytest.fixture(scope="module")
def db(world):
    """One connection for all attacks: each must also leave it as it was."""
    root, _, _ = world
    with lsql.connect(root, cache_dir=root.parent / "cache") as d:
        yield d


def _intact(db, world) -> None:
    root, _, drop = world
    assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]
    assert db.sql("SELECT count(*) FROM frames").fetchall() == [(pq.read_metadata(root / "data/chunk-000/file-000.parquet").num_rows,)]
    assert list(drop.iterdir()) == []
    tables = {r[0] for r in db.con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert "pwn" not in tables


# ---- first wall: Database.sql ----------------------------------------------------------------------------------
# name -> SQL template ({S}: the secret's path, {D}: a writable folder outside the dataset)
ATTACKS = {
    # statements other than queries
    "drop_view": "DROP VIEW episodes",
    "create_view_over_file": "CREATE VIEW v AS SELECT * FROM read_csv('{S}')",
    "create_table": "CREATE TABLE pwn AS SELECT 1",
    "create_macro": "CREATE MACRO pwn(x) AS x",
    "insert": "INSERT INTO features SELECT * FROM features",
    "update": "UPDATE features SET dtype = 'x'",
    "delete": "DELETE FROM features",
    "copy_to": "COPY (SELECT 1) TO '{D}/out.csv'",
    "copy_from": "COPY features FROM '{S}'",
    "export_database": "EXPORT DATABASE '{D}/exp'",
    "attach": "ATTACH '{D}/x.db' AS x",
    "detach": "DETACH memory",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "pragma": "PRAGMA threads=1",
    "set": "SET enable_external_access = true",
    "reset": "RESET memory_limit",
    "set_variable": "SET VARIABLE x = 1",
    "call": "CALL duckdb_settings()",
    "use": "USE memory",
    "begin": "BEGIN TRANSACTION",
    "checkpoint": "CHECKPOINT",
    "vacuum": "VACUUM",
    "explain_analyze": "EXPLAIN ANALYZE SELECT 1",
    "describe": "DESCRIBE episodes",
    "summarize": "SUMMARIZE episodes",
    "create_secret": "CREATE SECRET (TYPE s3, KEY_ID 'x', SECRET 'y')",
    # several statements in one string, however hidden
    "two_statements": "SELECT 1; CREATE TABLE pwn AS SELECT 1",
    "after_line_comment": "SELECT 1 AS x -- c\n; CREATE TABLE pwn AS SELECT 1",
    "after_cr_comment": "SELECT 1 AS x --\r; CREATE TABLE pwn AS SELECT 1",
    "after_nested_comment": "SELECT 1 AS x /* /* */ */ ; CREATE TABLE pwn AS SELECT 1",
    "backslash_quote": "SELECT 'a\\'; CREATE TABLE pwn AS SELECT 1; --' AS x",
    "after_nul": "SELECT 1 AS x\x00; CREATE TABLE pwn AS SELECT 1",
    "fullwidth_semicolon": "SELECT 1 AS x\uff1b CREATE TABLE pwn AS SELECT 1",
    # table functions and file paths, in every position
    "read_csv_from": "SELECT * FROM read_csv('{S}')",
    "read_csv_from_first": "FROM read_csv('{S}') SELECT *",
    "read_csv_subquery_in": "SELECT episode_index FROM episodes WHERE episode_index IN (SELECT b FROM read_csv('{S}'))",
    "read_csv_scalar": "SELECT (SELECT a FROM read_csv('{S}')) AS x FROM episodes LIMIT 1",
    "read_csv_exists": "SELECT 1 AS x WHERE EXISTS (SELECT * FROM read_csv('{S}'))",
    "read_csv_cte": "WITH x AS (SELECT * FROM read_csv('{S}')) SELECT * FROM x",
    "read_csv_lateral": "SELECT * FROM episodes, LATERAL (SELECT * FROM read_csv('{S}')) LIMIT 1",
    "read_csv_join": "SELECT * FROM episodes e JOIN read_csv('{S}') c ON true LIMIT 1",
    "read_csv_positional": "SELECT * FROM episodes POSITIONAL JOIN read_csv('{S}') LIMIT 1",
    "read_csv_union": "SELECT 'x' AS a, 1 AS b UNION ALL SELECT * FROM read_csv('{S}')",
    "read_csv_unnest": "SELECT * FROM unnest((SELECT list(a) FROM read_csv('{S}')))",
    "read_csv_in_macro_arg": "SELECT * FROM first_event((SELECT count(*) FROM read_csv('{S}')) > 0)",
    "read_csv_auto": "SELECT * FROM read_csv_auto('{S}')",
    "read_text": "SELECT * FROM read_text('{S}')",
    "read_blob": "SELECT * FROM read_blob('{S}')",
    "read_json": "SELECT * FROM read_json_auto('{S}')",
    "read_parquet_list": "SELECT * FROM read_parquet(['{S}'])",
    "parquet_scan": "SELECT * FROM parquet_scan('{S}')",
    "sniff_csv": "SELECT * FROM sniff_csv('{S}')",
    "query_function": "SELECT * FROM query('SELECT * FROM read_csv(''{S}'')')",
    "query_table_function": "SELECT * FROM query_table('{S}')",
    "glob": "SELECT * FROM glob('/etc/*')",
    "string_path_in_from": "SELECT * FROM '{S}'",
    "quoted_path_in_from": 'SELECT * FROM "{S}"',
    "from_first_path": "FROM '{S}'",
    "replacement_scan_name": "SELECT * FROM secret.csv",
    "qualified_catalog": "SELECT * FROM information_schema.tables",
    "qualified_memory": "SELECT * FROM memory.main.episodes",
    "duckdb_settings": "SELECT * FROM duckdb_settings()",
    "duckdb_extensions": "SELECT * FROM duckdb_extensions()",
    "range_function": "SELECT * FROM range(1000000000000)",
    "getenv": "SELECT getenv('HOME') AS h FROM episodes LIMIT 1",
    "unknown_view": "SELECT * FROM pg_catalog_users",
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_first_wall_refuses(db, world, name):
    root, secret, drop = world
    sql = ATTACKS[name].format(S=secret, D=drop)
    with pytest.raises(QueryError) as e:
        db.sql(sql).fetchall()
    assert SECRET not in str(e.value)
    _intact(db, world)


@pytest.mark.parametrize("entry", ["dataset", "manifest", "export_manifest"])
def test_every_entry_point_checks(db, world, entry, tmp_path):
    _, secret, _ = world
    sql = f"SELECT b AS episode_index FROM read_csv('{secret}')"
    args = (sql, tmp_path / "m.parquet") if entry == "export_manifest" else (sql,)
    with pytest.raises(QueryError, match="table functions"):
        getattr(db, entry)(*args)
    assert not (tmp_path / "m.parquet").exists()


def test_quoted_semicolons_are_data_not_statements(db, world):
    # Both parsers see one statement here; the answer is the literal text.
    for sql, want in (("SELECT ';CREATE TABLE pwn AS SELECT 1' AS x", ";CREATE TABLE pwn AS SELECT 1"),
                      ("SELECT $$ ; CREATE TABLE pwn AS SELECT 1; $$ AS x", " ; CREATE TABLE pwn AS SELECT 1; "),
                      ("SELECT E'a\\'; CREATE TABLE pwn AS SELECT 1; --' AS x", "a'; CREATE TABLE pwn AS SELECT 1; --")):
        assert db.sql(sql).fetchall() == [(want,)]
    _intact(db, world)


def test_duckdb_parser_must_agree(db, monkeypatch):
    """If sqlglot ever missed a second statement, DuckDB's own parser still stops it."""
    from lerobot_sql._query import checks as query

    # simulate a first-wall gap: the SQL passes sqlglot's checks unchanged
    monkeypatch.setattr(query, "check_sql", lambda sql, ctx: query.CheckedQuery(sql, None, frozenset(), False))
    with pytest.raises(QueryError, match=r"2 statement\(s\).*DROP"):
        db.sql("SELECT 1; DROP VIEW episodes")
    assert db.con.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]


# ---- huge results and resource bounds ----------------------------------------------------------------------------
def test_runaway_result_fails_fast(db, monkeypatch):
    monkeypatch.setattr(connection, "MAX_RESULT_ROWS", 100_000)
    # frames x frames x frames: 1e11 rows; only MAX_RESULT_ROWS + 1 are ever produced.
    with pytest.raises(ResultContractError, match="more than 100,000 rows"):
        db.dataset("SELECT a.index FROM frames a, frames b, frames c")


def test_memory_limit_gives_typed_error_and_connection_survives(world):
    root, _, _ = world
    with lsql.connect(root, cache_dir=root.parent / "cache", threads=1, memory_limit="64MB") as small:
        assert small.con.sql("SELECT current_setting('threads')").fetchall() == [(1,)]
        with pytest.raises(QueryError, match="(?i)out of memory"):
            small.sql("SELECT string_agg(a.index::VARCHAR || b.index::VARCHAR, ',') AS s "
                      "FROM frames a, frames b").fetchall()
        assert small.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]


def test_default_resources_suit_a_small_machine(db):
    cfg = default_config()
    mib = int(cfg["memory_limit"].removesuffix("MiB"))
    assert 256 <= mib <= 4096 and cfg["threads"] >= 1
    got = db.con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert got.endswith(("GiB", "MiB")) and float(got.split()[0]) * (1024 if got.endswith("GiB") else 1) <= 4096


# ---- second wall: sandbox.lock_down on the raw connection -------------------------------------------------------
@pytest.fixture(scope="module")
def locked(world):
    """A Database as connect() returns it: the views exist, then the connection is locked down (Database.__init__)."""
    root, _, _ = world
    with lsql.connect(root, cache_dir=root.parent / "cache") as d:
        yield d


RAW_ATTACKS = {
    "read_csv": "SELECT * FROM read_csv('{S}')",
    "read_csv_subquery": "SELECT (SELECT a FROM read_csv('{S}')) AS x",
    "read_text": "SELECT * FROM read_text('{S}')",
    "string_path": "SELECT * FROM '{S}'",
    "glob_outside": "SELECT * FROM glob('{S}')",
    "view_over_file": "CREATE VIEW v AS SELECT * FROM read_csv('{S}'); SELECT * FROM v",
    "copy_outside": "COPY (SELECT 1) TO '{D}/out.csv'",
    "attach": "ATTACH '{D}/x.db' AS x",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "enable_external_access": "SET enable_external_access = true",
    "widen_allowed_directories": "SET allowed_directories = ['/']",
    "unlock": "SET lock_configuration = false",
    "reset_lock": "RESET lock_configuration",
    "pragma": "PRAGMA memory_limit='100GB'",
}


@pytest.mark.parametrize("name", list(RAW_ATTACKS))
def test_second_wall_refuses_raw_connection(locked, world, name):
    root, secret, drop = world
    sql = RAW_ATTACKS[name].format(S=secret, D=drop)
    with pytest.raises((duckdb.PermissionException, duckdb.InvalidInputException, duckdb.CatalogException)) as e:
        locked.con.sql(sql).fetchall()
    assert SECRET not in str(e.value)
    _intact(locked, world)
    assert locked.con.sql("SELECT current_setting('enable_external_access')").fetchall() == [(False,)]


def test_locked_connection_still_serves_everything(locked, world, datasets):
    root, _, _ = world
    assert locked.sql("SELECT count(*) FROM video_frames").fetchall()[0][0] > 0  # index built and read from cache
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 4"
    ds = locked.dataset(sql, delta_timestamps={"action": [-1 / 30, 0, 1 / 30]})
    ref = lsql.connect(datasets / "small20").dataset(sql, delta_timestamps={"action": [-1 / 30, 0, 1 / 30]})
    for i in (0, len(ds) - 1):
        a, b = ds[i], ref[i]
        assert set(a) == set(b)
        for k in a:
            assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k
    # spills go to the cache, which lock_down allows
    tmpdir = locked.con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0]
    assert Path(tmpdir).is_relative_to(locked.cache_dir)


@pytest.mark.timeout(90)
def test_lock_down_works_for_remote_sources(datasets, tmp_path, monkeypatch):
    from http_range_server import RangeServer

    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    secret = tmp_path / "secret.csv"
    secret.write_text(f"a\n{SECRET}\n")
    with RangeServer(datasets) as srv:
        with lsql.connect(f"{srv.url}/small20") as remote:  # locked down by connect() itself
            assert remote.con.sql("SELECT current_setting('lock_configuration')").fetchall() == [(True,)]
            got = remote.sql("SELECT episode_index, count(*) FROM frames WHERE episode_index IN (2, 7) "
                             "GROUP BY ALL ORDER BY 1").fetchall()
            ep = pq.read_table(datasets / "small20/data/chunk-000/file-000.parquet")["episode_index"].to_numpy()
            assert got == [(e, int((ep == e).sum())) for e in (2, 7)]
            item = remote.dataset("SELECT episode_index FROM episodes WHERE episode_index = 2")[5]
            assert item["frame_index"].item() == 5 and item["observation.images.front"].shape == (3, 96, 128)
            with pytest.raises(duckdb.PermissionException):
                remote.con.sql(f"SELECT * FROM read_csv('{secret}')").fetchall()


def test_lock_down_twice_is_a_typed_error(locked):
    with pytest.raises(lsql.LeRobotSQLError, match="lock down"):
        lock_down(locked.con, ["/"])
    assert np.isscalar(locked.sql("SELECT count(*) FROM frames").fetchall()[0][0])


# ---- writes anywhere in the tree, internal relations, every table-function position,
# parser depth and size, time and memory bounds, threads ---------------------------------------------------------
WRITING_CTES = {
    "delete_features": "WITH x AS (DELETE FROM features RETURNING *) SELECT count(*) FROM x",
    "update_tasks": "WITH x AS (UPDATE tasks SET task = 'pwned' RETURNING *) SELECT count(*) FROM x",
    "insert_info": "WITH x AS (INSERT INTO info SELECT * FROM info RETURNING *) SELECT count(*) FROM x",
    "delete_in_subquery": "SELECT * FROM (WITH x AS (DELETE FROM tasks RETURNING *) SELECT * FROM x) s",
    "delete_in_union": "SELECT 1 AS a UNION ALL (WITH x AS (DELETE FROM tasks RETURNING task_index) SELECT * FROM x)",
    "update_in_scalar": "SELECT (WITH x AS (UPDATE features SET dtype = 'x' RETURNING 1) SELECT count(*) FROM x) AS n",
    "delete_in_lateral": "SELECT * FROM (VALUES (1)) t(x), LATERAL (WITH y AS (DELETE FROM tasks RETURNING *) "
                         "SELECT * FROM y) z",
}


def _snapshot(db):
    return (db.con.sql("SELECT * FROM features ORDER BY name").fetchall(),
            db.con.sql("SELECT * FROM tasks ORDER BY task_index").fetchall(),
            db.con.sql("SELECT * FROM info").fetchall())


@pytest.mark.parametrize("name", list(WRITING_CTES))
def test_writing_statements_inside_a_query_are_refused(db, world, name):
    before = _snapshot(db)
    assert len(before[0]) > 0 and len(before[1]) == 7
    with pytest.raises(QueryError, match="(?i)read-only|only queries"):
        db.sql(WRITING_CTES[name]).fetchall()
    assert _snapshot(db) == before
    _intact(db, world)


def test_writing_cte_refused_by_duckdb_walk_too(db, monkeypatch):
    """With the sqlglot wall bypassed, DuckDB's own parse tree is still walked for writes."""
    from lerobot_sql._query import checks as query

    before = _snapshot(db)
    monkeypatch.setattr(query, "check_sql", lambda sql, ctx: query.CheckedQuery(sql, None, frozenset(), False))
    for sql in WRITING_CTES.values():
        with pytest.raises(QueryError, match="(?i)read-only"):
            db.sql(sql).fetchall()
    assert _snapshot(db) == before


RAW_WRITES = ["UPDATE tasks SET task = 'pwned'", "DELETE FROM features", "INSERT INTO info SELECT * FROM info",
              "UPDATE _data_files_listed SET path = 'x'", "DELETE FROM _episodes_raw"]


def test_internal_relations_are_read_only_even_through_db_con(locked):
    """No base table lerobot_sql reads later exists in the user's catalog: DML through the raw connection fails."""
    locked.sql("SELECT count(*) FROM video_frames").fetchall()
    locked.sql("SELECT count(*) FROM video_files").fetchall()
    before = _snapshot(locked)
    for sql in RAW_WRITES:
        with pytest.raises(duckdb.Error):
            locked.con.execute(sql)
    assert _snapshot(locked) == before
    assert locked.con.sql("SELECT database_name, table_name FROM duckdb_tables() WHERE NOT temporary").fetchall() == []


def test_v21_pointer_swap_attack_gives_correct_frames(datasets, tmp_path, framecode):
    """On a v2.1 source the episode metadata was a DuckDB table: an UPDATE swapped two episodes' video pointers and
    dataset() served episode 1's frames for episode 0."""
    db = lsql.connect(datasets / "v21_small20", cache_dir=tmp_path / "cache")
    key = "observation.images.front"
    col = f'"videos/{key}/file_index"'
    swap = f"UPDATE _episodes_raw SET {col} = CASE episode_index WHEN 0 THEN 1 WHEN 1 THEN 0 ELSE {col} END"
    with pytest.raises(QueryError):
        db.sql(f"WITH x AS ({swap} RETURNING 1) SELECT count(*) FROM x").fetchall()
    with pytest.raises(duckdb.Error):
        db.con.execute(swap)
    assert db.sql("SELECT path FROM videos WHERE episode_index = 0 AND video_key = 'observation.images.front'"
                  ).fetchall() == [("videos/chunk-000/observation.images.front/episode_000000.mp4",)]
    ds = db.dataset("SELECT episode_index FROM episodes WHERE episode_index = 0", return_uint8=True)
    for i in (0, 7, len(ds) - 1):
        item = ds[i]
        assert framecode.verify_frame(item[key].permute(1, 2, 0).numpy(), 0, int(item["frame_index"]), 1)["ok"]


def test_cli_export_with_a_writing_cte_does_not_land(world, tmp_path):
    import subprocess
    import sys

    root, _, _ = world
    dest = tmp_path / "out"
    sql = "WITH x AS (UPDATE tasks SET task = 'pwned' RETURNING task_index) SELECT episode_index FROM episodes"
    r = subprocess.run([sys.executable, "-m", "lerobot_sql.cli", "export", str(root), str(dest), "--sql", sql,
                        "--quiet"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "read-only" in r.stderr, r.stderr
    assert not dest.exists()


LATERAL_FUNCS = {
    "query": "query('SELECT 42 AS a')",
    "query_table": "query_table('episodes')",
    "glob": "glob('{R}/*')",
    "read_text": "read_text('{R}/meta/info.json')",
    "read_blob": "read_blob('{R}/meta/info.json')",
    "read_csv": "read_csv('{S}')",
    "duckdb_settings": "duckdb_settings()",
    "json_execute_serialized_sql": "json_execute_serialized_sql(json_serialize_sql('SELECT 42 AS a'))",
    "checkpoint": "checkpoint()",
    "range": "range(3)",
}
LATERAL_FORMS = {
    "values_lateral": "SELECT * FROM (VALUES (1)) t(x), LATERAL {F}",
    "join_lateral": "SELECT * FROM episodes e JOIN LATERAL {F} f ON true",
    "cross_join_lateral": "SELECT * FROM episodes e CROSS JOIN LATERAL {F}",
    "lateral_in_cte": "WITH c AS (SELECT * FROM (VALUES (1)) t(x), LATERAL {F}) SELECT * FROM c",
    "lateral_in_exists": "SELECT 1 AS y WHERE EXISTS (SELECT * FROM (VALUES (1)) t(x), LATERAL {F})",
}


@pytest.mark.parametrize("form", list(LATERAL_FORMS))
@pytest.mark.parametrize("func", list(LATERAL_FUNCS))
def test_table_functions_refused_in_every_position(db, world, form, func):
    root, secret, _ = world
    sql = LATERAL_FORMS[form].format(F=LATERAL_FUNCS[func].format(R=root, S=secret))
    with pytest.raises(QueryError, match="table functions"):
        db.sql(sql).fetchall()
    _intact(db, world)


def test_table_macros_and_unnest_still_work_in_lateral_positions(db):
    want = db.sql("SELECT count(*) FROM first_event(\"observation.state\"[1] > 0)").fetchall()[0][0]
    assert want > 0
    got = db.sql("SELECT count(*) FROM (VALUES (1)) t(x), LATERAL first_event(\"observation.state\"[1] > 0)"
                 ).fetchall()[0][0]
    assert got == want
    assert db.sql("SELECT sum(u) FROM episodes e, LATERAL unnest([e.length, 1]) t(u)").fetchall() == \
        [(4762 + 20,)]


def test_deep_queries_are_answered_or_refused_with_query_error(db):
    paren = "SELECT " + "(" * 50 + "length" + ")" * 50 + " AS x FROM episodes ORDER BY x DESC LIMIT 1"
    assert db.sql(paren).fetchall() == db.sql("SELECT max(length) FROM episodes").fetchall()
    sub = "SELECT count(*) FROM " + "(SELECT * FROM " * 200 + "episodes" + " t)" * 200
    assert db.sql(sub).fetchall() == [(20,)]
    too_deep = "SELECT " + "(" * 5000 + "1" + ")" * 5000 + " AS x"
    with pytest.raises(QueryError, match="(?i)depth"):
        db.sql(too_deep)


def test_query_text_is_bounded_and_big_in_lists_are_answered(db):
    from lerobot_sql._query import checks as query

    # No timing asserts (speed belongs in benchmarks/): the module's 60 s pytest-timeout catches checks that take
    # minutes, as the 1M-item list did before the bound.
    huge = "SELECT count(*) FROM episodes WHERE episode_index IN (" + ", ".join(map(str, range(1_000_000))) + ")"
    with pytest.raises(QueryError, match=f"{query.MAX_SQL_CHARS:,}"):
        db.sql(huge)
    big = "SELECT count(*) FROM episodes WHERE episode_index IN (" + ", ".join(map(str, range(20_000))) + ")"
    assert db.sql(big).fetchall() == [(20,)]


@pytest.mark.slow
@pytest.mark.timeout(240)  # a loaded 2-core box starts interpreters slowly
def test_timeout_interrupts_a_runaway_query_and_the_connection_survives(world, tmp_path):
    """In a child process, as a user's script runs it. Inside this pytest process, after the ~800 tests before it,
    the Timer thread's interrupt arrived 35-86 s late in three full-suite runs (never in isolation, cause not found:
    see docs/reliability.md, user SQL, not covered)."""
    import subprocess
    import sys

    root, _, _ = world
    script = ("import time, lerobot_sql as lsql\n"
              f"db = lsql.connect({str(root)!r}, cache_dir={str(root.parent / 'cache')!r})\n"
              "t0 = time.monotonic()\n"
              "try:\n"
              f"    db.sql({RUNAWAY!r}, timeout=0.5).fetchall()\n"
              "except lsql.QueryError as e:\n"
              "    print('QueryError:', e.interrupted, str(e)[:60], flush=True)\n"
              "print('secs', round(time.monotonic() - t0, 1), flush=True)\n"
              "print(db.sql('SELECT count(*) FROM episodes', timeout=30).fetchall(), flush=True)\n"
              "try:\n"
              "    db.sql('SELECT 1', timeout=-1)\n"
              "except ValueError as e:\n"
              "    print('ValueError:', e, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "QueryError: timeout" in r.stdout and "0.5 s" in r.stdout, r.stdout
    assert float(r.stdout.split("secs")[1].split()[0]) < 60, r.stdout
    assert "[(20,)]" in r.stdout and "ValueError:" in r.stdout and "timeout" in r.stdout.split("ValueError:")[1]


def _run_and_interrupt(args, ready: str, tmp_path):
    """Start ``args``, wait until stdout shows ``ready``, send SIGINT; (exit code, stdout, stderr, seconds to exit)."""
    import signal
    import subprocess
    import time

    from helpers import as_from_a_terminal

    # (SIGINT at its default action and unblocked in the child: in CI, with this worker's SIGINT state inherited, the
    # child once ignored the signal and both Ctrl-C tests ran their query for 90 s)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                         preexec_fn=as_from_a_terminal)
    try:
        line = p.stdout.readline()
        assert ready in line, (line, p.stderr.read() if p.poll() is not None else "")
        time.sleep(1.0)  # inside the query
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=90)
        return p.returncode, line + out, err, time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# 4762**3 rows, about a minute of work; each test asserts the interrupt's QueryError, which a query that ran to
# its end would not give. (A 4-way join was tried: its cross-product build phase does not check for interrupts, so
# Ctrl-C and the timeout wait for it, and a test that fails leaves the child running for days.)
RUNAWAY = "SELECT sum(a.index * b.index + c.index) FROM frames a, frames b, frames c"


@pytest.mark.slow
@pytest.mark.timeout(240)  # a loaded 2-core box starts interpreters slowly
def test_ctrl_c_interrupts_db_sql(world, tmp_path):
    import sys

    root, _, _ = world
    script = ("import lerobot_sql as lsql, sys\n"
              f"db = lsql.connect({str(root)!r}, cache_dir={str(root.parent / 'cache')!r})\n"
              "db.sql('SELECT 1').fetchall()\n"
              "print('ready', flush=True)\n"
              "try:\n"
              f"    db.sql({RUNAWAY!r}).fetchall()\n"
              "except lsql.QueryError as e:\n"
              "    print('QueryError:', e, flush=True)\n"
              "print(db.sql('SELECT count(*) FROM episodes').fetchall(), flush=True)\n")
    code, out, err, secs = _run_and_interrupt([sys.executable, "-c", script], "ready", tmp_path)
    assert code == 0 and "QueryError:" in out and "Ctrl-C" in out and "[(20,)]" in out, (out, err)
    assert secs < 60


@pytest.mark.slow
@pytest.mark.timeout(240)  # a loaded 2-core box starts interpreters slowly
def test_cli_query_ctrl_c_and_timeout(world, tmp_path):
    import os
    import resource
    import subprocess
    import sys
    import time

    root, _, _ = world
    cli = [sys.executable, "-m", "lerobot_sql.cli"]

    def children_cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    t0, c0 = time.monotonic(), children_cpu()
    r = subprocess.run([*cli, "query", str(root), RUNAWAY, "--timeout", "1"], capture_output=True, text=True,
                       timeout=150)
    startup_cpu = children_cpu() - c0  # interpreter start, imports, connect, and 1 s of the query
    assert r.returncode == 1 and "timeout" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert time.monotonic() - t0 < 90
    # Ctrl-C: a shell pipeline would print the result; here the query never ends, so wait for the process to settle
    from helpers import as_from_a_terminal

    p = subprocess.Popen([*cli, "query", str(root), RUNAWAY], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=as_from_a_terminal)
    try:
        # Wait until the query runs, by CPU time (a fixed sleep lost the race under load: the signal landed during
        # the imports, before the CLI's handler): once the process has used 1 s more CPU than the whole first run
        # up to its timeout, it is inside the query.
        tick = os.sysconf("SC_CLK_TCK")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            with open(f"/proc/{p.pid}/stat") as f:
                utime, stime = (int(v) for v in f.read().rsplit(")", 1)[1].split()[11:13])
            if (utime + stime) / tick > startup_cpu + 1:
                break
            time.sleep(0.2)
        import signal

        t1 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert time.monotonic() - t1 < 60


MEMORY_HOGS = {
    "range_list": "SELECT len(range(100000000)) AS n",
    "repeat": "SELECT length(repeat('x', 1000000000)) AS n",
    "list_repeat": "SELECT len(repeat([1], 100000000)) AS n",
    "generate_series": "SELECT len(generate_series(1, 100000000)) AS n",
    # sizes that multiply through nesting, widths inside format strings, computed literals
    "printf_width": "SELECT length(printf('%01000000000d', 1)) AS n",
    "printf_star_width": "SELECT length(printf('%*d', 1000000000, 1)) AS n",
    "format_width": "SELECT length(format('{:>1000000000}', 'x')) AS n",
    "format_dynamic_width": "SELECT length(format('{:>{}}', 'x', 1000000000)) AS n",
    "nested_repeat": "SELECT length(repeat(repeat('x', 1000000), 1000)) AS n",
    "nested_range": "SELECT len(flatten(list_transform(range(1000), lambda i: range(1000000)))) AS n",
    "folded_count": "SELECT length(repeat('x', 1000 * 1000000)) AS n",
    "string_count": "SELECT length(lpad('x', '1000000000')) AS n",
    # a count computed from constants (issue 36: 2.5 GB under memory_limit=256MB; 61 s past timeout=10)
    "function_count": "SELECT len(range(abs(100000000))) AS n",
    "function_repeat": "SELECT length(repeat('x', abs(1000000000))) AS n",
}


@pytest.fixture(scope="module")
def memory_hogs(world):
    """Every MEMORY_HOGS query run in ONE child process, in turn: {name: (what it printed, peak RSS in MB while it
    ran)}. The peak is /proc/self/status's VmHWM, reset before each query (``5`` into /proc/self/clear_refs; where
    that is refused the peak only grows, which is stricter). VmHWM, not getrusage's ru_maxrss: Linux keeps
    ru_maxrss across execve, so a child of a big pytest process would report its parent's peak."""
    import subprocess
    import sys

    root, _, _ = world
    # RLIMIT_AS: before the checks refused them, these would take 2-8 GB of a shared machine; capped, an
    # unrefused hog fails with an allocation error (no "allocate" QueryError) instead. timeout=20: an unrefused
    # printf ran for minutes, and DuckDB does not interrupt inside one value.
    script = ("import json, resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
              "import lerobot_sql as lsql\n"
              f"db = lsql.connect({str(root)!r}, cache_dir={str(root.parent / 'cache')!r})\n"
              "db.sql('SELECT 1').fetchall()\n"
              "def hwm():\n"
              "    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]) // 1024\n"
              "for name, sql in json.loads(sys.argv[1]).items():\n"
              "    try:\n"
              "        open('/proc/self/clear_refs', 'w').write('5')\n"
              "    except OSError:\n"
              "        pass\n"
              "    try:\n"
              "        out = 'result ' + repr(db.sql(sql, timeout=20).fetchall())\n"
              "    except lsql.QueryError as e:\n"
              "        out = f'QueryError: {e}'\n"
              "    except Exception as e:\n"
              "        out = f'{type(e).__name__}: {e}'\n"
              "    print(json.dumps([name, out, hwm()]), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", script, json.dumps(MEMORY_HOGS)], capture_output=True, text=True,
                       timeout=600, cwd=root.parent)
    found = {}
    for line in r.stdout.splitlines():
        name, out, rss = json.loads(line)
        found[name] = (out, rss)
    return found, r.stderr


@pytest.mark.parametrize("name", list(MEMORY_HOGS))
def test_memory_hogs_refused_before_they_allocate(memory_hogs, name):
    """Measured in a child process (one for all of them): the peak RSS stays near a connection's own (about 0.3 GB
    here), where these queries reached 2-5.5 GB before, since DuckDB's memory_limit does not bound these
    allocations."""
    found, stderr = memory_hogs
    assert name in found, f"the child did not get to {name}: {stderr[-2000:]}"
    out, rss = found[name]
    assert "QueryError:" in out and "allocate" in out, out
    assert rss < 1000, rss


def test_one_database_from_four_threads(datasets, tmp_path):
    """manifest() and sql() from 4 threads on one Database give the single-threaded answers (56/60 failed with
    'connection is busy' before)."""
    from concurrent.futures import ThreadPoolExecutor

    db = lsql.connect(datasets / "small20", cache_dir=tmp_path / "cache")
    sqls = [f"SELECT episode_index FROM episodes WHERE episode_index % 5 = {k}" for k in range(5)]
    counts = [f"SELECT episode_index, count(*) AS n FROM frames WHERE episode_index % 3 = {k} GROUP BY 1 ORDER BY 1"
              for k in range(3)]
    ref_db = lsql.connect(datasets / "small20", cache_dir=tmp_path / "cache_ref")
    want_m = {s: ref_db.manifest(s) for s in sqls}
    want_c = {s: ref_db.sql(s).fetchall() for s in counts}
    want_v = ref_db.sql("SELECT count(*) FROM video_frames").fetchall()

    def work(i):
        out = []
        for r in range(4):
            s = sqls[(i + r) % len(sqls)]
            out.append(("m", s, db.manifest(s)))
            c = counts[(i + r) % len(counts)]
            out.append(("c", c, db.sql(c).fetchall()))
        out.append(("v", None, db.sql("SELECT count(*) FROM video_frames").fetchall()))
        return out

    with ThreadPoolExecutor(4) as ex:
        results = [x for part in ex.map(work, range(4)) for x in part]
    assert len(results) == 4 * 9
    for kind, s, got in results:
        if kind == "m":
            assert got.equals(want_m[s]), s
        elif kind == "c":
            assert got == want_c[s], s
        else:
            assert got == want_v
    # the sandbox holds on every thread's cursor
    def attack(_):
        with pytest.raises(duckdb.Error):
            db.con.execute("SET enable_external_access = true")
        return db.con.sql("SELECT current_setting('enable_external_access')").fetchall()

    with ThreadPoolExecutor(2) as ex:
        assert list(ex.map(attack, range(2))) == [[(False,)]] * 2


# ---- deep SQL fails closed, CTE scope, the Result surface, settings, the timeout's second clock ----------
def test_sql_too_deep_for_the_checks_is_refused_not_passed_unchecked(db):
    """At ~950 nested parentheses sqlglot's walk hit RecursionError and check_sql returned the SQL unchecked."""
    deep = "(" * 950 + "1" + ")" * 950
    with pytest.raises(QueryError, match="nested too deeply for the query checks"):
        db.sql(f"SELECT {deep} AS d, count(*) AS n FROM episodes")
    ok = "(" * 100 + "1" + ")" * 100
    assert db.sql(f"SELECT {ok} AS d, count(*) AS n FROM episodes").fetchall() == [(1, 20)]


def _facts(db, sql):
    from lerobot_sql._query import tree_facts

    tree = db.con.sql("SELECT json_serialize_sql($1)", params=[sql]).fetchall()[0][0]
    return tree_facts.duckdb_facts(tree, db._context(), sql)


def test_cte_names_are_scoped_in_duckdbs_tree(db, world):
    """A CTE named like a file inside one subquery covered a bare reference to that file elsewhere, which DuckDB
    answers with a replacement scan (read_json_auto of the path). Judged on DuckDB's tree alone, as for SQL that
    sqlglot cannot walk."""
    root, _, _ = world
    target = str(root / "meta" / "info.json")
    sql = (f'SELECT * FROM (WITH "{target}" AS (SELECT 1 AS x) SELECT x FROM "{target}") a, "{target}" b')
    with pytest.raises(QueryError, match="file paths in FROM"):
        _facts(db, sql)
    # a CTE of a later WITH entry does not cover an earlier one's body
    with pytest.raises(QueryError, match="unknown view 'b'"):
        _facts(db, "WITH a AS (SELECT * FROM b), b AS (SELECT 1 AS x) SELECT * FROM a")
    # what scoping must keep: CTEs seen in their own query and subqueries, chains, recursion, set operations
    assert db.sql("SELECT * FROM (WITH t AS (SELECT count(*) AS n FROM episodes) SELECT n FROM t) s").fetchall() \
        == [(20,)]
    assert db.sql("WITH a AS (SELECT episode_index FROM episodes), b AS (SELECT count(*) AS n FROM a) "
                  "SELECT n, (SELECT max(episode_index) FROM a) FROM b").fetchall() == [(20, 19)]
    assert db.sql("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) "
                  "SELECT sum(n) FROM r").fetchall() == [(15,)]
    assert db.sql("WITH a AS (SELECT 1 AS x) SELECT x FROM a UNION ALL SELECT x + 1 FROM a ORDER BY 1").fetchall() \
        == [(1,), (2,)]


RESULT_ESCAPES = {
    "query_copy": lambda r, root: r.query("t", f"COPY (SELECT 'pwned' AS x) TO '{root}/meta/pwned.csv'"),
    "query_view": lambda r, root: r.query("t", "CREATE OR REPLACE VIEW tasks AS SELECT 0 AS task_index, 'EVIL' AS task"),
    "write_csv": lambda r, root: r.write_csv(f"{root}/data/pwned.csv"),
    "to_parquet": lambda r, root: r.to_parquet(f"{root}/data/pwned.parquet"),
    "to_csv": lambda r, root: r.to_csv(f"{root}/data/pwned.csv"),
    "create_view": lambda r, root: r.create_view("tasks"),
    "filter": lambda r, root: r.filter("x IN (SELECT 1)"),
    "project": lambda r, root: r.project("x, current_setting('temp_directory')"),
    "order": lambda r, root: r.order("x"),
    "aggregate": lambda r, root: r.aggregate("count(*)"),
    "execute": lambda r, root: r.execute(),
    "insert_into": lambda r, root: r.insert_into("tasks"),
}


@pytest.mark.parametrize("name", list(RESULT_ESCAPES))
def test_result_offers_only_reading_methods(db, world, name):
    """db.sql's Result forwarded every DuckDB relation method: .query() ran COPY and CREATE VIEW, write_csv wrote
    inside the root, filter/project/order/aggregate took SQL text the checks never saw."""
    root, _, _ = world
    before = {p for p in root.rglob("*")}
    tasks = db.sql("SELECT * FROM tasks ORDER BY task_index").fetchall()
    r = db.sql("SELECT 1 AS x")
    with pytest.raises(AttributeError, match="read-only.*db.sql"):
        RESULT_ESCAPES[name](r, root)
    assert {p for p in root.rglob("*")} == before
    assert db.sql("SELECT * FROM tasks ORDER BY task_index").fetchall() == tasks
    assert "EVIL" not in str(tasks)


def test_result_reading_methods_still_work(db):
    r = db.sql("SELECT episode_index, length FROM episodes ORDER BY episode_index")
    assert r.columns == ["episode_index", "length"] and len(r.types) == 2
    assert r.limit(2).fetchall() == db.sql("SELECT episode_index, length FROM episodes ORDER BY episode_index "
                                           "LIMIT 2").fetchall()
    assert r.limit(1, 19).fetchall()[0][0] == 19
    assert r.fetchnumpy()["length"].sum() == 4762
    assert r.df().shape == (20, 2) and r.arrow().num_rows == 20 and len(r) == 20
    assert r.to_arrow_table().column("length").to_pylist() == [row[1] for row in r.fetchall()]
    with pytest.raises(TypeError, match="integers"):
        r.limit("1 UNION SELECT 1")
    for bad in [(True,), (2, False), (np.int64(2), np.bool_(True))]:  # True was taken as 1 (operator.index)
        with pytest.raises(TypeError, match="integers"):
            r.limit(*bad)
    assert r.limit(np.int64(1), np.int32(19)).fetchall()[0][0] == 19


@pytest.mark.parametrize("setting", ["allowed_directories", "temp_directory", "secret_directory", "home_directory",
                                     "threads"])
def test_current_setting_is_refused(db, setting):
    """current_setting('allowed_directories' | 'temp_directory' | ...) answered, revealing cache and home paths."""
    with pytest.raises(QueryError, match="current_setting.*not allowed"):
        db.sql(f"SELECT current_setting('{setting}') AS s").fetchall()
    with pytest.raises(QueryError, match="current_setting.*not allowed"):
        db.sql(f"SELECT task FROM tasks WHERE task <> CURRENT_SETTING('{setting}')").fetchall()


@pytest.mark.parametrize("sql", [
    "SELECT x, pg_get_viewdef(x) AS d FROM (SELECT unnest(range(0, 100000)) AS x) WHERE d IS NOT NULL",
    "SELECT pg_get_constraintdef(1, 1)",
    "SELECT format_type(1, 1)",
    "SELECT get_block_size('memory')",
    # SQL text bound inside DuckDB, out of both looks' sight (hostile review 9, G3: the setting came back folded)
    "SELECT json_serialize_plan('SELECT current_setting(''temp_directory'')', optimize := true)",
    "SELECT json_serialize_sql('SELECT 1')",
])
def test_builtin_macros_that_read_the_catalog_are_refused(db, sql):
    """DuckDB's macro pg_get_viewdef(oid) selects from duckdb_views() inside: looped over oids it returned every
    view's SQL, with the cache folder and the dataset's absolute paths that current_setting is refused for (hostile
    review 7, F8). Such macros are refused as current_setting is."""
    db.sql("SELECT count(*) FROM frames").fetchall()  # the views exist
    with pytest.raises(QueryError, match="not allowed.*(catalog|SQL)"):
        db.sql(sql).fetchall()


@pytest.mark.timeout(240)
def test_timeout_fires_without_the_timer_thread(world, tmp_path):
    """The Timer thread of db.Result's timeout once never fired (a full-suite run, 60 s of a cross join). On the main
    thread a SIGALRM interval timer is the second clock: with threading.Timer disabled the timeout still stops the
    query. In a child process: pytest-timeout's signal method holds SIGALRM here, and then the fallback stays off."""
    import subprocess
    import sys

    root, _, _ = world
    script = ("import threading, lerobot_sql as lsql\n"
              "from lerobot_sql import _sql as dbmod\n"
              "class Dead:  # a Timer that never fires\n"
              "    daemon = True\n"
              "    def __init__(self, *a, **k): pass\n"
              "    def start(self): pass\n"
              "    def cancel(self): pass\n"
              "dbmod.threading.Timer = Dead\n"
              f"db = lsql.connect({str(root)!r}, cache_dir={str(root.parent / 'cache')!r})\n"
              "try:\n"
              f"    db.sql({RUNAWAY!r}, timeout=1).fetchall()\n"
              "except lsql.QueryError as e:\n"
              "    print('QueryError:', e.interrupted, flush=True)\n"
              "print(db.sql('SELECT count(*) FROM episodes', timeout=30).fetchall(), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert r.returncode == 0 and "QueryError: timeout" in r.stdout and "[(20,)]" in r.stdout, (r.stdout, r.stderr)


def test_an_interrupt_that_lands_before_the_query_executes_is_not_lost(world, monkeypatch):
    """DuckDB forgets ``con.interrupt()`` called before a query starts executing (while it is bound and planned):
    in CI a Ctrl-C landed there on a loaded machine and the query ran on past the test's 90 s. The guard repeats
    the interrupt until its block ends. Here the interrupt fires as the guard is entered, before DuckDB has the
    query; the query (minutes of work) must stop, not run to its end."""
    import threading

    from lerobot_sql import _sql

    root, _, _ = world
    db = lsql.connect(root, cache_dir=root.parent / "cache")
    enter = _sql._Interruptible.__enter__

    def enter_and_fire(self):
        got = enter(self)
        self._fire("sigint")
        return got

    monkeypatch.setattr(_sql._Interruptible, "__enter__", enter_and_fire)
    outcome: dict = {}

    def run():
        try:
            db.sql(RUNAWAY).fetchall()
            outcome["got"] = "ran to its end"
        except QueryError as e:
            outcome["got"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)  # stopped within a second; uninterrupted it runs for minutes
    if t.is_alive():  # not stopped: stop it here so that the suite goes on
        db.con.interrupt()
        t.join(30)
    monkeypatch.undo()
    assert isinstance(outcome.get("got"), QueryError) and outcome["got"].interrupted == "sigint", outcome
    assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]  # the connection is still usable



# ---- DuckDB's progress bar never reaches stdout ------------------------------------------------------------------
def _bar_on(con) -> None:
    """Turn ``con``'s progress bar on and draw it at once. DuckDB's Python client turns it on by itself in an
    interactive session (``python -c``, code piped to ``python -``, a REPL, a notebook: ``__main__`` without
    ``__file__``) and draws it for queries running over ``progress_bar_time`` (2 s); ``SET progress_bar_time = 0``
    turns it on too (DuckDB's ProgressBarTimeSetting), so a 1 ms query shows it."""
    con.execute("SET progress_bar_time = 0")


@pytest.fixture
def bar_on(monkeypatch):
    """Every locked connection made from here on gets its progress bar on (:func:`_bar_on`) just before
    ``lock_down``: connect's, connect_many's, the CLI's, the shell's. Returns the connections."""
    made = []
    real = connection.sandbox.lock_down

    def lock_down(con, *args, **kwargs):
        _bar_on(con)
        made.append(con)
        return real(con, *args, **kwargs)

    monkeypatch.setattr(connection.sandbox, "lock_down", lock_down)
    return made


def test_no_progress_bar_on_stdout(datasets, tmp_path, capfd, bar_on):
    """DuckDB drew its progress bar on fd 1 in interactive sessions, so a script printing JSON or ``query -f csv >
    out.csv`` run from one got an unparsable first line, and the locked connection refused to turn it off. Every
    connection we make turns it off before the lock (``sandbox.connect``)."""
    from helpers import run_cli

    small = datasets / "small20"
    with lsql.connect(small, cache_dir=tmp_path / "one") as db:
        assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]
        assert db.con.sql("SELECT count(*) FROM range(1000)").fetchall() == [(1000,)]  # the raw connection too
        assert db.con.sql("SELECT value FROM duckdb_settings() WHERE name = 'enable_progress_bar_print'"
                          ).fetchall() == [("false",)]
    with lsql.connect_many([small, datasets / "multifile60"], cache_dir=tmp_path / "many") as coll:
        got = coll.sql("SELECT dataset, count(*) FROM episodes GROUP BY ALL ORDER BY 1").fetchall()
        assert got == [("multifile60", 60), ("small20", 20)]
    r = run_cli("query", small, "SELECT count(*) AS n FROM episodes", "-f", "csv")
    assert (r.returncode, r.stdout) == (0, "n\n20\n"), r
    r = run_cli("shell", small, stdin="SELECT count(*) AS n FROM episodes;\n")
    assert r.returncode == 0 and "│ 20 │" in " ".join(r.stdout.split(" ")).replace("  ", " ").replace("  ", " "), r
    assert len(bar_on) == 4  # every connection above had the bar on
    out = capfd.readouterr().out  # fd 1 itself: DuckDB writes the bar there, past sys.stdout
    assert "▕" not in out and out == ""


def test_cli_result_writers_keep_the_progress_bar_off(tmp_path, capfd, monkeypatch):
    """The CLI's private connections (the box table and the CSV writer: DuckDB draws and writes those) come from
    sandbox.connect too: with the bar turned on after it, a CSV on stdout still starts with its header."""
    from helpers import SAMPLE, run_cli
    from lerobot_sql._catalog import sandbox

    made = []
    real = sandbox.connect

    def connect(*args, **kwargs):
        con = real(*args, **kwargs)
        _bar_on(con)
        made.append(con)
        return con

    monkeypatch.setattr(sandbox, "connect", connect)
    r = run_cli("query", SAMPLE, "SELECT episode_index FROM episodes ORDER BY 1 LIMIT 2", "-f", "csv")
    assert (r.returncode, r.stdout) == (0, "episode_index\n0\n1\n"), r
    r = run_cli("query", SAMPLE, "SELECT count(*) AS n FROM episodes")
    assert r.returncode == 0 and r.stdout.startswith("┌") and "20" in r.stdout, r
    assert len(made) == 4  # two locked connections, the CSV writer, the box table
    assert capfd.readouterr().out == ""


# DuckDB's errors advised SET statements (SET error_on_division_by_zero=false, SET memory_limit=...), which this
# locked connection refuses: each advice is now one that works here, or gone.
@pytest.mark.parametrize("sql, advice", [
    ("SELECT 1 // 0 AS x", "Use TRY(...)"),
    ("SELECT (SELECT episode_index FROM episodes) AS e", "LIMIT 1"),
    ("SELECT " + "+".join(["1"] * 1200) + " AS s", "Simplify the expression"),
    ("SELECT episode_index FROM episodes ORDER BY 'x'", "ORDER BY 1"),
])
def test_duckdb_errors_advise_no_set_statement(db, sql, advice):
    with pytest.raises(QueryError) as e:
        db.sql(sql).fetchall()
    said = str(e.value).partition("\nSQL:")[0]
    assert advice in said, said
    assert not re.search(r"\b(SET|PRAGMA) [a-z_]+", said), said
    with pytest.raises(duckdb.Error):  # what the advice used to say: refused here
        db.con.execute("SET error_on_division_by_zero = false")


@pytest.mark.parametrize("limit", ["8MB", "2MB"])
def test_out_of_memory_advises_connect_arguments_and_blames_no_file(world, tmp_path, limit):
    """DuckDB's "Possible solutions" named SET threads / preserve_insertion_order / memory_limit; out of memory
    while the views were made (memory_limit=2MB) was a DatasetFormatError "cannot be read as Parquet", blaming a
    healthy data file."""
    root, _, _ = world
    sql = ("SELECT count(*) AS n FROM (SELECT DISTINCT a.index * 10000 + b.index AS k, repeat('x', 50) AS pad "
           "FROM frames a, frames b WHERE b.index < 40)")
    db = lsql.connect(root, cache_dir=tmp_path / limit, memory_limit=limit, threads=1)
    with pytest.raises(QueryError, match="Out of Memory") as e:
        db.sql(sql).fetchall()
    said = str(e.value).partition("\nSQL:")[0]
    assert "lerobot_sql.connect(root, memory_limit='8GB')" in said and "threads=1" in said, said
    assert not re.search(r"\b(SET|PRAGMA) [a-z_]+", said), said
    db.close()
    # the advice works: a larger memory_limit answers
    with lsql.connect(root, cache_dir=tmp_path / "big", memory_limit="256MB", threads=1) as db:
        assert db.sql(sql).fetchall() == [(190480,)]
