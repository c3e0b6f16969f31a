"""The course as a static website: `python -m ptlab.course.site --out _site` (what `make site` runs).

Every page comes from what is committed: the notebooks with their stored outputs (nothing is executed), the
README, docs/*.md, the pitfall registry, chapter 5's troubleshooting table and data/gpu_runs/. The pages work
opened from disk: no CDN, no fetch(); search reads an index loaded by a <script> tag. docs/site.md says why.
"""
from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import posixpath
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
from bs4 import BeautifulSoup, NavigableString
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from ptlab.course import site_pages
from ptlab.course.pitfalls import all_pitfalls
from ptlab.course.site_assets import JS, stylesheet
from ptlab.course.site_notebooks import notebook_html, recorded_runs
from ptlab.course.site_pages import Section
from ptlab.gpu_record import LESSONS, load_runs

ROOT = Path(__file__).resolve().parents[2]
TAGLINE = "PyTorch engineering, learned by breaking it"
SEARCH_CAP = 20_000      # characters of one section's text kept in the search index
STAMP = ".ptlab-site-stamp"   # the inputs' fingerprint, so a test can tell a current build from a stale one


@dataclass
class Page:
    """One page of the site: where it goes, where it came from, its title, sidebar group and label, its body."""

    path: str                 # in the site, e.g. notebooks/01_tensors.html
    source: str               # in the course folder ('' for a generated page)
    title: str
    group: str
    label: str
    body: str = ""


def input_files(course: Path = ROOT) -> list[Path]:
    """Everything a build reads: notebooks, README, docs, GPU records and ptlab's code (pitfall records)."""
    patterns = ("notebooks/*.ipynb", "notebooks/solutions/*.ipynb", "README.md", "docs/*.md", "docs/*.png",
                "data/gpu_runs/*.json", "ptlab/**/*.py")
    return sorted({p for pattern in patterns for p in course.glob(pattern) if p.is_file()})


def fingerprint(course: Path = ROOT) -> str:
    """A hash of every input's path and bytes: equal fingerprints, equal sites."""
    digest = hashlib.sha256()
    for path in input_files(course):
        digest.update(path.relative_to(course).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _first_heading(text: str, fallback: str) -> str:
    match = re.search(r"^#\s+(.+)$", text, re.M)
    return match.group(1).replace("`", "").strip() if match else fallback


def plan(course: Path = ROOT) -> list[Page]:
    """Every page in reading order: home, chapters, reference pages, solutions, then the maintainers' guide."""
    def notebook_page(path: Path, group: str) -> Page:
        nb = nbformat.read(path, as_version=4)
        first = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
        title = _first_heading(first, path.stem)
        rel = path.relative_to(course).as_posix()
        return Page(rel.removesuffix(".ipynb") + ".html", rel, title, group, title.replace("Chapter ", ""))

    pages = [Page("index.html", "README.md", "ptlab: " + TAGLINE, "Start", "Home: the course map")]
    pages += [notebook_page(p, "Chapters") for p in sorted((course / "notebooks").glob("*.ipynb"))]
    pages += [Page("pitfalls.html", "", "Pitfall catalogue", "Reference", "Pitfall catalogue"),
              Page("troubleshooting.html", "", "Troubleshooting", "Reference", "Troubleshooting"),
              Page("docs/decisions.html", "docs/decisions.md", "", "Reference", "Decisions"),
              Page("gpu-runs.html", "", "Recorded GPU figures", "Reference", "Recorded GPU figures"),
              Page("notebooks/solutions/index.html", "", "Solutions", "Solutions", "All solutions")]
    pages += [notebook_page(p, "Solutions") for p in sorted((course / "notebooks" / "solutions").glob("*.ipynb"))]
    pages += [Page("docs/authoring.html", "docs/authoring.md", "", "Maintainers", "Writing a chapter"),
              Page("docs/site.html", "docs/site.md", "", "Maintainers", "This website")]
    for page in pages:
        if page.source.endswith(".md"):
            page.title = _first_heading((course / page.source).read_text(encoding="utf-8"), page.label)
    return pages


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading (README links such as #threads)."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def markdown_html(text: str) -> str:
    """Markdown as nbconvert renders a notebook's markdown cell (heading ids as JupyterLab makes them)."""
    return markdown2html_mistune(text)


def _relative(target: str, page: str) -> str:
    return posixpath.relpath(target, posixpath.dirname(page) or ".")


def fix_links(soup: BeautifulSoup, page: Page, site_map: dict[str, str], course: Path, assets: set[str]) -> None:
    """Links to course files become links to their pages; images are copied; other files become plain text."""
    here = posixpath.dirname(page.source)
    for a in soup.find_all("a", href=True):
        parts = urlsplit(a["href"])
        if parts.scheme or parts.netloc or not parts.path:
            continue
        target = posixpath.normpath(posixpath.join(here, unquote(parts.path)))
        fragment = f"#{parts.fragment}" if parts.fragment else ""
        if target in site_map:
            a["href"] = _relative(site_map[target], page.path) + fragment
        else:   # a file of the course folder with no page: say where it is, link nowhere
            a.name, a["class"], a["title"] = "span", "course-file", f"in the course folder: {target}"
            del a["href"]
    for img in soup.find_all("img", src=True):
        src = img["src"]
        if src.startswith("data:") or urlsplit(src).scheme:
            continue
        target = posixpath.normpath(posixpath.join(here, unquote(src)))
        if (course / target).is_file():
            assets.add(target)
            img["src"] = _relative(target, page.path)


def add_heading_aliases(soup: BeautifulSoup) -> None:
    """Give each heading of a Markdown page GitHub's anchor too, so README-style links (#threads) resolve."""
    taken = {tag["id"] for tag in soup.find_all(id=True)}
    for heading in soup.find_all(re.compile(r"^h[1-6]$")):
        slug = github_slug(heading.get_text().replace("¶", ""))
        if slug and slug not in taken:
            taken.add(slug)
            heading.insert(0, soup.new_tag("span", id=slug))


def wrap_tables(soup: BeautifulSoup) -> None:
    """Wide tables scroll inside their own box, so the page body never scrolls sideways."""
    for table in soup.find_all("table"):
        if not table.find_parent(class_=["table-scroll", "output_html"]):
            table.wrap(soup.new_tag("div", attrs={"class": "table-scroll"}))


def contents(soup: BeautifulSoup) -> list[tuple[int, str, str]]:
    """The page's h2 and h3 headings: (level, id, text)."""
    return [(int(h.name[1]), h["id"], h.get_text().replace("¶", "").strip())
            for h in soup.find_all(["h2", "h3"]) if h.get("id")]


def search_entries(soup: BeautifulSoup, page: Page) -> list[dict[str, str]]:
    """The page cut at its h1-h3 headings: one entry per section (page title, heading, url#id, text)."""
    headings = [h for h in soup.find_all(["h1", "h2", "h3"]) if h.get("id")]
    markers = []
    for i, heading in enumerate(headings):
        marker = NavigableString(f"\x00{i}\x00")
        heading.insert_before(marker)
        markers.append(marker)
    pieces = re.split(r"\x00(\d+)\x00", soup.get_text(" "))
    for marker in markers:
        marker.extract()
    entries = [{"p": page.title, "s": "", "u": page.path, "x": pieces[0]}]
    for number, text in zip(pieces[1::2], pieces[2::2]):
        heading = headings[int(number)]
        entries.append({"p": page.title, "s": heading.get_text().replace("¶", "").strip(),
                        "u": f"{page.path}#{heading['id']}", "x": text})
    for entry in entries:
        entry["x"] = re.sub(r"\s+", " ", entry["x"].replace("¶", "")).strip()[:SEARCH_CAP]
    return [e for e in entries if e["x"] or e["s"]]


def layout(page: Page, pages: list[Page], toc: list[tuple[int, str, str]], scripts: list[str]) -> str:
    """The whole HTML document: top bar with search, sidebar in reading order, contents, previous and next."""
    root = "../" * page.path.count("/")          # relative links only: the site works from any folder
    groups: dict[str, list[str]] = {}
    for other in pages:
        current = ' aria-current="page"' if other is page else ""
        groups.setdefault(other.group, []).append(
            f'<li><a href="{root}{other.path}"{current}>{html.escape(other.label)}</a></li>')
    nav = "".join(f"<h2>{group}</h2><ul>{''.join(items)}</ul>" for group, items in groups.items())
    toc_html = ""
    if toc:
        items = "".join(f'<li class="level-{level}"><a href="#{html.escape(anchor)}">{html.escape(text)}</a></li>'
                        for level, anchor, text in toc)
        toc_html = f'<details class="toc" open><summary>On this page</summary><ul>{items}</ul></details>'
    prevnext = ""
    if page in pages:
        i = pages.index(page)
        links = []
        if i > 0:
            links.append(f'<a class="prev" rel="prev" href="{root}{pages[i - 1].path}"><small>Previous</small>'
                         f"{html.escape(pages[i - 1].label)}</a>")
        if i + 1 < len(pages):
            links.append(f'<a class="next" rel="next" href="{root}{pages[i + 1].path}"><small>Next</small>'
                         f"{html.escape(pages[i + 1].label)}</a>")
        prevnext = f'<nav class="prevnext" aria-label="previous and next">{"".join(links)}</nav>'
    script_tags = "".join(f'<script src="{root}{s}"></script>' for s in scripts)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(page.title)} · ptlab</title>"
            f'<link rel="icon" href="data:,"><link rel="stylesheet" href="{root}assets/site.css"></head>'
            f'<body data-root="{root}"><header class="topbar"><a class="brand" href="{root}index.html">ptlab</a>'
            f'<span class="tagline">{TAGLINE}</span><form action="{root}search.html" role="search">'
            '<input type="search" name="q" placeholder="Search the course" aria-label="Search the course">'
            '<button type="submit">Search</button></form></header>'
            f'<div class="layout"><details class="sidebar" open><summary>Course</summary>'
            f'<nav aria-label="course">{nav}</nav></details>{toc_html}'
            f'<main id="content"><div class="page">{page.body}</div>{prevnext}</main></div>'
            f"{script_tags}</body></html>\n")


def _sections(soups: dict[str, BeautifulSoup], pages: list[Page]) -> dict[str, Section]:
    """Where each pitfall widget sits: the heading above its card in its chapter page."""
    found = {}
    for page in pages:
        if page.group != "Chapters":
            continue
        for card in soups[page.path].select("div.pitfall-card"):
            heading = card.find_previous(["h2", "h3"])
            if heading is not None and heading.get("id"):
                pid = card["id"].removeprefix("pitfall-")
                found.setdefault(pid, Section(page.path, heading["id"], heading.get_text().replace("¶", "").strip(),
                                              card["id"]))
    return found


def _clinic(soups: dict[str, BeautifulSoup]) -> tuple[str, Section]:
    """Chapter 5's troubleshooting table as stored (the table headed 'likely causes'), and the section holding it."""
    for path, soup in soups.items():
        for table in soup.find_all("table"):
            head = table.find("tr")
            if head is not None and "likely causes" in head.get_text():
                heading = table.find_previous(["h2", "h3"])
                return str(table), Section(path, heading["id"], heading.get_text().replace("¶", "").strip(),
                                           heading["id"])
    raise RuntimeError("no troubleshooting table (a table headed 'likely causes') in the notebooks' stored outputs")


def build(out: Path, course: Path = ROOT, say=print) -> list[Page]:
    """Write the whole site into `out` (emptied first) and return its pages in reading order."""

    start = time.perf_counter()
    pages = plan(course)
    site_map = {p.source: p.path for p in pages if p.source}
    site_map["notebooks/solutions"] = "notebooks/solutions/index.html"
    runs = {}
    for path in sorted((course / "notebooks").glob("*.ipynb")):
        runs.update(recorded_runs(path, course))
    soups: dict[str, BeautifulSoup] = {}
    for page in pages:
        if page.source.endswith(".ipynb"):
            say(f"  {page.source}", flush=True)
            page.body = notebook_html(course / page.source, runs)
        elif page.source.endswith(".md"):
            page.body = markdown_html((course / page.source).read_text(encoding="utf-8"))
        if page.source:
            soups[page.path] = BeautifulSoup(page.body, "html.parser")
    records = all_pitfalls()
    generated = {
        "pitfalls.html": site_pages.catalogue_page(records, runs, _sections(soups, pages)),
        "troubleshooting.html": site_pages.troubleshooting_page(*_clinic(soups), {p.id for p in records}),
        "gpu-runs.html": site_pages.gpu_page(load_runs(course / "data" / "gpu_runs"), LESSONS),
        "notebooks/solutions/index.html": site_pages.solutions_index(
            [(posixpath.basename(p.path), p.title) for p in pages if p.group == "Solutions" and p.source]),
    }
    for page in pages:
        if not page.source:
            page.body = generated[page.path]
            soups[page.path] = BeautifulSoup(page.body, "html.parser")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    assets: set[str] = set()
    index = []
    for page in pages:
        soup = soups[page.path]
        if page.source:
            fix_links(soup, page, site_map, course, assets)
        if page.source.endswith(".md"):
            add_heading_aliases(soup)
        wrap_tables(soup)
        index += search_entries(soup, page)
        page.body = str(soup)
        _write(out / page.path, layout(page, pages, contents(soup), ["assets/site.js"]))
    search = Page("search.html", "", "Search", "", "Search", site_pages.SEARCH_PAGE)
    _write(out / "search.html", layout(search, pages, [], ["assets/search-index.js", "assets/site.js"]))
    _write(out / "assets" / "site.css", stylesheet())
    _write(out / "assets" / "site.js", JS)
    _write(out / "assets" / "search-index.js",
           "window.PTLAB_SEARCH = " + json.dumps(index, ensure_ascii=False, separators=(",", ":")) + ";\n")
    for asset in sorted(assets):
        (out / asset).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(course / asset, out / asset)
    (out / ".nojekyll").write_text("")          # GitHub Pages: serve the files as they are
    (out / STAMP).write_text(fingerprint(course) + "\n")
    say(f"site: {len(pages) + 1} pages, {len(index)} search sections, in {time.perf_counter() - start:.1f} s "
        f"-> {out}")
    return pages


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ptlab.course.site", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="_site", help="the folder to write (emptied first; default: _site)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    build(out)
    print(f"open {os.path.join(args.out, 'index.html')} in a browser (it works from disk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
