"""The browser checks must be able to fail: each case below breaks one thing a learner would see.

A tiny probe course in a temp root: a healthy widget (the control), a widget whose reproduction
raises, and a cell that raises. Served once by a normal JupyterLab and once by a JupyterLab with
the ipywidgets lab extension disabled.
"""
from __future__ import annotations

import textwrap

import nbformat
import pytest
from labdriver import ARTIFACTS, WIDGET_EXTENSION, check_notebook, jupyterlab, step_through

pytestmark = pytest.mark.browser

EXPLODING_MODULE = '''
"""A throwaway pitfall whose reproduction raises, for the tests of the browser tests."""
from ptlab.course.pitfalls import Outcome, pitfall


@pitfall(id="exploding-probe", chapter=99, title="A reproduction that raises", symptom="it raises",
         why="deliberately broken", catch="the browser test must report it")
def exploding_probe(buggy: bool) -> Outcome:
    if buggy:
        raise ValueError("deliberate failure in the widget callback")  # BUG
    raise ValueError("deliberate failure in the widget callback")  # FIX
'''

PROBES = {
    "healthy_widget.ipynb": ['from ptlab import show_pitfall', 'show_pitfall("uint8-overflow")',
                             'import ipywidgets\nipywidgets.IntSlider(value=3)'],
    "raising_widget.ipynb": ['import exploding_probe\nfrom ptlab import show_pitfall',
                             'show_pitfall("exploding-probe")'],
    "raising_cell.ipynb": ['x = 1', '1 / 0', 'print(x)'],
    "silent_wait.ipynb": ['import time\ntime.sleep(4)', 'time.sleep(11)',
                          'print("waiting 11 s for a slow step (this prints first)")\ntime.sleep(11)'],
    # A bar that sits at 0/1 (fit's epoch bar did), one that moves, a figure shown as its repr only (History.plot's
    # bare Figure did) and one a notebook draws.
    "bars_and_figures.ipynb": ['import time\nfrom tqdm.auto import tqdm',
                               'bar = tqdm(total=1, desc="one epoch")\ntime.sleep(11)\nbar.update(1)\nbar.close()',
                               'for _ in tqdm(range(60), desc="batches"):\n    time.sleep(0.2)',
                               'from matplotlib.figure import Figure\nFigure(figsize=(3, 2)).subplots(1, 2)[0].figure',
                               'from ptlab.plots import notebook_figure\n'
                               'notebook_figure(figsize=(3, 2)).subplots(1, 2)[0].figure'],
    # An output answering a request the page never made, as a hook that runs after a widget's
    # request ended sends: it reaches no cell, only JupyterLab's Log Console (at level info).
    "escaped_output.ipynb": ['kernel = get_ipython().kernel\n'
                             'session = kernel.get_parent()["header"]["session"]\n'
                             'orphan = {"header": {"msg_id": "no-such-request", "session": session,\n'
                             '                     "msg_type": "execute_request", "username": "", "date": "", '
                             '"version": "5.3"}}\n'
                             'kernel.session.send(kernel.iopub_socket, "stream", '
                             '{"name": "stdout", "text": "escaped"},\n'
                             '                    parent=orphan, ident=b"stream.stdout")',
                             'print("the cells themselves are fine")'],
}


def _notebook(sources: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# probe")] + [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


@pytest.fixture(scope="module")
def probe_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes")
    (root / "exploding_probe.py").write_text(textwrap.dedent(EXPLODING_MODULE))
    for name, sources in PROBES.items():
        nbformat.write(_notebook(sources), root / name)
    return root


@pytest.fixture(scope="module")
def probe_lab(probe_root):
    with jupyterlab(probe_root) as server:
        yield server


def check(browser, lab, root, name, kind="lab"):
    return check_notebook(browser, lab, name, root / name, shots=ARTIFACTS / "probes" / f"{kind}--{name}")


def test_healthy_widget_passes(browser, probe_lab, probe_root):
    """The control: the same checks pass on a healthy notebook, so the failures below mean something."""
    report = check(browser, probe_lab, probe_root, "healthy_widget.ipynb")
    assert report.problems == []
    assert report.widgets == 1 and report.driven == "uint8-overflow"


def test_widget_callback_that_raises_is_reported(browser, probe_lab, probe_root):
    report = check(browser, probe_lab, probe_root, "raising_widget.ipynb")
    assert report.widgets == 1 and report.driven == "exploding-probe"
    raised = [p for p in report.problems if "the widget's run raised an exception" in p]
    assert raised, report.problems
    assert "deliberate failure in the widget callback" in raised[0]


def test_cell_error_is_reported_and_stops_run_all(browser, probe_lab, probe_root):
    report = check(browser, probe_lab, probe_root, "raising_cell.ipynb")
    assert any("shows an error output: ZeroDivisionError" in p for p in report.problems), report.problems
    assert "Run All stopped: 1 code cell(s) never ran (cells [3])" in report.problems, report.problems


def test_the_news_pop_up_is_reported_without_the_course_settings(browser, probe_root):
    with jupyterlab(probe_root, course_settings=False) as lab:
        report = check(browser, lab, probe_root, "raising_cell.ipynb", kind="no-course-settings")
    assert any("official Jupyter news" in p for p in report.problems), report.problems


def test_missing_widget_extension_shows_text_fallback(browser, probe_root):
    with jupyterlab(probe_root, disabled_extensions=(WIDGET_EXTENSION,)) as lab:
        report = check(browser, lab, probe_root, "healthy_widget.ipynb", kind="no-widget-extension")
    assert report.widgets == 0
    not_live = [p for p in report.problems if "is not a live widget" in p]
    assert not_live, report.problems
    assert "Run this cell for the widget, or: python -m ptlab pitfalls run uint8-overflow" in not_live[0]  # fallback
    assert any("widget output(s) but 0 live" in p and "IntSlider" in p for p in report.problems), report.problems
    # Without a widget manager the page itself logs errors (each widget model's comm has no
    # target): the console check hears them.
    assert any(p.startswith("console.error:") for p in report.problems), report.problems


def test_output_that_reached_no_cell_is_reported(browser, probe_lab, probe_root):
    report = check(browser, probe_lab, probe_root, "escaped_output.ipynb")
    escaped = [p for p in report.problems if "reached no cell" in p]
    assert escaped and "stream (escaped)" in escaped[0], report.problems


def test_a_cell_that_waits_in_silence_is_reported_and_one_that_says_so_is_not(browser, probe_lab, probe_root):
    report = step_through(browser, probe_lab, "silent_wait.ipynb", probe_root / "silent_wait.ipynb")
    assert report.problems == []
    assert len(report.silent) == 1 and report.silent[0].startswith("cell 2 ('time.sleep(11)') ran"), report.silent
    assert report.seconds[1] < 10 and report.seconds[3] > 10      # the cell that printed first is not reported


def test_a_bar_that_does_not_move_and_a_figure_shown_as_text_are_reported(browser, probe_lab, probe_root):
    report = step_through(browser, probe_lab, "bars_and_figures.ipynb", probe_root / "bars_and_figures.ipynb")
    assert len(report.silent) == 1, report.silent            # the moving bar (12 s) is not reported
    assert report.silent[0].startswith("cell 2 ('bar = tqdm(total=1, desc=\"one epoch\")') ran"), report.silent
    assert "a progress bar that did not move" in report.silent[0], report.silent
    assert report.seconds[3] > 10, report.seconds
    bare = [p for p in report.problems if "shows a figure as text only" in p]
    assert len(bare) == 1 and bare[0].startswith("cell 4 ") and "<Figure size 300x200 with 2 Axes>" in bare[0], \
        report.problems                                      # the notebook_figure in cell 5 is drawn
    assert len(report.problems) == 1, report.problems
