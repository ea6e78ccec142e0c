"""The Hub API face of the loopback server (tests/http_range_server.py's HubServer), which bench_train --remote uses
to let lerobot download a dataset the way it does from the Hub: huggingface_hub (here and in the lerobot peer
interpreter) must download a served dataset folder byte for byte, over the same throttle, with its codebase-version
tag, and answer unknown repos and revisions the way the Hub does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from http_range_server import HubServer, RangeServer

hf = pytest.importorskip("huggingface_hub")
# huggingface_hub.utils has the error classes from 0.24 (our floor) to 2.x; .errors only from 0.25
import huggingface_hub.utils as hf_errors  # noqa: E402

from helpers import PEER_PYTHON  # noqa: E402


@pytest.fixture
def served(datasets, tmp_path) -> Path:
    """A copy of multifile60 under a fresh server root (a repo "<any namespace>/mf")."""
    shutil.copytree(datasets / "multifile60", tmp_path / "srv" / "mf")
    return tmp_path / "srv"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(root).parts}


def test_snapshot_download_gets_every_file_once_with_the_version_tag(served, tmp_path):
    with HubServer(served) as srv:
        api = hf.HfApi(endpoint=srv.url, token=False)
        refs = api.list_repo_refs("local/mf", repo_type="dataset")
        assert [t.name for t in refs.tags] == ["v3.0"] and [b.name for b in refs.branches] == ["main"]
        info = api.dataset_info("local/mf", revision="v3.0")
        assert info.sha == refs.tags[0].target_commit and len(info.sha) == 40
        assert sorted(s.rfilename for s in info.siblings) == sorted(_files(served / "mf"))
        out = hf.snapshot_download("local/mf", repo_type="dataset", revision="v3.0", local_dir=tmp_path / "dl",
                                   endpoint=srv.url, token=False)
        assert _files(Path(out)) == _files(served / "mf")
        fetched = [e for e in srv.log if not e[0].startswith("api:")]
        # every file once, whole (no second read, no partial read)
        assert sorted((e[0], e[3]) for e in fetched) == sorted(
            (f"mf/{k}", len(v)) for k, v in _files(served / "mf").items())
        assert [m for m in srv.missed if "agent-harnesses" not in m[1]] == []


def test_hub_errors_and_ranges(served):
    with HubServer(served) as srv:
        api = hf.HfApi(endpoint=srv.url, token=False)
        with pytest.raises(hf_errors.RepositoryNotFoundError):
            api.dataset_info("local/nope")
        with pytest.raises(hf_errors.RevisionNotFoundError):
            api.dataset_info("local/mf", revision="v2.1")
        with pytest.raises(hf_errors.EntryNotFoundError):
            hf.hf_hub_download("local/mf", "meta/missing.json", repo_type="dataset", endpoint=srv.url, token=False,
                               cache_dir=str(served.parent / "hfc"))
        # resolve honours Range and sends the commit, as the Hub does; the plain file face is still there
        import urllib.request

        src = (served / "mf" / "meta" / "info.json").read_bytes()
        req = urllib.request.Request(f"{srv.url}/datasets/local/mf/resolve/main/meta/info.json",
                                     headers={"Range": "bytes=10-19"})
        with urllib.request.urlopen(req) as r:
            assert r.status == 206 and r.read() == src[10:20]
            assert r.headers["X-Repo-Commit"] == api.dataset_info("local/mf").sha
        with urllib.request.urlopen(f"{srv.url}/mf/meta/info.json") as r:
            assert r.read() == src and "X-Repo-Commit" not in r.headers


def test_hub_answers_pay_the_throttle(served, tmp_path):
    """Same token bucket and latency as the file face: the download cannot beat the link."""
    rate, lat = 40e6, 0.02
    with HubServer(served, rate_bps=rate, latency_s=lat) as srv:
        t0 = time.perf_counter()
        hf.snapshot_download("local/mf", repo_type="dataset", local_dir=tmp_path / "dl", endpoint=srv.url,
                             token=False)
        took = time.perf_counter() - t0
        sent = srv.bytes_sent()
    assert sent >= sum(len(v) for v in _files(served / "mf").values())
    assert took >= sent * 8 / rate + 2 * lat  # repo info and tree listing come before any file


def test_range_server_has_no_hub_face(served):
    with RangeServer(served) as srv:
        api = hf.HfApi(endpoint=srv.url, token=False)
        with pytest.raises(hf_errors.HfHubHTTPError):
            api.dataset_info("local/mf")


@pytest.mark.skipif(not Path(PEER_PYTHON).exists(), reason=f"lerobot peer interpreter {PEER_PYTHON} missing")
def test_lerobot_044_downloads_through_the_hub_face(served, tmp_path):
    """lerobot 0.4.4's LeRobotDataset(repo_id), online with HF_ENDPOINT here and a fresh HF_HOME: it asks for the
    refs, picks v3.0, downloads every file and reads the dataset (row count = info.json's total_frames)."""
    script = ("import json, sys; from lerobot.datasets.lerobot_dataset import LeRobotDataset as L; d = L('local/mf'); "
              "print(json.dumps({'root': str(d.root), 'n': len(d), 'index': int(d[100]['index'])}))")
    with HubServer(served) as srv:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
        env.update(HF_ENDPOINT=srv.url, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_PROGRESS_BARS="1")
        r = subprocess.run([PEER_PYTHON, "-c", script], capture_output=True, text=True, env=env, timeout=600,
                           cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert any(e[0].endswith("/refs") for e in srv.log)
    info = json.loads((served / "mf" / "meta" / "info.json").read_text())
    assert got["n"] == info["total_frames"] and got["index"] == 100
    assert _files(Path(got["root"])) == _files(served / "mf")
