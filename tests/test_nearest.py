"""Temporal building blocks (frames_ext, element_index, first_event, event_windows, segments) and nearest() across
streams of different rates, on a dataset built here whose front camera runs at 12 fps in a 30 fps dataset."""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
import shutil
from fractions import Fraction

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from helpers import REPO
from lerobot_sql.errors import QueryError

FRONT, WRIST = "observation.images.front", "observation.images.wrist"
CAM_FPS, TB = 12, Fraction(1, 15360)


@pytest.fixture(scope="module")
def small(datasets):
    db = lsql.connect(datasets / "small20")
    data = pq.read_table(datasets / "small20" / "data" / "chunk-000" / "file-000.parquet")
    yield db, data
    db.close()


@pytest.fixture(scope="module")
def slow_cam(datasets, tmp_path_factory):
    """small20 with observation.images.front re-encoded at 12 fps (h264), episodes concatenated in one mp4 as
    lerobot does; meta/episodes and info.json updated. Returns (root, {episode: (n_cam_frames, first_frame)})."""
    src = datasets / "small20"
    root = tmp_path_factory.mktemp("slowcam") / "small20_front12"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("*.mp4"))
    wrist = f"videos/{WRIST}/chunk-000/file-000.mp4"
    (root / wrist).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / wrist, root / wrist)
    ep_file = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    eps = pq.read_table(ep_file)
    plan, first = {}, 0
    for e, n in zip(eps["episode_index"].to_pylist(), eps["length"].to_pylist()):
        n_cam = math.ceil(n * CAM_FPS / 30)
        plan[e] = (n_cam, first)
        first += n_cam
    out = root / f"videos/{FRONT}/chunk-000/file-000.mp4"
    out.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(out), "w") as c:
        st = c.add_stream("libx264", rate=CAM_FPS)
        st.width, st.height, st.pix_fmt, st.time_base = 128, 96, "yuv420p", TB
        img = np.zeros((96, 128, 3), np.uint8)
        for k in range(first):
            fr = av.VideoFrame.from_ndarray(img, format="rgb24")
            fr.pts, fr.time_base = int(k / CAM_FPS / TB), TB
            for p in st.encode(fr):
                c.mux(p)
        for p in st.encode():
            c.mux(p)
    cols = {f"videos/{FRONT}/from_timestamp": [plan[e][1] / CAM_FPS for e in eps["episode_index"].to_pylist()],
            f"videos/{FRONT}/to_timestamp": [sum(plan[e][::-1]) / CAM_FPS for e in eps["episode_index"].to_pylist()]}
    for name, vals in cols.items():
        i = eps.schema.get_field_index(name)
        eps = eps.set_column(i, name, pa.array(vals, eps.schema.field(i).type))
    pq.write_table(eps, ep_file)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"][FRONT]["info"].update({"video.fps": CAM_FPS, "video.codec": "h264"})
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    return root, plan


def _expected_nearest(times, n_cam, k):
    """Ranks 1..k of camera frames j/CAM_FPS (j < n_cam) nearest to each time; ties go to the earlier frame."""
    cam = np.arange(n_cam) / CAM_FPS
    out = []
    for t in times:
        order = sorted(range(n_cam), key=lambda j: (abs(cam[j] - t), cam[j]))
        out.append(order[:k])
    return out


def test_nearest_camera_at_other_rate(slow_cam, small):
    root, plan = slow_cam
    _, data = small
    with lsql.connect(root) as db:
        eps = [0, 7]
        q = "SELECT episode_index, timestamp FROM frames WHERE episode_index IN (0, 7) ORDER BY index"
        res = db.nearest(q, [FRONT, "action"], k=2)
        m = np.isin(data["episode_index"].to_numpy(), eps)
        ep_np, t_np = data["episode_index"].to_numpy()[m], data["timestamp"].to_numpy()[m].astype(np.float64)
        act = np.stack(data["action"].to_numpy(zero_copy_only=False)[m])
        assert res.num_rows == len(t_np) * 2 * 2
        front = res.filter(pa.compute.equal(res["stream"], FRONT)).to_pydict()
        want = [j for e in eps for j in
                np.array(_expected_nearest(t_np[ep_np == e], plan[e][0], 2)).ravel().tolist()]
        # rank 1 never ties (30 and 12 fps grids are never equidistant); rank 2 can tie exactly (the frames either
        # side of an exact hit), where float rounding of pts_s - from_timestamp decides: compare distances there.
        assert front["frame_index"][::2] == want[::2]
        assert front["rank"] == [1, 2] * len(t_np)
        first = np.repeat([plan[e][1] for e in ep_np], 2)
        assert front["frame"] == (first + np.array(front["frame_index"])).tolist()
        np.testing.assert_allclose(front["sample_timestamp"], np.array(front["frame_index"]) / CAM_FPS, atol=1e-6)
        np.testing.assert_allclose(np.abs(front["dt_s"]), np.abs(np.array(want) / CAM_FPS - np.repeat(t_np, 2)),
                                   atol=1e-6)
        # tabular stream: nearest frames at the dataset rate are the frames themselves, values from the Parquet
        a = res.filter(pa.compute.and_(pa.compute.equal(res["stream"], "action"),
                                       pa.compute.equal(res["rank"], 1))).to_pydict()
        np.testing.assert_array_equal(np.array(a["action"], np.float32), act)
        assert a["dt_s"] == [0.0] * len(t_np)
        # the wrist camera still runs at 30 fps: frame i of the episode for state sample i
        w = db.nearest([(7, t) for t in t_np[ep_np == 7]], WRIST)
        assert w["frame_index"].to_pylist() == list(range(int((ep_np == 7).sum())))
        # the SQL form (two ASOF JOINs) agrees with nearest(k=1)
        sql = db.sql(f"SELECT camera_frame_index, frame FROM nearest_camera_frame('{FRONT}') "
                     "WHERE episode_index IN (0, 7) ORDER BY index").fetchall()
        assert [r[0] for r in sql] == want[::2]


def test_nearest_tolerance_and_errors(slow_cam):
    root, plan = slow_cam
    with lsql.connect(root) as db:
        # halfway between two 12 fps frames (1/24 s away from each): kept with tolerance 0.05, dropped at 0.03
        t = 5 / CAM_FPS + 1 / (2 * CAM_FPS) + 1e-4
        assert db.nearest({"episode_index": [3], "timestamp": [t]}, FRONT, tolerance_s=0.05)["frame_index"] \
            .to_pylist() == [6]
        assert db.nearest({"episode_index": [3], "timestamp": [t]}, FRONT, tolerance_s=0.03).num_rows == 0
        with pytest.raises(QueryError, match="unknown stream 'observation.images.frnt'.*Did you mean"):
            db.nearest([(0, 0.0)], "observation.images.frnt")
        with pytest.raises(QueryError, match="k must be an integer >= 1"):
            db.nearest([(0, 0.0)], FRONT, k=0)
        with pytest.raises(QueryError, match=r"episode_index \[99\] not in this dataset"):
            db.nearest([(99, 0.0)], FRONT)
        with pytest.raises(QueryError, match="need columns episode_index and timestamp"):
            db.nearest("SELECT episode_index FROM episodes", FRONT)


def test_frames_ext_named_elements_and_motion(small):
    db, data = small
    got = db.sql('SELECT "observation.state.gripper.pos", "action.shoulder_pan.pos", progress, time_to_end_s, '
                 '"observation.state.velocity", "observation.state.speed", dt_s FROM frames_ext '
                 "WHERE episode_index = 4 ORDER BY frame_index").fetchall()
    m = data["episode_index"].to_numpy() == 4
    st = np.stack(data["observation.state"].to_numpy(zero_copy_only=False)[m]).astype(np.float64)
    act = np.stack(data["action"].to_numpy(zero_copy_only=False)[m])
    t = data["timestamp"].to_numpy()[m].astype(np.float64)
    n = len(t)
    np.testing.assert_array_equal([g[0] for g in got], st[:, 5].astype(np.float32))
    np.testing.assert_array_equal([g[1] for g in got], act[:, 0])
    np.testing.assert_allclose([g[2] for g in got], np.arange(n) / (n - 1))
    np.testing.assert_allclose([g[3] for g in got], n / 30 - t, atol=1e-6)
    vel = np.diff(st, axis=0) / np.diff(t)[:, None]
    assert got[0][4] is None and got[0][5] is None and got[0][6] is None
    np.testing.assert_allclose([g[4] for g in got[1:]], vel, rtol=1e-9)
    np.testing.assert_allclose([g[5] for g in got[1:]], np.linalg.norm(vel, axis=1), rtol=1e-9)
    idx = db.sql("SELECT element_index('observation.state', 'gripper.pos')").fetchall()
    assert idx == [(6,)]
    with pytest.raises(Exception, match="unknown feature/name"):
        db.sql("SELECT element_index('observation.state', 'gripper')").fetchall()


def test_first_event_windows_and_segments(small):
    db, data = small
    ep = data["episode_index"].to_numpy()
    st = np.stack(data["observation.state"].to_numpy(zero_copy_only=False))
    t = data["timestamp"].to_numpy().astype(np.float64)
    fi = data["frame_index"].to_numpy()
    pred = st[:, 0] > 30  # shoulder_pan above 30 degrees
    ev = db.sql('SELECT episode_index, event_s, frame_index FROM first_event("observation.state.shoulder_pan.pos" > 30) '
                "ORDER BY episode_index").fetchall()
    want = [(e, t[(ep == e) & pred][0], fi[(ep == e) & pred][0]) for e in np.unique(ep) if pred[ep == e].any()]
    assert [(r[0], r[2]) for r in ev] == [(w[0], w[2]) for w in want]
    np.testing.assert_allclose([r[1] for r in ev], [w[1] for w in want], atol=1e-6)
    win = db.sql('SELECT episode_index, start_s, end_s FROM event_windows("observation.state.shoulder_pan.pos" > 30, '
                 "0.5, 0.25) ORDER BY episode_index").fetchall()
    lengths = {e: (ep == e).sum() for e in np.unique(ep)}
    exp = [(e, max(s - 0.5, 0), min(s + 0.25, lengths[e] / 30)) for e, s, _ in want]
    assert [w[0] for w in win] == [x[0] for x in exp]
    np.testing.assert_allclose([w[1:] for w in win], [x[1:] for x in exp], atol=1e-6)
    seg = db.sql('SELECT episode_index, start_s, end_s, n_frames FROM segments("observation.state.shoulder_pan.pos" '
                 "> 30, 1.0)").fetchall()
    want_seg = []
    for e in np.unique(ep):
        p, te = pred[ep == e], t[ep == e]
        edges = np.flatnonzero(np.diff(np.concatenate([[0], p.astype(int), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):
            if (b - a) / 30 >= 1.0 - 1e-9:
                want_seg.append((e, te[a], te[b - 1] + 1 / 30, b - a))
    assert want_seg and [(s[0], s[3]) for s in seg] == [(w[0], w[3]) for w in want_seg]
    np.testing.assert_allclose([s[1:3] for s in seg], [w[1:3] for w in want_seg], atol=1e-6)


# ---- docs/sql.md: every example runs on the bundled sample as written and returns rows -----------------------------
def _doc_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced code block of docs/sql.md."""
    text = (REPO / "docs" / "sql.md").read_text()
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def _sql_statements(block: str) -> list[str]:
    """A ```sql block holds statements, each introduced by a `-- what it does` comment line."""
    out, cur = [], []
    for line in block.splitlines():
        if line.startswith("--"):
            if cur:
                out.append("\n".join(cur))
            cur = []
        elif line.strip():
            cur.append(line)
    return out + (["\n".join(cur)] if cur else [])


def _rows(value) -> int | None:
    """The number of rows/items of an example's value (None when it is not a result)."""
    if hasattr(value, "num_rows"):
        return value.num_rows
    if hasattr(value, "df") and hasattr(value, "fetchall"):
        return len(value.fetchall())
    if hasattr(value, "shape") and hasattr(value, "columns"):  # a pandas DataFrame
        return len(value)
    if hasattr(value, "__getitem__") and hasattr(value, "__len__") and not isinstance(value, (str, dict, list)):
        return len(value)  # a torch Dataset
    return None


def test_docs_sql_examples_run_on_the_sample(monkeypatch):
    monkeypatch.chdir(REPO)  # the docs use the path sample/small20
    blocks = _doc_blocks()
    ns: dict = {}
    checked = 0
    for lang, block in blocks:
        if lang == "python":
            tree = ast.parse(block)
            for node in tree.body:  # statement by statement, so each expression's value can be checked
                code = ast.Module([node], type_ignores=[])
                if isinstance(node, ast.Expr):
                    value = eval(compile(ast.Expression(node.value), "docs/sql.md", "eval"), ns)
                else:
                    exec(compile(code, "docs/sql.md", "exec"), ns)
                    value = ns.get(node.targets[0].id) if isinstance(node, ast.Assign) and isinstance(
                        node.targets[0], ast.Name) else None
                n = _rows(value)
                if n is not None:
                    assert n > 0, f"docs/sql.md example returns no rows on the sample: {ast.unparse(node)}"
                    checked += 1
    db = ns["db"]
    for lang, block in blocks:
        if lang == "sql":
            for stmt in _sql_statements(block):
                assert db.sql(stmt).fetchall(), f"docs/sql.md example returns no rows on the sample: {stmt}"
                checked += 1
        elif lang == "" and block.startswith("lerobot-sql "):
            from lerobot_sql.cli import commands as cli

            for line in block.splitlines():
                args = shlex.split(line)[1:]
                assert cli.main(args) == 0, line
                checked += 1
    # inline examples in the prose
    assert db.sql("SELECT \"observation.state\"[element_index('observation.state', 'gripper.pos')] FROM frames").fetchall()
    assert db.sql('SELECT quantile_cont("observation.state.speed", [0.05, 0.5]) FROM frames_ext').fetchall()
    assert checked >= 13, checked  # every Python result and SQL statement of the docs was seen


def test_segments_idle_example_matches_numpy(small):
    """The documented idle example: speed (L2 norm of the joint velocity, degrees/s) below 100 for >= 0.2 s."""
    db, data = small
    ep = data["episode_index"].to_numpy()
    st = np.stack(data["observation.state"].to_numpy(zero_copy_only=False)).astype(np.float64)
    t = data["timestamp"].to_numpy().astype(np.float64)
    want = []
    for e in np.unique(ep):
        s, te = st[ep == e], t[ep == e]
        speed = np.concatenate([[np.nan], np.linalg.norm(np.diff(s, axis=0) / np.diff(te)[:, None], axis=1)])
        idle = speed < 100  # NaN (the first frame) is never idle
        edges = np.flatnonzero(np.diff(np.concatenate([[0], idle.astype(int), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):
            if (b - a) / 30 >= 0.2 - 1e-9:
                want.append((e, b - a))
    got = db.sql('SELECT episode_index, n_frames FROM segments("observation.state.speed" < 100, 0.2)').fetchall()
    assert want and got == want


def test_event_at_t0_gives_no_window_before(small):
    """An event on an episode's first frame has an empty [0, 0) window before it: event_windows drops that row."""
    db, data = small
    ep = data["episode_index"].to_numpy()
    grip = np.stack(data["observation.state"].to_numpy(zero_copy_only=False))[:, 5]
    fi = data["frame_index"].to_numpy()
    at_start = {int(e) for e in np.unique(ep) if grip[(ep == e) & (fi == 0)][0] < 20}
    with_event = {int(e) for e in np.unique(ep) if (grip[ep == e] < 20).any()}
    assert at_start and with_event - at_start  # the sample has both kinds
    before = {r[0] for r in db.sql('SELECT episode_index FROM event_windows("observation.state.gripper.pos" < 20, 2, 0)'
                                   ).fetchall()}
    after = {r[0] for r in db.sql('SELECT episode_index FROM event_windows("observation.state.gripper.pos" < 20, 0, 2)'
                                  ).fetchall()}
    assert before == with_event - at_start and after == with_event


def _docs_asof_recipe() -> str:
    """The docs/sql.md ASOF JOIN statement (frames to camera_frames), as a user copies it."""
    stmts = [s for lang, block in _doc_blocks() if lang == "sql" for s in _sql_statements(block)]
    (stmt,) = [s for s in stmts if "ASOF" in s and "camera_frames" in s]
    return stmt


@pytest.mark.parametrize("name,camera", [("small20", FRONT), ("small20", WRIST), ("multifile60", None)])
def test_docs_asof_recipe_picks_the_frame_db_nearest_picks(datasets, name, camera):
    """The recipe compared float32 frames.timestamp with the double pts_s - from_timestamp with no slack: ~45% of
    rows got the previous camera frame and, on multifile60, 11 episodes' frame 0 had none (an inner ASOF JOIN drops
    the row)."""
    db = lsql.connect(datasets / name)
    camera = camera or db.layout.video_keys[0]
    data = db.sql("SELECT index, frame_index FROM frames ORDER BY index").arrow()
    assert data.num_rows == db.layout.info["total_frames"]
    recipe = _docs_asof_recipe().replace("observation.images.front", camera)
    got = db.sql(f"SELECT * FROM ({recipe}) ORDER BY index").arrow()
    want = db.nearest("SELECT episode_index, timestamp FROM frames ORDER BY index", camera)
    assert got.num_rows == data.num_rows == want.num_rows  # every frame, none dropped
    assert got["index"].to_pylist() == data["index"].to_pylist()
    assert got["camera_frame"].to_pylist() == want["frame_index"].to_pylist()
    # the dataset's camera runs at its fps: camera frame i is frame i of the episode
    assert got["camera_frame"].to_pylist() == data["frame_index"].to_pylist()
    assert max(abs(x) for x in got["lag_s"].to_pylist()) < 1e-4
    # the macro's nearest frame agrees too
    mac = db.sql(f"SELECT index, camera_frame_index FROM nearest_camera_frame('{camera}') ORDER BY index").arrow()
    assert mac["camera_frame_index"].to_pylist() == want["frame_index"].to_pylist()


def test_query_times_that_name_no_episode_or_no_time_are_refused(datasets):
    """A NULL query time (a LEFT JOIN that found nothing in an episode) was answered with the episode's first sample;
    an episode_index 1.5 was read as episode 1, "1" and True as 1. Each is a QueryError naming the row now; the
    rows that are well formed still answer."""
    import pyarrow as pa

    db = lsql.connect(datasets / "small20")
    for at in ([(1.5, 0.0)], [("1", 0.0)], [(True, 0.0)], [(1, None)]):
        with pytest.raises(lsql.QueryError, match=r"query row 0 is"):
            db.nearest(at, streams="action")
    null_time = pa.table({"episode_index": pa.array([0], pa.int64()), "timestamp": pa.array([None], pa.float64())})
    left_join = ("SELECT e.episode_index, f.timestamp FROM episodes e LEFT JOIN frames f ON f.episode_index = "
                 "e.episode_index AND f.\"observation.state\"[1] > 1e9 WHERE e.episode_index < 2")
    for at in (null_time, left_join):
        with pytest.raises(lsql.QueryError, match=r"has no timestamp \(NULL\)"):
            db.nearest(at, streams="action")
    got = db.nearest([(1, 0.0)], streams="action")
    assert got["episode_index"].to_pylist() == [1] and got["frame_index"].to_pylist() == [0]


def test_an_episode_index_past_int64_is_the_query_error_of_any_unknown_episode(datasets):
    """`db.nearest([(2**63, 0.5)], ...)` was a bare OverflowError converting to int64, while `[(-1, 0.5)]` gave the
    QueryError "episode_index [-1] not in this dataset". Now both are that QueryError, in every form of ``at``."""
    import numpy as np

    db = lsql.connect(datasets / "small20")
    with pytest.raises(lsql.QueryError, match=r"episode_index \[-1\] not in this dataset"):
        db.nearest([(-1, 0.5)], streams="action")
    for huge in (2**63, 2**64 + 1, -2**63 - 1, np.uint64(2**64 - 1)):
        with pytest.raises(lsql.QueryError, match=rf"episode_index \[{int(huge)}\] \(query row 1\) not in this "
                                                   r"dataset: episode_index is an int64 column"):
            db.nearest([(1, 0.0), (huge, 0.5)], streams="action")
    for huge in (2**63, -2**63 - 1):
        with pytest.raises(lsql.QueryError, match=r"does not fit int64"):
            db.nearest({"episode_index": [huge], "timestamp": [0.5]}, streams="action")
    got = db.nearest([(3, 0.5)], streams="action")  # in range: answered
    assert got["episode_index"].to_pylist() == [3] and got["frame_index"].to_pylist() == [15]
