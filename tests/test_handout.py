"""`make handout`: the learners' zip holds no solutions and no answers, in one top-level folder."""
import subprocess
import zipfile

import pytest

from notebook_rules import ROOT


def test_the_handout_holds_no_solutions(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (a handout itself): `make handout` archives the committed HEAD")
    zip_path = tmp_path / "ptlab-handout.zip"
    subprocess.run(["make", "-s", "handout", f"HANDOUT_ZIP={zip_path}"], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    names = zipfile.ZipFile(zip_path).namelist()
    assert {n.split("/", 1)[0] for n in names} == {"ptlab-handout"}, "one top-level folder"
    assert not any("notebooks/solutions" in n for n in names)
    assert "ptlab-handout/tests/test_exercises.py" not in names, "it holds the chapter 1-2 answers"
    assert "ptlab-handout/notebooks/01_tensors.ipynb" in names and "ptlab-handout/Makefile" in names
    with zipfile.ZipFile(zip_path) as handout:
        for name in names:
            if name.endswith(".ipynb") and "/notebooks/" in name:
                text = handout.read(name).decode("utf-8")
                if "solutions/" in text:
                    assert "handout leaves them out" in text, f"{name} points at solutions without saying where"
