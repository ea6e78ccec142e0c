"""DuckDB 1.x list lambdas (``x -> expr``), rewritten to the 2.x form (``lambda x: expr``) before the checks parse
the SQL: DuckDB 2.x rejects the arrow form, and users' queries (and lerobot's docs) still write it.

Only the arrows DuckDB 1.x read as a lambda are rewritten: an argument of a function that takes one, at a position
where it takes one (the positions come from ``duckdb_functions()``, handed in as data, so this module needs no
DuckDB). Every other ``->`` is JSON extraction and is kept.
"""

from __future__ import annotations

from typing import Callable, Mapping

import sqlglot
from sqlglot.tokens import TokenType


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
