"""See what a query selected: a page of playable clips, each camera in sync over a plot of its signals.

The public doors are :func:`lerobot_sql.display.show_clips` (a notebook) and ``lerobot-sql view`` (a file). The work:

* :mod:`.gather`: the selection cut into clips, bounded (clip count, bytes), each camera's window located and
  written as an mp4 (:mod:`lerobot_sql.export.clip_writer`: the dataset's own packets, an edit list to start on
  time), the signals read from the data files;
* :mod:`.html_page`: the page itself, one self-contained HTML file (embedded mp4s, inline SVG, one inline script).
"""

from __future__ import annotations

from .gather import DEFAULT_MAX_BYTES, DEFAULT_MAX_CLIPS, clips_page
from .html_page import Card, ClipsPage, Signal

__all__ = ["clips_page", "ClipsPage", "Card", "Signal", "DEFAULT_MAX_CLIPS", "DEFAULT_MAX_BYTES"]
