"""``python -m lerobot_sql.cli``: the same as the ``lerobot-sql`` command."""

import sys

from .commands import main

sys.exit(main())
