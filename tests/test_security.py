"""Hostile SQL: one test per attack, against both walls.

First wall: ``Database.sql`` (and so ``dataset``/``manifest``/``query``/the CLI) accepts one read-only query over our
views (``lerobot_sql.query`` checks with sqlglot, then DuckDB's own parser must agree). Second wall:
``sandbox.lock_down`` (DuckDB's external access off outside the dataset root and our cache, configuration locked)
holds even for SQL sent straight to ``db.con``.

Every attack targets a copy of small20 and a secret file *outside* it; a test passes only if the attack is refused
with a typed error, the secret's content never comes back, no file appears and the views are intact.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import lerobot_sql as lsql
from lerobot_sql import db as dbmod
from lerobot_sql.errors import QueryError, ResultContractError
from lerobot_sql.sandbox import default_config, lock_down

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
    from lerobot_sql import query

    monkeypatch.setattr(query, "check_sql", lambda sql, ctx: sql)  # simulate a first-wall gap
    with pytest.raises(QueryError, match=r"2 statement\(s\).*DROP"):
        db.sql("SELECT 1; DROP VIEW episodes")
    assert db.con.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]


# ---- huge results and resource bounds ----------------------------------------------------------------------------
def test_runaway_result_fails_fast(db, monkeypatch):
    monkeypatch.setattr(dbmod, "MAX_RESULT_ROWS", 100_000)
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
