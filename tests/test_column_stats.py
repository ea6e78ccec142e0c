"""lerobot_sql._readers.column_stats: numeric statistics read from the data files in spans of row groups, checked
against numpy over exactly the selected rows (read back with pyarrow, not through lerobot_sql), whatever the spans,
the ranges the metadata gives, repeats, NaN; and a large whole-episode selection's statistics (kept as runs, no row
per frame) equal to its manifest's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import linked_copy
from lerobot_sql._plan import episodes as plan_episodes
from lerobot_sql._readers import column_stats

QS = (0.01, 0.10, 0.50, 0.90, 0.99)
QKEYS = ("q01", "q10", "q50", "q90", "q99")
NUMERIC = ("observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index")


def _frames(root) -> dict[str, np.ndarray]:
    """Every data row of ``root`` by ``index``, straight from the Parquet files: {column: (frames, elements)}."""
    t = pa.concat_tables([pq.read_table(p) for p in sorted((root / "data").rglob("*.parquet"))])
    t = t.sort_by("index")
    out = {}
    for k in NUMERIC:
        col = t[k].combine_chunks()
        x = col.flatten().to_numpy() if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type) \
            else col.to_numpy()
        out[k] = np.asarray(x).reshape(t.num_rows, -1)
    assert (out["index"][:, 0] == np.arange(t.num_rows)).all()
    return out


def _check(st, frames, indices, keys=NUMERIC):
    for k in keys:
        x = frames[k][np.asarray(indices)]
        ref = {"min": x.min(0), "max": x.max(0), "mean": x.astype(np.float64).mean(0),
               "std": x.astype(np.float64).std(0)}
        ref.update({q: np.quantile(x.astype(np.float64), f, axis=0) for q, f in zip(QKEYS, QS)})
        for s, v in ref.items():
            np.testing.assert_allclose(np.asarray(st[k][s], np.float64).reshape(-1), v, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{k} {s}")
        assert st[k]["count"].tolist() == [len(x)]


@pytest.fixture
def small_spans(monkeypatch):
    """Spans of a few row groups, so that every selection is read in many."""
    monkeypatch.setattr(column_stats, "CHUNK_ROWS", 97)


@pytest.mark.parametrize("sql", [
    "SELECT episode_index FROM episodes",
    "SELECT index FROM frames WHERE frame_index % 3 = 0 AND episode_index IN (0, 5, 19)",
    # overlapping windows: the frames in both count twice
    "SELECT 3 AS episode_index, 0.0 AS start_s, 1.0 AS end_s UNION ALL SELECT 3, 0.5, 1.5 "
    "UNION ALL SELECT 8, 0.2, 2.0 ORDER BY episode_index, start_s",
])
def test_statistics_in_many_spans_equal_numpy_over_the_selected_rows(sample, tmp_path, small_spans, sql):
    db = lsql.connect(sample, cache_dir=tmp_path)
    m = db.manifest(sql)
    _check(db.stats(sql), _frames(sample), m.column("index").to_numpy())


def test_a_large_whole_episode_selection_is_read_as_runs_and_equals_its_manifest(sample, tmp_path, monkeypatch):
    """Above plan_episodes.LAZY_FRAMES a whole-episode selection is kept as its episodes (no row per frame); its
    statistics are read from the same rows: equal to the manifest's, cameras included."""
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = "SELECT episode_index FROM episodes WHERE episode_index % 2 = 1"
    m = db.manifest(sql)
    small = db.stats(sql)
    seen = []
    real = column_stats.column_stats

    def spy(src, layout, files, keys, **kw):
        seen.append(sum(len(f.start) for f in files))
        return real(src, layout, files, keys, **kw)

    monkeypatch.setattr(plan_episodes, "LAZY_FRAMES", 0)
    monkeypatch.setattr(column_stats, "column_stats", spy)
    large = db.stats(sql)
    assert seen == [10]  # one run per episode, not one per frame
    _check(large, _frames(sample), m.column("index").to_numpy())
    assert set(large) == set(small)
    for k in small:
        for s in small[k]:
            np.testing.assert_array_equal(large[k][s], small[k][s], err_msg=f"{k} {s}")
    ds = db.dataset(sql)  # the training set's statistics: the same runs
    assert len(seen) == 1
    np.testing.assert_array_equal(ds.meta.stats["action"]["q50"], small["action"]["q50"])
    assert len(seen) == 2


def _scale_episode_ranges(root, key, factor: float, shift: float = 0.0):
    """meta/episodes' per-episode min and max of ``key`` replaced by ``min * factor + shift`` and ``max * factor +
    shift`` (the file unlinked first: a linked copy)."""
    for p in sorted((root / "meta" / "episodes").rglob("*.parquet")):
        t = pq.read_table(p)
        for s in ("min", "max"):
            name = f"stats/{key}/{s}"
            i = t.column_names.index(name)
            vals = [[v * factor + shift for v in row] for row in t[name].to_pylist()]
            t = t.set_column(i, name, pa.array(vals, t.schema.field(i).type))
        p.unlink()
        pq.write_table(t, p)


@pytest.mark.parametrize("factor, shift", [(0.5, 0.0), (1e6, 0.0), (1.0, 50.0)],
                         ids=["narrower", "far-wider", "beside"])
def test_a_stale_range_in_the_metadata_costs_a_pass_never_a_value(sample, tmp_path, small_spans, monkeypatch,
                                                                    factor, shift):
    """The quantiles' histogram is made over the per-episode min and max of meta/episodes when they are there.
    Ranges the data exceed (values below and above them), ranges so wide that every value falls in one bin (then
    the feature is binned again over its own range), and ranges beside the data give the same exact statistics."""
    root = linked_copy(sample, tmp_path / "ds")
    _scale_episode_ranges(root, "action", factor, shift)
    monkeypatch.setattr(column_stats, "_KEEP_AT_MOST", 64)  # (a few hundred frames: "crowded" at 64 kept values)
    again = []
    real = column_stats._histograms
    monkeypatch.setattr(column_stats, "_histograms", lambda src, layout, files, keys, *a: (
        again.append(list(keys)), real(src, layout, files, keys, *a))[1])
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    sql = "SELECT episode_index FROM episodes WHERE episode_index < 12"
    _check(db.stats(sql), _frames(root), db.manifest(sql).column("index").to_numpy())
    assert again == [["action"]]  # binned again over the range the data has (a constant column never is)


def test_a_nan_gives_nan_statistics_for_its_element_only(sample, tmp_path):
    """A NaN in a float feature makes that element's min, max, mean, std and quantiles NaN (numpy's answer: a
    normalisation by them fails loudly), not a number computed around it; the other elements are exact."""
    root = linked_copy(sample, tmp_path / "ds")
    p = sorted((root / "data").rglob("*.parquet"))[0]
    t = pq.read_table(p)
    i = t.column_names.index("action")
    rows = t["action"].to_pylist()
    rows[5] = [float("nan"), *rows[5][1:]]
    t = t.set_column(i, "action", pa.array(rows, t.schema.field(i).type))
    p.unlink()
    pq.write_table(t, p)
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    st = db.stats("SELECT episode_index FROM episodes")
    for s in ("min", "max", "mean", "std", *QKEYS):
        assert np.isnan(st["action"][s][0]), s
        assert np.isfinite(st["action"][s][1:]).all(), s
    frames = _frames(root)
    x = frames["action"][:, 1:].astype(np.float64)
    np.testing.assert_allclose(st["action"]["q50"][1:], np.quantile(x, 0.5, axis=0), rtol=1e-12)


def test_a_row_holding_another_index_is_refused_naming_the_file(sample, tmp_path, monkeypatch):
    """Runs say which index each row holds (the episode pointers, or a manifest's data_row): a data file whose rows
    hold other indices than meta/episodes says (a row's index shifted) is refused, never read as the selected
    frames."""
    root = linked_copy(sample, tmp_path / "ds")
    p = sorted((root / "data").rglob("*.parquet"))[0]
    t = pq.read_table(p)
    i = t.column_names.index("index")
    idx = t["index"].to_numpy().copy()
    idx[7] += 1000
    t = t.set_column(i, "index", pa.array(idx, t.schema.field(i).type))
    p.unlink()
    pq.write_table(t, p)
    monkeypatch.setattr(plan_episodes, "LAZY_FRAMES", 0)  # opened as runs: no frame read before the statistics
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    with pytest.raises(lsql.DatasetFormatError,
                       match=r"file-000\.parquet: 1 selected rows do not hold .*row 7 holds index 1007"):
        db.stats("SELECT episode_index FROM episodes")


def test_ranges_and_runs_of_rows():
    assert column_stats.concat_ranges(np.array([5, 0, 10]), np.array([3, 0, 2])).tolist() == [5, 6, 7, 10, 11]
    assert column_stats.concat_ranges(np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == []
    info = object()
    runs = column_stats.runs_of_rows([info], np.zeros(7, np.int64), np.array([4, 5, 6, 9, 5, 6, 0]),
                                     np.array([14, 15, 16, 19, 15, 16, 10]))
    (r,) = runs
    got = sorted(zip(r.start.tolist(), r.count.tolist(), r.index0.tolist(), r.weight.tolist()))
    # rows 5 and 6 served twice: one run 4..6 and one 5..6 (or any split serving each row as often)
    served = np.zeros(10, int)
    for s, c, i0, w in got:
        served[s:s + c] += w
        assert i0 == s + 10
    assert served.tolist() == [1, 0, 0, 0, 1, 2, 2, 0, 0, 1]


def test_bins_keep_order_and_send_infinities_to_the_ends():
    b = column_stats._Bins.over(np.array([0.0]), np.array([1.0]))
    x = np.array([[-np.inf, -5.0, -1e-9, 0.0, 0.5, 1.0 - 1e-7, 1.0, 7.0, np.inf]], np.float64)
    got = b.one(0, x[0])
    assert (np.diff(got) >= 0).all() and got[0] == 0 and got[-1] == column_stats.BINS + 1
    assert got[3] == 1 and got[1] == 0 and got[7] == column_stats.BINS + 1
    one = column_stats._Bins.over(np.array([3.0]), np.array([3.0]))  # a range of one value
    got = one.one(0, np.array([-np.inf, 2.0, 3.0, 3.5, 9.0, np.inf], np.float32))
    assert (np.diff(got) >= 0).all()


def _passes(monkeypatch) -> list[list[str]]:
    """The columns of each pass over the data files column_stats makes (a list filled as they start)."""
    seen = []
    real = column_stats._chunks

    def spy(src, layout, files, columns, **kw):
        seen.append(sorted(columns))
        return real(src, layout, files, columns, **kw)

    monkeypatch.setattr(column_stats, "_chunks", spy)
    return seen


@pytest.mark.parametrize("sql", ["SELECT episode_index FROM episodes",
                                 "SELECT 3 AS episode_index, 0.0 AS start_s, 1.0 AS end_s UNION ALL "
                                 "SELECT 3, 0.5, 1.5 ORDER BY episode_index, start_s"])
def test_exact_quantiles_in_one_pass(sample, tmp_path, small_spans, monkeypatch, sql):
    """Integer features are counted exactly and the others keep the values near each needed rank as they are
    binned: one pass over the data files gives every statistic (also with frames served twice)."""
    passes = _passes(monkeypatch)
    db = lsql.connect(sample, cache_dir=tmp_path)
    _check(db.stats(sql), _frames(sample), db.manifest(sql).column("index").to_numpy())
    assert passes == [sorted(NUMERIC)]


@pytest.mark.parametrize("ranges", [True, False], ids=["ranged", "unranged"])
def test_values_kept_too_narrowly_are_read_again_never_guessed(sample, tmp_path, small_spans, monkeypatch,
                                                                 ranges):
    """With no margin the first pass keeps too few values for most needed bins: those features' columns (only
    theirs) are read again, and the quantiles stay exact; without per-episode ranges the first chunk's range bins
    them."""
    from lerobot_sql import stats as lsql_stats

    monkeypatch.setattr(column_stats, "_MARGIN_Z", 0.0)
    monkeypatch.setattr(column_stats, "_MARGIN_MIN", 0.0)
    if not ranges:
        monkeypatch.setattr(lsql_stats, "_episode_ranges", lambda con, sel, keys: {})
    passes = _passes(monkeypatch)
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = "SELECT episode_index FROM episodes WHERE episode_index < 15"
    _check(db.stats(sql), _frames(sample), db.manifest(sql).column("index").to_numpy())
    assert passes[0] == sorted(NUMERIC)
    assert len(passes) == 2 and set(passes[1]) <= {"observation.state", "action", "timestamp"}


def test_a_feature_keeping_more_values_than_its_bound_takes_the_second_pass(sample, tmp_path, small_spans,
                                                                            monkeypatch):
    """The values a feature's elements keep together are bounded (a 512-element feature at the per-element bound
    would hold gigabytes, hostile review 22): past it, that feature's quantiles come from the second pass, exact."""
    monkeypatch.setattr(column_stats, "_KEPT_FEATURE_AT_MOST", 50)
    passes = _passes(monkeypatch)
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = "SELECT episode_index FROM episodes"
    _check(db.stats(sql), _frames(sample), db.manifest(sql).column("index").to_numpy())
    assert len(passes) == 2 and {"observation.state", "action"} <= set(passes[1])


def test_integer_features_too_spread_for_exact_counts_are_binned(sample, tmp_path, small_spans, monkeypatch):
    """An integer feature whose exact counts grow past _RUNS_AT_MOST is binned in a pass of its own instead, with
    the same exact quantiles."""
    monkeypatch.setattr(column_stats, "_RUNS_AT_MOST", 8)
    again = []
    real = column_stats._histograms
    monkeypatch.setattr(column_stats, "_histograms", lambda src, layout, files, keys, *a: (
        again.append(list(keys)), real(src, layout, files, keys, *a))[1])
    db = lsql.connect(sample, cache_dir=tmp_path)
    sql = "SELECT episode_index FROM episodes"
    _check(db.stats(sql), _frames(sample), db.manifest(sql).column("index").to_numpy())
    assert again and {"index", "frame_index"} <= set(again[0]) <= {"index", "frame_index", "episode_index",
                                                                   "task_index"}


@pytest.mark.parametrize("dtype", [np.int64, np.int8, np.uint64, np.bool_])
def test_exact_counts_merge_chunks_and_weights(monkeypatch, dtype):
    """_Counts over chunks of overlapping values (merged when many), weighted, equals np.quantile over the values
    repeated by their weights; an int8 column's span (255) does not wrap; a chunk spanning far more values than it
    has rows gives up."""
    monkeypatch.setattr(column_stats, "_RUNS_AT_MOST", 1200)  # (merged once or twice)
    rng = np.random.default_rng(3)
    hi = 2 if dtype is np.bool_ else 120
    lo = 0 if dtype in (np.uint64, np.bool_) else -128 if dtype is np.int8 else -7
    c = column_stats._Counts.of(2)
    xs, ws = [], []
    for i in range(9):
        x = rng.integers(lo, hi, (2, 50 + i)).astype(dtype)
        w = rng.integers(1, 4, x.shape[1]) if i % 2 else None
        c.add(x, w, x.min(1), x.max(1))
        xs.append(x)
        ws.append(np.ones(x.shape[1], np.int64) if w is None else w)
    assert c.parts is not None and (dtype is np.bool_ or all(len(p) < 9 for p in c.parts))  # (merged)
    x = np.concatenate(xs, axis=1).astype(np.float64)
    w = np.concatenate(ws)
    ref = np.quantile(np.repeat(x, w, axis=1), QS, axis=1)
    np.testing.assert_array_equal(c.quantiles(int(w.sum()), QS), ref)
    if dtype is np.int64:
        c.add(np.array([[0, 10 ** 9], [1, 2]], np.int64), None, np.array([0, 1]), np.array([10 ** 9, 2]))
        assert c.parts is None


def test_merged_runs_add_counts_where_they_overlap():
    parts = [(np.array([0, 5]), np.array([3, 2]), np.array([1, 4])), (np.array([2]), np.array([4]), np.array([2]))]
    start, length, count = column_stats._merged(parts)
    held = np.zeros(8, np.int64)
    for s, n, c in zip(start.tolist(), length.tolist(), count.tolist()):
        held[s:s + n] += c
    assert held.tolist() == [1, 1, 3, 2, 2, 6, 4, 0]
    assert (np.diff(start) > 0).all() and (count > 0).all()


def _with_feature(sample, root, name: str, dtype: str, values) -> np.ndarray:
    """A linked copy of ``sample`` at ``root`` with a scalar feature ``name`` of ``dtype`` in info.json, holding
    ``values(index)`` in every data row; the values by index."""
    import json

    root = linked_copy(sample, root)
    p = root / "meta" / "info.json"
    info = json.loads(p.read_text())
    info["features"][name] = {"dtype": dtype, "shape": [1], "names": None}
    p.unlink()
    p.write_text(json.dumps(info))
    out = {}
    for f in sorted((root / "data").rglob("*.parquet")):
        t = pq.read_table(f)
        idx = t["index"].to_numpy()
        vals = np.asarray(values(idx), dtype)
        out.update(zip(idx.tolist(), vals))
        t = t.append_column(name, pa.array(vals, pa.from_numpy_dtype(np.dtype(dtype))))
        f.unlink()
        pq.write_table(t, f, row_group_size=250)  # (row groups of about lerobot's size: read in several spans)
    return np.array([out[i] for i in sorted(out)], dtype)


@pytest.mark.parametrize("dtype, first", [("uint64", 2 ** 63 - 3), ("uint64", 2 ** 64 - 9), ("int64", 2 ** 63 - 7)],
                         ids=["uint64-across-2**63", "uint64-top", "int64-top"])
def test_hostile22_integers_at_the_int64_top_have_numpys_quantiles(sample, tmp_path, small_spans, dtype, first):
    """Exact counts hold their runs in int64: a uint64 feature crossing 2**63 gave negative quantiles silently (its
    runs wrapped), one at the uint64 top a bare OverflowError, an int64 one at its top read in several spans a
    false "compute the statistics again" (a run's end wrapped in the merge); such a feature is binned instead,
    with numpy's quantiles."""
    x = _with_feature(sample, tmp_path / "ds", "counter", dtype, lambda idx: [first + int(i) % 7 for i in idx])
    db = lsql.connect(tmp_path / "ds", cache_dir=tmp_path / "cache")
    st = db.stats("SELECT episode_index FROM episodes")["counter"]
    ref = np.quantile(x.astype(np.float64), QS)
    np.testing.assert_array_equal(np.array([st[q][0] for q in QKEYS]), ref)


def test_hostile22_values_let_go_are_never_taken_as_all_of_their_bin(sample, tmp_path, small_spans, monkeypatch):
    """A bin whose kept values the first pass let go (it had left every needed rank's window) while it got no more
    values stayed "complete": when the ranks came back to it (values drifting along the file: the median's bin
    left, then returned to), its missing values made db.stats fail with a false "the data files changed"; those
    values are read again instead, and the quantiles are numpy's."""
    monkeypatch.setattr(column_stats, "BINS", 64)  # (values let go past BINS / 2 kept: a few thousand frames)
    monkeypatch.setattr(column_stats, "_MARGIN_Z", 0.0)
    monkeypatch.setattr(column_stats, "_MARGIN_MIN", 0.0)

    def drift(idx):  # 250 rows at 0.5 (and the range's ends), then 0.1 and 0.9, then 0.05: the median back at 0.5
        return np.where(idx < 250, np.where(idx == 0, 0.0, np.where(idx == 1, 1.0, 0.5)),
                        np.where(idx < 3500, np.where(idx % 10 < 3, 0.1, 0.9), 0.05))

    x = _with_feature(sample, tmp_path / "ds", "drift", "float32", drift)
    db = lsql.connect(tmp_path / "ds", cache_dir=tmp_path / "cache")
    st = db.stats("SELECT episode_index FROM episodes")["drift"]
    np.testing.assert_array_equal(np.array([st[q][0] for q in QKEYS]), np.quantile(x.astype(np.float64), QS))


def test_hostile22_weighted_values_kept_keep_their_weights_when_let_go(sample, tmp_path, small_spans, monkeypatch):
    """Frames served twice (overlapping windows) are kept with their weights; letting values go paired what was
    left with the first chunk's weights only: a bare IndexError from db.stats (or weights moved onto other
    values); the quantiles are numpy's over the frames repeated as served."""
    monkeypatch.setattr(column_stats, "BINS", 64)  # (values let go past BINS / 2 kept: a few thousand frames)
    root = linked_copy(sample, tmp_path / "ds")
    f = root / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(f)
    f.unlink()
    pq.write_table(t, f, row_group_size=50)
    db = lsql.connect(root, cache_dir=tmp_path / "cache")
    sql = ("SELECT 3 AS episode_index, 0.0 AS start_s, 1.0 AS end_s UNION ALL SELECT 3, 0.5, 1.5 "
           "UNION ALL SELECT 8, 0.2, 2.0 ORDER BY episode_index, start_s")
    _check(db.stats(sql), _frames(root), db.manifest(sql).column("index").to_numpy())
