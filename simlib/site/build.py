"""Build the course site: stage the sources, then MkDocs (``python -m simlib.site build``; nothing is executed).

Staged into ``build/site-src/`` (the MkDocs ``docs_dir``), laid out as the repository is, so that every relative
link that works on a code host works on the site too:

- ``README.md`` (the front door and course map; MkDocs makes it the home page), ``CONTRIBUTING.md``;
- ``docs/*.md`` (the long-form pages), and ``docs/reference-run.md``, written here from ``docs/reference/run.json``;
- ``notebooks/*.ipynb``: today's cells, each code cell with the outputs the reference run recorded for the *same*
  source (matched by a hash of the cell's text), and a note under the title saying which run, machine and load they
  come from and how many cells changed since (those show no output);
- ``exercises/*.ipynb`` as they are (stubs to fill in; never the solutions).

Display math (``$$ … $$``) is turned into MathML here, which browsers draw without MathJax (no CDN at view time).
"""

from __future__ import annotations

import functools
import http.server
import json
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path

from .reference import NOTEBOOKS, OUT, ROOT, cell_hash

EXERCISES = ROOT / "exercises"
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
STAGE = ROOT / "build" / "site-src"
SITE = ROOT / "build" / "site"
DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
MD_LINK = re.compile(r"(\]\()([^)\s#]+\.(?:ipynb|md))(#[^)\s]*)?(\))")


def _notebook_links(text: str) -> str:
    """A notebook's markdown is rendered by nbconvert, which leaves ``x.ipynb``/``x.md`` links as they are: point
    them at the pages MkDocs writes (``use_directory_urls: false``: ``x.html``; the README is ``index.html``)."""

    def page(m: re.Match) -> str:
        target = m.group(2)
        if "://" in target:
            return m.group(0)
        target = target[: -len("README.md")] + "index.html" if target.endswith("README.md") else target
        return m.group(1) + re.sub(r"\.(ipynb|md)$", ".html", target) + (m.group(3) or "") + m.group(4)

    return MD_LINK.sub(page, text)


def _math_to_mathml(text: str) -> str:
    from latex2mathml.converter import convert

    return DISPLAY_MATH.sub(lambda m: "\n" + convert(m.group(1).strip(), display="block") + "\n", text)


def _title(path: Path) -> str:
    """``00_getting_started`` -> ``00 Getting started``; ``10_project_gpt`` -> ``10 Project gpt``."""
    number, _, rest = path.stem.partition("_")
    return f"{number} {rest.replace('_', ' ').capitalize()}"


def _run_record() -> dict:
    path = OUT / "run.json"
    return json.loads(path.read_text()) if path.exists() else {"notebooks": {}, "machine": {}}


def _load(row: dict) -> str:
    load = row.get("load_average", {})
    return f"{load.get('median', '?')} (from {load.get('min', '?')} to {load.get('max', '?')})"


def _machine(record: dict) -> str:
    m = record.get("machine", {})
    return f"{m.get('cpu', 'unknown CPU')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}"


def merge_reference(path: Path, record: dict):
    """Today's notebook with the reference run's outputs on every code cell whose source is unchanged."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    ref_path = OUT / path.name
    row = record.get("notebooks", {}).get(path.stem)
    outputs: dict[str, list] = {}
    if ref_path.exists() and row:
        for cell in nbformat.read(ref_path, as_version=4).cells:
            if cell.cell_type == "code":
                outputs.setdefault(cell_hash(cell.source), []).append((cell.outputs, cell.execution_count))
    matched = changed = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _notebook_links(_math_to_mathml(cell.source))
        if cell.cell_type != "code":
            continue
        queue = outputs.get(cell_hash(cell.source))
        if queue:
            cell.outputs, cell.execution_count = queue.pop(0)
            matched += 1
        else:
            cell.outputs, cell.execution_count = [], None
            changed += 1
    if row:
        note = (
            f"> **Outputs from the reference run** of {row.get('finished', '?')[:10]} (commit {row.get('commit', '?')}),"
            f" in quick mode (`SIMLIB_QUICK=1`: small sizes), on {_machine(record)}: {row['seconds']:.0f} s of wall"
            f" time at a load average of {_load(row)}. Your own run measures your machine: compare shapes and"
            " ratios, not seconds."
        )
        if row.get("status", "ok") != "ok":
            note += f" That run {row['status']}: later cells have no output."
        if changed:
            note += f" {changed} code cell(s) changed since that run and show no output here."
        note += " [How the reference run is made](../docs/reference-run.md)."
    else:
        note = (
            "> **No reference run of this notebook yet**: the cells are shown without outputs. "
            "[How the reference run is made](../docs/reference-run.md)."
        )
    note = _notebook_links(note)
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, nbformat.v4.new_markdown_cell(note))
    return nb, {"matched": matched, "changed": changed}


def _reference_page(record: dict, merged: dict[str, dict]) -> str:
    m = record.get("machine", {})
    lines = [
        "# The reference run",
        "",
        "Every lesson and project page of this site shows the outputs of one run of its notebook, made by",
        "`python -m simlib.site reference` (it executes each notebook of `notebooks/` in a fresh kernel, in quick",
        "mode, and writes the executed copies with this record to `docs/reference/`). A cell edited since that run",
        "shows no output until the run is repeated. Timings are those of the machine and load below: a busy",
        "machine stretches every one of them, so read a ratio (a speedup, a share of the step) rather than a time.",
        "",
        f"- machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB,"
        f" {m.get('gpus', 0)} GPU(s); {m.get('os', '?')}; Python {m.get('python', '?')}, torch {m.get('torch', '?')}",
        "",
        "| notebook | finished | commit | status | wall s | load average: median (min–max) | cells matched today |",
        "|---|---|---|---|---|---|---|",
    ]
    for stem, row in sorted(record.get("notebooks", {}).items()):
        load = row.get("load_average", {})
        got = merged.get(stem, {})
        lines.append(
            f"| [{stem}](../notebooks/{stem}.ipynb) | {row.get('finished', '?')} | {row.get('commit', '?')} |"
            f" {row.get('status', '?')} | {row.get('seconds', '?')} | {load.get('median')} ({load.get('min')}–"
            f"{load.get('max')}) | {got.get('matched', 0)} of {got.get('matched', 0) + got.get('changed', 0)} |"
        )
    missing = sorted(set(merged) - set(record.get("notebooks", {})))
    if missing:
        lines += ["", "Not in the reference run yet: " + ", ".join(f"`{s}`" for s in missing) + "."]
    return "\n".join(lines) + "\n"


def _copy_linked_files(dest: Path, sources: list[tuple[Path, str]]) -> list[str]:
    """A relative link from a page to a repository file that is no page (``benchmarks/results/x.json``) works on the
    site too: the file is copied to the same place (MkDocs serves it as it is). Returns what was copied."""
    copied = []
    for where, text in sources:
        for target in re.findall(r"\]\(([^)\s#]+)", text):
            if "://" in target or target.startswith(("mailto:", "/")) or target.endswith((".md", ".ipynb")):
                continue
            path = (where.parent / target).resolve()
            if path.is_file() and ROOT in path.parents and not (dest / path.relative_to(ROOT)).exists():
                (dest / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, dest / path.relative_to(ROOT))
                copied.append(str(path.relative_to(ROOT)))
    return copied


def stage(dest: Path = STAGE) -> dict:
    """Lay out the site's sources in ``dest``; return what was staged (for the build's report and the tests)."""
    import nbformat

    if dest.exists():
        shutil.rmtree(dest)
    (dest / "docs").mkdir(parents=True)
    (dest / "notebooks").mkdir()
    (dest / "exercises").mkdir()
    shutil.copy(ROOT / "README.md", dest / "README.md")
    shutil.copy(ROOT / "CONTRIBUTING.md", dest / "CONTRIBUTING.md")
    for page in sorted(DOCS.glob("*.md")):
        (dest / "docs" / page.name).write_text(_math_to_mathml(page.read_text()))
    record, merged = _run_record(), {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb, merged[path.stem] = merge_reference(path, record)
        nbformat.write(nb, dest / "notebooks" / path.name)
    for path in sorted(EXERCISES.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = _notebook_links(_math_to_mathml(cell.source))
        nbformat.write(nb, dest / "exercises" / path.name)
    (dest / "docs" / "reference-run.md").write_text(_reference_page(record, merged))
    sources = [(ROOT / "README.md", (ROOT / "README.md").read_text())]
    sources += [(ROOT / "CONTRIBUTING.md", (ROOT / "CONTRIBUTING.md").read_text())]
    sources += [(p, p.read_text()) for p in sorted(DOCS.glob("*.md"))]
    for path in sorted(NOTEBOOKS.glob("*.ipynb")) + sorted(EXERCISES.glob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        sources.append((path, "\n".join(c.source for c in cells if c.cell_type == "markdown")))
    _copy_linked_files(dest, sources)
    return {"notebooks": merged, "exercises": sorted(p.stem for p in EXERCISES.glob("*.ipynb"))}


def _map_titles() -> dict[str, str]:
    """``notebooks/x.ipynb`` -> the README course map's link text for it (``[00 Getting started](...)``)."""
    text = (ROOT / "README.md").read_text()
    return {target: label for label, target in re.findall(r"\[([^\]]+)\]\(((?:notebooks|exercises)/[^)#]+)\)", text)}


def nav(staged: dict) -> list:
    """The site's navigation, from the files (a new notebook or page appears by itself), titled as the README's
    course map names them (else from the file name)."""
    titles = _map_titles()

    def entry(folder: str, stem: str) -> dict:
        path = f"{folder}/{stem}.ipynb"
        return {titles.get(path, _title(Path(stem))): path}

    notebooks = sorted(staged["notebooks"])
    lessons = [entry("notebooks", s) for s in notebooks if "_project_" not in s]
    projects = [entry("notebooks", s) for s in notebooks if "_project_" in s]
    exercises = [entry("exercises", s) for s in staged["exercises"]]
    guides = []
    for page in sorted(DOCS.glob("*.md")):
        first = next((ln for ln in page.read_text().splitlines() if ln.startswith("# ")), page.stem)
        guides.append({first.removeprefix("# ").strip(): f"docs/{page.name}"})
    guides.append({"The reference run": "docs/reference-run.md"})
    return [
        {"Course map": "README.md"},
        {"Lessons": lessons},
        {"Projects": projects},
        {"Exercises": exercises},
        {"Guides and reference": guides},
        {"Contributing": "CONTRIBUTING.md"},
    ]


def build(out: str | Path | None = None, stage_dir: Path = STAGE, quiet: bool = False) -> Path:
    """Stage, then ``mkdocs build --strict`` into ``out`` (default ``build/site``); return the site's folder."""
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config

    t0 = time.perf_counter()
    site = Path(out).resolve() if out else SITE
    staged = stage(stage_dir)
    logging.getLogger("mkdocs").setLevel(logging.WARNING)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    cwd = os.getcwd()
    os.chdir(ROOT)  # mkdocs.yml's relative paths (the notebook cache) are the repository's
    try:
        config = load_config(str(CONFIG), docs_dir=str(stage_dir), site_dir=str(site), nav=nav(staged), strict=True)
        mkdocs_build(config)
    finally:
        os.chdir(cwd)
    if not quiet:
        pages = len(staged["notebooks"]) + len(staged["exercises"])
        print(f"site: {site} ({pages} notebook pages) built in {time.perf_counter() - t0:.1f} s")
    return site


def serve(port: int = 8000, site: Path | None = None) -> None:
    """Build, then serve on 127.0.0.1 until Ctrl-C (a static server: the site needs nothing else)."""
    site = site or build()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        print(f"serving {site} on http://127.0.0.1:{port}/ (Ctrl-C stops)")
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            thread.join()
        except KeyboardInterrupt:
            httpd.shutdown()
