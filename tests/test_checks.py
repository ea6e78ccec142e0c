"""Query checks (lerobot_sql._query.checks): what is rejected, with which message, and what still runs."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql._query.lambdas import rewrite_lambdas
from lerobot_sql.errors import QueryError


@pytest.fixture(scope="module")
def db(datasets):
    d = lsql.connect(datasets / "small20")
    yield d
    d.close()


@pytest.fixture(scope="module")
def episodes_meta(datasets):
    return pq.read_table(datasets / "small20" / "meta" / "episodes" / "chunk-000" / "file-000.parquet",
                         columns=["episode_index", "tasks", "length"]).to_pylist()


@pytest.mark.parametrize("sql, match", [
    ("DELETE FROM episodes", "only queries"),
    ("CREATE TABLE x AS SELECT 1", "only queries"),
    ("COPY (SELECT 1) TO '/tmp/x.csv'", "only queries"),
    ("ATTACH '/tmp/x.db'", "only queries|cannot parse"),
    ("SELECT 1; SELECT 2", "exactly one SQL statement"),
    ("SELECT * FROM read_parquet('/etc/passwd')", "table functions"),
    ("SELECT * FROM read_csv('x.csv')", "table functions"),
    ("SELECT * FROM glob('*')", "table functions"),
    ("SELECT * FROM 'data/chunk-000/file-000.parquet'", "file paths in FROM"),
    ("SELECT * FROM \"/tmp/x.parquet\"", "file paths in FROM"),
    ("SELECT * FROM episode", "unknown view 'episode'. Did you mean 'episodes'"),
    ("SELECT * FROM frame_ext", "Did you mean 'frames_ext'"),
    # named by their own keyword (sqlglot parses CHECKPOINT as a column and cannot parse EXPORT DATABASE)
    ("CHECKPOINT", "only queries .* not CHECKPOINT;"),
    ("EXPORT DATABASE '/tmp/lsql_x'", "only queries .* not EXPORT;"),
    ("/* c */ IMPORT DATABASE '/tmp/lsql_x'", "only queries .* not IMPORT;"),
    ("LOAD httpfs", "only queries .* not LOAD;"),
])
def test_rejected(db, sql, match):
    with pytest.raises(QueryError, match=match):
        db.sql(sql)


def test_unknown_column_suggests_and_lists(db):
    with pytest.raises(QueryError, match=r"unknown column 'lenght'\. Did you mean 'length'") as e:
        db.sql("SELECT episode_index, lenght FROM episodes")
    assert "duration_s" in str(e.value)  # the valid columns are listed
    with pytest.raises(QueryError, match=r"unknown column 'frame_idx' in 'frames'\. Did you mean 'frame_index'"):
        db.sql("SELECT f.frame_idx FROM frames f")


@pytest.mark.parametrize("sql, quoted", [
    ("SELECT observation.state FROM frames", '"observation.state"'),
    ("SELECT observation.images.front FROM frames", '"observation.images.front"'),
    ("SELECT observation.state.gripper.pos FROM frames_ext", '"observation.state.gripper.pos"'),
    ("SELECT f.observation.state FROM frames f", '"observation.state"'),
])
def test_unquoted_dotted_feature(db, sql, quoted):
    with pytest.raises(QueryError, match="quote them") as e:
        db.sql(sql)
    assert quoted in str(e.value)


@pytest.mark.parametrize("sql", [
    "SELECT length AS n FROM episodes ORDER BY n",
    "WITH e AS (SELECT episode_index AS ep, length FROM episodes) SELECT ep, length FROM e",
    "SELECT sum(length) OVER w AS s FROM episodes WINDOW w AS (ORDER BY episode_index)",
    "SELECT * FROM frames QUALIFY row_number() OVER (PARTITION BY episode_index ORDER BY frame_index) = 1",
    "SELECT x.a FROM (SELECT {'a': 1} AS x)",
    "SELECT list_transform(tasks, lambda t: upper(t)) FROM episodes",
    "SELECT f.\"observation.state\"[1] FROM frames f JOIN episodes e USING (episode_index) WHERE e.length > 300",
    "SELECT episode_index FROM episodes WHERE episode_index IN (SELECT episode_index FROM frames WHERE index < 5)",
    "SELECT * FROM first_event(\"observation.state.gripper.pos\" < 20)",
    "FROM tasks",
])
def test_valid_queries_run(db, sql):
    db.sql(sql).fetchall()


def test_lambda_1x_syntax_is_rewritten_and_runs(db, episodes_meta):
    got = db.sql("SELECT episode_index FROM episodes WHERE len(list_filter(tasks, t -> t ILIKE '%cube%')) > 0 "
                 "ORDER BY 1").fetchall()
    want = [r["episode_index"] for r in episodes_meta if any("cube" in t.lower() for t in r["tasks"])]
    assert want and [g[0] for g in got] == want
    two = db.sql("SELECT list_transform([10, 20], (x, i) -> x + i)").fetchall()
    assert two == [([11, 22],)]


def test_lambda_rewrite_leaves_strings_and_json_alone(db):
    lambdas = db._context().lambda_args  # DuckDB's own list of the functions taking a lambda
    assert rewrite_lambdas("SELECT 'a, b -> c' AS s", lambdas) == "SELECT 'a, b -> c' AS s"
    assert rewrite_lambdas("SELECT j -> '$.a' FROM t", lambdas) == "SELECT j -> '$.a' FROM t"
    assert rewrite_lambdas("SELECT list_filter(x, t -> t > 1)", lambdas) == "SELECT list_filter(x, lambda t: t > 1)"
    assert rewrite_lambdas("SELECT list_reduce(x, (a, b) -> a + b)", lambdas) == \
        "SELECT list_reduce(x, lambda a, b: a + b)"
    # JSON extraction after a comma, or as an argument of a function that takes no lambda: kept
    for sql in ("SELECT name, names -> '$[0]' FROM t", "SELECT a, names -> 0 FROM t", "SELECT upper(j -> 'a')",
                "SELECT list_transform(j -> '$.l', lambda x: x)", "SELECT [1, j -> 0]", "SELECT {'a': 1, 'b': j -> 0}"):
        assert rewrite_lambdas(sql, lambdas) == sql
    assert rewrite_lambdas("SELECT invoke(x -> x + 1, 2), list_transform([[1]], l -> list_filter(l, y -> y > 0))",
                           lambdas) == \
        "SELECT invoke(lambda x: x + 1, 2), list_transform([[1]], lambda l: list_filter(l, lambda y: y > 0))"


def test_json_arrow_on_features_names_is_json_extraction(db, datasets):
    # features.names is JSON: `->` extracts, also after a comma in the SELECT list (it was rewritten to a lambda)
    info = json.loads((datasets / "small20" / "meta" / "info.json").read_text())
    names = {k: f.get("names") for k, f in info["features"].items()}
    got = db.sql("SELECT name, names -> '$[0]' AS j, names -> 0 AS k, names ->> 0 AS s FROM features").fetchall()
    assert {r[0] for r in got} == set(names)
    for name, j, k, s in got:
        first = names[name][0] if isinstance(names[name], list) and names[name] else None
        want = None if first is None or isinstance(first, list) else first
        assert (json.loads(j) if j is not None else None) == want, name
        assert k == j and s == want, name
    assert any(j is not None for _, j, _, _ in got)


def test_lambda_and_json_arrow_in_one_query(db, episodes_meta):
    got = db.sql("SELECT e.episode_index, list_transform(e.tasks, t -> upper(t)) AS up, f.names ->> 0 AS first "
                 "FROM episodes e, features f WHERE f.name = 'action' ORDER BY 1").fetchall()
    want_first = db.sql("SELECT json_extract_string(names, '$[0]') FROM features WHERE name = 'action'").fetchall()[0][0]
    assert want_first and [(g[0], g[1], g[2]) for g in got] == \
        [(r["episode_index"], [t.upper() for t in r["tasks"]], want_first) for r in episodes_meta]
    two = db.sql("SELECT list_transform([10, 20], (x, i) -> x + i), names -> '$[0]' FROM features "
                 "WHERE name = 'action'").fetchall()
    assert two == [([11, 22], json.dumps(want_first))]


def test_query_entry_points_check(db):
    # dataset() and manifest() take user SQL too: the same checks apply.
    with pytest.raises(QueryError, match="table functions"):
        db.manifest("SELECT * FROM read_parquet('x')")
    with pytest.raises(QueryError, match="Did you mean 'episodes'"):
        db.dataset("SELECT episode_index FROM episode")


def test_cte_named_like_an_inner_alias_is_not_judged_as_that_table(sample):
    """An inner `episodes e` and an outer CTE `e` share a name: columns of the CTE must not be checked against
    episodes (regression: doctor/data_file_pointers failed standalone)."""
    import lerobot_sql as lsql

    db = lsql.connect(sample)
    rows = db.sql("WITH e AS (SELECT episode_index, length AS n FROM episodes e WHERE e.length > 0) "
                  "SELECT e.n FROM e ORDER BY e.episode_index LIMIT 2").fetchall()
    first = db.sql("SELECT length FROM episodes ORDER BY episode_index LIMIT 2").fetchall()
    assert rows == first


@pytest.mark.parametrize("sql", ["DESCRIBE frames", "DESCRIBE SELECT * FROM episodes", "SUMMARIZE episodes",
                                 "SUMMARIZE SELECT * FROM read_csv('/etc/passwd')", "SHOW TABLES", "SHOW frames"])
def test_describe_summarize_show_point_to_a_select(db, datasets, sql):
    # Refused (they wrap any query, and tests/test_security.py holds them as attacks) with the SELECT that answers.
    with pytest.raises(QueryError, match=r"is not run here, only SELECT queries are.*LIMIT 0'\)\.columns"):
        db.sql(sql)
    data = datasets / "small20" / "data" / "chunk-000" / "file-000.parquet"
    assert db.sql("SELECT * FROM frames LIMIT 0").columns == pq.read_schema(data).names  # the advice works


@pytest.mark.parametrize("sql, clause", [("SELECT * FROM episodes LIMIT 99999999999999999999999", "LIMIT"),
                                         ("SELECT * FROM episodes LIMIT 5 OFFSET 9223372036854775808", "OFFSET"),
                                         ("SELECT * FROM (SELECT * FROM frames LIMIT 99999999999999999999) t", "LIMIT")])
def test_row_counts_beyond_bigint_are_a_readable_error(db, sql, clause):
    with pytest.raises(QueryError, match=rf"^{clause} \d+ is out of range: row counts are 64-bit integers \(at most "
                                         rf"9223372036854775807\)"):
        db.sql(sql)
    assert len(db.sql("SELECT * FROM episodes LIMIT 9223372036854775807").fetchall()) == 20  # the bound itself runs


@pytest.mark.parametrize("sql, where", [("SELEC 1", "line 1, column 7: Invalid expression / Unexpected token: SELEC >>>1<<<"),
                                        ("SELECT *\nFROM frames WHERE", "line 2, column 17: WHERE is incomplete: "
                                                                        "SELECT * FROM frames >>>WHERE<<<")])
def test_parse_errors_show_where(db, sql, where):
    with pytest.raises(QueryError, match=re.escape(f"cannot parse the SQL at {where}")):
        db.sql(sql)


@pytest.mark.parametrize("sql, says", [
    ("SELEC", "'SELEC' is not a SQL statement; a query starts with SELECT or WITH"),  # was "... not COLUMN"
    ("episodes", "'episodes' is not a SQL statement"),
    ("SELEC * FROM episodes", "(the SQL starts with 'SELEC': a query starts with SELECT or WITH. Did you mean 'SELECT'?)"),
    ("WTH a AS (SELECT 1) SELECT * FROM a", "Did you mean 'WITH'?"),
])
def test_a_misspelt_first_keyword_is_named(db, sql, says):
    """sqlglot reads a misspelt SELECT as a column ("not COLUMN") or a product ("MUL is incomplete"): the error
    names the first word instead."""
    with pytest.raises(QueryError, match=re.escape(says)):
        db.sql(sql)
    assert db.sql("SELECT count(*) FROM episodes").fetchall()[0][0] == 20  # a real query still runs


def test_unknown_column_that_another_view_has_names_that_view(db):
    """frames_ext's per-element and derived columns queried FROM frames: the error says where they live."""
    elem = db.sql('SELECT * FROM frames_ext LIMIT 0').columns
    derived = next(c for c in elem if c not in db.sql("SELECT * FROM frames LIMIT 0").columns)
    with pytest.raises(QueryError, match=rf"unknown column '{re.escape(derived)}'\. It is a column of frames_ext: "
                                         r"query FROM frames_ext\."):
        db.sql(f'SELECT "{derived}" FROM frames')
    with pytest.raises(QueryError, match=r"unknown column 'frame_idx'\. Did you mean 'frame_index'") as e:
        db.sql("SELECT frame_idx FROM frames")  # no view has it: the did-you-mean hint as before
    assert "It is a column of" not in str(e.value)
    # a column only a private view has: never offered (FROM _episodes_raw is refused)
    with pytest.raises(QueryError, match=r"unknown column 'stats/action/min'") as e:
        db.sql('SELECT "stats/action/min" FROM episodes')
    assert "It is a column of" not in str(e.value) and "_episodes_raw" not in str(e.value)


def test_sqlglot_does_not_print_to_stderr(db, capfd):
    """sqlglot's "contains unsupported syntax. Falling back to parsing as a 'Command'" reached the user's stderr
    beside the refusal."""
    with pytest.raises(QueryError, match="not LOAD"):
        db.sql("LOAD httpfs")
    assert capfd.readouterr().err == ""


def test_element_zero_is_refused_with_the_1_based_rule(db):
    """DuckDB lists are 1-based: "action"[0] was NULL on every row, in silence."""
    with pytest.raises(QueryError, match=r'"action"\[0\]: DuckDB lists and arrays are 1-based.*"action"\[1\]'):
        db.sql('SELECT "action"[0] FROM frames')
    with pytest.raises(QueryError, match="1-based"):
        db.sql('SELECT index FROM frames WHERE "observation.state"[ 0 ] > 0')
    first = db.sql('SELECT "action"[1], "action"[-1], "action"[1:2] FROM frames ORDER BY index LIMIT 1').fetchall()[0]
    row = db.sql('SELECT "action" FROM frames ORDER BY index LIMIT 1').fetchall()[0][0]
    assert first[0] == pytest.approx(row[0]) and first[1] == pytest.approx(row[-1]) and len(first[2]) == 2


def test_the_documented_sql_length_limit_is_the_enforced_one():
    """help(db.sql) gives the limit as a number (it named the private constant before): the two must not drift."""
    from lerobot_sql._query.checks import MAX_SQL_CHARS
    from lerobot_sql.db import Database
    assert f"{MAX_SQL_CHARS:,} characters" in Database.sql.__doc__


# Sizes computed from constants: before, _value_size sized only literals and literal arithmetic, so a function
# call around the count passed (len(range(abs(100000000))) held 2.5 GB under memory_limit=256MB; repeat('x',
# abs(1000000000)) ran past timeout=10). Judged by db.check alone: nothing here runs.
@pytest.mark.parametrize("sql", [
    "SELECT len(range(abs(100000000))) AS n",
    "SELECT length(repeat('x', abs(1000000000))) AS n",
    "SELECT len(generate_series(1, abs(100000000))) AS n",
    "SELECT length(repeat('x', (SELECT 1000000000))) AS n",
    "SELECT length(repeat('x', (SELECT 1000000000 FROM episodes LIMIT 1))) AS n",  # a constant, whatever it reads
    "SELECT length(lpad('x', greatest(1, 1000000000))) AS n",
    "SELECT length(printf('%*d', abs(1000000000), 1)) AS n",
    "SELECT len(range(TIMESTAMP '2000-01-01', TIMESTAMP '2100-01-01', INTERVAL 1 SECOND)) AS n",
])
def test_a_size_computed_from_constants_is_refused(db, sql):
    with pytest.raises(QueryError, match=r"computed from constants.*Write the number itself"):
        db.check(sql)


@pytest.mark.parametrize("sql, elements", [
    # replace: every 'x' of 1,000 becomes 1,000 characters, twice over: 1e9 characters from 3,000 written (the inner
    # replace, 1e6 characters, is sized 1,000 x 1,000 plus its arguments and refused)
    ("SELECT length(replace(replace(repeat('x', 1000), 'x', repeat('y', 1000)), 'y', repeat('z', 1000))) AS n",
     "1,002,001"),
    # encoders multiply: bin is 8 characters per character; the second bin of 100,000 is 6.4M (three: 51.2M)
    ("SELECT length(bin(bin(bin(repeat('x', 100000))))) AS n", "6,400,000"),
    # a separator of 100 between 1M numbers: 1e8 characters
    ("SELECT length(array_to_string(range(1000000), repeat(' ', 100))) AS n", "101,000,100"),
])
def test_functions_that_multiply_their_input_are_sized(db, sql, elements):
    with pytest.raises(QueryError, match=rf"would allocate about {elements}"):
        db.check(sql)


@pytest.mark.parametrize("sql, want", [
    ("SELECT len(range(5)) AS a, length(repeat('ab', 3)) AS b, len(range(0, 10, 2)) AS c", [(5, 6, 5)]),
    ("SELECT length(repeat('x', 1000 * 1000)) AS n", [(1_000_000,)]),
    ("SELECT length(replace(repeat('x', 100), 'x', 'yy')) AS n, length(bin('ab')) AS b", [(200, 16)]),
    ("SELECT max(len(range(frame_index % 3))) AS n FROM frames", [(2,)]),  # a size from the data: not judged
    ("SELECT len(range(length)) AS n FROM episodes ORDER BY episode_index LIMIT 1", None),
])
def test_sizes_from_literals_and_data_still_run(db, sql, want):
    got = db.sql(sql).fetchall()
    if want is not None:
        assert got == want
    else:
        assert got == db.sql("SELECT length FROM episodes ORDER BY episode_index LIMIT 1").fetchall()


# A recursive CTE whose step doubles a value: 2^40 characters after 40 steps. memory_limit holds back the working
# table but not the value being built (with memory_limit=1GB the string reached 1.2 GB peak RSS before DuckDB's
# allocation failed; the issue saw it take the machine's memory). Refused before it runs: db.check only.
RECURSIVE_DOUBLING = {
    "s || s": "SELECT s || s, n + 1 FROM t WHERE n < 40",
    "concat": "SELECT concat(t.s, t.s), n + 1 FROM t WHERE n < 40",
    "repeat 2": "SELECT repeat(s, 2), n + 1 FROM t WHERE n < 40",
    "through a derived table": "SELECT q.y || q.y, q.m + 1 FROM (SELECT s AS y, n AS m FROM t) q WHERE m < 40",
    "inside a derived table": "SELECT y, m + 1 FROM (SELECT s || s AS y, n AS m FROM t) q WHERE m < 40",
    "count from the row": "SELECT lpad(s, length(s) * 2), n + 1 FROM t WHERE n < 40",
}


@pytest.mark.parametrize("name", list(RECURSIVE_DOUBLING))
def test_a_recursive_cte_doubling_a_value_is_refused(db, name):
    sql = f"WITH RECURSIVE t(s, n) AS (SELECT 'x', 0 UNION ALL {RECURSIVE_DOUBLING[name]}) SELECT max(length(s)) FROM t"
    with pytest.raises(QueryError, match=r"WITH RECURSIVE t: .*doubles with each step"):
        db.check(sql)


@pytest.mark.parametrize("sql, match", [
    ("WITH RECURSIVE t(l, n) AS (SELECT [1], 0 UNION ALL SELECT list_concat(l, l), n + 1 FROM t WHERE n < 40) "
     "SELECT max(len(l)) FROM t", "two or more copies"),
    ("WITH RECURSIVE t(l, n) AS (SELECT ['x'], 0 UNION ALL SELECT list_transform(l, lambda x: x || x), n + 1 "
     "FROM t WHERE n < 40) SELECT max(len(l)) FROM t", "two or more copies"),
    ("WITH RECURSIVE t(a, b, n) AS (SELECT 'x', 'y', 0 UNION ALL SELECT b, a || b, n + 1 FROM t WHERE n < 60) "
     "SELECT max(length(b)) FROM t", "two or more copies"),
    ("WITH RECURSIVE t(n, l) AS (SELECT 1, [0] UNION ALL SELECT n * 2, range(n * 2) FROM t WHERE n < 1e12) "
     "SELECT max(len(l)) FROM t", r"range\(\.\.\.\) takes its size from the previous step"),
])
def test_recursive_growth_through_lists_lambdas_and_sizes_is_refused(db, sql, match):
    with pytest.raises(QueryError, match=match):
        db.check(sql)


@pytest.mark.parametrize("sql, want", [
    ("WITH RECURSIVE t(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM t WHERE n < 10) SELECT count(*) FROM t", 11),
    ("WITH RECURSIVE t(s, n) AS (SELECT 'x', 0 UNION ALL SELECT s || 'ab', n + 1 FROM t WHERE n < 40) "
     "SELECT max(length(s)) FROM t", 81),  # grows by a fixed amount per step
    ("WITH RECURSIVE t(a, b, n) AS (SELECT 0::BIGINT, 1::BIGINT, 0 UNION ALL SELECT b, a + b, n + 1 FROM t "
     "WHERE n < 50) SELECT max(b) FROM t", 20365011074),  # numbers double freely: fixed size
    ("WITH RECURSIVE t(e, path) AS (SELECT 0, '0' UNION ALL SELECT episodes.episode_index, t.path || '/' || "
     "episodes.episode_index FROM t JOIN episodes ON episodes.episode_index = t.e + 1) SELECT max(length(path)) "
     "FROM t", 49),  # a path over the episodes: grows by a fixed amount per step
])
def test_recursive_ctes_that_grow_by_a_fixed_amount_still_run(db, sql, want):
    assert db.sql(sql).fetchall() == [(want,)]
