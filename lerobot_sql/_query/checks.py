"""Checks on user SQL before DuckDB sees it, with sqlglot: one read-only query over the registered views.

Each check is a small function ``(tree, ctx) -> None`` that raises :class:`QueryError` with a fix; ``check_sql``
runs them in order (see ``CHECKS``). Every entry point that takes user SQL (``Database.sql``, ``dataset``,
``manifest``, ``query``, the CLI) goes through ``Database.check`` and so through ``check_sql``.

Here: the size and nesting guards around parsing (``MAX_SQL_CHARS``, ``RECURSION_LIMIT``), the parse errors in
words, the sqlglot passes and :func:`check_sql`. Before them, DuckDB 1.x lambdas are rewritten
(:mod:`lerobot_sql._query.lambdas`); after them the Database reads DuckDB's own parse tree
(:mod:`lerobot_sql._query.tree_facts`), the second look that decides what the query reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
import threading
from typing import Callable, Mapping

import sqlglot
from sqlglot import exp

from ..errors import QueryError
from ..errors import did_you_mean as _did_you_mean
from .lambdas import rewrite_lambdas


@dataclasses.dataclass(frozen=True)
class Context:
    """What the checks know.

    Attributes:
        views: view name -> its column names (from ``duckdb_columns()``).
        table_macros: table macros lerobot_sql registered (name -> result columns); the only functions allowed
            in FROM (the Database passes :data:`lerobot_sql._catalog.macros.TABLE_MACROS`).
        macro_reads: table macro name -> the view its expression arguments are evaluated over
            (:data:`lerobot_sql._catalog.macros.MACRO_READS`).
        lambda_args: a function giving, per function name (lower case), the argument positions DuckDB takes a
            lambda at (the Database reads them from ``duckdb_functions()``, once per process, and only for a query
            with a ``->``): where a 1.x ``x -> expr`` is a lambda
            (:func:`lerobot_sql._query.lambdas.rewrite_lambdas`); every other ``->`` is JSON extraction.

    The checks take the macros as data, so that this module (SQL text only) never imports the catalog.
    """

    views: dict[str, list[str]]
    table_macros: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    macro_reads: dict[str, str] = dataclasses.field(default_factory=dict)
    lambda_args: Callable[[], Mapping[str, frozenset[int]]] = dict

    def public_views(self) -> list[str]:
        return sorted(v for v in self.views if not v.startswith("_"))


# Views and table macros whose rows come from the per-mp4 video index: Database.check builds that index when a
# query reads one of them (CheckedQuery.reads).
VIDEO_INDEX_NAMES = frozenset({"video_frames", "camera_frames", "nearest_camera_frame"})


def parse_error(e: Exception, sql: str) -> str:
    """sqlglot's parse error as 'at line L, column C: <what>: <context with the spot marked >>> <<<>'."""
    errors = getattr(e, "errors", None)
    if not errors:  # a TokenError (an unclosed quote or comment) has no position
        return f"cannot parse the SQL: {e} (an unclosed quote or comment?). SQL: {sql!r}"
    err = errors[0]
    desc = err["description"]
    # "Required keyword: 'this' missing for <class 'sqlglot.expressions.query.Where'>" -> "WHERE is incomplete"
    m = re.match(r"Required keyword: '\w+' missing for <class '[\w.]*\.(\w+)'>", desc)
    if m:
        desc = f"{m.group(1).upper()} is incomplete"
    before, spot, after = err.get("start_context") or "", err.get("highlight") or "", err.get("end_context") or ""
    where = f"{before[-40:]}>>>{spot}<<<{after[:40]}".replace("\n", " ")
    return f"cannot parse the SQL at line {err.get('line')}, column {err.get('col')}: {desc}: {where}{_first_word_hint(sql)}"


def _first_word_hint(sql: str) -> str:
    """A hint when the SQL does not start like a query: sqlglot reads a misspelt ``SELEC * FROM t`` as the product
    ``SELEC * FROM`` and says "MUL is incomplete", which points nowhere near the typo."""
    m = re.match(r"\s*([A-Za-z_]+)", re.sub(r"^(\s*(--[^\n]*\n|/\*.*?\*/))*", "", sql, flags=re.DOTALL))
    if m is None or m.group(1).upper() in ("SELECT", "WITH", "FROM", "VALUES", "TABLE") or _not_a_query(sql):
        return ""
    return (f" (the SQL starts with {m.group(1)!r}: a query starts with SELECT or WITH."
            f"{_did_you_mean(m.group(1), ['SELECT', 'WITH'])})")


# Longest user SQL accepted, in characters. The checks are linear in the text, but sqlglot parses about 0.5 MB/s and
# DuckDB's parse tree of a long IN list is ~20x the text: 1M characters (an IN list of ~150k integers) take about 3 s
# to check; a 1M-item list (7 MB) took minutes. Longer selections belong in a table: filter with a join or a
# manifest (db.dataset(pyarrow_table)).
MAX_SQL_CHARS = 1_000_000

# sqlglot parses recursively (about 15 Python frames per nesting level): Python's default limit of 1000 frames made
# 50 nested parentheses a RecursionError. The checks run with this higher limit (pure-Python frames, which do not grow
# the C stack on CPython 3.11+), about 900 levels; deeper SQL is refused (check_sql), never judged by DuckDB's parse
# tree alone.
RECURSION_LIMIT = 20_000
_recursion_lock = threading.Lock()
_recursion_users = 0
_recursion_saved = 0


@contextlib.contextmanager
def deep_recursion():
    """Raise Python's recursion limit to RECURSION_LIMIT for the block (process-wide, so counted across threads
    and restored when the last user leaves)."""
    global _recursion_users, _recursion_saved
    with _recursion_lock:
        if _recursion_users == 0:
            _recursion_saved = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_recursion_saved, RECURSION_LIMIT))
        _recursion_users += 1
    try:
        yield
    finally:
        with _recursion_lock:
            _recursion_users -= 1
            if _recursion_users == 0:
                sys.setrecursionlimit(_recursion_saved)


def check_size(sql: str) -> None:
    """Raises QueryError when ``sql`` is longer than MAX_SQL_CHARS."""
    if len(sql) > MAX_SQL_CHARS:
        raise QueryError(f"the SQL is {len(sql):,} characters long, more than the {MAX_SQL_CHARS:,} accepted; a long "
                         "IN (...) list belongs in a table: select with a join, or build the selection in pyarrow "
                         "and pass it to db.dataset() as a manifest")


class _Quiet(logging.Filter):
    """Drops sqlglot's own log records while it parses user SQL: its "contains unsupported syntax. Falling back to
    parsing as a 'Command'" warning reached the user's stderr (Python's last-resort handler) beside our refusal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


_QUIET = _Quiet()

# The first keyword of a statement that is not a query, for the refusal's wording: sqlglot names some by their
# node (CHECKPOINT parses as a COLUMN, LOAD as a COMMAND) and cannot parse others (EXPORT DATABASE)
_NOT_QUERY = re.compile(r"\s*(ALTER|ANALYZE|ATTACH|BEGIN|CALL|CHECKPOINT|COMMENT|COMMIT|COPY|CREATE|DEALLOCATE|"
                        r"DELETE|DETACH|DROP|EXECUTE|EXPORT|FORCE|IMPORT|INSERT|INSTALL|LOAD|MERGE|PRAGMA|PREPARE|"
                        r"RESET|ROLLBACK|SET|TRUNCATE|UPDATE|UPSERT|USE|VACUUM)\b", re.IGNORECASE)


def _not_a_query(sql: str) -> str | None:
    m = _NOT_QUERY.match(re.sub(r"^(\s*(--[^\n]*\n|/\*.*?\*/))*", "", sql, flags=re.DOTALL))
    return m.group(1).upper() if m else None


def _parse(sql: str) -> exp.Expression:
    log = logging.getLogger("sqlglot")
    log.addFilter(_QUIET)
    try:
        trees = [t for t in sqlglot.parse(sql, read="duckdb") if t is not None]
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as e:
        kind = _not_a_query(sql)
        if kind is not None:
            raise QueryError(f"only queries (SELECT / WITH ... SELECT) are allowed here, not {kind}; lerobot_sql "
                             "views are read-only") from e
        raise QueryError(parse_error(e, sql)) from e
    finally:
        log.removeFilter(_QUIET)
    if len(trees) != 1:
        raise QueryError(f"expected exactly one SQL statement, found {len(trees)}; run statements one at a time")
    return trees[0]


# ---- checks ---------------------------------------------------------------------------------------------------
def _only_queries(tree: exp.Expression, ctx: Context) -> None:
    kind = (tree.name if isinstance(tree, exp.Command) else tree.key).upper()
    if kind in ("DESCRIBE", "SUMMARIZE", "SHOW"):
        # Read-only, but they can wrap any query (SUMMARIZE SELECT ... FROM read_csv(...)) and DuckDB reports them
        # as statement types other than SELECT; a SELECT gives the same answers through every check.
        raise QueryError(f"{kind} is not run here, only SELECT queries are. Columns of a view: "
                         "db.sql('SELECT * FROM frames LIMIT 0').columns (or .types); statistics: a SELECT such as "
                         "SELECT min(length), max(length), avg(length) FROM episodes")
    if not isinstance(tree, exp.Query):
        kind = _not_a_query(tree.sql("duckdb"))
        if kind is None and not isinstance(tree, _STATEMENT_NODES):
            # a bare word or expression (a misspelt SELECT parses as a column): "not COLUMN" told the user nothing
            text = tree.sql("duckdb")
            text = text if len(text) <= 60 else text[:57] + "..."
            raise QueryError(f"{text!r} is not a SQL statement; a query starts with "
                             "SELECT or WITH, e.g. SELECT * FROM episodes LIMIT 5")
        raise QueryError(f"only queries (SELECT / WITH ... SELECT) are allowed here, not {kind or tree.key.upper()}; "
                         "lerobot_sql views are read-only")
    # A query can hold a statement: WITH x AS (DELETE ... RETURNING *) SELECT ... deletes in DuckDB. Any node that
    # writes, defines or configures, at any depth (CTE, subquery, LATERAL, set operation), is refused.
    for node in tree.walk():
        if isinstance(node, _STATEMENT_NODES):
            kind = (node.name if isinstance(node, exp.Command) else node.key).upper()
            raise QueryError(f"{kind} inside a query is not allowed: lerobot_sql views are read-only and only "
                             "queries (SELECT / WITH ... SELECT) run here; write results out with db.export() or "
                             "db.export_manifest()")


_STATEMENT_NODES = tuple(getattr(exp, n) for n in (
    "DML", "DDL", "Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "Copy", "Command", "Pragma", "Set",
    "Attach", "Detach", "Use", "Transaction", "Commit", "Rollback", "Describe", "Summarize", "Show", "Install",
    "Export", "Analyze", "Grant", "Revoke", "TruncateTable", "Kill", "Refresh", "Cache", "Uncache", "LoadData",
    "Declare", "Comment") if hasattr(exp, n))


def _func_name(f: exp.Func) -> str:
    return (f.name if isinstance(f, exp.Anonymous) else f.sql_name()).lower()


# Table functions allowed besides our table macros: unnest reads only its argument (whose subqueries are checked).
SAFE_TABLE_FUNCTIONS = frozenset({"unnest"})


def table_function_error(text: str, ctx: Context) -> QueryError:
    return QueryError(f"table functions such as {text[:60]!r} are not allowed in FROM, JOIN or LATERAL; query the "
                      f"views {ctx.public_views()} or the lerobot_sql table macros {sorted(ctx.table_macros)}; a "
                      "file of your own (a keep-list, scores) becomes a view with db.attach(name, path) (CLI: "
                      "--attach NAME=PATH)")


def _no_files_or_table_functions(tree: exp.Expression, ctx: Context) -> None:
    for lat in tree.find_all(exp.Lateral):  # FROM t, LATERAL f(...): sqlglot holds the call outside any Table
        if isinstance(lat.this, exp.Func) and not isinstance(lat.this, exp.Unnest):
            name = _func_name(lat.this)
            if name not in ctx.table_macros:
                raise table_function_error(lat.this.sql("duckdb"), ctx)
    for t in tree.find_all(exp.Table):
        if isinstance(t.this, exp.Func):
            name = _func_name(t.this)
            if name in ctx.table_macros:
                continue
            raise table_function_error(t.this.sql("duckdb"), ctx)
        if isinstance(t.this, exp.Literal) or "/" in t.name or "\\" in t.name or ("." in t.name and not t.db):
            raise QueryError(f"file paths in FROM are not allowed ({t.sql('duckdb')}); query the views "
                             f"{ctx.public_views()}")
        if t.db or t.catalog:
            raise QueryError(f"{t.sql('duckdb')}: qualified table names are not allowed. If you meant a feature such "
                             f'as observation.state, quote it: "observation.state"')


INT64_MAX = 2**63 - 1


def _row_counts_fit(tree: exp.Expression, ctx: Context) -> None:
    """LIMIT / OFFSET literals beyond BIGINT: DuckDB would say 'Type INT128 ... out of range for INT64'."""
    for clause in tree.find_all(exp.Limit, exp.Offset):
        n = clause.expression
        if isinstance(n, exp.Literal) and not n.is_string and n.this.isdigit() and int(n.this) > INT64_MAX:
            raise QueryError(f"{clause.key.upper()} {n.this} is out of range: row counts are 64-bit integers (at "
                             f"most {INT64_MAX}); drop the {clause.key.upper()} to get every row")


def _cte_names(tree: exp.Expression) -> set[str]:
    return {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}


def _known_views(tree: exp.Expression, ctx: Context) -> None:
    ctes = _cte_names(tree)
    known = {v.lower() for v in ctx.views}
    for t in tree.find_all(exp.Table):
        name = t.name
        if not name or isinstance(t.this, exp.Func) or name.lower() in ctes or name.lower() in known:
            continue
        raise QueryError(f"unknown view {name!r}.{_did_you_mean(name, ctx.public_views())} "
                         f"Views: {ctx.public_views()}")


def _column_parts(col: exp.Column) -> list[str]:
    return [p.name for p in col.parts]


def _dotted_features(tree: exp.Expression, ctx: Context) -> None:
    tables = {t.alias_or_name.lower() for t in tree.find_all(exp.Table)} | _cte_names(tree)
    tables |= {s.alias.lower() for s in tree.find_all(exp.Subquery) if s.alias}
    all_cols = {c for cols in ctx.views.values() for c in cols}
    for col in tree.find_all(exp.Column):
        parts = _column_parts(col)
        if len(parts) < 2 or isinstance(col.this, exp.Star):
            continue
        if parts[0].lower() in tables and len(parts) == 2:
            continue  # alias.column
        start = 1 if parts[0].lower() in tables else 0
        dotted = ".".join(parts[start:])
        cand = sorted(c for c in all_cols if c == dotted or c.startswith(dotted + "."))
        if cand or parts[start] in ("observation", "action", "next"):
            best = dotted if dotted in cand else (cand[0] if cand else dotted)
            raise QueryError(f"{'.'.join(parts)} is read as table.column ({'.'.join(parts[:-1])!r} . {parts[-1]!r}). "
                             f'Feature names contain dots: quote them, e.g. "{best}"'
                             + (f" (prefix the quoted name with a table alias if needed: f.\"{best}\")" if start else ""))


def _bound_names(tree: exp.Expression) -> set[str]:
    """Names a column reference may legitimately use besides view columns: aliases, CTE and derived-table column
    lists, lambda parameters, window names."""
    names: set[str] = set()
    for a in tree.find_all(exp.Alias):
        names.add(a.alias.lower())
    for ta in tree.find_all(exp.TableAlias):
        names.update(c.name.lower() for c in ta.columns)
        if ta.name:
            names.add(ta.name.lower())
    for lam in tree.find_all(exp.Lambda):
        names.update(e.name.lower() for e in lam.expressions)
    for w in tree.find_all(exp.Window):
        if isinstance(w.this, exp.Identifier):
            names.add(w.name.lower())
        if isinstance(w.args.get("alias"), exp.Identifier):
            names.add(w.args["alias"].name.lower())
    return names


def _known_columns(tree: exp.Expression, ctx: Context) -> None:
    """Unknown column names, with the nearest valid name. Conservative: a name is accepted if any referenced view,
    table macro, alias or lambda parameter provides it, so this never rejects a query DuckDB would run."""
    lower_views = {v.lower(): cols for v, cols in ctx.views.items()}
    macros = {m.lower(): cols for m, cols in ctx.table_macros.items()}
    referenced: dict[str, list[str]] = {}  # view or macro name -> columns
    alias_to: dict[str, str] = {}
    for t in tree.find_all(exp.Table):
        if isinstance(t.this, exp.Func):
            name = _func_name(t.this)
            cols = list(macros.get(name, ()))
            # the macro's expression arguments are evaluated over this view
            reads = ctx.macro_reads.get(name)
            if reads in ctx.views:
                referenced[reads] = ctx.views[reads]
        else:
            name = t.name.lower()
            cols = lower_views.get(name)
            if cols is None:
                continue  # a CTE
        referenced[name] = cols
        alias = t.alias_or_name.lower()
        # One alias may name different tables in different scopes (or a CTE elsewhere): then it is not ours to judge.
        alias_to[alias] = name if alias_to.get(alias, name) == name else None
    for cte in tree.find_all(exp.CTE):
        alias_to[cte.alias_or_name.lower()] = None
    if not referenced:
        return
    available = {c.lower(): c for cols in referenced.values() for c in cols}
    bound = _bound_names(tree)
    for col in tree.find_all(exp.Column):
        if isinstance(col.this, exp.Star) or not isinstance(col.this, exp.Identifier):
            continue
        parts = _column_parts(col)
        name = parts[-1]
        if len(parts) > 2:
            continue  # struct field access; _dotted_features handled feature names
        if len(parts) == 2:
            view = alias_to.get(parts[0].lower())
            if view is None:
                continue  # a CTE, a subquery alias or struct access: not ours to judge
            cols = referenced[view]
            if name.lower() in {c.lower() for c in cols}:
                continue
            raise QueryError(f"unknown column {name!r} in {view!r}.{_did_you_mean(name, cols)} Columns of {view}: "
                             f"{cols}")
        if name.lower() in available or name.lower() in bound:
            continue
        listing = "; ".join(f"{v}: {cols}" for v, cols in referenced.items())
        # a column of another view (frames_ext's per-element and derived columns, episodes' length...): say which
        # (public views only: a query cannot read the private ones)
        elsewhere = sorted(v for v, cols in lower_views.items() if v not in referenced and not v.startswith("_")
                           and name.lower() in {c.lower() for c in cols})
        where = f" It is a column of {', '.join(elsewhere)}: query FROM {elsewhere[0]}." if elsewhere else \
            _did_you_mean(name, list(available.values()))
        raise QueryError(f"unknown column {name!r}.{where} "
                         f"Valid columns - {listing}. Feature names with dots must be quoted "
                         '(e.g. "observation.state").')


def _no_zero_index(tree: exp.Expression, ctx: Context) -> None:
    """``x[0]``: DuckDB lists and arrays are 1-based, so element 0 is always NULL, in silence (a user coming from
    numpy reads ``"action"[0]`` as the first joint). Read from the written SQL: sqlglot stores the index shifted to
    0-based."""
    for b in tree.find_all(exp.Bracket):
        text = b.sql("duckdb")
        if re.search(r"\[\s*0\s*\]$", text):
            first = re.sub(r"\[\s*0\s*\]$", "[1]", text)
            raise QueryError(f"{text}: DuckDB lists and arrays are 1-based, so element 0 is always NULL; the first "
                             f"element is {first} (the last is [-1]; frames_ext also has each element as its own "
                             "named column)")


CHECKS = (_only_queries, _no_files_or_table_functions, _known_views, _dotted_features, _known_columns,
          _no_zero_index, _row_counts_fit)


@dataclasses.dataclass(frozen=True)
class CheckedQuery:
    """A user query that passed the checks, parsed once: what the entry points (``Database.sql``, ``manifest``,
    ``dataset``) run and plan from, so none of them parses the SQL again.

    Attributes:
        sql: the text DuckDB runs (1.x lambdas rewritten).
        tree: sqlglot's parse tree of ``sql``.
        tables: names (lower case) of the views, CTEs and table macros read anywhere in the query. From
            :func:`check_sql`: as sqlglot reads them; ``Database.check`` replaces them (and ``ordered``) with what
            DuckDB's own parse tree says (:func:`lerobot_sql._query.tree_facts.duckdb_facts`), the reading that decides.
        ordered: the outermost query has an ORDER BY (only then is DuckDB's row order defined).
        duckdb_tree: DuckDB's own parse tree of ``sql`` (``json_serialize_sql``), once ``Database.check`` has read
            it ("" before): what :mod:`lerobot_sql._query.narrowing` reads a query's bounds on frames from.
    """

    sql: str
    tree: exp.Expression = dataclasses.field(repr=False, compare=False)
    tables: frozenset[str]
    ordered: bool
    duckdb_tree: str = dataclasses.field(default="", repr=False, compare=False)

    def reads(self, *names: str) -> bool:
        """True if the query reads one of the views or table macros ``names`` (lower case)."""
        return any(n in self.tables for n in names)


def check_sql(sql: str, ctx: Context) -> CheckedQuery:
    """Validate ``sql`` with sqlglot and return it ready for DuckDB (1.x lambdas rewritten), with its parse tree.

    SQL nested deeper than sqlglot can follow (see RECURSION_LIMIT) is refused, not passed on unchecked.

    Raises:
        QueryError: longer than MAX_SQL_CHARS, not exactly one query, a statement (DELETE, UPDATE, ...) anywhere in
            it, a file path or table function in FROM / JOIN / LATERAL, an unknown view or column, or an unquoted
            dotted feature name, nesting deeper than the checks can walk; the message names the problem, the valid
            names and the fix.
    """
    check_size(sql)
    sql = rewrite_lambdas(sql, ctx.lambda_args)
    with deep_recursion():
        try:
            tree = _parse(sql)
            for check in CHECKS:
                check(tree, ctx)
            tables = frozenset(_func_name(t.this) if isinstance(t.this, exp.Func) else t.name.lower()
                               for t in tree.find_all(exp.Table))
        except RecursionError as e:
            # Fail closed: a query the checks cannot walk is not run (it used to skip them, leaving DuckDB's tree
            # walk as the only wall).
            raise QueryError(f"the SQL is nested too deeply for the query checks (more than Python's recursion "
                             f"limit of {RECURSION_LIMIT:,} frames while parsing, about 900 nested parentheses or "
                             "subqueries; DuckDB's own depth limit is 1000): simplify it, with fewer nested "
                             "parentheses or subqueries (a WITH clause per step)") from e
    return CheckedQuery(sql, tree, tables, tree.args.get("order") is not None)
