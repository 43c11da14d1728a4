"""Did-you-mean for names a user types: operators, policies, settings."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(word: str, names: Iterable[str]) -> str | None:
    """The name of ``names`` closest to ``word`` when one is close enough to be a typo, else None."""
    close = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """`` Did you mean 'map'?`` for a typo of one of ``names``, else ``""`` (appended to a message)."""
    close = closest(word, names)
    return f" Did you mean {close!r}?" if close else ""
