"""Checks on user SQL before DuckDB sees it, with sqlglot: one read-only query over the registered views.

Each check is a small function ``(tree, ctx) -> None`` that raises :class:`QueryError` with a fix; ``check_sql``
runs them in order (see ``CHECKS``).
"""

from __future__ import annotations

import dataclasses
import difflib
import re

import sqlglot
from sqlglot import exp

from .errors import QueryError


@dataclasses.dataclass(frozen=True)
class Context:
    """What the checks know: view name -> its column names."""

    views: dict[str, list[str]]


_LAMBDA_ARROW = re.compile(r"(?<![-\w>])(\(?\s*[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*\s*\)?)\s*->(?!>)")


def rewrite_lambdas(sql: str) -> str:
    """Rewrite DuckDB 1.x list lambdas ``x -> expr`` (rejected by DuckDB 2.x) to the 2.x form ``lambda x: expr``.

    JSON arrows (``->``/``->>`` after a column or string) are left alone when no bare identifier precedes them in
    a function-argument position.
    """
    out, i = [], 0
    for m in re.finditer(r"(?P<pre>[(,]\s*)(?P<params>\(\s*\w+(?:\s*,\s*\w+)*\s*\)|\w+)\s*->(?!>)", sql):
        params = m.group("params").strip("() ").replace(" ", "")
        out.append(sql[i:m.start()] + m.group("pre") + f"lambda {params.replace(',', ', ')}:")
        i = m.end()
    out.append(sql[i:])
    return "".join(out)


def _parse(sql: str) -> exp.Expression:
    try:
        trees = [t for t in sqlglot.parse(sql, read="duckdb") if t is not None]
    except sqlglot.errors.ParseError as e:
        raise QueryError(f"cannot parse the SQL: {e.errors[0]['description'] if e.errors else e}. SQL: {sql!r}") from e
    if len(trees) != 1:
        raise QueryError(f"expected exactly one SQL statement, found {len(trees)}; run statements one at a time")
    return trees[0]


def _only_queries(tree: exp.Expression, ctx: Context) -> None:
    if not isinstance(tree, exp.Query):
        raise QueryError(f"only queries (SELECT / WITH ... SELECT) are allowed here, not {tree.key.upper()}; "
                         "lerobot_sql views are read-only")


def _no_files_or_table_functions(tree: exp.Expression, ctx: Context) -> None:
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    for t in tree.find_all(exp.Table):
        if isinstance(t.this, exp.Literal) and t.this.is_string or "/" in t.name or "." in t.name and not t.db:
            raise QueryError(f"file paths in FROM are not allowed ({t.sql()}); query the views {sorted(ctx.views)}")
        if t.db or t.catalog:
            raise QueryError(f"{t.sql()!s}: qualified table names are not allowed. If you meant a feature such as "
                             f'observation.state, quote it: "observation.state"')
    for f in tree.find_all(exp.Func):
        if isinstance(f.parent, (exp.From, exp.Join)) or isinstance(f.parent, exp.Table):
            raise QueryError(f"table functions such as {f.sql()[:40]!r} are not allowed; query the views "
                             f"{sorted(ctx.views)}")
    _ = ctes


def _known_views(tree: exp.Expression, ctx: Context) -> None:
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    for t in tree.find_all(exp.Table):
        name = t.name
        if not name or name in ctes or name in ctx.views:
            continue
        near = difflib.get_close_matches(name, list(ctx.views), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise QueryError(f"unknown view {name!r}.{hint} Views: {sorted(v for v in ctx.views if not v.startswith('_'))}")


def _dotted_features(tree: exp.Expression, ctx: Context) -> None:
    tables = {t.alias_or_name for t in tree.find_all(exp.Table)} | {c.alias_or_name for c in tree.find_all(exp.CTE)}
    all_cols = {c for cols in ctx.views.values() for c in cols}
    for col in tree.find_all(exp.Column):
        if col.table and col.table not in tables:
            dotted = f"{col.table}.{col.name}"
            cand = [c for c in all_cols if c == dotted or c.startswith(dotted + ".")]
            if cand or col.table in ("observation", "action", "next"):
                raise QueryError(f"{dotted} is read as table {col.table!r}, column {col.name!r}. Feature names "
                                 f'contain dots: quote them, e.g. "{cand[0] if cand else dotted}"')


CHECKS = (_only_queries, _no_files_or_table_functions, _known_views, _dotted_features)


def check_sql(sql: str, ctx: Context) -> str:
    """Validate ``sql`` and return it ready for DuckDB (1.x lambdas rewritten).

    Raises:
        QueryError: not exactly one query, a file path or table function in FROM, an unknown view, or an
            unquoted dotted feature name; the message names the problem and the fix.
    """
    sql = rewrite_lambdas(sql)
    tree = _parse(sql)
    for check in CHECKS:
        check(tree, ctx)
    return sql
