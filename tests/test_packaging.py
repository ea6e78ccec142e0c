"""A built wheel holds the whole package: every subpackage, the bundled named queries and doctor checks.

The tests otherwise run against the editable checkout, which finds any folder under lerobot_sql/ whether or not
pyproject.toml's explicit ``packages`` list names it; a user's ``pip install`` gets only what the wheel holds.
So: build the wheel, install it into an empty folder, and import and use it from a child interpreter started with
``-S`` (no site hooks, so the editable install's finder cannot stand in for a missing file).
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib, json, pkgutil, sys
sys.path[:0] = json.loads(sys.argv[1])
import lerobot_sql as lsql
mods = sorted(m.name for m in pkgutil.walk_packages(lsql.__path__, "lerobot_sql."))
for m in mods:
    if not m.endswith(".__main__"):  # importing it would run the CLI
        importlib.import_module(m)
from lerobot_sql._query import library
db = lsql.connect(sys.argv[2], cache_dir=sys.argv[3])
ds = db.dataset(db.named_query_sql("episodes_by_length", min_length=1, max_length=10**6))
item = ds[0]
print(json.dumps({"file": lsql.__file__, "modules": mods, "queries": sorted(q["name"] for q in library.list_queries()),
                  "doctor": len(list((library.BUNDLED / "doctor").glob("*.sql"))), "len": len(ds),
                  "keys": sorted(item)}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy of what the wheel is made of: setuptools reuses an in-tree build/ folder, which would hold
    # files of earlier builds (a package since dropped from the list would still be packed).
    src = tmp / "src"
    for name in ("lerobot_sql", "queries"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist")], check=True, capture_output=True, text=True, timeout=600)
    (whl,) = (tmp / "dist").glob("lerobot_sql-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp / "site"),
                    str(whl)], check=True, capture_output=True, text=True, timeout=600)
    return tmp


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_the_bundled_queries(installed, sample, tmp_path):
    paths = [str(installed / "site"), *site.getsitepackages()]
    r = subprocess.run([sys.executable, "-S", "-c", CHILD, json.dumps(paths), str(sample), str(tmp_path / "c")],
                       capture_output=True, text=True, cwd=installed, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(installed / "site")), got["file"]  # the wheel's copy, not the checkout
    in_tree = sorted("lerobot_sql." + ".".join(p.relative_to(ROOT / "lerobot_sql").with_suffix("").parts)
                     .removesuffix(".__init__") for p in (ROOT / "lerobot_sql").rglob("*.py")
                     if "__pycache__" not in p.parts and p.name != "__init__.py" or
                     (p.name == "__init__.py" and p.parent != ROOT / "lerobot_sql"))
    missing = sorted(set(in_tree) - set(got["modules"]) - {"lerobot_sql.cli.__main__"})
    assert not missing, f"modules of the checkout missing from the wheel: {missing}"
    bundled = sorted(p.stem for p in (ROOT / "queries").glob("*.sql"))
    assert set(bundled) <= set(got["queries"]), (bundled, got["queries"])
    assert got["doctor"] == len(list((ROOT / "queries" / "doctor").glob("*.sql"))) > 0
    assert got["len"] > 0 and "observation.images.front" in got["keys"]
