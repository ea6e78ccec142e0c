"""The ``lerobot-sql`` command line: ``commands`` (the parser and one function per subcommand), ``output`` (result
writers, error and hint lines), ``shell`` (the interactive SQL shell, which imports ``output`` only).

The entry point stays ``lerobot_sql.cli:main`` (pyproject.toml) and ``python -m lerobot_sql.cli`` runs it.
"""

from .commands import main

__all__ = ["main"]
