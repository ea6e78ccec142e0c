"""errors.warn: every warning lerobot_sql gives is attributed to the user's line that called the public function
(its file and line in the warning), whatever path inside the package it came by. Fixed stacklevels pointed into
lerobot_sql (remote.py, views.py) or into the standard library for some call paths."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest

import lerobot_sql as lsql
from lerobot_sql.errors import warn


def _caught(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fn()
    return [w for w in rec if issubclass(w.category, UserWarning)]


def test_a_warning_names_the_callers_line(datasets, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(datasets / "small20", src)
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["observation.extra"] = {"dtype": "float32", "shape": [2], "names": None}
    (src / "meta/info.json").write_text(json.dumps(info))
    db = lsql.connect(src, cache_dir=tmp_path / "cache")
    # built on the first query, five calls deep inside the package (views -> connection -> db)
    rec = _caught(lambda: db.sql("SELECT count(*) FROM frames").fetchall())
    assert [w.filename for w in rec if "observation.extra" in str(w.message)] == [__file__]
    # a repeated frame in a training-set query: through dataset() -> plan.resolve
    db2 = lsql.connect(datasets / "small20", cache_dir=tmp_path / "c2")
    rec = _caught(lambda: db2.dataset("SELECT index FROM frames WHERE index < 3 UNION ALL SELECT 1", cameras=[]))
    hits = [w for w in rec if "more than once" in str(w.message)]
    assert hits and {w.filename for w in hits} == {__file__}


def test_warn_itself():
    def inner():
        warn("from inside")  # this test module is outside the package: the warning is this line's

    with pytest.warns(UserWarning, match="from inside") as rec:
        inner()
    assert rec[0].filename == __file__ and rec[0].lineno == inner.__code__.co_firstlineno + 1


def test_a_warning_raised_in_a_callback_through_a_library_names_the_callers_line():
    """The package calls a library (pyarrow's writer) that calls the package back (a generator of ours), which
    warns: the first frame outside the package is the library's, not the user's (one suite run attributed the export
    warning to pyarrow/parquet/core.py). The caller of the outermost package frame is the user's line."""
    import os

    pkg = os.path.dirname(lsql.__file__)
    ns: dict = {"warn": warn}
    exec(compile("def inner():\n    warn('deep inside')\n"
                 "def outer(lib):\n    return lib(inner)\n", os.path.join(pkg, "_fake_module.py"), "exec"), ns)
    exec(compile("def lib(callback):\n    return callback()\n", "/usr/lib/python3/fake_library.py", "exec"), ns)
    with pytest.warns(UserWarning, match="deep inside") as rec:
        ns["outer"](ns["lib"])  # the line the warning must name
    assert (rec[0].filename, rec[0].lineno) == (__file__, _line_of("ns[\"outer\"](ns[\"lib\"])"))


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)


def test_as_int_takes_integers_and_refuses_bools_floats_and_one_element_arrays():
    """The one test behind every "must be an integer" check (decoder options, ds[i], a sampler's consumed,
    limit(), episodes=[...])."""
    import numpy as np
    import torch

    from lerobot_sql.errors import as_int

    for v, want in [(3, 3), (np.int64(3), 3), (np.uint8(3), 3), (np.array(3), 3), (torch.tensor(3), 3), (-1, -1)]:
        assert as_int(v) == want and type(as_int(v)) is int
    for v in [True, False, np.bool_(True), torch.tensor(True), np.array(True), 1.0, np.float32(1), "1", None,
              np.array([3]), torch.tensor([3]), [3], torch.tensor(1.0)]:
        assert as_int(v) is None, v
