"""benchmarks/make_scale_video_set.py on a tiny set: what lerobot_sql serves is the frame the generator put there
(each camera shows the code of its clip and frame), and the counts agree with the metadata."""

from __future__ import annotations

import json
import sys

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from helpers import REPO

sys.path.insert(0, str(REPO))

from benchmarks import make_scale_video_set as msv  # noqa: E402

N_CLIPS = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale_video") / "tiny"
    summary = msv.generate_video_set(root, 6, cameras=2, height=48, width=64, n_clips=N_CLIPS, lengths=(8, 20),
                                     workers=0)
    return root, summary


def test_items_show_their_clip_and_frame(tiny, framecode):
    import lerobot_sql as lsql

    root, summary = tiny
    info = json.loads((root / "meta" / "info.json").read_text())
    eps = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    assert info["total_episodes"] == summary["episodes"] == len(eps["episode_index"]) == 6
    assert info["total_frames"] == summary["frames"] == sum(eps["length"])
    ds = lsql.connect(root).dataset(return_uint8=True, stats=None)
    assert len(ds) == info["total_frames"]
    cams = ["observation.images.exterior_1_left", "observation.images.exterior_2_left"]
    # first and last frame of the set, of episode 3, and two inside episodes
    for i in (0, eps["dataset_from_index"][3], eps["dataset_to_index"][3] - 1, 17, len(ds) - 1):
        ep = int(np.searchsorted(eps["dataset_from_index"], i, side="right") - 1)
        f = i - eps["dataset_from_index"][ep]
        item = ds[i]
        assert (int(item["index"]), int(item["episode_index"]), int(item["frame_index"])) == (i, ep, f)
        assert float(item["timestamp"]) == pytest.approx(f / 15, abs=1e-6)
        for ci, cam in enumerate(cams):
            img = item[cam].numpy()
            assert img.shape == (3, 48, 64)
            clip = msv.clip_of(ep, ci, N_CLIPS)
            assert framecode.verify_frame(img, clip, f, msv.CLIP_CAM)["ok"], (i, cam)
            # the check can fail: the same frame is not another clip's, nor this clip's next frame
            assert not framecode.verify_frame(img, (clip + 1) % N_CLIPS, f, msv.CLIP_CAM)["ok"]
            assert not framecode.verify_frame(img, clip, f + 1, msv.CLIP_CAM)["ok"]


def test_videos_are_the_episodes_back_to_back(tiny):
    root, _ = tiny
    eps = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    cam = "observation.images.wrist_left"
    assert f"videos/{cam}/from_timestamp" not in eps  # cameras=2: the first two only
    cam = "observation.images.exterior_2_left"
    starts, ends = eps[f"videos/{cam}/from_timestamp"], eps[f"videos/{cam}/to_timestamp"]
    assert starts[0] == 0.0 and starts[1:] == ends[:-1]  # one mp4 (far below 200 MB): episodes chained
    assert np.allclose(np.subtract(ends, starts), np.array(eps["length"]) / 15)
    with av.open(str(root / "videos" / cam / "chunk-000" / "file-000.mp4")) as c:
        packets = [p for p in c.demux(c.streams.video[0]) if p.size]
    assert len(packets) == sum(eps["length"])
    # every episode starts on a keyframe (the stream copy cuts clips there)
    assert all(packets[int(round(s * 15))].is_keyframe for s in starts)
    assert [p.pts for p in packets] == [k * 1024 for k in range(len(packets))]  # 1/15360 time base, frame k at k/15


def test_a_remote_h264_file_without_b_frames_is_indexed_from_its_sample_table(tiny, tmp_path, monkeypatch):
    """Over a remote root the index reads the mp4 through a payload-free view, where FFmpeg's H.264 parser finds no
    keyframe in the (absent) payload: the check of the first packets against the sample table failed on the keyframe
    flag alone, and every remote H.264 file was demuxed packet by packet (1.2 s per file of 191,000 frames: 43 s for
    the first batch of the 10,000-episode set). The table is taken (its keyframes are the moov's sync samples) and the
    index equals the local one."""
    from http_range_server import RangeServer
    from lerobot_sql._readers import video_index as vi
    from lerobot_sql._storage.source import open_source

    root, _ = tiny
    rels = sorted(str(p.relative_to(root)) for p in (root / "videos").rglob("*.mp4"))
    with av.open(str(root / rels[0])) as c:
        assert c.streams.video[0].codec_context.name == "h264" and not c.streams.video[0].codec_context.has_b_frames
    monkeypatch.setattr(vi, "_sync_flags", lambda *a: pytest.fail("demuxed packet by packet"))
    with RangeServer(root.parent) as srv:
        src = open_source(f"{srv.url}/{root.name}", cache_dir=tmp_path)
        for rel in rels:
            assert vi._demux_index(src, rel).equals(vi._demux_index(open_source(root), rel))
