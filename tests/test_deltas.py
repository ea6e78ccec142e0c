"""Index math of delta_timestamps: offsets on the 1/fps grid, clamping at episode edges, _is_pad."""

from __future__ import annotations

import numpy as np
import pytest

from lerobot_sql._readers import deltas as frames

FEATURES = {"action": None, "observation.state": None}


def test_offsets_are_rounded_multiples_of_the_frame_period():
    got = frames.delta_indices({"action": [0, 1 / 30, 2 / 30, -5 / 30], "observation.state": [-0.1]}, 30, 1e-4, FEATURES)
    assert got["action"].tolist() == [0, 1, 2, -5] and got["action"].dtype == np.int64
    assert got["observation.state"].tolist() == [-3]
    assert frames.delta_indices(None, 30, 1e-4, FEATURES) == {}


def test_offsets_off_the_grid_or_unknown_keys_are_refused():
    with pytest.raises(ValueError, match=r"multiples of 1/fps.*\[0\.02\]"):
        frames.delta_indices({"action": [0, 0.02]}, 30, 1e-4, FEATURES)
    with pytest.raises(ValueError, match="not a feature"):
        frames.delta_indices({"nope": [0]}, 30, 1e-4, FEATURES)
    with pytest.raises(ValueError, match=r"'actoin' is not a feature of this dataset\. Did you mean 'action'\? Valid"):
        frames.delta_indices({"actoin": [0]}, 30, 1e-4, FEATURES)
    with pytest.raises(ValueError, match="non-empty"):
        frames.delta_indices({"action": []}, 30, 1e-4, FEATURES)
    # within tolerance of the grid is accepted (float noise in user-written offsets)
    assert frames.delta_indices({"action": [1 / 30 + 5e-5]}, 30, 1e-4, FEATURES)["action"].tolist() == [1]


def test_query_indices_clamp_to_the_episode_and_mark_padding():
    ep_from, ep_to = 100, 110  # half-open: frames 100..109
    offsets = np.array([-3, -1, 0, 2, 9])
    for index in range(ep_from, ep_to):
        q, pad = frames.query_indices(index, offsets, ep_from, ep_to)
        for o, qi, p in zip(offsets, q, pad):
            t = index + o
            assert p == (t < ep_from or t >= ep_to)
            assert qi == min(max(t, ep_from), ep_to - 1)


@pytest.mark.parametrize("bad, shown", [(["0.1"], r"'0\.1' \(str\)"), ([True], r"True \(bool\)"),
                                        ([0.0, np.True_], r"(np\.)?True_? \(bool_?\)"), ([None], r"None \(NoneType\)")])
def test_offsets_that_are_not_numbers_are_refused_naming_key_and_value(bad, shown):
    """numpy read "0.1" as 0.1 and True as 1.0 (one frame ahead): accepted before."""
    with pytest.raises(ValueError, match=rf"delta_timestamps\['action'\] holds {shown}, not a number of seconds"):
        frames.delta_indices({"action": bad}, 30, 1e-4, FEATURES)
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\] must be a list of offsets in seconds.*'0\.1'"):
        frames.delta_indices({"action": "0.1"}, 30, 1e-4, FEATURES)  # not its characters
    # numbers of any kind are numbers
    assert frames.delta_indices({"action": [np.float32(0), 1, 2 / 30]}, 30, 1e-4, FEATURES)["action"].tolist() == \
        [0, 30, 2]


@pytest.mark.parametrize("bad", [[0, 1 / 30], [("action", [0])], "action", 0.1])
def test_delta_timestamps_that_is_no_mapping_is_a_type_error_naming_the_form(bad):
    """`delta_timestamps=[0, 1 / 30]` (the offsets without their key) raised a bare AttributeError ("'list' object
    has no attribute 'items'"); a string or a number too."""
    with pytest.raises(TypeError, match=r"delta_timestamps must be a dict \{feature key: \[seconds\]\}.*got "):
        frames.delta_indices(bad, 30, 1e-4, FEATURES)
    assert frames.delta_indices(None, 30, 1e-4, FEATURES) == {} == frames.delta_indices({}, 30, 1e-4, FEATURES)
