"""Which frames a query can only ever read, from DuckDB's parse tree: the integer bounds its WHERE puts on
``episode_index`` and ``index`` where ``frames`` is the one table of a SELECT.

Why: DuckDB weighs the footer statistics of every row group of every data file a query over ``frames`` names, even
when one is read: ~12-23 us each, so one episode's frames took 1.3-2.1 s on a 100,000-episode dataset (100,000 row
groups). When a query's bounds are known, the catalog (:mod:`lerobot_sql._catalog.frames_part`) reads just the row
groups whose statistics meet them and puts that in the place of ``frames``; the rest of the query stays as written.

The reading is DuckDB's own (``json_serialize_sql``), the one that decides what runs; anything this module does not
recognise gives no narrowing, and the query runs over the whole view as before. A bound is taken only where
narrowing cannot change the answer: a conjunct of the WHERE of the SELECT whose FROM is ``frames`` alone (rows the
WHERE keeps all lie in the row groups kept; the WHERE still runs on them), comparing the column to integer literals.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

from .sqltext import sql_key

# the columns whose row-group statistics narrow a read (lerobot writes both as int64, sorted along each file)
COLUMNS = ("episode_index", "index")
# the views a bounding subquery may read (`episode_index IN (SELECT episode_index FROM episodes WHERE ...)`): metadata,
# read in milliseconds, so running the subquery once more to learn its values costs little
METADATA_VIEWS = frozenset({"episodes", "tasks", "episode_stats"})
_FLIP = {"COMPARE_GREATERTHAN": "COMPARE_LESSTHAN", "COMPARE_LESSTHAN": "COMPARE_GREATERTHAN",
         "COMPARE_GREATERTHANOREQUALTO": "COMPARE_LESSTHANOREQUALTO",
         "COMPARE_LESSTHANOREQUALTO": "COMPARE_GREATERTHANOREQUALTO", "COMPARE_EQUAL": "COMPARE_EQUAL"}
_NAME = re.compile(rb'\s*(?:"((?:[^"]|"")*)"|([A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*))')


@dataclasses.dataclass(frozen=True)
class Narrowing:
    """Where a query reads ``frames`` and the values it can only keep there.

    Attributes:
        start, end: byte offsets (UTF-8) of the reference to ``frames`` in the query text, its alias included.
        alias: the name the query reads it by (``frames`` when it gives none).
        bounds: column (of :data:`COLUMNS`) -> sorted, disjoint, closed integer intervals ``(lo, hi)``: a row
            whose value lies in none of them is dropped by the WHERE. An empty tuple: no row is kept.
        ctes: the names (lower case) of every CTE the query defines: the view's SELECT put in place of ``frames``
            would read a CTE of the name of a relation it reads (``tasks``, ``_episodes_raw``), not the relation.
        subqueries: ``(column, text, start, end)`` of each conjunct ``column IN (SELECT ...)`` whose SELECT reads
            only :data:`METADATA_VIEWS` (``text``: the parenthesised subquery as written, at byte offsets ``start``,
            ``end``): the values it gives bound the column too, once the catalog has run it alone (a correlated one
            does not run alone: no bound), and they stand in its place, so the query keeps the very rows it was
            narrowed by (a subquery with LIMIT, SAMPLE or random() gives other values at each run).
    """

    start: int
    end: int
    alias: str
    bounds: dict[str, tuple[tuple[int, int], ...]]
    ctes: frozenset[str] = frozenset()
    subqueries: tuple[tuple[str, str, int, int], ...] = ()


def _walk(node):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _integer(e) -> int | None:
    if isinstance(e, dict) and e.get("class") == "CONSTANT":
        lit = e.get("literal") or {}
        if lit.get("kind") == "INTEGER" and re.fullmatch(r"-?[0-9]+", str(lit.get("text", ""))):
            return int(lit["text"])
    return None


def _column(e, names: set[str]) -> str | None:
    """The narrowing column ``e`` refers to (unqualified, or qualified by ``names``: the reference's alias)."""
    if not (isinstance(e, dict) and e.get("class") == "COLUMN_REF"):
        return None
    parts = [sql_key(str(p)) for p in e.get("column_names") or []]
    if len(parts) == 1 or (len(parts) == 2 and parts[0] in names):
        return parts[-1] if parts[-1] in COLUMNS else None
    return None


def _conjuncts(e):
    if isinstance(e, dict) and e.get("type") == "CONJUNCTION_AND":
        for c in e.get("children") or []:
            yield from _conjuncts(c)
    elif e is not None:
        yield e


def _subquery(e, names: set[str], sql: str) -> tuple[str, str, int, int] | None:
    """``(column, text, start, end)`` of conjunct ``e`` when it is ``column IN (SELECT ...)`` over
    :data:`METADATA_VIEWS` only (no table function, no other table, CTE or view), else None."""
    if not (isinstance(e, dict) and e.get("class") == "SUBQUERY" and e.get("subquery_type") == "ANY"
            and e.get("comparison_type") == "COMPARE_EQUAL"):
        return None
    col = _column(e.get("child"), names)
    inner = list(_walk(e.get("subquery")))
    if col is None or any(n.get("type") in ("TABLE_FUNCTION", "PIVOT", "SHOW_REF") for n in inner) or \
            any(n.get("type") == "BASE_TABLE" and (str(n.get("table_name", "")).lower() not in METADATA_VIEWS
                                                  or n.get("schema_name") or n.get("catalog_name")) for n in inner):
        return None
    raw = sql.encode("utf-8")
    start, length = e.get("query_location"), e.get("query_location_length")
    at = (e.get("child") or {}).get("query_location")
    # (the span must begin after the column compared: that of `(episode_index) = ANY (SELECT ...)` is the whole
    # comparison, from the column on, which also begins with "(" and ends with ")")
    if not isinstance(start, int) or not isinstance(length, int) or start < 0 or start + length > len(raw) or \
            not isinstance(at, int) or start <= at:
        return None
    text = raw[start:start + length].decode("utf-8", "replace").strip()
    # (DuckDB's span of the subquery: its parentheses and what they hold; anything else is not read as one)
    return (col, text, start, start + length) if text.startswith("(") and text.endswith(")") else None


def _bound(e, names: set[str]) -> tuple[str, list[tuple[float, float]]] | None:
    """(column, intervals) that conjunct ``e`` keeps, or None when it is not one this module reads."""
    typ = e.get("type") if isinstance(e, dict) else None
    if typ == "COMPARE_IN":
        kids = e.get("children") or []
        col = _column(kids[0], names) if kids else None
        vals = [_integer(k) for k in kids[1:]]
        if col is None or not vals or any(v is None for v in vals):
            return None
        return col, [(v, v) for v in vals]
    if typ == "COMPARE_BETWEEN":
        col, lo, hi = _column(e.get("input"), names), _integer(e.get("lower")), _integer(e.get("upper"))
        if col is None or lo is None or hi is None:
            return None
        return col, [(lo, hi)] if lo <= hi else []
    if typ in _FLIP:
        left, right = e.get("left"), e.get("right")
        col, v = _column(left, names), _integer(right)
        if col is None:
            col, v, typ = _column(right, names), _integer(left), _FLIP[typ]
        if col is None or v is None:
            return None
        return col, [{"COMPARE_EQUAL": (v, v), "COMPARE_LESSTHAN": (-math.inf, v - 1),
                      "COMPARE_LESSTHANOREQUALTO": (-math.inf, v), "COMPARE_GREATERTHAN": (v + 1, math.inf),
                      "COMPARE_GREATERTHANOREQUALTO": (v, math.inf)}[typ]]
    return None


def tables_read(tree: str | dict) -> frozenset[str]:
    """The names (lower case) of the tables and views a query reads, from its parse tree ``tree``
    (``json_serialize_sql``'s output); a CTE it reads is among them (the tree does not tell them apart)."""
    doc = json.loads(tree) if isinstance(tree, str) else tree
    return frozenset(str(n.get("table_name", "")).lower() for n in _walk(doc) if n.get("type") == "BASE_TABLE")


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _intersect(a, b) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def narrow_frames(tree: str | dict, sql: str) -> tuple[Narrowing, ...]:
    """The :class:`Narrowing` of each reference to ``frames`` in query ``sql`` that one can be made of, from DuckDB's
    parse tree ``tree`` (``json_serialize_sql``'s output), in the order of the text; empty when ``frames`` is the
    name of a CTE. A reference is left as it is when it is joined, sampled or given column aliases, lies in a
    select-list expression without an alias (whose text names a column), or no WHERE conjunct of its SELECT bounds
    ``episode_index`` or ``index`` by integer literals. Each reference is judged in its own SELECT (a bound there
    keeps all the rows that SELECT's WHERE keeps), so a UNION of bounded SELECTs narrows each."""
    doc = json.loads(tree) if isinstance(tree, str) else tree
    stmts = doc.get("statements") if isinstance(doc, dict) and not doc.get("error") else None
    if not stmts or len(stmts) != 1:
        return ()
    nodes = list(_walk(stmts[0]))
    names_of_ctes = set()
    for n in nodes:  # a CTE named frames anywhere: a reference might be to it
        ctes = n.get("cte_map")
        for entry in (ctes.get("map") or []) if isinstance(ctes, dict) else []:
            if not isinstance(entry, dict) or str(entry.get("key", "")).lower() == "frames":
                return ()
            names_of_ctes.add(str(entry.get("key", "")).lower())
    refs = [n for n in nodes if n.get("type") == "BASE_TABLE" and str(n.get("table_name", "")).lower() == "frames"]
    # an unaliased select-list expression is named by its text ("(SELECT count_star() FROM frames WHERE ...)"): with
    # the view's SELECT spliced into it, the column would be named by that instead
    named_by_text = [e for n in nodes if isinstance(n.get("select_list"), list)
                     for e in n["select_list"] if isinstance(e, dict) and not e.get("alias")]
    out = []
    for ref in refs:
        if any(x is ref for e in named_by_text for x in _walk(e)):
            continue
        got = _narrow_one(nodes, ref, sql, frozenset(names_of_ctes))
        if got is not None:
            out.append(got)
    out.sort(key=lambda n: n.start)
    if any(a.end > b.start for a, b in zip(out, out[1:])):
        return ()  # (spans that overlap: not a reading to splice by)
    return tuple(out)


def _narrow_one(nodes: list, ref: dict, sql: str, ctes: frozenset[str]) -> Narrowing | None:
    if ref.get("schema_name") or ref.get("catalog_name") or ref.get("sample") is not None or \
            ref.get("at_clause") is not None or ref.get("column_name_alias"):
        return None
    owner = [n for n in nodes if n.get("type") == "SELECT_NODE" and n.get("from_table") is ref]
    if len(owner) != 1 or owner[0].get("sample") is not None:
        return None
    alias = str(ref.get("alias") or "")
    names = {sql_key(alias)} if alias else {"frames"}
    found: dict[str, list] = {}
    subqueries = []
    for c in _conjuncts(owner[0].get("where_clause")):
        got = _bound(c, names)
        if got is not None:
            col, iv = got
            iv = _union(iv)
            found[col] = iv if col not in found else _intersect(found[col], iv)
        sub = _subquery(c, names, sql)
        # (a CTE named like a metadata view would be what the subquery reads, not the view it would run alone over)
        if sub is not None and not ctes & METADATA_VIEWS:
            subqueries.append(sub)
    if not found and not subqueries:
        return None
    span = _span(sql, ref, alias)
    if span is None:
        return None
    bounds = {c: tuple((lo if lo == -math.inf else int(lo), hi if hi == math.inf else int(hi)) for lo, hi in iv)
              for c, iv in found.items()}
    return Narrowing(span[0], span[1], alias or "frames", bounds, ctes, tuple(subqueries))


def _unquote(m: re.Match) -> str:
    return (m.group(1).replace(b'""', b'"') if m.group(1) is not None else m.group(2)).decode("utf-8", "replace")


def _span(sql: str, ref: dict, alias: str) -> tuple[int, int] | None:
    """The byte span of the reference, checked: it begins with the name ``frames`` and ends with ``alias`` (DuckDB
    gives where the reference lies; a span this reading does not confirm gives no narrowing)."""
    raw = sql.encode("utf-8")
    start, length = ref.get("query_location"), ref.get("query_location_length")
    if not isinstance(start, int) or not isinstance(length, int) or start < 0 or length <= 0 or \
            start + length > len(raw):
        return None
    text = raw[start:start + length]
    m = _NAME.match(text)
    if m is None or m.start() != 0 or _unquote(m).lower() != "frames":
        return None
    rest = text[m.end():]
    if not alias:
        return (start, start + length) if not rest.strip() else None
    tail = re.search(rb'(?:"((?:[^"]|"")*)"|([A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*))\s*$', rest)
    if tail is None or _unquote(tail) != alias:
        return None
    return start, start + length
