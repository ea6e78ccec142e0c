"""What a new user hit following the README (errors that blamed the wrong thing, options that silently did nothing):
each test fails on the code before its fix. Only the in-repo datasets (sample/, tests/data) are used."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import lerobot_sql as lsql


def test_extra_columns_keep_their_arrow_dtype_in_items_and_batches(sample):
    """float32 rounded 123456789 + 2 to 123456792 and a Unix time to 1.7e9: each extra keeps its own dtype."""
    db = lsql.connect(sample)
    ds = db.dataset("SELECT index, CASE WHEN index % 2 = 0 THEN 123456789 + index END AS id, "
                    "1700000000.123::DOUBLE AS wall_s, 123456789123::BIGINT AS big, 0.1::FLOAT AS f32, "
                    "[1700000000.5, 2.0]::DOUBLE[] AS vec, 2.25::DECIMAL(6,2) AS dec "
                    "FROM frames WHERE episode_index = 0 ORDER BY index", cameras=[])
    it = ds[2]
    assert it["id"].dtype == torch.float64 and it["id"].item() == 123456791.0  # NULL-holding int: float64, NaN
    assert math.isnan(ds[1]["id"].item())
    assert it["wall_s"].dtype == torch.float64 and it["wall_s"].item() == 1700000000.123
    assert it["big"].dtype == torch.int64 and it["big"].item() == 123456789123
    assert it["f32"].dtype == torch.float32
    assert it["vec"].dtype == torch.float64 and it["vec"].tolist() == [1700000000.5, 2.0]
    assert it["dec"].dtype == torch.float64 and it["dec"].item() == 2.25
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert batch["id"].dtype == torch.float64 and batch["id"][0].item() == 123456789.0
    assert batch["wall_s"].tolist() == [1700000000.123] * 4
    assert batch["big"].dtype == torch.int64 and batch["big"].tolist() == [123456789123] * 4


@pytest.mark.parametrize("sql, column", [
    ("SELECT index, 0.0 AS action FROM frames WHERE index = 400", "action"),
    ("SELECT index, 'x' AS timestamp FROM frames WHERE index < 3", "timestamp"),
    ("SELECT index, [1, 2] AS \"observation.state\" FROM frames WHERE index < 3", "observation.state"),
])
def test_a_type_mistake_in_a_feature_named_column_blames_the_query(sample, sql, column):
    """These raised DatasetFormatError "cannot be read as Parquet ... Re-download it" about intact files."""
    db = lsql.connect(sample)
    with pytest.raises(lsql.ResultContractError, match=rf"result column '{column}' .* alias") as ei:
        db.dataset(sql, cameras=[])
    assert "Parquet" not in str(ei.value) and "Re-download" not in str(ei.value)
    assert ei.value.__cause__ is not None


@pytest.mark.parametrize("sql, column", [
    ("SELECT 0 AS episode_index, '1.5' AS start_s, '2.0' AS end_s", "start_s"),
    ("SELECT 'x' AS index", "index"),
    ("SELECT '1' AS episode_index", "episode_index"),
])
def test_contract_columns_of_the_wrong_type_are_refused_naming_the_cast(sample, sql, column):
    db = lsql.connect(sample)
    with pytest.raises(lsql.ResultContractError, match=rf"result column {column} must be .*CAST\(x AS") as ei:
        db.dataset(sql, cameras=[])
    assert "Parquet" not in str(ei.value)


def test_a_type_error_from_the_query_is_not_blamed_on_files(sample):
    """unreadable_error: with every footer intact, a DuckDB Conversion error while the user's result is resolved is
    the result's, not a data file's."""
    import duckdb

    from lerobot_sql._catalog.connection import unreadable_error

    db = lsql.connect(sample)
    cause = duckdb.ConversionException("Conversion Error: Could not convert string 'x' to INT64")
    err = unreadable_error(db.source, db.layout, cause, sql="SELECT ...")
    assert type(err) is lsql.ResultContractError and "SELECT ..." in str(err)
    # without a user query (opening the views), it stays a file error
    assert type(unreadable_error(db.source, db.layout, cause)) is lsql.DatasetFormatError


@pytest.mark.parametrize("sql, hint", [
    ("SELECT episode_index, 1.0 AS start_s FROM episodes", "has start_s but no end_s"),
    ("SELECT episode_index, 2.0 AS end_s FROM episodes", "has end_s but no start_s"),
    ("SELECT episode_index, 1.0 AS start_sec, 2.0 AS end_s FROM episodes", "Did you mean 'start_s'"),
    ('SELECT episode_index, 1.0 AS start, 2.0 AS "end" FROM episodes', r'"start" AS start_s, "end" AS end_s'),
    ("SELECT episode_index, 1.0 AS t0, 2.0 AS t1 FROM episodes", r'"t0" AS start_s, "t1" AS end_s'),
    ("SELECT episode_index, 1.0 AS start_sec, 2.0 AS end_sec FROM episodes", "start_sec"),
])
def test_misnamed_window_columns_do_not_select_whole_episodes(sample, sql, hint):
    """Each of these silently gave every frame of every episode."""
    db = lsql.connect(sample)
    with pytest.raises(lsql.ResultContractError, match="start_s") as ei:
        db.dataset(sql, cameras=[])
    assert hint in str(ei.value) and "seconds" in str(ei.value)


def test_window_bounds_beside_index_warn_that_each_row_is_one_sample(sample):
    """`SELECT *, t AS start_s, t + 1 AS end_s` over a view with `index` silently became one sample per row, the
    bounds kept as extras (found by a new user): the documented order (index first) stays, with a warning."""
    db = lsql.connect(sample)
    sql = ("SELECT index, episode_index, timestamp AS start_s, timestamp + 1.0 AS end_s FROM frames "
           "WHERE episode_index = 0 AND frame_index IN (0, 30)")
    with pytest.warns(UserWarning, match=r"has `index`, so it is read as one sample per row.*start_s and end_s "
                                         r"are kept as extra columns.*EXCLUDE \(index\)"):
        ds = db.dataset(sql, cameras=[])
    assert len(ds) == 2 and ds[1]["end_s"].item() == pytest.approx(2.0)
    with warnings.catch_warnings():  # the same rows with the bounds under other names: no warning
        warnings.simplefilter("error")
        assert len(db.dataset(sql.replace("AS start_s", "AS t0").replace("AS end_s", "AS t1"), cameras=[])) == 2
        # and without index they are the windows: 1 s of 30 fps from each start
        assert len(db.dataset("SELECT episode_index, timestamp AS start_s, timestamp + 1.0 AS end_s FROM frames "
                              "WHERE episode_index = 0 AND frame_index IN (0, 30)", cameras=[])) == 60


def test_extra_columns_that_only_resemble_bounds_are_kept(sample):
    """The near-miss check must not refuse ordinary extras (`state`, `stage`, `length`)."""
    db = lsql.connect(sample)
    ds = db.dataset("SELECT episode_index, 1 AS state, 2 AS stage, length FROM episodes WHERE episode_index = 0",
                    cameras=[])
    assert len(ds) == 348 and ds[0]["state"].item() == 1 and ds[0]["length"].item() == 348


def test_null_episode_index_is_a_contract_error_without_numpy_warnings(sample):
    db = lsql.connect(sample)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(lsql.ResultContractError, match="episode_index is NULL in row 0"):
            db.dataset("SELECT NULL::BIGINT AS episode_index", cameras=[])
        with pytest.raises(lsql.ResultContractError, match="index is NULL in row 1"):
            db.dataset("SELECT * FROM (VALUES (0), (NULL)) t(index)", cameras=[])


def test_item_indices_must_be_integers(sample):
    db = lsql.connect(sample)
    ds = db.dataset(episodes=[0], cameras=[])
    for bad in (1.0, "a", "0", None, (0, 1), [0, 1]):
        with pytest.raises(TypeError, match=r"indices must be integers .*or slices.*not (float|str|NoneType|tuple|list)"):
            ds[bad]
    import numpy as np
    assert ds[np.int64(3)]["frame_index"].item() == 3 and ds[torch.tensor(4)]["frame_index"].item() == 4


def test_item_slices_give_lists_of_items_as_lerobot_06(sample):
    """lerobot 0.6's LeRobotDataset.__getitem__ takes a slice: [self[i] for i in range(*idx.indices(len(self)))]."""
    db = lsql.connect(sample)
    ds = db.dataset(episodes=[0, 1])  # with cameras: the items are the integer-indexed ones
    n = len(ds)
    for sl, want in ((slice(0, 3), [0, 1, 2]), (slice(None, None, 100), list(range(0, n, 100))),
                     (slice(-2, None), [n - 2, n - 1]), (slice(5, 2), []), (slice(n - 1, n + 10), [n - 1])):
        got = ds[sl]
        assert isinstance(got, list) and [x["index"].item() for x in got] == [ds[j]["index"].item() for j in want]
    a, b = ds[2:4]
    for key, v in ds[2].items():
        assert torch.equal(a[key], v) if isinstance(v, torch.Tensor) else a[key] == v
    assert torch.equal(b["observation.images.front"], ds[3]["observation.images.front"])
    with pytest.raises(ValueError, match="slice step cannot be zero"):
        ds[::0]


@pytest.mark.parametrize("tol", [0, 0.0, -0.0, -1, -1e-4, float("nan"), float("inf"), float("-inf")])
def test_tolerance_must_be_finite_and_positive(sample, tol):
    """0 included: lerobot (0.4.4 and 0.6) accepts a frame only if |ts - pts| < tolerance_s, strictly, so 0 makes
    every video item fail there; here it served the exact-pts frames and raised FrameNotFoundError for the rest."""
    db = lsql.connect(sample)
    with pytest.raises(ValueError, match=r"tolerance_s must be a finite number of seconds > 0 .*1e-4"):
        db.dataset(episodes=[0], tolerance_s=tol)
    with pytest.raises(ValueError, match=r"tolerance_s must be a finite number of seconds > 0"):
        db.dataset(episodes=[0], cameras=[], tolerance_s=tol)
    assert len(db.dataset(episodes=[0], cameras=[], tolerance_s=1e-9)) == 348


def test_add_query_dir_of_a_missing_folder_is_refused(sample, tmp_path):
    db = lsql.connect(sample)
    with pytest.raises(lsql.MissingFileError, match=r"nodir .*does not exist"):
        db.add_query_dir(tmp_path / "nodir")
    (tmp_path / "f.sql").write_text("SELECT 1")
    with pytest.raises(lsql.MissingFileError, match="is a file, not a folder"):
        db.add_query_dir(tmp_path / "f.sql")
    db.add_query_dir(tmp_path)  # an existing folder is fine


def test_a_manifest_is_refused_through_another_dataset(sample, datasets, tmp_path):
    """multifile60's manifest opened through small20 served small20's frames at multifile60's file rows."""
    import shutil

    import pyarrow.parquet as pq

    other = lsql.connect(datasets / "multifile60")
    path = tmp_path / "mm.parquet"
    other.export_manifest("SELECT index FROM frames WHERE episode_index = 3 ORDER BY index", path)
    with pytest.raises(lsql.ResultContractError, match="manifest of the dataset at .*multifile60.*opened through "
                                                       "the dataset at .*small20") as ei:
        lsql.connect(sample).dataset(path, cameras=[])
    assert "export_manifest" in str(ei.value)
    with pytest.raises(lsql.ResultContractError, match="multifile60"):  # a table read by the user, too
        lsql.connect(sample).dataset(pq.read_table(path), cameras=[])
    # its own dataset, and a copy of it elsewhere (same info.json), read the same frames
    want = [other.sql("SELECT index FROM frames WHERE episode_index = 3 ORDER BY index").fetchall()[k][0]
            for k in (0, 5)]
    assert [int(other.dataset(path, cameras=[])[k]["index"]) for k in (0, 5)] == want
    copy = tmp_path / "copy"
    shutil.copytree(datasets / "multifile60", copy)
    ds = lsql.connect(copy).dataset(path, cameras=[])
    assert [int(ds[k]["index"]) for k in (0, 5)] == want and int(ds[0]["episode_index"]) == 3


def _hub_down(monkeypatch, exc):
    """No test touches the network: the Hub's revision lookup raises ``exc``."""
    import huggingface_hub

    def refs(self, *a, **k):
        raise exc

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_refs", refs)
    for v in ("LSQL_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(v, raising=False)


def _not_found():
    try:
        from huggingface_hub.errors import RepositoryNotFoundError
    except ImportError:  # huggingface_hub 0.24 has it only in huggingface_hub.utils
        from huggingface_hub.utils import RepositoryNotFoundError

    e = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its __init__ wants an HTTP response
    Exception.__init__(e, "404 Client Error. Repository Not Found for url: https://huggingface.co/api/datasets/x")
    return e


def test_a_mistyped_path_is_not_a_raw_network_traceback(monkeypatch, tmp_path):
    """`lsql.connect("sample/smal20")` was taken as a Hub repo id and raised the HTTP library's ConnectError."""
    monkeypatch.chdir(tmp_path)
    _hub_down(monkeypatch, ConnectionError("[Errno -3] Temporary failure in name resolution"))
    with pytest.raises(lsql.RemoteIOError, match=r"no local folder sample/smal20 \(resolved to "
                                                 rf"{tmp_path}/sample/smal20\); as a Hub repo id .*name resolution") \
            as ei:
        lsql.connect("sample/smal20")
    assert isinstance(ei.value.__cause__, ConnectionError)
    _hub_down(monkeypatch, _not_found())
    with pytest.raises(lsql.MissingFileError, match=r"no local folder sample/smal20 .*Repository Not Found"):
        lsql.connect("sample/smal20")
    # a folder spelt nearly so exists: named, segment by segment (a misspelt path reads as org/name)
    (tmp_path / "sample" / "small20").mkdir(parents=True)
    _hub_down(monkeypatch, ConnectionError("[Errno -3] Temporary failure in name resolution"))
    # beside a local folder `sample`, the missing file is the error even when the Hub cannot be asked (it was a
    # RemoteIOError, which `except FileNotFoundError` missed)
    with pytest.raises(lsql.MissingFileError, match=r"no local folder sample/nope \(resolved to .*name resolution"):
        lsql.connect("sample/nope")
    with pytest.raises(lsql.RemoteIOError, match=r"no local folder qqq/zzz"):  # no folder qqq: the Hub reading
        lsql.connect("qqq/zzz")
    _hub_down(monkeypatch, _not_found())
    for typo in ("sample/smal20", "sampel/small20"):
        with pytest.raises(lsql.MissingFileError, match=rf"no local folder {typo} \(resolved to .*\) \(did you "
                                                        r"mean 'sample/small20'\?\); as a Hub repo id"):
            lsql.connect(typo)
    with pytest.raises(lsql.MissingFileError, match=r"no local folder qqq/zzz \(resolved to [^(]*\); as a Hub"):
        lsql.connect("qqq/zzz")


def test_hf_url_offline_is_a_remote_io_error(monkeypatch):
    _hub_down(monkeypatch, ConnectionError("connection refused"))
    with pytest.raises(lsql.RemoteIOError, match=r"hf://datasets/someorg/nothere: cannot resolve .*connection refused"):
        lsql.connect("hf://datasets/someorg/nothere")


def test_cli_mistyped_path_prints_one_error_and_one_hint(monkeypatch, tmp_path, capsys):
    from lerobot_sql.cli import commands as cli

    monkeypatch.chdir(tmp_path)
    _hub_down(monkeypatch, ConnectionError("[Errno -3] Temporary failure in name resolution"))
    monkeypatch.delenv("LSQL_DEBUG", raising=False)
    assert cli.main(["info", "sample/smal20"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: no local folder sample/smal20")
    assert err[1].startswith("hint: DATASET is a local folder holding meta/info.json")


def test_whole_number_keys_of_other_integer_types_are_still_accepted(sample):
    """The type check keeps HUGEINT (sum(), arrives as DECIMAL(38, 0)) and small ints usable as keys."""
    db = lsql.connect(sample)
    assert len(db.dataset("SELECT 3::HUGEINT AS episode_index", cameras=[])) == 390
    assert int(db.dataset("SELECT sum(2) AS index", cameras=[])[0]["index"]) == 2
    assert len(db.dataset("SELECT 3::UTINYINT AS episode_index, 0.5 AS start_s, 1::INT AS end_s", cameras=[])) == 15


def test_image_transforms_that_is_not_callable_is_refused_at_the_open(sample):
    """``image_transforms="resize"`` was accepted and failed at the first item as ``'str' object is not callable``,
    far from the call that set it (in a DataLoader worker, after the fork)."""
    db = lsql.connect(sample)
    with pytest.raises(TypeError, match=r"image_transforms must be a callable .*got 'resize'"):
        db.dataset(episodes=[0], image_transforms="resize")
    assert db.dataset(episodes=[0], image_transforms=lambda x: x + 0)[0]["observation.images.front"].shape[0] == 3


@pytest.mark.parametrize("sql", [None, "SELECT index FROM frames LIMIT 3",
                                 "SELECT episode_index, 0.0 AS start_s, 1.0 AS end_s FROM episodes"])
def test_no_frames_because_the_data_files_are_missing_says_so(sample, tmp_path, sql):
    """A copy without data/: the error quoted only the (internal) SQL; the cause was in warnings given at connect
    (found by a new user)."""
    import shutil

    shutil.copytree(sample, tmp_path / "d", ignore=shutil.ignore_patterns("data"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the connect-time warnings, tested elsewhere
        db = lsql.connect(tmp_path / "d")
        with pytest.raises(lsql.ResultContractError, match=r"1 data file\(s\) that meta/episodes points to are "
                                                           r"missing, e.g. .*data/chunk-000/file-000.parquet.*"
                                                           r"download data/ again"):
            db.dataset(sql)
    with pytest.raises(lsql.ResultContractError) as e:  # with the data there, an empty result has no such note
        lsql.connect(sample).dataset("SELECT index FROM frames WHERE index < 0")
    assert "missing" not in str(e.value)
