"""Sidecar tables as views (lerobot_sql/_catalog/sidecars.py): the files a dataset carries beside lerobot's metadata,
named by a stated rule, read only when a query names them, local and remote; checked against the files read with
pyarrow and json."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from http_range_server import RangeServer

PROPORTIONS = {"reach": 0.25, "grasp": 0.5, "lift it, then 'place'": 0.25}
CURATION = [{"camera": "observation.images.front", "keep": True, "score": 1, "notes": None},
            {"camera": "observation.images.wrist", "keep": False, "score": 0.5, "flags": ["blur", 2]}]


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LSQL_CACHE_DIR", str(tmp_path / "cache"))


def _sarm_progress(root: Path) -> pa.Table:
    """sarm_progress.parquet as lerobot 0.6.1's compute_rabc_weights writes it (rewards/sarm): one row per frame,
    sorted by index, float32 progress with NaN where not computed, the reward model in the schema metadata."""
    t = pq.read_table(root / "data/chunk-000/file-000.parquet", columns=["index", "episode_index", "frame_index"])
    rng = np.random.default_rng(0)
    sparse = rng.random(t.num_rows, dtype=np.float32)
    sparse[::7] = np.nan
    out = t.append_column("progress_sparse", pa.array(sparse)).append_column(
        "progress_dense", pa.array(rng.random(t.num_rows, dtype=np.float32)))
    return out.replace_schema_metadata({b"reward_model_path": b"org/sarm"})


def _with_sidecars(datasets: Path, dst: Path, name: str = "small20") -> Path:
    shutil.copytree(datasets / name, dst)
    pq.write_table(_sarm_progress(dst), dst / "sarm_progress.parquet")  # where lerobot 0.6.1 writes it: the root
    (dst / "meta/temporal_proportions_sparse.json").write_text(json.dumps(PROPORTIONS, indent=2))
    (dst / "meta/camera_curation.json").write_text(json.dumps(CURATION))
    pq.write_table(pa.table({"episode_index": [0, 0, 1], "subtask": ["reach", "grasp", "reach"],
                             "start_s": [0.0, 1.0, 0.0]}), dst / "meta/subtasks.parquet")
    return dst


def _rows(table: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in table.to_pylist()]


def _same(a, b) -> bool:
    return all((x == y) or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(a, b)) and len(a) == len(b)


def _check_values(db, root: Path) -> None:
    want = _rows(pq.read_table(root / "sarm_progress.parquet"))
    got = db.sql("SELECT * FROM sarm_progress").fetchall()
    assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    assert db.sql("SELECT key, value::DOUBLE FROM temporal_proportions_sparse").fetchall() == list(PROPORTIONS.items())
    got = db.sql("SELECT camera, keep, score, notes, flags FROM camera_curation").fetchall()
    assert got == [("observation.images.front", True, 1.0, None, None),
                   ("observation.images.wrist", False, 0.5, None, '["blur",2]')]
    assert db.sql("SELECT * FROM subtasks").fetchall() == _rows(pq.read_table(root / "meta/subtasks.parquet"))


def test_sidecar_files_are_views_of_their_rows_and_join_the_frames(datasets, tmp_path):
    root = _with_sidecars(datasets, tmp_path / "ds")
    db = lsql.connect(root)
    assert {"sarm_progress", "temporal_proportions_sparse", "camera_curation", "subtasks"} <= set(db.views())
    assert db.sql("SELECT view, path, format FROM sidecars").fetchall() == [
        ("subtasks", "meta/subtasks.parquet", "parquet"), ("camera_curation", "meta/camera_curation.json", "json"),
        ("temporal_proportions_sparse", "meta/temporal_proportions_sparse.json", "json"),
        ("sarm_progress", "sarm_progress.parquet", "parquet")]
    _check_values(db, root)
    # the per-frame progress joins the frames in one line, and a selection by it becomes a training set
    n = db.sql("SELECT count(*) FROM frames JOIN sarm_progress USING (index) WHERE progress_dense > 0.5").fetchall()
    t = pq.read_table(root / "sarm_progress.parquet")
    assert n == [(int((t["progress_dense"].to_numpy() > 0.5).sum()),)]
    ds = db.dataset("SELECT index FROM frames JOIN sarm_progress USING (index) WHERE progress_dense > 0.5",
                    cameras=[])
    assert len(ds) == n[0][0]
    # the standard files are no sidecars
    assert not {"info", "stats", "tasks"} & {r[0] for r in db.sql("SELECT view FROM sidecars").fetchall()} - {"tasks"}
    assert "lerobot_sql_export" not in db.views()


HOSTILE = {
    "meta/it's; DROP VIEW frames; --.parquet": "it_s__drop_view_frames____",
    'meta/q"uote.json': "q_uote",
    "meta/order.parquet": "sidecar_order",          # an SQL keyword
    "meta/frames.parquet": "sidecar_frames",        # one of lerobot_sql's views
    "meta/language.json": "sidecar_language",
    "meta/2024 Scores.parquet": "sidecar_2024_scores",
    "meta/Scores.parquet": "scores",
    "meta/scores.json": "scores_2",                 # the same name once sanitized: numbered in listing order
    "scores.parquet": "scores_3",
    "meta/a*.parquet": "a_",                        # glob characters: the file alone, not a pattern
    "meta/ab.parquet": "ab",
    "meta/run[1].parquet": "run_1_",
    "meta/__x.parquet": "sidecar___x",
    "meta/ünï.parquet": "sidecar__n_",
}


def test_sidecar_names_follow_the_rule_and_hostile_file_names_stay_one_literal(datasets, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    for i, rel in enumerate(HOSTILE):
        if rel.endswith(".json"):
            (root / rel).write_text(json.dumps([{"i": i}]))
        else:
            pq.write_table(pa.table({"i": [i]}), root / rel)
    db = lsql.connect(root)
    assert dict(db.sql("SELECT path, view FROM sidecars").fetchall()) == HOSTILE
    for i, (rel, view) in enumerate(HOSTILE.items()):
        # each view holds its own file's one row: no file name became SQL (a quote, a ;) or a glob (a*, [1])
        assert db.sql(f'SELECT i FROM "{view}"').fetchall() == [(i,)], rel
    assert db.sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]


def test_sidecars_are_listed_without_a_read_and_read_when_a_query_names_them(datasets, tmp_path):
    srv_root = tmp_path / "srv"
    root = _with_sidecars(datasets, srv_root / "ds")
    (root / "meta/not_known.json").write_text("[]")
    with RangeServer(srv_root) as srv:
        db = lsql.connect(f"{srv.url}/ds")
        assert db.sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]
        views = db.views()
        # plain HTTP cannot list: the known names are found (HEAD), another file is not there
        assert {"sarm_progress", "temporal_proportions_sparse", "camera_curation", "subtasks"} <= set(views)
        assert "not_known" not in views
        sidecar_files = {"ds/sarm_progress.parquet", "ds/meta/temporal_proportions_sparse.json",
                         "ds/meta/camera_curation.json", "ds/meta/subtasks.parquet"}
        assert not sidecar_files & {e[0] for e in srv.log}  # listed, not read
        assert db.sql("SELECT count(*) FROM sarm_progress").fetchall() == [(4762,)]
        read = {e[0] for e in srv.log}
        assert "ds/sarm_progress.parquet" in read and not (sidecar_files - {"ds/sarm_progress.parquet"}) & read
        _check_values(db, root)


def test_sidecars_of_a_listing_remote_root_s3(datasets, tmp_path):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    root = _with_sidecars(datasets, tmp_path / "ds", "h264_20")
    (root / "meta/not_known.json").write_text(json.dumps({"a": [1]}))
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket="robots")
        for p in root.rglob("*"):
            if p.is_file():
                client.upload_file(str(p), "robots", f"ds/{p.relative_to(root)}")
        opts = {"key": "testing", "secret": "testing",
                "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
        db = lsql.connect("s3://robots/ds", storage_options=opts)
        _check_values(db, root)
        assert db.sql("SELECT key, value FROM not_known").fetchall() == [("a", "[1]")]  # a listing finds any name
    finally:
        server.stop()


def test_a_broken_sidecar_is_named_when_read_and_the_other_views_stay_readable(datasets, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    (root / "meta/bad.json").write_text('{"a": 1,')
    (root / "meta/torn.parquet").write_bytes(b"PAR1 not really")
    (root / "meta/big.json").write_text("[]")
    db = lsql.connect(root)
    assert db.sql("SELECT count(*) FROM episodes").fetchall() == [(20,)]  # listing them read none
    with pytest.raises(lsql.DatasetFormatError, match=r"meta/bad\.json: not valid JSON"):
        db.sql("SELECT * FROM bad").fetchall()
    with pytest.raises(lsql.DatasetFormatError, match=r"meta/torn\.parquet: cannot be read as Parquet"):
        db.sql("SELECT * FROM torn").fetchall()
    assert db.sql("SELECT count(*) FROM frames").fetchall() == [(4762,)]
    from lerobot_sql._format import sidecar_files

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sidecar_files, "MAX_JSON_BYTES", 1)
        with pytest.raises(lsql.DatasetFormatError, match=r"meta/big\.json: 2 bytes of JSON.*as Parquet"):
            db.sql("SELECT * FROM big").fetchall()


def test_a_sidecar_symlinked_out_of_the_dataset_is_refused(datasets, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(datasets / "small20", root)
    secret = tmp_path / "outside"
    secret.mkdir()
    pq.write_table(pa.table({"secret": ["x"]}), secret / "s.parquet")
    (secret / "s.json").write_text('{"secret": 1}')
    os.symlink(secret / "s.parquet", root / "meta/leak.parquet")
    os.symlink(secret / "s.json", root / "meta/leak2.json")
    db = lsql.connect(root)
    with pytest.warns(UserWarning, match="symlinks to files outside"):
        db.views()
    for view in ("leak", "leak2"):
        with pytest.raises(lsql.DatasetFormatError, match="outside|leaves"):
            db.sql(f"SELECT * FROM {view}").fetchall()


def test_a_collections_sidecar_view_spans_the_datasets_that_have_the_file(datasets, tmp_path):
    a = _with_sidecars(datasets, tmp_path / "a")
    b = _with_sidecars(datasets, tmp_path / "b", "h264_20")
    (b / "meta/subtasks.parquet").unlink()
    coll = lsql.connect_many({"a": a, "b": b, "plain": datasets / "multifile60"})
    got = coll.sql("SELECT dataset, count(*) FROM sarm_progress GROUP BY ALL ORDER BY 1").fetchall()
    assert got == [("a", pq.read_metadata(a / "sarm_progress.parquet").num_rows),
                   ("b", pq.read_metadata(b / "sarm_progress.parquet").num_rows)]
    assert coll.sql("SELECT DISTINCT dataset FROM subtasks").fetchall() == [("a",)]
    assert coll.sql("SELECT dataset, count(*) FROM sidecars GROUP BY ALL ORDER BY 1").fetchall() == [("a", 4), ("b", 3)]
    assert coll.sql("SELECT count(*) FROM temporal_proportions_sparse").fetchall() == [(2 * len(PROPORTIONS),)]


def test_a_broken_sidecar_fails_only_the_queries_that_read_it(datasets, tmp_path):
    """Hostile review 20, M1/M3: a sidecar was built whenever its name appeared as a word anywhere in the SQL, so a
    broken meta/episode_index.json failed `SELECT episode_index FROM episodes`, and a folder named meta/length.json
    gave a raw IsADirectoryError. Now a build's error waits for the query that reads the view, typed and naming
    the file."""
    root = tmp_path / "s"
    shutil.copytree(datasets / "small20", root)
    (root / "meta" / "episode_index.json").write_text("{not json")
    (root / "meta" / "length.json").mkdir()
    db = lsql.connect(root)
    assert db.sql("SELECT max(episode_index), max(length), 'episode_index' FROM episodes").fetchall()[0][0] == 19
    for name in ("episode_index", "length"):
        view = db.sql(f"SELECT view FROM sidecars WHERE path LIKE '%{name}.json'").fetchall()[0][0]
        with pytest.raises(lsql.DatasetFormatError, match=f"{name}.json"):
            db.sql(f"SELECT * FROM {view}").fetchall()


@pytest.mark.parametrize("rows, says", [([{"A": 1, "a": 2}], "differ only in case"), ([{"": 1}], "empty or holds NUL"),
                                        ([{"x\u0000y": 1}], "empty or holds NUL"), ([{}, {}], "holds no column")])
def test_sidecar_and_attached_columns_sql_cannot_tell_apart_are_refused(datasets, tmp_path, rows, says):
    """Hostile review 20, H4/M3: columns "A" and "a" read "A"'s values twice (DuckDB binds names case-insensitively),
    silently; an empty or NUL name and a table of no columns were raw DuckDB errors."""
    root = tmp_path / "s"
    shutil.copytree(datasets / "small20", root)
    (root / "meta" / "scores.json").write_text(json.dumps(rows))
    db = lsql.connect(root)
    with pytest.raises(lsql.DatasetFormatError, match=says):
        db.sql("SELECT * FROM scores").fetchall()
    own = tmp_path / "keep.json"
    own.write_text(json.dumps(rows))
    with pytest.raises(lsql.DatasetFormatError, match=says):
        db.attach("keep", own)
