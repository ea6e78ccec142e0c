"""``lerobot-sql shell DATASET``: an interactive SQL prompt over the views (Python's ``cmd`` + readline).

Statements end with ``;`` and may span lines; dot commands (``.views``, ``.schema VIEW``, ``.quit``) take one line.
Piped input runs as a script without prompts: every statement runs (an error does not stop the script) and the exit
status is 1 if any statement or dot command failed, else 0, also when the script ends with ``.quit``. An
interactive session always exits 0. Errors go to stderr in order with the results (stdout is flushed first).
"""

from __future__ import annotations

import cmd
import contextlib
import sys
from pathlib import Path

from .output import error_hint, one_line, print_table, run_sql, views_and_columns
from ..errors import LeRobotSQLError, QueryError, did_you_mean

def split_statements(text: str) -> tuple[list[str], str]:
    """Split ``text`` at semicolons outside quotes and comments: (complete statements, unfinished rest)."""
    out, start, i, quote = [], 0, 0, None
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif text.startswith("--", i):
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl
            continue
        elif ch == ";":
            stmt = text[start:i].strip()
            if stmt:
                out.append(stmt)
            start = i + 1
        i += 1
    return out, text[start:]


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
                return self.onecmd(";")
            return True
        if not self.buffer and line.strip().startswith("."):
            return self.dot(line.strip())
        statements, self.buffer = split_statements(self.buffer + line + "\n")
        for stmt in statements:
            self.execute(stmt)
        pending = bool(self.buffer.strip())
        if not pending:
            self.buffer = ""
        self.prompt = ("  ...> " if pending else "lsql> ") if self.interactive else ""
        return False

    def report(self, e: BaseException) -> None:
        self.errors += 1
        # stdout is block-buffered when piped: flush the results printed so far so that, with 2>&1, the error
        # lands right after the statement that failed rather than before earlier output.
        sys.stdout.flush()
        print(f"error: {one_line(e)}", file=sys.stderr)
        hint = error_hint(e)
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
