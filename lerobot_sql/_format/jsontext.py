"""JSON read from a dataset's files (info.json, stats.json, the v2.x JSON lines) and from manifest metadata: the one
parser, so that every way such text can fail is a typed error naming where it came from.

A file's text is hostile: beside invalid JSON and bytes that are not UTF-8, JSON nested past about 1,000 levels
(``[[[[...]]]]``, valid JSON) makes Python's parser raise RecursionError, which no caller would expect.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from ..errors import DatasetFormatError, LeRobotSQLError


def load_json(text: str | bytes, where: str, fix: str,
              error: type[LeRobotSQLError] = DatasetFormatError) -> Any:
    """``json.loads(text)``, each failure raised as ``error`` naming ``where`` and giving ``fix``.

    Args:
        text: the JSON text (bytes are decoded as UTF-8, as ``json.loads`` does).
        where: what the text is, as the message names it: a path or URL, ``<path>:<line>`` for a JSON-lines file.
        fix: what to do, the end of the message (e.g. "restore it from the dataset's source").
        error: the class raised (a manifest's metadata raises ``ResultContractError``).

    Returns:
        The parsed value (dict, list, str, int, float, bool or None).

    Raises:
        DatasetFormatError (or ``error``): not valid JSON (with line, column and the text near it), not UTF-8, or
            nested too deeply for Python's parser.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        near = e.doc[max(0, e.pos - 40):e.pos + 20]
        raise error(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}, near {near!r}); "
                    f"{fix}") from e
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text ({e.reason} at byte {e.start}); {fix}") from e
    except RecursionError as e:
        # The parser recurses once per level of [ ] or { }: past the interpreter's limit it gives up. lerobot's
        # metadata is a few levels deep, so such text was never written by lerobot.
        raise error(f"{where}: JSON nested too deeply to parse (over about {sys.getrecursionlimit():,} levels of "
                    f"[ ] or {{ }}; lerobot writes a few); {fix}") from e


def json_text(value: Any, where: str = "a JSON value") -> str:
    """``value`` (as :func:`load_json` returns it) as JSON text that DuckDB's ``JSON`` type accepts: Python's parser
    reads ``NaN`` and ``Infinity``, which are not JSON, so non-finite numbers become ``null``. Compact, as DuckDB
    writes JSON (``[1,"a"]``).

    Raises:
        DatasetFormatError: ``value`` is nested too deeply to write back (the parser took it near the interpreter's
            recursion limit and writing it recurses from deeper in the stack; hostile review 20, M4), naming
            ``where``.
    """
    try:
        try:
            return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except ValueError:
            return json.dumps(_finite(value), allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError as e:
        raise DatasetFormatError(f"{where}: JSON nested too deeply (near {sys.getrecursionlimit():,} levels of [ ] or "
                                 "{ }; lerobot writes a few): fix or remove that entry") from e


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
