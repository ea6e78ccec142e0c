"""The dependency ranges in pyproject.toml are the ones CI really runs, and they install next to lerobot.

constraints-floor.txt pins every runtime dependency at pyproject.toml's lower bound (PyAV at the newest 15.x that
lerobot pins; the set the suite is run on at the low end), constraints.txt the newest releases. These tests keep the
three files consistent, so a floor cannot be claimed in pyproject.toml without the floor set naming it, and check
that each range still admits what lerobot 0.4.4 / 0.6.1 (and the `datasets` 4.x they need) make users install.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import duckdb
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from lerobot_sql._query.sqltext import literal

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11; CI runs 3.11

ROOT = Path(__file__).resolve().parent.parent

# What lerobot's own metadata makes its users install (Requires-Dist of lerobot 0.4.4 and 0.6.1, and of datasets
# 4.0.0 / 4.8.5, which they require), as versions that must satisfy our ranges. Read from the wheels' METADATA:
#   lerobot 0.4.4: av>=15,<16; datasets>=4,<5; huggingface-hub>=0.34.2,<0.36; torch>=2.2.1,<2.11
#   lerobot 0.6.1 (Python >= 3.12): av>=15,<16; numpy>=2,<2.3; pandas>=2,<3; pyarrow>=21,<30; Pillow>=10,<13;
#                  huggingface-hub>=1.6,<2; tqdm>=4.66,<5; datasets>=4.8,<5
#   datasets 4.0.0: pyarrow>=15; fsspec[http]>=2023.1,<=2025.3.0    datasets 4.8.5: pyarrow>=21; fsspec<=2026.2.0
LEROBOT_USERS = {
    "av": ["15.1.0"],  # the newest 15.x, what pip resolves for av>=15,<16
    "pyarrow": ["21.0.0", "29.0.0"],
    "numpy": ["2.0.0", "2.2.6"],
    "pandas": ["2.0.0", "2.3.3"],
    "pillow": ["10.0.0", "12.3.0"],
    "fsspec": ["2025.3.0", "2026.2.0"],
    "huggingface_hub": ["0.34.2", "0.35.3", "1.6.0"],
    "tqdm": ["4.66.0"],
    "torch": ["2.10.0", "2.11.0"],
}

# torch is the one dependency not tested at its floor: only the 2.13.0 CPU wheel is installable here, and raising
# the floor to it would refuse lerobot's torch < 2.11 (see pyproject.toml).
NOT_AT_FLOOR = {"torch"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_norm(r.name): r for r in map(Requirement, project["dependencies"])}


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"{path.name}: {line!r} is not a NAME==VERSION pin"
            pins[_norm(name)] = ver
    return pins


def _floor(req: Requirement) -> str | None:
    lows = [s.version for s in req.specifier if s.operator in (">=", "==", "~=")]
    return min(lows, key=Version) if lows else None


def test_floor_constraints_pin_every_runtime_dependency_at_its_lower_bound():
    reqs, pins = _requirements(), _pins(ROOT / "constraints-floor.txt")
    for name, req in reqs.items():
        assert name in pins, f"constraints-floor.txt does not pin {name}: CI would not test {req}'s floor"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req}"
        if name not in NOT_AT_FLOOR:
            assert Version(pins[name]) == Version(_floor(req)), (
                f"pyproject.toml claims {req} but CI's floor leg runs {name}=={pins[name]}: "
                "change both together, after the suite passed on the new floor")


def test_newest_constraints_are_inside_the_ranges():
    reqs = _requirements()
    for name, ver in _pins(ROOT / "constraints.txt").items():
        if name in reqs:
            assert reqs[name].specifier.contains(ver, prereleases=True), f"constraints.txt {name}=={ver} vs {reqs[name]}"


@pytest.mark.parametrize("name", sorted(LEROBOT_USERS))
def test_ranges_install_next_to_lerobot(name):
    req = _requirements()[name]
    for ver in LEROBOT_USERS[name]:
        assert req.specifier.contains(ver), f"{req} refuses {name}=={ver}, which lerobot 0.4.4 / 0.6.1 users have"


def test_installed_versions_satisfy_pyproject():
    """Whatever leg this runs in, its venv is inside the claimed ranges (a resolver that left the range fails here)."""
    for req in _requirements().values():
        try:
            ver = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req.name} is a dependency but is not installed")
        assert req.specifier.contains(ver, prereleases=True), f"installed {req.name}=={ver} is outside {req}"


@pytest.mark.parametrize("value", ["a\0b", "\0", "x'\0'y", "observation.state\0shoulder_pan.pos", "plain 'q'"])
def test_literal_round_trips_nul_on_every_supported_duckdb(value):
    # DuckDB < 2.0 ends a string literal at a NUL byte ("unterminated quoted string"); element_index's CASE keys
    # hold one (feature NUL element), so on duckdb 1.4 every connect failed before sqltext.literal spelled it chr(0).
    assert duckdb.connect().execute(f"SELECT {literal(value)}").fetchone()[0] == value
