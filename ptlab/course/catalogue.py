"""The pitfall catalogue as text, JSON and the README's Markdown table, all from the registry."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from ptlab.course.pitfalls import Pitfall, all_pitfalls
from ptlab.watch import DETECTS, HINT_ONLY

START, END = "<!-- pitfalls:start -->", "<!-- pitfalls:end -->"


def catalogue_json() -> str:
    """Every pitfall's record (without code) as a JSON list."""
    return json.dumps([p.summary() for p in all_pitfalls()], indent=2, ensure_ascii=False)


WATCH_COMMAND = "python -m ptlab watch"
WIDTH = 100   # terminal text is wrapped at this width


def catalogue_text() -> str:
    """The catalogue for a terminal: chapter, id, whether the watch detects it, title, then symptom."""
    records = all_pitfalls()
    width = max(len(p.id) for p in records)
    lines = [f"ch  {'id':<{width}}  watch  title"]
    for p in records:
        lines.append(f"{p.chapter:<2}  {p.id:<{width}}  {_watch_mark(p.id):<5}  {p.title}")
        lines.append(textwrap.fill(p.symptom, WIDTH, initial_indent="    symptom: ", subsequent_indent="      "))
    lines.append(f"watch ✔: `{WATCH_COMMAND} your_script.py` detects it while your own script trains; hint: it "
                 "only prints a hint (exit status 0). Run one: `python -m ptlab pitfalls run ID [--fixed]`.")
    return "\n".join(lines)


def marked_code_text(record: Pitfall, colour: bool = False) -> str:
    """The reproduction's code with a gutter naming the BUG and FIX lines (in red and green when `colour`)."""
    paint = {"BUG": "\033[31m", "FIX": "\033[32m"} if colour else {}
    rows = []
    for line, marker in record.marked_lines():
        row = f"{marker or '':>3} | {line}".rstrip()
        rows.append(f"{paint[marker]}{row}\033[0m" if marker in paint else row)
    return "\n".join(rows)


def _watch_mark(pitfall: str) -> str:
    """The Watch column: ✔ the watch reports it as a cause, "hint" it only hints at it (exit 0), "" not seen."""
    return "hint" if pitfall in HINT_ONLY else "✔" if pitfall in DETECTS else ""


def watch_text(record: Pitfall) -> str:
    """Whether `python -m ptlab watch` detects this pitfall in a running script, and by which sign."""
    if record.id in HINT_ONLY:
        return (f"`{WATCH_COMMAND} your_script.py` can only hint at it (printed, exit status 0), since correct code "
                f"can show the same sign: it looks for {DETECTS[record.id].removeprefix('a hint: ')}.")
    if record.id in DETECTS:
        return (f"`{WATCH_COMMAND} your_script.py` detects it while your script trains: it looks for "
                f"{DETECTS[record.id]}.")
    return f"`{WATCH_COMMAND}` does not detect this one: catch it as described above."


def lesson_text(record: Pitfall, colour: bool = False) -> str:
    """What the widget teaches, as terminal text: title, symptom, the marked code, why, how to catch it, the watch."""

    def paragraph(head: str, text: str) -> str:
        return textwrap.fill(text, WIDTH, initial_indent=f"{head} ", subsequent_indent="  ")

    return "\n".join([f"{record.title}  [{record.id}, chapter {record.chapter}]", paragraph("Symptom:", record.symptom),
                      "", marked_code_text(record, colour), "", paragraph("Why:", record.why),
                      paragraph("Catch it in your code:", record.catch), paragraph("Watch:", watch_text(record))])


def catalogue_markdown() -> str:
    """The README table, generated; `python -m ptlab catalogue --write README.md` refreshes it."""
    rows = ["| Ch | Pitfall | Measured symptom | Watch | Try it |", "|---|---|---|---|---|"]
    for p in all_pitfalls():
        title = p.title.replace("|", "\\|")
        symptom = p.symptom.replace("|", "\\|")
        watched = _watch_mark(p.id)                 # `python -m ptlab watch` finds it at run time, or only hints
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
