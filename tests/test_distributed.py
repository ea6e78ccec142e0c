"""Two torch.distributed ranks (gloo, loopback): each plans the manifest itself and takes its own part; the parts
are disjoint, cover the selection, follow the epoch, and their items equal the single-process dataset's."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lerobot_sql as lsql
from lerobot_sql.torch.shard import ShardedManifestDataset, shard_manifest

SQL = "SELECT episode_index FROM episodes WHERE length > 200"
WORLD = 2
EPOCHS = (0, 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        db = lsql.connect(root)
        m = db.manifest(SQL)  # every rank plans on its own; the partition needs no communication
        result = {"rank": rank, "epochs": {}}
        for epoch in EPOCHS:
            part = shard_manifest(m, dist.get_rank(), dist.get_world_size(), epoch=epoch, seed=7)
            ds = db.dataset(part, cameras=[])
            probe = [0, len(ds) // 2, len(ds) - 1]
            items = [ds[i] for i in probe]
            mine = part["index"].to_pylist()
            gathered: list = [None] * WORLD
            dist.all_gather_object(gathered, mine)  # what the other rank holds, over gloo
            result["epochs"][epoch] = {
                "index": mine, "gathered": gathered,
                "probe": [{"index": int(it["index"]), "action": it["action"].tolist(),
                           "state": it["observation.state"].tolist()} for it in items],
            }
        # rank x DataLoader worker: each rank's part split between its 2 workers, rank and world size taken from
        # torch.distributed; persistent workers follow set_epoch.
        it = ShardedManifestDataset(db, m, seed=7, cameras=[])
        loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2, persistent_workers=True)
        result["workers"] = {}
        for epoch in (1, 2):
            it.set_epoch(epoch)
            result["workers"][epoch] = [int(x["index"]) for x in loader]
        del loader
        dist.barrier()
        Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_get_disjoint_covering_parts(sample, tmp_path):
    outs = [str(tmp_path / f"rank{r}.json") for r in range(WORLD)]
    port = _free_port()
    mp.start_processes(_worker_entry, args=(port, str(sample), str(tmp_path)), nprocs=WORLD, join=True,
                       start_method="spawn")  # raises if a rank fails
    res = [json.loads(Path(o).read_text()) for o in outs]

    with lsql.connect(sample) as db:
        m = db.manifest(SQL)
        full = db.dataset(m, cameras=[])
        by_index = {int(i): k for k, i in enumerate(m["index"].to_numpy())}
        want = sorted(m["index"].to_pylist())
        for epoch in EPOCHS:
            key = str(epoch)
            parts = [r["epochs"][key]["index"] for r in res]
            # disjoint and covering: every selected frame exactly once across the ranks
            assert sorted(parts[0] + parts[1]) == want
            assert not set(parts[0]) & set(parts[1])
            # all ranks agree on the whole partition (each saw the other's part through all_gather)
            for r in res:
                assert r["epochs"][key]["gathered"] == parts
            # and it is the partition shard_manifest gives in this process
            for rank in range(WORLD):
                assert parts[rank] == shard_manifest(m, rank, WORLD, epoch=epoch, seed=7)["index"].to_pylist()
            # whole episodes per rank
            ep = dict(zip(m["index"].to_pylist(), m["episode_index"].to_pylist()))
            assert not {ep[i] for i in parts[0]} & {ep[i] for i in parts[1]}
            # items read in the ranks equal the single-process dataset's items
            for r in res:
                for p in r["epochs"][key]["probe"]:
                    item = full[by_index[p["index"]]]
                    assert torch.equal(torch.tensor(p["action"], dtype=torch.float32), item["action"])
                    assert torch.equal(torch.tensor(p["state"], dtype=torch.float32), item["observation.state"])
        assert res[0]["epochs"]["0"]["index"] != res[0]["epochs"]["1"]["index"]  # a new partition per epoch
        for epoch in ("1", "2"):
            workers = res[0]["workers"][epoch] + res[1]["workers"][epoch]
            assert len(workers) == len(want) and sorted(workers) == want
            for rank in range(WORLD):  # a rank's workers together read exactly the rank's part of that epoch
                assert sorted(res[rank]["workers"][epoch]) == sorted(
                    shard_manifest(m, rank, WORLD, epoch=int(epoch), seed=7)["index"].to_pylist())


def _worker_entry(rank: int, port: int, root: str, out_dir: str) -> None:
    _rank_main(rank, port, root, str(Path(out_dir) / f"rank{rank}.json"))
