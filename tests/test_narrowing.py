"""lerobot_sql._query.narrowing: the bounds a query's WHERE puts on frames, read from DuckDB's own parse tree, and
where narrowing must not happen (it would change the answer, or the reading is not certain)."""

from __future__ import annotations

import math

import duckdb
import pytest

from lerobot_sql._query.narrowing import narrow_frames

INF = math.inf


def _narrow(sql: str):
    """The one narrowing of ``sql`` (None: none)."""
    got = _all(sql)
    assert len(got) <= 1, got
    return got[0] if got else None


def _all(sql: str):
    tree = duckdb.connect().sql("SELECT json_serialize_sql($1)", params=[sql]).fetchall()[0][0]
    return narrow_frames(tree, sql)


@pytest.mark.parametrize("sql, bounds", [
    ("SELECT * FROM frames WHERE episode_index = 7", {"episode_index": ((7, 7),)}),
    ("SELECT * FROM frames WHERE 7 = episode_index", {"episode_index": ((7, 7),)}),
    ("SELECT * FROM frames WHERE episode_index IN (9, 3, 4, 3)", {"episode_index": ((3, 4), (9, 9))}),
    ("SELECT * FROM frames WHERE episode_index BETWEEN 2 AND 5", {"episode_index": ((2, 5),)}),
    ("SELECT * FROM frames WHERE episode_index BETWEEN 5 AND 2", {"episode_index": ()}),
    ("SELECT * FROM frames WHERE index < 10", {"index": ((-INF, 9),)}),
    ("SELECT * FROM frames WHERE 10 < index", {"index": ((11, INF),)}),
    ("SELECT * FROM frames WHERE index >= -3 AND index <= 4", {"index": ((-3, 4),)}),
    ("SELECT * FROM frames WHERE episode_index = 1 AND episode_index = 2", {"episode_index": ()}),
    ("SELECT * FROM frames WHERE episode_index IN (1, 2, 3) AND episode_index > 1 AND index < 100 AND true",
     {"episode_index": ((2, 3),), "index": ((-INF, 99),)}),
    ("SELECT * FROM frames AS f WHERE f.episode_index = 3", {"episode_index": ((3, 3),)}),
    ('SELECT * FROM "FRAMES" WHERE "Episode_Index" = 3', {"episode_index": ((3, 3),)}),
    ("SELECT * FROM frames WHERE frames.episode_index = 3", {"episode_index": ((3, 3),)}),
    ("FROM frames f SELECT f.action WHERE episode_index = 3 ORDER BY index LIMIT 5", {"episode_index": ((3, 3),)}),
    # the bounded SELECT may sit anywhere: in a subquery, under an aggregate, a window, a join of its result
    ("SELECT count(*) FROM episodes e WHERE e.episode_index IN (SELECT episode_index FROM frames WHERE index < 5)",
     {"index": ((-INF, 4),)}),
    ("SELECT e.length, x.n FROM episodes e JOIN (SELECT episode_index, count(*) n FROM frames WHERE "
     "episode_index = 2 GROUP BY 1) x USING (episode_index)", {"episode_index": ((2, 2),)}),
    ("SELECT avg(timestamp) OVER (), * FROM frames WHERE episode_index = 2", {"episode_index": ((2, 2),)}),
])
def test_bounds_are_read_from_the_where(sql, bounds):
    got = _narrow(sql)
    assert got is not None and got.bounds == bounds
    raw = sql.encode()
    assert raw[got.start:got.end].decode().lower().lstrip('"').startswith("frames")


@pytest.mark.parametrize("sql", [
    "SELECT * FROM frames",  # nothing bounded
    "SELECT * FROM frames WHERE episode_index = 3 OR index = 4",  # not a conjunct
    "SELECT * FROM frames WHERE NOT episode_index = 3",
    "SELECT * FROM frames WHERE episode_index <> 3",
    "SELECT * FROM frames WHERE episode_index NOT IN (3)",
    "SELECT * FROM frames WHERE episode_index = 3.0",  # not an integer literal
    "SELECT * FROM frames WHERE episode_index = '3'",
    "SELECT * FROM frames WHERE episode_index = 1 + 2",
    "SELECT * FROM frames WHERE episode_index IN (1, frame_index)",
    "SELECT * FROM frames WHERE frame_index = 3",  # not a narrowing column
    "SELECT * FROM frames f, episodes e WHERE f.episode_index = 3",  # joined: the WHERE may bound the join
    "SELECT * FROM frames f JOIN episodes e USING (episode_index) WHERE episode_index = 3",
    "SELECT * FROM episodes e LEFT JOIN frames f ON f.episode_index = e.episode_index WHERE e.episode_index = 3",
    "WITH frames AS (SELECT * FROM episodes) SELECT * FROM frames WHERE episode_index = 3",  # a CTE named frames
    "WITH x AS (SELECT 1) SELECT * FROM frames WHERE episode_index IN (SELECT episode_index FROM frames)",
    "SELECT * FROM frames USING SAMPLE 10 ROWS WHERE episode_index = 3",  # sampled before the WHERE
    "SELECT * FROM frames TABLESAMPLE 50% WHERE episode_index = 3",
    "SELECT * FROM frames AS f(a, b) WHERE episode_index = 3",  # column aliases
    "SELECT * FROM main.frames WHERE episode_index = 3",  # another name than the view's own
    "SELECT * FROM frames f WHERE g.episode_index = 3",  # another relation's column
    "SELECT * FROM episodes WHERE episode_index = 3",
    "SELECT * FROM frames_ext WHERE episode_index = 3",
])
def test_no_bounds_where_narrowing_could_change_the_answer(sql):
    assert _narrow(sql) is None


def test_the_span_is_bytes_and_covers_the_alias():
    """DuckDB gives byte offsets: text before the reference that is not ASCII shifts it; a comment inside the span
    and a quoted alias are covered."""
    sql = "SELECT 'é→ü' AS x, f.* FROM frames /* c */ AS \"my f\" WHERE \"my f\".episode_index = 2"
    got = _narrow(sql)
    assert got is not None and got.alias == "my f" and got.bounds == {"episode_index": ((2, 2),)}
    assert sql.encode()[got.start:got.end] == 'frames /* c */ AS "my f"'.encode()


def test_a_tree_it_cannot_read_gives_no_bounds():
    assert narrow_frames('{"error": true}', "SELECT 1") == ()
    assert narrow_frames('{"statements": []}', "SELECT 1") == ()
    sql = "SELECT * FROM frames WHERE episode_index = 1"
    tree = duckdb.connect().sql("SELECT json_serialize_sql($1)", params=[sql]).fetchall()[0][0]
    # a span DuckDB gives that does not begin with the name frames is not trusted
    assert narrow_frames(tree.replace('"query_location":14', '"query_location":13'), sql) == ()
    assert narrow_frames(tree, "SELECT * FROM framez WHERE episode_index = 1") == ()


@pytest.mark.parametrize("sql", [
    # an unaliased select-list expression is named by its text: splicing the view's SELECT into it renames the column
    "SELECT (SELECT count(*) FROM frames WHERE episode_index = 3) FROM episodes",
    "SELECT EXISTS (FROM frames WHERE episode_index = 3)",
    "SELECT e.episode_index IN (SELECT episode_index FROM frames WHERE index < 5) FROM episodes e",
    "SELECT * FROM (SELECT 1 + (SELECT max(index) FROM frames WHERE episode_index = 2))",
])
def test_no_bounds_where_the_reference_names_a_column(sql):
    assert _narrow(sql) is None


def test_a_named_select_expression_is_narrowed():
    got = _narrow("SELECT (SELECT count(*) FROM frames WHERE episode_index = 3) AS n FROM episodes")
    assert got is not None and got.bounds == {"episode_index": ((3, 3),)}


def test_the_query_s_cte_names_are_given():
    """(frames_part refuses a narrowing where one of them would shadow a relation the view's SELECT reads)"""
    got = _narrow("WITH Tasks AS (SELECT 1), x AS (WITH _episodes_raw AS (SELECT 2) SELECT 3) "
                  "SELECT * FROM frames WHERE episode_index = 3")
    assert got is not None and got.ctes == frozenset({"tasks", "x", "_episodes_raw"})
    assert _narrow("SELECT * FROM frames WHERE episode_index = 3").ctes == frozenset()


def test_a_qualifier_is_the_alias_as_duckdb_compares_names():
    """DuckDB compares names ignoring ASCII case only: "é" is not the alias "É" but the outer query's relation (its
    column is one value per outer row: the frames it bounds are not the ones the WHERE keeps)."""
    assert _narrow('SELECT (SELECT count(*) FROM frames "É" WHERE "é".episode_index = 3) AS n FROM episodes "é"') \
        is None
    for q in ('SELECT * FROM frames "É" WHERE "É".episode_index = 3', 'SELECT * FROM frames "E" WHERE e.episode_index = 3'):
        assert _narrow(q).bounds == {"episode_index": ((3, 3),)}


def test_each_reference_is_narrowed_in_its_own_select():
    """A UNION of bounded SELECTs, or a bounded subquery inside a bounded SELECT: each reference by its own WHERE
    (a new user's UNION ALL of two episodes read every row group); one without a bound stays as it is."""
    sql = ("SELECT * FROM frames WHERE episode_index = 3 UNION ALL SELECT * FROM frames f WHERE f.episode_index IN "
           "(4, 5) UNION ALL SELECT * FROM frames WHERE frame_index = 0")
    got = _all(sql)
    assert [n.bounds for n in got] == [{"episode_index": ((3, 3),)}, {"episode_index": ((4, 5),)}]
    assert [n.alias for n in got] == ["frames", "f"] and got[0].end <= got[1].start
    sql = ("SELECT * FROM frames WHERE episode_index = 7 AND frame_index IN (SELECT frame_index FROM frames WHERE "
           "episode_index = 8 AND index < 100)")
    assert [n.bounds for n in _all(sql)] == [{"episode_index": ((7, 7),)},
                                              {"episode_index": ((8, 8),), "index": ((-INF, 99),)}]


def test_a_subquery_over_metadata_views_is_kept_to_run_alone():
    """`episode_index IN (SELECT ... FROM episodes ...)`, the natural way to pick episodes: its text is kept for the
    catalog to run alone (its values bound the column); one over frames, a table function, a CTE or another table is
    not, nor any where a CTE is named like a metadata view (the subquery would read the CTE)."""
    sql = "SELECT * FROM frames WHERE episode_index IN (SELECT episode_index FROM episodes WHERE length > 300)"
    got = _narrow(sql)
    text = "(SELECT episode_index FROM episodes WHERE length > 300)"
    assert got.bounds == {} and got.subqueries == (("episode_index", text, sql.index(text), len(sql)),)
    got = _narrow("SELECT * FROM frames f WHERE f.index < 10 AND f.episode_index IN (SELECT e.episode_index FROM "
                  "episodes e JOIN tasks t ON t.task = e.tasks[1])")
    assert got.bounds == {"index": ((-INF, 9),)} and len(got.subqueries) == 1
    for sql in ["SELECT * FROM frames WHERE episode_index IN (SELECT episode_index FROM frames WHERE frame_index = 0)",
                "SELECT * FROM frames WHERE episode_index IN (SELECT range FROM range(5))",
                "WITH e AS (SELECT 1 AS episode_index) SELECT * FROM frames WHERE episode_index IN (SELECT "
                "episode_index FROM e)",
                "WITH episodes AS (SELECT 1 AS episode_index) SELECT * FROM frames WHERE episode_index IN (SELECT "
                "episode_index FROM episodes)",
                "SELECT * FROM frames WHERE episode_index NOT IN (SELECT episode_index FROM episodes)",
                "SELECT * FROM frames WHERE frame_index IN (SELECT length FROM episodes)"]:
        assert _narrow(sql) is None, sql


def test_the_text_kept_to_run_is_the_subquery_itself():
    """`(episode_index) = ANY (SELECT ...)`: DuckDB's span of that SUBQUERY is the whole comparison, from the column
    on, which begins with "(" and ends with ")" as a subquery does; it was kept as the text to run alone (not the
    subquery: what would run is not what the parse tree said). Only a span that begins after the column is read."""
    assert _narrow("SELECT * FROM frames WHERE (episode_index) = ANY (SELECT episode_index FROM episodes)") is None
    assert _narrow("SELECT * FROM frames f WHERE (f.index) = SOME (SELECT 3) AND f.episode_index = 2").subqueries == ()
    got = _narrow("SELECT * FROM frames WHERE ( \"episode_index\" ) IN ( SELECT 3 )")
    assert [s[1] for s in got.subqueries] == ["( SELECT 3 )"]
