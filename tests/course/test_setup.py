"""What a newcomer meets before the course runs: the set-up check and a plain `pytest`."""
import shutil
import subprocess
import sys
import venv

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
    assert "deselected" in result.stdout and "test_notebook_in_jupyterlab" not in result.stdout.split("deselected")[0], \
        result.stdout[-2000:]
