"""The course site: the lessons with the outputs of a reference run, and the long-form docs, as one static site.

``python -m simlib.site build`` (one command, nothing downloaded, nothing executed) stages ``README.md``,
``docs/``, ``notebooks/`` (each with the outputs of its reference run, ``docs/reference/``) and ``exercises/`` and
builds them with MkDocs into ``build/site/``. ``python -m simlib.site reference`` re-runs the notebooks to refresh
those outputs. ``docs/design.md`` says why MkDocs and how the reference outputs are matched to today's cells.
"""
