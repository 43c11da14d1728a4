"""A reference to a section of a page of docs/ names a section that page has.

Code and docs point a reader to the measurements behind a choice: ``docs/state.md, "The allocator"``,
``docs/checkpoints.md, "Attempts"``, ``docs/state-log.md, session 29``. A page that is reorganised
leaves such pointers naming sections that moved; this test reads every one in the repository's
Python and Markdown files and looks for its title in the page it names (as a heading or a bold
lead-in, or anywhere in its text: a title quoted in running prose is found there too), and for
"session N" in the page a ``session N`` reference names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
SOURCES = [p for pattern in ("*.md", "pescheduler/**/*.py", "operators/**/*.py", "bench/**/*.py", "tests/**/*.py",
                             "docs/*.md", "examples/**/*.py")
           for p in sorted(ROOT.glob(pattern))
           if "build" not in p.relative_to(ROOT).parts and p.name != "test_doc_references.py"]   # its examples
# docs/<page>.md, then an optional comma or colon, then "a title" or session N (across a wrapped line)
REFERENCE = re.compile(r'docs/([\w.-]+\.md)[,:]?\s+(?:"([^"]{3,160})"|sessions?\s+(\d+))')
QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"'})


def _plain(text: str) -> str:
    """``text`` with a comment's or a docstring's line breaks and leading ``#`` taken out, spaces
    collapsed: a title wrapped over two lines of a comment reads as one."""
    return re.sub(r"\s+", " ", re.sub(r"\n\s*#\s*", " ", text.translate(QUOTES)))


def references() -> list[tuple[str, str, str, str]]:
    """``(file, page, title or "", session or "")`` for every reference in :data:`SOURCES`."""
    found = []
    for source in SOURCES:
        text = _plain(source.read_text(errors="replace"))
        for m in REFERENCE.finditer(text):
            found.append((source.relative_to(ROOT).as_posix(), m.group(1), m.group(2) or "", m.group(3) or ""))
    return found


REFERENCES = references()


def test_the_repository_points_into_the_docs_by_section():
    """The pattern finds what it is for: references by title and by session (a pattern that
    matched nothing would pass every check below)."""
    assert sum(1 for r in REFERENCES if r[2]) >= 10 and any(r[3] for r in REFERENCES)


@pytest.mark.parametrize("source, page, title, session", REFERENCES,
                         ids=[f"{s}->{p}:{t[:30] or 'session ' + n}" for s, p, t, n in REFERENCES])
def test_a_reference_names_a_section_its_page_has(source, page, title, session):
    target = ROOT / "docs" / page
    assert target.exists(), f"{source} points to docs/{page}, which does not exist"
    text = _plain(target.read_text())
    if title:
        assert _plain(title) in text, f"{source} points to docs/{page}, \"{title}\": no such section there"
    else:
        assert re.search(rf"\bsessions? (?:[\d, and-]* )?{session}\b", text), \
            f"{source} points to docs/{page}, session {session}: that page does not name it"
