"""lerobot_sql._catalog.frames_part: a query whose WHERE bounds episode_index or index reads only the row groups
that may hold its rows, and answers exactly as the whole view does (the same rows, order, types and values), on
every sample set, over HTTP, with statistics missing, after a data file changed, and with its results kept."""

from __future__ import annotations

import gc
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql._catalog import connection, frames_part
from lerobot_sql._storage import cache


@pytest.fixture(autouse=True)
def _small_sets_narrowed(monkeypatch):
    """(the sample sets have tens of row groups, where a query reads the whole view: here they are narrowed too)"""
    monkeypatch.setattr(frames_part, "MIN_ROW_GROUPS", 0)


def test_a_set_of_few_row_groups_reads_the_whole_view(datasets, tmp_path, monkeypatch):
    monkeypatch.setattr(frames_part, "MIN_ROW_GROUPS", 256)
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    _check(db, "SELECT * FROM frames WHERE episode_index = 3", narrowed=False)


QUERIES = [
    "SELECT * FROM frames WHERE episode_index = {e}",
    "SELECT * FROM frames WHERE episode_index IN ({e}, {last}, 0)",
    "SELECT * FROM frames f WHERE f.episode_index BETWEEN {e} AND {e} + 1",  # (an expression: not narrowed)
    "SELECT * FROM frames WHERE episode_index BETWEEN 1 AND {e}",
    "SELECT index, timestamp FROM frames WHERE index >= {i} AND index < {i} + 40 ORDER BY index DESC",
    "SELECT * FROM frames WHERE {i} >= index AND episode_index >= 1",
    "SELECT episode_index, count(*), avg(timestamp) FROM frames WHERE episode_index IN (1, {e}) GROUP BY 1 ORDER BY 1",
    "SELECT frame_index, sum(frame_index) OVER () FROM frames WHERE episode_index = {e}",
    "SELECT 'é→ü' AS x, * FROM FRAMES /* c */ AS \"F r\" WHERE \"F r\".episode_index = {e} LIMIT 7",
    "SELECT count(*) FROM episodes WHERE episode_index IN (SELECT episode_index FROM frames WHERE index < {i})",
    "SELECT * FROM frames WHERE episode_index = {e} AND frame_index % 7 = 0",
    "SELECT * FROM frames WHERE episode_index = -1",
    "SELECT * FROM frames WHERE episode_index BETWEEN {e} AND 1",
    "SELECT * FROM frames WHERE episode_index = {e} OR index = 3",  # not narrowed
    "SELECT * FROM frames WHERE episode_index = {e} UNION ALL SELECT * FROM frames f WHERE f.episode_index = 1",
    "SELECT index FROM frames WHERE episode_index = {e} AND frame_index IN (SELECT frame_index + 1 FROM frames "
    "WHERE episode_index = 1) ORDER BY index",
    "SELECT count(*) FROM frames WHERE episode_index = {e} UNION ALL SELECT count(*) FROM frames",  # (the 2nd whole)
    # (a semi join's rows come in no set order without ORDER BY, over the whole view too)
    "SELECT * FROM frames WHERE episode_index IN (SELECT episode_index FROM episodes WHERE episode_index % 7 = 3) "
    "ORDER BY index",
    "SELECT * FROM frames f WHERE index < {i} AND episode_index IN (SELECT episode_index FROM episodes WHERE length "
    "> f.frame_index + 100) ORDER BY index",  # (correlated: does not run alone, the index bound alone narrows)
    "SELECT * FROM frames WHERE episode_index IN (SELECT episode_index * 1.0 FROM episodes WHERE episode_index < 3) "
    "ORDER BY index",
    "SELECT * FROM frames WHERE episode_index IN (SELECT NULL::BIGINT UNION ALL SELECT {e}) ORDER BY index",
    "SELECT * FROM frames WHERE episode_index IN (SELECT episode_index FROM episodes WHERE false) ORDER BY index",
]


def _both(db, sql: str):
    """(the narrowed answer, whether it was narrowed, the whole view's answer)."""
    r = db.sql(sql)
    got, narrowed = r.arrow(), r._pin is not None
    plan = db._connection.frames_plan
    db._connection.frames_plan = None
    try:
        want = db.sql(sql).arrow()
    finally:
        db._connection.frames_plan = plan
    return got, narrowed, want


def _check(db, sql: str, narrowed: bool | None = None):
    got, was, want = _both(db, sql)
    assert got.schema == want.schema, sql
    assert got.to_pylist() == want.to_pylist(), sql
    if narrowed is not None:
        assert was is narrowed, sql
    return got


@pytest.mark.parametrize("name", ["small20", "multifile60", "v21_small20", "img5_extras", "h264_20", "depth4"])
def test_a_narrowed_query_answers_as_the_whole_view(datasets, tmp_path, name):
    db = lsql.connect(datasets / name, cache_dir=tmp_path / "c")
    n_eps, n = db.sql("SELECT count(*), sum(length) FROM episodes").fetchall()[0]
    assert db._connection.frames_plan is not None
    e, last, i = n_eps // 2, n_eps - 1, n // 2
    for q in QUERIES:
        sql = q.format(e=e, last=last, i=i)
        got = _check(db, sql, narrowed=False if "OR index" in sql or ("BETWEEN" in sql and "+ 1" in sql) else None)
        if q == QUERIES[0]:
            assert got.num_rows == db.sql(f"SELECT length FROM episodes WHERE episode_index = {e}").fetchall()[0][0]
    # the queries of a few row groups were narrowed (read only those; one of most row groups reads the whole view)
    for q in QUERIES[:2]:
        assert _both(db, q.format(e=e, last=last, i=i))[1]


def test_row_groups_without_statistics_are_read(datasets, tmp_path):
    """A data file written without statistics for episode_index: its row groups may hold any episode, so they are
    read (DuckDB reads them too); the answer is the whole view's."""
    src = tmp_path / "src"
    shutil.copytree(datasets / "multifile60", src, ignore=shutil.ignore_patterns("videos"))
    f = src / "data/chunk-000/file-001.parquet"
    t = pq.read_table(f)
    md = pq.read_metadata(f)
    pq.write_table(t, f, row_group_size=md.row_group(0).num_rows,
                   write_statistics=[c for c in t.column_names if c != "episode_index"])
    db = lsql.connect(src, cache_dir=tmp_path / "c")
    lost = db.sql('SELECT max(episode_index) FROM episodes WHERE "data/file_index" = 1').fetchall()[0][0]
    got = _check(db, f"SELECT * FROM frames WHERE episode_index = {lost}", narrowed=True)
    assert got.num_rows == db.sql(f"SELECT length FROM episodes WHERE episode_index = {lost}").fetchall()[0][0] > 0


def test_results_keep_their_rows_and_released_ones_are_unregistered(datasets, tmp_path):
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    kept = db.sql("SELECT * FROM frames WHERE episode_index = 3")
    first = kept.limit(5)
    want = kept.arrow()
    for k in range(30):
        db.sql(f"SELECT * FROM frames WHERE episode_index = {k}").arrow()
    gc.collect()
    db.sql("SELECT * FROM frames WHERE episode_index = 0").arrow()  # (sweeps the released ones)
    assert kept.arrow().to_pylist() == want.to_pylist()
    assert first.arrow().to_pylist() == want.slice(0, 5).to_pylist()
    live = [r[0] for r in db.con.sql("SELECT view_name FROM duckdb_views() WHERE view_name LIKE '_lsql_part_%'")
            .fetchall()]
    assert 1 <= len(live) <= 3, live  # kept's, and the last query's at most: the others were unregistered
    del kept, first
    gc.collect()
    db.sql("SELECT * FROM frames WHERE episode_index = 0").arrow()
    assert len(db.con.sql("SELECT view_name FROM duckdb_views() WHERE view_name LIKE '_lsql_part_%'")
               .fetchall()) <= 2


def test_too_many_rows_read_the_whole_view(datasets, tmp_path, monkeypatch):
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    monkeypatch.setattr(frames_part, "MAX_ROWS", 100)
    _check(db, "SELECT * FROM frames WHERE episode_index IN (1, 2)", narrowed=False)
    monkeypatch.setattr(frames_part, "MAX_ROWS", 10_000)
    monkeypatch.setattr(frames_part, "MAX_BYTES", 10)
    _check(db, "SELECT * FROM frames WHERE episode_index IN (1, 2)", narrowed=False)


def test_a_rewritten_data_file_is_never_answered_from_its_old_ranges(datasets, tmp_path):
    """The row groups' ranges are kept per version of the data files: after a file is rewritten (its episodes'
    rows split differently) the next query judges the new row groups, in this process and the next."""
    src = tmp_path / "src"
    shutil.copytree(datasets / "multifile60", src, ignore=shutil.ignore_patterns("videos"))
    db = lsql.connect(src, cache_dir=tmp_path / "c")
    e = db.sql('SELECT max(episode_index) FROM episodes WHERE "data/file_index" = 0').fetchall()[0][0]
    before = _check(db, f"SELECT * FROM frames WHERE episode_index = {e}", narrowed=True)
    f = src / "data/chunk-000/file-000.parquet"
    t = pq.read_table(f)
    pq.write_table(t.slice(0, t.num_rows - 10), f, row_group_size=37)  # the last 10 frames of episode e gone
    after = _check(db, f"SELECT * FROM frames WHERE episode_index = {e}", narrowed=True)
    assert after.num_rows == before.num_rows - 10
    again = lsql.connect(src, cache_dir=tmp_path / "c")
    _check(again, f"SELECT * FROM frames WHERE episode_index = {e}", narrowed=True)


def test_a_damaged_ranges_file_is_rebuilt(datasets, tmp_path):
    frames_part._RANGES.clear()  # (kept per process and version of the files: another test's would serve this one)
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    _check(db, "SELECT * FROM frames WHERE episode_index = 40", narrowed=True)
    (path,) = (tmp_path / "c").rglob("rowgroup-ranges-*.npz")
    frames_part._RANGES.clear()  # (as for the next process: nothing kept, the entry not checked yet)
    cache._CHECKED.clear()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    again = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    with pytest.warns(UserWarning, match="rowgroup-ranges.*rebuilding"):
        _check(again, "SELECT * FROM frames WHERE episode_index = 40", narrowed=True)


def test_over_http_only_the_row_groups_are_fetched(datasets, tmp_path, monkeypatch, request):
    from http_range_server import RangeServer

    monkeypatch.delenv("LSQL_OFFLINE", raising=False)
    shutil.copytree(datasets / "multifile60", tmp_path / "src", ignore=shutil.ignore_patterns("videos"))
    srv = RangeServer(tmp_path).__enter__()
    request.addfinalizer(lambda: srv.__exit__(None, None, None))
    db = lsql.connect(f"{srv.url}/src", cache_dir=tmp_path / "c")
    for e in (0, 33, 59):
        _check(db, f"SELECT * FROM frames WHERE episode_index = {e}", narrowed=True)


def test_collections_and_mixed_schemas_read_the_whole_view(datasets, tmp_path):
    many = lsql.connect_many([datasets / "small20", datasets / "multifile60"], cache_dir=tmp_path / "c")
    r = many.sql("SELECT count(*) FROM frames WHERE episode_index = 3")
    assert r._pin is None and r.fetchall()[0][0] > 0
    assert connection.Connection.narrowed  # (the collection's connection keeps no plan)


def _copy(datasets, tmp_path, name: str = "multifile60"):
    src = tmp_path / "src"
    shutil.copytree(datasets / name, src, ignore=shutil.ignore_patterns("videos"))
    return src


def _rewrite(src, change) -> None:
    """Every data file of ``src`` rewritten as ``change(table)`` gives it, in row groups of the same size."""
    for f in sorted((src / "data").rglob("*.parquet")):
        pq.write_table(change(pq.read_table(f)), f, row_group_size=pq.read_metadata(f).row_group(0).num_rows)


def test_bounds_beyond_64_bits_answer_as_the_whole_view(datasets, tmp_path):
    """DuckDB reads 2**63 and above (and below -2**63) as HUGEINT literals: the bounds they give lie beyond every
    row group's range, or hold all of them (not an OverflowError)."""
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    big = "99999999999999999999"
    for sql in [f"SELECT * FROM frames WHERE episode_index = {big}",
                f"SELECT count(*) FROM frames WHERE episode_index < {big}",
                f"SELECT count(*) FROM frames WHERE index > -{big}",
                "SELECT count(*) FROM frames WHERE index > 9223372036854775807",
                "SELECT count(*) FROM frames WHERE index < -9223372036854775808",
                f"SELECT count(*) FROM frames WHERE episode_index IN (3, {big}, -{big})",
                f"SELECT count(*) FROM frames WHERE index BETWEEN -{big} AND 300"]:
        # (a bound that keeps every row group reads the whole view, as one that keeps most does)
        _check(db, sql, narrowed=not ("< 9" in sql or "> -9" in sql))


@pytest.mark.parametrize("column", [pa.array(np.arange(2, dtype=np.float16)), pa.array([1, 2], pa.decimal256(50, 2))])
def test_columns_duckdb_cannot_read_from_arrow_read_the_whole_view(datasets, tmp_path, column):
    """A data column pyarrow reads as a type DuckDB cannot scan from Arrow (float16, decimal256; DuckDB's own
    Parquet reader reads them as FLOAT, DOUBLE): the query reads the whole view, as before."""
    src = _copy(datasets, tmp_path)
    _rewrite(src, lambda t: t.append_column("extra", pa.concat_arrays([column] * (t.num_rows // 2 + 1))
                                            .slice(0, t.num_rows)))
    db = lsql.connect(src, cache_dir=tmp_path / "c")
    got = _check(db, "SELECT * FROM frames WHERE episode_index = 3", narrowed=False)
    assert got.num_rows == db.sql("SELECT length FROM episodes WHERE episode_index = 3").fetchall()[0][0]


def test_a_cte_never_stands_for_a_relation_the_view_reads(datasets, tmp_path):
    """The view's SELECT put in place of frames reads _episodes_raw (a derived index), tasks (a derived task_index)
    and the registered part: a CTE of one of those names must not stand in for it (the view's own reading does
    not see the query's CTEs)."""
    src = _copy(datasets, tmp_path, "v21_small20")
    _rewrite(src, lambda t: t.drop_columns(["index"]))
    with pytest.warns(UserWarning, match="index"):
        db = lsql.connect(src, cache_dir=tmp_path / "c")
        db.sql("SELECT 1").fetchall()
    fake = ("_episodes_raw AS (SELECT episode_index, 1000 AS dataset_from_index, 10000 AS length, tasks "
            "FROM episodes)")
    got = _check(db, f"WITH {fake} SELECT index FROM frames WHERE episode_index = 0 ORDER BY index LIMIT 3",
                 narrowed=False)
    assert got.column("index").to_pylist() == [0, 1, 2]
    _check(db, "WITH x AS (SELECT 1) SELECT index FROM frames WHERE episode_index = 0", narrowed=True)
    # (the part's name is the next one of the connection's counter: a CTE of that name, with the data's columns)
    n = int(db.sql("SELECT 1 FROM frames WHERE episode_index = 0")._pin[0].name.rsplit("_", 1)[1])
    fake = (f'_lsql_part_{n + 1} AS (SELECT action AS "observation.state", action, timestamp, frame_index, '
            "7 AS episode_index, 0 AS task_index FROM frames_0 LIMIT 0)")
    got = _check(db, f"WITH frames_0 AS (SELECT [1.0]::FLOAT[] AS action, 0.5::FLOAT AS timestamp, 0 AS frame_index), "
                     f"{fake} SELECT count(*) FROM frames WHERE episode_index = 0", narrowed=False)
    assert got.to_pylist()[0]["count_star()"] > 0


def test_a_column_named_like_a_bound_one_in_another_case(datasets, tmp_path):
    """DuckDB names columns ignoring ASCII case and reads the first of "Index" and "index" as index (the second is
    index_1): the row groups are judged by that first column's statistics, not by the other's."""
    src = _copy(datasets, tmp_path)
    _rewrite(src, lambda t: pa.Table.from_arrays([pa.array(t["index"].to_numpy() + 100_000)] + t.columns,
                                                 names=["Index"] + t.column_names))
    with pytest.warns(UserWarning):
        db = lsql.connect(src, cache_dir=tmp_path / "c")
        db.sql("SELECT 1").fetchall()
    got = _check(db, 'SELECT count(*) FROM frames WHERE "Index" BETWEEN 100000 AND 100499')
    assert got.to_pylist() == [{"count_star()": 500}]


def test_a_cache_folder_that_cannot_be_written_reads_the_ranges_in_memory(datasets, tmp_path, monkeypatch):
    """(a full or read-only cache folder: the whole view's reading needs none, so neither does a part of it)"""
    frames_part._RANGES.clear()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "atomic_write", full)
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    db.sql("SELECT 1").fetchall()  # (the footer survey's ranges: kept in memory only)
    frames_part._RANGES.clear()
    _check(db, "SELECT * FROM frames WHERE episode_index = 40", narrowed=True)
    assert not list((tmp_path / "c").rglob("rowgroup-ranges-*.npz"))


def test_a_subquery_that_names_a_column_keeps_its_name(datasets, tmp_path):
    """An unaliased select expression is named by its text: the column keeps the name the query gives it (not the
    text of the view's SELECT and the part's registration), narrowed where it has an alias."""
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    got = _check(db, "SELECT (SELECT count(*) FROM frames WHERE episode_index = 3), length FROM episodes",
                 narrowed=False)
    assert got.column_names[0] == "(SELECT count_star() FROM frames WHERE (episode_index = 3))"
    _check(db, "SELECT (SELECT count(*) FROM frames WHERE episode_index = 3) AS n FROM episodes", narrowed=True)


MANIFEST_QUERIES = [
    "SELECT index FROM frames WHERE episode_index = {e}",
    "SELECT * FROM frames WHERE episode_index IN (1, {e}) AND frame_index % 5 = 0 ORDER BY index DESC",
    "SELECT index, timestamp AS t FROM frames WHERE index BETWEEN {i} AND {i} + 50",
    "SELECT episode_index, 0.5 AS start_s, 1.5 AS end_s FROM episodes WHERE episode_index IN (0, {e})",
    "SELECT episode_index FROM episodes WHERE episode_index IN ({e}, 2)",
]


@pytest.mark.parametrize("name", ["small20", "multifile60", "v21_small20", "h264_20"])
def test_manifests_resolve_from_their_row_groups_as_from_the_whole_view(datasets, tmp_path, name):
    """A selection's frames are found in the row groups of its frames or episodes (the join with _frames_loc over
    a part of it): the same manifest, every column, as over the whole view; and the part of _frames_loc is its rows."""
    db = lsql.connect(datasets / name, cache_dir=tmp_path / "c")
    n_eps, n = db.sql("SELECT count(*), sum(length) FROM episodes").fetchall()[0]
    e, i = n_eps // 2, n // 2
    real, parts = db._connection.loc, []
    db._connection.loc = lambda bounds, view: parts.append(real(bounds, view)) or parts[-1] \
        if db._connection.frames_plan else real(bounds, view)
    for q in MANIFEST_QUERIES:
        sql = q.format(e=e, i=i)
        got = db.manifest(sql)
        plan = db._connection.frames_plan
        db._connection.frames_plan = None
        try:
            want = db.manifest(sql)
        finally:
            db._connection.frames_plan = plan
        assert got.equals(want), sql
        assert got.num_rows > 0
    # the frame and window selections were resolved from parts (the episode one from the pointers, no join); the
    # frames of every episode sharing an mp4 with a selected one (one mp4 holds all of small20's) from the view
    assert sum(p is not None for p in parts) >= 5
    db._connection.loc = real
    for bounds in ({"episode_index": ((e, e),)}, {"index": ((i, i + 3), (n - 2, n + 5))}, {"episode_index": ()}):
        part, pin = db._connection.loc(bounds)
        col, ((lo, hi), *rest) = next(iter(bounds.items())) if next(iter(bounds.values())) else ("index", ((-1, -1),))
        where = " OR ".join(f"{col} BETWEEN {a} AND {b}" for a, b in [(lo, hi), *rest])
        cols = "index, episode_index, frame_index, timestamp, task_index, data_file, row"
        got = db.con.sql(f"SELECT {cols} FROM {part} WHERE {where} ORDER BY index").fetchall()
        want = db.con.sql(f"SELECT {cols} FROM _frames_loc WHERE {where} ORDER BY index").fetchall()
        assert got == want and (got or not next(iter(bounds.values())))


@pytest.mark.parametrize("column", ["episode_index", "index", "timestamp", "frame_index"])
def test_a_null_frame_cell_is_shown_as_the_whole_view_shows_it(datasets, tmp_path, column):
    """SQL is where a broken row is looked at: a NULL in a frame column is answered as the whole view answers it
    (a NULL), not refused; a training set of it is refused as before (test_tabular names how)."""
    src = tmp_path / "src"
    shutil.copytree(datasets / "small20", src, ignore=shutil.ignore_patterns("videos"))
    f = src / "data/chunk-000/file-000.parquet"
    t = pq.read_table(f)
    v = t[column].to_pylist()
    v[1000] = None  # (episode 3)
    pq.write_table(t.set_column(t.column_names.index(column), column, pa.array(v, t.schema.field(column).type)), f,
                   row_group_size=pq.read_metadata(datasets / "small20/data/chunk-000/file-000.parquet")
                   .row_group(0).num_rows)
    db = lsql.connect(src, cache_dir=tmp_path / "c")
    where = "index BETWEEN 995 AND 1005" if column == "episode_index" else "episode_index IN (3, 4)"
    got = _check(db, f"SELECT * FROM frames WHERE {where} ORDER BY frame_index, index", narrowed=True)
    assert None in got[column].to_pylist()


def test_a_broken_episode_named_by_a_manifest_is_the_first_one_as_over_the_whole_view(datasets, tmp_path):
    """Two selected episodes both broken (here: file-001 overwritten by a copy of file-000, so episodes 3 and 4 are
    spread over both files): the error names the first of them whether the join read a part of _frames_loc or the
    whole view. Before, it named the first in the aggregate's row order: episode 4 from the part, 3 from the view."""
    root = tmp_path / "rep"
    shutil.copytree(datasets / "multifile60", root, ignore=shutil.ignore_patterns("videos"))
    shutil.copy(root / "data/chunk-000/file-000.parquet", root / "data/chunk-000/file-001.parquet")
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    sql = "SELECT episode_index, 0.0 AS start_s, 1e9 AS end_s FROM episodes WHERE episode_index IN (3, 4)"
    with pytest.warns(UserWarning):
        for plan in (db._connection.frames_plan, None):
            db._connection.frames_plan = plan
            with pytest.raises(lsql.DatasetFormatError, match=r"^episode 3: its 536 frames are spread over 2 data"):
                db.manifest(sql, cameras=[])


def test_a_subquery_of_episodes_narrows_by_its_values(datasets, tmp_path):
    """`episode_index IN (SELECT episode_index FROM episodes WHERE ...)` reads the row groups of those episodes (the
    subquery run alone first); a correlated one, or one of other types than integers, reads the whole view."""
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    sql = ("SELECT * FROM frames WHERE episode_index IN (SELECT episode_index FROM episodes WHERE episode_index % 20 = "
           "3) ORDER BY index")
    got = _check(db, sql, narrowed=True)
    assert sorted(set(got["episode_index"].to_pylist())) == [3, 23, 43]
    _check(db, "SELECT * FROM frames f WHERE episode_index IN (SELECT episode_index FROM episodes WHERE length > "
               "f.frame_index + 300) ORDER BY index", narrowed=False)
    _check(db, "SELECT * FROM frames WHERE episode_index IN (SELECT episode_index * 1.0 FROM episodes WHERE "
               "episode_index < 3) ORDER BY index", narrowed=False)


def test_a_subquery_that_gives_other_values_at_each_run_keeps_the_ones_it_was_narrowed_by(datasets, tmp_path):
    """A subquery with SAMPLE, LIMIT or random() gives other episodes at each run: the values it gave when run alone
    (whose row groups the part holds) stand in its place, so every row of those episodes is kept; with the values
    run again, the query kept only the episodes both runs drew."""
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    for _ in range(5):
        r = db.sql("SELECT episode_index, count(*) AS n FROM frames WHERE episode_index IN (SELECT episode_index FROM "
                   "episodes ORDER BY random() LIMIT 3) GROUP BY 1 ORDER BY 1")
        got = r.fetchall()
        assert r._pin is not None and len(got) == 3
        lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
        assert all(n == lengths[e] for e, n in got)


def test_a_slow_bounding_subquery_is_stopped_at_the_timeout(datasets, tmp_path):
    """The subquery run alone (to learn its values) runs inside db.sql(), before the Result exists: it is stopped at
    the query's timeout (and by Ctrl-C) like the query itself. Before, it ran unbounded: a 6-way cross join of
    episodes (~100 s here) held db.sql(..., timeout=0.5) for all of it, where the whole view stopped at 0.5 s."""
    import time

    from lerobot_sql.errors import QueryInterrupted

    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    db.sql("SELECT 1").fetchall()
    joins = ", ".join(f"episodes e{i}" for i in range(6))
    total = " + ".join(f"e{i}.length" for i in range(6))
    sql = f"SELECT count(*) FROM frames WHERE episode_index IN (SELECT e0.episode_index FROM {joins} WHERE {total} > 0)"
    t = time.monotonic()
    with pytest.raises(QueryInterrupted, match="timeout"):
        db.sql(sql, timeout=0.5).fetchall()
    assert time.monotonic() - t < 15
    assert db.sql("SELECT count(*) FROM frames WHERE episode_index IN (SELECT 3)").fetchall()[0][0] > 0


def test_a_cte_named_like_the_values_of_a_subquery_is_not_read_in_their_place(datasets, tmp_path):
    """The registered values of a bounding subquery are read by name where the subquery was: a CTE of the query of
    that name (`_lsql_values_<n>`, the names are counted per connection) was read instead, and the query kept the
    CTE's episodes from a part holding others': no row. The values take a name no CTE of the query has."""
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    ctes = ", ".join(f"_lsql_values_{i} AS (SELECT 7 AS v)" for i in range(40))
    got = _check(db, f"WITH {ctes} SELECT count(*) FROM frames WHERE episode_index IN (SELECT 3)", narrowed=True)
    assert got.to_pylist()[0]["count_star()"] > 0


def test_a_subquery_is_not_run_alone_where_no_part_can_be_made(datasets, tmp_path, monkeypatch):
    """Data files of fewer than MIN_ROW_GROUPS row groups (most datasets) are read whole whatever the bounds: the
    bounding subquery is not run alone first, for nothing (the query runs it again; a slow one took twice as long)."""
    monkeypatch.setattr(frames_part, "MIN_ROW_GROUPS", 256)
    calls = []
    real = frames_part._subquery_values
    monkeypatch.setattr(frames_part, "_subquery_values",
                        lambda cur, text, guard=None: calls.append(text) or real(cur, text, guard))
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    _check(db, "SELECT * FROM frames WHERE episode_index IN (SELECT episode_index FROM episodes WHERE length > 100) "
               "ORDER BY index", narrowed=False)
    assert calls == []
    monkeypatch.setattr(frames_part, "MIN_ROW_GROUPS", 0)
    _check(db, "SELECT * FROM frames WHERE episode_index IN (SELECT 3) ORDER BY index", narrowed=True)
    assert calls == ["(SELECT 3)"]


def test_ranges_read_plain_integers_raw_and_other_types_as_arrow_converts_them(tmp_path):
    """file_ranges takes a plain INT64 / INT32 column's statistics as stored (min_raw: half the cost of a footer's
    pass) and any other type's through Arrow's conversion: the same ranges as that conversion gives, and an
    unsigned value beyond int64 or a timestamp counts as unknown (read whenever bounded)."""
    import collections

    f = tmp_path / "x.parquet"
    t = pa.table({"index": pa.array([5, 9, 10, 12], pa.int32()),
                  "episode_index": pa.array([1, 1, 2, 2**63 + 3], pa.uint64())})
    pq.write_table(t, f, row_group_size=2)
    out = collections.defaultdict(list)
    frames_part.file_ranges(pq.read_metadata(f), 0, out)
    assert out["lo/index"][0].tolist() == [5, 10] and out["hi/index"][0].tolist() == [9, 12]
    assert out["known/index"][0].tolist() == [True, True]
    assert out["known/episode_index"][0].tolist() == [True, False]  # (2**63 + 3: no int64 holds it)
    assert out["lo/episode_index"][0][0] == 1 and out["hi/episode_index"][0][0] == 1
    g = tmp_path / "ts.parquet"
    pq.write_table(pa.table({"index": pa.array([1, 2], pa.timestamp("us"))}), g)
    out = collections.defaultdict(list)
    frames_part.file_ranges(pq.read_metadata(g), 0, out)
    assert out["known/index"][0].tolist() == [False]


def test_the_footer_survey_keeps_the_facts_an_open_reads(datasets, tmp_path, monkeypatch):
    """The first query's footer survey parses every data file's footer once; the facts an open of a selection
    needs from them (row-group offsets, schema) are kept from that pass, so the open parses no footer again (it
    parsed all 20 of the scale set's a second time: 0.85 s of a 3.5 s first open), and they equal a parse's."""
    from lerobot_sql._readers import tabular

    root = tmp_path / "m"
    shutil.copytree(datasets / "multifile60", root, ignore=shutil.ignore_patterns("videos"))
    parsed = []
    real = tabular._parse_facts
    monkeypatch.setattr(tabular, "_parse_facts", lambda src, rel, identity: parsed.append(rel) or real(src, rel, identity))
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    db.sql("SELECT count(*) FROM frames").fetchall()  # the survey
    monkeypatch.setenv("LSQL_LAZY_FRAMES", "1")  # (the open from the episode pointers, which reads the facts)
    ds = db.dataset("SELECT episode_index FROM episodes", cameras=[])
    assert len(db.layout.data_files) > 1 and parsed == []
    assert int(ds[len(ds) - 1]["index"]) == len(ds) - 1
    for rel in db.layout.data_files:
        kept = tabular._kept_facts(db.source, rel, db.source.identity(rel), db.cache_dir)
        want = real(db.source, rel, db.source.identity(rel))
        assert kept.rg_offsets.tolist() == want.rg_offsets.tolist() and kept.schema.equals(want.schema)


@pytest.mark.parametrize("shift", [0, 1_000_000])
def test_a_data_file_changed_while_a_bounding_subquery_runs_is_refused(datasets, tmp_path, monkeypatch, shift):
    """A query's narrowings look at the data files' versions once (before its bounding subquery runs): a file
    rewritten meanwhile (other row groups; with ``shift`` other index values too) is refused naming it, never read
    by the ranges and footer of its old version."""
    src = _copy(datasets, tmp_path)
    db = lsql.connect(src, cache_dir=tmp_path / "c")
    sql = ("SELECT count(*), sum(index) FROM frames WHERE episode_index IN "
           "(SELECT episode_index FROM episodes WHERE episode_index = 3)")
    assert db.sql(sql).fetchall()[0][0] > 0
    real = frames_part._subquery_values

    def changing(cur, text, guard=None):
        got = real(cur, text, guard)
        for f in sorted((src / "data").rglob("*.parquet")):
            t = pq.read_table(f)
            t = t.set_column(t.column_names.index("index"), "index", pa.array(t["index"].to_numpy() + shift))
            pq.write_table(t, f, row_group_size=max(pq.read_metadata(f).row_group(0).num_rows // 2, 1))
        return got

    monkeypatch.setattr(frames_part, "_subquery_values", changing)
    with pytest.raises(lsql.DatasetFormatError, match="changed after the dataset was opened"):
        db.sql(sql).fetchall()
