"""Session fixtures for the browser tests: one JupyterLab on a copy of the course, one Chromium."""
from __future__ import annotations

import json
import signal

import pytest
from labdriver import ARTIFACTS, copy_course, jupyterlab, launch_chromium

TIMINGS: dict[str, float] = {}


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # A CI job cancelled with SIGTERM unwinds like Ctrl-C, so the fixtures below still stop
    # JupyterLab by its PID instead of leaving it (and its kernels) running.
    signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab serving a temporary copy of notebooks/ (Run All never edits the committed files)."""
    root = copy_course(tmp_path_factory.mktemp("course"))
    with jupyterlab(root) as server:
        yield server


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def timings():
    """Run All seconds per notebook, printed at the end and written next to the screenshots."""
    return TIMINGS


def pytest_terminal_summary(terminalreporter):
    if not TIMINGS:
        return
    terminalreporter.section("Run All in JupyterLab + Chromium")
    for notebook, seconds in TIMINGS.items():
        terminalreporter.write_line(f"{notebook:<45} {seconds:6.1f} s")
    terminalreporter.write_line(f"{'total':<45} {sum(TIMINGS.values()):6.1f} s")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "timings.json").write_text(json.dumps(TIMINGS, indent=1))
