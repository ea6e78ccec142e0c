"""lerobot_sql.view (display.show_clips, lerobot-sql view): a query's windows as playable clips. The clips' frames
are the dataset's items' frames, the signals its rows, the bounds say what they left out, hostile text stays text,
a remote dataset fetches only the clips' bytes, and in headless Chromium the page loads without errors, every video
plays its window from its first frame for its length, a seek shows the dataset's frame and the markers follow."""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import re

import av
import numpy as np
import pytest

import lerobot_sql as lsql
from browser import Chromium, chromium_binary
from helpers import DATASETS
from http_range_server import RangeServer
from lerobot_sql import display
from lerobot_sql._readers import locate
from lerobot_sql.errors import QueryError
from lerobot_sql.view import ClipsPage

CAMS = ["observation.images.front", "observation.images.wrist"]
# windows starting mid-GOP (odd frames: one frame of pre-roll) and on a keyframe, in three episodes
WINDOWS = ("SELECT episode_index, start_s, start_s + 1.0 AS end_s FROM (VALUES (3, 31 / 30), (7, 0.0), (11, 2.5)) "
           "t(episode_index, start_s) ORDER BY episode_index")


@pytest.fixture(scope="module")
def db():
    with lsql.connect(DATASETS / "small20") as d:
        yield d


@pytest.fixture(scope="module")
def page(db) -> ClipsPage:
    return display.show_clips(db, WINDOWS)


def _decode(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def _offsets(page: ClipsPage) -> list[int]:
    """Each card's first sample in the dataset of the same selection (cards hold consecutive samples)."""
    return list(np.cumsum([0] + [c.frames for c in page.cards[:-1]]))


def test_each_window_is_a_clip_of_the_dataset_frames_and_rows(db, page):
    ds = db.dataset(WINDOWS, return_uint8=True)
    tasks = dict(db.sql("SELECT episode_index, tasks[1] FROM episodes").fetchall())
    assert [c.episode_index for c in page.cards] == [3, 7, 11] and not page.left_out
    assert sum(c.frames for c in page.cards) == len(ds)
    for card, first in zip(page.cards, _offsets(page)):
        rows = db.sql(f"SELECT frame_index, timestamp, \"observation.state\" FROM frames WHERE episode_index = "
                      f"{card.episode_index} AND frame_index BETWEEN {card.frame_start} AND "
                      f"{card.frame_start + card.frames - 1} ORDER BY frame_index").fetchall()
        assert len(rows) == card.frames == 30
        assert card.start_s == pytest.approx(rows[0][1]) and card.end_s == pytest.approx(rows[0][1] + 1.0)
        assert card.task == tasks[card.episode_index]
        (sig,) = card.signals
        assert sig.feature == "observation.state" and sig.names[-1] == "gripper.pos"
        np.testing.assert_array_equal(sig.values, np.array([r[2] for r in rows], np.float32).astype(np.float64))
        np.testing.assert_array_equal(sig.t, np.array([r[1] for r in rows], np.float32).astype(np.float64))
        for key, clip in card.videos:
            assert clip.copied and clip.frames == card.frames
            assert clip.preroll == (card.frame_start % 2)  # lerobot's GOP of 2: a mid-GOP start has one
            frames = _decode(clip.mp4)
            assert len(frames) == card.frames
            for k in (0, 1, card.frames - 1):  # the dataset's own frame, bit for bit (the same packets decoded)
                np.testing.assert_array_equal(frames[k], ds[first + k][key].numpy().transpose(1, 2, 0))


def test_clips_follow_order_by_else_episode_order(db):
    desc = display.show_clips(db, "SELECT episode_index FROM episodes WHERE episode_index IN (2, 9, 5) "
                                  "ORDER BY episode_index DESC", signals=[], cameras="observation.images.wrist")
    assert [c.episode_index for c in desc.cards] == [9, 5, 2]
    assert [k for k, _ in desc.cards[0].videos] == ["observation.images.wrist"] and desc.cards[0].signals == []
    lengths = dict(db.sql("SELECT episode_index, length FROM episodes").fetchall())
    assert [c.frames for c in desc.cards] == [lengths[e] for e in (9, 5, 2)]
    plain = display.show_clips(db, "SELECT episode_index FROM episodes WHERE episode_index IN (9, 2, 5)",
                               signals=[], cameras=["observation.images.wrist"], max_clips=2)
    assert [c.episode_index for c in plain.cards] == [2, 5]  # without ORDER BY: episode order, as dataset()


def test_bounds_leave_clips_out_and_the_page_says_so(db, page):
    few = display.show_clips(db, "SELECT episode_index FROM episodes ORDER BY episode_index", max_clips=3,
                             signals=[])
    assert [c.episode_index for c in few.cards] == [0, 1, 2]
    assert few.left_out == ["17 more episodes of the selection (max_clips=3), of episodes 3, 4, 5, 6, 7, 8, 9, 10, "
                            "11, 12, 13, 14 ... (17 in all)"]
    assert "Left out: 17 more episodes" in few.html()
    one = sum(len(v.mp4) for _, v in page.cards[0].videos)
    small = display.show_clips(db, WINDOWS, max_bytes=one + 2000)
    assert [c.episode_index for c in small.cards] == [3] and small.mp4_bytes <= one + 2000
    assert len(small.left_out) == 1 and small.left_out[0].startswith("2 windows past the byte bound") \
        and small.left_out[0].endswith("episodes 7, 11")
    none = display.show_clips(db, WINDOWS, max_bytes=1000)
    assert none.cards == [] and "3 windows past the byte bound" in none.left_out[0]
    assert "No clip to show." in none.html()


def test_index_rows_give_one_clip_per_run_and_a_dataset_gives_its_own(db):
    runs = display.show_clips(db, "SELECT index FROM frames WHERE episode_index = 4 AND frame_index % 40 < 10",
                              signals=["action"])
    n = db.sql("SELECT count(*) FROM frames WHERE episode_index = 4 AND frame_index % 40 < 10").fetchall()[0][0]
    assert [c.frame_start for c in runs.cards] == list(range(0, 40 * len(runs.cards), 40))
    assert sum(c.frames for c in runs.cards) == n and runs.cards[0].signals[0].feature == "action"
    ds = db.dataset(WINDOWS, cameras=CAMS)
    mine = display.show_clips(ds)
    ref = display.show_clips(db, WINDOWS)
    assert [(c.episode_index, c.frame_start, c.frames) for c in mine.cards] == \
        [(c.episode_index, c.frame_start, c.frames) for c in ref.cards]
    assert [v.mp4 for c in mine.cards for _, v in c.videos] == [v.mp4 for c in ref.cards for _, v in c.videos]


def test_bad_arguments_are_named(db):
    with pytest.raises(QueryError, match=r"camera 'observation.images.frnt' is unknown. Did you mean "
                                         r"'observation.images.front'\?"):
        display.show_clips(db, WINDOWS, cameras=["observation.images.frnt"])
    with pytest.raises(QueryError, match=r"signal 'observation.images.front' is a camera or text"):
        display.show_clips(db, WINDOWS, signals="observation.images.front")
    with pytest.raises(ValueError, match=r"max_clips must be an integer >= 1, not 0"):
        display.show_clips(db, WINDOWS, max_clips=0)
    with pytest.raises(TypeError, match=r"a dataset already holds its selection"):
        display.show_clips(db.dataset(WINDOWS), WINDOWS)
    with pytest.raises(TypeError, match=r"for a collection pass one of its datasets"):
        display.show_clips(object(), WINDOWS)
    with lsql.connect(DATASETS / "img5_extras") as images:
        with pytest.raises(QueryError, match=r"no video cameras"):
            display.show_clips(images)


def test_hostile_text_stays_text(db, page):
    """A task text, feature name or query that holds markup is shown, never run: every dataset or user string is
    escaped (without it, the script below would run in the page of whoever opens it)."""
    evil = "</code><script>window.pwned = 1</script><img src=x onerror=alert(1)>"
    hostile = display.show_clips(db, f"SELECT episode_index FROM episodes WHERE episode_index = 1 -- {evil}",
                                 signals=[])
    card = page.cards[0]
    signals = [dataclasses.replace(s, feature=evil, names=[evil] * len(s.names)) for s in card.signals]
    forged = ClipsPage(dataset=evil, sql=evil, fps=30.0, left_out=[evil],
                       cards=[dataclasses.replace(card, task=evil, videos=[(evil, v) for _, v in card.videos],
                                                  signals=signals)])
    for text in (hostile.html(), forged.html(), forged._repr_html_()):
        assert "<script>window.pwned" not in text and "<img src=x" not in text
        assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in text


def test_the_file_is_self_contained(page, tmp_path):
    out = page.write(tmp_path / "clips.html")
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<video ") == 6
    assert re.findall(r"\bsrc='([a-z]+):", text) == ["data"] * 6  # the mp4s are in the page
    assert "<script src" not in text and "<link" not in text and "@import" not in text and "url(" not in text
    sizes = [len(base64.b64decode(s)) for s in re.findall(r"data:video/mp4;base64,([A-Za-z0-9+/=]+)", text)]
    assert sizes == [len(v.mp4) for c in page.cards for _, v in c.videos]
    assert not list(tmp_path.glob(".clips.html.*"))  # written whole, no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # a page to share: not mkstemp's 0600


def test_remote_dataset_fetches_only_the_clips_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))
    with RangeServer(DATASETS) as http:
        remote = lsql.connect(f"{http.url}/small20")
        remote.sql("SELECT count(*) FROM video_frames").fetchall()  # the video index (the mp4s' moov boxes)
        before = len(http.log)
        got = display.show_clips(remote, WINDOWS)
        mp4_gets = [(p, a, b, n) for p, a, b, n in http.log[before:] if p.endswith(".mp4")]
    local = display.show_clips(lsql.connect(DATASETS / "small20"), WINDOWS)
    assert [v.mp4 for c in got.cards for _, v in c.videos] == [v.mp4 for c in local.cards for _, v in c.videos]
    # what was fetched: each clip's packets (pre-roll included) and one demuxer block past them, one request per
    # camera clip (fetched ahead in one round), nothing else (the clip's mp4 is its packets plus ~1 KB of boxes)
    fetched = sum(n for *_, n in mp4_gets)
    clip_bytes = sum(len(v.mp4) for c in local.cards for _, v in c.videos)
    assert 0 < len(mp4_gets) <= 6 and fetched <= clip_bytes + 6 * locate.AVIO_BUFFER, (mp4_gets, clip_bytes)
    files = sum((DATASETS / p.lstrip("/")).stat().st_size for p in {g[0] for g in mp4_gets})
    assert fetched < 0.1 * files


# ---- in a real browser -------------------------------------------------------------------------------------------
CHROMIUM = chromium_binary()
need_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium; "
                                                            ".ci/run installs it) or $LSQL_CHROMIUM")

LOADED = """(async () => {
  const vids = [...document.querySelectorAll('video')];
  const ready = v => v.readyState >= 2 ? null : new Promise((ok, bad) => {
    v.addEventListener('loadeddata', ok, {once: true}); v.addEventListener('error', () => bad(v.error.message));
    setTimeout(() => bad('no data after 20 s'), 20000); });
  await Promise.all(vids.map(ready));
  return vids.map(v => [v.readyState, v.duration, v.videoWidth, v.videoHeight]);
})()"""

# seek the clock of figure __FIG__ to __T__ seconds, wait until every camera of the clip has sought and shows a frame, and return
# each camera's pixels (RGBA, base64) and currentTime
SEEK = """(async () => {
  const fig = document.querySelectorAll('figure.lsql-clip')[__FIG__], vids = [...fig.querySelectorAll('video')];
  const sought = vids.map(v => new Promise(ok => v.addEventListener('seeked', ok, {once: true})));
  vids[0].currentTime = __T__;
  await Promise.all(sought);
  await new Promise(ok => setTimeout(ok, 60));
  return vids.map(v => {
    const c = document.createElement('canvas'); c.width = v.videoWidth; c.height = v.videoHeight;
    const g = c.getContext('2d', {willReadFrequently: true}); g.drawImage(v, 0, 0);
    const px = g.getImageData(0, 0, c.width, c.height).data; let s = '';
    for (let i = 0; i < px.length; i += 8192) s += String.fromCharCode.apply(null, px.subarray(i, i + 8192));
    return [btoa(s), v.currentTime];
  });
})()"""

# play figure __FIG__'s clock for __MS__ milliseconds from 0; the markers' x before and after, and the times
PLAY = """(async () => {
  const fig = document.querySelectorAll('figure.lsql-clip')[__FIG__], vids = [...fig.querySelectorAll('video')];
  const m = fig.querySelector('line.lsql-marker'), x = () => parseFloat(m.getAttribute('x1'));
  const back = new Promise(ok => vids[0].addEventListener('seeked', ok, {once: true}));
  vids[0].currentTime = 0;
  await back;
  const x0 = x();
  await vids[0].play();
  await new Promise(ok => setTimeout(ok, __MS__));
  const playing = x(), during = vids.map(v => v.currentTime);
  vids[0].pause();
  await new Promise(ok => setTimeout(ok, 100));
  return {x0, playing, x: x(), t: vids[0].currentTime, during, after: vids.map(v => v.currentTime),
          paused: vids.map(v => v.paused), dur: parseFloat(fig.dataset.duration), x_left: parseFloat(m.dataset.x0),
          w: parseFloat(m.dataset.w), label: fig.querySelector('.lsql-time').textContent};
})()"""


@pytest.fixture(scope="module")
def chromium():
    if CHROMIUM is None:
        pytest.skip("no chromium")
    with Chromium(CHROMIUM) as b:
        yield b


@pytest.mark.slow
@need_chromium
@pytest.mark.parametrize("name", ["small20", "h264_20"])
def test_the_page_plays_the_dataset_frames_in_chromium(name, chromium, tmp_path):
    with lsql.connect(DATASETS / name) as src:
        page = display.show_clips(src, WINDOWS)
        ds = src.dataset(WINDOWS, return_uint8=True)
        fps = src.fps
        tab = chromium.open(page.write(tmp_path / "clips.html").as_uri())
        try:
            media = tab.eval(LOADED)
            assert len(media) == 6 and all(rs >= 2 for rs, *_ in media), media
            cams = [(c, k) for c in page.cards for k, _ in c.videos]
            for (_, dur, w, h), (card, key) in zip(media, cams):
                assert abs(dur - card.frames / fps) <= 1 / fps, (key, dur, card.frames)  # the window's length
                assert (h, w) == tuple(ds[0][key].shape[1:])
            for f, (card, first) in enumerate(zip(page.cards, _offsets(page))):
                for k in (0, card.frames // 2, card.frames - 1):
                    shots = tab.eval(SEEK.replace("__FIG__", str(f)).replace("__T__", repr((k + 0.5) / fps)))
                    for (png, t), (key, _) in zip(shots, card.videos):
                        assert abs(t - (k + 0.5) / fps) < 1 / fps  # the other cameras follow the clock
                        h, w = ds[first][key].shape[1:]
                        got = np.frombuffer(base64.b64decode(png), np.uint8).reshape(h, w, 4)[..., :3].astype(int)
                        err = {j: np.abs(got - ds[first + j][key].numpy().transpose(1, 2, 0).astype(int)).mean()
                               for j in (k - 1, k, k + 1) if 0 <= j < card.frames}
                        # the dataset's frame for that time, within the browser's YUV->RGB rounding; not a neighbour
                        assert min(err, key=err.get) == k and err[k] < 4.0, (name, card.episode_index, key, k, err)
            run = tab.eval(PLAY.replace("__FIG__", "1").replace("__MS__", "400"))
            assert run["x0"] == pytest.approx(run["x_left"])
            assert 0.1 < run["t"] < run["dur"] and run["x_left"] < run["playing"] <= run["x"]
            assert run["x"] == pytest.approx(run["x_left"] + run["w"] * run["t"] / run["dur"], abs=0.01)
            assert all(p for p in run["paused"]) and max(run["after"]) - min(run["after"]) < 1e-3  # in sync
            assert max(run["during"]) - min(run["during"]) <= 1.5 / fps
            assert run["label"].startswith(f"t = {page.cards[1].start_s + run['t']:.3f} s")
            assert tab.problems() == []
        finally:
            tab.close()


@pytest.mark.slow
@need_chromium
def test_a_depth_map_plays_in_chromium_after_its_reencode(chromium, tmp_path):
    with lsql.connect(DATASETS / "depth4") as src:
        page = display.show_clips(src, "SELECT episode_index, 0.1 AS start_s, 0.5 AS end_s FROM episodes")
    assert {k for _, k, _ in page.reencoded} == {"observation.images.depth"}
    tab = chromium.open(page.write(tmp_path / "depth.html").as_uri())
    try:
        media = tab.eval(LOADED)
        assert len(media) == 2 * len(page.cards) and all(rs >= 2 for rs, *_ in media)
        assert all(abs(dur - 12 / 30) <= 1 / 30 for _, dur, *_ in media), media
        assert tab.problems() == []
    finally:
        tab.close()


def test_a_tiny_byte_bound_leaves_every_clip_out_and_says_so(sample, tmp_path):
    """Hostile review 20, M9: --max-mb 1e-9 truncated to 0 bytes and ended in a traceback (max_bytes must be >= 1)."""
    from helpers import run_cli

    r = run_cli("view", sample, "--sql", "SELECT episode_index FROM episodes LIMIT 2", "-o", tmp_path / "p.html",
                "--max-mb", "1e-9")
    assert r.returncode == 0 and "0 clips" in r.stdout + r.stderr and "past the byte bound" in r.stdout + r.stderr, r
