"""Every notebook of the course, as a learner sees it: JupyterLab in headless Chromium, a real kernel.

Run All, then: the kernel ends idle, every code cell ran, no cell shows an error, every widget
is live (not its text fallback), no JavaScript error reaches the console; one pitfall widget per
notebook is driven (bug on, Run; bug off, Run) and must show that run's figures. Screenshots
land in artifacts/browser/ (git-ignored). Notebooks are found when the tests are collected, so a
new chapter is covered without editing this file.
"""
from __future__ import annotations

import pytest
from labdriver import ARTIFACTS, REPO, SHOW_PITFALL, check_notebook, course_notebooks, step_through

pytestmark = pytest.mark.browser

NOTEBOOKS = course_notebooks()


def test_there_are_notebooks_to_check():
    assert NOTEBOOKS, "no notebooks under notebooks/"


@pytest.mark.timeout(900)  # opening, Run All (up to PTLAB_BROWSER_TIMEOUT s) and driving a widget
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[str(p) for p in NOTEBOOKS])
def test_notebook_in_jupyterlab(notebook, lab, browser, timings):
    shots = ARTIFACTS / str(notebook.with_suffix("")).replace("/", "--")
    report = check_notebook(browser, lab, notebook.as_posix(), REPO / notebook, shots=shots)
    timings[notebook.as_posix()] = round(report.run_all_s, 1)
    assert not report.problems, f"{notebook} in the browser:\n  " + "\n  ".join(report.problems)
    if SHOW_PITFALL.search((REPO / notebook).read_text()):
        assert report.driven, f"{notebook} shows pitfall widgets but none was driven"
        assert report.screenshots, f"{notebook}: no widget screenshot saved"



# The chapters learners' walkthroughs found silent waits in (chapter 5's hour, chapter 4's first day), run as a
# learner runs them: one Shift+Enter per cell. A silent wait is over 10 s of nothing on screen, or of progress bars
# that do not move; a figure shown as its '<Figure size ...>' text is a problem.
STEPPED = ["notebooks/04_cnn_training.ipynb", "notebooks/05_checkpoints_debugging.ipynb"]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("stepped", STEPPED)
def test_a_chapter_cell_by_cell_never_waits_in_silence(stepped, lab, browser):
    report = step_through(browser, lab, stepped, REPO / stepped, silent_limit_s=10.0)
    assert not report.problems, f"{stepped} cell by cell:\n  " + "\n  ".join(report.problems)
    slowest = sorted(report.seconds.items(), key=lambda kv: -kv[1])[:3]
    assert not report.silent, (f"{stepped}: cells that ran over 10 s with nothing on screen, or a bar that did "
                               "not move:\n  " + "\n  ".join(report.silent) + f"\n(slowest cells: {slowest})")
