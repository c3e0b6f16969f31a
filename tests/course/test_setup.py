"""What a newcomer meets before the course runs: the set-up check and a plain `pytest`."""
import shutil
import subprocess
import sys
import venv

import pytest

from notebook_rules import ROOT

CHECK = ROOT / "tools" / "check_setup.py"


def run_check(venv_dir):
    return subprocess.run([sys.executable, str(CHECK), str(venv_dir)], capture_output=True, text=True, timeout=120)


def test_a_sound_venv_passes():
    assert run_check(ROOT / ".venv").returncode == 0 or not (ROOT / ".venv").exists()


def test_a_moved_venv_is_named_with_the_fix(tmp_path):
    venv.create(tmp_path / "first", with_pip=False)
    (tmp_path / "first" / "bin" / "pip").write_text(f"#!{tmp_path / 'first' / 'bin' / 'python'}\n")
    shutil.move(str(tmp_path / "first"), str(tmp_path / "moved"))
    result = run_check(tmp_path / "moved")
    assert result.returncode == 1
    assert "made in another folder" in result.stderr and "make clean" in result.stderr


def test_a_venv_whose_python_is_gone_is_named_with_the_fix(tmp_path):
    (tmp_path / "broken" / "bin").mkdir(parents=True)
    result = run_check(tmp_path / "broken")
    assert result.returncode == 1 and "does not run" in result.stderr and "make clean" in result.stderr


def test_plain_pytest_leaves_the_browser_tests_to_make_test_browser():
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "tests/browser"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    collected = result.stdout.split("deselected")[0]
    assert "deselected" in result.stdout and "test_notebook_in_jupyterlab" not in collected, result.stdout[-2000:]


def lab_args() -> list[str]:
    """The options `make lab` gives `jupyter lab` (the Makefile's LAB_ARGS), checked to be the ones the recipe uses."""
    import re

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^lab:.*\n\t(.*)$", makefile, flags=re.M).group(1)
    assert "jupyter lab $(LAB_ARGS)" in recipe, recipe
    return re.search(r"^LAB_ARGS :=(.*)$", makefile, flags=re.M).group(1).split()


def test_make_lab_roots_jupyterlab_at_the_course_folder_and_opens_notebooks():
    import json

    assert "--ServerApp.root_dir=." in lab_args() and "--LabApp.default_url=/lab/tree/notebooks" in lab_args()
    overrides = json.loads((ROOT / "tools" / "jupyterlab-overrides.json").read_text(encoding="utf-8"))
    assert overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"] == {"markdown": "Markdown Preview"}, \
        "docs/decisions.md opens rendered, its links to notebook sections clickable"


def test_every_link_from_a_notebook_to_a_file_stays_inside_the_course_folder():
    """JupyterLab serves the course folder: a link that leaves it (or names a missing file) opens nothing."""
    import re

    import nbformat

    links = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
    found = 0
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for target in links.findall(cell.source) if cell.cell_type == "markdown" else []:
                if target.startswith(("http://", "https://", "mailto:")):
                    continue
                file = (path.parent / target).resolve()
                assert file.is_file() and file.is_relative_to(ROOT), f"{path.name}: link to {target}"
                found += "docs/" in target
    assert found, "some notebook links to docs/ (decisions.md)"


def test_jupyterlab_started_as_make_lab_starts_it_serves_docs_and_opens_at_notebooks(tmp_path):
    """The server make lab starts: `/` leads to notebooks/, and docs/decisions.md is served."""
    import os
    import socket
    import time
    import urllib.request

    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "01_tensors.ipynb", tmp_path / "notebooks")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "jupyter-home"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", "--IdentityProvider.token=ptlab-test", "--allow-root",
           *lab_args()]
    url = f"http://127.0.0.1:{port}"
    with subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as lab:
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"{url}/api/status?token=ptlab-test", timeout=5)
                    break
                except OSError:
                    assert lab.poll() is None and time.monotonic() < deadline, "JupyterLab did not start"
                    time.sleep(0.3)
            landing = urllib.request.urlopen(f"{url}/?token=ptlab-test", timeout=30)
            assert landing.url.split("?")[0] == f"{url}/lab/tree/notebooks"
            assert '"treePath": "notebooks"' in landing.read().decode(), "the file browser starts in notebooks/"
            served = urllib.request.urlopen(f"{url}/files/docs/decisions.md?token=ptlab-test", timeout=30).read()
            served = served.decode()
            assert served == (ROOT / "docs" / "decisions.md").read_text(encoding="utf-8")
        finally:
            lab.terminate()
            lab.wait(timeout=60)


def test_a_python_too_old_gets_the_message_not_a_traceback(monkeypatch, capsys):
    """The linter found 7 placeholders for 8 values here: an old Python got a TypeError instead of the advice."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("check_setup", ROOT / "tools" / "check_setup.py")
    check_setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_setup)
    monkeypatch.setattr(sys, "version_info", (3, 9, 18, "final", 0))
    with pytest.raises(SystemExit) as exit_info:
        check_setup.check_python()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "is Python 3.9; the course needs Python 3.10 or newer" in err and "brew install python@" in err
