"""The pitfall catalogue as text, JSON and the README's Markdown table, all from the registry."""
from __future__ import annotations

import json
from pathlib import Path

from ptlab.course.pitfalls import all_pitfalls
from ptlab.watch import DETECTS

START, END = "<!-- pitfalls:start -->", "<!-- pitfalls:end -->"


def catalogue_json() -> str:
    """Every pitfall's record (without code) as a JSON list."""
    return json.dumps([p.summary() for p in all_pitfalls()], indent=2, ensure_ascii=False)


def catalogue_text() -> str:
    """The catalogue for a terminal: chapter, id, title, symptom."""
    lines = []
    for p in all_pitfalls():
        lines.append(f"ch{p.chapter}  {p.id:<28} {p.title}")
        lines.append(f"     {'':<28} symptom: {p.symptom}")
    return "\n".join(lines)


def catalogue_markdown() -> str:
    """The README table, generated; `python -m ptlab catalogue --write README.md` refreshes it."""
    rows = ["| Ch | Pitfall | Measured symptom | Watch | Try it |", "|---|---|---|---|---|"]
    for p in all_pitfalls():
        title = p.title.replace("|", "\\|")
        symptom = p.symptom.replace("|", "\\|")
        watched = "✔" if p.id in DETECTS else ""                 # `python -m ptlab watch` finds it at run time
        rows.append(f"| {p.chapter} | {title} | {symptom} | {watched} | `python -m ptlab pitfalls run {p.id}` |")
    return "\n".join(rows)


def _splice(text: str, table: str, where: Path) -> str:
    if START not in text or END not in text:
        raise ValueError(f"{where} has no {START} ... {END} markers for the catalogue")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def write_readme(readme: Path) -> bool:
    """Refresh the table in the README; True if the file changed."""
    text = readme.read_text(encoding="utf-8")
    new = _splice(text, catalogue_markdown(), readme)
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def readme_is_current(readme: Path) -> bool:
    """True if the README's table matches the registry."""
    text = readme.read_text(encoding="utf-8")
    return _splice(text, catalogue_markdown(), readme) == text
