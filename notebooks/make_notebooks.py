"""Write explore.ipynb and build_subset.ipynb (without outputs) from the cells below.

Edit the cells here, then run ``python notebooks/make_notebooks.py``; tests/test_notebooks.py checks that the stored
notebooks are what this script writes, carry no outputs, and run top to bottom on the bundled sample.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

FIND_SAMPLE = '''\
from pathlib import Path

import lerobot_sql as lsql
from lerobot_sql.display import frame_grid, plot_episode, show_clips, show_item

# The sample bundled with the repository (20 episodes, 2 cameras, 30 fps); notebooks run from notebooks/.
SAMPLE = Path("..") / "sample" / "small20"
db = lsql.connect(SAMPLE)
db'''

EXPLORE = [
    ("md", """\
# Explore a LeRobot dataset with SQL

`lerobot_sql` opens a LeRobot v3.0 dataset (Parquet frame tables, one MP4 per camera, episode metadata) as SQL views
without loading or copying it. This notebook connects to the bundled sample, looks at its views, runs SQL over
episodes and frames, plots one episode's joints against time, shows camera frames from a window, and computes
per-episode statistics."""),
    ("code", FIND_SAMPLE),
    ("md", """\
## The views
`episodes` (one row per episode, from meta/episodes), `frames` (one row per frame, from data/), `tasks`,
`episode_stats` (the per-episode statistics lerobot stored), `videos` (which mp4 holds which episode), `features`,
`info`, and `video_frames` (one row per video frame, built from the mp4 containers on first use)."""),
    ("code", "db.views()"),
    ("code", "db.sql(\"SELECT name, dtype, shape, names FROM features\").df()"),
    ("md", "## Episodes\nEach query returns a DuckDB relation; `.df()` turns it into a pandas DataFrame."),
    ("code", """\
episodes = db.sql(\"\"\"
    SELECT episode_index, length, round(duration_s, 2) AS duration_s, tasks
    FROM episodes ORDER BY episode_index
\"\"\").df()
episodes.head(8)"""),
    ("md", "### Episode length histogram\nBinned in SQL (50-frame buckets), drawn with matplotlib."),
    ("code", """\
import matplotlib.pyplot as plt

hist = db.sql(\"\"\"
    SELECT 50 * (length // 50) AS bucket, count(*) AS episodes
    FROM episodes GROUP BY bucket ORDER BY bucket
\"\"\").df()
fig, ax = plt.subplots(figsize=(6, 2.5))
ax.bar(hist.bucket, hist.episodes, width=45, align="edge")
ax.set_xlabel("episode length (frames)")
ax.set_ylabel("episodes")
assert hist.episodes.sum() == len(episodes)"""),
    ("md", "### Tasks\nFrames carry a `task_index`; joining `tasks` gives the text. Two episodes switch task midway."),
    ("code", """\
db.sql(\"\"\"
    SELECT t.task_index, t.task,
           count(DISTINCT f.episode_index) AS episodes,
           count(*) AS frames,
           round(count(*) / (SELECT fps FROM info), 1) AS seconds
    FROM frames f JOIN tasks t USING (task_index)
    GROUP BY ALL ORDER BY frames DESC
\"\"\").df()"""),
    ("md", """\
## One episode against time
`plot_episode` reads the episode's rows from the `frames` view and draws one line per joint, labelled with the
`names` of info.json."""),
    ("code", "plot_episode(db, 1, [\"observation.state\", \"action\"]);"),
    ("md", """\
## Camera frames from a window
A query returning `episode_index, start_s, end_s` selects the frames of a half-open time window (seconds from the
episode start); `db.dataset` turns it into a PyTorch dataset whose items are what `LeRobotDataset[i]` returns."""),
    ("code", """\
window = db.dataset("SELECT episode_index, 2.0 AS start_s, 3.0 AS end_s FROM episodes WHERE episode_index = 1")
print(window, len(window))
frame_grid(window, max_items=4);"""),
    ("code", "show_item(window[0])"),
    ("md", """\
## Per-episode statistics
The stored statistics (`episode_stats`, one row per episode, feature and statistic) next to the same numbers
computed from the frames: the `frames_ext` view names each joint (`"action.gripper.pos"`) and adds velocities."""),
    ("code", """\
stored = db.sql(\"\"\"
    SELECT episode_index, value[6] AS gripper_mean_stored
    FROM episode_stats WHERE feature = 'action' AND stat = 'mean'
\"\"\").df()
computed = db.sql(\"\"\"
    SELECT episode_index,
           avg("action.gripper.pos") AS gripper_mean,
           round(avg("action.speed"), 2) AS mean_action_speed,
           round(max("action.wrist_roll.pos") - min("action.wrist_roll.pos"), 2) AS wrist_roll_range,
           count(*) AS frames
    FROM frames_ext GROUP BY episode_index ORDER BY episode_index
\"\"\").df()
stats = computed.merge(stored, on="episode_index")
assert (stats.gripper_mean - stats.gripper_mean_stored).abs().max() < 1e-3
stats.head(8)"""),
    ("md", """\
## Curate: which episodes are any good?
`episode_quality` judges every episode (`pass` / `review` / `exclude`, with `reasons`) from facts it reads once and
caches: rows against meta/episodes, frame_index gaps, NaNs, the cameras' clips, frozen or still state, spikes, a
static gripper, length outliers (docs/curate.md). This clean sample passes at the default thresholds; a much stricter
length rule shows how a `review` looks. Then a training set of the `pass` episodes only."""),
    ("code", """\
import torch

assert db.sql("SELECT count(*) FROM episode_quality WHERE verdict <> 'pass'").fetchall() == [(0,)]
db.quality_thresholds(length_z=1.0)  # the default is 5 robust z-scores: this flags episodes of unusual length
q = db.sql("SELECT episode_index, length, length_z, verdict, reasons FROM episode_quality ORDER BY 1").df()
colors = q.verdict.map({"pass": "tab:green", "review": "tab:orange", "exclude": "tab:red"})
ax = q.plot.bar(x="episode_index", y="length", color=colors, legend=False, figsize=(7, 2.4))
ax.set_ylabel("frames (orange: review)")
good = db.dataset("SELECT episode_index FROM episode_quality WHERE verdict = 'pass'", cameras=[])
batch = next(iter(torch.utils.data.DataLoader(good, batch_size=16, shuffle=True)))
print(f"{good.num_episodes} pass episodes, {len(good)} frames; a batch of state: {tuple(batch['observation.state'].shape)}")
db.quality_thresholds(length_z=5)
q[q.verdict != "pass"]"""),
    ("md", """\
## Watch what a query selected
`show_clips` plays the windows a query returns: each camera side by side and in sync, captioned with the episode,
its bounds and task, over a plot of `observation.state` whose marker follows the frame shown. The clips are the
dataset's own mp4 packets (nothing is decoded to build them); `page.write("clips.html")` saves the same page as one
file that opens in any browser (`lerobot-sql view` does it from the shell; docs/view.md). Here: the two seconds
around each episode's fastest action."""),
    ("code", """\
fastest = \"\"\"
    SELECT episode_index, greatest(t - 1.0, 0) AS start_s, t + 1.0 AS end_s
    FROM (SELECT episode_index, arg_max(timestamp, "action.speed") AS t FROM frames_ext GROUP BY episode_index)
    ORDER BY episode_index LIMIT 6
\"\"\"
page = show_clips(db, fastest)
assert len(page.cards) == 6 and all(clip.copied for card in page.cards for _, clip in card.videos)
page"""),
    ("md", """\
## Many datasets at once
`lsql.connect_many` opens several datasets as one collection: every view gains a `dataset` column. Here the four
generated sets bundled with the repository (one of them in the v2.1 layout), and the hours each holds per task."""),
    ("code", """\
coll = lsql.connect_many([Path("..") / "sample" / n for n in ("small20", "multifile60", "h264_20", "v21_small20")])
per_task = coll.sql(\"\"\"
    SELECT f.dataset, t.task, count(*) / any_value(d.fps) / 3600 AS hours
    FROM frames f JOIN tasks t USING (dataset, task_index) JOIN datasets d USING (dataset)
    GROUP BY ALL ORDER BY f.dataset, hours DESC
\"\"\").df()
table = per_task.pivot(index="dataset", columns="task", values="hours").fillna(0)
ax = table.plot.barh(stacked=True, figsize=(7, 2.8), legend=False)
ax.set_xlabel("hours")
totals = coll.sql("SELECT dataset, sum(duration_s) / 3600 AS hours FROM episodes GROUP BY dataset").df()
assert abs(totals.hours.sum() - per_task.hours.sum()) < 1e-6
table.round(4)"""),
    ("md", "## Video frames\nThe `video_frames` view lists every frame of every mp4 (pts, keyframes), from one demux pass."),
    ("code", """\
db.sql(\"\"\"
    SELECT video_key, count(*) AS frames, count(*) FILTER (WHERE is_keyframe) AS keyframes
    FROM video_frames GROUP BY video_key ORDER BY video_key
\"\"\").df()"""),
]

BUILD = [
    ("md", """\
# Build a training subset with SQL

Pick episodes with SQL, cut windows out of them, train a tiny policy for a few steps on `db.dataset(...)` through a
`DataLoader`, then export the subset as a new LeRobot dataset, reopen it and check it."""),
    ("code", FIND_SAMPLE),
    ("md", "## 1. Pick episodes\nEpisodes of two tasks, at least 5 seconds long."),
    ("code", """\
PICK = \"\"\"
    SELECT episode_index, length, duration_s, tasks FROM episodes
    WHERE (list_contains(tasks, 'Put the marker back in the cup.')
           OR list_contains(tasks, 'Insert the peg into the hole.'))
      AND duration_s >= 5
\"\"\"
db.sql(PICK + " ORDER BY episode_index").df()"""),
    ("md", """\
## 2. Window them
Drop the first and last second of each picked episode: rows `(episode_index, start_s, end_s)` select the frames
with `start_s <= timestamp < end_s`."""),
    ("code", """\
WINDOWS = f\"\"\"
    SELECT episode_index, 1.0 AS start_s, duration_s - 1.0 AS end_s
    FROM ({PICK}) ORDER BY episode_index
\"\"\"
fps = db.fps
train = db.dataset(WINDOWS, cameras=["observation.images.front"],
                   delta_timestamps={"action": [i / fps for i in range(8)]})  # an 8-step action chunk
train"""),
    ("code", "show_item(train[0])"),
    ("md", """\
## 3. Train a tiny policy
Normalisation statistics come from SQL over the same frames; the policy maps (front camera, state) to the next 8
actions. `action_is_pad` marks chunk steps past the episode end, which the loss ignores."""),
    ("code", """\
import numpy as np
import torch
from torch import nn

def joint_stats(feature):
    rows = db.sql(f\"\"\"
        SELECT joint, avg(v) AS mean, stddev_pop(v) AS std
        FROM (SELECT generate_subscripts("{feature}", 1) AS joint, unnest("{feature}") AS v
              FROM frames WHERE episode_index IN (SELECT episode_index FROM ({PICK})))
        GROUP BY joint ORDER BY joint
    \"\"\").fetchall()
    return torch.tensor([r[1] for r in rows]), torch.tensor([r[2] for r in rows])

state_mean, state_std = joint_stats("observation.state")
action_mean, action_std = joint_stats("action")


class TinyPolicy(nn.Module):
    def __init__(self, horizon=8, joints=6):
        super().__init__()
        self.horizon, self.joints = horizon, joints
        self.vision = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8 * 16 + joints, 128), nn.ReLU(), nn.Linear(128, horizon * joints))

    def forward(self, image, state):
        x = torch.cat([self.vision(image), (state - state_mean) / state_std], dim=1)
        return self.head(x).view(-1, self.horizon, self.joints)


torch.manual_seed(0)
policy = TinyPolicy()
opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
loader = torch.utils.data.DataLoader(train, batch_size=32, shuffle=True, num_workers=2)
losses = []
for step, batch in enumerate(loader):
    target = (batch["action"] - action_mean) / action_std            # (B, 8, 6)
    pred = policy(batch["observation.images.front"], batch["observation.state"])
    keep = (~batch["action_is_pad"]).unsqueeze(-1).float()            # (B, 8, 1)
    loss = ((pred - target) ** 2 * keep).sum() / (keep.sum() * 6)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
    if step == 19:
        break
print(f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
assert np.isfinite(losses).all()"""),
    ("md", """\
## 4. Export the subset
`db.export` writes the windows as a new LeRobot v3.0 dataset (data, videos, metadata, stats): each window becomes
an episode, numbered from 0, timestamps starting at 0. Video packets are copied, not re-encoded, where possible."""),
    ("code", """\
import tempfile

out = Path(tempfile.mkdtemp()) / "marker_and_peg_windows"
report = db.export(WINDOWS, out)
report"""),
    ("md", "## 5. Reopen it and check it\nSame number of episodes and frames; the same actions, in order."),
    ("code", """\
sub = lsql.connect(out)
n_windows = db.sql(f"SELECT count(*) FROM ({WINDOWS})").fetchall()[0][0]
assert sub.sql("SELECT count(*) FROM episodes").fetchall()[0][0] == n_windows
assert sub.sql("SELECT count(*) FROM frames").fetchall()[0][0] == len(train)

# The source frames each sample came from, in dataset order (db.manifest resolves the query to frame indices).
source_index = db.manifest(WINDOWS)["index"].to_pylist()
source = db.sql("SELECT index, action FROM frames").df().set_index("index")
exported = sub.sql("SELECT action FROM frames ORDER BY index").df()
assert np.array_equal(np.stack(exported.action), np.stack(source.loc[source_index].action))
sub.sql("SELECT episode_index, length, round(duration_s, 2) AS duration_s, tasks FROM episodes").df()"""),
    ("code", """\
# The first frame of the subset and of the source window look the same (video is lossy: compare closely, not exactly).
a = sub.dataset("SELECT index FROM frames WHERE index = 0")[0]
b = train[0]
diff = (a["observation.images.front"] - b["observation.images.front"]).abs().mean().item()
print(f"mean absolute pixel difference {diff:.4f}")
assert torch.equal(a["observation.state"], b["observation.state"]) and diff < 0.05
plot_episode(sub, 0, "action");"""),
]


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells])
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    for i, c in enumerate(nb.cells):
        c.id = f"cell-{i:02d}"  # stable ids: regenerating gives the same file
    return nb


NOTEBOOKS = {"explore.ipynb": EXPLORE, "build_subset.ipynb": BUILD}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / name)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
