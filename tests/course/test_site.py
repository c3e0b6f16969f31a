"""The website's parts without a browser: recorded runs read from the notebooks, widgets identified, links mapped.
The whole site in Chromium: tests/browser/test_site.py (make site, then make test-browser)."""
from __future__ import annotations

from bs4 import BeautifulSoup

from notebook_rules import ROOT
from ptlab.course.pitfalls import all_pitfalls
from ptlab.course.site import Page, add_heading_aliases, fix_links, github_slug
from ptlab.course.site_notebooks import comparison_block, recorded_runs, widget_pitfall

STORED = ("uint8-overflow\n"
          "                          bug on        fixed\n"
          "  pixels that got darker  1,123         0\n"
          "✔ bug on: pixels that got darker, of 3,072: 1,123 > 1024\n"
          "✔ fixed: pixels that got darker, of 3,072: 0, not > 1024\n"
          "✔ a claim the cell printed after the comparison\n")


def test_a_comparison_block_is_the_table_and_the_check_lines_only():
    block = comparison_block(STORED, "uint8-overflow")
    assert block.splitlines()[0].strip() == "bug on        fixed"
    assert block.splitlines()[-1] == "✔ fixed: pixels that got darker, of 3,072: 0, not > 1024"
    assert "a claim the cell printed" not in block
    assert comparison_block(STORED, "missing-zero-grad") is None
    assert comparison_block("spawn-x\nskipped: needs Linux\n", "spawn-x") == "skipped: needs Linux"
    # A claim of the notebook's own that starts like a check line of the fixed run (07:c38) stays out.
    own_claim = STORED.replace("✔ a claim the cell printed after the comparison", "✔ fixed: the notebook's own claim")
    assert comparison_block(own_claim, "uint8-overflow") == comparison_block(STORED, "uint8-overflow")


def test_every_pitfall_has_a_recorded_run_in_the_committed_notebooks():
    runs = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        runs.update(recorded_runs(path, ROOT))
    missing = [p.id for p in all_pitfalls() if p.id not in runs]
    assert missing == []
    assert all("✔ bug on: " in run.text and "✔ fixed: " in run.text for run in runs.values())
    assert runs["broadcast-loss-shape"].images            # plot=True: the catalogue shows its plot too


def test_a_widget_output_names_its_pitfall_by_its_cell_or_its_saved_text():
    def output(text: str) -> dict:
        return {"data": {"text/plain": text}}

    assert widget_pitfall('show_pitfall("uint8-overflow")', output("")) == "uint8-overflow"
    assert widget_pitfall("w", output("PitfallWidget('shuffled-labels'): run this cell")) == "shuffled-labels"
    assert widget_pitfall("w", output("Run this cell for the widget, or: python -m ptlab pitfalls run x-y")) == "x-y"
    assert widget_pitfall("history = fit(...)", output("fit:   0%|          | 0/1")) is None


def test_links_to_course_files_become_links_to_their_pages(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "shot.png").write_bytes(b"png")
    soup = BeautifulSoup('<a href="../notebooks/03_data.ipynb#8.-pin_memory">a</a>'
                         '<a href="../README.md#threads">b</a><a href="../notebooks/solutions/">c</a>'
                         '<a href="../tests/course/test_site.py">d</a><a href="https://pytorch.org">e</a>'
                         '<img src="shot.png">', "html.parser")
    site_map = {"notebooks/03_data.ipynb": "notebooks/03_data.html", "README.md": "index.html",
                "notebooks/solutions": "notebooks/solutions/index.html"}
    assets: set[str] = set()
    fix_links(soup, Page("docs/decisions.html", "docs/decisions.md", "", "", ""), site_map, tmp_path, assets)
    assert [a["href"] for a in soup.find_all("a")] == ["../notebooks/03_data.html#8.-pin_memory",
                                                       "../index.html#threads",
                                                       "../notebooks/solutions/index.html", "https://pytorch.org"]
    assert soup.find("span", class_="course-file").get_text() == "d"    # a file with no page: text, not a link
    assert assets == {"docs/shot.png"} and soup.img["src"] == "shot.png"


def test_markdown_headings_also_answer_to_githubs_anchors():
    soup = BeautifulSoup('<h3 id="Threads">Threads<a class="anchor-link">¶</a></h3>', "html.parser")
    add_heading_aliases(soup)
    assert soup.find(id="threads") is not None and soup.find(id="Threads") is not None
    assert github_slug("Two commands: `make lab`") == "two-commands-make-lab"
