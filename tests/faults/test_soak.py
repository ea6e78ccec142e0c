"""Resource bounds: a soak run of 20k items on the bundled sample, cameras on, whose memory stays flat after warm-up,
with decoders and caches bounded. Matrix: docs/reliability.md."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import lerobot_sql as lsql


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no /proc/self/status")


def _files(d) -> set[str]:
    return {str(p) for p in d.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_soak_20k_items_flat_memory(sample, tmp_path, framecode):
    db = lsql.connect(sample, cache_dir=tmp_path / "c")
    ds = db.dataset("SELECT episode_index FROM episodes", delta_timestamps={"action": [-1 / 30, 0, 1 / 30]},
                    return_uint8=True, max_open_decoders=1)  # 2 cameras through 1 slot: the LRU is exercised
    order = np.random.default_rng(0).permutation(np.tile(np.arange(len(ds)), 6))
    warm, total = 3_000, 23_000
    checked = 0
    for k in range(warm):
        ds[int(order[k])]
    gc.collect()
    base, files = _rss(), _files(tmp_path / "c")
    peak = base
    for k in range(warm, total):
        item = ds[int(order[k])]
        if k % 500 == 0:  # now and then, the frame is the one asked for (framecode ground truth)
            ep, f = int(item["episode_index"]), int(item["frame_index"])
            img = item["observation.images.front"].numpy().transpose(1, 2, 0)
            assert framecode.verify_frame(img, ep, f, 1)["ok"], (ep, f)
            checked += 1
        if k % 2_000 == 0:
            gc.collect()
            peak = max(peak, _rss())
    gc.collect()
    end = max(peak, _rss())
    assert checked >= 35
    assert end < 1.10 * base, f"RSS grew from {base / 2**20:.0f} MiB to {end / 2**20:.0f} MiB over 20k items"
    assert ds._w().decoders.stats()["open_files"] <= 1  # the decoder pool keeps its bound
    assert _files(tmp_path / "c") == files  # no cache growth after warm-up (the per-sample file exists from the start)
