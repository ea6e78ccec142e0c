"""The one place where values become DuckDB SQL text.

Every name or value that reaches generated SQL from a dataset's metadata (feature names, camera keys, element names,
task texts, file paths, path templates) or from a typed parameter goes through these functions: a dataset is hostile
input, and a name like ``x' OR '1'='1`` or ``'); DROP VIEW frames; --`` must stay one identifier or one string.

DuckDB's grammar (PostgreSQL's): an identifier is ``"..."`` with ``"`` doubled; a string literal is ``'...'`` with
``'`` doubled, and backslashes, semicolons and newlines are plain characters inside both (no ``E'...'``
escapes are produced). NUL is not: DuckDB before 2.0 ends a literal at a NUL byte ("unterminated quoted string"),
so ``literal`` spells it ``chr(0)`` (metadata names with NUL are refused earlier, by layout.py). Where a statement takes parameters (``con.execute(sql, [values])``) binding is used instead;
DDL (``CREATE VIEW`` / ``MACRO``) cannot bind, hence these.
"""

from __future__ import annotations

import math

from ..errors import as_real


def sql_key(name: str) -> str:
    """``name`` as DuckDB compares identifiers: ASCII letters case-insensitively, every other character as is
    (``"ACTION"`` and ``action`` are one column; ``"É"`` and ``"é"`` are two, and ``"é"`` is not the alias ``"É"``)."""
    return "".join(c.lower() if c.isascii() else c for c in name)


def ident(name: str) -> str:
    """``name`` as one quoted DuckDB identifier (feature names contain dots, slashes, quotes...).

    Raises:
        TypeError: ``name`` is not a string (a metadata value of the wrong type must not be str()-ed into SQL).
    """
    if not isinstance(name, str):
        raise TypeError(f"SQL identifier must be a string, got {type(name).__name__}: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    """``value`` as one DuckDB string literal (``VARCHAR``).

    A value holding NUL becomes a parenthesised constant expression, ``('a' || chr(0) || 'b')``: DuckDB < 2.0's
    parser stops a literal at a NUL byte (2.0 accepts it), and pyproject.toml allows duckdb 1.4.

    Raises:
        TypeError: ``value`` is not a string.
    """
    if not isinstance(value, str):
        raise TypeError(f"SQL string literal must be a string, got {type(value).__name__}: {value!r}")
    if "\0" in value:
        return "(" + " || chr(0) || ".join("'" + part.replace("'", "''") + "'" for part in value.split("\0")) + ")"
    return "'" + value.replace("'", "''") + "'"


def number(value: float | int) -> str:
    """A finite number as a DuckDB numeric literal: ``repr`` of the float (round-trips exactly; ``1e-05`` parses).
    No cast is added: DuckDB types ``0.0001`` as a DECIMAL that adapts to the other operand (``FLOAT - 0.0001``
    stays FLOAT), and generated SQL relies on that.

    ``repr(float('nan'))`` is ``nan``, which SQL reads as a column name; non-finite values are refused here so they
    never become SQL text (callers validate them first with a message naming their source).

    Raises:
        ValueError: NaN or infinite; TypeError: not a real number (bools included).
    """
    v = as_real(value)
    if v is None:
        raise TypeError(f"SQL number must be an int or float, got {type(value).__name__}: {value!r}")
    if not math.isfinite(v):
        raise ValueError(f"SQL number must be finite, got {value!r}")
    return repr(v)


def integer(value: int) -> str:
    """An integer as SQL text (numpy integers accepted; bools and floats refused)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"SQL integer must be an int, got {type(value).__name__}: {value!r}")
    return str(int(value.__index__()))


def string_list(values) -> str:
    """A DuckDB list literal of strings: ``['a', 'b']``."""
    return "[" + ", ".join(literal(v) for v in values) + "]"
