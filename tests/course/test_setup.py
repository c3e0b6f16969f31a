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
