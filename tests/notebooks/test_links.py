"""Cross-references cannot go stale: every link to a heading resolves, and no prose says a bare "section N".

A link to a heading is `[text](#anchor)` within a notebook, or `[text](04_cnn_training.ipynb#anchor)` across
notebooks. The anchor is JupyterLab's: the heading's rendered text with each space replaced by "-"
(`## 8. Choose on validation, test once` -> `#8.-Choose-on-validation,-test-once`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from notebook_rules import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
BARE_REFERENCE = re.compile(r"\b(sections?|chapters?) \d+", re.IGNORECASE)
FENCE = re.compile(r"```.*?```", re.S)


def rendered_text(markdown: str) -> str:
    """What a heading shows: links become their text, and `code`, **bold** and *italic* marks go."""
    text = LINK.sub(r"\1", markdown)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", text).strip()


def anchor(heading: str) -> str:
    """JupyterLab's id for a heading: its rendered text, spaces replaced by '-'."""
    return rendered_text(heading).replace(" ", "-")


def markdown_cells(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "markdown"]


def headings(path: Path) -> set[str]:
    return {anchor(line.lstrip("#").strip()) for cell in markdown_cells(path)
            for line in FENCE.sub("", cell).splitlines() if re.match(r"#{1,6} ", line)}


def link_problems(path: Path) -> list[str]:
    """Links to headings that do not resolve, and bare 'section N' / 'chapter N' in prose (headings aside)."""
    problems = []
    for cell in markdown_cells(path):
        prose = FENCE.sub("", cell)
        for text, target in LINK.findall(prose):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, fragment = target.partition("#")
            other = (path.parent / file).resolve() if file else path
            if file and not other.is_file():
                problems.append(f"[{text}]({target}): no notebook {file}")
            elif fragment and other.suffix == ".ipynb" and unquote(fragment) not in headings(other):
                problems.append(f"[{text}]({target}): no heading with that anchor in {other.name}")
        for line in prose.splitlines():
            if re.match(r"#{1,6} ", line):
                continue
            for match in BARE_REFERENCE.finditer(LINK.sub("", line)):
                problems.append(f"bare '{match.group(0)}': make it a link to the heading")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cross_reference_is_a_link_that_resolves(path):
    assert link_problems(path) == []


def test_the_link_check_fails_on_a_broken_or_bare_reference(tmp_path):
    cell = {"cell_type": "markdown", "metadata": {}, "source": [
        "## 2. A small CNN\n", "See [the CNN](#2.-A-small-CNN) and [the loop](#3.-The-loop).\n",
        "As section 4 shows, and [chapter 5](05_x.ipynb#Intro).\n"]}
    notebook = tmp_path / "01_probe.ipynb"
    notebook.write_text(json.dumps({"cells": [cell]}))
    assert link_problems(notebook) == ["[the loop](#3.-The-loop): no heading with that anchor in 01_probe.ipynb",
                                       "[chapter 5](05_x.ipynb#Intro): no notebook 05_x.ipynb",
                                       "bare 'section 4': make it a link to the heading"]
    assert anchor("3. The reference loop: `train_one_epoch`, **fit**") == "3.-The-reference-loop:-train_one_epoch,-fit"
