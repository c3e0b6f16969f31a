"""pytest setup shared by the unit tests and strict nbval."""
from __future__ import annotations

import os

from ptlab.course.nbrun import KERNEL_ENV, THREAD_DEFAULTS


def pytest_configure(config):
    # nbval's kernels (and the browser tests' JupyterLab) inherit this environment: the one `make notebooks`
    # executes with, and the course's thread rule unless the user set their own.
    for name, value in THREAD_DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.environ.update(KERNEL_ENV)


def pytest_terminal_summary(terminalreporter):
    """Report the share of output-checked code cells per notebook (the budget is 85%)."""
    import sys

    module = sys.modules.get("test_notebook_hygiene")
    fractions = getattr(module, "CHECKED_FRACTIONS", None)
    if fractions:
        terminalreporter.section("output-checked code cells per notebook")
        for path, fraction in sorted(fractions.items()):
            terminalreporter.write_line(f"{fraction:6.0%}  {path}")
