"""Cluster hand-off: Ray Data reads the exported manifest and map_batches yields exactly db.dataset()'s items."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql.torch.ray_data import Decoder, decode_batch, manifest_root, stack_items
from lerobot_sql.torch.shard import shard_manifest

REPO = Path(__file__).resolve().parents[1]
SQL = "SELECT episode_index, length AS ep_len FROM episodes WHERE episode_index IN (2, 5, 13) ORDER BY length"
DT = {"action": [-1 / 30, 0, 2 / 30], "observation.images.wrist": [-1 / 30, 0]}


@pytest.fixture(scope="module")
def exported(sample, tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "manifest.parquet"
    with lsql.connect(sample) as db:
        db.export_manifest(SQL, path)
        want = db.dataset(path, delta_timestamps=DT)
        yield path, want


def assert_row_equals_item(row: dict, item: dict) -> None:
    assert set(row) == set(item)
    for k, v in item.items():
        if hasattr(v, "numpy"):
            got = np.asarray(row[k])
            assert got.dtype == v.numpy().dtype and got.shape == tuple(v.shape), k
            np.testing.assert_array_equal(got, v.numpy(), err_msg=k)
        else:
            assert row[k] == v, k


def test_decoder_without_ray(exported, sample):
    """The decoder alone, on pyarrow / pandas / numpy-dict batches of arbitrary rows, in any order."""
    path, want = exported
    assert manifest_root(path) == str(Path(sample).resolve()) or Path(manifest_root(path)) == Path(sample)
    m = pq.read_table(path)
    rows = [len(m) - 1, 0, 117, 118, 400]
    batch = m.take(rows)
    dec = Decoder(path, delta_timestamps=DT)
    for form in (batch, batch.to_pandas(), {c: batch[c].to_numpy(zero_copy_only=False) for c in batch.column_names},
                 batch.replace_schema_metadata(None)):
        out = dec(form)
        assert set(out) == set(want[0])
        for j, r in enumerate(rows):
            assert_row_equals_item({k: v[j] for k, v in out.items()}, want[r])
    assert stack_items([]) == {}


def test_decoder_needs_a_manifest_or_root(tmp_path):
    with pytest.raises(ValueError, match="manifest"):
        Decoder()
    bare = tmp_path / "bare.parquet"
    pq.write_table(pq.read_table(REPO / "sample" / "small20" / "meta" / "tasks.parquet"), bare)
    with pytest.raises(ValueError, match="export_manifest"):
        Decoder(bare)


def test_decode_batch_reads_a_manifest_rewritten_at_the_same_path_anew(datasets, tmp_path):
    """decode_batch kept one Decoder per manifest path: the path rewritten with export_manifest(..., overwrite=True)
    from another dataset (multifile60 after small20) and decoded again in the same process (a Ray actor, a Spark
    worker, a notebook) gave small20's rows as multifile60's items, silently. The file's identity is now part of the
    key: the new rows are multifile60's items."""
    a, b = lsql.connect(datasets / "small20"), lsql.connect(datasets / "multifile60")
    m = tmp_path / "reused.parquet"
    a.export_manifest("SELECT index FROM frames WHERE index < 4", m)
    first = decode_batch(pq.read_table(m), manifest=m)
    for j in range(4):
        assert_row_equals_item({k: v[j] for k, v in first.items()}, a.dataset(m)[j])
    b.export_manifest("SELECT index FROM frames WHERE index IN (400, 401, 402, 403)", m, overwrite=True)
    second = decode_batch(pq.read_table(m), manifest=m)
    want = b.dataset(m)
    for j in range(4):
        assert_row_equals_item({k: v[j] for k, v in second.items()}, want[j])


def collect(ds) -> dict:
    """All rows of a Ray dataset as numpy columns (batches keep dtypes; single rows turn float32 into float)."""
    batches = list(ds.iter_batches(batch_size=None, batch_format="numpy"))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.fixture(scope="module")
def ray_local():
    # ray[data] is in the test-slow extra; CI's floor leg installs it and checks it imports before the tests run
    ray = pytest.importorskip("ray", reason="ray[data] is in the test-slow extra (pip install -e '.[test-slow]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "LSQL_CACHE_DIR": os.environ["LSQL_CACHE_DIR"]}})
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_map_batches_equals_dataset(exported, ray_local):
    path, want = exported
    ray = ray_local
    ds = ray.data.read_parquet(str(path)).map_batches(
        Decoder, fn_constructor_kwargs={"manifest": str(path), "delta_timestamps": DT},
        batch_format="pyarrow", batch_size=100, concurrency=1)  # 1 actor: the read tasks need the other CPU
    cols = collect(ds)
    assert len(cols["index"]) == len(want)
    for j in range(len(want)):
        assert_row_equals_item({k: v[j] for k, v in cols.items()}, want[j])


@pytest.mark.slow
def test_ray_function_form_and_shards(exported, ray_local, sample):
    """decode_batch as a plain function, over one rank's shard of the manifest (2 ranks cover the selection)."""
    path, want = exported
    ray = ray_local
    m = pq.read_table(path)
    pos = {int(i): j for j, i in enumerate(m["index"].to_numpy())}
    seen = []
    for rank in range(2):
        part = shard_manifest(m, rank, 2, epoch=3)
        ds = ray.data.from_arrow(part).map_batches(
            decode_batch, fn_kwargs={"manifest": str(path), "delta_timestamps": DT}, batch_format="pandas",
            batch_size=64)
        cols = collect(ds)
        assert cols["index"].tolist() == part["index"].to_pylist()
        for j in range(0, len(cols["index"]), 25):
            assert_row_equals_item({k: v[j] for k, v in cols.items()}, want[pos[int(cols["index"][j])]])
        seen += cols["index"].tolist()
    assert sorted(seen) == sorted(m["index"].to_pylist())
