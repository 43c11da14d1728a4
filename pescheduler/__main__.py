"""``python -m pescheduler``: the command line (see :mod:`pescheduler.cli`)."""

import sys

from .control.forkserver import prestart

prestart(sys.argv[1:])             # before the command line's own imports: they overlap

from .cli import main  # noqa: E402

sys.exit(main())
