"""MkDocs hooks for the course site (``hooks:`` in ``mkdocs.yml``).

mkdocs-jupyter builds a notebook page's table of contents from a markdown copy of the notebook, where a heading's
code span is dropped (``… saved with `no_sync``` -> ``…-saved-with``), while nbconvert's heading ids keep it
(``…-saved-with-no_sync``): the contents' links would point at no anchor. The headings are the same and in the
same order, so each contents entry takes the id of its heading in the page.
"""

from __future__ import annotations

import re

HEADING_ID = re.compile(r"<h([1-6])[^>]*\sid=\"([^\"]+)\"")


def _flat(items):
    for item in items:
        yield item
        yield from _flat(item.children)


def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".ipynb") or page.toc is None:
        return html
    entries = list(_flat(page.toc))
    ids = [(int(level), ident) for level, ident in HEADING_ID.findall(html)]
    ids = [(level, ident) for level, ident in ids if level <= max((e.level for e in entries), default=0)]
    if len(ids) == len(entries) and all(e.level == level for e, (level, _) in zip(entries, ids)):
        for entry, (_, ident) in zip(entries, ids):
            entry.id = ident
    return html
