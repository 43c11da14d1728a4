"""``python -m pescheduler``: the command line (see :mod:`pescheduler.cli`)."""

import sys

from .control.forkserver import prestart

prestart(sys.argv[1:])             # before the command line's own imports: they overlap

from .cli import end_without_teardown, main  # noqa: E402

code = main()
if sys.argv[1:2] == ["stop"]:
    end_without_teardown(code)
sys.exit(code)
