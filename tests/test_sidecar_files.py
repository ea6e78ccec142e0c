"""The JSON-to-table rule and the user's table files (lerobot_sql/_format/sidecar_files.py)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_sql as lsql
from lerobot_sql._format.sidecar_files import json_table, read_user_table, user_format


def test_json_documents_become_tables_by_their_shape():
    t, js = json_table({"reach": 0.25, "grasp": {"w": [1, 2]}, "nan": float("nan")})  # an object: key, value
    assert t.to_pydict() == {"key": ["reach", "grasp", "nan"], "value": ["0.25", '{"w":[1,2]}', "null"]}
    assert js == ["value"]
    rows = [{"a": 1, "b": "x", "c": True, "d": 1}, {"a": 2, "d": 2.5, "e": [1]}, {"a": None, "b": "y", "c": False}]
    t, js = json_table(rows)  # objects: a column per key, typed when every value is of one kind
    assert t.column_names == ["a", "b", "c", "d", "e"]
    assert [t.schema.field(c).type for c in "abcd"] == [pa.int64(), pa.string(), pa.bool_(), pa.float64()]
    assert t.to_pydict() == {"a": [1, 2, None], "b": ["x", None, "y"], "c": [True, None, False], "d": [1.0, 2.5, None],
                             "e": [None, "[1]", None]}
    assert js == ["e"]
    mixed, js = json_table([{"m": 1}, {"m": "1"}, {"m": True}, {"m": 2 ** 70}])  # no one kind: JSON text
    assert mixed["m"].to_pylist() == ["1", '"1"', "true", str(2 ** 70)] and js == ["m"]
    big, _ = json_table([{"n": 2 ** 70}, {"n": 1.5}])  # past int64, with fractions: DOUBLE
    assert big["n"].to_pylist() == [float(2 ** 70), 1.5]
    for doc, want in (([1, "a", None], ["1", '"a"', "null"]), ([], []), ("text", ['"text"']), (None, ["null"])):
        t, js = json_table(doc)
        assert t.column_names == ["value"] and t["value"].to_pylist() == want and js == ["value"]


def test_user_table_files_by_extension_or_format(tmp_path):
    want = {"episode_index": [1, 3], "score": [0.5, 0.9]}
    pq.write_table(pa.table(want), tmp_path / "k.parquet")
    (tmp_path / "k.csv").write_text("episode_index,score\n1,0.5\n3,0.9\n")
    (tmp_path / "k.json").write_text(json.dumps([{"episode_index": 1, "score": 0.5}, {"episode_index": 3, "score": 0.9}]))
    (tmp_path / "k.jsonl").write_text('{"episode_index": 1, "score": 0.5}\n\n{"episode_index": 3, "score": 0.9}\n')
    (tmp_path / "k.txt").write_text("episode_index,score\n1,0.5\n3,0.9\n")
    for name in ("k.parquet", "k.csv", "k.json", "k.jsonl"):
        t, js = read_user_table(tmp_path / name)
        assert t.to_pydict() == want and js == [], name
    assert read_user_table(tmp_path / "k.txt", format="csv")[0].to_pydict() == want
    with pytest.raises(ValueError, match=r"extension '\.txt'.*format="):
        read_user_table(tmp_path / "k.txt")
    with pytest.raises(ValueError, match="format='xls'"):
        user_format("k.xls", "xls")
    with pytest.raises(lsql.MissingFileError, match="no such file"):
        read_user_table(tmp_path / "gone.parquet")
    with pytest.raises(lsql.MissingFileError, match="is a folder"):
        read_user_table(tmp_path, format="parquet")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(lsql.DatasetFormatError, match=r"bad\.parquet: cannot be read as parquet"):
        read_user_table(tmp_path / "bad.parquet")
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(lsql.DatasetFormatError, match=r"bad\.jsonl:2: not valid JSON"):
        read_user_table(tmp_path / "bad.jsonl")
