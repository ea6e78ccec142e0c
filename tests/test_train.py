"""Training with lerobot's own code on a SQL selection (lerobot_sql.torch.train, ``lerobot-sql train``), in a real
lerobot.

These run in the lerobot peer interpreter (``$LSQL_PEER_PYTHON``, helpers.PEER_PYTHON: lerobot 0.4.4 on
Python 3.11 with CPU torch, installed by the corpus folder's tools/install_peer.sh plus .ci/peer_train_deps.sh), with this
checkout on its PYTHONPATH. Without that interpreter they skip with the reason; nothing else depends on lerobot.

Checked: lerobot-train's loop runs 20 steps of a small ACT on a whole-episode subset and on a windows query through
the documented entry point, offline, with finite losses; diffusion (lerobot's EpisodeAwareSampler with
drop_n_last_frames) on a subset, where lerobot 0.4.4's own LeRobotDataset(episodes=...) fails; and ``ds.meta``,
its stats and the dataset attributes against ``LeRobotDataset(root, episodes=[...])`` on the same episodes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from helpers import PEER_PYTHON  # noqa: E402

CHECK = ("import duckdb, sqlglot, lerobot, importlib.metadata as m; "
         "from lerobot.scripts import lerobot_train; from lerobot.policies.act.modeling_act import ACTPolicy; "
         "print(m.version('lerobot'))")

# A small ACT (the default one has 52M parameters: minutes per step on a shared CPU); no pretrained weights offline.
ACT = ["--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false",
       "--policy.pretrained_backbone_weights=null", "--policy.dim_model=32", "--policy.n_heads=2",
       "--policy.dim_feedforward=64", "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1",
       "--policy.chunk_size=5", "--policy.n_action_steps=5", "--policy.use_vae=false"]
COMMON = ["--batch_size=2", "--num_workers=0", "--save_checkpoint=false", "--eval_freq=0", "--wandb.enable=false",
          "--log_freq=1", "--seed=1"]


def _peer_version() -> str | None:
    if not Path(PEER_PYTHON).exists():
        return None
    r = subprocess.run([PEER_PYTHON, "-c", CHECK], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None


@pytest.fixture(scope="module")
def peer():
    v = _peer_version()
    if v is None:
        pytest.skip(f"lerobot peer interpreter {PEER_PYTHON} missing, or lerobot's training code (or duckdb/sqlglot) "
                    "not importable in it: install it with tools/install_peer.sh DIR (in the corpus folder) && "
                    "bash .ci/peer_train_deps.sh DIR, then set LSQL_PEER_PYTHON=DIR/bin/python")
    return v


def _run(args, tmp_path, timeout=1500):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "LSQL_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    return subprocess.run([PEER_PYTHON, "-m", "lerobot_sql.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp_path)


def _losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"step:\d+\S* .*?loss:([0-9.eE+-]+|nan|inf)", log)]


@pytest.mark.parametrize("sql", [
    "SELECT episode_index FROM episodes WHERE episode_index IN (2, 5, 7)",
    "SELECT episode_index, 1.0 AS start_s, 3.0 AS end_s FROM episodes WHERE episode_index < 6",
], ids=["episodes", "windows"])
@pytest.mark.timeout(1800)  # 20 training steps: ~1.5 min on a free core, several times that on a loaded CI box
def test_lerobot_train_runs_act_on_a_query(peer, sample, tmp_path, sql):
    out = tmp_path / "run"
    r = _run(["train", str(sample), "--sql", sql, "--", *ACT, *COMMON, "--steps=20", f"--output_dir={out}"],
             tmp_path)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    losses = _losses(log)
    assert len(losses) == 20, log[-3000:]
    assert all(0 <= x < 1e6 for x in losses), losses  # finite, not NaN
    assert "End of training" in log
    saved = json.loads((out / "lerobot_sql_train.json").read_text())
    assert saved["sql"] == sql and saved["stats"] == "selection"
    # lerobot logged our dataset's size: the selection's frames
    n = re.search(r"dataset.num_frames=(\d+)", log)
    assert n, log[-3000:]
    assert int(n.group(1)) > 0


PARITY = r"""
import json, sys, numpy as np, torch
import lerobot_sql as lsql
from lerobot.datasets.lerobot_dataset import LeRobotDataset
root, eps = sys.argv[1], [2, 5, 7]
theirs = LeRobotDataset("local/small20", root=root, episodes=eps)
db = lsql.connect(root)
ours = db.dataset(f"SELECT episode_index FROM episodes WHERE episode_index IN ({', '.join(map(str, eps))})",
                  stats="dataset")
out = {"num_frames": [ours.num_frames, theirs.num_frames], "num_episodes": [ours.num_episodes, theirs.num_episodes],
       "len": [len(ours), len(theirs)], "fps": [ours.fps, theirs.fps],
       "features": ours.features == theirs.features, "meta_features": ours.meta.features == theirs.meta.features,
       "camera_keys": [ours.meta.camera_keys, theirs.meta.camera_keys],
       "video_keys": [ours.meta.video_keys, theirs.meta.video_keys],
       "names": ours.meta.names == theirs.meta.names, "shapes": ours.meta.shapes == theirs.meta.shapes,
       "robot_type": [ours.meta.robot_type, theirs.meta.robot_type],
       "tasks": [list(ours.meta.tasks.index), list(theirs.meta.tasks.index)],
       "task_index": [ours.meta.tasks["task_index"].tolist(), theirs.meta.tasks["task_index"].tolist()]}
# stats="dataset" is what lerobot holds with episodes=[...]: the whole dataset's meta/stats.json
bad = []
for k, st in theirs.meta.stats.items():
    for s, v in st.items():
        a = ours.meta.stats[k][s]
        if not (isinstance(a, np.ndarray) and a.dtype == v.dtype and a.shape == v.shape and np.array_equal(a, v)):
            bad.append([k, s])
out["stats_bad"] = bad
# the selection's stats equal lerobot's aggregate over those episodes on min/max/mean/std/count
from lerobot.datasets.compute_stats import aggregate_stats
import pyarrow.parquet as pq, glob
rows = [r for p in sorted(glob.glob(root + "/meta/episodes/*/*.parquet")) for r in pq.read_table(p).to_pylist()
        if r["episode_index"] in eps]
per_ep = [{k.split("/")[1]: {} for k in r if k.startswith("stats/")} for r in rows]
for d, r in zip(per_ep, rows):
    for k, v in r.items():
        if k.startswith("stats/"):
            _, feat, s = k.split("/", 2)
            d[feat][s] = np.asarray(v)
agg = aggregate_stats(per_ep)
sel = db.stats(f"SELECT episode_index FROM episodes WHERE episode_index IN ({', '.join(map(str, eps))})")
worst = {"camera": 0.0, "numeric": 0.0}
for k, st in agg.items():
    kind = "camera" if k in theirs.meta.camera_keys else "numeric"
    for s in ("min", "max", "mean", "std", "count"):
        a, b = np.asarray(sel[k][s], np.float64).reshape(-1), np.asarray(st[s], np.float64).reshape(-1)
        worst[kind] = max(worst[kind], float(np.max(np.abs(a - b) / np.maximum(1e-6, np.abs(b)))))
out["selection_vs_aggregate_worst_rel"] = worst
# the sampler lerobot's train builds over our dataset draws each position once
from lerobot.datasets.sampler import EpisodeAwareSampler
s = EpisodeAwareSampler(ours.meta.episodes["dataset_from_index"], ours.meta.episodes["dataset_to_index"],
                        episode_indices_to_use=ours.episodes, drop_n_last_frames=0, shuffle=True)
out["sampler"] = sorted(list(s)) == list(range(len(ours)))
# items equal
diff = []
for i in range(0, len(ours), 37):
    a, b = ours[i], theirs[i]
    for key in b:
        x, y = a[key], b[key]
        same = torch.equal(x, y) if isinstance(y, torch.Tensor) else x == y
        if not same:
            diff.append([i, key])
out["item_diff"] = diff
print(json.dumps(out))
"""


@pytest.mark.timeout(1200)
def test_meta_and_stats_match_lerobot_dataset_with_episodes(peer, sample, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "LSQL_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([PEER_PYTHON, "-c", PARITY, str(sample)], capture_output=True, text=True, timeout=900,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for k in ("num_frames", "len", "fps", "camera_keys", "video_keys", "robot_type", "tasks", "task_index"):
        assert got[k][0] == got[k][1], (k, got[k])
    # lerobot's num_episodes with episodes=[2, 5, 7] is 3, as ours
    assert got["num_episodes"] == [3, 3]
    assert got["features"] and got["meta_features"] and got["names"] and got["shapes"]
    assert got["stats_bad"] == []
    # Cameras are lerobot's own aggregation of the same per-episode numbers; numeric features are computed from the
    # frames in float64, where lerobot's per-episode stats summed float32 (about 1e-6 relative apart).
    worst = got["selection_vs_aggregate_worst_rel"]
    assert worst["camera"] < 1e-12 and worst["numeric"] < 1e-5, worst
    assert got["sampler"] and got["item_diff"] == []


def test_resume_finds_the_saved_selection_from_lerobots_checkpoint_config(tmp_path):
    """lerobot resumes from <output_dir>/checkpoints/<step>/pretrained_model/train_config.json: the selection saved in
    <output_dir> is found from there (it was looked for three folders up, in checkpoints/, and never found). A file
    written before stats/align were saved gives their defaults."""
    from lerobot_sql.errors import TrainSetupError
    from lerobot_sql.torch.train import saved_run

    out = tmp_path / "run"
    cfg = out / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    cfg.parent.mkdir(parents=True)
    (out / "lerobot_sql_train.json").write_text(json.dumps({"sql": "SELECT episode_index FROM episodes"}))
    old = {"sql": "SELECT episode_index FROM episodes", "stats": "selection", "align": "timestamp", "root": None,
           "dataset_id": None, "datasets": None, "rename": None, "weights": None, "alpha": None,
           "sample_weights": None}
    assert saved_run(["--resume=true", f"--config_path={cfg}"]) == old
    assert saved_run([f"--output_dir={out}"]) == old
    with pytest.raises(TrainSetupError, match="pass --sql"):
        saved_run([f"--output_dir={tmp_path / 'other'}"])
    # a new run in a folder inside the old one's is not the old run (the file was looked for in every parent)
    with pytest.raises(TrainSetupError, match="pass --sql"):
        saved_run(["--resume=true", f"--output_dir={out / 'new_run'}"])
    (out / "lerobot_sql_train.json").write_text(json.dumps({"sql": None, "stats": "dataset"}))
    with pytest.raises(TrainSetupError, match="holds no SQL selection"):
        saved_run([f"--output_dir={out}"])


def test_resume_on_another_dataset_is_refused_and_on_a_copy_accepted(datasets, tmp_path, monkeypatch):
    """`--resume` compared nothing with the DATASET given: a run started on small20 resumed on multifile60 went on
    training on multifile60's frames. Now refused naming both; a copy of small20 elsewhere (the same
    dataset_identity) resumes."""
    import lerobot_sql as lsql
    from helpers import linked_copy, run_cli

    seen = {}
    _stand_in_lerobot_train(monkeypatch, seen)
    out, sql = _saved_run(tmp_path, lsql.connect(datasets / "small20"))
    r = run_cli("train", datasets / "multifile60", "--", "--resume=true", f"--output_dir={out}")
    assert r.returncode != 0 and "the run was started on" in r.stderr and "another" in r.stderr, r.stderr
    assert not seen
    copy = linked_copy(datasets / "small20", tmp_path / "moved")
    r = run_cli("train", copy, "--", "--resume=true", f"--output_dir={out}")
    assert r.returncode == 0 and seen["sql"] == sql, r.stderr


def _saved_run(tmp_path, src, **modes):
    """``(output_dir, sql)`` of a run started on ``src`` (a Database) with episode 3 and ``modes`` (stats, align), as
    its lerobot_sql_train.json records it."""
    from lerobot_sql._plan.manifest import dataset_identity

    out = tmp_path / "run"
    out.mkdir()
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 3"
    (out / "lerobot_sql_train.json").write_text(json.dumps({"root": src.source.url, "sql": sql, **modes,
                                                            "dataset_id": dataset_identity(src.layout)}))
    return out, sql


def _stand_in_lerobot_train(monkeypatch, seen: dict) -> None:
    """A stand-in of lerobot.scripts.lerobot_train (0.4's names) and of make_factory, recording what the factory
    was made with, so train.run runs to lerobot's main() without lerobot."""
    import sys
    import types

    from lerobot_sql.torch import train

    fake = types.ModuleType("lerobot.scripts.lerobot_train")
    fake.make_dataset, fake.EpisodeAwareSampler, fake.main = None, object, lambda: 0
    for name in ("lerobot", "lerobot.scripts"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["lerobot.scripts"].lerobot_train = fake
    monkeypatch.setitem(sys.modules, "lerobot.scripts.lerobot_train", fake)
    monkeypatch.setattr(train, "lerobot_version", lambda: (0, 4, 4))
    monkeypatch.setattr(train, "make_factory",
                        lambda db, sql, **kw: seen.update(sql=sql, db=db, **kw) or (lambda cfg: None))


@pytest.mark.parametrize("resume", [["--resume=true"], ["--resume", "true"], ["--resume=True"]])
def test_resume_continues_with_the_runs_own_stats_and_align(datasets, tmp_path, monkeypatch, resume):
    """A run started with --stats dataset --align frame_index, resumed without either flag, keeps both (it switched to
    selection statistics and timestamps: normalization changed mid-training on 0.4.4); `--resume true` (lerobot's
    parser takes it) resumes as `--resume=true` does (it exited with "no selection"); a resume that names another
    mode is refused."""
    from helpers import run_cli

    seen = {}
    _stand_in_lerobot_train(monkeypatch, seen)
    out = tmp_path / "run"
    out.mkdir()
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 3"
    (out / "lerobot_sql_train.json").write_text(json.dumps({"root": str(datasets / "small20"), "sql": sql,
                                                            "stats": "dataset", "align": "frame_index"}))
    r = run_cli("train", datasets / "small20", "--", *resume, f"--output_dir={out}", "--policy.type=act")
    assert r.returncode == 0, r.stderr
    assert seen["sql"] == sql and seen["stats"] == "dataset"
    assert seen["dataset_kwargs"]["align"] == "frame_index"
    r = run_cli("train", datasets / "small20", "--stats", "selection", "--", *resume, f"--output_dir={out}")
    assert r.returncode != 0 and "started with --stats dataset" in r.stderr, r.stderr
    r = run_cli("train", datasets / "small20", "--align", "timestamp", "--", *resume, f"--output_dir={out}")
    assert r.returncode != 0 and "started with --align frame_index" in r.stderr, r.stderr
    # not a resume: the defaults, whatever a run folder holds
    seen.clear()
    r = run_cli("train", datasets / "small20", "--sql", sql, "--", f"--output_dir={out}")
    assert r.returncode == 0 and seen["stats"] == "selection" and not seen["dataset_kwargs"], (r.stderr, seen)


def _stand_in_lerobot_factory(monkeypatch) -> None:
    """A stand-in of lerobot.datasets.factory (what make_factory imports from it), so no lerobot is needed."""
    import sys
    import types

    fake = types.ModuleType("lerobot.datasets.factory")
    fake.IMAGENET_STATS = {"mean": [[[0.485]], [[0.456]], [[0.406]]], "std": [[[0.229]], [[0.224]], [[0.225]]]}
    fake.ImageTransforms = None
    fake.resolve_delta_timestamps = lambda policy_cfg, meta: None
    for name in ("lerobot", "lerobot.datasets"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "lerobot.datasets.factory", fake)


def test_the_factory_passes_lerobots_depth_output_unit_and_keeps_depth_stats(datasets, tmp_path, monkeypatch):
    """lerobot 0.6's factory builds its dataset with ``depth_output_unit=cfg.dataset.depth_output_unit`` and puts
    ImageNet stats on every camera but the depth keys: ours the same (the factory run against a stand-in of
    lerobot.datasets.factory, so no lerobot is needed)."""
    import types

    import numpy as np

    import lerobot_sql as lsql
    from helpers import exp_bounds, load_reference
    from lerobot_sql.torch.train import make_factory

    _stand_in_lerobot_factory(monkeypatch)
    ref, npz = load_reference("depth4")
    db = lsql.connect(datasets / "depth4", cache_dir=tmp_path / "c")
    cfg = types.SimpleNamespace(policy=None, tolerance_s=1e-4, output_dir=None, dataset=types.SimpleNamespace(
        episodes=None, streaming=False, image_transforms=None, use_imagenet_stats=True, depth_output_unit="m"))
    ds = make_factory(db, "SELECT index FROM frames ORDER BY index", stats="dataset", version=(0, 6, 1))(cfg)
    assert ds.depth_output_unit == "m" and ds.return_uint8
    it = ref["items"][3]
    got = ds[it["index"]]["observation.images.depth"]
    bound = exp_bounds(datasets / "depth4", {"depth_output_unit": "m"})["observation.images.depth"]
    np.testing.assert_allclose(got.numpy(), npz[f"metres/{it['index']}/observation.images.depth"], rtol=0, atol=bound)
    st = ds.meta.stats
    for key in ref["depth_keys"]:  # lerobot's own depth stats, in metres, not ImageNet's
        np.testing.assert_array_equal(st[key]["max"], np.asarray(ref["depth_stats"]["metres"][key]["max"]))
    assert st["observation.images.front"]["mean"].shape == (3, 1, 1)


def test_train_takes_align_frame_index_to_the_dataset(datasets, tmp_path, monkeypatch):
    """`lerobot-sql train --align frame_index` (for wall-clock timestamps over clips on the fps grid) reaches
    db.dataset through the factory's dataset_kwargs; the factory (against a stand-in of lerobot.datasets.factory)
    then builds the dataset by frame index, whose items are their own frames (framecode), and records it for the
    run; the default stays lerobot's rule by time."""
    import importlib.util
    import shutil
    import types

    import lerobot_sql as lsql
    from helpers import FRAMECODE, run_cli, wall_clock
    from lerobot_sql.torch import train
    from lerobot_sql.torch.train import make_factory

    seen = {}
    monkeypatch.setattr(train, "run", lambda root, sql, args, **kw: seen.update(kw) or 0)
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 3"
    assert run_cli("train", datasets / "small20", "--sql", sql, "--align", "frame_index", "--",
                   "--policy.type=act").returncode == 0
    assert seen["dataset_kwargs"] == {"align": "frame_index"}
    assert run_cli("train", datasets / "small20", "--sql", sql, "--", "--policy.type=act").returncode == 0
    assert not seen["dataset_kwargs"] and seen["stats"] is None  # train.run's own default ("selection")
    # the factory: a copy of small20 whose timestamps run at 0.9x real time (wall-clock)
    root = tmp_path / "small20"
    shutil.copytree(datasets / "small20", root)
    wall_clock(root, 0.9)
    _stand_in_lerobot_factory(monkeypatch)
    cfg = types.SimpleNamespace(policy=None, tolerance_s=1e-4, output_dir=str(tmp_path / "run"),
                                dataset=types.SimpleNamespace(episodes=None, streaming=False, image_transforms=None,
                                                              use_imagenet_stats=False))
    db = lsql.connect(root, cache_dir=tmp_path / "c")
    with pytest.raises(lsql.DatasetFormatError, match='align="frame_index"'):
        make_factory(db, sql, stats=None, version=(0, 6, 1))(cfg)
    ds = make_factory(db, sql, stats=None, version=(0, 6, 1), dataset_kwargs={"align": "frame_index"})(cfg)
    assert ds.align == "frame_index"
    spec = importlib.util.spec_from_file_location("framecode", FRAMECODE)
    fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fc)
    for i in (0, len(ds) // 2, len(ds) - 1):
        item = ds[i]
        assert fc.verify_frame(item["observation.images.front"], 3, int(item["frame_index"]),
                               "observation.images.front")["ok"]
    assert json.loads((tmp_path / "run" / "lerobot_sql_train.json").read_text())["align"] == "frame_index"


def test_a_resume_given_sql_again_is_held_to_the_run_it_resumes(datasets, tmp_path, monkeypatch):
    """The same command with `--resume=true` added (its --sql given again, as users re-run it) skipped every resume
    check: another --stats, --align, selection or dataset was accepted (hostile review 13, F1). Now held to the
    saved run as a bare `--resume=true` is; the same selection resumes with the run's modes."""
    import lerobot_sql as lsql
    from helpers import run_cli

    seen = {}
    _stand_in_lerobot_train(monkeypatch, seen)
    out, sql = _saved_run(tmp_path, lsql.connect(datasets / "small20"), stats="dataset", align="frame_index")
    resume = ["--", "--resume=true", f"--output_dir={out}"]
    for extra, says in ((["--stats", "selection"], "started with --stats dataset"),
                        (["--align", "timestamp"], "started with --align frame_index"),
                        ([], "the run was started on")):
        root = datasets / ("multifile60" if not extra else "small20")
        r = run_cli("train", root, "--sql", sql, *extra, *resume)
        assert r.returncode != 0 and says in r.stderr, r.stderr
    r = run_cli("train", datasets / "small20", "--sql", sql.replace("= 3", "= 4"), *resume)
    assert r.returncode != 0 and "started with --sql" in r.stderr and "drop --sql" in r.stderr, r.stderr
    assert not seen
    r = run_cli("train", datasets / "small20", "--sql", sql, *resume)
    assert r.returncode == 0 and seen["sql"] == sql and seen["stats"] == "dataset", r.stderr
    assert seen["dataset_kwargs"]["align"] == "frame_index"
    assert json.loads((out / "lerobot_sql_train.json").read_text())["stats"] == "dataset"


def test_a_resumed_run_keeps_the_record_of_how_it_was_started(datasets, tmp_path, monkeypatch):
    """lerobot_sql_train.json was rewritten by every factory call, a resume's too, so a resume with other modes lost
    the record later resumes are held to (hostile review 13, F1): a resumed run leaves it; a new run writes it."""
    import types

    import lerobot_sql as lsql
    from lerobot_sql.torch.train import make_factory

    _stand_in_lerobot_factory(monkeypatch)
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path / "c")
    out = tmp_path / "run"
    out.mkdir()
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 3"
    kept = json.dumps({"root": "first", "sql": sql, "stats": "selection", "align": "timestamp"})  # (one line)
    (out / "lerobot_sql_train.json").write_text(kept)

    def cfg(resume):
        return types.SimpleNamespace(policy=None, tolerance_s=1e-4, output_dir=str(out), resume=resume,
                                     dataset=types.SimpleNamespace(episodes=None, streaming=False, image_transforms=None,
                                                                   use_imagenet_stats=True))

    make_factory(db, sql, stats="selection", version=(0, 4, 4))(cfg(True))
    assert (out / "lerobot_sql_train.json").read_text() == kept
    make_factory(db, sql, stats="selection", version=(0, 4, 4))(cfg(False))
    assert json.loads((out / "lerobot_sql_train.json").read_text())["sql"] == sql


def test_a_resume_on_the_same_path_holding_another_dataset_is_refused(datasets, tmp_path, monkeypatch):
    """The run's dataset was compared by path first: a run started on a folder that was then replaced by another
    dataset (or a Hub revision that gained episodes) resumed on other frames (hostile review 14, F3). Compared by
    identity: refused, saying the path holds another dataset; `--resume=on` (lerobot's parser reads it as true) is
    a resume too (14, F4)."""
    import shutil

    import lerobot_sql as lsql
    from helpers import run_cli
    from lerobot_sql._plan.manifest import dataset_identity

    seen = {}
    _stand_in_lerobot_train(monkeypatch, seen)
    root = tmp_path / "data"
    shutil.copytree(datasets / "small20", root, ignore=shutil.ignore_patterns("videos"))
    out = tmp_path / "run"
    out.mkdir()
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 3"
    src = lsql.connect(root)
    (out / "lerobot_sql_train.json").write_text(json.dumps({"root": src.source.url, "sql": sql,
                                                            "dataset_id": dataset_identity(src.layout)}))
    shutil.rmtree(root)
    shutil.copytree(datasets / "multifile60", root, ignore=shutil.ignore_patterns("videos"))
    for flag in ("--resume=true", "--resume=on"):
        r = run_cli("train", root, "--", flag, f"--output_dir={out}")
        assert r.returncode != 0 and "which holds another dataset now" in r.stderr, r.stderr
    assert not seen


def test_a_resume_lerobot_parsed_from_another_spelling_is_held_to_the_run(datasets, tmp_path, monkeypatch):
    """lerobot's parser resumes on `--resu=true` or `resume: true` in a --config_path file, which run() does not read
    as a resume: another --sql and --stats were accepted (hostile review 15, F2). The factory holds any run lerobot
    resumes (cfg.resume) to its saved selection, statistics, alignment and dataset."""
    import types

    import lerobot_sql as lsql
    from lerobot_sql.errors import TrainSetupError
    from lerobot_sql.torch.train import make_factory

    _stand_in_lerobot_factory(monkeypatch)
    db = lsql.connect(datasets / "small20", cache_dir=tmp_path / "c")
    out = tmp_path / "run"
    sql = "SELECT episode_index FROM episodes WHERE episode_index = 3"

    def cfg(resume):
        return types.SimpleNamespace(policy=None, tolerance_s=1e-4, output_dir=str(out), resume=resume,
                                     dataset=types.SimpleNamespace(episodes=None, streaming=False, image_transforms=None,
                                                                   use_imagenet_stats=True))

    make_factory(db, sql, stats="dataset", version=(0, 4, 4))(cfg(False))  # the run starts: recorded
    for other_sql, stats, kw, says in ((sql.replace("= 3", "= 4"), "dataset", {}, "--sql"),
                                       (sql, "selection", {}, "--stats"),
                                       (sql, "dataset", {"align": "frame_index"}, "--align")):
        with pytest.raises(TrainSetupError, match=rf"started with {says} .*mid-training"):
            make_factory(db, other_sql, stats=stats, version=(0, 4, 4), dataset_kwargs=kw)(cfg(True))
    other = lsql.connect(datasets / "multifile60", cache_dir=tmp_path / "c")
    with pytest.raises(TrainSetupError, match="holds another dataset now"):
        make_factory(other, sql, stats="dataset", version=(0, 4, 4))(cfg(True))
    assert make_factory(db, sql, stats="dataset", version=(0, 4, 4))(cfg(True)) is not None  # the same run resumes


def test_a_resume_from_one_runs_checkpoint_into_another_folder_is_held_to_that_run(datasets, tmp_path, monkeypatch):
    """Resuming run A's checkpoint (`--config_path` into A) with `--output_dir=B` looked for the run file in B only:
    another --sql and --stats were accepted while lerobot went on from A's optimizer state (hostile review 16, F1).
    The run file above the checkpoint's `checkpoints/` is the one a resume is held to, in run() and in the factory."""
    import types

    import lerobot_sql as lsql
    from helpers import run_cli
    from lerobot_sql.errors import TrainSetupError
    from lerobot_sql.torch.train import make_factory

    seen = {}
    _stand_in_lerobot_train(monkeypatch, seen)
    db = lsql.connect(datasets / "small20")
    run_a, sql = _saved_run(tmp_path, db, stats="dataset")
    cfg_file = run_a / "checkpoints" / "000020" / "pretrained_model" / "train_config.json"
    cfg_file.parent.mkdir(parents=True)
    cfg_file.write_text("{}")
    other = sql.replace("= 3", "= 4")
    r = run_cli("train", datasets / "small20", "--sql", other, "--", "--resume=true", f"--config_path={cfg_file}",
                f"--output_dir={tmp_path / 'B'}")
    assert r.returncode != 0 and "started with --sql" in r.stderr, r.stderr
    assert not seen
    _stand_in_lerobot_factory(monkeypatch)
    cfg = types.SimpleNamespace(policy=None, tolerance_s=1e-4, output_dir=str(tmp_path / "B"), resume=True,
                                checkpoint_path=str(cfg_file.parent.parent),
                                dataset=types.SimpleNamespace(episodes=None, streaming=False, image_transforms=None,
                                                              use_imagenet_stats=True))
    with pytest.raises(TrainSetupError, match="started with --sql"):
        make_factory(db, other, stats="dataset", version=(0, 4, 4))(cfg)


# ---- several datasets (issue 41) -------------------------------------------------------------------------------------
MIX_SQL = "SELECT dataset, episode_index FROM episodes WHERE episode_index < 2"


def test_train_on_several_datasets_reaches_lerobot_with_the_collection_and_its_mixture(datasets, monkeypatch):
    """`lerobot-sql train A B --sql ... --weights/--alpha/--rename` (it stopped with "not supported yet") hands
    lerobot's script a collection and the mixture; a comma list names the datasets too; bad options are refused
    before lerobot starts, naming the fix."""
    import lerobot_sql as lsql
    from helpers import run_cli

    seen = {}
    _stand_in_lerobot_train(monkeypatch, seen)
    a, b = datasets / "small20", datasets / "h264_20"
    r = run_cli("train", a, b, "--sql", MIX_SQL, "--weights", "small20=0.7, h264_20=0.3", "--rename",
                "h264_20:observation.images.wrist=observation.images.hand", "--rename",
                "small20:observation.images.wrist=observation.images.hand", "--", "--policy.type=act")
    assert r.returncode == 0, r.stderr
    assert isinstance(seen["db"], lsql.Collection) and seen["db"].names == ["small20", "h264_20"]
    assert seen["weights"] == {"small20": 0.7, "h264_20": 0.3} and seen["alpha"] is None
    assert seen["rename"] == {"h264_20": {"observation.images.wrist": "observation.images.hand"},
                              "small20": {"observation.images.wrist": "observation.images.hand"}}
    seen.clear()
    assert run_cli("train", f"{a},{b}", "--sql", MIX_SQL, "--alpha", "0.5", "--", "--policy.type=act").returncode == 0
    assert seen["alpha"] == 0.5 and seen["weights"] is None and seen["db"].names == ["small20", "h264_20"]
    for args, code, says in (
            ([a, b, "--weights", "small20"], 1, "'small20' is a dataset: dataset shares are --weights NAME=WEIGHT"),
            ([a, b, "--weights", "small20=1,h264_20"], 2, "is not NAME=WEIGHT"),
            ([a, b, "--weights", "small20=1,small20=2"], 2, "given twice"),
            ([a, b, "--weights", "small20=nan,h264_20=1"], 2, "finite number >= 0"),
            ([a, b, "--weights", "small20=-1,h264_20=1"], 2, "finite number >= 0"),
            ([a, b, "--weights", "smal20=1,h264_20=1"], 1, "no dataset 'smal20'"),
            ([a, b, "--weights", "small20=1", "--alpha", "1"], 2, "not both"),
            ([a, b, "--rename", "small20:observation.images.wrist"], 2, "DATASET:SOURCE_KEY=ITEM_KEY"),
            ([a, "--weights", "small20=1"], 2, "for several datasets"),
            ([a, b, "--name", "split"], 2, "written for one dataset")):
        seen.clear()
        sql = [] if "--name" in args else ["--sql", MIX_SQL]
        r = run_cli("train", *args, *sql, "--", "--policy.type=act")
        assert r.returncode == code and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not seen
    r = run_cli("train", a, b, "--sql", "SELECT episode_index FROM episodes", "--", "--policy.type=act")
    assert r.returncode == 1 and "returns the dataset column" in r.stderr and not seen, r.stderr  # before lerobot
    r = run_cli("train", a, b, "--sql", MIX_SQL, "--weights", "smal20=1,h264_20=1", "--", "--policy.type=act")
    assert "did you mean 'small20'" in r.stderr.lower() or "'small20'" in r.stderr, r.stderr


def _saved_mixture(tmp_path, coll, **extra):
    from lerobot_sql._plan.manifest import dataset_identity

    out = tmp_path / "mixrun"
    out.mkdir()
    rec = {"root": None, "dataset_id": None, "sql": MIX_SQL, "stats": "dataset", "align": "timestamp",
           "datasets": {n: {"root": coll[n].source.url, "dataset_id": dataset_identity(coll[n].layout)}
                        for n in coll.names},
           "rename": None, "weights": {"small20": 0.7, "h264_20": 0.3}, "alpha": None, **extra}
    (out / "lerobot_sql_train.json").write_text(json.dumps(rec))
    return out


def test_a_mixture_resumes_with_its_own_weights_and_refuses_other_ones(datasets, tmp_path, monkeypatch):
    """A resumed mixture continues with the selection, statistics and weights it was started with; other weights,
    one dataset instead of the run's several, or another dataset under a name are refused before lerobot starts."""
    import lerobot_sql as lsql
    from helpers import run_cli

    seen = {}
    _stand_in_lerobot_train(monkeypatch, seen)
    a, b = datasets / "small20", datasets / "h264_20"
    out = _saved_mixture(tmp_path, lsql.connect_many([a, b]))
    resume = ["--", "--resume", "true", f"--output_dir={out}"]
    r = run_cli("train", a, b, *resume)
    assert r.returncode == 0, r.stderr
    assert seen["sql"] == MIX_SQL and seen["stats"] == "dataset" and seen["weights"] == {"small20": 0.7, "h264_20": 0.3}
    for args, says in (([a, b, "--weights", "small20=0.5,h264_20=0.5"], "started with --weights"),
                       ([a, b, "--alpha", "0.5"], "started with --alpha"),
                       ([a], "started on several datasets"),
                       ([a, datasets / "multifile60"], "differing")):
        seen.clear()
        r = run_cli("train", *args, *resume)
        assert r.returncode != 0 and says in r.stderr, (args, r.stderr)
        assert not seen
    (tmp_path / "s").mkdir()
    single, _ = _saved_run(tmp_path / "s", lsql.connect(a))
    r = run_cli("train", a, b, "--", "--resume=true", f"--output_dir={single}")
    assert r.returncode != 0 and "started on one dataset" in r.stderr, r.stderr


def test_the_factory_over_several_datasets_builds_the_mixture_and_records_it(datasets, tmp_path, monkeypatch):
    """make_factory over a collection (against a stand-in of lerobot.datasets.factory): a CollectionDataset whose
    meta lerobot reads (ImageNet stats on the cameras), the mixture flagged and lerobot 0.4's sampler switch set
    (a policy config without drop_n_last_frames got a RandomSampler), the run file holding the datasets and the
    mixture; one dataset's samples are no mixture; weights the selection cannot honour and several fps under a
    policy with frame offsets are refused."""
    import types

    import lerobot_sql as lsql
    from lerobot_sql.errors import TrainSetupError
    from lerobot_sql.torch.mixture import CollectionDataset
    from lerobot_sql.torch.train import make_factory

    _stand_in_lerobot_factory(monkeypatch)
    coll = lsql.connect_many([datasets / "small20", datasets / "h264_20"], cache_dir=tmp_path / "c")

    def cfg(out=None):
        return types.SimpleNamespace(policy=types.SimpleNamespace(), tolerance_s=1e-4, output_dir=out, seed=1,
                                     resume=False, dataset=types.SimpleNamespace(
                                         episodes=None, streaming=False, image_transforms=None,
                                         use_imagenet_stats=True))

    c = cfg(str(tmp_path / "run"))
    f = make_factory(coll, MIX_SQL, stats="dataset", version=(0, 4, 4), weights={"small20": 0.7, "h264_20": 0.3})
    ds = f(c)
    assert isinstance(ds, CollectionDataset) and f.mixture and f.dataset is ds and f.cfg is c
    assert c.policy.drop_n_last_frames == 0
    assert ds.meta.stats["observation.images.front"]["mean"].flatten().tolist() == pytest.approx([0.485, 0.456, 0.406])
    rec = json.loads((tmp_path / "run" / "lerobot_sql_train.json").read_text())
    assert sorted(rec["datasets"]) == ["h264_20", "small20"] and rec["weights"] == {"small20": 0.7, "h264_20": 0.3}
    assert rec["sql"] == MIX_SQL and rec["stats"] == "dataset"
    c1 = cfg()
    f1 = make_factory(coll, "SELECT dataset, episode_index FROM episodes WHERE dataset = 'small20' AND episode_index "
                      "< 2", stats="dataset", version=(0, 4, 4))
    f1(c1)
    assert not f1.mixture and not hasattr(c1.policy, "drop_n_last_frames")
    with pytest.raises(TrainSetupError, match="h264_20.*no samples"):
        make_factory(coll, "SELECT dataset, episode_index FROM episodes WHERE dataset = 'small20'",
                     version=(0, 4, 4), weights={"small20": 0.7, "h264_20": 0.3})(cfg())
    import sys

    sys.modules["lerobot.datasets.factory"].resolve_delta_timestamps = lambda policy_cfg, meta: {"action": [
        i / meta.fps for i in range(3)]}  # a policy with an action chunk reads the fps
    coll["h264_20"].layout.info["fps"] = 15
    with pytest.raises(TrainSetupError, match="different fps.*small20: 30.*h264_20: 15"):
        make_factory(coll, MIX_SQL, version=(0, 4, 4))(cfg())


def _steps(log: str) -> list[tuple[str, str, str]]:
    """(step, loss, grad norm) of every step lerobot logged."""
    return re.findall(r"step:(\d+)\S* .*?loss:(\S+) grdn:(\S+)", log)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_collection_of_one_dataset_trains_bit_identically_to_the_single_dataset_command(peer, datasets, tmp_path):
    """The same 20 steps (ACT, --stats dataset, 2 workers) through `lerobot-sql train DATASET` and through a
    collection holding only that dataset (a glob matching it): every logged loss and gradient norm, and the saved
    weights, byte for byte."""
    small20 = datasets / "small20"
    common = [*ACT, "--batch_size=4", "--num_workers=2", "--eval_freq=0", "--wandb.enable=false", "--log_freq=1",
              "--seed=1", "--steps=20", "--save_freq=20"]
    runs = {}
    for name, source, sql in (("one", [small20], "SELECT episode_index FROM episodes WHERE episode_index < 3"),
                              ("coll", [str(small20)[:-1] + "*"],
                               "SELECT dataset, episode_index FROM episodes WHERE episode_index < 3")):
        r = _run(["train", *map(str, source), "--stats", "dataset", "--sql", sql, "--", *common,
                  f"--output_dir={tmp_path / name}"], tmp_path)
        log = r.stdout + r.stderr
        assert r.returncode == 0, log[-4000:]
        runs[name] = _steps(log)
    assert len(runs["one"]) == 20 and runs["one"] == runs["coll"], runs
    weights = [(tmp_path / n / "checkpoints" / "000020" / "pretrained_model" / "model.safetensors").read_bytes()
               for n in ("one", "coll")]
    assert weights[0] == weights[1]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_datasets_train_as_a_weighted_mixture_and_resume_its_order(peer, datasets, tmp_path):
    """Two shipped sets whose front cameras are named differently (lined up by --rename), weights 0.7/0.3: 50 steps
    of ACT with finite losses and checkpoints; the mixture sampler's log says what it drew, which is the weights'
    share within one sample over the epoch; resuming from step 25 goes on at draw 25 x batch of the same epoch, with
    the very steps of the uninterrupted run (ACT without dropout, so that lerobot's random state, which a resume does
    not carry into the DataLoader's first draw, plays no part: equal losses and gradient norms mean equal batches)."""
    from helpers import renamed_copy

    top = renamed_copy(datasets / "h264_20", tmp_path / "top20", {"observation.images.front": "observation.images.top"})
    sql = "SELECT dataset, episode_index FROM episodes WHERE episode_index = 0"
    mix = ["train", str(datasets / "small20"), str(top)]
    common = ["--batch_size=16", "--num_workers=0", "--eval_freq=0", "--wandb.enable=false", "--log_freq=1",
              "--seed=1", "--steps=50"]
    out = tmp_path / "mix"
    r = _run([*mix, "--sql", sql, "--weights", "small20=0.7,top20=0.3", "--rename",
              "top20:observation.images.top=observation.images.front", "--", *ACT, "--policy.dropout=0.0", *common,
              "--save_freq=25", f"--output_dir={out}"], tmp_path)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    whole = _steps(log)
    losses = [float(x[1]) for x in whole]
    assert len(losses) == 50 and all(0 <= x < 1e6 for x in losses), losses
    assert (out / "checkpoints" / "000025").is_dir() and (out / "checkpoints" / "000050").is_dir()
    drew = re.search(r"mixture sampler: epoch 0 drew (\d+): small20=(\d+) \S+, top20=(\d+)", log)
    assert drew, log[-3000:]
    n, a, b = map(int, drew.groups())
    assert n == a + b == 348 + 304 and abs(a - 0.7 * n) <= 1, drew.group(0)  # episode 0's frames of each set
    assert "epoch 0 from draw 0 of 652" in log
    cfg = out / "checkpoints" / "000025" / "pretrained_model" / "train_config.json"
    r = _run([*mix, "--", "--resume", "true", f"--config_path={cfg}", "--steps=50"], tmp_path)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "mixture sampler: epoch 0 from draw 400 of 652" in log, log[-3000:]
    assert _steps(log) == whole[25:]


# ---- sample weights from a column: --weights COLUMN (issue 39) -------------------------------------------------------
W_SQL = ("SELECT episode_index, CASE episode_index WHEN 0 THEN 3.0 WHEN 1 THEN 1.0 ELSE 0.0 END AS weight "
         "FROM episodes WHERE episode_index < 3")


def _stand_in_lerobot_044_script(monkeypatch, seen: dict) -> None:
    """lerobot 0.4.4's train script cut down to what reaches the data (without lerobot): ``main()`` builds the
    dataset with ``make_dataset(cfg)`` and, as 0.4.4 does, an ``EpisodeAwareSampler`` only for a policy config with
    ``drop_n_last_frames`` (else a RandomSampler: ``sampler`` None), then draws one epoch. ``seen`` gets the
    config, the dataset, the sampler and its draws."""
    import sys
    import types

    from lerobot_sql.torch import train

    _stand_in_lerobot_factory(monkeypatch)
    fake = types.ModuleType("lerobot.scripts.lerobot_train")

    class EpisodeAwareSampler:  # lerobot's own; never built here: run() replaces it for the run
        def __init__(self, *a, **kw):
            raise AssertionError("lerobot's own sampler was built")

    def main():
        out = train._arg_value(sys.argv[1:], "output_dir")
        cfg = types.SimpleNamespace(policy=types.SimpleNamespace(), tolerance_s=1e-4, output_dir=out, seed=1,
                                    resume=train.resuming(sys.argv[1:]), batch_size=8, checkpoint_path=None,
                                    dataset=types.SimpleNamespace(episodes=None, streaming=False,
                                                                  image_transforms=None, use_imagenet_stats=True))
        dataset = fake.make_dataset(cfg)
        sampler = None
        if hasattr(cfg.policy, "drop_n_last_frames"):
            sampler = fake.EpisodeAwareSampler(dataset.meta.episodes["dataset_from_index"],
                                               dataset.meta.episodes["dataset_to_index"],
                                               episode_indices_to_use=dataset.episodes,
                                               drop_n_last_frames=cfg.policy.drop_n_last_frames, shuffle=True)
        seen.update(cfg=cfg, dataset=dataset, sampler=sampler, order=None if sampler is None else list(sampler))
        return 0

    fake.make_dataset, fake.EpisodeAwareSampler, fake.main = None, EpisodeAwareSampler, main
    monkeypatch.setitem(sys.modules, "lerobot.scripts", types.ModuleType("lerobot.scripts"))
    sys.modules["lerobot.scripts"].lerobot_train = fake
    monkeypatch.setitem(sys.modules, "lerobot.scripts.lerobot_train", fake)
    monkeypatch.setattr(train, "lerobot_version", lambda: (0, 4, 4))


def test_train_weights_column_draws_by_it_through_lerobots_script(datasets, tmp_path, monkeypatch):
    """`lerobot-sql train DATASET --sql ... --weights COLUMN` (a stand-in of lerobot 0.4.4's script): lerobot's
    sampler switch is set for ACT, the weighted sampler replaces lerobot's, the epoch draws each sample by its
    row's weight (weight 0 never), and the run file records the column. Without --weights, ACT on 0.4 keeps its
    RandomSampler (lerobot's own path, unchanged)."""
    import numpy as np

    from helpers import run_cli

    seen = {}
    _stand_in_lerobot_044_script(monkeypatch, seen)
    out = tmp_path / "run"
    r = run_cli("train", datasets / "small20", "--sql", W_SQL, "--weights", "weight", "--", f"--output_dir={out}",
                "--policy.type=act")
    assert r.returncode == 0, r.stderr
    assert type(seen["sampler"]).__name__ == "WeightedTrainSampler" and seen["cfg"].policy.drop_n_last_frames == 0
    ds = seen["dataset"]
    w = ds.manifest["weight"].to_numpy()
    count = np.bincount(seen["order"], minlength=len(ds))
    assert len(seen["order"]) == len(ds) and np.abs(count - len(ds) * w / w.sum()).max() < 1
    assert count[w == 0].sum() == 0
    rec = json.loads((out / "lerobot_sql_train.json").read_text())
    assert rec["sample_weights"] == "weight" and rec["sql"] == W_SQL
    seen.clear()
    r = run_cli("train", datasets / "small20", "--sql", W_SQL, "--", f"--output_dir={tmp_path / 'plain'}")
    assert r.returncode == 0 and seen["sampler"] is None, r.stderr
    assert json.loads((tmp_path / "plain" / "lerobot_sql_train.json").read_text())["sample_weights"] is None


def test_train_weights_column_over_several_datasets_global_or_within_shares(datasets, tmp_path, monkeypatch):
    """Over two datasets: --weights COLUMN alone compares the weights across the datasets (a dataset's share is its
    weights' sum); with --weights NAME=W (or --alpha) too, the datasets get those shares and the column weighs
    within each."""
    import numpy as np

    from helpers import run_cli

    seen = {}
    _stand_in_lerobot_044_script(monkeypatch, seen)
    sql = ("SELECT dataset, episode_index, CASE WHEN dataset = 'small20' THEN 3.0 ELSE 1.0 END AS weight FROM "
           "episodes WHERE episode_index = 0")
    both = [datasets / "small20", datasets / "h264_20", "--sql", sql]
    r = run_cli("train", *both, "--weights", "weight", "--", f"--output_dir={tmp_path / 'g'}")
    assert r.returncode == 0, r.stderr
    ds = seen["dataset"]
    w, code = ds.manifest["weight"].to_numpy(), np.asarray(ds.dataset_index)
    assert type(seen["sampler"]).__name__ == "WeightedTrainSampler"
    drawn = code[np.asarray(seen["order"])]
    assert abs(int((drawn == 0).sum()) - len(ds) * w[code == 0].sum() / w.sum()) < 1
    r = run_cli("train", *both, "--weights", "weight", "--weights", "small20=0.5,h264_20=0.5", "--",
                f"--output_dir={tmp_path / 'm'}")
    assert r.returncode == 0, r.stderr
    assert type(seen["sampler"]).__name__ == "MixtureTrainSampler"
    drawn = code[np.asarray(seen["order"])]
    assert abs(int((drawn == 0).sum()) - len(ds) / 2) <= 1
    rec = json.loads((tmp_path / "m" / "lerobot_sql_train.json").read_text())
    assert rec["sample_weights"] == "weight" and rec["weights"] == {"small20": 0.5, "h264_20": 0.5}


def test_train_weights_column_refusals(datasets, tmp_path, monkeypatch):
    """A column the selection does not return is refused before lerobot's script runs, naming the result's columns;
    bad values when the dataset is built, naming the episode; malformed --weights at parse (exit 2)."""
    from helpers import run_cli

    seen = {}
    _stand_in_lerobot_044_script(monkeypatch, seen)
    a, b = datasets / "small20", datasets / "h264_20"
    for args, code, says in (
            ([a, "--sql", W_SQL, "--weights", "wieght"], 1,
             "--weights 'wieght': the selection returns no such column (its columns: ['episode_index', 'weight'])"),
            ([a, "--sql", W_SQL.replace("ELSE 0.0", "ELSE -1.0"), "--weights", "weight"], 1,
             "weights column 'weight': -1.0 at sample"),
            ([a, "--sql", W_SQL.replace("3.0", "0.0").replace("1.0", "0.0"), "--weights", "weight"], 1,
             "every weight of the"),
            ([a, "--sql", W_SQL, "--weights", "weight,other"], 2, "is neither NAME=WEIGHT"),
            ([a, "--sql", W_SQL, "--weights", "weight", "--weights", "other"], 2, "one column of sample weights"),
            ([a, "--sql", W_SQL, "--weights", "small20=1"], 2, "for several datasets"),
            ([a, b, "--sql", MIX_SQL, "--weights", "small20=1,h264_20=1", "--weights", "small20=1"], 2,
             "given twice")):
        seen.clear()
        r = run_cli("train", *args, "--", f"--output_dir={tmp_path / 'x'}")
        assert r.returncode == code and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert "order" not in seen


def test_a_weighted_run_resumes_with_its_column_and_refuses_another(datasets, tmp_path, monkeypatch):
    """The column is saved: --resume without --weights draws by it; another column, or one for a run started
    without, is refused (the draws would change mid-training)."""
    import lerobot_sql as lsql
    from helpers import run_cli
    from lerobot_sql._plan.manifest import dataset_identity

    seen = {}
    _stand_in_lerobot_train(monkeypatch, seen)
    small20 = datasets / "small20"
    db = lsql.connect(small20)
    out = tmp_path / "run"
    out.mkdir()
    (out / "lerobot_sql_train.json").write_text(json.dumps({"root": db.source.url, "sql": W_SQL, "sample_weights":
                                                            "weight", "dataset_id": dataset_identity(db.layout)}))
    r = run_cli("train", small20, "--", "--resume=true", f"--output_dir={out}")
    assert r.returncode == 0 and seen["sample_weights"] == "weight" and seen["sql"] == W_SQL, r.stderr
    seen.clear()
    r = run_cli("train", small20, "--weights", "score", "--", "--resume=true", f"--output_dir={out}")
    assert r.returncode != 0 and "started with --weights 'weight'; resuming it with --weights 'score'" in r.stderr
    assert not seen
    (tmp_path / "u").mkdir()
    plain, _ = _saved_run(tmp_path / "u", lsql.connect(small20))
    r = run_cli("train", small20, "--weights", "weight", "--", "--resume=true", f"--output_dir={plain}")
    assert r.returncode != 0 and "started with --weights None" in r.stderr and not seen, r.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_weights_column_trains_and_its_draws_follow_the_weights(peer, sample, tmp_path):
    """`--weights COLUMN` in lerobot 0.4.4: two 2 s windows (60 frames each), the first weighing 3, the second 1.
    20 steps of ACT (batch 16: over two epochs of 120 draws) with finite losses; the weighted sampler logs each
    whole epoch's draws with the mean weight the weights give exactly (3 x 90 + 1 x 30 draws: 2.5, where unweighted
    draws would average 2.0); resuming from step 10 goes on at draw 32 of epoch 1 (10 steps = one epoch of 8 batches
    and 2 more) with the uninterrupted run's very steps (ACT without dropout, as the mixture's resume test)."""
    sql = ("SELECT episode_index, 0.0 AS start_s, 2.0 AS end_s, CASE WHEN episode_index = 0 THEN 3.0 ELSE 1.0 END "
           "AS weight FROM episodes WHERE episode_index < 2")
    common = ["--batch_size=16", "--num_workers=0", "--eval_freq=0", "--wandb.enable=false", "--log_freq=1",
              "--seed=1", "--steps=20"]
    out = tmp_path / "weighted"
    r = _run(["train", str(sample), "--sql", sql, "--weights", "weight", "--", *ACT, "--policy.dropout=0.0", *common,
              "--save_freq=10", f"--output_dir={out}"], tmp_path)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    whole = _steps(log)
    losses = [float(x[1]) for x in whole]
    assert len(losses) == 20 and all(0 <= x < 1e6 for x in losses), losses
    assert "weighted sampler: epoch 0 from draw 0 of 120; weights 'weight': mean weight expected 2.5 (unweighted 2)" \
        in log, log[-3000:]
    for epoch in (0, 1):
        assert f"weighted sampler: epoch {epoch} drew 120: mean weight 2.5 (expected 2.5)" in log, log[-3000:]
    assert json.loads((out / "lerobot_sql_train.json").read_text())["sample_weights"] == "weight"
    cfg = out / "checkpoints" / "000010" / "pretrained_model" / "train_config.json"
    r = _run(["train", str(sample), "--", "--resume", "true", f"--config_path={cfg}", "--steps=20"], tmp_path)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "weighted sampler: epoch 1 from draw 32 of 120" in log, log[-3000:]
    assert _steps(log) == whole[10:]
