"""The generic pitfall widget, driven from Python (the browser tests drive it in Chromium)."""
import matplotlib

matplotlib.use("agg")

from ptlab.pitfalls import Outcome, Pitfall, get_pitfall  # noqa: E402
from ptlab.widgets import PitfallWidget, code_html, show_pitfall  # noqa: E402


def test_widget_runs_buggy_then_fixed():
    widget = show_pitfall("uint8-overflow")
    assert repr(widget) == "PitfallWidget('uint8-overflow')"
    assert widget.bug_toggle.value is True
    widget.run()
    assert widget.last_outcome.broken and "bug on" in widget.status.value
    widget.bug_toggle.value = False
    widget.run_button.click()
    assert not widget.last_outcome.broken and "fixed" in widget.status.value
    assert not widget.run_button.disabled


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
