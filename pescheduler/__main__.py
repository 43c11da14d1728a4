"""``python -m pescheduler``: the command line (see :mod:`pescheduler.cli`)."""

import sys

from .cli import main

sys.exit(main())
