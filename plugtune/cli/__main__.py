"""``python -m plugtune.cli``: the command line."""

import sys

from plugtune.cli import app

sys.exit(app())
