"""The named-query library: every bundled query against rows computed independently (pyarrow + numpy over the
Parquet files), windows fed to db.dataset(), parameter handling and user folders."""

from __future__ import annotations

import hashlib

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql._query import library
from lerobot_sql.errors import QueryError

TOL = 1e-6
GRIPPER = 5  # index of gripper.pos in the synthetic sets' observation.state / action


def _load(root):
    """Per episode (from the Parquet files only): metadata row, frame timestamps/indices/state/action."""
    eps = pq.read_table(sorted((root / "meta" / "episodes").glob("*/*.parquet"))).to_pylist()
    data = pq.read_table(sorted((root / "data").glob("*/*.parquet")))
    ep = data["episode_index"].to_numpy()
    out = {}
    for e in eps:
        m = ep == e["episode_index"]
        order = np.argsort(data["frame_index"].to_numpy()[m])
        out[e["episode_index"]] = {
            "meta": e,
            "t": data["timestamp"].to_numpy()[m][order].astype(np.float64),
            "index": data["index"].to_numpy()[m][order],
            "state": np.stack(data["observation.state"].to_numpy(zero_copy_only=False)[m][order]),
            "action": np.stack(data["action"].to_numpy(zero_copy_only=False)[m][order]),
        }
    return out


@pytest.fixture(scope="module")
def small(datasets):
    db = lsql.connect(datasets / "small20")
    yield db, _load(datasets / "small20"), 30.0
    db.close()


@pytest.fixture(scope="module")
def g1(real_datasets):
    db = lsql.connect(real_datasets / "g1_real_v30")
    yield db, _load(real_datasets / "g1_real_v30"), 30.0
    db.close()


def _eps(rel):
    return [r[0] for r in rel.fetchall()]


def _frames_of_windows(eps, windows, tol=1e-4):
    """frames.index of every frame inside the half-open windows, computed with numpy."""
    out = []
    for e, s, t in windows:
        d = eps[e]
        out.extend(d["index"][(d["t"] >= s - tol) & (d["t"] < t - tol)].tolist())
    return out


def test_bundled_queries_are_documented():
    qs = {q["name"]: q for q in library.list_queries()}
    need = {"episodes_by_task", "episodes_by_length", "episodes_by_stat", "window_before_event",
            "window_after_event", "idle_segments", "last_seconds", "split"}
    assert need <= set(qs)
    for q in qs.values():
        assert q["description"] and q["returns"], q["name"]
        assert all(p["doc"] and p["type"] in library.TYPES for p in q["params"]), q["name"]
    assert library.BUNDLED.is_dir()


def test_episodes_by_task(small):
    db, eps, _ = small
    for text in ("cube", "DRAWER", "marker back"):
        want = [e for e, d in eps.items() if any(text.lower() in t.lower() for t in d["meta"]["tasks"])]
        assert want and _eps(db.query("episodes_by_task", text=text)) == sorted(want)


def test_episodes_by_length(small):
    db, eps, _ = small
    lengths = np.array([len(d["t"]) for d in eps.values()])
    lo, hi = int(np.percentile(lengths, 25)), int(np.percentile(lengths, 75))
    want = [e for e, d in eps.items() if lo <= len(d["t"]) <= hi]
    assert 0 < len(want) < len(eps)
    assert _eps(db.query("episodes_by_length", min_length=lo, max_length=hi)) == want
    assert _eps(db.query("episodes_by_length", min_length=str(hi + 1))) == [e for e, d in eps.items()
                                                                           if len(d["t"]) > hi]


def test_episodes_by_stat_action_bounds(small):
    db, eps, _ = small
    gmax = {e: float(d["action"][:, GRIPPER].max()) for e, d in eps.items()}
    bound = float(np.median(list(gmax.values())))
    want = [e for e, v in gmax.items() if v <= bound]
    got = _eps(db.query("episodes_by_stat", feature="action", stat="max", max_value=bound, element="gripper.pos"))
    assert 0 < len(want) < len(eps) and got == want
    # every element: the per-episode minimum of each action joint is >= lo
    lo = float(np.median([d["action"].min() for d in eps.values()]))
    want = [e for e, d in eps.items() if d["action"].min(axis=0).min() >= lo]
    assert _eps(db.query("episodes_by_stat", feature="action", stat="min", min_value=lo)) == want
    # raised by DuckDB when rows are fetched (Database.sql returns a lazy relation)
    with pytest.raises((QueryError, duckdb.Error), match="no statistic"):
        db.query("episodes_by_stat", feature="actoin").fetchall()


def _first_event(d, pred):
    hit = np.nonzero(pred(d))[0]
    return None if len(hit) == 0 else hit[0]


@pytest.mark.parametrize("which, seconds", [("window_before_event", 1.0), ("window_after_event", 0.5)])
def test_windows_around_event_feed_dataset(small, which, seconds):
    db, eps, fps = small
    pred_sql = '"observation.state.gripper.pos" < 20'
    want = []
    for e, d in eps.items():
        i = _first_event(d, lambda d: d["state"][:, GRIPPER] < 20)
        if i is None:
            continue
        ev, dur = d["t"][i], len(d["t"]) / fps
        s, t = (max(ev - seconds, 0.0), ev) if which == "window_before_event" else (ev, min(ev + seconds, dur))
        if t > s:
            want.append((e, s, t))
    rows = db.query(which, predicate=pred_sql, seconds=seconds).fetchall()
    assert [r[0] for r in rows] == [w[0] for w in want]
    np.testing.assert_allclose([r[1:3] for r in rows], [w[1:] for w in want], atol=TOL)
    sql = library.render(which, {"predicate": pred_sql, "seconds": seconds}, [])
    ds = db.dataset(sql, cameras=[])
    frames = _frames_of_windows(eps, want)
    assert len(ds) == len(frames)
    assert [int(ds[i]["index"]) for i in range(len(ds))] == frames
    # the window holds round(seconds * fps) frames unless clipped by the episode boundary
    if which == "window_before_event":
        e, s, t = next(w for w in want if w[1] > 0)
        assert len(_frames_of_windows(eps, [(e, s, t)])) == round(seconds * fps)


@pytest.mark.parametrize("which", ["small", "g1"])  # small20: the first tier; g1: real teleoperation
def test_idle_segments(which, request):
    db, eps, fps = request.getfixturevalue(which)
    speeds = {e: np.linalg.norm(np.diff(d["state"].astype(np.float64), axis=0), axis=1) / np.diff(d["t"])
              for e, d in eps.items()}
    # a threshold from the data itself (real teleoperation is never perfectly still)
    max_speed, min_dur = float(np.percentile(np.concatenate(list(speeds.values())), 40)), 0.3
    want = []
    for e, d in eps.items():
        speed = speeds[e]
        idle = np.concatenate([[False], speed <= max_speed])
        i = 0
        while i < len(idle):
            if idle[i]:
                j = i
                while j + 1 < len(idle) and idle[j + 1]:
                    j += 1
                s, t = d["t"][i], d["t"][j] + 1 / fps
                if t - s >= min_dur - 1e-4:
                    want.append((e, s, t, j - i + 1))
                i = j + 1
            else:
                i += 1
    rows = db.query("idle_segments", max_speed=max_speed, min_duration_s=min_dur).fetchall()
    assert len(want) > 0
    assert [(r[0], r[3]) for r in rows] == [(w[0], w[3]) for w in want]
    np.testing.assert_allclose([r[1:3] for r in rows], [w[1:3] for w in want], atol=TOL)
    m = db.manifest(library.render("idle_segments", {"max_speed": max_speed, "min_duration_s": min_dur}, []))
    assert m["index"].to_pylist() == _frames_of_windows(eps, [w[:3] for w in want])


def test_last_seconds(small):
    db, eps, fps = small
    rows = db.query("last_seconds", seconds=2).fetchall()
    assert [r[0] for r in rows] == list(eps)
    m = db.manifest(library.render("last_seconds", {"seconds": 2}, []))
    want = [i for d in eps.values() for i in d["index"][-min(60, len(d["index"])):].tolist()]
    assert m["index"].to_pylist() == want


def test_split_is_md5_of_episode_index(small):
    db, eps, _ = small
    h = {e: int(hashlib.md5(f"7:{e}".encode()).hexdigest()[:8], 16) / 2**32 for e in eps}
    val = _eps(db.query("split", subset="validation", validation_fraction=0.3, seed="7"))
    train = _eps(db.query("split", subset="train", validation_fraction=0.3, seed=7))
    assert val == [e for e in eps if h[e] < 0.3] and train == [e for e in eps if h[e] >= 0.3]
    assert val and train and sorted(val + train) == list(eps)
    with pytest.raises((QueryError, duckdb.Error), match="subset must be train or validation"):
        db.query("split", subset="test").fetchall()


def test_parameter_errors(small):
    db, _, _ = small
    with pytest.raises(QueryError, match=r"needs parameter\(s\) \['text'\].*text \(str, required\)"):
        db.query("episodes_by_task")
    with pytest.raises(QueryError, match=r"has no parameter\(s\) \['txt'\]"):
        db.query("episodes_by_task", text="cube", txt="x")
    with pytest.raises(QueryError, match="must be an integer"):
        db.query("episodes_by_length", min_length="5; DROP TABLE x")
    with pytest.raises(QueryError, match="not NaN"):
        db.query("last_seconds", seconds=float("nan"))
    with pytest.raises(QueryError, match="Did you mean 'last_seconds'"):
        db.query("last_second")
    with pytest.raises(QueryError, match="one SQL expression"):
        db.query("window_after_event", predicate="true) UNION SELECT (1")
    with pytest.raises(QueryError, match="no subqueries"):
        db.query("window_after_event", predicate="index IN (SELECT 1)")
    with pytest.raises(QueryError, match=r"one SQL expression.*column 18: GT is incomplete") as e:
        db.query("window_after_event", predicate="action[1] >")
    assert "\x1b" not in str(e.value)  # sqlglot's terminal colour codes stayed in the message
    # a quote in a string parameter stays inside the literal
    assert db.query("episodes_by_task", text="x' OR true OR '").fetchall() == []


def test_parameter_bounds_and_vectors(small, tmp_path):
    db, _, _ = small
    # a negative window length gave windows ending before they start ((0, 12.6, 11.6) for last_seconds)
    with pytest.raises(QueryError, match=r"'seconds' \(float\) must be > 0, got -1"):
        db.query("last_seconds", seconds=-1)
    with pytest.raises(QueryError, match=r"'seconds' \(float\) must be > 0"):
        db.named_query_sql("window_before_event", predicate="true", seconds=0)
    with pytest.raises(QueryError, match=r"'min_length' \(int\) must be >= 0"):
        db.query("episodes_by_length", min_length=-3)
    assert "seconds (float, default 1.0, > 0)" in library.load("last_seconds").signature()
    # a scalar or unknown column as idle_segments' vector feature: refused by name, not DuckDB's
    # "Binder Error: Parameter type needs to be List"
    for col in ("timestamp", "task_index", "observation.images.front"):
        with pytest.raises(QueryError, match=r"'feature' \(vector\) must be a numeric vector feature of frames.*"
                                             r"Valid: \['action', 'observation.state'\]"):
            db.query("idle_segments", feature=col)
    assert db.query("idle_segments", feature="action").fetchall() == \
        db.sql(db.named_query_sql("idle_segments", feature="action")).fetchall()
    # a bound on a text parameter is a header error naming the file
    (tmp_path / "bad.sql").write_text("-- x\n--\n-- params:\n--   t (str, default a, > 0): text\nSELECT $t\n")
    with pytest.raises(QueryError, match=r"bad.sql: parameter 't' \(str\) has a bound"):
        library.load("bad", [tmp_path])


def test_user_query_folder(small, tmp_path):
    db, eps, _ = small
    (tmp_path / "long_eps.sql").write_text(
        "-- Episodes longer than some seconds.\n--\n-- params:\n--   seconds (float, default 10): minimum duration\n"
        "-- returns: episode_index BIGINT\nSELECT episode_index FROM episodes WHERE duration_s > $seconds\n")
    assert "long_eps" in {q["name"] for q in library.list_queries([tmp_path])}
    db.add_query_dir(tmp_path)
    try:
        want = [e for e, d in eps.items() if len(d["t"]) / 30 > 10]
        assert _eps(db.query("long_eps")) == want
    finally:
        db._query_dirs.remove(tmp_path)


def test_int_parameters_must_fit_bigint(small):
    """min_length=10**23 was accepted and matched nothing (BIGINT `length` against a HUGEINT/DOUBLE literal)."""
    db, eps, _ = small
    for big in (10 ** 23, "99999999999999999999999", -(2 ** 63) - 1):
        with pytest.raises(QueryError, match=r"'min_length' \(int\) must fit in a 64-bit integer "
                                             r"\(-9223372036854775808 \.\. 9223372036854775807\)") as e:
            db.query("episodes_by_length", min_length=big)
        assert e.value.usage  # the caller's mistake: the CLI exits 2
    # the int64 bounds themselves are values
    assert _eps(db.query("episodes_by_length", max_length=2 ** 63 - 1)) == list(eps)
    assert _eps(db.query("episodes_by_length", min_length=2 ** 63 - 1)) == []


@pytest.mark.parametrize("param, value, why", [
    ("min_length", "٣", "ASCII digits"),  # Arabic-Indic three: int() reads it as 3
    ("min_length", "３", "ASCII digits"),  # a fullwidth three
    ("min_length", "1_0", "ASCII digits"),
    ("seconds", "٣", "ASCII"),
    ("seconds", "1_0", "ASCII"),  # float() reads it as 10.0
    ("seconds", "1e400", "outside a 64-bit float"),  # float() reads it as inf
    ("seconds", 10 ** 400, "outside a 64-bit float"),  # float() raises a bare OverflowError
])
def test_number_parameters_take_only_plain_ascii_numbers_that_fit(param, value, why):
    """int and float parameters took what Python's int()/float() take: other scripts' digits, '1_0', and a
    '1e400' that became inf (a bound of 'no limit' nobody wrote). Each is refused naming the parameter, as a usage
    error (CLI exit 2)."""
    name = "episodes_by_length" if param == "min_length" else "last_seconds"
    with pytest.raises(QueryError, match=rf"parameter '{param}' \((int|float)\) .*{why}") as e:
        library.render(name, {param: value})
    assert e.value.usage


def test_number_parameters_in_their_plain_forms_still_work():
    assert "BETWEEN 12 AND" in library.render("episodes_by_length", {"min_length": " 12 "})
    assert "BETWEEN -0 AND" not in library.render("episodes_by_length", {"min_length": "+0"})
    for value, text in (("2.5", "2.5"), ("1e3", "1000.0"), (".5", "0.5"), (" 4. ", "4.0"), (3, "3.0")):
        assert text in library.render("last_seconds", {"seconds": value}), value
    assert "-0.25" in library.render("episodes_by_stat", {"min_value": "-0.25"})
    # inf written as such stays the documented 'no bound' of a float parameter
    assert "'inf'::DOUBLE" in library.render("episodes_by_stat", {"feature": "action", "stat": "max",
                                                                  "max_value": "inf"})
