"""Drive the course as a learner does: real JupyterLab, real Chromium, real kernel.

The checks are plain functions that return a list of problems (empty means fine), so the
browser tests assert on that list and the tests of the tests can show that it catches a
missing widget extension, a cell error or a widget callback that raises.
"""
from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import nbformat
import psutil

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = REPO / "artifacts" / "browser"
DOCS_IMAGE = REPO / "docs" / "widget.png"
CHROMIUM = os.environ.get("PTLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Generous: the 2 cores of a laptop or a CI runner may be shared with other work.
RUN_ALL_TIMEOUT_S = float(os.environ.get("PTLAB_BROWSER_TIMEOUT", "420"))
WIDGET_RUN_TIMEOUT_S = 180.0
WIDGET_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
SHOW_PITFALL = re.compile(r"""show_pitfall\(\s*["']([a-z0-9-]+)["']""")
RAISES_MARK = re.compile(r"#\s*NBVAL_RAISES_EXCEPTION")
# The widget whose picture goes into the README (it has a plot); elsewhere the first widget is driven.
DOCS_PITFALL = "broadcast-loss-shape"


def course_notebooks(root: Path = NOTEBOOKS) -> list[Path]:
    """Every notebook under notebooks/ (solutions included, checkpoints excluded), relative to the repo."""
    return [p.relative_to(REPO) for p in sorted(root.rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts]


def copy_course(dst: Path) -> Path:
    """Copy notebooks/ into dst, so Run All never touches the committed files."""
    shutil.copytree(NOTEBOOKS, dst / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "ptlab-export"))
    return dst


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@dataclass
class Lab:
    """A running JupyterLab: its address, PID and log file."""

    url: str
    pid: int
    log: Path

    def api(self, method: str, path: str) -> object:
        """Call the server's REST API; the JSON answer or None.

        No token, but the server still wants its _xsrf cookie echoed in a header on anything
        other than GET: fetch the cookie from /lab first.
        """
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        opener.open(self.url + "/lab", timeout=30).read()
        xsrf = next((c.value for c in jar if c.name == "_xsrf"), "")
        req = urllib.request.Request(self.url + path, method=method, headers={"X-XSRFToken": xsrf})
        with opener.open(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_kernel(self, notebook: str) -> None:
        """Shut down the kernel of one notebook's session (kernels of finished notebooks use memory)."""
        for session in self.api("GET", "/api/sessions") or []:
            if session.get("path") == notebook:
                self.api("DELETE", f"/api/sessions/{session['id']}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server by its PID (SIGTERM, it shuts its kernels down), then any survivor by PID."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        children = []
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass


@contextmanager
def jupyterlab(root: Path, disabled_extensions: tuple[str, ...] = (), start_timeout_s: float = 120.0,
               course_settings: bool = True) -> Iterator[Lab]:
    """JupyterLab from this venv on 127.0.0.1, a free port, root_dir=root, isolated config; stopped on exit.

    Config, settings, workspaces and runtime files live in a temporary folder so a user's own
    JupyterLab set-up never changes what the test sees. disabled_extensions are switched off
    through labconfig/page_config.json, as `jupyter labextension disable` would.
    """
    home = Path(tempfile.mkdtemp(prefix="ptlab-lab-"))
    config, settings = home / "config", home / "settings"
    if disabled_extensions:
        _write_json(config / "labconfig" / "page_config.json",
                    {"disabledExtensions": {name: True for name in disabled_extensions}})
    # Every cell in the DOM (no windowing), so each cell's outputs can be checked.
    _write_json(settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
                {"windowingMode": "none"})
    # Never save from the browser: Run All must leave the notebook files as they were.
    _write_json(settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings",
                {"autosave": False})
    # No news or update checks: that comes from the course's own overrides.json in the venv (make
    # setup installs it), which these tests check by looking for the news pop-up (news_problems).
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(home / "runtime"))
    port = free_port()
    log = home / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}",
           "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.port_retries=0", "--allow-root",
           f"--ServerApp.root_dir={root}",
           # window.jupyterapp: lets the test read each cell's output types (an error and a
           # stderr print render alike in the DOM).
           "--LabApp.expose_app_in_browser=True"]
    if not course_settings:  # as if the course's overrides.json were not installed (tests of the tests)
        cmd.append(f"--LabApp.app_settings_dir={home / 'no-app-settings'}")
    with open(log, "w") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=root)
    lab = Lab(f"http://127.0.0.1:{port}", proc.pid, log)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(lab.url + "/api/status", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab not ready in {start_timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.3)
        yield lab
    finally:
        _stop(proc)
        shutil.rmtree(home, ignore_errors=True)


def launch_chromium(playwright):
    """Debian's headless chromium, launched by Playwright."""
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"{CHROMIUM} not found: apt-get install -y chromium (or set PTLAB_CHROMIUM)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@dataclass
class NotebookReport:
    """What one notebook did in the browser."""

    notebook: str
    problems: list[str] = field(default_factory=list)
    run_all_s: float = 0.0
    widgets: int = 0
    driven: str | None = None
    screenshots: list[Path] = field(default_factory=list)


# A matplotlib Figure that IPython could not draw shows only its repr: '<Figure size 900x340 with 2 Axes>'.
_BARE_FIGURES_JS = """(outputs => outputs.filter(o => o.data && !o.data['image/png'] && /^<Figure size /.test(
  [].concat(o.data['text/plain'] ?? '').join(''))).map(o => [].concat(o.data['text/plain']).join('')))"""
BARE_FIGURE = "shows a figure as text only"


# Per cell, from the notebook JupyterLab shows: type, execution count, output types, and for
# widget cells what the DOM holds.
_CELLS_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  return [...panel.content.widgets].map(cell => {
    const isCode = cell.model.type === 'code';
    const outputs = isCode ? cell.model.outputs.toJSON() : [];
    const area = cell.node.querySelector('.jp-Cell-outputArea');
    return {
      type: cell.model.type,
      source: cell.model.sharedModel.getSource(),
      tags: cell.model.getMetadata('tags') ?? [],
      count: isCode ? cell.model.executionCount : null,
      prompt: isCode ? (cell.node.querySelector('.jp-InputArea-prompt')?.textContent ?? '') : '',
      errors: outputs.filter(o => o.output_type === 'error').map(o => `${o.ename}: ${o.evalue}`),
      widgetOutputs: outputs.filter(o => o.data && o.data['application/vnd.jupyter.widget-view+json']).length,
      // top-level outputs of this cell that hold a rendered widget view
      liveWidgets: area ? [...area.querySelectorAll('.jp-OutputArea-output')]
        .filter(o => !o.parentElement.closest('.jupyter-widgets'))
        .filter(o => o.matches('.jupyter-widgets') || o.querySelector('.jupyter-widgets')).length : 0,
      pitfalls: area ? [...area.querySelectorAll('.ptlab-pitfall')].map(w => ({
        checkbox: w.querySelectorAll('.widget-checkbox input[type=checkbox]').length,
        run: [...w.querySelectorAll('button.widget-button')].filter(b => b.textContent.trim() === 'Run').length,
      })) : [],
      text: area ? area.innerText.slice(0, 300) : '',
      bareFigures: BARE_FIGURES(outputs),
    };
  });
}""".replace("BARE_FIGURES", _BARE_FIGURES_JS)


def _menu(page, menu: str, item: str) -> None:
    page.get_by_role("menuitem", name=menu, exact=True).click()
    page.locator(".lm-Menu-content .lm-Menu-item").filter(
        has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$"))).click()


def _wait_until_run_all_done(page, timeout_s: float) -> None:
    """Run All is done when the first code cell has a count, none shows [*] and the kernel is idle, 3 looks in a row."""
    done_js = """() => {
      const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]
        .map(p => p.textContent.trim());
      const status = document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status;
      return prompts.length > 0 && /^\\[\\d+\\]:$/.test(prompts[0]) && !prompts.includes('[*]:') && status === 'idle';
    }"""
    deadline, stable = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        stable = stable + 1 if page.evaluate(done_js) else 0
        if stable >= 3:
            return
        page.wait_for_timeout(500)
    status = page.get_attribute(".jp-Notebook-ExecutionIndicator", "data-status")
    raise TimeoutError(f"Run All did not finish in {timeout_s:.0f} s (kernel {status!r})")


def open_notebook(page, lab: Lab, notebook: str, n_cells: int, timeout_s: float = 180.0) -> None:
    """Open a notebook and wait until all its cells are on the page and its kernel is idle."""
    page.goto(f"{lab.url}/lab/tree/{notebook}?reset")  # ?reset: no tabs restored from an earlier page
    page.wait_for_function(
        """([path, n]) => {
          const panel = window.jupyterapp?.shell.currentWidget;
          const kernel = panel?.sessionContext?.session?.kernel;
          return panel?.context?.path === path && panel.node.querySelectorAll('.jp-Notebook .jp-Cell').length === n
            && panel.sessionContext.isReady && kernel?.connectionStatus === 'connected' && kernel.status === 'idle';
        }""", arg=[notebook, n_cells], timeout=timeout_s * 1000)
    # The toolbar indicator can read idle before the kernel is connected; Run All then runs
    # nothing. Hence the wait on the session above, then on what the learner sees.
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=timeout_s * 1000)


def cell_problems(cells: list[dict], kernel_status: str | None) -> list[str]:
    """Kernel idle, every code cell ran, no error output, every widget live (not its text fallback)."""
    problems, never_ran = [], []
    if kernel_status != "idle":
        problems.append(f"kernel ends {kernel_status!r}, not idle")
    for i, cell in enumerate(cells):
        if cell["type"] != "code" or not cell["source"].strip():
            continue
        where = f"cell {i} ({cell['source'].strip().splitlines()[0][:60]!r})"
        if cell["count"] is None:
            never_ran.append(i)
        expected_error = "raises-exception" in cell.get("tags", []) or RAISES_MARK.search(cell["source"])
        if cell["errors"] and not expected_error:
            problems.append(f"{where} shows an error output: {'; '.join(cell['errors'])}")
        pitfall_ids = SHOW_PITFALL.findall(cell["source"])
        if pitfall_ids:
            live = [w for w in cell["pitfalls"] if w["checkbox"] == 1 and w["run"] == 1]
            if len(live) < len(pitfall_ids):
                problems.append(f"{where}: pitfall widget {pitfall_ids} is not a live widget; "
                                f"the page shows {cell['text']!r}")
        elif cell["widgetOutputs"] and cell["liveWidgets"] < cell["widgetOutputs"]:
            problems.append(f"{where}: {cell['widgetOutputs']} widget output(s) but {cell['liveWidgets']} live "
                            f"widget(s); the page shows {cell['text']!r}")
        if cell["bareFigures"]:
            problems.append(f"{where} {BARE_FIGURE}: {cell['bareFigures'][0]!r}, no image")
        if "Error displaying widget" in cell["text"]:
            problems.append(f"{where}: {cell['text']!r}")
    if never_ran:
        problems.append(f"Run All stopped: {len(never_ran)} code cell(s) never ran (cells {never_ran})")
    return problems


def _save_docs_image(png: Path) -> None:
    """A small copy of a widget screenshot for the README (PTLAB_UPDATE_DOCS=1)."""
    from PIL import Image

    img = Image.open(png).convert("RGB")
    if img.width > 900:
        img = img.resize((900, round(img.height * 900 / img.width)), Image.LANCZOS)
    DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
    img.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(DOCS_IMAGE, optimize=True)


def _settle(page, widget, quiet_s: float = 1.0, timeout_s: float = 30.0) -> None:
    """Wait until the widget's output stops changing, then until its images are decoded and painted.

    The Output widget re-renders its whole area on every appended output, so an image that is
    complete now may be replaced a moment later; a screenshot taken then shows a blank plot.
    """
    deadline, last, quiet_since = time.monotonic() + timeout_s, None, time.monotonic()
    while time.monotonic() < deadline:
        now = widget.locator(".ptlab-output").evaluate("o => o.innerHTML")
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            break
        page.wait_for_timeout(200)
    widget.evaluate("""w => Promise.all([...w.querySelectorAll('.ptlab-output img')].map(i => i.decode()))
                         .then(() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r))))""")


def png_is_blank(data: bytes) -> bool:
    """True when a PNG is one flat colour: a plot that was closed before it was drawn."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        low, high = image.convert("L").getextrema()
    return low == high


def blank_plots(widget) -> int:
    """How many plot images in the widget's output are blank, judged from the PNG data the kernel sent."""
    import base64

    sources = widget.locator(".ptlab-output img").evaluate_all("is => is.map(i => i.src)")
    pngs = [base64.b64decode(src.split(",", 1)[1]) for src in sources if src.startswith("data:image/png;base64,")]
    return sum(png_is_blank(png) for png in pngs)


# JupyterLab logs every kernel output at level "info" (so its Log Console, set to info, shows them
# all); the ones that reach no cell are visible only there. The page's kernel connection hands an
# output to the request it answers (a cell's execution, a widget's comm message); an output whose
# request is no longer or never was waiting is the one that lands in no cell: the blank-plot bug
# was a figure shown by a hook after the widget's request had ended. This records those.
_WATCH_ESCAPED_JS = """() => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  window.ptlabEscaped = [];
  const handle = kernel._handleMessage.bind(kernel);
  kernel._handleMessage = async (msg) => {
    const kind = msg.header.msg_type;
    if (msg.channel === 'iopub' && ['stream', 'display_data', 'execute_result', 'error'].includes(kind)
        && !kernel._futures?.get(msg.parent_header?.msg_id)) {
      const c = msg.content;
      const what = kind === 'stream' ? c.text : kind === 'error' ? `${c.ename}: ${c.evalue}`
        : Object.keys(c.data ?? {}).join(', ');
      window.ptlabEscaped.push(`${kind} (${String(what).slice(0, 80)})`);
    }
    return handle(msg);
  };
}"""


def watch_escaped_outputs(page) -> None:
    """From now on, record each output of the notebook's kernel that no request of the page was waiting for."""
    page.evaluate(_WATCH_ESCAPED_JS)


def escaped_output_problems(page) -> list[str]:
    """Outputs recorded by watch_escaped_outputs: each reached no cell (only the Log Console, at info, has it)."""
    escaped = page.evaluate("() => window.ptlabEscaped ?? []")
    return [f"{len(escaped)} output(s) reached no cell (only JupyterLab's Log Console shows them): "
            + "; ".join(escaped[:3])] if escaped else []


def news_problems(page) -> list[str]:
    """The 'get notified about official Jupyter news?' pop-up would greet every learner in a workshop."""
    toast = page.get_by_text("official Jupyter news")
    return ["JupyterLab asks about official Jupyter news: the course's overrides.json is not installed"] \
        if toast.count() else []


def _screenshot(page, widget, png: Path, tries: int = 10) -> None:
    """Screenshot the widget; retake it while a plot in it comes out blank.

    Headless Chromium sometimes captures an image that is loaded and decoded but not yet
    painted (seen here: the plot area all white). A plot of the run is never one flat colour.
    """
    from PIL import Image

    for _ in range(tries):
        widget.screenshot(path=str(png))
        origin = widget.bounding_box()
        boxes = widget.locator(".ptlab-output img").evaluate_all(
            "is => is.map(i => { const r = i.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })")
        with Image.open(png) as shot:
            gray = shot.convert("L")
            blank = [b for b in boxes if b[2] > 0 and b[3] > 0 and len(set(gray.crop(
                (round(b[0] - origin["x"]), round(b[1] - origin["y"]),
                 round(b[0] - origin["x"] + b[2]), round(b[1] - origin["y"] + b[3]))).getextrema())) == 1]
        if not blank:
            return
        page.wait_for_timeout(500)


def drive_widget(page, widget, pitfall_id: str, shots: Path | None) -> tuple[list[str], list[Path]]:
    """As a learner: bug on, Run, see that run's figures; bug off, Run, see the fixed run's figures."""
    problems, saved = [], []
    checkbox = widget.locator(".widget-checkbox input[type=checkbox]")
    run_button = widget.locator("button.widget-button", has_text="Run")
    status = widget.locator(".ptlab-status")
    output = widget.locator(".ptlab-output")
    for mode, checked, verdict in (("bug on", True, "BROKEN"), ("fixed", False, "OK")):
        widget.scroll_into_view_if_needed()
        if checkbox.is_checked() != checked:
            checkbox.click()
        if checkbox.is_checked() != checked:
            problems.append(f"{pitfall_id}: the 'bug on' checkbox did not turn {'on' if checked else 'off'}")
            break
        run_button.click()
        try:
            page.wait_for_function(
                """([w, mode]) => w.querySelector(`.ptlab-run[data-mode='${mode}']`)
                     || /raised an exception/.test(w.querySelector('.ptlab-status').textContent)""",
                arg=[widget.element_handle(), mode], timeout=WIDGET_RUN_TIMEOUT_S * 1000)
            page.wait_for_function(  # the run is finished when the status says "done" or "raised"
                "w => /^done in|raised an exception/.test(w.querySelector('.ptlab-status').textContent)",
                arg=widget.element_handle(), timeout=WIDGET_RUN_TIMEOUT_S * 1000)
        except Exception as err:  # a Playwright timeout: say what the learner sees instead
            problems.append(f"{pitfall_id} ({mode}): the output never showed this run ({type(err).__name__}); "
                            f"status {status.inner_text()!r}, output {output.inner_text()[:300]!r}")
            break
        page.wait_for_function(  # let the plot image land before looking
            "w => [...w.querySelectorAll('.ptlab-output img')].every(i => i.complete && i.naturalWidth > 0)",
            arg=widget.element_handle())
        _settle(page, widget)
        label = status.inner_text()
        if "raised an exception" in label:
            problems.append(f"{pitfall_id} ({mode}): the widget's run raised an exception: "
                            f"{output.inner_text()[-1500:]!r}")
            break
        shown = output.locator(".ptlab-run").evaluate_all("els => els.map(e => e.dataset.mode)")
        figures = output.locator(".ptlab-figures")   # run_text: the figure table, then a line per check
        rows = len(figures.inner_text().strip().splitlines()) if figures.count() else 0
        verdict_text = output.locator(".ptlab-verdict").inner_text() if output.locator(".ptlab-verdict").count() else ""
        if shown != [mode]:
            problems.append(f"{pitfall_id} ({mode}): the output area shows runs {shown}, expected only [{mode!r}]")
        if rows == 0:
            problems.append(f"{pitfall_id} ({mode}): no figures or checks in the output area")
        if not verdict_text.startswith(verdict):
            problems.append(f"{pitfall_id} ({mode}): verdict {verdict_text[:80]!r}, expected {verdict}")
        if mode not in label:
            problems.append(f"{pitfall_id} ({mode}): status {label!r} does not name the run")
        blank = blank_plots(widget)
        if blank:
            problems.append(f"{pitfall_id} ({mode}): {blank} plot(s) in the widget are blank (one flat colour)")
        if output.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count():
            problems.append(f"{pitfall_id} ({mode}): the output area shows an error: {output.inner_text()[-600:]!r}")
        if shots is not None:
            png = shots / f"{pitfall_id}--{mode.replace(' ', '-')}.png"
            _screenshot(page, widget, png)
            saved.append(png)
            # The fixed run's picture: its plot is painted reliably (see _screenshot) and, once both
            # modes have run, the widget plots both curves.
            if pitfall_id == DOCS_PITFALL and mode == "fixed" and os.environ.get("PTLAB_UPDATE_DOCS") == "1":
                _save_docs_image(png)
    return problems, saved


def check_notebook(browser, lab: Lab, notebook: str, nb_path: Path, shots: Path | None = None,
                   run_timeout_s: float = RUN_ALL_TIMEOUT_S) -> NotebookReport:
    """Open, clear, Run All, check every cell and widget, drive one widget, collect console errors."""
    report = NotebookReport(notebook)
    n_cells = len(nbformat.read(nb_path, as_version=4).cells)
    # Tall: JupyterLab scrolls inside its own panel, so a screenshot shows only what is in the viewport.
    context = browser.new_context(viewport={"width": 1280, "height": 2400})
    page = context.new_page()
    page.set_default_timeout(60_000)
    js_errors: list[str] = []
    page.on("console", lambda msg: js_errors.append(f"console.error: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda err: js_errors.append(f"uncaught: {err}"))
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
    try:
        open_notebook(page, lab, notebook, n_cells)
        watch_escaped_outputs(page)
        # Clear stored outputs first: every output checked below was made by this run.
        _menu(page, "Edit", "Clear Outputs of All Cells")
        start = time.perf_counter()
        _menu(page, "Run", "Run All Cells")
        _wait_until_run_all_done(page, run_timeout_s)
        report.run_all_s = time.perf_counter() - start
        cells = page.evaluate(_CELLS_JS)
        status = page.get_attribute(".jp-Notebook-ExecutionIndicator", "data-status")
        report.problems += cell_problems(cells, status)
        widgets = page.locator(".jp-NotebookPanel .ptlab-pitfall")
        report.widgets = widgets.count()
        # Code cells only: prose may quote the call (chapter 5's clinic does).
        ids = [pid for cell in cells if cell["type"] == "code" for pid in SHOW_PITFALL.findall(cell["source"])]
        if report.widgets and len(ids) == report.widgets:
            index = ids.index(DOCS_PITFALL) if DOCS_PITFALL in ids else 0
            report.driven = ids[index]
            problems, report.screenshots = drive_widget(page, widgets.nth(index), ids[index], shots)
            report.problems += problems
        elif ids:
            report.problems.append(f"{len(ids)} show_pitfall calls but {report.widgets} pitfall widgets on the page")
        report.problems += news_problems(page)
        report.problems += escaped_output_problems(page)
        if shots is not None:
            page.screenshot(path=str(shots / "notebook.png"))
    except Exception as err:
        report.problems.append(f"{type(err).__name__}: {err}")
        if shots is not None:
            page.screenshot(path=str(shots / "failure.png"))
    finally:
        # The same console error repeated (one per widget model, say) is one problem, counted.
        report.problems += [f"{msg} (x{js_errors.count(msg)})" if js_errors.count(msg) > 1 else msg
                            for msg in dict.fromkeys(js_errors)]
        context.close()
        try:
            lab.shutdown_kernel(notebook)
        except OSError as err:
            report.problems.append(f"could not shut the notebook's kernel down: {err}")
    return report


_STEP_JS = """(i) => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cell = panel.content.widgets[i];
  const area = cell.node.querySelector('.jp-Cell-outputArea');
  const outputs = area ? [...area.querySelectorAll('.jp-OutputArea-output')] : [];
  // A progress bar tells the learner something only while it moves: its text and width are compared between looks.
  const isBar = o => o.querySelector('.widget-hprogress, progress') !== null;
  const bars = outputs.filter(isBar).map(o => o.innerText.trim() + ' '
                                          + (o.querySelector('.progress-bar')?.style.width ?? ''));
  const told = outputs.filter(o => !isBar(o)).some(o => o.innerText.trim().length > 0
                                                   || o.querySelector('.jupyter-widgets, img, canvas, svg') !== null);
  return {prompt: cell.node.querySelector('.jp-InputArea-prompt')?.textContent.trim() ?? '',
          count: cell.model.executionCount, told: told, bars: bars.join(' | '),
          bareFigures: BARE_FIGURES(cell.model.outputs.toJSON()),
          errors: cell.model.outputs.toJSON().filter(o => o.output_type === 'error').length};
}""".replace("BARE_FIGURES", _BARE_FIGURES_JS)


@dataclass
class StepReport:
    """A notebook run cell by cell, as a learner presses Shift+Enter: seconds per cell and the silent waits."""

    notebook: str
    seconds: dict[int, float] = field(default_factory=dict)
    silent: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def step_through(browser, lab: Lab, notebook: str, nb_path: Path, silent_limit_s: float = 10.0,
                 cell_timeout_s: float = 180.0) -> StepReport:
    """Run each code cell on its own, as Shift+Enter does, and note every cell whose screen stood still for over
    `silent_limit_s`: nothing in its output yet, or only progress bars that did not move (a bar stuck at 0/1 says no
    more than nothing). A line of text or an image counts as said; a wait after it is not counted. A cell that shows
    a figure as its text repr only ('<Figure size ...>') is a problem."""
    report = StepReport(notebook)
    cells = nbformat.read(nb_path, as_version=4).cells
    context = browser.new_context(viewport={"width": 1280, "height": 1600})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        open_notebook(page, lab, notebook, len(cells))
        _menu(page, "Edit", "Clear Outputs of All Cells")
        for i, cell in enumerate(cells):
            if cell.cell_type != "code":
                continue
            page.evaluate("(i) => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = i; }", i)
            start, state = time.perf_counter(), {}
            still_since, bars, longest = 0.0, "", 0.0      # since when the screen has not changed; its bars then
            # As Shift+Enter does; the braces keep evaluate() from waiting for the command's promise (the run).
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-cell'); }")
            while time.perf_counter() - start < cell_timeout_s:
                state = page.evaluate(_STEP_JS, i)
                elapsed = time.perf_counter() - start
                if still_since is not None:
                    if state["told"]:
                        still_since = None                  # it said something: what follows is not silence
                    elif state["bars"] != bars:
                        still_since, bars = elapsed, state["bars"]
                    longest = max(longest, elapsed - still_since) if still_since is not None else longest
                if state["count"] is not None and re.fullmatch(r"\[\d+\]:", state["prompt"]):
                    break
                page.wait_for_timeout(200)
            else:
                report.problems.append(f"cell {i} did not finish in {cell_timeout_s:.0f} s")
                break
            report.seconds[i] = round(elapsed, 1)
            first_line = cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""
            if longest > silent_limit_s:
                shown = "a progress bar that did not move" if bars else "nothing"
                report.silent.append(f"cell {i} ({first_line!r}) ran {elapsed:.0f} s and showed {shown} "
                                     f"for {longest:.0f} s")
            if state.get("bareFigures"):
                report.problems.append(f"cell {i} ({first_line!r}) {BARE_FIGURE}: {state['bareFigures'][0]!r}")
            if state.get("errors"):
                report.problems.append(f"cell {i} ({first_line!r}) ended with an error")
                break
    except Exception as err:
        report.problems.append(f"{type(err).__name__}: {err}")
    finally:
        context.close()
        try:
            lab.shutdown_kernel(notebook)
        except OSError as err:
            report.problems.append(f"could not shut the notebook's kernel down: {err}")
    return report
