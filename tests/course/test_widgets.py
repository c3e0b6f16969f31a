"""The generic pitfall widget, driven from Python (the browser tests drive it in Chromium)."""
import matplotlib

matplotlib.use("agg")

from ptlab.course.pitfalls import Outcome, Pitfall, get_pitfall  # noqa: E402
from ptlab.course.widgets import REPR_LIMIT, PitfallWidget, code_html, show_pitfall  # noqa: E402


def test_widget_runs_buggy_then_fixed():
    widget = show_pitfall("uint8-overflow")
    assert repr(widget) == "Run this cell for the widget, or: python -m ptlab pitfalls run uint8-overflow"
    assert "needs a live kernel" in widget.status.value  # what a saved, not yet live widget says
    assert widget.bug_toggle.value is True
    widget.run()
    assert widget.last_outcome.broken and "bug on" in widget.status.value
    widget.bug_toggle.value = False
    widget.run_button.click()
    assert not widget.last_outcome.broken and "fixed" in widget.status.value
    assert not widget.run_button.disabled


def test_widget_shows_each_check_and_plots_with_a_bare_figure():
    import html

    from matplotlib.figure import Figure

    from ptlab.course.widgets import figures_html, prose_html
    from ptlab.plots import plot_series

    outcome = get_pitfall("uint8-overflow").run(buggy=True)
    page = figures_html("bug on", outcome)
    assert "BROKEN" in page and all(f"✔ bug on: {html.escape(c.line())}" in page for c in outcome.checks)
    assert ">BROKEN</b>: the symptom shows (every check below holds)</div>" in page
    assert ">OK</b>: the symptom is gone</div>" in figures_html("fixed", get_pitfall("uint8-overflow").run(buggy=False))
    assert prose_html("call `opt.zero_grad()` & go") == "call <code>opt.zero_grad()</code> &amp; go"
    fig = plot_series({"bug on": get_pitfall("missing-zero-grad").run(buggy=True)})
    assert isinstance(fig, Figure) and fig.canvas.manager is None  # not pyplot's: the inline backend never closes it


def test_code_is_shown_with_bug_and_fix_lines_marked():
    html = code_html(get_pitfall("missing-keepdim"))
    assert html.count("#c0392b") == 1 and html.count("#27ae60") == 1  # one BUG line, one FIX line
    assert "keepdim=True" in html


def test_a_reproduction_that_raises_is_reported_not_lost():
    def explode(buggy: bool) -> Outcome:
        raise ValueError("boom")

    record = Pitfall("explode", 0, "t", "s", "w", "c", explode)
    widget = PitfallWidget(record)
    widget.run()
    assert "raised an exception" in widget.status.value
    assert widget.last_outcome is None and not widget.run_button.disabled


def test_a_pitfall_that_cannot_run_here_says_skipped_not_a_traceback():
    def never(buggy: bool) -> Outcome:
        raise AssertionError("the reproduction ran")

    record = Pitfall("needs-linux", 0, "t", "s", "w", "c", never,
                     unavailable=lambda: "needs Linux; this is win32")
    widget = PitfallWidget(record)
    widget.run()
    assert widget.status.value == "skipped: it cannot run on this machine (reason below)"
    assert widget.last_outcome is None and not widget.run_button.disabled


def test_a_run_that_is_not_as_it_should_be_says_so_in_words():
    from ptlab.claims import Check
    from ptlab.course.widgets import figures_html

    shows, gone = (Outcome(figures={}, checks=[Check("n", n, "> 1")]) for n in (3, 0))
    assert "the symptom still shows with the fix: a course bug" in figures_html("fixed", shows)
    assert "the symptom did not show this time, though the bug is on" in figures_html("bug on", gone)


def test_every_widgets_text_form_fits_whole_where_ipywidgets_cuts_it():
    """A saved, unrun widget cell shows this text: its command must not be cut to '…'."""
    from ipywidgets import IntSlider

    from ptlab.course.pitfalls import all_pitfalls

    class Wordy(IntSlider):
        def __repr__(self):
            return "x" * 200

    assert Wordy()._repr_mimebundle_()["text/plain"] == "x" * REPR_LIMIT + "…"       # the limit is ipywidgets' own
    too_long = {p.id: len(repr(PitfallWidget(p))) for p in all_pitfalls() if len(repr(PitfallWidget(p))) > REPR_LIMIT}
    assert not too_long
