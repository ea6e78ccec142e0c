"""The ``LSQL_*`` environment variables, parsed and checked in one place (docs/training.md, "Settings").

Each reader here returns the variable's value, or the caller's default when it is unset (or blank), and raises
:class:`~lerobot_sql.errors.SettingError` (a ``ValueError`` too) naming the variable, the value, what it takes and
the default when the value cannot be used. Callers keep the meaning (which budget, which bound); this module keeps
the parsing, so that every variable accepts the same forms (``1.5``, `` 10 ``, ``2_000_000``) and refuses the same
ones (``nan``, ``inf``, words, negatives).
"""

from __future__ import annotations

import math
import os

from .errors import SettingError

_MAX_MB = float(1 << 40)  # a megabyte count beyond this (an exabyte) is a typo, not a budget


def _raw(var: str) -> str | None:
    text = os.environ.get(var)
    return None if text is None or not text.strip() else text


def megabytes(var: str, default: float | None, what: str, *, zero: str | None = None) -> int | None:
    """Bytes from ``$var`` given in megabytes (a finite number, fractions allowed): ``default`` megabytes when unset
    (None stays None: the caller decides then). ``zero``: what 0 means (allowed only when given).

    Raises:
        SettingError: not a finite number, negative, 0 where ``zero`` is None, or more than 2**40 megabytes.
    """
    text = _raw(var)
    if text is None:
        return None if default is None else max(int(default * (1 << 20)), 1)
    try:
        mb = float(text.strip().replace("_", ""))
    except ValueError:
        mb = math.nan
    low_ok = mb >= 0 if zero is not None else mb > 0
    if not (math.isfinite(mb) and low_ok and mb <= _MAX_MB):
        rule = f"a finite number >= 0 ({zero} at 0)" if zero is not None else "a finite number > 0"
        unset = f"{default:g}" if default is not None else "decided by the machine"
        raise SettingError(f"{var}={text!r}: the megabytes of {what} must be {rule}; unset: {unset}. Set it to one, "
                           "or unset it")
    return 0 if mb == 0 else max(int(mb * (1 << 20)), 1)


def whole_number(var: str, default: int | None, what: str, *, minimum: int = 0) -> int | None:
    """``$var`` as a whole number >= ``minimum`` (``2_000_000`` allowed); ``default`` when unset.

    Raises:
        SettingError: not a whole number, or below ``minimum``.
    """
    text = _raw(var)
    if text is None:
        return default
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        value = None
    if value is None or value < minimum:
        unset = f"{default:,}" if default is not None else "decided by the machine"
        raise SettingError(f"{var}={text!r} is not a whole number >= {minimum} ({what}; unset: {unset}): unset it or "
                           "give one")
    return value


def switch(var: str, default: bool, on: str, off: str) -> bool:
    """``$var`` as on (1, true, yes, on) or off (0, false, no, off), any case; ``default`` when unset.

    Raises:
        SettingError: another value (the message says what each state does: ``on`` / ``off``).
    """
    text = _raw(var)
    if text is None:
        return default
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{var}={text!r}: use 1 ({on}{', the default' if default else ''}) or 0 "
                       f"({off}{'' if default else ', the default'})")
