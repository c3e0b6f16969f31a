"""A notebook as a web page: its stored outputs as they are, each pitfall widget replaced by its recorded runs.

Nothing is executed. A pitfall widget needs a live kernel, so the page shows what the widget shows before a
run (title, symptom, the code with its BUG and FIX lines) and, labelled as recorded, the figures that the
notebook's own `compare_pitfall` cell printed when its outputs were last generated.
"""
from __future__ import annotations

import copy
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from ptlab.course.catalogue import watch_text
from ptlab.course.pitfalls import Pitfall, get_pitfall
from ptlab.course.widgets import prose_html

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
COMPARE_CALL = re.compile(r"""compare_pitfall\(\s*["']([a-z0-9-]+)["']""")
SHOW_CALL = re.compile(r"""show_pitfall\(\s*["']([a-z0-9-]+)["']""")
# The widget's saved text form names its pitfall too (older outputs: "PitfallWidget('ID'): ...").
WIDGET_TEXT = re.compile(r"pitfalls run ([a-z0-9-]+)|PitfallWidget\('([a-z0-9-]+)'\)")
RUN_LINE = re.compile(r"^[✔✘] (bug on|fixed): ")


@dataclass
class RecordedRun:
    """What a notebook's compare_pitfall cell printed (and plotted) for one pitfall, as stored."""

    pitfall_id: str
    notebook: str                 # the notebook's path in the course folder, e.g. notebooks/01_tensors.ipynb
    text: str                     # the id line's block: figures side by side, then a ✔/✘ line per check
    images: list[str] = field(default_factory=list)   # base64 PNGs of the cell's plot, when it drew one


def comparison_block(stdout: str, pitfall_id: str) -> str | None:
    """The lines compare_pitfall printed for `pitfall_id` (its figure table and check lines), or None."""
    lines = stdout.splitlines()
    if pitfall_id not in lines:
        return None
    block, runs = [], {"bug on": 0, "fixed": 0}
    for line in lines[lines.index(pitfall_id) + 1:]:
        if line.startswith("skipped: "):
            return line
        run = RUN_LINE.match(line)
        # Both runs check the same statements, so there are as many fixed lines as bug-on lines: a later
        # '✔ fixed: ...' line is the notebook's own claim (07:c38), not the comparison's.
        if run and run[1] == "fixed" and runs["fixed"] >= runs["bug on"]:
            break
        if line.startswith("  ") or run or (not block and line.strip() == ""):
            block.append(line)
            if run:
                runs[run[1]] += 1
        else:
            break
    return "\n".join(block) if block else None


def recorded_runs(path: Path, course: Path) -> dict[str, RecordedRun]:
    """Every pitfall comparison stored in the notebook at `path`, by pitfall id."""
    nb = nbformat.read(path, as_version=4)
    runs = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        ids = COMPARE_CALL.findall(cell.source)
        stdout = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
        images = [o.data["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})]
        for pid in ids:
            text = comparison_block(stdout, pid)
            if text is not None:
                runs[pid] = RecordedRun(pid, path.relative_to(course).as_posix(), text,
                                        images if len(ids) == 1 else [])
    return runs


def code_rows(record: Pitfall) -> str:
    """The reproduction's code, one div per line, BUG and FIX lines marked by class."""
    return "".join(f'<div class="{marker or "line"}">{html.escape(line) or " "}</div>'
                   for line, marker in record.marked_lines())


def pitfall_card(record: Pitfall, run: RecordedRun | None, title_tag: str = "div", section: str = "",
                 plots: bool = False) -> str:
    """One pitfall as static HTML: what its widget shows, its recorded runs (labelled), why, and how to catch it."""
    if run is None:
        recorded = '<p class="recorded">No recorded run of this pitfall was found in the notebooks.</p>'
    else:
        where = html.escape(Path(run.notebook).name)
        recorded = (f'<p class="recorded"><b>Recorded runs</b>, bug on and fixed, as <code>compare_pitfall</code> '
                    f'printed them in {where} when its outputs were last generated (on a CPU; a figure marked ≈ '
                    'may vary from machine to machine). The widget needs a live kernel: open the notebook in '
                    f'JupyterLab, or run <code>python -m ptlab pitfalls run {record.id}</code>.</p>'
                    f'<pre class="pitfall-runs">{html.escape(run.text)}</pre>')
        if plots:
            recorded += "".join(f'<img class="pitfall-plot" alt="{html.escape(record.title)}: both runs plotted" '
                                f'src="data:image/png;base64,{png.strip()}">' for png in run.images)
    return (f'<div class="pitfall-card" id="pitfall-{record.id}">'
            f'<{title_tag} class="pitfall-title" id="{record.id}">{html.escape(record.title)}</{title_tag}>'
            f'<div class="meta">{record.id} · chapter {record.chapter}{section}</div>'
            f'<p><i>Symptom:</i> {html.escape(record.symptom)}</p>'
            f'<div class="pitfall-code" aria-label="the reproduction">{code_rows(record)}</div>{recorded}'
            f'<p><b>Why:</b> {prose_html(record.why)}</p>'
            f'<p><b>Catch it in your code:</b> {prose_html(record.catch)}</p>'
            f'<p><b>Watch:</b> {prose_html(watch_text(record))}</p></div>')


LIVE_ONLY = ('<div class="widget-note">An interactive widget stood here (a progress bar, for example): it is drawn '
             'only while the notebook runs in JupyterLab.</div>')


def widget_pitfall(source: str, output: dict) -> str | None:
    """The pitfall a widget output shows: the one show_pitfall call in its cell, else the id its saved text names."""
    calls = SHOW_CALL.findall(source)
    if len(calls) == 1:
        return calls[0]
    match = WIDGET_TEXT.search("".join(output["data"].get("text/plain", "")))
    return (match.group(1) or match.group(2)) if match else None


def _static_widget(source: str, output: dict, runs: dict[str, RecordedRun]) -> dict:
    """A widget output without a kernel: a pitfall's card, or a note where another widget (tqdm's bar) stood."""
    pid = widget_pitfall(source, output)
    card = pitfall_card(get_pitfall(pid), runs.get(pid)) if pid else LIVE_ONLY
    return {**output, "data": {"text/html": card}}


def notebook_html(path: Path, runs: dict[str, RecordedRun]) -> str:
    """The notebook's cells and stored outputs as HTML (no prompts), each widget view made static."""
    nb = copy.deepcopy(nbformat.read(path, as_version=4))
    nb.metadata.pop("widgets", None)          # no widget state: nothing for a widget manager to fetch
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.from_dict(_static_widget(cell.source, o, runs))
                            if WIDGET_VIEW in o.get("data", {}) else o for o in cell.outputs]
    exporter = HTMLExporter(template_name="basic", exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb)
    return body
