"""The linter as a test: `ruff check` (rules and exceptions in pyproject.toml's [tool.ruff]) over the package, the tests
and the benchmarks, so a finding fails the fast tier, and CI, like a failing test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    """Unused imports and names, undefined names, unsorted imports, closures over loop variables, mutable default
    arguments... (F, E9, B, I at 120 columns). Fix what it says, or `ruff check --fix` for the fixable ones."""
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (it is in the test extra: pip install -e '.[test]')")
    r = subprocess.run([exe, "check", "--output-format", "concise", "lerobot_sql", "tests", "benchmarks"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
