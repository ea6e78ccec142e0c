"""Which bytes a set of items reads (lerobot_sql/_readers/need.py): one rule, planned alike by the dataset's fetch
ahead (``pipeline.byte_ranges``) and by ``prefetch.needed_ranges``."""

from __future__ import annotations

import numpy as np
import pytest

import lerobot_sql as lsql
from lerobot_sql import prefetch
from lerobot_sql._readers import locate, need, tabular
from lerobot_sql._storage.pieces import merge_ranges
from lerobot_sql.torch import pipeline
from test_batch import _delta

A = locate.AVIO_BUFFER


@pytest.mark.parametrize("profile", ["plain", "diffusion"])
def test_prefetch_plans_the_bytes_the_dataset_plans(datasets, tmp_path, monkeypatch, profile):
    """A sparse selection, with and without delta_timestamps windows: prefetch fetches what the dataset's own plan
    names, file for file (merged without gaps, to compare the ranges themselves): the same row groups, plus each
    data file's footer, and per mp4 the same packet runs and container head. Before, prefetch asked for each mp4's
    head up to its first packet plus a block (past what the index build fetched: [(0, 48988), ...] where the plan
    has [(0, 32768), ...]) and, with delta_timestamps, every row group from an episode's first row to its last
    (a data file's bytes 122281-864999, where the plan reads 122281-131549 and 858209-864999)."""
    for module in (prefetch, pipeline):
        monkeypatch.setattr(module, "merge_ranges", lambda r, gap=0: merge_ranges(r, 0))
    db = lsql.connect(datasets / "multifile60", cache_dir=tmp_path)
    delta = _delta(profile, db.layout.video_keys)
    m = db.manifest("SELECT index FROM frames WHERE episode_index IN (7, 45) AND frame_index % 9 = 0 ORDER BY index")
    ds = db.dataset(m, delta_timestamps=delta)
    got = prefetch.needed_ranges(db, m, delta_timestamps=delta)
    plan = pipeline.byte_ranges(ds._w(), np.arange(len(ds)))  # nothing built yet: every byte the items read
    assert set(got) == set(plan) and sum(rel.endswith(".mp4") for rel in got) == 4
    for rel, ranges in got.items():
        size = end = db.source.size(rel)
        if rel.endswith(".parquet"):
            end = size - tabular.data_file_info(db.source, rel).metadata.serialized_size - 8
            assert ranges[-1] == (end, size), rel  # the footer, which the dataset's plan leaves to the open
        assert merge_ranges([(a, min(b, end)) for a, b in ranges if a < end], 0) == \
            merge_ranges([(a, min(b, size)) for a, b in plan[rel]], 0), rel


def test_a_container_head_ends_with_the_block_its_first_packet_starts_in():
    for first, end in ((0, A), (A - 1, A), (A, 2 * A), (5 * A + 3, 6 * A)):
        assert need.head_end(np.array([first + 500, first, first + 9])) == end


def test_a_window_reaches_the_rows_of_its_clamped_neighbours():
    """Items at index 10 and 19 of an episode [10, 20) whose first row is file row 100, offsets -2..3: the windows
    reach rows 100..103 and 107..109, clamped to the episode (the rule of deltas.query_indices)."""
    lo, hi = need.window_rows(np.array([10, 19]), np.array([10, 10]), np.array([20, 20]), np.array([100, 100]),
                              np.array([-2, 0, 3]))
    assert lo.tolist() == [100, 107] and hi.tolist() == [103, 109]


def test_windows_at_another_frame_rate_reach_the_last_kept_row_only():
    # an episode of 11 frames served at 1/3 of its rate holds frames 0, 3, 6, 9: a window at 9 reaching +3 frames
    # clamps at 9 (file row 109), not at the episode's last frame 10
    lo, hi = need.window_rows(np.array([9]), np.array([0]), np.array([11]), np.array([100]), np.array([-3, 3]), 3)
    assert (lo.tolist(), hi.tolist()) == ([106], [109])
    q, t = need.window_times(np.array([9]), np.array([0]), np.array([11]), np.array([2.0]), np.array([0.3]),
                             np.array([0, 3]), 30.0, 3)
    assert q.tolist() == [[9, 9]] and t.tolist() == [[2.3, 2.3]]
