"""The command line of the benchmarks that run one workload a number of times: ``--events``,
``--repeat`` (the best run counts) and ``--quick`` (a smoke run: fewer events, one run)."""

from __future__ import annotations

import argparse


def arguments(doc: str, events: int, repeat: int, quick_events: int, repeat_help: str) -> argparse.Namespace:
    """Parse ``sys.argv``; with ``--quick`` the events are ``quick_events`` and there is one run."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=events)
    parser.add_argument("--repeat", type=int, default=repeat, help=repeat_help)
    parser.add_argument("--quick", action="store_true",
                        help=f"{quick_events:,} events, one run (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.events, args.repeat = quick_events, 1
    return args
