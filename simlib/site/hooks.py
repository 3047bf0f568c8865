"""MkDocs hooks for the course site (``hooks:`` in ``mkdocs.yml``).

mkdocs-jupyter builds a notebook page's table of contents from a markdown copy of the notebook, where a heading's
code span is dropped (``… saved with `no_sync``` -> ``…-saved-with``), while nbconvert's heading ids keep it
(``…-saved-with-no_sync``): the contents' links would point at no anchor. The headings are the same and in the
same order, so each contents entry takes the id (and the whole text) of its heading in the page.
"""

from __future__ import annotations

import re

HEADING_ID = re.compile(r"<h([1-6])[^>]*\sid=\"([^\"]+)\"[^>]*>(.*?)</h\1>", re.S)
TAG = re.compile(r"<a class=\"anchor-link\".*?</a>|<[^>]+>", re.S)


def _flat(items):
    for item in items:
        yield item
        yield from _flat(item.children)


def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".ipynb") or page.toc is None:
        return html
    entries = list(_flat(page.toc))
    deepest = max((e.level for e in entries), default=0)
    heads = [(int(level), ident, text) for level, ident, text in HEADING_ID.findall(html) if int(level) <= deepest]
    if len(heads) == len(entries) and all(e.level == level for e, (level, _, _) in zip(entries, heads)):
        for entry, (_, ident, text) in zip(entries, heads):
            entry.id = ident
            entry.title = TAG.sub("", text).strip() or entry.title  # with its code spans (`send`/`recv`)
    return html
