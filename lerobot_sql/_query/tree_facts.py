"""The second look at a checked query: facts read from DuckDB's own parse tree (``json_serialize_sql``), walked
whole and iteratively, so that the wall does not depend on sqlglot reading the SQL as DuckDB does.

:func:`duckdb_facts` refuses what must never run (a statement node anywhere, a table function, a file path, a
qualified name, DuckDB's settings) and returns the :class:`Facts` the entry points plan from (what is read, whether
the outermost query is ordered). It also bounds, before the query runs, the values whose size follows from the SQL
text (``MAX_GENERATED``: DuckDB's memory_limit does not hold them back and its timeout cannot stop one being
built), and refuses a recursive CTE whose step doubles a value.
"""

from __future__ import annotations

import dataclasses
import json
import re

from ..errors import QueryError
from ..errors import did_you_mean as _did_you_mean
from .checks import SAFE_TABLE_FUNCTIONS, Context, deep_recursion, table_function_error


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
# Functions whose result can be longer than all their arguments together: (the argument that is copied, the
# argument each copy may be replaced by or joined with): replace(repeat('x', 1000), 'x', repeat('y', 1000)) is 1e6
# characters from 2,000, and nested once more 1e9.
_TIMES_ARG = {"replace": (0, 2), "regexp_replace": (0, 2), "array_to_string": (0, 1), "list_to_string": (0, 1)}
# Encoders: at most this many characters out per character (or element) in; nested, they multiply.
_EXPANSION = {"bin": 8, "to_binary": 8, "hex": 2, "to_hex": 2, "base64": 2, "to_base64": 2, "url_encode": 3,
              "regexp_escape": 2, "to_json": 6, "json_quote": 6, "array_to_json": 6, "row_to_json": 6,
              "json_array": 6, "json_object": 6}
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


def _constant(o) -> bool:
    """True when the expression ``o`` of DuckDB's parse tree takes no value from rows (no column, ``*``, ``count(*)``
    or window function): its value follows from the SQL text alone (``abs(1000000000)``, ``(SELECT 1000000000)``,
    ``(SELECT 1000000000 FROM episodes LIMIT 1)``, ``CAST('2000-01-01' AS TIMESTAMP)``)."""
    return not any(x.get("class") in ("COLUMN_REF", "STAR", "LAMBDA_REF", "POSITIONAL_REFERENCE", "PARAMETER", "WINDOW")
                   or (x.get("class") == "FUNCTION" and str(x.get("function_name") or "").lower() == "count_star")
                   for x in _dicts(o))


def _count(name: str, arg) -> float | None:
    """The value of a size argument of ``name`` (a count, a width, a range bound) when it is a number literal or
    arithmetic on them; None when it comes from the data (a column, a table).

    Raises:
        QueryError: the argument is computed from constants only (a function call, a cast, a scalar subquery):
            ``repeat('x', abs(1000000000))`` is as big as ``repeat('x', 1000000000)``, and DuckDB builds it as one
            value that neither memory_limit bounds nor timeout= stops, so it is refused before it runs.
    """
    n = _literal_number(arg)
    if n is None and isinstance(arg, dict) and _constant(arg):
        raise QueryError(f"{name}(...) takes a size (a count, a width or a range bound) computed from constants "
                         "(a function call such as abs(...), a cast to a date or time, or a scalar subquery), so "
                         "the query checks cannot tell how much it would allocate: they size only number literals "
                         f"and arithmetic on them (at most {MAX_GENERATED:,} elements per value), since DuckDB "
                         "builds such a value in one piece that neither memory_limit bounds nor timeout= stops. "
                         f"Write the number itself, e.g. {name}(..., 1000)")
    return n


def _too_big(name: str, size: float) -> QueryError:
    return QueryError(f"{name}(...) would allocate about {size:,.0f} elements (list items or characters), more than "
                      f"the {MAX_GENERATED:,} a query may generate from literals (DuckDB's memory_limit does not bound "
                      "such values, and its timeout cannot stop one being built); generate less, or read rows from "
                      "the views")


def _value_size(o, sizes: dict) -> float:
    """How many elements (list items or characters) the expression ``o`` of DuckDB's parse tree may produce per
    row, judged from literals: constants count their characters, column references 1, ``repeat(x, n)`` is size(x)
    x n, ``list_transform(l, lambda)`` size(l) x size(lambda body), printf/format the widths in their format
    string, ``replace(s, a, b)`` size(s) x size(b) more, encoders (``bin``, ``hex``, ``to_json`` ...) their
    expansion factor, other functions the sum of their arguments. A size argument computed from constants but not
    a literal is refused (:func:`_count`). Raises QueryError as soon as one value exceeds
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
            vals = [_count(name, a) for a in args]
            if len(vals) == 1 and vals[0] is not None:
                size = vals[0]
            elif len(vals) >= 2 and vals[0] is not None and vals[1] is not None:
                step = vals[2] if len(vals) > 2 and vals[2] else 1.0
                size = abs((vals[1] - vals[0]) / step) + (name == "generate_series")  # inclusive of its end
        elif name in _COUNT_ARG and len(args) > _COUNT_ARG[name]:
            n = _count(name, args[_COUNT_ARG[name]])
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
                size += max((abs(v) for v in (_count(name, a) for a in args[1:]) if v is not None), default=0.0)
        elif name in _TIMES_ARG and len(args) > max(_TIMES_ARG[name]):
            copied, by = _TIMES_ARG[name]
            size += arg_sizes[copied] * max(1.0, arg_sizes[by])
        elif name in _EXPANSION:
            size *= _EXPANSION[name]
        if size > MAX_GENERATED:
            raise _too_big(name, size)
    else:
        size = max((_value_size(v, sizes) for v in o.values() if isinstance(v, (dict, list))), default=0.0)
        if cls is not None and size > MAX_GENERATED:  # CASE, a subquery's value, an operator: as big as a part
            raise _too_big(str(o.get("type") or cls).lower(), size)
    sizes[key] = size
    return size


# ---- recursive CTEs -----------------------------------------------------------------------------------------------
# Functions whose result has a size of its own, whatever the size of their arguments (numbers, booleans, measures):
# ``n + 1``, ``length(s)`` in a recursive member do not grow with each step.
_FIXED_SIZE = frozenset(_FOLD) | {
    "&", "|", "#", "xor", ">>", "~", "mod", "divide", "subtract", "abs", "sign", "round", "floor", "ceil", "ceiling",
    "trunc", "sqrt", "ln", "log", "log2", "log10", "exp", "length", "len", "strlen", "array_length", "octet_length",
    "bit_length", "length_grapheme", "count", "count_star", "sum", "avg", "mean", "hash", "md5", "sha1", "sha256",
    "ascii", "ord", "instr", "position", "strpos", "contains", "starts_with", "ends_with", "prefix", "suffix",
    "list_contains", "array_contains", "list_has", "list_position", "array_position", "epoch", "epoch_ms",
    "date_part", "datepart", "extract", "isnan", "isinf", "isfinite", "typeof", "row_number", "rank"}
# Functions whose result is one of their arguments.
_CHOOSE = frozenset({"greatest", "least", "coalesce", "ifnull", "nullif", "if", "min", "max", "any_value", "first",
                     "last", "arbitrary", "list_extract", "list_element", "array_extract", "element_at"})
# Aggregates that gather many rows' values into one.
_COLLECT = frozenset({"string_agg", "group_concat", "listagg", "list", "array_agg", "histogram", "map_agg"})


def _select_nodes(o) -> list[dict]:
    """Every SELECT_NODE inside ``o`` (a query node of DuckDB's parse tree), subqueries and set operations included."""
    return [x for x in _dicts(o) if x.get("type") == "SELECT_NODE"]


def _reads_table(o, name: str) -> bool:
    return any(x.get("type") == "BASE_TABLE" and str(x.get("table_name") or "").lower() == name
               for x in _dicts(o))


def _dicts(o):
    stack = [o]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, dict):
            yield x
            stack.extend(v for v in x.values() if isinstance(v, (dict, list)))


def _output_names(node) -> set[str] | None:
    """The column names a query node outputs (aliases, or the column a reference names), None when it has a ``*``
    (then any name may be one of them)."""
    while isinstance(node, dict) and node.get("type") != "SELECT_NODE" and "left" in node:
        node = node["left"]  # a set operation: its columns are named by its first member
    names: set[str] = set()
    for item in (node or {}).get("select_list") or []:
        if not isinstance(item, dict) or item.get("class") == "STAR":
            return None
        if item.get("alias"):
            names.add(str(item["alias"]).lower())
        elif item.get("class") == "COLUMN_REF" and item.get("column_names"):
            names.add(str(item["column_names"][-1]).lower())
    return names


def _check_recursive(cte: str, body: dict) -> None:
    """Refuse a recursive CTE whose recursive member builds a value from two or more copies of the previous step's
    values (``s || s``, ``concat(s, s)``, ``repeat(s, 2)``, ``[l, l]``, ``list_transform(l, lambda x: x || x)``,
    ``string_agg`` of them), or takes a size (a ``repeat``/``lpad`` count, a ``range`` bound) from them: the value
    then doubles with each step (2^40 characters after 40), one piece that memory_limit does not hold back (measured:
    the string of ``s || s`` reached the limit plus twice its last value) and timeout= cannot stop while it is built.
    A step that adds a fixed amount (``s || 'x'``, ``n + 1``, ``a + b`` on numbers) is allowed: each step is a
    separate piece of work that timeout= and Ctrl-C stop, and memory_limit spills.

    ``body``: the CTE's entry in DuckDB's parse tree (``aliases``, ``query_node`` of type RECURSIVE_CTE_NODE).
    Which column references are the previous step's: those qualified by the CTE (or an alias of it, or a derived
    table that reads it), and unqualified names of its columns in a SELECT that reads it."""
    node = body.get("query_node") or {}
    left = node.get("left")
    cols = {str(a).lower() for a in body.get("aliases") or []} or _output_names(left)
    for sel in _select_nodes(node.get("right")):
        if not _reads_table(sel.get("from_table"), cte):
            continue
        quals, names = {cte}, set(cols) if cols is not None else None
        for ref in _dicts(sel.get("from_table")):
            if ref.get("type") == "BASE_TABLE" and str(ref.get("table_name") or "").lower() == cte and ref.get("alias"):
                quals.add(str(ref["alias"]).lower())
            elif ref.get("type") == "SUBQUERY" and _reads_table(ref.get("subquery"), cte):
                if ref.get("alias"):
                    quals.add(str(ref["alias"]).lower())
                out = _output_names((ref.get("subquery") or {}).get("node"))
                names = None if out is None or names is None else names | out

        params: set[str] = set()  # parameters of the lambdas being judged: elements of the previous step's lists

        # (the step's sets bound as defaults: these closures are called within this iteration only)
        def own(ref: dict, params: set[str] = params, quals: set[str] = quals, names=names) -> bool:
            parts = [str(p).lower() for p in ref.get("column_names") or []]
            if not parts:
                return False
            if parts[0] in params or (len(parts) >= 2 and parts[0] in quals):
                return True
            return names is None or parts[0] in names

        def growth(o, params: set[str] = params) -> float:
            """How many copies of the previous step's values the expression ``o`` may hold."""
            if isinstance(o, list):
                return max((growth(v) for v in o), default=0.0)
            if not isinstance(o, dict):
                return 0.0
            cls = o.get("class")
            if cls == "COLUMN_REF":
                return 1.0 if own(o) else 0.0
            if cls == "STAR":
                return 1.0
            if cls in ("CONSTANT", "COMPARISON", "CONJUNCTION", "BETWEEN"):
                return 0.0
            if cls in ("FUNCTION", "WINDOW", "AGGREGATE"):
                name = str(o.get("function_name") or "").lower()
                args = _args(o) if "arguments" in o else list(o.get("children") or [])
                grows = [growth(a) for a in args]
                sized = [args[_COUNT_ARG[name]]] if name in _COUNT_ARG and len(args) > _COUNT_ARG[name] else \
                    args if name in _RANGES else []
                if name in _FORMATTERS and args and _spec_widths(name, _literal_text(args[0]) or "")[1]:
                    sized = args[1:]  # a width from an argument (printf('%*d', n, x)): which one is not known
                if any(growth(a) or any(d.get("class") == "COLUMN_REF" and own(d) for d in _dicts(a))
                       for a in sized if a is not None):
                    raise _recursive_error(cte, f"{name}(...) takes its size from the previous step's row")
                if name in _FIXED_SIZE:
                    return 0.0
                if name in _CHOOSE:
                    return max(grows, default=0.0)
                if name in _COLLECT:
                    return 2.0 * max(grows, default=0.0)
                if name in ("repeat", "list_resize", "array_resize"):
                    n = _literal_number(args[1]) if len(args) > 1 else None
                    return grows[0] * (2.0 if n is None else abs(n)) if grows else 0.0
                if name in ("lpad", "rpad"):
                    return 0.0  # as long as its literal count
                if name in _PER_ELEMENT and len(args) >= 2:
                    # list_transform(l, lambda x: x || x): each element of the previous step's l doubled
                    lam = [str(p).lower() for a in args[1:] if isinstance(a, dict) and a.get("class") == "LAMBDA"
                           for d in _dicts(a.get("lhs")) for p in (d.get("column_names") or [])[:1]]
                    added = set(lam) - params if grows[0] else set()
                    params.update(added)
                    try:
                        body = max(growth(a) for a in args[1:])
                    finally:
                        params.difference_update(added)
                    return grows[0] * max(1.0, body)
                return sum(grows)
            if cls == "LAMBDA":
                return growth(o.get("expr"))
            if cls == "SUBQUERY":
                return 1.0 if _reads_table(o, cte) else 0.0  # its own SELECT is judged as one of _select_nodes
            return max((growth(v) for k, v in o.items() if isinstance(v, (dict, list))), default=0.0)

        for item in sel.get("select_list") or []:
            if growth(item) >= 2:
                raise _recursive_error(cte, "a value of its recursive member is built from two or more copies of "
                                            "the previous step's values (s || s, concat(s, s), repeat(s, 2), "
                                            "[l, l], string_agg ...)")


def _recursive_error(cte: str, why: str) -> QueryError:
    return QueryError(f"WITH RECURSIVE {cte}: {why}, so it doubles with each step (2^40 characters after 40 steps): "
                      "each step would allocate one value twice the last, which DuckDB's memory_limit does not hold "
                      "back and timeout= cannot stop while it is built. Let each step add a fixed amount instead "
                      "(s || 'x', n + 1), or build the value outside the recursion")


# Scalar functions that read DuckDB's configuration or catalog: current_setting('allowed_directories' |
# 'temp_directory' | 'secret_directory' ...) tells where the cache and the home folder are; DuckDB's built-in macros
# that select from its catalog table functions (pg_get_viewdef(oid): every view's SQL, with the cache folder and the
# dataset's absolute paths; pg_get_constraintdef, format_type, get_block_size) pass as scalar calls although they
# run a table function inside; and the functions that take SQL text and bind it inside DuckDB, where neither look
# sees it (json_serialize_plan(..., optimize := true) folded current_setting('temp_directory') into its answer).
# (duckdb_settings() and the other table functions are refused with every table function.)
SETTINGS_FUNCTIONS = frozenset({"current_setting", "pg_get_viewdef", "pg_get_constraintdef", "format_type",
                                "get_block_size", "json_serialize_plan", "json_serialize_sql", "json_deserialize_sql",
                                "json_execute_serialized_sql"})


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
    judged from literals through every nesting level, exceeds MAX_GENERATED, or whose size argument is computed
    from constants (:func:`_value_size`, :func:`_count`); a recursive CTE whose step doubles a value
    (:func:`_check_recursive`).

    Returns:
        :class:`Facts` (views and macros read, outermost ORDER BY).

    Raises:
        QueryError: naming the construct and the fix.
    """
    with deep_recursion():  # json's decoder recurses per nesting level; DuckDB bounds the depth
        try:
            doc = json.loads(serialized)
        except (RecursionError, ValueError) as e:
            raise QueryError(f"the SQL is nested too deeply to check; simplify it (fewer nested subqueries or "
                             f"parentheses): {sql[:200]!r}") from e
    if doc.get("error"):
        msg = str(doc.get("error_message") or "")
        if "depth" in msg.lower():
            # without DuckDB's 'Use "SET max_expression_depth TO x"': the locked connection refuses SET
            msg = re.sub(r'\s*Use "SET max_expression_depth[^.]*\.', "", msg)
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
                    raise table_function_error(name + "(...)", ctx)
                functions.add(name)
            elif o.get("class") == "FUNCTION" and str(o.get("function_name") or "").lower() in SETTINGS_FUNCTIONS:
                raise QueryError(f"{o.get('function_name')}(...) is not allowed: DuckDB's settings and catalog of "
                                 "this connection (its directories, limits, the views' SQL with the paths of the "
                                 "cache and home folder) are not part of the dataset; lerobot_sql chose them "
                                 "(lerobot_sql.sandbox), and connect(..., threads=, memory_limit=, temp_directory=) "
                                 "sets them")
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
            if own:
                with deep_recursion():  # one or two frames per nesting level; DuckDB bounds the depth
                    _check_recursive(names[i], body)
            stack.append((body, visible | set(names[:i]) | own))
        inner = visible | set(names)
        stack.extend((v, inner) for k, v in o.items() if k != "cte_map" and isinstance(v, (dict, list)))
    with deep_recursion():  # DuckDB bounds the depth (max_expression_depth); one frame or two per level here
        _value_size(doc, {})
    return Facts(frozenset(t.lower() for t in tables), frozenset(functions), ordered)
