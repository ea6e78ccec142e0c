"""The main job on the bundled sample: a few SQL results, a filtered training set, one timed DataLoader pass.

Run: ``python -m lerobot_sql.demo [DATASET_ROOT]`` (default: the repo's ``sample/small20``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "sample" / "small20"


def _show(title: str, rel) -> None:
    print(f"\n-- {title}")
    print(rel)


def main(argv: list[str] | None = None) -> int:
    import torch

    import lerobot_sql as lsql

    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]) if argv else SAMPLE
    t0 = time.perf_counter()
    db = lsql.connect(root)
    print(f"{db}\nconnected in {1000 * (time.perf_counter() - t0):.0f} ms (info.json and Parquet footers only)")
    _show("views", db.views())
    _show("episodes longer than 250 frames",
          db.sql("SELECT episode_index, length, round(duration_s, 2) AS duration_s, tasks FROM episodes "
                 "WHERE length > 250 ORDER BY length DESC LIMIT 8"))
    _show("frames per task",
          db.sql("SELECT t.task, count(*) AS frames, count(DISTINCT f.episode_index) AS episodes "
                 "FROM frames f JOIN tasks t USING (task_index) GROUP BY t.task ORDER BY frames DESC"))
    _show("per-episode action range (from episode_stats)",
          db.sql("SELECT episode_index, stat, list_transform(value, lambda v: round(v, 3)) AS value "
                 "FROM episode_stats WHERE feature = 'action' AND stat IN ('min', 'max') AND episode_index < 3 "
                 "ORDER BY episode_index, stat"))

    sql = ("SELECT episode_index FROM episodes "
           "WHERE length > 200 AND list_contains(tasks, 'Put the marker back in the cup.')")
    fps = db.fps
    train = db.dataset(sql, delta_timestamps={"observation.state": [-2 / fps, -1 / fps, 0.0],
                                              "action": [i / fps for i in range(10)]})
    print(f"\n-- training set\n{sql}\n{train}")
    item = train[0]
    for k, v in item.items():
        shape = str(tuple(v.shape)) if hasattr(v, "shape") else ""
        print(f"   {k:32s} {shape:16} "
              f"{str(v.dtype).removeprefix('torch.') if hasattr(v, 'dtype') else repr(v)}")
    loader = torch.utils.data.DataLoader(train, batch_size=32, shuffle=True, num_workers=2)
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += len(batch["index"])
    dt = time.perf_counter() - t0
    print(f"\n-- one DataLoader pass (batch 32, 2 workers, shuffled): {n} items in {dt:.2f} s "
          f"= {n / dt:.0f} items/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
