"""lerobot_sql._settings: every LSQL_* variable parsed one way; a value that cannot be used is a SettingError naming
it (a ValueError too)."""

from __future__ import annotations

import pytest

from lerobot_sql import _settings
from lerobot_sql.errors import LeRobotSQLError, SettingError


@pytest.mark.parametrize("text,want", [("1.5", int(1.5 * (1 << 20))), (" 10 ", 10 << 20), ("1_000", 1000 << 20),
                                       ("", 48 << 20), ("  ", 48 << 20)])
def test_megabytes_takes_numbers_and_blank_is_the_default(monkeypatch, text, want):
    monkeypatch.setenv("LSQL_X_MB", text)
    assert _settings.megabytes("LSQL_X_MB", 48, "things") == want


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "-inf", "1e400", "lots", "1e13"])
def test_megabytes_refuses_what_cannot_be_a_budget(monkeypatch, text):
    monkeypatch.setenv("LSQL_X_MB", text)
    with pytest.raises(SettingError, match=rf"LSQL_X_MB={text!r}: the megabytes of things must be a finite number > 0;"
                                           r" unset: 48") as e:
        _settings.megabytes("LSQL_X_MB", 48, "things")
    assert isinstance(e.value, ValueError) and isinstance(e.value, LeRobotSQLError)


def test_megabytes_zero_only_where_it_means_something(monkeypatch):
    monkeypatch.delenv("LSQL_X_MB", raising=False)
    assert _settings.megabytes("LSQL_X_MB", None, "things", zero="off") is None  # unset: the caller decides
    monkeypatch.setenv("LSQL_X_MB", "0")
    assert _settings.megabytes("LSQL_X_MB", None, "things", zero="off") == 0
    monkeypatch.setenv("LSQL_X_MB", "-0.5")
    with pytest.raises(SettingError, match=r">= 0 \(off at 0\); unset: decided by the machine"):
        _settings.megabytes("LSQL_X_MB", None, "things", zero="off")


@pytest.mark.parametrize("text,want", [("0", 0), ("2_000_000", 2_000_000), (" 7 ", 7), ("", 5)])
def test_whole_number(monkeypatch, text, want):
    monkeypatch.setenv("LSQL_N", text)
    assert _settings.whole_number("LSQL_N", 5, "frames") == want


@pytest.mark.parametrize("text", ["-1", "1.5", "many", "0"])
def test_whole_number_refuses_other_forms_and_numbers_below_the_minimum(monkeypatch, text):
    monkeypatch.setenv("LSQL_N", text)
    with pytest.raises(SettingError, match=rf"LSQL_N={text!r} is not a whole number >= 1 \(rows; unset: 5\)"):
        _settings.whole_number("LSQL_N", 5, "rows", minimum=1)


@pytest.mark.parametrize("text,want", [("1", True), ("YES", True), ("on", True), ("0", False), ("False", False),
                                       ("off", False), ("", True)])
def test_switch(monkeypatch, text, want):
    monkeypatch.setenv("LSQL_S", text)
    assert _settings.switch("LSQL_S", True, "reuse", "fresh") is want


def test_switch_names_both_states(monkeypatch):
    monkeypatch.setenv("LSQL_S", "maybe")
    with pytest.raises(SettingError, match=r"LSQL_S='maybe': use 1 \(reuse, the default\) or 0 \(fresh\)"):
        _settings.switch("LSQL_S", True, "reuse", "fresh")
