"""``lerobot-sql shell DATASET``: an interactive SQL prompt over the views (Python's ``cmd`` + readline).

Statements end with ``;`` and may span lines; dot commands (``.views``, ``.schema VIEW``, ``.quit``) take one line.
The ``;`` that ends a statement is found by sqlglot's DuckDB tokenizer (:func:`split_statements`), so one inside a
string, a ``$$`` string or a comment is text. Piped input runs as a script without prompts: every statement runs (an
error does not stop the script) and the exit status is 1 if any statement or dot command failed, else 0, also when
the script ends with ``.quit``; input that ends inside a quote or comment is one error naming it. An interactive
session always exits 0. Errors go to stderr in order with the results (stdout is flushed first).
"""

from __future__ import annotations

import cmd
import contextlib
import re
import sys
from pathlib import Path

from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from ..errors import LeRobotSQLError, QueryError, QueryInterrupted, did_you_mean
from .output import error_hint, one_line, print_table, run_sql, views_and_columns

# What an unfinished token starts with -> (what it is, what closes it). The tokenizer only says that it failed; the
# opener is read here from the text after the last whole token. E'..', X'..', B'..', R'..' are strings too.
_OPENERS = [
    (re.compile(r"/\*"), "a /* comment", "*/"),
    (re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$"), None, None),  # $$ or $tag$: named by the tag itself
    (re.compile(r'"'), "a quoted identifier", '"'),
    (re.compile(r"[A-Za-z]?'"), "a string literal", "'"),
]


def split_statements(text: str) -> tuple[list[str], str, tuple[int, str, str] | None]:
    """Split ``text`` where DuckDB's SQL ends statements: at the ``;`` tokens of sqlglot's DuckDB tokenizer, so a
    ``;`` inside a string (``'a;b'``, ``E'it\\'s;'``), a ``$$ ; $$`` string, a quoted name or a comment is text.

    Returns:
        ``(statements, rest, unclosed)``: the complete statements without their ``;`` (those holding only comments
        left out); the text after the last ``;`` (``""`` when it holds only blanks and comments); ``unclosed`` is
        None, or, when ``text`` ends inside a quote, a dollar-quoted string or a block comment,
        ``(offset in text where it opens, what it is, what closes it)``, e.g. ``(7, "a string literal", "'")``.
    """
    tokenizer = DuckDB().tokenizer()
    unclosed = None
    try:
        tokens = tokenizer.tokenize(text)
    except TokenError:
        tokens = list(tokenizer.tokens)  # the whole tokens before the one the text ended inside
        unclosed = _unclosed(text, tokens[-1].end + 1 if tokens else 0)
    out, start, seen = [], 0, False
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            if seen:
                out.append(text[start:tok.start].strip())
            start, seen = tok.end + 1, False
        else:
            seen = True
    rest = text[start:] if seen or unclosed else ""
    return out, rest, unclosed


def _unclosed(text: str, pos: int) -> tuple[int, str, str]:
    """What opens at or after ``pos`` (past blanks) and is never closed: ``(offset, what, closer)``."""
    pos += len(text[pos:]) - len(text[pos:].lstrip())
    for pattern, what, closer in _OPENERS:
        m = pattern.match(text, pos)
        if m:
            if what is None:  # a dollar-quoted string: it ends at the same tag
                return pos, f"a {m.group()} string", m.group()
            return pos, what, closer
    return pos, "an unfinished token", "the rest of it"


class SQLShell(cmd.Cmd):
    """``lerobot-sql shell``: SQL statements end with ``;`` and may span lines; dot commands are one line."""

    DOT_HELP = """\
.views              list the views
.schema [VIEW]      columns and types of every view, or of VIEW
.maxrows N          rows shown per result (0 = all)
.help               this text
.quit / .exit       leave (or Ctrl-D)
Statements are read-only SELECT queries over the views and end with ';'."""

    def __init__(self, db, max_rows: int = 40, stdin=None, stdout=None):
        super().__init__(stdin=stdin, stdout=stdout)
        self.db, self.max_rows = db, max_rows
        self.interactive = sys.stdin.isatty()
        self.buffer = ""
        self.lines = 0          # input lines read so far
        self.buffer_line = 1    # the input line the buffer starts on: what an error at EOF names
        self.errors = 0
        self.prompt = "lsql> " if self.interactive else ""
        self.intro = (f"{db}\nviews: {', '.join(db.views())}\nstatements end with ';'   .help for commands"
                      if self.interactive else None)
        self._words: list[str] | None = None

    def run(self) -> int:
        if self.interactive:
            self._history()
        while True:
            try:
                self.cmdloop()
                break
            except KeyboardInterrupt:  # Ctrl-C drops the unfinished statement, keeps the shell
                print("^C", file=sys.stderr)
                self.buffer, self.prompt, self.intro = "", "lsql> " if self.interactive else "", None
        # A piped script that hit an error exits 1, like the other subcommands.
        return 1 if self.errors and not self.interactive else 0

    @staticmethod
    def _history() -> None:
        """Keep statements across sessions in ~/.lerobot_sql_history (readline, where available)."""
        try:
            import atexit
            import readline
        except ImportError:
            return
        path = Path.home() / ".lerobot_sql_history"
        with contextlib.suppress(OSError):
            readline.read_history_file(path)
        readline.set_history_length(1000)

        def save() -> None:
            with contextlib.suppress(OSError):
                readline.write_history_file(path)

        atexit.register(save)

    def emptyline(self) -> bool:
        return False

    def onecmd(self, line: str) -> bool:
        if line == "EOF":
            if self.interactive:
                print()
            if self.buffer.strip():
                self.finish()
            return True
        self.lines += 1
        if not self.buffer:
            self.buffer_line = self.lines
        if not self.buffer and line.strip().startswith("."):
            return self.dot(line.strip())
        text = self.buffer + line + "\n"
        statements, self.buffer, _ = split_statements(text)
        self.buffer_line += text[:len(text) - len(self.buffer)].count("\n")
        for stmt in statements:
            self.execute(stmt)
        pending = bool(self.buffer.strip())
        if not pending:
            self.buffer = ""
        # Inside an open quote or comment too: the next line continues it.
        self.prompt = ("  ...> " if pending else "lsql> ") if self.interactive else ""
        return False

    def finish(self) -> None:
        """At the end of the input: run the last statement, which may lack its ``;``; or, when the input ended
        inside a quote, a dollar-quoted string or a block comment, report that (nothing could ever close it)."""
        text, self.buffer = self.buffer, ""
        _, rest, unclosed = split_statements(text)
        if unclosed is None:
            if rest.strip():
                self.execute(rest.strip())
            return
        pos, what, closer = unclosed  # pos: an offset in text, which starts on input line self.buffer_line
        line = self.buffer_line + text[:pos].count("\n")
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        opened = text[pos:].split("\n", 1)[0]
        opened = opened if len(opened) <= 40 else opened[:40] + "..."
        self.report(QueryError(f"the input ended inside {what} opened at line {line}, column {column} "
                               f"({opened!r}): that statement did not run"),
                    hint=f"close {what.replace('a ', 'the ', 1)} with {closer} and end the statement with ;")

    def report(self, e: BaseException, hint: str | None = None) -> None:
        """One ``error:`` line on stderr, then ``hint`` or the CLI's hint for ``e`` (:func:`error_hint`) if any."""
        self.errors += 1
        # stdout is block-buffered when piped: flush the results printed so far so that, with 2>&1, the error
        # lands right after the statement that failed rather than before earlier output.
        sys.stdout.flush()
        print(f"error: {one_line(e)}", file=sys.stderr)
        hint = hint or error_hint(e)
        if hint:  # inside the shell, the schema is one dot command away
            hint = hint.replace("`lerobot-sql schema DATASET [VIEW]`", ".schema [VIEW]").replace(
                "`lerobot-sql schema DATASET VIEW`", ".schema VIEW")
            print(f"hint: {hint}", file=sys.stderr)
        sys.stderr.flush()

    def execute(self, stmt: str) -> None:
        try:
            print_table(run_sql(self.db, stmt), self.max_rows)
        except LeRobotSQLError as e:
            self.report(e)
        except KeyboardInterrupt:  # (landed outside the query's run, while it was checked or its result drawn: that
            self.report(QueryInterrupted.ctrl_c(stmt))  # statement interrupted too, as during its run; the shell goes on)
        sys.stdout.flush()

    def dot(self, line: str) -> bool:
        word, _, rest = line.partition(" ")
        rest = rest.strip().rstrip(";")
        if word in (".quit", ".exit", ".q"):
            return True
        if word == ".help":
            print(self.DOT_HELP)
        elif word in (".views", ".tables"):
            print("\n".join(self.db.views()))
        elif word == ".schema":
            views = views_and_columns(self.db)
            if rest and rest not in views:
                self.report(QueryError(f"unknown view {rest!r}.{did_you_mean(rest, views)} Views: {sorted(views)}"))
                return False
            for v, cols in views.items():
                if not rest or v == rest:
                    print(v)
                    w = max((len(c) for c, _ in cols), default=0)
                    print("\n".join(f"  {c:<{w}}  {t}" for c, t in cols))
        elif word == ".maxrows" and rest.isdigit():
            self.max_rows = int(rest)
        else:
            self.report(QueryError(f"unknown command {line!r}; .help lists the commands"))
        sys.stdout.flush()
        return False

    # readline completion over views, columns, dot commands and common keywords
    def words(self) -> list[str]:
        if self._words is None:
            cols = {c for cs in views_and_columns(self.db).values() for c, _ in cs}
            self._words = sorted(set(self.db.views()) | {f'"{c}"' if not c.isidentifier() else c for c in cols} |
                                 {".views", ".schema", ".help", ".quit", ".maxrows"} |
                                 {k.lower() for k in ("SELECT", "FROM", "WHERE", "GROUP BY", "ORDER BY", "LIMIT",
                                                       "JOIN", "USING", "count", "DISTINCT", "list_contains")})
        return self._words

    def completenames(self, text, *ignored):
        return [w for w in self.words() if w.startswith(text)]

    def completedefault(self, text, *ignored):
        return [w for w in self.words() if w.startswith(text)]
