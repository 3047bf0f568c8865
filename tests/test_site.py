"""The front door and the course site (issue 48).

Without a browser: the README is a front door (under 2,000 words, the sections a newcomer needs, the test command
CI runs, the right corpus), its course map links every notebook and exercise, every relative link of the README
and of ``docs/`` resolves, and the site's merge of reference outputs shows no output for a cell edited since.

In headless Chromium (marker ``browser``): the site built by ``python -m simlib.site build`` (into a temporary
folder; nothing executed), served on 127.0.0.1: the map links to every lesson, project and exercise page and each
loads; no internal link or anchor is broken; every figure is loaded and every notebook whose reference outputs hold
a figure shows them all; no page logs a console error; no request leaves 127.0.0.1.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _words(text: str) -> int:
    return len(text.split())


def test_readme_is_a_front_door():
    assert _words(README) < 2000, f"README.md has {_words(README)} words: a newcomer's five minutes is under 2,000"
    for heading in (
        "What you will learn",
        "Prerequisites",
        "Two commands",
        "Course map",
        "Which machine",
        "Where to go",
    ):
        assert re.search(rf"^## {heading}", README, re.M), f"README.md lacks its '## {heading}' section"
    ci = (ROOT / ".ci" / "run").read_text()
    command = "python -m pytest -n 2"
    assert command in ci and command in README, "README's test command must be the one .ci/run runs"
    assert "Python's reference docs" not in README and "Shakespeare" in README  # the GPT's corpus (issue 48, 7)


def test_course_map_links_every_notebook_and_exercise():
    links = {urldefrag(t)[0] for t in LINK.findall(README)}
    missing = [f"{p.parent.name}/{p.name}" for p in NOTEBOOKS + EXERCISES if f"{p.parent.name}/{p.name}" not in links]
    assert not missing, f"README.md's course map does not link: {missing} (add a row with its time on a laptop CPU)"


def _relative_links(path: Path) -> list[tuple[str, Path]]:
    text, fence, out = path.read_text(), False, []
    for line in text.splitlines():
        fence = fence != line.startswith("```")
        if fence:
            continue
        for target in LINK.findall(line):
            url = urldefrag(target)[0]
            if url and "://" not in url and not url.startswith("mailto:"):
                out.append((target, (path.parent / url).resolve()))
    return out


def test_every_relative_link_of_the_readme_and_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [f"{p.relative_to(ROOT)}: {t}" for p in pages for t, target in _relative_links(p) if not target.exists()]
    assert not broken, f"links to nothing: {broken}"
    assert len(_relative_links(ROOT / "README.md")) > len(NOTEBOOKS)  # the check saw the map


def test_reference_outputs_are_recorded_with_their_machine_and_load():
    record = json.loads((ROOT / "docs" / "reference" / "run.json").read_text())
    assert record["machine"]["cores"] >= 1 and record["machine"]["cpu"] and record["machine"]["torch"]
    assert record["notebooks"], "no notebook in the reference run"
    for stem, row in record["notebooks"].items():
        assert (ROOT / "notebooks" / f"{stem}.ipynb").exists(), f"reference run of a notebook that is gone: {stem}"
        assert (ROOT / "docs" / "reference" / f"{stem}.ipynb").exists()
        assert row["seconds"] > 0 and {"min", "median", "max"} <= set(row["load_average"])


def test_an_edited_cell_shows_no_stale_output(tmp_path, monkeypatch):
    """The site keeps the reference outputs of unchanged cells only; an edited cell shows none, and the page says so."""
    from simlib.site import build, reference

    cells = [nbformat.v4.new_markdown_cell("# T"), nbformat.v4.new_code_cell("1 + 1"), nbformat.v4.new_code_cell("2")]
    ran = nbformat.v4.new_notebook(cells=[nbformat.from_dict(c) for c in cells])
    ran.cells[1].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)]
    ran.cells[2].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=2)]
    today = nbformat.v4.new_notebook(cells=[nbformat.from_dict(c) for c in cells])
    today.cells[2].source = "3  # edited after the run"
    (tmp_path / "ref").mkdir()
    nbformat.write(ran, tmp_path / "ref" / "nb.ipynb")
    nbformat.write(today, tmp_path / "nb.ipynb")
    monkeypatch.setattr(build, "OUT", tmp_path / "ref")
    record = {
        "machine": {"cpu": "x", "cores": 2, "torch": "t"},
        "notebooks": {
            "nb": {"seconds": 1.0, "load_average": {"min": 1, "median": 1, "max": 1}, "status": "ok", "finished": "d"}
        },
    }
    nb, counts = build.merge_reference(tmp_path / "nb.ipynb", record)
    assert counts == {"matched": 1, "changed": 1}
    assert nb.cells[2].outputs[0]["data"]["text/plain"] == "2" and nb.cells[3].outputs == []
    assert "1 code cell(s) changed since that run" in nb.cells[1].source
    assert reference.cell_hash("a") != reference.cell_hash("b")


# --- In a real browser ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for the module, served on 127.0.0.1 (a static server: the site needs nothing else)."""
    from simlib.site.build import build

    tmp = tmp_path_factory.mktemp("site")
    t0 = time.perf_counter()
    out = build(out=tmp / "site", stage_dir=tmp / "src", quiet=True)
    built_in = time.perf_counter() - t0
    handler = functools.partial(_QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"url": f"http://127.0.0.1:{server.server_port}/", "dir": out, "src": tmp / "src", "built_in": built_in}
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _png_outputs(nb_path: Path) -> int:
    nb = nbformat.read(nb_path, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


PAGE_JS = """() => ({
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  content_links: [...document.querySelectorAll('article a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  images: [...document.images].map(i => ({src: i.src.slice(0, 80), complete: i.complete, w: i.naturalWidth,
                                         output: !!i.closest('.jp-OutputArea')})),
})"""


@pytest.mark.browser
def test_the_site_in_a_browser(site):
    from test_browser import ARGS, CHROMIUM

    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    base = site["url"]
    errors, outside, pages = [], [], {}
    t0 = time.perf_counter()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context()

            def route(r):
                if urlparse(r.request.url).hostname not in ("127.0.0.1", None) and not r.request.url.startswith(
                    "data:"
                ):
                    outside.append(r.request.url)
                    return r.abort()
                return r.continue_()

            context.route("**/*", route)
            page = context.new_page()
            current = {"url": ""}
            page.on("console", lambda m: m.type == "error" and errors.append(f"{current['url']}: {m.text}"))
            page.on("pageerror", lambda e: errors.append(f"{current['url']}: {e}"))
            queue, seen = [urljoin(base, "index.html")], set()
            while queue:
                url = queue.pop(0)
                if url in seen:
                    continue
                seen.add(url)
                current["url"] = url
                response = page.goto(url, wait_until="load")
                if response is None or response.status != 200:
                    continue  # not in `pages`: every link to it is reported broken below
                page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=20_000)
                info = page.evaluate(PAGE_JS)
                pages[url] = info
                for link in info["links"]:
                    target = urldefrag(link)[0]
                    if target.startswith(base) and target.endswith(".html") and target not in seen:
                        queue.append(target)
        finally:
            browser.close()
    crawl_s = time.perf_counter() - t0

    problems = {}
    # The map (the home page's content) links to every lesson, project and exercise page, and each one loaded.
    home = {urldefrag(u)[0] for u in pages[urljoin(base, "index.html")]["content_links"]}
    for path in NOTEBOOKS + EXERCISES:
        page_url = urljoin(base, f"{path.parent.name}/{path.stem}.html")
        if page_url not in home:
            problems.setdefault("the course map does not link", []).append(page_url)
        if page_url not in pages:
            problems.setdefault("not reachable", []).append(page_url)
    # No broken internal link: pages (and their anchors) were loaded; other files answer 200.
    for url, info in pages.items():
        for link in info["links"]:
            target, anchor = urldefrag(link)
            if not target.startswith(base):
                continue
            if target.endswith(".html") or target.endswith("/"):
                target = target if target.endswith(".html") else target + "index.html"
                if target not in pages:
                    problems.setdefault("broken internal links", []).append(f"{url} -> {link}")
                elif anchor and anchor not in pages[target]["ids"]:
                    problems.setdefault("links to no anchor", []).append(f"{url} -> {link}")
            elif not _answers(target):
                problems.setdefault("broken internal links", []).append(f"{url} -> {link}")
    # Figures render: every img on every page loaded, and every reference figure of a notebook is on its page.
    for url, info in pages.items():
        for image in info["images"]:
            if not image["w"]:
                problems.setdefault("images that did not load", []).append(f"{url}: {image['src']}")
    with_figures = 0
    for path in NOTEBOOKS:
        expected = _png_outputs(site["src"] / "notebooks" / path.name)
        shown = sum(i["output"] and i["w"] > 0 for i in pages[urljoin(base, f"notebooks/{path.stem}.html")]["images"])
        if shown != expected:
            problems.setdefault("figures missing", []).append(f"{path.name}: {shown} drawn of {expected}")
        with_figures += expected > 0
    if not with_figures:
        problems["no notebook page shows a figure (is docs/reference/ empty?)"] = []
    if errors:
        problems["console errors"] = errors
    if outside:
        problems["requests that left 127.0.0.1 (the site must work offline)"] = sorted(set(outside))
    assert not problems, "\n".join(f"{k}: {sorted(set(v))[:10]}" for k, v in problems.items())
    print(f"site: built in {site['built_in']:.1f} s, {len(pages)} pages crawled in {crawl_s:.1f} s")
