"""Checks of the static website in a real Chromium, page by page, opened from disk (file://).

Each check returns a list of problems (empty when the site is right), so a test can assert both that the built
site has none and that a copy with a planted fault has the expected one.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from labdriver import REPO

DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}      # an iPhone 12-15's CSS viewport
SITE_STAMP = ".ptlab-site-stamp"


def built_site(tmp: Path) -> Path:
    """The site `make site` built (PTLAB_SITE, default _site/) when it matches the sources, else a fresh build."""
    sys.path.insert(0, str(REPO))
    from ptlab.course.site import build, fingerprint

    site = Path(os.environ.get("PTLAB_SITE", REPO / "_site"))
    site = site if site.is_absolute() else REPO / site
    stamp = site / SITE_STAMP
    if stamp.is_file() and stamp.read_text().strip() == fingerprint(REPO):
        return site
    fresh = tmp / "site"
    build(fresh, REPO, say=lambda *args, **kwargs: None)
    return fresh


def site_pages(site: Path) -> list[str]:
    """Every HTML page of the site, as paths relative to its folder."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))


@dataclass
class PageReport:
    """What Chromium saw on one page."""

    page: str
    errors: list[str] = field(default_factory=list)        # console errors, page errors, failed requests
    network: list[str] = field(default_factory=list)       # requests that left the disk (http, https, ...)
    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)         # every <a href>, resolved by the browser
    images: list[dict] = field(default_factory=list)       # src, loaded, blank
    scroll_width: int = 0
    inner_width: int = 0
    main_box: dict = field(default_factory=dict)
    h1_top: float = 0.0


def visit(browser, site: Path, pages: list[str], viewport: dict, images: bool = True) -> dict[str, PageReport]:
    """Open each page from disk at `viewport` and record what the browser saw."""
    context = browser.new_context(viewport=viewport)
    reports = {}
    try:
        for name in pages:
            report = PageReport(name)
            page = context.new_page()
            page.on("console", lambda m, r=report: r.errors.append(f"console: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e, r=report: r.errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda q, r=report: r.errors.append(f"request failed: {q.url} ({q.failure})"))
            page.on("request", lambda q, r=report: r.network.append(q.url)
                    if urlsplit(q.url).scheme not in ("file", "data") else None)
            page.goto((site / name).as_uri(), wait_until="load")
            facts = page.evaluate("""() => ({
                ids: [...document.querySelectorAll('[id]')].map(e => e.id),
                links: [...document.querySelectorAll('a[href]')].map(a => a.href),
                scroll: document.documentElement.scrollWidth, inner: window.innerWidth,
                main: (b => ({left: b.left, right: b.right, width: b.width}))(
                    document.querySelector('main').getBoundingClientRect()),
                h1: (h => h ? h.getBoundingClientRect().top : -1)(document.querySelector('main h1')),
            })""")
            report.ids, report.links = set(facts["ids"]), facts["links"]
            report.scroll_width, report.inner_width = facts["scroll"], facts["inner"]
            report.main_box, report.h1_top = facts["main"], facts["h1"]
            if images:       # the sticky top bar must not cover the image being photographed
                page.add_style_tag(content=".topbar { position: static !important; }")
                for img in page.locator("main img").all():
                    src = img.get_attribute("src") or ""
                    loaded = img.evaluate("i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0")
                    blank = None
                    if loaded:
                        img.scroll_into_view_if_needed()
                        blank = shot_is_blank(img.screenshot())
                    report.images.append({"src": src[:80], "loaded": loaded, "blank": blank})
            page.close()
            reports[name] = report
    finally:
        context.close()
    return reports


def shot_is_blank(png: bytes) -> bool:
    """True when a screenshot of an image is one flat colour inside a 1 px margin (a box at a fractional
    position takes in a row of the page around it)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        gray = image.convert("L")
        if gray.width > 2 and gray.height > 2:
            gray = gray.crop((1, 1, gray.width - 1, gray.height - 1))
        low, high = gray.getextrema()
    return low == high


def error_problems(reports: dict[str, PageReport]) -> list[str]:
    """Console errors, page errors, failed requests, and any request that is not to a file on disk."""
    return ([f"{r.page}: {e}" for r in reports.values() for e in r.errors]
            + [f"{r.page}: fetched from the network: {url}" for r in reports.values() for url in r.network])


def link_problems(reports: dict[str, PageReport], site: Path) -> list[str]:
    """Every link into the site must name a file in it, and its #anchor an element of that page."""
    problems = []
    root = site.resolve()
    for report in reports.values():
        for href in report.links:
            parts = urlsplit(href)
            if parts.scheme in ("http", "https", "mailto"):
                continue                       # the web is out of reach here, and the site must not need it
            if parts.scheme != "file":
                problems.append(f"{report.page}: link with scheme {parts.scheme!r}: {href}")
                continue
            target = Path(unquote(parts.path)).resolve()
            if root not in target.parents:
                problems.append(f"{report.page}: link leaves the site: {href}")
                continue
            name = target.relative_to(root).as_posix()
            if not target.is_file():
                problems.append(f"{report.page}: broken link to {name}")
                continue
            if parts.fragment and name in reports:
                ids = reports[name].ids     # the HTML spec tries the fragment as written, then percent-decoded
                if parts.fragment not in ids and unquote(parts.fragment) not in ids:
                    problems.append(f"{report.page}: no #{unquote(parts.fragment)} in {name}")
    return sorted(set(problems))


def image_problems(reports: dict[str, PageReport]) -> list[str]:
    """Every image in a page's content must load and must not be one flat colour on screen."""
    return ([f"{r.page}: image did not load: {i['src']}" for r in reports.values() for i in r.images if not i["loaded"]]
            + [f"{r.page}: blank image: {i['src']}" for r in reports.values() for i in r.images if i["blank"]])


def layout_problems(reports: dict[str, PageReport], viewport: dict) -> list[str]:
    """The page body never scrolls sideways; the content column is readable; the title is on the first screen."""
    problems = []
    for r in reports.values():
        if r.scroll_width > r.inner_width:
            problems.append(f"{r.page}: the page scrolls sideways ({r.scroll_width} px wide in {r.inner_width})")
        box = r.main_box
        if box["left"] < 0 or box["right"] > viewport["width"] + 0.5:
            problems.append(f"{r.page}: the content runs off the screen ({box})")
        if box["width"] < min(320, viewport["width"] - 40):
            problems.append(f"{r.page}: the content column is {box['width']:.0f} px wide")
        if not 0 <= r.h1_top < viewport["height"]:
            problems.append(f"{r.page}: the page title is not on the first screen (top {r.h1_top:.0f} px)")
    return problems

