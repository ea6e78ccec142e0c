"""Data faults: a damaged copy of small20 gives the correct result or a typed error naming the file, episode or
column and a fix; never a neighbouring frame, never a bare library exception. Matrix: docs/reliability.md."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from damage import (
    DATA,
    EPISODES,
    FRONT,
    INFO,
    TASKS,
    edit_info,
    rewrite_parquet,
    scribble,
    set_column,
    shorten_mp4,
    truncate,
)

import lerobot_sql as lsql
from helpers import assert_items_equal, wall_clock
from lerobot_sql.errors import (
    DatasetFormatError,
    FrameNotFoundError,
    LeRobotSQLError,
    MissingFileError,
    ResultContractError,
    VideoDecodeError,
)

pytestmark = pytest.mark.timeout(90)

EP = "SELECT episode_index FROM episodes WHERE episode_index = {}"


@pytest.fixture(scope="module")
def pristine(datasets):
    return lsql.connect(datasets / "small20")


def _items_equal(db, pristine, sql: str, picks=(0, -1), **kw) -> int:
    ours, ref = db.dataset(sql, **kw), pristine.dataset(sql, **kw)
    assert len(ours) == len(ref)
    for i in picks:
        assert_items_equal(ours[i], ref[i])
    return len(ours)


def _typed(excinfo, *needles: str) -> None:
    """The error is ours, chains the library's, and names what it must."""
    e = excinfo.value
    assert isinstance(e, LeRobotSQLError), type(e)
    for n in needles:
        assert n.lower() in str(e).lower(), (n, str(e))


# ---- Parquet: data and meta --------------------------------------------------------------------------------------
@pytest.mark.parametrize("rel", [DATA, EPISODES, TASKS])
def test_truncated_parquet(damaged, rel):
    root = damaged()
    truncate(root / rel, 0.6)
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(EP.format(3))
    _typed(e, str(root / rel), "re-download")


@pytest.mark.parametrize("at", [0.05, 0.8, 0.95])
def test_corrupt_data_page(damaged, at):
    root = damaged()
    scribble(root / DATA, at, 64, seed=1)
    with pytest.raises(DatasetFormatError) as e:
        ds = lsql.connect(root).dataset("SELECT episode_index FROM episodes", cameras=[])
        for i in range(0, len(ds), 50):
            ds[i]
    _typed(e, str(root / "data"), "corrupt")


# ---- mp4 ---------------------------------------------------------------------------------------------------------
def test_missing_mp4(damaged, pristine):
    root = damaged()
    (root / FRONT).unlink()
    db = lsql.connect(root)
    with pytest.warns(UserWarning, match="missing"):
        ds = db.dataset(EP.format(4))
    with pytest.raises(MissingFileError) as e:
        ds[0]
    _typed(e, str(root / FRONT))
    # the other camera still reads, with the right frames
    _items_equal(db, pristine, EP.format(4), cameras=["observation.images.wrist"])


def test_mp4_cut_mid_file(damaged, pristine):
    root = damaged()
    truncate(root / FRONT, 0.5)
    db = lsql.connect(root)
    _items_equal(db, pristine, EP.format(1))  # before the cut: exact
    ds = db.dataset(EP.format(19))
    with pytest.raises((VideoDecodeError, FrameNotFoundError)) as e:
        ds[len(ds) - 1]
    _typed(e, FRONT)


def test_mp4_header_garbage(damaged):
    root = damaged()
    scribble(root / FRONT, 0.0, 64)
    with pytest.raises(VideoDecodeError) as e:
        lsql.connect(root).dataset(EP.format(2))[0]
    _typed(e, str(root / FRONT), "corrupt")


def test_mp4_payload_garbage_is_never_another_frame(damaged, pristine, framecode):
    """Garbage inside the media payload: the decoder conceals damage in the pixels, but the frame returned is
    always the one asked for (its pts), and frames outside the damaged GOPs are exact."""
    root = damaged()
    scribble(root / FRONT, 0.5, 3000)
    db = lsql.connect(root)
    ds, ref = db.dataset(EP.format(10), return_uint8=True), pristine.dataset(EP.format(10), return_uint8=True)
    exact = 0
    for i in range(len(ds)):
        try:
            a = ds[i]
        except VideoDecodeError as e:
            assert FRONT in str(e)
            continue
        b = ref[i]
        assert a["frame_index"] == b["frame_index"]
        if torch.equal(a["observation.images.front"], b["observation.images.front"]):
            exact += 1
        torch.testing.assert_close(a["observation.state"], b["observation.state"], rtol=0, atol=0)
        assert torch.equal(a["observation.images.wrist"], b["observation.images.wrist"])
    assert exact >= len(ds) - 60  # 3000 bytes touch a few GOPs (2 frames each) at most


def test_mp4_fewer_frames_than_episodes_claim(damaged, pristine):
    root = damaged()
    shorten_mp4(root / FRONT, 3000)  # frames 0..2999 kept: episodes ending later lose their tails
    db = lsql.connect(root)
    _items_equal(db, pristine, EP.format(2))
    ds = db.dataset(EP.format(19))
    with pytest.raises(DatasetFormatError) as e:  # checked against the file's real frames when an item first reads it
        ds[0]
    _typed(e, FRONT, "episode 19", "past the file's last frame", "doctor")
    _items_equal(db, pristine, EP.format(19), cameras=["observation.images.wrist"])  # the intact camera still reads


# ---- info.json ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage, needle", [
    (lambda root: (root / INFO).write_text("{not json"), "not valid JSON"),
    (lambda root: edit_info(root, lambda i: i.pop("fps")), "'fps'"),
    (lambda root: edit_info(root, lambda i: i.__setitem__("fps", "30")), "'fps'"),
    (lambda root: edit_info(root, lambda i: i.pop("features")), "'features'"),
    (lambda root: edit_info(root, lambda i: i.pop("codebase_version")), "codebase_version"),
    (lambda root: edit_info(root, lambda i: i["features"]["action"].pop("dtype")), "'action'"),
], ids=["invalid_json", "no_fps", "fps_string", "no_features", "no_version", "feature_without_dtype"])
def test_info_json_broken(damaged, damage, needle):
    root = damaged()
    damage(root)
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root)
    _typed(e, str(root / INFO), needle)


def test_info_json_wrong_shape(damaged):
    root = damaged()
    edit_info(root, lambda i: i["features"]["action"].__setitem__("shape", [7]))
    ds = lsql.connect(root).dataset(EP.format(0))
    with pytest.raises(DatasetFormatError) as e:  # the row group is decoded when an item first needs it
        ds[0]
    _typed(e, "'action'", "shape [7]", DATA)


def test_info_json_wrong_fps(damaged):
    root = damaged()
    edit_info(root, lambda i: i.__setitem__("fps", 25))
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(EP.format(0), delta_timestamps={"action": [0, 1 / 25]})
    _typed(e, "fps=25", "info.json", "episode 0")


def test_info_json_optional_keys_missing(damaged, pristine):
    root = damaged()
    edit_info(root, lambda i: [i.pop(k) for k in ("data_path", "total_frames", "splits", "robot_type")])
    _items_equal(lsql.connect(root), pristine, EP.format(5))


# ---- episode pointers and ranges ---------------------------------------------------------------------------------
def _shift_clip(root, ep: int, dt: float, cols=("from_timestamp", "to_timestamp"), key="observation.images.front"):
    def f(t):
        for c in cols:
            name = f"videos/{key}/{c}"
            v = t[name].to_pylist()
            v[ep] += dt
            t = set_column(t, name, v)
        return t

    rewrite_parquet(root / EPISODES, f)


@pytest.mark.parametrize("ep, dt, needle", [(5, 1 / 30, "overlaps"), (0, -1 / 30, "before 0"),
                                            (7, 1 / 30, "overlaps"), (8, -1 / 30, "overlaps")],
                         ids=["mid_plus1", "first_minus1", "plus1_next", "minus1_prev"])
def test_clip_shifted_by_one_frame(damaged, ep, dt, needle):
    root = damaged()
    _shift_clip(root, ep, dt)
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(EP.format(ep))
    _typed(e, "observation.images.front", needle, "from_timestamp")


def test_clip_length_contradicts_data(damaged):
    root = damaged()
    _shift_clip(root, 5, 3 / 30, cols=("to_timestamp",))
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(EP.format(5))
    _typed(e, "episode 5", "frames")


def test_clip_start_alone_shifted_by_one_frame(damaged, pristine):
    """from_timestamp alone +1 frame: its metadata looks like a to_timestamp = (length-1)/fps writer's, but the
    episode's frames would run into episode 6's clip in the mp4. Which of the two overlapping clips is wrong cannot be
    told, so episode 6 raises too; episodes whose clips overlap nothing stay exact."""
    root = damaged()
    _shift_clip(root, 5, 1 / 30, cols=("from_timestamp",))
    db = lsql.connect(root)
    for sql in (EP.format(5), "SELECT episode_index FROM episodes", "SELECT index FROM frames WHERE episode_index = 5 "
                "AND frame_index = 0"):
        ds = db.dataset(sql)
        with pytest.raises(DatasetFormatError) as e:  # from any item reading the front mp4
            ds[len(ds) - 1]
        _typed(e, str(root / FRONT), "observation.images.front", "episode 5", "into the clip of episode 6",
               "from_timestamp", "doctor")
    _items_equal(db, pristine, EP.format(5), cameras=["observation.images.wrist"])  # the other camera is intact
    with pytest.raises(DatasetFormatError) as e:
        db.dataset(EP.format(6))[0]
    _typed(e, FRONT, "episode 6", "frames of episode 5", "doctor")
    _items_equal(db, pristine, "SELECT episode_index FROM episodes WHERE episode_index IN (4, 7)", picks=(0, -1))


def test_clip_start_alone_shifted_back_one_frame(damaged):
    """from_timestamp alone -1 frame, in a dataset whose to_timestamp = from + (length-1)/fps (so the metadata shows
    no overlap): the episode's first frame would be episode 4's last."""
    root = damaged()
    _open50_style(root)
    _shift_clip(root, 5, -1 / 30, cols=("from_timestamp",))
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(EP.format(5))[0]
    _typed(e, FRONT, "episode 5", "frames of episode 4", "doctor")


def test_last_clip_of_file_shifted_by_one_frame(damaged):
    root = damaged()
    _shift_clip(root, 19, 1 / 30)
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(EP.format(19))[0]
    _typed(e, str(root / FRONT), "observation.images.front", "episode 19", "past the file's last frame", "doctor")


def _shift_run(root, eps, frames: int, key="observation.images.front"):
    """Shift the clips (from and to) of ``eps`` by ``frames`` whole frames, as an off-by-one merge does."""
    for ep in eps:
        _shift_clip(root, ep, frames / 30, key=key)


@pytest.mark.parametrize("eps, pick", [(range(2, 7), 3), (range(20), 5)], ids=["run_in_file", "whole_file"])
def test_run_of_clips_shifted_by_one_frame_is_refused(damaged, pristine, eps, pick):
    """Consecutive clips all one frame late: every lookup of an episode inside the run lands on a real pts (its next
    frame), and the episode's neighbours do not overlap it; only the run's end runs into the next clip (or past the
    file). The whole chain of the mp4 tells, so an episode anywhere in the run is refused, naming the run and the
    offset; episodes outside it stay exact."""
    root = damaged()
    _shift_run(root, eps, 1)
    db = lsql.connect(root)
    ds = db.dataset(EP.format(pick))
    with pytest.raises(DatasetFormatError) as e:
        ds[0]
    first, last = min(eps), max(eps)
    _typed(e, str(root / FRONT), "observation.images.front", f"episodes {first}-{last}", "1 frame late",
           "from_timestamp", "doctor")
    _items_equal(db, pristine, EP.format(pick), cameras=["observation.images.wrist"])  # the other camera is intact
    if first > 1:  # before the run: exact
        _items_equal(db, pristine, EP.format(first - 2))


def test_an_export_refuses_clips_shifted_by_one_frame_as_the_dataset_does(damaged, tmp_path):
    """The export never checked the clips against the frames (only the dataset's worker did): a chain of clips one
    frame late (meta/episodes' from_timestamp, or an mp4 whose edit list moved by a frame) was exported silently,
    every frame one picture late. It is refused now with the dataset's message, whole episodes and windows alike,
    and nothing is left at the destination."""
    root = damaged()
    _shift_run(root, range(20), 1)
    db = lsql.connect(root)
    sql = "SELECT episode_index, 1.0 AS start_s, 2.0 AS end_s FROM episodes WHERE episode_index = 5"
    with pytest.raises(DatasetFormatError) as e:
        db.export(sql, tmp_path / "out", progress=False)
    _typed(e, str(root / FRONT), "observation.images.front", "episodes 0-19", "1 frame late", "from_timestamp")
    assert not (tmp_path / "out").exists()


def _tabular_equal(ours, ref) -> None:
    assert len(ours) == len(ref)
    for i in (0, len(ref) // 2, len(ref) - 1):
        assert_items_equal(ours[i], ref[i])


@pytest.mark.parametrize("sql", [EP.format(3), None, "SELECT index FROM frames WHERE episode_index = 3",
                                 "SELECT 3 AS episode_index, 1.0 AS start_s, 2.0 AS end_s"],
                         ids=["episode", "episodes_arg", "index", "window"])
def test_tabular_reads_need_no_video_metadata(damaged, pristine, sql):
    """cameras=[] reads the data files only: meta/episodes without any videos/* column (a converter that wrote no
    video pointers) and no mp4 at all give the same tabular items as the intact dataset."""
    root = damaged()
    rewrite_parquet(root / EPISODES, lambda t: t.drop_columns([c for c in t.column_names if c.startswith("videos/")]))
    for p in (root / "videos").rglob("*.mp4"):
        p.unlink()
    db = lsql.connect(root)
    kw = {"cameras": []} if sql else {"cameras": [], "episodes": [3]}
    ours = db.dataset(sql, **kw)
    ref = pristine.dataset(sql, **kw)
    _tabular_equal(ours, ref)
    assert not any(k.startswith("observation.images") for k in ours[0])
    with pytest.raises(DatasetFormatError) as e:  # a camera still needs its pointer
        db.dataset(sql, **{**kw, "cameras": ["observation.images.front"]})
    _typed(e, "observation.images.front", "video pointer")


def test_wall_clock_timestamps_read_with_tolerance_s(damaged, pristine):
    """timestamps written as wall-clock time, up to 1.9 s off frame_index / fps: refused at the default tolerance,
    naming the worst episodes; tolerance_s=2.0 (as lerobot's) reads them, each item carrying its own timestamp."""
    root = damaged()
    drift = {4: 1.9, 9: 0.7, 12: 0.02}

    def f(t):
        ep = t["episode_index"].to_numpy()
        fi = t["frame_index"].to_numpy()
        ts = t["timestamp"].to_numpy().astype(np.float64).copy()
        for e, d in drift.items():
            m = ep == e
            ts[m] += d * fi[m] / fi[m].max()  # a clock running fast: 0 at the start, d at the end
        return set_column(t, "timestamp", ts.astype(np.float32))

    rewrite_parquet(root / DATA, f)
    db = lsql.connect(root)
    sql = "SELECT episode_index FROM episodes WHERE episode_index IN (3, 4, 9, 12)"
    for q in (sql, "SELECT index FROM frames WHERE episode_index IN (3, 4, 9, 12)"):
        with pytest.raises(DatasetFormatError) as e:
            db.dataset(q, cameras=[])
        _typed(e, "episode 4", "episode 9", "episode 12", "1.9", "tolerance_s")
        assert str(e.value).index("episode 4") < str(e.value).index("episode 9")  # worst first
    with pytest.raises(DatasetFormatError) as e:  # 2.0 covers 1.9 s, 1.0 does not
        db.dataset(sql, cameras=[], tolerance_s=1.0)
    _typed(e, "episode 4")
    ours = db.dataset(sql, cameras=[], tolerance_s=2.0)
    ref = pristine.dataset(sql, cameras=[])
    assert len(ours) == len(ref)
    want = pq.read_table(root / DATA, columns=["index", "timestamp"]).to_pydict()
    ts_of = dict(zip(want["index"], want["timestamp"]))
    for i in (0, 500, len(ref) - 1):
        a, b = ours[i], ref[i]
        assert a["index"] == b["index"]
        assert float(a["timestamp"]) == np.float32(ts_of[int(a["index"])])
        assert_items_equal({k: v for k, v in a.items() if k != "timestamp"},
                           {k: v for k, v in b.items() if k != "timestamp"})
    assert float(max(abs(float(ours[i]["timestamp"]) - float(ref[i]["timestamp"])) for i in range(len(ref)))) > 1.8


CAMS = ("observation.images.front", "observation.images.wrist")


@pytest.mark.parametrize("name, factor", [("v21_small20", 0.9), ("small20", 1.1)], ids=["v21_lagging", "v30_ahead"])
def test_wall_clock_timestamps_over_grid_clips_read_by_frame_index(damaged, framecode, name, factor):
    """Wall-clock timestamps (drift up to 1.3 s) over videos whose clips hold exactly `length` frames at k / fps.
    (a) dataset() refuses and recommends align="frame_index", not a tolerance_s (which picks the frame nearest the
    wall-clock time: 129 of 132 items off by up to 39 frames on the lagging copy); (b) with align="frame_index"
    every item's camera frames are its own frame_index-th frame of its episode's clip (framecode), in ds[i],
    batches and delta_timestamps stacks; (c) with tolerance_s=2.0 no item gets another frame: dataset() or the item
    raises DatasetFormatError naming the episode and camera and recommending align="frame_index"."""
    root = damaged(name)
    wall_clock(root, factor)
    db = lsql.connect(root)
    eps = (3, 4, 5)
    sql = f"SELECT episode_index FROM episodes WHERE episode_index IN {eps}"
    for q in (sql, f"SELECT index FROM frames WHERE episode_index IN {eps}"):
        with pytest.raises(DatasetFormatError) as e:
            db.dataset(q)
        _typed(e, "episode 3", 'align="frame_index"', "wall-clock")
        assert "tolerance_s=1." not in str(e.value)  # no tolerance recommended for the cameras' frames
    ds = db.dataset(sql, align="frame_index", return_uint8=True)
    assert ds.align == "frame_index"
    lengths = dict(db.sql(f"SELECT episode_index, length FROM episodes WHERE episode_index IN {eps}").fetchall())
    picks = sorted({*range(0, len(ds), 9), *np.cumsum([0] + [lengths[e] for e in eps])[1:] - 1,
                    *np.cumsum([0] + [lengths[e] for e in eps])[:-1]})
    for i in picks:
        item = ds[i]
        ep, fi = int(item["episode_index"]), int(item["frame_index"])
        for k in CAMS:
            assert framecode.verify_frame(item[k], ep, fi, k)["ok"], (i, ep, fi, k)
    batch = ds.__getitems__(picks[:16])
    for j, i in enumerate(picks[:16]):
        assert torch.equal(batch[j][CAMS[0]], ds[i][CAMS[0]])
    delta = db.dataset(sql, align="frame_index", return_uint8=True, delta_timestamps={CAMS[1]: [-2 / 30, 0.0]})
    for i in (0, 1, lengths[3] - 1, lengths[3], len(delta) - 1):
        for item in (delta[i], delta.__getitems__([i])[0]):
            ep, fi = int(item["episode_index"]), int(item["frame_index"])
            for t, want in enumerate((max(fi - 2, 0), fi)):
                assert framecode.verify_frame(item[CAMS[1]][t], ep, want, CAMS[1])["ok"], (i, t)
    # (c) whatever the tolerance, never another frame
    try:
        loose = db.dataset(sql, tolerance_s=2.0, return_uint8=True)
    except DatasetFormatError as err:
        msg = str(err)
    else:
        with pytest.raises(DatasetFormatError) as e:
            for i in picks:
                item = loose[i]
                ep, fi = int(item["episode_index"]), int(item["frame_index"])
                assert framecode.verify_frame(item[CAMS[0]], ep, fi, CAMS[0])["ok"], (i, ep, fi)
        msg = str(e.value)
    for needle in ("episode", "camera", 'align="frame_index"'):
        assert needle in msg, (needle, msg)


def test_export_by_frame_index_writes_a_copy_on_the_grid(damaged, framecode, tmp_path):
    """Wall-clock timestamps (a clock at 0.9x) over grid clips: export() refuses them as dataset() does, naming
    align="frame_index"; export(..., align="frame_index") copies each row's own frame and writes timestamp =
    frame_index / fps, so the copy reads with the default options, every item its own frame (framecode)."""
    root = damaged()
    wall_clock(root, 0.9)
    db = lsql.connect(root)
    sql = "SELECT episode_index FROM episodes WHERE episode_index IN (3, 4)"
    with pytest.raises(DatasetFormatError) as e:
        db.export(sql, tmp_path / "refused", progress=False)
    _typed(e, "episode 3", 'export(..., align="frame_index")')
    db.export(sql, tmp_path / "copy", progress=False, align="frame_index")
    out = lsql.connect(tmp_path / "copy")
    ds = out.dataset(return_uint8=True)
    src = {0: 3, 1: 4}
    ts = pq.read_table(tmp_path / "copy" / DATA, columns=["frame_index", "timestamp"])
    assert np.array_equal(ts["timestamp"].to_numpy(), (ts["frame_index"].to_numpy() / 30).astype(np.float32))
    for i in (0, 1, 200, len(ds) - 2, len(ds) - 1):
        item = ds[i]
        ep, fi = src[int(item["episode_index"])], int(item["frame_index"])
        for k in CAMS:
            assert framecode.verify_frame(item[k], ep, fi, k)["ok"], (i, k)
    with pytest.raises(ValueError, match="align"):
        db.export(sql, tmp_path / "bad", progress=False, align="frames")
    # the command line: lerobot-sql export --align frame_index
    from helpers import run_cli

    r = run_cli("export", root, tmp_path / "cli", "--sql", "SELECT 4 AS episode_index", "--align", "frame_index", "-q")
    assert r.returncode == 0, r.stderr
    item = lsql.connect(tmp_path / "cli").dataset(return_uint8=True)[100]
    assert framecode.verify_frame(item[CAMS[0]], 4, 100, CAMS[0])["ok"]


def test_clip_longer_than_its_episode_is_read_with_a_warning(damaged, pristine):
    """A clip holding more frames than its episode's rows (a discarded take's frames kept in the mp4): the last
    episode loses its last 20 rows from data/ and meta/episodes, its clip keeps its to_timestamp. lerobot reads the
    first `length` frames from from_timestamp; so do we, with a warning naming the episode, camera and both counts."""
    root = damaged()
    cut = 20
    t = pq.read_table(root / DATA)
    ep = t["episode_index"].to_numpy()
    n19 = int((ep == 19).sum())
    rewrite_parquet(root / DATA, lambda t: t.slice(0, t.num_rows - cut))

    def meta(t):
        i = t["episode_index"].to_pylist().index(19)
        t = set_column(t, "length", [v - cut if j == i else v for j, v in enumerate(t["length"].to_pylist())])
        return set_column(t, "dataset_to_index", [v - cut if j == i else v
                                                  for j, v in enumerate(t["dataset_to_index"].to_pylist())])

    rewrite_parquet(root / EPISODES, meta)
    edit_info(root, lambda i: i.update(total_frames=i["total_frames"] - cut))
    db = lsql.connect(root)
    for sql in (EP.format(19), "SELECT index FROM frames WHERE episode_index = 19"):
        with pytest.warns(UserWarning, match=rf"episode 19.*lasts {n19}.00 frames.*{n19 - cut} frames in data/"):
            ours = db.dataset(sql)
        ref = pristine.dataset(EP.format(19))
        assert len(ours) == n19 - cut
        for i in (0, len(ours) // 2, len(ours) - 1):
            assert_items_equal(ours[i], ref[i])


@pytest.fixture(scope="module")
def pristine60(datasets):
    return lsql.connect(datasets / "multifile60")


@pytest.mark.parametrize("ep, rows", [(54, 58), (56, 75)], ids=["inside_file", "last_of_file"])
def test_stale_data_pointer_reads_the_rows_where_they_are(damaged, pristine60, ep, rows):
    """meta/episodes points an episode to a data file that does not exist; its rows are in file-000. The episode
    reads from where its rows are (found by episode_index), and the warning says so instead of claiming the frames
    are missing; an episode whose file really is gone is warned about as missing."""
    root = damaged("multifile60")
    rewrite_parquet(root / EPISODES, lambda t: set_column(
        t, "data/file_index", [7 if e == ep else v for e, v in zip(t["episode_index"].to_pylist(),
                                                                    t["data/file_index"].to_pylist())]))
    with pytest.warns(UserWarning) as rec:
        db = lsql.connect(root)
        ours = db.dataset(episodes=[ep])
    msg = " ".join(str(w.message) for w in rec)
    assert "file-007.parquet" in msg and f"episode {ep}" in msg and f"{rows} rows" in msg
    assert "data/chunk-000/file-000.parquet" in msg and "lack their episodes" not in msg
    ref = pristine60.dataset(episodes=[ep])
    assert len(ours) == len(ref) == rows
    for i in (0, rows // 2, rows - 1):
        assert_items_equal(ours[i], ref[i])
    sql_ds = db.dataset(f"SELECT episode_index FROM episodes WHERE episode_index = {ep}")
    assert len(sql_ds) == rows
    assert_items_equal(sql_ds[rows - 1], ref[rows - 1])
    # the file really gone: its episodes are named as missing
    root2 = damaged("multifile60")
    (root2 / "data/chunk-000/file-001.parquet").unlink()
    with pytest.warns(UserWarning, match=r"no rows in any data file.*episodes? 57"):
        _ = lsql.connect(root2).con


def test_stream_rate_other_than_info_fps_is_read_by_time(damaged, pristine):
    """info.json says 60 fps (data timestamps frame_index / 60) over 30 fps mp4s: frames are looked up by time
    against the real pts, never by frame counts at the nominal rate. Item 2k gets the video frame at 2k/60 s (the
    intact dataset's item k), and an odd item, whose time falls between two frames, raises FrameNotFoundError
    naming the file's real rate."""
    root = damaged()
    edit_info(root, lambda i: i.update(fps=60))
    rewrite_parquet(root / DATA, lambda t: set_column(t, "timestamp",
                                                      (t["frame_index"].to_numpy() / 60).astype(np.float32)))
    with pytest.warns(UserWarning, match="lasts"):  # each clip holds twice its episode's frames at 60 fps
        ds = lsql.connect(root).dataset(EP.format(3))
    ref = pristine.dataset(EP.format(3))
    key = "observation.images.front"
    for k in (0, 1, 50):
        assert torch.equal(ds[2 * k][key], ref[k][key])
    with pytest.raises(FrameNotFoundError) as e:
        ds[1]
    _typed(e, FRONT, "episode 3", "30.00 fps", "video_stream_rate")
    # by frame index, a position names a frame only on the fps grid: frame 2 is at 2/30 s, not 2/60 s
    with pytest.warns(UserWarning, match="lasts"):
        by_index = lsql.connect(root).dataset(EP.format(3), align="frame_index")
    assert torch.equal(by_index[0][key], ref[0][key])
    with pytest.raises(DatasetFormatError) as e:
        by_index[2]
    _typed(e, FRONT, "episode 3", "frame_index 2", "not on the fps grid", 'align="timestamp"')


def _open50_style(root) -> None:
    """Rewrite every clip's to_timestamp as from_timestamp + (length - 1) / fps, as some third-party writers do."""
    def f(t):
        n = np.asarray(t["length"].to_numpy(), np.float64)
        for k in ("front", "wrist"):
            frm = t[f"videos/observation.images.{k}/from_timestamp"].to_numpy()
            t = set_column(t, f"videos/observation.images.{k}/to_timestamp", frm + (n - 1) / 30)
        return t

    rewrite_parquet(root / EPISODES, f)


def test_to_timestamp_one_frame_short_is_accepted(damaged, pristine):
    """Writers that store to_timestamp = from_timestamp + (length - 1) / fps (open_50): items are exact."""
    root = damaged()
    _open50_style(root)
    got = pq.read_table(root / EPISODES)
    d = (got["videos/observation.images.front/to_timestamp"].to_numpy()
         - got["videos/observation.images.front/from_timestamp"].to_numpy())
    np.testing.assert_allclose(d * 30, got["length"].to_numpy() - 1, atol=1e-9)  # the rewrite took effect
    db = lsql.connect(root)
    _items_equal(db, pristine, "SELECT episode_index FROM episodes", picks=(0, 1000, 2500, -1))
    _items_equal(db, pristine, EP.format(19), picks=(0, -1), return_uint8=True,
                 delta_timestamps={"observation.images.front": [-1 / 30, 0, 1 / 30]})


def test_duplicate_episode_rows(damaged):
    root = damaged()
    rewrite_parquet(root / EPISODES, lambda t: pa.concat_tables([t, t.slice(3, 1)]))
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(EP.format(3))
    _typed(e, "episode 3", "2 rows")


def test_episode_ranges_contradict_data(damaged, pristine):
    """meta/episodes' dataset_from_index and length are wrong: frames, neighbours and padding follow the data files."""
    root = damaged()

    def f(t):
        t = set_column(t, "dataset_from_index", [v + (10 if i == 4 else 0) for i, v in
                                                 enumerate(t["dataset_from_index"].to_pylist())])
        return set_column(t, "length", [v + (10 if i == 4 else 0) for i, v in enumerate(t["length"].to_pylist())])

    rewrite_parquet(root / EPISODES, f)
    with pytest.warns(UserWarning, match="episode 4: 246 rows in data/ where meta/episodes says 256 frames"):
        _items_equal(lsql.connect(root), pristine, EP.format(4), picks=(0, 1, -2, -1),
                     delta_timestamps={"action": [-2 / 30, 0, 2 / 30], "observation.images.front": [-1 / 30, 0]})


def test_data_rows_of_an_episode_not_contiguous(damaged):
    root = damaged()

    def f(t):
        idx = t["index"].to_numpy().copy()
        ep = t["episode_index"].to_numpy()
        idx[np.flatnonzero(ep == 6)[10]] += 100_000
        return set_column(t, "index", idx)

    rewrite_parquet(root / DATA, f, row_group_size=400)
    with pytest.raises(DatasetFormatError) as e:
        lsql.connect(root).dataset(EP.format(6))
    _typed(e, "episode 6", "contiguous", "doctor")


# ---- frame values ------------------------------------------------------------------------------------------------
def test_timestamps_off_the_fps_grid(damaged, pristine):
    root = damaged()

    def f(t):
        ts = t["timestamp"].to_numpy().copy()
        ts[t["episode_index"].to_numpy() == 6] += np.float32(0.4 / 30)
        return set_column(t, "timestamp", ts)

    rewrite_parquet(root / DATA, f)
    db = lsql.connect(root)
    with pytest.raises(FrameNotFoundError) as e:
        db.dataset(EP.format(6))[3]
    _typed(e, "episode 6", "tolerance_s", "doctor")
    _items_equal(db, pristine, EP.format(7))  # the other episodes are untouched


@pytest.mark.parametrize("end", ["first", "last"])
def test_a_row_outside_its_episode_clip_is_refused(damaged, pristine, framecode, end):
    """Episode 5's first row rewritten as frame_index -1, timestamp -1/fps (or its last as frame_index == length,
    timestamp length/fps): on the fps grid and the row count unchanged, so only the clip tells. Its time lies outside
    the episode's clip, where the frame is episode 4's last (episode 6's first): refused when the dataset is made, for
    every result shape and whatever tolerance_s, naming the episode, camera, time and fix. Episode 4 stays exact."""
    root = damaged()
    fps, ep = 30, 5

    def f(t):
        rows = np.flatnonzero(t["episode_index"].to_numpy() == ep)
        r = rows[0] if end == "first" else rows[-1]
        fi = t["frame_index"].to_numpy().copy()
        fi[r] = -1 if end == "first" else len(rows)
        ts = t["timestamp"].to_numpy().copy()
        ts[r] = np.float32(fi[r] / fps)
        return set_column(set_column(t, "frame_index", fi), "timestamp", ts)

    rewrite_parquet(root / DATA, f)
    db = lsql.connect(root)
    n = db.sql(f"SELECT count(*) FROM frames WHERE episode_index = {ep}").fetchall()[0][0]
    bad_fi = -1 if end == "first" else n
    t = f"{bad_fi / fps:.6f}"
    window = f"SELECT {ep} AS episode_index, 0.0 AS start_s, 2.0 AS end_s"
    for make in (lambda **kw: db.dataset(episodes=[ep], **kw),
                 lambda **kw: db.dataset(EP.format(ep), **kw),
                 lambda **kw: db.dataset(f"SELECT index FROM frames WHERE episode_index = {ep}", **kw),
                 lambda **kw: db.dataset(window, **kw)):
        for kw in ({}, {"tolerance_s": 1.0}, {"cameras": ["observation.images.wrist"]}):
            with pytest.raises(DatasetFormatError) as e:
                make(**kw)
            cam = kw.get("cameras", ["observation.images.front"])[0]
            _typed(e, f"episode {ep}", repr(cam), f"timestamp {t}", f"frame_index {bad_fi}", "outside",
                   "frame_index_contiguous")
    with pytest.raises(DatasetFormatError) as e:  # by frame index, the row's frame_index must be its position
        db.dataset(episodes=[ep], align="frame_index")
    _typed(e, f"episode {ep}", f"frame_index {bad_fi}", "position", "frame_index_contiguous")
    # tabular items locate no frame: they carry the row as it is
    assert int(db.dataset(episodes=[ep], cameras=[])[0 if end == "first" else -1]["frame_index"]) == bad_fi
    _items_equal(db, pristine, EP.format(4), picks=(0, -1))
    frames = db.dataset(EP.format(4), return_uint8=True)
    assert framecode.verify_frame(frames[len(frames) - 1]["observation.images.front"], 4, len(frames) - 1,
                                  "observation.images.front")["ok"]


def test_nan_and_inf_pass_through_exactly(damaged):
    root = damaged()
    nan_at, inf_at = 10, 11

    def f(t):
        st = np.stack(t["observation.state"].to_numpy(zero_copy_only=False)).astype(np.float32)
        st[nan_at, 2], st[inf_at, 0] = np.nan, -np.inf
        return set_column(t, "observation.state", list(st))

    rewrite_parquet(root / DATA, f)
    want = np.stack(pq.read_table(root / DATA)["observation.state"].to_numpy(zero_copy_only=False))
    ds = lsql.connect(root).dataset(EP.format(0), delta_timestamps={"observation.state": [-1 / 30, 0]})
    for i in (nan_at, inf_at, inf_at + 1):
        got = ds[i]["observation.state"].numpy()
        np.testing.assert_array_equal(got, want[[i - 1, i]])  # assert_array_equal treats NaN == NaN


# ---- empty things ------------------------------------------------------------------------------------------------
def test_empty_dataset(damaged):
    root = damaged()
    rewrite_parquet(root / EPISODES, lambda t: t.slice(0, 0))
    rewrite_parquet(root / DATA, lambda t: t.slice(0, 0))
    db = lsql.connect(root)
    assert db.sql("SELECT count(*) FROM frames").fetchall() == [(0,)]
    assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(0,)]
    with pytest.raises(ResultContractError, match="no rows"):
        db.dataset("SELECT episode_index FROM episodes")


def test_zero_length_episode(damaged, pristine):
    root = damaged()

    def f(t):
        r = t.slice(19, 1).to_pylist()[0]
        r.update(episode_index=20, length=0, dataset_from_index=r["dataset_to_index"])
        for k in ("front", "wrist"):
            r[f"videos/observation.images.{k}/from_timestamp"] = r[f"videos/observation.images.{k}/to_timestamp"]
        return pa.concat_tables([t, pa.Table.from_pylist([r], schema=t.schema)])

    rewrite_parquet(root / EPISODES, f)
    db = lsql.connect(root)
    assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(21,)]
    n = _items_equal(db, pristine, "SELECT episode_index FROM episodes WHERE episode_index >= 18")
    assert n == pq.read_table(root / DATA, filters=[("episode_index", ">=", 18)]).num_rows
    with pytest.raises(ResultContractError, match="matched no frames"):
        db.dataset("SELECT episode_index FROM episodes WHERE length = 0")


@pytest.mark.parametrize("name", ["small20", "multifile60"])
def test_episode_without_rows_in_its_data_file_is_named(damaged, datasets, tmp_path, name):
    """An episode whose rows are gone from its data file (meta/episodes still says its length) was silently left out
    of dataset() and export: now a warning names the episode, both counts and the file; the rest is served as is."""
    import warnings

    root = damaged(name)
    eps = pq.read_table(root / EPISODES).to_pylist()
    victim = eps[len(eps) // 3]  # in the middle of its file: its neighbours' rows stay where meta/episodes says
    e, length = victim["episode_index"], victim["length"]
    data = root / f"data/chunk-{victim['data/chunk_index']:03d}/file-{victim['data/file_index']:03d}.parquet"
    import pyarrow.compute as pc

    rewrite_parquet(data, lambda t: t.filter(pc.not_equal(t["episode_index"], e)))
    total = sum(r["length"] for r in eps)
    rel = str(data.relative_to(root))
    warned = rf"episode {e}: 0 rows in data/ where meta/episodes says {length} frames \({rel} holds no rows of it\)"
    db, ref = lsql.connect(root), lsql.connect(datasets / name)
    for kw, n in (({}, total - length), ({"episodes": [e, e + 1]}, eps[e + 1]["length"]),
                  ({"sql": "SELECT episode_index FROM episodes"}, total - length),
                  ({"sql": f"SELECT {e} AS episode_index, 0.0 AS start_s, 1.0 AS end_s UNION ALL "
                           f"SELECT {e + 1}, 0.0, 1.0"}, round(db.fps))):
        with pytest.warns(UserWarning, match=warned):
            ds = db.dataset(**kw)
        assert len(ds) == n
        # what is served is the right frames: the next episode's first frame equals the pristine copy's
        served = ds.manifest["episode_index"].to_pylist()
        assert e not in served
        assert_items_equal(ds[served.index(e + 1)], ref.dataset(episodes=[e + 1])[0])
    with pytest.warns(UserWarning, match=warned):
        report = db.export("SELECT episode_index FROM episodes", tmp_path / "out")
    assert (report.episodes, report.frames) == (len(eps) - 1, total - length)
    # an index result names its frames itself: nothing is missing from it, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(db.dataset("SELECT index FROM frames", cameras=[])) == total - length
