"""The website's generated pages: the pitfall catalogue, the troubleshooting table, the recorded GPU figures,
the solutions' index and the search page. Links here are relative to the site's root folder."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

from ptlab.course.pitfalls import Pitfall
from ptlab.course.site_notebooks import RecordedRun, pitfall_card

@dataclass(frozen=True)
class Section:
    """Where a pitfall's widget sits in a chapter page: the page, the heading above it, the heading's text."""

    page: str          # site path, e.g. notebooks/01_tensors.html
    anchor: str        # the heading's id
    heading: str
    card: str          # the widget's own anchor (pitfall-ID)


def _section_link(section: Section | None) -> str:
    if section is None:
        return ""
    return (f' · in <a href="{section.page}#{section.anchor}">{html.escape(section.heading)}</a> '
            f'(<a href="{section.page}#{section.card}">its widget</a>)')


def catalogue_page(records: list[Pitfall], runs: dict[str, RecordedRun], sections: dict[str, Section]) -> str:
    """Every pitfall with its symptom, code, recorded runs (and plot), why, catch, and a link to its section."""
    chapters = sorted({p.chapter for p in records})
    index = " · ".join(f'<a href="#chapter-{c}">chapter {c}</a>' for c in chapters)
    parts = [f"<h1>Pitfall catalogue</h1><p>{len(records)} pitfalls, each a runnable reproduction in "
             "<code>ptlab</code>: the same function runs with the bug on and fixed; the symptom says what it "
             f"measures, and its figures are under <b>Recorded runs</b>. By chapter: {index}.</p>"
             '<div class="note">This page is static. The figures under <b>Recorded runs</b> are the ones each '
             "chapter's notebook stored when its outputs were last generated on a CPU; nothing on this page ran "
             "in your browser. To run one yourself: <code>python -m ptlab pitfalls run ID</code> (add "
             "<code>--fixed</code> for the fixed code), or its widget in JupyterLab.</div>"]
    for chapter in chapters:
        parts.append(f'<h2 id="chapter-{chapter}">Chapter {chapter}</h2>')
        for record in (p for p in records if p.chapter == chapter):
            parts.append(pitfall_card(record, runs.get(record.id), title_tag="h3",
                                      section=_section_link(sections.get(record.id)), plots=True))
    return "\n".join(parts)


PITFALL_IN_TABLE = re.compile(r"\b([a-z0-9]+(?:-[a-z0-9]+)+) \(ch(\d+)\)")


def troubleshooting_page(table: str, chapter5: Section, known: set[str]) -> str:
    """Chapter 5's troubleshooting table as its notebook stored it, each pitfall linked to its catalogue entry."""
    linked = PITFALL_IN_TABLE.sub(lambda m: (f'<a href="pitfalls.html#{m.group(1)}">{m.group(1)}</a> (ch{m.group(2)})'
                                             if m.group(1) in known else m.group(0)), table)
    return ("<h1>Troubleshooting</h1><p>From what you see to what usually causes it, what to check first, and the "
            "pitfalls that reproduce it (each links to its entry in the catalogue). It is the table of chapter 5's "
            f'<a href="{chapter5.page}#{chapter5.anchor}">{html.escape(chapter5.heading)}</a>, as the notebook '
            f"stored it; the chapter shows each tool at work.</p>{linked}")


def _number(value: int | float) -> str:
    return f"{round(value):,}" if isinstance(value, int) or abs(value) >= 1000 else f"{value:.4g}"


def gpu_page(runs: list[dict], lessons: dict[str, str]) -> str:
    """Every recorded GPU run (data/gpu_runs/), its machine, then each lesson's figures with their sources."""
    parts = ["<h1>Recorded GPU figures</h1><p>CI has no GPU, so what a GPU measured is kept as data in "
             "<code>data/gpu_runs/</code>, with the GPU, the torch version and the date. The chapters print these "
             "figures labelled <i>recorded on …, not measured here</i> where no GPU is at hand.</p>"]
    if not runs:
        parts.append("<p>No GPU run has been recorded yet.</p>")
    for run in runs:
        label = f"{run['gpu']}, torch {run['torch']}, {run['date']}"
        slug = f"run-{run['date']}-{''.join(c if c.isalnum() else '-' for c in run['gpu'].lower())}"
        parts.append(f'<h2 id="{slug}">{html.escape(label)}</h2><p>CUDA {html.escape(run["cuda"])}. '
                     f"{html.escape(run['machine'])}.</p>")
        for lesson, figures in run["lessons"].items():
            rows = "".join(f"<tr><td>{html.escape(f['what'])}</td><td>{_number(f['value'])} {html.escape(f['unit'])}"
                           f"</td><td>{html.escape(run['sources'][f['source']])}</td></tr>" for f in figures)
            parts.append(f'<h3 id="{slug}-{lesson}">{html.escape(lessons.get(lesson, lesson))}</h3>'
                         f"<table><thead><tr><th>what</th><th>value</th><th>source</th></tr></thead>"
                         f"<tbody>{rows}</tbody></table>")
    return "\n".join(parts)


def solutions_index(pages: list[tuple[str, str]]) -> str:
    """The solutions folder as a page: one link per chapter's solutions (name, title)."""
    items = "".join(f'<li><a href="{name}">{html.escape(title)}</a></li>' for name, title in pages)
    return ("<h1>Solutions</h1><p>A worked answer to every exercise, each checked by the same checker the "
            f"chapter uses. A workshop handout leaves this folder out.</p><ul>{items}</ul>")


SEARCH_PAGE = ('<h1>Search</h1><p id="search-status">Searching…</p><ol class="search-results" id="search-results">'
               '</ol><noscript><p>Search needs JavaScript.</p></noscript>')
