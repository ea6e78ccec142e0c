"""The named-query library: parameterized ``.sql`` files run with ``db.named_query(name, **params)``.

Bundled queries live in the repository's top-level ``queries/`` folder (``Path(__file__).parents[1] / "queries"``);
users add folders with ``Database.add_query_dir`` (searched first). A query's name is its file name without
``.sql`` (a subfolder is part of the name: ``doctor/x``).

File format: a header of ``--`` comment lines, then one SELECT::

    -- Episodes whose task text contains a string (case-insensitive).
    --
    -- params:
    --   text (str): the substring to look for, e.g. cube
    --   min_length (int, default 0, >= 0): shortest episode kept, in frames
    -- returns: episode_index BIGINT, one row per episode
    SELECT episode_index FROM episodes WHERE ...  $text ... $min_length

``$name`` in the body is replaced by the parameter's value rendered as a SQL literal of its declared type:

  ``int``, ``float``  validated numbers (``inf`` allowed for float bounds, NaN refused);
  ``str``             a quoted string literal;
  ``bool``            true / false (also from the strings true/false/1/0/yes/no);
  ``feature``         a quoted identifier (a column such as ``observation.state``);
  ``vector``          a ``feature`` that must be a numeric list column of ``frames`` (``observation.state``,
                      ``action``): checked against the dataset by ``db.named_query`` before the SQL runs;
  ``expr``            one SQL expression (a predicate over ``frames_ext``), parenthesised; no statements or
                      subqueries. The rendered SQL still goes through every query check.

A number may carry a bound after its type and default, ``(float, default 1.0, > 0)`` (``>``, ``>=``, ``<``,
``<=``): a value outside it is refused naming the parameter, as a value of the wrong type is (a negative window
length would otherwise give windows whose end is before their start).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp

from ..errors import QueryError, did_you_mean
from . import sqltext

# Source checkout: the repository's top-level queries/. Installed wheel: pyproject maps queries/ to the package data
# folder lerobot_sql/_queries (package-dir "lerobot_sql._queries" = "queries").
_PKG = Path(__file__).resolve().parents[1]  # lerobot_sql/ (this module is lerobot_sql/_query/library.py)
BUNDLED = next((p for p in (_PKG.parent / "queries", _PKG / "_queries") if p.is_dir()), _PKG.parent / "queries")
TYPES = ("int", "float", "str", "bool", "feature", "vector", "expr")
_PARAM_LINE = re.compile(r"^\s*(\w+)\s*\(\s*(\w+)\s*(?:,\s*default\s*=?\s*(.*?))?"
                         r"(?:\s*,\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf)))?\s*\)\s*:\s*(.*)$")
_BOUNDS = {">": (lambda v, b: v > b), ">=": (lambda v, b: v >= b), "<": (lambda v, b: v < b),
           "<=": (lambda v, b: v <= b)}
_PLACEHOLDER = re.compile(r"\$([A-Za-z_]\w*)")


@dataclasses.dataclass(frozen=True)
class Param:
    """One documented parameter: ``name (type[, default VALUE][, OP BOUND]): doc`` (``bound``: ``(op, number)``
    or None)."""

    name: str
    type: str
    default: Any
    required: bool
    doc: str
    bound: tuple[str, float] | None = None

    def describe(self) -> str:
        d = "required" if self.required else f"default {self.default!r}"
        b = f", {self.bound[0]} {self.bound[1]:g}" if self.bound else ""
        return f"{self.name} ({self.type}, {d}{b}): {self.doc}"


@dataclasses.dataclass(frozen=True)
class NamedQuery:
    """A parsed ``.sql`` file: name, one-line description, params, result columns, body and where it came from."""

    name: str
    description: str
    params: tuple[Param, ...]
    returns: str
    body: str
    path: Path

    def signature(self) -> str:
        return "; ".join(p.describe() for p in self.params) or "no parameters"


def _dirs(extra_dirs) -> list[Path]:
    return [Path(d) for d in (extra_dirs or [])] + [BUNDLED]


def _parse_file(name: str, path: Path) -> NamedQuery:
    lines = path.read_text().splitlines()
    header: list[str] = []
    i = 0
    while i < len(lines) and (lines[i].lstrip().startswith("--") or not lines[i].strip()):
        if lines[i].lstrip().startswith("--"):
            header.append(lines[i].lstrip()[2:].rstrip())
        i += 1
    body = "\n".join(lines[i:]).strip().rstrip(";").strip()
    desc, params, returns, section = [], [], [], "description"
    for h in header:
        s = h.strip()
        if s.lower() == "params:":
            section = "params"
            continue
        if s.lower().startswith("returns:"):
            section = "returns"
            s = s[len("returns:"):].strip()
        if section == "description":
            if s:
                desc.append(s)
        elif section == "params":
            m = _PARAM_LINE.match(s)
            if m:
                pname, ptype, default, op, limit, doc = m.groups()
                if ptype not in TYPES:
                    raise QueryError(f"{path}: parameter {pname!r} has type {ptype!r}; use one of {list(TYPES)}")
                if op and ptype not in ("int", "float"):
                    raise QueryError(f"{path}: parameter {pname!r} ({ptype}) has a bound ({op} {limit}); only int "
                                     "and float parameters take one")
                bound = (op, float(limit)) if op else None
                try:
                    value = None if default is None else _coerce(name, pname, ptype, _unquote(default), bound)
                except QueryError as e:
                    e.usage = False  # a bad default is the file's mistake, not the caller's
                    raise
                params.append(Param(pname, ptype, value, default is None, doc, bound))
            elif s and params:  # continuation of the previous parameter's doc
                p = params[-1]
                params[-1] = dataclasses.replace(p, doc=f"{p.doc} {s}")
        elif s:
            returns.append(s)
    if not body:
        raise QueryError(f"{path}: no SQL after the header")
    return NamedQuery(name, " ".join(desc), tuple(params), " ".join(returns), body, path)


def _unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def _all_files(extra_dirs) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in _dirs(extra_dirs):
        if d.is_dir():
            for p in sorted(d.glob("*.sql")):
                found.setdefault(p.stem, p)
    return found


def load(name: str, extra_dirs=None) -> NamedQuery:
    """The named query ``name`` (user folders first, then the bundled ``queries/``).

    Raises:
        QueryError: no such query; the message lists the available names and the nearest one.
    """
    if re.fullmatch(r"[\w-]+(/[\w-]+)*", name or ""):
        for d in _dirs(extra_dirs):
            p = d / f"{name}.sql"
            if p.is_file():
                return _parse_file(name, p)
    names = sorted(_all_files(extra_dirs))
    raise _caller_error(f"no named query {name!r}.{did_you_mean(name or '', names)} Available: {names} (folders "
                        f"searched: {[str(d) for d in _dirs(extra_dirs)]})")


def list_queries(extra_dirs=None) -> list[dict]:
    """Every named query: ``{"name", "description", "params": [{"name", "type", "default", "required", "doc"}],
    "returns", "path"}``, sorted by name (a user folder's query hides a bundled one of the same name)."""
    out = []
    for name, path in sorted(_all_files(extra_dirs).items()):
        nq = _parse_file(name, path)
        out.append({"name": nq.name, "description": nq.description, "returns": nq.returns, "path": str(nq.path),
                    "params": [dataclasses.asdict(p) for p in nq.params]})
    return out


def _caller_error(message: str) -> QueryError:
    """A QueryError that the caller's name or parameters caused (not the query file): marked ``.usage = True``,
    which the CLI reports as a usage error (exit 2)."""
    err = QueryError(message)
    err.usage = True
    return err


_INT64 = (-(2 ** 63), 2 ** 63 - 1)  # what DuckDB's BIGINT holds: a larger literal becomes a HUGEINT or DOUBLE
_TRUE = {"true", "1", "yes", "on", "t", "y"}
_FALSE = {"false", "0", "no", "off", "f", "n"}


def _coerce(qname: str, pname: str, ptype: str, value: Any, bound: tuple[str, float] | None = None) -> Any:
    """The Python value of a parameter, checked against its type and bound (strings from the CLI are parsed)."""
    def bad(why: str) -> QueryError:
        return _caller_error(f"query {qname!r}: parameter {pname!r} ({ptype}) {why}, got {value!r}")

    v = _coerce_type(ptype, value, bad)
    if ptype == "int" and not _INT64[0] <= v <= _INT64[1]:
        # compared with BIGINT columns, a 10**23 matched nothing without a word
        raise bad(f"must fit in a 64-bit integer ({_INT64[0]} .. {_INT64[1]})")
    if bound is not None and not _BOUNDS[bound[0]](v, bound[1]):
        raise bad(f"must be {bound[0]} {bound[1]:g}")
    return v


# What a number parameter given as text may look like: ASCII digits only. Python's int() and float() also take other
# scripts' digits ('٣' is 3), '_' separators ('1_0' is 10) and 'Infinity'; a value nobody can read back from the
# SQL, or a typo, would then pass as a number.
_INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
_FLOAT_TEXT = re.compile(r"\s*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf)\s*", re.ASCII | re.I)


def _coerce_type(ptype: str, value: Any, bad) -> Any:
    if ptype == "int":
        if isinstance(value, bool):
            raise bad("must be an integer")
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, str) and _INT_TEXT.fullmatch(value):
            return int(value)
        raise bad("must be an integer written with ASCII digits, e.g. 12")
    if ptype == "float":
        if isinstance(value, bool):
            raise bad("must be a number")
        if isinstance(value, str) and not _FLOAT_TEXT.fullmatch(value):
            raise bad("must be a number written in ASCII, e.g. 2.5, 1e-3 or inf")
        try:
            v = float(value)
        except OverflowError:  # an int beyond a double (10**400)
            raise bad("is outside a 64-bit float (about ±1.8e308); pass inf for no bound") from None
        except (TypeError, ValueError):
            raise bad("must be a number") from None
        if math.isnan(v):
            raise bad("must be a number, not NaN")
        if math.isinf(v) and not (isinstance(value, float) or "inf" in str(value).lower()):
            # '1e400' (or a Decimal of it) became inf: a bound of "no limit" that nobody wrote
            raise bad("is outside a 64-bit float (about ±1.8e308); pass inf for no bound")
        return v
    if ptype == "bool":
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() in _TRUE | _FALSE:
            return str(value).strip().lower() in _TRUE
        raise bad("must be true or false")
    if ptype in ("str", "feature", "vector", "expr"):
        if not isinstance(value, str):
            if ptype == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
            raise bad("must be a string")
        if ptype in ("feature", "vector") and not value:
            raise bad("must name a column")
        if ptype == "expr":
            _check_expr(value, bad)
        return value
    raise bad(f"has unknown type; use one of {list(TYPES)}")


def _check_expr(value: str, bad) -> None:
    from .checks import parse_error

    # sqlglot reads 1.x lambdas (`x -> e`) as well as 2.x ones; the query the expression is rendered into is
    # rewritten for DuckDB by check_sql when it runs
    sql = f"SELECT {value}"
    try:
        trees = sqlglot.parse(sql, read="duckdb")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as e:
        # the checks' wording (spot marked >>> <<<), not sqlglot's own message with its terminal colour codes
        raise bad(f"must be one SQL expression, e.g. \"observation.state.gripper.pos\" < 20; "
                  f"{parse_error(e, sql)}") from e
    sel = trees[0] if len(trees) == 1 else None
    if not isinstance(sel, exp.Select) or len(sel.expressions) != 1 or sel.args.get("from_") or \
            any(True for _ in sel.expressions[0].find_all(exp.Query)):
        raise bad("must be one SQL expression (no subqueries, no statements)")


def _render_value(ptype: str, v: Any) -> str:
    """A coerced parameter as SQL text, through :mod:`lerobot_sql._query.sqltext` (the one quoting helper)."""
    if ptype == "int":
        return sqltext.integer(int(v))
    if ptype == "float":
        # ±inf are meaningful bounds (`length < $max`); NaN compares false with everything: both as typed DOUBLEs.
        return f"'{v}'::DOUBLE" if math.isinf(v) or math.isnan(v) else f"{sqltext.number(v)}::DOUBLE"
    if ptype == "bool":
        return "true" if v else "false"
    if ptype == "str":
        return sqltext.literal(v)
    if ptype in ("feature", "vector"):
        return sqltext.ident(v)
    return f"({v})"  # expr, checked by _check_expr


def render(name: str, params: dict, extra_dirs=None, vectors: dict[str, str] | None = None) -> str:
    """The SQL text of named query ``name`` with ``params`` substituted as literals of their declared types.

    ``vectors``: the numeric list columns of ``frames`` (name -> DuckDB type) a ``vector`` parameter must name;
    None (no dataset at hand) leaves that check to the SQL.

    Raises:
        QueryError: unknown query; a missing, unknown, ill-typed or out-of-bound parameter (an ``int`` outside
            int64 too), or a ``vector`` parameter that is not one of ``vectors`` (the message names the query and
            lists its documented parameters, or the valid columns); these carry ``.usage = True``.
    """
    nq = load(name, extra_dirs)
    declared = {p.name: p for p in nq.params}
    params = dict(params or {})
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise _caller_error(f"query {name!r} has no parameter(s) {unknown}. Parameters: {nq.signature()}")
    missing = [p.name for p in nq.params if p.required and p.name not in params]
    if missing:
        raise _caller_error(f"query {name!r} needs parameter(s) {missing}. Parameters: {nq.signature()}")
    values = {}
    for p in nq.params:
        v = _coerce(name, p.name, p.type, params[p.name], p.bound) if p.name in params else p.default
        if p.type == "vector" and vectors is not None and v not in vectors:
            raise _caller_error(f"query {name!r}: parameter {p.name!r} (vector) must be a numeric vector feature of "
                             f"frames, got {v!r}.{did_you_mean(str(v), sorted(vectors))} Valid: {sorted(vectors)}")
        values[p.name] = _render_value(p.type, v)

    def sub(m: re.Match) -> str:
        key = m.group(1)
        if key not in values:
            raise QueryError(f"{nq.path}: the SQL uses ${key}, which the header does not declare. "
                             f"Parameters: {nq.signature()}")
        return values[key]

    return _PLACEHOLDER.sub(sub, nq.body)
