"""Every notebook of the course, as a learner sees it: JupyterLab in headless Chromium, a real kernel.

Run All, then: the kernel ends idle, every code cell ran, no cell shows an error, every widget
is live (not its text fallback), no JavaScript error reaches the console; one pitfall widget per
notebook is driven (bug on, Run; bug off, Run) and must show that run's figures. Screenshots
land in artifacts/browser/ (git-ignored). Notebooks are found when the tests are collected, so a
new chapter is covered without editing this file.
"""
from __future__ import annotations

import pytest
from labdriver import ARTIFACTS, REPO, SHOW_PITFALL, check_notebook, course_notebooks

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

