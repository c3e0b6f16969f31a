"""One generic widget for any pitfall: read the code, flip the bug, press Run, watch the figures."""
from __future__ import annotations

import html
import time
import traceback

import ipywidgets as widgets
from IPython.display import display

from ptlab.course.pitfall_record import BUG_ON, FIXED, run_text
from ptlab.course.pitfalls import Outcome, Pitfall, get_pitfall
from ptlab.plots import plot_series, show_figure

_LINE_STYLE = {
    "BUG": "background:#fdecea;border-left:3px solid #c0392b;",
    "FIX": "background:#eafaf1;border-left:3px solid #27ae60;",
    None: "border-left:3px solid transparent;",
}


def code_html(record: Pitfall) -> str:
    """The reproduction's source as HTML, with # BUG and # FIX lines highlighted."""
    rows = [
        f'<div style="{_LINE_STYLE[marker]}padding-left:6px;white-space:pre">{html.escape(line) or " "}</div>'
        for line, marker in record.marked_lines()
    ]
    return ('<div class="ptlab-code" style="font-family:monospace;font-size:12px;line-height:1.35;'
            'overflow-x:auto">' + "".join(rows) + "</div>")


def prose_html(text: str) -> str:
    """Record prose as HTML: `backticked` spans become inline code, everything else is escaped."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts))


_BROKEN, _OK = '<b style="color:#c0392b">BROKEN</b>', '<b style="color:#27ae60">OK</b>'
# What a run means, in words (shown live, never stored in a notebook): the symptom shows when every check holds.
VERDICTS = {(BUG_ON, True): f"{_BROKEN}: the symptom shows (every check below holds)",
            (FIXED, False): f"{_OK}: the symptom is gone",
            (FIXED, True): f"{_BROKEN}: the symptom still shows with the fix: a course bug, please report it",
            (BUG_ON, False): f"{_OK}: the symptom did not show this time, though the bug is on (✘ below): "
                             "a course bug, please report it"}


def figures_html(label: str, outcome: Outcome) -> str:
    """The verdict, then the run as compare_pitfall and the command line show it (run_text), as HTML."""
    if label not in (BUG_ON, FIXED):
        raise ValueError(f"label must be {BUG_ON!r} or {FIXED!r}, got {label!r}")
    verdict = VERDICTS[label, outcome.broken]
    return (f'<div class="ptlab-verdict">{verdict}</div><pre class="ptlab-figures" style="margin:4px 0;'
            f'font-size:12px;line-height:1.35">{html.escape(run_text({label: outcome}))}</pre>')


# ipywidgets shows at most this many characters of a widget's text form (the rest becomes '…').
REPR_LIMIT = 110


class PitfallWidget(widgets.VBox):
    """Title, symptom, marked code, a bug toggle, a Run button, figures, a plot, why and how to catch it."""

    def __init__(self, record: Pitfall):
        self.record = record
        self.bug_toggle = widgets.Checkbox(value=True, description="bug on", indent=False)
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play")
        # Saved with the notebook, this text is what a learner sees before the cell runs in a live kernel.
        self.status = widgets.Label(
            value="press Run (nothing happens? run this cell first: the widget needs a live kernel)")
        self.output = widgets.Output()
        self.last_outcome = None
        self.outcomes: dict[str, object] = {}  # the latest run of each mode, plotted together
        self.run_button.on_click(lambda _: self.run())
        header = widgets.HTML(
            f"<h4 style='margin:4px 0'>{html.escape(record.title)}</h4>"
            f"<div><i>Symptom:</i> {html.escape(record.symptom)} "
            f"<span style='color:#888'>[{record.id}, chapter {record.chapter}]</span></div>")
        explanation = widgets.HTML(
            f"<div style='line-height:1.4;margin-top:4px'><b>Why:</b> {prose_html(record.why)}</div>"
            f"<div style='line-height:1.4;margin-top:4px'><b>Catch it in your code:</b> {prose_html(record.catch)}"
            "</div>")
        controls = widgets.HBox([self.bug_toggle, self.run_button, self.status])
        super().__init__([header, widgets.HTML(code_html(record)), controls, self.output, explanation])
        self.add_class("ptlab-pitfall")
        self.status.add_class("ptlab-status")  # DOM hooks for the browser tests (tests/browser)
        self.output.add_class("ptlab-output")

    def run(self) -> None:
        """Run the reproduction as the toggle says and show its figures and plot in the output area."""
        buggy = self.bug_toggle.value
        label = BUG_ON if buggy else FIXED
        skipped = self.record.skipped_text()
        if skipped is not None:  # not a failure: this machine lacks what the pitfall needs
            self.status.value = "skipped: it cannot run on this machine (reason below)"
            with self.output:
                self.output.clear_output(wait=True)
                print(skipped)
            return
        self.run_button.disabled = True
        self.status.value = f"running ({label})…"
        start = time.perf_counter()
        with self.output:
            self.output.clear_output(wait=True)
            try:
                outcome = self.record.run(buggy=buggy)
            except Exception:  # show the learner everything, lose nothing
                self.status.value = "the run raised an exception (shown below)"
                print(traceback.format_exc())
                return
            finally:
                self.run_button.disabled = False
            self.last_outcome = outcome
            self.outcomes[label] = outcome
            display(widgets.HTML(f"<div class='ptlab-run' data-mode='{label}'><b>Run: {label}</b></div>"
                                 + figures_html(label, outcome)))
            fig = plot_series(self.outcomes, title=self.record.title)  # both modes once both have run
            if fig is not None:
                show_figure(fig)
        self.status.value = f"done in {time.perf_counter() - start:.1f} s ({label})"

    def __repr__(self) -> str:
        # The text a notebook shows where the widget cannot be drawn (no live kernel, no widget extension).
        # ipywidgets cuts a widget's text at 110 characters: REPR_LIMIT keeps the command whole.
        return f"Run this cell for the widget, or: python -m ptlab pitfalls run {self.record.id}"


def show_pitfall(pitfall_id: str) -> PitfallWidget:
    """The interactive widget for one pitfall (the notebook displays it)."""
    return PitfallWidget(get_pitfall(pitfall_id))
