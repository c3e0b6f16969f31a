"""The static website (`make site`) in Chromium, opened from disk: every page, link, anchor and image, search,
and the layout at 1440x900 and at a phone's width. The checks are shown to fail on a copy with planted faults."""
from __future__ import annotations

import io
import os
import re
import shutil

import pytest
from labdriver import ARTIFACTS, REPO
from sitecheck import (DESKTOP, PHONE, built_site, error_problems, image_problems, layout_problems, link_problems,
                       site_pages, visit)

pytestmark = pytest.mark.browser

# The page, and the element scrolled to the top (for the chapter: the section heading above a pitfall's card).
DOCS_SHOTS = {"site-chapter.png": ("notebooks/04_finetuning_and_bugs.html", "#pitfall-learning-rate-too-high"),
              "site-pitfalls.png": ("pitfalls.html", "#chapter-4")}


def flat_png() -> bytes:
    """A flat grey PNG: an image that loads and shows nothing."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (128, 128, 128)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    return built_site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="session")
def desktop(browser, site):
    return visit(browser, site, site_pages(site), DESKTOP)


@pytest.fixture(scope="session")
def phone(browser, site):
    return visit(browser, site, site_pages(site), PHONE, images=False)


def test_the_site_has_every_notebook_and_reference_page(site):
    pages = set(site_pages(site))
    notebooks = {p.relative_to(REPO).with_suffix(".html").as_posix()
                 for p in [*REPO.glob("notebooks/*.ipynb"), *REPO.glob("notebooks/solutions/*.ipynb")]}
    assert notebooks <= pages, sorted(notebooks - pages)
    assert {"index.html", "pitfalls.html", "troubleshooting.html", "docs/decisions.html", "gpu-runs.html",
            "search.html", "notebooks/solutions/index.html"} <= pages


def test_every_page_loads_without_a_console_error_or_a_network_request(desktop):
    assert len(desktop) >= 20
    assert error_problems(desktop) == []


def test_every_internal_link_and_anchor_resolves(desktop, site):
    internal = [h for r in desktop.values() for h in r.links if h.startswith("file:")]
    assert len(internal) > 1000          # the sidebar alone links every page from every page
    assert link_problems(desktop, site) == []


def test_every_image_loads_and_is_not_blank(desktop):
    shown = [i for r in desktop.values() for i in r.images]
    assert len(shown) >= 20              # the notebooks' plots, the catalogue's, the README's screenshot
    assert image_problems(desktop) == []


def test_pages_read_well_at_1440x900(desktop):
    assert layout_problems(desktop, DESKTOP) == []
    for report in desktop.values():      # a readable line: neither a narrow strip nor the whole screen
        assert 500 <= report.main_box["width"] <= 1000, (report.page, report.main_box)


def test_pages_read_well_at_a_phone_width(phone):
    assert layout_problems(phone, PHONE) == []


def test_no_dead_widget_and_every_pitfall_shown_as_recorded(browser, site):
    page = browser.new_page(viewport=DESKTOP)
    page.goto((site / "notebooks" / "01_tensors.html").as_uri())
    assert page.locator("script[type*='widget']").count() == 0
    assert page.get_by_text("Run this cell for the widget").count() == 0
    cards = page.locator(".pitfall-card")
    assert cards.count() == 7 and cards.locator(".pitfall-runs").count() == 7
    assert "Recorded runs" in cards.first.inner_text()
    page.goto((site / "pitfalls.html").as_uri())
    from ptlab.course.pitfalls import all_pitfalls

    ids = [p.id for p in all_pitfalls()]
    assert page.locator(".pitfall-card").count() == len(ids)
    for pid in ids:
        card = page.locator(f"#pitfall-{pid}")
        assert card.locator(".pitfall-runs").count() == 1, pid           # its buggy and fixed figures
        assert re.search(r"✔ bug on: .*\n.*✔ fixed: ", card.locator(".pitfall-runs").inner_text(), re.S), pid
        assert card.locator(".meta a").count() == 2, pid                  # its section, and its widget there
    page.close()


@pytest.mark.parametrize("pitfall_id", ["uint8-overflow", "zero-grad-after-backward", "compiled-state-dict-prefix"])
def test_search_finds_a_pitfall_by_a_word_of_its_title(browser, site, pitfall_id):
    from ptlab.course.pitfalls import get_pitfall

    word = max(re.findall(r"[A-Za-z]{5,}", get_pitfall(pitfall_id).title), key=len)
    page = browser.new_page(viewport=DESKTOP)
    page.goto((site / "notebooks" / "03_data.html").as_uri())
    page.fill(".topbar input[name=q]", word)
    page.press(".topbar input[name=q]", "Enter")
    page.wait_for_selector("#search-results li")
    hit = page.locator(f"#search-results a[href$='pitfalls.html#{pitfall_id}']")
    assert hit.count() == 1, (word, page.locator("#search-status").inner_text())
    hit.click()
    page.wait_for_load_state("load")
    assert page.url.endswith(f"pitfalls.html#{pitfall_id}")
    assert page.locator(f"[id='{pitfall_id}']").is_visible()
    page.goto((site / "search.html").as_uri() + "?q=qwertyuiopzz")
    assert page.locator("#search-results li").count() == 0
    assert page.locator("#search-status").inner_text().startswith("0 sections match")
    page.close()


def test_the_checks_fail_on_a_planted_broken_link_missing_image_blank_image_and_wide_page(browser, site, tmp_path):
    planted = tmp_path / "planted"
    shutil.copytree(site, planted)
    (planted / "flat.png").write_bytes(flat_png())
    index = planted / "index.html"
    index.write_text(index.read_text(encoding="utf-8").replace('<div class="page">', (
        '<div class="page"><a href="notebooks/no_such_chapter.html">gone</a>'
        '<a href="notebooks/01_tensors.html#No-such-heading">no anchor</a>'
        '<img src="docs/no_such_picture.png" alt="missing"><img src="flat.png" alt="flat" width="80" height="80">'
        '<div style="width:3000px">too wide</div>'), 1), encoding="utf-8")
    pages = ["index.html", "notebooks/01_tensors.html"]
    reports = visit(browser, planted, pages, DESKTOP)
    assert link_problems(reports, planted) == ["index.html: broken link to notebooks/no_such_chapter.html",
                                               "index.html: no #No-such-heading in notebooks/01_tensors.html"]
    assert image_problems(reports) == ["index.html: image did not load: docs/no_such_picture.png",
                                       "index.html: blank image: flat.png"]
    assert any("no_such_picture.png" in problem for problem in error_problems(reports))
    assert [p.split(":")[0] for p in layout_problems(reports, DESKTOP)] == ["index.html"]


def test_screenshots_of_a_chapter_and_the_catalogue(browser, site):
    """artifacts/browser/site-*.png; with PTLAB_UPDATE_DOCS=1 also docs/site-chapter.png and docs/site-pitfalls.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport=DESKTOP)
    for png, (name, target) in DOCS_SHOTS.items():
        page.goto((site / name).as_uri() + target)
        page.evaluate("""t => { const card = document.querySelector(t);
            const heading = card.classList.contains('pitfall-card') ? card.closest('.cell').previousElementSibling
                                                                     : card;
            heading.scrollIntoView(); }""", target)
        page.wait_for_timeout(300)
        shot = ARTIFACTS / png
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 20_000
        if os.environ.get("PTLAB_UPDATE_DOCS") == "1":
            from PIL import Image

            with Image.open(shot) as image:    # 128 colours: a tenth of the bytes, text still crisp
                image.convert("RGB").quantize(colors=128).save(REPO / "docs" / png, optimize=True)
    page.close()
