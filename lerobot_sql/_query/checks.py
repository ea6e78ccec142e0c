"""Checks on user SQL before DuckDB sees it, with sqlglot: one read-only query over the registered views.

Each check is a small function ``(tree, ctx) -> None`` that raises :class:`QueryError` with a fix; ``check_sql``
runs them in order (see ``CHECKS``). Every entry point that takes user SQL (``Database.sql``, ``dataset``,
``manifest``, ``query``, the CLI) goes through ``Database.check`` and so through ``check_sql``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import sys
import threading
from typing import Callable, Mapping

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from ..errors import QueryError, did_you_mean as _did_you_mean


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
            with a ``->``): where a 1.x ``x -> expr`` is a lambda (:func:`rewrite_lambdas`); every other ``->`` is
            JSON extraction.

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




# ---- 1.x list lambdas ---------------------------------------------------------------------------------------------
def rewrite_lambdas(sql: str, lambda_args: Mapping[str, frozenset[int]] | Callable[[], Mapping[str, frozenset[int]]]
                    ) -> str:
    """Rewrite DuckDB 1.x list lambdas ``x -> expr`` / ``(x, i) -> expr`` (rejected by DuckDB 2.x) to the 2.x form
    ``lambda x: expr`` / ``lambda x, i: expr``, exactly where DuckDB 1.x read ``->`` as a lambda: an argument of a
    function that takes one, at a position where it takes one.

    Args:
        sql: the user's SQL.
        lambda_args: function name (lower case) -> the 0-based argument positions DuckDB types ``LAMBDA`` (from
            ``duckdb_functions()``: ``list_transform`` {1}, ``invoke`` {0}, ...; :attr:`Context.lambda_args`), or a
            function giving it, called only when the SQL has a ``->``.

    Works on sqlglot tokens, so arrows inside string literals and comments are left alone. Every other ``->`` is
    DuckDB's JSON extraction and is kept: ``names -> '$[0]'`` in a SELECT list, ``upper(j -> 'a')``, or an arrow in
    a lambda function's list argument (``list_transform(j -> '$.l', lambda x: x)``).
    """
    try:
        toks = sqlglot.tokenize(sql, read="duckdb")
    except sqlglot.errors.TokenError:
        return sql  # _parse reports the real problem
    if not any(t.token_type == TokenType.ARROW for t in toks):
        return sql
    if callable(lambda_args):
        lambda_args = lambda_args()
    # For each token, the call it is an argument of: (function name, argument position), or None outside a call.
    # Brackets and braces nest like parentheses so that the commas of a list or struct literal are not argument
    # separators.
    opens = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE}
    closes = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE}
    stack: list[list] = []  # [function name or None, argument position]
    enclosing: list[tuple[str, int] | None] = []
    for i, t in enumerate(toks):
        top = stack[-1] if stack else None
        enclosing.append((top[0], top[1]) if top and top[0] is not None else None)
        if t.token_type in opens:
            fn = toks[i - 1].text.lower() if t.token_type == TokenType.L_PAREN and i > 0 else None
            stack.append([fn, 0])
        elif t.token_type in closes and stack:
            stack.pop()
        elif t.token_type == TokenType.COMMA and top is not None:
            top[1] += 1

    def lambda_position(k: int) -> bool:  # token k starts an argument that DuckDB reads as a lambda
        if k - 1 < 0 or toks[k - 1].token_type not in (TokenType.L_PAREN, TokenType.COMMA):
            return False
        call = enclosing[k]
        return call is not None and call[1] in lambda_args.get(call[0], ())

    edits: list[tuple[int, int, str]] = []
    for i, t in enumerate(toks):
        if t.token_type != TokenType.ARROW:
            continue
        j = i - 1
        if j >= 0 and toks[j].token_type == TokenType.R_PAREN:  # (x, i) -> ...
            names, k = [], j - 1
            while k >= 0 and toks[k].token_type == TokenType.VAR:
                names.append(toks[k].text)
                if k - 1 >= 0 and toks[k - 1].token_type == TokenType.COMMA:
                    k -= 2
                else:
                    k -= 1
                    break
            if not names or k < 0 or toks[k].token_type != TokenType.L_PAREN or not lambda_position(k):
                continue
            start = toks[k].start
            params = ", ".join(reversed(names))
        elif j >= 0 and toks[j].token_type == TokenType.VAR:
            if not lambda_position(j):
                continue
            start, params = toks[j].start, toks[j].text
        else:
            continue
        edits.append((start, t.end + 1, f"lambda {params}:"))
    for start, end, text in reversed(edits):
        sql = sql[:start] + text + sql[end:]
    return sql


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
def _deep_recursion():
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


def _table_function_error(text: str, ctx: Context) -> QueryError:
    return QueryError(f"table functions such as {text[:60]!r} are not allowed in FROM, JOIN or LATERAL; query the "
                      f"views {ctx.public_views()} or the lerobot_sql table macros {sorted(ctx.table_macros)}")


def _no_files_or_table_functions(tree: exp.Expression, ctx: Context) -> None:
    for lat in tree.find_all(exp.Lateral):  # FROM t, LATERAL f(...): sqlglot holds the call outside any Table
        if isinstance(lat.this, exp.Func) and not isinstance(lat.this, exp.Unnest):
            name = _func_name(lat.this)
            if name not in ctx.table_macros:
                raise _table_function_error(lat.this.sql("duckdb"), ctx)
    for t in tree.find_all(exp.Table):
        if isinstance(t.this, exp.Func):
            name = _func_name(t.this)
            if name in ctx.table_macros:
                continue
            raise _table_function_error(t.this.sql("duckdb"), ctx)
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
            DuckDB's own parse tree says (:func:`duckdb_facts`), the reading that decides.
        ordered: the outermost query has an ORDER BY (only then is DuckDB's row order defined).
    """

    sql: str
    tree: exp.Expression = dataclasses.field(repr=False, compare=False)
    tables: frozenset[str]
    ordered: bool

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
    with _deep_recursion():
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


@dataclasses.dataclass(frozen=True)
class Facts:
    """What DuckDB's parse tree of a checked query says (see :func:`duckdb_facts`).

    Attributes:
        relations: names (lower case) of the views and CTEs read anywhere in the query.
        functions: names (lower case) of the table macros called anywhere in the query.
        ordered: the outermost query has an ORDER BY (only then is DuckDB's row order defined).
    """

    relations: frozenset[str]
    functions: frozenset[str]
    ordered: bool

    def reads(self, *names: str) -> bool:
        return any(n in self.relations or n in self.functions for n in names)


# Most elements (list items or characters) one value of a query may hold when its size follows from literals.
# DuckDB's memory_limit does not bound these values (they live outside its buffer manager): measured in a fresh
# process over small20 (0.24 GB after connect), len(range(100000000)) peaked at 7.1 GB and repeat('x', 1e9) at
# 2.1 GB; len(range(10000000)) at 1.08 GB, len(range(1000000)) at 0.31 GB. DuckDB also checks for interrupts only
# between chunks, so one such value cannot be stopped by timeout= either (printf('%01000000000d', 1) ran on for
# minutes): the bound has to hold before the query runs. Sizes derived from data (range(length * 1000)) are not
# known before the query runs and are not bounded here.
MAX_GENERATED = 1_000_000

# Functions whose output size is the value of one argument (its position): repeat(s, n) -> len(s) * n, lpad(s, n)
# -> n, bar(x, lo, hi, width) -> width ... (range / generate_series are counted from start, stop, step.)
_COUNT_ARG = {"repeat": 1, "lpad": 1, "rpad": 1, "list_resize": 1, "array_resize": 1, "bar": 3, "to_base": 2,
              "bitstring": 1, "equi_width_bins": 2}
_RANGES = frozenset({"range", "generate_series"})
# Functions that apply a lambda to each element of their first argument: the result holds (elements) x (the
# lambda's result), so sizes multiply through nesting.
_PER_ELEMENT = frozenset({"list_transform", "array_transform", "apply", "list_apply", "array_apply", "list_reduce",
                          "array_reduce", "reduce", "list_filter", "array_filter", "filter"})
_FORMATTERS = frozenset({"printf", "format"})
# Arithmetic folded over literal arguments, so that repeat('x', 1000 * 1000000) is judged like repeat('x', 1e9).
_FOLD = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
         "//": lambda a, b: a // b, "%": lambda a, b: a % b, "^": lambda a, b: a ** b, "**": lambda a, b: a ** b,
         "pow": lambda a, b: a ** b, "power": lambda a, b: a ** b, "<<": lambda a, b: a * 2.0 ** b,
         "multiply": lambda a, b: a * b, "add": lambda a, b: a + b}


def _args(e: dict) -> list:
    return [a.get("expression") if isinstance(a, dict) else None for a in e.get("arguments") or []]


def _literal_number(e) -> float | None:
    """The value of a numeric constant in DuckDB's parse tree (also under a CAST, as a numeric string, or folded
    from arithmetic on such constants), else None."""
    while isinstance(e, dict) and e.get("class") == "CAST":
        e = e.get("child")
    if not isinstance(e, dict):
        return None
    if e.get("class") == "CONSTANT":
        lit_ = e.get("literal") or {}
        try:
            return float(lit_.get("text"))  # INTEGER, DECIMAL, ... and '1000000000' (DuckDB casts it implicitly)
        except (TypeError, ValueError):
            return None
    if e.get("class") == "FUNCTION" and str(e.get("function_name") or "").lower() in _FOLD:
        vals = [_literal_number(a) for a in _args(e)]
        if None in vals or not vals:
            return None
        if len(vals) == 1:
            return -vals[0] if e.get("function_name") == "-" else vals[0]
        try:
            return float(_FOLD[str(e["function_name"]).lower()](vals[0], vals[1]))
        except (OverflowError, ZeroDivisionError, ValueError):
            return float("inf")
    return None


def _literal_text(e) -> str | None:
    if isinstance(e, dict) and e.get("class") == "CONSTANT" and (e.get("literal") or {}).get("kind") == "STRING":
        return str(e["literal"].get("text"))
    return None


def _spec_widths(name: str, spec: str) -> tuple[float, bool]:
    """(sum of every number in the conversion specs of a printf / format string, whether a width or precision
    comes from an argument). Every digit run inside a spec counts, widths and precisions alike: conservative."""
    total, dynamic = 0.0, False
    if name == "printf":  # %[flags][width][.precision]type, width/precision may be '*'
        for m in re.finditer(r"%([^a-zA-Z%]*)", spec):
            total += sum(float(d) for d in re.findall(r"\d+", m.group(1)))
            dynamic = dynamic or "*" in m.group(1)
        return total, dynamic
    depth, field = 0, []  # format: {[arg][:[fill][align][sign][#][0][width][.precision][type]]}, nested {} dynamic
    for ch in spec:
        if ch == "{":
            depth += 1
            dynamic = dynamic or depth > 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                total += sum(float(d) for d in re.findall(r"\d+", "".join(field)))
                field = []
        elif depth:
            field.append(ch)
    return total, dynamic


def _too_big(name: str, size: float) -> QueryError:
    return QueryError(f"{name}(...) would allocate about {size:,.0f} elements (list items or characters), more than "
                      f"the {MAX_GENERATED:,} a query may generate from literals (DuckDB's memory_limit does not bound "
                      "such values, and its timeout cannot stop one being built); generate less, or read rows from "
                      "the views")


def _value_size(o, sizes: dict) -> float:
    """How many elements (list items or characters) the expression ``o`` of DuckDB's parse tree may produce per
    row, judged from literals: constants count their characters, column references 1, ``repeat(x, n)`` is size(x)
    x n, ``list_transform(l, lambda)`` size(l) x size(lambda body), printf/format the widths in their format
    string, other functions the sum of their arguments. Raises QueryError as soon as one value exceeds
    MAX_GENERATED. Query nodes and other containers report their largest part. Memoized in ``sizes`` by id."""
    if isinstance(o, list):
        return max((_value_size(v, sizes) for v in o), default=0.0)
    if not isinstance(o, dict):
        return 0.0
    key = id(o)
    if key in sizes:
        return sizes[key]
    cls = o.get("class")
    if cls == "CONSTANT":
        text = _literal_text(o)
        size = float(len(text)) if text is not None else 1.0
    elif cls == "COLUMN_REF":
        size = 1.0
    elif cls == "LAMBDA":
        size = _value_size(o.get("expr"), sizes)
    elif cls == "FUNCTION":
        name = str(o.get("function_name") or "").lower()
        args = _args(o)
        arg_sizes = [_value_size(a, sizes) for a in args]
        # the other parts of a call (FILTER, ORDER BY of an aggregate) are judged too
        for k in ("filter", "order_bys"):
            _value_size(o.get(k), sizes)
        size = sum(arg_sizes) or 1.0
        if name in _RANGES:
            vals = [_literal_number(a) for a in args]
            if len(vals) == 1 and vals[0] is not None:
                size = vals[0]
            elif len(vals) >= 2 and vals[0] is not None and vals[1] is not None:
                step = vals[2] if len(vals) > 2 and vals[2] else 1.0
                size = abs((vals[1] - vals[0]) / step) + (name == "generate_series")  # inclusive of its end
        elif name in _COUNT_ARG and len(args) > _COUNT_ARG[name]:
            n = _literal_number(args[_COUNT_ARG[name]])
            if n is not None:
                unit = arg_sizes[0] if name in ("repeat", "list_resize", "array_resize") and arg_sizes[0] else 1.0
                size = max(size, abs(n) * unit)
        elif name in _PER_ELEMENT and len(args) >= 2:
            size = max(size, arg_sizes[0] * max(arg_sizes[1:]))
        elif name in _FORMATTERS and args:
            spec = _literal_text(args[0])
            if spec is None:
                raise QueryError(f"{name}(...) with a format string computed by the query: its widths cannot be "
                                 "checked before it runs (a width such as %01000000000d allocates 1 GB); write the "
                                 f"format string as a literal, e.g. {name}('%d frames', n)")
            widths, dynamic = _spec_widths(name, spec)
            size += widths
            if dynamic:  # printf('%*d', n, x) / format('{:>{}}', x, n): the width is an argument
                size += max((abs(v) for v in map(_literal_number, args[1:]) if v is not None), default=0.0)
        if size > MAX_GENERATED:
            raise _too_big(name, size)
    else:
        size = max((_value_size(v, sizes) for v in o.values() if isinstance(v, (dict, list))), default=0.0)
        if cls is not None and size > MAX_GENERATED:  # CASE, a subquery's value, an operator: as big as a part
            raise _too_big(str(o.get("type") or cls).lower(), size)
    sizes[key] = size
    return size


# Scalar functions that read DuckDB's configuration: current_setting('allowed_directories' | 'temp_directory' |
# 'secret_directory' ...) tells where the cache and the home folder are. (duckdb_settings() and the other
# table functions are refused with every table function.)
SETTINGS_FUNCTIONS = frozenset({"current_setting"})


# Query nodes of DuckDB's parse tree (json_serialize_sql) that only read; DELETE/UPDATE/INSERT/MERGE ... are
# *_QUERY_NODE and can sit in a CTE.
_READ_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})


def duckdb_facts(serialized: str, ctx: Context, sql: str) -> Facts:
    """Judge DuckDB's own parse tree of ``sql`` (the text of ``SELECT json_serialize_sql(sql)``), the second look
    behind the sqlglot checks that does not depend on sqlglot reading the SQL as DuckDB does. Walks every node
    (iteratively, so depth costs no recursion) and refuses: more than one statement or anything but a query; a
    writing query node (``DELETE_QUERY_NODE`` ...) anywhere; a table function other than our table macros and
    unnest in any position (FROM, JOIN, LATERAL, subqueries, macro arguments); a qualified table name; a table name
    that is neither a view nor a CTE visible at that point (a file path, a replacement scan);
    DESCRIBE/SUMMARIZE/SHOW used as a table; ``current_setting(...)`` (SETTINGS_FUNCTIONS); a value whose size,
    judged from literals through every nesting level, exceeds MAX_GENERATED (:func:`_value_size`).

    Returns:
        :class:`Facts` (views and macros read, outermost ORDER BY).

    Raises:
        QueryError: naming the construct and the fix.
    """
    with _deep_recursion():  # json's decoder recurses per nesting level; DuckDB bounds the depth
        try:
            doc = json.loads(serialized)
        except (RecursionError, ValueError) as e:
            raise QueryError(f"the SQL is nested too deeply to check; simplify it (fewer nested subqueries or "
                             f"parentheses): {sql[:200]!r}") from e
    if doc.get("error"):
        msg = str(doc.get("error_message") or "")
        if "depth" in msg.lower():
            raise QueryError(f"the SQL exceeds DuckDB's nesting depth ({msg}); simplify it (fewer nested subqueries "
                             "or parentheses)")
        if "only select" in msg.lower():
            raise QueryError("only queries (SELECT / WITH ... SELECT) are allowed here; lerobot_sql views are "
                             f"read-only: {sql[:200]!r}")
        raise QueryError(f"DuckDB cannot parse the SQL: {msg}: {sql[:200]!r}")
    stmts = doc.get("statements") or []
    if len(stmts) != 1:
        raise QueryError(f"expected exactly one SQL statement, found {len(stmts)}; run statements one at a time")
    top = stmts[0].get("node") or {}
    ordered = any(isinstance(m, dict) and m.get("type") == "ORDER_MODIFIER" for m in top.get("modifiers") or [])
    known = {v.lower() for v in ctx.views}
    macros = {m.lower() for m in ctx.table_macros}
    tables: list[str] = []
    functions: set[str] = set()
    # (node, CTE names visible there): a CTE is visible in the query node that defines it (its FROM, select list,
    # subqueries ...) and in the CTEs defined after it in the same WITH; a recursive CTE also in its own body. A
    # table name is allowed only where a view or a visible CTE has that name: a CTE named like a file in one
    # subquery must not cover a bare path elsewhere (DuckDB would answer that with a replacement scan).
    stack: list[tuple[object, frozenset[str]]] = [(doc, frozenset())]
    while stack:
        o, visible = stack.pop()
        if isinstance(o, list):
            stack.extend((v, visible) for v in o)
            continue
        if not isinstance(o, dict):
            continue
        typ = o.get("type")
        if isinstance(typ, str):
            if typ.endswith("_QUERY_NODE") or ("cte_map" in o and typ not in _READ_NODES):
                kind = typ.removesuffix("_QUERY_NODE").removesuffix("_NODE").replace("_", " ")
                raise QueryError(f"{kind} inside a query is not allowed: lerobot_sql views are read-only and only "
                                 "queries (SELECT / WITH ... SELECT) run here; write results out with db.export() "
                                 "or db.export_manifest()")
            if typ == "SHOW_REF":
                raise QueryError("DESCRIBE / SUMMARIZE / SHOW are not run here, only SELECT queries are; columns of "
                                 "a view: db.sql('SELECT * FROM frames LIMIT 0').columns")
            if typ == "TABLE_FUNCTION":
                f = o.get("function") or {}
                name = str(f.get("function_name") or "").lower()
                if f.get("schema") or f.get("catalog") or (name not in macros and name not in SAFE_TABLE_FUNCTIONS):
                    raise _table_function_error(name + "(...)", ctx)
                functions.add(name)
            elif o.get("class") == "FUNCTION" and str(o.get("function_name") or "").lower() in SETTINGS_FUNCTIONS:
                raise QueryError(f"{o.get('function_name')}(...) is not allowed: DuckDB's settings of this "
                                 "connection (its directories, limits, paths of the cache and home folder) are not "
                                 "part of the dataset; lerobot_sql chose them (lerobot_sql.sandbox), and "
                                 "connect(..., threads=, memory_limit=, temp_directory=) sets them")
            elif typ == "BASE_TABLE":
                name = str(o.get("table_name") or "")
                if o.get("schema_name") or o.get("catalog_name"):
                    raise QueryError(f"{o.get('schema_name') or o.get('catalog_name')}.{name}: qualified table names "
                                     "are not allowed. If you meant a feature such as observation.state, quote it: "
                                     '"observation.state"')
                tables.append(name)
                if name.lower() not in known and name.lower() not in visible:
                    if "/" in name or "\\" in name or "." in name:
                        raise QueryError(f"file paths in FROM are not allowed ({name!r}); query the views "
                                         f"{ctx.public_views()}")
                    raise QueryError(f"unknown view {name!r}.{_did_you_mean(name, ctx.public_views())} "
                                     f"Views: {ctx.public_views()}")
        cte_map = o.get("cte_map")
        entries = [e for e in (cte_map.get("map") or []) if isinstance(e, dict)] if isinstance(cte_map, dict) else []
        names = [str(e.get("key", "")).lower() for e in entries]
        for i, e in enumerate(entries):
            body = e.get("value")
            own = {names[i]} if isinstance(body, dict) and \
                (body.get("query_node") or {}).get("type") == "RECURSIVE_CTE_NODE" else set()
            stack.append((body, visible | set(names[:i]) | own))
        inner = visible | set(names)
        stack.extend((v, inner) for k, v in o.items() if k != "cte_map" and isinstance(v, (dict, list)))
    with _deep_recursion():  # DuckDB bounds the depth (max_expression_depth); one frame or two per level here
        _value_size(doc, {})
    return Facts(frozenset(t.lower() for t in tables), frozenset(functions), ordered)
