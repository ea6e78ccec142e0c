"""lerobot 0.6's depth maps as numbers: the 12-bit quantizer's constants and defaults, and the units depth is
recorded and served in. The one home of these constants: the dataset's torch dequantization
(:func:`lerobot_sql.torch._values.dequantize_`), the statistics' numpy one, ``ds.meta.stats``' rescaling and the
layout's defaults all read them here, so that a change of lerobot's format is one edit. No torch, no numpy.
"""

from __future__ import annotations

QMAX = 4095  # lerobot.configs.video.DEPTH_QMAX: depth videos hold 12-bit codes 0..4095 (gray12le)
MM_PER_METRE = 1000.0  # lerobot.datasets.depth_utils.MM_PER_METRE
MM_MAX = 65535  # depth in millimetres is clamped to uint16's range, as lerobot does before it rounds
# lerobot 0.6's quantizer defaults (lerobot.configs.video: DEFAULT_DEPTH_MIN/MAX/SHIFT/USE_LOG), in metres
DEFAULTS = {"depth_min": 0.01, "depth_max": 10.0, "shift": 3.5, "use_log": True}
UNITS = ("mm", "m")  # info.depth_unit values lerobot writes, and the depth_output_unit choices it serves


def unit_factor(recorded: str, served: str) -> float:
    """What depth recorded in ``recorded`` ("mm"/"m") is multiplied by to be in ``served`` (lerobot 0.6's
    ``rescale_depth_stats`` factor): 1000 from m to mm, 1/1000 from mm to m, 1 when they are the same."""
    if recorded == served:
        return 1.0
    return MM_PER_METRE if recorded == "m" else 1.0 / MM_PER_METRE
